"""The `WorkflowHints` gRPC service: validates hints and feeds them to a `HintSink`.

Nothing a client sends can crash the service or touch another session: each event
is validated on its own (`convert.from_wire`), refused events are counted and
reported back in the ack, and an exception inside the sink is logged, counted and
turned into a rejection of that one event.

With keys (`keys.KeyRing`: a keys file and/or the shared key) every call must
present one (else UNAUTHENTICATED, counted `auth_failures`), and the service
passes the key's `Caller` to the sink, whose session table applies the
ownership rule (`HintSink`). The service itself applies what is not about a
session: a key's hint rate (events over it are refused in the ack, counted
`rate_dropped`), and admin-only calls (`ReportPeerService`, `ListResident`: an
agent gets PERMISSION_DENIED, counted `denied_admin_only`). An agent's `GetStats`
shows its own tenant's outcomes only (`TenantOutcomes`: deadlines, turns, tokens
served). A sink's optional parts are its Protocols (`core.events`): a call the
sink does not implement answers UNIMPLEMENTED, a figure it lacks is left out. Without keys every call is
open, as it always was. With `scope_agent_ids` (the engine's HTTP port guarded by
the same keys, `saga serve --api-keys`) an agent's session ids are its tenant's
scoped ids (`session_id_of`), the ids its requests reach the engine under.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent import futures
from dataclasses import replace
from typing import Callable, Iterator

import grpc

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc

from ..core.events import (
    AccessDenied,
    Caller,
    EngineStatsSink,
    HintRejected,
    HintSink,
    KvReleaseSink,
    KvResidencySink,
    PeerServiceSink,
    SessionStart,
    TenantOutcomesSink,
)
from ..core.scopes import scoped
from .access import Authenticator, Credentials
from .convert import (
    InvalidHint,
    Limits,
    engine_stats_to_wire,
    from_wire,
    session_list,
    snapshot_to_wire,
    tenant_outcomes_to_wire,
)
from .keys import KeyRing

__all__ = ["HintServer", "WorkflowHintsService", "credentials_of", "reject_over_rate"]

log = logging.getLogger("saga.rpc")

_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_MAX_TRACKED_CLIENTS = 10_000
_MAX_PEER_TENANTS = 4096
_MAX_LISTED = 10_000  # sessions in one list reply (and no more bytes than `session_list` lets in)
_DEFAULT_RESIDENT = 4096


class WorkflowHintsService(hints_pb2_grpc.WorkflowHintsServicer):
    """`clock` must be the sink's clock: events are stamped with it on arrival.
    `auth` (None: no keys, every call open) resolves each call's key."""

    def __init__(self, sink: HintSink, clock: Callable[[], float] = time.monotonic,
                 auth: Authenticator | None = None, scope_agent_ids: bool = False) -> None:
        self.sink = sink
        self.clock = clock
        self.auth = auth
        self.scope_agent_ids = scope_agent_ids
        self._lock = threading.Lock()
        self._last_sequence: OrderedDict[str, int] = OrderedDict()
        self.counters = dict.fromkeys(
            ("batches", "duplicate_batches", "events_received", "events_accepted", "events_invalid",
             "events_refused", "events_denied", "rate_dropped", "sink_errors", "auth_failures",
             "denied_admin_only", "peer_reports", "peer_reports_invalid", "releases"), 0)

    # -- ingestion ------------------------------------------------------------------

    def ingest(self, batch: "pb.HintBatch", credentials: Credentials | None = None) -> "pb.HintAck":
        """Apply one batch for `credentials` (None: no keys); the same (client_id,
        sequence) is applied at most once."""
        ack = pb.HintAck(sequence=batch.sequence)
        if len(batch.events) > Limits.max_events_per_batch:
            self.count("events_invalid", len(batch.events))
            ack.rejected = len(batch.events)
            ack.rejections.add(index=0, reason=f"batch larger than {Limits.max_events_per_batch} events")
            return ack
        if self._seen_before(batch):
            ack.duplicate = True
            return ack
        caller = None if credentials is None else credentials.caller
        allowed = len(batch.events) if credentials is None else self.auth.allow(credentials, len(batch.events))
        accepted = invalid = refused = denied = errors = 0
        for index, wire_event in enumerate(batch.events[:allowed]):
            try:
                event = from_wire(wire_event, self.clock())
                if self.scope_agent_ids and caller is not None and not caller.is_admin:
                    event = replace(event, session_id=self.session_id_of(event.session_id, caller))
                    if isinstance(event, SessionStart) and event.parent_id:
                        event = replace(event, parent_id=self.session_id_of(event.parent_id, caller))
                self.sink.accept(event, caller=caller)
                accepted += 1
                continue
            except InvalidHint as exc:
                invalid += 1
                reason = f"invalid: {exc}"
            except AccessDenied as exc:
                denied += 1
                reason = f"denied: {exc}"
            except HintRejected as exc:
                refused += 1
                reason = f"refused: {exc}"
            except Exception as exc:  # a sink bug must not take the service down
                errors += 1
                reason = "internal error"
                log.exception("hint sink failed on %s", type(exc).__name__)
            _reject(ack, index, reason)
        dropped = len(batch.events) - allowed
        reject_over_rate(ack, allowed, len(batch.events))
        ack.accepted, ack.rejected = accepted, invalid + refused + denied + errors + dropped
        with self._lock:
            c = self.counters
            c["batches"] += 1
            c["events_received"] += len(batch.events)
            c["events_accepted"] += accepted
            c["events_invalid"] += invalid
            c["events_refused"] += refused
            c["events_denied"] += denied
            c["rate_dropped"] += dropped
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

    def session_id_of(self, session_id: str, caller: Caller | None) -> str:
        """The id the sink knows `caller`'s `session_id` by: with `scope_agent_ids`
        an agent's id is `scopes.scoped(tenant, id.strip())`, exactly what the
        engine's HTTP port makes of the same id in a request (`proxy.engine_port`),
        so an agent's hints and its requests meet in one session, and an id in
        another tenant's scope lands in the caller's own instead. A blank id names no
        request's session (the port ignores it) and stays as it is, the caller's."""
        if not self.scope_agent_ids or caller is None or caller.is_admin or not session_id.strip():
            return session_id
        return scoped(caller.tenant, session_id.strip())

    def credentials(self, context) -> Credentials | None:
        return credentials_of(self, context)

    def caller(self, context) -> Caller | None:
        found = self.credentials(context)
        return None if found is None else found.caller

    def _admin_only(self, context, what: str) -> None:
        caller = self.caller(context)
        if caller is not None and not caller.is_admin:
            self.count("denied_admin_only")
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{what} needs an admin key")

    # -- RPCs -----------------------------------------------------------------------

    def SendHints(self, request, context):
        return self.ingest(request, self.credentials(context))

    def StreamHints(self, request_iterator, context) -> Iterator["pb.HintAck"]:
        credentials = self.credentials(context)
        for batch in request_iterator:
            yield self.ingest(batch, credentials)

    def GetSession(self, request, context):
        try:
            caller = self.caller(context)
            snap = self.sink.session(self.session_id_of(request.session_id, caller), caller=caller)
        except AccessDenied as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        if snap is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown session {request.session_id!r}")
        return snapshot_to_wire(snap, self.clock())

    def ListSessions(self, request, context):
        caller = self.caller(context)
        now = self.clock()
        limit = min(request.limit or 100, _MAX_LISTED)
        return session_list((snapshot_to_wire(s, now) for s in self.sink.sessions(limit, caller=caller)), limit)

    def GetStats(self, request, context):
        caller = self.caller(context)
        stats = pb.ServerStats()
        with self._lock:
            for key, value in self.counters.items():
                stats.stats[f"hints_{key}"] = float(value)
        for key, value in self.sink.stats().items():
            stats.stats[key] = float(value)
        if isinstance(self.sink, EngineStatsSink):
            figures = self.sink.engine_stats()
            if figures is not None:
                stats.engine.CopyFrom(engine_stats_to_wire(figures))
        if isinstance(self.sink, TenantOutcomesSink):
            for tenant, outcomes in self.sink.tenant_outcomes().items():
                if caller is None or caller.is_admin or tenant == caller.tenant:
                    stats.served_tokens_by_tenant[tenant] = float(outcomes.served_tokens)
                    stats.tenant_outcomes[tenant].CopyFrom(tenant_outcomes_to_wire(outcomes))
        return stats

    def ReportPeerService(self, request, context):
        self._admin_only(context, "ReportPeerService")
        if not isinstance(self.sink, PeerServiceSink):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this hint service does no fair share")
        if len(request.tenant_tokens) > _MAX_PEER_TENANTS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"more than {_MAX_PEER_TENANTS} tenants")
        try:
            n = self.sink.record_peer_service(dict(request.tenant_tokens))
        except ValueError as exc:
            self.count("peer_reports_invalid")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.count("peer_reports")
        return pb.PeerServiceAck(tenants=n)


    def ListResident(self, request, context):
        self._admin_only(context, "ListResident")
        if not isinstance(self.sink, KvResidencySink):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this hint service holds no KV")
        limit = min(request.limit or _DEFAULT_RESIDENT, _MAX_LISTED)
        return pb.ResidentSessions(sessions=[pb.ResidentSession(session_id=r.session_id, in_tool=r.in_tool,
                                                                kv_tokens=max(int(r.kv_tokens), 0))
                                             for r in self.sink.resident_sessions(limit)])

    def ReleaseSession(self, request, context):
        if not isinstance(self.sink, KvReleaseSink):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this hint service holds no KV")
        sid = request.session_id
        if not sid or len(sid) > Limits.max_id_chars:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"session_id must be 1..{Limits.max_id_chars} characters")
        try:
            caller = self.caller(context)
            queued = bool(self.sink.release_session(self.session_id_of(sid, caller), caller=caller))
        except AccessDenied as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        self.count("releases")
        return pb.ReleaseSessionAck(queued=queued)


_NO_KEY = "missing or wrong SAGA API key"


def credentials_of(service, context) -> Credentials | None:
    """The credentials of a call to `service` (one with `auth` and `count`; None:
    no keys). A key unknown by now (the keys were reloaded since the interceptor
    passed it) ends the call, counted as `auth_failures`."""
    if service.auth is None:
        return None
    found = service.auth.resolve(context.invocation_metadata())
    if found is None:
        service.count("auth_failures")
        context.abort(grpc.StatusCode.UNAUTHENTICATED, _NO_KEY)
    return found


def _reject(ack: "pb.HintAck", index: int, reason: str) -> None:
    if len(ack.rejections) < 32:  # enough to debug, bounded
        ack.rejections.add(index=index, reason=reason)


def reject_over_rate(ack: "pb.HintAck", first: int, end: int) -> None:
    """Report events `first..end-1` of a batch as dropped by the key's hint rate."""
    for index in range(first, min(end, first + 32)):
        _reject(ack, index, "refused: over this key's hint rate")


class _ApiKeyInterceptor(grpc.ServerInterceptor):
    """Refuses calls that present no key the service's `auth` knows (as
    `authorization: Bearer <key>` or `x-saga-api-key`), counted as the service's
    `auth_failures`."""

    def __init__(self, auth: Authenticator, service) -> None:
        self._auth = auth
        self._service = service

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, _NO_KEY)

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        if self._auth.resolve(handler_call_details.invocation_metadata) is not None:
            return continuation(handler_call_details)
        self._service.count("auth_failures")
        return self._deny_stream if handler_call_details.method.endswith("StreamHints") else self._deny_unary


class HintServer:
    """A running hint service: `HintServer(sink, "127.0.0.1:50051").start()`.

    Port 0 picks a free port (see `.port` after `start()`). `keys` (a `KeyRing`)
    or `api_key` (the single shared key, admin) must be presented by every client;
    neither: no auth. `.keys` is the ring (None: no auth), for reloads and for
    the engine's per-tenant limits. `close()` stops it; `with HintServer(...) as
    server:` starts it (unless started) and closes it. `for_service` serves
    another `WorkflowHints` servicer (the cluster fan-out) with its own `auth`.
    """

    def __init__(self, sink: HintSink, address: str = "127.0.0.1:50051", *, api_key: str | None = None,
                 keys: KeyRing | None = None, clock: Callable[[], float] = time.monotonic,
                 max_workers: int = 8, scope_agent_ids: bool = False) -> None:
        if keys is None and api_key:
            keys = KeyRing(shared_key=api_key)
        auth = None if keys is None else Authenticator(keys, clock)
        self._serve(WorkflowHintsService(sink, clock, auth, scope_agent_ids), address, max_workers)

    @classmethod
    def for_service(cls, service, address: str, *, max_workers: int = 8) -> "HintServer":
        """`service`: a `WorkflowHintsServicer` with an `auth` (an `Authenticator`,
        or None: no keys) and a `count(counter)` method (refused calls are counted
        as `auth_failures`)."""
        server = cls.__new__(cls)
        server._serve(service, address, max_workers)
        return server

    def _serve(self, service, address: str, max_workers: int) -> None:
        self.service = service
        self.address = address
        self.port: int | None = None
        auth = service.auth
        self.keys = None if auth is None else auth.keys
        interceptors = [_ApiKeyInterceptor(auth, self.service)] if auth is not None else []
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
