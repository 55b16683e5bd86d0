"""`saga proxy` in front of a real `saga serve` (real vLLM, SmolLM2), driven by the real
OpenAI SDK; hints go to the server's own hint service and are read back from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from saga_sdk import HintReader
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.proxies import start_proxy, stop_proxy

ROOT = Path(__file__).resolve().parents[3]
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name} for the customer", "strict": True,
    "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 24}}, "required": ["q"],
                   "additionalProperties": False}}} for name in ("get_user_details", "search_flights")]


@pytest.fixture(scope="module")
def proxy(saga_server):
    server = start_proxy(saga_server.openai_url, saga_server.hint_addr)
    yield server
    stop_proxy(server)


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)


def comparable(obj: dict) -> dict:
    """A response without what differs between two identical requests (ids, clocks)."""
    obj = {k: v for k, v in obj.items() if k not in ("id", "created", "system_fingerprint", "kv_transfer_params")}
    for choice in obj.get("choices", []):
        for call in (choice.get("message") or choice.get("delta") or {}).get("tool_calls") or []:
            call.pop("id", None)
    if isinstance(obj.get("usage"), dict):
        obj["usage"] = {k: v for k, v in obj["usage"].items() if k != "prompt_tokens_details"}
    return obj


def test_non_streaming_answers_match_direct(saga_server, proxy):
    body = {"model": saga_server.model, "temperature": 0, "max_tokens": 16, "seed": 1,
            "messages": [{"role": "user", "content": "Say hello to the airline customer."}]}
    direct = httpx.post(saga_server.openai_url + "/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    proxied = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert proxied.status_code == direct.status_code == 200
    assert comparable(proxied.json()) == comparable(direct.json())


def test_streaming_answers_match_direct_chunk_for_chunk(saga_server, proxy):
    body = {"model": saga_server.model, "temperature": 0, "max_tokens": 16, "seed": 1, "stream": True,
            "messages": [{"role": "user", "content": "Name three airports."}]}

    def chunks(url):
        with httpx.stream("POST", url + "/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = b"".join(r.iter_raw())
        events = [e for e in raw.split(b"\n\n") if e.strip()]
        assert events[-1] == b"data: [DONE]"
        return [comparable(json.loads(e[6:])) for e in events[:-1]]

    assert chunks(proxy.url + "/v1") == chunks(saga_server.openai_url)


def test_upstream_errors_come_back_unchanged(saga_server, proxy):
    for body in ({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
                 {"model": saga_server.model, "messages": "not a list"}):
        direct = httpx.post(saga_server.openai_url + "/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
        proxied = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
        assert proxied.status_code == direct.status_code >= 400
        assert proxied.json() == direct.json()


def _step(client, model, messages, tool):
    message = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=96, temperature=0,
        tool_choice={"type": "function", "function": {"name": tool}} if tool else "none").choices[0].message
    messages.append(message)
    for call in message.tool_calls or ():
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"ok": tool})})
    return message


def test_two_interleaved_tool_agents_are_two_sessions_on_the_server(saga_server, proxy):
    client = client_for(proxy.url + "/v1")
    plans = [["get_user_details", "search_flights", None], ["search_flights", None]]
    histories = [[{"role": "system", "content": "You are an airline agent."},
                  {"role": "user", "content": f"Customer {i}: help me book a flight."}] for i in range(2)]
    before = set(proxy.app.tracker.session_ids())
    for step in range(3):
        for plan, messages in zip(plans, histories):
            if step < len(plan):
                message = _step(client, saga_server.model, messages, plan[step])
                assert bool(message.tool_calls) == (plan[step] is not None)
    sessions = [s for s in proxy.app.tracker.session_ids() if s not in before]
    assert len(sessions) == 2
    assert proxy.app.hints.flush(10)
    reader = HintReader(saga_server.hint_addr)
    seen = {}
    for sid in sessions:
        state = reader.session(sid)
        seen[state.steps] = [(h.kind, h.detail) for h in state.history if h.kind.startswith("tool")]
    assert seen == {
        3: [("tool_call_start", "get_user_details"), ("tool_call_end", "get_user_details"),
            ("tool_call_start", "search_flights"), ("tool_call_end", "search_flights")],
        2: [("tool_call_start", "search_flights"), ("tool_call_end", "search_flights")],
    }


def test_example_agent_under_saga_run(saga_server, proxy):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SAGA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server")])
    before = set(proxy.app.tracker.session_ids())
    r = subprocess.run([sys.executable, "-m", "saga_server.cli", "run", "--proxy", proxy.url + "/v1", "--",
                        sys.executable, str(ROOT / "examples" / "openai_agent.py")],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == {"llm_calls": 3, "tools": ["get_user_details", "search_flights"]}
    (sid,) = [s for s in proxy.app.tracker.session_ids() if s not in before]
    assert proxy.app.hints.flush(10)
    state = HintReader(saga_server.hint_addr).session(sid)
    assert state.steps == 3
    assert [(h.kind, h.detail) for h in state.history if h.kind.startswith("tool")] == [
        ("tool_call_start", "get_user_details"), ("tool_call_end", "get_user_details"),
        ("tool_call_start", "search_flights"), ("tool_call_end", "search_flights")]
