"""One KV policy, two engines: the same agent sessions, event for event, through
the vLLM adapter (vLLM's real `Scheduler` with SAGA's plugin, hints through its
sink) and through the simulator's adapter (its own entry points: task start, its
batch's events, tool end) take the same KV decisions: which sessions hold KV, in
which tier, with which pin TTL, in which order they would go, which are parked and
admitted. Both engines run one request at a time.

The script: three sessions finish a call and start tools (a test run, a web fetch
and a grep; the core has learnt the first and last); a large prompt puts the pool
under pressure (the soft hold goes, then a pin's tail; a session is parked); the
fetch ends and its request waits behind the large one (its KV is protected); the
grep ends and waits at the admission gate until it is admitted; the test run's pin
expires and its tool ends; every session ends."""

from __future__ import annotations

import heapq

import pytest

from saga_server.core import (
    CoreConfig,
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core.admission import AdmissionState
from saga_server.core.holds import PINNED, PROTECTED, SOFT
from saga_server.core.mechanisms import ENGINE_MECHANISMS, Mechanism
from saga_server.core.pinning import PinConfig
from saga_server.engines.sim import SimConfig, Simulator, StepSpec, TaskInstance, TaskSpec, ToolSpec, make_cost_model
from saga_server.engines.sim.events import SAMPLE, TASK_START, TOOL_END
from saga_server.engines.sim.saga_policy import SagaPolicy
from saga_server.engines.vllm import SagaScheduler
from saga_server.settings import EngineSettings
from vllm_builders import Requests, make_scheduler, step

BS = 16
POOL = 16  # blocks both engines may hold (vLLM keeps one more, its null block)
SEQS = 1  # requests an engine runs at once: the next one waits in the queue
CONFIG = CoreConfig(pin=PinConfig(min_tokens=BS))  # sessions this small may be pinned
# The mechanisms both engines run. The simulator's prefetch is a host-tier load, the CPU
# engine's a re-prefill on idle steps (`engines.vllm.prefetch`): two mechanisms, left
# out of both here, as are the queue's order and deadline shaping (one session per step).
MECHANISMS = frozenset({Mechanism.WALRU, Mechanism.TTL, Mechanism.ADMIT})
TIER = {SOFT: "soft", PINNED: "pinned", PROTECTED: "protected"}
# Per session: its steps as (prompt tokens, answer tokens, tools after it as (name,
# category, seconds)). A request is scheduled at one engine step and answers one token
# per step, so a 2-token answer is done at the next step, a 4-token one three later.
SESSIONS = {
    "tester": [(64, 2, (("pytest", "test", 60.0),)), (96, 2, ())],
    "grepper": [(64, 2, (("grep", "search", 2.0),)), (80, 2, ())],
    "reader": [(48, 2, (("fetch", "web", 1.8),)), (64, 2, ())],
    "big": [(160, 4, ())],
}
# (time, engine event, session); "step" lets the engine run what it holds.
SCRIPT = [
    (0.0, "start", "tester"), (1.0, "step", None),
    (1.2, "start", "reader"), (2.0, "step", None),
    (2.2, "start", "grepper"), (3.0, "step", None),
    (3.5, "start", "big"),  # memory runs short: soft KV goes first, then pins; its session is parked
    (3.8, "tool_end", "reader"),  # its request waits behind the big one: its KV is used next
    (4.1, "tool_end", "grepper"),  # parked: its request waits at the gate
    (4.6, "step", None), (5.5, "step", None), (6.5, "step", None),
    (62.0, "step", None),  # the test run's pin has run out
    (65.0, "tool_end", "tester"), (66.0, "step", None),
]


def warm(core, t0: float = -10_000.0) -> None:
    """What both cores have learned before: greps take 2 s, test runs 60 s."""
    for i in range(20):
        for tool, cat, d in (("grep", "search", 2.0), ("pytest", "test", 60.0)):
            sid, t = f"warm-{tool}-{i}", t0 + i
            core.accept(SessionStart(sid, t))
            core.accept(LlmCallStart(sid, t, step=0))
            core.accept(LlmCallEnd(sid, t, step=0, prompt_tokens=64, output_tokens=1))
            core.accept(ToolCallStart(sid, t, tool, call_id="0.0", category=cat))
            core.accept(ToolCallEnd(sid, t + d, tool, call_id="0.0"))
            core.accept(LlmCallStart(sid, t + d, step=1))
            core.accept(LlmCallEnd(sid, t + d, step=1, prompt_tokens=80, output_tokens=1))
            core.accept(SessionEnd(sid, t + d))


def decisions(ledger, admission) -> dict:
    """What the policy decided, as both engines can show it."""
    holds = [ledger.get(sid) for sid in ledger.sessions()]
    order = [h.session_id for h in sorted(holds, key=lambda h: (h.tier, h.key))]  # first to go first
    return {"held": {h.session_id: (TIER[h.tier], len(h.blocks)) for h in holds},
            # a pin's TTL from when its KV was last held (the engines finish a request at
            # different instants of the same step)
            "pin ttl": {h.session_id: round(h.expires_at - h.created_at, 3) for h in holds if h.tier == PINNED},
            "order": order,
            "admission": {sid: admission.state(sid) for sid in SESSIONS if admission.state(sid) is not None}}


class VllmEngine:
    """The vLLM adapter: requests into the real scheduler, hints into the plugin's sink."""

    def __init__(self, model) -> None:
        self.clock = ManualClock(-10_000.0)
        core = WorkflowCore(CONFIG, clock=self.clock)
        warm(core)
        self.s = make_scheduler(SagaScheduler, model, num_blocks=POOL + 1, block_size=BS, max_num_seqs=SEQS,
                                core=core, clock=self.clock, start_hints=False,
                                settings=EngineSettings(off=ENGINE_MECHANISMS - MECHANISMS))
        self.plugin = self.s.saga
        self.R = Requests(BS)
        self.step_of = dict.fromkeys(SESSIONS, 0)
        self.tokens = {sid: [] for sid in SESSIONS}
        self.running: dict[str, str] = {}  # request id -> session

    def hint(self, event) -> None:
        self.plugin.sink.accept(event)

    def arrive(self, sid: str) -> None:
        k = self.step_of[sid]
        prompt, out, _ = SESSIONS[sid][k]
        tokens = self.tokens[sid]
        tokens += [100 + 10 * list(SESSIONS).index(sid) + k] * (prompt - len(tokens))  # its own new turn
        self.hint(LlmCallStart(sid, self.clock(), step=k))
        req = self.R.make(list(tokens), session_id=sid, max_tokens=out)
        self.running[req.request_id] = sid
        self.s.add_request(req)

    def do(self, t: float, event: str, sid: str | None) -> dict:
        self.clock.t = t
        if event == "start":
            self.hint(SessionStart(sid, t, workflow="default"))
            self.arrive(sid)
        elif event == "tool_end":
            k = self.step_of[sid] - 1
            for i, (tool, _, _) in enumerate(SESSIONS[sid][k][2]):
                self.hint(ToolCallEnd(sid, t, tool, call_id=f"{k}.{i}"))
            self.arrive(sid)
        out = step(self.s)  # applies the hints, ticks the policy, runs what it may
        done = [rid for rid in self.running if rid in out.finished_req_ids or rid not in self.s.requests]
        for rid in done:
            self.finished(self.running.pop(rid))
        if done:
            step(self.s)  # their hints reach the engine loop (as the simulator applies them at once)
        return decisions(self.plugin.ledger, self.plugin.admission)

    def finished(self, sid: str) -> None:
        t, k = self.clock(), self.step_of[sid]
        prompt, out, tools = SESSIONS[sid][k]
        self.tokens[sid] += [7] * out  # the answer (the synthetic model's token)
        self.hint(LlmCallEnd(sid, t, step=k, prompt_tokens=prompt, output_tokens=out))
        self.step_of[sid] = k + 1
        if k + 1 == len(SESSIONS[sid]):
            self.hint(SessionEnd(sid, t))
        for i, (tool, cat, _) in enumerate(tools):
            self.hint(ToolCallStart(sid, t, tool, call_id=f"{k}.{i}", category=cat))


class SimEngine:
    """The simulator's adapter, driven through its own entry points."""

    def __init__(self) -> None:
        tasks = [TaskInstance(sid, TaskSpec(sid, sid, 0, tuple(
            StepSpec(prompt, out, sum(steps[k - 1][:2]) if k else 0, tuple(ToolSpec(n, c, d) for n, c, d in tools))
            for k, (prompt, out, tools) in enumerate(steps)))) for sid, steps in SESSIONS.items()]
        self.inst = {i.session_id: i for i in tasks}
        # An engine step of ~0.25 s: a request takes a step for its prefill and one per
        # further answer token, so it is done after the script event before the one at
        # which the vLLM driver's steps finish it, and by that one.
        cost = make_cost_model("h100-80gb", "llama3-8b", kv_capacity_override=POOL * BS, block_tokens=BS,
                               max_num_seqs=SEQS, overhead_s=0.25)
        policy = SagaPolicy(mechanisms=MECHANISMS, config=CONFIG)
        self.sim = Simulator(cost, policy, tasks, SimConfig(workers=1))
        self.sim.now = -10_000.0
        warm(policy.core)
        self.w = self.sim.workers[0]

    def do(self, t: float, event: str, sid: str | None) -> dict:
        sim = self.sim
        self.run_until(t)
        if event == "start":
            sim._start_task(self.inst[sid])
        elif event == "tool_end":
            sim._tool_end(sim.sessions[sid])
        return decisions(self.w.cache.ledger, self.w.engine.admission)

    def run_until(self, t: float) -> None:
        """The simulator's own events due by `t` (its batch, pin expiries); the script
        is the agents: their tools end and tasks start when it says."""
        sim, events = self.sim, self.sim._events
        while events and events[0][0] <= t:
            when, _, kind, a, b = heapq.heappop(events)
            if kind not in (TOOL_END, TASK_START, SAMPLE):
                sim.now = when
                sim._handle(kind, a, b)
        sim.now = t


@pytest.fixture(scope="module")
def traces(tiny_model):
    vllm = VllmEngine(tiny_model)
    sim = SimEngine()
    return [(t, e, sid, vllm.do(t, e, sid), sim.do(t, e, sid)) for t, e, sid in SCRIPT]


def test_both_engines_take_the_same_kv_decisions_event_for_event(traces):
    for t, event, sid, in_vllm, in_sim in traces:
        print(f"{t:6.1f} {event:10} {sid or '':8}\n   vllm {in_vllm}\n   sim  {in_sim}")
    for t, event, sid, in_vllm, in_sim in traces:
        assert in_vllm == in_sim, f"after {event} {sid or ''} at t={t}"


def test_the_decisions_are_the_rules_the_policy_documents(traces):
    """What both engines did (they agree, above) is what `SessionKvPolicy`'s table says."""
    at = {(t, event): d for t, event, _, d, _ in traces}
    assert at[(3.0, "step")]["held"] == {"tester": ("pinned", 4), "reader": ("pinned", 3), "grepper": ("soft", 4)}
    assert at[(3.0, "step")]["order"][0] == "grepper"  # soft goes before pins
    pressed = at[(3.5, "start")]
    assert "grepper" not in pressed["held"] and pressed["held"]["tester"] == ("pinned", 2)  # soft, then a pin's tail
    assert pressed["admission"]["grepper"] == AdmissionState.PARKED
    assert at[(3.8, "tool_end")]["held"]["reader"] == ("protected", 3)  # queued: its KV is used next
    assert at[(4.1, "tool_end")]["admission"]["grepper"] == AdmissionState.PARKED  # its request waits at the gate
    assert at[(5.5, "step")]["admission"]["grepper"] == AdmissionState.ACTIVE  # admitted once there was room
    assert at[(62.0, "step")]["held"]["tester"] == ("soft", 2)  # its pin's TTL passed
    assert at[(66.0, "step")] == {"held": {}, "pin ttl": {}, "order": [], "admission": {}}  # all ended
