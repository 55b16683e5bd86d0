"""`LogOnce`: report a recurring failure once, not on every hint.

SAGA's hooks run on every model call, tool call and proxied request, and must
never disturb the agent; a failure that repeats (a broken patch, an unreachable
hint service) is logged as a warning the first time its key is seen, and at
DEBUG after that. Each owner keeps its own `LogOnce` (an integration module, a
`HintClient`, a proxy), keyed by what failed. Thread-safe enough for its use: two
threads failing at the same instant may both warn.

    _log_once = LogOnce(logging.getLogger("saga_sdk.langchain"))
    _log_once("describe", "could not read the graph of %r", name, exc_info=True)
"""

from __future__ import annotations

import logging

__all__ = ["LogOnce"]


class LogOnce:
    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._seen: set[str] = set()

    def __call__(self, key: str, msg: str, *args, exc_info: bool = False) -> None:
        if key in self._seen:
            self.logger.debug(msg, *args)
            return
        self._seen.add(key)
        self.logger.warning(msg, *args, exc_info=exc_info)
