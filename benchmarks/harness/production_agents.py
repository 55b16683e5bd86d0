"""Production-shaped coding-agent sessions, generated from published statistics.

Writes `saga-trace/1` tasks (one session per line) that `saga bench` and the
simulator benchmarks load like any recorded trace. A session is several user turns;
a turn is a chain of LLM calls with tool calls between them, ending in an answer
without a tool, after which a person takes minutes (a tail of hours) to write the
next turn (`human_idle_s`). Its context grows with every tool result; near the
context window the agent compacts: a summarising call, then a prompt that restarts
from the shared prefix plus the summary (`compaction`). Each step says what a hosted
API's prefix cache would have served (`provider_cached_tokens`): the reused prefix
while the provider's cache TTL has not run out since the last call, else only the
shared prefix (which other sessions keep warm).

Where each number comes from (`SOURCES` keys; every default below names one):

- `tracelab`: SyFI TraceLab ("SyFI Trace Atlas"), University of Washington,
  https://tracelab.cs.washington.edu/ : 4,265 Claude Code and Codex sessions,
  357,161 agent steps, 432,510 tool calls, 54.9B input tokens of which 52.6B (96%)
  were read from the provider's cache, 2.34B appended input tokens, 186.9M output
  tokens (dataset snapshot, Sep 2025 - Jun 2026). Per step: 6.55k appended tokens,
  523 output tokens, 1.21 tool calls. Its human-wait figures (exp/human_wait_*) and
  tool-latency figures (exp/tool_calls/tool_latency_distribution) give the medians
  and tails used below; its compaction study (exp/session/session_compaction_counts)
  defines a compaction as a drop of >= 64k tokens near the session's peak context.
- `copilot`: GitHub Copilot's agent-mode trace release, as summarised for this
  project: mean prompt about 68k tokens per call, 85-96% of prompt tokens cached by
  the provider, about 4 user turns per session and 7-8 LLM calls per turn, about 1.1
  tool calls per tool step, tools with a median of 0.1-0.6 s, a p90 of 12-15 s and a
  p99 of minutes, a human's wait between turns of about 2 min median, about 20 min
  p90 and a tail of hours, compaction in 5-20% of sessions.
- `anthropic`: Anthropic's prompt-caching documentation: a cache entry lives 5
  minutes after its last use unless a 1-hour TTL is asked for.
- `claude-code`: Claude Code's settings documentation: a Bash command runs at most
  `BASH_MAX_TIMEOUT_MS`, 10 minutes by default, so no tool call runs longer.
- `assumed`: no published figure used; a parameter of the generator, stated as such.

Claims are not tuned to this generator: it is a development input, and `--help`
shows every knob so that other shapes can be drawn from it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["SOURCES", "ProductionShape", "generate", "session", "summary"]

SOURCES = {
    "tracelab": "SyFI TraceLab, https://tracelab.cs.washington.edu/ (Claude Code and Codex sessions)",
    "copilot": "GitHub Copilot agent-mode trace release (summary statistics)",
    "anthropic": "Anthropic prompt caching documentation (5-minute default cache TTL)",
    "claude-code": "Claude Code settings documentation (BASH_MAX_TIMEOUT_MS: a command's longest timeout, 10 min)",
    "assumed": "no published figure: a stated assumption of this generator",
}


@dataclass(frozen=True, slots=True)
class ProductionShape:
    """The distributions a session is drawn from. Each field's comment names its source."""

    turns_mean: float = 4.0  # copilot: ~4 user turns per session (geometric, at least 1)
    calls_per_turn_mean: float = 8.0  # copilot: 7-8 LLM calls per turn (geometric, at least 1)
    extra_tool_call_p: float = 0.1  # copilot: ~1.1 tool calls per tool step
    tool_median_s: float = 0.3  # copilot / tracelab: tool median 0.1-0.6 s
    tool_p90_s: float = 13.0  # copilot / tracelab: tool p90 12-15 s (log-normal: p99 ~4.5 min)
    tool_max_s: float = 600.0  # claude-code: a tool call's longest timeout, 10 min
    human_median_s: float = 120.0  # copilot / tracelab: a human's wait, median ~2 min
    human_p90_s: float = 1200.0  # copilot / tracelab: p90 ~20 min (log-normal: p99 ~2 h)
    # copilot: set so that the mean prompt comes out near its ~68k tokens. TraceLab's
    # 6.55k appended tokens per step are an upper bound: they count cache misses too.
    append_mean_tokens: float = 2500.0
    append_sigma: float = 1.2  # assumed: spread of a step's appended tokens (file reads are heavy)
    append_max_tokens: int = 25_000  # assumed: agents truncate a long tool output
    output_mean_tokens: float = 523.0  # tracelab: 186.9M output tokens / 357,161 steps
    output_sigma: float = 1.0  # assumed
    shared_prefix_tokens: int = 12_000  # assumed: system prompt and tool schemas
    user_message_tokens: int = 300  # assumed: a turn's new user message
    context_window: int = 200_000  # assumed: a 200k-token window, as Claude's models have
    compact_at: float = 0.8  # assumed: compaction once the next prompt would pass this share of the window
    summary_tokens: int = 3000  # assumed: the summary a compaction keeps
    provider_cache_ttl_s: float = 300.0  # anthropic: 5-minute default cache TTL

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{f.name} must be a finite number >= 0, got {v!r}")
        if self.turns_mean < 1 or self.calls_per_turn_mean < 1:
            raise ValueError("turns_mean and calls_per_turn_mean must be >= 1")
        if not 0 < self.compact_at <= 1 or self.extra_tool_call_p > 1:
            raise ValueError("compact_at must be in (0, 1] and extra_tool_call_p in [0, 1]")
        if self.tool_p90_s <= self.tool_median_s or self.human_p90_s <= self.human_median_s:
            raise ValueError("a p90 must exceed its median")
        if self.shared_prefix_tokens + self.summary_tokens + self.user_message_tokens >= self.compact_at * self.context_window:
            raise ValueError("the compacted context would not fit under the compaction threshold")
        if self.compact_at * self.context_window + self.append_max_tokens + self.user_message_tokens > self.context_window:
            raise ValueError("a prompt could pass the context window before compaction: lower compact_at or append_max_tokens")


# Categories by what coding agents' tools do; the mix is assumed (TraceLab's
# tool_category_distribution has the measured one), durations come from one
# distribution whatever the category.
_TOOLS = (("read_file", "read", 0.35), ("grep", "search", 0.2), ("edit_file", "edit", 0.2),
          ("bash", "run", 0.15), ("run_tests", "test", 0.07), ("web_fetch", "other", 0.03))
_Z90 = 1.2815515655446004


def _lognormal(rng: random.Random, median: float, p90: float) -> float:
    return median * math.exp(math.log(p90 / median) / _Z90 * rng.gauss(0.0, 1.0))


def _lognormal_mean(rng: random.Random, mean: float, sigma: float) -> int:
    return max(1, round(mean * math.exp(sigma * rng.gauss(0.0, 1.0) - sigma * sigma / 2)))


def _geometric(rng: random.Random, mean: float) -> int:
    """At least 1, with the given mean."""
    if mean <= 1:
        return 1
    p = 1.0 / mean
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - p))


def session(rng: random.Random, shape: ProductionShape, task_id: str) -> dict[str, Any]:
    """One `saga-trace/1` task."""
    prefix = shape.shared_prefix_tokens
    limit = shape.compact_at * shape.context_window
    steps: list[dict[str, Any]] = []
    context = prefix  # tokens of the next prompt so far
    reused = 0  # of them, the previous prompt plus its answer
    gap = 0.0  # seconds since the previous call
    compacted = False
    turns = _geometric(rng, shape.turns_mean)

    def call(output: int) -> dict[str, Any]:
        nonlocal context, reused
        cached = reused if gap <= shape.provider_cache_ttl_s else min(reused, prefix)
        st = {"prompt_tokens": context, "output_tokens": output, "reused_prefix_tokens": reused,
              "provider_cached_tokens": cached if steps else min(prefix, context), "tools": []}
        if compacted:
            st["compaction"] = True
        steps.append(st)
        reused = context + output
        context = reused
        return st

    for turn in range(turns):
        context += shape.user_message_tokens
        calls = _geometric(rng, shape.calls_per_turn_mean)
        for k in range(calls):
            if context > limit:  # compact first: summarise, restart
                st = call(shape.summary_tokens)
                gap = 0.0
                context = reused = prefix
                context += shape.summary_tokens + shape.user_message_tokens
                compacted = True
            st = call(_lognormal_mean(rng, shape.output_mean_tokens, shape.output_sigma))
            compacted = False
            if k + 1 < calls:  # a tool step: its results are the next call's new tokens
                n = 1 + (rng.random() < shape.extra_tool_call_p)
                names = rng.choices(_TOOLS, weights=[w for _, _, w in _TOOLS], k=n)
                st["tools"] = [{"name": name, "category": cat,
                                "duration_s": round(min(_lognormal(rng, shape.tool_median_s, shape.tool_p90_s),
                                                        shape.tool_max_s), 3)}
                               for name, cat, _ in names]
                gap = max(t["duration_s"] for t in st["tools"])
                context += min(_lognormal_mean(rng, shape.append_mean_tokens, shape.append_sigma),
                               shape.append_max_tokens)
            elif turn + 1 < turns:  # the turn's answer: a person writes the next one
                gap = round(_lognormal(rng, shape.human_median_s, shape.human_p90_s), 1)
                st["human_idle_s"] = gap
    return {"format": "saga-trace/1", "source": "production_agents.py", "agent": "coding-agent",
            "benchmark": "production-shaped", "run": "production", "model": "", "task_id": task_id,
            "shared_prefix_tokens": prefix, "steps": steps}


def generate(n: int, seed: int = 0, shape: ProductionShape = ProductionShape()) -> list[dict[str, Any]]:
    """`n` sessions, the same for the same seed and shape."""
    rng = random.Random(seed)
    return [session(rng, shape, f"prod-{seed}-{i:05d}") for i in range(n)]


def summary(tasks: list[dict[str, Any]]) -> dict[str, float]:
    """The generated workload's own statistics, to set beside the published ones."""
    steps = [st for t in tasks for st in t["steps"]]
    prompts = sum(st["prompt_tokens"] for st in steps)
    tools = [tl["duration_s"] for st in steps for tl in st["tools"]]
    humans = sorted(st["human_idle_s"] for st in steps if "human_idle_s" in st)
    tool_steps = [st for st in steps if st["tools"]]
    tools.sort()

    def q(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else math.nan

    return {
        "sessions": len(tasks),
        "steps_per_session": len(steps) / len(tasks),
        "turns_per_session": (len(humans) + len(tasks)) / len(tasks),
        "mean_prompt_tokens": prompts / len(steps),
        "max_prompt_tokens": max(st["prompt_tokens"] for st in steps),
        "provider_cached_share": sum(st["provider_cached_tokens"] for st in steps) / prompts,
        "reusable_share": sum(st["reused_prefix_tokens"] for st in steps) / prompts,
        "tool_calls_per_tool_step": len(tools) / max(len(tool_steps), 1),
        "tool_median_s": q(tools, 0.5), "tool_p90_s": q(tools, 0.9), "tool_p99_s": q(tools, 0.99),
        "human_median_s": q(humans, 0.5), "human_p90_s": q(humans, 0.9), "human_p99_s": q(humans, 0.99),
        "sessions_compacting": sum(any(st.get("compaction") for st in t["steps"]) for t in tasks) / len(tasks),
    }
