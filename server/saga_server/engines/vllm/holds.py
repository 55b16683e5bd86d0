"""`SessionHolds`: the KV blocks SAGA keeps referenced on behalf of idle sessions.

vLLM frees a finished request's blocks into an LRU free queue, where any
allocation may evict them. SAGA instead takes one extra reference on the
session's cached (hashed) blocks (`BlockPool.touch`) when its request finishes,
so they stay out of the free queue, and gives the reference back
(`BlockPool.free_blocks`) when:

- the session's next request has been scheduled (it now references the blocks
  itself and got its prefix hit),
- a hard pin's TTL expires (it becomes a soft hold),
- the session ends, or
- an allocation would otherwise fail (`reclaim`): soft holds go first, in the
  core's WA-LRU order, then hard pins in the core's reclaim order; within a
  session the tail blocks go first, so what survives is still a usable prefix.

Two kinds of hold:
- **pin** (hard): the core's `pin_decision` said the tool call warrants it; kept
  until the TTL unless memory is needed. Hard-pinned blocks never exceed
  `max_pin_fraction` of the pool (a pin over budget is taken as a soft hold).
- **soft**: every other idle session's blocks. Holding them costs nothing until
  memory is short, and it lets SAGA (not vLLM's free-queue position) choose
  which session's KV leaves first: that is WA-LRU.

Forward progress: `reclaim` can release every hold, so an allocation that vLLM
alone could satisfy is never refused because of SAGA. Not thread-safe: owned by
the scheduler loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

__all__ = ["Hold", "SessionHolds", "BlockPoolLike"]


class BlockPoolLike(Protocol):
    def touch(self, blocks: Sequence[Any]) -> None: ...

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None: ...

    def get_num_free_blocks(self) -> int: ...


@dataclass(slots=True)
class Hold:
    session_id: str
    blocks: list[Any]  # prefix order; tail released first
    pinned: bool
    expires_at: float  # hard pins only; math.inf for soft holds
    created_at: float
    kv_tokens: int
    last_access: float
    reason: str = ""
    meta: dict = field(default_factory=dict)


class SessionHolds:
    def __init__(self, pool: BlockPoolLike, total_blocks: int, block_size: int,
                 max_pin_fraction: float = 0.5,
                 on_release: Callable[[str, str, int, bool], None] | None = None) -> None:
        """`on_release(session_id, reason, n_blocks, was_pinned)` is told about every release
        (reasons: "arrival", "ttl", "pressure", "wa_lru", "session_end", "replaced",
        "reset"), for metrics."""
        if not 0.0 <= max_pin_fraction <= 1.0:
            raise ValueError("max_pin_fraction must be in [0, 1]")
        self.pool = pool
        self.total_blocks = max(1, total_blocks)
        self.block_size = block_size
        self.max_pin_blocks = int(max_pin_fraction * self.total_blocks)
        self._holds: dict[str, Hold] = {}
        self._on_release = on_release or (lambda sid, reason, n, pinned: None)

    # -- reads -------------------------------------------------------------------

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._holds

    def __len__(self) -> int:
        return len(self._holds)

    def get(self, session_id: str) -> Hold | None:
        return self._holds.get(session_id)

    def sessions(self) -> list[str]:
        return list(self._holds)

    @property
    def held_blocks(self) -> int:
        return sum(len(h.blocks) for h in self._holds.values())

    @property
    def pinned_blocks(self) -> int:
        return sum(len(h.blocks) for h in self._holds.values() if h.pinned)

    def pressure(self) -> float:
        """Share of the pool not free to allocate right now (0..1)."""
        free = self.pool.get_num_free_blocks()
        return min(1.0, max(0.0, 1.0 - free / self.total_blocks))

    # -- changes -----------------------------------------------------------------

    def hold(self, session_id: str, blocks: Sequence[Any], *, pin: bool, ttl_s: float, now: float,
             kv_tokens: int, reason: str = "") -> Hold | None:
        """Take a reference on `blocks` for the session (replacing its previous
        hold, whose reference is dropped after the new one is taken, so shared
        blocks never pass through the free queue). A pin that would exceed the
        pin budget, or has no positive TTL, is taken as a soft hold."""
        blocks = [b for b in blocks if not getattr(b, "is_null", False)]
        old = self._holds.pop(session_id, None)
        hold = None
        if blocks:
            pinned_now = self.pinned_blocks
            if pin and (ttl_s <= 0 or pinned_now + len(blocks) > self.max_pin_blocks):
                pin, reason = False, reason + "+over_budget" if pin and ttl_s > 0 else reason
            self.pool.touch(blocks)
            hold = Hold(session_id, list(blocks), pin, now + ttl_s if pin else math.inf, now,
                        kv_tokens, now, reason)
            self._holds[session_id] = hold
        if old is not None:
            self._free(old, len(old.blocks), "replaced")
        return hold

    def release(self, session_id: str, reason: str) -> int:
        """Drop the whole hold of a session (unknown session: 0)."""
        hold = self._holds.pop(session_id, None)
        if hold is None:
            return 0
        return self._free(hold, len(hold.blocks), reason)

    def release_all(self, reason: str) -> int:
        return sum(self.release(sid, reason) for sid in list(self._holds))

    def expire(self, now: float) -> list[str]:
        """Hard pins past their TTL become soft holds (their KV then competes in
        WA-LRU order instead of being guaranteed)."""
        out = []
        for hold in self._holds.values():
            if hold.pinned and hold.expires_at <= now:
                hold.pinned = False
                hold.expires_at = math.inf
                out.append(hold.session_id)
        return out

    def reclaim(self, need_blocks: int, soft_order: Callable[[list[Hold]], list[Hold]],
                pin_order: Callable[[list[str]], list[str]], protect: Sequence[str] = (),
                ) -> list[tuple[str, str, int]]:
        """Release blocks until `need_blocks` more are free in the pool, or nothing
        is held. Soft holds go first (`soft_order`: evict first comes first), then
        pins (`pin_order`), and the `protect`ed sessions (their next request is
        already queued, so their KV is about to be used) last of all, in the given
        order (the caller passes the back of the queue first: Belady for a FIFO).
        Returns (session, reason, blocks released) per touched session."""
        released: list[tuple[str, str, int]] = []
        if need_blocks <= 0 or not self._holds:
            return released
        start = self.pool.get_num_free_blocks()
        protect = list(dict.fromkeys(protect))  # ordered, unique
        soft = [h for h in self._holds.values() if not h.pinned and h.session_id not in protect]
        pinned_ids = [h.session_id for h in self._holds.values() if h.pinned and h.session_id not in protect]
        victims: list[tuple[Hold, str]] = [(h, "wa_lru") for h in _complete(soft_order(soft), soft)]
        order = _complete_ids(pin_order(pinned_ids), pinned_ids)
        victims += [(self._holds[sid], "pressure") for sid in order]
        victims += [(self._holds[sid], "pressure") for sid in protect if sid in self._holds]
        for hold, reason in victims:
            gained = self.pool.get_num_free_blocks() - start
            if gained >= need_blocks:
                break
            n = self._free(hold, need_blocks - gained, reason)
            if not hold.blocks:
                self._holds.pop(hold.session_id, None)
            released.append((hold.session_id, reason, n))
        return released

    # -- internals ---------------------------------------------------------------

    def _free(self, hold: Hold, n_wanted: int, reason: str) -> int:
        """Give back references on the hold's tail blocks until `n_wanted` blocks
        became free (shared blocks may need several), or the hold is empty.
        Returns the number of references dropped."""
        start = self.pool.get_num_free_blocks()
        dropped = 0
        while hold.blocks and self.pool.get_num_free_blocks() - start < n_wanted:
            block = hold.blocks.pop()
            self.pool.free_blocks([block])
            dropped += 1
        hold.kv_tokens = min(hold.kv_tokens, len(hold.blocks) * self.block_size)
        if dropped:
            self._on_release(hold.session_id, reason, dropped, hold.pinned)
        return dropped


def _complete(ordered: Iterable[Hold], all_: list[Hold]) -> list[Hold]:
    """The policy's order, then anything it forgot (never lose a victim)."""
    seen, out = set(), []
    for h in list(ordered) + all_:
        if id(h) not in seen:
            seen.add(id(h))
            out.append(h)
    return out


def _complete_ids(ordered: Iterable[str], all_: list[str]) -> list[str]:
    seen, out = set(), []
    for s in list(ordered) + sorted(all_):
        if s not in seen and s in all_:
            seen.add(s)
            out.append(s)
    return out
