"""Write docs/RESULTS.md, with small PNG figures in docs/results/, from benchmark outputs.

    PYTHONPATH=sdk:server .venv/bin/python scripts/results_page.py \\
        --replay replay.json --sim-vs-engine sim-vs-engine.json --bench bench-out/bench.json \\
        --chaos chaos.md

Where each input comes from:

    --replay         python -m benchmarks.serve_trace_replay --json FILE   (real vLLM on this machine)
    --sim-vs-engine  python -m benchmarks.sim_vs_engine --json FILE          (the simulator against that replay)
    --bench          saga bench --out DIR, then DIR/bench.json             (the simulator, per policy)
    --chaos          SAGA_CHAOS_TABLE=FILE make test                       (the chaos and load suite's table)

Every input is optional; the page has one section per input given, in that order,
each figure with the command and the machine its input came from, as the input
recorded them ("not recorded" for an older file). Rerun it after a benchmark rerun:
the page and its figures are rewritten (`--out DIR` writes elsewhere).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURE_SIZE = (5.6, 3.4)
FIGURE_DPI = 100


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replay", type=Path, help="serve_trace_replay.py --json output")
    p.add_argument("--sim-vs-engine", type=Path, help="sim_vs_engine.py --json output")
    p.add_argument("--bench", type=Path, help="saga bench's bench.json")
    p.add_argument("--chaos", type=Path, help="the chaos table (SAGA_CHAOS_TABLE)")
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="where RESULTS.md and results/ go")
    args = p.parse_args(argv)
    if not any((args.replay, args.sim_vs_engine, args.bench, args.chaos)):
        p.error("give at least one input")
    try:
        inputs = {name: (path, _read(path)) for name, path in
                  (("replay", args.replay), ("sim_vs_engine", args.sim_vs_engine), ("bench", args.bench),
                   ("chaos", args.chaos)) if path}
    except (OSError, ValueError) as exc:
        print(f"results_page: {exc}", file=sys.stderr)
        return 2
    figures = args.out / "results"
    figures.mkdir(parents=True, exist_ok=True)
    sections = [SECTIONS[name](data, figures, path) for name, (path, data) in inputs.items()]
    page = ["# Results", "",
            "Measured results as pictures, made by `scripts/results_page.py` from the benchmarks' own",
            "output files; each section names the command and the machine it came from. What each",
            "benchmark measures and how to read it: `docs/RESEARCH.md`.", ""]
    for section in sections:
        page += section + [""]
    (args.out / "RESULTS.md").write_text("\n".join(page).rstrip() + "\n")
    print(f"wrote {args.out / 'RESULTS.md'} and {len(list(figures.glob('*.png')))} figures in {figures}")
    return 0


def _read(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
    return text


def _provenance(data: dict, fallback_command: str) -> list[str]:
    machine = data.get("machine")
    if isinstance(machine, dict):
        machine = f"{machine.get('model') or 'unknown CPU'}, {machine.get('cores', '?')} cores"
    command = data.get("command") or fallback_command
    return [f"Command: `{command}`", "", f"Machine: {machine or 'not recorded'}", ""]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=FIGURE_DPI)
    _plt().close(fig)
    return f"![{path.stem}](results/{path.name})"


def _cdf(ax, times: list[float], label: str) -> None:
    xs = sorted(times)
    ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label)


def _num(value: Any, fmt: str = ".1f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not math.isnan(value) else "n/a"


def replay_section(data: dict, figures: Path, path: Path) -> list[str]:
    """The real engine: each mode's task completion times, side by side in one run."""
    results = data.get("results", [])
    plt = _plt()
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    for r in results:
        if r.get("tct_s"):
            _cdf(ax, r["tct_s"], f"{r['mode']} (mean {r['tct_mean_s']:.0f} s)")
    ax.set_xlabel("task completion time (s)")
    ax.set_ylabel("fraction of tasks")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    figure = _save(fig, figures / "replay_tct.png")
    rows = ["| mode | mean task time s | p90 s | prefix + tier hit rate | regen share |", "|---|---|---|---|---|"]
    rows += [f"| {r['mode']} | {_num(r.get('tct_mean_s'))} | {_num(r.get('tct_p90_s'))} | "
             f"{_num(r.get('hit_rate'), '.3f')} | {_num(r.get('regen_share'), '.3f')} |" for r in results]
    return (["## Real vLLM: agent sessions replayed, one engine per mode", ""]
            + _provenance(data, f"python -m benchmarks.serve_trace_replay --json {path.name}") + [figure, ""] + rows)


def sim_vs_engine_section(data: dict, figures: Path, path: Path) -> list[str]:
    """The simulator's prediction of each mode's mean task time beside the measurement."""
    measured, predicted = data.get("measured", {}), data.get("predicted", {})
    modes = [m for m in measured if m in predicted]
    plt = _plt()
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    xs = range(len(modes))
    ax.bar([x - 0.2 for x in xs], [measured[m]["tct_mean_s"] for m in modes], 0.4, label="measured (vLLM)")
    ax.bar([x + 0.2 for x in xs], [predicted[m]["tct_mean_s"] for m in modes], 0.4, label="simulated")
    ax.set_xticks(list(xs), modes, rotation=20, fontsize=7)
    ax.set_ylabel("mean task time (s)")
    ax.legend(fontsize=7)
    figure = _save(fig, figures / "sim_vs_engine.png")
    rows = ["| mode | measured s | simulated s | error |", "|---|---|---|---|"]
    for m in modes:
        got, want = measured[m]["tct_mean_s"], predicted[m]["tct_mean_s"]
        rows.append(f"| {m} | {_num(got)} | {_num(want)} | {want / got - 1:+.1%} |")
    ratios = data.get("ratios", {})
    if ratios:
        rows += ["", "| ratio of mean task times | measured | simulated |", "|---|---|---|"]
        rows += [f"| {k} | {v['measured']:.2f}x | {v['predicted']:.2f}x |" for k, v in ratios.items()]
    return (["## The simulator against the engine it models", ""]
            + _provenance(data, f"python -m benchmarks.sim_vs_engine --json {path.name}") + [figure, ""] + rows)


def bench_section(data: dict, figures: Path, path: Path) -> list[str]:
    """`saga bench`: each policy's task times, and the load sweep where there is one."""
    policies = data.get("policies", {})
    sc = data.get("scenario", {})
    plt = _plt()
    shown = []
    if any(r.get("tct_s") for r in policies.values()):
        fig, ax = plt.subplots(figsize=FIGURE_SIZE)
        for name, r in policies.items():
            if r.get("tct_s"):
                _cdf(ax, r["tct_s"], name)
        ax.set_xlabel("task completion time (s)")
        ax.set_ylabel("fraction of tasks")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        shown.append(_save(fig, figures / "bench_tct.png"))
    sweep = data.get("load_sweep") or []
    if sweep:
        fig, ax = plt.subplots(figsize=FIGURE_SIZE)
        for pol in dict.fromkeys(r["policy"] for r in sweep):
            pts = sorted((r["load"], r["tct_mean_s"]) for r in sweep if r["policy"] == pol)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=pol)
        ax.set_xlabel("sessions in flight" if sc.get("rate") is None else "tasks per second")
        ax.set_ylabel("mean task time (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        shown.append(_save(fig, figures / "bench_load.png"))
    where = (f"{sc.get('tasks', '?')} tasks on {sc.get('workers', '?')} workers, {sc.get('model', '?')} on "
             f"{sc.get('gpu', '?')} (simulated)")
    rows = ["| policy | mean task time s | p90 s | hit rate | regen share |", "|---|---|---|---|---|"]
    rows += [f"| {name} | {_num(r.get('tct_mean_s'))} | {_num(r.get('tct_p90_s'))} | "
             f"{_num(r.get('hit_rate'), '.3f')} | {_num(r.get('regen_share'), '.3f')} |"
             for name, r in policies.items()]
    return (["## The simulator, per policy", "", where, ""]
            + _provenance(data, f"saga bench --out {path.parent.name}") + shown + [""] + rows)


def chaos_section(text: str, figures: Path, path: Path) -> list[str]:
    """The chaos and load suite's table, as the suite wrote it."""
    table = [line for line in text.splitlines() if line.startswith("|")]
    meta = [line for line in text.splitlines() if line and not line.startswith("|")]
    return ["## Faults and floods: the chaos and load suite", "", *(meta or ["Machine: not recorded"]), "",
            *table]


SECTIONS = {"replay": replay_section, "sim_vs_engine": sim_vs_engine_section, "bench": bench_section,
            "chaos": chaos_section}

if __name__ == "__main__":
    sys.exit(main())
