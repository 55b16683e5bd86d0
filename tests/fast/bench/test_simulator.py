"""The simulator on small scenarios: timing against the cost model, cache effects,
reference policies bound the others, and runs are reproducible under a seed."""

from __future__ import annotations

import pytest

from saga_server.bench.policies import make_policy
from saga_server.core import SessionPhase
from saga_server.engines.sim import PrefixCache, SimConfig, Simulator, TaskInstance, make_cost_model

from .helpers import chain_task, random_instances


def run(policy: str, insts, kv_tokens: int | None = 20_000, workers: int = 1, concurrency=None,
        seed: int = 0):
    cost = make_cost_model(kv_capacity_override=kv_tokens)
    cfg = SimConfig(workers=workers, concurrency=concurrency, seed=seed)
    return Simulator(cost, make_policy(policy), insts, cfg).run()


def test_a_lone_call_takes_prefill_then_decode_as_priced():
    cost = make_cost_model()
    task = chain_task("t", steps=1, first_prompt=3000, output=40)
    res = Simulator(cost, make_policy("apc-lru"), [TaskInstance("s", task)], SimConfig(workers=1)).run()
    # Full chunks, then one iteration priced with the rest: a short last chunk is a
    # cheaper iteration, not a fraction of a full one.
    full, rest = divmod(cost.prefill_work(3000, 0), cost.token_budget)
    assert rest > 0
    prefill = full * cost.step_s(0, cost.token_budget, 0) + cost.step_s(0, rest, 0)
    decode = 39 * cost.step_s(1, 0, 3000 + 20)
    assert res.tasks[0].tct_s == pytest.approx(prefill + decode, rel=1e-9)
    assert cost.prefill_s(3000, 0) == pytest.approx(prefill, rel=1e-12)


def test_a_request_splits_into_queue_prefill_and_decode_as_vllm_counts_them():
    cost = make_cost_model(max_num_seqs=1)
    task = chain_task("t", steps=1, first_prompt=3000, output=40)
    insts = [TaskInstance("a", task), TaskInstance("b", task)]  # b waits while a runs alone
    res = Simulator(cost, make_policy("apc-lru"), insts, SimConfig(workers=1)).run()
    full, rest = divmod(cost.prefill_work(3000, 0), cost.token_budget)
    prefill = full * cost.step_s(0, cost.token_budget, 0) + cost.step_s(0, rest, 0)
    decode = 39 * cost.step_s(1, 0, 3000 + 20)
    assert res.queue_s == pytest.approx(prefill + decode, rel=1e-9)  # b's wait for a
    assert res.prefill_s == pytest.approx(2 * prefill, rel=1e-9)
    assert res.decode_s == pytest.approx(2 * decode, rel=1e-9)
    assert res.iterations == pytest.approx(2 * (full + 1 + 39), rel=1e-9)


def test_unloaded_time_matches_a_lone_session_with_a_perfect_cache():
    task = chain_task("t", steps=5)
    res = run("infinite", [TaskInstance("s", task)], kv_tokens=None)
    rec = res.tasks[0]
    # alone, the fluid model and the analytic estimate agree to the model's resolution
    assert rec.tct_s == pytest.approx(rec.unloaded_s, rel=0.02)


def test_caching_serves_the_reused_prefix_and_vanilla_recomputes_it():
    insts = [TaskInstance("s", chain_task("t", steps=4, first_prompt=1000, growth=400, output=50))]
    apc, van = run("apc-lru", insts, kv_tokens=None), run("vanilla", insts, kv_tokens=None)
    assert apc.recomputed_tokens == 0
    # full blocks of the previous prompt + answer are hits (16-token blocks)
    assert apc.hit_tokens == sum((p + 50) // 16 * 16 for p in (1000, 1450, 1900))
    assert van.hit_tokens == 0 and van.recomputed_tokens == apc.hit_tokens > 0
    assert apc.tasks[0].tct_s < van.tasks[0].tct_s


def test_memory_pressure_makes_lru_recompute_and_infinite_never_does():
    insts = random_instances(12, seed=3)
    lru, inf = run("apc-lru", insts, kv_tokens=12_000), run("infinite", insts, kv_tokens=12_000)
    assert lru.recomputed_tokens > 0 and lru.evicted_blocks > 0
    assert inf.recomputed_tokens == 0 and inf.evicted_blocks == 0


@pytest.mark.parametrize("seed", range(4))
def test_infinite_cache_is_a_lower_bound_on_mean_tct(seed):
    insts = random_instances(16, seed=seed)
    inf = run("infinite", insts, kv_tokens=10_000, workers=2)
    base = sum(t.tct_s for t in inf.tasks)
    # same (stock) placement as `infinite`: `saga` also routes, so it may balance below it
    for policy in ("vanilla", "apc-lru", "continuum-ttl", "kvflow", "belady", "saga-no-steal"):
        res = run(policy, insts, kv_tokens=10_000, workers=2)
        assert base <= sum(t.tct_s for t in res.tasks) * (1 + 1e-9), policy


@pytest.mark.parametrize("seed", range(4))
def test_belady_recomputes_no_more_than_lru_under_the_same_schedule(seed):
    insts = random_instances(16, seed=seed)
    bel = run("belady", insts, kv_tokens=10_000, workers=2)
    lru = run("apc-lru", insts, kv_tokens=10_000, workers=2)
    assert bel.recomputed_tokens <= lru.recomputed_tokens


def test_host_tier_turns_recompute_into_loads():
    insts = random_instances(12, seed=5)
    lru, kvf = run("apc-lru", insts, kv_tokens=12_000), run("kvflow", insts, kv_tokens=12_000)
    assert lru.recomputed_tokens > 0
    assert kvf.loaded_tokens > 0 and kvf.recomputed_tokens < lru.recomputed_tokens


def test_closed_loop_concurrency_caps_tasks_in_flight():
    insts = random_instances(9, seed=1)
    res = run("apc-lru", insts, kv_tokens=None, concurrency=3)
    events = sorted([(t.started_at, 1) for t in res.tasks] + [(t.finished_at, -1) for t in res.tasks],
                    key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _, d in events:
        in_flight += d
        peak = max(peak, in_flight)
    assert peak == 3 and len(res.tasks) == 9
    # throughput is measured while every slot is busy: until the last task started
    assert res.saturated_s == max(t.started_at for t in res.tasks) < res.makespan_s
    assert res.saturated_tasks == 9 - 3


def test_a_ramp_spreads_the_closed_loops_first_starts_and_then_keeps_the_cap():
    insts = [TaskInstance(f"s{i}", chain_task(f"t{i}", steps=2)) for i in range(6)]
    cfg = SimConfig(workers=1, concurrency=4, ramp_s=30.0)
    res = Simulator(make_cost_model(), make_policy("apc-lru"), insts, cfg).run()
    started = {t.session_id: t.started_at for t in res.tasks}
    assert [started[f"s{i}"] for i in range(4)] == [0.0, 7.5, 15.0, 22.5]
    # a slot that finished is refilled at once, not at the ramp's pace
    assert started["s4"] == min(t.finished_at for t in res.tasks) < 7.5 and len(started) == 6
    with pytest.raises(ValueError, match="ramp_s"):
        SimConfig(ramp_s=-1.0)


def test_runs_are_reproducible_and_every_task_finishes():
    insts = random_instances(20, seed=7)
    for policy in ("apc-lru", "saga"):
        a = run(policy, insts, kv_tokens=10_000, workers=3)
        b = run(policy, insts, kv_tokens=10_000, workers=3)
        assert [(t.session_id, t.finished_at) for t in a.tasks] == \
               [(t.session_id, t.finished_at) for t in b.tasks]
        assert sorted(t.session_id for t in a.tasks) == sorted(i.session_id for i in insts)


def test_a_step_larger_than_the_pool_is_refused_up_front():
    insts = [TaskInstance("s", chain_task("t", steps=1, first_prompt=5000))]
    with pytest.raises(ValueError, match="pool"):
        run("apc-lru", insts, kv_tokens=1000)


def test_saga_feeds_the_workflow_core_every_call_and_tool():
    insts = random_instances(6, seed=2)
    pol = make_policy("saga")
    cost = make_cost_model(kv_capacity_override=10_000)
    res = Simulator(cost, pol, insts, SimConfig(workers=2)).run()
    stats = pol.core.stats()
    assert stats["requests_arrived"] == stats["requests_finished"] == res.llm_calls
    assert all(pol.core.session(i.session_id).state == SessionPhase.ENDED for i in insts)


def test_open_loop_tasks_start_at_their_arrival_times():
    insts = [TaskInstance(f"s{i}", chain_task(f"t{i}", steps=2), arrival_s=10.0 * i) for i in range(4)]
    res = run("apc-lru", insts, kv_tokens=None)
    assert sorted(t.started_at for t in res.tasks) == [0.0, 10.0, 20.0, 30.0]
    assert res.saturated_s == 0.0  # open loop: throughput over the whole run


def test_a_step_below_the_clocks_resolution_still_finishes_the_prefill():
    """Seen under overload: 1e-6 of prefill work left at t = 18837 s gave a step of
    1.5e-12 s, which the clock cannot represent, so the batch spun in place forever."""
    from saga_server.engines.sim.session import Request
    from saga_server.engines.sim.worker import Worker

    cost = make_cost_model()
    w = Worker(0, PrefixCache(100), None)
    w.at = 18837.393367155288
    r = Request(None, 10, 1, 0, 1, w.at)
    r.work = 0.0
    w.prefill_done = w.prefill_total = 622497.00846281
    w.start_prefill(r)
    w.prefill_total = r.prefill_end = 622497.008463898  # 1.09e-6 left: just above the tolerance
    now = w.at + w.replan(cost)
    assert now > w.at
    w.advance(now)
    assert w.take_finished() == [r]
