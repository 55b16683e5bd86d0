"""Simulator runs in parallel: one process per run, results in the jobs' order."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor


def run_all(jobs: list[tuple], n_jobs: int, desc: str, run) -> list[dict]:
    """`run` (a module-level function: it crosses to the worker processes) over `jobs`,
    `n_jobs` at a time, in the jobs' order, with a progress bar."""
    rows: list[dict] = []
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is in the server extra; the bar is optional
        tqdm = None
    with ProcessPoolExecutor(max_workers=n_jobs) as pool:
        bar = tqdm(total=len(jobs), desc=desc, unit="run") if tqdm else None
        for row in pool.map(run, jobs):
            rows.append(row)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    return rows


def add_run_arguments(ap, *, workers: int, loads: str, tasks_factor: int, policies, out: str | None,
                      loads_help: str = "sessions in flight per worker") -> None:
    """The options every closed-loop simulator benchmark takes: workers, loads (comma-separated),
    tasks per session in flight, policies, seed, runs in parallel and, unless `out` is None,
    the output folder."""
    ap.add_argument("--workers", type=int, default=workers)
    ap.add_argument("--loads", default=loads, help=loads_help)
    ap.add_argument("--tasks-factor", type=int, default=tasks_factor, help="tasks = factor x sessions in flight")
    ap.add_argument("--policies", default=",".join(policies))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (one core each)")
    if out is not None:
        ap.add_argument("--out", default=out)


def listed(text: str, kind=str) -> list:
    """A comma-separated option as a list of `kind`."""
    return [kind(x) for x in text.split(",")]
