"""Faults to inject on loopback, for the chaos suite (`tests/real/chaos`).

- `HintServiceProcess`: `saga hints` in its own process on a fixed port, to SIGKILL
  and start again on the same port while agents run.
- `CuttingRelay`: a TCP relay in front of an HTTP upstream that passes bytes both
  ways and, when armed, kills the next exchange: cuts a streamed answer after its
  n-th server-sent event (the upstream died mid-stream), or hangs up on the next
  request without answering (it died before answering).
- `exchange`: send raw bytes to a port and read what comes back until the peer
  closes or goes quiet (garbage, truncated frames, hand-made HTTP).
- `http2_garbage`: byte strings a broken or hostile gRPC client might send.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from saga_server.serve_child import free_port

__all__ = ["CuttingRelay", "HintServiceProcess", "exchange", "http2_garbage", "status_of"]

ROOT = Path(__file__).resolve().parents[2]


class HintServiceProcess:
    """`saga hints --listen 127.0.0.1:PORT` as a child process; the port stays the
    same across `kill()` and `start()`, as a restarted service's would.

        with HintServiceProcess() as service:   # started
            service.kill()                      # SIGKILL: no goodbye to anyone
            service.start()                     # same endpoint again
    """

    def __init__(self, port: int | None = None, *, ready_timeout_s: float = 120.0,
                 args: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self.args = args  # more of `saga hints`' arguments (`--api-keys FILE`)
        self.ready_timeout_s = ready_timeout_s
        self.starts = 0
        self._proc: subprocess.Popen | None = None
        self._output: deque[str] = deque(maxlen=50)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "HintServiceProcess":
        """Start the service and wait until it listens. A port the killed process's
        socket still holds is retried for a few seconds."""
        if self.running:
            raise RuntimeError("already running")
        for attempt in range(20):
            if self._spawn():
                self.starts += 1
                return self
            time.sleep(0.25 * (attempt + 1))
        raise RuntimeError(f"saga hints did not start on {self.endpoint}: {list(self._output)[-5:]}")

    def kill(self) -> None:
        """SIGKILL and reap: connections drop with no goodbye, queued hints are lost."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(30)
            self._proc = None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def __enter__(self) -> "HintServiceProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self) -> bool:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "sdk"), str(ROOT / "server"),
                                                          env.get("PYTHONPATH", "")]))
        env.pop("SAGA_API_KEY", None)  # keys only through `args`: open by default, like the test server
        env.pop("SAGA_API_KEYS", None)
        proc = subprocess.Popen([sys.executable, "-m", "saga_server.cli", "hints", "--listen", self.endpoint,
                                 *self.args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
        ready = threading.Event()

        def read() -> None:  # drains the pipe for the process's whole life
            for line in proc.stdout:
                self._output.append(line.rstrip())
                if "listening on" in line:
                    ready.set()

        threading.Thread(target=read, name="saga-hints-output", daemon=True).start()
        deadline = time.monotonic() + self.ready_timeout_s
        while not ready.wait(0.05):
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(30)
                return False
        self._proc = proc
        return True


class CuttingRelay:
    """A loopback TCP relay to `upstream` ("host:port" or an http URL's origin).

    Bytes pass both ways unchanged, one upstream connection per client connection.
    `cut_next(events)` makes the next exchange's answer stop after its `events`-th
    server-sent event (the bytes up to that event's blank line are passed on, then
    both connections close mid-body); `hang_up_next(times)` closes the next `times`
    requests' connections without passing them on or answering. Arm only while no request is in
    flight: the fault applies to the first request bytes that arrive after arming.
    `faults` counts the exchanges killed."""

    def __init__(self, upstream: str) -> None:
        hostport = upstream.split("://", 1)[-1].split("/", 1)[0]
        host, _, port = hostport.rpartition(":")
        self.upstream = (host or "127.0.0.1", int(port))
        self.faults = 0
        self._armed: tuple[str, int] | None = None
        self._hang_ups = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="cutting-relay", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "CuttingRelay":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        if self._server is not None:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> "CuttingRelay":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def cut_next(self, events: int = 3) -> None:
        with self._lock:
            self._armed = ("cut", events)

    def hang_up_next(self, times: int = 1) -> None:
        with self._lock:
            self._hang_ups = times

    def _take(self) -> tuple[str, int] | None:
        with self._lock:
            if self._hang_ups:
                self._hang_ups -= 1
                return ("hang_up", 0)
            armed, self._armed = self._armed, None
            return armed

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        exchange = _Exchange()  # what the connection's current request was armed with
        done = asyncio.Event()

        async def requests() -> None:
            while data := await reader.read(65536):
                armed = self._take()
                if armed is not None:
                    exchange.arm(*armed)
                    if exchange.fault == "hang_up":
                        self.faults += 1
                        break
                up_writer.write(data)
                await up_writer.drain()
            done.set()

        async def answers() -> None:
            while data := await up_reader.read(65536):
                end = exchange.cut_at(data)
                if end is not None:
                    writer.write(data[:end])
                    await writer.drain()
                    self.faults += 1
                    break
                writer.write(data)
                await writer.drain()
            done.set()

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(answers())]
        try:
            await done.wait()
        except asyncio.CancelledError:
            pass
        finally:
            for task in tasks:
                task.cancel()
            for w in (writer, up_writer):
                try:
                    w.close()
                except OSError:
                    pass


class _Exchange:
    """One connection's armed fault, and how many events of its answer went by."""

    def __init__(self) -> None:
        self.fault, self.events, self.seen, self.last = "pass", 0, 0, b""

    def arm(self, fault: str, events: int) -> None:
        self.fault, self.events, self.seen, self.last = fault, events, 0, b""

    def cut_at(self, data: bytes) -> int | None:
        """Where in `data` the answer must stop (the end of its `events`-th event's
        blank line), or None to pass all of it on."""
        if self.fault != "cut":
            return None
        joined, position = self.last + data, 0
        while True:
            found = joined.find(b"\n\n", position)
            if found < 0:
                self.last = joined[-1:] if position < len(joined) else b""  # a boundary split over reads
                return None
            position, self.seen = found + 2, self.seen + 1
            if self.seen >= self.events:
                self.fault = "pass"
                return max(0, position - len(self.last))


def exchange(port: int, data: bytes, *, host: str = "127.0.0.1", quiet_s: float = 2.0,
             limit: int = 1 << 20) -> bytes:
    """Send `data` to host:port and return what came back before the peer closed,
    reset, or sent nothing for `quiet_s` (at most `limit` bytes)."""
    out = bytearray()
    with socket.create_connection((host, port), timeout=quiet_s) as s:
        try:
            s.sendall(data)
            while len(out) < limit:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except OSError:  # reset, broken pipe, or quiet for quiet_s
            pass
    return bytes(out)


def status_of(response: bytes) -> int | None:
    """The status code of a raw HTTP/1.1 response, or None if there is none."""
    line = response.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit() else None


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(kind: int, flags: int, stream: int, payload: bytes, *, length: int | None = None) -> bytes:
    length = len(payload) if length is None else length
    return struct.pack(">I", length)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name (lengths under 127)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def http2_garbage(seed: int = 0) -> dict[str, bytes]:
    """Named byte strings for a gRPC port: random bytes; HTTP/1.1 on an HTTP/2 port;
    the HTTP/2 preface alone and with truncated or malformed frames; a well-formed
    call to SendHints whose message claims 4 GiB, or whose stream ends mid-message."""
    rnd = random.Random(seed)
    headers = (b"\x83\x86" + _literal(b":path", b"/saga.v1.WorkflowHints/SendHints") +
               _literal(b":authority", b"localhost") + _literal(b"content-type", b"application/grpc") +
               _literal(b"te", b"trailers"))
    settings = _frame(4, 0, 0, b"")
    call = _PREFACE + settings + _frame(1, 0x4, 1, headers)  # HEADERS, END_HEADERS
    return {
        "random bytes": rnd.randbytes(4096),
        "http/1.1 request": b"POST /saga.v1.WorkflowHints/SendHints HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: 5\r\n\r\nhello",
        "preface only": _PREFACE,
        "truncated preface": _PREFACE[:10],
        "settings frame cut short": _PREFACE + _frame(4, 0, 0, b"\x00\x03", length=60),
        "headers with garbage hpack": _PREFACE + settings + _frame(1, 0x5, 1, rnd.randbytes(64)),
        "frame longer than allowed": _PREFACE + settings + _frame(0, 0, 1, b"x" * 16, length=(1 << 24) - 1),
        "message claiming 4 GiB": call + _frame(0, 0, 1, b"\x00\xff\xff\xff\xff" + b"\x0a\x01x"),
        "stream ends mid-message": call + _frame(0, 0x1, 1, b"\x00\x00\x00\x01\x00" + b"\x0a"),
        "data on a stream never opened": _PREFACE + settings + _frame(0, 0x1, 7, b"\x00\x00\x00\x00\x00"),
    }
