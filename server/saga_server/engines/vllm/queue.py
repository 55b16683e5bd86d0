"""`RankedRequestQueue`: vLLM's waiting queue in an order SAGA chooses.

It is a `RequestQueue` (vLLM's own queue abstraction; the FCFS one, extended), so the
scheduler pops, peeks, prepends and removes exactly as with its stock queue. Between
steps `rerank(rank)` sorts it by `rank(request)`, stably; preempted requests stay in
front, where vLLM put them to resume first.
"""

from __future__ import annotations

from typing import Callable

from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.request import Request, RequestStatus

__all__ = ["RankedRequestQueue"]


class RankedRequestQueue(FCFSRequestQueue):
    def rerank(self, rank: Callable[[Request], tuple]) -> bool:
        """Order the queue by `rank` (lower first); returns whether the order changed."""
        keyed = sorted(((r.status != RequestStatus.PREEMPTED, rank(r), i, r) for i, r in enumerate(self)),
                       key=lambda t: t[:3])
        if all(t[2] == i for i, t in enumerate(keyed)):
            return False
        self.clear()
        self.extend(t[3] for t in keyed)
        return True
