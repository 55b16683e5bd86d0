"""The upstream dies under `saga proxy` (chaos table row 6): a relay between the proxy
and the real engine (`tests.support.faults.CuttingRelay`) cuts a streamed answer
after three events, then hangs up on a request without answering.

The fast tier checks the same rules against a scripted upstream that breaks its own
stream; here the stream is the real engine's, cut on the wire, and the session is
the one on the engine's hint service. The client must see a broken stream, never a
clean end; the proxy must serve the next request; the session must not be left
inside an LLM call; and the engine must drop the request nobody reads any more.
"""

from __future__ import annotations

import time
import uuid

import httpx

from saga_sdk import HintReader
from saga_server.serve.status import fetch_metrics
from tests.support.chaos_table import ChaosRow, added_median
from tests.support.faults import CuttingRelay
from tests.support.http import REQUEST_TIMEOUT_S


ABORT_WITHIN_S = 20.0  # a cut request's connection is gone: vLLM aborts it at once


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


def stream(url: str, body: dict, sid: str) -> tuple[bytes, Exception | None, float]:
    """POST a streamed chat; the bytes that came, the error that ended it (None: a
    clean end) and how long it took."""
    got, t0 = bytearray(), time.perf_counter()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers={"X-Session-ID": sid},
                          timeout=REQUEST_TIMEOUT_S) as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                got += chunk
    except httpx.HTTPError as exc:
        return bytes(got), exc, time.perf_counter() - t0
    return bytes(got), None, time.perf_counter() - t0


def engine_idle_within(saga_server, timeout_s: float) -> float:
    """Seconds until the engine runs no request. vLLM updates its gauges as steps
    finish, so an engine gone idle may still show the last count: each look first
    runs a one-token request, whose last step leaves the count of what else runs."""
    t0 = time.monotonic()
    while True:
        saga_server.chat([{"role": "user", "content": "Hi."}], max_tokens=1)
        if fetch_metrics(saga_server.base_url, timeout=30).get("vllm:num_requests_running", 0) == 0:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout_s, "the engine still runs a request nobody reads"
        time.sleep(0.5)


def llm_calls(saga_server, sid: str):
    with HintReader(saga_server.hint_addr, timeout=30) as reader:
        state = reader.session(sid)
    return state.state, [h.kind for h in state.history if h.kind.startswith("llm")]


def test_upstream_dies_mid_stream_and_before_answering(saga_server, make_proxy, server_after, chaos_row):
    sid = f"chaos-cut-{uuid.uuid4().hex[:8]}"
    body = {"model": saga_server.model, "messages": [{"role": "user", "content": "Count from one to twenty."}],
            "max_tokens": 24, "temperature": 0, "seed": 0, "stream": True}
    with CuttingRelay(saga_server.base_url) as relay:
        proxy = make_proxy(relay.url + "/v1", saga_server.hint_addr)
        whole, error, before_s = stream(proxy.url, body, sid)
        assert error is None and events(whole)[-1] == b"data: [DONE]" and len(events(whole)) > 4

        relay.cut_next(events=3)
        # 1,000 tokens that cannot stop early: unless the engine drops it, this request
        # runs for half a minute or more, far past `ABORT_WITHIN_S`
        cut, error, _ = stream(proxy.url, {**body, "max_tokens": 1000, "ignore_eos": True}, sid)
        assert error is not None and b"[DONE]" not in cut  # broken, never ended as if whole
        assert 1 <= len(events(cut)) <= 3
        assert proxy.app.errors["stream_broken"] == 1
        assert proxy.app.hints.flush(30)
        assert llm_calls(saga_server, sid) == ("idle", ["llm_call_start", "llm_call_end"] * 2)
        idle_s = engine_idle_within(saga_server, ABORT_WITHIN_S)

        relay.hang_up_next()  # once: the proxy sends it again on another connection
        retried = httpx.post(proxy.url + "/v1/chat/completions", json={**body, "stream": False},
                             headers={"X-Session-ID": sid}, timeout=REQUEST_TIMEOUT_S)
        assert retried.status_code == 200 and retried.json()["choices"][0]["message"]["content"]
        assert proxy.app.upstream_retries == 1 and proxy.app.errors["upstream_unreachable"] == 0

        relay.hang_up_next(times=2)  # the retry too: the agent gets a clear error
        refused = httpx.post(proxy.url + "/v1/chat/completions", json={**body, "stream": False},
                             headers={"X-Session-ID": sid}, timeout=REQUEST_TIMEOUT_S)
        assert refused.status_code == 502
        error = refused.json()["error"]
        assert error["type"] == "saga_proxy_error" and "upstream" in error["message"]
        assert proxy.app.errors["upstream_unreachable"] == 1

        again, error, after_s = stream(proxy.url, body, sid)  # the proxy serves on
        assert error is None and events(again)[-1] == b"data: [DONE]"
        plain = httpx.post(proxy.url + "/v1/chat/completions", json={**body, "stream": False},
                           headers={"X-Session-ID": sid}, timeout=REQUEST_TIMEOUT_S)
        assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"]
        assert proxy.app.hints.flush(30)
        assert llm_calls(saga_server, sid) == ("idle", ["llm_call_start", "llm_call_end"] * 6)
        assert relay.faults == 4 and proxy.app.upstream_retries == 2 and proxy.app.errors["internal"] == 0

    chaos_row(ChaosRow(
        "upstream dies mid-stream (cut after 3 events), then before answering", 0, added_median([before_s], [after_s]),
        0, server_after() + f"; engine dropped the cut request within {idle_s:.1f} s",
        "client saw a broken stream (no [DONE]); one hang-up before answering was sent again unseen, two gave "
        "a 502 naming the upstream; each call closed in its session; "
        "next stream whole"))
