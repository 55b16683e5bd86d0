"""The names of SAGA's mechanisms: what an operator or an ablation can switch off.

One vocabulary for the engine's switches (`saga serve --off`, `SAGA_OFF`), the
simulator's ablations (`saga-no-<name>` in `saga bench`) and the docs. Switched off,
a mechanism falls back to what stock vLLM does at that point:

| name | the mechanism | off |
|---|---|---|
| `walru` | WA-LRU eviction key (`eviction`) | keys are the last use (LRU) |
| `ttl` | tool-aware TTL pins (`pinning`) | nothing is pinned |
| `prefetch` | bringing KV back before a tool ends (`prefetch`) | nothing is brought back early |
| `afs` | Agent Fair Share order of the waiting queue (`fairshare`) | arrival order (FCFS) |
| `steal` | session placement and work stealing (`routing`) | fewest live sessions, never moved |
| `admit` | session admission and parking (`admission`) | every session's requests may run at once |
| `shape` | deadline shaping (`deadlines`) | nothing held back, no thin prefill |

`steal` is a cluster's (the router's, the simulator's), not one engine's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Iterable

__all__ = ["Mechanism", "ALL_MECHANISMS", "ENGINE_MECHANISMS", "parse_mechanisms"]


class Mechanism(StrEnum):
    WALRU = "walru"
    TTL = "ttl"
    PREFETCH = "prefetch"
    AFS = "afs"
    STEAL = "steal"
    ADMIT = "admit"
    SHAPE = "shape"


ALL_MECHANISMS = frozenset(Mechanism)
ENGINE_MECHANISMS = ALL_MECHANISMS - {Mechanism.STEAL}


def parse_mechanisms(names: str | Iterable[str], allowed: frozenset[Mechanism] = ALL_MECHANISMS
                     ) -> frozenset[Mechanism]:
    """Mechanisms named in a comma-separated string (or an iterable of names); raises
    ValueError naming each unknown or disallowed name and the allowed ones."""
    parts = names.split(",") if isinstance(names, str) else list(names)
    wanted = {p.strip() for p in parts if p.strip()}
    unknown = sorted(wanted - {m.value for m in allowed})
    if unknown:
        raise ValueError(f"unknown mechanism(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(sorted(m.value for m in allowed))}")
    return frozenset(Mechanism(w) for w in wanted)
