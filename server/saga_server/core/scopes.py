"""Tenant-scoped session ids: `<tag>/<id>`, where the tag names the tenant.

Where several tenants share an engine, the front doors (`saga proxy`, the
engine's own HTTP port with keys) give each tenant's session ids a prefix of
their own: `namespaced(T, id)` is `<tag(T)>/<id>`. `tag(T)` is T URL-quoted
(`quote(T, safe="")`, so the first `/` ends it and two tenants never share a
prefix); a quoted name over 64 characters becomes `%h` and 32 hex digits of its
BLAKE2b digest, which no quoted name can be. The whole is cut to
`MAX_SESSION_ID_CHARS`, what the engine and the hint service accept. Tenant ""
keeps its ids as they are.

The session table reads the prefix back (`scope_of`): an id with a `/` names the
tenant of its tag, so an agent key may create or claim such a session only under
its own tag (`owns_scope`); an id without a `/` names no tenant. A front door that
does not know whether an id came scoped (the engine's port behind `saga proxy`)
uses `scoped`: an id already in the tenant's scope stays as it is, any other is
put in it.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

__all__ = ["MAX_SESSION_ID_CHARS", "namespaced", "owns_scope", "scope_of", "scoped", "tag"]

MAX_SESSION_ID_CHARS = 256
_MAX_TAG_CHARS = 64


def tag(tenant: str) -> str:
    """The prefix of `tenant`'s session ids (without the `/`)."""
    quoted = quote(tenant, safe="")
    if len(quoted) > _MAX_TAG_CHARS:
        return "%h" + hashlib.blake2b(tenant.encode(), digest_size=16).hexdigest()
    return quoted


def namespaced(tenant: str, session_id: str) -> str:
    """The session id `session_id` of `tenant` stands for."""
    if not tenant:
        return session_id
    return f"{tag(tenant)}/{session_id}"[:MAX_SESSION_ID_CHARS]


def scope_of(session_id: str) -> str | None:
    """The tag `session_id` is scoped by (None: it has no `/`, no scope)."""
    head, slash, _ = session_id.partition("/")
    return head if slash else None


def owns_scope(tenant: str, session_id: str) -> bool:
    """Whether `tenant` may own `session_id`: it names no scope, or `tenant`'s own."""
    scope = scope_of(session_id)
    return scope is None or scope == tag(tenant)


def scoped(tenant: str, session_id: str) -> str:
    """`session_id` in `tenant`'s scope: itself when it is scoped to `tenant` already,
    else `namespaced(tenant, session_id)` (so `<B>/x` from tenant A is A's `<A>/<B>/x`)."""
    if tenant and scope_of(session_id) == tag(tenant):
        return session_id[:MAX_SESSION_ID_CHARS]
    return namespaced(tenant, session_id)
