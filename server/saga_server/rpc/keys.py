"""API keys: who may call the hint service, as which tenant, with which limits.

The keys file (`--api-keys FILE` on `saga serve`, `saga hints` and `saga router`,
or `$SAGA_API_KEYS`) has one key per line; `#` starts a comment, blank lines are
skipped:

    # key                    tenant   role    limits (name=value, any order, all optional)
    sk-team-a-3f9c1e77d2     team-a   agent   min_deadline_s=60 max_sessions=200 hint_rate=500
    sk-team-b-81d0aa4c55     team-b   agent   max_pinned_blocks=4000
    sk-router-0c7e5b19aa     ops      admin

- `key`: the token clients send (`SAGA_API_KEY` on the agent side), at least 8
  characters, no spaces, each key once.
- `tenant`: whom the key's calls act as (any printable word).
- `role`: `agent` (acts as its tenant, on its tenant's sessions only) or `admin`
  (may name any tenant and act on any session; `ReportPeerService`,
  `ListResident` and releasing other tenants' sessions are admin-only; the cluster
  router forwards with the first admin key of the file, see `access`).
- Limits of the tenant (the same on every line of one tenant that gives them):
  `min_deadline_s` (a shorter declared deadline is raised to it), `max_sessions`
  (live sessions at once; a new one beyond is refused), `max_pinned_blocks` (KV
  blocks its sessions may hold under TTL pins on one engine).
  Limits of the key: `hint_rate` (events per second, a token bucket per key;
  events over it are dropped and counted, a call never waits) and `hint_burst`
  (the bucket's size; default one second of `hint_rate`).

A malformed file is refused as a whole with `KeysFileError` naming the line. The
single shared key (`SAGA_API_KEY`, `--hint-api-key`) is one more key: tenant "",
admin, as if every caller were the operator (a file line with the same key wins).
`KeyRing.reload` re-reads the file (on SIGHUP: `reload`); a reload that fails
keeps the keys it had.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass, field, replace
from typing import Mapping

from ..core.events import ADMIN, AGENT, Caller, TenantLimits

__all__ = ["ApiKey", "KeyRing", "KeysFileError", "KEYS_FILE_ENV", "SHARED_KEY_ENV", "parse_keys"]

KEYS_FILE_ENV = "SAGA_API_KEYS"
SHARED_KEY_ENV = "SAGA_API_KEY"
MIN_KEY_CHARS = 8
_MAX_TENANT_CHARS = 256


class KeysFileError(ValueError):
    """A keys file that cannot be used; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """What one key stands for."""

    tenant: str
    role: str = AGENT
    limits: TenantLimits = field(default_factory=TenantLimits)
    hint_rate: float | None = None  # events per second; None: unlimited
    hint_burst: float = 0.0  # bucket size (events)

    @property
    def caller(self) -> Caller:
        return Caller(self.tenant, self.role, self.limits)


def _number(kind: type, low: float, *, above: bool = False):
    def parse(text: str):
        value = kind(text)
        if not math.isfinite(value) or value < low or (above and value == low):
            raise ValueError(f"must be {'>' if above else '>='} {low:g}")
        return value
    return parse


_TENANT_LIMITS = {"min_deadline_s": _number(float, 0), "max_sessions": _number(int, 1),
                  "max_pinned_blocks": _number(int, 0)}
_KEY_LIMITS = {"hint_rate": _number(float, 0, above=True), "hint_burst": _number(float, 1)}


def parse_keys(text: str, source: str = "keys file") -> dict[str, ApiKey]:
    """key -> `ApiKey` for the file's text (format: module docstring); raises
    `KeysFileError` at the first bad line."""
    keys: dict[str, ApiKey] = {}
    seen_at: dict[str, int] = {}
    tenant_limits: dict[str, dict[str, tuple[object, int]]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        where = f"{source}:{number}"
        words = raw.split()
        words = words[:next((i for i, w in enumerate(words) if w.startswith("#")), len(words))]
        if not words:
            continue
        if len(words) < 3:
            raise KeysFileError(f"{where}: want `key tenant role [name=value ...]`, got {len(words)} field(s)")
        key, tenant, role, *options = words
        if len(key) < MIN_KEY_CHARS or not key.isprintable():
            raise KeysFileError(f"{where}: a key needs at least {MIN_KEY_CHARS} printable characters")
        if key in seen_at:
            raise KeysFileError(f"{where}: the key of line {seen_at[key]} again")
        if len(tenant) > _MAX_TENANT_CHARS or not tenant.isprintable():
            raise KeysFileError(f"{where}: tenant must be printable, at most {_MAX_TENANT_CHARS} characters")
        if role not in (AGENT, ADMIN):
            raise KeysFileError(f"{where}: role must be {AGENT!r} or {ADMIN!r}, not {role!r}")
        given: dict[str, object] = {}
        for option in options:
            name, eq, value = option.partition("=")
            parse = _TENANT_LIMITS.get(name) or _KEY_LIMITS.get(name)
            if not eq or parse is None:
                raise KeysFileError(f"{where}: unknown limit {option!r} (known: "
                                    f"{', '.join([*_TENANT_LIMITS, *_KEY_LIMITS])}, as name=value)")
            try:
                given[name] = parse(value)
            except ValueError as exc:
                raise KeysFileError(f"{where}: {name}={value!r}: {exc}") from None
        if "hint_burst" in given and "hint_rate" not in given:
            raise KeysFileError(f"{where}: hint_burst needs hint_rate")
        mine = tenant_limits.setdefault(tenant, {})
        for name in _TENANT_LIMITS:
            if name in given:
                if name in mine and mine[name][0] != given[name]:
                    raise KeysFileError(f"{where}: {name} of tenant {tenant!r} differs from line {mine[name][1]}")
                mine[name] = (given[name], number)
        rate = given.get("hint_rate")
        keys[key] = ApiKey(tenant, role, hint_rate=rate,
                           hint_burst=given.get("hint_burst", max(1.0, rate or 0.0)))
        seen_at[key] = number
    limits = {tenant: TenantLimits(**{name: value for name, (value, _) in named.items()})
              for tenant, named in tenant_limits.items()}
    return {key: replace(entry, limits=limits[entry.tenant]) for key, entry in keys.items()}


def _digest(key: str) -> bytes:
    # Lookups by digest: no secret-dependent comparison of the key itself.
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True, slots=True)
class _Keys:
    by_digest: Mapping[bytes, ApiKey]
    limits: Mapping[str, TenantLimits]
    admin_key: str | None


class KeyRing:
    """The keys a hint service accepts: a keys file and/or the single shared key.
    Thread-safe; `reload` swaps the whole set at once."""

    def __init__(self, path: str | None = None, *, shared_key: str | None = None) -> None:
        if path is None and not shared_key:
            raise ValueError("a KeyRing needs a keys file or a shared key")
        self.path = path
        self._shared = shared_key or None
        self._lock = threading.Lock()
        self._keys = self._load()

    @classmethod
    def of(cls, path: str | None, shared_key: str | None) -> "KeyRing | None":
        """From a keys file and a shared key (the settings' `api_keys`, `api_key`);
        None when neither is given (no auth). Raises `KeysFileError`."""
        return cls(path, shared_key=shared_key) if path or shared_key else None

    def reload(self) -> int:
        """Re-read the keys file; returns how many keys it has. A file that cannot
        be used raises `KeysFileError` and the keys stay as they were."""
        keys = self._load()
        with self._lock:
            self._keys = keys
        return len(keys.by_digest)

    def lookup(self, key: str) -> ApiKey | None:
        return self._keys.by_digest.get(_digest(key)) if key else None

    def limits(self, tenant: str) -> TenantLimits:
        """The tenant's limits (none for a tenant the file does not name)."""
        return self._keys.limits.get(tenant) or TenantLimits()

    def admin_key(self) -> str | None:
        """The key to present where this process calls other hint services as the
        operator (the cluster router): the file's first admin key, else the shared key."""
        return self._keys.admin_key

    def __len__(self) -> int:
        return len(self._keys.by_digest)

    def _load(self) -> _Keys:
        entries: dict[str, ApiKey] = {}
        if self._shared:
            entries[self._shared] = ApiKey("", ADMIN)
        limits: dict[str, TenantLimits] = {}
        admin = None
        if self.path is not None:
            try:
                with open(self.path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise KeysFileError(f"{self.path}: cannot read the keys file ({exc})") from None
            from_file = parse_keys(text, self.path)
            if not from_file:
                raise KeysFileError(f"{self.path}: no keys in the file")
            limits = {e.tenant: e.limits for e in from_file.values()}
            admin = next((k for k, e in from_file.items() if e.role == ADMIN), None)
            entries.update(from_file)  # after the shared key: a line with the same key wins
        if admin is None and self._shared and entries[self._shared].role == ADMIN:
            admin = self._shared
        return _Keys({_digest(k): e for k, e in entries.items()}, limits, admin)
