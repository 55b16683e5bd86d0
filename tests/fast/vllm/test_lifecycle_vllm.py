"""One session lifecycle in vLLM's real `Scheduler`: sessions that never send an end
are forgotten by every per-session table of the engine process once the core lets
them go (its table's cap, then its idle expiry), and their KV goes first."""

from __future__ import annotations

import os

from saga_server.core import CoreConfig, ManualClock, SessionEnd, SessionPhase, SessionStart, WorkflowCore
from saga_server.engines.vllm import SagaScheduler
from vllm_builders import Requests, make_scheduler, run_until_idle, step

BS = 16


def engine_tables(plugin) -> dict[str, int]:
    """Every per-session (or per-request) table the plugin's process keeps."""
    pf = plugin.prefetcher
    return {
        "core sessions": len(plugin.core.table),
        **{f"engine {k}": v for k, v in plugin.engine.table_sizes().items()},
        "offload request map": len(plugin._request_sessions),
        "prefetch tokens": len(pf._known),
        "prefetch ready": len(pf._ready),
        "prefetch in flight": len(pf._in_flight),
    }


def test_sessions_that_never_end_are_forgotten_everywhere_past_the_cap_and_the_idle_time(tiny_model):
    clock = ManualClock(0.0)
    cap, idle_s = 1_000, 600.0
    core = WorkflowCore(CoreConfig(max_sessions=cap, session_idle_s=idle_s), clock=clock)
    s = make_scheduler(SagaScheduler, tiny_model, num_blocks=64, block_size=BS, max_num_seqs=64,
                       core=core, clock=clock, start_hints=False)
    plugin = s.saga
    R = Requests(BS)
    n, batch = int(os.environ.get("SAGA_LIFECYCLE_SESSIONS", 100_000)), 64  # ~40 s here
    for first in range(0, n, batch):
        for i in range(first, min(n, first + batch)):
            s.add_request(R.make([1 + i % 900, 2, 3, 4] * 8, session_id=f"plain-{i}"))  # 2 blocks each
        run_until_idle(s)
        clock.t += 0.001
    tables = engine_tables(plugin)
    assert tables["core sessions"] <= cap and tables["engine admission"] <= cap
    assert tables["engine holds"] <= cap and tables["engine live_requests"] == 0
    clock.t += idle_s + 1  # nobody ended any of them; now they are idle past the core's time
    step(s)
    after = engine_tables(plugin)
    assert after == dict.fromkeys(after, 0), after
    assert plugin.ledger.held_blocks == 0 and s.kv_cache_manager.block_pool.get_num_free_blocks() == 63
    counts = plugin.counters.counts
    assert counts["forgotten", "evicted"] == n - cap and counts["forgotten", "expired"] == cap  # both ways out
    print(f"tables after {n:,} sessions:", tables, "after the idle time:", after,
          {k: v for k, v in counts.items() if k[0] in ("released", "forgotten")})


def test_a_session_the_core_forgets_leaves_its_kv_first_and_an_end_hint_forgets_it_at_once(tiny_model):
    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(session_idle_s=100.0), clock=clock)
    s = make_scheduler(SagaScheduler, tiny_model, num_blocks=24, block_size=BS, core=core, clock=clock,
                       start_hints=False)
    plugin = s.saga
    R = Requests(BS)
    for sid in ("quiet", "ends"):
        core.accept(SessionStart(sid, clock()))
        s.add_request(R.make([7, 8] * 32, session_id=sid))  # 4 blocks each
    step(s)
    step(s)
    assert plugin.ledger.blocks_of("quiet") == 4 and plugin.ledger.blocks_of("ends") == 4
    core.accept(SessionEnd("ends", clock()))  # published by the core's table, acted on at the next step
    assert plugin.ledger.blocks_of("ends") == 4
    step(s)
    assert "ends" not in plugin.ledger and plugin.admission.state("ends") is None
    clock.t += 101.0  # "quiet" never ends: its idle time passes
    step(s)
    assert "quiet" not in plugin.ledger and plugin.admission.state("quiet") is None
    assert len(core.table) == 1  # only the ended record, kept for late readers


def saga_engine(tiny_model, num_blocks: int):
    """vLLM's scheduler with SAGA over a fresh core on a manual clock: (scheduler, core)."""
    clock = ManualClock(0.0)
    core = WorkflowCore(clock=clock)
    return make_scheduler(SagaScheduler, tiny_model, num_blocks=num_blocks, block_size=BS, core=core,
                          clock=clock, start_hints=False), core


def test_a_request_marked_final_ends_its_session_when_it_finishes_and_nothing_of_it_stays_held(tiny_model):
    s, core = saga_engine(tiny_model, num_blocks=24)
    plugin = s.saga
    R = Requests(BS)
    s.add_request(R.make([7, 8] * 32, session_id="lead"))
    run_until_idle(s)
    assert plugin.ledger.blocks_of("lead") == 4  # an engine-only session: held for its next call
    s.add_request(R.make([5, 6] * 32, session_id="lead:kid", extra_args={"parent_session_id": "lead"}))
    run_until_idle(s)
    assert core.session("lead:kid").parent_id == "lead" and core.session("lead").live_children == 1
    s.add_request(R.make([5, 6] * 32 + [9] * 16, session_id="lead:kid",
                         extra_args={"parent_session_id": "lead", "session_final": True}))
    run_until_idle(s)
    assert core.session("lead:kid").state == SessionPhase.ENDED and core.session("lead").live_children == 0
    assert plugin.ledger.blocks_of("lead:kid") == 0 and plugin.admission.state("lead:kid") is None
    assert plugin.ledger.blocks_of("lead") == 4  # the parent goes on


def test_a_clients_cache_ttl_pins_the_sessions_kv_for_as_long_as_it_asked(tiny_model):
    s, core = saga_engine(tiny_model, num_blocks=128)
    plugin = s.saga
    R = Requests(BS)
    prompt = [3, 4] * 160  # 20 blocks: worth keeping
    s.add_request(R.make(prompt, session_id="plain"))
    s.add_request(R.make(prompt[::-1], session_id="asked", extra_args={"cache_ttl_s": "3600"}))
    run_until_idle(s)
    asked, plain = plugin.ledger.get("asked"), plugin.ledger.get("plain")
    # Past SAGA's own longest pin (`PinConfig.max_ttl_s`); shortened as every pin is under pressure.
    longest_learnt = core.config.pin.max_ttl_s
    assert asked.pinned and asked.reason == "client_ttl" and asked.expires_at > 5 * longest_learnt
    assert plain.reason != "client_ttl" and not (plain.pinned and plain.expires_at > longest_learnt)
