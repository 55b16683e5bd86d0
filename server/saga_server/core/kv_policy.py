"""`SessionKvPolicy`: what each fact about a session means for its KV on one engine.

An engine tells this object what happened to a session's requests and tools; the
object decides what that means for the session's KV and applies it to the engine's
`HoldLedger` (and to its session admission, where the engine runs one). The vLLM
plugin and the simulator are adapters: they translate their own events into these
calls and carry out what comes back (which requests may run now, which sessions were
admitted); neither decides anything about KV itself, so a figure measured in the
simulator is a figure about the code the engine runs.

The state machine of one session's KV (tiers, order and budget: `holds`):

| fact (call) | what happens to the session's KV |
|---|---|
| a request arrived (`arrived`) | admission learns its need; a hold longer than the prefix the request can reuse (the context was compacted or rewritten) is garbage past it: that tail is released now. If it may run now and the session holds KV, that KV is PROTECTED (used next), keyed by the arrival, latest first (the back of a FIFO queue is used last: Belady for a queue). If it waits at the admission gate, its KV keeps its tier and key (a parked session's stays the first to go) |
| it was scheduled (`scheduled`) | the hold is given back to the engine (the request references the blocks now); admission learns how much of the KV it had held was found |
| it finished (`finished`) | its cached prefix becomes the session's hold, keyed by the rules' key; a TTL pin when the rules pin it (within the pin budget and the owner's cap), else SOFT |
| a tool started (`tool_started`) | re-keyed, and the pin decided again now that the tool is known: the latest decision wins (a pin the tool no longer merits becomes SOFT) |
| a tool ended (`tool_ended`) | re-keyed, tier kept |
| a subagent of it started, or one stopped (the core publishes it; `follow_core`) | as a tool call starting (its wait on the children starts: the pin decided again), or ending |
| its pin's TTL passed (`expire_pins`) | SOFT, re-keyed |
| admission parked it (`plan`) | SOFT with the lowest key: the first KV to go, kept while nobody needs the room |
| admission admitted it (`plan`) | PROTECTED, keyed by its waiting request's arrival |
| memory ran short (`make_room`) | the ledger's order: soft, then pins, then protected, each by key, tail first |
| KV came back (`loaded`: a prefetch, a move) | SOFT under its key; a queued request's is PROTECTED; a pin with TTL left (the session's here, or one that moved with it) is pinned for the rest |
| it moved to another engine (`moved`) | released ("moved"); admission forgets it; its workflow state stays |
| it ended, idled out or was evicted from the core's session table | released ("session_end", "expired", "evicted"); admission, the request map and every `on_forget` listener forget it |

A protected session's tool hints change nothing (its queued request uses the KV
next). The rules (`KvRules`) are the only part that differs between SAGA and the
baselines the simulator compares it with: SAGA's are the core's WA-LRU key and
tool-aware pin (`WorkflowRules`); a baseline brings its own key and pin and may turn
protection off (stock vLLM does not know a queued request's session).

Lifecycle: with a `core`, the policy subscribes to its session table, which
publishes each session's end, idle expiry and eviction once, from whatever thread
changed it; the ids are queued and forgotten on the engine loop at the next
`forget_gone` (`tick` does it, and asks the core to expire idle sessions, so a quiet
engine forgets too). Its parents' changes (a subagent started or stopped) are queued
the same way and applied by `follow_core` (which `tick` calls). Without a core (a
baseline), the engine reports ends itself (`session_ended`). Not thread-safe
otherwise: owned by one engine loop.
"""

from __future__ import annotations

import collections
import math
from typing import Callable, Protocol, Sequence

from .admission import ACTIVE, AdmissionPlan, AdmissionState
from .holds import PINNED, PROTECTED, SOFT, Hold, HoldLedger, Release
from .pinning import PinDecision
from .sessions import Departure

__all__ = ["SessionKvPolicy", "KvRules", "WorkflowRules", "AdmissionControl", "NO_PIN", "FORGET_REASON"]

NO_PIN = PinDecision(False, 0.0, "off")
# What the ledger calls a release for each way a session stops being live.
FORGET_REASON = {Departure.ENDED: "session_end", Departure.EXPIRED: "expired", Departure.EVICTED: "evicted",
                 Departure.MOVED: "moved"}


class KvRules(Protocol):
    """How a policy scores and pins a session's held KV."""

    def key(self, session_id: str, kv_tokens: int, last_use: float) -> float:
        """Eviction key of the session's KV now (LOWER = goes first); `last_use`: when
        the KV was last used (a key without a prediction is plain recency)."""

    def pin_decision(self, session_id: str, kv_tokens: int, pressure: float) -> PinDecision:
        """Whether to pin the session's KV now, and for how long (`pressure`: the
        share of the pool that cannot be had on demand, 0..1: `HoldLedger.pressure`)."""


class AdmissionControl(Protocol):
    """Session admission as the policy drives it (`admission.SessionAdmission`
    documents the contract; a baseline may bring its own)."""

    def ready(self, session_id: str, tokens: int, tenant: str = "") -> bool: ...
    def finished(self, session_id: str) -> None: ...
    def served(self, session_id: str, held_tokens: int, recomputed_tokens: int) -> None: ...
    def ended(self, session_id: str) -> None: ...
    def state(self, session_id: str) -> AdmissionState | None: ...
    def plan(self) -> AdmissionPlan: ...


class WorkflowRules:
    """SAGA's rules: the core's WA-LRU key (`eviction`) and tool-aware TTL pin
    (`pinning`). `wa_lru=False` keys by recency and `pins=False` never pins
    (ablations)."""

    def __init__(self, core, *, wa_lru: bool = True, pins: bool = True) -> None:
        self.core = core
        self.wa_lru = wa_lru
        self.pins = pins

    def key(self, session_id: str, kv_tokens: int, last_use: float) -> float:
        if not self.wa_lru:
            return last_use
        return self.core.eviction_priority(session_id, kv_tokens, last_use)

    def pin_decision(self, session_id: str, kv_tokens: int, pressure: float) -> PinDecision:
        if not self.pins:
            return NO_PIN
        return self.core.pin_decision(session_id, kv_tokens, min(max(pressure, 0.0), 1.0))


class SessionKvPolicy:
    def __init__(self, ledger: HoldLedger, rules: KvRules, *, block_tokens: int, core=None,
                 admission: Callable[[Callable[[str], bool]], AdmissionControl | None] | None = None,
                 protect_queued: bool = True, release_garbage: bool = True,
                 count: Callable[[str, str], None] | None = None) -> None:
        """`ledger`: the engine's holds; `rules`: keys and pins; `core`: the
        `WorkflowCore` whose lifecycle it follows (None: `session_ended`).
        `admission(parkable)`: builds the engine's admission controller, given
        which sessions it may park (not pinned); None: every session runs at once.
        `release_garbage`: release a hold's tail that an arriving request cannot reuse
        (False: keep it until evicted, as stock vLLM's free queue does).
        `count(name, label)`: told of pin events ("pins": "used", "created",
        "refused", "over_tenant_cap", "unpinned", "expired") and of each session it
        forgets ("forgotten", by its `Departure`)."""
        self.ledger = ledger
        self.rules = rules
        self.block_tokens = block_tokens
        self.protect_queued = protect_queued
        self.release_garbage = release_garbage
        self.admission = admission(self.parkable) if admission is not None else None
        self._count = count or _no_count
        self._core = core
        self._requests: dict[str, set] = {}  # session -> its requests admission counts in flight
        self._queued_at: dict[str, float] = {}  # session -> latest arrival of a request not yet scheduled
        self._gone: collections.deque[tuple[str, Departure]] = collections.deque()  # (session, how), any thread
        self._parents: collections.deque[tuple[str, bool]] = collections.deque()  # (parent, started), any thread
        self._listeners: list[Callable[[str, Departure], None]] = []
        if core is not None:
            core.subscribe(self._published)
            core.subscribe_parents(self._parent_changed)

    # -- reads -----------------------------------------------------------------------

    def may_run(self, session_id: str | None) -> bool:
        """Whether a request of the session may be scheduled now: without a session
        or admission always; else once admission has admitted the session."""
        if self.admission is None or session_id is None:
            return True
        return self.admission.state(session_id) in (None, ACTIVE)

    def parkable(self, session_id: str) -> bool:
        """Admission may park a session unless the engine promised to keep its KV (a pin)."""
        hold = self.ledger.get(session_id)
        return hold is None or not hold.pinned

    def key_of(self, session_id: str, kv_tokens: int, last_use: float) -> float:
        """The key for KV of the session in the host tier's order (`host_tier`): the
        rules' key, except that a session whose request waits in the engine's queue,
        admitted, keeps its copy there until every other session's is gone (an
        infinite key), as its KV in the pool is protected (`protect_queued`): it is
        about to be loaded, and a copy dropped now is recomputed in a moment."""
        if self.protect_queued and session_id in self._queued_at and self.may_run(session_id):
            return math.inf
        return self.rules.key(session_id, kv_tokens, last_use)

    def table_sizes(self) -> dict[str, int]:
        """Entries of each per-session table the policy keeps (all bounded by the
        lifecycle: a session the core forgets leaves every one)."""
        sizes = {"holds": len(self.ledger), "requests": len(self._requests), "queued": len(self._queued_at)}
        if self.admission is not None:
            sizes["admission"] = len(self.admission)
        return sizes

    # -- requests ----------------------------------------------------------------------

    def arrived(self, session_id: str, request_id, need_tokens: int, arrived_at: float, tenant: str = "",
                reusable_tokens: int | None = None) -> bool:
        """A request of the session arrived needing `need_tokens` of KV (prompt +
        output); `reusable_tokens`: how much of the session's held KV its prompt
        continues (None: unknown). True: it may be scheduled now; False: it waits at
        the admission gate until `plan` admits its session."""
        if reusable_tokens is not None and self.release_garbage:
            self.ledger.truncate(session_id, max(reusable_tokens, 0) // self.block_tokens, "garbage")
        may = True
        if self.admission is not None:
            self._requests.setdefault(session_id, set()).add(request_id)
            may = self.admission.ready(session_id, need_tokens, tenant)
        self._queued_at[session_id] = max(arrived_at, self._queued_at.get(session_id, -math.inf))
        hold = self.ledger.get(session_id)
        if hold is None:
            return may
        if hold.tier == PINNED:
            self._count("pins", "used")  # the pin did its job
        if may:
            self._queue(session_id, hold)
        return may

    def scheduled(self, session_id: str, held_tokens: int, hit_tokens: int) -> None:
        """The session's request was scheduled with `hit_tokens` found of the
        `held_tokens` of KV it had computed before: its hold goes back to the engine
        (the request references those blocks now)."""
        self._queued_at.pop(session_id, None)
        if self.admission is not None:
            self.admission.served(session_id, held_tokens, max(0, held_tokens - hit_tokens))
        self.ledger.release(session_id, "arrival")

    def finished(self, session_id: str, request_id, blocks: Sequence, now: float, owner: str = "") -> Hold | None:
        """A request of the session finished; `blocks`: its cached prefix (prefix
        order; empty when nothing was cached). Returns the session's new hold."""
        counted = self._requests.get(session_id)
        if counted is not None and request_id in counted:
            counted.discard(request_id)
            if not counted:
                del self._requests[session_id]
            self.admission.finished(session_id)
        ledger = self.ledger
        if not len(blocks):  # e.g. aborted before it ran: its old KV is no longer about to be used
            self._queued_at.pop(session_id, None)
            hold = ledger.get(session_id)
            if hold is not None and hold.tier == PROTECTED:
                ledger.set_key(session_id, self._key(hold), SOFT)
            return hold
        kv_tokens = len(blocks) * self.block_tokens
        decision = self.rules.pin_decision(session_id, kv_tokens, ledger.pressure())
        hold = ledger.hold(session_id, blocks, key=self.rules.key(session_id, kv_tokens, now), now=now,
                           pin_ttl_s=decision.ttl_s if decision.pin else 0.0, reason=decision.reason, owner=owner)
        if decision.pin and hold is not None:
            self._count_pin(hold, hold.tier == PINNED)
        return hold

    # -- tools ---------------------------------------------------------------------------

    def tool_started(self, session_id: str, now: float) -> Hold | None:
        """A tool call of the session started: its hold is re-keyed and its pin
        decided again with the tool known."""
        hold = self.ledger.get(session_id)
        if hold is None or hold.tier == PROTECTED:
            return hold
        key = self._key(hold)
        decision = self.rules.pin_decision(session_id, len(hold.blocks) * self.block_tokens, self.ledger.pressure())
        if decision.pin:
            pinned = self.ledger.pin(session_id, decision.ttl_s, now, key)
            self._count_pin(hold, pinned)
            if pinned:
                return hold
        if hold.tier == PINNED and not decision.pin:
            self._count("pins", "unpinned")
            self.ledger.set_key(session_id, key, SOFT)
        else:
            self.ledger.set_key(session_id, key)
        return hold

    def tool_ended(self, session_id: str, now: float) -> None:
        """A tool call of the session ended: its hold is re-keyed (tier kept)."""
        hold = self.ledger.get(session_id)
        if hold is not None and hold.tier != PROTECTED:
            self.ledger.set_key(session_id, self._key(hold))

    # -- time, admission, pressure -----------------------------------------------------------

    def tick(self, now: float) -> AdmissionPlan:
        """Once per engine step: forget the sessions the core let go, demote expired
        pins, carry out the admission plan (returned)."""
        if self._core is not None:
            self._core.expire_idle()
        self.follow_core(now)
        self.expire_pins(now)
        return self.plan()

    def follow_core(self, now: float) -> list[Hold]:
        """Apply what the core published since the last call: forget the sessions it
        let go (`forget_gone`), and treat a subagent's start as its parent's tool call
        starting (the parent's pin decided again) and its stop as one ending. Returns
        the parents' holds that were decided again."""
        self.forget_gone()
        out = []
        parents = self._parents
        while parents:
            sid, started = parents.popleft()
            if not started:
                self.tool_ended(sid, now)
            elif (hold := self.tool_started(sid, now)) is not None:
                out.append(hold)
        return out

    def expire_pins(self, now: float) -> list[str]:
        """Pins whose TTL passed become SOFT under a fresh key; returns their sessions."""
        expired = self.ledger.expire(now)
        for sid in expired:
            self._count("pins", "expired")
            hold = self.ledger.get(sid)
            if hold is not None:
                self.ledger.set_key(sid, self._key(hold))
        return expired

    def plan(self) -> AdmissionPlan:
        """Ask admission which sessions to admit and park, and apply it to the KV:
        parked sessions' goes first, admitted sessions' is protected."""
        if self.admission is None:
            return AdmissionPlan()
        plan = self.admission.plan()
        for sid in plan.park:
            self.ledger.set_key(sid, -math.inf, SOFT)
        for sid in plan.admit:
            hold = self.ledger.get(sid)
            if hold is not None and sid in self._queued_at:
                self._queue(sid, hold)
        return plan

    def make_room(self, free_target: int, *, spare: str | None = None, max_tier: int = PROTECTED) -> list[Release]:
        """Give held KV back in the ledger's order until `free_target` blocks are free."""
        return self.ledger.make_room(free_target, spare=spare, max_tier=max_tier)

    # -- KV that comes and goes ---------------------------------------------------------------

    def loaded(self, session_id: str, now: float, *, blocks: Sequence | None = None, pin_until: float = 0.0,
               queued_at: float | None = None) -> None:
        """KV of the session came back into the pool (a prefetch, or a move from another
        engine): `blocks` become its hold (None: the engine already grew it);
        `queued_at`: a request of it that came along, already queued. A queued
        request's KV is protected; a pin with TTL left (the session's own here, or
        `pin_until`: one that moved with it) is pinned for the rest; else it keeps
        its tier under a fresh key."""
        before = self.ledger.get(session_id)
        if before is not None and before.tier == PINNED:
            pin_until = max(pin_until, before.expires_at)  # what came back joins a pin still running
        if blocks is not None:
            self.ledger.hold(session_id, blocks, key=self.rules.key(session_id, len(blocks) * self.block_tokens, now),
                             now=now, reason="prefetch")
        if queued_at is not None:
            self._queued_at[session_id] = max(queued_at, self._queued_at.get(session_id, -math.inf))
        hold = self.ledger.get(session_id)
        if hold is None:
            return
        if session_id in self._queued_at and self.may_run(session_id):
            self._queue(session_id, hold)
        elif not (pin_until > now and self.ledger.pin(session_id, pin_until - now, now, self._key(hold))):
            self.ledger.set_key(session_id, self._key(hold))

    def room_for_move(self, free_target: int) -> list[Release]:
        """Room for KV moving in from another engine: it displaces only SOFT holds
        (never a pin, nor a queued request's KV: a move must not cost what it saves)."""
        return self.ledger.make_room(free_target, max_tier=SOFT)

    def moved(self, session_id: str) -> None:
        """The session's KV left for another engine: released, admission forgets it
        (the target decides afresh); its workflow state stays."""
        self.ledger.release(session_id, FORGET_REASON[Departure.MOVED])
        self._drop(session_id)
        self._count("forgotten", Departure.MOVED)
        for listener in self._listeners:
            listener(session_id, Departure.MOVED)

    # -- lifecycle ------------------------------------------------------------------------------

    def on_forget(self, listener: Callable[[str, Departure], None]) -> None:
        """`listener(session_id, how)` on the engine loop whenever the policy forgets a
        session, `how` being its `Departure` (`MOVED`: its KV left this engine)."""
        self._listeners.append(listener)

    def session_ended(self, session_id: str) -> None:
        """The session ended. With a core its table publishes that (forgotten at the
        next `forget_gone`); an engine without one calls this."""
        if self._core is None:
            self._gone.append((session_id, Departure.ENDED))
        self.forget_gone()

    def forget_gone(self) -> list[str]:
        """Forget, on the engine loop, every session the lifecycle let go since the
        last call; returns them."""
        out = []
        gone = self._gone
        while gone:
            sid, how = gone.popleft()
            self.ledger.release(sid, FORGET_REASON[how])
            self._drop(sid)
            self._count("forgotten", how)
            for listener in self._listeners:
                listener(sid, how)
            out.append(sid)
        return out

    # -- internals ------------------------------------------------------------------------------

    def _published(self, session_id: str, how: Departure) -> None:
        self._gone.append((session_id, how))  # from the core's lock, any thread: act on the engine loop

    def _parent_changed(self, parent_id: str, started: bool) -> None:
        self._parents.append((parent_id, started))  # as `_published`

    def _drop(self, session_id: str) -> None:
        self._requests.pop(session_id, None)
        self._queued_at.pop(session_id, None)
        if self.admission is not None:
            self.admission.ended(session_id)

    def _queue(self, session_id: str, hold: Hold) -> None:
        if self.protect_queued:
            self.ledger.set_key(session_id, -self._queued_at[session_id], PROTECTED)
        else:
            self.ledger.set_key(session_id, self._key(hold), SOFT)

    def _key(self, hold: Hold) -> float:
        return self.rules.key(hold.session_id, len(hold.blocks) * self.block_tokens, hold.created_at)

    def _count_pin(self, hold: Hold, pinned: bool) -> None:
        self._count("pins", "created" if pinned else "refused")
        if not pinned and hold.refused == "over_owner_cap":
            self._count("pins", "over_tenant_cap")


def _no_count(name: str, label: str) -> None:
    pass
