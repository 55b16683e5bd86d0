"""A scripted OpenAI-compatible model server on loopback (fast tier only).

This is the one fake in the fast tier, standing at a seam that cannot run quickly:
a real `saga serve` takes ~30 s to start, so the fast tests talk to this tiny HTTP
server instead. It speaks enough of the protocol for the *real* OpenAI SDK,
`langchain_openai.ChatOpenAI`, AutoGen's `OpenAIChatCompletionClient` and the OpenAI
Agents SDK's Chat Completions and Responses models (`POST /v1/chat/completions` and
`POST /v1/responses`, each plain or streamed as server-sent events, `/v1/completions`,
`GET /v1/models`) and records every request's headers and JSON body, so a test can
assert exactly what the client put on the wire. Replies come from a script: a
function of the request body (`messages` for chat, `instructions` and `input` items
for the Responses API) returning either text or tool calls, so the agent loop it
drives is deterministic even when requests arrive concurrently. Usage is 10 prompt
tokens per message (per input item) and 5 completion tokens.
The real tier (`tests/real/`) runs the same agents against a real `saga serve`.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

__all__ = ["ChatServer", "Recorded", "text", "tool_calls"]


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict


def text(content: str) -> dict:
    """A scripted assistant reply with plain text."""
    return {"content": content}


def tool_calls(*calls: tuple[str, dict]) -> dict:
    """A scripted assistant reply calling the given (tool name, arguments) pairs."""
    return {"tool_calls": list(calls)}


@dataclass
class ChatServer:
    """`script(body) -> reply` decides each chat answer (default: echo the last user
    text); it may be replaced between runs. `requests` holds every POST, in arrival
    order; answers are numbered in that order (tool call ids `call_<n>_<i>`, for
    chat and Responses alike).
    `keep_alive=False` closes each connection after its answer: needed when one
    async client is used under several `asyncio.run` loops, as a connection pooled
    under a closed loop cannot be reused."""

    script: Callable[[dict], dict] | None = None
    requests: list[Recorded] = field(default_factory=list)
    keep_alive: bool = True

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> "ChatServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def chat_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def chat_bodies(self) -> list[dict]:
        """The JSON bodies of the chat-completions requests, in arrival order."""
        return [r.body for r in self.chat_requests()]

    def model_requests(self) -> list[Recorded]:
        """The chat-completions and Responses requests, in arrival order."""
        with self._lock:
            return [r for r in self.requests if _scripted(r.path)]

    def reset(self) -> None:
        """Forget recorded requests and restart answer numbering (call ids repeat)."""
        with self._lock:
            self.requests.clear()
            self._ids = itertools.count(1)

    # -- protocol ----------------------------------------------------------------------

    def _record(self, path: str, headers: dict[str, str], body: dict) -> tuple[int, dict | None]:
        """Records the request; returns its answer number and, for chat and Responses, the
        script's reply."""
        with self._lock:
            self.requests.append(Recorded(path, headers, body))
            n = next(self._ids)
            if not _scripted(path):
                return n, None
            return n, (self.script or _echo)(body)

    @staticmethod
    def _completion(n: int, body: dict) -> dict:
        return {"id": f"cmpl-{n}", "object": "text_completion", "created": 0, "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    @staticmethod
    def _response(n: int, body: dict, scripted: dict) -> dict:
        """A Responses-API `response` object: the script's text as a message item,
        its tool calls as `function_call` items."""
        output: list[dict] = [{"type": "function_call", "id": f"fc_{n}_{i}", "call_id": f"call_{n}_{i}",
                               "name": name, "arguments": json.dumps(args), "status": "completed"}
                              for i, (name, args) in enumerate(scripted.get("tool_calls") or [])]
        if scripted.get("content") is not None:
            output.insert(0, {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": scripted["content"], "annotations": []}]})
        items = body.get("input")
        prompt = 10 * (len(items) if isinstance(items, list) else 1)
        return {"id": f"resp_{n}", "object": "response", "created_at": 0, "model": body.get("model", "scripted"),
                "status": "completed", "output": output, "parallel_tool_calls": False,
                "tool_choice": body.get("tool_choice", "auto"), "tools": [],
                "usage": {"input_tokens": prompt, "output_tokens": 5, "total_tokens": prompt + 5,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if not server.keep_alive:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model",
                                                                  "created": 0, "owned_by": "test"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "bad json"}})
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    n, scripted = server._record(self.path, headers, body)
                except Exception as exc:  # a broken script shows up as a server error
                    self._send(500, {"error": {"message": repr(exc)}})
                    return
                if scripted is None:
                    self._send(200, server._completion(n, body))
                elif self.path.endswith("/responses"):
                    self._responses(n, body, scripted)
                else:
                    self._chat(n, body, scripted)

            def _responses(self, n: int, body: dict, scripted: dict) -> None:
                response = server._response(n, body, scripted)
                if not body.get("stream"):
                    self._send(200, response)
                    return
                # The Responses stream: created, each output item added and done, completed.
                self._open_stream()
                events = [{"type": "response.created", "response": {**response, "status": "in_progress",
                                                                     "output": []}}]
                for i, item in enumerate(response["output"]):
                    events.append({"type": "response.output_item.added", "output_index": i, "item": item})
                    events.append({"type": "response.output_item.done", "output_index": i, "item": item})
                events.append({"type": "response.completed", "response": response})
                for seq, event in enumerate(events):
                    self.wfile.write(f"event: {event['type']}\n".encode())
                    self._event({**event, "sequence_number": seq})
                self.wfile.flush()

            def _chat(self, n: int, body: dict, scripted: dict) -> None:
                calls = [{"id": f"call_{n}_{i}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args)}}
                         for i, (name, args) in enumerate(scripted.get("tool_calls") or [])]
                content = scripted.get("content")
                finish = "tool_calls" if calls else "stop"
                prompt = 10 * len(body.get("messages") or [])
                usage = {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}
                if body.get("stream"):
                    self._stream(n, body, content, calls, finish, usage)
                    return
                message: dict = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = calls
                self._send(200, {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0,
                                 "model": body.get("model", "scripted"), "usage": usage,
                                 "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                              "logprobs": None}]})

            def _stream(self, n, body, content, calls, finish, usage) -> None:
                """Server-sent events: the content word by word, each tool call, the finish
                reason, usage if `stream_options.include_usage`, then [DONE]; the
                connection closes after (no Content-Length)."""
                self._open_stream()
                base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0,
                        "model": body.get("model", "scripted")}
                choices = [{"index": 0, "delta": {"role": "assistant", "content": word + " "}, "finish_reason": None}
                           for word in (content.split(" ") if content else [])]
                choices += [{"index": 0, "delta": {"tool_calls": [{"index": i, **call}]}, "finish_reason": None}
                            for i, call in enumerate(calls)]
                choices.append({"index": 0, "delta": {}, "finish_reason": finish})
                for choice in choices:
                    self._event({**base, "choices": [choice]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event({**base, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _open_stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()

            def _event(self, payload: dict) -> None:
                self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

        return Handler


def _scripted(path: str) -> bool:
    return path.endswith(("/chat/completions", "/responses"))


def _echo(body: dict) -> dict:
    items = body.get("messages") or body.get("input") or []
    if isinstance(items, str):
        return text(f"echo: {items}")
    users = [m for m in items if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return text(f"echo: {content if isinstance(content, str) else json.dumps(content)}")
