"""`SessionKvPolicy`: each fact about a session's requests and tools, and what it does
to the session's KV (the rules every engine runs), on a counting pool."""

from __future__ import annotations

import math

from saga_server.core import (CoreConfig, LlmCallEnd, LlmCallStart, ManualClock, SessionEnd, SessionStart,
                              ToolCallStart, WorkflowCore)
from saga_server.core.admission import SessionAdmission
from saga_server.core.sessions import Departure
from saga_server.core.holds import PINNED, PROTECTED, SOFT, HoldLedger
from saga_server.core.host_tier import HostTierOrder
from saga_server.core.kv_policy import SessionKvPolicy, WorkflowRules
from saga_server.core.pinning import PinConfig
from tests.support.pools import Pool, blocks

BT = 16


def policy(*, pins: bool = True, admission: bool = False, capacity: int = 64, idle_s: float = 1800.0):
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(session_idle_s=idle_s, pin=PinConfig(min_tokens=0)), clock=clock)
    ledger = HoldLedger(Pool(capacity), capacity)
    adm = (lambda parkable: SessionAdmission(core, capacity * BT, return_s=lambda tokens: 0.0,
                                             parkable=parkable)) if admission else None
    kv = SessionKvPolicy(ledger, WorkflowRules(core, pins=pins), block_tokens=BT, core=core, admission=adm)
    return kv, core, clock


def run_request(kv, core, clock, sid: str, n_blocks: int, rid: str = "r") -> None:
    """A request of `sid` arrives, is scheduled with nothing held, finishes with n_blocks cached."""
    core.on_request_arrival(sid, n_blocks * BT)
    if not kv.arrived(sid, rid, n_blocks * BT + 1, clock()):
        assert sid in kv.plan().admit  # a new session: admitted by the next plan
    kv.scheduled(sid, 0, 0)
    core.on_request_finished(sid, n_blocks * BT, 1)
    kv.finished(sid, rid, blocks(sid, n_blocks), clock())


def test_a_finished_request_is_held_and_a_queued_one_protects_it_latest_arrival_first():
    kv, core, clock = policy(pins=False)
    for sid in ("a", "b"):
        core.accept(SessionStart(sid, clock()))
        run_request(kv, core, clock, sid, 4)
    assert kv.ledger.get("a").tier == SOFT and kv.ledger.blocks_of("a") == 4
    clock.t += 1.0
    kv.arrived("a", "r2", 100, clock())  # a queued first ...
    clock.t += 1.0
    kv.arrived("b", "r2", 100, clock())  # ... b after it: b's KV is used last, so it goes first
    assert kv.ledger.get("a").tier == kv.ledger.get("b").tier == PROTECTED
    released = kv.make_room(kv.ledger.pool.num_free() + 4)
    assert [r.session_id for r in released] == ["b"]
    kv.scheduled("a", 64, 64)  # a's request runs on its blocks: the hold goes back
    assert "a" not in kv.ledger


def test_a_tool_start_pins_and_a_later_decision_against_a_pin_unpins_it():
    kv, core, clock = policy()
    core.accept(SessionStart("a", clock()))
    run_request(kv, core, clock, "a", 8)
    core.accept(ToolCallStart("a", clock(), "pytest", call_id="1", expected_duration_s=60.0))
    kv.tool_started("a", clock())
    hold = kv.ledger.get("a")
    assert hold.tier == PINNED and hold.expires_at > clock()
    kv.rules.pins = False  # the rules now say no pin (e.g. memory is short): the latest decision wins
    kv.tool_started("a", clock())
    assert kv.ledger.get("a").tier == SOFT


def test_a_subagents_start_decides_its_parents_pin_again_as_a_tool_call_would():
    kv, core, clock = policy()
    for n in range(10):  # "lead" sessions end after one call: a lone lead's KV is not worth a pin
        core.accept(SessionStart(f"l{n}", clock(), workflow="lead"))
        core.accept(LlmCallStart(f"l{n}", clock()))
        clock.t += 1.0
        core.accept(LlmCallEnd(f"l{n}", clock(), prompt_tokens=64, output_tokens=1))
        core.accept(SessionEnd(f"l{n}", clock()))
    core.accept(SessionStart("lead", clock(), workflow="lead"))
    core.accept(LlmCallStart("lead", clock()))
    run_request(kv, core, clock, "lead", 8)
    core.accept(LlmCallEnd("lead", clock(), prompt_tokens=8 * BT, output_tokens=1))
    kv.tick(clock())
    assert kv.ledger.get("lead").tier == SOFT
    core.accept(SessionStart("kid", clock(), parent_id="lead"))  # it waits on the kid now
    kv.tick(clock())
    hold = kv.ledger.get("lead")
    assert hold.tier == PINNED and hold.expires_at > clock()
    core.accept(SessionEnd("kid", clock()))
    kv.tick(clock())  # re-keyed as after a tool; the pin's TTL still runs
    assert kv.ledger.get("lead").tier == PINNED


def test_an_expired_pin_turns_soft():
    kv, core, clock = policy()
    core.accept(SessionStart("a", clock()))
    run_request(kv, core, clock, "a", 8)
    core.accept(ToolCallStart("a", clock(), "ls", call_id="1", expected_duration_s=2.0))
    kv.tool_started("a", clock())
    assert kv.ledger.get("a").tier == PINNED
    clock.t += 400.0  # past any TTL (capped at 300 s)
    assert kv.expire_pins(clock()) == ["a"] and kv.ledger.get("a").tier == SOFT


def test_kv_that_comes_back_to_a_pinned_session_joins_its_pin_for_the_ttl_left():
    kv, core, clock = policy()
    core.accept(SessionStart("a", clock()))
    run_request(kv, core, clock, "a", 8)
    core.accept(ToolCallStart("a", clock(), "ls", call_id="1", expected_duration_s=2.0))
    kv.tool_started("a", clock())
    expires = kv.ledger.get("a").expires_at
    kv.ledger.truncate("a", 2, "pressure")  # memory ran short: the pin kept its head
    clock.t += 1.0
    kv.loaded("a", clock(), blocks=blocks("a", 8))  # a prefetch brought the rest back
    hold = kv.ledger.get("a")
    assert hold.tier == PINNED and len(hold.blocks) == 8 and hold.expires_at == expires


def test_a_parked_session_goes_first_and_an_admitted_one_is_protected():
    kv, core, clock = policy(pins=False, admission=True, capacity=40)  # limit 0.9 x 640 tokens
    for sid in ("idle", "new"):
        core.accept(SessionStart(sid, clock()))
    run_request(kv, core, clock, "idle", 30)
    core.accept(ToolCallStart("idle", clock(), "build", call_id="1", expected_duration_s=600.0))
    kv.tool_started("idle", clock())
    assert not kv.arrived("new", "n1", 400, clock())  # does not fit beside idle's working set
    plan = kv.plan()
    assert plan.park == ("idle",) and plan.admit == ("new",)
    assert kv.ledger.get("idle").key == -math.inf and kv.ledger.get("idle").tier == SOFT
    assert kv.may_run("new") and kv.may_run(None) and not kv.may_run("idle")


def test_an_end_expiry_or_eviction_published_by_the_core_forgets_the_session_on_the_engine_loop():
    kv, core, clock = policy(admission=True, idle_s=50.0)
    gone = []
    kv.on_forget(lambda sid, how: gone.append((sid, how)))
    for sid in ("ends", "quiet"):
        core.accept(SessionStart(sid, clock()))
        run_request(kv, core, clock, sid, 4)
    core.accept(SessionEnd("ends", clock()))
    assert "ends" in kv.ledger  # queued for the engine loop, not acted on from the hint thread
    kv.tick(clock())
    assert "ends" not in kv.ledger and kv.admission.state("ends") is None and gone == [("ends", Departure.ENDED)]
    clock.t += 51.0
    kv.tick(clock())  # "quiet" never ended: it idled out of the core, and out of every table
    assert gone[-1] == ("quiet", Departure.EXPIRED) and kv.table_sizes() == {"holds": 0, "requests": 0, "queued": 0,
                                                                      "admission": 0}


def test_a_move_releases_and_forgets_admission_but_keeps_the_workflow():
    kv, core, clock = policy(admission=True)
    core.accept(SessionStart("a", clock()))
    run_request(kv, core, clock, "a", 4)
    kv.moved("a")
    assert "a" not in kv.ledger and kv.admission.state("a") is None and core.session("a") is not None


def test_the_host_tier_order_is_lowest_key_first_each_entry_tail_first_and_plans_without_changing():
    order = HostTierOrder()
    order.put("far", 1.0)
    order.put("near", 9.0)
    order.put("chunk-tail", 1.0, tiebreak=-3)  # of equal keys, the higher position goes first
    sizes = {"far": 4, "near": 4, "chunk-tail": 1}
    assert order.victims(6, sizes.__getitem__) == [("chunk-tail", 1), ("far", 4), ("near", 1)]
    assert order.victims(2, sizes.__getitem__) == [("chunk-tail", 1), ("far", 1)]  # nothing changed
    order.put("far", 10.0)  # used again: re-keyed
    order.remove("chunk-tail")
    assert order.victims(2, sizes.__getitem__) == [("near", 2)]


def test_a_request_that_reuses_less_than_the_hold_releases_the_garbage_past_it_at_once():
    # A compacted context restarts from a short prefix: the rest of the session's KV
    # can never be used again, so it leaves the pool as the request arrives, not once
    # it is scheduled (under load a queued request can wait long, its KV protected).
    kv, core, clock = policy(pins=False)
    core.accept(SessionStart("a", clock()))
    run_request(kv, core, clock, "a", 10)
    free = kv.ledger.pool.num_free()
    clock.t += 1.0
    kv.arrived("a", "r2", 100 * BT, clock(), reusable_tokens=3 * BT + 5)
    assert kv.ledger.blocks_of("a") == 3 and kv.ledger.get("a").tier == PROTECTED
    assert kv.ledger.pool.num_free() == free + 7


def test_an_engine_that_keeps_garbage_leaves_the_hold_whole():
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(), clock=clock)
    kv = SessionKvPolicy(HoldLedger(Pool(64), 64), WorkflowRules(core, pins=False), block_tokens=BT, core=core,
                         release_garbage=False)
    core.accept(SessionStart("a", clock()))
    run_request(kv, core, clock, "a", 10)
    kv.arrived("a", "r2", 100 * BT, clock(), reusable_tokens=3 * BT)
    assert kv.ledger.blocks_of("a") == 10
    kv.arrived("a", "r3", 100 * BT, clock(), reusable_tokens=None)  # unknown: nothing released either
    assert kv.ledger.blocks_of("a") == 10


def test_the_host_tier_keeps_a_queued_admitted_sessions_copy_last_and_not_a_gated_ones():
    kv, core, clock = policy(pins=False, admission=True, capacity=16)
    for sid in ("idle", "queued"):
        core.accept(SessionStart(sid, clock()))
        run_request(kv, core, clock, sid, 4)
    idle_key = kv.key_of("idle", 64, clock())
    assert math.isfinite(idle_key) and math.isfinite(kv.key_of("queued", 64, clock()))
    clock.t += 1.0
    core.on_request_arrival("queued", 100)
    assert kv.arrived("queued", "r2", 100, clock())  # admitted: it waits for the engine only
    assert kv.key_of("queued", 64, clock()) == math.inf  # its copy is about to be loaded
    order = HostTierOrder()
    for sid in ("queued", "idle"):
        order.put(sid, kv.key_of(sid, 64, clock()))
    assert [sid for sid, _ in order.victims(4, lambda sid: 4)] == ["idle"]
    kv.scheduled("queued", 64, 64)
    assert math.isfinite(kv.key_of("queued", 64, clock()))  # running: back to the rules' key
    # a session held at the admission gate (too big while another runs) is not about to
    # be loaded: no protection
    core.accept(SessionStart("big", clock()))
    core.on_request_arrival("big", 10_000)
    assert not kv.arrived("big", "r1", 10_000, clock())
    assert "big" not in kv.plan().admit
    assert math.isfinite(kv.key_of("big", 0, clock()))
