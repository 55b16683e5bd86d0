"""Runs a scenario: every policy on the same sessions and capacity, then the sweeps
(load, KV pool, host tier), with a progress bar per run and one over the sweep.

The workload (sessions, tool-duration draws, arrival times) is built once per load
from the scenario seed, so policies differ only in what they decide.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from saga_server.engines.sim import Simulator

from .metrics import add_ratios, summarize
from .policies import make_policy
from .scenario import Scenario
from .workload import build_instances

__all__ = ["PolicyRun", "BenchResult", "run_scenario", "run_policies"]


@dataclass
class PolicyRun:
    summary: dict[str, Any]
    tct_s: list[float]
    timeline: list[tuple[float, float]]
    wall_s: float


@dataclass
class BenchResult:
    scenario: Scenario
    runs: dict[str, PolicyRun] = field(default_factory=dict)
    load_sweep: list[dict[str, Any]] = field(default_factory=list)
    kv_sweep: list[dict[str, Any]] = field(default_factory=list)
    host_sweep: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.describe(),
            "policies": {k: dict(r.summary, wall_s=r.wall_s, tct_s=[round(t, 3) for t in sorted(r.tct_s)])
                         for k, r in self.runs.items()},
            "load_sweep": self.load_sweep,
            "kv_sweep": self.kv_sweep,
            "host_sweep": self.host_sweep,
        }


class _Bar:
    """tqdm when available and wanted, else nothing."""

    def __init__(self, total: int, desc: str, enabled: bool, unit: str = "task") -> None:
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is in the server extra; the bar is optional
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False)

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def set(self, desc: str) -> None:
        if self._bar is not None:
            self._bar.set_description(desc)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _instances(sc: Scenario, traces: dict):
    return build_instances(sc.tenants, sc.tasks, seed=sc.seed, rate_per_s=sc.rate, traces=traces,
                           recorded_arrivals=sc.recorded_arrivals)


def run_policies(sc: Scenario, policies: Iterable[str], progress: bool = True,
                 traces: dict | None = None, kv_tokens: int | None = None,
                 desc: str = "") -> dict[str, PolicyRun]:
    """Each policy once on the scenario's sessions; summaries carry the ratios."""
    traces = {} if traces is None else traces
    policies = list(policies)
    insts = _instances(sc, traces)
    bar = _Bar(len(insts) * len(policies), desc or sc.name, progress)
    runs: dict[str, PolicyRun] = {}
    try:
        for name in policies:
            bar.set(f"{desc or sc.name}: {name}")
            t0 = time.perf_counter()
            policy = make_policy(name)
            cost = sc.cost_model(kv_tokens, host_tier=policy.host_tier or policy.bound)
            res = Simulator(cost, policy, insts, sc.sim_config(), progress=bar.update).run()
            wall = time.perf_counter() - t0
            runs[name] = PolicyRun(summarize(res), [t.tct_s for t in res.tasks], res.timeline, wall)
    finally:
        bar.close()
    add_ratios({k: r.summary for k, r in runs.items()})
    return runs


_SWEEP_KEYS = ("tct_mean_s", "tct_p99_s", "tokens_per_s", "tasks_per_hour", "regen_share",
               "recompute_share", "mem_util", "hit_rate")


def _sweep_rows(axis: str, value: float, runs: dict[str, PolicyRun]) -> list[dict[str, Any]]:
    return [dict({axis: value, "policy": k}, **{m: r.summary[m] for m in _SWEEP_KEYS})
            for k, r in runs.items()]


def run_scenario(sc: Scenario, progress: bool = True) -> BenchResult:
    if sc.sweep_load and sc.recorded_arrivals:
        sc.with_load(sc.sweep_load[0])  # refused before anything runs
    traces: dict = {}
    out = BenchResult(sc)
    out.runs = run_policies(sc, sc.policies, progress, traces)
    points = len(sc.sweep_load) + len(sc.sweep_kv) + len(sc.sweep_host)
    sweep = _Bar(points, "sweep", progress and points > 0, unit="point")
    try:
        for load in sc.sweep_load:
            s2 = sc.with_load(load)
            runs = run_policies(s2, sc.sweep_policies, progress, traces, desc=f"load {load:g}")
            out.load_sweep += _sweep_rows("load", load, runs)
            sweep.update()
        for kv in sc.sweep_kv:
            runs = run_policies(sc, sc.sweep_policies, progress, traces, kv_tokens=int(kv),
                                desc=f"kv {int(kv)}")
            out.kv_sweep += _sweep_rows("kv_tokens", int(kv), runs)
            sweep.update()
        for host in sc.sweep_host:
            runs = run_policies(replace(sc, host_tier_factor=float(host)), sc.sweep_policies, progress, traces,
                                desc=f"host {host:g}x")
            out.host_sweep += _sweep_rows("host_tier_factor", float(host), runs)
            sweep.update()
    finally:
        sweep.close()
    return out
