"""`saga proxy` between the real OpenAI SDK and a scripted OpenAI-compatible upstream,
with a real gRPC hint service: pass-through, sessions, tool boundaries, failures."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading

import httpx
import openai
import pytest

from saga_sdk import HintClient
from saga_server.core import SessionPhase
from saga_server.proxy import ProxyConfig, SagaProxy, SessionTracker, send_hint
from tests.fast.proxy.agents import SECRET, kinds, session_ids, tool_events


TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} tool",
                                           "parameters": {"type": "object", "properties": {}}}}
         for name in ("get_user", "search", "book")]
SYSTEM = {"role": "system", "content": "You are an airline agent."}


def sdk(server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=SECRET, max_retries=0, **kw)


def run_agent(client: openai.OpenAI, plan: str, *, stream: bool = False, **create_kw) -> list:
    """A plain OpenAI-SDK tool loop, as an unchanged agent would write it."""
    messages = [SYSTEM, {"role": "user", "content": f"plan: {plan}"}]
    for _ in range(10):
        if stream:
            message = _streamed_message(client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS, stream=True, **create_kw))
        else:
            message = client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                     **create_kw).choices[0].message
        messages.append(message)  # the SDK's own object goes back in, as agents do
        calls = message.get("tool_calls") if isinstance(message, dict) else message.tool_calls
        if not calls:
            return messages
        for call in calls:
            call_id = call["id"] if isinstance(call, dict) else call.id
            messages.append({"role": "tool", "tool_call_id": call_id, "content": "{\"ok\": true}"})
    raise AssertionError("agent did not finish")


def _streamed_message(stream) -> dict:
    text, calls = [], {}
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
            for tc in choice.delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": "", "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.id or slot["id"]
                if tc.function and tc.function.name:
                    slot["function"]["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    slot["function"]["arguments"] += tc.function.arguments
    message = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


AGENT_HISTORY = ["session_start",
                 "llm_call_start", "llm_call_end", "tool_call_start", "tool_call_start",
                 "tool_call_end", "tool_call_end",
                 "llm_call_start", "llm_call_end", "tool_call_start", "tool_call_end",
                 "llm_call_start", "llm_call_end"]


# -- pass-through ----------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"model": "m", "messages": [{"role": "user", "content": "plan: tools get_user,search"}], "tools": TOOLS},
    {"model": "m", "messages": [{"role": "user", "content": "hello"}]},
])
def test_non_streaming_answer_is_byte_identical(proxy, upstream, body):
    direct = httpx.post(upstream.url + "/v1/chat/completions", json=body)
    proxied = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {SECRET}"})
    assert proxied.status_code == direct.status_code == 200
    assert proxied.content == direct.content
    assert proxied.headers["content-type"] == direct.headers["content-type"]


def test_streaming_answer_is_byte_identical(proxy, upstream):
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "plan: tools get_user,search"}], "tools": TOOLS}
    with httpx.stream("POST", upstream.url + "/v1/chat/completions", json=body) as r:
        direct = b"".join(r.iter_raw())
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        proxied = b"".join(r.iter_raw())
    assert proxied == direct
    assert proxied.count(b"data: ") > 5 and proxied.endswith(b"data: [DONE]\n\n")


def test_stream_chunks_pass_before_the_upstream_finishes(proxy, upstream):
    """The upstream holds its stream after the first chunk until the gate opens: the
    client must see that chunk while the gate is still shut (no buffering)."""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "plan: gate"}]}
    gate = upstream.app.state.gate
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=60) as r:
        chunks = r.iter_raw()
        first = next(chunks)
        assert b'"role": "assistant"' in first
        assert not gate.is_set()
        gate.set()
        rest = b"".join(chunks)
    assert rest.endswith(b"data: [DONE]\n\n")


def test_other_routes_pass_through(proxy, upstream):
    client = sdk(proxy)
    assert [m.id for m in client.models.list()] == ["scripted-agent-model"]
    assert httpx.get(proxy.url + "/health").text == "ok"
    missing = httpx.get(proxy.url + "/v1/nowhere?x=1")
    assert missing.status_code == 404 and missing.content == httpx.get(upstream.url + "/v1/nowhere?x=1").content


def test_one_callers_cookies_never_reach_another(proxy):
    first = httpx.get(proxy.url + "/set-cookie?who=alice")
    assert first.headers["set-cookie"].startswith("upstream_affinity=alice")  # passed back to alice
    for _ in range(2 * proxy.app.config.upstream_pools):  # through every upstream pool
        seen = httpx.get(proxy.url + "/echo-headers").json()  # a fresh caller without cookies
        assert "cookie" not in seen
        assert seen["host"] == proxy.app._origin.split("//")[1]


# -- sessions and tool boundaries --------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_tool_calling_agent_is_one_session_with_its_tools(proxy, upstream, registry, stream):
    messages = run_agent(sdk(proxy), "tools get_user,search | tools book | answer", stream=stream)
    last = messages[-1]
    assert (last["content"] if isinstance(last, dict) else last.content).strip() == "done after 2 steps"
    ids = session_ids(upstream)
    assert len(ids) == 3 and len(set(ids)) == 1 and ids[0].startswith("px-")
    assert [r["body"]["session_id"] for r in upstream.app.state.requests] == ids
    assert proxy.app.hints.flush(5)
    sid = ids[0]
    assert kinds(registry, sid) == AGENT_HISTORY
    assert tool_events(registry, sid) == [("tool_call_start", "get_user"), ("tool_call_start", "search"),
                                          ("tool_call_end", "get_user"), ("tool_call_end", "search"),
                                          ("tool_call_start", "book"), ("tool_call_end", "book")]
    assert registry.session(sid).open_tools == ()


def test_next_request_sent_at_done_finds_the_answer_learnt(proxy, upstream, registry):
    """The agent sends its next step the moment it reads [DONE], while the upstream
    still holds the stream open: the proxy must have learnt the answer by then."""
    messages = [SYSTEM, {"role": "user", "content": "plan: tools get_user linger | answer"}]
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", timeout=30,
                      json={"model": "m", "stream": True, "messages": messages, "tools": TOOLS}) as r:
        events = []
        for line in r.iter_lines():
            if line == "data: [DONE]":
                break
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
        call = events[1]["choices"][0]["delta"]["tool_calls"][0]
        args = "".join(e["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments", "")
                       for e in events if e["choices"] and e["choices"][0]["delta"].get("tool_calls"))
        answer = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": "get_user", "arguments": args}}]}
        second = httpx.post(proxy.url + "/v1/chat/completions", timeout=30, json={
            "model": "m", "messages": messages + [answer, {"role": "tool", "tool_call_id": call["id"], "content": "x"}]})
        assert second.status_code == 200
    ids = session_ids(upstream)
    assert len(ids) == 2 and ids[0] == ids[1]
    assert proxy.app.hints.flush(5)
    assert kinds(registry, ids[0]) == ["session_start", "llm_call_start", "llm_call_end", "tool_call_start",
                                       "tool_call_end", "llm_call_start", "llm_call_end"]


def test_interleaved_agents_get_their_own_sessions(proxy, upstream, registry):
    """Three agents with the same system prompt and tools, run step by step in turn."""
    client = sdk(proxy)
    plans = ["tools get_user | tools search,book | answer", "tools search | answer", "tools book,book | tools get_user | answer"]
    histories = [[SYSTEM, {"role": "user", "content": f"plan: {p}"}] for p in plans]
    owner: list[int] = []
    done = [False] * len(plans)
    while not all(done):
        for i, messages in enumerate(histories):
            if done[i]:
                continue
            message = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
            owner.append(i)
            messages.append(message)
            for call in message.tool_calls or ():
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})
            done[i] = not message.tool_calls
    ids = session_ids(upstream)
    by_agent = {i: {sid for sid, o in zip(ids, owner) if o == i} for i in range(len(plans))}
    assert all(len(s) == 1 for s in by_agent.values())
    assert len(set.union(*by_agent.values())) == 3
    assert proxy.app.hints.flush(5)
    sid = next(iter(by_agent[2]))
    assert [d for k, d in tool_events(registry, sid) if k == "tool_call_start"] == ["book", "book", "get_user"]
    assert registry.session(sid).steps == 3


def test_explicit_session_ids_win(proxy, upstream):
    client = sdk(proxy)
    run_agent(client, "tools get_user | answer", extra_headers={"X-Session-ID": "mine-1"})
    run_agent(client, "tools get_user | answer", extra_headers={"Helicone-Session-Id": "helicone-7"})
    run_agent(client, "tools search | answer", extra_body={"session_id": "body-3"})
    requests = upstream.app.state.requests
    assert session_ids(upstream) == ["mine-1"] * 2 + ["helicone-7"] * 2 + ["body-3"] * 2
    assert [r["body"]["session_id"] for r in requests] == session_ids(upstream)


@pytest.mark.parametrize("sid", ["a\r\nX-Injected: 1", "tab\there", "\x01", " padded "])
def test_a_body_session_id_that_is_no_header_value_never_breaks_the_request(proxy, upstream, sid):
    """The id still names the session, but only a valid header value goes into the
    forwarded X-Session-ID: the upstream gets the request the agent sent."""
    body = {"model": "m", "session_id": sid, "messages": [{"role": "user", "content": "plan: answer"}]}
    direct = httpx.post(upstream.url + "/v1/chat/completions", json=body)
    proxied = httpx.post(proxy.url + "/v1/chat/completions", json=body)
    assert (proxied.status_code, proxied.json()) == (direct.status_code, direct.json()) == (200, direct.json())
    forwarded = upstream.app.state.requests[-1]
    assert forwarded["body"]["session_id"] == sid and "x-injected" not in forwarded["headers"]
    assert forwarded["headers"].get("x-session-id") == (sid.strip() if sid.strip().isprintable() else None)
    assert proxy.app.errors == dict.fromkeys(proxy.app.errors, 0)


def test_completions_are_tagged_only_with_an_explicit_id(proxy, upstream):
    client = sdk(proxy)
    client.completions.create(model="m", prompt="hello")
    client.completions.create(model="m", prompt="hello", extra_headers={"X-Session-ID": "c-1"})
    first, second = upstream.app.state.requests
    assert "x-session-id" not in first["headers"] and "session_id" not in first["body"]
    assert second["headers"]["x-session-id"] == "c-1" and second["body"]["session_id"] == "c-1"


def test_idle_sessions_end_with_their_open_tools_cancelled(upstream, hint_server, registry, make_proxy):
    server = make_proxy(upstream.url + "/v1", hint_server.endpoint, idle_ttl_s=0.2)
    sdk(server).chat.completions.create(model="m", tools=TOOLS,
                                        messages=[SYSTEM, {"role": "user", "content": "plan: tools search"}])
    sid = session_ids(upstream)[0]
    for _ in range(200):  # the proxy's expiry sweep runs every idle_ttl_s / 4
        server.app.hints.flush(5)
        if registry.session(sid).state == SessionPhase.ENDED:
            break
        threading.Event().wait(0.05)
    assert kinds(registry, sid)[-2:] == ["tool_call_end", "session_end"]
    assert server.app.tracker.session_ids() == []


# -- failures ----------------------------------------------------------------------------

def test_hint_service_down_changes_nothing_for_the_agent(upstream, make_proxy, dead_address):
    server = make_proxy(upstream.url + "/v1", dead_address)
    messages = run_agent(sdk(server), "tools get_user,search | tools book | answer")
    assert messages[-1].content == "done after 2 steps"
    assert len(set(session_ids(upstream))) == 1
    assert server.app.hints.flush(0.3) is False  # the hints had nowhere to go


def test_upstream_error_comes_back_unchanged(proxy, upstream):
    body = {"model": "m", "messages": [{"role": "user", "content": "plan: error 503"}]}
    direct = httpx.post(upstream.url + "/v1/chat/completions", json=body)
    proxied = httpx.post(proxy.url + "/v1/chat/completions", json=body)
    assert proxied.status_code == direct.status_code == 503
    assert proxied.content == direct.content
    with pytest.raises(openai.BadRequestError) as err:
        sdk(proxy).chat.completions.create(model="m", messages=[{"role": "user", "content": "plan: error 400"}])
    assert err.value.status_code == 400 and "scripted failure 400" in str(err.value)


@pytest.mark.parametrize("raw", [b"{not json", b'{"model": "m"}', b"[1, 2]", b"[" * 100_000 + b"]" * 100_000,
                                 b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}'],
                         ids=["not-json", "no-messages", "not-an-object", "nested-too-deep", "invalid-utf8"])
def test_bad_requests_get_the_upstreams_error(proxy, upstream, raw):
    headers = {"content-type": "application/json"}
    direct = httpx.post(upstream.url + "/v1/chat/completions", content=raw, headers=headers)
    proxied = httpx.post(proxy.url + "/v1/chat/completions", content=raw, headers=headers)
    assert direct.status_code >= 400
    assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content)
    assert proxy.app.errors["internal"] == 0


def test_a_request_cut_off_by_its_client_is_not_forwarded(proxy, upstream):
    """Content-Length promises more than the client sends before it hangs up: the
    part that came (valid JSON on its own) must not reach the upstream as a request."""
    part = b'{"model": "m", "messages": [{"role": "user", "content": "plan: answer"}]}'
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (len(part) + 100) + part)
    whole = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": "plan: answer"}, {"role": "assistant", "content": "x"},
        {"role": "user", "content": "after the cut"}]})
    assert whole.status_code == 200
    threading.Event().wait(0.3)  # the cut request was handled long before; give a wrong forward time to land
    assert [r["body"]["messages"][-1]["content"] for r in upstream.app.state.requests] == ["after the cut"]
    assert proxy.app.errors["internal"] == 0


def test_oversized_body_gets_a_clear_proxy_error(upstream, hint_server, make_proxy):
    server = make_proxy(upstream.url + "/v1", hint_server.endpoint, max_body_bytes=1000)
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 413
    assert "saga proxy" in r.json()["error"]["message"]
    assert upstream.app.state.requests == []


def test_unreachable_upstream_gets_a_clear_error_and_the_proxy_lives_on(hint_server, make_proxy, dead_address):
    server = make_proxy(f"http://{dead_address}/v1", hint_server.endpoint)
    client = sdk(server)
    for _ in range(3):
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 502
        assert "saga proxy" in err.value.message and "unreachable" in err.value.message
    assert server.app.errors["upstream_unreachable"] == 3
    assert server.app.upstream_retries == 3  # each tried twice, then answered 502


class HangsUpOnce:
    """A raw HTTP/1.1 upstream on loopback that reads the first request sent to it and
    closes the connection without a byte of answer (an upstream closing a keep-alive
    connection as a request goes out); every later one gets `answer`."""

    def __init__(self, answer: dict) -> None:
        self.body = json.dumps(answer).encode()
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length:")))
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.requests += 1
                if self.requests > 1:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(self.body), self.body))

    def close(self) -> None:
        self._listener.close()


def test_a_connection_closed_before_any_answer_is_retried_once_and_the_agent_sees_no_error(hint_server, make_proxy):
    answer = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    upstream = HangsUpOnce(answer)
    try:
        server = make_proxy(upstream.url + "/v1", hint_server.endpoint)
        reply = sdk(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        upstream.close()
    assert reply.choices[0].message.content == "hi"
    assert upstream.requests == 2 and server.app.upstream_retries == 1
    assert server.app.errors == dict.fromkeys(server.app.errors, 0)


def test_broken_stream_ends_the_call_and_the_proxy_serves_on(proxy, upstream, registry):
    client = sdk(proxy)
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in client.chat.completions.create(model="m", stream=True,
                                                messages=[{"role": "user", "content": "plan: break"}]):
            pass
    messages = run_agent(client, "tools search | answer")
    assert messages[-1].content == "done after 1 steps"
    assert proxy.app.hints.flush(5)
    broken = session_ids(upstream)[0]
    assert kinds(registry, broken) == ["session_start", "llm_call_start", "llm_call_end"]


def test_client_going_away_mid_stream_closes_the_call(proxy, upstream, registry):
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "plan: gate"}]}
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=60) as r:
        next(r.iter_raw())
    upstream.app.state.gate.set()  # let the abandoned upstream stream finish
    sid = session_ids(upstream)[0]
    for _ in range(100):
        proxy.app.hints.flush(5)
        if kinds(registry, sid)[-1] == "llm_call_end":
            break
        threading.Event().wait(0.05)
    assert kinds(registry, sid) == ["session_start", "llm_call_start", "llm_call_end"]


def test_the_api_key_never_reaches_logs_or_hints(upstream, hint_server, registry, caplog, make_proxy,
                                                 dead_address):
    caplog.set_level(logging.DEBUG)
    server = make_proxy(upstream.url + "/v1", hint_server.endpoint)
    client = sdk(server)
    run_agent(client, "tools get_user | answer")
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "plan: error 500"}])
    assert server.app.hints.flush(5)
    assert upstream.app.state.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"  # forwarded
    dump = json.dumps([{"id": s.session_id, "tenant": s.tenant, "workflow": s.workflow,
                        "history": [h.detail for h in s.history]}
                       for s in (registry.session(sid) for sid in set(session_ids(upstream)))])
    assert SECRET not in dump and SECRET not in caplog.text
    bad = make_proxy(f"http://user:{SECRET}@{dead_address}/v1", hint_server.endpoint)
    r = httpx.post(bad.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 502 and SECRET not in r.text and SECRET not in caplog.text


def test_leaving_an_async_with_block_ends_the_proxys_sessions(upstream, hint_server, registry):
    """A proxy driven without an ASGI server (no lifespan) still closes cleanly."""
    hints = HintClient(endpoint=hint_server.endpoint)
    tracker = SessionTracker()
    _, started = tracker.begin({"messages": [SYSTEM, {"role": "user", "content": "hi"}]},
                               {"x-session-id": "direct"})
    for hint in started:
        send_hint(hints, hint.event)

    async def scenario():
        async with SagaProxy(ProxyConfig(upstream=upstream.url + "/v1"), hints=hints, tracker=tracker):
            pass

    asyncio.run(scenario())
    assert hints.flush(5)
    hints.close()
    assert tracker.session_ids() == []
    assert registry.session("direct").state == SessionPhase.ENDED


def test_a_last_request_marker_reaches_the_upstream_in_the_header_it_reads_with_x_session_id(proxy, upstream):
    client = sdk(proxy)
    run_agent(client, "tools get_user | answer", extra_headers={"x-dynamo-session-id": "dyn-1"})
    run_agent(client, "answer", extra_headers={"x-dynamo-session-id": "dyn-1", "x-dynamo-session-final": "true"})
    run_agent(client, "answer", extra_headers={"X-Session-ID": "plain", "x-saga-session-final": "no"})
    marks = [(r["headers"].get("x-session-id"), r["headers"].get("x-saga-session-final"))
             for r in upstream.app.state.requests]
    assert marks == [("dyn-1", None), ("dyn-1", None), ("dyn-1", "true"), ("plain", None)]
