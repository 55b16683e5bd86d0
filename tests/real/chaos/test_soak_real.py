"""The short soak (`benchmarks/soak.py` at CI scale): session churn of every kind
(ends by a last-request marker, quiet sessions, streams cut mid-answer, tools that
never end, a tenant over its session limit, malformed hints and request fields)
through the proxy's tracker into a real `saga hints` process, and through one real
`saga serve`; every table each process keeps, and its RSS, must stop growing once
warm-up is over (`soak.past_warmup`), with no error and no lost answer.

The bounds are lowered so that a short run reaches them (the hint service keeps
3,000 sessions, the engine 150): a bound is shown by reaching it and staying there.

STARTS ITS OWN ENGINE (the soak's `saga serve`) beside the tier's shared one.
"""

from __future__ import annotations

from benchmarks import soak


def test_the_tracker_and_the_hint_service_stay_flat_under_churn():
    run = soak.Run()
    soak.phase_hints(run, 24_000, 1_200, 3_000, seed=3)
    assert soak.past_warmup(run) == [], soak.report(run)
    service = [s for s in run.samples if s.process == "hint service"]
    assert max(s.tables["aeg_sessions"] for s in service) == 3_000  # the bound, reached and kept
    phase = "tracker -> hint service"
    assert run.errors[phase] == 0 and run.lost_answers[phase] == 0 and run.requests[phase] > 30_000
    assert run.refused["capped tenant sessions"] == 450  # 500 asked, 50 allowed
    assert run.refused["malformed hints"] == 3_000


def test_one_saga_serve_stays_flat_under_churn(saga_server):  # the shared one: the model is prepared
    run = soak.Run()
    soak.phase_engine(run, 450, 50, 150, concurrency=8)
    assert soak.past_warmup(run) == [], soak.report(run)
    engine = [s for s in run.samples if s.process == "saga serve"]
    assert max(s.tables["aeg_sessions"] for s in engine) <= 150
    assert run.errors["saga serve"] == 0 and run.lost_answers["saga serve"] == 0
