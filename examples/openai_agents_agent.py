"""An OpenAI Agents SDK run that becomes one SAGA session: a booking agent with two
function tools hands off to a writer agent, against `saga serve`.

    saga serve --fast-start &                       # prints its OpenAI URL and hint endpoint
    python examples/openai_agents_agent.py          # or: --base-url URL --hints HOST:PORT [--api responses]

and, unchanged, through the proxy (which infers the tool calls from the protocol and
sends the hints; the session id the integration puts on each request names the session):

    saga proxy --upstream http://127.0.0.1:8000/v1 --port 8100 --hint-endpoint 127.0.0.1:50051 &
    saga run --proxy http://127.0.0.1:8100/v1 -- python examples/openai_agents_agent.py

The only SAGA line is `run(...)` from `saga_sdk.integrations.openai_agents`: it opens
the session (the agents, their tools and the handoff as declared structure), hints
every model call and tool call through the SDK's run hooks, puts the session id on
every model request, and ends the session however the run ends. `saga status` then
shows what the server learned.

The procedure: `booking` looks the customer up (`get_user_details`), searches flights
(`search_flights`), hands off to `writer`, which answers in one sentence: four model
calls, two tool calls, one handoff. Why it is forced: the default model,
SmolLM2-135M-Instruct, never picks a tool by itself (docs/CPU_ENGINE.md, trap 5), so
`booking` asks with `tool_choice="required"` (and `reset_tool_choice=False`, or the
SDK would drop back to "auto" after the first tool), and each tool, like the handoff,
is enabled only at its turn of the procedure (`is_enabled`, from the run's context):
the model is always offered exactly one choice. The argument schemas are strict and
bounded (`max_length`, `pattern`) so that guided decoding cannot ramble past
`max_tokens` and cut a tool call in half. With a capable model, drop the enablement
and the forced choice: the agents behave the same on their own.

`--api chat` (default) uses `OpenAIChatCompletionsModel`; `--api responses` the SDK's
`OpenAIResponsesModel` (for servers with the Responses API). Tracing is switched off:
the SDK would otherwise export traces to api.openai.com. The last line printed is a
one-line JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.request
from dataclasses import dataclass, field
from typing import Annotated

from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, Field

from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunContextWrapper,
                    function_tool, handoff, set_tracing_disabled)
from saga_sdk import HintClient
from saga_sdk.integrations.openai_agents import run

CUSTOMER = "I am mia_li_3668. Find me a flight from JFK to SFO on 2024-05-20."
PROCEDURE = ("get_user_details", "search_flights", "transfer_to_writer")


@dataclass
class Trip:
    """The run's context: the steps of the procedure done so far."""

    done: list[str] = field(default_factory=list)


def _at_turn(step: str):
    """`is_enabled` for `step`: true only when it is the procedure's first step not yet
    done (a step the model repeats is never skipped past)."""
    def enabled(ctx: RunContextWrapper[Trip], agent) -> bool:
        return next((s for s in PROCEDURE if s not in ctx.context.done), None) == step
    return enabled


@function_tool(strict_mode=True, is_enabled=_at_turn("get_user_details"))
def get_user_details(ctx: RunContextWrapper[Trip], user_id: Annotated[str, Field(max_length=24)]) -> str:
    """Look up a customer by user id."""
    ctx.context.done.append("get_user_details")
    return json.dumps({"user_id": user_id, "name": "Mia Li", "membership": "gold"})


@function_tool(strict_mode=True, is_enabled=_at_turn("search_flights"))
def search_flights(ctx: RunContextWrapper[Trip], origin: Annotated[str, Field(pattern="^[A-Z]{3}$")],
                   destination: Annotated[str, Field(pattern="^[A-Z]{3}$")],
                   date: Annotated[str, Field(pattern="^20[0-9]{2}-[0-9]{2}-[0-9]{2}$")]) -> str:
    """Search direct flights between two airports on a date."""
    ctx.context.done.append("search_flights")
    return json.dumps({"flights": [{"flight": "HAT001", "origin": origin, "destination": destination,
                                    "date": date, "price": 120}]})


class Handover(BaseModel):
    """What `booking` tells `writer`: the flight found. A handoff with no arguments
    would leave guided decoding an empty object, which the small model pads with
    whitespace up to `max_tokens`; one bounded field ends it."""

    model_config = ConfigDict(extra="forbid")
    flight: Annotated[str, Field(pattern="^[A-Z]{3}[0-9]{3}$")]


def _handed_off(ctx: RunContextWrapper[Trip], handover: Handover) -> None:
    ctx.context.done.append("transfer_to_writer")


def build_model(client: AsyncOpenAI, name: str, api: str = "chat"):
    if api == "responses":
        return OpenAIResponsesModel(model=name, openai_client=client)
    return OpenAIChatCompletionsModel(model=name, openai_client=client)


def build_agent(model, *, max_tokens: int = 96) -> Agent[Trip]:
    """The starting agent (`booking`), which hands off to `writer`."""
    settings = dict(temperature=0.0, max_tokens=max_tokens, extra_body={"seed": 0})
    writer = Agent[Trip](name="writer", model=model, model_settings=ModelSettings(**settings),
                         instructions="Tell the customer, in one sentence, which flight was found for them.")
    return Agent[Trip](
        name="booking", model=model,
        instructions="You are an airline booking agent. Use the tools, then hand off to the writer.",
        tools=[get_user_details, search_flights],
        handoffs=[handoff(writer, on_handoff=_handed_off, input_type=Handover, is_enabled=_at_turn("transfer_to_writer"))],
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, **settings),
        reset_tool_choice=False)


def served_model(base_url: str) -> str:
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=10) as resp:
        return json.loads(resp.read())["data"][0]["id"]


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--hints", default=os.environ.get("SAGA_ENDPOINT", "127.0.0.1:50051"))
    parser.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    parser.add_argument("--api", choices=("chat", "responses"), default="chat")
    parser.add_argument("--session-id", default="agents-example")
    args = parser.parse_args(argv)

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY") or "unused")
    model = build_model(client, args.model or served_model(args.base_url), args.api)
    hints = HintClient(endpoint=args.hints)
    trip = Trip()
    try:
        result = await run(build_agent(model), CUSTOMER, context=trip, client=hints, session_id=args.session_id,
                           tenant="example", deadline_s=300)
    finally:
        hints.close()
        await client.close()
    print(f"{result.last_agent.name}: {result.final_output!r}")
    print(json.dumps({"session": args.session_id, "llm_calls": len(result.raw_responses), "steps": trip.done,
                      "last_agent": result.last_agent.name}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
