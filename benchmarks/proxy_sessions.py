"""How often `saga proxy` puts a request in the right session, on tau-airline-shaped traffic.

The tau-bench airline trace (`$SAGA_TRACES/tau-airline.jsonl`, read in place, never
copied) gives, per dialogue, the LLM calls in order with their prompt and answer sizes
and the tools each answer called. From it this script synthesises the message
histories an unchanged OpenAI-SDK agent would send: one system prompt shared by every
dialogue of the run (`shared_prefix_tokens` long), the user's opening message, and per
step the assistant answer (tool calls with OpenAI-style ids, or text) followed by the
tool results or the user's next message, each sized from the trace's token counts
(x 3.36 characters per token, the trace's own calibration). The trace has no parallel
tool calls; `--parallel` turns that share of tool steps into two calls at once.

Dialogues run `--concurrency` at a time; requests of different dialogues interleave at
random, several in flight at once; each dialogue echoes answers back the way one of
three clients does (the OpenAI SDK's own message object, a framework that re-dumps
tool arguments and turns null content into "", a client that drops null fields);
`--fail` of requests fail and are retried verbatim. `--twins` makes the trials of one
tau task open with the same words (the hard case: identical first requests).

It reports the share of requests assigned to their dialogue's session (a session
shared by two dialogues counts as wrong for both), tool boundary events, sessions
opened, the tracker's own cost per request, and its index size.

    .venv/bin/python -m benchmarks.proxy_sessions
    .venv/bin/python -m benchmarks.proxy_sessions --concurrency 128 --twins
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from saga_server.proxy.sessions import SessionTracker

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "tau-airline.jsonl"
CHARS_PER_TOKEN = 3.36
WORDS = ("flight reservation passenger baggage cabin economy business refund cancel change seat "
         "insurance payment certificate gift card membership gold silver regular origin destination "
         "date airport direct one-stop price total booking user id confirm").split()


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def _kind(hint) -> str:
    """A hint's kind as the hint protocol names it ("tool_call_start", ...)."""
    return _SNAKE.sub("_", type(hint.event).__name__).lower()


def text(rng: random.Random, tokens: int, tag: str) -> str:
    chars = max(8, int(tokens * CHARS_PER_TOKEN))
    out, size = [tag], len(tag)
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


class Dialogue:
    """One tau task replayed as an OpenAI chat history."""

    def __init__(self, task: dict, system: dict, rng: random.Random, style: str, parallel: float, opening: str):
        self.task, self.rng, self.style = task, rng, style
        self.steps = task["steps"]
        first = self.steps[0]["prompt_tokens"] - task["shared_prefix_tokens"]
        self.messages = [system, {"role": "user", "content": opening + " " + text(rng, max(5, first), "")}]
        self.parallel = [rng.random() < parallel for _ in self.steps]
        self.i = 0
        self.pending_answer = None
        self.tool_calls = 0

    @property
    def done(self) -> bool:
        return self.i >= len(self.steps)

    def body(self) -> dict:
        return {"model": "gpt-4o", "messages": self.messages, "tools": [], "temperature": 0}

    def answer(self) -> dict:
        step = self.steps[self.i]
        if not step["tools"]:
            return {"role": "assistant", "content": text(self.rng, step["output_tokens"], f"[{self.i}]"),
                    "refusal": None, "annotations": [], "audio": None, "function_call": None, "tool_calls": None}
        calls = []
        names = [t["name"] for t in step["tools"]]
        if self.parallel[self.i]:
            names = names + names[:1]
        for n, name in enumerate(names):
            args = {"user_id": f"user_{self.rng.randrange(10**6)}", "query": text(self.rng, step["output_tokens"] // len(names), "")}
            calls.append({"id": "call_" + "".join(self.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
                                                  for _ in range(24)),
                          "type": "function", "function": {"name": name, "arguments": json.dumps(args)}})
        return {"role": "assistant", "content": None, "refusal": None, "annotations": [], "audio": None,
                "function_call": None, "tool_calls": calls}

    def take(self, answer: dict) -> None:
        """Echo the answer as this dialogue's client does, then add what comes back."""
        if self.style == "sdk":
            echoed = json.loads(json.dumps(answer))
        elif self.style == "framework":
            echoed = {"role": "assistant", "content": answer["content"] or ""}
            if answer["tool_calls"]:
                echoed["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(json.loads(c["function"]["arguments"]), indent=2, sort_keys=True)}}
                    for c in answer["tool_calls"]]
        else:
            echoed = {k: v for k, v in answer.items() if v not in (None, [])}
        self.messages = self.messages + [echoed]
        step = self.steps[self.i]
        nxt = self.steps[self.i + 1] if self.i + 1 < len(self.steps) else None
        grow = max(5, nxt["prompt_tokens"] - step["prompt_tokens"] - step["output_tokens"]) if nxt else 20
        if answer["tool_calls"]:
            calls = answer["tool_calls"]
            self.tool_calls += len(calls)
            for c in calls:
                self.messages.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                                      "content": text(self.rng, grow // len(calls), "{")})
        else:
            self.messages.append({"role": "user", "content": text(self.rng, grow, "user:")})
        self.i += 1


def run(args) -> dict:
    tasks = [json.loads(line) for line in args.trace.read_text().splitlines() if line.strip()]
    if args.tasks:
        tasks = tasks[: args.tasks]
    rng = random.Random(args.seed)
    shared = tasks[0]["shared_prefix_tokens"]
    system = {"role": "system", "content": text(random.Random(0), shared, "# Airline agent policy")}
    styles = ["sdk", "framework", "strip"]
    pending = []
    for n, task in enumerate(tasks):
        base = task["task_id"].split("-")[0]
        opening = f"Hi, this is traveller {base}." if args.twins else f"Hi, this is traveller {task['task_id']}."
        pending.append(Dialogue(task, system, random.Random(rng.random()), styles[n % 3], args.parallel, opening))
    rng.shuffle(pending)
    dialogues = list(pending)
    tracker = SessionTracker(max_sessions=args.max_sessions)
    active: list[Dialogue] = []
    in_flight: list[tuple[Dialogue, object, list]] = []
    home: dict[int, str] = {}
    owner: dict[str, int] = {}
    assigned: list[tuple[int, str, str]] = []  # (dialogue, session, style)
    events = Counter()
    cost_ns: list[int] = []
    failures = 0
    peak_index = 0
    while pending or active or in_flight:
        while pending and len(active) < args.concurrency:
            active.append(pending.pop())
        busy = {id(d) for d, _, _ in in_flight}
        idle = [d for d in active if id(d) not in busy]
        if idle and (not in_flight or rng.random() < 0.5):
            d = rng.choice(idle)
            t0 = time.perf_counter_ns()
            turn, evs = tracker.begin(d.body())
            cost_ns.append(time.perf_counter_ns() - t0)
            events.update(_kind(e) for e in evs)
            in_flight.append((d, turn, evs))
            assigned.append((id(d), turn.session_id, d.style))
            home.setdefault(id(d), turn.session_id)
            owner.setdefault(turn.session_id, id(d))
        else:
            d, turn, _ = in_flight.pop(rng.randrange(len(in_flight)))
            if rng.random() < args.fail:
                failures += 1
                events.update(_kind(e) for e in tracker.fail(turn))
                continue  # the dialogue re-sends the same request later
            answer = d.answer()
            t0 = time.perf_counter_ns()
            evs = tracker.finish(turn, [answer], {"prompt_tokens": 1, "completion_tokens": 1})
            cost_ns.append(time.perf_counter_ns() - t0)
            events.update(_kind(e) for e in evs)
            d.take(answer)
            if d.done:
                active.remove(d)
            peak_index = max(peak_index, tracker.index_size())
    events.update(_kind(e) for e in tracker.close())  # the proxy stops: open tools end, sessions end
    right = Counter()
    total = Counter()
    for did, sid, style in assigned:
        ok = home[did] == sid and owner[sid] == did
        right[style] += ok
        total[style] += 1
    expected_tools = sum(d.tool_calls for d in dialogues)
    return {
        "requests": sum(total.values()),
        "correct": sum(right.values()),
        "accuracy": sum(right.values()) / max(1, sum(total.values())),
        "by_client": {s: round(right[s] / total[s], 5) for s in styles if total[s]},
        "dialogues": len(tasks),
        "sessions_opened": tracker.stats().sessions_started,
        "rules": dict(tracker.stats().by_rule),
        "failed_and_retried": failures,
        "events": dict(events),
        "tracker_us_median": statistics.median(cost_ns) / 1000,
        "tracker_us_p99": sorted(cost_ns)[int(len(cost_ns) * 0.99)] / 1000,
        "index_entries_peak": peak_index,
        "expected_tool_calls": expected_tools,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--tasks", type=int, default=0, help="first N dialogues only (0: all)")
    p.add_argument("--concurrency", type=int, default=32, help="dialogues running at once")
    p.add_argument("--parallel", type=float, default=0.15, help="share of tool steps made two parallel calls")
    p.add_argument("--fail", type=float, default=0.01, help="share of requests that fail and are retried")
    p.add_argument("--twins", action="store_true", help="trials of one task open with the same words")
    p.add_argument("--max-sessions", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not args.trace.exists():
        print(f"trace not found: {args.trace}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"tau-airline interleavings: {r['dialogues']} dialogues, {args.concurrency} at once, "
          f"parallel={args.parallel} fail={args.fail} twins={args.twins} seed={args.seed}")
    print(f"  requests in the right session: {r['correct']}/{r['requests']} = {100 * r['accuracy']:.2f}%  "
          f"(target >= 99%)   by client: {r['by_client']}")
    print(f"  sessions opened: {r['sessions_opened']} for {r['dialogues']} dialogues   rules: {r['rules']}   "
          f"failed+retried: {r['failed_and_retried']}")
    ev = r["events"]
    print(f"  hints: session_start {ev.get('session_start', 0)}, llm_call_start {ev.get('llm_call_start', 0)}, "
          f"tool_call_start {ev.get('tool_call_start', 0)}, tool_call_end {ev.get('tool_call_end', 0)}, "
          f"session_end {ev.get('session_end', 0)} "
          f"(tool calls the dialogues made: {r['expected_tool_calls']})")
    print(f"  tracker cost per call (begin or finish): median {r['tracker_us_median']:.1f} us, "
          f"p99 {r['tracker_us_p99']:.1f} us   peak index entries: {r['index_entries_peak']}   "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
