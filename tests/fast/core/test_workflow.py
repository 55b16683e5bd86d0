"""The WorkflowCore facade: HintSink contract, engine-only use, determinism."""

from __future__ import annotations

import math
import random

import pytest

import saga_server.core as core_pkg
from saga_server.core import (
    CoreConfig,
    HintRejected,
    HintSink,
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    PrefetchCandidate,
    SessionEnd,
    SessionPhase,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)


def test_public_api_is_curated() -> None:
    facade = {"WorkflowCore", "CoreConfig", "PinDecision", "Prediction", "PrefetchCandidate", "PrefetchAction"}
    assert facade <= set(core_pkg.__all__)
    assert all(hasattr(core_pkg, name) for name in core_pkg.__all__)
    core = WorkflowCore()
    for name in ("accept", "session", "sessions", "stats"):  # the HintSink protocol
        assert callable(getattr(core, name)) and hasattr(HintSink, name)


def test_rejected_hint_changes_nothing() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.accept(SessionStart("s", 0.0, tenant="a"))
    core.accept(LlmCallStart("s", 0.0))
    before = (core.predict("s"), core.session("s"))
    with pytest.raises(HintRejected):
        core.accept(ToolCallEnd("s", 1.0, "never-started"))
    with pytest.raises(HintRejected):
        core.accept(SessionStart("s", 1.0))  # already running
    assert (core.predict("s"), core.session("s")) == before
    assert core.stats()["events_rejected"] == 2


def test_snapshots_carry_predictions() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.accept(SessionStart("s", 0.0, tenant="a", workflow="w", deadline_s=60.0))
    core.accept(LlmCallStart("s", 0.0, node="plan"))
    core.accept(LlmCallEnd("s", 1.0, prompt_tokens=500, output_tokens=20))
    core.accept(ToolCallStart("s", 1.0, "grep", call_id="1", category="search"))
    snap = core.session("s")
    assert snap.state == SessionPhase.TOOL and snap.current_node == "plan" and snap.deadline_at == 60.0
    assert snap.metrics["context_tokens"] == 520.0
    assert 0.0 < snap.metrics["p_continue"] <= 1.0 and snap.metrics["resume_p90_s"] > 0
    assert [s.session_id for s in core.sessions(10)] == ["s"]
    assert core.sessions(10)[0].metrics["p_continue"] == snap.metrics["p_continue"]
    assert core.session("nobody") is None
    stats = core.stats()
    assert stats["aeg_sessions"] == 1 and stats["sessions_in_tool"] == 1


def test_request_before_its_hint_is_one_step() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.on_request_arrival("s", 700, tenant="a")
    core.accept(LlmCallStart("s", 0.0, node="plan"))
    core.accept(LlmCallEnd("s", 1.0, prompt_tokens=700, output_tokens=30))
    core.on_request_finished("s", 700, 30)
    tr = core.aeg.track("s")
    assert tr.steps == 1 and tr.hinted and tr.node == "plan" and tr.context_tokens == 730


def test_invalid_engine_input_is_rejected() -> None:
    core = WorkflowCore()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            core.on_request_arrival("s", bad)
    with pytest.raises(ValueError):
        core.record_service("a", -3)
    with pytest.raises(ValueError):
        core.pin_decision("s", 100, 2.0)
    with pytest.raises(ValueError):
        CoreConfig(max_sessions=0)
    assert core.aeg.track("s") is None  # nothing half-applied


def _drive(seed: int) -> list:
    """A random mixed workload; returns everything the core answered."""
    clock, rng = ManualClock(), random.Random(seed)
    core = WorkflowCore(clock=clock, seed=seed)
    out = []
    tools = [("grep", "search"), ("pytest", "test"), ("cat", "read"), ("pip install", "install")]
    for s in range(30):
        sid = f"s{s}"
        core.accept(SessionStart(sid, clock.t, tenant=f"t{s % 3}", workflow="w", deadline_s=300.0))
        for step in range(rng.randint(2, 8)):
            core.accept(LlmCallStart(sid, clock.t))
            clock.t += rng.uniform(0.5, 3.0)
            core.accept(LlmCallEnd(sid, clock.t, prompt_tokens=1000 + 200 * step, output_tokens=50))
            core.record_service(f"t{s % 3}", 1000)
            tool, cat = rng.choice(tools)
            core.accept(ToolCallStart(sid, clock.t, tool, call_id=str(step), category=cat))
            clock.t += rng.uniform(0.0, 0.5)
            out.append((core.predict(sid), core.pin_decision(sid, 1200, rng.random()),
                        core.eviction_priority(sid, 1200, clock.t), core.request_priority(sid),
                        core.plan_prefetch([PrefetchCandidate(sid, 1000, 0.1)], 5000)))
            clock.t += rng.expovariate(1.0)
            core.accept(ToolCallEnd(sid, clock.t, tool, call_id=str(step)))
        core.accept(SessionEnd(sid, clock.t))
    out.append([core.eviction_priority(f"s{i}", 1200, clock.t) for i in range(30)])
    return out


def test_deterministic_under_a_seed() -> None:
    assert _drive(5) == _drive(5)


def test_expiry_ends_silent_sessions_in_both_layers() -> None:
    clock = ManualClock()
    core = WorkflowCore(CoreConfig(session_idle_s=10.0), clock=clock)
    core.accept(SessionStart("s", 0.0))
    core.accept(LlmCallStart("s", 0.0))
    core.accept(LlmCallEnd("s", 0.0, prompt_tokens=10, output_tokens=2))  # not waiting on its call
    clock.t = 50.0
    core.accept(SessionStart("other", 50.0))
    assert core.aeg.track("s") is None
    core.sessions()  # listing expires idle registry records
    assert core.session("s") is None
    p = core.predict("s")  # unknown again: the prior
    assert p.p_continue == core.config.prior_p_continue and not math.isinf(p.resume_mean_s)


def test_concurrent_hint_streams_are_all_applied() -> None:
    import threading

    core = WorkflowCore()
    errors = []

    def agent(n: int) -> None:
        try:
            for s in range(20):
                sid = f"a{n}-{s}"
                core.accept(SessionStart(sid, 0.0, tenant=f"t{n}"))
                for step in range(5):
                    core.accept(LlmCallStart(sid, float(step)))
                    core.accept(ToolCallStart(sid, float(step), "grep", call_id=str(step), category="search"))
                    core.eviction_priority(sid, 1000, 0.0)
                    core.request_priority(sid)
                    core.accept(ToolCallEnd(sid, step + 0.5, "grep", call_id=str(step)))
                core.accept(SessionEnd(sid, 6.0))
        except Exception as exc:  # surfaced below: a thread's assert would vanish
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = core.stats()
    assert stats["events_accepted"] == 4 * 20 * (2 + 3 * 5)
    assert stats["sessions_ended"] == 80 and stats["aeg_tool_samples"] == 4 * 20 * 5


def test_engine_only_sessions_are_visible() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.accept(SessionStart("hinted", 0.0))
    clock.t = 1.0
    core.on_request_arrival("engine", 900, tenant="acme")
    snap = core.session("engine")
    assert snap.state == SessionPhase.LLM and snap.tenant == "acme" and snap.steps == 1
    assert snap.metrics["context_tokens"] == 900.0
    assert [s.session_id for s in core.sessions(10)] == ["engine", "hinted"]
    assert [s.session_id for s in core.sessions(1)] == ["engine"]


def test_prompt_growth_is_learned_whichever_of_request_and_hint_comes_first() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    for s in range(6):
        sid = f"s{s}"
        core.accept(SessionStart(sid, clock.t))
        prompt = 1000
        for step in range(4):
            if s % 2:  # the engine sees the request before the hint
                core.on_request_arrival(sid, prompt)
                core.accept(LlmCallStart(sid, clock.t))
            else:
                core.accept(LlmCallStart(sid, clock.t))
                core.on_request_arrival(sid, prompt)
            core.on_request_finished(sid, prompt, 50)
            core.accept(LlmCallEnd(sid, clock.t, prompt_tokens=prompt, output_tokens=50))
            core.accept(ToolCallStart(sid, clock.t, "cat", call_id=str(step), category="read"))
            clock.t += 0.2
            core.accept(ToolCallEnd(sid, clock.t, "cat", call_id=str(step)))
            prompt += 50 + 300  # answer plus a 300-token tool result
        core.accept(SessionEnd(sid, clock.t))
    core.accept(SessionStart("p", clock.t))
    core.accept(LlmCallStart("p", clock.t))
    core.accept(LlmCallEnd("p", clock.t, prompt_tokens=900, output_tokens=40))
    core.accept(ToolCallStart("p", clock.t, "cat", call_id="x", category="read"))
    assert core.predict("p").prompt_growth_tokens == pytest.approx(300.0)
    assert core.session("p").metrics["context_tokens"] == 940.0


def test_one_table_bounds_hinted_and_engine_only_sessions_together() -> None:
    clock = ManualClock()
    n = 4
    core = WorkflowCore(CoreConfig(max_sessions=n), clock=clock)
    refused = []
    for i in range(3 * n):
        clock.t += 1.0
        sid = f"s{i}"
        if i % 3 == 2:  # only the engine sees it: it must be served, so it always gets a place
            core.on_request_arrival(sid, 500, tenant="acme")
        else:
            try:
                core.accept(SessionStart(sid, clock.t, tenant="acme"))
                core.accept(LlmCallStart(sid, clock.t, node="plan"))
            except HintRejected:
                refused.append(sid)
            if i % 3 == 1 and sid not in refused:
                core.accept(SessionEnd(sid, clock.t))  # ended sessions give up their place first
        listed = core.sessions(100)
        assert len(core.table) <= n and len(listed) <= n and core.stats()["aeg_sessions"] <= n
        assert len({s.session_id for s in listed}) == len(listed)
    assert core.session(f"s{3 * n - 1}").state == SessionPhase.LLM  # the newest engine-only session is in
    assert refused  # a full table of live sessions refuses new hinted ones
    assert core.stats()["sessions_expired"] >= 3 * n - n - len(refused)


def test_a_hinted_session_shows_history_and_predictions_from_one_record() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.accept(SessionStart("s", 0.0, tenant="a", workflow="w"))
    core.on_request_arrival("s", 800)
    core.accept(LlmCallStart("s", 0.0, node="plan"))
    clock.t = 1.0
    core.accept(LlmCallEnd("s", 1.0, prompt_tokens=800, output_tokens=40))
    core.accept(ToolCallStart("s", 1.0, "pytest", call_id="1", category="test"))
    snap = core.session("s")
    assert [h.kind for h in snap.history] == ["session_start", "llm_call_start", "llm_call_end", "tool_call_start"]
    assert (snap.state, snap.workflow, snap.current_node, snap.steps) == (SessionPhase.TOOL, "w", "plan", 1)
    assert snap.metrics["context_tokens"] == 840.0 and snap.metrics["p_continue"] == core.predict("s").p_continue
    assert core.aeg.track("s") is core.table.by_id["s"]  # what the AEG tracks is the listed record
    assert core.stats()["sessions_live"] == core.stats()["aeg_sessions"] == 1


def test_a_start_hint_after_the_engine_saw_the_session_begins_its_hints() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.on_request_arrival("s", 700, tenant="acme")
    core.on_request_finished("s", 700, 20)
    core.accept(SessionStart("s", 0.0, tenant="acme", workflow="w", deadline_s=60.0))
    snap = core.session("s")
    assert (snap.workflow, snap.deadline_at, [h.kind for h in snap.history]) == ("w", 60.0, ["session_start"])
    with pytest.raises(HintRejected, match="already started"):
        core.accept(SessionStart("s", 0.0, workflow="w"))
