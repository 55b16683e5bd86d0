"""`saga router`'s /metrics: engines read through the real hint fan-out, scraped over HTTP."""

from __future__ import annotations

import urllib.request

import pytest

from saga_server.core import EngineStats, WorkflowCore
from saga_server.engines.vllm.intake import EngineHintSink
from saga_server.router.hints import FanOutHints
from saga_server.router.metrics import ClusterCollector, serve_metrics
from saga_server.rpc import HintServer

pytest.importorskip("prometheus_client")

ROUTER = {"routing": {"routes_affinity": 7.0, "routes_home": 3.0, "replica_sessions{r-a}": 2.0,
                      "replica_sessions{r-b}": 1.0, "sessions_homed": 3.0},
          "moves": {"steals": 2, "steals_in_tool": 1, "reprefills_ok": 1, "peer_sends": 5},
          "inflight": {"r-a": 1}}


def _value(text: str, sample: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(sample + " "))
    return float(line.rsplit(" ", 1)[1])


def test_per_replica_router_and_tenant_figures_are_scraped_live():
    cores = [WorkflowCore(), WorkflowCore()]
    kv = EngineStats(held_sessions=3, held_blocks=12, pinned_blocks=8, kv_blocks=47)
    # r-a is an engine's hint service; r-b a plain core's, which reports no KV
    servers = [HintServer(EngineHintSink(cores[0], engine_stats=lambda: kv), "127.0.0.1:0").start(),
               HintServer(cores[1], "127.0.0.1:0").start()]
    names = {servers[0].endpoint: "r-a", servers[1].endpoint: "r-b"}
    dead = "127.0.0.1:1"  # an engine that does not answer is left out, not an error
    fanout = FanOutHints(lambda: [s.endpoint for s in servers] + [dead], timeout=1.0)
    collector = ClusterCollector(lambda: {names.get(ep, ep): st for ep, st in fanout.engine_stats().items()},
                                 lambda: ROUTER)
    http = serve_metrics(collector, "127.0.0.1", 0)
    try:
        cores[0].record_service("acme", 300)
        cores[1].record_service("acme", 200)
        cores[1].record_service("zeta", 50)
        cores[0].on_request_arrival("s1", 100)
        url = f"http://127.0.0.1:{http.server_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert _value(text, 'saga_replica_up{replica="r-a"}') == 1.0
        assert _value(text, 'saga_replica_up{replica="r-b"}') == 1.0
        assert dead not in text
        assert _value(text, 'saga_replica_requests_total{replica="r-a"}') == 1.0
        assert _value(text, 'saga_replica_sessions{replica="r-a"}') == 3.0
        assert _value(text, 'saga_replica_held_blocks{replica="r-a"}') == 12.0
        assert _value(text, 'saga_replica_pinned_blocks{replica="r-a"}') == 8.0
        assert 'saga_replica_held_blocks{replica="r-b"}' not in text
        assert _value(text, 'saga_tenant_served_tokens_total{tenant="acme"}') == 500.0
        assert _value(text, 'saga_tenant_served_tokens_total{tenant="zeta"}') == 50.0
        assert _value(text, 'saga_replica_homed_sessions{replica="r-a"}') == 2.0
        assert _value(text, 'saga_router_routes_total{reason="affinity"}') == 7.0
        assert _value(text, 'saga_router_steals_total{in_tool="true"}') == 1.0
        assert _value(text, 'saga_router_steals_total{in_tool="false"}') == 1.0
        assert _value(text, 'saga_router_peer_reports_total{result="ok"}') == 5.0
        # the next scrape sees new service at once
        cores[0].record_service("acme", 1)
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert _value(text, 'saga_tenant_served_tokens_total{tenant="acme"}') == 501.0
    finally:
        http.shutdown()
        for s in servers:
            s.close(grace=None)


def test_a_scrape_survives_failing_sources():
    def boom():
        raise RuntimeError("down")

    collector = ClusterCollector(boom, boom)
    names = {fam.name for fam in collector.collect()}
    assert "saga_replica_up" in names and "saga_router_steals" in names
