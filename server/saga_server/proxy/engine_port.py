"""The engine's own HTTP port as a front door: `SessionIdentityMiddleware` reads
what a request says of itself; `TenantKeysMiddleware` does that too and guards the
port with the keys file. `saga serve` always loads one of them into vLLM's API
server with vLLM's `--middleware` (its ASGI extension point; nothing of vLLM is
patched).

**What a request says** (both), read from the JSON bodies of POSTs to
`SESSION_ROUTES` (at most `MAX_BODY_BYTES`, else 413) and handed to the engine in
the fields its plugin reads (`engines.vllm.request_meta`):

- the session its sender named in the headers agents already send (`core.identity`:
  Claude Code's, Codex's, OpenCode's, Dynamo's, ...), when the body names none:
  in the body's `session_id` (which vLLM reads first) and in
  `vllm_xargs.session_id` (which its Messages API passes on where it drops the
  body's); that session's parent in `vllm_xargs.parent_session_id` and its
  last-request marker in `vllm_xargs.session_final`;
- the cache TTL the body asks for (`cache_hints`: Anthropic `cache_control`,
  OpenAI `prompt_cache_retention`) in `vllm_xargs.cache_ttl_s`, unless the
  caller's own is longer;
- its Dynamo agent hints (`agent_hints`: `nvext.agent_hints.priority`, `osl`) in
  `vllm_xargs.priority_jump_s` and `vllm_xargs.osl`, unless the caller set them.

A request that says nothing of this passes byte for byte (without keys, a body is
parsed only when its headers name a session or it mentions a cache key or agent hints).

**Keys** (`TenantKeysMiddleware`, with `saga serve --api-keys FILE`): the engine's
port becomes a front door with the proxy's rules. It reads the file
`$SAGA_API_KEYS` names (`saga serve` sets it), the same file, format and reloads
(SIGHUP) as the hint service, and treats a request as `saga proxy --api-keys`
does (`tenants`):

- **Who.** Every request but `OPEN_PATHS` (health, liveness, version and the
  Prometheus metrics, so probes and scrapers need no key) and CORS preflights (an
  `OPTIONS` with `Origin` and `Access-Control-Request-Method`) must present a key
  of the file, `Authorization: Bearer KEY` or `x-api-key: KEY`; else it is
  answered 401 (`code` `invalid_api_key`) and nothing reaches the engine. The key's
  tenant T is the request's. `$SAGA_API_KEY`, when set beside the file, is one more
  admin key, of tenant "" (the rule of `rpc.keys.KeyRing` everywhere).
- **What.** An agent key reaches the inference routes only (`AGENT_PATHS`:
  completions, chat, responses, messages, embeddings, pooling, tokenizing, models,
  realtime); the engine's operator routes (`/sleep`, `/reset_prefix_cache`,
  `/collective_rpc`, LoRA loading, aborts, profiling, ...) answer it 403
  (`admin_only`) and need an admin key.
- **Sessions.** The session id vLLM would read (the body's `session_id`, else the
  identity headers, `X-Session-ID` first, else `vllm_xargs.session_id`) becomes
  `scopes.scoped(T, id)`: `<T>/<id>`, or the id itself when it is already T's (a
  request that came through `saga proxy`); so does the parent's. The id goes in the
  body's `session_id` and `vllm_xargs.session_id`, and the header is dropped, so
  no field can name another tenant's session; a parent or last-request marker in
  the body's own `vllm_xargs` is dropped (only the headers' count).
- **Share.** `vllm_xargs.tenant` is set to T (the engine ranks and charges by
  it), and a `vllm_xargs.deadline_s` shorter than T's `min_deadline_s` is raised to it.
- **Prefix cache.** `cache_salt` becomes T's salt (`Tenants.cache_salt`, keyed by
  `$SAGA_CACHE_SALT_SECRET`), so T's requests never hit another tenant's KV.

Only JSON-object bodies of POST requests are rewritten (at most
`MAX_BODY_BYTES`, else 413; a client that hangs up mid-body reaches nothing);
other requests pass authenticated with the body unchanged and an `X-Session-ID`
scoped the same way.
"""

from __future__ import annotations

import json
import math
from typing import Any, Awaitable, Callable

from ..core.scopes import scoped
from ..core.events import ADMIN
from ..rpc.keys import KeyRing
from ..settings import ProxySettings
from ..rpc.reload import register_for_reload, reload_on_sighup
from .agent_hints import agent_hints
from .cache_hints import cache_ttl_s
from ..core.identity import Identity
from .tenants import Tenants
from .exchanges import headers_identity

__all__ = ["AGENT_PATHS", "MAX_BODY_BYTES", "OPEN_PATHS", "SESSION_ROUTES", "SessionIdentityMiddleware",
           "TenantKeysMiddleware"]

OPEN_PATHS = ("/health", "/ping", "/version", "/metrics")
# vLLM's serving routes; `/v1/responses/...` (a stored response, its cancel, render)
# by prefix. Whatever vLLM adds later is an operator's until it is listed here.
AGENT_PATHS = frozenset((
    "/v1/chat/completions", "/v1/chat/completions/batch", "/v1/chat/completions/render",
    "/v1/chat/completions/derender", "/v1/completions", "/v1/completions/render", "/v1/completions/derender",
    "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/messages/render", "/v1/models",
    "/v1/embeddings", "/v2/embed", "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/realtime",
    "/v1/score", "/v1/rerank", "/v2/rerank", "/score", "/rerank", "/pooling", "/classify",
    "/generative_scoring", "/inference/v1/generate", "/invocations", "/tokenize", "/detokenize",
    "/tokenizer_info"))
_AGENT_PREFIXES = ("/v1/responses/",)
# The routes whose bodies carry a session's requests: read for identity and cache hints.
SESSION_ROUTES = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"))
MAX_BODY_BYTES = 64 * 1024 * 1024
_SESSION_HEADER = b"x-session-id"

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class SessionIdentityMiddleware:
    """Pure ASGI middleware: identity only (module docstring), for a port without keys."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or _path(scope) not in SESSION_ROUTES:
            await self.app(scope, receive, send)
            return
        body = await _whole_body(receive, send)
        if body is None:
            return
        said = headers_identity(_header_map(scope["headers"]))
        # Parsed only when there may be something to add: the hot path stays a byte search.
        payload = _json_object(body) if said.session_id or _may_hint(body) else None
        xargs = _xargs_of(payload) if payload is not None else {}
        if payload is None or not _said_fields(payload, xargs, said, _same):
            await self.app(scope, _replay(body, receive), send)  # nothing to add: as it came
            return
        payload["vllm_xargs"] = xargs
        out = _dump(payload)
        await self.app({**scope, "headers": _with_body_length(scope["headers"], out)}, _replay(out, receive), send)


class TenantKeysMiddleware:
    """Pure ASGI middleware (module docstring). `keys` is a test seam; vLLM builds it
    with the app alone, and then the ring is `$SAGA_API_KEYS`' (a missing or bad file
    stops the server at start, as it stops `saga serve`)."""

    def __init__(self, app, keys: KeyRing | None = None) -> None:
        self.app = app
        if keys is None:
            settings = ProxySettings.from_env()
            path = settings.api_keys
            if not path:
                raise RuntimeError("TenantKeysMiddleware needs $SAGA_API_KEYS: the keys file")
            keys = KeyRing(path, shared_key=settings.api_key)
            if reload_on_sighup(keys):
                register_for_reload()
        self.tenants = Tenants(keys, salt_secret=ProxySettings.from_env().cache_salt_secret.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or _is_preflight(scope) or _path(scope) in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        key = self.tenants.key_of(scope["headers"])
        if key is None or (key.role != ADMIN and not _is_agent_route(_path(scope))):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            elif key is None:
                await _error(send, 401, "invalid_api_key", "missing or unknown API key")
            else:
                await _error(send, 403, "admin_only", f"{_path(scope)} needs an admin key")
            return
        tenant = key.tenant
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app({**scope, "headers": _scoped_header(scope["headers"], tenant)}, receive, send)
            return
        body = await _whole_body(receive, send)
        if body is None:
            return
        headers, body = self.isolate(scope["headers"], body, tenant)
        await self.app({**scope, "headers": headers}, _replay(body, receive), send)

    def isolate(self, headers: list, body: bytes, tenant: str) -> tuple[list, bytes]:
        """The headers and body of `tenant`'s request as the engine gets them."""
        payload = _json_object(body)
        if payload is None:
            return _scoped_header(headers, tenant), body
        said = headers_identity(_header_map(headers))
        xargs = _xargs_of(payload)
        for field in ("parent_session_id", "session_final"):  # only what the headers say counts
            xargs.pop(field, None)
        sid = _text(payload.get("session_id")) or said.session_id or _text(xargs.pop("session_id", None))
        xargs.pop("session_id", None)
        payload.pop("session_id", None)
        # What the headers say of their session counts when it is the one the request names.
        _said_fields(payload, xargs, said if sid == said.session_id else Identity(sid), lambda i: scoped(tenant, i))
        xargs["tenant"] = tenant
        floor = self.tenants.keys.limits(tenant).min_deadline_s
        if floor and "deadline_s" in xargs:  # the engine reads strings as numbers too
            try:
                deadline = float(xargs["deadline_s"])
            except (TypeError, ValueError):
                deadline = float("nan")  # unreadable: the floor replaces it
            if not deadline >= floor:  # also NaN
                xargs["deadline_s"] = floor
        payload["vllm_xargs"] = xargs
        payload["cache_salt"] = self.tenants.cache_salt(tenant, payload.get("cache_salt"))
        out = _dump(payload)
        return _with_body_length([(k, v) for k, v in headers if k != _SESSION_HEADER], out), out


def _xargs_of(payload: dict) -> dict:
    """A copy of the body's `vllm_xargs` to change ({} when it has none)."""
    xargs = payload.get("vllm_xargs")
    return dict(xargs) if isinstance(xargs, dict) else {}


def _may_hint(body: bytes) -> bool:
    """Whether the raw body could hold a cache or agent hint (`cache_hints` and
    `agent_hints` read only these keys)."""
    return b"cache_control" in body or b"prompt_cache_" in body or b"agent_hints" in body


def _said_fields(payload: dict, xargs: dict, said: Identity, scope_id: Callable[[str], str]) -> bool:
    """Add what the request said of itself: the session the headers name (`said`,
    when the body names none) to `payload` and `xargs` (the body's `vllm_xargs`,
    which the caller puts back), its parent and last-request marker, and the cache
    TTL the body asks for (`cache_hints`) and its agent hints (`agent_hints`) to
    `xargs`; ids through `scope_id`. Returns whether anything was added."""
    added = False
    if said.session_id and not _text(payload.get("session_id")) and not _text(xargs.get("session_id")):
        payload["session_id"] = xargs["session_id"] = scope_id(said.session_id)
        if said.parent_id:
            xargs["parent_session_id"] = scope_id(said.parent_id)
        if said.final:
            xargs["session_final"] = "true"  # a string: vLLM's xargs take str, int, float
        added = True
    ttl = cache_ttl_s(payload)
    if ttl is not None and not _number(xargs.get("cache_ttl_s")) >= ttl:
        xargs["cache_ttl_s"] = ttl
        added = True
    hints = agent_hints(payload)
    for field, value in (("priority_jump_s", hints.priority_jump_s), ("osl", hints.osl)):
        if value is not None and field not in xargs:
            xargs[field] = value
            added = True
    return added


def _number(value: Any) -> float:
    """`value` as a float; NaN for anything else (which compares false)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return math.nan
    try:
        return float(value)
    except ValueError:
        return math.nan


def _same(session_id: str) -> str:
    return session_id


def _header_map(headers: list) -> dict[str, str]:
    """ASGI headers as {lower-case name: value} (the first of repeated names)."""
    out: dict[str, str] = {}
    for name, value in headers:
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _json_object(body: bytes) -> dict | None:
    try:
        payload = json.loads(body) if body else None
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's stack
        return None
    return payload if isinstance(payload, dict) else None


def _dump(payload: dict) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _with_body_length(headers: list, body: bytes) -> list:
    """`headers` for a rewritten `body`: its length, no transfer encoding."""
    kept = [(k, v) for k, v in headers if k not in (b"content-length", b"transfer-encoding")]
    return kept + [(b"content-length", str(len(body)).encode())]


def _path(scope: Scope) -> str:
    return scope["path"].removeprefix(scope.get("root_path", "")).rstrip("/")


def _is_agent_route(path: str) -> bool:
    return path in AGENT_PATHS or path.startswith(_AGENT_PREFIXES)


def _is_preflight(scope: Scope) -> bool:
    """A CORS preflight, which browsers send without credentials."""
    if scope.get("method") != "OPTIONS":
        return False
    names = {k for k, _ in scope["headers"]}
    return b"origin" in names and b"access-control-request-method" in names


def _scoped_header(headers: list, tenant: str) -> list:
    """`headers` with an `X-Session-ID` put in `tenant`'s scope (dropped when blank)."""
    out = []
    for name, value in headers:
        if name == _SESSION_HEADER:
            sid = _text(value.decode("latin-1"))
            if sid is None:
                continue
            value = scoped(tenant, sid).encode("latin-1")
        out.append((name, value))
    return out


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value.strip() or None


class _ClientGone(Exception):
    """The client disconnected before its body was complete."""


async def _whole_body(receive: Receive, send: Send) -> bytes | None:
    """The request's whole body; None when there is none to pass on: the client hung
    up before its last part (nothing to answer, and a partial body must not reach the
    engine) or it is over `MAX_BODY_BYTES` (answered 413)."""
    try:
        body = await _read_body(receive)
    except _ClientGone:
        return None
    if body is None:
        await _error(send, 413, "request_too_large", f"request body over {MAX_BODY_BYTES} bytes")
    return body


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when it is over `MAX_BODY_BYTES`. Raises
    `_ClientGone` on a disconnect before the last part."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        parts.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, then what the client sends (a disconnect)."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "saga_error", "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
