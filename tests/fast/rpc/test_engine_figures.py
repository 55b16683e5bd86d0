"""GetStats' typed engine figures (`ServerStats.engine`) from an engine's hint sink,
over real gRPC: every field arrives, the sink's own drop count joins them, and a
failing engine read leaves them out without failing the call."""

from __future__ import annotations

from saga_sdk import HintReader
from saga_server.core import AdmissionStats, EngineStats, SessionStart, ToolCallStart, WorkflowCore
from saga_server.engines.vllm.intake import EngineHintSink
from saga_server.rpc import HintServer


def server_stats(sink):
    with HintServer(sink, "127.0.0.1:0") as server, HintReader(server.endpoint) as reader:
        return reader.server_stats()


def test_every_engine_figure_arrives_in_its_typed_field():
    figures = EngineStats(held_sessions=3, held_blocks=12, pinned_blocks=8, kv_blocks=47,
                          admission=AdmissionStats(active=2, parked=1, waiting=4, limit_tokens=331.2, wait_s=2.5),
                          counts={"pins": {"created": 2.0}, "plugin_seconds": {"finish": 0.125},
                                  "kv_pulled_tokens": {"": 96.0}},
                          tables={"live_requests": 2})
    engine = server_stats(EngineHintSink(WorkflowCore(), engine_stats=lambda: figures)).engine
    assert (engine.held_sessions, engine.held_blocks, engine.pinned_blocks, engine.kv_blocks) == (3, 12, 8, 47)
    adm = engine.admission
    assert (adm.active, adm.parked, adm.waiting, adm.limit_tokens, adm.wait_s) == (2, 1, 4, 331.2, 2.5)
    assert {name: dict(c.by_label) for name, c in engine.counts.items()} == {
        "pins": {"created": 2.0}, "plugin_seconds": {"finish": 0.125}, "kv_pulled_tokens": {"": 96.0}}
    assert dict(engine.tables) == {"live_requests": 2}


def test_admission_off_leaves_its_message_unset():
    reply = server_stats(EngineHintSink(WorkflowCore(), engine_stats=lambda: EngineStats(kv_blocks=47)))
    assert reply.HasField("engine") and not reply.engine.HasField("admission")


def test_the_hints_the_sinks_full_queue_dropped_are_reported_by_the_sink():
    core = WorkflowCore()
    sink = EngineHintSink(core, max_queue=1)  # nobody drains it here
    core.accept(SessionStart("s", core._clock()))
    for i in range(3):
        sink.accept(ToolCallStart("s", core._clock(), tool="bash", call_id=f"c{i}"))
    assert server_stats(sink).engine.hints_dropped == 2


def test_a_failing_engine_read_leaves_the_figures_out_and_the_rest_answers():
    def broken() -> EngineStats:
        raise RuntimeError("engine state torn down")

    reply = server_stats(EngineHintSink(WorkflowCore(), engine_stats=broken))
    assert not reply.HasField("engine")
    assert "hints_batches" in reply.stats and "sessions_live" in reply.stats


def test_a_service_that_is_no_engines_reports_no_engine_figures(registry):
    assert not server_stats(registry).HasField("engine")
