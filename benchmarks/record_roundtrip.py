"""Does a recording say what was sent? `saga serve --record` on the trace replay, checked.

The replay writes exactly what it sends (`--workload`: prompts, answers, tool gaps)
and has the engine record what it saw (`--record DIR`); this script holds the two
side by side, session by session, and then replays the recording in the simulator
(the `cpu-2core` preset, the replay's KV pool and `max_num_seqs`) to see whether the
run's prefix-hit rate comes back:

    .venv/bin/python -m benchmarks.serve_trace_replay --modes saga --workload sent.jsonl \\
        --record rec --json run.json
    .venv/bin/python -m benchmarks.record_roundtrip --sent sent.jsonl \\
        --recording rec/saga.jsonl --measured run.json

Checks (each printed with its counts; the exit status is 1 if one fails): every sent
session is recorded with as many steps; prompt and output tokens are exact; the
reused prefix is within a KV block of what was sent; the recorded tool gaps are within
50 ms of the slept ones; the cached tokens recorded are those the client was served;
the simulated hit rate of the recording is within 0.05 of the measured one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.harness.replay import simulate

BLOCK = 32
GAP_TOLERANCE_S = 0.05
HIT_TOLERANCE = 0.05


def _tasks(path: Path) -> list[dict]:
    from saga_server.bench.workload import load_trace  # noqa: PLC0415

    return load_trace(path)


def _session_of(recorded_id: str, sent_ids: set[str]) -> str | None:
    """The replay names a session `<task id>-<seed>`."""
    head = recorded_id.rsplit("-", 1)[0]
    return head if head in sent_ids else None


def _tool_s(step: dict) -> float:
    return sum(t["duration_s"] or 0.0 for t in step["tools"])


class Report:
    def __init__(self) -> None:
        self.failed = False

    def check(self, ok: bool, what: str) -> None:
        self.failed |= not ok
        print(f"  [{'ok' if ok else 'FAIL'}] {what}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sent", type=Path, required=True, help="serve_trace_replay.py --workload output")
    p.add_argument("--recording", type=Path, required=True, help="the engine's recording of the same run")
    p.add_argument("--measured", type=Path, required=True, help="serve_trace_replay.py --json output of the run")
    p.add_argument("--mode", default="saga", help="the replay mode that was recorded")
    p.add_argument("--kv-blocks", type=int, default=400)
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--calibration", type=Path, help="saga calibrate --out file (default: the preset)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    sent = {t["task_id"]: t for t in _tasks(args.sent)}
    recorded = {}
    for t in _tasks(args.recording):
        sid = _session_of(t["task_id"], set(sent))
        if sid is not None:
            recorded[sid] = t
    measured = next(r for r in json.loads(args.measured.read_text())["results"] if r["mode"] == args.mode)
    pairs = [(sent[s], recorded[s]) for s in sent if s in recorded]
    steps = [(a, b) for s, r in pairs for a, b in zip(s["steps"], r["steps"])]
    report = Report()

    print(f"{len(sent)} sessions sent, {len(recorded)} recorded ({args.recording})")
    report.check(len(pairs) == len(sent), f"every sent session recorded: {len(pairs)}/{len(sent)}")
    same_len = sum(len(s["steps"]) == len(r["steps"]) for s, r in pairs)
    report.check(same_len == len(pairs), f"steps per session equal: {same_len}/{len(pairs)} sessions, "
                                         f"{sum(len(r['steps']) for _, r in pairs)} steps recorded")
    for key in ("prompt_tokens", "output_tokens"):
        exact = sum(a[key] == b[key] for a, b in steps)
        report.check(exact == len(steps), f"{key} exact: {exact}/{len(steps)} steps")
    reuse = [b["reused_prefix_tokens"] - a["reused_prefix_tokens"] for a, b in steps]
    within = sum(-BLOCK < d <= 0 for d in reuse)
    report.check(within == len(steps), f"reused prefix within a block ({BLOCK}) of what was sent: {within}/{len(steps)}"
                                       f" steps; differences {min(reuse)}..{max(reuse)} tokens")
    gaps = [abs(_tool_s(b) - _tool_s(a)) for s, r in pairs for a, b in zip(s["steps"][:-1], r["steps"][:-1])]
    ok = sum(g <= GAP_TOLERANCE_S for g in gaps)
    report.check(ok == len(gaps), f"tool gaps within {GAP_TOLERANCE_S * 1000:.0f} ms of the slept ones: {ok}/{len(gaps)};"
                                  f" |recorded - slept| median {statistics.median(gaps) * 1000:.1f} ms,"
                                  f" max {max(gaps) * 1000:.1f} ms")
    rec_cached = sum(b["provider_cached_tokens"] or 0 for _, b in steps)
    report.check(rec_cached == measured["cached_tokens"],
                 f"cached tokens recorded {rec_cached}, served to the client {measured['cached_tokens']}")

    # The recording alone, as an operator would replay it: its own start times.
    first = min(t["started_unix_s"] for t in recorded.values())
    workload = [{**t, "start_s": t["started_unix_s"] - first} for t in recorded.values()]
    predicted = simulate(workload, args.mode, args)
    diff = predicted["hit_rate"] - measured["hit_rate"]
    report.check(abs(diff) <= HIT_TOLERANCE,
                 f"the recording replayed in the simulator (cpu-2core, {args.kv_blocks} blocks, max_num_seqs "
                 f"{args.max_num_seqs}): hit rate {predicted['hit_rate']:.3f} against {measured['hit_rate']:.3f} "
                 f"measured ({diff:+.3f}); mean TCT {predicted['tct_mean_s']:.1f} s against "
                 f"{measured['tct_mean_s']:.1f} s")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
