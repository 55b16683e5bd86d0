"""HintClient against a real gRPC hint service on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from saga_sdk import HintClient, HintReader, SagaConfig
from saga_server.core import SessionPhase, SessionTable
from saga_server.rpc import HintServer
from saga_server.serve_child import free_port


def kinds(registry: SessionTable, session_id: str) -> list[str]:
    return [h.kind for h in registry.session(session_id).history]


def test_events_arrive_in_order_per_session(hint_server, registry):
    client = HintClient(endpoint=hint_server.endpoint)
    for sid in ("a", "b"):
        client.session_start(sid, tenant="t1", workflow="w")
    for step in range(1, 4):
        for sid in ("a", "b"):
            client.llm_call_start(sid, step=step, node=f"n{step}")
            client.llm_call_end(sid, step=step)
            client.tool_call_start(sid, "bash", call_id=f"{sid}{step}")
            client.tool_call_end(sid, "bash", call_id=f"{sid}{step}")
    client.session_end("a")
    assert client.flush(5)
    expected = ["session_start"] + ["llm_call_start", "llm_call_end", "tool_call_start", "tool_call_end"] * 3
    assert kinds(registry, "a") == expected + ["session_end"]
    assert kinds(registry, "b") == expected
    snap = registry.session("b")
    assert (snap.steps, snap.tool_calls, snap.current_node, snap.tenant) == (3, 3, "n3", "t1")
    assert registry.session("a").state == SessionPhase.ENDED
    client.close()


def test_events_are_batched(hint_server, registry):
    client = HintClient(endpoint=hint_server.endpoint, flush_interval_s=0.05, batch_size=100)
    for i in range(250):
        client.llm_call_start("s", step=i)
    assert client.flush(5)
    stats = client.stats()
    assert stats.sent == 250
    assert 3 <= stats.batches <= 10  # 250 events in batches of at most 100, not one RPC each
    assert registry.session("s").steps == 250
    client.close()


def test_server_down_emit_never_raises_and_drops_are_counted():
    client = HintClient(endpoint=f"127.0.0.1:{free_port()}", queue_size=100, rpc_timeout_s=0.2)
    worst = 0.0
    for i in range(1000):
        t0 = time.perf_counter()
        client.tool_call_start("s", "bash", call_id=str(i))
        worst = max(worst, time.perf_counter() - t0)
    stats = client.stats()
    assert stats.dropped_full >= 1000 - 100 - 1  # at most the queue (and one batch in flight) kept
    assert stats.sent == 0
    assert worst < 0.05  # no network wait on the caller's thread, even in the worst call
    assert client.flush(0.3) is False
    t0 = time.perf_counter()
    client.close(timeout=0.2)
    assert time.perf_counter() - t0 < 1.0


def test_reconnects_after_the_server_restarts():
    port = free_port()
    registry = SessionTable()
    server = HintServer(registry, f"127.0.0.1:{port}").start()
    client = HintClient(endpoint=f"127.0.0.1:{port}", rpc_timeout_s=0.3)
    client.session_start("s")
    assert client.flush(5)
    server.close(grace=None)

    client.llm_call_start("s", step=1, node="while-down")
    assert client.flush(0.5) is False  # nothing listening
    server = HintServer(registry, f"127.0.0.1:{port}").start()
    try:
        client.llm_call_start("s", step=2, node="after-restart")
        assert client.flush(15)
        snap = registry.session("s")
        assert [h.detail for h in snap.history if h.kind == "llm_call_start"] == ["while-down", "after-restart"]
        assert client.stats().reconnects >= 1
    finally:
        client.close()
        server.close(grace=None)


def test_a_resent_batch_is_applied_once(hint_server, registry):
    from saga_sdk.client import _encode_batch

    batch, _ = _encode_batch("client-x", 7, [("llm_call_start", "s", time.time(), (1, "", ""))])
    first = hint_server.service.ingest(batch)
    again = hint_server.service.ingest(batch)
    assert (first.accepted, first.duplicate) == (1, False)
    assert (again.accepted, again.duplicate) == (0, True)
    assert registry.session("s").steps == 1


def test_a_hint_the_wire_cannot_carry_is_dropped_alone_not_with_its_batch(hint_server, registry):
    client = HintClient(endpoint=hint_server.endpoint, batch_size=64)
    client.session_start("good")
    client.llm_call_start("good", step=1)
    client.llm_call_end("good", step=1, prompt_tokens=-5)  # negative: the wire's field is unsigned
    client.llm_call_end("good", step=1, prompt_tokens=40, output_tokens=2)
    client.session_end("good")
    assert client.flush(5)
    stats = client.stats()
    assert (stats.sent, stats.dropped_failed) == (4, 1)
    assert registry.session("good").state == SessionPhase.ENDED and registry.session("good").steps == 1
    client.close()


def test_session_scope_ends_with_the_right_outcome(hint_server, registry):
    from saga_sdk import current_session

    client = HintClient(endpoint=hint_server.endpoint)
    with client.session("ok-run", workflow="w") as ctx:
        assert current_session() is ctx
        assert ctx.next_step() == 1 and ctx.next_step() == 2
    assert current_session() is None
    with pytest.raises(RuntimeError):
        with client.session("bad-run"):
            raise RuntimeError("agent failed")
    assert client.flush(5)
    assert registry.session("ok-run").history[-1].detail == "completed"
    assert registry.session("bad-run").history[-1].detail == "failed"
    client.close()


def test_a_sessions_turn_deadline_reaches_the_server_and_runs_per_user_turn(hint_server, registry):
    client = HintClient(endpoint=hint_server.endpoint)
    with client.session("chat", workflow="w", turn_deadline_s=30.0):
        assert client.flush(5)
        started = registry.session("chat")
        assert started.deadline_at == pytest.approx(started.started_at + 30.0)
        client.tool_call_start("chat", "human", call_id="reply", category="human")
        assert client.flush(5)
        assert registry.session("chat").deadline_at is None  # its user's turn: nothing runs to be late
    client.close()


def test_sampling_keeps_or_drops_whole_sessions(hint_server, registry):
    client = HintClient(endpoint=hint_server.endpoint, sample_rate=0.5)
    sessions = [f"s{i}" for i in range(200)]
    for sid in sessions:
        client.session_start(sid)
        client.llm_call_start(sid, step=1)
    assert client.flush(5)
    kept = [sid for sid in sessions if registry.session(sid) is not None]
    assert 60 <= len(kept) <= 140
    assert all(registry.session(sid).steps == 1 for sid in kept)  # never half a session
    client.close()


def test_disabled_client_sends_nothing(hint_server, registry):
    client = HintClient(SagaConfig(enabled=False, endpoint=hint_server.endpoint))
    client.session_start("s")
    assert client.flush(1)
    assert registry.session("s") is None
    assert client._thread is None  # no thread, no channel


def test_api_key_is_required_when_configured(registry):
    server = HintServer(registry, "127.0.0.1:0", api_key="sekret").start()
    try:
        wrong = HintClient(endpoint=server.endpoint, api_key="nope")
        wrong.session_start("intruder")
        wrong.flush(5)
        right = HintClient(endpoint=server.endpoint, api_key="sekret")
        right.session_start("member")
        assert right.flush(5)
        assert registry.session("intruder") is None
        assert registry.session("member") is not None
        assert wrong.stats().dropped_failed == 1
        assert server.service.counters["auth_failures"] >= 1
        wrong.close(); right.close()
    finally:
        server.close(grace=None)


def test_many_threads_emit_concurrently(hint_server, registry):
    client = HintClient(endpoint=hint_server.endpoint)

    def agent(n: int) -> None:
        sid = f"t{n}"
        client.session_start(sid)
        for step in range(1, 51):
            client.llm_call_start(sid, step=step)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client.flush(10)
    assert [registry.session(f"t{n}").steps for n in range(8)] == [50] * 8
    client.close()


@pytest.fixture
def hint_service_process():
    """`saga hints` in its own process: like a real agent, the forking process
    then holds only a client channel (gRPC cannot fork a process serving RPCs)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "saga_server.cli", "hints", "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, text=True)
    assert "listening" in proc.stdout.readline()
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_its_own_queue_and_thread(hint_service_process):
    client = HintClient(endpoint=hint_service_process)
    client.session_start("parent")
    assert client.flush(5)
    pid = os.fork()
    if pid == 0:  # child: must not inherit the parent's queue, must be able to send
        ok = client.stats().queued == 0
        client.session_start("child")
        ok = client.flush(5) and client.stats().sent == 1 and ok
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    client.llm_call_start("parent", step=1)
    assert client.flush(5)
    with HintReader(hint_service_process) as reader:
        assert reader.session("child").state == "idle"
        assert reader.session("parent").steps == 1
    client.close()


def test_leaving_a_with_block_closes_the_client_and_shutdown_is_the_same(hint_server, registry):
    with HintClient(endpoint=hint_server.endpoint) as client:
        client.session_start("scoped")
    assert registry.session("scoped") is not None  # flushed on the way out
    assert not client._thread.is_alive()
    legacy = HintClient(endpoint=hint_server.endpoint)
    legacy.session_start("legacy")
    legacy.shutdown()
    assert registry.session("legacy") is not None and not legacy._thread.is_alive()
    client.session_start("too-late")
    legacy.session_start("after")
    assert client.stats().queued == legacy.stats().queued == 0  # dropped: both are closed
