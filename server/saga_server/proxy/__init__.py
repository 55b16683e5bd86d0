"""Zero-code SAGA: a proxy that infers agent sessions from plain LLM requests.

`SessionTracker` (pure, `sessions`) names the session of each stateless request,
read into protocol-neutral exchanges (`exchanges`) by one adapter per API: Chat
Completions (`chat`), Responses (`responses`) and Anthropic Messages
(`messages`); `TextActions` (`actions`) sees tool calls written as text.
`SagaProxy` (ASGI, `app`) forwards requests and sends the tracker's hints, core
events wrapped in `Hint`s (`hints`), through `send_hint`; `saga proxy` (`cli`) runs
it; `recording` reads those hints into a `saga-trace/1` recording (`--record`).
`tenants` keeps the tenants of a keys file apart (keys, session ids, prefix-cache
salts). The proxy's third-party imports (httpx, starlette, uvicorn) load only
when `SagaProxy` is used, so the tracker stays importable on its own.
"""

from .actions import TextActions
from .hints import Hint, HintFacts, send_hint
from .exchanges import Message, Reply, Request, ToolCall, explicit_session_id
from .sessions import Exchange, MatchRule, SessionTracker, TrackerStats

__all__ = ["Exchange", "Hint", "HintFacts", "MatchRule", "Message", "ProxyConfig", "Reply", "Request", "SagaProxy",
           "SessionTracker", "TextActions", "ToolCall", "TrackerStats", "explicit_session_id", "send_hint"]


def __getattr__(name: str):
    if name in ("ProxyConfig", "SagaProxy"):
        from . import app
        return getattr(app, name)
    raise AttributeError(name)
