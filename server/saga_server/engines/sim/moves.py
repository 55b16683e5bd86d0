"""KV moves between workers: what each worker reports to the router, and what a steal does.

- **Views**: what each worker would report to the Ray router now: queue = every
  request in flight there (waiting at the admission gate, queued or running), as the
  router counts its requests in flight per replica, so a worker whose gate holds
  requests back does not look idle to placement and steals; KV usage = blocks held
  for live sessions / pool; the sessions whose KV is resident (GPU or host tier),
  which of them are in a tool, and how much KV each holds.
- **A steal moves the KV**: the session's resident prefix (GPU hold, and the host
  and disk tiers' copies beyond it) is sent to the target over the inter-node link
  (`CostModel.move_s`: a fixed cost per move plus the bytes; one transfer at a time
  per worker NIC) and freed on the source at once; when it lands it is inserted into the
  target's pool, evicting idle unpinned prefixes there if needed; what still does not
  fit lands in the target's host tier where it has one (a session's host copy moves
  with it), and only what fits in neither is recomputed later. A pin keeps the rest of
  its TTL. A session in a tool moves at once, so a transfer
  shorter than the tool is hidden and the next request is a full hit; a queued request
  leaves the source queue and joins the target's when its KV lands (keeping its place
  in the order); a running request finishes where it is and the session moves as its
  tool starts. A request arriving while its KV is in flight waits for it.

`KvMoves` is one part of a `Simulator` (`sim`), built by it: it works on the simulator's
workers, sessions, clock, result and event queue.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from saga_server.core.routing import ReplicaView, Steal

from .cache import PINNED
from .events import MOVED, STEAL
from .session import ARRIVE, QUEUED, TOOL, Session, request_key

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Simulator

__all__ = ["KvMoves"]


class KvMoves:
    def __init__(self, sim: "Simulator") -> None:
        self.sim = sim

    def views(self) -> list[ReplicaView]:
        """What each worker would report to the router now (see the module doc)."""
        sim = self.sim
        names, workers = sim._names, sim.workers
        held: list[list[str]] = [[] for _ in workers]
        in_tool: list[list[str]] = [[] for _ in workers]
        sizes: list[dict[str, int]] = [{} for _ in workers]
        bt = sim.cost.block_tokens
        for sid, s in sim._live_sessions.items():
            if s.in_transit:
                continue
            w = workers[s.worker]
            blocks = max(w.cache.cached(sid), _tiered(w.host, sid))
            if w.cache.holds(sid) or blocks > 0:
                held[w.wid].append(sid)
                sizes[w.wid][sid] = blocks * bt
                if s.state == TOOL:
                    in_tool[w.wid].append(sid)
        cap = sim.capacity_blocks
        return [ReplicaView(names[w.wid], queue_len=len(w.gated) + len(w.queue) + w.running,
                            kv_usage=min(w.cache.useful_blocks / cap, 1.0),
                            sessions=frozenset(held[w.wid]), in_tool=frozenset(in_tool[w.wid]),
                            kv_tokens=sizes[w.wid])
                for w in workers]

    def steal_tick(self) -> None:
        sim = self.sim
        if sim._done >= len(sim.instances):
            return
        steal = sim.policy.plan_steal(self.views(), sim.now)
        if steal is not None:
            self._apply_steal(steal)
        sim._push(sim.now + sim.cfg.steal_period_s, STEAL)

    def _apply_steal(self, steal: Steal) -> None:
        sim = self.sim
        s = sim._live_sessions.get(steal.session_id)
        dst = sim._wid.get(steal.target)
        if s is None or dst is None:
            return
        if dst == s.worker:
            s.move_to = -1
            return
        s.move_to = dst
        s.move_in_tool = steal.in_tool
        if not s.in_transit and s.state in (TOOL, QUEUED):
            self.start_move(s)
        # running: moves when its request finishes; in transit: when the KV lands

    def start_move(self, s: Session) -> None:
        """Send the session's resident KV to `s.move_to` and free it here."""
        sim = self.sim
        src, dst = sim.workers[s.worker], sim.workers[s.move_to]
        s.move_to = -1
        sid = s.session_id
        queued = None
        gated = sid in src.gated
        if gated:
            queued = ARRIVE  # its request arrives at the target with the KV
        elif s.state == QUEUED:  # its request leaves this queue and waits for the KV there
            q = src.queue
            i = next(i for i, item in enumerate(q) if item[2].sess is s)
            queued = q[i]
            q[i] = q[-1]
            q.pop()
            heapq.heapify(q)
        request = src.engine.left(request_key(s))  # a request waiting here goes with it
        if request is not None:
            dst.engine.joined(request)
        blocks = 0
        if sim.policy.caches:
            blocks = max(src.cache.cached(sid), _tiered(src.host, sid))
        tier, pin_until = src.cache.tier(sid), src.cache.pin_expires_at(sid)
        src.cache.flush_time()
        src.engine.moved(sid)  # admission is per worker: the target decides afresh
        sim.gate.leave(src, s)
        if src.host is not None:
            src.host.drop(sid)
        src.offloaded.discard(sid)
        src.live -= 1
        dst.live += 1
        s.worker = dst.wid
        tokens = blocks * sim.cost.block_tokens
        dur = sim.cost.move_s(tokens) if tokens else 0.0
        start = max(sim.now, src.net_free, dst.net_free, s.prefetch_ready_at)
        end = start + dur
        if tokens:
            src.net_free = dst.net_free = end
        s.prefetch_ready_at = 0.0
        s.in_transit = True
        s.awaiting_kv = queued
        res = sim.result
        res.steals += 1
        res.steals_in_tool += s.move_in_tool
        res.move_s += dur
        res.steal_log.append((sim.now, sid, src.wid, dst.wid, s.move_in_tool, tokens))
        sim._push(end, MOVED, s, (blocks, tier, pin_until))
        if queued is not None:
            sim._touch(src)  # the queue head may have changed

    def moved(self, s: Session, what: tuple[int, int | None]) -> None:
        """The KV of a moved session lands on its new worker."""
        sim = self.sim
        blocks, tier, pin_until = what
        w = sim.workers[s.worker]
        cache, bt = w.cache, sim.cost.block_tokens
        s.in_transit = False
        sid = s.session_id
        if blocks > 0:
            have = cache.cached(sid)
            need = blocks - have
            if need > 0 and cache.free_blocks < need:
                cache.flush_time()
                evs = cache.evictions(w.engine.room_for_move(need))
                if evs:
                    sim.tiers.evicted(w, evs)
            put = max(min(need, cache.free_blocks), 0)
            if put:
                cache.grow(sid, put)
            parked = 0
            if w.host is not None and need > put:  # the rest lands in the host tier
                w.host.offload(sid, blocks, w.engine.key_of(sid, s.kv_tokens, s.last_access))
                parked = _tiered(w.host, sid) - have - put  # in the host tier, or already on to disk
                if w.host.end(sid) > have + put:
                    w.offloaded.add(sid)
            sim.result.moved_tokens += (put + max(parked, 0)) * bt
            sim.result.move_dropped_tokens += max(blocks - have - put - max(parked, 0), 0) * bt
            waiting = s.awaiting_kv if isinstance(s.awaiting_kv, tuple) else None  # a queued request moves with it
            w.engine.loaded(sid, sim.now, queued_at=waiting[2].arrived_at if waiting is not None else None,
                        pin_until=pin_until if tier == PINNED and s.state == TOOL else 0.0)
            sim._pin_expiry(w, cache.ledger.get(sid))
        waiting, s.awaiting_kv = s.awaiting_kv, None
        if waiting is ARRIVE:
            sim._enqueue(s)
        elif waiting is not None:
            heapq.heappush(w.queue, waiting)
            w.engine.admitted(waiting[2].key)
            sim._touch(w)
        if s.move_to >= 0 and s.state in (TOOL, QUEUED):
            self.start_move(s)


def _tiered(host, session_id: str) -> int:
    """How far (blocks) the session's copies in a worker's host and disk tiers reach."""
    return host.reach(session_id) if host is not None else 0
