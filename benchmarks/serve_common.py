"""Shared helpers of the `serve_*` benchmarks: start/stop one `saga serve` child,
measure its readiness time and memory, and talk to it with the standard library.

Benchmarks run SAGA and `--no-saga` one after the other in the same script, each
with identical vLLM flags, so every ratio they print compares like with like.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            ppid = int(parts[1])
            with open(f"/proc/{entry}/statm") as f:
                rss[int(entry)] = int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack.extend(children.get(p, []))
    return total


@dataclass
class Server:
    saga: bool
    port: int
    hint_port: int
    proc: subprocess.Popen
    log_path: Path
    started: float
    ready_s: float | None = None
    model: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hint_addr(self) -> str:
        return f"127.0.0.1:{self.hint_port}"

    def rss_bytes(self) -> int:
        return tree_rss_bytes(self.proc.pid)

    def post(self, path: str, body: dict, headers: dict | None = None, timeout: float = 600) -> dict:
        h = {"Content-Type": "application/json", **(headers or {})}
        req = urllib.request.Request(self.base_url + path, json.dumps(body).encode(), h)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(saga: bool, vllm_args: list[str], *, fast_start: bool = True, timeout: float = 900,
                 log_dir: Path | None = None, env: dict[str, str] | None = None,
                 ports: tuple[int, int] | None = None) -> Server:
    """`saga serve` (or `--no-saga`) in a subprocess, ready to serve; `env` adds
    environment variables (SAGA knobs) for it; `ports` (HTTP, hints): the same again
    for a restart (default: free ones)."""
    port, hint_port = ports or (free_port(), free_port())
    cmd = [sys.executable, "-m", "saga_server.cli", "serve", "--port", str(port), "--hint-port", str(hint_port)]
    if fast_start:
        cmd.append("--fast-start")
    if not saga:
        cmd.append("--no-saga")
    cmd += vllm_args
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server"), env.get("PYTHONPATH", "")])
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    log_path = log_dir / f"saga-serve-{'saga' if saga else 'stock'}-{port}.log"
    log = open(log_path, "wb")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = Server(saga, port, hint_port, proc, log_path, started)
    deadline = started + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"saga serve exited ({proc.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.5)
    else:
        server.stop()
        raise TimeoutError(f"not ready after {timeout} s; see {log_path}")
    if saga:  # the hint service starts with the engine; wait for its port too
        for _ in range(120):
            try:
                socket.create_connection(("127.0.0.1", hint_port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
    server.ready_s = time.monotonic() - started
    with urllib.request.urlopen(server.base_url + "/v1/models", timeout=10) as resp:
        server.model = json.loads(resp.read())["data"][0]["id"]
    return server


def run_threads(threads) -> None:
    """Start every thread, then wait for all of them."""
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    i = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[i]


def write_results(path: Path | None, args, results: list[dict]) -> None:
    """The run's command, machine, arguments and per-mode results as JSON at `path`
    (if given; `scripts/results_page.py` draws them)."""
    if path:
        from saga_server.bench.calibrate import cpu_description

        path.write_text(json.dumps({"command": command_line(), "machine": cpu_description(),
                                    "args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                   indent=2))


def command_line() -> str:
    """How this benchmark was run, as one would type it again."""
    return " ".join(["python", *sys.argv])
