"""The KV cache of one worker, at session-prefix granularity.

vLLM keeps KV in fixed-size blocks and reuses a block when a new prompt starts with
the same tokens. Agent histories are append-only, so what a session can reuse is
always a *prefix* of its last prompt plus answer. We therefore keep, per session, one
entry: the number of leading blocks of its history still resident. Evicting takes
blocks from the *tail* of the victim's prefix (vLLM frees a request's blocks tail
first, so the hash chain stays valid), which leaves partial hits possible.

Memory is `capacity_blocks` shared by
- *active* blocks, reserved by running requests (prompt + output, not evictable), and
- *cached* blocks, entries of idle sessions, evictable by *tier* then key (lower
  first): `SOFT` entries first, then `PINNED` ones (a pin is released only when no
  soft entry is left), then `PROTECTED` ones (sessions whose next request is already
  queued: their KV is about to be used).

Keys are set by the caller whenever a session's state changes (request finished, tool
started/ended, session ended, pin expired), as the plugin re-scores a session's blocks
on hints; the cache owns the heap and invalidates stale heap items lazily.

`HostTier` is the CPU copy of evicted tails, for policies that offload and prefetch.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

__all__ = ["PrefixCache", "HostTier", "Eviction", "SOFT", "PINNED", "PROTECTED"]

SOFT, PINNED, PROTECTED = 0, 1, 2  # eviction tiers, lowest first


@dataclass(slots=True)
class _Entry:
    blocks: int
    key: float
    tier: int
    version: int
    dead: bool = False


@dataclass(frozen=True, slots=True)
class Eviction:
    session_id: str
    from_blocks: int  # the entry's length before
    to_blocks: int  # and after (tail-first: blocks [to, from) were freed)


class PrefixCache:
    def __init__(self, capacity_blocks: int, block_tokens: int = 16,
                 clock: Callable[[], float] = lambda: 0.0) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._active: dict[str, int] = {}
        self._heap: list[tuple[int, float, int, str, int]] = []
        self._seq = 0
        self.active_blocks = 0
        self.cached_blocks = 0
        self.dead_blocks = 0
        self.evicted_blocks = 0
        # Time integral of useful blocks (active + cached of live sessions).
        self.useful_block_seconds = 0.0
        self._t = clock()

    # --- reading -------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.capacity_blocks - self.active_blocks - self.cached_blocks

    @property
    def useful_blocks(self) -> int:
        return self.active_blocks + self.cached_blocks - self.dead_blocks

    def cached(self, session_id: str) -> int:
        """Resident prefix of an idle session, in blocks (0 if none or running)."""
        e = self._entries.get(session_id)
        return e.blocks if e is not None else 0

    def holds(self, session_id: str) -> bool:
        """Whether the session has KV here (an idle entry or a running reservation)."""
        return session_id in self._entries or session_id in self._active

    def tier(self, session_id: str) -> int | None:
        e = self._entries.get(session_id)
        return None if e is None else e.tier

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def can_admit(self, session_id: str, keep_blocks: int, total_blocks: int) -> bool:
        """Whether a request keeping `keep_blocks` of its session's entry and needing
        `total_blocks` in all fits once every other idle entry is evicted."""
        return total_blocks - keep_blocks <= self.free_blocks + self.cached_blocks - keep_blocks

    # --- changing ------------------------------------------------------
    def admit(self, session_id: str, keep_blocks: int, total_blocks: int) -> list[Eviction]:
        """Turn the session's entry (cut to `keep_blocks`) into an active reservation of
        `total_blocks`, evicting other entries as needed. Call `can_admit` first."""
        self._tick()
        e = self._entries.pop(session_id, None)
        if e is not None:
            self.cached_blocks -= e.blocks
            if e.dead:
                self.dead_blocks -= e.blocks
        self._active[session_id] = total_blocks
        self.active_blocks += total_blocks
        return self._evict(0) if self.free_blocks < 0 else []

    def release(self, session_id: str, keep_tokens: int, key: float, tier: int = SOFT) -> None:
        """A request finished: keep its first `keep_tokens` (full blocks) as the session's
        entry, free the rest."""
        self._tick()
        blocks = self._active.pop(session_id)
        self.active_blocks -= blocks
        keep = min(keep_tokens // self.block_tokens, blocks)
        if keep > 0:
            self._put(session_id, _Entry(keep, key, tier, 0))

    def set_key(self, session_id: str, key: float, tier: int | None = None) -> None:
        e = self._entries.get(session_id)
        if e is None:
            return
        e.key = key
        if tier is not None:
            e.tier = tier
        self._push(session_id, e)

    def mark_dead(self, session_id: str, key: float) -> None:
        """The session ended: its entry stays cached (as in vLLM) but counts as waste."""
        self._tick()
        e = self._entries.get(session_id)
        if e is not None and not e.dead:
            e.dead = True
            self.dead_blocks += e.blocks
            e.key, e.tier = key, SOFT
            self._push(session_id, e)

    def grow(self, session_id: str, blocks: int, key: float) -> None:
        """Add `blocks` to the tail of an idle session's entry (a prefetch from host);
        the caller checked `free_blocks`."""
        self._tick()
        e = self._entries.get(session_id)
        if e is None:
            self._put(session_id, _Entry(blocks, key, SOFT, 0))
        else:
            e.blocks += blocks
            self.cached_blocks += blocks
            e.key = key
            self._push(session_id, e)

    def drop(self, session_id: str) -> int:
        """Free an idle session's entry at once (its KV moved to another worker);
        returns the blocks freed. Not an eviction: nothing is lost."""
        self._tick()
        e = self._entries.pop(session_id, None)
        if e is None:
            return 0
        self.cached_blocks -= e.blocks
        if e.dead:
            self.dead_blocks -= e.blocks
        return e.blocks

    def make_room(self, blocks: int, max_tier: int | None = None) -> list[Eviction]:
        """Evict until `blocks` are free (or nothing evictable is left); with
        `max_tier`, only entries of that tier or lower (e.g. `SOFT`: never a pin)."""
        self._tick()
        return self._evict(blocks, max_tier)

    def flush_time(self) -> None:
        self._tick()

    # --- internals -----------------------------------------------------
    def _tick(self) -> None:
        now = self._clock()
        if now > self._t:
            self.useful_block_seconds += self.useful_blocks * (now - self._t)
            self._t = now

    def _put(self, sid: str, e: _Entry) -> None:
        self._entries[sid] = e
        self.cached_blocks += e.blocks
        self._push(sid, e)

    def _push(self, sid: str, e: _Entry) -> None:
        # Versions are unique across entries: a heap item left by an earlier entry of
        # the same session (freed by `admit` or `drop`) never matches a later one.
        self._seq += 1
        e.version = self._seq
        heapq.heappush(self._heap, (e.tier, e.key, self._seq, sid, e.version))

    def _evict(self, want_free: int, max_tier: int | None = None) -> list[Eviction]:
        out: list[Eviction] = []
        heap, entries = self._heap, self._entries
        while self.free_blocks < want_free and heap:
            tier, _, _, sid, ver = heap[0]
            e = entries.get(sid)
            if e is None or e.version != ver:
                heapq.heappop(heap)
                continue
            if max_tier is not None and tier > max_tier:
                break
            take = min(e.blocks, want_free - self.free_blocks)
            before = e.blocks
            e.blocks -= take
            self.cached_blocks -= take
            self.evicted_blocks += take
            if e.dead:
                self.dead_blocks -= take
            out.append(Eviction(sid, before, e.blocks))
            if e.blocks == 0:
                heapq.heappop(heap)
                del entries[sid]
        return out


class HostTier:
    """CPU copies of evicted KV, per session as the end (in blocks) of the offloaded
    range; the range starts where the GPU entry ends, since eviction is tail-first.
    Bounded by `capacity_blocks` (counting each copy from block 0, conservatively),
    whole sessions dropped least-recently-offloaded first."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self._ends: OrderedDict[str, int] = OrderedDict()
        self._total = 0

    def offload(self, session_id: str, end_blocks: int) -> None:
        old = self._ends.pop(session_id, 0)
        new = max(old, end_blocks)
        self._ends[session_id] = new
        self._total += new - old
        while self._total > self.capacity_blocks and self._ends:
            _, dropped = self._ends.popitem(last=False)
            self._total -= dropped

    def end(self, session_id: str) -> int:
        return self._ends.get(session_id, 0)

    def drop(self, session_id: str) -> None:
        self._total -= self._ends.pop(session_id, 0)
