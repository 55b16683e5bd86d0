"""Discrete-event simulator of a cluster of vLLM-like workers serving agent sessions.

Model (deterministic under a seed; all times in simulated seconds):

- **Sessions** replay a task's steps closed-loop: a step's request arrives at the
  session's worker, is queued, admitted, prefilled, decoded; then the step's tools run
  (their trace durations) and the next step's request arrives.
- **Router**: a session is placed at start and stays there (session affinity, for
  every policy: without it no prefix cache survives). Baselines model a stock router:
  the worker with the fewest live sessions (then most free KV). Policies with `steals`
  route through `saga_server.core.routing.SessionRouter`, the policy of the Ray Serve
  router, fed `ReplicaView`s built from the workers at every decision (queue = waiting
  + running requests, KV usage = blocks held for live sessions / pool, sessions whose
  KV is resident here (GPU or host tier) and which of them are in a tool): it places
  new sessions (`SimPolicy.place`) and, every `steal_period_s`, may move one session
  off the most loaded worker (`SimPolicy.plan_steal`).
- **A steal moves the KV**: the session's resident prefix (GPU entry, and the host
  tier's copy beyond it) is sent to the target over the inter-node link
  (`CostModel.net_transfer_s`, one transfer at a time per worker NIC) and freed on the
  source at once; when it lands it is inserted into the target's pool, evicting idle
  unpinned prefixes there if needed (what still does not fit is recomputed later). A
  session in a tool moves at once, so a transfer shorter than the tool is hidden and
  the next request is a full hit; a queued request leaves the source queue and joins
  the target's when its KV lands (keeping its place in the order); a running request
  finishes where it is and the session moves as its tool starts. A request arriving
  while its KV is in flight waits for it.
- **Admission** (vLLM's scheduler): the waiting queue in policy order; the head is
  admitted when fewer than `max_num_seqs` run and its KV (prompt + output, in blocks)
  fits after evicting idle prefixes; otherwise the queue waits (head-of-line, as vLLM).
  The hit is the session's resident prefix (and, with a host tier, the contiguous
  offloaded range, loaded over the host link before prefill). The run's shared prefix
  (system prompt, tool schema) is held by every running request of the run, so it is
  modelled as always resident and not charged to the pool.
- **Continuous batching as a fluid**: between events a worker's batch is fixed, each
  iteration takes `CostModel.step_s(decoding, prefill_chunk, context)`, every decoding
  request advances one token per iteration and the prefill queue (FIFO) advances by the
  token budget left after decodes (chunked prefill). Progress between events is
  analytic, so cost is per event, not per iteration.

`run()` returns a `SimResult` of raw counters; `saga_server.bench.metrics` turns them
into the reported metrics.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from saga_server.core.routing import ReplicaView, Steal

from .cache import PINNED, PROTECTED, SOFT, Eviction, HostTier, PrefixCache
from .hardware import CostModel
from .policy import SimPolicy
from .tasks import TaskInstance

__all__ = ["SimConfig", "Simulator", "SimResult", "TaskRecord", "Session", "Request",
           "unloaded_time_s"]

# Event kinds (a step's arrival is handled inline by the tool end that causes it).
_TOOL_END, _WORKER, _LOADED, _PIN_EXPIRE, _PREFETCH, _TASK_START, _SAMPLE, _STEAL, _MOVED = range(9)
_EPS = 1e-6
_ARRIVE = "arrive"  # Session.held: its next request arrived while its KV was in flight


@dataclass(frozen=True, slots=True)
class SimConfig:
    workers: int = 4
    concurrency: int | None = None  # closed-loop task limit; None: use arrival times
    host_tier_factor: float = 4.0  # host KV capacity as a multiple of the GPU pool
    steal_period_s: float = 1.0  # policies with `steals`: plan_steal every this many seconds
    sample_every_s: float = 5.0  # memory utilisation time series
    seed: int = 0


@dataclass(slots=True)
class TaskRecord:
    session_id: str
    tenant: str
    task_id: str
    started_at: float
    finished_at: float
    unloaded_s: float
    deadline_s: float | None

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
    prefilled_tokens: int = 0
    regen_gpu_s: float = 0.0  # compute time of regenerating recomputed tokens
    busy_gpu_s: float = 0.0  # worker time with a non-empty batch
    capacity_block_s: float = 0.0  # KV pool size x makespan, all workers
    useful_block_s: float = 0.0  # time integral of live + cached-live blocks
    evicted_blocks: int = 0
    prefetched_tokens: int = 0
    steals: int = 0  # sessions moved (their KV with them)
    steals_in_tool: int = 0  # of those, inside a tool call when the router chose them
    moved_tokens: int = 0  # KV tokens transferred and inserted on the target
    move_dropped_tokens: int = 0  # transferred but no room on the target: recomputed there
    move_s: float = 0.0  # inter-node transfer time, summed over moves
    # (time, session, source, target, in tool when chosen, tokens sent)
    steal_log: list[tuple[float, str, int, int, bool, int]] = field(default_factory=list)
    worker_busy_s: list[float] = field(default_factory=list)  # per worker: time with a non-empty batch
    # Closed loop: the window while every slot was busy (until the last task started).
    saturated_s: float = 0.0
    saturated_tasks: int = 0
    saturated_tokens: int = 0
    saturated_useful_block_s: float = 0.0
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (t, utilisation)


class Session:
    __slots__ = ("session_id", "task", "tenant", "worker", "step", "started_at",
                 "last_access", "state", "next_use", "tool_names", "kv_tokens", "base",
                 "prefetch_ready_at", "unloaded_s", "deadline_s",
                 "move_to", "move_in_tool", "in_transit", "held")

    def __init__(self, inst: TaskInstance, now: float, base: int) -> None:
        self.session_id = inst.session_id
        self.task = inst.task
        self.tenant = inst.tenant
        self.worker = -1
        self.step = 0
        self.started_at = now
        self.last_access = now
        self.state = "queued"  # queued, running, tool, ended
        self.next_use = now
        self.tool_names: tuple[str, ...] = ()
        self.kv_tokens = 0
        self.base = base  # shared-prefix tokens, always resident
        self.prefetch_ready_at = 0.0
        self.unloaded_s = 0.0
        self.deadline_s: float | None = None
        self.move_to = -1  # a planned move not yet started (the session was running)
        self.move_in_tool = False  # the router chose it while it was in a tool
        self.in_transit = False  # its KV is on the way to `worker`
        self.held = None  # what waits for the KV: _ARRIVE or a stolen queue item


class Request:
    __slots__ = ("sess", "prompt", "output", "reuse", "work", "pf_end", "ctx_weight",
                 "seq", "arrived_at", "recomputed")

    def __init__(self, sess: Session, prompt: int, output: int, reuse: int, seq: int,
                 now: float) -> None:
        self.sess = sess
        self.prompt = prompt
        self.output = output
        self.reuse = reuse
        self.work = 0.0
        self.pf_end = 0.0
        self.ctx_weight = prompt + output / 2.0
        self.seq = seq
        self.arrived_at = now
        self.recomputed = 0


class _Worker:
    __slots__ = ("wid", "cache", "host", "queue", "dec", "pf", "pf_total", "pf_done",
                 "dec_clock", "ctx", "tau", "pf_rate", "t", "version", "busy", "running",
                 "link_free", "net_free", "live", "offloaded")

    def __init__(self, wid: int, cache: PrefixCache, host: HostTier | None) -> None:
        self.wid = wid
        self.cache = cache
        self.host = host
        self.queue: list[tuple[float, int, Request]] = []
        self.dec: list[tuple[float, int, Request]] = []
        self.pf: deque[Request] = deque()
        self.pf_total = self.pf_done = 0.0
        self.dec_clock = 0.0
        self.ctx = 0.0
        self.tau = 1.0
        self.pf_rate = 0.0
        self.t = 0.0
        self.version = 0
        self.busy = 0.0
        self.running = 0  # admitted and not finished (loading, prefill or decode)
        self.link_free = 0.0
        self.net_free = 0.0  # when its NIC is free (KV moves between workers)
        self.live = 0  # live sessions placed here
        self.offloaded: set[str] = set()  # sessions with a host copy beyond their GPU prefix


def unloaded_time_s(task, cost: CostModel) -> float:
    """A task's completion time alone on a worker with a perfect prefix cache."""
    total = 0.0
    for st in task.steps:
        reuse = st.reused_tokens if st.reused_tokens else min(task.shared_prefix_tokens,
                                                              st.prompt_tokens)
        total += cost.prefill_s(st.prompt_tokens - reuse, reuse) + cost.overhead_s
        total += cost.decode_s(st.output_tokens, st.prompt_tokens)
        total += st.gap_s
    total -= task.steps[-1].gap_s if task.steps else 0.0
    return total


class Simulator:
    def __init__(self, cost: CostModel, policy: SimPolicy, instances: Sequence[TaskInstance],
                 config: SimConfig = SimConfig(),
                 progress: Callable[[int], None] | None = None) -> None:
        self.cost = cost
        self.policy = policy
        self.cfg = config
        self.instances = list(instances)
        self.progress = progress
        self.now = 0.0
        policy.bind(lambda: self.now, config.seed)
        bt = cost.block_tokens
        cap = 10**12 if policy.unbounded else cost.kv_capacity_tokens // bt
        if cap <= 0:
            raise ValueError("the KV pool is empty: the model does not fit this GPU")
        host_cap = int(cap * config.host_tier_factor)
        clock = lambda: self.now  # noqa: E731
        self.workers = [
            _Worker(i, PrefixCache(cap, bt, clock, policy.max_pin_fraction),
                    HostTier(host_cap) if policy.host_tier else None)
            for i in range(config.workers)
        ]
        self.capacity_blocks = cap
        self.sessions: dict[str, Session] = {}
        self._live_sessions: dict[str, Session] = {}
        self._names = [f"w{i}" for i in range(config.workers)]  # replica ids for the router
        self._wid = {n: i for i, n in enumerate(self._names)}
        self._events: list = []
        self._seq = 0
        self._pending = deque(i for i in self.instances)
        self._live = 0
        self._done = 0
        self.result = SimResult(policy=policy.name, unbounded=policy.unbounded)
        max_need = max((st.prompt_tokens + st.output_tokens for inst in self.instances
                        for st in inst.task.steps), default=0)
        if not policy.unbounded and -(-max_need // bt) > cap:
            raise ValueError(f"a step needs {max_need} KV tokens, the pool holds {cap * bt}")

    # --- event queue ---------------------------------------------------
    def _push(self, t: float, kind: int, a=None, b=None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, a, b))

    def run(self) -> SimResult:
        if self.cfg.concurrency is not None:
            for _ in range(min(self.cfg.concurrency, len(self._pending))):
                self._push(0.0, _TASK_START, self._pending.popleft())
        else:
            for inst in self._pending:
                self._push(inst.arrival_s or 0.0, _TASK_START, inst)
            self._pending.clear()
        self._push(0.0, _SAMPLE)
        if self.policy.steals and len(self.workers) > 1:
            self._push(self.cfg.steal_period_s, _STEAL)
        ev = self._events
        pop = heapq.heappop
        while ev:
            t, _, kind, a, b = pop(ev)
            self.now = t
            if kind == _WORKER:
                if a.version == b:
                    self._touch(a)
            elif kind == _TOOL_END:
                self._tool_end(a)
            elif kind == _LOADED:
                self._advance(a)
                self._start_prefill(a, b)
                self._settle(a)
            elif kind == _PIN_EXPIRE:
                self._pin_expire(a)
            elif kind == _PREFETCH:
                self._prefetch(a, b)
            elif kind == _TASK_START:
                self._start_task(a)
            elif kind == _SAMPLE:
                self._sample()
            elif kind == _STEAL:
                self._steal_tick()
            elif kind == _MOVED:
                self._moved(a, b)
        return self._finish_result()

    # --- sessions ------------------------------------------------------
    def _start_task(self, inst: TaskInstance) -> None:
        base = inst.task.shared_prefix_tokens if self.policy.caches else 0
        s = Session(inst, self.now, base)
        s.unloaded_s = unloaded_time_s(inst.task, self.cost)
        if inst.deadline_factor is not None:
            s.deadline_s = inst.deadline_factor * s.unloaded_s
        self.sessions[s.session_id] = s
        self._live_sessions[s.session_id] = s
        target = self.policy.place(s, self.views(), self.now) if self.policy.steals else None
        if target is not None:
            w = self.workers[self._wid[target]]
        else:
            w = min(self.workers, key=lambda w: (w.live, -w.cache.free_blocks, w.wid))
        w.live += 1
        s.worker = w.wid
        self._live += 1
        self.policy.on_session_start(s, self.now)
        self._arrive(s)

    def _arrive(self, s: Session) -> None:
        """The session's next step reaches its worker."""
        s.state = "queued"
        s.next_use = self.now
        self.policy.on_llm_start(s, self.now)
        if s.in_transit:  # its KV is on the way to its new worker: wait for it there
            s.held = _ARRIVE
            return
        self._enqueue(s)

    def _enqueue(self, s: Session) -> None:
        now = self.now
        st = s.task.steps[s.step]
        w = self.workers[s.worker]
        w.cache.set_key(s.session_id, self.policy.key(s, now),
                        PROTECTED if self.policy.protect_queued else SOFT)
        reuse = st.reused_tokens if s.step > 0 else min(s.task.shared_prefix_tokens, st.prompt_tokens)
        r = Request(s, st.prompt_tokens, st.output_tokens, reuse, self._next_seq(), now)
        heapq.heappush(w.queue, (self.policy.queue_priority(s, now), r.seq, r))
        self._touch(w)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # --- routing: views, steals, KV moves ---------------------------------------
    def views(self) -> list[ReplicaView]:
        """What each worker would report to the router now (see the module doc)."""
        names, workers = self._names, self.workers
        held: list[list[str]] = [[] for _ in workers]
        in_tool: list[list[str]] = [[] for _ in workers]
        for sid, s in self._live_sessions.items():
            if s.in_transit:
                continue
            w = workers[s.worker]
            if w.cache.holds(sid) or (w.host is not None and w.host.end(sid) > 0):
                held[w.wid].append(sid)
                if s.state == "tool":
                    in_tool[w.wid].append(sid)
        cap = self.capacity_blocks
        return [ReplicaView(names[w.wid], queue_len=len(w.queue) + w.running,
                            kv_usage=min(w.cache.useful_blocks / cap, 1.0),
                            sessions=frozenset(held[w.wid]), in_tool=frozenset(in_tool[w.wid]))
                for w in workers]

    def _steal_tick(self) -> None:
        if self._done >= len(self.instances):
            return
        steal = self.policy.plan_steal(self.views(), self.now)
        if steal is not None:
            self._apply_steal(steal)
        self._push(self.now + self.cfg.steal_period_s, _STEAL)

    def _apply_steal(self, steal: Steal) -> None:
        s = self._live_sessions.get(steal.session_id)
        dst = self._wid.get(steal.target)
        if s is None or dst is None:
            return
        if dst == s.worker:
            s.move_to = -1
            return
        s.move_to = dst
        s.move_in_tool = steal.in_tool
        if not s.in_transit and s.state in ("tool", "queued"):
            self._start_move(s)
        # running: moves when its request finishes; in transit: when the KV lands

    def _start_move(self, s: Session) -> None:
        """Send the session's resident KV to `s.move_to` and free it here."""
        src, dst = self.workers[s.worker], self.workers[s.move_to]
        s.move_to = -1
        sid = s.session_id
        queued = None
        if s.state == "queued":  # its request leaves this queue and waits for the KV there
            q = src.queue
            i = next(i for i, item in enumerate(q) if item[2].sess is s)
            queued = q[i]
            q[i] = q[-1]
            q.pop()
            heapq.heapify(q)
        blocks = 0
        if self.policy.caches:
            blocks = max(src.cache.cached(sid), src.host.end(sid) if src.host is not None else 0)
        tier, pin_until = src.cache.tier(sid), src.cache.pin_expires_at(sid)
        src.cache.drop(sid)
        if src.host is not None:
            src.host.drop(sid)
        src.offloaded.discard(sid)
        src.live -= 1
        dst.live += 1
        s.worker = dst.wid
        tokens = blocks * self.cost.block_tokens
        dur = self.cost.net_transfer_s(tokens)
        start = max(self.now, src.net_free, dst.net_free, s.prefetch_ready_at)
        end = start + dur
        if tokens:
            src.net_free = dst.net_free = end
        s.prefetch_ready_at = 0.0
        s.in_transit = True
        s.held = queued
        res = self.result
        res.steals += 1
        res.steals_in_tool += s.move_in_tool
        res.move_s += dur
        res.steal_log.append((self.now, sid, src.wid, dst.wid, s.move_in_tool, tokens))
        self._push(end, _MOVED, s, (blocks, tier, pin_until))
        if queued is not None:
            self._touch(src)  # the queue head may have changed

    def _moved(self, s: Session, what: tuple[int, int | None]) -> None:
        """The KV of a moved session lands on its new worker."""
        blocks, tier, pin_until = what
        w = self.workers[s.worker]
        cache, pol, bt = w.cache, self.policy, self.cost.block_tokens
        s.in_transit = False
        sid = s.session_id
        if blocks > 0:
            have = cache.cached(sid)
            need = blocks - have
            if need > 0 and cache.free_blocks < need:
                evs = cache.make_room(need, SOFT)  # idle unpinned prefixes only
                if evs:
                    self._evicted(w, evs)
            put = max(min(need, cache.free_blocks), 0)
            if put:
                cache.grow(sid, put, pol.key(s, self.now))
            self.result.moved_tokens += put * bt
            self.result.move_dropped_tokens += (blocks - have - put) * bt
            if s.state == "queued":
                cache.set_key(sid, pol.key(s, self.now), PROTECTED if pol.protect_queued else SOFT)
            elif tier == PINNED and s.state == "tool" and pin_until > self.now:
                self._pin(w, s, pin_until - self.now)  # the rest of its TTL
        held, s.held = s.held, None
        if held is _ARRIVE:
            self._enqueue(s)
        elif held is not None:
            heapq.heappush(w.queue, held)
            self._touch(w)
        if s.move_to >= 0 and s.state in ("tool", "queued"):
            self._start_move(s)

    def _tool_end(self, s: Session) -> None:
        if s.tool_names:
            self.policy.on_tool_end(s, self.now)
        s.step += 1
        self._arrive(s)

    def _pin(self, w: _Worker, s: Session, ttl_s: float) -> None:
        if w.cache.pin(s.session_id, self.policy.key(s, self.now), ttl_s):
            self._push(self.now + ttl_s, _PIN_EXPIRE, w)

    def _pin_expire(self, w: _Worker) -> None:
        """Pins past their TTL are soft from now on, keyed by their session's state."""
        for sid in w.cache.expire_pins():
            w.cache.set_key(sid, self.policy.key(self.sessions[sid], self.now))

    # --- worker --------------------------------------------------------
    def _touch(self, w: _Worker) -> None:
        """Advance the worker's fluid batch to now, retire what finished, admit what
        fits, and schedule its next event."""
        self._advance(w)
        self._settle(w)

    def _advance(self, w: _Worker) -> None:
        now = self.now
        dt = now - w.t
        if dt > 0.0 and (w.dec or w.pf):
            iters = dt / w.tau
            w.busy += dt
            w.dec_clock += iters
            if w.pf:
                w.pf_done = min(w.pf_total, w.pf_done + iters * w.pf_rate)
        w.t = now

    def _settle(self, w: _Worker) -> None:
        pf, dec = w.pf, w.dec
        finished = []
        while pf and pf[0].pf_end <= w.pf_done + _EPS:
            r = pf.popleft()
            if r.output <= 1:
                finished.append(r)
            else:
                heapq.heappush(dec, (w.dec_clock + r.output - 1, r.seq, r))
                w.ctx += r.ctx_weight
        if not pf:
            w.pf_done = w.pf_total  # absorb rounding
        while dec and dec[0][0] <= w.dec_clock + _EPS:
            r = heapq.heappop(dec)[2]
            w.ctx -= r.ctx_weight
            finished.append(r)
        for r in finished:
            self._finish_request(w, r)
        if w.queue:
            self._admit(w)
        self._reschedule(w)

    def _reschedule(self, w: _Worker) -> None:
        n = len(w.dec)
        cost = self.cost
        if w.pf:
            rate = max(cost.token_budget - n, cost.block_tokens)
            chunk = min(rate, w.pf_total - w.pf_done)
        else:
            rate = chunk = 0.0
        if not w.dec and not w.pf:
            w.version += 1
            return
        tau = cost.step_s(n, chunk, w.ctx)
        w.tau, w.pf_rate = tau, rate
        dt = math.inf
        if w.dec:
            dt = (w.dec[0][0] - w.dec_clock) * tau
        if w.pf:
            dt = min(dt, (w.pf[0].pf_end - w.pf_done) / rate * tau)
        w.version += 1
        self._push(self.now + max(dt, 0.0), _WORKER, w, w.version)

    def _admit(self, w: _Worker) -> None:
        cache, host, cost, pol = w.cache, w.host, self.cost, self.policy
        bt = cost.block_tokens
        res = self.result
        now = self.now
        while w.queue and w.running < cost.max_num_seqs:
            r = w.queue[0][2]
            s = r.sess
            sid = s.session_id
            own_reuse = max(r.reuse - s.base, 0)
            total = -(-(r.prompt + r.output - s.base) // bt)
            if pol.caches:
                hit_b = min(cache.cached(sid), own_reuse // bt)
                load_b = 0
                if host is not None:
                    load_b = max(min(host.end(sid), own_reuse // bt) - hit_b, 0)
            else:
                hit_b = load_b = 0
            if not cache.can_admit(sid, hit_b, total):
                break
            heapq.heappop(w.queue)
            evs = cache.admit(sid, hit_b, total)
            if evs:
                self._evicted(w, evs)
            w.offloaded.discard(sid)
            s.state = "running"
            w.running += 1
            hit = min(s.base + hit_b * bt, r.prompt) if (pol.caches and r.reuse) else 0
            loaded = load_b * bt
            # Only full blocks are ever cached: the reused prefix's partial last block
            # is new work for every policy, not regeneration.
            cacheable = min(s.base, r.reuse) + own_reuse // bt * bt if pol.caches else r.reuse // bt * bt
            recomputed = max(cacheable - hit - loaded, 0)
            new = max(r.prompt - hit - loaded, 0)
            r.work = cost.prefill_work(new, hit + loaded)
            res.llm_calls += 1
            res.prompt_tokens += r.prompt
            res.reusable_tokens += r.reuse
            res.hit_tokens += hit
            res.loaded_tokens += loaded
            res.recomputed_tokens += recomputed
            res.prefilled_tokens += new
            if recomputed and new:
                res.regen_gpu_s += (r.work * recomputed / new) * 2.0 * cost.model.params / (
                    cost.tp * cost.gpu.peak_flops * cost.mfu)
            ready = s.prefetch_ready_at
            if loaded:
                w.link_free = max(now, w.link_free) + cost.transfer_s(loaded)
                ready = max(ready, w.link_free)
            if ready > now:
                self._push(ready, _LOADED, w, r)
            else:
                self._start_prefill(w, r)

    def _start_prefill(self, w: _Worker, r: Request) -> None:
        if not w.pf:
            w.pf_done = w.pf_total
        w.pf_total += max(r.work, _EPS)
        r.pf_end = w.pf_total
        w.pf.append(r)

    def _finish_request(self, w: _Worker, r: Request) -> None:
        now = self.now
        s = r.sess
        pol = self.policy
        w.running -= 1
        self.result.output_tokens += r.output
        if self._pending:
            self.result.saturated_tokens += r.prompt + r.output
        s.last_access = now
        s.kv_tokens = r.prompt + r.output
        pol.on_llm_end(s, r, now)
        st = s.task.steps[s.step]
        keep = (r.prompt + r.output - s.base) if pol.caches else 0
        if s.step + 1 < len(s.task.steps):
            gap = st.gap_s
            s.state = "tool"
            s.next_use = now + gap
            s.tool_names = tuple(t.name for t in st.tools)
            if st.tools:
                pol.on_tool_start(s, now)
            key = pol.key(s, now)
            w.cache.release(s.session_id, keep, key)
            cache = w.cache
            ttl = pol.pin_ttl(s, now, 1.0 - cache.free_blocks / cache.capacity_blocks) if st.tools else 0.0
            if ttl > 0.0 and keep > 0:
                self._pin(w, s, ttl)
            self._push(now + gap, _TOOL_END, s)
            if w.host is not None and w.offloaded:
                self._plan_prefetch(w)
            if s.move_to >= 0:  # stolen while running: it moves now, behind its tool
                self._start_move(s)
        else:
            s.state = "ended"
            s.move_to = -1
            pol.on_session_end(s, now)
            if keep > 0:
                w.cache.release(s.session_id, keep, pol.key(s, now))
                w.cache.mark_dead(s.session_id, pol.key(s, now))
            else:
                w.cache.release(s.session_id, 0, 0.0)
            if w.host is not None:
                w.host.drop(s.session_id)
            w.offloaded.discard(s.session_id)
            w.live -= 1
            self._end_task(s)

    def _end_task(self, s: Session) -> None:
        self._live_sessions.pop(s.session_id, None)
        self._live -= 1
        self._done += 1
        self.result.tasks.append(TaskRecord(s.session_id, s.tenant, s.task.task_id,
                                            s.started_at, self.now, s.unloaded_s, s.deadline_s))
        if self.progress is not None:
            self.progress(1)
        if self.cfg.concurrency is not None and self._pending:
            self.result.saturated_tasks += 1
            self._push(self.now, _TASK_START, self._pending.popleft())
            if not self._pending:
                self._mark_saturation_end()

    # --- host tier ----------------------------------------------------------
    def _evicted(self, w: _Worker, evs: list[Eviction]) -> None:
        host = w.host
        self.result.evicted_blocks += sum(e.from_blocks - e.to_blocks for e in evs)
        if host is None:
            return
        sessions = self.sessions
        for e in evs:
            s = sessions[e.session_id]
            if s.state == "ended" or s.worker != w.wid:
                continue
            host.offload(e.session_id, e.from_blocks)
            w.offloaded.add(e.session_id)

    def _plan_prefetch(self, w: _Worker) -> None:
        cache, host, cost = w.cache, w.host, self.cost
        bt = cost.block_tokens
        cands = []
        for sid in sorted(w.offloaded):
            s = self.sessions[sid]
            if s.state != "tool":
                continue
            missing = host.end(sid) - cache.cached(sid)
            if missing > 0:
                cands.append((sid, missing * bt, cost.transfer_s(missing * bt)))
        if not cands:
            return
        for sid, start_at in self.policy.plan_prefetch(w.wid, cands, cache.free_blocks * bt, self.now):
            self._push(max(start_at, self.now), _PREFETCH, self.sessions[sid], None)

    def _prefetch(self, s: Session, _unused) -> None:
        w = self.workers[s.worker]
        if s.state != "tool" or w.host is None:
            return
        cache = w.cache
        missing = w.host.end(s.session_id) - cache.cached(s.session_id)
        blocks = min(missing, cache.free_blocks)
        if blocks <= 0:
            return
        cache.grow(s.session_id, blocks, self.policy.key(s, self.now))
        if blocks == missing:
            w.offloaded.discard(s.session_id)
        tokens = blocks * self.cost.block_tokens
        w.link_free = max(self.now, w.link_free) + self.cost.transfer_s(tokens)
        s.prefetch_ready_at = w.link_free
        self.result.prefetched_tokens += tokens

    # --- metrics -------------------------------------------------------------
    def _mark_saturation_end(self) -> None:
        res = self.result
        res.saturated_s = self.now
        for w in self.workers:
            w.cache.flush_time()
            res.saturated_useful_block_s += w.cache.useful_block_seconds

    def _sample(self) -> None:
        cap = self.capacity_blocks * len(self.workers)
        used = sum(w.cache.useful_blocks for w in self.workers)
        self.result.timeline.append((self.now, used / cap))
        if self._done < len(self.instances):
            self._push(self.now + self.cfg.sample_every_s, _SAMPLE)

    def _finish_result(self) -> SimResult:
        res = self.result
        res.makespan_s = max((t.finished_at for t in res.tasks), default=0.0)
        for w in self.workers:
            w.cache.flush_time()
            res.busy_gpu_s += w.busy
            res.worker_busy_s.append(w.busy)
            res.useful_block_s += w.cache.useful_block_seconds
        res.capacity_block_s = self.capacity_blocks * len(self.workers) * res.makespan_s
        return res
