"""Requests a host-tier test sends an `OwnEngine`, and what each moved.

    prompt = counting(engine, model, "Counting", 1, 700)
    out, moved = run(engine, model, prompt)   # moved: counter deltas, TIER_METRICS
    cached(out)                               # prompt tokens the engine did not compute
"""

from __future__ import annotations

import time

from tests.support.own_engine import OwnEngine

__all__ = ["BLOCK", "BF16", "TIER_METRICS", "cached", "counting", "run"]

BLOCK = 32  # tokens a KV block holds on the CPU engine
# The tests size their tiers in GiB of bfloat16 blocks (720 KiB each); `saga serve` serves
# the default model in float32 on an x86 CPU without AVX-512 (`saga_server.host_cpu`),
# whose blocks are twice that, so these engines name the dtype.
BF16 = ["--dtype", "bfloat16"]
TIER_METRICS = ("vllm:external_prefix_cache_hits", "vllm:kv_offload_load_bytes", "vllm:kv_offload_store_bytes",
                "saga_kv_tier", "saga_kv_disk")


def counting(engine: OwnEngine, model: str, label: str, start: int, n: int) -> list[int]:
    """`n` tokens of a count from `start`: the model continues it the same way at any
    batch shape, so an answer over loaded KV can be compared with one over computed KV."""
    text = f"{label}: " + ", ".join(str(i) for i in range(start, start + n))
    return engine.post("/tokenize", {"model": model, "prompt": text})["tokens"][:n]


def run(engine: OwnEngine, model: str, prompt: list[int]) -> tuple[dict, dict[str, float]]:
    """The completion and what it moved: tokens computed, tier hits and bytes (deltas)."""
    before = engine.metrics(*TIER_METRICS)
    out = engine.complete(model, prompt, max_tokens=8)
    deadline = time.monotonic() + 10  # the engine's metrics trail the answer a little
    while True:
        after = engine.metrics(*TIER_METRICS)
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        if delta.get("vllm:iteration_tokens_total_sum", 0) >= len(prompt) - cached(out) + 8 or \
                time.monotonic() > deadline:
            return out, delta
        time.sleep(0.5)


def cached(out: dict) -> int:
    return out["usage"]["prompt_tokens_details"]["cached_tokens"]
