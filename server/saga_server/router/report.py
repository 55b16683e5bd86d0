"""`ReplicaReport`: what one replica tells the SAGA request router at every poll.

Ray Serve polls each replica's `record_routing_stats` (`replica.SagaLLMServer`)
and hands the dict it returns to the request router as
`RunningReplica.routing_stats`. Ray needs a plain dict there, so the report
crosses that one edge as `to_dict()` under `REPORT_KEY` and is read back with
`from_dict`, which takes whatever an older or newer replica sent: a missing or
malformed field gets its default, and a report with no session list counts as
unreadable (the router then keeps the replica's last good one for a while).

`read_report` builds a report from the engine's hint service in two small RPCs:
`ListResident` (session ids, tool state, KV size) and `GetStats` (`engine`'s KV figures, per-tenant service).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["ReplicaReport", "read_report", "REPORT_KEY"]

REPORT_KEY = "saga"  # the report's key in Ray's routing_stats dict
MAX_REPORTED_SESSIONS = 4096


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    hint_addr: str = ""  # the replica engine's hint endpoint
    # Sessions whose KV the engine holds (`ListResident`: served there, not ended,
    # not moved away since), and those of them inside a tool call.
    sessions: frozenset[str] = frozenset()
    in_tool: frozenset[str] = frozenset()
    kv_usage: float = 0.0  # KV blocks held for sessions / KV blocks in the pool
    # tenant -> tokens the engine served it, cumulative (cluster-wide Agent Fair
    # Share, see `engine_calls.PeerServiceRelay`)
    served: Mapping[str, float] = field(default_factory=dict)
    error: str = ""  # why the engine could not be read; "" when it was
    kv_tokens: Mapping[str, int] = field(default_factory=dict)  # session -> KV it holds there (where known)

    @property
    def readable(self) -> bool:
        return not self.error

    @classmethod
    def unreadable(cls, hint_addr: str, error: str) -> "ReplicaReport":
        return cls(hint_addr=hint_addr, error=(error or "unreadable")[:200])

    def to_dict(self) -> dict[str, Any]:
        return {"hint_addr": self.hint_addr, "sessions": sorted(self.sessions), "in_tool": sorted(self.in_tool),
                "kv_tokens": dict(self.kv_tokens), "kv_usage": self.kv_usage, "served": dict(self.served),
                "error": self.error}

    @classmethod
    def from_dict(cls, raw: Any) -> "ReplicaReport":
        if not isinstance(raw, Mapping):
            return cls.unreadable("", "no SAGA report")
        hint_addr = raw.get("hint_addr")
        hint_addr = hint_addr if isinstance(hint_addr, str) else ""
        error = raw.get("error")
        sessions = _ids(raw.get("sessions"))
        if error or sessions is None:
            return cls.unreadable(hint_addr, str(error or "no session list"))
        return cls(hint_addr=hint_addr, sessions=sessions, in_tool=_ids(raw.get("in_tool")) or frozenset(),
                   kv_tokens={sid: int(n) for sid, n in _served(raw.get("kv_tokens")).items() if sid in sessions},
                   kv_usage=_amount(raw.get("kv_usage")) or 0.0, served=_served(raw.get("served")))


def read_report(hint_addr: str, timeout: float = 2.0) -> ReplicaReport:
    """The report of the engine whose hint service listens on `hint_addr`
    (raises `saga_sdk.SagaUnavailable` when it does not answer)."""
    from saga_sdk import HintReader  # noqa: PLC0415

    from .engine_calls import engine_key  # noqa: PLC0415  (ListResident is an admin call)

    with HintReader(hint_addr, api_key=engine_key(), timeout=timeout) as reader:
        resident = reader.resident(MAX_REPORTED_SESSIONS)
        reply = reader.server_stats()
    engine = reply.engine  # all 0 where unset: no KV figures, no usage
    return ReplicaReport(
        hint_addr=hint_addr,
        sessions=frozenset(s.session_id for s in resident),
        in_tool=frozenset(s.session_id for s in resident if s.in_tool),
        kv_tokens={s.session_id: s.kv_tokens for s in resident if s.kv_tokens},
        kv_usage=engine.held_blocks / engine.kv_blocks if engine.kv_blocks > 0 else 0.0,
        served=dict(reply.served_tokens_by_tenant))


def _ids(value: Any) -> frozenset[str] | None:
    if not isinstance(value, (list, tuple, set, frozenset)):
        return None
    return frozenset(v for v in value if isinstance(v, str) and v)


def _amount(value: Any) -> float | None:
    """A finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _served(value: Any) -> dict[str, float]:
    """A mapping of name -> amount >= 0 (per tenant, per session), malformed entries dropped."""
    if not isinstance(value, Mapping):
        return {}
    out = {}
    for tenant, tokens in value.items():
        amount = _amount(tokens)
        if isinstance(tenant, str) and amount is not None:
            out[tenant] = amount
    return out
