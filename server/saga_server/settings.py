"""Typed settings: every knob of SAGA's processes, one frozen object per process kind.

- `EngineSettings`: what the SAGA scheduler inside vLLM's engine process reads, made
  once from the environment (`from_env`) by the plugin, written by `saga serve` and
  the Ray replica (`write`) into the engine's environment (the engine process is
  vLLM's child, so the environment is the one channel into it).
- `HintServiceSettings`: `saga hints`, the hint service on its own.
- `ProxySettings`: `saga proxy`, and the same rules on the engine's own HTTP port
  (`proxy.engine_port`, in vLLM's API server process).
- `RouterSettings`: `saga router`'s replicas and ingress, read in the Ray Serve
  processes they run in, from their Ray node's environment.

A command-line flag wins over its variable: the CLIs take their defaults from
`from_env`. Each knob declares its variable, its default, its range and one line of
why; `knob_table` renders a kind's for docs/OPERATING.md, and a test keeps those
tables equal to this module.

A malformed or out-of-range value is logged and its default kept: serving never fails
over a SAGA knob. This module imports no engine, transport or framework; its defaults
that the core also uses are the core's own (`FairShareConfig`, `core.sessions`).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from .core.fairshare import FairShareConfig
from .core.mechanisms import ENGINE_MECHANISMS, Mechanism, parse_mechanisms
from .core.sessions import MAX_SESSIONS, SESSION_IDLE_S

__all__ = ["EngineSettings", "HintServiceSettings", "ProxySettings", "RouterSettings", "Knob", "knob_table"]

log = logging.getLogger("saga.settings")


@dataclass(frozen=True)
class Knob:
    """One setting as the environment carries it: its variable, why it exists, and the
    range a value must fall in (numbers only)."""

    env: str
    why: str
    lo: float = -math.inf
    hi: float = math.inf


def _knob(env: str, default: Any, why: str, lo: float = -math.inf, hi: float = math.inf) -> Any:
    return field(default=default, metadata={"knob": Knob(env, why, lo, hi)})


def _api_keys() -> Any:
    return _knob("SAGA_API_KEYS", None,
                 "the keys file (`key tenant role [limits]` a line; SIGHUP reloads it): callers must present a "
                 "key and act as its tenant (`--api-keys`; docs/OPERATING.md, \"Configuration (tenants and API keys)\")")


def _api_key() -> Any:
    return _knob("SAGA_API_KEY", None,
                 "one shared key callers must send, one tenant, admin (`saga serve --hint-api-key`, `saga hints "
                 "--api-key`); with a keys file, the key the proxy sends its hints with")


class _Settings:
    """What every kind's settings do (the fields are each kind's own)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if not _valid(f, getattr(self, f.name)):
                raise ValueError(f"{f.name}={getattr(self, f.name)!r}: {_want(f)}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, logger: logging.Logger | None = None):
        """The settings the environment gives; a malformed or out-of-range value is
        logged and its default kept."""
        env = os.environ if env is None else env
        logger = logger or log
        values = {}
        for f in fields(cls):
            k: Knob = f.metadata["knob"]
            raw = env.get(k.env)
            if raw is None or (raw == "" and f.default is None):
                continue
            try:
                value = _PARSE[_kind(f)](raw)
            except ValueError:
                value = MISSING
            if value is MISSING or not _valid(f, value):
                logger.warning("SAGA: ignoring %s=%r (want %s); using %s", k.env, raw, _want(f),
                               _render(f.default) or "unset")
                continue
            values[f.name] = value
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The environment that gives these settings (only what differs from the defaults)."""
        return {f.metadata["knob"].env: _render(getattr(self, f.name))
                for f in fields(self) if getattr(self, f.name) != f.default}

    def write(self, env: dict[str, str]) -> None:
        """Make `env` give these settings: their variables set where they differ from the
        defaults, removed where they do not (an inherited value would win otherwise)."""
        for f in fields(self):
            env.pop(f.metadata["knob"].env, None)
        env.update(self.to_env())

    def with_(self, **changes: Any):
        return replace(self, **changes)


@dataclass(frozen=True)
class EngineSettings(_Settings):
    """The engine process's knobs (module docstring)."""

    hint_addr: str | None = _knob(
        "SAGA_HINT_ADDR", None,
        "where the hint service listens, inside the engine process (`saga serve` sets it); unset: no hint service")
    scoped_session_ids: bool = _knob(
        "SAGA_SCOPED_SESSION_IDS", False,
        "`1`: an agent's unscoped session ids are put in its tenant's scope, as the engine's port puts its "
        "requests' (`saga serve --api-keys` sets it)")
    api_keys: str | None = _api_keys()
    api_key: str | None = _api_key()
    off: frozenset[Mechanism] = _knob(
        "SAGA_OFF", frozenset(),
        "mechanisms switched off, comma-separated (`saga serve --off`): `walru` (evict by recency), `ttl` (no "
        "pins), `prefetch`, `afs` (arrival order), `admit` (no session admission), `shape` (no deadline shaping); "
        "only to compare, each falls back to what stock vLLM does there")
    pin_max_fraction: float = _knob(
        "SAGA_PIN_MAX_FRACTION", 0.5, "most of the KV pool that TTL pins may hold", 0.0, 1.0)
    seniority_window_s: float = _knob(
        "SAGA_SENIORITY_WINDOW_S", FairShareConfig().seniority_window_s,
        "within a tenant, a request ranks by its task's start (a session with a person in the loop: its running "
        "user turn's), but no earlier than this many seconds before it arrived (`inf`: as far back as the task "
        "began, so tasks finish in the order they began; `0`: request-level FCFS, as stock vLLM)", 0.0)
    max_sessions: int = _knob(
        "SAGA_MAX_SESSIONS", MAX_SESSIONS,
        "sessions the engine's core keeps at most (the least recently active go first; each leaves every "
        "per-session table with it)", 1, 1e8)
    session_idle_s: float = _knob(
        "SAGA_SESSION_IDLE_S", SESSION_IDLE_S, "a session silent this long is forgotten", 1e-3)
    metrics_port: int | None = _knob(
        "SAGA_METRICS_PORT", None,
        "a port of its own for SAGA's Prometheus metrics, where vLLM's `/metrics` does not carry them (no "
        "`PROMETHEUS_MULTIPROC_DIR`: your own launch; `saga serve` sets that up)", 1, 65535)
    metrics_host: str = _knob(
        "SAGA_METRICS_HOST", "127.0.0.1", "the address that port listens on")
    nixl_keep_pinning: bool = _knob(
        "SAGA_NIXL_KEEP_PINNING", False,
        "`1` keeps the core NIXL pins the engine's worker to (`--kv-transfer nixl`); by default the worker's "
        "own CPU affinity is restored, so co-hosted engines do not share one core")
    nixl_progress_thread: bool | None = _knob(
        "SAGA_NIXL_PROGRESS_THREAD", None,
        "`1` / `0` force NIXL's progress thread on / off; unset: on for device engines, off on CPU engines "
        "(there it keeps a core busy in every idle engine)")

    def on(self, mechanism: Mechanism) -> bool:
        """Whether the mechanism runs (is not switched off)."""
        return mechanism not in self.off


@dataclass(frozen=True)
class HintServiceSettings(_Settings):
    """`saga hints`'s knobs (module docstring); its flags take their defaults from here."""

    api_keys: str | None = _api_keys()
    api_key: str | None = _api_key()


@dataclass(frozen=True)
class ProxySettings(_Settings):
    """`saga proxy`'s knobs and the engine port's (module docstring)."""

    upstream: str | None = _knob(
        "SAGA_UPSTREAM", None, "the OpenAI base URL the proxy forwards to (`saga proxy --upstream`)")
    api_keys: str | None = _api_keys()
    api_key: str | None = _api_key()
    session_headers: str = _knob(
        "SAGA_SESSION_HEADERS", "",
        "more session headers, read before the built-in ones (format and table: \"Coding agents as they are\" in "
        "docs/AGENTS.md); a malformed value stops `saga serve` and `saga proxy` at start")
    cache_salt_secret: str = _knob(
        "SAGA_CACHE_SALT_SECRET", "",
        "the HMAC key of each tenant's `cache_salt`, where clients can reach the engine directly (see "
        "\"Tenants and the prefix cache\")")


@dataclass(frozen=True)
class RouterSettings(_Settings):
    """`saga router`'s knobs for its replicas and ingress (module docstring)."""

    hint_host: str = _knob(
        "SAGA_HINT_HOST", "127.0.0.1",
        "the address each replica's in-engine hint service (and, with `--kv-transfer nixl`, its NIXL side "
        "channel) listens on; where replicas span hosts, each host's own address, so the router can reach them")
    ingress_retries: int = _knob(
        "SAGA_INGRESS_RETRIES", 3,
        "times the ingress sends a request again when its replica died before the first chunk of the answer "
        "(a stream already under way is never replayed)", 0, 10)


def knob_table(cls: type) -> str:
    """The settings as docs/OPERATING.md's markdown table (variable, default, meaning)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for f in fields(cls):
        k: Knob = f.metadata["knob"]
        default = _render(f.default)
        rows.append(f"| `{k.env}` | {f'`{default}`' if default else 'unset'} | {k.why} |")
    return "\n".join(rows) + "\n"


def _kind(f) -> str:
    return str(f.type).split(" | ")[0]


def _parse_bool(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError(raw)
    return raw == "1"


def _parse_int(raw: str) -> int:
    value = float(raw)
    if not value.is_integer():
        raise ValueError(raw)
    return int(value)


_PARSE: dict[str, Callable[[str], Any]] = {
    "str": str,
    "bool": _parse_bool,
    "int": _parse_int,
    "float": float,
    "frozenset[Mechanism]": lambda raw: parse_mechanisms(raw, ENGINE_MECHANISMS),
}


def _valid(f, value: Any) -> bool:
    if value is None:
        return f.default is None
    if _kind(f) in ("int", "float"):
        k: Knob = f.metadata["knob"]
        return isinstance(value, (int, float)) and k.lo <= value <= k.hi  # NaN fails both
    if _kind(f) == "frozenset[Mechanism]":
        return isinstance(value, frozenset) and value <= ENGINE_MECHANISMS
    return True


def _want(f) -> str:
    kind = _kind(f)
    if kind in ("int", "float"):
        k: Knob = f.metadata["knob"]
        hi = "" if k.hi == math.inf else f"{k.hi:g}"
        return f"{'an integer' if kind == 'int' else 'a number'} in [{k.lo:g}, {hi or 'inf'}]"
    if kind == "bool":
        return "0 or 1"
    if kind == "frozenset[Mechanism]":
        return f"names from {', '.join(sorted(ENGINE_MECHANISMS))}"
    return "a string"


def _render(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, frozenset):
        return ",".join(sorted(value))
    if isinstance(value, float):  # exact, so that what is written reads back the same
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)


KINDS = {"engine": EngineSettings, "hints": HintServiceSettings, "proxy": ProxySettings, "router": RouterSettings}

if __name__ == "__main__":  # python -m saga_server.settings KIND: the table docs/OPERATING.md holds
    import sys

    print(knob_table(KINDS[sys.argv[1] if len(sys.argv) > 1 else "engine"]), end="")
