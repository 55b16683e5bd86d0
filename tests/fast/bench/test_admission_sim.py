"""Session admission in the simulator: a no-op where KV fits, whole sessions instead of
thrash where it does not, completion times counted from arrival, and the host tier
in the policy's order."""

from __future__ import annotations

from saga_server.bench.policies import make_policy
from saga_server.engines.sim import HostTier, SimConfig, Simulator, TaskInstance, make_cost_model

from .helpers import chain_task


def sessions(n: int, steps: int = 8, first: int = 3000, growth: int = 600, tool_s: float = 0.5):
    return [TaskInstance(f"s{i}", chain_task(f"t{i}", steps=steps, first_prompt=first + 37 * i,
                                             growth=growth, output=40, tool_s=tool_s)) for i in range(n)]


def run(policy: str, insts, kv_tokens: int, concurrency: int | None = None, host: float = 1.0):
    cost = make_cost_model(kv_capacity_override=kv_tokens)
    cfg = SimConfig(workers=1, concurrency=concurrency, host_tier_factor=host)
    return Simulator(cost, make_policy(policy), insts, cfg).run()


def mean_tct(res) -> float:
    return sum(t.tct_s for t in res.tasks) / len(res.tasks)


def test_where_the_sessions_fit_admission_changes_nothing():
    insts = sessions(6)
    with_adm, without = run("saga", insts, 400_000), run("saga-no-admit", insts, 400_000)
    assert with_adm.admitted_after_wait == 0 and with_adm.parked == 0
    assert [t.tct_s for t in with_adm.tasks] == [t.tct_s for t in without.tasks]


def test_under_overload_whole_sessions_wait_instead_of_evicting_each_other():
    # 24 sessions whose histories reach ~8k tokens on a pool of 24k with a 1x host tier:
    # all running at once they thrash; admitted a few at a time they hardly recompute.
    insts = sessions(24)
    with_adm, without = run("saga", insts, 24_000), run("saga-no-admit", insts, 24_000)
    assert with_adm.admitted_after_wait > 0
    assert with_adm.recomputed_tokens < 0.7 * without.recomputed_tokens
    assert mean_tct(with_adm) < 0.75 * mean_tct(without)
    # waiting for admission counts: every task's time starts at its arrival (t = 0)
    assert all(t.started_at == 0.0 for t in with_adm.tasks)


def test_thunderagent_pauses_tool_waiting_programs_and_recomputes_them():
    insts = sessions(24)
    res = run("thunderagent", insts, 24_000, host=0.0)
    assert res.parked > 0 and res.admitted_after_wait > 0
    assert len(res.tasks) == 24  # and every program still finishes


def test_the_host_tier_drops_the_lowest_key_first_not_the_oldest():
    host = HostTier(10)
    host.offload("soon-back", 4, key=5.0)  # offloaded first, but its next use is near
    host.offload("long-tool", 4, key=1.0)
    host.offload("new", 4, key=3.0)  # over capacity: the lowest key goes
    # two blocks over: they come off the lowest key's tail, the rest of it stays a prefix
    assert host.end("long-tool") == 2 and host.end("soon-back") == 4 and host.end("new") == 4


def test_the_host_tier_drops_a_scheduled_sessions_copy_first_and_rekeys_a_queued_one():
    from saga_server.engines.sim.session import Session

    sim = Simulator(make_cost_model(kv_capacity_override=16 * 10), make_policy("apc-lru-offload"), [],
                    SimConfig(workers=1, host_tier_factor=1.0))
    w = sim.workers[0]
    running, waiting = (Session(TaskInstance(sid, chain_task(sid)), 0.0, 0) for sid in ("running", "waiting"))
    sim.sessions.update(running=running, waiting=waiting)
    w.host.offload("running", 4, key=9.0)  # its tool ended long after the other's
    w.host.offload("waiting", 4, key=1.0)
    sim.tiers.loaded(w, running)  # scheduled: the pool holds its prefix again
    w.host.offload("new", 4, key=5.0)  # two blocks over capacity
    assert w.host.end("running") == 2 and w.host.end("waiting") == 4
    sim.now = waiting.last_access = 50.0
    sim.tiers.requested(w, waiting)  # its request joined the queue: LRU's key is its use now
    w.host.offload("newer", 4, key=20.0)
    assert w.host.end("waiting") == 4 and w.host.end("new") < 4


class _RecordingLoads:
    """The saga policy, recording at each steal tick what the views say each worker
    holds against what is in flight there."""

    def __init__(self, policy) -> None:
        self._policy, self.sim, self.ticks = policy, None, []

    def __getattr__(self, name):
        return getattr(self._policy, name)

    def plan_steal(self, views, now):
        workers = self.sim.workers
        self.ticks.append([(v.queue_len, len(w.gated), len(w.queue) + w.running) for v, w in zip(views, workers)])
        return self._policy.plan_steal(views, now)


def test_a_workers_load_counts_the_requests_its_admission_gate_holds_back():
    # The router counts every request in flight at a replica; one waiting for admission
    # is in flight, so a worker with a full gate must not look idle to steals.
    cost = make_cost_model(kv_capacity_override=24_000)
    recorder = _RecordingLoads(make_policy("saga"))
    sim = Simulator(cost, recorder, sessions(48), SimConfig(workers=2, host_tier_factor=1.0))
    recorder.sim = sim
    sim.run()
    loads = [load for tick in recorder.ticks for load in tick]
    assert any(gated > 0 for _, gated, _ in loads)
    assert all(queue_len == gated + rest for queue_len, gated, rest in loads)
