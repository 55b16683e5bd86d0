"""How a front door is asked to record: the `--record` flags, and the environment
that carries them into vLLM's engine process.

`saga proxy` and `saga serve` take the same flags (`add_arguments`). The proxy
records in its own process; `saga serve` records where the engine plugin's data is,
in vLLM's EngineCore process, so it hands the flags on as environment
(`to_env`), read there by `config_from_env`. An operator's own vLLM launch sets
the same variables:

    SAGA_RECORD=FILE  SAGA_RECORD_HASH_TOOLS=1  SAGA_RECORD_MAX_BYTES=N  SAGA_RECORD_IDLE_S=S
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Mapping

from .recorder import RecordConfig

__all__ = ["HASH_TOOLS_ENV", "IDLE_ENV", "MAX_BYTES_ENV", "RECORD_ENV", "add_arguments", "config_from_env",
           "to_env"]

RECORD_ENV = "SAGA_RECORD"
HASH_TOOLS_ENV = "SAGA_RECORD_HASH_TOOLS"
MAX_BYTES_ENV = "SAGA_RECORD_MAX_BYTES"
IDLE_ENV = "SAGA_RECORD_IDLE_S"
_ON = ("1", "true", "yes", "on")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record", metavar="FILE",
                        help="write each finished session to FILE as a saga-trace/1 task (sizes and tool names, "
                             "never text), for saga bench --trace / --what-if")
    parser.add_argument("--record-hash-tools", action="store_true", help="hash tool names in the recording")
    parser.add_argument("--record-max-bytes", type=int, metavar="N",
                        help="before the recording grows past N bytes, move it aside to NAME.1.EXT "
                             "(then .2, ...) and start a new one")


def to_env(args: argparse.Namespace, idle_s: float | None = None) -> dict[str, str]:
    """The environment that asks an engine process for the recording `args` ask for
    ({} for none); the path made absolute, as the engine's working directory may differ."""
    if not args.record:
        return {}
    env = {RECORD_ENV: os.path.abspath(args.record)}
    if args.record_hash_tools:
        env[HASH_TOOLS_ENV] = "1"
    if args.record_max_bytes is not None:
        env[MAX_BYTES_ENV] = str(args.record_max_bytes)
    if idle_s is not None:
        env[IDLE_ENV] = repr(float(idle_s))
    return env


def config_from_env(environ: Mapping[str, str], *, source: str, idle_s: float) -> RecordConfig | None:
    """The recording the environment asks for (None: none), `idle_s` unless it says
    otherwise. Raises `ValueError` for a malformed size or idle time."""
    path = environ.get(RECORD_ENV, "").strip()
    if not path:
        return None
    max_bytes = environ.get(MAX_BYTES_ENV, "").strip()
    idle = environ.get(IDLE_ENV, "").strip()
    try:
        size = int(max_bytes) if max_bytes else None
        idle_s = float(idle) if idle else idle_s
    except ValueError:
        raise ValueError(f"{MAX_BYTES_ENV}={max_bytes!r} or {IDLE_ENV}={idle!r} is not a number") from None
    if size is not None and size <= 0 or not (math.isfinite(idle_s) and idle_s > 0):
        raise ValueError(f"{MAX_BYTES_ENV} and {IDLE_ENV} must be positive")
    return RecordConfig(path, hash_tools=environ.get(HASH_TOOLS_ENV, "").strip().lower() in _ON,
                        max_bytes=size, idle_s=idle_s, source=source)
