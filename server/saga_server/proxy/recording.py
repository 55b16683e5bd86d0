"""`saga proxy --record`: the proxy's hints, read as recorder facts.

`SagaProxy` hands every batch of `Hint`s it emits to its recorder
(`Recorder.submit`, which only enqueues); on the recorder's thread `feed_hints`
reads them into `TraceBuilder` facts: the core event's own fields (steps, token
counts, tool names and call ids, categories of text actions, a session's tenant)
and the hint's `HintFacts` (what the history continues, sizes, cached tokens, why a
session ended). A session the tracker ends for being idle arrives with `end_reason`
"idle" and is written `truncated`. The flags are `saga_server.record.options`'.

    saga proxy --upstream URL --record agents.jsonl [--record-hash-tools] [--record-max-bytes N]
    saga bench --what-if agents.jsonl --gpu h100-80gb --model llama3-8b --workers 4
"""

from __future__ import annotations

import argparse
from typing import Iterable

from saga_server.core.events import LlmCallEnd, LlmCallStart, SessionEnd, SessionStart, ToolCallEnd, ToolCallStart
from saga_server.record import RecordConfig, Recorder, TraceBuilder

from .hints import Hint

__all__ = ["feed_hints", "from_args", "proxy_recorder"]


def feed_hints(builder: TraceBuilder, t: float, hints: Iterable[Hint]) -> None:
    for hint in hints:
        event, facts = hint.event, hint.facts
        match event:
            case SessionStart(session_id=sid):
                builder.session_start(sid, t, workflow=event.workflow, tenant=event.tenant, parent=event.parent_id)
            case LlmCallStart(session_id=sid):
                builder.llm_start(sid, t, step=event.step, extends=facts.extends, prompt_chars=facts.prompt_chars,
                                  model=facts.model)
            case LlmCallEnd(session_id=sid):
                builder.llm_end(sid, t, step=event.step, prompt_tokens=event.prompt_tokens,
                                output_tokens=event.output_tokens, cached_tokens=facts.cached_tokens,
                                output_chars=facts.output_chars, failed=facts.failed)
            case ToolCallStart(session_id=sid):
                builder.tool_start(sid, t, name=event.tool, call_id=event.call_id, category=event.category)
            case ToolCallEnd(session_id=sid):
                builder.tool_end(sid, t, call_id=event.call_id)
            case SessionEnd(session_id=sid):
                builder.session_end(sid, t, reason=facts.end_reason)


def proxy_recorder(path: str, *, hash_tools: bool = False, max_bytes: int | None = None,
                   idle_s: float = 3600.0, **config) -> Recorder:
    """A `Recorder` of the proxy's sessions into `path` (`RecordConfig` fields in `config`)."""
    return Recorder(RecordConfig(path, hash_tools=hash_tools, max_bytes=max_bytes, idle_s=idle_s,
                                 source="saga proxy", **config), feed_hints)


def from_args(args: argparse.Namespace) -> Recorder | None:
    """The recorder `saga proxy`'s flags ask for, or None. Raises `OSError` for a
    file that cannot be written, `ValueError` for a bad size."""
    if not args.record:
        return None
    # A session the tracker has long given up on (its end lost) is written anyway.
    return proxy_recorder(args.record, hash_tools=args.record_hash_tools, max_bytes=args.record_max_bytes,
                          idle_s=2 * args.idle_ttl_s + 60)
