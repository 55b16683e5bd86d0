"""User turns: the unit a person waits on, and the deadline a product states for it.

A session with a person in the loop (a coding assistant, a chat agent) runs in
turns: its user asks, the agent works (several LLM calls and tools), and hands
the turn back. Clients hint that hand-back as a tool call of category `human`
(`categories.HUMAN`): its start ends the turn, its end (the user's reply) starts
the next. The session's start starts its first turn; its end ends its last.

What a product promises there is a time per turn ("answer within a minute"), not
per task: a task spans a person's waits of minutes to hours, which nothing here
can shorten. So a session may declare `turn_deadline_s` (`SessionStart`): each of
its turns should end within that many seconds of its start. The deadline in force,
`SessionRecord.deadline_at`, which every policy reads (urgency in `fairshare`, classes in
`deadlines`), is the task's deadline or the open turn's, whichever comes first;
while the session waits on its user it is the task's alone (no turn is running to
be late). A subagent inherits its parent's deadline in force when it starts. A
session's first turn starts when the core first sees it, whatever the event; a
turn in which the agent made no LLM call (its user answered and went again, or
the session ended) is no turn.

Turn boundaries also teach the AEG how many LLM calls a turn takes, so urgency
compares the time left *in the turn* with the time left to its deadline
(`graph.WorkflowGraphs.remaining_in_turn`). A turn that ends counts, per tenant,
as within or past its deadline (`WorkflowCore.tenant_outcomes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `sessions` calls these rules as hints move a record
    from .sessions import SessionRecord

__all__ = ["begin_turn", "end_turn", "turn_open", "sooner"]


def turn_open(s: "SessionRecord") -> bool:
    """Whether the session's user turn is running (not waiting on its user)."""
    return s.turn_started_at is not None


def begin_turn(s: "SessionRecord", t: float) -> None:
    """The session's user gave it a turn at `t`: its turn deadline, if any, runs."""
    s.turn_started_at = t
    s.turn_steps = s.steps
    turn_due = t + s.turn_deadline_s if s.turn_deadline_s is not None else None
    s.deadline_at = sooner(s.task_deadline_at, turn_due)


def end_turn(s: "SessionRecord", t: float) -> float | None:
    """The session handed the turn back (or ended) at `t`. Returns the turn's span
    in seconds, None when no turn was running."""
    if s.turn_started_at is None:
        return None
    span = max(t - s.turn_started_at, 0.0)
    s.turn_started_at = None
    s.deadline_at = s.task_deadline_at
    return span


def sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two deadlines (None: none)."""
    if a is None:
        return b
    return a if b is None else min(a, b)
