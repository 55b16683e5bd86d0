"""`saga bench --what-if FILE`: what SAGA would do for a recorded workload.

FILE is a `saga-trace/1` recording of the operator's own agents (`saga proxy
--record`) or any trace. The scenario replays it on the cluster the flags name
(`--gpu`, `--model`, `--workers`) under the three deployments that matter, stock
vLLM (`apc-lru`), vLLM with its CPU tier (`apc-lru-offload`) and SAGA (`saga`),
and sweeps the KV pool and the host tier around the workload's size:

- the load is the recording's own, unless flags say otherwise: as many tasks as
  it holds, each starting when it started then (`started_unix_s`: users arrive
  when they arrive, whatever the deployment), so a burst replays as a burst;
  where a session has no start time, a closed loop at the scenario's default
  concurrency.
  How many were in flight on average (the sessions' summed durations over the
  recorded span, with `duration_s`) sizes the KV sweep;
- the KV pool sweep is in multiples (`KV_FRACTIONS`) of the recorded working set
  per worker: sessions in flight per worker x a session's peak KV (its largest
  prompt plus answer), never below the largest single step; the host tier sweep
  (`HOST_FACTORS`, multiples of the KV pool) keeps the pool the flags give.

`answer` is the short answer printed before the usual report: per deployment the
mean task completion time, hit rate and regeneration share (and, with
`--deadline-factor`, the share of tasks within deadline and the goodput); SAGA's gain over the
best deployable baseline run (`--policies` may add more; `infinite` and `belady`
are bounds, not baselines); and for each sweep SAGA's gain at each point and
where its own task time levels off (`level_off`: the smallest size within
`LEVEL_TOL` of the best the sweep reached, so that more capacity buys SAGA less
than that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from .runner import BenchResult
from .scenario import Scenario
from .workload import TenantSpec, load_trace, nest_subagents

__all__ = ["HOST_FACTORS", "KV_FRACTIONS", "LABELS", "LEVEL_TOL", "RecordedLoad", "WHAT_IF_POLICIES", "answer",
           "level_off", "recorded_load", "what_if_scenario"]

WHAT_IF_POLICIES = ("apc-lru", "apc-lru-offload", "saga")
LABELS = {"apc-lru": "stock vLLM", "apc-lru-offload": "vLLM + CPU tier", "saga": "SAGA"}
KV_FRACTIONS = (0.25, 0.5, 1.0, 2.0)
HOST_FACTORS = (0.0, 0.5, 1.0, 2.0, 4.0)
LEVEL_TOL = 0.05
_REFERENCES = ("infinite", "belady")  # bounds, not deployments: never "the best baseline"


@dataclass(frozen=True, slots=True)
class RecordedLoad:
    tasks: int                 # sessions, a subagent inside its parent's (as the replay runs them)
    llm_calls: int
    concurrency: float | None  # mean sessions in flight; None where the file has no times
    mean_task_s: float | None  # mean recorded task duration; None likewise
    session_kv_tokens: int     # a session's peak KV (largest prompt + answer), mean over tasks
    max_step_tokens: int       # the largest single step: the smallest pool that can run it
    arrivals: bool = False     # every session has its start time: it can replay as it arrived


def recorded_load(raw: Iterable[Mapping[str, Any]]) -> RecordedLoad:
    """The load a trace file recorded (raw task dicts, as `load_trace` returns them)."""
    tasks = list(raw)
    peaks = [max(int(s["prompt_tokens"]) + int(s["output_tokens"]) for s in t["steps"]) for t in tasks]
    spans = [(float(t["started_unix_s"]), float(t["duration_s"])) for t in tasks
             if t.get("started_unix_s") is not None and t.get("duration_s") is not None]
    concurrency = mean_task = None
    if spans:
        mean_task = sum(d for _, d in spans) / len(spans)
        begin, end = min(b for b, _ in spans), max(b + d for b, d in spans)
        busy = sum(d for _, d in spans)
        concurrency = busy / (end - begin) if end > begin else float(len(spans))
    sessions = nest_subagents(tasks)
    return RecordedLoad(len(sessions), sum(len(t["steps"]) for t in tasks), concurrency, mean_task,
                        round(sum(peaks) / len(peaks)), max(peaks),
                        all(t.get("started_unix_s") is not None for t in sessions))


def what_if_scenario(base: Scenario, path: str, *, tasks: bool = True, concurrency: bool = True,
                     policies: bool = True, sweep_kv: bool = True, sweep_host: bool = True,
                     deadline_factor: float | None = None) -> tuple[Scenario, RecordedLoad]:
    """`base` (from the flags) replaying `path`, and the load it recorded. Each
    keyword says whether to fill that part from the recording (False: the flags set it);
    `deadline_factor`: every task's deadline as a multiple of its unloaded time (None: none)."""
    load = recorded_load(load_trace(path))
    changes: dict[str, Any] = {"tenants": (TenantSpec("recorded", path, deadline_factor=deadline_factor),),
                               "name": f"what-if {Path(path).name}"}
    if tasks:
        changes["tasks"] = load.tasks
    if concurrency and load.arrivals and base.rate is None:
        changes["recorded_arrivals"] = True
    if policies:
        changes["policies"] = WHAT_IF_POLICIES
        changes["sweep_policies"] = WHAT_IF_POLICIES
    sc = replace(base, **changes)
    if sweep_kv:
        closed = sc.rate is None and not sc.recorded_arrivals and sc.concurrency
        in_flight = sc.concurrency if closed else load.concurrency or 1
        per_worker = max(1, math.ceil(in_flight / sc.workers)) * load.session_kv_tokens
        block = sc.cost_model().block_tokens  # sweep sizes are whole blocks of the engine modelled
        floor = _blocks(load.max_step_tokens, block)
        sc = replace(sc, sweep_kv=tuple(sorted({max(floor, _blocks(per_worker * f, block)) for f in KV_FRACTIONS})))
    if sweep_host:
        sc = replace(sc, sweep_host=HOST_FACTORS)
    return sc, load


def level_off(points: Iterable[tuple[float, float]], tol: float = LEVEL_TOL) -> float | None:
    """The smallest x whose y (a time: lower is better) is within `tol` of the best y."""
    pts = sorted((x, y) for x, y in points if y is not None and not math.isnan(y))
    if not pts:
        return None
    best = min(y for _, y in pts)
    return next(x for x, y in pts if y <= best * (1 + tol))


def answer(res: BenchResult, load: RecordedLoad, path: str) -> str:
    """The short answer: a few lines of text (see the module docstring)."""
    sc, runs = res.scenario, res.runs
    desc = sc.describe()
    seen = (f", {load.concurrency:.1f} sessions at once on average, mean task time {load.mean_task_s:.1f} s "
            f"as served then" if load.concurrency is not None else "")
    replayed = ("arriving as recorded" if sc.recorded_arrivals else
                f"Poisson {sc.rate:g} tasks/s" if sc.rate is not None else f"{sc.concurrency} at once")
    lines = [f"What would SAGA do for {Path(path).name}?",
             f"  recorded: {load.tasks} tasks, {load.llm_calls} LLM calls{seen}",
             f"  replayed: {sc.tasks} tasks, {replayed}, on {sc.workers} x {sc.gpu} ({sc.model}, TP {desc['tp']}); "
             f"KV pool {desc['kv_capacity_tokens_per_worker']:,} tokens per worker, host tier "
             f"{sc.host_tier_factor:g}x", ""]
    width = max((len(_label(p)) for p in runs), default=10)
    deadlines = any(r.summary["slo"] for r in runs.values())
    lines.append(f"  {'':<{width}}  mean task time  hit rate  regen share"
                 + ("  within deadline  goodput/h" if deadlines else ""))
    for name, run in runs.items():
        s = run.summary
        met = sum(s["slo"].values()) / len(s["slo"]) if s["slo"] else math.nan
        lines.append(f"  {_label(name):<{width}}  {_num(s['tct_mean_s'], '{:>12.1f} s')}  "
                     f"{_num(s['hit_rate'], '{:>8.1%}')}  {_num(s['regen_share'], '{:>11.1%}')}"
                     + (f"  {_num(met, '{:>15.1%}')}  {_num(s['goodput_per_hour'], '{:>9.0f}')}"
                        if deadlines else ""))
    lines.append("")
    baselines = {k: r.summary["tct_mean_s"] for k, r in runs.items()
                 if not k.startswith("saga") and k not in _REFERENCES}
    if "saga" in runs and baselines:
        best = min(baselines, key=baselines.get)
        lines.append(f"  SAGA: {_gain(baselines[best] / runs['saga'].summary['tct_mean_s'])} the best baseline "
                     f"({_label(best)}).")
    if runs and max(r.summary["recompute_share"] for r in runs.values()) < 0.01:
        lines.append("  At this KV pool the workload fits: the deployments differ with less KV per worker "
                     "(below), not with more host tier.")
    for rows, axis, what, at in ((res.kv_sweep, "kv_tokens", "KV pool per worker", "{} tokens per worker"),
                                 (res.host_sweep, "host_tier_factor", "host tier (x pool)",
                                  "a host tier of {}x the KV pool")):
        lines += _sweep_lines(rows, axis, what, at)
    return "\n".join(lines)


def _gain(ratio: float) -> str:
    if abs(ratio - 1) < 0.005:
        return "mean task time about the same as"
    return f"mean task time {ratio:.2f}x {'shorter' if ratio > 1 else 'longer'} than"


def _sweep_lines(rows: list[dict[str, Any]], axis: str, what: str, at: str) -> list[str]:
    """SAGA's time and its gain over each baseline at each point of a sweep, and
    where its time levels off."""
    by: dict[float, dict[str, float]] = {}
    for r in rows:
        by.setdefault(r[axis], {})[r["policy"]] = r["tct_mean_s"]
    saga = [(x, p["saga"]) for x, p in sorted(by.items()) if "saga" in p]
    if not saga:
        return []
    others = [k for k in dict.fromkeys(r["policy"] for r in rows) if k != "saga"]
    head = [f"{what:>18}", "SAGA task time"] + [f"vs {LABELS.get(k, k)}" for k in others]
    out = ["", "  " + "  ".join(head)]
    for x, p in sorted(by.items()):
        if "saga" not in p:
            continue
        cells = [f"{_size(x):>18}", _num(p["saga"], "{:>12.1f} s")]
        cells += [f"{_num(p[k] / p['saga'] if k in p and p['saga'] else math.nan, '{:.2f}x'):>{len(h)}}"
                  for k, h in zip(others, head[2:])]
        out.append("  " + "  ".join(cells))
    out.append(f"  SAGA's task time levels off at {at.format(_size(level_off(saga)))} "
               f"(more buys it under {LEVEL_TOL:.0%}).")
    return out


def _label(policy: str) -> str:
    return f"{LABELS[policy]} ({policy})" if policy in LABELS else policy


def _num(value: float, spec: str) -> str:
    return spec.format(value) if value is not None and not math.isnan(value) else "-"


def _size(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:g}"


def _blocks(tokens: float, block: int) -> int:
    return max(block, math.ceil(tokens / block) * block)
