"""Agent Execution Graph: per-workflow step graphs learned online from live sessions.

Model
-----
A *workflow* (agent program) is a directed graph of LLM steps. A node is named by
the framework (hint `node`) when it gives one; otherwise by what led to it:
``"start"`` for a session's first call, ``"after:<tool key>"`` after a tool call
(a `ToolKey`, named ``"<tool>|<category>"``), ``"after:none"`` after a call with no tool.
Without any hints (the engine only sees requests), the step *shape* stands in:
``"o<k>"`` after a response of 2^(k-1)..2^k-1 output tokens, and the gap between
a response and the next request is treated as a pseudo-tool ``"~gap:o<k>"``.
A session whose hints mark its LLM calls but never a tool call (a proxy that
found no tool calls, an integration without tool hooks) keeps that gap: its
hints say where the calls are, not what happens between them. Its first tool
hint shows the gap it was in to have been that tool, and the gap is taken back.

Each node keeps, per tool key ("" = no tool), how often that tool followed it
and, once the outcome is known, which node came next or whether the session
ended (``END``). Durations are kept per (workflow, tool key), per category
across workflows, and globally (seeded with a weak log-normal prior), each as a
`LogHistogram`; a prediction uses the most specific level with at least
`min_samples` samples, falling back to a client's `expected_duration_s` (taken as
the mean of an exponential) before the category and global levels.

Predictions (`Prediction`, all "from now", on the injected clock):
- ``p_continue``: P(the session issues another LLM call), from the counts of the
  edge it is on (node, open tool), smoothed toward the node, then the prior.
- ``resume_*``: time until that next call. Inside a tool: the tool's duration
  distribution conditioned on the time already elapsed, minus the elapsed time.
  While a call runs: 0. Idle without hints: the gap distribution. Ended: inf.
- ``next_node``: the most frequent successor node of the edge (or node).
- ``prompt_growth_tokens``: mean of (next prompt - last prompt - last output)
  on that edge (or node, or workflow); the tool output the agent will append.
- ``next_tool_category``: the most frequent category of the tool that follows
  the current node (what the agent will do after the running/next call).
- A parent waiting on its subagents (live children, no call of its own running):
  ``p_continue`` 1 (their results come back to it) and ``resume_*`` the longest
  of its children's expected remaining times. Each node counts the subagents
  started while a session waited after it (``spawns_per_visit``) and learns how
  long they ran; a child's remaining time is that duration given its elapsed
  time once the node has `min_samples` of them, else its own graph's
  ``remaining_time_s``. Before its children start, a parent waits on the tool
  (or gap) that starts them, learnt like any other.
- ``remaining_steps``/``remaining_time_s``: the workflow's mean steps per session
  minus the steps taken (geometric in ``p_continue`` before any session ended),
  times its mean time between calls (a person's wait between user turns is not
  counted in that pace). `remaining_in_turn` is the same to the end of the running
  user turn (`turns`), from the steps its workflow's turns took.

Memory is bounded: at most `max_workflows` graphs (least recently used go),
`max_nodes` nodes and `max_tools` tool keys per graph (further tools share an
overflow key per category), and at most 64 tool calls awaited per session. The
sessions are the records of a `SessionTable` (bound and expiry: `sessions`); one
that leaves it before it ended is recorded as ending there: an agent that went
silent did not continue.

Code: `graph` holds the learned graphs and computes predictions; `AEG` below is
the live tracking, which moves each session's record with every event and tells
the graphs what it saw.
"""

from __future__ import annotations

from typing import Any

from .events import HintEvent, LlmCallEnd, LlmCallStart, SessionEnd, SessionStart, ToolCallEnd, ToolCallStart
from .graph import Prediction, WorkflowGraphs
from .sessions import SessionRecord, SessionTable
from .tool_keys import NO_TOOL, gap_key

__all__ = ["AEG"]

_MAX_OPEN_TOOLS = 64


class AEG(WorkflowGraphs):
    """The learned graphs plus the live tracking of the sessions running them, on
    `sessions` (one of its own, of `max_sessions` expiring after `session_idle_s`,
    when not given). Not thread-safe: callers hold the table's lock. Times are
    passed in explicitly.

    The AEG is the table's tracker: hints the table accepts move its records here,
    and so do the methods below (engine events, or direct use), which create a
    session they do not know, taking the least recently active one's place in a
    full table."""

    def __init__(self, sessions: SessionTable | None = None, *, max_sessions: int = 50_000,
                 session_idle_s: float = 1800.0, **graph_knobs: Any) -> None:
        super().__init__(**graph_knobs)  # the `WorkflowGraphs` knobs
        if sessions is None:
            sessions = SessionTable(max_sessions=max_sessions, idle_ttl_s=session_idle_s,
                                    ended_ttl_s=session_idle_s)
        sessions.attach(self)
        sessions.subscribe_turns(self._turn_ended)
        self.sessions = sessions
        self._by_id = sessions.by_id

    # -- sessions ---------------------------------------------------------------

    def track(self, session_id: str) -> SessionRecord | None:
        return self._by_id.get(session_id)

    def tracks(self) -> list[SessionRecord]:
        return list(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def expire(self, now: float, budget: int = 8) -> list[str]:
        """Drop up to `budget` expired sessions (oldest first; see `sessions`)."""
        return self.sessions.expire(now, budget)

    def session_start(self, sid: str, t: float, *, tenant: str = "", workflow: str = "",
                      deadline_at: float | None = None, structure=None, hinted: bool = True) -> SessionRecord:
        s = self.sessions.admit(sid, t, tenant=tenant, workflow=workflow, hinted=hinted)
        s.task_deadline_at = s.deadline_at = deadline_at
        if structure is not None:
            self.declare(s.graph, structure)
        return s

    def llm_start(self, sid: str, t: float, *, node: str = "", tenant: str = "",
                  hinted: bool = True) -> SessionRecord:
        s = self._session(sid, t, tenant, hinted)
        self._llm_start(s, t, node, hinted)
        self.sessions.touch(s, t)
        return s

    def llm_end(self, sid: str, t: float, *, prompt_tokens: int = 0, output_tokens: int = 0,
                hinted: bool = True) -> SessionRecord | None:
        s = self._by_id.get(sid)
        if s is None or s.ended:
            return None
        self._llm_end(s, t, prompt_tokens, output_tokens, hinted)
        self.sessions.touch(s, t)
        return s

    def observe_prompt(self, s: SessionRecord, prompt_tokens: int) -> None:
        """A call's prompt length became known: learn the growth of the edge it came by."""
        if s.entered_from is not None and s.base_tokens > 0:
            self.learn_growth(s, prompt_tokens)
            s.entered_from = None
        s.last_prompt = prompt_tokens
        s.context_tokens = prompt_tokens

    def tool_start(self, sid: str, t: float, tool: str, *, call_id: str = "", category: str = "",
                   expected_s: float | None = None) -> SessionRecord:
        s = self._session(sid, t, "", True)
        s.tool_calls += 1  # announced here, as the table counts a hinted one
        self._tool_start(s, t, tool, call_id, category, expected_s)
        self.sessions.touch(s, t)
        return s

    def tool_end(self, sid: str, t: float, tool: str = "", *, call_id: str = "") -> SessionRecord | None:
        s = self._by_id.get(sid)
        if s is None or s.ended:
            return None
        self._tool_end(s, t, tool, call_id)
        self.sessions.touch(s, t)
        return s

    def session_end(self, sid: str, t: float) -> SessionRecord | None:
        s = self._by_id.get(sid)
        if s is None or s.ended:
            return None
        self._stop(s, t)
        self.sessions.end(s)
        self.sessions.touch(s, t)
        return s

    # -- predictions ------------------------------------------------------------

    def predict(self, sid: str, now: float) -> Prediction:
        s = self._by_id.get(sid)
        return self.prior() if s is None else self.prediction(s, now)

    def reuse(self, sid: str, now: float) -> tuple[float, float] | None:
        """`reuse_of` the session; None for an unknown one."""
        s = self._by_id.get(sid)
        return None if s is None else self.reuse_of(s, now)

    def children_remaining_s(self, s: SessionRecord, now: float) -> float:
        """Expected seconds until the last of `s`'s live children ends: the longest of
        their expected remaining times, each from how long subagents started where it
        was ran (its spawn site, given their elapsed time), else from its own graph."""
        longest = 0.0
        for cid in s.children:
            child = self._by_id.get(cid)
            if child is None or child.ended:
                continue
            d = self.child_dist(child.spawn_site)
            if d is not None:
                el = now - child.started_at if now > child.started_at else 0.0
                rem = d.mean_above(el) - el
            else:
                rem = self.remaining(child)[1]
            longest = max(longest, rem)
        return longest

    # -- Tracker (the table calls these) ------------------------------------------

    def on_hint(self, session: SessionRecord, event: HintEvent) -> None:
        ev = event
        if isinstance(ev, LlmCallStart):
            self._llm_start(session, ev.time, ev.node, True)
        elif isinstance(ev, ToolCallStart):
            self._tool_start(session, ev.time, ev.tool, ev.call_id, ev.category, ev.expected_duration_s)
        elif isinstance(ev, ToolCallEnd):
            self._tool_end(session, ev.time, ev.tool, ev.call_id)
        elif isinstance(ev, LlmCallEnd):
            self._llm_end(session, ev.time, ev.prompt_tokens, ev.output_tokens, True)
        elif isinstance(ev, SessionStart):
            if ev.structure is not None:
                self.declare(session.graph, ev.structure)
            if session.parent and session.spawn_site is None:  # the table linked it: a subagent
                parent = self._by_id.get(session.parent)
                if parent is not None:
                    session.spawn_site = self.learn_spawn(parent)
        elif isinstance(ev, SessionEnd):
            self._stop(session, ev.time)

    def on_drop(self, session: SessionRecord, now: float) -> None:
        self.learn_end(session)
        self._child_done(session, session.last_event_at)  # went silent: it finished at its last event

    # -- internals: how each event moves a record ------------------------------------

    def _session(self, sid: str, t: float, tenant: str, hinted: bool) -> SessionRecord:
        s = self._by_id.get(sid)
        if s is None or s.ended:
            return self.sessions.admit(sid, t, tenant=tenant, hinted=hinted)
        return s

    def _take_hints(self, s: SessionRecord) -> None:
        # Hints arrived for a session first seen through the engine: from now on
        # the hints drive its steps (the engine's view only fills in tokens).
        s.hinted = True
        s.gap_started = None
        s.via = NO_TOOL

    def _llm_start(self, s: SessionRecord, t: float, node: str, hinted: bool) -> None:
        if hinted and not s.hinted:
            same_step = s.in_llm
            self._take_hints(s)
            if same_step:  # the engine saw this call's request before its hint
                if node and node != s.node:
                    s.node = self.rename_node(s, node)
                return
        if s.steps == 0:
            name = node or "start"
        elif node:
            name = node
        elif hinted:
            name = f"after:{s.via}" if s.via != NO_TOOL else "after:none"
        else:
            name = f"o{min(s.last_output, 1 << 20).bit_length()}"
        name = self.learn_step(s, t, name)
        s.gap_started = None
        s.running_tools.clear()
        s.entered_from = (s.node, s.via) if s.steps > 0 and s.node else None
        s.node = name
        s.via = NO_TOOL
        s.steps += 1
        s.in_llm = True
        s.last_llm_start = t

    def _llm_end(self, s: SessionRecord, t: float, prompt_tokens: int, output_tokens: int, hinted: bool) -> None:
        if prompt_tokens > 0:
            self.observe_prompt(s, prompt_tokens)
        if prompt_tokens > 0 or output_tokens > 0:
            s.last_output = max(output_tokens, 0)
            s.context_tokens = s.base_tokens = s.last_prompt + s.last_output
        s.in_llm = False
        if (not hinted and not s.hinted) or _without_tool_hints(s):
            # Without (tool) hints the pause until the next request is the only "tool".
            s.gap_started = t
            s.via = gap_key(s.last_output)
            self.learn_gap(s)

    def _tool_start(self, s: SessionRecord, t: float, tool: str, call_id: str, category: str,
                    expected_s: float | None) -> None:
        if not s.hinted:
            self._take_hints(s)
        elif s.gap_started is not None:  # the gap inferred after its last call was this tool
            self.forget_gap(s)
        key = self.learn_tool(s, tool, category)
        if not s.running_tools:
            # The first tool of a batch names the edge; the batch ends with its last tool.
            s.via, s.tool_started = key, t
        if len(s.running_tools) >= _MAX_OPEN_TOOLS:  # ends that never came: forget the oldest
            del s.running_tools[next(iter(s.running_tools))]
        s.running_tools[call_id or tool] = (key, t, expected_s)
        s.in_llm = False
        s.gap_started = None

    def _tool_end(self, s: SessionRecord, t: float, tool: str, call_id: str) -> None:
        opened = s.running_tools.pop(call_id or tool, None)
        if opened is not None:
            key, t0, _ = opened
            self.learn_duration(s, key, t - t0)

    def _stop(self, s: SessionRecord, t: float) -> None:
        """`s` ends: its edge led to END; it waits on nothing (the table marks it ended)."""
        self.learn_end(s)
        self._child_done(s, t)
        s.running_tools.clear()
        s.gap_started = None

    def _turn_ended(self, s: SessionRecord, span_s: float) -> None:
        """The table's turn listener: the table decides when a turn ends (`turns`),
        the graphs learn how many steps it took."""
        self.learn_turn(s)

    def _child_done(self, s: SessionRecord, t: float) -> None:
        """A subagent stops: its spawn site learns how long it ran (once)."""
        if s.spawn_site is not None:
            self.learn_child_end(s.spawn_site, t - s.started_at)
            s.spawn_site = None


def _without_tool_hints(s: SessionRecord) -> bool:
    """Hinted, but never a tool call: the gap after this call is still the engine's
    to infer (once per call, whichever of the engine and the hint ends it first)."""
    return s.hinted and s.tool_calls == 0 and not s.running_tools and s.gap_started is None
