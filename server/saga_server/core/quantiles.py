"""Streaming duration distribution: a deterministic log-bucket histogram.

Tool durations span five decades (0.2 s greps, 60 s test runs), so buckets grow
geometrically: relative error per quantile is bounded by the bucket ratio
(default 1.15, i.e. within ~7% after geometric interpolation) at any scale, with
a fixed ~120 floats of memory per estimator and O(1) updates. Counts decay by
half once their total passes `max_weight`, so the estimator follows drift in a
workload without growing, and the result depends only on the order of samples
(no sampling, no RNG).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from functools import lru_cache
from itertools import accumulate

__all__ = ["LogHistogram"]


class LogHistogram:
    """Quantiles, mean and conditional ("given it already ran `elapsed`") tails.

    Bucket 0 holds [0, lo); bucket i >= 1 holds [lo*r^(i-1), lo*r^i); the last
    bucket also takes everything above `hi`. Quantiles interpolate geometrically
    inside a bucket and are clamped to the smallest/largest value seen.
    """

    __slots__ = (
        "_lo", "_logr", "_r", "_n", "_counts", "_total", "_sum", "_min", "_max",
        "_max_weight", "_cum", "_tail_sum", "_dirty", "samples",
    )

    def __init__(self, lo: float = 1e-3, hi: float = 4 * 3600.0, ratio: float = 1.15,
                 max_weight: float = 4096.0) -> None:
        if not (0 < lo < hi) or ratio <= 1.0 or max_weight < 2:
            raise ValueError("need 0 < lo < hi, ratio > 1 and max_weight >= 2")
        self._lo = lo
        self._r = ratio
        self._logr = math.log(ratio)
        self._n = int(math.ceil(math.log(hi / lo) / self._logr)) + 2
        self._counts = [0.0] * self._n
        self._total = 0.0
        self._sum = 0.0
        self._min = math.inf
        self._max = 0.0
        self._max_weight = max_weight
        self._cum: list[float] = []
        self._tail_sum: list[float] = []
        self._dirty = True
        self.samples = 0  # samples ever added (not decayed): "how much evidence"

    # -- updates ----------------------------------------------------------------

    def add(self, x: float) -> None:
        if not x >= 0.0 or x == math.inf:  # also rejects NaN
            raise ValueError(f"duration must be finite and >= 0, got {x!r}")
        self._counts[self._index(x)] += 1.0
        self._total += 1.0
        self._sum += x
        self.samples += 1
        if x < self._min:
            self._min = x
        if x > self._max:
            self._max = x
        if self._total > self._max_weight:
            self._counts = [c * 0.5 for c in self._counts]
            self._total *= 0.5
            self._sum *= 0.5
        self._dirty = True

    # -- learnt state (`WorkflowGraphs.learnt`) ------------------------------------

    def state(self) -> dict:
        """What it learnt, as plain JSON-able data (its bucket layout, sparse counts)."""
        return {"lo": self._lo, "r": self._r, "n": self._n, "max_weight": self._max_weight,
                "counts": {str(i): c for i, c in enumerate(self._counts) if c},
                "total": self._total, "sum": self._sum, "min": self._min if self._total else None,
                "max": self._max, "samples": self.samples}

    @classmethod
    def from_state(cls, data: dict) -> "LogHistogram":
        """The histogram `state()` described; ValueError if `data` is not one."""
        if not isinstance(data, dict):
            raise ValueError("a histogram is an object")
        h = cls.__new__(cls)
        h._lo, h._r, h._max_weight = _positive(data, "lo"), _positive(data, "r"), _positive(data, "max_weight")
        n = data.get("n")
        if h._r <= 1.0 or not isinstance(n, int) or not 2 <= n <= 100_000:
            raise ValueError("bad histogram layout")
        h._n, h._logr = n, math.log(h._r)
        counts = data.get("counts")
        if not isinstance(counts, dict):
            raise ValueError("histogram counts must be an object")
        h._counts = [0.0] * n
        for key, c in counts.items():
            i = int(key)
            if not 0 <= i < n:
                raise ValueError(f"histogram bucket {i} out of range")
            h._counts[i] = _non_negative(c)
        h._total, h._sum, h._max = (_non_negative(data.get(k)) for k in ("total", "sum", "max"))
        h._min = math.inf if data.get("min") is None else _non_negative(data.get("min"))
        samples = data.get("samples")
        if not isinstance(samples, int) or samples < 0:
            raise ValueError("histogram samples must be an int >= 0")
        h.samples = samples
        h._cum, h._tail_sum, h._dirty = [], [], True
        return h

    # -- reads ------------------------------------------------------------------

    @property
    def weight(self) -> float:
        return self._total

    def mean(self) -> float:
        return self._sum / self._total if self._total else math.nan

    def quantile(self, q: float) -> float:
        return self.quantile_above(q, 0.0)

    def cdf(self, x: float) -> float:
        if not self._total:
            return math.nan
        self._refresh()
        return self._cdf(x)

    def quantile_above(self, q: float, elapsed: float) -> float:
        """The q-quantile of the *total* duration D given D > elapsed (>= elapsed)."""
        if not self._total:
            return math.nan
        self._refresh()
        lo_f = self._cdf(elapsed) if elapsed > 0 else 0.0
        if lo_f >= 1.0:
            # Already past everything we have seen: the best guess is "about now".
            return elapsed
        target = (lo_f + min(max(q, 0.0), 1.0) * (1.0 - lo_f)) * self._total
        x = self._inverse(target)
        return max(x, elapsed)

    def mean_above(self, elapsed: float) -> float:
        """E[D | D > elapsed], from bucket representatives (exact mean if elapsed <= 0)."""
        if not self._total:
            return math.nan
        if elapsed <= 0:
            return self.mean()
        self._refresh()
        i = self._index(elapsed)
        # Mass in i's upper part is taken at the midpoint of [elapsed, upper edge].
        below = self._cum[i - 1] if i else 0.0
        c = self._counts[i]
        lo_e, hi_e = self._edges(i)
        frac_above = 1.0 if hi_e <= lo_e else max(0.0, (hi_e - elapsed) / (hi_e - lo_e))
        mass_i = c * frac_above
        rest = self._total - below - c
        mass = mass_i + rest
        if mass <= 1e-12:
            return elapsed
        tail = self._tail_sum[i + 1] if i + 1 < self._n else 0.0
        s = mass_i * 0.5 * (elapsed + min(hi_e, self._max if self._max > elapsed else hi_e)) + tail
        return max(s / mass, elapsed)

    # -- internals --------------------------------------------------------------

    def _index(self, x: float) -> int:
        if x < self._lo:
            return 0
        i = int(math.log(x / self._lo) / self._logr) + 1
        return i if i < self._n else self._n - 1

    def _edges(self, i: int) -> tuple[float, float]:
        if i == 0:
            return 0.0, self._lo
        lo_e = self._lo * self._r ** (i - 1)
        return lo_e, lo_e * self._r

    def _refresh(self) -> None:
        # On the hot path (a read after every new sample): C-level accumulations over
        # the buckets, same sums in the same order as a plain loop.
        if not self._dirty:
            return
        counts = self._counts
        self._cum = list(accumulate(counts))
        lo, hi = self._min, self._max
        weighted = [c * (lo if rep < lo else hi if rep > hi else rep) if c else 0.0
                    for c, rep in zip(counts, _representatives(self._lo, self._r, self._n))]
        tail = list(accumulate(reversed(weighted)))
        tail.reverse()
        tail.append(0.0)
        self._tail_sum = tail
        self._dirty = False

    def _cdf(self, x: float) -> float:
        i = self._index(x)
        below = self._cum[i - 1] if i else 0.0
        lo_e, hi_e = self._edges(i)
        frac = 1.0 if x >= hi_e else max(0.0, (x - lo_e) / (hi_e - lo_e))
        return min(1.0, (below + self._counts[i] * frac) / self._total)

    def _inverse(self, target: float) -> float:
        i = bisect_left(self._cum, target)
        if i >= self._n:
            i = self._n - 1
        below = self._cum[i - 1] if i else 0.0
        c = self._counts[i]
        frac = 0.0 if c <= 0 else min(max((target - below) / c, 0.0), 1.0)
        lo_e, hi_e = self._edges(i)
        if i == 0:
            x = hi_e * frac
        else:
            x = lo_e * (self._r ** frac)
        return min(max(x, self._min), self._max)


@lru_cache(maxsize=64)
def _representatives(lo: float, r: float, n: int) -> tuple[float, ...]:
    """Each bucket's representative value (geometric middle; half of `lo` for the
    first), before clamping to what was seen: fixed by the layout, so computed once."""
    reps = []
    for i in range(n):
        lo_e, hi_e = (0.0, lo) if i == 0 else (lo * r ** (i - 1), lo * r ** (i - 1) * r)
        reps.append(math.sqrt(lo_e * hi_e) if lo_e > 0 else hi_e * 0.5)
    return tuple(reps)


def _non_negative(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < math.inf:
        raise ValueError(f"expected a finite number >= 0, got {value!r}")
    return float(value)


def _positive(data: dict, key: str) -> float:
    value = _non_negative(data.get(key))
    if value <= 0.0:
        raise ValueError(f"{key} must be > 0")
    return value
