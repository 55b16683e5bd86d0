"""MARS as a baseline: its admission window halves on GPU KV pressure and grows by one
agent per round without it; its MLFQ demotes agents by attained service; it keeps a
paused agent's KV only when a warm resume pays off; a whole run finishes every task."""

from __future__ import annotations

from saga_server.bench.policies import make_policy
from saga_server.engines.sim import SimConfig, Simulator, TaskInstance, make_cost_model
from saga_server.engines.sim.peers.mars import LEVELS, QUANTUM_S, AimdAdmission, Mars
from saga_server.engines.sim.session import Request, Session, TOOL

from .helpers import chain_task


def agents(ctl: AimdAdmission, n: int, tokens: int = 10) -> list[str]:
    ids = [f"a{i}" for i in range(n)]
    for sid in ids:
        ctl.ready(sid, tokens)
    return ids


def round_of(ctl: AimdAdmission, ids: list[str], recomputed: int = 0) -> None:
    """One request per admitted agent is scheduled (a round), then finishes and comes back."""
    for sid in ids:
        ctl.served(sid, 100, recomputed)
    for sid in ids:
        ctl.finished(sid)
        ctl.ready(sid, 10)


def test_the_window_grows_one_agent_per_round_and_halves_on_pressure():
    ctl = AimdAdmission(capacity_tokens=10_000, window=4.0, threshold=4.0)  # past slow start
    ids = agents(ctl, 12)
    admitted = list(ctl.plan().admit)
    assert admitted == ids[:4]  # the window binds: four agents, in arrival order
    for expected in (5.0, 6.0, 7.0, 8.0):  # additive increase: +1 per round without pressure
        round_of(ctl, admitted)
        assert ctl.window == expected
        admitted += ctl.plan().admit
        assert len(admitted) == expected
    ctl.served(admitted[0], 100, recomputed_tokens=50)  # an admitted agent lost held KV
    assert ctl.window == 4.0  # multiplicative decrease: halved
    for sid in admitted[1:4]:  # the same round's further signals are the same congestion
        ctl.served(sid, 100, recomputed_tokens=50)
    assert ctl.window == 4.0
    assert ctl.plan().admit == ()  # eight admitted over a window of four: nobody new
    for sid in admitted[4:]:  # the round (one request of each admitted agent) ends
        ctl.served(sid, 100, 0)
    ctl.served(admitted[0], 100, recomputed_tokens=50)  # pressure in the next round
    assert ctl.window == 2.0


def test_an_oversubscribed_pool_is_pressure_even_without_loss():
    ctl = AimdAdmission(capacity_tokens=1_000, window=4.0, threshold=4.0)
    ids = agents(ctl, 6, tokens=240)  # four admitted need 960 of 1000: they fit
    ctl.plan()
    ctl.served(ids[0], 0, 0)
    assert ctl.window == 4.0
    ctl.finished(ids[0])
    ctl.ready(ids[0], 280)  # its next request needs 280: 1000 of 1000 still fits
    ctl.served(ids[0], 240, 0)
    assert ctl.window == 4.0
    ctl.ready(ids[1], 250)  # 1010 of 1000: oversubscribed
    ctl.served(ids[1], 240, 0)
    assert ctl.window == 2.0


def test_slow_start_doubles_each_round_until_the_first_pressure():
    ctl = AimdAdmission(capacity_tokens=10_000)
    ids = agents(ctl, 40)
    admitted = list(ctl.plan().admit)
    for expected in (2, 4, 8, 16):
        round_of(ctl, admitted)
        admitted += ctl.plan().admit
        assert len(admitted) == expected
    ctl.served(admitted[0], 100, 1)
    assert ctl.window == ctl.threshold == 8.0  # halved, and additive from here on


def test_the_window_does_not_grow_while_it_does_not_bind():
    ctl = AimdAdmission(capacity_tokens=10_000, window=4.0, threshold=4.0)
    ids = agents(ctl, 2)
    ctl.plan()
    for _ in range(5):
        round_of(ctl, ids)
    assert ctl.window == 4.0


def session(sid: str, kv: int, tools: tuple[str, ...]) -> Session:
    s = Session(TaskInstance(sid, chain_task(sid)), 0.0, 0)
    s.kv_tokens, s.state, s.tool_names = kv, TOOL, tools
    return s


def test_the_mlfq_demotes_an_agent_by_the_service_it_has_attained():
    mars = Mars()
    s = session("a", 1000, ())
    assert mars.level(s) == 0
    r = Request(s, 100, 10, 0, 1, 0.0)
    mars.on_llm_end(s, r, QUANTUM_S)  # one quantum in the batch
    assert mars.level(s) == 1 and mars.queue_priority(s, 0.0) == (1, 0.0)
    mars.on_llm_end(s, r, 100 * QUANTUM_S)
    assert mars.level(s) == LEVELS - 1


def test_kv_is_kept_over_a_tool_only_when_the_tool_is_back_before_a_reload():
    mars = Mars()
    cost = make_cost_model()
    mars.admission(100_000, 100_000, cost, lambda sid: True)
    big = 200_000  # its reload takes longer than the short tool
    reload_s = cost.transfer_s(big)
    for name, d in (("short", reload_s / 4), ("long", reload_s * 4)):
        s = session(name, big, (name,))
        mars.on_tool_start(s, 0.0)
        mars.on_tool_end(s, d)
    quick, slow = session("q", big, ("short",)), session("s", big, ("long",))
    assert mars.pin_ttl(quick, 0.0, 1.0) > 0.0
    assert mars.pin_ttl(slow, 0.0, 1.0) == 0.0
    # not kept: its KV goes to the host tier before any kept or running agent's
    assert mars.key(slow, 0.0) < mars.key(quick, 0.0)


def test_a_small_overloaded_run_finishes_every_task():
    insts = [TaskInstance(f"s{i}", chain_task(f"t{i}", steps=8, first_prompt=3000 + 37 * i,
                                              growth=600, output=40, tool_s=0.5)) for i in range(24)]
    cost = make_cost_model(kv_capacity_override=24_000)
    res = Simulator(cost, make_policy("mars"), insts, SimConfig(workers=1, host_tier_factor=1.0)).run()
    assert len(res.tasks) == 24
    assert res.admitted_after_wait > 0  # the window bound: agents waited at the gate
