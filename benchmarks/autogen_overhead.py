"""What the AutoGen integration adds to each model call and each tool call.

    python -m benchmarks.autogen_overhead [--calls 20000] [--rounds 7]

Measures, inside one asyncio loop, the same awaited call with and without SAGA:
  * model call: `inner.create(...)` vs `SagaChatCompletionClient(inner).create(...)`
    inside a session (llm_call_start/end hints, step counter, node lookup, and the
    `extra_body` merge that carries the session id);
  * tool call: `FunctionTool.run_json` before and after `instrument()` inside a session;
each with the hint service up (a real gRPC service on loopback) and down (nothing
listening), and outside any session (hooks resolve nothing and pass through).
`inner` is a stub `ChatCompletionClient` that returns a fixed result at once, so the
difference is the wrapper's own cost, not a model's. Each figure is the median over
`--rounds` rounds of the mean per call. Target (issue 7): <= 50 us per model call.
No agent runs here, so of the framework-overhead template (`benchmarks/harness/overhead.py`)
it takes the hint service only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from autogen_core import CancellationToken
from autogen_core.models import ChatCompletionClient, CreateResult, RequestUsage, UserMessage
from autogen_core.tools import FunctionTool

from saga_sdk import HintClient
from saga_sdk.integrations import autogen as saga_autogen
from saga_sdk.integrations.autogen import SagaChatCompletionClient
from saga_server.serve_child import free_port

from benchmarks.harness import overhead

MESSAGES = [UserMessage(content="hello", source="user")]
RESULT = CreateResult(finish_reason="stop", content="hi", usage=RequestUsage(prompt_tokens=12, completion_tokens=3),
                      cached=False)


class InstantClient(ChatCompletionClient):
    """Benchmark stub: answers at once. Has `_create_args` like OpenAI's client, so the
    `extra_body` merge runs exactly as it does for `OpenAIChatCompletionClient`."""

    _create_args = {"model": "stub", "extra_body": {"priority": 1}}

    async def create(self, messages, **kwargs):
        return RESULT

    def create_stream(self, messages, **kwargs):
        raise NotImplementedError

    async def close(self):
        pass

    def actual_usage(self):
        return RESULT.usage

    def total_usage(self):
        return RESULT.usage

    def count_tokens(self, messages, **kwargs):
        return 0

    def remaining_tokens(self, messages, **kwargs):
        return 0

    @property
    def capabilities(self):
        return {}

    @property
    def model_info(self):
        return {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
                "structured_output": False}


async def per_call_us(call, n: int, rounds: int) -> float:
    for _ in range(min(n, 1000)):  # warm up
        await call()
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            await call()
        means.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(means)


async def measure(hints: HintClient, n: int, rounds: int) -> dict[str, float]:
    inner = InstantClient()
    wrapped = SagaChatCompletionClient(inner, client=hints, carry_session="extra_body", node="bench")

    async def double(x: int) -> int:
        return 2 * x

    tool = FunctionTool(double, description="double")
    token = CancellationToken()
    out = {}
    out["model: plain"] = await per_call_us(lambda: inner.create(MESSAGES), n, rounds)
    out["model: wrapped, no session"] = await per_call_us(lambda: wrapped.create(MESSAGES), n, rounds)
    saga_autogen.uninstrument()
    out["tool: plain"] = await per_call_us(lambda: tool.run_json({"x": 2}, token, call_id="c"), n, rounds)
    saga_autogen.instrument()
    async with saga_autogen.session(client=hints, workflow="bench"):
        out["model: wrapped, in session"] = await per_call_us(lambda: wrapped.create(MESSAGES), n, rounds)
        counter = iter(range(10**9))
        out["tool: instrumented, in session"] = await per_call_us(
            lambda: tool.run_json({"x": 2}, token, call_id=f"c{next(counter)}"), n, rounds)
    saga_autogen.uninstrument()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    endpoint, stop_hints = overhead.start_hint_service(max_sessions=10)
    up = HintClient(endpoint=endpoint, queue_size=1_000_000)
    down = HintClient(endpoint=f"127.0.0.1:{free_port()}", rpc_timeout_s=0.2)
    try:
        results = {"up": asyncio.run(measure(up, args.calls, args.rounds)),
                   "down": asyncio.run(measure(down, args.calls, args.rounds))}
        up.flush(30)
        stats = up.stats()
    finally:
        up.close(timeout=2)
        down.close(timeout=0.2)
        stop_hints()

    print(f"AutoGen integration overhead, {args.calls} calls x {args.rounds} rounds, median of round means (us/call)")
    print(f"{'':34s}{'service up':>12s}{'service down':>14s}")
    for key in results["up"]:
        print(f"{key:34s}{results['up'][key]:12.2f}{results['down'][key]:14.2f}")
    for label in ("up", "down"):
        r = results[label]
        print(f"added per model call (service {label}): {r['model: wrapped, in session'] - r['model: plain']:.2f} us"
              f"  (target <= 50 us); per tool call: {r['tool: instrumented, in session'] - r['tool: plain']:.2f} us")
    print(f"hints delivered with the service up: sent={stats.sent} dropped_full={stats.dropped_full}")


if __name__ == "__main__":
    main()
