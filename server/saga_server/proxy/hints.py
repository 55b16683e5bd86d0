"""The hints the proxy infers, as the core's own events, and `send_hint`, the one
place they become calls to the hint service.

`SessionTracker` describes every hint as a `saga_server.core.events` event (the
same dataclasses the hint service hands the core), wrapped in a `Hint` with the
`HintFacts` an observer may learn beside it. The proxy sends each hint's event
with `send_hint` and hands the whole `Hint` to its recorder (`proxy.recording`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from saga_server.core.events import (
    HintEvent,
    LlmCallEnd,
    LlmCallStart,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
)

if TYPE_CHECKING:
    from saga_sdk import HintClient

__all__ = ["Hint", "HintFacts", "send_hint"]


@dataclass(frozen=True, slots=True)
class HintFacts:
    """What an observer (the recorder) may learn beside a hint that the hint service
    has no field for: sizes and labels, never text. Each field belongs to one kind
    of event and keeps its default on the others."""

    # LlmCallStart. `extends`: what the request's history continues, "answer" (the
    # session's previous request and its answer), "request" (that request alone) or "".
    extends: str = ""
    prompt_chars: int = 0
    model: str = ""
    # LlmCallEnd
    cached_tokens: int | None = None  # None where the upstream did not say
    output_chars: int = 0
    failed: bool = False
    # SessionEnd: why the tracker ended it (submit, final, marked_final, idle, gone, evicted, closed)
    end_reason: str = ""


@dataclass(frozen=True, slots=True)
class Hint:
    """One hint the tracker inferred. `event.time` is the tracker's clock."""

    event: HintEvent
    facts: HintFacts = field(default_factory=HintFacts)


def send_hint(client: HintClient, event: HintEvent) -> None:
    """Send one core hint event through `client`: the one `HintClient` call of the
    event's kind, each event field passed as the argument of the same name
    (outcomes as their values, a structure as (name, kind) nodes and its edges).

    The event's `time` is not sent: the client stamps the moment it queues the hint,
    and the server trusts only its own clock anyway. Like every `HintClient` call
    this only enqueues, so it neither blocks nor fails when the hint service is
    down: the agent's request never waits for it. Raises `TypeError` for anything
    that is not a core hint event (a caller's bug, for the caller to log)."""
    match event:
        case SessionStart(session_id=sid, structure=structure):
            client.session_start(sid, tenant=event.tenant, workflow=event.workflow, deadline_s=event.deadline_s,
                                 nodes=[(n.name, n.kind) for n in structure.nodes] if structure else (),
                                 edges=structure.edges if structure else (), parent_id=event.parent_id,
                                 turn_deadline_s=event.turn_deadline_s)
        case LlmCallStart(session_id=sid):
            client.llm_call_start(sid, step=event.step, node=event.node, request_id=event.request_id)
        case LlmCallEnd(session_id=sid):
            client.llm_call_end(sid, step=event.step, node=event.node, request_id=event.request_id,
                                prompt_tokens=event.prompt_tokens, output_tokens=event.output_tokens)
        case ToolCallStart(session_id=sid):
            client.tool_call_start(sid, event.tool, call_id=event.call_id, category=event.category,
                                   expected_duration_s=event.expected_duration_s)
        case ToolCallEnd(session_id=sid):
            client.tool_call_end(sid, event.tool, call_id=event.call_id, outcome=event.outcome.value)
        case SessionEnd(session_id=sid):
            client.session_end(sid, outcome=event.outcome.value)
        case _:
            raise TypeError(f"not a core hint event: {type(event).__name__}")
