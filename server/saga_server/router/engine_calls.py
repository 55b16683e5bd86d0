"""The router's calls into engines' hint services: cluster-wide Agent Fair Share
(`PeerServiceRelay`) and releasing a moved session's copy (`release_session`).

Each replica's routing report carries its engine's cumulative per-tenant
service (`ReplicaReport.served`, see `report.py`). `PeerServiceRelay` feeds those into a
`core.cluster_share.PeerServiceLedger` and tells every engine, through its hint
service's `ReportPeerService`, what the others served since the last round.
Sends run off the router's event loop, one in flight per engine; a failed send
is kept for the next round, so a slow or restarting engine loses nothing but
time and never delays routing.

Both are admin calls: they present `engine_key()`, the first admin key of the
keys file `saga router` was given (`$SAGA_API_KEYS`), else the shared key.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import Mapping

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk.channel import hint_channel

from saga_server.core.cluster_share import PeerServiceLedger
from saga_server.rpc.keys import KEYS_FILE_ENV, SHARED_KEY_ENV, KeyRing

from .report import ReplicaReport

log = logging.getLogger("ray.serve")

__all__ = ["PeerServiceRelay", "send_peer_service", "release_session", "engine_key"]


def engine_key() -> str | None:
    """The key this process presents to engines' hint services (None: no keys).
    Raises `KeysFileError` for a keys file that cannot be used."""
    return _admin_key(os.environ.get(KEYS_FILE_ENV) or None, os.environ.get(SHARED_KEY_ENV) or None)


@functools.lru_cache(maxsize=4)
def _admin_key(path: str | None, shared: str | None) -> str | None:
    # Read once per process: these calls run every routing round.
    return KeyRing(path, shared_key=shared).admin_key() if path or shared else None


def _channel(hint_addr: str):
    return hint_channel(hint_addr, engine_key())


def release_session(hint_addr: str, session_id: str, *, timeout: float = 2.0) -> bool:
    """Tell one engine to drop its holds for a session that moved (raises grpc.RpcError)."""
    with _channel(hint_addr) as channel:
        ack = hints_pb2_grpc.WorkflowHintsStub(channel).ReleaseSession(
            pb.ReleaseSessionRequest(session_id=session_id, reason="moved"), timeout=timeout)
    return ack.queued


def send_peer_service(hint_addr: str, tokens: Mapping[str, float], *, timeout: float = 2.0,
                      source: str = "saga-router") -> int:
    """One `ReportPeerService` call; returns the tenants applied (raises grpc.RpcError)."""
    with _channel(hint_addr) as channel:
        ack = hints_pb2_grpc.WorkflowHintsStub(channel).ReportPeerService(
            pb.PeerService(tenant_tokens=dict(tokens), source=source), timeout=timeout)
    return ack.tenants


class PeerServiceRelay:
    """Owned by one `SagaRequestRouter`; call `relay` from its event loop."""

    def __init__(self, send=send_peer_service) -> None:
        self.ledger = PeerServiceLedger()
        self._send = send
        self._sending: set[str] = set()
        self.counters = {"peer_sends": 0, "peer_send_failures": 0}

    def relay(self, reports: Mapping[str, ReplicaReport], tasks: set) -> None:
        """`reports`: replica id -> its current routing report (live replicas only)."""
        for gone in [e for e in self.ledger.engines() if e not in reports]:
            self.ledger.forget(gone)
        for replica, rep in reports.items():
            if rep.readable:
                self.ledger.observe(replica, rep.served)
        loop = asyncio.get_running_loop()
        for replica, rep in reports.items():
            addr = rep.hint_addr
            if not addr or replica in self._sending:
                continue
            owed = self.ledger.take(replica)
            if not owed:
                continue
            self._sending.add(replica)
            task = loop.create_task(self._deliver(replica, addr, owed))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _deliver(self, replica: str, addr: str, owed: dict[str, float]) -> None:
        try:
            await asyncio.to_thread(self._send, addr, owed)
            self.counters["peer_sends"] += 1
        except Exception as exc:  # the engine may be restarting: try again next round
            self.counters["peer_send_failures"] += 1
            self.ledger.give_back(replica, owed)
            log.debug("SAGA peer service to %s failed: %s", addr, exc)
        finally:
            self._sending.discard(replica)
