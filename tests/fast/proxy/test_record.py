"""`saga proxy --record`: unchanged agents through the proxy and the scripted upstream,
their sessions written as saga-trace/1 tasks that `saga bench` loads; sizes, never text."""

from __future__ import annotations

import random
import threading
import time

import anthropic
import openai
import pytest

from saga_server.bench.workload import load_trace, materialize
from saga_server.core.categories import guess_category
from saga_server.core.events import LlmCallEnd, LlmCallStart, SessionEnd, SessionStart
from saga_server.proxy import Hint, HintFacts, cli
from saga_server.proxy.recording import feed_hints, proxy_recorder
from saga_server.record import RecordConfig, Recorder, TraceBuilder
from tests.fast.proxy.agents import SECRET, run_messages_agent, run_responses_agent, run_text_agent
from tests.support.proxies import start_proxy

TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("get_user", "search", "book")]
SYSTEM = {"role": "system", "content": "You are an airline agent. ZEBRA-SYSTEM-7731"}
RESULT = "TOOL-RESULT-OCTOPUS-55 " + "x" * 400  # long: each prompt outgrows the previous one plus its answer
PLAN = "ZEBRA-USER-9 plan: tools get_user,search | tools book | answer"
TEXTS = ("ZEBRA", "OCTOPUS", "done after", "airline agent", SECRET, "arguments", "call_")


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=SECRET, max_retries=0)


def timed_agent(client, tool_s=(0.25, 0.1)) -> list[dict]:
    """A tool loop that takes `tool_s[k]` over step k's tools; returns what it saw per call:
    usage, the call's own time, and the gap from its answer to the next request."""
    messages = [SYSTEM, {"role": "user", "content": PLAN}]
    seen = []
    for k in range(5):
        sent = time.monotonic()
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        answered = time.monotonic()
        if seen:
            seen[-1]["gap"] = sent - seen[-1]["answered"]
        seen.append({"prompt": r.usage.prompt_tokens, "output": r.usage.completion_tokens,
                     "cached": r.usage.prompt_tokens_details.cached_tokens, "call": answered - sent,
                     "answered": answered, "tools": [c.function.name for c in r.choices[0].message.tool_calls or ()]})
        message = r.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return seen
        time.sleep(tool_s[k])
        messages += [{"role": "tool", "tool_call_id": c.id, "content": RESULT} for c in message.tool_calls]
    raise AssertionError("agent did not finish")


@pytest.fixture
def recording(tmp_path):
    """(path, recorder factory); every recorder made is closed after the test."""
    made = []

    def make(**kw) -> Recorder:
        rec = proxy_recorder(str(tmp_path / "rec.jsonl"), **kw)
        made.append(rec)
        return rec

    yield tmp_path / "rec.jsonl", make
    for rec in made:
        rec.close()


def run_through(upstream, hint_server, recorder, agent, *, close: bool = True):
    """Run `agent(server)` through a proxy recording into `recorder`, then stop the proxy
    (its open sessions end as "closed") and, with `close`, the recorder."""
    server = start_proxy(upstream.url + "/v1", hint_server.endpoint, recorder=recorder)
    try:
        out = agent(server)
    finally:
        server.stop()
        server.app.hints.close(0.1)
    if close:
        recorder.close()
    return out


def test_a_recorded_agent_replays_as_it_ran(upstream, hint_server, recording):
    path, make = recording
    seen = run_through(upstream, hint_server, make(), lambda s: timed_agent(sdk(s)))
    text = path.read_text()
    for secret in TEXTS:
        assert secret not in text
    [task] = load_trace(path)
    steps = task["steps"]
    assert (task["end_reason"], task["truncated"]) == ("closed", True)
    assert len(steps) == len(seen) == 3
    assert [(s["prompt_tokens"], s["output_tokens"], s["provider_cached_tokens"]) for s in steps] == \
        [(c["prompt"], c["output"], c["cached"]) for c in seen]
    assert [s["reused_prefix_tokens"] for s in steps] == \
        [0] + [a["prompt"] + a["output"] for a in seen[:-1]]
    assert [[t["name"] for t in s["tools"]] for s in steps] == [c["tools"] for c in seen]
    assert all(t["category"] == guess_category(t["name"]) for s in steps for t in s["tools"])
    for step, call in zip(steps, seen):
        assert 0 < step["llm_latency_s"] <= call["call"] + 0.01
        for tool in step["tools"]:  # the proxy sees the gap from inside the agent's
            assert call["gap"] - 0.01 <= tool["duration_s"] <= call["gap"] + 0.05
    spec = materialize(task, random.Random(0))
    assert [s.prompt_tokens for s in spec.steps] == [c["prompt"] for c in seen]
    assert spec.steps[0].gap_s == steps[0]["tools"][0]["duration_s"]


def test_tool_names_can_be_hashed(upstream, hint_server, recording):
    path, make = recording
    run_through(upstream, hint_server, make(hash_tools=True), lambda s: timed_agent(sdk(s), (0, 0)))
    text = path.read_text()
    assert not any(f'"name":"{name}"' in text for name in ("get_user", "search", "book")) and "get_user" not in text
    [task] = load_trace(path)
    first, second = ([t["name"] for t in s["tools"]] for s in task["steps"][:2])
    assert len(set(first + second)) == 3 and all(n.startswith("tool-") for n in first + second)
    assert [t["category"] for t in task["steps"][0]["tools"]] == [guess_category("get_user"), guess_category("search")]


def test_a_session_that_goes_quiet_is_written_at_its_idle_end_and_marked(upstream, hint_server, recording):
    path, make = recording
    rec = make()
    server = start_proxy(upstream.url + "/v1", hint_server.endpoint, recorder=rec, idle_ttl_s=0.3,
                            idle_min_s=0.1)
    try:
        timed_agent(sdk(server), (0, 0))
        for _ in range(100):  # the tracker's sweep ends it; the recorder writes it at once
            rec.flush(5)
            if path.read_text():
                break
            time.sleep(0.05)
        [task] = load_trace(path)
        assert (task["end_reason"], task["truncated"]) == ("idle", True)
        assert rec.stats().open_sessions == 0
    finally:
        server.stop()
        server.app.hints.close(0.1)


@pytest.mark.parametrize("api", ["responses", "messages", "text"])
def test_every_api_is_recorded_with_its_cached_tokens(upstream, hint_server, recording, api):
    path, make = recording

    def agent(server):
        if api == "responses":
            run_responses_agent(sdk(server), "tools get_user | tools book | answer", store=True)
        elif api == "messages":
            run_messages_agent(anthropic.Anthropic(base_url=server.url, api_key=SECRET, max_retries=0),
                               "tools get_user | tools book | answer", stream=True)
        else:
            run_text_agent(sdk(server), "act grep -rn foo . | act python setup.py develop | "
                                        "act echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")

    run_through(upstream, hint_server, make(), agent)
    [task] = load_trace(path)
    steps = task["steps"]
    assert len(steps) == 3 and all(s["prompt_tokens"] > 0 and s["output_tokens"] > 0 for s in steps)
    tools = [[(t["name"], t["category"]) for t in s["tools"]] for s in steps]
    if api == "text":
        assert tools == [[("grep", "search")], [("python", "install")], []]  # categorised from the command
        assert (task["end_reason"], task["truncated"]) == ("submit", False)
    else:
        assert [[n for n, _ in s] for s in tools] == [["get_user"], ["book"], []]
    # as served: the Responses API reports 0 here, the scripted Messages API nothing
    assert {s["provider_cached_tokens"] for s in steps} == {"responses": {0}, "messages": {None}}.get(
        api, {s["provider_cached_tokens"] for s in steps})
    assert all(s["reused_prefix_tokens"] > 0 for s in steps[1:])
    for secret in TEXTS + ("THOUGHT", "returncode"):
        assert secret not in path.read_text()


def test_a_stuck_writer_or_a_broken_file_never_fails_a_request(upstream, hint_server, recording):
    path, _ = recording
    gate = threading.Event()

    def stuck(builder, t, events):
        gate.wait(30)

    full = Recorder(RecordConfig(str(path), queue_size=1), stuck)
    try:
        seen = run_through(upstream, hint_server, full, lambda s: timed_agent(sdk(s), (0, 0)), close=False)
        assert len(seen) == 3 and full.stats().dropped > 0
    finally:
        gate.set()
        full.close()
    broken = Recorder(RecordConfig("/dev/full"), feed_hints)  # every write fails: no space left
    seen = run_through(upstream, hint_server, broken, lambda s: timed_agent(sdk(s), (0, 0)))
    assert len(seen) == 3 and broken.stats().write_errors == 1 and broken.stats().tasks == 0


def test_saga_proxy_record_flags(tmp_path, capsys):
    args = cli.build_parser().parse_args(["--upstream", "http://127.0.0.1:1/v1", "--record", str(tmp_path / "r.jsonl"),
                                          "--record-hash-tools", "--record-max-bytes", "1000", "--idle-ttl-s", "20"])
    rec = cli.recording.from_args(args)
    try:
        c = rec.config
        assert (c.path, c.hash_tools, c.max_bytes, c.source) == (str(tmp_path / "r.jsonl"), True, 1000, "saga proxy")
        assert c.idle_s > 20  # past the tracker's own idle end
    finally:
        rec.close()
    assert cli.recording.from_args(cli.build_parser().parse_args(["--upstream", "http://x/v1"])) is None
    assert cli.main(["--upstream", "http://127.0.0.1:1/v1", "--record", str(tmp_path / "no" / "dir.jsonl")]) == 2
    assert "saga proxy:" in capsys.readouterr().err


def test_a_sessions_tenant_is_recorded():
    b = TraceBuilder()
    sid = "team-a/s1"
    feed_hints(b, 0.0, [Hint(SessionStart(sid, 0.0, tenant="team-a", workflow="wf")),
                        Hint(LlmCallStart(sid, 0.0, step=1)),
                        Hint(LlmCallEnd(sid, 0.0, step=1, prompt_tokens=9, output_tokens=1)),
                        Hint(SessionEnd(sid, 0.0), HintFacts(end_reason="submit"))])
    [task] = b.take()
    assert (task["tenant"], task["end_reason"], task["steps"][0]["prompt_tokens"]) == ("team-a", "submit", 9)
