"""Agent sessions inferred from stateless chat-completion requests.

An unchanged agent sends every LLM call as an independent request carrying its whole
message history. `SessionTracker` turns that stream back into sessions and hint
events, with no HTTP in sight (the proxy feeds it parsed bodies; tests and the
benchmark feed it synthetic ones).

How a request finds its session, first rule that applies:
  1. an explicit id: a header in `SESSION_HEADERS` or a body field in
     `SESSION_BODY_FIELDS` (the caller or its gateway already knows);
  2. its messages *extend a known answer*: they start with an earlier request's
     messages plus the assistant message that request got back (agent histories are
     append-only, so the longest such prefix names the session it continues; an
     older answer of a session, e.g. after the agent rolled back a step, still counts);
  3. its messages strictly extend an earlier request of a session whose answer the
     agent rewrote (frameworks re-serialise assistant messages; the request still
     starts with the previous request verbatim), or repeat that request exactly
     after it failed (a retry);
  4. otherwise it starts a new session.

Messages are compared by a digest of what a client preserves when it sends an
answer back (role, text, tool-call ids, names and arguments as JSON values, the
tool message's call id), not by raw JSON: clients add `refusal: null`, reorder
keys, re-dump arguments. Two agents whose histories are identical so far
(same prompt and same answers) are indistinguishable; they share a session until
they diverge. That is the one documented inaccuracy.

Tool boundaries come from the protocol: an answer with `tool_calls` starts those
tool calls; the session's next request ends each call its `role: "tool"` messages
answer (outcome "ok"), and cancels the ones it leaves unanswered.

Memory is bounded: at most `max_sessions` sessions (least recently used first out,
with a `session_end`), idle ones end after `idle_ttl_s`, and each session indexes
at most `points_per_session` answers. Nothing here stores credentials: the tracker
never sees the caller's headers beyond the session ids it reads.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

__all__ = [
    "HintEvent",
    "SESSION_BODY_FIELDS",
    "SESSION_HEADERS",
    "SessionTracker",
    "TrackerStats",
    "Turn",
    "explicit_session_id",
]

# Lower-case header names, in order of precedence.
SESSION_HEADERS = (
    "x-session-id",          # vLLM's own, and what this proxy forwards
    "x-saga-session-id",
    "helicone-session-id",   # Helicone gateway
    "x-litellm-session-id",  # LiteLLM gateway
    "x-dynamo-session-id",   # NVIDIA Dynamo
)
# Body paths, in order of precedence.
SESSION_BODY_FIELDS = (
    ("session_id",),
    ("vllm_xargs", "session_id"),
    ("litellm_session_id",),
    ("metadata", "session_id"),
    ("metadata", "litellm_session_id"),
)
MAX_SESSION_ID_CHARS = 256


@dataclass(frozen=True, slots=True)
class HintEvent:
    """One hint to send: `getattr(hint_client, kind)(session_id, **args)`."""

    kind: str
    session_id: str
    args: Mapping[str, Any] = field(default_factory=dict)

    def send(self, client) -> None:
        getattr(client, self.kind)(self.session_id, **self.args)


@dataclass(slots=True)
class Turn:
    """One request in flight; hand it back to `finish` or `fail`."""

    session_id: str
    step: int
    how: str            # "explicit", "answer", "request", "retry" or "new"
    new_session: bool
    _chain: list[int] = field(default_factory=list, repr=False)


@dataclass(frozen=True, slots=True)
class TrackerStats:
    sessions: int
    requests: int
    by_rule: Mapping[str, int]
    sessions_started: int
    sessions_evicted: int
    sessions_expired: int
    unparsed: int


@dataclass(slots=True)
class _Session:
    session_id: str
    explicit: bool
    last_seen: float
    steps: int = 0
    in_flight: int = 0
    last_failed: bool = False
    open_tools: dict[str, str] = field(default_factory=dict)  # call id -> tool name
    points: list[int] = field(default_factory=list)           # answer points, oldest first
    request_key: int | None = None                            # last request's chain end


class SessionTracker:
    """Infers sessions and tool boundaries; thread-safe; see the module docstring."""

    def __init__(self, *, max_sessions: int = 10_000, idle_ttl_s: float = 600.0,
                 points_per_session: int = 4, workflow_prefix: str = "proxy",
                 id_prefix: str = "px-", clock: Callable[[], float] = time.monotonic) -> None:
        if max_sessions < 1 or points_per_session < 1 or idle_ttl_s <= 0:
            raise ValueError("max_sessions, points_per_session and idle_ttl_s must be positive")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.points_per_session = points_per_session
        self.workflow_prefix = workflow_prefix
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self._answers: dict[int, str] = {}   # chain hash of request + answer -> session id
        self._requests: dict[int, str] = {}  # chain hash of a session's last request -> session id
        self._ids = (f"{id_prefix}{n:x}" for n in itertools.count(1))
        self._id_salt = hashlib.blake2b(repr(time.time_ns()).encode(), digest_size=4).hexdigest()
        self._counts = dict.fromkeys(("requests", "explicit", "answer", "request", "retry", "new",
                                      "started", "evicted", "expired", "unparsed"), 0)

    # -- the three calls the proxy makes per request ----------------------------------

    def begin(self, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> tuple[Turn, list[HintEvent]]:
        """Assign a chat-completion request (its parsed JSON body; `headers` with
        lower-case names) to a session. Returns the turn and the hints to send:
        `session_start` for a new session, `tool_call_end` for the tool calls this
        request answers or abandons, and `llm_call_start`."""
        now = self._clock()
        messages = body.get("messages") if isinstance(body, Mapping) else None
        chain = _chain(messages) if isinstance(messages, list) else []
        explicit = explicit_session_id(body, headers or {})
        events: list[HintEvent] = []
        with self._lock:
            self._counts["requests"] += 1
            if not chain and explicit is None:
                self._counts["unparsed"] += 1
            session, how, matched = self._find(explicit, chain)
            new = session is None
            if new:
                session = self._open(explicit, now, body, events)
            self._counts[how] += 1
            self._sessions.move_to_end(session.session_id)
            session.last_seen = now
            # Tool calls answered by messages after the matched prefix end; the rest are abandoned.
            if session.open_tools:
                answered = _tool_results(messages[matched:] if isinstance(messages, list) else ())
                for call_id, tool in list(session.open_tools.items()):
                    outcome = "ok" if call_id in answered else "cancelled"
                    events.append(HintEvent("tool_call_end", session.session_id,
                                            {"tool": tool, "call_id": call_id, "outcome": outcome}))
                session.open_tools.clear()
            session.steps += 1
            session.in_flight += 1
            session.last_failed = False
            if chain:
                self._index_request(session, chain[-1])
            events.append(HintEvent("llm_call_start", session.session_id,
                                    {"step": session.steps, "node": "llm",
                                     "request_id": f"{session.session_id}:{session.steps}"}))
            return Turn(session.session_id, session.steps, how, new, chain), events

    def finish(self, turn: Turn, answers: Iterable[Mapping[str, Any]] = (),
               usage: Mapping[str, Any] | None = None) -> list[HintEvent]:
        """The request succeeded with these assistant messages (one per choice).
        Returns `llm_call_end` and a `tool_call_start` per tool call of the first
        answer that carries any."""
        events = [HintEvent("llm_call_end", turn.session_id,
                            {"step": turn.step, "node": "llm", "request_id": f"{turn.session_id}:{turn.step}",
                             "prompt_tokens": _int(usage, "prompt_tokens"),
                             "output_tokens": _int(usage, "completion_tokens")})]
        with self._lock:
            session = self._sessions.get(turn.session_id)
            if session is None:  # evicted while the request ran
                return events
            session.in_flight = max(0, session.in_flight - 1)
            session.last_seen = self._clock()
            self._sessions.move_to_end(turn.session_id)
            tools_started = False
            for answer in answers:
                if not isinstance(answer, Mapping):
                    continue
                if turn._chain:
                    self._index_answer(session, _link(turn._chain[-1], _digest(answer)))
                if tools_started:
                    continue
                for call_id, tool in _tool_calls(answer):
                    tools_started = True
                    if call_id in session.open_tools:
                        continue
                    session.open_tools[call_id] = tool
                    events.append(HintEvent("tool_call_start", turn.session_id,
                                            {"tool": tool, "call_id": call_id}))
        return events

    def fail(self, turn: Turn) -> list[HintEvent]:
        """The request failed or the client went away: end the LLM call, and let
        an identical retry find this session."""
        with self._lock:
            session = self._sessions.get(turn.session_id)
            if session is not None:
                session.in_flight = max(0, session.in_flight - 1)
                session.last_failed = True
        return [HintEvent("llm_call_end", turn.session_id,
                          {"step": turn.step, "node": "llm", "request_id": f"{turn.session_id}:{turn.step}"})]

    # -- housekeeping -------------------------------------------------------------------

    def expire(self) -> list[HintEvent]:
        """End sessions idle for `idle_ttl_s` (no request in flight). Call periodically."""
        horizon = self._clock() - self.idle_ttl_s
        events: list[HintEvent] = []
        with self._lock:
            for session in list(self._sessions.values()):
                if session.last_seen > horizon:
                    break  # ordered by last use
                if session.in_flight:
                    continue
                self._drop(session, events, "completed")
                self._counts["expired"] += 1
        return events

    def close(self) -> list[HintEvent]:
        """End every session (the proxy is stopping)."""
        events: list[HintEvent] = []
        with self._lock:
            for session in list(self._sessions.values()):
                self._drop(session, events, "completed" if not session.in_flight else "cancelled")
        return events

    def stats(self) -> TrackerStats:
        c = self._counts
        return TrackerStats(len(self._sessions), c["requests"],
                            {k: c[k] for k in ("explicit", "answer", "request", "retry", "new")},
                            c["started"], c["evicted"], c["expired"], c["unparsed"])

    def session_ids(self) -> list[str]:
        """Live sessions, least recently used first."""
        with self._lock:
            return list(self._sessions)

    def index_size(self) -> int:
        """Entries in the prefix indexes (bounded by sessions x (points + 1))."""
        return len(self._answers) + len(self._requests)

    # -- internals (lock held) -----------------------------------------------------------

    def _find(self, explicit: str | None, chain: list[int]) -> tuple[_Session | None, str, int]:
        """(session or None, rule, number of leading messages already known)."""
        if explicit is not None:
            return self._sessions.get(explicit), "explicit", self._known_prefix(explicit, chain)
        k = len(chain)
        for i in range(k, 0, -1):
            key = chain[i - 1]
            sid = self._answers.get(key)
            if sid is not None:
                return self._sessions[sid], "answer", i
            sid = self._requests.get(key)
            if sid is not None:
                session = self._sessions[sid]
                if i < k:
                    return session, "request", i
                if session.last_failed and not session.in_flight:
                    return session, "retry", i
        return None, "new", 0

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

    def _open(self, explicit: str | None, now: float, body: Mapping[str, Any],
              events: list[HintEvent]) -> _Session:
        while len(self._sessions) >= self.max_sessions:
            _, oldest = next(iter(self._sessions.items()))
            self._drop(oldest, events, "cancelled" if oldest.in_flight else "completed")
            self._counts["evicted"] += 1
        sid = explicit if explicit is not None else f"{next(self._ids)}-{self._id_salt}"
        session = _Session(sid, explicit is not None, now)
        self._sessions[sid] = session
        self._counts["started"] += 1
        events.append(HintEvent("session_start", sid, {"workflow": self._workflow(body)}))
        return session

    def _workflow(self, body: Mapping[str, Any]) -> str:
        """Agents of one kind share a model and a system prompt: name the workflow
        after both, so the server can learn the shape of that kind of agent."""
        model = body.get("model") if isinstance(body, Mapping) else None
        messages = body.get("messages") if isinstance(body, Mapping) else None
        system = ""
        if isinstance(messages, list) and messages and isinstance(messages[0], Mapping) \
                and messages[0].get("role") in ("system", "developer"):
            system = _text(messages[0].get("content"))
        tag = hashlib.blake2b(system.encode(), digest_size=4).hexdigest()
        return f"{self.workflow_prefix}:{str(model or '')[:64]}:{tag}"

    def _index_request(self, session: _Session, key: int) -> None:
        if session.request_key is not None and self._requests.get(session.request_key) == session.session_id:
            del self._requests[session.request_key]
        session.request_key = key
        self._requests[key] = session.session_id

    def _index_answer(self, session: _Session, key: int) -> None:
        self._answers[key] = session.session_id
        if key in session.points:
            session.points.remove(key)
        session.points.append(key)
        while len(session.points) > self.points_per_session:
            old = session.points.pop(0)
            if self._answers.get(old) == session.session_id:
                del self._answers[old]

    def _drop(self, session: _Session, events: list[HintEvent], outcome: str) -> None:
        for call_id, tool in session.open_tools.items():
            events.append(HintEvent("tool_call_end", session.session_id,
                                    {"tool": tool, "call_id": call_id, "outcome": "cancelled"}))
        events.append(HintEvent("session_end", session.session_id, {"outcome": outcome}))
        for key in session.points:
            if self._answers.get(key) == session.session_id:
                del self._answers[key]
        if session.request_key is not None and self._requests.get(session.request_key) == session.session_id:
            del self._requests[session.request_key]
        del self._sessions[session.session_id]


# -- pure helpers --------------------------------------------------------------------------

def explicit_session_id(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The caller's own session id, if it sent one (headers first, then the body)."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value and value.strip():
            return value.strip()[:MAX_SESSION_ID_CHARS]
    if isinstance(body, Mapping):
        for path in SESSION_BODY_FIELDS:
            node: Any = body
            for part in path:
                node = node.get(part) if isinstance(node, Mapping) else None
            if isinstance(node, (str, int)) and not isinstance(node, bool) and str(node).strip():
                return str(node).strip()[:MAX_SESSION_ID_CHARS]
    return None


def _chain(messages: list) -> list[int]:
    """chain[i] identifies messages[:i + 1]: a hash over the message digests."""
    out: list[int] = []
    prev = 0
    for message in messages:
        prev = _link(prev, _digest(message))
        out.append(prev)
    return out


# Python's own 64-bit hash: the index lives only in this process, so a per-process
# seed is harmless, and it is several times cheaper than a cryptographic digest on
# the long system prompts every request repeats. A collision (about 1 in 10^14 for a
# full index) could only misfile one request's hints.
def _link(prev: int, digest: int) -> int:
    return hash((prev, digest))


def _digest(message: Any) -> int:
    """What survives a client's round trip of a message (see the module docstring)."""
    if not isinstance(message, Mapping):
        return hash(("?", repr(message)))
    role = str(message.get("role", ""))
    parts: tuple = (role, _text(message.get("content")))
    if role == "assistant":
        parts += tuple(_tool_call_triples(message))
    elif role in ("tool", "function"):
        parts += (str(message.get("tool_call_id") or ""), str(message.get("name") or ""))
    return hash(parts)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in ("text", "input_text", "output_text"):
                pieces.append(str(part.get("text", "")))
            elif isinstance(part, str):
                pieces.append(part)
            else:
                pieces.append(json.dumps(part, sort_keys=True, default=str))
        return "\n".join(pieces).strip()
    return json.dumps(content, sort_keys=True, default=str)


def _tool_call_triples(message: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    triples = []
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
            triples.append((str(call.get("id") or ""), str(fn.get("name") or ""), _args(fn.get("arguments"))))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        triples.append(("", str(legacy.get("name") or ""), _args(legacy.get("arguments"))))
    return triples


def _args(arguments: Any) -> str:
    """Arguments as a JSON value, so a client that re-dumps them still matches."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def _tool_calls(answer: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(call id, tool name) of each tool call an answer asks for."""
    out = []
    for i, (call_id, tool, _) in enumerate(_tool_call_triples(answer)):
        out.append((call_id or f"{tool}#{i}", tool or "unknown"))
    return out


def _tool_results(messages: Iterable[Any]) -> set[str]:
    ids = set()
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "tool" and message.get("tool_call_id"):
            ids.add(str(message["tool_call_id"]))
    return ids


def _int(usage: Mapping[str, Any] | None, key: str) -> int:
    if not isinstance(usage, Mapping):
        return 0
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
