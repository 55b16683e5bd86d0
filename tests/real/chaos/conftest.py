"""The chaos and load suite: faults, floods, garbage and crowds against the shared
real `saga serve` (tests/real/conftest.py), each case measured and written as one row
of the chaos table (`chaos_row`), printed at the end of the run.

Bounded for CI: every case is deterministic (temperature 0, seeds, forced tool and
structured-output choices, derandomised hypothesis) and the whole folder runs in a
few minutes on a busy 2-core machine. Latency goes into the table, never into an
assertion.
"""

from __future__ import annotations

import uuid

import openai
import pytest

from saga_sdk import HintReader
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.proxies import Proxies


@pytest.fixture
def make_proxy():
    """`make_proxy(upstream, hint_endpoint, **ProxyConfig fields)`: a started proxy
    (`.url`, `.app`); every one made is stopped after the test (its sessions ended)."""
    proxies = Proxies(hint_close_s=5.0)
    yield proxies
    proxies.stop_all()


@pytest.fixture
def server_after(saga_server):
    """`server_after()`: checks that the engine still answers a chat and the hint
    service its stats; returns what the table's "server after" column says, with
    the server's memory where its process is known (`RunningSaga.rss_bytes`)."""

    def check() -> str:
        out = saga_server.chat([{"role": "user", "content": "Say ok."}], max_tokens=2,
                               session_id=f"chaos-after-{uuid.uuid4().hex[:8]}")
        assert out["choices"][0]["finish_reason"] in ("stop", "length")
        with HintReader(saga_server.hint_addr, timeout=30) as reader:
            reply = reader.server_stats()
        rss = saga_server.rss_bytes()
        return (f"serves; hints answer ({reply.stats.get('sessions_live', 0):.0f} live sessions, "
                f"{reply.engine.hints_dropped} engine hint drops)"
                + ("" if rss is None else f"; server RSS {rss / 2**20:,.0f} MiB"))

    return check


def openai_client(base_url: str) -> openai.OpenAI:
    """What an agent builds: no retries, so a failure shows as one."""
    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)


@pytest.fixture
def agent_client():
    """`agent_client(proxy_url)`: an OpenAI SDK client to `proxy_url + "/v1"`."""
    return lambda url: openai_client(url + "/v1")
