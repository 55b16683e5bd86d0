"""Protocol-neutral exchanges: what `SessionTracker` matches, whichever API carried them.

An exchange is one request of an agent and the answer it gets back (not a user
turn, which spans many: `core.turns`). The request is a history of messages, and
its answer one more; the APIs differ only in how they spell them. Each API adapter (`chat`, `responses`,
`messages`) reads a request into a `Request` and an answer into a `Reply`, both
made of `Message`s, so that the rule that finds a request's session lives once,
in `sessions`.

A `Message` keeps what a client preserves when it sends an answer back (role,
text, tool-call ids, names and arguments as JSON values, the call id a tool
result answers), not the raw JSON: clients add `refusal: null`, reorder keys,
re-dump arguments, move cache markers. Two messages that a client would
consider the same compare (and hash) equal.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..core.scopes import MAX_SESSION_ID_CHARS
from ..core.identity import SESSION_HEADERS_ENV, Identity, header_sets, identity_of

__all__ = [
    "Message",
    "Reply",
    "Request",
    "SESSION_BODY_FIELDS",
    "ToolCall",
    "canonical_args",
    "count",
    "detail",
    "cache_key_scope",
    "caller_identity",
    "explicit_session_id",
    "headers_identity",
    "said_fields",
    "text_of",
]

# Body paths, in order of precedence, read when no header (`core.identity`) names a session.
SESSION_BODY_FIELDS = (
    ("session_id",),
    ("vllm_xargs", "session_id"),
    ("litellm_session_id",),
    ("metadata", "session_id"),
    ("metadata", "litellm_session_id"),
)


# Tuples, not dataclasses: a request builds one per history entry, and hashes them all.
class ToolCall(NamedTuple):
    call_id: str
    name: str
    arguments: str  # canonical JSON (`canonical_args`)


class Message(NamedTuple):
    """One history entry. `role`: "system", "user", "assistant", "tool" (a tool
    result), or an API's own kind of item (kept so that histories stay distinct)."""

    role: str
    text: str = ""
    calls: tuple[ToolCall, ...] = ()  # the tool calls an assistant message asks for
    answers: str = ""                 # the call id a tool result answers
    name: str = ""                    # a tool result's tool name, where the API has one


@dataclass(frozen=True, slots=True)
class Request:
    """One request, read. `scope`: requests of different scopes never share a
    session (e.g. the Messages API's `metadata.user_id`); `previous`: the id the
    upstream gave the answer this request continues (`previous_response_id`);
    `tenant`: whose request it is (the caller's API key says; "" without keys):
    requests of different tenants never share a session (`tenants.namespaced`).
    `parent`, `final`: the caller's parent session and last-request marker
    (`core.identity`)."""

    messages: tuple[Message, ...] = ()
    explicit: str | None = None  # the caller's own session id
    model: str = ""
    system: str = ""             # names the workflow, with the model
    scope: str = ""
    previous: str = ""
    tenant: str = ""
    parent: str | None = None
    final: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer, read: an assistant message per choice."""

    messages: tuple[Message, ...] = ()
    prompt_tokens: int = 0
    output_tokens: int = 0
    response_id: str = ""    # the id later requests may continue it by
    truncated: bool = False  # stopped at the length limit, not by the model
    cached_tokens: int | None = None  # prompt tokens the upstream served from its cache; None: not reported


def headers_identity(headers: Mapping[str, str]) -> Identity:
    """What the request's headers (lower-case names) say of it: `core.identity`'s
    table, after the operator's own sets (`$SAGA_SESSION_HEADERS`)."""
    return identity_of(headers, header_sets(os.environ.get(SESSION_HEADERS_ENV, "")))


def caller_identity(body: Mapping[str, Any], headers: Mapping[str, str]) -> Identity:
    """What the caller said of itself: its headers (`headers_identity`), else a
    session id in the body (`SESSION_BODY_FIELDS`)."""
    said = headers_identity(headers)
    if said.session_id is not None or not isinstance(body, Mapping):
        return said
    for path in SESSION_BODY_FIELDS:
        node: Any = body
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, (str, int)) and not isinstance(node, bool) and str(node).strip():
            return Identity(str(node).strip()[:MAX_SESSION_ID_CHARS], source="body")
    return said


def explicit_session_id(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The caller's own session id, if it sent one (headers first, then the body)."""
    return caller_identity(body, headers).session_id


def cache_key_scope(body: Mapping[str, Any]) -> str:
    """The request's OpenAI `prompt_cache_key` as a scope ("" for none): a client
    keeps one per conversation or user, so requests under different keys never
    continue one another (`Request.scope`)."""
    key = body.get("prompt_cache_key") if isinstance(body, Mapping) else None
    return f"cache-key:{key[:MAX_SESSION_ID_CHARS]}" if isinstance(key, str) and key.strip() else ""


def said_fields(body: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """`Request`'s fields of what the caller said of itself (`caller_identity`)."""
    said = caller_identity(body, headers)
    return {"explicit": said.session_id, "parent": said.parent_id, "final": said.final}


_TEXT_PARTS = ("text", "input_text", "output_text")
_VOLATILE = ("cache_control", "id", "status", "annotations", "logprobs")  # not content: clients drop or move them


def text_of(content: Any) -> str:
    """A message's content as text: strings and text parts joined; any other part
    as canonical JSON without what clients drop or move (`_VOLATILE`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS:
                pieces.append(str(part.get("text", "")))
            elif isinstance(part, str):
                pieces.append(part)
            else:
                pieces.append(canonical(part))
        return "\n".join(pieces).strip()
    return canonical(content)


def canonical(value: Any) -> str:
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in _VOLATILE}
    return json.dumps(value, sort_keys=True, default=str)


def canonical_args(arguments: Any) -> str:
    """Tool arguments as a JSON value, so a client that re-dumps them still matches."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def count(usage: Any, *keys: str) -> int:
    """The sum of these non-negative integer fields of a usage object (0 if none)."""
    if not isinstance(usage, Mapping):
        return 0
    total = 0
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            total += value
    return total


def detail(usage: Any, *path: str) -> int | None:
    """A non-negative integer nested in a usage object (`detail(u, "prompt_tokens_details",
    "cached_tokens")`), or None where the upstream did not report it."""
    node = usage
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, int) and not isinstance(node, bool) and node >= 0 else None
