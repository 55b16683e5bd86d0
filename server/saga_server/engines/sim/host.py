"""The host (CPU) tier, and a disk tier below it: copies of KV evicted from a worker's
pool, and bringing them back.

With a host tier (policies with `host_tier`), every tail evicted from a live session's
GPU prefix is copied to host memory; the next admission of that session loads the
contiguous copy over the host link before its prefill, and a policy's `plan_prefetch`
may load it earlier, during the session's tool call, into free GPU blocks. A
session's copies take the policy's key when they are made and again when its request
joins the queue (as vLLM's CPU tier touches what a waiting request looks up); once the
request is scheduled, the pool holds the prefix again and its copies are redundant until
the pool evicts it and copies it again, so they go first. With a disk
tier (`SimConfig.disk_tier_factor`), every copy the host tier takes is written to disk
too (vLLM's tiered offload cascades each stored chunk to its lower tiers, and SAGA's
disk tier on the engine keeps what its bound allows in the same order), so what the
host tier drops may still be on disk; it is read back at `CostModel.disk_bw` after the
host tier's part, by a request or by a prefetch.

`HostOffload` is one part of a `Simulator` (`sim`), built by it: it works on the simulator's
workers, sessions, clock, result and event queue.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from saga_server.core.host_tier import HostTierOrder

from .cache import Eviction
from .events import PREFETCH
from .session import ENDED, TOOL, Session

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Simulator
    from .worker import Worker

__all__ = ["HostTier", "HostOffload"]


class HostTier:
    """CPU copies of evicted KV, per session as the end (in blocks) of the offloaded
    range; the range starts where the GPU entry ends, since eviction is tail-first.
    Bounded by `capacity_blocks` (counting each copy from block 0, conservatively, as
    a write-through tier holds it); when full it drops in the core's host-tier order
    (`saga_server.core.host_tier`, as vLLM's CPU tier under SAGA does): the session of
    lowest key first, its tail first. The key is the worker's KV policy's, taken when
    the session's KV is offloaded. With a disk tier below (`disk`, the same class),
    every copy is written there as well (write-through, as vLLM's tiering spec cascades
    a CPU tier's stores to its file-system tier); the disk drops in the same order."""

    def __init__(self, capacity_blocks: int, disk_blocks: int = 0) -> None:
        """`disk_blocks` > 0: a disk tier below, of that many blocks, in the same order:
        what this tier takes is written there too (a copy of the session's range from
        block 0, like this one), and what the disk drops is gone."""
        self.capacity_blocks = capacity_blocks
        self._ends: dict[str, int] = {}
        self._keys: dict[str, float] = {}
        self._order = HostTierOrder()
        self._total = 0
        self.disk = HostTier(disk_blocks) if disk_blocks > 0 else None

    def offload(self, session_id: str, end_blocks: int, key: float) -> None:
        old = self._ends.get(session_id, 0)
        new = max(old, end_blocks)
        self._ends[session_id] = new
        self._keys[session_id] = key
        self._total += new - old
        self._order.put(session_id, key)
        if self.disk is not None:
            self.disk.offload(session_id, new, key)
        if self._total > self.capacity_blocks:
            for sid, blocks in self._order.victims(self._total - self.capacity_blocks, self._ends.__getitem__):
                self._trim(sid, blocks)

    def end(self, session_id: str) -> int:
        return self._ends.get(session_id, 0)

    def rekey(self, session_id: str, key: float) -> None:
        """The session's copies (this tier's and the disk's) are worth `key` now."""
        if session_id in self._ends:
            self._keys[session_id] = key
            self._order.put(session_id, key)
        if self.disk is not None:
            self.disk.rekey(session_id, key)

    def disk_end(self, session_id: str) -> int:
        """The end (in blocks) of the session's copy on the disk tier (0: none)."""
        return self.disk.end(session_id) if self.disk is not None else 0

    def reach(self, session_id: str) -> int:
        """How far (blocks) the session's copies in this tier and the disk's reach."""
        return max(self.end(session_id), self.disk_end(session_id))

    def drop(self, session_id: str) -> None:
        """Forget the session's copies, this tier's and the disk's."""
        self._total -= self._ends.pop(session_id, 0)
        self._keys.pop(session_id, None)
        self._order.remove(session_id)
        if self.disk is not None:
            self.disk.drop(session_id)

    def _trim(self, session_id: str, blocks: int) -> None:
        """Drop the last `blocks` of the session's copy (the disk tier has its own)."""
        left = self._ends[session_id] - blocks
        if left <= 0:
            self._total -= self._ends.pop(session_id)
            self._keys.pop(session_id, None)
            self._order.remove(session_id)
        else:
            self._ends[session_id] = left
            self._total -= blocks


class HostOffload:
    def __init__(self, sim: "Simulator") -> None:
        self.sim = sim

    def evicted(self, w: Worker, evs: list[Eviction]) -> None:
        sim = self.sim
        host = w.host
        sim.result.evicted_blocks += sum(e.from_blocks - e.to_blocks for e in evs)
        if host is None:
            return
        sessions = sim.sessions
        for e in evs:
            s = sessions[e.session_id]
            if s.state == ENDED or s.worker != w.wid:
                continue
            host.offload(e.session_id, e.from_blocks, w.engine.key_of(e.session_id, s.kv_tokens, s.last_access))
            w.offloaded.add(e.session_id)

    def requested(self, w: Worker, s: Session) -> None:
        """A request of the session joined the worker's queue: its copies take the
        policy's key now, as vLLM's CPU tier touches what a waiting request looks up."""
        if w.host is not None:
            w.host.rekey(s.session_id, w.engine.key_of(s.session_id, s.kv_tokens, s.last_access))

    def loaded(self, w: Worker, s: Session) -> None:
        """The session's request was scheduled with its prefix in the pool: until the
        pool evicts it again (and copies it then), its copies are redundant here, so
        they go first."""
        if w.host is not None:
            w.host.rekey(s.session_id, -math.inf)

    def plan_prefetch(self, w: Worker) -> None:
        sim = self.sim
        cache, host, cost = w.cache, w.host, sim.cost
        bt = cost.block_tokens
        cands = []
        for sid in sorted(w.offloaded):
            s = sim.sessions[sid]
            if s.state != TOOL:
                continue
            have = cache.cached(sid)
            missing = host.reach(sid) - have
            if missing > 0:
                cands.append((sid, missing * bt, self._load_s(host, sid, have, missing)))
        if not cands:
            return
        for sid, start_at in sim.policy.plan_prefetch(w.wid, cands, cache.free_blocks * bt, sim.now):
            sim._push(max(start_at, sim.now), PREFETCH, sim.sessions[sid], None)

    def prefetch(self, s: Session, _unused) -> None:
        sim = self.sim
        w = sim.workers[s.worker]
        if s.state != TOOL or w.host is None:
            return
        cache = w.cache
        have = cache.cached(s.session_id)
        missing = w.host.reach(s.session_id) - have
        blocks = min(missing, cache.free_blocks)
        if blocks <= 0:
            return
        cache.grow(s.session_id, blocks)
        w.engine.loaded(s.session_id, sim.now)
        if blocks == missing:
            w.offloaded.discard(s.session_id)
        tokens = blocks * sim.cost.block_tokens
        w.link_free = max(sim.now, w.link_free) + self._load_s(w.host, s.session_id, have, blocks)
        s.prefetch_ready_at = w.link_free
        sim.result.prefetched_tokens += tokens

    def _load_s(self, host: HostTier, session_id: str, have: int, blocks: int) -> float:
        """Seconds to load `blocks` past the first `have` of the session's prefix: over
        the host link, plus the disk read of the part only the disk tier holds."""
        cost = self.sim.cost
        from_disk = max(have + blocks - max(host.end(session_id), have), 0)
        return cost.transfer_s(blocks * cost.block_tokens) + cost.disk_s(from_disk * cost.block_tokens)
