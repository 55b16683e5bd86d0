"""examples/langchain_agent.py: its tools, and the forced-tool-choice middleware that
makes it terminate with a model that never picks a tool itself, checked on the wire."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from saga_sdk.integrations.langchain import SagaCallbackHandler
from saga_server.core import SessionPhase

from tests.support import chat_server as chat
from tests.support.examples import load_example


@pytest.fixture(scope="module")
def example():
    return load_example("langchain_agent")


def by_name(tools):
    return {t.name: t for t in tools}


def test_tools(example, tmp_path):
    tools = by_name(example.make_tools(example.write_corpus(tmp_path)))
    assert tools["calculator"].invoke({"expression": "6 * 7"}) == "42"
    assert tools["calculator"].invoke({"expression": "(2 + 3) ** 2 % 7"}) == "4"
    assert tools["calculator"].invoke({"expression": "__import__('os')"}).startswith("error:")
    assert tools["calculator"].invoke({"expression": "1/0"}).startswith("error:")
    assert "42" in tools["read_file"].invoke({"name": "numbers.txt"})
    with pytest.raises(ValidationError):  # the schema's enum refuses any other name
        tools["read_file"].invoke({"name": "../../etc/passwd"})
    assert tools["final_answer"].return_direct
    assert tools["read_file"].metadata["saga_expected_duration_s"] == 0.05


def test_the_agent_is_forced_to_use_tools_and_terminates(example, tmp_path, make_chat_server, hints, registry):
    # A model that, like SmolLM2, picks whatever tool it is forced to: read a file, do
    # the sum, and then the middleware names final_answer.
    def script(body):
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            return chat.tool_calls((choice["function"]["name"], {"answer": "42"}))
        done = [m for m in body["messages"] if m["role"] == "tool"]
        return chat.tool_calls(("read_file", {"name": "numbers.txt"}) if not done
                               else ("calculator", {"expression": "6 * 7"}))

    server = make_chat_server(script)
    agent = example.build_agent(server.base_url, "scripted", example.write_corpus(tmp_path), max_steps=3)
    out = agent.invoke({"messages": [("user", "q")]},
                       config={"callbacks": [SagaCallbackHandler(hints, workflow="example-react")],
                               "configurable": {"thread_id": "example"}})
    assert out["messages"][-1].content == "42"
    bodies = [r.body for r in server.chat_requests()]
    assert [b["tool_choice"] for b in bodies] == ["required", "required",
                                                  {"type": "function", "function": {"name": "final_answer"}}]
    assert all(t["function"]["strict"] for b in bodies for t in b["tools"])
    assert hints.flush(5)
    assert [(h.kind, h.detail) for h in registry.session("example").history if h.kind.startswith("tool_call_s")] \
        == [("tool_call_start", "read_file"), ("tool_call_start", "calculator"), ("tool_call_start", "final_answer")]
    assert registry.session("example").state == SessionPhase.ENDED
