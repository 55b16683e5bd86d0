"""examples/openai_agents_agent.py, run as its own `main` against the scripted model
server and a real hint service: the forced procedure (one enabled choice per step,
`tool_choice="required"`, strict bounded schemas) on the wire, and the session it makes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.support import chat_server as chat
from tests.support.examples import EXAMPLES, load_example

ROOT = EXAMPLES.parent

ARGUMENTS = {"get_user_details": {"user_id": "mia_li_3668"}, "transfer_to_writer": {"flight": "HAT001"},
             "search_flights": {"origin": "JFK", "destination": "SFO", "date": "2024-05-20"}}


@pytest.fixture(scope="module")
def example():
    return load_example("openai_agents_agent")


def specs(body) -> list[dict]:
    """The offered tools' definitions (chat nests them under "function")."""
    return [t.get("function") or t for t in body.get("tools") or []]


def offered(body) -> list[str]:
    return [spec["name"] for spec in specs(body)]


def forced_model(body):
    """Like SmolLM2 under guided decoding: calls whatever tool it must, else answers."""
    tools = offered(body)
    return chat.tool_calls((tools[0], ARGUMENTS[tools[0]])) if tools else chat.text("HAT001 is yours.")


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_example_follows_its_procedure_as_one_session(example, api, chat_server, hint_server, registry,
                                                          capsys):
    chat_server.script = forced_model
    sid = f"example-{api}"
    assert asyncio.run(example.main(["--base-url", chat_server.base_url, "--hints", hint_server.endpoint,
                                     "--model", "scripted", "--api", api, "--session-id", sid])) == 0

    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary == {"session": sid, "llm_calls": 4, "last_agent": "writer",
                       "steps": ["get_user_details", "search_flights", "transfer_to_writer"]}
    bodies = [r.body for r in chat_server.model_requests()]
    # exactly one choice offered per booking step, and it is required; the writer only writes
    assert [offered(b) for b in bodies] == [["get_user_details"], ["search_flights"], ["transfer_to_writer"], []]
    assert [b.get("tool_choice") for b in bodies] == ["required"] * 3 + [None]
    assert all(spec["strict"] for b in bodies[:3] for spec in specs(b))
    schemas = [spec["parameters"] for b in bodies[:2] for spec in specs(b)]
    assert schemas[0]["properties"]["user_id"]["maxLength"] == 24
    assert {p["pattern"] for p in schemas[1]["properties"].values()} == {"^[A-Z]{3}$",
                                                                         "^20[0-9]{2}-[0-9]{2}-[0-9]{2}$"}
    assert all(b["temperature"] == 0 and b["seed"] == 0 for b in bodies)
    assert {r.headers.get("x-session-id") for r in chat_server.model_requests()} == {sid}

    events = registry.of(sid)
    assert [type(e).__name__ for e in events] == [
        "SessionStart", "LlmCallStart", "LlmCallEnd", "ToolCallStart", "ToolCallEnd",
        "LlmCallStart", "LlmCallEnd", "ToolCallStart", "ToolCallEnd",
        "LlmCallStart", "LlmCallEnd", "LlmCallStart", "LlmCallEnd", "SessionEnd"]
    assert [e.node for e in events if type(e).__name__ == "LlmCallStart"] == ["booking"] * 3 + ["writer"]
    assert ("booking", "writer") in events[0].structure.edges
    assert (events[0].tenant, events[0].deadline_s) == ("example", 300)


@pytest.fixture
def proxy(chat_server, hint_server):
    """`saga proxy` between the example and the scripted model server."""
    from tests.support.proxies import start_proxy, stop_proxy

    server = start_proxy(chat_server.base_url, hint_server.endpoint)
    yield server
    stop_proxy(server)


def test_the_example_unchanged_under_saga_run_is_one_proxy_session(chat_server, proxy, registry):
    """Its own hints are off under the proxy, but its session still names the requests:
    the proxy hints that session, once, with the tool calls it sees (to it the handoff
    is one more tool call)."""
    chat_server.script = forced_model
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SAGA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server")])
    r = subprocess.run([sys.executable, "-m", "saga_server.cli", "run", "--proxy", proxy.url + "/v1", "--",
                        sys.executable, str(EXAMPLES / "openai_agents_agent.py"), "--session-id", "under-run"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["steps"] == ["get_user_details", "search_flights",
                                                              "transfer_to_writer"]
    assert {req.headers.get("x-session-id") for req in chat_server.model_requests()} == {"under-run"}
    assert proxy.app.hints.flush(5)
    events = registry.of("under-run")
    assert [type(e).__name__ for e in events].count("SessionStart") == 1
    assert [(type(e).__name__, e.tool) for e in events if type(e).__name__.startswith("ToolCall")] == [
        (kind, name) for name in ("get_user_details", "search_flights", "transfer_to_writer")
        for kind in ("ToolCallStart", "ToolCallEnd")]
