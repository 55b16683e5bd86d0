"""Who a request says it is: the session ids, parent links and last-request markers
that agents and gateways already send.

Coding agents name their session on every request (Claude Code, Codex, OpenCode),
and so do gateways (Dynamo, Helicone, LiteLLM). `IDENTITY_HEADERS` is the one table
of the headers SAGA reads; both front doors, `saga proxy` (`proxy.sessions`) and
the engine's own port (`proxy.engine_port`), read requests through `identity_of`,
so they agree on every id. Each `HeaderSet` names, for one sender:

- `session`: the session id (required);
- `agent`: a sub-id within that session (Claude Code's subagents share the
  session id and differ by agent id): the session is then `<session>:<agent>`;
- `parent`: the parent session's id, given whole (Codex, OpenCode, Dynamo), or
  `parent_agent`: the parent's agent id within the same session (Claude Code;
  a subagent without one is a child of the session's root);
- `final`: a header whose value `true` (or `1`, `yes`) marks the session's last
  request: SAGA ends the session when that request finishes.

The first set in table order whose `session` header is present and non-blank gives
the identity; nothing is merged across sets. Operators add sets with
`$SAGA_SESSION_HEADERS` (`SESSION_HEADERS_ENV`; the front doors read it and pass it
to `header_sets`): entries separated by `;`, each a comma-separated list of
`role=header`, e.g. `session=x-my-run,parent=x-my-parent`; they are read before
the built-in sets, so a deployment's own headers win. `saga serve` and `saga proxy`
refuse to start with a bad entry, saying why (`parse_header_sets`).

Values are taken as the sender wrote them, stripped, and cut to
`MAX_SESSION_ID_CHARS`; a blank value counts as absent. Tenant scoping is the
front door's (`scopes.scoped`), applied to the session and the parent alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .scopes import MAX_SESSION_ID_CHARS

__all__ = ["HeaderSet", "IDENTITY_HEADERS", "Identity", "SESSION_HEADERS_ENV", "header_sets", "identity_of",
           "is_true", "parse_header_sets", "problem_with"]

SESSION_HEADERS_ENV = "SAGA_SESSION_HEADERS"


@dataclass(frozen=True, slots=True)
class HeaderSet:
    """One sender's headers (lower-case names; "" = the sender has none)."""

    source: str
    session: str
    agent: str = ""
    parent: str = ""
    parent_agent: str = ""
    final: str = ""


# Checked against each sender's source or docs (Dynamo's `AGENT_HEADER_MAPPINGS`,
# Codex's `codex-rs/core/src/client.rs`, OpenCode's `session/llm/request.ts`,
# Claude Code's LLM-gateway docs). Order is precedence.
IDENTITY_HEADERS: tuple[HeaderSet, ...] = (
    # vLLM's own header, what `saga proxy` forwards (with SAGA's marker on a session's last
    # request); OpenCode sends it with its parent's
    HeaderSet("vllm", "x-session-id", parent="x-parent-session-id", final="x-saga-session-final"),
    HeaderSet("saga", "x-saga-session-id", parent="x-saga-parent-session-id", final="x-saga-session-final"),
    HeaderSet("dynamo", "x-dynamo-session-id", parent="x-dynamo-parent-session-id",
              final="x-dynamo-session-final"),
    HeaderSet("dynamo", "x-dynamo-trajectory-id", parent="x-dynamo-parent-trajectory-id",
              final="x-dynamo-trajectory-final"),
    # subagents share the session id and name themselves and their parent agent
    HeaderSet("claude-code", "x-claude-code-session-id", agent="x-claude-code-agent-id",
              parent_agent="x-claude-code-parent-agent-id"),
    HeaderSet("codex", "thread-id", parent="x-codex-parent-thread-id"),
    HeaderSet("codex", "session-id", parent="x-codex-parent-thread-id"),
    HeaderSet("codex", "session_id"),  # older releases
    HeaderSet("deepseek-harness", "x-deepseek-harness-session-id", parent="x-deepseek-harness-parent-session-id"),
    HeaderSet("opencode", "x-opencode-session"),  # to OpenCode's own providers
    HeaderSet("helicone", "helicone-session-id"),
    HeaderSet("litellm", "x-litellm-session-id"),
)

_ROLES = ("session", "agent", "parent", "parent_agent", "final")


@dataclass(frozen=True, slots=True)
class Identity:
    """What a request said of itself. `session_id` None: it named no session."""

    session_id: str | None = None
    parent_id: str | None = None
    final: bool = False
    source: str = ""  # the `HeaderSet.source` that gave it ("" for none)


def is_true(value: object) -> bool:
    """A marker's value that means yes (`true`, `1`, `yes`; any case)."""
    if isinstance(value, bool):
        return value
    return isinstance(value, str) and value.strip().lower() in ("true", "1", "yes")


def identity_of(headers: Mapping[str, str], sets: tuple[HeaderSet, ...] = IDENTITY_HEADERS) -> Identity:
    """The identity the request's `headers` (lower-case names) give, by `sets`."""
    for hs in sets:
        session = _value(headers, hs.session)
        if session is None:
            continue
        agent = _value(headers, hs.agent)
        parent = _value(headers, hs.parent)
        if agent is not None:
            if parent is None:
                parent_agent = _value(headers, hs.parent_agent)
                parent = f"{session}:{parent_agent}" if parent_agent is not None else session
            session = f"{session}:{agent}"
        if parent == session:
            parent = None
        return Identity(_cut(session), _cut(parent) if parent else None,
                        is_true(headers.get(hs.final)) if hs.final else False, hs.source)
    return Identity()


def parse_header_sets(spec: str) -> tuple[HeaderSet, ...]:
    """`$SAGA_SESSION_HEADERS`' sets (module docstring); ValueError says what is wrong."""
    out = []
    for n, entry in enumerate(e for e in spec.split(";") if e.strip()):
        roles: dict[str, str] = {}
        for part in entry.split(","):
            role, sep, name = part.partition("=")
            role, name = role.strip(), name.strip().lower()
            if not sep or role not in _ROLES or not name:
                raise ValueError(f"{SESSION_HEADERS_ENV} entry {entry.strip()!r}: {part.strip()!r} is not "
                                 f"role=header with role one of {', '.join(_ROLES)}")
            roles[role] = name
        if "session" not in roles:
            raise ValueError(f"{SESSION_HEADERS_ENV} entry {entry.strip()!r} names no session header")
        out.append(HeaderSet(f"config-{n + 1}", **roles))
    return tuple(out)


def problem_with(spec: str) -> str | None:
    """Why `spec` (`$SAGA_SESSION_HEADERS`' value) cannot be used; None: it can."""
    try:
        parse_header_sets(spec)
    except ValueError as exc:
        return str(exc)
    return None


_configured: tuple[str, tuple[HeaderSet, ...]] = ("", IDENTITY_HEADERS)


def header_sets(spec: str) -> tuple[HeaderSet, ...]:
    """The sets `spec` (`$SAGA_SESSION_HEADERS`' value) adds, then `IDENTITY_HEADERS`.
    A bad `spec` gives the built-in sets (the front doors refused it at start; a
    request never fails on it)."""
    global _configured
    if _configured[0] != spec:  # parsed once per value
        try:
            own = parse_header_sets(spec)
        except ValueError:
            own = ()
        _configured = (spec, own + IDENTITY_HEADERS)
    return _configured[1]


def _value(headers: Mapping[str, str], name: str) -> str | None:
    if not name:
        return None
    value = headers.get(name)
    if not isinstance(value, str):
        return None
    return value.strip() or None


def _cut(value: str) -> str:
    return value[:MAX_SESSION_ID_CHARS]
