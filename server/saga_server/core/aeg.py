"""Agent Execution Graph: per-workflow step graph learned online, plus live sessions.

Model
-----
A *workflow* (agent program) is a directed graph of LLM steps. A node is named by
the framework (hint `node`) when it gives one; otherwise by what led to it:
``"start"`` for a session's first call, ``"after:<tool key>"`` after a tool call
(tool key = ``"<tool>|<category>"``), ``"after:none"`` after a call with no tool.
Without any hints (the engine only sees requests), the step *shape* stands in:
``"o<k>"`` after a response of 2^(k-1)..2^k-1 output tokens, and the gap between
a response and the next request is treated as a pseudo-tool ``"~gap:o<k>"``.

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

Memory is bounded: at most `max_workflows` graphs (least recently used go),
`max_nodes` nodes and `max_tools` tool keys per graph (further tools share an
overflow key per category), `max_sessions` live sessions with at most 64 open
tool calls each, each expiring after `session_idle_s` without events (recorded as
an end of the session: an agent that went silent did not continue).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from .categories import guess_category
from .quantiles import LogHistogram

__all__ = ["AEG", "Prediction", "END", "tool_key"]

END = "$end"
_NO_TOOL = ""
_OVERFLOW = "~overflow"
_MAX_OPEN_TOOLS = 64
_EWMA = 0.2


def tool_key(tool: str, category: str) -> str:
    return f"{tool}|{category}" if category else tool


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the AEG expects a session to do next (definitions: module docstring)."""

    p_continue: float
    resume_mean_s: float
    resume_p50_s: float
    resume_p90_s: float
    next_node: str
    prompt_growth_tokens: float
    next_tool_category: str = ""
    remaining_steps: float = 0.0
    remaining_time_s: float = 0.0


class _ExpDist:
    """A client's expected duration, read as the mean of a memoryless tool."""

    __slots__ = ("m",)

    def __init__(self, mean: float) -> None:
        self.m = max(mean, 1e-3)

    def mean_above(self, elapsed: float) -> float:
        return max(elapsed, 0.0) + self.m

    def quantile_above(self, q: float, elapsed: float) -> float:
        return max(elapsed, 0.0) - math.log(max(1.0 - q, 1e-9)) * self.m


class _Imminent:
    """Nothing left to wait for."""

    __slots__ = ()

    def mean_above(self, elapsed: float) -> float:
        return max(elapsed, 0.0)

    def quantile_above(self, q: float, elapsed: float) -> float:
        return max(elapsed, 0.0)


_NOW = _Imminent()


@dataclass(slots=True)
class _Edge:
    resumed: float = 0.0
    ended: float = 0.0
    succ: dict[str, float] = field(default_factory=dict)
    growth_n: float = 0.0
    growth_mean: float = 0.0


@dataclass(slots=True)
class _Node:
    name: str
    visits: float = 0.0
    tools: dict[str, float] = field(default_factory=dict)  # tool key -> times it followed
    edges: dict[str, _Edge] = field(default_factory=dict)  # tool key -> outcome counts
    resumed: float = 0.0
    ended: float = 0.0
    growth_n: float = 0.0
    growth_mean: float = 0.0


@dataclass(slots=True)
class _Graph:
    name: str
    nodes: dict[str, _Node] = field(default_factory=dict)
    durations: dict[str, LogHistogram] = field(default_factory=dict)
    categories: dict[str, str] = field(default_factory=dict)  # tool key -> category
    tools: dict[str, float] = field(default_factory=dict)  # tool key -> count (fallback)
    sessions_done: int = 0
    steps_mean: float = 0.0
    cycle_n: int = 0
    cycle_mean: float = 0.0
    growth_n: float = 0.0
    growth_mean: float = 0.0


@dataclass(slots=True)
class SessionTrack:
    """Live per-session state the predictions read (internal; exposed for the facade)."""

    session_id: str
    workflow: str
    tenant: str
    started_at: float
    last_event: float
    deadline_at: float | None = None
    hinted: bool = False
    ended: bool = False
    node: str = ""
    in_llm: bool = False
    steps: int = 0
    # The edge the session is on: from `node`, via `via` (tool key or "").
    via: str = _NO_TOOL
    via_category: str = ""
    open_tools: dict[str, tuple[str, str, float, float | None]] = field(default_factory=dict)
    tool_started: float = 0.0
    gap_started: float | None = None  # unhinted: when the last response finished
    last_prompt: int = 0
    last_output: int = 0
    context_tokens: int = 0  # KV the session holds now (prompt, plus answer once done)
    base_tokens: int = 0  # context at the end of the last finished call (growth baseline)
    entered_from: tuple[str, str] | None = None  # (node, via) whose growth is pending
    last_llm_start: float | None = None


class AEG:
    """The graphs of all workflows and the sessions running them (not thread-safe:
    the facade serialises access). Times are passed in explicitly."""

    def __init__(
        self,
        *,
        max_workflows: int = 256,
        max_nodes: int = 512,
        max_tools: int = 128,
        max_sessions: int = 50_000,
        session_idle_s: float = 1800.0,
        min_samples: int = 8,
        prior_p_continue: float = 0.9,
        prior_cycle_s: float = 5.0,
        smoothing: float = 2.0,
    ) -> None:
        if min(max_workflows, max_nodes, max_tools, max_sessions) < 1 or session_idle_s <= 0:
            raise ValueError("AEG limits must be >= 1 and session_idle_s > 0")
        if not 0.0 <= prior_p_continue <= 1.0:
            raise ValueError("prior_p_continue must be in [0, 1]")
        self.max_workflows = max_workflows
        self.max_nodes = max_nodes
        self.max_tools = max_tools
        self.max_sessions = max_sessions
        self.session_idle_s = session_idle_s
        self.min_samples = min_samples
        self.prior_p_continue = prior_p_continue
        self.prior_cycle_s = prior_cycle_s
        self.smoothing = smoothing
        self._graphs: OrderedDict[str, _Graph] = OrderedDict()
        self._sessions: OrderedDict[str, SessionTrack] = OrderedDict()
        self._by_category: dict[str, LogHistogram] = {}
        self._global = LogHistogram()
        # A weak prior (log-normal, median 0.5 s, sigma 1.2) so that a cold core
        # still answers with sensible tool durations; real samples outweigh it fast.
        for z in (-1.6, -1.0, -0.5, 0.0, 0.5, 1.0, 1.6):
            self._global.add(0.5 * math.exp(1.2 * z))
        self.counters = {"sessions_expired": 0, "workflows_evicted": 0, "tool_samples": 0}

    # -- sessions ---------------------------------------------------------------

    def track(self, session_id: str) -> SessionTrack | None:
        return self._sessions.get(session_id)

    def tracks(self) -> list[SessionTrack]:
        return list(self._sessions.values())

    def __len__(self) -> int:
        return len(self._sessions)

    def workflows(self) -> list[str]:
        return list(self._graphs)

    def session_start(self, sid: str, t: float, *, tenant: str = "", workflow: str = "",
                      deadline_at: float | None = None, structure=None, hinted: bool = True) -> SessionTrack:
        old = self._sessions.get(sid)
        if old is not None and not old.ended:
            self._finish(old, t)
        tr = self._new_track(sid, t, tenant, workflow, hinted)
        tr.deadline_at = deadline_at
        if structure is not None:
            self._declare(self._graph(tr.workflow), structure)
        return tr

    def llm_start(self, sid: str, t: float, *, node: str = "", tenant: str = "",
                  hinted: bool = True) -> SessionTrack:
        tr = self._sessions.get(sid)
        if hinted and tr is not None and not tr.hinted and not tr.ended and tr.in_llm:
            # The engine saw this call's request before its hint: same step, now hinted.
            self._ensure(sid, t, tenant, hinted)
            if node and node != tr.node:
                tr.node = self._node(self._graph(tr.workflow), node).name
            self._touch(tr, t)
            return tr
        tr = self._ensure(sid, t, tenant, hinted)
        g = self._graph(tr.workflow)
        if tr.steps == 0:
            name = node or "start"
        elif node:
            name = node
        elif hinted:
            name = f"after:{tr.via}" if tr.via else "after:none"
        else:
            name = f"o{min(tr.last_output, 1 << 20).bit_length()}"
        if tr.gap_started is not None and tr.steps > 0 and not tr.open_tools:
            self._add_duration(g, tr.via, tr.via_category, t - tr.gap_started)
        tr.gap_started = None
        tr.open_tools.clear()
        name = self._node(g, name).name
        if tr.steps > 0 and tr.node:
            self._resolve(g, tr, name)
        if tr.last_llm_start is not None:
            dt = t - tr.last_llm_start
            g.cycle_n += 1
            g.cycle_mean += (dt - g.cycle_mean) * (1.0 / g.cycle_n if g.cycle_n < 5 else _EWMA)
        tr.entered_from = (tr.node, tr.via) if tr.steps > 0 and tr.node else None
        tr.node = name
        g.nodes[name].visits += 1
        tr.via, tr.via_category = _NO_TOOL, ""
        tr.steps += 1
        tr.in_llm = True
        tr.last_llm_start = t
        self._touch(tr, t)
        return tr

    def llm_end(self, sid: str, t: float, *, prompt_tokens: int = 0, output_tokens: int = 0,
                hinted: bool = True) -> SessionTrack | None:
        tr = self._sessions.get(sid)
        if tr is None or tr.ended:
            return None
        if prompt_tokens > 0:
            self.observe_prompt(tr, prompt_tokens)
        if prompt_tokens > 0 or output_tokens > 0:
            tr.last_output = max(output_tokens, 0)
            tr.context_tokens = tr.base_tokens = tr.last_prompt + tr.last_output
        tr.in_llm = False
        if not hinted and not tr.hinted:
            # Without hints the pause until the next request is the only "tool".
            tr.gap_started = t
            tr.via = f"~gap:o{min(tr.last_output, 1 << 20).bit_length()}"
            tr.via_category = "~gap"
            g = self._graph(tr.workflow)
            node = g.nodes.get(tr.node)
            if node is not None:
                node.tools[tr.via] = node.tools.get(tr.via, 0.0) + 1
        self._touch(tr, t)
        return tr

    def observe_prompt(self, tr: SessionTrack, prompt_tokens: int) -> None:
        """A call's prompt length became known: learn the growth of the edge it came by."""
        if tr.entered_from is not None and tr.base_tokens > 0:
            growth = prompt_tokens - tr.base_tokens
            g = self._graph(tr.workflow)
            n_from, via = tr.entered_from
            node = g.nodes.get(n_from)
            if node is not None:
                e = node.edges.get(via)
                if e is not None:
                    e.growth_n += 1
                    e.growth_mean += (growth - e.growth_mean) / min(e.growth_n, 1 / _EWMA)
                node.growth_n += 1
                node.growth_mean += (growth - node.growth_mean) / min(node.growth_n, 1 / _EWMA)
            g.growth_n += 1
            g.growth_mean += (growth - g.growth_mean) / min(g.growth_n, 1 / _EWMA)
            tr.entered_from = None
        tr.last_prompt = prompt_tokens
        tr.context_tokens = prompt_tokens

    def tool_start(self, sid: str, t: float, tool: str, *, call_id: str = "", category: str = "",
                   expected_s: float | None = None) -> SessionTrack:
        tr = self._ensure(sid, t, "", True)
        cat = category or guess_category(tool)
        key = tool_key(tool, cat)
        g = self._graph(tr.workflow)
        if key not in g.tools and len(g.tools) >= self.max_tools:
            key = tool_key(_OVERFLOW, cat)  # unbounded tool names share one key per category
        if not tr.open_tools:
            # The first tool of a batch names the edge; the batch ends with its last tool.
            tr.via, tr.via_category, tr.tool_started = key, cat, t
            if tr.node:
                node = g.nodes.get(tr.node)
                if node is not None:
                    node.tools[key] = node.tools.get(key, 0.0) + 1
            g.tools[key] = g.tools.get(key, 0.0) + 1
        if len(tr.open_tools) >= _MAX_OPEN_TOOLS:  # ends that never came: forget the oldest
            del tr.open_tools[next(iter(tr.open_tools))]
        tr.open_tools[call_id or tool] = (key, cat, t, expected_s)
        tr.in_llm = False
        tr.gap_started = None
        self._touch(tr, t)
        return tr

    def tool_end(self, sid: str, t: float, tool: str = "", *, call_id: str = "") -> SessionTrack | None:
        tr = self._sessions.get(sid)
        if tr is None or tr.ended:
            return None
        opened = tr.open_tools.pop(call_id or tool, None)
        if opened is not None:
            key, cat, t0, _ = opened
            self._add_duration(self._graph(tr.workflow), key, cat, t - t0)
        self._touch(tr, t)
        return tr

    def session_end(self, sid: str, t: float) -> SessionTrack | None:
        tr = self._sessions.get(sid)
        if tr is None or tr.ended:
            return None
        self._finish(tr, t)
        self._touch(tr, t)
        return tr

    def expire(self, now: float, budget: int = 8) -> list[str]:
        """End and drop up to `budget` sessions idle for `session_idle_s` (oldest first)."""
        gone: list[str] = []
        while self._sessions and len(gone) < budget:
            sid, tr = next(iter(self._sessions.items()))
            if now - tr.last_event < self.session_idle_s:
                break
            if not tr.ended:
                self._finish(tr, now)
            del self._sessions[sid]
            gone.append(sid)
        self.counters["sessions_expired"] += len(gone)
        return gone

    # -- predictions ------------------------------------------------------------

    def predict(self, sid: str, now: float) -> Prediction:
        tr = self._sessions.get(sid)
        if tr is None:
            return self._prior_prediction()
        if tr.ended:
            return Prediction(0.0, math.inf, math.inf, math.inf, "", 0.0, "", 0.0, 0.0)
        g = self._graphs.get(tr.workflow)
        node = g.nodes.get(tr.node) if g is not None else None
        p = self.p_continue(tr, g, node)
        mean, p50, p90 = self._resume(tr, g, now)
        next_node, growth = "", 0.0
        if node is not None:
            e = node.edges.get(tr.via) if tr.via else None
            succ = e.succ if e is not None and e.succ else _merged_succ(node)
            next_node = _argmax(succ, skip=END)
            if e is not None and e.growth_n:
                growth = e.growth_mean
            elif node.growth_n:
                growth = node.growth_mean
            elif g.growth_n:
                growth = g.growth_mean
        cat = self.next_tool_category(tr)
        steps, rem_t = self._remaining(tr, g, p)
        return Prediction(p, mean, p50, p90, next_node, growth, cat, steps, rem_t)

    def reuse(self, sid: str, now: float) -> tuple[float, float] | None:
        """(p_continue, expected time to the next call) without the rest of `predict`:
        the hot path of eviction scoring. None for an unknown session."""
        tr = self._sessions.get(sid)
        if tr is None:
            return None
        if tr.ended:
            return 0.0, math.inf
        p = self.p_continue(tr)
        if tr.in_llm and not tr.open_tools:
            return p, 0.0
        d, t0 = self.resume_dist(tr)
        if d is None:
            d, t0 = self.idle_dist(tr), tr.last_event
        el = now - t0 if now > t0 else 0.0
        return p, d.mean_above(el) - el

    def p_continue(self, tr: SessionTrack, g: _Graph | None = None, node: _Node | None = None) -> float:
        if tr.ended:
            return 0.0
        if g is None:
            g = self._graphs.get(tr.workflow)
            node = g.nodes.get(tr.node) if g is not None else None
        a = self.smoothing
        p_node = self.prior_p_continue
        if node is not None:
            p_node = (node.resumed + a * self.prior_p_continue) / (node.resumed + node.ended + a)
            if tr.via:
                e = node.edges.get(tr.via)
                if e is not None:
                    return (e.resumed + a * p_node) / (e.resumed + e.ended + a)
        return p_node

    def resume_dist(self, tr: SessionTrack):
        """The duration distribution of what the session is waiting on, and its start."""
        g = self._graphs.get(tr.workflow)
        if tr.open_tools:
            best, best_t0, best_m = None, 0.0, -1.0
            for key, cat, t0, expected in tr.open_tools.values():
                d = self._dist(g, key, cat, expected)
                m = d.mean_above(0.0) + t0
                if m > best_m:
                    best, best_t0, best_m = d, t0, m
            return best, best_t0
        if tr.gap_started is not None:
            return self._dist(g, tr.via, tr.via_category, None), tr.gap_started
        if tr.via and not tr.in_llm:
            return _NOW, tr.last_event  # its tools are done: the next call is imminent
        return None, 0.0

    def next_tool_category(self, tr: SessionTrack) -> str:
        g = self._graphs.get(tr.workflow)
        if g is None:
            return ""
        node = g.nodes.get(tr.node)
        counts = node.tools if node is not None and node.tools else g.tools
        best = _argmax(counts, skip="")
        return g.categories.get(best, best.partition("|")[2] if "|" in best else "")

    def tool_distribution(self, workflow: str, tool: str, category: str = "",
                          expected_s: float | None = None):
        cat = category or guess_category(tool)
        return self._dist(self._graphs.get(workflow), tool_key(tool, cat), cat, expected_s)

    # -- internals --------------------------------------------------------------

    def _prior_prediction(self) -> Prediction:
        d = self._global
        return Prediction(self.prior_p_continue, d.mean(), d.quantile(0.5), d.quantile(0.9), "", 0.0,
                          "", self.prior_p_continue / (1 - min(self.prior_p_continue, 0.99)),
                          self.prior_cycle_s * self.prior_p_continue / (1 - min(self.prior_p_continue, 0.99)))

    def _resume(self, tr: SessionTrack, g: _Graph | None, now: float) -> tuple[float, float, float]:
        if tr.in_llm and not tr.open_tools:
            return 0.0, 0.0, 0.0
        d, t0 = self.resume_dist(tr)
        if d is None:
            d, t0 = self.idle_dist(tr), tr.last_event
        el = max(now - t0, 0.0)
        return (d.mean_above(el) - el, d.quantile_above(0.5, el) - el, d.quantile_above(0.9, el) - el)

    def idle_dist(self, tr: SessionTrack):
        # Hinted, between a response and its tool call: the tool that usually
        # follows this node is the best guess, then the workflow's usual tool.
        g = self._graphs.get(tr.workflow)
        if g is None:
            return self._global
        node = g.nodes.get(tr.node)
        counts = node.tools if node is not None and node.tools else g.tools
        key = _argmax(counts, skip="")
        return self._dist(g, key, g.categories.get(key, ""), None)

    def remaining(self, tr: SessionTrack) -> tuple[float, float]:
        """(expected further LLM steps, expected seconds until the session ends)."""
        return self._remaining(tr, self._graphs.get(tr.workflow), self.p_continue(tr))

    def _remaining(self, tr: SessionTrack, g: _Graph | None, p: float) -> tuple[float, float]:
        if p <= 0.0:
            return 0.0, 0.0
        # Without finished sessions to learn from, a geometric number of steps.
        steps = p / (1.0 - min(p, 0.99))
        if g is not None and g.sessions_done:
            steps = max(g.steps_mean - tr.steps, p)
        cycle = g.cycle_mean if g is not None and g.cycle_n else self.prior_cycle_s
        return steps, steps * cycle

    def _dist(self, g: _Graph | None, key: str, cat: str, expected: float | None):
        ms = self.min_samples
        if g is not None:
            h = g.durations.get(key)
            if h is not None and h.samples >= ms:
                return h
        if expected is not None and expected > 0:
            return _ExpDist(expected)
        h = self._by_category.get(cat)
        if h is not None and h.samples >= ms:
            return h
        return self._global

    def _add_duration(self, g: _Graph, key: str, cat: str, d: float) -> None:
        if not d >= 0.0 or d == math.inf:
            return
        self.counters["tool_samples"] += 1
        h = g.durations.get(key)
        if h is None and len(g.durations) < 2 * self.max_tools:
            h = g.durations[key] = LogHistogram()
            g.categories[key] = cat
        if h is not None:
            h.add(d)
        if cat:
            hc = self._by_category.get(cat)
            if hc is None and len(self._by_category) < 4 * self.max_tools:
                hc = self._by_category[cat] = LogHistogram()
            if hc is not None:
                hc.add(d)
        if not cat.startswith("~"):  # gaps are not tools: keep the global prior about tools
            self._global.add(d)

    def _resolve(self, g: _Graph, tr: SessionTrack, nxt: str) -> None:
        node = g.nodes.get(tr.node)
        if node is None:
            return
        e = node.edges.get(tr.via)
        if e is None:
            e = node.edges[tr.via] = _Edge()
        if nxt == END:
            e.ended += 1
            node.ended += 1
        else:
            e.resumed += 1
            node.resumed += 1
        e.succ[nxt] = e.succ.get(nxt, 0.0) + 1

    def _finish(self, tr: SessionTrack, t: float) -> None:
        g = self._graph(tr.workflow)
        if tr.node:
            self._resolve(g, tr, END)
        g.sessions_done += 1
        g.steps_mean += (tr.steps - g.steps_mean) * (1.0 / g.sessions_done if g.sessions_done < 5 else _EWMA)
        tr.ended = True
        tr.in_llm = False
        tr.open_tools.clear()
        tr.gap_started = None

    def _graph(self, name: str) -> _Graph:
        g = self._graphs.get(name)
        if g is None:
            if len(self._graphs) >= self.max_workflows:
                self._graphs.popitem(last=False)
                self.counters["workflows_evicted"] += 1
            g = self._graphs[name] = _Graph(name)
        else:
            self._graphs.move_to_end(name)
        return g

    def _node(self, g: _Graph, name: str) -> _Node:
        node = g.nodes.get(name)
        if node is None:
            if len(g.nodes) >= self.max_nodes - 1:  # the last slot is the shared overflow node
                name = _OVERFLOW
                node = g.nodes.get(name)
            if node is None:
                node = g.nodes[name] = _Node(name)
        return node

    def _declare(self, g: _Graph, structure) -> None:
        """Seed counts (weight 0.5 each) from a declared structure, so predictions
        follow it before there is data; observed counts outweigh it quickly."""
        kinds = {n.name: n.kind for n in structure.nodes}
        w = 0.5
        tool_preds: dict[str, list[str]] = {}
        for a, b in structure.edges:
            if kinds.get(a, "llm") == "llm" and kinds.get(b, "llm") == "tool":
                tool_preds.setdefault(b, []).append(a)
        for a, b in structure.edges:
            ka, kb = kinds.get(a, "llm"), kinds.get(b, "llm")
            nxt = END if kb == "end" else b
            if ka == "llm" and kb == "tool":
                node = self._node(g, a)
                node.tools[b] = node.tools.get(b, 0.0) + w
            elif ka == "llm":
                e = self._node(g, a).edges.setdefault(_NO_TOOL, _Edge())
                e.succ[nxt] = e.succ.get(nxt, 0.0) + w
            elif ka == "tool":
                for src in tool_preds.get(a, ()):
                    e = self._node(g, src).edges.setdefault(a, _Edge())
                    e.succ[nxt] = e.succ.get(nxt, 0.0) + w

    def _new_track(self, sid: str, t: float, tenant: str, workflow: str, hinted: bool) -> SessionTrack:
        self._sessions.pop(sid, None)
        while len(self._sessions) >= self.max_sessions:  # full: the least recently active goes
            old_sid, old = self._sessions.popitem(last=False)
            if not old.ended:
                self._finish(old, t)
            self.counters["sessions_expired"] += 1
        tr = SessionTrack(sid, workflow or tenant or "default", tenant, t, t, hinted=hinted)
        self._sessions[sid] = tr
        return tr

    def _ensure(self, sid: str, t: float, tenant: str, hinted: bool) -> SessionTrack:
        tr = self._sessions.get(sid)
        if tr is None or tr.ended:
            return self._new_track(sid, t, tenant, "", hinted)
        if hinted and not tr.hinted:
            # Hints arrived for a session first seen through the engine: from now on
            # the hints drive its steps (the engine's view only fills in tokens).
            tr.hinted = True
            tr.gap_started = None
            tr.via, tr.via_category = _NO_TOOL, ""
        return tr

    def _touch(self, tr: SessionTrack, t: float) -> None:
        if t > tr.last_event:
            tr.last_event = t
        self._sessions.move_to_end(tr.session_id)


def _merged_succ(node: _Node) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in node.edges.values():
        for k, v in e.succ.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _argmax(counts: dict[str, float], skip: str = "") -> str:
    best, best_v = "", -1.0
    for k, v in counts.items():
        # Ties go to the lexicographically smaller name: deterministic across runs.
        if k != skip and (v > best_v or (v == best_v and k < best)):
            best, best_v = k, v
    return best
