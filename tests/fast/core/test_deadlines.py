"""Deadline-aware shaping (`saga_server.core.deadlines`): classes, holds, thin prefill."""

from __future__ import annotations

import pytest

from saga_server.core import CoreConfig, LlmCallStart, ManualClock, SessionEnd, SessionStart, WorkflowCore
from saga_server.core.deadlines import (AT_RISK, DRAIN_FACTOR, NORMAL, SLACK_RICH, DeadlineShaper, ShapingConfig,
                                        deadline_class)


def test_classes_follow_urgency_and_only_sessions_with_a_deadline_are_classed():
    cfg = ShapingConfig()
    assert deadline_class(None, cfg) == NORMAL  # no deadline: no slack stated
    assert deadline_class(0.1, cfg) == SLACK_RICH
    assert deadline_class(cfg.slack_rich, cfg) == SLACK_RICH
    assert deadline_class(0.5, cfg) == NORMAL
    assert deadline_class(cfg.at_risk, cfg) == AT_RISK
    assert deadline_class(0.1, ShapingConfig(enabled=False)) == NORMAL
    # slack judged by the upper estimate of what remains: a wide spread is no slack
    assert deadline_class(0.1, cfg, u_upper=0.3) == SLACK_RICH
    assert deadline_class(0.1, cfg, u_upper=0.5) == NORMAL
    assert deadline_class(0.8, cfg, u_upper=2.0) == AT_RISK
    with pytest.raises(ValueError):
        ShapingConfig(slack_rich=0.8, at_risk=0.7)
    with pytest.raises(ValueError):
        ShapingConfig(confidence=1.0)


def _shaper(classes: dict[str, str]) -> DeadlineShaper:
    return DeadlineShaper(lambda sid: classes.get(sid, NORMAL), prefill_budget_tokens=256)


def test_slack_rich_requests_are_held_while_an_at_risk_request_waits():
    classes = {"tight": AT_RISK, "loose": SLACK_RICH, "plain": NORMAL}
    sh = _shaper(classes)
    assert not sh.holds_back(2, "loose", "a")  # nobody at risk: nothing held
    assert sh.arrived(1, "tight", "a") == AT_RISK and sh.at_risk() == 1
    assert sh.holds_back(2, "loose", "a")  # waiting: even its own tenant's slack gives way
    assert not sh.holds_back(3, "plain", "a") and not sh.holds_back(4, "tight", "a")
    classes["loose"] = NORMAL  # its slack ran low: it goes ahead
    assert not sh.holds_back(2, "loose", "a")
    classes["loose"] = SLACK_RICH
    classes["tight"] = SLACK_RICH  # its estimate changed: its own request still goes ahead
    assert not sh.holds_back(1, "tight", "a")
    sh.finished(1)
    sh.finished(1)  # idempotent
    assert sh.at_risk() == 0 and not sh.holds_back(2, "loose", "a")
    assert sh.held == 1


def test_while_an_at_risk_request_runs_only_other_tenants_slack_gives_way():
    """Running, it is slowed by the batch beside it: another tenant's slack-rich
    requests stay out of it; its own tenant's queue order already serves it."""
    classes = {"tight": AT_RISK, "loose": SLACK_RICH}
    sh = _shaper(classes)
    sh.arrived(1, "tight", "browser")
    sh.scheduled(1)
    assert sh.at_risk() == 1
    assert sh.holds_back(2, "loose", "coding")
    assert not sh.holds_back(3, "loose", "browser")
    sh.arrived(5, "tight", "coding")  # a coding request at risk too, running
    sh.scheduled(5)
    assert sh.holds_back(3, "loose", "browser") and sh.holds_back(2, "loose", "coding")
    sh.finished(1)
    assert not sh.holds_back(2, "loose", "coding") and sh.holds_back(3, "loose", "browser")
    sh.finished(5)
    assert not sh.holds_back(3, "loose", "browser")


def test_prefill_is_thinned_while_someone_is_at_risk_except_an_at_risk_prefill():
    sh = _shaper({"tight": AT_RISK})
    assert sh.prefill_budget(7, 0.02) == 0  # nobody at risk: the engine's own budget
    sh.arrived(1, "tight", "a")
    assert sh.prefill_budget(7, 0.02) == 256  # someone else's prefill is first in line
    assert sh.prefill_budget(1, 0.02) == 0  # the at-risk request's own prefill: full budget
    assert sh.prefill_budget(None, 0.02) == 0
    with pytest.raises(ValueError):
        DeadlineShaper(lambda sid: NORMAL, prefill_budget_tokens=0)


def test_the_thin_budget_keeps_up_with_twice_the_prefill_arriving():
    """Below the arrival rate the line of prefills would grow for as long as someone
    is at risk; the floor is DRAIN_FACTOR x the tokens arriving per iteration."""
    sh = _shaper({"tight": AT_RISK})
    sh.arrived(1, "tight", "a")
    for t in range(3000):  # 30,000 prefill tokens a second for five minutes: the rate settles
        sh.prefill_queued(3000, t / 10)
    rate = sh.prefill_budget(7, 0.1) / (DRAIN_FACTOR * 0.1)
    assert 0.9 * 30_000 < rate < 1.1 * 30_000
    assert sh.prefill_budget(7, 0.1) > 256
    assert sh.prefill_budget(7, 0.001) == 256  # a fast iteration: the piggyback budget is larger
    assert sh.prefill_budget(1, 0.1) == 0  # the at-risk prefill still runs the full budget
    for t in range(3000, 6000):  # no more prefill arriving: the floor falls back
        sh.prefill_queued(0, t / 10)
    assert sh.prefill_budget(7, 0.1) == 256


def test_core_classes_a_session_by_its_expected_remaining_time_over_time_left():
    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(prior_cycle_s=5.0, prior_p_continue=0.9), clock=clock)
    # the prior: 9 more steps of 5 s = 45 s remaining
    core.accept(SessionStart("tight", 0.0, tenant="t", workflow="w", deadline_s=50.0))
    core.accept(SessionStart("loose", 0.0, tenant="t", workflow="w", deadline_s=1000.0))
    core.accept(SessionStart("free", 0.0, tenant="t", workflow="w"))
    for sid in ("tight", "loose", "free"):
        core.accept(LlmCallStart(sid, 0.0, step=0))
    assert core.deadline_class("tight") == AT_RISK
    assert core.deadline_class("loose") == SLACK_RICH
    assert core.deadline_class("free") == NORMAL
    assert core.deadline_class("unknown") == NORMAL
    clock.t = 60.0  # past its deadline: nothing can bring it in time any more
    assert core.deadline_class("tight") == NORMAL
    core.accept(SessionEnd("loose", 60.0))
    assert core.deadline_class("loose") == NORMAL


def _finish_sessions(core: WorkflowCore, clock: ManualClock, lengths) -> None:
    """Sessions of workflow `w` that ran these many steps, a second apart, and ended."""
    for n, length in enumerate(lengths):
        sid = f"s{n}"
        core.accept(SessionStart(sid, clock.t, tenant="t", workflow="w"))
        for k in range(length):
            clock.t += 1.0
            core.accept(LlmCallStart(sid, clock.t, step=k))
        core.accept(SessionEnd(sid, clock.t))


def test_remaining_steps_come_from_the_lengths_seen_given_how_far_a_session_got():
    """Half the sessions run 2 steps, half 20: at the start about 10 remain; one that
    passed step 2 is a long one, with about 17 to go (not the mean's 10 - 3)."""
    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(min_samples=4), clock=clock)
    _finish_sessions(core, clock, (2, 20) * 6)
    core.accept(SessionStart("new", clock.t, tenant="t", workflow="w"))
    core.accept(LlmCallStart("new", clock.t, step=0))
    steps_new, _ = core.aeg.remaining(core.aeg.track("new"))
    assert 8.0 <= steps_new <= 11.0
    for k in (1, 2):
        clock.t += 1.0
        core.accept(LlmCallStart("new", clock.t, step=k))
    steps_long, _ = core.aeg.remaining(core.aeg.track("new"))
    assert 15.0 <= steps_long <= 19.0


def test_the_remaining_quantile_comes_from_the_lengths_seen():
    """Half the sessions run 2 steps, half 20: nine in ten finish within about 19 more
    from the start, though the mean is about 10; the prior's geometric length has a
    quantile too."""
    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(min_samples=4, prior_cycle_s=5.0, prior_p_continue=0.9), clock=clock)
    core.accept(SessionStart("first", 0.0, tenant="t", workflow="w"))
    core.accept(LlmCallStart("first", 0.0, step=0))
    rec = core.aeg.track("first")
    assert core.aeg.remaining(rec)[0] == pytest.approx(9.0)
    assert core.aeg.remaining(rec, 0.9)[0] == 21.0  # P(more than 21 steps) = 0.9^22 < 0.1
    _finish_sessions(core, clock, (2, 20) * 6)
    core.accept(SessionStart("new", clock.t, tenant="t", workflow="w"))
    core.accept(LlmCallStart("new", clock.t, step=0))
    rec = core.aeg.track("new")
    assert 8.0 <= core.aeg.remaining(rec)[0] <= 11.0
    assert 17.0 <= core.aeg.remaining(rec, 0.9)[0] <= 22.0


def test_a_session_is_slack_rich_only_if_it_has_slack_by_the_upper_estimate():
    """Sessions of 2 or 40 steps: one at its start has slack on the mean (21 steps
    to go) but not if it is a long one, so it is not held."""
    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(min_samples=4), clock=clock)
    _finish_sessions(core, clock, (2, 40) * 6)
    core.accept(SessionStart("new", clock.t, tenant="t", workflow="w", deadline_s=80.0))
    core.accept(LlmCallStart("new", clock.t, step=0))
    rec = core.aeg.track("new")
    mean_s, upper_s = core.aeg.remaining(rec)[1], core.aeg.remaining(rec, 0.9)[1]
    assert mean_s <= 0.35 * 80.0 < upper_s  # slack-rich by the mean, not by the quantile
    assert core.deadline_class("new") == NORMAL
    core.accept(SessionStart("ample", clock.t, tenant="t", workflow="w", deadline_s=upper_s / 0.3))
    core.accept(LlmCallStart("ample", clock.t, step=0))
    assert core.deadline_class("ample") == SLACK_RICH


def test_the_core_counts_each_tenants_tasks_within_their_deadline():
    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(), clock=clock)
    core.accept(SessionStart("fast", 0.0, tenant="a", deadline_s=10.0))
    core.accept(SessionStart("slow", 0.0, tenant="a", deadline_s=10.0))
    core.accept(SessionStart("child", 1.0, tenant="a", parent_id="slow"))  # part of its root's task
    core.accept(SessionStart("free", 0.0, tenant="b"))  # no deadline: not counted
    for sid, t in (("fast", 5.0), ("child", 14.0), ("slow", 15.0), ("free", 15.0)):
        clock.t = t
        core.accept(SessionEnd(sid, t))
    outcomes = core.tenant_outcomes()
    assert sorted(outcomes) == ["a"] and outcomes["a"].turns is None
    assert (outcomes["a"].deadlines.met, outcomes["a"].deadlines.missed) == (1, 1)
    assert outcomes["a"].deadlines.mean_slack_used == pytest.approx((0.5 + 1.5) / 2)

