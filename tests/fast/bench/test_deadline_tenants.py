"""The two-tenant deadline workloads: the generator's shapes, and the real-engine
replay's scaled sessions and unloaded-time pricing."""

from __future__ import annotations

import pytest

from benchmarks import serve_deadlines
from benchmarks.harness import deadline_tenants


def test_coding_contexts_grow_and_browser_pages_are_fresh():
    coding, browser = deadline_tenants.generate(50, seed=3)
    for t in coding:
        steps = t["steps"]
        for prev, st in zip(steps, steps[1:]):  # append-only: the last prompt and answer are reused
            assert st["reused_prefix_tokens"] == prev["prompt_tokens"] + prev["output_tokens"]
            assert st["prompt_tokens"] > st["reused_prefix_tokens"]
    for t in browser:
        steps = t["steps"]
        for k, st in enumerate(steps[1:], start=1):  # only the history is reusable: the page is new
            assert st["reused_prefix_tokens"] == deadline_tenants.BrowserShape().prefix_tokens + 60 * k
        assert all(st["tools"] for st in steps[:-1]) and not steps[-1]["tools"]
    assert deadline_tenants.generate(5, seed=3) == deadline_tenants.generate(5, seed=3)


def test_the_replay_fits_the_models_context_and_prices_new_tokens_only():
    plan = serve_deadlines.sessions(3, 4, seed=0)
    assert [s.tenant for s in plan].count("browser") == 4
    assert all(c.prompt + c.output <= deadline_tenants.MAX_PROMPT for s in plan for c in s.calls)
    s = serve_deadlines.Session("x", "coding", [serve_deadlines.Call(1000, 0, 10, 2.0),
                                                serve_deadlines.Call(1500, 1010, 20, 0.0)])
    # 1000 + 490 new tokens at 500/s, 30 decode steps of 0.1 s, 2 s of tools
    assert serve_deadlines.unloaded_s(s, 500.0, 0.1) == pytest.approx(2.98 + 3.0 + 2.0)


def test_serve_deadlines_modes_name_the_servers_they_start():
    assert serve_deadlines.mode_args("no-saga") == (False, [])
    assert serve_deadlines.mode_args("priority") == (False, ["--scheduling-policy", "priority"])
    assert serve_deadlines.mode_args("saga-no-shape") == (True, ["--off", "shape"])
    with pytest.raises(SystemExit, match="unknown mode"):
        serve_deadlines.mode_args("sagaa")


def test_a_tasks_lost_time_splits_into_first_tokens_decoding_and_the_rest():
    s = serve_deadlines.Session("x", "coding", [serve_deadlines.Call(1000, 0, 10, 2.0),
                                                serve_deadlines.Call(1500, 1010, 20, 0.0)])
    # alone: first tokens 2.98 + 2 x 0.1 s, the rest of the answers 28 x 0.1 s, tools 2 s: 7.98 s
    s.first_token_s = [4.0, 2.0]  # 2.82 s more than alone
    s.latencies = [5.5, 4.5]  # decoding 4.0 s against 2.8 s alone
    s.start, s.end = 100.0, 100.0 + 7.98 + 2.82 + 1.2 + 0.5  # and 0.5 s beyond the tools' 2 s
    lost = serve_deadlines.time_lost(s, 500.0, 0.1)
    assert lost == pytest.approx({"first_token": 2.82, "decode": 1.2, "other": 0.5})


def test_on_the_cpu_simulator_each_replayed_task_meets_its_deadline_alone_and_a_crowd_misses(tmp_path):
    from benchmarks import sim_serve_deadlines

    traces = sim_serve_deadlines.write_traces(tmp_path, 1)
    alone = sim_serve_deadlines.run_one(("apc-lru", 1, 1, traces, 6, 0.0))
    assert alone["slo"] == {"coding": 1.0, "browser": 1.0} and not alone["missed_split"]
    crowded = sim_serve_deadlines.run_one(("apc-lru", 8, 1, traces, 6, 0.0))
    assert crowded["slo"]["browser"] < 1.0 and crowded["missed_split"]["missed"] >= 1
