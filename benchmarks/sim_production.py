"""Production-shaped coding agents in the simulator: every policy at light, medium and
heavy load, with a host tier of 1x and 4x the GPU pool, in one run.

    PYTHONPATH=sdk:server .venv/bin/python benchmarks/sim_production.py \
        --sessions 2000 --out bench-out/production [--jobs 2]

The workload is drawn by `production_agents.py` (long contexts, user turns with a
person's wait between them, compaction; every number's source is cited there) and
written to `<out>/production.jsonl`, so the same tasks can be replayed by `saga bench
--trace`. Each (host tier, load) runs a closed loop of `--workers` x sessions per
worker over `--tasks-factor` x that many tasks (drawn from the generated sessions in
seeded rounds), Llama-3-8B on H100 by default, with and without a disk tier below the
host tier (`--disks`, multiples of the GPU pool; read at `CostModel.disk_bw`). Completion time counts from a task's
arrival and includes the person's waits, which no policy can shorten; the recompute
share and memory utilisation say where policies differ. Printed per (host tier,
load): the `sim_overload.py` table and ratios, and the workload's own statistics
beside the published ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from production_agents import ProductionShape, generate, summary  # noqa: E402
from sim_overload import POLICIES, print_tables, run_all  # noqa: E402

# `oracle` splits SAGA's distance to `infinite` into what prediction costs and what is left.
PRODUCTION_POLICIES = (*POLICIES[:-1], "oracle", POLICIES[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=2000, help="distinct sessions generated")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--loads", default="8,32,96", help="sessions per worker: light, medium, heavy")
    ap.add_argument("--hosts", default="1,4", help="host tier / GPU pool")
    ap.add_argument("--disks", default="0,16", help="disk tier below the host tier / GPU pool (0: none)")
    ap.add_argument("--tasks-factor", type=int, default=2, help="tasks = factor x sessions in flight")
    ap.add_argument("--policies", default=",".join(PRODUCTION_POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (one core each)")
    ap.add_argument("--out", default="bench-out/production")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = generate(a.sessions, a.seed, ProductionShape())
    trace = out / "production.jsonl"
    with trace.open("w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t, separators=(",", ":")) + "\n")
    print("generated workload:", json.dumps(summary(tasks), indent=1))
    loads = [int(x) for x in a.loads.split(",")]
    hosts = [float(x) for x in a.hosts.split(",")]
    policies = a.policies.split(",")
    disks = [float(x) for x in a.disks.split(",")]
    jobs = [(str(trace), a.workers, pw, h, a.tasks_factor, p, a.seed, d)
            for h in hosts for d in disks for pw in loads for p in policies]
    rows = run_all(jobs, a.jobs, desc="production")
    (out / "production.json").write_text(json.dumps(rows, indent=2))
    print_tables(rows, hosts, loads, policies, a.workers, title="production-shaped, ", disks=disks)
    print(f"\nwrote {out / 'production.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
