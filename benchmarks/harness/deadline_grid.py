"""The deadline grid of `sim_deadlines.py --grid`: many tenant mixes, not one.

A *cell* is a mix of tenants, each with a trace, a share of the tasks (its weight)
and a deadline factor (a task's deadline over its time alone on a worker), started
ramped (the first tasks spread over the mix's mean unloaded task time) or in one
burst. The grid's cells:

- every pair of the profiles below, each pair twice, once with either tenant the
  tight one, the pair's settings taken in turn from `SETTINGS` (tight factor 1.5x
  to 3x against loose 3x to 6x, the tight tenant's weight 1 to 4, ramped or burst);
- `flood`: two quiet tenants (`browser` at 2x, `coding` at 4x, one share each)
  beside a flooder (`agent` at 6x) sending four shares, four times its own; and
  the quiet pair alone at the same sessions each (`flood-alone`), to compare with.

Profiles: `coding` and `browser` (`deadline_tenants.py`), `agent` (an autonomous
production-shaped agent, `production_agents.py`: one turn of about 32 calls), and,
where the traces folder holds them (`saga_server.bench.traces`), `swe` (SWE-bench runs of mini-swe-agent) and `tau`
(tau-bench airline dialogues).

Loads: per cell, sessions in flight per worker doubling from 1 until the probe
policy (`PROBE`) meets under 70% of a tenant's deadlines, then one bisection: that
load is the cell's L, and it runs at L/4, L/2, L and 3L/2 (distinct, at least 1).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from saga_server.bench import Scenario, TenantSpec
from saga_server.bench.metrics import percentile, summarize
from saga_server.bench.policies import PEERS, make_policy
from saga_server.bench.runner import _instances
from saga_server.bench.traces import trace_path
from saga_server.engines.sim import Simulator
from saga_server.engines.sim.results import SPLIT, unloaded_time_s

from benchmarks.harness.deadline_tenants import generate as deadline_tenants
from benchmarks.harness.plots import png
from benchmarks.harness.production_agents import ProductionShape
from benchmarks.harness.production_agents import generate as production_agents
from benchmarks.harness.results import write_json, write_jsonl
from benchmarks.harness.sim import listed, run_all

__all__ = ["SETTINGS", "PROBE", "POLICIES", "Cell", "profiles", "cells", "probe_loads", "run_cell", "jain", "main"]

# (tight factor, loose factor, the tight tenant's weight, ramped start): taken in
# turn by the pairs, so each appears across the grid.
SETTINGS = ((1.5, 6.0, 1.0, True), (2.0, 4.0, 4.0, False), (3.0, 3.0, 2.0, True), (2.0, 6.0, 2.0, True),
            (1.5, 3.0, 4.0, True), (3.0, 6.0, 1.0, False))
PROBE = "apc-lru-offload"  # vLLM with its CPU tier: the load search's yardstick
FALLS_TO = 0.7  # the attainment the load search looks for
# The aim's scope: cells where each task alone meets its deadline this often, and the
# best other policy meets at least this share of the tight tenant's.
SCOPE_CEILING, SCOPE_BEST_OTHER = 0.995, 0.7
POLICIES = ("apc-lru-offload", "kvflow", "thunderagent", *PEERS, "saga-no-shape", "saga")
AGENT = ProductionShape(turns_mean=1.0, calls_per_turn_mean=32.0)  # an autonomous agent: no person


@dataclass(frozen=True, slots=True)
class Cell:
    name: str
    tenants: tuple[TenantSpec, ...]  # the first is the tight one
    ramped: bool

    @property
    def tight(self) -> str:
        return self.tenants[0].name


def profiles(out: Path, tasks: int, seed: int) -> dict[str, str]:
    """Trace files of every profile that can be had here (module doc), by name."""
    coding, browser = deadline_tenants(tasks, seed)
    found = {"coding": str(write_jsonl(out / "coding.jsonl", coding)),
             "browser": str(write_jsonl(out / "browser.jsonl", browser)),
             "agent": str(write_jsonl(out / "agent.jsonl", production_agents(tasks, seed, AGENT)))}
    for name, file in (("swe", "swe-mini-dev.jsonl"), ("tau", "tau-airline.jsonl")):
        if trace_path(file).is_file():
            found[name] = str(trace_path(file))
    return found


def cells(traces: dict[str, str]) -> list[Cell]:
    """The grid's cells over these profiles (module doc)."""
    out = []
    settings = itertools.cycle(SETTINGS)
    for a, b in itertools.combinations(sorted(traces), 2):
        for tight, loose in ((a, b), (b, a)):
            t_factor, l_factor, weight, ramped = next(settings)
            out.append(Cell(f"{tight}@{t_factor:g}x+{loose}@{l_factor:g}x/w{weight:g}/{'ramp' if ramped else 'burst'}",
                            (TenantSpec(tight, traces[tight], weight, t_factor),
                             TenantSpec(loose, traces[loose], 1.0, l_factor)), ramped))
    if {"browser", "coding", "agent"} <= set(traces):
        quiet = (TenantSpec("browser", traces["browser"], 1.0, 2.0), TenantSpec("coding", traces["coding"], 1.0, 4.0))
        out.append(Cell("flood", quiet + (TenantSpec("agent", traces["agent"], 4.0, 6.0),), True))
    return out


def flood_alone(cell: Cell) -> Cell:
    """The flood cell's quiet tenants alone (run at a third of its sessions)."""
    return replace(cell, name="flood-alone", tenants=cell.tenants[:2])


def scenario(cell: Cell, workers: int, per_worker: int, tasks_factor: int, seed: int) -> Scenario:
    sc = Scenario(tenants=cell.tenants, tasks=workers * per_worker * tasks_factor, workers=workers,
                  concurrency=workers * per_worker, seed=seed)
    if cell.ramped:
        sample = replace(sc, tasks=600, concurrency=workers)
        cost = sample.cost_model()
        ramp = statistics.fmean(unloaded_time_s(i.task, cost) for i in _instances(sample, {}))
        sc = replace(sc, ramp_s=ramp)
    return sc


def run_cell(job: tuple) -> dict:
    """One policy on one cell at one load and seed: each tenant's attainment, mean and
    p99 task time, normalised service (mean of time alone over time taken) and the
    split of its missed tasks; the ceiling (tasks within deadline alone on a worker)."""
    cell, workers, per_worker, tasks_factor, policy, seed = job
    sc = scenario(cell, workers, per_worker, tasks_factor, seed)
    res = Simulator(sc.cost_model(), make_policy(policy), _instances(sc, {}), sc.sim_config()).run()
    s = summarize(res)
    by_tenant: dict[str, list] = {}
    for t in res.tasks:
        by_tenant.setdefault(t.tenant, []).append(t)
    return {"cell": cell.name, "tight": cell.tight, "policy": policy, "per_worker": per_worker, "seed": seed,
            "slo": s["slo"], "tct_mean_s": s["tct_mean_s"], "goodput_per_hour": s["goodput_per_hour"],
            "tct_p99_by_tenant": {k: percentile([t.tct_s for t in v], 99) for k, v in by_tenant.items()},
            "service": {k: statistics.fmean(t.unloaded_s / t.tct_s for t in v) for k, v in by_tenant.items()},
            "ceiling": {k: statistics.fmean(t.unloaded_s <= t.deadline_s for t in v) for k, v in by_tenant.items()},
            "miss_split": s["miss_split"]}


def probe_loads(job: tuple) -> tuple[str, list[int]]:
    """The cell's loads (module doc), from runs of `PROBE` at seed 0."""
    cell, workers, tasks_factor, max_per_worker = job

    def falls(pw: int) -> bool:
        row = run_cell((cell, workers, pw, tasks_factor, PROBE, 0))
        return min(row["slo"].values()) < FALLS_TO

    lo, hi = 0, 1
    while hi <= max_per_worker and not falls(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, max_per_worker)
    if hi - lo > 1:
        mid = (lo + hi) // 2
        if falls(mid):
            hi = mid
    loads = sorted({max(1, hi // 4), max(1, hi // 2), hi, max(1, math.ceil(hi * 1.5))})
    return cell.name, [pw for pw in loads if pw <= max_per_worker] or [max_per_worker]


def jain(values: list[float]) -> float:
    """Jain's fairness index of non-negative values: 1 when equal, 1/n when one has all."""
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else math.nan


def _mean_rows(rows: list[dict]) -> dict[tuple, dict]:
    """Rows averaged over seeds, by (cell, load, policy)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["cell"], r["per_worker"], r["policy"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        tenants = sorted({t for r in rs for t in r["slo"]})

        def over_seeds(field: str, t: str, agg=statistics.fmean) -> float:
            return agg([r[field][t] for r in rs if t in r[field]])

        out[key] = {"tight": rs[0]["tight"], "seeds": len(rs),
                    "slo": {t: over_seeds("slo", t) for t in tenants},
                    "ceiling": {t: over_seeds("ceiling", t, min) for t in tenants},
                    "tct_mean_s": statistics.fmean(r["tct_mean_s"] for r in rs),
                    "goodput_per_hour": statistics.fmean(r["goodput_per_hour"] for r in rs),
                    "p99": {t: over_seeds("tct_p99_by_tenant", t) for t in tenants},
                    "service": {t: over_seeds("service", t) for t in tenants},
                    "miss_split": [r["miss_split"] for r in rs]}
    return out


def _others(policies: list[str]) -> list[str]:
    return [p for p in policies if not p.startswith("saga")]


def _split_text(splits: list[dict], tenant: str) -> str:
    """The mean miss split of a tenant over seeds, as shares of its missed tasks' time."""
    rows = [s[tenant] for s in splits if tenant in s]
    if not rows:
        return "no misses"
    n = sum(r["missed"] for r in rows)
    tct = sum(r["tct_s"] * r["missed"] for r in rows)
    parts = {c: sum(r[c] * r["missed"] for r in rows) / tct for c in (*SPLIT, "other")}
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:4]
    return f"{n} missed: " + ", ".join(f"{c} {v:.0%}" for c, v in top)


def print_grid(mean: dict[tuple, dict], loads: dict[str, list[int]], policies: list[str]) -> None:
    others = _others(policies)
    in_scope, misses = 0, []
    for cell, cell_loads in loads.items():
        if cell == "flood-alone":
            continue
        print(f"\n### {cell}: the tight tenant's share within deadline (mean of seeds), mean task s")
        print("| per worker | " + " | ".join(policies) + " | ceiling | saga, each tenant | saga / best other mean task"
              " | goodput/h, saga / best other |")
        print("|---" * (len(policies) + 5) + "|")
        for pw in cell_loads:
            rows = {p: mean[(cell, pw, p)] for p in policies if (cell, pw, p) in mean}
            tight = next(iter(rows.values()))["tight"]
            best_other = max((rows[p]["slo"].get(tight, math.nan) for p in others if p in rows), default=math.nan)
            fastest = min((rows[p]["tct_mean_s"] for p in others if p in rows), default=math.nan)
            saga = rows.get("saga")
            cells_txt = " | ".join(f"{rows[p]['slo'].get(tight, math.nan):.1%} ({rows[p]['tct_mean_s']:.0f})"
                                   if p in rows else "-" for p in policies)
            every = min(saga["slo"].values()) if saga else math.nan
            ratio = saga["tct_mean_s"] / fastest if saga else math.nan
            ceiling = min(saga["ceiling"].values()) if saga else 0.0
            each = ", ".join(f"{t} {v:.1%}" for t, v in saga["slo"].items()) if saga else "-"
            goodput = max((rows[p]["goodput_per_hour"] for p in others if p in rows), default=math.nan)
            print(f"| {pw} | {cells_txt} | {ceiling:.1%} | {each} | {ratio:.3f} | "
                  f"{saga['goodput_per_hour'] if saga else math.nan:.0f} / {goodput:.0f} |")
            if saga and ceiling >= SCOPE_CEILING and best_other >= SCOPE_BEST_OTHER:
                in_scope += 1
                if every < 0.99 or ratio > 1.05:
                    worst = min(saga["slo"], key=saga["slo"].get)
                    misses.append(f"- {cell} at {pw}/worker: every tenant {every:.1%}, mean task {ratio:.3f}x the "
                                  f"fastest other; {worst}: {_split_text(saga['miss_split'], worst)}")
    print(f"\n## the aim: {in_scope - len(misses)} of {in_scope} cells and loads in scope met"
          " (scope: ceiling >= 99.5% and the best other policy >= 70% of the tight tenant; aim: saga >= 99%"
          " of every tenant, mean task time within 5% of the fastest other policy)")
    print("\n".join(misses) if misses else "- every one met")


def print_flood(mean: dict[tuple, dict], loads: dict[str, list[int]], policies: list[str]) -> None:
    if "flood" not in loads:
        return
    print("\n### flood: the quiet tenants beside a flooder sending 4x its share, against them alone")
    print("| per worker | policy | browser within deadline (alone) | coding (alone) | browser p99 / alone |"
          " coding p99 / alone | Jain's index |")
    print("|---" * 7 + "|")
    for pw, alone_pw in zip(loads["flood"], loads["flood-alone"]):
        for p in policies:
            f, a = mean.get(("flood", pw, p)), mean.get(("flood-alone", alone_pw, p))
            if f is None or a is None:
                continue
            slo = [f"{f['slo'].get(t, math.nan):.1%} ({a['slo'].get(t, math.nan):.1%})" for t in ("browser", "coding")]
            p99 = [f"{f['p99'].get(t, math.nan) / a['p99'].get(t, math.nan):.2f}" for t in ("browser", "coding")]
            print(f"| {pw} | {p} | {' | '.join(slo)} | {' | '.join(p99)} | {jain(list(f['service'].values())):.3f} |")


def plot_grid(mean: dict[tuple, dict], loads: dict[str, list[int]], policies: list[str], path: Path) -> None:
    names = [c for c in loads if c != "flood-alone"]
    cols = math.ceil(math.sqrt(len(names)))
    rows = math.ceil(len(names) / cols)
    with png(path, rows, cols, figsize=(3.2 * cols, 2.6 * rows), sharey=True, squeeze=False) as (_, axes):
        for ax, cell in zip(axes.flat, names):
            for p in policies:
                pts = [(pw, mean[(cell, pw, p)]) for pw in loads[cell] if (cell, pw, p) in mean]
                if pts:
                    tight = pts[0][1]["tight"]
                    ax.plot([x for x, _ in pts], [m["slo"].get(tight, math.nan) for _, m in pts], marker=".", label=p)
            ax.axhline(0.99, color="grey", lw=0.6, ls="--")
            ax.set_title(cell, fontsize=6)
            ax.tick_params(labelsize=6)
        for ax in list(axes.flat)[len(names):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=5)
        axes.flat[0].set_ylabel("tight tenant within deadline", fontsize=6)


def main(a, out: Path) -> int:
    """Run the grid with `sim_deadlines.py`'s parsed options `a`, writing to `out`."""
    traces = profiles(out, a.tasks, 0)
    grid = cells(traces)
    print(f"{len(grid)} cells over profiles {', '.join(sorted(traces))}; {a.grid_workers} workers; "
          f"probing loads with {PROBE}")
    probed = dict(run_all([(c, a.grid_workers, a.tasks_factor, a.grid_max_load) for c in grid], a.jobs,
                          "probe", probe_loads))
    by_name = {c.name: c for c in grid}
    if "flood" in by_name:
        by_name["flood-alone"] = flood_alone(by_name["flood"])
        probed["flood-alone"] = [max(1, round(pw / 3)) for pw in probed["flood"]]
    policies, seeds = listed(a.grid_policies), listed(a.grid_seeds, int)
    jobs = [(by_name[name], a.grid_workers, pw, a.tasks_factor, p, seed)
            for name, pws in probed.items() for pw in pws for seed in seeds for p in policies]
    print(f"{len(jobs)} runs")
    rows = run_all(jobs, a.jobs, "grid", run_cell)
    write_json(out / "grid.json", {"loads": probed, "rows": rows})
    mean = _mean_rows(rows)
    print_grid(mean, probed, policies)
    print_flood(mean, probed, policies)
    plot_grid(mean, probed, policies, out / "grid.png")
    print(f"\nwrote {out / 'grid.json'} and {out / 'grid.png'}")
    return 0
