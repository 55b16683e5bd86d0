"""AutoGen agents whose runs become SAGA sessions: one `AssistantAgent` with real
tools, then a two-agent team, against `saga serve`.

    saga serve --fast-start &                    # prints its OpenAI URL and hint endpoint
    python examples/autogen_agent.py             # or: --base-url URL --hints HOST:PORT

The SAGA lines: the model client is wrapped once in `SagaChatCompletionClient`
(LLM-call hints, and the session id in every request body so the engine knows the
session), and each run goes through `saga_sdk.integrations.autogen.run`, which opens
the session (tenant, deadline, the team's participants and who speaks after whom),
hints every tool call, and ends the session however the run ends.

Two real tools, both `strict`: `read_file` (a file of a small local corpus, written to
a temporary directory on start) and `multiply`. The researcher may call tools twice
(`max_tool_iterations=2`), then hands its summary to the reviewer, which answers in
plain text; `MaxMessageTermination(3)` ends the team (task, researcher, reviewer).

Why the tool choice is forced: the default model, SmolLM2-135M-Instruct, never picks a
tool by itself (docs/CPU_ENGINE.md, trap 5), and `AssistantAgent` always asks with
`tool_choice="auto"`. `RequiredToolChoice` turns "auto" into "required" whenever tools
are offered, so each of the researcher's steps calls a tool (guided decoding makes the
call valid), and the tool-iteration limit ends its turn. `read_file` takes a file name
from an enum (a free string lets the small model ramble until `max_tokens`, and a
truncated call is no call). With a capable model, use
`OpenAIChatCompletionClient` directly and the agents behave the same on their own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Literal

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

from saga_sdk import HintClient, HintReader
from saga_sdk.integrations.autogen import SagaChatCompletionClient, run

CORPUS = {
    "saga.txt": "SAGA keeps an agent's KV cache while its tools run.",
    "numbers.txt": "The two numbers of the sample question are 6 and 7.",
}
MODEL_INFO = {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
              "structured_output": False}


class RequiredToolChoice(OpenAIChatCompletionClient):
    """`OpenAIChatCompletionClient` that asks for a tool whenever tools are offered
    and the caller left the choice to the model (see the module docstring)."""

    async def create(self, messages, *, tools=[], tool_choice="auto", **kwargs):
        forced = "required" if tools and tool_choice == "auto" else tool_choice
        return await super().create(messages, tools=tools, tool_choice=forced, **kwargs)

    def create_stream(self, messages, *, tools=[], tool_choice="auto", **kwargs):
        forced = "required" if tools and tool_choice == "auto" else tool_choice
        return super().create_stream(messages, tools=tools, tool_choice=forced, **kwargs)


def write_corpus(directory: Path) -> Path:
    for name, text in CORPUS.items():
        (directory / name).write_text(text)
    return directory


def make_tools(corpus: Path) -> list[FunctionTool]:
    def read_file(name: Literal["saga.txt", "numbers.txt"]) -> str:
        """Read one file of the corpus by name (saga.txt or numbers.txt)."""
        path = (corpus / Path(name).name)
        return path.read_text() if path.is_file() else f"no file named {name!r}; try one of {sorted(CORPUS)}"

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    return [FunctionTool(read_file, description=read_file.__doc__, strict=True),
            FunctionTool(multiply, description=multiply.__doc__, strict=True)]


def build_model_client(base_url: str, model: str, *, hints: HintClient | None = None,
                       max_tokens: int = 160) -> SagaChatCompletionClient:
    inner = RequiredToolChoice(model=model, base_url=base_url, api_key="unused", model_info=MODEL_INFO,
                               max_tokens=max_tokens, temperature=0.0)
    return SagaChatCompletionClient(inner, client=hints)


def build_agent(model_client, corpus: Path, *, max_tool_iterations: int = 2) -> AssistantAgent:
    return AssistantAgent("researcher", model_client=model_client, tools=make_tools(corpus),
                          max_tool_iterations=max_tool_iterations,
                          system_message="You answer questions using the tools. Be brief.")


def build_team(model_client, corpus: Path, *, runtime=None) -> RoundRobinGroupChat:
    """`runtime`: an AutoGen runtime started elsewhere (default: the team's own)."""
    reviewer = AssistantAgent("reviewer", model_client=model_client,
                              system_message="You check the researcher's answer in one short sentence.")
    return RoundRobinGroupChat([build_agent(model_client, corpus), reviewer],
                               termination_condition=MaxMessageTermination(3), name="research-team",
                               runtime=runtime)


def served_model(base_url: str) -> str:
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=10) as resp:
        return json.loads(resp.read())["data"][0]["id"]


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--hints", default=os.environ.get("SAGA_ENDPOINT", "127.0.0.1:50051"))
    parser.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    args = parser.parse_args(argv)

    hints = HintClient(endpoint=args.hints)
    model_client = build_model_client(args.base_url, args.model or served_model(args.base_url), hints=hints)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(Path(tmp))
        solo = await run(build_agent(model_client, corpus), task="What is 6 times 7?", client=hints,
                         tenant="example", deadline_s=120, session_id="autogen-example-agent")
        team = await run(build_team(model_client, corpus), task="Read numbers.txt and multiply its two numbers.",
                         client=hints, tenant="example", deadline_s=300, session_id="autogen-example-team")
    for title, result in (("agent", solo), ("team", team)):
        print(f"--- {title}: {result.stop_reason}")
        for message in result.messages:
            print(f"  [{message.source}] {type(message).__name__}: {str(message.content)[:100]}")
    hints.flush(5)
    with HintReader(args.hints) as reader:
        for sid in ("autogen-example-agent", "autogen-example-team"):
            state = reader.session(sid)
            print(f"{sid}: state={state.state} steps={state.steps} tool_calls={state.tool_calls}")
            print("  " + " ".join(f"{h.kind}:{h.detail}" if h.detail else h.kind for h in state.history))
    await model_client.close()
    hints.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
