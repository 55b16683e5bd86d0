"""Reported metrics, computed from one run's `SimResult`.

- `tct_*`: task completion time (arrival of the task to the end of its last call), s.
- `regen_share`: GPU time spent regenerating KV that had been computed before and was
  evicted (compute time of recomputed prompt tokens) over worker busy time.
- `mem_util`: time average of useful KV (running requests + cached prefixes of live
  sessions, pinned or not; ended sessions' leftovers excluded) over the pool.
- Closed-loop runs measure `mem_util` and throughput over the *saturated window*
  (until the last task started: every slot busy), so the draining tail does not
  dilute them; open-loop (Poisson) runs use the whole run.
- `hit_rate`: reusable prompt tokens served from KV (GPU or host tier) over reusable
  prompt tokens; `gpu_hit_rate`: from GPU alone.
- `recompute_share`: reusable prompt tokens that were recomputed.
- `slo_<tenant>`: share of the tenant's tasks that finished within their deadline.
- `goodput_per_hour`: tasks finished within their deadline (a task without one
  counts) per hour: `tasks_per_hour` times that share.
- `slack_used_<tenant>`: mean of completion time over deadline (above 1: missed).
- `user_turn_mean_s`, `user_turn_p50_s`, `user_turn_p90_s`, `user_turn_p99_s`: over every
  user turn of every task (`core.turns`; with a turn deadline or not), from the task's
  start or the person's answer to the next hand-back: what a person in the loop waits
  on, where `tct_*` also counts the person's own waits. A task with no person in it
  is one turn, its whole time.
- `turn_slo_<tenant>`: share of the tenant's user turns (`core.turns`) that ended
  within their turn deadline, over the tasks that had one; `turn_p90_s_<tenant>`:
  the p90 of their turns' times; `turn_slack_used_<tenant>`: mean turn time over
  turn deadline; `turn_slo_by_place_<tenant>`: that share for its sessions' first,
  second and third turns and for the rest (`TURN_PLACES`; nan where none ran).
- `tasks_per_hour`, `tokens_per_s`: completed tasks and (prompt + output) tokens per
  unit of time.
- `belady_ratio`: recomputed tokens under the policy / under `belady` in the same run.
- `steals`: sessions the router moved (`steals_in_tool`: chosen inside a tool call);
  `moved_tokens`: KV tokens carried to the target and inserted there
  (`move_dropped_tokens`: sent but no room, recomputed); `move_s`: inter-node
  transfer time summed over moves.
- `imbalance`: max over mean of per-worker busy time (1.0 = perfectly even).
- `running_kv`: mean KV held by running requests over the (finite) pool, sampled while
  every closed-loop slot is busy; above 1 only the unbounded `infinite` can be.
- `parked`, `admission_waits`: sessions parked, and requests that waited for admission.
- `miss_split`: per tenant, over its tasks that missed their deadline, the mean
  seconds of each category of `SPLIT` (where a task's time went; `other`: waiting
  for its subagents), the mean completion time and deadline, and how many missed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping

from saga_server.engines.sim import SimResult
from saga_server.engines.sim.results import SPLIT

__all__ = ["summarize", "percentile", "add_ratios", "imbalance", "miss_split", "TURN_PLACES"]

# A turn's place in its session, as `turn_slo_by_place` buckets it: the last takes the rest.
TURN_PLACES = ("first", "second", "third", "later")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = max(0, min(len(xs) - 1, math.ceil(q / 100.0 * len(xs)) - 1))
    return xs[k]


def imbalance(busy: list[float]) -> float:
    """Max over mean of per-worker busy time; nan without workers or work."""
    mean = sum(busy) / len(busy) if busy else 0.0
    return max(busy) / mean if mean > 0 else math.nan


def miss_split(res: SimResult) -> dict[str, dict[str, float]]:
    """Per tenant, where its missed tasks' time went (module doc: `miss_split`)."""
    missed: dict[str, list] = defaultdict(list)
    for t in res.tasks:
        if not t.met_deadline and t.split:
            missed[t.tenant].append(t)
    out = {}
    for tenant, tasks in sorted(missed.items()):
        n = len(tasks)
        row = {cat: sum(t.split[i] for t in tasks) / n for i, cat in enumerate(SPLIT)}
        row["other"] = sum(t.tct_s - sum(t.split) for t in tasks) / n
        row.update(tct_s=sum(t.tct_s for t in tasks) / n, deadline_s=sum(t.deadline_s for t in tasks) / n,
                   missed=n)
        out[tenant] = row
    return out


def summarize(res: SimResult) -> dict[str, Any]:
    tct = [t.tct_s for t in res.tasks]
    if res.saturated_s > 0:
        span, done, tokens = res.saturated_s, res.saturated_tasks, res.saturated_tokens
        useful, cap = res.saturated_useful_block_s, res.capacity_block_s * res.saturated_s / res.makespan_s
    else:
        span, done = res.makespan_s or math.nan, len(res.tasks)
        tokens = res.prompt_tokens + res.output_tokens
        useful, cap = res.useful_block_s, res.capacity_block_s
    out: dict[str, Any] = {
        "policy": res.policy,
        "tasks": len(res.tasks),
        "llm_calls": res.llm_calls,
        "tct_mean_s": sum(tct) / len(tct) if tct else math.nan,
        "tct_p50_s": percentile(tct, 50),
        "tct_p90_s": percentile(tct, 90),
        "tct_p99_s": percentile(tct, 99),
        "makespan_s": res.makespan_s,
        "regen_share": res.regen_gpu_s / res.busy_gpu_s if res.busy_gpu_s else 0.0,
        "mem_util": useful / cap if cap and not res.unbounded else math.nan,
        "hit_rate": (res.hit_tokens + res.loaded_tokens) / res.reusable_tokens if res.reusable_tokens else math.nan,
        "gpu_hit_rate": res.hit_tokens / res.reusable_tokens if res.reusable_tokens else math.nan,
        "recompute_share": res.recomputed_tokens / res.reusable_tokens if res.reusable_tokens else math.nan,
        "recomputed_tokens": res.recomputed_tokens,
        "loaded_tokens": res.loaded_tokens,
        "prefetched_tokens": res.prefetched_tokens,
        "disk_loaded_tokens": res.disk_loaded_tokens,
        "tasks_per_hour": done / span * 3600.0,
        "tokens_per_s": tokens / span,
        "steals": res.steals,
        "steals_in_tool": res.steals_in_tool,
        "moved_tokens": res.moved_tokens,
        "move_dropped_tokens": res.move_dropped_tokens,
        "move_s": res.move_s,
        "imbalance": imbalance(res.worker_busy_s),
        "running_kv": (sum(res.running_kv_samples) / len(res.running_kv_samples)
                       if res.running_kv_samples else math.nan),
        "parked": res.parked,
        "admission_waits": res.admitted_after_wait,
        "human_waits": res.human_waits,
        "compactions": res.compactions,
        # The hosted API's own hit rate on the trace, to set beside `hit_rate` (nan: not recorded).
        "provider_cached_share": (res.provider_cached_tokens / res.provider_known_prompt_tokens
                                  if res.provider_known_prompt_tokens else math.nan),
    }
    by_tenant: dict[str, list] = defaultdict(list)
    for t in res.tasks:
        if t.deadline_s is not None:
            by_tenant[t.tenant].append(t.met_deadline)
    out["slo"] = {k: sum(v) / len(v) for k, v in sorted(by_tenant.items())}
    met = sum(t.met_deadline for t in res.tasks)
    out["goodput_per_hour"] = out["tasks_per_hour"] * met / len(res.tasks) if res.tasks else math.nan
    used: dict[str, list] = defaultdict(list)
    for t in res.tasks:
        if t.deadline_s:
            used[t.tenant].append(t.tct_s / t.deadline_s)
    out["slack_used"] = {k: sum(v) / len(v) for k, v in sorted(used.items())}
    tct_by_tenant: dict[str, list] = defaultdict(list)
    for t in res.tasks:
        tct_by_tenant[t.tenant].append(t.tct_s)
    out["tct_mean_by_tenant_s"] = {k: sum(v) / len(v) for k, v in sorted(tct_by_tenant.items())}
    every_turn = [span for t in res.tasks for span in t.turn_spans]
    out["user_turn_mean_s"] = sum(every_turn) / len(every_turn) if every_turn else math.nan
    for q in (50, 90, 99):
        out[f"user_turn_p{q}_s"] = percentile(every_turn, q)
    turns: dict[str, list[float]] = defaultdict(list)  # tenant -> turn time over turn deadline
    spans: dict[str, list[float]] = defaultdict(list)
    by_place: dict[str, list[list[bool]]] = defaultdict(lambda: [[] for _ in TURN_PLACES])
    for t in res.tasks:
        if t.turn_deadline_s:
            turns[t.tenant].extend(span / t.turn_deadline_s for span in t.turn_spans)
            spans[t.tenant].extend(t.turn_spans)
            for i, span in enumerate(t.turn_spans):
                by_place[t.tenant][min(i, len(TURN_PLACES) - 1)].append(span <= t.turn_deadline_s)
    out["turn_slo"] = {k: sum(u <= 1.0 for u in v) / len(v) for k, v in sorted(turns.items()) if v}
    out["turn_slack_used"] = {k: sum(v) / len(v) for k, v in sorted(turns.items()) if v}
    out["turn_p90_s"] = {k: percentile(v, 90) for k, v in sorted(spans.items()) if v}
    out["turn_slo_by_place"] = {k: [sum(met) / len(met) if met else math.nan for met in places]
                                for k, places in sorted(by_place.items())}
    out["miss_split"] = miss_split(res)
    return out


def add_ratios(summaries: Mapping[str, dict[str, Any]]) -> None:
    """Add the Belady ratio and TCT relative to `saga` where both are in the run."""
    bel = summaries.get("belady")
    saga = summaries.get("saga")
    for s in summaries.values():
        if bel is not None:
            b = bel["recomputed_tokens"]
            s["belady_ratio"] = s["recomputed_tokens"] / b if b else (math.nan if s["recomputed_tokens"] else 1.0)
        if saga is not None and saga["tct_mean_s"]:
            s["tct_over_saga"] = s["tct_mean_s"] / saga["tct_mean_s"]
