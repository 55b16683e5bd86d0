"""Agent Fair Share: the documented bound, and task deadlines on synthetic tenants."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_server.core import (
    FairShare,
    FairShareConfig,
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core import CoreConfig
from saga_server.core.fairshare import seniority, urgency

# A tiny single-server agent-task simulator: one server runs LLM steps one at a
# time (non-preemptive); between a task's steps a tool runs off the server. The
# waiting queue is ordered by FCFS (request ready time) or by the core's
# `request_rank` (as the engine does; ties: FCFS). The real WorkflowCore sees
# every step as hints.


@dataclass(frozen=True)
class Task:
    sid: str
    tenant: str
    arrive: float
    steps: int
    service_s: float  # server time per LLM step
    tool_s: float  # tool time between steps
    deadline_s: float | None  # relative to arrival
    tokens: int = 1000  # service recorded per step


def simulate(tasks: list[Task], policy: str, core: WorkflowCore, clock: ManualClock) -> dict[str, float]:
    """Runs the tasks; returns sid -> completion time (absolute)."""
    by_id = {t.sid: t for t in tasks}
    done_steps = {t.sid: 0 for t in tasks}
    events: list[tuple[float, int, str, str]] = []
    seq = 0
    for t in tasks:
        seq += 1
        heapq.heappush(events, (t.arrive, seq, "arrive", t.sid))
    waiting: list[tuple[float, int, str]] = []  # (ready time, seq, sid)
    busy_until = None
    finished: dict[str, float] = {}
    while events:
        now, _, kind, sid = heapq.heappop(events)
        clock.t = max(clock.t, now)
        task = by_id[sid]
        if kind == "arrive":
            core.accept(SessionStart(sid, now, tenant=task.tenant, workflow=task.tenant,
                                     deadline_s=task.deadline_s))
            seq += 1
            waiting.append((now, seq, sid))
        elif kind == "ready":
            core.accept(ToolCallEnd(sid, now, "tool", call_id=str(done_steps[sid])))
            seq += 1
            waiting.append((now, seq, sid))
        elif kind == "done":
            busy_until = None
            done_steps[sid] += 1
            core.accept(LlmCallEnd(sid, now, prompt_tokens=task.tokens, output_tokens=10))
            core.record_service(task.tenant, task.tokens, sid)
            if done_steps[sid] >= task.steps:
                core.accept(SessionEnd(sid, now))
                finished[sid] = now
            else:
                core.accept(ToolCallStart(sid, now, "tool", call_id=str(done_steps[sid]), category="run"))
                seq += 1
                heapq.heappush(events, (now + task.tool_s, seq, "ready", sid))
        if busy_until is None and waiting and (not events or events[0][0] > now):
            if policy == "fcfs":
                pick = min(waiting)
            else:
                pick = min(waiting, key=lambda w: (core.request_rank(w[2], "", w[0]), w[0], w[1]))
            waiting.remove(pick)
            psid = pick[2]
            core.accept(LlmCallStart(psid, now, step=done_steps[psid]))
            busy_until = now + by_id[psid].service_s
            seq += 1
            heapq.heappush(events, (busy_until, seq, "done", psid))
    return finished


def _warm(core: WorkflowCore, clock: ManualClock, kinds: list[tuple[str, int]]) -> None:
    """Completed tasks of each kind first, so the AEG knows their length."""
    warm = [Task(f"warm-{tenant}-{i}", tenant, clock.t, steps, 1.0, 1.0, 1e4)
            for tenant, steps in kinds for i in range(2)]
    simulate(warm, "fcfs", core, clock)


def _deadline_scenario(start: float) -> list[Task]:
    # Heavy: six 30-step tasks at once, deadlines staggered (feasible one after
    # another). Light: a 3-step task every 20 s with a 15 s deadline.
    heavy = [Task(f"h{i}", "heavy", start, 30, 1.0, 1.0, deadline_s=45.0 * (i + 1) + 20) for i in range(6)]
    light = [Task(f"l{j}", "light", start + 5.0 + 20 * j, 3, 1.0, 1.0, deadline_s=15.0) for j in range(12)]
    return heavy + light


def _misses(policy: str) -> dict[str, int]:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    _warm(core, clock, [("heavy", 30), ("light", 3)])
    tasks = _deadline_scenario(clock.t + 10.0)
    finished = simulate(tasks, policy, core, clock)
    assert set(finished) == {t.sid for t in tasks}
    miss = {"heavy": 0, "light": 0}
    for t in tasks:
        miss[t.tenant] += finished[t.sid] > t.arrive + t.deadline_s
    return miss


def test_both_tenants_meet_deadlines_that_fcfs_misses() -> None:
    fcfs = _misses("fcfs")
    afs = _misses("afs")
    assert fcfs["heavy"] > 0 and fcfs["light"] > 0  # the scenario is hard for FCFS
    assert afs == {"heavy": 0, "light": 0}


def test_light_tenant_gets_its_share_without_deadlines() -> None:
    """No deadlines: only the virtual queues act. A light tenant's short tasks,
    behind a heavy tenant's eight long ones, finish far sooner than under FCFS,
    and the heavy tenant loses at most the light tenant's own work."""
    results = {}
    for policy in ("fcfs", "afs"):
        clock = ManualClock()
        core = WorkflowCore(clock=clock)
        heavy = [Task(f"h{i}", "heavy", 0.0, 40, 1.0, 1.0, deadline_s=None) for i in range(8)]
        light = [Task(f"l{j}", "light", 10.0 + 30 * j, 4, 1.0, 1.0, deadline_s=None) for j in range(6)]
        fin = simulate(heavy + light, policy, core, clock)
        light_ct = sum(fin[t.sid] - t.arrive for t in light) / len(light)
        heavy_last = max(fin[t.sid] for t in heavy)
        results[policy] = (light_ct, heavy_last)
    assert results["afs"][0] < 0.6 * results["fcfs"][0]
    assert results["afs"][1] <= results["fcfs"][1] + 6 * 4 * 1.0


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 4),
    rounds=st.lists(
        st.tuples(st.lists(st.floats(0, 20, allow_nan=False), min_size=4, max_size=4), st.integers(1, 4000)),
        min_size=1, max_size=200),
)
def test_owed_service_gap_stays_within_documented_bound(n, rounds) -> None:
    cfg = FairShareConfig(v=1.0, queue_scale_tokens=1000.0, urgency_cap=5.0, active_window_s=1e9)
    fs = FairShare(cfg)
    tenants = [f"t{i}" for i in range(n)]
    largest = 0
    for t in tenants:
        fs.touch(t, 0.0)
    for k, (urgencies, tokens) in enumerate(rounds):
        scores = {t: fs.score(t, urgencies[i]) for i, t in enumerate(tenants)}
        served = max(tenants, key=lambda t: (scores[t], t))
        fs.record_service(served, tokens, float(k))
        largest = max(largest, tokens)
        owed = [fs.owed(t) for t in tenants]
        bound = cfg.queue_scale_tokens * cfg.v * cfg.urgency_cap + largest
        assert max(owed) - min(owed) <= bound + 1e-6
        assert min(owed) >= 0.0


def test_served_tenant_owes_less_and_idle_tenants_bank_nothing() -> None:
    fs = FairShare(FairShareConfig(active_window_s=10.0))
    fs.touch("a", 0.0)
    fs.touch("b", 0.0)
    fs.record_service("a", 1000, 1.0)
    assert fs.owed("b") == pytest.approx(500.0) and fs.owed("a") == 0.0
    assert fs.priority("b", 0.0, 2.0) < fs.priority("a", 0.0, 2.0)  # b is owed: goes first
    fs.touch("a", 30.0)
    fs.record_service("a", 1000, 30.0)  # b went idle 28 s ago: it neither accrues nor is kept
    assert fs.owed("b") == 0.0 and "b" not in fs.active(30.0)


def test_urgency_rule() -> None:
    assert urgency(10.0, None, 0.0, 5.0) == 0.0
    assert urgency(10.0, 20.0, 0.0, 5.0) == pytest.approx(0.5)
    assert urgency(10.0, 1.0, 2.0, 5.0) == 0.0  # late: serving it first can no longer bring it in time
    assert urgency(10.0, 2.0, 1.9, 5.0) == 5.0  # about to be late: capped
    assert urgency(100.0, 20.0, 0.0, 5.0) == 5.0


def test_bad_config_and_input_rejected() -> None:
    with pytest.raises(ValueError):
        FairShareConfig(queue_scale_tokens=0)
    with pytest.raises(ValueError):
        FairShareConfig(weights=(("a", 0.0),))
    with pytest.raises(ValueError):
        FairShare().record_service("a", -1, 0.0)


def test_weights_split_owed_service() -> None:
    fs = FairShare(FairShareConfig(weights=(("gold", 3.0),)))
    fs.touch("gold", 0.0)
    fs.touch("free", 0.0)
    fs.record_service("other", 0, 0.0)
    fs.record_service("other", 4000, 0.0)  # a third tenant took all service
    assert fs.owed("gold") == pytest.approx(3 * fs.owed("free"))


def test_task_seniority_finishes_equal_tasks_in_order_instead_of_all_at_the_end() -> None:
    """One tenant, eight equal 10-step tasks started a second apart. Request-level
    FCFS (window 0) interleaves them, so all finish near the end; by seniority they
    finish one after another: mean completion falls, the last one not at all later."""
    results = {}
    for window in (0.0, 900.0):
        clock = ManualClock()
        core = WorkflowCore(CoreConfig(fairshare=FairShareConfig(seniority_window_s=window)), clock=clock)
        tasks = [Task(f"t{i}", "swe", float(i), 10, 1.0, 0.5, deadline_s=None) for i in range(8)]
        fin = simulate(tasks, "afs", core, clock)
        results[window] = ([fin[t.sid] - t.arrive for t in tasks], max(fin.values()))
    (fcfs_ct, fcfs_end), (senior_ct, senior_end) = results[0.0], results[900.0]
    assert sum(senior_ct) < 0.7 * sum(fcfs_ct)
    assert senior_end <= fcfs_end + 1e-9  # same work, no idle server: nobody pays for it
    assert senior_ct[0] == min(senior_ct)  # the first task started is the first done


def test_seniority_rank_within_a_tenant_and_fair_share_across_tenants() -> None:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    core.accept(SessionStart("old", 0.0, tenant="a"))
    clock.t = 50.0
    core.accept(SessionStart("young", 50.0, tenant="a"))
    clock.t = 60.0
    # young asked first, but old is the senior task of the same tenant
    assert core.request_rank("old", "a", 60.0) < core.request_rank("young", "a", 55.0)
    # a request without a known session is a task that started when it arrived
    assert core.request_rank("", "a", 40.0)[1] == 40.0
    assert core.request_rank("old", "a", 60.0) < core.request_rank("", "a", 40.0)
    # across tenants the fair share decides first: tenant a has been served a lot
    core.accept(SessionStart("b1", 59.0, tenant="b"))
    core.record_service("a", 50_000)
    assert core.request_rank("b1", "b", 60.0) < core.request_rank("old", "a", 60.0)
    # an ended session's next request is a new task
    core.accept(SessionEnd("old", 60.0))
    assert core.request_rank("old", "a", 61.0)[1] == 61.0


@settings(max_examples=200, deadline=None)
@given(started=st.one_of(st.none(), st.floats(-1e6, 1e6)), t1=st.floats(-1e6, 1e6),
       gap=st.floats(0, 1e6), window=st.floats(0, 1e5), started2=st.one_of(st.none(), st.floats(-1e6, 1e6)))
def test_seniority_lets_a_request_be_overtaken_only_within_the_window(started, t1, gap, window, started2) -> None:
    """The documented bound: a request arriving more than `window` after another
    never ranks before it, whatever either task's start."""
    first = seniority(started, t1, window)
    assert first <= t1  # never behind its own arrival
    t2 = t1 + window + gap + 1e-3
    if t2 - window > t1:  # representable as floats
        assert seniority(started2, t2, window) > first
    assert seniority(started, t1, 0.0) == t1  # window 0: request-level FCFS


def test_by_default_a_long_task_keeps_its_seniority_however_long_it_runs() -> None:
    """The default has no window: a task that began 10 minutes before another still
    ranks first when its next request comes 28 minutes in (a 15-minute window would
    rank it as if it began 15 minutes before that request: behind the younger)."""
    for window, long_first in ((None, True), (900.0, False)):
        clock = ManualClock()
        config = CoreConfig() if window is None else CoreConfig(fairshare=FairShareConfig(seniority_window_s=window))
        core = WorkflowCore(config, clock=clock)
        core.accept(SessionStart("long", 0.0, tenant="a"))
        clock.t = 600.0
        core.accept(SessionStart("young", 600.0, tenant="a"))
        clock.t = 1700.0
        assert (core.request_rank("long", "a", 1700.0) < core.request_rank("young", "a", 620.0)) is long_first


@settings(max_examples=200, deadline=None)
@given(started=st.floats(-1e6, 1e6), later=st.floats(1e-3, 1e6), t1=st.floats(-1e6, 1e6), t2=st.floats(-1e6, 1e6))
def test_without_a_window_tasks_rank_in_the_order_they_began(started, later, t1, t2) -> None:
    """FCFS over tasks: whenever their requests arrive, a request of a task that began
    later never ranks before one of a task that began earlier."""
    window = FairShareConfig().seniority_window_s
    assert seniority(started, max(t1, started), window) < seniority(started + later, max(t2, started + later), window)


def test_seniority_window_must_be_non_negative() -> None:
    with pytest.raises(ValueError):
        FairShareConfig(seniority_window_s=-1.0)
    with pytest.raises(ValueError):
        FairShareConfig(seniority_window_s=float("nan"))


def test_a_clients_priority_moves_its_request_earlier_within_its_tenant_only_and_capped() -> None:
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(fairshare=FairShareConfig(max_priority_jump_s=30.0)), clock=clock)
    core.accept(SessionStart("a1", 100.0, tenant="a"))
    core.accept(SessionStart("b1", 100.0, tenant="b"))
    clock.t = 110.0
    core.accept(SessionStart("a2", 110.0, tenant="a"))
    # a2's task started 10 s after a1's; with a 20 s jump it goes first, with 5 s not
    assert core.request_rank("a2", "a", 110.0, priority_jump_s=20.0) < core.request_rank("a1", "a", 110.0)
    assert core.request_rank("a2", "a", 110.0, priority_jump_s=5.0) > core.request_rank("a1", "a", 110.0)
    # capped at max_priority_jump_s; nonsense counts as none
    assert core.request_rank("a2", "a", 110.0, priority_jump_s=1e9)[1] == 110.0 - 30.0
    assert core.request_rank("a2", "a", 110.0, priority_jump_s=float("nan"))[1] == 110.0
    # across tenants the share decides first: a served tenant's priority buys nothing
    core.record_service("a", 50_000)
    assert core.request_rank("b1", "b", 110.0) < core.request_rank("a2", "a", 110.0, priority_jump_s=30.0)
