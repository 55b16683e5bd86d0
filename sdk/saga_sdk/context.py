"""The current agent session, shared by every integration in a process.

A `contextvars.ContextVar` so that concurrent agents (threads, asyncio tasks) each
see their own session, and an integration that opens a session (a LangChain root
run, an AutoGen team run) makes it visible to another that only tags requests
(the OpenAI SDK patch, the AutoGen model-client wrapper).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Iterator

__all__ = ["SessionContext", "current_session", "session_scope", "new_session_id"]


@dataclass(slots=True)
class SessionContext:
    session_id: str
    tenant: str = ""
    workflow: str = ""
    _steps: "itertools.count[int]" = field(default_factory=lambda: itertools.count(1), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next_step(self) -> int:
        """1-based index of the next LLM call; thread-safe (parallel branches)."""
        with self._lock:
            return next(self._steps)


_current: ContextVar[SessionContext | None] = ContextVar("saga_current_session", default=None)


def current_session() -> SessionContext | None:
    return _current.get()


def set_current_session(ctx: SessionContext | None) -> Token:
    return _current.set(ctx)


def reset_current_session(token: Token) -> None:
    _current.reset(token)


@contextlib.contextmanager
def session_scope(session_id: str | None = None, *, tenant: str = "", workflow: str = "") -> Iterator[SessionContext]:
    """Make a session current for the enclosed code (no hints are sent: see
    `HintClient.session` for a scope that also announces start and end)."""
    ctx = SessionContext(session_id or new_session_id(), tenant, workflow)
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def new_session_id() -> str:
    return f"sess-{uuid.uuid4().hex[:16]}"
