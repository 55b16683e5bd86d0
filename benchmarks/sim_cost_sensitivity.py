"""How much the simulator's headline ratios depend on its cost constants.

`benchmarks/gpu_cost_check.py` measured Llama-3-8B-shaped kernels on a real H200:
prefill reached 0.64 of peak BF16 (the model assumes `mfu` 0.5) and decode reached
0.64-0.70 of HBM bandwidth at batch 1-32 and 0.80 at 64-128 (the model assumes
`bw_eff` 0.8). This replays the headline scenario (64 workers, 18 SWE sessions
each, the `sim_headline.py` part 1 load) under the preset constants and under the
measured ones, side by side, and prints the TCT ratios each gives.

    python -m benchmarks.sim_cost_sensitivity [--tasks 2000]

(One variant alone: `saga bench ... --mfu 0.64 --bw-eff 0.67`.) Measured, 2,000 tasks:

| constants | TCT apc-lru / saga | vanilla / saga | kvflow / saga | saga TCT mean s |
|---|---|---|---|---|
| preset (mfu 0.50, bw_eff 0.80) | 1.69 | 3.40 | 1.015 | 434 |
| measured prefill (mfu 0.64) | 1.52 | 2.84 | 1.017 | 431 |
| measured prefill and small-batch decode (mfu 0.64, bw_eff 0.67) | 1.47 | 2.55 | 1.019 | 504 |
"""

from __future__ import annotations

import argparse
from saga_server.bench import Scenario, TenantSpec, run_policies
from saga_server.bench.traces import trace_path

VARIANTS = {"preset (mfu 0.50, bw_eff 0.80)": {},
            "measured prefill (mfu 0.64)": {"mfu": 0.64},
            "measured prefill and small-batch decode (mfu 0.64, bw_eff 0.67)": {"mfu": 0.64, "bw_eff": 0.67}}
POLICIES = ("vanilla", "apc-lru", "kvflow", "saga")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(trace_path("swe-mini-dev.jsonl")))
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--per-worker", type=int, default=18)
    p.add_argument("--tasks", type=int, default=2000)
    a = p.parse_args()
    traces: dict = {}
    print("| constants | TCT apc-lru / saga | vanilla / saga | kvflow / saga | saga TCT mean s |")
    print("|---|---|---|---|---|")
    for label, overrides in VARIANTS.items():
        sc = Scenario(name="swe", tenants=(TenantSpec("swe", a.trace),), tasks=a.tasks, workers=a.workers,
                      concurrency=a.workers * a.per_worker, **overrides)
        runs = run_policies(sc, POLICIES, progress=True, traces=traces, desc=label)
        t = {k: r.summary["tct_mean_s"] for k, r in runs.items()}
        print(f"| {label} | {t['apc-lru'] / t['saga']:.2f} | {t['vanilla'] / t['saga']:.2f} | "
              f"{t['kvflow'] / t['saga']:.3f} | {t['saga']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
