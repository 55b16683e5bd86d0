"""Hint intake inside vLLM's EngineCore process.

Mechanism (chosen because the scheduler's state lives only in the EngineCore
process, which vLLM spawns): the plugin's `__init__` starts the gRPC
`HintServer` on a thread pool *in that process*, listening on `SAGA_HINT_ADDR`
(set by `saga serve`). Its sink is `EngineHintSink`, which

1. applies each hint to the `WorkflowCore` at once (the core locks internally;
   its predictions are then current for the next scheduling decision), and
2. appends the few hints the scheduler must act on (tool start/end, and
   `ReleaseKv` when the cluster router moved the session away) to a bounded queue
   that `schedule()` drains on the engine thread, so block references are only ever
   touched by the engine loop. A session's end reaches the engine loop as the core's
   session table publishes it (`core.kv_policy`, "Lifecycle").

An observer (`on_event`: the engine's recorder, `recording`) is handed every hint
the core accepted, on the hint thread.

A flood cannot grow memory: the queue drops its oldest entries beyond
`max_queue` (counted in `saga_engine_hints_dropped` and GetStats'
`engine.hints_dropped`); the core bounds its own session table. Reads
(GetSession/ListSessions/ListResident/GetStats) are served by the core; GetSession
adds the KV blocks the engine holds for the session (metric `kv_held_blocks`, from
`held_blocks`), GetStats the engine's own figures (`engine_stats()`, a
`core.EngineStats`).

Keys: `$SAGA_API_KEYS` (a keys file, `saga_server.rpc.keys`) and/or `$SAGA_API_KEY`
(the shared key); the caller of each call goes to the core with the hint (the
ownership rule is the core's). SIGHUP reloads the file in this process; `saga
serve` passes its SIGHUP on here (`saga_server.rpc.reload`).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from saga_server.core import (
    Caller,
    EngineStats,
    HintEvent,
    ResidentSession,
    SessionSnapshot,
    SessionPhase,
    TenantOutcomes,
    ToolCallEnd,
    ToolCallStart,
)
from saga_server.settings import EngineSettings

# Under "vllm." so vLLM's own log handler (and level) shows these lines.
log = logging.getLogger("vllm.saga")

__all__ = ["EngineHintSink", "ReleaseKv", "start_hint_service"]

_ENGINE_EVENTS = (ToolCallStart, ToolCallEnd)  # a session's end reaches the engine as the core publishes it


@dataclass(frozen=True, slots=True)
class ReleaseKv:
    """Engine-only event: drop the session's holds (it moved to another engine)."""

    session_id: str


class EngineHintSink:
    """A `HintSink` for the hint service: the core plus a queue for the engine.
    `engine_stats` reads the engine's figures; the sink adds its own `hints_dropped`."""

    def __init__(self, core, engine_stats: Callable[[], EngineStats] = EngineStats,
                 max_queue: int = 10_000, on_drop: Callable[[], None] = lambda: None,
                 on_accept: Callable[[], None] = lambda: None,
                 on_event: Callable[[HintEvent], None] | None = None,
                 held_blocks: Callable[[str], int] = lambda session_id: 0, block_tokens: int = 0) -> None:
        self.core = core
        self._held_blocks = held_blocks  # read off the engine thread: one dict lookup, a snapshot
        self._block_tokens = block_tokens
        self._on_event = on_event
        self._engine_stats = engine_stats
        self._queue: collections.deque = collections.deque()
        self._max_queue = max_queue
        self._on_drop = on_drop
        self._on_accept = on_accept
        self._lock = threading.Lock()
        self.dropped = 0

    def accept(self, event: HintEvent, caller: Caller | None = None) -> None:
        self.core.accept(event, caller)  # raises HintRejected unchanged: the service reports it
        if isinstance(event, _ENGINE_EVENTS):
            self._enqueue(event)
        _best_effort(self._on_accept)
        if self._on_event is not None:
            _best_effort(self._on_event, event)

    def _enqueue(self, event) -> None:
        with self._lock:
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self.dropped += 1
                self._on_drop()
            self._queue.append(event)

    def drain(self, limit: int = 100_000) -> list[HintEvent]:
        """Take queued engine events (called by the scheduler loop)."""
        with self._lock:
            if not self._queue:
                return []
            n = min(limit, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    def release_session(self, session_id: str, caller: Caller | None = None) -> bool:
        """Queue a `ReleaseKv` for the engine loop (the session moved elsewhere); from
        now on this engine reports the session as not resident."""
        self.core.on_session_moved(session_id, caller)  # AccessDenied: another tenant's
        self._enqueue(ReleaseKv(session_id))
        return True

    def resident_sessions(self, limit: int) -> list[ResidentSession]:
        # Residency is the core's `kv_resident` (served here, not moved away since).
        # Its size lets the cluster router move the cheapest session (`core.routing`).
        return [ResidentSession(s.session_id, in_tool=s.state == SessionPhase.TOOL,
                                kv_tokens=self._held_blocks(s.session_id) * self._block_tokens)
                for s in self.core.sessions(limit)
                if s.state != SessionPhase.ENDED and s.metrics.get("kv_resident", 0.0) > 0]

    def record_peer_service(self, tokens: Mapping[str, float]) -> int:
        return self.core.record_peer_service(tokens)  # AFS only: nothing for the engine loop

    def tenant_outcomes(self) -> Mapping[str, TenantOutcomes]:
        return self.core.tenant_outcomes()

    def session(self, session_id: str, caller: Caller | None = None) -> SessionSnapshot | None:
        snap = self.core.session(session_id, caller)
        if snap is None:
            return None
        return replace(snap, metrics={**snap.metrics, "kv_held_blocks": float(self._held_blocks(session_id))})

    def sessions(self, limit: int = 100, caller: Caller | None = None) -> Sequence[SessionSnapshot]:
        return self.core.sessions(limit, caller)

    def stats(self) -> Mapping[str, float]:
        return self.core.stats()

    def engine_stats(self) -> EngineStats | None:
        try:
            figures = self._engine_stats()
        except Exception:  # a status read must never break on engine figures
            log.exception("engine stats failed")
            return None
        return replace(figures, hints_dropped=self.dropped)


def _best_effort(hook: Callable, *args) -> None:
    """Gauges and recording: the hint itself is applied whatever they do."""
    try:
        hook(*args)
    except Exception:
        log.exception("hint accept hook failed")


def start_hint_service(sink: EngineHintSink, settings: EngineSettings):
    """Start the gRPC hint service for `sink` as the engine's settings say (its
    address, its keys, `scoped_session_ids`). Returns the server, or None when no
    address is configured. A port already in use, or a keys file that cannot be used,
    is logged and skipped: the engine keeps serving without hints (never without the
    keys)."""
    address = settings.hint_addr
    if not address:
        return None
    from saga_server.rpc import HintServer, KeyRing  # noqa: PLC0415  (grpc only when used)
    from saga_server.rpc.reload import register_for_reload, reload_on_sighup  # noqa: PLC0415

    try:
        keys = KeyRing.of(settings.api_keys, settings.api_key)
        server = HintServer(sink, address, keys=keys,
                            scope_agent_ids=settings.scoped_session_ids).start()
    except Exception:
        log.exception("SAGA hint service could not start on %s; serving without hints", address)
        return None
    if keys is not None and keys.path is not None and reload_on_sighup(keys):
        register_for_reload()  # `saga serve` passes its SIGHUP on to this process
    log.info("SAGA hint service (in EngineCore pid %d) listening on %s%s", os.getpid(), server.endpoint,
             f" ({len(keys)} API keys)" if keys is not None else "")
    return server

