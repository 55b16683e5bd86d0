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
    __slots__ = ("wid", "cache", "host", "queue", "dec", "pf", "pf_total", "pf_done",
                 "dec_clock", "ctx", "tau", "pf_rate", "t", "version", "busy", "running",
                 "link_free", "net_free", "live", "offloaded", "engine", "gated", "iterations", "pf_cap")

    def __init__(self, wid: int, cache: PrefixCache, host: HostTier | None) -> None:
        self.wid = wid
        self.cache = cache
        self.host = host
        self.queue: list[tuple[float, int, Request]] = []
        self.dec: list[tuple[float, int, Request]] = []
        self.pf: deque[Request] = deque()
        self.pf_total = self.pf_done = 0.0
        self.dec_clock = 0.0
        self.ctx = 0.0
        self.tau = 1.0
        self.pf_rate = 0.0
        self.t = 0.0
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
        self.pf_cap = 0  # > 0: prefill tokens per iteration for now (the shaper's budget)

    def advance(self, now: float) -> None:
        """Progress the batch to `now`."""
        dt = now - self.t
        if dt > 0.0 and (self.dec or self.pf):
            iters = dt / self.tau
            self.busy += dt
            self.iterations += iters
            self.dec_clock += iters
            if self.pf:
                self.pf_done = min(self.pf_total, self.pf_done + iters * self.pf_rate)
        self.t = now

    def take_finished(self) -> list[Request]:
        """Move prefilled requests to decoding and return those done (at `advance`'s time)."""
        pf, dec = self.pf, self.dec
        finished = []
        while pf and pf[0].pf_end <= self.pf_done + _EPS:
            r = pf.popleft()
            r.first_token_at = self.t
            if r.output <= 1:
                finished.append(r)
            else:
                heapq.heappush(dec, (self.dec_clock + r.output - 1, r.seq, r))
                self.ctx += r.ctx_weight
        if not pf:
            self.pf_done = self.pf_total  # absorb rounding
        while dec and dec[0][0] <= self.dec_clock + _EPS:
            r = heapq.heappop(dec)[2]
            self.ctx -= r.ctx_weight
            finished.append(r)
        return finished

    def start_prefill(self, r: Request, ahead_of: int = 0) -> None:
        """Queue `r`'s prefill: last in line, or, with `ahead_of` = k > 0, ahead of all
        but the first k - 1 queued prefills (the deadline shaper's at-risk requests go
        first; the partly done head keeps its progress, only finishing later)."""
        if not self.pf:
            self.pf_done = self.pf_total
        work = max(r.work, _EPS)
        self.pf_total += work
        pf = self.pf
        i = min(ahead_of - 1, len(pf)) if ahead_of > 0 else len(pf)
        r.pf_end = (pf[i - 1].pf_end if i > 0 else self.pf_done) + work
        for later in itertools.islice(pf, i, None):
            later.pf_end += work
        pf.insert(i, r)

    def replan(self, cost: CostModel) -> float | None:
        """Fix the batch until the next event; returns seconds until a request finishes
        prefill or decoding (None: the batch is empty)."""
        self.version += 1
        n = len(self.dec)
        if not self.dec and not self.pf:
            return None
        if self.pf:
            # The step runs its chunk whole: a prefill shorter than the budget still
            # takes the full (cheaper) iteration, not a fraction of a budget-sized one.
            budget = min(cost.token_budget, self.pf_cap) if self.pf_cap > 0 else cost.token_budget
            chunk = min(max(budget - n, cost.block_tokens), self.pf_total - self.pf_done)
            rate = max(chunk, _EPS)
        else:
            rate = chunk = 0.0
        tau = cost.step_s(n, chunk, self.ctx)
        self.tau, self.pf_rate = tau, rate
        dt = math.inf
        if self.dec:
            dt = (self.dec[0][0] - self.dec_clock) * tau
        if self.pf:
            dt = min(dt, (self.pf[0].pf_end - self.pf_done) / rate * tau)
        # At least a nanosecond (and a few ulps of the clock): a step below the clock's
        # resolution would not move time, and the batch would spin in place.
        return max(dt, 1e-9, self.t * 1e-14)
