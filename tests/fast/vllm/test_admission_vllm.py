"""Session admission in vLLM's real `Scheduler`: requests of sessions that are not
admitted wait in the queue unscheduled, parked sessions give way, and nothing
deadlocks (synthetic model outputs, no model)."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from saga_server.core import CoreConfig, ManualClock, SessionEnd, SessionStart, ToolCallStart, WorkflowCore
from saga_server.core.admission import AdmissionState
from saga_server.core.holds import PROTECTED, SOFT
from saga_server.core.pinning import PinConfig
from saga_server.engines.vllm import SagaScheduler
from vllm_builders import Requests, hit_tokens, make_scheduler, run_until_idle, step

BS = 16


def saga(model, **kw):
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(pin=PinConfig(min_tokens=10**9)), clock=clock)  # holds, never pins
    return make_scheduler(SagaScheduler, model, core=core, clock=clock, start_hints=False, **kw)


def tokens(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


def scheduled(out) -> set[str]:
    return {n.req_id for n in out.scheduled_new_reqs}


def test_an_oversubscribed_pool_runs_only_the_sessions_that_fit(tiny_model):
    # 23 usable blocks of 16 (368 tokens; the limit is 90% of that): two sessions of
    # 9 blocks fit, the third waits in the queue without being scheduled.
    s = saga(tiny_model, num_blocks=24, block_size=BS)
    R = Requests(BS)
    reqs = {sid: R.make(tokens(1000 * (i + 1), 144), session_id=sid, max_tokens=1) for i, sid in enumerate("ABC")}
    for sid, req in reqs.items():
        s.saga.core.accept(SessionStart(sid, s.saga.clock()))
        s.add_request(req)
    first = step(s)
    assert scheduled(first) == {reqs["A"].request_id, reqs["B"].request_id}
    assert s.saga.admission.state("C") == AdmissionState.WAITING and len(s.waiting) == 1 and not s.waiting  # held
    outs = run_until_idle(s)
    assert hit_tokens(outs, reqs["C"].request_id) == 0  # it ran, once the engine had nothing else
    assert s.saga.admission.counts.forced >= 1
    admission = s.saga.engine_stats().admission
    assert admission.waiting == 0
    assert admission.active + admission.parked == 3


def test_a_parked_session_resumes_and_hits_what_is_still_resident(tiny_model):
    s = saga(tiny_model, num_blocks=40, block_size=BS)  # 39 blocks; the limit ~562 tokens
    R = Requests(BS)
    clock = s.saga.clock
    hist = tokens(100, 256)  # A: 16 blocks of history, then a long test run
    for sid in ("A", "busy", "B"):
        s.saga.core.accept(SessionStart(sid, clock()))
    s.add_request(R.make(hist, session_id="A"))
    run_until_idle(s)
    s.saga.core.accept(ToolCallStart("A", clock(), "pytest", call_id="t", category="test", expected_duration_s=600))
    s.add_request(R.make(tokens(3000, 48), session_id="busy", max_tokens=40))  # keeps the engine busy
    step(s)
    b = R.make(tokens(5000, 300), session_id="B")  # does not fit beside A: A, idle for long, gives way
    s.add_request(b)
    out = step(s)
    assert s.saga.admission.state("A") == AdmissionState.PARKED and s.saga.admission.state("B") == AdmissionState.ACTIVE
    assert b.request_id in scheduled(out)
    run_until_idle(s)
    held = s.saga.ledger.blocks_of("A") * BS  # B needed a little of A's room: its tail went first
    assert 0 < held < 256
    nxt = R.make(hist + [7, 8, 9], session_id="A")  # A's tool is done: it comes back
    s.add_request(nxt)
    assert held <= hit_tokens(run_until_idle(s), nxt.request_id) < 256  # and what vLLM still cached
    assert s.saga.admission.state("A") == AdmissionState.ACTIVE


def test_one_slot_and_a_pool_for_one_session_still_finish_everything(tiny_model):
    s = saga(tiny_model, num_blocks=14, block_size=BS, max_num_seqs=1)  # 13 blocks: one session at a time
    R = Requests(BS)
    history = {sid: tokens(1000 * (i + 1), 160) for i, sid in enumerate("ABCD")}
    for sid in history:
        s.saga.core.accept(SessionStart(sid, s.saga.clock()))
    for turn in range(2):
        for sid, hist in history.items():
            s.add_request(R.make(hist + tokens(90000 + turn, turn), session_id=sid))
        run_until_idle(s)
    assert not s.waiting.gated and s.saga.counters.total("plugin_errors") == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12), st.sampled_from(["req", "end", "step"])),
                min_size=1, max_size=30))
# s1 ends while its request runs, and its id comes back with a request that does not
# fit: the old request's finish must not count as the new one's
@example(ops=[(0, 1, "req"), (1, 1, "req"), (1, 1, "end"), (3, 8, "req"), (0, 1, "step"), (2, 1, "req"),
              (1, 11, "req")])
def test_any_arrival_sequence_drains_with_nothing_left_waiting(tiny_model, ops):
    """The bound, against the real scheduler: whatever arrives and ends, once nothing
    new comes every waiting request is admitted and served."""
    s = saga(tiny_model, num_blocks=24, block_size=BS)
    R = Requests(BS)
    started = set()
    for sid_n, blocks, op in ops:
        sid = f"s{sid_n}"
        if op == "end" and sid in started:
            s.saga.sink.accept(SessionEnd(sid, s.saga.clock()))
            started.discard(sid)
        elif op == "req":
            if sid not in started:
                s.saga.core.accept(SessionStart(sid, s.saga.clock()))
                started.add(sid)
            s.add_request(R.make(tokens(1000 * sid_n, blocks * BS), session_id=sid, max_tokens=2))
        else:
            step(s)
    run_until_idle(s, max_steps=2000)
    assert not s.waiting.gated and not s.has_unfinished_requests()
    assert s.saga.counters.total("plugin_errors") == 0
    assert all(state in (AdmissionState.ACTIVE, AdmissionState.PARKED)
               for state in (s.saga.admission.state(x) for x in started) if state is not None)


def test_a_parked_session_s_next_request_at_the_gate_leaves_its_kv_first_to_go(tiny_model):
    # A queued request protects its session's KV, but not while admission holds it back:
    # a parked session's KV stays first in line until the session is admitted again.
    s = saga(tiny_model, num_blocks=40, block_size=BS)
    R = Requests(BS)
    clock = s.saga.clock
    hist = tokens(100, 256)
    for sid in ("A", "busy", "B"):
        s.saga.core.accept(SessionStart(sid, clock()))
    s.add_request(R.make(hist, session_id="A"))
    run_until_idle(s)
    s.saga.core.accept(ToolCallStart("A", clock(), "pytest", call_id="t", category="test", expected_duration_s=600))
    s.add_request(R.make(tokens(3000, 48), session_id="busy", max_tokens=40))
    step(s)
    s.add_request(R.make(tokens(5000, 300), session_id="B", max_tokens=20))
    step(s)
    assert s.saga.admission.state("A") == AdmissionState.PARKED
    nxt = R.make(hist + [7, 8, 9], session_id="A")  # back while B still needs the room
    s.add_request(nxt)
    step(s)
    assert s.saga.admission.state("A") != AdmissionState.ACTIVE and s.waiting.gated  # held back, unscheduled
    assert s.saga.ledger.get("A").tier == SOFT  # not protected while it waits at the gate
    run_until_idle(s)
    assert s.saga.admission.state("A") == AdmissionState.ACTIVE and not s.waiting.gated  # admitted, served in the end


def test_a_session_admitted_while_its_request_waits_for_a_slot_has_its_kv_protected(tiny_model):
    s = saga(tiny_model, num_blocks=40, block_size=BS, max_num_seqs=1)
    R = Requests(BS)
    clock = s.saga.clock
    hist = tokens(100, 256)
    for sid in ("A", "B"):
        s.saga.core.accept(SessionStart(sid, clock()))
    s.add_request(R.make(hist, session_id="A"))
    run_until_idle(s)
    s.saga.core.accept(ToolCallStart("A", clock(), "pytest", call_id="t", category="test", expected_duration_s=600))
    s.add_request(R.make(tokens(5000, 352), session_id="B", max_tokens=20))  # A does not fit beside it
    step(s)
    assert s.saga.admission.state("A") == AdmissionState.PARKED
    s.add_request(R.make(tokens(7000, 16), max_tokens=50))  # a request without a session, ahead of A's
    nxt = R.make(hist + [7, 8, 9], session_id="A")
    s.add_request(nxt)
    admitted_waiting = []  # A's hold's tier on steps where A is admitted but its request not yet run
    for _ in range(300):
        out = step(s)
        if nxt.request_id in scheduled(out):
            break
        if s.saga.admission.state("A") == AdmissionState.ACTIVE:
            admitted_waiting.append(s.saga.ledger.get("A").tier)
    assert admitted_waiting and set(admitted_waiting) == {PROTECTED}


def test_an_osl_hint_counts_for_the_kv_need_instead_of_max_tokens(tiny_model):
    # 23 usable blocks (limit ~331 tokens). Two sessions of 96-token prompts with
    # max_tokens 150 need 246 each: only one fits. Saying they write 8 (Dynamo's
    # `osl`) makes the need 104 each: both run at once.
    def first_step(extra):
        s = saga(tiny_model, num_blocks=24, block_size=BS)
        R = Requests(BS)
        reqs = [R.make(tokens(1000 * (i + 1), 96), session_id=sid, max_tokens=150, extra_args=extra)
                for i, sid in enumerate("AB")]
        for req in reqs:
            s.saga.core.accept(SessionStart(req.session_id, s.saga.clock()))
            s.add_request(req)
        return len(scheduled(step(s)))

    assert first_step(None) == 1
    assert first_step({"osl": 8}) == 2
    assert first_step({"osl": 10_000}) == 1  # never above max_tokens' need
