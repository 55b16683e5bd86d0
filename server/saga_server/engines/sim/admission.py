"""Session admission in the simulator: requests of sessions the worker has not admitted
wait outside its queue, and parked sessions' KV leaves its pool.

A policy with admission gives each worker a controller (`SimPolicy.admission`; SAGA's is
the core's `SessionAdmission`, the ThunderAgent baseline has its own), which the
worker's `EnginePolicy` drives as the vLLM plugin's does: the policy parks (the
parked session's prefix becomes the first to be evicted from the pool: it stays while
nobody needs the room; evicted, it goes to the host tier like any other) and protects
the KV of admitted sessions; the simulator moves an admitted session's waiting request
into the queue. A task's completion time counts
from its arrival, so time spent waiting for admission is part of it.

`AdmissionGate` is one part of a `Simulator` (`sim`), built by it: it works on the simulator's
workers, sessions, clock, result and event queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .session import Session, request_key

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Simulator
    from .worker import Worker

__all__ = ["AdmissionGate"]


class AdmissionGate:
    def __init__(self, sim: "Simulator") -> None:
        self.sim = sim

    def admitted(self, w: "Worker", s: Session, tokens: int, reusable: int) -> bool:
        """The session's request (needing `tokens` of KV, continuing `reusable` of what
        the session held) joins the worker's queue; whether it may now. If not it
        waits at the gate until a plan admits it."""
        sim = self.sim
        if w.engine.queued(request_key(s), tokens, sim.now, reusable_tokens=reusable):
            return True
        w.gated[s.session_id] = s
        self.rebalance(w, arriving=s.session_id)
        return s.session_id not in w.gated

    def rebalance(self, w: "Worker", arriving: str | None = None) -> None:
        """Carry out the policy's admission plan (it parks and protects the KV itself);
        an admitted `arriving` session is left to the caller, which is enqueueing it."""
        sim = self.sim
        plan = w.engine.plan()
        res = sim.result
        res.parked += len(plan.park)
        for sid in plan.admit:
            s = w.gated.pop(sid, None)
            if s is not None and sid != arriving:
                res.admitted_after_wait += 1
                sim._enqueue(s, gate=False)

    def leave(self, w: "Worker", s: Session) -> None:
        """The session ended or left the worker (the policy forgot its admission
        state): a request of it no longer waits, and others may be admitted."""
        w.gated.pop(s.session_id, None)
        if w.engine.admission is not None:
            self.rebalance(w)
