"""Learnt state across restarts (`saga_server.state_file`): what the core and the
proxy learnt comes back exactly, a bad file is a warning and a clean start, and
nothing of a prompt is written."""

from __future__ import annotations

import json
import logging
import random

import pytest

from saga_server.core import (
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core.quantiles import LogHistogram
from saga_server.core.tool_keys import GAP, NO_TOOL, ToolKey
from saga_server.proxy import SessionTracker
from saga_server.proxy.pauses import WorkflowPauses
from saga_server.state_file import FORMAT, StateFile, StateKeeper

from tests.fast.proxy.test_sessions import Agent, interleave, random_plan


def taught_core() -> WorkflowCore:
    """A core that learnt a workflow: 3 steps, a test run of ~20 s after the first,
    a grep of ~0.5 s after the second, and two 30 s subagents after the third."""
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    rng = random.Random(3)
    for n in range(12):
        sid = f"s{n}"
        core.accept(SessionStart(sid, clock(), tenant="t", workflow="coder"))
        for step, (tool, seconds) in enumerate((("pytest", 20.0), ("grep", 0.5), (None, 30.0))):
            core.accept(LlmCallStart(sid, clock()))
            clock.t += 1.0
            core.accept(LlmCallEnd(sid, clock(), prompt_tokens=1000 * (step + 1), output_tokens=50))
            if tool:
                core.accept(ToolCallStart(sid, clock(), tool, call_id=f"{n}.{step}"))
                clock.t += seconds * rng.uniform(0.8, 1.2)
                core.accept(ToolCallEnd(sid, clock(), tool, call_id=f"{n}.{step}"))
            else:
                core.accept(SessionStart(f"{sid}.kid", clock(), tenant="t", workflow="kid", parent_id=sid))
                clock.t += seconds
                core.accept(SessionEnd(f"{sid}.kid", clock()))
        core.accept(SessionEnd(sid, clock()))
    for n in range(12):  # another workflow whose test runs take 2 s: only the coder's own are 20 s
        sid = f"q{n}"
        core.accept(SessionStart(sid, clock(), tenant="t", workflow="quick"))
        core.accept(LlmCallStart(sid, clock()))
        clock.t += 1.0
        core.accept(LlmCallEnd(sid, clock(), prompt_tokens=500, output_tokens=20))
        core.accept(ToolCallStart(sid, clock(), "pytest", call_id="q"))
        clock.t += 2.0
        core.accept(ToolCallEnd(sid, clock(), "pytest", call_id="q"))
        core.accept(SessionEnd(sid, clock()))
    return core


def in_its_test_run(core: WorkflowCore, sid: str = "new") -> dict:
    """What the core predicts for a new session 1 s into its first test run."""
    clock = core._clock
    core.accept(SessionStart(sid, clock(), tenant="t", workflow="coder"))
    core.accept(LlmCallStart(sid, clock()))
    clock.t += 1.0
    core.accept(LlmCallEnd(sid, clock(), prompt_tokens=1000, output_tokens=50))
    core.accept(ToolCallStart(sid, clock(), "pytest", call_id="x"))
    clock.t += 1.0
    p = core.predict(sid)
    pin = core.pin_decision(sid, 4096, 0.2)
    return {"p_continue": p.p_continue, "resume_mean_s": p.resume_mean_s, "resume_p90_s": p.resume_p90_s,
            "growth": p.prompt_growth_tokens, "remaining_s": p.remaining_time_s, "pin": (pin.pin, pin.ttl_s)}


def waiting_on_its_subagent(core: WorkflowCore, sid: str = "parent") -> float:
    """How long the core expects a new coder session to wait on the subagent it
    started after its third call (the subagent's own workflow knows nothing)."""
    clock = core._clock
    core.accept(SessionStart(sid, clock(), tenant="t", workflow="coder"))
    for _ in range(3):
        core.accept(LlmCallStart(sid, clock()))
        core.accept(LlmCallEnd(sid, clock(), prompt_tokens=1000, output_tokens=50))
        core.accept(ToolCallStart(sid, clock(), "grep", call_id="g"))
        core.accept(ToolCallEnd(sid, clock(), "grep", call_id="g"))
    core.accept(SessionStart(f"{sid}.kid", clock(), tenant="t", workflow="fresh", parent_id=sid))
    return core.predict(sid).resume_mean_s


def test_a_restored_core_predicts_exactly_what_the_one_that_learnt_did():
    taught = taught_core()
    state = json.loads(json.dumps(taught.learnt()))  # through JSON, as on disk
    restored, cold = WorkflowCore(clock=ManualClock(taught._clock())), WorkflowCore(clock=ManualClock(taught._clock()))
    restored.restore_learnt(state)
    want = in_its_test_run(taught)
    assert in_its_test_run(restored) == want
    assert in_its_test_run(cold) != want  # it is what was learnt that makes the difference
    waits = waiting_on_its_subagent(taught)
    assert waiting_on_its_subagent(restored) == waits and waits != waiting_on_its_subagent(cold)
    assert restored.aeg.spawns_per_visit("coder", "after:grep|search") == taught.aeg.spawns_per_visit(
        "coder", "after:grep|search") > 0


def test_tools_are_written_by_name_and_read_back_as_the_same_keys():
    """The file names a tool "<tool>|<category>", a gap "~gap:o<k>" and no tool "",
    as files written before the core typed its keys do; a restore reads the names
    back into the same keys, so the restored core writes the same file."""
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.accept(SessionStart("h", clock(), workflow="w"))
    core.accept(LlmCallStart("h", clock()))
    core.accept(LlmCallEnd("h", clock(), prompt_tokens=100, output_tokens=10))
    core.accept(ToolCallStart("h", clock(), "pytest", call_id="1", category="test"))
    clock.t += 2.0
    core.accept(ToolCallEnd("h", clock(), "pytest", call_id="1"))
    core.accept(LlmCallStart("h", clock()))
    core.accept(SessionEnd("h", clock()))
    for _ in range(2):  # a session only the engine sees: the gaps between its requests
        core.on_request_arrival("e", 100)
        core.on_request_finished("e", 100, 5)
        clock.t += 3.0
    state = json.loads(json.dumps(core.learnt()))
    w, default = sorted(state["graphs"]["graphs"], key=lambda g: g["name"] != "w")
    assert (w["categories"], w["tools"]) == ({"pytest|test": "test"}, {"pytest|test": 1.0})
    start, after = w["nodes"]
    assert (start["tools"], list(start["edges"]), start["edges"]["pytest|test"]["succ"]) == (
        {"pytest|test": 1.0}, ["pytest|test"], {"after:pytest|test": 1.0})
    assert after["name"] == "after:pytest|test" and list(after["edges"]) == [""]
    assert default["categories"] == {"~gap:o3": "~gap"} and default["nodes"][0]["tools"] == {"~gap:o3": 1.0}

    restored = WorkflowCore(clock=ManualClock(clock()))
    restored.restore_learnt(state)
    assert restored.learnt() == state
    graphs = restored.aeg._graphs
    assert list(graphs["w"].nodes["start"].edges) == [ToolKey("pytest", "test")]
    assert list(graphs["w"].nodes["after:pytest|test"].edges) == [NO_TOOL]
    assert list(graphs["default"].durations) == [ToolKey("~gap:o3", GAP)]


def test_a_restored_histogram_answers_as_the_original():
    h = LogHistogram()
    for x in (0.01, 0.3, 2.0, 2.5, 40.0, 900.0):
        h.add(x)
    r = LogHistogram.from_state(json.loads(json.dumps(h.state())))
    assert [r.quantile(q) for q in (0.1, 0.5, 0.9)] == [h.quantile(q) for q in (0.1, 0.5, 0.9)]
    assert r.mean_above(1.0) == h.mean_above(1.0) and r.samples == h.samples
    assert LogHistogram.from_state(LogHistogram().state()).weight == 0


@pytest.mark.parametrize("mangle", [
    lambda s: {**s, "graphs": "x"},
    lambda s: {**s, "graphs": {"graphs": [{"name": ""}], "by_category": {}, "global": {}}},
    lambda s: {"graphs": {**s["graphs"], "global": {**s["graphs"]["global"], "counts": {"99999": 1}}}},
    lambda s: {"graphs": {**s["graphs"], "graphs": [{**s["graphs"]["graphs"][0], "cycle_mean": "soon"}]}},
])
def test_a_state_the_core_cannot_take_is_refused_and_changes_nothing(mangle):
    taught = taught_core()
    before = in_its_test_run(taught, "a")
    with pytest.raises(ValueError):
        taught.restore_learnt(mangle(taught.learnt()))
    assert in_its_test_run(taught, "b") == before


def test_the_proxys_learnt_pauses_come_back_and_no_prompt_text_is_written():
    rng = random.Random(5)
    tracker = SessionTracker(idle_min_s=1.0)
    agents = [Agent(f"agent{i}", random_plan(rng), rng) for i in range(40)]
    interleave(tracker, agents, rng)
    pauses = tracker.pauses
    for n in range(30):  # gaps of ~n s in the airline workflow, as `begin` learns them
        pauses.gap("w", float(n))
    learnt = json.loads(json.dumps(tracker.learnt()))
    again = SessionTracker(idle_min_s=1.0)
    again.restore_learnt(learnt)
    assert again.pauses.idle_timeout("w") == pauses.idle_timeout("w") < again.pauses.ceiling_s
    assert again.learnt() == learnt
    text = json.dumps(learnt)
    assert "airline" not in text and "booking" not in text and "agent0" not in text


def test_pauses_refuse_a_bad_state():
    p = WorkflowPauses()
    for bad in ({"workflows": [{"name": "w", "gaps": [-1], "resumed": 0, "quiet": 0}]},
                {"workflows": [{"name": "w", "gaps": [], "resumed": True, "quiet": 0}]}, {"workflows": 3}, []):
        with pytest.raises(ValueError):
            p.restore_learnt(bad)


def test_the_file_round_trips_and_a_bad_one_is_a_one_line_warning_and_a_clean_start(tmp_path, caplog):
    f = StateFile(tmp_path / "d" / "engine-1.json", "engine")
    assert f.load() is None and not [r for r in caplog.records if r.levelno >= logging.WARNING]  # missing: quiet
    f.save({"graphs": {"a": 1}})
    assert f.load() == {"graphs": {"a": 1}}
    assert json.loads(f.path.read_text())["format"] == FORMAT
    assert [p.name for p in f.path.parent.iterdir()] == ["engine-1.json"]  # no temporary file left
    doc = json.loads(f.path.read_text())
    cases = {
        "corrupt": b"{\"format\": \"saga-le",
        "checksum": json.dumps({**doc, "state": {"graphs": {"a": 2}}}).encode(),
        "format": json.dumps({**doc, "format": "saga-learnt/0"}).encode(),
        "component": json.dumps({**doc, "component": "proxy"}).encode(),
        "not an object": b"[1, 2]",
    }
    for name, raw in cases.items():
        f.path.write_bytes(raw)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="saga.state"):
            assert f.load() is None, name
        assert len(caplog.records) == 1 and "clean start" in caplog.records[0].getMessage(), name


def test_the_keeper_restores_at_start_writes_at_close_and_never_raises(tmp_path, caplog):
    taught = taught_core()
    path = tmp_path / "engine-1.json"
    first = StateKeeper(StateFile(path, "engine"), taught.learnt, taught.restore_learnt, interval_s=3600).start()
    assert not first.restored
    first.close()
    assert first.saves == 1 and path.exists()
    fresh = WorkflowCore(clock=ManualClock(taught._clock()))
    second = StateKeeper(StateFile(path, "engine"), fresh.learnt, fresh.restore_learnt, interval_s=3600).start()
    assert second.restored and in_its_test_run(fresh) == in_its_test_run(taught)
    second.close()
    # a state the process cannot take: a warning, a clean start
    StateFile(path, "engine").save({"graphs": {"graphs": "nope"}})
    cold = WorkflowCore(clock=ManualClock(taught._clock()))
    with caplog.at_level(logging.WARNING, logger="saga.state"):
        third = StateKeeper(StateFile(path, "engine"), cold.learnt, cold.restore_learnt, interval_s=3600).start()
    assert not third.restored and "cannot be taken" in caplog.text
    third._stop.set()
    # a write that fails (its directory is a file) is logged once, never raised
    (tmp_path / "blocked").write_text("")
    broken = StateKeeper(StateFile(tmp_path / "blocked" / "x.json", "engine"), cold.learnt, cold.restore_learnt)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="saga.state"):
        assert not broken.save() and not broken.save()
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1


def test_the_keeper_writes_periodically(tmp_path):
    taught = taught_core()
    keeper = StateKeeper(StateFile(tmp_path / "h.json", "hints"), taught.learnt, taught.restore_learnt,
                         interval_s=0.05).start()
    try:
        for _ in range(200):
            if keeper.saves >= 2:
                break
            import time
            time.sleep(0.02)
        assert keeper.saves >= 2
    finally:
        keeper.close()
