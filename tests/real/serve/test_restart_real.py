"""`saga serve --state-dir`: a real engine that learnt a workflow, stopped and started
again, gives a new session of that workflow the same predictions (pin TTL, resume
times, continuation) as before the restart, where a clean start gives the cold
defaults; a corrupt state file is a one-line warning and a clean start.

STARTS ITS OWN ENGINE, three times on the same ports (the state file is named by the
port): with state, again with it, then with a corrupt file. Hints drive the workflow
(no model call is needed to learn one); one real request per phase checks the engine
serves. Run it alone:

    .venv/bin/python -m pytest tests/real/serve/test_restart_real.py -q
"""

from __future__ import annotations

import json

import pytest

from tests.support.coder_hints import coder_predictions, teach_coder
from saga_server.serve_child import free_port
from tests.support.own_engine import OwnEngine

READY_TIMEOUT_S = 600
PREDICTIONS = ("p_continue", "remaining_steps", "prompt_growth_tokens")


def engine(tmp, name: str, port: int, hint_port: int, state_dir) -> OwnEngine:
    own = OwnEngine(name, tmp, ["--num-gpu-blocks-override", "64", "--max-num-seqs", "2",
                                "--max-model-len", "1024", "--state-dir", str(state_dir)],
                    port=port, hint_port=hint_port)
    own.wait_ready(READY_TIMEOUT_S)
    return own


def serves(own: OwnEngine, model: str) -> None:
    out = own.post("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "Say hi."}],
                                            "max_tokens": 4, "temperature": 0.0, "seed": 0})
    assert out["choices"][0]["message"]["content"]


def test_a_restarted_engine_predicts_what_it_learnt_before_and_a_corrupt_file_is_a_clean_start(
        saga_server, tmp_path):
    port, hint_port = free_port(), free_port()
    state = tmp_path / "state"
    first = engine(tmp_path, "first", port, hint_port, state)
    try:
        serves(first, saga_server.model)
        cold = coder_predictions(first.hint_addr, "cold")  # nothing learnt yet: the priors
        teach_coder(first.hint_addr)
        before = coder_predictions(first.hint_addr, "before")
    finally:
        first.stop()
    written = json.loads((state / f"engine-{port}.json").read_text())
    assert written["component"] == "engine" and written["state"]["graphs"]["graphs"]

    second = engine(tmp_path, "second", port, hint_port, state)
    try:
        serves(second, saga_server.model)
        after = coder_predictions(second.hint_addr, "after")
    finally:
        second.stop()
    assert "learnt state restored" in second.log_path.read_text()
    for key in PREDICTIONS:
        assert after[key] == before[key], key
    assert after["pin_ttl_s"] == pytest.approx(before["pin_ttl_s"], abs=0.05)  # less the ms the tool ran
    assert after["resume_mean_s"] == pytest.approx(before["resume_mean_s"], abs=0.05)
    assert cold["p_continue"] != before["p_continue"] and cold["pin_ttl_s"] != pytest.approx(before["pin_ttl_s"])

    (state / f"engine-{port}.json").write_text('{"format": "saga-learnt/1", "state": {')
    third = engine(tmp_path, "third", port, hint_port, state)
    try:
        serves(third, saga_server.model)
        clean = coder_predictions(third.hint_addr, "clean")
    finally:
        third.stop()
    log = third.log_path.read_text()
    assert log.count("is corrupt") == 1 and "clean start" in log
    assert clean["p_continue"] == cold["p_continue"]
