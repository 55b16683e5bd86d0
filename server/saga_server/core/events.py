"""Hint events as the workflow core sees them, and the `HintSink` contract.

The wire format (protobuf, `proto/saga/v1/hints.proto`) is translated into these
plain dataclasses by the hint service, so nothing below the transport knows about
gRPC. Times are seconds on the *server's* clock (the sink's injected clock), taken
when the event was received: client clocks are not trusted for scheduling.

Who sent a hint is a `Caller`, as the hint service's credentials say (never as
the payload declares): the sink's session table applies the ownership rule
(`sessions`), and the tenant's `TenantLimits` travel with the caller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, Union, runtime_checkable


class ToolOutcome(enum.Enum):
    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"


class SessionOutcome(enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class SessionPhase(enum.StrEnum):
    """What a session of the core's table is doing now (`SessionSnapshot.state`;
    the values are the wire's strings)."""

    LLM = "llm"  # an LLM call runs
    TOOL = "tool"  # an announced tool call is open
    IDLE = "idle"  # neither
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class WorkflowNode:
    name: str
    kind: str = "llm"  # "llm", "tool" or "end"


@dataclass(frozen=True, slots=True)
class WorkflowStructure:
    """A workflow's declared shape: which node may follow which."""

    nodes: tuple[WorkflowNode, ...] = ()
    edges: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class SessionStart:
    session_id: str
    time: float
    tenant: str = ""
    workflow: str = ""
    deadline_s: float | None = None  # seconds after `time`; None: no deadline
    structure: WorkflowStructure | None = None
    parent_id: str = ""  # the session that spawned this one (a subagent's parent); "" = none
    turn_deadline_s: float | None = None  # seconds each user turn may take (`turns`); None: none


@dataclass(frozen=True, slots=True)
class LlmCallStart:
    session_id: str
    time: float
    step: int = 0
    node: str = ""
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class LlmCallEnd:
    session_id: str
    time: float
    step: int = 0
    node: str = ""
    request_id: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    session_id: str
    time: float
    tool: str
    call_id: str = ""
    category: str = ""
    expected_duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    session_id: str
    time: float
    tool: str = ""
    call_id: str = ""
    outcome: ToolOutcome = ToolOutcome.OK


@dataclass(frozen=True, slots=True)
class SessionEnd:
    session_id: str
    time: float
    outcome: SessionOutcome = SessionOutcome.COMPLETED


HintEvent = Union[SessionStart, LlmCallStart, LlmCallEnd, ToolCallStart, ToolCallEnd, SessionEnd]


class HintRejected(ValueError):
    """An event that is well-formed on the wire but makes no sense for the session
    (a tool end without a start, an event for an ended session, no room for a new
    session). The sink's state is unchanged when this is raised."""


class AccessDenied(HintRejected):
    """The caller may not do this: another tenant's session, a tenant it is not,
    or over its tenant's session limit. Nothing changed; the refusal is counted."""


AGENT, ADMIN = "agent", "admin"


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may claim (set per tenant in the keys file); None: no limit."""

    min_deadline_s: float = 0.0  # a shorter declared deadline is raised to this (no deadline stays none)
    max_sessions: int | None = None  # live sessions it may have at once; a new one beyond is refused
    max_pinned_blocks: int | None = None  # KV blocks its sessions may hold under TTL pins (engines)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call, as its API key says. An `AGENT` acts as its `tenant` only,
    on its tenant's sessions; an `ADMIN` (the cluster router, an operator, the
    single shared key) may name any tenant and act on any session."""

    tenant: str
    role: str = AGENT
    limits: TenantLimits = field(default_factory=TenantLimits)

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN


@dataclass(frozen=True, slots=True)
class OpenTool:
    tool: str
    call_id: str
    started_at: float
    category: str = ""  # as hinted ("" = none named)


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One event in a session's recent history, for status displays and tests."""

    time: float
    kind: str  # "session_start", "llm_call_start", ... (the event class, snake_case)
    detail: str = ""  # node name for LLM calls, tool name for tool calls


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    session_id: str
    tenant: str
    workflow: str
    state: SessionPhase
    started_at: float
    last_event_at: float
    steps: int
    tool_calls: int
    current_node: str = ""
    deadline_at: float | None = None
    open_tools: tuple[OpenTool, ...] = ()
    history: tuple[HistoryEntry, ...] = ()
    parent_id: str = ""  # the session that spawned it ("" = a root)
    live_children: int = 0  # its subagents that are live now
    # Predictions and engine facts a richer sink may add (reuse probability,
    # predicted resume time, pinned blocks...): name -> value.
    metrics: Mapping[str, float] = field(default_factory=dict)


class HintSink(Protocol):
    """Where validated hints go. Implemented by the in-memory `SessionTable` and
    by the workflow core; called by the hint service (any thread, serialised by the
    caller is *not* assumed: implementations lock what they share).

    `accept` either applies the whole event or raises `HintRejected` and changes
    nothing; any other exception is a bug in the sink. Reads return copies.

    `caller` is who sent the call (None: a service without keys, or the engine
    itself: no checks, every session open to every call). With a caller, the
    session table's ownership rule applies (`sessions`): a session belongs to the
    tenant whose key started it; an agent's hint for another tenant's session, a
    `SessionStart` naming another tenant or over its tenant's session limit raise
    `AccessDenied`; `session` raises `AccessDenied` for another tenant's session
    (None stays "unknown"), and `sessions` lists the caller's own only. Admins
    pass every check. Each refusal is counted in `stats()` (`denied_*`).
    """

    def accept(self, event: HintEvent, caller: Caller | None = None) -> None: ...

    def session(self, session_id: str, caller: Caller | None = None) -> SessionSnapshot | None: ...

    def sessions(self, limit: int = 100, caller: Caller | None = None) -> Sequence[SessionSnapshot]: ...

    def stats(self) -> Mapping[str, float]: ...


@runtime_checkable
class PeerServiceSink(Protocol):
    """A sink that also ranks tenants across a cluster (Agent Fair Share): it takes
    the service other engines delivered per tenant since the last report, applies
    all of it or raises ValueError and applies none (see `core.cluster_share`). The
    service it delivered itself is each tenant's `TenantOutcomes.served_tokens`."""

    def record_peer_service(self, tokens: Mapping[str, float]) -> int: ...


@dataclass(frozen=True, slots=True)
class DeadlineOutcomes:
    """Of one tenant's tasks (or user turns) that ended with a deadline: how many
    ended within it, how many past it, and the share of its deadline each used
    (time taken over time given), summed over them."""

    met: int = 0
    missed: int = 0
    slack_used_sum: float = 0.0

    @property
    def mean_slack_used(self) -> float:
        ended = self.met + self.missed
        return self.slack_used_sum / ended if ended else 0.0


@dataclass(frozen=True, slots=True)
class TenantOutcomes:
    """What one tenant got from this engine, cumulative: its tasks' deadlines and
    its user turns' (None: none ended with one; a subagent counts as part of its
    root's task), and the tokens served to it (prefill + decode: what Agent Fair
    Share compares across a cluster's engines)."""

    tenant: str
    deadlines: DeadlineOutcomes | None = None
    turns: DeadlineOutcomes | None = None
    served_tokens: float = 0.0


@runtime_checkable
class TenantOutcomesSink(Protocol):
    """A sink that knows what each tenant got (`TenantOutcomes`, by tenant). The
    hint service shows an agent's key its own tenant's only."""

    def tenant_outcomes(self) -> Mapping[str, TenantOutcomes]: ...


@dataclass(frozen=True, slots=True)
class ResidentSession:
    """A session whose KV an engine holds (`KvResidencySink`)."""

    session_id: str
    in_tool: bool = False  # inside a tool call (or an inferred tool gap)
    kv_tokens: int = 0  # KV it holds on the engine's pool, tokens (0: not known)


@runtime_checkable
class KvResidencySink(Protocol):
    """A sink in front of an engine that holds KV for sessions: `resident_sessions`
    lists up to `limit` of them, most recently active first: those it served a
    prompt for that have not ended nor moved to another engine since (a session
    it only heard hints of is not resident)."""

    def resident_sessions(self, limit: int) -> Sequence[ResidentSession]: ...


@runtime_checkable
class KvReleaseSink(Protocol):
    """A sink in front of an engine that holds KV for sessions: `release_session`
    makes the engine drop its holds and pins for the session (it moved to another
    engine) while the session's workflow state stays. Returns whether a release was
    queued; never raises for an unknown session. An agent `caller` may release only
    its tenant's sessions (`AccessDenied` otherwise, counted `denied_release`)."""

    def release_session(self, session_id: str, caller: Caller | None = None) -> bool: ...


@dataclass(frozen=True, slots=True)
class AdmissionStats:
    """Session admission under KV overload (`core.admission`), at one read."""

    active: int = 0  # sessions admitted: their requests may be scheduled
    parked: int = 0  # sessions that gave way; their KV may go first
    waiting: int = 0  # sessions whose requests wait in the queue, unscheduled
    limit_tokens: float = 0.0  # the adaptive limit on admitted sessions' tokens
    wait_s: float = 0.0  # admission waits of admitted requests, summed since the start


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What an engine reports of its own KV, besides the core's stats: GetStats'
    `ServerStats.engine` (`proto/saga/v1/hints.proto`), and what the cluster router
    reads of each replica. Gauges are at the read; `hints_dropped` is cumulative
    since the engine started.

    - `held_sessions`: sessions whose KV the engine holds (soft, protected or pinned);
    - `held_blocks`: KV blocks held for them, `pinned_blocks` of which are pinned for
      tool calls; `kv_blocks`: the blocks of the pool (so `held_blocks / kv_blocks`
      is the pool's share held for sessions);
    - `hints_dropped`: engine-bound hints the full intake queue dropped;
    - `admission`: None where admission is off;
    - `counts`: the engine's counted metrics (those `in_stats` of the metrics
      schema, `saga_server.metrics_schema`): metric -> its label's value -> figure
      ("" for a metric without a label); counters are cumulative, gauges at their
      last update; a count that never happened is absent, not 0;
    - `tables`: the entries of each per-session and per-request table the engine
      keeps, at the read (what a soak watches stay flat).
    """

    held_sessions: int = 0
    held_blocks: int = 0
    pinned_blocks: int = 0
    kv_blocks: int = 0
    hints_dropped: int = 0
    admission: AdmissionStats | None = None
    counts: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    tables: Mapping[str, int] = field(default_factory=dict)


@runtime_checkable
class EngineStatsSink(Protocol):
    """A sink in front of an engine: `engine_stats` is the engine's own figures, or
    None when they could not be read this time (the rest of GetStats still answers)."""

    def engine_stats(self) -> EngineStats | None: ...
