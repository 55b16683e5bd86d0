"""Every metric an engine reports comes from one schema (`saga_server.metrics_schema`):
the plugin's Prometheus families, the counts GetStats carries and `saga status`'s
lines are made from it, so a metric added there appears in all three and a family
declared anywhere else fails here."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry  # noqa: E402

from saga_server import metrics_schema  # noqa: E402
from saga_server.core import EngineStats  # noqa: E402
from saga_server.engines.vllm.metrics import PluginCounters, SagaMetrics  # noqa: E402
from saga_server.metrics_schema import Kind, Metric  # noqa: E402
from saga_server.rpc.convert import engine_stats_to_wire  # noqa: E402
from saga_server.status import render  # noqa: E402


def fresh_counters() -> tuple[CollectorRegistry, PluginCounters]:
    registry = CollectorRegistry()
    return registry, PluginCounters(SagaMetrics(registry))


def test_the_plugins_prometheus_families_are_the_schemas_and_no_others():
    registry, _ = fresh_counters()
    exported = {f.name: f.type for f in registry.collect()}
    assert exported == {m.exported_name: m.kind.value for m in metrics_schema.METRICS}
    # The process-wide set too: no family made by hand beside the schema's.
    made = {v._name: tuple(v._labelnames) for v in vars(SagaMetrics.get()).values() if hasattr(v, "_labelnames")}
    assert made == {m.exported_name: m.labels for m in metrics_schema.METRICS}


def test_a_metric_added_to_the_schema_is_exported_reported_and_shown(monkeypatch):
    widgets = Metric("widgets", Kind.COUNTER, "Widgets made", "widgets", label="colour")
    monkeypatch.setattr(metrics_schema, "METRICS", metrics_schema.METRICS + (widgets,))
    registry, counters = fresh_counters()
    counters.count("widgets", "blue", 2)
    assert registry.get_sample_value("saga_widgets_total", {"colour": "blue"}) == 2.0
    wire = engine_stats_to_wire(EngineStats(counts=counters.snapshot()))
    assert {name: dict(c.by_label) for name, c in wire.counts.items()} == {"widgets": {"blue": 2.0}}
    assert "  widgets{colour}: blue 2 widgets" in render({}, [], engine=wire).splitlines()


def test_every_counted_metric_reaches_get_stats_and_saga_status_once():
    registry, counters = fresh_counters()
    counted = metrics_schema.stats_metrics()
    for i, m in enumerate(counted, start=1):
        label = "x" if m.label else ""
        if m.kind is Kind.COUNTER:
            counters.count(m.name, label, n=1000 + i)
        else:
            counters.set(m.name, 1000 + i, label)
        sample = m.exported_name + ("_total" if m.kind is Kind.COUNTER else "")
        assert registry.get_sample_value(sample, {m.label: "x"} if m.label else {}) == 1000 + i
    wire = engine_stats_to_wire(EngineStats(counts=counters.snapshot()))
    assert list(wire.counts) and set(wire.counts) == {m.name for m in counted}
    out = render({}, [], engine=wire)
    for i, m in enumerate(counted, start=1):
        assert out.count(str(1000 + i)) == 1, f"{m.name}'s figure is shown {out.count(str(1000 + i))} times"


def test_only_a_counted_metric_of_the_schema_can_be_counted():
    _, counters = fresh_counters()
    for wrong in (lambda: counters.count("no_such_metric"),
                  lambda: counters.count("pins"),  # its label is missing
                  lambda: counters.count("kv_pulled_tokens", "ok"),  # it has no label
                  lambda: counters.count("held_blocks"),  # a gauge GetStats reports as a typed field
                  lambda: counters.set("pins", 3, "created")):  # a counter, not a gauge
        with pytest.raises(ValueError):
            wrong()
    assert counters.counts == {}
