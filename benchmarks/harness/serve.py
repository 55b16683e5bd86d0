"""One `saga serve` child per mode for the `serve_*` benchmarks, its readiness time
and memory, and requests to it with the standard library.

Benchmarks run SAGA and `--no-saga` one after the other in the same script, each
with identical vLLM flags, so every ratio they print compares like with like.
"""

from __future__ import annotations

import os
import subprocess
import sys
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
