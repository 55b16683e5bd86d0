"""Overload: every policy side by side as sessions outgrow the KV tiers, in one run.

    PYTHONPATH=sdk:server .venv/bin/python benchmarks/sim_overload.py \
        --trace $SAGA_TRACES/swe-mini-dev.jsonl --out bench-out/overload [--jobs 2]

A closed loop of `--workers` x per-worker sessions (Llama-3-8B on H100 by default),
`--tasks-factor` x that many tasks so the run reaches a steady state, for each load in
`--loads` (sessions per worker) and each host tier in `--hosts` (host KV capacity as a
multiple of the GPU pool). Completion time counts from a task's arrival, so time spent
waiting for admission is part of it. Printed per (host tier, load): mean and p90 task
completion time, throughput, hit rate and recompute share for every policy, each
policy's wall time (one core per run), then the ratios the admission work is judged by:
saga / infinite, best other policy / saga, saga / saga-no-admit.

`infinite` (unbounded KV) is a lower bound no finite pool can reach under overload: at
36 sessions per worker its running requests alone hold about twice the pool (the
`running_kv` column: mean KV of running requests per worker over the pool).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from saga_server.bench import Scenario, TenantSpec
from saga_server.bench.traces import trace_path
from saga_server.bench.metrics import summarize
from saga_server.bench.policies import make_policy
from saga_server.bench.runner import _instances
from saga_server.engines.sim import Simulator

POLICIES = ("apc-lru", "apc-lru-offload", "kvflow", "thunderagent", "saga-no-admit", "saga", "infinite")
REFERENCES = ("infinite", "oracle", "belady")  # bounds, never "the best other policy"


def run_one(job: tuple) -> dict:
    """One run: (trace, workers, per worker, host tier, tasks factor, policy, seed[, disk tier])."""
    trace, workers, per_worker, host, tasks_factor, policy, seed, *rest = job
    disk = rest[0] if rest else 0.0
    sc = Scenario(tenants=(TenantSpec("swe", trace),), tasks=workers * per_worker * tasks_factor, workers=workers,
                  concurrency=workers * per_worker, host_tier_factor=host, disk_tier_factor=disk, seed=seed)
    sim = Simulator(sc.cost_model(), make_policy(policy), _instances(sc, {}), sc.sim_config())
    t0 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t0
    s = summarize(res)
    return {"policy": policy, "per_worker": per_worker, "host": host, "disk": disk, "tasks": len(res.tasks),
            "tct_mean_s": s["tct_mean_s"], "tct_p90_s": s["tct_p90_s"], "tasks_per_hour": s["tasks_per_hour"],
            "hit_rate": s["hit_rate"], "recompute_share": s["recompute_share"], "regen_share": s["regen_share"],
            "mem_util": s["mem_util"], "running_kv": s["running_kv"], "parked": res.parked,
            "disk_share": res.disk_loaded_tokens / res.reusable_tokens if res.reusable_tokens else 0.0,
            "admission_waits": res.admitted_after_wait, "wall_s": wall}


def run_all(jobs: list[tuple], n_jobs: int, desc: str = "overload", run=run_one) -> list[dict]:
    """`run` (a module-level function, `run_one` by default) over `jobs`, `n_jobs`
    at a time, in the jobs' order, with a progress bar."""
    rows: list[dict] = []
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is in the server extra; the bar is optional
        tqdm = None
    with ProcessPoolExecutor(max_workers=n_jobs) as pool:
        bar = tqdm(total=len(jobs), desc=desc, unit="run") if tqdm else None
        for row in pool.map(run, jobs):
            rows.append(row)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    return rows


COLUMNS = ("tct_mean_s", "tct_p90_s", "tasks_per_hour", "hit_rate", "recompute_share", "mem_util", "running_kv",
           "wall_s")


def print_tables(rows: list[dict], hosts: list[float], loads: list[int], policies: list[str], workers: int,
                 title: str = "", disks: list[float] = (0.0,)) -> None:
    """One markdown table per (host tier, disk tier, load), then the ratios SAGA is judged by."""
    cols = COLUMNS
    for h, d, pw in ((h, d, pw) for h in hosts for d in disks for pw in loads):
        sel = {r["policy"]: r for r in rows if r["host"] == h and r.get("disk", 0.0) == d and r["per_worker"] == pw}
        disk = f", disk tier {d:g}x" if d else ""
        print(f"\n## {title}host tier {h:g}x{disk}, {pw} sessions/worker, {workers} workers, "
              f"{next(iter(sel.values()))['tasks']} tasks")
        print(f"| policy | {' | '.join(cols)} |")
        print("|---" * (len(cols) + 1) + "|")
        for p in policies:
            r = sel[p]
            print(f"| {p} | " + " | ".join(f"{r[c]:.3f}" if c in ("hit_rate", "recompute_share", "running_kv",
                                                                    "mem_util")
                                           else f"{r[c]:.0f}" if c != "wall_s" else f"{r[c]:.1f}"
                                           for c in cols) + " |")
        if "saga" in sel:
            saga = sel["saga"]
            others = [p for p in policies if p not in REFERENCES and not p.startswith("saga")]
            best = min(others, key=lambda p: sel[p]["tct_mean_s"]) if others else None
            parts = []
            for ref in ("oracle", "infinite"):
                if ref in sel:
                    parts.append(f"saga/{ref} {saga['tct_mean_s'] / sel[ref]['tct_mean_s']:.3f}")
            if best:
                parts.append(f"best other ({best})/saga {sel[best]['tct_mean_s'] / saga['tct_mean_s']:.3f}")
            if "saga-no-admit" in sel:
                parts.append(f"saga/saga-no-admit {saga['tct_mean_s'] / sel['saga-no-admit']['tct_mean_s']:.4f}"
                             f" (p90 {saga['tct_p90_s'] / sel['saga-no-admit']['tct_p90_s']:.3f})")
            print("  ".join(parts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(trace_path("swe-mini-dev.jsonl")))
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--loads", default="12,18,24,36,54,72", help="sessions per worker")
    ap.add_argument("--hosts", default="1,0,4", help="host tier / GPU pool")
    ap.add_argument("--tasks-factor", type=int, default=5, help="tasks = factor x sessions in flight")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (one core each)")
    ap.add_argument("--out", default="bench-out/overload")
    a = ap.parse_args()
    loads = [int(x) for x in a.loads.split(",")]
    hosts = [float(x) for x in a.hosts.split(",")]
    policies = a.policies.split(",")
    jobs = [(a.trace, a.workers, pw, h, a.tasks_factor, p, a.seed) for h in hosts for pw in loads for p in policies]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run_all(jobs, a.jobs)
    (out / "overload.json").write_text(json.dumps(rows, indent=2))
    print_tables(rows, hosts, loads, policies, a.workers)
    print(f"\nwrote {out / 'overload.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
