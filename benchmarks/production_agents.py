"""Production-shaped coding-agent sessions, generated from published statistics.

    python -m benchmarks.production_agents --sessions 2000 --seed 0 --out bench-out/production.jsonl

Writes `saga-trace/1` tasks (one session per line) drawn by
`benchmarks/harness/production_agents.py` (the shape, every number's source); every
field of `ProductionShape` is an option here.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields
from pathlib import Path

from benchmarks.harness.production_agents import ProductionShape, generate, summary
from benchmarks.harness.results import write_jsonl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-out/production.jsonl")
    for f in fields(ProductionShape):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    a = ap.parse_args()
    shape = ProductionShape(**{f.name: getattr(a, f.name) for f in fields(ProductionShape)})
    tasks = generate(a.sessions, a.seed, shape)
    out = write_jsonl(Path(a.out), tasks)
    print(json.dumps({"shape": asdict(shape), "summary": summary(tasks)}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
