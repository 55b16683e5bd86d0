"""SAGA SDK: tell a SAGA inference server what your agent is doing.

    from saga_sdk import get_client
    hints = get_client()                      # configured from SAGA_* env vars
    with hints.session(workflow="my-agent") as s:
        hints.llm_call_start(s.session_id, step=s.next_step())
        ...

Hints never block or break the agent: see `HintClient`. Framework integrations
live in `saga_sdk.integrations` (optional extras).
"""

from .client import ClientStats, HintClient, get_client, set_client
from .config import SagaConfig
from .context import SessionContext, current_session, new_session_id, session_scope
from .reader import HintReader, SagaUnavailable, UnknownSession

__all__ = [
    "ClientStats",
    "HintClient",
    "HintReader",
    "SagaConfig",
    "SagaUnavailable",
    "SessionContext",
    "UnknownSession",
    "current_session",
    "get_client",
    "new_session_id",
    "session_scope",
    "set_client",
]

__version__ = "0.1.0"
