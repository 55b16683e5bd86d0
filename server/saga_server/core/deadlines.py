"""Deadline-aware shaping: slack-rich sessions give way while an at-risk one is served.

Why ordering is not enough. A batching engine runs nearly every waiting request in
the next iterations whatever the queue's order, so an urgency-first order (Agent Fair
Share, `fairshare`) changes little once the batch has room. What slows an urgent
request is the rest of the batch: every other request's prefill tokens share each
iteration's token budget, and a chunk of prefill makes the iteration, and so every
decode in it, many times longer. What decides a tight deadline under load is
therefore how much of each iteration the sessions that can afford to wait take while
an urgent one runs.

Classes. A session with a deadline has urgency u = (its expected remaining time at
its current pace, from the AEG) / (time left to its deadline), as in `fairshare`, and
an upper urgency u+ by the `confidence` quantile of its remaining time instead of
its mean (`AEG.remaining`):

- *at risk*: u >= `at_risk` (at its pace it finishes too close to, or after, its
  deadline);
- *slack-rich*: u+ <= `slack_rich` (with probability `confidence` it could go
  1/`slack_rich` times slower and still finish in time). Judged by the quantile,
  not the mean: a session's remaining length is a prediction from its workflow's
  finished sessions, and a long task looks short on the mean early on, so the mean
  would hold exactly the sessions whose slack is not there;
- otherwise, for every session without a deadline, and for one already past its
  deadline (holding others back can no longer bring it in time), *normal*.

Rule. An at-risk request lacks one of three things: a place in the batch (a slot
or KV), prefill budget, or fast steps. Each is taken from the sessions that can
afford to give it.

1. *Hold.* A request of a slack-rich session that is not scheduled yet stays
   waiting (keeping its place in the queue), taking no batch slot, no KV and no
   prefill budget, while on the same engine
   - a request of an at-risk session waits to be scheduled (batch slots, KV or
     budget are short), or
   - a request of an at-risk session of *another tenant* runs: every request
     scheduled beside it lengthens each of its decode steps (the batch's context
     is read every step, and prefill chunks ride in the same steps), and where a
     tenant with long contexts shares an engine with a tight one, decoding in a
     full batch is most of what the tight tenant's missed tasks lost (the miss
     split of `sim_deadlines.py`). Within one tenant only a waiting at-risk
     request holds: the tenant's sessions share one virtual queue, whose urgency
     order already serves its at-risk request first, and holding its own
     slack-rich sessions while the at-risk one decodes trades the tenant's
     deadlines against each other on a predicted class (measured: more turns
     lost than saved).
   Requests already running are left alone (preempting them would throw away
   their progress). Held requests go ahead as soon as neither holds, or their
   own session stops being slack-rich. Normal sessions are never held: a session
   without a deadline states no slack.
2. *Thin prefill.* While a request of an at-risk session waits or runs there, an
   iteration whose first prefill in line is not an at-risk request's runs a thin
   budget of prefill: the larger of `prefill_budget_tokens`, the engine's piggyback
   budget (the prefill whose compute takes as long as a decode iteration's pass
   over the weights, so it rides on the iteration without lengthening it; a CPU
   engine, which adds every token's cost to the step, gets one block), and twice
   the prefill arriving per iteration (`DRAIN_FACTOR`). An at-risk request's
   prefill goes ahead of the others' where the engine can reorder prefill, and
   runs at the engine's full budget. Why the floor: below the rate at which
   prefill work arrives, the line of waiting prefills grows for as long as
   someone is at risk, every session in it falls behind and turns at risk in its
   turn, and shaping feeds on itself; at twice that rate the line keeps up, and
   a backlog drains in about the time it took to build. Prefill work is
   conserved; only its latency grows, and only while someone is at risk.

Bound. A held session stays slack-rich only while its time left exceeds
remaining+ / `slack_rich` (remaining+: the `confidence` quantile of its remaining
time), and urgency only grows while it waits (time left shrinks, remaining does
not), so holding ends by the time its time left has fallen to 1/`slack_rich` times
remaining+ (about 2.9x with the default): holding alone never makes it miss, unless
it is longer than nine in ten of its workflow's sessions that ran as far (with the
default `confidence`), or its pace afterwards is that much slower than the pace it
has had. The tenant's share is unchanged: held service is owed in
the tenant's virtual queue (`fairshare`), so its requests rank higher once they run;
the fair-share bound B of `fairshare` holds with each held stretch added to the
service gap it allows. Where nothing is at risk, nothing is held: shaping is a no-op
on an engine that meets its deadlines.

`DeadlineShaper` is one engine's bookkeeping (which of its requests are at risk);
the classes come from `WorkflowCore.deadline_class`. The simulator and the vLLM
plugin each own one per engine. Not thread-safe: owned by one engine loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

__all__ = ["ShapingConfig", "DeadlineShaper", "deadline_class", "AT_RISK", "SLACK_RICH", "NORMAL",
           "DRAIN_FACTOR"]

AT_RISK, SLACK_RICH, NORMAL = "at_risk", "slack_rich", "normal"

# The thin budget's floor, as a multiple of the prefill arriving per iteration (rule 2).
DRAIN_FACTOR = 2.0
# The window (seconds) of the prefill arrival rate: a few agent steps, so the rate
# follows the load, not each burst.
_RATE_WINDOW_S = 30.0


@dataclass(frozen=True, slots=True)
class ShapingConfig:
    enabled: bool = True
    at_risk: float = 0.7  # urgency at or above which a session is at risk
    slack_rich: float = 0.35  # urgency at or below which a session with a deadline may be held
    # The probability with which a slack-rich session's remaining time stays within
    # the length its slack is judged by (the AEG's quantile of it).
    confidence: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 < self.slack_rich < self.at_risk:
            raise ValueError("need 0 < slack_rich < at_risk")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError("need 0 < confidence < 1")


def deadline_class(u: float | None, config: ShapingConfig, u_upper: float | None = None) -> str:
    """The class of a session with urgency `u` (None: it has no deadline); `u_upper`:
    its urgency by the `confidence` quantile of its remaining time (None: `u`)."""
    if u is None or not config.enabled:
        return NORMAL
    if u >= config.at_risk:
        return AT_RISK
    return SLACK_RICH if (u if u_upper is None else max(u, u_upper)) <= config.slack_rich else NORMAL


class DeadlineShaper:
    """One engine's at-risk requests and the hold rule (module docstring)."""

    __slots__ = ("_classify", "_at_risk", "_waiting", "_tenants", "held", "_budget", "_rate", "_rate_at")

    def __init__(self, classify: Callable[[str], str], *, prefill_budget_tokens: int) -> None:
        """`classify(session_id)`: the session's class now (`WorkflowCore.deadline_class`);
        `prefill_budget_tokens`: the engine's piggyback budget (rule 2), > 0."""
        if prefill_budget_tokens <= 0:
            raise ValueError("prefill_budget_tokens must be > 0")
        self._classify = classify
        self._budget = prefill_budget_tokens
        self._at_risk: dict[object, str] = {}  # request key -> its tenant
        self._waiting: set[object] = set()  # of those, not scheduled yet
        self._tenants: dict[str, int] = {}  # tenant -> its at-risk requests here
        self._rate = 0.0  # prefill tokens arriving per second (an exponential moving average)
        self._rate_at: float | None = None
        self.held = 0  # times a request was held back (a request counts once per check)

    def arrived(self, request_key: object, session_id: str, tenant: str = "") -> str:
        """A request of `tenant` reached the engine; returns its session's class then."""
        cls = self._classify(session_id)
        if cls == AT_RISK and request_key not in self._at_risk:
            self._at_risk[request_key] = tenant
            self._tenants[tenant] = self._tenants.get(tenant, 0) + 1
            self._waiting.add(request_key)
        return cls

    def scheduled(self, request_key: object) -> None:
        """The engine took the request into its batch (idempotent)."""
        self._waiting.discard(request_key)

    def finished(self, request_key: object) -> None:
        """The request finished or left the engine (idempotent)."""
        self._waiting.discard(request_key)
        if request_key not in self._at_risk:
            return
        tenant = self._at_risk.pop(request_key)
        left = self._tenants[tenant] - 1
        if left:
            self._tenants[tenant] = left
        else:
            del self._tenants[tenant]

    def at_risk(self) -> int:
        """Requests of at-risk sessions waiting or running here."""
        return len(self._at_risk)

    def urgent(self, request_key: object) -> bool:
        """Whether the request is an at-risk session's: its prefill goes first."""
        return request_key in self._at_risk

    def prefill_queued(self, tokens: int, now: float) -> None:
        """A request was scheduled with `tokens` of prefill to compute (cache hits and
        loaded KV excluded); `now` on any monotonic clock, seconds."""
        if self._rate_at is not None and now > self._rate_at:
            self._rate *= math.exp((self._rate_at - now) / _RATE_WINDOW_S)
        self._rate_at = now if self._rate_at is None else max(now, self._rate_at)
        self._rate += tokens / _RATE_WINDOW_S

    def prefill_budget(self, prefilling: object | None, step_s: float) -> int:
        """Prefill tokens the next iteration may run (0: the engine's own budget),
        given the request whose prefill is first in line (None: none) and the
        seconds an iteration takes now with no prefill, or a thin one (the arrival
        rate is as of the last `prefill_queued`: with none since, the line is short
        and a stale rate only drains it sooner)."""
        if not self._at_risk or prefilling is None or prefilling in self._at_risk:
            return 0
        return max(self._budget, math.ceil(DRAIN_FACTOR * self._rate * step_s))

    def holds_back(self, request_key: object, session_id: str, tenant: str = "") -> bool:
        """Whether this request of this session and tenant waits now instead of being
        scheduled (rule 1). A request counted at risk is never held, even if its
        session has since turned slack-rich: it would wait on itself."""
        if not self._at_risk or request_key in self._at_risk:
            return False
        if not self._waiting and (len(self._tenants) == 1 and tenant in self._tenants):
            return False  # only its own tenant's at-risk requests, and they all run
        if self._classify(session_id) != SLACK_RICH:
            return False
        self.held += 1
        return True
