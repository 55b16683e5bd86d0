"""`saga proxy` on the Responses and Anthropic Messages APIs, and for agents whose tool
calls are text: the real OpenAI and Anthropic SDKs against the scripted upstream,
hints read back from a real hint service."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from saga_server.core import SessionPhase
from tests.fast.proxy.agents import (INSTRUCTIONS, MESSAGES_TOOLS, RESPONSES_TOOLS, SECRET, kinds,
                                     run_messages_agent, run_responses_agent, run_text_agent, session_ids,
                                     tool_events)

anthropic = pytest.importorskip("anthropic")

PLAN = "tools get_user,search | tools book | answer"
LOOP = ["session_start",
        "llm_call_start", "llm_call_end", "tool_call_start", "tool_call_start", "tool_call_end", "tool_call_end",
        "llm_call_start", "llm_call_end", "tool_call_start", "tool_call_end",
        "llm_call_start", "llm_call_end"]
TOOLS_SEEN = [("tool_call_start", "get_user"), ("tool_call_start", "search"),
              ("tool_call_end", "get_user"), ("tool_call_end", "search"),
              ("tool_call_start", "book"), ("tool_call_end", "book")]


def openai_sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=SECRET, max_retries=0)


def anthropic_sdk(server):
    return anthropic.Anthropic(base_url=server.url, api_key=SECRET, max_retries=0)


def one_session(proxy, upstream, registry) -> str:
    ids = session_ids(upstream)
    assert len(set(ids)) == 1 and ids[0].startswith("px-"), ids
    assert proxy.app.hints.flush(5)
    return ids[0]


def read_until(stream, marker: bytes) -> tuple[bytes, list[dict]]:
    """A stream's bytes up to the chunk holding `marker` (an answer's end), and its events."""
    raw = b""
    for chunk in stream.iter_raw():
        raw += chunk
        if marker in raw:
            break
    return raw, [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]


# -- Responses API ---------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("store", [False, True], ids=["resent-history", "previous-response-id"])
def test_responses_tool_loop_is_one_session_with_its_tools(proxy, upstream, registry, stream, store):
    responses = run_responses_agent(openai_sdk(proxy), PLAN, stream=stream, store=store)
    assert responses[-1].output_text.strip() == "done after 2 steps"
    requests = upstream.app.state.requests
    assert len(requests) == 3
    assert ("previous_response_id" in requests[1]["body"]) is store
    sid = one_session(proxy, upstream, registry)
    assert [r["body"]["session_id"] for r in requests] == [sid] * 3  # vLLM's ResponsesRequest field
    assert kinds(registry, sid) == LOOP
    assert tool_events(registry, sid) == TOOLS_SEEN
    assert registry.session(sid).open_tools == ()
    rules = proxy.app.tracker.stats().by_rule
    assert rules["previous" if store else "answer"] == 2


def test_responses_agents_interleaved_on_previous_ids_stay_apart(proxy, upstream, registry):
    """Two agents with the same words, one step each in turn: only the response id each
    continues tells them apart (their inputs are identical function-call outputs)."""
    client = openai_sdk(proxy)
    first = [client.responses.create(model="m", instructions=INSTRUCTIONS, tools=RESPONSES_TOOLS,
                                     input=f"plan: tools search | answer {i}") for i in range(2)]
    follow = [client.responses.create(model="m", instructions=INSTRUCTIONS, tools=RESPONSES_TOOLS,
                                      previous_response_id=r.id,
                                      input=[{"type": "function_call_output", "call_id": r.output[0].call_id,
                                              "output": "same"}]) for r in first]
    assert all(r.output_text for r in follow)
    ids = session_ids(upstream)
    assert ids[0] == ids[2] != ids[1] == ids[3]


def test_responses_stream_is_byte_identical_and_learnt_before_its_end(proxy, upstream, registry):
    """The upstream holds its stream open after `response.completed`; the agent sends its
    next request on that event: the proxy must have learnt the answer already."""
    body = {"model": "m", "stream": True, "instructions": INSTRUCTIONS, "tools": RESPONSES_TOOLS, "store": False,
            "input": [{"role": "user", "content": "plan: tools get_user linger | answer"}]}
    with httpx.stream("POST", upstream.url + "/v1/responses", json=body, timeout=30) as r:
        direct = b"".join(r.iter_raw())
    upstream.app.state.requests.clear()
    with httpx.stream("POST", proxy.url + "/v1/responses", json=body, timeout=30) as r:
        raw, events = read_until(r, b"response.completed")
        item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
        second = httpx.post(proxy.url + "/v1/responses", timeout=30, json={
            **body, "stream": False,
            "input": body["input"] + [item, {"type": "function_call_output", "call_id": item["call_id"], "output": "x"}]})
        assert second.status_code == 200
        assert direct.startswith(raw)
    ids = session_ids(upstream)
    assert len(ids) == 2 and ids[0] == ids[1]
    assert proxy.app.hints.flush(5)
    assert tool_events(registry, ids[0]) == [("tool_call_start", "get_user"), ("tool_call_end", "get_user")]


# -- Messages API ----------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_tool_loop_is_one_session_with_its_tools(proxy, upstream, registry, stream):
    answers = run_messages_agent(anthropic_sdk(proxy), PLAN, stream=stream)
    assert answers[-1].content[0].text.strip() == "done after 2 steps"
    requests = upstream.app.state.requests
    assert len(requests) == 3
    assert all("session_id" not in r["body"] for r in requests)  # vLLM's Messages request has no such field
    sid = one_session(proxy, upstream, registry)
    assert kinds(registry, sid) == LOOP
    assert tool_events(registry, sid) == TOOLS_SEEN
    assert registry.session(sid).open_tools == ()


def test_messages_sessions_are_scoped_by_user_id(proxy, upstream):
    """Two agents with the same words (so the same answers), step by step in turn: only
    their own `metadata.user_id` tells them apart, and they never share a session."""
    client = anthropic_sdk(proxy)
    histories = {user: [{"role": "user", "content": "plan: tools search | answer"}] for user in ("u-a", "u-b")}
    for step in range(2):
        for user, messages in histories.items():
            answer = client.messages.create(model="m", max_tokens=64, tools=MESSAGES_TOOLS, messages=messages,
                                            metadata={"user_id": user})
            if step == 0:
                messages += [{"role": "assistant", "content": [b.model_dump(exclude_unset=True) for b in answer.content]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": answer.content[0].id,
                                                           "content": "ok"}]}]
    ids = session_ids(upstream)
    assert ids[0] == ids[2] != ids[1] == ids[3]


def test_messages_stream_is_learnt_before_its_end(proxy, upstream, registry):
    """As for Responses: the next request goes out on `message_stop`, the stream still open."""
    body = {"model": "m", "max_tokens": 64, "stream": True, "tools": MESSAGES_TOOLS,
            "messages": [{"role": "user", "content": "plan: tools get_user linger | answer"}]}
    with httpx.stream("POST", proxy.url + "/v1/messages", json=body, timeout=30) as r:
        _, events = read_until(r, b"message_stop")
        start = next(e for e in events if e["type"] == "content_block_start")
        block = {**start["content_block"], "input": {"step": 0, "n": 0}}
        second = httpx.post(proxy.url + "/v1/messages", timeout=30, json={**body, "stream": False, "messages": [
            *body["messages"], {"role": "assistant", "content": [block]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "x"}]}]})
        assert second.status_code == 200
    ids = session_ids(upstream)
    assert len(ids) == 2 and ids[0] == ids[1]
    assert proxy.app.hints.flush(5)
    assert tool_events(registry, ids[0]) == [("tool_call_start", "get_user"), ("tool_call_end", "get_user")]


def test_messages_stream_is_byte_identical(proxy, upstream):
    body = {"model": "m", "max_tokens": 64, "stream": True, "tools": MESSAGES_TOOLS,
            "messages": [{"role": "user", "content": "plan: tools get_user,search"}]}
    with httpx.stream("POST", upstream.url + "/v1/messages", json=body) as r:
        direct = b"".join(r.iter_raw())
    with httpx.stream("POST", proxy.url + "/v1/messages", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        proxied = b"".join(r.iter_raw())
    assert proxied == direct and proxied.count(b"event: ") > 8


# -- failures, on both ---------------------------------------------------------------------------

@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"model": "m", "input": "plan: error 503"}),
    ("/v1/responses", {"model": "m", "input": "hi", "previous_response_id": "resp_nowhere"}),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "plan: error 529"}]}),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": []}),
], ids=["responses-503", "responses-unknown-previous", "messages-529", "messages-400"])
def test_upstream_errors_come_back_unchanged(proxy, upstream, registry, path, body):
    direct = httpx.post(upstream.url + path, json=body)
    proxied = httpx.post(proxy.url + path, json=body)
    assert proxied.status_code == direct.status_code >= 400
    assert proxied.content == direct.content
    assert proxy.app.hints.flush(5)
    sid = session_ids(upstream)[-1]
    assert kinds(registry, sid)[-2:] == ["llm_call_start", "llm_call_end"]  # the call ended, nothing learnt


def test_the_sdks_see_the_upstreams_errors(proxy):
    with pytest.raises(openai.InternalServerError) as err:
        openai_sdk(proxy).responses.create(model="m", input="plan: error 500")
    assert "scripted failure 500" in str(err.value)
    with pytest.raises(anthropic.BadRequestError) as err:
        anthropic_sdk(proxy).messages.create(model="m", max_tokens=8,
                                             messages=[{"role": "user", "content": "plan: error 400"}])
    assert "scripted failure 400" in str(err.value)


def test_hint_service_down_changes_nothing_on_either_api(upstream, make_proxy, dead_address):
    server = make_proxy(upstream.url + "/v1", dead_address)
    assert run_responses_agent(openai_sdk(server), PLAN, stream=True)[-1].output_text.strip() == "done after 2 steps"
    assert run_messages_agent(anthropic_sdk(server), PLAN, stream=True)[-1].content[0].text.strip() == \
        "done after 2 steps"
    ids = session_ids(upstream)
    assert len(ids) == 6 and len(set(ids[:3])) == len(set(ids[3:])) == 1 and ids[0] != ids[3]
    assert server.app.hints.flush(0.3) is False  # the hints had nowhere to go


def test_a_client_gone_mid_stream_ends_its_session(upstream, hint_server, registry, make_proxy):
    server = make_proxy(upstream.url + "/v1", hint_server.endpoint, abandon_grace_s=0.2)
    body = {"model": "m", "stream": True, "input": "plan: gate"}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as r:
        next(r.iter_raw())
    sid = session_ids(upstream)[0]
    try:  # the upstream holds its answer until the end: the client left before it was whole
        for _ in range(200):
            server.app.hints.flush(5)
            if registry.session(sid).state == SessionPhase.ENDED:
                break
            threading.Event().wait(0.05)
    finally:
        upstream.app.state.gate.set()
    assert kinds(registry, sid) == ["session_start", "llm_call_start", "llm_call_end", "session_end"]
    assert server.app.tracker.stats().sessions_ended["gone"] == 1


# -- agents whose tool calls are text ---------------------------------------------------------------

def test_text_action_agent_gets_a_tool_per_block_and_ends_at_its_submit_marker(proxy, upstream, registry):
    plan = "act ls -la | act cd repo && python -m pytest -q tests | act echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    messages = run_text_agent(openai_sdk(proxy), plan)
    assert len(messages) == 2 + 3 + 2  # three answers, two observations
    sid = one_session(proxy, upstream, registry)
    history = [(h.kind, h.detail) for h in registry.session(sid).history]
    assert history == [("session_start", history[0][1]),
                       ("llm_call_start", "llm"), ("llm_call_end", "llm"), ("tool_call_start", "ls"),
                       ("tool_call_end", "ls"),
                       ("llm_call_start", "llm"), ("llm_call_end", "llm"), ("tool_call_start", "pytest"),
                       ("tool_call_end", "pytest"),
                       ("llm_call_start", "llm"), ("llm_call_end", "llm"), ("session_end", "completed")]
    assert registry.session(sid).state == SessionPhase.ENDED
    assert proxy.app.tracker.session_ids() == []


def test_text_actions_can_be_switched_off(upstream, hint_server, registry, make_proxy):
    server = make_proxy(upstream.url + "/v1", hint_server.endpoint, text_actions=None)
    run_text_agent(openai_sdk(server), "act ls | act echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    sid = one_session(server, upstream, registry)
    assert tool_events(registry, sid) == [] and registry.session(sid).state != SessionPhase.ENDED


def test_saga_proxy_says_which_text_action_setting_is_wrong(capsys):
    from saga_server.proxy import cli

    assert cli.main(["--upstream", "http://127.0.0.1:1/v1", "--submit-marker", "(unclosed"]) == 2
    assert "saga proxy:" in capsys.readouterr().err
