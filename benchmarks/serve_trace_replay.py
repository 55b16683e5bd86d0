"""Replay concurrent SWE-bench agent sessions against `saga serve` and `--no-saga`.

Sessions come from a saga-trace/1 file (default `$SAGA_TRACES/swe-mini-dev.jsonl`;
never copied into the repo). For each of --sessions tasks (the first ones with at
least --steps LLM calls, in file order after a seeded shuffle) the first --steps
calls are replayed:

- token counts are scaled per task so its largest replayed prompt is
  --target-prompt tokens (the model has a 4k context); output lengths are scaled
  by the same factor (clamped to [4, --max-output]) and forced with `ignore_eos`;
- prompts are real tokenizer output of English-like text and each one *extends*
  the session's previous prompt plus the answer the server actually returned
  (token ids from `return_token_ids`), then new text ("tool output") up to the
  scaled length, exactly like an agent's append-only history;
- between calls the session sleeps for the trace's tool durations (capped at
  --max-tool-s) and sends SAGA hints (session start/end, tool start/end with the
  trace's tool name and category), as an instrumented agent would. The stock
  server gets the same hints sent to a port nobody listens on (the client drops
  them without blocking), so the client side is identical.

Both servers run with the same vLLM flags and a KV cache of --kv-blocks blocks of
32 tokens, small enough that LRU evicts paused sessions. Modes (--modes): `saga`,
`saga-request-fcfs` (SAGA with request-level FCFS inside a tenant, i.e. without
task seniority: what the cache policies alone give) and `no-saga` (stock vLLM,
prefix caching on). Reported per mode: task
completion time (first request to last answer) mean, p90 and worst, the ratios
stock/SAGA, prefix-hit rate (cached / prompt tokens) and regen share (tokens
computed before and recomputed now / prompt tokens).

    .venv/bin/python benchmarks/serve_trace_replay.py                 # all three modes, ~13 min on 2 cores
    .venv/bin/python benchmarks/serve_trace_replay.py --modes saga,no-saga --json out.json --plot tct.png

Measured here (2 CPU cores; 8 sessions x 10 steps, KV 400 blocks, --max-num-seqs 2):

                       saga       saga-request-fcfs   no-saga
  task time mean       114.5 s    247.3 s             240.9 s    (one run, modes in this order)
  task time p90        169.8 s    260.5 s             254.1 s
  prefix-hit rate      0.864      0.577               0.145
  regen share          0.007      0.294               0.726
  -> no-saga / saga: mean 2.10x, p90 1.50x
  Second run, stock first: no-saga 247.7 / 261.0 s, saga 107.7 / 166.2 s (mean / p90):
  2.30x and 1.57x, the same hit rates. A third (no-saga, saga-request-fcfs) gave
  246.6 vs 200.9 s: 1.23x for the cache policies alone. A fourth, all three modes
  on a quieter machine: saga 91.4 / 136.6 s, worst task 146.7 s; saga-request-fcfs
  176.9 / 185.6 / 188.0 s; no-saga 216.9 / 230.4 / 232.5 s: 2.37x mean, 1.69x p90,
  and SAGA's last task finished before stock's first (--plot draws this).
  On a faster host (2026-12-02, with session admission, and a request held at the
  admission gate no longer protecting its session's KV): saga 63.5 / 86.9 s,
  saga-request-fcfs 98.4 / 113.5 s (hit rate 0.756), no-saga 231.5 / 244.4 s: 3.64x
  mean, and 2.35x without seniority (before the gate fix, an hour earlier:
  saga-request-fcfs 154.3 s, hit rate 0.623).

Before session admission, the cache policies alone (pins, WA-LRU, prefetch)
reached a 0.57 hit rate and 0.97-1.28x (0.97x in the first run above, 1.23x in the third and fourth,
1.26-1.28x in earlier ones: run-to-run noise on a shared machine is of that
order); ordering a tenant's requests by task seniority does the rest: tasks
finish in the order they began instead of all near the end, and the few tasks
being served keep their KV, so almost nothing is recomputed. Earlier variants,
without seniority: --max-num-seqs 4 gave hit rate 0.40 vs 0.21 and 1.47x in one
run, 0.90x in another under heavy outside load; a roomy KV (--kv-blocks 560) 0.77
vs 0.67 and 1.07x. On CPU one decoded token costs about as much as 15 prefilled
ones (on the trace's GPU hosts it is nearer 100), so saved prefill moves task time
less here than the hit rates suggest.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_common import free_port, pct, run_threads, start_server, write_results  # noqa: E402

from saga_server.bench.traces import trace_path  # noqa: E402

DEFAULT_TRACE = trace_path("swe-mini-dev.jsonl")
# Where a request's time goes inside the engine, as vLLM's request histograms split it.
PHASE_METRICS = {"queue": "vllm:request_queue_time_seconds", "prefill": "vllm:request_prefill_time_seconds",
                 "decode": "vllm:request_decode_time_seconds"}
WORDS = ("the a of to and in is that for it with as on be this by file test function error value return "
         "class def import self line code result output module path data list string number check run "
         "python pytest assert fix change update call method object type name config").split()


@dataclass
class Step:
    prompt_tokens: int
    output_tokens: int
    tools: list[tuple[str, str, float]]  # (name, category, seconds)


@dataclass
class Task:
    task_id: str  # unique in the replay: the trace repeats instances across runs
    steps: list[Step]


@dataclass
class SessionResult:
    task_id: str
    start: float = 0.0
    end: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    new_tokens: int = 0  # tokens never computed before (first prompt + each step's new text)
    step_latency: list[float] = field(default_factory=list)
    error: str = ""


def load_tasks(path: Path, n: int, steps: int, target_prompt: int, max_output: int, max_tool_s: float,
               seed: int) -> list[Task]:
    raw = [json.loads(line) for line in path.open()]
    random.Random(seed).shuffle(raw)
    tasks = []
    for t in raw:
        if len(t["steps"]) < steps:
            continue
        chosen = t["steps"][:steps]
        scale = target_prompt / max(s["prompt_tokens"] for s in chosen)
        out = []
        for s in chosen:
            tools = [(tl["name"], tl.get("category") or "", min(max_tool_s, tl["duration_s"] or 0.0))
                     for tl in s["tools"]]
            out.append(Step(max(8, int(s["prompt_tokens"] * scale)),
                            max(4, min(max_output, int(s["output_tokens"] * scale))), tools))
        tasks.append(Task(f"{t['task_id']}#{len(tasks)}", out))
        if len(tasks) == n:
            break
    if len(tasks) < n:
        raise SystemExit(f"only {len(tasks)} tasks in {path} have >= {steps} steps")
    return tasks


def add_workload_arguments(p, *, sessions: int = 8, steps: int = 10, target_prompt: int = 3000,
                           max_output: int = 48, max_tool_s: float = 20.0, kv_blocks: int = 400,
                           max_num_seqs: int = 2) -> None:
    """The replayed workload's options, shared by the benchmarks that replay it (each
    with its own defaults): trace, sessions, steps, scaling, KV pool, batch, stagger, seed."""
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--sessions", type=int, default=sessions)
    p.add_argument("--steps", type=int, default=steps, help="LLM calls replayed per session")
    p.add_argument("--target-prompt", type=int, default=target_prompt, help="largest scaled prompt of a session")
    p.add_argument("--max-output", type=int, default=max_output)
    p.add_argument("--max-tool-s", type=float, default=max_tool_s, help="cap on one tool's duration")
    p.add_argument("--kv-blocks", type=int, default=kv_blocks, help="KV cache in blocks of 32 tokens")
    p.add_argument("--max-num-seqs", type=int, default=max_num_seqs)
    p.add_argument("--stagger-s", type=float, default=3.0, help="sessions start uniformly within this window")
    p.add_argument("--seed", type=int, default=0)


def workload(args) -> tuple[list["Task"], "TokenSource"]:
    """The tasks and token source `add_workload_arguments` options describe."""
    from saga_server.serve.model import ensure_default_model

    tasks = load_tasks(args.trace, args.sessions, args.steps, args.target_prompt, args.max_output,
                       args.max_tool_s, args.seed)
    return tasks, TokenSource(str(ensure_default_model()), args.seed)


class TokenSource:
    """Real token ids of English-like text, sliced per session (deterministic)."""

    def __init__(self, model_dir: str, seed: int) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        rnd = random.Random(seed)
        text = " ".join(rnd.choice(WORDS) for _ in range(60000))
        self.ids = tok.encode(text, add_special_tokens=False)

    def take(self, n: int, rnd: random.Random) -> list[int]:
        start = rnd.randrange(0, len(self.ids) - n - 1)
        return self.ids[start:start + n]


def run_session(server, task: Task, tokens: TokenSource, hint_addr: str, seed: int, res: SessionResult,
                start_delay: float) -> None:
    from saga_sdk import HintClient

    rnd = random.Random(f"{seed}-{task.task_id}")
    sid = f"{task.task_id}-{seed}"
    hints = HintClient(endpoint=hint_addr)
    time.sleep(start_delay)
    res.start = time.monotonic()
    try:
        hints.session_start(sid, tenant="swe", workflow="mini-swe-agent")
        prompt: list[int] = []
        for i, step in enumerate(task.steps):
            if i == 0:
                # a session-unique header first, so sessions share nothing by accident
                prompt = tokens.take(8, rnd) + tokens.take(step.prompt_tokens - 8, rnd)
                res.new_tokens += len(prompt)
            else:
                grow = max(1, step.prompt_tokens - len(prompt))
                prompt = prompt + tokens.take(grow, rnd)
                res.new_tokens += grow
            hints.llm_call_start(sid, step=i)
            t0 = time.monotonic()
            out = server.post("/v1/completions", {
                "model": server.model, "prompt": prompt, "max_tokens": step.output_tokens,
                "ignore_eos": True, "temperature": 0.0, "return_token_ids": True, "session_id": sid})
            res.step_latency.append(time.monotonic() - t0)
            usage = out["usage"]
            res.prompt_tokens += usage["prompt_tokens"]
            res.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            answer = out["choices"][0].get("token_ids") or []
            hints.llm_call_end(sid, step=i, prompt_tokens=usage["prompt_tokens"],
                               output_tokens=usage["completion_tokens"])
            prompt = prompt + list(answer)
            res.new_tokens += 0  # the answer's KV was computed while decoding
            if i + 1 < len(task.steps):
                for n, (name, category, seconds) in enumerate(step.tools):
                    hints.tool_call_start(sid, name, call_id=f"{i}.{n}", category=category)
                    time.sleep(seconds)
                    hints.tool_call_end(sid, name, call_id=f"{i}.{n}")
        res.end = time.monotonic()
        hints.session_end(sid)
    except Exception as exc:  # recorded and reported; a failed session is not a fast one
        res.error = repr(exc)
        res.end = time.monotonic()
    finally:
        hints.close(2)


def start_delays(n: int, stagger_s: float, seed: int) -> list[float]:
    """When each session starts, seconds after the replay begins (seeded)."""
    rnd = random.Random(seed)
    return [rnd.uniform(0, stagger_s) for _ in range(n)]


def sent_workload(tasks: list[Task], delays: list[float]) -> list[dict]:
    """The sessions exactly as `run_session` sends them, as saga-trace/1 tasks: each
    prompt is the previous one, the answer (`ignore_eos`: exactly the output length)
    and the new text, so `reused_prefix_tokens` is the previous prompt plus answer;
    tools run after every step but the last; `start_s` is the session's start delay."""
    out = []
    for task, delay in zip(tasks, delays):
        steps, prompt, answer = [], 0, 0
        for i, step in enumerate(task.steps):
            reused = prompt + answer if i else 0
            prompt = step.prompt_tokens if i == 0 else reused + max(1, step.prompt_tokens - reused)
            answer = step.output_tokens
            tools = [{"name": n, "category": c, "duration_s": d} for n, c, d in step.tools] \
                if i + 1 < len(task.steps) else []
            steps.append({"prompt_tokens": prompt, "output_tokens": answer, "reused_prefix_tokens": reused,
                          "tools": tools})
        out.append({"format": "saga-trace/1", "source": "benchmarks/serve_trace_replay.py", "run": "replay",
                    "task_id": task.task_id, "shared_prefix_tokens": 0, "start_s": delay, "steps": steps})
    return out


# Modes: (SAGA on, its knobs, with a host KV tier). SAGA as shipped; SAGA with
# request-level FCFS inside a tenant (no task seniority: what the cache policies
# alone give); SAGA without session admission; stock vLLM; and each with a host KV
# tier of --tier-x pools (`--kv-offloading-size`: stock vLLM's is dropped LRU, SAGA's
# in its own order).
MODES = {"saga": (True, {}, False), "saga-request-fcfs": (True, {"SAGA_SENIORITY_WINDOW_S": "0"}, False),
         "saga-no-admit": (True, {"SAGA_ADMISSION": "0"}, False), "no-saga": (False, {}, False),
         "saga-tier": (True, {}, True), "saga-tier-no-admit": (True, {"SAGA_ADMISSION": "0"}, True),
         "no-saga-tier": (False, {}, True)}
BASELINES = ("no-saga", "no-saga-tier")
KV_BYTES_PER_TOKEN = 23_040  # SmolLM2-135M: 30 layers x K and V x 3 KV heads x 64 dims x 2 bytes


def replay(mode: str, tasks: list[Task], tokens: TokenSource, args) -> dict:
    saga, env, tier = MODES[mode]
    vllm_args = ["--num-gpu-blocks-override", str(args.kv_blocks), "--max-num-seqs", str(args.max_num_seqs)]
    if tier:
        vllm_args += ["--kv-offloading-size", f"{tier_gib(args):.4f}"]
    if saga and args.record:  # the engine writes what it saw (`saga serve --record`)
        args.record.mkdir(parents=True, exist_ok=True)
        vllm_args += ["--record", str(args.record / f"{mode}.jsonl")]
    server = start_server(saga, vllm_args, fast_start=not args.compiled, env=env)
    hint_addr = server.hint_addr if saga else f"127.0.0.1:{free_port()}"  # stock: nobody listens
    results = [SessionResult(t.task_id) for t in tasks]
    delays = start_delays(len(tasks), args.stagger_s, args.seed)
    threads = [threading.Thread(target=run_session, args=(server, t, tokens, hint_addr, args.seed, r, d))
               for t, r, d in zip(tasks, results, delays)]
    t0 = time.monotonic()
    try:
        run_threads(threads)
        metrics = {}
        try:
            import urllib.request  # noqa: PLC0415

            from saga_server.serve.status import parse_metrics  # noqa: PLC0415

            with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as resp:
                metrics = parse_metrics(resp.read().decode(), ("saga_pins", "saga_evicted", "saga_prefetches",
                                                               "saga_admission", "saga_plugin_seconds",
                                                               "vllm:prefix_cache", "vllm:iteration_tokens_total",
                                                               *PHASE_METRICS.values(), "vllm:e2e_request_latency",
                                                               "vllm:num_preemptions", "vllm:external_prefix_cache",
                                                               "vllm:kv_offload_load", "vllm:kv_offload_store",
                                                               "saga_kv_tier"))
        except Exception as exc:
            metrics = {"error": repr(exc)}
        rss = server.rss_bytes()
    finally:
        server.stop()
    wall = time.monotonic() - t0
    ok = [r for r in results if not r.error]
    tct = [r.end - r.start for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    new = sum(r.new_tokens for r in ok)
    return {
        "mode": mode, "sessions_ok": len(ok), "errors": [r.error for r in results if r.error],
        "tct_mean_s": statistics.fmean(tct) if tct else float("nan"), "tct_p90_s": pct(tct, 0.9),
        "tct_max_s": max(tct, default=float("nan")), "tct_s": sorted(tct),
        "step_latency_mean_s": statistics.fmean([x for r in ok for x in r.step_latency]) if ok else float("nan"),
        "prompt_tokens": prompt, "cached_tokens": cached, "hit_rate": cached / prompt if prompt else 0.0,
        "regen_share": max(0, prompt - cached - new) / prompt if prompt else 0.0,
        # of the cached tokens, those loaded from the host tier (vLLM counts them as cached)
        "tier_hit_share": metrics.get("vllm:external_prefix_cache_hits_total", 0.0) / prompt if prompt else 0.0,
        "wall_s": wall, "ready_s": server.ready_s, "rss_gb": rss / 2**30, "metrics": metrics,
    }


def tier_gib(args) -> float:
    """The *-tier modes' `--kv-offloading-size`: --tier-x pools of this model's KV."""
    return args.tier_x * args.kv_blocks * 32 * KV_BYTES_PER_TOKEN / 2**30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(p)
    p.add_argument("--tier-x", type=float, default=2.0,
                   help="host KV tier of the *-tier modes, in pools (--kv-blocks) of KV")
    p.add_argument("--modes", default="saga,saga-request-fcfs,no-saga", help=f"comma-separated, of {sorted(MODES)}")
    p.add_argument("--compiled", action="store_true", help="start without --enforce-eager")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--plot", type=Path, help="also draw each mode's task completion times here (PNG)")
    p.add_argument("--workload", type=Path,
                   help="also write the exact sessions sent (saga-trace/1, with start_s) here, for the simulator")
    p.add_argument("--record", type=Path, metavar="DIR",
                   help="SAGA modes' engines record what they saw (saga serve --record) as DIR/<mode>.jsonl; "
                        "benchmarks/record_roundtrip.py checks it against --workload")
    args = p.parse_args()

    tasks, tokens = workload(args)
    total_tool = sum(s for t in tasks for st in t.steps[:-1] for _, _, s in st.tools)
    print(f"{len(tasks)} sessions x {args.steps} steps from {args.trace.name}; KV {args.kv_blocks} blocks "
          f"({args.kv_blocks * 32} tokens); working set at the end "
          f"{sum(t.steps[-1].prompt_tokens for t in tasks)} tokens; tool time {total_tool:.0f} s in all", flush=True)
    if args.workload:
        with args.workload.open("w") as f:
            for line in sent_workload(tasks, start_delays(len(tasks), args.stagger_s, args.seed)):
                f.write(json.dumps(line) + "\n")
        print(f"wrote the workload to {args.workload}")
    out = []
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown modes {sorted(unknown)}; choose from {sorted(MODES)}")
    for mode in modes:
        print(f"-- {mode} ...", flush=True)
        r = replay(mode, tasks, tokens, args)
        print(json.dumps({k: v for k, v in r.items() if k not in ("metrics", "tct_s")}), flush=True)
        out.append(r)
    print()
    rows = ["tct_mean_s", "tct_p90_s", "tct_max_s", "step_latency_mean_s", "hit_rate", "tier_hit_share", "regen_share",
            "prompt_tokens",
            "cached_tokens", "wall_s", "ready_s", "rss_gb", "sessions_ok"]
    print(f"{'':22}" + "".join(f"{r['mode']:>19}" for r in out))
    for k in rows:
        print(f"{k:22}" + "".join(f"{r[k]:>19.3f}" if isinstance(r[k], float) else f"{r[k]:>19}" for r in out))
    by = {r["mode"]: r for r in out}
    for base in (b for b in BASELINES if b in by):
        n = by[base]
        print()
        for mode in (m for m in modes if m not in BASELINES):
            s = by[mode]
            print(f"task completion time, {base} / {mode}: mean {n['tct_mean_s'] / s['tct_mean_s']:.2f}x, "
                  f"p90 {n['tct_p90_s'] / s['tct_p90_s']:.2f}x; prefix+tier hit rate {s['hit_rate']:.3f} vs "
                  f"{n['hit_rate']:.3f}; regen share {s['regen_share']:.3f} vs {n['regen_share']:.3f}")
    for mode in modes:
        print(f"  {mode} metrics: {json.dumps(by[mode]['metrics'])}")
    write_results(args.json, args, out)
    if args.plot:
        plot_completion_times(out, args.plot)
        print(f"wrote {args.plot}")
    return 0


def plot_completion_times(results: list[dict], path: Path) -> None:
    """Each mode's task completion times as a step CDF (one PNG)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        times = r["tct_s"]
        ax.step(times, range(1, len(times) + 1), where="post", label=f"{r['mode']} (mean {r['tct_mean_s']:.0f} s)")
    ax.set_xlabel("task completion time (s)")
    ax.set_ylabel("tasks done within that time")
    ax.set_title("SWE sessions replayed on vLLM")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
