"""SagaScheduler against vLLM's real Scheduler / KVCacheManager / BlockPool.

Each test drives the real scheduling loop with synthetic model outputs and looks
at what vLLM itself reports (`num_computed_tokens` of a new request = its prefix
hit), comparing with the stock `Scheduler` where the claim is "SAGA differs".
"""

from __future__ import annotations

import itertools

import pytest
from vllm.v1.core.sched.scheduler import Scheduler

from saga_server.core import (
    CoreConfig,
    FairShareConfig,
    ManualClock,
    PinDecision,
    PrefetchCandidate,
    SessionEnd,
    SessionPhase,
    SessionStart,
    TenantLimits,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core.pinning import PinConfig
from saga_server.engines.vllm import SagaAsyncScheduler, SagaScheduler
from vllm_builders import Requests, hit_tokens, make_scheduler, run_until_idle, runner_output, step

BS = 16


def saga(model, clock=None, core=None, cls=SagaScheduler, **kw):
    clock = clock or ManualClock(100.0)
    core = core or WorkflowCore(CoreConfig(pin=PinConfig(min_tokens=2 * BS)), clock=clock)
    return make_scheduler(cls, model, core=core, clock=clock, start_hints=False, **kw)


def tokens(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


def flood(s, R, n: int, length: int = 64, base: int = 5000, sessions: bool = True) -> None:
    for i in range(n):
        s.add_request(R.make(tokens(base + i * 211, length), session_id=f"flood-{base}-{i}" if sessions else None))
        run_until_idle(s)


def pool_is_consistent(s) -> None:
    """Every block is either in the free queue with ref 0, or out of it with ref > 0."""
    pool = s.kv_cache_manager.block_pool
    free = {b.block_id for b in pool.free_block_queue.get_all_free_blocks()}
    for b in pool.blocks[1:]:
        assert (b.block_id in free) == (b.ref_cnt == 0), b
    assert pool.get_num_free_blocks() == len(free)


@pytest.mark.parametrize("cls", [SagaScheduler, SagaAsyncScheduler])  # CPU builds / GPU async scheduling
def test_paused_session_keeps_its_prefix_through_a_flood_stock_loses_it(tiny_model, cls):
    hist = tokens(100, 96)  # 6 blocks
    results = {}
    for name in ("stock", "saga"):
        if name == "stock":
            s = make_scheduler(Scheduler, tiny_model, num_blocks=24, block_size=BS)
        else:
            s = saga(tiny_model, num_blocks=24, block_size=BS, cls=cls)
            s.saga.core.accept(SessionStart("A", s.saga.clock(), tenant="t"))
        R = Requests(BS)
        s.add_request(R.make(hist, session_id="A"))
        run_until_idle(s)
        if name == "saga":
            s.saga.core.accept(ToolCallStart("A", s.saga.clock(), "pytest", call_id="c1", category="test"))
            assert s.saga.ledger.get("A").pinned
        flood(s, R, 30, sessions=False)  # anonymous traffic: LRU would evict A first
        nxt = R.make(hist + [7] + tokens(900, 20), session_id="A")
        s.add_request(nxt)
        results[name] = hit_tokens(run_until_idle(s), nxt.request_id)
        pool_is_consistent(s)
        if name == "saga":
            assert s.saga.counters["pins", "used"] == 1  # released because A came back
    assert results["stock"] == 0
    assert results["saga"] == 96  # the whole history (6 full blocks)


def test_next_request_releases_the_hold_and_nothing_leaks(tiny_model):
    s = saga(tiny_model, num_blocks=32, block_size=BS)
    R = Requests(BS)
    hist = tokens(100, 64)
    s.add_request(R.make(hist, session_id="A"))
    run_until_idle(s)
    assert "A" in s.saga.ledger and s.saga.ledger.held_blocks == 4
    s.add_request(R.make(hist + [7] + tokens(500, 40), session_id="A"))
    run_until_idle(s)
    # the old hold was released on scheduling; the new request's blocks are held now
    assert s.saga.ledger.get("A").blocks and s.saga.counters["released", "arrival"] >= 1
    s.saga.ledger.release_all("test")
    pool_is_consistent(s)
    assert s.reset_prefix_cache()  # no stray reference anywhere


def test_pins_never_block_forward_progress(tiny_model):
    """Pins fill most of the pool; a request needing nearly all of it still runs
    (pins are reclaimed), exactly as stock vLLM would run it."""
    s = saga(tiny_model, num_blocks=24, block_size=BS, max_batched=4096)
    R = Requests(BS)
    for i in range(5):
        sid = f"S{i}"
        s.saga.core.accept(SessionStart(sid, s.saga.clock()))
        s.add_request(R.make(tokens(1000 * (i + 1), 64), session_id=sid))
        run_until_idle(s)
        s.saga.core.accept(ToolCallStart(sid, s.saga.clock(), "bash", call_id="x"))
    assert s.saga.ledger.held_blocks >= 16
    big = R.make(tokens(40000, 21 * BS), session_id="big")  # 21 of 23 usable blocks
    s.add_request(big)
    outs = run_until_idle(s)
    assert any(big.request_id in o.num_scheduled_tokens for o in outs)
    assert s.saga.counters["released", "wa_lru"] + s.saga.counters["released", "pressure"] > 0
    pool_is_consistent(s)


def test_reclaim_follows_the_cores_eviction_order_not_lru(tiny_model):
    """WA-LRU: the core says session 'old' (least recently used) is the most
    valuable; under pressure vLLM's LRU would drop it first, SAGA drops 'mid'."""

    class Core(WorkflowCore):
        def eviction_priority(self, session_id, kv_tokens, last_access):
            return {"old": 3.0, "mid": 1.0, "new": 2.0}.get(session_id, 0.0)

    clock = ManualClock(100.0)
    s = saga(tiny_model, clock=clock, core=Core(CoreConfig(pin=PinConfig(min_tokens=10**9)), clock=clock),
             num_blocks=16, block_size=BS)
    R = Requests(BS)
    hists = {}
    for i, sid in enumerate(("old", "mid", "new")):
        hists[sid] = tokens(1000 * (i + 1), 64)  # 4 blocks each: 12 of 15 held
        s.add_request(R.make(hists[sid], session_id=sid))
        run_until_idle(s)
        clock.t += 1
    assert not any(h.pinned for h in map(s.saga.ledger.get, ("old", "mid", "new")))
    s.add_request(R.make(tokens(90000, 80)))  # needs 5+1 blocks: 3 free, so 3+ must go
    run_until_idle(s)
    assert len(s.saga.ledger.get("old").blocks) == 4
    assert len(s.saga.ledger.get("new").blocks) == 4
    assert s.saga.ledger.get("mid") is None or len(s.saga.ledger.get("mid").blocks) < 4
    for sid in ("old", "new"):
        nxt = R.make(hists[sid] + [7, 8], session_id=sid)
        s.add_request(nxt)
        assert hit_tokens(run_until_idle(s), nxt.request_id) == 64


def test_under_pressure_soft_holds_go_before_pins_whatever_their_keys(tiny_model):
    """The ledger's tier order in the engine: a pin outlives every soft hold, even one
    the core values more (a pin is a promise for the length of its TTL)."""

    class Core(WorkflowCore):
        def eviction_priority(self, session_id, kv_tokens, last_access):
            return {"pinned": 0.0, "soft": 5.0}.get(session_id, 0.0)

        def pin_decision(self, session_id, kv_tokens, memory_pressure):
            return PinDecision(session_id == "pinned", 60.0, "test")

    clock = ManualClock(100.0)
    s = saga(tiny_model, clock=clock, core=Core(clock=clock), num_blocks=16, block_size=BS)
    R = Requests(BS)
    for sid in ("pinned", "soft"):
        s.add_request(R.make(tokens(1000 if sid == "soft" else 2000, 64), session_id=sid))
        run_until_idle(s)
    assert s.saga.ledger.get("pinned").pinned and not s.saga.ledger.get("soft").pinned
    s.add_request(R.make(tokens(90000, 160)))  # 11 blocks with 7 free: 4+ held blocks must go
    run_until_idle(s)
    assert len(s.saga.ledger.get("pinned").blocks) == 4
    assert s.saga.ledger.get("soft") is None
    assert s.saga.counters["released", "wa_lru"] == 4 and s.saga.counters["released", "pressure"] == 0


def test_pin_ttl_expiry_turns_a_pin_into_a_soft_hold(tiny_model):
    clock = ManualClock(100.0)
    s = saga(tiny_model, clock=clock, num_blocks=32, block_size=BS)
    R = Requests(BS)
    s.saga.core.accept(SessionStart("A", clock()))
    s.add_request(R.make(tokens(100, 64), session_id="A"))
    run_until_idle(s)
    hold = s.saga.ledger.get("A")
    assert hold.pinned and s.saga.ledger.pinned_blocks == 4
    clock.t = hold.expires_at + 0.01
    s.schedule()  # an empty step applies expiries
    assert not s.saga.ledger.get("A").pinned and s.saga.ledger.pinned_blocks == 0
    assert s.saga.counters["pins", "expired"] == 1


def _session_holding_kv(tiny_model):
    """A scheduler where session A's finished request left its 64 tokens held."""
    s = saga(tiny_model, num_blocks=32, block_size=BS)
    R = Requests(BS)
    s.saga.core.accept(SessionStart("A", s.saga.clock()))
    s.add_request(R.make(tokens(100, 64), session_id="A"))
    run_until_idle(s)
    return s


def test_session_end_hint_releases_the_sessions_kv(tiny_model):
    s = _session_holding_kv(tiny_model)
    assert "A" in s.saga.ledger
    s.saga.sink.accept(SessionEnd("A", s.saga.clock()))
    s.schedule()
    assert "A" not in s.saga.ledger
    pool_is_consistent(s)
    assert s.reset_prefix_cache()


def test_requests_without_sessions_behave_exactly_like_stock(tiny_model):
    """No session ids: same schedule, same prefix hits as vLLM's own scheduler."""
    seen = {}
    for cls in (Scheduler, SagaScheduler):
        kw = {"start_hints": False} if cls is SagaScheduler else {}
        s = make_scheduler(cls, tiny_model, num_blocks=20, block_size=BS, **kw)
        R = Requests(BS)
        hits = []
        for i in range(12):
            r = R.make(tokens(100 + (i % 3) * 1000, 48 + 16 * (i % 4)))
            s.add_request(r)
            hits.append(hit_tokens(run_until_idle(s), r.request_id))
        seen[cls.__name__] = hits
    assert seen["Scheduler"] == seen["SagaScheduler"]


def test_afs_orders_waiting_requests_by_fair_share(tiny_model):
    """Tenant 'heavy' has received lots of service; a later request of tenant
    'light' is scheduled before heavy's queued one when only one fits."""
    s = saga(tiny_model, num_blocks=64, block_size=BS, max_num_seqs=1)
    R = Requests(BS)
    for tenant in ("heavy", "light"):  # both active; heavy has been served a lot
        s.saga.core.on_request_arrival(f"warm-{tenant}", 1, tenant)
    s.saga.core.record_service("heavy", 100_000)
    assert s.saga.core.request_priority("l1", "light") < s.saga.core.request_priority("h2", "heavy")
    first = R.make(tokens(1, 40), extra_args={"tenant": "heavy"}, session_id="h1")
    s.add_request(first)
    step(s)  # first runs; the next two wait for the single slot
    h2 = R.make(tokens(2000, 40), extra_args={"tenant": "heavy"}, session_id="h2")
    l1 = R.make(tokens(3000, 40), extra_args={"tenant": "light"}, session_id="l1")
    s.add_request(h2)
    s.add_request(l1)
    outs = run_until_idle(s)
    order = [n.req_id for o in outs for n in o.scheduled_new_reqs]
    assert order.index(l1.request_id) < order.index(h2.request_id)


@pytest.mark.parametrize("window, young_hint, young_first", [
    (900.0, None, False), (0.0, None, True), (900.0, 40, True), (900.0, 20, False)])
def test_within_a_tenant_the_senior_task_goes_first(tiny_model, window, young_hint, young_first):
    """Sessions `old` and `young` of one tenant both wait for the single slot;
    young asked first. By seniority old's request runs first; with the window at
    0 (request-level FCFS, as stock) young's does, and so it does when young's
    client asks a priority (`nvext.agent_hints.priority`, seconds) larger than
    the 30 s by which old's task is senior."""
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(fairshare=FairShareConfig(seniority_window_s=window)), clock=clock)
    s = saga(tiny_model, clock=clock, core=core, num_blocks=64, block_size=BS, max_num_seqs=1)
    R = Requests(BS)
    s.saga.core.accept(SessionStart("old", clock(), tenant="t"))
    clock.t += 30
    s.saga.core.accept(SessionStart("young", clock(), tenant="t"))
    s.add_request(R.make(tokens(1, 40), session_id="filler"))
    step(s)  # the filler holds the only slot
    young = R.make(tokens(2000, 40), session_id="young",
                   extra_args={"priority_jump_s": young_hint} if young_hint else None)
    s.add_request(young)
    clock.t += 1
    old = R.make(tokens(3000, 40), session_id="old")
    s.add_request(old)
    outs = run_until_idle(s)
    order = [n.req_id for o in outs for n in o.scheduled_new_reqs]
    first, second = (young, old) if young_first else (old, young)
    assert order.index(first.request_id) < order.index(second.request_id)


def test_engine_knobs_from_the_environment_and_bad_values_ignored(tiny_model, monkeypatch):
    def knobs():
        s = make_scheduler(SagaScheduler, tiny_model, num_blocks=16, block_size=BS, start_hints=False)
        return s.saga.core.config.fairshare.seniority_window_s, s.saga.ledger.max_pin_blocks

    default = (FairShareConfig().seniority_window_s, 7)  # half of the 15 usable blocks
    for window, fraction in (("soon", "lots"), ("-1", "1.5"), ("nan", "nan")):
        monkeypatch.setenv("SAGA_SENIORITY_WINDOW_S", window)
        monkeypatch.setenv("SAGA_PIN_MAX_FRACTION", fraction)
        assert knobs() == default
    monkeypatch.setenv("SAGA_SENIORITY_WINDOW_S", "0")
    monkeypatch.setenv("SAGA_PIN_MAX_FRACTION", "0.25")
    assert knobs() == (0.0, 3)


def _paused_session_reclaimed(tiny_model):
    """Session A (64 tokens) pauses in a tool; a request needing the whole pool
    then reclaims its KV. Returns (scheduler, requests, clock, A's history)."""
    clock = ManualClock(100.0)
    s = saga(tiny_model, clock=clock, num_blocks=16, block_size=BS)
    R = Requests(BS)
    hist = tokens(100, 64)
    s.saga.core.accept(SessionStart("A", clock()))
    s.add_request(R.make(hist, session_id="A"))
    run_until_idle(s)
    s.saga.core.accept(ToolCallStart("A", clock(), "bash", call_id="c"))
    s.add_request(R.make(tokens(50000, 14 * BS)))
    run_until_idle(s)
    assert s.saga.ledger.get("A") is None or len(s.saga.ledger.get("A").blocks) < 4
    return s, R, clock, hist


def test_prefetch_recomputes_a_reclaimed_session_while_idle_and_hides_its_output(tiny_model):
    s, R, clock, hist = _paused_session_reclaimed(tiny_model)
    outs = []
    for _ in range(20):  # idle steps: the core plans a prefetch for A
        clock.t += 0.5
        out = s.schedule()
        outs.append(out)
        if out.total_num_scheduled_tokens:
            ids = list(out.num_scheduled_tokens)
            eco = s.update_from_output(out, runner_output(ids, [[7] for _ in ids]))
            for o in eco.values():
                assert not [x for x in o.outputs if x.request_id.startswith("saga-prefetch-")]
    assert s.saga.counters["prefetch", "issued"] == 1
    nxt = R.make(hist + [7, 8, 9], session_id="A")
    s.add_request(nxt)
    assert hit_tokens(run_until_idle(s), nxt.request_id) == 64
    assert s.saga.counters["prefetch", "used"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_survives_any_interleaving_of_hints_and_requests(tiny_model, seed):
    """Random sessions, hints in any order (unknown sessions, ends before starts,
    hints for finished requests), floods of requests: no exception, the block
    pool stays consistent, everything drains, and no reference leaks."""
    import random

    from saga_server.core import HintRejected, LlmCallEnd, LlmCallStart, ToolCallEnd

    rnd = random.Random(seed)
    clock = ManualClock(100.0)
    s = saga(tiny_model, clock=clock, num_blocks=20, block_size=BS, max_num_seqs=4)
    R = Requests(BS)
    sids = [f"s{i}" for i in range(6)]
    history = {sid: tokens(rnd.randrange(10**5), rnd.randrange(8, 80)) for sid in sids}
    kinds = [SessionStart, SessionEnd, ToolCallStart, ToolCallEnd, LlmCallStart, LlmCallEnd]
    ids = itertools.count()
    for _ in range(150):
        clock.t += rnd.random()
        sid = rnd.choice(sids + ["ghost"])
        action = rnd.random()
        if action < 0.45:
            kind = rnd.choice(kinds)
            args = {"session_id": sid, "time": clock()}
            if kind in (ToolCallStart,):
                args.update(tool="bash", call_id=str(next(ids) % 3))
            if kind is ToolCallEnd:
                args.update(tool="bash", call_id=str(rnd.randrange(3)))
            try:
                s.saga.sink.accept(kind(**args))
            except HintRejected:
                pass
        elif action < 0.9:
            grow = history.get(sid, []) + tokens(rnd.randrange(10**5), rnd.randrange(1, 40))
            history[sid] = grow[:300]
            s.add_request(R.make(history[sid], session_id=sid, max_tokens=rnd.randrange(1, 4)))
        for _ in range(rnd.randrange(0, 4)):
            step(s)
        if rnd.random() < 0.05 and s.requests:  # aborts, like a client disconnect
            from vllm.v1.request import RequestStatus

            s.finish_requests(rnd.choice(list(s.requests)), RequestStatus.FINISHED_ABORTED)
        pool_is_consistent(s)
    run_until_idle(s)
    assert s.saga.counters.total("plugin_errors") == 0
    pool_is_consistent(s)
    s.saga.ledger.release_all("test")
    assert s.reset_prefix_cache()


def test_a_queued_sessions_kv_is_reclaimed_last(tiny_model):
    """Session A's next request is waiting for a slot while a running request
    needs blocks. The core ranks A's KV cheapest, but A is about to use it: SAGA
    takes B's instead, and A's request then hits its whole history."""

    class Core(WorkflowCore):
        def eviction_priority(self, session_id, kv_tokens, last_access):
            return {"A": 1.0, "B": 2.0}.get(session_id, 0.0)

    clock = ManualClock(100.0)
    s = saga(tiny_model, clock=clock, core=Core(CoreConfig(pin=PinConfig(min_tokens=10**9)), clock=clock),
             num_blocks=16, block_size=BS, max_num_seqs=1)
    R = Requests(BS)
    hist = {"A": tokens(100, 64), "B": tokens(5000, 64)}
    for sid in ("A", "B"):
        s.add_request(R.make(hist[sid], session_id=sid))
        run_until_idle(s)
    x = R.make(tokens(9000, 80), max_tokens=60)  # grows from 5 to 9 blocks while decoding
    s.add_request(x)
    step(s)
    nxt = R.make(hist["A"] + [7, 8, 9], session_id="A")
    s.add_request(nxt)  # waits: the only slot is x's
    outs = run_until_idle(s)
    assert s.saga.counters["released", "wa_lru"] + s.saga.counters["released", "pressure"] > 0
    assert hit_tokens(outs, nxt.request_id) == 64
    assert s.saga.ledger.get("B") is None or len(s.saga.ledger.get("B").blocks) < 4


def test_tenant_and_deadline_from_vllm_xargs_reach_the_core(tiny_model):
    """No hints at all: `vllm_xargs` alone make the session known with its deadline."""
    s = saga(tiny_model, num_blocks=32, block_size=BS)
    R = Requests(BS)
    s.add_request(R.make(tokens(100, 40), session_id="X", extra_args={"tenant": "acme", "deadline_s": 30}))
    run_until_idle(s)
    snap = s.saga.core.session("X")
    assert snap is not None and snap.tenant == "acme" and snap.deadline_at is not None
    s.add_request(R.make(tokens(100, 40), session_id="Y", extra_args={"deadline_s": "soon"}))  # ignored
    run_until_idle(s)
    assert s.saga.counters.total("plugin_errors") == 0


def test_a_session_moved_away_releases_its_kv_but_keeps_its_workflow_state(tiny_model):
    s = _session_holding_kv(tiny_model)
    held = len(s.saga.ledger.get("A").blocks)
    assert held
    assert s.saga.sink.release_session("A") and s.saga.sink.release_session("never-seen")
    s.schedule()
    assert "A" not in s.saga.ledger
    assert s.saga.counters["released", "moved"] == held
    assert s.saga.core.session("A").state != SessionPhase.ENDED  # it may come back
    pool_is_consistent(s)
    assert s.reset_prefix_cache()  # nothing left referenced


def test_an_idle_engine_prefetches_at_once_instead_of_just_before_the_predicted_resume(tiny_model):
    """The step vLLM takes to report the last finished request sees an idle engine:
    the reclaimed paused session is re-prefilled then, not near its predicted
    resume (by which time the EngineCore may be asleep on its input queue)."""
    s, R, clock, hist = _paused_session_reclaimed(tiny_model)
    plan = s.saga.core.plan_prefetch([PrefetchCandidate("A", 64, 0.0)], 10_000)
    assert plan and plan[0].start_at > clock()  # the plan alone would wait
    assert s.has_requests()  # vLLM still has the flood's finish to report
    step(s)  # that step, at the same instant
    assert s.saga.counters["prefetch", "issued"] == 1
    run_until_idle(s)
    step(s)  # reports the prefetch's finish; A is warm, nothing else is due
    assert not s.has_requests() and s.saga.counters["prefetch", "issued"] == 1  # the EngineCore may sleep
    nxt = R.make(hist + [7, 8, 9], session_id="A")
    s.add_request(nxt)
    assert hit_tokens(run_until_idle(s), nxt.request_id) == 64


def test_a_tenants_pins_stay_under_its_cap_and_other_tenants_still_pin(tiny_model):
    """`max_pinned_blocks` of the keys file: tenant a may pin 6 blocks; its second
    4-block session is held soft instead (counted), tenant b pins as before."""
    caps = {"a": 6}
    s = saga(tiny_model, num_blocks=48, block_size=BS,
             tenant_limits=lambda tenant: TenantLimits(max_pinned_blocks=caps.get(tenant)))
    R = Requests(BS)
    for i, (sid, tenant) in enumerate([("A1", "a"), ("A2", "a"), ("B1", "b")]):
        s.saga.core.accept(SessionStart(sid, s.saga.clock(), tenant=tenant))
        s.add_request(R.make(tokens(1000 * (i + 1), 64), session_id=sid))  # 4 blocks each
        run_until_idle(s)
    ledger = s.saga.ledger
    assert [ledger.get(sid).pinned for sid in ("A1", "A2", "B1")] == [True, False, True]
    assert ledger.pinned_of("a") == 4 and ledger.pinned_of("b") == 4 and "A2" in ledger  # A2 still held, soft
    assert s.saga.counters["pins", "over_tenant_cap"] == 1 and s.saga.counters["pins", "refused"] == 1
    assert s.saga.engine_stats().counts["pins"]["over_tenant_cap"] == 1
    caps["a"] = None  # the cap is asked at every pin: lifted, A2's next tool start pins it
    s.saga.sink.accept(ToolCallStart("A2", s.saga.clock(), "bash", call_id="x"))
    s.saga.before_schedule()  # the engine loop takes the hint
    assert ledger.get("A2").pinned and ledger.pinned_of("a") == 8
    pool_is_consistent(s)


def test_the_plugins_time_on_the_engine_thread_is_counted_per_hook(tiny_model):
    s = saga(tiny_model, num_blocks=32, block_size=BS)
    R = Requests(BS)
    s.add_request(R.make(tokens(100, 64), session_id="A"))
    run_until_idle(s)
    spent = {hook: s.saga.counters["plugin_seconds", hook] for hook in
             ("arrival", "before_schedule", "after_schedule", "finish")}
    assert all(seconds > 0 for seconds in spent.values()), spent
