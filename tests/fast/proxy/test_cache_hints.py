"""`cache_hints`: the cache TTL a request asks for, in each API's words, and the engine
port handing it to the engine."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from saga_server.proxy.cache_hints import MAX_SCAN_ITEMS, cache_ttl_s, duration_s
from saga_server.proxy.engine_port import SessionIdentityMiddleware

from .test_engine_port import Recorder

EPHEMERAL = {"type": "ephemeral"}


@pytest.mark.parametrize("body, ttl", [
    ({"system": [{"type": "text", "text": "s", "cache_control": EPHEMERAL}]}, 300.0),            # no ttl: 5m
    ({"system": [{"type": "text", "text": "s", "cache_control": {**EPHEMERAL, "ttl": "1h"}}],
      "messages": [{"role": "user", "content": [{"type": "text", "text": "q",
                                                 "cache_control": {**EPHEMERAL, "ttl": "5m"}}]}]}, 3600.0),
    ({"tools": [{"name": "t", "cache_control": {**EPHEMERAL, "ttl": "5m"}}]}, 300.0),
    ({"cache_control": {**EPHEMERAL, "ttl": "1h"}, "messages": []}, 3600.0),                   # top level
    ({"prompt_cache_retention": "24h"}, 86400.0),
    ({"prompt_cache_retention": "in_memory"}, 300.0),
    ({"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}}, 1800.0),
    ({"messages": [{"role": "user", "content": "plain text"}]}, None),
    ({"system": [{"cache_control": {"type": "persistent", "ttl": "1h"}}]}, None),            # not ephemeral
    ({"system": [{"cache_control": {**EPHEMERAL, "ttl": "forever"}}], "prompt_cache_retention": 5}, None),
    ({"system": "x", "messages": {"not": "a list"}, "tools": [None, 3, "s"]}, None),
])
def test_each_apis_cache_hint_gives_the_longest_ttl_asked_for(body, ttl):
    assert cache_ttl_s(body) == ttl


def test_durations_and_a_bounded_scan():
    assert [duration_s(v) for v in ("90s", "5m", "1.5h", "1d", "0m", "5", 5, None)] == \
        [90.0, 300.0, 5400.0, 86400.0, None, None, None, None]
    history = [{"role": "user", "content": "x"}] * MAX_SCAN_ITEMS
    late = {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": EPHEMERAL}]}
    assert cache_ttl_s({"messages": history + [late]}) is None  # past the scan budget: not read
    assert cache_ttl_s({"messages": history[:10] + [late]}) == 300.0


def test_the_port_hands_the_ttl_to_the_engine_unless_the_callers_own_is_longer():
    client = TestClient(SessionIdentityMiddleware(recorder := Recorder()), base_url="http://engine")
    body = {"model": "m", "system": [{"type": "text", "text": "s", "cache_control": {**EPHEMERAL, "ttl": "1h"}}]}
    client.post("/v1/messages", content=json.dumps(body), headers={"content-type": "application/json"})
    assert json.loads(recorder.seen[-1][1])["vllm_xargs"] == {"cache_ttl_s": 3600.0}
    own = {**body, "vllm_xargs": {"cache_ttl_s": "7200"}}
    raw = json.dumps(own).encode()
    client.post("/v1/messages", content=raw, headers={"content-type": "application/json"})
    assert recorder.seen[-1][1] == raw
    client.post("/v1/embeddings", content=json.dumps(body), headers={"content-type": "application/json"})
    assert json.loads(recorder.seen[-1][1]) == body  # not a session route: not read
