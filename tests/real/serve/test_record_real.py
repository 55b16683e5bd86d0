"""`saga serve --record FILE` against real vLLM and SmolLM2: a small trace replay (token-id
prompts that grow by the previous answer, tool calls between the steps, SDK hints) is
written by the engine as saga-trace/1 tasks whose step counts, token counts, cached tokens
and tool gaps are those the replay sent and saw; a session without hints is written at
its idle end, marked; `saga bench --what-if` replays the file.

STARTS ITS OWN ENGINE: recording is a `saga serve` flag (the recorder lives in the
EngineCore process), so this module launches a second, small `saga serve --record`
(80 KV blocks, more than one 2048-token sequence as vLLM requires; 2 sequences) next
to the tier's shared one, which it still takes so that
the model is prepared. Run it alone:

    .venv/bin/python -m pytest tests/real/serve/test_record_real.py -q
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from saga_sdk import HintClient
from saga_server.bench.cli import main as bench
from saga_server.bench.workload import load_trace
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.serve import serve_child

READY_TIMEOUT_S = 600  # a cold engine start on a busy 2-core machine
IDLE_S = 4.0           # --record-idle-s: the hint-less session is written after this
BLOCK = 32             # saga serve's block size
# (prompt tokens of the first step, new tokens per later step, output tokens, tool seconds after each step)
PLANS = {"replay-a": (200, 40, 8, (0.3, 0.6, 0.2)), "replay-b": (120, 30, 6, (0.4,))}
TOOLS = (("pytest", "test"), ("grep", "search"), ("pip", "install"))


@pytest.fixture(scope="module")
def recording_engine(saga_server, tmp_path_factory):
    """(base URL, hint address, served model, recording path, process) of a `saga serve --record`."""
    path = tmp_path_factory.mktemp("record-real") / "engine.jsonl"
    child = serve_child(["--record", str(path), "--record-idle-s", str(IDLE_S), "--num-gpu-blocks-override", "80",
                         "--max-num-seqs", "2", "--max-model-len", "2048"], path.with_name("serve.log"))
    try:
        child.wait_ready(READY_TIMEOUT_S)
        yield child.base_url, child.hint_addr, child.model, path, child.proc
    finally:
        child.stop()  # saga serve stops vLLM's process group; the engine closes the file


def complete(base: str, model: str, prompt: list[int], sid: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0,
            "seed": 0, "return_token_ids": True, "session_id": sid}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def replay(base: str, hint_addr: str, model: str, sid: str, plan, hinted: bool = True) -> list[dict]:
    """One session of the plan; per step what was sent and seen."""
    first, grow, out_tokens, tool_s = plan
    rnd = random.Random(sid)
    prompt = [rnd.randrange(1000, 40000) for _ in range(first)]
    hints = HintClient(endpoint=hint_addr, flush_interval_s=0.001)
    seen = []
    try:
        if hinted:
            hints.session_start(sid, tenant="acme", workflow="replay")
        for k in range(len(tool_s) + 1):
            sent = time.monotonic()
            if seen:
                seen[-1]["gap"] = sent - seen[-1]["answered"]
            out = complete(base, model, prompt, sid, out_tokens)
            answered = time.monotonic()
            usage = out["usage"]
            answer = out["choices"][0]["token_ids"]
            seen.append({"prompt": len(prompt), "usage_prompt": usage["prompt_tokens"],
                         "output": usage["completion_tokens"], "answer": len(answer),
                         "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                         "call": answered - sent, "answered": answered})
            if k == len(tool_s):
                break
            name, category = TOOLS[k % len(TOOLS)]
            if hinted:
                hints.tool_call_start(sid, name, call_id=f"{sid}-{k}", category=category)
            time.sleep(tool_s[k])
            if hinted:
                hints.tool_call_end(sid, name, call_id=f"{sid}-{k}")
            prompt = prompt + list(answer) + [rnd.randrange(1000, 40000) for _ in range(grow)]
        if hinted:
            hints.session_end(sid)
        assert hints.flush(10)
    finally:
        hints.close(2)
    return seen


def wait_for(path: Path, sids: set[str], timeout: float = 60.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            tasks = {t["task_id"]: t for t in load_trace(path)}
            if sids <= set(tasks):
                return tasks
        time.sleep(0.25)
    raise AssertionError(f"{sids} not recorded in {timeout:.0f} s: {path.read_text() if path.exists() else ''}")


def test_a_trace_replay_is_recorded_as_it_was_sent_and_replays(recording_engine, tmp_path, capsys):
    base, hint_addr, model, path, _ = recording_engine
    run = uuid.uuid4().hex[:6]
    seen = {f"{name}-{run}": replay(base, hint_addr, model, f"{name}-{run}", plan) for name, plan in PLANS.items()}
    quiet = f"quiet-{run}"
    seen[quiet] = replay(base, hint_addr, model, quiet, (64, 16, 4, (0.2,)), hinted=False)
    tasks = wait_for(path, set(seen), timeout=IDLE_S + 60)

    for sid, calls in seen.items():
        task = tasks[sid]
        steps = task["steps"]
        assert len(steps) == len(calls), sid
        assert [(s["prompt_tokens"], s["output_tokens"]) for s in steps] == \
            [(c["usage_prompt"], c["output"]) for c in calls] and all(c["usage_prompt"] == c["prompt"] for c in calls)
        assert [s["provider_cached_tokens"] for s in steps] == [c["cached"] for c in calls]  # as served
        expected = [0] + [a["prompt"] + a["answer"] for a in calls[:-1]]  # each prompt grows by the last answer
        for got, want in zip((s["reused_prefix_tokens"] for s in steps), expected):
            assert want - BLOCK < got <= want, (sid, got, want)
        for step, call in zip(steps, calls):
            assert 0 < step["llm_latency_s"] <= call["call"] + 0.05
        if sid == quiet:  # no hints: a user's turn, no tool; ended by the recorder, marked
            assert (task["end_reason"], task["truncated"]) == ("recorder_idle", True) and "tenant" not in task
            assert abs(steps[0]["idle_s"] - calls[0]["gap"]) < 0.05 and steps[0]["tools"] == []
            continue
        assert (task["end_reason"], task["truncated"], task["tenant"], task["run"]) == \
            ("completed", False, "acme", "replay")
        for k, (step, call) in enumerate(zip(steps[:-1], calls)):
            [tool] = step["tools"]
            assert (tool["name"], tool["category"]) == TOOLS[k % len(TOOLS)]
            assert abs(tool["duration_s"] - call["gap"]) < 0.05  # the gap, as the replay slept it
        assert "incomplete" not in task and task["source"] == "saga serve"
    text = path.read_text()
    assert '"prompt":' not in text and "token_ids" not in text

    out = tmp_path / "what-if"
    assert bench(["--what-if", str(path), "--workers", "1", "--kv-tokens", "4096", "--out", str(out),
                  "--no-plots", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("What would SAGA do for engine.jsonl?")
