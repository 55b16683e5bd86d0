"""Writes a run's JSON (every metric), a Markdown report and its PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from ..host_cpu import cpu_description
from .runner import BenchResult

__all__ = ["write_report", "format_table"]

_COLUMNS = [
    ("policy", "policy", "{}"),
    ("TCT mean s", "tct_mean_s", "{:.1f}"),
    ("p50 s", "tct_p50_s", "{:.1f}"),
    ("p99 s", "tct_p99_s", "{:.1f}"),
    ("TCT/saga", "tct_over_saga", "{:.2f}"),
    ("regen share", "regen_share", "{:.1%}"),
    ("recomputed", "recompute_share", "{:.1%}"),
    ("hit rate", "hit_rate", "{:.1%}"),
    ("mem util", "mem_util", "{:.1%}"),
    ("Belady ratio", "belady_ratio", "{:.2f}"),
    ("tasks/h", "tasks_per_hour", "{:.0f}"),
    ("tok/s", "tokens_per_s", "{:.0f}"),
    ("steals", "steals", "{}"),
    ("moved tok", "moved_tokens", "{}"),
    ("imbalance", "imbalance", "{:.2f}"),
    ("SLO", "slo", None),
    ("goodput/h", "goodput_per_hour", "{:.0f}"),
    ("slack used", "slack_used", "ratio"),
    ("wall s", "wall_s", "{:.1f}"),
]


def _fmt(value: Any, spec: str | None) -> str:
    if spec is None or spec == "ratio":  # per-tenant dict
        form = "{:.1%}" if spec is None else "{:.2f}"
        return " ".join(f"{k}:{form.format(v)}" for k, v in value.items()) if value else "-"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return spec.format(value)


def format_table(data: dict[str, Any]) -> str:
    """The per-policy table as Markdown (also what the CLI prints)."""
    head = "| " + " | ".join(c[0] for c in _COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in _COLUMNS) + "|"
    rows = [head, sep]
    for name, s in data["policies"].items():
        rows.append("| " + " | ".join(_fmt(s.get(key, name if key == "policy" else None), spec)
                                      for _, key, spec in _COLUMNS) + " |")
    return "\n".join(rows)


def _plots(res: BenchResult, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, run in res.runs.items():
        xs = sorted(run.tct_s)
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    ax.set_xlabel("task completion time (s)")
    ax.set_ylabel("fraction of tasks")
    ax.set_title("TCT CDF per policy")
    ax.legend(fontsize=8)
    save(fig, "tct_cdf.png")

    names = list(res.runs)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, [res.runs[n].summary["regen_share"] for n in names])
    ax.set_ylabel("share of GPU time regenerating evicted KV")
    ax.tick_params(axis="x", rotation=45, labelsize=8)
    save(fig, "regen_share.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in res.runs.items():
        if run.timeline and name != "infinite":
            ax.plot([t for t, _ in run.timeline], [u for _, u in run.timeline], label=name, lw=1)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("useful KV / pool")
    ax.set_title("KV memory utilisation over time")
    ax.legend(fontsize=8)
    save(fig, "mem_util.png")

    tenants = sorted({t for r in res.runs.values() for t in r.summary["slo"]})
    if tenants:
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / max(len(tenants), 1)
        for i, ten in enumerate(tenants):
            ax.bar([j + i * width for j in range(len(names))],
                   [res.runs[n].summary["slo"].get(ten, 0.0) for n in names], width, label=ten)
        ax.set_xticks([j + width * (len(tenants) - 1) / 2 for j in range(len(names))], names,
                      rotation=45, fontsize=8)
        ax.set_ylabel("tasks within deadline")
        ax.set_title("SLO attainment per tenant")
        ax.legend()
        save(fig, "slo.png")

    for rows, axis, fname, label in ((res.load_sweep, "load", "tct_vs_load.png", "load"),
                                     (res.kv_sweep, "kv_tokens", "tct_vs_kv.png",
                                      "KV pool per worker (tokens)"),
                                     (res.host_sweep, "host_tier_factor", "tct_vs_host.png",
                                      "host tier (multiple of the KV pool)")):
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for pol in dict.fromkeys(r["policy"] for r in rows):
            pts = sorted((r[axis], r["tct_mean_s"]) for r in rows if r["policy"] == pol)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=pol)
        ax.set_xlabel(label)
        ax.set_ylabel("mean TCT (s)")
        ax.legend(fontsize=8)
        save(fig, fname)
    return made


def _sweep_table(rows: list[dict[str, Any]], axis: str) -> str:
    if not rows:
        return ""
    pols = list(dict.fromkeys(r["policy"] for r in rows))
    values = sorted({r[axis] for r in rows})
    lines = [f"| {axis} | " + " | ".join(f"{p} TCT s" for p in pols) + " | " +
             " | ".join(f"{p} tok/s" for p in pols) + " |",
             "|" + "---|" * (1 + 2 * len(pols))]
    for v in values:
        by = {r["policy"]: r for r in rows if r[axis] == v}
        lines.append(f"| {v:g} | " + " | ".join(f"{by[p]['tct_mean_s']:.1f}" for p in pols) + " | " +
                     " | ".join(f"{by[p]['tokens_per_s']:.0f}" for p in pols) + " |")
    return "\n".join(lines)


def _load_text(sc: Mapping[str, Any]) -> str:
    """How a described scenario's tasks arrive, in words."""
    if sc.get("recorded_arrivals"):
        return "arrivals as recorded"
    return f"Poisson {sc['rate']} tasks/s" if sc["rate"] is not None else f"concurrency {sc['concurrency']}"


def write_report(res: BenchResult, out_dir: str | Path, plots: bool = True,
                 command: str = "", preface: str = "") -> Path:
    """`bench.json`, `report.md` (opening with `preface`, as preformatted text) and plots."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = res.to_json()
    data["command"] = command
    data["machine"] = cpu_description()  # where it ran; what it models is `scenario`
    (out / "bench.json").write_text(json.dumps(data, indent=2, default=str))
    made = _plots(res, out) if plots else []
    sc = data["scenario"]
    md = [f"# saga bench: {sc['name']}", ""]
    if command:
        md += ["Command:", "", f"    {command}", ""]
    if preface:
        md += ["```", preface, "```", ""]
    md += [f"{sc['tasks']} tasks on {sc['workers']} workers ({sc['model']} on {sc['gpu']}, TP={sc['tp']}, "
           f"KV pool {sc['kv_capacity_tokens_per_worker']} tokens per worker), "
           + _load_text(sc) + f", seed {sc['seed']}. Tenants: "
           + ", ".join(f"{t['name']} ({t['trace']}, weight {t['weight']}, deadline x{t['deadline_factor']})"
                       for t in sc["tenants"]) + ".", "", format_table(data), ""]
    if res.load_sweep:
        md += ["## Load sweep", "", _sweep_table(res.load_sweep, "load"), ""]
    if res.kv_sweep:
        md += ["## KV pool sweep", "", _sweep_table(res.kv_sweep, "kv_tokens"), ""]
    if res.host_sweep:
        md += ["## Host tier sweep", "", _sweep_table(res.host_sweep, "host_tier_factor"), ""]
    for name in made:
        md += [f"![{name}]({name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path
