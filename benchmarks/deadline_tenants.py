"""Two tenants with deadlines: a coding agent with slack and a browser agent without.

    python -m benchmarks.deadline_tenants --tasks 400 --seed 0 --out bench-out/deadlines

Writes `coding.jsonl` and `browser.jsonl` (`saga-trace/1`, one task per line), drawn by
`benchmarks/harness/deadline_tenants.py` (the shapes, and how to replay the mix with
`saga bench`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.harness.deadline_tenants import generate
from benchmarks.harness.results import write_jsonl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=400, help="tasks per tenant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-out/deadlines")
    a = ap.parse_args()
    out = Path(a.out)
    coding, browser = generate(a.tasks, a.seed)
    print(write_jsonl(out / "coding.jsonl", coding), write_jsonl(out / "browser.jsonl", browser))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
