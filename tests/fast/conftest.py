"""Shared fixtures for the fast tier: real gRPC servers on loopback, no engine, and a
hint client to them."""

from __future__ import annotations

import pytest

from saga_sdk import HintClient
from saga_server.core import SessionTable
from saga_server.rpc import HintServer


@pytest.fixture
def registry() -> SessionTable:
    return SessionTable(max_sessions=1000)


@pytest.fixture
def hint_server(registry):
    server = HintServer(registry, "127.0.0.1:0").start()
    yield server
    server.close(grace=None)


@pytest.fixture
def hints(hint_server):
    """A `HintClient` to `hint_server` that sends each hint at once (no batching wait)."""
    client = HintClient(endpoint=hint_server.endpoint, flush_interval_s=0)
    yield client
    client.close(timeout=1)
