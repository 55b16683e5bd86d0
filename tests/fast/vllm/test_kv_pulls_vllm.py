"""Tokens a request pulled from another engine over NIXL are counted as pulled, not
as prefix hits: vLLM's real `Scheduler` with SAGA's `NixlConnector` (scheduler side;
no transfer runs, the worker's report is synthetic), and the `LoadLog` it keeps.

The scheduler runs in a child process: NIXL's native libraries, which the connector
module loads, crash grpc_tools' protoc when both live in one process (test_proto)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from saga_proto import hints_pb2 as pb
from saga_server.core import ManualClock
from saga_server.engines.vllm.loads import LoadLog
from saga_server.status import render

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


def test_a_pull_is_heard_once_it_ends_and_taken_once_when_scheduled():
    clock, heard = ManualClock(10.0), []
    log = LoadLog(clock)
    log.listener = lambda ok, tokens, seconds: heard.append((ok, tokens, seconds))
    log.started("a", 992)
    log.started("b", 480)
    clock.t = 10.5
    log.finished({"a", "b"}, failed={"b"})
    assert sorted(heard) == [(False, 480, 0.5), (True, 992, 0.5)]
    assert log.take("a") == 992 and log.take("a") == 0  # asked once, when scheduled
    assert log.take("b") == 0  # failed: vLLM recomputes it, nothing was pulled


def test_a_report_for_a_request_that_pulled_nothing_is_ignored():
    log, heard = LoadLog(ManualClock()), []
    log.listener = lambda *a: heard.append(a)
    log.finished({"never-started"}, failed=())
    assert heard == [] and log.take("never-started") == 0


def test_ended_pulls_nobody_takes_are_forgotten_oldest_first():
    log = LoadLog(ManualClock())
    for i in range(LoadLog.MAX_UNTAKEN + 10):
        log.started(f"r{i}", 32)
        log.finished({f"r{i}"}, failed=())
    assert log.take("r0") == 0 and log.take(f"r{LoadLog.MAX_UNTAKEN + 9}") == 32


def test_saga_status_shows_pulled_tokens_and_failed_pulls():
    counts = {"kv_pulls": {"ok": 3, "failed": 1}, "kv_pulled_tokens": {"": 2976}, "kv_pull_seconds": {"": 0.84},
              "pins": {"created": 2}}
    engine = pb.EngineStats(counts={k: pb.MetricCounts(by_label=v) for k, v in counts.items()})
    out = render({"sessions_live": 1}, [], engine=engine)
    assert "kv pulled in: 3 pulls, 2976 tokens in 0.84 s; 1 failed (recomputed)" in out
    assert "kv_pulled_tokens" not in out and "pins{event}: created 2" in out  # shown once, on its own line


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    if importlib.util.find_spec("nixl") is None:
        pytest.skip("the ray extra installs NIXL (scripts/setup.sh)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server"), str(ROOT)])}
    done = subprocess.run([sys.executable, str(HERE / "nixl_pull_scenario.py"), str(tmp_path_factory.mktemp("pull"))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_pulled_prefix_is_counted_as_pulled_and_not_as_a_prefix_hit(scenario):
    run = scenario["ok"]
    assert run["status_while_pulling"] == "WAITING_FOR_REMOTE_KVS"  # vLLM's load path, not its cache
    assert run["scheduled_computed"] == 99  # the whole prompt arrived; the last token is computed
    assert (run["pulls_ok"], run["pulls_failed"], run["pulled_tokens"]) == (1, 0, 100)
    assert run["hit_tokens"] == 0 and run["prompt_tokens"] == 100
    assert run["counts"]["kv_pulled_tokens"][""] == 100 and run["counts"]["kv_pull_seconds"][""] > 0


def test_a_failed_pull_is_counted_and_recomputed_by_the_same_request(scenario):
    run = scenario["failed"]
    assert run["scheduled_computed"] == 0 and run["finally"] == "RUNNING"  # recomputed, not failed
    assert (run["pulls_ok"], run["pulls_failed"], run["pulled_tokens"]) == (0, 1, 0)
    assert run["hit_tokens"] == 0
