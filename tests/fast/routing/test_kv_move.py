"""`move_prefix` against scripted engines (httpx's mock transport standing in for two
engines' OpenAI API): a pull when the source hands over, a re-prefill on the target
for every way it cannot, and no exception either way."""

from __future__ import annotations

import json

import httpx

from saga_server.router.kv_move import Endpoint, move_kv, move_prefix

HANDLE = {"do_remote_prefill": True, "remote_block_ids": [[1, 2, 3]], "remote_engine_id": "e1",
          "remote_host": "127.0.0.1", "remote_port": 5601}


def engines(source, target):
    """A client whose requests to http://source and http://target are answered by the
    two functions (request body -> httpx.Response); returns it and the target's bodies."""
    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.host == "source":
            return source(body)
        seen.append(body)
        return target(body)

    return httpx.Client(transport=httpx.MockTransport(handle)), seen


def answer(prompt_tokens: int = 96, **extra) -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {"prompt_tokens": prompt_tokens}, **extra})


def test_the_target_pulls_with_the_handle_the_source_gave():
    client, seen = engines(lambda body: answer(kv_transfer_params=HANDLE), lambda body: answer())
    move = move_prefix("http://source", "http://target", "m", list(range(96)), client=client)
    assert move.pulled and move.warm and move.fallback == "" and move.pulled_tokens == 96
    assert [b.get("kv_transfer_params") for b in seen] == [HANDLE]
    assert seen[0]["prompt"] == list(range(96)) and seen[0]["max_tokens"] == 1


def test_every_way_a_pull_cannot_happen_re_prefills_on_the_target():
    cases = {
        "source unreachable": lambda body: (_ for _ in ()).throw(httpx.ConnectError("refused")),
        "source answered HTTP 503": lambda body: httpx.Response(503),
        "without the NIXL connector": lambda body: answer(),  # no kv_transfer_params
    }
    for why, source in cases.items():
        client, seen = engines(source, lambda body: answer())
        move = move_prefix("http://source", "http://target", "m", [1, 2, 3], client=client)
        assert not move.pulled and move.warm and why in move.fallback and move.pulled_tokens == 0, (why, move)
        assert [("kv_transfer_params" in b) for b in seen] == [False]  # one plain re-prefill


def test_a_failed_pull_re_prefills_and_a_dead_target_never_raises():
    client, seen = engines(lambda body: answer(kv_transfer_params=HANDLE),
                           lambda body: httpx.Response(500) if "kv_transfer_params" in body else answer())
    move = move_prefix("http://source", "http://target", "m", [1, 2, 3], client=client)
    assert not move.pulled and move.warm and move.fallback == "pull failed (HTTP 500)"
    assert [("kv_transfer_params" in b) for b in seen] == [True, False]

    client, _ = engines(lambda body: answer(kv_transfer_params=HANDLE), lambda body: httpx.Response(500))
    move = move_prefix("http://source", "http://target", "m", [1, 2, 3], client=client)
    assert not move.pulled and not move.warm and "re-prefill failed too" in move.fallback


def test_a_move_through_a_front_routes_each_half_by_its_headers_on_the_given_path():
    calls = []

    def front(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append((request.url.path, request.headers["x-session-id"], "kv_transfer_params" in body))
        to_source = request.headers["x-session-id"] == "move:source"
        return answer(12, kv_transfer_params=HANDLE) if to_source else answer(12)

    client = httpx.Client(transport=httpx.MockTransport(front))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream": False}
    move = move_kv(Endpoint("http://front", {"X-Session-ID": "move:source"}),
                   Endpoint("http://front", {"X-Session-ID": "move:target"}), body,
                   path="/v1/chat/completions", client=client)
    assert move.pulled and move.prompt_tokens == 12
    assert calls == [("/v1/chat/completions", "move:source", True), ("/v1/chat/completions", "move:target", True)]
