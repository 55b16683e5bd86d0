"""LangChain / LangGraph drop-in: every agent run becomes a SAGA session.

    from saga_sdk.integrations.langchain import SagaCallbackHandler
    agent.invoke(inputs, config={"callbacks": [SagaCallbackHandler()]})

or, with no code change at all, `SAGA_LANGCHAIN=1` in the environment once this module
is imported (the zero-code launcher imports it): the handler is then added to every
LangChain run through `register_configure_hook`.

What the handler sends (through `saga_sdk.get_client()` unless given a client):

| LangChain event | hint |
|---|---|
| the outermost run it sees starts | `session_start`: id = `session_id` or `thread_id` from the run's metadata / `configurable`, else the root run id; workflow = the handler's `workflow` or the root run's name; a LangGraph graph's declared nodes and edges, once per workflow per client |
| chat model / LLM call starts, ends | `llm_call_start`/`llm_call_end`: step = 1-based index of the call in the session, node = `langgraph_node` metadata (else the model's run name), token counts from `usage_metadata` |
| tool starts, ends, raises | `tool_call_start`/`tool_call_end`: tool name, `tool_call_id` (else the run id), outcome ok/error/cancelled (`saga_sdk.outcomes`; error also for a handled error, a ToolMessage with status "error"); optional category and expected duration (see `saga_tool_hint` and `tool_hints=`) |
| the outermost run ends / raises | `session_end` completed / failed / cancelled (`saga_sdk.outcomes`) |

The session id on the wire. Scheduling needs each LLM request to carry its session id,
and the handler sees the request only from the outside, so it makes the session current
(`saga_sdk.context`, a contextvar) for the whole run and, by default, turns on
`saga_sdk.integrations.openai.instrument()`: every model class built on the `openai`
package (`ChatOpenAI`, `AzureChatOpenAI` and the OpenAI-compatible providers) then sends
`X-Session-ID`, with no change to the user's model object. A model client that does not
use the `openai` package is not tagged: give it the id yourself (e.g. a default header
`X-Session-ID` built from `saga_sdk.current_session()`), or use `saga proxy`.
Pass `tag_requests=False` to leave the OpenAI SDK alone.

Contract: `run_inline = True` (callbacks run in the caller's context, so the contextvar
reaches the model call, also under `ainvoke`), thread-safe (parallel tool calls arrive
concurrently), and every callback body is isolated: a SAGA failure is logged once and
never reaches the user's chain. Hints never block: see `HintClient`.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import weakref
from contextvars import ContextVar
from typing import Any, Callable, Mapping, TypeVar
from uuid import UUID

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.tracers.context import register_configure_hook
except ImportError as exc:  # an optional extra: say which one
    raise ImportError("saga_sdk.integrations.langchain needs langchain-core: "
                      "pip install 'saga-agents[langchain]'") from exc

from ..client import HintClient, get_client
from ..context import SessionContext, current_session, reset_current_session, set_current_session
from ..logs import LogOnce
from ..outcomes import outcome_of, session_outcome_of

__all__ = ["SagaCallbackHandler", "saga_tool_hint", "describe_graph", "ENV_VAR"]

log = logging.getLogger("saga_sdk.langchain")
_log_once = LogOnce(log)

ENV_VAR = "SAGA_LANGCHAIN"

# Tool metadata keys read by the handler (set them with `saga_tool_hint`).
_DURATION_KEY = "saga_expected_duration_s"
_CATEGORY_KEY = "saga_tool_category"

_T = TypeVar("_T")


def saga_tool_hint(tool: _T = None, *, expected_duration_s: float | None = None,
                   category: str = "") -> _T:
    """Attach an expected duration and/or category to a LangChain tool; the handler
    sends them with the tool's start hint. Without one the server learns durations
    itself. Use as `saga_tool_hint(my_tool, expected_duration_s=2.0)` or as a
    decorator above `@tool`: `@saga_tool_hint(expected_duration_s=2.0)`."""
    if expected_duration_s is not None and not expected_duration_s > 0:
        raise ValueError(f"expected_duration_s must be > 0, got {expected_duration_s!r}")

    def apply(t):
        if not hasattr(t, "metadata"):
            raise TypeError(f"saga_tool_hint expects a LangChain tool (BaseTool), got {type(t).__name__}")
        meta = dict(t.metadata or {})  # merge: the tool's own metadata stays
        if expected_duration_s is not None:
            meta[_DURATION_KEY] = float(expected_duration_s)
        if category:
            meta[_CATEGORY_KEY] = category
        t.metadata = meta
        return t

    return apply if tool is None else apply(tool)


def describe_graph(graph: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(nodes, edges) of a compiled LangGraph graph as SAGA declares them.

    A node running a `ToolNode` (it has `tools_by_name`) is expanded into one "tool"
    node per tool, because the server's graph is keyed by tool name; `__end__` is the
    "end" node; `__start__` is dropped; every other node counts as an LLM node."""
    drawable = graph.get_graph()
    tools: dict[str, list[str]] = {}
    nodes: list[tuple[str, str]] = []
    for key, node in drawable.nodes.items():
        if key == "__start__":
            continue
        if key == "__end__":
            nodes.append((key, "end"))
            continue
        by_name = getattr(node.data, "tools_by_name", None)
        if isinstance(by_name, Mapping) and by_name:
            tools[key] = sorted(by_name)
            nodes.extend((name, "tool") for name in tools[key])
        else:
            nodes.append((key, "llm"))
    edges: list[tuple[str, str]] = []
    for e in drawable.edges:
        if e.source == "__start__":
            continue
        for src in tools.get(e.source, [e.source]):
            for dst in tools.get(e.target, [e.target]):
                if (src, dst) not in edges:
                    edges.append((src, dst))
    return nodes, edges


class _SessionBinding:
    """One live SAGA session bound to its root run: the context shared with the
    OpenAI patch, and the contextvar token to undo at the root's end."""

    __slots__ = ("ctx", "root", "token")

    def __init__(self, ctx: SessionContext, root: UUID) -> None:
        self.ctx, self.root, self.token = ctx, root, None


def _isolated(fn: Callable) -> Callable:
    """Run a callback body so that nothing it raises reaches LangChain (which would
    log it per call, or raise it with `raise_error`)."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            fn(self, *args, **kwargs)
        except Exception:
            _log_once(name, "SAGA LangChain handler failed in %s; hints may be incomplete", name, exc_info=True)
    return wrapper


class SagaCallbackHandler(BaseCallbackHandler):
    """Turns LangChain/LangGraph runs into SAGA hints. See the module docstring.

    client: the `HintClient` to use (default: `saga_sdk.get_client()`, from `SAGA_*`).
    workflow: workflow name for the server's per-workflow graph (default: root run name).
    tenant, deadline_s: passed on `session_start` (also read from the metadata keys
        `saga_tenant`, `saga_deadline_s` of the root run, which win).
    graph: a compiled LangGraph graph to declare; by default the handler finds the
        graph that started the root run by itself.
    tool_hints: {tool name: expected seconds} for tools without `saga_tool_hint`.
    tag_requests: turn on the OpenAI SDK patch (see the module docstring).
    """

    run_inline = True  # the caller's context: the session contextvar reaches the model call
    raise_error = False
    ignore_retriever = True
    ignore_custom_event = True
    ignore_retry = True

    def __init__(self, client: HintClient | None = None, *, workflow: str = "", tenant: str = "",
                 deadline_s: float | None = None, graph: Any = None,
                 tool_hints: Mapping[str, float] | None = None, tag_requests: bool = True) -> None:
        super().__init__()
        self._client = client
        self.workflow, self.tenant, self.deadline_s = workflow, tenant, deadline_s
        self._graph = graph
        self.tool_hints = dict(tool_hints or {})
        # run id -> the session it belongs to; every run of a session is here until it
        # ends. Plain dict operations are atomic under the GIL, so concurrent tools need
        # no lock; `_SessionBinding` objects are only read after creation.
        self._runs: dict[UUID, _SessionBinding] = {}
        # LLM run id -> (step, node, contextvar token if this call had to set it)
        self._llm: dict[UUID, tuple[int, str, Any]] = {}
        self._tools: dict[UUID, tuple[str, str]] = {}  # tool run id -> (name, call id)
        if tag_requests:
            try:
                from . import openai as _openai_patch

                _openai_patch.instrument()
            except Exception:
                _log_once("instrument", "could not patch the OpenAI SDK; requests carry no session id",
                          exc_info=True)

    @property
    def client(self) -> HintClient:
        return self._client if self._client is not None else get_client()

    # -- runs: a run with no parent known to us is a session root ------------------------

    def _enter(self, run_id: UUID, parent_run_id: UUID | None, metadata: dict | None,
               name: str, serialized: Any) -> _SessionBinding:
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is not None:
            self._runs[run_id] = parent
            return parent
        return self._start_session(run_id, metadata or {}, name, serialized)

    def _start_session(self, run_id: UUID, metadata: dict, name: str, serialized: Any) -> _SessionBinding:
        sid = str(metadata.get("session_id") or metadata.get("thread_id") or run_id)
        tenant = str(metadata.get("saga_tenant") or self.tenant)
        workflow = self.workflow or name or "langchain"
        deadline = metadata.get("saga_deadline_s", self.deadline_s)
        sess = _SessionBinding(SessionContext(sid, tenant, workflow), run_id)
        # Registered before anything that could fail, so that the children of this run
        # join it even then, instead of each becoming a session of its own.
        self._runs[run_id] = sess
        sess.token = set_current_session(sess.ctx)
        client = self.client
        nodes, edges = self._structure(client, workflow, serialized)
        client.session_start(sid, tenant=tenant, workflow=workflow,
                             deadline_s=float(deadline) if deadline is not None else None,
                             nodes=nodes, edges=edges)
        return sess

    def _exit(self, run_id: UUID, error: BaseException | None) -> None:
        sess = self._runs.pop(run_id, None)
        if sess is None or sess.root != run_id:
            return
        try:
            self.client.session_end(sess.ctx.session_id, outcome=session_outcome_of(error))
        finally:  # even if the hint failed, the user's context must not keep our session
            _restore(sess.token)
            # Runs of this session still open (a cancelled branch never reported its
            # end) must not keep it alive.
            for rid in [r for r, s in list(self._runs.items()) if s is sess]:
                self._runs.pop(rid, None)
                self._llm.pop(rid, None)
                self._tools.pop(rid, None)

    def _structure(self, client: HintClient, workflow: str, serialized: Any):
        """The graph's nodes and edges the first time this client sees `workflow`."""
        with _described_lock:
            seen = _described.setdefault(client, set())
            if workflow in seen:
                return (), ()
            seen.add(workflow)  # once, also when there is nothing to describe
        graph = self._graph if self._graph is not None else (_calling_graph() if serialized is None else None)
        if graph is None:
            return (), ()
        try:
            return describe_graph(graph)
        except Exception:
            _log_once("describe", "could not read the LangGraph structure of %r", workflow, exc_info=True)
            return (), ()

    # -- chains ---------------------------------------------------------------------------

    @_isolated
    def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, tags=None,
                       metadata=None, **kwargs) -> None:
        self._enter(run_id, parent_run_id, metadata, kwargs.get("name") or _name(serialized), serialized)

    @_isolated
    def on_chain_end(self, outputs, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._exit(run_id, None)

    @_isolated
    def on_chain_error(self, error, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._exit(run_id, error)

    # -- models ---------------------------------------------------------------------------

    @_isolated
    def on_chat_model_start(self, serialized, messages, *, run_id, parent_run_id=None, tags=None,
                            metadata=None, **kwargs) -> None:
        self._llm_start(serialized, run_id, parent_run_id, metadata, kwargs)

    @_isolated
    def on_llm_start(self, serialized, prompts, *, run_id, parent_run_id=None, tags=None,
                     metadata=None, **kwargs) -> None:
        self._llm_start(serialized, run_id, parent_run_id, metadata, kwargs)

    def _llm_start(self, serialized, run_id, parent_run_id, metadata, kwargs) -> None:
        name = kwargs.get("name") or _name(serialized)
        sess = self._enter(run_id, parent_run_id, metadata, name, serialized)
        node = str((metadata or {}).get("langgraph_node") or name or "llm")
        # Normally the root made the session current for everything below it; a model
        # called where that context did not reach (a thread without copy_context) gets
        # it here, in the context its HTTP request is about to be made from.
        token = None
        if current_session() is not sess.ctx:
            token = set_current_session(sess.ctx)
        step = sess.ctx.next_step()
        self._llm[run_id] = (step, node, token)
        self.client.llm_call_start(sess.ctx.session_id, step=step, node=node)

    @_isolated
    def on_llm_end(self, response, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._llm_end(run_id, response, None)

    @_isolated
    def on_llm_error(self, error, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._llm_end(run_id, None, error)

    def _llm_end(self, run_id: UUID, response, error) -> None:
        sess = self._runs.get(run_id)
        started = self._llm.pop(run_id, None)
        try:
            if sess is not None and started is not None:
                step, node, token = started
                try:
                    prompt_tokens, output_tokens = _usage(response)
                    self.client.llm_call_end(sess.ctx.session_id, step=step, node=node,
                                             prompt_tokens=prompt_tokens, output_tokens=output_tokens)
                finally:
                    _restore(token)
        finally:
            self._exit(run_id, error)

    # -- tools ----------------------------------------------------------------------------

    @_isolated
    def on_tool_start(self, serialized, input_str, *, run_id, parent_run_id=None, tags=None,
                      metadata=None, inputs=None, **kwargs) -> None:
        name = kwargs.get("name") or _name(serialized) or "tool"
        sess = self._enter(run_id, parent_run_id, metadata, name, serialized)
        meta = metadata or {}
        expected = meta.get(_DURATION_KEY, self.tool_hints.get(name))
        call_id = _call_id(kwargs, run_id)
        self._tools[run_id] = (name, call_id)
        self.client.tool_call_start(sess.ctx.session_id, name, call_id=call_id,
                                    category=str(meta.get(_CATEGORY_KEY) or ""),
                                    expected_duration_s=float(expected) if expected is not None else None)

    @_isolated
    def on_tool_end(self, output, *, run_id, parent_run_id=None, **kwargs) -> None:
        # A tool with `handle_tool_error` reports its failure as a normal end whose
        # ToolMessage has status "error": that is still a failed tool call.
        self._tool_end(run_id, "error" if getattr(output, "status", None) == "error" else "ok", None)

    @_isolated
    def on_tool_error(self, error, *, run_id, parent_run_id=None, **kwargs) -> None:
        self._tool_end(run_id, outcome_of(error), error)

    def _tool_end(self, run_id: UUID, outcome: str, error) -> None:
        sess = self._runs.get(run_id)
        started = self._tools.pop(run_id, None)
        try:
            if sess is not None and started is not None:
                name, call_id = started
                self.client.tool_call_end(sess.ctx.session_id, name, call_id=call_id, outcome=outcome)
        finally:
            self._exit(run_id, error)


# -- helpers ------------------------------------------------------------------------------

# client -> workflows whose structure it has sent (weak: clients come and go in tests)
_described: "weakref.WeakKeyDictionary[HintClient, set[str]]" = weakref.WeakKeyDictionary()
_described_lock = threading.Lock()


def _restore(token) -> None:
    if token is None:
        return
    try:
        reset_current_session(token)
    except ValueError:
        # The run ended in another context than it started in (e.g. a callback from
        # another thread): that context was a copy, so there is nothing to undo here.
        pass


def _name(serialized: Any) -> str:
    if isinstance(serialized, Mapping):
        if serialized.get("name"):
            return str(serialized["name"])
        ident = serialized.get("id")
        if isinstance(ident, (list, tuple)) and ident:
            return str(ident[-1])
    return ""


def _call_id(kwargs: Mapping[str, Any], run_id: UUID) -> str:
    return str(kwargs.get("tool_call_id") or run_id)


def _usage(response) -> tuple[int, int]:
    """(prompt, output) tokens of an `LLMResult`, 0 where the provider gave none."""
    if response is None:
        return 0, 0
    prompt = output = 0
    for gens in getattr(response, "generations", None) or ():
        for gen in gens:
            usage = getattr(getattr(gen, "message", None), "usage_metadata", None)
            if usage:
                prompt += int(usage.get("input_tokens") or 0)
                output += int(usage.get("output_tokens") or 0)
    if not (prompt or output):
        usage = (getattr(response, "llm_output", None) or {}).get("token_usage") or {}
        prompt, output = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return prompt, output


def _calling_graph(max_depth: int = 12) -> Any:
    """The LangGraph graph whose `stream`/`astream` is starting the root run.

    LangGraph starts its root run with `serialized=None`, so the callback never gets
    the graph object; it is, however, `self` in a frame a few levels up (sync and
    async alike: awaited coroutines keep their `f_back` chain). Walked once per
    workflow, so its cost (a few microseconds) does not recur."""
    try:
        from langgraph.pregel import Pregel
    except ImportError:
        return None
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Pregel):
            return candidate
        frame = frame.f_back
    return None


# -- zero-touch activation ------------------------------------------------------------------

# With SAGA_LANGCHAIN set (anything but ""/0/false), LangChain adds a handler to every
# run's callbacks at configure time; children inherit the root's handler, and its
# isinstance check keeps a user's own SagaCallbackHandler from being doubled.
_hook_var: ContextVar[SagaCallbackHandler | None] = ContextVar("saga_langchain_handler", default=None)
register_configure_hook(_hook_var, True, SagaCallbackHandler, ENV_VAR)
