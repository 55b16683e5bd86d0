"""`saga serve` end to end: real vLLM, real SmolLM2, the OpenAI API and the SDK's
HintClient, all against the one shared server of `tests/real/conftest.py`."""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
import urllib.request
import uuid

import pytest

from saga_sdk import HintClient, HintReader
from saga_server.serve.status import fetch_metrics

WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud "
         "apple orange table chair window garden bridge tower engine signal vector matrix").split()


def text_of(n_words: int, seed: str) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n_words))


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_chat_completion_answers_and_reports_usage(saga_server):
    out = saga_server.chat([{"role": "user", "content": "Say hello in five words."}], max_tokens=16,
                           session_id=uid("hello"))
    assert out["choices"][0]["message"]["content"].strip()
    assert out["usage"]["prompt_tokens"] > 0
    assert "cached_tokens" in (out["usage"].get("prompt_tokens_details") or {})


def test_forced_tool_call_comes_back_as_an_openai_tool_call(saga_server):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                       "required": ["city"], "additionalProperties": False}}}]
    out = saga_server.chat([{"role": "user", "content": "What is the weather in Paris?"}], tools=tools,
                           tool_choice="required", max_tokens=60, session_id=uid("tool"))
    calls = out["choices"][0]["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    assert "city" in json.loads(calls[0]["function"]["arguments"])


def test_hints_reach_the_engine_and_reads_come_back(saga_server):
    sid = uid("hinted")
    client = HintClient(endpoint=saga_server.hint_addr)
    try:
        client.session_start(sid, tenant="acme", workflow="real-test")
        client.tool_call_start(sid, "bash", call_id="c1", category="run")
        assert client.flush(10)
        with HintReader(saga_server.hint_addr) as reader:
            state = reader.session(sid)
            reply = reader.server_stats()
        assert state.state == "tool" and state.tenant == "acme"
        assert reply.engine.kv_blocks > 0  # GetStats is answered from inside the engine
    finally:
        client.session_end(sid)
        client.close(5)


def test_garbage_and_floods_of_hints_do_not_disturb_serving(saga_server):
    client = HintClient(endpoint=saga_server.hint_addr)
    try:
        for i in range(500):
            sid = f"ghost-{i % 37}"
            client.tool_call_end(sid, "never-started", call_id=str(i))  # no start: refused
            client.session_end(sid)  # unknown session
            client.tool_call_start(uid("flood"), "bash", call_id=str(i))  # sessions never started
        client.flush(20)
    finally:
        client.close(5)
    out = saga_server.chat([{"role": "user", "content": "Count to three."}], max_tokens=8)
    assert out["choices"][0]["message"]["content"] is not None
    with HintReader(saga_server.hint_addr) as reader:
        assert reader.stats()["hints_events_received"] >= 1500


def _pool_tokens(saga_server) -> int:
    with HintReader(saga_server.hint_addr) as reader:
        blocks = reader.server_stats().engine.kv_blocks
    if not blocks:
        pytest.skip("server does not report its KV size (not a SAGA server?)")
    if blocks > 3000:
        pytest.skip(f"KV cache of {blocks:.0f} blocks is too large to flood in a test")
    return int(blocks * 32)


def _one_shot_sessions(saga_server, prefix: str, tokens: int, per: int) -> int:
    """Sessions of one request of about `per` prompt tokens each, two at a time, until
    `tokens` went through, each ended once answered (its KV stays cached, as vLLM's,
    but no pin can hold it: what the server learnt from earlier tests cannot make
    these sessions take the pin budget); returns the prompt tokens sent."""
    client = HintClient(endpoint=saga_server.hint_addr)

    def one(i: int) -> int:
        sid = uid(f"{prefix}{i}")
        msg = [{"role": "user", "content": f"{prefix} {sid}. " + text_of(per - 10, sid)}]
        sent = saga_server.chat(msg, max_tokens=4, session_id=sid)["usage"]["prompt_tokens"]
        client.session_end(sid)
        return sent

    try:
        with cf.ThreadPoolExecutor(2) as pool:  # 2: each request stays well inside its timeout
            return sum(pool.map(one, range(max(4, tokens // per + 1))))
    finally:
        assert client.flush(10)
        client.close(5)


def test_a_session_paused_in_a_tool_keeps_its_history_cached_through_a_flood(saga_server):
    """The closing-note demo as a test: the pool is full of idle sessions' KV, as any
    server's is once it has served its size in tokens; session A pauses in a tool
    (hinted); other sessions then push more tokens through the cache than it holds;
    A's next request is still served from cache for its whole history, by its pin."""
    pool_tokens = _pool_tokens(saga_server)
    _one_shot_sessions(saga_server, "Idle", pool_tokens, 700)  # cached KV: not pressure, pins still pay
    sid = uid("paused")
    client = HintClient(endpoint=saga_server.hint_addr)
    before = fetch_metrics(saga_server.base_url)
    try:
        client.session_start(sid, tenant="demo", workflow="pinning")
        client.flush(10)
        messages = [{"role": "system", "content": f"Session {sid}. " + text_of(700, sid)},
                    {"role": "user", "content": "Run the tests."}]
        first = saga_server.chat(messages, max_tokens=24, session_id=sid)
        history = first["usage"]["prompt_tokens"]
        client.tool_call_start(sid, "pytest", call_id="t1", category="test", expected_duration_s=300)
        assert client.flush(10)

        # Just over the pool: on a slow CPU engine a longer flood could outlast the pin
        # itself (at most `PinConfig.max_ttl_s`).
        flooded = _one_shot_sessions(saga_server, "Flood", int(pool_tokens * 1.1), 900)
        assert flooded > pool_tokens  # more than the whole cache went through

        client.tool_call_end(sid, "pytest", call_id="t1")
        client.flush(10)
        messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"] or ""},
                     {"role": "user", "content": "Tool output: 3 passed. What next?"}]
        second = saga_server.chat(messages, max_tokens=8, session_id=sid)
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        pins = {k: v - before.get(k, 0.0) for k, v in fetch_metrics(saga_server.base_url).items()
                if k.startswith("saga_pin")}  # what the pin did, if it did not hold
        assert cached >= (history // 32) * 32 - 32, (cached, history, pins)
    finally:
        client.session_end(sid)
        client.close(5)
    after = fetch_metrics(saga_server.base_url)
    delta = lambda k: after.get(k, 0.0) - before.get(k, 0.0)  # noqa: E731
    assert delta("saga_pins_total{event=created}") >= 1
    assert delta("saga_pins_total{event=used}") >= 1


def test_saga_metrics_are_on_the_servers_metrics_endpoint(saga_server):
    saga_server.chat([{"role": "user", "content": "Hi"}], max_tokens=4, session_id=uid("metrics"))
    m = fetch_metrics(saga_server.base_url)
    for name in ("saga_held_blocks", "saga_pinned_blocks", "saga_session_prompt_tokens_total",
                 "saga_active_sessions", "vllm:kv_cache_usage_perc"):
        assert name in m, sorted(m)
    assert m["saga_session_prompt_tokens_total"] > 0
    with urllib.request.urlopen(saga_server.base_url + "/metrics", timeout=10) as resp:
        assert b"vllm:" in resp.read()  # vLLM's own metrics are still there
