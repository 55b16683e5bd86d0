"""GetStats' typed engine figures (`ServerStats.engine`) from vLLM's real `Scheduler`
with SAGA, read over the real hint service and shown by `saga status` (synthetic
model outputs, no model)."""

from __future__ import annotations

import pytest

from saga_sdk import HintReader
from saga_server import cli
from saga_server.core import CoreConfig, ManualClock, SessionStart, TenantLimits, WorkflowCore
from saga_server.core.pinning import PinConfig
from saga_server.engines.vllm import SagaScheduler
from saga_server.rpc import HintServer
from vllm_builders import Requests, make_scheduler, run_until_idle, step

BS = 16


def saga(model, min_pin_tokens: int, **kw):
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(pin=PinConfig(min_tokens=min_pin_tokens)), clock=clock)
    return make_scheduler(SagaScheduler, model, core=core, clock=clock, start_hints=False, block_size=BS, **kw)


def tokens(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


def engine_figures(s):
    """`ServerStats.engine` as a client reads it from this scheduler's hint service."""
    with HintServer(s.saga.sink, "127.0.0.1:0", clock=s.saga.clock) as server:
        with HintReader(server.endpoint) as reader:
            reply = reader.server_stats()
    assert reply.HasField("engine")
    assert not any(k.startswith("engine_") for k in reply.stats)  # the figures are typed, not keyed
    return reply.engine


def test_held_and_pinned_blocks_and_counted_pins_reach_get_stats(tiny_model):
    # Three sessions of 4 blocks each; tenant a may pin 6 blocks, so its second
    # session is held soft: 12 blocks held for 3 sessions, 8 of them pinned.
    s = saga(tiny_model, 2 * BS, num_blocks=48,
             tenant_limits=lambda tenant: TenantLimits(max_pinned_blocks=6 if tenant == "a" else None))
    R = Requests(BS)
    for i, (sid, tenant) in enumerate([("A1", "a"), ("A2", "a"), ("B1", "b")]):
        s.saga.core.accept(SessionStart(sid, s.saga.clock(), tenant=tenant))
        s.add_request(R.make(tokens(1000 * (i + 1), 64), session_id=sid))
        run_until_idle(s)
    engine = engine_figures(s)
    assert (engine.held_sessions, engine.held_blocks, engine.pinned_blocks, engine.kv_blocks) == (3, 12, 8, 47)
    assert engine.hints_dropped == 0
    pins = engine.counts["pins"].by_label
    assert pins["created"] == 2 and pins["over_tenant_cap"] == 1
    assert (engine.admission.active, engine.admission.parked, engine.admission.waiting) == (3, 0, 0)


def test_admission_states_reach_get_stats_and_saga_status(tiny_model, capsys):
    # 23 usable blocks of 16 (the limit is 90% of 368 tokens): sessions of 9 blocks,
    # two fit, the third waits; once it runs, one of the first two is parked.
    s = saga(tiny_model, 10**9, num_blocks=24)  # holds, never pins
    R = Requests(BS)
    for i, sid in enumerate("ABC"):
        s.saga.core.accept(SessionStart(sid, s.saga.clock()))
        s.add_request(R.make(tokens(1000 * (i + 1), 144), session_id=sid, max_tokens=1))
    step(s)
    engine = engine_figures(s)
    adm = engine.admission
    assert (adm.active, adm.parked, adm.waiting, adm.wait_s) == (2, 0, 1, 0.0)
    assert adm.limit_tokens == pytest.approx(0.9 * 23 * BS)
    assert (engine.held_sessions, engine.held_blocks, engine.pinned_blocks) == (2, 18, 0)

    while s.has_unfinished_requests():
        s.saga.clock.t += 1.0  # C waits one second for admission
        step(s)
    adm = engine_figures(s).admission
    assert (adm.active, adm.parked, adm.waiting, adm.wait_s) == (2, 1, 0, 1.0)

    with HintServer(s.saga.sink, "127.0.0.1:0", clock=s.saga.clock) as server:
        assert cli.main(["status", "--hints", server.endpoint]) == 0
    out = capsys.readouterr().out
    assert "admission: 2 active, 1 parked, 0 waiting sessions; limit 331 tokens, 1 s waited in all" in out
    assert "engine: 3 sessions hold 22 of 23 KV blocks (0 pinned); 0 hints dropped" in out
