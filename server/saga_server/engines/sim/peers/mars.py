"""MARS (Wang et al. 2026, arXiv 2604.26963) as a simulator baseline.

MARS puts an external control plane in front of the engine that decides how many agents
may run at all (admission, decoupled from execution), and an agent-centric scheduler
inside it that orders the admitted agents' requests by a multi-level feedback queue
and keeps a paused agent's KV on the GPU only when a warm resume pays for it.

What is modelled, and onto which hook:

1. *AIMD admission* (`admission` -> `AimdAdmission`, one per worker). The window is a
   number of agents. An agent's first request waits at the gate until fewer than
   `floor(window)` agents are admitted; once admitted it stays so until it ends (the
   control plane admits agents, not requests; nobody is paused to make room). The
   feedback is GPU KV pressure, taken each time a request of an admitted agent is
   scheduled (`served`): pressure is (a) the KV that admitted agents with a request
   queued or running need exceeds the GPU pool (the engine must queue or preempt:
   the oversubscription MARS's admission exists to prevent), or (b) the request had
   to recompute KV its agent had held (the pool and the host tier together were
   short: thrash).
   Without pressure the window grows by one agent per round (a round: as many
   scheduled requests as there are admitted agents, one request each, TCP's round
   trip); with it, it is multiplied by `DECREASE`, once per round (later signals of
   the same round are the same congestion). It grows only while it binds (an agent
   waits at the gate), as TCP's window does, so a quiet stretch cannot inflate it
   past what was ever tried.
   *CPU (tool) pressure*, MARS's second signal, is never raised here: the simulator
   runs every tool call for its traced duration whatever else runs, so tools never
   contend for CPU and there is nothing for the signal to see. The window reacts to
   GPU pressure alone.
2. *Agent-level MLFQ* (`queue_priority`). An agent's level is set by the service it
   has attained (seconds its requests spent in the batch, as an OS MLFQ counts CPU
   time): it starts at level 0 and drops one level each time it has used up its
   level's quantum, `QUANTUM_S` at level 0 doubling per level, down to the last of
   `LEVELS`. Requests are ordered by (level, the agent's arrival): short agents and
   agents early in their run go first, a level's agents in program order. The same
   order ranks KV for eviction (`key`): a demoted (more served) agent's KV goes
   first, and within a level the least recently used.
3. *KV retained only when a warm resume pays off* (`pin_ttl`, `key`). When an agent
   pauses for a tool, its KV is pinned for the tool's predicted duration (the moving
   average of that tool's observed calls, as the control plane sees tool starts and
   ends) when that duration is at most what a cold resume would cost: the transfer
   of its KV back from the host tier. Otherwise its KV is keyed below every running
   or queued agent's, so it is the first offloaded to the host tier when the pool
   needs room (it stays while nobody does). A tool never seen has no prediction and
   so no pin.

Constants. `DECREASE` = 0.5: MARS's admission is AIMD, and its multiplicative decrease
halves the window (TCP's factor). The MLFQ's levels and quanta are chosen here, not
taken from the paper: `LEVELS` = 4 and `QUANTUM_S` = 5 s doubling per level (5 s is a
few requests' time in the batch at these loads; doubling is the classic MLFQ rule).
The window starts at one agent and doubles each round
(slow start) until the first pressure, as TCP's does: no initial window is given,
and starting at one with additive growth alone would take a round per agent to reach
a pool's worth. The tool-duration average weighs each new call by `TOOL_EMA` = 0.2
(as the Continuum baseline here).

Left out: prefetch of offloaded KV ahead of a tool's end (not part of MARS's design
as described: offloaded KV comes back when the agent resumes);
MLFQ priority boosts (the admission window bounds how long an admitted agent can be
starved); CPU-side scheduling of tool calls (the simulator has none to schedule).
Tiers and placement as SAGA gets them: a host tier (and the disk tier the simulator
adds below it), the stock router, no steals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from saga_server.core.admission import AdmissionPlan

from ..policy import ActiveSetAdmission, SimPolicy, ToolDurations
from ..session import ENDED, TOOL

if TYPE_CHECKING:  # pragma: no cover
    from ..hardware import CostModel
    from ..session import Request, Session

__all__ = ["Mars", "AimdAdmission"]

DECREASE = 0.5  # multiplicative decrease of the admission window: halving
LEVELS = 4
QUANTUM_S = 5.0  # level 0's quantum of batch time; each level's is twice the one above
TOOL_EMA = 0.2

_STEP = 1e9  # seconds; larger than any simulated time: a key band per MLFQ level


class AimdAdmission(ActiveSetAdmission):
    """MARS's admission window (see the module docstring) with the interface of the
    core's `SessionAdmission`. `window`, `threshold`: the starting window and
    slow-start threshold (agents)."""

    def __init__(self, capacity_tokens: int, window: float = 1.0, threshold: float = math.inf) -> None:
        self.capacity_tokens = capacity_tokens
        self.window = window
        self.threshold = threshold
        self._kv: dict[str, int] = {}  # agent -> KV tokens of its latest request
        self._active: set[str] = set()
        self._pending: set[str] = set()  # a request of it waits or runs
        self._waiting: dict[str, None] = {}  # not admitted yet, in arrival order
        self._acked = 0  # requests scheduled without pressure this round
        self._deaf = 0  # requests still to schedule before a new signal counts

    def ready(self, session_id: str, tokens: int, tenant: str = "") -> bool:
        self._kv[session_id] = tokens
        self._pending.add(session_id)
        if session_id in self._active:
            return True
        self._waiting.setdefault(session_id, None)
        return False

    def gpu_pressure(self) -> float:
        """The KV the admitted agents with a request queued or running need, over the
        pool (above 1: oversubscribed)."""
        return sum(self._kv[s] for s in self._pending if s in self._active) / self.capacity_tokens

    def round(self) -> int:
        """Scheduled requests to a round: one per admitted agent."""
        return max(1, len(self._active))

    def served(self, session_id: str, held_tokens: int, recomputed_tokens: int) -> None:
        if session_id not in self._active:
            return
        if recomputed_tokens > 0 or self.gpu_pressure() > 1.0:
            self.congested()
        else:
            self.uncongested()

    def congested(self) -> None:
        """Pressure: halve the window, once per round."""
        if self._deaf > 0:
            self._deaf -= 1
            return
        self.window = self.threshold = max(1.0, self.window * DECREASE)
        self._acked = 0
        self._deaf = self.round() - 1  # the rest of this round

    def uncongested(self) -> None:
        """No pressure: one more agent per round (doubling per round in slow start),
        while the window binds (an agent waits: `plan` admits while it has room)."""
        self._deaf = max(0, self._deaf - 1)
        if not self._waiting:
            return
        if self.window < self.threshold:
            self.window += 1.0
            return
        self._acked += 1
        if self._acked >= self.round():
            self._acked = 0
            self.window += 1.0

    def ended(self, session_id: str) -> None:
        self._pending.discard(session_id)
        self._active.discard(session_id)
        self._waiting.pop(session_id, None)
        self._kv.pop(session_id, None)

    def plan(self) -> AdmissionPlan:
        admit: list[str] = []
        for sid in list(self._waiting):
            if len(self._active) >= int(self.window):
                # An engine with no admitted agent's request to run takes the head anyway.
                if admit or any(s in self._pending for s in self._active):
                    break
            del self._waiting[sid]
            self._active.add(sid)
            admit.append(sid)
        return AdmissionPlan(tuple(admit), ())


class Mars(SimPolicy):
    """MARS: AIMD agent admission on GPU KV pressure, an agent-level MLFQ, and KV kept
    over a tool call only when a warm resume pays off (module docstring)."""

    name = "mars"
    host_tier = True

    def __init__(self) -> None:
        self._served_s: dict[str, float] = {}  # agent -> seconds its requests spent in the batch
        self._tools = ToolDurations(TOOL_EMA)
        self._cost: CostModel | None = None

    def admission(self, capacity_tokens: int, host_tokens: int, cost: "CostModel",
                  parkable: Callable[[str], bool]) -> AimdAdmission:
        self._cost = cost
        return AimdAdmission(capacity_tokens)

    def level(self, s: "Session") -> int:
        """The agent's MLFQ level: how many quanta (doubling per level) it has used."""
        served, quantum, level = self._served_s.get(s.session_id, 0.0), QUANTUM_S, 0
        while level < LEVELS - 1 and served >= quantum:
            served -= quantum
            quantum *= 2.0
            level += 1
        return level

    def queue_priority(self, s: "Session", now: float) -> tuple[int, float]:
        return (self.level(s), s.started_at)

    def predicted_tool_s(self, s: "Session") -> float | None:
        return self._tools.predicted_s(s.tool_names)

    def retains(self, s: "Session") -> bool:
        """A warm resume pays off: the tool is predicted back before the agent's KV
        could be brought back from the host tier."""
        tool_s = self.predicted_tool_s(s)
        if tool_s is None or self._cost is None:
            return False
        return tool_s <= self._cost.transfer_s(s.kv_tokens)

    def pin_ttl(self, s: "Session", now: float, pressure: float) -> float:
        if s.state != TOOL or not self.retains(s):
            return 0.0
        return self.predicted_tool_s(s) or 0.0

    def key(self, s: "Session", now: float) -> float:
        if s.state == ENDED:
            return -math.inf
        band = self.level(s)
        if s.state == TOOL and not self.retains(s):
            band += LEVELS  # paused without a warm resume: offloaded before any other
        return s.last_access - band * _STEP

    def on_llm_end(self, s: "Session", r: "Request", now: float) -> None:
        sid = s.session_id
        self._served_s[sid] = self._served_s.get(sid, 0.0) + (now - r.scheduled_at)

    def on_tool_start(self, s: "Session", now: float) -> None:
        self._tools.started(s.session_id, now)

    def on_tool_end(self, s: "Session", now: float) -> None:
        self._tools.ended(s.session_id, s.tool_names, now)

    def on_session_end(self, s: "Session", now: float) -> None:
        self._served_s.pop(s.session_id, None)
        self._tools.forget(s.session_id)
