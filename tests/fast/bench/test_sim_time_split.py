"""Where a simulated task's time went (`TaskRecord.split`, `metrics.miss_split`)."""

from __future__ import annotations

import pytest

from saga_server.bench.metrics import miss_split, summarize
from saga_server.bench.policies import make_policy
from saga_server.engines.sim import SimConfig, Simulator, StepSpec, TaskInstance, TaskSpec, ToolSpec, make_cost_model
from saga_server.engines.sim.results import SPLIT


def _agent(k: int, prompt: int) -> TaskSpec:
    steps = tuple(StepSpec(prompt + 500 * i, 200, prompt + 500 * i - 300 if i else 0,
                           (ToolSpec("bash", "run", 1.5),) if i < 4 else ()) for i in range(5))
    return TaskSpec(f"agent{k}", "run", 0, steps)


def _run(n: int, capacity: int):
    insts = [TaskInstance(f"s{k}", _agent(k, 20_000), "t", arrival_s=0.0, deadline_factor=1.5) for k in range(n)]
    sim = Simulator(make_cost_model(kv_capacity_override=capacity), make_policy("apc-lru"), insts,
                    SimConfig(workers=1, host_tier_factor=0.0, seed=0))
    return sim.run()


def test_alone_the_split_is_the_unloaded_time_and_tools():
    res = _run(1, 600_000)
    (t,) = res.tasks
    split = dict(zip(SPLIT, t.split))
    assert split["alone"] + split["tool"] == pytest.approx(t.unloaded_s)
    assert split["tool"] == pytest.approx(4 * 1.5)
    assert sum(t.split) == pytest.approx(t.tct_s)
    # nothing else, but a reused prefix's partial last block (never cached) and the
    # fluid batch's rounding of a prefill's chunks
    assert all(abs(split[c]) < 0.002 * t.tct_s for c in SPLIT if c not in ("alone", "tool"))


def test_under_load_every_second_is_accounted_for_and_misses_are_split():
    """Twelve sessions in a pool that holds about four of their contexts: they queue
    for room, recompute what was evicted, and decode in a full batch."""
    res = _run(12, 100_000)
    for t in res.tasks:
        assert sum(t.split) == pytest.approx(t.tct_s)  # no subagents: nothing else
    totals = {c: sum(t.split[i] for t in res.tasks) for i, c in enumerate(SPLIT)}
    assert totals["engine_queue"] > 0 and totals["recompute"] > 0 and totals["decode_batch"] > 0
    missed = [t for t in res.tasks if not t.met_deadline]
    split = miss_split(res)["t"]
    assert split["missed"] == len(missed) > 0
    assert split["engine_queue"] == pytest.approx(sum(t.split[SPLIT.index("engine_queue")] for t in missed)
                                                  / len(missed))
    assert abs(split["other"]) < 1e-6
    assert summarize(res)["miss_split"] == miss_split(res)
