"""Small builders for simulator tests: synthetic agent tasks with exact shapes."""

from __future__ import annotations

import random

from saga_server.engines.sim import StepSpec, TaskInstance, TaskSpec, ToolSpec


def chain_task(task_id: str, steps: int = 4, first_prompt: int = 1000, growth: int = 400,
               output: int = 50, tool_s: float = 1.0, shared: int = 0) -> TaskSpec:
    """An append-only agent loop: each prompt is the previous prompt + answer + `growth`."""
    out, prompt, prev = [], first_prompt, 0
    for i in range(steps):
        tools = (ToolSpec("bash", "run", tool_s),) if i + 1 < steps else ()
        out.append(StepSpec(prompt, output, prev, tools))
        prev = prompt + output
        prompt = prev + growth
    return TaskSpec(task_id, "run", shared, tuple(out))


def random_instances(n: int, seed: int, tenant: str = "t") -> list[TaskInstance]:
    rng = random.Random(seed)
    return [TaskInstance(f"{tenant}-{i}", chain_task(
        f"task{i}", steps=rng.randint(2, 6), first_prompt=rng.randint(500, 4000),
        growth=rng.randint(50, 800), output=rng.randint(10, 200), tool_s=rng.uniform(0.1, 5.0)),
        tenant) for i in range(n)]
