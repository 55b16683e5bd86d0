"""`RankedRequestQueue`: vLLM's waiting queue in an order SAGA chooses.

It is a `RequestQueue` (vLLM's own queue abstraction; the FCFS one, extended), so the
scheduler pops, peeks, prepends and removes exactly as with its stock queue. Between
steps `rerank(rank)` sorts it by `rank(request)`, stably; preempted requests stay in
front, where vLLM put them to resume first. Requests that may not be scheduled yet
(`may_schedule`: their session waits for admission) wait behind the gate: they count in the
queue's length (vLLM still sees unfinished work and keeps stepping) and can be removed
(aborts), but vLLM is offered them only once `ungate` finds them schedulable;
`regate` takes offered ones back when they stop being schedulable before vLLM took them.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.request import Request, RequestStatus

__all__ = ["RankedRequestQueue"]


class RankedRequestQueue(FCFSRequestQueue):
    def __init__(self, may_schedule: Callable[[Request], bool] = lambda request: True) -> None:
        super().__init__()
        self._may_schedule = may_schedule
        self.gated: list[Request] = []  # arrival order

    def add_request(self, request: Request) -> None:
        if self._may_schedule(request):
            self.append(request)
        else:
            self.gated.append(request)

    def ungate(self) -> bool:
        """Offer vLLM the gated requests that may be scheduled now (in arrival order,
        behind the others until the next `rerank`); returns whether any were."""
        ready = [r for r in self.gated if self._may_schedule(r)]
        if ready:
            self.gated = [r for r in self.gated if r not in ready]
            self.extend(ready)
        return bool(ready)

    def regate(self) -> bool:
        """Take back behind the gate the offered requests that may not be scheduled
        now (a hold that began after they were offered); preempted requests stay.
        Returns whether any were."""
        back = [r for r in self if r.status != RequestStatus.PREEMPTED and not self._may_schedule(r)]
        if back:
            super().remove_requests(set(back))
            self.gated.extend(back)
        return bool(back)

    def rerank(self, rank: Callable[[Request], tuple]) -> bool:
        """Order the schedulable requests by `rank` (lower first); returns whether the
        order changed."""
        keyed = sorted(((r.status != RequestStatus.PREEMPTED, rank(r), i, r) for i, r in enumerate(self)),
                       key=lambda t: t[:3])
        if all(t[2] == i for i, t in enumerate(keyed)):
            return False
        self.clear()
        self.extend(t[3] for t in keyed)
        return True

    def remove_request(self, request: Request) -> None:
        if request in self.gated:
            self.gated.remove(request)
        else:
            super().remove_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        gone = requests if isinstance(requests, set) else set(requests)
        self.gated = [r for r in self.gated if r not in gone]
        super().remove_requests(gone)

    def __len__(self) -> int:
        return super().__len__() + len(self.gated)

    def __bool__(self) -> bool:
        return super().__len__() > 0  # only what vLLM may schedule

    def __iter__(self) -> Iterator[Request]:
        return super().__iter__()  # the schedulable ones, in order
