"""Fixtures for the LangChain handler: a real hint service on loopback whose sink is
the real `SessionRegistry` plus a log of every accepted event (so tests can read the
fields history does not show: call ids, durations, structure, tokens), and the
scripted chat server shared with the OpenAI patch tests (see its docstring)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from saga_sdk import HintClient
from saga_server.core.registry import SessionRegistry
from saga_server.rpc import HintServer


def _load_chat_server():
    # With --import-mode=importlib test folders are not importable packages.
    name = "saga_tests_chat_server"
    if name not in sys.modules:
        path = Path(__file__).parents[1] / "openai_patch" / "chat_server.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


chat = _load_chat_server()


class RecordingRegistry(SessionRegistry):
    """The real registry; also keeps every accepted event, in arrival order."""

    def __init__(self) -> None:
        super().__init__(max_sessions=1000)
        self.events: list = []

    def accept(self, event) -> None:
        super().accept(event)
        self.events.append(event)

    def of(self, session_id: str) -> list:
        return [e for e in self.events if e.session_id == session_id]


@pytest.fixture
def registry() -> RecordingRegistry:
    return RecordingRegistry()


@pytest.fixture
def hint_server(registry):
    server = HintServer(registry, "127.0.0.1:0").start()
    yield server
    server.stop(grace=None)


@pytest.fixture
def hints(hint_server):
    client = HintClient(endpoint=hint_server.endpoint, flush_interval_s=0)
    yield client
    client.shutdown(timeout=1)


@pytest.fixture
def make_chat_server():
    servers = []

    def make(script=None):
        server = chat.ChatServer(script=script).start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


@pytest.fixture(autouse=True)
def _no_leaked_patch():
    """Each test starts and ends with the OpenAI SDK unpatched (the handler patches it)."""
    from saga_sdk.integrations import openai as saga_openai

    saga_openai.uninstrument()
    yield
    saga_openai.uninstrument()
