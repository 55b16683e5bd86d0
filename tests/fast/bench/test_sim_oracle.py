"""The `oracle` reference: SAGA whose core is told every wait's true duration."""

from __future__ import annotations

from saga_server.bench.policies import make_policy
from saga_server.core import ToolCallStart
from saga_server.engines.sim import SimConfig, Simulator, StepSpec, TaskInstance, TaskSpec, ToolSpec, make_cost_model


def test_the_oracle_hints_each_waits_true_duration_and_saga_does_not():
    task = TaskSpec("t", "run", 0, (StepSpec(1000, 10, 0, (ToolSpec("bash", "run", 7.5),)),
                                    StepSpec(1100, 10, 1010, idle_s=42.0, human=True),
                                    StepSpec(1200, 10, 1110)))
    hinted = {}
    for name in ("oracle", "saga"):
        pol = make_policy(name)
        sim = Simulator(make_cost_model(), pol, [TaskInstance("s", task)], SimConfig(workers=1))
        accept = pol.core.accept
        pol.core.accept = lambda ev, caller=None, name=name: (
            hinted.setdefault(name, []).append(ev.expected_duration_s) if isinstance(ev, ToolCallStart) else None,
            accept(ev, caller))
        sim.run()
    assert hinted["oracle"] == [7.5, 42.0]
    assert hinted["saga"] == [None, None]
