"""Deadline-aware shaping in the simulator: an at-risk session meets a deadline that
slack-rich neighbours make it miss without the reservation (its prefill first,
theirs thinned while it decodes, another tenant's requests kept out of its batch)."""

from __future__ import annotations

from saga_server.bench.policies import make_policy
from saga_server.core.deadlines import DeadlineShaper
from saga_server.engines.sim import SimConfig, Simulator, StepSpec, TaskInstance, TaskSpec, ToolSpec, make_cost_model
from saga_server.engines.sim.results import SPLIT


def _tight() -> TaskSpec:
    """Decode-heavy steps: its pace is the iteration time."""
    steps = tuple(StepSpec(2000 + 2400 * i, 300, 2000 + 2400 * i - 2100 if i else 0,
                           (ToolSpec("bash", "run", 0.5),) if i < 3 else ()) for i in range(4))
    return TaskSpec("tight", "run", 0, steps)


def _loose(k: int) -> TaskSpec:
    """Long fresh prompts (a new 60k-token document each step): prefill-heavy."""
    steps = tuple(StepSpec(60_000, 20, 0, (ToolSpec("fetch", "other", 0.1),) if i < 5 else ()) for i in range(6))
    return TaskSpec(f"loose{k}", "run", 0, steps)


def _run(policy: str):
    insts = [TaskInstance(f"loose-{k}", _loose(k), "batch", deadline_factor=50.0) for k in range(6)]
    insts.append(TaskInstance("tight-0", _tight(), "interactive", deadline_factor=2.0))
    sim = Simulator(make_cost_model(kv_capacity_override=600_000), make_policy(policy), insts,
                    SimConfig(workers=1, seed=0))
    res = sim.run()
    return {t.session_id: t for t in res.tasks}, sim


def test_the_reservation_lets_an_at_risk_session_meet_its_deadline():
    shaped, _ = _run("saga")
    unshaped, _ = _run("saga-no-shape")
    tight, tight_without = shaped["tight-0"], unshaped["tight-0"]
    assert not tight_without.met_deadline  # the neighbours' prefill chunks stretch every decode
    assert tight.met_deadline
    assert tight.tct_s < 0.6 * tight_without.tct_s
    # the slack-rich sessions gave way and still finished in time
    assert all(t.met_deadline for sid, t in shaped.items() if sid.startswith("loose"))


def _long_context(k: int) -> TaskSpec:
    """A 100k-token context read every step, a short answer and a short tool: each of
    its requests makes every decode step beside it several times longer."""
    steps = tuple(StepSpec(100_000 + 100 * i, 30, 100_000 + 100 * i - 70 if i else 0,
                           (ToolSpec("read", "other", 0.2),) if i < 79 else ()) for i in range(80))
    return TaskSpec(f"long{k}", "run", 0, steps)


class _HoldOnlyWhileWaiting(DeadlineShaper):
    """The rule without its reservation of the batch: slack-rich requests are held
    only while an at-risk request waits, never while it runs."""

    __slots__ = ()

    def holds_back(self, request_key, session_id, tenant=""):
        return bool(self._waiting) and super().holds_back(request_key, session_id, tenant)


def test_another_tenants_long_contexts_stay_out_of_an_at_risk_decode():
    """An at-risk session arrives beside five slack-rich 100k-token sessions of another
    tenant: holding their requests only while its own waits lets them back into every
    decode step it runs, and it misses; keeping them out while it runs meets it, and
    they still finish in time."""

    def run(shaper_class):
        insts = [TaskInstance(f"long-{k}", _long_context(k), "batch", arrival_s=0.0, deadline_factor=50.0)
                 for k in range(5)]
        insts.append(TaskInstance("tight-0", _tight(), "interactive", arrival_s=60.0, deadline_factor=1.5))
        sim = Simulator(make_cost_model(kv_capacity_override=600_000), make_policy("saga"), insts,
                        SimConfig(workers=1, seed=0))
        sim.workers[0].engine.shaper.__class__ = shaper_class
        return {t.session_id: t for t in sim.run().tasks}

    reserved, waiting_only = run(DeadlineShaper), run(_HoldOnlyWhileWaiting)
    tight, tight_without = reserved["tight-0"], waiting_only["tight-0"]
    assert not tight_without.met_deadline
    decode_batch = tight_without.split[SPLIT.index("decode_batch")]
    assert decode_batch > 0.8 * (tight_without.tct_s - tight_without.unloaded_s)  # lost in full-batch decode
    assert tight.met_deadline
    assert all(t.met_deadline for sid, t in reserved.items() if sid.startswith("long"))


def test_within_a_tenant_a_slack_rich_request_is_not_held_once_the_at_risk_one_runs():
    """Its tenant's queue order already served the at-risk request: a short slack-rich
    request of the same tenant arriving beside its long decode runs at once."""
    tight = TaskSpec("tight", "run", 0, (StepSpec(1000, 3000, 0),))
    loose = TaskSpec("loose", "run", 0, (StepSpec(1000, 10, 0),))
    insts = [TaskInstance("tight-0", tight, "team", deadline_factor=1.1),
             TaskInstance("loose-0", loose, "team", deadline_factor=5000.0)]
    sim = Simulator(make_cost_model(kv_capacity_override=600_000), make_policy("saga"), insts,
                    SimConfig(workers=1, seed=0))
    done = {t.session_id: t for t in sim.run().tasks}
    assert done["loose-0"].finished_at < 0.1 * done["tight-0"].finished_at
    assert sim.workers[0].engine.shaper.at_risk() == 0  # every at-risk request was let go at its end


def test_the_thin_budget_keeps_up_with_the_prefill_arriving():
    """The neighbours' 60k-token prompts arrive faster than the piggyback budget can
    prefill them: the thin budget rises to the arrival rate's floor (`core.deadlines`,
    rule 2), and the at-risk session still meets its deadline."""
    budgets = []

    class Recorded(DeadlineShaper):
        __slots__ = ()

        def prefill_budget(self, prefilling, step_s):
            budgets.append(super().prefill_budget(prefilling, step_s))
            return budgets[-1]

    insts = [TaskInstance(f"loose-{k}", _loose(k), "batch", deadline_factor=50.0) for k in range(6)]
    insts.append(TaskInstance("tight-0", _tight(), "interactive", deadline_factor=2.0))
    cost = make_cost_model(kv_capacity_override=600_000)
    sim = Simulator(cost, make_policy("saga"), insts, SimConfig(workers=1, seed=0))
    sim.workers[0].engine.shaper.__class__ = Recorded
    done = {t.session_id: t for t in sim.run().tasks}
    assert done["tight-0"].met_deadline
    thin = [b for b in budgets if b]
    assert thin and min(thin) == cost.piggyback_tokens() < max(thin)


def _chat(wait_s: float) -> TaskSpec:
    """Two user turns of decode-heavy steps, a person's wait between them."""
    first = _tight().steps
    last = first[-1]
    answer = StepSpec(last.prompt_tokens, last.output_tokens, last.reused_tokens, idle_s=wait_s, human=True)
    return TaskSpec("chat", "run", 0, first[:-1] + (answer,) + first[:-1] + (last,))


def test_a_turn_deadline_told_at_the_start_keeps_each_user_turn_within_it():
    def run(policy: str):
        # One tenant: its fair share does not set the chat apart from its batch jobs.
        insts = [TaskInstance(f"loose-{k}", _loose(k), "team") for k in range(6)]
        insts.append(TaskInstance("chat-0", _chat(5.0), "team", turn_deadline_factor=2.0))
        sim = Simulator(make_cost_model(kv_capacity_override=600_000), make_policy(policy), insts,
                        SimConfig(workers=1, seed=0))
        return {t.session_id: t for t in sim.run().tasks}["chat-0"]

    told, untold = run("saga"), run("saga-no-turns")
    assert len(told.turn_spans) == len(untold.turn_spans) == 2
    assert all(span <= told.turn_deadline_s for span in told.turn_spans)
    assert untold.turn_spans[0] > 3 * told.turn_deadline_s  # its first turn queues behind the batch jobs
