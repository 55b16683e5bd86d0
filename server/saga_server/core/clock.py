"""`ManualClock`: a clock that moves only when told to, for simulated time.

Everything in the core takes an injected `clock: Callable[[], float]` (default
`time.monotonic`). Tests, trace replays and benchmarks pass a `ManualClock`
instead and drive time themselves (`clock.t = 5.0`, `clock.t += dt`);
`clock()` reads it.
"""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """A callable clock reading `t` (seconds, 0.0 unless given)."""

    __slots__ = ("t",)

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def __repr__(self) -> str:
        return f"ManualClock(t={self.t!r})"
