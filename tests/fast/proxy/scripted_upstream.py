"""A small, real OpenAI-compatible server that stands in for `saga serve` in the
fast tier (and in `benchmarks/proxy_latency.py`), where no vLLM runs.

It is a starlette app under uvicorn speaking the real wire formats of three
APIs: chat completions, the Responses API (`/v1/responses`, with a response
store for `previous_response_id`: as vLLM with `VLLM_ENABLE_RESPONSES_API_STORE`)
and the Anthropic Messages API (`/v1/messages`), each plain and SSE streaming,
text and tool calls, parallel ones included; `/v1/completions`, `/v1/models`,
errors on demand, and two helpers (`/set-cookie`, `/echo-headers`) for what a
proxy must not carry between callers. What it answers is scripted by the first
user message of the conversation:

    "plan: tools get_user,search | tools book | answer"

Step j of the conversation (j = answers so far) follows the j-th
`|`-separated item: `tools a,b` asks for those tool calls (in parallel),
`answer` replies with text, `act CMD` replies with text holding CMD as a fenced
bash block (an agent whose tool calls are text), `error 500` (any status) fails
with the API's JSON error, `break` sends two stream chunks and then drops the
connection, `gate` sends the first stream chunk and waits (up to 30 s) for the
`threading.Event` `app.state.gate` to be set; a trailing `linger` (e.g.
`tools a linger`) keeps the stream open for a second after its end. Chat usage
counts a message's characters / 4 + 1 tokens and reports all but the newest
message as cached (`prompt_tokens_details.cached_tokens`), as a prefix cache would.
Without a plan it acts like a real server's guided decoding: a named
`tool_choice` calls that function, `"required"` (Messages: `any`) calls the
first tool, anything else gets a text answer. Ids and timestamps derive from
the history only, so the same conversation gets byte-identical answers whether
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

    async def recorded(request: Request):
        """The request's JSON body, recorded; None if it is not JSON."""
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return None
        if record:
            app.state.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        return body

    async def chat(request: Request) -> Response:
        body = await recorded(request)
        if body is None:
            return _error(400, "could not parse the request body as JSON", "BadRequestError")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages: field required", "BadRequestError")
        step = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        action, linger, key, tools, text = _script(messages, step, body)
        if action.startswith("error"):
            status = _status(action)
            return _error(status, f"scripted failure {status}", "InternalServerError")
        calls = [{"id": f"call_{key}_{i}", "type": "function",
                  "function": {"name": name, "arguments": json.dumps({"step": step, "n": i})}}
                 for i, name in enumerate(tools)]
        sizes = [len(str(m.get("content") or "")) // 4 + 1 for m in messages if isinstance(m, dict)]
        # As a prefix cache would: all but the newest message was seen before.
        usage = {"prompt_tokens": sum(sizes), "completion_tokens": 7, "total_tokens": sum(sizes) + 7,
                 "prompt_tokens_details": {"cached_tokens": sum(sizes[:-1])}}
        if body.get("stream"):
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_stream(key, text, calls, action, usage if with_usage else None, linger),
                                     media_type="text/event-stream")
        message = {"role": "assistant", "content": text, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return JSONResponse({
            "id": f"chatcmpl-{key}", "object": "chat.completion", "created": CREATED, "model": MODEL,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": usage})

    async def completions(request: Request) -> Response:
        body = await recorded(request)
        if body is None:
            return _error(400, "could not parse the request body as JSON", "BadRequestError")
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "created": CREATED, "model": MODEL,
                             "choices": [{"index": 0, "text": " world", "finish_reason": "stop", "logprobs": None}],
                             "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}})

    async def _stream(key, text, calls, action, usage, linger=False):
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
                    "choices": [], "usage": usage}
            yield f"data: {json.dumps(tail)}\n\n".encode()
        yield b"data: [DONE]\n\n"
        if linger:
            await asyncio.sleep(1.0)

    async def responses(request: Request) -> Response:
        body = await recorded(request)
        if body is None:
            return _error(400, "could not parse the request body as JSON", "BadRequestError")
        raw = body.get("input")
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw if isinstance(raw, list) else None
        if not items:
            return _error(400, "input: field required", "BadRequestError")
        previous = body.get("previous_response_id")
        if previous is not None and previous not in app.state.stored:
            return _error(404, f"Response with id '{previous}' not found.", "NotFoundError")
        history = (app.state.stored[previous] if previous else []) + items
        step = _answers(history)
        action, linger, key, tools, text = _script(history, step, body)
        if action.startswith("error"):
            status = _status(action)
            return _error(status, f"scripted failure {status}", "InternalServerError")
        output = [{"type": "function_call", "id": f"fc_{key}_{i}", "call_id": f"call_{key}_{i}", "name": name,
                   "arguments": json.dumps({"step": step, "n": i}), "status": "completed"}
                  for i, name in enumerate(tools)]
        if text:
            output.append({"type": "message", "id": f"msg_{key}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": text, "annotations": []}]})
        tokens = len(json.dumps(history)) // 4
        response = {"id": f"resp_{key}", "object": "response", "created_at": CREATED, "model": MODEL,
                    "status": "completed", "output": output, "parallel_tool_calls": True,
                    "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
                    "usage": {"input_tokens": tokens, "output_tokens": 7, "total_tokens": tokens + 7,
                              "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens_details": {"reasoning_tokens": 0}}}
        if body.get("store", True):
            app.state.stored[response["id"]] = history + output
        if body.get("stream"):
            return StreamingResponse(_response_events(response, action, linger), media_type="text/event-stream")
        return JSONResponse(response)

    async def _response_events(response, action, linger):
        n = 0

        def event(kind, **data):
            nonlocal n
            n += 1
            return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': n - 1, **data})}\n\n".encode()

        start = {**response, "status": "in_progress", "output": [], "usage": None}
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        if action == "gate":
            await asyncio.to_thread(app.state.gate.wait, 30)
        if action == "break":
            yield event("response.output_text.delta", item_id="msg", output_index=0, content_index=0, delta="part")
            raise RuntimeError("scripted upstream breaks off the stream")
        for i, item in enumerate(response["output"]):
            yield event("response.output_item.added", output_index=i, item={**item, "status": "in_progress"})
            if item["type"] == "function_call":
                args = item["arguments"]
                for piece in (args[:len(args) // 2], args[len(args) // 2:]):
                    yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                                delta=piece)
            else:
                for word in item["content"][0]["text"].split(" "):
                    yield event("response.output_text.delta", item_id=item["id"], output_index=i,
                                content_index=0, delta=word + " ")
            yield event("response.output_item.done", output_index=i, item=item)
        yield event("response.completed", response=response)
        if linger:
            await asyncio.sleep(1.0)

    async def messages_api(request: Request) -> Response:
        body = await recorded(request)
        if body is None:
            return _anthropic_error(400, "could not parse the request body as JSON")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return _anthropic_error(400, "messages: field required")
        step = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        action, linger, key, tools, text = _script(messages, step, body)
        if action.startswith("error"):
            status = _status(action)
            return _anthropic_error(status, f"scripted failure {status}")
        content = [{"type": "tool_use", "id": f"toolu_{key}_{i}", "name": name, "input": {"step": step, "n": i}}
                   for i, name in enumerate(tools)]
        if text:
            content.insert(0, {"type": "text", "text": text})
        tokens = len(json.dumps(messages)) // 4
        message = {"id": f"msg_{key}", "type": "message", "role": "assistant", "model": MODEL, "content": content,
                   "stop_reason": "tool_use" if tools else "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": tokens, "output_tokens": 7}}
        if body.get("stream"):
            return StreamingResponse(_message_events(message, action, linger), media_type="text/event-stream")
        return JSONResponse(message)

    async def _message_events(message, action, linger):
        def event(kind, **data):
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

        usage = message["usage"]
        yield event("message_start", message={**message, "content": [], "stop_reason": None,
                                              "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1}})
        if action == "gate":
            await asyncio.to_thread(app.state.gate.wait, 30)
        if action == "break":
            yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
            raise RuntimeError("scripted upstream breaks off the stream")
        for i, block in enumerate(message["content"]):
            if block["type"] == "tool_use":
                yield event("content_block_start", index=i, content_block={**block, "input": {}})
                args = json.dumps(block["input"])
                for piece in (args[:len(args) // 2], args[len(args) // 2:]):
                    yield event("content_block_delta", index=i, delta={"type": "input_json_delta", "partial_json": piece})
            else:
                yield event("content_block_start", index=i, content_block={"type": "text", "text": ""})
                for word in block["text"].split(" "):
                    yield event("content_block_delta", index=i, delta={"type": "text_delta", "text": word + " "})
            yield event("content_block_stop", index=i)
        yield event("message_delta", delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
                    usage={"output_tokens": usage["output_tokens"]})
        yield event("message_stop")
        if linger:
            await asyncio.sleep(1.0)

    app = Starlette(routes=[
        Route("/v1/models", models),
        Route("/health", health),
        Route("/set-cookie", set_cookie),
        Route("/echo-headers", echo_headers),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages_api, methods=["POST"]),
    ])
    app.state.requests = []
    app.state.stored = {}
    app.state.gate = threading.Event()
    return app


def _first_user(history: list) -> str:
    """The text of the first user message (chat, Responses and Messages shapes)."""
    for m in history:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _script(history: list, step: int, body: dict) -> tuple[str, bool, str, list[str], str | None]:
    """What step `step` of this history does: its plan item (or, without a plan, the
    forced one), whether to linger, the history's key, the tools it calls and its text."""
    first_user, action = _first_user(history), _forced(body)
    if "plan:" in first_user:
        items = [s.strip() for s in first_user.split("plan:", 1)[1].split("|")]
        action = items[step] if step < len(items) else "answer"
    linger, action = action.endswith(" linger"), action.removesuffix(" linger")
    tools, text = [], f"done after {step} steps"
    if action.startswith("tools "):
        tools, text = [name.strip() for name in action.split(None, 1)[1].split(",")], None
    elif action.startswith("act "):
        text = f"THOUGHT: step {step}, I run a command.\n\n```bash\n{action[4:].strip()}\n```"
    return action, linger, _key(history), tools, text


def _answers(items: list) -> int:
    """Runs of assistant output (messages and function calls) in a Responses history."""
    answers, inside = 0, False
    for item in items:
        mine = isinstance(item, dict) and (item.get("type") == "function_call" or item.get("role") == "assistant")
        answers += mine and not inside
        inside = mine
    return answers


def _key(history: list) -> str:
    return hashlib.sha256(json.dumps(history, sort_keys=True).encode()).hexdigest()[:12]


def _status(action: str) -> int:
    return int(action.split()[1]) if len(action.split()) > 1 else 500


def _forced(body: dict) -> str:
    """Without a plan, do what a real server's guided decoding does: a named tool
    choice calls that tool (chat: `{"function": {"name"}}`, Responses: `{"type":
    "function", "name"}`, Messages: `{"type": "tool", "name"}`), "required"
    (Messages: `{"type": "any"}`) calls the first tool."""
    choice, tools = body.get("tool_choice"), body.get("tools") or []
    if isinstance(choice, dict):
        fn = choice.get("function")
        named = fn.get("name") if isinstance(fn, dict) else choice.get("name") if choice.get("type") in (
            "function", "tool") else None
        if named:
            return f"tools {named}"
    required = choice == "required" or isinstance(choice, dict) and choice.get("type") == "any"
    if required and tools and isinstance(tools[0], dict):
        fn = tools[0].get("function")
        return f"tools {(fn.get('name') if isinstance(fn, dict) else tools[0].get('name')) or 'unknown'}"
    return "answer"


def _anthropic_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": "api_error", "message": message}}, status_code=status)


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": kind, "param": None, "code": status},
                        status_code=status)
