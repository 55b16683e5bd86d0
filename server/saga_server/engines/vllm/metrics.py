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

# Under "vllm." so vLLM's own log handler (and level) shows these lines.
log = logging.getLogger("vllm.saga")

__all__ = ["SagaMetrics", "PluginCounters"]

_MAX_TENANT_LABELS = 64


class SagaMetrics:
    """One set per process (prometheus names are process-global): use `get()`."""

    _instance: "SagaMetrics | None" = None

    @classmethod
    def get(cls) -> "SagaMetrics":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram  # noqa: PLC0415

        g = {"multiprocess_mode": "livemax"}
        self.held_blocks = Gauge("saga_held_blocks", "KV blocks SAGA holds for idle sessions (pins + soft holds)", **g)
        self.pinned_blocks = Gauge("saga_pinned_blocks", "KV blocks under a hard TTL pin", **g)
        self.held_sessions = Gauge("saga_held_sessions", "Idle sessions whose KV SAGA holds", **g)
        self.pins = Counter("saga_pins", "Pin lifecycle events", ["event"])
        # event: created, refused (over_tenant_cap: of them, over the tenant's cap), expired (TTL),
        # reclaimed (memory), used (next request came), ended
        self.evictions = Counter("saga_evicted_blocks", "Held KV blocks given back to vLLM's free queue, by reason",
                                 ["reason"])
        self.prefix_hit_tokens = Counter("saga_prefix_hit_tokens", "Prompt tokens of session requests served from cache")
        self.session_prompt_tokens = Counter("saga_session_prompt_tokens", "Prompt tokens of session requests")
        self.session_hit_ratio = Histogram("saga_session_prefix_hit_ratio",
                                           "Per request of a known session: cached / prompt tokens",
                                           buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0))
        self.prefetch = Counter("saga_prefetches", "Speculative re-prefills of paused sessions", ["outcome"])
        # outcome: issued, used (the session's next request hit it), wasted (evicted or session ended first)
        self.active_sessions = Gauge("saga_active_sessions", "Live sessions known to the workflow core", **g)
        self.open_tool_calls = Gauge("saga_open_tool_calls", "Tool calls started and not ended (hints)", **g)
        self.afs_priority = Gauge("saga_afs_priority", "Agent Fair Share priority of waiting work (lower = sooner)",
                                  ["tenant"], **g)
        self.admission = Counter("saga_admission", "Session admission decisions", ["event"])
        self.deadline = Counter("saga_deadline_shaping",
                                "Deadline shaping: checks that held a slack-rich request, steps with a thinned budget",
                                ["event"])
        self.forgotten = Counter("saga_sessions_forgotten",
                                 "Sessions this engine forgot (every per-session table), by how they stopped being live",
                                 ["how"])  # how: ended, expired (idle), evicted (the core's table was full), moved
        # event: admitted (a waiting session may run), parked (an idle one gave way)
        self.admission_wait = Counter("saga_admission_wait_seconds", "Time requests waited to be admitted")
        self.admission_sessions = Gauge("saga_admission_sessions", "Sessions by admission state", ["state"], **g)
        # state: active, parked, waiting
        self.kv_pulls = Counter("saga_kv_pulls", "KV pulls from another engine over NIXL (session moves)",
                                ["outcome"])  # outcome: ok, failed (vLLM recomputed the prefix)
        self.kv_pulled_tokens = Counter("saga_kv_pulled_tokens", "Prompt tokens whose KV was pulled, not computed")
        self.kv_pull_seconds = Counter("saga_kv_pull_seconds", "Time from a pull's start to its end")
        self.kv_tier_blocks = Counter("saga_kv_tier_blocks", "KV blocks copied to and from the host tier",
                                      ["direction"])  # direction: stored, loaded
        self.kv_tier_loads = Counter("saga_kv_tier_loads", "Requests' loads from the host tier", ["outcome"])
        self.kv_tier_load_seconds = Counter("saga_kv_tier_load_seconds", "Time from a tier load's start to its end")
        self.kv_tier_hit_tokens = Counter("saga_kv_tier_hit_tokens",
                                          "Prompt tokens loaded from the host tier (not computed, not pool hits)")
        self.kv_tier_used_chunks = Gauge("saga_kv_tier_used_chunks", "Host tier chunks holding KV", **g)
        self.kv_tier_chunks = Gauge("saga_kv_tier_chunks", "Host tier capacity in chunks", **g)
        self.hints_dropped = Counter("saga_engine_hints_dropped", "Hint events the engine queue dropped (flood)")
        self.plugin_errors = Counter("saga_plugin_errors", "Exceptions the plugin caught to keep vLLM serving",
                                     ["where"])
        self.plugin_seconds = Counter("saga_plugin_seconds", "Time spent in SAGA's scheduler hooks (engine thread)",
                                      ["hook"])
        self._tenants: set[str] = set()

    def set_afs(self, tenant: str, priority: float) -> None:
        label = tenant or "-"
        if label not in self._tenants:
            if len(self._tenants) >= _MAX_TENANT_LABELS:
                label = "other"
            self._tenants.add(label)
        self.afs_priority.labels(label).set(priority)

    @staticmethod
    def maybe_start_exporter() -> int | None:
        """Without a multiprocess dir, export from this process on SAGA_METRICS_PORT."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return None
        port = os.environ.get("SAGA_METRICS_PORT")
        if not port:
            return None
        from prometheus_client import start_http_server  # noqa: PLC0415

        start_http_server(int(port), addr=os.environ.get("SAGA_METRICS_HOST", "127.0.0.1"))
        log.info("SAGA metrics exporter on port %s", port)
        return int(port)


class PluginCounters:
    """Every counted SAGA event, counted twice under one name: the process-wide
    Prometheus counter operators scrape, and this scheduler's own count (GetStats'
    `ServerStats.engine.counters`, `<family>_<label>`, read by `saga status`)."""

    def __init__(self, metrics: SagaMetrics) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._families = {"pins": metrics.pins, "released": metrics.evictions, "prefetch": metrics.prefetch,
                          "plugin_errors": metrics.plugin_errors, "plugin_seconds": metrics.plugin_seconds,
                          "kv_pulls": metrics.kv_pulls, "forgotten": metrics.forgotten,
                          "kv_tier_blocks": metrics.kv_tier_blocks, "kv_tier_loads": metrics.kv_tier_loads,
                          "deadline": metrics.deadline}

    def count(self, family: str, label: str, n: float = 1) -> None:
        self._families[family].labels(label).inc(n)
        self.counts[f"{family}_{label}"] += n

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def total(self, family: str) -> int:
        return sum(n for name, n in self.counts.items() if name.startswith(family + "_"))
