"""The pieces one by one: what the model-client wrapper sends and delegates, the
tool patch's idempotence, and the structure declared for each team type."""

from __future__ import annotations

import asyncio

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import DiGraphBuilder, GraphFlow, RoundRobinGroupChat, SelectorGroupChat, Swarm
from autogen_core.models import ChatCompletionClient, UserMessage
from autogen_core.tools import BaseStreamTool, BaseTool, FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient
from autogen_ext.models.replay import ReplayChatCompletionClient

from saga_sdk import session_scope
from saga_sdk.integrations import autogen as saga_autogen
from saga_sdk.integrations.autogen import SagaChatCompletionClient, describe

ORIGINAL_RUN_JSON = BaseTool.__dict__["run_json"]
ORIGINAL_RUN_JSON_STREAM = BaseStreamTool.__dict__["run_json_stream"]
HELLO = [UserMessage(content="hello", source="user")]


def openai_client(chat_server, model_info, **kw) -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(model="scripted", base_url=chat_server.base_url, api_key="none",
                                      model_info=model_info, **kw)


def test_session_id_is_merged_into_extra_body_never_replacing_user_arguments(chat_server, model_info, hints):
    inner = openai_client(chat_server, model_info, extra_body={"priority": 3, "top_k": 1})
    wrapped = SagaChatCompletionClient(inner, client=hints)

    async def main():
        with session_scope("s-1"):
            await wrapped.create(HELLO, extra_create_args={"extra_body": {"top_k": 5}, "temperature": 0.25})
            await wrapped.create(HELLO, extra_create_args={"extra_body": {"session_id": "mine"}})
        await wrapped.create(HELLO)  # no session: the request goes out untouched

    asyncio.run(main())
    first, second, third = chat_server.chat_bodies()
    assert (first["session_id"], first["priority"], first["top_k"], first["temperature"]) == ("s-1", 3, 5, 0.25)
    assert (second["session_id"], second["priority"]) == ("mine", 3)
    assert "session_id" not in third and third["priority"] == 3
    assert inner._create_args["extra_body"] == {"priority": 3, "top_k": 1}  # the client's own args untouched


def test_non_openai_clients_get_no_extra_body_unless_asked(hints):
    replay = ReplayChatCompletionClient(["a", "b"])
    seen = []
    original = replay.create

    async def spy(messages, **kw):
        seen.append(kw["extra_create_args"])
        return await original(messages, **kw)

    replay.create = spy

    async def main():
        with session_scope("s-2"):
            await SagaChatCompletionClient(replay, client=hints).create(HELLO)
            await SagaChatCompletionClient(replay, client=hints, carry_session="extra_body").create(HELLO)

    asyncio.run(main())
    assert seen == [{}, {"extra_body": {"session_id": "s-2"}}]


def test_the_wrapper_delegates_everything_else(chat_server, model_info):
    inner = openai_client(chat_server, model_info)
    wrapped = SagaChatCompletionClient(inner, node="planner")
    asyncio.run(wrapped.create(HELLO))  # no session: plain delegation
    assert wrapped.model_info == inner.model_info
    assert wrapped.total_usage() == inner.total_usage() and wrapped.total_usage().completion_tokens == 5
    assert wrapped.actual_usage() == inner.actual_usage()
    # token counting (OpenAI's needs tiktoken data from the network: use a client that counts locally)
    replay = ReplayChatCompletionClient(["x"])
    assert SagaChatCompletionClient(replay).count_tokens(HELLO) == replay.count_tokens(HELLO) > 0
    assert SagaChatCompletionClient(replay).remaining_tokens(HELLO) == replay.remaining_tokens(HELLO)
    assert wrapped._raw_config is inner._raw_config  # client-specific attributes fall through
    assert wrapped.wrapped is inner


def test_component_config_round_trips_through_the_wrapper(chat_server, model_info):
    wrapped = SagaChatCompletionClient(openai_client(chat_server, model_info), node="planner")
    dumped = wrapped.dump_component()
    assert dumped.provider == "saga_sdk.integrations.autogen.SagaChatCompletionClient"
    loaded = ChatCompletionClient.load_component(dumped)
    assert isinstance(loaded, SagaChatCompletionClient) and isinstance(loaded.wrapped, OpenAIChatCompletionClient)
    assert loaded.dump_component() == dumped
    # an agent holding the wrapper dumps and loads with it
    agent = AssistantAgent("a", model_client=wrapped)
    again = AssistantAgent.load_component(agent.dump_component())
    assert isinstance(again._model_client, SagaChatCompletionClient)


def test_bad_arguments_are_refused_clearly(chat_server, model_info):
    with pytest.raises(TypeError, match="ChatCompletionClient"):
        SagaChatCompletionClient(object())
    with pytest.raises(ValueError, match="carry_session"):
        SagaChatCompletionClient(openai_client(chat_server, model_info), carry_session="headers")
    with pytest.raises(ValueError, match="deadline_s"):
        saga_autogen.session(deadline_s=0)


def test_instrument_and_uninstrument_are_idempotent():
    saga_autogen.instrument()
    patched = BaseTool.__dict__["run_json"]
    saga_autogen.instrument()
    assert BaseTool.__dict__["run_json"] is patched  # not wrapped twice
    assert patched.__saga_original__ is ORIGINAL_RUN_JSON
    assert BaseStreamTool.__dict__["run_json_stream"].__saga_original__ is ORIGINAL_RUN_JSON_STREAM
    assert saga_autogen.is_instrumented()
    saga_autogen.uninstrument()
    saga_autogen.uninstrument()
    assert BaseTool.__dict__["run_json"] is ORIGINAL_RUN_JSON
    assert BaseStreamTool.__dict__["run_json_stream"] is ORIGINAL_RUN_JSON_STREAM
    assert not saga_autogen.is_instrumented()


def test_tools_outside_a_session_run_unhinted_and_unchanged(hints, recorder):
    async def double(x: int) -> int:
        """Double."""
        return 2 * x

    from autogen_core import CancellationToken

    saga_autogen.instrument()
    assert asyncio.run(FunctionTool(double, description="d").run_json({"x": 4}, CancellationToken())) == 8
    assert hints.flush(5) and recorder.events == []


def _agents(model_client, n=3, **kw):
    return [AssistantAgent(f"p{i}", model_client=model_client, **kw) for i in range(n)]


def test_declared_structure_per_team_type(chat_server, model_info):
    client = openai_client(chat_server, model_info)

    async def lookup(q: str) -> str:
        """Look up."""
        return q

    a, b, c = _agents(client)
    nodes, edges = describe(RoundRobinGroupChat([a, b, c]))
    assert dict(nodes) == {"p0": "llm", "p1": "llm", "p2": "llm", "end": "end"}
    assert {("p0", "p1"), ("p1", "p2"), ("p2", "p0")} <= set(edges)

    nodes, edges = describe(SelectorGroupChat(_agents(client, 2), model_client=client))
    assert {e for e in edges if e[1] != "end"} == {("p0", "p1"), ("p1", "p0")}

    tooled = AssistantAgent("t", model_client=client, tools=[lookup], handoffs=["u"])
    plain = AssistantAgent("u", model_client=client, handoffs=["t"])
    nodes, edges = describe(Swarm([tooled, plain]))
    assert dict(nodes)["lookup"] == "tool" and dict(nodes)["transfer_to_u"] == "tool"
    assert {("t", "u"), ("u", "t"), ("t", "lookup"), ("t", "transfer_to_u"), ("transfer_to_u", "u"),
            ("lookup", "u")} <= set(edges)
    assert ("transfer_to_u", "end") not in edges  # a handoff leads to its target only

    x, y, z = _agents(client)
    builder = DiGraphBuilder()
    for agent in (x, y, z):
        builder.add_node(agent)
    builder.add_edge(x, y).add_edge(x, z)
    nodes, edges = describe(GraphFlow([x, y, z], graph=builder.build()))
    assert set(edges) == {("p0", "p1"), ("p0", "p2"), ("p1", "end"), ("p2", "end")}


def test_describe_never_raises_on_unknown_shapes():
    class Odd:
        name = "odd"
        _participants = property(lambda self: 1 / 0)

    assert describe(Odd()) == ([], [])


def test_a_run_that_raises_ends_its_session_as_failed_with_the_model_call_closed(hints, recorder):
    bot = AssistantAgent("broke", model_client=SagaChatCompletionClient(ReplayChatCompletionClient([])))

    with pytest.raises(ValueError, match="No more mock responses"):
        asyncio.run(saga_autogen.run(bot, task="hi", client=hints, session_id="fails"))
    assert hints.flush(5)
    kinds = [type(e).__name__ for e in recorder.of("fails")]
    assert kinds == ["SessionStart", "LlmCallStart", "LlmCallEnd", "SessionEnd"]
    assert recorder.of("fails")[-1].outcome.value == "failed"
    assert not saga_autogen._by_session  # nothing left bound
