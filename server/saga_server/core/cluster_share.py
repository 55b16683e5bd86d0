"""Cluster-wide Agent Fair Share: what each engine must learn about the others.

Each engine reports the service it delivered per tenant as cumulative token
counters (`FairShare.served`, on the wire `ServerStats.served_tokens_by_tenant`).
`PeerServiceLedger` turns a stream of those
reports into, for every engine, the service delivered to each tenant on the
*other* engines since that engine was last told; the engine applies it with
`FairShare.record_peer_service`. Together every engine ranks tenants by their
service across the cluster, so spreading sessions over engines buys a tenant
nothing (see `fairshare` for the rule and its bound).

Counters are read as they come: the first report of an engine (or a tenant in
it) is a baseline, not service; a counter that went down (the engine restarted,
or dropped a rarely served tenant) is re-based; a tenant missing from a report
keeps its last value, so its later return is not mistaken for new service.
Undelivered service accumulates per engine (bounded) until `take` succeeds.
"""

from __future__ import annotations

import math
from typing import Mapping

__all__ = ["PeerServiceLedger"]


class PeerServiceLedger:
    """Not thread-safe: one owner (the cluster router) calls it."""

    def __init__(self, max_tenants: int = 4096) -> None:
        self._max_tenants = max_tenants
        self._last: dict[str, dict[str, float]] = {}  # engine -> tenant -> last cumulative
        self._owed: dict[str, dict[str, float]] = {}  # engine -> tenant -> not yet told

    def observe(self, engine: str, served: Mapping[str, float]) -> None:
        """One engine's cumulative per-tenant counters."""
        last = self._last.setdefault(engine, {})
        self._owed.setdefault(engine, {})
        for tenant, total in served.items():
            if not isinstance(total, (int, float)) or not math.isfinite(total) or total < 0:
                continue
            before = last.get(tenant)
            last[tenant] = float(total)
            if before is None or total <= before:
                continue  # baseline, or re-based after a reset
            grown = total - before
            for other, owed in self._owed.items():
                if other != engine and (tenant in owed or len(owed) < self._max_tenants):
                    owed[tenant] = owed.get(tenant, 0.0) + grown
        if len(last) > self._max_tenants:  # keep the most served
            for tenant in sorted(last, key=last.__getitem__)[:len(last) - self._max_tenants]:
                del last[tenant]

    def take(self, engine: str) -> dict[str, float]:
        """Service delivered elsewhere since `engine` was last told (and forget it)."""
        owed = self._owed.get(engine)
        if not owed:
            return {}
        self._owed[engine] = {}
        return owed

    def give_back(self, engine: str, owed: Mapping[str, float]) -> None:
        """`take`'s result that could not be delivered: keep it for the next round."""
        if engine not in self._owed:
            return
        mine = self._owed[engine]
        for tenant, tokens in owed.items():
            mine[tenant] = mine.get(tenant, 0.0) + tokens

    def forget(self, engine: str) -> None:
        """The engine left the cluster."""
        self._last.pop(engine, None)
        self._owed.pop(engine, None)

    def engines(self) -> list[str]:
        return list(self._last)
