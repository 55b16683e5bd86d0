"""Each SAGA mechanism switched off on the engine by its setting (`EngineSettings.off`,
`SAGA_OFF`): the same scenario shows the mechanism's effect with the default settings
and loses it with that one name switched off (vLLM's real scheduler, synthetic
outputs, no model)."""

from __future__ import annotations

import pytest
from test_deadlines_vllm import _one_slot_both_waiting

from saga_server.core import CoreConfig, ManualClock, SessionStart, ToolCallStart, WorkflowCore
from saga_server.core.mechanisms import ENGINE_MECHANISMS, Mechanism
from saga_server.core.pinning import PinConfig
from saga_server.engines.vllm import SagaScheduler
from saga_server.settings import EngineSettings
from vllm_builders import Requests, make_scheduler, run_until_idle, step

BS = 16


def tokens(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


def engine(model, settings: EngineSettings, core_class=WorkflowCore, min_pin_tokens: int = 2 * BS, **kw):
    clock = ManualClock(100.0)
    core = core_class(CoreConfig(pin=PinConfig(min_tokens=min_pin_tokens)), clock=clock)
    return make_scheduler(SagaScheduler, model, core=core, clock=clock, start_hints=False, settings=settings,
                          block_size=BS, **kw)


def pinned_after_its_request(model, settings) -> bool:
    """A session's finished request leaves its prefix pinned (`ttl`)."""
    s = engine(model, settings, num_blocks=32)
    s.saga.core.accept(SessionStart("A", s.saga.clock()))
    s.add_request(Requests(BS).make(tokens(100, 64), session_id="A"))
    run_until_idle(s)
    return s.saga.ledger.get("A").pinned


def keyed_by_the_cores_prediction(model, settings) -> bool:
    """A session's held KV is keyed by the core's WA-LRU key, not by its last use (`walru`)."""

    class Core(WorkflowCore):
        def eviction_priority(self, session_id, kv_tokens, last_access):
            return 3.0

    s = engine(model, settings, core_class=Core, min_pin_tokens=10**9, num_blocks=32)
    s.add_request(Requests(BS).make(tokens(100, 64), session_id="A"))
    run_until_idle(s)
    return s.saga.ledger.get("A").key == 3.0


def a_session_waits_for_admission(model, settings) -> bool:
    """Three sessions of 9 blocks on 23 usable blocks: the third's request is held back
    from vLLM (the queue offers nothing) instead of competing for KV (`admit`)."""
    s = engine(model, settings, min_pin_tokens=10**9, num_blocks=24)
    R = Requests(BS)
    for i, sid in enumerate("ABC"):
        s.saga.core.accept(SessionStart(sid, s.saga.clock()))
        s.add_request(R.make(tokens(1000 * (i + 1), 144), session_id=sid, max_tokens=1))
    step(s)
    return len(s.waiting) == 1 and not s.waiting


def the_tenant_owed_service_goes_first(model, settings) -> bool:
    """One slot; a heavily served tenant's request waits before a light tenant's later
    one: the light one is scheduled first (`afs`)."""
    s = engine(model, settings, num_blocks=64, max_num_seqs=1)
    R = Requests(BS)
    for tenant in ("heavy", "light"):
        s.saga.core.on_request_arrival(f"warm-{tenant}", 1, tenant)
    s.saga.core.record_service("heavy", 100_000)
    s.add_request(R.make(tokens(1, 40), extra_args={"tenant": "heavy"}, session_id="h1"))
    step(s)
    heavy = R.make(tokens(2000, 40), extra_args={"tenant": "heavy"}, session_id="h2")
    light = R.make(tokens(3000, 40), extra_args={"tenant": "light"}, session_id="l1")
    s.add_request(heavy)
    s.add_request(light)
    order = [n.req_id for o in run_until_idle(s) for n in o.scheduled_new_reqs]
    return order.index(light.request_id) < order.index(heavy.request_id)


def a_paused_session_is_prefilled_again_while_idle(model, settings) -> bool:
    """A session reclaimed during its tool is re-prefilled on idle steps (`prefetch`)."""
    s = engine(model, settings, num_blocks=16)
    R, clock = Requests(BS), s.saga.clock
    s.saga.core.accept(SessionStart("A", clock()))
    s.add_request(R.make(tokens(100, 64), session_id="A"))
    run_until_idle(s)
    s.saga.core.accept(ToolCallStart("A", clock(), "bash", call_id="c"))
    s.add_request(R.make(tokens(50000, 14 * BS)))
    run_until_idle(s)
    for _ in range(20):  # idle steps: the core plans a prefetch for A
        clock.t += 0.5
        step(s)
    return s.saga.counters["prefetch", "issued"] == 1


def the_at_risk_request_passes_the_slack_rich_one(model, settings, monkeypatch) -> bool:
    """One slot; fair share ranks a slack-rich request first, yet the at-risk one is
    scheduled first (`shape`). Set through the environment, as `saga serve` does."""
    monkeypatch.setenv("SAGA_OFF", ",".join(sorted(settings.off)))
    s, loose, tight = _one_slot_both_waiting(model)
    return {n.req_id for n in step(s).scheduled_new_reqs} == {tight.request_id}


EFFECTS = {
    Mechanism.TTL: pinned_after_its_request,
    Mechanism.WALRU: keyed_by_the_cores_prediction,
    Mechanism.ADMIT: a_session_waits_for_admission,
    Mechanism.AFS: the_tenant_owed_service_goes_first,
    Mechanism.PREFETCH: a_paused_session_is_prefilled_again_while_idle,
    Mechanism.SHAPE: the_at_risk_request_passes_the_slack_rich_one,
}


def test_every_mechanism_of_an_engine_has_its_effect_checked():
    assert set(EFFECTS) == ENGINE_MECHANISMS


@pytest.mark.parametrize("mechanism", sorted(EFFECTS))
def test_a_mechanism_switched_off_loses_its_effect(tiny_model, mechanism, monkeypatch):
    effect = EFFECTS[mechanism]
    extra = (monkeypatch,) if mechanism == Mechanism.SHAPE else ()
    assert effect(tiny_model, EngineSettings(), *extra)
    assert not effect(tiny_model, EngineSettings(off=frozenset({mechanism})), *extra)
