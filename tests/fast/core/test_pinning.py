"""TTL pins: the decision rule, and the budget invariant (never starve running work)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from saga_server.core import (
    LlmCallEnd,
    LlmCallStart,
    PinBudget,
    PinConfig,
    SessionEnd,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
    decide_pin,
)

CFG = PinConfig()


def _q(scale: float):
    return lambda q: scale * q  # a remaining-time quantile function that grows with q


def test_pin_rules_in_order() -> None:
    assert decide_pin(0.0, _q(10), 5000, 0.1, CFG).reason == "ended"
    assert decide_pin(0.1, _q(10), 5000, 0.1, CFG).reason == "unlikely_reuse"
    assert decide_pin(0.9, _q(10), 10, 0.1, CFG).reason == "cheap"
    assert decide_pin(0.9, _q(10), 5000, 0.99, CFG).reason == "pressure"
    assert decide_pin(0.9, _q(0), 5000, 0.1, CFG).reason == "tool_done"
    d = decide_pin(0.9, _q(10), 5000, 0.0, CFG)
    assert d.pin and d.ttl_s == pytest.approx(10 * CFG.q_high)


@settings(max_examples=100, deadline=None)
@given(lo=st.floats(0.0, 0.94), hi=st.floats(0.0, 0.94), scale=st.floats(0.01, 1000))
def test_ttl_shrinks_as_pressure_rises(lo, hi, scale) -> None:
    lo, hi = min(lo, hi), max(lo, hi)
    a = decide_pin(0.9, _q(scale), 5000, lo, CFG)
    b = decide_pin(0.9, _q(scale), 5000, hi, CFG)
    assert b.ttl_s <= a.ttl_s + 1e-12
    assert a.ttl_s <= CFG.max_ttl_s


def test_bad_inputs_are_rejected() -> None:
    with pytest.raises(ValueError):
        decide_pin(0.9, _q(1), 100, 1.5, CFG)
    with pytest.raises(ValueError):
        decide_pin(0.9, _q(1), -1, 0.5, CFG)
    with pytest.raises(ValueError):
        PinConfig(q_low=0.9, q_high=0.5)
    with pytest.raises(ValueError):
        PinBudget(100, max_fraction=1.5)
    with pytest.raises(ValueError):
        PinBudget(100).pin("s", -1, 1.0, 0.0)


def test_core_pins_for_the_tool_and_not_at_the_end() -> None:
    t = [0.0]
    core = WorkflowCore(clock=lambda: t[0])
    for i in range(20):  # test runs take ~20 s; after "submit" sessions end
        sid = f"w{i}"
        core.accept(LlmCallStart(sid, t[0]))
        core.accept(ToolCallStart(sid, t[0], "pytest", category="test"))
        core.accept(ToolCallEnd(sid, t[0] + 20.0, "pytest"))
        core.accept(LlmCallStart(sid, t[0] + 21.0))
        core.accept(ToolCallStart(sid, t[0] + 21.0, "submit", category="submit"))
        core.accept(ToolCallEnd(sid, t[0] + 21.1, "submit"))
        core.accept(SessionEnd(sid, t[0] + 21.2))
    core.accept(LlmCallStart("s", t[0]))
    core.accept(LlmCallEnd("s", t[0], prompt_tokens=9000, output_tokens=100))
    core.accept(ToolCallStart("s", t[0], "pytest", category="test"))
    calm = core.pin_decision("s", 9100, 0.0)
    tight = core.pin_decision("s", 9100, 0.8)
    assert calm.pin and 15.0 <= calm.ttl_s <= 30.0
    assert tight.pin and tight.ttl_s < calm.ttl_s
    core.accept(ToolCallEnd("s", t[0] + 20.0, "pytest"))
    core.accept(LlmCallStart("s", t[0] + 20.0))
    core.accept(ToolCallStart("s", t[0] + 20.0, "submit", category="submit"))
    assert core.pin_decision("s", 9100, 0.0).reason == "unlikely_reuse"
    assert core.pin_decision("nobody", 9100, 0.0).reason == "unknown_session"


def test_reclaim_releases_until_the_demand_fits() -> None:
    b = PinBudget(1000, max_fraction=0.6)
    assert b.pin("a", 200, 10.0, 0.0) and b.pin("b", 300, 20.0, 0.0)
    assert not b.pin("c", 200, 5.0, 0.0)  # would cross 600: refused, nothing changed
    assert b.pinned_tokens == 500 and "c" not in b
    assert b.reclaim(need_tokens=650, free_tokens=500) == ["a"]  # soonest expiry first
    assert b.reclaim(need_tokens=100, free_tokens=500) == []
    assert b.expire(25.0) == ["b"] and b.pinned_tokens == 0


class PinBudgetMachine(RuleBasedStateMachine):
    """Random pins, re-pins, releases, expiries and demands."""

    def __init__(self) -> None:
        super().__init__()
        self.cap = 10_000
        self.budget = PinBudget(self.cap, max_fraction=0.4)
        self.now = 0.0

    @rule(sid=st.integers(0, 15), tokens=st.integers(0, 3000), ttl=st.floats(0.0, 50.0))
    def pin(self, sid, tokens, ttl):
        before = self.budget.pinned_tokens
        ok = self.budget.pin(f"s{sid}", tokens, ttl, self.now)
        if not ok:
            assert self.budget.pinned_tokens == before

    @rule(sid=st.integers(0, 15))
    def release(self, sid):
        self.budget.release(f"s{sid}")

    @rule(dt=st.floats(0.0, 20.0))
    def tick(self, dt):
        self.now += dt
        self.budget.expire(self.now)
        assert all(exp > self.now for _, exp in self.budget.pins().values())

    @rule(need=st.integers(0, 10_000), busy=st.integers(0, 10_000))
    def demand(self, need, busy):
        """Running work holds `busy` tokens and needs `need` more: reclaim must
        free enough, unless pins alone cannot (then it releases every pin)."""
        busy = min(busy, self.cap - self.budget.pinned_tokens)
        free = self.cap - busy - self.budget.pinned_tokens
        self.budget.reclaim(need, free)
        free_after = self.cap - busy - self.budget.pinned_tokens
        assert free_after >= need or len(self.budget) == 0

    @invariant()
    def within_budget(self):
        assert 0 <= self.budget.pinned_tokens <= self.budget.limit_tokens
        assert self.budget.pinned_tokens == sum(t for t, _ in self.budget.pins().values())


TestPinBudget = PinBudgetMachine.TestCase
TestPinBudget.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_pressure_releases_pins_in_the_cores_order() -> None:
    t = [0.0]
    core = WorkflowCore(clock=lambda: t[0])
    for i in range(20):  # greps take 0.2 s, installs 40 s; agents continue after both
        for tool, cat, d in (("grep", "search", 0.2), ("pip install", "install", 40.0)):
            sid = f"w{i}{cat}"
            core.accept(LlmCallStart(sid, 0.0))
            core.accept(ToolCallStart(sid, 0.0, tool, category=cat))
            core.accept(ToolCallEnd(sid, d, tool))
            core.accept(LlmCallStart(sid, d))
            core.accept(SessionEnd(sid, d + 1))
    t[0] = 100.0
    budget = PinBudget(100_000, max_fraction=0.5)
    for sid, tool, cat in (("grep-1", "grep", "search"), ("install", "pip install", "install"),
                           ("grep-2", "grep", "search")):
        core.accept(LlmCallStart(sid, t[0]))
        core.accept(LlmCallEnd(sid, t[0], prompt_tokens=10_000, output_tokens=100))
        core.accept(ToolCallStart(sid, t[0], tool, category=cat))
        d = core.pin_decision(sid, 10_100, 0.2)
        assert d.pin and budget.pin(sid, 10_100, d.ttl_s, t[0])
    # Running work needs 15k tokens with 5k free: one pin must go, the install's.
    assert budget.reclaim(15_000, 5_000, core.reclaim_order) == ["install"]
    assert "grep-1" in budget and "grep-2" in budget
