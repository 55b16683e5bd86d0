"""Fast-tier fixtures for the AutoGen integration: real AutoGen agents and teams,
a real gRPC hint service, and the scripted chat-completions server (the one fake,
at the model-server seam: see tests/support/chat_server.py). The real
`OpenAIChatCompletionClient` talks to it over HTTP, plain or streamed, so the tests
see exactly what AutoGen sent, and the agents' tool calls are deterministic.
"""

from __future__ import annotations

import pytest

from saga_sdk import HintClient
from saga_server.rpc import HintServer
from tests.support.chat_server import ChatServer, text
from tests.support.registry import RecordingRegistry

@pytest.fixture
def chat_server():
    """Answers "TERMINATE" until a test sets `chat_server.script`; one connection per
    request, as tests reuse one model client across `asyncio.run` calls."""
    server = ChatServer(script=lambda body: text("TERMINATE"), keep_alive=False).start()
    yield server
    server.stop()


@pytest.fixture
def recorder():
    return RecordingRegistry()


@pytest.fixture
def hints(recorder):
    server = HintServer(recorder, "127.0.0.1:0").start()
    client = HintClient(endpoint=server.endpoint, flush_interval_s=0)
    yield client
    client.close(timeout=1)
    server.close(grace=None)


@pytest.fixture
def model_info():
    return {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
            "structured_output": False}


@pytest.fixture
def model_client(chat_server, model_info):
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    return OpenAIChatCompletionClient(model="scripted", base_url=chat_server.base_url, api_key="none",
                                      model_info=model_info)


@pytest.fixture(autouse=True)
def _tools_instrumented():
    """Each test starts and ends with AutoGen's tool methods as AutoGen shipped them."""
    from saga_sdk.integrations import autogen as saga_autogen

    saga_autogen.uninstrument()
    yield
    saga_autogen.uninstrument()
