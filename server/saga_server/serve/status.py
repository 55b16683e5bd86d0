"""Read SAGA's metrics from a running `saga serve` (its `/metrics`, next to vLLM's).

`fetch_metrics(base_url)` returns `{"name{label=value,...}": value}` for every
`saga_*` sample (plus a few vLLM ones an operator reads alongside: KV usage,
prefix-cache hits and queries, running/waiting requests), summed over processes.
Standard library only: `saga status` must not need prometheus_client.
"""

from __future__ import annotations

import math
import re
import urllib.request

__all__ = ["fetch_metrics", "parse_metrics", "VLLM_ALONGSIDE"]

VLLM_ALONGSIDE = ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                  "vllm:num_requests_running", "vllm:num_requests_waiting")
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_DROP_LABELS = {"pid", "engine", "model_name"}


def parse_metrics(text: str, prefixes: tuple[str, ...] = ("saga_",) + VLLM_ALONGSIDE) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m or not m.group(1).startswith(prefixes):
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if name.endswith(("_created", "_bucket")):
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        if math.isnan(v):
            continue
        kept = [(k, val) for k, val in _LABEL.findall(labels) if k not in _DROP_LABELS]
        key = name + ("{" + ",".join(f"{k}={val}" for k, val in sorted(kept)) + "}" if kept else "")
        out[key] = out.get(key, 0.0) + v  # several processes: the sum
    return out


def fetch_metrics(base_url: str, timeout: float = 5.0) -> dict[str, float]:
    """GET {base_url}/metrics and return the SAGA (and alongside vLLM) samples."""
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    with urllib.request.urlopen(url + "/metrics", timeout=timeout) as resp:
        return parse_metrics(resp.read().decode("utf-8", "replace"))
