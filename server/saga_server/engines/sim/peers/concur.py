"""CONCUR (Chen et al., 2026, arXiv 2601.22705): agent-level admission as congestion
control against middle-phase thrashing.

What it models. In batch inference of long-lived agents, throughput collapses in the
middle of a run, well before the KV pool is full: agents' histories have grown, the
engine's request-level eviction throws away prefixes that their agents come back to a
step later, and every step recomputes what the last one evicted. CONCUR is a control
layer in front of an unmodified engine that regulates how many agents are *active*,
as TCP regulates the packets in flight, from the engine's runtime cache signals:

- a window W on the number of active agents of one engine;
- an admitted agent stays active until it ends (execution continuity: it is never
  paused or preempted, its KV never dropped on purpose); a new agent waits, first
  come first served, until fewer than W are active;
- once per round (W served requests of active agents, TCP's "one window of acks"),
  two signals of that round decide W:
  * U, KV usage: the share of the pool that running requests occupy (the engine's
    own KV-usage gauge; a prefix an agent keeps while it is in a tool is cached, not
    used), averaged over the round's scheduling events;
  * H, hit rate: of the prefix tokens the round's requests had computed before, the
    share the engine still had (on the GPU or, here, loaded from the host tier).
    The engine's hit-rate counter divides by all prompt tokens, whose new part can
    never hit; dividing by the reusable part gives a signal whose healthy value is
    1 on any workload, so one threshold serves every trace.
  Congestion (U > `u_high`, or H < `hit_low`: the round lost KV it had) cuts W by
  `beta` (multiplicative decrease); spare room (U < `u_low` and H healthy) grows it
  by one agent (additive increase), and only while an agent waits (a window that
  limits nobody is not grown: an idle stretch cannot inflate it, as TCP's
  congestion-window validation); between the thresholds W holds.
  No slow start: an admitted agent cannot be taken back, so a window doubled at the
  start of a batch, while every history is short, would lock in the very
  over-admission that thrashes once the histories have grown.

Constants. `u_low` = 0.2 and `u_high` = 0.5 are the utilisation thresholds the paper's
threshold-sensitivity study finds best (Qwen3-32B across tensor-parallel degrees; a
`u_high` of 0.8 thrashes). The others are not the paper's; chosen: `beta` = 0.5
(TCP's halving), `hit_low` = 0.9 (a round that had to recompute more than a tenth of
the KV it had computed before is thrashing; without loss H stays at 1),
`initial_window` = 4 agents (a few agents' first requests use a small share of any
pool), `min_window` = 1 (an engine always runs at least one agent: nothing starves).

Tiers and order. KV is vLLM's prefix cache in LRU order (`SimPolicy.key`), with the
host tier every policy with one gets (evicted tails go to CPU memory and come back on
a hit; a disk tier below where the run has one), as SAGA gets. The paper argues against
a host tier (its Figure 1(c): under concurrency, offloading KV to the CPU takes longer
than recomputing it) and, as far as its text shows, evaluates without one; here the
host tier only makes the baseline stronger and the comparison with SAGA like for like.

Mapping onto the simulator. One controller per worker (`SimPolicy.admission`); the
worker's `EnginePolicy` drives it: `ready` (a request arrived: an active agent's runs
at once, continuity; a new agent's waits at the gate), `served` (it was scheduled
with so much of its held KV found: a sample of both signals), `finished`, `ended`
(the agent leaves the window), `plan` (admit waiting agents while fewer than W are
active; never parks anyone). Placement is the simulator's stock one (fewest live
sessions), no steals; the queue inside the engine is FCFS, as vLLM's.

Left out. A control layer outside the engine reads its signals at an interval of its
own; here the window moves once per round of served requests, the same feedback at
the pace the engine produces it. It is a batch-inference system: agents are admitted in
submission order with no tenants or deadlines, so the simulator's multi-tenant
and deadline runs see it as FCFS. Nothing about tool (CPU) contention, which the
simulator does not model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from saga_server.core.admission import AdmissionPlan, AdmissionState

from ..policy import SimPolicy

if TYPE_CHECKING:  # pragma: no cover
    from ..hardware import CostModel

__all__ = ["Concur", "ConcurConfig", "CongestionWindow"]


@dataclass(frozen=True, slots=True)
class ConcurConfig:
    u_low: float = 0.2  # KV usage below this: room for more agents (the paper's threshold)
    u_high: float = 0.5  # KV usage above this: congestion (the paper's threshold)
    hit_low: float = 0.9  # hit rate of held KV below this: the round thrashed
    beta: float = 0.5  # multiplicative decrease
    initial_window: int = 4  # agents admitted before the first round
    min_window: int = 1

    def __post_init__(self) -> None:
        if not (0.0 <= self.u_low <= self.u_high <= 1.0 and 0.0 <= self.hit_low <= 1.0
                and 0.0 < self.beta < 1.0 and 1 <= self.min_window <= self.initial_window):
            raise ValueError("need 0 <= u_low <= u_high <= 1, 0 <= hit_low <= 1, 0 < beta < 1, "
                             "1 <= min_window <= initial_window")


@dataclass(slots=True)
class _Round:
    """The signals' samples since the window last moved."""

    served: int = 0
    usage_sum: float = 0.0  # KV usage summed over the round's scheduling events
    held: int = 0  # prefix tokens the round's requests had computed before
    lost: int = 0  # of those, the tokens recomputed


@dataclass(slots=True)
class _Counts:
    rounds: int = 0
    increases: int = 0
    decreases: int = 0
    admitted: int = 0


class CongestionWindow:
    """CONCUR's controller for one engine, with the interface of the core's
    `SessionAdmission` (`saga_server.core.kv_policy.AdmissionControl`)."""

    def __init__(self, capacity_tokens: int, config: ConcurConfig | None = None) -> None:
        if capacity_tokens <= 0:
            raise ValueError("capacity_tokens > 0 required")
        self.capacity_tokens = capacity_tokens
        self.config = cfg = config or ConcurConfig()
        self.window = float(cfg.initial_window)
        self._need: dict[str, int] = {}  # every known agent -> its latest request's KV need; arrival order
        self._active: set[str] = set()
        self._pending: set[str] = set()  # a request of it waits or runs
        self._running: dict[str, int] = {}  # scheduled, not finished -> KV tokens it uses
        self.running_tokens = 0
        self._round = _Round()
        self.counts = _Counts()

    # -- engine events -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._need)

    def ready(self, session_id: str, tokens: int, tenant: str = "") -> bool:
        self._need[session_id] = tokens
        self._pending.add(session_id)
        return session_id in self._active  # continuity: an admitted agent always runs

    def served(self, session_id: str, held_tokens: int, recomputed_tokens: int) -> None:
        """The engine scheduled a request of the session, which found all but
        `recomputed_tokens` of the `held_tokens` it had computed before: one sample
        of both signals; a full round moves the window."""
        tokens = self._need.get(session_id, 0)
        self.running_tokens += tokens - self._running.get(session_id, 0)
        self._running[session_id] = tokens
        r = self._round
        r.served += 1
        r.usage_sum += self.running_tokens / self.capacity_tokens
        r.held += held_tokens
        r.lost += recomputed_tokens
        if r.served >= max(1, int(self.window)):
            self._end_round()

    def finished(self, session_id: str) -> None:
        self._pending.discard(session_id)
        self.running_tokens -= self._running.pop(session_id, 0)

    def ended(self, session_id: str) -> None:
        self.finished(session_id)
        self._active.discard(session_id)
        self._need.pop(session_id, None)

    def state(self, session_id: str) -> AdmissionState | None:
        if session_id not in self._need:
            return None
        return AdmissionState.ACTIVE if session_id in self._active else AdmissionState.WAITING

    def plan(self) -> AdmissionPlan:
        """Admit waiting agents, first come first, while fewer than W are active.
        Nobody is ever parked: when W shrinks below the active agents, they run on
        and W is met as they end."""
        limit = max(self.config.min_window, int(self.window))
        admit: list[str] = []
        for sid in self._need:  # insertion order: the agents' first arrivals
            if len(self._active) >= limit:
                break
            if sid in self._pending and sid not in self._active:
                self._active.add(sid)
                admit.append(sid)
        self.counts.admitted += len(admit)
        return AdmissionPlan(tuple(admit), ())

    # -- the control law -------------------------------------------------------------

    def signals(self) -> tuple[float, float]:
        """(U, H) of the round so far: mean KV usage, hit rate of held KV (1 with
        nothing held: no evidence of loss)."""
        r = self._round
        usage = r.usage_sum / r.served if r.served else self.running_tokens / self.capacity_tokens
        hit = 1.0 - r.lost / r.held if r.held else 1.0
        return usage, hit

    def _end_round(self) -> None:
        cfg = self.config
        usage, hit = self.signals()
        self._round = _Round()
        self.counts.rounds += 1
        if usage > cfg.u_high or hit < cfg.hit_low:
            self.window = max(float(cfg.min_window), self.window * cfg.beta)
            self.counts.decreases += 1
        elif usage < cfg.u_low and self._window_limited():
            self.window += 1.0
            self.counts.increases += 1

    def _window_limited(self) -> bool:
        """An agent waits for admission: only then does a larger window change anything."""
        return any(sid not in self._active for sid in self._pending)


class Concur(SimPolicy):
    """CONCUR: a congestion window on each engine's active agents, moved by its KV
    usage and hit rate; admitted agents run to completion (module docstring)."""

    name = "concur"
    host_tier = True

    def __init__(self, config: ConcurConfig | None = None) -> None:
        self.config = config or ConcurConfig()

    def admission(self, capacity_tokens: int, host_tokens: int, cost: "CostModel",
                  parkable: Callable[[str], bool]) -> CongestionWindow:
        return CongestionWindow(capacity_tokens, self.config)
