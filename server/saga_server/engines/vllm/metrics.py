"""Prometheus metrics of the SAGA scheduler plugin (names `saga_*`).

They are created in vLLM's EngineCore process, where the scheduler runs. `saga
serve` sets `PROMETHEUS_MULTIPROC_DIR` before vLLM starts, so prometheus_client
writes them to shared files and vLLM's API server (which then serves `/metrics`
from a multiprocess registry) shows them next to vLLM's own `vllm:*` metrics.
Without that variable, `SAGA_METRICS_PORT` starts a separate exporter in the
engine process instead (and neither: the numbers are kept but not exported).
Gauges use `livemax` so a dead engine's values disappear.
"""

from __future__ import annotations

import collections
import logging
import os

from saga_server import metrics_schema
from saga_server.metrics_schema import Kind, Metric

# Under "vllm." so vLLM's own log handler (and level) shows these lines.
log = logging.getLogger("vllm.saga")

__all__ = ["SagaMetrics", "PluginCounters"]

_MAX_TENANT_LABELS = 64


class SagaMetrics:
    """One set per process (prometheus names are process-global): use `get()`.
    Each metric of `metrics_schema.METRICS` is an attribute of its name (e.g.
    `self.held_blocks`, a Gauge); nothing else is made here."""

    _instance: "SagaMetrics | None" = None

    @classmethod
    def get(cls) -> "SagaMetrics":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self, registry=None) -> None:
        """`registry`: prometheus_client's default one unless given (a test's own)."""
        for m in metrics_schema.METRICS:
            setattr(self, m.name, _prometheus(m, registry))
        self._tenants: set[str] = set()

    def set_afs(self, tenant: str, priority: float) -> None:
        label = tenant or "-"
        if label not in self._tenants:
            if len(self._tenants) >= _MAX_TENANT_LABELS:
                label = "other"
            self._tenants.add(label)
        self.afs_priority.labels(label).set(priority)

    @staticmethod
    def maybe_start_exporter(port: int | None, host: str) -> int | None:
        """Without a multiprocess dir (vLLM's own, where `saga serve` runs it), export
        from this process on `port` (`EngineSettings.metrics_port`; None: no exporter)."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR") or not port:
            return None
        from prometheus_client import start_http_server  # noqa: PLC0415

        start_http_server(port, addr=host)
        log.info("SAGA metrics exporter on %s:%s", host, port)
        return port


class PluginCounters:
    """The engine's counted metrics (`metrics_schema.stats_metrics()`): each
    `count` or `set` moves the process-wide Prometheus figure operators scrape
    and this scheduler's own (GetStats' `EngineStats.counts`, read by `saga
    status`) at once. `counts`: (metric, label value) -> figure, "" for a metric
    without a label; written by the engine thread only."""

    def __init__(self, metrics: SagaMetrics) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._families = {m.name: (m, getattr(metrics, m.name)) for m in metrics_schema.stats_metrics()}

    def count(self, family: str, label: str = "", n: float = 1) -> None:
        """Add `n` to a counter of the schema (`label`: its label's value)."""
        self._prometheus(family, label, Kind.COUNTER).inc(n)
        self.counts[family, label] += n

    def set(self, name: str, value: float, label: str = "") -> None:
        """Set a gauge of the schema to `value`."""
        self._prometheus(name, label, Kind.GAUGE).set(value)
        self.counts[name, label] = value

    def _prometheus(self, name: str, label: str, kind: Kind):
        m, family = self._families.get(name, (None, None))
        if m is None or m.kind is not kind or bool(label) != bool(m.label):
            raise ValueError(f"{name}{{{label}}} is no {kind.value} the engine counts (metrics_schema)")
        return family.labels(label) if label else family

    def __getitem__(self, key: tuple[str, str] | str) -> float:
        """`counters["pins", "used"]`, or `counters["kv_pulled_tokens"]` for a metric without a label."""
        return self.counts[key if isinstance(key, tuple) else (key, "")]

    def total(self, family: str) -> float:
        return sum(n for (name, _), n in list(self.counts.items()) if name == family)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """The counts now, by metric then label (GetStats' `EngineStats.counts`);
        safe from another thread."""
        out: dict[str, dict[str, float]] = {}
        for (name, label), n in dict(self.counts).items():  # one C-level copy
            out.setdefault(name, {})[label] = float(n)
        return out


def _prometheus(m: Metric, registry=None):
    """The prometheus_client object of one metric of the schema."""
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram  # noqa: PLC0415

    into = {"registry": REGISTRY if registry is None else registry}
    if m.kind is Kind.COUNTER:
        return Counter(m.exported_name, m.help, m.labels, **into)
    if m.kind is Kind.GAUGE:
        return Gauge(m.exported_name, m.help, m.labels, multiprocess_mode="livemax", **into)
    return Histogram(m.exported_name, m.help, m.labels, buckets=m.buckets, **into)
