"""Standard-library HTTP helpers for tests that drive a real OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import urllib.request

__all__ = ["post_chat", "REQUEST_TIMEOUT_S"]

# One request to the real engine, sized for a busy 2-core machine without AVX-512
# (prefill ~200 tokens/s, shared with the other tests' traffic): generous, because a
# timeout here is a flaky test, never a finding.
REQUEST_TIMEOUT_S = float(os.environ.get("SAGA_TEST_REQUEST_TIMEOUT_S", "600"))


def post_chat(chat_url: str, model: str, messages: list, *, session_id: str | None = None,
              timeout: float = REQUEST_TIMEOUT_S, **body) -> dict:
    """POST a chat completion to `chat_url` (…/v1/chat/completions); returns the JSON.
    `session_id` goes in the `X-Session-ID` header, as an agent's SDK sends it.
    Greedy and seeded unless the body says otherwise: real-tier answers must not vary."""
    payload = {"model": model, "messages": messages, "temperature": 0.0, "seed": 0, **body}
    headers = {"Content-Type": "application/json"}
    if session_id:
        headers["X-Session-ID"] = session_id
    req = urllib.request.Request(chat_url, json.dumps(payload).encode(), headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())
