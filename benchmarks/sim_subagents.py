"""Subagents in the simulator: parents that wait on their children, where KV is scarce.

    .venv/bin/python -m benchmarks.sim_subagents \\
        --trace $SAGA_TRACES/swe-mini-dev.jsonl [--loads 12,18,24] [--json out.json]

A workload shaped like a coding agent that delegates (the shape is this script's, the
steps are the trace's): each task is a root session of `--steps` steps of a trace
task; at `--spawn-at` steps the root calls a `Task` tool that starts `--children`
subagents in parallel, each the first `--child-steps` steps of another trace task
(sharing the root's system prompt, as subagents share their parent's), and the root
goes on only when they have all returned. A closed loop of `--workers` x load trees
(Llama-3-8B on H100 by default, host tier `--host` x the pool), `--tasks-factor` x
that many trees.

Policies side by side in one run: `saga` (children name their parent: the tree is one
task, the parent waits on its children), `saga-no-trees` (the same SAGA told nothing
of parents: every child an unrelated session; the parent is in a long `Task` tool
call, as an agent's hints alone would say), and the strongest other policies. Printed
per load: mean and p90 time of whole trees, and of the parents' KV at the first
request after their children returned, how much had to be recomputed.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace
from pathlib import Path

from saga_server.bench import Scenario, TenantSpec
from saga_server.bench.metrics import summarize
from saga_server.bench.policies import make_policy
from saga_server.bench.traces import trace_path
from saga_server.bench.workload import load_trace, materialize
from saga_server.engines.sim import Simulator
from saga_server.engines.sim.tasks import TaskInstance, TaskSpec, ToolSpec

from benchmarks.harness.results import command_line, write_json
from benchmarks.harness.sim import add_run_arguments, listed, run_all

POLICIES = ("apc-lru-offload", "kvflow", "saga-no-trees", "saga")
TASK_TOOL = ToolSpec("Task", "subagent", 0.5)  # the call that starts the subagents; it returns with them


def trees(trace: str, n: int, steps: int, spawn_at: tuple[int, ...], children: int, child_steps: int,
          seed: int) -> list[TaskSpec]:
    """`n` root tasks, each spawning `children` subagents at the steps `spawn_at`."""
    rng = random.Random(seed)
    base = [t for t in (materialize(raw, rng) for raw in load_trace(trace)) if len(t.steps) > max(spawn_at) + 1]
    if not base:
        raise SystemExit(f"no task in {trace} has more than {max(spawn_at) + 1} steps")
    out = []
    for i in range(n):
        root = base[i % len(base)]
        kids_of = {}
        for at in spawn_at:
            kids = []
            for c in range(children):
                donor = rng.choice(base)
                kid_steps = donor.steps[:child_steps]
                kids.append(TaskSpec(f"{root.task_id}/{i}.{at}.{c}", root.run, root.shared_prefix_tokens,
                                     kid_steps[:-1] + (replace(kid_steps[-1], tools=()),)))
            kids_of[at] = tuple(kids)
        spec = [replace(st, tools=(TASK_TOOL,), spawns=kids_of[k]) if k in kids_of else st
                for k, st in enumerate(root.steps[:steps])]
        spec[-1] = replace(spec[-1], tools=(), spawns=())
        out.append(TaskSpec(f"{root.task_id}/{i}", root.run, root.shared_prefix_tokens, tuple(spec)))
    return out


def run_one(job: tuple) -> dict:
    a, load, policy = job
    workers = a.workers
    sc = Scenario(tenants=(TenantSpec("swe", a.trace),), tasks=workers * load * a.tasks_factor, workers=workers,
                  concurrency=workers * load, host_tier_factor=a.host, seed=a.seed)
    specs = trees(a.trace, sc.tasks, a.steps, tuple(int(x) for x in a.spawn_at.split(",")), a.children,
                  a.child_steps, a.seed)
    instances = [TaskInstance(f"t{i}", spec, "swe") for i, spec in enumerate(specs)]
    sim = Simulator(sc.cost_model(), make_policy(policy), instances, sc.sim_config())
    t0 = time.perf_counter()
    res = sim.run()
    s = summarize(res)
    back = res.after_children_reusable_tokens
    return {"policy": policy, "load": load, "trees": len(res.tasks), "subagents": res.subagents,
            "tct_mean_s": s["tct_mean_s"], "tct_p90_s": s["tct_p90_s"], "hit_rate": s["hit_rate"],
            "recompute_share": s["recompute_share"],
            "parent_recomputed_after_children": res.after_children_recomputed_tokens / back if back else 0.0,
            "wall_s": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(trace_path("swe-mini-dev.jsonl")))
    ap.add_argument("--steps", type=int, default=10, help="root steps")
    ap.add_argument("--spawn-at", default="2,6", help="root steps that start subagents")
    ap.add_argument("--children", type=int, default=2)
    ap.add_argument("--child-steps", type=int, default=5)
    ap.add_argument("--host", type=float, default=1.0, help="host tier / GPU pool")
    add_run_arguments(ap, workers=8, loads="12,18,24", tasks_factor=4, policies=POLICIES, out=None,
                      loads_help="trees in flight per worker")
    ap.add_argument("--json", type=Path, help="write the rows here")
    a = ap.parse_args()
    jobs = [(a, load, p) for load in listed(a.loads, int) for p in listed(a.policies)]
    rows = run_all(jobs, a.jobs, "subagents", run_one)
    print(f"{'load':>5} {'policy':16} {'trees':>6} {'subagents':>9} {'mean s':>8} {'p90 s':>8} {'hit':>6} "
          f"{'parent KV recomputed after children':>36}")
    for r in rows:
        print(f"{r['load']:>5} {r['policy']:16} {r['trees']:>6} {r['subagents']:>9} {r['tct_mean_s']:>8.1f} "
              f"{r['tct_p90_s']:>8.1f} {r['hit_rate']:>6.3f} {r['parent_recomputed_after_children']:>36.1%}")
    for load in dict.fromkeys(r["load"] for r in rows):
        by = {r["policy"]: r for r in rows if r["load"] == load}
        if "saga" in by:
            others = [p for p in by if p != "saga"]
            print(f"load {load}: " + ", ".join(
                f"{p}/saga mean {by[p]['tct_mean_s'] / by['saga']['tct_mean_s']:.2f}x "
                f"p90 {by[p]['tct_p90_s'] / by['saga']['tct_p90_s']:.2f}x" for p in others))
    if a.json:
        write_json(a.json, {"command": command_line(), "rows": rows})
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
