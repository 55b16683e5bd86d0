"""vLLM's NIXL connector for moving a session's KV between engines, with the engine's
CPU affinity kept.

`saga serve --kv-transfer nixl` loads this module as the engine's KV connector
(`kv_connector_module_path`); the class keeps vLLM's name, `NixlConnector`, because
vLLM's configuration checks (layouts, context parallelism) look for that name.

On CPU builds vLLM's NIXL worker pins the calling thread, the engine worker's main
thread, to the last core of each NUMA node, to keep KV transfers off the cores that
run the model. On a small host that is the one core every co-hosted engine then
shares (two replicas measured on one core of two, docs/CPU_ENGINE.md). The worker's
affinity before the connector started is put back, so the engine runs where it was
placed (`taskset`, Ray, `VLLM_CPU_OMP_THREADS_BIND`); `SAGA_NIXL_KEEP_PINNING=1`
keeps NIXL's choice.

On CPU builds the worker's NIXL agent also runs without NIXL's progress thread.
NIXL's Python API starts that thread with a zero poll delay, so it spins a whole
core per engine even while the engine is idle (two co-hosted replicas then leave the
model no core; what it cost a move: docs/RESEARCH.md, "A session's prefix KV moved to
another engine"). Transfers do not
need it: vLLM's worker progresses them on every engine step (`get_finished` polls
the target's reads and the source's notifications), and an engine keeps stepping
while it holds blocks for a pull (the scheduler counts such finished requests as
work). GPU builds keep vLLM's agent; `EngineSettings.nixl_progress_thread`
(`SAGA_NIXL_PROGRESS_THREAD`) forces the thread on or off.

How a move uses it (`saga_server.router.kv_move`): the source engine holds a
prefix's blocks for a pull (a one-token request with `do_remote_decode`), the target
pulls them over NIXL (the same prompt with the returned `kv_transfer_params`) and
caches them, so the session's next request there hits its prefix cache.

vLLM counts pulled tokens as computed, not as cached (`cached_tokens` is 0 for the
pull), so the scheduler side keeps its own `loads.LoadLog`: what each pull asked
for, when it ended and whether it failed. The SAGA plugin reads it to count pulled
tokens apart from prefix hits (`saga_kv_pulled_tokens`, `saga status`).
"""

from __future__ import annotations

import logging
import os
import uuid

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector as _VllmNixlConnector
from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config

from saga_server.settings import EngineSettings

from .compat import nixl_agent_has_own_backends
from .loads import LoadLog

log = logging.getLogger(__name__)

__all__ = ["NixlConnector"]



class NixlConnector(_VllmNixlConnector):
    """vLLM's pull-based NIXL connector, leaving the worker's CPU affinity as it was;
    its scheduler side logs each pull (`pulls`)."""

    def __init__(self, vllm_config, role, kv_cache_config) -> None:
        self.pulls = LoadLog()
        placed = os.sched_getaffinity(0)
        super().__init__(vllm_config, role, kv_cache_config)
        pinned = os.sched_getaffinity(0)
        if pinned != placed and not EngineSettings.from_env().nixl_keep_pinning:
            os.sched_setaffinity(0, placed)
            log.info("SAGA: NIXL pinned the engine worker to cores %s; restored %s",
                     sorted(pinned), sorted(placed))
        if role == KVConnectorRole.WORKER and not wants_progress_thread(vllm_config.kv_transfer_config):
            if nixl_agent_has_own_backends(vllm_config):
                log.info("SAGA: NIXL agent keeps its progress thread: vLLM built its backends "
                         "(ucx_backend_params or sleep mode), which SAGA's agent would not copy")
            else:
                # Nothing is registered with the agent before `register_kv_caches`, so the
                # worker can still take another one; vLLM's is dropped, and its thread with it.
                self.connector_worker.nixl_wrapper = agent_without_progress_thread(
                    vllm_config.kv_transfer_config)
                log.info("SAGA: NIXL agent runs without its progress thread (engine steps progress it)")

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


def wants_progress_thread(kv_transfer_config) -> bool:
    """Whether the engine's NIXL agent keeps NIXL's progress thread: on device builds,
    unless `EngineSettings.nixl_progress_thread` says otherwise."""
    forced = EngineSettings.from_env().nixl_progress_thread
    if forced is not None:
        return forced
    return kv_transfer_config.kv_buffer_device != "cpu"


def agent_without_progress_thread(kv_transfer_config):
    """A NIXL agent configured as vLLM's worker configures its own (backends, UCX
    threads, telemetry), but with no progress thread."""
    backends = kv_transfer_config.get_from_extra_config("backends", ["UCX"])
    if any(backend != "UCX" for backend in backends):
        config = nixl_agent_config(backends=backends, capture_telemetry=True,
                                   enable_prog_thread=False)
    else:
        num_threads = kv_transfer_config.get_from_extra_config("num_threads", 4)
        config = nixl_agent_config(num_threads=num_threads, capture_telemetry=True,
                                   enable_prog_thread=False)
    return NixlWrapper(str(uuid.uuid4()), config)
