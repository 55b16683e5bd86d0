"""The recorder's file and thread: crash-safe lines, rotation, a queue that never blocks,
errors that are counted and never raised."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from saga_server.bench.workload import load_trace
from saga_server.record import JsonlSink, RecordConfig, Recorder, TraceBuilder, tool_hasher


def one_task(builder: TraceBuilder, t: float, sid: str) -> None:
    """A feed: each item is a session id, recorded as a finished one-step task."""
    builder.session_start(sid, t, workflow="wf")
    builder.llm_start(sid, t, step=1)
    builder.llm_end(sid, t + 0.5, step=1, prompt_tokens=100, output_tokens=10)
    builder.session_end(sid, t + 0.5, reason="submit")


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the file -------------------------------------------------------------------------------

def test_rotation_moves_the_file_aside_and_keeps_every_line(tmp_path):
    path = tmp_path / "rec.jsonl"
    sink = JsonlSink(path, max_bytes=50)
    for i in range(5):
        sink.write(json.dumps({"n": i, "pad": "x" * 10}))  # 30 bytes a line: one per file after the first
    sink.close()
    parts = [path.with_name(f"rec.{k}.jsonl") for k in range(1, 5)]
    assert all(p.exists() for p in parts) and sink.rotations == 4
    assert [json.loads(p.read_text())["n"] for p in parts + [path]] == [0, 1, 2, 3, 4]
    assert all(p.stat().st_size <= 50 for p in parts + [path])


def test_a_line_a_crash_cut_short_is_skipped_by_the_loader_and_dropped_on_reopen(tmp_path):
    path = tmp_path / "rec.jsonl"
    b = TraceBuilder()
    one_task(b, 0, "whole")
    whole = json.dumps(b.take()[0])
    path.write_text(whole + "\n" + whole[:40])          # the writer died mid-line
    assert [t["task_id"] for t in load_trace(path)] == ["whole"]
    sink = JsonlSink(path)
    sink.write(whole.replace('"whole"', '"next"'))
    sink.close()
    assert [t["task_id"] for t in load_trace(path)] == ["whole", "next"]
    (tmp_path / "bad.jsonl").write_text(whole[:40] + "\n" + whole + "\n")
    with pytest.raises(ValueError):                      # a bad line elsewhere is still an error
        load_trace(tmp_path / "bad.jsonl")


def test_an_unwritable_path_fails_at_once(tmp_path):
    with pytest.raises(OSError):
        Recorder(RecordConfig(str(tmp_path / "no" / "such" / "dir.jsonl")), one_task)


# -- the thread -------------------------------------------------------------------------------

def test_submitted_sessions_are_written_off_the_callers_thread(tmp_path):
    path = tmp_path / "rec.jsonl"
    threads = []

    def feed(builder, t, sid):
        threads.append(threading.current_thread().name)
        one_task(builder, t, sid)

    rec = Recorder(RecordConfig(str(path)), feed)
    assert all(rec.submit(f"s{i}") for i in range(3))
    assert rec.flush(5)
    assert [t["task_id"] for t in lines(path)] == ["s0", "s1", "s2"]
    assert set(threads) == {"saga-recorder"}
    rec.close()
    assert rec.stats().tasks == 3 and rec.submit("late") is False


def test_a_full_queue_drops_and_counts_without_blocking(tmp_path):
    path = tmp_path / "rec.jsonl"
    gate, stalled = threading.Event(), threading.Event()

    def feed(builder, t, item):
        kind, sid = item
        if kind == "stall":
            stalled.set()
            gate.wait(10)
        elif kind == "open":
            builder.session_start(sid, t, workflow="wf")
            builder.llm_start(sid, t, step=1)
            builder.llm_end(sid, t, step=1, prompt_tokens=5, output_tokens=1)
        elif kind == "end":
            builder.session_end(sid, t, reason="submit")
        else:
            one_task(builder, t, sid)

    rec = Recorder(RecordConfig(str(path), queue_size=2), feed)
    assert rec.submit(("stall", "")) and stalled.wait(5)  # the writer is busy from now on
    started = time.perf_counter()
    results = [rec.submit(("open", "spans")), rec.submit(("task", "whole"))]
    results += [rec.submit(("task", f"s{i}")) for i in range(50)]
    assert time.perf_counter() - started < 0.5            # never waits for the writer
    assert results[:2] == [True, True] and results.count(False) == 50
    assert rec.stats().dropped == 50
    gate.set()
    assert rec.flush(5)
    rec.submit(("end", "spans"))                          # its session was open while facts were lost
    rec.close()
    written = {t["task_id"]: t for t in lines(path)}
    assert set(written) == {"spans", "whole"}
    assert written["spans"]["incomplete"] is True and "incomplete" not in written["whole"]


def test_a_broken_file_is_counted_and_logged_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "saga_server.record")
    rec = Recorder(RecordConfig("/dev/full"), one_task)  # every write fails: no space left
    for i in range(3):
        assert rec.submit(f"s{i}")
    assert rec.flush(5)
    assert rec.stats().write_errors == 3 and rec.stats().tasks == 0
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
    rec.close()


def test_a_feed_that_raises_is_counted_and_the_thread_carries_on(tmp_path):
    path = tmp_path / "rec.jsonl"

    def feed(builder, t, sid):
        if sid == "bad":
            raise RuntimeError("unreadable batch")
        one_task(builder, t, sid)

    rec = Recorder(RecordConfig(str(path)), feed)
    for sid in ("a", "bad", "b"):
        rec.submit(sid)
    rec.close()
    assert [t["task_id"] for t in lines(path)] == ["a", "b"]
    assert rec.stats().feed_errors == 1


def test_close_writes_open_sessions_as_closed(tmp_path):
    path = tmp_path / "rec.jsonl"

    def opens(builder, t, sid):
        builder.session_start(sid, t, workflow="wf")
        builder.llm_start(sid, t, step=1)
        builder.llm_end(sid, t + 1, step=1, prompt_tokens=5, output_tokens=1)

    rec = Recorder(RecordConfig(str(path)), opens)
    rec.submit("open")
    assert rec.flush(5) and not path.read_text()
    rec.close()
    [task] = lines(path)
    assert (task["end_reason"], task["truncated"]) == ("closed", True)


def test_tool_hashes_are_stable_per_key_and_differ_across_keys():
    same, other = tool_hasher(b"k1"), tool_hasher(b"k2")
    assert same("bash") == tool_hasher(b"k1")("bash") != same("pytest")
    assert same("bash") != other("bash") and "bash" not in same("bash")
