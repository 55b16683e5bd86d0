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
  (NVIDIA H200 datasheet). Host links are priced at about 80% of the PCIe peak
  (25 GB/s Gen4, 50 GB/s Gen5), what pinned-memory copies reach in practice.
- Inter-node links (`net_bw`, used when the router moves a session's KV to another
  worker): one InfiniBand NIC per GPU, as in NVIDIA's DGX reference systems
  (DGX A100: 8x ConnectX-6 HDR 200 Gb/s = 25 GB/s per GPU; DGX H100/H200: 8x
  ConnectX-7 NDR 400 Gb/s = 50 GB/s per GPU), priced like the host links at about
  80% of line rate: 20 GB/s (A100), 40 GB/s (H100, H200). A TP worker moves each
  shard over its own GPU's NIC, in parallel.
- Llama-3-8B: 8.03e9 parameters, 32 layers, 32 query heads, 8 KV heads, head dim 128;
  Llama-3.1-70B: 70.6e9 parameters, 80 layers, 64 query heads, 8 KV heads, head dim
  128 (the models' Hugging Face `config.json`). BF16 weights and KV: 2 bytes.
- `mfu=0.5` for prefill and `bw_eff=0.8` for decode are what vLLM and SGLang reach in
  their published Llama-3 benchmarks on A100/H100 (about 25-30k prefill tokens/s and
  6-8 ms per output token at batch 1 for the 8B on an H100). `overhead_s` is the
  per-iteration scheduling and launch cost of vLLM V1 (about 1.5 ms). Checked on a
  real H200 with Llama-3-8B-shaped kernels (`benchmarks/gpu_cost_check.py`): decode
  at 64-128 sequences within 2% of this model, 9-17% slower at 1-32 sequences (0.64-0.70
  of HBM bandwidth), prefill at 0.64 of peak (the model's 0.5 is conservative).
- The KV pool is what vLLM gives it: `gpu_memory_utilization * memory` minus weights
  and an activation reserve, divided by KV bytes per token (2 * layers * kv_heads *
  head_dim * 2 bytes: 128 KiB for the 8B, 320 KiB for the 70B), in blocks of 16.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["GpuSpec", "ModelSpec", "CostModel", "GPUS", "MODELS", "make_cost_model"]


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
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 2e9  # per GPU
    block_tokens: int = 16
    token_budget: int = 8192  # vLLM max_num_batched_tokens (chunked prefill)
    max_num_seqs: int = 256
    kv_capacity_override: int | None = None  # tokens; None: from memory

    @property
    def kv_capacity_tokens(self) -> int:
        if self.kv_capacity_override is not None:
            tokens = self.kv_capacity_override
        else:
            pool = self.tp * (self.gpu.memory_bytes * self.gpu_memory_utilization
                              - self.activation_reserve_bytes) - self.model.weight_bytes
            tokens = int(max(pool, 0) // self.model.kv_bytes_per_token)
        return tokens - tokens % self.block_tokens

    def prefill_work(self, new_tokens: float, ctx_tokens: float) -> float:
        """Equivalent linear tokens of prefilling `new_tokens` after `ctx_tokens`."""
        return new_tokens * (1.0 + self.model.attn_coeff * (ctx_tokens + new_tokens / 2.0))

    def step_s(self, decode_seqs: int, prefill_equiv: float, context_tokens: float) -> float:
        compute = (2.0 * self.model.params * (decode_seqs + prefill_equiv)
                   / (self.tp * self.gpu.peak_flops * self.mfu))
        memory = ((self.model.weight_bytes + context_tokens * self.model.kv_bytes_per_token)
                  / (self.tp * self.gpu.hbm_bw * self.bw_eff))
        return self.overhead_s + (compute if compute > memory else memory)

    def prefill_s(self, new_tokens: float, ctx_tokens: float) -> float:
        """GPU seconds of a prefill run alone at full token budget (compute-bound)."""
        work = self.prefill_work(new_tokens, ctx_tokens)
        if work <= 0:
            return 0.0
        iters = work / self.token_budget
        return iters * self.step_s(0, min(work, self.token_budget), 0.0)

    def decode_s(self, output_tokens: int, ctx_tokens: float) -> float:
        """Seconds to decode `output_tokens` alone (batch of one)."""
        steps = max(output_tokens - 1, 0)
        return steps * self.step_s(1, 0.0, ctx_tokens + output_tokens / 2.0)

    def transfer_s(self, tokens: float) -> float:
        """Seconds to move `tokens` of KV between GPU and host (each TP shard in parallel)."""
        return tokens * self.model.kv_bytes_per_token / (self.tp * self.gpu.host_bw)

    def net_transfer_s(self, tokens: float) -> float:
        """Seconds to move `tokens` of KV to another worker over the inter-node link."""
        return tokens * self.model.kv_bytes_per_token / (self.tp * self.gpu.net_bw)


def make_cost_model(gpu: str = "h100-80gb", model: str = "llama3-8b", tp: int | None = None,
                    **overrides) -> CostModel:
    """A cost model from preset names; the 70B defaults to TP=4 (it does not fit on one GPU)."""
    if tp is None:
        tp = 4 if model == "llama3-70b" else 1
    cm = CostModel(gpu=GPUS[gpu], model=MODELS[model], tp=tp)
    return replace(cm, **overrides) if overrides else cm
