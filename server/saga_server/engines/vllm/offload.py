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

Which session a chunk belongs to and the order itself are `SessionChunks`
(`session_chunks.py`), which the disk tier below this one shares. The policy runs in
the EngineCore process next to the scheduler; the `SagaPlugin` there `attach`es
itself (`session_chunks.attach`), and tells which session each request belongs to. A
session the plugin's KV policy forgets (ended, idled out, evicted from the core's
table, moved away) is forgotten here too: its chunks go first and its requests leave
the request map. Without a plugin (plain vLLM) every chunk is ranked by its last use:
LRU.

A request's session is the one its `kv_hints` name (`compat.session_of_kv_hints`:
a `session_id` in an action's payload), else the one the plugin saw it arrive with.

One class for vLLM 0.32 to 0.34, whose `CachePolicy` differs (`compat`): `insert`
takes the storing request's context where vLLM passes it (0.33 on), and then files
the chunk under that request's session at once (0.32 files it when the request
finishes); `touch` (0.32, 0.33) and `on_request_access` (0.33 on) both observe a
request's use of resident chunks.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Iterable, Sequence

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

from .session_chunks import SessionChunks

__all__ = ["SagaCachePolicy", "tier_occupancy", "POLICY_CONFIG"]

# The connector's extra config that selects this policy.
POLICY_CONFIG = {"eviction_policy": "SagaCachePolicy", "cache_policy_module_path": __name__}

_policies: weakref.WeakSet = weakref.WeakSet()  # this process's tiers (vLLM builds them)
_MAX_REQUESTS = 65_536  # request -> session entries kept for the connector's late calls


def tier_occupancy() -> tuple[int, int]:
    """Chunks this process's tiers in SAGA's order hold, and their capacity."""
    policies = list(_policies)
    return sum(len(p.chunks) for p in policies), sum(p.cache_capacity for p in policies)


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
        self._evictable: set[OffloadKey] = set()
        self._owners = SessionChunks()  # whose each chunk is, in the host tier's order
        _policies.add(self)

    # -- storage -------------------------------------------------------------------

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def session_of(self, key: OffloadKey) -> str | None:
        """The session the chunk is filed under (None: no known session, or not here)."""
        return self._owners.session(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext | None = None) -> None:
        """`req_context`: the storing request's (vLLM 0.33 on; 0.32 passes none)."""
        self.chunks[key] = chunk
        self._owners.add(key)
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
        if req_context is not None:
            self._owners.used(req_context, [key], in_order=False)

    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]
        self._evictable.discard(key)
        self._owners.remove(key)

    def clear(self) -> None:
        self.chunks.clear()
        self._evictable.clear()
        self._owners.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        self._evictable.add(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.discard(key)

    # -- what requests did -----------------------------------------------------------

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """vLLM 0.32 and 0.33 (0.34 has no `touch`)."""
        self._owners.used(req_context, list(keys))

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """vLLM 0.33 on: a request's first access to these keys (some maybe not
        resident; only the new ones, so their order says nothing of their positions)."""
        self._owners.used(req_context, list(keys), in_order=False)

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]], insertion_only_keys: set[OffloadKey],
                            reused_keys: set[OffloadKey], req_context: ReqContext) -> None:
        self._owners.used(req_context, order_request_keys(key_groups, req_context))

    def forget(self, session_id: str) -> None:
        """The engine forgot the session: its chunks are the first to go."""
        self._owners.forget(session_id)

    # -- eviction ----------------------------------------------------------------------

    def evict(self, n: int, protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """The `n` evictable chunks first in the host tier's order (`HostTierOrder`:
        the session of lowest key first, its tail first); all or none."""
        if n == 0:
            return []
        chosen = self._owners.victims(n, lambda k: k in self._evictable and k not in protected
                                      and self.chunks[k].ref_cnt == 0)
        if len(chosen) < n:
            return None
        out = [(k, self.chunks[k]) for k in chosen]
        for k in chosen:
            self.remove(k)
        return out
