"""`HostTierOrder`: which KV a full host (CPU) tier drops first.

A host tier keeps copies of KV the pool gave up, so a session coming back loads it
instead of recomputing it. When it is full, the rule is the pool's: the session whose
KV is worth least goes first (the lowest key of the engine's `SessionKvPolicy`: the
farthest, least likely and cheapest next use; plain recency for KV of no known
session), and within a session its tail goes first, so what stays is still a prefix
the session can load. Both engines run this order: vLLM's CPU offload tier chunk by
chunk (`engines/vllm/offload.py`), the simulator's host tier by block counts.

A session's key is set when its KV enters the tier or is used (`put`); a key that is
not refreshed ages like an LRU timestamp (`eviction`). While an admitted request of the
session waits in the engine's queue its key is infinite (`SessionKvPolicy.key_of`): its
KV is about to be loaded, as its KV in the pool is protected then. A session the engine forgot
(ended, idle past the core's time, evicted from its table, moved away: `forget`) has
no next use here, so its KV is the first to go. Not thread-safe: owned by the
tier's owner.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Hashable

__all__ = ["HostTierOrder"]


class HostTierOrder:
    def __init__(self) -> None:
        self._seq: dict[Hashable, int] = {}  # entry -> its current heap item
        self._heap: list[tuple[float, int, int, Hashable]] = []
        self._n = 0

    def __len__(self) -> int:
        return len(self._seq)

    def __contains__(self, entry: Hashable) -> bool:
        return entry in self._seq

    def put(self, entry: Hashable, key: float, tiebreak: int = 0) -> None:
        """Rank `entry` (a session id, or one chunk of no known session) by `key`, then
        `tiebreak` (a chunk's minus its position: of equal keys, tails first)."""
        self._n += 1
        self._seq[entry] = self._n
        heapq.heappush(self._heap, (key, tiebreak, self._n, entry))
        if len(self._heap) > 2 * len(self._seq) + 64:
            self._heap = [item for item in self._heap if self._seq.get(item[3]) == item[2]]
            heapq.heapify(self._heap)

    def forget(self, entry: Hashable) -> None:
        """The session has no next use here: its KV goes first (if the tier has any)."""
        if entry in self._seq:
            self.put(entry, -math.inf)

    def remove(self, entry: Hashable) -> None:
        self._seq.pop(entry, None)

    def victims(self, need: int, droppable: Callable[[Hashable], int]) -> list[tuple[Hashable, int]]:
        """What to drop to free `need` blocks: (entry, blocks from its tail), lowest
        key first, each entry at most `droppable(entry)` blocks. Fewer than `need` in
        all when the tier cannot free that much. Changes nothing: the tier drops, then
        calls `remove` (or `put` for what is left)."""
        out: list[tuple[Hashable, int]] = []
        seen: list[tuple[float, int, int, Hashable]] = []
        heap, seq = self._heap, self._seq
        got = 0
        while got < need and heap:
            item = heapq.heappop(heap)
            entry = item[3]
            if seq.get(entry) != item[2]:
                continue
            seen.append(item)
            k = min(droppable(entry), need - got)
            if k > 0:
                out.append((entry, k))
                got += k
        for item in seen:
            heapq.heappush(heap, item)
        return out
