"""Session-sticky LRU: new sessions go where the live KV is least, and no session ever
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


def test_sticky_lru_places_by_the_kv_its_workers_hold_not_by_their_session_count():
    policy = StickyLru()
    for sid, home in (("a", "w0"), ("b", "w1"), ("c", "w1")):
        policy._home[sid] = home
    views = [ReplicaView("w0", kv_tokens={"a": 90_000}), ReplicaView("w1", kv_tokens={"b": 5_000, "c": 5_000})]
    assert policy.place(_Session("new"), views, 0.0) == "w1"  # two light sessions weigh less than one heavy
    # a placed session that holds nothing yet counts at the mean per session (50k / 3):
    # w1 weighs 10k + 16.7k against w0's 40k, then 10k + 33.3k
    views = [ReplicaView("w0", kv_tokens={"a": 40_000}), ReplicaView("w1", kv_tokens={"b": 5_000, "c": 5_000})]
    assert policy.place(_Session("next"), views, 0.0) == "w1"
    assert policy.place(_Session("third"), views, 0.0) == "w0"


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
