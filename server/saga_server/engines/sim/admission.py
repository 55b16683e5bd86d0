"""Session admission in the simulator: requests of sessions the worker has not admitted
wait outside its queue, and parked sessions' KV leaves its pool.

A policy with admission gives each worker a controller (`SimPolicy.admission`; SAGA's is
the core's `SessionAdmission`, the ThunderAgent baseline has its own) with the core's
interface: `ready(session, tokens, tenant)` when a request arrives, `finished` and
`ended` as requests and sessions end, and `plan()` for what to admit and park. The
simulator carries the plan out: an admitted session's waiting request joins the queue;
a parked session's prefix becomes the first to be evicted from the pool (it stays while
nobody needs the room; evicted, it goes to the host tier like any other). A task's completion time counts
from its arrival, so time spent waiting for admission is part of it.

`AdmissionGate` is mixed into `Simulator`: it uses the simulator's workers, sessions,
clock, result and cost model.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .cache import SOFT
from .session import Session

if TYPE_CHECKING:  # pragma: no cover
    from .worker import Worker

__all__ = ["AdmissionGate"]


class AdmissionGate:
    def _admitted(self, w: "Worker", s: Session, tokens: int) -> bool:
        """Whether the session's arriving request may join the queue now; if not it
        waits at the gate until a plan admits it."""
        if w.adm is None or w.adm.ready(s.session_id, tokens, s.tenant):
            return True
        w.gated[s.session_id] = s
        self._rebalance(w, arriving=s.session_id)
        return s.session_id not in w.gated

    def _rebalance(self, w: "Worker", arriving: str | None = None) -> None:
        """Carry out the controller's plan; an admitted `arriving` session is left to
        the caller, which is enqueueing it."""
        plan = w.adm.plan()
        for sid in plan.park:
            self._park(w, self.sessions[sid])
        res = self.result
        res.parked += len(plan.park)
        for sid in plan.admit:
            s = w.gated.pop(sid, None)
            if s is not None and sid != arriving:
                res.admitted_after_wait += 1
                self._enqueue(s, gate=False)

    def _park(self, w: "Worker", s: Session) -> None:
        """A parked session's KV is the first to go when the pool needs room (as KV a
        vLLM engine releases into its free queue); evicted, it goes to the host tier
        where there is one, in the policy's host order."""
        w.cache.set_key(s.session_id, -math.inf, SOFT)

    def _leave_gate(self, w: "Worker", s: Session) -> None:
        """The session ended (or left the worker): its admission state goes."""
        if w.adm is not None:
            w.gated.pop(s.session_id, None)
            w.adm.ended(s.session_id)
            self._rebalance(w)
