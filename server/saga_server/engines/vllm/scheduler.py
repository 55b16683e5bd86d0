"""`SagaScheduler`: vLLM's v1 `Scheduler` with the workflow core's decisions applied.

Load it with `--scheduler-cls saga_server.engines.vllm.SagaScheduler` (CPU builds,
where async scheduling is off) or `saga_server.engines.vllm.SagaAsyncScheduler`
(GPU builds with async scheduling on); `saga serve` picks the right one.

What changes relative to stock vLLM (everything else is vLLM's own code path):

- **Pins and WA-LRU** (`holds.SessionHolds`): when a request of a known session
  finishes, its cached blocks are kept referenced. The core's `pin_decision`
  makes that a hard pin with a TTL (tool calls worth waiting for) or a soft hold.
  Held blocks return to vLLM's free queue when the session's next request is
  scheduled (after its prefix hit), on TTL expiry (pin -> soft), on session end,
  and whenever `allocate_slots` would fail: then soft holds leave first in the
  core's `eviction_priority` order (WA-LRU), pins after them in `reclaim_order`.
  So allocation never fails where stock vLLM would have succeeded.
- **AFS**: before each step the FCFS waiting queue is stably re-sorted by the
  core's `request_rank`: tenants' fair-share priority, then within a tenant the
  task's seniority (older tasks first, so tasks finish in the order they began;
  preempted requests stay in front). Service is recorded per tenant after each
  step. `SAGA_SENIORITY_WINDOW_S` bounds how far seniority reaches back (0:
  request-level FCFS within a tenant, as stock).
- **Prefetch**: when the core plans it for a paused session whose KV was
  reclaimed and the engine has spare capacity (nothing waiting, few running),
  the session's last known tokens are re-prefilled as an internal one-token
  request whose output never leaves the engine; the resumed request then hits.
  While requests run, a prefetch starts when the plan says (just before the
  predicted resume); on an idle engine it starts at once, since idle capacity
  costs nothing. vLLM's EngineCore steps once more after its last request
  finishes (to report it); that step sees the idle engine and issues the
  prefetch, and each prefetch's own finish gives the next step, so due
  prefetches chain. Then the EngineCore blocks on its input queue: a prefetch
  that only becomes due later waits for the next request. The prefetch is an
  ordinary request to vLLM, so with a CPU offload tier (`--kv-offloading-size`,
  vLLM's `OffloadingConnector`) its prefix is loaded from the tier, not recomputed.
- **Hints**: see `intake`; a gRPC hint service runs in this (EngineCore)
  process and feeds the core; tool/session events reach the scheduler through a
  queue drained at each `schedule()`.

Every SAGA step is wrapped so that an exception in SAGA code is logged and
counted (`saga_plugin_errors`) and vLLM carries on as stock: serving never
depends on SAGA being right.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import os
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from saga_server.core import (
    CoreConfig,
    FairShareConfig,
    HintRejected,
    PrefetchCandidate,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)

from .holds import Hold, SessionHolds
from .intake import EngineHintSink, ReleaseKv, start_hint_service
from .metrics import SagaMetrics
from .sessions import request_meta

# Under "vllm." so vLLM's own log handler (and level) shows these lines.
log = logging.getLogger("vllm.saga")

__all__ = ["SagaScheduler", "SagaAsyncScheduler", "SagaSchedulerMixin", "PREFETCH_PREFIX"]

PREFETCH_PREFIX = "saga-prefetch-"
PIN_FRACTION_ENV = "SAGA_PIN_MAX_FRACTION"
SENIORITY_WINDOW_ENV = "SAGA_SENIORITY_WINDOW_S"
_KNOWN_TOKENS_SESSIONS = 4096
_AFS_MAX_QUEUE = 2048  # sessions whose last token ids we remember (prefetch)


def _env_float(name: str, default: float, lo: float, hi: float = math.inf) -> float:
    """A SAGA knob from the environment; a malformed or out-of-range value is
    logged and the default kept (serving never fails over a SAGA knob)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:
        log.warning("SAGA: ignoring %s=%r (want a number in [%g, %g]); using %g", name, raw, lo, hi, default)
        return default
    return value


def _guarded(where: str, default: Any = None):
    """Run a SAGA hook; on any exception log, count and return `default`."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Exception:
                log.exception("SAGA %s failed; continuing as stock vLLM for this step", where)
                self._saga_metrics.plugin_errors.labels(where).inc()
                self.saga_counters["plugin_errors"] += 1
                return default

        return wrapper

    return deco


class SagaSchedulerMixin:
    """The SAGA behaviour; mixed in front of vLLM's `Scheduler` or `AsyncScheduler`."""

    def __init__(self, *args, core: WorkflowCore | None = None, clock=None, start_hints: bool = True,
                 **kwargs) -> None:
        """`core`, `clock` and `start_hints` are test seams; vLLM passes none of them
        (then: a fresh `WorkflowCore`, `time.monotonic`, hint service per env)."""
        super().__init__(*args, **kwargs)
        self._saga_clock = clock or time.monotonic
        if core is None:
            window = _env_float(SENIORITY_WINDOW_ENV, FairShareConfig().seniority_window_s, 0.0)
            core = WorkflowCore(CoreConfig(fairshare=FairShareConfig(seniority_window_s=window)),
                                clock=self._saga_clock)
        self.saga_core = core
        self._saga_metrics = SagaMetrics.get()
        pool = self.kv_cache_manager.block_pool
        self._saga_enabled = bool(self.cache_config.enable_prefix_caching)
        if not self._saga_enabled:
            log.warning("SAGA: prefix caching is off, so there is no KV to keep: pins/WA-LRU/prefetch disabled")
        fraction = _env_float(PIN_FRACTION_ENV, 0.5, 0.0, 1.0)
        self.saga_holds = SessionHolds(pool, pool.num_gpu_blocks - 1, self.block_size,
                                       max_pin_fraction=fraction, on_release=self._saga_on_release)
        self._saga_core_gauges_at = -1e18
        self.saga_sink = EngineHintSink(self.saga_core, self.saga_engine_stats,
                                        on_drop=self._saga_metrics.hints_dropped.inc,
                                        on_accept=self._saga_core_gauges)
        self._saga_req_meta: dict[str, Any] = {}  # request id -> RequestMeta (live requests)
        self._saga_known_tokens: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._saga_prefetch: dict[str, str] = {}  # session -> internal request id in flight or done
        self._saga_prefetched: set[str] = set()  # sessions whose prefetched KV awaits use
        self._saga_block_hasher = None
        self._saga_prefetch_seq = 0
        self.saga_counters = collections.Counter()
        # Route every allocation through the reclaim path (WA-LRU + forward progress).
        self._saga_allocate = self.kv_cache_manager.allocate_slots
        self.kv_cache_manager.allocate_slots = self._saga_allocate_slots
        self.saga_hint_server = start_hint_service(self.saga_sink) if start_hints else None
        SagaMetrics.maybe_start_exporter()
        log.info("SAGA scheduler active: %d KV blocks of %d tokens, pin budget %.0f%%",
                 pool.num_gpu_blocks - 1, self.block_size, fraction * 100)

    # -- vLLM hooks ----------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        self._saga_on_arrival(request)
        super().add_request(request)

    def schedule(self, *args, **kwargs):
        self._saga_before_schedule()
        output = super().schedule(*args, **kwargs)
        self._saga_after_schedule(output)
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self._saga_prefetch_seq:  # ever issued one (its entry is gone once it finished)
            self._saga_hide_prefetch_outputs(outputs)
        return outputs

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        if not delay_free_blocks:
            self._saga_on_finish(request)
        return super()._free_request(request, delay_free_blocks=delay_free_blocks)

    def reset_prefix_cache(self, *args, **kwargs) -> bool:
        self.saga_holds.release_all("reset")
        return super().reset_prefix_cache(*args, **kwargs)

    def shutdown(self) -> None:
        if self.saga_hint_server is not None:
            try:
                self.saga_hint_server.stop(grace=0.5)
            except Exception:
                log.exception("stopping the hint service failed")
        super().shutdown()

    # -- arrival / finish ----------------------------------------------------------------

    @_guarded("arrival")
    def _saga_on_arrival(self, request: Request) -> None:
        if request.request_id.startswith(PREFETCH_PREFIX):
            return
        meta = request_meta(request, self._saga_clock())
        self._saga_req_meta[request.request_id] = meta
        if meta.session_id is None:
            return
        if self._saga_block_hasher is None:
            self._saga_block_hasher = getattr(request, "_block_hasher", None)
        if meta.deadline_s is not None and self.saga_core.session(meta.session_id) is None:
            # No hints for this session, but the request carries a deadline: start
            # the session in the core with it, as a SessionStart hint would.
            try:
                self.saga_core.accept(SessionStart(meta.session_id, self._saga_clock(), tenant=meta.tenant,
                                                   deadline_s=meta.deadline_s))
            except HintRejected:
                pass
        self.saga_core.on_request_arrival(meta.session_id, request.num_prompt_tokens, meta.tenant)

    @_guarded("finish")
    def _saga_on_finish(self, request: Request) -> None:
        rid = request.request_id
        if rid.startswith(PREFETCH_PREFIX):
            self._saga_finish_prefetch(request)
            return
        meta = self._saga_req_meta.pop(rid, None)
        if meta is None or meta.session_id is None:
            return
        sid = meta.session_id
        self.saga_core.on_request_finished(sid, request.num_prompt_tokens, request.num_output_tokens)
        self._saga_remember_tokens(sid, request)
        if not self._saga_enabled:
            return
        blocks = self._saga_cached_blocks(rid)
        if not blocks:
            return
        kv_tokens = len(blocks) * self.block_size
        decision = self.saga_core.pin_decision(sid, kv_tokens, self.saga_holds.pressure())
        hold = self.saga_holds.hold(sid, blocks, pin=decision.pin, ttl_s=decision.ttl_s,
                                    now=self._saga_clock(), kv_tokens=kv_tokens, reason=decision.reason)
        self._saga_count_pin(decision.pin, hold)

    def _saga_cached_blocks(self, request_id: str) -> list:
        """The request's leading blocks that carry a hash (prefix-cache entries)."""
        out = []
        for group in self.kv_cache_manager.get_blocks(request_id).blocks:
            for block in group:
                if block.block_hash is None or getattr(block, "is_null", False):
                    break
                out.append(block)
        return out

    def _saga_remember_tokens(self, sid: str, request: Request) -> None:
        tokens = list(request.all_token_ids)
        known = self._saga_known_tokens
        known[sid] = tokens
        known.move_to_end(sid)
        while len(known) > _KNOWN_TOKENS_SESSIONS:
            known.popitem(last=False)

    def _saga_count_pin(self, wanted: bool, hold: Hold | None) -> None:
        if hold is None:
            return
        if hold.pinned:
            self._saga_metrics.pins.labels("created").inc()
            self.saga_counters["pins_created"] += 1
        elif wanted:
            self._saga_metrics.pins.labels("refused").inc()
            self.saga_counters["pins_refused"] += 1
        self._saga_gauges()

    def _saga_on_release(self, sid: str, reason: str, n_blocks: int, was_pinned: bool) -> None:
        self._saga_metrics.evictions.labels(reason).inc(n_blocks)
        self.saga_counters[f"released_{reason}"] += n_blocks
        if was_pinned:
            event = {"arrival": "used", "pressure": "reclaimed", "session_end": "ended"}.get(reason)
            if event:
                self._saga_metrics.pins.labels(event).inc()
                self.saga_counters[f"pins_{event}"] += 1

    # -- allocation: reclaim on demand ---------------------------------------------------

    def _saga_allocate_slots(self, request: Request, num_new_tokens: int, *args, **kwargs):
        blocks = self._saga_allocate(request, num_new_tokens, *args, **kwargs)
        if blocks is not None or not len(self.saga_holds):
            return blocks
        if request.request_id.startswith(PREFETCH_PREFIX):
            return None  # speculative work never displaces held KV
        # Sessions whose next request is already queued keep their KV longest:
        # releasing it would turn an imminent prefix hit into a recompute. Among
        # them the back of the queue goes first (its use is farthest away), the
        # session being allocated for last of all.
        queued = [m.session_id for m in map(self._saga_req_meta.get, (r.request_id for r in self.waiting))
                  if m is not None and m.session_id]
        protect = queued[::-1]
        meta = self._saga_req_meta.get(request.request_id)
        if meta is not None and meta.session_id:
            protect.append(meta.session_id)
        pool = self.kv_cache_manager.block_pool
        wanted = -(-max(1, num_new_tokens) // self.block_size) + 1  # + the watermark-ish slack
        while len(self.saga_holds):
            # Release only the deficit, then retry: the retry is exact, the estimate
            # need not be (an underestimate costs one more round).
            need = max(1, wanted - pool.get_num_free_blocks())
            released = self._saga_reclaim(need, protect)
            if not released:
                break
            blocks = self._saga_allocate(request, num_new_tokens, *args, **kwargs)
            if blocks is not None:
                break
        self._saga_gauges()
        return blocks

    def _saga_reclaim(self, need_blocks: int, protect: list[str]):
        core = self.saga_core

        def soft_order(holds: list[Hold]) -> list[Hold]:
            keyed = []
            for h in holds:
                try:
                    key = core.eviction_priority(h.session_id, h.kv_tokens, h.last_access)
                except Exception:
                    key = h.last_access
                keyed.append((key, h.session_id, h))
            keyed.sort(key=lambda t: (t[0], t[1]))
            return [h for _, _, h in keyed]

        try:
            return self.saga_holds.reclaim(need_blocks, soft_order, core.reclaim_order, protect)
        except Exception:
            # The policy failed: fall back to releasing in insertion order so the
            # allocation can still succeed (forward progress beats policy).
            log.exception("SAGA reclaim policy failed; releasing holds in arrival order")
            self._saga_metrics.plugin_errors.labels("reclaim").inc()
            return self.saga_holds.reclaim(need_blocks, lambda hs: hs, sorted, protect)

    # -- per step ------------------------------------------------------------------------

    @_guarded("before_schedule")
    def _saga_before_schedule(self) -> None:
        now = self._saga_clock()
        for event in self.saga_sink.drain():
            self._saga_apply_hint(event, now)
        for sid in self.saga_holds.expire(now):
            self._saga_metrics.pins.labels("expired").inc()
            self.saga_counters["pins_expired"] += 1
        self._saga_order_waiting()
        self._saga_maybe_prefetch(now)
        self._saga_gauges()

    def _saga_apply_hint(self, event, now: float) -> None:
        sid = event.session_id
        if isinstance(event, ReleaseKv):  # moved to another engine; its workflow state stays
            self.saga_holds.release(sid, "moved")
            self._saga_known_tokens.pop(sid, None)
            self._saga_prefetched.discard(sid)
        elif isinstance(event, SessionEnd):
            self.saga_holds.release(sid, "session_end")
            self._saga_known_tokens.pop(sid, None)
            if sid in self._saga_prefetched:
                self._saga_prefetched.discard(sid)
                self._saga_metrics.prefetch.labels("wasted").inc()
        elif isinstance(event, ToolCallStart):
            # The tool is known only now (hints usually arrive after the answer):
            # re-ask whether this hold deserves a pin.
            # A pin taken at finish time used priors; the hint may carry the tool's
            # expected duration, so a new decision replaces the old TTL.
            hold = self.saga_holds.get(sid)
            if hold is not None and hold.blocks:
                decision = self.saga_core.pin_decision(sid, hold.kv_tokens, self.saga_holds.pressure())
                if decision.pin:
                    new = self.saga_holds.hold(sid, list(hold.blocks), pin=True, ttl_s=decision.ttl_s, now=now,
                                               kv_tokens=hold.kv_tokens, reason=decision.reason)
                    self._saga_count_pin(True, new)
        elif isinstance(event, ToolCallEnd):
            pass  # resume is near: prefetch planning (each step) sees the core's prediction

    def _saga_order_waiting(self) -> None:
        waiting = self.waiting
        # vLLM's priority policy keeps its own order; very long queues keep FCFS
        # (re-sorting costs one core call per request per step).
        if not 2 <= len(waiting) <= _AFS_MAX_QUEUE or not isinstance(waiting, FCFSRequestQueue):
            return
        core = self.saga_core
        now = self._saga_clock()
        keyed = []
        tenant_prio: dict[str, float] = {}
        for pos, req in enumerate(waiting):
            meta = self._saga_req_meta.get(req.request_id)
            sid = meta.session_id if meta else None
            tenant = meta.tenant if meta else ""
            front = 0 if req.status == RequestStatus.PREEMPTED else 1
            # Requests without a session compete as their tenant ("" if none) and
            # as a task that started on arrival, so they are neither starved nor favoured.
            prio, senior = core.request_rank(sid or "", tenant, meta.arrived_at if meta else now)
            tenant_prio[tenant] = min(prio, tenant_prio.get(tenant, math.inf))
            keyed.append((front, prio, senior, pos, req))
        for tenant, prio in tenant_prio.items():
            self._saga_metrics.set_afs(tenant, prio)
        keyed.sort(key=lambda t: t[:4])
        if [t[4] for t in keyed] != list(waiting):
            waiting.clear()
            waiting.extend(t[4] for t in keyed)
            self.saga_counters["afs_reorders"] += 1

    @_guarded("after_schedule")
    def _saga_after_schedule(self, output) -> None:
        metrics = self._saga_metrics
        for new in output.scheduled_new_reqs:
            rid = new.req_id
            if rid.startswith(PREFETCH_PREFIX):
                continue
            meta = self._saga_req_meta.get(rid)
            if meta is None or meta.session_id is None:
                continue
            sid = meta.session_id
            req = self.requests.get(rid)
            prompt = req.num_prompt_tokens if req is not None else 0
            hit = min(new.num_computed_tokens, prompt)
            metrics.prefix_hit_tokens.inc(hit)
            metrics.session_prompt_tokens.inc(prompt)
            if prompt:
                metrics.session_hit_ratio.observe(hit / prompt)
            self.saga_counters["session_hit_tokens"] += hit
            self.saga_counters["session_prompt_tokens"] += prompt
            if sid in self.saga_holds:
                self.saga_holds.release(sid, "arrival")
            if sid in self._saga_prefetched:
                self._saga_prefetched.discard(sid)
                metrics.prefetch.labels("used" if hit else "wasted").inc()
                self.saga_counters["prefetch_used" if hit else "prefetch_wasted"] += 1
        for rid, n in output.num_scheduled_tokens.items():
            meta = self._saga_req_meta.get(rid)
            if meta is not None and (meta.tenant or meta.session_id):
                self.saga_core.record_service(meta.tenant, int(n), meta.session_id or "")

    def _saga_gauges(self) -> None:
        m = self._saga_metrics
        m.held_blocks.set(self.saga_holds.held_blocks)
        m.pinned_blocks.set(self.saga_holds.pinned_blocks)
        m.held_sessions.set(len(self.saga_holds))
        self._saga_core_gauges()

    def _saga_core_gauges(self, min_interval_s: float = 0.5) -> None:
        """Session gauges from the core (its stats take a lock: at most every 0.5 s).
        Also called from the hint thread, so sessions show even when no request runs."""
        now = time.monotonic()
        if now - self._saga_core_gauges_at < min_interval_s:
            return
        self._saga_core_gauges_at = now
        stats = self.saga_core.stats()
        self._saga_metrics.active_sessions.set(stats.get("sessions_live", stats.get("aeg_sessions", 0.0)))
        self._saga_metrics.open_tool_calls.set(stats.get("open_tool_calls", 0.0))

    def saga_engine_stats(self) -> dict[str, float]:
        """Engine-side figures merged into the hint service's GetStats (read from
        the gRPC thread: only counts, no iteration over shared blocks lists)."""
        c = dict(self.saga_counters)
        holds = dict(self.saga_holds._holds)
        out = {f"engine_{k}": float(v) for k, v in c.items()}
        out["engine_held_sessions"] = float(len(holds))
        out["engine_held_blocks"] = float(sum(len(h.blocks) for h in holds.values()))
        out["engine_pinned_blocks"] = float(sum(len(h.blocks) for h in holds.values() if h.pinned))
        out["engine_kv_blocks"] = float(self.saga_holds.total_blocks)
        return out

    # -- prefetch ------------------------------------------------------------------------

    def _saga_maybe_prefetch(self, now: float) -> None:
        idle = not self.running and not self.waiting and not self.kv_holding_waiting
        sid = self._saga_next_prefetch(now, idle)
        if sid is not None:
            self._saga_issue_prefetch(sid)

    def _saga_next_prefetch(self, now: float, idle: bool) -> str | None:
        """The session to re-prefill now, if any (one at a time, spare capacity only)."""
        if not self._saga_enabled or self._saga_block_hasher is None:
            return None
        if self.waiting or self.kv_holding_waiting or len(self.running) >= max(1, self.max_num_running_reqs // 4):
            return None  # only with spare capacity
        if any(rid.startswith(PREFETCH_PREFIX) for rid in (r.request_id for r in self.running)):
            return None  # one at a time: prefetch must never crowd out real work
        candidates = []
        for sid, tokens in self._saga_known_tokens.items():
            if sid in self._saga_prefetched or sid in self._saga_prefetch:
                continue
            hold = self.saga_holds.get(sid)
            held_tokens = len(hold.blocks) * self.block_size if hold else 0
            missing = (len(tokens) - 1) // self.block_size * self.block_size - held_tokens
            if missing >= self.block_size * 2:
                candidates.append(PrefetchCandidate(sid, len(tokens), 0.0))
        if not candidates:
            return None
        free_tokens = self.kv_cache_manager.block_pool.get_num_free_blocks() * self.block_size
        for action in self.saga_core.plan_prefetch(candidates, free_tokens)[:1]:
            if idle or action.start_at <= now:
                return action.session_id
        return None

    def _saga_issue_prefetch(self, sid: str) -> None:
        from vllm.sampling_params import SamplingParams  # noqa: PLC0415

        tokens = self._saga_known_tokens.get(sid)
        if not tokens:
            return
        self._saga_prefetch_seq += 1
        rid = f"{PREFETCH_PREFIX}{self._saga_prefetch_seq}"
        req = Request(rid, list(tokens), SamplingParams(max_tokens=1), None, block_hasher=self._saga_block_hasher,
                      session_id=sid)
        self._saga_prefetch[sid] = rid
        Scheduler.add_request(self, req)  # not our add_request: no core arrival for it
        self._saga_metrics.prefetch.labels("issued").inc()
        self.saga_counters["prefetch_issued"] += 1

    def _saga_finish_prefetch(self, request: Request) -> None:
        sid = request.session_id
        if sid is None:
            return
        self._saga_prefetch.pop(sid, None)
        if request.status == RequestStatus.FINISHED_ABORTED:
            return
        blocks = self._saga_cached_blocks(request.request_id)
        if blocks:
            self.saga_holds.hold(sid, blocks, pin=False, ttl_s=0.0, now=self._saga_clock(),
                                 kv_tokens=len(blocks) * self.block_size, reason="prefetch")
            self._saga_prefetched.add(sid)

    def _saga_hide_prefetch_outputs(self, outputs) -> None:
        """Internal requests have no client: drop their outputs before they leave."""
        for eco in outputs.values():
            if eco.outputs:
                eco.outputs = [o for o in eco.outputs if not o.request_id.startswith(PREFETCH_PREFIX)]
            if eco.finished_requests:
                eco.finished_requests = {r for r in eco.finished_requests if not r.startswith(PREFETCH_PREFIX)}


class SagaScheduler(SagaSchedulerMixin, Scheduler):
    """CPU builds and `--no-async-scheduling`: SAGA on vLLM's synchronous scheduler."""


class SagaAsyncScheduler(SagaSchedulerMixin, AsyncScheduler):
    """GPU builds with async scheduling: same behaviour on vLLM's `AsyncScheduler`."""
