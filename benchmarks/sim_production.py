"""Production-shaped coding agents in the simulator: every policy at light, medium and
heavy load, with a host tier of 1x and 4x the GPU pool, in one run.

    .venv/bin/python -m benchmarks.sim_production \
        --sessions 2000 --out bench-out/production [--jobs 2]

The workload is drawn by `harness/production_agents.py` (long contexts, user turns with a
person's wait between them, compaction; every number's source is cited there) and
written to `<out>/production.jsonl`, so the same tasks can be replayed by `saga bench
--trace`. Each (host tier, load) runs a closed loop of `--workers` x sessions per
worker over `--tasks-factor` x that many tasks (drawn from the generated sessions in
seeded rounds), Llama-3-8B on H100 by default, with and without a disk tier below the
host tier (`--disks`, multiples of the GPU pool; read at `CostModel.disk_bw`). Completion time counts from a task's
arrival and includes the person's waits, which no policy can shorten; the recompute
share and memory utilisation say where policies differ. Printed per (host tier,
load): the `sim_overload` table and ratios, the user turns' times (what the person
waits on: from the task's start or the person's answer to the next hand-back; mean,
p50, p90, p99), and the workload's own statistics beside the published ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.harness.overload import POLICIES, USER_TURN_COLUMNS, print_tables, run_one
from benchmarks.harness.production_agents import ProductionShape, generate, summary
from benchmarks.harness.results import write_json, write_jsonl
from benchmarks.harness.sim import add_run_arguments, listed, run_all

# `oracle` splits SAGA's distance to `infinite` into what prediction costs and what is left.
PRODUCTION_POLICIES = (*POLICIES[:-1], "oracle", POLICIES[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=2000, help="distinct sessions generated")
    ap.add_argument("--hosts", default="1,4", help="host tier / GPU pool")
    ap.add_argument("--disks", default="0,16", help="disk tier below the host tier / GPU pool (0: none)")
    add_run_arguments(ap, workers=8, loads="8,32,96", tasks_factor=2, policies=PRODUCTION_POLICIES,
                      out="bench-out/production", loads_help="sessions per worker: light, medium, heavy")
    a = ap.parse_args()
    out = Path(a.out)
    tasks = generate(a.sessions, a.seed, ProductionShape())
    trace = write_jsonl(out / "production.jsonl", tasks)
    print("generated workload:", json.dumps(summary(tasks), indent=1))
    loads, hosts, disks, policies = listed(a.loads, int), listed(a.hosts, float), listed(a.disks, float), \
        listed(a.policies)
    jobs = [(str(trace), a.workers, pw, h, a.tasks_factor, p, a.seed, d)
            for h in hosts for d in disks for pw in loads for p in policies]
    rows = run_all(jobs, a.jobs, "production", run_one)
    write_json(out / "production.json", rows)
    print_tables(rows, hosts, loads, policies, a.workers, title="production-shaped, ", disks=disks)
    print_user_turns(rows, hosts, disks, loads, policies)
    print(f"\nwrote {out / 'production.json'}")
    return 0


def print_user_turns(rows: list[dict], hosts: list[float], disks: list[float], loads: list[int],
                     policies: list[str]) -> None:
    """One table per (host tier, disk tier, load): each policy's user-turn times."""
    for h, d, pw in ((h, d, pw) for h in hosts for d in disks for pw in loads):
        sel = {r["policy"]: r for r in rows if r["host"] == h and r["disk"] == d and r["per_worker"] == pw}
        disk = f", disk tier {d:g}x" if d else ""
        print(f"\n## user turns (s), host tier {h:g}x{disk}, {pw} sessions/worker")
        print("| policy | mean | p50 | p90 | p99 |")
        print("|---|---|---|---|---|")
        for p in policies:
            print(f"| {p} | " + " | ".join(f"{sel[p][c]:.0f}" for c in USER_TURN_COLUMNS) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
