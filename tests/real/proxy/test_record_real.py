"""`saga proxy --record` in front of a real `saga serve`: two tool-calling agents (one
streamed) become two saga-trace/1 tasks whose steps, token counts and tool gaps are those
the agents saw, with no prompt or answer text; `saga bench --what-if` replays the file.
SmolLM2 is steered deterministically: named tool choices with strict, bounded schemas,
temperature 0."""

from __future__ import annotations

import json
import time

import openai

from saga_sdk import HintClient
from saga_server.bench.cli import main as bench
from saga_server.bench.workload import load_trace
from saga_server.proxy import ProxyConfig, SagaProxy
from saga_server.proxy.recording import proxy_recorder
from saga_server.proxy.server import BackgroundServer
from tests.support.http import REQUEST_TIMEOUT_S

SCHEMA = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 24}}, "required": ["q"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} for the customer", "strict": True,
                                           "parameters": SCHEMA}} for name in ("get_user_details", "search_flights")]
PLANS = [(["get_user_details", "search_flights", None], (0.3, 0.6)), (["search_flights", None], (0.2,))]
MARKER = "PELICAN-4417"  # in the prompts and tool results; must not reach the file


def agent(client, model: str, n: int, plan, tool_s, stream: bool) -> list[dict]:
    """One tool loop; per call what the agent saw: usage, its own time, the gap to the next request."""
    messages = [{"role": "system", "content": f"You are an airline agent {MARKER}."},
                {"role": "user", "content": f"Customer {n}: help me book a flight. {MARKER}"}]
    seen = []
    for k, tool in enumerate(plan):
        kw = dict(model=model, messages=messages, tools=TOOLS, max_tokens=64, temperature=0, seed=n,
                  tool_choice={"type": "function", "function": {"name": tool}} if tool else "none")
        sent = time.monotonic()
        if seen:
            seen[-1]["gap"] = sent - seen[-1]["answered"]
        if stream:
            usage, calls, text = None, {}, []
            for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    text.append(choice.delta.content or "")
                    for tc in choice.delta.tool_calls or ():
                        slot = calls.setdefault(tc.index, {"id": "", "type": "function",
                                                           "function": {"name": "", "arguments": ""}})
                        slot["id"] = tc.id or slot["id"]
                        slot["function"]["name"] = (tc.function and tc.function.name) or slot["function"]["name"]
                        slot["function"]["arguments"] += (tc.function and tc.function.arguments) or ""
            message = {"role": "assistant", "content": "".join(text) or None}
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
            ids = [c["id"] for c in message.get("tool_calls", ())]
        else:
            r = client.chat.completions.create(**kw)
            usage, message = r.usage, r.choices[0].message
            ids = [c.id for c in message.tool_calls or ()]
        answered = time.monotonic()
        assert len(ids) == (1 if tool else 0)
        details = getattr(usage, "prompt_tokens_details", None)
        seen.append({"prompt": usage.prompt_tokens, "output": usage.completion_tokens,
                     "cached": getattr(details, "cached_tokens", None), "call": answered - sent,
                     "answered": answered})
        messages.append(message)
        if tool:
            time.sleep(tool_s[k])
            messages += [{"role": "tool", "tool_call_id": i, "content": json.dumps({"ok": tool, "m": MARKER})}
                         for i in ids]
    return seen


def test_two_recorded_agents_match_what_they_sent_and_replay(saga_server, tmp_path, capsys):
    path = tmp_path / "agents.jsonl"
    recorder = proxy_recorder(str(path))
    app = SagaProxy(ProxyConfig(upstream=saga_server.openai_url),
                    hints=HintClient(endpoint=saga_server.hint_addr, flush_interval_s=0.001), recorder=recorder)
    try:
        with BackgroundServer(app) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                                   timeout=REQUEST_TIMEOUT_S)
            seen = [agent(client, saga_server.model, n, plan, tool_s, stream=n == 1)
                    for n, (plan, tool_s) in enumerate(PLANS)]
    finally:
        app.hints.close(1)
        recorder.close()
    text = path.read_text()
    assert MARKER not in text and "airline" not in text and "Customer" not in text
    tasks = sorted(load_trace(path), key=lambda t: -len(t["steps"]))
    assert [len(t["steps"]) for t in tasks] == [len(s) for s in seen] == [3, 2]
    for task, calls in zip(tasks, seen):
        steps = task["steps"]
        assert [(s["prompt_tokens"], s["output_tokens"], s["provider_cached_tokens"]) for s in steps] == \
            [(c["prompt"], c["output"], c["cached"]) for c in calls]
        assert [s["reused_prefix_tokens"] for s in steps] == \
            [0] + [min(a["prompt"] + a["output"], b["prompt"]) for a, b in zip(calls, calls[1:])]
        for step, call in zip(steps, calls):
            assert 0 < step["llm_latency_s"] <= call["call"] + 0.05
            for tool in step["tools"]:
                assert abs(tool["duration_s"] - call["gap"]) < 0.05
        assert task["end_reason"] == "closed" and task["truncated"] is True
    out = tmp_path / "what-if"
    assert bench(["--what-if", str(path), "--workers", "1", "--kv-tokens", "4096", "--out", str(out),
                  "--no-plots", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("What would SAGA do for agents.jsonl?") and "SAGA (saga)" in printed
