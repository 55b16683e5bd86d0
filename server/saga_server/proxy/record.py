"""`saga proxy --record`: the proxy's hints, read as recorder facts.

`SagaProxy` hands every batch of `HintEvent`s it emits to its recorder
(`Recorder.submit`, which only enqueues); on the recorder's thread `feed_hints`
reads them into `TraceBuilder` facts: the hint's own fields (steps, token counts,
tool names and call ids, categories of text actions, a session's tenant) and its
`facts` (what the history continues, sizes, cached tokens, why a session ended).
A session the tracker ends for being idle arrives with `reason` "idle" and is
written `truncated`. The flags are `saga_server.record.options`'.

    saga proxy --upstream URL --record agents.jsonl [--record-hash-tools] [--record-max-bytes N]
    saga bench --what-if agents.jsonl --gpu h100-80gb --model llama3-8b --workers 4
"""

from __future__ import annotations

import argparse
from typing import Iterable

from saga_server.record import RecordConfig, Recorder, TraceBuilder

from .sessions import HintEvent

__all__ = ["feed_hints", "from_args", "proxy_recorder"]


def feed_hints(builder: TraceBuilder, t: float, events: Iterable[HintEvent]) -> None:
    for event in events:
        sid, args, facts = event.session_id, event.args, event.facts
        if event.kind == "session_start":
            builder.session_start(sid, t, workflow=str(args.get("workflow", "")),
                                  tenant=str(args.get("tenant", "")))
        elif event.kind == "llm_call_start":
            builder.llm_start(sid, t, step=int(args.get("step", 0)), extends=facts.get("extends", ""),
                              prompt_chars=int(facts.get("prompt_chars", 0)), model=facts.get("model", ""))
        elif event.kind == "llm_call_end":
            builder.llm_end(sid, t, step=int(args.get("step", 0)), prompt_tokens=int(args.get("prompt_tokens", 0)),
                            output_tokens=int(args.get("output_tokens", 0)),
                            cached_tokens=facts.get("cached_tokens"), output_chars=int(facts.get("output_chars", 0)),
                            failed=bool(facts.get("failed", False)))
        elif event.kind == "tool_call_start":
            builder.tool_start(sid, t, name=str(args.get("tool", "")), call_id=str(args.get("call_id", "")),
                               category=str(args.get("category", "")))
        elif event.kind == "tool_call_end":
            builder.tool_end(sid, t, call_id=str(args.get("call_id", "")))
        elif event.kind == "session_end":
            builder.session_end(sid, t, reason=str(facts.get("reason", "")))


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
