"""Session-sticky LRU: the baseline a sceptical operator runs before any agent-aware
cache policy ("fix routing balance, not cache policy").

All three are vLLM's own LRU prefix cache with a host tier (`apc-lru-offload`), the
same tiers SAGA gets; a session stays on the worker it was placed on (no stealing, its
KV never moves). They differ only in where a new session goes:

- `sticky-lru` balances by live load: the worker whose live sessions hold the least KV
  (GPU and host tier, as the workers report it), a session that holds none yet
  counted at the cluster's mean per session. Session counts alone (the simulator's
  stock placement, which `apc-lru-offload` uses) balance badly when sessions' contexts
  differ tenfold; tokens are what the pool holds.
- `prefix-lru` is Ray Serve's `PrefixCacheAffinityRouter` with its defaults (no
  imbalance threshold, a 10% match threshold): a new session's prompt matches the
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

from ..policy import ApcLruOffload

if TYPE_CHECKING:  # pragma: no cover
    from saga_server.core.routing import ReplicaView

    from ..session import Session

__all__ = ["StickyLru", "PrefixLru", "HashLru"]


class StickyLru(ApcLruOffload):
    name = "sticky-lru"
    routes = True

    def __init__(self) -> None:
        self._home: dict[str, str] = {}  # live session -> its worker

    def place(self, s: "Session", views: Sequence["ReplicaView"], now: float) -> str:
        held = [sum(v.kv_tokens.values()) for v in views]
        holding = sum(len(v.kv_tokens) for v in views)
        per_session = sum(held) / holding if holding else 0.0
        homed: dict[str, int] = {}
        for home in self._home.values():
            homed[home] = homed.get(home, 0) + 1

        def live_load(i: int) -> float:
            v = views[i]
            waiting = max(0, homed.get(v.replica, 0) - len(v.kv_tokens))  # placed, holding nothing yet
            return held[i] + waiting * per_session

        best = min(range(len(views)), key=lambda i: (live_load(i), homed.get(views[i].replica, 0), i))
        self._home[s.session_id] = views[best].replica
        return views[best].replica

    def on_session_end(self, s: "Session", now: float) -> None:
        self._home.pop(s.session_id, None)


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
