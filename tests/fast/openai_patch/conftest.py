"""Fixtures for the OpenAI SDK patch: the scripted chat server (see
tests/support/chat_server.py for why a fake is acceptable here)."""

from __future__ import annotations

import pytest

from tests.support.chat_server import ChatServer


@pytest.fixture
def chat_server():
    server = ChatServer().start()
    yield server
    server.stop()


@pytest.fixture
def patched():
    from saga_sdk.integrations import openai as saga_openai

    saga_openai.instrument()
    yield saga_openai
    saga_openai.uninstrument()
