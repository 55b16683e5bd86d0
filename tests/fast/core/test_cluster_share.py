"""Cluster-wide Agent Fair Share: the ledger's bookkeeping, and two engines whose
fair share follows the cluster's service once they hear of each other."""

from __future__ import annotations

import pytest

from saga_server.core import CoreConfig, FairShareConfig, ManualClock, PeerServiceLedger, TenantOutcomes, WorkflowCore


def test_growth_on_one_engine_is_owed_to_every_other_engine_once():
    ledger = PeerServiceLedger()
    ledger.observe("a", {"t1": 100.0})  # baselines: nothing owed yet
    ledger.observe("b", {"t1": 50.0})
    ledger.observe("c", {})
    assert ledger.take("a") == {} and ledger.take("b") == {}
    ledger.observe("a", {"t1": 130.0, "t2": 5.0})  # t2 is new on a: baseline only
    ledger.observe("b", {"t1": 60.0})
    assert ledger.take("a") == {"t1": 10.0}
    assert ledger.take("b") == {"t1": 30.0}
    assert ledger.take("c") == {"t1": 40.0}
    assert ledger.take("c") == {}  # told once


def test_a_reset_counter_is_rebased_and_a_missing_tenant_keeps_its_value():
    ledger = PeerServiceLedger()
    ledger.observe("a", {"t": 1000.0})
    ledger.observe("b", {})
    ledger.observe("a", {})  # t idle on a for a while: not in the report
    ledger.observe("a", {"t": 1010.0})
    assert ledger.take("b") == {"t": 10.0}
    ledger.observe("a", {"t": 3.0})  # a restarted
    ledger.observe("a", {"t": 8.0})
    assert ledger.take("b") == {"t": 5.0}


def test_undelivered_service_is_kept_and_a_departed_engine_is_forgotten():
    ledger = PeerServiceLedger()
    ledger.observe("a", {"t": 0.0})
    ledger.observe("b", {})
    ledger.observe("a", {"t": 7.0, "bad": float("nan")})
    owed = ledger.take("b")
    ledger.give_back("b", owed)
    ledger.observe("a", {"t": 9.0})
    assert ledger.take("b") == {"t": 9.0}
    ledger.forget("b")
    ledger.observe("a", {"t": 20.0})
    assert ledger.engines() == ["a"] and ledger.take("b") == {}


def test_peer_service_is_validated_all_or_nothing_and_never_reported_as_local():
    core = WorkflowCore(clock=ManualClock())
    with pytest.raises(ValueError):
        core.record_peer_service({"x": 5.0, "y": -1.0})
    with pytest.raises(ValueError):
        core.record_peer_service({"x": float("inf")})
    assert core.stats()["afs_peer_tokens"] == 0.0 and core.fair.owed("x") == 0.0
    assert core.record_peer_service({"x": 5.0, "y": 3.0}) == 2
    stats = core.stats()
    assert stats["afs_peer_tokens"] == 8.0
    assert core.tenant_outcomes() == {}  # peer service is not local service: no feedback loop
    core.record_service("x", 40)
    assert core.tenant_outcomes() == {"x": TenantOutcomes("x", served_tokens=40.0)}


def _serve_cluster(rounds: int, share: bool) -> float:
    """Engine A has sessions of tenants `local` and `spread`; engine B only of
    `spread`. Each round every engine serves one 100-token quantum to its
    best-ranked tenant. Returns `local`'s share of engine A's service."""
    clock = ManualClock()
    cfg = CoreConfig(fairshare=FairShareConfig(queue_scale_tokens=1000.0))
    engines = {"A": WorkflowCore(cfg, clock=clock), "B": WorkflowCore(cfg, clock=clock)}
    tenants = {"A": ["local", "spread"], "B": ["spread"]}
    ledger = PeerServiceLedger()
    last_served = {t: -1 for t in ("local", "spread")}
    for r in range(rounds):
        clock.t += 0.1
        for name, core in engines.items():
            best = min(tenants[name], key=lambda t: (core.request_priority(f"{t}-{name}", t), last_served[t]))
            core.record_service(best, 100)
            last_served[best] = r
        if share:
            for name, core in engines.items():
                ledger.observe(name, dict(core.fair.served))
            for name, core in engines.items():
                owed = ledger.take(name)
                if owed:
                    core.record_peer_service(owed)
    served_a = engines["A"].fair.served
    return served_a.get("local", 0.0) / sum(served_a.values())


def test_a_tenant_cannot_take_more_than_its_share_by_spreading_sessions_over_engines():
    alone = _serve_cluster(400, share=False)
    shared = _serve_cluster(400, share=True)
    # Per engine only: A splits evenly, so `spread` gets 3/4 of the cluster.
    assert 0.45 <= alone <= 0.55
    # Cluster-wide: `local` gets (nearly) all of A, matching `spread`'s all of B.
    assert shared >= 0.9, shared
