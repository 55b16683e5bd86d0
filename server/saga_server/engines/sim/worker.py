"""One simulated vLLM worker: its waiting queue, KV pool and host tier, and its batch
as a fluid.

Continuous batching between events: the batch is fixed, each iteration takes
`CostModel.step_s(decoding, prefill_chunk, context)`, every decoding request advances
one token per iteration and the prefill queue (FIFO) advances by the token budget left
after decodes (chunked prefill), each iteration priced with the chunk it runs.
Progress between events is analytic, so the cost is per event, not per iteration.
The simulator owns admission and what happens to a finished request; the worker
only keeps time.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

from .cache import PrefixCache
from .hardware import CostModel
from .host import HostTier
from .session import Request, Session

__all__ = ["Worker"]

_EPS = 1e-6


class Worker:
    __slots__ = ("wid", "cache", "host", "queue", "decoding", "prefilling", "prefill_total", "prefill_done",
                 "decode_clock", "context", "step_s", "prefill_rate", "at", "version", "busy", "running",
                 "link_free", "net_free", "live", "offloaded", "engine", "gated", "iterations", "prefill_cap",
                 "prefill_lag", "prefill_lag_s")

    def __init__(self, wid: int, cache: PrefixCache, host: HostTier | None) -> None:
        self.wid = wid
        self.cache = cache
        self.host = host
        self.queue: list[tuple[float, int, Request]] = []
        self.decoding: list[tuple[float, int, Request]] = []
        self.prefilling: deque[Request] = deque()
        self.prefill_total = self.prefill_done = 0.0
        self.decode_clock = 0.0
        self.context = 0.0
        self.step_s = 1.0
        self.prefill_rate = 0.0
        self.at = 0.0
        self.version = 0  # bumped on every replan: older worker events are stale
        self.busy = 0.0
        self.iterations = 0.0  # engine steps run (fluid: a fraction between events)
        self.running = 0  # admitted and not finished (loading, prefill or decode)
        self.link_free = 0.0
        self.net_free = 0.0  # when its NIC is free (KV moves between workers)
        self.live = 0  # live sessions placed here
        self.offloaded: set[str] = set()  # sessions with a host copy beyond their GPU prefix
        self.engine = None  # its EnginePolicy (set by the simulator): every KV and deadline decision
        self.gated: dict[str, Session] = {}  # sessions whose request waits for admission
        self.prefill_cap = 0  # > 0: prefill tokens per iteration for now (the shaper's budget)
        # Seconds the prefill chunks have added to one decoding request's iterations so
        # far (a clock: a request's share is its difference over its decode).
        self.prefill_lag = 0.0
        self.prefill_lag_s = 0.0  # what the current chunk adds to each iteration

    def advance(self, now: float) -> None:
        """Progress the batch to `now`."""
        dt = now - self.at
        if dt > 0.0 and (self.decoding or self.prefilling):
            iters = dt / self.step_s
            self.busy += dt
            self.iterations += iters
            self.decode_clock += iters
            self.prefill_lag += iters * self.prefill_lag_s
            if self.prefilling:
                self.prefill_done = min(self.prefill_total, self.prefill_done + iters * self.prefill_rate)
        self.at = now

    def take_finished(self) -> list[Request]:
        """Move prefilled requests to decoding and return those done (at `advance`'s time)."""
        prefilling, decoding = self.prefilling, self.decoding
        finished = []
        while prefilling and prefilling[0].prefill_end <= self.prefill_done + _EPS:
            r = prefilling.popleft()
            r.first_token_at = self.at
            r.prefill_lag_at = self.prefill_lag
            if r.output <= 1:
                finished.append(r)
            else:
                heapq.heappush(decoding, (self.decode_clock + r.output - 1, r.seq, r))
                self.context += r.context_weight
        if not prefilling:
            self.prefill_done = self.prefill_total  # absorb rounding
        while decoding and decoding[0][0] <= self.decode_clock + _EPS:
            r = heapq.heappop(decoding)[2]
            self.context -= r.context_weight
            finished.append(r)
        return finished

    def start_prefill(self, r: Request, ahead_of: int = 0) -> None:
        """Queue `r`'s prefill: last in line, or, with `ahead_of` = k > 0, ahead of all
        but the first k - 1 queued prefills (the deadline shaper's at-risk requests go
        first; the partly done head keeps its progress, only finishing later)."""
        if not self.prefilling:
            self.prefill_done = self.prefill_total
        work = max(r.work, _EPS)
        self.prefill_total += work
        prefilling = self.prefilling
        i = min(ahead_of - 1, len(prefilling)) if ahead_of > 0 else len(prefilling)
        r.prefill_end = (prefilling[i - 1].prefill_end if i > 0 else self.prefill_done) + work
        for later in itertools.islice(prefilling, i, None):
            later.prefill_end += work
        prefilling.insert(i, r)

    def replan(self, cost: CostModel) -> float | None:
        """Fix the batch until the next event; returns seconds until a request finishes
        prefill or decoding (None: the batch is empty)."""
        self.version += 1
        n = len(self.decoding)
        if not self.decoding and not self.prefilling:
            return None
        if self.prefilling:
            # The step runs its chunk whole: a prefill shorter than the budget still
            # takes the full (cheaper) iteration, not a fraction of a budget-sized one.
            budget = min(cost.token_budget, self.prefill_cap) if self.prefill_cap > 0 else cost.token_budget
            chunk = min(max(budget - n, cost.block_tokens), self.prefill_total - self.prefill_done)
            rate = max(chunk, _EPS)
        else:
            rate = chunk = 0.0
        step_s = cost.step_s(n, chunk, self.context)
        self.step_s, self.prefill_rate = step_s, rate
        self.prefill_lag_s = step_s - cost.step_s(n, 0.0, self.context) if chunk else 0.0
        dt = math.inf
        if self.decoding:
            dt = (self.decoding[0][0] - self.decode_clock) * step_s
        if self.prefilling:
            dt = min(dt, (self.prefilling[0].prefill_end - self.prefill_done) / rate * step_s)
        # At least a nanosecond (and a few ulps of the clock): a step below the clock's
        # resolution would not move time, and the batch would spin in place.
        return max(dt, 1e-9, self.at * 1e-14)
