"""Reading an upstream's answer as it passes: the framing every API shares.

An answer reader is fed the raw bytes of one response: a stream chunk by chunk,
each before it goes on to the client (the reader says when it has read the event
that ends the answer: `done`), a JSON body once whole. `result()` then says what
the answer was: a `exchanges.Reply`, or None when the upstream reported a failure
inside its answer. No reader raises on malformed input: an answer that cannot be
read is simply not learnt from.

`JsonAnswer` keeps a bounded JSON body and hands it to `read(body)`;
`SseAnswer` splits a `text/event-stream` into events and hands each to
`event(name, data)` as it completes. The API adapters subclass them.
"""

from __future__ import annotations

import json
from typing import Any

from .exchanges import Reply

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

    def result(self) -> Reply | None:
        if self._size > MAX_JSON_BYTES:
            return Reply()
        try:
            body = json.loads(b"".join(self._parts))
        except ValueError:
            return Reply()
        return self.read(body) if isinstance(body, dict) else Reply()

    def read(self, body: dict) -> Reply | None:
        raise NotImplementedError


class SseAnswer:
    def __init__(self) -> None:
        self._buffer = b""
        self.done = False     # the answer's end has been read
        self.failed = False   # the stream said the answer failed

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        while True:
            cut, width = _event_end(self._buffer)
            if cut < 0:
                if len(self._buffer) > MAX_JSON_BYTES:
                    self._buffer = b""  # a runaway event: give up on it
                return
            event, self._buffer = self._buffer[:cut], self._buffer[cut + width:]
            self._parse(event)

    def result(self) -> Reply | None:
        if self._buffer.strip():
            self._parse(self._buffer)
            self._buffer = b""
        return None if self.failed else self.reply()

    def event(self, name: str, data: Any) -> None:
        """One event: its `event:` name ("" if none) and its parsed `data:` (the
        raw bytes when they are not JSON, e.g. `[DONE]`)."""
        raise NotImplementedError

    def reply(self) -> Reply:
        raise NotImplementedError

    def _parse(self, event: bytes) -> None:
        name, data = "", []
        for line in event.splitlines():
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip())
            elif line.startswith(b"event:"):
                name = line[6:].strip().decode("utf-8", "replace")
        if not data:
            return
        payload = b"\n".join(data)
        try:
            parsed: Any = json.loads(payload)
        except ValueError:
            parsed = payload.strip()
        self.event(name, parsed)


def _event_end(buffer: bytes) -> tuple[int, int]:
    """Position and width of the first blank line (an SSE event boundary), or (-1, 0)."""
    best, width = -1, 0
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buffer.find(sep)
        if i >= 0 and (best < 0 or i < best):
            best, width = i, len(sep)
    return best, width
