"""Zero-code SAGA: an OpenAI-compatible proxy that infers agent sessions.

`SessionTracker` (pure, `sessions`) names the session of each stateless request;
`SagaProxy` (ASGI, `app`) forwards requests and emits hints; `saga proxy` (`cli`)
runs it. The proxy's third-party imports (httpx, starlette, uvicorn) load only
when `SagaProxy` is used, so the tracker stays importable on its own.
"""

from .sessions import HintEvent, SessionTracker, TrackerStats, Turn, explicit_session_id

__all__ = ["HintEvent", "ProxyConfig", "SagaProxy", "SessionTracker", "TrackerStats", "Turn",
           "explicit_session_id"]


def __getattr__(name: str):
    if name in ("ProxyConfig", "SagaProxy"):
        from . import app
        return getattr(app, name)
    raise AttributeError(name)
