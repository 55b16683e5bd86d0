"""How much of each turn of a tool-calling loop the prefix cache serves (cached /
prompt tokens per turn), on a running `saga serve` with its default model.

An agent's prompt at turn N+1 is its prompt at turn N, the model's answer, and the
tool's result. The cache can serve the answer too only if the chat template replays
the answer token for token as the model generated it; this loop shows whether it
does. `reusable` is the previous prompt plus the previous answer, in whole blocks:
what a perfect cache could serve.

    saga serve --fast-start --port 8000 &
    python -m benchmarks.template_prefix_reuse --url http://127.0.0.1:8000 [--turns 8]

To compare with another template, start the server with `--chat-template FILE`
(it takes precedence over SAGA's) and run this again.
"""

from __future__ import annotations

import argparse
import json
import platform
import urllib.request
import uuid

from saga_server.host_cpu import cpu_flags

BLOCK = 32
FILES = ["a.txt", "b.txt", "c.txt"]
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read one file of the project.", "strict": True,
    "parameters": {"type": "object", "properties": {"name": {"type": "string", "enum": FILES}},
                   "required": ["name"], "additionalProperties": False}}}]


def post(url: str, body: dict, session_id: str) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "X-Session-ID": session_id})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


def simd_summary() -> str:
    """The flags this benchmark's figures depend on, or the processor's name where unknown."""
    flags = set(cpu_flags())
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or platform.processor()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--turns", type=int, default=8)
    args = ap.parse_args(argv)
    base = args.url.rstrip("/")
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as resp:
        model = json.loads(resp.read())["data"][0]["id"]
    sid = f"template-{uuid.uuid4().hex[:8]}"
    messages = [{"role": "system", "content": "You are a coding agent. Read the files you need with read_file."},
                {"role": "user", "content": f"Session {sid}: read every file of the project, one per step."}]
    print(f"cpu: {simd_summary()}  model: {model}  session: {sid}")
    print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'reusable':>8} {'cached/prompt':>13} {'cached/reusable':>15}")
    prev = None
    tot_prompt = tot_cached = tot_reusable = 0
    for turn in range(args.turns):
        out = post(base + "/v1/chat/completions",
                   {"model": model, "messages": messages, "tools": TOOLS, "tool_choice": "required",
                    "max_tokens": 64, "temperature": 0, "seed": 0}, sid)
        usage = out["usage"]
        prompt, cached = usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        reusable = (prev // BLOCK) * BLOCK if prev else 0
        if turn:
            tot_prompt, tot_cached, tot_reusable = tot_prompt + prompt, tot_cached + cached, tot_reusable + reusable
        print(f"{turn:>4} {prompt:>7} {cached:>7} {reusable:>8} {cached / prompt:>13.3f} "
              f"{(cached / reusable if reusable else float('nan')):>15.3f}")
        prev = prompt + usage["completion_tokens"]
        message = out["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
        for c in calls:
            name = json.loads(c["function"]["arguments"]).get("name", "?")
            messages.append({"role": "tool", "tool_call_id": c["id"],
                             "content": f"contents of {name} at turn {turn}: " + "x = x + 1\n" * 4})
    print(f"turns 1..{args.turns - 1}: cached/prompt {tot_cached / max(tot_prompt, 1):.3f}, "
          f"cached/reusable {tot_cached / max(tot_reusable, 1):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
