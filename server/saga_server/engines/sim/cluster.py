"""Discrete-event simulator of a cluster of vLLM-like workers serving agent sessions.

Model (deterministic under a seed; all times in simulated seconds):

- **Sessions** replay a task's steps closed-loop: a step's request arrives at the
  session's worker, is queued, admitted, prefilled, decoded; then the step's tools run
  (their trace durations) and the next step's request arrives.
- **Subagents**: a step that spawns (`StepSpec.spawns`) starts each child as a session
  of its own, naming its parent, when the step ends; the parent's next step comes once
  its tools' time is up and its children have all ended; its tool calls end then (a
  call that starts subagents, as Claude Code's Task, returns with their results).
  A tree is one task: the root's record spans it; children are counted apart
  (`SimResult.subagents`) and never take the closed loop's slots. A child is placed
  like any new session (the policy's router is told its parent).
- **Router**: a session is placed at start and stays there (session affinity, for
  every policy: without it no prefix cache survives). Baselines model a stock router:
  the worker with the fewest live sessions (then most free KV). Policies with `routes`
  place new sessions themselves (`SimPolicy.place`, fed the workers' views, `moves`);
  those with `steals` also, every `steal_period_s`, may move one session off the most
  loaded worker (`SimPolicy.plan_steal`; SAGA's is `saga_server.core.routing.SessionRouter`,
  the policy of the Ray Serve router); the session's KV moves with it (`moves`).
- **Admission** (vLLM's scheduler): the waiting queue in policy order; the head is
  admitted when fewer than `max_num_seqs` run and its KV (prompt + output, in blocks)
  fits after evicting idle prefixes; otherwise the queue waits (head-of-line, as vLLM).
  The hit is the session's resident prefix (and, with a host tier, the contiguous
  offloaded range, loaded over the host link before prefill, the disk tier's part
  after the host tier's). The run's shared prefix
  (system prompt, tool schema) is held by every running request of the run, so it is
  modelled as always resident and not charged to the pool.
- **Session admission** (policies with one, `admission`): requests of sessions the
  worker's controller has not admitted wait at its gate, outside the queue.
- **What happens to KV and who waits for a deadline**: each worker's
  `saga_server.core.engine_policy.EnginePolicy` (the object the vLLM plugin runs) with
  the policy's rules; the simulator reports the engine's facts to it (a request
  arrives, joins the queue, is scheduled, finishes; the agent's tool hints) and
  applies what it returns.
- **Continuous batching as a fluid** (`worker`), and the host tier (`host`).

`run()` returns a `SimResult` of raw counters; `saga_server.bench.metrics` turns them
into the reported metrics.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Sequence

from saga_server.core.engine_policy import EnginePolicy, LiveRequest
from saga_server.core.sessions import Departure

from .admission import AdmissionGate

from .cache import PrefixCache
from .events import LOADED, MOVED, PIN_EXPIRE, PREFETCH, SAMPLE, STEAL, TASK_START, TOOL_END, WORKER
from .hardware import CostModel
from .host import HostOffload, HostTier
from .moves import KvMoves
from .policy import SimPolicy
from .results import SimConfig, SimResult, TaskRecord, turn_deadline_s, unloaded_call_s, unloaded_time_s
from .session import ARRIVE, ENDED, QUEUED, RUNNING, TOOL, Request, Session, request_key
from .tasks import TaskInstance
from .worker import Worker

__all__ = ["SimConfig", "Simulator", "SimResult", "TaskRecord", "unloaded_time_s"]


class Simulator:
    def __init__(self, cost: CostModel, policy: SimPolicy, instances: Sequence[TaskInstance],
                 config: SimConfig = SimConfig(),
                 progress: Callable[[int], None] | None = None) -> None:
        self.cost = cost
        self.policy = policy
        # Its parts, each one side of the same event loop over the same workers.
        self.gate = AdmissionGate(self)  # requests waiting for their session's admission
        self.tiers = HostOffload(self)  # what leaves a pool for the host tier, and comes back
        self.moves = KvMoves(self)  # the router's view, and sessions stolen with their KV
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
        host_tokens = host_cap * bt if policy.host_tier else 0
        self.workers = [Worker(i, PrefixCache(cap, bt, clock, policy.max_pin_fraction),
                               HostTier(host_cap, int(cap * config.disk_tier_factor)) if policy.host_tier else None)
                        for i in range(config.workers)]
        self.sessions: dict[str, Session] = {}
        rules = policy.kv_rules(self.sessions.__getitem__, clock)
        for w in self.workers:
            w.engine = EnginePolicy(
                w.cache.ledger, rules, block_tokens=bt, core=policy.core, mechanisms=policy.mechanisms,
                admission=lambda parkable: policy.admission(cap * bt, host_tokens, cost, parkable),
                shaper=policy.shaper(cost), protect_queued=policy.protect_queued,
                release_garbage=policy.releases_garbage)
            w.engine.on_forget(lambda sid, how, w=w: self._forgotten(w, sid, how))
        self.capacity_blocks = cap
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
            n = min(self.cfg.concurrency, len(self._pending))
            for i in range(n):
                self._push(self.cfg.ramp_s * i / n, TASK_START, self._pending.popleft())
        else:
            for inst in self._pending:
                self._push(inst.arrival_s or 0.0, TASK_START, inst)
            self._pending.clear()
        self._push(0.0, SAMPLE)
        if self.policy.steals and len(self.workers) > 1:
            self._push(self.cfg.steal_period_s, STEAL)
        ev = self._events
        pop = heapq.heappop
        while ev:
            t, _, kind, a, b = pop(ev)
            self.now = t
            self._handle(kind, a, b)
        return self._finish_result()

    def _handle(self, kind: int, a, b) -> None:
        """One event, at `now`."""
        if kind == WORKER:
            if a.version == b:
                self._touch(a)
        elif kind == TOOL_END:
            self._tool_end(a)
        elif kind == LOADED:
            a.advance(self.now)
            self._start_prefill(a, b)
            self._settle(a)
        elif kind == PIN_EXPIRE:
            self._pin_expire(a)
        elif kind == PREFETCH:
            self.tiers.prefetch(a, b)
        elif kind == TASK_START:
            self._start_task(a)
        elif kind == SAMPLE:
            self._sample()
        elif kind == STEAL:
            self.moves.steal_tick()
        elif kind == MOVED:
            self.moves.moved(a, b)

    # --- sessions ------------------------------------------------------
    def _start_task(self, inst: TaskInstance) -> None:
        if inst.parent_id:
            self.result.subagents += 1
        base = inst.task.shared_prefix_tokens if self.policy.caches else 0
        s = Session(inst, self.now, base)
        s.unloaded_s = unloaded_time_s(inst.task, self.cost)
        if inst.deadline_factor is not None:
            s.deadline_s = inst.deadline_factor * s.unloaded_s
        s.turn_deadline_s = turn_deadline_s(inst.task, inst.turn_deadline_factor, self.cost)
        self.sessions[s.session_id] = s
        self._live_sessions[s.session_id] = s
        target = self.policy.place(s, self.moves.views(), self.now) if self.policy.routes else None
        if target is not None:
            w = self.workers[self._wid[target]]
        else:
            w = min(self.workers, key=lambda w: (w.live, -w.cache.free_blocks, w.wid))
        w.live += 1
        s.worker = w.wid
        self._live += 1
        self.policy.on_session_start(s, self.now)
        if s.parent_id:
            self._follow_parent(s)
        self._arrive(s)

    def _follow_parent(self, child: Session) -> None:
        """A subagent started or stopped: every worker applies what the core published
        of it (`SessionKvPolicy.follow_core`; the one holding the parent's KV decides
        its pin again, the others only drain what they were told)."""
        for w in self.workers:
            for hold in w.engine.follow_core(self.now):
                self._pin_expiry(w, hold)

    def _arrive(self, s: Session) -> None:
        """The session's next step reaches its worker."""
        s.state = QUEUED
        s.next_use = self.now
        self.policy.on_llm_start(s, self.now)
        self.workers[s.worker].engine.arrived(LiveRequest(request_key(s), s.session_id, s.tenant,
                                                          s.task.steps[s.step].prompt_tokens, self.now))
        if s.in_transit:  # its KV is on the way to its new worker: wait for it there
            s.awaiting_kv = ARRIVE
            return
        self._enqueue(s)

    def _enqueue(self, s: Session, gate: bool = True) -> None:
        """The step's request joins its worker's queue; through the admission gate
        first unless `gate` is False (admitted there already)."""
        now = self.now
        st = s.task.steps[s.step]
        w = self.workers[s.worker]
        reuse = st.reused_tokens if s.step > 0 else min(s.task.shared_prefix_tokens, st.prompt_tokens)
        if gate and not self.gate.admitted(w, s, st.prompt_tokens + st.output_tokens - s.base, max(reuse - s.base, 0)):
            return
        r = Request(s, st.prompt_tokens, st.output_tokens, reuse, self._next_seq(), s.next_use, request_key(s))
        r.queued_at = now
        heapq.heappush(w.queue, (self.policy.queue_priority(s, now), r.seq, r))
        w.engine.admitted(r.key)  # admitted at the gate after a wait, or past it by the caller
        self.tiers.requested(w, s)
        self._touch(w)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _tool_end(self, s: Session) -> None:
        if s.children_left:  # its tools' time is up, but it waits on its subagents: a call
            s.tool_done = True  # that starts one (Claude Code's Task) ends when they return
            return
        s.tool_done = False
        if s.tool_names or s.task.steps[s.step].human:
            self.policy.on_tool_end(s, self.now)
            self.workers[s.worker].engine.tool_ended(s.session_id, self.now)
        if s.task.steps[s.step].human:  # the person answered: a user turn starts
            s.turn_started_at = self.now
        s.step += 1
        self._arrive(s)

    def _spawn(self, s: Session, children) -> None:
        """`s`'s step ended and starts these subagents now."""
        s.children_left = len(children)
        for i, task in enumerate(children):
            self._push(self.now, TASK_START, TaskInstance(f"{s.session_id}:sub{s.step}.{i}", task, s.tenant,
                                                          parent_id=s.session_id))

    def _child_ended(self, child: Session) -> None:
        self._follow_parent(child)
        parent = self.sessions.get(child.parent_id)
        if parent is None or parent.children_left <= 0:
            return
        parent.children_left -= 1
        if not parent.children_left:
            parent.back_from_children = True
            if parent.tool_done:  # its tools ended first: it was waiting on this child
                self._tool_end(parent)

    def _forgotten(self, w: Worker, sid: str, how: str) -> None:
        """The worker's policy forgot a session: its host-tier copy goes (unless its
        KV moved on, which `moves` carries), and a request of it still waiting at the
        gate (the core let it go while it waited) is no longer held back."""
        if how == Departure.MOVED:
            return
        if w.host is not None:
            w.host.drop(sid)
        w.offloaded.discard(sid)
        s = w.gated.pop(sid, None)
        if s is not None and s.state != ENDED:
            self._enqueue(s, gate=False)

    def _pin_expiry(self, w: Worker, hold) -> None:
        """A pinned hold gets an event at its TTL's end."""
        if hold is not None and hold.pinned:
            self._push(hold.expires_at, PIN_EXPIRE, w)

    def _pin_expire(self, w: Worker) -> None:
        w.engine.expire_pins(self.now)

    # --- worker --------------------------------------------------------
    def _touch(self, w: Worker) -> None:
        """Advance the worker's fluid batch to now, retire what finished, admit what
        fits, and schedule its next event."""
        w.advance(self.now)
        self._settle(w)

    def _settle(self, w: Worker) -> None:
        for r in w.take_finished():
            self._finish_request(w, r)
        if w.queue:
            self._admit(w)
        if w.engine.shaper is not None:
            w.prefill_cap = w.engine.prefill_budget(w.prefilling[0].key if w.prefilling else None,
                                               self.cost.step_s(len(w.decoding), 0, w.context))
        dt = w.replan(self.cost)
        if dt is not None:
            self._push(self.now + dt, WORKER, w, w.version)

    def _admit(self, w: Worker) -> None:
        cache, host, cost, pol = w.cache, w.host, self.cost, self.policy
        bt = cost.block_tokens
        res = self.result
        now = self.now
        held_back = []  # requests the deadline shaper holds back: they keep their place
        while w.queue and w.running < cost.max_num_seqs:
            r = w.queue[0][2]
            s = r.sess
            sid = s.session_id
            if w.engine.holds_back(r.key):
                held_back.append(heapq.heappop(w.queue))
                continue
            own_reuse = max(r.reuse - s.base, 0)
            total = -(-(r.prompt + r.output - s.base) // bt)
            disk_b = 0
            if pol.caches:
                hit_b = min(cache.cached(sid), own_reuse // bt)
                load_b = 0
                if host is not None:
                    load_b = max(min(host.end(sid), own_reuse // bt) - hit_b, 0)
                    disk_b = max(min(host.disk_end(sid), own_reuse // bt) - hit_b - load_b, 0)
            else:
                hit_b = load_b = 0
            if not cache.can_admit(sid, hit_b, total):
                break
            heapq.heappop(w.queue)
            evs = cache.admit(sid, hit_b, total)
            if evs:
                self.tiers.evicted(w, evs)
            held = own_reuse // bt * bt
            w.offloaded.discard(sid)
            back = s.back_from_children
            s.back_from_children = False
            s.state = RUNNING
            w.running += 1
            r.scheduled_at = now
            hit = min(s.base + hit_b * bt, r.prompt) if (pol.caches and r.reuse) else 0
            loaded = (load_b + disk_b) * bt
            # Only full blocks are ever cached: the reused prefix's partial last block
            # is new work for every policy, not regeneration.
            cacheable = min(s.base, r.reuse) + own_reuse // bt * bt if pol.caches else r.reuse // bt * bt
            recomputed = max(cacheable - hit - loaded, 0)
            new = max(r.prompt - hit - loaded, 0)
            r.work = cost.prefill_work(new, hit + loaded)
            r.own_prefill_s = cost.prefill_s(new, hit + loaded) + cost.overhead_s
            res.llm_calls += 1
            res.prompt_tokens += r.prompt
            step = s.task.steps[s.step]
            if step.cached_tokens is not None:
                res.provider_cached_tokens += step.cached_tokens
                res.provider_known_prompt_tokens += r.prompt
            res.compactions += step.compaction
            res.reusable_tokens += r.reuse
            res.hit_tokens += hit
            res.loaded_tokens += loaded
            res.disk_loaded_tokens += disk_b * bt
            res.recomputed_tokens += recomputed
            if back:
                res.after_children_reusable_tokens += r.reuse
                res.after_children_recomputed_tokens += recomputed
            w.engine.scheduled(r.key, held, held - recomputed, new, now)
            self.tiers.loaded(w, s)
            res.prefilled_tokens += new
            if recomputed and new:
                res.regen_gpu_s += (r.work * recomputed / new) * 2.0 * cost.model.params / (
                    cost.tp * cost.gpu.peak_flops * cost.mfu)
            ready = s.prefetch_ready_at
            if loaded:
                w.link_free = max(now, w.link_free) + cost.transfer_s(loaded) + cost.disk_s(disk_b * bt)
                ready = max(ready, w.link_free)
            if ready > now:
                self._push(ready, LOADED, w, r)
            else:
                self._start_prefill(w, r)
        for item in held_back:
            heapq.heappush(w.queue, item)

    def _start_prefill(self, w: Worker, r: Request) -> None:
        """An at-risk request's prefill goes ahead of all but earlier at-risk ones."""
        r.prefill_at = self.now
        engine = w.engine
        if not engine.urgent(r.key):
            w.start_prefill(r)
            return
        ahead = 0
        for queued in w.prefilling:
            if not engine.urgent(queued.key):
                break
            ahead += 1
        w.start_prefill(r, ahead_of=ahead + 1)

    def _finish_request(self, w: Worker, r: Request) -> None:
        now = self.now
        s = r.sess
        pol = self.policy
        w.running -= 1
        res = self.result
        res.output_tokens += r.output
        res.queue_s += r.scheduled_at - r.arrived_at
        res.prefill_s += r.first_token_at - r.scheduled_at
        res.decode_s += now - r.first_token_at
        self._split(w, r, now)
        if self._pending:
            self.result.saturated_tokens += r.prompt + r.output
        s.last_access = now
        s.kv_tokens = r.prompt + r.output
        pol.on_llm_end(s, r, now)
        w.engine.served(s.tenant, r.prompt + r.output, s.session_id)
        st = s.task.steps[s.step]
        sid = s.session_id
        keep = (r.prompt + r.output - s.base) if pol.caches else 0
        last = s.step + 1 == len(s.task.steps)
        if last or st.human:  # the agent hands the turn back (or ends): the turn is done
            s.turn_spans.append(now - s.turn_started_at)
        s.state = ENDED if last else TOOL
        s.next_use = now + (0.0 if last else st.gap_s)
        s.tool_names = () if last else tuple(t.name for t in st.tools)
        # The engine's facts, then the agent's hints, in the order the plugin sees them.
        cache, engine = w.cache, w.engine
        self._pin_expiry(w, engine.finished(r.key, cache.request_blocks(sid, keep), now, r.output))
        cache.unreserve(sid)
        if not last:
            if st.tools or st.human:  # a person's turn is a wait the hints name too
                res.human_waits += st.human
                pol.on_tool_start(s, now)
                self._pin_expiry(w, engine.tool_started(sid, now))
            if st.spawns:
                self._spawn(s, st.spawns)
            self._push(now + st.gap_s, TOOL_END, s)
            if engine.admission is not None:
                self.gate.rebalance(w)
            if w.host is not None and w.offloaded:
                self.tiers.plan_prefetch(w)
            if s.move_to >= 0:  # stolen while running: it moves now, behind its tool
                self.moves.start_move(s)
        else:
            s.move_to = -1
            pol.on_session_end(s, now)
            cache.flush_time()
            engine.session_ended(sid)
            w.live -= 1
            self.gate.leave(w, s)
            self._end_task(s)

    def _split(self, w: Worker, r: Request, now: float) -> None:
        """Add the finished request's time to its session's split (`results.SPLIT`)."""
        cost, s = self.cost, r.sess
        st = s.task.steps[s.step]
        alone_prefill, alone_decode = unloaded_call_s(s.task, st, cost)
        split = s.split  # in `SPLIT`'s order
        split[0] += alone_prefill + alone_decode
        if s.step + 1 < len(s.task.steps):
            split[1] += st.gap_s
        split[2] += r.queued_at - r.arrived_at
        split[3] += r.scheduled_at - r.queued_at
        split[4] += r.prefill_at - r.scheduled_at
        split[5] += max(r.own_prefill_s - alone_prefill, 0.0)
        split[6] += r.first_token_at - r.prefill_at - max(r.own_prefill_s, alone_prefill)
        by_prefill = w.prefill_lag - r.prefill_lag_at
        split[7] += by_prefill
        split[8] += now - r.first_token_at - alone_decode - by_prefill

    def _end_task(self, s: Session) -> None:
        self._live_sessions.pop(s.session_id, None)
        self._live -= 1
        if s.parent_id:  # a subagent: part of its root's task
            self._child_ended(s)
            return
        self._done += 1
        self.result.tasks.append(TaskRecord(s.session_id, s.tenant, s.task.task_id, s.started_at, self.now,
                                            s.unloaded_s, s.deadline_s, tuple(s.turn_spans), s.turn_deadline_s,
                                            tuple(s.split)))
        if self.progress is not None:
            self.progress(1)
        if self.cfg.concurrency is not None and self._pending:
            self.result.saturated_tasks += 1
            self._push(self.now, TASK_START, self._pending.popleft())
            if not self._pending:
                self._mark_saturation_end()

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
        if self._pending:  # saturated: KV of running requests over the (finite) pool
            pool = self.cost.kv_capacity_tokens // self.cost.block_tokens * len(self.workers)
            self.result.running_kv_samples.append(sum(w.cache.active_blocks for w in self.workers) / pool)
        if self._done < len(self.instances):
            self._push(self.now + self.cfg.sample_every_s, SAMPLE)

    def _finish_result(self) -> SimResult:
        res = self.result
        res.makespan_s = max((t.finished_at for t in res.tasks), default=0.0)
        for w in self.workers:
            w.cache.flush_time()
            res.busy_gpu_s += w.busy
            res.iterations += w.iterations
            res.worker_busy_s.append(w.busy)
            res.useful_block_s += w.cache.useful_block_seconds
        res.capacity_block_s = self.capacity_blocks * len(self.workers) * res.makespan_s
        return res
