"""SAGA routing at 64 workers, in the simulator: the 64-worker figure for the policy
that `benchmarks/ray_routing.py` measures on a real (small) Ray Serve cluster.

    .venv/bin/python -m benchmarks.sim_routing \
        [--trace $SAGA_TRACES/swe-mini-dev.jsonl] [--out bench-out/sim-routing]

64 workers of Llama-3-8B on H100-80GB (as `sim_headline.py`), SWE-bench tasks from
the trace, closed loop, two loads:

- `headline`: the load of `sim_headline.py` part 1 (18 sessions per worker, 2,000
  tasks drawn from the whole trace);
- `skewed`: the same concurrency, but every session is a task from the longest fifth
  of the trace (by unloaded time) with probability 0.2, else one from the shortest
  two fifths, so a worker that happens to hold several long ones overloads while
  others drain.

Policies, each once on the same sessions: `apc-lru` (vLLM prefix caching, stock
placement), the session-sticky routers with vLLM's LRU and a host tier, none of which
ever moves a session (`saga_server.engines.sim.peers.sticky_lru`): `hash-lru` (Ray's
`ConsistentHashRouter`), `prefix-lru` (Ray's `PrefixCacheAffinityRouter`: a new
session to the shortest queue) and `sticky-lru` (to the worker whose live sessions hold
the least KV); `saga-no-steal` (SAGA without routing: stock placement, i.e. the worker
with the fewest live sessions, no stealing), `saga` (routing by
`saga_server.core.routing.SessionRouter`: new sessions to the least loaded worker,
one `plan_steal` per simulated second, the KV moved over a 40 GB/s inter-node link
at `CostModel.move_s`: a fixed cost per move, two one-token iterations and the bytes),
`saga-hash` (the same with the Ray router's rendezvous-hash homes) and
`saga-hash-no-steal` (hash homes, no steals: what the hash placement alone does).

Prints one Markdown table (TCT mean and p90, TCT relative to `saga`, steals and how
many were inside a tool call, KV tokens moved, transfer seconds, load imbalance =
max/mean busy time per worker, prefix-hit rate) and the ratios; progress goes to
stderr; `--out` gets the JSON. About 3 minutes on one core.

What it measured is in docs/RESEARCH.md ("SAGA routing in that simulator"): against
session-sticky routers the gain is small, because every worker is saturated and decode
is memory-bound (a few more sequences in a batch barely slow it), so moving work evens
the tail more than the mean.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

from saga_server.bench import Scenario, TenantSpec
from saga_server.bench.traces import trace_path
from saga_server.bench.metrics import summarize
from saga_server.bench.policies import make_policy
from saga_server.bench.workload import build_instances, load_trace, materialize
from saga_server.engines.sim import Simulator, TaskInstance, unloaded_time_s
from saga_server.engines.sim.saga_policy import SIM_ROUTING, SagaPolicy

POLICIES = ("apc-lru", "hash-lru", "prefix-lru", "sticky-lru", "saga-no-steal", "saga", "saga-hash", "saga-hash-no-steal")
COLUMNS = [
    ("TCT mean s", "tct_mean_s", "{:.1f}"),
    ("TCT p90 s", "tct_p90_s", "{:.1f}"),
    ("mean / saga", "tct_over_saga", "{:.3f}"),
    ("p90 / saga", "p90_over_saga", "{:.3f}"),
    ("steals", "steals", "{}"),
    ("in tool", "steals_in_tool", "{}"),
    ("moved tok", "moved_tokens", "{:,}"),
    ("move s", "move_s", "{:.1f}"),
    ("imbalance", "imbalance", "{:.2f}"),
    ("hit rate", "hit_rate", "{:.3f}"),
]


def policy(name: str):
    if name == "saga-hash-no-steal":  # hash homes, steals never planned
        return SagaPolicy(name=name, routing=replace(SIM_ROUTING, new_session="hash", steal_gap=math.inf))
    return make_policy(name)


def skewed_instances(trace: str, n: int, seed: int, cost, p_long: float = 0.2) -> tuple[list, dict]:
    rng = random.Random(seed)
    specs = [materialize(t, rng) for t in load_trace(trace)]
    specs.sort(key=lambda t: unloaded_time_s(t, cost))
    k = len(specs)
    short, long_ = specs[: k * 2 // 5], specs[k * 4 // 5:]
    out = [TaskInstance(f"skew-{i:05d}", rng.choice(long_ if rng.random() < p_long else short), "swe")
           for i in range(n)]
    info = {"short_unloaded_s_max": unloaded_time_s(short[-1], cost),
            "long_unloaded_s_min": unloaded_time_s(long_[0], cost), "p_long": p_long}
    return out, info


def fmt(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return spec.format(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(trace_path("swe-mini-dev.jsonl")))
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--per-worker", type=int, default=18, help="sessions per worker (closed loop)")
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--move-latency-s", type=float, default=None,
                   help="fixed cost per KV move (default: the cost model's; the CPU engine measured 0.26 s)")
    p.add_argument("--out", default="bench-out/sim-routing")
    a = p.parse_args()
    pols = [x for x in a.policies.split(",") if x]

    sc = Scenario(name="routing", tenants=(TenantSpec("swe", a.trace),), tasks=a.tasks, workers=a.workers,
                  concurrency=a.workers * a.per_worker, seed=a.seed)
    cost, cfg = sc.cost_model(), sc.sim_config()
    if a.move_latency_s is not None:
        cost = replace(cost, move_latency_s=a.move_latency_s)
    loads = {"headline": build_instances(sc.tenants, a.tasks, seed=a.seed)}
    loads["skewed"], skew_info = skewed_instances(a.trace, a.tasks, a.seed, cost)

    print(f"## SAGA routing on {a.workers} x {sc.gpu} + {sc.model}: {a.tasks} SWE tasks per load, "
          f"{a.per_worker} sessions/worker (closed loop), seed {a.seed}")
    print(f"skewed: p(long) {skew_info['p_long']}, long tasks >= {skew_info['long_unloaded_s_min']:.0f} s "
          f"unloaded, short <= {skew_info['short_unloaded_s_max']:.0f} s; inter-node link "
          f"{cost.gpu.net_bw / 1e9:.0f} GB/s + {cost.move_latency_s * 1e3:g} ms per move, "
          f"steal period {cfg.steal_period_s:g} s")
    t_all = time.perf_counter()
    results: dict[str, dict[str, dict]] = {}
    for load, insts in loads.items():
        results[load] = {}
        for name in pols:
            t0 = time.perf_counter()
            res = Simulator(cost, policy(name), insts, cfg).run()
            s = summarize(res)
            s["wall_s"] = time.perf_counter() - t0
            s["move_s"] = res.move_s
            results[load][name] = s
            print(f"[sim_routing] {load:8s} {name:18s} TCT {s['tct_mean_s']:7.1f} s  steals {s['steals']:5d}  "
                  f"{s['wall_s']:5.1f} s wall", file=sys.stderr, flush=True)
        ref = results[load].get("saga")
        for s in results[load].values():
            s["tct_over_saga"] = s["tct_mean_s"] / ref["tct_mean_s"] if ref else math.nan
            s["p90_over_saga"] = s["tct_p90_s"] / ref["tct_p90_s"] if ref else math.nan

    head = "| load | policy | " + " | ".join(c[0] for c in COLUMNS) + " |"
    rows = [head, "|" + "---|" * (2 + len(COLUMNS))]
    for load, runs in results.items():
        for name, s in runs.items():
            rows.append(f"| {load} | {name} | " + " | ".join(fmt(s.get(k), spec) for _, k, spec in COLUMNS) + " |")
    print()
    print("\n".join(rows))

    print("\n## Ratios (mean TCT / saga's, same run)")
    for load, runs in results.items():
        if "saga" not in runs:
            continue
        parts = [f"{n} {runs[n]['tct_over_saga']:.3f}" for n in pols if n != "saga" and n in runs]
        print(f"{load}: " + ", ".join(parts))
    print(f"\ntotal wall {time.perf_counter() - t_all:.0f} s")

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_routing.json").write_text(json.dumps(
        {"args": vars(a), "skewed": skew_info, "results": results}, indent=2, default=str))
    print(f"wrote {out / 'sim_routing.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
