"""The Grafana dashboard (`deploy/grafana/saga.json`) queries only metrics and labels
that exist: SAGA's from the plugin's own registry, vLLM's from the installed vLLM."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "saga.json"
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def _queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    return [(t["expr"], t["legendFormat"]) for p in panels for t in p["targets"]]


def _saga_families() -> dict[str, set[str]]:
    """Each metric the plugin declares, with its label names."""
    from saga_server.engines.vllm.metrics import SagaMetrics

    return {m._name: set(m._labelnames) for m in vars(SagaMetrics.get()).values() if hasattr(m, "_labelnames")}


def test_the_dashboard_is_what_its_script_writes():
    done = subprocess.run([sys.executable, "scripts/grafana_dashboard.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_saga_metric_and_label_a_panel_queries_is_exported():
    families = _saga_families()
    for expr, legend in _queries():
        metrics = [_base(m, families) for m in re.findall(r"\bsaga_[a-z_]+", expr)]
        for metric in metrics:
            assert metric in families, f"{metric} in {expr!r} is not a metric the plugin exports"
        if not metrics:
            continue
        labels = set(re.findall(r"by \(([a-z_]+)\)", expr)) | set(re.findall(r"\{\{([a-z_]+)\}\}", legend))
        for label in labels:
            assert any(label in families[m] for m in metrics), f"label {label!r} is not one of {expr!r}'s"


def _base(metric: str, families: dict) -> str:
    """The family a sample name belongs to (`saga_pins_total` is `saga_pins`)."""
    return next((metric[: -len(s)] for s in _SUFFIXES if metric.endswith(s) and metric[: -len(s)] in families), metric)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_every_vllm_metric_a_panel_queries_is_one_vllm_defines():
    spec = importlib.util.find_spec("vllm")
    source = "\n".join(p.read_text(encoding="utf-8", errors="ignore")
                       for p in (Path(spec.origin).parent / "v1" / "metrics").rglob("*.py"))
    for expr, _ in _queries():
        for metric in re.findall(r"\bvllm:[a-z_]+", expr):
            name = metric.removesuffix("_total")
            assert f'"{name}"' in source, f"{metric} in {expr!r} is not a vLLM metric"
