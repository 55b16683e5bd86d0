"""Deadline-aware shaping in vLLM's real `Scheduler` (`core.deadlines`): a slack-rich
session's request waits while an at-risk one runs, and a step that decodes an
at-risk request runs only a block of anyone else's prefill (synthetic model outputs,
no model). With the core's prior (9 more steps of 5 s), a 20 s deadline is at risk
and a 10,000 s one is slack-rich."""

from __future__ import annotations

import math

from saga_server.core import CoreConfig, ManualClock, SessionStart, WorkflowCore
from saga_server.core.deadlines import DRAIN_FACTOR
from saga_server.engines.vllm import SagaScheduler
from vllm_builders import Requests, make_scheduler, run_until_idle, step

BS = 16


def saga(model, **kw):
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(), clock=clock)
    s = make_scheduler(SagaScheduler, model, core=core, clock=clock, start_hints=False, num_blocks=200,
                       block_size=BS, **kw)
    for sid, deadline in (("tight", 20.0), ("loose", 10_000.0), ("plain", None)):
        core.accept(SessionStart(sid, clock(), tenant=sid, deadline_s=deadline))
    return s


def tokens(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


def new_ids(out) -> set[str]:
    return {n.req_id for n in out.scheduled_new_reqs}


def _ranked_behind(s) -> None:
    """The slack-rich session's tenant is owed service, the at-risk one's is not: fair
    share ranks the slack-rich request first (owed 100k tokens outweighs the capped
    urgency), so only the hold lets the at-risk request pass."""
    s.saga.core.record_service("tight", 200_000, "tight")
    s.saga.core.record_service("loose", 0, "loose")


def _one_slot_both_waiting(model):
    """One batch slot; the slack-rich request, ranked first by fair share, then the
    at-risk one, both waiting."""
    s = saga(model, max_num_seqs=1)
    R = Requests(BS)
    _ranked_behind(s)
    loose = R.make(tokens(1000, 64), session_id="loose", max_tokens=4)
    tight = R.make(tokens(5000, 64), session_id="tight", max_tokens=6)
    s.add_request(loose)
    s.add_request(tight)
    return s, loose, tight


def test_a_slack_rich_request_gives_way_to_a_waiting_at_risk_one(tiny_model):
    s, loose, tight = _one_slot_both_waiting(tiny_model)
    assert new_ids(step(s)) == {tight.request_id}
    rest = run_until_idle(s)
    assert loose.request_id in set().union(*(new_ids(o) for o in rest))
    assert s.saga.counters["deadline", "held"] > 0


def test_without_shaping_fair_share_order_decides(tiny_model, monkeypatch):
    monkeypatch.setenv("SAGA_OFF", "shape")
    s, loose, _ = _one_slot_both_waiting(tiny_model)
    assert new_ids(step(s)) == {loose.request_id}


def test_an_at_risk_decode_gets_steps_with_a_block_of_other_prefill(tiny_model):
    s = saga(tiny_model, max_batched=256)
    R = Requests(BS)
    tight = R.make(tokens(5000, 32), session_id="tight", max_tokens=12)
    s.add_request(tight)
    step(s)  # its prefill, at the full budget
    plain = R.make(tokens(9000, 1000), session_id="plain", max_tokens=1)  # no deadline: never held
    s.add_request(plain)
    out = step(s)
    assert out.num_scheduled_tokens[tight.request_id] == 1
    assert out.num_scheduled_tokens[plain.request_id] == BS  # thin: one block beside the decode
    run_until_idle(s)
    assert s.saga.counters["deadline", "thin_step"] >= 5
    later = R.make(tokens(20_000, 1000), session_id="plain", max_tokens=1)
    s.add_request(later)
    assert step(s).num_scheduled_tokens[later.request_id] == 256  # nobody at risk: the whole budget


def test_the_thin_step_keeps_up_with_the_prefill_arriving(tiny_model):
    """Half-second decode steps, and a 2,500-token prompt scheduled: the thin budget is
    the larger of a block and twice the prefill arriving per step with no prefill
    (`core.deadlines`)."""
    s = saga(tiny_model, max_batched=256)
    clock = s.saga.clock
    R = Requests(BS)
    tight = R.make(tokens(5000, 32), session_id="tight", max_tokens=40)
    s.add_request(tight)
    step(s)  # its prefill
    for _ in range(2):  # two decodes alone, half a second each
        clock.t += 0.5
        step(s)
    plain = R.make(tokens(9000, 2500), session_id="plain", max_tokens=1)
    s.add_request(plain)
    clock.t += 0.5
    assert step(s).num_scheduled_tokens[plain.request_id] == BS  # its prefill not counted yet: one block
    clock.t += 0.5
    # prefill arrived: tight's 32 tokens 1.5 s before plain's 2,500; the rate's window is 30 s
    rate = (32 * math.exp(-1.5 / 30.0) + 2500) / 30.0
    floor = math.ceil(DRAIN_FACTOR * rate * 0.5)
    assert step(s).num_scheduled_tokens[plain.request_id] == floor > BS


def test_a_step_that_ran_a_prefill_chunk_is_not_a_decode_steps_time(tiny_model):
    """Every step prefills and takes half a second; none has run without prefill, so
    the thin steps beside the at-risk decode stay one block, not twice the prefill
    arriving per half second (85 tokens here)."""
    s = saga(tiny_model, max_batched=256)
    R = Requests(BS)
    tight = R.make(tokens(5000, 32), session_id="tight", max_tokens=40)
    plain = R.make(tokens(9000, 2500), session_id="plain", max_tokens=1)
    s.add_request(tight)
    s.add_request(plain)
    step(s)  # the at-risk prefill first in line: the whole budget, both prompts in it
    for _ in range(3):
        s.saga.clock.t += 0.5
        assert step(s).num_scheduled_tokens[plain.request_id] == BS


def test_a_slack_rich_request_offered_before_anyone_was_at_risk_is_taken_back(tiny_model):
    s = saga(tiny_model, max_batched=64)
    R = Requests(BS)
    plain = R.make(tokens(9000, 250), session_id="plain", max_tokens=1)  # its prefill takes every budget
    s.add_request(plain)
    step(s)
    loose = R.make(tokens(1000, 32), session_id="loose", max_tokens=4)
    s.add_request(loose)
    step(s)  # loose is offered to vLLM now, but the budget went to plain's prefill
    assert loose in list(s.waiting)
    tight = R.make(tokens(5000, 32), session_id="tight", max_tokens=6)
    s.add_request(tight)
    started = [new_ids(o) for o in run_until_idle(s)]
    first = {rid: next(i for i, ids in enumerate(started) if rid in ids) for rid in (tight.request_id,
                                                                                    loose.request_id)}
    assert first[loose.request_id] > first[tight.request_id]  # not beside it while it waited
