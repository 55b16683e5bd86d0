"""`saga serve --record`: what the engine sees of each session, as `saga-trace/1` tasks.

The recorder lives where the plugin's data is, in vLLM's EngineCore process:
`SagaPlugin` starts one when `SAGA_RECORD` names a file (`saga serve --record FILE`
sets it and the rest of `saga_server.record.options`' environment; an own vLLM
launch sets them itself). On the engine loop `EngineRecording` only puts a small
tuple of what the plugin already holds on the recorder's queue (ids, counts, and
references to the request's token ids and vLLM's block hashes, never copied); the
hint thread does the same with the hints the hint service accepted. On the
recorder's thread `EngineFeed` reads them into `TraceBuilder` facts:

- a session's request arrives (`add_request`): an LLM call starts, numbered after
  the session's last; what it reuses is the leading tokens it shares with the
  previous call's prompt plus answer (vLLM's block hashes, or without prefix
  caching hashes of its own, then token by token);
- it is first scheduled: its prefix-cache hit, the cached tokens as vLLM serves
  them (`usage.prompt_tokens_details.cached_tokens`);
- it finishes (its blocks are freed): its prompt and output tokens; an aborted or
  failed call is counted (`failed_calls`), not a step; the LLM latency is the
  engine's, from arrival to the last token;
- hints: a session's start (workflow, and its tenant as the core holds it: the
  key's, with keys), tool calls (name, category, call id; the duration written is
  the gap from the answer to the next request, `TraceBuilder`'s rule), its end
  (the hint's outcome: an in-band end). LLM-call hints tell nothing the engine
  did not see.

A session's first request opens its task as well as its start hint does (either may
come first: hints and requests travel apart), and the request's `vllm_xargs.tenant`
stands in for a tenant no hint gave. Requests without a session and SAGA's own
prefetches are not recorded. A session the engine forgets without an end (idle
past the core's time, or evicted from its full table) is written then, as
`expired` or `evicted`; one the recorder hears nothing of for `idle_s` (default:
the core's session idle TTL) as `recorder_idle`; both `truncated`.
A recorder that cannot start (an unwritable file, a bad variable) is logged, and
the engine serves without it.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from typing import Any, NamedTuple, Sequence

from vllm.v1.request import Request, RequestStatus

from saga_server.core import HintEvent, SessionEnd, SessionStart, ToolCallEnd, ToolCallStart
from saga_server.core.sessions import Departure
from saga_server.record import Recorder, TokenBlocks, TraceBuilder, block_hashes
from saga_server.record.options import config_from_env

from .request_meta import RequestMeta

# Under "vllm." so vLLM's own log handler (and level) shows these lines.
log = logging.getLogger("vllm.saga")

__all__ = ["EngineFeed", "EngineRecording", "SOURCE"]

SOURCE = "saga serve"
_MAX_WAIT_S = 600.0  # a wall-clock step (NTP) must not move a call start by more
_RECORDED_HINTS = (SessionStart, ToolCallStart, ToolCallEnd, SessionEnd)
_FAILED = frozenset((RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR, RequestStatus.FINISHED_IGNORED))


class _Arrival(NamedTuple):
    request_id: str
    session_id: str
    tenant: str
    tokens: Sequence[int]   # the prompt's ids (vLLM's list)
    blocks: Sequence[Any]   # vLLM's block hashes of the request (grows as it decodes)
    waited_s: float         # since the API server took it in (the engine loop sees it a step later)
    parent: str = ""        # the parent session its request named


class _Scheduled(NamedTuple):
    request_id: str
    cached: int


class _Forgotten(NamedTuple):
    session_id: str
    how: Departure          # EXPIRED or EVICTED (the core's session table)


class _Finished(NamedTuple):
    request_id: str
    prompt_tokens: int
    output_tokens: int
    failed: bool
    tokens: Sequence[int]   # prompt and answer
    blocks: Sequence[Any]


class _Hint(NamedTuple):
    event: HintEvent
    tenant: str


class EngineFeed:
    """The recorder thread's reading of the plugin's items (see the module docstring).
    Keeps each request in flight (at most `max_requests`, oldest forgotten first)."""

    def __init__(self, block_size: int, model: str = "", max_requests: int = 100_000) -> None:
        self.block_size = block_size
        self.model = model
        self.max_requests = max_requests
        self._calls: OrderedDict[str, list] = OrderedDict()  # request id -> [session, step, cached]

    def __call__(self, builder: TraceBuilder, t: float, item: Any) -> None:
        if isinstance(item, _Arrival):
            sid = item.session_id
            builder.session_start(sid, t, tenant=item.tenant, restart=False, parent=item.parent)
            step = builder.llm_start(sid, t - item.waited_s, model=self.model, tokens=self._tokens(item))
            self._calls[item.request_id] = [sid, step, None]
            while len(self._calls) > self.max_requests:
                self._calls.popitem(last=False)
        elif isinstance(item, _Scheduled):
            call = self._calls.get(item.request_id)
            if call is not None:
                call[2] = item.cached
        elif isinstance(item, _Finished):
            call = self._calls.pop(item.request_id, None)
            if call is not None:
                sid, step, cached = call
                builder.llm_end(sid, t, step=step, prompt_tokens=item.prompt_tokens,
                                output_tokens=item.output_tokens, cached_tokens=cached, failed=item.failed,
                                tokens=self._tokens(item))
        elif isinstance(item, _Hint):
            _feed_hint(builder, t, item.event, item.tenant)
        elif isinstance(item, _Forgotten):
            builder.session_end(item.session_id, t, reason=item.how)

    def _tokens(self, item: _Arrival | _Finished) -> TokenBlocks:
        # vLLM hashes blocks only with prefix caching (or a KV connector) on
        blocks = item.blocks or block_hashes(item.tokens, self.block_size)
        return TokenBlocks(item.tokens, blocks, self.block_size)


def _feed_hint(builder: TraceBuilder, t: float, event: HintEvent, tenant: str) -> None:
    sid = event.session_id
    if isinstance(event, SessionStart):
        builder.session_start(sid, t, workflow=event.workflow, tenant=tenant, restart=False, parent=event.parent_id)
    elif isinstance(event, ToolCallStart):
        builder.tool_start(sid, t, name=event.tool, call_id=event.call_id, category=event.category)
    elif isinstance(event, ToolCallEnd):
        builder.tool_end(sid, t, call_id=event.call_id, name=event.tool)
    elif isinstance(event, SessionEnd):
        builder.session_end(sid, t, reason=event.outcome.value)


class EngineRecording:
    """The plugin's side: each method enqueues one item and returns (never raises,
    never blocks; a full queue drops it, counted in `recorder.stats()`)."""

    def __init__(self, recorder: Recorder, core) -> None:
        self.recorder = recorder
        self._core = core

    @classmethod
    def from_env(cls, scheduler, core, clock=time.monotonic, environ=os.environ) -> EngineRecording | None:
        """The recording `SAGA_RECORD*` asks for in this engine process, on the
        plugin's clock, or None (none asked for, or it cannot start: logged)."""
        try:
            config = config_from_env(environ, source=SOURCE, idle_s=core.table.idle_ttl_s)
            if config is None:
                return None
            model = getattr(scheduler.vllm_config.model_config, "served_model_name", "") or ""
            feed = EngineFeed(getattr(scheduler, "hash_block_size", None) or scheduler.block_size,
                              model if isinstance(model, str) else model[0])
            recorder = Recorder(config, feed, clock=clock)
        except (OSError, ValueError) as exc:
            log.error("SAGA: not recording (%s)", exc)
            return None
        log.info("SAGA recording sessions to %s (in EngineCore pid %d)", config.path, os.getpid())
        return cls(recorder, core)

    # -- the engine loop ------------------------------------------------------------

    def arrival(self, request: Request, meta: RequestMeta) -> None:
        # A request reaches the engine loop only between steps, and a CPU prefill step
        # takes seconds: the call started when the API server took it in (vLLM's
        # `arrival_time`, wall clock), or tool gaps would absorb that wait.
        waited = min(max(0.0, time.time() - request.arrival_time), _MAX_WAIT_S)
        self.recorder.submit(_Arrival(request.request_id, meta.session_id, meta.tenant,
                                      request.prompt_token_ids or (), request.block_hashes, waited,
                                      meta.parent_id or ""))

    def scheduled(self, request_id: str, cached: int) -> None:
        self.recorder.submit(_Scheduled(request_id, cached))

    def finished(self, request: Request) -> None:
        self.recorder.submit(_Finished(request.request_id, request.num_prompt_tokens, request.num_output_tokens,
                                       request.status in _FAILED, request.all_token_ids, request.block_hashes))

    def forgotten(self, session_id: str, how: Departure) -> None:
        """The engine forgot the session (`SessionKvPolicy.on_forget`): one that stopped
        without an end is written now. An ended one was written by its end hint; a
        moved one goes on at another engine."""
        if how in (Departure.EXPIRED, Departure.EVICTED):
            self.recorder.submit(_Forgotten(session_id, how))

    # -- the hint thread ------------------------------------------------------------

    def hint(self, event: HintEvent) -> None:
        """A hint the core accepted."""
        if isinstance(event, _RECORDED_HINTS):
            tenant = self._core.tenant_of(event.session_id) if isinstance(event, SessionStart) else ""
            self.recorder.submit(_Hint(event, tenant))

    def close(self) -> None:
        """Write every open session ("closed") and stop the recorder."""
        self.recorder.close()
