"""Policies by name: the baselines, SAGA, its ablations and the references.

`make_policy(name)` returns a fresh policy (policies hold per-run state). Ablations:
`saga-only-<m>` is `apc-lru` plus the one SAGA mechanism `m`; `saga-no-<m>` is full
SAGA without it (mechanisms: walru, ttl, prefetch, afs, steal, admit, shape);
`saga-request-fcfs` is full SAGA with request-level FCFS inside a tenant (no task
seniority, as the engine's `SAGA_SENIORITY_WINDOW_S=0`); `saga-no-trees` is full
SAGA told nothing of subagents' parents (each child an unrelated session);
`saga-no-turns` is full SAGA told no user turn's deadline (the person's waits still
hinted). `saga` routes with
`saga_server.core.routing` (new sessions to the least loaded worker, periodic
steals that move the KV); `saga-hash` is the same with the Ray router's
rendezvous-hash homes for new sessions. References: `infinite` (an unbounded pool),
`belady` (the offline-optimal eviction order) and `oracle`, full SAGA whose core knows
every tool call's and every person's wait's true duration (its pins, prefetch, parking
and keys use them instead of predictions): SAGA against `oracle` is what prediction
costs; `oracle` against `infinite` is what the mechanisms and the pool leave. Its
foresight is of waits only: remaining steps and next prompts are still predicted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from saga_server.engines.sim import (ApcLru, ApcLruOffload, Belady, ContinuumTtl, Infinite, KvFlow, SimPolicy,
                                     ThunderAgent, Vanilla)
from saga_server.core import CoreConfig
from saga_server.core.fairshare import FairShareConfig
from saga_server.engines.sim.peers.concur import Concur
from saga_server.engines.sim.peers.mars import Mars
from saga_server.engines.sim.peers.mori import Mori
from saga_server.engines.sim.peers.sticky_lru import HashLru, PrefixLru, StickyLru
from saga_server.engines.sim.saga_policy import MECHANISMS, SIM_ROUTING, SagaPolicy

__all__ = ["POLICIES", "DEFAULT_POLICIES", "PEERS", "ABLATIONS", "make_policy", "policy_names"]

_HASH_ROUTING = replace(SIM_ROUTING, new_session="hash")
_REQUEST_FCFS = CoreConfig(fairshare=FairShareConfig(seniority_window_s=0.0))

POLICIES: dict[str, Callable[[], SimPolicy]] = {
    "vanilla": Vanilla,
    "apc-lru": ApcLru,
    "apc-lru-offload": ApcLruOffload,
    "continuum-ttl": ContinuumTtl,
    "kvflow": KvFlow,
    "thunderagent": ThunderAgent,
    "mori": Mori,
    "mars": Mars,
    "concur": Concur,
    "sticky-lru": StickyLru,
    "hash-lru": HashLru,
    "prefix-lru": PrefixLru,
    "saga": SagaPolicy,
    "saga-hash": lambda: SagaPolicy(name="saga-hash", routing=_HASH_ROUTING),
    "saga-request-fcfs": lambda: SagaPolicy(name="saga-request-fcfs", config=_REQUEST_FCFS),
    "saga-no-trees": lambda: SagaPolicy(name="saga-no-trees", trees=False),
    "saga-no-turns": lambda: SagaPolicy(name="saga-no-turns", turns=False),
    "oracle": lambda: SagaPolicy(name="oracle", foresight=True),
    "infinite": Infinite,
    "belady": Belady,
}
for _m in MECHANISMS:
    POLICIES[f"saga-only-{_m}"] = (lambda m: lambda: SagaPolicy((m,), name=f"saga-only-{m}"))(_m)
    POLICIES[f"saga-no-{_m}"] = (lambda m: lambda: SagaPolicy(
        tuple(x for x in MECHANISMS if x != m), name=f"saga-no-{m}"))(_m)

# The 2026 peers (`saga_server.engines.sim.peers`): in every benchmark's default comparison.
PEERS = ("mori", "mars", "concur", "sticky-lru")
DEFAULT_POLICIES = ("vanilla", "apc-lru", "apc-lru-offload", "continuum-ttl", "kvflow", "saga", "infinite", "belady")
ABLATIONS = tuple(f"saga-only-{m}" for m in MECHANISMS) + tuple(f"saga-no-{m}" for m in MECHANISMS)


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(name: str) -> SimPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
