"""`SagaOffloadingConnector`: vLLM's offloading connector (the host KV tier), whose
transfers SAGA counts.

vLLM reports KV loaded from its host tier as prefix-cache hits and keeps its own
transfer counters in the API server. SAGA's plugin, in the EngineCore, counts tier
hits apart from pool hits and per session, so this connector logs on its scheduler
side each request's load (`LoadLog`, the same log the NIXL connector keeps for
pulls) and the blocks each step stores and loads (`tier_blocks`). Nothing else
changes: the spec, manager, policy and worker are vLLM's (on a CPU engine SAGA's
host worker, `host_kv`). `saga serve --kv-offloading-size GiB` selects it; vLLM's
own flag would name vLLM's connector, so `saga serve` writes the whole
`--kv-transfer-config` instead (`cpu_bytes_to_use` is the flag's GiB).

A load that fails is recomputed, not fatal (`saga serve` sets vLLM's
`kv_load_failure_policy: recompute`): on a CPU engine the host worker reports the
failed load's blocks (`host_kv`), this connector hands them to the engine, counts the
load as failed, and offers that request no tier hit again, so a request whose whole
prefix failed recomputes it instead of retrying the same load. vLLM recomputes such
blocks for models with one KV cache group.
"""

from __future__ import annotations

import collections

from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

from .host_kv import HostCopyWorker
from .loads import LoadLog

__all__ = ["SagaOffloadingConnector"]


class SagaOffloadingConnector(OffloadingConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        self.tier_loads = LoadLog()
        self.tier_blocks: collections.Counter[str] = collections.Counter()  # "stored", "loaded": engine blocks
        self._loading: dict[str, set[int]] = {}  # request -> the engine blocks its tier load writes
        self._load_failed: set[str] = set()  # requests offered no tier hit again, preempted or not, until they end
        self._host_worker: HostCopyWorker | None = None
        super().__init__(vllm_config, role, kv_cache_config)

    # -- worker side ----------------------------------------------------------------------

    def register_kv_caches(self, kv_caches) -> None:
        super().register_kv_caches(kv_caches)
        worker = self.connector_worker.worker
        if isinstance(worker, HostCopyWorker):
            worker.recover_failed_jobs()
            self._host_worker = worker

    def get_block_ids_with_load_errors(self) -> set[int]:
        # Called after this step's transfer results: the worker reports a failed
        # load's blocks in the step that reports the load done, as vLLM requires.
        return self._host_worker.take_load_errors() if self._host_worker else set()

    # -- scheduler side --------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if request.request_id in self._load_failed:
            return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens, max_num_new_tokens=0)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        # Called with the tokens the scheduler settled on loading, after its trims.
        result = super().update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens > 0:
            self.tier_loads.started(request.request_id, num_external_tokens)
        return result

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        self.tier_blocks["stored"] += sum(len(job.src_spec.block_ids) for job in meta.store_jobs.values())
        self.tier_blocks["loaded"] += sum(len(job.dst_spec.block_ids) for job in meta.load_jobs.values())
        for job in meta.load_jobs.values():
            self._loading.setdefault(job.req_id, set()).update(job.dst_spec.block_ids.tolist())
        return meta

    def update_connector_output(self, connector_output) -> None:
        super().update_connector_output(connector_output)
        if not connector_output.finished_recving:
            return
        failed = set(connector_output.failed_recving or ())
        invalid = connector_output.invalid_block_ids
        for req_id in connector_output.finished_recving:
            if not invalid.isdisjoint(self._loading.pop(req_id, ())):
                failed.add(req_id)
        self._load_failed |= failed
        self.tier_loads.finished(connector_output.finished_recving, failed)

    def request_finished(self, request, block_ids):
        self._forget(request.request_id)
        return super().request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        self._forget(request.request_id)
        return super().request_finished_all_groups(request, block_ids)

    def _forget(self, req_id: str) -> None:
        self._loading.pop(req_id, None)
        self._load_failed.discard(req_id)
