"""Who a call comes from: its API key, as a `Caller`, and the key's hint rate.

A client presents its key as `authorization: Bearer <key>` (what `hint_channel`
sends) or `x-saga-api-key: <key>`. The key's line in the `KeyRing` says the
caller's tenant and role. An admin key may act for one tenant by adding
`x-saga-tenant: <tenant>` (`on_behalf_of`): the call then counts as an agent of
that tenant, with that tenant's limits. That is how the cluster router forwards
what agents sent it (it authenticated them itself) without lending them its
rights; the header of any other key is ignored.

Hint rate: a token bucket per key (`hint_rate` events per second, `hint_burst`
deep; keys without a rate are not limited). `allow` says how many of a call's
events fit now and takes them; the rest are dropped by the caller of `allow`,
never waited for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from ..core.events import AGENT, Caller
from .keys import ApiKey, KeyRing

__all__ = ["Authenticator", "Credentials", "TENANT_HEADER", "on_behalf_of"]

TENANT_HEADER = "x-saga-tenant"
_MAX_TENANT_CHARS = 256


def on_behalf_of(tenant: str) -> tuple[tuple[str, str], ...]:
    """Call metadata with which an admin key acts as an agent of `tenant`."""
    return ((TENANT_HEADER, tenant),)


@dataclass(frozen=True, slots=True)
class Credentials:
    """An authenticated call: the key it presented, what the key stands for, and
    whom the call acts as."""

    key: str
    entry: ApiKey
    caller: Caller


@dataclass(slots=True)
class _Bucket:
    rate: float
    burst: float
    tokens: float
    at: float


class Authenticator:
    """Resolves call metadata against a `KeyRing` (thread-safe). `clock` is the
    hint service's (a test's manual clock makes rates deterministic)."""

    def __init__(self, keys: KeyRing, clock: Callable[[], float] = time.monotonic) -> None:
        self.keys = keys
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    def resolve(self, metadata: Iterable[tuple[str, str]] | None) -> Credentials | None:
        """The call's credentials; None when it presents no key the ring knows."""
        md = dict(metadata or ())
        key = md.get("x-saga-api-key") or md.get("authorization", "").removeprefix("Bearer ")
        entry = self.keys.lookup(key)
        if entry is None:
            return None
        caller = entry.caller
        tenant = md.get(TENANT_HEADER)
        if caller.is_admin and tenant and len(tenant) <= _MAX_TENANT_CHARS and tenant.isprintable():
            caller = Caller(tenant, AGENT, self.keys.limits(tenant))
        return Credentials(key, entry, caller)

    def allow(self, credentials: Credentials, n: int) -> int:
        """How many of `n` events the key's hint rate lets through now (taken from
        its bucket); `n` for a key without a rate."""
        rate, burst = credentials.entry.hint_rate, credentials.entry.hint_burst
        if rate is None or n <= 0:
            return max(0, n)
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(credentials.key)
            if bucket is None or (bucket.rate, bucket.burst) != (rate, burst):  # new key, or reloaded
                bucket = self._buckets[credentials.key] = _Bucket(rate, burst, burst, now)
                self._prune()
            bucket.tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * rate)
            bucket.at = now
            taken = min(n, int(bucket.tokens))
            bucket.tokens -= taken
            return taken

    def _prune(self) -> None:
        """Forget buckets of keys the ring no longer has (lock held)."""
        if len(self._buckets) > 2 * len(self.keys) + 16:
            self._buckets = {k: b for k, b in self._buckets.items() if self.keys.lookup(k) is not None}
