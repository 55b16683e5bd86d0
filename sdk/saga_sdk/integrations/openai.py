"""Tag every OpenAI SDK request with the current SAGA session id.

    from saga_sdk.integrations import openai as saga_openai
    saga_openai.instrument()          # idempotent; uninstrument() undoes it

While instrumented, each call to one of the OpenAI SDK's request methods made while a
session is current (`saga_sdk.context.current_session()`, set by the LangChain handler,
`HintClient.session()` or `session_scope()`) carries that session's id to the server:

  * header `X-Session-ID: <id>` (always): vLLM, `saga serve`, `saga router` and
    `saga proxy` all read it, and any other OpenAI-compatible server ignores it;
  * body field `"session_id": "<id>"` (only with `instrument(body=True)`): vLLM reads it
    natively too, but api.openai.com and other strict servers reject unknown fields,
    so it is opt-in.

Patched methods (sync and async): `chat.completions.create` and `.parse` (which covers
`.stream`, built on `create`), the legacy `completions.create`, and `responses.create`.
The patch merges, never replaces: the session id goes into a *copy* of the caller's
`extra_headers` / `extra_body`, and a value the caller set (any-case `x-session-id`
header, `session_id` body key) wins. Outside a session nothing is added. A failure while
tagging is logged once and the request goes out untagged: SAGA never breaks a call.

Methods are patched on the classes, so clients created before and after `instrument()`
are both covered. One exception: a `client.chat.completions.with_raw_response` (or
`with_streaming_response`) object *first accessed before* `instrument()` holds the
unpatched method; accessed afterwards, it is covered. If another library wraps the same
methods after us, `uninstrument()` leaves its wrapper in place and turns ours into a
pass-through instead of unwinding the chain.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
from typing import Any, Callable, Mapping

from ..context import current_session
from ..logs import LogOnce

__all__ = ["instrument", "uninstrument", "is_instrumented", "SESSION_HEADER", "SESSION_FIELD"]

log = logging.getLogger("saga_sdk.openai")
_log_once = LogOnce(log)

SESSION_HEADER = "X-Session-ID"
SESSION_FIELD = "session_id"

# (module, class, method): every public OpenAI SDK entry point that sends one model
# request and takes `extra_headers` / `extra_body` keyword arguments.
_TARGETS: tuple[tuple[str, str, str], ...] = (
    ("openai.resources.chat.completions", "Completions", "create"),
    ("openai.resources.chat.completions", "Completions", "parse"),
    ("openai.resources.chat.completions", "AsyncCompletions", "create"),
    ("openai.resources.chat.completions", "AsyncCompletions", "parse"),
    ("openai.resources.completions", "Completions", "create"),
    ("openai.resources.completions", "AsyncCompletions", "create"),
    ("openai.resources.responses", "Responses", "create"),
    ("openai.resources.responses", "AsyncResponses", "create"),
)

_lock = threading.Lock()
_options = {"header": True, "body": False}
_active = False
# (class, method name) -> the wrapper we installed; its `__wrapped__` is the original.
_installed: dict[tuple[type, str], Callable] = {}


def instrument(*, header: bool = True, body: bool = False) -> bool:
    """Patch the OpenAI SDK (idempotent: a second call only updates the options).

    `header`: send `X-Session-ID`; `body`: also send the `session_id` body field.
    Returns False (and patches nothing) when the `openai` package is not installed.
    """
    global _active
    if _active and _options["header"] == bool(header) and _options["body"] == bool(body):
        return True  # already on: the LangChain handler calls this per root run
    with _lock:
        _options["header"], _options["body"] = bool(header), bool(body)
        try:
            importlib.import_module("openai")
        except ImportError:
            return False
        for module_name, class_name, method in _TARGETS:
            cls = _resolve(module_name, class_name)
            if cls is None or not hasattr(cls, method):
                continue  # an SDK version without this resource: nothing to tag
            if (cls, method) not in _installed:
                wrapper = _wrap(getattr(cls, method))
                setattr(cls, method, wrapper)
                _installed[(cls, method)] = wrapper
        _active = True
        return True


def uninstrument() -> None:
    """Undo `instrument()` (idempotent). Restores each original method unless some
    other wrapper now sits on top of ours, in which case ours stays as a no-op."""
    global _active
    with _lock:
        _active = False
        for (cls, method), wrapper in list(_installed.items()):
            if cls.__dict__.get(method) is wrapper:
                setattr(cls, method, wrapper.__wrapped__)
                del _installed[(cls, method)]
            # else: left in place, inert while _active is False; a later
            # instrument() finds it in _installed and does not stack a second one.


def is_instrumented() -> bool:
    return _active


def _resolve(module_name: str, class_name: str) -> type | None:
    try:
        return getattr(importlib.import_module(module_name), class_name, None)
    except Exception:  # a broken optional submodule must not stop the others
        _log_once(f"import:{module_name}", "cannot patch %s.%s", module_name, class_name, exc_info=True)
        return None


def _wrap(original: Callable) -> Callable:
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def async_wrapper(self, *args, **kwargs):
            if _active:
                kwargs = _tagged(kwargs)
            return await original(self, *args, **kwargs)
        return async_wrapper

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        if _active:
            kwargs = _tagged(kwargs)
        return original(self, *args, **kwargs)
    return wrapper


def _tagged(kwargs: dict) -> dict:
    """A copy of `kwargs` with the current session id merged in (or `kwargs` itself)."""
    try:
        ctx = current_session()
        if ctx is None or not ctx.session_id:
            return kwargs
        sid = ctx.session_id
        out = dict(kwargs)
        if _options["header"]:
            out["extra_headers"] = _merge_header(kwargs.get("extra_headers"), sid)
        if _options["body"]:
            out["extra_body"] = _merge_body(kwargs.get("extra_body"), sid)
        return out
    except Exception:
        _log_once("tag", "could not tag an OpenAI request with its SAGA session", exc_info=True)
        return kwargs


def _merge_header(user: Mapping[str, Any] | None, sid: str) -> Mapping[str, Any]:
    if user is None:
        return {SESSION_HEADER: sid}
    if any(k.lower() == "x-session-id" for k in user):
        return user  # the caller chose the id: theirs wins
    return {**user, SESSION_HEADER: sid}


def _merge_body(user: Mapping[str, Any] | None, sid: str) -> Mapping[str, Any]:
    if user is None:
        return {SESSION_FIELD: sid}
    if SESSION_FIELD in user:
        return user
    return {**user, SESSION_FIELD: sid}

