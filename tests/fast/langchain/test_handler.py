"""SagaCallbackHandler: real LangChain/LangGraph agents (create_agent, ToolNode, LCEL,
ChatOpenAI over the real OpenAI SDK) against a real gRPC hint service; the model is
the scripted chat server (see tests/support/chat_server.py for why)."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from pathlib import Path

import pytest
from langchain.agents import create_agent
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import ToolException, tool
from langchain_openai import ChatOpenAI, OpenAI
from langgraph.graph import END, START, MessagesState, StateGraph

from saga_sdk import HintClient, current_session, set_client
from saga_sdk.integrations.langchain import SagaCallbackHandler, describe_graph, saga_tool_hint
from saga_sdk.logs import LogOnce

from saga_server.core.events import (LlmCallEnd, SessionOutcome, SessionPhase, SessionStart, ToolCallEnd, ToolCallStart,
                                      ToolOutcome)
from saga_server.serve_child import free_port

from tests.support import chat_server as chat


# -- tools and scripts -------------------------------------------------------------------

@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def tool_results(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def calls_then_answer(*calls):
    """First turn: call the tools; then answer with what they returned."""
    def script(body):
        results = tool_results(body)
        return chat.text("answer " + ",".join(results)) if results else chat.tool_calls(*calls)
    return script


def model(server) -> ChatOpenAI:
    return ChatOpenAI(model="scripted", base_url=server.base_url, api_key="test", max_retries=0)


def history(registry, sid: str) -> list[tuple[str, str]]:
    return [(h.kind, h.detail) for h in registry.session(sid).history]


def contents(result) -> list[tuple[str, str]]:
    return [(type(m).__name__, str(m.content)) for m in result["messages"]]


USER = {"messages": [("user", "what is 1+2?")]}
SDK = Path(__file__).resolve().parents[3] / "sdk"


# -- the basic agent loop ---------------------------------------------------------------------

def test_react_agent_becomes_one_session_in_order(make_chat_server, hints, registry):
    server = make_chat_server(calls_then_answer(("add", {"a": 1, "b": 2})))
    agent = create_agent(model(server), [add, mul])
    out = agent.invoke(USER, config={"callbacks": [SagaCallbackHandler(hints)],
                                     "configurable": {"thread_id": "thread-7"}})
    assert out["messages"][-1].content == "answer 3"
    assert hints.flush(5)
    assert history(registry, "thread-7") == [
        ("session_start", "LangGraph"),
        ("llm_call_start", "model"), ("llm_call_end", "model"),
        ("tool_call_start", "add"), ("tool_call_end", "add"),
        ("llm_call_start", "model"), ("llm_call_end", "model"),
        ("session_end", "completed"),
    ]
    events = registry.of("thread-7")
    (tool_start,) = [e for e in events if isinstance(e, ToolCallStart)]
    assert tool_start.call_id == out["messages"][1].tool_calls[0]["id"]  # the model's tool_call_id
    # the server's usage (10 prompt tokens a message: user; user, AI, tool) reaches the hints
    assert [(e.step, e.prompt_tokens, e.output_tokens) for e in events if isinstance(e, LlmCallEnd)] == \
        [(1, 10, 5), (2, 30, 5)]
    # every request of the session carried its id, with no change to the model object
    assert [r.headers.get("x-session-id") for r in server.chat_requests()] == ["thread-7", "thread-7"]
    assert current_session() is None  # the context is reset after the run


def test_session_id_from_metadata_wins_and_root_run_id_is_the_default(make_chat_server, hints, registry):
    server = make_chat_server(calls_then_answer(("add", {"a": 1, "b": 2})))
    agent = create_agent(model(server), [add])
    handler = SagaCallbackHandler(hints)
    agent.invoke(USER, config={"callbacks": [handler], "metadata": {"session_id": "mine"},
                               "configurable": {"thread_id": "thread-x"}})
    run_id = uuid.uuid4()
    agent.invoke(USER, config={"callbacks": [handler], "run_id": run_id})
    assert hints.flush(5)
    assert registry.session("mine").state == SessionPhase.ENDED
    assert registry.session("thread-x") is None
    assert registry.session(str(run_id)).steps == 2
    assert {r.headers["x-session-id"] for r in server.chat_requests()} == {"mine", str(run_id)}


def test_structure_is_declared_once_per_workflow(make_chat_server, hints, registry):
    server = make_chat_server(calls_then_answer(("add", {"a": 1, "b": 2})))
    agent = create_agent(model(server), [add, mul])
    handler = SagaCallbackHandler(hints, workflow=f"calc-{uuid.uuid4().hex[:6]}")
    for tid in ("s1", "s2"):
        agent.invoke(USER, config={"callbacks": [handler], "configurable": {"thread_id": tid}})
    assert hints.flush(5)
    first, second = [e for e in registry.events if isinstance(e, SessionStart)]
    assert first.workflow == second.workflow == handler.workflow
    nodes = {(n.name, n.kind) for n in first.structure.nodes}
    assert nodes == {("model", "llm"), ("add", "tool"), ("mul", "tool"), ("__end__", "end")}
    assert set(first.structure.edges) == {("model", "add"), ("model", "mul"), ("add", "model"),
                                          ("mul", "model"), ("model", "__end__")}
    assert second.structure is None
    assert describe_graph(agent) == ([(n.name, n.kind) for n in first.structure.nodes],
                                     list(first.structure.edges))


def test_structure_is_found_under_ainvoke_too(make_chat_server, hints, registry):
    server = make_chat_server(calls_then_answer(("mul", {"a": 2, "b": 3})))
    agent = create_agent(model(server), [mul])
    handler = SagaCallbackHandler(hints, workflow="async-structure")
    asyncio.run(agent.ainvoke(USER, config={"callbacks": [handler], "configurable": {"thread_id": "as-s"}}))
    assert hints.flush(5)
    (start,) = [e for e in registry.events if isinstance(e, SessionStart)]
    assert {(n.name, n.kind) for n in start.structure.nodes} == {("model", "llm"), ("mul", "tool"),
                                                                  ("__end__", "end")}


def test_an_explicit_graph_is_declared_for_a_plain_chain_root(make_chat_server, hints, registry):
    server = make_chat_server()
    agent = create_agent(model(server), [add])
    chain = RunnableLambda(lambda x: x) | model(server)  # root is a chain, not the graph
    chain.invoke("hi", config={"callbacks": [SagaCallbackHandler(hints, graph=agent, workflow="explicit")],
                               "metadata": {"session_id": "explicit"}})
    assert hints.flush(5)
    (start,) = [e for e in registry.events if isinstance(e, SessionStart)]
    assert ("add", "tool") in {(n.name, n.kind) for n in start.structure.nodes}


# -- concurrency -------------------------------------------------------------------------------

def test_parallel_tool_calls_are_each_reported(make_chat_server, hints, registry):
    barrier = threading.Barrier(3, timeout=10)  # passes only if all three run at once

    @tool
    def probe(i: int) -> int:
        """Wait for the other probes, then return i."""
        barrier.wait()
        return i

    server = make_chat_server(calls_then_answer(*[("probe", {"i": i}) for i in range(3)]))
    agent = create_agent(model(server), [probe])
    out = agent.invoke(USER, config={"callbacks": [SagaCallbackHandler(hints)],
                                     "configurable": {"thread_id": "par"}})
    assert out["messages"][-1].content == "answer 0,1,2"
    assert hints.flush(5)
    kinds = [k for k, _ in history(registry, "par")]
    assert kinds[3:9] == ["tool_call_start"] * 3 + ["tool_call_end"] * 3  # truly concurrent
    events = registry.of("par")
    starts = {e.call_id for e in events if isinstance(e, ToolCallStart)}
    ends = {e.call_id for e in events if isinstance(e, ToolCallEnd) and e.outcome is ToolOutcome.OK}
    assert starts == ends == {tc["id"] for tc in out["messages"][1].tool_calls}
    assert registry.session("par").open_tools == ()


def test_async_ainvoke_with_parallel_async_tools_and_concurrent_sessions(make_chat_server, hints, registry):
    barrier = None

    @tool
    async def aprobe(i: int) -> int:
        """Wait for the other probes, then return i."""
        await asyncio.wait_for(barrier.wait(), 10)
        return i

    server = make_chat_server(calls_then_answer(*[("aprobe", {"i": i}) for i in range(2)]))
    agent = create_agent(model(server), [aprobe])
    handler = SagaCallbackHandler(hints)

    async def main():
        nonlocal barrier
        barrier = asyncio.Barrier(4)  # two sessions x two tools, all at once
        return await asyncio.gather(*(agent.ainvoke(USER, config={"callbacks": [handler],
                                                                   "configurable": {"thread_id": f"as{i}"}})
                                      for i in range(2)))

    outs = asyncio.run(main())
    assert [o["messages"][-1].content for o in outs] == ["answer 0,1"] * 2
    assert hints.flush(5)
    for i in range(2):
        kinds = [k for k, _ in history(registry, f"as{i}")]
        assert kinds == ["session_start", "llm_call_start", "llm_call_end", "tool_call_start", "tool_call_start",
                         "tool_call_end", "tool_call_end", "llm_call_start", "llm_call_end", "session_end"]
    by_session = {}
    for r in server.chat_requests():
        by_session.setdefault(r.headers["x-session-id"], []).append(r)
    assert sorted(by_session) == ["as0", "as1"] and all(len(v) == 2 for v in by_session.values())
    assert handler._runs == {} and handler._llm == {} and handler._tools == {}


# -- errors ------------------------------------------------------------------------------------

def test_a_handled_tool_error_is_an_error_outcome_and_the_agent_goes_on(make_chat_server, hints, registry):
    @tool
    def flaky(x: int) -> int:
        """Always fails."""
        raise ToolException("disk on fire")

    flaky.handle_tool_error = True
    server = make_chat_server(calls_then_answer(("flaky", {"x": 1})))
    agent = create_agent(model(server), [flaky])
    out = agent.invoke(USER, config={"callbacks": [SagaCallbackHandler(hints)],
                                     "configurable": {"thread_id": "handled"}})
    assert out["messages"][-1].content == "answer disk on fire"
    assert hints.flush(5)
    (end,) = [e for e in registry.of("handled") if isinstance(e, ToolCallEnd)]
    assert end.outcome is ToolOutcome.ERROR
    assert registry.of("handled")[-1].outcome is SessionOutcome.COMPLETED


def test_an_unhandled_tool_error_fails_the_session_and_reaches_the_user_unchanged(make_chat_server, hints, registry):
    @tool
    def broken(x: int) -> int:
        """Always raises."""
        raise KeyError("no such key")

    server = make_chat_server(calls_then_answer(("broken", {"x": 1})))
    agent = create_agent(model(server), [broken])
    with pytest.raises(KeyError, match="no such key"):
        agent.invoke(USER, config={"callbacks": [SagaCallbackHandler(hints)],
                                   "configurable": {"thread_id": "unhandled"}})
    assert current_session() is None
    assert hints.flush(5)
    events = registry.of("unhandled")
    (end,) = [e for e in events if isinstance(e, ToolCallEnd)]
    assert end.outcome is ToolOutcome.ERROR
    assert events[-1].outcome is SessionOutcome.FAILED
    assert registry.session("unhandled").state == SessionPhase.ENDED


# -- nesting -----------------------------------------------------------------------------------

def test_nested_chains_and_a_subgraph_stay_one_session(make_chat_server, hints, registry):
    agent_script = calls_then_answer(("add", {"a": 2, "b": 2}))

    def script(body):
        last = body["messages"][-1]
        if last["role"] == "user" and str(last["content"]).startswith("sum up"):
            return chat.text(f"echo: {last['content']}")
        return agent_script(body)

    server = make_chat_server(script)
    inner_agent = create_agent(model(server), [add])
    summarize = ChatPromptTemplate.from_messages([("user", "sum up: {text}")]) | model(server) | StrOutputParser()

    def agent_node(state: MessagesState):
        return {"messages": inner_agent.invoke({"messages": state["messages"]})["messages"][-1:]}

    def summary_node(state: MessagesState):
        # a nested LCEL chain called twice from inside a graph node
        text = RunnableLambda(lambda t: summarize.invoke({"text": t})).invoke(state["messages"][-1].content)
        return {"messages": [("assistant", summarize.invoke({"text": text}))]}

    outer = (StateGraph(MessagesState).add_node("agent", agent_node).add_node("summary", summary_node)
             .add_edge(START, "agent").add_edge("agent", "summary").add_edge("summary", END).compile())
    out = outer.invoke(USER, config={"callbacks": [SagaCallbackHandler(hints)],
                                     "configurable": {"thread_id": "nested"}})
    assert out["messages"][-1].content == "echo: sum up: echo: sum up: answer 4"
    assert hints.flush(5)
    assert history(registry, "nested") == [
        ("session_start", "LangGraph"),
        ("llm_call_start", "model"), ("llm_call_end", "model"),
        ("tool_call_start", "add"), ("tool_call_end", "add"),
        ("llm_call_start", "model"), ("llm_call_end", "model"),
        ("llm_call_start", "summary"), ("llm_call_end", "summary"),
        ("llm_call_start", "summary"), ("llm_call_end", "summary"),
        ("session_end", "completed"),
    ]
    assert [e.step for e in registry.of("nested") if isinstance(e, LlmCallEnd)] == [1, 2, 3, 4]
    assert len(registry.sessions()) == 1
    assert {r.headers["x-session-id"] for r in server.chat_requests()} == {"nested"}


def test_a_chat_model_called_alone_is_a_one_step_session(make_chat_server, hints, registry):
    server = make_chat_server()
    reply = model(server).invoke("hello", config={"callbacks": [SagaCallbackHandler(hints)],
                                                  "metadata": {"session_id": "solo"}})
    assert reply.content == "echo: hello"
    assert hints.flush(5)
    assert history(registry, "solo") == [("session_start", "ChatOpenAI"), ("llm_call_start", "ChatOpenAI"),
                                         ("llm_call_end", "ChatOpenAI"), ("session_end", "completed")]
    assert server.chat_requests()[0].headers["x-session-id"] == "solo"


def test_a_completion_llm_and_a_tool_called_alone(make_chat_server, hints, registry):
    server = make_chat_server()
    llm = OpenAI(model="scripted", base_url=server.base_url, api_key="test", max_retries=0)
    handler = SagaCallbackHandler(hints)
    assert llm.invoke("hi", config={"callbacks": [handler], "metadata": {"session_id": "legacy"}}) == "ok"
    assert add.invoke({"a": 1, "b": 1}, config={"callbacks": [handler], "metadata": {"session_id": "lone-tool"}}) == 2
    assert hints.flush(5)
    assert [k for k, _ in history(registry, "legacy")] == ["session_start", "llm_call_start", "llm_call_end",
                                                           "session_end"]
    assert history(registry, "lone-tool") == [("session_start", "add"), ("tool_call_start", "add"),
                                              ("tool_call_end", "add"), ("session_end", "completed")]
    assert server.requests[0].path == "/v1/completions"
    assert server.requests[0].headers["x-session-id"] == "legacy"


# -- SAGA unavailable or broken: the agent never notices ---------------------------------------

def run_calc(server, callbacks, thread_id):
    agent = create_agent(model(server), [add, mul])
    return agent.invoke(USER, config={"callbacks": callbacks, "configurable": {"thread_id": thread_id}})


def test_hint_server_down_same_output(make_chat_server):
    script = calls_then_answer(("add", {"a": 1, "b": 2}), ("mul", {"a": 3, "b": 4}))
    plain = run_calc(make_chat_server(script), [], "down")
    down = HintClient(endpoint=f"127.0.0.1:{free_port()}", rpc_timeout_s=0.2)
    try:
        server = make_chat_server(script)
        hinted = run_calc(server, [SagaCallbackHandler(down)], "down")
        assert contents(hinted) == contents(plain)
        assert contents(hinted)[-1] == ("AIMessage", "answer 3,12")
        assert down.flush(0.3) is False and down.stats().sent == 0  # nothing got through...
        assert all(r.headers["x-session-id"] == "down" for r in server.chat_requests())  # ...yet tagged
    finally:
        down.close(timeout=0.2)


class ExplodingClient(HintClient):
    """A client whose every hint raises: a bug inside SAGA, seen from the handler."""

    def _put(self, kind, session_id, payload):
        raise RuntimeError(f"boom in {kind}")


def test_a_failing_handler_never_reaches_the_chain_and_logs_once(make_chat_server, caplog, monkeypatch):
    import saga_sdk.integrations.langchain as lc

    monkeypatch.setattr(lc, "_log_once", LogOnce(lc.log))  # a fresh memory
    script = calls_then_answer(("add", {"a": 1, "b": 2}))
    plain = run_calc(make_chat_server(script), [], "boom")
    handler = SagaCallbackHandler(ExplodingClient(enabled=True))
    handler.raise_error = True  # even if LangChain were told to re-raise handler errors
    with caplog.at_level(logging.WARNING, logger="saga_sdk.langchain"):
        first = run_calc(make_chat_server(script), [handler], "boom")
        second = run_calc(make_chat_server(script), [handler], "boom")
    assert contents(first) == contents(second) == contents(plain)
    assert current_session() is None  # the context is restored even when the hint failed
    assert handler._runs == {} and handler._llm == {} and handler._tools == {}
    failures = [r for r in caplog.records if "handler failed" in r.message]
    assert sorted(r.args[0] for r in failures) == ["on_chain_end", "on_chain_start", "on_chat_model_start",
                                                   "on_llm_end", "on_tool_end", "on_tool_start"]  # once each


class FailingStartClient(HintClient):
    """session_start fails (a user-supplied client with a bug); the rest works."""

    def session_start(self, *args, **kwargs):
        raise RuntimeError("no sessions today")


def test_a_failed_session_start_still_keeps_the_run_one_session(make_chat_server, hint_server, registry):
    client = FailingStartClient(endpoint=hint_server.endpoint, flush_interval_s=0)
    try:
        server = make_chat_server(calls_then_answer(("add", {"a": 1, "b": 2})))
        out = run_calc(server, [SagaCallbackHandler(client)], "half")
        assert out["messages"][-1].content == "answer 3"
        assert client.flush(5)
    finally:
        client.close(timeout=1)
    sessions = {e.session_id for e in registry.events}
    assert sessions == {"half"}  # children did not each start a session of their own
    assert {r.headers["x-session-id"] for r in server.chat_requests()} == {"half"}


# -- tool duration hints -------------------------------------------------------------------------

def test_expected_tool_durations_from_decorator_and_mapping(make_chat_server, hints, registry):
    @saga_tool_hint(expected_duration_s=2.5, category="io")
    @tool
    def slow_read(path: str) -> str:
        """Read a file."""
        return "content"

    server = make_chat_server(calls_then_answer(("slow_read", {"path": "a"}), ("add", {"a": 1, "b": 1})))
    agent = create_agent(model(server), [slow_read, add])
    agent.invoke(USER, config={"callbacks": [SagaCallbackHandler(hints, tool_hints={"add": 0.1})],
                               "configurable": {"thread_id": "dur"}})
    assert hints.flush(5)
    starts = {e.tool: (e.expected_duration_s, e.category)
              for e in registry.of("dur") if isinstance(e, ToolCallStart)}
    assert starts == {"slow_read": (2.5, "io"), "add": (pytest.approx(0.1), "")}
    assert slow_read.metadata == {"saga_expected_duration_s": 2.5, "saga_tool_category": "io"}


def test_tool_hint_rejects_bad_input():
    with pytest.raises(ValueError, match="expected_duration_s"):
        saga_tool_hint(add, expected_duration_s=-1)
    with pytest.raises(TypeError, match="BaseTool"):
        saga_tool_hint(lambda: None, expected_duration_s=1)


def test_no_duration_hint_sends_none(make_chat_server, hints, registry):
    server = make_chat_server(calls_then_answer(("mul", {"a": 2, "b": 3})))
    create_agent(model(server), [mul]).invoke(USER, config={"callbacks": [SagaCallbackHandler(hints)],
                                                              "configurable": {"thread_id": "nodur"}})
    assert hints.flush(5)
    (start,) = [e for e in registry.of("nodur") if isinstance(e, ToolCallStart)]
    assert (start.expected_duration_s, start.category) == (None, "")


# -- zero-touch activation -------------------------------------------------------------------------

def test_env_var_makes_the_handler_global_without_doubling_an_explicit_one(make_chat_server, hints, registry,
                                                                            monkeypatch):
    monkeypatch.setenv("SAGA_LANGCHAIN", "1")
    set_client(hints)
    try:
        server = make_chat_server(calls_then_answer(("add", {"a": 1, "b": 2})))
        agent = create_agent(model(server), [add])
        agent.invoke(USER, config={"configurable": {"thread_id": "auto"}})  # no callbacks at all
        agent.invoke(USER, config={"callbacks": [SagaCallbackHandler(hints)],
                                   "configurable": {"thread_id": "both"}})
    finally:
        set_client(None)
    assert hints.flush(5)
    expected = ["session_start", "llm_call_start", "llm_call_end", "tool_call_start", "tool_call_end",
                "llm_call_start", "llm_call_end", "session_end"]
    assert [k for k, _ in history(registry, "auto")] == expected
    assert [k for k, _ in history(registry, "both")] == expected  # once, not twice
    assert [r.headers["x-session-id"] for r in server.chat_requests()] == ["auto"] * 2 + ["both"] * 2


def test_without_the_env_var_nothing_is_added(make_chat_server, hints, registry, monkeypatch):
    monkeypatch.delenv("SAGA_LANGCHAIN", raising=False)
    set_client(hints)
    try:
        server = make_chat_server(calls_then_answer(("add", {"a": 1, "b": 2})))
        create_agent(model(server), [add]).invoke(USER, config={"configurable": {"thread_id": "off"}})
    finally:
        set_client(None)
    assert hints.flush(5)
    assert registry.session("off") is None
    assert all("x-session-id" not in r.headers for r in server.chat_requests())


def test_missing_langchain_is_a_clear_import_error(tmp_path):
    import subprocess
    import sys

    # A directory shadowing langchain_core with a package that fails to import.
    (tmp_path / "langchain_core").mkdir()
    (tmp_path / "langchain_core" / "__init__.py").write_text("raise ImportError('not installed')\n")
    code = ("import saga_sdk.integrations.langchain")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": f"{tmp_path}:{SDK}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert "pip install 'saga-agents[langchain]'" in proc.stderr


def test_public_api():
    import saga_sdk.integrations.langchain as lc

    assert sorted(lc.__all__) == ["ENV_VAR", "SagaCallbackHandler", "describe_graph", "saga_tool_hint"]
    assert SagaCallbackHandler.run_inline is True
