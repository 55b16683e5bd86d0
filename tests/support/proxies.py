"""`start_proxy`: a `saga proxy` (`SagaProxy` under uvicorn) in this process, for tests.

    server = start_proxy(upstream_url, hint_endpoint)   # started; server.app is the SagaProxy
    ... server.url ...
    stop_proxy(server)                                   # ends its sessions, closes its HintClient

`Proxies` is the factory behind the `make_proxy` fixtures: it starts proxies and
stops every one it started.
"""

from __future__ import annotations

from saga_sdk import HintClient
from saga_server.proxy import ProxyConfig, SagaProxy
from saga_server.proxy.server import BackgroundServer

__all__ = ["Proxies", "start_proxy", "stop_proxy"]


def start_proxy(upstream: str, hint_endpoint: str, *, rpc_timeout_s: float = 0.5, recorder=None,
                **config) -> BackgroundServer:
    """A started proxy in front of `upstream` (an OpenAI base URL) whose hints go to
    `hint_endpoint` at once (no batching wait), with an optional `recorder`;
    `config`: `ProxyConfig` fields."""
    app = SagaProxy(ProxyConfig(upstream=upstream, **config),
                    hints=HintClient(endpoint=hint_endpoint, flush_interval_s=0.001, rpc_timeout_s=rpc_timeout_s),
                    recorder=recorder)
    server = BackgroundServer(app).start()
    server.app = app
    return server


def stop_proxy(server: BackgroundServer, hint_close_s: float = 1.0) -> None:
    server.stop()  # the lifespan's shutdown ends the proxy's sessions and flushes briefly
    server.app.hints.close(hint_close_s)


class Proxies:
    """`proxies(upstream, hint_endpoint, **ProxyConfig fields)` starts one (see
    `start_proxy`); `stop_all()` stops every one started, `hint_close_s` each."""

    def __init__(self, *, rpc_timeout_s: float = 0.5, hint_close_s: float = 1.0) -> None:
        self._rpc_timeout_s, self._hint_close_s = rpc_timeout_s, hint_close_s
        self._started: list[BackgroundServer] = []

    def __call__(self, upstream: str, hint_endpoint: str, **config) -> BackgroundServer:
        server = start_proxy(upstream, hint_endpoint, rpc_timeout_s=self._rpc_timeout_s, **config)
        self._started.append(server)
        return server

    def stop_all(self) -> None:
        for server in self._started:
            stop_proxy(server, self._hint_close_s)
        self._started.clear()
