"""The default model in bfloat16 against float32 on this CPU, side by side: why `saga
serve` picks float32 on an x86 CPU without AVX-512 (`saga_server.host_cpu`).

Starts stock `saga serve --no-saga` once per dtype and times, on fresh prompts (no
prefix hit), a 1000-token prefill and the decode step of one request at a 100-token
and a 1000-token context (the difference between 129 and 1 output tokens, over 128),
`--repeats` times; prints the medians and float32's ratios to bfloat16.

    .venv/bin/python -m benchmarks.cpu_dtype --repeats 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from saga_server.host_cpu import cpu_description, default_model_dtype

from benchmarks.harness.replay import TokenSource
from benchmarks.harness.results import write_results
from benchmarks.harness.serve import start_server

DTYPES = ("bfloat16", "float32")
DECODE_STEPS = 128


def measure(dtype: str, tokens: TokenSource, repeats: int) -> dict:
    server = start_server(False, ["--dtype", dtype, "--num-gpu-blocks-override", "2000"])
    rnd = random.Random(1)

    def timed(prompt_tokens: int, max_tokens: int) -> float:
        prompt = tokens.take(prompt_tokens, rnd)
        t0 = time.monotonic()
        server.post("/v1/completions", {"model": server.model, "prompt": prompt, "max_tokens": max_tokens,
                                        "ignore_eos": True, "temperature": 0.0})
        return time.monotonic() - t0

    prefill, decode_100, decode_1000 = [], [], []
    try:
        timed(200, 1)  # warm
        for _ in range(repeats):
            one = timed(1000, 1)
            prefill.append(1000 / one)
            decode_1000.append((timed(1000, DECODE_STEPS + 1) - one) / DECODE_STEPS)
            decode_100.append((timed(100, DECODE_STEPS + 1) - timed(100, 1)) / DECODE_STEPS)
    finally:
        server.stop()
    return {"dtype": dtype, "prefill_tokens_per_s": statistics.median(prefill),
            "decode_s_ctx100": statistics.median(decode_100), "decode_s_ctx1000": statistics.median(decode_1000)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    from saga_server.serve.model import ensure_default_model

    cpu = cpu_description()
    choice = default_model_dtype() or "bfloat16 (the model's own)"
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores; SIMD: {' '.join(cpu['simd_flags'])}; "
          f"saga serve serves the default model here in {choice}", flush=True)
    tokens = TokenSource(str(ensure_default_model()), 0)
    rows = [measure(dtype, tokens, args.repeats) for dtype in DTYPES]
    for r in rows:
        print(f"{r['dtype']:>9}: prefill {r['prefill_tokens_per_s']:.0f} tokens/s, decode step "
              f"{r['decode_s_ctx100'] * 1000:.1f} ms (100-token context) / {r['decode_s_ctx1000'] * 1000:.1f} ms "
              f"(1000)", flush=True)
    bf16, fp32 = rows
    print(f"float32 / bfloat16: prefill rate {fp32['prefill_tokens_per_s'] / bf16['prefill_tokens_per_s']:.2f}x, "
          f"decode step {fp32['decode_s_ctx100'] / bf16['decode_s_ctx100']:.2f}x / "
          f"{fp32['decode_s_ctx1000'] / bf16['decode_s_ctx1000']:.2f}x", flush=True)
    write_results(args.json, args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
