"""`SessionChunks`: the chunks one of vLLM's offload tiers holds, by session, in the
core's host-tier order.

vLLM's offload tiers (the CPU tier, `offload.py`; the disk tier below it,
`disk_tier.py`) store KV as chunks keyed by content hash; they know nothing of
sessions. Both drop chunks in one order, the core's (`saga_server.core.host_tier`,
which the simulator's tiers run too): the session the engine's KV policy values least
first, its tail before its head, and a chunk of no known session by its last use.
This is that bookkeeping, shared by both tiers: which session a chunk belongs to,
where in the session's prefix it sits, and which chunks to drop to free room.

The tier owns the chunks' storage and says which may go (`victims`' `droppable`);
this only orders them. The session of a request is the one its kv_hints name, else
the one the engine's plugin saw it arrive with (`attach`); the plugin also tells when
the engine forgot a session: its chunks, in every tier, go first. Without a plugin (plain vLLM) every chunk is ranked by its last
use: LRU. Not thread-safe: each tier calls it from the scheduler's thread.
"""

from __future__ import annotations

import time
import weakref
from typing import Callable, Hashable, Iterable, Sequence

from saga_server.core.host_tier import HostTierOrder
from saga_server.core.sessions import Departure

from .compat import kv_hints_of, session_of_kv_hints

__all__ = ["SessionChunks", "attach", "session_of"]

_plugin = None  # the SagaPlugin of this EngineCore process, if any
_tables: weakref.WeakSet = weakref.WeakSet()  # this process's tiers' tables


def attach(plugin) -> None:
    """Rank chunks by `plugin`'s sessions from now on, and forget the sessions its KV
    policy forgets, in every tier; None: plain LRU."""
    global _plugin
    _plugin = plugin
    if plugin is not None:
        plugin.kv.on_forget(_forgotten)


def session_of(req_context) -> str | None:
    """A request's session (vLLM's `ReqContext`): the one its kv_hints name
    (`compat.session_of_kv_hints`), else the one the engine's plugin saw it arrive
    with; None without a plugin."""
    if _plugin is None:
        return None
    return session_of_kv_hints(kv_hints_of(req_context)) or _plugin.session_of_request(req_context.req_id)


def now() -> float:
    """The plugin's clock (the one its keys are on), else the monotonic one."""
    return _plugin.clock() if _plugin is not None else time.monotonic()


def _forgotten(session_id: str, how: Departure) -> None:
    for table in list(_tables):
        table.forget(session_id)


class SessionChunks:
    def __init__(self) -> None:
        self._session: dict[Hashable, str | None] = {}
        self._position: dict[Hashable, int] = {}
        self._by_session: dict[str, set[Hashable]] = {}
        # Sessions, and chunks of no known session, in the host tier's order.
        self._order = HostTierOrder()
        _tables.add(self)

    def __len__(self) -> int:
        return len(self._session)

    def __contains__(self, chunk: Hashable) -> bool:
        return chunk in self._session

    def __iter__(self):
        return iter(self._session)

    def session(self, chunk: Hashable) -> str | None:
        return self._session.get(chunk)

    def of(self, session_id: str) -> set[Hashable]:
        """The session's chunks held here (empty if none)."""
        return self._by_session.get(session_id, set())

    def add(self, chunk: Hashable, position: int = 0) -> None:
        """A chunk entered the tier; of no known session until `used` says whose."""
        self._position.setdefault(chunk, position)
        if self._session.setdefault(chunk, None) is None:
            self._order.put(chunk, now(), -self._position[chunk])

    def remove(self, chunk: Hashable) -> None:
        self._position.pop(chunk, None)
        sid = self._session.pop(chunk, None)
        if sid is None:
            self._order.remove(chunk)
            return
        chunks = self._by_session[sid]
        chunks.discard(chunk)
        if not chunks:
            del self._by_session[sid]
            self._order.remove(sid)

    def clear(self) -> None:
        for table in (self._session, self._position, self._by_session):
            table.clear()
        self._order = HostTierOrder()

    def used(self, req_context, chunks: Sequence[Hashable], in_order: bool = True) -> None:
        """The request (vLLM's `ReqContext`) used these chunks now: they belong to its
        session, at the positions vLLM recorded in its prefix; `in_order`: they are head
        to tail, so a chunk's index stands for its position where vLLM recorded none."""
        sid = session_of(req_context)
        at = now()
        for i, chunk in enumerate(chunks):
            if chunk not in self._session:
                continue
            position = req_context.get_offload_key_position(chunk)
            if position is not None or in_order:
                self._position[chunk] = i if position is None else position
            if sid is None:
                if self._session[chunk] is None:
                    self._order.put(chunk, at, -self._position[chunk])
                continue
            old = self._session[chunk]
            if old != sid:
                if old is None:
                    self._order.remove(chunk)
                else:
                    self._by_session[old].discard(chunk)
                    if not self._by_session[old]:
                        del self._by_session[old]
                        self._order.remove(old)
                self._session[chunk] = sid
                self._by_session.setdefault(sid, set()).add(chunk)
        if sid is not None and sid in self._by_session:
            self._order.put(sid, _plugin.offload_key(sid, at))

    def forget(self, session_id: str) -> None:
        """The engine forgot the session: its chunks are the first to go."""
        self._order.forget(session_id)

    def victims(self, n: int, droppable: Callable[[Hashable], bool]) -> list[Hashable]:
        """Up to `n` chunks that `droppable` allows, first in the host tier's order
        (`HostTierOrder`: the session of lowest key first, its tail first). Changes
        nothing: the tier drops them, then calls `remove`."""
        if n <= 0:
            return []
        tails: dict[Hashable, list[Hashable]] = {}

        def count(entry: Hashable) -> int:
            chunks: Iterable[Hashable] = self._by_session.get(entry, ()) if isinstance(entry, str) else (entry,)
            ok = sorted((c for c in chunks if droppable(c)), key=lambda c: -self._position.get(c, 0))
            tails[entry] = ok
            return len(ok)

        return [c for entry, k in self._order.victims(n, count) for c in tails[entry][:k]]
