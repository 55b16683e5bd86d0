"""WA-LRU: the workflow-aware eviction key (the `holds.HoldLedger` owns the order).

The key (LOWER = evict first) is a time on the core's clock, an *equivalent last
access*:

    key = now - T / (max(p, p_floor) * w)        for KV of a known live session
    key = last_access                            for KV with no session (plain LRU)
    key = last_access - ended_penalty_s          for KV of an ended session

where T is the expected time until the session's next LLM call (the open tool's
remaining duration, see `aeg`), p the probability that call happens, and
w = 1 + kv_tokens / attn_tokens the relative recompute cost per token (prefill
work per token grows with the prefix because attention is quadratic). So
1 / (now - key) = p * w / T is the expected recompute cost saved per token (per
byte: bytes per token are fixed within one engine) per second of expected wait,
the quantity we want to keep the most of; with no prediction (p = w = 1 and T =
time since last use) it reduces exactly to LRU, so keys of both kinds compare.
At one instant the order is "farthest expected next use first", the lever on
agent traces (docs/ARCHITECTURE.md; `benchmarks/core_evict_replay.py` holds it against
LRU and Belady, docs/RESEARCH.md, "The workflow core"). Keys are computed when an entry
changes (request finished, tool started/ended); a key that is not refreshed ages like
an LRU timestamp.

Within a session the ledger releases the tail first (an evicted head block makes
every later block useless to the prefix cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EvictionConfig", "wa_lru_key"]


@dataclass(frozen=True, slots=True)
class EvictionConfig:
    attn_tokens: float = 32768.0
    p_floor: float = 1e-3
    ended_penalty_s: float = 1e6
    max_horizon_s: float = 1e7

    def __post_init__(self) -> None:
        if self.attn_tokens <= 0 or not 0 < self.p_floor <= 1 or self.max_horizon_s <= 0:
            raise ValueError("attn_tokens > 0, 0 < p_floor <= 1 and max_horizon_s > 0 required")


_DEFAULT = EvictionConfig()


def wa_lru_key(now: float, last_access: float, kv_tokens: int, reuse: tuple[float, float] | None,
               cfg: EvictionConfig = _DEFAULT) -> float:
    """The WA-LRU key; `reuse` is (p_continue, expected seconds to next use) or None."""
    if reuse is None:
        return last_access
    p, t_next = reuse
    if p <= 0.0 or t_next == math.inf:
        return last_access - cfg.ended_penalty_s
    w = 1.0 + max(kv_tokens, 0) / cfg.attn_tokens
    eff = max(t_next, 0.0) / ((p if p > cfg.p_floor else cfg.p_floor) * w)
    return now - (eff if eff < cfg.max_horizon_s else cfg.max_horizon_s)
