"""Workflow-atomic admission: which sessions an engine lets hold KV at all.

When the sessions' KV no longer fits in the engine's tiers (its GPU pool and, where it
has one, its host tier), letting all of them run makes them evict each other, and every
step recomputes what the last one threw away. The unit of admission is therefore the
whole session: an engine keeps a set of *active* sessions whose working sets fit its
tiers; the others wait, and a session that will be away long (a long tool call) may be
*parked* to make room: it leaves the active set and its KV is the first the engine gives
up when it needs room (kept while nobody needs it; evicted, to the host tier where there
is one, else recomputed on its return).

Working set. ws(s) is the KV a session needs on the pool for its next request: while a
request of it waits or runs, that request's prompt plus output; between requests, its
context plus the predicted growth of its next prompt (the tool output the agent
appends) plus its usual answer (`WorkflowCore.kv_outlook`). W is the sum over active
sessions. Which active session's KV sits on the GPU and which on the host tier is the
KV cache's business (the `HoldLedger` order, host-tier order and prefetch); admission
only keeps the total in bounds.

Limit. W is kept under a limit L that adapts like TCP's congestion window, because what
the tiers really hold depends on the workload, not on their size: a host tier helps
only while sessions are away in tools, a write-through tier holds copies of what the
GPU holds too, and sessions queued behind the engine's batch limit keep their KV on
the pool while they wait, so a W well above the pool may lose nothing. L starts at
`target` x (pool + host tier). Each served request of an active session that found
the KV it had held intact raises it by ws^2/L (about one session per round of
requests) while the limit binds and the engine does not: a session waits for
admission, and no admitted request waits in the engine's queue. As TCP's window
grows only while the sender is window-limited (so an idle stretch cannot inflate
it), and a delay-based one stops growing once packets queue at the bottleneck: an
admitted request queued at the engine says the engine, not the limit, is what holds
work back, and another admitted session would only compete for its KV. Each served
request that had to recompute r tokens it had held lowers L by r (the tiers were
short by about that much). A session's first request on this engine is evidence of
neither: what it finds or misses this engine never held (it moved here, or came back
after its session idled out and was forgotten), as the first request of a session
back from parking misses by design. L has no ceiling: the tiers' size is where it
starts, measured loss is what bounds it; it never drops below `target` x pool. So
admission engages only where active sessions do lose KV, and L settles just below
the point where they start to.

Rule, applied by `plan` whenever the engine asks (request arrival and finish, session
end):
1. *Admit.* Sessions with a request waiting that are not active (new, or parked) are
   taken in rank order (`WorkflowCore.request_rank`: tenants' fair share and urgency,
   then task seniority), and each is activated while W + ws <= L.
2. *Make room for the head.* When the head does not fit, idle active sessions (no
   request waiting or running, no TTL pin, which is a promise to keep the KV for the
   length of its tool call, and not a parent waiting on its subagents) that are
   expected to stay away long enough to pay for the move are parked, least valuable
   first (lowest WA-LRU key: farthest, least likely and cheapest next use), until the
   head fits. "Long enough": more likely than not, the time to their next request is
   at least `park_payback` times what bringing their KV back would cost (`return_s`:
   recomputing it, the worst case), i.e. the median of their wait left
   (`KvOutlook.away_s`) is. Not its mean: waits are heavy-tailed (a coding tool is
   back within a second as often as not, and runs minutes once in a hundred), so the
   mean is the tail's and would park sessions that are back before their KV is (both
   measured: docs/RESEARCH.md, "What closed SAGA's gap to its `oracle`"). Why not a
   parent waiting on its subagents: its wait is its children's run, which passes any
   payback test, yet it goes on the moment the last of them returns, so parking it
   trades the tree's next step (a recompute of the parent's context) for another
   session's start; measured, that trade lost wherever KV was short and never won
   beyond noise (docs/RESEARCH.md, "Subagents"). If no such set makes the head fit,
   nobody is parked and the head waits: it is never overtaken (head-of-line), so the
   first-ranked session is admitted as soon as capacity allows.
3. *Overflow.* Working sets grow as contexts grow; when W exceeds `overflow`/`target`
   x L (before and after admitting), idle active sessions are parked the same way
   (without the payback test: the pool would otherwise evict at random) until W <= L.
4. *Forward progress.* When no active session has a request waiting or running, the
   head is admitted whatever its size (an idle engine never keeps work waiting); the
   engine's own eviction then serves it as stock would.

Bound. A waiting session's place in the rank order is bounded as Agent Fair Share and
seniority bound it (`fairshare`); once it is the head, nothing is admitted before it,
so it waits at most until enough active sessions finish or park to make it fit (or
until the engine is otherwise idle). Admission changes no tenant's share: it orders
sessions by the same rank the engine's queue uses.

Without overload W stays under L, every session is admitted at once, and nothing is
parked: admission is a no-op where KV fits. Not thread-safe: owned by one
engine loop; the `WorkflowCore` it asks is thread-safe.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable

__all__ = ["AdmissionConfig", "AdmissionPlan", "SessionAdmission", "AdmissionState"]


class AdmissionState(enum.StrEnum):
    """Where a session stands at an engine's admission (values: the metrics' labels)."""

    ACTIVE = "active"  # its working set counts against the limit; its requests run
    PARKED = "parked"  # left the active set while away; its KV goes first
    WAITING = "waiting"  # a request waits to be admitted


# The members as module names: an enum member read off its class is a metaclass lookup,
# several times a plain global's, and the plan's loops read them for every session.
ACTIVE, PARKED, WAITING = AdmissionState.ACTIVE, AdmissionState.PARKED, AdmissionState.WAITING


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    target: float = 0.9  # the limit's share of the tiers: headroom for growth within a step
    overflow: float = 1.0  # above overflow/target x the limit, park idle sessions down to it
    park_payback: float = 2.0  # park only if away at least this many times the return's cost

    def __post_init__(self) -> None:
        if not 0.0 < self.target <= self.overflow or self.park_payback < 0:
            raise ValueError("need 0 < target <= overflow and park_payback >= 0")


@dataclass(frozen=True, slots=True)
class AdmissionPlan:
    admit: tuple[str, ...] = ()  # sessions whose waiting request may run now
    park: tuple[str, ...] = ()  # sessions whose KV goes first when the engine needs room


@dataclass(slots=True)
class _Entry:
    session_id: str
    tenant: str
    state: AdmissionState
    ws: int  # working-set tokens
    pending: int = 0  # its requests waiting or running at the engine
    running: int = 0  # of those, the ones the engine has scheduled
    waiting_since: float = 0.0  # when its current request arrived (core clock)
    # Its next served request says nothing of this engine's tiers: its first here, or
    # its first after parking, which may miss KV by design.
    no_evidence: bool = True


@dataclass(slots=True)
class _Counts:
    admitted: int = 0
    parked: int = 0
    forced: int = 0  # admitted by the forward-progress rule
    losses: int = 0  # served requests of active sessions that recomputed KV they had held
    wait_s: float = 0.0  # summed admission waits of admitted requests


class SessionAdmission:
    def __init__(self, core, capacity_tokens: int, *, host_tokens: int = 0, config: AdmissionConfig | None = None,
                 return_s: Callable[[int], float] = lambda tokens: math.inf,
                 parkable: Callable[[str], bool] = lambda session_id: True) -> None:
        """`core`: the `WorkflowCore` (predictions, ranks, keys). `capacity_tokens`: the
        engine's KV pool; `host_tokens`: its host tier (0: none). `return_s(tokens)`:
        seconds to bring that much parked KV back (the engine's cost model; the default
        never parks to make room). `parkable(session)`: False for a session whose KV
        the engine promised to keep (a TTL pin), which is never parked."""
        if capacity_tokens <= 0 or host_tokens < 0:
            raise ValueError("capacity_tokens > 0 and host_tokens >= 0 required")
        self.core = core
        self.config = config or AdmissionConfig()
        self.floor = self.config.target * capacity_tokens
        self.limit = self.config.target * (capacity_tokens + host_tokens)
        self._return_s = return_s
        self._parkable = parkable
        self._entries: dict[str, _Entry] = {}
        self.active_tokens = 0
        self.counts = _Counts()

    # -- engine events -------------------------------------------------------------

    def ready(self, session_id: str, tokens: int, tenant: str = "") -> bool:
        """A request of the session arrived, needing `tokens` of KV (prompt + output).
        True: it may run now (the session is active); False: it waits for `plan`."""
        e = self._entries.get(session_id)
        if e is None:
            e = self._entries[session_id] = _Entry(session_id, tenant, WAITING, tokens)
        e.pending += 1
        e.waiting_since = self.core.now()
        if e.state == ACTIVE:
            self._resize(e, tokens)
            return True
        e.ws = tokens
        return False

    def finished(self, session_id: str) -> None:
        """A request of the session finished; once none is left, between requests
        its working set is its outlook (context + predicted growth + answer)."""
        e = self._entries.get(session_id)
        if e is None:
            return
        e.pending = max(0, e.pending - 1)
        e.running = min(max(0, e.running - 1), e.pending)
        if e.pending:
            return
        outlook = self.core.kv_outlook(session_id)
        if outlook is not None and e.state == ACTIVE:
            self._resize(e, outlook.next_tokens)

    def served(self, session_id: str, held_tokens: int, recomputed_tokens: int) -> None:
        """The engine served a request of the session; `held_tokens`: KV of its prompt
        the engine had computed before (0 for a first request: nothing to find, no
        evidence either way), `recomputed_tokens`: how much of that it had to
        recompute. The request now runs (it no longer waits in the engine's queue).
        Adapts the limit (module docstring)."""
        e = self._entries.get(session_id)
        if e is None or e.state != ACTIVE:
            return
        e.running = min(e.running + 1, e.pending)
        if e.no_evidence:
            e.no_evidence = False
        elif recomputed_tokens > 0:
            self.counts.losses += 1
            self.limit = max(self.floor, self.limit - recomputed_tokens)
        elif held_tokens > 0 and self._someone_waits() and not self._engine_queues():
            self.limit += e.ws * e.ws / self.limit

    def ended(self, session_id: str) -> None:
        """The session ended or left this engine: it is forgotten, with its requests
        (the engine reports no `finished` for a request that arrived before the end:
        one that outlives it is no longer this session's)."""
        e = self._entries.pop(session_id, None)
        if e is None:
            return
        if e.state == ACTIVE:
            self.active_tokens -= e.ws

    def state(self, session_id: str) -> AdmissionState | None:
        e = self._entries.get(session_id)
        return None if e is None else e.state

    def __len__(self) -> int:
        return len(self._entries)

    def states(self) -> dict[AdmissionState, int]:
        """Sessions per state (states nobody is in are left out)."""
        out: dict[AdmissionState, int] = {}
        for e in self._entries.values():
            out[e.state] = out.get(e.state, 0) + 1
        return out

    # -- the rule --------------------------------------------------------------------

    def plan(self) -> AdmissionPlan:
        """Apply the rule (module docstring); the engine carries out the plan: parked
        sessions' KV goes first when it needs room, admitted sessions' waiting requests
        may run."""
        admit: list[str] = []
        park: list[str] = []
        park += self._relieve_overflow()
        queue = sorted((e for e in self._entries.values() if e.pending and e.state != ACTIVE),
                       key=self._rank)
        now = self.core.now()
        for e in queue:
            short = e.ws - (self.limit - self.active_tokens)
            if short > 0:
                if self._busy():
                    room = self._park_until(short, payback=True)
                    if not room:
                        break  # head-of-line: nobody overtakes the head
                    park += room
                else:
                    self.counts.forced += 1
            self._activate(e, now)
            admit.append(e.session_id)
        park += self._relieve_overflow()  # a forced admission may have crossed it
        return AdmissionPlan(tuple(admit), tuple(park))

    # -- internals -------------------------------------------------------------------

    def _rank(self, e: _Entry) -> tuple:
        return self.core.request_rank(e.session_id, e.tenant, e.waiting_since)

    def _someone_waits(self) -> bool:
        return any(x.pending and x.state != ACTIVE for x in self._entries.values())

    def _engine_queues(self) -> bool:
        return any(x.pending > x.running for x in self._entries.values() if x.state == ACTIVE)

    def _busy(self) -> bool:
        return any(x.pending for x in self._entries.values() if x.state == ACTIVE)

    def _activate(self, e: _Entry, now: float) -> None:
        self.counts.admitted += 1
        self.counts.wait_s += max(0.0, now - e.waiting_since)
        e.no_evidence = e.no_evidence or e.state == PARKED
        e.state = ACTIVE
        self.active_tokens += e.ws

    def _resize(self, e: _Entry, ws: int) -> None:
        self.active_tokens += ws - e.ws
        e.ws = ws

    def _relieve_overflow(self) -> list[str]:
        cfg = self.config
        if self.active_tokens <= self.limit * cfg.overflow / cfg.target:
            return []
        return self._park_until(self.active_tokens - self.limit, payback=False)

    def _park_until(self, need: float, *, payback: bool) -> list[str]:
        """Park idle active sessions, least valuable first, until `need` tokens are
        freed. With `payback`: only those away long enough to pay for their return,
        and nobody at all unless together they free `need`."""
        now = self.core.now()
        cands = []
        for e in self._entries.values():
            if e.state != ACTIVE or e.pending or not self._parkable(e.session_id):
                continue
            outlook = self.core.kv_outlook(e.session_id)
            if outlook is not None and outlook.awaits_children:
                continue
            if payback:
                away = math.inf if outlook is None else outlook.away_s
                if not away >= self.config.park_payback * self._return_s(e.ws):
                    continue
            cands.append((self.core.eviction_priority(e.session_id, e.ws, now), e.session_id, e))
        cands.sort(key=lambda t: (t[0], t[1]))
        chosen, freed = [], 0
        for _, _, e in cands:
            if freed >= need:
                break
            chosen.append(e)
            freed += e.ws
        if payback and freed < need:
            return []
        for e in chosen:
            self.active_tokens -= e.ws
            e.state = PARKED
            self.counts.parked += 1
        return [e.session_id for e in chosen]
