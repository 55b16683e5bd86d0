"""Where the benchmarks look for named agent traces: the folder `$SAGA_TRACES`
(default `traces`, relative to the working directory), holding `saga-trace/1`
files such as `swe-mini-dev.jsonl` (SWE-bench runs of a small coding agent) and
`tau-airline.jsonl` (tau-bench airline dialogues). A trace is never copied into the
repository; record your own with `saga proxy --record` or `saga serve --record`, or
pass any file with `--trace`."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TRACES_ENV", "trace_path"]

TRACES_ENV = "SAGA_TRACES"


def trace_path(name: str) -> Path:
    """The path of the trace file `name` in `$SAGA_TRACES`."""
    return Path(os.environ.get(TRACES_ENV) or "traces") / name
