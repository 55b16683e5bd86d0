"""A plain OpenAI-SDK tool-calling agent, with no SAGA code in it.

It helps an airline customer: looks the customer up, searches flights, then
answers. Its loop is the ordinary one (ask the model, run the tools it asks
for, send the results back, repeat). Which tool each step must use is fixed by
`tool_choice`, because the small model `saga serve` runs on CPU never picks a tool
by itself (see docs/CPU_ENGINE.md, trap 5); with a capable model, use "auto". The
argument schemas are bounded (`maxLength`, `pattern`) so that guided decoding
cannot ramble past `max_tokens` and cut a tool call in half.

Run it directly against any OpenAI-compatible server:
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=none python examples/openai_agent.py
and, unchanged, with SAGA (sessions and tool boundaries inferred by the proxy):
    saga proxy --upstream http://127.0.0.1:8000/v1 --port 8100 &
    saga run --proxy http://127.0.0.1:8100/v1 -- python examples/openai_agent.py

`AGENT_MODEL` names the model (default: the server's first), `AGENT_CUSTOMER`
the customer's message. The last line printed is a one-line JSON summary.
"""

from __future__ import annotations

import json
import os

from openai import OpenAI

TOOLS = [
    {"type": "function", "function": {
        "name": "get_user_details", "description": "Look up a customer by user id.", "strict": True,
        "parameters": {"type": "object", "properties": {"user_id": {"type": "string", "maxLength": 24}},
                       "required": ["user_id"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Search direct flights between two airports on a date.",
        "strict": True,
        "parameters": {"type": "object", "properties": {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                                        "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                                                        "date": {"type": "string",
                                                                 "pattern": "^20[0-9]{2}-[0-9]{2}-[0-9]{2}$"}},
                       "required": ["origin", "destination", "date"], "additionalProperties": False}}},
]
# The agent's procedure: one tool per step, then a final answer.
PROCEDURE = [{"type": "function", "function": {"name": "get_user_details"}},
             {"type": "function", "function": {"name": "search_flights"}},
             "none"]


def run_tool(name: str, arguments: str) -> dict:
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return {"error": "arguments were not JSON"}
    if name == "get_user_details":
        return {"user_id": args.get("user_id", "?"), "name": "Mia Li", "membership": "gold"}
    if name == "search_flights":
        return {"flights": [{"flight": "HAT001", "origin": args.get("origin", "JFK"),
                             "destination": args.get("destination", "SFO"), "price": 120}]}
    return {"error": f"unknown tool {name}"}


def main() -> int:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("AGENT_MODEL") or client.models.list().data[0].id
    messages = [
        {"role": "system", "content": "You are an airline agent. Use the tools, then answer briefly."},
        {"role": "user", "content": os.environ.get(
            "AGENT_CUSTOMER", "I am mia_li_3668. Find me a flight from JFK to SFO on 2024-05-20.")},
    ]
    tools_run = []
    for tool_choice in PROCEDURE:
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                  tool_choice=tool_choice, max_tokens=96, temperature=0)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            tools_run.append(call.function.name)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    answer = messages[-1].content if not isinstance(messages[-1], dict) else messages[-1].get("content")
    print(f"agent: {answer!r}")
    print(json.dumps({"llm_calls": sum(1 for m in messages if not isinstance(m, dict)), "tools": tools_run}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
