"""Prometheus metrics of a `saga router` cluster (per replica, router, tenants).

`ClusterCollector` is read at scrape time, so figures are never staler than the
scrape: each engine's hint service answers `GetStats` (through the fan-out's
connections) and the SAGA request router's published counters come from Ray's
internal KV (`request_router.STATS_KV_KEY`). An engine that does not answer is
left out of that scrape; a scrape never fails because of one.

    saga_replica_up{replica}                      1 per engine that answered
    saga_replica_sessions{replica}                sessions holding KV there
    saga_replica_pinned_blocks{replica}           blocks pinned for tool calls
    saga_replica_held_blocks{replica}             blocks held for sessions
    saga_replica_requests_total{replica}          requests the engine admitted
    saga_replica_homed_sessions{replica}          sessions the router homes there
    saga_replica_inflight{replica}                requests the router has in flight there
    saga_router_routes_total{reason}              routing decisions (affinity, home, rehome, ...)
    saga_router_steals_total{in_tool}             sessions moved between replicas
    saga_router_reprefills_total{result}          KV moves by re-prefill on the target
    saga_router_kv_pulls_total{result}            KV moves over NIXL (ok, fell back to re-prefill)
    saga_router_pulled_tokens_total               prompt tokens whose KV the targets pulled
    saga_router_pull_seconds_total                time the pulled moves took
    saga_router_releases_total{result}            source copies released after a move
    saga_router_peer_reports_total{result}        cluster fair-share reports to engines
    saga_tenant_served_tokens_total{tenant}       tokens served per tenant, cluster-wide
                                                  (the `max_tenants` most served)

Replicas are labelled with Serve's replica id where the engine registered one,
else with its hint endpoint.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

if TYPE_CHECKING:
    from saga_proto import hints_pb2 as pb

log = logging.getLogger("saga.router")

__all__ = ["ClusterCollector", "serve_metrics"]

_REPLICA_KEY = re.compile(r"^(?P<name>[a-z_]+)\{(?P<label>.*)\}$")


class ClusterCollector:
    """`engine_stats()`: replica -> its engine's GetStats reply (`ServerStats`);
    `router_stats()`: the request router's published dict (may be empty)."""

    def __init__(self, engine_stats: Callable[[], Mapping[str, "pb.ServerStats"]],
                 router_stats: Callable[[], Mapping], max_tenants: int = 200) -> None:
        self._engine_stats = engine_stats
        self._router_stats = router_stats
        self._max_tenants = max_tenants

    def describe(self) -> list:
        return []  # names are fixed above; registering must not trigger a scrape

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415

        try:
            engines = dict(self._engine_stats())
        except Exception:
            log.exception("engine stats unavailable for /metrics")
            engines = {}
        try:
            router = dict(self._router_stats() or {})
        except Exception:
            log.exception("router stats unavailable for /metrics")
            router = {}

        up = GaugeMetricFamily("saga_replica_up", "SAGA engine answered this scrape", labels=["replica"])
        gauges = {field: GaugeMetricFamily(name, doc, labels=["replica"]) for field, name, doc in (
            ("held_sessions", "saga_replica_sessions", "Sessions holding KV on the replica"),
            ("pinned_blocks", "saga_replica_pinned_blocks", "KV blocks pinned for tool calls"),
            ("held_blocks", "saga_replica_held_blocks", "KV blocks held for sessions"))}
        requests = CounterMetricFamily("saga_replica_requests", "Requests the engine admitted", labels=["replica"])
        served: dict[str, float] = {}
        for replica, reply in sorted(engines.items()):
            stats = reply.stats
            up.add_metric([replica], 1.0)
            if reply.HasField("engine"):
                for field, fam in gauges.items():
                    fam.add_metric([replica], float(getattr(reply.engine, field)))
            if "requests_arrived" in stats:
                requests.add_metric([replica], float(stats["requests_arrived"]))
            for tenant, tokens in reply.served_tokens_by_tenant.items():
                served[tenant] = served.get(tenant, 0.0) + tokens
        yield up
        yield from gauges.values()
        yield requests

        homed = GaugeMetricFamily("saga_replica_homed_sessions", "Sessions the router homes on the replica",
                                  labels=["replica"])
        routes = CounterMetricFamily("saga_router_routes", "Routing decisions", labels=["reason"])
        for key, value in sorted((router.get("routing") or {}).items()):
            m = _REPLICA_KEY.match(key)
            if m and m["name"] == "replica_sessions":
                homed.add_metric([m["label"]], float(value))
            elif key.startswith("routes_"):
                routes.add_metric([key[len("routes_"):]], float(value))
        inflight = GaugeMetricFamily("saga_replica_inflight", "Requests in flight there (router's count)",
                                     labels=["replica"])
        for replica, value in sorted((router.get("inflight") or {}).items()):
            inflight.add_metric([replica], float(value))
        moves = router.get("moves") or {}
        steals = CounterMetricFamily("saga_router_steals", "Sessions moved between replicas", labels=["in_tool"])
        in_tool = float(moves.get("steals_in_tool", 0))
        steals.add_metric(["true"], in_tool)
        steals.add_metric(["false"], float(moves.get("steals", 0)) - in_tool)
        reprefills = CounterMetricFamily("saga_router_reprefills", "KV moves by re-prefill", labels=["result"])
        reprefills.add_metric(["ok"], float(moves.get("reprefills_ok", 0)))
        reprefills.add_metric(["failed"], float(moves.get("reprefills_failed", 0)))
        pulls = CounterMetricFamily("saga_router_kv_pulls", "KV moves over NIXL", labels=["result"])
        pulls.add_metric(["ok"], float(moves.get("pulls_ok", 0)))
        pulls.add_metric(["fallback"], float(moves.get("pull_fallbacks", 0)))
        pulled = CounterMetricFamily("saga_router_pulled_tokens", "Prompt tokens whose KV the targets pulled")
        pulled.add_metric([], float(moves.get("pulled_tokens", 0)))
        pull_s = CounterMetricFamily("saga_router_pull_seconds", "Time the pulled moves took")
        pull_s.add_metric([], float(moves.get("pull_seconds", 0)))
        releases = CounterMetricFamily("saga_router_releases", "Source copies released after a move",
                                       labels=["result"])
        releases.add_metric(["ok"], float(moves.get("releases_ok", 0)))
        releases.add_metric(["failed"], float(moves.get("releases_failed", 0)))
        peers = CounterMetricFamily("saga_router_peer_reports", "Cluster fair-share reports to engines",
                                    labels=["result"])
        peers.add_metric(["ok"], float(moves.get("peer_sends", 0)))
        peers.add_metric(["failed"], float(moves.get("peer_send_failures", 0)))
        yield from (homed, routes, inflight, steals, reprefills, pulls, pulled, pull_s, releases, peers)

        tenants = CounterMetricFamily("saga_tenant_served_tokens", "Tokens served per tenant, cluster-wide",
                                      labels=["tenant"])
        for tenant in sorted(served, key=served.__getitem__, reverse=True)[:self._max_tenants]:
            tenants.add_metric([tenant], served[tenant])
        yield tenants


def serve_metrics(collector: ClusterCollector, host: str, port: int):
    """Expose `collector` on http://host:port/metrics (own registry); returns the server."""
    from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415

    registry = CollectorRegistry()
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
