"""`send_hint`: the tracker's core events as the hint service receives them, on the
wire (a gRPC service that keeps each message as it arrived) and end to end (the real
hint service, decoding them back into core events)."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import replace
from typing import get_args

import grpc
import pytest

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk import HintClient
from saga_server.core.events import (
    HintEvent,
    LlmCallEnd,
    LlmCallStart,
    SessionEnd,
    SessionOutcome,
    SessionPhase,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    ToolOutcome,
    WorkflowNode,
    WorkflowStructure,
)
from saga_server.proxy import SessionTracker, send_hint
from tests.support.registry import RecordingRegistry

SID = "px-1-ab12"
TRACKER_TIME = 12.5  # the tracker's monotonic clock: must not reach the wire


class WireCapture(hints_pb2_grpc.WorkflowHintsServicer):
    """A hint service that keeps every event it receives, as it arrived."""

    def __init__(self) -> None:
        self.events: list[pb.HintEvent] = []
        self._lock = threading.Lock()

    def SendHints(self, request, context):
        with self._lock:
            self.events.extend(request.events)
        return pb.HintAck(sequence=request.sequence, accepted=len(request.events))


@pytest.fixture
def wire():
    """(a `HintClient` to a `WireCapture`, that capture)."""
    capture = WireCapture()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    hints_pb2_grpc.add_WorkflowHintsServicer_to_server(capture, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = HintClient(endpoint=f"127.0.0.1:{port}", flush_interval_s=0)
    yield client, capture
    client.close(timeout=1)
    server.stop(grace=None)


def wire_event(**kind) -> pb.HintEvent:
    return pb.HintEvent(session_id=SID, **kind)


# Each kind of core event, with the fields the tracker fills, and the message it must become.
EMITTED = [
    pytest.param(SessionStart(SID, TRACKER_TIME, workflow="proxy:m:ab12"),
                 wire_event(session_start=pb.SessionStart(workflow="proxy:m:ab12")), id="session_start"),
    pytest.param(SessionStart(SID, TRACKER_TIME, tenant="team-a", workflow="wf"),
                 wire_event(session_start=pb.SessionStart(tenant="team-a", workflow="wf")), id="session_start-tenant"),
    pytest.param(LlmCallStart(SID, TRACKER_TIME, step=3, node="llm", request_id=f"{SID}:3"),
                 wire_event(llm_call_start=pb.LlmCallStart(step=3, node="llm", request_id=f"{SID}:3")),
                 id="llm_call_start"),
    pytest.param(LlmCallEnd(SID, TRACKER_TIME, step=3, node="llm", request_id=f"{SID}:3", prompt_tokens=120,
                            output_tokens=7),
                 wire_event(llm_call_end=pb.LlmCallEnd(step=3, node="llm", request_id=f"{SID}:3", prompt_tokens=120,
                                                       output_tokens=7)), id="llm_call_end"),
    pytest.param(LlmCallEnd(SID, TRACKER_TIME, step=4, node="llm", request_id=f"{SID}:4"),
                 wire_event(llm_call_end=pb.LlmCallEnd(step=4, node="llm", request_id=f"{SID}:4")),
                 id="llm_call_end-failed"),
    pytest.param(ToolCallStart(SID, TRACKER_TIME, tool="search", call_id="call_1"),
                 wire_event(tool_call_start=pb.ToolCallStart(tool="search", call_id="call_1")), id="tool_call_start"),
    pytest.param(ToolCallStart(SID, TRACKER_TIME, tool="grep", call_id="text-2-0", category="search"),
                 wire_event(tool_call_start=pb.ToolCallStart(tool="grep", call_id="text-2-0", category="search")),
                 id="tool_call_start-text-action"),
    pytest.param(ToolCallEnd(SID, TRACKER_TIME, tool="search", call_id="call_1", outcome=ToolOutcome.OK),
                 wire_event(tool_call_end=pb.ToolCallEnd(tool="search", call_id="call_1",
                                                         outcome=pb.TOOL_OUTCOME_OK)), id="tool_call_end-ok"),
    pytest.param(ToolCallEnd(SID, TRACKER_TIME, tool="book", call_id="call_2", outcome=ToolOutcome.CANCELLED),
                 wire_event(tool_call_end=pb.ToolCallEnd(tool="book", call_id="call_2",
                                                         outcome=pb.TOOL_OUTCOME_CANCELLED)),
                 id="tool_call_end-cancelled"),
    pytest.param(SessionEnd(SID, TRACKER_TIME, outcome=SessionOutcome.COMPLETED),
                 wire_event(session_end=pb.SessionEnd(outcome=pb.SESSION_OUTCOME_COMPLETED)), id="session_end"),
    pytest.param(SessionEnd(SID, TRACKER_TIME, outcome=SessionOutcome.CANCELLED),
                 wire_event(session_end=pb.SessionEnd(outcome=pb.SESSION_OUTCOME_CANCELLED)),
                 id="session_end-cancelled"),
]
# Fields the tracker leaves at their defaults still reach the wire, should it ever fill them.
DECLARED = [
    pytest.param(SessionStart(SID, TRACKER_TIME, workflow="wf", deadline_s=30.0, structure=WorkflowStructure(
                     (WorkflowNode("plan"), WorkflowNode("search", "tool")), (("plan", "search"),))),
                 wire_event(session_start=pb.SessionStart(
                     workflow="wf", deadline_s=30.0, structure=pb.WorkflowStructure(
                         nodes=[pb.WorkflowNode(name="plan", kind="llm"), pb.WorkflowNode(name="search", kind="tool")],
                         edges=[pb.WorkflowEdge(src="plan", dst="search")]))), id="session_start-declared"),
    pytest.param(ToolCallStart(SID, TRACKER_TIME, tool="pytest", expected_duration_s=4.0),
                 wire_event(tool_call_start=pb.ToolCallStart(tool="pytest", expected_duration_s=4.0)),
                 id="tool_call_start-expected-duration"),
]


def test_every_kind_of_core_event_has_a_wire_case():
    assert {type(p.values[0]) for p in EMITTED} == set(get_args(HintEvent))


@pytest.mark.parametrize("event, expected", EMITTED + DECLARED)
def test_each_core_event_becomes_its_wire_message(wire, event, expected):
    client, capture = wire
    send_hint(client, event)
    assert client.flush(5)
    [got] = capture.events
    assert abs(got.client_time - time.time()) < 60  # the client's clock when it queued the hint
    got.ClearField("client_time")
    assert got == expected


def test_anything_but_a_core_event_is_refused_and_nothing_is_sent(wire):
    client, capture = wire
    with pytest.raises(TypeError):
        send_hint(client, {"kind": "session_start", "session_id": SID})
    assert client.flush(5) and capture.events == []


@pytest.fixture
def registry():
    return RecordingRegistry()


def test_a_tracked_session_reaches_the_hint_service_as_the_tracker_saw_it(hint_server, registry):
    """A tool loop and a stopping proxy, each hint sent as the proxy sends it: the
    service decodes the very events the tracker emitted (its own clock aside)."""
    tracker = SessionTracker()
    messages = [{"role": "system", "content": "You book flights."}, {"role": "user", "content": "to Oslo"}]
    answer = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "book", "arguments": "{}"}}]}
    exchange, hints = tracker.begin({"model": "m", "messages": messages}, {"x-session-id": "oslo"})
    hints += tracker.finish(exchange, [answer], {"prompt_tokens": 20, "completion_tokens": 5})
    exchange, more = tracker.begin({"model": "m", "messages": messages + [
        answer, {"role": "tool", "tool_call_id": "c1", "content": "found"}]}, {"x-session-id": "oslo"})
    hints += more + tracker.fail(exchange) + tracker.close()
    client = HintClient(endpoint=hint_server.endpoint, flush_interval_s=0)
    try:
        for hint in hints:
            send_hint(client, hint.event)
        assert client.flush(5)
    finally:
        client.close(timeout=1)
    sent = [replace(h.event, time=0.0) for h in hints]
    assert {type(e) for e in sent} == set(get_args(HintEvent))
    assert [replace(e, time=0.0) for e in registry.events] == sent
    assert registry.session("oslo").state == SessionPhase.ENDED


def test_sending_to_a_hint_service_that_is_down_never_waits(dead_address):
    client = HintClient(endpoint=dead_address, flush_interval_s=0)
    try:
        started = time.perf_counter()
        for step in range(1, 1001):
            send_hint(client, LlmCallStart(SID, TRACKER_TIME, step=step, node="llm"))
        assert time.perf_counter() - started < 1.0  # queued, never sent in the caller's time
    finally:
        client.close(timeout=0.1)
