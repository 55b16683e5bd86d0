"""`EnginePolicy`: an engine's facts in one order, its table of live requests, and
what the deadline shaper and the core learn of them (on a counting pool)."""

from __future__ import annotations

from saga_server.core import CoreConfig, ManualClock, SessionStart, WorkflowCore
from saga_server.core.admission import AdmissionPlan, AdmissionState
from saga_server.core.deadlines import AT_RISK, NORMAL, SLACK_RICH, DeadlineShaper
from saga_server.core.engine_policy import EnginePolicy, LiveRequest
from saga_server.core.holds import HoldLedger
from saga_server.core.kv_policy import WorkflowRules
from saga_server.core.pinning import PinConfig
from tests.support.pools import Pool, blocks

BT = 16


class OneAtATime:
    """Admission as the policy drives it: one session active, the others wait until the
    engine's next plan after it finished (the contract: `admission.SessionAdmission`)."""

    def __init__(self) -> None:
        self.active: str | None = None
        self.waiting: list[str] = []

    def ready(self, session_id, tokens, tenant=""):
        if self.active in (None, session_id):
            self.active = session_id
            return True
        self.waiting.append(session_id)
        return False

    def finished(self, session_id):
        if self.active == session_id:
            self.active = None

    def served(self, session_id, held_tokens, recomputed_tokens):
        pass

    def ended(self, session_id):
        pass

    def state(self, session_id):
        if session_id == self.active:
            return AdmissionState.ACTIVE
        return AdmissionState.WAITING if session_id in self.waiting else None

    def plan(self):
        if self.active is None and self.waiting:
            self.active = self.waiting.pop(0)
            return AdmissionPlan(admit=(self.active,))
        return AdmissionPlan()

    def __len__(self):
        return len(self.waiting) + (self.active is not None)


def engine(at_risk: set[str] = frozenset()):
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(pin=PinConfig(min_tokens=10**9)), clock=clock)
    shaper = DeadlineShaper(lambda sid: AT_RISK if sid in at_risk else NORMAL, prefill_budget_tokens=BT)
    e = EnginePolicy(HoldLedger(Pool(64), 64), WorkflowRules(core), block_tokens=BT, core=core,
                     admission=lambda parkable: OneAtATime(), shaper=shaper)
    return e, core, clock


def arrive(e: EnginePolicy, clock, sid: str, key: str) -> bool:
    e.arrived(LiveRequest(key, sid, prompt_tokens=2 * BT, arrived_at=clock()))
    return e.queued(key, 3 * BT, clock())


def test_a_request_at_the_admission_gate_reaches_the_shaper_only_once_admitted():
    e, core, clock = engine(at_risk={"late"})
    assert arrive(e, clock, "first", "a")
    assert not arrive(e, clock, "late", "b")  # the gate holds it: it takes nothing yet
    assert e.at_risk() == 0 and not e.may_schedule("b") and not e.urgent("b")
    e.scheduled("a", 0, 0, 2 * BT, clock())
    e.finished("a", blocks("first", 2), clock(), 1)
    assert e.tick(clock()).admit == ("late",)
    assert e.at_risk() == 1 and e.urgent("b") and e.may_schedule("b")


def test_each_fact_reaches_the_core_and_the_table_in_order():
    e, core, clock = engine()
    core.accept(SessionStart("s", clock()))
    e.arrived(LiveRequest("plain", None))  # no session: in the table, never held, nothing to the core
    assert e.queued("plain", BT, clock()) and e.may_schedule("plain")
    assert arrive(e, clock, "s", "r")
    assert core.stats()["requests_arrived"] == 1 and set(e.requests) == {"plain", "r"}
    e.scheduled("r", 0, 0, 2 * BT, clock())
    assert e.requests["r"].context_tokens is None
    hold = e.finished("r", blocks("s", 2), clock(), 5)
    e.finished("plain", (), clock(), 1)
    assert core.stats()["requests_finished"] == 1 and not e.requests
    assert hold is not None and e.ledger.get("s") is hold and len(hold.blocks) == 2


def test_a_request_moving_with_its_session_waits_for_its_kv_on_the_other_engine():
    source, _, clock = engine(at_risk={"s"})
    target, _, _ = engine(at_risk={"s"})
    assert arrive(source, clock, "s", "r") and source.at_risk() == 1
    target.joined(source.left("r"))
    assert source.at_risk() == 0 and not source.requests
    assert "r" in target.requests and target.at_risk() == 0  # its KV is still on the way
    target.admitted("r")  # it landed: the request joins the queue there
    assert target.at_risk() == 1 and target.urgent("r")


def test_a_request_that_names_no_tenant_counts_for_its_hinted_sessions_tenant():
    # An at-risk browser session runs; a slack-rich coding session's request, of
    # another tenant, must wait beside it. Neither request names its tenant (a plain
    # OpenAI request with a session id): only the hints said whose they are.
    clock = ManualClock(100.0)
    core = WorkflowCore(CoreConfig(pin=PinConfig(min_tokens=10**9)), clock=clock)
    shaper = DeadlineShaper(lambda sid: AT_RISK if sid == "browse" else SLACK_RICH, prefill_budget_tokens=BT)
    e = EnginePolicy(HoldLedger(Pool(64), 64), WorkflowRules(core), block_tokens=BT, core=core, shaper=shaper)
    core.accept(SessionStart("browse", clock(), tenant="browser"))
    core.accept(SessionStart("code", clock(), tenant="coding"))
    assert arrive(e, clock, "browse", "b")
    e.scheduled("b", 0, 0, 2 * BT, clock())  # running, not waiting
    assert arrive(e, clock, "code", "c")
    assert e.requests["b"].tenant == "browser" and e.requests["c"].tenant == "coding"
    assert not e.may_schedule("c")  # held while the other tenant's at-risk request runs
