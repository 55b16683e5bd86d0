"""Agent sessions inferred from stateless LLM requests, whichever API carried them.

An unchanged agent sends every LLM call as an independent request carrying its whole
history (or, on the Responses API, naming the answer it continues). `SessionTracker`
turns that stream back into sessions and hints (`hints.Hint`s: the core's own events),
with no HTTP in sight: it works on protocol-neutral `exchanges.Request`s and
`exchanges.Reply`s, which a small adapter per API reads (`chat`, `responses`,
`messages`); a chat-completion body may be given as it is. The proxy feeds it; tests
and the benchmark feed it synthetic requests.

How a request finds its session, first rule that applies:
  1. an explicit id: a header of `identity.IDENTITY_HEADERS` (Claude Code's,
     Codex's, OpenCode's, Dynamo's, ...) or a body field in `SESSION_BODY_FIELDS`
     (the caller or its gateway already knows); with it, the parent session the
     caller names (a subagent's), which its `SessionStart` carries;
  2. it continues an answer by the id the upstream gave it (`previous`: the
     Responses API's `previous_response_id`);
  3. its messages *extend a known answer*: they start with an earlier request's
     messages plus the answer that request got back (agent histories are
     append-only, so the longest such prefix names the session it continues; an
     older answer of a session, e.g. after the agent rolled back a step, still counts);
  4. its messages strictly extend an earlier request of a session whose answer the
     agent rewrote (frameworks re-serialise assistant messages; the request still
     starts with the previous request verbatim), or repeat that request exactly
     after it failed (a retry);
  5. otherwise it starts a new session.
Messages are compared as `exchanges.Message`s (what a client preserves when it sends an
answer back). A request's `scope` (the Messages API's `metadata.user_id`, OpenAI's
`prompt_cache_key`) and its
`tenant` seed its history: requests of different scopes or tenants never match. A
tenant's session ids, explicit or inferred, are namespaced (`tenants.namespaced`)
and its response ids are its own, so no rule above ever crosses tenants; its
sessions start with it as their tenant. Two agents whose histories are
identical so far (same prompt and same answers) are indistinguishable; they share a
session until they diverge. That is the one documented inaccuracy.

Tool boundaries: an answer's tool calls start tool calls; the session's next request
ends each call a tool result answers (outcome OK) and cancels the rest. An answer
without tool calls may still act: `actions.TextActions` finds shell commands written
as fenced blocks; each starts a tool call, which the next request ends (OK when its
first new user message looks like the command's output, else CANCELLED).

Sessions end on in-band signals, or when quiet:
  - a request that carries its sender's last-request marker
    (`x-dynamo-session-final: true` and the like): once it succeeds;
  - an action carrying a submit marker: the agent is done once it runs;
  - a final answer (no tool calls, not cut at the length limit, in a session that
    used tools) once its workflow has shown that sessions go quiet after one
    (`pauses`: the first sessions of a workflow are not ended this way);
  - the client went away during a call and sent nothing for `abandon_grace_s`;
  - no request for the workflow's learnt idle timeout (`pauses`: a high quantile
    of the gaps its sessions leave between calls, within [`idle_min_s`,
    `idle_ttl_s`]; `idle_ttl_s` until enough gaps are known).
A session the tracker ended stays known until `idle_ttl_s` after its last request:
one that continues after all is the same session again (a fresh `SessionStart`
under its id, counted as revived), so an end guessed too early costs little.

Memory is bounded: at most `max_sessions` sessions (least recently used first out,
with a `SessionEnd` if live), ended ones forgotten after `idle_ttl_s`, and each
session indexes at most `points_per_session` answers and as many response ids.
Nothing here stores credentials: the tracker never sees the caller's headers beyond
the session ids it reads.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

from saga_server.core.events import (
    LlmCallEnd,
    LlmCallStart,
    SessionEnd,
    SessionOutcome,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    ToolOutcome,
)

from .actions import TextActions
from .chat import CHAT
from .exchanges import SESSION_BODY_FIELDS, Message, Reply, Request, explicit_session_id
from .hints import Hint, HintFacts
from .pauses import WorkflowPauses
from .tenants import namespaced

__all__ = [
    "SESSION_BODY_FIELDS",
    "Exchange",
    "MatchRule",
    "SessionTracker",
    "TrackerStats",
    "explicit_session_id",
]


class MatchRule(enum.StrEnum):
    """Which rule found a request's session (module docstring; `TrackerStats.by_rule`)."""

    EXPLICIT = "explicit"  # 1: the caller named it
    PREVIOUS = "previous"  # 2: it continues an answer by its id
    ANSWER = "answer"  # 3: its messages extend a known answer
    REQUEST = "request"  # 4: they extend an earlier request whose answer was rewritten
    RETRY = "retry"  # 4: they repeat a request that failed
    NEW = "new"  # 5: none did


@dataclass(slots=True)
class Exchange:
    """One request in flight, until its answer is back: hand it to `finish` or `fail`."""

    session_id: str
    step: int
    how: MatchRule
    new_session: bool
    final: bool = False  # the caller marked it its session's last request
    _chain: list[int] = field(default_factory=list, repr=False)
    _root: int = field(default=0, repr=False)  # what an empty chain extends


@dataclass(frozen=True, slots=True)
class TrackerStats:
    sessions: int                 # live ones
    requests: int
    by_rule: Mapping[str, int]
    sessions_started: int
    sessions_evicted: int
    sessions_expired: int         # ended by the idle timeout
    unparsed: int
    sessions_ended: Mapping[str, int] = field(default_factory=dict)  # by the tracker, by reason
    sessions_revived: int = 0


@dataclass(slots=True)
class _Open:
    tool: str
    text: bool  # written as text: ended by an observation, not by a tool result


@dataclass(slots=True)
class _TrackedSession:
    """What the tracker knows of one session it inferred: where its requests may
    continue (answer points, response ids), its open tool calls, how it stands."""

    session_id: str
    explicit: bool
    workflow: str
    last_seen: float
    tenant: str = ""
    parent: str = ""  # the parent session the caller named ("" for none)
    steps: int = 0
    in_flight: int = 0
    last_failed: bool = False
    open_tools: dict[str, _Open] = field(default_factory=dict)  # call id -> open call
    points: list[int] = field(default_factory=list)            # answer points, oldest first
    request_key: int | None = None                             # last request's chain end
    aliases: list[str] = field(default_factory=list)           # response ids, oldest first
    answered_at: float | None = None  # when its last call ended: a gap runs
    used_tools: bool = False
    after_final: bool = False  # its last answer was final; whether it comes back is not known yet
    abandoned: bool = False    # the client went away during its last call
    ended: bool = False        # ended here; known until `idle_ttl_s` in case it continues


class SessionTracker:
    """Infers sessions, tool boundaries and session ends; thread-safe; see the
    module docstring. `text_actions=None` turns text actions off."""

    def __init__(self, *, max_sessions: int = 10_000, idle_ttl_s: float = 600.0, idle_min_s: float = 30.0,
                 abandon_grace_s: float = 15.0, points_per_session: int = 4,
                 text_actions: TextActions | None = TextActions(), workflow_prefix: str = "proxy",
                 id_prefix: str = "px-", clock: Callable[[], float] = time.monotonic) -> None:
        if max_sessions < 1 or points_per_session < 1 or idle_ttl_s <= 0 or idle_min_s <= 0 \
                or abandon_grace_s <= 0:
            raise ValueError("max_sessions, points_per_session and the timeouts must be positive")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.abandon_grace_s = abandon_grace_s
        self.points_per_session = points_per_session
        self.text_actions = text_actions
        self.workflow_prefix = workflow_prefix
        self.pauses = WorkflowPauses(floor_s=min(idle_min_s, idle_ttl_s), ceiling_s=idle_ttl_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _TrackedSession] = OrderedDict()  # least recently used first
        self._answers: dict[int, str] = {}   # chain hash of request + answer -> session id
        self._requests: dict[int, str] = {}  # chain hash of a session's last request -> session id
        # (tenant, response id) -> (session id, its answer point)
        self._aliases: dict[tuple[str, str], tuple[str, int]] = {}
        self._ids = (f"{id_prefix}{n:x}" for n in itertools.count(1))
        self._id_salt = hashlib.blake2b(repr(time.time_ns()).encode(), digest_size=4).hexdigest()
        self._counts = dict.fromkeys(("requests", *MatchRule, "started", "evicted", "expired", "unparsed",
                                      "revived"), 0)
        self._ended: Counter[str] = Counter()

    @property
    def sweep_period_s(self) -> float:
        """How often to call `expire` for ends to come on time."""
        return max(0.05, min(30.0, min(self.pauses.floor_s, self.abandon_grace_s) / 4))

    # -- the three calls the proxy makes per request ----------------------------------

    def begin(self, request: Request | Mapping[str, Any],
              headers: Mapping[str, str] | None = None) -> tuple[Exchange, list[Hint]]:
        """Assign a request to a session: a `Request`, or a chat-completion body
        (with `headers`, lower-case names). Returns the exchange and the hints to send:
        `SessionStart` for a new (or revived) session, `ToolCallEnd` for the
        tool calls this request answers or abandons, and `LlmCallStart`."""
        if not isinstance(request, Request):
            request = CHAT.read(request if isinstance(request, Mapping) else {}, headers or {})
        if request.tenant and request.explicit is not None:
            request = replace(request, explicit=namespaced(request.tenant, request.explicit),
                              parent=namespaced(request.tenant, request.parent) if request.parent else None)
        now = self._clock()
        events: list[Hint] = []
        with self._lock:
            self._counts["requests"] += 1
            if not request.messages and request.explicit is None:
                self._counts["unparsed"] += 1
            root = self._root(request)
            chain = _chain(request.messages, root)
            session, how, matched = self._find(request, chain)
            new = session is None
            if new:
                session = self._open(request, now, events)
            elif session.ended:
                self._revive(session, now, events)
            self._counts[how] += 1
            extends = self._extends(session, request, how, chain[matched - 1] if matched else None)
            self._sessions.move_to_end(session.session_id)
            self._resume(session, now)
            if session.open_tools:
                self._end_tools(session, request.messages[matched:], now, events)
            session.steps += 1
            session.in_flight += 1
            session.last_failed = False
            if chain:
                self._index_request(session, chain[-1])
            sid = session.session_id
            events.append(Hint(LlmCallStart(sid, now, step=session.steps, node="llm",
                                            request_id=_request_id(sid, session.steps)),
                               HintFacts(extends=extends, prompt_chars=_chars(request.messages),
                                         model=request.model[:64])))
            return Exchange(session.session_id, session.steps, how, new, request.final, chain, root), events

    def finish(self, exchange: Exchange, reply: Reply | Iterable[Mapping[str, Any]] = (),
               usage: Mapping[str, Any] | None = None) -> list[Hint]:
        """The request succeeded with this `Reply` (or these chat assistant messages,
        one per choice, and `usage`). Returns `LlmCallEnd`, then what the answer
        starts: a `ToolCallStart` per tool call of the first answer that asks
        for any (or per text action), or a `SessionEnd`."""
        if not isinstance(reply, Reply):
            reply = CHAT.reply(reply, usage)
        with self._lock:
            now = self._clock()
            events = [Hint(LlmCallEnd(exchange.session_id, now, step=exchange.step, node="llm",
                                      request_id=_request_id(exchange.session_id, exchange.step),
                                      prompt_tokens=reply.prompt_tokens, output_tokens=reply.output_tokens),
                           HintFacts(cached_tokens=reply.cached_tokens, output_chars=_chars(reply.messages[:1])))]
            session = self._sessions.get(exchange.session_id)
            if session is None:  # forgotten while the request ran
                return events
            session.in_flight = max(0, session.in_flight - 1)
            if session.ended:  # ended meanwhile (another of its calls submitted)
                return events
            session.last_seen = session.answered_at = now
            self._sessions.move_to_end(exchange.session_id)
            if exchange._chain:
                base = exchange._chain[-1]
                for i, answer in enumerate(reply.messages):
                    point = _link(base, hash(answer))
                    self._index_answer(session, point)
                    if i == 0 and reply.response_id:
                        self._alias(session, reply.response_id, point)
            if exchange.final:
                self._end(session, now, events, SessionOutcome.COMPLETED, "marked_final")
                return events
            answer = next((m for m in reply.messages if m.calls), reply.messages[0] if reply.messages else None)
            if answer is not None:
                self._act(session, exchange, answer, reply.truncated, now, events)
        return events

    def fail(self, exchange: Exchange, *, abandoned: bool = False) -> list[Hint]:
        """The request failed, or (`abandoned`) the client went away before its
        answer was whole: end the LLM call, and let an identical retry find this
        session. An abandoned session that stays quiet ends after `abandon_grace_s`."""
        with self._lock:
            now = self._clock()
            session = self._sessions.get(exchange.session_id)
            if session is not None:
                session.in_flight = max(0, session.in_flight - 1)
            if session is not None and not session.ended:
                session.last_failed = True
                session.abandoned = abandoned
                session.last_seen = session.answered_at = now
                self._sessions.move_to_end(exchange.session_id)
        return [Hint(LlmCallEnd(exchange.session_id, now, step=exchange.step, node="llm",
                                request_id=_request_id(exchange.session_id, exchange.step)),
                     HintFacts(failed=True))]

    # -- housekeeping -------------------------------------------------------------------

    def expire(self) -> list[Hint]:
        """End sessions quiet for their timeout (none in flight), and forget ended
        ones after `idle_ttl_s`. Call every `sweep_period_s`."""
        now = self._clock()
        soonest = min(self.pauses.floor_s, self.abandon_grace_s)
        events: list[Hint] = []
        with self._lock:
            for session in list(self._sessions.values()):
                quiet = now - session.last_seen
                if quiet < soonest:
                    break  # ordered by last use: the rest are younger still
                if session.in_flight:
                    continue
                timeout = self.pauses.idle_timeout(session.workflow)
                if session.after_final and quiet >= timeout:
                    self.pauses.after_final(session.workflow, resumed=False)
                    session.after_final = False
                if not session.ended and (quiet >= timeout or session.abandoned and quiet >= self.abandon_grace_s):
                    self._end(session, now, events,
                              SessionOutcome.CANCELLED if session.abandoned else SessionOutcome.COMPLETED,
                              "gone" if session.abandoned else "idle")
                    self._counts["expired"] += not session.abandoned
                if session.ended and quiet >= self.idle_ttl_s:
                    self._forget(session)
        return events

    def close(self) -> list[Hint]:
        """End every session (the proxy is stopping)."""
        now = self._clock()
        events: list[Hint] = []
        with self._lock:
            for session in list(self._sessions.values()):
                if not session.ended:
                    self._end(session, now, events, _outcome_if_ended_now(session), "closed")
                self._forget(session)
        return events

    def table_sizes(self) -> dict[str, int]:
        """Entries of each of its tables (all bounded: module docstring)."""
        with self._lock:
            return {"sessions": len(self._sessions), "answers": len(self._answers), "requests": len(self._requests),
                    "aliases": len(self._aliases), "pause_workflows": len(self.pauses)}

    def learnt(self) -> dict:
        """What the tracker learnt (idle times and final answers per workflow:
        `WorkflowPauses.learnt`), to survive a restart (`saga_server.state_file`)."""
        with self._lock:
            return {"pauses": self.pauses.learnt()}

    def restore_learnt(self, data: dict) -> None:
        """Take back what `learnt` returned (ValueError, nothing changed, if it is not that)."""
        if not isinstance(data, dict):
            raise ValueError("the proxy's learnt state must be an object")
        with self._lock:
            self.pauses.restore_learnt(data.get("pauses"))

    def stats(self) -> TrackerStats:
        with self._lock:
            live = sum(1 for s in self._sessions.values() if not s.ended)
            c = self._counts
            return TrackerStats(live, c["requests"], {k: c[k] for k in MatchRule}, c["started"], c["evicted"],
                                c["expired"], c["unparsed"], dict(self._ended), c["revived"])

    def session_ids(self) -> list[str]:
        """Live sessions, least recently used first."""
        with self._lock:
            return [sid for sid, s in self._sessions.items() if not s.ended]

    def index_size(self) -> int:
        """Entries in the indexes (bounded by sessions x (2 x points + 1))."""
        return len(self._answers) + len(self._requests) + len(self._aliases)

    # -- internals (lock held) -----------------------------------------------------------

    def _root(self, request: Request) -> int:
        if request.previous:
            alias = self._aliases.get((request.tenant, request.previous))
            return alias[1] if alias is not None else hash(("previous", request.tenant, request.previous))
        return hash(("scope", request.tenant, request.scope)) if request.scope or request.tenant else 0

    def _find(self, request: Request, chain: list[int]) -> tuple[_TrackedSession | None, MatchRule, int]:
        """(session or None, rule, number of leading messages already known)."""
        if request.explicit is not None:
            return (self._sessions.get(request.explicit), MatchRule.EXPLICIT,
                    self._known_prefix(request.explicit, chain))
        alias = self._aliases.get((request.tenant, request.previous)) if request.previous else None
        if alias is not None:
            return self._sessions[alias[0]], MatchRule.PREVIOUS, 0
        k = len(chain)
        for i in range(k, 0, -1):
            key = chain[i - 1]
            sid = self._answers.get(key)
            if sid is not None:
                return self._sessions[sid], MatchRule.ANSWER, i
            sid = self._requests.get(key)
            if sid is not None:
                session = self._sessions[sid]
                if i < k:
                    return session, MatchRule.REQUEST, i
                if session.last_failed and not session.in_flight:
                    return session, MatchRule.RETRY, i
        return None, MatchRule.NEW, 0

    def _extends(self, session: _TrackedSession, request: Request, how: MatchRule, known: int | None) -> str:
        """What the request's history continues (`HintFacts.extends`); `known`: the
        chain key of its longest known prefix, if any."""
        if how in (MatchRule.ANSWER, MatchRule.PREVIOUS):
            return "answer"
        if how in (MatchRule.REQUEST, MatchRule.RETRY):
            return "request"
        if how == MatchRule.EXPLICIT:
            if known is not None:
                return "answer" if known in session.points else "request"
            if request.previous and request.previous in self._aliases:
                return "answer"
        return ""

    def _known_prefix(self, sid: str, chain: list[int]) -> int:
        session = self._sessions.get(sid)
        if session is None:
            return 0
        keys = set(session.points)
        if session.request_key is not None:
            keys.add(session.request_key)
        for i in range(len(chain), 0, -1):
            if chain[i - 1] in keys:
                return i
        return 0

    def _open(self, request: Request, now: float, events: list[Hint]) -> _TrackedSession:
        while len(self._sessions) >= self.max_sessions:
            oldest = next(iter(self._sessions.values()))
            if not oldest.ended:
                self._end(oldest, now, events, _outcome_if_ended_now(oldest), "evicted")
                self._counts["evicted"] += 1
            self._forget(oldest)
        explicit = request.explicit
        sid = explicit if explicit is not None else namespaced(request.tenant, f"{next(self._ids)}-{self._id_salt}")
        session = _TrackedSession(sid, explicit is not None, self._workflow(request), now, request.tenant,
                           parent=request.parent or "")
        self._sessions[sid] = session
        self._counts["started"] += 1
        events.append(_session_start(session, now))
        return session

    def _revive(self, session: _TrackedSession, now: float, events: list[Hint]) -> None:
        session.ended = False
        self._counts["revived"] += 1
        events.append(_session_start(session, now))

    def _resume(self, session: _TrackedSession, now: float) -> None:
        """A request of `session` arrives: what its pause was."""
        if session.answered_at is not None and not session.in_flight:
            self.pauses.gap(session.workflow, now - session.answered_at)
        if session.after_final:
            self.pauses.after_final(session.workflow, resumed=True)
        session.last_seen = now
        session.answered_at = None
        session.after_final = session.abandoned = False

    def _end_tools(self, session: _TrackedSession, new: tuple[Message, ...], now: float, events: list[Hint]) -> None:
        """The tool calls answered by messages after the matched prefix end; the rest are abandoned."""
        answered = {m.answers for m in new if m.role == "tool" and m.answers}
        user = next((m for m in new if m.role == "user"), None)
        observed = user is not None and self.text_actions is not None and self.text_actions.is_observation(user.text)
        for call_id, tool in session.open_tools.items():
            ok = observed if tool.text else call_id in answered
            events.append(Hint(ToolCallEnd(session.session_id, now, tool=tool.tool, call_id=call_id,
                                           outcome=ToolOutcome.OK if ok else ToolOutcome.CANCELLED)))
        session.open_tools.clear()

    def _act(self, session: _TrackedSession, exchange: Exchange, answer: Message, truncated: bool, now: float,
             events: list[Hint]) -> None:
        """What `answer` starts: its tool calls, its text actions, or the session's end."""
        if answer.calls:
            session.used_tools = True
            for i, call in enumerate(answer.calls):
                call_id = call.call_id or f"{call.name}#{i}"
                if call_id not in session.open_tools:
                    session.open_tools[call_id] = _Open(call.name or "unknown", False)
                    events.append(Hint(ToolCallStart(session.session_id, now, tool=call.name or "unknown",
                                                     call_id=call_id)))
            return
        actions = self.text_actions.find(answer.text) if self.text_actions is not None and answer.text else []
        if any(a.submit for a in actions):
            self._end(session, now, events, SessionOutcome.COMPLETED, "submit")
        elif actions:
            session.used_tools = True
            for i, action in enumerate(actions):
                call_id = f"text-{exchange.step}-{i}"
                session.open_tools[call_id] = _Open(action.tool, True)
                events.append(Hint(ToolCallStart(session.session_id, now, tool=action.tool, call_id=call_id,
                                                 category=action.category)))
        elif session.used_tools and not truncated:
            session.after_final = True
            if self.pauses.final_is_end(session.workflow):
                self._end(session, now, events, SessionOutcome.COMPLETED, "final")

    def _workflow(self, request: Request) -> str:
        """Agents of one kind share a model and a system prompt: name the workflow
        after both, so the server can learn the shape of that kind of agent."""
        tag = hashlib.blake2b(request.system.encode(), digest_size=4).hexdigest()
        return f"{self.workflow_prefix}:{request.model[:64]}:{tag}"

    def _index_request(self, session: _TrackedSession, key: int) -> None:
        if session.request_key is not None and self._requests.get(session.request_key) == session.session_id:
            del self._requests[session.request_key]
        session.request_key = key
        self._requests[key] = session.session_id

    def _index_answer(self, session: _TrackedSession, key: int) -> None:
        self._answers[key] = session.session_id
        if key in session.points:
            session.points.remove(key)
        session.points.append(key)
        while len(session.points) > self.points_per_session:
            old = session.points.pop(0)
            if self._answers.get(old) == session.session_id:
                del self._answers[old]

    def _alias(self, session: _TrackedSession, response_id: str, point: int) -> None:
        self._aliases[(session.tenant, response_id)] = (session.session_id, point)
        session.aliases.append(response_id)
        while len(session.aliases) > self.points_per_session:
            old = (session.tenant, session.aliases.pop(0))
            if self._aliases.get(old, ("",))[0] == session.session_id:
                del self._aliases[old]

    def _end(self, session: _TrackedSession, now: float, events: list[Hint], outcome: SessionOutcome,
             reason: str) -> None:
        for call_id, tool in session.open_tools.items():
            events.append(Hint(ToolCallEnd(session.session_id, now, tool=tool.tool, call_id=call_id,
                                           outcome=ToolOutcome.CANCELLED)))
        session.open_tools.clear()
        events.append(Hint(SessionEnd(session.session_id, now, outcome=outcome), HintFacts(end_reason=reason)))
        session.ended = True
        self._ended[reason] += 1

    def _forget(self, session: _TrackedSession) -> None:
        sid = session.session_id
        for key in session.points:
            if self._answers.get(key) == sid:
                del self._answers[key]
        if session.request_key is not None and self._requests.get(session.request_key) == sid:
            del self._requests[session.request_key]
        for response_id in session.aliases:
            if self._aliases.get((session.tenant, response_id), ("",))[0] == sid:
                del self._aliases[(session.tenant, response_id)]
        del self._sessions[sid]


# -- pure helpers --------------------------------------------------------------------------

def _session_start(session: _TrackedSession, now: float) -> Hint:
    return Hint(SessionStart(session.session_id, now, tenant=session.tenant, workflow=session.workflow,
                             parent_id=session.parent))


def _outcome_if_ended_now(session: _TrackedSession) -> SessionOutcome:
    """A session the tracker ends from outside (evicted, the proxy stopping) was cut
    short if a call of it was still running."""
    return SessionOutcome.CANCELLED if session.in_flight else SessionOutcome.COMPLETED


def _request_id(session_id: str, step: int) -> str:
    return f"{session_id}:{step}"


def _chars(messages: Iterable[Message]) -> int:
    """Characters of text and tool arguments: a size to estimate tokens from where
    the upstream reports no usage."""
    return sum(len(m.text) + sum(len(c.name) + len(c.arguments) for c in m.calls) for m in messages)


def _chain(messages: Iterable[Message], root: int = 0) -> list[int]:
    """chain[i] identifies messages[:i + 1] after `root`: a hash over the messages."""
    out: list[int] = []
    prev = root
    for message in messages:
        prev = _link(prev, hash(message))
        out.append(prev)
    return out


# Python's own 64-bit hash: the index lives only in this process, so a per-process
# seed is harmless, and it is several times cheaper than a cryptographic digest on
# the long system prompts every request repeats. A collision (about 1 in 10^14 for a
# full index) could only misfile one request's hints.
def _link(prev: int, digest: int) -> int:
    return hash((prev, digest))
