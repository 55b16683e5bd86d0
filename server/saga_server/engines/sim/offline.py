"""Timeless cache replay: a sequence of prefix accesses against one `PrefixCache`.

Used by tests to check the cache and eviction orders on hand-checkable cases and to
check that Belady's order recomputes no more than any online order. An access
`(session, tokens)` needs the session's first `tokens` resident: the resident prefix
is a hit, the rest is recomputed, then the whole prefix is cached. Keys see the access
index as time.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from .cache import PrefixCache

__all__ = ["replay_accesses", "ORDERS"]

# key(session, index, next_use_index) -> eviction key (lower = evicted first)
KeyFn = Callable[[str, int, float], float]

ORDERS: dict[str, KeyFn] = {
    "lru": lambda s, i, nxt: float(i),
    "mru": lambda s, i, nxt: float(-i),
    "belady": lambda s, i, nxt: -nxt,
}


def replay_accesses(accesses: Sequence[tuple[str, int]], capacity_blocks: int,
                    key: KeyFn | str = "lru", block_tokens: int = 1) -> int:
    """Recomputed tokens (counting only tokens cached before) of replaying `accesses`."""
    key_fn = ORDERS[key] if isinstance(key, str) else key
    nxt: list[float] = [math.inf] * len(accesses)
    seen: dict[str, int] = {}
    for i in range(len(accesses) - 1, -1, -1):
        sid = accesses[i][0]
        nxt[i] = seen.get(sid, math.inf)
        seen[sid] = i
    cache = PrefixCache(capacity_blocks, block_tokens)
    had: dict[str, int] = {}  # tokens ever cached per session
    recomputed = 0
    for i, (sid, tokens) in enumerate(accesses):
        total = cache.blocks_for(tokens)
        hit_blocks = min(cache.cached(sid), tokens // block_tokens)
        recomputed += max(0, min(had.get(sid, 0), tokens) - hit_blocks * block_tokens)
        if not cache.can_admit(sid, hit_blocks, total):
            raise ValueError(f"access {i} needs {total} blocks, more than the capacity")
        cache.admit(sid, hit_blocks, total)
        cache.ledger.release(sid, "arrival")  # the request references them now
        cache.keep(sid, tokens, key_fn(sid, i, nxt[i]))
        had[sid] = max(had.get(sid, 0), tokens)
    return recomputed
