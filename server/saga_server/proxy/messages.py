"""The Anthropic Messages API (`/v1/messages`) as protocol-neutral exchanges.

A request is its `system` (a system message, which also names the workflow) and
its `messages`. An assistant message's `text` blocks are its text and its
`tool_use` blocks its calls (by `id`); a user message's `tool_result` blocks are
tool results (answering their `tool_use_id`), and the rest of it one user
message after them. Thinking blocks are left out (clients keep or drop them),
and so are `cache_control` markers, which clients move from request to request.
`metadata.user_id`, when present, scopes the session: requests of two users
never share one (coding agents put a per-session id there).

An answer is the message's `content` (a JSON body, or a stream's blocks rebuilt
from `content_block_*` events up to `message_stop`; an `error` event fails the
call). Its prompt is `input_tokens` plus the cached ones, which this API counts
apart (`cache_read_input_tokens` are the ones served from the cache). The session id goes upstream as the `X-Session-ID` header only: vLLM's
`AnthropicMessagesRequest` has no session field (it drops unknown ones), and its
Messages server runs the request through the chat path, which reads the header.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .answers import JsonAnswer, SseAnswer
from .exchanges import (Message, Reply, Request, ToolCall, canonical, canonical_args, count, detail, said_fields,
                    text_of)

__all__ = ["MESSAGES"]

_THINKING = ("thinking", "redacted_thinking")
_PROMPT = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


class MessagesApi:
    name = "messages"
    body_session_field = False

    def read(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> Request:
        system = text_of(body.get("system"))
        messages = [Message("system", system)] if system else []
        raw = body.get("messages")
        for m in raw if isinstance(raw, list) else ():
            if isinstance(m, Mapping):
                messages += _user(m.get("content")) if m.get("role") != "assistant" else [_assistant(m.get("content"))]
        metadata = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
        user = metadata.get("user_id")
        return Request(tuple(messages), model=str(body.get("model") or ""), system=system, **said_fields(body, headers),
                       scope=str(user) if isinstance(user, (str, int)) and not isinstance(user, bool) else "")

    def reader(self, sse: bool):
        return SseMessages() if sse else JsonMessages()


MESSAGES = MessagesApi()


def _assistant(content: Any) -> Message:
    if not isinstance(content, list):
        return Message("assistant", text_of(content))
    texts, calls = [], []
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind in _THINKING:
            continue
        if kind == "tool_use":
            calls.append(ToolCall(str(block.get("id") or ""), str(block.get("name") or ""),
                                  canonical_args(block.get("input") if block.get("input") is not None else {})))
        elif kind == "text":
            texts.append(str(block.get("text") or ""))
        else:
            texts.append(canonical(block))
    return Message("assistant", "\n".join(texts).strip(), tuple(calls))


def _user(content: Any) -> list[Message]:
    if not isinstance(content, list):
        return [Message("user", text_of(content))]
    out, rest = [], []
    for block in content:
        if isinstance(block, Mapping) and block.get("type") == "tool_result":
            text = text_of(block.get("content"))
            out.append(Message("tool", f"[error] {text}" if block.get("is_error") else text,
                               answers=str(block.get("tool_use_id") or "")))
        else:
            rest.append(block)
    if rest or not out:
        out.append(Message("user", text_of(rest)))
    return out


def _reply(content: Any, usage: Any, stop_reason: Any, message_id: Any) -> Reply:
    return Reply((_assistant(content),), count(usage, *_PROMPT), count(usage, "output_tokens"),
                 str(message_id or ""), stop_reason == "max_tokens", detail(usage, "cache_read_input_tokens"))


class JsonMessages(JsonAnswer):
    def read(self, body: dict) -> Reply | None:
        if body.get("type") == "error":
            return None
        return _reply(body.get("content") or [], body.get("usage"), body.get("stop_reason"), body.get("id"))


class SseMessages(SseAnswer):
    def __init__(self) -> None:
        super().__init__()
        self._id = ""
        self._blocks: dict[int, dict[str, Any]] = {}
        self._partial: dict[int, list[str]] = {}
        self._usage: dict[str, Any] = {}
        self._stop: Any = None

    def event(self, name: str, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type") or name
        index = data.get("index") if isinstance(data.get("index"), int) else -1
        if kind == "message_start" and isinstance(data.get("message"), Mapping):
            self._id = str(data["message"].get("id") or "")
            self._take_usage(data["message"].get("usage"))
        elif kind == "content_block_start" and isinstance(data.get("content_block"), Mapping):
            self._blocks[index] = dict(data["content_block"])
        elif kind == "content_block_delta" and isinstance(data.get("delta"), Mapping) and index in self._blocks:
            delta, block = data["delta"], self._blocks[index]
            if delta.get("type") == "text_delta":
                block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
            elif delta.get("type") == "input_json_delta":
                self._partial.setdefault(index, []).append(str(delta.get("partial_json") or ""))
        elif kind == "message_delta":
            if isinstance(data.get("delta"), Mapping):
                self._stop = data["delta"].get("stop_reason", self._stop)
            self._take_usage(data.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            self.done = self.failed = True

    def reply(self) -> Reply:
        content = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.get("type") == "tool_use" and "".join(self._partial.get(index, ())).strip():
                try:
                    block["input"] = json.loads("".join(self._partial[index]))
                except ValueError:
                    block["input"] = "".join(self._partial[index])
            content.append(block)
        return _reply(content, self._usage, self._stop, self._id)

    def _take_usage(self, usage: Any) -> None:
        if isinstance(usage, Mapping):
            self._usage.update({k: v for k, v in usage.items() if v is not None})
