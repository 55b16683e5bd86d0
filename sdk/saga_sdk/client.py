"""`HintClient`: sends workflow hints to SAGA without ever slowing the agent down.

The contract, for every public method except `flush`/`close`:
  * it never blocks on the network and never raises: an event is appended to a
    bounded in-memory queue (or dropped and counted when the queue is full, hints
    are disabled, or the session is sampled out);
  * a daemon thread drains the queue in batches (waiting `flush_interval_s` to
    fill one), sends each batch with a deadline, and on failure reconnects with
    jittered exponential backoff, resending the same batch (the server applies a
    batch once per `(client_id, sequence)`);
  * events older than `max_event_age_s` are dropped, not sent: stale hints would
    mislead the scheduler more than missing ones.
`flush(timeout)` waits until everything queued before the call has been sent or
dropped; `close()` (or leaving `with HintClient(...) as hints:`) flushes briefly
and stops the thread (`shutdown()` is the same, for existing callers). An exit hook flushes
with `exit_flush_s` as its bound, and a forked child starts with an empty queue
and its own thread and channel (the parent's are not usable after fork).
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
import time
import uuid
import weakref
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Iterable

from .config import SagaConfig
from .context import SessionContext, reset_current_session, set_current_session, new_session_id
from .logs import LogOnce
from .outcomes import session_outcome_of

__all__ = ["HintClient", "ClientStats"]

log = logging.getLogger("saga_sdk")

# The outcomes a caller names; each is the wire enum's value of that name
# (`"ok"` is `TOOL_OUTCOME_OK`), any other name the unspecified one.
_TOOL_OUTCOMES = ("ok", "error", "cancelled")
_SESSION_OUTCOMES = ("completed", "failed", "cancelled")
# gRPC codes after which resending the same batch cannot succeed.
_PERMANENT = {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
              "UNIMPLEMENTED", "FAILED_PRECONDITION"}


@dataclass(frozen=True, slots=True)
class ClientStats:
    queued: int            # events waiting now
    sent: int              # events the server acknowledged (accepted or rejected)
    rejected: int          # of those, events the server refused (see its logs / stats)
    dropped_full: int      # queue was full
    dropped_stale: int     # older than max_event_age_s when their turn came
    dropped_failed: int    # their batch failed permanently (bad auth, malformed...)
    batches: int
    send_errors: int
    reconnects: int


class _FlushMarker:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_clients: "weakref.WeakSet[HintClient]" = weakref.WeakSet()


class HintClient:
    """See the module docstring for the contract."""

    def __init__(self, config: SagaConfig | None = None, **overrides) -> None:
        self.config = config or SagaConfig.from_env(**overrides)
        if config is not None and overrides:
            raise TypeError("pass either config or keyword overrides, not both")
        self.client_id = uuid.uuid4().hex
        self._reset_state()
        _clients.add(self)

    # -- events ---------------------------------------------------------------------

    def session_start(self, session_id: str, *, tenant: str = "", workflow: str = "",
                      deadline_s: float | None = None,
                      nodes: Iterable[str | tuple[str, str]] = (),
                      edges: Iterable[tuple[str, str]] = (), parent_id: str = "",
                      turn_deadline_s: float | None = None) -> None:
        """Announce a session. `deadline_s`: seconds the whole task may take;
        `turn_deadline_s`: seconds each user turn may take, from the start or the
        user's reply (the end of a `category="human"` tool call) to the next hand-back
        or the end. `nodes` are names or (name, kind) pairs with kind "llm", "tool" or
        "end"; `edges` (src, dst) pairs: the declared structure; `parent_id`: the
        session that spawned this one (a subagent's parent)."""
        self._put("session_start", session_id, (tenant or self.config.tenant, workflow, deadline_s,
                                                tuple(nodes), tuple(edges), parent_id, turn_deadline_s))

    def llm_call_start(self, session_id: str, *, step: int = 0, node: str = "", request_id: str = "") -> None:
        self._put("llm_call_start", session_id, (step, node, request_id))

    def llm_call_end(self, session_id: str, *, step: int = 0, node: str = "", request_id: str = "",
                     prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        self._put("llm_call_end", session_id, (step, node, request_id, prompt_tokens, output_tokens))

    def tool_call_start(self, session_id: str, tool: str, *, call_id: str = "", category: str = "",
                        expected_duration_s: float | None = None) -> None:
        self._put("tool_call_start", session_id, (tool, call_id, category, expected_duration_s))

    def tool_call_end(self, session_id: str, tool: str = "", *, call_id: str = "", outcome: str = "ok") -> None:
        """`outcome`: "ok", "error" or "cancelled"."""
        self._put("tool_call_end", session_id, (tool, call_id, outcome))

    def session_end(self, session_id: str, *, outcome: str = "completed") -> None:
        """`outcome`: "completed", "failed" or "cancelled"."""
        self._put("session_end", session_id, (outcome,))

    def session(self, session_id: str | None = None, *, tenant: str = "", workflow: str = "",
                deadline_s: float | None = None, turn_deadline_s: float | None = None) -> "_SessionScope":
        """Context manager: start a session (deadlines: `session_start`), make it
        current, end it on exit (outcome "failed" or "cancelled" when the block
        raises: `outcomes`)."""
        return _SessionScope(self, session_id or new_session_id(), tenant or self.config.tenant,
                             workflow, deadline_s, turn_deadline_s)

    # -- lifecycle ------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every event queued before this call is sent or dropped.
        Returns False on timeout (e.g. the server is down)."""
        if not self.config.enabled:
            return True
        marker = _FlushMarker()
        self._queue.append(marker)
        self._ensure_sender()
        self._wake.set()
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush (bounded by `timeout`, default `exit_flush_s`) and stop. Idempotent;
        events emitted afterwards are dropped."""
        if self._closed:
            return
        bound = self.config.exit_flush_s if timeout is None else timeout
        self.flush(bound)
        self._closed = True
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(bound, 0.05))
        self._close_channel()

    def shutdown(self, timeout: float | None = None) -> None:
        """Alias of `close`, kept for applications written against earlier releases."""
        self.close(timeout)

    def __enter__(self) -> "HintClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> ClientStats:
        c = self._counts
        queued = sum(1 for item in list(self._queue) if not isinstance(item, _FlushMarker))
        return ClientStats(queued, c["sent"], c["rejected"], self._dropped_full, c["dropped_stale"],
                           c["dropped_failed"], c["batches"], c["send_errors"], c["reconnects"])

    # -- caller side: must stay in the microseconds ------------------------------------

    def _put(self, kind: str, session_id: str, payload: tuple) -> None:
        try:
            if not self._accepting:
                return
            if self._sample_out(session_id):
                return
            if len(self._queue) >= self.config.queue_size:
                with self._drop_lock:  # callers may be many threads; only the drop path locks
                    self._dropped_full += 1
                return
            self._queue.append((kind, session_id, time.time(), payload))
            if self._thread is None:
                self._ensure_sender()
            if len(self._queue) == 1:
                self._wake.set()
        except Exception:  # never let a hint reach the agent as an exception
            self._log_once("emit", "dropping a hint after an internal error", exc_info=True)

    def _sample_out(self, session_id: str) -> bool:
        rate = self.config.sample_rate
        if rate >= 1.0:
            return False
        return zlib.crc32(session_id.encode()) / 0xFFFFFFFF >= rate

    @property
    def _accepting(self) -> bool:
        return self.config.enabled and not self._closed

    # -- sender thread ----------------------------------------------------------------

    def _reset_state(self) -> None:
        """Fresh queue, counters, thread and channel (at construction and after fork)."""
        self._queue: deque = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._channel = None
        self._stub = None
        self._sequence = 0
        self._closed = False
        self._dropped_full = 0
        self._drop_lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("sent", "rejected", "dropped_stale", "dropped_failed", "batches", "send_errors", "reconnects"), 0)
        self._log_once = LogOnce(log)

    def _ensure_sender(self) -> None:
        with self._thread_lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="saga-hint-sender", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        backoff = _Backoff()
        pending = None  # (sequence, events, markers) being delivered
        while True:
            if pending is None:
                if not self._queue:
                    if self._stop.is_set():
                        return
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
                    continue
                if self.config.flush_interval_s and len(self._queue) < self.config.batch_size:
                    self._stop.wait(self.config.flush_interval_s)  # let a batch form
                pending = self._take_batch()
            sequence, events, markers = pending
            if not events or self._deliver(sequence, events):
                for m in markers:
                    m.done.set()
                pending = None
                backoff.reset()
            elif self._stop.is_set():
                return  # shutting down with the server unreachable: give up quietly
            else:
                self._stop.wait(backoff.next())
                pending = (sequence, self._drop_stale(events), markers)

    def _take_batch(self):
        events, markers = [], []
        while self._queue and len(events) < self.config.batch_size:
            item = self._queue.popleft()
            if isinstance(item, _FlushMarker):
                markers.append(item)
                break  # everything before the marker is in this batch
            events.append(item)
        self._sequence += 1
        return self._sequence, self._drop_stale(events), markers

    def _drop_stale(self, events: list) -> list:
        horizon = time.time() - self.config.max_event_age_s
        fresh = [e for e in events if e[2] >= horizon]
        self._counts["dropped_stale"] += len(events) - len(fresh)
        return fresh

    def _deliver(self, sequence: int, events: list) -> bool:
        """Send one batch. True when it is done with (acked, or failed for good)."""
        import grpc

        try:
            stub = self._connect()
            batch, carried = _encode_batch(self.client_id, sequence, events)
            if len(carried) < len(events):  # left out for good: a retry of the batch does not count them again
                self._counts["dropped_failed"] += len(events) - len(carried)
                self._log_once("encode", "dropped %d hint(s) the wire cannot carry (e.g. negative token counts)",
                               len(events) - len(carried))
                events[:] = carried
            ack = stub.SendHints(batch, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") and exc.code() else "UNKNOWN"
            if code in _PERMANENT:
                self._counts["dropped_failed"] += len(events)
                self._log_once(code, "hint batch refused (%s): %s", code, exc.details() if hasattr(exc, "details") else exc)
                return True
            self._counts["send_errors"] += 1
            self._log_once("unavailable", "hint service at %s unavailable (%s); retrying with backoff",
                           self.config.endpoint, code)
            self._close_channel()
            return False
        except Exception:
            self._counts["send_errors"] += 1
            self._counts["dropped_failed"] += len(events)
            self._log_once("encode", "could not send a hint batch", exc_info=True)
            return True
        self._counts["batches"] += 1
        self._counts["sent"] += len(events)
        self._counts["rejected"] += ack.rejected
        if ack.rejected:
            self._log_once("rejected", "hint service rejected %d event(s), e.g. %s", ack.rejected,
                           ack.rejections[0].reason if ack.rejections else "?")
        return True

    def _connect(self):
        if self._stub is None:
            from saga_proto import hints_pb2_grpc

            from .channel import hint_channel

            if self._channel is not None or self._counts["batches"] or self._counts["send_errors"]:
                self._counts["reconnects"] += 1
            self._channel = hint_channel(self.config.endpoint, self.config.api_key, options=[
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.enable_retries", 0),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
            ])
            self._stub = hints_pb2_grpc.WorkflowHintsStub(self._channel)
        return self._stub

    def _close_channel(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            try:
                channel.close()
            except Exception:
                pass

    def _after_fork_in_child(self) -> None:
        # A new identity too: the child's batch sequence restarts at 1, and the
        # server would take its batches for resends of the parent's.
        self.client_id = uuid.uuid4().hex
        self._reset_state()


class _SessionScope:
    def __init__(self, client: HintClient, session_id: str, tenant: str, workflow: str,
                 deadline_s: float | None, turn_deadline_s: float | None) -> None:
        self.client, self.context = client, SessionContext(session_id, tenant, workflow)
        self._deadline_s, self._turn_deadline_s = deadline_s, turn_deadline_s
        self._token = None

    def __enter__(self) -> SessionContext:
        ctx = self.context
        self.client.session_start(ctx.session_id, tenant=ctx.tenant, workflow=ctx.workflow,
                                  deadline_s=self._deadline_s, turn_deadline_s=self._turn_deadline_s)
        self._token = set_current_session(ctx)
        return ctx

    def __exit__(self, exc_type, exc, tb) -> None:
        reset_current_session(self._token)
        self.client.session_end(self.context.session_id, outcome=session_outcome_of(exc))


class _Backoff:
    """Full-jitter exponential backoff, 50 ms doubling to 5 s."""

    def __init__(self, base: float = 0.05, cap: float = 5.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0
        self._rng = random.Random()

    def next(self) -> float:
        self.attempt += 1
        return self._rng.uniform(0, min(self.cap, self.base * 2 ** self.attempt))

    def reset(self) -> None:
        self.attempt = 0


def _encode_batch(client_id: str, sequence: int, events: list):
    """The wire batch of `events`, and the events it carries: one with a value the
    wire cannot carry (e.g. negative tokens) is left out, not the whole batch."""
    from saga_proto import hints_pb2 as pb

    batch = pb.HintBatch(client_id=client_id, sequence=sequence)
    carried = []
    for event in events:
        kind, session_id, t, payload = event
        try:
            _encode_event(pb, batch.events.add(session_id=session_id, client_time=t), kind, payload)
            carried.append(event)
        except (ValueError, TypeError):
            del batch.events[-1]
    return batch, carried


def _encode_event(pb, ev, kind: str, payload) -> None:
    """Fill `ev` with one event; ValueError/TypeError for a value the wire cannot carry."""
    if kind == "session_start":
        tenant, workflow, deadline_s, nodes, edges, parent_id, turn_deadline_s = payload
        msg = ev.session_start
        msg.tenant, msg.workflow, msg.deadline_s = tenant, workflow, deadline_s or 0.0
        msg.turn_deadline_s = turn_deadline_s or 0.0
        msg.parent_session_id = parent_id
        for node in nodes:
            name, node_kind = (node, "llm") if isinstance(node, str) else node
            msg.structure.nodes.add(name=name, kind=node_kind)
        for src, dst in edges:
            msg.structure.edges.add(src=src, dst=dst)
        if not nodes and not edges:
            msg.ClearField("structure")
    elif kind == "llm_call_start":
        step, node, request_id = payload
        ev.llm_call_start.CopyFrom(pb.LlmCallStart(step=step, node=node, request_id=request_id))
    elif kind == "llm_call_end":
        step, node, request_id, prompt_tokens, output_tokens = payload
        ev.llm_call_end.CopyFrom(pb.LlmCallEnd(step=step, node=node, request_id=request_id,
                                               prompt_tokens=prompt_tokens, output_tokens=output_tokens))
    elif kind == "tool_call_start":
        tool, call_id, category, expected = payload
        ev.tool_call_start.CopyFrom(pb.ToolCallStart(tool=tool, call_id=call_id, category=category,
                                                     expected_duration_s=expected or 0.0))
    elif kind == "tool_call_end":
        tool, call_id, outcome = payload
        wire = _wire_enum(pb.ToolOutcome, "TOOL_OUTCOME", outcome, _TOOL_OUTCOMES)
        ev.tool_call_end.CopyFrom(pb.ToolCallEnd(tool=tool, call_id=call_id, outcome=wire))
    elif kind == "session_end":
        (outcome,) = payload
        ev.session_end.CopyFrom(pb.SessionEnd(
            outcome=_wire_enum(pb.SessionOutcome, "SESSION_OUTCOME", outcome, _SESSION_OUTCOMES)))


def _wire_enum(enum, prefix: str, name: str, known: tuple[str, ...]) -> int:
    """The generated `enum`'s value `<prefix>_<NAME>` for a `known` name, else `<prefix>_UNSPECIFIED`."""
    return enum.Value(f"{prefix}_{name.upper() if name in known else 'UNSPECIFIED'}")


def _shutdown_all_at_exit() -> None:
    for client in list(_clients):
        try:
            client.close()
        except Exception:
            pass


def _reset_all_after_fork() -> None:
    for client in list(_clients):
        client._after_fork_in_child()


atexit.register(_shutdown_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_all_after_fork)


_default: HintClient | None = None
_default_lock = threading.Lock()


def get_client() -> HintClient:
    """The process-wide client configured from the environment (created lazily)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = HintClient()
    return _default


def set_client(client: HintClient | None) -> None:
    """Replace the process-wide client (tests, or an application that builds its own)."""
    global _default
    _default = client
