"""Cost of the SAGA LangChain handler per agent step (a benchmark, not a test).

The same `create_agent` ReAct agent (two tools, `--turns` tool-calling turns and a final
answer per run) runs `--runs` times in each arm (no handler, a no-op handler,
`SagaCallbackHandler`), interleaved
so drift hits both alike. Hints go to a real hint service on loopback. Reported:

- step time (run wall time / LLM calls per run), median, with no handler, with a no-op
  handler (what LangChain itself spends dispatching callbacks to any handler) and with
  the SAGA handler (noisy: differences of medians);
- the handler's own time, measured inside the runs: every callback is timed, so
  "handler us per step" is the sum of callback bodies (and the OpenAI patch's tagging)
  per LLM step, without the noise of differencing. Targets: <= 1% of step time and
  <= 50 us per callback;
- the same callbacks in a tight loop (no agent around them): us per callback.

By default the model is the template's scripted server (`benchmarks/harness/overhead.py`;
a real model step takes 100-1000x longer than its ~1 ms). With `--base-url URL` (e.g. a
running `saga serve`) the example's agent runs against a real model instead, with forced
tool choice so it terminates.

    python -m benchmarks.langchain_overhead [--runs 30] [--turns 4]
    python -m benchmarks.langchain_overhead --base-url http://127.0.0.1:8000/v1 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from benchmarks.harness import overhead
from benchmarks.harness.overhead import Timer
from tests.support.examples import load_example

TARGET_PCT = 1.0
TARGET_US_PER_CALLBACK = 50.0
CALLBACKS = ("on_chain_start", "on_chain_end", "on_chain_error", "on_chat_model_start", "on_llm_start",
             "on_llm_end", "on_llm_error", "on_tool_start", "on_tool_end", "on_tool_error")


def timed_handler(handler, timer: Timer):
    """`handler` with each of its callbacks timed by `timer`."""
    for name in CALLBACKS:
        setattr(handler, name, timer.wrap(getattr(handler, name)))
    return handler


def tool_results(body: dict) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "tool")


def scripted_agent(base_url: str):
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="scripted", base_url=base_url, api_key="bench", max_retries=0)
    return create_agent(model, [tool(overhead.add), tool(overhead.mul)]), {"messages": [("user", "go")]}


def real_agent(base_url: str, corpus: Path):
    example = load_example("langchain_agent")
    agent = example.build_agent(base_url, example.served_model(base_url), example.write_corpus(corpus), max_steps=3)
    return agent, {"messages": [("user", "Read numbers.txt, then compute 6 * 7.")]}


def tagging_cost(n: int) -> float:
    """us per OpenAI-request tagging (the patch's merge) inside a session."""
    from saga_sdk import session_scope
    from saga_sdk.integrations import openai as saga_openai

    kwargs = {"model": "m", "messages": [], "extra_headers": {"X-Trace": "1"}}
    with session_scope("bench"):
        t0 = time.perf_counter()
        for _ in range(n):
            saga_openai._tagged(kwargs)
        return (time.perf_counter() - t0) / n * 1e6


def callback_loop_cost(client, n: int) -> float:
    """us per callback for one agent step's callbacks (chain/model/tool), no agent."""
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, LLMResult

    from saga_sdk.integrations.langchain import SagaCallbackHandler

    handler = SagaCallbackHandler(client, workflow="bench-loop", tag_requests=False)
    result = LLMResult(generations=[[ChatGeneration(message=AIMessage(
        "x", usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}))]])
    root = uuid.uuid4()
    handler.on_chain_start(None, {}, run_id=root, name="LangGraph", metadata={"thread_id": "loop"})
    ids = [(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()) for _ in range(n)]
    meta = {"langgraph_node": "model", "langgraph_step": 1}
    t0 = time.perf_counter()
    for i, (node_run, llm_run, tool_node_run, tool_run) in enumerate(ids):
        handler.on_chain_start(None, {}, run_id=node_run, parent_run_id=root, metadata=meta, name="model")
        handler.on_chat_model_start({}, [[]], run_id=llm_run, parent_run_id=node_run, metadata=meta,
                                    name="ChatOpenAI")
        handler.on_llm_end(result, run_id=llm_run, parent_run_id=node_run)
        handler.on_chain_end({}, run_id=node_run, parent_run_id=root)
        handler.on_chain_start(None, {}, run_id=tool_node_run, parent_run_id=root, metadata=meta, name="tools")
        handler.on_tool_start({"name": "add"}, "{}", run_id=tool_run, parent_run_id=tool_node_run,
                              metadata=meta, name="add", tool_call_id=f"call_{i}")
        handler.on_tool_end("3", run_id=tool_run, parent_run_id=tool_node_run)
        handler.on_chain_end({}, run_id=tool_node_run, parent_run_id=root)
    elapsed = time.perf_counter() - t0
    handler.on_chain_end({}, run_id=root)
    return elapsed / (8 * n) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    overhead.add_arguments(p, turns_help="tool-calling turns per run (scripted model)")
    p.add_argument("--base-url", default=None, help="a real OpenAI-compatible server (e.g. saga serve)")
    p.add_argument("--hints", default=None, help="hint service host:port (default: a local one)")
    args = p.parse_args(argv)
    if args.serve_scripted is not None:
        overhead.serve_scripted(overhead.tool_turns(args.serve_scripted, tool_results))
        return 0
    with ExitStack() as stack:
        return run(args, stack)


def run(args, stack: ExitStack) -> int:
    from langchain_core.callbacks import BaseCallbackHandler

    from saga_sdk import HintClient
    from saga_sdk.integrations.langchain import SagaCallbackHandler

    endpoint = args.hints
    if endpoint is None:
        endpoint, stop_hints = overhead.start_hint_service()
        stack.callback(stop_hints)
    client = HintClient(endpoint=endpoint)
    if args.base_url:
        agent, inputs = real_agent(args.base_url, Path(stack.enter_context(tempfile.TemporaryDirectory())))
        model_desc = f"real model at {args.base_url}"
    else:
        (base_url,) = stack.enter_context(overhead.scripted_model("benchmarks.langchain_overhead", args.turns))
        agent, inputs = scripted_agent(base_url)
        model_desc = "scripted loopback model (worst case: ~ms steps)"

    class NoopHandler(BaseCallbackHandler):
        run_inline = True  # same dispatch path as the SAGA handler, empty bodies

    def one(arm: str) -> tuple[float, int, Timer]:
        config: dict = {"configurable": {"thread_id": f"bench-{uuid.uuid4().hex[:8]}"}}
        timer = Timer()
        if arm == "saga":
            config["callbacks"] = [timed_handler(SagaCallbackHandler(client, workflow="bench"), timer)]
        elif arm == "noop":
            config["callbacks"] = [NoopHandler()]
        t0 = time.perf_counter()
        out = agent.invoke(inputs, config=config)
        elapsed = time.perf_counter() - t0
        return elapsed, sum(1 for m in out["messages"] if type(m).__name__ == "AIMessage"), timer

    runs = overhead.interleaved(args.runs, one)
    saga_runs = [(timer.durations, calls) for _, calls, timer in runs["saga"]]
    handler_step_us = [sum(durations) / calls * 1e6 for durations, calls in saga_runs]
    per_callback_us = [d * 1e6 for durations, _ in saga_runs for d in durations]
    callbacks_per_step = [len(durations) / calls for durations, calls in saga_runs]
    tag_us = tagging_cost(20000)
    loop_us = callback_loop_cost(client, args.loop)
    client.flush(5)
    stats = client.stats()
    client.close()

    med = statistics.median
    print(f"model: {model_desc}; {args.runs} runs per arm, interleaved; hints to {endpoint}")
    plain, _, _ = overhead.print_arms(
        {arm: [elapsed / calls for elapsed, calls, _ in rows] for arm, rows in runs.items()}, 34,
        ("step time, no handler", "step time, no-op handler", "step time, SAGA handler"),
        "LangChain's own cost of dispatching to any handler", ("none", "no-op"))
    inside = med(handler_step_us) + tag_us  # callbacks + the request tagging, per step
    print(f"{'handler time per step (measured)':34}{inside:>10.1f} us   = {inside / plain * 100:.3f}% of step "
          f"(target <= {TARGET_PCT:g}%; median over runs of the summed callback time, tail included)")
    print(f"{'callbacks per step':34}{med(callbacks_per_step):>10.1f}")
    q = statistics.quantiles(per_callback_us, n=10)
    print(f"{'us per callback, in agent runs':34}{med(per_callback_us):>10.2f} us   median (target <= "
          f"{TARGET_US_PER_CALLBACK:g} us); p90 {q[-1]:.1f}, mean {statistics.fmean(per_callback_us):.1f}, "
          f"max {max(per_callback_us):.0f} (the tail: the process descheduled or waiting for the GIL)")
    print(f"{'us per callback, tight loop':34}{loop_us:>10.2f} us")
    print(f"{'us per request tagging (patch)':34}{tag_us:>10.2f} us")
    print(overhead.hint_totals(stats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
