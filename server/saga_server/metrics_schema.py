"""Every metric an engine reports, declared once: name, kind, label, unit and help.

From this list are made the Prometheus objects of the vLLM plugin (`saga_<name>`,
`engines.vllm.metrics`), the counts an engine reports in GetStats
(`core.EngineStats.counts`: metric -> label value -> figure, "" for a metric
without a label) and the engine's lines of `saga status`. A metric `in_stats`
is updated by one call that moves both its Prometheus figure and the engine's
own count (`PluginCounters.count` / `.set`); the others are Prometheus only,
because GetStats reports them as typed fields (`EngineStats.held_blocks`,
`.admission`, `.hints_dropped`) or as the core's stats.

Pure data, standard library only: the engine, the hint service's readers and
`saga status` (which must not load the core nor prometheus_client) import it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

__all__ = ["Kind", "Metric", "METRICS", "stats_metrics", "status_lines"]


class Kind(enum.Enum):
    COUNTER = "counter"  # cumulative since the engine started
    GAUGE = "gauge"  # the value at the last update
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric. `label`: the name of its one label ("" for none), `values`: the
    label's values it is known to take (others may come, from the code that
    counts: a hook's or a release reason's name). `prometheus`: its exported name
    where it is not `saga_<name>`. `buckets`: a histogram's."""

    name: str
    kind: Kind
    help: str
    unit: str = ""  # "blocks", "tokens", "seconds", "sessions", ... ("" for events)
    label: str = ""
    values: tuple[str, ...] = ()
    in_stats: bool = True
    prometheus: str = ""
    buckets: tuple[float, ...] = ()

    @property
    def exported_name(self) -> str:
        return self.prometheus or f"saga_{self.name}"

    @property
    def labels(self) -> tuple[str, ...]:
        return (self.label,) if self.label else ()


C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM

METRICS: tuple[Metric, ...] = (
    # KV SAGA keeps for idle sessions (GetStats: EngineStats' typed fields)
    Metric("held_blocks", G, "KV blocks SAGA holds for idle sessions (pins + soft holds)", "blocks", in_stats=False),
    Metric("pinned_blocks", G, "KV blocks under a hard TTL pin", "blocks", in_stats=False),
    Metric("held_sessions", G, "Idle sessions whose KV SAGA holds", "sessions", in_stats=False),
    Metric("pins", C, "Pin lifecycle events", label="event",
           values=("created", "refused", "over_tenant_cap", "used", "unpinned", "expired", "reclaimed", "ended")),
    Metric("released", C, "Held KV blocks given back to vLLM's free queue, by reason", "blocks", label="reason",
           prometheus="saga_evicted_blocks"),
    # Prefix reuse of session requests
    Metric("prefix_hit_tokens", C, "Prompt tokens of session requests served from cache", "tokens"),
    Metric("session_prompt_tokens", C, "Prompt tokens of session requests", "tokens"),
    Metric("session_hit_ratio", H, "Per request of a known session: cached / prompt tokens", in_stats=False,
           prometheus="saga_session_prefix_hit_ratio", buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)),
    Metric("prefetch", C, "Speculative re-prefills of paused sessions", label="outcome",
           values=("issued", "used", "wasted"), prometheus="saga_prefetches"),
    # Sessions and scheduling (GetStats: the core's stats, AdmissionStats)
    Metric("active_sessions", G, "Live sessions known to the workflow core", "sessions", in_stats=False),
    Metric("open_tool_calls", G, "Tool calls started and not ended (hints)", in_stats=False),
    Metric("afs_priority", G, "Agent Fair Share priority of waiting work (lower = sooner)", label="tenant",
           in_stats=False),
    Metric("afs_reorders", C, "Scheduler steps whose waiting queue Agent Fair Share reordered"),
    Metric("admission", C, "Session admission decisions", label="event", values=("admitted", "parked"),
           in_stats=False),
    Metric("admission_wait", C, "Time requests waited to be admitted", "seconds", in_stats=False,
           prometheus="saga_admission_wait_seconds"),
    Metric("admission_sessions", G, "Sessions by admission state", "sessions", label="state",
           values=("active", "parked", "waiting"), in_stats=False),
    Metric("deadline", C, "Deadline shaping: checks that held a slack-rich request, steps with a thinned budget",
           label="event", values=("held", "thin_step"), prometheus="saga_deadline_shaping"),
    Metric("forgotten", C, "Sessions this engine forgot (every per-session table), by how they stopped being live",
           "sessions", label="how", values=("ended", "expired", "evicted", "moved"),
           prometheus="saga_sessions_forgotten"),
    # KV pulled from another engine (session moves)
    Metric("kv_pulls", C, "KV pulls from another engine over NIXL (session moves)", label="outcome",
           values=("ok", "failed")),
    Metric("kv_pulled_tokens", C, "Prompt tokens whose KV was pulled, not computed", "tokens"),
    Metric("kv_pull_seconds", C, "Time from a pull's start to its end", "seconds"),
    # The host (CPU) KV tier
    Metric("kv_tier_blocks", C, "KV blocks copied to and from the host tier", "blocks", label="direction",
           values=("stored", "loaded")),
    Metric("kv_tier_loads", C, "Requests' loads from the host tier", label="outcome", values=("ok", "failed")),
    Metric("kv_tier_load_seconds", C, "Time from a tier load's start to its end", "seconds"),
    Metric("kv_tier_hit_tokens", C, "Prompt tokens loaded from the host tier (not computed, not pool hits)",
           "tokens"),
    Metric("kv_tier_used_chunks", G, "Host tier chunks holding KV", "chunks"),
    Metric("kv_tier_chunks", G, "Host tier capacity in chunks", "chunks"),
    # The disk KV tier below the host tier
    Metric("kv_disk_chunks", C, "Disk tier chunks by what happened to them", "chunks", label="what",
           values=("written", "read", "evicted", "write_failed", "read_failed", "skipped_full", "skipped_slow",
                   "slow_reads")),
    Metric("kv_disk_used_chunks", G, "Disk tier chunks holding KV", "chunks"),
    Metric("kv_disk_capacity_chunks", G, "Disk tier capacity in chunks", "chunks"),
    # The plugin itself
    Metric("hints_dropped", C, "Hint events the engine queue dropped (flood)", in_stats=False,
           prometheus="saga_engine_hints_dropped"),
    Metric("plugin_errors", C, "Exceptions the plugin caught to keep vLLM serving", label="where"),
    Metric("plugin_seconds", C, "Time spent in SAGA's scheduler hooks (engine thread)", "seconds", label="hook"),
)



def stats_metrics() -> tuple[Metric, ...]:
    """The metrics an engine also reports in GetStats (`in_stats`), in the schema's order."""
    return tuple(m for m in METRICS if m.in_stats)


Counts = Mapping[str, Mapping[str, float]]  # metric -> label value -> figure ("" for no label)


def status_lines(counts: Counts, shown: frozenset[str] = frozenset()) -> list[str]:
    """`saga status`'s line of each counted metric in `counts` (in the schema's
    order, leaving out those `shown` elsewhere): `name{label}: value, ... unit`. A
    metric the schema does not name (a newer engine's) comes last, as it came."""
    lines = []
    for m in stats_metrics():
        by_label = counts.get(m.name)
        if by_label and m.name not in shown:
            unit = f" {m.unit}" if m.unit else ""
            if m.label:
                figures = ", ".join(f"{label} {_num(v)}" for label, v in sorted(by_label.items()))
                lines.append(f"  {m.name}{{{m.label}}}: {figures}{unit}")
            else:
                lines.append(f"  {m.name}: {_num(sum(by_label.values()))}{unit}")
    for name in sorted(set(counts) - {m.name for m in METRICS} - shown):
        lines.append(f"  {name}: " + ", ".join(f"{k or '-'} {_num(v)}" for k, v in sorted(counts[name].items())))
    return lines


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.3g}"
