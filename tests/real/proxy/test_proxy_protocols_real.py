"""`saga proxy` in front of a real `saga serve` on its other agent APIs: a Responses-API
and an Anthropic-Messages-API tool loop (the real OpenAI and Anthropic SDKs), and a chat
agent whose tool calls are fenced shell blocks. Each becomes one session on the server
with every tool call and its end; follow-ups find their prefix cached; with the hint
service down the same loops still succeed. SmolLM2 is steered deterministically: named
tool choices with strict, bounded schemas, temperature 0, and for the text agent a
structured-output choice of the exact answer."""

from __future__ import annotations

import json

import openai
import pytest

from saga_sdk import HintReader
from saga_server.serve_child import free_port
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.proxies import start_proxy, stop_proxy

anthropic = pytest.importorskip("anthropic")

INSTRUCTIONS = "You are an airline agent. Use the tools."
PLAN = ["get_user_details", "search_flights", None]  # two forced tool calls, then a text answer
SCHEMA = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 24}}, "required": ["q"],
          "additionalProperties": False}
RESPONSES_TOOLS = [{"type": "function", "name": name, "description": f"{name} for the customer", "strict": True,
                    "parameters": SCHEMA} for name in PLAN if name]
MESSAGES_TOOLS = [{"name": name, "description": f"{name} for the customer", "strict": True, "input_schema": SCHEMA}
                  for name in PLAN if name]
TOOL_HISTORY = [("tool_call_start", "get_user_details"), ("tool_call_end", "get_user_details"),
                ("tool_call_start", "search_flights"), ("tool_call_end", "search_flights")]


@pytest.fixture(scope="module")
def proxy(saga_server):
    server = start_proxy(saga_server.openai_url, saga_server.hint_addr)
    yield server
    stop_proxy(server)


@pytest.fixture(scope="module")
def proxy_without_hints(saga_server):
    """The same proxy with its hint service unreachable."""
    server = start_proxy(saga_server.openai_url, f"127.0.0.1:{free_port()}")
    yield server
    stop_proxy(server, 0.1)


def responses_loop(url: str, model: str, customer: str) -> list:
    """The OpenAI Agents SDK's shape: the whole history resent (store off), output
    items as the SDK returned them. Returns the responses."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    history: list = [{"role": "user", "content": f"{customer}: find me a flight to Paris."}]
    responses = []
    for tool in PLAN:
        response = client.responses.create(
            model=model, instructions=INSTRUCTIONS, input=history, tools=RESPONSES_TOOLS, store=False,
            tool_choice={"type": "function", "name": tool} if tool else "none",
            temperature=0, max_output_tokens=64)
        responses.append(response)
        output = [item.model_dump(exclude_unset=True) for item in response.output]
        calls = [item for item in output if item["type"] == "function_call"]
        assert [c["name"] for c in calls] == ([tool] if tool else [])
        history += output + [{"type": "function_call_output", "call_id": c["call_id"], "output": json.dumps({"ok": tool})}
                             for c in calls]
    return responses


# The anthropic SDK (2.x) no longer takes `temperature` as an argument; the Messages API
# and vLLM still do, so it goes in the body.
GREEDY = {"temperature": 0}


def messages_loop(url: str, model: str, customer: str) -> list:
    """A Claude-Code-style agent's shape, streamed: content blocks back as they came,
    tool results in the next user message. Returns the answers."""
    client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    messages: list = [{"role": "user", "content": f"{customer}: find me a flight to Paris."}]
    answers = []
    for tool in PLAN:
        kw = {"tool_choice": {"type": "tool", "name": tool}} if tool else {"tool_choice": {"type": "none"}}
        with client.messages.stream(model=model, system=INSTRUCTIONS, messages=messages, tools=MESSAGES_TOOLS,
                                    max_tokens=64, extra_body=GREEDY, **kw) as stream:
            answer = stream.get_final_message()
        answers.append(answer)
        uses = [b for b in answer.content if b.type == "tool_use"]
        assert [b.name for b in uses] == ([tool] if tool else [])
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_unset=True) for b in answer.content]})
        if uses:
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id,
                                                          "content": json.dumps({"ok": tool})} for b in uses]})
    return answers


TEXT_ANSWERS = ["THOUGHT: list the files.\n\n```bash\nls -la\n```",
                "THOUGHT: run the tests.\n\n```bash\ncd repo && python -m pytest -q\n```",
                "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"]


def text_action_loop(url: str, model: str) -> list:
    """A mini-swe-agent-shaped chat agent: each answer a fenced bash block (forced to an
    exact text by a structured-output choice), each observation the next user message."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    messages = [{"role": "system", "content": "You are a coding agent. Reply with one ```bash block."},
                {"role": "user", "content": "Fix the failing test in repo/."}]
    completions = []
    for text in TEXT_ANSWERS:
        completion = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=48,
                                                    extra_body={"structured_outputs": {"choice": [text]}})
        completions.append(completion)
        assert completion.choices[0].message.content == text
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "<returncode>0</returncode>\n<output>\nok\n</output>"}]
    return completions


def one_new_session(saga_server, proxy, run):
    """Run an agent through the proxy: what it returned, and the one session it made,
    as the server's hint service has it (live or ended)."""
    reader = HintReader(saga_server.hint_addr)
    before = {s.session_id for s in reader.sessions(1000)}
    out = run()
    assert proxy.app.hints.flush(10)
    (state,) = [s for s in reader.sessions(1000) if s.session_id.startswith("px-") and s.session_id not in before]
    return out, state


def test_responses_tool_loop_is_one_session_and_hits_the_prefix_cache(saga_server, proxy):
    responses, state = one_new_session(saga_server, proxy,
                                       lambda: responses_loop(proxy.url, saga_server.model, "Customer R"))
    assert responses[-1].output_text
    assert all(r.usage.input_tokens_details.cached_tokens > 0 for r in responses[1:])
    assert state.steps == 3
    assert [(h.kind, h.detail) for h in state.history if h.kind.startswith("tool")] == TOOL_HISTORY


def test_messages_tool_loop_is_one_session_and_hits_the_prefix_cache(saga_server, proxy):
    answers, state = one_new_session(saga_server, proxy,
                                     lambda: messages_loop(proxy.url, saga_server.model, "Customer M"))
    assert any(b.type == "text" for b in answers[-1].content)
    assert all((a.usage.cache_read_input_tokens or 0) > 0 for a in answers[1:])
    assert state.steps == 3
    assert [(h.kind, h.detail) for h in state.history if h.kind.startswith("tool")] == TOOL_HISTORY


def test_text_action_loop_gets_its_tools_and_ends_at_the_submit_marker(saga_server, proxy):
    completions, state = one_new_session(saga_server, proxy, lambda: text_action_loop(proxy.url, saga_server.model))
    assert all(c.usage.prompt_tokens_details.cached_tokens > 0 for c in completions[1:])
    assert state.steps == 3 and state.state == "ended"
    assert [(h.kind, h.detail) for h in state.history if h.kind.startswith(("tool", "session_end"))] == [
        ("tool_call_start", "ls"), ("tool_call_end", "ls"), ("tool_call_start", "pytest"),
        ("tool_call_end", "pytest"), ("session_end", "completed")]


@pytest.mark.parametrize("loop", ["responses", "messages", "text"])
def test_the_loops_succeed_with_the_hint_service_down(saga_server, proxy_without_hints, loop):
    url, model = proxy_without_hints.url, saga_server.model
    run = {"responses": lambda: responses_loop(url, model, "Customer D"),
           "messages": lambda: messages_loop(url, model, "Customer D"),
           "text": lambda: text_action_loop(url, model)}[loop]
    started = proxy_without_hints.app.tracker.stats().sessions_started
    assert len(run()) == 3
    assert proxy_without_hints.app.tracker.stats().sessions_started == started + 1
    assert proxy_without_hints.app.hints.flush(0.5) is False  # the hints had nowhere to go
