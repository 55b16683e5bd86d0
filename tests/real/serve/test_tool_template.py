"""The served tool template replays an assistant turn exactly as the model wrote it.

An agent's next prompt is its previous prompt, the model's answer, then the new
turns. The prefix cache can serve the answer's KV only if the template renders the
replayed answer token for token as generated after the generation prompt. Rendering
goes through the server's own `/tokenize` (the template and tokenizer vLLM serves
with); answers are written in the form the model produces under vLLM's hermes
structural tag (`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.support.http import REQUEST_TIMEOUT_S

TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name} a file", "strict": True,
    "parameters": {"type": "object", "properties": {"name": {"type": "string", "enum": ["a.txt", "b.txt"]}},
                   "required": ["name"], "additionalProperties": False}}} for name in ("read_file", "stat_file")]
START = [{"role": "system", "content": "You read files with the tools."},
         {"role": "user", "content": "Read a.txt, then b.txt."}]


def tokenize(saga_server, messages, **body) -> list[int]:
    payload = {"model": saga_server.model, "messages": messages, "tools": TOOLS, **body}
    req = urllib.request.Request(saga_server.base_url + "/tokenize", json.dumps(payload).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        return json.loads(resp.read())["tokens"]


def detokenized_ids(saga_server, text: str) -> list[int]:
    """The ids of `text` alone, as the tokenizer splits it (no template, no specials added)."""
    payload = {"model": saga_server.model, "prompt": text, "add_special_tokens": False}
    req = urllib.request.Request(saga_server.base_url + "/tokenize", json.dumps(payload).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
        return json.loads(resp.read())["tokens"]


def call(i: int, name: str, arg: str) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps({"name": arg})}}


def generated(content: str, calls: list[dict]) -> str:
    """What the model writes after `<|im_start|>assistant\\n` for this turn."""
    text = content + "".join(f'<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": '
                             f'{c["function"]["arguments"]}}}\n</tool_call>' for c in calls)
    return text + "<|im_end|>"


@pytest.mark.parametrize("content, calls", [
    ("", [call(1, "read_file", "a.txt")]),
    ("", [call(1, "read_file", "a.txt"), call(2, "stat_file", "b.txt")]),
    ("Reading it now.\n", [call(1, "read_file", "a.txt")]),
    ("Both files are read.", []),
], ids=["one-call", "two-calls", "content-and-call", "plain-answer"])
def test_next_prompt_starts_with_the_prompt_plus_the_generated_answer(saga_server, content, calls):
    prompt = tokenize(saga_server, START)
    answer = detokenized_ids(saga_server, generated(content, calls))
    turn = {"role": "assistant", "content": content or None}
    if calls:
        turn["tool_calls"] = calls
    after = START + [turn] + [{"role": "tool", "tool_call_id": c["id"], "content": "text"} for c in calls]
    if not calls:
        after.append({"role": "user", "content": "Thanks."})
    following = tokenize(saga_server, after)
    assert following[:len(prompt) + len(answer)] == prompt + answer
