"""The real tier: one running `saga serve` (real vLLM, real model) shared by every test.

`saga_server` (session scope) yields a `RunningSaga`:
- with `SAGA_TEST_OPENAI_URL` (e.g. http://127.0.0.1:8000/v1) and
  `SAGA_TEST_HINT_ADDR` (e.g. 127.0.0.1:50051) set, that already-running server is
  used and never stopped;
- otherwise ONE `saga serve --fast-start` subprocess is started on free ports with
  a small KV cache (`SAGA_TEST_KV_BLOCKS` blocks of 32 tokens, default 192: small
  enough that a handful of requests evicts, which the pinning tests need) and
  stopped at the end of the session.

Either way `rss_bytes()` is the server's memory: its process tree's, the tree of the
`saga serve` started here, or of the process listening on the external server's
HTTP port when it runs on this host (`tests.support.processes.listening_pid`).

Every real test must take this fixture (or one built on it) instead of starting
its own server: the machine has 2 cores and vLLM takes ~30 s to start.

`chaos_row` records a row of the chaos and load table (`tests.support.chaos_table`),
which the terminal summary prints at the end of the run.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.harness.serve import tree_rss_bytes
from tests.support.chaos_table import ChaosRow, ChaosTable
from tests.support.http import REQUEST_TIMEOUT_S, post_chat
from tests.support.processes import listening_pid
from tests.support.serve import serve_child


def pytest_collection_modifyitems(items):
    """Everything under tests/real is the slow tier (`-m "not real"` skips it)."""
    for item in items:
        if str(item.fspath).startswith(str(Path(__file__).parent)):
            item.add_marker(pytest.mark.real)


@dataclass(frozen=True)
class RunningSaga:
    base_url: str  # http://host:port
    openai_url: str  # base_url + "/v1"
    hint_addr: str  # host:port of the hint gRPC service
    model: str  # served model name
    started_here: bool
    kv_blocks: int | None  # when started here: the KV cache size in blocks of 32 tokens
    pid: int | None = None  # the `saga serve` started here, or the external server's HTTP listener (None: not here)

    def rss_bytes(self) -> int | None:
        """Resident memory of the server's process tree (engine included); None
        when its process is not known on this host."""
        return (tree_rss_bytes(self.pid) or None) if self.pid else None

    def chat(self, messages, *, session_id: str | None = None, timeout: float = REQUEST_TIMEOUT_S,
             **body) -> dict:
        """POST /v1/chat/completions; returns the JSON."""
        return post_chat(self.openai_url + "/chat/completions", self.model, messages, session_id=session_id,
                         timeout=timeout, **body)


def _served_model(openai_url: str) -> str:
    with urllib.request.urlopen(openai_url + "/models", timeout=10) as resp:
        return json.loads(resp.read())["data"][0]["id"]


def _local_pid(base_url: str) -> int | None:
    """The process serving `base_url` when it listens on this host's loopback."""
    parts = urllib.parse.urlsplit(base_url)
    try:
        local = all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(parts.hostname, None))
    except (OSError, ValueError):
        return None
    return listening_pid(parts.port or (443 if parts.scheme == "https" else 80)) if local else None


def _wait_healthy(url: str, timeout: float) -> None:
    """Until the external server at `url` answers /health."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"saga serve not ready after {timeout:.0f} s")


@pytest.fixture(scope="session")
def saga_server(tmp_path_factory):
    url, hints = os.environ.get("SAGA_TEST_OPENAI_URL"), os.environ.get("SAGA_TEST_HINT_ADDR")
    if url and hints:
        openai_url = url.rstrip("/")
        openai_url = openai_url if openai_url.endswith("/v1") else openai_url + "/v1"
        base = openai_url[:-3]
        _wait_healthy(base, 60)
        yield RunningSaga(base, openai_url, hints, _served_model(openai_url), False, None, _local_pid(base))
        return
    pytest.importorskip("vllm", reason="vLLM not installed (scripts/setup.sh)")
    blocks = int(os.environ.get("SAGA_TEST_KV_BLOCKS", "192"))
    child = serve_child(["--num-gpu-blocks-override", str(blocks), "--max-num-seqs", "16"],
                        tmp_path_factory.mktemp("saga-serve") / "serve.log")
    try:
        child.wait_ready(float(os.environ.get("SAGA_TEST_READY_S", "600")))  # the hint service is up too
        yield RunningSaga(child.base_url, child.base_url + "/v1", child.hint_addr, child.model, True, blocks,
                          child.proc.pid)
    finally:
        child.stop()  # saga serve stops vLLM's whole process group


_CHAOS = pytest.StashKey[ChaosTable]()


@pytest.fixture
def chaos_row(request):
    """`chaos_row(ChaosRow(...))`: add this case's row to the chaos table (and print it)."""
    table = request.config.stash.setdefault(_CHAOS, ChaosTable())

    def record(row: ChaosRow) -> None:
        table.add(row)
        print(row.line())

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    table = config.stash.get(_CHAOS, None)
    if table is not None and table.rows:
        terminalreporter.section("chaos and load suite")
        for line in table.lines():
            terminalreporter.write_line(line)
        if os.environ.get("SAGA_CHAOS_TABLE"):  # for scripts/results_page.py --chaos
            from saga_server.host_cpu import cpu_description

            cpu = cpu_description()
            Path(os.environ["SAGA_CHAOS_TABLE"]).write_text(
                f"Command: `SAGA_CHAOS_TABLE=FILE make test`\n\nMachine: {cpu['model']}, {cpu['cores']} cores\n\n"
                + "\n".join(table.lines()) + "\n")
