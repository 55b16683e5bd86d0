"""Workflow-atomic admission (`core.admission`) on a real `WorkflowCore` and clock.

A session here is a hinted agent: its requests are `step`s of `tokens` of KV, and
between them it runs a tool whose duration the core has learned (a 0.2 s grep or a
60 s test run), which is what the parking rule reads."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from saga_server.core import (
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core.admission import AdmissionConfig, AdmissionPlan, AdmissionState, SessionAdmission

TOOLS = {"grep": ("search", 0.2), "pytest": ("test", 60.0)}


def learned_core() -> tuple[WorkflowCore, ManualClock]:
    """A core that has seen enough sessions to know greps are short, test runs long."""
    clock = ManualClock(0.0)
    core = WorkflowCore(clock=clock)
    for i in range(20):
        for tool, (cat, d) in TOOLS.items():
            sid = f"warm-{tool}-{i}"
            core.accept(SessionStart(sid, clock.t, workflow="swe"))
            core.accept(LlmCallStart(sid, clock.t))
            core.accept(ToolCallStart(sid, clock.t, tool, category=cat))
            core.accept(ToolCallEnd(sid, clock.t + d, tool))
            core.accept(LlmCallStart(sid, clock.t + d))
            core.accept(SessionEnd(sid, clock.t + d + 1))
    clock.t = 1000.0
    return core, clock


class Agent:
    """Drives one session through the core and the admission controller."""

    def __init__(self, core, adm, clock, sid: str, tenant: str = "t") -> None:
        self.core, self.adm, self.clock, self.sid, self.tenant = core, adm, clock, sid, tenant
        self.tool: str | None = None
        self.steps = 0
        core.accept(SessionStart(sid, clock.t, workflow="swe", tenant=tenant))

    def request(self, tokens: int) -> bool:
        if self.tool:
            self.core.accept(ToolCallEnd(self.sid, self.clock.t, self.tool, call_id=str(self.steps)))
            self.tool = None
        self.steps += 1
        self.core.accept(LlmCallStart(self.sid, self.clock.t))
        return self.adm.ready(self.sid, tokens, self.tenant)

    def finish(self, tokens: int, tool: str | None = "grep") -> None:
        self.core.accept(LlmCallEnd(self.sid, self.clock.t, prompt_tokens=tokens, output_tokens=0))
        self.core.on_request_finished(self.sid, tokens, 0)
        if tool:
            self.core.accept(ToolCallStart(self.sid, self.clock.t, tool, call_id=str(self.steps),
                                           category=TOOLS[tool][0]))
            self.tool = tool
        self.adm.finished(self.sid)

    def end(self) -> None:
        self.core.accept(SessionEnd(self.sid, self.clock.t))
        self.adm.ended(self.sid)


def setup(capacity=1000, host_tokens=0, **cfg):
    core, clock = learned_core()
    adm = SessionAdmission(core, capacity, host_tokens=host_tokens, config=AdmissionConfig(**cfg),
                           return_s=lambda tokens: tokens / 1000)
    return core, clock, adm


def test_where_everything_fits_every_session_runs_at_once_and_nothing_is_parked():
    core, clock, adm = setup(capacity=10_000)
    agents = [Agent(core, adm, clock, f"s{i}") for i in range(5)]
    assert not any(a.request(1000) for a in agents)  # new sessions are admitted by a plan
    plan = adm.plan()
    assert plan.admit == ("s0", "s1", "s2", "s3", "s4") and plan.park == ()
    assert all(a.request(1000) for a in agents)  # active: their next requests run at once


def test_an_oversubscribed_pool_admits_only_what_fits_and_the_head_goes_first():
    core, clock, adm = setup(capacity=1000, target=1.0)
    a, b, c = (Agent(core, adm, clock, s) for s in "abc")
    assert not a.request(600)
    assert adm.plan().admit == ("a",)  # nothing else runs: admitted
    clock.t += 1
    assert not b.request(600) and not c.request(300)
    assert adm.plan().admit == ()  # b (senior) does not fit, and c may not overtake it
    assert {adm.state("b"), adm.state("c")} == {AdmissionState.WAITING}
    a.finish(600, tool=None)
    a.end()
    assert adm.plan().admit == ("b", "c")


def test_an_idle_engine_admits_the_head_whatever_its_size():
    core, clock, adm = setup(capacity=1000)
    big = Agent(core, adm, clock, "big")
    assert not big.request(5000)
    assert adm.plan().admit == ("big",) and adm.counts.forced == 1


def test_a_session_in_a_long_tool_is_parked_for_the_head_one_in_a_short_tool_is_not():
    core, clock, adm = setup(capacity=1000, target=1.0)
    short, long_ = Agent(core, adm, clock, "short"), Agent(core, adm, clock, "long")
    for agent in (short, long_):
        agent.request(400)
        adm.plan()
    short.finish(400, tool="grep")
    long_.finish(400, tool="pytest")
    head = Agent(core, adm, clock, "head")
    busy = Agent(core, adm, clock, "busy")  # keeps the engine busy: no forward-progress shortcut
    busy.request(100)
    assert adm.plan().admit == ("busy",)
    assert not head.request(500)
    plan = adm.plan()
    assert plan.park == ("long",) and plan.admit == ("head",)
    assert adm.state("long") == AdmissionState.PARKED and adm.state("short") == AdmissionState.ACTIVE
    assert adm.active_tokens <= 1000


def head_behind(core, clock, adm, tool: str):
    """An 800-token session idle in `tool`, a busy one, then a 500-token head that
    fits only if the idle one is parked: the plan for the head."""
    idle = Agent(core, adm, clock, tool)
    idle.request(800)
    adm.plan()
    idle.finish(800, tool=tool)
    busy = Agent(core, adm, clock, "busy")  # keeps the engine busy: no forward-progress shortcut
    busy.request(100)
    adm.plan()
    head = Agent(core, adm, clock, "head")
    assert not head.request(500)
    return adm.plan()


def test_when_only_short_tools_could_make_room_the_head_waits():
    core, clock, adm = setup(capacity=1000, target=1.0)
    plan = head_behind(core, clock, adm, "grep")
    assert (plan.admit, plan.park) == ((), ())
    assert adm.state("head") == AdmissionState.WAITING


def test_a_tool_usually_back_at_once_is_not_parked_for_its_rare_long_runs(monkeypatch):
    """`bash` runs 0.2 s nineteen times in twenty and an hour once: its mean wait
    (three minutes) would pay for parking; its median (0.2 s) says the session is
    more likely than not back before its KV could be."""
    core, clock, adm = setup(capacity=1000, target=1.0)
    for i in range(40):
        sid, d = f"warm-bash-{i}", 3600.0 if i % 20 == 0 else 0.2
        core.accept(SessionStart(sid, clock.t, workflow="swe"))
        core.accept(LlmCallStart(sid, clock.t))
        core.accept(ToolCallStart(sid, clock.t, "bash", category="run"))
        core.accept(ToolCallEnd(sid, clock.t + d, "bash"))
        core.accept(SessionEnd(sid, clock.t + d + 1))
    monkeypatch.setitem(TOOLS, "bash", ("run", 0.2))
    assert head_behind(core, clock, adm, "bash").park == ()
    assert adm.state("bash") == AdmissionState.ACTIVE and adm.state("head") == AdmissionState.WAITING


def test_a_parent_waiting_on_its_subagents_is_not_parked_for_the_head():
    """Its wait (its child's run) would pass the payback test, but the tree goes on
    the moment the child returns: the head waits instead, until the child is done."""
    core, clock, adm = setup(capacity=1000, target=1.0)
    parent = Agent(core, adm, clock, "parent")
    parent.request(800)
    adm.plan()
    parent.finish(800, tool="pytest")
    core.accept(SessionStart("child", clock.t, workflow="swe", tenant="t", parent_id="parent"))
    busy = Agent(core, adm, clock, "busy")  # keeps the engine busy: no forward-progress shortcut
    busy.request(100)
    adm.plan()
    head = Agent(core, adm, clock, "head")
    assert not head.request(500)
    assert adm.plan() == AdmissionPlan()
    assert adm.state("parent") == AdmissionState.ACTIVE and adm.state("head") == AdmissionState.WAITING
    core.accept(SessionEnd("child", clock.t))  # still in its long tool: now it may be parked
    assert adm.plan() == AdmissionPlan(admit=("head",), park=("parent",))


def three_admitted(core, clock, adm) -> list[Agent]:
    """Three sessions of 300 tokens, each admitted as its first request arrives."""
    agents = [Agent(core, adm, clock, f"s{i}") for i in range(3)]
    for a in agents:
        a.request(300)
        adm.plan()
    return agents


def test_overflow_does_not_park_a_parent_waiting_on_its_subagents():
    core, clock, adm = setup(capacity=1000, target=0.9, overflow=1.0)
    agents = three_admitted(core, clock, adm)
    for a, tool in zip(agents, ("grep", "pytest", "grep")):
        a.finish(300, tool=tool)
    core.accept(SessionStart("child", clock.t, workflow="swe", tenant="t", parent_id="s1"))
    agents[0].request(500)  # W = 1100 > 1000: s1, away longest, would go first
    assert adm.plan().park == ("s2",)


def test_the_limit_grows_past_the_tiers_while_kv_is_found_and_someone_waits():
    core, clock, adm = setup(capacity=1000, target=1.0)
    a, b = Agent(core, adm, clock, "a"), Agent(core, adm, clock, "b")
    a.request(800)
    adm.plan()
    assert not b.request(600) and adm.plan().admit == ()  # 800 + 600 > L = 1000
    for _ in range(2):  # a's requests find their KV while b waits: the tiers hold more than sized
        adm.served("a", 800, 0)
    assert adm.limit > 1000
    assert adm.plan().admit == ("b",)


def test_a_first_request_is_no_evidence_that_kv_is_held():
    core, clock, adm = setup(capacity=1000, target=1.0)
    a, b = Agent(core, adm, clock, "a"), Agent(core, adm, clock, "b")
    a.request(800)
    adm.plan()
    b.request(600)
    adm.plan()
    adm.served("a", 0, 0)  # nothing held before: nothing found, nothing lost
    assert adm.limit == 1000 and adm.plan().admit == ()


def test_the_limit_does_not_grow_while_an_admitted_request_waits_in_the_engines_queue():
    core, clock, adm = setup(capacity=1000, target=1.0)
    a, c, b = Agent(core, adm, clock, "a"), Agent(core, adm, clock, "c"), Agent(core, adm, clock, "b")
    for x in (a, c):  # both admitted and past their first request here
        x.request(450)
        adm.plan()
        adm.served(x.sid, 0, 0)
        x.finish(450)
    assert a.request(450) and c.request(450)
    assert not b.request(600) and adm.plan().admit == ()  # b waits at the gate
    adm.served("c", 450, 0)  # c finds its KV, but a still waits for the engine
    assert adm.limit == 1000
    adm.served("a", 450, 0)  # now every admitted request runs: the limit binds
    assert adm.limit > 1000


def test_a_sessions_first_request_here_is_no_evidence_of_this_engines_tiers():
    """A session that moved here (or came back after it was forgotten) recomputes what
    another engine held: no loss of this engine's; its next request's is."""
    core, clock, adm = setup(capacity=1000, host_tokens=1000, target=1.0)
    a = Agent(core, adm, clock, "a")
    a.request(800)
    adm.plan()
    adm.served("a", 800, 800)
    assert adm.limit == 2000 and adm.counts.losses == 0
    a.finish(800)
    a.request(800)
    adm.served("a", 800, 800)
    assert adm.limit == 1200 and adm.counts.losses == 1


def test_the_limit_does_not_grow_while_nobody_waits():
    core, clock, adm = setup(capacity=1000, target=1.0)
    a = Agent(core, adm, clock, "a")
    a.request(800)
    adm.plan()
    for _ in range(50):
        adm.served("a", 800, 0)
    assert adm.limit == 1000


def test_recomputed_kv_lowers_the_limit_by_what_was_lost_but_not_below_the_pool():
    core, clock, adm = setup(capacity=1000, host_tokens=1000, target=1.0)
    a = Agent(core, adm, clock, "a")
    a.request(800)
    adm.plan()
    adm.served("a", 0, 0)  # its first request here
    a.finish(800)
    a.request(800)
    adm.served("a", 800, 300)
    assert adm.limit == 1700 and adm.counts.losses == 1
    adm.served("a", 5000, 5000)
    assert adm.limit == 1000


def test_a_session_with_two_requests_in_flight_is_busy_until_both_finished():
    core, clock, adm = setup(capacity=1000, target=1.0)
    a = Agent(core, adm, clock, "a")
    a.request(400)
    adm.plan()
    assert adm.ready("a", 400)  # a second call of the same session (parallel tool use)
    adm.finished("a")
    assert adm._busy()  # one is still running: the engine is not idle, a is not parkable
    adm.finished("a")
    assert not adm._busy()


def test_overflow_parks_idle_sessions_down_to_the_target():
    core, clock, adm = setup(capacity=1000, target=0.9, overflow=1.0)
    agents = three_admitted(core, clock, adm)
    assert adm.states()[AdmissionState.ACTIVE] == 3 and adm.active_tokens == 900
    for a in agents:
        a.finish(300, tool="pytest")
    agents[0].request(500)  # its context grew: W = 1100 > 1000
    plan = adm.plan()
    assert plan.park == ("s1",) and adm.active_tokens == 800  # down to <= 900, the tie by id


class AdmissionMachine(RuleBasedStateMachine):
    """Random arrivals, finishes and ends under a small pool: the bound holds (every
    session that waits is admitted once the engine has drained), nothing active is
    lost track of, and the active working set stays within the target unless a
    forced admission (an idle engine) put one big session there."""

    def __init__(self) -> None:
        super().__init__()
        self.core, self.clock, self.adm = setup(capacity=1000, target=0.9, overflow=1.0)
        self.agents: dict[str, Agent] = {}
        self.running: set[str] = set()  # admitted and not finished
        self.n = 0

    def _plan(self) -> None:
        plan = self.adm.plan()
        self.running |= set(plan.admit)
        assert not set(plan.park) & self.running  # only idle sessions are parked

    @rule(tokens=st.integers(50, 1500), tenant=st.sampled_from(["a", "b"]))
    def new_session(self, tokens, tenant):
        self.n += 1
        a = self.agents[f"s{self.n}"] = Agent(self.core, self.adm, self.clock, f"s{self.n}", tenant)
        if a.request(tokens):
            self.running.add(a.sid)
        self._plan()

    @rule(data=st.data(), tool=st.sampled_from(["grep", "pytest"]))
    def finish(self, data, tool):
        if self.running:
            sid = data.draw(st.sampled_from(sorted(self.running)))
            self.running.discard(sid)
            self.agents[sid].finish(300, tool=tool)
            self._plan()

    @rule(data=st.data(), tokens=st.integers(50, 1500))
    def next_step(self, data, tokens):
        idle = [s for s in self.agents if s not in self.running and self.adm.state(s) is not None
                and not self.adm._entries[s].pending]
        if idle:
            sid = data.draw(st.sampled_from(sorted(idle)))
            if self.agents[sid].request(tokens):
                self.running.add(sid)
            self._plan()

    @rule(data=st.data())
    def end(self, data):
        idle = [s for s in self.agents if s not in self.running and self.adm.state(s) is not None
                and not self.adm._entries[s].pending]
        if idle:
            sid = data.draw(st.sampled_from(sorted(idle)))
            self.agents.pop(sid).end()
            self._plan()

    @rule(dt=st.floats(0.0, 30.0))
    def tick(self, dt):
        self.clock.t += dt

    @invariant()
    def within_bounds(self):
        active = [e for e in self.adm._entries.values() if e.state == AdmissionState.ACTIVE]
        assert self.adm.active_tokens == sum(e.ws for e in active)
        if self.adm.active_tokens > 1000:  # over the pool: only what cannot be parked is left
            assert all(e.pending for e in active)

    def teardown(self):
        # Drain: finish every running request with no tool, end the session; whoever
        # waits must be admitted (nobody waits forever).
        for _ in range(10 * len(self.agents) + 10):
            if not self.running:
                break
            sid = sorted(self.running)[0]
            self.running.discard(sid)
            self.agents[sid].finish(300, tool=None)
            self.agents.pop(sid).end()
            self._plan()
        waiting = [s for s, e in self.adm._entries.items() if e.pending and e.state != AdmissionState.ACTIVE]
        assert waiting == [], waiting


TestAdmission = AdmissionMachine.TestCase
TestAdmission.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_bad_settings_are_refused():
    core, _ = learned_core()
    with pytest.raises(ValueError):
        SessionAdmission(core, 0)
    with pytest.raises(ValueError):
        AdmissionConfig(target=1.2, overflow=1.0)
