"""The policy registry: names, ablation wiring, and what each baseline decides."""

from __future__ import annotations

import math

import pytest

from saga_server.bench.policies import ABLATIONS, DEFAULT_POLICIES, make_policy, policy_names
from saga_server.engines.sim.saga_policy import MECHANISMS


class S:
    """The session fields policies read."""

    def __init__(self, state="tool", last_access=10.0, next_use=12.0, started_at=0.0):
        self.session_id, self.tenant, self.tool_names = "s", "t", ("bash",)
        self.state, self.last_access, self.next_use, self.started_at = state, last_access, next_use, started_at
        self.kv_tokens = 1000


def test_every_listed_policy_builds_with_its_name():
    for name in DEFAULT_POLICIES + ABLATIONS:
        assert name in policy_names()
        assert make_policy(name).name == name
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("lfu")


@pytest.mark.parametrize("m", MECHANISMS)
def test_ablations_switch_exactly_one_mechanism(m):
    only, without = make_policy(f"saga-only-{m}"), make_policy(f"saga-no-{m}")
    assert only.mechanisms == {m}
    assert without.mechanisms == set(MECHANISMS) - {m}
    assert only.host_tier == (m == "prefetch") and without.host_tier == (m != "prefetch")
    assert only.steals == (m == "steal") and without.steals == (m != "steal")


def test_baseline_keys_order_victims_as_documented():
    lru, bel, kvf = make_policy("apc-lru"), make_policy("belady"), make_policy("kvflow")
    old, new = S(last_access=1.0), S(last_access=5.0)
    assert lru.key(old, 6.0) < lru.key(new, 6.0)  # least recent first
    far, near = S(next_use=100.0), S(next_use=7.0)
    assert bel.key(far, 6.0) < bel.key(near, 6.0)  # farthest next use first
    assert bel.key(S(state="ended"), 6.0) == -math.inf
    # KVFlow: in a tool (1 step away) goes before queued (0 steps), whatever the recency
    assert kvf.key(S(state="tool", last_access=5.0), 6.0) < kvf.key(S(state="queued", last_access=1.0), 6.0)


def test_continuum_pins_for_the_moving_average_of_the_tool():
    pol = make_policy("continuum-ttl")
    s = S()
    assert pol.pin_ttl(s, 0.0, 0.5) == 0.0  # nothing observed yet
    pol.on_tool_start(s, 0.0)
    pol.on_tool_end(s, 2.0)
    pol.on_tool_start(s, 10.0)
    pol.on_tool_end(s, 11.0)
    assert pol.pin_ttl(s, 20.0, 0.5) == pytest.approx(2.0 + 0.2 * (1.0 - 2.0))
    assert pol.queue_priority(S(started_at=3.0), 50.0) == 3.0  # program-level FCFS
