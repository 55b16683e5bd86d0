"""`ReplicaReport`: the typed replica -> router report, across Ray's dict edge."""

from __future__ import annotations

import math

import grpc
import pytest

from saga_sdk import SagaUnavailable
from saga_server.core import EngineStats, SessionStart, ToolCallStart, WorkflowCore
from saga_server.engines.vllm.intake import EngineHintSink
from saga_server.router.report import ReplicaReport, read_report
from saga_server.rpc import HintServer

FULL = ReplicaReport("10.0.0.2:5000", sessions=frozenset({"a", "b"}), in_tool=frozenset({"b"}), kv_usage=0.25,
                     served={"acme": 300.0, "": 5.0}, kv_tokens={"a": 4096, "b": 512})


@pytest.mark.parametrize("report", [FULL, ReplicaReport(), ReplicaReport.unreadable("h:1", "deadline exceeded")])
def test_a_report_survives_the_round_trip_through_a_plain_dict(report):
    raw = report.to_dict()
    assert all(isinstance(v, (str, float, list, dict)) for v in raw.values())  # what Ray pickles
    assert ReplicaReport.from_dict(raw) == report


def test_an_older_replicas_report_is_read_and_its_extra_fields_ignored():
    old = {"hint_addr": "h:1", "sessions": ["a"], "in_tool": [], "kv_usage": 0.5, "held_sessions": 1.0,
           "pinned_blocks": 4.0, "served": {"acme": 10}}
    assert ReplicaReport.from_dict(old) == ReplicaReport("h:1", frozenset({"a"}), frozenset(), 0.5, {"acme": 10.0})


@pytest.mark.parametrize("raw", [None, "saga", [], {}, {"hint_addr": "h:1"}, {"hint_addr": "h:1", "sessions": "a"},
                                 {"hint_addr": "h:1", "error": "engine starting", "sessions": ["a"]}])
def test_a_report_without_a_session_list_or_with_an_error_is_unreadable(raw):
    report = ReplicaReport.from_dict(raw)
    assert not report.readable and report.sessions == frozenset()
    assert report.hint_addr == (raw.get("hint_addr", "") if isinstance(raw, dict) else "")


def test_garbage_fields_take_their_defaults():
    report = ReplicaReport.from_dict({"hint_addr": 7, "sessions": ["a", 3, None, ""], "in_tool": "a",
                                      "kv_usage": math.nan, "served": {"ok": 2, "neg": -1, "inf": math.inf,
                                                                       "flag": True, 9: 1.0, "text": "5"}})
    assert report == ReplicaReport("", frozenset({"a"}), frozenset(), 0.0, {"ok": 2.0})
    sizes = ReplicaReport.from_dict({"sessions": ["a", "b"], "kv_tokens": {"a": 64, "b": -1, "gone": 9, "c": "x"}})
    assert sizes.kv_tokens == {"a": 64}  # malformed sizes and sessions it does not hold are dropped
    assert ReplicaReport.from_dict({"sessions": [], "kv_usage": "0.5", "served": [1]}).kv_usage == 0.0


def test_read_report_lists_only_the_sessions_whose_kv_the_engine_holds():
    core = WorkflowCore()
    held = {"served": 3, "tool": 2}
    sink = EngineHintSink(core, engine_stats=lambda: EngineStats(kv_blocks=200, held_blocks=50),
                          held_blocks=lambda sid: held.get(sid, 0), block_tokens=16)
    now = core._clock()
    for sid in ("served", "tool", "heard-of", "moved"):
        core.accept(SessionStart(sid, now, tenant="acme"))
    for sid in ("served", "tool", "moved"):
        core.on_request_arrival(sid, 100)
    core.accept(ToolCallStart("tool", now, tool="pytest", call_id="c1"))
    sink.release_session("moved")
    core.record_service("acme", 70)
    with HintServer(sink, "127.0.0.1:0") as server:
        report = read_report(server.endpoint)
    assert report == ReplicaReport(server.endpoint, frozenset({"served", "tool"}), frozenset({"tool"}), 0.25,
                                   {"acme": 70.0}, kv_tokens={"served": 48, "tool": 32})


def test_read_report_fails_on_a_service_that_holds_no_kv(registry, hint_server):
    with pytest.raises(SagaUnavailable, match=grpc.StatusCode.UNIMPLEMENTED.name):
        read_report(hint_server.endpoint)
