"""The AutoGen integration end to end: the example's real `AssistantAgent` and team,
the real `OpenAIChatCompletionClient`, a real `saga serve` (vLLM + SAGA scheduler +
hint service: the shared session fixture of tests/real/conftest.py)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from autogen_core import SingleThreadedAgentRuntime

from saga_sdk import HintClient, HintReader
from saga_sdk.integrations import autogen as saga_autogen
from tests.support.examples import load_example

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def example():
    return load_example("autogen_agent")


@pytest.fixture
def hints(saga_server):
    client = HintClient(endpoint=saga_server.hint_addr)
    yield client
    client.close(timeout=2)
    saga_autogen.uninstrument()


def record_raw_usage(model_client) -> list:
    """Keep each raw OpenAI response's usage: AutoGen's `RequestUsage` drops
    `prompt_tokens_details.cached_tokens`. The call itself goes through unchanged."""
    completions = model_client.wrapped._client.chat.completions
    original, seen = completions.create, []

    async def create(*args, **kwargs):
        response = await original(*args, **kwargs)
        seen.append(response.usage)
        return response

    completions.create = create
    return seen


def history(state) -> list:
    return [h.kind if h.kind in ("session_start", "session_end") else (h.kind, h.detail) for h in state.history]


def test_agent_run_is_a_server_session_with_steps_tools_and_cache_hits(example, saga_server, hints, tmp_path):
    sid = f"ag-real-{uuid.uuid4().hex[:8]}"
    model_client = example.build_model_client(saga_server.openai_url, saga_server.model, hints=hints)
    usages = record_raw_usage(model_client)
    agent = example.build_agent(model_client, example.write_corpus(tmp_path), max_tool_iterations=3)

    result = asyncio.run(saga_autogen.run(agent, task="Read saga.txt, then compute 6 * 7.", client=hints,
                                          session_id=sid, tenant="real", deadline_s=300))
    called = [c.name for m in result.messages if type(m).__name__ == "ToolCallRequestEvent" for c in m.content]
    assert len(called) == 3  # forced choice: every step calls a tool; the iteration limit ends the run
    assert hints.flush(5)

    state = HintReader(saga_server.hint_addr).session(sid)
    assert state.state == "ended" and state.tenant == "real"
    assert (state.steps, state.tool_calls) == (3, 3)
    expected = ["session_start"]
    for name in called:
        expected += [("llm_call_start", "researcher"), ("llm_call_end", "researcher"),
                     ("tool_call_start", name), ("tool_call_end", name)]
    assert history(state) == expected + ["session_end"]

    # Each later step re-sends the growing conversation: the prefix cache serves its start.
    cached = [u.prompt_tokens_details.cached_tokens or 0 for u in usages]
    assert len(cached) == 3 and all(c > 0 for c in cached[1:]), cached
    assert all(u.prompt_tokens > c for u, c in zip(usages, cached))


def test_team_on_a_runtime_started_before_the_run(example, saga_server, hints, tmp_path):
    """Contextvars never reach a runtime started earlier: the session travels by team id."""
    sid = f"ag-team-{uuid.uuid4().hex[:8]}"
    model_client = example.build_model_client(saga_server.openai_url, saga_server.model, hints=hints)
    corpus = example.write_corpus(tmp_path)

    async def main():
        runtime = SingleThreadedAgentRuntime()
        runtime.start()
        team = example.build_team(model_client, corpus, runtime=runtime)
        try:
            return await saga_autogen.run(team, task="Read numbers.txt and multiply its two numbers.",
                                          client=hints, session_id=sid)
        finally:
            await runtime.stop()

    result = asyncio.run(main())
    assert [m.source for m in result.messages if type(m).__name__ != "ToolCallRequestEvent"
            and type(m).__name__ != "ToolCallExecutionEvent"] == ["user", "researcher", "reviewer"]
    assert hints.flush(5)
    state = HintReader(saga_server.hint_addr).session(sid)
    assert state.state == "ended" and (state.steps, state.tool_calls) == (3, 2)
    nodes = [h.detail for h in state.history if h.kind == "llm_call_start"]
    assert nodes == ["researcher", "researcher", "reviewer"]
