"""LogHistogram: quantiles within the bucket error, conditional tails, bounded."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_server.core import LogHistogram


def test_quantiles_of_a_lognormal_within_bucket_error() -> None:
    rng = random.Random(0)
    xs = sorted(0.3 * math.exp(1.5 * rng.gauss(0, 1)) for _ in range(3000))
    h = LogHistogram()
    for x in xs:
        h.add(x)
    for q in (0.1, 0.5, 0.9, 0.99):
        exact = xs[int(q * len(xs))]
        assert h.quantile(q) == pytest.approx(exact, rel=0.1)
    assert h.mean() == pytest.approx(sum(xs) / len(xs), rel=1e-9)


def test_conditional_tail_of_an_exponential_is_memoryless() -> None:
    rng = random.Random(1)
    h = LogHistogram(max_weight=1e9)
    for _ in range(20000):
        h.add(rng.expovariate(1 / 5.0))
    assert h.quantile_above(0.5, 5.0) - 5.0 == pytest.approx(h.quantile(0.5), rel=0.1)
    assert h.mean_above(5.0) - 5.0 == pytest.approx(5.0, rel=0.1)


def test_weight_is_bounded_and_follows_drift() -> None:
    h = LogHistogram(max_weight=100)
    for _ in range(1000):
        h.add(1.0)
    for _ in range(300):
        h.add(50.0)
    assert h.weight <= 100 and h.samples == 1300
    assert h.quantile(0.5) == pytest.approx(50.0, rel=0.1)


def test_empty_and_bad_input() -> None:
    h = LogHistogram()
    assert math.isnan(h.quantile(0.5)) and math.isnan(h.mean())
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            h.add(bad)
    assert h.samples == 0
    with pytest.raises(ValueError):
        LogHistogram(ratio=1.0)


@settings(max_examples=100, deadline=None)
@given(xs=st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=1, max_size=200),
       q1=st.floats(0, 1), q2=st.floats(0, 1), el=st.floats(0, 1e4))
def test_quantiles_are_monotone_and_within_range(xs, q1, q2, el) -> None:
    h = LogHistogram()
    for x in xs:
        h.add(x)
    lo, hi = min(q1, q2), max(q1, q2)
    assert min(xs) - 1e-9 <= h.quantile(lo) <= h.quantile(hi) <= max(xs) + 1e-9
    assert h.quantile_above(lo, el) >= el - 1e-9
    assert h.quantile_above(lo, el) <= h.quantile_above(hi, el) + 1e-9
    assert h.mean_above(el) >= el - 1e-9
