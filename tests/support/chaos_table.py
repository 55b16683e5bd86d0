"""The chaos suite's table: one row per fault or load case, printed at the end of the run.

Each case in `tests/real/chaos` (and the Ray replica kill in `tests/real/ray`) measures
what an agent saw (errors, answers lost or changed, latency against the same run
without the fault) and the server's state afterwards, records one `ChaosRow` through
the `chaos_row` fixture of `tests/real/conftest.py`, and the terminal summary prints
`ChaosTable.lines()` so the CI log shows the table. Latency is reported, never
asserted: timing on a shared 2-core machine is not a test result.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields

__all__ = ["ChaosRow", "ChaosTable", "added_median", "percentiles"]


@dataclass(frozen=True, slots=True)
class ChaosRow:
    case: str
    agent_errors: int
    added_median: str   # `added_median(...)`, or "n/a" where no baseline applies
    lost: int           # responses missing, malformed or different from the no-fault run
    server_after: str   # what the server answered afterwards
    notes: str = ""     # figures of the case (rates, percentiles, counters)

    def line(self) -> str:
        return "| " + " | ".join(str(getattr(self, f.name)) for f in fields(self)) + " |"


_HEADER = ("case", "agent errors", "added median latency", "lost responses", "server after", "notes")


class ChaosTable:
    """Rows in the order their cases ran; `lines()` renders a Markdown table."""

    def __init__(self) -> None:
        self.rows: list[ChaosRow] = []

    def add(self, row: ChaosRow) -> None:
        self.rows.append(row)

    def lines(self) -> list[str]:
        if not self.rows:
            return []
        return ["| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)] + [r.line() for r in self.rows]


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    """(p50, p99) of latencies in seconds (nearest rank); (nan, nan) for none."""
    if not samples_s:
        return float("nan"), float("nan")
    ordered = sorted(samples_s)
    return statistics.median(ordered), ordered[max(0, -(-99 * len(ordered) // 100) - 1)]


def added_median(baseline_s: list[float], faulted_s: list[float]) -> str:
    """How much later the median faulted step answered than the median no-fault
    step: "+12 ms (+3.1%)", negative when faster."""
    if not baseline_s or not faulted_s:
        return "n/a"
    base, faulted = statistics.median(baseline_s), statistics.median(faulted_s)
    delta = faulted - base
    share = f" ({delta / base:+.1%})" if base > 0 else ""
    return f"{delta * 1000:+.0f} ms{share}"
