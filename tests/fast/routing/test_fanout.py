"""Cluster hint endpoint (router/hints.py): real gRPC, two engine-side hint services."""

from __future__ import annotations

import pytest

from saga_sdk import HintClient, HintReader, SagaUnavailable, UnknownSession
from saga_server.core import SessionPhase, SessionTable
from saga_server.router.hints import start_fanout
from saga_server.rpc import HintServer


@pytest.fixture
def engines():
    regs = [SessionTable(max_sessions=100), SessionTable(max_sessions=100)]
    servers = [HintServer(r, "127.0.0.1:0").start() for r in regs]
    yield regs, servers
    for s in servers:
        s.close(grace=None)


@pytest.fixture
def fanout(engines):
    _, servers = engines
    endpoints = [s.endpoint for s in servers]
    server, servicer, port = start_fanout(lambda: list(endpoints), "127.0.0.1:0")
    servicer.live_endpoints = endpoints  # the test may shrink the list
    yield f"127.0.0.1:{port}", servicer, endpoints
    server.close(None)


def test_hints_reach_every_engine(engines, fanout):
    regs, _ = engines
    addr, servicer, _ = fanout
    client = HintClient(endpoint=addr)
    client.session_start("s1", tenant="t")
    client.tool_call_start("s1", "pytest", call_id="c1")
    assert client.flush(5)
    client.close()
    for reg in regs:
        snap = reg.session("s1")
        assert snap is not None and snap.state == SessionPhase.TOOL
    assert servicer.counters["forwarded"] >= 2


def test_reads_merge_across_engines(engines, fanout):
    regs, _ = engines
    addr, _, _ = fanout
    client = HintClient(endpoint=addr)
    client.session_start("a")
    client.session_start("b")
    assert client.flush(5)
    client.close()
    with HintReader(addr) as reader:
        assert {s.session_id for s in reader.sessions()} == {"a", "b"}
        assert reader.session("a").session_id == "a"
        with pytest.raises(UnknownSession):
            reader.session("nope")
        with pytest.raises(SagaUnavailable, match="UNIMPLEMENTED"):  # residency is per engine
            reader.resident()
        reply = reader.server_stats()
    stats = reply.stats
    assert stats["replicas_reachable"] == 2.0
    assert not reply.HasField("engine") and not reply.engine_by_replica  # session tables hold no KV
    assert stats["fanout_batches"] >= 1.0


def test_a_dead_engine_is_skipped_and_no_engine_is_unavailable(engines):
    regs, servers = engines
    endpoints = [s.endpoint for s in servers]
    server, servicer, port = start_fanout(lambda: list(endpoints), "127.0.0.1:0")
    try:
        servers[0].close(grace=None)
        client = HintClient(endpoint=f"127.0.0.1:{port}")
        client.session_start("x")
        assert client.flush(5)
        assert regs[1].session("x") is not None
        assert servicer.counters["forward_errors"] >= 1
        servers[1].close(grace=None)
        client.session_start("y")
        client.flush(3)  # refused upstream: the client drops, never blocks the agent
        client.close()
        assert servicer.counters["no_replica"] >= 1
    finally:
        server.close(None)


def test_with_an_api_key_the_fanout_checks_it_and_forwards_it():
    """Engines that require the key accept what the fan-out forwards; a caller with
    a wrong key is refused at the fan-out and reaches no engine."""
    key = "cluster-key"
    regs = [SessionTable(max_sessions=100), SessionTable(max_sessions=100)]
    servers = [HintServer(r, "127.0.0.1:0", api_key=key).start() for r in regs]
    server, servicer, port = start_fanout(lambda: [s.endpoint for s in servers], "127.0.0.1:0", api_key=key)
    try:
        right = HintClient(endpoint=f"127.0.0.1:{port}", api_key=key)
        right.session_start("member", tenant="t")
        assert right.flush(5)
        assert right.stats().rejected == 0 and right.stats().dropped_failed == 0
        wrong = HintClient(endpoint=f"127.0.0.1:{port}", api_key="guess")
        wrong.session_start("intruder")
        wrong.flush(5)
        assert wrong.stats().dropped_failed == 1
        right.close(); wrong.close()
        assert all(r.session("member") is not None for r in regs)
        assert all(r.session("intruder") is None for r in regs)
        assert servicer.counters["auth_failures"] == 1 and servicer.counters["forward_errors"] == 0
        with HintReader(f"127.0.0.1:{port}", api_key=key) as reader:
            assert reader.session("member").tenant == "t"
            assert reader.stats()["replicas_reachable"] == 2.0
    finally:
        server.close(None)
        for s in servers:
            s.close(grace=None)


def test_the_cluster_stats_sum_the_engines_service_per_tenant():
    from saga_server.core import WorkflowCore

    cores = [WorkflowCore(), WorkflowCore()]
    servers = [HintServer(c, "127.0.0.1:0").start() for c in cores]
    server, _, port = start_fanout(lambda: [s.endpoint for s in servers], "127.0.0.1:0")
    try:
        cores[0].record_service("acme", 300)
        cores[1].record_service("acme", 200)
        cores[1].record_service("zeta", 50)
        with HintReader(f"127.0.0.1:{port}") as reader:
            assert dict(reader.server_stats().served_tokens_by_tenant) == {"acme": 500.0, "zeta": 50.0}
    finally:
        server.close(None)
        for s in servers:
            s.close(grace=None)


def test_the_cluster_stats_sum_the_engines_kv_figures_and_keep_each_engines_own():
    from saga_server.core import AdmissionStats, EngineStats, WorkflowCore
    from saga_server.engines.vllm.intake import EngineHintSink

    figures = [EngineStats(held_sessions=3, held_blocks=12, pinned_blocks=8, kv_blocks=47,
                           admission=AdmissionStats(active=2, parked=1, waiting=0, limit_tokens=600.0, wait_s=1.5),
                           counts={"pins": {"created": 2.0}, "released": {"moved": 1.0}}, tables={"holds": 3}),
               EngineStats(held_sessions=1, held_blocks=5, pinned_blocks=0, kv_blocks=23,
                           counts={"pins": {"created": 1.0, "used": 1.0}}, tables={"holds": 1})]  # admission off
    sinks = [EngineHintSink(WorkflowCore(), engine_stats=lambda f=f: f) for f in figures]
    servers = [HintServer(sink, "127.0.0.1:0").start() for sink in sinks]
    endpoints = [s.endpoint for s in servers]
    server, _, port = start_fanout(lambda: list(endpoints), "127.0.0.1:0")
    try:
        with HintReader(f"127.0.0.1:{port}") as reader:
            reply = reader.server_stats()
        total = reply.engine
        assert (total.held_sessions, total.held_blocks, total.pinned_blocks, total.kv_blocks) == (4, 17, 8, 70)
        assert (total.admission.active, total.admission.parked, total.admission.waiting) == (2, 1, 0)
        assert (total.admission.limit_tokens, total.admission.wait_s) == (600.0, 1.5)
        assert {name: dict(c.by_label) for name, c in total.counts.items()} == {
            "pins": {"created": 3.0, "used": 1.0}, "released": {"moved": 1.0}}
        assert dict(total.tables) == {"holds": 4}
        by_replica = reply.engine_by_replica
        assert sorted(by_replica) == sorted(endpoints)
        assert by_replica[endpoints[0]].held_blocks == 12 and by_replica[endpoints[0]].HasField("admission")
        assert by_replica[endpoints[1]].held_blocks == 5 and not by_replica[endpoints[1]].HasField("admission")
    finally:
        server.close(None)
        for s in servers:
            s.close(grace=None)


def test_the_cluster_stats_sum_each_tenants_outcomes_over_the_engines():
    from saga_server.core import ManualClock, SessionEnd, SessionStart, WorkflowCore

    clocks = [ManualClock(0.0), ManualClock(0.0)]
    cores = [WorkflowCore(clock=clock) for clock in clocks]
    for core, clock, took in zip(cores, clocks, (5.0, 15.0)):  # within its 10 s on one engine, past on the other
        core.accept(SessionStart("s", 0.0, tenant="a", deadline_s=10.0))
        clock.t = took
        core.accept(SessionEnd("s", took))
        core.record_service("a", 100)
    servers = [HintServer(core, "127.0.0.1:0").start() for core in cores]
    server, _, port = start_fanout(lambda: [s.endpoint for s in servers], "127.0.0.1:0")
    try:
        with HintReader(f"127.0.0.1:{port}") as reader:
            reply = reader.server_stats()
        deadlines = reply.tenant_outcomes["a"].deadlines
        assert (deadlines.met, deadlines.missed, deadlines.slack_used_sum) == (1, 1, 2.0)
        assert not reply.tenant_outcomes["a"].HasField("turns")
        assert dict(reply.served_tokens_by_tenant) == {"a": 200.0}
    finally:
        server.close(None)
        for s in servers:
            s.close(grace=None)


def test_router_figures_join_the_cluster_stats(engines):
    _, servers = engines
    server, _, port = start_fanout(lambda: [s.endpoint for s in servers], "127.0.0.1:0",
                                   lambda: {"router_steals": 3, "router_routes_affinity": 10})
    try:
        with HintReader(f"127.0.0.1:{port}") as reader:
            stats = reader.stats()
        assert stats["router_steals"] == 3.0 and stats["router_routes_affinity"] == 10.0
    finally:
        server.close(None)


def test_a_moved_session_is_reported_by_its_new_engine_only():
    """Two engines served the session; the first released it (a steal). Replica
    reports, which a restarted router learns homes from, and the fan-out's reads
    both point at the engine that holds its KV now."""
    from saga_server.core import SessionStart, WorkflowCore
    from saga_server.engines.vllm.intake import EngineHintSink
    from saga_server.router.report import read_report

    cores = [WorkflowCore(), WorkflowCore()]
    servers = [HintServer(EngineHintSink(c), "127.0.0.1:0").start() for c in cores]
    server, _, port = start_fanout(lambda: [s.endpoint for s in servers], "127.0.0.1:0")
    try:
        for core in cores:
            core.accept(SessionStart("s", core._clock()))
        cores[0].on_request_arrival("s", 900)  # served here first, with a longer context
        cores[1].on_request_arrival("s", 600)  # then re-prefilled on the new engine
        assert "s" in read_report(servers[0].endpoint).sessions
        servers[0].service.sink.release_session("s")
        assert "s" not in read_report(servers[0].endpoint).sessions
        assert "s" in read_report(servers[1].endpoint).sessions
        with HintReader(f"127.0.0.1:{port}") as reader:
            assert reader.session("s").metrics["kv_resident"] == 1.0
            assert reader.session("s").metrics["context_tokens"] == 600.0
        cores[0].on_request_arrival("s", 1000)  # it came back: resident again
        assert "s" in read_report(servers[0].endpoint).sessions
    finally:
        server.close(None)
        for s in servers:
            s.close(grace=None)
