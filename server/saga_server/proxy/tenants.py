"""Tenants on the HTTP side: whose request it is, and what keeps tenants apart.

With a keys file (`saga proxy --api-keys FILE` or `$SAGA_API_KEYS`; the format of
`saga_server.rpc.keys`, the same file the hint service reads) every request but
`GET /health` must present one of its keys, as `x-api-key: KEY` (Anthropic
clients; it wins when both are sent) or `Authorization: Bearer KEY` (OpenAI
clients). A missing or unknown key is refused (`Tenants.tenant_of` says None; the
proxy answers 401 `invalid_api_key` and forwards nothing) and counted. The key's
tenant is the caller's; its role does not matter here. The key headers still go
to the upstream unchanged (it may check them). The single shared key
(`SAGA_API_KEY`) is not an HTTP key: it is the proxy's own key to the hint service.
Without a keys file every caller is tenant "" and nothing below applies.

A request of tenant T is kept apart from other tenants' three ways:

- **Sessions.** Each session id of T is `namespaced(T, id)`: `<T>/<id>`, T's
  tag and the id, cut to 256 characters (`saga_server.core.scopes`, where the
  hint service reads the tag back to keep other keys out of T's ids). That holds
  for the ids the caller sends (`X-Session-ID` and the rest of
  `exchanges.SESSION_HEADERS` / `SESSION_BODY_FIELDS`) and the ones `SessionTracker` infers, whose histories, scopes and response ids
  never match another tenant's. `isolate` writes the namespaced id wherever the
  upstream reads one (the body's `session_id`, also `vllm_xargs.session_id` where
  the caller set it: vLLM takes both before the header), and overwrites a
  `vllm_xargs.tenant` the caller set with T.
- **Prefix cache.** vLLM salts the hashes of a request's KV blocks with the body's
  `cache_salt` (Chat Completions, Completions, Responses, Anthropic Messages), so
  requests with different salts never share cached KV. `cache_salt` sets it to
  HMAC-SHA256 over (T, the caller's own salt or null), as 64 hex digits: one
  tenant's requests can never hit another's KV, a caller's own salt still splits
  its cache further, and T never appears in clear. The HMAC key is
  `$SAGA_CACHE_SALT_SECRET` where set (do set it where clients can reach the
  engine directly: without it a salt is computable from a tenant's name), else a
  fixed string; proxies that share an engine should share the secret, or the same
  tenant's requests through two proxies will not share their cache.
- **Hints.** Sessions start with T as their tenant (`session_start(tenant=T)`);
  the hint service makes them T's. The proxy sends every tenant's hints with its
  own key, so that key must be an admin key (an agent key may not name another
  tenant): the keys file's first admin key unless `SAGA_API_KEY` is set.

Other endpoints (`/v1/models`, `/v1/embeddings`, vLLM's token-in
`/inference/v1/generate`, ...) and bodies that are not a JSON object go through
authenticated but unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ..core.scopes import namespaced

if TYPE_CHECKING:  # the ring's module pulls in gRPC; the tracker imports this one
    from ..rpc.keys import ApiKey, KeyRing

__all__ = ["TenantStats", "Tenants", "api_key", "namespaced"]

_SALT_DOMAIN = b"saga-proxy/cache-salt/1:"


def api_key(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The key a request presents ("" if none): `x-api-key`, else a bearer token."""
    found = dict(headers)
    key = found.get(b"x-api-key", b"").strip()
    if not key:
        scheme, _, token = found.get(b"authorization", b"").strip().partition(b" ")
        key = token.strip() if scheme.lower() == b"bearer" else b""
    return key.decode("latin-1")


@dataclass(frozen=True, slots=True)
class TenantStats:
    requests: Mapping[str, int] = field(default_factory=dict)  # accepted, by tenant
    refused: int = 0                                           # no key, or one the file lacks


class Tenants:
    """The keys a proxy accepts and what isolates their tenants (module docstring).
    Used from the proxy's event loop; `keys.reload()` (SIGHUP) takes effect at once."""

    def __init__(self, keys: "KeyRing", *, salt_secret: bytes = b"") -> None:
        self.keys = keys
        self._salt_key = _SALT_DOMAIN + salt_secret
        self._requests: Counter[str] = Counter()
        self._refused = 0

    def tenant_of(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The tenant of a request with these (ASGI, lower-case) headers, counted;
        None, counted as refused, when it presents no key of the ring."""
        entry = self.key_of(headers)
        return None if entry is None else entry.tenant

    def key_of(self, headers: Iterable[tuple[bytes, bytes]]) -> ApiKey | None:
        """`tenant_of`, with the key's role and limits: its entry in the ring."""
        entry = self.keys.lookup(api_key(headers))
        if entry is None:
            self._refused += 1
            return None
        self._requests[entry.tenant] += 1
        return entry

    def stats(self) -> TenantStats:
        return TenantStats(dict(self._requests), self._refused)

    def cache_salt(self, tenant: str, client_salt: Any = None) -> str:
        """The `cache_salt` a request of `tenant` goes upstream with."""
        message = json.dumps([tenant, client_salt], sort_keys=True, separators=(",", ":"), default=str)
        return hmac.new(self._salt_key, message.encode(), hashlib.sha256).hexdigest()

    def isolate(self, body: Mapping[str, Any], tenant: str, session_id: str | None, *,
                add_session_id: bool) -> bytes:
        """`body` as `tenant`'s request goes upstream: its salt, and `session_id`
        (already namespaced) wherever the caller put one, and as the body field
        `session_id` if `add_session_id`; with no `session_id`, none of the
        caller's own. Serialised anew: a duplicate key cannot smuggle a value past."""
        out = dict(body)
        xargs = out.get("vllm_xargs")
        xargs = dict(xargs) if isinstance(xargs, Mapping) else None
        if session_id is None:
            out.pop("session_id", None)
            if xargs is not None:
                xargs.pop("session_id", None)
        else:
            if add_session_id or "session_id" in out:
                out["session_id"] = session_id
            if xargs is not None and "session_id" in xargs:
                xargs["session_id"] = session_id
        if xargs is not None:
            if "tenant" in xargs:
                xargs["tenant"] = tenant
            out["vllm_xargs"] = xargs
        out["cache_salt"] = self.cache_salt(tenant, body.get("cache_salt"))
        return json.dumps(out, separators=(",", ":")).encode()
