"""`SessionTable`: the core's one table of sessions, and the plain `HintSink`.

One `Session` record per id holds what the agent announced (tenant, workflow,
deadline, the node it named, its open tool calls, a short history) and what is
tracked of it: its steps, whether a call runs, and the AEG's fields (graph node,
the edge it is on, the tools it waits on, token counts). The table validates each
hint, applies its announced part and hands the rest to its `Tracker`: a plain
lifecycle (steps, running call) by default, or the AEG (`aeg`), which the workflow
core attaches and which also moves records on engine events.

Rules for hints: an event for a session nobody announced creates it (agents whose
integration missed the start, or a server restart, must still be tracked), except
an end: a `SessionEnd` or `ToolCallEnd` of an unknown or ended session is refused.
A `SessionStart` is refused while a hinted run of that id is live; after an end it
starts a new run, and a session only the engine has seen is replaced by it (its
hints begin now). A tool call key (call id, else tool name) is open at most once,
and a tool end must match an open call.

Memory is bounded once, for both: at most `max_sessions` records and
`history_limit` history entries each. A session expires `idle_ttl_s` after its
last event; an ended one is kept `ended_ttl_s` so late readers still see how it
finished. Expiry runs a few records at a time with every hint (the core runs it on
engine events too) and fully before a listing. A new session that finds the table
full gets the room of expired sessions, else of the session that ended first;
failing that a hint is refused ("too many sessions"), while a session the engine
must serve takes the least recently active one's place. A live session that leaves
(expired, evicted or replaced) is handed to the tracker first.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Callable, Mapping, Protocol, Sequence

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

__all__ = ["Session", "SessionTable", "Tracker"]

_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")
_SWEEP = 8  # records expiry may drop per event: bounded work on the hot path


@dataclass(slots=True)
class Session:
    """One session's record. Owned by a `SessionTable`: change it only under the
    table's lock; readers get `snapshot()` copies."""

    session_id: str
    started_at: float
    last_event_at: float
    tenant: str = ""
    workflow: str = ""  # as announced ("" if none)
    graph: str = "default"  # the learned graph it runs in: its workflow, else its tenant's, else "default"
    deadline_at: float | None = None
    hinted: bool = True  # hints drive its steps (False: only the engine has seen it)
    ended: bool = False
    in_llm: bool = False
    steps: int = 0
    kv_moved: bool = False  # its KV left this engine (a router moved it) until its next request here
    # What the agent announced.
    tool_calls: int = 0
    current_node: str = ""
    open_tools: dict[str, OpenTool] = field(default_factory=dict)  # call key -> open call
    history: deque[HistoryEntry] = field(default_factory=deque)
    # What the AEG tracks (`aeg` documents the model): the edge the session is on
    # (from `node`, via tool key `via`, "" = none), the tools it waits on, tokens.
    node: str = ""
    via: str = ""
    via_category: str = ""
    running_tools: dict[str, tuple[str, str, float, float | None]] = field(default_factory=dict)
    tool_started: float = 0.0
    gap_started: float | None = None  # without hints: when the last response finished
    last_prompt: int = 0
    last_output: int = 0
    context_tokens: int = 0  # KV the session holds now (prompt, plus answer once done)
    base_tokens: int = 0  # context at the end of the last finished call (growth baseline)
    entered_from: tuple[str, str] | None = None  # (node, via) whose growth is pending
    last_llm_start: float | None = None

    @property
    def state(self) -> str:
        """"ended", "llm" (a call runs), "tool" (an announced tool call is open) or "idle"."""
        if self.ended:
            return "ended"
        if self.in_llm:
            return "llm"
        return "tool" if self.open_tools else "idle"

    def snapshot(self, metrics: Mapping[str, float] | None = None) -> SessionSnapshot:
        # A session only the engine has seen shows what was inferred of it.
        return SessionSnapshot(
            session_id=self.session_id,
            tenant=self.tenant,
            workflow=self.workflow if self.hinted else self.graph,
            state=self.state,
            started_at=self.started_at,
            last_event_at=self.last_event_at,
            steps=self.steps,
            tool_calls=self.tool_calls,
            current_node=self.current_node if self.hinted else self.node,
            deadline_at=self.deadline_at,
            open_tools=tuple(self.open_tools.values()),
            history=tuple(self.history),
            metrics=dict(metrics or {}),
        )


class Tracker(Protocol):
    """What moves the tracked part of a table's records (the AEG in the core).
    Called with the table's lock held; must not raise."""

    def on_hint(self, session: Session, event: HintEvent) -> None:
        """A validated hint: its announced part is applied; the table marks ends."""

    def on_drop(self, session: Session, now: float) -> None:
        """A live session leaves the table (expired, evicted, or replaced)."""


class _Lifecycle:
    """The plain table's tracking: steps, and whether a call runs."""

    def on_hint(self, session: Session, event: HintEvent) -> None:
        if isinstance(event, LlmCallStart):
            session.steps += 1
            session.in_llm = True
        elif isinstance(event, (LlmCallEnd, ToolCallStart)):
            session.in_llm = False

    def on_drop(self, session: Session, now: float) -> None:
        pass


class SessionTable:
    """The bounded table of sessions; an in-memory `HintSink` (contract:
    `events.HintSink`; rules and bounds: module docstring)."""

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
        if not idle_ttl_s > 0 or not ended_ttl_s >= 0:
            raise ValueError("idle_ttl_s must be > 0 and ended_ttl_s >= 0")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.ended_ttl_s = ended_ttl_s
        self.history_limit = history_limit
        self._clock = clock
        self.lock = threading.RLock()
        # The records, least recently active first (so expiry stops at the first
        # live one). Read and change only under `lock`.
        self.by_id: OrderedDict[str, Session] = OrderedDict()
        self._ended: dict[str, None] = {}  # ids of ended records, in the order they ended
        self._tracker: Tracker = _Lifecycle()
        self.counters: dict[str, int] = {
            "events_accepted": 0,
            "events_rejected": 0,
            "sessions_started": 0,
            "sessions_ended": 0,
            "sessions_expired": 0,
        }

    def attach(self, tracker: Tracker) -> None:
        """Hand the tracked part of every record to `tracker`, once, before use."""
        if not isinstance(self._tracker, _Lifecycle) or self.by_id:
            raise ValueError("a table takes one tracker, before it holds sessions")
        self._tracker = tracker

    def __len__(self) -> int:
        return len(self.by_id)

    # -- HintSink ---------------------------------------------------------------

    def accept(self, event: HintEvent) -> None:
        with self.lock:
            try:
                session = self._take(event)
            except HintRejected:
                self.counters["events_rejected"] += 1
                raise
            self._announce(session, event)
            self._tracker.on_hint(session, event)
            if isinstance(event, SessionEnd):
                self.end(session)
            self.touch(session, event.time)
            self.counters["events_accepted"] += 1
            self.expire(event.time, _SWEEP)

    def session(self, session_id: str) -> SessionSnapshot | None:
        with self.lock:
            session = self.by_id.get(session_id)
            return None if session is None else session.snapshot()

    def sessions(self, limit: int = 100) -> Sequence[SessionSnapshot]:
        with self.lock:
            return [s.snapshot() for s in self.recent(limit)]

    def stats(self) -> Mapping[str, float]:
        with self.lock:
            states = [s.state for s in self.by_id.values()]
            return {
                **self.counters,
                "sessions_live": len(states) - states.count("ended"),
                "sessions_in_tool": states.count("tool"),
                "sessions_in_llm": states.count("llm"),
                "open_tool_calls": sum(len(s.open_tools) for s in self.by_id.values()),
            }

    # -- for the tracker and the core (lock held) -----------------------------------

    def recent(self, limit: int) -> list[Session]:
        """Up to `limit` records, most recently active first, after a full expiry."""
        with self.lock:
            self.expire()
            return list(islice(reversed(self.by_id.values()), max(0, limit)))

    def admit(self, session_id: str, t: float, *, tenant: str = "", workflow: str = "",
              hinted: bool = True, evict: bool = True) -> Session:
        """A new record for `session_id` at time `t`, replacing any old one. In a
        full table `evict` lets it take the least recently active session's place;
        without it the table refuses (`HintRejected`)."""
        old = self.by_id.get(session_id)
        if old is not None:
            self._remove(old, t)
        elif len(self.by_id) >= self.max_sessions:
            self._make_room(t, evict)
        session = Session(session_id, started_at=t, last_event_at=t, tenant=tenant, workflow=workflow,
                          graph=workflow or tenant or "default", hinted=hinted,
                          history=deque(maxlen=self.history_limit))
        self.by_id[session_id] = session
        self.counters["sessions_started"] += 1
        return session

    def touch(self, session: Session, t: float) -> None:
        """`session` had an event at `t`: it becomes the most recently active."""
        if t > session.last_event_at:
            session.last_event_at = t
        self.by_id.move_to_end(session.session_id)

    def end(self, session: Session) -> None:
        """`session` ended: no call runs and no tool is open; kept `ended_ttl_s`."""
        session.ended = True
        session.in_llm = False
        session.open_tools.clear()
        self._ended[session.session_id] = None
        self.counters["sessions_ended"] += 1

    def expire(self, now: float | None = None, budget: int | None = None) -> list[str]:
        """Drop up to `budget` (default: all) expired sessions; returns their ids."""
        with self.lock:
            now = self._clock() if now is None else now
            limit = len(self.by_id) if budget is None else budget
            gone: list[str] = []
            while self._ended and len(gone) < limit:
                sid = next(iter(self._ended))
                if now - self.by_id[sid].last_event_at < self.ended_ttl_s:
                    break
                self._drop(self.by_id[sid], now)
                gone.append(sid)
            while self.by_id and len(gone) < limit:
                session = next(iter(self.by_id.values()))
                ttl = self.ended_ttl_s if session.ended else self.idle_ttl_s
                if now - session.last_event_at < ttl:
                    break
                self._drop(session, now)
                gone.append(session.session_id)
            return gone

    # -- internals --------------------------------------------------------------

    def _take(self, event: HintEvent) -> Session:
        """The record `event` applies to (admitted if new); raises `HintRejected`
        before changing anything but expiry."""
        sid = event.session_id
        session = self.by_id.get(sid)
        if isinstance(event, SessionStart):
            if session is not None and session.hinted and not session.ended:
                raise HintRejected(f"session {sid!r} already started")
            return self.admit(sid, event.time, tenant=event.tenant, workflow=event.workflow, evict=False)
        if session is None or session.ended:
            if isinstance(event, (SessionEnd, ToolCallEnd)):
                raise HintRejected(f"unknown session {sid!r}")
            return self.admit(sid, event.time, evict=False)
        if isinstance(event, ToolCallStart) and (event.call_id or event.tool) in session.open_tools:
            raise HintRejected(f"tool call {event.call_id or event.tool!r} already open in {sid!r}")
        if isinstance(event, ToolCallEnd) and (event.call_id or event.tool) not in session.open_tools:
            raise HintRejected(f"tool call {event.call_id or event.tool!r} was never started in {sid!r}")
        return session

    def _announce(self, session: Session, event: HintEvent) -> None:
        if isinstance(event, LlmCallStart):
            session.current_node = event.node or session.current_node
        elif isinstance(event, ToolCallStart):
            session.open_tools[event.call_id or event.tool] = OpenTool(event.tool, event.call_id, event.time)
            session.tool_calls += 1
        elif isinstance(event, ToolCallEnd):
            del session.open_tools[event.call_id or event.tool]
        elif isinstance(event, SessionStart) and event.deadline_s is not None:
            session.deadline_at = event.time + event.deadline_s
        session.history.append(HistoryEntry(event.time, _kind(event), _detail(event)))

    def _make_room(self, t: float, evict: bool) -> None:
        self.expire(t)
        if len(self.by_id) >= self.max_sessions and self._ended:
            self._drop(self.by_id[next(iter(self._ended))], t)
        if len(self.by_id) >= self.max_sessions:
            if not evict:
                raise HintRejected(f"too many sessions (limit {self.max_sessions})")
            self._drop(next(iter(self.by_id.values())), t)

    def _drop(self, session: Session, now: float) -> None:
        self._remove(session, now)
        self.counters["sessions_expired"] += 1

    def _remove(self, session: Session, now: float) -> None:
        if not session.ended:
            self._tracker.on_drop(session, now)
        del self.by_id[session.session_id]
        self._ended.pop(session.session_id, None)


def _kind(event: HintEvent) -> str:
    """`ToolCallStart` -> "tool_call_start"."""
    return _SNAKE.sub("_", type(event).__name__).lower()


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
