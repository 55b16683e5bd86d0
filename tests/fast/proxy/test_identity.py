"""`core.identity`: the session ids, parents and last-request markers agents send, as
the front doors read them, and the engine port's `SessionIdentityMiddleware`, which
hands them to the engine."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from saga_server.core.identity import SESSION_HEADERS_ENV, Identity, identity_of, parse_header_sets, problem_with
from saga_server.core.scopes import MAX_SESSION_ID_CHARS
from saga_server.proxy.engine_port import SessionIdentityMiddleware, TenantKeysMiddleware
from saga_server.proxy.exchanges import headers_identity
from saga_server.rpc import KeyRing

from .test_engine_port import CHAT, KEY_A, Recorder


@pytest.mark.parametrize("headers, said", [
    # Claude Code: the root, a subagent of the root, a subagent of that subagent
    ({"x-claude-code-session-id": "cc1"}, Identity("cc1", None, False, "claude-code")),
    ({"x-claude-code-session-id": "cc1", "x-claude-code-agent-id": "a7"}, Identity("cc1:a7", "cc1", False, "claude-code")),
    ({"x-claude-code-session-id": "cc1", "x-claude-code-agent-id": "a8", "x-claude-code-parent-agent-id": "a7"},
     Identity("cc1:a8", "cc1:a7", False, "claude-code")),
    # Codex: thread-id wins over the session-id it sends beside it
    ({"thread-id": "t2", "session-id": "s1", "x-codex-parent-thread-id": "t1"}, Identity("t2", "t1", False, "codex")),
    ({"session_id": "old"}, Identity("old", None, False, "codex")),
    # OpenCode: vLLM's own header, and its parent's
    ({"x-session-id": "oc2", "x-parent-session-id": "oc1"}, Identity("oc2", "oc1", False, "vllm")),
    # Dynamo's canonical headers, with the last-request marker
    ({"x-dynamo-session-id": "d1", "x-dynamo-session-final": "True"}, Identity("d1", None, True, "dynamo")),
    ({"x-dynamo-session-id": "d1", "x-dynamo-session-final": "no"}, Identity("d1", None, False, "dynamo")),
    # X-Session-ID (what saga proxy forwards) wins over an agent's own header
    ({"x-session-id": "px-1", "x-claude-code-session-id": "cc1"}, Identity("px-1", None, False, "vllm")),
    # blank values are absent; a parent equal to the session is none
    ({"x-session-id": "  ", "thread-id": " t3 ", "x-codex-parent-thread-id": "t3"}, Identity("t3", None, False, "codex")),
    ({"x-parent-session-id": "orphan"}, Identity()),
    ({}, Identity()),
])
def test_each_senders_headers_give_its_session_and_parent(headers, said):
    assert identity_of(headers) == said


def test_an_overlong_id_is_cut_to_the_cores_limit():
    said = identity_of({"x-dynamo-session-id": "x" * 5000, "x-dynamo-parent-session-id": "p" * 5000})
    assert len(said.session_id) == len(said.parent_id) == MAX_SESSION_ID_CHARS


def test_an_operators_own_headers_come_first(monkeypatch):
    spec = "session=X-Run, parent=x-run-parent, final=x-run-done; session=x-two"
    monkeypatch.setenv(SESSION_HEADERS_ENV, spec)
    said = headers_identity({"x-run": "r2", "x-run-parent": "r1", "x-run-done": "1", "x-session-id": "other"})
    assert said == Identity("r2", "r1", True, "config-1")
    assert headers_identity({"x-two": "t"}).source == "config-2"
    assert problem_with(spec) is None
    monkeypatch.delenv(SESSION_HEADERS_ENV)
    assert headers_identity({"x-run": "r2", "x-session-id": "other"}).session_id == "other"


@pytest.mark.parametrize("spec, says", [
    ("parent=x-p", "names no session header"),
    ("session=x-a,owner=x-b", "'owner=x-b' is not role=header"),
    ("session=", "is not role=header"),
])
def test_a_bad_header_configuration_is_refused_with_its_reason(monkeypatch, spec, says):
    with pytest.raises(ValueError, match=says):
        parse_header_sets(spec)
    assert says in problem_with(spec)
    monkeypatch.setenv(SESSION_HEADERS_ENV, spec)  # past the front doors' check: a request never fails on it
    assert headers_identity({"x-dynamo-session-id": "d"}).session_id == "d"


@pytest.fixture
def engine():
    recorder = Recorder()
    client = TestClient(SessionIdentityMiddleware(recorder), base_url="http://engine")
    client.engine = recorder
    return client


def _post(client, body, **headers):
    return client.post(CHAT, content=body if isinstance(body, bytes) else json.dumps(body),
                       headers={"content-type": "application/json", **headers})


def _seen(client) -> dict:
    return json.loads(client.engine.seen[-1][1])


def test_the_port_gives_the_engine_what_the_headers_say(engine):
    client = engine
    _post(client, {"model": "m", "vllm_xargs": {"tenant": "t"}}, **{
        "x-claude-code-session-id": "cc9", "x-claude-code-agent-id": "a1"})
    assert _seen(client) == {"model": "m", "session_id": "cc9:a1",
                             "vllm_xargs": {"tenant": "t", "session_id": "cc9:a1", "parent_session_id": "cc9"}}
    _post(client, {"model": "m"}, **{"x-dynamo-session-id": "d4", "x-dynamo-session-final": "true"})
    assert _seen(client) == {"model": "m", "session_id": "d4", "vllm_xargs": {"session_id": "d4",
                                                                               "session_final": "true"}}
    headers = client.engine.seen[-1][0]
    assert int(headers["content-length"]) == len(client.engine.seen[-1][1])


@pytest.mark.parametrize("body", [
    {"model": "m", "session_id": "own"},                    # the body names its session: left as it is
    {"model": "m", "vllm_xargs": {"session_id": "own"}},
    b"not json", b'["a", "list"]', b"",
])
def test_a_body_that_names_its_session_or_is_not_an_object_passes_unchanged(engine, body):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert _post(engine, raw, **{"thread-id": "t1", "x-codex-parent-thread-id": "t0"}).status_code == 200
    assert engine.engine.seen[-1][1] == raw


def test_a_request_naming_no_session_is_not_rewritten(engine):
    raw = json.dumps({"model": "m", "vllm_xargs": {"session_final": True}}).encode()
    _post(engine, raw, **{"x-dynamo-session-final": "true"})
    assert engine.engine.seen[-1][1] == raw


def test_with_keys_the_parent_is_scoped_like_the_session_and_a_body_cannot_forge_either(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY_A} team-a agent\n")
    client = TestClient(TenantKeysMiddleware(recorder := Recorder(), keys=KeyRing(str(keys))), base_url="http://e")
    client.engine = recorder
    forged = {"model": "m", "vllm_xargs": {"parent_session_id": "team-b/x", "session_final": True}}
    _post(client, forged, Authorization=f"Bearer {KEY_A}",
          **{"x-session-id": "oc2", "x-parent-session-id": "oc1"})
    seen = _seen(client)
    assert seen["session_id"] == "team-a/oc2"
    assert seen["vllm_xargs"]["parent_session_id"] == "team-a/oc1" and "session_final" not in seen["vllm_xargs"]


def test_saga_proxy_refuses_to_start_with_a_bad_header_table(monkeypatch, capsys):
    from saga_server.proxy import cli

    monkeypatch.setenv(SESSION_HEADERS_ENV, "parent=x-p")
    assert cli.main(["--upstream", "http://127.0.0.1:9/v1"]) == 2
    assert "names no session header" in capsys.readouterr().err
