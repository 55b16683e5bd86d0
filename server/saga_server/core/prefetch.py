"""Prefetch planning: bring back evicted/offloaded KV so it is ready when the tool ends.

For each candidate (KV of a session that is not on the fast tier):
- skip unless P(session calls again) >= `p_min` and its resume time is finite;
- ready_by = now + Q_rem(`q_ready`), a *low* quantile of the remaining tool time
  (being early costs capacity for a moment; being late costs the whole load);
- start_at = max(now, ready_by - load_time_s - margin_s);
- skip if start_at is beyond `horizon_s` (re-plan later: the prediction sharpens);
- then, by start_at (ties: higher p first, then id), admit while the summed
  kv_tokens fit in `free_tokens`.
The engine executes the plan: "load" copies from the slower tier, "recompute"
is a speculative re-prefill of the prompt prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

__all__ = ["PrefetchConfig", "PrefetchCandidate", "PrefetchAction", "plan_prefetch"]


@dataclass(frozen=True, slots=True)
class PrefetchCandidate:
    session_id: str
    kv_tokens: int
    load_time_s: float
    source: str = "tier"  # "tier" (load from a slower tier) or "recompute" (re-prefill)


@dataclass(frozen=True, slots=True)
class PrefetchAction:
    session_id: str
    start_at: float
    kv_tokens: int
    kind: str = "load"  # "load" or "recompute"
    ready_by: float = 0.0
    p_reuse: float = 0.0


@dataclass(frozen=True, slots=True)
class PrefetchConfig:
    p_min: float = 0.5
    q_ready: float = 0.25
    margin_s: float = 0.05
    horizon_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_min <= 1.0 or not 0.0 < self.q_ready < 1.0:
            raise ValueError("p_min in [0, 1] and q_ready in (0, 1) required")
        if self.margin_s < 0 or self.horizon_s < 0:
            raise ValueError("margin_s and horizon_s must be >= 0")


def plan_prefetch(candidates: Sequence[PrefetchCandidate], free_tokens: int, now: float,
                  estimate: Callable[[str, float], tuple[float, float]],
                  cfg: PrefetchConfig) -> list[PrefetchAction]:
    """`estimate(session_id, q)` -> (p_continue, q-quantile of seconds to resume)."""
    if free_tokens < 0:
        raise ValueError(f"free_tokens must be >= 0, got {free_tokens!r}")
    staged = []
    for c in candidates:
        if c.kv_tokens < 0 or not c.load_time_s >= 0.0:
            raise ValueError(f"bad prefetch candidate {c!r}: kv_tokens and load_time_s must be >= 0")
        if c.source not in ("tier", "recompute"):
            raise ValueError(f"bad prefetch source {c.source!r}: 'tier' or 'recompute'")
        p, rem = estimate(c.session_id, cfg.q_ready)
        if p < cfg.p_min or rem == math.inf or rem != rem:
            continue
        ready_by = now + max(rem, 0.0)
        start = max(now, ready_by - c.load_time_s - cfg.margin_s)
        if start - now > cfg.horizon_s:
            continue
        staged.append((start, -p, c.session_id, c, ready_by, p))
    staged.sort(key=lambda s: s[:3])
    plan, used = [], 0
    for start, _, sid, c, ready_by, p in staged:
        if used + c.kv_tokens > free_tokens:
            continue
        used += c.kv_tokens
        kind = "load" if c.source == "tier" else "recompute"
        plan.append(PrefetchAction(sid, start, c.kv_tokens, kind, ready_by, p))
    return plan
