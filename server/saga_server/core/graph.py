"""The learned half of the Agent Execution Graph: per-workflow graphs and what they predict.

`WorkflowGraphs` keeps, per workflow, the step graph (nodes, and per edge its
outcome counts, successors and prompt growth), the cycle time and steps per
session, and tool durations as `LogHistogram`s (per workflow, per category, and
globally over a weak prior). It learns from what the live tracking (`aeg.AEG`)
reports as sessions move, and answers a `Prediction` for one session's record.
It never changes a record. The model (node names, what each prediction means,
the bounds) is documented once, in `aeg`. Tools are `ToolKey`s throughout; their
names appear only in the learnt state (`learnt`, `restore_learnt`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from .categories import HUMAN, guess_category
from .quantiles import LogHistogram
from .sessions import SessionRecord
from .tool_keys import GAP, NO_TOOL, ToolKey

__all__ = ["WorkflowGraphs", "Prediction", "END"]

END = "$end"
_OVERFLOW = "~overflow"
_EWMA = 0.2


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the AEG expects a session to do next (definitions: `aeg`)."""

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


class _Exact:
    """A duration known exactly (the simulator's `oracle` reference only)."""

    __slots__ = ("d",)

    def __init__(self, duration: float) -> None:
        self.d = duration

    def mean_above(self, elapsed: float) -> float:
        return max(elapsed, self.d)

    def quantile_above(self, q: float, elapsed: float) -> float:
        return max(elapsed, self.d)


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
    tools: dict[ToolKey, float] = field(default_factory=dict)  # times each tool followed
    edges: dict[ToolKey, _Edge] = field(default_factory=dict)  # outcome counts per tool that followed
    resumed: float = 0.0
    ended: float = 0.0
    growth_n: float = 0.0
    growth_mean: float = 0.0
    spawned: float = 0.0  # subagents started while a session waited after this node
    child_durations: LogHistogram | None = None  # how long those subagents ran


@dataclass(slots=True)
class _Graph:
    name: str
    nodes: dict[str, _Node] = field(default_factory=dict)
    durations: dict[ToolKey, LogHistogram] = field(default_factory=dict)  # its timed tools
    tools: dict[ToolKey, float] = field(default_factory=dict)  # times each tool ran (fallback)
    sessions_done: int = 0
    steps_mean: float = 0.0
    cycle_n: int = 0
    cycle_mean: float = 0.0
    growth_n: float = 0.0
    growth_mean: float = 0.0
    lengths: LogHistogram | None = None  # steps of finished sessions (`remaining`)
    turns: LogHistogram | None = None  # steps of finished user turns (`remaining_in_turn`)


def _lengths() -> LogHistogram:
    # Ratio 1.1 bounds the error on whole steps from 1 to 100k at ~5%; halves its
    # counts past 1,024 sessions so that it follows a workflow whose tasks change.
    return LogHistogram(lo=1.0, hi=100_000.0, ratio=1.1, max_weight=1024.0)


class WorkflowGraphs:
    """The graphs of all workflows (not thread-safe: callers serialise access)."""

    def __init__(
        self,
        *,
        max_workflows: int = 256,
        max_nodes: int = 512,
        max_tools: int = 128,
        min_samples: int = 8,
        prior_p_continue: float = 0.9,
        prior_cycle_s: float = 5.0,
        smoothing: float = 2.0,
        exact_expected: bool = False,
    ) -> None:
        """`exact_expected`: take a client's expected duration as exact, ahead of
        anything learnt: perfect foresight, for the simulator's `oracle` reference
        only (no client knows its tools' durations)."""
        if min(max_workflows, max_nodes, max_tools) < 1:
            raise ValueError("graph limits must be >= 1")
        if not 0.0 <= prior_p_continue <= 1.0:
            raise ValueError("prior_p_continue must be in [0, 1]")
        self.max_workflows = max_workflows
        self.max_nodes = max_nodes
        self.max_tools = max_tools
        self.min_samples = min_samples
        self.prior_p_continue = prior_p_continue
        self.prior_cycle_s = prior_cycle_s
        self.smoothing = smoothing
        self.exact_expected = exact_expected
        self._graphs: OrderedDict[str, _Graph] = OrderedDict()
        self._by_category: dict[str, LogHistogram] = {}
        self._global = LogHistogram()
        # A weak prior (log-normal, median 0.5 s, sigma 1.2) so that a cold core
        # still answers with sensible tool durations; real samples outweigh it fast.
        for z in (-1.6, -1.0, -0.5, 0.0, 0.5, 1.0, 1.6):
            self._global.add(0.5 * math.exp(1.2 * z))
        self.counters = {"workflows_evicted": 0, "tool_samples": 0}

    def workflows(self) -> list[str]:
        return list(self._graphs)

    # -- learning: what the live tracking reports, before it moves the record --------

    def learn_step(self, s: SessionRecord, t: float, name: str) -> str:
        """`s` starts an LLM call at node `name`: learns the gap it waited (no
        hints), the edge it took and its cycle time. Returns the node's name in
        the graph (the overflow node past `max_nodes`)."""
        g = self._graph(s.graph)
        if s.gap_started is not None and s.steps > 0 and not s.running_tools:
            self._add_duration(g, s.via, t - s.gap_started)
        node = self._node(g, name)
        if s.steps > 0 and s.node:
            self._resolve(g, s.node, s.via, node.name)
        if s.last_llm_start is not None and s.via.category != HUMAN:
            # The pace of work: a person's wait between turns is no part of it.
            g.cycle_n += 1
            g.cycle_mean += (t - s.last_llm_start - g.cycle_mean) * (1.0 / g.cycle_n if g.cycle_n < 5 else _EWMA)
        node.visits += 1
        return node.name

    def rename_node(self, s: SessionRecord, name: str) -> str:
        """The graph's name for node `name` of `s`'s workflow (created if new)."""
        return self._node(self._graph(s.graph), name).name

    def learn_gap(self, s: SessionRecord) -> None:
        """Without hints, `s`'s response ended: its gap `s.via` follows its node."""
        node = self._graph(s.graph).nodes.get(s.node)
        if node is not None:
            node.tools[s.via] = node.tools.get(s.via, 0.0) + 1

    def forget_gap(self, s: SessionRecord) -> None:
        """`s`'s gap `s.via` turned out to be a tool call: undo `learn_gap`."""
        node = self._graph(s.graph).nodes.get(s.node)
        if node is not None and node.tools.get(s.via, 0.0) > 0:
            node.tools[s.via] -= 1
            if node.tools[s.via] <= 0:
                del node.tools[s.via]

    def learn_tool(self, s: SessionRecord, tool: str, category: str) -> ToolKey:
        """`s` starts a tool call: returns its key (its category guessed when not
        given); past `max_tools` an overflow key per category. The first tool of a
        batch (none running yet) counts as what followed the node."""
        cat = category or guess_category(tool)
        key = ToolKey(tool, cat)
        g = self._graph(s.graph)
        if key not in g.tools and len(g.tools) >= self.max_tools:
            key = ToolKey(_OVERFLOW, cat)
        if not s.running_tools:
            node = g.nodes.get(s.node) if s.node else None
            if node is not None:
                node.tools[key] = node.tools.get(key, 0.0) + 1
            g.tools[key] = g.tools.get(key, 0.0) + 1
        return key

    def learn_duration(self, s: SessionRecord, key: ToolKey, duration: float) -> None:
        """A tool call (or gap) of `s` lasted `duration` seconds."""
        self._add_duration(self._graph(s.graph), key, duration)

    def learn_growth(self, s: SessionRecord, prompt_tokens: int) -> None:
        """`s`'s prompt became known: the growth of the edge it came by (`entered_from`)."""
        growth = prompt_tokens - s.base_tokens
        g = self._graph(s.graph)
        n_from, via = s.entered_from
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

    def learn_end(self, s: SessionRecord) -> None:
        """`s` ended (or went silent): its edge led to END after `s.steps` steps."""
        g = self._graph(s.graph)
        if s.node:
            self._resolve(g, s.node, s.via, END)
        g.sessions_done += 1
        g.steps_mean += (s.steps - g.steps_mean) * (1.0 / g.sessions_done if g.sessions_done < 5 else _EWMA)
        if g.lengths is None:
            g.lengths = _lengths()
        g.lengths.add(float(s.steps))

    def learn_turn(self, s: SessionRecord) -> None:
        """`s`'s user turn ended (`turns`; the table publishes only turns with a
        step): it took the steps since it started."""
        g = self._graph(s.graph)
        if g.turns is None:
            g.turns = _lengths()
        g.turns.add(float(s.steps - s.turn_steps))

    def learn_spawn(self, parent: SessionRecord) -> tuple[str, str] | None:
        """A subagent of `parent` started while `parent` waited after its node: counts
        for that node. Returns the spawn site (workflow graph, node) that the child's
        duration is learnt for (`learn_child_end`); None when the parent has no node."""
        g = self._graphs.get(parent.graph)
        node = g.nodes.get(parent.node) if g is not None and parent.node else None
        if node is None:
            return None
        node.spawned += 1
        return g.name, node.name

    def learn_child_end(self, site: tuple[str, str], duration: float) -> None:
        """A subagent started at `site` (`learn_spawn`) ran `duration` seconds."""
        g = self._graphs.get(site[0])
        node = g.nodes.get(site[1]) if g is not None else None
        if node is None or not 0.0 <= duration < math.inf:
            return
        if node.child_durations is None:
            node.child_durations = LogHistogram()
        node.child_durations.add(duration)

    def spawns_per_visit(self, workflow: str, node: str) -> float:
        """Mean number of subagents a visit of the node starts (0 if unknown)."""
        g = self._graphs.get(workflow)
        n = g.nodes.get(node) if g is not None else None
        return n.spawned / n.visits if n is not None and n.visits else 0.0

    def child_dist(self, site: tuple[str, str] | None) -> LogHistogram | None:
        """The learnt duration of subagents started at `site`, once it has
        `min_samples` samples; else None."""
        if site is None:
            return None
        g = self._graphs.get(site[0])
        node = g.nodes.get(site[1]) if g is not None else None
        h = node.child_durations if node is not None else None
        return h if h is not None and h.samples >= self.min_samples else None

    def declare(self, workflow: str, structure) -> None:
        """Seed counts (weight 0.5 each) from a declared structure, so predictions
        follow it before there is data; observed counts outweigh it quickly."""
        g = self._graph(workflow)
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
                node.tools[ToolKey(b)] = node.tools.get(ToolKey(b), 0.0) + w
            elif ka == "llm":
                e = self._node(g, a).edges.setdefault(NO_TOOL, _Edge())
                e.succ[nxt] = e.succ.get(nxt, 0.0) + w
            elif ka == "tool":
                for src in tool_preds.get(a, ()):
                    e = self._node(g, src).edges.setdefault(ToolKey(a), _Edge())
                    e.succ[nxt] = e.succ.get(nxt, 0.0) + w

    # -- learnt state: what survives a restart (`saga_server.state_file`) ---------------

    def learnt(self) -> dict:
        """Everything learnt, as plain JSON-able data: per workflow its graph (node,
        workflow and tool names, counts, durations), and the cross-workflow
        durations. No record of a session, nothing of a prompt."""
        return {"graphs": [_graph_state(g) for g in self._graphs.values()],  # least recently used first
                "by_category": {c: h.state() for c, h in self._by_category.items()},
                "global": self._global.state()}

    def restore_learnt(self, data: dict) -> None:
        """Replace what was learnt with `data` (from `learnt`), within this object's
        bounds; ValueError, with nothing changed, if `data` is not such a state."""
        if not isinstance(data, dict) or not isinstance(data.get("graphs"), list):
            raise ValueError("learnt graphs must be an object with a list of graphs")
        graphs: OrderedDict[str, _Graph] = OrderedDict()
        for item in data["graphs"][-self.max_workflows:]:
            g = _graph_from(item, self.max_nodes, 2 * self.max_tools)
            graphs[g.name] = g
        by_category = {_name(c): LogHistogram.from_state(h)
                       for c, h in list(_mapping(data.get("by_category")).items())[:4 * self.max_tools]}
        glob = LogHistogram.from_state(data.get("global"))
        self._graphs, self._by_category, self._global = graphs, by_category, glob

    # -- predictions --------------------------------------------------------------

    def prediction(self, s: SessionRecord, now: float) -> Prediction:
        if s.ended:
            return Prediction(0.0, math.inf, math.inf, math.inf, "", 0.0, "", 0.0, 0.0)
        g = self._graphs.get(s.graph)
        node = g.nodes.get(s.node) if g is not None else None
        p = self.p_continue(s, g, node)
        mean, p50, p90 = self._resume(s, now)
        next_node = ""
        if node is not None:
            e = node.edges.get(s.via) if s.via != NO_TOOL else None
            succ = e.succ if e is not None and e.succ else _merged_succ(node)
            next_node = _argmax(succ, skip=END)
        growth = self._growth(s, g, node)
        cat = self.next_tool_category(s)
        steps, rem_t = self._remaining(s, g, p)
        return Prediction(p, mean, p50, p90, next_node, growth, cat, steps, rem_t)

    def growth_of(self, s: SessionRecord) -> float:
        """Expected tokens the session's next prompt adds to its context (the tool
        output the agent appends): the edge's mean, else the node's, else the graph's."""
        g = self._graphs.get(s.graph)
        return self._growth(s, g, g.nodes.get(s.node) if g is not None else None)

    def _growth(self, s: SessionRecord, g: _Graph | None, node: _Node | None) -> float:
        if node is not None:
            e = node.edges.get(s.via) if s.via != NO_TOOL else None
            if e is not None and e.growth_n:
                return e.growth_mean
            if node.growth_n:
                return node.growth_mean
        return g.growth_mean if g is not None and g.growth_n else 0.0

    def prior(self) -> Prediction:
        """The prediction for a session nobody knows."""
        d, p = self._global, self.prior_p_continue
        return Prediction(p, d.mean(), d.quantile(0.5), d.quantile(0.9), "", 0.0, "",
                          p / (1 - min(p, 0.99)), self.prior_cycle_s * p / (1 - min(p, 0.99)))

    def reuse_of(self, s: SessionRecord, now: float, q: float | None = None) -> tuple[float, float]:
        """(p_continue, time to the next call) without the rest of a prediction:
        the hot path of eviction scoring. The time is the mean of what is left of the
        wait, or with `q` its q-quantile (while subagents run: the longest of their
        expected remaining times either way)."""
        if s.ended:
            return 0.0, math.inf
        p = self.p_continue(s)
        if s.in_llm and not s.running_tools:
            return p, 0.0
        if s.children:
            return p, self.children_remaining_s(s, now)
        d, t0 = self.resume_dist(s)
        if d is None:
            d, t0 = self.idle_dist(s), s.last_event_at
        el = now - t0 if now > t0 else 0.0
        return p, (d.mean_above(el) if q is None else d.quantile_above(q, el)) - el

    def p_continue(self, s: SessionRecord, g: _Graph | None = None, node: _Node | None = None) -> float:
        if s.ended:
            return 0.0
        if s.children:
            return 1.0  # a parent waiting on its subagents takes their results back
        if g is None:
            g = self._graphs.get(s.graph)
            node = g.nodes.get(s.node) if g is not None else None
        a = self.smoothing
        p_node = self.prior_p_continue
        if node is not None:
            p_node = (node.resumed + a * self.prior_p_continue) / (node.resumed + node.ended + a)
            if s.via != NO_TOOL:
                e = node.edges.get(s.via)
                if e is not None:
                    return (e.resumed + a * p_node) / (e.resumed + e.ended + a)
        return p_node

    def resume_dist(self, s: SessionRecord):
        """The duration distribution of what the session is waiting on, and its start."""
        g = self._graphs.get(s.graph)
        if s.running_tools:
            best, best_t0, best_m = None, 0.0, -1.0
            for key, t0, expected in s.running_tools.values():
                d = self._dist(g, key, key.category, expected)
                m = d.mean_above(0.0) + t0
                if m > best_m:
                    best, best_t0, best_m = d, t0, m
            return best, best_t0
        if s.gap_started is not None:
            return self._dist(g, s.via, s.via.category, None), s.gap_started
        if s.via != NO_TOOL and not s.in_llm:
            return _NOW, s.last_event_at  # its tools are done: the next call is imminent
        return None, 0.0

    def idle_dist(self, s: SessionRecord):
        # Hinted, between a response and its tool call: the tool that usually
        # follows this node is the best guess, then the workflow's usual tool.
        g = self._graphs.get(s.graph)
        if g is None:
            return self._global
        node = g.nodes.get(s.node)
        counts = node.tools if node is not None and node.tools else g.tools
        key = _argmax(counts, skip=NO_TOOL, none=NO_TOOL)
        # The category's durations stand in only for a tool this graph has timed.
        return self._dist(g, key, key.category if key in g.durations else "", None)

    def next_tool_category(self, s: SessionRecord) -> str:
        g = self._graphs.get(s.graph)
        if g is None:
            return ""
        node = g.nodes.get(s.node)
        counts = node.tools if node is not None and node.tools else g.tools
        best = _argmax(counts, skip=NO_TOOL, none=NO_TOOL)
        # A gap is no tool: its pseudo-category shows only once the gap was timed.
        return "" if best.category == GAP and best not in g.durations else best.category

    def remaining(self, s: SessionRecord, q: float | None = None) -> tuple[float, float]:
        """(further LLM steps, seconds until the session ends): expected, or with `q`
        in (0, 1) their q-quantile (`q` = 0.9: a length it stays within nine times in
        ten), from the lengths of its workflow's finished sessions given it has run
        this far; before any finished, from the prior's geometric length; while too
        few have to tell their spread, their mean length either way."""
        return self._remaining(s, self._graphs.get(s.graph), self.p_continue(s), q)

    def remaining_in_turn(self, s: SessionRecord, q: float | None = None) -> tuple[float, float]:
        """(further LLM steps, seconds) until the session's running user turn ends
        (`turns`), expected or their q-quantile as `remaining`: from the turns its
        workflow has finished, else until the session ends (a turn never outlasts
        its session)."""
        g = self._graphs.get(s.graph)
        p = self.p_continue(s, g, g.nodes.get(s.node) if g is not None else None)
        if g is None or g.turns is None or g.turns.samples < self.min_samples or p <= 0.0:
            return self._remaining(s, g, p, q)
        done = float(s.steps - s.turn_steps)
        steps = max(_further(g.turns, done, q), p)
        cycle = g.cycle_mean if g.cycle_n else self.prior_cycle_s
        return steps, steps * cycle

    def tool_distribution(self, workflow: str, tool: str, category: str = "",
                          expected_s: float | None = None):
        cat = category or guess_category(tool)
        return self._dist(self._graphs.get(workflow), ToolKey(tool, cat), cat, expected_s)

    # -- internals --------------------------------------------------------------

    def children_remaining_s(self, s: SessionRecord, now: float) -> float:
        """Expected seconds until the last of `s`'s live children ends (the tracker,
        which knows the records, answers: `AEG`); 0 here."""
        return 0.0

    def _resume(self, s: SessionRecord, now: float) -> tuple[float, float, float]:
        if s.in_llm and not s.running_tools:
            return 0.0, 0.0, 0.0
        if s.children:
            rem = self.children_remaining_s(s, now)
            return rem, rem, rem
        d, t0 = self.resume_dist(s)
        if d is None:
            d, t0 = self.idle_dist(s), s.last_event_at
        el = max(now - t0, 0.0)
        return (d.mean_above(el) - el, d.quantile_above(0.5, el) - el, d.quantile_above(0.9, el) - el)

    def _remaining(self, s: SessionRecord, g: _Graph | None, p: float,
                   q: float | None = None) -> tuple[float, float]:
        if p <= 0.0:
            return 0.0, 0.0
        # Without finished sessions to learn from, a geometric number of steps.
        pc = min(p, 0.99)
        steps = pc / (1.0 - pc) if q is None else max(math.ceil(math.log1p(-q) / math.log(pc)) - 1.0, p)
        if g is not None and g.lengths is not None and g.lengths.samples >= self.min_samples:
            # E[N - k | N > k] over the lengths seen: a session that has outlived the
            # usual length is likely a long one, not one about to end.
            steps = max(_further(g.lengths, float(s.steps), q), p)
        elif g is not None and g.sessions_done:
            steps = max(g.steps_mean - s.steps, p)
        cycle = g.cycle_mean if g is not None and g.cycle_n else self.prior_cycle_s
        return steps, steps * cycle

    def _dist(self, g: _Graph | None, key: ToolKey, cat: str, expected: float | None):
        if self.exact_expected and expected is not None and expected >= 0:
            return _Exact(expected)
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

    def _add_duration(self, g: _Graph, key: ToolKey, d: float) -> None:
        if not d >= 0.0 or d == math.inf:
            return
        self.counters["tool_samples"] += 1
        cat = key.category
        h = g.durations.get(key)
        if h is None and len(g.durations) < 2 * self.max_tools:
            h = g.durations[key] = LogHistogram()
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

    def _resolve(self, g: _Graph, node_name: str, via: ToolKey, nxt: str) -> None:
        node = g.nodes.get(node_name)
        if node is None:
            return
        e = node.edges.get(via)
        if e is None:
            e = node.edges[via] = _Edge()
        if nxt == END:
            e.ended += 1
            node.ended += 1
        else:
            e.resumed += 1
            node.resumed += 1
        e.succ[nxt] = e.succ.get(nxt, 0.0) + 1

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


def _merged_succ(node: _Node) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in node.edges.values():
        for k, v in e.succ.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _argmax(counts: dict, skip, none=""):
    """The key with the highest count but `skip` (`none` if there is none)."""
    best, best_v = none, -1.0
    for k, v in counts.items():
        # Ties go to the lexicographically smaller name: deterministic across runs.
        if k != skip and (v > best_v or (v == best_v and str(k) < str(best))):
            best, best_v = k, v
    return best


# -- learnt state: (de)serialising a graph -----------------------------------------------
# Tool keys are written by name (`str(key)`), with the categories of the timed ones
# ("categories"), which is what reads their names back (`ToolKey.from_name`).

_MAX_NAME = 1024


def _graph_state(g: _Graph) -> dict:
    return {"name": g.name, "nodes": [_node_state(n) for n in g.nodes.values()],
            "durations": {str(k): h.state() for k, h in g.durations.items()},
            "categories": {str(k): k.category for k in g.durations},
            "tools": _named(g.tools), "sessions_done": g.sessions_done, "steps_mean": g.steps_mean,
            "cycle_n": g.cycle_n, "cycle_mean": g.cycle_mean, "growth_n": g.growth_n, "growth_mean": g.growth_mean,
            "lengths": g.lengths.state() if g.lengths is not None else None,
            "turns": g.turns.state() if g.turns is not None else None}


def _node_state(n: _Node) -> dict:
    return {"name": n.name, "visits": n.visits, "tools": _named(n.tools),
            "edges": {str(via): {"resumed": e.resumed, "ended": e.ended, "succ": dict(e.succ),
                                 "growth_n": e.growth_n, "growth_mean": e.growth_mean} for via, e in n.edges.items()},
            "resumed": n.resumed, "ended": n.ended, "growth_n": n.growth_n, "growth_mean": n.growth_mean,
            "spawned": n.spawned,
            "child_durations": n.child_durations.state() if n.child_durations is not None else None}


def _graph_from(data, max_nodes: int, max_durations: int) -> _Graph:
    d = _mapping(data)
    g = _Graph(_name(d.get("name")))
    nodes = d.get("nodes")
    if not isinstance(nodes, list):
        raise ValueError("a graph's nodes must be a list")
    categories = {_name(k): _name(v, empty=True) for k, v in _mapping(d.get("categories")).items()}
    for item in nodes[:max_nodes]:
        node = _node_from(item, categories)
        g.nodes[node.name] = node
    g.durations = {ToolKey.from_name(_name(k), categories): LogHistogram.from_state(h)
                   for k, h in list(_mapping(d.get("durations")).items())[:max_durations]}
    g.tools = _tool_counts(d.get("tools"), categories)
    g.sessions_done, g.cycle_n = _count(d.get("sessions_done")), _count(d.get("cycle_n"))
    g.steps_mean, g.cycle_mean, g.growth_n, g.growth_mean = (
        _number(d.get(k)) for k in ("steps_mean", "cycle_mean", "growth_n", "growth_mean"))
    if d.get("lengths") is not None:  # absent from files written before lengths were learnt
        g.lengths = LogHistogram.from_state(d["lengths"])
    if d.get("turns") is not None:  # absent from files written before turns were learnt
        g.turns = LogHistogram.from_state(d["turns"])
    return g


def _node_from(data, categories: dict[str, str]) -> _Node:
    d = _mapping(data)
    n = _Node(_name(d.get("name")))
    n.visits, n.resumed, n.ended, n.growth_n, n.growth_mean, n.spawned = (
        _number(d.get(k)) for k in ("visits", "resumed", "ended", "growth_n", "growth_mean", "spawned"))
    n.tools = _tool_counts(d.get("tools"), categories)
    for via, e in _mapping(d.get("edges")).items():
        ed = _mapping(e)
        edge = _Edge(_number(ed.get("resumed")), _number(ed.get("ended")), _counts(ed.get("succ")),
                     _number(ed.get("growth_n")), _number(ed.get("growth_mean")))
        n.edges[ToolKey.from_name(_name(via, empty=True), categories)] = edge
    cd = d.get("child_durations")
    n.child_durations = None if cd is None else LogHistogram.from_state(cd)
    return n


def _mapping(value) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"expected an object, got {type(value).__name__}")
    return value


def _name(value, empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > _MAX_NAME or (not value and not empty):
        raise ValueError(f"bad name {value!r:.80}")
    return value


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r:.80}")
    return float(value)


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a count, got {value!r:.80}")
    return value


def _counts(value) -> dict[str, float]:
    return {_name(k, empty=True): _number(v) for k, v in _mapping(value).items()}


def _tool_counts(value, categories: dict[str, str]) -> dict[ToolKey, float]:
    return {ToolKey.from_name(k, categories): v for k, v in _counts(value).items()}


def _named(counts: dict[ToolKey, float]) -> dict[str, float]:
    return {str(k): v for k, v in counts.items()}


def _further(lengths: LogHistogram, done: float, q: float | None) -> float:
    """Steps left of a session that has run `done`, over the lengths seen: the mean
    of N - done given N > done, or (with `q`) its q-quantile."""
    if q is None:
        return lengths.mean_above(done) - done
    return lengths.quantile_above(q, done) - done
