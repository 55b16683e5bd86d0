"""The engine's learnt state (`SAGA_STATE_FILE`, set by `saga serve --state-dir`):
the plugin in vLLM's own `Scheduler` reads it at start and writes it at shutdown."""

from __future__ import annotations

from saga_server.core import LlmCallEnd, LlmCallStart, SessionEnd, SessionStart, ToolCallEnd, ToolCallStart
from saga_server.engines.vllm import SagaScheduler
from saga_server.state_file import STATE_FILE_ENV
from vllm_builders import make_scheduler


def teach(core, clock) -> None:
    t = clock()
    for n in range(10):
        sid = f"s{n}"
        core.accept(SessionStart(sid, t, workflow="coder"))
        core.accept(LlmCallStart(sid, t))
        core.accept(LlmCallEnd(sid, t + 1, prompt_tokens=800, output_tokens=30))
        core.accept(ToolCallStart(sid, t + 1, "pytest", call_id="a"))
        core.accept(ToolCallEnd(sid, t + 9, "pytest", call_id="a"))
        core.accept(LlmCallStart(sid, t + 9))
        core.accept(LlmCallEnd(sid, t + 10, prompt_tokens=1600, output_tokens=30))
        core.accept(SessionEnd(sid, t + 10))


def predicted_after_its_first_call(core, clock) -> float:
    core.accept(SessionStart("new", clock(), workflow="coder"))
    core.accept(LlmCallStart("new", clock()))
    core.accept(LlmCallEnd("new", clock(), prompt_tokens=800, output_tokens=30))
    core.accept(ToolCallStart("new", clock(), "pytest", call_id="b"))
    return core.predict("new").p_continue, core.predict("new").prompt_growth_tokens


def test_the_engine_reads_its_state_at_start_and_writes_it_at_shutdown(tiny_model, tmp_path, monkeypatch):
    path = tmp_path / "engine-8000.json"
    monkeypatch.setenv(STATE_FILE_ENV, str(path))
    first = make_scheduler(SagaScheduler, tiny_model, start_hints=False)
    assert first.saga.state is not None and not first.saga.state.restored
    teach(first.saga.core, first.saga.clock)
    want = predicted_after_its_first_call(first.saga.core, first.saga.clock)
    first.shutdown()
    assert path.exists()
    second = make_scheduler(SagaScheduler, tiny_model, start_hints=False)
    assert second.saga.state.restored
    assert predicted_after_its_first_call(second.saga.core, second.saga.clock) == want
    second.shutdown()
    monkeypatch.delenv(STATE_FILE_ENV)
    cold = make_scheduler(SagaScheduler, tiny_model, start_hints=False)
    assert cold.saga.state is None and predicted_after_its_first_call(cold.saga.core, cold.saga.clock) != want
