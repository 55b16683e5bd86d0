"""Fast-tier fixtures for the proxy: the scripted upstream (standing in for
`saga serve`), a real hint service, and `saga proxy` between them, all on loopback."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from saga_server.proxy.server import BackgroundServer
from tests.support.proxies import Proxies

_spec = importlib.util.spec_from_file_location("scripted_upstream", Path(__file__).with_name("scripted_upstream.py"))
scripted_upstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted_upstream)


@pytest.fixture(scope="module")
def upstream_server():
    app = scripted_upstream.build_app()
    with BackgroundServer(app) as server:
        server.app = app
        yield server


@pytest.fixture
def upstream(upstream_server):
    upstream_server.app.state.requests.clear()
    upstream_server.app.state.gate.clear()
    return upstream_server


@pytest.fixture
def make_proxy():
    """Factory: make_proxy(upstream_url, hint_endpoint, recorder=None, **ProxyConfig
    fields) -> server (with `.app`); every proxy it made is stopped after the test."""
    proxies = Proxies(rpc_timeout_s=0.2, hint_close_s=0.1)
    yield proxies
    proxies.stop_all()


@pytest.fixture
def proxy(upstream, hint_server, make_proxy):
    return make_proxy(upstream.url + "/v1", hint_server.endpoint)


@pytest.fixture
def dead_address() -> str:
    """host:port where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"
