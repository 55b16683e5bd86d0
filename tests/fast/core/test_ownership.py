"""The ownership rule of the session table (`core.sessions`): one rule, one place,
so the hint service, the simulator and every engine apply the same one."""

from __future__ import annotations

import pytest

from saga_server.core import (
    ADMIN,
    AccessDenied,
    Caller,
    HintRejected,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionPhase,
    SessionStart,
    SessionTable,
    TenantLimits,
    ToolCallStart,
    WorkflowCore,
)

A = Caller("a")
B = Caller("b")
OPS = Caller("ops", ADMIN)


def test_a_session_belongs_to_the_tenant_whose_key_started_it():
    table = SessionTable()
    table.accept(SessionStart("s", 0.0, tenant=""), A)  # no tenant named: the key's
    table.accept(SessionStart("t", 0.0, tenant="a"), A)
    assert (table.by_id["s"].owner, table.by_id["s"].tenant) == ("a", "a")
    assert table.session("t", A).tenant == "a"
    table.accept(LlmCallStart("new", 1.0), A)  # a hint that creates a session makes it the caller's too
    assert table.by_id["new"].owner == "a" and table.session("new", A).tenant == "a"


@pytest.mark.parametrize("attempt, counter", [
    (lambda t: t.accept(SessionStart("x", 1.0, tenant="a"), B), "denied_tenant_claim"),
    (lambda t: t.accept(ToolCallStart("s", 1.0, "pytest"), B), "denied_foreign_session"),
    (lambda t: t.accept(SessionEnd("s", 1.0), B), "denied_foreign_session"),
    (lambda t: t.accept(SessionStart("s", 1.0), B), "denied_foreign_session"),
    (lambda t: t.session("s", B), "denied_read"),
    (lambda t: t.releasable("s", B), "denied_release"),
])
def test_another_tenant_is_refused_counted_and_changes_nothing(attempt, counter):
    table = SessionTable()
    table.accept(SessionStart("s", 0.0, tenant="a"), A)
    before = table.session("s")
    with pytest.raises(AccessDenied):
        attempt(table)
    assert table.counters[counter] == 1
    assert sum(v for k, v in table.counters.items() if k.startswith("denied_")) == 1
    assert table.session("s") == before and "x" not in table.by_id


def test_an_ended_session_stays_its_owners_until_it_expires():
    clock = ManualClock(0.0)
    table = SessionTable(ended_ttl_s=10.0, clock=clock)
    table.accept(SessionStart("s", 0.0), A)
    table.accept(SessionEnd("s", 1.0), A)
    with pytest.raises(AccessDenied):
        table.accept(SessionStart("s", 2.0), B)  # B may not replace A's finished record
    table.accept(LlmCallStart("other", 20.0), B)  # expiry runs with each hint: A's record is gone
    table.accept(SessionStart("s", 20.0), B)
    assert table.by_id["s"].owner == "b"


def test_listing_shows_the_callers_own_sessions():
    table = SessionTable(clock=ManualClock(0.0))
    for sid, caller in (("a1", A), ("b1", B), ("a2", A)):
        table.accept(SessionStart(sid, 0.0), caller)
    assert [s.session_id for s in table.sessions(10, A)] == ["a2", "a1"]
    assert [s.session_id for s in table.sessions(1, A)] == ["a2"]
    assert table.counters["list_withheld"] == 2
    assert {s.session_id for s in table.sessions(10, OPS)} == {"a1", "a2", "b1"}  # admin, and no caller: all
    assert len(table.sessions(10)) == 3 and table.counters["list_withheld"] == 2


def test_an_admin_names_any_tenant_and_acts_on_any_session():
    table = SessionTable()
    table.accept(SessionStart("s", 0.0, tenant="a"), OPS)
    assert (table.by_id["s"].owner, table.by_id["s"].tenant) == ("a", "a")  # it is a's session
    table.accept(ToolCallStart("s", 1.0, "pytest"), A)
    table.accept(LlmCallStart("s", 2.0), OPS)
    assert table.session("s", OPS).state == SessionPhase.LLM
    table.releasable("s", OPS)
    assert not any(v for k, v in table.counters.items() if k.startswith("denied_"))


def test_a_session_nobody_owns_is_claimed_by_its_first_hint_unless_it_names_another_tenant():
    core = WorkflowCore(clock=ManualClock(0.0))
    core.on_request_arrival("engine-only", 100)  # served before any hint: nobody's
    core.on_request_arrival("labelled", 100, tenant="b")  # a request that says tenant b
    with pytest.raises(AccessDenied):
        core.session("engine-only", A)  # not a's yet: not readable
    core.accept(ToolCallStart("engine-only", 0.0, "bash"), A)
    assert core.table.by_id["engine-only"].owner == "a" and core.session("engine-only", A).tenant == "a"
    with pytest.raises(AccessDenied):
        core.session("engine-only", B)
    with pytest.raises(AccessDenied):
        core.accept(ToolCallStart("labelled", 0.0, "bash"), A)
    core.accept(ToolCallStart("labelled", 0.0, "bash"), B)
    assert core.table.by_id["labelled"].owner == "b"


def test_the_session_limit_counts_live_sessions_of_the_tenant():
    table = SessionTable()
    capped = Caller("a", limits=TenantLimits(max_sessions=2))
    table.accept(SessionStart("s1", 0.0), capped)
    table.accept(LlmCallStart("s2", 0.0), capped)  # a session begun without a start counts too
    with pytest.raises(AccessDenied, match="limit 2"):
        table.accept(SessionStart("s3", 0.0), capped)
    with pytest.raises(AccessDenied):
        table.accept(LlmCallStart("s3", 0.0), capped)
    assert table.counters["denied_session_limit"] == 2 and "s3" not in table.by_id
    table.accept(SessionStart("b1", 0.0), B)  # other tenants are not affected
    table.accept(SessionEnd("s1", 1.0), capped)  # an ended session frees its place
    table.accept(SessionStart("s3", 1.0), capped)
    assert table.by_id["s3"].owner == "a"


def test_the_session_limit_applies_to_a_claim_and_a_replaced_record_frees_its_place():
    core = WorkflowCore(clock=ManualClock(0.0))
    capped = Caller("a", limits=TenantLimits(max_sessions=1))
    core.accept(SessionStart("s1", 0.0), capped)
    core.on_request_arrival("engine-only", 10)
    with pytest.raises(AccessDenied):
        core.accept(LlmCallStart("engine-only", 0.0), capped)
    core.accept(SessionEnd("s1", 0.0), capped)
    core.accept(SessionStart("s1", 1.0), capped)  # a new run under its own ended id: still one live
    with pytest.raises(AccessDenied):
        core.accept(SessionStart("s2", 1.0), capped)


def test_a_deadline_below_the_floor_is_raised_to_it_and_counted():
    table = SessionTable()
    floor = Caller("a", limits=TenantLimits(min_deadline_s=60.0))
    table.accept(SessionStart("urgent", 100.0, deadline_s=1.0), floor)
    table.accept(SessionStart("relaxed", 100.0, deadline_s=600.0), floor)
    table.accept(SessionStart("none", 100.0), floor)  # no deadline stays none
    deadlines = {sid: table.session(sid).deadline_at for sid in ("urgent", "relaxed", "none")}
    assert deadlines == {"urgent": 160.0, "relaxed": 700.0, "none": None}
    assert table.counters["deadline_clamped"] == 1


def test_without_a_caller_everything_is_as_before():
    table = SessionTable()
    table.accept(SessionStart("s", 0.0, tenant="a", deadline_s=1.0))
    table.accept(ToolCallStart("s", 1.0, "pytest"))
    with pytest.raises(HintRejected, match="already started"):
        table.accept(SessionStart("s", 1.0, tenant="b"))
    assert table.by_id["s"].owner is None and table.session("s").deadline_at == 1.0
    assert not any(v for k, v in table.counters.items() if k.startswith(("denied_", "deadline_")))


def test_fair_share_sees_the_tenant_of_the_key_not_of_the_payload():
    clock = ManualClock(0.0)
    core = WorkflowCore(clock=clock)
    core.accept(SessionStart("s", 0.0, tenant=""), A)
    assert core.fair.active(clock()) == ["a"] and core.tenant_of("s") == "a"


def test_a_start_that_replaces_the_tenants_own_live_record_needs_no_extra_room():
    table = SessionTable()
    capped = Caller("a", limits=TenantLimits(max_sessions=1))
    table.admit("e", 0.0, hinted=False, owner="a")  # a's, only the engine has seen it so far
    table.accept(SessionStart("e", 1.0), capped)  # replaces it: still one live session
    assert table.by_id["e"].hinted and table.stats()["sessions_live"] == 1
    with pytest.raises(AccessDenied):
        table.accept(SessionStart("f", 1.0), capped)


def test_a_request_cannot_move_an_owned_sessions_work_to_another_tenants_share():
    """A request's own tenant label (vllm_xargs, unauthenticated) counts only for
    sessions no key owns: a's session is ranked and charged as a's."""
    clock = ManualClock(0.0)
    core = WorkflowCore(clock=clock)
    core.accept(SessionStart("owned", 0.0), A)
    core.on_request_arrival("anonymous", 10)
    core.record_service("b", 500, session_id="owned")
    core.record_service("b", 70, session_id="anonymous")
    assert {t: o.served_tokens for t, o in core.tenant_outcomes().items()} == {"a": 500.0, "b": 70.0}
    assert core.request_rank("owned", "b", 0.0)[0] == core.request_rank("owned", "", 0.0)[0] \
        == core.request_priority("", "a")


@pytest.mark.parametrize("event", [SessionStart("b/shared-1", 0.0, tenant="b"), SessionStart("b/shared-1", 0.0),
                                   LlmCallStart("b/shared-1", 0.0), ToolCallStart("b/shared-1", 0.0, "bash")],
                         ids=["start-naming-b", "start", "llm-call", "tool-call"])
def test_an_id_scoped_to_another_tenant_is_refused_and_leaves_nothing(event):
    """The proxy scopes team b's ids as `b/<id>`: a key of team a that hints such an id
    (a proxy given an agent key, a curious agent) must neither create nor claim it."""
    table = SessionTable(clock=ManualClock(0.0))
    with pytest.raises(AccessDenied, match="scoped to another tenant"):
        table.accept(event, A)
    with pytest.raises(AccessDenied):
        table.accept(LlmCallStart("b/shared-1", 0.5), A)  # the hints that follow a refused start
    assert "b/shared-1" not in table.by_id and table.counters["denied_foreign_scope"] == 2
    table.accept(SessionStart("b/shared-1", 1.0, tenant="b"), OPS)  # the proxy's admin key: b's session
    table.accept(LlmCallStart("b/shared-1", 1.5), B)
    assert (table.by_id["b/shared-1"].owner, [s.session_id for s in table.sessions(caller=A)]) == ("b", [])
    table.accept(LlmCallStart("a/mine", 2.0), A)  # its own scope, and ids with no scope, are a's to use
    table.accept(LlmCallStart("plain", 2.0), A)
    assert sorted(s.session_id for s in table.sessions(caller=A)) == ["a/mine", "plain"]


def test_without_keys_or_with_an_admin_key_scoped_ids_are_anyones():
    table = SessionTable()
    table.accept(LlmCallStart("b/x", 0.0))
    table.accept(LlmCallStart("c/y", 0.0), OPS)
    assert set(table.by_id) == {"b/x", "c/y"} and table.counters["denied_foreign_scope"] == 0
