"""`SagaRequestRouter`: Ray Serve request routing by `saga_server.core.routing`.

Runs inside the ingress replica's process (one instance per deployment handle).
Per request it reads the session id (`x-session-id` header, which Serve puts in
`PendingRequest.metadata.session_id`, or the body's `session_id`), refreshes the
policy's replica views from the replicas' reports (`report.ReplicaReport`, in
`routing_stats[REPORT_KEY]`) plus its own in-flight counts, and returns the policy's single
choice: a session waits for its home rather than scattering to a free replica.

Reports: a replica whose report could not be read (its engine too busy to
answer within the poll, which is exactly when it is overloaded) keeps its last
good report for up to `report_ttl_s`, so an overload never hides the sessions
that could be moved off it.

Work stealing: every `steal_period_s`, from a ticker on the router's event loop
(not only when a request arrives: an overloaded replica may be receiving none),
`SessionRouter.plan_steal` may move one session off an overloaded replica.
By default only sessions inside a tool call move (`steal_only_in_tool`): a move
re-prefills the prefix on the target, which only a running tool hides; moving a
session whose next request is due makes that request cold (measured with
`benchmarks/ray_routing.py`: steals of any session cost hit rate).
The move is carried out by speculative re-prefill: the session's last request
is replayed with `max_tokens=1` through the ingress (`ingress_url`) under the
session id `saga-move:<replica>:<session>`, which this router pins to the
target; the prefix then sits in the target's cache when the session resumes.
Then the source engine is told to release its copy (`ReleaseSession`): its
pins and holds go, the blocks stay as ordinary evictable cache. A request of the
session that arrives while its re-prefill runs (the tool ended early) waits for
it, up to `move_wait_s`, instead of racing it and arriving cold.
With `kv_transfer="nixl"` (`saga router --kv-transfer nixl`: every engine runs
the NIXL connector) the KV itself moves: the same request goes first to the
source with `do_remote_decode` (under `saga-move:<source>:<session>`), which
holds the blocks and answers with a transfer handle, then to the target with the
handle, which pulls the blocks (`router/kv_move.py`); a pull that cannot
happen (no handle, the source gone, a failed load) re-prefills instead. Counted
as `pulls_ok`, `pulled_tokens`, `pull_seconds`, `pull_fallbacks`.

Cluster-wide Agent Fair Share: on the same ticker, `PeerServiceRelay` tells
every engine what the other engines served per tenant (from the replicas'
reports), so each engine's AFS ranks tenants by cluster-wide service.

Failures: a replica that leaves the candidate list (died, draining) re-homes
its sessions by the same hash over the rest; their next request re-prefills.
Serve does not retry a request already sent to a replica that dies; the SAGA
ingress (`ingress.SagaIngress`) replays it when no answer had started.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
import urllib.request
from typing import Any, List, Optional

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from saga_server.core.routing import ReplicaView, RoutingConfig, SessionRouter
from saga_server.router.kv_move import Endpoint, move_kv

from .engine_calls import PeerServiceRelay, release_session
from .report import REPORT_KEY, ReplicaReport

log = logging.getLogger("ray.serve")

__all__ = ["SagaRequestRouter", "LastGoodReports", "MOVE_PREFIX", "move_session_id", "STATS_KV_KEY"]

MOVE_PREFIX = "saga-move:"
_LAST_BODIES = 4096


def move_session_id(target: str, session_id: str) -> str:
    return f"{MOVE_PREFIX}{target}:{session_id}"


def _parent_of(pending: Optional[PendingRequest]) -> str | None:
    """The parent session a request names (`vllm_xargs.parent_session_id`), if any."""
    xargs = getattr(pending.args[0], "vllm_xargs", None) if pending is not None and pending.args else None
    parent = xargs.get("parent_session_id") if isinstance(xargs, dict) else None
    return parent if isinstance(parent, str) and parent else None


def _session_of(pending: Optional[PendingRequest]) -> str | None:
    if pending is None:
        return None
    sid = getattr(pending.metadata, "session_id", "") or ""
    if not sid and pending.args:
        sid = getattr(pending.args[0], "session_id", None) or ""
    return sid if isinstance(sid, str) and sid else None


class SagaRequestRouter(RequestRouter):
    def initialize_state(self, steal_gap: float = 3.0, steal_period_s: float = 1.0, kv_weight: float = 4.0,
                         steal_only_in_tool: bool = True, steal_cooldown_s: float = 10.0,
                         ingress_url: str | None = None, seed: int = 0, report_ttl_s: float = 30.0,
                         cluster_fair_share: bool = True, move_wait_s: float = 10.0, kv_transfer: str | None = None,
                         **kwargs: Any) -> None:
        self.routing = SessionRouter(RoutingConfig(kv_weight=kv_weight, steal_gap=steal_gap,
                                                steal_only_in_tool=steal_only_in_tool,
                                                steal_cooldown_s=steal_cooldown_s), seed=seed)
        self._steal_period_s = steal_period_s
        self._next_steal_at = 0.0
        self._ingress_url = ingress_url
        self._inflight: collections.Counter[str] = collections.Counter()
        self._req_replica: dict[str, str] = {}
        self._last_body: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self.moves = collections.Counter()
        self.steals: collections.deque = collections.deque(maxlen=200)  # (session, source, target, in_tool)
        self._published_at = 0.0
        self._reports = LastGoodReports(report_ttl_s)
        self._current: dict[str, ReplicaReport] = {}  # replica id -> report used by the last refresh
        self._peers = PeerServiceRelay() if cluster_fair_share else None
        self._ticker: asyncio.Task | None = None
        self._moving: dict[str, asyncio.Event] = {}  # session -> set when its re-prefill is done
        self._move_wait_s = move_wait_s
        self._kv_transfer = kv_transfer  # "nixl": the target pulls the KV (router/kv_move.py)

    # -- Serve hooks ----------------------------------------------------------------------

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        self._start_ticker()
        try:
            self._refresh(candidate_replicas)
            sid = _session_of(pending_request)
            if sid and sid.startswith(MOVE_PREFIX):
                target = sid[len(MOVE_PREFIX):].split(":", 1)[0]
                if target in by_id:
                    return [[by_id[target]]]
                sid = None
            moving = self._moving.get(sid) if sid else None
            if moving is not None:  # its KV is being re-prefilled on the new home: wait for it
                try:
                    await asyncio.wait_for(moving.wait(), self._move_wait_s)
                    self.moves["waited_for_move"] += 1
                except asyncio.TimeoutError:
                    self.moves["move_wait_timeouts"] += 1
            if sid and pending_request is not None and pending_request.args:
                self._last_body[sid] = pending_request.args[0]
                self._last_body.move_to_end(sid)
                while len(self._last_body) > _LAST_BODIES:
                    self._last_body.popitem(last=False)
            route = self.routing.route(sid, list(by_id), dict(self._inflight), parent_id=_parent_of(pending_request))
            self._maybe_steal(list(by_id))
            self._maybe_publish()
            chosen = by_id[route.replica]
            if sid:
                return [[chosen]]  # wait for the home rather than scatter
            return [[chosen], [r for r in candidate_replicas if r is not chosen]]
        except Exception:  # routing must never fail a request: fall back to any replica
            log.exception("SAGA routing failed; falling back to the first candidate")
            return [candidate_replicas]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        rid = getattr(pending_request.metadata, "internal_request_id", None) or pending_request.metadata.request_id
        self._req_replica[rid] = replica_id.unique_id
        self._inflight[replica_id.unique_id] += 1

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        r = self._req_replica.pop(internal_request_id, None)
        if r is not None and self._inflight[r] > 0:
            self._inflight[r] -= 1

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self._inflight.pop(replica_id.unique_id, None)

    # -- internals ------------------------------------------------------------------------

    def _start_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        """Steal and publish on a timer, between requests too."""
        while True:
            await asyncio.sleep(self._steal_period_s)
            try:
                replicas = list(self.curr_replicas.values())
                if replicas:
                    self._refresh(replicas)
                    self._maybe_steal([r.replica_id.unique_id for r in replicas])
                    if self._peers is not None:
                        self._peers.relay(self._current, self._tasks)
                    self._maybe_publish()
            except Exception:
                log.exception("SAGA router tick failed")

    def _refresh(self, replicas: List[RunningReplica]) -> None:
        live = {r.replica_id.unique_id for r in replicas}
        for gone in [r for r in self._inflight if r not in live]:
            del self._inflight[gone]  # a dead replica's requests never complete here
        self._reports.keep_only(live)
        views = []
        self._current = {}
        for r in replicas:
            rep = self._reports.get(r.replica_id.unique_id,
                                    ReplicaReport.from_dict((r.routing_stats or {}).get(REPORT_KEY)))
            self._current[r.replica_id.unique_id] = rep
            # re-prefills run under saga-move ids: their KV belongs to the moved session
            sessions = frozenset(s for s in rep.sessions if not s.startswith(MOVE_PREFIX))
            queue = self._inflight.get(r.replica_id.unique_id, 0)
            views.append(ReplicaView(r.replica_id.unique_id, queue_len=queue, kv_usage=rep.kv_usage,
                                     sessions=sessions, in_tool=rep.in_tool & sessions if sessions else rep.in_tool,
                                     kv_tokens=rep.kv_tokens))
        self.routing.update(views)

    def _maybe_steal(self, candidates: list[str]) -> None:
        now = time.monotonic()
        if now < self._next_steal_at or len(candidates) < 2:
            return
        self._next_steal_at = now + self._steal_period_s
        steal = self.routing.plan_steal(candidates)
        if steal is None:
            return
        self.moves["steals"] += 1
        self.steals.append((steal.session_id, steal.source, steal.target, steal.in_tool))
        if steal.in_tool:
            self.moves["steals_in_tool"] += 1
        log.info("SAGA steal: session %s %s -> %s (in tool: %s)", steal.session_id, steal.source,
                 steal.target, steal.in_tool)
        body = self._last_body.get(steal.session_id) if self._ingress_url else None
        source = self._current.get(steal.source)
        source_addr = source.hint_addr if source is not None else None
        if body is not None:
            self._moving[steal.session_id] = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._move(steal, body, source_addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _move(self, steal, body: Any, source_addr: str | None) -> None:
        """Pull the KV over NIXL or re-prefill it on the target (when the last request
        is known; otherwise the next request re-prefills there), then release the
        source's copy (and, after a pull, what the source held for it under its own
        `saga-move` id)."""
        released = [steal.session_id]
        if body is not None:
            try:
                if self._kv_transfer == "nixl":
                    released.append(move_session_id(steal.source, steal.session_id))
                    await self._pull(steal, body)
                else:
                    await self._reprefill(steal.session_id, steal.target, body)
            finally:
                done = self._moving.pop(steal.session_id, None)
                if done is not None:
                    done.set()
        if source_addr:
            try:
                for session_id in released:
                    await asyncio.to_thread(release_session, source_addr, session_id)
                self.moves["releases_ok"] += 1
            except Exception as exc:  # its pins expire on their own
                self.moves["releases_failed"] += 1
                log.warning("SAGA release of %s on %s failed: %s", steal.session_id, steal.source, exc)

    def stats(self) -> dict[str, Any]:
        """Routing counters, per-replica homes and recent steals (published for
        `saga status`, tests and benchmarks)."""
        moves = dict(self.moves)
        if self._peers is not None:
            moves.update(self._peers.counters)
        return {"routing": self.routing.stats(), "moves": moves, "steals": list(self.steals),
                "inflight": dict(self._inflight), "at": time.time()}

    def _maybe_publish(self) -> None:
        now = time.monotonic()
        if now - self._published_at < 0.5:
            return
        self._published_at = now
        payload = json.dumps(self.stats())
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(_publish, payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pull(self, steal, request: Any) -> None:
        """The target pulls the session's KV from the source over NIXL, each half
        routed through the ingress under a `saga-move` id of its replica; a pull that
        cannot happen re-prefills on the target instead (`move_kv`)."""
        ingress = self._ingress_url.rstrip("/")
        try:
            payload, path = _move_request(request)
            move = await asyncio.to_thread(
                move_kv, Endpoint(ingress, {"X-Session-ID": move_session_id(steal.source, steal.session_id)}),
                Endpoint(ingress, {"X-Session-ID": move_session_id(steal.target, steal.session_id)}),
                payload, path=path)
        except Exception:
            self.moves["reprefills_failed"] += 1
            log.exception("SAGA move of %s to %s failed", steal.session_id, steal.target)
            return
        if move.pulled:
            self.moves["pulls_ok"] += 1
            self.moves["pulled_tokens"] += move.pulled_tokens
            self.moves["pull_seconds"] += move.seconds
            return
        self.moves["pull_fallbacks"] += 1
        self.moves["reprefills_ok" if move.warm else "reprefills_failed"] += 1
        log.warning("SAGA move of %s to %s re-prefilled: %s", steal.session_id, steal.target, move.fallback)

    async def _reprefill(self, session_id: str, target: str, request: Any) -> None:
        try:
            payload, path = _move_request(request)
            ok = await asyncio.to_thread(_post, self._ingress_url.rstrip("/") + path, payload,
                                         move_session_id(target, session_id))
            self.moves["reprefills_ok" if ok else "reprefills_failed"] += 1
        except Exception:
            self.moves["reprefills_failed"] += 1
            log.exception("SAGA re-prefill of %s on %s failed", session_id, target)


STATS_KV_KEY = "saga:router:stats"


class LastGoodReports:
    """A replica's latest report when it is readable, or its last readable one
    while that is younger than `ttl_s` (an engine that did not answer in time is
    reported with the error only: `ReplicaReport.unreadable`)."""

    def __init__(self, ttl_s: float, clock=time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._good: dict[str, tuple[float, ReplicaReport]] = {}

    def get(self, replica: str, report: ReplicaReport) -> ReplicaReport:
        now = self._clock()
        if report.readable:
            self._good[replica] = (now, report)
            return report
        last = self._good.get(replica)
        if last is not None and now - last[0] <= self._ttl_s:
            return last[1]
        return report

    def keep_only(self, replicas: set[str]) -> None:
        for gone in [r for r in self._good if r not in replicas]:
            del self._good[gone]


def _publish(payload: str) -> None:
    """Router stats into Ray's internal KV (one key; best effort)."""
    try:
        from ray.experimental import internal_kv  # noqa: PLC0415

        internal_kv._internal_kv_put(STATS_KV_KEY, payload, overwrite=True)
    except Exception:
        log.debug("publishing SAGA router stats failed", exc_info=True)


def _move_request(request: Any) -> tuple[dict, str]:
    """The session's last request as a one-token, unstreamed move request, and the API
    path it goes to: a completion (`prompt`) or a chat completion (`messages`)."""
    payload = request.model_dump(mode="json", exclude_none=True, exclude_unset=True)
    payload.pop("stream_options", None)
    payload.update(stream=False, max_tokens=1)
    payload.pop("max_completion_tokens", None)
    payload.pop("session_id", None)
    return payload, ("/v1/completions" if "prompt" in payload else "/v1/chat/completions")


def _post(url: str, payload: dict, session_header: str) -> bool:
    req = urllib.request.Request(url, json.dumps(payload).encode(),
                                 {"Content-Type": "application/json", "X-Session-ID": session_header})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return resp.status == 200
    except urllib.error.HTTPError as exc:  # e.g. a truncated tool call: the prefill still happened
        return exc.code < 500
