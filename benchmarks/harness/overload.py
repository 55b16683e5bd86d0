"""The overload experiment's pieces: one simulator run of a closed loop of sessions per
worker, and its tables and ratios; `sim_overload` runs it on SWE-bench sessions,
`sim_production` on the production-shaped workload."""

from __future__ import annotations

import time

from saga_server.bench import Scenario, TenantSpec
from saga_server.bench.metrics import summarize
from saga_server.bench.policies import PEERS, make_policy
from saga_server.bench.runner import _instances
from saga_server.engines.sim import Simulator

POLICIES = ("apc-lru", "apc-lru-offload", "kvflow", "thunderagent", *PEERS, "saga-no-admit", "saga", "infinite")
REFERENCES = ("infinite", "oracle", "belady")  # bounds, never "the best other policy"
USER_TURN_COLUMNS = ("user_turn_mean_s", "user_turn_p50_s", "user_turn_p90_s", "user_turn_p99_s")


def run_one(job: tuple) -> dict:
    """One run: (trace, workers, per worker, host tier, tasks factor, policy, seed[, disk tier])."""
    trace, workers, per_worker, host, tasks_factor, policy, seed, *rest = job
    disk = rest[0] if rest else 0.0
    sc = Scenario(tenants=(TenantSpec("swe", trace),), tasks=workers * per_worker * tasks_factor, workers=workers,
                  concurrency=workers * per_worker, host_tier_factor=host, disk_tier_factor=disk, seed=seed)
    sim = Simulator(sc.cost_model(), make_policy(policy), _instances(sc, {}), sc.sim_config())
    t0 = time.perf_counter()
    res = sim.run()
    wall = time.perf_counter() - t0
    s = summarize(res)
    return {"policy": policy, "per_worker": per_worker, "host": host, "disk": disk, "tasks": len(res.tasks),
            "tct_mean_s": s["tct_mean_s"], "tct_p90_s": s["tct_p90_s"], "tasks_per_hour": s["tasks_per_hour"],
            "hit_rate": s["hit_rate"], "recompute_share": s["recompute_share"], "regen_share": s["regen_share"],
            **{k: s[k] for k in USER_TURN_COLUMNS},
            "mem_util": s["mem_util"], "running_kv": s["running_kv"], "parked": res.parked,
            "disk_share": res.disk_loaded_tokens / res.reusable_tokens if res.reusable_tokens else 0.0,
            "admission_waits": res.admitted_after_wait, "wall_s": wall}


COLUMNS = ("tct_mean_s", "tct_p90_s", "tasks_per_hour", "hit_rate", "recompute_share", "mem_util", "running_kv",
           "wall_s")


def print_tables(rows: list[dict], hosts: list[float], loads: list[int], policies: list[str], workers: int,
                 title: str = "", disks: list[float] = (0.0,)) -> None:
    """One markdown table per (host tier, disk tier, load), then the ratios SAGA is judged by."""
    cols = COLUMNS
    for h, d, pw in ((h, d, pw) for h in hosts for d in disks for pw in loads):
        sel = {r["policy"]: r for r in rows if r["host"] == h and r.get("disk", 0.0) == d and r["per_worker"] == pw}
        disk = f", disk tier {d:g}x" if d else ""
        print(f"\n## {title}host tier {h:g}x{disk}, {pw} sessions/worker, {workers} workers, "
              f"{next(iter(sel.values()))['tasks']} tasks")
        print(f"| policy | {' | '.join(cols)} |")
        print("|---" * (len(cols) + 1) + "|")
        for p in policies:
            r = sel[p]
            print(f"| {p} | " + " | ".join(f"{r[c]:.3f}" if c in ("hit_rate", "recompute_share", "running_kv",
                                                                    "mem_util")
                                           else f"{r[c]:.0f}" if c != "wall_s" else f"{r[c]:.1f}"
                                           for c in cols) + " |")
        if "saga" in sel:
            saga = sel["saga"]
            others = [p for p in policies if p not in REFERENCES and not p.startswith("saga")]
            best = min(others, key=lambda p: sel[p]["tct_mean_s"]) if others else None
            parts = []
            for ref in ("oracle", "infinite"):
                if ref in sel:
                    parts.append(f"saga/{ref} {saga['tct_mean_s'] / sel[ref]['tct_mean_s']:.3f}")
            if best:
                parts.append(f"best other ({best})/saga {sel[best]['tct_mean_s'] / saga['tct_mean_s']:.3f}")
            if "saga-no-admit" in sel:
                parts.append(f"saga/saga-no-admit {saga['tct_mean_s'] / sel['saga-no-admit']['tct_mean_s']:.4f}"
                             f" (p90 {saga['tct_p90_s'] / sel['saga-no-admit']['tct_p90_s']:.3f})")
            print("  ".join(parts))
