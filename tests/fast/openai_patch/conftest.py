"""Fixtures for the OpenAI SDK patch: a scripted chat server (see chat_server.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def load_chat_server():
    """Import chat_server.py by path: with --import-mode=importlib test folders are
    not packages on sys.path, and the LangChain tests share this module."""
    name = "saga_tests_chat_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("chat_server.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


chat = load_chat_server()


@pytest.fixture
def chat_server():
    server = chat.ChatServer().start()
    yield server
    server.stop()


@pytest.fixture
def patched():
    from saga_sdk.integrations import openai as saga_openai

    saga_openai.instrument()
    yield saga_openai
    saga_openai.uninstrument()
