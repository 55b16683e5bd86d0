"""Does the simulator predict the real engine? The trace replay, measured and simulated.

Runs `serve_trace_replay.py`'s sessions against real vLLM (`saga serve`, each mode
in turn), then the simulator (`saga bench`'s engine, the `cpu-2core` preset fitted
to this machine, or `--calibration FILE` from `saga calibrate`) on exactly the
sessions that were sent (`serve_trace_replay.sent_workload`: the same prompts,
answers, tool gaps and start times), one worker with the engine's KV pool,
`max_num_seqs` and token budget, and for the `*-tier` modes a host tier of
--tier-x pools (the engine's `--kv-offloading-size`), priced by the constants of the
engine with a tier where the fit timed it (`saga calibrate`: a KV connector changes
the engine's speed). Modes and their simulated policies:

    no-saga             apc-lru          (stock vLLM: LRU prefix cache, request FCFS)
    saga                saga             (the same policy code the engine plugin runs)
    saga-request-fcfs   saga with seniority_window_s = 0
    saga-no-admit       saga-no-admit
    no-saga-tier        apc-lru-offload  (stock vLLM with its host tier, dropped LRU)
    saga-tier           saga             with the host tier
    saga-tier-no-admit  saga-no-admit    with the host tier
    saga-disk           saga             with the host tier and a disk tier of --disk-x pools
    no-saga-disk        apc-lru-offload  with both tiers
    bound               saga             with a pool that holds every session's KV
    no-saga-bound       apc-lru          with a pool that holds every session's KV

Prints, per mode, measured against predicted: mean, p90 and worst task completion
time, prefix-hit rate (cached / prompt tokens) and regen share (recomputed / prompt
tokens), then the stock/SAGA ratios. `--measured FILE` takes the real side from an
earlier `serve_trace_replay.py --json FILE` run with the same settings instead of
running the engine again (minutes instead of a quarter hour), or this script's own
`--json` output.

    .venv/bin/python -m benchmarks.sim_vs_engine --json sim-vs-engine.json
    .venv/bin/python -m benchmarks.sim_vs_engine --sessions 12 --kv-blocks 300
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from saga_server.bench.calibrate import cpu_description

from benchmarks.harness import replay as replay_mod
from benchmarks.harness.replay import MODE_POLICY, simulate
from benchmarks.harness.results import command_line, write_json

def engine_phases(result: dict) -> dict:
    """The engine's per-request phase means and iteration count, from its metrics."""
    m = result.get("metrics") or {}
    out = {"iterations": m.get("vllm:iteration_tokens_total_count", float("nan"))}
    for phase, name in replay_mod.PHASE_METRICS.items():
        count = m.get(name + "_count")
        out[f"{phase}_mean_s"] = m[name + "_sum"] / count if count else float("nan")
    count = m.get("vllm:e2e_request_latency_seconds_count")
    if count:  # what the API server adds around the engine: tokenising, HTTP, detokenising
        inside = sum(out[f"{phase}_mean_s"] for phase in replay_mod.PHASE_METRICS)
        out["outside_mean_s"] = m["vllm:e2e_request_latency_seconds_sum"] / count - inside
    return out


def measure(tasks, mode: str, args) -> dict:
    from saga_server.serve.model import ensure_default_model  # noqa: PLC0415

    tokens = replay_mod.TokenSource(str(ensure_default_model()), args.seed)
    return replay_mod.replay(mode, tasks, tokens, args)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=replay_mod.DEFAULT_TRACE)
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--target-prompt", type=int, default=3000)
    p.add_argument("--max-output", type=int, default=48)
    p.add_argument("--max-tool-s", type=float, default=20.0)
    p.add_argument("--kv-blocks", type=int, default=400)
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--stagger-s", type=float, default=3.0)
    p.add_argument("--tier-x", type=float, default=2.0, help="host KV tier of the *-tier modes, in pools")
    p.add_argument("--disk-x", type=float, default=8.0,
                   help="disk KV tier of the *-disk modes (below the host tier), in pools of KV")
    p.add_argument("--modes", default="saga,saga-request-fcfs,no-saga")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calibration", type=Path, help="saga calibrate --out file (default: the cpu-2core preset)")
    p.add_argument("--measured", type=Path, help="serve_trace_replay.py --json output to compare with, "
                                                 "instead of running the engine")
    p.add_argument("--json", type=Path, help="write measured and predicted figures here")
    args = p.parse_args()
    args.compiled, args.record = False, None  # what serve_trace_replay.replay reads besides
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODE_POLICY):
        p.error(f"unknown modes {sorted(unknown)}; choose from {sorted(MODE_POLICY)}")

    cpu = cpu_description()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores; SIMD: {' '.join(cpu['simd_flags'])}", flush=True)
    tasks = replay_mod.load_tasks(args.trace, args.sessions, args.steps, args.target_prompt, args.max_output,
                                  args.max_tool_s, args.seed)
    workload = replay_mod.sent_workload(tasks, replay_mod.start_delays(len(tasks), args.stagger_s, args.seed))
    if args.measured:
        data = json.loads(args.measured.read_text())  # a replay's --json, or this script's own
        measured = data.get("measured") or {r["mode"]: r for r in data["results"]}
        missing = set(modes) - set(measured)
        if missing:
            p.error(f"{args.measured} has no results for {sorted(missing)}")
    else:
        measured = {}
        for mode in modes:
            print(f"-- engine: {mode} ...", flush=True)
            measured[mode] = measure(tasks, mode, args)
    predicted = {mode: simulate(workload, mode, args) for mode in modes}

    keys = ("tct_mean_s", "tct_p90_s", "tct_max_s", "hit_rate", "regen_share")
    print(f"\n{len(tasks)} sessions x {args.steps} steps, KV {args.kv_blocks} blocks, max_num_seqs {args.max_num_seqs}")
    print(f"{'mode':18} {'figure':12} {'measured':>10} {'predicted':>10} {'off':>8}")
    for mode in modes:
        m, s = measured[mode], predicted[mode]
        for k in keys:
            off = (f"{s[k] / m[k] - 1:+.1%}" if k.startswith("tct") and m[k] else f"{s[k] - m[k]:+.3f}")
            print(f"{mode:18} {k:12} {m[k]:10.3f} {s[k]:10.3f} {off:>8}")
    phases = ("iterations",) + tuple(f"{phase}_mean_s" for phase in replay_mod.PHASE_METRICS)
    print("\nwhere the time goes, per request (vLLM's request histograms; iterations: engine steps in the run)")
    for mode in modes:
        m, s = engine_phases(measured[mode]), predicted[mode]
        measured[mode]["phases"] = m
        for k in phases:
            off = f"{s[k] / m[k] - 1:+.1%}" if m[k] == m[k] and m[k] else "n/a"
            print(f"{mode:18} {k:16} {m[k]:10.3f} {s[k]:10.3f} {off:>8}")
        if "outside_mean_s" in m:
            print(f"{mode:18} {'outside engine':16} {m['outside_mean_s']:10.3f} {'(not simulated)':>18}")
    ratios = {}
    for base in (b for b in replay_mod.BASELINES if b in modes):
        for mode in (x for x in modes if x not in replay_mod.BASELINES):
            got = measured[base]["tct_mean_s"] / measured[mode]["tct_mean_s"]
            want = predicted[base]["tct_mean_s"] / predicted[mode]["tct_mean_s"]
            ratios[f"{base}/{mode}"] = {"measured": got, "predicted": want}
            print(f"{base} / {mode} mean TCT: measured {got:.2f}x, predicted {want:.2f}x ({want / got - 1:+.1%})")
    if args.json:
        write_json(args.json, {"command": command_line(), "args": {k: str(v) for k, v in vars(args).items()},
                               "machine": cpu, "measured": measured, "predicted": predicted, "ratios": ratios})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
