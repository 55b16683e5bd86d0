"""Pinning, observable through the OpenAI API: SAGA vs stock vLLM in one run.

For each of `saga serve` and `saga serve --no-saga` (same vLLM flags, a KV cache
of --kv-blocks blocks of 32 tokens): measure time to ready and memory, send one
chat completion and one forced tool call, then

1. session A sends a ~--history-token prompt and gets its answer;
2. A announces a tool call (hint: `tool_call_start`, tool "pytest");
3. other sessions push --flood-factor x the KV capacity through the cache;
4. A's tool ends; A sends its next request (history + answer + tool output).

Printed: A's `usage.prompt_tokens_details.cached_tokens` on the resume, next to
its history length, for both servers, plus SAGA's pin counters from /metrics.

    .venv/bin/python -m benchmarks.serve_pinning_demo            # ~3 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import random
import sys
import time
import uuid

from benchmarks.harness.serve import start_server

WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud "
         "apple orange table chair window garden bridge tower engine signal vector matrix").split()

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}]


def words(n: int, seed: str) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n))


def chat(server, messages, session_id=None, **body):
    headers = {"X-Session-ID": session_id} if session_id else {}
    return server.post("/v1/chat/completions", {"model": server.model, "messages": messages, **body}, headers)


def run(saga: bool, args) -> dict:
    vllm_args = ["--num-gpu-blocks-override", str(args.kv_blocks), "--max-num-seqs", "8"]
    server = start_server(saga, vllm_args)
    res = {"mode": "saga" if saga else "no-saga", "ready_s": server.ready_s}
    try:
        from saga_sdk import HintClient
        from saga_server.serve.status import fetch_metrics

        t0 = time.monotonic()
        hello = chat(server, [{"role": "user", "content": "Say hello in five words."}], max_tokens=16)
        res["chat_s"] = time.monotonic() - t0
        res["chat_text"] = hello["choices"][0]["message"]["content"]
        tool = chat(server, [{"role": "user", "content": "What is the weather in Paris?"}], tools=TOOLS,
                    tool_choice="required", max_tokens=60)
        calls = tool["choices"][0]["message"].get("tool_calls") or []
        res["tool_call"] = (calls[0]["function"]["name"] + calls[0]["function"]["arguments"]) if calls else None
        res["rss_gb"] = server.rss_bytes() / 2**30

        hints = HintClient(endpoint=server.hint_addr)
        sid = f"A-{uuid.uuid4().hex[:6]}"
        hints.session_start(sid, tenant="demo", workflow="pinning-demo")
        messages = [{"role": "system", "content": f"Session {sid}. " + words(args.history, sid)},
                    {"role": "user", "content": "Run the tests."}]
        first = chat(server, messages, session_id=sid, max_tokens=24)
        history = first["usage"]["prompt_tokens"]
        hints.tool_call_start(sid, "pytest", call_id="t1", category="test")
        hints.flush(5)

        per = 900
        n = int(args.kv_blocks * 32 * args.flood_factor / per) + 1

        def flood(i):
            fid = f"flood-{i}-{uuid.uuid4().hex[:6]}"
            return chat(server, [{"role": "user", "content": f"Flood {fid}. " + words(per - 10, fid)}],
                        session_id=fid, max_tokens=4)["usage"]["prompt_tokens"]

        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(4) as pool:
            res["flood_tokens"] = sum(pool.map(flood, range(n)))
        res["flood_s"] = time.monotonic() - t0
        hints.tool_call_end(sid, "pytest", call_id="t1")
        hints.flush(5)
        messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"] or ""},
                     {"role": "user", "content": "Tool output: 3 passed. What next?"}]
        t0 = time.monotonic()
        second = chat(server, messages, session_id=sid, max_tokens=8)
        res["resume_s"] = time.monotonic() - t0
        res["history_tokens"] = history
        res["resume_prompt_tokens"] = second["usage"]["prompt_tokens"]
        res["resume_cached_tokens"] = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        hints.session_end(sid)
        hints.close(5)
        m = fetch_metrics(server.base_url)
        res["pins"] = {k: v for k, v in m.items() if k.startswith("saga_pins_total")}
    finally:
        server.stop()
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kv-blocks", type=int, default=192, help="KV cache size in blocks of 32 tokens")
    p.add_argument("--history", type=int, default=700, help="words in session A's history (~tokens)")
    p.add_argument("--flood-factor", type=float, default=1.5, help="flood volume / KV capacity")
    args = p.parse_args()
    results = [run(True, args), run(False, args)]
    print()
    print(f"KV cache: {args.kv_blocks} blocks x 32 = {args.kv_blocks * 32} tokens")
    keys = ["ready_s", "rss_gb", "chat_s", "chat_text", "tool_call", "flood_tokens", "flood_s", "history_tokens",
            "resume_prompt_tokens", "resume_cached_tokens", "resume_s", "pins"]
    print(f"{'':24} {'saga':>34} {'no-saga':>34}")
    for k in keys:
        a, b = results[0].get(k), results[1].get(k)
        fmt = (lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)[:34])
        print(f"{k:24} {fmt(a):>34} {fmt(b):>34}")
    s, n = results[0], results[1]
    print(f"\ncached share of A's history on resume: saga {s['resume_cached_tokens'] / s['history_tokens']:.2f}, "
          f"no-saga {n['resume_cached_tokens'] / n['history_tokens']:.2f}; resume latency ratio "
          f"{n['resume_s'] / max(s['resume_s'], 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
