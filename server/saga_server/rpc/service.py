"""The `WorkflowHints` gRPC service: validates hints and feeds them to a `HintSink`.

Nothing a client sends can crash the service or touch another session: each event
is validated on its own (`convert.from_wire`), refused events are counted and
reported back in the ack, and an exception inside the sink is logged, counted and
turned into a rejection of that one event.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections import OrderedDict
from concurrent import futures
from typing import Callable, Iterator

import grpc

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc

from ..core.events import HintRejected, HintSink
from .convert import InvalidHint, Limits, from_wire, snapshot_to_wire

__all__ = ["HintServer", "WorkflowHintsService"]

log = logging.getLogger("saga.rpc")

_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_MAX_TRACKED_CLIENTS = 10_000
_MAX_PEER_TENANTS = 4096
_MAX_LISTED = 10_000  # sessions in one list reply
_DEFAULT_RESIDENT = 4096


class WorkflowHintsService(hints_pb2_grpc.WorkflowHintsServicer):
    """`clock` must be the sink's clock: events are stamped with it on arrival."""

    def __init__(self, sink: HintSink, clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.clock = clock
        self._lock = threading.Lock()
        self._last_sequence: OrderedDict[str, int] = OrderedDict()
        self.counters = dict.fromkeys(
            ("batches", "duplicate_batches", "events_received", "events_accepted", "events_invalid",
             "events_refused", "sink_errors", "auth_failures", "peer_reports", "peer_reports_invalid",
             "releases"), 0)

    # -- ingestion ------------------------------------------------------------------

    def ingest(self, batch: "pb.HintBatch") -> "pb.HintAck":
        """Apply one batch; the same (client_id, sequence) is applied at most once."""
        ack = pb.HintAck(sequence=batch.sequence)
        if len(batch.events) > Limits.max_events_per_batch:
            self.count("events_invalid", len(batch.events))
            ack.rejected = len(batch.events)
            ack.rejections.add(index=0, reason=f"batch larger than {Limits.max_events_per_batch} events")
            return ack
        if self._seen_before(batch):
            ack.duplicate = True
            return ack
        accepted = invalid = refused = errors = 0
        for index, wire_event in enumerate(batch.events):
            try:
                self.sink.accept(from_wire(wire_event, self.clock()))
                accepted += 1
                continue
            except InvalidHint as exc:
                invalid += 1
                reason = f"invalid: {exc}"
            except HintRejected as exc:
                refused += 1
                reason = f"refused: {exc}"
            except Exception as exc:  # a sink bug must not take the service down
                errors += 1
                reason = "internal error"
                log.exception("hint sink failed on %s", type(exc).__name__)
            if len(ack.rejections) < 32:  # enough to debug, bounded
                ack.rejections.add(index=index, reason=reason)
        ack.accepted, ack.rejected = accepted, invalid + refused + errors
        with self._lock:
            c = self.counters
            c["batches"] += 1
            c["events_received"] += len(batch.events)
            c["events_accepted"] += accepted
            c["events_invalid"] += invalid
            c["events_refused"] += refused
            c["sink_errors"] += errors
        return ack

    def count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self.counters[counter] += n

    def _seen_before(self, batch: "pb.HintBatch") -> bool:
        if not batch.client_id or batch.sequence == 0:
            return False
        with self._lock:
            last = self._last_sequence.get(batch.client_id, 0)
            if batch.sequence <= last:
                self.counters["duplicate_batches"] += 1
                return True
            self._last_sequence[batch.client_id] = batch.sequence
            self._last_sequence.move_to_end(batch.client_id)
            while len(self._last_sequence) > _MAX_TRACKED_CLIENTS:
                self._last_sequence.popitem(last=False)
            return False

    # -- RPCs -----------------------------------------------------------------------

    def SendHints(self, request, context):
        return self.ingest(request)

    def StreamHints(self, request_iterator, context) -> Iterator["pb.HintAck"]:
        for batch in request_iterator:
            yield self.ingest(batch)

    def GetSession(self, request, context):
        snap = self.sink.session(request.session_id)
        if snap is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown session {request.session_id!r}")
        return snapshot_to_wire(snap, self.clock())

    def ListSessions(self, request, context):
        now = self.clock()
        limit = min(request.limit or 100, _MAX_LISTED)
        return pb.SessionList(sessions=[snapshot_to_wire(s, now) for s in self.sink.sessions(limit)])

    def GetStats(self, request, context):
        stats = pb.ServerStats()
        with self._lock:
            for key, value in self.counters.items():
                stats.stats[f"hints_{key}"] = float(value)
        for key, value in self.sink.stats().items():
            stats.stats[key] = float(value)
        served = getattr(self.sink, "served_by_tenant", None)  # PeerServiceSink
        if served is not None:
            for tenant, tokens in served().items():
                stats.served_tokens_by_tenant[tenant] = float(tokens)
        return stats


    def ReportPeerService(self, request, context):
        apply = getattr(self.sink, "record_peer_service", None)  # PeerServiceSink
        if apply is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this hint service does no fair share")
        if len(request.tenant_tokens) > _MAX_PEER_TENANTS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"more than {_MAX_PEER_TENANTS} tenants")
        try:
            n = apply(dict(request.tenant_tokens))
        except ValueError as exc:
            self.count("peer_reports_invalid")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.count("peer_reports")
        return pb.PeerServiceAck(tenants=n)


    def ListResident(self, request, context):
        resident = getattr(self.sink, "resident_sessions", None)  # KvResidencySink
        if resident is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this hint service holds no KV")
        limit = min(request.limit or _DEFAULT_RESIDENT, _MAX_LISTED)
        return pb.ResidentSessions(sessions=[pb.ResidentSession(session_id=r.session_id, in_tool=r.in_tool)
                                             for r in resident(limit)])

    def ReleaseSession(self, request, context):
        release = getattr(self.sink, "release_session", None)  # KvReleaseSink
        if release is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this hint service holds no KV")
        sid = request.session_id
        if not sid or len(sid) > Limits.max_id_chars:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"session_id must be 1..{Limits.max_id_chars} characters")
        queued = bool(release(sid))
        self.count("releases")
        return pb.ReleaseSessionAck(queued=queued)


class _ApiKeyInterceptor(grpc.ServerInterceptor):
    """Refuses calls without `authorization: Bearer <key>` (or `x-saga-api-key`),
    counted as the service's `auth_failures`."""

    def __init__(self, api_key: str, service) -> None:
        self._key = api_key.encode()
        self._service = service

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong SAGA API key")

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        metadata = dict(handler_call_details.invocation_metadata or ())
        offered = metadata.get("x-saga-api-key") or metadata.get("authorization", "").removeprefix("Bearer ")
        if hmac.compare_digest(offered.encode(), self._key):
            return continuation(handler_call_details)
        self._service.count("auth_failures")
        return self._deny_stream if handler_call_details.method.endswith("StreamHints") else self._deny_unary


class HintServer:
    """A running hint service: `HintServer(sink, "127.0.0.1:50051").start()`.

    Port 0 picks a free port (see `.port` after `start()`). `api_key` (or None for
    no auth) must be presented by every client. `close()` stops it; `with
    HintServer(...) as server:` starts it (unless started) and closes it.
    `for_service` serves another `WorkflowHints` servicer (the cluster fan-out)
    with the same auth and limits.
    """

    def __init__(self, sink: HintSink, address: str = "127.0.0.1:50051", *, api_key: str | None = None,
                 clock: Callable[[], float] = time.monotonic, max_workers: int = 8) -> None:
        self._serve(WorkflowHintsService(sink, clock), address, api_key, max_workers)

    @classmethod
    def for_service(cls, service, address: str, *, api_key: str | None = None,
                    max_workers: int = 8) -> "HintServer":
        """`service`: a `WorkflowHintsServicer` with a `count(counter)` method
        (refused calls are counted as `auth_failures`)."""
        server = cls.__new__(cls)
        server._serve(service, address, api_key, max_workers)
        return server

    def _serve(self, service, address: str, api_key: str | None, max_workers: int) -> None:
        self.service = service
        self.address = address
        self.port: int | None = None
        interceptors = [_ApiKeyInterceptor(api_key, self.service)] if api_key else []
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="saga-hints"),
            interceptors=interceptors,
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                     ("grpc.so_reuseport", 0)],
        )
        hints_pb2_grpc.add_WorkflowHintsServicer_to_server(self.service, self._server)

    def start(self) -> "HintServer":
        port = self._server.add_insecure_port(self.address)
        if port == 0:
            raise OSError(f"could not listen on {self.address}")
        self.port = port
        self._server.start()
        host = self.address.rpartition(":")[0]
        log.info("SAGA hint service listening on %s:%d", host, port)
        return self

    @property
    def endpoint(self) -> str:
        return f"{self.address.rpartition(':')[0]}:{self.port}"

    def close(self, grace: float | None = 1.0) -> None:
        """Stop serving: calls in flight get `grace` seconds (None: cancelled now)."""
        self._server.stop(grace).wait()

    def stop(self, grace: float | None = 1.0) -> None:
        """Alias of `close`: the vLLM scheduler plugin's shutdown calls it."""
        self.close(grace)

    def wait(self) -> None:
        self._server.wait_for_termination()

    def __enter__(self) -> "HintServer":
        return self if self.port is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.close()
