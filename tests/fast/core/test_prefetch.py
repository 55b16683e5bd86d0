"""Prefetch plans: start at resume - load - margin, gated by reuse and capacity."""

from __future__ import annotations

import math

import pytest

from saga_server.core import (
    LlmCallStart,
    PrefetchAction,
    PrefetchCandidate,
    PrefetchConfig,
    SessionEnd,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
    plan_prefetch,
)

CFG = PrefetchConfig(p_min=0.5, q_ready=0.25, margin_s=0.1, horizon_s=60.0)


def _est(table):
    return lambda sid, q: table[sid]


def test_start_time_is_resume_minus_load_minus_margin() -> None:
    plan = plan_prefetch([PrefetchCandidate("a", 1000, 2.0)], 10_000, 100.0, _est({"a": (0.9, 10.0)}), CFG)
    assert plan == [PrefetchAction("a", pytest.approx(100.0 + 10.0 - 2.0 - 0.1), 1000, "load",
                                   pytest.approx(110.0), 0.9)]


def test_late_loads_start_now_and_unlikely_or_far_ones_are_skipped() -> None:
    est = _est({"late": (0.9, 0.5), "unlikely": (0.2, 5.0), "ended": (0.0, math.inf), "far": (0.9, 500.0)})
    cands = [PrefetchCandidate(s, 100, 3.0) for s in ("late", "unlikely", "ended", "far")]
    plan = plan_prefetch(cands, 10_000, 0.0, est, CFG)
    assert [a.session_id for a in plan] == ["late"] and plan[0].start_at == 0.0


def test_capacity_admits_the_earliest_first() -> None:
    est = _est({"a": (0.9, 20.0), "b": (0.9, 5.0), "c": (0.95, 10.0)})
    cands = [PrefetchCandidate(s, 400, 1.0, "recompute" if s == "c" else "tier") for s in "abc"]
    plan = plan_prefetch(cands, 900, 0.0, est, CFG)
    assert [(a.session_id, a.kind) for a in plan] == [("b", "load"), ("c", "recompute")]


def test_bad_candidates_are_rejected() -> None:
    with pytest.raises(ValueError):
        plan_prefetch([PrefetchCandidate("a", -1, 1.0)], 100, 0.0, _est({"a": (1, 1)}), CFG)
    with pytest.raises(ValueError):
        plan_prefetch([PrefetchCandidate("a", 1, 1.0, "disk")], 100, 0.0, _est({"a": (1, 1)}), CFG)
    with pytest.raises(ValueError):
        plan_prefetch([], -5, 0.0, _est({}), CFG)


def test_core_plans_from_learned_tool_durations() -> None:
    t = [0.0]
    core = WorkflowCore(clock=lambda: t[0])
    for i in range(20):  # installs take 30 s and the agent continues afterwards
        sid = f"w{i}"
        core.accept(LlmCallStart(sid, 0.0))
        core.accept(ToolCallStart(sid, 0.0, "pip install", category="install"))
        core.accept(ToolCallEnd(sid, 30.0, "pip install"))
        core.accept(LlmCallStart(sid, 30.0))
        core.accept(SessionEnd(sid, 31.0))
    t[0] = 100.0
    core.accept(LlmCallStart("s", 100.0))
    core.accept(ToolCallStart("s", 100.0, "pip install", category="install"))
    t[0] = 110.0
    plan = core.plan_prefetch([PrefetchCandidate("s", 5000, 2.0), PrefetchCandidate("ghost", 10, 1.0)], 8000)
    assert [a.session_id for a in plan] == ["s"]
    assert plan[0].start_at == pytest.approx(130.0 - 2.0 - CFG.margin_s, abs=2.0)
