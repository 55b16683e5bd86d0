"""Deadlines under load: two tenants, every policy, a sweep of load, in one run.

    .venv/bin/python -m benchmarks.sim_deadlines \
        --out bench-out/deadlines [--jobs 2]

The tenants are drawn by `deadline_tenants.py` (written to `<out>/`): a coding agent
with deadlines of 4x a task's unloaded time and a browser agent taking three tasks in
four with deadlines of 2x. `--tenants NAME:SHARE:FACTOR,...` runs another mix of the
grid's profiles instead (below; `swe` and `tau` where `$SAGA_TRACES` has them), e.g.
`--tenants swe:1:4,browser:3:2 --ramp-s 60` for the SWE-bench traces at 4x beside the
browser agent at 2x taking three tasks in four. Each load (sessions in flight per
worker, closed loop, 16 x H100 with Llama-3-8B by default) runs `--tasks-factor` x
that many tasks per policy.
The first tasks start spread over `--ramp-s` seconds, by default the mix's mean
unloaded task time: the phases of a closed loop in its steady state. `--ramp-s 0`
starts them all at once, a synchronised burst of first prompts on every worker.
Printed per load: each tenant's share of tasks within deadline, mean task time,
goodput (tasks within deadline per hour) and the slack used (completion time over
deadline); then, per policy, the lowest load at which a tenant falls below 99%.
`<out>/deadlines.png` plots attainment against load.

    .venv/bin/python -m benchmarks.sim_deadlines --grid --out bench-out/deadline-grid --jobs 2

runs the grid instead (`harness/deadline_grid.py`): every pair of tenant profiles
with either one tight, deadline factors 1.5x-3x against 3x-6x, weights 1-4, ramped
and burst starts, each at four loads up to where vLLM with its CPU tier meets
about 70% of a tenant's deadlines, three seeds, 4 workers; and a flooder sending
four times its share beside two quiet tenants. It prints per cell each policy's
attainment of the tight tenant and mean task time, the cells where SAGA misses
its aim with where the missed tasks' time went (`metrics.miss_split`), the quiet
tenants against themselves alone with Jain's index over the tenants' normalised
service, and plots attainment against load per cell (`<out>/grid.png`).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

from saga_server.bench import Scenario, TenantSpec
from saga_server.bench.metrics import summarize
from saga_server.bench.policies import PEERS, make_policy
from saga_server.bench.runner import _instances
from saga_server.engines.sim import Simulator
from saga_server.engines.sim.results import unloaded_time_s

from benchmarks.harness import deadline_grid
from benchmarks.harness.plots import png
from benchmarks.harness.results import write_json
from benchmarks.harness.sim import add_run_arguments, listed, run_all

POLICIES = ("apc-lru", "apc-lru-offload", "kvflow", "thunderagent", *PEERS, "saga-no-shape", "saga")
TENANTS = "coding:1:4,browser:3:2"  # the mix: profile, share of tasks, deadline factor

Tenants = tuple[tuple[str, float, float], ...]


def parse_tenants(spec: str, profiles: dict[str, str]) -> Tenants:
    """`NAME:SHARE:FACTOR,...` over the profiles to hand; ValueError says what is wrong."""
    out = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        if len(fields) != 3:
            raise ValueError(f"tenant {part.strip()!r}: expected NAME:SHARE:FACTOR")
        name, share, factor = fields[0], _positive(fields[1], part), _positive(fields[2], part)
        if name not in profiles:
            raise ValueError(f"tenant {name!r}: no such profile here (have: {', '.join(sorted(profiles))}; "
                             "swe and tau are read from $SAGA_TRACES)")
        if any(name == n for n, _, _ in out):
            raise ValueError(f"tenant {name!r} named twice")
        out.append((name, share, factor))
    if len(out) < 2:
        raise ValueError("name at least two tenants")
    return tuple(out)


def _positive(text: str, part: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value < math.inf:
        raise ValueError(f"tenant {part.strip()!r}: share and factor must be numbers > 0")
    return value


def scenario(traces: dict, tenants: Tenants, workers: int, per_worker: int, tasks_factor: int, seed: int,
             ramp_s: float = 0.0) -> Scenario:
    specs = tuple(TenantSpec(name, traces[name], share, deadline) for name, share, deadline in tenants)
    return Scenario(tenants=specs, tasks=workers * per_worker * tasks_factor, workers=workers,
                    concurrency=workers * per_worker, ramp_s=ramp_s, seed=seed)


def mean_unloaded_s(traces: dict, tenants: Tenants, workers: int, seed: int) -> float:
    """The mix's mean task time alone on a worker (a sample of 1,000 tasks)."""
    sc = replace(scenario(traces, tenants, workers, 1, 1, seed), tasks=1000)
    cost = sc.cost_model()
    return statistics.fmean(unloaded_time_s(inst.task, cost) for inst in _instances(sc, {}))


def run_one(job: tuple) -> dict:
    traces, tenants, workers, per_worker, tasks_factor, policy, seed, ramp_s = job
    sc = scenario(traces, tenants, workers, per_worker, tasks_factor, seed, ramp_s)
    sim = Simulator(sc.cost_model(), make_policy(policy), _instances(sc, {}), sc.sim_config())
    t0 = time.perf_counter()
    res = sim.run()
    s = summarize(res)
    return {"policy": policy, "per_worker": per_worker, "tasks": len(res.tasks), "slo": s["slo"],
            "slack_used": s["slack_used"], "tct_mean_s": s["tct_mean_s"],
            "tct_by_tenant": s["tct_mean_by_tenant_s"], "tasks_per_hour": s["tasks_per_hour"],
            "goodput_per_hour": s["goodput_per_hour"], "wall_s": time.perf_counter() - t0}


def print_tables(rows: list[dict], loads: list[int], policies: list[str], workers: int, tenants: Tenants) -> None:
    names = [n for n, _, _ in tenants]
    for pw in loads:
        sel = {r["policy"]: r for r in rows if r["per_worker"] == pw}
        print(f"\n## {pw} sessions/worker ({pw * workers} in flight), {next(iter(sel.values()))['tasks']} tasks")
        print("| policy | " + " | ".join(f"{n} within deadline" for n in names)
              + " | mean task s | goodput/h | " + " | ".join(f"{n} slack used" for n in names) + " |")
        print("|---" * (3 + 2 * len(names)) + "|")
        for p in policies:
            r = sel[p]
            print(f"| {p} | " + " | ".join(f"{r['slo'].get(n, 0.0):.1%}" for n in names)
                  + f" | {r['tct_mean_s']:.0f} | {r['goodput_per_hour']:.0f} | "
                  + " | ".join(f"{r['slack_used'].get(n, 0.0):.2f}" for n in names) + " |")
    print("\n## lowest load where a tenant falls below 99% within deadline")
    for p in policies:
        falls = [r["per_worker"] for r in sorted(rows, key=lambda r: r["per_worker"])
                 if r["policy"] == p and min(r["slo"].values()) < 0.99]
        print(f"- {p}: {falls[0] if falls else 'none in the sweep'}")


def plot(rows: list[dict], policies: list[str], tenants: Tenants, path: Path) -> None:
    with png(path, 1, len(tenants), figsize=(11, 4.2), sharey=True) as (_, axes):
        for ax, (name, _, factor) in zip(axes, tenants):
            for p in policies:
                pts = sorted((r["per_worker"], r["slo"].get(name, 0.0)) for r in rows if r["policy"] == p)
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
            ax.axhline(0.99, color="grey", lw=0.8, ls="--")
            ax.set_title(f"{name} (deadline {factor:g}x unloaded)")
            ax.set_xlabel("sessions in flight per worker")
        axes[0].set_ylabel("tasks within deadline")
        axes[-1].legend(fontsize=8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=400, help="distinct tasks generated per tenant")
    ap.add_argument("--tenants", default=TENANTS,
                    help="the mix, NAME:SHARE:FACTOR,... of the profiles coding, browser, agent, and swe and "
                         "tau where $SAGA_TRACES has them (share of tasks; deadline / unloaded time)")
    ap.add_argument("--ramp-s", type=float, default=None,
                    help="spread the first tasks' starts over this many seconds "
                         "(default: the mix's mean unloaded task time; 0: all at once)")
    add_run_arguments(ap, workers=16, loads="8,12,16,20,22,24,25,26,28", tasks_factor=3, policies=POLICIES,
                      out="bench-out/deadlines")
    ap.add_argument("--grid", action="store_true", help="the grid of tenant mixes instead (module doc)")
    ap.add_argument("--grid-workers", type=int, default=4)
    ap.add_argument("--grid-seeds", default="0,1,2")
    ap.add_argument("--grid-policies", default=",".join(deadline_grid.POLICIES))
    ap.add_argument("--grid-max-load", type=int, default=64, help="the load search's ceiling, per worker")
    a = ap.parse_args()
    out = Path(a.out)
    if a.grid:
        return deadline_grid.main(a, out)
    traces = deadline_grid.profiles(out, a.tasks, a.seed)
    try:
        tenants = parse_tenants(a.tenants, traces)
    except ValueError as e:
        ap.error(f"--tenants: {e}")
    loads, policies = listed(a.loads, int), listed(a.policies)
    ramp_s = mean_unloaded_s(traces, tenants, a.workers, a.seed) if a.ramp_s is None else a.ramp_s
    if not ramp_s >= 0:
        ap.error("--ramp-s must be >= 0")
    print(f"first tasks start over {ramp_s:.1f} s")
    jobs = [(traces, tenants, a.workers, pw, a.tasks_factor, p, a.seed, ramp_s) for pw in loads for p in policies]
    rows = run_all(jobs, a.jobs, "deadlines", run_one)
    write_json(out / "deadlines.json", rows)
    print_tables(rows, loads, policies, a.workers, tenants)
    plot(rows, policies, tenants, out / "deadlines.png")
    print(f"\nwrote {out / 'deadlines.json'} and {out / 'deadlines.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
