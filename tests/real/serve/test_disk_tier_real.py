"""The disk KV tier below the host tier (`engines/vllm/disk_tier.py`, `saga serve
--kv-disk-dir DIR --kv-disk-size GiB`) on the real engine: a session's prefix that
two other sessions push out of the pool and out of the host tier comes back from
disk, and the answer is the one the pool gave before it lost the prefix
(temperature 0). A disk that fails (truncated or unreadable files, a full disk, a
slow disk) costs a recompute, counted, never a request.

A slow disk cannot be had on demand here: `tests/support/slow_disk.py` is SAGA's disk
tier whose reads take longer while a file exists, the seam the slow-disk test uses.
A full disk is a real one: a 4 MiB tmpfs (skipped where this machine may not mount).

STARTS ITS OWN ENGINES: 40 KV blocks of 32 tokens, a host tier of 43 chunks (0.03
GiB; one block a chunk), a disk tier of 291 (0.2 GiB). Run it alone:

    .venv/bin/python -m pytest tests/real/serve/test_disk_tier_real.py -q
"""

from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from saga_server.serve.cli import host_tier_config
from tests.support import slow_disk
from tests.support.own_engine import OwnEngine
from tests.support.tier_requests import BF16, BLOCK, cached, counting, run

READY_TIMEOUT_S = 600
PREFIX_BLOCKS = 21  # a 700-token prefix
ENGINE_ARGS = ["--num-gpu-blocks-override", "40", "--max-num-seqs", "2", "--max-model-len", "1024", *BF16]
SLOW_READ_S = 3.0


def disk_engine(name: str, tmp, disk_dir, tier_options: dict | None = None) -> OwnEngine:
    _, transfer = host_tier_config(["--kv-offloading-size", "0.03"], gpu=False, with_saga=True, order="saga",
                                   disk_dir=str(disk_dir), disk_gib=0.2)
    transfer["kv_connector_extra_config"]["secondary_tiers"][0].update(tier_options or {})
    own = OwnEngine(name, tmp, [*ENGINE_ARGS, "--kv-transfer-config", json.dumps(transfer)])
    own.wait_ready(READY_TIMEOUT_S)
    return own


@pytest.fixture(scope="module")
def slow_file(tmp_path_factory):
    return tmp_path_factory.mktemp("disk-slow") / "slow"


@pytest.fixture(scope="module")
def engine(saga_server, tmp_path_factory, slow_file):
    tmp = tmp_path_factory.mktemp("disk-tier-real")
    own = disk_engine("disk-tier", tmp, tmp / "disk",
                      {"type": slow_disk.SlowDiskTier.__name__, "module_path": slow_disk.__name__,
                       "slow_while": str(slow_file), "delay_s": SLOW_READ_S, "max_read_s": 1.0,
                       "slow_backoff_s": 3600})
    own.disk_dir = tmp / "disk"
    try:
        yield own
    finally:
        own.stop()


def pushed_to_disk(engine: OwnEngine, model: str, label: str) -> tuple[list[int], dict]:
    """A session's follow-up prompt, and its answer while the prefix was in the pool;
    then two prompts of 1,000 new tokens each take the pool's 40 blocks and the host
    tier's 43 chunks: the prefix is left only on disk."""
    prefix = counting(engine, model, label, 1, 700)
    follow_up = prefix + prefix[-3:]
    run(engine, model, prefix)
    reference, _ = run(engine, model, follow_up)
    assert cached(reference) == PREFIX_BLOCKS * BLOCK
    for i in range(2):
        run(engine, model, counting(engine, model, f"{label} push {i}", 5000 + 1000 * i, 1000))
    return follow_up, reference


def disk_files(engine: OwnEngine) -> list[str]:
    return glob.glob(f"{engine.disk_dir}/*_r0/**/*.bin", recursive=True)


def test_a_prefix_pushed_out_of_the_pool_and_the_host_tier_comes_back_from_disk(engine, saga_server):
    follow_up, reference = pushed_to_disk(engine, saga_server.model, "Counting")
    resumed, moved = run(engine, saga_server.model, follow_up)
    assert moved["saga_kv_disk_chunks_total{what=read}"] == PREFIX_BLOCKS, moved
    assert cached(resumed) == PREFIX_BLOCKS * BLOCK  # loaded, not computed
    assert moved["saga_kv_tier_hit_tokens_total"] == PREFIX_BLOCKS * BLOCK, moved
    assert resumed["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]


@pytest.mark.parametrize("damage", ["truncated", "unreadable"])
def test_a_damaged_file_on_disk_is_recomputed_and_nothing_fails(engine, saga_server, damage):
    follow_up, reference = pushed_to_disk(engine, saga_server.model, f"Damaged {damage}")
    for path in disk_files(engine):
        if damage == "truncated":
            os.truncate(path, 100)
        else:  # a directory where the file was: opening works, reading fails
            os.remove(path)
            os.mkdir(path)
    resumed, moved = run(engine, saga_server.model, follow_up)
    assert moved["saga_kv_disk_chunks_total{what=read_failed}"] >= 1, moved
    assert moved.get("saga_kv_disk_chunks_total{what=read}", 0) == 0, moved
    assert moved["vllm:iteration_tokens_total_sum"] >= PREFIX_BLOCKS * BLOCK, moved  # computed again
    assert resumed["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]

    # the tier heals: the prefix is written again, and read back the next time
    follow_up, reference = pushed_to_disk(engine, saga_server.model, f"After {damage}")
    resumed, moved = run(engine, saga_server.model, follow_up)
    assert moved["saga_kv_disk_chunks_total{what=read}"] == PREFIX_BLOCKS, moved


def test_a_slow_disk_is_waited_for_once_then_prefixes_are_recomputed(engine, saga_server, slow_file):
    # runs last in this module: the disk stays marked slow for the rest of it
    first, first_reference = pushed_to_disk(engine, saga_server.model, "Slow first")
    second, second_reference = pushed_to_disk(engine, saga_server.model, "Slow second")
    slow_file.touch()
    try:
        resumed, moved = run(engine, saga_server.model, first)
        assert moved["saga_kv_disk_chunks_total{what=slow_reads}"] == 1, moved  # read, slowly
        assert resumed["choices"][0]["token_ids"] == first_reference["choices"][0]["token_ids"]
        resumed, moved = run(engine, saga_server.model, second)
    finally:
        slow_file.unlink()
    assert moved["saga_kv_disk_chunks_total{what=skipped_slow}"] >= 1, moved  # not read: computed
    assert moved.get("saga_kv_disk_chunks_total{what=read}", 0) == 0, moved
    assert cached(resumed) == 0
    assert resumed["choices"][0]["token_ids"] == second_reference["choices"][0]["token_ids"]


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("this machine may not mount a small tmpfs (the full-disk test needs one)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_fails_writes_not_requests_and_the_prefix_is_recomputed(saga_server, tmp_path, small_disk):
    # 4 MiB hold 5 chunks of 720 KiB, far below the tier's 0.2 GiB: writes fail with ENOSPC
    own = disk_engine("disk-full", tmp_path, small_disk)
    own.disk_dir = small_disk
    try:
        follow_up, reference = pushed_to_disk(own, saga_server.model, "Full")
        stored = own.metrics("saga_kv_disk")
        assert stored["saga_kv_disk_chunks_total{what=write_failed}"] >= 1, stored
        resumed, moved = run(own, saga_server.model, follow_up)
        assert resumed["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
        assert cached(resumed) < PREFIX_BLOCKS * BLOCK  # what the disk could not keep was computed
    finally:
        own.stop()
