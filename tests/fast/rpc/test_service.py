"""The hint service refuses bad input clearly and keeps serving everyone else."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk import HintReader, SagaUnavailable, UnknownSession
from saga_sdk.channel import hint_channel
from saga_server.core import SessionStart, SessionTable, ToolCallEnd, ToolCallStart
from saga_server.rpc import HintServer, Limits


def _channel(endpoint: str) -> grpc.Channel:
    """A channel with its own subchannel pool (see `hint_channel`): a port reused
    from an earlier test's stopped server must not hand it that server's backoff."""
    return hint_channel(endpoint)


@pytest.fixture
def stub(hint_server):
    channel = _channel(hint_server.endpoint)
    yield hints_pb2_grpc.WorkflowHintsStub(channel)
    channel.close()


def batch(*events: pb.HintEvent, client_id: str = "", sequence: int = 0) -> pb.HintBatch:
    return pb.HintBatch(client_id=client_id, sequence=sequence, events=list(events))


def start(sid: str) -> pb.HintEvent:
    return pb.HintEvent(session_id=sid, session_start=pb.SessionStart(tenant="t"))


def reasons(ack: pb.HintAck) -> list[str]:
    return [r.reason for r in ack.rejections]


@pytest.mark.parametrize("event, reason", [
    (pb.HintEvent(session_start=pb.SessionStart()), "invalid: session_id is required"),
    (pb.HintEvent(session_id="s"), "invalid: event has no kind"),
    (pb.HintEvent(session_id="s" * (Limits.max_id_chars + 1), session_end=pb.SessionEnd()), "longer than"),
    (pb.HintEvent(session_id="s", tool_call_start=pb.ToolCallStart()), "invalid: tool is required"),
    (pb.HintEvent(session_id="s", tool_call_start=pb.ToolCallStart(tool="x", expected_duration_s=-1)),
     "expected_duration_s must be within"),
    (pb.HintEvent(session_id="s", session_start=pb.SessionStart(deadline_s=float("nan"))), "deadline_s"),
    (pb.HintEvent(session_id="s", session_start=pb.SessionStart(turn_deadline_s=-1.0)), "turn_deadline_s"),
    (pb.HintEvent(session_id="s\x00", session_end=pb.SessionEnd()), "control characters"),
    (pb.HintEvent(session_id="s", tool_call_end=pb.ToolCallEnd()), "needs tool or call_id"),
    (pb.HintEvent(session_id="unknown", tool_call_end=pb.ToolCallEnd(call_id="c")), "refused: unknown session"),
    (pb.HintEvent(session_id="s", session_end=pb.SessionEnd(outcome=99)), "unknown session outcome"),
])
def test_each_malformed_event_is_refused_with_a_reason(stub, registry, event, reason):
    ack = stub.SendHints(batch(start("other"), event, start("after")))
    assert (ack.accepted, ack.rejected) == (2, 1)
    assert ack.rejections[0].index == 1 and reason in ack.rejections[0].reason
    assert registry.session("other") is not None and registry.session("after") is not None


def test_tool_end_without_start_changes_nothing(stub, registry):
    stub.SendHints(batch(start("s")))
    before = registry.session("s")
    ack = stub.SendHints(batch(pb.HintEvent(session_id="s", tool_call_end=pb.ToolCallEnd(call_id="nope"))))
    assert "was never started" in reasons(ack)[0]
    after = registry.session("s")
    assert (after.state, after.tool_calls, after.history) == (before.state, before.tool_calls, before.history)


def test_oversized_structure_and_batch_are_refused(stub):
    big = pb.SessionStart(structure=pb.WorkflowStructure(
        nodes=[pb.WorkflowNode(name=f"n{i}") for i in range(Limits.max_nodes + 1)]))
    assert "structure larger" in reasons(stub.SendHints(batch(pb.HintEvent(session_id="s", session_start=big))))[0]
    flood = batch(*[start(f"s{i}") for i in range(Limits.max_events_per_batch + 1)])
    ack = stub.SendHints(flood)
    assert ack.accepted == 0 and "batch larger" in reasons(ack)[0]


def test_a_message_over_the_size_limit_gets_a_status_not_a_crash(stub):
    huge = batch(pb.HintEvent(session_id="s", session_start=pb.SessionStart(workflow="w" * (5 << 20))))
    with pytest.raises(grpc.RpcError) as err:
        stub.SendHints(huge)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.SendHints(batch(start("still-serving"))).accepted == 1


def test_too_many_sessions_are_refused_and_idle_ones_expire():
    now = [0.0]
    registry = SessionTable(max_sessions=3, idle_ttl_s=60, clock=lambda: now[0])
    server = HintServer(registry, "127.0.0.1:0", clock=lambda: now[0]).start()
    channel = _channel(server.endpoint)
    stub = hints_pb2_grpc.WorkflowHintsStub(channel)
    try:
        ack = stub.SendHints(batch(*[start(f"s{i}") for i in range(4)]))
        assert ack.accepted == 3 and "too many sessions" in reasons(ack)[0]
        now[0] = 61.0  # the first three are idle past their TTL: room again
        assert stub.SendHints(batch(start("s3"))).accepted == 1
        assert registry.session("s0") is None and registry.stats()["sessions_expired"] == 3
    finally:
        channel.close()
        server.close(grace=None)


def test_streaming_rpc_acks_every_batch_in_order(stub, registry):
    batches = [batch(start(f"st{i}"), client_id="c", sequence=i + 1) for i in range(5)]
    acks = list(stub.StreamHints(iter(batches)))
    assert [a.sequence for a in acks] == [1, 2, 3, 4, 5]
    assert all(a.accepted == 1 for a in acks)


def test_reads_report_sessions_and_stats(hint_server, stub):
    stub.SendHints(batch(start("r"), pb.HintEvent(session_id="r", tool_call_start=pb.ToolCallStart(tool="pytest",
                                                                                                    call_id="1"))))
    with HintReader(hint_server.endpoint) as reader:
        state = reader.session("r")
        assert (state.state, state.tenant, [t.tool for t in state.open_tools]) == ("tool", "t", ["pytest"])
        assert [h.kind for h in state.history] == ["session_start", "tool_call_start"]
        with pytest.raises(UnknownSession):
            reader.session("missing")
        stats = reader.stats()
        assert stats["open_tool_calls"] == 1 and stats["hints_events_accepted"] == 2


def test_a_listing_stops_before_its_reply_outgrows_what_a_client_receives():
    """Snapshots carry their history: 80 sessions with full histories of long tool
    names are ~5.5 MB, over a default client's 4 MiB; the reply holds the most
    recent ones that fit."""
    registry = SessionTable(max_sessions=1000, clock=lambda: 100.0)
    tool = "t" * 250
    for i in range(80):
        registry.accept(SessionStart(f"s{i}", float(i), tenant="t"))
        for j in range(128):
            registry.accept(ToolCallStart(f"s{i}", float(i), tool=tool, call_id=str(j)))
            registry.accept(ToolCallEnd(f"s{i}", float(i), tool=tool, call_id=str(j)))
    with HintServer(registry, "127.0.0.1:0") as server, HintReader(server.endpoint, timeout=30) as reader:
        listed = reader.sessions(10_000)
    assert 10 < len(listed) < 80
    assert [s.session_id for s in listed] == [f"s{i}" for i in range(79, 79 - len(listed), -1)]
    assert pb.SessionList(sessions=listed).ByteSize() <= 4 * 1024 * 1024


class ExplodingSink(SessionTable):
    def accept(self, event, caller=None):
        if event.session_id == "boom":
            raise ZeroDivisionError("sink bug")
        super().accept(event, caller)


def test_a_sink_bug_rejects_one_event_and_the_service_survives():
    sink = ExplodingSink()
    server = HintServer(sink, "127.0.0.1:0").start()
    channel = _channel(server.endpoint)
    try:
        ack = hints_pb2_grpc.WorkflowHintsStub(channel).SendHints(batch(start("boom"), start("fine")))
        assert (ack.accepted, reasons(ack)) == (1, ["internal error"])
        assert sink.session("fine") is not None
        assert server.service.counters["sink_errors"] == 1
    finally:
        channel.close()
        server.close(grace=None)


wire_events = st.builds(
    pb.HintEvent,
    session_id=st.text(max_size=300),
    client_time=st.floats(allow_nan=True, allow_infinity=True),
    tool_call_start=st.builds(pb.ToolCallStart, tool=st.text(max_size=20), call_id=st.text(max_size=5),
                              expected_duration_s=st.floats()),
) | st.builds(
    pb.HintEvent, session_id=st.sampled_from(["a", "b", ""]),
    tool_call_end=st.builds(pb.ToolCallEnd, tool=st.text(max_size=5), call_id=st.text(max_size=5),
                            outcome=st.integers(0, 5)),
) | st.builds(
    pb.HintEvent, session_id=st.sampled_from(["a", "b"]),
    session_start=st.builds(pb.SessionStart, tenant=st.text(max_size=10), deadline_s=st.floats(),
                            structure=st.builds(pb.WorkflowStructure, nodes=st.lists(
                                st.builds(pb.WorkflowNode, name=st.text(max_size=8), kind=st.text(max_size=5)),
                                max_size=5))),
) | st.builds(pb.HintEvent, session_id=st.sampled_from(["a", "b"]),
              llm_call_start=st.builds(pb.LlmCallStart, step=st.integers(0, 2**32 - 1), node=st.text(max_size=8)),
) | st.builds(pb.HintEvent, session_id=st.sampled_from(["a", "b"]),
              session_end=st.builds(pb.SessionEnd, outcome=st.integers(0, 5)))


@pytest.fixture(scope="module")
def fuzz_target():
    registry = SessionTable(max_sessions=100_000)
    server = HintServer(registry, "127.0.0.1:0").start()
    channel = _channel(server.endpoint)
    raw_send = channel.unary_unary("/saga.v1.WorkflowHints/SendHints")  # bytes in, bytes out
    yield hints_pb2_grpc.WorkflowHintsStub(channel), raw_send, registry
    channel.close()
    server.close(grace=None)


_canaries = iter(range(10**9))


@settings(max_examples=150, deadline=None)
@given(events=st.lists(wire_events, max_size=20), garbage=st.binary(max_size=200))
def test_fuzzed_hints_never_break_the_service(fuzz_target, events, garbage):
    stub, raw_send, registry = fuzz_target
    ack = stub.SendHints(batch(*events))
    assert ack.accepted + ack.rejected == len(events)
    assert len(ack.rejections) == min(ack.rejected, 32)
    try:  # bytes that may not parse as a HintBatch: a status or an ack, never a dead server
        pb.HintAck.FromString(raw_send(garbage, timeout=5))
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    canary = f"canary-{next(_canaries)}"
    assert stub.SendHints(batch(start(canary))).accepted == 1
    assert registry.session(canary).tenant == "t"


def test_peer_service_reaches_the_core_and_bad_reports_change_nothing():
    from saga_server.core import WorkflowCore

    core = WorkflowCore()
    server = HintServer(core, "127.0.0.1:0").start()
    channel = _channel(server.endpoint)
    stub = hints_pb2_grpc.WorkflowHintsStub(channel)
    try:
        ack = stub.ReportPeerService(pb.PeerService(tenant_tokens={"acme": 120.0, "zeta": 30.0}), timeout=5)
        assert ack.tenants == 2
        for bad in ({"acme": -1.0}, {"acme": float("nan")}, {"t" * 300: 1.0}):
            with pytest.raises(grpc.RpcError) as err:
                stub.ReportPeerService(pb.PeerService(tenant_tokens=bad), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stats = HintReader(server.endpoint).stats()
        assert stats["afs_peer_tokens"] == 150.0
        assert stats["hints_peer_reports"] == 1.0 and stats["hints_peer_reports_invalid"] == 3.0
    finally:
        channel.close()
        server.close(grace=None)


def test_stats_carry_the_service_per_tenant_as_a_typed_map(stub):
    from saga_server.core import WorkflowCore

    core = WorkflowCore()
    core.record_service("acme", 300)
    core.record_service("", 20)  # sessions without a tenant
    with HintServer(core, "127.0.0.1:0") as server, HintReader(server.endpoint) as reader:
        reply = reader.server_stats()
    assert dict(reply.served_tokens_by_tenant) == {"acme": 300.0, "": 20.0}
    assert not any("acme" in key for key in reply.stats)
    # a service without fair share (the plain registry) leaves the map empty
    assert not stub.GetStats(pb.GetStatsRequest(), timeout=5).served_tokens_by_tenant


def test_peer_service_to_a_service_without_fair_share_is_unimplemented(stub):
    with pytest.raises(grpc.RpcError) as err:
        stub.ReportPeerService(pb.PeerService(tenant_tokens={"acme": 1.0}), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "fair share" in err.value.details()


def test_release_session_reaches_an_engine_sink_and_is_refused_elsewhere(stub):
    from saga_server.core import WorkflowCore
    from saga_server.engines.vllm.intake import EngineHintSink, ReleaseKv

    with pytest.raises(grpc.RpcError) as err:  # a registry holds no KV
        stub.ReleaseSession(pb.ReleaseSessionRequest(session_id="s"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    sink = EngineHintSink(WorkflowCore())
    server = HintServer(sink, "127.0.0.1:0").start()
    channel = _channel(server.endpoint)
    engine = hints_pb2_grpc.WorkflowHintsStub(channel)
    try:
        assert engine.ReleaseSession(pb.ReleaseSessionRequest(session_id="s", reason="moved"), timeout=5).queued
        with pytest.raises(grpc.RpcError) as err:
            engine.ReleaseSession(pb.ReleaseSessionRequest(session_id=""), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert sink.drain() == [ReleaseKv("s")]
    finally:
        channel.close()
        server.close(grace=None)


def test_a_reader_reaches_a_service_restarted_on_the_same_port():
    """gRPC shares connections per address across channels: without its own pool a
    new reader would inherit the failed connection to the stopped service and
    report a live one unavailable."""
    first = HintServer(SessionTable(), "127.0.0.1:0").start()
    port = first.port
    stale = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = hints_pb2_grpc.WorkflowHintsStub(stale)
    stub.GetStats(pb.GetStatsRequest(), timeout=5)
    first.close(grace=None)
    with pytest.raises(grpc.RpcError):
        stub.GetStats(pb.GetStatsRequest(), timeout=1)
    second = HintServer(SessionTable(), f"127.0.0.1:{port}").start()
    try:
        with HintReader(f"127.0.0.1:{port}") as reader:
            assert "hints_batches" in reader.stats()
    finally:
        stale.close()
        second.close(grace=None)


def test_a_with_block_starts_the_server_and_closes_it(registry):
    with HintServer(registry, "127.0.0.1:0") as server:
        with HintReader(server.endpoint) as reader:
            assert "hints_batches" in reader.stats()
    with pytest.raises(SagaUnavailable), HintReader(server.endpoint, timeout=1) as reader:
        reader.stats()
