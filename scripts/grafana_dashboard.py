"""Writes `deploy/grafana/saga.json`, a Grafana dashboard of SAGA's `saga_*` metrics
next to vLLM's own, for a Prometheus that scrapes `saga serve`'s `/metrics`.

    python scripts/grafana_dashboard.py            # rewrite the dashboard
    python scripts/grafana_dashboard.py --check    # exit 1 when it is stale

Import the file in Grafana (Dashboards > New > Import) and pick the Prometheus data
source. `tests/fast/test_grafana_dashboard.py` checks that every metric and label a
panel queries is one the plugin or vLLM exports.
"""

from __future__ import annotations

import json
import sys

from generated_file import ROOT, write_or_check

OUT = ROOT / "deploy" / "grafana" / "saga.json"
RATE = "[$__rate_interval]"

# (title, unit, [(expression, legend)], what an operator reads from it)
PANELS = [
    ("Sessions", "short", [("saga_active_sessions", "live"), ("saga_held_sessions", "idle, KV held"),
                           ("sum by (state) (saga_admission_sessions)", "admission: {{state}}")],
     "Live agent sessions, those paused in a tool whose KV SAGA keeps, and session admission's states."),
    ("KV held for idle sessions", "short", [("saga_held_blocks", "held blocks"), ("saga_pinned_blocks", "TTL-pinned")],
     "Blocks kept for sessions that are expected back; pins never block progress (released under pressure)."),
    ("KV pool usage", "percentunit", [("vllm:kv_cache_usage_perc", "pool used")],
     "vLLM's own view of its KV pool."),
    ("Session prefix hit rate", "percentunit",
     [(f"sum(rate(saga_prefix_hit_tokens_total{RATE})) / sum(rate(saga_session_prompt_tokens_total{RATE}))",
       "session prompt tokens from cache"),
      (f"sum(rate(vllm:prefix_cache_hits_total{RATE})) / sum(rate(vllm:prefix_cache_queries_total{RATE}))",
       "all requests (vLLM)")],
     "What SAGA is for: an agent's next call finds its context cached."),
    ("Evictions of held KV", "short", [(f"sum by (reason) (rate(saga_evicted_blocks_total{RATE}))", "{{reason}}")],
     "Held blocks given back to vLLM, by why."),
    ("Pins", "short", [(f"sum by (event) (rate(saga_pins_total{RATE}))", "{{event}}")],
     "Tool-aware TTL pins created, expired and reclaimed."),
    ("Prefetches", "short", [(f"sum by (outcome) (rate(saga_prefetches_total{RATE}))", "{{outcome}}")],
     "Speculative re-prefills before a tool's predicted end, by outcome."),
    ("Host KV tier", "percentunit", [("sum(saga_kv_tier_used_chunks) / sum(saga_kv_tier_chunks)", "occupancy")],
     "Occupancy of the host tier (`--kv-offloading-size`)."),
    ("Host tier traffic", "short",
     [(f"sum by (direction) (rate(saga_kv_tier_blocks_total{RATE}))", "blocks {{direction}}"),
      (f"sum(rate(saga_kv_tier_hit_tokens_total{RATE}))", "prompt tokens served from the tier")],
     "Blocks stored and loaded, and the prompt tokens the tier saved from recompute."),
    ("Session admission", "short",
     [(f"sum by (event) (rate(saga_admission_total{RATE}))", "{{event}}"),
      (f"sum(rate(saga_admission_wait_seconds_total{RATE}))", "seconds waited per second")],
     "Admission under KV overload: decisions, and how long requests waited to be admitted."),
    ("Deadline shaping", "short",
     [(f"sum by (event) (rate(saga_deadline_shaping_total{RATE}))", "{{event}}")],
     "While an at-risk session runs: checks that held a slack-rich request, and steps with a thinned prefill budget."),
    ("Agent Fair Share priority", "short", [("saga_afs_priority", "{{tenant}}")],
     "Priority of each tenant's waiting work (lower runs sooner)."),
    ("Queue", "short", [("vllm:num_requests_running", "running"), ("vllm:num_requests_waiting", "waiting")],
     "vLLM's running and waiting requests."),
    ("Sessions forgotten", "short", [(f"sum by (how) (rate(saga_sessions_forgotten_total{RATE}))", "{{how}}")],
     "How sessions left SAGA's tables: ended, idle, over the cap. A rising 'idle' means agents that never say goodbye."),
    ("SAGA health", "short",
     [(f"sum(rate(saga_plugin_errors_total{RATE}))", "plugin errors caught"),
      (f"sum(rate(saga_engine_hints_dropped_total{RATE}))", "hints dropped (flood)"),
      (f"sum by (hook) (rate(saga_plugin_seconds_total{RATE}))", "scheduler time: {{hook}}")],
     "Should stay near zero: exceptions the plugin absorbed, hints shed, time in SAGA's hooks."),
]


def dashboard() -> dict:
    panels = []
    for n, (title, unit, targets, description) in enumerate(PANELS):
        panels.append({
            "id": n + 1, "type": "timeseries", "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (n % 2), "y": 8 * (n // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for i, (expr, legend) in enumerate(targets)],
        })
    return {
        "title": "SAGA", "uid": "saga-overview", "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "tags": ["saga", "vllm"],
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    return write_or_check(OUT, render(), argv, "grafana_dashboard.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
