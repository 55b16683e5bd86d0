"""SAGA's prefetch of an evicted session loads its KV from vLLM's CPU offload tier.

With `--kv-offloading-size` vLLM runs the `OffloadingConnector`: finished KV is
stored to a CPU tier and a new request whose prefix is there loads it
(WAITING_FOR_REMOTE_KVS) instead of recomputing it. SAGA's prefetch is an
ordinary request added through `Scheduler.add_request`, so it should take the
same path: here session A's GPU blocks are reclaimed, SAGA re-prefetches A on
the idle engine, and the prefetch's 64-token history arrives as a load; only
the one trailing token is computed. A's next request then hits on the GPU
without waiting for a load of its own. Without the tier the same prefetch
recomputes everything.

Real: vLLM's `Scheduler`, `KVCacheManager`, the scheduler side of
`OffloadingConnector` and its `CPUOffloadingManager`, built from the config
`--kv-offloading-size` produces. Synthetic (the only fake): the worker, since
there is no model and so no KV to copy (the real one, `host_kv.HostCopyWorker`,
is tested on host tensors in `test_host_kv.py` and in a real engine in
`tests/real/serve/test_host_tier_real.py`). `OffloadWorker` reports transfers the
way `OffloadingConnectorWorker` does (completed job ids in
`OffloadingWorkerMetadata`, finished loads as `finished_recving`, never
`finished_sending`), as if every copy were instant; one fixed sampled token.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.request import RequestStatus

from saga_server.core import CoreConfig, ManualClock, SessionStart, ToolCallStart, WorkflowCore
from saga_server.core.pinning import PinConfig
from saga_server.engines.vllm import SagaScheduler
from saga_server.engines.vllm import PREFETCH_PREFIX
from vllm_builders import OffloadWorker, Requests, hit_tokens, make_scheduler, model_output

BS = 16
HIST = 64  # A's prompt: 4 full blocks
OFFLOAD_GIB = 0.001  # ~1 MiB: room for every chunk this test stores


def tokens(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


def _paused_session(tiny_model, offload_gib: float | None):
    """Session A's 64-token request has run; A is paused in a tool.
    Returns (scheduler, worker, requests, A's history, A's request)."""
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(pin=PinConfig(min_tokens=2 * BS)), clock=clock)
    s = make_scheduler(SagaScheduler, tiny_model, core=core, clock=clock, start_hints=False,
                       num_blocks=16, block_size=BS, kv_offloading_size=offload_gib)
    worker, R, hist = OffloadWorker(), Requests(BS), tokens(100, HIST)
    s.saga.core.accept(SessionStart("A", clock()))
    first = R.make(hist, session_id="A")
    s.add_request(first)
    worker.drain(s)
    s.saga.core.accept(ToolCallStart("A", clock(), "bash", call_id="c"))
    return s, worker, R, hist, first


def _reclaim_a_paused_session(tiny_model, offload_gib: float | None):
    """A request needing the whole GPU pool reclaims paused A's blocks; the idle
    step after it lets SAGA prefetch A. Returns `_paused_session`'s + the outputs."""
    s, worker, R, hist, first = _paused_session(tiny_model, offload_gib)
    s.add_request(R.make(tokens(50000, 15 * BS)))  # every usable block: none of A's stays
    outs = worker.drain(s)
    assert s.saga.counters["prefetch", "issued"] == 1
    return s, worker, R, hist, first, outs


def _prefetch_id(outs) -> str:
    (rid,) = {n.req_id for o in outs for n in o.scheduled_new_reqs if n.req_id.startswith(PREFETCH_PREFIX)}
    return rid


def _scheduled(outs, rid: str) -> int:
    return sum(o.num_scheduled_tokens.get(rid, 0) for o in outs)


def test_prefetch_of_an_evicted_session_loads_its_kv_from_the_cpu_tier(tiny_model):
    s, worker, R, hist, first, outs = _reclaim_a_paused_session(tiny_model, OFFLOAD_GIB)
    assert type(s.connector).__name__ == "OffloadingConnector"
    # A's history reached the CPU tier (its stores were reported done) and stays
    # there after its GPU blocks were reclaimed.
    manager = s.connector.scheduler.manager
    probe = ReqContext(req_id="probe")
    assert len(first.block_hashes) == HIST // BS
    assert all(manager.lookup(make_offload_key(h, 0), probe) is LookupResult.HIT for h in first.block_hashes)

    loads = [job for o in outs for job in o.kv_connector_metadata.load_jobs.values()]
    pid = _prefetch_id(outs)
    assert [job.req_id for job in loads] == [pid]  # the flood loaded nothing; the prefetch did
    # The load fills the prefetch's first 4 GPU blocks: none of A's history was
    # still in the GPU prefix cache, all of it comes from the CPU tier.
    assert len(loads[0].dst_spec.block_ids) == HIST // BS and list(loads[0].dst_spec.block_indices) == [0]
    # While the load ran the prefetch computed nothing; then it was admitted with
    # the loaded prefix as computed and only the last known token left to prefill.
    (new,) = [n for o in outs for n in o.scheduled_new_reqs if n.req_id == pid]
    assert new.num_computed_tokens == HIST
    assert _scheduled(outs, pid) == len(hist) + 1 - HIST == 1  # vs 65 recomputed without the tier

    nxt = R.make(hist + [7, 8, 9], session_id="A")
    s.add_request(nxt)
    assert s.saga.counters["prefetch", "used"] == 0
    outs = worker.drain(s)
    assert hit_tokens(outs, nxt.request_id) == HIST
    # The hit is on the GPU: A's own request waits for no load.
    assert not [j for o in outs for j in o.kv_connector_metadata.load_jobs.values()]
    assert s.saga.counters["prefetch", "used"] == 1


def test_the_prefetch_waits_in_waiting_for_remote_kvs_until_the_worker_reports_the_load(tiny_model):
    """A slow load: the prefetch holds its blocks but is not scheduled, and no
    second prefetch starts, until the worker's finished_recving arrives."""
    s, worker, R, hist, first = _paused_session(tiny_model, OFFLOAD_GIB)
    s.add_request(R.make(tokens(50000, 15 * BS)))
    for _ in range(50):
        out = worker.step(s, loads_done=False)
        if out.kv_connector_metadata.load_jobs:
            break
    (pid,) = {job.req_id for job in out.kv_connector_metadata.load_jobs.values()}
    assert pid.startswith(PREFETCH_PREFIX) and pid not in out.num_scheduled_tokens
    req = s.requests[pid]
    assert len(s.kv_cache_manager.get_block_ids(pid)[0]) == HIST // BS  # the blocks the load writes
    for _ in range(3):
        assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and req.num_computed_tokens == HIST
        out = worker.step(s, loads_done=False)
        assert pid not in out.num_scheduled_tokens and not out.kv_connector_metadata.load_jobs
    assert s.saga.counters["prefetch", "issued"] == 1
    outs = worker.drain(s)  # the load is reported; the prefetch computes its last token
    assert _scheduled(outs, pid) == 1
    assert pid not in s.requests and s.saga.counters["prefetch", "issued"] == 1
    assert len(s.saga.ledger.get("A").blocks) == HIST // BS  # the prefetched KV, held for A


def test_without_the_cpu_tier_the_same_prefetch_recomputes_the_whole_history(tiny_model):
    s, worker, R, hist, first, outs = _reclaim_a_paused_session(tiny_model, None)
    assert s.connector is None
    pid = _prefetch_id(outs)
    (new,) = [n for o in outs for n in o.scheduled_new_reqs if n.req_id == pid]
    assert new.num_computed_tokens == 0
    assert _scheduled(outs, pid) == len(hist) + 1
    nxt = R.make(hist + [7, 8, 9], session_id="A")
    s.add_request(nxt)
    assert hit_tokens(worker.drain(s), nxt.request_id) == HIST
