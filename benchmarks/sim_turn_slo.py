"""A deadline per user turn, two tenants, production-shaped agents: every policy at
light, medium and heavy load, in one run.

    .venv/bin/python -m benchmarks.sim_turn_slo \
        --sessions 1000 --out bench-out/turn-slo [--jobs 2]

The tenants are drawn by `production_agents.py` (every number's source is cited
there; the rest is stated below as assumed):

- `interactive`: coding assistants with a person in the loop (several user turns,
  minutes between them). Its product promises a time per user turn: each turn should
  end within `--turn-factor` x the session's mean turn alone on a worker (assumed,
  3x by default). The agent says so in its `SessionStart` (`turn_deadline_s`),
  as the SDK's `session(turn_deadline_s=...)` does.
- `background`: autonomous agents of the same shape with no person (assumed: one
  turn of `--background-calls` calls, as much work as an interactive session) and
  no deadline; one task in `--background-share` (assumed 1 in 4).

Each load (sessions in flight per worker, closed loop; 8 x H100 with Llama-3-8B
and a host tier of `--host` x the GPU pool by default) runs `--tasks-factor` x that
many tasks per policy. Printed per load: the interactive tenant's share of turns
within their deadline (and the ceiling: the share that would be within it alone on
a worker, which no policy can pass), its p90 turn time, the background tenant's
mean task time, and both tenants' throughput; the share within deadline by the
turn's place in its session (first, second, third, later: where a policy gives up
first turns to serve later ones, or the other way round); then, per policy, the
lowest load at which the interactive tenant falls below 99% of its ceiling.
`<out>/turn_slo.png` plots attainment against load.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from saga_server.bench import Scenario, TenantSpec
from saga_server.bench.metrics import TURN_PLACES, summarize
from saga_server.bench.policies import PEERS, make_policy
from saga_server.bench.runner import _instances
from saga_server.engines.sim import Simulator
from saga_server.engines.sim.results import turn_deadline_s, unloaded_turns_s

from benchmarks.harness.production_agents import ProductionShape, generate
from benchmarks.harness.plots import png
from benchmarks.harness.results import write_json, write_jsonl
from benchmarks.harness.sim import add_run_arguments, listed, run_all

POLICIES = ("apc-lru", "apc-lru-offload", "continuum-ttl", "kvflow", "thunderagent", *PEERS, "saga-no-shape", "saga")


def scenario(traces: dict, workers: int, per_worker: int, tasks_factor: int, host: float, turn_factor: float,
             background_share: float, seed: int) -> Scenario:
    tenants = (TenantSpec("interactive", traces["interactive"], 1.0 - background_share,
                          turn_deadline_factor=turn_factor),
               TenantSpec("background", traces["background"], background_share))
    return Scenario(tenants=tenants, tasks=workers * per_worker * tasks_factor, workers=workers,
                    concurrency=workers * per_worker, host_tier_factor=host, seed=seed)


def ceiling(sc: Scenario) -> float:
    """Share of the interactive tenant's turns within their deadline alone on a worker."""
    cost = sc.cost_model()
    met = total = 0
    for inst in _instances(sc, {}):
        allowed = turn_deadline_s(inst.task, inst.turn_deadline_factor, cost)
        if allowed is None:
            continue
        turns = unloaded_turns_s(inst.task, cost)
        met += sum(t <= allowed for t in turns)
        total += len(turns)
    return met / total if total else float("nan")


def run_one(job: tuple) -> dict:
    traces, workers, per_worker, tasks_factor, host, turn_factor, share, policy, seed = job
    sc = scenario(traces, workers, per_worker, tasks_factor, host, turn_factor, share, seed)
    sim = Simulator(sc.cost_model(), make_policy(policy), _instances(sc, {}), sc.sim_config())
    t0 = time.perf_counter()
    res = sim.run()
    s = summarize(res)
    return {"policy": policy, "per_worker": per_worker, "tasks": len(res.tasks),
            "turn_slo": s["turn_slo"].get("interactive", float("nan")),
            "turn_p90_s": s["turn_p90_s"].get("interactive", float("nan")),
            "turn_slack_used": s["turn_slack_used"].get("interactive", float("nan")),
            "turn_slo_by_place": s["turn_slo_by_place"].get("interactive", []),
            "tct_by_tenant": s["tct_mean_by_tenant_s"], "tasks_per_hour": s["tasks_per_hour"],
            "recompute_share": s["recompute_share"], "wall_s": time.perf_counter() - t0}


def print_tables(rows: list[dict], loads: list[int], policies: list[str], workers: int,
                 ceilings: dict[int, float]) -> None:
    for pw in loads:
        sel = {r["policy"]: r for r in rows if r["per_worker"] == pw}
        print(f"\n## {pw} sessions/worker ({pw * workers} in flight), {next(iter(sel.values()))['tasks']} tasks; "
              f"ceiling {ceilings[pw]:.1%} of turns within deadline")
        print("| policy | interactive turns within deadline | turn p90 s | turn slack used "
              "| background mean task s | tasks/h | recompute share |")
        print("|---" * 7 + "|")
        for p in policies:
            r = sel[p]
            print(f"| {p} | {r['turn_slo']:.1%} | {r['turn_p90_s']:.1f} | {r['turn_slack_used']:.2f} "
                  f"| {r['tct_by_tenant'].get('background', float('nan')):.0f} | {r['tasks_per_hour']:.0f} "
                  f"| {r['recompute_share']:.3f} |")
    print("\n## interactive turns within deadline by their place in the session")
    print("| sessions per worker | policy | " + " | ".join(TURN_PLACES) + " |")
    print("|---" * (2 + len(TURN_PLACES)) + "|")
    for pw in loads:
        for p in policies:
            r = next(r for r in rows if r["per_worker"] == pw and r["policy"] == p)
            print(f"| {pw} | {p} | " + " | ".join(f"{x:.1%}" for x in r["turn_slo_by_place"]) + " |")
    print("\n## lowest load where the interactive tenant falls below 99% of its ceiling")
    for p in policies:
        falls = [r["per_worker"] for r in sorted(rows, key=lambda r: r["per_worker"])
                 if r["policy"] == p and r["turn_slo"] < 0.99 * ceilings[r["per_worker"]]]
        print(f"- {p}: {falls[0] if falls else 'none in the sweep'}")


def plot(rows: list[dict], policies: list[str], ceilings: dict[int, float], path: Path) -> None:
    with png(path, figsize=(6.5, 4.2)) as (_, ax):
        for p in policies:
            pts = sorted((r["per_worker"], r["turn_slo"]) for r in rows if r["policy"] == p)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
        loads = sorted(ceilings)
        ax.plot(loads, [ceilings[x] for x in loads], color="grey", lw=0.8, ls="--", label="alone on a worker")
        ax.set_xscale("log")
        ax.set_xlabel("sessions in flight per worker")
        ax.set_ylabel("interactive user turns within deadline")
        ax.legend(fontsize=8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=1000, help="distinct sessions generated per tenant")
    ap.add_argument("--host", type=float, default=1.0, help="host tier / GPU pool")
    ap.add_argument("--turn-factor", type=float, default=3.0,
                    help="a turn's deadline / the session's mean turn alone on a worker (assumed)")
    ap.add_argument("--background-share", type=float, default=0.25, help="share of tasks with no person (assumed)")
    ap.add_argument("--background-calls", type=float, default=32.0,
                    help="mean LLM calls of a background task, in its one turn (assumed)")
    add_run_arguments(ap, workers=8, loads="4,8,12,16,24,32,96", tasks_factor=2, policies=POLICIES,
                      out="bench-out/turn-slo")
    a = ap.parse_args()
    if not 0.0 < a.background_share < 1.0:
        ap.error("--background-share must be in (0, 1)")
    out = Path(a.out)
    shape = ProductionShape()
    background = replace(shape, turns_mean=1.0, calls_per_turn_mean=a.background_calls)
    traces = {"interactive": str(write_jsonl(out / "interactive.jsonl", generate(a.sessions, a.seed, shape))),
              "background": str(write_jsonl(out / "background.jsonl", generate(a.sessions, a.seed + 1, background)))}
    loads, policies = listed(a.loads, int), listed(a.policies)
    ceilings = {pw: ceiling(scenario(traces, a.workers, pw, a.tasks_factor, a.host, a.turn_factor,
                                     a.background_share, a.seed)) for pw in loads}
    jobs = [(traces, a.workers, pw, a.tasks_factor, a.host, a.turn_factor, a.background_share, p, a.seed)
            for pw in loads for p in policies]
    rows = run_all(jobs, a.jobs, "turn-slo", run_one)
    write_json(out / "turn_slo.json", {"ceilings": ceilings, "rows": rows})
    print_tables(rows, loads, policies, a.workers, ceilings)
    plot(rows, policies, ceilings, out / "turn_slo.png")
    print(f"\nwrote {out / 'turn_slo.json'} and {out / 'turn_slo.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
