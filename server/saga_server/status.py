"""`saga status`: a compact view of what a running SAGA server knows.

Reads the hint service (sessions, hint counters, the core's stats, an engine's KV,
admission and counted events) and, when an OpenAI URL is given, the SAGA metrics on
that server's `/metrics`. The header's session count and the table are the same
sessions: the live ones (a session that ended is remembered a while for late
readers, but is not listed); the table shows the most recently active of them, and
says how many of how many.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

from saga_sdk import HintReader, SagaUnavailable

from .metrics_schema import status_lines

__all__ = ["main", "render"]

_MAX_FETCHED = 2000  # sessions in one listing request, ended ones included


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="saga status", description=__doc__.splitlines()[0])
    parser.add_argument("--hints", default=os.environ.get("SAGA_ENDPOINT", "127.0.0.1:50051"),
                        help="hint service host:port (default: $SAGA_ENDPOINT or 127.0.0.1:50051)")
    parser.add_argument("--url", default=os.environ.get("SAGA_SERVER_URL"),
                        help="saga serve base URL, e.g. http://127.0.0.1:8000, to include /metrics")
    parser.add_argument("--sessions", type=int, default=20, help="most sessions to list")
    parser.add_argument("--watch", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS",
                        help="redraw every SECONDS (default 2) until interrupted; a server that goes "
                             "away is shown as such and waited for")
    args = parser.parse_args(argv)
    if args.watch is not None and not args.watch > 0:
        parser.error("--watch needs a positive number of seconds")
    if args.watch is None:
        view = _view(args)
        if view is None:
            return 1
        print(view)
        return 0
    try:
        while True:
            view = _view(args)
            sys.stdout.write(_CLEAR + time.strftime("%H:%M:%S ") + f"(every {args.watch:g} s; Ctrl-C stops)\n"
                             + (view if view is not None else "waiting for the hint service...") + "\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen


def _view(args) -> str | None:
    """One rendering of the server's state; None (with the reason on stderr) when
    the hint service cannot be reached."""
    try:
        with HintReader(args.hints) as reader:
            reply = reader.server_stats()
            sessions = reader.sessions(_listing_limit(dict(reply.stats), args.sessions))
    except SagaUnavailable as exc:
        print(f"saga status: hint service not reachable: {exc}", file=sys.stderr)
        return None
    metrics = {}
    if args.url:
        try:
            from .serve.status import fetch_metrics
        except ImportError:
            fetch_metrics = None
        if fetch_metrics is not None:
            try:
                metrics = fetch_metrics(args.url)
            except Exception as exc:  # status is best effort beyond the hint service
                print(f"(metrics from {args.url} unavailable: {exc})", file=sys.stderr)
    return render(dict(reply.stats), sessions, metrics, served=dict(reply.served_tokens_by_tenant),
                  limit=args.sessions, engine=reply.engine if reply.HasField("engine") else None,
                  engine_by_replica=dict(reply.engine_by_replica), tenant_outcomes=dict(reply.tenant_outcomes))


def _deadlines(tenant_outcomes, what: str, pick) -> str:
    """Per tenant, tasks (or user turns: `pick` chooses) ended within their deadline
    out of those with one, and the mean share of the deadline they used ("" when none had one)."""
    parts = []
    for tenant, outcomes in sorted(tenant_outcomes.items()):
        o = pick(outcomes)
        ended = o.met + o.missed
        if ended:
            parts.append(f"{tenant or '(no tenant)'} {o.met}/{ended} ({o.met / ended:.1%}), "
                         f"slack used {o.slack_used_sum / ended:.2f}")
    return f"  {what} within deadline: " + "; ".join(parts) if parts else ""


def _listing_limit(stats, wanted: int) -> int:
    """How many sessions to ask for so that `wanted` live ones come back: the
    listing is by recent activity and holds the remembered ended ones too."""
    ended = max(0, int(stats.get("aeg_sessions", 0) - stats.get("sessions_live", 0)))
    return max(1, min(wanted + ended, _MAX_FETCHED))


def render(stats, sessions, metrics=None, served=None, limit: int | None = None, engine=None,
           engine_by_replica=None, tenant_outcomes=None) -> str:
    """`sessions`: most recently active first (ended ones are left out: the header
    counts live sessions); at most `limit` listed. `served`: tenant -> tokens served
    (the hint service's per-tenant service). `engine`: GetStats' `ServerStats.engine`
    (None: no engine's figures); `engine_by_replica`: endpoint -> an engine's own
    (a cluster's fan-out); `tenant_outcomes`: tenant -> its `TenantOutcomes` (wire)."""
    live = int(stats.get("sessions_live", 0))
    listed = [s for s in sessions if s.state != "ended"][:limit]
    lines = [f"hint service: {live} live sessions, "
             f"{int(stats.get('open_tool_calls', 0))} open tool calls, "
             f"{int(stats.get('hints_events_accepted', 0))} events accepted, "
             f"{int(sum(stats.get(f'hints_{k}', 0) for k in _NOT_ACCEPTED))} refused"]
    if engine is not None:
        lines += _engine_lines(engine)
    tenancy = _tenancy(stats)
    if tenancy:
        lines.append(tenancy)
    for deadlines in (_deadlines(tenant_outcomes or {}, "tasks", lambda o: o.deadlines),
                      _deadlines(tenant_outcomes or {}, "user turns", lambda o: o.turns)):
        if deadlines:
            lines.append(deadlines)
    other = {k: v for k, v in sorted(stats.items()) if not k.startswith("hints_") and k not in _TENANCY}
    if other:
        lines.append("  " + "  ".join(f"{k}={_num(v)}" for k, v in other.items()))
    for replica, figures in sorted((engine_by_replica or {}).items()):
        lines.append(f"  replica {replica}: {_kv_held(figures)}")
    if served:
        lines.append("  tokens served: " + "  ".join(f"{t or '(no tenant)'}={_num(v)}"
                                                     for t, v in sorted(served.items())))
    if metrics:
        lines.append("engine metrics:")
        lines += [f"  {k} = {_num(v)}" for k, v in sorted(metrics.items())]
    if listed:
        header = f"{'session':<28} {'tenant':<10} {'state':<6} {'steps':>5} {'tools':>5} {'idle s':>7}  node / open tools"
        lines += ["", f"live sessions, most recently active first ({len(listed)} of {max(live, len(listed))}):",
                  header, "-" * len(header)]
        for depth, s in _as_trees(listed):
            open_tools = ",".join(t.tool for t in s.open_tools)
            waits = f" / {s.live_children} subagents running" if s.live_children else ""
            name = ("  " * (depth - 1) + "└ " if depth else "") + s.session_id
            lines.append(f"{name[:28]:<28} {s.tenant[:10]:<10} {s.state:<6} {s.steps:>5} "
                         f"{s.tool_calls:>5} {s.idle_s:>7.1f}  {s.current_node}{' / ' + open_tools if open_tools else ''}"
                         f"{waits}")
    return "\n".join(lines)


def _as_trees(listed) -> list:
    """(depth, session) in listing order, each subagent right under its parent
    (a child whose parent is not listed is shown as a root; the core links no cycles)."""
    ids = {s.session_id for s in listed}
    children: dict[str, list] = {}
    for s in listed:
        if s.parent_session_id in ids and s.parent_session_id != s.session_id:
            children.setdefault(s.parent_session_id, []).append(s)
    out: list = []

    def walk(s, depth: int) -> None:
        out.append((depth, s))
        for child in children.get(s.session_id, ()):
            walk(child, depth + 1)

    for s in listed:
        if s.parent_session_id not in ids or s.parent_session_id == s.session_id:
            walk(s, 0)
    return out


_NOT_ACCEPTED = ("events_invalid", "events_refused", "events_denied", "rate_dropped")
# What callers were refused, by the rule that refused them (stats name -> shown as).
_TENANCY = {"denied_tenant_claim": "claimed another tenant", "denied_foreign_session": "another's session",
            "denied_foreign_scope": "another's id scope",
            "denied_read": "read another's", "denied_release": "released another's",
            "denied_session_limit": "over session limit", "hints_denied_admin_only": "admin-only call",
            "hints_rate_dropped": "over hint rate", "fanout_rate_dropped": "over hint rate (router)",
            "deadline_clamped": "deadline clamped", "hints_auth_failures": "bad key",
            "fanout_auth_failures": "bad key (router)"}


def _engine_lines(engine) -> list[str]:
    """The engine's KV, its admission (where on), its pulls (where any), its host and
    disk tiers (where there) and its other counted events."""
    lines = [f"engine: {_kv_held(engine)}; {engine.hints_dropped} hints dropped"]
    if engine.HasField("admission"):
        adm = engine.admission
        lines.append(f"admission: {adm.active} active, {adm.parked} parked, {adm.waiting} waiting sessions; "
                     f"limit {_num(adm.limit_tokens)} tokens, {_num(adm.wait_s)} s waited in all")
    counts = {name: dict(figures.by_label) for name, figures in engine.counts.items()}
    pulls, tier = counts.get("kv_pulls", {}), counts.get("kv_tier_blocks", {})
    if pulls:
        lines.append(f"kv pulled in: {int(pulls.get('ok', 0))} pulls, "
                     f"{_num(_one(counts, 'kv_pulled_tokens'))} tokens in {_num(_one(counts, 'kv_pull_seconds'))} s; "
                     f"{int(pulls.get('failed', 0))} failed (recomputed)")
    if "kv_tier_chunks" in counts:
        lines.append(f"host kv tier: {int(_one(counts, 'kv_tier_used_chunks'))} of "
                     f"{int(_one(counts, 'kv_tier_chunks'))} chunks used; "
                     f"{_num(tier.get('stored', 0))} blocks stored, {_num(tier.get('loaded', 0))} loaded in "
                     f"{int(counts.get('kv_tier_loads', {}).get('ok', 0))} loads "
                     f"({_num(_one(counts, 'kv_tier_load_seconds'))} s); "
                     f"{_num(_one(counts, 'kv_tier_hit_tokens'))} prompt tokens from the tier")
    if "kv_disk_capacity_chunks" in counts:
        disk = counts.get("kv_disk_chunks", {})
        failed = int(disk.get("write_failed", 0) + disk.get("read_failed", 0))
        lines.append(f"disk kv tier: {int(_one(counts, 'kv_disk_used_chunks'))} of "
                     f"{int(_one(counts, 'kv_disk_capacity_chunks'))} chunks used; "
                     f"{int(disk.get('written', 0))} written, {int(disk.get('read', 0))} read, "
                     f"{int(disk.get('evicted', 0))} evicted; {failed} failed and "
                     f"{int(disk.get('skipped_slow', 0))} skipped as slow (recomputed)")
    summed = {**(_PULLS if pulls else {}), **(_TIER if "kv_tier_chunks" in counts else {}),
              **(_DISK if "kv_disk_capacity_chunks" in counts else {})}
    other = status_lines(counts, frozenset(name for name, labels in summed.items()
                                           if set(counts.get(name, ())) <= labels))
    if other:
        lines += ["engine counts:"] + other
    if engine.tables:
        lines.append("engine tables: " + "  ".join(f"{k}={v}" for k, v in sorted(engine.tables.items())))
    return lines


# The metrics (and their labels) the pull and host tier lines show; every other one,
# or one with another label, has its schema line.
_PULLS = {"kv_pulls": {"ok", "failed"}, "kv_pulled_tokens": {""}, "kv_pull_seconds": {""}}
_TIER = {"kv_tier_blocks": {"stored", "loaded"}, "kv_tier_loads": {"ok"}, "kv_tier_load_seconds": {""},
         "kv_tier_hit_tokens": {""}, "kv_tier_used_chunks": {""}, "kv_tier_chunks": {""}}
_DISK = {"kv_disk_chunks": {"written", "read", "evicted", "write_failed", "read_failed", "skipped_slow"},
         "kv_disk_used_chunks": {""}, "kv_disk_capacity_chunks": {""}}


def _one(counts, name: str) -> float:
    """The figure of a metric without a label (0 where it never happened)."""
    return counts.get(name, {}).get("", 0.0)


def _kv_held(engine) -> str:
    return (f"{engine.held_sessions} sessions hold {engine.held_blocks} of {engine.kv_blocks} KV blocks "
            f"({engine.pinned_blocks} pinned)")


def _tenancy(stats) -> str:
    """One line of refused cross-tenant actions, rate drops and key failures ("" if none)."""
    seen = [f"{label} {_num(stats[k])}" for k, label in _TENANCY.items() if stats.get(k)]
    return "tenancy: " + ", ".join(seen) if seen else ""


def _num(v: float) -> str:
    if isinstance(v, float) and (math.isnan(v) or not v.is_integer()):
        return f"{v:.3g}"
    return str(int(v))
