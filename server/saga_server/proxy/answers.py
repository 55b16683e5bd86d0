"""Read the assistant's answer back out of an upstream response, as it passes.

`JsonAnswer` takes a non-streamed chat-completion body; `SseAnswer` is fed the
raw bytes of a `text/event-stream` response chunk by chunk (after each chunk has
already gone to the client) and rebuilds each choice's message from the deltas:
text concatenated, tool calls merged by index. Both end in `result()` ->
(assistant messages by choice, usage or None). Neither raises on malformed
input: an answer that cannot be read is simply not learnt from.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["JsonAnswer", "SseAnswer"]

MAX_JSON_BYTES = 32 << 20


class JsonAnswer:
    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= MAX_JSON_BYTES:
            self._parts.append(chunk)

    def result(self) -> tuple[list[dict], dict | None]:
        if self._size > MAX_JSON_BYTES:
            return [], None
        try:
            body = json.loads(b"".join(self._parts))
        except ValueError:
            return [], None
        if not isinstance(body, dict):
            return [], None
        messages = []
        for choice in body.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
                messages.append(choice["message"])
        usage = body.get("usage")
        return messages, usage if isinstance(usage, dict) else None


class SseAnswer:
    def __init__(self) -> None:
        self._buffer = b""
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict | None = None
        self.done = False  # the `[DONE]` event has been read

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        while True:
            cut, width = _event_end(self._buffer)
            if cut < 0:
                if len(self._buffer) > MAX_JSON_BYTES:
                    self._buffer = b""  # a runaway event: give up on it
                return
            event, self._buffer = self._buffer[:cut], self._buffer[cut + width:]
            self._event(event)

    def result(self) -> tuple[list[dict], dict | None]:
        if self._buffer.strip():
            self._event(self._buffer)
            self._buffer = b""
        out = []
        for index in sorted(self._choices):
            c = self._choices[index]
            message: dict[str, Any] = {"role": c.get("role") or "assistant", "content": "".join(c["content"]) or None}
            if c["tools"]:
                message["tool_calls"] = [
                    {"id": t["id"], "type": "function",
                     "function": {"name": t["name"], "arguments": "".join(t["arguments"])}}
                    for _, t in sorted(c["tools"].items())]
            out.append(message)
        return out, self._usage

    def _event(self, event: bytes) -> None:
        data = [line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")]
        if not data:
            return
        payload = b"\n".join(data)
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            return
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or not isinstance(choice.get("delta"), dict):
                continue
            index = choice.get("index", 0) if isinstance(choice.get("index", 0), int) else 0
            state = self._choices.setdefault(index, {"role": None, "content": [], "tools": {}})
            delta = choice["delta"]
            if isinstance(delta.get("role"), str):
                state["role"] = delta["role"]
            if isinstance(delta.get("content"), str):
                state["content"].append(delta["content"])
            for call in delta.get("tool_calls") or ():
                if not isinstance(call, dict):
                    continue
                slot = call.get("index", len(state["tools"]))
                tool = state["tools"].setdefault(slot, {"id": "", "name": "", "arguments": []})
                if call.get("id"):
                    tool["id"] = str(call["id"])
                fn = call.get("function") if isinstance(call.get("function"), dict) else {}
                if fn.get("name"):
                    tool["name"] += str(fn["name"]) if not tool["name"] else ""
                if isinstance(fn.get("arguments"), str):
                    tool["arguments"].append(fn["arguments"])


def _event_end(buffer: bytes) -> tuple[int, int]:
    """Position and width of the first blank line (an SSE event boundary), or (-1, 0)."""
    best, width = -1, 0
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buffer.find(sep)
        if i >= 0 and (best < 0 or i < best):
            best, width = i, len(sep)
    return best, width
