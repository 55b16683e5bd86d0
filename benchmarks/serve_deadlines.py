"""Two tenants with deadlines on a real engine: `saga serve` against stock vLLM and
against vLLM's own priority scheduling, side by side in one run.

    .venv/bin/python -m benchmarks.serve_deadlines --json bench-out/serve_deadlines.json

The tenants are `deadline_tenants.py`'s two shapes, scaled to the default model's
4k context: a coding agent (its context grows by each tool result; deadline
`--coding-factor` x its unloaded time) and a browser agent (a fresh page each call,
one-action answers; deadline `--browser-factor` x), `--coding` and `--browser`
sessions started together within `--stagger-s`. Prompts are real token ids; answers
are forced to their lengths (`ignore_eos`, temperature 0).

A task's unloaded time is its tools' time plus its calls alone on this engine: the
run first measures, on the stock server, the prefill rate and the decode step of a
request alone, and prices each call with them (new tokens only: its reused prefix
is a hit when alone). The same deadlines hold in every mode.

Modes (`--modes`): `no-saga` (stock vLLM, FCFS), `priority` (stock vLLM with
`--scheduling-policy priority`, the browser tenant's requests at priority 0 and the
coding tenant's at 1), `saga` (SAGA with both sessions' deadlines in their
`session_start` hints) and `saga-no-NAME` (SAGA with mechanism NAME off, as
`saga serve --off NAME`: `saga-no-shape` runs it without deadline shaping).
Reported per mode and tenant: the share of tasks within deadline, mean task time and
the slack used (task time over deadline); goodput is tasks within deadline per hour
of the mode's wall time. Where a tenant's tasks' time beyond their unloaded time went
(`time_lost`), over all its tasks and over those that missed: waiting for first
tokens (queueing, or a prefill slower than alone), decoding (longer steps than
alone) or elsewhere. Answers are streamed to time their first tokens, in every mode
alike.

What it measured on this machine is in docs/RESEARCH.md ("Deadlines on the real engine").
A CPU engine prices every prefilled token into the step (no prefill rides free on a
decode, as it does on a GPU), so the lever the simulator finds on H100s is weaker
here; pick a load where the tight tenant alone meets its deadlines (`--coding 0`
runs it alone), or it is its own bottleneck and no scheduling can help it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from saga_server.serve_child import free_port

from benchmarks.harness.deadline_tenants import replay_tasks
from benchmarks.harness.replay import TokenSource
from benchmarks.harness.results import write_results
from benchmarks.harness.serve import run_threads, start_server

MODES = {"no-saga": (False, []), "priority": (False, ["--scheduling-policy", "priority"]), "saga": (True, [])}
PRIORITY = {"browser": 0, "coding": 1}  # vLLM: lower runs sooner


@dataclass
class Call:
    prompt: int  # tokens
    reused: int  # of them, the previous prompt plus answer (coding) or the history (browser)
    output: int
    tool_s: float  # after it (0 for the last)


@dataclass
class Session:
    sid: str
    tenant: str
    calls: list[Call]
    deadline_s: float = 0.0
    start: float = 0.0
    end: float = 0.0
    error: str = ""
    latencies: list[float] = field(default_factory=list)
    first_token_s: list[float] = field(default_factory=list)  # per call, from sending it


def sessions(n_coding: int, n_browser: int, seed: int) -> list[Session]:
    return [Session(f"{tenant}-{i}-{seed}", tenant,
                    [Call(st["prompt_tokens"], st["reused_prefix_tokens"], st["output_tokens"],
                          sum(t["duration_s"] for t in st["tools"])) for st in raw["steps"]])
            for tenant, raws in replay_tasks(n_coding, n_browser, seed).items() for i, raw in enumerate(raws)]


def measure_engine(server, tokens: TokenSource, repeats: int = 3) -> tuple[float, float]:
    """(prefill tokens per second, seconds per decode step) of a request alone, each
    the median of `repeats` measurements: every deadline is priced by them, and one
    measurement alone moves with whatever else the host runs."""
    rnd = random.Random(1)

    def timed(max_tokens: int) -> float:
        prompt = tokens.take(1000, rnd)  # a fresh prompt: no hit
        t0 = time.monotonic()
        server.post("/v1/completions", {"model": server.model, "prompt": prompt, "max_tokens": max_tokens,
                                        "ignore_eos": True, "temperature": 0.0})
        return time.monotonic() - t0

    timed(1)  # warm
    prefill = statistics.median(timed(1) for _ in range(repeats))
    whole = statistics.median(timed(33) for _ in range(repeats))
    return 1000 / prefill, max(whole - prefill, 1e-3) / 32


def unloaded_s(s: Session, prefill_rate: float, step_s: float) -> float:
    return sum((c.prompt - c.reused) / prefill_rate + c.output * step_s + c.tool_s for c in s.calls)


def time_lost(s: Session, prefill_rate: float, step_s: float) -> dict[str, float]:
    """Where a finished session's time beyond its unloaded time went, in seconds:
    `first_token` (its calls waited in the queue, or their prefill ran slower than
    alone), `decode` (their answers streamed slower than alone: longer steps) and
    `other` (tools, hints and the client: the rest)."""
    alone_first = sum((c.prompt - c.reused) / prefill_rate + step_s for c in s.calls)
    alone_decode = sum((c.output - 1) * step_s for c in s.calls)
    first = sum(s.first_token_s) - alone_first
    decode = sum(s.latencies) - sum(s.first_token_s) - alone_decode
    lost = (s.end - s.start) - unloaded_s(s, prefill_rate, step_s)
    return {"first_token": first, "decode": decode, "other": lost - first - decode}


def run_session(server, s: Session, tokens: TokenSource, hint_addr: str, priority: bool, seed: int,
                delay: float) -> None:
    from saga_sdk import HintClient

    rnd = random.Random(f"{seed}-{s.sid}")
    hints = HintClient(endpoint=hint_addr)
    time.sleep(delay)
    s.start = time.monotonic()
    try:
        hints.session_start(s.sid, tenant=s.tenant, workflow=s.tenant, deadline_s=s.deadline_s)
        prompt: list[int] = []
        for i, c in enumerate(s.calls):
            if s.tenant == "coding":  # append-only: the last prompt, its answer, the tool's output
                prompt = (prompt + tokens.take(max(1, c.prompt - len(prompt)), rnd)) if i else tokens.take(c.prompt, rnd)
            else:  # the history so far, then a fresh page
                history = prompt[:c.reused] if i else []
                prompt = history + tokens.take(c.prompt - len(history), rnd)
            hints.llm_call_start(s.sid, step=i)
            body = {"model": server.model, "prompt": prompt, "max_tokens": c.output, "ignore_eos": True,
                    "temperature": 0.0, "return_token_ids": True, "session_id": s.sid}
            if priority:
                body["priority"] = PRIORITY[s.tenant]
            out = server.stream_completion(body)
            if len(out.token_ids) != out.usage.get("completion_tokens"):  # the next prompt would lack it
                raise RuntimeError(f"streamed {len(out.token_ids)} answer tokens, usage says {out.usage}")
            s.first_token_s.append(out.first_token_s)
            s.latencies.append(out.total_s)
            hints.llm_call_end(s.sid, step=i, prompt_tokens=out.usage["prompt_tokens"],
                               output_tokens=out.usage["completion_tokens"])
            if s.tenant == "coding":
                prompt = prompt + out.token_ids
            if i + 1 < len(s.calls):
                name = "bash" if s.tenant == "coding" else "browser_action"
                hints.tool_call_start(s.sid, name, call_id=str(i), category="run" if s.tenant == "coding" else "other")
                time.sleep(c.tool_s)
                hints.tool_call_end(s.sid, name, call_id=str(i))
        s.end = time.monotonic()
        hints.session_end(s.sid)
    except Exception as exc:  # a failed session is reported, not counted as fast
        s.error = repr(exc)
        s.end = time.monotonic()
    finally:
        hints.close(2)


def _mean_split(lost: list[dict[str, float]]) -> dict[str, float]:
    """The mean of `time_lost` splits, part by part ({}: none)."""
    return {part: statistics.fmean(m[part] for m in lost) for part in lost[0]} if lost else {}


def mode_args(mode: str) -> tuple[bool, list[str]]:
    """(SAGA or stock, extra `saga serve` arguments) of a `--modes` entry."""
    if mode.startswith("saga-no-"):
        return True, ["--off", mode.removeprefix("saga-no-")]
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}: one of {sorted(MODES)} or saga-no-NAME")
    return MODES[mode]


def step_args(args) -> list[str]:
    """vLLM's per-step token budget, where the run sets one (every server alike)."""
    return ["--max-num-batched-tokens", str(args.max_num_batched_tokens)] if args.max_num_batched_tokens else []


def replay(mode: str, plan: list[Session], tokens: TokenSource, args, engine: tuple[float, float]) -> dict:
    """One mode's run of `plan`; `engine`: the probe's (prefill tokens/s, decode step s)."""
    saga, extra = mode_args(mode)
    vllm_args = ["--num-gpu-blocks-override", str(args.kv_blocks), "--max-num-seqs", str(args.max_num_seqs),
                 *step_args(args), *extra]
    server = start_server(saga, vllm_args)
    hint_addr = server.hint_addr if saga else f"127.0.0.1:{free_port()}"  # stock: nobody listens
    runs = [Session(s.sid, s.tenant, s.calls, s.deadline_s) for s in plan]
    rnd = random.Random(args.seed)
    threads = [threading.Thread(target=run_session, args=(server, s, tokens, hint_addr, mode == "priority",
                                                          args.seed, rnd.uniform(0, args.stagger_s)))
               for s in runs]
    t0 = time.monotonic()
    try:
        run_threads(threads)
    finally:
        server.stop()
    wall = time.monotonic() - t0
    row: dict = {"mode": mode, "wall_s": wall, "errors": [s.error for s in runs if s.error], "tenants": {}}
    met_all = 0
    for tenant in ("coding", "browser"):
        mine = [s for s in runs if s.tenant == tenant and not s.error]
        tct = [s.end - s.start for s in mine]
        met = sum(t <= s.deadline_s for t, s in zip(tct, mine))
        met_all += met
        lost = [time_lost(s, *engine) for s in mine]
        missed = [m for m, t, s in zip(lost, tct, mine) if t > s.deadline_s]
        row["tenants"][tenant] = {"sessions": len(mine), "within_deadline": met / len(mine) if mine else 0.0,
                                  "tct_mean_s": statistics.fmean(tct) if tct else float("nan"),
                                  "slack_used": statistics.fmean(t / s.deadline_s for t, s in zip(tct, mine))
                                  if mine else float("nan"),
                                  "time_lost_s": _mean_split(lost), "missed_time_lost_s": _mean_split(missed)}
    tct_all = [s.end - s.start for s in runs if not s.error]
    row["tct_mean_s"] = statistics.fmean(tct_all) if tct_all else float("nan")
    row["goodput_per_hour"] = met_all / wall * 3600
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coding", type=int, default=4, help="coding-agent sessions")
    p.add_argument("--browser", type=int, default=10, help="browser-agent sessions")
    p.add_argument("--coding-factor", type=float, default=4.0)
    p.add_argument("--browser-factor", type=float, default=2.0)
    p.add_argument("--kv-blocks", type=int, default=2000, help="KV cache in blocks (roomy: deadlines, not KV)")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per engine step, in every mode and the probe (default: vLLM's own)")
    p.add_argument("--stagger-s", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="no-saga,priority,saga",
                   help=f"comma-separated, of {sorted(MODES)} and saga-no-NAME (SAGA with NAME off)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    modes = args.modes.split(",")
    for mode in modes:
        mode_args(mode)  # a misspelt mode fails now, not after the probe
    from saga_server.serve.model import ensure_default_model

    tokens = TokenSource(str(ensure_default_model()), args.seed)
    plan = sessions(args.coding, args.browser, args.seed)
    probe = start_server(False, ["--num-gpu-blocks-override", str(args.kv_blocks), *step_args(args)])
    try:
        rate, step_s = measure_engine(probe, tokens)
    finally:
        probe.stop()
    factor = {"coding": args.coding_factor, "browser": args.browser_factor}
    for s in plan:
        s.deadline_s = factor[s.tenant] * unloaded_s(s, rate, step_s)
    print(f"engine alone: prefill {rate:.0f} tokens/s, decode step {step_s * 1000:.1f} ms; "
          f"{len(plan)} sessions, deadlines {min(s.deadline_s for s in plan):.1f}-"
          f"{max(s.deadline_s for s in plan):.1f} s", flush=True)
    results = []
    for mode in modes:
        row = replay(mode, plan, tokens, args, (rate, step_s))
        results.append(row)
        ten = row["tenants"]
        print(f"{mode:>9}: coding {ten['coding']['within_deadline']:.0%} within deadline "
              f"(mean {ten['coding']['tct_mean_s']:.1f} s, slack used {ten['coding']['slack_used']:.2f}), "
              f"browser {ten['browser']['within_deadline']:.0%} (mean {ten['browser']['tct_mean_s']:.1f} s, "
              f"slack used {ten['browser']['slack_used']:.2f}); mean {row['tct_mean_s']:.1f} s, "
              f"goodput {row['goodput_per_hour']:.0f}/h, wall {row['wall_s']:.0f} s"
              + (f", {len(row['errors'])} errors" if row["errors"] else ""), flush=True)
        for tenant, t in ten.items():
            for which, lost in (("tasks", t["time_lost_s"]), ("missed tasks", t["missed_time_lost_s"])):
                if lost:
                    print(f"{'':>11}{tenant}'s {which} lost, each on average: {lost['first_token']:.1f} s "
                          f"to first tokens, {lost['decode']:.1f} s decoding, {lost['other']:.1f} s elsewhere",
                          flush=True)
    write_results(args.json, args, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
