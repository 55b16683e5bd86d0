"""`WorkflowCore`: the one object engines, the simulator and the hint service call.

It is a `HintSink` over one `SessionTable` (the table validates and records
hints; the AEG, its tracker, learns from them) and it answers the policy
questions: eviction keys (`eviction`), pin decisions (`pinning`), prefetch plans
(`prefetch`) and request priorities (`fairshare`), each defined once in its
module. Works without hints: `on_request_arrival`/`on_request_finished` alone
build an inferred AEG from request shapes and gaps.

All times come from the injected `clock` (hint events carry their own receive
time, taken from the same clock). Every public method takes the table's lock
once, so any thread may call; per call cost is a few dict lookups (see
`benchmarks/core_bench.py`). The core draws no random numbers today: `seed` is
kept so any future sampling is reproducible, and equal inputs give equal outputs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from .aeg import AEG
from .deadlines import ShapingConfig, deadline_class
from .eviction import EvictionConfig, wa_lru_key
from .events import Caller, DeadlineOutcomes, HintEvent, SessionSnapshot, SessionStart, TenantOutcomes
from .fairshare import FairShare, FairShareConfig, seniority, urgency
from .graph import Prediction
from .pinning import PinConfig, PinDecision, decide_pin
from .prefetch import PrefetchAction, PrefetchCandidate, PrefetchConfig, plan_prefetch
from .sessions import MAX_SESSIONS, SESSION_IDLE_S, Departure, ParentChanged, SessionRecord, SessionGone, SessionTable

__all__ = ["CoreConfig", "WorkflowCore", "KvOutlook"]


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Knobs of the core; each policy's own config documents its fields."""

    max_sessions: int = MAX_SESSIONS
    session_idle_s: float = SESSION_IDLE_S
    # A session waiting on its user's turn (a `human` call open) is kept this long: a
    # person may come back the next day; the table's size bound holds memory, not this.
    human_idle_s: float = 86_400.0
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
    shaping: ShapingConfig = field(default_factory=ShapingConfig)
    # Research only: clients' expected tool durations are exact (`WorkflowGraphs`), the
    # simulator's `oracle` reference of perfect foresight.
    exact_expected: bool = False

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.session_idle_s <= 0 or self.history_limit < 1:
            raise ValueError("max_sessions >= 1, session_idle_s > 0 and history_limit >= 1 required")
        if self.min_samples < 1:
            raise ValueError("min_samples must be >= 1")


@dataclass(frozen=True, slots=True)
class KvOutlook:
    context_tokens: int  # KV the session holds now: its last prompt, plus the answer once done
    next_tokens: int  # KV its next request will need: context, predicted prompt growth, usual answer
    # Seconds until that request, as likely more as less (the median of the wait left;
    # 0 while a call runs): a heavy-tailed wait's mean is its tail's (`admission`).
    away_s: float
    # Its subagents run and it goes on when the last returns (`AEG.children_remaining_s`).
    awaits_children: bool = False


class WorkflowCore:
    """SAGA's policy brain (facade). LOWER keys/priorities mean evict/serve first."""

    def __init__(self, config: CoreConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 seed: int = 0) -> None:
        self.config = cfg = config or CoreConfig()
        self.seed = seed
        self._clock = clock
        self.table = SessionTable(max_sessions=cfg.max_sessions, idle_ttl_s=cfg.session_idle_s,
                                  ended_ttl_s=cfg.ended_ttl_s, history_limit=cfg.history_limit, clock=clock,
                                  human_idle_ttl_s=max(cfg.human_idle_s, cfg.session_idle_s))
        self._lock = self.table.lock
        self._sessions = self.table.by_id
        self.aeg = AEG(self.table, max_workflows=cfg.max_workflows, max_nodes=cfg.max_nodes,
                       max_tools=cfg.max_tools, min_samples=cfg.min_samples,
                       prior_p_continue=cfg.prior_p_continue, prior_cycle_s=cfg.prior_cycle_s,
                       exact_expected=cfg.exact_expected)
        self.fair = FairShare(cfg.fairshare)
        self._counters = {"requests_arrived": 0, "requests_finished": 0, "pins_granted": 0,
                          "pins_refused": 0, "prefetch_planned": 0}
        self._peer_tokens = 0.0
        # tenant -> [tasks (user turns) within deadline, past it, summed slack used]:
        # what `saga status` shows (`tenant_outcomes`); bounded.
        self._deadlines: dict[str, list[float]] = {}
        self._turns: dict[str, list[float]] = {}
        self.table.subscribe(self._task_ended)
        self.table.subscribe_turns(self._turn_ended)

    def now(self) -> float:
        """The core's clock (hint times and policy decisions are on it)."""
        return self._clock()

    # -- HintSink -----------------------------------------------------------------

    def accept(self, event: HintEvent, caller: Caller | None = None) -> None:
        with self._lock:
            # validates and checks ownership (HintRejected changes nothing), records, and the AEG learns
            self.table.accept(event, caller)
            s = self._sessions.get(event.session_id) if isinstance(event, SessionStart) else None
            if s is not None and s.tenant:  # the table's tenant: the caller's, not what the payload claims
                self.fair.touch(s.tenant, event.time)

    def session(self, session_id: str, caller: Caller | None = None) -> SessionSnapshot | None:
        """Hinted sessions and sessions only the engine has seen (no history), with
        predictions in `metrics`."""
        with self._lock:
            s = self.table.readable(session_id, caller)
            return None if s is None else s.snapshot(self._metrics(s))

    def sessions(self, limit: int = 100, caller: Caller | None = None) -> Sequence[SessionSnapshot]:
        with self._lock:
            return [s.snapshot(self._metrics(s)) for s in self.table.recent(limit, caller)]

    def tenant_of(self, session_id: str) -> str:
        """The session's tenant ("" if unknown or none): its owner's, once a key
        started or claimed it."""
        with self._lock:
            s = self._sessions.get(session_id)
            return "" if s is None else s.tenant

    def request_tenant(self, session_id: str, label: str = "") -> str:
        """The tenant a request of this session counts for, whose `label` is the
        tenant the request itself names ("" for none): the session owner's, else the
        label, else the session's hinted tenant (`_tenant_for`). The one answer for
        fair share and deadline holds alike."""
        with self._lock:
            return _tenant_for(self._sessions.get(session_id), label)

    def stats(self) -> Mapping[str, float]:
        with self._lock:
            out = dict(self.table.stats())
            out.update(self._counters)
            out.update({f"aeg_{k}": float(v) for k, v in self.aeg.counters.items()})
            out["aeg_sessions"] = float(len(self.aeg))
            out["aeg_workflows"] = float(len(self.aeg.workflows()))
            out["afs_tenants_active"] = float(len(self.fair.active(self._clock())))
            out["afs_peer_tokens"] = self._peer_tokens
            return out

    def tenant_outcomes(self) -> dict[str, TenantOutcomes]:
        """Per tenant that had a task or a user turn end with a deadline, or was
        served tokens here: its `TenantOutcomes` (`TenantOutcomesSink`)."""
        with self._lock:
            served = self.fair.served
            return {t: TenantOutcomes(t, deadlines=_outcomes(self._deadlines, t), turns=_outcomes(self._turns, t),
                                      served_tokens=float(served.get(t, 0.0)))
                    for t in sorted(set(self._deadlines) | set(self._turns) | set(served))}

    def subscribe(self, listener: SessionGone) -> None:
        """`listener(session_id, how)` whenever a session stops being live: its end,
        its idle expiry, its eviction from the full table (`sessions`, "Lifecycle")."""
        self.table.subscribe(listener)

    def learnt(self) -> dict:
        """What the core learnt about workflows (`WorkflowGraphs.learnt`), to survive a
        restart (`saga_server.state_file`). Sessions are not in it: their KV does not
        survive. Nor is Agent Fair Share's owed service: a tenant idle past
        `active_window_s` keeps none (`fairshare`), and a restart takes longer."""
        with self._lock:
            return {"graphs": self.aeg.learnt()}

    def restore_learnt(self, data: dict) -> None:
        """Take back what `learnt` returned (ValueError, nothing changed, if it is not that)."""
        if not isinstance(data, dict):
            raise ValueError("the core's learnt state must be an object")
        with self._lock:
            self.aeg.restore_learnt(data.get("graphs"))

    def subscribe_parents(self, listener: ParentChanged) -> None:
        """`listener(parent_id, started)` whenever a session gains (True) or loses
        (False) a live subagent: its wait on them starts or shrinks (`sessions`)."""
        self.table.subscribe_parents(listener)

    def expire_idle(self) -> list[str]:
        """Forget every session idle past its time, now (the table also expires a few
        with every event); an engine calls this each step, so a quiet one forgets too."""
        with self._lock:
            return self.table.expire(self._clock())

    # -- engine events (no hints needed) ---------------------------------------------

    def on_request_arrival(self, session_id: str, prompt_tokens: int, tenant: str = "",
                           cache_ttl_s: float | None = None) -> None:
        """The engine admitted a request of this session. Without hints this is an
        LLM step of the inferred graph; with hints it only supplies token counts.
        `cache_ttl_s`: how long the request asks its prompt kept (the client's
        cache hint; a floor on the session's pin, `pinning`)."""
        _check_tokens(prompt_tokens=prompt_tokens)
        if cache_ttl_s is not None and not (isinstance(cache_ttl_s, (int, float)) and 0 <= cache_ttl_s < math.inf):
            raise ValueError(f"cache_ttl_s must be a finite number >= 0, got {cache_ttl_s!r}")
        with self._lock:
            now = self._clock()
            self._counters["requests_arrived"] += 1
            s = self._sessions.get(session_id)
            if s is None or s.ended or not s.hinted:
                s = self.aeg.llm_start(session_id, now, tenant=tenant, hinted=False)
            if tenant and not s.tenant:
                s.tenant = tenant
            if prompt_tokens:
                self.aeg.observe_prompt(s, prompt_tokens)
            s.cache_ttl_s = float(cache_ttl_s or 0.0)
            if s.tenant:
                self.fair.touch(s.tenant, now)
            s.kv_moved = False
            self.aeg.expire(now)

    def on_session_moved(self, session_id: str, caller: Caller | None = None) -> None:
        """The session's KV left this engine (a cluster router moved it): the engine
        no longer holds its context (`kv_resident` = 0 until its next request here).
        Its workflow state stays: it may come back. An unknown session holds nothing.
        An agent `caller` may do this to its own sessions only (`AccessDenied`)."""
        with self._lock:
            self.table.releasable(session_id, caller)
            s = self._sessions.get(session_id)
            if s is not None:
                s.kv_moved = True

    def on_request_finished(self, session_id: str, prompt_tokens: int, output_tokens: int) -> None:
        """The engine finished a request. Without hints the session is now in a gap
        (its pseudo-tool) until its next request."""
        _check_tokens(prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        with self._lock:
            self._counters["requests_finished"] += 1
            s = self._sessions.get(session_id)
            self.aeg.llm_end(session_id, self._clock(), prompt_tokens=prompt_tokens,
                             output_tokens=output_tokens, hinted=s is not None and s.hinted)

    # -- predictions and policies ------------------------------------------------------

    def predict(self, session_id: str) -> Prediction:
        """What the session does next (field definitions: `aeg`); the prior if unknown."""
        with self._lock:
            return self.aeg.predict(session_id, self._clock())

    def kv_outlook(self, session_id: str) -> KvOutlook | None:
        """What the session's KV looks like from here (`KvOutlook`), for admission.
        None for an unknown or ended session."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None or s.ended:
                return None
            _, t_next = self.aeg.reuse_of(s, self._clock(), q=0.5)
            need = s.context_tokens + max(0.0, self.aeg.growth_of(s)) + s.last_output
            return KvOutlook(s.context_tokens, int(need), t_next, awaits_children=bool(s.children))

    def eviction_priority(self, session_id: str | None, kv_tokens: int, last_access: float) -> float:
        """WA-LRU key of cached KV at the current clock (formula: `eviction`); LOWER =
        evict first. `session_id=None` (or an unknown session) gives plain LRU.
        Refresh a session's key when it changes state; the caller owns the heap."""
        with self._lock:
            now = self._clock()
            s = None if session_id is None else self._sessions.get(session_id)
            reuse = None if s is None else self.aeg.reuse_of(s, now)
            return wa_lru_key(now, last_access, kv_tokens, reuse, self.config.eviction)

    def pin_decision(self, session_id: str, kv_tokens: int, memory_pressure: float) -> PinDecision:
        """Whether to pin the session's KV now and for how long (rule: `pinning`).
        Stateless: the engine keeps its pins in a `holds.HoldLedger`, which enforces
        the pin budget and gives pinned KV back on demand."""
        if not 0.0 <= memory_pressure <= 1.0:
            raise ValueError(f"memory_pressure must be in [0, 1], got {memory_pressure!r}")
        _check_tokens(kv_tokens=kv_tokens)
        with self._lock:
            now = self._clock()
            s = self._sessions.get(session_id)
            if s is None:
                decision = PinDecision(False, 0.0, "unknown_session")
            elif s.ended:
                decision = decide_pin(0.0, _never, kv_tokens, memory_pressure, self.config.pin)
            else:
                decision = self._pin(s, kv_tokens, memory_pressure, now)
            self._counters["pins_granted" if decision.pin else "pins_refused"] += 1
            return decision

    def plan_prefetch(self, candidates: Sequence[PrefetchCandidate], free_tokens: int) -> list[PrefetchAction]:
        """Which offloaded/evicted prefixes to bring back and when (rule: `prefetch`)."""
        with self._lock:
            now = self._clock()

            def estimate(sid: str, q: float) -> tuple[float, float]:
                s = self._sessions.get(sid)
                if s is None or s.ended:
                    return 0.0, math.inf
                return self.aeg.p_continue(s), self._remaining_q(s, now)(q)

            plan = plan_prefetch(candidates, free_tokens, now, estimate, self.config.prefetch)
            self._counters["prefetch_planned"] += len(plan)
            return plan

    def request_priority(self, session_id: str, tenant: str = "") -> float:
        """Agent Fair Share priority of the session's waiting request (rule and
        bound: `fairshare`); LOWER = schedule sooner, ties stay FCFS. Asking marks
        the tenant active (backlogged) for the virtual queues."""
        with self._lock:
            return self._priority(self._sessions.get(session_id), tenant)

    def request_rank(self, session_id: str, tenant: str, arrived_at: float,
                     priority_jump_s: float = 0.0) -> tuple[float, float]:
        """Order key of a waiting request that arrived at `arrived_at` (core clock):
        (`request_priority`, task seniority); LOWER = schedule sooner, ties FCFS.
        Seniority orders a tenant's tasks by when they started (rule and bound:
        `fairshare`); a subagent tree is one task, started with its root, and a
        session with a person in the loop by its running user turn (`_task_start`);
        an unknown session counts as a task started on arrival. `priority_jump_s`:
        the client's priority, seconds earlier within its tenant (capped; `fairshare`)."""
        fs = self.config.fairshare
        jump = min(priority_jump_s, fs.max_priority_jump_s) if priority_jump_s > 0 else 0.0  # also NaN
        with self._lock:
            s = self._sessions.get(session_id)
            started = self._task_start(s) if s is not None and not s.ended else None
            return (self._priority(s, tenant), seniority(started, arrived_at, fs.seniority_window_s, jump))

    def deadline_class(self, session_id: str) -> str:
        """The session's deadline class now (`deadlines`: at risk, slack-rich or
        normal) from its urgency, the AEG's expected remaining time at its pace over
        the time left to its deadline. Unknown, ended, deadline-free or already
        late (holding others back can no longer bring it in time): normal."""
        with self._lock:
            s = self._sessions.get(session_id)
            now = self._clock()
            u = u_upper = None
            cfg = self.config.shaping
            if s is not None and not s.ended and s.deadline_at is not None and s.deadline_at > now:
                u = urgency(self._remaining_s(s), s.deadline_at, now, math.inf)
                if u <= cfg.slack_rich:  # only slack-rich by the mean can be by the quantile
                    u_upper = urgency(self._remaining_s(s, cfg.confidence), s.deadline_at, now, math.inf)
            return deadline_class(u, cfg, u_upper)

    def record_service(self, tenant: str, tokens: int, session_id: str = "") -> None:
        """Service delivered (prefill + decode tokens), counted for the session's
        tenant (`_tenant_for`)."""
        _check_tokens(tokens=tokens)
        with self._lock:
            s = self._sessions.get(session_id) if session_id else None
            self.fair.record_service(_tenant_for(s, tenant), tokens, self._clock())

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

    def _task_ended(self, session_id: str, how: Departure) -> None:
        """The table's lifecycle listener (lock held): a task that ended with a
        deadline counts for its tenant (one that expired or was evicted did not end)."""
        s = self._sessions.get(session_id)
        if how != Departure.ENDED or s is None or s.task_deadline_at is None or s.parent:
            return
        span = s.task_deadline_at - s.task_started_at
        if span > 0:
            _count(self._deadlines, s.tenant, max(max(s.last_event_at, self._clock()) - s.task_started_at, 0.0) / span)

    def _turn_ended(self, s: SessionRecord, span_s: float) -> None:
        """The table's turn listener (lock held): a user turn of a session with a
        turn deadline counts for its tenant."""
        if s.turn_deadline_s is not None and s.turn_deadline_s > 0:
            _count(self._turns, s.tenant, span_s / s.turn_deadline_s)

    def _task_start(self, s: SessionRecord) -> float:
        """When the work a request serves began, for seniority (`fairshare`): its
        task's start (a subagent's: its root's), or its root's running user turn's
        start if later (`turns`): what a person waits on is the turn, and a session
        that began hours ago is not owed the next turn first."""
        root, depth = s, 0
        while root.parent and depth < 64:
            parent = self._sessions.get(root.parent)
            if parent is None:
                break
            root, depth = parent, depth + 1
        turn = root.turn_started_at
        return s.task_started_at if turn is None or turn < s.task_started_at else turn

    def _remaining_s(self, s: SessionRecord, q: float | None = None) -> float:
        """Seconds of work left before the session's deadline in force, expected or
        their q-quantile (`AEG.remaining`): to the end of its user turn when that
        turn's deadline is the one in force, else to the end of the task (`turns`)."""
        if s.turn_started_at is not None and s.deadline_at is not None and s.deadline_at != s.task_deadline_at:
            return self.aeg.remaining_in_turn(s, q)[1]
        return self.aeg.remaining(s, q)[1]

    def _priority(self, s: SessionRecord | None, tenant: str) -> float:
        """`request_priority` of a session's record (None: unknown); lock held."""
        now = self._clock()
        u = 0.0
        tenant = _tenant_for(s, tenant)
        if s is not None and s.deadline_at is not None:
            u = urgency(self._remaining_s(s), s.deadline_at, now, self.config.fairshare.urgency_cap)
        return self.fair.priority(tenant, u, now)

    def _pin(self, s: SessionRecord, kv_tokens: int, memory_pressure: float, now: float) -> PinDecision:
        """`pin_decision` of a live session's record; lock held."""
        return decide_pin(self.aeg.p_continue(s), self._remaining_q(s, now), kv_tokens, memory_pressure,
                          self.config.pin, client_ttl_s=s.cache_ttl_s)

    def _remaining_q(self, s: SessionRecord, now: float) -> Callable[[float], float]:
        aeg = self.aeg
        if s.in_llm and not s.running_tools:
            return _zero
        if s.children:  # waiting on its subagents (`AEG.children_remaining_s`)
            mean = aeg.children_remaining_s(s, now)
            # Markov: P(X > mean / (1 - q)) <= 1 - q bounds the q-quantile from above,
            # so a hold of that length outlives the children with probability >= q.
            return lambda q: mean / max(1.0 - q, 1e-3)
        d, t0 = aeg.resume_dist(s)
        if d is None:
            d, t0 = aeg.idle_dist(s), s.last_event_at
        el = now - t0 if now > t0 else 0.0
        return lambda q: d.quantile_above(q, el) - el

    def _metrics(self, s: SessionRecord) -> dict[str, float]:
        now = self._clock()
        p = self.aeg.prediction(s, now)
        return {"p_continue": p.p_continue, "resume_mean_s": p.resume_mean_s, "resume_p50_s": p.resume_p50_s,
                "resume_p90_s": p.resume_p90_s, "prompt_growth_tokens": p.prompt_growth_tokens,
                "remaining_steps": p.remaining_steps, "remaining_time_s": p.remaining_time_s,
                "context_tokens": float(s.context_tokens), "owed_service_tokens": self.fair.owed(s.tenant),
                "kv_resident": 0.0 if s.kv_moved or not s.context_tokens else 1.0,
                "pin_ttl_s": self._pin_ttl_s(s, now)}

    def _pin_ttl_s(self, s: SessionRecord, now: float) -> float:
        """The TTL the session's KV would be pinned for now, in a pool under no
        pressure (0: no pin); what an operator compares across restarts."""
        if s.ended:
            return 0.0
        d = self._pin(s, s.context_tokens, 0.0, now)
        return d.ttl_s if d.pin else 0.0


def _tenant_for(s: SessionRecord | None, label: str) -> str:
    """Whose fair share a request of session `s` counts for: the tenant of the key
    that owns the session, whatever the request's own `label` (unauthenticated,
    e.g. `vllm_xargs`) says; for a session nobody owns the label, else its tenant."""
    if s is not None and s.owner is not None:
        return s.tenant
    return label or (s.tenant if s is not None else "")


def _count(ledger: dict[str, list[float]], tenant: str, used: float) -> None:
    """One outcome (`used`: time taken over the time given) for `tenant`; bounded:
    past 4,096 tenants the one with the fewest outcomes is forgotten."""
    outcome = ledger.get(tenant)
    if outcome is None:
        if len(ledger) >= 4096:
            del ledger[min(ledger, key=lambda t: sum(ledger[t][:2]))]
        outcome = ledger[tenant] = [0.0, 0.0, 0.0]
    outcome[0 if used <= 1.0 else 1] += 1
    outcome[2] += used


def _outcomes(ledger: dict[str, list[float]], tenant: str) -> DeadlineOutcomes | None:
    found = ledger.get(tenant)
    return None if found is None else DeadlineOutcomes(int(found[0]), int(found[1]), found[2])


def _zero(q: float) -> float:
    return 0.0


def _never(q: float) -> float:
    return math.inf


def _check_tokens(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
