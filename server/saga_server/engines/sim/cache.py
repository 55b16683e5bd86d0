"""The KV cache of one worker, at session-prefix granularity.

vLLM keeps KV in fixed-size blocks and reuses a block when a new prompt starts with
the same tokens. Agent histories are append-only, so what a session can reuse is
always a *prefix* of its last prompt plus answer. The blocks of a session are
therefore "the first n blocks of its history", and a pool only needs counts.

`PrefixCache` is the pool of one worker: `capacity_blocks` shared by
- *active* blocks, reserved by running requests (prompt + output, not evictable), and
- *cached* blocks, the prefixes of idle sessions, held by the core's `HoldLedger`
  (the same object the vLLM plugin uses): soft holds first, then pins (within the pin
  budget, until their TTL), then protected prefixes (sessions whose next request is
  queued), each tier by key, tail first. So the simulator releases KV in the plugin's
  order by construction. A stock vLLM's free queue is this with every prefix a soft
  hold keyed by its last use (LRU).

This is the pool's mechanics only: which KV a session holds, in which tier and
under which key, is decided by the worker's `SessionKvPolicy` (the core's, the
plugin's too), which the simulator drives over `ledger`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from saga_server.core.holds import PINNED, PROTECTED, SOFT, HoldLedger

__all__ = ["PrefixCache", "Eviction", "CountingPool", "SOFT", "PINNED", "PROTECTED"]


@dataclass(frozen=True, slots=True)
class Eviction:
    session_id: str
    from_blocks: int  # the entry's length before
    to_blocks: int  # and after (tail-first: blocks [to, from) were freed)


class CountingPool:
    """A `BlockPool` of anonymous blocks for sessions whose blocks are the first n of
    their history (runs are `range`s). Requests reserve a session's blocks
    (`reserve`), the ledger holds a prefix of them (`touch`, then `free` of tails); a
    session occupies max(reserved, longest held run) blocks."""

    __slots__ = ("capacity", "used", "reserved_total", "_reserved", "_runs")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.reserved_total = 0
        self._reserved: dict[str, int] = {}
        self._runs: dict[str, list[int]] = {}  # session -> ends of its held runs

    def num_free(self) -> int:
        return self.capacity - self.used

    def reserved(self, session_id: str) -> int:
        return self._reserved.get(session_id, 0)

    def reserve(self, session_id: str, blocks: int) -> None:
        before = self._occupied(session_id)
        self.reserved_total += blocks - self._reserved.get(session_id, 0)
        self._reserved[session_id] = blocks
        self.used += self._occupied(session_id) - before

    def unreserve(self, session_id: str) -> int:
        before = self._occupied(session_id)
        self.reserved_total -= self._reserved.pop(session_id, 0)
        self.used += self._occupied(session_id) - before
        return before - self._occupied(session_id)

    def touch(self, session_id: str, blocks: range) -> None:
        before = self._occupied(session_id)
        self._runs.setdefault(session_id, []).append(blocks.stop)
        self.used += self._occupied(session_id) - before

    def free(self, session_id: str, blocks: range) -> int:
        """`blocks` is the tail [start, stop) of a held run ending at `stop`."""
        before = self._occupied(session_id)
        runs = self._runs[session_id]
        runs.remove(blocks.stop)
        if blocks.start > 0:
            runs.append(blocks.start)
        elif not runs:
            del self._runs[session_id]
        freed = before - self._occupied(session_id)
        self.used -= freed
        return freed

    def _occupied(self, session_id: str) -> int:
        runs = self._runs.get(session_id)
        held = max(runs) if runs else 0
        reserved = self._reserved.get(session_id, 0)
        return held if held > reserved else reserved


class PrefixCache:
    def __init__(self, capacity_blocks: int, block_tokens: int = 16,
                 clock: Callable[[], float] = lambda: 0.0, max_pin_fraction: float = 0.5) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self._clock = clock
        self.pool = CountingPool(capacity_blocks)
        self.ledger = HoldLedger(self.pool, capacity_blocks, max_pin_fraction=max_pin_fraction)
        self.evicted_blocks = 0
        # Time integral of useful blocks (active + cached of live sessions).
        self.useful_block_seconds = 0.0
        self._t = clock()

    # --- reading -------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.pool.num_free()

    @property
    def active_blocks(self) -> int:
        return self.pool.reserved_total

    @property
    def cached_blocks(self) -> int:
        return self.ledger.held_blocks

    @property
    def useful_blocks(self) -> int:
        return self.pool.used

    def cached(self, session_id: str) -> int:
        """Resident prefix of an idle session, in blocks (0 if none or running)."""
        return self.ledger.blocks_of(session_id)

    def holds(self, session_id: str) -> bool:
        """Whether the session has KV here (an idle prefix or a running reservation)."""
        return session_id in self.ledger or self.pool.reserved(session_id) > 0

    def tier(self, session_id: str) -> int | None:
        hold = self.ledger.get(session_id)
        return None if hold is None else hold.tier

    def pin_expires_at(self, session_id: str) -> float:
        hold = self.ledger.get(session_id)
        return hold.expires_at if hold is not None and hold.tier == PINNED else math.inf

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def can_admit(self, session_id: str, keep_blocks: int, total_blocks: int) -> bool:
        """Whether a request keeping `keep_blocks` of its session's prefix and needing
        `total_blocks` in all fits once every other idle prefix is evicted."""
        return total_blocks - keep_blocks <= self.free_blocks + self.cached_blocks - keep_blocks

    # --- changing ------------------------------------------------------
    def admit(self, session_id: str, keep_blocks: int, total_blocks: int) -> list[Eviction]:
        """Reserve `total_blocks` for the session's request (its held prefix counts in
        them; the policy gives the hold back once scheduled), evicting other prefixes
        as needed. Call `can_admit` first."""
        self._tick()
        own = self.ledger.blocks_of(session_id)
        evs = self._make_room(total_blocks - own, spare=session_id) if total_blocks > own else []
        self.pool.reserve(session_id, total_blocks)
        return evs

    def request_blocks(self, session_id: str, keep_tokens: int) -> range:
        """The blocks of the session's finished request that hold its first
        `keep_tokens` (full blocks only), for the policy to hold."""
        self._tick()
        return range(min(keep_tokens // self.block_tokens, self.pool.reserved(session_id)))

    def unreserve(self, session_id: str) -> None:
        """The session's request is gone: what nobody holds is free."""
        self._tick()
        self.pool.unreserve(session_id)

    def keep(self, session_id: str, keep_tokens: int, key: float) -> None:
        """A request finished: keep its first `keep_tokens` as a SOFT hold under `key`
        and free the rest (for replays without a policy, `offline`)."""
        self.ledger.hold(session_id, self.request_blocks(session_id, keep_tokens), key=key, now=self._clock())
        self.unreserve(session_id)

    def grow(self, session_id: str, blocks: int) -> None:
        """Add `blocks` to the tail of an idle session's prefix (loaded from the host
        tier or another worker); the caller checked `free_blocks`, and the worker's KV
        policy keys the hold (`SessionKvPolicy.loaded`)."""
        self._tick()
        have = self.ledger.blocks_of(session_id)
        self.pool.reserve(session_id, have + blocks)  # the load's own allocation
        if have:
            self.ledger.replace_blocks(session_id, range(have + blocks))
        else:
            self.ledger.hold(session_id, range(blocks), key=-math.inf, now=self._clock())
        self.pool.unreserve(session_id)

    def evictions(self, releases) -> list[Eviction]:
        """`Release`s of a `make_room` as evictions (counted)."""
        out = [Eviction(r.session_id, r.before, r.after) for r in releases]
        self.evicted_blocks += sum(e.from_blocks - e.to_blocks for e in out)
        return out

    def flush_time(self) -> None:
        self._tick()

    # --- internals -----------------------------------------------------
    def _make_room(self, blocks: int, *, spare: str | None = None) -> list[Eviction]:
        return self.evictions(self.ledger.make_room(blocks, spare=spare))

    def _tick(self) -> None:
        now = self._clock()
        if now > self._t:
            self.useful_block_seconds += self.useful_blocks * (now - self._t)
            self._t = now
