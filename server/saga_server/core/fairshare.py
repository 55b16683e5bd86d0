"""Agent Fair Share (AFS): task-level fairness between tenants.

Rule. Each tenant i has a virtual queue Q_i of owed service (tokens), updated on
every unit of service s delivered to anyone (Lyapunov-style, clamped at zero):

    Q_i <- max(0, Q_i + s * w_i / W - s * [i was served])

over the *active* tenants (those with requests asking for priority in the last
`active_window_s`; W = sum of their weights). A request of tenant i in task k
gets the drift-plus-penalty score

    score = Q_i / queue_scale_tokens + V * min(u_k, urgency_cap)
    u_k   = remaining expected work of the task (seconds, from the AEG)
            / time left to its deadline (0 without a deadline, and 0 once late)

and the engine serves the highest score first; `priority` returns -score so
that LOWER = sooner, like vLLM's request.priority.

Bound. Urgency contributes at most V * urgency_cap; so once a backlogged
tenant's owed service exceeds another's by queue_scale_tokens * V * urgency_cap
tokens, its requests outrank all of the other's. With equal weights, owed
service of each backlogged tenant therefore stays within
B = queue_scale_tokens * V * urgency_cap + L (L the largest service quantum
recorded) of every other's (a pair's gap grows, by one quantum, only right after
the lower-owed one was preferred, i.e. when the gap was at most B - L), whatever
the mix of task lengths: cumulative service deviates from the weighted fair share by at most
B tokens, so task completion times deviate from fair-share completion by at most
B tokens' worth of service time, independent of how heterogeneous the tenants'
demands are (their heterogeneity enters only through the capped urgency).
Within that bound urgency orders work: a task that will miss its deadline at its
current pace goes ahead of one with slack (the "both tenants meet deadlines that
FCFS misses" case). A task already past its deadline has no urgency left: serving
it first can no longer bring it in time and would make others late in turn (under
overload, late-first is earliest-deadline-first's domino: docs/RESEARCH.md, "A
deadline per user turn"). It keeps its place by fair share and seniority, as a task
without a deadline does. With unequal weights the gap stays bounded too, but the
pairwise argument no longer gives B (unserved pairs drift apart at the weight
difference; what random loads gave: docs/RESEARCH.md, "The workflow core").

Within a tenant. Requests with equal scores (one tenant, no deadline pressure)
are ordered by their task's *seniority*: the time the task (session) started, so
the engine finishes tasks in the order they began instead of interleaving all of
them (for a session with a person in the loop, the task is its running user turn:
`turns`) (request-level FCFS is processor sharing between tasks: with n similar tasks
in the queue every one finishes near the end; in task order the k-th finishes
after about k/n of that time, so mean completion nearly halves). It also keeps
the KV working set on the fewest sessions. A request without a session is a task
that started when it arrived. Bound: a request is overtaken only by requests of
tasks that started before its own, and no task can start earlier later on, so the
tasks ahead of it only ever leave: FCFS over tasks, which starves none. By default
seniority reaches back as far as the task does. `seniority_window_s` can clamp it
to that many seconds before the request's arrival, so that a request is overtaken
only by requests arriving within the window after it (0 gives request-level
FCFS); no default window, because a window is a guess at how long tasks run, and
where they run longer (tasks take longest under overload, when order matters
most) it hands the oldest tasks' places to younger ones: their tail grows, and
their parked KV waits longer to return (measured: docs/RESEARCH.md, "Task
seniority without a window").

A client's priority (Dynamo's `nvext.agent_hints.priority`, `proxy.agent_hints`)
moves its request's seniority earlier by that many seconds, at most
`max_priority_jump_s`: it reorders the tenant's own requests only, since the score
decides first (a tenant's share is not for its clients to buy); so a request can
also be overtaken by tasks that started up to `max_priority_jump_s` after its own
(with a window, by arrivals within `seniority_window_s + max_priority_jump_s`).

Cluster. On several engines each keeps its own queues; `record_peer_service`
feeds in the service the *other* engines delivered (see `cluster_share`), which
updates Q exactly like local service but is not counted in `served` (so it is
never reported back). With that feed every engine's queues follow the cluster's
service, and a tenant that spreads its sessions over engines is ranked by all
the service it received, not by one engine's share of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["FairShareConfig", "FairShare", "urgency", "seniority"]


@dataclass(frozen=True, slots=True)
class FairShareConfig:
    v: float = 1.0
    queue_scale_tokens: float = 8192.0
    urgency_cap: float = 10.0
    active_window_s: float = 60.0
    seniority_window_s: float = math.inf  # inf: as far back as the task began
    max_priority_jump_s: float = 60.0
    weights: tuple[tuple[str, float], ...] = ()  # (tenant, weight); others weigh 1

    def __post_init__(self) -> None:
        if self.v < 0 or self.queue_scale_tokens <= 0 or self.urgency_cap <= 0 or self.active_window_s <= 0:
            raise ValueError("v >= 0 and queue_scale_tokens, urgency_cap, active_window_s > 0 required")
        if not self.seniority_window_s >= 0 or not self.max_priority_jump_s >= 0:
            raise ValueError("seniority_window_s and max_priority_jump_s must be >= 0")
        if any(w <= 0 for _, w in self.weights):
            raise ValueError("tenant weights must be > 0")


def urgency(remaining_s: float, deadline_at: float | None, now: float, cap: float) -> float:
    if deadline_at is None:
        return 0.0
    left = deadline_at - now
    if left <= 0.0:
        return 0.0
    u = remaining_s / left
    return u if u < cap else cap


def seniority(task_started_at: float | None, arrived_at: float, window_s: float, jump_s: float = 0.0) -> float:
    """Within-tenant order key of a request (LOWER = sooner): its task's start,
    clamped to at most `window_s` before the request arrived, less the client's
    priority `jump_s` (already capped)."""
    started = arrived_at if task_started_at is None else min(task_started_at, arrived_at)
    floor = arrived_at - window_s
    return (started if started > floor else floor) - jump_s


class FairShare:
    """Virtual queues and scores (not thread-safe: the facade serialises)."""

    __slots__ = ("cfg", "_w", "_q", "_seen", "served")

    def __init__(self, cfg: FairShareConfig | None = None) -> None:
        self.cfg = cfg or FairShareConfig()
        self._w = dict(self.cfg.weights)
        self._q: dict[str, float] = {}
        self._seen: dict[str, float] = {}
        self.served: dict[str, float] = {}

    def owed(self, tenant: str) -> float:
        return self._q.get(tenant, 0.0)

    def touch(self, tenant: str, now: float) -> None:
        self._seen[tenant] = now
        if tenant not in self._q:
            self._q[tenant] = 0.0

    def active(self, now: float) -> list[str]:
        window = self.cfg.active_window_s
        gone = [t for t, at in self._seen.items() if now - at > window]
        for t in gone:  # idle tenants neither bank credit nor keep memory
            del self._seen[t]
            self._q.pop(t, None)
        return list(self._seen)

    def record_service(self, tenant: str, tokens: float, now: float) -> None:
        """Service this engine delivered to `tenant`."""
        if tokens < 0:
            raise ValueError(f"service tokens must be >= 0, got {tokens!r}")
        self.served[tenant] = self.served.get(tenant, 0.0) + tokens
        if len(self.served) > 4096:  # bounded: forget the least-served counter
            self.served.pop(min(self.served, key=self.served.__getitem__))
        self._drift(tenant, tokens, now)

    def record_peer_service(self, tenant: str, tokens: float, now: float) -> None:
        """Service other engines of the cluster delivered to `tenant`."""
        if not tokens >= 0:  # NaN too
            raise ValueError(f"service tokens must be >= 0, got {tokens!r}")
        self._drift(tenant, tokens, now)

    def _drift(self, tenant: str, tokens: float, now: float) -> None:
        self.touch(tenant, now)
        act = self.active(now)
        w = self._w
        total_w = sum(w.get(t, 1.0) for t in act)
        q = self._q
        for t in act:
            owed = q[t] + tokens * w.get(t, 1.0) / total_w
            if t == tenant:
                owed -= tokens
            q[t] = owed if owed > 0.0 else 0.0

    def score(self, tenant: str, u: float) -> float:
        c = self.cfg
        return self._q.get(tenant, 0.0) / c.queue_scale_tokens + c.v * (u if u < c.urgency_cap else c.urgency_cap)

    def priority(self, tenant: str, u: float, now: float) -> float:
        self.touch(tenant, now)
        return -self.score(tenant, u)
