"""Overload: every policy side by side as sessions outgrow the KV tiers, in one run.

    .venv/bin/python -m benchmarks.sim_overload \
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
from pathlib import Path

from saga_server.bench.traces import trace_path

from benchmarks.harness.overload import POLICIES, print_tables, run_one
from benchmarks.harness.results import write_json
from benchmarks.harness.sim import add_run_arguments, listed, run_all


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(trace_path("swe-mini-dev.jsonl")))
    ap.add_argument("--hosts", default="1,0,4", help="host tier / GPU pool")
    add_run_arguments(ap, workers=16, loads="12,18,24,36,54,72", tasks_factor=5, policies=POLICIES,
                      out="bench-out/overload", loads_help="sessions per worker")
    a = ap.parse_args()
    loads, hosts, policies = listed(a.loads, int), listed(a.hosts, float), listed(a.policies)
    jobs = [(a.trace, a.workers, pw, h, a.tasks_factor, p, a.seed) for h in hosts for pw in loads for p in policies]
    out = Path(a.out)
    rows = run_all(jobs, a.jobs, "overload", run_one)
    write_json(out / "overload.json", rows)
    print_tables(rows, hosts, loads, policies, a.workers)
    print(f"\nwrote {out / 'overload.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
