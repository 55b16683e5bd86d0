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

    python -m benchmarks.replay_aeg --trace $SAGA_TRACES/swe-mini-dev.jsonl
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
    ManualClock,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)

from benchmarks.harness.plots import png

try:
    from tqdm import tqdm
except ImportError:  # progress bars are a nicety, not a dependency
    def tqdm(it, **_):
        return it


LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)


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
    clock = ManualClock()
    core = WorkflowCore(clock=clock, seed=0)
    cat_hits = cat_total = 0
    seq: list[tuple[str, str]] = []  # (previous category, category) for the Markov bound
    majority: Counter[str] = Counter()
    cal = defaultdict(lambda: [0, 0, 0])  # category -> [n, <= p90, <= p50]
    p_last, p_other = [], []
    n_tool = 0
    reliability = [0] * len(LEVELS)  # actual <= predicted q-quantile, per level
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
                        d, t0 = core.aeg.resume_dist(core.aeg.track(sid))
                        for li, q in enumerate(LEVELS):
                            reliability[li] += dur <= d.quantile_above(q, clock.t - t0) - (clock.t - t0)
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
        "coverage_by_level": {str(q): round(r / n90, 4) if n90 else float("nan")
                              for q, r in zip(LEVELS, reliability)},
    }


def replay_engine_only(tasks: list[dict], warmup: int = 0) -> dict:
    clock = ManualClock()
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


def plot(res: dict, path: Path) -> None:
    with png(path, 1, 2, figsize=(10, 4), dpi=120) as (_, (a, b)):
        levels = [float(q) for q in res["coverage_by_level"]]
        a.plot([0, 1], [0, 1], "--", color="grey", label="perfect")
        a.plot(levels, list(res["coverage_by_level"].values()), "o-", label="AEG")
        a.set(xlabel="predicted quantile of tool duration", ylabel="share of tools done by then",
              title="Resume-time calibration")
        a.legend()
        cats = res["p90_coverage_by_category"]
        b.bar(list(cats), list(cats.values()), alpha=0.7)
        b.axhspan(0.85, 0.95, color="green", alpha=0.25, zorder=3, label="target 0.85-0.95")
        b.set(ylim=(0, 1), ylabel="share under predicted p90", title="p90 coverage by tool category")
        b.tick_params(axis="x", rotation=45)
        b.legend(loc="lower right")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True, help="saga-trace/1 JSONL file")
    ap.add_argument("--warmup", type=int, default=0, help="tasks learned from but not scored")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--no-hints", action="store_true", help="engine events only (inferred AEG)")
    ap.add_argument("--plot", type=Path, help="write a calibration plot (PNG) here (hinted mode)")
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        print(f"no such trace: {args.trace}", file=sys.stderr)
        return 2
    tasks = load(args.trace)
    res = replay_engine_only(tasks, args.warmup) if args.no_hints else replay(tasks, warmup=args.warmup)
    for k, v in res.items():
        print(f"{k:32s} {v:.4f}" if isinstance(v, float) else f"{k:32s} {v}")
    if args.plot and not args.no_hints:
        plot(res, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
