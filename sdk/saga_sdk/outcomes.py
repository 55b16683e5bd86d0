"""`outcome_of`: the hint outcome of whatever ended a tool call or a session.

One rule for every integration (LangChain, AutoGen, the Agents SDK) and for `HintClient.session`:

| what ended it | tool outcome | session outcome |
|---|---|---|
| nothing (`None`) | "ok" | "completed" |
| a cancellation: `KeyboardInterrupt`, `GeneratorExit` (a stream closed before its end), or any `CancelledError` (asyncio's, concurrent.futures', a subclass: matched by class name, so nothing is imported) | "cancelled" | "cancelled" |
| any other exception, `TimeoutError` and `SystemExit` included | "error" | "failed" |

The wire contract (`ToolOutcome`, `SessionOutcome` in proto/saga/v1/hints.proto)
has no timeout outcome: a timed-out tool failed, as far as the schedule goes.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["outcome_of", "session_outcome_of"]

_CANCELLED = (KeyboardInterrupt, GeneratorExit)
_AS_SESSION = {"ok": "completed", "error": "failed", "cancelled": "cancelled"}


def outcome_of(exc: BaseException | None) -> Literal["ok", "error", "cancelled"]:
    """The tool outcome (see the module docstring)."""
    if exc is None:
        return "ok"
    if isinstance(exc, _CANCELLED) or any(c.__name__ == "CancelledError" for c in type(exc).__mro__):
        return "cancelled"
    return "error"


def session_outcome_of(exc: BaseException | None) -> Literal["completed", "failed", "cancelled"]:
    """The same outcome in the session vocabulary."""
    return _AS_SESSION[outcome_of(exc)]
