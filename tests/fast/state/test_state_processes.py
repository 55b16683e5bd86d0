"""`saga hints --state-dir`: what the hint service learnt is written when it stops and
read back when it starts again, so a new session gets the same predictions."""

from __future__ import annotations

import subprocess
import sys
import time

from saga_sdk import HintClient, HintReader
from tests.support.http import free_port


def start(port: int, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "saga_server.cli", "hints", "--listen", f"127.0.0.1:{port}",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "listening" in proc.stdout.readline()
    return proc


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def teach(endpoint: str) -> None:
    with HintClient(endpoint=endpoint) as client:
        for n in range(10):
            sid = f"taught-{n}"
            client.session_start(sid, workflow="coder")
            for step in range(3):
                client.llm_call_start(sid, step=step)
                client.llm_call_end(sid, step=step, prompt_tokens=1000 + 500 * step, output_tokens=40)
                if step < 2:
                    client.tool_call_start(sid, "pytest", call_id=f"{n}.{step}")
                    time.sleep(0.03)
                    client.tool_call_end(sid, "pytest", call_id=f"{n}.{step}")
            client.session_end(sid)
        assert client.flush(10)


def predicted(endpoint: str, sid: str) -> dict[str, float]:
    """A new coder session, just into its first test run."""
    with HintClient(endpoint=endpoint) as client:
        client.session_start(sid, workflow="coder")
        client.llm_call_start(sid, step=0)
        client.llm_call_end(sid, step=0, prompt_tokens=1000, output_tokens=40)
        client.tool_call_start(sid, "pytest", call_id="x")
        assert client.flush(10)
    with HintReader(endpoint) as reader:
        return dict(reader.session(sid).metrics)


def test_the_hint_service_comes_back_knowing_what_it_learnt(tmp_path):
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    first = start(port, "--state-dir", str(tmp_path))
    teach(endpoint)
    before = predicted(endpoint, "before")
    stop(first)
    assert (tmp_path / f"hints-{port}.json").exists()

    again = start(port, "--state-dir", str(tmp_path))
    after = predicted(endpoint, "after")
    stop(again)
    cold = start(port, "--no-state")
    fresh = predicted(endpoint, "cold")
    stop(cold)

    for key in ("p_continue", "remaining_steps", "prompt_growth_tokens"):
        assert after[key] == before[key], key
    assert abs(after["resume_mean_s"] - before["resume_mean_s"]) < 0.02  # they differ by the ms since the tool began
    assert fresh["p_continue"] != before["p_continue"] and fresh["prompt_growth_tokens"] != before["prompt_growth_tokens"]

    (tmp_path / f"hints-{port}.json").write_text("{ not json")
    corrupt = start(port, "--state-dir", str(tmp_path))
    broken = predicted(endpoint, "corrupt")
    err = stop(corrupt)
    assert "is corrupt" in err and "clean start" in err
    assert broken["p_continue"] == fresh["p_continue"]  # a clean start, served as usual


def test_the_proxy_writes_its_learnt_state_when_it_stops_and_warns_of_a_corrupt_one(tmp_path):
    import json

    port = free_port()
    def run_proxy() -> str:
        proc = subprocess.Popen([sys.executable, "-m", "saga_server.cli", "proxy", "--upstream", "http://127.0.0.1:9/v1",
                                 "--no-hints", "--port", str(port), "--state-dir", str(tmp_path), "--log-level", "info"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "OpenAI base URL" in proc.stdout.readline()
        time.sleep(0.5)  # serving
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, -15), err  # uvicorn re-raises the SIGTERM it handled
        return err

    run_proxy()
    doc = json.loads((tmp_path / f"proxy-{port}.json").read_text())
    assert doc["component"] == "proxy" and doc["state"] == {"pauses": {"workflows": []}}
    (tmp_path / f"proxy-{port}.json").write_text(json.dumps({**doc, "sha256": "0" * 64}))
    assert "fails its checksum" in run_proxy()
