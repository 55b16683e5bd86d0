"""`hint_channel` presents the API key on every kind of call, to a real hint service."""

from __future__ import annotations

import grpc
import pytest

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk.channel import hint_channel
from saga_server.rpc import HintServer


@pytest.fixture
def keyed_server(registry):
    server = HintServer(registry, "127.0.0.1:0", api_key="sekret").start()
    yield server
    server.close(grace=None)


def _batch(sid: str) -> pb.HintBatch:
    return pb.HintBatch(events=[pb.HintEvent(session_id=sid, session_start=pb.SessionStart())])


def test_the_key_goes_with_unary_and_streaming_calls(keyed_server, registry):
    with hint_channel(keyed_server.endpoint, "sekret") as channel:
        stub = hints_pb2_grpc.WorkflowHintsStub(channel)
        assert stub.SendHints(_batch("unary"), timeout=5).accepted == 1
        acks = list(stub.StreamHints(iter([_batch("streamed")]), timeout=5))
        assert [a.accepted for a in acks] == [1]
        # metadata a caller passes itself is kept next to the key
        stub.GetStats(pb.GetStatsRequest(), timeout=5, metadata=(("x-trace", "1"),))
    assert registry.session("unary") is not None and registry.session("streamed") is not None


@pytest.mark.parametrize("key", [None, "", "wrong"])
def test_no_key_or_a_wrong_one_is_refused(keyed_server, registry, key):
    with hint_channel(keyed_server.endpoint, key) as channel:
        stub = hints_pb2_grpc.WorkflowHintsStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.SendHints(_batch("intruder"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            list(stub.StreamHints(iter([_batch("intruder")]), timeout=5))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert registry.session("intruder") is None
    assert keyed_server.service.counters["auth_failures"] == 2
