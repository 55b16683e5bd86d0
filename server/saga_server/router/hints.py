"""One hint endpoint for a cluster: a gRPC service that forwards to every engine.

Agents send hints to one address (the `saga router` process). Each batch is
forwarded unchanged (`SendHints`) to the hint service of every replica's engine:
broadcast, not lookup, because the session's holder can change (stealing,
failover) between a hint and the request it describes, and a moved session's
new engine then already knows its workflow history. Hints are tiny and replicas
few, so the cost is N small RPCs per batch, sent in parallel. Engines that never
served a session do not report it as resident (`ListResident`, which the fan-out
itself does not answer: residency is per engine).

Reads are merged: `GetSession` answers from the engine that holds the session's
KV (`kv_resident`, then the largest `context_tokens`), `ListSessions` merges by id
the same way, and `GetStats` sums the engines' figures (`stats`, `engine`) and their
per-tenant service, keeps each engine's own `engine` figures by endpoint
(`engine_by_replica`) and adds the fan-out's own counters.

Replica endpoints are discovered through `discover()` (Ray's internal KV in
`cli.py`: each replica registers its hint address there, which works across
hosts); an endpoint that stops answering is skipped until it answers again.
An unreachable cluster answers UNAVAILABLE: the SDK client drops or retries,
and the agent never waits on it.

Keys (`keys`, a `KeyRing`: `saga router --api-keys FILE`, or the shared
`SAGA_API_KEY`): the fan-out authenticates callers as an engine's hint service
does and applies each key's hint rate here (events over it are dropped before
forwarding, so every engine sees the same events). It forwards with the ring's
admin key, adding the caller's tenant (`rpc.on_behalf_of`) for an agent's calls:
each engine then applies the ownership rule and the tenant's limits as if the
agent had called it, and answers reads with that tenant's sessions only.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from typing import Callable, Mapping, Sequence

import grpc
from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk.channel import hint_channel

from saga_server.rpc import Authenticator, HintServer, KeyRing, on_behalf_of
from saga_server.rpc.convert import session_list
from saga_server.rpc.service import credentials_of, reject_over_rate

log = logging.getLogger("saga.router")

__all__ = ["FanOutHints", "start_fanout", "HINT_KV_PREFIX"]

HINT_KV_PREFIX = "saga:hint:"  # Ray internal KV key prefix: one entry per replica


_PER_REPLICA = ("requests_arrived",)  # besides `engine_by_replica`


def _holder_rank(state: "pb.SessionState") -> tuple[float, float]:
    """Which engine's view of a session to show: the one holding its KV, then the
    one that saw the longest context."""
    return state.metrics.get("kv_resident", 0.0), state.metrics.get("context_tokens", 0.0)


class FanOutHints(hints_pb2_grpc.WorkflowHintsServicer):
    def __init__(self, discover: Callable[[], Sequence[str]], *, timeout: float = 2.0,
                 refresh_s: float = 2.0, extra_stats: Callable[[], Mapping[str, float]] = dict,
                 keys: KeyRing | None = None) -> None:
        self._discover = discover
        self._extra_stats = extra_stats
        self.auth = None if keys is None else Authenticator(keys)
        self._timeout = timeout
        self._refresh_s = refresh_s
        self._endpoints: list[str] = []
        self._refreshed_at = -1e18
        self._stubs: dict[tuple[str, str | None], hints_pb2_grpc.WorkflowHintsStub] = {}
        self._lock = threading.Lock()
        self._pool = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="saga-fanout")
        self.counters = dict.fromkeys(("batches", "forwarded", "forward_errors", "no_replica", "auth_failures",
                                       "rate_dropped"), 0)

    def count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self.counters[counter] += n

    def endpoints(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            if now - self._refreshed_at >= self._refresh_s:
                try:
                    self._endpoints = sorted(set(self._discover()))
                except Exception:
                    log.exception("hint endpoint discovery failed; keeping the last list")
                self._refreshed_at = now
            return list(self._endpoints)

    def _stub(self, endpoint: str) -> hints_pb2_grpc.WorkflowHintsStub:
        key = None if self.auth is None else self.auth.keys.admin_key()  # may change on a reload
        with self._lock:
            stub = self._stubs.get((endpoint, key))
            if stub is None:
                stub = self._stubs[(endpoint, key)] = hints_pb2_grpc.WorkflowHintsStub(hint_channel(endpoint, key))
            return stub

    def _on_behalf(self, context) -> tuple[tuple[str, str], ...]:
        """Metadata that makes an engine treat the forwarded call as the caller's."""
        found = credentials_of(self, context)
        return () if found is None or found.caller.is_admin else on_behalf_of(found.caller.tenant)

    def _each(self, call: Callable[[hints_pb2_grpc.WorkflowHintsStub], object]) -> list[tuple[str, object]]:
        """(endpoint, reply) for every endpoint that answered. An engine's
        PERMISSION_DENIED is raised: it is the answer, not a failure."""
        eps = self.endpoints()
        futs = {ep: self._pool.submit(call, self._stub(ep)) for ep in eps}
        out, denied = [], None
        for ep, fut in futs.items():
            try:
                out.append((ep, fut.result()))
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    denied = exc
                elif exc.code() != grpc.StatusCode.NOT_FOUND:
                    self.count("forward_errors")
        if denied is not None:
            raise denied
        return out

    # -- RPCs -----------------------------------------------------------------------------

    def SendHints(self, request, context):
        self.count("batches")
        found = credentials_of(self, context)
        n = len(request.events)
        allowed = n if found is None else self.auth.allow(found, n)
        if allowed == 0 and n:
            ack = pb.HintAck(sequence=request.sequence)
        else:
            if allowed < n:
                request = pb.HintBatch(client_id=request.client_id, sequence=request.sequence,
                                       events=request.events[:allowed])
            metadata = self._on_behalf(context)
            replies = self._each(lambda s: s.SendHints(request, timeout=self._timeout, metadata=metadata))
            if not replies:
                self.count("no_replica")
                context.abort(grpc.StatusCode.UNAVAILABLE, "no SAGA engine replica reachable")
            self.count("forwarded", len(replies))
            ack = replies[0][1]  # every engine validates the same way: the first answer stands for all
        if allowed < n:
            self.count("rate_dropped", n - allowed)
            reject_over_rate(ack, allowed, n)
            ack.rejected += n - allowed
        return ack

    def StreamHints(self, request_iterator, context):
        for batch in request_iterator:
            yield self.SendHints(batch, context)

    def GetSession(self, request, context):
        metadata = self._on_behalf(context)
        try:
            found = [r for _, r in self._each(lambda s: s.GetSession(request, timeout=self._timeout,
                                                                        metadata=metadata))]
        except grpc.RpcError as exc:  # another tenant's: the engines' own answer
            context.abort(exc.code(), exc.details())
        if not found:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown session {request.session_id!r}")
        return max(found, key=_holder_rank)

    def ListSessions(self, request, context):
        merged: dict[str, pb.SessionState] = {}
        metadata = self._on_behalf(context)
        for _, lst in self._each(lambda s: s.ListSessions(request, timeout=self._timeout, metadata=metadata)):
            for st in lst.sessions:
                cur = merged.get(st.session_id)
                if cur is None or _holder_rank(st) > _holder_rank(cur):
                    merged[st.session_id] = st
        return session_list(merged.values(), request.limit or 100)

    def engine_stats(self, metadata: tuple[tuple[str, str], ...] = ()) -> dict[str, "pb.ServerStats"]:
        """endpoint -> that engine's own GetStats reply, for engines that answered
        (`metadata`: on whose behalf; none: the router's own view)."""
        return dict(self._each(lambda s: s.GetStats(pb.GetStatsRequest(), timeout=self._timeout,
                                                    metadata=metadata)))

    def GetStats(self, request, context):
        out = pb.ServerStats()
        replies = self.engine_stats(self._on_behalf(context))
        for ep, reply in replies.items():
            _add(out.stats, reply.stats)
            _add(out.served_tokens_by_tenant, reply.served_tokens_by_tenant)
            for tenant, outcomes in reply.tenant_outcomes.items():
                _add_message(out.tenant_outcomes[tenant], outcomes)
            if reply.HasField("engine"):
                out.engine.SetInParent()
                _add_message(out.engine, reply.engine)
                out.engine_by_replica[ep].CopyFrom(reply.engine)
            for k in _PER_REPLICA:  # per-replica view for `saga status`
                if k in reply.stats:
                    out.stats[f"{k}{{{ep}}}"] = reply.stats[k]
        try:
            for k, v in self._extra_stats().items():
                out.stats[k] = float(v)
        except Exception:
            log.exception("router stats unavailable")
        with self._lock:
            for k, v in self.counters.items():
                out.stats[f"fanout_{k}"] = float(v)
        out.stats["replicas_reachable"] = float(len(replies))
        return out


def _add(into, values: Mapping[str, float]) -> None:
    for k, v in values.items():
        into[k] = into[k] + v if k in into else v


def _add_message(into, more) -> None:
    """Sum the message `more` into `into`: every figure of an engine's (`EngineStats`,
    `TenantOutcomes`) is a count or a total, so the cluster's is the sum (maps by
    key, messages field by field, a message reported even where all of it is 0)."""
    for field, value in more.ListFields():
        if field.message_type is None:
            setattr(into, field.name, getattr(into, field.name) + value)
        elif field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is None:
                _add(getattr(into, field.name), value)
            else:
                for key, sub in value.items():
                    _add_message(getattr(into, field.name)[key], sub)
        else:
            sub = getattr(into, field.name)
            sub.SetInParent()
            _add_message(sub, value)


def start_fanout(discover: Callable[[], Sequence[str]], address: str,
                 extra_stats: Callable[[], Mapping[str, float]] = dict, *,
                 keys: KeyRing | None = None, api_key: str | None = None) -> tuple[HintServer, FanOutHints, int]:
    """Serve a `FanOutHints` on `address` (with `keys`, or just the shared
    `api_key`: required from callers, the admin key presented to engines);
    returns (server, servicer, port)."""
    if keys is None and api_key:
        keys = KeyRing(shared_key=api_key)
    servicer = FanOutHints(discover, extra_stats=extra_stats, keys=keys)
    server = HintServer.for_service(servicer, address).start()
    return server, servicer, server.port
