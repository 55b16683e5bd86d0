"""What the simulator replays: agent tasks as chains of LLM steps with tools between.

Built by `saga_server.bench.workload` from `saga-trace/1` files; kept here, as plain
frozen dataclasses, so the engine does not depend on the trace format.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ToolSpec", "StepSpec", "TaskSpec", "TaskInstance"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    category: str
    duration_s: float  # from the trace, or drawn from the fallback distribution
    from_trace: bool = True


@dataclass(frozen=True, slots=True)
class StepSpec:
    prompt_tokens: int
    output_tokens: int
    reused_tokens: int  # leading prompt tokens that are the previous prompt + answer
    # Tool calls run after this step, in parallel (the step's gap is the longest).
    tools: tuple[ToolSpec, ...] = ()
    # Gap before the next step when there is no tool (e.g. a simulated user's turn).
    idle_s: float = 0.0
    # Subagents this step starts, in parallel with its tools: the session's next step
    # comes once they have all ended and its tools are done (the parent waits on them).
    spawns: tuple["TaskSpec", ...] = ()
    # `idle_s` is a person's: the agent handed the turn back, the next step starts a new
    # user turn after minutes (a human in the loop, not a tool or a simulated user).
    human: bool = False
    # This step's prompt restarts from a short prefix (the context was compacted): the
    # session's KV past `reused_tokens` is garbage from now on.
    compaction: bool = False
    # What the hosted API reported as served from its own prefix cache (None: unknown).
    cached_tokens: int | None = None

    @property
    def gap_s(self) -> float:
        return max((t.duration_s for t in self.tools), default=self.idle_s)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    task_id: str
    run: str  # tasks of one run share `shared_prefix_tokens`
    shared_prefix_tokens: int
    steps: tuple[StepSpec, ...]


@dataclass(frozen=True, slots=True)
class TaskInstance:
    """One replayed task: a distinct session, its tenant, when it arrives (None: it is
    started by the closed-loop concurrency limit), its deadline multiple, and its
    user turns' deadline multiple (each turn may take that multiple of the task's
    mean unloaded turn: `results.unloaded_turns_s`); a subagent's names its parent
    and is started by it, never by the load."""

    session_id: str
    task: TaskSpec
    tenant: str = "default"
    arrival_s: float | None = None
    deadline_factor: float | None = None
    parent_id: str = ""  # a subagent's parent session ("" for a task of its own)
    turn_deadline_factor: float | None = None
