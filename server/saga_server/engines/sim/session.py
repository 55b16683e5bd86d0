"""A simulated agent session and its LLM requests: the state policies read."""

from __future__ import annotations

from enum import StrEnum

from .results import SPLIT
from .tasks import TaskInstance

__all__ = ["Session", "Request", "StepPhase", "QUEUED", "RUNNING", "TOOL", "ENDED", "ARRIVE", "request_key"]

ARRIVE = "arrive"  # Session.awaiting_kv: its next request arrived while its KV was in flight


class StepPhase(StrEnum):
    """Where a replayed session is in its step. The core's `SessionPhase` sees the first
    two as one (`llm`) and has no `queued`: the engine's queue is the simulator's."""

    QUEUED = "queued"  # its request waits at its worker (gate, queue, or its KV on the way)
    RUNNING = "running"  # its request is in the batch
    TOOL = "tool"  # its tools run, or its person answers
    ENDED = "ended"


# The members as module names: read off the class, a member is a metaclass lookup, and
# the router's views and prefetch plans read a phase for every live session.
QUEUED, RUNNING, TOOL, ENDED = StepPhase.QUEUED, StepPhase.RUNNING, StepPhase.TOOL, StepPhase.ENDED


class Session:
    __slots__ = ("session_id", "task", "tenant", "worker", "step", "started_at",
                 "last_access", "state", "next_use", "tool_names", "kv_tokens", "base",
                 "prefetch_ready_at", "unloaded_s", "deadline_s",
                 "turn_deadline_s", "turn_started_at", "turn_spans",
                 "move_to", "move_in_tool", "in_transit", "awaiting_kv",
                 "parent_id", "children_left", "tool_done", "back_from_children", "split")

    def __init__(self, inst: TaskInstance, now: float, base: int) -> None:
        self.session_id = inst.session_id
        self.task = inst.task
        self.tenant = inst.tenant
        self.worker = -1
        self.step = 0
        self.started_at = now
        self.last_access = now
        self.state = QUEUED
        self.next_use = now
        self.tool_names: tuple[str, ...] = ()
        self.kv_tokens = 0
        self.base = base  # shared-prefix tokens, always resident
        self.prefetch_ready_at = 0.0
        self.unloaded_s = 0.0
        self.deadline_s: float | None = None
        self.turn_deadline_s: float | None = None  # each user turn's (`core.turns`)
        self.turn_started_at = now  # its running user turn's start
        self.turn_spans: list[float] = []  # its finished user turns' times
        self.move_to = -1  # a planned move not yet started (the session was running)
        self.move_in_tool = False  # the router chose it while it was in a tool
        self.in_transit = False  # its KV is on the way to `worker`
        self.awaiting_kv = None  # what waits for its KV in flight: ARRIVE or a stolen queue item
        self.parent_id = inst.parent_id
        self.children_left = 0  # its subagents still running
        self.tool_done = False  # its tools' time is up while its subagents still run
        self.back_from_children = False  # its next request is the first after its subagents returned
        self.split = [0.0] * len(SPLIT)  # where its time went (`results.SPLIT`)


class Request:
    __slots__ = ("sess", "key", "prompt", "output", "reuse", "work", "prefill_end", "context_weight",
                 "seq", "arrived_at", "queued_at", "scheduled_at", "prefill_at", "first_token_at", "recomputed",
                 "own_prefill_s", "prefill_lag_at")

    def __init__(self, sess: Session, prompt: int, output: int, reuse: int, seq: int,
                 now: float, key: tuple[str, int] | None = None) -> None:
        self.sess = sess
        self.key = key  # its worker's `EnginePolicy` knows it by this (`request_key`)
        self.prompt = prompt
        self.output = output
        self.reuse = reuse
        self.work = 0.0
        self.prefill_end = 0.0
        self.context_weight = prompt + output / 2.0
        self.seq = seq
        self.arrived_at = now  # when the step reached its worker (before any admission wait)
        self.queued_at = now  # joined the engine's queue (set by the simulator)
        self.scheduled_at = now  # admitted to the batch (vLLM: queued -> scheduled)
        self.prefill_at = now  # its KV in place, its prefill in line
        self.first_token_at = now  # prefill done
        self.recomputed = 0
        self.own_prefill_s = 0.0  # its prefill alone at full budget, with the KV it found
        self.prefill_lag_at = 0.0  # its worker's `prefill_lag` at its first token


def request_key(s: Session) -> tuple[str, int]:
    """The key of the session's request for its current step (one request per step)."""
    return (s.session_id, s.step)
