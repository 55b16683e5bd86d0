"""SessionTable: bounded bookkeeping of what agents said they are doing."""

from __future__ import annotations

import pytest

from saga_server.core.events import (HintRejected, LlmCallEnd, LlmCallStart, SessionEnd, SessionStart,
                                     ToolCallEnd, ToolCallStart)
from saga_server.core import ManualClock, SessionPhase
from saga_server.core import SessionTable


def test_parallel_tool_calls_are_tracked_by_call_id():
    reg = SessionTable(clock=ManualClock())
    reg.accept(SessionStart("s", 0.0, tenant="t"))
    reg.accept(LlmCallStart("s", 1.0, step=1, node="agent"))
    reg.accept(LlmCallEnd("s", 2.0, step=1))
    reg.accept(ToolCallStart("s", 2.0, tool="search", call_id="a"))
    reg.accept(ToolCallStart("s", 2.0, tool="search", call_id="b"))
    reg.accept(ToolCallEnd("s", 3.0, call_id="a"))
    snap = reg.session("s")
    assert (snap.state, [t.call_id for t in snap.open_tools], snap.tool_calls) == (SessionPhase.TOOL, ["b"], 2)
    reg.accept(ToolCallEnd("s", 4.0, call_id="b"))
    assert reg.session("s").state == SessionPhase.IDLE
    with pytest.raises(HintRejected, match="already open"):
        reg.accept(ToolCallStart("s", 5.0, tool="x", call_id="c"))
        reg.accept(ToolCallStart("s", 5.0, tool="x", call_id="c"))


def test_events_without_a_start_create_the_session_but_ends_do_not():
    reg = SessionTable(clock=ManualClock())
    reg.accept(LlmCallStart("late", 1.0, step=3))
    assert reg.session("late").steps == 1
    with pytest.raises(HintRejected):
        reg.accept(SessionEnd("never-seen", 1.0))
    assert reg.session("never-seen") is None


def test_history_is_bounded_and_keeps_the_newest():
    reg = SessionTable(history_limit=4, clock=ManualClock())
    for step in range(10):
        reg.accept(LlmCallStart("s", float(step), step=step, node=f"n{step}"))
    assert [h.detail for h in reg.session("s").history] == ["n6", "n7", "n8", "n9"]


def test_ended_sessions_can_restart_and_expire_sooner():
    clock = ManualClock()
    reg = SessionTable(idle_ttl_s=100, ended_ttl_s=10, clock=clock)
    reg.accept(SessionStart("done", 0.0))
    reg.accept(SessionEnd("done", 0.0))
    reg.accept(SessionStart("idle", 0.0))
    with pytest.raises(HintRejected, match="already started"):
        reg.accept(SessionStart("idle", 1.0))
    clock.t = 11.0
    assert reg.expire() == ["done"]
    assert reg.session("idle") is not None
    reg.accept(SessionStart("done", 11.0))  # a new run under an old id starts afresh
    assert reg.session("done").state == SessionPhase.IDLE


def test_full_registry_makes_room_from_ended_sessions_first():
    reg = SessionTable(max_sessions=2, clock=ManualClock(0.0))  # event times are on this clock
    reg.accept(SessionStart("a", 0.0))
    reg.accept(SessionEnd("a", 0.0))
    reg.accept(SessionStart("b", 0.0))
    reg.accept(SessionStart("c", 0.0))  # "a" ended: it makes room
    assert reg.session("a") is None and reg.session("c") is not None
    with pytest.raises(HintRejected, match="too many sessions"):
        reg.accept(SessionStart("d", 0.0))
    assert reg.stats()["events_rejected"] == 1


def test_deadline_is_absolute_on_the_server_clock():
    reg = SessionTable(clock=ManualClock())
    reg.accept(SessionStart("s", 100.0, deadline_s=30.0))
    assert reg.session("s").deadline_at == 130.0


def test_ended_sessions_leave_after_their_ttl_even_behind_live_ones():
    reg = SessionTable(idle_ttl_s=100, ended_ttl_s=10, clock=ManualClock())
    reg.accept(SessionStart("live", 0.0))
    reg.accept(SessionStart("done", 1.0))
    reg.accept(SessionEnd("done", 1.0))
    reg.accept(LlmCallStart("other", 20.0))  # expiry runs with each hint
    assert reg.session("done") is None and reg.session("live") is not None
    assert reg.stats()["sessions_expired"] == 1


def test_a_session_waiting_on_its_user_outlives_the_idle_ttl_but_not_the_human_one():
    from saga_server.core import CoreConfig, WorkflowCore

    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(session_idle_s=100.0, human_idle_s=1000.0), clock=clock)
    for sid in ("person", "tool"):
        core.accept(SessionStart(sid, clock()))
        core.accept(LlmCallStart(sid, clock(), step=1))
        core.accept(LlmCallEnd(sid, clock(), step=1, prompt_tokens=100, output_tokens=10))
    core.accept(ToolCallStart("person", clock(), "human", call_id="h", category="human"))
    core.accept(ToolCallStart("tool", clock(), "bash", call_id="t", category="run"))
    clock.t = 500.0
    # Behind the person's session (least recently active), the tool's is still found expired.
    assert core.expire_idle() == ["tool"]
    assert core.session("person") is not None
    clock.t = 999.0
    assert core.expire_idle() == [] and core.session("person") is not None
    clock.t = 1001.0
    assert core.expire_idle() == ["person"]


def test_a_session_waiting_on_its_llm_call_outlives_the_idle_ttl_but_not_the_long_one():
    """A request queued for long in an overloaded engine sends no hints: its session is
    not idle, and forgetting it would throw its KV away just before the request runs."""
    from saga_server.core import CoreConfig, WorkflowCore

    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(session_idle_s=100.0, human_idle_s=1000.0), clock=clock)
    core.accept(SessionStart("queued", clock()))
    core.accept(LlmCallStart("queued", clock(), step=1))
    core.on_request_arrival("engine-only", 500)  # no hints: the engine's own record
    core.accept(SessionStart("done", clock()))
    core.accept(LlmCallStart("done", clock(), step=1))
    core.accept(LlmCallEnd("done", clock(), step=1, prompt_tokens=100, output_tokens=10))
    clock.t = 500.0
    assert core.expire_idle() == ["done"]
    assert core.session("queued") is not None and core.session("engine-only") is not None
    clock.t = 1001.0
    assert sorted(core.expire_idle()) == ["engine-only", "queued"]
