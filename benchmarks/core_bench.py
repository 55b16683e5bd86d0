"""Per-decision cost of the workflow core (a benchmark, not a test).

Sets up a warm core (learned tool durations, `--sessions` live sessions inside
tools, several tenants) and a `HoldLedger` (the engines' KV hold ledger) holding
`--entries` cached prefixes, then times each decision in batches of `--batch` calls and reports the
median (and p90) per call over `--rounds` batches, against the 20 us target:

- score update: `eviction_priority` for a session + `HoldLedger.set_key`
- victim selection: `HoldLedger.make_room` of one block + re-hold (the ledger stays full)
- TTL decision: `pin_decision`
- AFS rank: `request_rank` (fair-share priority and task seniority: what the engine sorts by)
- also: `predict`, a hint through `accept` (ToolCallStart + ToolCallEnd pair)

    python -m benchmarks.core_bench [--entries 100000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from saga_server.core import (
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core.holds import HoldLedger

TARGET_US = 20.0
TOOLS = [("grep", "search"), ("cat", "read"), ("sed -i", "edit"), ("python", "run"), ("pytest", "test"),
         ("pip install", "install"), ("git diff", "git")]


class OneBlockPool:
    """Every hold is one block of its own, allocated by the caller: free counts only."""

    def __init__(self) -> None:
        self.free_blocks = 0

    def touch(self, session_id, blocks) -> None:
        pass

    def free(self, session_id, blocks) -> int:
        self.free_blocks += len(blocks)
        return len(blocks)

    def num_free(self) -> int:
        return self.free_blocks


def setup(n_sessions: int, seed: int):
    rng = random.Random(seed)
    clock = ManualClock()
    core = WorkflowCore(clock=clock, seed=seed)
    for s in range(200):  # history: teach durations and transitions
        sid = f"warm{s}"
        core.accept(SessionStart(sid, clock.t, tenant=f"t{s % 8}", workflow="swe"))
        for step in range(20):
            core.accept(LlmCallStart(sid, clock.t))
            clock.t += 1.0
            core.accept(LlmCallEnd(sid, clock.t, prompt_tokens=2000 + 300 * step, output_tokens=80))
            tool, cat = rng.choice(TOOLS)
            core.accept(ToolCallStart(sid, clock.t, tool, call_id="c", category=cat))
            clock.t += rng.expovariate(1 / (20.0 if cat in ("install", "test") else 0.3))
            core.accept(ToolCallEnd(sid, clock.t, tool, call_id="c"))
        core.accept(SessionEnd(sid, clock.t))
    live = []
    for s in range(n_sessions):
        sid = f"live{s}"
        core.accept(SessionStart(sid, clock.t, tenant=f"t{s % 8}", workflow="swe", deadline_s=600.0))
        core.accept(LlmCallStart(sid, clock.t))
        core.accept(LlmCallEnd(sid, clock.t, prompt_tokens=5000, output_tokens=80))
        tool, cat = rng.choice(TOOLS)
        core.accept(ToolCallStart(sid, clock.t, tool, call_id="c", category=cat))
        live.append(sid)
    clock.t += 0.1
    return core, clock, live, rng


def timed(fn, rounds: int, batch: int) -> tuple[float, float]:
    per_call = []
    for r in range(rounds):
        t0 = time.perf_counter_ns()
        fn(r, batch)
        per_call.append((time.perf_counter_ns() - t0) / batch / 1000.0)
    per_call.sort()
    return statistics.median(per_call), per_call[int(0.9 * (len(per_call) - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    core, clock, live, rng = setup(args.sessions, args.seed)
    pool = OneBlockPool()
    ledger = HoldLedger(pool, args.entries)
    # Entries: per-session prefixes plus session-less ones (plain recency keys).
    for e in range(args.entries):
        key = core.eviction_priority(live[e], 5000, clock.t) if e < len(live) else clock.t - rng.random() * 100.0
        ledger.hold(live[e] if e < len(live) else f"b{e}", (0,), key=key, now=clock.t)
    picks = [rng.choice(live) for _ in range(4096)]

    def score_update(r, n):
        for i in range(n):
            sid = picks[(r * n + i) & 4095]
            ledger.set_key(sid, core.eviction_priority(sid, 5000, clock.t))

    def victim(r, n):
        for _ in range(n):
            (gone,) = ledger.make_room(pool.free_blocks + 1)
            pool.free_blocks -= 1  # put it back so the ledger stays at size
            ledger.hold(gone.session_id, (0,), key=clock.t + 1e-3, now=clock.t)

    def ttl(r, n):
        for i in range(n):
            core.pin_decision(picks[(r * n + i) & 4095], 5000, 0.3)

    def afs(r, n):
        for i in range(n):
            core.request_rank(picks[(r * n + i) & 4095], "", clock.t)

    def predict(r, n):
        for i in range(n):
            core.predict(picks[(r * n + i) & 4095])

    def hints(r, n):
        for i in range(n // 2):
            sid = picks[(r * n + i) & 4095]
            core.accept(ToolCallEnd(sid, clock.t, "grep", call_id="c"))
            core.accept(ToolCallStart(sid, clock.t, "grep", call_id="c", category="search"))

    rows = [
        ("score update (100k entries)", score_update, True),
        ("victim selection (100k entries)", victim, True),
        ("TTL decision", ttl, True),
        ("AFS rank", afs, True),
        ("predict", predict, False),
        ("hint accept (per event)", hints, False),
    ]
    print(f"entries={len(ledger)} live_sessions={len(live)} rounds={args.rounds} batch={args.batch} "
          f"python={sys.version.split()[0]}")
    print(f"{'decision':34s} {'median us':>10s} {'p90 us':>8s} {'target':>7s} {'ratio':>6s}")
    worst = 0.0
    for name, fn, gated in rows:
        med, p90 = timed(fn, args.rounds, args.batch)
        ratio = med / TARGET_US
        if gated:
            worst = max(worst, ratio)
        print(f"{name:34s} {med:10.2f} {p90:8.2f} {TARGET_US if gated else float('nan'):7.1f} "
              f"{ratio if gated else float('nan'):6.2f}")
    print(f"worst gated median / target = {worst:.2f} ({'within' if worst <= 1 else 'OVER'} the 20 us target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
