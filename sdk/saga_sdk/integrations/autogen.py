"""SAGA hints from AutoGen (autogen-agentchat / autogen-core 0.7) agents and teams.

    from saga_sdk.integrations.autogen import SagaChatCompletionClient, run

    model = SagaChatCompletionClient(OpenAIChatCompletionClient(model=..., base_url=...))
    team = RoundRobinGroupChat([AssistantAgent("a", model, tools=[...]), ...])
    result = await run(team, task="...", tenant="acme", deadline_s=120)

Three pieces, each usable alone:

* `SagaChatCompletionClient` wraps any `ChatCompletionClient`: every `create` /
  `create_stream` becomes an LLM-call start/end hint (session, 1-based step, node
  = the calling agent's name, token usage), and for OpenAI-compatible clients the
  request carries the session id to the server as the body field `session_id`
  (merged into `extra_body`: `OpenAIChatCompletionClient` refuses per-call
  `extra_headers`). Everything else is delegated to the wrapped client.
* `instrument()` / `uninstrument()` patch `BaseTool.run_json` and
  `BaseStreamTool.run_json_stream`, where AutoGen actually runs every tool
  (workbenches, handoffs, agent/team tools): one tool start/end hint per call,
  with the tool name and AutoGen's call id, outcome "ok", "error" or "cancelled"
  (`saga_sdk.outcomes`).
  Both are idempotent; the run helpers call `instrument()` for you.
* `run` / `run_stream` / `session` open a SAGA session around an agent or team
  run (tenant, deadline, and the declared structure: participants, their tools,
  who may speak after whom where the team type says so), keep it current for the
  whole run and end it as "completed", "cancelled" or "failed".

Where a hint finds its session (`session_for_current_call`):
  1. inside an AutoGen message handler whose agent belongs to a team that a
     `session` bound: that session. This is how a runtime the user started before
     the run (`RoundRobinGroupChat(..., runtime=my_runtime)`) works: its handler
     tasks were created in the runtime's own context, so contextvars set by the
     caller never reach them, but every team agent's id has the team id as key;
  2. otherwise the current `saga_sdk.context` session (set by `session`, by another
     integration, or by the application);
  3. otherwise none: the call passes through untouched and sends nothing.

The contract every hook keeps: it never raises into AutoGen or user code (an
internal error is logged once and the call proceeds unhinted), never blocks (hints
go to `HintClient`'s queue) and never changes what the agent sees.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Literal, Mapping, Optional, Sequence

try:
    from autogen_core import CancellationToken, Component, ComponentModel
    from autogen_core._message_handler_context import MessageHandlerContext
    from autogen_core.models import ChatCompletionClient, CreateResult, LLMMessage, ModelInfo, RequestUsage
    from autogen_core.tools import BaseStreamTool, BaseTool, Tool, ToolSchema
    from pydantic import BaseModel
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "saga_sdk.integrations.autogen needs AutoGen 0.7: pip install 'saga-agents[autogen]'") from exc

from ..client import HintClient, get_client
from ..context import SessionContext, current_session, new_session_id, reset_current_session, set_current_session
from ..logs import LogOnce
from ..outcomes import outcome_of, session_outcome_of

__all__ = [
    "SagaChatCompletionClient",
    "SagaSession",
    "describe",
    "instrument",
    "is_instrumented",
    "run",
    "run_stream",
    "session",
    "session_for_current_call",
    "uninstrument",
]

log = logging.getLogger("saga_sdk.autogen")

_log_once = LogOnce(log)


# -- where is the session? -------------------------------------------------------------


@dataclass(slots=True)
class _Bound:
    """A session as the hooks see it: the shared context plus what they need to emit."""

    ctx: SessionContext
    client: HintClient
    node: str = ""  # default LLM node (the agent's name for a single-agent run)
    # Tool calls started and not yet ended (call id -> tool name). A cancelled run can
    # leave a tool task running past the session's end (AutoGen does not cancel its
    # tool tasks when the agent's own task is cancelled): the session ends those
    # calls as "cancelled" first, and their late end is then not sent again.
    open_tools: dict[str, str] = field(default_factory=dict)


_by_session: dict[str, _Bound] = {}   # session id -> bound session (open `session`s)
_by_agent_key: dict[str, _Bound] = {}  # AutoGen agent-id key (a team id) -> bound session
_handler_var = getattr(MessageHandlerContext, "_MESSAGE_HANDLER_CONTEXT", None)
# The agent that an agent-as-tool (`AgentTool`) is running: it names the model calls
# made inside it, which otherwise would carry the outer agent's name.
_node_var: ContextVar[str | None] = ContextVar("saga_autogen_nested_agent", default=None)


def _handler_agent():
    """The `AgentId` whose message handler is running here, or None."""
    if _handler_var is not None:
        return _handler_var.get(None)
    try:
        return MessageHandlerContext.agent_id()
    except RuntimeError:
        return None


def _resolve() -> tuple[_Bound | None, SessionContext | None, Any]:
    agent = _handler_agent()
    if agent is not None:
        bound = _by_agent_key.get(agent.key)
        if bound is not None:
            return bound, bound.ctx, agent
    ctx = current_session()
    if ctx is None:
        return None, None, agent
    return _by_session.get(ctx.session_id), ctx, agent


def session_for_current_call() -> SessionContext | None:
    """The session a hint emitted here would belong to (see the module docstring)."""
    return _resolve()[1]


def _agent_name(agent) -> str:
    # Team agents are registered as type "<participant name>_<team id>", key "<team id>".
    t, k = agent.type, agent.key
    return t[: -len(k) - 1] if k and t.endswith("_" + k) else t


# -- model client ----------------------------------------------------------------------


class SagaChatCompletionClientConfig(BaseModel):
    """Declarative form of `SagaChatCompletionClient` (the wrapped client's own config nested)."""

    model_client: ComponentModel
    node: Optional[str] = None
    carry_session: Literal["auto", "extra_body", "off"] = "auto"


def _is_openai_compatible(client: ChatCompletionClient) -> bool:
    try:
        from autogen_ext.models.openai._openai_client import BaseOpenAIChatCompletionClient
    except Exception:
        return False
    return isinstance(client, BaseOpenAIChatCompletionClient)


class SagaChatCompletionClient(ChatCompletionClient, Component[SagaChatCompletionClientConfig]):
    """A `ChatCompletionClient` that hints every model call of the wrapped one.

    `node`: the LLM node name for every call (default: the calling agent's name).
    `client`: the `HintClient` (default: the session's, else `saga_sdk.get_client()`).
    `carry_session`: "extra_body" puts the session id in the request body field
    `session_id` (which vLLM reads), merged with the wrapped client's and the
    caller's `extra_body` (an explicit `session_id` there wins); "off" does not
    touch requests; "auto" (default) means "extra_body" for OpenAI-compatible
    clients and "off" for others, which may refuse unknown create arguments.
    """

    component_type = "model"
    component_config_schema = SagaChatCompletionClientConfig
    component_provider_override = "saga_sdk.integrations.autogen.SagaChatCompletionClient"

    def __init__(self, model_client: ChatCompletionClient, *, node: str | None = None,
                 client: HintClient | None = None,
                 carry_session: Literal["auto", "extra_body", "off"] = "auto") -> None:
        if not isinstance(model_client, ChatCompletionClient):
            raise TypeError(f"model_client must be an autogen ChatCompletionClient, not {type(model_client).__name__}")
        if carry_session not in ("auto", "extra_body", "off"):
            raise ValueError(f"carry_session must be 'auto', 'extra_body' or 'off', not {carry_session!r}")
        self._inner = model_client
        self._node = node
        self._hints = client
        self._carry_mode = carry_session
        self._carry = carry_session == "extra_body" or (carry_session == "auto" and _is_openai_compatible(model_client))

    @property
    def wrapped(self) -> ChatCompletionClient:
        return self._inner

    # -- the hinted calls --

    async def create(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = [],
                     tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
                     json_output: Optional[bool | type[BaseModel]] = None,
                     extra_create_args: Mapping[str, Any] = {},
                     cancellation_token: Optional[CancellationToken] = None) -> CreateResult:
        call = self._begin()
        if call is not None and self._carry:
            extra_create_args = self._with_session(extra_create_args, call[1])
        try:
            result = await self._inner.create(messages, tools=tools, tool_choice=tool_choice, json_output=json_output,
                                              extra_create_args=extra_create_args,
                                              cancellation_token=cancellation_token)
        except BaseException:
            if call is not None:
                self._end(call, None)
            raise
        if call is not None:
            self._end(call, result.usage)
        return result

    async def create_stream(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = [],
                            tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
                            json_output: Optional[bool | type[BaseModel]] = None,
                            extra_create_args: Mapping[str, Any] = {},
                            cancellation_token: Optional[CancellationToken] = None,
                            ) -> AsyncGenerator[str | CreateResult, None]:
        call = self._begin()
        if call is not None and self._carry:
            extra_create_args = self._with_session(extra_create_args, call[1])
        usage = None
        try:
            stream = self._inner.create_stream(messages, tools=tools, tool_choice=tool_choice,
                                               json_output=json_output, extra_create_args=extra_create_args,
                                               cancellation_token=cancellation_token)
            async with contextlib.aclosing(stream):
                async for item in stream:
                    if isinstance(item, CreateResult):
                        usage = item.usage
                    yield item
        finally:  # also when the consumer stops early or the call is cancelled
            if call is not None:
                self._end(call, usage)

    def _begin(self):
        """Emit llm_call_start; returns what `_end` needs, or None (no session / hook error)."""
        try:
            bound, ctx, agent = _resolve()
            if ctx is None:
                return None
            hints = self._hints or (bound.client if bound is not None else None) or get_client()
            node = (self._node or _node_var.get() or (_agent_name(agent) if agent is not None else "")
                    or (bound.node if bound else ""))
            step = ctx.next_step()
            hints.llm_call_start(ctx.session_id, step=step, node=node)
            return hints, ctx.session_id, step, node
        except Exception:
            _log_once("llm_start", "SAGA: could not hint an AutoGen model call; it proceeds unhinted", exc_info=True)
            return None

    @staticmethod
    def _end(call, usage: RequestUsage | None) -> None:
        try:
            hints, sid, step, node = call
            hints.llm_call_end(sid, step=step, node=node,
                               prompt_tokens=usage.prompt_tokens if usage else 0,
                               output_tokens=usage.completion_tokens if usage else 0)
        except Exception:
            _log_once("llm_end", "SAGA: could not hint the end of an AutoGen model call", exc_info=True)

    def _with_session(self, extra: Mapping[str, Any], session_id: str) -> Mapping[str, Any]:
        """`extra` plus `extra_body.session_id`, merged over the wrapped client's own
        `extra_body` (per-call `extra_body` replaces it wholesale inside AutoGen)."""
        try:
            user_body = extra.get("extra_body")
            if user_body is not None and not isinstance(user_body, Mapping):
                return extra  # not ours to reinterpret: send it exactly as given
            create_args = getattr(self._inner, "_create_args", None)
            base_body = create_args.get("extra_body") if isinstance(create_args, Mapping) else None
            body = dict(base_body) if isinstance(base_body, Mapping) else {}
            body.update(user_body or {})
            body.setdefault("session_id", session_id)
            return {**extra, "extra_body": body}
        except Exception:
            _log_once("carry", "SAGA: could not add the session id to an AutoGen request", exc_info=True)
            return extra

    # -- faithful delegation --

    async def close(self) -> None:
        await self._inner.close()

    def actual_usage(self) -> RequestUsage:
        return self._inner.actual_usage()

    def total_usage(self) -> RequestUsage:
        return self._inner.total_usage()

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return self._inner.count_tokens(messages, tools=tools)

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return self._inner.remaining_tokens(messages, tools=tools)

    @property
    def capabilities(self):  # deprecated in AutoGen, still part of the interface
        return self._inner.capabilities

    @property
    def model_info(self) -> ModelInfo:
        return self._inner.model_info

    def __getattr__(self, name: str) -> Any:
        # Anything else a caller reaches for (e.g. a client-specific attribute) is the wrapped client's.
        if name == "_inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _to_config(self) -> SagaChatCompletionClientConfig:
        return SagaChatCompletionClientConfig(model_client=self._inner.dump_component(), node=self._node,
                                              carry_session=self._carry_mode)

    @classmethod
    def _from_config(cls, config: SagaChatCompletionClientConfig) -> "SagaChatCompletionClient":
        inner = ChatCompletionClient.load_component(config.model_client)
        return cls(inner, node=config.node, carry_session=config.carry_session)


# -- tools -------------------------------------------------------------------------------

_originals: dict[str, Any] = {}
_patch_lock = threading.Lock()


def instrument() -> None:
    """Hint every AutoGen tool call (see the module docstring). Idempotent."""
    with _patch_lock:
        if _originals:
            return
        run_json = BaseTool.__dict__["run_json"]
        run_json_stream = BaseStreamTool.__dict__["run_json_stream"]
        _originals["run_json"], _originals["run_json_stream"] = run_json, run_json_stream
        BaseTool.run_json = _hinted_run_json(run_json)
        BaseStreamTool.run_json_stream = _hinted_run_json_stream(run_json_stream)


def uninstrument() -> None:
    """Restore AutoGen's own tool methods. Idempotent."""
    with _patch_lock:
        if not _originals:
            return
        BaseTool.run_json = _originals.pop("run_json")
        BaseStreamTool.run_json_stream = _originals.pop("run_json_stream")


def is_instrumented() -> bool:
    return bool(_originals)


_call_ids = iter(range(1, 1 << 62))


def _tool_begin(tool, call_id: str | None):
    try:
        bound, ctx, _ = _resolve()
        if ctx is None:
            return None
        hints = bound.client if bound is not None else get_client()
        name = tool.name
        # AutoGen passes the model's call id; a direct call may not, and start/end must pair.
        cid = call_id or f"saga-{next(_call_ids)}"
        if bound is not None:
            bound.open_tools[cid] = name
        hints.tool_call_start(ctx.session_id, name, call_id=cid)
        return hints, ctx.session_id, name, cid, bound
    except Exception:
        _log_once("tool_start", "SAGA: could not hint an AutoGen tool call; it proceeds unhinted", exc_info=True)
        return None


def _tool_end(call, outcome: str) -> None:
    try:
        hints, sid, name, cid, bound = call
        if bound is not None and bound.open_tools.pop(cid, None) is None:
            return  # the session already ended it
        hints.tool_call_end(sid, name, call_id=cid, outcome=outcome)
    except Exception:
        _log_once("tool_end", "SAGA: could not hint the end of an AutoGen tool call", exc_info=True)


def _hinted_run_json(original):
    @functools.wraps(original)
    async def run_json(self, args, cancellation_token, call_id=None):
        call = _tool_begin(self, call_id)
        if call is None:
            return await original(self, args, cancellation_token, call_id=call_id)
        try:
            result = await original(self, args, cancellation_token, call_id=call_id)
        except BaseException as exc:
            _tool_end(call, outcome_of(exc))
            raise
        _tool_end(call, "ok")
        return result

    run_json.__saga_original__ = original
    return run_json


def _nested_agent_name(tool) -> str | None:
    """The agent an `AgentTool` runs (not a `TeamTool`: its agents name themselves)."""
    runner = getattr(tool, "_task_runner", None)
    if runner is None or hasattr(runner, "_participants"):
        return None
    return getattr(runner, "name", None)


def _hinted_run_json_stream(original):
    @functools.wraps(original)
    async def run_json_stream(self, args, cancellation_token, call_id=None):
        call = _tool_begin(self, call_id)
        try:
            node = _nested_agent_name(self)
        except Exception:
            node = None
        stream = original(self, args, cancellation_token, call_id=call_id)
        try:
            async with contextlib.aclosing(stream):
                while True:
                    # Model calls made while the stream advances belong to the nested agent;
                    # set only around each step, so the consumer's context never keeps it.
                    token = _node_var.set(node) if node else None
                    try:
                        item = await stream.__anext__()
                    except StopAsyncIteration:
                        break
                    finally:
                        if token is not None:
                            _node_var.reset(token)
                    yield item
        except BaseException as exc:
            if call is not None:
                _tool_end(call, outcome_of(exc))
            raise
        if call is not None:
            _tool_end(call, "ok")

    run_json_stream.__saga_original__ = original
    return run_json_stream


# -- declared structure --------------------------------------------------------------------

END_NODE = "end"


def describe(target) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The declared structure of an agent or team: `(nodes, edges)` for
    `HintClient.session_start`. Nodes are participants ("llm"), their tools ("tool")
    and "end"; edges say who may speak after whom where the team type fixes it
    (round robin: the next in order; selector: anyone; swarm: handoff targets;
    GraphFlow: its graph) and which tools an agent may call. Teams of other types
    declare participants only. Never raises: an unknown shape declares less."""
    nodes: dict[str, str] = {}
    edges: list[tuple[str, str]] = []
    try:
        participants = list(getattr(target, "_participants", None) or [target])
        names = [p.name for p in participants]
        for name in names:
            nodes[name] = "llm"
        follows = _speaker_edges(target, participants, names)
        if follows is not None:
            nodes[END_NODE] = "end"
            edges.extend(follows)
        after: dict[str, list[str]] = {}
        for a, b in edges:
            after.setdefault(a, []).append(b)
        for p in participants:
            # After a tool the agent calls the model again (reflection, more tool
            # iterations) or yields the turn; after a handoff its target speaks.
            loops = bool(getattr(p, "_reflect_on_tool_use", False)) or getattr(p, "_max_tool_iterations", 1) > 1
            then = [p.name] if loops else after.get(p.name, [])
            targets = {h.name: h.target for h in (getattr(p, "_handoffs", None) or {}).values()}
            for tool in list(getattr(p, "_tools", None) or []) + list(getattr(p, "_handoff_tools", None) or []):
                nodes.setdefault(tool.name, "tool")
                edges.append((p.name, tool.name))
                nxt_all = [targets[tool.name]] if targets.get(tool.name) in nodes else then
                for nxt in nxt_all:
                    if (tool.name, nxt) not in edges:
                        edges.append((tool.name, nxt))
    except Exception:
        _log_once("describe", "SAGA: could not read the structure of %s; declaring less", type(target).__name__,
                  exc_info=True)
    return list(nodes.items()), edges


def _speaker_edges(target, participants, names) -> list[tuple[str, str]] | None:
    """Who may speak after whom (plus "-> end"), or None when the team type does not say."""
    from autogen_agentchat.teams import GraphFlow, RoundRobinGroupChat, SelectorGroupChat, Swarm

    if not hasattr(target, "_participants"):  # a single agent: it speaks, then the run ends
        return [(names[0], END_NODE)]
    edges: list[tuple[str, str]] = []
    if isinstance(target, RoundRobinGroupChat):
        edges = [(a, names[(i + 1) % len(names)]) for i, a in enumerate(names)]
        return edges + [(a, END_NODE) for a in names]
    if isinstance(target, SelectorGroupChat):
        repeat = bool(getattr(target, "_allow_repeated_speaker", False))
        edges = [(a, b) for a in names for b in names if repeat or a != b]
        return edges + [(a, END_NODE) for a in names]
    if isinstance(target, Swarm):
        for p in participants:
            for handoff in (getattr(p, "_handoffs", None) or {}).values():
                if handoff.target in names:
                    edges.append((p.name, handoff.target))
        return edges + [(a, END_NODE) for a in names]
    if isinstance(target, GraphFlow):
        graph = target._graph
        for name, node in graph.nodes.items():
            for e in node.edges:
                edges.append((name, e.target))
            if not node.edges:
                edges.append((name, END_NODE))
        return edges
    return None


# -- sessions ------------------------------------------------------------------------------


class SagaSession:
    """An open SAGA session around one agent/team run; `session()` makes one.

    As an async context manager it starts the session, makes it current in the
    caller's context and binds it to the team's agents (for runtimes started
    elsewhere), and on exit ends it: "completed", "cancelled" (`CancelledError`,
    AutoGen's `CancellationToken` included) or "failed" (`saga_sdk.outcomes`).
    `run_stream` drives the same object step by step instead."""

    def __init__(self, target=None, *, session_id: str | None = None, tenant: str = "", workflow: str = "",
                 deadline_s: float | None = None, client: HintClient | None = None,
                 instrument_tools: bool = True) -> None:
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds, not {deadline_s!r}")
        self.target = target
        self.client = client or get_client()
        name = getattr(target, "name", "") if target is not None else ""
        self.context = SessionContext(session_id or new_session_id(), tenant or self.client.config.tenant,
                                      workflow or name or "autogen")
        self._deadline_s = deadline_s
        self._instrument = instrument_tools
        single = target is not None and not hasattr(target, "_participants")
        self._bound = _Bound(self.context, self.client, node=name if single else "")
        self._agent_key = getattr(target, "_team_id", None)
        self._state = "new"

    @property
    def session_id(self) -> str:
        return self.context.session_id

    def open(self) -> None:
        if self._state != "new":
            raise RuntimeError(f"this SAGA session is already {self._state}; open a new one per run")
        self._state = "open"
        if self._instrument:
            try:
                instrument()
            except Exception:
                _log_once("instrument", "SAGA: could not instrument AutoGen tools", exc_info=True)
        try:
            nodes, edges = describe(self.target) if self.target is not None else ([], [])
            ctx = self.context
            self.client.session_start(ctx.session_id, tenant=ctx.tenant, workflow=ctx.workflow,
                                      deadline_s=self._deadline_s, nodes=nodes, edges=edges)
            _by_session[ctx.session_id] = self._bound
            if self._agent_key:
                _by_agent_key[self._agent_key] = self._bound
        except Exception:
            _log_once("open", "SAGA: could not open a session for an AutoGen run; it runs unhinted", exc_info=True)

    def enter(self) -> Token:
        """Make the session current in this context; pass the token to `leave`."""
        return set_current_session(self.context)

    @staticmethod
    def leave(token: Token) -> None:
        try:
            reset_current_session(token)
        except ValueError:  # a stream finalised from another context: nothing of ours is current there
            pass

    def close(self, exc: BaseException | None = None) -> None:
        if self._state != "open":
            return
        self._state = "closed"
        try:
            if self._agent_key and _by_agent_key.get(self._agent_key) is self._bound:
                del _by_agent_key[self._agent_key]
            if _by_session.get(self.session_id) is self._bound:
                del _by_session[self.session_id]
            for cid, name in list(self._bound.open_tools.items()):
                if self._bound.open_tools.pop(cid, None) is not None:
                    self.client.tool_call_end(self.session_id, name, call_id=cid, outcome="cancelled")
            self.client.session_end(self.session_id, outcome=session_outcome_of(exc))
        except Exception:
            _log_once("close", "SAGA: could not end a session for an AutoGen run", exc_info=True)

    async def __aenter__(self) -> SessionContext:
        self.open()
        self._token = self.enter()
        return self.context

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self.leave(self._token)
        self.close(exc)


def session(target=None, **options) -> SagaSession:
    """`async with session(team, tenant=..., deadline_s=...) as ctx: await team.run(...)`.
    Options: `session_id`, `tenant`, `workflow` (default: the target's name),
    `deadline_s`, `client`, `instrument_tools` (default True)."""
    return SagaSession(target, **options)


async def run(target, *, task=None, cancellation_token: CancellationToken | None = None,
              session_id: str | None = None, tenant: str = "", workflow: str = "",
              deadline_s: float | None = None, client: HintClient | None = None, **run_kwargs):
    """`target.run(task=..., ...)` as one SAGA session; returns its `TaskResult`.
    Extra keyword arguments go to `target.run` unchanged."""
    async with SagaSession(target, session_id=session_id, tenant=tenant, workflow=workflow,
                           deadline_s=deadline_s, client=client):
        return await target.run(task=task, cancellation_token=cancellation_token, **run_kwargs)


async def run_stream(target, *, task=None, cancellation_token: CancellationToken | None = None,
                     session_id: str | None = None, tenant: str = "", workflow: str = "",
                     deadline_s: float | None = None, client: HintClient | None = None,
                     **run_kwargs) -> AsyncGenerator[Any, None]:
    """`target.run_stream(...)` as one SAGA session, yielding exactly what it yields.

    The session is current only while the run advances (inside each step of the
    stream), never in the consumer's code between items, so breaking out of the
    loop cannot leave it current. Close the stream (`contextlib.aclosing`) if you
    stop early: the session then ends as "cancelled"."""
    saga = SagaSession(target, session_id=session_id, tenant=tenant, workflow=workflow,
                       deadline_s=deadline_s, client=client)
    saga.open()
    token = saga.enter()
    try:  # creating the stream runs nothing yet, but keep it inside the session anyway
        stream = target.run_stream(task=task, cancellation_token=cancellation_token, **run_kwargs)
    except BaseException as exc:
        saga.leave(token)
        saga.close(exc)
        raise
    saga.leave(token)
    failure: BaseException | None = None
    try:
        async with contextlib.aclosing(stream):
            while True:
                token = saga.enter()
                try:
                    item = await stream.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    saga.leave(token)
                yield item
    except BaseException as exc:
        failure = exc
        raise
    finally:
        saga.close(failure)
