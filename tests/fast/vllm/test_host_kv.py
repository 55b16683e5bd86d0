"""The host KV tier's worker (`engines/vllm/host_kv.py`) on real host tensors, through
vLLM's own load/store specs: blocks stored to the tier come back byte for byte into
other pool blocks, a chunk of several blocks is filled and read at the right offsets
(the first chunk of a request may start mid-chunk), jobs finish in order, each is
reported once with its bytes, and `wait` returns only when the job is done."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
import torch

from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from saga_server.engines.vllm.host_kv import HostCopyWorker

BLOCKS, PAGE = 24, 64  # engine blocks, bytes per block and layer


def engine_kv(layers: int = 3) -> tuple[list[torch.Tensor], CanonicalKVCaches]:
    torch.manual_seed(0)
    tensors = [torch.randn(BLOCKS, PAGE // 4) for _ in range(layers)]  # float32: PAGE bytes a block
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, PAGE) for t in tensors],
                               [[CanonicalKVCacheRef(i, PAGE) for i in range(layers)]])
    return tensors, caches


def engine_spec(blocks: list[int], first_block: int = 0) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[first_block])


def finish(worker: HostCopyWorker, *job_ids: int) -> list:
    worker.wait(set(job_ids))
    return worker.get_finished()


def test_blocks_stored_to_the_tier_load_back_byte_for_byte_into_other_blocks():
    tensors, caches = engine_kv()
    before = [t.clone() for t in tensors]
    worker = HostCopyWorker(caches, blocks_per_chunk=1, num_chunks=8)
    try:
        assert worker.submit_store(1, engine_spec([3, 5, 7]), CPULoadStoreSpec([6, 0, 2]))
        (stored,) = finish(worker, 1)
        assert (stored.job_id, stored.success, stored.transfer_size) == (1, True, 3 * 3 * PAGE)
        for t in tensors:
            t[[10, 11, 12]] = 0.0
        assert worker.submit_load(2, CPULoadStoreSpec([6, 0, 2]), engine_spec([10, 11, 12]))
        (loaded,) = finish(worker, 2)
        assert loaded.success and loaded.transfer_size == 3 * 3 * PAGE and loaded.transfer_time >= 0
        for t, b in zip(tensors, before):
            assert torch.equal(t[[10, 11, 12]], b[[3, 5, 7]])
            assert torch.equal(t[:10], b[:10])  # nothing else written
        assert worker.get_finished() == []  # each job is reported once
    finally:
        worker.shutdown()


def test_a_chunk_holds_several_blocks_and_a_request_may_start_mid_chunk():
    tensors, caches = engine_kv()
    before = [t.clone() for t in tensors]
    worker = HostCopyWorker(caches, blocks_per_chunk=4, num_chunks=4)
    try:
        # the request's blocks 2..7 (engine blocks 0..5) into chunks 3 and 1: chunk 3
        # holds request blocks 0-3 (2 and 3 here), chunk 1 holds 4-7
        worker.submit_store(1, engine_spec([0, 1, 2, 3, 4, 5], first_block=2), CPULoadStoreSpec([3, 1]))
        finish(worker, 1)
        # load request blocks 4..7 alone (chunk 1) and 3 alone (the last of chunk 3)
        worker.submit_load(2, CPULoadStoreSpec([1]), engine_spec([20, 21, 22, 23], first_block=4))
        worker.submit_load(3, CPULoadStoreSpec([3]), engine_spec([19], first_block=3))
        assert [r.job_id for r in finish(worker, 2, 3)] == [2, 3]  # in submission order
        for t, b in zip(tensors, before):
            assert torch.equal(t[[20, 21, 22, 23]], b[[2, 3, 4, 5]])
            assert torch.equal(t[19], b[1])
    finally:
        worker.shutdown()


def test_wait_blocks_until_the_job_is_done_and_the_copy_runs_off_the_callers_thread():
    tensors, caches = engine_kv(layers=1)
    worker = HostCopyWorker(caches, blocks_per_chunk=1, num_chunks=4)
    copying, release, threads = threading.Event(), threading.Event(), []
    copy = worker._copy

    def slow_copy(job):
        threads.append(threading.current_thread().name)
        copying.set()
        release.wait(10)
        return copy(job)

    worker._copy = slow_copy
    try:
        assert worker.submit_store(7, engine_spec([1]), CPULoadStoreSpec([0]))  # returns at once
        assert copying.wait(10) and worker.get_finished() == []
        waiter = threading.Thread(target=worker.wait, args=({7},))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()  # the job is not done
        release.set()
        waiter.join(10)
        assert not waiter.is_alive() and [r.job_id for r in worker.get_finished()] == [7]
        assert threads == ["saga-host-kv"]
    finally:
        release.set()
        worker.shutdown()


def test_a_spec_that_does_not_match_its_chunks_is_refused_before_anything_runs():
    _, caches = engine_kv(layers=1)
    worker = HostCopyWorker(caches, blocks_per_chunk=2, num_chunks=4)
    try:
        with pytest.raises(ValueError, match="offload spec mismatch"):
            worker.submit_store(1, engine_spec([0, 1, 2]), CPULoadStoreSpec([0]))  # 3 blocks need 2 chunks
        assert worker.get_finished() == []
    finally:
        worker.shutdown()


def failing(worker: HostCopyWorker, stores: bool = False):
    """The tier's memory gone: every load's (or store's) copy raises. Returns the
    worker's own copy, to put back."""
    copy = worker._copy

    def copy_or_fail(job):
        if job.store == stores:
            raise OSError("the tier's memory is gone")
        return copy(job)

    worker._copy = copy_or_fail
    return copy


def test_a_failed_load_is_reported_done_and_its_engine_blocks_as_load_errors_in_that_step_only():
    _, caches = engine_kv()
    worker = HostCopyWorker(caches, blocks_per_chunk=1, num_chunks=8)
    worker.recover_failed_jobs()
    try:
        worker.submit_store(1, engine_spec([3, 5]), CPULoadStoreSpec([0, 1]))
        finish(worker, 1)
        failing(worker)
        worker.submit_load(2, CPULoadStoreSpec([0, 1]), engine_spec([10, 11]))
        worker.wait({2})
        assert worker.take_load_errors() == set()  # not before the job is reported done
        (loaded,) = worker.get_finished()
        assert (loaded.job_id, loaded.success) == (2, True)  # vLLM's connector asserts success
        assert worker.take_load_errors() == {10, 11}
        assert worker.take_load_errors() == set()  # each once
    finally:
        worker.shutdown()


def test_a_failed_store_is_never_loaded_until_a_store_rewrites_its_tier_blocks():
    tensors, caches = engine_kv()
    before = [t.clone() for t in tensors]
    worker = HostCopyWorker(caches, blocks_per_chunk=1, num_chunks=8)
    worker.recover_failed_jobs()
    copy = failing(worker, stores=True)
    try:
        worker.submit_store(1, engine_spec([3, 5]), CPULoadStoreSpec([0, 1]))
        assert [r.success for r in finish(worker, 1)] == [True]  # done, so the pool may reuse its blocks
        worker._copy = copy
        worker.submit_load(2, CPULoadStoreSpec([1]), engine_spec([12]))
        finish(worker, 2)
        assert worker.take_load_errors() == {12}  # tier block 1 holds nothing
        worker.submit_store(3, engine_spec([5]), CPULoadStoreSpec([1]))
        worker.submit_load(4, CPULoadStoreSpec([1]), engine_spec([12]))
        finish(worker, 3, 4)
        assert worker.take_load_errors() == set()
        for t, b in zip(tensors, before):
            assert torch.equal(t[12], b[5])
    finally:
        worker.shutdown()


def test_without_recovery_a_failed_load_is_reported_failed():
    _, caches = engine_kv(layers=1)
    worker = HostCopyWorker(caches, blocks_per_chunk=1, num_chunks=4)
    try:
        failing(worker)
        worker.submit_load(1, CPULoadStoreSpec([0]), engine_spec([2]))
        assert [r.success for r in finish(worker, 1)] == [False]
        assert worker.take_load_errors() == set()
    finally:
        worker.shutdown()


def device_pointers(spec: GPULoadStoreSpec, caches: CanonicalKVCaches):
    """The engine side of a job as vLLM 0.34's connector hands it to the worker
    (`resolve_device_pointers`); on older vLLM, the same layout built here."""
    try:
        from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers
    except ImportError:  # vLLM before 0.34: the worker gets the spec itself
        import types

        ptrs = []
        for count, refs, at in zip(spec.group_sizes, caches.group_data_refs,
                                   itertools.accumulate(spec.group_sizes, initial=0)):
            for ref in refs:
                t = caches.tensors[ref.tensor_idx].tensor
                ptrs += [t.data_ptr() + int(b) * t.stride(0) for b in spec.block_ids[at:at + count]]
        return types.SimpleNamespace(ptrs=np.array(ptrs, dtype=np.uint64), group_block_counts=tuple(spec.group_sizes),
                                     group_data_ref_counts=tuple(len(r) for r in caches.group_data_refs),
                                     block_indices=tuple(spec.block_indices))
    return resolve_device_pointers(spec, caches)


def test_the_worker_takes_the_engine_blocks_as_device_pointers_too():
    """vLLM 0.34 resolves a job's engine blocks to pointers before the worker sees them
    (`compat.engine_blocks` turns them back): the same copies as from the spec."""
    tensors, caches = engine_kv()
    before = [t.clone() for t in tensors]
    worker = HostCopyWorker(caches, blocks_per_chunk=2, num_chunks=4)
    try:
        assert worker.submit_store(1, device_pointers(engine_spec([3, 5, 7], first_block=1), caches),
                                   CPULoadStoreSpec([2, 0]))
        finish(worker, 1)
        assert worker.submit_load(2, CPULoadStoreSpec([2, 0]),
                                  device_pointers(engine_spec([10, 11, 12], first_block=1), caches))
        (loaded,) = finish(worker, 2)
        assert loaded.success and loaded.transfer_size == 3 * 3 * PAGE
        for t, b in zip(tensors, before):
            assert torch.equal(t[[10, 11, 12]], b[[3, 5, 7]])
    finally:
        worker.shutdown()
