"""The OpenAI Agents SDK drop-in end to end: the example's real `Agent`s (two function
tools, a handoff) run by the real `Runner` through the SDK's `OpenAIChatCompletionsModel`
against a real `saga serve` (vLLM + SAGA scheduler + hint service, the shared fixture
of tests/real/conftest.py): with the integration, and unchanged under `saga run`
through `saga proxy`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from agents import set_tracing_disabled
from openai import AsyncOpenAI

from saga_sdk import HintClient, HintReader
from saga_sdk.integrations.openai_agents import run
from tests.support.examples import load_example
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.proxies import start_proxy, stop_proxy

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[3]
TOOLS = ["get_user_details", "search_flights"]

set_tracing_disabled(True)  # the SDK would export traces to api.openai.com


@pytest.fixture(scope="module")
def example():
    return load_example("openai_agents_agent")


@pytest.fixture
def hints(saga_server):
    client = HintClient(endpoint=saga_server.hint_addr)
    yield client
    client.close(timeout=2)


@pytest.fixture(scope="module")
def proxy(saga_server):
    server = start_proxy(saga_server.openai_url, saga_server.hint_addr)
    yield server
    stop_proxy(server)


def history(state) -> list:
    return [h.kind if h.kind in ("session_start", "session_end") else (h.kind, h.detail) for h in state.history]


def test_a_run_is_a_server_session_with_its_steps_tool_calls_and_handoff(example, saga_server, hints):
    sid = f"agents-real-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=saga_server.openai_url, api_key="unused", timeout=REQUEST_TIMEOUT_S,
                         max_retries=0)
    agent = example.build_agent(example.build_model(client, saga_server.model, "chat"))
    trip = example.Trip()

    async def main():
        try:
            return await run(agent, example.CUSTOMER, context=trip, client=hints, session_id=sid, tenant="real",
                             deadline_s=600)
        finally:
            await client.close()

    result = asyncio.run(main())
    # the forced procedure: one enabled choice per step, then the writer answers
    assert list(dict.fromkeys(trip.done)) == [*TOOLS, "transfer_to_writer"], trip.done
    assert result.last_agent.name == "writer" and isinstance(result.final_output, str)
    calls = [item.raw_item.name for item in result.new_items if type(item).__name__ == "ToolCallItem"]
    assert hints.flush(5)

    state = HintReader(saga_server.hint_addr).session(sid)
    assert state.state == "ended" and state.tenant == "real"
    assert (state.steps, state.tool_calls) == (len(result.raw_responses), len(calls))
    got = history(state)
    assert got[0] == "session_start" and got[-1] == "session_end"
    assert [d for k, d in got[1:-1] if k == "llm_call_start"] == ["booking"] * (len(result.raw_responses) - 1) + [
        "writer"]  # the handoff: the last step is the writer's
    assert list(dict.fromkeys(d for k, d in got[1:-1] if k == "tool_call_start")) == TOOLS
    for name in TOOLS:  # each tool call starts and ends between two model calls
        at = got.index(("tool_call_start", name))
        assert got[at - 1] == ("llm_call_end", "booking") and got[at + 1] == ("tool_call_end", name)


def test_the_example_unchanged_under_saga_run_is_a_proxy_session_with_its_tool_calls(saga_server, proxy):
    """Chat Completions through `saga proxy`: the proxy infers the tool calls from the
    protocol (to it the handoff is a tool call too) and sends the hints; the agent's own
    hints are off, but the integration still names the session by its header."""
    sid = f"agents-run-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SAGA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server")])
    r = subprocess.run([sys.executable, "-m", "saga_server.cli", "run", "--proxy", proxy.url + "/v1", "--",
                        sys.executable, str(ROOT / "examples" / "openai_agents_agent.py"), "--session-id", sid],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["last_agent"] == "writer"
    assert list(dict.fromkeys(summary["steps"])) == [*TOOLS, "transfer_to_writer"]
    assert sid in proxy.app.tracker.session_ids()
    assert proxy.app.hints.flush(10)

    state = HintReader(saga_server.hint_addr).session(sid)
    assert state.steps == summary["llm_calls"]
    tools = [(k, d) for k, d in (h for h in history(state) if isinstance(h, tuple)) if k.startswith("tool")]
    names = list(dict.fromkeys(d for k, d in tools if k == "tool_call_start"))
    assert names == [*TOOLS, "transfer_to_writer"]
    assert all(tools[i][0] == "tool_call_start" and tools[i + 1] == ("tool_call_end", tools[i][1])
               for i in range(0, len(tools), 2))
