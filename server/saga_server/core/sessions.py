"""`SessionTable`: the core's one table of sessions, and the plain `HintSink`.

One `SessionRecord` per id holds what the agent announced (tenant, workflow,
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

Ownership (only for calls that come with a `Caller`; the engine's own calls and a
service without keys come without one and pass): a session belongs to the tenant
whose key started it (`SessionRecord.owner`; an admin's session to the tenant it names,
else its own). An agent acts as its key's tenant: a `SessionStart` naming
another tenant is refused (an empty tenant becomes the caller's); any hint, read
or release of a session another tenant owns is refused, ended or not, until the
record expires; a session nobody owns yet (only the engine has seen it, or it was
started without a key) becomes the caller's with its first hint, unless it
already names another tenant, and until then only an admin reads or releases it.
An agent's hints name only ids its tenant may own (`scopes.owns_scope`): an id
`<tag>/...` is scoped to the tenant of its tag, as the front doors write them,
so no other key can create, claim or squat a tenant's session ids.
`sessions` lists the caller's own. Limits of the
caller's tenant: a new session (or a claim) beyond `max_sessions` live ones is
refused, and a declared deadline (a task's or a turn's) shorter than
`min_deadline_s` is raised to it (clamped, not refused: the session keeps its
hints, it just cannot jump the queue). Admins pass the ownership checks. Each refusal raises `AccessDenied`
(nothing changes) and is counted: `denied_tenant_claim`, `denied_foreign_session`,
`denied_foreign_scope`, `denied_session_limit`, `denied_read`, `denied_release`;
`deadline_clamped` and `list_withheld` (listings that left sessions out) count the
rest.

Memory is bounded once, for both: at most `max_sessions` records and
`history_limit` history entries each. A session expires `idle_ttl_s` after its
last event, or `human_idle_ttl_s` while it waits on its user's turn (an open call
of category `human`: a person's reply takes minutes to hours, a tool's seconds) or
on its own LLM call (a request waiting in an overloaded engine's queue sends no
hints, and forgetting its session would throw its KV away just before it runs);
an ended one is kept `ended_ttl_s` so late readers still see how it
finished. Expiry runs a few records at a time with every hint (the core runs it on
engine events too) and fully before a listing. A new session that finds the table
full gets the room of expired sessions, else of the session that ended first;
failing that a hint is refused ("too many sessions"), while a session the engine
must serve takes the least recently active one's place. A live session that leaves
(expired, evicted or replaced) is handed to the tracker first.

Subagent trees: a `SessionStart` with a `parent_id` makes the session a child of
that parent when the parent is live, belongs to the same owner and tenant, and is
not the child itself or one of its descendants; otherwise the session starts as a
root (counted `subagent_parent_refused`). A tree is one task: a child's
`task_started_at` is its root's start (task seniority, `fairshare`), and a child
that declares no deadline has its parent's deadline in force. A parent counts its
live children (`SessionRecord.children`); a child that stops being live leaves that count. Both
changes are published to `subscribe_parents` listeners (`ParentChanged`): a child
starting is its parent's wait starting, as a tool call is, so an engine decides
the parent's hold again (`kv_policy`). Same rules as the lifecycle listeners below.

Lifecycle: the table publishes, once per run of an id, how a session stopped being
live (`Departure`): `ENDED` (its end hint), `EXPIRED` (idle past `idle_ttl_s`) or
`EVICTED` (its place taken in a full table). A session only the engine has seen that a
`SessionStart` replaces is the same agent going on: not published. Every
per-session table outside this one (an engine's holds, admission, prefetcher,
request maps) subscribes (`subscribe`) instead of being told by hand, so a session
nobody ends is forgotten everywhere once it idles out. A user turn that ends
(`turns`: a `human` call starts, or the session ends during a turn) is published
to `subscribe_turns` listeners (`TurnEnded`). Listeners run with the
table's lock held, on whichever thread changed the table: they must be quick,
must not raise, and must not call back into the table (an engine loop queues
the id and acts on its own thread).
"""

from __future__ import annotations

import enum
import re
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Callable, Mapping, NoReturn, Protocol, Sequence, get_args

from .events import (
    AccessDenied,
    Caller,
    HintEvent,
    HintRejected,
    HistoryEntry,
    LlmCallEnd,
    LlmCallStart,
    OpenTool,
    SessionEnd,
    SessionSnapshot,
    SessionStart,
    SessionPhase,
    ToolCallEnd,
    ToolCallStart,
)
from .categories import HUMAN, guess_category
from .scopes import owns_scope, tag
from .tool_keys import NO_TOOL, ToolKey
from .turns import begin_turn, end_turn, sooner, turn_open

__all__ = ["SessionRecord", "SessionTable", "MAX_SESSIONS", "SESSION_IDLE_S", "Tracker", "SessionGone", "ParentChanged", "TurnEnded", "Departure"]


# An engine's or a hint service's table, unless configured: the bound that holds its
# memory, and how long a silent session is kept.
MAX_SESSIONS = 50_000
SESSION_IDLE_S = 1800.0


class Departure(enum.StrEnum):
    """How a session stopped being live somewhere: the table publishes the first
    three ("Lifecycle" above); an engine's KV policy adds `MOVED`. The values are
    the metrics' labels and the traces' end reasons."""

    ENDED = "ended"  # its end hint
    EXPIRED = "expired"  # idle past its TTL
    EVICTED = "evicted"  # its place taken in a full table
    MOVED = "moved"  # its KV left this engine for another (`kv_policy`)


SessionGone = Callable[[str, Departure], None]  # (session id, how: ENDED / EXPIRED / EVICTED)
ParentChanged = Callable[[str, bool], None]  # (parent id, a child started (True) or stopped (False))
TurnEnded = Callable[["SessionRecord", float], None]  # (the session's record, the turn's span in seconds)

_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")
_MAX_DEPTH = 64  # ancestors a link checks for a cycle; deeper trees are refused
_SWEEP = 8  # records expiry may drop per event: bounded work on the hot path
_KINDS = {cls: _SNAKE.sub("_", cls.__name__).lower() for cls in get_args(HintEvent)}  # once, not per hint


@dataclass(slots=True)
class SessionRecord:
    """One session's record. Owned by a `SessionTable`: change it only under the
    table's lock; readers get `snapshot()` copies."""

    session_id: str
    started_at: float
    last_event_at: float
    tenant: str = ""
    workflow: str = ""  # as announced ("" if none)
    graph: str = "default"  # the learned graph it runs in: its workflow, else its tenant's, else "default"
    deadline_at: float | None = None  # in force: the task's, or its user turn's if sooner (`turns`)
    task_deadline_at: float | None = None  # the whole task's (its own, else its parent's)
    turn_deadline_s: float | None = None  # each user turn's allowance (`turns`)
    turn_started_at: float | None = None  # its running user turn's start (None: none runs)
    turn_steps: int = 0  # its steps when that turn started
    parent: str = ""  # the session that spawned it ("" = a root)
    children: set[str] = field(default_factory=set)  # its live children
    task_started_at: float = 0.0  # when its tree's root started (its own start for a root)
    hinted: bool = True  # hints drive its steps (False: only the engine has seen it)
    owner: str | None = None  # the tenant whose key started it (None: nobody's yet)
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
    # (from `node`, via `via`), the tools it waits on (call key -> (tool key, start,
    # expected duration)), tokens.
    node: str = ""
    via: ToolKey = NO_TOOL
    running_tools: dict[str, tuple[ToolKey, float, float | None]] = field(default_factory=dict)
    tool_started: float = 0.0
    gap_started: float | None = None  # without hints: when the last response finished
    last_prompt: int = 0
    last_output: int = 0
    context_tokens: int = 0  # KV the session holds now (prompt, plus answer once done)
    base_tokens: int = 0  # context at the end of the last finished call (growth baseline)
    entered_from: tuple[str, ToolKey] | None = None  # (node, via) whose growth is pending
    last_llm_start: float | None = None
    cache_ttl_s: float = 0.0  # the cache TTL its latest request asked for (0: none; `pinning`)
    spawn_site: tuple[str, str] | None = None  # a subagent: (parent's graph, node) it started at

    @property
    def state(self) -> SessionPhase:
        if self.ended:
            return SessionPhase.ENDED
        if self.in_llm:
            return SessionPhase.LLM
        return SessionPhase.TOOL if self.open_tools else SessionPhase.IDLE

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
            parent_id=self.parent,
            live_children=len(self.children),
            metrics=dict(metrics or {}),
        )


class Tracker(Protocol):
    """What moves the tracked part of a table's records (the AEG in the core).
    Called with the table's lock held; must not raise."""

    def on_hint(self, session: SessionRecord, event: HintEvent) -> None:
        """A validated hint: its announced part is applied; the table marks ends."""

    def on_drop(self, session: SessionRecord, now: float) -> None:
        """A live session leaves the table (expired, evicted, or replaced)."""


class _Lifecycle:
    """The plain table's tracking: steps, and whether a call runs."""

    def on_hint(self, session: SessionRecord, event: HintEvent) -> None:
        if isinstance(event, LlmCallStart):
            session.steps += 1
            session.in_llm = True
        elif isinstance(event, (LlmCallEnd, ToolCallStart)):
            session.in_llm = False

    def on_drop(self, session: SessionRecord, now: float) -> None:
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
        human_idle_ttl_s: float | None = None,
    ) -> None:
        if max_sessions < 1 or history_limit < 1:
            raise ValueError("max_sessions and history_limit must be >= 1")
        if not idle_ttl_s > 0 or not ended_ttl_s >= 0:
            raise ValueError("idle_ttl_s must be > 0 and ended_ttl_s >= 0")
        if human_idle_ttl_s is not None and not human_idle_ttl_s >= idle_ttl_s:
            raise ValueError("human_idle_ttl_s must be >= idle_ttl_s")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.human_idle_ttl_s = idle_ttl_s if human_idle_ttl_s is None else human_idle_ttl_s
        self.ended_ttl_s = ended_ttl_s
        self.history_limit = history_limit
        self._clock = clock
        self.lock = threading.RLock()
        # The records, least recently active first (so expiry stops at the first
        # live one). Read and change only under `lock`.
        self.by_id: OrderedDict[str, SessionRecord] = OrderedDict()
        self._ended: dict[str, None] = {}  # ids of ended records, in the order they ended
        self._tracker: Tracker = _Lifecycle()
        self.counters: dict[str, int] = {
            "events_accepted": 0,
            "events_rejected": 0,
            "sessions_started": 0,
            "sessions_ended": 0,
            "sessions_expired": 0,
            "subagents_linked": 0,
            "subagent_parent_refused": 0,
            "denied_tenant_claim": 0,
            "denied_foreign_session": 0,
            "denied_foreign_scope": 0,
            "denied_session_limit": 0,
            "denied_read": 0,
            "denied_release": 0,
            "deadline_clamped": 0,
            "list_withheld": 0,
        }
        self._live_owned: dict[str, int] = {}  # owner -> its live (not ended) sessions
        self._listeners: list[SessionGone] = []
        self._parent_listeners: list[ParentChanged] = []
        self._turn_listeners: list[TurnEnded] = []

    def subscribe(self, listener: SessionGone) -> None:
        """Call `listener(session_id, how)` whenever a session stops being live
        (module docstring, "Lifecycle")."""
        with self.lock:
            self._listeners.append(listener)

    def subscribe_parents(self, listener: ParentChanged) -> None:
        """Call `listener(parent_id, started)` whenever a live session gains or loses
        a live child (module docstring, "Subagent trees")."""
        with self.lock:
            self._parent_listeners.append(listener)

    def subscribe_turns(self, listener: TurnEnded) -> None:
        """Call `listener(session, span_s)` whenever a session's user turn ends
        (`turns`; same rules as the lifecycle listeners). The record is the table's:
        read it, do not keep or change it."""
        with self.lock:
            self._turn_listeners.append(listener)

    def attach(self, tracker: Tracker) -> None:
        """Hand the tracked part of every record to `tracker`, once, before use."""
        if not isinstance(self._tracker, _Lifecycle) or self.by_id:
            raise ValueError("a table takes one tracker, before it holds sessions")
        self._tracker = tracker

    def __len__(self) -> int:
        return len(self.by_id)

    # -- HintSink ---------------------------------------------------------------

    def accept(self, event: HintEvent, caller: Caller | None = None) -> None:
        with self.lock:
            try:
                session = self._take(event, caller)
            except HintRejected:
                self.counters["events_rejected"] += 1
                raise
            self._announce(session, event, caller)
            self._tracker.on_hint(session, event)
            if isinstance(event, SessionEnd):
                self.end(session)
            self.touch(session, event.time)
            self.counters["events_accepted"] += 1
            self.expire(event.time, _SWEEP)

    def session(self, session_id: str, caller: Caller | None = None) -> SessionSnapshot | None:
        with self.lock:
            session = self.readable(session_id, caller)
            return None if session is None else session.snapshot()

    def sessions(self, limit: int = 100, caller: Caller | None = None) -> Sequence[SessionSnapshot]:
        with self.lock:
            return [s.snapshot() for s in self.recent(limit, caller)]

    def stats(self) -> Mapping[str, float]:
        with self.lock:
            states = [s.state for s in self.by_id.values()]
            return {
                **self.counters,
                "sessions_live": len(states) - states.count(SessionPhase.ENDED),
                "sessions_in_tool": states.count(SessionPhase.TOOL),
                "sessions_in_llm": states.count(SessionPhase.LLM),
                "open_tool_calls": sum(len(s.open_tools) for s in self.by_id.values()),
            }

    # -- for the tracker and the core (lock held) -----------------------------------

    def recent(self, limit: int, caller: Caller | None = None) -> list[SessionRecord]:
        """Up to `limit` records, most recently active first, after a full expiry;
        with an agent `caller`, only its tenant's (ownership: module docstring)."""
        with self.lock:
            self.expire()
            records = reversed(self.by_id.values())
            if caller is None or caller.is_admin:
                return list(islice(records, max(0, limit)))
            mine = [s for s in records if s.owner == caller.tenant]
            if len(mine) < len(self.by_id):
                self.counters["list_withheld"] += 1
            return mine[:max(0, limit)]

    def readable(self, session_id: str, caller: Caller | None = None) -> SessionRecord | None:
        """The record of `session_id` (None: unknown) if `caller` may read it;
        `AccessDenied` (counted `denied_read`) for a session it does not own."""
        session = self.by_id.get(session_id)
        self._owned(session, caller, "denied_read")
        return session

    def releasable(self, session_id: str, caller: Caller | None = None) -> None:
        """Whether `caller` may make an engine drop the session's KV: only its
        owner or an admin (`AccessDenied`, counted `denied_release`); an unknown
        session holds nothing and passes."""
        self._owned(self.by_id.get(session_id), caller, "denied_release")

    def admit(self, session_id: str, t: float, *, tenant: str = "", workflow: str = "",
              hinted: bool = True, evict: bool = True, owner: str | None = None) -> SessionRecord:
        """A new record for `session_id` at time `t`, replacing any old one. In a
        full table `evict` lets it take the least recently active session's place;
        without it the table refuses (`HintRejected`)."""
        old = self.by_id.get(session_id)
        if old is not None:
            self._remove(old, t, None)
        elif len(self.by_id) >= self.max_sessions:
            self._make_room(t, evict)
        session = SessionRecord(session_id, started_at=t, last_event_at=t, tenant=tenant, workflow=workflow,
                          graph=workflow or tenant or "default", hinted=hinted, task_started_at=t,
                          history=deque(maxlen=self.history_limit))
        begin_turn(session, t)  # its first turn: whatever its first event, the work starts now
        self.by_id[session_id] = session
        self._own(session, owner)
        self.counters["sessions_started"] += 1
        return session

    def touch(self, session: SessionRecord, t: float) -> None:
        """`session` had an event at `t`: it becomes the most recently active."""
        if t > session.last_event_at:
            session.last_event_at = t
        self.by_id.move_to_end(session.session_id)

    def end(self, session: SessionRecord) -> None:
        """`session` ended: no call runs and no tool is open; kept `ended_ttl_s`."""
        if not session.ended:
            self._disown(session)
            self._unlink(session)
            self._publish(session.session_id, Departure.ENDED)
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
                self._drop(self.by_id[sid], now, Departure.EXPIRED)
                gone.append(sid)
            waiting: set[str] = set()  # passed over once: waiting on a person or its LLM call
            while self.by_id and len(gone) < limit:
                session = next(iter(self.by_id.values()))
                idle = now - session.last_event_at
                if session.ended:
                    if idle < self.ended_ttl_s:
                        break
                elif idle < self.idle_ttl_s:
                    break
                elif idle < self.human_idle_ttl_s and (session.in_llm or _waits_on_human(session)):
                    if session.session_id in waiting:
                        break
                    waiting.add(session.session_id)  # kept: look behind it for the expired
                    self.by_id.move_to_end(session.session_id)
                    continue
                self._drop(session, now, Departure.EXPIRED)
                gone.append(session.session_id)
            return gone

    # -- internals --------------------------------------------------------------

    def _take(self, event: HintEvent, caller: Caller | None) -> SessionRecord:
        """The record `event` applies to (admitted if new, claimed if nobody's);
        raises `HintRejected` before changing anything but expiry."""
        sid = event.session_id
        if caller is not None and not caller.is_admin and not owns_scope(caller.tenant, sid):
            self._deny("denied_foreign_scope", f"session id {sid!r} is scoped to another tenant "
                       f"(an id with a '/' must begin with this key's tenant, {tag(caller.tenant)!r})")
        session = self.by_id.get(sid)
        claim = self._owned(session, caller, "denied_foreign_session", claimable=True)
        owner = None if caller is None else caller.tenant
        if isinstance(event, SessionStart):
            tenant = event.tenant
            if caller is not None:
                if tenant and tenant != caller.tenant and not caller.is_admin:
                    self._deny("denied_tenant_claim", f"tenant {tenant!r} is not this key's ({caller.tenant!r})")
                tenant = owner = tenant or caller.tenant
            if session is not None and session.hinted and not session.ended:
                raise HintRejected(f"session {sid!r} already started")
            self._check_room(owner, caller, session)
            return self.admit(sid, event.time, tenant=tenant, workflow=event.workflow, evict=False, owner=owner)
        if session is None or session.ended:
            if isinstance(event, (SessionEnd, ToolCallEnd)):
                raise HintRejected(f"unknown session {sid!r}")
            self._check_room(owner, caller, session)
            return self.admit(sid, event.time, tenant=owner or "", evict=False, owner=owner)
        if isinstance(event, ToolCallStart) and (event.call_id or event.tool) in session.open_tools:
            raise HintRejected(f"tool call {event.call_id or event.tool!r} already open in {sid!r}")
        if isinstance(event, ToolCallEnd) and (event.call_id or event.tool) not in session.open_tools:
            raise HintRejected(f"tool call {event.call_id or event.tool!r} was never started in {sid!r}")
        if claim:
            self._check_room(owner, caller, None)
            session.tenant = session.tenant or owner
            self._own(session, owner)
        return session

    def _owned(self, session: SessionRecord | None, caller: Caller | None, denied: str, *,
               claimable: bool = False) -> bool:
        """The ownership rule (module docstring): passes, or raises `AccessDenied`
        counted as `denied`. With `claimable` (a hint), a session nobody owns that
        names no other tenant passes too, and True says the caller takes it."""
        if session is None or caller is None or caller.is_admin or session.owner == caller.tenant:
            return False
        if claimable and session.owner is None and session.tenant in ("", caller.tenant):
            return True
        self._deny(denied, f"session {session.session_id!r} belongs to another tenant")

    def _check_room(self, owner: str | None, caller: Caller | None, replaced: SessionRecord | None) -> None:
        """A new live session of `owner` fits its tenant's `max_sessions` (a record
        it replaces frees its place)."""
        limit = None if caller is None else caller.limits.max_sessions
        if limit is None or owner is None:
            return
        live = self._live_owned.get(owner, 0)
        if replaced is not None and replaced.owner == owner and not replaced.ended:
            live -= 1
        if live >= limit:
            self._deny("denied_session_limit", f"tenant {owner!r} has {live} live sessions (limit {limit})")

    def _deny(self, counter: str, reason: str) -> NoReturn:
        self.counters[counter] += 1
        raise AccessDenied(reason)

    def _own(self, session: SessionRecord, owner: str | None) -> None:
        session.owner = owner
        if owner is not None and not session.ended:
            self._live_owned[owner] = self._live_owned.get(owner, 0) + 1

    def _disown(self, session: SessionRecord) -> None:
        """`session` stops being live: its owner's live count drops."""
        owner = session.owner
        if owner is None:
            return
        left = self._live_owned.get(owner, 0) - 1
        if left > 0:
            self._live_owned[owner] = left
        else:
            self._live_owned.pop(owner, None)

    def _announce(self, session: SessionRecord, event: HintEvent, caller: Caller | None) -> None:
        if isinstance(event, LlmCallStart):
            session.current_node = event.node or session.current_node
            if not turn_open(session):  # its user replied without the human call's end
                begin_turn(session, event.time)
        elif isinstance(event, ToolCallStart):
            session.open_tools[event.call_id or event.tool] = OpenTool(event.tool, event.call_id, event.time,
                                                                        event.category)
            session.tool_calls += 1
            if _is_human(event):
                self._end_turn(session, event.time)
        elif isinstance(event, ToolCallEnd):
            del session.open_tools[event.call_id or event.tool]
            if not turn_open(session) and not any(_is_human(c) for c in session.open_tools.values()):
                begin_turn(session, event.time)
        elif isinstance(event, SessionEnd):
            self._end_turn(session, event.time)
        elif isinstance(event, SessionStart):
            if event.deadline_s is not None:
                session.task_deadline_at = event.time + self._floored(event.deadline_s, caller)
            if event.turn_deadline_s is not None:
                session.turn_deadline_s = self._floored(event.turn_deadline_s, caller)
            begin_turn(session, event.time)
        if isinstance(event, SessionStart) and event.parent_id:
            self._link(session, event.parent_id)
        session.history.append(HistoryEntry(event.time, _kind(event), _detail(event)))

    def _floored(self, deadline_s: float, caller: Caller | None) -> float:
        """A declared deadline, raised to the caller's tenant's `min_deadline_s`."""
        floor = 0.0 if caller is None else caller.limits.min_deadline_s
        if deadline_s < floor:
            self.counters["deadline_clamped"] += 1
            return floor
        return deadline_s

    def _end_turn(self, session: SessionRecord, t: float) -> None:
        steps = session.steps - session.turn_steps
        span = end_turn(session, t)
        if span is not None and steps > 0:  # a turn without an LLM call did no work to be late for
            for listener in self._turn_listeners:
                listener(session, span)

    def _link(self, child: SessionRecord, parent_id: str) -> None:
        """Make `child` a child of `parent_id` if the rule allows (module docstring)."""
        parent = self.by_id.get(parent_id)
        node, depth = parent, 0
        while node is not None and node is not child and depth < _MAX_DEPTH:
            node, depth = self.by_id.get(node.parent) if node.parent else None, depth + 1
        if parent is None or parent.ended or node is not None or parent.owner != child.owner \
                or parent.tenant != child.tenant:
            self.counters["subagent_parent_refused"] += 1
            return
        child.parent = parent_id
        child.task_started_at = parent.task_started_at
        if child.task_deadline_at is None:
            child.task_deadline_at = parent.deadline_at
            child.deadline_at = sooner(child.deadline_at, parent.deadline_at)
        parent.children.add(child.session_id)
        self.counters["subagents_linked"] += 1
        for listener in self._parent_listeners:
            listener(parent_id, True)

    def _unlink(self, session: SessionRecord) -> None:
        """`session` stops being live: its parent stops counting it."""
        parent = self.by_id.get(session.parent) if session.parent else None
        if parent is not None and session.session_id in parent.children:
            parent.children.discard(session.session_id)
            if not parent.ended:
                for listener in self._parent_listeners:
                    listener(parent.session_id, False)

    def _make_room(self, t: float, evict: bool) -> None:
        self.expire(t)
        if len(self.by_id) >= self.max_sessions and self._ended:
            self._drop(self.by_id[next(iter(self._ended))], t, Departure.EVICTED)
        if len(self.by_id) >= self.max_sessions:
            if not evict:
                raise HintRejected(f"too many sessions (limit {self.max_sessions})")
            self._drop(next(iter(self.by_id.values())), t, Departure.EVICTED)

    def _drop(self, session: SessionRecord, now: float, how: Departure) -> None:
        self._remove(session, now, how)
        self.counters["sessions_expired"] += 1

    def _remove(self, session: SessionRecord, now: float, how: Departure | None) -> None:
        """`how`: what to publish (None: a replacement, the same agent going on)."""
        if not session.ended:
            self._disown(session)
            self._unlink(session)
            self._tracker.on_drop(session, now)
            if how is not None:
                self._publish(session.session_id, how)
        del self.by_id[session.session_id]
        self._ended.pop(session.session_id, None)

    def _publish(self, session_id: str, how: Departure) -> None:
        for listener in self._listeners:
            listener(session_id, how)


def _is_human(call: ToolCallStart | OpenTool) -> bool:
    """Whether a tool call is a wait on the session's user (category `human`, named
    or guessed as the AEG does)."""
    return (call.category or guess_category(call.tool)) == HUMAN


def _waits_on_human(session: SessionRecord) -> bool:
    """Whether the session's open wait is its user's turn (category `human`)."""
    return any(call[0].category == HUMAN for call in session.running_tools.values())


def _kind(event: HintEvent) -> str:
    """`ToolCallStart` -> "tool_call_start"."""
    return _KINDS[type(event)]


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
