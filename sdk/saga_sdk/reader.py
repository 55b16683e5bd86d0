"""Read what a SAGA hint service knows: sessions and server stats.

Unlike `HintClient`, reads are synchronous and raise `SagaUnavailable` when the
service cannot answer: they are for dashboards, tests and `saga status`, never for
an agent's hot path.
"""

from __future__ import annotations

from typing import Mapping

import grpc

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc

from .channel import hint_channel
from .config import SagaConfig

__all__ = ["HintReader", "SagaUnavailable", "UnknownSession"]


class SagaUnavailable(RuntimeError):
    """The hint service did not answer (down, wrong endpoint, wrong API key)."""


class UnknownSession(KeyError):
    pass


class HintReader:
    def __init__(self, endpoint: str | None = None, *, api_key: str | None = None, timeout: float = 2.0) -> None:
        config = SagaConfig.from_env()
        self.endpoint = endpoint or config.endpoint
        self._timeout = timeout
        self._channel = hint_channel(self.endpoint, api_key if api_key is not None else config.api_key)
        self._stub = hints_pb2_grpc.WorkflowHintsStub(self._channel)

    def session(self, session_id: str) -> "pb.SessionState":
        try:
            return self._call(self._stub.GetSession, pb.GetSessionRequest(session_id=session_id))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise UnknownSession(session_id) from None
            raise SagaUnavailable(f"{self.endpoint}: {exc.code().name} {exc.details()}") from None

    def sessions(self, limit: int = 100) -> list["pb.SessionState"]:
        return list(self._checked(self._stub.ListSessions, pb.ListSessionsRequest(limit=limit)).sessions)

    def resident(self, limit: int = 0) -> list["pb.ResidentSession"]:
        """Sessions whose KV the engine holds (ids, and whether each is in a tool
        call; `limit` 0: the server's default). An engine's hint service only: a
        service that holds no KV raises `SagaUnavailable` (UNIMPLEMENTED)."""
        return list(self._checked(self._stub.ListResident, pb.ListResidentRequest(limit=limit)).sessions)

    def stats(self) -> Mapping[str, float]:
        """The service's figures (counters, gauges), by name."""
        return dict(self.server_stats().stats)

    def server_stats(self) -> "pb.ServerStats":
        """The whole `GetStats` reply: the figures and the tokens served per tenant."""
        return self._checked(self._stub.GetStats, pb.GetStatsRequest())

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "HintReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request):
        return method(request, timeout=self._timeout)

    def _checked(self, method, request):
        try:
            return self._call(method, request)
        except grpc.RpcError as exc:
            raise SagaUnavailable(f"{self.endpoint}: {exc.code().name} {exc.details()}") from None
