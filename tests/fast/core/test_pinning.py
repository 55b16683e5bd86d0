"""TTL pins: the decision rule, and pins under pressure in the core's order (the budget
and forward progress are the ledger's: test_holds)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_server.core import (
    LlmCallEnd,
    LlmCallStart,
    PinConfig,
    PinDecision,
    SessionEnd,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
    decide_pin,
)
from saga_server.core.holds import HoldLedger
from saga_server.engines.sim.cache import CountingPool

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


def test_a_clients_cache_ttl_is_a_floor_that_never_overrides_the_pools_facts() -> None:
    asked = 3600.0
    # The client's ask wins over SAGA's prediction: no reuse predicted, or the resume passed.
    assert decide_pin(0.1, _q(10), 5000, 0.0, CFG, client_ttl_s=asked) == PinDecision(True, asked, "client_ttl")
    assert decide_pin(0.9, _q(0), 5000, 0.5, CFG, client_ttl_s=asked) == PinDecision(True, asked * 0.5, "client_ttl")
    # A longer learnt pin stays SAGA's; a huge ask is capped.
    assert decide_pin(0.9, _q(1000), 5000, 0.0, CFG, client_ttl_s=60.0).reason == "pin"
    assert decide_pin(0.9, _q(0), 5000, 0.0, CFG, client_ttl_s=86400.0).ttl_s == CFG.max_client_ttl_s
    # SAGA's facts win over the ask: ended, too cheap to keep, a pool past the cutoff.
    assert decide_pin(0.0, _q(10), 5000, 0.0, CFG, client_ttl_s=asked).reason == "ended"
    assert decide_pin(0.9, _q(10), 10, 0.0, CFG, client_ttl_s=asked).reason == "cheap"
    assert decide_pin(0.9, _q(10), 5000, 0.99, CFG, client_ttl_s=asked).reason == "pressure"


def test_the_core_pins_by_the_ttl_the_sessions_latest_request_asked_for() -> None:
    from saga_server.core import ManualClock
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.on_request_arrival("s", 4000, cache_ttl_s=300.0)
    core.on_request_finished("s", 4000, 10)
    assert core.pin_decision("s", 4096, 0.0).ttl_s >= 300.0
    core.on_request_arrival("s", 4100)  # asked for nothing this time
    core.on_request_finished("s", 4100, 10)
    assert core.pin_decision("s", 4096, 0.0).reason != "client_ttl"
    with pytest.raises(ValueError):
        core.on_request_arrival("s", 1, cache_ttl_s=float("nan"))


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
    pool = CountingPool(200)  # blocks of 1k tokens: 30 held, 165 busy with running work
    pool.reserve("running", 165)
    ledger = HoldLedger(pool, 200, max_pin_fraction=0.5)
    for sid, tool, cat in (("grep-1", "grep", "search"), ("install", "pip install", "install"),
                           ("grep-2", "grep", "search")):
        core.accept(LlmCallStart(sid, t[0]))
        core.accept(LlmCallEnd(sid, t[0], prompt_tokens=10_000, output_tokens=100))
        core.accept(ToolCallStart(sid, t[0], tool, category=cat))
        d = core.pin_decision(sid, 10_100, 0.2)
        pool.reserve(sid, 10)
        held = ledger.hold(sid, range(10), key=core.eviction_priority(sid, 10_100, t[0]), now=t[0],
                           pin_ttl_s=d.ttl_s)
        pool.unreserve(sid)
        assert d.pin and held.pinned
    # Running work needs 15 blocks with 5 free: one pin must go, the install's.
    assert [r.session_id for r in ledger.make_room(15)] == ["install"]
    assert "grep-1" in ledger and "grep-2" in ledger
