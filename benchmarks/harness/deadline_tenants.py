"""Two tenants with deadlines: a coding agent with slack and a browser agent without.

Writes `coding.jsonl` and `browser.jsonl` (`saga-trace/1`, one task per line) for a
two-tenant mix: `saga bench --tenant coding=<out>/coding.jsonl:1:4 --tenant
browser=<out>/browser.jsonl:3:2` replays them with deadlines of 4x and 2x a task's
unloaded time, the browser tenant taking three tasks in four.

- **coding** (an issue-fixing agent): a long system prompt and tool schemas, then
  a chain of calls whose context grows by every tool result (file reads, test
  output), tools mostly fast with a tail (a test run).
- **browser** (a web-navigation agent): every call sends the page's current
  accessibility tree, which replaces the previous one, so the reusable prefix is the
  system prompt and the action history only; short answers (one action); page loads
  of about a second between calls.

`replay_tasks` draws the same two tenants scaled to the default model's 4k context,
for the real-engine replay (`serve_deadlines.py`) and its simulator twin
(`sim_serve_deadlines.py`).

Every number is an assumption of this generator (`ASSUMED`): these are development
inputs of the shape such agents have, not fits to any recorded run, and claims are
never tuned to them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["ASSUMED", "CodingShape", "BrowserShape", "coding_task", "browser_task", "generate", "REPLAY_CODING",
           "REPLAY_BROWSER", "MAX_PROMPT", "replay_tasks"]

ASSUMED = "no published figure: a stated assumption of this generator"
_Z90 = 1.2815515655446004


@dataclass(frozen=True, slots=True)
class CodingShape:
    steps_mean: float = 24.0  # LLM calls per task (geometric, at least 4)
    prefix_tokens: int = 6000  # system prompt and tool schemas
    task_tokens: int = 800  # the issue text
    append_mean_tokens: float = 900.0  # a tool result (log-normal, sigma 1.0)
    append_max_tokens: int = 12_000
    output_mean_tokens: float = 220.0  # a thought and one tool call (log-normal, sigma 0.6)
    tool_median_s: float = 0.4
    tool_p90_s: float = 6.0


@dataclass(frozen=True, slots=True)
class BrowserShape:
    steps_mean: float = 14.0  # actions per task (geometric, at least 3)
    prefix_tokens: int = 2500  # system prompt, action space, the goal
    page_mean_tokens: float = 3500.0  # an accessibility tree (log-normal, sigma 0.5)
    history_tokens_per_step: int = 60  # each past action, kept in the prompt
    output_mean_tokens: float = 90.0  # one action (log-normal, sigma 0.5)
    page_load_median_s: float = 1.0
    page_load_p90_s: float = 3.0


def _lognormal_p90(rng: random.Random, median: float, p90: float) -> float:
    return median * math.exp(math.log(p90 / median) / _Z90 * rng.gauss(0.0, 1.0))


def _lognormal_mean(rng: random.Random, mean: float, sigma: float) -> int:
    return max(1, round(mean * math.exp(sigma * rng.gauss(0.0, 1.0) - sigma * sigma / 2)))


def _steps(rng: random.Random, mean: float, least: int) -> int:
    p = 1.0 / max(mean - least + 1, 1.0)
    return least + int(math.log(1.0 - rng.random()) / math.log(1.0 - p)) if p < 1 else least


def _task(task_id: str, agent: str, prefix: int, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": "saga-trace/1", "source": "deadline_tenants.py", "agent": agent, "benchmark": "generated",
            "run": agent, "model": "", "task_id": task_id, "shared_prefix_tokens": prefix, "steps": steps}


def coding_task(rng: random.Random, shape: CodingShape, task_id: str) -> dict[str, Any]:
    n = _steps(rng, shape.steps_mean, 4)
    context, reused, steps = shape.prefix_tokens + shape.task_tokens, 0, []
    for k in range(n):
        out = _lognormal_mean(rng, shape.output_mean_tokens, 0.6)
        st: dict[str, Any] = {"prompt_tokens": context, "output_tokens": out, "reused_prefix_tokens": reused,
                              "tools": []}
        if k + 1 < n:
            st["tools"] = [{"name": "bash", "category": "run",
                            "duration_s": round(min(_lognormal_p90(rng, shape.tool_median_s, shape.tool_p90_s),
                                                    300.0), 3)}]
        steps.append(st)
        reused = context + out
        context = reused + min(_lognormal_mean(rng, shape.append_mean_tokens, 1.0), shape.append_max_tokens)
    return _task(task_id, "coding-agent", shape.prefix_tokens, steps)


def browser_task(rng: random.Random, shape: BrowserShape, task_id: str) -> dict[str, Any]:
    n = _steps(rng, shape.steps_mean, 3)
    steps = []
    for k in range(n):
        history = shape.prefix_tokens + k * shape.history_tokens_per_step
        page = _lognormal_mean(rng, shape.page_mean_tokens, 0.5)
        st: dict[str, Any] = {"prompt_tokens": history + page,
                              "output_tokens": _lognormal_mean(rng, shape.output_mean_tokens, 0.5),
                              # the page replaced the last one: only the history is reusable
                              "reused_prefix_tokens": history if k else 0, "tools": []}
        if k + 1 < n:
            st["tools"] = [{"name": "browser_action", "category": "other",
                            "duration_s": round(_lognormal_p90(rng, shape.page_load_median_s,
                                                               shape.page_load_p90_s), 3)}]
        steps.append(st)
    return _task(task_id, "browser-agent", shape.prefix_tokens, steps)


def generate(n: int, seed: int = 0, coding: CodingShape = CodingShape(),
             browser: BrowserShape = BrowserShape()) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`n` tasks of each tenant, the same for the same seed and shapes."""
    rng = random.Random(seed)
    return ([coding_task(rng, coding, f"coding-{seed}-{i:05d}") for i in range(n)],
            [browser_task(rng, browser, f"browser-{seed}-{i:05d}") for i in range(n)])


# The real-engine replay's shapes: the defaults scaled to a 4k context, every size about 1/8.
REPLAY_CODING = CodingShape(steps_mean=6.0, prefix_tokens=700, task_tokens=100, append_mean_tokens=120.0,
                            append_max_tokens=500, output_mean_tokens=40.0, tool_median_s=0.4, tool_p90_s=3.0)
REPLAY_BROWSER = BrowserShape(steps_mean=5.0, prefix_tokens=300, page_mean_tokens=450.0, history_tokens_per_step=10,
                              output_mean_tokens=12.0, page_load_median_s=0.8, page_load_p90_s=2.0)
MAX_PROMPT = 3500  # prompt and answer tokens that fit the default model's context


def replay_tasks(n_coding: int, n_browser: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    """The replay's tasks (saga-trace/1 dicts) by tenant, each without the calls that
    would not fit the model's context; the same for the same seed."""
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {}
    for tenant, n, make, shape in (("coding", n_coding, coding_task, REPLAY_CODING),
                                   ("browser", n_browser, browser_task, REPLAY_BROWSER)):
        out[tenant] = []
        for i in range(n):
            raw = make(rng, shape, f"{tenant}-{i}")
            raw["steps"] = [st for st in raw["steps"] if st["prompt_tokens"] + st["output_tokens"] <= MAX_PROMPT]
            out[tenant].append(raw)
    return out
