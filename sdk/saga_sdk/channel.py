"""`hint_channel`: the one way to open a gRPC channel to a SAGA hint service.

Every client connects through it (the SDK's `HintClient` and `HintReader`, the
cluster router's hint fan-out and its calls into engines, benchmarks, tests), so
each one gets:

* the API key on every call, as `authorization: Bearer <key>` (what the hint
  service checks, see `SAGA_API_KEY`), added by a client interceptor: no call
  site can forget it, streaming calls included;
* its own subchannel pool: gRPC otherwise shares connections per address across
  channels, so a service restarted on the same address would look unavailable to
  a new channel until the connect-failure backoff another channel recorded for
  its predecessor ran out.

    from saga_proto import hints_pb2 as pb, hints_pb2_grpc
    with hint_channel("127.0.0.1:50051", api_key) as channel:
        hints_pb2_grpc.WorkflowHintsStub(channel).GetStats(pb.GetStatsRequest(), timeout=2)
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

import grpc

__all__ = ["hint_channel"]


def hint_channel(endpoint: str, api_key: str | None = None, *,
                 options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """An insecure channel to `endpoint` (host:port) that presents `api_key`
    (None or empty: no key) on every call. `options` are added to the channel's
    own (its local subchannel pool)."""
    channel = grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1), *options])
    return grpc.intercept_channel(channel, _BearerToken(api_key)) if api_key else channel


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                           "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, api_key: str) -> None:
        self._entry = ("authorization", f"Bearer {api_key}")

    def _with_key(self, details: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(details.method, details.timeout, (*(details.metadata or ()), self._entry),
                            details.credentials, details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_key(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_key(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_key(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_key(client_call_details), request_iterator)
