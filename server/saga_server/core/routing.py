"""Session routing across replicas: affinity, deterministic homes, work stealing.

Engine-agnostic policy (standard library only) used by the Ray Serve request
router (`saga_server.router`) and usable by the simulator: it sees replicas only
as `ReplicaView`s (what each replica reports: load, KV usage, the sessions whose
KV it holds and which of them are inside a tool call) and returns decisions.

Rules.

- **Home of a new session**: rendezvous (highest-random-weight) hashing of the
  session id over the live replicas. Deterministic, so concurrent first requests
  of one session, or several router processes, pick the same replica without
  talking to each other; when a replica leaves, only its own sessions move.
  Opt-in alternative (`RoutingConfig(new_session="least_loaded")`): the least
  loaded candidate (by `replica_load`, then fewest sessions reported, then id).
  It balances better than a hash but needs fresh views at every decision and
  gives two routers different answers, so the Ray router keeps the hash; the
  simulator, which rebuilds the views from its workers for every decision and has
  one router, uses `least_loaded` (what each costs there: docs/RESEARCH.md, "SAGA
  routing in that simulator").
- **A subagent's home**: a new session that names its parent (`route(...,
  parent_id=)`) starts on its parent's replica when that is a candidate: a child
  usually shares its parent's system prompt and tool definitions, which that
  replica holds, and the parent waits there for it.
- **Affinity**: once a session has a home it goes there. Homes come from this
  router's own decisions and, for sessions it has not seen (after a router
  restart, or from another router), from replica reports of KV residency.
- **Re-homing**: a session whose home is no longer a candidate (replica died or
  is draining) gets a new home by the same rule (hash, or least loaded) over the
  live replicas; its next request re-prefills there.
- **Work stealing** (`plan_steal`, called periodically): when the most loaded
  replica's load exceeds the least loaded one's by `steal_gap`, one session homed
  on it moves to the least loaded replica. Victims inside a tool call are
  preferred (the move, and the re-prefill of its prefix on the target, hide
  behind the tool). Among those, where the replica reports each session's KV
  size (`ReplicaView.kv_tokens`), the one holding the least KV moves: any one
  session takes its future requests off the source alike, and the smallest costs
  the least to move and to fit on the target (a long-context session can hold
  more than the load gap is worth). Ties, and replicas that report no sizes, are
  drawn at random (seeded), so two routers do not keep moving the same session.
  A session moves at most once per `steal_cooldown_s`. The caller moves the KV
  (transfer or speculative re-prefill on the target) and tells the old replica to
  drop its copy.
- **Reactive stealing** (in `route`): a request whose home is overloaded by more
  than `reactive_gap` goes to the least loaded replica instead (its prefix is
  recomputed there); off by default because it trades a cold request for queueing.

Load of a replica = queue_len + kv_weight * kv_usage (queue = requests in flight
or waiting there; kv_usage in [0, 1]).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

__all__ = [
    "RoutingConfig", "ReplicaView", "Route", "Steal", "SessionRouter", "home_replica", "replica_load",
    "NEW_SESSION_RULES",
]


NEW_SESSION_RULES = ("hash", "least_loaded")


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    kv_weight: float = 4.0  # a full KV pool counts like this many queued requests
    steal_gap: float = 3.0  # plan_steal moves a session when load(src) - load(dst) >= this
    steal_only_in_tool: bool = False  # True: never move a session that is not inside a tool call
    steal_cooldown_s: float = 10.0  # a session moves at most once per this many seconds
    reactive_gap: float | None = None  # route() overrides the home when its load exceeds the best by this
    max_sessions: int = 100_000  # homes remembered (LRU beyond)
    new_session: str = "hash"  # home of a new session: "hash" (rendezvous) or "least_loaded"

    def __post_init__(self) -> None:
        if self.new_session not in NEW_SESSION_RULES:
            raise ValueError(f"new_session must be one of {NEW_SESSION_RULES}, not {self.new_session!r}")
        if self.kv_weight < 0 or self.steal_gap <= 0 or self.steal_cooldown_s < 0 or self.max_sessions < 1:
            raise ValueError(f"invalid RoutingConfig: {self}")
        if self.reactive_gap is not None and self.reactive_gap <= 0:
            raise ValueError("reactive_gap must be positive or None")


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What one replica reports (all optional except its id)."""

    replica: str
    queue_len: int = 0
    kv_usage: float = 0.0
    sessions: frozenset[str] = frozenset()  # sessions whose KV it holds
    in_tool: frozenset[str] = frozenset()  # of those, sessions inside a tool call
    # KV tokens it holds per session (GPU and host tier), where it reports them
    kv_tokens: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Route:
    replica: str
    reason: str  # "affinity", "home" (new session), "parent" (a new subagent, at its parent's), "rehome"
    # (home gone), "steal" (reactive), "no-session"
    moved_from: str | None = None


@dataclass(frozen=True, slots=True)
class Steal:
    session_id: str
    source: str
    target: str
    in_tool: bool


def _weight(session_id: str, replica: str) -> bytes:
    return hashlib.sha256(f"{session_id}\x00{replica}".encode()).digest()


def home_replica(session_id: str, replicas: Iterable[str]) -> str:
    """Rendezvous hashing: the replica with the highest hash of (session, replica)."""
    pool = list(replicas)
    if not pool:
        raise ValueError("no replicas to choose from")
    return max(pool, key=lambda r: (_weight(session_id, r), r))


def replica_load(view: ReplicaView | None, config: RoutingConfig, extra_queue: int = 0) -> float:
    if view is None:
        return float(extra_queue)
    return max(view.queue_len, extra_queue) + config.kv_weight * min(1.0, max(0.0, view.kv_usage))


@dataclass
class _Home:
    replica: str
    moved_at: float = field(default=-1e18)


class SessionRouter:
    """Router state: session homes plus the latest replica reports. Thread-safe."""

    def __init__(self, config: RoutingConfig | None = None, *, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or RoutingConfig()
        self._rng = random.Random(seed)
        self._clock = clock
        self._homes: OrderedDict[str, _Home] = OrderedDict()
        self._views: dict[str, ReplicaView] = {}
        self._lock = threading.Lock()
        self.counters: dict[str, int] = {k: 0 for k in ("affinity", "home", "parent", "rehome", "steal", "no-session",
                                                         "planned_steals", "learned")}

    # -- reports ------------------------------------------------------------------------

    def update(self, views: Iterable[ReplicaView]) -> None:
        """Replace the replica reports. Sessions this router has no home for take the
        replica reporting their KV as home (recovery after a router restart)."""
        with self._lock:
            self._views = {v.replica: v for v in views}
            for v in self._views.values():
                for sid in v.sessions:
                    if sid not in self._homes:
                        self._remember(sid, _Home(v.replica))
                        self.counters["learned"] += 1

    def views(self) -> dict[str, ReplicaView]:
        with self._lock:
            return dict(self._views)

    def home_of(self, session_id: str) -> str | None:
        with self._lock:
            h = self._homes.get(session_id)
            return h.replica if h else None

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._homes.pop(session_id, None)

    def homes(self) -> dict[str, str]:
        with self._lock:
            return {s: h.replica for s, h in self._homes.items()}

    # -- decisions ----------------------------------------------------------------------

    def route(self, session_id: str | None, candidates: Sequence[str],
              queue_lens: Mapping[str, int] | None = None, parent_id: str | None = None) -> Route:
        """The replica for one request. `candidates`: replicas that can take it now;
        `queue_lens`: fresher in-flight counts than the reports (optional);
        `parent_id`: the session that spawned this one, if it said."""
        if not candidates:
            raise ValueError("no candidate replicas")
        queue_lens = queue_lens or {}
        with self._lock:
            def load(r: str) -> float:
                return replica_load(self._views.get(r), self.config, queue_lens.get(r, 0))

            if not session_id:
                self.counters["no-session"] += 1
                return Route(min(candidates, key=lambda r: (load(r), r)), "no-session")

            def new_home() -> str:
                if self.config.new_session == "least_loaded":
                    return min(candidates, key=lambda r: (load(r), self._reported_sessions(r), r))
                return home_replica(session_id, candidates)

            home = self._homes.get(session_id)
            parent = self._homes.get(parent_id) if parent_id and home is None else None
            if parent is not None and parent.replica in candidates:
                route = Route(parent.replica, "parent")
            elif home is None:
                route = Route(new_home(), "home")
            elif home.replica not in candidates:
                route = Route(new_home(), "rehome", home.replica)
            else:
                route = Route(home.replica, "affinity")
                gap = self.config.reactive_gap
                if gap is not None and len(candidates) > 1:
                    best = min(candidates, key=lambda r: (load(r), r))
                    if best != home.replica and load(home.replica) - load(best) >= gap:
                        route = Route(best, "steal", home.replica)
            moved_at = self._clock() if route.reason == "steal" else (home.moved_at if home else -1e18)
            self._remember(session_id, _Home(route.replica, moved_at))
            self.counters[route.reason] += 1
            return route

    def plan_steal(self, candidates: Sequence[str] | None = None) -> Steal | None:
        """One session to move off the most loaded replica, or None. Applies the move
        to the homes at once (the caller carries out the KV move)."""
        with self._lock:
            pool = [r for r in (candidates if candidates is not None else self._views) if r in self._views]
            if len(pool) < 2:
                return None
            cfg = self.config
            loads = {r: replica_load(self._views[r], cfg) for r in pool}
            src = max(pool, key=lambda r: (loads[r], r))
            dst = min(pool, key=lambda r: (loads[r], r))
            if loads[src] - loads[dst] < cfg.steal_gap:
                return None
            now = self._clock()
            view = self._views[src]
            homed = sorted(s for s, h in self._homes.items()
                           if h.replica == src and now - h.moved_at >= cfg.steal_cooldown_s)
            in_tool = [s for s in homed if s in view.in_tool]
            pick_from = in_tool or ([] if cfg.steal_only_in_tool else homed)
            if not pick_from:
                return None
            if view.kv_tokens:  # the cheapest move relieves the same future load
                least = min(view.kv_tokens.get(s, 0) for s in pick_from)
                pick_from = [s for s in pick_from if view.kv_tokens.get(s, 0) == least]
            sid = self._rng.choice(pick_from)
            self._remember(sid, _Home(dst, now))
            self.counters["planned_steals"] += 1
            return Steal(sid, src, dst, sid in view.in_tool)

    def stats(self) -> dict[str, float]:
        with self._lock:
            out = {f"routes_{k}" if k not in ("planned_steals", "learned") else k: float(v)
                   for k, v in self.counters.items()}
            out["sessions_homed"] = float(len(self._homes))
            for r in self._views:
                out[f"replica_sessions{{{r}}}"] = float(sum(1 for h in self._homes.values() if h.replica == r))
            return out

    def _reported_sessions(self, replica: str) -> int:
        view = self._views.get(replica)
        return len(view.sessions) if view is not None else 0

    def _remember(self, session_id: str, home: _Home) -> None:
        self._homes[session_id] = home
        self._homes.move_to_end(session_id)
        while len(self._homes) > self.config.max_sessions:
            self._homes.popitem(last=False)
