"""The Responses API (`/v1/responses`) as protocol-neutral exchanges.

A request is its `instructions` (a system message, which also names the
workflow) and its `input`: a string (one user message) or a list of items. What
the model produced is a run of output items (assistant `message`s and
`function_call`s, `reasoning` in between); such a run, as a client sends it back
in a later `input`, is one assistant message whose calls are the function calls
(by `call_id`), so that a resent history reads exactly like the answer it
repeats. A `function_call_output` item answers its `call_id`. Reasoning items
are left out: clients keep or drop them. A request with `previous_response_id`
continues that response (the tracker maps response ids to sessions); its input
holds only what is new, whether or not the response was stored.

An answer is the response's `output` (a JSON body, or a stream's
`response.completed` event, which ends the stream; `response.failed` and `error`
events fail the call). The session id goes upstream as `X-Session-ID` and as the
body field `session_id`: vLLM's `ResponsesRequest` has that field, and its
Responses server reads the body field first, then the header.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .answers import JsonAnswer, SseAnswer
from .exchanges import (Message, Reply, Request, ToolCall, cache_key_scope, canonical, canonical_args, count, detail,
                    said_fields, text_of)

__all__ = ["RESPONSES"]

_CALLS = ("function_call", "custom_tool_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_SKIPPED = ("reasoning",)
_ENDS = ("response.completed", "response.incomplete")
_FAILS = ("response.failed", "error")


class ResponsesApi:
    name = "responses"
    body_session_field = True

    def read(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> Request:
        instructions = text_of(body.get("instructions"))
        raw = body.get("input")
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw if isinstance(raw, list) else []
        messages = ([Message("system", instructions)] if instructions else []) + items_to_messages(items)
        system = instructions or next((m.text for m in messages if m.role in ("system", "developer")), "")
        previous = body.get("previous_response_id")
        return Request(tuple(messages), model=str(body.get("model") or ""), system=system, **said_fields(body, headers),
                       scope=cache_key_scope(body), previous=previous if isinstance(previous, str) else "")

    def reader(self, sse: bool):
        return SseResponses() if sse else JsonResponses()


RESPONSES = ResponsesApi()


def items_to_messages(items: Iterable[Any]) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []
    calls: list[ToolCall] = []

    def close_answer() -> None:
        if texts or calls:
            out.append(Message("assistant", "\n".join(texts).strip(), tuple(calls)))
            texts.clear()
            calls.clear()

    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type") or ("message" if "role" in item else "")
        if kind in _SKIPPED:
            continue
        if kind == "message" and item.get("role") == "assistant":
            texts.append(text_of(item.get("content")))
            continue
        if kind in _CALLS:
            args = item.get("arguments") if kind == "function_call" else item.get("input")
            calls.append(ToolCall(str(item.get("call_id") or ""), str(item.get("name") or ""), canonical_args(args)))
            continue
        close_answer()
        if kind == "message":
            out.append(Message(str(item.get("role") or ""), text_of(item.get("content"))))
        elif kind in _OUTPUTS:
            out.append(Message("tool", text_of(item.get("output")), answers=str(item.get("call_id") or "")))
        else:  # another kind of item (a built-in tool's call, a reference): kept as it is
            out.append(Message(str(kind), canonical(item)))
    close_answer()
    return out


def _reply(response: Mapping[str, Any]) -> Reply | None:
    if response.get("status") == "failed":
        return None
    output = response.get("output")
    answer = [m for m in items_to_messages(output) if m.role == "assistant"] if isinstance(output, list) else []
    usage = response.get("usage")
    return Reply(tuple(answer[:1]), count(usage, "input_tokens"), count(usage, "output_tokens"),
                 str(response.get("id") or ""), response.get("status") == "incomplete",
                 detail(usage, "input_tokens_details", "cached_tokens"))


class JsonResponses(JsonAnswer):
    def read(self, body: dict) -> Reply | None:
        return _reply(body)


class SseResponses(SseAnswer):
    def __init__(self) -> None:
        super().__init__()
        self._response: Mapping[str, Any] = {}
        self._items: dict[int, Any] = {}

    def event(self, name: str, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type") or name
        if isinstance(data.get("response"), Mapping):
            self._response = data["response"]
        if kind == "response.output_item.done" and isinstance(data.get("output_index"), int):
            self._items[data["output_index"]] = data.get("item")
        if kind in _ENDS:
            self.done = True
        elif kind in _FAILS:
            self.done = self.failed = True

    def reply(self) -> Reply:
        response = dict(self._response)
        if not response.get("output") and self._items:  # an end event without the output: the items seen
            response["output"] = [self._items[i] for i in sorted(self._items)]
        return _reply(response) or Reply()
