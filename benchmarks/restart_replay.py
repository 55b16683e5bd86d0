"""Does a restart of `saga serve` cost what SAGA learnt? The same replay, side by side:
warm (no restart), after a restart with the learnt state, after one without it, and
after one whose state file is corrupt.

    .venv/bin/python -m benchmarks.restart_replay [--sessions 8] [--steps 8] [--json out.json]

The replay is `serve_trace_replay.py`'s (SWE-bench sessions from a saga-trace/1 file,
real token ids, tool sleeps and hints; its KV pool small enough to evict). One
`saga serve --state-dir D` first runs it once to learn the workflow, then runs it
again on the same engine: **warm**. It is stopped (its learnt state written) and
started again with the same state dir: **restart, state**. Then with `--no-state`:
**restart, cold**. Then with the state file overwritten by garbage: **restart,
corrupt** (a one-line warning and a clean start). Every run after the first uses
fresh text (another seed), so no run finds the previous one's prompts in the prefix
cache: what carries over is only what SAGA learnt. Reported per run: mean and p90
task time, prefix-hit rate, the pins the engine made.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

from saga_server.serve.status import parse_metrics
from saga_server.serve_child import free_port

from benchmarks.harness.replay import (SessionResult, TokenSource, add_workload_arguments, run_session,
                                       start_delays, workload)
from benchmarks.harness.results import command_line, pct
from benchmarks.harness.serve import start_server


def run_once(server, tasks, tokens: TokenSource, seed: int, stagger_s: float) -> dict:
    results = [SessionResult(t.task_id) for t in tasks]
    delays = start_delays(len(tasks), stagger_s, seed)
    before = metrics(server)
    threads = [threading.Thread(target=run_session, args=(server, t, tokens, server.hint_addr, seed, r, d))
               for t, r, d in zip(tasks, results, delays)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    after = metrics(server)
    ok = [r for r in results if not r.error]
    tct = [r.end - r.start for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return {"tct_mean_s": statistics.fmean(tct) if tct else float("nan"), "tct_p90_s": pct(tct, 0.9),
            "hit_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
            "sessions_ok": len(ok), "errors": [r.error for r in results if r.error],
            "pins": {k.split("=", 1)[1].rstrip("}"): after[k] - before.get(k, 0.0)
                     for k in after if k.startswith("saga_pins_total{")}}


def metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode(), ("saga_pins",))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(p, steps=8, target_prompt=2000, max_output=32, max_tool_s=12.0, kv_blocks=300)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    tasks, tokens = workload(args)
    state = Path(tempfile.mkdtemp(prefix="saga-restart-"))
    vllm_args = ["--num-gpu-blocks-override", str(args.kv_blocks), "--max-num-seqs", str(args.max_num_seqs)]
    ports = (free_port(), free_port())  # the same for every start: the state file is named by the port
    rows: dict[str, dict] = {}

    def serve(*extra: str):
        return start_server(True, vllm_args + list(extra), ports=ports)

    print(f"{len(tasks)} sessions x {args.steps} steps; KV {args.kv_blocks} blocks; state dir {state}", flush=True)
    server = serve("--state-dir", str(state))
    try:
        print("-- learning run ...", flush=True)
        rows["first run (learning)"] = run_once(server, tasks, tokens, args.seed + 1, args.stagger_s)
        print("-- warm, no restart ...", flush=True)
        rows["warm, no restart"] = run_once(server, tasks, tokens, args.seed + 2, args.stagger_s)
    finally:
        server.stop()
    for name, extra, seed in (("restart, state", ("--state-dir", str(state)), 3),
                              ("restart, cold (--no-state)", ("--no-state",), 4),
                              ("restart, corrupt state file", ("--state-dir", str(state)), 5)):
        if "corrupt" in name:
            for f in state.glob("engine-*.json"):
                f.write_text('{"format": "saga-learnt/1", "state": {')
        print(f"-- {name} ...", flush=True)
        server = serve(*extra)
        try:
            rows[name] = run_once(server, tasks, tokens, args.seed + seed, args.stagger_s)
            log = server.log_path.read_text()
            rows[name]["log"] = ("restored" if "learnt state restored" in log else
                                 "corrupt: clean start" if "is corrupt" in log else "clean start")
        finally:
            server.stop()
    print()
    print(f"{'run':32}{'mean s':>9}{'p90 s':>9}{'hit':>7}  pins")
    for name, r in rows.items():
        print(f"{name:32}{r['tct_mean_s']:>9.1f}{r['tct_p90_s']:>9.1f}{r['hit_rate']:>7.3f}  "
              f"{json.dumps(r['pins'])} {r.get('log', '')} {r['errors'] or ''}")
    warm = rows["warm, no restart"]["tct_mean_s"]
    for name in ("restart, state", "restart, cold (--no-state)", "restart, corrupt state file"):
        print(f"{name} / warm: mean {rows[name]['tct_mean_s'] / warm:.3f}x")
    print(f"command: {command_line()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
