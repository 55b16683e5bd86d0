"""`TenantKeysMiddleware` (the engine's HTTP port under `saga serve --api-keys`),
in front of an ASGI app that records what reached it."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.testclient import TestClient

from saga_server.rpc import KeyRing
from saga_server.proxy import engine_port
from saga_server.proxy.engine_port import TenantKeysMiddleware

KEY_A, KEY_B, KEY_OPS = "sk-port-team-a-0123", "sk-port-team-b-3210", "sk-port-ops-admin-77"
CHAT = "/v1/chat/completions"


class Recorder:
    """The engine's side: every request that reached it, headers and JSON body."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict, bytes]] = []

    async def __call__(self, scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.seen.append(({k.decode(): v.decode() for k, v in scope["headers"]}, body))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def port(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} team-a agent min_deadline_s=60\n{KEY_B} team-b agent\n{KEY_OPS} ops admin\n")
    engine = Recorder()
    middleware = TenantKeysMiddleware(engine, keys=KeyRing(str(path)))
    client = TestClient(middleware, base_url="http://engine")
    client.engine = engine
    client.tenants = middleware.tenants
    return client


def _post(port, key, body, **headers):
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    return port.post(CHAT, content=body if isinstance(body, bytes) else json.dumps(body),
                     headers={"content-type": "application/json", **auth, **headers})


def _forwarded(port) -> tuple[dict, dict]:
    headers, body = port.engine.seen[-1]
    return headers, json.loads(body)


def test_a_request_without_a_known_key_gets_401_and_nothing_reaches_the_engine(port):
    for key in (None, "sk-not-a-key-of-the-file"):
        reply = _post(port, key, {"model": "m", "messages": []})
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
    assert port.get("/v1/models").status_code == 401
    assert port.engine.seen == []
    assert [port.get(p).status_code for p in ("/health", "/metrics", "/version")] == [200, 200, 200]


def test_the_keys_tenant_takes_every_field_that_could_name_another(port):
    reply = _post(port, KEY_A, {"model": "m", "session_id": "s1", "cache_salt": "mine",
                                "vllm_xargs": {"tenant": "team-b", "session_id": "team-b/x", "deadline_s": 5}},
                  **{"X-Session-ID": "team-b/y", "x-api-key": KEY_B})
    assert reply.status_code == 200
    headers, body = _forwarded(port)
    # x-api-key wins over the bearer token, as at the proxy: this request is team-b's
    assert body["session_id"] == "team-b/s1"
    assert body["vllm_xargs"] == {"tenant": "team-b", "session_id": "team-b/s1", "deadline_s": 5}
    assert "x-session-id" not in headers and int(headers["content-length"]) == len(port.engine.seen[-1][1])
    _post(port, KEY_A, {"model": "m", "session_id": "s1", "cache_salt": "mine",
                        "vllm_xargs": {"tenant": "team-b", "deadline_s": 5}})
    _, body = _forwarded(port)
    assert body["session_id"] == "team-a/s1"
    assert body["vllm_xargs"] == {"tenant": "team-a", "session_id": "team-a/s1", "deadline_s": 60}  # the floor
    assert body["cache_salt"] == port.tenants.cache_salt("team-a", "mine") != port.tenants.cache_salt("team-b", "mine")


@pytest.mark.parametrize("deadline", ["5", "nan", "soon"])
def test_a_deadline_the_engine_would_parse_as_a_number_still_meets_the_floor(port, deadline):
    _post(port, KEY_A, {"model": "m", "vllm_xargs": {"deadline_s": deadline}})
    assert _forwarded(port)[1]["vllm_xargs"]["deadline_s"] == 60


@pytest.mark.parametrize("body, headers, scoped", [
    ({}, {"X-Session-ID": "h1"}, "team-a/h1"),                            # the header alone
    ({"vllm_xargs": {"session_id": "x1"}}, {}, "team-a/x1"),              # vllm_xargs alone
    ({"session_id": "team-a/p"}, {}, "team-a/p"),                         # already team-a's (via saga proxy)
    ({"session_id": "team-b/q"}, {}, "team-a/team-b/q"),                  # another's scope: inside team-a's
    ({"session_id": "b1"}, {"X-Session-ID": "h2"}, "team-a/b1"),          # vLLM's order: the body first
    ({}, {}, None),                                                       # no session: none made up
])
def test_the_session_id_vllm_would_read_becomes_the_tenants(port, body, headers, scoped):
    _post(port, KEY_A, {"model": "m", **body}, **headers)
    forwarded_headers, forwarded = _forwarded(port)
    assert forwarded.get("session_id") == scoped == forwarded["vllm_xargs"].get("session_id")
    assert "x-session-id" not in forwarded_headers and forwarded["vllm_xargs"]["tenant"] == "team-a"


def test_bodies_that_are_not_json_objects_pass_unchanged_and_an_oversized_one_is_refused(port, monkeypatch):
    for raw in (b"[1, 2]", b"not json", b"", b"[" * 100_000):  # the last nests past the parser's stack
        assert _post(port, KEY_A, raw, **{"X-Session-ID": "raw-1"}).status_code == 200
        headers, forwarded = port.engine.seen[-1]
        assert forwarded == raw and headers["x-session-id"] == "team-a/raw-1"  # its header still scoped
    monkeypatch.setattr(engine_port, "MAX_BODY_BYTES", 10)
    n = len(port.engine.seen)
    assert _post(port, KEY_A, {"model": "a-long-model-name"}).status_code == 413
    assert len(port.engine.seen) == n


def test_a_request_without_a_body_to_rewrite_still_has_its_session_header_scoped(port):
    auth = {"Authorization": f"Bearer {KEY_A}"}
    assert port.get("/v1/models", headers={**auth, "X-Session-ID": "team-b/g"}).status_code == 200
    assert port.engine.seen[-1][0]["x-session-id"] == "team-a/team-b/g"
    assert port.get("/v1/models", headers={**auth, "X-Session-ID": "  "}).status_code == 200
    assert "x-session-id" not in port.engine.seen[-1][0]  # a blank one names nothing


def test_an_agent_key_reaches_the_inference_routes_only(port):
    agent, admin = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_OPS}"}
    for path in ("/reset_prefix_cache", "/sleep", "/pause", "/v1/load_lora_adapter", "/collective_rpc",
                 "/abort_requests", "/start_profile", "/something_vllm_adds_later"):
        reply = port.post(path, headers=agent, content=b"{}")
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "admin_only", path
    assert port.engine.seen == []
    assert port.post("/reset_prefix_cache", headers=admin, content=b"{}").status_code == 200
    for path in ("/v1/completions", "/v1/responses", "/v1/responses/resp_1/cancel", "/tokenize", "/v1/messages"):
        assert port.post(path, headers=agent, content=b"{}").status_code == 200, path
    assert port.get("/v1/responses/resp_1", headers=agent).status_code == 200
    assert len(port.engine.seen) == 7


def test_only_a_real_cors_preflight_passes_without_a_key(port):
    assert port.options(CHAT).status_code == 401  # an OPTIONS is not a preflight by itself
    preflight = {"Origin": "http://ui", "Access-Control-Request-Method": "POST"}
    assert port.options(CHAT, headers=preflight).status_code == 200
    assert len(port.engine.seen) == 1


def _call(middleware, messages: list[dict], headers: list | None = None) -> list[dict]:
    """Runs one POST through `middleware` with these receive messages; what it sent."""
    sent, queue = [], list(messages)

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": CHAT, "root_path": "", "query_string": b"",
             "headers": headers or [(b"authorization", f"Bearer {KEY_A}".encode()),
                                    (b"transfer-encoding", b"chunked")]}
    asyncio.run(middleware(scope, receive, send))
    return sent


def test_a_body_in_parts_is_rewritten_whole_and_a_hang_up_mid_body_reaches_nothing(port):
    middleware = port.app
    body = json.dumps({"model": "m", "session_id": "parts"}).encode()
    sent = _call(middleware, [{"type": "http.request", "body": body[:7], "more_body": True},
                              {"type": "http.request", "body": body[7:], "more_body": False}])
    assert sent[0]["status"] == 200
    headers, forwarded = port.engine.seen[-1]
    assert json.loads(forwarded)["session_id"] == "team-a/parts"
    assert "transfer-encoding" not in headers and int(headers["content-length"]) == len(forwarded)
    n = len(port.engine.seen)
    sent = _call(middleware, [{"type": "http.request", "body": body[:7], "more_body": True},
                              {"type": "http.disconnect"}])
    assert sent == [] and len(port.engine.seen) == n


@pytest.mark.parametrize("sid", ["s", " s ", "team-a/s", "team-b/s", "/s", "a/b/c", "%h00/x"])
def test_the_hint_service_names_an_agents_id_as_the_port_names_its_request(port, sid):
    from saga_server.core.events import Caller
    from saga_server.rpc.service import WorkflowHintsService

    _post(port, KEY_A, {"model": "m", "session_id": sid})
    service = WorkflowHintsService.__new__(WorkflowHintsService)  # only its naming rule is used
    service.scope_agent_ids = True
    assert service.session_id_of(sid, Caller("team-a", "agent")) == _forwarded(port)[1]["session_id"]


def test_without_the_keys_file_it_refuses_to_build(monkeypatch):
    monkeypatch.delenv("SAGA_API_KEYS", raising=False)
    with pytest.raises(RuntimeError, match="SAGA_API_KEYS"):
        TenantKeysMiddleware(Recorder())
