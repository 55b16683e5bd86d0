"""Unchanged agents for the proxy tests, one per API, written as their SDKs' users
write them, and readers of the hints they caused (from the hint service's table)."""

from __future__ import annotations

import json
import re

SECRET = "sk-test-DO-NOT-LEAK-4242"
INSTRUCTIONS = "You are an airline agent."
RESPONSES_TOOLS = [{"type": "function", "name": name, "description": f"{name} tool",
                    "parameters": {"type": "object", "properties": {}}} for name in ("get_user", "search", "book")]
MESSAGES_TOOLS = [{"name": name, "description": f"{name} tool", "input_schema": {"type": "object", "properties": {}}}
                  for name in ("get_user", "search", "book")]
OBSERVATION = "<returncode>0</returncode>\n<output>\nok\n</output>"
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def session_ids(upstream) -> list[str]:
    return [r["headers"].get("x-session-id") for r in upstream.app.state.requests]


def kinds(registry, sid) -> list[str]:
    return [h.kind for h in registry.session(sid).history]


def tool_events(registry, sid) -> list[tuple[str, str]]:
    return [(h.kind, h.detail) for h in registry.session(sid).history if h.kind.startswith("tool")]


def run_responses_agent(client, plan: str, *, stream: bool = False, store: bool = False) -> list:
    """A Responses-API tool loop (the OpenAI Agents SDK's shape): with `store` it
    sends only what is new and names the response it continues; without, it sends
    the whole history back, the output items as the SDK returned them. Returns the
    responses."""
    history: list = [{"role": "user", "content": f"plan: {plan}"}]
    new, previous, responses = list(history), None, []
    for _ in range(10):
        kw = {"previous_response_id": previous} if store and previous else {}
        call = client.responses.create(model="m", instructions=INSTRUCTIONS, tools=RESPONSES_TOOLS, store=store,
                                       input=new if store else history, stream=stream, **kw)
        response = next(e.response for e in call if e.type == "response.completed") if stream else call
        responses.append(response)
        output = [item.model_dump(exclude_unset=True) for item in response.output]
        results = [{"type": "function_call_output", "call_id": item["call_id"], "output": json.dumps({"ok": True})}
                   for item in output if item["type"] == "function_call"]
        if not results:
            return responses
        history += output + results
        new, previous = results, response.id
    raise AssertionError("agent did not finish")


def run_messages_agent(client, plan: str, *, stream: bool = False) -> list:
    """A Messages-API tool loop (a Claude-Code-style agent's shape): the answer's
    content blocks go back as they came, tool results in the next user message.
    Returns the answers."""
    messages: list = [{"role": "user", "content": f"plan: {plan}"}]
    answers = []
    for _ in range(10):
        kw = {"model": "m", "max_tokens": 256, "system": INSTRUCTIONS, "tools": MESSAGES_TOOLS, "messages": messages}
        if stream:
            with client.messages.stream(**kw) as events:
                answer = events.get_final_message()
        else:
            answer = client.messages.create(**kw)
        answers.append(answer)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_unset=True) for b in answer.content]})
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                   for b in answer.content if b.type == "tool_use"]
        if not results:
            return answers
        messages.append({"role": "user", "content": results})
    raise AssertionError("agent did not finish")


def run_text_agent(client, plan: str) -> list:
    """A chat agent whose tool calls are text (mini-swe-agent's shape): it runs the
    fenced bash block of each answer, sends back its output as the next user
    message, and stops at the submit marker. Returns the messages."""
    messages: list = [{"role": "system", "content": "You are a coding agent. Reply with one ```bash block."},
                      {"role": "user", "content": f"plan: {plan}"}]
    for _ in range(10):
        text = client.chat.completions.create(model="m", messages=messages).choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        action = re.search(r"```bash\n(.*?)\n```", text, re.DOTALL)
        if action is None or SUBMIT in action.group(1):
            return messages
        messages.append({"role": "user", "content": OBSERVATION})
    raise AssertionError("agent did not finish")
