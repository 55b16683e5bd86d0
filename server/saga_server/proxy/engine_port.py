"""`TenantKeysMiddleware`: the keys file guards the engine's own HTTP port too.

`saga serve --api-keys FILE` loads it into vLLM's API server with vLLM's
`--middleware` (its ASGI extension point; nothing of vLLM is patched): the
engine's port becomes a front door with the proxy's rules. It reads
the file `$SAGA_API_KEYS` names (`saga serve` sets it), the same file, format and
reloads (SIGHUP) as the hint service, and treats a request as `saga proxy
--api-keys` does (`tenants`):

- **Who.** Every request but `OPEN_PATHS` (health, liveness, version and the
  Prometheus metrics, so probes and scrapers need no key) and CORS preflights must
  present a key of the file, `Authorization: Bearer KEY` or `x-api-key: KEY`; else
  it is answered 401 (`code` `invalid_api_key`) and nothing reaches the engine. The
  key's tenant T is the request's, whatever its role.
- **Sessions.** The session id vLLM would read (the body's `session_id`, else the
  `X-Session-ID` header, else `vllm_xargs.session_id`) becomes `scopes.scoped(T,
  id)`: `<T>/<id>`, or the id itself when it is already T's (a request that came
  through `saga proxy`). It goes in the body's `session_id`, and the header and
  `vllm_xargs.session_id` are dropped, so no field can name another tenant's session.
- **Share.** `vllm_xargs.tenant` is set to T (the engine ranks and charges by
  it), and a `vllm_xargs.deadline_s` shorter than T's `min_deadline_s` is raised to it.
- **Prefix cache.** `cache_salt` becomes T's salt (`Tenants.cache_salt`, keyed by
  `$SAGA_CACHE_SALT_SECRET`), so T's requests never hit another tenant's KV.

Only JSON-object bodies of POST requests are rewritten (at most
`MAX_BODY_BYTES`, else 413); other requests pass authenticated and unchanged.
"""

from __future__ import annotations

import json
import os
from typing import Any, Awaitable, Callable

from ..core.scopes import scoped
from ..rpc.keys import KEYS_FILE_ENV, SHARED_KEY_ENV, KeyRing
from ..rpc.reload import register_for_reload, reload_on_sighup
from .tenants import SALT_SECRET_ENV, Tenants

__all__ = ["MAX_BODY_BYTES", "OPEN_PATHS", "TenantKeysMiddleware"]

OPEN_PATHS = ("/health", "/ping", "/version", "/metrics")
MAX_BODY_BYTES = 64 * 1024 * 1024
_SESSION_HEADER = b"x-session-id"

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class TenantKeysMiddleware:
    """Pure ASGI middleware (module docstring). `keys` is a test seam; vLLM builds it
    with the app alone, and then the ring is `$SAGA_API_KEYS`' (a missing or bad file
    stops the server at start, as it stops `saga serve`)."""

    def __init__(self, app, keys: KeyRing | None = None) -> None:
        self.app = app
        if keys is None:
            path = os.environ.get(KEYS_FILE_ENV)
            if not path:
                raise RuntimeError(f"TenantKeysMiddleware needs ${KEYS_FILE_ENV}: the keys file")
            keys = KeyRing(path, shared_key=os.environ.get(SHARED_KEY_ENV) or None)
            if reload_on_sighup(keys):
                register_for_reload()
        self.tenants = Tenants(keys, salt_secret=os.environ.get(SALT_SECRET_ENV, "").encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS" or _is_open(scope):
            await self.app(scope, receive, send)
            return
        tenant = self.tenants.tenant_of(scope["headers"])
        if tenant is None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await _error(send, 401, "invalid_api_key", "missing or unknown API key")
            return
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            await _error(send, 413, "request_too_large", f"request body over {MAX_BODY_BYTES} bytes")
            return
        headers, body = self.isolate(scope["headers"], body, tenant)
        await self.app({**scope, "headers": headers}, _replay(body, receive), send)

    def isolate(self, headers: list, body: bytes, tenant: str) -> tuple[list, bytes]:
        """The headers and body of `tenant`'s request as the engine gets them."""
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return headers, body
        header_sid = next((v.decode("latin-1") for k, v in headers if k == _SESSION_HEADER), None)
        xargs = payload.get("vllm_xargs")
        xargs = dict(xargs) if isinstance(xargs, dict) else {}
        sid = _text(payload.get("session_id")) or _text(header_sid) or _text(xargs.pop("session_id", None))
        xargs.pop("session_id", None)
        payload.pop("session_id", None)
        if sid:
            payload["session_id"] = scoped(tenant, sid)
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
        out = json.dumps(payload, separators=(",", ":")).encode()
        kept = [(k, v) for k, v in headers if k not in (_SESSION_HEADER, b"content-length")]
        return kept + [(b"content-length", str(len(out)).encode())], out


def _is_open(scope: Scope) -> bool:
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    return path.rstrip("/") in OPEN_PATHS


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value.strip() or None


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when it is over `MAX_BODY_BYTES`."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
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
