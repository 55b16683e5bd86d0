"""Session-sticky LRU: the baseline a sceptical operator runs before any agent-aware
cache policy ("fix routing balance, not cache policy").

All three are vLLM's own LRU prefix cache with a host tier (`apc-lru-offload`), the
same tiers SAGA gets; a session stays on the worker it was placed on (no stealing, its
KV never moves). They differ only in where a new session goes:

- `sticky-lru` balances by live load: the least loaded worker by the measure SAGA's
  own router places new sessions with (`saga_server.core.routing.replica_load`:
  requests waiting and running, plus a full KV pool counted as `kv_weight` of them).
  So against `saga` it keeps the routing balance and changes the cache policy (and
  drops the steals); `apc-lru-offload` places by session count (the simulator's
  stock placement), which balances badly when sessions' contexts differ tenfold.
- `prefix-lru` is Ray Serve's `PrefixCacheAffinityRouter` with its defaults (no
  imbalance threshold, a match threshold of 0.1): a new session's prompt matches the
  run's shared prefix on every replica alike, so it goes to the shortest queue
  (requests waiting and running); its later requests match its own replica best and
  stay there.
- `hash-lru` is Ray Serve's `ConsistentHashRouter` (`ray.serve.experimental`): a ring
  of 100 virtual nodes per replica over the session id, no load signal (its docstring:
  mixing in load breaks determinism and therefore affinity). Its fallback to the next
  replica on backpressure is left out: the simulator's workers queue, never reject.

What all leave out: requests of one session never run on two workers, so neither
needs the KV-event feeds a `KVAwareRouter` reads.
"""

from __future__ import annotations

import bisect
import hashlib
from typing import TYPE_CHECKING, Sequence

from saga_server.core.routing import RoutingConfig, replica_load

from ..policy import ApcLruOffload

if TYPE_CHECKING:  # pragma: no cover
    from saga_server.core.routing import ReplicaView

    from ..session import Session

__all__ = ["StickyLru", "PrefixLru", "HashLru"]


class StickyLru(ApcLruOffload):
    name = "sticky-lru"
    routes = True

    def __init__(self, routing: RoutingConfig | None = None) -> None:
        self.routing = routing or RoutingConfig()

    def place(self, s: "Session", views: Sequence["ReplicaView"], now: float) -> str:
        return min(views, key=lambda v: (replica_load(v, self.routing), len(v.sessions), v.replica)).replica


class PrefixLru(ApcLruOffload):
    name = "prefix-lru"
    routes = True

    def place(self, s: "Session", views: Sequence["ReplicaView"], now: float) -> str:
        return min(views, key=lambda v: (v.queue_len, v.kv_usage, v.replica)).replica


VIRTUAL_NODES = 100  # Ray's DEFAULT_NUM_VIRTUAL_NODES


class HashLru(ApcLruOffload):
    name = "hash-lru"
    routes = True

    def __init__(self) -> None:
        self._ring: list[tuple[int, str]] = []
        self._replicas: tuple[str, ...] = ()

    def place(self, s: "Session", views: Sequence["ReplicaView"], now: float) -> str:
        replicas = tuple(v.replica for v in views)
        if replicas != self._replicas:
            self._ring = sorted((_hash(f"{r}:{i}"), r) for r in replicas for i in range(VIRTUAL_NODES))
            self._replicas = replicas
        at = bisect.bisect_left(self._ring, (_hash(s.session_id), ""))
        return self._ring[at % len(self._ring)][1]


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
