"""Standard-library HTTP helpers for tests that drive a real OpenAI-compatible server."""

from __future__ import annotations

import json
import socket
import urllib.request

__all__ = ["free_port", "post_chat"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_chat(chat_url: str, model: str, messages: list, *, session_id: str | None = None,
              timeout: float = 120, **body) -> dict:
    """POST a chat completion to `chat_url` (…/v1/chat/completions); returns the JSON.
    `session_id` goes in the `X-Session-ID` header, as an agent's SDK sends it."""
    payload = {"model": model, "messages": messages, **body}
    headers = {"Content-Type": "application/json"}
    if session_id:
        headers["X-Session-ID"] = session_id
    req = urllib.request.Request(chat_url, json.dumps(payload).encode(), headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())
