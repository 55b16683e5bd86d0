"""vLLM's NIXL connector for moving a session's KV between engines, with the engine's
CPU affinity kept.

`saga serve --kv-transfer nixl` loads this module as the engine's KV connector
(`kv_connector_module_path`); the class keeps vLLM's name, `NixlConnector`, because
vLLM's configuration checks (layouts, context parallelism) look for that name.

On CPU builds vLLM's NIXL worker pins the calling thread, the engine worker's main
thread, to the last core of each NUMA node, to keep KV transfers off the cores that
run the model. On a small host that is the one core every co-hosted engine then
shares (two replicas measured on one core of two, ENGINE_NOTES.md). The worker's
affinity before the connector started is put back, so the engine runs where it was
placed (`taskset`, Ray, `VLLM_CPU_OMP_THREADS_BIND`); `SAGA_NIXL_KEEP_PINNING=1`
keeps NIXL's choice.

How a move uses it (`saga_server.router.kv_move`): the source engine holds a
prefix's blocks for a pull (a one-token request with `do_remote_decode`), the target
pulls them over NIXL (the same prompt with the returned `kv_transfer_params`) and
caches them, so the session's next request there hits its prefix cache.

vLLM counts pulled tokens as computed, not as cached (`cached_tokens` is 0 for the
pull), so the scheduler side keeps its own `pulls.PullLog`: what each pull asked
for, when it ended and whether it failed. The SAGA plugin reads it to count pulled
tokens apart from prefix hits (`saga_kv_pulled_tokens`, `saga status`).
"""

from __future__ import annotations

import logging
import os

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector as _VllmNixlConnector

from .pulls import PullLog

log = logging.getLogger(__name__)

__all__ = ["NixlConnector", "KEEP_PINNING_ENV"]

KEEP_PINNING_ENV = "SAGA_NIXL_KEEP_PINNING"


class NixlConnector(_VllmNixlConnector):
    """vLLM's pull-based NIXL connector, leaving the worker's CPU affinity as it was;
    its scheduler side logs each pull (`pulls`)."""

    def __init__(self, vllm_config, role, kv_cache_config) -> None:
        self.pulls = PullLog()
        placed = os.sched_getaffinity(0)
        super().__init__(vllm_config, role, kv_cache_config)
        pinned = os.sched_getaffinity(0)
        if pinned != placed and os.environ.get(KEEP_PINNING_ENV) != "1":
            os.sched_setaffinity(0, placed)
            log.info("SAGA: NIXL pinned the engine worker to cores %s; restored %s",
                     sorted(pinned), sorted(placed))

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        # Called with the tokens the scheduler settled on loading, after its trims.
        result = super().update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens > 0:
            self.pulls.started(request.request_id, num_external_tokens)
        return result

    def update_connector_output(self, connector_output) -> None:
        super().update_connector_output(connector_output)
        if connector_output.finished_recving:
            self.pulls.finished(connector_output.finished_recving, connector_output.failed_recving or ())
