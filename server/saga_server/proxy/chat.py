"""The Chat Completions API (`/v1/chat/completions`) as protocol-neutral exchanges.

A request's `messages` map one to one; an assistant message's `tool_calls` (and
the legacy `function_call`) are its calls, a `role: "tool"` message answers its
`tool_call_id`. The workflow is named after the first message when it is a
system or developer message. An answer is each choice's `message`, whole
(`JsonChat`) or rebuilt from a stream's deltas (`SseChat`: text concatenated,
tool calls merged by index, read up to `[DONE]`). The session id goes to the
upstream as the `X-Session-ID` header and the body field `session_id`, both of
which vLLM reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .answers import JsonAnswer, SseAnswer
from .exchanges import (Message, Reply, Request, ToolCall, cache_key_scope, canonical_args, count, detail, said_fields,
                    text_of)

__all__ = ["CHAT"]


class ChatApi:
    name = "chat"
    body_session_field = True

    def read(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> Request:
        raw = body.get("messages") if isinstance(body, Mapping) else None
        messages = tuple(message(m) for m in raw) if isinstance(raw, list) else ()
        system = ""
        if isinstance(raw, list) and raw and isinstance(raw[0], Mapping) \
                and raw[0].get("role") in ("system", "developer"):
            system = text_of(raw[0].get("content"))
        model = body.get("model") if isinstance(body, Mapping) else None
        return Request(messages, model=str(model or ""), system=system, scope=cache_key_scope(body),
                       **said_fields(body, headers))

    def reader(self, sse: bool):
        return SseChat() if sse else JsonChat()

    def reply(self, answers, usage: Mapping[str, Any] | None = None, truncated: bool = False) -> Reply:
        """Assistant messages (one per choice) and their usage, as a `Reply`."""
        return Reply(tuple(message(a) for a in answers if isinstance(a, Mapping)),
                     count(usage, "prompt_tokens"), count(usage, "completion_tokens"), truncated=truncated,
                     cached_tokens=detail(usage, "prompt_tokens_details", "cached_tokens"))


CHAT = ChatApi()


def message(raw: Any) -> Message:
    if not isinstance(raw, Mapping):
        return Message("?", repr(raw))
    role = str(raw.get("role", ""))
    text = text_of(raw.get("content"))
    if role == "assistant":
        return Message(role, text, _calls(raw))
    if role in ("tool", "function"):
        return Message(role, text, answers=str(raw.get("tool_call_id") or ""), name=str(raw.get("name") or ""))
    return Message(role, text)


def _calls(raw: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    calls = []
    listed = raw.get("tool_calls")
    if isinstance(listed, list):
        for i, call in enumerate(listed):
            if not isinstance(call, Mapping):
                continue
            fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
            calls.append(ToolCall(str(call.get("id") or ""), str(fn.get("name") or ""),
                                  canonical_args(fn.get("arguments"))))
    legacy = raw.get("function_call")
    if isinstance(legacy, Mapping):
        calls.append(ToolCall("", str(legacy.get("name") or ""), canonical_args(legacy.get("arguments"))))
    return tuple(calls)


class JsonChat(JsonAnswer):
    def read(self, body: dict) -> Reply:
        answers, truncated = [], False
        for choice in body.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
                answers.append(choice["message"])
                truncated = truncated or choice.get("finish_reason") == "length"
        return CHAT.reply(answers, body.get("usage"), truncated)


class SseChat(SseAnswer):
    def __init__(self) -> None:
        super().__init__()
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict | None = None
        self._truncated = False

    def event(self, name: str, chunk: Any) -> None:
        if chunk == b"[DONE]":
            self.done = True
            return
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or not isinstance(choice.get("delta"), dict):
                continue
            self._truncated = self._truncated or choice.get("finish_reason") == "length"
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

    def reply(self) -> Reply:
        answers = []
        for index in sorted(self._choices):
            c = self._choices[index]
            answer: dict[str, Any] = {"role": c.get("role") or "assistant", "content": "".join(c["content"]) or None}
            if c["tools"]:
                answer["tool_calls"] = [
                    {"id": t["id"], "type": "function",
                     "function": {"name": t["name"], "arguments": "".join(t["arguments"])}}
                    for _, t in sorted(c["tools"].items())]
            answers.append(answer)
        return CHAT.reply(answers, self._usage, self._truncated)
