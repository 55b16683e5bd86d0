"""User turns (`saga_server.core.turns`): a deadline per turn, its outcomes, and how
many steps a turn takes."""

from __future__ import annotations

import pytest

from saga_server.core import (CoreConfig, LlmCallEnd, LlmCallStart, ManualClock, SessionEnd, SessionStart,
                              ToolCallEnd, ToolCallStart, WorkflowCore)
from saga_server.core.deadlines import AT_RISK, NORMAL, SLACK_RICH
from saga_server.core.events import Caller, TenantLimits


def _core() -> tuple[WorkflowCore, ManualClock]:
    clock = ManualClock(0.0)
    return WorkflowCore(CoreConfig(), clock=clock), clock


def _call(core: WorkflowCore, clock: ManualClock, sid: str, at: float, step: int = 1) -> None:
    clock.t = at
    core.accept(LlmCallStart(sid, at, step=step))
    core.accept(LlmCallEnd(sid, at, step=step, prompt_tokens=100, output_tokens=10))


def _hand_back(core: WorkflowCore, clock: ManualClock, sid: str, at: float, back_at: float) -> None:
    """The agent hands the turn to its user at `at`; the user replies at `back_at`."""
    clock.t = at
    core.accept(ToolCallStart(sid, at, tool="human", call_id=f"h{at}", category="human"))
    clock.t = back_at
    core.accept(ToolCallEnd(sid, back_at, tool="human", call_id=f"h{at}"))


def test_the_deadline_in_force_is_the_open_turns_and_none_while_the_user_is_away():
    core, clock = _core()
    core.accept(SessionStart("s", 0.0, tenant="a", turn_deadline_s=30.0))
    assert core.session("s").deadline_at == 30.0
    _call(core, clock, "s", 5.0)
    clock.t = 20.0
    core.accept(ToolCallStart("s", 20.0, tool="human", call_id="h1", category="human"))
    assert core.session("s").deadline_at is None  # the person's wait: no turn runs to be late
    clock.t = 600.0
    core.accept(ToolCallEnd("s", 600.0, tool="human", call_id="h1"))
    assert core.session("s").deadline_at == 630.0  # the next turn's clock starts at the reply


def test_a_task_deadline_that_comes_sooner_than_the_turns_stays_in_force():
    core, clock = _core()
    core.accept(SessionStart("s", 0.0, tenant="a", deadline_s=100.0, turn_deadline_s=30.0))
    assert core.session("s").deadline_at == 30.0
    _hand_back(core, clock, "s", 10.0, 90.0)
    assert core.session("s").deadline_at == 100.0  # the task's comes before the turn's (120)
    clock.t = 95.0
    core.accept(ToolCallStart("s", 95.0, tool="human", call_id="h2", category="human"))
    assert core.session("s").deadline_at == 100.0


def test_the_core_counts_each_tenants_turns_within_their_deadline():
    core, clock = _core()
    core.accept(SessionStart("s", 0.0, tenant="a", turn_deadline_s=10.0))
    core.accept(SessionStart("plain", 0.0, tenant="b"))  # no turn deadline: not counted
    _call(core, clock, "s", 1.0)
    _hand_back(core, clock, "s", 5.0, 300.0)  # within: 5 s of 10
    _call(core, clock, "s", 301.0, step=2)
    _hand_back(core, clock, "s", 315.0, 400.0)  # past: 15 s
    _call(core, clock, "s", 402.0, step=3)
    clock.t = 408.0
    core.accept(SessionEnd("s", 408.0))  # the last turn ends with the session: 8 s
    core.accept(SessionEnd("plain", 408.0))
    outcomes = core.tenant_outcomes()
    assert sorted(outcomes) == ["a"] and outcomes["a"].deadlines is None  # no task deadline was declared
    assert (outcomes["a"].turns.met, outcomes["a"].turns.missed) == (2, 1)
    assert outcomes["a"].turns.mean_slack_used == pytest.approx((0.5 + 1.5 + 0.8) / 3)


def test_a_reply_without_the_human_calls_end_still_starts_the_next_turn():
    core, clock = _core()
    core.accept(SessionStart("s", 0.0, tenant="a", turn_deadline_s=10.0))
    _call(core, clock, "s", 1.0)
    clock.t = 2.0
    core.accept(ToolCallStart("s", 2.0, tool="human", call_id="h", category="human"))
    clock.t = 50.0
    core.accept(LlmCallStart("s", 50.0, step=2))
    assert core.session("s").deadline_at == 60.0


def test_a_turn_deadline_below_the_tenants_floor_is_raised_to_it():
    core, clock = _core()
    caller = Caller("a", limits=TenantLimits(min_deadline_s=60.0))
    core.accept(SessionStart("s", 0.0, tenant="a", turn_deadline_s=1.0), caller)
    assert core.session("s", caller).deadline_at == 60.0
    assert core.stats()["deadline_clamped"] == 1


def test_a_subagent_started_in_a_turn_inherits_the_turns_deadline():
    core, clock = _core()
    core.accept(SessionStart("p", 0.0, tenant="a", turn_deadline_s=30.0))
    _call(core, clock, "p", 1.0)
    clock.t = 2.0
    core.accept(SessionStart("c", 2.0, tenant="a", parent_id="p"))
    assert core.session("c").deadline_at == 30.0


def _teach_turns(core: WorkflowCore, clock: ManualClock, steps_per_turn: int, sessions: int = 10) -> float:
    """Sessions of workflow `w` with two turns of `steps_per_turn` calls, 1 s apart,
    and a person's 1,000 s wait between them; returns the clock after them."""
    t = clock.t
    for i in range(sessions):
        sid = f"teach{i}"
        core.accept(SessionStart(sid, t, tenant="a", workflow="w"))
        step = 0
        for turn in range(2):
            for _ in range(steps_per_turn):
                step += 1
                t += 1.0
                _call(core, clock, sid, t, step)
            if turn == 0:
                _hand_back(core, clock, sid, t + 0.5, t + 1000.0)
                t += 1000.0
        t += 1.0
        clock.t = t
        core.accept(SessionEnd(sid, t))
    return t


def test_the_aeg_learns_steps_per_turn_and_a_pace_without_the_persons_waits():
    core, clock = _core()
    t = _teach_turns(core, clock, steps_per_turn=4)
    core.accept(SessionStart("new", t, tenant="a", workflow="w"))
    _call(core, clock, "new", t + 1.0)
    s = core.aeg.track("new")
    steps, secs = core.aeg.remaining_in_turn(s)
    assert steps == pytest.approx(3.0, rel=0.15)  # 4 per turn, 1 done
    assert secs == pytest.approx(3.0, rel=0.3)  # about 1 s a step: the 1,000 s waits are no part of it
    task_steps, _ = core.aeg.remaining(s)
    assert task_steps == pytest.approx(7.0, rel=0.15)  # the task has two turns


def test_urgency_compares_the_work_left_in_the_turn_with_the_turns_time_left():
    core, clock = _core()
    t = _teach_turns(core, clock, steps_per_turn=4)
    # A turn needs about 4 s of work: 12 s is ample, 4.5 s is tight. Against the whole
    # task's 8 steps the ample one would look short of slack.
    core.accept(SessionStart("ample", t, tenant="a", workflow="w", turn_deadline_s=12.0))
    core.accept(SessionStart("tight", t, tenant="a", workflow="w", turn_deadline_s=4.5))
    for sid in ("ample", "tight"):
        _call(core, clock, sid, t + 1.0)
    assert core.deadline_class("ample") == SLACK_RICH
    assert core.deadline_class("tight") == AT_RISK
    _hand_back(core, clock, "tight", t + 2.0, t + 5000.0)
    clock.t = t + 3.0
    core.accept(ToolCallStart("tight", t + 3.0, tool="human", call_id="again", category="human"))
    assert core.deadline_class("tight") == NORMAL  # waiting on its user: no deadline in force


def test_learnt_turn_lengths_survive_a_restart():
    core, clock = _core()
    t = _teach_turns(core, clock, steps_per_turn=4)
    fresh, fresh_clock = _core()
    fresh.restore_learnt(core.learnt())
    fresh_clock.t = t
    fresh.accept(SessionStart("new", t, tenant="a", workflow="w"))
    _call(fresh, fresh_clock, "new", t + 1.0)
    assert fresh.aeg.remaining_in_turn(fresh.aeg.track("new"))[0] == pytest.approx(3.0, rel=0.15)


def test_a_session_with_a_person_in_the_loop_ranks_by_its_running_turns_start():
    core, clock = _core()
    core.accept(SessionStart("old", 0.0, tenant="a"))
    _call(core, clock, "old", 1.0)
    _hand_back(core, clock, "old", 2.0, 100.0)  # its user's next turn starts at 100
    core.accept(SessionStart("new", 50.0, tenant="a"))  # started later, its turn earlier
    clock.t = 101.0
    core.accept(SessionStart("sub", 101.0, tenant="a", parent_id="old"))  # part of old's turn
    ranks = {sid: core.request_rank(sid, "a", 101.0)[1] for sid in ("old", "new", "sub")}
    assert ranks["new"] < ranks["old"] == ranks["sub"] == 100.0


def _turn_samples(core: WorkflowCore, workflow: str) -> int:
    graph = next(g for g in core.learnt()["graphs"]["graphs"] if g["name"] == workflow)
    return graph["turns"]["samples"] if graph["turns"] else 0


def test_a_turn_is_learnt_and_counted_once_however_the_user_leaves_it():
    core, clock = _core()
    core.accept(SessionStart("s", 0.0, tenant="a", workflow="w", turn_deadline_s=10.0))
    _call(core, clock, "s", 1.0)
    _hand_back(core, clock, "s", 2.0, 50.0)  # one turn of one call
    _hand_back(core, clock, "s", 51.0, 90.0)  # the user answered and was asked again: no work, no turn
    clock.t = 91.0
    core.accept(ToolCallStart("s", 91.0, tool="human", call_id="last", category="human"))
    core.accept(SessionEnd("s", 95.0))  # ended while its user was away
    assert _turn_samples(core, "w") == 1
    core.accept(SessionStart("t", 100.0, tenant="b", workflow="w"))
    _call(core, clock, "t", 101.0)
    _call(core, clock, "t", 102.0, step=2)
    clock.t = 103.0
    core.accept(ToolCallStart("t", 103.0, tool="human", call_id="h", category="human"))
    core.accept(SessionEnd("t", 110.0))  # its user never came back: the turn ended at the hand-back
    assert _turn_samples(core, "w") == 2
    turns = core.tenant_outcomes()["a"].turns
    assert (turns.met, turns.missed, turns.mean_slack_used) == (1, 0, pytest.approx(0.2))  # 2 s of 10


def test_a_session_first_seen_through_the_engine_ranks_by_its_start_once_hinted():
    core, clock = _core()
    clock.t = 100.0
    core.on_request_arrival("e", 500, tenant="a")  # the engine sees it first
    clock.t = 200.0
    core.accept(LlmCallStart("e", 200.0, step=1))  # its hints begin later
    assert core.request_rank("e", "a", 200.0)[1] == 100.0
