"""Trace loading, fallback durations, sampling and arrivals."""

from __future__ import annotations

import json
import random

import pytest

from saga_server.bench.workload import TenantSpec, build_instances, load_trace, materialize


def write_trace(path, tasks):
    path.write_text("\n".join(json.dumps(t) for t in tasks) + "\n")
    return str(path)


def task(task_id, durations, shared=10, run="r"):
    steps = []
    for i, d in enumerate(durations):
        tools = [] if d == "none" else [{"name": "t", "category": "api", "duration_s": d}]
        steps.append({"prompt_tokens": 100 * (i + 1), "output_tokens": 10,
                      "reused_prefix_tokens": 0 if i == 0 else 100 * i + 10, "tools": tools})
    return {"format": "saga-trace/1", "task_id": task_id, "run": run,
            "shared_prefix_tokens": shared, "steps": steps}


def test_trace_durations_are_kept_and_missing_ones_drawn_from_the_category(tmp_path):
    raw = load_trace(write_trace(tmp_path / "t.jsonl", [task("a", [1.5, None, "none", 2.0])]))[0]
    fallback = {"api": (7.0, 0.0), "user": (3.0, 0.0)}
    spec = materialize(raw, random.Random(0), fallback)
    assert spec.shared_prefix_tokens == 10 and spec.run == "r"
    assert spec.steps[0].gap_s == 1.5 and spec.steps[0].tools[0].from_trace
    assert spec.steps[1].gap_s == pytest.approx(7.0) and not spec.steps[1].tools[0].from_trace
    assert spec.steps[2].tools == () and spec.steps[2].gap_s == pytest.approx(3.0)  # a user turn
    assert spec.steps[1].reused_tokens == 110


def test_not_a_saga_trace_is_refused(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"format": "other", "steps": []}) + "\n")
    with pytest.raises(ValueError, match="saga-trace/1"):
        load_trace(p)


def test_sessions_are_distinct_tasks_cycle_and_tenants_follow_weights(tmp_path):
    a = write_trace(tmp_path / "a.jsonl", [task(f"a{i}", [1.0, 1.0]) for i in range(3)])
    b = write_trace(tmp_path / "b.jsonl", [task("b0", [1.0])])
    insts = build_instances([TenantSpec("heavy", a, 1.0, 4.0), TenantSpec("light", b, 3.0)], 400, seed=1)
    assert len({i.session_id for i in insts}) == 400
    heavy = [i for i in insts if i.tenant == "heavy"]
    assert 60 < len(heavy) < 140  # weight 1 of 4
    first = [i.task.task_id for i in heavy[:3]]
    assert sorted(first) == ["a0", "a1", "a2"]  # each task once per round
    assert all(i.deadline_factor == 4.0 for i in heavy)


def test_poisson_arrivals_increase_at_the_given_rate_and_the_seed_fixes_them(tmp_path):
    a = write_trace(tmp_path / "a.jsonl", [task("a", [1.0])])
    insts = build_instances([TenantSpec("x", a)], 2000, seed=4, rate_per_s=2.0)
    times = [i.arrival_s for i in insts]
    assert times == sorted(times)
    assert times[-1] / len(times) == pytest.approx(0.5, rel=0.1)
    again = build_instances([TenantSpec("x", a)], 2000, seed=4, rate_per_s=2.0)
    assert [i.arrival_s for i in again] == times
    assert build_instances([TenantSpec("x", a)], 5, seed=4)[0].arrival_s is None
