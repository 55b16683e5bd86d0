"""Real AutoGen agents and teams, a real gRPC hint service, a scripted model server:
exact hint sequences for tools (parallel, failing), cancellation, teams, a runtime
started before the run, and a hint service that is down."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import CancellationToken, SingleThreadedAgentRuntime
from autogen_core.tools import FunctionTool

from saga_sdk import HintClient, current_session
from saga_sdk.integrations import autogen as saga_autogen
from saga_sdk.integrations.autogen import SagaChatCompletionClient, run, run_stream
from saga_server.core.events import LlmCallEnd
from saga_server.serve_child import free_port
from tests.support.chat_server import text
from tests.support.chat_server import tool_calls as calls
from tests.support.registry import trace


def tool_then_done(*pairs):
    """Answer the user with these tool calls; answer anything after a tool result with text."""
    def respond(body):
        return text("done") if body["messages"][-1]["role"] == "tool" else calls(*pairs)
    return respond


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent(name, model_client, tools=(), **kw) -> AssistantAgent:
    return AssistantAgent(name, model_client=SagaChatCompletionClient(model_client), tools=list(tools), **kw)


def test_single_agent_run_hints_llm_and_tool_calls_and_tags_requests(chat_server, model_client, hints, recorder):
    chat_server.script = tool_then_done(("add", {"a": 2, "b": 3}))
    bot = agent("calc", model_client, [add], reflect_on_tool_use=True)

    result = asyncio.run(run(bot, task="2+3?", client=hints, tenant="acme", deadline_s=30))
    assert hints.flush(5)

    sid = recorder.events[0].session_id
    assert trace(recorder.of(sid)) == [
        ("session_start", "calc"),
        ("llm_start", 1, "calc"), ("llm_end", 1, "calc"),
        ("tool_start", "add", "call_1_0"), ("tool_end", "add", "call_1_0", "ok"),
        ("llm_start", 2, "calc"), ("llm_end", 2, "calc"),
        ("session_end", "completed"),
    ]
    start = recorder.of(sid)[0]
    assert (start.tenant, start.deadline_s) == ("acme", 30)
    assert {(n.name, n.kind) for n in start.structure.nodes} == {("calc", "llm"), ("add", "tool"), ("end", "end")}
    assert set(start.structure.edges) == {("calc", "end"), ("calc", "add"), ("add", "calc")}
    # token usage from the server's answers reaches the hints
    ends = [e for e in recorder.of(sid) if isinstance(e, LlmCallEnd)]
    assert [(e.prompt_tokens, e.output_tokens) for e in ends] == [(20, 5), (40, 5)]
    # every model request carried the session to the server, and the agent saw the tool result
    assert [body["session_id"] for body in chat_server.chat_bodies()] == [sid, sid]
    assert chat_server.chat_bodies()[1]["messages"][-1]["content"] == "5"
    assert result.messages[-1].content == "done"


def test_parallel_tool_calls_each_get_their_own_start_and_end(chat_server, model_client, hints, recorder):
    gate: dict = {}

    async def slow_a(x: int) -> int:
        """A."""
        await gate["barrier"].wait()  # returns only once both tools are running
        return x

    async def slow_b(x: int) -> int:
        """B."""
        await gate["barrier"].wait()
        return -x

    chat_server.script = tool_then_done(("slow_a", {"x": 1}), ("slow_b", {"x": 2}))
    bot = agent("par", model_client, [slow_a, slow_b])

    async def main():
        gate["barrier"] = asyncio.Barrier(2)
        return await run(bot, task="go", client=hints)

    result = asyncio.run(main())
    assert hints.flush(5)
    events = trace(recorder.of(recorder.events[0].session_id))
    assert events[:3] == [("session_start", "par"), ("llm_start", 1, "par"), ("llm_end", 1, "par")]
    # both tools start before either ends (they ran concurrently); each pairs by call id
    assert sorted(events[3:5]) == [("tool_start", "slow_a", "call_1_0"), ("tool_start", "slow_b", "call_1_1")]
    assert sorted(events[5:7]) == [("tool_end", "slow_a", "call_1_0", "ok"), ("tool_end", "slow_b", "call_1_1", "ok")]
    assert events[7:] == [("session_end", "completed")]
    assert [r.content for r in result.messages[-1].results] == ["1", "-2"]


def test_a_failing_tool_ends_with_error_and_the_run_goes_on(chat_server, model_client, hints, recorder):
    async def broken(path: str) -> str:
        """Read a file."""
        raise FileNotFoundError(path)

    chat_server.script = tool_then_done(("broken", {"path": "/nope"}), ("add", {"a": 1, "b": 1}))
    bot = agent("fs", model_client, [broken, add], reflect_on_tool_use=True)

    result = asyncio.run(run(bot, task="read", client=hints))
    assert hints.flush(5)
    events = trace(recorder.of(recorder.events[0].session_id))
    assert sorted(events[3:7]) == [("tool_end", "add", "call_1_1", "ok"),
                                   ("tool_end", "broken", "call_1_0", "error"),
                                   ("tool_start", "add", "call_1_1"), ("tool_start", "broken", "call_1_0")]
    for call_id in ("call_1_0", "call_1_1"):  # the two calls interleave freely, each starts before it ends
        assert [e[0] for e in events[3:7] if e[2] == call_id] == ["tool_start", "tool_end"]
    assert events[7:] == [("llm_start", 2, "fs"), ("llm_end", 2, "fs"), ("session_end", "completed")]
    assert result.messages[-1].content == "done"
    # AutoGen reported the error to the model exactly as without SAGA
    tool_msgs = [m for m in chat_server.chat_bodies()[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["/nope", "2"]


def test_cancelling_a_run_ends_the_tool_and_the_session_as_cancelled(chat_server, model_client, hints, recorder):
    async def wait_forever(seconds: int) -> str:
        """Sleep."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    chat_server.script = tool_then_done(("wait_forever", {"seconds": 99}))
    bot = agent("sleeper", model_client, [wait_forever])
    started: asyncio.Event

    async def main():
        nonlocal started
        started = asyncio.Event()
        task = asyncio.create_task(run(bot, task="sleep", client=hints, session_id="cancelled"))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())  # at its end asyncio cancels the tool task AutoGen left running
    assert hints.flush(5)
    assert trace(recorder.of("cancelled")) == [
        ("session_start", "sleeper"),
        ("llm_start", 1, "sleeper"), ("llm_end", 1, "sleeper"),
        ("tool_start", "wait_forever", "call_1_0"), ("tool_end", "wait_forever", "call_1_0", "cancelled"),
        ("session_end", "cancelled"),
    ]
    assert recorder.stats()["events_rejected"] == 0  # the tool's late end was not sent after the session's


def test_a_tool_cancelled_through_autogens_token_ends_as_cancelled(hints, recorder):
    async def wait_forever(seconds: int) -> str:
        """Sleep."""
        await asyncio.Event().wait()

    tool = FunctionTool(wait_forever, description="Sleep.")

    async def main():
        saga_autogen.instrument()
        token = CancellationToken()
        async with saga_autogen.session(client=hints, session_id="token", workflow="direct"):
            future = asyncio.ensure_future(tool.run_json({"seconds": 1}, token, call_id="c1"))
            token.link_future(future)
            await asyncio.sleep(0.01)
            token.cancel()
            with pytest.raises(asyncio.CancelledError):
                await future

    asyncio.run(main())
    assert hints.flush(5)
    assert trace(recorder.of("token")) == [
        ("session_start", "direct"),
        ("tool_start", "wait_forever", "c1"), ("tool_end", "wait_forever", "c1", "cancelled"),
        ("session_end", "completed"),
    ]


def two_agent_script(body):
    """writer calls `add` once, then speaks; reviewer only speaks."""
    system = body["messages"][0]["content"]
    if "writer" in system:
        if body["messages"][-1]["role"] == "tool":
            return text("sum written")
        return calls(("add", {"a": 20, "b": 22}))
    return text("looks right")


def team_of_two(model_client, runtime=None) -> RoundRobinGroupChat:
    writer = agent("writer", model_client, [add], system_message="You are the writer.", reflect_on_tool_use=True)
    reviewer = agent("reviewer", model_client, system_message="You are the reviewer.")
    return RoundRobinGroupChat([writer, reviewer], termination_condition=MaxMessageTermination(3), runtime=runtime)


TEAM_TRACE = [
    ("session_start", "RoundRobinGroupChat"),
    ("llm_start", 1, "writer"), ("llm_end", 1, "writer"),
    ("tool_start", "add", "call_1_0"), ("tool_end", "add", "call_1_0", "ok"),
    ("llm_start", 2, "writer"), ("llm_end", 2, "writer"),
    ("llm_start", 3, "reviewer"), ("llm_end", 3, "reviewer"),
    ("session_end", "completed"),
]


def test_a_team_run_names_each_agent_and_declares_who_speaks_after_whom(chat_server, model_client, hints, recorder):
    chat_server.script = two_agent_script
    team = team_of_two(model_client)

    result = asyncio.run(run(team, task="add 20 and 22", client=hints))
    assert hints.flush(5)
    sid = recorder.events[0].session_id
    assert trace(recorder.of(sid)) == TEAM_TRACE
    structure = recorder.of(sid)[0].structure
    assert {("writer", "reviewer"), ("reviewer", "writer"), ("writer", "add"), ("add", "writer")} <= set(
        structure.edges)
    spoken = [(m.source, m.content) for m in result.messages if type(m).__name__ == "TextMessage"]
    assert spoken == [("user", "add 20 and 22"), ("writer", "sum written"), ("reviewer", "looks right")]
    assert {body["session_id"] for body in chat_server.chat_bodies()} == {sid}


def test_a_runtime_started_before_the_run_is_bound_by_team_not_contextvars(chat_server, model_client, hints,
                                                                            recorder):
    seen: list = []

    async def probe(a: int, b: int) -> int:
        """Add two integers."""
        seen.append((current_session(), saga_autogen.session_for_current_call()))
        return a + b

    probe_tool = FunctionTool(probe, name="add", description="Add two integers.")
    chat_server.script = two_agent_script

    async def main():
        runtime = SingleThreadedAgentRuntime()
        runtime.start()  # before any SAGA session exists: its tasks never see our contextvar
        writer = AssistantAgent("writer", SagaChatCompletionClient(model_client), tools=[probe_tool],
                                system_message="You are the writer.", reflect_on_tool_use=True)
        reviewer = AssistantAgent("reviewer", SagaChatCompletionClient(model_client),
                                  system_message="You are the reviewer.")
        team = RoundRobinGroupChat([writer, reviewer], termination_condition=MaxMessageTermination(3),
                                   runtime=runtime)
        try:
            return await run(team, task="add 20 and 22", client=hints, session_id="pre-started")
        finally:
            await runtime.stop()

    asyncio.run(main())
    assert hints.flush(5)
    assert trace(recorder.of("pre-started")) == TEAM_TRACE
    # inside the runtime the contextvar is empty, yet the hook found the session through the team
    assert seen[0][0] is None and seen[0][1].session_id == "pre-started"
    assert {body["session_id"] for body in chat_server.chat_bodies()} == {"pre-started"}
    assert not saga_autogen._by_agent_key  # unbound after the run


def test_a_hint_service_that_is_down_changes_nothing_in_the_run(chat_server, model_client):
    chat_server.script = two_agent_script
    plain = asyncio.run(team_of_two(model_client).run(task="add 20 and 22"))
    plain_requests = list(chat_server.chat_bodies())
    chat_server.reset()

    down = HintClient(endpoint=f"127.0.0.1:{free_port()}", rpc_timeout_s=0.2)
    try:
        hinted = asyncio.run(run(team_of_two(model_client), task="add 20 and 22", client=down))
    finally:
        down.close(timeout=0.2)

    assert [(type(m), m.source, str(m.content)) for m in hinted.messages] == \
        [(type(m), m.source, str(m.content)) for m in plain.messages]
    assert hinted.stop_reason == plain.stop_reason
    # the requests differ only by the session id SAGA added
    assert [{k: v for k, v in b.items() if k != "session_id"} for b in chat_server.chat_bodies()] == plain_requests
    assert down.stats().sent == 0


def test_run_stream_yields_the_same_items_and_keeps_the_session_out_of_the_consumer(chat_server, model_client,
                                                                                    hints, recorder):
    chat_server.script = tool_then_done(("add", {"a": 1, "b": 2}))

    async def main():
        items, outside = [], []
        async for item in run_stream(agent("s", model_client, [add]), task="1+2", client=hints):
            outside.append(current_session())
            items.append(item)
        return items, outside

    items, outside = asyncio.run(main())
    assert hints.flush(5)
    assert outside == [None] * len(items)
    assert type(items[-1]).__name__ == "TaskResult"
    sid = recorder.events[0].session_id
    assert trace(recorder.of(sid))[-1] == ("session_end", "completed")
    assert [e[0] for e in trace(recorder.of(sid))].count("tool_start") == 1


def test_closing_run_stream_early_ends_the_session_as_cancelled(chat_server, model_client, hints, recorder):
    chat_server.script = tool_then_done(("add", {"a": 1, "b": 2}))

    async def main():
        stream = run_stream(agent("s", model_client, [add]), task="1+2", client=hints, session_id="early")
        async with contextlib.aclosing(stream):
            async for _ in stream:
                break

    asyncio.run(main())
    assert hints.flush(5)
    assert trace(recorder.of("early"))[-1] == ("session_end", "cancelled")


def test_model_client_streaming_is_hinted_with_usage(chat_server, model_client, hints, recorder):
    chat_server.script = tool_then_done(("add", {"a": 4, "b": 5}))
    bot = agent("streamer", model_client, [add], reflect_on_tool_use=True, model_client_stream=True)

    result = asyncio.run(run(bot, task="4+5", client=hints, session_id="streamed"))
    assert hints.flush(5)
    assert trace(recorder.of("streamed")) == [
        ("session_start", "streamer"),
        ("llm_start", 1, "streamer"), ("llm_end", 1, "streamer"),
        ("tool_start", "add", "call_1_0"), ("tool_end", "add", "call_1_0", "ok"),
        ("llm_start", 2, "streamer"), ("llm_end", 2, "streamer"),
        ("session_end", "completed"),
    ]
    assert all(body["stream"] and body["session_id"] == "streamed" for body in chat_server.chat_bodies())
    assert result.messages[-1].content.strip() == "done"


def test_a_broken_hint_client_never_reaches_the_agent(chat_server, model_client):
    class Exploding(HintClient):
        def _put(self, *args):
            raise RuntimeError("boom")

        def llm_call_start(self, *args, **kwargs):
            raise RuntimeError("boom")

        def tool_call_start(self, *args, **kwargs):
            raise RuntimeError("boom")

    chat_server.script = tool_then_done(("add", {"a": 1, "b": 2}))
    bad = Exploding(enabled=False)
    result = asyncio.run(run(agent("x", model_client, [add], reflect_on_tool_use=True), task="1+2", client=bad))
    assert result.messages[-1].content == "done"


def test_a_streaming_tool_an_agent_as_tool_is_hinted_with_the_inner_calls_inside(chat_server, model_client, hints,
                                                                                   recorder):
    """`AgentTool` is a `BaseStreamTool`: AutoGen runs it through `run_json_stream`."""
    from autogen_agentchat.tools import AgentTool

    def respond(body):
        system = body["messages"][0]["content"]
        if "helper" in system:
            return text("helped")
        return text("done") if body["messages"][-1]["role"] == "tool" else calls(("helper", {"task": "help"}))

    chat_server.script = respond
    helper = agent("helper", model_client, system_message="You are the helper.")
    boss = agent("boss", model_client, [AgentTool(helper)], system_message="You are the boss.",
                 reflect_on_tool_use=True)

    result = asyncio.run(run(boss, task="delegate", client=hints, session_id="nested"))
    assert hints.flush(5)
    events = trace(recorder.of("nested"))
    assert events == [
        ("session_start", "boss"), ("llm_start", 1, "boss"), ("llm_end", 1, "boss"),
        ("tool_start", "helper", "call_1_0"),
        ("llm_start", 2, "helper"), ("llm_end", 2, "helper"),  # named after the nested agent
        ("tool_end", "helper", "call_1_0", "ok"),
        ("llm_start", 3, "boss"), ("llm_end", 3, "boss"), ("session_end", "completed"),
    ]
    assert result.messages[-1].content == "done"
