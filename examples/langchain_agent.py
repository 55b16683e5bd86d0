"""A LangChain `create_agent` ReAct agent whose runs become SAGA sessions.

    saga serve --fast-start &                      # prints its OpenAI URL and hint endpoint
    python examples/langchain_agent.py             # or: --base-url URL --hints HOST:PORT

Three real tools: `calculator` (arithmetic), `read_file` (reads a file from a small
local corpus, written to a temporary directory on start) and `final_answer`
(`return_direct`, it ends the run). The only SAGA line is the callback handler in the
run's config; it announces the session, each LLM step and tool call, the graph's
structure, and (through the OpenAI SDK patch) puts the session id on every request
`ChatOpenAI` makes, so the server keeps this session's KV cache while its tools run.
Setting `SAGA_LANGCHAIN=1` instead of passing the handler does the same.

Why the tool choice is forced: the default model, SmolLM2-135M-Instruct, never chooses
a tool by itself (see docs/CPU_ENGINE.md, trap 5). The `force_tools` middleware therefore asks
for a tool on every step (`tool_choice="required"`, with `strict` tool schemas so the
server's guided decoding yields valid calls), lets the model pick which, and on the last
step names `final_answer`, so the run always terminates. Every argument is bounded (an
enum of file names, `max_length` on strings): an unbounded string lets the small model
ramble until `max_tokens`, and a truncated call is no call. With a capable model, drop the
middleware and the agent behaves the same way on its own.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Annotated, Literal

from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import Field

from saga_sdk import HintClient, HintReader
from saga_sdk.integrations.langchain import SagaCallbackHandler, saga_tool_hint

CORPUS = {
    "saga.txt": "SAGA keeps an agent's KV cache while its tools run, and evicts the session "
                "whose next LLM call is predicted farthest away.",
    "vllm.txt": "vLLM serves OpenAI-compatible chat completions and reads a session id from "
                "the X-Session-ID header.",
    "numbers.txt": "The corpus has three files; the answer to the sample question is 42.",
}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.Mod: operator.mod}


def _evaluate(node: ast.AST) -> float:
    """Arithmetic only: numbers and + - * / ** %, never names or calls."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only arithmetic on numbers is allowed")


def make_tools(corpus_dir: Path):
    @tool
    def calculator(expression: Annotated[str, Field(max_length=40)]) -> str:
        """Evaluate an arithmetic expression such as "6 * 7" and return the result."""
        try:
            return str(_evaluate(ast.parse(expression, mode="eval")))
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
            return f"error: {exc}"  # the model reads the error and may try again

    @saga_tool_hint(expected_duration_s=0.05, category="io")
    @tool
    def read_file(name: Literal["saga.txt", "vllm.txt", "numbers.txt"]) -> str:
        """Read one file of the local corpus. Files: saga.txt, vllm.txt, numbers.txt."""
        path = (corpus_dir / Path(name).name)  # no path traversal out of the corpus
        if not path.is_file():
            return f"error: no file {name!r}; files: {', '.join(sorted(CORPUS))}"
        return path.read_text()

    @tool(return_direct=True)
    def final_answer(answer: Annotated[str, Field(max_length=80)]) -> str:
        """Give the final answer to the user and stop."""
        return answer

    return [calculator, read_file, final_answer]


def force_tools(max_steps: int):
    """Middleware: every step must call a tool; step `max_steps` must call final_answer."""
    @wrap_model_call
    def forced(request, handler):
        step = 1 + sum(isinstance(m, AIMessage) for m in request.messages)
        choice = {"type": "function", "function": {"name": "final_answer"}} if step >= max_steps else "required"
        return handler(request.override(tool_choice=choice, model_settings={**request.model_settings,
                                                                             "strict": True}))
    return forced


def build_agent(base_url: str, model_name: str, corpus_dir: Path, max_steps: int = 3):
    model = ChatOpenAI(model=model_name, base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"),
                       temperature=0, max_tokens=96, max_retries=1)
    return create_agent(model, make_tools(corpus_dir), middleware=[force_tools(max_steps)],
                        system_prompt="You answer questions using the tools. Use read_file to look things "
                                      "up, calculator for arithmetic, and final_answer to finish.")


def write_corpus(directory: Path) -> Path:
    for name, text in CORPUS.items():
        (directory / name).write_text(text)
    return directory


def served_model(base_url: str) -> str:
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=10) as resp:
        return json.load(resp)["data"][0]["id"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    p.add_argument("--hints", default=os.environ.get("SAGA_ENDPOINT", "127.0.0.1:50051"),
                   help="hint service host:port (saga serve prints it)")
    p.add_argument("--question", default="Read numbers.txt, then compute 6 * 7.")
    p.add_argument("--session", default="example-langchain-1")
    p.add_argument("--max-steps", type=int, default=3)
    args = p.parse_args(argv)

    hints = HintClient(endpoint=args.hints)
    with tempfile.TemporaryDirectory() as tmp:
        agent = build_agent(args.base_url, served_model(args.base_url), write_corpus(Path(tmp)), args.max_steps)
        result = agent.invoke(
            {"messages": [("user", args.question)]},
            config={"callbacks": [SagaCallbackHandler(hints, workflow="example-react")],
                    "configurable": {"thread_id": args.session}},
        )
    for message in result["messages"]:
        calls = [f"{c['name']}({json.dumps(c['args'])})" for c in getattr(message, "tool_calls", None) or ()]
        print(f"{type(message).__name__:>12}: {', '.join(calls) or str(message.content)[:200]}")
    hints.flush(2.0)
    try:
        state = HintReader(args.hints).session(args.session)
        print(f"SAGA saw session {args.session}: state={state.state} steps={state.steps} "
              f"tool_calls={state.tool_calls}")
    except Exception as exc:  # the agent ran either way; the readback is informational
        print(f"(could not read the session back from {args.hints}: {exc})", file=sys.stderr)
    hints.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
