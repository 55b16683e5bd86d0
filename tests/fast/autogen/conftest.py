"""Fast-tier fixtures for the AutoGen integration: real AutoGen agents and teams,
a real gRPC hint service, and a scripted chat-completions endpoint.

`ScriptedChatServer` is the one fake here, at the seam that cannot run in the fast
tier (a model server): a small HTTP server speaking the OpenAI chat-completions
protocol (plain and streamed), answering from a script and recording every request
body. The real `OpenAIChatCompletionClient` talks to it over HTTP, so the tests see
exactly what AutoGen sent, and the agents' tool calls are deterministic.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest

from saga_sdk import HintClient
from saga_server.core.registry import SessionRegistry
from saga_server.rpc import HintServer

MODEL_INFO = {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
              "structured_output": False}


def text(content: str) -> dict:
    return {"content": content}


class ScriptedChatServer:
    """See the module docstring. `responder(body) -> reply` picks each answer;
    `requests` holds every request body, in arrival order."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.responder: Callable[[dict], dict] = lambda body: text("TERMINATE")
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # /v1/models
                self._json({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(body)
                    reply = server.responder(body)
                    n = next(server._ids)
                tool_calls = [{"id": f"call_{n}_{i}", "type": "function",
                               "function": {"name": name, "arguments": json.dumps(args)}}
                              for i, (name, args) in enumerate(reply.get("tool_calls", []))]
                usage = {"prompt_tokens": 10 * len(body["messages"]), "completion_tokens": 5,
                         "total_tokens": 10 * len(body["messages"]) + 5}
                finish = "tool_calls" if tool_calls else "stop"
                if body.get("stream"):
                    self._stream(n, body, reply.get("content"), tool_calls, finish, usage)
                    return
                message = {"role": "assistant", "content": reply.get("content")}
                if tool_calls:
                    message["tool_calls"] = tool_calls
                self._json({"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0,
                            "model": body["model"], "usage": usage,
                            "choices": [{"index": 0, "message": message, "finish_reason": finish}]})

            def _json(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, n, body, content, tool_calls, finish, usage) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0,
                        "model": body["model"]}
                chunks = []
                for word in (content or "").split(" ") if content else []:
                    chunks.append({"index": 0, "delta": {"role": "assistant", "content": word + " "},
                                   "finish_reason": None})
                for i, tc in enumerate(tool_calls):
                    chunks.append({"index": 0, "delta": {"tool_calls": [{"index": i, **tc}]}, "finish_reason": None})
                chunks.append({"index": 0, "delta": {}, "finish_reason": finish})
                for choice in chunks:
                    self._event({**base, "choices": [choice]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event({**base, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _event(self, payload: dict) -> None:
                self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def reset(self) -> None:
        """Forget recorded requests and restart answer numbering (call ids repeat)."""
        with self._lock:
            self.requests.clear()
            self._ids = itertools.count(1)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class RecordingRegistry(SessionRegistry):
    """The real registry, keeping every accepted event too (its history leaves out
    tool outcomes and call ids, which these tests check)."""

    def __init__(self) -> None:
        super().__init__(max_sessions=1000)
        self.events: list = []

    def accept(self, event) -> None:
        super().accept(event)
        self.events.append(event)

    def of(self, session_id: str) -> list:
        return [e for e in self.events if e.session_id == session_id]


@pytest.fixture
def chat_server():
    server = ScriptedChatServer()
    yield server
    server.close()


@pytest.fixture
def recorder():
    return RecordingRegistry()


@pytest.fixture
def hints(recorder):
    server = HintServer(recorder, "127.0.0.1:0").start()
    client = HintClient(endpoint=server.endpoint, flush_interval_s=0)
    yield client
    client.shutdown(timeout=1)
    server.stop(grace=None)


@pytest.fixture
def model_client(chat_server):
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    return OpenAIChatCompletionClient(model="scripted", base_url=chat_server.base_url, api_key="none",
                                      model_info=MODEL_INFO)


@pytest.fixture(autouse=True)
def _tools_instrumented():
    """Each test starts and ends with AutoGen's tool methods as AutoGen shipped them."""
    from saga_sdk.integrations import autogen as saga_autogen

    saga_autogen.uninstrument()
    yield
    saga_autogen.uninstrument()
