"""Replay saga-trace/1 agent traces through the workflow core as hint streams.

Each task becomes one session: SessionStart, then per step LlmCallStart /
LlmCallEnd, the step's tool calls (ToolCallStart with the recorded tool name and
category, ToolCallEnd after the recorded duration), and SessionEnd. Time is
simulated (the core's injected clock), tasks run one after another, and the core
learns online: every prediction is made before the outcome it predicts is fed in.

Reported:
- next-tool-category accuracy: at each LlmCallStart, `Prediction.next_tool_category`
  vs the category of the tool that step actually called; next to it the
  majority-class baseline and the hindsight first-order Markov chain (the best any
  predictor that sees only the previous category can do on this trace).
- resume-time calibration: at each ToolCallStart, the fraction of actual tool
  durations <= the predicted p90 (target 0.85-0.95) and <= p50 (target ~0.5).
- p_continue: mean predicted probability before a session's last tool vs the rest.

With `--no-hints` the core sees only what an engine sees (request arrival with
its prompt length, request finish with its output length): no tool names, no
session ends (silent sessions expire). Then the resume-time figures score the
predicted gap between a response and the session's next request.

    python benchmarks/replay_aeg.py --trace ../shared/traces/swe-mini-dev.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from saga_server.core import (
    LlmCallEnd,
    LlmCallStart,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)

try:
    from tqdm import tqdm
except ImportError:  # progress bars are a nicety, not a dependency
    def tqdm(it, **_):
        return it


class SimClock:
    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def load(path: Path) -> list[dict]:
    tasks = []
    with path.open() as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                task = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{n}: not JSON ({exc})")
            if task.get("format") != "saga-trace/1" or not isinstance(task.get("steps"), list):
                raise SystemExit(f"{path}:{n}: not a saga-trace/1 task line")
            tasks.append(task)
    return tasks


def replay(tasks: list[dict], warmup: int = 0) -> dict:
    clock = SimClock()
    core = WorkflowCore(clock=clock, seed=0)
    cat_hits = cat_total = 0
    seq: list[tuple[str, str]] = []  # (previous category, category) for the Markov bound
    majority: Counter[str] = Counter()
    cal = defaultdict(lambda: [0, 0, 0])  # category -> [n, <= p90, <= p50]
    p_last, p_other = [], []
    n_tool = 0
    for ti, task in enumerate(tqdm(tasks, desc="replay", unit="task")):
        sid = f"{task.get('run', '')}/{task.get('task_id', ti)}/{ti}"
        wf = task.get("agent", "agent")
        ev = core.accept
        ev(SessionStart(sid, clock.t, tenant=task.get("run", ""), workflow=wf))
        prev_cat = "^"
        steps = task["steps"]
        for si, step in enumerate(steps):
            tools = step.get("tools") or []
            ev(LlmCallStart(sid, clock.t, step=si))
            guess = core.predict(sid).next_tool_category
            if tools:
                actual = tools[0].get("category") or "other"
                if ti >= warmup:
                    cat_total += 1
                    cat_hits += guess == actual
                    majority[actual] += 1
                    seq.append((prev_cat, actual))
                prev_cat = actual
            clock.t += float(step.get("llm_latency_s") or 2.0)
            ev(LlmCallEnd(sid, clock.t, step=si, prompt_tokens=int(step.get("prompt_tokens") or 0),
                          output_tokens=int(step.get("output_tokens") or 0)))
            last_step = si == len(steps) - 1
            for k, tool in enumerate(tools):
                cid = f"{si}.{k}"
                cat = tool.get("category") or ""
                ev(ToolCallStart(sid, clock.t, tool.get("name") or "tool", call_id=cid, category=cat))
                p = core.predict(sid)
                (p_last if last_step else p_other).append(p.p_continue)
                dur = tool.get("duration_s")
                if dur is not None:
                    n_tool += 1
                    if ti >= warmup:
                        c = cal[cat or "?"]
                        c[0] += 1
                        c[1] += dur <= p.resume_p90_s
                        c[2] += dur <= p.resume_p50_s
                    clock.t += float(dur)
                ev(ToolCallEnd(sid, clock.t, tool.get("name") or "tool", call_id=cid))
        ev(SessionEnd(sid, clock.t))
        clock.t += 1.0
    # Hindsight first-order Markov chain: for each previous category the most
    # frequent next one, scored on the same sequence (an upper bound for a
    # first-order predictor, which the online AEG has to learn first).
    trans: dict[str, Counter[str]] = defaultdict(Counter)
    for a, b in seq:
        trans[a][b] += 1
    markov_hits = sum(c.most_common(1)[0][1] for c in trans.values())
    n90 = sum(c[0] for c in cal.values())
    return {
        "tasks": len(tasks),
        "tool_calls_timed": n_tool,
        "next_category_accuracy": cat_hits / cat_total if cat_total else float("nan"),
        "majority_baseline": (majority.most_common(1)[0][1] / cat_total) if cat_total else float("nan"),
        "markov_hindsight_bound": markov_hits / cat_total if cat_total else float("nan"),
        "p90_coverage": sum(c[1] for c in cal.values()) / n90 if n90 else float("nan"),
        "p50_coverage": sum(c[2] for c in cal.values()) / n90 if n90 else float("nan"),
        "p90_coverage_by_category": {k: round(v[1] / v[0], 3) for k, v in sorted(cal.items()) if v[0]},
        "p_continue_before_last_tool": sum(p_last) / len(p_last) if p_last else float("nan"),
        "p_continue_other_tools": sum(p_other) / len(p_other) if p_other else float("nan"),
        "predictions_scored": cat_total,
    }


def replay_engine_only(tasks: list[dict], warmup: int = 0) -> dict:
    clock = SimClock()
    core = WorkflowCore(clock=clock, seed=0)
    n = c90 = c50 = 0
    p_last, p_other = [], []
    for ti, task in enumerate(tqdm(tasks, desc="replay (no hints)", unit="task")):
        sid = f"{task.get('run', '')}/{task.get('task_id', ti)}/{ti}"
        steps = task["steps"]
        for si, step in enumerate(steps):
            prompt, out = int(step.get("prompt_tokens") or 0), int(step.get("output_tokens") or 0)
            core.on_request_arrival(sid, prompt, tenant=task.get("run", ""))
            clock.t += float(step.get("llm_latency_s") or 2.0)
            core.on_request_finished(sid, prompt, out)
            p = core.predict(sid)
            last = si == len(steps) - 1
            (p_last if last else p_other).append(p.p_continue)
            durs = [t.get("duration_s") for t in step.get("tools") or []]
            gap = sum(d for d in durs if d is not None)
            if not last and ti >= warmup and durs and None not in durs:
                n += 1
                c90 += gap <= p.resume_p90_s
                c50 += gap <= p.resume_p50_s
            clock.t += gap
        clock.t += core.config.session_idle_s + 1.0  # silent: it expires as ended
    return {
        "tasks": len(tasks),
        "gaps_scored": n,
        "p90_coverage": c90 / n if n else float("nan"),
        "p50_coverage": c50 / n if n else float("nan"),
        "p_continue_after_last_response": sum(p_last) / len(p_last) if p_last else float("nan"),
        "p_continue_other_responses": sum(p_other) / len(p_other) if p_other else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True, help="saga-trace/1 JSONL file")
    ap.add_argument("--warmup", type=int, default=0, help="tasks learned from but not scored")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--no-hints", action="store_true", help="engine events only (inferred AEG)")
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        print(f"no such trace: {args.trace}", file=sys.stderr)
        return 2
    tasks = load(args.trace)
    res = replay_engine_only(tasks, args.warmup) if args.no_hints else replay(tasks, warmup=args.warmup)
    for k, v in res.items():
        print(f"{k:32s} {v:.4f}" if isinstance(v, float) else f"{k:32s} {v}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
