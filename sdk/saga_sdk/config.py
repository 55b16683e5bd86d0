"""SDK configuration, read from `SAGA_*` environment variables in this one place.

| variable | default | meaning |
|---|---|---|
| `SAGA_ENABLED` | `1` | `0`/`false`/`off` turns every hint into a no-op |
| `SAGA_ENDPOINT` | `127.0.0.1:50051` | host:port of the hint service (`saga serve` prints it) |
| `SAGA_API_KEY` | unset | this agent's API key (shared, or its tenant's from the server's keys file), sent as `authorization: Bearer ...` |
| `SAGA_TENANT` | empty | tenant for sessions that do not name one |
| `SAGA_QUEUE_SIZE` | `10000` | events buffered before new ones are dropped (and counted) |
| `SAGA_BATCH_SIZE` | `512` | most events per RPC |
| `SAGA_FLUSH_INTERVAL_MS` | `5` | how long the sender waits to fill a batch: hints go stale |
| `SAGA_RPC_TIMEOUT_MS` | `1000` | deadline of one batch RPC |
| `SAGA_EXIT_FLUSH_MS` | `200` | bound on the flush at interpreter exit |
| `SAGA_MAX_EVENT_AGE_S` | `60` | events older than this are dropped instead of sent late |
| `SAGA_SAMPLE_RATE` | `1.0` | fraction of *sessions* that send hints (whole sessions, never half of one) |
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields
from typing import Mapping

__all__ = ["SagaConfig"]

log = logging.getLogger("saga_sdk")

_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True, slots=True)
class SagaConfig:
    enabled: bool = True
    endpoint: str = "127.0.0.1:50051"
    api_key: str | None = None
    tenant: str = ""
    queue_size: int = 10_000
    batch_size: int = 512
    flush_interval_s: float = 0.005
    rpc_timeout_s: float = 1.0
    exit_flush_s: float = 0.2
    max_event_age_s: float = 60.0
    sample_rate: float = 1.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> "SagaConfig":
        """Read the environment; a malformed value is logged and its default kept,
        because a typo in a hint setting must never stop the agent."""
        env = os.environ if environ is None else environ
        values: dict = {}
        _read(env, values, "enabled", "SAGA_ENABLED", lambda v: v.strip().lower() not in _FALSE)
        _read(env, values, "endpoint", "SAGA_ENDPOINT", _endpoint)
        _read(env, values, "api_key", "SAGA_API_KEY", lambda v: v or None)
        _read(env, values, "tenant", "SAGA_TENANT", str)
        _read(env, values, "queue_size", "SAGA_QUEUE_SIZE", _positive(int))
        _read(env, values, "batch_size", "SAGA_BATCH_SIZE", _positive(int))
        _read(env, values, "flush_interval_s", "SAGA_FLUSH_INTERVAL_MS", lambda v: _non_negative(float)(v) / 1000)
        _read(env, values, "rpc_timeout_s", "SAGA_RPC_TIMEOUT_MS", lambda v: _positive(float)(v) / 1000)
        _read(env, values, "exit_flush_s", "SAGA_EXIT_FLUSH_MS", lambda v: _non_negative(float)(v) / 1000)
        _read(env, values, "max_event_age_s", "SAGA_MAX_EVENT_AGE_S", _positive(float))
        _read(env, values, "sample_rate", "SAGA_SAMPLE_RATE", _fraction)
        values.update(overrides)
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown SagaConfig fields: {sorted(unknown)}")
        return cls(**values)


def _read(env: Mapping[str, str], values: dict, name: str, var: str, parse) -> None:
    raw = env.get(var)
    if raw is None:
        return
    try:
        values[name] = parse(raw)
    except (TypeError, ValueError) as exc:
        log.warning("ignoring %s=%r: %s", var, raw, exc)


def _endpoint(value: str) -> str:
    value = value.strip()
    for scheme in ("grpc://", "http://"):
        if value.startswith(scheme):
            value = value[len(scheme):]
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError("expected host:port")
    return value


def _positive(kind):
    def parse(v: str):
        x = kind(v)
        if x <= 0:
            raise ValueError("must be > 0")
        return x
    return parse


def _non_negative(kind):
    def parse(v: str):
        x = kind(v)
        if x < 0:
            raise ValueError("must be >= 0")
        return x
    return parse


def _fraction(v: str) -> float:
    x = float(v)
    if not 0.0 <= x <= 1.0:
        raise ValueError("must be within [0, 1]")
    return x
