"""`agent_hints`: Dynamo's `nvext.agent_hints` read into a priority jump and an
expected output length, and the engine port handing them to the engine."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from saga_server.proxy.agent_hints import MAX_OSL, AgentHints, agent_hints
from saga_server.proxy.engine_port import SessionIdentityMiddleware

from .test_engine_port import Recorder


@pytest.mark.parametrize("hints, want", [
    ({"priority": 5, "osl": 512}, AgentHints(5.0, 512)),
    ({"latency_sensitivity": 1.2}, AgentHints(1.2, None)),                 # the older alias
    ({"priority": 3, "latency_sensitivity": 9}, AgentHints(3.0, None)),   # priority wins over it
    ({"priority": -4}, AgentHints(0.0, None)),                            # never behind FCFS
    ({"priority": "high", "osl": "512"}, AgentHints()),                   # not numbers: ignored
    ({"priority": True, "osl": 0}, AgentHints()),
    ({"priority": float("nan"), "osl": MAX_OSL + 1}, AgentHints()),
    ({"speculative_prefill": True}, AgentHints()),                        # read, nothing to add
])
def test_agent_hints_read_as_dynamo_means_them(hints, want):
    assert agent_hints({"nvext": {"agent_hints": hints}}) == want


@pytest.mark.parametrize("body", [{}, {"nvext": None}, {"nvext": {"agent_hints": [1]}}, {"nvext": "x"}, []])
def test_a_body_without_readable_hints_has_none(body):
    assert not agent_hints(body)


def test_the_port_hands_the_hints_to_the_engine_unless_the_caller_set_them():
    client = TestClient(SessionIdentityMiddleware(recorder := Recorder()), base_url="http://engine")
    body = {"model": "m", "messages": [], "nvext": {"agent_hints": {"priority": 5, "osl": 200}}}
    client.post("/v1/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"})
    assert json.loads(recorder.seen[-1][1])["vllm_xargs"] == {"priority_jump_s": 5.0, "osl": 200}
    own = {**body, "vllm_xargs": {"priority_jump_s": 1, "osl": 50}}
    raw = json.dumps(own).encode()
    client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert recorder.seen[-1][1] == raw  # the caller's own: kept as it came
