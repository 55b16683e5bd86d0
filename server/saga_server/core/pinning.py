"""Tool-aware TTL pinning: whether to hold a session's KV while its tool runs.

Decision (`decide_pin`), in order:
1. session ended, or P(another call) < `p_min`         -> no pin ("ended", "unlikely_reuse")
2. kv_tokens < `min_tokens` (cheap to recompute)        -> no pin ("cheap")
3. memory_pressure >= `pressure_cutoff`                 -> no pin ("pressure")
4. otherwise pin for TTL = (1 - pressure) * Q_rem(q), capped at `max_ttl_s`, where
   Q_rem(q) is the q-quantile of the tool's *remaining* duration (given the time
   it already ran) and q slides from `q_high` (no pressure) to `q_low` (full
   pressure). A TTL of zero means no pin ("tool_done").

Pressure is the share of the pool that cannot be had on demand: running requests,
pins and protected KV (`HoldLedger.pressure`). Idle sessions' cached KV is not
pressure: it is what a pin is weighed against, and a pool that has served its size
in tokens is always full of it.

The client's own cache TTL (`client_ttl_s`: Anthropic's `cache_control` TTL,
OpenAI's `prompt_cache_retention`, read at the front door) is a floor: past rule 3,
the pin lasts at least (1 - pressure) * min(`client_ttl_s`, `max_client_ttl_s`),
even where SAGA predicts no reuse or its predicted resume has passed ("client_ttl"
when the floor made the pin). What wins: SAGA's facts win over the client's ask
(an ended session, KV too cheap to keep, a pool past the pressure cutoff pin
nothing, whatever was asked), because SAGA knows the pool; the client's ask wins
over SAGA's prediction, because the client knows pauses SAGA has not learnt (a
human's turn). Either way the pin is bounded like SAGA's own: the pin budget, the
tenant's `max_pinned_blocks`, and given back on demand.

The decision is stateless; an engine keeps its pins in the `holds.HoldLedger`, which
enforces the pin budget (pinned blocks never exceed a fraction of the pool), ends
pins at their TTL and gives pinned KV back on demand, after every soft hold
(forward progress).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

__all__ = ["PinConfig", "PinDecision", "decide_pin"]


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
    max_client_ttl_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0.0 < self.q_low <= self.q_high < 1.0:
            raise ValueError("need 0 < q_low <= q_high < 1")
        if not 0.0 <= self.p_min <= 1.0 or not 0.0 < self.pressure_cutoff <= 1.0:
            raise ValueError("p_min in [0, 1] and pressure_cutoff in (0, 1] required")
        if self.max_ttl_s <= 0 or self.min_tokens < 0 or self.max_client_ttl_s < 0:
            raise ValueError("max_ttl_s > 0, max_client_ttl_s >= 0 and min_tokens >= 0 required")


def decide_pin(p_continue: float, remaining_quantile: Callable[[float], float], kv_tokens: int,
               memory_pressure: float, cfg: PinConfig, client_ttl_s: float = 0.0) -> PinDecision:
    """`remaining_quantile(q)`: q-quantile of the seconds until the session resumes;
    `client_ttl_s`: the client's own cache TTL (0: none). Rules: module docstring."""
    if not 0.0 <= memory_pressure <= 1.0:
        raise ValueError(f"memory_pressure must be in [0, 1], got {memory_pressure!r}")
    if kv_tokens < 0:
        raise ValueError(f"kv_tokens must be >= 0, got {kv_tokens!r}")
    if p_continue <= 0.0:
        return PinDecision(False, 0.0, "ended")
    if kv_tokens < cfg.min_tokens:
        return PinDecision(False, 0.0, "cheap")
    if memory_pressure >= cfg.pressure_cutoff:
        return PinDecision(False, 0.0, "pressure")
    floor = min(client_ttl_s, cfg.max_client_ttl_s) * (1.0 - memory_pressure) if client_ttl_s > 0 else 0.0
    learnt = _learnt_pin(p_continue, remaining_quantile, memory_pressure, cfg)
    if floor > learnt.ttl_s:
        return PinDecision(True, floor, "client_ttl")
    return learnt


def _learnt_pin(p_continue: float, remaining_quantile: Callable[[float], float], memory_pressure: float,
                cfg: PinConfig) -> PinDecision:
    """Rules 1 and 4, for a session past rules 2 and 3."""
    if p_continue < cfg.p_min:
        return PinDecision(False, 0.0, "unlikely_reuse")
    q = cfg.q_high - (cfg.q_high - cfg.q_low) * memory_pressure
    rem = remaining_quantile(q)
    if not rem > 0.0 or rem == math.inf:
        return PinDecision(False, 0.0, "tool_done" if not rem > 0.0 else "unbounded")
    ttl = min(rem, cfg.max_ttl_s) * (1.0 - memory_pressure)
    return PinDecision(True, ttl, "pin")
