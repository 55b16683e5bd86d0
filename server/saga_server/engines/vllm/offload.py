"""`SagaCachePolicy`: vLLM's CPU offload tier in SAGA's order.

vLLM's `OffloadingConnector` (`--kv-offloading-size`) keeps evicted KV in CPU memory,
chunk by chunk, and drops chunks LRU (or ARC) first when full: it knows blocks, not
sessions, so a session about to come back loses its KV as readily as one whose agent
has gone. This is a `CachePolicy` for vLLM's `CPUOffloadingManager` (loaded out of
tree: `eviction_policy: SagaCachePolicy`, `cache_policy_module_path:
saga_server.engines.vllm.offload` in the connector's extra config; `saga serve` adds
them whenever `--kv-offloading-size` is given) that drops chunks in the host tier's
order (`saga_server.core.host_tier`, the simulator's host tier runs the same): the
session the engine's KV policy values least first, keyed when its chunks were last
used, a session's tail chunks before its head, and chunks of no known session by
their last use (the key's LRU case).

The policy runs in the EngineCore process next to the scheduler; the `SagaPlugin`
there `attach`es itself, and tells which session each request belongs to. A session
the plugin's KV policy forgets (ended, idled out, evicted from the core's table,
moved away) is forgotten here too: its chunks go first and its requests leave the
request map. Without a plugin (plain vLLM) every chunk is ranked by its last use: LRU.

A request's session is the one its `kv_hints` name (`compat.session_of_kv_hints`:
a `session_id` in an action's payload), else the one the plugin saw it arrive with.

One class for vLLM 0.32 to 0.34, whose `CachePolicy` differs (`compat`): `insert`
takes the storing request's context where vLLM passes it (0.33 on), and then files
the chunk under that request's session at once (0.32 files it when the request
finishes); `touch` (0.32, 0.33) and `on_request_access` (0.33 on) both observe a
request's use of resident chunks.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from typing import Iterable, Sequence

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

from saga_server.core.host_tier import HostTierOrder
from saga_server.core.sessions import Departure

from .compat import kv_hints_of, session_of_kv_hints

__all__ = ["SagaCachePolicy", "attach", "tier_occupancy", "POLICY_CONFIG"]

# The connector's extra config that selects this policy.
POLICY_CONFIG = {"eviction_policy": "SagaCachePolicy", "cache_policy_module_path": __name__}

_plugin = None  # the SagaPlugin of this EngineCore process, if any
_policies: weakref.WeakSet = weakref.WeakSet()  # this process's tiers (vLLM builds them)
_MAX_REQUESTS = 65_536  # request -> session entries kept for the connector's late calls


def attach(plugin) -> None:
    """Rank chunks by `plugin`'s sessions from now on, and forget the sessions its KV
    policy forgets (see the module docstring); None: plain LRU."""
    global _plugin
    _plugin = plugin
    if plugin is not None:
        plugin.kv.on_forget(_forgotten)


def tier_occupancy() -> tuple[int, int]:
    """Chunks this process's tiers in SAGA's order hold, and their capacity."""
    policies = list(_policies)
    return sum(len(p.chunks) for p in policies), sum(p.cache_capacity for p in policies)


def _forgotten(session_id: str, how: Departure) -> None:
    for policy in list(_policies):
        policy.forget(session_id)


class RequestSessions:
    """Request id -> session id, for requests the connector may still ask about;
    at most `_MAX_REQUESTS`, oldest first out, and none of a forgotten session."""

    def __init__(self) -> None:
        self._map: OrderedDict[str, str] = OrderedDict()
        self._of: dict[str, set[str]] = {}  # session -> its request ids in the map

    def __len__(self) -> int:
        return len(self._map)

    def add(self, request_id: str, session_id: str) -> None:
        self._map[request_id] = session_id
        self._of.setdefault(session_id, set()).add(request_id)
        while len(self._map) > _MAX_REQUESTS:
            self._unlink(*self._map.popitem(last=False))

    def get(self, request_id: str) -> str | None:
        return self._map.get(request_id)

    def forget(self, session_id: str) -> None:
        for request_id in self._of.pop(session_id, ()):
            self._map.pop(request_id, None)

    def _unlink(self, request_id: str, session_id: str) -> None:
        ids = self._of.get(session_id)
        if ids is not None:
            ids.discard(request_id)
            if not ids:
                del self._of[session_id]


class SagaCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self._session: dict[OffloadKey, str | None] = {}
        self._position: dict[OffloadKey, int] = {}
        self._by_session: dict[str, set[OffloadKey]] = {}
        self._evictable: set[OffloadKey] = set()
        # Sessions, and chunks of no known session, in the host tier's order.
        self._order = HostTierOrder()
        _policies.add(self)

    # -- storage -------------------------------------------------------------------

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext | None = None) -> None:
        """`req_context`: the storing request's (vLLM 0.33 on; 0.32 passes none)."""
        self.chunks[key] = chunk
        self._position.setdefault(key, 0)
        if self._session.setdefault(key, None) is None:
            self._order.put(key, _now(), -self._position[key])
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
        if req_context is not None:
            self._observe([key], req_context, in_order=False)

    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]
        self._position.pop(key, None)
        self._evictable.discard(key)
        sid = self._session.pop(key, None)
        if sid is None:
            self._order.remove(key)
            return
        keys = self._by_session[sid]
        keys.discard(key)
        if not keys:
            del self._by_session[sid]
            self._order.remove(sid)

    def clear(self) -> None:
        for table in (self.chunks, self._session, self._position, self._by_session):
            table.clear()
        self._evictable.clear()
        self._order = HostTierOrder()

    def mark_evictable(self, key: OffloadKey) -> None:
        self._evictable.add(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.discard(key)

    # -- what requests did -----------------------------------------------------------

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """vLLM 0.32 and 0.33 (0.34 has no `touch`)."""
        self._observe(list(keys), req_context)

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """vLLM 0.33 on: a request's first access to these keys (some maybe not
        resident; only the new ones, so their order says nothing of their positions)."""
        self._observe(list(keys), req_context, in_order=False)

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]], insertion_only_keys: set[OffloadKey],
                            reused_keys: set[OffloadKey], req_context: ReqContext) -> None:
        self._observe(order_request_keys(key_groups, req_context), req_context)

    def _observe(self, keys: list[OffloadKey], req_context: ReqContext, in_order: bool = True) -> None:
        """The keys belong to this request's session, used now; `in_order`: they are
        head to tail, so a key's index stands for its position where vLLM recorded none."""
        sid = self._session_of(req_context)
        now = _now()
        for i, key in enumerate(keys):
            if key not in self.chunks:
                continue
            position = req_context.get_offload_key_position(key)
            if position is not None or in_order:
                self._position[key] = i if position is None else position
            if sid is None:
                if self._session[key] is None:
                    self._order.put(key, now, -self._position[key])
                continue
            old = self._session[key]
            if old != sid:
                if old is None:
                    self._order.remove(key)
                else:
                    self._by_session[old].discard(key)
                self._session[key] = sid
                self._by_session.setdefault(sid, set()).add(key)
        if sid is not None and sid in self._by_session:
            self._order.put(sid, _plugin.offload_key(sid, now))

    @staticmethod
    def _session_of(req_context: ReqContext) -> str | None:
        """The request's session: the one its kv_hints name, else the plugin's map."""
        if _plugin is None:
            return None
        return session_of_kv_hints(kv_hints_of(req_context)) or _plugin.session_of_request(req_context.req_id)

    def forget(self, session_id: str) -> None:
        """The engine forgot the session: its chunks are the first to go."""
        self._order.forget(session_id)

    # -- eviction ----------------------------------------------------------------------

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """The `n` evictable chunks first in the host tier's order (`HostTierOrder`:
        the session of lowest key first, its tail first); all or none."""
        if n == 0:
            return []
        tails: dict[object, list[OffloadKey]] = {}

        def droppable(entry) -> int:
            keys = self._by_session.get(entry, ()) if isinstance(entry, str) else (entry,)
            ok = [k for k in keys if k in self._evictable and k not in protected and self.chunks[k].ref_cnt == 0]
            ok.sort(key=lambda k: -self._position.get(k, 0))
            tails[entry] = ok
            return len(ok)

        victims = self._order.victims(n, droppable)
        chosen = [k for entry, count in victims for k in tails[entry][:count]]
        if len(chosen) < n:
            return None
        out = [(k, self.chunks[k]) for k in chosen]
        for k in chosen:
            self.remove(k)
        return out


def _now() -> float:
    return _plugin.clock() if _plugin is not None else time.monotonic()
