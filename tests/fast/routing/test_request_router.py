"""`SagaRequestRouter` on Ray Serve's real `RequestRouter` base, fed with replica
stand-ins (Serve's `RunningReplica` wraps a live actor handle; only its id and
`routing_stats` are read here)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

pytest.importorskip("ray.serve.request_router", reason="Ray Serve not installed")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID  # noqa: E402

from saga_server.router.report import ReplicaReport, read_report  # noqa: E402
from saga_server.router.request_router import LastGoodReports, SagaRequestRouter  # noqa: E402


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_unreadable_report_is_replaced_by_the_last_good_one_until_it_is_too_old():
    clock = _Clock()
    reports = LastGoodReports(ttl_s=10, clock=clock)
    good = ReplicaReport("a", sessions=frozenset({"s1"}), in_tool=frozenset({"s1"}))
    assert reports.get("r1", good) is good
    clock.now = 9
    assert reports.get("r1", ReplicaReport.unreadable("a", "deadline exceeded")) is good
    assert reports.get("r1", ReplicaReport.from_dict(None)) is good
    clock.now = 20
    assert reports.get("r1", ReplicaReport.unreadable("a", "x")) == ReplicaReport.unreadable("a", "x")
    assert not reports.get("r2", ReplicaReport.from_dict(None)).sessions


def test_reports_of_replicas_that_left_are_dropped():
    reports = LastGoodReports(ttl_s=10, clock=_Clock())
    reports.get("r1", ReplicaReport(sessions=frozenset({"s1"})))
    reports.keep_only({"r2"})
    assert not reports.get("r1", ReplicaReport.from_dict(None)).sessions


@dataclass(frozen=True)
class _ReplicaId:
    unique_id: str


@dataclass
class _Replica:
    replica_id: _ReplicaId
    routing_stats: dict = field(default_factory=dict)


async def _tick_until(router: SagaRequestRouter, done) -> None:
    """Run the router's ticker until `done()` (at most two seconds)."""
    router._start_ticker()
    for _ in range(100):
        await asyncio.sleep(0.02)
        if done():
            break
    router._ticker.cancel()


def _router() -> SagaRequestRouter:
    router = SagaRequestRouter(DeploymentID(name="saga"), DeploymentHandleSource.UNKNOWN)
    router.initialize_state(steal_period_s=0.05, steal_gap=2.0, steal_only_in_tool=True)
    return router


def test_the_ticker_moves_a_session_in_a_tool_call_off_an_overloaded_replica_with_no_request_arriving():
    router = _router()
    busy = _Replica(_ReplicaId("busy"), {"saga": {"sessions": ["agent"], "in_tool": ["agent"], "kv_usage": 0.0}})
    idle = _Replica(_ReplicaId("idle"), {"saga": {"sessions": [], "in_tool": [], "kv_usage": 0.0}})
    router._replicas = {r.replica_id: r for r in (busy, idle)}
    router._inflight["busy"] = 5  # requests routed there earlier, still running

    async def scenario():
        router._start_ticker()
        # the busy replica's engine stops answering its report polls
        busy.routing_stats = {"saga": {"hint_addr": "x", "error": "deadline exceeded"}}
        for _ in range(100):
            await asyncio.sleep(0.02)
            if router.steals:
                break
        router._ticker.cancel()

    last_good = ReplicaReport(sessions=frozenset({"agent"}), in_tool=frozenset({"agent"}))
    router._reports.get("busy", last_good)
    asyncio.run(scenario())
    assert list(router.steals) == [("agent", "busy", "idle", True)]
    assert router.routing.home_of("agent") == "idle"


def test_the_ticker_moves_the_in_tool_session_holding_the_least_kv_its_replica_reports():
    router = _router()
    sizes = {"long": 120_000, "small": 900, "mid": 30_000}
    busy = _Replica(_ReplicaId("busy"), {"saga": {"sessions": list(sizes), "in_tool": list(sizes),
                                                   "kv_tokens": sizes, "kv_usage": 0.0}})
    idle = _Replica(_ReplicaId("idle"), {"saga": {"sessions": [], "in_tool": [], "kv_usage": 0.0}})
    router._replicas = {r.replica_id: r for r in (busy, idle)}
    router._inflight["busy"] = 5
    asyncio.run(_tick_until(router, lambda: router.steals))
    assert list(router.steals)[0] == ("small", "busy", "idle", True)


def test_no_steal_when_the_load_gap_is_small():
    router = _router()
    a = _Replica(_ReplicaId("a"), {"saga": {"sessions": ["s"], "in_tool": ["s"]}})
    b = _Replica(_ReplicaId("b"), {"saga": {"sessions": []}})
    router._replicas = {r.replica_id: r for r in (a, b)}
    router._inflight["a"] = 1

    async def scenario():
        router._start_ticker()
        await asyncio.sleep(0.3)
        router._ticker.cancel()

    asyncio.run(scenario())
    assert not router.steals


def test_the_ticker_tells_each_engine_what_the_others_served_its_tenants():
    """Two real hint services over real workflow cores stand in for the replicas'
    engines; their reports are read the way a replica reads its own."""
    from saga_server.core import WorkflowCore
    from saga_server.engines.vllm.intake import EngineHintSink
    from saga_server.rpc import HintServer

    cores = {"r1": WorkflowCore(), "r2": WorkflowCore()}
    servers = {rid: HintServer(EngineHintSink(core), "127.0.0.1:0").start() for rid, core in cores.items()}
    try:
        router = _router()
        replicas = {rid: _Replica(_ReplicaId(rid)) for rid in cores}
        router._replicas = {r.replica_id: r for r in replicas.values()}

        def poll():  # what Serve does with record_routing_stats
            for rid, rep in replicas.items():
                rep.routing_stats = {"saga": read_report(servers[rid].endpoint).to_dict()}

        async def scenario():
            poll()
            router._start_ticker()
            await asyncio.sleep(0.2)  # first reports are baselines
            cores["r1"].record_service("acme", 500)
            cores["r2"].record_service("acme", 200)
            cores["r2"].record_service("zeta", 40)
            poll()
            for _ in range(100):
                await asyncio.sleep(0.05)
                if all(c.stats()["afs_peer_tokens"] > 0 for c in cores.values()) and not router._tasks:
                    break
            router._ticker.cancel()

        cores["r1"].record_service("acme", 1)  # tenants known before the baseline
        cores["r2"].record_service("acme", 1)
        cores["r2"].record_service("zeta", 1)
        asyncio.run(scenario())
        assert cores["r1"].stats()["afs_peer_tokens"] == 240.0  # r2's acme 200 + zeta 40
        assert cores["r2"].stats()["afs_peer_tokens"] == 500.0
        assert router.stats()["moves"]["peer_sends"] == 2
    finally:
        for s in servers.values():
            s.close(grace=None)


def test_a_stolen_session_is_released_on_its_source_engine():
    from saga_server.core import WorkflowCore
    from saga_server.engines.vllm.intake import EngineHintSink, ReleaseKv
    from saga_server.rpc import HintServer

    source = EngineHintSink(WorkflowCore())
    server = HintServer(source, "127.0.0.1:0").start()
    try:
        router = _router()
        busy = _Replica(_ReplicaId("busy"), {"saga": {"hint_addr": server.endpoint, "sessions": ["agent"],
                                                      "in_tool": ["agent"]}})
        idle = _Replica(_ReplicaId("idle"), {"saga": {"sessions": []}})
        router._replicas = {r.replica_id: r for r in (busy, idle)}
        router._inflight["busy"] = 5

        asyncio.run(_tick_until(router, lambda: router.moves["releases_ok"]))
        assert router.routing.home_of("agent") == "idle"
        assert ReleaseKv("agent") in source.drain()
    finally:
        server.close(grace=None)


class _Body:
    """What Serve hands the router as a chat request (a pydantic model in Ray)."""

    def __init__(self, sid: str) -> None:
        self.session_id = sid

    def model_dump(self, **_):
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}


@dataclass
class _Meta:
    session_id: str
    request_id: str = "r"
    internal_request_id: str = "r"


@dataclass
class _Pending:
    metadata: _Meta
    args: list


def test_a_request_arriving_during_its_sessions_move_waits_for_the_re_prefill(monkeypatch):
    import time as _time

    from saga_server.router import request_router

    posted = []

    def slow_post(url, payload, session_header):  # the target prefilling the prefix
        _time.sleep(0.4)
        posted.append((session_header, payload["max_tokens"]))
        return True

    monkeypatch.setattr(request_router, "_post", slow_post)
    router = SagaRequestRouter(DeploymentID(name="saga"), DeploymentHandleSource.UNKNOWN)
    router.initialize_state(steal_period_s=0.05, steal_gap=2.0, ingress_url="http://ingress")
    busy = _Replica(_ReplicaId("busy"), {"saga": {"sessions": ["agent"], "in_tool": ["agent"]}})
    idle = _Replica(_ReplicaId("idle"), {"saga": {"sessions": []}})
    router._replicas = {r.replica_id: r for r in (busy, idle)}

    async def scenario():
        first = await router.choose_replicas([busy, idle], _Pending(_Meta("agent"), [_Body("agent")]))
        assert [r.replica_id.unique_id for r in first[0]] == ["busy"]
        router._inflight["busy"] = 5  # now overloaded: the ticker moves the agent (in its tool)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if router.steals:
                break
        assert router._moving  # re-prefill under way
        nxt = await router.choose_replicas([busy, idle], _Pending(_Meta("agent"), [_Body("agent")]))
        prefilled_when_routed = list(posted)
        router._ticker.cancel()
        return nxt, prefilled_when_routed

    chosen, prefilled_when_routed = asyncio.run(scenario())
    assert [r.replica_id.unique_id for r in chosen[0]] == ["idle"]
    assert prefilled_when_routed == [("saga-move:idle:agent", 1)]  # the prefix was there first
    assert router.moves["waited_for_move"] == 1


def test_a_move_replays_the_last_request_on_the_api_it_came_through():
    from saga_server.router.request_router import _move_request

    class Completion(_Body):
        def model_dump(self, **_):
            return {"model": "m", "prompt": [1, 2, 3], "max_tokens": 50, "stream": True, "session_id": "s"}

    assert _move_request(Completion("s")) == ({"model": "m", "prompt": [1, 2, 3], "max_tokens": 1, "stream": False},
                                              "/v1/completions")
    payload, path = _move_request(_Body("s"))
    assert path == "/v1/chat/completions" and payload["max_tokens"] == 1 and payload["messages"]


def _steal_with_nixl(done, source_hints: str | None = None) -> SagaRequestRouter:
    """A router with NIXL moves, a busy replica whose session `agent` is in a tool and an
    idle one, run until `done(router)` (or 2 s): it steals `agent` and moves it."""
    router = SagaRequestRouter(DeploymentID(name="saga"), DeploymentHandleSource.UNKNOWN)
    router.initialize_state(steal_period_s=0.05, steal_gap=2.0, ingress_url="http://ingress", kv_transfer="nixl")
    report = {"sessions": ["agent"], "in_tool": ["agent"]}
    if source_hints:
        report["hint_addr"] = source_hints
    busy = _Replica(_ReplicaId("busy"), {"saga": report})
    idle = _Replica(_ReplicaId("idle"), {"saga": {"sessions": []}})
    router._replicas = {r.replica_id: r for r in (busy, idle)}

    async def scenario():
        await router.choose_replicas([busy, idle], _Pending(_Meta("agent"), [_Body("agent")]))
        router._inflight["busy"] = 5
        for _ in range(200):
            await asyncio.sleep(0.01)
            if done(router):
                break
        router._ticker.cancel()

    asyncio.run(scenario())
    return router


@pytest.mark.parametrize("pulled", [True, False])
def test_with_nixl_the_target_pulls_from_the_source_and_a_failed_pull_counts_as_a_re_prefill(monkeypatch, pulled):
    from saga_server.router.kv_move import PrefixMove
    from saga_server.router import request_router

    moves = []

    def move_kv(source, target, body, *, path):  # the two engines behind the ingress
        moves.append((dict(source.headers), dict(target.headers), body["max_tokens"], path))
        return PrefixMove(96, pulled, True, 0.25, "" if pulled else "pull failed (HTTP 500)")

    monkeypatch.setattr(request_router, "move_kv", move_kv)
    monkeypatch.setattr(request_router, "_post", lambda *a: pytest.fail("re-prefilled beside the pull"))
    router = _steal_with_nixl(lambda r: r.steals and not r._moving)
    assert moves == [({"X-Session-ID": "saga-move:busy:agent"}, {"X-Session-ID": "saga-move:idle:agent"}, 1,
                      "/v1/chat/completions")]
    if pulled:
        assert router.moves["pulls_ok"] == 1 and router.moves["pulled_tokens"] == 96
        assert router.moves["reprefills_ok"] == 0
    else:
        assert router.moves["pull_fallbacks"] == 1 and router.moves["reprefills_ok"] == 1
        assert router.moves["pulled_tokens"] == 0


def test_after_a_pull_the_source_drops_what_it_held_for_the_pull_too(monkeypatch):
    from saga_server.core import WorkflowCore
    from saga_server.engines.vllm.intake import EngineHintSink, ReleaseKv
    from saga_server.router import request_router
    from saga_server.router.kv_move import PrefixMove
    from saga_server.rpc import HintServer

    # The source answered the handle request under its own `saga-move` id: that KV is a
    # copy of the moved session's, and stays unless released with it.
    monkeypatch.setattr(request_router, "move_kv", lambda *a, **k: PrefixMove(96, True, True, 0.25))
    source = EngineHintSink(WorkflowCore())
    server = HintServer(source, "127.0.0.1:0").start()
    try:
        router = _steal_with_nixl(lambda r: r.moves["releases_ok"], source_hints=server.endpoint)
        assert router.moves["pulls_ok"] == 1
        released = source.drain()
        assert ReleaseKv("agent") in released and ReleaseKv("saga-move:busy:agent") in released
    finally:
        server.close(grace=None)


def test_the_router_reads_a_requests_parent_from_its_vllm_xargs():
    from types import SimpleNamespace

    from saga_server.router.request_router import _parent_of

    def pending(xargs):
        return SimpleNamespace(args=[SimpleNamespace(vllm_xargs=xargs)], metadata=SimpleNamespace(session_id="kid"))

    assert _parent_of(pending({"parent_session_id": "lead"})) == "lead"
    assert [_parent_of(p) for p in (pending(None), pending({"parent_session_id": 3}), None,
                                    SimpleNamespace(args=[], metadata=None))] == [None] * 4
