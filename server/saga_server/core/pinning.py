"""Tool-aware TTL pinning: whether to hold a session's KV while its tool runs.

Decision (`decide_pin`), in order:
1. session ended, or P(another call) < `p_min`         -> no pin ("ended", "unlikely_reuse")
2. kv_tokens < `min_tokens` (cheap to recompute)        -> no pin ("cheap")
3. memory_pressure >= `pressure_cutoff`                 -> no pin ("pressure")
4. otherwise pin for TTL = (1 - pressure) * Q_rem(q), capped at `max_ttl_s`, where
   Q_rem(q) is the q-quantile of the tool's *remaining* duration (given the time
   it already ran) and q slides from `q_high` (no pressure) to `q_low` (full
   pressure). A TTL of zero means no pin ("tool_done").

Budget invariant (`PinBudget`), the one that keeps pins from starving running
work: pinned tokens never exceed `max_fraction * capacity_tokens` (a pin that
would cross it is refused), every pin has an expiry, and `reclaim(need, free)`
releases pins, least valuable first, until `free + released >= need` or no pins
are left. So running work always has `(1 - max_fraction) * capacity` tokens
outside pins and gets the whole capacity back on demand (forward progress).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Iterable

__all__ = ["PinConfig", "PinDecision", "decide_pin", "PinBudget"]


@dataclass(frozen=True, slots=True)
class PinDecision:
    pin: bool
    ttl_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class PinConfig:
    q_high: float = 0.95
    q_low: float = 0.5
    p_min: float = 0.3
    min_tokens: int = 256
    max_ttl_s: float = 300.0
    pressure_cutoff: float = 0.95

    def __post_init__(self) -> None:
        if not 0.0 < self.q_low <= self.q_high < 1.0:
            raise ValueError("need 0 < q_low <= q_high < 1")
        if not 0.0 <= self.p_min <= 1.0 or not 0.0 < self.pressure_cutoff <= 1.0:
            raise ValueError("p_min in [0, 1] and pressure_cutoff in (0, 1] required")
        if self.max_ttl_s <= 0 or self.min_tokens < 0:
            raise ValueError("max_ttl_s > 0 and min_tokens >= 0 required")


def decide_pin(p_continue: float, remaining_quantile: Callable[[float], float], kv_tokens: int,
               memory_pressure: float, cfg: PinConfig) -> PinDecision:
    """`remaining_quantile(q)`: q-quantile of the seconds until the session resumes."""
    if not 0.0 <= memory_pressure <= 1.0:
        raise ValueError(f"memory_pressure must be in [0, 1], got {memory_pressure!r}")
    if kv_tokens < 0:
        raise ValueError(f"kv_tokens must be >= 0, got {kv_tokens!r}")
    if p_continue <= 0.0:
        return PinDecision(False, 0.0, "ended")
    if p_continue < cfg.p_min:
        return PinDecision(False, 0.0, "unlikely_reuse")
    if kv_tokens < cfg.min_tokens:
        return PinDecision(False, 0.0, "cheap")
    if memory_pressure >= cfg.pressure_cutoff:
        return PinDecision(False, 0.0, "pressure")
    q = cfg.q_high - (cfg.q_high - cfg.q_low) * memory_pressure
    rem = remaining_quantile(q)
    if not rem > 0.0 or rem == math.inf:
        return PinDecision(False, 0.0, "tool_done" if not rem > 0.0 else "unbounded")
    ttl = min(rem, cfg.max_ttl_s) * (1.0 - memory_pressure)
    return PinDecision(True, ttl, "pin")


class PinBudget:
    """Ledger of pins with the invariant in the module docstring. Not thread-safe
    (owned by one engine loop)."""

    __slots__ = ("capacity_tokens", "max_fraction", "limit_tokens", "pinned_tokens", "_pins", "_expiry")

    def __init__(self, capacity_tokens: int, max_fraction: float = 0.5) -> None:
        if capacity_tokens < 0 or not 0.0 <= max_fraction <= 1.0:
            raise ValueError("capacity_tokens >= 0 and max_fraction in [0, 1] required")
        self.capacity_tokens = capacity_tokens
        self.max_fraction = max_fraction
        self.limit_tokens = int(capacity_tokens * max_fraction)
        self.pinned_tokens = 0
        self._pins: dict[str, tuple[int, float]] = {}  # session -> (tokens, expires_at)
        self._expiry: list[tuple[float, str]] = []

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._pins

    def __len__(self) -> int:
        return len(self._pins)

    def pins(self) -> dict[str, tuple[int, float]]:
        return dict(self._pins)

    def pin(self, session_id: str, tokens: int, ttl_s: float, now: float) -> bool:
        """Pin (or re-pin, replacing the old pin) `tokens` until now + ttl_s.
        Refused, changing nothing, if the budget would be exceeded."""
        if tokens < 0 or not ttl_s >= 0.0:
            raise ValueError("tokens >= 0 and ttl_s >= 0 required")
        old = self._pins.get(session_id)
        base = self.pinned_tokens - (old[0] if old else 0)
        if ttl_s == 0.0 or base + tokens > self.limit_tokens:
            return False
        self._pins[session_id] = (tokens, now + ttl_s)
        self.pinned_tokens = base + tokens
        heapq.heappush(self._expiry, (now + ttl_s, session_id))
        return True

    def release(self, session_id: str) -> int:
        old = self._pins.pop(session_id, None)
        if old is None:
            return 0
        self.pinned_tokens -= old[0]
        return old[0]

    def expire(self, now: float) -> list[str]:
        """Release every pin whose TTL has passed; returns their sessions."""
        out = []
        heap = self._expiry
        while heap and heap[0][0] <= now:
            at, sid = heapq.heappop(heap)
            cur = self._pins.get(sid)
            if cur is not None and cur[1] == at:
                self.release(sid)
                out.append(sid)
        if len(heap) > 2 * len(self._pins) + 64:
            self._expiry = [(exp, sid) for sid, (_, exp) in self._pins.items()]
            heapq.heapify(self._expiry)
        return out

    def reclaim(self, need_tokens: int, free_tokens: int,
                order: Callable[[Iterable[str]], list[str]] | None = None) -> list[str]:
        """Release pins until `free_tokens + released >= need_tokens` (or none are
        left), in `order` (the core's `reclaim_order`; default: soonest expiry first)."""
        released: list[str] = []
        if free_tokens >= need_tokens or not self._pins:
            return released
        ids = order(list(self._pins)) if order is not None else sorted(
            self._pins, key=lambda s: (self._pins[s][1], s))
        seen = set()
        for sid in list(ids) + sorted(self._pins):  # anything the order forgot goes last
            if free_tokens >= need_tokens:
                break
            if sid in seen or sid not in self._pins:
                continue
            seen.add(sid)
            free_tokens += self.release(sid)
            released.append(sid)
        return released
