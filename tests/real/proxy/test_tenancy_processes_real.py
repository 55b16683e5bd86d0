"""Tenancy, black box: `saga hints --api-keys` and `saga proxy --api-keys` as their own
processes on real sockets, the proxy in front of the real `saga serve`.

- A proxy given an agent's key for its hints (every agent is told to set
  `SAGA_API_KEY`, so it is an easy slip) would make every tenant's sessions that
  agent's tenant's: it refuses to start.
- With the admin key, each tenant's key lists its own sessions only, whether they
  came through the proxy, an SDK session or bare hints without a start; a hint of
  one tenant's key for an id scoped to another tenant is refused and counted.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import openai
import pytest

from saga_sdk import HintClient, HintReader
from tests.support.faults import ROOT, HintServiceProcess
from saga_server.serve_child import free_port
from tests.support.http import REQUEST_TIMEOUT_S

KEY_A, KEY_B, KEY_OPS = "sk-proc-team-a-0123456", "sk-proc-team-b-6543210", "sk-proc-ops-admin-777"
START_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tenancy") / "keys"
    path.write_text(f"{KEY_A} team-a agent\n{KEY_B} team-b agent\n{KEY_OPS} ops admin\n")
    return path


@pytest.fixture(scope="module")
def hint_service(keys_file):
    with HintServiceProcess(args=("--api-keys", str(keys_file))) as service:
        yield service


def _proxy(saga_server, hint_service, keys_file, port: int, api_key: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("SAGA_API_KEY", "SAGA_API_KEYS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "sdk"), str(ROOT / "server"),
                                                      env.get("PYTHONPATH", "")]))
    if api_key:
        env["SAGA_API_KEY"] = api_key
    return subprocess.Popen([sys.executable, "-m", "saga_server.cli", "proxy", "--upstream", saga_server.openai_url,
                             "--port", str(port), "--hint-endpoint", hint_service.endpoint,
                             "--api-keys", str(keys_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def admin_proxy(saga_server, hint_service, keys_file):
    port = free_port()
    proc = _proxy(saga_server, hint_service, keys_file, port, None)  # hints with the file's admin key
    output: list[str] = []
    drain = threading.Thread(target=lambda: output.extend(proc.stdout), name="saga-proxy-output", daemon=True)
    drain.start()  # a full pipe would stall the proxy
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _accepts(port):  # it prints its URL before uvicorn binds: wait for the socket itself
        assert proc.poll() is None and time.monotonic() < deadline, f"saga proxy did not start: {''.join(output)}"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/v1"
    proc.terminate()
    proc.wait(30)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_a_proxy_whose_hint_key_is_an_agents_refuses_to_start(saga_server, hint_service, keys_file):
    proc = _proxy(saga_server, hint_service, keys_file, free_port(), KEY_A)
    out, _ = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 2, out
    assert "agent key of tenant 'team-a'" in out and "must be an admin key" in out


def test_each_key_lists_only_its_tenants_sessions_however_they_started(saga_server, hint_service, admin_proxy):
    run = uuid.uuid4().hex[:8]
    shared = f"shared-{run}"
    for key in (KEY_A, KEY_B):  # the same X-Session-ID through the proxy from both tenants
        client = openai.OpenAI(base_url=admin_proxy, api_key=key, max_retries=0, timeout=REQUEST_TIMEOUT_S)
        client.chat.completions.create(model=saga_server.model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=1, temperature=0, seed=0, extra_headers={"X-Session-ID": shared})
    hints = {key: HintClient(endpoint=hint_service.endpoint, api_key=key, flush_interval_s=0.001)
             for key in (KEY_A, KEY_B)}
    try:
        with hints[KEY_A].session(f"sdk-{run}", workflow="tenancy"):  # an SDK session
            pass
        hints[KEY_B].llm_call_start(f"bare-{run}")  # hints without a start
        hints[KEY_A].llm_call_start(f"team-b/{shared}")  # team-a's key on team-b's id
        hints[KEY_A].llm_call_start(f"team-b/squat-{run}")  # ... and on one team-b has not used yet
        assert all(client.flush(30) for client in hints.values())
    finally:
        for client in hints.values():
            client.close(5)

    def listed(key):
        with HintReader(hint_service.endpoint, api_key=key) as reader:
            return {s.session_id: s.tenant for s in reader.sessions(1000) if run in s.session_id}

    mine = {KEY_A: {f"team-a/{shared}": "team-a", f"sdk-{run}": "team-a"},
            KEY_B: {f"team-b/{shared}": "team-b", f"bare-{run}": "team-b"}}
    deadline = time.monotonic() + 30  # the proxy's own hints go in its next batch
    while time.monotonic() < deadline and any(listed(key) != want for key, want in mine.items()):
        time.sleep(0.2)
    assert listed(KEY_A) == mine[KEY_A]
    assert listed(KEY_B) == mine[KEY_B]
    assert f"team-b/squat-{run}" not in listed(KEY_OPS)
    with HintReader(hint_service.endpoint, api_key=KEY_OPS) as reader:
        assert reader.stats()["denied_foreign_scope"] >= 2
