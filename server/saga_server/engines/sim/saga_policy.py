"""SAGA in the simulator: every decision comes from `saga_server.core.WorkflowCore`,
the same object the vLLM plugin calls, fed the hints an SDK would send (session
start, LLM call start/end, tool start/end with the trace's tool name and category,
session end) and the engine events (request arrival/finish) on simulated time.

What happens to each session's KV is the core's `SessionKvPolicy` over
`WorkflowRules`, the objects the vLLM plugin runs (one per worker here). Each
mechanism can be switched off for ablations; switched off, the simulator falls back
to what `apc-lru` does there (recency key, no pin, no host tier, FCFS, stock
placement by fewest live sessions and no stealing). `walru` is the core's WA-LRU
key, in the pool and in the host tier (`core.host_tier`); without it keys are the
last use. Sessions whose next request is queued keep their KV last (protected) in
every SAGA variant, as in the plugin.

`admit` is session admission by the core's `SessionAdmission`, one per worker, the
same object the vLLM plugin runs: requests of sessions it has not admitted wait at the
worker's gate (`admission`), idle ones may be parked; its limit's host part is the
worker's host tier, a parked session's return cost its prefill.

Difference from the vLLM plugin today: the plugin prefetches by re-prefilling a
paused session's prefix when the engine is idle; the simulated cluster has a CPU
tier, so here `prefetch` loads offloaded KV back over the host link on the core's
`plan_prefetch` schedule (the core's candidates support both sources).

`shape` is deadline-aware shaping by the core's `DeadlineShaper`, one per worker:
while a request of an at-risk session waits there, requests of slack-rich sessions
stay in the queue (keeping their place) instead of entering the batch; while one
waits or runs, its prefill goes first and an iteration whose first prefill in line
is not at risk runs only the prefill that rides on a decode iteration for free
(`CostModel.piggyback_tokens`).

`steal` is routing by `saga_server.core.routing.SessionRouter`, the policy object
the Ray Serve router (`saga_server.router`) runs, on simulated time and the run's
seed: it places new sessions and plans one steal per `steal_period_s`, and the
simulator moves the stolen session's KV over the inter-node link (the Ray router
re-prefills it on the target instead). Its `RoutingConfig` is the Ray router's
default except `new_session="least_loaded"`: rendezvous hashing leaves workers
unevenly loaded, which steals then have to undo, while placing by load needs no
steal to stay balanced (docs/RESEARCH.md, "SAGA routing in that simulator").
The Ray router keeps the hash because it has no fresh view of every replica at
each new session and several routers must agree; the simulator has one router and
fresh views.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from saga_server.core import (
    CoreConfig,
    HintRejected,
    LlmCallEnd,
    LlmCallStart,
    PrefetchCandidate,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core.admission import AdmissionConfig, SessionAdmission
from saga_server.core.categories import HUMAN
from saga_server.core.deadlines import DeadlineShaper
from saga_server.core.kv_policy import WorkflowRules
from saga_server.core.mechanisms import Mechanism, parse_mechanisms
from saga_server.core.routing import ReplicaView, RoutingConfig, SessionRouter, Steal

from .policy import PrefetchRequest, SimPolicy

if TYPE_CHECKING:  # pragma: no cover
    from .hardware import CostModel
    from .session import Request, Session

__all__ = ["SagaPolicy", "MECHANISMS", "SIM_ROUTING"]

MECHANISMS = tuple(Mechanism)  # the ablations' order: `saga-no-<name>`
SIM_ROUTING = RoutingConfig(new_session="least_loaded")


class SagaPolicy(SimPolicy):
    def __init__(self, mechanisms: Sequence[str] = MECHANISMS, name: str = "saga",
                 config: CoreConfig | None = None, routing: RoutingConfig | None = None,
                 admission: AdmissionConfig | None = None, trees: bool = True, foresight: bool = False,
                 turns: bool = True) -> None:
        """`trees`: a subagent's start names its parent (as the agents' headers do);
        False treats every subagent as a session of its own (`saga-no-trees`).
        `turns`: a session's start states its user turns' deadline (the SDK's
        `turn_deadline_s`); False keeps it from the core (`saga-no-turns`), which
        still sees the person's waits.
        `foresight`: each wait's hint carries its true duration, which the core takes
        as exact (`CoreConfig.exact_expected`): the `oracle` reference."""
        self.name = name
        self.mechanisms = parse_mechanisms(mechanisms)
        self.host_tier = Mechanism.PREFETCH in self.mechanisms
        self.steals = Mechanism.STEAL in self.mechanisms
        self.routes = self.steals
        self.protect_queued = True
        self.releases_garbage = True
        self._config = config
        self.routing = routing or SIM_ROUTING
        self.admission_config = admission
        self.trees = trees
        self.turns = turns
        self.foresight = foresight
        if foresight:
            self._config = replace(config or CoreConfig(), exact_expected=True)
        self.core: WorkflowCore | None = None
        self.router: SessionRouter | None = None

    def bind(self, clock: Callable[[], float], seed: int) -> None:
        self.core = WorkflowCore(self._config, clock=clock, seed=seed)
        if self.steals:
            self.router = SessionRouter(self.routing, seed=seed, clock=clock)

    # --- routing (mechanism "steal") ------------------------------------------
    def place(self, s: "Session", views: Sequence[ReplicaView], now: float) -> str | None:
        if self.router is None:
            return None
        self.router.update(views)
        return self.router.route(s.session_id, [v.replica for v in views], parent_id=self._parent(s)).replica

    def plan_steal(self, views: Sequence[ReplicaView], now: float) -> Steal | None:
        if self.router is None:
            return None
        self.router.update(views)
        return self.router.plan_steal()

    # --- decisions ------------------------------------------------------
    def kv_rules(self, session: Callable[[str], "Session"], clock: Callable[[], float]) -> WorkflowRules:
        return WorkflowRules(self.core, wa_lru=Mechanism.WALRU in self.mechanisms, pins=Mechanism.TTL in self.mechanisms)

    def admission(self, capacity_tokens: int, host_tokens: int, cost: "CostModel",
                  parkable: Callable[[str], bool]) -> SessionAdmission | None:
        if Mechanism.ADMIT not in self.mechanisms:
            return None
        return SessionAdmission(self.core, capacity_tokens, host_tokens=host_tokens, config=self.admission_config,
                                return_s=lambda tokens: cost.prefill_s(tokens, 0.0), parkable=parkable)

    def shaper(self, cost: "CostModel") -> DeadlineShaper | None:
        if Mechanism.SHAPE not in self.mechanisms:
            return None
        return DeadlineShaper(self.core.deadline_class, prefill_budget_tokens=cost.piggyback_tokens())

    def plan_prefetch(self, worker_id: int, candidates: Sequence[PrefetchRequest],
                      free_tokens: int, now: float) -> list[tuple[str, float]]:
        if Mechanism.PREFETCH not in self.mechanisms:
            return []
        cands = [PrefetchCandidate(sid, tokens, load_s) for sid, tokens, load_s in candidates]
        return [(a.session_id, a.start_at) for a in self.core.plan_prefetch(cands, free_tokens)]

    def queue_priority(self, s: "Session", now: float) -> float | tuple[float, float]:
        if Mechanism.AFS not in self.mechanisms:
            return now
        return self.core.request_rank(s.session_id, s.tenant, now)

    # --- hints and engine events -------------------------------------------
    def on_session_start(self, s: "Session", now: float) -> None:
        # A subagent runs its own program (its own prompt): a workflow of its own, tree or not.
        workflow = f"{s.tenant}:subagent" if s.parent_id else s.tenant
        self.core.accept(SessionStart(s.session_id, now, tenant=s.tenant, workflow=workflow,
                                      deadline_s=s.deadline_s, parent_id=self._parent(s) or "",
                                      turn_deadline_s=s.turn_deadline_s if self.turns else None))

    def _parent(self, s: "Session") -> str | None:
        return s.parent_id if self.trees and s.parent_id else None

    def on_llm_start(self, s: "Session", now: float) -> None:
        self.core.accept(LlmCallStart(s.session_id, now, step=s.step))  # starts it again if the core let it go

    def on_llm_end(self, s: "Session", r: "Request", now: float) -> None:
        self.core.accept(LlmCallEnd(s.session_id, now, step=s.step, prompt_tokens=r.prompt,
                                    output_tokens=r.output))

    def on_tool_start(self, s: "Session", now: float) -> None:
        for name, category, call_id, duration in _waits(s):
            self.core.accept(ToolCallStart(s.session_id, now, name, call_id=call_id, category=category,
                                           expected_duration_s=duration if self.foresight else None))

    def on_tool_end(self, s: "Session", now: float) -> None:
        # Called before the session moves to its next step: s.step is the tool's step.
        for name, _, call_id, _ in _waits(s):
            try:
                self.core.accept(ToolCallEnd(s.session_id, now, name, call_id=call_id))
            except HintRejected:  # the core let the session go while it waited
                return

    def on_session_end(self, s: "Session", now: float) -> None:
        self.core.accept(SessionEnd(s.session_id, now))
        if self.router is not None:
            self.router.forget(s.session_id)


def _waits(s: "Session") -> list[tuple[str, str, str, float]]:
    """What the session waits on after its step, as hints name it: (tool, category,
    call id, true duration) per tool call, or the human's turn as a call of category
    `human`."""
    step = s.task.steps[s.step]
    if step.human:
        return [(HUMAN, HUMAN, f"{s.step}.human", step.idle_s)]
    return [(tool.name, tool.category, f"{s.step}.{i}", tool.duration_s) for i, tool in enumerate(step.tools)]
