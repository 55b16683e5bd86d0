"""The OpenAI SDK patch, driven through the real `openai` client against a scripted
chat server that records exactly what went over the wire."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading

import openai
import pytest
from openai.resources.chat.completions import AsyncCompletions, Completions

from saga_sdk import session_scope
from saga_sdk.integrations import openai as saga_openai
from saga_sdk.logs import LogOnce

MESSAGES = [{"role": "user", "content": "hi"}]


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)


def last(server):
    return server.requests[-1]


def test_public_api():
    assert sorted(saga_openai.__all__) == ["SESSION_FIELD", "SESSION_HEADER", "instrument",
                                            "is_instrumented", "uninstrument"]


def test_no_session_no_tag(chat_server, patched):
    client_for(chat_server).chat.completions.create(model="m", messages=MESSAGES)
    req = last(chat_server)
    assert "x-session-id" not in req.headers
    assert "session_id" not in req.body


def test_session_id_goes_in_the_header_only_by_default(chat_server, patched):
    client = client_for(chat_server)
    with session_scope("sess-abc"):
        out = client.chat.completions.create(model="m", messages=MESSAGES)
    assert out.choices[0].message.content == "echo: hi"  # the call itself is untouched
    req = last(chat_server)
    assert req.headers["x-session-id"] == "sess-abc"
    assert "session_id" not in req.body  # strict servers reject unknown body fields


def test_body_field_is_opt_in(chat_server, patched):
    saga_openai.instrument(body=True)  # a second call only changes the options
    with session_scope("sess-body"):
        client_for(chat_server).chat.completions.create(model="m", messages=MESSAGES)
    req = last(chat_server)
    assert req.body["session_id"] == "sess-body"
    assert req.headers["x-session-id"] == "sess-body"


def test_merges_with_user_arguments_and_never_mutates_them(chat_server, patched):
    saga_openai.instrument(body=True)
    client = client_for(chat_server)
    headers, body = {"X-Trace": "t1"}, {"top_k": 5}
    with session_scope("sess-merge"):
        client.chat.completions.create(model="m", messages=MESSAGES, extra_headers=headers, extra_body=body)
    req = last(chat_server)
    assert (req.headers["x-trace"], req.headers["x-session-id"]) == ("t1", "sess-merge")
    assert (req.body["top_k"], req.body["session_id"]) == (5, "sess-merge")
    assert headers == {"X-Trace": "t1"} and body == {"top_k": 5}


def test_the_callers_own_session_id_wins(chat_server, patched):
    saga_openai.instrument(body=True)
    with session_scope("sess-ours"):
        client_for(chat_server).chat.completions.create(
            model="m", messages=MESSAGES, extra_headers={"x-session-id": "theirs-h"},
            extra_body={"session_id": "theirs-b"})
    req = last(chat_server)
    assert (req.headers["x-session-id"], req.body["session_id"]) == ("theirs-h", "theirs-b")


def test_clients_built_before_instrument_are_covered(chat_server):
    client = client_for(chat_server)
    client.chat.completions  # resource objects exist before the patch
    saga_openai.instrument()
    try:
        with session_scope("sess-early"):
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert last(chat_server).headers["x-session-id"] == "sess-early"
    finally:
        saga_openai.uninstrument()


def test_legacy_completions_responses_and_parse_are_tagged(chat_server, patched):
    client = client_for(chat_server)
    with session_scope("sess-all"):
        client.completions.create(model="m", prompt="hi")
        client.responses.create(model="m", input="hi")
        client.chat.completions.parse(model="m", messages=MESSAGES)
    paths = [(r.path, r.headers.get("x-session-id")) for r in chat_server.requests]
    assert paths == [("/v1/completions", "sess-all"), ("/v1/responses", "sess-all"),
                     ("/v1/chat/completions", "sess-all")]


def test_async_tasks_each_carry_their_own_session(chat_server, patched):
    client = openai.AsyncOpenAI(base_url=chat_server.base_url, api_key="test", max_retries=0)

    async def one(i: int) -> None:
        with session_scope(f"sess-a{i}"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(i)}])

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(6)))
        await client.close()

    asyncio.run(main())
    seen = {r.body["messages"][0]["content"]: r.headers["x-session-id"] for r in chat_server.requests}
    assert seen == {str(i): f"sess-a{i}" for i in range(6)}


def test_threads_each_carry_their_own_session(chat_server, patched):
    client = client_for(chat_server)

    def one(i: int) -> None:
        with session_scope(f"sess-t{i}"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(i)}])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = {r.body["messages"][0]["content"]: r.headers["x-session-id"] for r in chat_server.requests}
    assert seen == {str(i): f"sess-t{i}" for i in range(6)}


def test_instrument_and_uninstrument_are_idempotent(chat_server):
    original_sync, original_async = Completions.create, AsyncCompletions.create
    assert saga_openai.instrument() and saga_openai.instrument()
    assert Completions.create.__wrapped__ is original_sync  # one layer, not two
    assert AsyncCompletions.create.__wrapped__ is original_async
    assert saga_openai.is_instrumented()
    saga_openai.uninstrument()
    saga_openai.uninstrument()
    assert Completions.create is original_sync and AsyncCompletions.create is original_async
    assert not saga_openai.is_instrumented()
    with session_scope("sess-off"):
        client_for(chat_server).chat.completions.create(model="m", messages=MESSAGES)
    assert "x-session-id" not in last(chat_server).headers


def test_uninstrument_under_a_foreign_wrapper_turns_ours_inert(chat_server):
    original = Completions.create
    saga_openai.instrument()
    ours = Completions.create
    calls = []

    @functools.wraps(ours)
    def foreign(self, *args, **kwargs):  # another instrumentation library, patched after us
        calls.append(kwargs.get("extra_headers"))
        return ours(self, *args, **kwargs)

    Completions.create = foreign
    try:
        saga_openai.uninstrument()
        assert Completions.create is foreign  # their wrapper survives
        with session_scope("sess-x"):
            client_for(chat_server).chat.completions.create(model="m", messages=MESSAGES)
        assert "x-session-id" not in last(chat_server).headers
        saga_openai.instrument()  # reactivates ours without stacking another layer
        assert Completions.create is foreign
        with session_scope("sess-y"):
            client_for(chat_server).chat.completions.create(model="m", messages=MESSAGES)
        assert last(chat_server).headers["x-session-id"] == "sess-y"
        assert len(calls) == 2
    finally:
        saga_openai.uninstrument()
        Completions.create = original
        saga_openai._installed.pop((Completions, "create"), None)


def test_a_tagging_failure_is_logged_once_and_the_request_still_goes(chat_server, patched, monkeypatch, caplog):
    def broken():
        raise RuntimeError("context store broken")

    monkeypatch.setattr(saga_openai, "current_session", broken)
    monkeypatch.setattr(saga_openai, "_log_once", LogOnce(saga_openai.log))  # a fresh memory
    client = client_for(chat_server)
    with caplog.at_level(logging.WARNING, logger="saga_sdk.openai"):
        outs = [client.chat.completions.create(model="m", messages=MESSAGES) for _ in range(3)]
    assert [o.choices[0].message.content for o in outs] == ["echo: hi"] * 3
    assert len(chat_server.requests) == 3
    assert all("x-session-id" not in r.headers for r in chat_server.requests)
    assert sum("could not tag" in r.message for r in caplog.records) == 1


def test_a_user_error_still_reaches_the_user(chat_server, patched):
    # The patch must not swallow the SDK's own errors: bad arguments still raise.
    with session_scope("sess-err"), pytest.raises(TypeError):
        client_for(chat_server).chat.completions.create(model="m")  # messages missing
