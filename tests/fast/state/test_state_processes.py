"""`saga hints --state-dir`: what the hint service learnt is written when it stops and
read back when it starts again, so a new session gets the same predictions."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.support.coder_hints import coder_predictions, teach_coder
from saga_server.serve_child import free_port


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


def test_the_hint_service_comes_back_knowing_what_it_learnt(tmp_path):
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    first = start(port, "--state-dir", str(tmp_path))
    teach_coder(endpoint)
    before = coder_predictions(endpoint, "before")
    stop(first)
    assert (tmp_path / f"hints-{port}.json").exists()

    again = start(port, "--state-dir", str(tmp_path))
    after = coder_predictions(endpoint, "after")
    stop(again)
    cold = start(port, "--no-state")
    fresh = coder_predictions(endpoint, "cold")
    stop(cold)

    for key in ("p_continue", "remaining_steps", "prompt_growth_tokens"):
        assert after[key] == before[key], key
    assert abs(after["resume_mean_s"] - before["resume_mean_s"]) < 0.02  # they differ by the ms since the tool began
    assert fresh["p_continue"] != before["p_continue"] and fresh["prompt_growth_tokens"] != before["prompt_growth_tokens"]

    (tmp_path / f"hints-{port}.json").write_text("{ not json")
    corrupt = start(port, "--state-dir", str(tmp_path))
    broken = coder_predictions(endpoint, "corrupt")
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
