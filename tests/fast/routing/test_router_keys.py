"""`saga router` with a keys file: the hint fan-out authenticates agents, applies
their hint rate, and forwards with its admin key on their behalf; its calls into
engines (release, peer service, replica reports) present the admin key."""

from __future__ import annotations

import grpc
import pytest

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk import HintClient, HintReader, SagaUnavailable
from saga_sdk.channel import hint_channel
from saga_server.core import SessionPhase, WorkflowCore
from saga_server.engines.vllm.intake import EngineHintSink, ReleaseKv
from saga_server.router import engine_calls
from saga_server.router.engine_calls import release_session, send_peer_service
from saga_server.router.hints import start_fanout
from saga_server.router.report import read_report
from saga_server.rpc import HintServer, KeyRing

KEY_A, KEY_B, KEY_ROUTER = "key-team-a-0001", "key-team-b-0001", "key-router-0001"
KEYS = f"""\
{KEY_A} team-a agent hint_rate=1 hint_burst=3
{KEY_B} team-b agent
{KEY_ROUTER} ops admin
"""


@pytest.fixture
def keys_file(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    monkeypatch.setenv("SAGA_API_KEYS", str(path))  # as `saga router` exports it for its replicas
    monkeypatch.delenv("SAGA_API_KEY", raising=False)
    engine_calls._admin_key.cache_clear()
    yield path
    engine_calls._admin_key.cache_clear()


@pytest.fixture
def cluster(keys_file):
    sinks = [EngineHintSink(WorkflowCore()), EngineHintSink(WorkflowCore())]
    engines = [HintServer(s, "127.0.0.1:0", keys=KeyRing(str(keys_file))).start() for s in sinks]
    endpoints = [e.endpoint for e in engines]
    server, servicer, port = start_fanout(lambda: endpoints, "127.0.0.1:0", keys=KeyRing(str(keys_file)))
    yield f"127.0.0.1:{port}", servicer, sinks, engines
    server.close(None)
    for e in engines:
        e.close(grace=None)


def send(addr: str, key: str, *events: pb.HintEvent) -> pb.HintAck:
    with hint_channel(addr, key) as channel:
        return hints_pb2_grpc.WorkflowHintsStub(channel).SendHints(pb.HintBatch(events=list(events)), timeout=5)


def test_the_fanout_forwards_as_the_agents_tenant_and_engines_apply_the_ownership_rule(cluster):
    addr, servicer, sinks, engines = cluster
    client = HintClient(endpoint=addr, api_key=KEY_A)
    client.session_start("a-1", tenant="")
    assert client.flush(5)
    client.close()
    for sink in sinks:
        assert sink.core.table.by_id["a-1"].owner == "team-a" and sink.session("a-1").tenant == "team-a"
    ack = send(addr, KEY_B, pb.HintEvent(session_id="a-1", tool_call_start=pb.ToolCallStart(tool="x")),
               pb.HintEvent(session_id="b-1", session_start=pb.SessionStart(tenant="team-a")))
    assert ack.accepted == 0 and all(r.reason.startswith("denied:") for r in ack.rejections)
    assert all(s.session("a-1").state == SessionPhase.IDLE and s.session("b-1") is None for s in sinks)
    with HintReader(addr, api_key=KEY_B) as reader:
        with pytest.raises(SagaUnavailable, match="PERMISSION_DENIED"):
            reader.session("a-1")
        assert reader.sessions() == []
    with HintReader(addr, api_key=KEY_A) as reader:
        assert [s.session_id for s in reader.sessions()] == ["a-1"]
        assert reader.session("a-1").tenant == "team-a"
    with HintReader(addr, api_key=KEY_ROUTER) as reader:
        stats = reader.stats()  # summed over both engines
    assert (stats["denied_foreign_session"], stats["denied_tenant_claim"], stats["denied_read"]) == (2, 2, 2)
    assert servicer.counters["forward_errors"] == 0


def test_the_hint_rate_applies_once_at_the_fanout(cluster):
    addr, servicer, sinks, engines = cluster
    events = [pb.HintEvent(session_id="a-1", llm_call_start=pb.LlmCallStart()) for _ in range(5)]
    ack = send(addr, KEY_A, *events)
    assert (ack.accepted, ack.rejected) == (3, 2) and [r.index for r in ack.rejections] == [3, 4]
    assert servicer.counters["rate_dropped"] == 2
    assert all(e.service.counters["events_received"] == 3 for e in engines)  # every engine saw the same 3
    assert all(e.service.counters["rate_dropped"] == 0 for e in engines)  # the router's key has no rate
    with HintReader(addr, api_key=KEY_ROUTER) as reader:
        assert reader.stats()["fanout_rate_dropped"] == 2


def test_the_routers_calls_into_engines_present_the_admin_key(cluster, monkeypatch):
    addr, _, sinks, engines = cluster
    send(addr, KEY_A, pb.HintEvent(session_id="a-1", session_start=pb.SessionStart()))
    sinks[0].core.on_request_arrival("a-1", 100)
    engine = engines[0].endpoint
    assert engine_calls.engine_key() == KEY_ROUTER
    assert "a-1" in read_report(engine).sessions  # ListResident: admin only
    assert release_session(engine, "a-1")  # another tenant's session: admin only
    assert sinks[0].drain()[-1] == ReleaseKv("a-1")
    assert send_peer_service(engine, {"team-a": 5.0}) == 1
    monkeypatch.delenv("SAGA_API_KEYS")  # no key at all: the engines refuse
    with pytest.raises(grpc.RpcError) as err:
        release_session(engine, "a-1")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

