"""Replay concurrent SWE-bench agent sessions against `saga serve` and `--no-saga`.

Sessions come from a saga-trace/1 file (default `$SAGA_TRACES/swe-mini-dev.jsonl`;
never copied into the repo). For each of --sessions tasks (the first ones with at
least --steps LLM calls, in file order after a seeded shuffle) the first --steps
calls are replayed:

- token counts are scaled per task so its largest replayed prompt is
  --target-prompt tokens (the model has a 4k context); output lengths are scaled
  by the same factor (clamped to [4, --max-output]) and forced with `ignore_eos`;
- prompts are real tokenizer output of English-like text and each one *extends*
  the session's previous prompt plus the answer the server actually returned
  (token ids from `return_token_ids`), then new text ("tool output") up to the
  scaled length, exactly like an agent's append-only history;
- between calls the session sleeps for the trace's tool durations (capped at
  --max-tool-s) and sends SAGA hints (session start/end, tool start/end with the
  trace's tool name and category), as an instrumented agent would. The stock
  server gets the same hints sent to a port nobody listens on (the client drops
  them without blocking), so the client side is identical.

Both servers run with the same vLLM flags and a KV cache of --kv-blocks blocks of
32 tokens, small enough that LRU evicts paused sessions. Modes (--modes): `saga`,
`saga-request-fcfs` (SAGA with request-level FCFS inside a tenant, i.e. without
task seniority: what the cache policies alone give) and `no-saga` (stock vLLM,
prefix caching on); `*-tier` with a host KV tier of --tier-x pools; `*-disk` with a
disk tier of --disk-x pools below it (`no-saga-disk-arc`: vLLM's ARC for the host
tier); and `bound`, SAGA on the same engine with a pool that holds every session's KV
(nothing evicted; the host tier configured but unused, as the engine's speed depends on
it): the workload's limit on this host under SAGA's scheduling,
which every mode is also reported against (`no-saga-bound`: the same for stock vLLM;
`harness/replay.py`, `MODES`). Reported per mode: task
completion time (first request to last answer) mean, p90 and worst, the ratios
stock/SAGA, prefix-hit rate (cached / prompt tokens) and regen share (tokens
computed before and recomputed now / prompt tokens).

    .venv/bin/python -m benchmarks.serve_trace_replay                 # all three modes, ~13 min on 2 cores
    .venv/bin/python -m benchmarks.serve_trace_replay --modes saga,no-saga --json out.json --plot tct.png

Measured here (2 CPU cores; 8 sessions x 10 steps, KV 400 blocks, --max-num-seqs 2):

                       saga       saga-request-fcfs   no-saga
  task time mean       114.5 s    247.3 s             240.9 s    (one run, modes in this order)
  task time p90        169.8 s    260.5 s             254.1 s
  prefix-hit rate      0.864      0.577               0.145
  regen share          0.007      0.294               0.726
  -> no-saga / saga: mean 2.10x, p90 1.50x
  Second run, stock first: no-saga 247.7 / 261.0 s, saga 107.7 / 166.2 s (mean / p90):
  2.30x and 1.57x, the same hit rates. A third (no-saga, saga-request-fcfs) gave
  246.6 vs 200.9 s: 1.23x for the cache policies alone. A fourth, all three modes
  on a quieter machine: saga 91.4 / 136.6 s, worst task 146.7 s; saga-request-fcfs
  176.9 / 185.6 / 188.0 s; no-saga 216.9 / 230.4 / 232.5 s: 2.37x mean, 1.69x p90,
  and SAGA's last task finished before stock's first (--plot draws this).
  On a faster host (2026-12-02, with session admission, and a request held at the
  admission gate no longer protecting its session's KV): saga 63.5 / 86.9 s,
  saga-request-fcfs 98.4 / 113.5 s (hit rate 0.756), no-saga 231.5 / 244.4 s: 3.64x
  mean, and 2.35x without seniority (before the gate fix, an hour earlier:
  saga-request-fcfs 154.3 s, hit rate 0.623).

Before session admission, the cache policies alone (pins, WA-LRU, prefetch)
reached a 0.57 hit rate and 0.97-1.28x (0.97x in the first run above, 1.23x in the third and fourth,
1.26-1.28x in earlier ones: run-to-run noise on a shared machine is of that
order); ordering a tenant's requests by task seniority does the rest: tasks
finish in the order they began instead of all near the end, and the few tasks
being served keep their KV, so almost nothing is recomputed. Earlier variants,
without seniority: --max-num-seqs 4 gave hit rate 0.40 vs 0.21 and 1.47x in one
run, 0.90x in another under heavy outside load; a roomy KV (--kv-blocks 560) 0.77
vs 0.67 and 1.07x. On CPU one decoded token costs about as much as 15 prefilled
ones (on the trace's GPU hosts it is nearer 100), so saved prefill moves task time
less here than the hit rates suggest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.harness.replay import (BASELINES, MODES, add_workload_arguments, replay, sent_workload,
                                       start_delays, workload)
from benchmarks.harness.plots import png
from benchmarks.harness.results import write_results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(p)
    p.add_argument("--tier-x", type=float, default=2.0,
                   help="host KV tier of the *-tier modes, in pools (--kv-blocks) of KV")
    p.add_argument("--disk-x", type=float, default=8.0,
                   help="disk KV tier of the *-disk modes (below the host tier), in pools of KV")
    p.add_argument("--modes", default="saga,saga-request-fcfs,no-saga", help=f"comma-separated, of {sorted(MODES)}")
    p.add_argument("--compiled", action="store_true", help="start without --enforce-eager")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--plot", type=Path, help="also draw each mode's task completion times here (PNG)")
    p.add_argument("--workload", type=Path,
                   help="also write the exact sessions sent (saga-trace/1, with start_s) here, for the simulator")
    p.add_argument("--record", type=Path, metavar="DIR",
                   help="SAGA modes' engines record what they saw (saga serve --record) as DIR/<mode>.jsonl; "
                        "benchmarks/record_roundtrip.py checks it against --workload")
    args = p.parse_args()

    tasks, tokens = workload(args)
    total_tool = sum(s for t in tasks for st in t.steps[:-1] for _, _, s in st.tools)
    print(f"{len(tasks)} sessions x {args.steps} steps from {args.trace.name}; KV {args.kv_blocks} blocks "
          f"({args.kv_blocks * 32} tokens); working set at the end "
          f"{sum(t.steps[-1].prompt_tokens for t in tasks)} tokens; tool time {total_tool:.0f} s in all", flush=True)
    if args.workload:
        with args.workload.open("w") as f:
            for line in sent_workload(tasks, start_delays(len(tasks), args.stagger_s, args.seed)):
                f.write(json.dumps(line) + "\n")
        print(f"wrote the workload to {args.workload}")
    out = []
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown modes {sorted(unknown)}; choose from {sorted(MODES)}")
    for mode in modes:
        print(f"-- {mode} ...", flush=True)
        r = replay(mode, tasks, tokens, args)
        print(json.dumps({k: v for k, v in r.items() if k not in ("metrics", "tct_s")}), flush=True)
        out.append(r)
    print()
    rows = ["tct_mean_s", "tct_p90_s", "tct_max_s", "step_latency_mean_s", "hit_rate", "tier_hit_share",
            "disk_hit_share", "regen_share", "kv_blocks", "prompt_tokens",
            "cached_tokens", "wall_s", "ready_s", "rss_gb", "sessions_ok"]
    print(f"{'':22}" + "".join(f"{r['mode']:>19}" for r in out))
    for k in rows:
        print(f"{k:22}" + "".join(f"{r[k]:>19.3f}" if isinstance(r[k], float) else f"{r[k]:>19}" for r in out))
    by = {r["mode"]: r for r in out}
    if "bound" in by:  # how far each mode is from the workload's limit on this engine
        b = by["bound"]
        print()
        for mode in (m for m in modes if m != "bound"):
            s = by[mode]
            print(f"task completion time, {mode} / bound: mean {s['tct_mean_s'] / b['tct_mean_s']:.2f}x, "
                  f"p90 {s['tct_p90_s'] / b['tct_p90_s']:.2f}x")
    for base in (b for b in BASELINES if b in by and not b.endswith("bound")):
        n = by[base]
        print()
        for mode in (m for m in modes if m not in BASELINES):
            s = by[mode]
            print(f"task completion time, {base} / {mode}: mean {n['tct_mean_s'] / s['tct_mean_s']:.2f}x, "
                  f"p90 {n['tct_p90_s'] / s['tct_p90_s']:.2f}x; prefix+tier hit rate {s['hit_rate']:.3f} vs "
                  f"{n['hit_rate']:.3f}; regen share {s['regen_share']:.3f} vs {n['regen_share']:.3f}")
    for mode in modes:
        print(f"  {mode} metrics: {json.dumps(by[mode]['metrics'])}")
    write_results(args.json, args, out)
    if args.plot:
        plot_completion_times(out, args.plot)
        print(f"wrote {args.plot}")
    return 0


def plot_completion_times(results: list[dict], path: Path) -> None:
    """Each mode's task completion times as a step CDF (one PNG)."""
    with png(path, figsize=(6, 4), dpi=120) as (_, ax):
        for r in results:
            times = r["tct_s"]
            ax.step(times, range(1, len(times) + 1), where="post",
                    label=f"{r['mode']} (mean {r['tct_mean_s']:.0f} s)")
        ax.set_xlabel("task completion time (s)")
        ax.set_ylabel("tasks done within that time")
        ax.set_title("SWE sessions replayed on vLLM")
        ax.grid(alpha=0.3)
        ax.legend()


if __name__ == "__main__":
    sys.exit(main())
