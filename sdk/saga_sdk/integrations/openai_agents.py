"""SAGA hints from OpenAI Agents SDK (`openai-agents`, import name `agents`) runs.

    from saga_sdk.integrations.openai_agents import run

    result = await run(agent, "book me a flight", tenant="acme", deadline_s=120)
    # Runner.run's own keyword arguments pass through: context=, max_turns=, hooks=, run_config=...

or around the `Runner` call you already have (streamed runs too):

    async with session(agent, tenant="acme") as saga:      # `with` works as well
        result = await Runner.run(agent, "book me a flight", hooks=saga.hooks)

A run becomes one SAGA session:

| Agents SDK event | hint |
|---|---|
| the session opens (`run`, `run_sync`, `session`) | `session_start`: workflow = the starting agent's name; declared structure from `describe`: every agent reachable through handoffs ("llm"), their tools ("tool"), "end"; edges agent -> tool, tool -> agent (or -> end where `tool_use_behavior` stops the run), agent -> handoff target, agent -> end |
| `on_llm_start` / `on_llm_end` | `llm_call_start` / `llm_call_end`: 1-based step in the session, node = the agent's name (so a handoff shows as the next step's node), token usage of the response |
| `on_tool_start` / `on_tool_end` | `tool_call_start` / `tool_call_end`: tool name, the model's `tool_call_id`; outcome "error" when the result is the SDK's own failure message (a tool that raised, reported to the model by the default `failure_error_function`), else "ok" |
| the session closes | tools still open end as the run did ("error" when it failed, else "cancelled"), then `session_end` completed / failed / cancelled (`saga_sdk.outcomes`) |

Every model request of the run carries the session id as `X-Session-ID`, for the
Responses and the Chat Completions models alike: the session is current
(`saga_sdk.context`) for the whole run and `saga_sdk.integrations.openai.instrument()`
tags the OpenAI SDK calls both models make (`responses.create`, its streaming form,
`chat.completions.create`). An agent used as a tool runs inside the same session;
give it the run's hooks (`hooks = SagaRunHooks()`, `agent.as_tool(..., hooks=hooks)`,
`run(..., hooks=hooks)`) and its model calls are hinted too, named after it.

Why run hooks and not a tracing processor. Both see LLM and tool boundaries; only the
run hooks see them with the run's context, every time:
  * the hooks are passed per run and always called; a `TracingProcessor` is global and
    receives nothing when tracing is off (`RunConfig(tracing_disabled=True)`,
    `set_tracing_disabled`, `OPENAI_AGENTS_DISABLE_TRACING`), which is the usual setting
    against a local OpenAI-compatible server;
  * `on_tool_start`/`on_tool_end` get a `ToolContext` with the model's `tool_call_id`
    (what pairs parallel calls of one tool, and what the proxy and the server see);
    a function span carries only the tool's name;
  * a trace is not a run: a caller's `with trace(...)` spans several runs, and nested
    agent-as-tool runs share their parent's trace.
What neither can do is put the session id on the model requests: the SDK runs every
hook in a task of its own (`gather_with_cancel`), so nothing a hook sets in a
contextvar reaches the model call. That is why the session is made current around
`Runner.run` by `run` / `session` instead; `SagaRunHooks` alone hints into whatever
session is current where `Runner.run` was called (e.g. `with hints.session(...)`).

Not switched on by `saga run`'s zero-code bootstrap, unlike LangChain's: that one is a
single import registering a hook LangChain documents for the purpose, while the Agents
SDK takes run hooks only as a `Runner.run` argument, so switching them on without code
would mean patching `Runner.run`, `run_sync` and `run_streamed` (over the internal
`AgentRunner`); its one global registration, `add_trace_processor`, is the tracing
processor above. An agent left unchanged is covered by `saga proxy` instead (Chat
Completions models; the proxy reads no Responses-API requests yet).

Contract: no hook ever raises into the SDK or blocks the run (a SAGA failure is logged
once and the run proceeds unhinted; hints go to `HintClient`'s queue), and nothing the
agent sees changes. A user's own `RunHooks` passed as `hooks=` still get every call.
"""

from __future__ import annotations

import logging
from contextvars import Token
from typing import Any, Mapping

try:
    from agents import Agent, Handoff, RunHooks, Runner, default_tool_error_function
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("saga_sdk.integrations.openai_agents needs the OpenAI Agents SDK: "
                      "pip install 'saga-agents[agents]'") from exc

from ..client import HintClient, get_client
from ..context import SessionContext, current_session, new_session_id, reset_current_session, set_current_session
from ..logs import LogOnce
from ..outcomes import outcome_of, session_outcome_of

__all__ = ["SagaRunHooks", "SagaSession", "describe", "run", "run_sync", "session"]

log = logging.getLogger("saga_sdk.openai_agents")
_log_once = LogOnce(log)

END_NODE = "end"


def _default_failure_message() -> str:
    try:
        return default_tool_error_function(None, Exception())
    except Exception:  # a future formatter that reads its arguments: no error detection
        return ""


# What the SDK returns to the model in place of a tool's exception (its default
# `failure_error_function`); a tool answering that failed, as far as SAGA goes.
_FAILURE_MESSAGE = _default_failure_message()


class SagaRunHooks(RunHooks[Any]):
    """`RunHooks` that hint a run into the SAGA session current where `Runner.run` was
    called (see the module docstring). `SagaSession.hooks` is one, ready to pass.

    inner: the caller's own `RunHooks`; each of its callbacks runs after ours, and what
        it raises reaches the run exactly as it would without SAGA.
    client: the `HintClient` (default `saga_sdk.get_client()`).
    tag_requests: turn on the OpenAI SDK patch, so model requests carry the session id.
    """

    def __init__(self, inner: RunHooks | None = None, *, client: HintClient | None = None,
                 tag_requests: bool = True) -> None:
        self.inner = inner
        self._client = client
        # id(the run's RunContextWrapper) -> (session id, step, node): one model call at a
        # time per run, and a nested agent-as-tool run has a wrapper of its own.
        self._llm: dict[int, tuple[str, int, str]] = {}
        # (session id, call id) -> tool name, for the tool calls started and not yet ended.
        self._tools: dict[tuple[str, str], str] = {}
        if tag_requests:
            _instrument_openai()

    @property
    def client(self) -> HintClient:
        return self._client if self._client is not None else get_client()

    # -- the SDK's callbacks: ours first (isolated), then the caller's -----------------

    async def on_llm_start(self, context, agent, system_prompt, input_items) -> None:
        _isolated("llm_start", self._llm_start, context, agent)
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(self, context, agent, response) -> None:
        _isolated("llm_end", self._llm_end, context, response)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    async def on_tool_start(self, context, agent, tool) -> None:
        _isolated("tool_start", self._tool_start, context, tool)
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context, agent, tool, result) -> None:
        _isolated("tool_end", self._tool_end, context, tool, result)
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)

    async def on_agent_start(self, context, agent) -> None:
        if self.inner is not None:
            await self.inner.on_agent_start(context, agent)

    async def on_agent_end(self, context, agent, output) -> None:
        if self.inner is not None:
            await self.inner.on_agent_end(context, agent, output)

    async def on_handoff(self, context, from_agent, to_agent) -> None:
        # Nothing to send: the next model call is hinted under the new agent's name,
        # and the handoff edges were declared when the session started.
        if self.inner is not None:
            await self.inner.on_handoff(context, from_agent, to_agent)

    # -- hints ---------------------------------------------------------------------------

    def _llm_start(self, context, agent) -> None:
        ctx = _session()
        if ctx is None:
            return
        step, node = ctx.next_step(), str(getattr(agent, "name", "") or "")
        self._llm[id(context)] = (ctx.session_id, step, node)
        self.client.llm_call_start(ctx.session_id, step=step, node=node)

    def _llm_end(self, context, response) -> None:
        started = self._llm.pop(id(context), None)
        if started is None:
            return
        sid, step, node = started
        usage = getattr(response, "usage", None)
        self.client.llm_call_end(sid, step=step, node=node,
                                 prompt_tokens=int(getattr(usage, "input_tokens", 0) or 0),
                                 output_tokens=int(getattr(usage, "output_tokens", 0) or 0))

    def _tool_start(self, context, tool) -> None:
        ctx = _session()
        if ctx is None:
            return
        name, call_id = _tool_name(tool), _call_id(context, tool)
        self._tools[(ctx.session_id, call_id)] = name
        self.client.tool_call_start(ctx.session_id, name, call_id=call_id)

    def _tool_end(self, context, tool, result) -> None:
        ctx = _session()
        if ctx is None:
            return
        call_id = _call_id(context, tool)
        name = self._tools.pop((ctx.session_id, call_id), None)
        if name is None:
            return  # never started here, or the session already ended it
        failed = isinstance(result, str) and bool(_FAILURE_MESSAGE) and result == _FAILURE_MESSAGE
        self.client.tool_call_end(ctx.session_id, name, call_id=call_id, outcome="error" if failed else "ok")

    def end_open_calls(self, session_id: str, outcome: str) -> None:
        """End the tool calls of `session_id` still open (its run stopped inside them),
        so that a late `on_tool_end` sends nothing after the session's end; drop its
        unfinished model calls."""
        for key in [k for k in list(self._tools) if k[0] == session_id]:
            name = self._tools.pop(key, None)
            if name is not None:
                self.client.tool_call_end(session_id, name, call_id=key[1], outcome=outcome)
        for key in [k for k, v in list(self._llm.items()) if v[0] == session_id]:
            self._llm.pop(key, None)


class SagaSession:
    """One SAGA session around one Agents SDK run; `session()` makes one.

    As a context manager (`with` or `async with`) it starts the session, makes it
    current in the caller's context for the run, and on exit ends it: "completed",
    "cancelled" or "failed" (`saga_sdk.outcomes`). Pass `hooks` (a `SagaRunHooks`)
    to the `Runner` call made inside it; consume a `Runner.run_streamed` stream inside
    it too, since the session ends with the block.

    agent: the starting agent (names the workflow, declares the structure).
    hooks: the caller's own `RunHooks`, kept inside `hooks`; or a `SagaRunHooks`, which
        becomes `hooks` (pass the same one to `agent.as_tool(..., hooks=...)`).
    session_id, tenant, workflow, deadline_s: as `HintClient.session_start` takes them.
    client: the `HintClient` (default `saga_sdk.get_client()`).
    tag_requests: turn on the OpenAI SDK patch (model requests carry the session id).
    """

    def __init__(self, agent: Agent | None = None, *, hooks: RunHooks | None = None, session_id: str | None = None,
                 tenant: str = "", workflow: str = "", deadline_s: float | None = None,
                 client: HintClient | None = None, tag_requests: bool = True) -> None:
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds, not {deadline_s!r}")
        self.agent = agent
        self.client = client or get_client()
        name = str(getattr(agent, "name", "") or "") if agent is not None else ""
        self.context = SessionContext(session_id or new_session_id(), tenant or self.client.config.tenant,
                                      workflow or name or "openai-agents")
        # A `SagaRunHooks` given here is used as it is (also what nested agent-as-tool
        # runs were given), rather than wrapped in a second one that would hint twice.
        self.hooks = hooks if isinstance(hooks, SagaRunHooks) else SagaRunHooks(hooks, client=self.client,
                                                                                 tag_requests=tag_requests)
        self._deadline_s = deadline_s
        self._token: Token | None = None
        self._state = "new"

    @property
    def session_id(self) -> str:
        return self.context.session_id

    def open(self) -> None:
        """Start the session and make it current in this context."""
        if self._state != "new":
            raise RuntimeError(f"this SAGA session is already {self._state}; open a new one per run")
        self._state = "open"
        self._token = set_current_session(self.context)
        try:
            nodes, edges = describe(self.agent) if self.agent is not None else ([], [])
            ctx = self.context
            self.client.session_start(ctx.session_id, tenant=ctx.tenant, workflow=ctx.workflow,
                                      deadline_s=self._deadline_s, nodes=nodes, edges=edges)
        except Exception:
            _log_once("open", "SAGA: could not start a session for an Agents SDK run; it runs unhinted",
                      exc_info=True)

    def close(self, exc: BaseException | None = None) -> None:
        """End the session (outcome from `exc`) and stop it being current."""
        if self._state != "open":
            return
        self._state = "closed"
        try:
            reset_current_session(self._token)
        except ValueError:  # closed from another context than it was opened in: nothing current there
            pass
        try:
            self.hooks.end_open_calls(self.session_id, outcome_of(exc) if exc is not None else "cancelled")
            self.client.session_end(self.session_id, outcome=session_outcome_of(exc))
        except Exception:
            _log_once("close", "SAGA: could not end a session for an Agents SDK run", exc_info=True)

    def __enter__(self) -> "SagaSession":
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exc)

    async def __aenter__(self) -> "SagaSession":
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self.close(exc)


def session(agent: Agent | None = None, **options) -> SagaSession:
    """`async with session(agent, tenant=...) as saga: await Runner.run(agent, x, hooks=saga.hooks)`.
    Options: `hooks`, `session_id`, `tenant`, `workflow`, `deadline_s`, `client`, `tag_requests`."""
    return SagaSession(agent, **options)


async def run(agent: Agent, input, *, hooks: RunHooks | None = None, session_id: str | None = None,
              tenant: str = "", workflow: str = "", deadline_s: float | None = None,
              client: HintClient | None = None, **runner_kwargs):
    """`Runner.run(agent, input, ...)` as one SAGA session; returns its `RunResult`.
    Other keyword arguments go to `Runner.run` unchanged; `hooks` still get every call."""
    with SagaSession(agent, hooks=hooks, session_id=session_id, tenant=tenant, workflow=workflow,
                     deadline_s=deadline_s, client=client) as saga:
        return await Runner.run(agent, input, hooks=saga.hooks, **runner_kwargs)


def run_sync(agent: Agent, input, *, hooks: RunHooks | None = None, session_id: str | None = None,
             tenant: str = "", workflow: str = "", deadline_s: float | None = None,
             client: HintClient | None = None, **runner_kwargs):
    """`Runner.run_sync(...)` as one SAGA session (the loop it starts inherits the session)."""
    with SagaSession(agent, hooks=hooks, session_id=session_id, tenant=tenant, workflow=workflow,
                     deadline_s=deadline_s, client=client) as saga:
        return Runner.run_sync(agent, input, hooks=saga.hooks, **runner_kwargs)


# -- declared structure ------------------------------------------------------------------


def describe(agent: Agent) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The declared structure of a run starting at `agent`: `(nodes, edges)` for
    `HintClient.session_start` (see the module docstring). Agents are found through
    their handoffs (an `Agent`, or a `Handoff` made by `handoff()`, which remembers
    its agent; any other `Handoff` declares its target by name only). Never raises:
    an unknown shape declares less."""
    nodes: dict[str, str] = {}
    edges: list[tuple[str, str]] = []

    def edge(a: str, b: str) -> None:
        if (a, b) not in edges:
            edges.append((a, b))

    try:
        pending, seen = [agent], set()
        while pending:
            current = pending.pop(0)
            if id(current) in seen:
                continue
            seen.add(id(current))
            name = current.name
            nodes.setdefault(name, "llm")
            for tool in list(getattr(current, "tools", None) or []):
                tool_name = _tool_name(tool)
                nodes.setdefault(tool_name, "tool")
                edge(name, tool_name)
                for after in _after_tool(current, tool_name):
                    edge(tool_name, after)
            for target in list(getattr(current, "handoffs", None) or []):
                target_agent, target_name = _handoff_target(target)
                if not target_name:
                    continue
                nodes.setdefault(target_name, "llm")
                edge(name, target_name)
                if target_agent is not None:
                    pending.append(target_agent)
            edge(name, END_NODE)  # any agent may give the final output
    except Exception:
        _log_once("describe", "SAGA: could not read the structure of agent %r; declaring less",
                  getattr(agent, "name", agent), exc_info=True)
    if any(b == END_NODE for _, b in edges):
        nodes[END_NODE] = "end"
    return list(nodes.items()), edges


def _after_tool(agent: Agent, tool_name: str) -> list[str]:
    """Where a run goes after `agent` ran `tool_name`, by its `tool_use_behavior`."""
    behavior = getattr(agent, "tool_use_behavior", "run_llm_again")
    if behavior == "run_llm_again":
        return [agent.name]
    if behavior == "stop_on_first_tool":
        return [END_NODE]
    if isinstance(behavior, Mapping):  # StopAtTools
        return [END_NODE] if tool_name in (behavior.get("stop_at_tool_names") or ()) else [agent.name]
    return [agent.name, END_NODE]  # a function decides at run time


def _handoff_target(target) -> tuple[Agent | None, str]:
    if isinstance(target, Agent):
        return target, target.name
    if isinstance(target, Handoff):
        ref = getattr(target, "_agent_ref", None)  # set by `handoff()`; absent on a hand-made Handoff
        agent = ref() if callable(ref) else None
        return (agent if isinstance(agent, Agent) else None), str(target.agent_name or "")
    return None, ""


# -- helpers -----------------------------------------------------------------------------


def _session() -> SessionContext | None:
    ctx = current_session()
    if ctx is None:
        _log_once("no_session", "SAGA: an Agents SDK run with SagaRunHooks has no current SAGA session; "
                  "use saga_sdk.integrations.openai_agents.run() or session() so that it has one")
    return ctx


def _tool_name(tool) -> str:
    return str(getattr(tool, "name", "") or type(tool).__name__)


def _call_id(context, tool) -> str:
    """The model's call id (function tools get a `ToolContext`); other local tools
    (shell, computer, apply-patch) get the run's wrapper, so their start and end pair by
    that wrapper and the tool's name."""
    call_id = getattr(context, "tool_call_id", None)
    return str(call_id) if call_id else f"{_tool_name(tool)}-{id(context):x}"


def _isolated(key: str, fn, *args) -> None:
    try:
        fn(*args)
    except Exception:
        _log_once(key, "SAGA: an Agents SDK %s hook failed; hints may be incomplete", key, exc_info=True)


def _instrument_openai() -> None:
    try:
        from . import openai as _openai_patch

        _openai_patch.instrument()
    except Exception:
        _log_once("instrument", "SAGA: could not patch the OpenAI SDK; model requests carry no session id",
                  exc_info=True)
