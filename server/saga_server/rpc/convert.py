"""Wire <-> core translation for hints, with the validation every event passes.

An event that fails validation raises `InvalidHint` with a reason a client
developer can act on; the caller counts it and moves on to the next event.
"""

from __future__ import annotations

import math
from typing import Iterable

from saga_proto import hints_pb2 as pb

from ..core.events import (
    DeadlineOutcomes,
    EngineStats,
    HintEvent,
    LlmCallEnd,
    LlmCallStart,
    SessionEnd,
    SessionOutcome,
    SessionSnapshot,
    SessionStart,
    TenantOutcomes,
    ToolCallEnd,
    ToolCallStart,
    ToolOutcome,
    WorkflowNode,
    WorkflowStructure,
)

__all__ = ["InvalidHint", "Limits", "engine_stats_to_wire", "from_wire", "session_list", "snapshot_to_wire",
           "tenant_outcomes_to_wire"]


class InvalidHint(ValueError):
    """A hint that is malformed on the wire (missing ids, unknown kind, too large)."""


class Limits:
    max_id_chars = 256
    max_name_chars = 256
    max_nodes = 512
    max_edges = 4096
    max_events_per_batch = 4096
    max_step = 10_000_000
    max_seconds = 30 * 24 * 3600.0
    max_list_bytes = 4 * 1024 * 1024 - 64 * 1024  # a session listing: what a client receives by default, less a margin


_NODE_KINDS = {"", "llm", "tool", "end"}
# Each wire outcome is the core's of the same name (`TOOL_OUTCOME_OK` is `ToolOutcome.OK`);
# an unspecified one is the default.
_TOOL_OUTCOMES = {pb.TOOL_OUTCOME_UNSPECIFIED: ToolOutcome.OK,
                  **{pb.ToolOutcome.Value(f"TOOL_OUTCOME_{o.name}"): o for o in ToolOutcome}}
_SESSION_OUTCOMES = {pb.SESSION_OUTCOME_UNSPECIFIED: SessionOutcome.COMPLETED,
                     **{pb.SessionOutcome.Value(f"SESSION_OUTCOME_{o.name}"): o for o in SessionOutcome}}


def from_wire(event: "pb.HintEvent", now: float) -> HintEvent:
    """Validate one wire event and return the core event, stamped `now`."""
    sid = _text(event.session_id, "session_id", Limits.max_id_chars, required=True)
    kind = event.WhichOneof("kind")
    if kind is None:
        raise InvalidHint("event has no kind (unknown to this server version?)")
    if kind == "session_start":
        m = event.session_start
        return SessionStart(
            sid, now,
            tenant=_text(m.tenant, "tenant", Limits.max_name_chars),
            workflow=_text(m.workflow, "workflow", Limits.max_name_chars),
            deadline_s=_seconds(m.deadline_s, "deadline_s") or None,
            structure=_structure(m.structure) if m.HasField("structure") else None,
            parent_id=_text(m.parent_session_id, "parent_session_id", Limits.max_id_chars),
            turn_deadline_s=_seconds(m.turn_deadline_s, "turn_deadline_s") or None,
        )
    if kind == "llm_call_start":
        m = event.llm_call_start
        return LlmCallStart(sid, now, step=_step(m.step), node=_text(m.node, "node", Limits.max_name_chars),
                            request_id=_text(m.request_id, "request_id", Limits.max_id_chars))
    if kind == "llm_call_end":
        m = event.llm_call_end
        return LlmCallEnd(sid, now, step=_step(m.step), node=_text(m.node, "node", Limits.max_name_chars),
                          request_id=_text(m.request_id, "request_id", Limits.max_id_chars),
                          prompt_tokens=m.prompt_tokens, output_tokens=m.output_tokens)
    if kind == "tool_call_start":
        m = event.tool_call_start
        return ToolCallStart(sid, now, tool=_text(m.tool, "tool", Limits.max_name_chars, required=True),
                             call_id=_text(m.call_id, "call_id", Limits.max_id_chars),
                             category=_text(m.category, "category", Limits.max_name_chars),
                             expected_duration_s=_seconds(m.expected_duration_s, "expected_duration_s") or None)
    if kind == "tool_call_end":
        m = event.tool_call_end
        tool = _text(m.tool, "tool", Limits.max_name_chars)
        call_id = _text(m.call_id, "call_id", Limits.max_id_chars)
        if not tool and not call_id:
            raise InvalidHint("tool_call_end needs tool or call_id")
        if m.outcome not in _TOOL_OUTCOMES:
            raise InvalidHint(f"unknown tool outcome {m.outcome}")
        return ToolCallEnd(sid, now, tool=tool, call_id=call_id, outcome=_TOOL_OUTCOMES[m.outcome])
    if kind == "session_end":
        outcome = event.session_end.outcome
        if outcome not in _SESSION_OUTCOMES:
            raise InvalidHint(f"unknown session outcome {outcome}")
        return SessionEnd(sid, now, outcome=_SESSION_OUTCOMES[outcome])
    raise InvalidHint(f"unknown event kind {kind!r}")  # pragma: no cover - oneof is closed


def snapshot_to_wire(snap: SessionSnapshot, now: float) -> "pb.SessionState":
    state = pb.SessionState(
        session_id=snap.session_id, tenant=snap.tenant, workflow=snap.workflow, state=snap.state,
        steps=snap.steps, tool_calls=snap.tool_calls, current_node=snap.current_node,
        age_s=now - snap.started_at, idle_s=now - snap.last_event_at,
        deadline_in_s=math.nan if snap.deadline_at is None else snap.deadline_at - now,
        parent_session_id=snap.parent_id, live_children=snap.live_children,
    )
    for tool in snap.open_tools:
        state.open_tools.add(tool=tool.tool, call_id=tool.call_id, running_s=now - tool.started_at)
    for entry in snap.history:
        state.history.add(age_s=now - entry.time, kind=entry.kind, detail=entry.detail)
    for key, value in snap.metrics.items():
        state.metrics[key] = float(value)
    return state


def engine_stats_to_wire(stats: EngineStats) -> "pb.EngineStats":
    out = pb.EngineStats(held_sessions=stats.held_sessions, held_blocks=stats.held_blocks,
                         pinned_blocks=stats.pinned_blocks, kv_blocks=stats.kv_blocks,
                         hints_dropped=stats.hints_dropped,
                         counts={name: pb.MetricCounts(by_label=dict(by_label))
                                 for name, by_label in stats.counts.items()},
                         tables={name: max(int(n), 0) for name, n in stats.tables.items()})
    adm = stats.admission
    if adm is not None:
        out.admission.CopyFrom(pb.AdmissionStats(active=adm.active, parked=adm.parked, waiting=adm.waiting,
                                                 limit_tokens=adm.limit_tokens, wait_s=adm.wait_s))
    return out


def session_list(states: Iterable["pb.SessionState"], limit: int) -> "pb.SessionList":
    """The first `limit` of `states`, or fewer: as many as fit in
    `Limits.max_list_bytes` (each snapshot carries its history, so a full table of
    busy sessions would outgrow what a client takes)."""
    reply, size = pb.SessionList(), 0
    for state in states:
        size += state.ByteSize() + 6  # its tag and length in the list
        if len(reply.sessions) >= limit or size > Limits.max_list_bytes:
            break
        reply.sessions.append(state)
    return reply


def _text(value: str, field: str, limit: int, required: bool = False) -> str:
    if required and not value:
        raise InvalidHint(f"{field} is required")
    if len(value) > limit:
        raise InvalidHint(f"{field} longer than {limit} characters")
    if not value.isprintable():
        raise InvalidHint(f"{field} has control characters")
    return value


def _seconds(value: float, field: str) -> float:
    if not math.isfinite(value) or value < 0 or value > Limits.max_seconds:
        raise InvalidHint(f"{field} must be within [0, {Limits.max_seconds:.0f}] seconds")
    return value


def _step(value: int) -> int:
    if value > Limits.max_step:
        raise InvalidHint(f"step above {Limits.max_step}")
    return value


def _structure(m: "pb.WorkflowStructure") -> WorkflowStructure:
    if len(m.nodes) > Limits.max_nodes or len(m.edges) > Limits.max_edges:
        raise InvalidHint(f"structure larger than {Limits.max_nodes} nodes / {Limits.max_edges} edges")
    nodes = []
    for node in m.nodes:
        if node.kind not in _NODE_KINDS:
            raise InvalidHint(f"node kind must be llm, tool or end, not {node.kind!r}")
        nodes.append(WorkflowNode(_text(node.name, "node name", Limits.max_name_chars, required=True),
                                  node.kind or "llm"))
    edges = tuple((_text(e.src, "edge src", Limits.max_name_chars, required=True),
                   _text(e.dst, "edge dst", Limits.max_name_chars, required=True)) for e in m.edges)
    return WorkflowStructure(tuple(nodes), edges)


def tenant_outcomes_to_wire(outcomes: TenantOutcomes) -> "pb.TenantOutcomes":
    """Its deadlines' and turns' outcomes (served tokens travel in `ServerStats.served_tokens_by_tenant`)."""
    out = pb.TenantOutcomes()
    if outcomes.deadlines is not None:
        out.deadlines.CopyFrom(_deadline_outcomes(outcomes.deadlines))
    if outcomes.turns is not None:
        out.turns.CopyFrom(_deadline_outcomes(outcomes.turns))
    return out


def _deadline_outcomes(found: DeadlineOutcomes) -> "pb.DeadlineOutcomes":
    return pb.DeadlineOutcomes(met=found.met, missed=found.missed, slack_used_sum=found.slack_used_sum)
