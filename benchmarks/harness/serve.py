"""One `saga serve` child per mode for the `serve_*` benchmarks, its readiness time
and memory, and requests to it with the standard library.

Benchmarks run SAGA and `--no-saga` one after the other in the same script, each
with identical vLLM flags, so every ratio they print compares like with like.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from saga_server.serve_child import ServeChild, free_port

ROOT = Path(__file__).resolve().parents[2]


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


class Server(ServeChild):
    """A `saga serve` child of this checkout; `saga`: SAGA on (else `--no-saga`)."""

    def __init__(self, saga: bool, args: list[str], log_dir: Path, env: dict[str, str] | None,
                 ports: tuple[int, int] | None) -> None:
        port, hint_port = ports or (free_port(), free_port())
        self.saga = saga
        super().__init__(args, log_dir / f"saga-serve-{'saga' if saga else 'stock'}-{port}.log", port=port,
                         hint_port=hint_port, checkout=ROOT, env=env)

    def rss_bytes(self) -> int:
        return tree_rss_bytes(self.proc.pid)

    def stream_completion(self, body: dict, timeout: float | None = None) -> "Streamed":
        """POST a completion with `stream` on; the answer's token ids (`return_token_ids`
        in `body`) and usage, and when its first token and its end arrived."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        req = urllib.request.Request(self.base_url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        t0 = time.monotonic()
        first, token_ids, usage = None, [], {}
        with urllib.request.urlopen(req, timeout=timeout or self.request_timeout_s) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data:"):])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    if choice.get("token_ids") or choice.get("text"):
                        first = first if first is not None else time.monotonic() - t0
                        token_ids.extend(choice.get("token_ids") or [])
        total = time.monotonic() - t0
        return Streamed(token_ids, usage, total if first is None else first, total)


@dataclass(frozen=True, slots=True)
class Streamed:
    """A streamed completion: its answer, and seconds from sending it to its first
    token (queueing and prefill) and to its end."""
    token_ids: list[int]
    usage: dict
    first_token_s: float
    total_s: float


def start_server(saga: bool, vllm_args: list[str], *, fast_start: bool = True, timeout: float = 900,
                 log_dir: Path | None = None, env: dict[str, str] | None = None,
                 ports: tuple[int, int] | None = None) -> Server:
    """`saga serve` (or `--no-saga`) in a subprocess, ready to serve; `env` adds
    environment variables (SAGA knobs) for it; `ports` (HTTP, hints): the same again
    for a restart (default: free ones)."""
    args = (["--fast-start"] if fast_start else []) + ([] if saga else ["--no-saga"]) + vllm_args
    server = Server(saga, args, log_dir or Path(os.environ.get("TMPDIR", "/tmp")), env, ports)
    server.wait_ready(timeout)
    return server


def run_threads(threads) -> None:
    """Start every thread, then wait for all of them."""
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def start_hint_service(port: int, core: int | None = None) -> subprocess.Popen:
    """A `saga hints` child listening on `port` (pinned to CPU `core` when given), once it says so."""
    cmd = [sys.executable, "-m", "saga_server.cli", "hints", "--listen", f"127.0.0.1:{port}"]
    if core is not None and hasattr(os, "sched_setaffinity"):
        cmd = ["taskset", "-c", str(core), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if "listening" not in proc.stdout.readline():
        raise SystemExit("hint service did not start")
    return proc
