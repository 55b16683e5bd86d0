"""WA-LRU: workflow-aware eviction keys, and a reference heap that owns them.

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
agent traces (DESIGN.md; `benchmarks/core_evict_replay.py`: at 300k tokens for
16 SWE sessions LRU recomputes 1.97x Belady's share, this key 1.30x). Keys are computed when an entry changes (request finished, tool
started/ended); a key that is not refreshed ages like an LRU timestamp.

Blocks: a block-evicting engine gives every block of a session prefix the
session key minus `index * block_spacing_s`, so a prefix is evicted tail first
(an evicted head block makes every later block useless to the prefix cache).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Hashable

__all__ = ["EvictionConfig", "wa_lru_key", "block_key", "PriorityIndex"]


@dataclass(frozen=True, slots=True)
class EvictionConfig:
    attn_tokens: float = 32768.0
    p_floor: float = 1e-3
    ended_penalty_s: float = 1e6
    max_horizon_s: float = 1e7
    block_spacing_s: float = 1e-6

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


def block_key(session_key: float, block_index: int, cfg: EvictionConfig = _DEFAULT) -> float:
    return session_key - block_index * cfg.block_spacing_s


class PriorityIndex:
    """Min-heap of entry -> key with O(log n) update/remove/pop (lazy deletion).

    The caller-owned heap of the SGLang pattern, for engines and the simulator
    that have none of their own: `update` on every key change, `pop_victim` to
    evict. Stale heap items are skipped on pop and compacted away when they
    outnumber live ones, so memory stays O(live entries).
    """

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable]] = []
        self._live: dict[Hashable, tuple[float, int]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, entry: Hashable) -> bool:
        return entry in self._live

    def key(self, entry: Hashable) -> float | None:
        item = self._live.get(entry)
        return None if item is None else item[0]

    def update(self, entry: Hashable, key: float) -> None:
        if key != key:  # NaN would corrupt the heap order
            raise ValueError(f"NaN priority for {entry!r}")
        self._seq += 1
        self._live[entry] = (key, self._seq)
        heapq.heappush(self._heap, (key, self._seq, entry))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()

    def remove(self, entry: Hashable) -> bool:
        return self._live.pop(entry, None) is not None

    def peek(self) -> tuple[Hashable, float] | None:
        heap, live = self._heap, self._live
        while heap:
            key, seq, entry = heap[0]
            cur = live.get(entry)
            if cur is not None and cur[1] == seq:
                return entry, key
            heapq.heappop(heap)
        return None

    def pop_victim(self) -> tuple[Hashable, float] | None:
        """Remove and return the entry with the lowest key (ties: least recently updated)."""
        top = self.peek()
        if top is not None:
            heapq.heappop(self._heap)
            del self._live[top[0]]
        return top

    def _compact(self) -> None:
        self._heap = [(k, s, e) for e, (k, s) in self._live.items()]
        heapq.heapify(self._heap)
