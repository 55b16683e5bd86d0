from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_OUTCOME_UNSPECIFIED: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_OK: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_ERROR: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_CANCELLED: _ClassVar[ToolOutcome]

class SessionOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_OUTCOME_UNSPECIFIED: _ClassVar[SessionOutcome]
    SESSION_OUTCOME_COMPLETED: _ClassVar[SessionOutcome]
    SESSION_OUTCOME_FAILED: _ClassVar[SessionOutcome]
    SESSION_OUTCOME_CANCELLED: _ClassVar[SessionOutcome]
TOOL_OUTCOME_UNSPECIFIED: ToolOutcome
TOOL_OUTCOME_OK: ToolOutcome
TOOL_OUTCOME_ERROR: ToolOutcome
TOOL_OUTCOME_CANCELLED: ToolOutcome
SESSION_OUTCOME_UNSPECIFIED: SessionOutcome
SESSION_OUTCOME_COMPLETED: SessionOutcome
SESSION_OUTCOME_FAILED: SessionOutcome
SESSION_OUTCOME_CANCELLED: SessionOutcome

class WorkflowNode(_message.Message):
    __slots__ = ("name", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class WorkflowEdge(_message.Message):
    __slots__ = ("src", "dst")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ...) -> None: ...

class WorkflowStructure(_message.Message):
    __slots__ = ("nodes", "edges")
    NODES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[WorkflowNode]
    edges: _containers.RepeatedCompositeFieldContainer[WorkflowEdge]
    def __init__(self, nodes: _Optional[_Iterable[_Union[WorkflowNode, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[WorkflowEdge, _Mapping]]] = ...) -> None: ...

class SessionStart(_message.Message):
    __slots__ = ("tenant", "workflow", "deadline_s", "structure", "parent_session_id", "turn_deadline_s")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    STRUCTURE_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    workflow: str
    deadline_s: float
    structure: WorkflowStructure
    parent_session_id: str
    turn_deadline_s: float
    def __init__(self, tenant: _Optional[str] = ..., workflow: _Optional[str] = ..., deadline_s: _Optional[float] = ..., structure: _Optional[_Union[WorkflowStructure, _Mapping]] = ..., parent_session_id: _Optional[str] = ..., turn_deadline_s: _Optional[float] = ...) -> None: ...

class LlmCallStart(_message.Message):
    __slots__ = ("step", "node", "request_id")
    STEP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    step: int
    node: str
    request_id: str
    def __init__(self, step: _Optional[int] = ..., node: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class LlmCallEnd(_message.Message):
    __slots__ = ("step", "node", "request_id", "prompt_tokens", "output_tokens")
    STEP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    step: int
    node: str
    request_id: str
    prompt_tokens: int
    output_tokens: int
    def __init__(self, step: _Optional[int] = ..., node: _Optional[str] = ..., request_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class ToolCallStart(_message.Message):
    __slots__ = ("tool", "call_id", "category", "expected_duration_s")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    tool: str
    call_id: str
    category: str
    expected_duration_s: float
    def __init__(self, tool: _Optional[str] = ..., call_id: _Optional[str] = ..., category: _Optional[str] = ..., expected_duration_s: _Optional[float] = ...) -> None: ...

class ToolCallEnd(_message.Message):
    __slots__ = ("tool", "call_id", "outcome")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    tool: str
    call_id: str
    outcome: ToolOutcome
    def __init__(self, tool: _Optional[str] = ..., call_id: _Optional[str] = ..., outcome: _Optional[_Union[ToolOutcome, str]] = ...) -> None: ...

class SessionEnd(_message.Message):
    __slots__ = ("outcome",)
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: SessionOutcome
    def __init__(self, outcome: _Optional[_Union[SessionOutcome, str]] = ...) -> None: ...

class HintEvent(_message.Message):
    __slots__ = ("session_id", "client_time", "session_start", "llm_call_start", "llm_call_end", "tool_call_start", "tool_call_end", "session_end")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TIME_FIELD_NUMBER: _ClassVar[int]
    SESSION_START_FIELD_NUMBER: _ClassVar[int]
    LLM_CALL_START_FIELD_NUMBER: _ClassVar[int]
    LLM_CALL_END_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_START_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_END_FIELD_NUMBER: _ClassVar[int]
    SESSION_END_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    client_time: float
    session_start: SessionStart
    llm_call_start: LlmCallStart
    llm_call_end: LlmCallEnd
    tool_call_start: ToolCallStart
    tool_call_end: ToolCallEnd
    session_end: SessionEnd
    def __init__(self, session_id: _Optional[str] = ..., client_time: _Optional[float] = ..., session_start: _Optional[_Union[SessionStart, _Mapping]] = ..., llm_call_start: _Optional[_Union[LlmCallStart, _Mapping]] = ..., llm_call_end: _Optional[_Union[LlmCallEnd, _Mapping]] = ..., tool_call_start: _Optional[_Union[ToolCallStart, _Mapping]] = ..., tool_call_end: _Optional[_Union[ToolCallEnd, _Mapping]] = ..., session_end: _Optional[_Union[SessionEnd, _Mapping]] = ...) -> None: ...

class HintBatch(_message.Message):
    __slots__ = ("client_id", "sequence", "events")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    sequence: int
    events: _containers.RepeatedCompositeFieldContainer[HintEvent]
    def __init__(self, client_id: _Optional[str] = ..., sequence: _Optional[int] = ..., events: _Optional[_Iterable[_Union[HintEvent, _Mapping]]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("index", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    reason: str
    def __init__(self, index: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class HintAck(_message.Message):
    __slots__ = ("sequence", "accepted", "rejected", "rejections", "duplicate")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    accepted: int
    rejected: int
    rejections: _containers.RepeatedCompositeFieldContainer[Rejection]
    duplicate: bool
    def __init__(self, sequence: _Optional[int] = ..., accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., rejections: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., duplicate: bool = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class OpenToolCall(_message.Message):
    __slots__ = ("tool", "call_id", "running_s")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_S_FIELD_NUMBER: _ClassVar[int]
    tool: str
    call_id: str
    running_s: float
    def __init__(self, tool: _Optional[str] = ..., call_id: _Optional[str] = ..., running_s: _Optional[float] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("age_s", "kind", "detail")
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    age_s: float
    kind: str
    detail: str
    def __init__(self, age_s: _Optional[float] = ..., kind: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class SessionState(_message.Message):
    __slots__ = ("session_id", "tenant", "workflow", "state", "steps", "tool_calls", "current_node", "age_s", "idle_s", "deadline_in_s", "open_tools", "history", "metrics", "parent_session_id", "live_children")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_NODE_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_S_FIELD_NUMBER: _ClassVar[int]
    OPEN_TOOLS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LIVE_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    workflow: str
    state: str
    steps: int
    tool_calls: int
    current_node: str
    age_s: float
    idle_s: float
    deadline_in_s: float
    open_tools: _containers.RepeatedCompositeFieldContainer[OpenToolCall]
    history: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    metrics: _containers.ScalarMap[str, float]
    parent_session_id: str
    live_children: int
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., workflow: _Optional[str] = ..., state: _Optional[str] = ..., steps: _Optional[int] = ..., tool_calls: _Optional[int] = ..., current_node: _Optional[str] = ..., age_s: _Optional[float] = ..., idle_s: _Optional[float] = ..., deadline_in_s: _Optional[float] = ..., open_tools: _Optional[_Iterable[_Union[OpenToolCall, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., parent_session_id: _Optional[str] = ..., live_children: _Optional[int] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class SessionList(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionState]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionState, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdmissionStats(_message.Message):
    __slots__ = ("active", "parked", "waiting", "limit_tokens", "wait_s")
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    active: int
    parked: int
    waiting: int
    limit_tokens: float
    wait_s: float
    def __init__(self, active: _Optional[int] = ..., parked: _Optional[int] = ..., waiting: _Optional[int] = ..., limit_tokens: _Optional[float] = ..., wait_s: _Optional[float] = ...) -> None: ...

class MetricCounts(_message.Message):
    __slots__ = ("by_label",)
    class ByLabelEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    BY_LABEL_FIELD_NUMBER: _ClassVar[int]
    by_label: _containers.ScalarMap[str, float]
    def __init__(self, by_label: _Optional[_Mapping[str, float]] = ...) -> None: ...

class EngineStats(_message.Message):
    __slots__ = ("held_sessions", "held_blocks", "pinned_blocks", "kv_blocks", "hints_dropped", "admission", "counts", "tables")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetricCounts
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetricCounts, _Mapping]] = ...) -> None: ...
    class TablesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    HELD_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    HELD_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HINTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    held_sessions: int
    held_blocks: int
    pinned_blocks: int
    kv_blocks: int
    hints_dropped: int
    admission: AdmissionStats
    counts: _containers.MessageMap[str, MetricCounts]
    tables: _containers.ScalarMap[str, int]
    def __init__(self, held_sessions: _Optional[int] = ..., held_blocks: _Optional[int] = ..., pinned_blocks: _Optional[int] = ..., kv_blocks: _Optional[int] = ..., hints_dropped: _Optional[int] = ..., admission: _Optional[_Union[AdmissionStats, _Mapping]] = ..., counts: _Optional[_Mapping[str, MetricCounts]] = ..., tables: _Optional[_Mapping[str, int]] = ...) -> None: ...

class DeadlineOutcomes(_message.Message):
    __slots__ = ("met", "missed", "slack_used_sum")
    MET_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    SLACK_USED_SUM_FIELD_NUMBER: _ClassVar[int]
    met: int
    missed: int
    slack_used_sum: float
    def __init__(self, met: _Optional[int] = ..., missed: _Optional[int] = ..., slack_used_sum: _Optional[float] = ...) -> None: ...

class TenantOutcomes(_message.Message):
    __slots__ = ("deadlines", "turns")
    DEADLINES_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    deadlines: DeadlineOutcomes
    turns: DeadlineOutcomes
    def __init__(self, deadlines: _Optional[_Union[DeadlineOutcomes, _Mapping]] = ..., turns: _Optional[_Union[DeadlineOutcomes, _Mapping]] = ...) -> None: ...

class ServerStats(_message.Message):
    __slots__ = ("stats", "served_tokens_by_tenant", "engine", "engine_by_replica", "tenant_outcomes")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ServedTokensByTenantEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class EngineByReplicaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: EngineStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[EngineStats, _Mapping]] = ...) -> None: ...
    class TenantOutcomesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TenantOutcomes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TenantOutcomes, _Mapping]] = ...) -> None: ...
    STATS_FIELD_NUMBER: _ClassVar[int]
    SERVED_TOKENS_BY_TENANT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_BY_REPLICA_FIELD_NUMBER: _ClassVar[int]
    TENANT_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.ScalarMap[str, float]
    served_tokens_by_tenant: _containers.ScalarMap[str, float]
    engine: EngineStats
    engine_by_replica: _containers.MessageMap[str, EngineStats]
    tenant_outcomes: _containers.MessageMap[str, TenantOutcomes]
    def __init__(self, stats: _Optional[_Mapping[str, float]] = ..., served_tokens_by_tenant: _Optional[_Mapping[str, float]] = ..., engine: _Optional[_Union[EngineStats, _Mapping]] = ..., engine_by_replica: _Optional[_Mapping[str, EngineStats]] = ..., tenant_outcomes: _Optional[_Mapping[str, TenantOutcomes]] = ...) -> None: ...

class PeerService(_message.Message):
    __slots__ = ("tenant_tokens", "source")
    class TenantTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TENANT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    tenant_tokens: _containers.ScalarMap[str, float]
    source: str
    def __init__(self, tenant_tokens: _Optional[_Mapping[str, float]] = ..., source: _Optional[str] = ...) -> None: ...

class PeerServiceAck(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: int
    def __init__(self, tenants: _Optional[int] = ...) -> None: ...

class ReleaseSessionRequest(_message.Message):
    __slots__ = ("session_id", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseSessionAck(_message.Message):
    __slots__ = ("queued",)
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    queued: bool
    def __init__(self, queued: bool = ...) -> None: ...

class ListResidentRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ResidentSession(_message.Message):
    __slots__ = ("session_id", "in_tool", "kv_tokens")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    IN_TOOL_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    in_tool: bool
    kv_tokens: int
    def __init__(self, session_id: _Optional[str] = ..., in_tool: bool = ..., kv_tokens: _Optional[int] = ...) -> None: ...

class ResidentSessions(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[ResidentSession]
    def __init__(self, sessions: _Optional[_Iterable[_Union[ResidentSession, _Mapping]]] = ...) -> None: ...
