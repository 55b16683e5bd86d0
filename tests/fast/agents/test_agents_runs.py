"""Real OpenAI Agents SDK runs (`Runner.run` of real `Agent`s with real function tools),
a real gRPC hint service, a scripted model server: the exact hints of a run, with the
Chat Completions and the Responses model alike; handoffs; failing and cancelled tools;
streamed, synchronous and nested runs; the caller's own hooks; and SAGA being down."""

from __future__ import annotations

import asyncio
import json

import pytest
from agents import Agent, RunHooks, Runner, UserError, function_tool, handoff

from saga_sdk import HintClient
from saga_sdk.integrations import openai_agents as saga_agents
from saga_sdk.integrations.openai_agents import SagaRunHooks, describe, run, run_sync, session
from saga_server.core.events import LlmCallEnd
from tests.support.chat_server import text
from tests.support.chat_server import tool_calls as calls
from tests.support.registry import trace
from saga_server.serve_child import free_port


# -- a script that reads chat and Responses bodies alike ---------------------------------


def items(body) -> list[dict]:
    found = body.get("messages") or body.get("input") or []
    return found if isinstance(found, list) else [{"role": "user", "content": found}]


def system(body) -> str:
    return body.get("instructions") or items(body)[0].get("content") or ""


def after_tool(body) -> bool:
    last = items(body)[-1]
    return last.get("role") == "tool" or last.get("type") == "function_call_output"


def tool_outputs(body) -> list[str]:
    return [i.get("content") if i.get("role") == "tool" else i.get("output")
            for i in items(body) if i.get("role") == "tool" or i.get("type") == "function_call_output"]


def tool_then_done(*pairs):
    """Call these tools first; answer "done" once their results are back."""
    return lambda body: text("done") if after_tool(body) else calls(*pairs)


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def calc(model, tools=(add,), **kw) -> Agent:
    return Agent(name="calc", instructions="You are calc.", model=model, tools=list(tools), **kw)


def test_a_run_is_one_session_with_llm_steps_tool_calls_and_the_id_on_every_request(chat_server, model, hints,
                                                                                    registry):
    chat_server.script = tool_then_done(("add", {"a": 2, "b": 3}))

    result = asyncio.run(run(calc(model), "2+3?", client=hints, tenant="acme", deadline_s=30))
    assert hints.flush(5)

    sid = registry.events[0].session_id
    assert trace(registry.of(sid)) == [
        ("session_start", "calc"),
        ("llm_start", 1, "calc"), ("llm_end", 1, "calc"),
        ("tool_start", "add", "call_1_0"), ("tool_end", "add", "call_1_0", "ok"),
        ("llm_start", 2, "calc"), ("llm_end", 2, "calc"),
        ("session_end", "completed"),
    ]
    start = registry.of(sid)[0]
    assert (start.tenant, start.deadline_s) == ("acme", 30)
    assert {(n.name, n.kind) for n in start.structure.nodes} == {("calc", "llm"), ("add", "tool"), ("end", "end")}
    assert set(start.structure.edges) == {("calc", "add"), ("add", "calc"), ("calc", "end")}
    requests = chat_server.model_requests()
    # every model request, of either API, carried the session to the server
    expected_path = "/v1/responses" if type(model).__name__ == "OpenAIResponsesModel" else "/v1/chat/completions"
    assert [(r.path, r.headers.get("x-session-id")) for r in requests] == [(expected_path, sid)] * 2
    # the usage the server reported reaches the hints; the agent saw the tool's result
    ends = [e for e in registry.of(sid) if isinstance(e, LlmCallEnd)]
    assert [(e.prompt_tokens, e.output_tokens) for e in ends] == [(10 * len(items(r.body)), 5) for r in requests]
    assert tool_outputs(requests[1].body) == ["5"]
    assert result.final_output == "done"


def test_a_streamed_run_inside_a_session_is_hinted_and_tagged_the_same(chat_server, model, hints, registry):
    chat_server.script = tool_then_done(("add", {"a": 1, "b": 2}))

    async def main():
        async with session(calc(model), client=hints, session_id="streamed") as saga:
            result = Runner.run_streamed(saga.agent, "1+2", hooks=saga.hooks)
            return result, [event.type async for event in result.stream_events()]

    result, events = asyncio.run(main())
    assert hints.flush(5)
    assert "run_item_stream_event" in events and result.final_output.strip() == "done"
    assert trace(registry.of("streamed")) == [
        ("session_start", "calc"),
        ("llm_start", 1, "calc"), ("llm_end", 1, "calc"),
        ("tool_start", "add", "call_1_0"), ("tool_end", "add", "call_1_0", "ok"),
        ("llm_start", 2, "calc"), ("llm_end", 2, "calc"),
        ("session_end", "completed"),
    ]
    requests = chat_server.model_requests()
    assert len(requests) == 2 and all(r.body["stream"] for r in requests)
    assert {r.headers.get("x-session-id") for r in requests} == {"streamed"}


# -- handoffs -------------------------------------------------------------------------


@function_tool
def lookup(user: str) -> str:
    """Look a customer up."""
    return f"{user}: gold member"


@function_tool
def sign(note: str) -> str:
    """Sign a note."""
    return note + " -- the writer"


def triage_then_writer(body):
    """triage looks the user up, then hands off; writer answers."""
    if "writer" in system(body):
        return text("Dear gold member.")
    return calls(("transfer_to_writer", {})) if after_tool(body) else calls(("lookup", {"user": "mia"}))


def two_agents(model, *, via_handoff_object: bool = False) -> Agent:
    writer = Agent(name="writer", instructions="You are the writer.", model=model, tools=[sign])
    return Agent(name="triage", instructions="You are triage.", model=model, tools=[lookup],
                 handoffs=[handoff(writer) if via_handoff_object else writer])


@pytest.mark.parametrize("via_handoff_object", [False, True], ids=["agent", "handoff()"])
def test_a_handoff_names_the_next_steps_after_the_new_agent_and_is_declared(chat_server, model, hints, registry,
                                                                            via_handoff_object):
    chat_server.script = triage_then_writer

    result = asyncio.run(run(two_agents(model, via_handoff_object=via_handoff_object), "write to mia",
                             client=hints, session_id="handoff"))
    assert hints.flush(5)
    assert result.last_agent.name == "writer" and result.final_output == "Dear gold member."
    assert trace(registry.of("handoff")) == [
        ("session_start", "triage"),
        ("llm_start", 1, "triage"), ("llm_end", 1, "triage"),
        ("tool_start", "lookup", "call_1_0"), ("tool_end", "lookup", "call_1_0", "ok"),
        ("llm_start", 2, "triage"), ("llm_end", 2, "triage"),  # this one asked for the handoff
        ("llm_start", 3, "writer"), ("llm_end", 3, "writer"),
        ("session_end", "completed"),
    ]
    structure = registry.of("handoff")[0].structure
    assert {(n.name, n.kind) for n in structure.nodes} == {
        ("triage", "llm"), ("writer", "llm"), ("lookup", "tool"), ("sign", "tool"), ("end", "end")}
    assert set(structure.edges) == {("triage", "lookup"), ("lookup", "triage"), ("triage", "writer"),
                                    ("triage", "end"), ("writer", "sign"), ("sign", "writer"), ("writer", "end")}
    assert {r.headers.get("x-session-id") for r in chat_server.model_requests()} == {"handoff"}
    assert len(chat_server.model_requests()) == 3


def test_describe_follows_tool_use_behavior():
    stop_first = Agent(name="a", tools=[add, lookup], tool_use_behavior="stop_on_first_tool")
    assert set(describe(stop_first)[1]) == {("a", "add"), ("a", "lookup"), ("add", "end"), ("lookup", "end"),
                                            ("a", "end")}
    stop_at = Agent(name="b", tools=[add, lookup], tool_use_behavior={"stop_at_tool_names": ["lookup"]})
    assert set(describe(stop_at)[1]) == {("b", "add"), ("b", "lookup"), ("add", "b"), ("lookup", "end"),
                                         ("b", "end")}
    # agents handing off to each other are each described once
    a, b = Agent(name="a"), Agent(name="b")
    a.handoffs, b.handoffs = [b], [a]
    nodes, edges = describe(a)
    assert nodes == [("a", "llm"), ("b", "llm"), ("end", "end")]
    assert set(edges) == {("a", "b"), ("a", "end"), ("b", "a"), ("b", "end")}


# -- failures and cancellation -------------------------------------------------------------


def test_a_tool_that_raises_ends_with_error_and_the_run_goes_on(chat_server, model, hints, registry):
    @function_tool
    def broken(path: str) -> str:
        """Read a file."""
        raise FileNotFoundError(path)

    chat_server.script = tool_then_done(("broken", {"path": "/nope"}), ("add", {"a": 1, "b": 1}))
    result = asyncio.run(run(calc(model, [broken, add]), "read", client=hints, session_id="broken"))
    assert hints.flush(5)
    events = trace(registry.of("broken"))
    assert sorted(events[3:7]) == [("tool_end", "add", "call_1_1", "ok"),
                                   ("tool_end", "broken", "call_1_0", "error"),
                                   ("tool_start", "add", "call_1_1"), ("tool_start", "broken", "call_1_0")]
    assert events[7:] == [("llm_start", 2, "calc"), ("llm_end", 2, "calc"), ("session_end", "completed")]
    assert result.final_output == "done"
    with_saga = tool_outputs(chat_server.model_requests()[1].body)
    # the SDK reported the error to the model exactly as the same run without SAGA does
    asyncio.run(Runner.run(calc(model, [broken, add]), "read"))
    without_saga = tool_outputs(chat_server.model_requests()[3].body)
    assert with_saga == without_saga
    assert with_saga[1] == "2" and "error" in with_saga[0]


def test_a_tool_error_that_ends_the_run_ends_the_tool_and_the_session_as_failed(chat_server, model, hints,
                                                                                 registry):
    @function_tool(failure_error_function=None)
    def fatal(path: str) -> str:
        """Read a file."""
        raise FileNotFoundError(path)

    chat_server.script = tool_then_done(("fatal", {"path": "/nope"}))
    with pytest.raises(UserError) as raised:  # what the SDK raises without SAGA too
        asyncio.run(run(calc(model, [fatal]), "read", client=hints, session_id="fatal"))
    assert isinstance(raised.value.__cause__, FileNotFoundError)
    assert hints.flush(5)
    assert trace(registry.of("fatal")) == [
        ("session_start", "calc"), ("llm_start", 1, "calc"), ("llm_end", 1, "calc"),
        ("tool_start", "fatal", "call_1_0"), ("tool_end", "fatal", "call_1_0", "error"),
        ("session_end", "failed"),
    ]


def test_cancelling_a_run_ends_the_tool_and_the_session_as_cancelled(chat_server, model, hints, registry):
    started: asyncio.Event

    @function_tool
    async def wait_forever(seconds: int) -> str:
        """Sleep."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    chat_server.script = tool_then_done(("wait_forever", {"seconds": 99}))

    async def main():
        nonlocal started
        started = asyncio.Event()
        task = asyncio.create_task(run(calc(model, [wait_forever]), "sleep", client=hints, session_id="cancelled"))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert hints.flush(5)
    assert trace(registry.of("cancelled")) == [
        ("session_start", "calc"), ("llm_start", 1, "calc"), ("llm_end", 1, "calc"),
        ("tool_start", "wait_forever", "call_1_0"), ("tool_end", "wait_forever", "call_1_0", "cancelled"),
        ("session_end", "cancelled"),
    ]
    assert registry.stats()["events_rejected"] == 0  # nothing was sent after the session's end


# -- other ways in ---------------------------------------------------------------------------


class Recording(RunHooks):
    """A caller's own hooks: records what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def on_agent_start(self, context, agent):
        self.calls.append(("agent_start", agent.name))

    async def on_llm_start(self, context, agent, system_prompt, input_items):
        self.calls.append(("llm_start", agent.name))

    async def on_llm_end(self, context, agent, response):
        self.calls.append(("llm_end", agent.name))

    async def on_tool_start(self, context, agent, tool):
        self.calls.append(("tool_start", tool.name, context.tool_call_id))

    async def on_tool_end(self, context, agent, tool, result):
        self.calls.append(("tool_end", tool.name, result))

    async def on_handoff(self, context, from_agent, to_agent):
        self.calls.append(("handoff", from_agent.name, to_agent.name))

    async def on_agent_end(self, context, agent, output):
        self.calls.append(("agent_end", agent.name, output))


def test_the_callers_own_hooks_get_every_call(chat_server, model, hints, registry):
    chat_server.script = triage_then_writer
    mine = Recording()

    asyncio.run(run(two_agents(model), "write to mia", client=hints, hooks=mine, session_id="mine"))
    assert mine.calls == [
        ("agent_start", "triage"), ("llm_start", "triage"), ("llm_end", "triage"),
        ("tool_start", "lookup", "call_1_0"), ("tool_end", "lookup", "mia: gold member"),
        ("llm_start", "triage"), ("llm_end", "triage"), ("handoff", "triage", "writer"),
        ("agent_start", "writer"), ("llm_start", "writer"), ("llm_end", "writer"),
        ("agent_end", "writer", "Dear gold member."),
    ]
    assert hints.flush(5)
    assert len(trace(registry.of("mine"))) == 10


def test_hooks_alone_hint_into_the_session_current_where_the_run_starts(chat_server, model, hints, registry,
                                                                         caplog):
    chat_server.script = tool_then_done(("add", {"a": 2, "b": 2}))
    saga_agents._log_once._seen.discard("no_session")  # this test counts that warning

    async def main():
        hooks = SagaRunHooks(client=hints)
        with hints.session("outer", workflow="mine"):
            await Runner.run(calc(model), "2+2", hooks=hooks)
        chat_server.script = tool_then_done(("add", {"a": 3, "b": 3}))
        return await Runner.run(calc(model), "3+3", hooks=hooks)  # no session current: nothing sent

    with caplog.at_level("WARNING", logger="saga_sdk.openai_agents"):
        result = asyncio.run(main())
    assert hints.flush(5)
    assert result.final_output == "done"
    assert trace(registry.events) == [
        ("session_start", "mine"),
        ("llm_start", 1, "calc"), ("llm_end", 1, "calc"),
        ("tool_start", "add", "call_1_0"), ("tool_end", "add", "call_1_0", "ok"),
        ("llm_start", 2, "calc"), ("llm_end", 2, "calc"),
        ("session_end", "completed"),
    ]
    assert [r.headers.get("x-session-id") for r in chat_server.model_requests()] == ["outer", "outer", None, None]
    assert sum("no current SAGA session" in r.getMessage() for r in caplog.records) == 1  # said once


def test_run_sync_is_one_session(chat_server, chat_model, hints, registry):
    chat_server.script = tool_then_done(("add", {"a": 4, "b": 5}))
    result = run_sync(calc(chat_model), "4+5", client=hints, session_id="sync")
    assert hints.flush(5)
    assert result.final_output == "done"
    assert [e[0] for e in trace(registry.of("sync"))] == [
        "session_start", "llm_start", "llm_end", "tool_start", "tool_end", "llm_start", "llm_end", "session_end"]
    assert {r.headers.get("x-session-id") for r in chat_server.model_requests()} == {"sync"}


def test_an_agent_used_as_a_tool_runs_inside_the_tool_call_of_the_same_session(chat_server, model, hints,
                                                                               registry):
    def respond(body):
        if "helper" in system(body):
            return text("helped")
        return text("done") if after_tool(body) else calls(("helper", {"input": "help"}))

    chat_server.script = respond
    hooks = SagaRunHooks(client=hints)
    helper = Agent(name="helper", instructions="You are the helper.", model=model)
    boss = Agent(name="boss", instructions="You are the boss.", model=model,
                 tools=[helper.as_tool("helper", "Ask the helper.", hooks=hooks)])

    result = asyncio.run(run(boss, "delegate", hooks=hooks, client=hints, session_id="nested"))
    assert hints.flush(5)
    assert result.final_output == "done"
    assert trace(registry.of("nested")) == [
        ("session_start", "boss"), ("llm_start", 1, "boss"), ("llm_end", 1, "boss"),
        ("tool_start", "helper", "call_1_0"),
        ("llm_start", 2, "helper"), ("llm_end", 2, "helper"),  # named after the nested agent
        ("tool_end", "helper", "call_1_0", "ok"),
        ("llm_start", 3, "boss"), ("llm_end", 3, "boss"), ("session_end", "completed"),
    ]
    assert {r.headers.get("x-session-id") for r in chat_server.model_requests()} == {"nested"}


# -- SAGA never changes the run ------------------------------------------------------------


def comparable(result) -> list:
    return [(type(item).__name__, item.agent.name, json.dumps(item.to_input_item(), sort_keys=True, default=str))
            for item in result.new_items]


def test_a_hint_service_that_is_down_changes_nothing_in_the_run(chat_server, model):
    chat_server.script = triage_then_writer
    plain = asyncio.run(Runner.run(two_agents(model), "write to mia"))
    plain_requests = [r.body for r in chat_server.model_requests()]
    chat_server.reset()

    down = HintClient(endpoint=f"127.0.0.1:{free_port()}", rpc_timeout_s=0.2)
    try:
        hinted = asyncio.run(run(two_agents(model), "write to mia", client=down))
    finally:
        down.close(timeout=0.2)

    assert comparable(hinted) == comparable(plain)
    assert (hinted.final_output, hinted.last_agent.name) == (plain.final_output, plain.last_agent.name)
    # the requests are the same bodies: SAGA only added its header
    assert [r.body for r in chat_server.model_requests()] == plain_requests
    assert down.stats().sent == 0


def test_a_broken_hint_client_never_reaches_the_agent(chat_server, model):
    class Exploding(HintClient):
        def _put(self, *args):
            raise RuntimeError("boom")

    chat_server.script = triage_then_writer
    result = asyncio.run(run(two_agents(model), "write to mia", client=Exploding(enabled=False)))
    assert result.final_output == "Dear gold member."
