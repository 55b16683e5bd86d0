"""`saga serve` as a child process of this one, and free local ports.

    child = ServeChild(["--no-saga", "--fast-start"], log_path)   # free ports unless given
    child.wait_ready(900)            # its log says it serves, or ServeChildError with the log's tail
    child.post("/v1/completions", {"model": child.model, ...})
    child.stop()                     # SIGTERM (saga serve stops vLLM's whole group), SIGKILL after a grace

Ready means what `saga serve` itself prints once vLLM answers /health and, with SAGA,
the hint service listens: `[saga] ready in`. Reading the child's own log, not probing
its port, also means a free port another process took meanwhile is never mistaken for
it. `saga calibrate`, the benchmarks and the test support start engines through this.
Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["READY_LINE", "ServeChild", "ServeChildError", "free_port"]

READY_LINE = b"[saga] ready in"
LOG_TAIL_CHARS = 3000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (a wildcard address: free on every interface)."""
    with socket.socket() as s:
        s.bind((host if host not in ("0.0.0.0", "::") else "", 0))
        return s.getsockname()[1]


class ServeChildError(RuntimeError):
    """The child exited, or did not get ready in time; the message ends with its log's tail."""


class ServeChild:
    """One `saga serve` child on `port` and `hint_port` (free ones by default), its
    output in `log_path`. `checkout`: a source tree whose `sdk` and `server` go first on
    the child's PYTHONPATH (it runs there), so it runs that tree's code; `env`: variables
    added to the child's environment."""

    request_timeout_s: float = 600  # `post`'s default: one request to a CPU engine may take minutes

    def __init__(self, args: list[str], log_path: Path, *, port: int | None = None, hint_port: int | None = None,
                 checkout: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.hint_port = hint_port or free_port()
        self.log_path = Path(log_path)
        self.model = ""
        self.ready_s: float | None = None
        child_env = {**os.environ, **(env or {})}
        if checkout is not None:
            child_env["PYTHONPATH"] = os.pathsep.join(
                [str(checkout / "sdk"), str(checkout / "server"), child_env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "saga_server.cli", "serve", "--port", str(self.port),
               "--hint-port", str(self.hint_port), *args]
        self.started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=checkout)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hint_addr(self) -> str:
        return f"127.0.0.1:{self.hint_port}"

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError as exc:
            return f"(log unreadable: {exc})"

    def wait_ready(self, timeout_s: float = 900) -> None:
        """Until the child serves; then `ready_s` (seconds since its start) and `model`
        (the served model's id; empty where the port wants a key) are set. A child
        that exits or is not ready within `timeout_s` is stopped and raises
        `ServeChildError`."""
        deadline = time.monotonic() + timeout_s
        while not self._log_says_ready():
            if self.proc.poll() is not None:
                raise ServeChildError(f"saga serve exited with {self.proc.returncode} before it was ready; "
                                      f"the end of {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServeChildError(f"saga serve not ready after {timeout_s:.0f} s; "
                                      f"the end of {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.5)
        self.ready_s = time.monotonic() - self.started
        try:
            with urllib.request.urlopen(self.base_url + "/v1/models", timeout=10) as resp:
                self.model = json.loads(resp.read())["data"][0]["id"]
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise
            self.model = ""  # its port wants a key (`--api-keys`): the caller names the model

    def _log_says_ready(self) -> bool:
        try:
            return READY_LINE in self.log_path.read_bytes()
        except OSError:
            return False

    def post(self, path: str, body: dict, headers: dict[str, str] | None = None,
             timeout: float | None = None) -> dict:
        """POST JSON to the child's HTTP API; returns the decoded answer."""
        req = urllib.request.Request(self.base_url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(req, timeout=timeout or self.request_timeout_s) as resp:
            return json.loads(resp.read())

    def stop(self, grace_s: float = 60) -> None:
        """SIGTERM (saga serve then stops vLLM's process group), SIGKILL after `grace_s`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
