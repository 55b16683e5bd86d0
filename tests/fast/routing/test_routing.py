"""Routing policy (core/routing.py): homes, affinity, re-homing, stealing."""

from __future__ import annotations

import collections

import pytest

from saga_server.core.clock import ManualClock
from saga_server.core.routing import (
    ReplicaView,
    RoutingConfig,
    SessionRouter,
    home_replica,
    replica_load,
)

REPLICAS = ["r0", "r1", "r2"]


def test_home_is_deterministic_and_spreads_sessions():
    homes = [home_replica(f"s{i}", REPLICAS) for i in range(600)]
    assert homes == [home_replica(f"s{i}", list(reversed(REPLICAS))) for i in range(600)]
    counts = collections.Counter(homes)
    assert set(counts) == set(REPLICAS)
    assert min(counts.values()) > 120  # roughly a third each


def test_removing_a_replica_moves_only_its_sessions():
    before = {f"s{i}": home_replica(f"s{i}", REPLICAS) for i in range(300)}
    after = {s: home_replica(s, ["r0", "r2"]) for s in before}
    moved = {s for s in before if before[s] != after[s]}
    assert moved == {s for s, r in before.items() if r == "r1"}


def test_home_replica_rejects_empty_pool():
    with pytest.raises(ValueError):
        home_replica("s", [])


def test_two_routers_agree_on_new_sessions_and_sessions_stick():
    a, b = SessionRouter(), SessionRouter()
    for i in range(50):
        sid = f"sess-{i}"
        first = a.route(sid, REPLICAS)
        assert first.reason == "home"
        assert b.route(sid, REPLICAS).replica == first.replica
        # later requests stick even when that replica is the busiest
        again = a.route(sid, REPLICAS, queue_lens={first.replica: 50})
        assert (again.replica, again.reason) == (first.replica, "affinity")


def test_dead_home_rehomes_and_then_sticks_to_the_new_home():
    r = SessionRouter()
    sid = next(f"s{i}" for i in range(100) if home_replica(f"s{i}", REPLICAS) == "r1")
    assert r.route(sid, REPLICAS).replica == "r1"
    moved = r.route(sid, ["r0", "r2"])
    assert moved.reason == "rehome" and moved.moved_from == "r1" and moved.replica in ("r0", "r2")
    # r1 comes back: the session stays where its KV now is
    assert r.route(sid, REPLICAS).replica == moved.replica


def test_reports_restore_homes_after_a_router_restart():
    r = SessionRouter()
    sid = next(f"s{i}" for i in range(100) if home_replica(f"s{i}", REPLICAS) == "r0")
    r.update([ReplicaView("r2", sessions=frozenset({sid})), ReplicaView("r0")])
    route = r.route(sid, REPLICAS)
    assert (route.replica, route.reason) == ("r2", "affinity")
    assert r.counters["learned"] == 1


def test_own_decisions_win_over_stale_reports():
    r = SessionRouter()
    first = r.route("s", REPLICAS).replica
    other = next(x for x in REPLICAS if x != first)
    r.update([ReplicaView(other, sessions=frozenset({"s"}))])
    assert r.route("s", REPLICAS).replica == first


def test_requests_without_session_go_to_least_loaded():
    r = SessionRouter()
    r.update([ReplicaView("r0", queue_len=3), ReplicaView("r1", queue_len=0, kv_usage=0.9),
              ReplicaView("r2", queue_len=1)])
    # loads: r0 3, r1 3.6, r2 1
    assert r.route(None, REPLICAS).replica == "r2"
    assert r.route("", REPLICAS, queue_lens={"r2": 9}).replica == "r0"


def _router_with_sessions(n_per_replica: int, clock: ManualClock, **cfg) -> SessionRouter:
    r = SessionRouter(RoutingConfig(**cfg), seed=7, clock=clock)
    i = 0
    for replica in ("r0", "r1"):
        placed = 0
        while placed < n_per_replica:
            sid = f"s{i}"
            i += 1
            if home_replica(sid, ["r0", "r1"]) == replica:
                r.route(sid, ["r0", "r1"])
                placed += 1
    return r


def test_steal_prefers_sessions_inside_a_tool_call():
    clock = ManualClock(100.0)
    r = _router_with_sessions(6, clock)
    on_r0 = sorted(s for s, h in r.homes().items() if h == "r0")
    in_tool = frozenset(on_r0[:2])
    r.update([ReplicaView("r0", queue_len=6, kv_usage=0.8, sessions=frozenset(on_r0), in_tool=in_tool),
              ReplicaView("r1", queue_len=0)])
    steal = r.plan_steal()
    assert steal is not None and steal.source == "r0" and steal.target == "r1"
    assert steal.session_id in in_tool and steal.in_tool
    assert r.home_of(steal.session_id) == "r1"
    assert r.route(steal.session_id, ["r0", "r1"]).replica == "r1"


def test_steal_victim_is_randomised_by_seed():
    picks = set()
    for seed in range(20):
        clock = ManualClock(100.0)
        r = _router_with_sessions(6, clock)
        r._rng.seed(seed)
        on_r0 = frozenset(s for s, h in r.homes().items() if h == "r0")
        r.update([ReplicaView("r0", queue_len=9, sessions=on_r0, in_tool=on_r0), ReplicaView("r1")])
        picks.add(r.plan_steal().session_id)
    assert len(picks) > 1


def test_steal_moves_the_session_holding_the_least_kv_where_sizes_are_reported():
    """Any session takes its future requests off the source alike; the one with the
    least KV is the cheapest to move and to fit, whatever the seed."""
    for seed in range(10):
        r = _router_with_sessions(6, ManualClock(100.0))
        r._rng.seed(seed)
        on_r0 = sorted(s for s, h in r.homes().items() if h == "r0")
        sizes = {sid: 50_000 + 1_000 * i for i, sid in enumerate(on_r0)}
        smallest = on_r0[3]
        sizes[smallest] = 2_000
        r.update([ReplicaView("r0", queue_len=9, sessions=frozenset(on_r0), in_tool=frozenset(on_r0),
                              kv_tokens=sizes), ReplicaView("r1")])
        assert r.plan_steal().session_id == smallest


def test_no_steal_when_balanced_or_only_outside_tool_if_asked():
    clock = ManualClock(100.0)
    r = _router_with_sessions(4, clock, steal_only_in_tool=True)
    on_r0 = frozenset(s for s, h in r.homes().items() if h == "r0")
    r.update([ReplicaView("r0", queue_len=2, sessions=on_r0), ReplicaView("r1", queue_len=1)])
    assert r.plan_steal() is None  # gap 1 < 3
    r.update([ReplicaView("r0", queue_len=9, sessions=on_r0), ReplicaView("r1")])
    assert r.plan_steal() is None  # overloaded, but nobody is in a tool
    r2 = _router_with_sessions(4, ManualClock(100.0))
    r2.update([ReplicaView("r0", queue_len=9), ReplicaView("r1")])
    assert r2.plan_steal() is not None  # default: any session homed there may move


def test_a_moved_session_is_not_moved_again_within_the_cooldown():
    clock = ManualClock(100.0)
    r = _router_with_sessions(1, clock, steal_cooldown_s=10.0)
    sid = next(s for s, h in r.homes().items() if h == "r0")
    r.update([ReplicaView("r0", queue_len=9, in_tool=frozenset({sid})), ReplicaView("r1")])
    assert r.plan_steal().session_id == sid
    r.update([ReplicaView("r0"), ReplicaView("r1", queue_len=9, in_tool=frozenset({sid}))])
    # r1's other session (homed there from the start) may move, the fresh arrival may not
    steal = r.plan_steal()
    assert steal is None or steal.session_id != sid
    clock.t += 11.0
    again = r.plan_steal()
    assert again is not None and again.session_id == sid and again.target == "r0"


def test_reactive_steal_when_home_is_far_more_loaded():
    r = SessionRouter(RoutingConfig(reactive_gap=4.0))
    first = r.route("s", ["r0", "r1"]).replica
    other = "r1" if first == "r0" else "r0"
    assert r.route("s", ["r0", "r1"], queue_lens={first: 3}).replica == first
    moved = r.route("s", ["r0", "r1"], queue_lens={first: 6})
    assert (moved.replica, moved.reason, moved.moved_from) == (other, "steal", first)
    assert r.route("s", ["r0", "r1"]).replica == other


def test_load_combines_queue_and_kv_pressure():
    cfg = RoutingConfig(kv_weight=4.0)
    assert replica_load(ReplicaView("r", queue_len=2, kv_usage=0.5), cfg) == 4.0
    assert replica_load(ReplicaView("r", queue_len=2), cfg, extra_queue=5) == 5.0
    assert replica_load(None, cfg, extra_queue=1) == 1.0


def test_bad_config_is_rejected():
    with pytest.raises(ValueError):
        RoutingConfig(steal_gap=0)
    with pytest.raises(ValueError):
        RoutingConfig(reactive_gap=-1)


def test_home_table_is_bounded():
    r = SessionRouter(RoutingConfig(max_sessions=10))
    for i in range(50):
        r.route(f"s{i}", REPLICAS)
    assert len(r.homes()) == 10 and "s49" in r.homes() and "s0" not in r.homes()


def test_new_session_rule_defaults_to_the_hash():
    assert RoutingConfig().new_session == "hash"
    r = SessionRouter()
    # a loaded hash home is still the home: the default ignores load for new sessions
    sid = next(f"s{i}" for i in range(100) if home_replica(f"s{i}", REPLICAS) == "r0")
    r.update([ReplicaView("r0", queue_len=50), ReplicaView("r1"), ReplicaView("r2")])
    assert r.route(sid, REPLICAS).replica == "r0"
    with pytest.raises(ValueError):
        RoutingConfig(new_session="random")


def test_least_loaded_new_sessions_go_by_load_then_fewest_sessions_then_stick():
    r = SessionRouter(RoutingConfig(new_session="least_loaded"))
    r.update([ReplicaView("r0", queue_len=2), ReplicaView("r1", queue_len=0, kv_usage=0.5,
                                                          sessions=frozenset({"x"})),
              ReplicaView("r2", queue_len=0, kv_usage=0.5, sessions=frozenset({"y", "z"}))])
    # loads: r0 2.0, r1 2.0, r2 2.0: the fewest sessions wins (r0 reports none)
    first = r.route("new", REPLICAS)
    assert (first.replica, first.reason) == ("r0", "home")
    # fresher in-flight counts count too
    assert r.route("other", REPLICAS, queue_lens={"r0": 5}).replica == "r1"
    # once placed, a session sticks to its home whatever the load
    r.update([ReplicaView("r0", queue_len=9), ReplicaView("r1"), ReplicaView("r2")])
    assert r.route("new", REPLICAS) == type(first)("r0", "affinity")
    # a session whose home left goes to the least loaded of the rest
    assert r.route("new", ["r1", "r2"], queue_lens={"r1": 1}).replica == "r2"


def test_a_subagent_starts_on_its_parents_replica_and_then_sticks_there():
    r = SessionRouter()
    parent = r.route("lead", REPLICAS)
    children = [f"lead:kid{i}" for i in range(30)]
    routes = [r.route(kid, REPLICAS, parent_id="lead") for kid in children]
    assert {(x.replica, x.reason) for x in routes} == {(parent.replica, "parent")}
    # The hash would have spread them; once placed, each child has its own home.
    assert len({home_replica(kid, REPLICAS) for kid in children}) > 1
    assert r.route(children[0], REPLICAS, parent_id="lead").reason == "affinity"
    # A parent this router never placed, or one whose replica is gone: the usual rule.
    assert r.route("orphan", REPLICAS, parent_id="nobody").reason == "home"
    others = [x for x in REPLICAS if x != parent.replica]
    assert r.route("late-kid", others, parent_id="lead").reason == "home"
