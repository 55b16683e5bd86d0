"""`HoldLedger`: the KV an engine keeps for idle sessions, and the order it gives it back.

An engine frees a finished request's blocks; SAGA keeps the cached prefix of a
session that will be back referenced instead (a *hold*), so that SAGA, not the
engine's free-queue position, decides whose KV leaves first. One ledger implements
that rule for every engine: the vLLM plugin runs it over vLLM's `BlockPool`, the
simulator over a counting pool, so both release KV in the same order by construction.

Tiers, lowest given back first:
- `SOFT`: every held session's blocks unless below. Holding costs nothing until
  memory is short.
- `PINNED`: a TTL pin (the core's `pin_decision`: its tool is worth waiting for).
  Pinned blocks never exceed `max_pin_fraction` of the pool: a pin that would cross
  it is held `SOFT` (reason "+over_budget"). Nor do the pinned blocks of one owner
  (a hold's `owner`: its session's tenant) exceed `owner_pin_cap(owner)` (None: no
  cap; reason "+over_owner_cap"), so one tenant cannot pin the whole budget. When
  the TTL ends the pin becomes SOFT (`expire`).
- `PROTECTED`: the session's next request is already queued, so its KV is about to
  be used (the caller keys these by arrival, latest first: Belady for a FIFO).

Within a tier, lower `key` first (the core's WA-LRU key, or plain recency), ties in
the order the keys were set. Within a session, tail blocks first, so what survives
is still a usable prefix.

`make_room(free_target)` releases in that order until the pool has `free_target`
free blocks or nothing is held; the `spare` session (the one being allocated for)
goes last of all. It can release every hold, so an allocation the pool could serve
without SAGA is never refused because of SAGA (forward progress).

Keys and tiers are set by the caller whenever a session changes state (request
finished, tool started or ended, next request queued, pin expired); a key that is
not refreshed ages like an LRU timestamp (see `eviction`). Not thread-safe: owned
by one engine loop.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

__all__ = ["BlockPool", "Hold", "HoldLedger", "Release", "SOFT", "PINNED", "PROTECTED"]

SOFT, PINNED, PROTECTED = 0, 1, 2
_TIER_REASON = {SOFT: "wa_lru", PINNED: "pressure", PROTECTED: "pressure"}


class BlockPool(Protocol):
    """What the ledger needs of an engine's block pool. Blocks of a session are given
    in prefix order; the ledger only ever frees a tail of what it touched."""

    def touch(self, session_id: str, blocks: Sequence) -> None:
        """Take one more reference on live blocks (held by a request or by the ledger)."""

    def free(self, session_id: str, blocks: Sequence) -> int:
        """Drop one reference on each block; return how many blocks became free."""

    def num_free(self) -> int:
        """Blocks free to allocate now."""


@dataclass(slots=True)
class Hold:
    session_id: str
    blocks: Sequence  # prefix order
    tier: int
    key: float
    created_at: float
    expires_at: float = math.inf  # pins only
    reason: str = ""
    seq: int = 0  # the heap item that is current
    owner: str = ""  # whose pin cap its pinned blocks count against
    refused: str = ""  # why its last pin was refused: "over_budget", "over_owner_cap" ("" once pinned)

    @property
    def pinned(self) -> bool:
        return self.tier == PINNED


@dataclass(frozen=True, slots=True)
class Release:
    session_id: str
    reason: str
    tier: int
    before: int  # the hold's blocks before
    after: int  # and after (blocks [after, before) were released, tail first)


class HoldLedger:
    def __init__(self, pool: BlockPool, capacity_blocks: int, *, max_pin_fraction: float = 0.5,
                 on_release: Callable[[Release], None] | None = None,
                 owner_pin_cap: Callable[[str], int | None] = lambda owner: None) -> None:
        """`on_release` is told of every release (reasons: "arrival", "ttl", "wa_lru",
        "pressure", "session_end", "moved", "replaced", "reset", or the caller's).
        `owner_pin_cap(owner)`: the most blocks one owner's holds may pin (None: no cap),
        asked at every pin, so a cap that changes applies to the next pin."""
        if not 0.0 <= max_pin_fraction <= 1.0:
            raise ValueError("max_pin_fraction must be in [0, 1]")
        self.pool = pool
        self.capacity_blocks = max(1, capacity_blocks)
        self.max_pin_blocks = int(max_pin_fraction * self.capacity_blocks)
        self._holds: dict[str, Hold] = {}
        self._heap: list[tuple[int, float, int, str]] = []
        self._expiry: list[tuple[float, str]] = []
        self._seq = 0
        self._on_release = on_release
        self._owner_pin_cap = owner_pin_cap
        self.held_blocks = 0
        self.pinned_blocks = 0
        self.soft_blocks = 0
        self._pinned_by_owner: dict[str, int] = {}

    # -- reads ---------------------------------------------------------------------

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._holds

    def __len__(self) -> int:
        return len(self._holds)

    def get(self, session_id: str) -> Hold | None:
        return self._holds.get(session_id)

    def blocks_of(self, session_id: str) -> int:
        hold = self._holds.get(session_id)
        return len(hold.blocks) if hold is not None else 0

    def sessions(self) -> list[str]:
        return list(self._holds)

    def pinned_of(self, owner: str) -> int:
        """Blocks the holds of `owner` pin now."""
        return self._pinned_by_owner.get(owner, 0)

    def pressure(self) -> float:
        """Share of the pool that cannot be had on demand now (0..1): what requests,
        pins and protected holds take. Soft holds count as free: they are idle
        sessions' cached KV, given back the moment anything needs the room, as a
        stock engine's cached free blocks are (and counted free by it). Counting them
        would read a pool that merely remembers its sessions as one under pressure,
        which every pool does once it has served its size in tokens. A block shared by
        several holds counts once for each, so shared prefixes make it read low."""
        return min(1.0, max(0.0, 1.0 - (self.pool.num_free() + self.soft_blocks) / self.capacity_blocks))

    # -- changes -------------------------------------------------------------------

    def hold(self, session_id: str, blocks: Sequence, *, key: float, now: float, pin_ttl_s: float = 0.0,
             tier: int = SOFT, reason: str = "", owner: str = "") -> Hold | None:
        """Hold `blocks` for the session, replacing its previous hold (the new
        references are taken before the old ones are dropped, so shared blocks never
        pass through the free queue). `pin_ttl_s > 0` asks for a pin (within the
        budget and `owner`'s cap); otherwise `tier` is SOFT or PROTECTED. No blocks:
        just the release."""
        old = self._holds.pop(session_id, None)
        if old is not None:
            self._account(old, -1)
        hold = None
        if len(blocks):
            self.pool.touch(session_id, blocks)
            hold = Hold(session_id, blocks, SOFT, key, now, reason=reason, owner=owner)
            self._holds[session_id] = hold
            self._account(hold, +1)
            if not (pin_ttl_s > 0 and self._pin(hold, pin_ttl_s, now)):
                self._set(hold, key, SOFT if pin_ttl_s > 0 else _check_unpinned(tier))
        if old is not None:
            self._release_tail(old, len(old.blocks), "replaced", account=False)
        return hold

    def replace_blocks(self, session_id: str, blocks: Sequence) -> None:
        """The same hold (tier, key, TTL) over another block run, e.g. a longer one
        after its evicted tail was loaded back. Unknown session: nothing."""
        old = self._holds.get(session_id)
        if old is None:
            return
        self.pool.touch(session_id, blocks)
        prev = old.blocks
        self._account(old, -1)
        old.blocks = blocks
        self._account(old, +1)
        self.pool.free(session_id, prev)

    def pin(self, session_id: str, ttl_s: float, now: float, key: float | None = None) -> bool:
        """Pin the session's hold for `ttl_s` from `now` (a pin already there gets the
        new TTL). False, leaving the hold as it was, when it has none, `ttl_s <= 0`,
        or the budget or its owner's cap would be crossed."""
        hold = self._holds.get(session_id)
        if hold is None or not ttl_s > 0:
            return False
        if key is not None:
            hold.key = key
        return self._pin(hold, ttl_s, now)

    def set_key(self, session_id: str, key: float, tier: int | None = None) -> None:
        """Re-score the session's hold; `tier` SOFT or PROTECTED also changes its tier
        (a pin given SOFT or PROTECTED is unpinned). Unknown session: nothing."""
        hold = self._holds.get(session_id)
        if hold is not None:
            self._set(hold, key, hold.tier if tier is None else _check_unpinned(tier))

    def release(self, session_id: str, reason: str) -> int:
        """Give back the whole hold of a session; returns blocks that became free."""
        hold = self._holds.pop(session_id, None)
        if hold is None:
            return 0
        return self._release_tail(hold, len(hold.blocks), reason)

    def truncate(self, session_id: str, keep_blocks: int, reason: str) -> int:
        """Give back the hold's blocks beyond the first `keep_blocks`."""
        hold = self._holds.get(session_id)
        if hold is None or len(hold.blocks) <= keep_blocks:
            return 0
        if keep_blocks <= 0:
            return self.release(session_id, reason)
        return self._release_tail(hold, len(hold.blocks) - keep_blocks, reason, by_refs=True)

    def release_all(self, reason: str) -> int:
        return sum(self.release(sid, reason) for sid in list(self._holds))

    def expire(self, now: float) -> list[str]:
        """Pins whose TTL has passed become SOFT (their KV then competes by key
        instead of being kept); returns their sessions."""
        out = []
        heap = self._expiry
        while heap and heap[0][0] <= now:
            at, sid = heapq.heappop(heap)
            hold = self._holds.get(sid)
            if hold is not None and hold.tier == PINNED and hold.expires_at == at:
                self._set(hold, hold.key, SOFT)
                out.append(sid)
        if len(heap) > 2 * len(self._holds) + 64:
            self._expiry = [(h.expires_at, s) for s, h in self._holds.items() if h.tier == PINNED]
            heapq.heapify(self._expiry)
        return out

    def make_room(self, free_target: int, *, spare: str | None = None,
                  max_tier: int = PROTECTED) -> list[Release]:
        """Release holds in the documented order until the pool has `free_target` free
        blocks, nothing (up to `max_tier`) is held, or only `spare` is left (released
        last of all)."""
        out: list[Release] = []
        pool, heap, holds = self.pool, self._heap, self._holds
        spared = None
        while pool.num_free() < free_target and heap:
            tier, _, seq, sid = heap[0]
            hold = holds.get(sid)
            if hold is None or hold.seq != seq:
                heapq.heappop(heap)
                continue
            if tier > max_tier:
                break
            if sid == spare:
                spared = heapq.heappop(heap)
                continue
            out.append(self._evict(hold, free_target - pool.num_free()))
        if spared is not None:
            hold = holds.get(spare)
            if hold is not None and pool.num_free() < free_target:
                out.append(self._evict(hold, free_target - pool.num_free()))
                hold = holds.get(spare)
            if hold is not None and hold.seq == spared[2]:
                heapq.heappush(heap, spared)
        self._maybe_compact()
        return out

    # -- internals -----------------------------------------------------------------

    def _evict(self, hold: Hold, want_free: int) -> Release:
        before, tier = len(hold.blocks), hold.tier
        self._release_tail(hold, want_free, _TIER_REASON[tier], notify=False)
        if not hold.blocks:
            self._holds.pop(hold.session_id, None)
        release = Release(hold.session_id, _TIER_REASON[tier], tier, before, len(hold.blocks))
        if self._on_release is not None:
            self._on_release(release)
        return release

    def _release_tail(self, hold: Hold, want: int, reason: str, *, account: bool = True,
                      notify: bool = True, by_refs: bool = False) -> int:
        """Drop references on the hold's tail until `want` blocks became free (or, with
        `by_refs`, `want` references were dropped), or the hold is empty. Returns the
        blocks that became free."""
        before, freed, dropped = len(hold.blocks), 0, 0
        while hold.blocks and (dropped if by_refs else freed) < want:
            n = len(hold.blocks)
            k = min(want - (dropped if by_refs else freed), n)
            tail, hold.blocks = hold.blocks[n - k:], hold.blocks[:n - k]
            freed += self.pool.free(hold.session_id, tail)
            dropped += k
            if account:
                self.held_blocks -= k
                self._add_tier(hold, hold.tier, -k)
        if not hold.blocks and self._holds.get(hold.session_id) is hold:
            del self._holds[hold.session_id]
        if notify and dropped and self._on_release is not None:
            self._on_release(Release(hold.session_id, reason, hold.tier, before, len(hold.blocks)))
        return freed

    def _pin(self, hold: Hold, ttl_s: float, now: float) -> bool:
        mine = len(hold.blocks) if hold.tier == PINNED else 0
        cap = self._owner_pin_cap(hold.owner)
        if self.pinned_blocks - mine + len(hold.blocks) > self.max_pin_blocks:
            hold.refused = "over_budget"
        elif cap is not None and self.pinned_of(hold.owner) - mine + len(hold.blocks) > cap:
            hold.refused = "over_owner_cap"
        else:
            hold.refused = ""
        if hold.refused:
            if hold.tier != PINNED:
                hold.reason += "+" + hold.refused
            return False
        hold.expires_at = now + ttl_s
        self._set(hold, hold.key, PINNED)
        heapq.heappush(self._expiry, (hold.expires_at, hold.session_id))
        return True

    def _set(self, hold: Hold, key: float, tier: int) -> None:
        if key != key:  # NaN would corrupt the heap order
            raise ValueError(f"NaN key for session {hold.session_id!r}")
        if tier != hold.tier:
            n = len(hold.blocks)
            self._add_tier(hold, hold.tier, -n)
            self._add_tier(hold, tier, n)
            if tier != PINNED:
                hold.expires_at = math.inf
        hold.key, hold.tier = key, tier
        self._seq += 1
        hold.seq = self._seq
        heapq.heappush(self._heap, (tier, key, self._seq, hold.session_id))
        self._maybe_compact()

    def _account(self, hold: Hold, sign: int) -> None:
        n = sign * len(hold.blocks)
        self.held_blocks += n
        self._add_tier(hold, hold.tier, n)

    def _add_tier(self, hold: Hold, tier: int, n: int) -> None:
        if tier == SOFT:
            self.soft_blocks += n
        elif tier == PINNED:
            self._add_pinned(hold, n)

    def _add_pinned(self, hold: Hold, n: int) -> None:
        self.pinned_blocks += n
        left = self._pinned_by_owner.get(hold.owner, 0) + n
        if left:
            self._pinned_by_owner[hold.owner] = left
        else:
            self._pinned_by_owner.pop(hold.owner, None)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 4 * len(self._holds) + 256:
            self._heap = [(h.tier, h.key, h.seq, s) for s, h in self._holds.items()]
            heapq.heapify(self._heap)


def _check_unpinned(tier: int) -> int:
    if tier not in (SOFT, PROTECTED):
        raise ValueError("a pin is taken with `pin_ttl_s`/`pin()`, within the budget")
    return tier
