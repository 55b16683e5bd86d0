"""CONCUR as a baseline: its window on active agents shrinks when the cache signals show
thrashing, new agents wait instead of joining the thrash, admitted agents run on, and
new agents are admitted again once the signals recover."""

from __future__ import annotations

from saga_server.bench.policies import make_policy
from saga_server.core.admission import AdmissionState
from saga_server.engines.sim import SimConfig, Simulator, TaskInstance, make_cost_model
from saga_server.engines.sim.peers.concur import CongestionWindow

from .helpers import chain_task


def one_round(ctl: CongestionWindow, agents, held: int, lost: int) -> None:
    """Each active agent's next request arrives, is scheduled finding all but `lost`
    of the `held` tokens it had, and finishes, until the window has moved once."""
    rounds = ctl.counts.rounds
    while ctl.counts.rounds == rounds:
        for sid in agents:
            assert ctl.ready(sid, 1000)  # execution continuity: an admitted agent never waits
            ctl.served(sid, held, lost)
            ctl.finished(sid)
            if ctl.counts.rounds > rounds:
                break


def test_thrash_shrinks_the_window_new_agents_wait_and_are_admitted_once_the_signals_recover():
    ctl = CongestionWindow(capacity_tokens=100_000)  # 1000-token requests: KV usage stays low
    for i in range(6):
        assert not ctl.ready(f"a{i}", 1000)
    assert ctl.plan().admit == ("a0", "a1", "a2", "a3")  # the initial window
    one_round(ctl, ["a0", "a1", "a2", "a3"], held=1000, lost=0)  # healthy: one more agent per round
    assert ctl.plan().admit == ("a4",)
    one_round(ctl, ["a0", "a1", "a2", "a3", "a4"], held=1000, lost=0)
    assert ctl.plan().admit == ("a5",)
    active = [f"a{i}" for i in range(6)]

    # Mid-run thrashing: each request recomputes 60% of what its agent had computed.
    one_round(ctl, active, held=1000, lost=600)
    assert ctl.window < len(active)
    assert not ctl.ready("late", 1000)
    for _ in range(2):  # the signals stay bad: the newcomer keeps waiting, nobody is parked
        plan = ctl.plan()
        assert plan.admit == () and plan.park == ()
        assert ctl.state("late") == AdmissionState.WAITING
        one_round(ctl, active, held=1000, lost=600)
    assert all(ctl.state(a) == AdmissionState.ACTIVE for a in active)
    shrunk = ctl.window

    # The signals recover: the window grows one agent per round until the newcomer fits.
    for rounds in range(1, 20):
        one_round(ctl, active, held=1000, lost=0)
        if ctl.plan().admit == ("late",):
            break
    else:
        raise AssertionError("the newcomer was never admitted after the signals recovered")
    assert rounds == len(active) + 1 - int(shrunk)  # additive increase: one agent per round
    assert ctl.state("late") == AdmissionState.ACTIVE


def test_high_kv_usage_alone_is_congestion():
    ctl = CongestionWindow(capacity_tokens=10_000)
    for i in range(5):
        ctl.ready(f"a{i}", 2500)
    assert len(ctl.plan().admit) == 4
    for i in range(4):  # all four run at once: usage 0.25 .. 1.0, every hit found
        ctl.served(f"a{i}", 2000, 0)
    assert ctl.window == 2.0 and ctl.counts.decreases == 1
    for i in range(4):
        ctl.finished(f"a{i}")
    assert ctl.plan().admit == ()  # a4 waits although nothing was lost


def test_a_small_overloaded_run_completes_every_task_without_thrashing():
    # 24 agents whose histories reach ~8k tokens on a pool of 24k (1x host tier): all
    # running at once they thrash; CONCUR admits a few at a time.
    insts = [TaskInstance(f"s{i}", chain_task(f"t{i}", steps=8, first_prompt=3000 + 37 * i, growth=600,
                                              output=40, tool_s=0.5)) for i in range(24)]

    def run(policy: str):
        cost = make_cost_model(kv_capacity_override=24_000)
        return Simulator(cost, make_policy(policy), insts, SimConfig(workers=1, host_tier_factor=1.0)).run()

    concur, lru = run("concur"), run("apc-lru-offload")
    assert sorted(t.session_id for t in concur.tasks) == sorted(i.session_id for i in insts)
    assert concur.admitted_after_wait > 0 and concur.parked == 0
    assert concur.recomputed_tokens < 0.5 * lru.recomputed_tokens
