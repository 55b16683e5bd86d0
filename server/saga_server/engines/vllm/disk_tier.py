"""`SagaDiskTier`: a disk tier below the host tier, bounded, dropping in SAGA's order.

vLLM's tiered offload (`TieringOffloadingSpec`) keeps a CPU tier and, below it,
secondary tiers; its file-system tier (`fs`) writes every chunk the CPU tier stores to
a file and never deletes one. This is that tier with a bound: it holds at most
`capacity_bytes` of chunks, and when a store would pass it, it deletes chunks first in
the order the host tier drops them (`session_chunks`, the core's host-tier order: the
session the engine's KV policy values least first, its tail first; a session the
engine forgot before any). So the disk keeps the sessions likeliest to come back, as
the simulator's disk tier does, and a returning session's prefix comes back through
vLLM's own path: a lookup that misses the CPU tier finds the chunk here and vLLM
promotes it to the CPU tier, then loads it into the pool. A prefetch (SAGA's re-prefill
of a session in a tool call, `prefetch.py`) takes the same path, so it reads from disk
ahead of the session's return too.

The tier answers lookups from its own table, not the file system: what it wrote and
has not dropped. Its directory is its own scratch space: what an earlier run left
there is removed when it starts (its sessions are unknown and the bound counts only
this run's writes).

Nothing on disk can fail a request. A write that fails (a full disk) leaves the chunk
out of the table; the CPU tier still holds it. A read that fails (a file unreadable,
truncated or gone) drops the chunk from the table, and vLLM marks the lookup a miss,
so the request computes that part of its prefix. A read slower than `max_read_s`
(a slow disk) stops further lookups from counting on the disk for `slow_backoff_s`:
those prefixes are recomputed, which is faster than waiting. All of these are counted
(`counts`, exported as `saga_kv_disk_chunks`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shutil
import time
import weakref
from typing import Iterable

import numpy as np

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from .session_chunks import SessionChunks

__all__ = ["SagaDiskTier", "disk_occupancy", "disk_counts", "TIER_TYPE"]

log = logging.getLogger("vllm.saga.disk_tier")  # under "vllm." so vLLM's log handler shows it

TIER_TYPE = "SagaDiskTier"
_tiers: weakref.WeakSet = weakref.WeakSet()  # this process's disk tiers (vLLM builds them)


def disk_occupancy() -> tuple[int, int]:
    """Chunks this process's disk tiers hold, and their capacity."""
    tiers = list(_tiers)
    return sum(len(t.chunks) for t in tiers), sum(t.capacity_chunks for t in tiers)


def disk_counts() -> collections.Counter[str]:
    """Chunks written, read, evicted, and failed or skipped, over this process's disk tiers."""
    out: collections.Counter[str] = collections.Counter()
    for t in list(_tiers):
        out.update(t.counts)
    return out


class SagaDiskTier(FileSystemTierManager):
    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str, root_dir: str,
                 capacity_bytes: int, max_read_s: float = 2.0, slow_backoff_s: float = 30.0, **fs_options) -> None:
        """`capacity_bytes`: the most this tier writes (`saga serve --kv-disk-size`);
        `max_read_s`: a read of one job slower than this marks the disk slow;
        `slow_backoff_s`: for how long the disk then answers every lookup with a miss.
        The rest are vLLM's `fs` tier options (`n_read_threads`, `n_write_threads`, ...)."""
        super().__init__(offloading_spec, primary_kv_view, tier_type, root_dir, **fs_options)
        own_dir = f"{self.file_mapper.base_path}_r{self.file_mapper.rank}"
        if os.path.isdir(own_dir):
            shutil.rmtree(own_dir, ignore_errors=True)
        self.capacity_chunks = int(capacity_bytes) // self._block_size
        if self.capacity_chunks <= 0:
            raise ValueError(f"{TIER_TYPE}: capacity_bytes {capacity_bytes} holds no chunk of {self._block_size} bytes")
        self.max_read_s = float(max_read_s)
        self.slow_backoff_s = float(slow_backoff_s)
        self.chunks = SessionChunks()
        self.counts: collections.Counter[str] = collections.Counter()
        self._busy: collections.Counter[OffloadKey] = collections.Counter()  # chunks in a job in flight
        self._writing: set[OffloadKey] = set()
        self._stores: dict[int, list[OffloadKey]] = {}
        self._loads: dict[int, list[OffloadKey]] = {}
        self._slow_until = 0.0
        _tiers.add(self)
        log.info("SAGA disk KV tier in %s: %d chunks of %d bytes", own_dir, self.capacity_chunks, self._block_size)

    # -- what is here -------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key not in self.chunks or key in self._writing:
            return LookupResult.MISS  # a chunk being written is still in the CPU tier
        if time.monotonic() < self._slow_until:
            self.counts["skipped_slow"] += 1
            return LookupResult.MISS
        return LookupResult.HIT

    def touch(self, keys, req_context: ReqContext) -> None:
        self._used(list(keys), req_context)

    # -- writes (the CPU tier stored these chunks) ---------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        new = [i for i, k in enumerate(keys) if k not in self.chunks]
        fits = self._make_room(len(new))
        if fits < len(new):
            self.counts["skipped_full"] += len(new) - fits
            new = new[:fits]  # the head of the request's prefix, the part worth most
        write = [keys[i] for i in new]
        for key in write:
            self.chunks.add(key)
            self._busy[key] += 1
        self._writing.update(write)
        self._used(keys, job_metadata.req_context)  # files them under the session, at their positions
        self._stores[job_metadata.job_id] = write
        super().submit_store(dataclasses.replace(job_metadata, keys=write,
                                                 chunk_ids=np.asarray(job_metadata.chunk_ids)[new]))

    def _make_room(self, n: int) -> int:
        """Delete chunks, in SAGA's order, until `n` more fit; how many fit."""
        over = len(self.chunks) + n - self.capacity_chunks
        if over > 0:
            for key in self.chunks.victims(over, lambda k: not self._busy[k]):
                self._delete(key)
                self.counts["evicted"] += 1
        return max(0, min(n, self.capacity_chunks - len(self.chunks)))

    # -- reads (a lookup found the chunk here; vLLM promotes it to the CPU tier) -----------

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        for k in keys:
            self._busy[k] += 1
        self._loads[job_metadata.job_id] = keys
        self._used(keys, job_metadata.req_context)
        super().submit_load(job_metadata)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = list(super().get_finished_jobs())
        for r in results:
            if (keys := self._stores.pop(r.job_id, None)) is not None:
                self._release(keys)
                self._writing.difference_update(keys)
                if r.success:
                    self.counts["written"] += len(keys)
                else:  # a full or failing disk: the chunks stay only in the CPU tier, and
                    # what the job wrote before it failed is deleted, to give the space back
                    self.counts["write_failed"] += len(keys)
                    for k in keys:
                        self._delete(k)
            elif (keys := self._loads.pop(r.job_id, None)) is not None:
                self._release(keys)
                ok = set(keys) if r.success else set(r.successful_keys or ())
                self.counts["read"] += len(ok)
                failed = [k for k in keys if k not in ok]
                self.counts["read_failed"] += len(failed)
                for k in failed:  # unreadable, truncated or gone: recomputed, never read again
                    self._delete(k)
                if r.transfer_time is not None and r.transfer_time > self.max_read_s:
                    self._slow_until = time.monotonic() + self.slow_backoff_s
                    self.counts["slow_reads"] += 1
                    log.warning("SAGA disk KV tier: a read of %d chunks took %.2f s; prefixes are recomputed "
                                "instead of read for %.0f s", len(keys), r.transfer_time, self.slow_backoff_s)
        return results

    # -- helpers --------------------------------------------------------------------------

    def _used(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        self.chunks.used(req_context, keys)

    def _release(self, keys: list[OffloadKey]) -> None:
        for k in keys:
            self._busy[k] -= 1
            if self._busy[k] <= 0:
                del self._busy[k]

    def _delete(self, key: OffloadKey) -> None:
        if key in self.chunks:
            self.chunks.remove(key)
        self._lookup_manager.mark_miss([key])
        path = self.file_mapper.get_file_name(key)
        try:
            os.remove(path)
        except IsADirectoryError:  # something else took the file's name: the next write must not skip it
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass  # never written, or already gone: either way not on disk
