"""`LoadLog`: the KV loads one engine's scheduler started, and how each ended: pulls
from another engine (SAGA's `NixlConnector`) or loads from the host tier (SAGA's
`OffloadingConnector`, `engines/vllm/tier.py`). vLLM counts loaded KV as computed by
the prefix cache; the plugin counts it apart. Kept apart from `nixl` so that it loads
without NIXL's native libraries."""

from __future__ import annotations

import collections
import time
from typing import Callable, Iterable

__all__ = ["LoadLog"]


class LoadLog:
    """The KV loads one engine's scheduler started, and how each ended.

    `listener(ok, tokens, seconds)` hears every ended load (`ok` False: the worker
    reported the load failed and vLLM recomputes it); `take(request_id)` is what the
    request really loaded (0 for a failed or unknown load), asked once when the
    request is scheduled. Ended loads nobody took are forgotten oldest first."""

    MAX_UNTAKEN = 4096

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.listener: Callable[[bool, int, float], None] | None = None
        self._pending: dict[str, tuple[int, float]] = {}  # request id -> (tokens, started)
        self._ended: collections.OrderedDict[str, int] = collections.OrderedDict()

    def started(self, request_id: str, tokens: int) -> None:
        self._pending[request_id] = (tokens, self.clock())

    def finished(self, received: Iterable[str], failed: Iterable[str]) -> None:
        failed = set(failed)
        for request_id in received:
            started = self._pending.pop(request_id, None)
            if started is None:
                continue
            tokens, at = started
            ok = request_id not in failed
            self._ended[request_id] = tokens if ok else 0
            while len(self._ended) > self.MAX_UNTAKEN:
                self._ended.popitem(last=False)
            if self.listener is not None:
                self.listener(ok, tokens, self.clock() - at)

    def take(self, request_id: str) -> int:
        return self._ended.pop(request_id, 0)
