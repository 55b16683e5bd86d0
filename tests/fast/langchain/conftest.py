"""Fixtures for the LangChain handler: a real hint service on loopback whose sink is
the real `SessionTable` plus a log of every accepted event (so tests can read the
fields history does not show: call ids, durations, structure, tokens), and the
scripted chat server (tests/support/chat_server.py, see its docstring)."""

from __future__ import annotations

import pytest

from tests.support.chat_server import ChatServer
from tests.support.registry import RecordingRegistry


@pytest.fixture
def registry() -> RecordingRegistry:
    """Overrides the fast tier's plain registry (so its `hint_server` feeds this one)."""
    return RecordingRegistry()


@pytest.fixture
def make_chat_server():
    servers = []

    def make(script=None):
        server = ChatServer(script=script).start()
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
