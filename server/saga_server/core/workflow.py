"""`WorkflowCore`: the one object engines, the simulator and the hint service call.

It is a `HintSink` (hints are validated and recorded by a composed
`SessionRegistry`, then fed to the AEG) and it answers the policy questions:
eviction keys (`eviction`), pin decisions (`pinning`), prefetch plans
(`prefetch`) and request priorities (`fairshare`), each defined once in its
module. Works without hints: `on_request_arrival`/`on_request_finished` alone
build an inferred AEG from request shapes and gaps.

All times come from the injected `clock` (hint events carry their own receive
time, taken from the same clock). Every public method takes one lock, so any
thread may call; per call cost is a few dict lookups (see
`benchmarks/core_bench.py`). The core draws no random numbers today: `seed` is
kept so any future sampling is reproducible, and equal inputs give equal outputs.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from .aeg import AEG, Prediction, SessionTrack
from .eviction import EvictionConfig, wa_lru_key
from .events import (
    HintEvent,
    LlmCallEnd,
    LlmCallStart,
    SessionEnd,
    SessionSnapshot,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
)
from .fairshare import FairShare, FairShareConfig, seniority, urgency
from .pinning import PinConfig, PinDecision, decide_pin
from .prefetch import PrefetchAction, PrefetchCandidate, PrefetchConfig, plan_prefetch
from .registry import SessionRegistry

__all__ = ["CoreConfig", "WorkflowCore"]


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Knobs of the core; each policy's own config documents its fields."""

    max_sessions: int = 50_000
    session_idle_s: float = 1800.0
    ended_ttl_s: float = 300.0
    history_limit: int = 256
    max_workflows: int = 256
    max_nodes: int = 512
    max_tools: int = 128
    min_samples: int = 8
    prior_p_continue: float = 0.9
    prior_cycle_s: float = 5.0
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    pin: PinConfig = field(default_factory=PinConfig)
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)
    fairshare: FairShareConfig = field(default_factory=FairShareConfig)

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.session_idle_s <= 0 or self.history_limit < 1:
            raise ValueError("max_sessions >= 1, session_idle_s > 0 and history_limit >= 1 required")
        if self.min_samples < 1:
            raise ValueError("min_samples must be >= 1")


class WorkflowCore:
    """SAGA's policy brain (facade). LOWER keys/priorities mean evict/serve first."""

    def __init__(self, config: CoreConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 seed: int = 0, registry: SessionRegistry | None = None) -> None:
        self.config = cfg = config or CoreConfig()
        self.seed = seed
        self._clock = clock
        self._lock = threading.RLock()
        self.registry = registry or SessionRegistry(
            max_sessions=cfg.max_sessions, idle_ttl_s=cfg.session_idle_s,
            ended_ttl_s=cfg.ended_ttl_s, history_limit=cfg.history_limit, clock=clock)
        self.aeg = AEG(max_workflows=cfg.max_workflows, max_nodes=cfg.max_nodes, max_tools=cfg.max_tools,
                       max_sessions=cfg.max_sessions, session_idle_s=cfg.session_idle_s,
                       min_samples=cfg.min_samples, prior_p_continue=cfg.prior_p_continue,
                       prior_cycle_s=cfg.prior_cycle_s)
        self.fair = FairShare(cfg.fairshare)
        self._counters = {"requests_arrived": 0, "requests_finished": 0, "pins_granted": 0,
                          "pins_refused": 0, "prefetch_planned": 0}
        self._peer_tokens = 0.0
        self._moved_away: dict[str, None] = {}  # insertion-ordered set, bounded by max_sessions

    # -- HintSink -----------------------------------------------------------------

    def accept(self, event: HintEvent) -> None:
        with self._lock:
            self.registry.accept(event)  # validates; HintRejected leaves everything unchanged
            self._apply(event)

    def session(self, session_id: str) -> SessionSnapshot | None:
        """Hinted sessions come from the registry; sessions only the engine has seen
        are shown from the AEG's view (no history). Both carry predictions in `metrics`."""
        with self._lock:
            with self.registry.lock:
                record = self.registry.record(session_id)
                if record is not None:
                    return record.snapshot(self._metrics(session_id))
            tr = self.aeg.track(session_id)
            return None if tr is None else self._engine_snapshot(tr)

    def sessions(self, limit: int = 100) -> Sequence[SessionSnapshot]:
        with self._lock:
            snaps = [_with_metrics(s, self._metrics(s.session_id)) if self.aeg.track(s.session_id) else s
                     for s in self.registry.sessions(limit)]
            known = {s.session_id for s in snaps}
            for tr in reversed(self.aeg.tracks()):  # most recently active first
                if len(snaps) >= 2 * max(limit, 0):
                    break
                if not tr.hinted and tr.session_id not in known:
                    snaps.append(self._engine_snapshot(tr))
            snaps.sort(key=lambda s: s.last_event_at, reverse=True)
            return snaps[:max(0, limit)]

    def stats(self) -> Mapping[str, float]:
        with self._lock:
            out = dict(self.registry.stats())
            out.update(self._counters)
            out.update({f"aeg_{k}": float(v) for k, v in self.aeg.counters.items()})
            out["aeg_sessions"] = float(len(self.aeg))
            out["aeg_workflows"] = float(len(self.aeg.workflows()))
            out["afs_tenants_active"] = float(len(self.fair.active(self._clock())))
            out["afs_peer_tokens"] = self._peer_tokens
            return out

    def served_by_tenant(self) -> dict[str, float]:
        """Tokens served per tenant here, cumulative (`FairShare.served`): what the
        cluster router compares across engines (`PeerServiceSink`)."""
        with self._lock:
            return dict(self.fair.served)

    # -- engine events (no hints needed) ---------------------------------------------

    def on_request_arrival(self, session_id: str, prompt_tokens: int, tenant: str = "") -> None:
        """The engine admitted a request of this session. Without hints this is an
        LLM step of the inferred graph; with hints it only supplies token counts."""
        _check_tokens(prompt_tokens=prompt_tokens)
        with self._lock:
            now = self._clock()
            self._counters["requests_arrived"] += 1
            tr = self.aeg.track(session_id)
            if tr is None or tr.ended or not tr.hinted:
                tr = self.aeg.llm_start(session_id, now, tenant=tenant, hinted=False)
            if tenant and not tr.tenant:
                tr.tenant = tenant
            if prompt_tokens:
                self.aeg.observe_prompt(tr, prompt_tokens)
            if tr.tenant:
                self.fair.touch(tr.tenant, now)
            self._moved_away.pop(session_id, None)
            self.aeg.expire(now)

    def on_session_moved(self, session_id: str) -> None:
        """The session's KV left this engine (a cluster router moved it): the engine
        no longer holds its context (`kv_resident` = 0 until its next request here).
        Its workflow state stays: it may come back."""
        with self._lock:
            self._moved_away[session_id] = None
            while len(self._moved_away) > self.config.max_sessions:
                self._moved_away.pop(next(iter(self._moved_away)))

    def on_request_finished(self, session_id: str, prompt_tokens: int, output_tokens: int) -> None:
        """The engine finished a request. Without hints the session is now in a gap
        (its pseudo-tool) until its next request."""
        _check_tokens(prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        with self._lock:
            self._counters["requests_finished"] += 1
            tr = self.aeg.track(session_id)
            self.aeg.llm_end(session_id, self._clock(), prompt_tokens=prompt_tokens,
                             output_tokens=output_tokens, hinted=tr is not None and tr.hinted)

    # -- predictions and policies ------------------------------------------------------

    def predict(self, session_id: str) -> Prediction:
        """What the session does next (field definitions: `aeg`); the prior if unknown."""
        with self._lock:
            return self.aeg.predict(session_id, self._clock())

    def eviction_priority(self, session_id: str | None, kv_tokens: int, last_access: float) -> float:
        """WA-LRU key of cached KV at the current clock (formula: `eviction`); LOWER =
        evict first. `session_id=None` (or an unknown session) gives plain LRU.
        Refresh a session's key when it changes state; the caller owns the heap."""
        with self._lock:
            reuse = None if session_id is None else self.aeg.reuse(session_id, self._clock())
            return wa_lru_key(self._clock(), last_access, kv_tokens, reuse, self.config.eviction)

    def pin_decision(self, session_id: str, kv_tokens: int, memory_pressure: float) -> PinDecision:
        """Whether to pin the session's KV now and for how long (rule: `pinning`).
        Stateless: the engine keeps its pins in a `holds.HoldLedger`, which enforces
        the pin budget and gives pinned KV back on demand."""
        if not 0.0 <= memory_pressure <= 1.0:
            raise ValueError(f"memory_pressure must be in [0, 1], got {memory_pressure!r}")
        _check_tokens(kv_tokens=kv_tokens)
        with self._lock:
            now = self._clock()
            tr = self.aeg.track(session_id)
            if tr is None:
                decision = PinDecision(False, 0.0, "unknown_session")
            elif tr.ended:
                decision = decide_pin(0.0, _never, kv_tokens, memory_pressure, self.config.pin)
            else:
                decision = decide_pin(self.aeg.p_continue(tr), self._remaining_q(tr, now), kv_tokens,
                                      memory_pressure, self.config.pin)
            self._counters["pins_granted" if decision.pin else "pins_refused"] += 1
            return decision

    def plan_prefetch(self, candidates: Sequence[PrefetchCandidate], free_tokens: int) -> list[PrefetchAction]:
        """Which offloaded/evicted prefixes to bring back and when (rule: `prefetch`)."""
        with self._lock:
            now = self._clock()

            def estimate(sid: str, q: float) -> tuple[float, float]:
                tr = self.aeg.track(sid)
                if tr is None or tr.ended:
                    return 0.0, math.inf
                return self.aeg.p_continue(tr), self._remaining_q(tr, now)(q)

            plan = plan_prefetch(candidates, free_tokens, now, estimate, self.config.prefetch)
            self._counters["prefetch_planned"] += len(plan)
            return plan

    def request_priority(self, session_id: str, tenant: str = "") -> float:
        """Agent Fair Share priority of the session's waiting request (rule and
        bound: `fairshare`); LOWER = schedule sooner, ties stay FCFS. Asking marks
        the tenant active (backlogged) for the virtual queues."""
        with self._lock:
            return self._priority(self.aeg.track(session_id), tenant)

    def request_rank(self, session_id: str, tenant: str, arrived_at: float) -> tuple[float, float]:
        """Order key of a waiting request that arrived at `arrived_at` (core clock):
        (`request_priority`, task seniority); LOWER = schedule sooner, ties FCFS.
        Seniority orders a tenant's tasks by when they started (rule and bound:
        `fairshare`); an unknown session counts as a task started on arrival."""
        with self._lock:
            tr = self.aeg.track(session_id)
            started = tr.started_at if tr is not None and not tr.ended else None
            return (self._priority(tr, tenant),
                    seniority(started, arrived_at, self.config.fairshare.seniority_window_s))

    def record_service(self, tenant: str, tokens: int, session_id: str = "") -> None:
        """Service delivered (prefill + decode tokens); the tenant defaults to the session's."""
        _check_tokens(tokens=tokens)
        with self._lock:
            if not tenant and session_id:
                tr = self.aeg.track(session_id)
                tenant = tr.tenant if tr is not None else ""
            self.fair.record_service(tenant, tokens, self._clock())

    def record_peer_service(self, tokens: Mapping[str, float]) -> int:
        """Service the cluster's other engines delivered since the last call, per
        tenant (`cluster_share`): all applied, or ValueError and none. Returns the
        number of tenants."""
        for tenant, value in tokens.items():
            if not isinstance(tenant, str) or len(tenant) > 256:
                raise ValueError(f"bad tenant {tenant!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"peer service of {tenant!r} must be a finite number >= 0, got {value!r}")
        with self._lock:
            now = self._clock()
            for tenant, value in tokens.items():
                self.fair.record_peer_service(tenant, float(value), now)
            self._peer_tokens += float(sum(tokens.values()))
            return len(tokens)

    # -- internals -----------------------------------------------------------------------

    def _priority(self, tr: SessionTrack | None, tenant: str) -> float:
        """`request_priority` of a session's track (None: unknown); lock held."""
        now = self._clock()
        u = 0.0
        if tr is not None:
            tenant = tenant or tr.tenant
            if tr.deadline_at is not None:
                _, rem_s = self.aeg.remaining(tr)
                u = urgency(rem_s, tr.deadline_at, now, self.config.fairshare.urgency_cap)
        return self.fair.priority(tenant, u, now)

    def _apply(self, ev: HintEvent) -> None:
        aeg = self.aeg
        if isinstance(ev, LlmCallStart):
            aeg.llm_start(ev.session_id, ev.time, node=ev.node)
        elif isinstance(ev, ToolCallStart):
            aeg.tool_start(ev.session_id, ev.time, ev.tool, call_id=ev.call_id, category=ev.category,
                           expected_s=ev.expected_duration_s)
        elif isinstance(ev, ToolCallEnd):
            aeg.tool_end(ev.session_id, ev.time, ev.tool, call_id=ev.call_id)
        elif isinstance(ev, LlmCallEnd):
            aeg.llm_end(ev.session_id, ev.time, prompt_tokens=ev.prompt_tokens, output_tokens=ev.output_tokens)
        elif isinstance(ev, SessionStart):
            deadline = None if ev.deadline_s is None else ev.time + ev.deadline_s
            aeg.session_start(ev.session_id, ev.time, tenant=ev.tenant, workflow=ev.workflow,
                              deadline_at=deadline, structure=ev.structure)
            if ev.tenant:
                self.fair.touch(ev.tenant, ev.time)
        elif isinstance(ev, SessionEnd):
            aeg.session_end(ev.session_id, ev.time)
        # Any other event type the registry accepts carries nothing the AEG models.
        aeg.expire(ev.time)

    def _remaining_q(self, tr, now: float) -> Callable[[float], float]:
        aeg = self.aeg
        if tr.in_llm and not tr.open_tools:
            return _zero
        d, t0 = aeg.resume_dist(tr)
        if d is None:
            d, t0 = aeg.idle_dist(tr), tr.last_event
        el = now - t0 if now > t0 else 0.0
        return lambda q: d.quantile_above(q, el) - el

    def _engine_snapshot(self, tr) -> SessionSnapshot:
        state = "ended" if tr.ended else "llm" if tr.in_llm else "tool" if tr.open_tools else "idle"
        return SessionSnapshot(session_id=tr.session_id, tenant=tr.tenant, workflow=tr.workflow, state=state,
                               started_at=tr.started_at, last_event_at=tr.last_event, steps=tr.steps,
                               tool_calls=0, current_node=tr.node, deadline_at=tr.deadline_at,
                               metrics=self._metrics(tr.session_id))

    def _metrics(self, session_id: str) -> dict[str, float]:
        tr = self.aeg.track(session_id)
        if tr is None:
            return {}
        p = self.aeg.predict(session_id, self._clock())
        return {"p_continue": p.p_continue, "resume_mean_s": p.resume_mean_s, "resume_p50_s": p.resume_p50_s,
                "resume_p90_s": p.resume_p90_s, "prompt_growth_tokens": p.prompt_growth_tokens,
                "remaining_steps": p.remaining_steps, "remaining_time_s": p.remaining_time_s,
                "context_tokens": float(tr.context_tokens), "owed_service_tokens": self.fair.owed(tr.tenant),
                "kv_resident": 0.0 if session_id in self._moved_away or not tr.context_tokens else 1.0}


def _with_metrics(snap: SessionSnapshot, metrics: dict[str, float]) -> SessionSnapshot:
    return replace(snap, metrics={**snap.metrics, **metrics})


def _zero(q: float) -> float:
    return 0.0


def _never(q: float) -> float:
    return math.inf


def _check_tokens(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
