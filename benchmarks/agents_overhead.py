"""What the OpenAI Agents SDK integration adds to each model call (a benchmark, not a test).

The same `Agent` (two function tools, `--turns` tool-calling turns and a final answer
per run) runs `--runs` times in each arm, interleaved so that drift hits all alike:
`Runner.run` alone, `Runner.run` with empty `RunHooks` (what the SDK itself spends
dispatching to any hooks), and `saga_sdk.integrations.openai_agents.run`. Hints go to a
real hint service on loopback. Reported:

- time per model call (run wall time / model calls per run), median per arm, and the
  differences (noisy: differences of medians). The SAGA arm's difference also holds
  the `HintClient`'s sender thread (it batches the hints and sends them over gRPC every
  flush interval), which competes for the CPU on a small machine; with `SAGA_ENABLED=0`
  the difference is within the noise;
- SAGA's own time per model call, measured inside the runs: the hook bodies (every
  hint of the run), the session's open and close and the OpenAI patch's tagging of the
  request, summed per run and divided by its model calls, without the noise of
  differencing. Target: <= 50 us per model call;
- the hook bodies of one model call in a tight loop (no run around them).

The model is a scripted OpenAI-compatible server on loopback, in a child process with
the hint service (it answers in a few ms: the *worst case* for the ratio; a real model
call takes 100-1000x longer). `--api responses` drives the SDK's Responses model instead of Chat Completions.

    PYTHONPATH=sdk:server python benchmarks/agents_overhead.py [--runs 30] [--turns 4] [--api chat]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_US_PER_CALL = 50.0


def _chat_server():
    spec = importlib.util.spec_from_file_location("saga_bench_chat_server", ROOT / "tests" / "support" /
                                                  "chat_server.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def serve_scripted(turns: int) -> None:
    """Child process: the scripted model server and the hint service (out of process, so
    that their threads do not compete with the measured agent for the GIL, as a real
    server's would not); prints their addresses."""
    from saga_server.core import SessionTable
    from saga_server.rpc import HintServer

    chat = _chat_server()

    def script(body):
        items = body.get("messages") or body.get("input") or []
        done = sum(1 for i in items if isinstance(i, dict) and (i.get("role") == "tool"
                                                               or i.get("type") == "function_call_output"))
        if done >= turns:
            return chat.text("done")
        return chat.tool_calls(("add" if done % 2 else "mul", {"a": done, "b": 2}))

    server = chat.ChatServer(script=script).start()
    hint_server = HintServer(SessionTable(max_sessions=100_000), "127.0.0.1:0").start()
    print(server.base_url, hint_server.endpoint, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()
    hint_server.close(grace=None)


class Timer:
    """Accumulates the time spent in the wrapped callables (its own ~0.1 us per call is
    counted too: an over- rather than under-estimate)."""

    def __init__(self) -> None:
        self.total = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - t0
        return timed


async def measure(args, base_url: str, endpoint: str) -> dict:
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunHooks, Runner, function_tool
    from openai import AsyncOpenAI

    from saga_sdk import HintClient
    from saga_sdk.integrations import openai as saga_openai
    from saga_sdk.integrations import openai_agents as saga_agents

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @function_tool
    def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    model_class = OpenAIResponsesModel if args.api == "responses" else OpenAIChatCompletionsModel
    agent = Agent(name="bench", instructions="Compute.", model=model_class(model="scripted", openai_client=client),
                  tools=[add, mul])
    hints = HintClient(endpoint=endpoint)
    saga_openai.instrument()  # on for every arm: outside a session it tags nothing, as without SAGA

    class TimedSession(saga_agents.SagaSession):
        """The integration's session with every SAGA step timed: open, close, each hook body."""

        def __init__(self, *a, timer: Timer, **kw) -> None:
            super().__init__(*a, **kw)
            self.open, self.close = timer.wrap(self.open), timer.wrap(self.close)
            for name in ("_llm_start", "_llm_end", "_tool_start", "_tool_end"):
                setattr(self.hooks, name, timer.wrap(getattr(self.hooks, name)))

    tagged = saga_openai._tagged

    async def one(arm: str) -> tuple[float, int, float]:
        timer = Timer()
        t0 = time.perf_counter()
        if arm == "saga":
            saga_openai._tagged = timer.wrap(tagged)
            try:
                with TimedSession(agent, client=hints, timer=timer) as saga:
                    result = await Runner.run(agent, "go", hooks=saga.hooks)
            finally:
                saga_openai._tagged = tagged
        else:
            result = await Runner.run(agent, "go", hooks=RunHooks() if arm == "noop" else None)
        return time.perf_counter() - t0, len(result.raw_responses), timer.total

    arms = ("none", "noop", "saga")
    for arm in arms:
        await one(arm)  # warm up imports, connections, schemas
    per_call = {arm: [] for arm in arms}
    inside = []
    for _ in range(args.runs):
        for arm in arms:
            elapsed, calls, spent = await one(arm)
            per_call[arm].append(elapsed / calls)
            if arm == "saga":
                inside.append(spent / calls)
    loop_us = hook_loop_cost(saga_agents, hints, agent, add, args.loop)
    hints.flush(5)
    stats = hints.stats()
    hints.close()
    await client.close()
    return {"per_call": per_call, "inside": inside, "calls": calls, "stats": stats, "loop": loop_us}


def hook_loop_cost(saga_agents, hints, agent, tool, n: int) -> float:
    """us per model call's hook bodies (an LLM start and end, a tool start and end) in a
    tight loop inside one session: the code's own cost, without the run around it."""
    class Call:  # what the SDK passes: a run context, a tool context, a response
        tool_call_id = "call_1"
        usage = type("Usage", (), {"input_tokens": 10, "output_tokens": 5})()

    call = Call()
    with saga_agents.SagaSession(agent, client=hints, session_id="bench-loop") as saga:
        hooks = saga.hooks
        t0 = time.perf_counter()
        for _ in range(n):
            hooks._llm_start(call, agent)
            hooks._llm_end(call, call)
            hooks._tool_start(call, tool)
            hooks._tool_end(call, tool, 3)
        return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30, help="agent runs per arm")
    p.add_argument("--turns", type=int, default=4, help="tool-calling turns per run")
    p.add_argument("--api", choices=("chat", "responses"), default="chat")
    p.add_argument("--loop", type=int, default=2000, help="iterations of the tight hook loop "
                                                             "(4 hints each: stays under the queue bound)")
    p.add_argument("--serve-scripted", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_scripted is not None:
        serve_scripted(args.serve_scripted)
        return 0

    from agents import set_tracing_disabled

    set_tracing_disabled(True)  # no exporter thread competing with the measured runs
    child = subprocess.Popen([sys.executable, __file__, "--serve-scripted", str(args.turns)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        base_url, endpoint = child.stdout.readline().split()
        out = asyncio.run(measure(args, base_url, endpoint))
    finally:
        child.stdin.close()
        child.wait(timeout=10)

    med = statistics.median
    plain, noop, hinted = (med(out["per_call"][arm]) * 1e6 for arm in ("none", "noop", "saga"))
    inside = med(out["inside"]) * 1e6
    stats = out["stats"]
    print(f"model: scripted loopback server, {args.api} API (worst case: ~ms calls); {args.runs} runs per arm of "
          f"{out['calls']} model calls, interleaved; hints to a hint service on loopback")
    print(f"{'':36}{'median':>12}")
    print(f"{'per model call, Runner.run alone':36}{plain:>10.0f} us")
    print(f"{'per model call, empty RunHooks':36}{noop:>10.0f} us   ({(noop - plain) / plain * 100:+.2f}%: the SDK's "
          f"own cost of dispatching to any hooks)")
    print(f"{'per model call, SAGA run()':36}{hinted:>10.0f} us   ({(hinted - plain) / plain * 100:+.2f}% vs alone, "
          f"{(hinted - noop) / noop * 100:+.2f}% vs empty hooks; differences of medians: noisy)")
    print(f"{'SAGA time per model call (measured)':36}{inside:>10.1f} us   = {inside / plain * 100:.3f}% of a call "
          f"(target <= {TARGET_US_PER_CALL:g} us; hooks, session open/close, request tagging)")
    print(f"{'hook bodies per model call, loop':36}{out['loop']:>10.2f} us   (the same code in a tight loop: "
          f"what the measured figure adds is the run around it)")
    print(f"hints: sent {stats.sent}, dropped {stats.dropped_full + stats.dropped_stale + stats.dropped_failed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
