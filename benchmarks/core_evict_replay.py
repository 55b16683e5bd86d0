"""Session-level KV cache replay of agent traces: does the WA-LRU key order evictions well?

One worker, `--concurrency` sessions at a time (a finished task is replaced by
the next), a KV cache of `--capacity` tokens holding one prefix per session
(its last prompt plus answer). A call reuses min(cached, reused_prefix_tokens)
of its prompt if its session's prefix is still cached and recomputes the rest;
its new prefix is then inserted, evicting other sessions' prefixes (never one
whose call is running) until it fits, or is dropped if it cannot. Tool times
come from the trace; LLM calls take no time unless `--llm-time` (then running
calls, whose KV cannot be evicted, crowd the cache and every policy drops the
same prefixes: the order no longer matters, and a real engine would queue the
request instead). The core sees the run as hints on a simulated clock.

Policies, same trace and capacity:
- lru:       key = last access
- predicted: farthest expected next use first (now + the core's expected resume time)
- wa-lru:    the core's `eviction_priority` (expected wait / (p_continue * cost weight))
- belady:    farthest *actual* next use first (offline optimum for this model)
- unbounded: no evictions (the floor: first calls and non-reusable tokens)

Reported: share of prompt tokens recomputed, and each policy over Belady.

    python -m benchmarks.core_evict_replay --trace $SAGA_TRACES/swe-mini-dev.jsonl
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from pathlib import Path

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

POLICIES = ("lru", "predicted", "wa-lru", "belady", "unbounded")


def load(path: Path) -> list[dict]:
    out = []
    for n, line in enumerate(path.open(), 1):
        if line.strip():
            task = json.loads(line)
            if task.get("format") != "saga-trace/1":
                raise SystemExit(f"{path}:{n}: not a saga-trace/1 task line")
            if task["steps"]:
                out.append(task)
    return out


def run(tasks: list[dict], policy: str, capacity: int, concurrency: int, *, llm_time: bool = False,
        evict_running: bool = False) -> float:
    clock = ManualClock()
    core = WorkflowCore(clock=clock)
    cache: dict[str, int] = {}  # session -> cached prefix tokens
    last: dict[str, float] = {}  # session -> last access
    running: set[str] = set()
    next_use: dict[str, float] = {}  # belady: time of the session's next call
    state: dict[str, tuple[dict, int]] = {}  # session -> (task, step index)
    events: list[tuple[float, int, str, str]] = []
    seq = 0
    queue = list(enumerate(tasks))
    queue.reverse()
    recomputed = total = 0

    def push(t: float, kind: str, sid: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, sid))

    def start_next(t: float) -> None:
        if queue:
            i, task = queue.pop()
            sid = f"{i}"
            state[sid] = (task, 0)
            core.accept(SessionStart(sid, t, tenant=task.get("run", ""), workflow=task.get("agent", "")))
            push(t, "llm", sid)

    def key(sid: str, now: float) -> float:
        if policy == "lru":
            return last[sid]
        if policy == "belady":
            return -next_use.get(sid, math.inf)
        if policy == "predicted":
            r = core.aeg.reuse(sid, now)
            return -(now + r[1]) if r is not None else last[sid]
        return core.eviction_priority(sid, cache[sid], last[sid])

    def insert(sid: str, tokens: int, now: float) -> None:
        cache.pop(sid, None)
        if policy != "unbounded":
            used = sum(cache.values())
            victims = sorted((key(s, now), s) for s in cache if evict_running or s not in running)
            for _, victim in victims:
                if used + tokens <= capacity:
                    break
                used -= cache.pop(victim)
            if used + tokens > capacity:
                return
        cache[sid] = tokens
        last[sid] = now

    for _ in range(concurrency):
        start_next(0.0)
    while events:
        t, _, kind, sid = heapq.heappop(events)
        clock.t = t
        task, i = state[sid]
        step = task["steps"][i]
        if kind == "llm":
            prompt = int(step["prompt_tokens"])
            hit = min(cache.get(sid, 0), int(step.get("reused_prefix_tokens") or 0))
            recomputed += prompt - hit
            total += prompt
            core.accept(LlmCallStart(sid, t, step=i))
            running.add(sid)
            insert(sid, prompt, t)
            lat = float(step.get("llm_latency_s") or 2.0) if llm_time else 0.0
            tools = step.get("tools") or []
            dur = sum(float(x.get("duration_s") or 0.0) for x in tools)
            next_use[sid] = t + lat + dur if i + 1 < len(task["steps"]) else math.inf
            push(t + lat, "llm_end", sid)
        elif kind == "llm_end":
            out = int(step["output_tokens"])
            core.accept(LlmCallEnd(sid, t, step=i, prompt_tokens=int(step["prompt_tokens"]), output_tokens=out))
            running.discard(sid)
            if sid in cache:
                cache[sid] = int(step["prompt_tokens"]) + out
                last[sid] = t
            tools = step.get("tools") or []
            dur = sum(float(x.get("duration_s") or 0.0) for x in tools)
            for k, x in enumerate(tools[:1]):
                core.accept(ToolCallStart(sid, t, x.get("name") or "tool", call_id=str(k),
                                          category=x.get("category") or ""))
            if i + 1 < len(task["steps"]):
                next_use[sid] = t + dur
                push(t + dur, "tool_end", sid)
            else:
                next_use[sid] = math.inf
                push(t + dur, "end", sid)
        elif kind == "tool_end":
            tools = step.get("tools") or []
            if tools:
                core.accept(ToolCallEnd(sid, t, tools[0].get("name") or "tool", call_id="0"))
            state[sid] = (task, i + 1)
            push(t, "llm", sid)
        else:  # end
            tools = step.get("tools") or []
            if tools:
                core.accept(ToolCallEnd(sid, t, tools[0].get("name") or "tool", call_id="0"))
            core.accept(SessionEnd(sid, t))
            del state[sid]
            start_next(t)
    return recomputed / total if total else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--capacity", type=int, nargs="+", default=[400_000, 300_000, 200_000, 150_000])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--llm-time", action="store_true", help="LLM calls take their recorded latency")
    ap.add_argument("--evict-running", action="store_true", help="a running call's prefix may be evicted")
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        print(f"no such trace: {args.trace}", file=sys.stderr)
        return 2
    tasks = load(args.trace)
    print(f"tasks={len(tasks)} concurrency={args.concurrency}")
    for cap in args.capacity:
        res = {p: run(tasks, p, cap, args.concurrency, llm_time=args.llm_time, evict_running=args.evict_running)
               for p in args.policies}
        base = res.get("belady")
        cells = "  ".join(f"{p} {100 * v:5.2f}%" + (f" ({v / base:4.2f}x)" if base else "")
                          for p, v in res.items())
        print(f"capacity {cap:>8d}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
