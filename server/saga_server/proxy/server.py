"""Run an ASGI app under uvicorn on a background thread (tests, benchmarks, and
anything that needs the bound port of `port=0` before it carries on)."""

from __future__ import annotations

import threading
import time

import uvicorn

__all__ = ["BackgroundServer"]


class BackgroundServer:
    """`with BackgroundServer(app) as srv: srv.url` -> "http://127.0.0.1:PORT"."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                 startup_timeout_s: float = 30.0) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                lifespan="on", loop="asyncio", http="auto", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="saga-uvicorn", daemon=True)
        self._startup_timeout_s = startup_timeout_s
        self.host = host
        self.port = port

    def start(self) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
