"""SAGA's disk tier (`engines/vllm/disk_tier.py`) inside vLLM's real tiered offload:
`saga serve --kv-disk-dir` builds vLLM's `TieringOffloadingManager` with it below the
host tier, it writes real files, stays inside its bound by deleting chunks in SAGA's
order (where vLLM's LRU would delete others), and a failed read drops the chunk."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.tiering.base import TransferJob

from saga_proto import hints_pb2 as pb
from saga_server.core import SessionEnd
from saga_server.engines.vllm import SagaScheduler, disk_tier, session_chunks
from saga_server.serve import cli
from saga_server.status import render
from test_offload_policy import BS, sessions_testing_and_grepping
from vllm_builders import make_scheduler, run_until_idle

CHUNKS = 8  # the disk's capacity in the tests below


def tiered_extra(disk_dir, chunks: int = CHUNKS) -> dict:
    """The connector's extra config `saga serve --kv-offloading-size --kv-disk-dir` writes,
    the disk sized in chunks of this tiny model (one page each)."""
    _, transfer = cli.host_tier_config(["--kv-offloading-size", "0.0001"], gpu=False, with_saga=True,
                                       order="saga", disk_dir=str(disk_dir), disk_gib=chunks * os.sysconf("SC_PAGESIZE") / 2**30)
    return transfer["kv_connector_extra_config"]


def keys(name: str, n: int) -> list:
    return [make_offload_key(f"{name}-{i}".encode(), 0) for i in range(n)]


_jobs = iter(range(10**9))


def write(disk, ks, request_id: str) -> None:
    """Store `ks` (a request's chunks, head first) from primary slots 0.. and wait."""
    ctx = ReqContext(req_id=request_id)
    for i, k in enumerate(ks):
        ctx.set_offload_key_position(k, (i + 1) * BS)
    disk.submit_store(TransferJob(next(_jobs), ks, np.arange(len(ks), dtype=np.int32), False, ctx))
    disk.drain_jobs()
    assert all(r.success for r in disk.get_finished_jobs())


@pytest.fixture
def tiered(tiny_model):
    """Builds the offloading manager of a new engine (a SagaScheduler) with the tiered
    offload `saga serve --kv-disk-dir` configures; shut down after the test, which frees
    its shared-memory region and the disk tier's threads."""
    managers = []

    def build(disk_dir):
        s = make_scheduler(SagaScheduler, tiny_model, start_hints=False, num_blocks=16, block_size=BS,
                           kv_offloading_size=0.0001, kv_transfer_extra=tiered_extra(disk_dir))
        managers.append(s.connector.connector_scheduler.manager)
        return managers[-1]

    yield build
    for manager in managers:
        manager.shutdown()


def new_disk(tiered, disk_dir) -> disk_tier.SagaDiskTier:
    (disk,) = tiered(disk_dir).secondary_tiers
    return disk


def sessions_in_tools(tiny_model):
    """A learned SagaScheduler whose plugin the tiers follow, and two of its sessions in
    tool calls: `testing` (a 60 s test run) and `grepping` (a 0.2 s grep)."""
    s, reqs = sessions_testing_and_grepping(tiny_model)
    session_chunks.attach(s.saga)
    return s, reqs


def test_saga_serve_builds_vllms_tiered_offload_with_the_disk_tier_below_the_host_tier(tiered, tmp_path):
    manager = tiered(tmp_path / "disk")
    assert type(manager).__name__ == "TieringOffloadingManager"
    assert type(manager.primary_tier._policy).__name__ == "SagaCachePolicy"
    (disk,) = manager.secondary_tiers
    assert type(disk) is disk_tier.SagaDiskTier and disk.capacity_chunks == CHUNKS


def test_the_disk_stays_in_its_bound_dropping_in_sagas_order_where_lru_would_not(tiny_model, tiered, tmp_path):
    results = {}
    for order in ("lru", "saga"):
        disk = new_disk(tiered, tmp_path / f"disk-{order}")
        learned, reqs = sessions_in_tools(tiny_model)
        clock = learned.saga.clock
        if order == "lru":
            session_chunks.attach(None)  # no plugin: by last use
        write(disk, keys("testing", 4), reqs["testing"].request_id)  # written first: LRU's victim-to-be
        write(disk, keys("grepping", 4), reqs["grepping"].request_id)
        clock.t += 1.0
        disk.touch(keys("testing", 4), ReqContext(req_id=reqs["testing"].request_id))  # read again: LRU keeps it
        write(disk, keys("new", 2), "anonymous")
        assert len(disk.chunks) == CHUNKS and disk.counts["evicted"] == 2
        results[order] = [k for k in keys("testing", 4) + keys("grepping", 4) if k not in disk.chunks]
        for k in results[order]:  # deleted from disk, and no lookup finds it
            assert not os.path.exists(disk.file_mapper.get_file_name(k))
            assert disk.lookup(k, ReqContext(req_id="later")) is LookupResult.MISS
    grepping, testing = keys("grepping", 4), keys("testing", 4)
    assert results["lru"] == [grepping[2], grepping[3]]  # the least recently used session, tail first
    # SAGA: the session whose next request is farthest (a 60 s test run) goes first, tail first
    assert results["saga"] == [testing[2], testing[3]]


def test_a_session_the_engine_forgets_leaves_the_disk_first(tiny_model, tiered, tmp_path):
    disk = new_disk(tiered, tmp_path / "disk")
    learned, reqs = sessions_in_tools(tiny_model)
    write(disk, keys("grepping", 4), reqs["grepping"].request_id)
    write(disk, keys("testing", 4), reqs["testing"].request_id)  # the 60 s session, but ending
    learned.saga.core.accept(SessionEnd("testing", learned.saga.clock()))
    run_until_idle(learned)
    learned.schedule()  # the engine forgets it at its next step, in every tier
    write(disk, keys("new", 2), "anonymous")
    assert [k for k in keys("testing", 4) if k not in disk.chunks] == keys("testing", 4)[2:]


def test_a_read_that_fails_drops_the_chunk_and_a_slow_one_turns_reads_into_misses(tiny_model, tiered, tmp_path):
    disk = new_disk(tiered, tmp_path / "disk")
    _, reqs = sessions_in_tools(tiny_model)
    ks = keys("testing", 3)
    write(disk, ks, reqs["testing"].request_id)
    os.truncate(disk.file_mapper.get_file_name(ks[1]), 10)
    ctx = ReqContext(req_id="resume")
    assert all(disk.lookup(k, ctx) is LookupResult.HIT for k in ks)
    disk.submit_load(TransferJob(next(_jobs), ks, np.arange(3, 6, dtype=np.int32), True, ctx))
    disk.drain_jobs()
    (result,) = disk.get_finished_jobs()
    assert not result.success and list(result.successful_keys) == ks[:1]
    assert disk.counts["read"] == 1 and disk.counts["read_failed"] == 2
    assert disk.lookup(ks[0], ctx) is LookupResult.HIT and disk.lookup(ks[1], ctx) is LookupResult.MISS

    disk.max_read_s = 0.0  # every read is now slower than allowed
    disk.submit_load(TransferJob(next(_jobs), ks[:1], np.arange(6, 7, dtype=np.int32), True, ctx))
    disk.drain_jobs()
    list(disk.get_finished_jobs())
    assert disk.counts["slow_reads"] == 1
    assert disk.lookup(ks[0], ctx) is LookupResult.MISS and disk.counts["skipped_slow"] == 1


def test_saga_serve_writes_the_disk_tier_into_the_connector_config(monkeypatch):
    monkeypatch.setattr(cli, "is_gpu_build", lambda: False)
    opts, rest = cli._parser().parse_known_args(["--kv-offloading-size", "1", "--kv-disk-dir", "/scratch/kv",
                                                 "--kv-disk-size", "8"])
    argv = cli.build_command(opts, rest, "/models/m", True, base_env={}).argv
    extra = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieredHostOffloadingSpec"
    assert extra["secondary_tiers"] == [{"type": disk_tier.TIER_TYPE, "module_path": cli.DISK_TIER_MODULE,
                                         "root_dir": "/scratch/kv", "capacity_bytes": 8 * 2**30}]
    opts, rest = cli._parser().parse_known_args(["--kv-disk-dir", "/scratch/kv", "--kv-disk-size", "8"])
    with pytest.raises(SystemExit, match="needs --kv-offloading-size"):
        cli.build_command(opts, rest, "/models/m", True, base_env={})
    # stock vLLM with the same tiers: vLLM's connector, its LRU or ARC above the same bounded disk
    opts, rest = cli._parser().parse_known_args(["--no-saga", "--kv-offloading-size", "1", "--kv-tier-order",
                                                 "arc", "--kv-disk-dir", "/scratch/kv", "--kv-disk-size", "8"])
    argv = cli.build_command(opts, rest, "/models/m", True, base_env={}).argv
    stock = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert stock["kv_connector"] == "OffloadingConnector" and stock["kv_connector_extra_config"]["eviction_policy"] == "arc"


def test_saga_status_shows_the_disk_tier():
    counts = {"kv_disk_chunks": {"written": 120, "read": 21, "evicted": 4, "read_failed": 2, "skipped_slow": 3},
              "kv_disk_used_chunks": {"": 96}, "kv_disk_capacity_chunks": {"": 291}}
    engine = pb.EngineStats(counts={k: pb.MetricCounts(by_label=v) for k, v in counts.items()})
    out = render({"sessions_live": 1}, [], engine=engine)
    assert ("disk kv tier: 96 of 291 chunks used; 120 written, 21 read, 4 evicted; 2 failed and 3 skipped as "
            "slow (recomputed)") in out
    assert "kv_disk_chunks" not in out  # shown once, on its own line
