"""`TraceBuilder`: one agent session's facts in, one `saga-trace/1` task out.

A front door (the proxy, the engine) tells the builder what it saw of each
session, with the time it saw it: LLM calls starting and ending (token counts,
cached tokens, what the history continues, or the tokens themselves as an engine
holds them), tool calls starting and ending, the session's end. When a session
ends the builder makes its task, one line of the format `saga bench` loads
(`saga_server.bench.workload`):

- per step: `prompt_tokens`, `output_tokens`, `reused_prefix_tokens`,
  `provider_cached_tokens` (what the upstream said it served from its cache;
  null where it did not say), `llm_latency_s` (request to answer), `tools`
  (name, category, `duration_s`: from the answer that asked for the call to the
  request that follows it, the gap a replay waits, whenever the tool's own start
  and end were told; null for a call the session ended on), and
  `idle_s` where no tool ran before the next step (a user's turn);
- `reused_prefix_tokens`: given the calls' tokens (`TokenBlocks`, an engine),
  the leading prompt tokens that are the previous step's prompt plus its answer,
  token for token (to the block where only block hashes can tell); else the
  previous step's prompt plus its answer when the history continues that
  answer, its prompt alone when it continues only the request (the answer was
  rewritten), 0 otherwise; at most the prompt;
- `shared_prefix_tokens`: the first step's cached tokens where reported (what a
  new session found of earlier ones: system prompt, tool schemas), else 0;
- token counts the upstream did not report (a stream without usage) are
  estimated from characters (`CHARS_PER_TOKEN`) and the task says
  `tokens_estimated`;
- `tenant`, where a session's start said one;
- `parent_session_id` and `parent_step`, for a subagent whose start named its
  parent: the parent's id and the index of the parent's last finished step when
  the child started (the step that spawned it; `saga bench` nests the child there);
- `end_reason`: why the session ended; `truncated` unless it ended in-band
  (`IN_BAND_ENDS`: the proxy's `submit` and `final`, an agent's own session end
  with its outcome): a session that only went quiet, or that the recorder
  had to let go, may have had more to do; `incomplete` when facts went missing
  on the way (a step number skipped, an end without its start, or `lost`, the
  owner's count of facts dropped before they reached the builder, grew while
  the session was open).

No text ever reaches the builder, only sizes and names, and from an engine token
ids, which it compares and never writes (of a session's last call it keeps a hash
per block and the ids past its last whole block); `tool_name` may hash the names
(the category is taken from the real name first). Failed calls are left out of
the steps (counted in `failed_calls`); an identical retry continues what the
failed call continued.

Memory is bounded: at most `max_sessions` open sessions (the longest quiet is
ended first, `end_reason` "recorder_full"), `max_steps` steps each (the rest is
counted, not kept; as many calls in flight), one int per block of its last call
where tokens are given, and a session silent for `idle_s` ends as
"recorder_idle" (its end never arrived). A session that ends and comes back (the
proxy revives one it ended too early) is a second task under its id. Not
thread-safe: one owner (the recorder's thread) calls it. Times are seconds on one
monotonic clock; `started_unix_s` comes from `wall`.
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from saga_server.core.categories import guess_category

__all__ = ["CHARS_PER_TOKEN", "IN_BAND_ENDS", "TokenBlocks", "TraceBuilder", "block_hashes"]

# Calibrated on SWE-bench agent runs: the same ratio the
# tau-bench traces were estimated with.
CHARS_PER_TOKEN = 3.36
# The proxy's (the agent submitted; its last answer ended the task) and an agent's own
# session end hint (its outcome).
IN_BAND_ENDS = ("submit", "final", "completed", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class TokenBlocks:
    """A call's tokens as an engine holds them: `tokens` the ids, `blocks[i]` a hash
    that stands for the first `(i + 1) * block_size` of them (chained, so equal
    hashes mean equal prefixes: vLLM's prefix-cache block hashes). Only the first
    `len(tokens) // block_size` blocks are read, so a list the engine still appends
    to may be passed as it is."""

    tokens: Sequence[int]
    blocks: Sequence[Hashable]
    block_size: int


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the whole blocks of `tokens`, for `TokenBlocks` where the
    engine keeps none (vLLM without prefix caching)."""
    out, parent = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start:start + block_size])))
        out.append(parent)
    return out


@dataclass(slots=True)
class _Tool:
    name: str
    category: str
    duration: float | None = None


@dataclass(slots=True)
class _Sequence:
    """What a call's tokens leave for the next call to compare: a hash per whole block
    (as ints) and the ids past them (at most a block)."""

    block_size: int
    blocks: array
    tail: tuple[int, ...]

    @classmethod
    def of(cls, seen: TokenBlocks) -> _Sequence:
        size = max(1, seen.block_size)
        n = min(len(seen.blocks), len(seen.tokens) // size)
        return cls(size, array("q", map(hash, seen.blocks[:n])), tuple(seen.tokens[n * size:(n + 1) * size]))

    def shared(self, seen: TokenBlocks) -> int:
        """How many leading tokens of `seen` (of one engine, one block size) are this sequence's."""
        size, mine = self.block_size, self.blocks
        lo, hi = 0, min(len(mine), len(seen.blocks), len(seen.tokens) // size)
        while lo < hi:  # the longest run of equal leading blocks (chained: a prefix)
            mid = (lo + hi + 1) // 2
            if hash(seen.blocks[mid - 1]) == mine[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        shared = lo * size
        if lo == len(mine):  # every whole block is the same: count on, token by token
            for own, theirs in zip(self.tail, seen.tokens[shared:shared + len(self.tail)]):
                if own != theirs:
                    break
                shared += 1
        return shared


@dataclass(slots=True)
class _Step:
    number: int
    started: float
    extends: str
    prompt_chars: int
    reused: int | None = None  # counted from the tokens (`TokenBlocks`)
    ended: float | None = None
    prompt: int = 0
    output: int = 0
    cached: int | None = None
    tools: list[_Tool] = field(default_factory=list)
    next_at: float | None = None  # when the next step started


@dataclass(slots=True)
class _Task:
    session_id: str
    workflow: str
    started: float
    started_unix: float
    last_seen: float
    model: str = ""
    tenant: str = ""
    parent: str = ""
    parent_step: int = -1
    steps: list[_Step] = field(default_factory=list)
    running: dict[int, _Step] = field(default_factory=dict)  # step number -> call in flight
    tools: dict[str, _Tool] = field(default_factory=dict)    # call id (or name) -> call not yet ended
    last_step: int | None = None  # a revived session's steps number on from its earlier life
    last_tokens: _Sequence | None = None  # the last call's, where tokens are given
    failed_calls: int = 0
    failed_extends: str | None = None  # what the last failed call continued (a retry repeats it)
    dropped_steps: int = 0
    estimated: bool = False
    incomplete: bool = False
    lost_at_open: int = 0


class TraceBuilder:
    """See the module docstring. Each fact may finish tasks; `take()` returns them."""

    def __init__(self, *, source: str = "saga", max_sessions: int = 10_000, max_steps: int = 4096,
                 idle_s: float = 3600.0, tool_name: Callable[[str], str] = str,
                 wall: Callable[[], float] = time.time) -> None:
        if max_sessions < 1 or max_steps < 1 or idle_s <= 0:
            raise ValueError("max_sessions, max_steps and idle_s must be positive")
        self.source = source
        self.max_sessions = max_sessions
        self.max_steps = max_steps
        self.idle_s = idle_s
        self._tool_name = tool_name
        self._wall = wall
        self._open: OrderedDict[str, _Task] = OrderedDict()  # least recently seen first
        self._done: list[dict[str, Any]] = []
        self.lost = 0  # facts lost before they got here, as counted by the owner

    # -- facts --------------------------------------------------------------------------

    def session_start(self, sid: str, t: float, *, workflow: str = "", tenant: str = "",
                      restart: bool = True, parent: str = "") -> None:
        """`restart`: a start of a session still open ends that one first ("restarted");
        False: it is the same session (an engine may see a session's first call before
        its start hint), whose workflow and tenant are filled in where still empty."""
        task = self._open.get(sid)
        if task is not None and restart:  # a start without the previous end: that one is over
            self._finish(task, "restarted")
        task = self._task(sid, t, workflow)
        task.workflow, task.tenant = task.workflow or workflow, task.tenant or tenant
        if parent and not task.parent and parent != sid:
            spawner = self._open.get(parent)
            task.parent = parent
            task.parent_step = len(spawner.steps) - 1 if spawner is not None else -1

    def llm_start(self, sid: str, t: float, *, step: int | None = None, extends: str = "", prompt_chars: int = 0,
                  model: str = "", tokens: TokenBlocks | None = None) -> int:
        """Returns the call's step number: `step`, or with None the one after the
        session's last."""
        task = self._task(sid, t)
        if step is None:
            step = (task.last_step or 0) + 1
        if task.last_step is not None and step != task.last_step + 1:
            task.incomplete = True
        task.last_step = step if task.last_step is None else max(task.last_step, step)
        task.model = task.model or model
        if extends == "request" and task.failed_extends is not None:
            extends = task.failed_extends  # a retry continues what the failed call did
        task.failed_extends = None
        if task.steps and task.steps[-1].next_at is None:  # the gap after the last answer is known now
            last = task.steps[-1]
            last.next_at = t
            for tool in last.tools:
                tool.duration = _gap(last)
        if len(task.running) >= self.max_steps:  # ends that never came
            del task.running[next(iter(task.running))]
            task.incomplete = True
        call = task.running[step] = _Step(step, t, extends, prompt_chars)
        if tokens is not None:
            call.reused = task.last_tokens.shared(tokens) if task.last_tokens is not None else 0
        return step

    def llm_end(self, sid: str, t: float, *, step: int, prompt_tokens: int = 0, output_tokens: int = 0,
                cached_tokens: int | None = None, output_chars: int = 0, failed: bool = False,
                tokens: TokenBlocks | None = None) -> None:
        """`tokens`: the prompt and the answer, for what the next call reuses."""
        task = self._task(sid, t)
        call = task.running.pop(step, None)
        if call is None:
            task.incomplete = True
            return
        if failed:
            task.failed_calls += 1
            task.failed_extends = call.extends
            return
        if tokens is not None:
            task.last_tokens = _Sequence.of(tokens)
        if len(task.steps) >= self.max_steps:
            task.dropped_steps += 1
            return
        call.ended = t
        call.prompt, call.output, call.cached = prompt_tokens, output_tokens, cached_tokens
        if not prompt_tokens and call.prompt_chars:
            call.prompt, task.estimated = _tokens(call.prompt_chars), True
        if not output_tokens and output_chars:
            call.output, task.estimated = _tokens(output_chars), True
        task.steps.append(call)

    def tool_start(self, sid: str, t: float, *, name: str, call_id: str = "", category: str = "") -> None:
        task = self._task(sid, t)
        if not task.steps or task.dropped_steps:
            task.incomplete = task.incomplete or not task.steps
            return
        last = task.steps[-1]
        tool = _Tool(self._tool_name(name), category or guess_category(name))
        if last.next_at is not None:  # told after the next request came (hints race requests)
            tool.duration = _gap(last)
        last.tools.append(tool)
        task.tools[call_id or name] = tool

    def tool_end(self, sid: str, t: float, *, call_id: str = "", name: str = "") -> None:
        """The end of the call `call_id`; without one, of the open call of `name` (a call
        without an id is known by its tool's name, as in the core's session table)."""
        task = self._task(sid, t)
        if task.tools.pop(call_id or name, None) is None:
            task.incomplete = True

    def session_end(self, sid: str, t: float, *, reason: str = "") -> None:
        task = self._open.get(sid)
        if task is not None:
            task.last_seen = t
            self._finish(task, reason or "ended")

    # -- housekeeping ---------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """End sessions silent for `idle_s` (their end never came). A session waiting
        on a call in flight is not silent: a slow answer must not end it."""
        while self._open:
            task = next(iter(self._open.values()))
            if now - task.last_seen < self.idle_s:
                break
            if task.running:
                task.last_seen = now
                self._open.move_to_end(task.session_id)
                continue
            self._finish(task, "recorder_idle")

    def close(self, reason: str = "closed") -> None:
        """End every open session (the recorder is stopping)."""
        for task in list(self._open.values()):
            self._finish(task, reason)

    def take(self) -> list[dict[str, Any]]:
        """The tasks finished since the last call, in the order they finished."""
        done, self._done = self._done, []
        return done

    @property
    def open_sessions(self) -> int:
        return len(self._open)

    # -- internals ------------------------------------------------------------------------

    def _task(self, sid: str, t: float, workflow: str | None = None) -> _Task:
        """The open task of `sid`; a fact of a session whose start was not seen opens
        one marked incomplete."""
        task = self._open.get(sid)
        if task is None:
            while len(self._open) >= self.max_sessions:
                self._finish(next(iter(self._open.values())), "recorder_full")
            task = _Task(sid, workflow or "", t, self._wall(), t, incomplete=workflow is None,
                         lost_at_open=self.lost)
            self._open[sid] = task
        else:
            task.last_seen = t
            self._open.move_to_end(sid)
        return task

    def _finish(self, task: _Task, reason: str) -> None:
        del self._open[task.session_id]
        if task.steps:
            self._done.append(self._line(task, reason))

    def _line(self, task: _Task, reason: str) -> dict[str, Any]:
        steps, prev = [], None
        for st in task.steps:
            reused = 0
            if st.reused is not None:
                reused = st.reused
            elif prev is not None and st.extends == "answer":
                reused = prev.prompt + prev.output
            elif prev is not None and st.extends == "request":
                reused = prev.prompt
            out: dict[str, Any] = {
                "prompt_tokens": st.prompt, "output_tokens": st.output,
                "reused_prefix_tokens": min(reused, st.prompt), "provider_cached_tokens": st.cached,
                "llm_latency_s": round(st.ended - st.started, 4),
                "tools": [{"name": tl.name, "category": tl.category,
                           "duration_s": None if tl.duration is None else round(tl.duration, 4)} for tl in st.tools]}
            if not st.tools and st.next_at is not None:
                out["idle_s"] = round(max(0.0, st.next_at - st.ended), 4)
            steps.append(out)
            prev = st
        last = task.steps[-1]
        line: dict[str, Any] = {
            "format": "saga-trace/1", "source": self.source, "agent": "", "benchmark": "recorded",
            "run": task.workflow, "model": task.model, "task_id": task.session_id,
            **({"tenant": task.tenant} if task.tenant else {}),
            **({"parent_session_id": task.parent, "parent_step": task.parent_step} if task.parent else {}),
            "shared_prefix_tokens": min(task.steps[0].cached or 0, task.steps[0].prompt),
            "started_unix_s": round(task.started_unix, 3),
            "duration_s": round(last.ended - task.steps[0].started, 4),
            "end_reason": reason, "truncated": reason not in IN_BAND_ENDS or task.dropped_steps > 0,
            "steps": steps}
        for key, value in (("failed_calls", task.failed_calls), ("dropped_steps", task.dropped_steps),
                           ("tokens_estimated", task.estimated),
                           ("incomplete", task.incomplete or self.lost > task.lost_at_open)):
            if value:
                line[key] = value
        return line


def _gap(step: _Step) -> float:
    """From the step's answer to the request that followed it."""
    return max(0.0, step.next_at - step.ended)


def _tokens(chars: int) -> int:
    return max(1, round(chars / CHARS_PER_TOKEN))
