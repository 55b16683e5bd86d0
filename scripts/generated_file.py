"""`write_or_check`: the command line of a script that writes a file from the code
(`cli_reference.py`, `grafana_dashboard.py`), so that a test can tell it is stale."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_or_check(out: Path, text: str, argv: list[str], script: str) -> int:
    """With `--check` in `argv`: 1 (and why, on stderr) when `out` is not `text`, else
    0. Without: writes `text` to `out`."""
    name = out.relative_to(ROOT)
    if "--check" in argv:
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            print(f"{name} is stale: run python scripts/{script}", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {name}")
    return 0
