"""Production-shaped agents: the trace fields for a person's turn, compaction and the
provider's cached tokens, what the simulator does with them, and the generator that
draws such sessions from published statistics."""

from __future__ import annotations

import math
import random
import re
from dataclasses import fields
from pathlib import Path

import pytest

from saga_server.bench.metrics import summarize
from saga_server.bench.policies import make_policy
from saga_server.bench.workload import materialize
from saga_server.engines.sim import SimConfig, Simulator, StepSpec, TaskInstance, TaskSpec, ToolSpec, make_cost_model
from saga_server.engines.sim.results import unloaded_time_s, unloaded_turns_s

from .helpers import chain_task

from benchmarks.harness import production_agents
from benchmarks.harness.results import write_jsonl


def raw_task(**last) -> dict:
    return {"format": "saga-trace/1", "task_id": "t", "run": "r", "shared_prefix_tokens": 100, "steps": [
        {"prompt_tokens": 1000, "output_tokens": 50, "reused_prefix_tokens": 0, "provider_cached_tokens": 100,
         "tools": [], "human_idle_s": 90.5},
        {"prompt_tokens": 400, "output_tokens": 20, "reused_prefix_tokens": 100, "compaction": True,
         "provider_cached_tokens": 100, "tools": [], **last}]}


def test_a_trace_step_carries_a_persons_turn_compaction_and_the_providers_cached_tokens():
    spec = materialize(raw_task(), random.Random(0))
    first, second = spec.steps
    assert first.human and first.idle_s == 90.5 and first.cached_tokens == 100 and not first.compaction
    assert second.compaction and not second.human and second.reused_tokens == 100


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_persons_turn_must_be_a_finite_duration(bad):
    task = raw_task()
    task["steps"][0]["human_idle_s"] = bad
    with pytest.raises(ValueError, match="human_idle_s"):
        materialize(task, random.Random(0))


def turns_task(task_id: str, wait_s: float) -> TaskSpec:
    """Two user turns: a tool loop, the answer, a person's wait, one more call."""
    return TaskSpec(task_id, "run", 0, (
        StepSpec(2000, 50, 0, (ToolSpec("bash", "run", 1.0),)),
        StepSpec(2100, 50, 2050, idle_s=wait_s, human=True),
        StepSpec(2300, 50, 2150)))


def run(policy_name: str, insts, kv_tokens: int = 200_000):
    policy = make_policy(policy_name)
    sim = Simulator(make_cost_model(kv_capacity_override=kv_tokens), policy, insts, SimConfig(workers=1))
    return sim, policy, sim.run()


def test_saga_learns_a_persons_turn_as_a_wait_of_its_own_not_as_the_tools():
    insts = [TaskInstance(f"s{i}", turns_task(f"t{i}", 300.0)) for i in range(12)]
    sim, saga, res = run("saga", insts)
    assert res.human_waits == 12 and summarize(res)["human_waits"] == 12
    human = saga.core.aeg.tool_distribution("default", "human", "human")
    tool = saga.core.aeg.tool_distribution("default", "bash", "run")
    assert human.mean() == pytest.approx(300.0, rel=0.1)
    assert tool.mean() == pytest.approx(1.0, rel=0.1)
    # Every task took its person's 5 minutes, and every baseline saw the same waits.
    assert min(t.tct_s for t in res.tasks) > 300.0
    assert run("kvflow", insts)[2].human_waits == 12


def test_a_compacted_step_is_counted_and_the_providers_share_reported():
    spec = materialize(raw_task(), random.Random(0))
    _, _, res = run("apc-lru", [TaskInstance("a", spec)])
    s = summarize(res)
    assert s["compactions"] == 1
    assert s["provider_cached_share"] == pytest.approx(200 / 1400)


def test_the_generator_is_seeded_and_lands_on_the_published_statistics():
    tasks = production_agents.generate(600, seed=3)
    assert tasks == production_agents.generate(600, seed=3)
    assert tasks != production_agents.generate(600, seed=4)
    s = production_agents.summary(tasks)
    assert 50_000 <= s["mean_prompt_tokens"] <= 90_000  # copilot: ~68k
    assert 0.85 <= s["provider_cached_share"] <= 0.96  # copilot / tracelab: 85-96%
    assert 3.5 <= s["turns_per_session"] <= 4.5  # ~4 user turns
    assert 1.05 <= s["tool_calls_per_tool_step"] <= 1.15  # ~1.1
    assert 0.1 <= s["tool_median_s"] <= 0.6 and 10.0 <= s["tool_p90_s"] <= 16.0
    assert 90.0 <= s["human_median_s"] <= 150.0 and 900.0 <= s["human_p90_s"] <= 1500.0
    assert 0.05 <= s["sessions_compacting"] <= 0.25  # copilot: 5-20% of sessions
    window = production_agents.ProductionShape().context_window
    assert s["max_prompt_tokens"] <= window


def test_a_compaction_restarts_the_prompt_from_the_shared_prefix_and_the_trace_loads():
    tasks = production_agents.generate(200, seed=0)
    compacted = [(t, k) for t in tasks for k, st in enumerate(t["steps"]) if st.get("compaction")]
    assert compacted
    for t, k in compacted:
        before, st = t["steps"][k - 1], t["steps"][k]
        assert st["reused_prefix_tokens"] == t["shared_prefix_tokens"]
        assert st["prompt_tokens"] < before["prompt_tokens"] // 2
        assert not before["tools"] and "human_idle_s" not in before  # the summarising call runs straight on
    spec = materialize(compacted[0][0], random.Random(0))
    assert sum(st.compaction for st in spec.steps) == sum(st.get("compaction", False) for st in compacted[0][0]["steps"])


def test_every_knob_of_the_generator_names_its_source():
    text = Path(production_agents.__file__).read_text()
    block = text[text.index("class ProductionShape"):text.index("def __post_init__")]
    lines = block.splitlines()
    for f in fields(production_agents.ProductionShape):
        i = next(n for n, line in enumerate(lines) if re.match(rf"\s+{f.name}: ", line))
        said = lines[i] + " ".join(lines[max(0, i - 2):i])  # its comment, or the lines just above it
        assert any(f"{key}" in said for key in production_agents.SOURCES), f"{f.name} cites no source"


@pytest.mark.parametrize("bad", [{"compact_at": 0.0}, {"tool_p90_s": 0.1}, {"turns_mean": 0.5},
                                 {"append_max_tokens": 190_000}, {"human_median_s": float("nan")}])
def test_a_shape_that_cannot_be_drawn_is_refused(bad):
    with pytest.raises(ValueError):
        production_agents.ProductionShape(**bad)


def test_a_person_away_longer_than_the_core_keeps_a_session_is_served_when_it_comes_back():
    from saga_server.core import CoreConfig
    from saga_server.engines.sim.saga_policy import SagaPolicy

    saga = SagaPolicy(config=CoreConfig(session_idle_s=10.0, human_idle_s=20.0))
    # Another session's hints during the wait let the core's expiry run (it runs with events).
    insts = [TaskInstance("s", turns_task("t", 100.0)), TaskInstance("b", chain_task("b", steps=40, tool_s=5.0))]
    res = Simulator(make_cost_model(kv_capacity_override=200_000), saga, insts, SimConfig(workers=1)).run()
    assert len(res.tasks) == 2 and min(t.tct_s for t in res.tasks) > 100.0
    assert saga.core.table.counters["sessions_expired"] >= 1
    assert saga.core.session("s") is not None  # its next call started it again


def test_a_disk_tier_serves_what_the_host_tier_dropped():
    """Sessions outgrow a 1x host tier in their long tools: with a disk tier below it
    their KV comes back from disk instead of being recomputed, at the disk's speed."""
    insts = [TaskInstance(f"s{i}", chain_task(f"t{i}", steps=4, first_prompt=6000, growth=500, output=20,
                                              tool_s=30.0)) for i in range(8)]
    out = {}
    for disk in (0.0, 8.0):
        sim = Simulator(make_cost_model(kv_capacity_override=16_000), make_policy("apc-lru-offload"), insts,
                        SimConfig(workers=1, host_tier_factor=1.0, disk_tier_factor=disk))
        out[disk] = sim.run()
    assert out[0.0].recomputed_tokens > 0 and out[0.0].disk_loaded_tokens == 0
    assert out[8.0].disk_loaded_tokens > 0
    assert out[8.0].recomputed_tokens < out[0.0].recomputed_tokens


def test_a_tasks_user_turns_alone_on_a_worker_leave_the_persons_wait_out():
    cost = make_cost_model()
    task = turns_task("t", 300.0)
    first, second = unloaded_turns_s(task, cost)
    assert first + second + 300.0 == pytest.approx(unloaded_time_s(task, cost))
    assert first > second > 0.0  # the first turn has two calls and a tool, the second one call


def test_each_user_turn_is_timed_from_the_persons_answer_and_judged_against_its_deadline():
    insts = [TaskInstance(f"s{i}", turns_task(f"t{i}", 300.0), tenant="chat", turn_deadline_factor=1.5)
             for i in range(4)]
    sim, saga, res = run("saga", insts)
    for t in res.tasks:
        assert len(t.turn_spans) == 2
        assert sum(t.turn_spans) + 300.0 == pytest.approx(t.tct_s)  # the person's wait in neither turn
    s = summarize(res)
    assert s["turn_slo"] == {"chat": pytest.approx(
        sum(span <= t.turn_deadline_s for t in res.tasks for span in t.turn_spans) / 8)}
    assert s["turn_p90_s"]["chat"] < 300.0
    first, second, third, later = s["turn_slo_by_place"]["chat"]
    assert first == sum(t.turn_spans[0] <= t.turn_deadline_s for t in res.tasks) / 4
    assert second == sum(t.turn_spans[1] <= t.turn_deadline_s for t in res.tasks) / 4
    assert math.isnan(third) and math.isnan(later)  # two turns each
    # SAGA's core was told the same deadline and saw the same turns end.
    turns = saga.core.tenant_outcomes()["chat"].turns
    met, missed = turns.met, turns.missed
    assert (met, missed) == (round(8 * s["turn_slo"]["chat"]), 8 - round(8 * s["turn_slo"]["chat"]))


def test_user_turn_times_count_every_turn_and_leave_the_persons_wait_out():
    insts = [TaskInstance(f"s{i}", turns_task(f"t{i}", 300.0), tenant="chat", turn_deadline_factor=1.5)
             for i in range(2)]
    insts += [TaskInstance(f"b{i}", turns_task(f"u{i}", 300.0), tenant="background") for i in range(2)]
    insts.append(TaskInstance("c", chain_task("c", steps=3)))  # no person in it: one turn
    res = run("saga", insts)[2]
    spans = [span for t in res.tasks for span in t.turn_spans]
    assert len(spans) == 9
    s = summarize(res)
    assert s["user_turn_mean_s"] == pytest.approx(sum(spans) / 9)
    assert s["user_turn_p50_s"] == sorted(spans)[4] and s["user_turn_p99_s"] == max(spans)
    assert s["user_turn_p90_s"] < 300.0 < min(t.tct_s for t in res.tasks if t.session_id != "c")
    alone = next(t for t in res.tasks if t.session_id == "c")
    assert alone.turn_spans == (pytest.approx(alone.tct_s),)


def test_turns_that_queue_behind_each_other_miss_a_tight_turn_deadline():
    # Eight sessions start at once on one worker: the later ones' first turns wait.
    insts = [TaskInstance(f"s{i}", turns_task(f"t{i}", 300.0), tenant="chat", turn_deadline_factor=1.2)
             for i in range(8)]
    res = run("apc-lru", insts)[2]
    slo = summarize(res)["turn_slo"]["chat"]
    assert 0.0 < slo < 1.0


def test_the_turn_slo_benchmark_judges_only_the_interactive_tenants_turns(tmp_path):
    from benchmarks import sim_turn_slo

    shape = production_agents.ProductionShape()
    traces = {"interactive": str(write_jsonl(tmp_path / "i.jsonl", production_agents.generate(12, 0, shape))),
              "background": str(write_jsonl(tmp_path / "b.jsonl", production_agents.generate(
                  12, 1, production_agents.ProductionShape(turns_mean=1.0))))}
    sc = sim_turn_slo.scenario(traces, 1, 3, 2, 1.0, 3.0, 0.25, 0)
    assert 0.5 < sim_turn_slo.ceiling(sc) <= 1.0
    row = sim_turn_slo.run_one((traces, 1, 3, 2, 1.0, 3.0, 0.25, "saga", 0))
    assert row["tasks"] == 6 and 0.0 <= row["turn_slo"] <= 1.0
    assert set(row["tct_by_tenant"]) <= {"interactive", "background"}
