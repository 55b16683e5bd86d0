"""The host KV tier on the CPU engine (`saga serve --kv-offloading-size`, the worker in
`engines/vllm/host_kv.py`): a prefix the pool evicted is loaded back from the tier,
the resumed request computes only what neither the pool nor the tier holds, and it
answers as a pool that never evicted did (temperature 0). With the tier full the
prefix is recomputed and nothing fails.

STARTS ITS OWN ENGINE: 40 KV blocks of 32 tokens, a tier of 58 blocks (0.04 GiB at
this model's 720 KiB a block), beside the tier's shared one, which it still takes so
that the model is prepared. Run it alone:

    .venv/bin/python -m pytest tests/real/serve/test_host_tier_real.py -q
"""

from __future__ import annotations


import pytest

from tests.support.own_engine import OwnEngine
from tests.support.tier_requests import BF16, BLOCK, cached, counting, run

READY_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def engine(saga_server, tmp_path_factory):
    own = OwnEngine("tier", tmp_path_factory.mktemp("host-tier-real"),
                    ["--num-gpu-blocks-override", "40", "--max-num-seqs", "2", "--max-model-len", "1024",
                     "--kv-offloading-size", "0.04", *BF16])
    try:
        own.wait_ready(READY_TIMEOUT_S)
        yield own
    finally:
        own.stop()


def test_an_evicted_prefix_comes_back_from_the_tier_and_only_the_rest_is_computed(engine, saga_server):
    model = saga_server.model
    prefix = counting(engine, model, "Counting", 1, 700)  # 21 full blocks
    follow_up = prefix + prefix[-3:]
    _, stored = run(engine, model, prefix)
    assert stored["saga_kv_tier_blocks_total{direction=stored}"] == 21, stored  # its full blocks
    reference, _ = run(engine, model, follow_up)  # the pool still holds the prefix
    assert cached(reference) == 21 * BLOCK

    # 1,000 new tokens need 32 of the pool's 40 blocks: the prefix's tail is evicted
    run(engine, model, counting(engine, model, "Numbers", 5000, 1000))
    resumed, moved = run(engine, model, follow_up)
    tier_tokens = moved["vllm:external_prefix_cache_hits_total"]
    assert tier_tokens >= 8 * BLOCK, moved  # the evicted tail came from the tier
    assert cached(resumed) == 21 * BLOCK  # pool head + tier tail: the whole prefix
    assert moved["vllm:iteration_tokens_total_sum"] <= len(follow_up) - 21 * BLOCK + 8, moved
    assert moved["vllm:kv_offload_load_bytes_total"] > 0
    # SAGA's counters: the tier's blocks and its hits apart from the pool's
    assert moved["saga_kv_tier_blocks_total{direction=loaded}"] == tier_tokens / BLOCK, moved
    assert moved["saga_kv_tier_hit_tokens_total"] == tier_tokens, moved
    assert moved["saga_kv_tier_loads_total{outcome=ok}"] == 1, moved
    assert resumed["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]


def test_with_the_tier_full_the_prefix_is_recomputed_without_error(engine, saga_server):
    model = saga_server.model
    prefix = counting(engine, model, "Tally", 1, 700)
    follow_up = prefix + prefix[-3:]
    run(engine, model, prefix)
    reference, _ = run(engine, model, follow_up)
    # three prompts of 1,000 new tokens: 93 blocks through a pool of 40 and a tier of 58
    for i, label in enumerate(("Values", "Items", "Entries")):
        run(engine, model, counting(engine, model, label, 7000 + 1000 * i, 1000))
    again, moved = run(engine, model, follow_up)
    assert cached(again) < 21 * BLOCK, moved  # neither the pool nor the tier kept it all
    assert moved["vllm:iteration_tokens_total_sum"] >= len(follow_up) - cached(again), moved
    assert again["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
