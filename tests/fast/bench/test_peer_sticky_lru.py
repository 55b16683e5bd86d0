"""Session-sticky LRU: new sessions go where the live load is least, and no session ever
moves; Ray's consistent hash keeps a session's worker whatever the load."""

from __future__ import annotations

from saga_server.bench.policies import make_policy
from saga_server.core.routing import ReplicaView
from saga_server.engines.sim import SimConfig, Simulator, TaskInstance, make_cost_model
from saga_server.engines.sim.peers.sticky_lru import HashLru, PrefixLru, StickyLru

from .helpers import chain_task, random_instances


class _Session:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


def test_sticky_lru_places_by_live_load_not_by_session_count():
    policy = StickyLru()
    # w0 holds one session but runs three requests; w1 holds two idle ones
    views = [ReplicaView("w0", queue_len=3, kv_usage=0.2, sessions=frozenset("a")),
             ReplicaView("w1", queue_len=0, kv_usage=0.3, sessions=frozenset("bc"))]
    assert policy.place(_Session("new"), views, 0.0) == "w1"
    # a full pool weighs like four queued requests (the measure SAGA's router places by)
    views = [ReplicaView("w0", queue_len=0, kv_usage=1.0), ReplicaView("w1", queue_len=5, kv_usage=0.0)]
    assert policy.place(_Session("new"), views, 0.0) == "w0"
    views = [ReplicaView("w0", queue_len=1, kv_usage=1.0), ReplicaView("w1", queue_len=2, kv_usage=0.0)]
    assert policy.place(_Session("new"), views, 0.0) == "w1"


class _Recording(StickyLru):
    """Records the worker each request of a session runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.workers: dict[str, set[int]] = {}

    def on_llm_start(self, s, now: float) -> None:
        self.workers.setdefault(s.session_id, set()).add(s.worker)


def test_sticky_lru_never_moves_a_session_and_every_task_finishes():
    insts = random_instances(40, seed=3)
    policy = _Recording()
    res = Simulator(make_cost_model(kv_capacity_override=20_000), policy, insts,
                    SimConfig(workers=4, concurrency=12, host_tier_factor=1.0)).run()
    assert len(res.tasks) == 40 and res.steals == 0
    assert len(policy.workers) == 40 and all(len(ws) == 1 for ws in policy.workers.values())
    assert len({w for ws in policy.workers.values() for w in ws}) == 4  # and it used every worker


def test_hash_lru_homes_a_session_by_its_id_alone():
    policy = HashLru()
    idle = [ReplicaView(f"w{i}") for i in range(4)]
    busy = [ReplicaView(f"w{i}", queue_len=50 * (i == 0), kv_usage=float(i == 0)) for i in range(4)]
    homes = {policy.place(_Session(f"s{i}"), idle, 0.0) for i in range(64)}
    assert homes == {"w0", "w1", "w2", "w3"}  # the ring spreads sessions over every replica
    for i in range(64):
        assert policy.place(_Session(f"s{i}"), busy, 0.0) == policy.place(_Session(f"s{i}"), idle, 0.0)


def test_prefix_lru_sends_a_new_session_to_the_shortest_queue():
    views = [ReplicaView("w0", queue_len=3), ReplicaView("w1", queue_len=1, kv_usage=0.9), ReplicaView("w2", queue_len=1)]
    assert PrefixLru().place(_Session("new"), views, 0.0) == "w2"


def test_all_are_registered_with_vllms_lru_and_a_host_tier():
    for name in ("sticky-lru", "prefix-lru", "hash-lru"):
        p = make_policy(name)
        assert p.name == name and p.host_tier and p.routes and not p.steals
        res = Simulator(make_cost_model(kv_capacity_override=40_000), p,
                        [TaskInstance(f"t{i}", chain_task(f"c{i}", steps=3)) for i in range(6)],
                        SimConfig(workers=2, host_tier_factor=1.0)).run()
        assert len(res.tasks) == 6
