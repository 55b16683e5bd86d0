"""Cluster hint endpoint (router/hints.py): real gRPC, two engine-side hint services."""

from __future__ import annotations

import pytest

from saga_sdk import HintClient, HintReader, UnknownSession
from saga_server.core.registry import SessionRegistry
from saga_server.router.hints import start_fanout
from saga_server.rpc import HintServer


@pytest.fixture
def engines():
    regs = [SessionRegistry(max_sessions=100), SessionRegistry(max_sessions=100)]
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
