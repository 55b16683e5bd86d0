"""`RecordingRegistry`: the real `SessionTable`, also keeping every accepted event."""

from __future__ import annotations

from saga_server.core import SessionTable

__all__ = ["RecordingRegistry"]


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
