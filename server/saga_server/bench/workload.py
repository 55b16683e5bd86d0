"""Workloads from `saga-trace/1` files: tasks, tenants, arrivals, deadlines.

- A trace task becomes a `TaskSpec`: its steps' prompt/output tokens, the prefix
  reused from the previous step, and the tools run after each step.
- Tool durations come from the trace. Where the trace has none (tau-bench), they are
  drawn per replayed task from a log-normal *fallback* for the tool's category
  (median, sigma); a step with no tool before the next step (a user's turn) waits its
  `idle_s` where the trace has one (recordings, `saga_server.record`), else a draw
  from the `user` fallback. A step with `human_idle_s` hands the turn back to a
  person: the next step is a new user turn after that many seconds (minutes, with a
  tail of hours), which the simulator tells apart from a tool's wait.
- A step marked `compaction` restarts its prompt from a short prefix (its
  `reused_prefix_tokens`): the session's KV past that prefix is garbage from then on.
- `provider_cached_tokens` (what the hosted API served from its cache) is carried
  along for comparison with the replay's own hit rate.
- A last line without its newline (a recorder that died mid-line) is skipped; any
  other line that is not a `saga-trace/1` task is an error.
- A replayed task is a distinct session: tasks are drawn from the trace in seeded
  shuffled rounds (each task once per round), so >= 1,000 sessions can come from 99
  tasks.
- Tenants mix traces by weight; each tenant has a deadline multiple of a task's
  unloaded time (alone on a worker with a perfect cache).
- Arrivals: Poisson at `rate_per_s` tasks per second; as recorded (one tenant: each
  task starts when it started in the trace, `started_unix_s`, the trace's tasks in
  that order, the whole recording again after its span where more tasks are asked);
  or closed-loop at a fixed concurrency (the simulator starts a task whenever one ends).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from saga_server.engines.sim import StepSpec, TaskInstance, TaskSpec, ToolSpec

__all__ = ["FALLBACK_DURATIONS", "TenantSpec", "build_instances", "load_trace", "materialize", "nest_subagents"]

# category -> (median seconds, log-normal sigma). `api` and `user` fit tau-bench
# (fast JSON APIs; a simulated user writing a reply); the rest mirror the medians of
# the SWE-bench traces, used only where a duration is missing.
FALLBACK_DURATIONS: dict[str, tuple[float, float]] = {
    "api": (0.3, 0.6),
    "user": (3.0, 0.6),
    "search": (0.22, 0.4),
    "read": (0.21, 0.4),
    "edit": (0.25, 0.5),
    "run": (0.34, 1.0),
    "test": (0.48, 1.5),
    "install": (4.3, 1.2),
    "git": (0.23, 0.4),
    "submit": (0.3, 0.5),
    "other": (0.24, 0.5),
}


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    trace: str
    weight: float = 1.0
    deadline_factor: float | None = None  # each task's deadline / its unloaded time
    turn_deadline_factor: float | None = None  # each user turn's deadline / the task's mean unloaded turn


def load_trace(path: str | Path) -> list[dict[str, Any]]:
    """Raw task dicts of a `saga-trace/1` file (one task per line)."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                t = json.loads(line)
            except ValueError:
                if not line.endswith("\n") and not f.read(1):
                    break  # the line in flight when a recorder stopped
                raise
            if t.get("format") != "saga-trace/1":
                raise ValueError(f"{path}:{n}: not a saga-trace/1 task")
            if t["steps"]:
                tasks.append(t)
    if not tasks:
        raise ValueError(f"{path}: no tasks")
    return tasks


def nest_subagents(tasks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tasks with each recorded subagent (`parent_session_id`, `parent_step`) put
    under the step of its parent that spawned it (`spawns`), so that a tree replays
    as one task; a child whose parent is not in the list, or was spawned by the
    parent's last step, stays a task of its own. The input is not changed."""
    out = [dict(t, steps=[dict(st) for st in t["steps"]]) for t in tasks]
    by_id: dict[str, dict[str, Any]] = {}
    for t in out:
        by_id.setdefault(str(t.get("task_id", "")), t)
    roots = []
    for t in out:
        parent = by_id.get(str(t.get("parent_session_id") or "")) if t.get("parent_session_id") else None
        k = t.get("parent_step")
        if parent is not None and parent is not t and isinstance(k, int) and 0 <= k < len(parent["steps"]) - 1:
            parent["steps"][k].setdefault("spawns", []).append(t)
        else:
            roots.append(t)
    return roots


def _draw(category: str, rng: random.Random, fallback: Mapping[str, tuple[float, float]]) -> float:
    median, sigma = fallback.get(category, fallback.get("other", (0.3, 0.5)))
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def materialize(raw: Mapping[str, Any], rng: random.Random,
                fallback: Mapping[str, tuple[float, float]] = FALLBACK_DURATIONS) -> TaskSpec:
    """A `TaskSpec` from a raw trace task, drawing missing durations from `rng`."""
    steps = []
    raw_steps = raw["steps"]
    for i, st in enumerate(raw_steps):
        tools = []
        for tool in st.get("tools") or ():
            d = tool.get("duration_s")
            cat = tool.get("category") or "other"
            if d is None:
                tools.append(ToolSpec(tool["name"], cat, _draw(cat, rng, fallback), False))
            else:
                tools.append(ToolSpec(tool["name"], cat, float(d)))
        idle, human = 0.0, False
        if not tools and i + 1 < len(raw_steps):
            if st.get("human_idle_s") is not None:
                idle, human = _seconds(st["human_idle_s"], "human_idle_s"), True
            else:
                idle = float(st["idle_s"]) if st.get("idle_s") is not None else _draw("user", rng, fallback)
        prompt = int(st["prompt_tokens"])
        cached = st.get("provider_cached_tokens")
        steps.append(StepSpec(prompt, max(int(st["output_tokens"]), 1),
                              min(int(st.get("reused_prefix_tokens") or 0), prompt),
                              tuple(tools), idle,
                              tuple(materialize(child, rng, fallback) for child in st.get("spawns") or ()),
                              human=human, compaction=bool(st.get("compaction")) and i > 0,
                              cached_tokens=None if cached is None else min(int(cached), prompt)))
    return TaskSpec(str(raw.get("task_id", "")), str(raw.get("run", "")),
                    int(raw.get("shared_prefix_tokens") or 0), tuple(steps))


def _seconds(value: Any, field: str) -> float:
    d = float(value)
    if not d >= 0.0 or d == math.inf:
        raise ValueError(f"{field} must be a finite number of seconds >= 0, got {value!r}")
    return d


def build_instances(tenants: Sequence[TenantSpec], n_tasks: int, seed: int = 0,
                    rate_per_s: float | None = None,
                    fallback: Mapping[str, tuple[float, float]] = FALLBACK_DURATIONS,
                    traces: dict[str, list] | None = None,
                    recorded_arrivals: bool = False) -> list[TaskInstance]:
    """`n_tasks` sessions: tenant by weight, task in shuffled rounds, seeded; with
    `rate_per_s`, Poisson arrival times; with `recorded_arrivals`, the trace's own
    (see the module docstring); else none (closed loop)."""
    rng = random.Random(seed)
    traces = {} if traces is None else traces
    pools: dict[str, list] = {}
    for t in tenants:
        if t.trace not in traces:
            traces[t.trace] = nest_subagents(load_trace(t.trace))
        pools[t.name] = []
    if recorded_arrivals:
        return _as_recorded(tenants, n_tasks, rng, fallback, traces)
    weights = [t.weight for t in tenants]
    out = []
    now = 0.0
    for k in range(n_tasks):
        ten = tenants[0] if len(tenants) == 1 else rng.choices(tenants, weights)[0]
        pool = pools[ten.name]
        if not pool:
            pool.extend(range(len(traces[ten.trace])))
            rng.shuffle(pool)
        raw = traces[ten.trace][pool.pop()]
        spec = materialize(raw, rng, fallback)
        arrival = None
        if rate_per_s is not None:
            now += rng.expovariate(rate_per_s)
            arrival = now
        out.append(TaskInstance(f"{ten.name}-{k:05d}", spec, ten.name, arrival, ten.deadline_factor,
                                turn_deadline_factor=ten.turn_deadline_factor))
    return out


def _as_recorded(tenants: Sequence[TenantSpec], n_tasks: int, rng: random.Random,
                 fallback: Mapping[str, tuple[float, float]], traces: dict[str, list]) -> list[TaskInstance]:
    """`n_tasks` sessions arriving as the one tenant's trace recorded them."""
    if len(tenants) != 1:
        raise ValueError(f"recorded arrivals replay one trace; the scenario has {len(tenants)} tenants")
    ten = tenants[0]
    tasks = traces[ten.trace]
    untimed = [str(t.get("task_id", "")) for t in tasks if t.get("started_unix_s") is None]
    if untimed or not tasks:
        raise ValueError(f"recorded arrivals need every task's started_unix_s; {ten.trace} has "
                         f"{len(untimed) if tasks else 'no'} tasks without it (e.g. {untimed[:3]}): "
                         f"replay it closed loop or at a Poisson rate")
    tasks = sorted(tasks, key=lambda t: _seconds(t["started_unix_s"], "started_unix_s"))
    starts = [float(t["started_unix_s"]) for t in tasks]
    first, last = starts[0], starts[-1]
    end = max(s + _seconds(t.get("duration_s") or 0.0, "duration_s") for s, t in zip(starts, tasks))
    gap = (last - first) / (len(tasks) - 1) if len(tasks) > 1 else 0.0
    span = max(end - first, last - first + gap)  # a repeat never starts with the last session
    out = []
    for k in range(n_tasks):
        arrival = starts[k % len(tasks)] - first + (k // len(tasks)) * span
        out.append(TaskInstance(f"{ten.name}-{k:05d}", materialize(tasks[k % len(tasks)], rng, fallback), ten.name,
                                arrival, ten.deadline_factor, turn_deadline_factor=ten.turn_deadline_factor))
    return out
