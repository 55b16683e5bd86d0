"""The host KV tier losing its memory (`engines/vllm/host_kv.py`, `engines/vllm/tier.py`):
a session whose prefix the pool evicted resumes while the tier's loads fail. The load
is counted as failed, the prefix is recomputed, the answer equals the one from a pool
that never evicted (temperature 0), and the engine goes on serving: a failed copy
from the tier costs a recompute, never a request or the engine.

The tier lives in the engine's process, so a test kills it at a seam:
`tests/support/failing_tier.py` is SAGA's host tier whose loads fail while a file
exists. The engine runs SAGA's own `--kv-transfer-config` (`host_tier_config`) with
that spec named in it.

STARTS ITS OWN ENGINE: 40 KV blocks of 32 tokens and a tier of about 145 (0.1 GiB),
beside the tier's shared one, which it still takes so that the model is prepared.
Run it alone:

    .venv/bin/python -m pytest tests/real/serve/test_host_tier_faults_real.py -q
"""

from __future__ import annotations

import json

import pytest

from saga_server.serve.cli import host_tier_config
from tests.support import failing_tier
from tests.support.own_engine import OwnEngine
from tests.support.tier_requests import BF16, BLOCK, cached, counting, run

READY_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def kill_file(tmp_path_factory):
    return tmp_path_factory.mktemp("tier-kill") / "tier-gone"


@pytest.fixture(scope="module")
def engine(saga_server, tmp_path_factory, kill_file):
    _, transfer = host_tier_config(["--kv-offloading-size", "0.1"], gpu=False, with_saga=True, order="saga")
    transfer["kv_connector_extra_config"].update(spec_name=failing_tier.FailingTierSpec.__name__,
                                                 spec_module_path=failing_tier.__name__,
                                                 fail_loads_while=str(kill_file))
    own = OwnEngine("tier-faults", tmp_path_factory.mktemp("host-tier-faults-real"),
                    ["--num-gpu-blocks-override", "40", "--max-num-seqs", "2", "--max-model-len", "1024",
                     "--kv-transfer-config", json.dumps(transfer), *BF16])
    try:
        own.wait_ready(READY_TIMEOUT_S)
        yield own
    finally:
        own.stop()


def test_with_the_tiers_memory_gone_a_resumed_prefix_is_recomputed_and_nothing_fails(engine, saga_server,
                                                                                      kill_file):
    model = saga_server.model
    prefix = counting(engine, model, "Counting", 1, 700)  # 21 full blocks
    follow_up = prefix + prefix[-3:]
    _, stored = run(engine, model, prefix)
    assert stored["saga_kv_tier_blocks_total{direction=stored}"] == 21, stored
    reference, _ = run(engine, model, follow_up)
    # two prompts of 1,000 new tokens take the pool's 40 blocks twice over: the whole
    # prefix leaves the pool, and the tier (about 145 blocks) keeps all of it
    for i, label in enumerate(("Numbers", "Values")):
        run(engine, model, counting(engine, model, label, 5000 + 1000 * i, 1000))

    kill_file.touch()
    try:
        resumed, moved = run(engine, model, follow_up)
    finally:
        kill_file.unlink()
    assert moved.get("saga_kv_tier_loads_total{outcome=failed}") == 1, moved  # the tier was asked, and failed
    assert moved.get("saga_kv_tier_loads_total{outcome=ok}", 0) == 0, moved
    assert moved["vllm:iteration_tokens_total_sum"] >= 21 * BLOCK, moved  # the prefix computed again
    assert resumed["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
    assert b"load job" in engine.log_path.read_bytes()  # the failure is in the engine's log

    # the engine goes on serving
    again, _ = run(engine, model, counting(engine, model, "Later", 1, 100))
    assert len(again["choices"][0]["token_ids"]) == 8
