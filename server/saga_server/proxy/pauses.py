"""What follows a pause, per workflow: when a quiet session is over.

Two things are learnt from the sessions of each workflow:

- **Idle timeout.** The gaps between an answer and the session's next request
  (tool runs, the agent's own work, a user's reply), the last `samples` of
  them. A session quiet for `margin` x their `quantile` is over; bounded by
  [`floor_s`, `ceiling_s`], and `ceiling_s` until `min_samples` gaps are known.
- **Final answers.** After an answer without tool calls in a session that used
  tools, does the session come back (`resumed`) or go quiet until its idle
  timeout (`quiet`)? `final_is_end` once quiet outweighs resumed (Laplace
  smoothed: the first sessions of a workflow are given their idle timeout).

Memory is bounded: `max_workflows` workflows, least recently seen dropped first.
Not thread-safe: the tracker calls it under its lock.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

__all__ = ["WorkflowPauses"]


@dataclass(slots=True)
class _Workflow:
    gaps: deque[float]
    resumed: int = 0
    quiet: int = 0
    timeout: float | None = None  # cached; None: recompute
    since: int = 0                # gaps added since it was computed


class WorkflowPauses:
    def __init__(self, *, floor_s: float = 30.0, ceiling_s: float = 600.0, quantile: float = 0.99,
                 margin: float = 2.0, min_samples: int = 20, samples: int = 256, max_workflows: int = 1024) -> None:
        if not 0 < floor_s <= ceiling_s or not 0 < quantile <= 1 or margin <= 0 or samples < min_samples:
            raise ValueError("need 0 < floor_s <= ceiling_s, 0 < quantile <= 1, margin > 0, samples >= min_samples")
        self.floor_s, self.ceiling_s = floor_s, ceiling_s
        self.quantile, self.margin = quantile, margin
        self.min_samples, self.samples, self.max_workflows = max(1, min_samples), samples, max_workflows
        self._workflows: OrderedDict[str, _Workflow] = OrderedDict()

    def __len__(self) -> int:
        """Workflows it keeps (at most `max_workflows`)."""
        return len(self._workflows)

    def gap(self, workflow: str, seconds: float) -> None:
        w = self._get(workflow)
        w.gaps.append(max(0.0, seconds))
        w.since += 1
        if w.since >= max(1, len(w.gaps) // 16):  # recomputed ~16 times per window of gaps
            w.timeout = None

    def idle_timeout(self, workflow: str) -> float:
        w = self._workflows.get(workflow)
        if w is None or len(w.gaps) < self.min_samples:
            return self.ceiling_s
        if w.timeout is None:
            ranked = sorted(w.gaps)
            q = ranked[min(len(ranked) - 1, int(self.quantile * len(ranked)))]
            w.timeout, w.since = min(self.ceiling_s, max(self.floor_s, self.margin * q)), 0
        return w.timeout

    def after_final(self, workflow: str, *, resumed: bool) -> None:
        w = self._get(workflow)
        if resumed:
            w.resumed += 1
        else:
            w.quiet += 1

    def final_is_end(self, workflow: str) -> bool:
        w = self._workflows.get(workflow)
        return w is not None and (w.resumed + 1) / (w.resumed + w.quiet + 2) < 0.5

    def learnt(self) -> dict:
        """What it learnt per workflow (gaps, final-answer outcomes), JSON-able, least
        recently seen first; workflows are named by model and a hash of their system
        prompt (`SessionTracker`), never by text."""
        return {"workflows": [{"name": name, "gaps": list(w.gaps), "resumed": w.resumed, "quiet": w.quiet}
                              for name, w in self._workflows.items()]}

    def restore_learnt(self, data: dict) -> None:
        """Replace what was learnt with `data` (from `learnt`); ValueError, nothing changed, if it is not that."""
        items = data.get("workflows") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ValueError("learnt pauses must be an object with a list of workflows")
        restored: OrderedDict[str, _Workflow] = OrderedDict()
        for item in items[-self.max_workflows:]:
            name, w = _workflow_from(item, self.samples)
            restored[name] = w
        self._workflows = restored

    def _get(self, workflow: str) -> _Workflow:
        w = self._workflows.get(workflow)
        if w is None:
            while len(self._workflows) >= self.max_workflows:
                self._workflows.popitem(last=False)
            w = self._workflows[workflow] = _Workflow(deque(maxlen=self.samples))
        else:
            self._workflows.move_to_end(workflow)
        return w


def _workflow_from(item, samples: int) -> tuple[str, _Workflow]:
    """One entry of `learnt()`'s list; ValueError if it is not one."""
    if not isinstance(item, dict):
        raise ValueError("a learnt workflow pause is an object")
    name, gaps, resumed, quiet = item.get("name"), item.get("gaps"), item.get("resumed"), item.get("quiet")
    if not isinstance(name, str) or not isinstance(gaps, list):
        raise ValueError("a learnt workflow pause needs a name and a list of gaps")
    if not all(_is_count(c) for c in (resumed, quiet)) or not all(_is_seconds(g) for g in gaps):
        raise ValueError(f"bad counts or gaps in the learnt pauses of {name[:80]!r}")
    return name, _Workflow(deque((float(g) for g in gaps), maxlen=samples), resumed, quiet)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf
