"""`SagaPlugin`: SAGA inside one vLLM scheduler.

`SagaScheduler` (see `scheduler`) hands every hook to this object, which owns the
workflow core, the prefetcher and the metrics, and translates vLLM's events into the
engine's `EnginePolicy` (`saga_server.core.engine_policy`, which documents the facts
and their order once): that object holds the `HoldLedger` over the scheduler's block
pool, the KV policy, admission, the deadline shaper and the one table of live
requests. What it changes relative to stock vLLM (everything else is vLLM's own code
path):

- **Holds, pins, WA-LRU and admission**: every KV decision is the core's
  `SessionKvPolicy` (`saga_server.core.kv_policy`, which documents the rules once),
  over a `HoldLedger` of vLLM's `BlockPool`; this plugin only reports what vLLM did
  (a request arrived, was scheduled, finished; a tool hint; an allocation failed) and
  applies what comes back. A tenant's pins stay under its `max_pinned_blocks` (keys
  file, `saga_server.rpc.keys`). When an allocation fails the ledger releases held
  KV in its order until it fits, so allocation never fails where stock vLLM would
  have succeeded. Under KV overload whole sessions wait instead of evicting each
  other (`saga_server.core.admission`): a request of a session not admitted stays in
  the waiting queue without being scheduled (`RankedRequestQueue` holds it).
  Requests without a session are never held.
- **AFS**: before each step the waiting queue (`RankedRequestQueue`) is stably ordered
  by the core's `request_rank`: tenants' fair-share priority, then within a tenant the
  task's seniority (older tasks first, so tasks finish in the order they began;
  preempted requests stay in front; a client's `nvext.agent_hints.priority` moves its
  request earlier within its tenant, `core.fairshare`). Service is recorded per tenant
  after each step. Admission counts a request's KV need with its `osl` hint when it
  gives one (`RequestMeta.kv_need`).
  The seniority window (`EngineSettings.seniority_window_s`) can bound how far
  seniority reaches back (unbounded by default; 0: request-level FCFS within a
  tenant, as stock).
- **Deadlines** (`saga_server.core.deadlines`, which documents the rule): while a
  request of an at-risk session waits, requests of slack-rich sessions are held in
  the waiting queue (held back by `RankedRequestQueue`, taken back from it if they
  were offered before); while one waits or runs, a step whose first prefill in line
  is not an at-risk request's gets a token budget of its decodes plus the thin
  prefill budget (`step_token_budget`, which `SagaScheduler` applies to the step): one
  block, or twice the prefill arriving per step where that is more, a step priced
  as the simulator prices it, by the steps that ran no prefill (`_StepPace`). vLLM schedules
  running requests' prefill in running order, so an at-risk prefill cannot overtake
  one already running: the budget is then left whole.
- **Prefetch**: see `prefetch`.
- **Settings** (`saga_server.settings.EngineSettings`, read once at start): each
  mechanism above can be switched off by name (`SAGA_OFF`, `core.mechanisms`); off,
  it does what stock vLLM does there.
- **Hints**: see `intake`; a gRPC hint service runs in this (EngineCore) process and
  feeds the core; tool/session events reach the engine loop through a queue drained
  at each `schedule()`, so block references are only ever touched by the engine loop.
- **Moves** (`saga serve --kv-transfer nixl`): tokens a request pulled from another
  engine (`loads.LoadLog`) are counted as pulled, not as prefix hits; tokens loaded
  from the host tier (`--kv-offloading-size`, `tier`) as tier hits.
- **Learnt state** (`SAGA_STATE_FILE`, `saga_server.state_file`): what the core learnt is
  read back at start and written every minute and at shutdown.
- **Recording** (`SAGA_RECORD`, see `recording`): each session's requests and hints,
  enqueued for a writer thread, become `saga-trace/1` tasks.

Every hook is guarded: an exception in SAGA code is logged and counted
(`saga_plugin_errors`) and vLLM carries on as stock. Serving never depends on SAGA
being right.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import Any, Callable

from vllm.v1.request import Request

from saga_server.core import (
    AdmissionStats,
    CoreConfig,
    EngineStats,
    FairShareConfig,
    HintRejected,
    SessionEnd,
    SessionStart,
    TenantLimits,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core.admission import AdmissionState, SessionAdmission
from saga_server.core.deadlines import DeadlineShaper
from saga_server.core.holds import PINNED, HoldLedger, Release
from saga_server.core.engine_policy import EnginePolicy, LiveRequest
from saga_server.core.kv_policy import WorkflowRules
from saga_server.core.mechanisms import ENGINE_MECHANISMS, Mechanism
from saga_server.core.sessions import Departure
from saga_server.settings import EngineSettings
from saga_server.state_file import StateKeeper

from .holds import VllmBlockPool, cached_prefix_blocks
from .intake import EngineHintSink, ReleaseKv, start_hint_service
from .metrics import PluginCounters, SagaMetrics
from . import session_chunks
from .disk_tier import disk_counts, disk_occupancy
from .offload import RequestSessions, tier_occupancy
from .prefetch import Prefetcher, is_prefetch
from .queue import RankedRequestQueue
from .recording import EngineRecording
from .request_meta import request_meta

# Under "vllm." so vLLM's own log handler (and level) shows these lines.
log = logging.getLogger("vllm.saga")

__all__ = ["SagaPlugin"]

_AFS_MAX_QUEUE = 2048  # longer queues keep FCFS: ranking costs one core call per request per step
_PIN_EVENT = {"pressure": "reclaimed", "session_end": "ended"}  # "used": see on_arrival


def _no_limits(tenant: str) -> TenantLimits:
    return TenantLimits()


def _guarded(where: str, default: Any = None):
    """Run a SAGA hook; on any exception log, count and return `default`. Its time on
    the engine thread is counted too (`saga_plugin_seconds{hook}`): what SAGA costs
    every iteration."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(self, *args, **kwargs)
            except Exception:
                log.exception("SAGA %s failed; continuing as stock vLLM for this step", where)
                self.counters.count("plugin_errors", where)
                return default
            finally:
                self.counters.count("plugin_seconds", where, time.perf_counter() - started)

        return wrapper

    return deco


class SagaPlugin:
    def __init__(self, scheduler, *, core: WorkflowCore | None = None, clock=None, start_hints: bool = True,
                 tenant_limits: Callable[[str], TenantLimits] | None = None,
                 settings: EngineSettings | None = None) -> None:
        """`core`, `clock`, `start_hints`, `tenant_limits` and `settings` are test seams;
        vLLM passes none of them (then: a fresh `WorkflowCore`, `time.monotonic`, hint
        service per the settings, each tenant's limits from that service's keys file,
        `EngineSettings.from_env()`)."""
        self.scheduler = scheduler
        self.clock = clock or time.monotonic
        self.settings = settings = settings or EngineSettings.from_env(logger=log)
        own_core = core is None
        if own_core:
            core = WorkflowCore(CoreConfig(
                max_sessions=settings.max_sessions, session_idle_s=settings.session_idle_s,
                fairshare=FairShareConfig(seniority_window_s=settings.seniority_window_s)), clock=self.clock)
        self.core = core
        # What the engine's own core learnt survives a restart (`saga_server.state_file`).
        self.state = StateKeeper.from_env("engine", core.learnt, core.restore_learnt,
                                          logger=logging.getLogger("vllm.saga.state")) if own_core else None
        self.metrics = SagaMetrics.get()
        self.counters = PluginCounters(self.metrics)
        self.enabled = bool(scheduler.cache_config.enable_prefix_caching)
        if not self.enabled:
            log.warning("SAGA: prefix caching is off, so there is no KV to keep: pins/WA-LRU/prefetch disabled")
        if settings.off:
            log.warning("SAGA: switched off: %s", ", ".join(sorted(settings.off)))
        self.block_size = scheduler.block_size
        self.tenant_limits = tenant_limits or _no_limits  # the hint service's keys replace it below
        self.engine = self._engine_policy(scheduler, settings)
        self.prefetcher = Prefetcher(scheduler, self.core, self.kv, self.counters, self.clock)
        self._prefetching = self.enabled and settings.on(Mechanism.PREFETCH)
        self.kv.on_forget(lambda sid, how: self.prefetcher.forget(sid, ended=how == Departure.ENDED))
        self._pace = _StepPace()
        self._listen_to_connector(getattr(scheduler, "connector", None))
        self._request_sessions = RequestSessions()  # for vLLM's CPU offload tier (`offload`), past a request's end
        self.kv.on_forget(lambda sid, how: self._request_sessions.forget(sid))
        session_chunks.attach(self)
        self._disk_counted: dict[str, int] = {}
        self._core_gauges_at = -math.inf
        self.recording = EngineRecording.from_env(scheduler, self.core, self.clock)
        if self.recording is not None:
            self.kv.on_forget(self.recording.forgotten)
        self.sink = EngineHintSink(self.core, self.engine_stats, on_drop=self.metrics.hints_dropped.inc,
                                   on_accept=self._core_gauges,
                                   on_event=self.recording.hint if self.recording is not None else None,
                                   held_blocks=self.ledger.blocks_of, block_tokens=self.block_size)
        self.hint_server = start_hint_service(self.sink, settings) if start_hints else None
        if tenant_limits is None and self.hint_server is not None and self.hint_server.keys is not None:
            self.tenant_limits = self.hint_server.keys.limits
        SagaMetrics.maybe_start_exporter(settings.metrics_port, settings.metrics_host)
        log.info("SAGA scheduler active: %d KV blocks of %d tokens, pin budget %.0f%%",
                 self.ledger.capacity_blocks, self.block_size, settings.pin_max_fraction * 100)

    def _engine_policy(self, scheduler, settings: EngineSettings) -> EnginePolicy:
        """The engine's policy over vLLM's block pool, with the mechanisms the settings
        leave on."""
        pool = scheduler.kv_cache_manager.block_pool
        ledger = HoldLedger(VllmBlockPool(pool), pool.num_gpu_blocks - 1, max_pin_fraction=settings.pin_max_fraction,
                            on_release=self._released,
                            owner_pin_cap=lambda tenant: self.tenant_limits(tenant).max_pinned_blocks)
        pool_tokens = ledger.capacity_blocks * self.block_size
        host_tokens = _host_tier_tokens(scheduler, pool_tokens)

        def admission(parkable):
            return SessionAdmission(self.core, pool_tokens, host_tokens=host_tokens, return_s=self._recompute_s,
                                    parkable=parkable)
        rules = WorkflowRules(self.core, wa_lru=settings.on(Mechanism.WALRU), pins=settings.on(Mechanism.TTL))
        # CPU engines add each prefill token's cost to the step: no prefill rides free,
        # so the thin budget is one block.
        shaper = (DeadlineShaper(self.core.deadline_class, prefill_budget_tokens=self.block_size)
                  if settings.on(Mechanism.SHAPE) else None)
        return EnginePolicy(
            ledger, rules, block_tokens=self.block_size, core=self.core, count=self.counters.count,
            mechanisms=ENGINE_MECHANISMS - settings.off, shaper=shaper,
            admission=admission if self.enabled and settings.on(Mechanism.ADMIT) else None)

    def _listen_to_connector(self, connector) -> None:
        """What SAGA's KV connectors report: NIXL pulls (`nixl`) and host-tier loads and
        blocks (`tier`); None where the engine runs another connector or none."""
        self.pulls = getattr(connector, "pulls", None)
        if self.pulls is not None:
            self.pulls.listener = self._pulled
        self.tier_loads = getattr(connector, "tier_loads", None)
        if self.tier_loads is not None:
            self.tier_loads.listener = self._loaded_from_tier
        self._tier_blocks = getattr(connector, "tier_blocks", None)
        self._tier_blocks_counted: dict[str, int] = {}

    @property
    def kv(self):
        """The engine's KV policy (`EnginePolicy.kv`)."""
        return self.engine.kv

    @property
    def ledger(self) -> HoldLedger:
        return self.engine.ledger

    @property
    def admission(self):
        return self.engine.admission

    # -- requests ------------------------------------------------------------------

    @_guarded("arrival")
    def on_arrival(self, request: Request) -> None:
        if is_prefetch(request.request_id):
            return
        meta = request_meta(request, self.clock())
        sid = meta.session_id
        live = LiveRequest(request.request_id, sid, meta.tenant, request.num_prompt_tokens, meta.arrived_at,
                           meta.cache_ttl_s, meta.priority_jump_s, meta=meta)
        if sid is None:
            self.engine.arrived(live)
            return
        self._request_sessions.add(request.request_id, sid)
        if self.recording is not None:
            self.recording.arrival(request, meta)
        if self.prefetcher.block_hasher is None:
            self.prefetcher.block_hasher = getattr(request, "_block_hasher", None)
        if (meta.deadline_s is not None or meta.parent_id) and self.core.session(sid) is None:
            # No hints for this session, but the request carries a deadline or names
            # its parent: start the session in the core with them, as a SessionStart
            # hint would.
            try:
                self.core.accept(SessionStart(sid, self.clock(), tenant=meta.tenant, deadline_s=meta.deadline_s,
                                              parent_id=meta.parent_id or ""))
            except HintRejected:
                pass
        outlook = self.core.kv_outlook(sid)
        live.context_tokens = outlook.context_tokens if outlook is not None else 0
        self.engine.arrived(live)
        # Not admitted: RankedRequestQueue holds it back (it asks `may_schedule`).
        self.engine.queued(request.request_id, meta.kv_need(request.num_prompt_tokens, request.max_tokens),
                           meta.arrived_at)

    @_guarded("finish")
    def on_freed(self, request: Request) -> None:
        """vLLM is about to drop the request's blocks. A finished request of a session
        leaves its cached prefix in a hold (a preempted one comes back: nothing)."""
        if not request.is_finished():
            return
        rid = request.request_id
        if is_prefetch(rid):
            self.prefetcher.on_finished(request, self._cached_blocks(rid))
            return
        live = self.engine.requests.get(rid)
        sid = live.session_id if live is not None else None
        if sid is None:
            self.engine.finished(rid, (), self.clock(), request.num_output_tokens)
            return
        if self.recording is not None:
            self.recording.finished(request)
        blocks = self._cached_blocks(rid) if self.enabled else []
        self.engine.finished(rid, blocks, self.clock(), request.num_output_tokens, owner=self.core.tenant_of(sid))
        self.prefetcher.remember(sid, request)
        if live.meta.final:  # its sender said so: the session ends now, and its KV is not held
            try:  # as the end hint would come: through the sink, so the recorder sees it too
                self.sink.accept(SessionEnd(sid, self.clock()))
            except HintRejected:
                pass  # already ended
            self.kv.forget_gone()  # now, not at the next step: nothing of it stays held
        self._gauges()

    def allocate(self, allocate_slots, request: Request, num_new_tokens: int, *args, **kwargs):
        """vLLM's `allocate_slots`, and when it fails, again after releasing held KV
        (only the deficit each round: the retry is exact, the estimate need not be)."""
        blocks = allocate_slots(request, num_new_tokens, *args, **kwargs)
        if blocks is not None or not len(self.ledger) or is_prefetch(request.request_id):
            return blocks  # speculative work never displaces held KV
        live = self.engine.requests.get(request.request_id)
        spare = live.session_id if live is not None else None
        pool = self.ledger.pool
        wanted = -(-max(1, num_new_tokens) // self.block_size) + 1  # + the watermark-ish slack
        try:
            while len(self.ledger):
                free = pool.num_free()
                if not self.engine.need_room(free + max(1, wanted - free), spare=spare):
                    break
                blocks = allocate_slots(request, num_new_tokens, *args, **kwargs)
                if blocks is not None:
                    break
        except Exception:  # forward progress beats policy: give everything back
            log.exception("SAGA reclaim failed; releasing every hold")
            self.counters.count("plugin_errors", "reclaim")
            self.ledger.release_all("fallback")
            blocks = allocate_slots(request, num_new_tokens, *args, **kwargs)
        self._gauges()
        return blocks

    # -- per step ------------------------------------------------------------------

    @_guarded("before_schedule")
    def before_schedule(self) -> None:
        now = self.clock()
        for event in self.sink.drain():
            self._apply_hint(event, now)
        waited = self.admission.counts.wait_s if self.admission is not None else 0.0
        plan = self.engine.tick(now)
        if plan.admit or plan.park:
            self.metrics.admission.labels("admitted").inc(len(plan.admit))
            self.metrics.admission.labels("parked").inc(len(plan.park))
            self.metrics.admission_wait.inc(self.admission.counts.wait_s - waited)
        self._rank_waiting(now)
        if self._prefetching:
            self.prefetcher.maybe_issue(now)
        self._gauges()

    @_guarded("after_schedule")
    def after_schedule(self, output) -> None:
        metrics, count = self.metrics, self.counters.count
        sched = self.scheduler
        now = self.clock()
        for new in output.scheduled_new_reqs:
            req = sched.requests.get(new.req_id)
            prompt = req.num_prompt_tokens if req is not None else 0
            pulled = self.pulls.take(new.req_id) if self.pulls is not None else 0
            if self.tier_loads is not None:  # loaded KV is no prefix hit either
                from_tier = self.tier_loads.take(new.req_id)
                pulled += from_tier
                if from_tier:
                    count("kv_tier_hit_tokens", n=from_tier)
            live = self.engine.requests.get(new.req_id)
            prefill = max(prompt - new.num_computed_tokens, 0)
            if live is None or live.session_id is None:
                self.engine.scheduled(new.req_id, 0, 0, prefill, now)
                continue
            sid = live.session_id
            hit = max(0, min(new.num_computed_tokens, prompt) - pulled)  # pulled KV is no prefix hit
            had = live.context_tokens  # KV it had computed before this request
            if had is None:  # scheduled before (it was preempted)
                had = 0
            elif self.recording is not None:  # first scheduled: its cached tokens as served
                self.recording.scheduled(new.req_id, hit)
            self.engine.scheduled(new.req_id, min(had, prompt) // self.block_size * self.block_size, hit,
                                  prefill, now)
            count("prefix_hit_tokens", n=hit)
            count("session_prompt_tokens", n=prompt)
            if prompt:
                metrics.session_hit_ratio.observe(hit / prompt)
            self.prefetcher.on_scheduled(sid, hit)
        for rid, n in output.num_scheduled_tokens.items():
            live = self.engine.requests.get(rid)
            if live is not None and (live.tenant or live.session_id):
                self.engine.served(live.tenant, int(n), live.session_id or "")
        per_decode = _decode_tokens(self.scheduler)
        self._pace.step(now, output.total_num_scheduled_tokens,
                        all(n <= per_decode for n in output.num_scheduled_tokens.values()))
        for direction, n in (self._tier_blocks or {}).items():
            if n != self._tier_blocks_counted.get(direction, 0):
                self.counters.count("kv_tier_blocks", direction, n - self._tier_blocks_counted.get(direction, 0))
                self._tier_blocks_counted[direction] = n

    def filter_outputs(self, outputs):
        return self.prefetcher.hide(outputs) if self.prefetcher.ever_issued else outputs

    def on_reset(self) -> None:
        self.ledger.release_all("reset")

    def close(self) -> None:
        if self.state is not None:
            self.state.close()
        if self.hint_server is not None:
            try:
                self.hint_server.stop(grace=0.5)
            except Exception:
                log.exception("stopping the hint service failed")
        if self.recording is not None:
            self.recording.close()

    # -- reads (also from the hint service's thread: counts only) --------------------

    def engine_stats(self) -> EngineStats:
        """This engine's figures for GetStats (the hint sink adds `hints_dropped`)."""
        ledger, adm = self.ledger, self.admission
        admission = None
        if adm is not None:
            states = adm.states()
            admission = AdmissionStats(active=states.get(AdmissionState.ACTIVE, 0),
                                       parked=states.get(AdmissionState.PARKED, 0),
                                       waiting=states.get(AdmissionState.WAITING, 0), limit_tokens=float(adm.limit),
                                       wait_s=float(adm.counts.wait_s))
        return EngineStats(held_sessions=len(ledger), held_blocks=ledger.held_blocks,
                           pinned_blocks=ledger.pinned_blocks, kv_blocks=ledger.capacity_blocks,
                           admission=admission, counts=self.counters.snapshot(), tables=self.table_sizes())

    def table_sizes(self) -> dict[str, int]:
        """Entries of every per-session or per-request table the plugin keeps (what a
        soak watches stay flat): its KV policy's, its prefetcher's, its own maps."""
        return {**self.engine.table_sizes(), **self.prefetcher.table_sizes(),
                "request_sessions": len(self._request_sessions)}

    # -- internals -----------------------------------------------------------------

    def _apply_hint(self, event, now: float) -> None:
        """A hint the engine loop acts on (a session's end reaches the policy through
        the core's lifecycle, not here)."""
        if isinstance(event, ReleaseKv):  # moved to another engine; its workflow state stays
            self.engine.moved(event.session_id)
        elif isinstance(event, ToolCallStart):
            self.engine.tool_started(event.session_id, now)
        elif isinstance(event, ToolCallEnd):
            self.engine.tool_ended(event.session_id, now)

    def may_schedule(self, request: Request) -> bool:
        """Whether the waiting queue may offer this request to vLLM now
        (`EnginePolicy.may_schedule`)."""
        return self.engine.may_schedule(request.request_id)

    @_guarded("token_budget", default=None)
    def step_token_budget(self, full: int) -> int | None:
        """The next step's token budget under the deadline rule, or None for vLLM's
        own (`full`): while someone is at risk and the first prefill in line (an
        at-risk one if any is waiting or prefilling) is not theirs, the running
        decodes' tokens plus the thin prefill budget."""
        engine = self.engine
        if not engine.at_risk():
            return None
        sched = self.scheduler
        running_prefills = [r.request_id for r in sched.running if r.num_computed_tokens < r.num_prompt_tokens]
        in_line = running_prefills + [r.request_id for r in sched.waiting]
        first = next((rid for rid in in_line if engine.urgent(rid)), in_line[0] if in_line else None)
        thin = engine.prefill_budget(first, self._pace.decode_step_s)
        if not thin:
            return None
        per_decode = _decode_tokens(sched)
        decodes = len(sched.running) - len(running_prefills)
        self.counters.count("deadline", "thin_step")
        return min(full, decodes * per_decode + thin)

    def session_of_request(self, request_id: str) -> str | None:
        """The session a (possibly finished) request belonged to, for the offload tier."""
        return self._request_sessions.get(request_id)

    def offload_key(self, session_id: str, last_use: float) -> float:
        """The session's key for the offload tier's order (`core.host_tier`): the
        policy's, as for its KV in the pool."""
        outlook = self.core.kv_outlook(session_id)
        return self.kv.key_of(session_id, outlook.context_tokens if outlook is not None else 0, last_use)

    def _recompute_s(self, tokens: int) -> float:
        """Seconds this engine needs to prefill `tokens` (measured, see `_StepPace`)."""
        return tokens / self._pace.tokens_per_s

    def _rank_waiting(self, now: float) -> None:
        waiting = self.scheduler.waiting
        if not isinstance(waiting, RankedRequestQueue):
            return
        if waiting.gated:
            waiting.ungate()
        engine = self.engine
        if engine.at_risk():
            waiting.regate()
        if not engine.ranks or not 2 <= len(waiting) <= _AFS_MAX_QUEUE:
            return
        tenant_prio: dict[str, float] = {}

        def rank(req: Request) -> tuple[float, float]:
            key = engine.rank(req.request_id, now)
            live = engine.requests.get(req.request_id)
            tenant = live.tenant if live is not None else ""
            tenant_prio[tenant] = min(key[0], tenant_prio.get(tenant, math.inf))
            return key

        if waiting.rerank(rank):
            self.counters.count("afs_reorders")
        for tenant, prio in tenant_prio.items():
            self.metrics.set_afs(tenant, prio)

    def _released(self, r: Release) -> None:
        self.counters.count("released", r.reason, r.before - r.after)
        event = _PIN_EVENT.get(r.reason) if r.tier == PINNED else None
        if event:
            self.counters.count("pins", event)

    @_guarded("pulled")
    def _pulled(self, ok: bool, tokens: int, seconds: float) -> None:
        self.counters.count("kv_pulls", "ok" if ok else "failed")
        self.counters.count("kv_pull_seconds", n=seconds)
        if ok:
            self.counters.count("kv_pulled_tokens", n=tokens)

    @_guarded("loaded_from_tier")
    def _loaded_from_tier(self, ok: bool, tokens: int, seconds: float) -> None:
        self.counters.count("kv_tier_loads", "ok" if ok else "failed")
        self.counters.count("kv_tier_load_seconds", n=seconds)

    def _cached_blocks(self, request_id: str) -> list:
        return cached_prefix_blocks(self.scheduler.kv_cache_manager, request_id)

    def _gauges(self) -> None:
        m, ledger = self.metrics, self.ledger
        m.held_blocks.set(ledger.held_blocks)
        m.pinned_blocks.set(ledger.pinned_blocks)
        m.held_sessions.set(len(ledger))
        if self.admission is not None:
            states = self.admission.states()
            for state in AdmissionState:
                m.admission_sessions.labels(state).set(states.get(state, 0))
        if self.tier_loads is not None:
            used, capacity = tier_occupancy()
            self.counters.set("kv_tier_used_chunks", used)
            self.counters.set("kv_tier_chunks", capacity)
            used, capacity = disk_occupancy()
            if capacity:
                self.counters.set("kv_disk_used_chunks", used)
                self.counters.set("kv_disk_capacity_chunks", capacity)
                for what, n in disk_counts().items():
                    if n != self._disk_counted.get(what, 0):
                        self.counters.count("kv_disk_chunks", what, n - self._disk_counted.get(what, 0))
                        self._disk_counted[what] = n
        self._core_gauges()

    def _core_gauges(self, min_interval_s: float = 0.5) -> None:
        """Session gauges from the core (its stats take a lock: at most every 0.5 s).
        Also called from the hint thread, so sessions show even when no request runs."""
        now = time.monotonic()
        if now - self._core_gauges_at < min_interval_s:
            return
        self._core_gauges_at = now
        stats = self.core.stats()
        self.metrics.active_sessions.set(stats["sessions_live"])
        self.metrics.open_tool_calls.set(stats.get("open_tool_calls", 0.0))


class _StepPace:
    """The engine's pace, measured between consecutive steps that scheduled work (EWMAs):
    tokens processed per second (1,000 until the first measurement) and the seconds a
    step that scheduled no prefill takes (`decode_step_s`, 0 until one was timed: the
    deadline rule's step with no prefill, as the simulator prices it; a step that runs
    a prefill chunk can take many times longer on an engine that prices every token).
    A step's time counts at most twice the estimate: a gap can hold idle time (the
    engine waited for requests)."""

    __slots__ = ("tokens_per_s", "decode_step_s", "_at", "_decode_only")

    def __init__(self) -> None:
        self.tokens_per_s = 1000.0
        self.decode_step_s = 0.0
        self._at: float | None = None
        self._decode_only = False

    def step(self, now: float, tokens: int, decode_only: bool) -> None:
        """A step scheduled `tokens` at `now`; `decode_only`: none of them prefill. The
        time since the last call is the last step's run, so `decode_step_s` counts it
        when that step was decode-only."""
        if self._at is not None and tokens and now > self._at:
            took = now - self._at
            self.tokens_per_s += 0.1 * (tokens / took - self.tokens_per_s)
            if self._decode_only:
                d = self.decode_step_s
                self.decode_step_s = took if not d else d + 0.1 * (min(took, 2 * d) - d)
        self._at = now if tokens else None
        self._decode_only = decode_only


def _decode_tokens(scheduler) -> int:
    """Tokens a decoding request schedules in one step (more with speculative decoding)."""
    spec = getattr(scheduler, "num_spec_tokens", 0) or 0
    return 1 + spec + scheduler.num_lookahead_tokens if spec else 1


def _host_tier_tokens(scheduler, pool_tokens: int) -> int:
    """Tokens the host KV tier holds (`--kv-offloading-size`: vLLM's flag, or the
    connector's `cpu_bytes_to_use` that `saga serve` writes), at the pool's bytes per
    token; 0 without one."""
    gib = getattr(scheduler.cache_config, "kv_offloading_size", None)
    transfer = getattr(getattr(scheduler, "vllm_config", None), "kv_transfer_config", None)
    tier_bytes = (gib or 0) * 2**30 or float((getattr(transfer, "kv_connector_extra_config", None) or {})
                                             .get("cpu_bytes_to_use") or 0)
    tensors = getattr(getattr(scheduler, "kv_cache_config", None), "kv_cache_tensors", None) or []
    pool_bytes = sum(getattr(t, "size", 0) for t in tensors)
    if not tier_bytes or not pool_bytes:
        return 0
    return int(tier_bytes * pool_tokens / pool_bytes)
