"""Subagent trees in the core: a child names its parent, the tree is one task, and
the parent waits on its children as on a tool call."""

from __future__ import annotations

import pytest

from saga_server.core import (
    CoreConfig,
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionStart,
    WorkflowCore,
)
from saga_server.core.events import Caller
from saga_server.core.fairshare import FairShareConfig


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def core(clock):
    return WorkflowCore(CoreConfig(session_idle_s=600.0, fairshare=FairShareConfig(seniority_window_s=3600.0)),
                        clock=clock)


def _call(core, clock, sid, seconds=1.0, prompt=100, output=10):
    core.accept(LlmCallStart(sid, clock()))
    clock.t += seconds
    core.accept(LlmCallEnd(sid, clock(), prompt_tokens=prompt, output_tokens=output))


def test_a_child_of_a_live_parent_is_linked_and_leaves_its_parents_count_when_it_stops(core, clock):
    core.accept(SessionStart("root", clock(), tenant="a"))
    core.accept(SessionStart("kid-1", clock(), tenant="a", parent_id="root"))
    core.accept(SessionStart("kid-2", clock(), tenant="a", parent_id="root"))
    assert core.session("kid-1").parent_id == "root" and core.session("root").live_children == 2
    core.accept(SessionEnd("kid-1", clock()))
    assert core.session("root").live_children == 1
    clock.t += 700.0  # kid-2 idles out; the root with it
    core.accept(LlmCallStart("other", clock()))
    core.expire_idle()
    assert core.session("kid-2") is None and core.stats()["subagents_linked"] == 2


@pytest.mark.parametrize("case", ["unknown", "ended", "other-tenant", "other-owner", "descendant"])
def test_a_parent_the_rule_does_not_allow_leaves_the_child_a_root(core, clock, case):
    a, b = Caller("a"), Caller("b")
    core.accept(SessionStart("p", clock()), caller=a)
    if case == "ended":
        core.accept(SessionEnd("p", clock()), caller=a)
    if case == "descendant":  # p's child c; p restarts naming c: a cycle
        core.accept(SessionStart("c", clock(), parent_id="p"), caller=a)
        core.accept(SessionEnd("p", clock()), caller=a)
        core.accept(SessionStart("p", clock(), parent_id="c"), caller=a)
        assert core.session("p", caller=a).parent_id == "" and core.stats()["subagent_parent_refused"] == 1
        return
    parent = {"unknown": "nobody"}.get(case, "p")
    caller = b if case == "other-owner" else a
    tenant = {"other-tenant": ""}.get(case, "")
    if case == "other-tenant":
        core.accept(SessionStart("x", clock(), tenant="z", parent_id="p"))  # no caller: tenant z, not p's
        child = core.session("x")
    else:
        core.accept(SessionStart("x", clock(), tenant=tenant, parent_id=parent), caller=caller)
        child = core.session("x", caller=caller)
    assert child.parent_id == "" and core.stats()["subagent_parent_refused"] == 1
    assert core.session("p").live_children == 0


def test_a_tree_is_one_task_a_child_ranks_by_its_roots_start_and_keeps_its_deadline(core, clock):
    core.accept(SessionStart("root", clock(), tenant="a", deadline_s=900.0))
    clock.t += 300.0
    core.accept(SessionStart("late", clock(), tenant="a"))
    core.accept(SessionStart("kid", clock(), tenant="a", parent_id="root"))
    now = clock()
    _, kid_seniority = core.request_rank("kid", "a", now)
    _, late_seniority = core.request_rank("late", "a", now)
    assert kid_seniority == 0.0 < late_seniority == 300.0  # the child's task began with the root
    assert core.session("kid").deadline_at == core.session("root").deadline_at == 900.0


def test_a_parent_waits_on_its_children_it_will_continue_when_the_longest_is_done(core, clock):
    # Learn the workflows: "worker" sessions run 4 steps of 10 s, "lead" sessions end after 2 steps.
    for n in range(10):
        core.accept(SessionStart(f"w{n}", clock(), tenant="a", workflow="worker"))
        for _ in range(4):
            _call(core, clock, f"w{n}", seconds=10.0)
        core.accept(SessionEnd(f"w{n}", clock()))
        core.accept(SessionStart(f"l{n}", clock(), tenant="a", workflow="lead"))
        _call(core, clock, f"l{n}")
        clock.t += 1.0
        _call(core, clock, f"l{n}")
        core.accept(SessionEnd(f"l{n}", clock()))
    core.accept(SessionStart("lead", clock(), tenant="a", workflow="lead"))
    _call(core, clock, "lead")
    clock.t += 1.0
    _call(core, clock, "lead")
    alone = core.predict("lead")
    assert not core.pin_decision("lead", 4096, 0.0).pin  # its sessions end here
    core.accept(SessionStart("kid", clock(), tenant="a", workflow="worker", parent_id="lead"))
    waiting = core.predict("lead")
    kid = core.predict("kid")
    assert alone.p_continue < 0.5 and waiting.p_continue == 1.0
    assert waiting.resume_mean_s == pytest.approx(kid.remaining_time_s) and kid.remaining_time_s > 20.0
    held = core.pin_decision("lead", 4096, 0.0)
    pin = core.config.pin  # Markov's bound on the q_high-quantile of the children's time, capped
    assert held.pin and held.ttl_s == pytest.approx(min(kid.remaining_time_s / (1 - pin.q_high), pin.max_ttl_s))
    core.accept(SessionEnd("kid", clock()))
    assert core.predict("lead").p_continue == pytest.approx(alone.p_continue)


def test_a_node_learns_how_many_subagents_it_starts_and_for_how_long(core, clock):
    # "lead" sessions start two "sub" subagents after their first call; each runs one
    # 2 s call and ends 30 s after it started. The sub workflow alone knows only its
    # calls, so only the lead's node knows the 30 s a parent waits.
    def lead(name, finish=True):
        core.accept(SessionStart(name, clock(), tenant="a", workflow="lead"))
        _call(core, clock, name)
        for k in range(2):
            core.accept(SessionStart(f"{name}.{k}", clock(), tenant="a", workflow="sub", parent_id=name))
            _call(core, clock, f"{name}.{k}", seconds=2.0)
        if finish:
            clock.t += 28.0
            for k in range(2):
                core.accept(SessionEnd(f"{name}.{k}", clock()))
            _call(core, clock, name)
            core.accept(SessionEnd(name, clock()))

    for n in range(6):
        lead(f"l{n}")
    lead("now", finish=False)  # its children started 2 s ago
    waits = core.predict("now").resume_mean_s
    own = core.predict("now.0").remaining_time_s  # what the child's own graph expects: a call or so
    assert core.aeg.spawns_per_visit("lead", "start") == pytest.approx(2.0, rel=0.01)
    assert own < 10.0 and waits == pytest.approx(28.0, rel=0.15)  # 30 s each, 2 s gone
