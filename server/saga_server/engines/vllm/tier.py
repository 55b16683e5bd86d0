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
"""

from __future__ import annotations

import collections

from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

from .loads import LoadLog

__all__ = ["SagaOffloadingConnector"]


class SagaOffloadingConnector(OffloadingConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        self.tier_loads = LoadLog()
        self.tier_blocks: collections.Counter[str] = collections.Counter()  # "stored", "loaded": engine blocks
        super().__init__(vllm_config, role, kv_cache_config)

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
        return meta

    def update_connector_output(self, connector_output) -> None:
        super().update_connector_output(connector_output)
        if connector_output.finished_recving:
            self.tier_loads.finished(connector_output.finished_recving, connector_output.failed_recving or ())
