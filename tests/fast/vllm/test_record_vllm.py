"""`saga serve --record` on the engine side: scripted requests through vLLM's real
scheduler with SAGA plugged in, and hints into its hint sink, written as saga-trace/1
tasks by the plugin's recorder (`SAGA_RECORD*`, as `saga serve` sets them)."""

from __future__ import annotations

import logging
import time

import pytest
from vllm.v1.request import RequestStatus

from saga_server.bench.workload import load_trace
from saga_server.core import CoreConfig, ManualClock, SessionEnd, SessionStart, ToolCallEnd, ToolCallStart, WorkflowCore
from saga_server.core.categories import guess_category
from saga_server.core.pinning import PinConfig
from saga_server.engines.vllm import SagaScheduler
from vllm_builders import Requests, hit_tokens, make_scheduler, step

BS = 16
DT = 0.01  # engine seconds per scheduler step
STEP_KEYS = {"prompt_tokens", "output_tokens", "reused_prefix_tokens", "provider_cached_tokens", "llm_latency_s",
             "tools", "idle_s"}


def tokens(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


@pytest.fixture
def engine(tiny_model, tmp_path, monkeypatch):
    """make(path=None, **env) -> (scheduler, clock, path): a SAGA scheduler recording
    into `path` (tmp_path/rec.jsonl) with `SAGA_RECORD_<KEY>` set from `env`."""
    made = []

    def make(path=None, prefix_caching=True, session_idle_s=1800.0, **env):
        path = path or tmp_path / "rec.jsonl"
        monkeypatch.setenv("SAGA_RECORD", str(path))
        for key, value in env.items():
            monkeypatch.setenv(f"SAGA_RECORD_{key.upper()}", str(value))
        clock = ManualClock(100.0)
        core = WorkflowCore(CoreConfig(pin=PinConfig(min_tokens=2 * BS), session_idle_s=session_idle_s), clock=clock)
        s = make_scheduler(SagaScheduler, tiny_model, num_blocks=64, block_size=BS, core=core, clock=clock,
                           start_hints=False, prefix_caching=prefix_caching)
        made.append(s)
        return s, clock, path

    yield make
    for s in made:
        s.shutdown()


def run(s, clock) -> list:
    """Steps until idle, DT engine seconds each; the outputs."""
    outs = []
    while s.has_unfinished_requests():
        clock.t += DT
        outs.append(step(s))
    return outs


def call(s, clock, R, prompt, sid, **kw):
    """One request through the engine; (request, outputs)."""
    req = R.make(prompt, session_id=sid, **kw)
    s.add_request(req)
    return req, run(s, clock)


def written(s, path) -> list[dict]:
    assert s.saga.recording.recorder.flush(5)
    return load_trace(path) if path.exists() and path.read_text() else []


def test_a_hinted_session_is_recorded_as_the_engine_served_it(engine):
    s, clock, path = engine()
    R = Requests(BS)
    sink = s.saga.sink
    sink.accept(SessionStart("A", clock(), tenant="acme", workflow="swe"))
    first = tokens(100, 64)
    r1, outs1 = call(s, clock, R, first, "A", max_tokens=4)
    answered = clock()
    clock.t += 0.5
    sink.accept(ToolCallStart("A", clock(), "pytest", call_id="c1", category="test"))  # told after the answer
    clock.t += 2.0
    sink.accept(ToolCallEnd("A", clock(), "pytest", call_id="c1"))
    clock.t += 0.5                                        # the agent reads the result
    second = list(r1.all_token_ids) + tokens(900, 30)     # the history continues the answer
    r2, outs2 = call(s, clock, R, second, "A", max_tokens=3)
    sink.accept(SessionEnd("A", clock()))
    [task] = written(s, path)

    assert (task["task_id"], task["tenant"], task["run"], task["source"]) == ("A", "acme", "swe", "saga serve")
    assert task["model"] == s.vllm_config.model_config.served_model_name
    assert (task["end_reason"], task["truncated"]) == ("completed", False) and "incomplete" not in task
    steps = task["steps"]
    assert [(st["prompt_tokens"], st["output_tokens"]) for st in steps] == [(64, 4), (98, 3)]
    assert [st["reused_prefix_tokens"] for st in steps] == [0, 68]  # prompt + answer, token for token
    assert [st["provider_cached_tokens"] for st in steps] == \
        [hit_tokens(outs1, r1.request_id), hit_tokens(outs2, r2.request_id)] == [0, 64]
    # (to within the real microseconds between making each request and adding it)
    assert [st["llm_latency_s"] for st in steps] == [pytest.approx(len(outs1) * DT, abs=1e-3),
                                                     pytest.approx(len(outs2) * DT, abs=1e-3)]
    # the gap from the answer to the next request, not the hints' own 2 s
    assert steps[0]["tools"] == [{"name": "pytest", "category": "test", "duration_s": pytest.approx(3.0, abs=1e-3)}]
    assert steps[1]["tools"] == [] and task["duration_s"] == pytest.approx(clock() - (answered - len(outs1) * DT),
                                                                            abs=1e-3)
    assert all(set(st) <= STEP_KEYS for st in steps)
    text = path.read_text()
    assert "100,101,102" not in text and "[100" not in text  # no token ids, let alone text


def test_a_call_starts_when_the_api_server_took_it_in_not_when_the_engine_loop_saw_it(engine):
    s, clock, path = engine()
    R = Requests(BS)
    s.saga.sink.accept(SessionStart("W", clock()))
    first, _ = call(s, clock, R, tokens(100, 40), "W", max_tokens=2)
    clock.t += 3.0  # 3 s until the engine loop sees the next request: it had waited 2 s for a prefill step
    req = R.make(list(first.all_token_ids) + tokens(900, 20), session_id="W", max_tokens=2)
    req.arrival_time = time.time() - 2.0
    s.add_request(req)
    outs = run(s, clock)
    s.saga.sink.accept(SessionEnd("W", clock()))
    [task] = written(s, path)
    first_step, second = task["steps"]
    assert first_step["idle_s"] == pytest.approx(1.0, abs=0.05)  # the agent's own time
    assert second["llm_latency_s"] == pytest.approx(2.0 + len(outs) * DT, abs=0.05)  # the wait is the call's


def test_tool_names_can_be_hashed(engine):
    s, clock, path = engine(hash_tools=1)
    R = Requests(BS)
    s.saga.sink.accept(SessionStart("H", clock()))
    call(s, clock, R, tokens(100, 40), "H", max_tokens=2)
    s.saga.sink.accept(ToolCallStart("H", clock(), "get_user_details", call_id="c"))
    s.saga.sink.accept(ToolCallEnd("H", clock(), "get_user_details", call_id="c"))
    s.saga.sink.accept(SessionEnd("H", clock()))
    [task] = written(s, path)
    [tool] = task["steps"][0]["tools"]
    assert tool["name"].startswith("tool-") and tool["category"] == guess_category("get_user_details")
    assert "get_user" not in path.read_text()


def test_a_session_without_hints_is_recorded_from_its_requests_and_flushed_when_idle(engine):
    s, clock, path = engine(idle_s=0.5)
    R = Requests(BS)
    extra = {"tenant": "team-b"}
    r1, _ = call(s, clock, R, tokens(100, 48), "N", max_tokens=2, extra_args=extra)
    clock.t += 0.2                                        # a user's turn, no tool
    rewritten = tokens(100, 48) + tokens(700, 20)         # the answer was not kept: only the prompt is reused
    aborted = R.make(rewritten, session_id="N", extra_args=extra)
    s.add_request(aborted)
    s.finish_requests(aborted.request_id, RequestStatus.FINISHED_ABORTED)  # the client went away
    call(s, clock, R, rewritten, "N", max_tokens=2, extra_args=extra)
    assert written(s, path) == []                         # still open
    clock.t += 1.0
    for _ in range(25):                                   # the writer's next quiet tick ends it
        time.sleep(0.2)
        if tasks := written(s, path):
            break
    [task] = tasks
    assert (task["tenant"], task["end_reason"], task["truncated"]) == ("team-b", "recorder_idle", True)
    assert task["failed_calls"] == 1 and "incomplete" not in task
    steps = task["steps"]
    assert [st["reused_prefix_tokens"] for st in steps] == [0, 48]
    assert steps[0]["idle_s"] == pytest.approx(0.2, abs=1e-3) and steps[0]["tools"] == []


def test_a_session_the_engine_forgets_without_an_end_is_written_then(engine):
    s, clock, path = engine(session_idle_s=60.0, idle_s=3600)  # the recorder alone would wait an hour
    R = Requests(BS)
    s.saga.sink.accept(SessionStart("gone", clock(), tenant="t"))
    call(s, clock, R, tokens(100, 40), "gone", max_tokens=2)
    call(s, clock, R, tokens(300, 40), "stays", max_tokens=2)
    clock.t += 30.0
    call(s, clock, R, tokens(300, 40) + [7, 7] + tokens(500, 8), "stays", max_tokens=2)
    clock.t += 31.0  # "gone" is idle past the core's 60 s; "stays" is not
    step(s)  # the engine loop forgets it
    [task] = written(s, path)
    assert (task["task_id"], task["end_reason"], task["truncated"]) == ("gone", "expired", True)
    assert len(task["steps"]) == 1


def test_without_prefix_caching_reuse_is_still_counted_on_the_tokens(engine):
    s, clock, path = engine(prefix_caching=False)
    R = Requests(BS)
    R.hasher = None  # as vLLM without prefix caching: requests carry no block hashes
    r1, _ = call(s, clock, R, tokens(100, 64), "P", max_tokens=4)
    call(s, clock, R, list(r1.all_token_ids) + tokens(900, 30), "P", max_tokens=2)
    assert r1.block_hashes == []
    s.shutdown()
    [task] = load_trace(path)
    assert [(st["reused_prefix_tokens"], st["provider_cached_tokens"]) for st in task["steps"]] == [(0, 0), (68, 0)]


def test_hints_that_arrive_after_the_request_they_belong_with_change_nothing(engine):
    """Hints travel apart from requests: the session's start after its first
    request, a tool's start after the request that follows it."""
    s, clock, path = engine()
    R = Requests(BS)
    r1, _ = call(s, clock, R, tokens(100, 40), "L", max_tokens=2)
    s.saga.sink.accept(SessionStart("L", clock(), tenant="late", workflow="wf"))
    clock.t += 1.0
    s.add_request(R.make(list(r1.all_token_ids) + tokens(600, 10), session_id="L", max_tokens=2))
    s.saga.sink.accept(ToolCallStart("L", clock(), "grep"))  # its start, late; no call id
    s.saga.sink.accept(ToolCallEnd("L", clock(), "grep"))    # its end, known by the tool's name
    run(s, clock)
    s.saga.sink.accept(SessionEnd("L", clock()))
    [task] = written(s, path)
    assert (task["tenant"], task["run"], task["end_reason"]) == ("late", "wf", "completed")
    assert "incomplete" not in task and len(task["steps"]) == 2
    assert task["steps"][0]["tools"] == [{"name": "grep", "category": "search", "duration_s": pytest.approx(1.0, abs=1e-3)}]


def test_requests_without_a_session_are_not_recorded_and_close_writes_the_open_ones(engine):
    s, clock, path = engine()
    R = Requests(BS)
    call(s, clock, R, tokens(100, 40), None, max_tokens=2)
    call(s, clock, R, tokens(300, 40), "open", max_tokens=2)
    recorder = s.saga.recording.recorder
    assert recorder.flush(5) and recorder.stats().open_sessions == 1
    s.shutdown()                                          # the engine stops: open sessions are written
    [task] = load_trace(path)
    assert (task["task_id"], task["end_reason"], task["truncated"]) == ("open", "closed", True)
    assert recorder.stats().tasks == 1


def test_the_environment_reaches_the_recorder_and_a_bad_one_leaves_the_engine_serving(engine, tiny_model, tmp_path,
                                                                                      monkeypatch, caplog):
    s, _, path = engine(max_bytes=4096, hash_tools="yes", idle_s=7)
    c = s.saga.recording.recorder.config
    assert (c.path, c.max_bytes, c.hash_tools, c.idle_s) == (str(path), 4096, True, 7.0)
    monkeypatch.delenv("SAGA_RECORD_MAX_BYTES")
    monkeypatch.delenv("SAGA_RECORD_IDLE_S")
    assert engine()[0].saga.recording.recorder.config.idle_s == CoreConfig().session_idle_s  # the core's TTL
    for key, value in (("SAGA_RECORD", str(tmp_path / "no" / "dir.jsonl")), ("SAGA_RECORD_MAX_BYTES", "lots")):
        monkeypatch.setenv(key, value)
        with caplog.at_level(logging.ERROR, logger="vllm.saga"):
            s = make_scheduler(SagaScheduler, tiny_model, num_blocks=16, block_size=BS, start_hints=False)
        assert s.saga.recording is None and "not recording" in caplog.text
        serves(s)
        caplog.clear()
        monkeypatch.setenv("SAGA_RECORD", str(path))


def test_a_writer_that_cannot_write_never_fails_a_request(engine):
    s, _, _ = engine(path="/dev/full")  # every write fails: no space left on device
    serves(s, sid="full")
    s.saga.sink.accept(SessionEnd("full", 0.0))
    assert s.saga.recording.recorder.flush(5)
    stats = s.saga.recording.recorder.stats()
    assert (stats.write_errors, stats.tasks) == (1, 0)


def serves(s, sid: str = "x") -> None:
    """A session's request is served, and SAGA saw no error."""
    R = Requests(BS)
    req = R.make(tokens(100, 40), session_id=sid, max_tokens=2)
    s.add_request(req)
    while s.has_unfinished_requests():
        step(s)
    assert req.is_finished() and s.saga.counters.total("plugin_errors") == 0


def test_a_subagent_that_named_its_parent_is_recorded_under_it(engine):
    s, clock, path = engine()
    R = Requests(BS)
    call(s, clock, R, tokens(100, 40), "lead", max_tokens=2)
    call(s, clock, R, tokens(100, 32) + tokens(900, 16), "lead:kid", max_tokens=2,
         extra_args={"parent_session_id": "lead", "session_final": "true"})
    [task] = written(s, path)  # its last request ended it at once
    assert (task["task_id"], task["parent_session_id"], task["parent_step"]) == ("lead:kid", "lead", 0)
