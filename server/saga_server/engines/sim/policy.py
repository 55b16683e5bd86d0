"""Scheduling policies the simulator can run, and the contract they follow.

A policy is bound to the simulator's clock (`bind`), then decides these things; the
simulator applies them exactly where a vLLM scheduler would. What happens to a
session's KV is the core's `SessionKvPolicy` for every policy alike (one per worker,
the object the vLLM plugin runs); a policy only brings its rules (`kv_rules`), and by
default those are its `key` and `pin_ttl`:

1. `key(session, now)`: the eviction key of a session's cached prefix (lower = evicted
   first, also the host tier's order), asked whenever the session changes state
   (request done, tool started or ended, pin expired, KV loaded back).
2. `pin_ttl(session, now, pressure)`: seconds to pin the prefix when its request ends
   and again when a tool starts (0: no pin; the later decision wins). A pinned prefix
   is evicted only when no unpinned one is left.
3. `plan_prefetch(worker_id, candidates, free_tokens, now)`: for sessions in a tool
   whose KV sits partly in the host tier, which to bring back and when.
4. `queue_priority(session, now)`: the order of a worker's waiting queue (lower first;
   a float, or a tuple compared element by element; one type per policy).
5. With `routes`: `place(session, views, now)`, the worker (replica id `w<i>`) of
   a new session; with `steals` also `plan_steal(views, now)`, called every
   `steal_period_s`, a `saga_server.core.routing.Steal` or None; `views` are `ReplicaView`s of every
   worker (see `cluster`). Without `routes` the simulator places a session on the
   worker with the fewest live sessions, as a stock router would, and never moves it.
6. `admission(capacity_tokens, host_tokens, cost, parkable)`: a per-worker controller deciding
   which sessions may hold KV at all (see `admission`); None (default): all of them.

Flags say which machinery it uses: `caches` (prefix caching at all), `releases_garbage`
(a session's held KV past what its arriving request reuses, after a compaction, is
released at once; stock vLLM leaves it in its free queue until evicted), `host_tier`
(offload evicted tails to CPU memory and load them back on a hit), `routes` (new
sessions placed by `place`), `steals` (also `plan_steal`; a stolen session's KV moves
with it), `unbounded`
(infinite GPU KV), `bound` (a reference, not a deployment: priced on the fastest engine
a calibration knows, so that no deployment beats it), `protect_queued` (a session whose request is queued keeps its KV until every idle
and pinned prefix is gone; among them `key` orders, as the SAGA vLLM plugin does), and
`max_pin_fraction` (most of the pool that pins may hold; the cache is the plugin's
`HoldLedger`, see `cache`), `core` (a `WorkflowCore` whose session lifecycle the KV
policy follows; None: the simulator reports ends).
Hint hooks (`on_*`) see what an SDK would send; baselines ignore most of them.

Sessions are `saga_server.engines.sim.session.Session` objects; policies read
`session_id`, `tenant`, `started_at`, `last_access`, `state`, `next_use`,
`tool_names`, `kv_tokens` and nothing else. Only `Belady` reads `next_use` (the
future, known offline).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

from saga_server.core.admission import AdmissionPlan, AdmissionState
from saga_server.core.kv_policy import KvRules
from saga_server.core.pinning import PinDecision

from .session import ENDED, TOOL

if TYPE_CHECKING:  # pragma: no cover
    from saga_server.core.routing import ReplicaView, Steal

    from .hardware import CostModel

    from .session import Request, Session

__all__ = [
    "PrefetchRequest",
    "ActiveSetAdmission",
    "ToolDurations",
    "SimPolicy",
    "Vanilla",
    "ApcLru",
    "ApcLruOffload",
    "Infinite",
    "ContinuumTtl",
    "KvFlow",
    "ThunderAgent",
    "Belady",
]

# (session_id, kv_tokens to load, load_time_s) in; (session_id, start_at) out.
PrefetchRequest = tuple[str, int, float]


class SimPolicy:
    name = "base"
    caches = True
    releases_garbage = False
    host_tier = False
    routes = False
    steals = False
    unbounded = False
    bound = False
    protect_queued = False
    max_pin_fraction = 0.5  # the pin budget, as the vLLM plugin's default (SAGA_PIN_MAX_FRACTION)

    def bind(self, clock: Callable[[], float], seed: int) -> None:
        """Called once by the simulator before the run: its clock and seed."""

    def queue_priority(self, s: "Session", now: float) -> float:
        return now  # FCFS by arrival at the worker

    def key(self, s: "Session", now: float) -> float:
        return s.last_access  # LRU

    core = None
    mechanisms: frozenset = frozenset()  # SAGA's mechanisms it runs (`core.mechanisms`): a baseline none

    def kv_rules(self, session: Callable[[str], "Session"], clock: Callable[[], float]) -> KvRules:
        """The rules the worker's `SessionKvPolicy` runs: `key` and `pin_ttl` over the
        simulator's sessions (`session(id)`)."""
        return _SessionRules(self, session, clock)

    def admission(self, capacity_tokens: int, host_tokens: int, cost: "CostModel",
                  parkable: Callable[[str], bool]):
        """A per-worker admission controller (see `admission`), or None: every session
        is admitted at once. `parkable(session)`: False while the worker pins its KV."""
        return None

    def shaper(self, cost: CostModel):
        """A per-worker `saga_server.core.deadlines.DeadlineShaper`, or None: no request
        is ever held back, and no prefill slowed, for another's deadline."""
        return None

    def pin_ttl(self, s: "Session", now: float, pressure: float) -> float:
        return 0.0

    def plan_prefetch(self, worker_id: int, candidates: Sequence[PrefetchRequest],
                      free_tokens: int, now: float) -> list[tuple[str, float]]:
        return []

    def place(self, s: "Session", views: Sequence["ReplicaView"], now: float) -> str | None:
        return None  # the simulator's stock placement

    def plan_steal(self, views: Sequence["ReplicaView"], now: float) -> "Steal | None":
        return None

    # Hints, in the order an SDK sends them.
    def on_session_start(self, s: "Session", now: float) -> None: ...
    def on_llm_start(self, s: "Session", now: float) -> None: ...
    def on_llm_end(self, s: "Session", r: "Request", now: float) -> None: ...
    def on_tool_start(self, s: "Session", now: float) -> None: ...
    def on_tool_end(self, s: "Session", now: float) -> None: ...
    def on_session_end(self, s: "Session", now: float) -> None: ...


class _SessionRules:
    """A policy's `key` and `pin_ttl` as the core's `KvRules`."""

    __slots__ = ("policy", "session", "clock")

    def __init__(self, policy: SimPolicy, session: Callable[[str], "Session"], clock: Callable[[], float]) -> None:
        self.policy, self.session, self.clock = policy, session, clock

    def key(self, session_id: str, kv_tokens: int, last_use: float) -> float:
        return self.policy.key(self.session(session_id), self.clock())

    def pin_decision(self, session_id: str, kv_tokens: int, pressure: float) -> PinDecision:
        ttl = self.policy.pin_ttl(self.session(session_id), self.clock(), pressure)
        return PinDecision(ttl > 0.0, ttl, "pin" if ttl > 0.0 else "no_pin")


class Vanilla(SimPolicy):
    """No prefix cache: every call prefills its whole prompt."""

    name = "vanilla"
    caches = False


class ApcLru(SimPolicy):
    """vLLM automatic prefix caching: a finished request's blocks join the free queue,
    least recently used reused first. Sessions keep their LRU position while queued and
    after they end (vLLM does not know either)."""

    name = "apc-lru"


class ApcLruOffload(ApcLru):
    """`apc-lru` plus a host tier (LMCache-style CPU offload): evicted tails are copied
    to CPU memory and loaded back when the session's next request is admitted; no
    prefetch. Separates what a host tier alone buys from what timing it buys."""

    name = "apc-lru-offload"
    host_tier = True


class Infinite(ApcLru):
    """Unbounded KV memory: nothing is ever evicted; the lower bound on time for
    policies that place sessions as a stock router does (`saga`, which also routes
    and steals, can balance load better and finish slightly below it)."""

    name = "infinite"
    unbounded = True
    bound = True


class ToolDurations:
    """Each tool's observed call durations as a moving average (weight `alpha` for the
    newest call), as a baseline that watches its agents' tool calls learns them."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._avg: dict[str, float] = {}  # tool -> moving average of its calls' durations
        self._started: dict[str, float] = {}  # session -> when its current tool call started

    def started(self, session_id: str, now: float) -> None:
        self._started[session_id] = now

    def ended(self, session_id: str, tool_names, now: float) -> None:
        t0 = self._started.pop(session_id, None)
        if t0 is None:
            return
        d = now - t0
        for n in tool_names:
            old = self._avg.get(n)
            self._avg[n] = d if old is None else old + self.alpha * (d - old)

    def forget(self, session_id: str) -> None:
        self._started.pop(session_id, None)

    def predicted_s(self, tool_names) -> float | None:
        """The longest average among the session's current tools; None if none is known."""
        est = [self._avg[n] for n in tool_names if n in self._avg]
        return max(est) if est else None


class ContinuumTtl(SimPolicy):
    """Continuum (Li et al. 2025): when a tool starts, pin the session's KV for the
    moving average of that tool's observed durations; schedule whole programs FCFS (a
    session's requests keep the session's arrival order). No pin before a tool has been
    seen once."""

    name = "continuum-ttl"
    max_pin_fraction = 1.0  # its paper bounds pins by their TTL only

    def __init__(self, alpha: float = 0.2, ttl_cap_s: float = 60.0) -> None:
        self.alpha = alpha
        self.ttl_cap_s = ttl_cap_s
        self._tools = ToolDurations(alpha)

    def queue_priority(self, s: "Session", now: float) -> float:
        return s.started_at

    def pin_ttl(self, s: "Session", now: float, pressure: float) -> float:
        est = self._tools.predicted_s(s.tool_names)
        return min(est, self.ttl_cap_s) if est is not None else 0.0

    def on_tool_start(self, s: "Session", now: float) -> None:
        self._tools.started(s.session_id, now)

    def on_tool_end(self, s: "Session", now: float) -> None:
        self._tools.ended(s.session_id, s.tool_names, now)


class KvFlow(SimPolicy):
    """KVFlow (Pan et al. 2025): evict by steps-to-execution, then LRU, and prefetch
    offloaded KV of the agents due next. For a single-agent tool loop the step graph
    gives: running or queued = 0 steps, in a tool = 1 step, ended = never. Offloaded
    tails go to the host tier; a session's prefetch starts as soon as its tool starts,
    into free memory only (KVFlow has no tool-duration model to time it)."""

    name = "kvflow"
    host_tier = True
    _STEP = 1e9  # seconds; larger than any simulated time

    def key(self, s: "Session", now: float) -> float:
        if s.state == ENDED:
            return -math.inf
        steps = 1 if s.state == TOOL else 0
        return s.last_access - steps * self._STEP

    def plan_prefetch(self, worker_id, candidates, free_tokens, now):
        out, room = [], free_tokens
        for sid, tokens, _ in candidates:
            if tokens <= room:
                out.append((sid, now))
                room -= tokens
        return out


class ThunderAgent(ApcLru):
    """ThunderAgent (2025): program-aware admission on top of vLLM's prefix cache. When
    the KV pool runs short, programs waiting on a tool are paused, smallest KV first,
    and their KV is dropped (no host tier); paused and new programs are resumed by best
    fit (the largest one that fits the free pool). It knows each program's KV as it
    stands, not what its next step will need."""

    name = "thunderagent"

    def admission(self, capacity_tokens: int, host_tokens: int, cost: "CostModel",
                  parkable: Callable[[str], bool]) -> "_BestFitAdmission":
        return _BestFitAdmission(capacity_tokens)


class ActiveSetAdmission:
    """What a baseline's admission controller shares: the KV each known session's
    latest request needs (`_kv`), the sessions admitted (`_active`) and those with a
    request waiting or running (`_pending`); a subclass brings the rule (`ready`,
    `plan`, ...) of the core's `SessionAdmission` interface."""

    _kv: dict[str, int]
    _active: set[str]
    _pending: set[str]

    def __len__(self) -> int:
        return len(self._kv)

    def finished(self, session_id: str) -> None:
        self._pending.discard(session_id)

    def state(self, session_id: str) -> AdmissionState | None:
        if session_id not in self._kv:
            return None
        return AdmissionState.ACTIVE if session_id in self._active else AdmissionState.WAITING


class _BestFitAdmission(ActiveSetAdmission):
    """ThunderAgent's rule with the interface of the core's `SessionAdmission`."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._kv: dict[str, int] = {}  # session -> KV tokens (its last request's prompt + output)
        self._active: set[str] = set()
        self._pending: set[str] = set()  # a request waits or runs
        self.active_tokens = 0

    def ready(self, session_id: str, tokens: int, tenant: str = "") -> bool:
        self._pending.add(session_id)
        if session_id in self._active:
            self.active_tokens += tokens - self._kv[session_id]
        self._kv[session_id] = tokens
        return session_id in self._active

    def served(self, session_id: str, held_tokens: int, recomputed_tokens: int) -> None:
        pass  # its limit is the pool, fixed

    def ended(self, session_id: str) -> None:
        self._pending.discard(session_id)
        if session_id in self._active:
            self._active.discard(session_id)
            self.active_tokens -= self._kv[session_id]
        self._kv.pop(session_id, None)

    def plan(self) -> AdmissionPlan:
        cap, kv = self.capacity_tokens, self._kv
        ready = [sid for sid in self._pending if sid not in self._active]
        park: list[str] = []
        if ready and self.active_tokens + min(kv[s] for s in ready) > cap:
            # Pause programs in a tool, smallest first, until the smallest waiting one fits.
            idle = sorted((kv[s], s) for s in self._active if s not in self._pending)
            need = self.active_tokens + min(kv[s] for s in ready) - cap
            for tokens, sid in idle:
                if need <= 0:
                    break
                park.append(sid)
                need -= tokens
            for sid in park:
                self._active.discard(sid)
                self.active_tokens -= kv[sid]
        admit: list[str] = []
        while ready:
            free = cap - self.active_tokens
            fits = [(kv[s], s) for s in ready if kv[s] <= free]
            if not fits:
                if any(s in self._pending for s in self._active):
                    break
                fits = [min((kv[s], s) for s in ready)]  # an idle engine takes the smallest
            _, sid = max(fits)  # best fit: the largest that fits
            ready.remove(sid)
            self._active.add(sid)
            self.active_tokens += kv[sid]
            admit.append(sid)
        return AdmissionPlan(tuple(admit), tuple(park))


class Belady(SimPolicy):
    """Offline optimum for prefix-structured KV: with the future known, evict from the
    tail of the cached prefix whose next use is farthest (a session that never comes
    back: first). The next use of a session in a tool is the tool's end (from the
    trace); of a queued session, its arrival (it is about to run). For unit-size items
    this is Belady's MIN, provably optimal; a prefix is a run of blocks that share one
    next-use time and are used together, so MIN applies block by block and tail-first
    order keeps the survivors a valid prefix. Under continuous batching the future
    arrival times depend on the schedule, so here it is the (strong) offline reference,
    not a proven bound on time."""

    name = "belady"
    bound = True

    def key(self, s: "Session", now: float) -> float:
        if s.state == ENDED:
            return -math.inf
        return -s.next_use
