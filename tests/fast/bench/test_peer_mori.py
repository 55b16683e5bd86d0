"""MORI as a simulator baseline: the windowed idleness score, demotion of the idlest
program (not the least recently used one) under pressure, admission at each tier,
and a whole run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from saga_server.bench.policies import make_policy
from saga_server.core.admission import ACTIVE, PARKED, WAITING
from saga_server.engines.sim import SimConfig, Simulator, TaskInstance, make_cost_model
from saga_server.engines.sim.peers.mori import CPU, GPU, WAIT, Idleness, Mori
from saga_server.engines.sim.session import TOOL

from .helpers import chain_task


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def mori(gpu: int, cpu: int):
    clock = Clock()
    policy = Mori()
    policy.bind(clock, seed=0)
    return policy, policy.admission(gpu, cpu, None, lambda sid: True), clock


def session(sid: str, last_access: float):
    return SimpleNamespace(session_id=sid, state=TOOL, last_access=last_access)


def admit(ctl, clock, sid: str, tokens: int, at: float) -> None:
    clock.now = at
    if not ctl.ready(sid, tokens):
        assert sid in ctl.plan().admit


def cycle(policy, ctl, clock, sid: str, tokens: int, start: float, reasoning_s: float, tool_s: float | None):
    """One inference of `sid` from `start`, then its tool call (None: still running)."""
    s = session(sid, start + reasoning_s)
    if start > 0.0:
        admit(ctl, clock, sid, tokens, start)
    clock.now = start + reasoning_s
    policy.on_llm_end(s, None, clock.now)
    ctl.finished(sid)
    policy.on_tool_start(s, clock.now)
    if tool_s is not None:
        clock.now += tool_s
        policy.on_tool_end(s, clock.now)
    return s


def test_the_idleness_score_is_the_tool_share_of_the_last_five_cycles():
    idle = Idleness()

    def cycles(t: float, n: int, reasoning_s: float, tool_s: float) -> float:
        for _ in range(n):
            idle.reasoning_started("p", t)
            idle.reasoning_ended("p", t + reasoning_s)
            idle.acting_started("p", t + reasoning_s)
            idle.acting_ended("p", t + reasoning_s + tool_s)
            t += reasoning_s + tool_s
        return t

    t = cycles(0.0, 6, 3.0, 1.0)  # busy: 3 s of inference, 1 s of tool each
    assert idle.score("p", t) == pytest.approx(0.25)
    # responsive: a long tool call still running soon dominates the window
    idle.reasoning_started("p", t)
    idle.reasoning_ended("p", t + 3.0)
    idle.acting_started("p", t + 3.0)
    assert idle.score("p", t + 3.0) == pytest.approx(4.0 / 19.0)  # the oldest cycle left the window
    assert idle.score("p", t + 63.0) > 0.8
    idle.acting_ended("p", t + 63.0)
    # windowed, not the program's lifetime: five busy cycles later the long call is forgotten
    t = cycles(t + 63.0, 5, 3.0, 1.0)
    assert idle.score("p", t) == pytest.approx(0.25)
    # time waiting at MORI's gate counts in neither term: no phase runs between a
    # tool's end and the request passing the gate
    assert idle.score("p", t + 500.0) == pytest.approx(0.25)
    assert idle.score("new", 10.0) == 0.0  # a program with no history is reasoning


def test_under_pressure_mori_demotes_the_idlest_program_not_the_least_recently_used():
    policy, ctl, clock = mori(gpu=10_000, cpu=10_000)
    admit(ctl, clock, "busy", 4000, 0.0)
    admit(ctl, clock, "idle", 4000, 0.0)
    # `busy` runs short tools between inferences; `idle` waited 8 s on one tool
    t = 0.0
    for _ in range(3):
        cycle(policy, ctl, clock, "busy", 4000, t, 2.0, 0.5)
        t += 2.5
    cycle(policy, ctl, clock, "idle", 4000, 0.0, 1.0, 8.0)
    a = cycle(policy, ctl, clock, "busy", 4000, 7.5, 2.5, None)  # in a tool since t = 10
    b = cycle(policy, ctl, clock, "idle", 4000, 9.0, 2.0, None)  # in a tool since t = 11
    clock.now = 12.0
    # they disagree: `busy` is the least recently used, `idle` the idler
    assert a.last_access < b.last_access
    assert policy.idleness.score("idle", 12.0) > policy.idleness.score("busy", 12.0)
    # a third program needs room the GPU tier does not have: the idlest leaves for the CPU tier
    assert not ctl.ready("new", 4000)
    plan = ctl.plan()
    assert plan.park == ("idle",) and plan.admit == ("new",)
    assert ctl.state("busy") == ACTIVE and ctl.state("idle") == PARKED and ctl.tier("idle") == CPU
    # and the engine's typed order gives its KV up before the busy program's, LRU or not
    assert policy.key(b, 12.0) < policy.key(a, 12.0)


def test_a_program_that_fits_neither_tier_waits():
    policy, ctl, clock = mori(gpu=8000, cpu=4000)
    admit(ctl, clock, "a", 4000, 0.0)
    admit(ctl, clock, "b", 4000, 0.0)
    cycle(policy, ctl, clock, "a", 4000, 0.0, 1.0, None)  # in a tool
    assert not ctl.ready("c", 4000)  # `a` moves to the CPU tier to make room
    assert ctl.plan().park == ("a",) and ctl.state("c") == ACTIVE
    # both tiers are full now: a fourth program waits rather than drop `a`'s KV, while
    # the engine has work (b and c have requests in it)
    assert not ctl.ready("d", 4000)
    assert ctl.plan().admit == () and ctl.state("d") == WAITING
    # `b` goes into a tool: it could move to DRAM only if `a` left it
    cycle(policy, ctl, clock, "b", 4000, 0.0, 2.0, None)
    assert ctl.plan().admit == () and ctl.state("d") == WAITING


def test_a_program_back_from_its_tool_in_the_cpu_tier_goes_before_a_new_one():
    policy, ctl, clock = mori(gpu=8000, cpu=8000)
    admit(ctl, clock, "a", 4000, 0.0)
    admit(ctl, clock, "b", 4000, 0.0)
    cycle(policy, ctl, clock, "a", 4000, 0.0, 1.0, None)
    assert not ctl.ready("c", 4000)
    assert ctl.plan().park == ("a",)
    assert not ctl.ready("d", 4000)  # nothing on the GPU waits on a tool: it waits
    assert ctl.plan().admit == ()
    # `b` goes into a tool and `a`'s ends: room for one of `a` and `d`, and it is `a`'s
    cycle(policy, ctl, clock, "b", 4000, 0.0, 2.0, None)
    clock.now = 3.0
    policy.on_tool_end(session("a", 1.0), 3.0)
    assert not ctl.ready("a", 4000)
    plan = ctl.plan()
    assert plan.admit == ("a",) and plan.park == ("b",) and ctl.state("d") == WAITING and ctl.tier("b") == CPU


def test_an_idle_engine_is_never_kept_waiting():
    policy, ctl, clock = mori(gpu=8000, cpu=0)
    admit(ctl, clock, "a", 8000, 0.0)
    cycle(policy, ctl, clock, "a", 8000, 0.0, 1.0, None)  # nothing runs now
    assert not ctl.ready("b", 4000)
    plan = ctl.plan()  # no room in DRAM for `a`: it drops to the waiting tier
    assert plan.admit == ("b",) and plan.park == ("a",) and ctl.tier("a") == WAIT


def test_the_engine_evicts_by_tier_then_last_use():
    policy = Mori()
    policy.tiers.update({"w": WAIT, "c": CPU, "g": GPU})
    keys = {sid: policy.key(session(sid, last), 0.0) for sid, last in (("w", 9.0), ("c", 5.0), ("g", 1.0))}
    assert keys["w"] < keys["c"] < keys["g"]
    assert policy.key(session("g", 0.5), 0.0) < keys["g"]  # within a tier: least recently used first


def test_a_small_overloaded_run_completes_every_task_with_demotions_and_host_loads():
    insts = [TaskInstance(f"s{i}", chain_task(f"t{i}", steps=8, first_prompt=3000 + 37 * i, growth=600, output=40,
                                              tool_s=0.5 * (1 + 10 * (i % 3)))) for i in range(24)]
    cost = make_cost_model(kv_capacity_override=24_000)
    res = Simulator(cost, make_policy("mori"), insts, SimConfig(workers=1, host_tier_factor=1.0)).run()
    assert len(res.tasks) == 24
    assert res.parked > 0 and res.admitted_after_wait > 0 and res.loaded_tokens > 0


def test_promotions_are_a_strict_priority_order_nobody_overtakes_the_first():
    policy, ctl, clock = mori(gpu=8000, cpu=8000)
    admit(ctl, clock, "x", 6000, 0.0)
    admit(ctl, clock, "y", 2000, 0.0)
    cycle(policy, ctl, clock, "x", 6000, 0.0, 1.0, None)
    clock.now = 1.5
    assert not ctl.ready("z", 6000)
    assert ctl.plan().park == ("x",)  # demoted to make room for z
    clock.now = 2.0
    policy.on_tool_end(session("x", 1.0), 2.0)
    assert not ctl.ready("x", 6000)  # nothing on the GPU waits on a tool: x waits
    assert ctl.plan().admit == ()
    ctl.ended("y")  # 2000 free: not enough for x, enough for a small new program
    assert not ctl.ready("w", 2000)
    assert ctl.plan().admit == () and ctl.state("w") == WAITING
