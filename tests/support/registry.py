"""`RecordingRegistry`: the real `SessionTable`, also keeping every accepted event;
`trace`: those events as comparable tuples."""

from __future__ import annotations

from saga_server.core import SessionTable
from saga_server.core.events import LlmCallEnd, LlmCallStart, SessionEnd, SessionStart, ToolCallEnd, ToolCallStart

__all__ = ["RecordingRegistry", "trace"]


class RecordingRegistry(SessionTable):
    """The real table; also keeps every accepted event, in arrival order (its
    history leaves out fields tests check: call ids, durations, structure, tokens,
    tool outcomes)."""

    def __init__(self) -> None:
        super().__init__(max_sessions=1000)
        self.events: list = []

    def accept(self, event, caller=None) -> None:
        super().accept(event, caller)
        self.events.append(event)

    def of(self, session_id: str) -> list:
        return [e for e in self.events if e.session_id == session_id]


def trace(events) -> list[tuple]:
    """Hint events as comparable tuples (no times): ("session_start", workflow),
    ("llm_start"/"llm_end", step, node), ("tool_start", tool, call id),
    ("tool_end", tool, call id, outcome), ("session_end", outcome)."""
    out = []
    for e in events:
        if isinstance(e, SessionStart):
            out.append(("session_start", e.workflow))
        elif isinstance(e, LlmCallStart):
            out.append(("llm_start", e.step, e.node))
        elif isinstance(e, LlmCallEnd):
            out.append(("llm_end", e.step, e.node))
        elif isinstance(e, ToolCallStart):
            out.append(("tool_start", e.tool, e.call_id))
        elif isinstance(e, ToolCallEnd):
            out.append(("tool_end", e.tool, e.call_id, e.outcome.value))
        elif isinstance(e, SessionEnd):
            out.append(("session_end", e.outcome.value))
    return out
