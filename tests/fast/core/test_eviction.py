"""WA-LRU keys follow the documented score (the order they give is the ledger's: test_holds)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_server.core import (
    EvictionConfig,
    LlmCallEnd,
    LlmCallStart,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
    wa_lru_key,
)

CFG = EvictionConfig()


def test_without_a_session_the_key_is_plain_recency() -> None:
    assert wa_lru_key(100.0, 42.0, 5000, None) == 42.0
    assert wa_lru_key(100.0, 10.0, 5000, None) < wa_lru_key(100.0, 42.0, 5000, None)


def test_key_is_now_minus_wait_over_value() -> None:
    p, t_next, tokens = 0.8, 4.0, 16384
    w = 1.0 + tokens / CFG.attn_tokens
    assert wa_lru_key(50.0, 0.0, tokens, (p, t_next)) == pytest.approx(50.0 - t_next / (p * w))


finite = st.floats(0.0, 1e4, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(a=st.tuples(st.floats(0.01, 1.0), finite, st.integers(0, 200_000)),
       b=st.tuples(st.floats(0.01, 1.0), finite, st.integers(0, 200_000)))
def test_eviction_order_matches_documented_value_density(a, b) -> None:
    """Lower key (evicted first) <=> lower p * w / T, the recompute cost saved per
    token per second of expected wait."""
    now = 1e4
    ka = wa_lru_key(now, 0.0, a[2], (a[0], a[1]))
    kb = wa_lru_key(now, 0.0, b[2], (b[0], b[1]))

    def wait_per_value(x):
        return x[1] / (x[0] * (1 + x[2] / CFG.attn_tokens))

    va, vb = wait_per_value(a), wait_per_value(b)
    if not math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-9):
        assert (ka < kb) == (va > vb)


def test_ended_sessions_go_before_any_live_or_recent_entry() -> None:
    ended = wa_lru_key(100.0, 99.0, 100, (0.0, math.inf))
    assert ended < wa_lru_key(100.0, 0.0, 100, None)
    assert ended < wa_lru_key(100.0, 99.0, 100, (0.5, 1000.0))


def test_core_evicts_the_session_whose_next_use_is_farthest() -> None:
    t = [0.0]
    core = WorkflowCore(clock=lambda: t[0])
    # Teach durations: greps take 0.2 s, test runs 30 s.
    for i in range(20):
        for tool, cat, d in (("grep", "search", 0.2), ("pytest", "test", 30.0)):
            sid = f"w{i}{cat}"
            core.accept(LlmCallStart(sid, t[0]))
            core.accept(ToolCallStart(sid, t[0], tool, category=cat))
            core.accept(ToolCallEnd(sid, t[0] + d, tool))
            core.accept(LlmCallStart(sid, t[0] + d))  # the agent carries on after the tool
            core.accept(SessionEnd(sid, t[0] + d + 1))
    t[0] = 100.0
    for sid, tool, cat in (("fast", "grep", "search"), ("slow", "pytest", "test")):
        core.accept(SessionStart(sid, t[0]))
        core.accept(LlmCallStart(sid, t[0]))
        core.accept(LlmCallEnd(sid, t[0], prompt_tokens=8000, output_tokens=100))
        core.accept(ToolCallStart(sid, t[0], tool, category=cat))
    t[0] = 100.1
    k_fast = core.eviction_priority("fast", 8100, 100.0)
    k_slow = core.eviction_priority("slow", 8100, 100.0)
    k_lru = core.eviction_priority(None, 8100, 99.0)
    assert k_slow < k_lru < k_fast  # the 30 s test run is evicted first, the grep kept
    core.accept(SessionEnd("fast", t[0]))
    assert core.eviction_priority("fast", 8100, 100.0) < k_slow
