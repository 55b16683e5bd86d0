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

By default the model is a scripted OpenAI-compatible server on loopback (answers in
~1 ms: the *worst case* for the ratio, a real model step takes 100-1000x longer).
With `--base-url URL` (e.g. a running `saga serve`) the example's agent runs against
a real model instead, with forced tool choice so it terminates.

    PYTHONPATH=sdk:server python benchmarks/langchain_overhead.py [--runs 30] [--turns 4]
    PYTHONPATH=sdk:server python benchmarks/langchain_overhead.py --base-url http://127.0.0.1:8000/v1 --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TARGET_PCT = 1.0
TARGET_US_PER_CALLBACK = 50.0


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class TimedHandler:
    """Wraps a SagaCallbackHandler's callbacks with a perf_counter each (the wrapper's
    own cost, ~0.1 us, is counted too: an over- rather than under-estimate)."""

    CALLBACKS = ("on_chain_start", "on_chain_end", "on_chain_error", "on_chat_model_start", "on_llm_start",
                 "on_llm_end", "on_llm_error", "on_tool_start", "on_tool_end", "on_tool_error")

    def __init__(self, handler) -> None:
        self.handler, self.durations = handler, []
        for name in self.CALLBACKS:
            setattr(handler, name, self._timed(getattr(handler, name)))

    def _timed(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.durations.append(time.perf_counter() - t0)
        return timed


def _script(turns: int):
    chat = _load("saga_bench_chat_server", ROOT / "tests" / "support" / "chat_server.py")

    def script(body):
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if done >= turns:
            return chat.text("done")
        return chat.tool_calls(("add" if done % 2 else "mul", {"a": done, "b": 2}))

    return chat, script


def serve_scripted(turns: int) -> None:
    """Child process: the scripted model server (out of process, so that its threads
    do not compete with the measured agent for the GIL, as a real server would not)."""
    chat, script = _script(turns)
    server = chat.ChatServer(script=script).start()
    print(server.base_url, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()


def scripted_agent(turns: int):
    import subprocess

    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool
    def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    child = subprocess.Popen([sys.executable, __file__, "--serve-scripted", str(turns)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    base_url = child.stdout.readline().strip()

    def stop() -> None:
        child.stdin.close()
        child.wait(timeout=10)

    model = ChatOpenAI(model="scripted", base_url=base_url, api_key="bench", max_retries=0)
    return create_agent(model, [add, mul]), {"messages": [("user", "go")]}, stop


def real_agent(base_url: str, corpus: Path):
    example = _load("saga_bench_example", ROOT / "examples" / "langchain_agent.py")
    agent = example.build_agent(base_url, example.served_model(base_url), example.write_corpus(corpus), max_steps=3)
    return agent, {"messages": [("user", "Read numbers.txt, then compute 6 * 7.")]}, lambda: None


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
    p.add_argument("--runs", type=int, default=30, help="agent runs per arm")
    p.add_argument("--turns", type=int, default=4, help="tool-calling turns per run (scripted model)")
    p.add_argument("--base-url", default=None, help="a real OpenAI-compatible server (e.g. saga serve)")
    p.add_argument("--hints", default=None, help="hint service host:port (default: a local one)")
    p.add_argument("--loop", type=int, default=2000, help="iterations of the tight callback loop "
                                                             "(4 hints each: stays under the queue bound)")
    p.add_argument("--serve-scripted", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_scripted is not None:
        serve_scripted(args.serve_scripted)
        return 0

    from saga_sdk import HintClient
    from saga_sdk.integrations.langchain import SagaCallbackHandler

    stop_hints = lambda: None  # noqa: E731
    endpoint = args.hints
    if endpoint is None:
        from saga_server.core import SessionTable
        from saga_server.rpc import HintServer

        hint_server = HintServer(SessionTable(max_sessions=100_000), "127.0.0.1:0").start()
        endpoint, stop_hints = hint_server.endpoint, lambda: hint_server.close(grace=None)
    client = HintClient(endpoint=endpoint)

    tmp = tempfile.TemporaryDirectory()
    if args.base_url:
        agent, inputs, stop = real_agent(args.base_url, Path(tmp.name))
        model_desc = f"real model at {args.base_url}"
    else:
        agent, inputs, stop = scripted_agent(args.turns)
        model_desc = "scripted loopback model (worst case: ~ms steps)"

    from langchain_core.callbacks import BaseCallbackHandler

    class NoopHandler(BaseCallbackHandler):
        run_inline = True  # same dispatch path as the SAGA handler, empty bodies

    def run(arm: str):
        config: dict = {"configurable": {"thread_id": f"bench-{uuid.uuid4().hex[:8]}"}}
        timed = None
        if arm == "saga":
            timed = TimedHandler(SagaCallbackHandler(client, workflow="bench"))
            config["callbacks"] = [timed.handler]
        elif arm == "noop":
            config["callbacks"] = [NoopHandler()]
        t0 = time.perf_counter()
        out = agent.invoke(inputs, config=config)
        elapsed = time.perf_counter() - t0
        llm_calls = sum(1 for m in out["messages"] if type(m).__name__ == "AIMessage")
        return elapsed, llm_calls, timed

    arms = ("none", "noop", "saga")
    for arm in arms:
        run(arm)  # warm up imports, connections, the structure walk
    step = {arm: [] for arm in arms}
    handler_step_us, per_callback_us, callbacks_per_step = [], [], []
    for _ in range(args.runs):
        for arm in arms:
            elapsed, calls, timed = run(arm)
            step[arm].append(elapsed / calls)
            if timed is not None:
                handler_step_us.append(sum(timed.durations) / calls * 1e6)
                per_callback_us.extend(d * 1e6 for d in timed.durations)
                callbacks_per_step.append(len(timed.durations) / calls)
    tag_us = tagging_cost(20000)
    loop_us = callback_loop_cost(client, args.loop)
    client.flush(5)
    stats = client.stats()
    client.close()
    stop()
    stop_hints()
    tmp.cleanup()

    med = statistics.median
    plain, noop, hinted = (med(step[arm]) * 1e6 for arm in arms)
    inside = med(handler_step_us) + tag_us  # callbacks + the request tagging, per step
    print(f"model: {model_desc}; {args.runs} runs per arm, interleaved; hints to {endpoint}")
    print(f"{'':34}{'median':>12}")
    print(f"{'step time, no handler':34}{plain:>10.0f} us")
    print(f"{'step time, no-op handler':34}{noop:>10.0f} us   ({(noop - plain) / plain * 100:+.2f}%: LangChain's "
          f"own cost of dispatching to any handler)")
    print(f"{'step time, SAGA handler':34}{hinted:>10.0f} us   ({(hinted - plain) / plain * 100:+.2f}% vs none, "
          f"{(hinted - noop) / noop * 100:+.2f}% vs no-op; differences of medians: noisy)")
    print(f"{'handler time per step (measured)':34}{inside:>10.1f} us   = {inside / plain * 100:.3f}% of step "
          f"(target <= {TARGET_PCT:g}%; median over runs of the summed callback time, tail included)")
    print(f"{'callbacks per step':34}{med(callbacks_per_step):>10.1f}")
    q = statistics.quantiles(per_callback_us, n=10)
    print(f"{'us per callback, in agent runs':34}{med(per_callback_us):>10.2f} us   median (target <= "
          f"{TARGET_US_PER_CALLBACK:g} us); p90 {q[-1]:.1f}, mean {statistics.fmean(per_callback_us):.1f}, "
          f"max {max(per_callback_us):.0f} (the tail: the process descheduled or waiting for the GIL)")
    print(f"{'us per callback, tight loop':34}{loop_us:>10.2f} us")
    print(f"{'us per request tagging (patch)':34}{tag_us:>10.2f} us")
    print(f"hints: sent {stats.sent}, dropped {stats.dropped_full + stats.dropped_stale + stats.dropped_failed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
