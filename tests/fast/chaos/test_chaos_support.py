"""The chaos suite's own tools (tests/support: chaos_table, faults, loads), on loopback
against the fast tier's scripted upstream and in-process hint services."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import grpc
import httpx
import openai
import pytest

from saga_proto import hints_pb2 as pb
from saga_sdk import HintClient, HintReader, SagaUnavailable, UnknownSession
from saga_server.core import SessionPhase, WorkflowCore
from saga_server.proxy.server import BackgroundServer
from saga_server.rpc import HintServer
from tests.fast.proxy.scripted_upstream import build_app
from tests.support.chaos_table import ChaosRow, ChaosTable, added_median, percentiles
from tests.support.faults import CuttingRelay, HintServiceProcess, exchange, http2_garbage, status_of
from tests.support.loads import TOOL_PLAN, HintFlood, Phases, flood_hints, flood_with_client, run_agents, tool_agent
from tests.support.processes import listening_pid


@pytest.fixture(scope="module")
def upstream():
    app = build_app()
    with BackgroundServer(app) as server:
        server.app = app
        yield server


# -- the table ------------------------------------------------------------------------------

def test_the_table_has_a_header_and_one_line_per_row_in_order():
    table = ChaosTable()
    assert table.lines() == []
    table.add(ChaosRow("hint service killed", 0, "+3 ms (+1.0%)", 0, "serves"))
    table.add(ChaosRow("flood", 1, "n/a", 2, "serves", "90k events/s"))
    lines = table.lines()
    assert lines[0] == "| case | agent errors | added median latency | lost responses | server after | notes |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2:] == ["| hint service killed | 0 | +3 ms (+1.0%) | 0 | serves |  |",
                         "| flood | 1 | n/a | 2 | serves | 90k events/s |"]


def test_percentiles_and_added_median():
    assert percentiles([0.3, 0.1, 0.2]) == (0.2, 0.3)
    assert percentiles([float(i) for i in range(1, 101)]) == (50.5, 99.0)
    assert added_median([0.100, 0.200, 0.300], [0.250, 0.260, 0.990]) == "+60 ms (+30.0%)"
    assert added_median([0.2], [0.1]) == "-100 ms (-50.0%)"
    assert added_median([], [0.1]) == "n/a"


# -- faults -----------------------------------------------------------------------------------

def test_a_killed_hint_service_comes_back_on_its_port_empty_and_takes_hints_again():
    with HintServiceProcess() as service:
        client = HintClient(endpoint=service.endpoint, flush_interval_s=0.001, rpc_timeout_s=0.5)
        try:
            client.session_start("before", workflow="w")
            assert client.flush(10)
            assert HintReader(service.endpoint).session("before").workflow == "w"
            service.kill()
            with pytest.raises(SagaUnavailable):
                HintReader(service.endpoint, timeout=0.5).stats()
            client.session_start("during", workflow="w")  # never blocks; retried with backoff
            service.start()
            client.session_start("after", workflow="w")
            assert client.flush(30)
            reader = HintReader(service.endpoint)
            with pytest.raises(UnknownSession):
                reader.session("before")  # a new process: what the old one knew is gone
            assert reader.session("during").state != "ended" and reader.session("after").workflow == "w"
            assert service.starts == 2 and service.running
        finally:
            client.close(1)
    assert not service.running


def sse_events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


def streamed(url: str) -> tuple[bytes, Exception | None]:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "one two three four five six"}]}
    got = bytearray()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as response:
            for chunk in response.iter_raw():
                got += chunk
    except httpx.HTTPError as exc:
        return bytes(got), exc
    return bytes(got), None


def test_the_relay_passes_answers_through_and_kills_the_armed_exchange(upstream):
    with CuttingRelay(upstream.url) as relay:
        whole, error = streamed(relay.url)
        assert error is None and whole == streamed(upstream.url)[0]
        assert sse_events(whole)[-1] == b"data: [DONE]" and len(sse_events(whole)) > 4

        relay.cut_next(events=3)
        cut, error = streamed(relay.url)
        # A broken stream, not a clean end: a close mid-body, or a reset where the close
        # overtook bytes still in flight (on a loaded machine).
        assert isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError))
        third = whole.index(b"\n\n", whole.index(b"\n\n", whole.index(b"\n\n") + 2) + 2) + 2
        assert cut == whole[:third]  # three events, not a byte of the fourth

        relay.hang_up_next()
        # closed unanswered; a reset instead when the request's body arrived after the close
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            httpx.post(relay.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=30)

        again, error = streamed(relay.url)  # disarmed: whole again
        assert error is None and again == whole
        assert relay.faults == 2


def test_garbage_on_a_grpc_port_leaves_the_service_answering():
    with HintServer(WorkflowCore(), "127.0.0.1:0") as server:
        garbage = http2_garbage(seed=1)
        assert len(garbage) >= 8 and garbage == http2_garbage(seed=1)
        for name, data in garbage.items():
            exchange(server.port, data, quiet_s=0.5)
            assert "hints_batches" in HintReader(server.endpoint).stats(), name


def test_exchange_reads_a_raw_http_answer(upstream):
    answer = exchange(upstream.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 200 and b"scripted-agent-model" in answer
    assert status_of(b"") is None and status_of(b"\x00garbage") is None


# -- loads ------------------------------------------------------------------------------------

def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)


def test_a_tool_agent_calls_the_forced_tool_each_step(upstream):
    run = tool_agent(sdk(upstream), "m", "Customer 1: fly me to Rome.")
    assert [[name for name, _ in step] for step in run.answers] == [[t] for t in TOOL_PLAN]
    assert len(run.latencies_s) == len(TOOL_PLAN) and all(s > 0 for s in run.latencies_s)
    chat = [r["body"] for r in upstream.app.state.requests if r["path"].endswith("/chat/completions")][-1]
    assert chat["temperature"] == 0 and chat["tool_choice"] == {"type": "function", "function": {"name": TOOL_PLAN[-1]}}
    assert chat["tools"][0]["function"]["parameters"]["properties"]["city"]["enum"]


def test_phases_hold_every_agent_at_the_boundary_while_the_conductor_acts(upstream):
    upstream.app.state.requests.clear()
    phases = Phases(2, at=[2], timeout_s=10)
    seen_at_boundary = []

    def conduct():
        phases.arrived()
        seen_at_boundary.append(len(upstream.app.state.requests))  # both agents did steps 0 and 1, no more
        phases.release()
        seen_at_boundary.append("released")

    conductor = threading.Thread(target=conduct)
    conductor.start()
    results, errors = run_agents([lambda i=i: tool_agent(sdk(upstream), "m", f"Customer {i}",
                                                         before_step=phases.before_step) for i in range(2)],
                                 on_error=phases.abort)
    conductor.join(30)
    assert errors == [] and seen_at_boundary == [4, "released"]
    assert all(len(r.answers) == len(TOOL_PLAN) for r in results)


def test_a_failing_agent_is_reported_and_releases_the_others():
    phases = Phases(2, at=[1], timeout_s=30)

    def failing():
        raise ConnectionError("upstream gone")

    def waiting():
        phases.before_step(1)  # the barrier breaks instead of waiting 30 s
        return "unreachable"

    results, errors = run_agents([failing, waiting], on_error=phases.abort)
    assert results == [None, None]
    assert errors[0] == "agent 0: ConnectionError: upstream gone" and "BrokenBarrierError" in errors[1]


def test_a_flood_is_accepted_whole_and_its_sessions_end():
    core = WorkflowCore()
    with HintServer(core, "127.0.0.1:0") as server:
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        result = flood_hints(server.endpoint, stop, name="flood-a", sessions=8)
        assert result.offered == result.accepted > 8 * 4 * 2 and result.rejected == result.shed == 0
        assert result.seconds >= result.offer_s > 0 and result.accepted_rate > 0
        assert {core.session(f"flood-a-{i}").state for i in range(8)} == {SessionPhase.ENDED}
        assert core.session("flood-a-0").workflow == "chaos-flood"
        assert core.session("flood-a-0").steps == (result.accepted - 2 * 8) // (4 * 8)  # one step per cycle


def test_a_paced_flood_offers_its_rate_and_sheds_what_the_stream_did_not_take():
    core = WorkflowCore()
    with HintServer(core, "127.0.0.1:0") as server:
        stop = threading.Event()
        threading.Timer(1.0, stop.set).start()
        paced = flood_hints(server.endpoint, stop, name="flood-p", sessions=8, rate=3200)  # 100 cycles/s
        assert paced.rejected == 0
        assert 0.6 * 3200 <= paced.offered - 2 * 8 <= 1.2 * 3200  # about a second's worth, not as fast as taken
        assert paced.shed <= 0.1 * paced.offered and 0.8 <= paced.offer_s <= 1.2  # a service that keeps up

        # A service that takes nothing for a second, then at once whatever comes:
        # what fell due in that second, beyond what the transport buffers, is shed,
        # not sent late.
        opened = threading.Event()
        threading.Timer(1.0, opened.set).start()

        def ingest(batch, credentials=None):
            opened.wait(30)
            return pb.HintAck(sequence=batch.sequence, accepted=len(batch.events))

        server.service.ingest = ingest
        stop = threading.Event()
        threading.Timer(2.0, stop.set).start()
        behind = flood_hints(server.endpoint, stop, name="flood-s", rate=1_000_000)  # 128 sessions: 15 kB cycles
        assert behind.rejected == 0 and 1.5e6 <= behind.offered <= 2.5e6
        assert behind.shed >= 0.25 * behind.offered and behind.accepted > 0


def test_a_client_flood_never_waits_and_counts_what_it_shed():
    core = WorkflowCore()
    with HintServer(core, "127.0.0.1:0") as server:
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        result = flood_with_client(server.endpoint, stop, name="flood-c", sessions=4)
        assert result.offered > 0 and result.accepted > 0 and result.rejected == 0
        assert result.shed == result.offered - result.accepted >= 0
        assert {core.session(f"flood-c-{i}").state for i in range(4)} == {SessionPhase.ENDED}

        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        paced = flood_with_client(server.endpoint, stop, name="flood-d", sessions=4, rate=2048)
        assert 512 <= paced.offered - 4 <= 2048  # bursts of 512 at 2048 events/s for half a second


def test_a_process_flood_runs_its_clients_apart_and_collects_each_result():
    core = WorkflowCore()
    with HintServer(core, "127.0.0.1:0") as server:
        with HintFlood(server.endpoint, name="flood-m", streams=2, stream_rate=None, clients=1,
                       client_rate=None, max_s=30) as flood:
            deadline = time.monotonic() + 30
            while core.stats()["events_accepted"] < 20_000 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert len(flood.streams) == 2 and len(flood.clients) == 1 and flood.results == flood.streams + flood.clients
        assert all(r.accepted > 0 and r.rejected == 0 for r in flood.results)
        assert all(r.shed == 0 for r in flood.streams)  # unpaced: a stream sends only what it is taken
        # each result is its own client's: cycles of 512 and 128 starts and ends; bursts of 512 and 64 ends
        assert [r.offered % 512 for r in flood.results] == [256, 256, 64]
        assert core.stats()["events_accepted"] == sum(r.accepted for r in flood.results)
        assert {core.session(f"flood-m-{i}-0").state for i in range(2)} == {SessionPhase.ENDED}
        assert core.session("flood-m-c0-0").state == SessionPhase.ENDED


def test_a_process_flood_that_fails_says_why():
    with pytest.raises(RuntimeError, match="flood clients failed"):
        with HintFlood("127.0.0.1:1", name="nowhere", streams=1, clients=0, max_s=1):
            pass


def test_a_flood_to_a_dead_service_fails_loudly():
    """flood_hints is a load generator, not an agent: a missing service is an error."""
    with pytest.raises(grpc.RpcError):
        flood_hints("127.0.0.1:1", threading.Event(), name="nowhere", max_s=1)


def test_tool_arguments_are_compared_parsed(upstream):
    run = tool_agent(sdk(upstream), "m", "Customer 2", plan=TOOL_PLAN[:1])
    ((name, arguments),) = run.answers[0]
    assert name == TOOL_PLAN[0] and arguments == json.loads(json.dumps(arguments)) and isinstance(arguments, dict)


# -- the server's process --------------------------------------------------------------------

def listener(family: int = socket.AF_INET) -> socket.socket:
    s = socket.socket(family)
    s.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
    s.listen()
    return s


def test_the_process_listening_on_a_port_is_found():
    with listener() as s:
        assert listening_pid(s.getsockname()[1]) == os.getpid()
    if socket.has_ipv6:
        try:
            six = listener(socket.AF_INET6)
        except OSError:
            pytest.skip("no IPv6 loopback")
        with six:
            assert listening_pid(six.getsockname()[1]) == os.getpid()


def test_a_childs_listener_is_the_childs_and_an_inherited_one_its_parents():
    code = "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert listening_pid(int(child.stdout.readline())) == child.pid
    finally:
        child.kill()
        child.wait()
    with listener() as s:
        heir = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=[s.fileno()])
        try:
            assert listening_pid(s.getsockname()[1]) == os.getpid()  # not the child that holds it too
        finally:
            heir.kill()
            heir.wait()


def test_a_port_without_a_listener_has_no_process():
    with listener() as s, socket.create_connection(s.getsockname()) as client:
        assert listening_pid(client.getsockname()[1]) is None  # connected, not listening
