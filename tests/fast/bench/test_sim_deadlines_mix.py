"""`sim_deadlines.py --tenants`: the mix a run uses, parsed and checked."""

from __future__ import annotations

import pytest

from benchmarks import sim_deadlines

PROFILES = {"coding": "c.jsonl", "browser": "b.jsonl", "swe": "s.jsonl"}


def test_the_default_mix_is_the_coding_and_browser_agents():
    assert sim_deadlines.parse_tenants(sim_deadlines.TENANTS, PROFILES) == (("coding", 1.0, 4.0),
                                                                           ("browser", 3.0, 2.0))


def test_a_mix_of_other_profiles_becomes_the_scenarios_tenants():
    tenants = sim_deadlines.parse_tenants(" swe:1:4 , browser:3:2.5", PROFILES)
    sc = sim_deadlines.scenario(PROFILES, tenants, workers=16, per_worker=2, tasks_factor=3, seed=1, ramp_s=60.0)
    assert [(t.name, t.trace, t.weight, t.deadline_factor) for t in sc.tenants] == [
        ("swe", "s.jsonl", 1.0, 4.0), ("browser", "b.jsonl", 3.0, 2.5)]
    assert (sc.tasks, sc.concurrency, sc.ramp_s, sc.seed) == (96, 32, 60.0, 1)


@pytest.mark.parametrize("spec, says", [
    ("swe:1:4,tau:1:2", "no such profile"),
    ("swe:1,browser:3:2", "NAME:SHARE:FACTOR"),
    ("swe:0:4,browser:3:2", "> 0"),
    ("swe:1:x,browser:3:2", "> 0"),
    ("swe:1:nan,browser:3:2", "> 0"),
    ("swe:1:4,swe:3:2", "twice"),
    ("swe:1:4", "at least two"),
])
def test_a_bad_mix_is_refused_with_what_is_wrong(spec, says):
    with pytest.raises(ValueError, match=says):
        sim_deadlines.parse_tenants(spec, PROFILES)
