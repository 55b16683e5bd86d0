"""A load from the host tier that fails is recomputed by its request, once.

Real: vLLM's `Scheduler` (`kv_load_failure_policy: recompute`), SAGA's
`SagaOffloadingConnector` on its scheduler side with vLLM's `CPUOffloadingManager`,
configured as `saga serve --kv-offloading-size` configures them (`host_tier_config`).
Synthetic (the only fake, as in `test_prefetch_offload.py`): the worker, which reports
every load failed the way SAGA's host worker does (the job done, its blocks as load
errors); the real worker's side is `test_host_kv.py`, and both together run in a real
engine in `tests/real/serve/test_host_tier_faults_real.py`.
"""

from __future__ import annotations

from vllm.config import KVTransferConfig

from saga_server.engines.vllm import SagaScheduler
from saga_server.serve.cli import host_tier_config
from vllm_builders import OffloadWorker, Requests, make_scheduler

BS = 16
HIST = 64  # 4 full blocks


def evicted_history(tiny_model, fail_loads: bool):
    """A 64-token prompt has run (its blocks stored to the tier), then a prompt that
    needs every usable pool block has pushed it out of the pool."""
    _, transfer = host_tier_config(["--kv-offloading-size", "0.001"], gpu=False, with_saga=True, order="lru")
    s = make_scheduler(SagaScheduler, tiny_model, start_hints=False, num_blocks=16, block_size=BS,
                       kv_transfer=KVTransferConfig(**transfer))
    worker, R = OffloadWorker(fail_loads=fail_loads), Requests(BS)
    hist = [100 + i for i in range(HIST)]
    s.add_request(R.make(hist))
    worker.drain(s)
    s.add_request(R.make([50000 + i for i in range(15 * BS)]))
    worker.drain(s)
    return s, worker, R, hist


def resume(s, worker: OffloadWorker, R: Requests, hist: list[int]) -> tuple[str, int]:
    """The history again with 3 new tokens: its id and the tokens it computed."""
    again = R.make(hist + [7, 8, 9])
    s.add_request(again)
    outs = worker.drain(s)
    return again.request_id, sum(o.num_scheduled_tokens.get(again.request_id, 0) for o in outs)


def test_a_resumed_history_loads_from_the_tier_and_computes_only_its_new_tokens(tiny_model):
    s, worker, R, hist = evicted_history(tiny_model, fail_loads=False)
    rid, computed = resume(s, worker, R, hist)
    assert worker.load_jobs == [rid] and computed == 3
    assert s.saga.counters["kv_tier_loads", "ok"] == 1


def test_a_failed_load_is_recomputed_once_without_asking_the_tier_again(tiny_model):
    s, worker, R, hist = evicted_history(tiny_model, fail_loads=True)
    rid, computed = resume(s, worker, R, hist)
    assert worker.load_jobs == [rid]  # asked once: a retry would fail the same way, forever
    assert computed == HIST + 3  # the whole history recomputed
    assert s.saga.counters["kv_tier_loads", "failed"] == 1 and s.saga.counters["kv_tier_loads", "ok"] == 0
    assert not s.connector._loading and not s.connector._load_failed  # nothing kept once it ended
