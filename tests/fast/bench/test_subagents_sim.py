"""Subagents in the simulator: a step that spawns starts its children, the parent waits
for them, and the tree is one task; SAGA hears the parent links unless told not to."""

from __future__ import annotations

from dataclasses import replace

import pytest

from saga_server.bench.policies import make_policy
from saga_server.engines.sim import SimConfig, Simulator, TaskInstance, ToolSpec, make_cost_model

from .helpers import chain_task

TASK = ToolSpec("Task", "subagent", 0.5)


def tree(child_tool_s: float = 8.0):
    kids = tuple(chain_task(f"kid{i}", steps=3, first_prompt=800, tool_s=child_tool_s) for i in range(2))
    root = chain_task("root", steps=3, first_prompt=2000, tool_s=1.0)
    steps = list(root.steps)
    steps[0] = replace(steps[0], tools=(TASK,), spawns=kids)
    return replace(root, steps=tuple(steps))


def test_the_parent_waits_for_its_children_and_the_tree_is_one_task():
    cost = make_cost_model()
    alone = Simulator(cost, make_policy("apc-lru"), [TaskInstance("r", chain_task("root", steps=3, first_prompt=2000))],
                      SimConfig(workers=1)).run()
    res = Simulator(cost, make_policy("apc-lru"), [TaskInstance("r", tree())], SimConfig(workers=1)).run()
    assert len(res.tasks) == 1 and res.subagents == 2
    # Each child sleeps 2 x 8 s in tools: the root cannot go on before they are back.
    assert res.tasks[0].tct_s > 16.0 > alone.tasks[0].tct_s
    assert res.after_children_reusable_tokens > 0 and res.after_children_recomputed_tokens == 0  # KV was plentiful


def test_children_do_not_take_the_closed_loops_slots():
    cost = make_cost_model()
    insts = [TaskInstance(f"r{i}", tree()) for i in range(3)]
    res = Simulator(cost, make_policy("apc-lru"), insts, SimConfig(workers=1, concurrency=1)).run()
    starts = sorted(t.started_at for t in res.tasks)
    ends = sorted(t.finished_at for t in res.tasks)
    assert len(res.tasks) == 3 and res.subagents == 6
    assert starts[1] == pytest.approx(ends[0]) and starts[2] == pytest.approx(ends[1])  # one tree at a time


@pytest.mark.parametrize("policy, linked", [("saga", True), ("saga-no-trees", False)])
def test_saga_hears_each_childs_parent_unless_told_not_to(policy, linked):
    pol = make_policy(policy)
    seen = []
    accept = None

    def spy(event, caller=None):
        if type(event).__name__ == "SessionStart":
            seen.append((event.session_id, event.parent_id))
        return accept(event, caller)

    sim = Simulator(make_cost_model(), pol, [TaskInstance("r", tree())], SimConfig(workers=1))
    accept, pol.core.accept = pol.core.accept, spy
    sim.run()
    parents = {sid: parent for sid, parent in seen}
    assert parents["r"] == "" and len(parents) == 3
    assert all((parent == "r") == linked for sid, parent in parents.items() if sid != "r")


@pytest.mark.parametrize("policy, pinned", [("saga", True), ("saga-no-trees", False)])
def test_a_childs_start_decides_the_waiting_parents_pin_again_in_the_simulator(policy, pinned):
    from saga_server.core.holds import PINNED

    sim = Simulator(make_cost_model(), make_policy(policy), [TaskInstance("r", tree())], SimConfig(workers=1))
    kv = sim.workers[0].engine.kv
    pinned_at, ended_at = [], []
    follow, child_ended = kv.follow_core, sim._child_ended

    def spy_follow(now):
        holds = follow(now)
        pinned_at.extend(now for h in holds if h.session_id == "r" and h.tier == PINNED)
        return holds

    def spy_end(child):
        ended_at.append(sim.now)
        child_ended(child)

    kv.follow_core, sim._child_ended = spy_follow, spy_end
    sim.run()
    assert bool(pinned_at) == pinned
    if pinned:  # as its children start, not once one of them is back
        assert min(pinned_at) < min(ended_at)
