"""`SessionRegistry`: the plain in-memory `HintSink`.

It knows which sessions exist, which step each is on, which tool calls are open
and a short history of each, and nothing about policy. Memory is bounded twice:
at most `max_sessions` sessions (idle ones expire after `idle_ttl_s`, ended ones
are kept for `ended_ttl_s` so late readers can still see how they finished) and at
most `history_limit` history entries per session.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from .events import (
    HintEvent,
    HintRejected,
    HistoryEntry,
    LlmCallEnd,
    LlmCallStart,
    OpenTool,
    SessionEnd,
    SessionSnapshot,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
)

__all__ = ["SessionRegistry", "SessionRecord"]

_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def event_kind(event: HintEvent) -> str:
    """`ToolCallStart` -> "tool_call_start"."""
    return _SNAKE.sub("_", type(event).__name__).lower()


@dataclass(slots=True)
class SessionRecord:
    """Mutable per-session state. Owned by the registry; read through snapshots."""

    session_id: str
    started_at: float
    last_event_at: float
    tenant: str = ""
    workflow: str = ""
    deadline_at: float | None = None
    state: str = "idle"
    steps: int = 0
    tool_calls: int = 0
    current_node: str = ""
    open_tools: dict[str, OpenTool] = field(default_factory=dict)  # call key -> open call
    history: deque[HistoryEntry] = field(default_factory=deque)

    def snapshot(self, metrics: Mapping[str, float] | None = None) -> SessionSnapshot:
        return SessionSnapshot(
            session_id=self.session_id,
            tenant=self.tenant,
            workflow=self.workflow,
            state=self.state,
            started_at=self.started_at,
            last_event_at=self.last_event_at,
            steps=self.steps,
            tool_calls=self.tool_calls,
            current_node=self.current_node,
            deadline_at=self.deadline_at,
            open_tools=tuple(self.open_tools.values()),
            history=tuple(self.history),
            metrics=dict(metrics or {}),
        )


class SessionRegistry:
    """In-memory `HintSink` (see `events.HintSink` for the contract).

    Events for a session nobody announced create it implicitly: agents whose
    integration missed the start (or a server restart) must still be tracked.
    """

    def __init__(
        self,
        *,
        max_sessions: int = 10_000,
        idle_ttl_s: float = 3600.0,
        ended_ttl_s: float = 300.0,
        history_limit: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1 or history_limit < 1:
            raise ValueError("max_sessions and history_limit must be >= 1")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.ended_ttl_s = ended_ttl_s
        self.history_limit = history_limit
        self._clock = clock
        self._lock = threading.RLock()
        # Least recently touched first, so expiry scans stop at the first live one.
        self._sessions: OrderedDict[str, SessionRecord] = OrderedDict()
        self._counters: dict[str, float] = {
            "events_accepted": 0,
            "events_rejected": 0,
            "sessions_started": 0,
            "sessions_ended": 0,
            "sessions_expired": 0,
        }

    # -- HintSink ---------------------------------------------------------------

    def accept(self, event: HintEvent) -> None:
        with self._lock:
            try:
                self._apply(event)
            except HintRejected:
                self._counters["events_rejected"] += 1
                raise
            self._counters["events_accepted"] += 1

    def session(self, session_id: str) -> SessionSnapshot | None:
        with self._lock:
            record = self._sessions.get(session_id)
            return None if record is None else record.snapshot()

    def sessions(self, limit: int = 100) -> Sequence[SessionSnapshot]:
        with self._lock:
            self.expire()
            newest_first = reversed(self._sessions.values())
            return [r.snapshot() for _, r in zip(range(max(0, limit)), newest_first)]

    def stats(self) -> Mapping[str, float]:
        with self._lock:
            states = [r.state for r in self._sessions.values()]
            return {
                **self._counters,
                "sessions_live": sum(s != "ended" for s in states),
                "sessions_in_tool": states.count("tool"),
                "sessions_in_llm": states.count("llm"),
                "open_tool_calls": sum(len(r.open_tools) for r in self._sessions.values()),
            }

    # -- for richer sinks built on top ---------------------------------------------

    def record(self, session_id: str) -> SessionRecord | None:
        """The live record (not a copy): callers must hold `lock`."""
        return self._sessions.get(session_id)

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def expire(self) -> list[str]:
        """Drop idle and long-ended sessions; returns their ids."""
        now = self._clock()
        gone = []
        with self._lock:
            for sid, record in list(self._sessions.items()):
                ttl = self.ended_ttl_s if record.state == "ended" else self.idle_ttl_s
                if now - record.last_event_at >= ttl:
                    del self._sessions[sid]
                    gone.append(sid)
            self._counters["sessions_expired"] += len(gone)
        return gone

    # -- internals --------------------------------------------------------------

    def _apply(self, event: HintEvent) -> None:
        record = self._sessions.get(event.session_id)
        if isinstance(event, SessionStart):
            if record is not None and record.state != "ended":
                raise HintRejected(f"session {event.session_id!r} already started")
            record = self._admit(event)
            record.tenant, record.workflow = event.tenant, event.workflow
            if event.deadline_s is not None:
                record.deadline_at = event.time + event.deadline_s
        elif record is None or record.state == "ended":
            if isinstance(event, (SessionEnd, ToolCallEnd)):
                raise HintRejected(f"unknown session {event.session_id!r}")
            record = self._admit(event)
        self._transition(record, event)
        record.last_event_at = event.time
        self._sessions.move_to_end(event.session_id)
        record.history.append(HistoryEntry(event.time, event_kind(event), _detail(event)))
        while len(record.history) > self.history_limit:
            record.history.popleft()

    def _admit(self, event: HintEvent) -> SessionRecord:
        if event.session_id not in self._sessions and len(self._sessions) >= self.max_sessions:
            self.expire()
            if len(self._sessions) >= self.max_sessions:
                self._evict_one_ended()
            if len(self._sessions) >= self.max_sessions:
                raise HintRejected(f"too many sessions (limit {self.max_sessions})")
        record = SessionRecord(event.session_id, started_at=event.time, last_event_at=event.time)
        self._sessions[event.session_id] = record
        self._counters["sessions_started"] += 1
        return record

    def _evict_one_ended(self) -> None:
        for sid, record in self._sessions.items():
            if record.state == "ended":
                del self._sessions[sid]
                self._counters["sessions_expired"] += 1
                return

    def _transition(self, record: SessionRecord, event: HintEvent) -> None:
        if isinstance(event, LlmCallStart):
            record.steps += 1
            record.state = "llm"
            record.current_node = event.node or record.current_node
        elif isinstance(event, LlmCallEnd):
            record.state = "tool" if record.open_tools else "idle"
        elif isinstance(event, ToolCallStart):
            key = event.call_id or event.tool
            if key in record.open_tools:
                raise HintRejected(f"tool call {key!r} already open in {record.session_id!r}")
            record.open_tools[key] = OpenTool(event.tool, event.call_id, event.time)
            record.tool_calls += 1
            record.state = "tool"
        elif isinstance(event, ToolCallEnd):
            key = event.call_id or event.tool
            if record.open_tools.pop(key, None) is None:
                raise HintRejected(f"tool call {key!r} was never started in {record.session_id!r}")
            record.state = "tool" if record.open_tools else "idle"
        elif isinstance(event, SessionEnd):
            record.open_tools.clear()
            record.state = "ended"
            self._counters["sessions_ended"] += 1


def _detail(event: HintEvent) -> str:
    if isinstance(event, (LlmCallStart, LlmCallEnd)):
        return event.node
    if isinstance(event, (ToolCallStart, ToolCallEnd)):
        return event.tool
    if isinstance(event, SessionEnd):
        return event.outcome.value
    if isinstance(event, SessionStart):
        return event.workflow
    return ""
