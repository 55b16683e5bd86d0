"""The cost model prices what its docstring says, on hand-checkable numbers."""

from __future__ import annotations

import pytest

from saga_server.engines.sim import GPUS, MODELS, make_cost_model


def test_kv_bytes_per_token_follow_the_model_shapes():
    # 2 (K and V) x layers x KV heads x head dim x 2 bytes
    assert MODELS["llama3-8b"].kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert MODELS["llama3-70b"].kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327680


def test_pool_is_memory_left_after_weights_in_whole_blocks():
    cm = make_cost_model("h100-80gb", "llama3-8b")
    pool = 80e9 * 0.9 - 2e9 - 8.03e9 * 2
    tokens = int(pool // 131072)
    assert cm.kv_capacity_tokens == tokens - tokens % 16
    # the 70B needs more than one GPU: TP=4 by default, and a bigger GPU holds more KV
    assert make_cost_model("h100-80gb", "llama3-70b").tp == 4
    assert (make_cost_model("h200-141gb", "llama3-8b").kv_capacity_tokens
            > make_cost_model("a100-80gb", "llama3-8b").kv_capacity_tokens)


def test_capacity_override_is_rounded_to_blocks():
    assert make_cost_model(kv_capacity_override=1000).kv_capacity_tokens == 992


def test_prefill_attention_term_is_quadratic_in_context():
    cm = make_cost_model()
    a = MODELS["llama3-8b"].attn_coeff
    assert cm.prefill_work(100, 0) == pytest.approx(100 * (1 + a * 50))
    assert cm.prefill_work(100, 10_000) == pytest.approx(100 * (1 + a * 10_050))
    assert cm.prefill_work(0, 10_000) == 0


def test_decode_is_memory_bound_and_prefill_compute_bound():
    cm = make_cost_model("h100-80gb", "llama3-8b")
    gpu, model = GPUS["h100-80gb"], MODELS["llama3-8b"]
    mem_one = model.weight_bytes / (gpu.hbm_bw * cm.bw_eff)
    assert cm.step_s(1, 0, 0) == pytest.approx(cm.overhead_s + mem_one)
    # KV read grows the decode step linearly with the batch's context
    ctx = 100_000
    assert cm.step_s(1, 0, ctx) - cm.step_s(1, 0, 0) == pytest.approx(
        ctx * model.kv_bytes_per_token / (gpu.hbm_bw * cm.bw_eff))
    # a full prefill chunk is compute-bound: 2 FLOPs per parameter per token
    compute = 2 * model.params * 8192 / (gpu.peak_flops * cm.mfu)
    assert compute > mem_one
    assert cm.step_s(0, 8192, 0) == pytest.approx(cm.overhead_s + compute)


def test_faster_gpus_are_faster_and_transfers_cost_bandwidth():
    a100, h100 = make_cost_model("a100-80gb"), make_cost_model("h100-80gb")
    assert h100.prefill_s(4000, 8000) < a100.prefill_s(4000, 8000)
    assert h100.decode_s(200, 8000) < a100.decode_s(200, 8000)
    assert h100.transfer_s(1000) == pytest.approx(1000 * 131072 / 50e9)
