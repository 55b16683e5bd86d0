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

Prints, per mode, measured against predicted: mean, p90 and worst task completion
time, prefix-hit rate (cached / prompt tokens) and regen share (recomputed / prompt
tokens), then the stock/SAGA ratios. `--measured FILE` takes the real side from an
earlier `serve_trace_replay.py --json FILE` run with the same settings instead of
running the engine again (minutes instead of a quarter hour), or this script's own
`--json` output.

    PYTHONPATH=sdk:server .venv/bin/python benchmarks/sim_vs_engine.py --json sim-vs-engine.json
    PYTHONPATH=sdk:server .venv/bin/python benchmarks/sim_vs_engine.py --sessions 12 --kv-blocks 300
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_trace_replay as replay_mod  # noqa: E402
from saga_server.bench.calibrate import cpu_description  # noqa: E402
from serve_common import pct  # noqa: E402

MODE_POLICY = {"no-saga": "apc-lru", "saga": "saga", "saga-request-fcfs": "saga-request-fcfs",
               "saga-no-admit": "saga-no-admit", "no-saga-tier": "apc-lru-offload", "saga-tier": "saga",
               "saga-tier-no-admit": "saga-no-admit"}


def simulate(workload: list[dict], mode: str, args) -> dict:
    """The simulator on the sent sessions: the replay's per-mode figures."""
    from saga_server.bench.policies import make_policy  # noqa: PLC0415
    from saga_server.bench.workload import materialize  # noqa: PLC0415
    from saga_server.engines.sim import SimConfig, Simulator, TaskInstance  # noqa: PLC0415
    from saga_server.engines.sim.hardware import load_calibration, make_cost_model  # noqa: PLC0415

    calibration = load_calibration(str(args.calibration)) if args.calibration else None
    tier = replay_mod.MODES[mode][2]
    cost = make_cost_model("cpu-2core", "smollm2-135m", calibration=calibration, host_tier=tier,
                           kv_capacity_override=args.kv_blocks * 32, max_num_seqs=args.max_num_seqs)
    rng = random.Random(args.seed)
    insts = [TaskInstance(t["task_id"], materialize(t, rng), "swe", float(t["start_s"])) for t in workload]
    res = Simulator(cost, make_policy(MODE_POLICY[mode]), insts,
                    SimConfig(workers=1, concurrency=None, seed=args.seed,
                              host_tier_factor=args.tier_x if tier else 0.0)).run()
    tct = sorted(t.tct_s for t in res.tasks)
    prompt = res.prompt_tokens
    return {"mode": mode, "tct_mean_s": statistics.fmean(tct), "tct_p90_s": pct(tct, 0.9), "tct_max_s": tct[-1],
            "hit_rate": (res.hit_tokens + res.loaded_tokens) / prompt if prompt else 0.0,
            "regen_share": res.recomputed_tokens / prompt if prompt else 0.0,
            "prompt_tokens": prompt, "tct_s": tct, "iterations": res.iterations,
            **{f"{phase}_mean_s": getattr(res, f"{phase}_s") / res.llm_calls for phase in replay_mod.PHASE_METRICS}}


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
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]),
                                         "args": {k: str(v) for k, v in vars(args).items()}, "machine": cpu,
                                         "measured": measured, "predicted": predicted, "ratios": ratios}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
