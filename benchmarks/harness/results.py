"""How a benchmark writes its run down: the command that ran it, its results as JSON or
JSON lines, and the percentile its tables quote."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def command_line() -> str:
    """How this benchmark was run, as one would type it again (`python -m benchmarks.NAME ...`)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    run = ["-m", spec.name] if spec is not None and spec.name else [sys.argv[0]]
    return " ".join(["python", *run, *sys.argv[1:]])


def write_json(path: Path, data, *, indent: int | None = 2, default=None) -> Path:
    """`data` as JSON at `path` (its folder made first); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=default))
    return path


def write_jsonl(path: Path, rows) -> Path:
    """One compact JSON line per row (a saga-trace/1 file, for instance); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    return path


def write_results(path: Path | None, args, results: list[dict]) -> None:
    """The run's command, machine, arguments and per-mode results as JSON at `path`
    (if given; `scripts/results_page.py` draws them)."""
    if path:
        from saga_server.host_cpu import cpu_description

        write_json(path, {"command": command_line(), "machine": cpu_description(),
                          "args": {k: str(v) for k, v in vars(args).items()}, "results": results})


def pct(values: list[float], q: float) -> float:
    """The `q` quantile of `values`, nearest rank (NaN when empty)."""
    if not values:
        return float("nan")
    s = sorted(values)
    i = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[i]
