"""Garbage at both of SAGA's surfaces (chaos table rows 3 and 4): the engine's own gRPC
hint service, and `saga proxy`'s HTTP side in front of the real engine.

tests/real/serve already floods the engine with well-formed but meaningless hints
(unknown sessions, ends without starts); this goes below and beside that: bytes
that are not HTTP/2, truncated and oversized frames, messages over the size limit,
hypothesis-generated batches (random strings, the largest numbers, NaN and
infinite seconds, unknown and finished sessions, finished requests' ids), and, on
the HTTP side, what a broken or hostile client sends. Hypothesis runs derandomised
with a bounded number of examples, so every run tries the same inputs.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlsplit

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk import HintClient, HintReader, SagaConfig
from saga_sdk.channel import hint_channel
from tests.support.chaos_table import ChaosRow
from tests.support.faults import exchange, http2_garbage, status_of
from tests.support.http import REQUEST_TIMEOUT_S

FUZZ = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


# -- the gRPC surface -----------------------------------------------------------------------------

def hint_batches(known_ids: list[str], request_ids: list[str], client_id: str):
    """HintBatches leaning towards the valid (so they reach the engine) with every
    field also pushed past its limit."""
    ids = st.sampled_from(known_ids) | st.text(max_size=40) | st.text(min_size=250, max_size=300)
    names = st.sampled_from(["", "bash", "plan", "pytest"]) | st.text(max_size=40) | st.text(min_size=250, max_size=300)
    counts = st.sampled_from([0, 1, 10_000_000, 10_000_001, 2**32 - 1]) | st.integers(0, 2**32 - 1)
    seconds = st.sampled_from([0.0, 1e-9, 5.0, 2_592_000.0, 2_592_001.0]) | st.floats(allow_nan=True,
                                                                                     allow_infinity=True)
    requests = st.sampled_from(request_ids) | st.text(max_size=40)
    structure = st.builds(pb.WorkflowStructure,
                          nodes=st.lists(st.builds(pb.WorkflowNode, name=names,
                                                   kind=st.sampled_from(["", "llm", "tool", "end", "?"])), max_size=6),
                          edges=st.lists(st.builds(pb.WorkflowEdge, src=names, dst=names), max_size=6))
    event = st.one_of(
        st.builds(pb.HintEvent, session_id=ids, client_time=st.floats(), session_start=st.builds(
            pb.SessionStart, tenant=names, workflow=names, deadline_s=seconds, structure=structure)),
        st.builds(pb.HintEvent, session_id=ids, llm_call_start=st.builds(
            pb.LlmCallStart, step=counts, node=names, request_id=requests)),
        st.builds(pb.HintEvent, session_id=ids, llm_call_end=st.builds(
            pb.LlmCallEnd, step=counts, node=names, request_id=requests, prompt_tokens=counts, output_tokens=counts)),
        st.builds(pb.HintEvent, session_id=ids, tool_call_start=st.builds(
            pb.ToolCallStart, tool=names, call_id=names, category=names, expected_duration_s=seconds)),
        st.builds(pb.HintEvent, session_id=ids, tool_call_end=st.builds(
            pb.ToolCallEnd, tool=names, call_id=names, outcome=st.integers(0, 7))),
        st.builds(pb.HintEvent, session_id=ids, session_end=st.builds(pb.SessionEnd, outcome=st.integers(0, 7))),
        st.builds(pb.HintEvent, session_id=ids),  # no kind: a newer client's event
    )
    return st.builds(pb.HintBatch, client_id=st.sampled_from(["", client_id]),
                     sequence=st.sampled_from([0, 1, 2**64 - 1]) | st.integers(0, 2**64 - 1),
                     events=st.lists(event, max_size=40))


def test_garbage_truncated_frames_oversized_and_fuzzed_hints_leave_the_engine_serving(saga_server, server_after,
                                                                                      chaos_row):
    addr, key = saga_server.hint_addr, SagaConfig.from_env().api_key
    host, _, port = addr.rpartition(":")
    tag = uuid.uuid4().hex[:8]
    live, done, sid = f"chaos-fuzz-live-{tag}", f"chaos-fuzz-done-{tag}", f"chaos-fuzz-after-{tag}"
    hints = HintClient(endpoint=addr, flush_interval_s=0.001)
    channel = hint_channel(addr, key, options=[("grpc.max_send_message_length", 64 << 20)])
    stub = hints_pb2_grpc.WorkflowHintsStub(channel)
    used: set[str] = set()
    try:
        with HintReader(addr, timeout=30) as reader:
            before = reader.stats()
        hints.session_start(live, tenant="chaos", workflow="chaos-fuzz")
        hints.session_start(done, tenant="chaos", workflow="chaos-fuzz")
        hints.session_end(done)
        assert hints.flush(30)
        finished = saga_server.chat([{"role": "user", "content": "Say ok."}], max_tokens=2, session_id=live)

        # Bytes that are not a well-formed gRPC call, each on its own connection.
        garbage = http2_garbage(seed=0)
        for name, data in garbage.items():
            exchange(int(port), data, host=host, quiet_s=0.5)
            assert stub.GetStats(pb.GetStatsRequest(), timeout=30).stats, name

        # Over the service's 4 MiB message limit; over its events-per-batch limit.
        with pytest.raises(grpc.RpcError) as err:
            stub.SendHints(pb.HintBatch(events=[pb.HintEvent(session_id="x" * (5 << 20), session_end=pb.SessionEnd())]),
                           timeout=60)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        crowd = pb.HintBatch(events=[pb.HintEvent(session_id=live, llm_call_start=pb.LlmCallStart(step=1))] * 5000)
        ack = stub.SendHints(crowd, timeout=60)
        assert (ack.accepted, ack.rejected) == (0, 5000)

        # Raw bytes as the request of each read-only method, and odd unary requests.
        raw = {m: channel.unary_unary(f"/saga.v1.WorkflowHints/{m}") for m in ("SendHints", "GetSession", "GetStats")}
        for i, data in enumerate([b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", bytes(range(256)), b"\x12\x00" * 50]):
            for method in raw.values():
                try:
                    method(data, timeout=30)
                except grpc.RpcError as exc:  # refused, not broken
                    assert exc.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                                          grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), (i, exc)
        for bad_id in ("", "x" * 300):
            with pytest.raises(grpc.RpcError) as err:
                stub.ReleaseSession(pb.ReleaseSessionRequest(session_id=bad_id), timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportPeerService(pb.PeerService(tenant_tokens={"chaos": float("nan")}), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(stub.ListSessions(pb.ListSessionsRequest(limit=2**32 - 1), timeout=30).sessions) >= 1

        # Hypothesis batches aimed at a live session, a finished one, unknown ones,
        # and a finished request's id.
        examples = []

        @FUZZ
        @given(batch=hint_batches([live, done, f"chaos-fuzz-unknown-{tag}"], [finished["id"], "", "cmpl-0"],
                                  f"chaos-fuzz-{tag}"))
        def fuzz(batch):
            used.update(e.session_id for e in batch.events)
            ack = stub.SendHints(batch, timeout=60)
            assert ack.duplicate or ack.accepted + ack.rejected == len(batch.events)
            assert len(ack.rejections) <= 32
            examples.append(len(batch.events))

        fuzz()

        with HintReader(addr, timeout=30) as reader:
            after = reader.stats()
        assert after["hints_sink_errors"] == before["hints_sink_errors"]  # nothing reached the engine as a crash
        invalid = after["hints_events_invalid"] - before["hints_events_invalid"]
        assert invalid >= 5000

        # A normal hinted session still works, end to end.
        hints.session_start(sid, tenant="chaos", workflow="chaos-fuzz")
        hints.llm_call_start(sid, step=1, node="plan")
        assert hints.flush(30)
        answer = saga_server.chat([{"role": "user", "content": "Say ok."}], max_tokens=4, session_id=sid)
        hints.llm_call_end(sid, step=1, node="plan", prompt_tokens=answer["usage"]["prompt_tokens"])
        hints.tool_call_start(sid, "bash", call_id="t1", category="run")
        assert hints.flush(30)
        with HintReader(addr, timeout=30) as reader:
            state = reader.session(sid)
        assert (state.state, state.steps, [t.tool for t in state.open_tools]) == ("tool", 1, ["bash"])
    finally:
        for s in used | {live, sid}:
            if 0 < len(s) <= 256 and s.isprintable():
                hints.session_end(s)  # what the fuzz left live ends; the rest is refused and counted
        hints.flush(30)
        hints.close(5)
        channel.close()

    chaos_row(ChaosRow(
        f"gRPC fuzz: {len(garbage)} raw byte strings, oversized and over-long batches, {len(examples)} hypothesis "
        f"batches ({sum(examples)} events)", 0, "n/a", 0, server_after() + "; a hinted session works after",
        f"{invalid:.0f} events refused as invalid, 0 sink errors"))


# -- the HTTP surface ----------------------------------------------------------------------------

RAW_QUIET_S = 60.0  # raw requests say Connection: close; a server answers and closes long before this


def request(method: str, path: str, body: bytes = b"", *headers: bytes) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close",
             b"Content-Type: application/json", b"Content-Length: %d" % len(body), *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def split(response: bytes) -> tuple[int | None, bytes]:
    return status_of(response), response.partition(b"\r\n\r\n")[2]


BAD_MODEL = b'{"model": "no-such-model", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}'
# Bad input the proxy passes on untouched: it must come back as the upstream's own answer.
PASSED_ON = {
    "not JSON": request("POST", "/v1/chat/completions", b"{not json"),
    "JSON nested 100k deep": request("POST", "/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000),
    "nested 100k deep in a field": request(
        "POST", "/v1/responses", b'{"model": "no-such-model", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "invalid UTF-8": request("POST", "/v1/messages", b'{"model": "no-such-model", "max_tokens": 1, '
                                                     b'"messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}'),
    "unknown path": request("GET", "/v1/no-such-thing"),
    "unknown POST path": request("POST", "/no/such/thing", b"{}"),
    "wrong method on chat": request("GET", "/v1/chat/completions"),
    "wrong method on models": request("DELETE", "/v1/models"),
    "wrong method on responses": request("PUT", "/v1/responses", b"{}"),
}
# Bad input the proxy reads (a session header, a JSON body): same status as the upstream's.
READ_ON_THE_WAY = {
    "invalid UTF-8 in the session header": request("POST", "/v1/chat/completions", BAD_MODEL,
                                                   b"X-Session-ID: \xff\xfe\x80"),
    "a 64 KiB header": request("POST", "/v1/chat/completions", BAD_MODEL, b"X-Padding: " + b"a" * (64 << 10)),
}


def json_bodies():
    """Agent-request-shaped JSON for the three agent APIs, naming a model the server
    does not have and one output token (so nothing generates, or nothing long)."""
    leaf = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20)
    value = st.recursive(leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                         max_leaves=12)
    part = st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["text", "tool_use", "tool_result", "function_call", "function_call_output",
                                 "message", "input_text", "reasoning", "thinking"]) | value,
        "text": value, "content": value, "id": value, "name": value, "input": value, "tool_use_id": value,
        "call_id": value, "arguments": value, "output": value, "role": value})
    call = st.fixed_dictionaries({}, optional={"id": value, "type": value, "function": value | st.fixed_dictionaries(
        {}, optional={"name": value, "arguments": value})})
    message = st.fixed_dictionaries({}, optional={
        "role": st.sampled_from(["user", "assistant", "system", "tool", "developer"]) | value,
        "content": value | st.lists(part, max_size=3), "tool_calls": value | st.lists(call, max_size=2),
        "tool_call_id": value, "name": value, "type": value, "call_id": value, "output": value})
    history = value | st.lists(message | part, max_size=4)
    return st.fixed_dictionaries({"model": st.just("no-such-model"), "max_tokens": st.just(1),
                                  "max_output_tokens": st.just(1)}, optional={
        "messages": history, "input": history, "instructions": value, "system": value, "tools": value,
        "tool_choice": value, "stream": st.booleans(), "previous_response_id": value, "session_id": value,
        "metadata": value | st.fixed_dictionaries({}, optional={"user_id": value})})


def test_bad_http_gets_clear_errors_and_the_proxy_serves_on(saga_server, make_proxy, server_after, chaos_row):
    proxy = make_proxy(saga_server.openai_url, saga_server.hint_addr, max_body_bytes=1 << 20)
    parts = urlsplit(saga_server.base_url)
    tried = 0

    def direct(data: bytes) -> tuple[int | None, bytes]:
        return split(exchange(parts.port, data, host=parts.hostname, quiet_s=RAW_QUIET_S))

    def proxied(data: bytes) -> bytes:
        answer = exchange(proxy.port, data, quiet_s=RAW_QUIET_S)
        status = status_of(answer)
        assert status is not None and status >= 400, answer[:300]
        assert b"proxy_internal_error" not in answer  # never the proxy's own 500
        return answer

    for name, data in PASSED_ON.items():
        assert split(proxied(data)) == direct(data), name
        tried += 1
    for name, data in READ_ON_THE_WAY.items():
        # The upstream's status; or, should the upstream drop the connection on such a
        # request, the proxy's 502 (or its 4xx, where the drop hid it from a direct call).
        upstream, through = direct(data)[0], status_of(proxied(data))
        assert through in (upstream, 502) or (upstream is None and through < 500), (name, upstream, through)
        tried += 1

    # The proxy's own limits and what never becomes a request.
    # (over a kept-alive connection: the proxy answers before the body is in, then drains it)
    too_big = httpx.post(proxy.url + "/v1/chat/completions", content=b'{"x": "' + b"a" * (2 << 20) + b'"}',
                         headers={"content-type": "application/json"}, timeout=REQUEST_TIMEOUT_S)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"
    assert status_of(exchange(proxy.port, b"\x00\xff\x16\x03 not HTTP at all\r\n\r\n", quiet_s=10)) in (400, None)
    cut = request("POST", "/v1/chat/completions", BAD_MODEL).replace(b"Content-Length: %d" % len(BAD_MODEL),
                                                                      b"Content-Length: 100000")
    assert exchange(proxy.port, cut, quiet_s=1.0) == b""  # the client hangs up mid-body: nothing to answer
    tried += 3

    # Fuzzed agent bodies: the upstream's status, whatever the shape.
    client = httpx.Client(timeout=REQUEST_TIMEOUT_S)
    statuses: dict[int, int] = {}

    @FUZZ
    @given(body=json_bodies(), path=st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/messages"]),
           session=st.sampled_from([None, b"chaos-http-fuzz", b"\xff\xfe"]))
    def fuzz(body, path, session):
        headers = {"content-type": "application/json", **({"x-session-id": session} if session else {})}
        raw = json.dumps(body).encode()
        upstream = client.post(saga_server.base_url + path, content=raw, headers=headers)
        through = client.post(proxy.url + path, content=raw, headers=headers)
        assert through.status_code == upstream.status_code, (path, body, through.text[:300])
        assert "proxy_internal_error" not in through.text
        statuses[through.status_code] = statuses.get(through.status_code, 0) + 1

    try:
        fuzz()
    finally:
        client.close()
    assert proxy.app.errors["internal"] == 0  # no input made session inference fail

    # And an ordinary request afterwards.
    ok = httpx.post(proxy.url + "/v1/chat/completions", timeout=REQUEST_TIMEOUT_S, json={
        "model": saga_server.model, "max_tokens": 4, "temperature": 0, "seed": 0,
        "messages": [{"role": "user", "content": "Say ok."}]})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None

    chaos_row(ChaosRow(
        f"HTTP fuzz at the proxy: {tried} hand-made bad requests, {sum(statuses.values())} hypothesis bodies", 0, "n/a",
        0, server_after() + "; the proxy serves an ordinary request after",
        f"0 proxy 500s, 0 internal errors; upstream statuses {dict(sorted(statuses.items()))}; "
        "413 over max_body_bytes"))
