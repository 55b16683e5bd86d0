"""Tenant isolation over a real gRPC channel: every cross-tenant action is tried
with one tenant's key, refused, and counted; admins and the shared key still do
what they did; keys reload.

The service runs an engine's sink (`EngineHintSink` over a `WorkflowCore`), so
the KV calls (`ReleaseSession`, `ListResident`) and fair share are real.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
import pytest

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk.channel import hint_channel
from saga_server.core import LlmCallStart, ManualClock, SessionEnd, SessionPhase, SessionStart, WorkflowCore
from saga_server.engines.vllm.intake import EngineHintSink, ReleaseKv
from saga_server.rpc import HintServer, KeyRing, KeysFileError, on_behalf_of

KEY_A, KEY_B, KEY_OPS = "key-team-a-0001", "key-team-b-0001", "key-ops-000001"
KEYS = f"""\
{KEY_A}  team-a  agent  min_deadline_s=60 max_sessions=3 hint_rate=10 hint_burst=20
{KEY_B}  team-b  agent
{KEY_OPS}  ops  admin
"""
FLOOR_S, BURST = 60.0, 20


@dataclass
class Service:
    server: HintServer
    sink: EngineHintSink
    clock: ManualClock
    channels: list

    def stub(self, key: str | None) -> hints_pb2_grpc.WorkflowHintsStub:
        channel = hint_channel(self.server.endpoint, key)
        self.channels.append(channel)
        return hints_pb2_grpc.WorkflowHintsStub(channel)

    def send(self, key: str, *events: pb.HintEvent) -> pb.HintAck:
        return self.stub(key).SendHints(pb.HintBatch(events=list(events)), timeout=5)

    def stats(self) -> dict[str, float]:
        return dict(self.stub(KEY_OPS).GetStats(pb.GetStatsRequest(), timeout=5).stats)


def start(sid: str, tenant: str = "", deadline_s: float = 0.0) -> pb.HintEvent:
    return pb.HintEvent(session_id=sid, session_start=pb.SessionStart(tenant=tenant, deadline_s=deadline_s))


def llm(sid: str) -> pb.HintEvent:
    return pb.HintEvent(session_id=sid, llm_call_start=pb.LlmCallStart())


def tool(sid: str) -> pb.HintEvent:
    return pb.HintEvent(session_id=sid, tool_call_start=pb.ToolCallStart(tool="pytest", call_id="c"))


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    return path


@pytest.fixture
def service(keys_file):
    """Tenant a owns session a-1 (one token of its bucket spent), tenant b owns b-1."""
    clock = ManualClock(1000.0)
    sink = EngineHintSink(WorkflowCore(clock=clock))
    server = HintServer(sink, "127.0.0.1:0", keys=KeyRing(str(keys_file)), clock=clock).start()
    svc = Service(server, sink, clock, [])
    assert svc.send(KEY_A, start("a-1")).accepted == 1
    assert svc.send(KEY_B, start("b-1", tenant="team-b")).accepted == 1
    yield svc
    for channel in svc.channels:
        channel.close()
    server.close(grace=None)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


# -- every cross-tenant action, tried by tenant a (or its key) -------------------------

def claim_another_tenant(svc):
    ack = svc.send(KEY_A, start("x", tenant="team-b"))
    assert (ack.accepted, ack.rejected) == (0, 1) and ack.rejections[0].reason.startswith("denied: tenant")
    assert refused(lambda: svc.stub(KEY_OPS).GetSession(pb.GetSessionRequest(session_id="x"),
                                                        timeout=5)).code() == grpc.StatusCode.NOT_FOUND


def hint_another_tenants_session(svc):
    ack = svc.send(KEY_A, tool("b-1"))
    assert ack.rejected == 1 and "belongs to another tenant" in ack.rejections[0].reason
    assert svc.sink.session("b-1").state == SessionPhase.IDLE and svc.sink.drain() == []


def read_another_tenants_session(svc):
    err = refused(lambda: svc.stub(KEY_A).GetSession(pb.GetSessionRequest(session_id="b-1"), timeout=5))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED


def list_sessions(svc):
    listed = svc.stub(KEY_A).ListSessions(pb.ListSessionsRequest(), timeout=5).sessions
    assert [s.session_id for s in listed] == ["a-1"]


def release_another_tenants_session(svc):
    err = refused(lambda: svc.stub(KEY_A).ReleaseSession(pb.ReleaseSessionRequest(session_id="b-1"), timeout=5))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and svc.sink.drain() == []


def report_peer_service(svc):
    err = refused(lambda: svc.stub(KEY_A).ReportPeerService(pb.PeerService(tenant_tokens={"team-b": 1e9}),
                                                            timeout=5))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "admin" in err.details()
    assert svc.stats()["afs_peer_tokens"] == 0


def list_resident(svc):
    err = refused(lambda: svc.stub(KEY_A).ListResident(pb.ListResidentRequest(), timeout=5))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED


def deadline_below_the_floor(svc):
    assert svc.send(KEY_A, start("a-2", deadline_s=1.0)).accepted == 1  # clamped, not refused
    state = svc.stub(KEY_A).GetSession(pb.GetSessionRequest(session_id="a-2"), timeout=5)
    assert state.deadline_in_s == pytest.approx(FLOOR_S)


def over_the_session_limit(svc):
    ack = svc.send(KEY_A, start("a-2"), start("a-3"), start("a-4"))
    assert ack.accepted == 2 and ack.rejections[0].index == 2 and "limit 3" in ack.rejections[0].reason


def over_the_hint_rate(svc):
    ack = svc.send(KEY_A, *[llm("a-1") for _ in range(BURST + 5)])  # a-1's start took a token
    assert (ack.accepted, ack.rejected) == (BURST - 1, 6)
    assert {r.reason for r in ack.rejections} == {"refused: over this key's hint rate"}
    assert [r.index for r in ack.rejections] == list(range(BURST - 1, BURST + 5))
    svc.clock.t += 0.5  # 10 events/s: five more tokens
    assert svc.send(KEY_A, *[llm("a-1") for _ in range(8)]).accepted == 5


CASES = [  # action, counter in GetStats, its count
    (claim_another_tenant, "denied_tenant_claim", 1),
    (hint_another_tenants_session, "denied_foreign_session", 1),
    (read_another_tenants_session, "denied_read", 1),
    (list_sessions, "list_withheld", 1),
    (release_another_tenants_session, "denied_release", 1),
    (report_peer_service, "hints_denied_admin_only", 1),
    (list_resident, "hints_denied_admin_only", 1),
    (deadline_below_the_floor, "deadline_clamped", 1),
    (over_the_session_limit, "denied_session_limit", 1),
    (over_the_hint_rate, "hints_rate_dropped", 9),
]
COUNTERS = {counter for _, counter, _ in CASES}


@pytest.mark.parametrize("attempt, counter, count", CASES, ids=[c[0].__name__ for c in CASES])
def test_each_cross_tenant_action_is_refused_and_counted(service, attempt, counter, count):
    attempt(service)
    stats = service.stats()
    assert {c: stats[c] for c in COUNTERS} == {c: (count if c == counter else 0) for c in COUNTERS}
    assert service.sink.session("b-1").tenant == "team-b"  # b's session is as b left it


# -- what is allowed ------------------------------------------------------------------

def test_a_tenant_acts_on_its_own_sessions(service):
    a = service.stub(KEY_A)
    assert service.send(KEY_A, tool("a-1")).accepted == 1
    assert a.GetSession(pb.GetSessionRequest(session_id="a-1"), timeout=5).state == "tool"
    assert a.ReleaseSession(pb.ReleaseSessionRequest(session_id="a-1"), timeout=5).queued
    assert service.sink.drain()[-1] == ReleaseKv("a-1")
    assert not any(v for k, v in service.stats().items() if "denied" in k)


def test_the_admin_key_does_the_admin_things(service):
    ops = service.stub(KEY_OPS)
    assert {s.session_id for s in ops.ListSessions(pb.ListSessionsRequest(), timeout=5).sessions} == {"a-1", "b-1"}
    assert ops.GetSession(pb.GetSessionRequest(session_id="b-1"), timeout=5).tenant == "team-b"
    assert ops.ReportPeerService(pb.PeerService(tenant_tokens={"team-b": 40.0}), timeout=5).tenants == 1
    assert ops.ReleaseSession(pb.ReleaseSessionRequest(session_id="b-1"), timeout=5).queued
    ops.ListResident(pb.ListResidentRequest(), timeout=5)
    assert service.send(KEY_OPS, start("for-b", tenant="team-b")).accepted == 1  # names any tenant
    assert service.send(KEY_B, tool("for-b")).accepted == 1  # and the session is b's
    stats = service.stats()
    assert stats["afs_peer_tokens"] == 40.0 and not any(v for k, v in stats.items() if "denied" in k)


def test_an_admin_acting_for_a_tenant_is_that_tenant(service):
    as_b = service.stub(KEY_OPS)
    ack = as_b.SendHints(pb.HintBatch(events=[tool("a-1"), start("b-2")]), timeout=5,
                         metadata=on_behalf_of("team-b"))
    assert ack.accepted == 1 and "another tenant" in ack.rejections[0].reason
    assert service.sink.session("b-2").tenant == "team-b"
    listed = as_b.ListSessions(pb.ListSessionsRequest(), timeout=5, metadata=on_behalf_of("team-b")).sessions
    assert {s.session_id for s in listed} == {"b-1", "b-2"}
    # an agent's key cannot borrow another tenant's name the same way
    ack = service.stub(KEY_A).SendHints(pb.HintBatch(events=[tool("b-1")]), timeout=5,
                                        metadata=on_behalf_of("team-b"))
    assert ack.rejected == 1


def test_an_agent_sees_only_its_own_tenants_service(service):
    service.sink.core.record_service("team-a", 100)
    service.sink.core.record_service("team-b", 900)
    mine = service.stub(KEY_A).GetStats(pb.GetStatsRequest(), timeout=5).served_tokens_by_tenant
    every = service.stub(KEY_OPS).GetStats(pb.GetStatsRequest(), timeout=5).served_tokens_by_tenant
    assert dict(mine) == {"team-a": 100.0} and dict(every) == {"team-a": 100.0, "team-b": 900.0}


def test_an_agent_sees_only_its_own_tenants_deadline_outcomes(service):
    core = service.sink.core
    for sid, tenant in (("da", "team-a"), ("db", "team-b")):
        core.accept(SessionStart(sid, core.now(), tenant=tenant, deadline_s=600.0, turn_deadline_s=60.0))
        core.accept(LlmCallStart(sid, core.now(), step=1))
        core.accept(SessionEnd(sid, core.now()))
    mine = service.stub(KEY_A).GetStats(pb.GetStatsRequest(), timeout=5).tenant_outcomes
    every = service.stub(KEY_OPS).GetStats(pb.GetStatsRequest(), timeout=5).tenant_outcomes
    assert sorted(mine) == ["team-a"] and sorted(every) == ["team-a", "team-b"]
    for tenant in ("team-a", "team-b"):
        assert (every[tenant].deadlines.met, every[tenant].deadlines.missed) == (1, 0)
        assert (every[tenant].turns.met, every[tenant].turns.missed) == (1, 0)
    assert mine["team-a"] == every["team-a"]


def test_a_missing_or_unknown_key_is_unauthenticated(service):
    for key in (None, "key-nobody-0001"):
        assert refused(lambda: service.stub(key).GetStats(pb.GetStatsRequest(), timeout=5)).code() \
            == grpc.StatusCode.UNAUTHENTICATED
    assert service.stats()["hints_auth_failures"] == 2


def test_the_shared_key_still_opens_every_call_as_before():
    core = WorkflowCore()
    sink = EngineHintSink(core)
    with HintServer(sink, "127.0.0.1:0", api_key="shared-secret") as server, \
            hint_channel(server.endpoint, "shared-secret") as channel:
        stub = hints_pb2_grpc.WorkflowHintsStub(channel)
        ack = stub.SendHints(pb.HintBatch(events=[start("s", tenant="acme", deadline_s=1.0), tool("s")]), timeout=5)
        assert ack.accepted == 2
        state = stub.GetSession(pb.GetSessionRequest(session_id="s"), timeout=5)
        assert state.tenant == "acme" and state.deadline_in_s <= 1.0  # the payload's tenant, no floor
        assert [s.session_id for s in stub.ListSessions(pb.ListSessionsRequest(), timeout=5).sessions] == ["s"]
        assert stub.ReportPeerService(pb.PeerService(tenant_tokens={"acme": 1.0}), timeout=5).tenants == 1
        assert stub.ReleaseSession(pb.ReleaseSessionRequest(session_id="s"), timeout=5).queued
        stats = dict(stub.GetStats(pb.GetStatsRequest(), timeout=5).stats)
        assert not any(v for k, v in stats.items() if "denied" in k or k == "hints_rate_dropped")
        with hint_channel(server.endpoint, "wrong-key") as wrong:
            assert refused(lambda: hints_pb2_grpc.WorkflowHintsStub(wrong).GetStats(
                pb.GetStatsRequest(), timeout=5)).code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_reload_changes_who_may_call_and_a_bad_file_keeps_the_old_keys(service, keys_file):
    keys_file.write_text(KEYS.replace(KEY_B, "key-team-c-0001").replace("team-b", "team-c"))
    assert service.server.keys.reload() == 3
    assert refused(lambda: service.send(KEY_B, llm("b-1"))).code() == grpc.StatusCode.UNAUTHENTICATED
    assert service.send("key-team-c-0001", start("c-1")).accepted == 1
    keys_file.write_text("key-team-d-0001 team-d agent max_sessions=lots\n")
    with pytest.raises(KeysFileError, match="keys:1: max_sessions"):
        service.server.keys.reload()
    assert service.send("key-team-c-0001", llm("c-1")).accepted == 1  # the old keys still open the door
    assert refused(lambda: service.send("key-team-d-0001", llm("d-1"))).code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_reload_applies_new_limits_to_the_next_call(service, keys_file):
    keys_file.write_text(KEYS.replace("min_deadline_s=60", "min_deadline_s=300"))
    service.server.keys.reload()
    assert service.send(KEY_A, start("a-2", deadline_s=5.0)).accepted == 1
    state = service.stub(KEY_A).GetSession(pb.GetSessionRequest(session_id="a-2"), timeout=5)
    assert math.isclose(state.deadline_in_s, 300.0)


def test_behind_a_guarded_engine_port_an_agents_ids_are_its_tenants_scoped_ids(keys_file):
    """`saga serve --api-keys` scopes a request's session id to its key's tenant
    (`team-a/s`); the hint service names the same agent's hints the same way, so
    they meet its requests, while admins (`saga proxy`) name ids as they are."""
    clock = ManualClock(1000.0)
    sink = EngineHintSink(WorkflowCore(clock=clock))
    server = HintServer(sink, "127.0.0.1:0", keys=KeyRing(str(keys_file)), clock=clock,
                        scope_agent_ids=True).start()
    svc = Service(server, sink, clock, [])
    try:
        assert svc.send(KEY_A, start("s"), llm("s")).accepted == 2
        assert svc.send(KEY_A, llm("team-a/s")).accepted == 1  # its own scoped id is the same session
        assert svc.sink.session("team-a/s").steps == 2 and svc.sink.session("s") is None
        mine = svc.stub(KEY_A).GetSession(pb.GetSessionRequest(session_id="s"), timeout=5)
        assert (mine.session_id, mine.tenant) == ("team-a/s", "team-a")
        assert svc.send(KEY_A, llm(" s ")).accepted == 1  # blanks go, as the port strips them
        assert svc.sink.session("team-a/s").steps == 3
        # another tenant's scope lands in its own, as the port scopes a request's id
        assert svc.send(KEY_A, llm("team-b/t")).accepted == 1
        assert svc.sink.session("team-a/team-b/t").tenant == "team-a" and svc.sink.session("team-b/t") is None
        assert svc.send(KEY_A, llm("/t")).accepted == 1 and svc.sink.session("team-a//t") is not None
        assert svc.send(KEY_OPS, start("plain", tenant="team-b")).accepted == 1  # an admin's ids are as sent
        assert svc.sink.session("plain").tenant == "team-b"
    finally:
        for channel in svc.channels:
            channel.close()
        server.close(grace=None)
