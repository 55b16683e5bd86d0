"""`start_proxy`: a `saga proxy` (`SagaProxy` under uvicorn) in this process, for tests.

    server = start_proxy(upstream_url, hint_endpoint)   # started; server.app is the SagaProxy
    ... server.url ...
    stop_proxy(server)                                   # ends its sessions, closes its HintClient
"""

from __future__ import annotations

from saga_sdk import HintClient
from saga_server.proxy import ProxyConfig, SagaProxy
from saga_server.proxy.server import BackgroundServer

__all__ = ["start_proxy", "stop_proxy"]


def start_proxy(upstream: str, hint_endpoint: str, *, rpc_timeout_s: float = 0.5, **config) -> BackgroundServer:
    """A started proxy in front of `upstream` (an OpenAI base URL) whose hints go to
    `hint_endpoint` at once (no batching wait); `config`: `ProxyConfig` fields."""
    app = SagaProxy(ProxyConfig(upstream=upstream, **config),
                    hints=HintClient(endpoint=hint_endpoint, flush_interval_s=0.001, rpc_timeout_s=rpc_timeout_s))
    server = BackgroundServer(app).start()
    server.app = app
    return server


def stop_proxy(server: BackgroundServer, hint_close_s: float = 1.0) -> None:
    server.stop()  # the lifespan's shutdown ends the proxy's sessions and flushes briefly
    server.app.hints.close(hint_close_s)
