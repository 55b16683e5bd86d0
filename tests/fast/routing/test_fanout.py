"""Cluster hint endpoint (router/hints.py): real gRPC, two engine-side hint services."""

from __future__ import annotations

import pytest

from saga_sdk import HintClient, HintReader, UnknownSession
from saga_server.core import SessionTable
from saga_server.router.hints import start_fanout
from saga_server.rpc import HintServer


@pytest.fixture
def engines():
    regs = [SessionTable(max_sessions=100), SessionTable(max_sessions=100)]
    servers = [HintServer(r, "127.0.0.1:0").start() for r in regs]
    yield regs, servers
    for s in servers:
        s.stop(grace=None)


@pytest.fixture
def fanout(engines):
    _, servers = engines
    endpoints = [s.endpoint for s in servers]
    server, servicer, port = start_fanout(lambda: list(endpoints), "127.0.0.1:0")
    servicer.live_endpoints = endpoints  # the test may shrink the list
    yield f"127.0.0.1:{port}", servicer, endpoints
    server.stop(None)


def test_hints_reach_every_engine(engines, fanout):
    regs, _ = engines
    addr, servicer, _ = fanout
    client = HintClient(endpoint=addr)
    client.session_start("s1", tenant="t")
    client.tool_call_start("s1", "pytest", call_id="c1")
    assert client.flush(5)
    client.shutdown()
    for reg in regs:
        snap = reg.session("s1")
        assert snap is not None and snap.state == "tool"
    assert servicer.counters["forwarded"] >= 2


def test_reads_merge_across_engines(engines, fanout):
    regs, _ = engines
    addr, _, _ = fanout
    client = HintClient(endpoint=addr)
    client.session_start("a")
    client.session_start("b")
    assert client.flush(5)
    client.shutdown()
    with HintReader(addr) as reader:
        assert {s.session_id for s in reader.sessions()} == {"a", "b"}
        assert reader.session("a").session_id == "a"
        with pytest.raises(UnknownSession):
            reader.session("nope")
        stats = reader.stats()
    assert stats["replicas_reachable"] == 2.0
    assert sum(1 for k in stats if k.startswith("engine_held_sessions{")) in (0, 2)
    assert stats["fanout_batches"] >= 1.0


def test_a_dead_engine_is_skipped_and_no_engine_is_unavailable(engines):
    regs, servers = engines
    endpoints = [s.endpoint for s in servers]
    server, servicer, port = start_fanout(lambda: list(endpoints), "127.0.0.1:0")
    try:
        servers[0].stop(grace=None)
        client = HintClient(endpoint=f"127.0.0.1:{port}")
        client.session_start("x")
        assert client.flush(5)
        assert regs[1].session("x") is not None
        assert servicer.counters["forward_errors"] >= 1
        servers[1].stop(grace=None)
        client.session_start("y")
        client.flush(3)  # refused upstream: the client drops, never blocks the agent
        client.shutdown()
        assert servicer.counters["no_replica"] >= 1
    finally:
        server.stop(None)


def test_router_figures_join_the_cluster_stats(engines):
    _, servers = engines
    server, _, port = start_fanout(lambda: [s.endpoint for s in servers], "127.0.0.1:0",
                                   lambda: {"router_steals": 3, "router_routes_affinity": 10})
    try:
        with HintReader(f"127.0.0.1:{port}") as reader:
            stats = reader.stats()
        assert stats["router_steals"] == 3.0 and stats["router_routes_affinity"] == 10.0
    finally:
        server.stop(None)


def test_a_moved_session_is_reported_by_its_new_engine_only():
    """Two engines served the session; the first released it (a steal). Replica
    reports, which a restarted router learns homes from, and the fan-out's reads
    both point at the engine that holds its KV now."""
    from saga_server.core import SessionStart, WorkflowCore
    from saga_server.engines.vllm.intake import EngineHintSink
    from saga_server.router.replica import read_report

    cores = [WorkflowCore(), WorkflowCore()]
    servers = [HintServer(EngineHintSink(c), "127.0.0.1:0").start() for c in cores]
    server, _, port = start_fanout(lambda: [s.endpoint for s in servers], "127.0.0.1:0")
    try:
        for core in cores:
            core.accept(SessionStart("s", core._clock()))
        cores[0].on_request_arrival("s", 900)  # served here first, with a longer context
        cores[1].on_request_arrival("s", 600)  # then re-prefilled on the new engine
        assert "s" in read_report(servers[0].endpoint)["sessions"]
        servers[0].service.sink.release_session("s")
        assert "s" not in read_report(servers[0].endpoint)["sessions"]
        assert "s" in read_report(servers[1].endpoint)["sessions"]
        with HintReader(f"127.0.0.1:{port}") as reader:
            assert reader.session("s").metrics["kv_resident"] == 1.0
            assert reader.session("s").metrics["context_tokens"] == 600.0
        cores[0].on_request_arrival("s", 1000)  # it came back: resident again
        assert "s" in read_report(servers[0].endpoint)["sessions"]
    finally:
        server.stop(None)
        for s in servers:
            s.stop(grace=None)
