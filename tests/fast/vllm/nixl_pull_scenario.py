"""Run as a script (NIXL's native libraries must stay out of the test process, see
test_kv_pulls_vllm.py): vLLM's real `Scheduler` with SAGA's `NixlConnector` on its
scheduler side takes a pull request (`do_remote_prefill`), the worker's report
that the load ended (synthetic `KVConnectorOutput`, ok or failed), and schedules
it. Prints what SAGA's plugin counted for a pull that worked and one that failed,
as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vllm_host  # noqa: E402

vllm_host.prepare()  # before vLLM is imported (vllm_host.py)

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402

from vllm_builders import Requests, make_scheduler, model_dir, model_output  # noqa: E402

from saga_server.core import SessionStart  # noqa: E402
from saga_server.engines.vllm import SagaScheduler  # noqa: E402
from saga_server.serve.cli import nixl_transfer_config  # noqa: E402

BS = 16
PROMPT = 100  # tokens: 6 full blocks can be pulled, the last partial one is computed


def handle(engine: str) -> dict:
    """The `kv_transfer_params` a source engine's `do_remote_decode` answer carries."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [list(range(7))],
            "remote_engine_id": engine, "remote_request_id": "src-1", "remote_host": "127.0.0.1",
            "remote_port": 5999, "tp_size": 1}


def run(root: Path, fail: bool) -> dict:
    transfer = KVTransferConfig(**nixl_transfer_config(gpu=False))  # what `saga serve --kv-transfer nixl` sets
    s = make_scheduler(SagaScheduler, model_dir(root), num_blocks=40, block_size=BS, kv_transfer=transfer,
                       start_hints=False)
    s.saga.core.accept(SessionStart("moved", s.saga.clock()))
    req = Requests(BS).make(list(range(1000, 1000 + PROMPT)), session_id="moved",
                            extra_args={"kv_transfer_params": handle("source-engine")})
    s.add_request(req)
    first = s.schedule()  # the pull starts: the request waits for its KV
    waiting_for_kv = str(req.status)
    report = KVConnectorOutput(finished_recving={req.request_id}, failed_recving={req.request_id} if fail else set())
    s.update_from_output(first, model_output(s, first, kv_connector_output=report))
    new = []
    for _ in range(3):  # a failed load is rescheduled a step later
        out = s.schedule()
        new = [n for n in out.scheduled_new_reqs if n.req_id == req.request_id]
        if new:
            break
        s.update_from_output(out, model_output(s, out))
    finished_as = str(req.status)
    counts = s.saga.counters
    return {"status_while_pulling": waiting_for_kv,
            "scheduled_computed": new[0].num_computed_tokens if new else None, "finally": finished_as,
            "pulls_ok": counts["kv_pulls", "ok"], "pulls_failed": counts["kv_pulls", "failed"],
            "pulled_tokens": counts["kv_pulled_tokens"], "hit_tokens": counts["prefix_hit_tokens"],
            "prompt_tokens": counts["session_prompt_tokens"], "counts": s.saga.engine_stats().counts}


if __name__ == "__main__":
    root = Path(sys.argv[1])
    print(json.dumps({"ok": run(root / "ok", fail=False), "failed": run(root / "failed", fail=True)}))
