"""`saga proxy --api-keys`: callers need a key of the file and act as its tenant; two
tenants never share a session, a prefix-cache salt or a hint session; without keys
nothing changes. The real SDKs against the scripted upstream, and a hint service that
checks keys too (the proxy's hints go with the file's admin key)."""

from __future__ import annotations

import logging
import os
import re
import signal

import httpx
import openai
import pytest

from saga_sdk import HintClient
from saga_server.core.events import SessionStart
from saga_server.proxy import MatchRule, ProxyConfig, Request, SagaProxy, SessionTracker
from saga_server.proxy.server import BackgroundServer
from saga_server.proxy.tenants import Tenants, namespaced
from saga_server.rpc import HintServer, KeyRing, reload_on_sighup
from tests.fast.proxy.agents import RESPONSES_TOOLS, INSTRUCTIONS, run_responses_agent, session_ids

anthropic = pytest.importorskip("anthropic")

KEY_A, KEY_B, KEY_OPS = "sk-team-a-0123456789", "sk-team-b-9876543210", "sk-ops-admin-5555555"
KEYS = f"{KEY_A} team-a agent\n{KEY_B} team-b agent\n{KEY_OPS} ops admin\n"
CHAT = {"model": "m", "messages": [{"role": "system", "content": "You are an airline agent."},
                                   {"role": "user", "content": "plan: tools search | answer"}]}
HEX64 = re.compile(r"[0-9a-f]{64}")


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    return path


@pytest.fixture
def keyed_hints(registry, keys_file):
    """A hint service that requires the same keys."""
    server = HintServer(registry, "127.0.0.1:0", keys=KeyRing(str(keys_file))).start()
    yield server
    server.close(grace=None)


@pytest.fixture
def tenant_proxy(upstream, keyed_hints, keys_file):
    """`saga proxy --api-keys keys_file` as the CLI builds it: hints with the admin key."""
    ring = KeyRing(str(keys_file))
    hints = HintClient(endpoint=keyed_hints.endpoint, api_key=ring.admin_key(), rpc_timeout_s=0.5,
                       flush_interval_s=0.001)
    app = SagaProxy(ProxyConfig(upstream=upstream.url + "/v1"), hints=hints, tenants=Tenants(ring))
    with BackgroundServer(app) as server:
        server.app, server.ring = app, ring
        yield server
    hints.close(0.1)


def openai_as(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def bodies(upstream) -> list[dict]:
    return [r["body"] for r in upstream.app.state.requests]


def chat_loop(client: openai.OpenAI, **kw) -> None:
    """Two steps of one agent: a tool call, its result, the final answer."""
    messages = list(CHAT["messages"])
    answer = client.chat.completions.create(model="m", messages=messages, **kw).choices[0].message
    messages += [answer.model_dump(exclude_unset=True),
                 {"role": "tool", "tool_call_id": answer.tool_calls[0].id, "content": "ok"}]
    client.chat.completions.create(model="m", messages=messages, **kw)


# -- keys --------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-nobody-00000000"},
                                     {"x-api-key": "sk-nobody-00000000"}, {"Authorization": KEY_A}],
                         ids=["none", "unknown-bearer", "unknown-x-api-key", "not-bearer"])
def test_a_request_without_a_known_key_is_refused_and_not_forwarded(tenant_proxy, upstream, headers, caplog):
    caplog.set_level(logging.DEBUG)
    r = httpx.post(tenant_proxy.url + "/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "saga_proxy_error" and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(tenant_proxy.url + "/v1/models", headers=headers).status_code == 401
    assert upstream.app.state.requests == []
    assert tenant_proxy.app.tenants.stats().refused == 2
    assert tenant_proxy.app.tracker.stats().requests == 0
    for secret in ("sk-nobody", KEY_A):
        assert secret not in caplog.text and secret not in r.text


def test_health_needs_no_key_and_both_key_headers_work(tenant_proxy, upstream):
    assert httpx.get(tenant_proxy.url + "/health").text == "ok"
    openai_as(tenant_proxy, KEY_A).chat.completions.create(**CHAT)
    r = httpx.post(tenant_proxy.url + "/v1/messages", headers={"x-api-key": KEY_B},  # Claude Code's header
                   json={"model": "m", "max_tokens": 64, "messages": CHAT["messages"][1:]})
    assert r.status_code == 200
    first, second = upstream.app.state.requests
    assert first["headers"]["authorization"] == f"Bearer {KEY_A}"  # still forwarded: the upstream may check it
    assert second["headers"]["x-api-key"] == KEY_B
    assert tenant_proxy.app.tenants.stats().requests == {"team-a": 1, "team-b": 1}
    assert tenant_proxy.app.tenants.stats().refused == 0


def test_a_key_added_to_the_file_works_after_sighup(tenant_proxy, upstream, keys_file):
    ring = tenant_proxy.ring
    new = "sk-team-c-1111111111"
    assert httpx.post(tenant_proxy.url + "/v1/chat/completions", json=CHAT,
                      headers={"Authorization": f"Bearer {new}"}).status_code == 401
    keys_file.write_text(KEYS + f"{new} team-c agent\n")
    old = signal.getsignal(signal.SIGHUP)
    try:
        assert reload_on_sighup(ring)
        os.kill(os.getpid(), signal.SIGHUP)
    finally:
        signal.signal(signal.SIGHUP, old)
    openai_as(tenant_proxy, new).chat.completions.create(**CHAT)
    assert session_ids(upstream)[0].startswith("team-c/")


# -- sessions ----------------------------------------------------------------------------------

def test_one_session_id_from_two_tenants_is_two_sessions_each_its_tenants(tenant_proxy, upstream, registry):
    for key in (KEY_A, KEY_B):
        chat_loop(openai_as(tenant_proxy, key), extra_headers={"X-Session-ID": "shared-1"})
    assert session_ids(upstream) == ["team-a/shared-1"] * 2 + ["team-b/shared-1"] * 2
    assert [b["session_id"] for b in bodies(upstream)] == session_ids(upstream)
    assert tenant_proxy.app.hints.flush(5)
    for tenant in ("team-a", "team-b"):
        session = registry.session(f"{tenant}/shared-1")
        assert (session.tenant, session.steps, session.tool_calls) == (tenant, 2, 1)
    assert registry.session("shared-1") is None


def test_a_callers_own_body_ids_and_tenant_are_overwritten(tenant_proxy, upstream):
    openai_as(tenant_proxy, KEY_A).chat.completions.create(
        **CHAT, extra_body={"session_id": "b-7", "vllm_xargs": {"session_id": "b-7", "tenant": "team-b", "x": 1}})
    (body,) = bodies(upstream)
    assert body["session_id"] == body["vllm_xargs"]["session_id"] == session_ids(upstream)[0] == "team-a/b-7"
    assert body["vllm_xargs"] == {"session_id": "team-a/b-7", "tenant": "team-a", "x": 1}


def test_a_request_the_tracker_fails_on_goes_without_the_callers_ids(upstream, keys_file):
    class Broken(SessionTracker):
        def begin(self, request, headers=None):
            raise RuntimeError("bug")

    app = SagaProxy(ProxyConfig(upstream=upstream.url + "/v1"), hints=HintClient(enabled=False),
                    tracker=Broken(), tenants=Tenants(KeyRing(str(keys_file))))
    with BackgroundServer(app) as server:
        openai_as(server, KEY_A).chat.completions.create(
            **CHAT, extra_headers={"X-Session-ID": "b-7"}, extra_body={"session_id": "b-7",
                                                                        "vllm_xargs": {"session_id": "b-7"}})
    ((request,),) = [upstream.app.state.requests]
    assert "x-session-id" not in request["headers"]
    assert "session_id" not in request["body"] and request["body"]["vllm_xargs"] == {}
    assert HEX64.fullmatch(request["body"]["cache_salt"]) and app.errors["internal"] == 1


def test_identical_histories_of_two_tenants_are_two_sessions(tenant_proxy, upstream, registry):
    """Step by step in turn, so that each tenant's second request extends both answers."""
    clients = {KEY_A: openai_as(tenant_proxy, KEY_A), KEY_B: openai_as(tenant_proxy, KEY_B)}
    histories = {key: list(CHAT["messages"]) for key in clients}
    for step in range(2):
        for key, client in clients.items():
            answer = client.chat.completions.create(model="m", messages=histories[key]).choices[0].message
            if step == 0:
                histories[key] += [answer.model_dump(exclude_unset=True),
                                   {"role": "tool", "tool_call_id": answer.tool_calls[0].id, "content": "ok"}]
    a1, b1, a2, b2 = session_ids(upstream)
    assert a1 == a2 and b1 == b2 and a1 != b1
    assert a1.startswith("team-a/px-") and b1.startswith("team-b/px-")
    assert tenant_proxy.app.hints.flush(5)
    assert (registry.session(a1).tenant, registry.session(b1).tenant) == ("team-a", "team-b")


def test_another_tenants_response_id_does_not_join_its_session(tenant_proxy, upstream):
    """The scripted upstream names a response after its history: both tenants' stored
    responses get the same ids, and each follow-up names one."""
    for key in (KEY_A, KEY_B):
        run_responses_agent(openai_as(tenant_proxy, key), "tools get_user | answer", store=True)
    a1, a2, b1, b2 = session_ids(upstream)
    assert bodies(upstream)[1]["previous_response_id"] == bodies(upstream)[3]["previous_response_id"]
    assert a1 == a2 != b1 == b2
    assert tenant_proxy.app.tracker.stats().by_rule[MatchRule.PREVIOUS] == 2


def test_the_tracker_namespaces_every_id_and_starts_sessions_as_their_tenant():
    tracker = SessionTracker()
    same = (Request((), "s-1", tenant="team-a"), Request((), "s-1", tenant="team-b"), Request((), "s-1"))
    exchanges = [tracker.begin(r) for r in same]
    assert [e.session_id for e, _ in exchanges] == ["team-a/s-1", "team-b/s-1", "s-1"]
    starts = [h.event for _, hints in exchanges for h in hints if isinstance(h.event, SessionStart)]
    workflow = starts[0].workflow
    assert [(e.tenant, e.workflow) for e in starts] == [("team-a", workflow), ("team-b", workflow), ("", workflow)]


def test_namespaced_ids_are_unambiguous_and_bounded():
    assert namespaced("", "a/b") == "a/b"
    assert namespaced("a/b", "c") == "a%2Fb/c" != namespaced("a", "b/c") == "a/b/c"
    long = namespaced("t" * 200, "x" * 300)
    assert len(long) == 256 and long.startswith("%h") and long[34] == "/"
    assert namespaced("t" * 200, "x") != namespaced("t" * 201, "x")


# -- prefix-cache salt ------------------------------------------------------------------------

def test_every_agent_api_gets_its_tenants_cache_salt(tenant_proxy, upstream):
    a, b = openai_as(tenant_proxy, KEY_A), openai_as(tenant_proxy, KEY_B)
    a.chat.completions.create(**CHAT)
    b.chat.completions.create(**CHAT)
    a.chat.completions.create(**CHAT)
    a.chat.completions.create(**CHAT, extra_body={"cache_salt": "mine"})
    b.chat.completions.create(**CHAT, extra_body={"cache_salt": "mine"})
    a.completions.create(model="m", prompt="hello")  # untracked (no session id), still salted
    a.responses.create(model="m", instructions=INSTRUCTIONS, tools=RESPONSES_TOOLS, input="plan: answer")
    anthropic.Anthropic(base_url=tenant_proxy.url, api_key=KEY_A, max_retries=0).messages.create(
        model="m", max_tokens=64, messages=CHAT["messages"][1:])
    salts = [body["cache_salt"] for body in bodies(upstream)]
    a_salt, b_salt, a_again, a_mine, b_mine, *a_other_apis = salts
    assert all(HEX64.fullmatch(s) for s in salts)
    assert a_salt == a_again != b_salt
    assert len({a_salt, b_salt, a_mine, b_mine}) == 4
    assert a_other_apis == [a_salt] * 3
    assert not any("team" in s for s in salts)


def test_the_salt_secret_changes_every_salt():
    ring = KeyRing(shared_key="sk-shared-key-000")
    plain, secret = Tenants(ring), Tenants(ring, salt_secret=b"s3cret")
    assert plain.cache_salt("team-a") != secret.cache_salt("team-a") != secret.cache_salt("team-b")
    assert plain.cache_salt("team-a", None) != plain.cache_salt("team-a", "null")


# -- without keys -----------------------------------------------------------------------------

def test_without_keys_ids_go_as_sent_and_no_salt_is_added(proxy, upstream, registry):
    client = openai_as(proxy, "anything")
    chat_loop(client, extra_headers={"X-Session-ID": "shared-1"})
    client.chat.completions.create(**CHAT, extra_body={"cache_salt": "mine"})
    assert session_ids(upstream)[:2] == ["shared-1"] * 2
    assert ["cache_salt" in body for body in bodies(upstream)] == [False, False, True]
    assert bodies(upstream)[2]["cache_salt"] == "mine"
    assert proxy.app.tenants is None
    assert proxy.app.hints.flush(5)
    assert registry.session("shared-1").tenant == ""


# -- the command line -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, says", [("sk-7chr x agent\n", "keys:1"), ("sk-team-a-0123456789 a boss\n", "keys:1"),
                                        (None, "cannot read")], ids=["short-key", "bad-role", "missing"])
def test_saga_proxy_refuses_a_bad_keys_file(tmp_path, capsys, text, says, monkeypatch):
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: pytest.fail("the proxy started"))
    path = tmp_path / "keys"
    if text is not None:
        path.write_text(text)
    assert _cli(["--api-keys", str(path)]) == 2
    assert says in capsys.readouterr().err
    monkeypatch.setenv("SAGA_API_KEYS", str(path))
    assert _cli([]) == 2


def test_saga_proxy_hints_with_the_admin_key_and_refuses_any_other(keys_file, tmp_path, monkeypatch, capsys):
    from saga_server.proxy import cli

    started, reloading = [], []
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: started.append(app))
    monkeypatch.setattr(cli, "reload_on_sighup", reloading.append)
    monkeypatch.delenv("SAGA_API_KEY", raising=False)
    monkeypatch.delenv("SAGA_API_KEYS", raising=False)
    assert _cli(["--api-keys", str(keys_file)]) == 0
    monkeypatch.setenv("SAGA_API_KEY", KEY_OPS)
    assert _cli(["--api-keys", str(keys_file)]) == 0
    assert [app.hints.config.api_key for app in started] == [KEY_OPS, KEY_OPS]
    assert [ring.path for ring in reloading] == [str(keys_file)] * 2
    assert all(app.tenants.keys is ring for app, ring in zip(started, reloading))
    # A SAGA_API_KEY the file lacks is the shared key: one more admin key, of tenant
    # "", as at the hint service (KeyRing), so the proxy starts with it.
    monkeypatch.setenv("SAGA_API_KEY", "sk-shared-not-in-the-file-123")
    assert _cli(["--api-keys", str(keys_file)]) == 0
    assert started[-1].tenants.keys.lookup("sk-shared-not-in-the-file-123").caller.is_admin
    # An agent's key would make every tenant's sessions its own: refused, as is a file
    # without an admin key; --no-hints needs none.
    agents_only = tmp_path / "agents"
    agents_only.write_text(f"{KEY_A} team-a agent\n")
    for key, path, says in [(KEY_A, keys_file, "an agent key of tenant 'team-a'"),
                            (None, agents_only, "has no admin key")]:
        if key is None:
            monkeypatch.delenv("SAGA_API_KEY")
        else:
            monkeypatch.setenv("SAGA_API_KEY", key)
        assert _cli(["--api-keys", str(path)]) == 2
        assert says in capsys.readouterr().err
    assert len(started) == 3
    assert _cli(["--api-keys", str(agents_only), "--no-hints"]) == 0
    assert _cli([]) == 0 and started[-1].tenants is None


def _cli(argv: list[str]) -> int:
    from saga_server.proxy import cli

    return cli.main(["--upstream", "http://127.0.0.1:1/v1", *argv])
