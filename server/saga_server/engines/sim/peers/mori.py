"""MORI (Xia et al. 2026, "Idleness is Relative", arXiv 2606.00866) as a baseline.

What it models. MORI is a program-aware scheduler in front of an engine with a CPU
offload tier. It scores every live program by its *idleness*, the share of its recent
time spent waiting on tool calls (Section 4.2, Equation 1):

    idleness = T_acting / (T_reasoning + T_acting)  over the program's last k cycles

(a cycle is one inference and the tool wait after it; k = 5 in all of the paper's
experiments). The ongoing phase counts with the time elapsed so far, so a program that
enters a long tool call turns idle quickly, while one slow call among short ones is
diluted by the window. Time a program spends waiting in MORI's own queues counts in
neither term. The paper gives no score to a program without history; here it is 0
(it is about to reason).

It keeps three tiers per engine (Section 4.1): a GPU queue (KV in HBM, its requests
run), a CPU queue (KV offloaded to DRAM, reloaded before the next inference) and a
Waiting queue (KV dropped; recomputed on return), the first two bounded by their
memory, and rebalances them with a sticky rule (Section 4.3): nobody moves unless
capacity forces it; when the GPU tier must make room, the programs waiting on a tool
are demoted in order of idleness, idlest first, to the CPU tier while it has room;
programs not in the GPU tier whose request is ready are promoted when room is there
or can be made: first those in the CPU tier (least idle first), then returning
programs from the Waiting queue, then new ones (smallest context first), a strict
priority order: while the first in it cannot be placed, nobody behind it is. A
program that fits neither tier waits: demotions that would drop another program's KV
(CPU tier full) are not made to admit it, unless the engine would otherwise sit idle.
The engine evicts by type (Section 4.3.2): on the GPU, ended, then waiting-tier, then
CPU-tier (idle), then GPU-tier (busy) programs' KV, each by LRU.

How it maps onto the simulator's hooks.
- The controller (`_MoriAdmission`, the core's `AdmissionControl` protocol), one per
  worker, is the three tiers: the GPU tier is the active set (its requests pass the
  gate), `park` is a demotion (the parked KV is the first the pool gives up, to the
  host tier), `admit` a promotion. The GPU tier's capacity is the worker's pool, the
  CPU tier's its host tier; a program's size is the KV its latest request needs
  (prompt + output). The plan runs at every request arrival held at the gate, every
  request finish and every session end, which is at least as often as the paper's
  5 s control loop.
- `key` is the typed eviction order: a band per tier (waiting < CPU < GPU), the last
  use within a band; ended programs' KV goes first. The host tier drops in the same
  order.
- The idleness tracker (`Idleness`) is fed what MORI's router sees: a request passing
  its gate (the controller), the request's finish (`on_llm_end`), the tool call's
  start and end (`on_tool_start`, `on_tool_end`; a person's turn and a wait on
  subagents are tool waits too).

What it leaves out, and why.
- Multi-replica load balancing (best-fit-decreasing packing with cache affinity):
  every baseline gets the stock router here (fewest live sessions, never moved).
- Transfer time of a demotion: in the simulator an eviction's copy to the host tier
  is free and instant for every policy with a host tier, so demoting while idle and
  demoting when the room is needed cost the same; the parked KV stays on the GPU
  until the room is needed, as a write-through CPU copy leaves it.
- Lazy demotion of a reasoning program: a program whose request runs is never
  demoted; the plan runs again at its finish, when it is a candidate like any other.
- The CPU tier's own typed order (busy programs' copies dropped before idle ones'):
  one key orders both tiers here, so among host copies a GPU-tier program's ranks
  last; the host tier only takes one when the pool is short after every waiting- and
  CPU-tier program's KV is gone, so this rarely decides anything.
- CPU contention of tools: the simulator has none.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from saga_server.core.admission import ACTIVE, PARKED, WAITING, AdmissionPlan, AdmissionState

from ..policy import SimPolicy
from ..session import ENDED

if TYPE_CHECKING:  # pragma: no cover
    from ..hardware import CostModel
    from ..session import Request, Session

__all__ = ["Mori", "Idleness", "WINDOW_CYCLES", "GPU", "CPU", "WAIT"]

WINDOW_CYCLES = 5  # k, the idleness window in inference/tool cycles (Section 4.2)
WAIT, CPU, GPU = 0, 1, 2  # the tiers, in the order the engine evicts their KV
_BAND = 1e9  # seconds; a key band per tier, wider than any simulated time
_REASONING, _ACTING = 0, 1


class Idleness:
    """Each program's idleness over its last `window` cycles (module docstring)."""

    def __init__(self, window: int = WINDOW_CYCLES) -> None:
        self.window = window
        self._cycles: dict[str, deque[list[float]]] = {}  # program -> [reasoning_s, acting_s] per cycle
        self._phase: dict[str, tuple[int, float]] = {}  # program -> (ongoing phase, its start)

    def reasoning_started(self, sid: str, now: float) -> None:
        """Its request passed the gate: from now on it is the engine's to serve."""
        self._phase[sid] = (_REASONING, now)

    def reasoning_ended(self, sid: str, now: float) -> None:
        phase = self._phase.pop(sid, None)
        spent = now - phase[1] if phase is not None and phase[0] == _REASONING else 0.0
        self._cycles.setdefault(sid, deque(maxlen=self.window)).append([spent, 0.0])

    def acting_started(self, sid: str, now: float) -> None:
        self._phase[sid] = (_ACTING, now)

    def acting_ended(self, sid: str, now: float) -> None:
        phase = self._phase.pop(sid, None)
        if phase is None or phase[0] != _ACTING:
            return
        cycles = self._cycles.setdefault(sid, deque(maxlen=self.window))
        if not cycles:
            cycles.append([0.0, 0.0])
        cycles[-1][1] += now - phase[1]

    def score(self, sid: str, now: float) -> float:
        """Idleness in [0, 1]; the ongoing phase counts with its time so far."""
        cycles = [list(c) for c in self._cycles.get(sid, ())]
        phase = self._phase.get(sid)
        if phase is not None:
            kind, since = phase
            if kind == _REASONING:
                cycles = cycles[len(cycles) - self.window + 1:] if len(cycles) >= self.window else cycles
                cycles.append([now - since, 0.0])
            elif cycles:
                cycles[-1][1] += now - since
            else:
                cycles.append([0.0, now - since])
        reasoning = sum(c[0] for c in cycles)
        acting = sum(c[1] for c in cycles)
        total = reasoning + acting
        return acting / total if total > 0.0 else 0.0

    def forget(self, sid: str) -> None:
        self._cycles.pop(sid, None)
        self._phase.pop(sid, None)


@dataclass(slots=True)
class _Program:
    sid: str
    size: int  # KV tokens its latest request needs
    tier: int = WAIT
    pending: int = 0  # its requests waiting or running at the engine
    ran: bool = False  # it held a tier before: a returning program, not a new one


class _MoriAdmission:
    """MORI's three tiers on one worker, as the core's `AdmissionControl`."""

    def __init__(self, gpu_tokens: int, cpu_tokens: int, idleness: Idleness, tiers: dict[str, int],
                 clock: Callable[[], float]) -> None:
        self.gpu_tokens = gpu_tokens
        self.cpu_tokens = cpu_tokens
        self.idleness = idleness
        self.tiers = tiers  # program -> tier, shared with the policy's `key`
        self.clock = clock
        self._programs: dict[str, _Program] = {}
        self.used = {GPU: 0, CPU: 0, WAIT: 0}
        self.demoted = 0  # programs moved out of the GPU tier

    def __len__(self) -> int:
        return len(self._programs)

    def tier(self, sid: str) -> int | None:
        p = self._programs.get(sid)
        return None if p is None else p.tier

    # -- engine events -------------------------------------------------------------

    def ready(self, sid: str, tokens: int, tenant: str = "") -> bool:
        p = self._programs.get(sid)
        if p is None:
            p = self._programs[sid] = _Program(sid, tokens)
            self.used[WAIT] += tokens
            self.tiers[sid] = WAIT
        p.pending += 1
        self._resize(p, tokens)
        if p.tier == GPU:
            self.idleness.reasoning_started(sid, self.clock())
            return True
        return False

    def finished(self, sid: str) -> None:
        p = self._programs.get(sid)
        if p is not None:
            p.pending = max(0, p.pending - 1)

    def served(self, sid: str, held_tokens: int, recomputed_tokens: int) -> None:
        pass  # the tiers' capacities are fixed

    def ended(self, sid: str) -> None:
        p = self._programs.pop(sid, None)
        if p is not None:
            self.used[p.tier] -= p.size
        self.tiers.pop(sid, None)
        self.idleness.forget(sid)

    def state(self, sid: str) -> AdmissionState | None:
        p = self._programs.get(sid)
        if p is None:
            return None
        if p.tier == GPU:
            return ACTIVE
        return WAITING if p.pending else PARKED

    # -- the rule ---------------------------------------------------------------------

    def plan(self) -> AdmissionPlan:
        now = self.clock()
        park: list[str] = []
        admit: list[str] = []
        over = self.used[GPU] - self.gpu_tokens
        if over > 0:  # contexts grew past the GPU tier: the idlest waiting on a tool leave
            park += self._demote(self._victims(over, self._cpu_room(), now, spill=True) or [])
        for p in sorted((p for p in self._programs.values() if p.pending and p.tier != GPU),
                        key=lambda p: self._promotion_order(p, now)):
            short = p.size - (self.gpu_tokens - self.used[GPU])
            if short > 0:
                room = self._cpu_room() + (p.size if p.tier == CPU else 0)  # its DRAM copy leaves
                victims = self._victims(short, room, now, spill=False)
                if victims is None:
                    if self._engine_busy():
                        break  # it fits neither tier for now, and nobody overtakes it
                    victims = self._victims(short, room, now, spill=True) or []  # never leave the engine idle
                park += self._demote(victims)
            self._move(p, GPU)
            p.ran = True
            self.idleness.reasoning_started(p.sid, now)
            admit.append(p.sid)
        self._relieve_cpu(now)
        return AdmissionPlan(tuple(admit), tuple(park))

    # -- internals ----------------------------------------------------------------------

    def _promotion_order(self, p: _Program, now: float) -> tuple:
        if p.tier == CPU:  # its tool call is over and its KV is in DRAM: least idle first
            return (0, self.idleness.score(p.sid, now), p.size, p.sid)
        return (1 if p.ran else 2, 0.0, p.size, p.sid)  # returning before new, smallest first

    def _engine_busy(self) -> bool:
        return any(p.pending for p in self._programs.values() if p.tier == GPU)

    def _cpu_room(self) -> int:
        return self.cpu_tokens - self.used[CPU]

    def _victims(self, need: int, cpu_room: int, now: float, *, spill: bool) -> list[tuple[_Program, int]] | None:
        """GPU-tier programs waiting on a tool to demote, idlest first, until `need`
        tokens are free: (program, tier it goes to). Each goes to the CPU tier while
        `cpu_room` lasts; past it, with `spill`, to the waiting tier, and without it
        nobody is demoted unless those fitting the CPU tier free `need` together."""
        cands = sorted((p for p in self._programs.values() if p.tier == GPU and not p.pending),
                       key=lambda p: (-self.idleness.score(p.sid, now), p.sid))
        out, freed = [], 0
        for p in cands:
            if freed >= need:
                break
            if p.size <= cpu_room:
                out.append((p, CPU))
                cpu_room -= p.size
            elif spill:
                out.append((p, WAIT))
            else:
                continue
            freed += p.size
        if freed < need and not spill:
            return None
        return out

    def _demote(self, victims: list[tuple[_Program, int]]) -> list[str]:
        for p, tier in victims:
            self._move(p, tier)
            self.demoted += 1
        return [p.sid for p, _ in victims]

    def _relieve_cpu(self, now: float) -> None:
        """Past the CPU tier's capacity (its programs' contexts grew), programs waiting
        on a tool drop to the waiting tier, busiest first, as MORI's typed CPU eviction
        keeps the idle programs' KV in DRAM longest."""
        over = self.used[CPU] - self.cpu_tokens
        if over <= 0:
            return
        for p in sorted((p for p in self._programs.values() if p.tier == CPU and not p.pending),
                        key=lambda p: (self.idleness.score(p.sid, now), p.sid)):
            if over <= 0:
                break
            self._move(p, WAIT)
            over -= p.size

    def _move(self, p: _Program, tier: int) -> None:
        self.used[p.tier] -= p.size
        self.used[tier] += p.size
        p.tier = tier
        self.tiers[p.sid] = tier

    def _resize(self, p: _Program, tokens: int) -> None:
        self.used[p.tier] += tokens - p.size
        p.size = tokens


class Mori(SimPolicy):
    """MORI: programs ranked by idleness, the busiest in GPU memory, the idlest demoted
    to the host tier, admission at each tier (module docstring)."""

    name = "mori"
    host_tier = True

    def __init__(self, window: int = WINDOW_CYCLES) -> None:
        self.window = window
        self.idleness = Idleness(window)
        self.tiers: dict[str, int] = {}  # program -> tier, written by the workers' controllers
        self._clock: Callable[[], float] = lambda: 0.0

    def bind(self, clock: Callable[[], float], seed: int) -> None:
        self._clock = clock
        self.idleness = Idleness(self.window)
        self.tiers = {}

    def key(self, s: "Session", now: float) -> float:
        if s.state == ENDED:
            return -math.inf
        return self.tiers.get(s.session_id, GPU) * _BAND + s.last_access

    def admission(self, capacity_tokens: int, host_tokens: int, cost: "CostModel",
                  parkable: Callable[[str], bool]) -> _MoriAdmission:
        return _MoriAdmission(capacity_tokens, host_tokens, self.idleness, self.tiers, self._clock)

    def on_llm_end(self, s: "Session", r: "Request", now: float) -> None:
        self.idleness.reasoning_ended(s.session_id, now)

    def on_tool_start(self, s: "Session", now: float) -> None:
        self.idleness.acting_started(s.session_id, now)

    def on_tool_end(self, s: "Session", now: float) -> None:
        self.idleness.acting_ended(s.session_id, now)

    def on_session_end(self, s: "Session", now: float) -> None:
        self.idleness.forget(s.session_id)
        self.tiers.pop(s.session_id, None)
