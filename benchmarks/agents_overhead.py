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

The model is the template's scripted server (`benchmarks/harness/overhead.py`), in a
child process with the hint service (a real model call takes 100-1000x longer than its
few ms). `--api responses` drives the SDK's Responses model instead of Chat Completions.

    python -m benchmarks.agents_overhead [--runs 30] [--turns 4] [--api chat]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from benchmarks.harness import overhead
from benchmarks.harness.overhead import Timer

TARGET_US_PER_CALL = 50.0


def tool_results(body: dict) -> int:
    """Tool results in a Chat Completions or a Responses request."""
    items = body.get("messages") or body.get("input") or []
    return sum(1 for i in items if isinstance(i, dict) and (i.get("role") == "tool"
                                                            or i.get("type") == "function_call_output"))


def measure(args, base_url: str, endpoint: str) -> dict:
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunHooks, Runner, function_tool
    from openai import AsyncOpenAI

    from saga_sdk import HintClient
    from saga_sdk.integrations import openai as saga_openai
    from saga_sdk.integrations import openai_agents as saga_agents

    add, mul = function_tool(overhead.add), function_tool(overhead.mul)
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

    loop = asyncio.new_event_loop()  # one loop for every run: the client's connections live on it
    try:
        runs = overhead.interleaved(args.runs, lambda arm: loop.run_until_complete(one(arm)))
        loop_us = hook_loop_cost(saga_agents, hints, agent, add, args.loop)
        hints.flush(5)
        stats = hints.stats()
        hints.close()
        loop.run_until_complete(client.close())
    finally:
        loop.close()
    return {"per_call": {arm: [elapsed / calls for elapsed, calls, _ in rows] for arm, rows in runs.items()},
            "inside": [spent / calls for _, calls, spent in runs["saga"]], "calls": runs["saga"][-1][1],
            "stats": stats, "loop": loop_us}


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
    overhead.add_arguments(p)
    p.add_argument("--api", choices=("chat", "responses"), default="chat")
    args = p.parse_args(argv)
    if args.serve_scripted is not None:
        overhead.serve_scripted(overhead.tool_turns(args.serve_scripted, tool_results), with_hints=True)
        return 0

    from agents import set_tracing_disabled

    set_tracing_disabled(True)  # no exporter thread competing with the measured runs
    with overhead.scripted_model("benchmarks.agents_overhead", args.turns) as (base_url, endpoint):
        out = measure(args, base_url, endpoint)

    inside = statistics.median(out["inside"]) * 1e6
    print(f"model: scripted loopback server, {args.api} API (worst case: ~ms calls); {args.runs} runs per arm of "
          f"{out['calls']} model calls, interleaved; hints to a hint service on loopback")
    plain, _, _ = overhead.print_arms(
        out["per_call"], 36, ("per model call, Runner.run alone", "per model call, empty RunHooks",
                              "per model call, SAGA run()"),
        "the SDK's own cost of dispatching to any hooks", ("alone", "empty hooks"))
    print(f"{'SAGA time per model call (measured)':36}{inside:>10.1f} us   = {inside / plain * 100:.3f}% of a call "
          f"(target <= {TARGET_US_PER_CALL:g} us; hooks, session open/close, request tagging)")
    print(f"{'hook bodies per model call, loop':36}{out['loop']:>10.2f} us   (the same code in a tight loop: "
          f"what the measured figure adds is the run around it)")
    print(overhead.hint_totals(out["stats"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
