"""The LangChain drop-in end to end: the example's real create_agent ReAct agent,
ChatOpenAI over the real OpenAI SDK, a real `saga serve` (vLLM + SAGA scheduler +
hint service, the shared session fixture from tests/real/conftest.py)."""

from __future__ import annotations

import uuid

import openai
import pytest
from langchain_core.messages import AIMessage, ToolMessage

from saga_sdk import HintClient, HintReader, session_scope
from saga_sdk.integrations import openai as saga_openai
from saga_sdk.integrations.langchain import SagaCallbackHandler
from tests.support.examples import load_example

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def example():
    return load_example("langchain_agent")


@pytest.fixture
def hints(saga_server):
    client = HintClient(endpoint=saga_server.hint_addr)
    yield client
    client.close(timeout=2)


def test_agent_run_is_a_server_session_with_steps_tools_and_cache_hits(example, saga_server, hints, tmp_path):
    sid = f"lc-real-{uuid.uuid4().hex[:8]}"
    agent = example.build_agent(saga_server.openai_url, saga_server.model, example.write_corpus(tmp_path), max_steps=3)
    out = agent.invoke({"messages": [("user", "Read numbers.txt, then compute 6 * 7.")]},
                       config={"callbacks": [SagaCallbackHandler(hints, workflow="lc-real")],
                               "configurable": {"thread_id": sid}})
    ai = [m for m in out["messages"] if isinstance(m, AIMessage)]
    tools_called = [tc["name"] for m in ai for tc in m.tool_calls]
    assert len(ai) == 3 and tools_called[-1] == "final_answer"  # forced choice ends the run
    assert isinstance(out["messages"][-1], ToolMessage) and out["messages"][-1].name == "final_answer"
    assert hints.flush(5)

    state = HintReader(saga_server.hint_addr).session(sid)
    assert state.state == "ended"
    assert (state.steps, state.tool_calls) == (3, 3)
    expected = ["session_start"]
    for name in tools_called:
        expected += [("llm_call_start", "model"), ("llm_call_end", "model"),
                     ("tool_call_start", name), ("tool_call_end", name)]
    got = [h.kind if h.kind in ("session_start", "session_end") else (h.kind, h.detail) for h in state.history]
    assert got == expected + ["session_end"]

    # Every later step re-sends the growing conversation: the server's prefix cache
    # serves its start (usage.prompt_tokens_details.cached_tokens via ChatOpenAI).
    cached = [m.usage_metadata.get("input_token_details", {}).get("cache_read", 0) for m in ai]
    assert all(c > 0 for c in cached[1:]), cached
    assert all(m.usage_metadata["input_tokens"] > cached[i] for i, m in enumerate(ai))


def test_the_session_header_reaches_the_engine(saga_server):
    """A plain OpenAI SDK call, no hints at all: the patch's X-Session-ID alone makes
    the engine (vLLM's request.session_id -> SAGA scheduler) know the session."""
    sid = f"wire-only-{uuid.uuid4().hex[:8]}"
    saga_openai.instrument()
    try:
        client = openai.OpenAI(base_url=saga_server.openai_url, api_key="unused")
        with session_scope(sid):
            client.chat.completions.create(model=saga_server.model, max_tokens=4,
                                           messages=[{"role": "user", "content": "Say hi."}])
    finally:
        saga_openai.uninstrument()
    state = HintReader(saga_server.hint_addr).session(sid)
    assert state.steps >= 1
