"""The headline numbers of `saga bench`, measured side by side in one run.

    .venv/bin/python -m benchmarks.sim_headline \
        --trace $SAGA_TRACES/swe-mini-dev.jsonl --tau $SAGA_TRACES/tau-airline.jsonl \
        --out bench-out/headline

Parts (all on a 64-worker cluster of Llama-3-8B on H100-80GB by default):
1. SWE-bench replay at a load where `apc-lru` is under memory pressure: every policy,
   the ablations, Belady and the unbounded cache on the same sessions.
2. Load sweep (sessions per worker): TCT and throughput; peak throughput per policy.
3. Two-tenant mix (heavy SWE + light tau-bench) with deadlines: SLO attainment.
4. Speed: wall time of a 1,000-task replay per policy, one core.
Prints one table per part and the closing ratios; writes everything as JSON.
`saga` includes routing by `saga_server.core.routing` (placement and KV-moving
steals; `saga-no-steal` is without it); `benchmarks/sim_routing.py` measures the
routing on its own.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path

from saga_server.bench import Scenario, TenantSpec, run_policies
from saga_server.bench.traces import trace_path
from saga_server.bench.policies import ABLATIONS, PEERS
from saga_server.bench.report import format_table

BASELINES = ("vanilla", "apc-lru", "apc-lru-offload", "continuum-ttl", "kvflow", *PEERS)
MAIN = BASELINES + ("saga", "infinite", "belady")


def table(runs) -> str:
    return format_table({"policies": {k: dict(r.summary, wall_s=r.wall_s) for k, r in runs.items()}})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(trace_path("swe-mini-dev.jsonl")))
    p.add_argument("--tau", default=str(trace_path("tau-airline.jsonl")))
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--per-worker", type=int, default=18, help="sessions per worker in part 1")
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--sweep", default="12,16,18,20,24", help="sessions per worker in part 2")
    p.add_argument("--mix-per-worker", type=int, default=40)
    p.add_argument("--mix-tasks", type=int, default=6000, help="> in-flight, so the mix saturates")
    p.add_argument("--deadline", type=float, default=4.0, help="deadline multiple of unloaded time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="skip ablations and the sweep")
    p.add_argument("--out", default="bench-out/headline")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    traces: dict = {}
    result: dict = {}
    swe = Scenario(name="swe", tenants=(TenantSpec("swe", a.trace),), tasks=a.tasks, workers=a.workers,
                   concurrency=a.workers * a.per_worker, seed=a.seed)

    print(f"## 1. {a.tasks} SWE-bench tasks, {a.workers} workers, {a.per_worker} sessions/worker "
          f"(KV pool {swe.cost_model().kv_capacity_tokens} tokens/worker)")
    pols = MAIN if a.quick else MAIN + ABLATIONS
    runs = run_policies(swe, pols, progress=True, traces=traces)
    print(table(runs))
    result["main"] = {k: dict(r.summary, wall_s=r.wall_s) for k, r in runs.items()}
    s = {k: r.summary for k, r in runs.items()}

    peak: dict[str, float] = {}
    if not a.quick:
        print("\n## 2. Load sweep (sessions per worker)")
        rows = []
        for pw in [int(x) for x in a.sweep.split(",")]:
            sc = replace(swe, concurrency=a.workers * pw)
            sw = run_policies(sc, BASELINES + ("saga", "infinite"), progress=True, traces=traces,
                              desc=f"{pw}/worker")
            for k, r in sw.items():
                rows.append({"per_worker": pw, "policy": k, "tct_mean_s": r.summary["tct_mean_s"],
                             "tokens_per_s": r.summary["tokens_per_s"],
                             "tasks_per_hour": r.summary["tasks_per_hour"]})
                peak[k] = max(peak.get(k, 0.0), r.summary["tokens_per_s"])
            print(f"{pw:3d}/worker  " + "  ".join(f"{k}={r.summary['tct_mean_s']:.0f}s/"
                                                  f"{r.summary['tokens_per_s'] / 1e3:.0f}ktok/s"
                                                  for k, r in sw.items()))
            t = {k: r.summary["tct_mean_s"] for k, r in sw.items()}
            print(f"           TCT apc-lru/saga {t['apc-lru'] / t['saga']:.2f}  "
                  f"vanilla/saga {t['vanilla'] / t['saga']:.2f}  saga/infinite {t['saga'] / t['infinite']:.3f}")
        result["load_sweep"] = rows
        result["peak_tokens_per_s"] = peak

    in_flight = min(a.mix_tasks, a.workers * a.mix_per_worker)
    print(f"\n## 3. Two tenants: SWE + tau-bench (weight 3), deadlines {a.deadline:g}x unloaded, "
          f"{a.mix_tasks} tasks, {in_flight} in flight on {a.workers} workers")
    mix = Scenario(name="mix", tenants=(TenantSpec("swe", a.trace, 1.0, a.deadline),
                                        TenantSpec("tau", a.tau, 3.0, a.deadline)),
                   tasks=a.mix_tasks, workers=a.workers, concurrency=a.workers * a.mix_per_worker, seed=a.seed)
    mruns = run_policies(mix, BASELINES + ("saga", "saga-no-afs", "infinite"), progress=True, traces=traces)
    print(table(mruns))
    result["mix"] = {k: dict(r.summary, wall_s=r.wall_s) for k, r in mruns.items()}

    print(f"\n## 4. Speed: 1,000 SWE tasks on {a.workers} workers")
    speed = {}
    sp = replace(swe, tasks=1000)
    for pol in ("apc-lru", "saga", "belady"):
        t0 = time.perf_counter()
        r = run_policies(sp, (pol,), progress=False, traces=traces)[pol]
        speed[pol] = {"wall_s": time.perf_counter() - t0, "llm_calls": r.summary["llm_calls"]}
        print(f"{pol}: {speed[pol]['wall_s']:.1f} s for {r.summary['llm_calls']} LLM calls")
    result["speed"] = speed

    def ratio(x, y, key="tct_mean_s"):
        return s[x][key] / s[y][key]

    best_base = max(BASELINES, key=lambda k: peak.get(k, s[k]["tokens_per_s"]))
    tput = (peak or {k: v["tokens_per_s"] for k, v in s.items()})
    close = {
        "tct_apc_over_saga": ratio("apc-lru", "saga"),
        "tct_vanilla_over_saga": ratio("vanilla", "saga"),
        "tct_saga_over_infinite": ratio("saga", "infinite"),
        "regen_share_saga": s["saga"]["regen_share"],
        "mem_util_saga": s["saga"]["mem_util"],
        "belady_ratio_saga": s["saga"].get("belady_ratio", math.nan),
        "belady_ratio_apc": s["apc-lru"].get("belady_ratio", math.nan),
        "slo_saga": result["mix"]["saga"]["slo"],
        "slo_apc": result["mix"]["apc-lru"]["slo"],
        "best_baseline_throughput": best_base,
        "peak_throughput_saga_vs_best_baseline": tput["saga"] / tput[best_base] - 1.0,
    }
    for k in ("saga-no-prefetch", "saga-only-walru"):
        if k in s:
            close[f"belady_ratio_{k}"] = s[k].get("belady_ratio", math.nan)
    result["closing"] = close
    print("\n## Closing ratios")
    for k, v in close.items():
        print(f"{k}: {v if isinstance(v, (str, dict)) else round(v, 3)}")
    (out / "headline.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {out / 'headline.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
