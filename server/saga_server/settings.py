"""Typed settings: every knob of SAGA's engine process, read in one place.

`EngineSettings` is what the SAGA scheduler inside vLLM's engine process reads: one
frozen object, made once from the environment (`from_env`) by the plugin, written by
`saga serve` (`to_env`) into the engine's environment (the engine process is vLLM's
child, so the environment is the one channel into it). Each knob declares its
variable, its default, its range and one line of why; `knob_table` renders them for
docs/OPERATING.md ("Configuration (engine side)"), and a test keeps that table equal
to this module.

A malformed or out-of-range value is logged and its default kept: serving never fails
over a SAGA knob. This module imports no engine, transport or framework; its defaults
that the core also uses are the core's own (`FairShareConfig`, `CoreConfig`).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from .core.fairshare import FairShareConfig
from .core.mechanisms import ENGINE_MECHANISMS, Mechanism, parse_mechanisms
from .core.workflow import CoreConfig

__all__ = ["EngineSettings", "Knob", "knob_table"]

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


@dataclass(frozen=True)
class EngineSettings:
    """The engine process's knobs (module docstring)."""

    hint_addr: str | None = _knob(
        "SAGA_HINT_ADDR", None,
        "where the hint service listens, inside the engine process (`saga serve` sets it); unset: no hint service")
    scoped_session_ids: bool = _knob(
        "SAGA_SCOPED_SESSION_IDS", False,
        "`1`: an agent's unscoped session ids are put in its tenant's scope, as the engine's port puts its "
        "requests' (`saga serve --api-keys` sets it)")
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
        "user turn's), but no earlier than this many seconds before it arrived; so it can be overtaken only by "
        "requests arriving within this window after it (`0`: request-level FCFS, as stock vLLM)", 0.0)
    max_sessions: int = _knob(
        "SAGA_MAX_SESSIONS", CoreConfig().max_sessions,
        "sessions the engine's core keeps at most (the least recently active go first; each leaves every "
        "per-session table with it)", 1, 1e8)
    session_idle_s: float = _knob(
        "SAGA_SESSION_IDLE_S", CoreConfig().session_idle_s, "a session silent this long is forgotten", 1e-3)
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

    def __post_init__(self) -> None:
        for f in fields(self):
            if not _valid(f, getattr(self, f.name)):
                raise ValueError(f"{f.name}={getattr(self, f.name)!r}: {_want(f)}")

    def on(self, mechanism: Mechanism) -> bool:
        """Whether the mechanism runs (is not switched off)."""
        return mechanism not in self.off

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, logger: logging.Logger | None = None
                 ) -> "EngineSettings":
        """The settings the environment gives; a malformed or out-of-range value is
        logged and its default kept."""
        env = os.environ if env is None else env
        logger = logger or log
        values = {}
        for f in fields(cls):
            k: Knob = f.metadata["knob"]
            raw = env.get(k.env)
            if raw is None:
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

    def with_(self, **changes: Any) -> "EngineSettings":
        return replace(self, **changes)


def knob_table(cls: type = EngineSettings) -> str:
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
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


if __name__ == "__main__":  # python -m saga_server.settings: the table docs/OPERATING.md holds
    print(knob_table(), end="")
