"""`SagaLLMServer`: one Ray Serve LLM replica with SAGA inside its engine.

Ray's `LLMServer` starts vLLM's engine in this replica's process tree. Before it
does, this subclass picks a free local port and exports it as `SAGA_HINT_ADDR`,
so the SAGA scheduler plugin in the spawned EngineCore starts its hint service
there (see `engines/vllm/intake.py`): every replica has its own hint endpoint.

`record_routing_stats` (polled by Serve and handed to request routers as
`RunningReplica.routing_stats`) reads that hint service back (a side channel to
the EngineCore, where session state lives) and reports under key "saga":

    hint_addr  the replica's hint endpoint
    sessions   session ids the engine has served a prompt for, not seen end and
               not released to another replica (KV residency, as far as the
               engine's workflow core knows it)
    in_tool    of those, sessions inside a tool call (or an inferred tool gap)
    kv_usage   KV blocks held for sessions / KV blocks in the pool
    served     tenant -> tokens the engine served it (cumulative; cluster-wide
               Agent Fair Share, see `engine_calls.py`)

A failed read reports what it has (the hint address) and never fails the poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from ray.serve.llm.deployment import LLMServer

from saga_server.engines.vllm.intake import HINT_ADDR_ENV

log = logging.getLogger("ray.serve")

__all__ = ["SagaLLMServer", "read_report", "REPORT_KEY"]

REPORT_KEY = "saga"
MAX_REPORTED_SESSIONS = 4096


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def read_report(hint_addr: str, timeout: float = 2.0) -> dict[str, Any]:
    """The routing report of the engine whose hint service listens on `hint_addr`."""
    from saga_sdk import HintReader  # noqa: PLC0415

    out: dict[str, Any] = {"hint_addr": hint_addr}
    with HintReader(hint_addr, timeout=timeout) as reader:
        sessions = reader.sessions(MAX_REPORTED_SESSIONS)
        reply = reader.server_stats()
    stats = reply.stats
    # Hints reach every engine (see hints.py), so a session the engine merely heard
    # of is not resident: only those it served a prompt for and still holds
    # (kv_resident: it served a prompt there and was not moved away since).
    live = [s for s in sessions if s.state != "ended" and s.metrics.get("kv_resident", 0.0) > 0]
    out["sessions"] = [s.session_id for s in live]
    out["in_tool"] = [s.session_id for s in live if s.state == "tool"]
    blocks = stats.get("engine_kv_blocks") or 0.0
    out["kv_usage"] = float(stats.get("engine_held_blocks", 0.0)) / blocks if blocks else 0.0
    out["held_sessions"] = float(stats.get("engine_held_sessions", 0.0))
    out["pinned_blocks"] = float(stats.get("engine_pinned_blocks", 0.0))
    out["served"] = dict(reply.served_tokens_by_tenant)
    return out


from .hints import HINT_KV_PREFIX


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


class SagaLLMServer(LLMServer):
    async def __init__(self, llm_config, *args, **kwargs):
        host = os.environ.get("SAGA_HINT_HOST", "127.0.0.1")
        self.saga_hint_addr = f"{host}:{_free_port(host)}"
        os.environ[HINT_ADDR_ENV] = self.saga_hint_addr  # inherited by the EngineCore process
        log.info("SAGA replica: hint service at %s", self.saga_hint_addr)
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
            report = {"hint_addr": self.saga_hint_addr, "error": str(exc)[:200]}
        stats[REPORT_KEY] = report
        return stats
