"""`EnginePolicy`: SAGA's side of one engine, behind one event API.

An engine (the vLLM plugin, a simulated worker) reports here what happened to its
requests and to its agents' tools, and applies what comes back; it decides nothing
itself and never calls the parts below in an order of its own. The object owns the
engine's KV policy (`kv_policy.SessionKvPolicy`, with the hold ledger and session
admission), its deadline shaper (`deadlines`), and the one table of the engine's live
requests (`LiveRequest`, keyed by the engine's request key: any hashable, unique
among the engine's live requests).

The facts, in the order a request meets them, and what each does, in this order:

| fact | what happens |
|---|---|
| `arrived(request)` | the table keeps it; the core learns a request of the session reached the engine (`WorkflowCore.on_request_arrival`); its tenant becomes the one it counts for (`WorkflowCore.request_tenant`: a request that names none is its session's) |
| `queued(key, need, at)` | admission learns its KV need (`SessionKvPolicy.arrived`); True: it may be scheduled, and the shaper counts it; False: it waits at the admission gate |
| `admitted(key)` | a request that waited at the gate may be scheduled now: the shaper counts it (`tick` does this for the sessions its plan admits) |
| `left(key)` / `joined(request)` | the request moves with its session to another engine: this one forgets it, that one keeps it until its KV lands (then `queued` or `admitted`) |
| `scheduled(key, held, hit, prefill, now)` | the shaper sees it leave the line and counts its prefill; the session's hold goes back to the engine |
| `served(tenant, tokens, session)` | its tenant's fair share counts the service (with AFS) |
| `finished(key, blocks, now, output)` | the shaper forgets it; the core learns it finished; its cached prefix becomes the session's hold; the table drops it |
| `tool_started` / `tool_ended` | the session's hold is re-keyed and its pin decided again |
| `tick(now)` | forget the sessions the core let go, demote expired pins, carry out admission's plan (an engine that steps calls it each step; an event-driven one calls `plan` where admission may change) |
| `need_room(free, spare)` | held KV goes back in the ledger's order until `free` blocks are free |

And what the engine asks: `may_schedule` (admission, then the deadline hold), `rank`
(the waiting queue's order, `WorkflowCore.request_rank`), `urgent` and
`prefill_budget` (the shaper's thin prefill). Facts that concern only a session's KV
(`loaded`, `moved`, `room_for_move`, pins' expiry, the core's lifecycle) pass to the
KV policy unchanged.

Without a core (a simulated baseline), nothing is reported to a core, no service is
counted, and `rank` is not asked (the simulator orders a baseline's queue by its own
rule). Not thread-safe: owned by one engine loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

from .admission import AdmissionPlan
from .deadlines import DeadlineShaper
from .holds import Hold, HoldLedger, Release
from .kv_policy import KvRules, SessionKvPolicy
from .mechanisms import ALL_MECHANISMS, Mechanism

__all__ = ["EnginePolicy", "LiveRequest"]


@dataclass(slots=True)
class LiveRequest:
    """What the engine knows of one of its live requests."""

    key: Hashable
    session_id: str | None
    tenant: str = ""
    prompt_tokens: int = 0
    arrived_at: float = 0.0  # the engine's clock
    cache_ttl_s: float | None = None  # how long its client asks its prompt kept (`pinning`)
    priority_jump_s: float = 0.0  # queued as if it arrived this much earlier (`fairshare`)
    context_tokens: int | None = None  # the session's KV context as it arrived; None once scheduled
    gated: bool = False  # not schedulable here yet: at the admission gate, or its KV is moving in
    meta: Any = None  # the engine's own record of it


class EnginePolicy:
    def __init__(self, ledger: HoldLedger, rules: KvRules, *, block_tokens: int, core=None,
                 mechanisms: frozenset[Mechanism] = ALL_MECHANISMS,
                 admission: Callable | None = None, shaper: DeadlineShaper | None = None,
                 protect_queued: bool = True, release_garbage: bool = True,
                 count: Callable[[str, str], None] | None = None) -> None:
        """`ledger`, `rules`, `block_tokens`, `core`, `admission`, `protect_queued`,
        `release_garbage` and `count`: the KV policy's (`SessionKvPolicy`); `shaper`:
        the engine's deadline shaper (None: no shaping); `mechanisms`: which run (AFS
        decides whether service is counted and requests ranked)."""
        self.core = core
        self.kv = SessionKvPolicy(ledger, rules, block_tokens=block_tokens, core=core, admission=admission,
                                  protect_queued=protect_queued, release_garbage=release_garbage, count=count)
        self.shaper = shaper
        self.ranks = core is not None and Mechanism.AFS in mechanisms
        self.requests: dict[Hashable, LiveRequest] = {}
        self._count = count or _no_count

    @property
    def admission(self):
        return self.kv.admission

    @property
    def ledger(self) -> HoldLedger:
        return self.kv.ledger

    # -- facts ---------------------------------------------------------------------------

    def arrived(self, request: LiveRequest) -> None:
        self.requests[request.key] = request
        if request.session_id is not None and self.core is not None:
            self.core.on_request_arrival(request.session_id, request.prompt_tokens, request.tenant,
                                         cache_ttl_s=request.cache_ttl_s)
            # A request that names no tenant (or one its session's owner overrides)
            # counts for its session's: the shaper's cross-tenant hold must see the
            # tenants the hints declared, as fair share does.
            request.tenant = self.core.request_tenant(request.session_id, request.tenant)

    def queued(self, key: Hashable, need_tokens: int, at: float, reusable_tokens: int | None = None) -> bool:
        """The request joins the engine's queue at `at`, needing `need_tokens` of KV
        (prompt + output) and continuing `reusable_tokens` of the session's held KV
        (None: unknown). Requests without a session always may run."""
        r = self.requests[key]
        if r.session_id is None:
            return True
        may = self.kv.arrived(r.session_id, key, need_tokens, at, r.tenant, reusable_tokens=reusable_tokens)
        r.gated = not may
        if may and self.shaper is not None:
            self.shaper.arrived(key, r.session_id, r.tenant)
        return may

    def admitted(self, key: Hashable) -> None:
        r = self.requests.get(key)
        if r is None or not r.gated:
            return
        r.gated = False
        if self.shaper is not None:
            self.shaper.arrived(key, r.session_id, r.tenant)

    def scheduled(self, key: Hashable, held_tokens: int, hit_tokens: int, prefill_tokens: int,
                  now: float) -> None:
        """The engine took the request into its batch with `hit_tokens` found of the
        `held_tokens` of KV its session had computed before, and `prefill_tokens` to
        compute."""
        if self.shaper is not None:
            self.shaper.scheduled(key)
            self.shaper.prefill_queued(prefill_tokens, now)
        r = self.requests.get(key)
        if r is None or r.session_id is None:
            return
        r.context_tokens = None
        self.kv.scheduled(r.session_id, held_tokens, hit_tokens)

    def served(self, tenant: str, tokens: int, session_id: str = "") -> None:
        if self.ranks:
            self.core.record_service(tenant, tokens, session_id)

    def finished(self, key: Hashable, blocks: Sequence, now: float, output_tokens: int,
                 owner: str = "") -> Hold | None:
        """The request finished; `blocks`: its cached prefix (prefix order; empty when
        nothing was cached). Returns its session's new hold."""
        r = self.requests.pop(key, None)
        if self.shaper is not None:
            self.shaper.finished(key)
        if r is None or r.session_id is None:
            return None
        if self.core is not None:
            self.core.on_request_finished(r.session_id, r.prompt_tokens, output_tokens)
        return self.kv.finished(r.session_id, key, blocks, now, owner=owner)

    def left(self, key: Hashable) -> LiveRequest | None:
        """The request leaves for another engine with its session (`joined` there): the
        table and the shaper let it go. Returns it (None: not here)."""
        r = self.requests.pop(key, None)
        if r is not None and self.shaper is not None:
            self.shaper.finished(key)
        return r

    def joined(self, request: LiveRequest) -> None:
        """A request that left another engine, kept here while its session's KV moves
        in (the engine keeps it out of its queue); the shaper counts it once `queued`
        (it still meets the gate) or `admitted` (it was queued there) lets it run."""
        request.gated = True
        self.requests[request.key] = request

    def tool_started(self, session_id: str, now: float) -> Hold | None:
        return self.kv.tool_started(session_id, now)

    def tool_ended(self, session_id: str, now: float) -> None:
        self.kv.tool_ended(session_id, now)

    def tick(self, now: float) -> AdmissionPlan:
        plan = self.kv.tick(now)
        if plan.admit:
            admitted = set(plan.admit)
            for key in [k for k, r in self.requests.items() if r.gated and r.session_id in admitted]:
                self.admitted(key)
        return plan

    def plan(self) -> AdmissionPlan:
        return self.kv.plan()

    def need_room(self, free_target: int, *, spare: str | None = None) -> list[Release]:
        return self.kv.make_room(free_target, spare=spare)

    # -- what the engine asks --------------------------------------------------------------

    def may_schedule(self, key: Hashable) -> bool:
        """Whether the waiting queue may offer the request now: without a session
        always; else once admission has admitted its session and no deadline hold
        keeps it back."""
        r = self.requests.get(key)
        sid = r.session_id if r is not None else None
        if not self.kv.may_run(sid):
            return False
        return sid is None or not self.holds_back(key)

    def holds_back(self, key: Hashable) -> bool:
        """Whether the deadline rule keeps this queued request waiting now (counted)."""
        r = self.requests.get(key)
        if self.shaper is None or r is None or not self.shaper.holds_back(key, r.session_id, r.tenant):
            return False
        self._count("deadline", "held")
        return True

    def rank(self, key: Hashable, now: float) -> tuple[float, float]:
        """The request's place in the waiting queue (lower first; `WorkflowCore.request_rank`).
        A request without a session competes as its tenant and as a task that started
        on arrival, so it is neither starved nor favoured."""
        r = self.requests.get(key)
        if r is None:
            return self.core.request_rank("", "", now)
        return self.core.request_rank(r.session_id or "", r.tenant, r.arrived_at,
                                      priority_jump_s=r.priority_jump_s)

    def urgent(self, key: Hashable) -> bool:
        return self.shaper is not None and self.shaper.urgent(key)

    def at_risk(self) -> int:
        return self.shaper.at_risk() if self.shaper is not None else 0

    def prefill_budget(self, first_in_line: Hashable | None, step_s: float) -> int:
        """Prefill tokens the next step may run (0: the engine's own budget)."""
        return self.shaper.prefill_budget(first_in_line, step_s) if self.shaper is not None else 0

    def table_sizes(self) -> dict[str, int]:
        """Entries of every per-session or per-request table it keeps (all bounded by
        the requests' and the sessions' lifecycles)."""
        return {**self.kv.table_sizes(), "live_requests": len(self.requests)}

    # -- a session's KV alone ------------------------------------------------------------

    def loaded(self, session_id: str, now: float, **kwargs) -> None:
        self.kv.loaded(session_id, now, **kwargs)

    def moved(self, session_id: str) -> None:
        self.kv.moved(session_id)

    def room_for_move(self, free_target: int) -> list[Release]:
        return self.kv.room_for_move(free_target)

    def expire_pins(self, now: float) -> list[str]:
        return self.kv.expire_pins(now)

    def follow_core(self, now: float) -> list[Hold]:
        return self.kv.follow_core(now)

    def session_ended(self, session_id: str) -> None:
        self.kv.session_ended(session_id)

    def forget_gone(self) -> list[str]:
        return self.kv.forget_gone()

    def on_forget(self, listener: Callable[[str, str], None]) -> None:
        self.kv.on_forget(listener)

    def key_of(self, session_id: str, kv_tokens: int, last_use: float) -> float:
        return self.kv.key_of(session_id, kv_tokens, last_use)


def _no_count(name: str, label: str) -> None:
    pass
