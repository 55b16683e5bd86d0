"""What a simulation run is configured with and what it returns (raw counters;
`saga_server.bench.metrics` turns them into the reported metrics)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .hardware import CostModel

__all__ = ["SimConfig", "SimResult", "TaskRecord", "SPLIT", "unloaded_time_s", "unloaded_call_s",
           "unloaded_turns_s", "turn_deadline_s"]

# Where a task's time goes, per its own LLM calls (`TaskRecord.split`), in seconds:
# - `alone`: the calls' time alone on a worker with a perfect prefix cache (the
#   unloaded time, less tools);
# - `tool`: its tools' (and its person's) time, which no scheduler shortens;
# - `gate`: waiting at the admission gate, or for its KV moving to another worker;
# - `engine_queue`: in the engine's queue: no batch slot, no pool room, or held back;
# - `kv_load`: scheduled, waiting for its KV from the host or disk tier;
# - `recompute`: prefill of KV it had held and lost, beyond the perfect cache's;
# - `prefill_queue`: its prefill's time beyond computing it alone at full budget
#   (waiting behind other prefills, or a thin budget);
# - `decode_prefill`: what other requests' prefill chunks added to its decode's steps;
# - `decode_batch`: the rest of its decode's time beyond decoding alone (the batch's
#   size and contexts).
# The rest of its completion time is waiting for its subagents.
SPLIT = ("alone", "tool", "gate", "engine_queue", "kv_load", "recompute", "prefill_queue", "decode_prefill",
         "decode_batch")


@dataclass(frozen=True, slots=True)
class SimConfig:
    workers: int = 4
    concurrency: int | None = None  # closed-loop task limit; None: use arrival times
    # Closed loop: the first `concurrency` tasks start evenly spread over this many
    # seconds (0: all at once). A spread of about one task's time gives the phases a
    # steady closed loop has; all at once is a synchronised burst of first prompts.
    ramp_s: float = 0.0
    host_tier_factor: float = 4.0  # host KV capacity as a multiple of the GPU pool
    disk_tier_factor: float = 0.0  # a disk tier below the host tier, as a multiple of the GPU pool (0: none)
    steal_period_s: float = 1.0  # policies with `steals`: plan_steal every this many seconds
    sample_every_s: float = 5.0  # memory utilisation time series
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.ramp_s < math.inf:
            raise ValueError(f"ramp_s must be a finite number >= 0, got {self.ramp_s!r}")


@dataclass(slots=True)
class TaskRecord:
    session_id: str
    tenant: str
    task_id: str
    started_at: float
    finished_at: float
    unloaded_s: float
    deadline_s: float | None
    turn_spans: tuple[float, ...] = ()  # each user turn's time (`core.turns`), in order
    turn_deadline_s: float | None = None
    split: tuple[float, ...] = ()  # seconds per `SPLIT` category, its own calls

    @property
    def tct_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def met_deadline(self) -> bool:
        return self.deadline_s is None or self.tct_s <= self.deadline_s


@dataclass(slots=True)
class SimResult:
    policy: str
    unbounded: bool = False  # infinite KV: utilisation is meaningless
    tasks: list[TaskRecord] = field(default_factory=list)
    makespan_s: float = 0.0
    llm_calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    reusable_tokens: int = 0  # prompt tokens a perfect cache would have served
    hit_tokens: int = 0  # served from GPU KV
    loaded_tokens: int = 0  # served from the host tier
    recomputed_tokens: int = 0  # cacheable (full blocks), neither hit nor loaded: regenerated
    subagents: int = 0  # subagent sessions run (their parents' `tasks` include them)
    # A parent's first request after its subagents returned: what it could reuse, and
    # how much of that was recomputed (its KV lost while it waited on them).
    after_children_reusable_tokens: int = 0
    after_children_recomputed_tokens: int = 0
    prefilled_tokens: int = 0
    regen_gpu_s: float = 0.0  # compute time of regenerating recomputed tokens
    busy_gpu_s: float = 0.0  # worker time with a non-empty batch
    iterations: float = 0.0  # engine steps, all workers
    # Per request, summed, as vLLM's request histograms split it: arrival at the worker
    # to scheduled (admission waits included), scheduled to first token, first to last.
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    capacity_block_s: float = 0.0  # KV pool size x makespan, all workers
    useful_block_s: float = 0.0  # time integral of live + cached-live blocks
    evicted_blocks: int = 0
    prefetched_tokens: int = 0
    disk_loaded_tokens: int = 0  # of `loaded_tokens`, those read back from the disk tier
    steals: int = 0  # sessions moved (their KV with them)
    steals_in_tool: int = 0  # of those, inside a tool call when the router chose them
    moved_tokens: int = 0  # KV tokens transferred and inserted on the target
    move_dropped_tokens: int = 0  # transferred but no room on the target: recomputed there
    move_s: float = 0.0  # KV move time (fixed cost and transfer), summed over moves
    # (time, session, source, target, in tool when chosen, tokens sent)
    steal_log: list[tuple[float, str, int, int, bool, int]] = field(default_factory=list)
    admitted_after_wait: int = 0  # requests that waited at the admission gate
    human_waits: int = 0  # steps after which a person took the turn (`StepSpec.human`)
    compactions: int = 0  # requests whose context restarted from a short prefix
    # What the trace's hosted API served from its own cache, over the prompts it said so for.
    provider_cached_tokens: int = 0
    provider_known_prompt_tokens: int = 0
    parked: int = 0  # sessions parked (their KV first in line to be evicted)
    worker_busy_s: list[float] = field(default_factory=list)  # per worker: time with a non-empty batch
    # Closed loop: the window while every slot was busy (until the last task started).
    saturated_s: float = 0.0
    saturated_tasks: int = 0
    saturated_tokens: int = 0
    saturated_useful_block_s: float = 0.0
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (t, utilisation)
    running_kv_samples: list[float] = field(default_factory=list)  # KV of running requests / pool


def unloaded_time_s(task, cost: CostModel) -> float:
    """A task's completion time alone on a worker with a perfect prefix cache."""
    total = 0.0
    for st in task.steps:
        prefill, decode = unloaded_call_s(task, st, cost)
        total += prefill
        total += decode
        total += st.gap_s
    total -= task.steps[-1].gap_s if task.steps else 0.0
    return total


def unloaded_turns_s(task, cost: CostModel) -> list[float]:
    """Each user turn's time alone on a worker with a perfect prefix cache: the
    task's steps split after each step a person answers (`StepSpec.human`), the
    person's wait in neither turn; subagents' own time not included."""
    turns, turn = [], 0.0
    for i, st in enumerate(task.steps):
        prefill, decode = unloaded_call_s(task, st, cost)
        turn += prefill + decode
        if st.human or i + 1 == len(task.steps):
            turns.append(turn)
            turn = 0.0
        else:
            turn += st.gap_s
    return turns


def turn_deadline_s(task, factor: float | None, cost: CostModel) -> float | None:
    """The user-turn deadline a session of `task` states: `factor` times its mean
    turn alone on a worker (None without a factor, or for a task of no steps)."""
    turns = unloaded_turns_s(task, cost) if factor is not None else []
    return factor * sum(turns) / len(turns) if turns else None


def unloaded_call_s(task, st, cost: CostModel) -> tuple[float, float]:
    """A step's call alone with a perfect prefix cache: (prefill and overhead, decode)."""
    reuse = st.reused_tokens if st.reused_tokens else min(task.shared_prefix_tokens, st.prompt_tokens)
    return cost.prefill_s(st.prompt_tokens - reuse, reuse) + cost.overhead_s, cost.decode_s(st.output_tokens,
                                                                                         st.prompt_tokens)
