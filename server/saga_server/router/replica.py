"""`SagaLLMServer`: one Ray Serve LLM replica with SAGA inside its engine.

Ray's `LLMServer` starts vLLM's engine in this replica's process tree. Before it
does, this subclass picks a free local port and exports it as `SAGA_HINT_ADDR`,
so the SAGA scheduler plugin in the spawned EngineCore starts its hint service
there (see `engines/vllm/intake.py`): every replica has its own hint endpoint.
With the NIXL connector configured (`saga router --kv-transfer nixl`) it also
gives the engine a NIXL side-channel port of its own.

`record_routing_stats` (polled by Serve and handed to request routers as
`RunningReplica.routing_stats`) reads that hint service back (a side channel to
the EngineCore, where session state lives) and reports a `report.ReplicaReport`
(which sessions' KV the engine holds, which of them are in a tool call, KV
usage, tokens served per tenant) under `REPORT_KEY`, as a plain dict. A failed
read reports the hint address and the error, and never fails the poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from ray.serve.llm.deployment import LLMServer

from ..serve_child import free_port
from ..settings import EngineSettings, RouterSettings
from .hints import HINT_KV_PREFIX
from .report import REPORT_KEY, ReplicaReport, read_report

log = logging.getLogger("ray.serve")

__all__ = ["SagaLLMServer"]


def _register(server: "SagaLLMServer") -> None:
    """Publish this replica's hint endpoint in Ray's internal KV (read by the
    cluster hint fan-out, `hints.py`); best effort."""
    try:
        from ray import serve  # noqa: PLC0415
        from ray.experimental import internal_kv  # noqa: PLC0415

        rid = serve.get_replica_context().replica_id.unique_id
        server._saga_kv_key = HINT_KV_PREFIX + rid
        internal_kv._internal_kv_put(server._saga_kv_key, server.saga_hint_addr, overwrite=True)
    except Exception:
        log.exception("SAGA replica: could not register the hint endpoint")


def _moves_kv_over_nixl(llm_config) -> bool:
    transfer = (getattr(llm_config, "engine_kwargs", None) or {}).get("kv_transfer_config") or {}
    return transfer.get("kv_connector") == "NixlConnector"


class SagaLLMServer(LLMServer):
    async def __init__(self, llm_config, *args, **kwargs):
        host = RouterSettings.from_env(logger=log).hint_host
        self.saga_hint_addr = f"{host}:{free_port(host)}"
        os.environ.update(EngineSettings(hint_addr=self.saga_hint_addr).to_env())  # inherited by the EngineCore
        log.info("SAGA replica: hint service at %s", self.saga_hint_addr)
        if _moves_kv_over_nixl(llm_config):  # a side channel of its own: replicas may share a host
            os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port(host))
            log.info("SAGA replica: NIXL side channel at %s:%s", host, os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        self._saga_kv_key = None
        await super().__init__(llm_config, *args, **kwargs)
        _register(self)

    def __del__(self):
        key = getattr(self, "_saga_kv_key", None)
        if key:
            try:
                from ray.experimental import internal_kv  # noqa: PLC0415

                internal_kv._internal_kv_del(key)
            except Exception:
                pass

    async def record_routing_stats(self) -> dict[str, Any]:
        try:
            stats = dict(await super().record_routing_stats() or {})
        except Exception:  # the engine's own stats are optional for SAGA
            stats = {}
        try:
            report = await asyncio.to_thread(read_report, self.saga_hint_addr)
        except Exception as exc:  # engine starting or busy: report the address only
            report = ReplicaReport.unreadable(self.saga_hint_addr, str(exc))
        stats[REPORT_KEY] = report.to_dict()  # Ray wants a plain dict here
        return stats
