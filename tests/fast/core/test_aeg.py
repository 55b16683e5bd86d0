"""AEG: convergence on synthetic Markov workflows, inference without hints, bounds."""

from __future__ import annotations

import math
import random

import pytest

from saga_server.core import (
    AEG,
    CoreConfig,
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
    WorkflowNode,
    WorkflowStructure,
)
from saga_server.core.tool_keys import GAP

# A workflow with named LLM nodes. At a node the agent picks a tool; after
# (node, tool) it moves to the next node or ends. Tool durations: log-normal.
TOOLS = {"plan": {"search": 0.7, "read": 0.3},
         "code": {"edit": 0.6, "run": 0.4},
         "verify": {"test": 0.8, "git": 0.2}}
NEXT = {("plan", "search"): {"code": 0.8, "plan": 0.2},
        ("plan", "read"): {"code": 1.0},
        ("code", "edit"): {"verify": 0.7, "code": 0.3},
        ("code", "run"): {"code": 0.5, "verify": 0.5},
        ("verify", "test"): {"$end": 0.3, "code": 0.7},
        ("verify", "git"): {"$end": 1.0}}
MEDIAN_S = {"search": 0.2, "read": 0.25, "edit": 0.3, "run": 1.0, "test": 5.0, "git": 0.3}


def _pick(rng: random.Random, dist: dict[str, float]) -> str:
    r, acc = rng.random(), 0.0
    for k, p in dist.items():
        acc += p
        if r < acc:
            return k
    return k


def _run_markov(core: WorkflowCore, clock: ManualClock, rng: random.Random, sessions: int, named: bool):
    """Drives sessions through the chain; scores predictions made before each outcome.
    Returns per-session lists of (hit_tool, best_tool, hit_next, best_next, covered_p90)."""
    scores = []
    for s in range(sessions):
        sid = f"s{s}"
        core.accept(SessionStart(sid, clock.t, tenant="t", workflow="markov"))
        node = "plan"
        rec = []
        for _ in range(200):
            core.accept(LlmCallStart(sid, clock.t, node=node if named else ""))
            guess_tool = core.predict(sid).next_tool_category
            tool = _pick(rng, TOOLS[node])
            clock.t += 1.0
            core.accept(LlmCallEnd(sid, clock.t, prompt_tokens=1000, output_tokens=50))
            core.accept(ToolCallStart(sid, clock.t, tool, call_id="c", category=tool))
            pred = core.predict(sid)
            dur = MEDIAN_S[tool] * math.exp(0.5 * rng.gauss(0.0, 1.0))
            nxt = _pick(rng, NEXT[(node, tool)])
            clock.t += dur
            core.accept(ToolCallEnd(sid, clock.t, tool, call_id="c"))
            cont = {k: v for k, v in NEXT[(node, tool)].items() if k != "$end"}
            best_next = max(cont.values()) / sum(cont.values()) if cont else None
            rec.append((guess_tool == tool, max(TOOLS[node].values()),
                        None if nxt == "$end" else pred.next_node == nxt,
                        None if nxt == "$end" else best_next, dur <= pred.resume_p90_s))
            if nxt == "$end":
                break
            node = nxt
        core.accept(SessionEnd(sid, clock.t))
        clock.t += 1.0
        scores.append(rec)
    return scores


def test_named_markov_workflow_converges_to_the_best_possible_predictions() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock, seed=1)
    scores = _run_markov(core, clock, random.Random(7), 500, named=True)
    late = [r for rec in scores[100:] for r in rec]
    tool_acc = sum(r[0] for r in late) / len(late)
    tool_best = sum(r[1] for r in late) / len(late)
    nxt = [r for r in late if r[2] is not None]
    next_acc = sum(r[2] for r in nxt) / len(nxt)
    next_best = sum(r[3] for r in nxt) / len(nxt)
    coverage = sum(r[4] for r in late) / len(late)
    assert tool_acc >= tool_best - 0.05, (tool_acc, tool_best)
    assert next_acc >= next_best - 0.05, (next_acc, next_best)
    assert 0.85 <= coverage <= 0.95, coverage
    # p_continue on the edges that may end approaches the chain's 0.7 and 0.0.
    clock.t += 10
    core.accept(SessionStart("probe", clock.t, workflow="markov"))
    core.accept(LlmCallStart("probe", clock.t, node="verify"))
    core.accept(ToolCallStart("probe", clock.t, "test", call_id="a", category="test"))
    assert core.predict("probe").p_continue == pytest.approx(0.7, abs=0.07)
    core.accept(ToolCallEnd("probe", clock.t, "test", call_id="a"))
    core.accept(LlmCallStart("probe", clock.t, node="verify"))
    core.accept(ToolCallStart("probe", clock.t, "git", call_id="b", category="git"))
    assert core.predict("probe").p_continue < 0.1


def test_inferred_nodes_learn_a_tool_markov_chain() -> None:
    """No node names: nodes are "after:<tool>", a first-order chain over tools."""
    chain = {"search": {"read": 0.7, "edit": 0.3}, "read": {"edit": 0.6, "search": 0.4},
             "edit": {"test": 0.8, "edit": 0.2}, "test": {"edit": 0.5, "submit": 0.5}}
    clock, rng = ManualClock(), random.Random(3)
    core = WorkflowCore(clock=clock)
    hits = best = n = 0
    for s in range(300):
        sid = f"x{s}"
        core.accept(SessionStart(sid, clock.t, workflow="infer"))
        tool = "search"
        for step in range(100):
            core.accept(LlmCallStart(sid, clock.t))
            guess = core.predict(sid).next_tool_category
            if step > 0 and s >= 50:
                hits += guess == tool
                best += max(chain[prev].values())
                n += 1
            core.accept(ToolCallStart(sid, clock.t, "bash", call_id=str(step), category=tool))
            clock.t += 0.3
            core.accept(ToolCallEnd(sid, clock.t, "bash", call_id=str(step)))
            if tool == "submit":
                break
            prev, tool = tool, _pick(rng, chain[tool])
        core.accept(SessionEnd(sid, clock.t))
    assert hits / n >= best / n - 0.05, (hits / n, best / n)


def test_engine_events_alone_build_an_inferred_graph() -> None:
    """Without hints: short answers are followed by a ~2 s gap and another request;
    a long answer ends the session (it goes quiet and expires)."""
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    idle = core.config.session_idle_s
    for s in range(40):
        sid = f"e{s}"
        for step in range(5):
            core.on_request_arrival(sid, 1000 + 100 * step, tenant="acme")
            clock.t += 1.0
            final = step == 4
            core.on_request_finished(sid, 1000 + 100 * step, 900 if final else 20)
            clock.t += 2.0 if not final else 0.0
        clock.t += 5.0
    clock.t += idle + 1  # the quiet sessions expire: recorded as ended
    core.on_request_arrival("probe", 1000, tenant="acme")
    clock.t += 1.0
    core.on_request_finished("probe", 1000, 20)
    short = core.predict("probe")
    assert short.p_continue > 0.8
    assert short.resume_p50_s == pytest.approx(2.0, rel=0.2)
    assert short.prompt_growth_tokens == pytest.approx(100 - 20, abs=5)
    core.on_request_arrival("probe2", 1000, tenant="acme")
    for step in range(4):
        core.on_request_finished("probe2", 1000, 20)
        clock.t += 2.0
        core.on_request_arrival("probe2", 1100, tenant="acme")
    core.on_request_finished("probe2", 1100, 900)
    assert core.predict("probe2").p_continue < 0.3


def test_declared_structure_guides_predictions_before_any_data() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    structure = WorkflowStructure(
        nodes=(WorkflowNode("agent"), WorkflowNode("lookup", "tool"), WorkflowNode("answer"),
               WorkflowNode("done", "end")),
        edges=(("agent", "lookup"), ("lookup", "answer"), ("answer", "done")))
    core.accept(SessionStart("d", 0.0, workflow="declared", structure=structure))
    core.accept(LlmCallStart("d", 0.0, node="agent"))
    core.accept(ToolCallStart("d", 0.0, "lookup", call_id="1"))
    assert core.predict("d").next_node == "answer"


def test_tool_duration_fallbacks_category_then_hint_then_global() -> None:
    aeg = AEG(min_samples=4)
    for i in range(10):  # another workflow teaches the "test" category
        aeg.tool_start(f"a{i}", 0.0, "pytest", category="test")
        aeg.tool_end(f"a{i}", 30.0, "pytest")
    d = aeg.tool_distribution("fresh", "tox", "test")
    assert d.quantile(0.5) == pytest.approx(30.0, rel=0.1)
    hinted = aeg.tool_distribution("fresh", "mystery", "other", expected_s=4.0)
    assert hinted.mean_above(0.0) == pytest.approx(4.0)
    prior = aeg.tool_distribution("fresh", "mystery", "other")
    assert 0.0 < prior.quantile(0.5) < 30.0


def test_memory_is_bounded_and_idle_sessions_expire() -> None:
    aeg = AEG(max_workflows=3, max_nodes=4, max_sessions=5, session_idle_s=10.0)
    for i in range(20):
        aeg.session_start(f"s{i}", float(i), workflow=f"w{i}")
        for n in range(10):
            aeg.llm_start(f"s{i}", float(i), node=f"n{n}")
    assert len(aeg) <= 5
    assert len(aeg.workflows()) <= 3
    assert all(len(g.nodes) <= 4 for g in aeg._graphs.values())
    gone = aeg.expire(100.0, budget=100)
    assert len(gone) == 5 and len(aeg) == 0
    assert aeg.sessions.counters["sessions_expired"] >= 5


def test_ended_and_unknown_sessions() -> None:
    aeg = AEG()
    aeg.session_start("s", 0.0)
    aeg.llm_start("s", 0.0)
    aeg.session_end("s", 1.0)
    p = aeg.predict("s", 2.0)
    assert p.p_continue == 0.0 and p.resume_mean_s == math.inf
    assert aeg.reuse("s", 2.0) == (0.0, math.inf)
    assert aeg.reuse("nobody", 2.0) is None
    prior = aeg.predict("nobody", 2.0)
    assert prior.p_continue == aeg.prior_p_continue and prior.resume_p90_s > prior.resume_p50_s > 0


def test_resume_time_conditions_on_elapsed_tool_time() -> None:
    aeg = AEG(min_samples=4)
    rng = random.Random(0)
    for i in range(200):
        aeg.tool_start(f"a{i}", 0.0, "bash", category="run")
        aeg.tool_end(f"a{i}", rng.expovariate(1.0) + (20.0 if i % 3 == 0 else 0.0), "bash")
    aeg.session_start("s", 100.0)
    aeg.llm_start("s", 100.0)
    aeg.tool_start("s", 100.5, "bash", category="run")
    fresh = aeg.predict("s", 100.5)
    later = aeg.predict("s", 105.5)  # past the short mode: only the ~20 s mode is left
    assert fresh.resume_p50_s < 5.0
    assert later.resume_p50_s > 10.0
    assert later.resume_mean_s > 0.0


def test_unbounded_tool_names_share_an_overflow_key() -> None:
    aeg = AEG(max_tools=4)
    aeg.session_start("s", 0.0, workflow="w")
    for i in range(100):
        aeg.llm_start("s", float(i))
        aeg.tool_start("s", float(i), f"tool-{i}", call_id=f"c{i}", category="api")
        aeg.tool_end("s", i + 0.5, f"tool-{i}", call_id=f"c{i}")
    for i in range(200):  # tool ends that never arrive
        aeg.tool_start("s", 100.0, "bash", call_id=f"open{i}", category="run")
    g = aeg._graphs["w"]
    assert len(g.tools) <= 4 + 2 and len(g.durations) <= 8 and len(g.nodes) <= 6  # + one per category
    assert len(aeg.track("s").running_tools) <= 64


def test_after_the_tools_end_the_next_call_is_imminent() -> None:
    aeg = AEG()
    aeg.session_start("s", 0.0)
    aeg.llm_start("s", 0.0)
    aeg.llm_end("s", 1.0, prompt_tokens=100, output_tokens=10)
    aeg.tool_start("s", 1.0, "pytest", call_id="a", category="test")
    assert aeg.predict("s", 1.0).resume_mean_s > 0.0
    aeg.tool_end("s", 9.0, "pytest", call_id="a")
    p = aeg.predict("s", 9.5)
    assert p.resume_mean_s == p.resume_p90_s == 0.0 and p.p_continue > 0.5


def _llm_only_step(core: WorkflowCore, clock: ManualClock, sid: str, *, hint_first: bool) -> None:
    """One LLM call of a session whose hints mark LLM calls only (no tool hints),
    served by the engine too; the end hint may come before or after the engine's."""
    core.accept(LlmCallStart(sid, clock.t, node="llm"))
    core.on_request_arrival(sid, 1000)
    clock.t += 1.0
    end = LlmCallEnd(sid, clock.t, node="llm", prompt_tokens=1000, output_tokens=20)
    if hint_first:
        core.accept(end)
    core.on_request_finished(sid, 1000, 20)
    if not hint_first:
        core.accept(end)


def test_llm_hints_without_tool_hints_keep_the_engine_inferred_gap() -> None:
    """An agent whose proxy finds no tool calls sends LLM hints only; the pause
    between its calls (3 s here) is still learnt, as it is with no hints at all."""
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    for s in range(30):
        sid = f"h{s}"
        core.accept(SessionStart(sid, clock.t, workflow="llm-only"))
        for step in range(4):
            _llm_only_step(core, clock, sid, hint_first=bool(step % 2))
            clock.t += 3.0
        core.accept(SessionEnd(sid, clock.t))
    core.accept(SessionStart("probe", clock.t, workflow="llm-only"))
    _llm_only_step(core, clock, "probe", hint_first=False)
    p = core.predict("probe")
    assert p.resume_p50_s == pytest.approx(3.0, rel=0.2)
    assert p.p_continue > 0.6
    node = core.aeg._graphs["llm-only"].nodes["llm"]
    # once per call (121 calls), though the engine and the hint both end each one
    assert sum(n for key, n in node.tools.items() if key.category == GAP) == 30 * 4 + 1


def test_a_tool_hint_takes_the_inferred_gap_back() -> None:
    """A session's first tool hint comes after its first call ended: the gap
    inferred there was that tool, so the graph counts the tool, not a gap."""
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    for s in range(20):
        sid = f"t{s}"
        core.accept(SessionStart(sid, clock.t, workflow="tools"))
        for step in range(3):
            _llm_only_step(core, clock, sid, hint_first=bool(s % 2))
            core.accept(ToolCallStart(sid, clock.t, "pytest", call_id=str(step), category="test"))
            clock.t += 8.0
            core.accept(ToolCallEnd(sid, clock.t, "pytest", call_id=str(step)))
        core.accept(SessionEnd(sid, clock.t))
    g = core.aeg._graphs["tools"]
    assert not [key for node in g.nodes.values() for key in node.tools if key.category == GAP]
    core.accept(SessionStart("probe", clock.t, workflow="tools"))
    _llm_only_step(core, clock, "probe", hint_first=True)
    assert core.predict("probe").next_tool_category == "test"


def test_exact_expected_durations_override_what_was_learnt_only_when_asked():
    """The `oracle` reference's core takes a hinted duration as exact; a real core
    prefers what it learnt (8 runs of 1 s) and reads a hint as an exponential mean."""
    def resume_mean(exact: bool) -> float:
        clock = ManualClock(0.0)
        core = WorkflowCore(CoreConfig(exact_expected=exact, min_samples=4), clock=clock)
        core.accept(SessionStart("s", 0.0, tenant="t", workflow="w"))
        for k in range(8):
            core.accept(LlmCallStart("s", clock.t, step=k))
            core.accept(ToolCallStart("s", clock.t, "bash", call_id=str(k), category="run"))
            clock.t += 1.0
            core.accept(ToolCallEnd("s", clock.t, "bash", call_id=str(k)))
        core.accept(LlmCallStart("s", clock.t, step=8))
        core.accept(ToolCallStart("s", clock.t, "bash", call_id="8", category="run", expected_duration_s=30.0))
        return core.session("s").metrics["resume_mean_s"]

    assert resume_mean(True) == pytest.approx(30.0)
    assert resume_mean(False) == pytest.approx(1.0, abs=0.2)
