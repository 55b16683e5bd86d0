"""A small, real OpenAI-compatible server that stands in for `saga serve` in the
fast tier (and in `benchmarks/proxy_latency.py`), where no vLLM runs.

It is a starlette app under uvicorn speaking the real wire format: chat
completions (plain and SSE streaming, text and tool calls, parallel ones
included), `/v1/completions`, `/v1/models`, errors on demand, and two helpers (`/set-cookie`,
`/echo-headers`) for what a proxy must not carry between callers. What it answers
is scripted by the first user message of the conversation:

    "plan: tools get_user,search | tools book | answer"

Step j of the conversation (j = assistant messages so far) follows the j-th
`|`-separated item: `tools a,b` asks for those tool calls (in parallel),
`answer` replies with text, `error 500` (any status) fails with an OpenAI-style
JSON error, `break` sends two stream chunks and then drops the connection,
`gate` sends the first stream chunk and waits (up to 30 s) for the
`threading.Event` `app.state.gate` to be set; a trailing `linger` (e.g.
`tools a linger`) keeps the stream open for a second after `[DONE]`.
Without a plan it acts like a real server's guided decoding: a named
`tool_choice` calls that function, `"required"` calls the first tool, anything
else gets a text answer. Ids and timestamps derive from
the messages only, so the same conversation gets byte-identical answers whether
or not a proxy added a `session_id` on the way. Every request is recorded in
`app.state.requests` (method, path, headers, parsed body) unless `record=False`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "scripted-agent-model"
CREATED = 1_700_000_000


def build_app(*, record: bool = True) -> Starlette:
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "created": CREATED,
                                                           "owned_by": "saga-tests"}]})

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def set_cookie(request: Request) -> Response:
        response = PlainTextResponse("cookie set")
        response.set_cookie("upstream_affinity", request.query_params.get("who", "someone"))
        return response

    async def echo_headers(request: Request) -> Response:
        return JSONResponse(dict(request.headers))

    async def chat(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "could not parse the request body as JSON", "BadRequestError")
        if record:
            app.state.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages: field required", "BadRequestError")
        step = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        action = _plan(messages, step) or _forced(body)
        linger = action.endswith(" linger")  # keep the stream open a while after [DONE]
        action = action.removesuffix(" linger")
        key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:12]
        if action.startswith("error"):
            status = int(action.split()[1]) if len(action.split()) > 1 else 500
            return _error(status, f"scripted failure {status}", "InternalServerError")
        tools = action.split(None, 1)[1].split(",") if action.startswith("tools ") else []
        calls = [{"id": f"call_{key}_{i}", "type": "function",
                  "function": {"name": name.strip(), "arguments": json.dumps({"step": step, "n": i})}}
                 for i, name in enumerate(tools)]
        text = None if calls else f"done after {step} steps"
        prompt_tokens = sum(len(str(m.get("content") or "")) // 4 + 1 for m in messages if isinstance(m, dict))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_stream(key, text, calls, action, prompt_tokens, usage, linger),
                                     media_type="text/event-stream")
        message = {"role": "assistant", "content": text, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return JSONResponse({
            "id": f"chatcmpl-{key}", "object": "chat.completion", "created": CREATED, "model": MODEL,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7}})

    async def completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "could not parse the request body as JSON", "BadRequestError")
        if record:
            app.state.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "created": CREATED, "model": MODEL,
                             "choices": [{"index": 0, "text": " world", "finish_reason": "stop", "logprobs": None}],
                             "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}})

    async def _stream(key, text, calls, action, prompt_tokens, usage, linger=False):
        def event(delta, finish=None):
            chunk = {"id": f"chatcmpl-{key}", "object": "chat.completion.chunk", "created": CREATED, "model": MODEL,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return f"data: {json.dumps(chunk)}\n\n".encode()

        yield event({"role": "assistant", "content": ""})
        if action == "gate":
            await asyncio.to_thread(app.state.gate.wait, 30)
        if action == "break":
            yield event({"content": "partial "})
            raise RuntimeError("scripted upstream breaks off the stream")
        for i, call in enumerate(calls):
            args = call["function"]["arguments"]
            yield event({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                         "function": {"name": call["function"]["name"], "arguments": ""}}]})
            half = len(args) // 2
            for piece in (args[:half], args[half:]):
                yield event({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        if text:
            for word in text.split(" "):
                yield event({"content": word + " "})
        yield event({}, "tool_calls" if calls else "stop")
        if usage:
            tail = {"id": f"chatcmpl-{key}", "object": "chat.completion.chunk", "created": CREATED, "model": MODEL,
                    "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7,
                                             "total_tokens": prompt_tokens + 7}}
            yield f"data: {json.dumps(tail)}\n\n".encode()
        yield b"data: [DONE]\n\n"
        if linger:
            await asyncio.sleep(1.0)

    app = Starlette(routes=[
        Route("/v1/models", models),
        Route("/health", health),
        Route("/set-cookie", set_cookie),
        Route("/echo-headers", echo_headers),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ])
    app.state.requests = []
    app.state.gate = threading.Event()
    return app


def _plan(messages: list, step: int) -> str:
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user":
            content = str(m.get("content") or "")
            if "plan:" in content:
                items = [s.strip() for s in content.split("plan:", 1)[1].split("|")]
                return items[step] if step < len(items) else "answer"
            break
    return ""


def _forced(body: dict) -> str:
    """Without a plan, do what a real server's guided decoding does: a named
    `tool_choice` calls that function, "required" calls the first tool."""
    choice, tools = body.get("tool_choice"), body.get("tools") or []
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return f"tools {choice['function'].get('name', 'unknown')}"
    if choice == "required" and tools and isinstance(tools[0], dict):
        return f"tools {tools[0].get('function', {}).get('name', 'unknown')}"
    return "answer"


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": kind, "param": None, "code": status},
                        status_code=status)
