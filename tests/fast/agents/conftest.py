"""Fast-tier fixtures for the OpenAI Agents SDK integration: real `agents.Agent`s with
real function tools run by the real `Runner`, a real gRPC hint service (the fast tier's
`hint_server`, its registry keeping every event), and the scripted model server (the
one fake, at the model-server seam: see tests/support/chat_server.py). The SDK's own `OpenAIChatCompletionsModel` and
`OpenAIResponsesModel` talk to it over HTTP, so the tests see exactly what each put on
the wire. Tracing is off: the SDK would otherwise export to api.openai.com."""

from __future__ import annotations

import pytest
from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, set_tracing_disabled
from openai import AsyncOpenAI

from tests.support.chat_server import ChatServer, text
from tests.support.registry import RecordingRegistry

set_tracing_disabled(True)


@pytest.fixture
def chat_server():
    """Answers "done" until a test sets `chat_server.script`; one connection per request,
    as some tests run several `asyncio.run` loops."""
    server = ChatServer(script=lambda body: text("done"), keep_alive=False).start()
    yield server
    server.stop()


@pytest.fixture
def registry() -> RecordingRegistry:
    """Overrides the fast tier's plain registry, so its `hint_server` keeps every event."""
    return RecordingRegistry()


def make_model(kind: str, server: ChatServer):
    """The SDK's model for `kind` ("chat" or "responses") on the scripted server."""
    client = AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    if kind == "responses":
        return OpenAIResponsesModel(model="scripted", openai_client=client)
    return OpenAIChatCompletionsModel(model="scripted", openai_client=client)


@pytest.fixture(params=["chat", "responses"])
def model(request, chat_server):
    """Each test that takes it runs once per model API."""
    return make_model(request.param, chat_server)


@pytest.fixture
def chat_model(chat_server):
    return make_model("chat", chat_server)


@pytest.fixture(autouse=True)
def _no_leaked_patch():
    """Each test starts and ends with the OpenAI SDK unpatched (the integration patches it)."""
    from saga_sdk.integrations import openai as saga_openai

    saga_openai.uninstrument()
    yield
    saga_openai.uninstrument()
