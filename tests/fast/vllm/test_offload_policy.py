"""SAGA's order for vLLM's CPU offload tier: `SagaCachePolicy` inside vLLM's real
`CPUOffloadingManager` (its scheduler side is pure Python), fed by a real
`SagaScheduler`'s sessions, and selected by `saga serve --kv-offloading-size`."""

from __future__ import annotations

import inspect
import json

from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

from saga_server.core import (
    CoreConfig,
    LlmCallEnd,
    LlmCallStart,
    ManualClock,
    SessionEnd,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
    WorkflowCore,
)
from saga_server.core.pinning import PinConfig
from saga_server.engines.vllm import SagaScheduler
from saga_server.engines.vllm import offload, session_chunks
from saga_server.serve import cli
from vllm_builders import Requests, make_scheduler, run_until_idle

BS = 16


def learned_scheduler(tiny_model):
    """A SagaScheduler whose core has learned that greps take 0.2 s and test runs 60 s."""
    clock = ManualClock(0.0)
    core = WorkflowCore(CoreConfig(pin=PinConfig(min_tokens=10**9)), clock=clock)
    for i in range(20):
        for tool, cat, d in (("grep", "search", 0.2), ("pytest", "test", 60.0)):
            sid = f"warm-{tool}-{i}"
            core.accept(SessionStart(sid, clock.t))
            core.accept(LlmCallStart(sid, clock.t))
            core.accept(LlmCallEnd(sid, clock.t, prompt_tokens=500, output_tokens=10))
            core.accept(ToolCallStart(sid, clock.t, tool, category=cat))
            core.accept(ToolCallEnd(sid, clock.t + d, tool))
    clock.t = 1000.0
    return make_scheduler(SagaScheduler, tiny_model, core=core, clock=clock, start_hints=False, num_blocks=32,
                          block_size=BS)


def keys(name: str, n: int) -> list:
    return [make_offload_key(f"{name}-{i}".encode(), 0) for i in range(n)]


def store(manager, ks, rid, kv_hints=None, finish=True):
    ctx = ReqContext(req_id=rid, kv_hints=kv_hints)
    for i, key in enumerate(ks):  # where each chunk ends in the request, as vLLM's scheduler records
        ctx.set_offload_key_position(key, (i + 1) * BS)
    out = manager.prepare_store(ks, ctx)
    assert out is not None
    manager.complete_store(ks, ctx)
    if finish:
        manager.on_request_finished(ctx)
    return out


def hints_naming(session_id: str) -> KvHintsEnvelope:
    """A request's kv_hints whose one action names its session (`compat.session_of_kv_hints`)."""
    return KvHintsEnvelope(protocol_version="1", message_id="m", actions=[
        KvHintAction(action_id="a", action_type="session", action_version="1", payload={"session_id": session_id})])


def sessions_testing_and_grepping(tiny_model):
    """A learned scheduler whose sessions "testing" (a 60 s test run next) and
    "grepping" (a 0.2 s grep next) each ran one request. Returns (scheduler, requests)."""
    s = learned_scheduler(tiny_model)
    core, clock, R = s.saga.core, s.saga.clock, Requests(BS)
    reqs = {}
    for sid, tool, cat in (("testing", "pytest", "test"), ("grepping", "grep", "search")):
        core.accept(SessionStart(sid, clock()))
        reqs[sid] = R.make(list(range(100, 164)), session_id=sid)
        s.add_request(reqs[sid])
        run_until_idle(s)
        core.accept(ToolCallStart(sid, clock(), tool, category=cat))
    return s, reqs


def test_the_tier_drops_the_session_away_longest_first_tail_first_where_lru_would_not(tiny_model):
    s, reqs = sessions_testing_and_grepping(tiny_model)
    clock = s.saga.clock
    results = {}
    for policy in ("lru", "SagaCachePolicy"):
        manager = CPUOffloadingManager(num_chunks=8, cache_policy=policy,
                                       cache_policy_module_path=offload.__name__)
        store(manager, keys("testing", 4), reqs["testing"].request_id)  # stored first: LRU's victim-to-be
        store(manager, keys("grepping", 4), reqs["grepping"].request_id)
        clock.t += 1.0
        store(manager, keys("testing", 4), reqs["testing"].request_id)  # touched again: LRU keeps it now
        evicted = store(manager, keys("new", 2), "anonymous").evicted_keys
        results[policy] = evicted
    grepping, testing = keys("grepping", 4), keys("testing", 4)
    assert results["lru"] == [grepping[3], grepping[2]]  # the least recently used session, tail first
    # SAGA: the session whose next request is farthest (a 60 s test run) goes first, tail first
    assert results["SagaCachePolicy"] == [testing[3], testing[2]]


def test_without_a_plugin_the_policy_is_lru():
    session_chunks.attach(None)
    manager = CPUOffloadingManager(num_chunks=4, cache_policy="SagaCachePolicy",
                                   cache_policy_module_path=offload.__name__)
    store(manager, keys("a", 2), "r1")
    store(manager, keys("b", 2), "r2")
    assert store(manager, keys("c", 1), "r3").evicted_keys == [keys("a", 2)[1]]  # oldest, tail first


def test_saga_serve_builds_the_host_tier_saga_counts_with_the_offload_flag_and_leaves_a_user_config_alone(
        monkeypatch):
    def build(argv, gpu=False):
        monkeypatch.setattr(cli, "is_gpu_build", lambda: gpu)
        opts, rest = cli._parser().parse_known_args(argv)
        out = cli.build_command(opts, rest, "/models/m", True, base_env={}).argv
        transfer = None
        if "--kv-transfer-config" in out:
            assert out.count("--kv-transfer-config") == 1
            transfer = json.loads(out[out.index("--kv-transfer-config") + 1])
        return out, transfer

    from saga_server.engines.vllm import host_kv, tier

    argv, transfer = build(["--kv-offloading-size", "8"])
    assert "--kv-offloading-size" not in argv  # vLLM's flag would name vLLM's connector
    assert (transfer["kv_connector"], transfer["kv_connector_module_path"]) == (
        tier.SagaOffloadingConnector.__name__, tier.__name__)
    assert transfer["kv_load_failure_policy"] == "recompute"  # a failed load is recomputed, not fatal
    assert transfer["kv_connector_extra_config"] == {**host_kv.SPEC_CONFIG, **offload.POLICY_CONFIG,
                                                     "cpu_bytes_to_use": 8 * 2**30}
    assert host_kv.SPEC_CONFIG["spec_module_path"] == cli.HOST_KV_MODULE
    assert offload.POLICY_CONFIG["cache_policy_module_path"] == cli.OFFLOAD_POLICY_MODULE
    # vLLM's LRU as the baseline, with SAGA counting; stock vLLM keeps its own flag and connector
    _, lru = build(["--kv-offloading-size=0.5", "--kv-tier-order", "lru"])
    assert lru["kv_connector_extra_config"] == {**host_kv.SPEC_CONFIG, "cpu_bytes_to_use": 2**29}
    argv, stock = build(["--no-saga", "--kv-offloading-size", "8"])
    assert "--kv-offloading-size" in argv and stock == {"kv_connector_extra_config": host_kv.SPEC_CONFIG}
    # a GPU host runs vLLM's own worker
    _, gpu = build(["--kv-offloading-size", "8"], gpu=True)
    assert gpu["kv_connector_extra_config"] == {**offload.POLICY_CONFIG, "cpu_bytes_to_use": 8 * 2**30}
    assert build(["--no-saga", "--kv-offloading-size", "8"], gpu=True)[1] is None
    argv, user = build(["--kv-offloading-size", "8", "--kv-transfer-config", "{}"])  # the user's own
    assert user == {} and "--kv-offloading-size" in argv
    assert build([])[1] is None


def test_the_engines_own_offload_manager_runs_the_policy_saga_serve_configures(tiny_model):
    s = make_scheduler(SagaScheduler, tiny_model, start_hints=False, num_blocks=16, block_size=BS,
                       kv_offloading_size=0.001, kv_transfer_extra=offload.POLICY_CONFIG)
    assert type(s.connector.connector_scheduler.manager._policy) is offload.SagaCachePolicy


def test_a_session_the_engine_forgets_is_the_first_the_tier_drops_and_leaves_the_request_map(tiny_model):
    s = learned_scheduler(tiny_model)
    core, clock, R = s.saga.core, s.saga.clock, Requests(BS)
    manager = CPUOffloadingManager(num_chunks=8, cache_policy="SagaCachePolicy",
                                   cache_policy_module_path=offload.__name__)
    reqs = {}
    for sid in ("stays", "ends"):  # "ends" is used last: by recency the tier would keep it
        core.accept(SessionStart(sid, clock()))
        reqs[sid] = R.make(list(range(100, 164)), session_id=sid)
        s.add_request(reqs[sid])
        run_until_idle(s)
        store(manager, keys(sid, 4), reqs[sid].request_id)
        clock.t += 1.0
    core.accept(SessionEnd("ends", clock()))
    run_until_idle(s)
    s.schedule()  # the engine loop forgets it at its next step
    assert s.saga.session_of_request(reqs["ends"].request_id) is None
    assert s.saga.session_of_request(reqs["stays"].request_id) == "stays"
    ends = keys("ends", 4)
    assert store(manager, keys("new", 2), "anonymous").evicted_keys == [ends[3], ends[2]]


# -- the installed vLLM's CachePolicy interface (engines/vllm/compat.py) ------------------

def test_the_policy_stores_hits_and_evicts_through_the_installed_vllms_manager(tiny_model):
    """Whatever this vLLM's CachePolicy calls look like (0.32: insert without the
    request, touch; 0.33: insert with it, on_request_access; 0.34: no touch), its own
    manager stores chunks in SAGA's policy, finds them, keeps a chunk being loaded,
    and evicts in SAGA's order."""
    s, reqs = sessions_testing_and_grepping(tiny_model)
    manager = CPUOffloadingManager(num_chunks=8, cache_policy="SagaCachePolicy",
                                   cache_policy_module_path=offload.__name__)
    assert type(manager._policy) is offload.SagaCachePolicy
    assert not getattr(offload.SagaCachePolicy, "__abstractmethods__", None)  # every abstract hook is there
    testing, grepping = keys("testing", 4), keys("grepping", 4)
    store(manager, testing, reqs["testing"].request_id)
    store(manager, grepping, reqs["grepping"].request_id)
    assert len(manager._policy.chunks) == 8
    reader = ReqContext(req_id=reqs["testing"].request_id)
    assert [manager.lookup(k, reader) for k in testing] == [LookupResult.HIT] * 4
    assert manager.lookup(keys("absent", 1)[0], reader) == LookupResult.MISS
    manager.prepare_load(testing[2:], reader)  # being loaded: not evictable until complete
    evicted = store(manager, keys("new", 2), "anonymous").evicted_keys
    assert evicted == [testing[1], testing[0]]  # the session away longest, what of it is not being loaded
    manager.complete_load(testing[2:], reader)
    manager.on_request_finished(reader)
    assert store(manager, keys("newer", 2), "anonymous").evicted_keys == [testing[3], testing[2]]


def test_a_request_whose_kv_hints_name_a_session_is_filed_under_it(tiny_model):
    """ReqContext.kv_hints (a KvHintsEnvelope, Request.kv_hints) naming a session wins
    over the plugin's request map: chunks of a request the plugin never saw are
    ranked as that session's."""
    s, reqs = sessions_testing_and_grepping(tiny_model)
    manager = CPUOffloadingManager(num_chunks=8, cache_policy="SagaCachePolicy",
                                   cache_policy_module_path=offload.__name__)
    store(manager, keys("grepping", 4), reqs["grepping"].request_id)
    s.saga.clock.t += 1.0
    # most recently used, but by the session whose next request is farthest
    store(manager, keys("hinted", 4), "unknown-to-the-plugin", kv_hints=hints_naming("testing"))
    assert manager._policy.session_of(keys("hinted", 1)[0]) == "testing"
    hinted = keys("hinted", 4)
    assert store(manager, keys("new", 2), "anonymous").evicted_keys == [hinted[3], hinted[2]]


def test_where_vllm_passes_the_storing_request_its_chunks_are_the_sessions_before_it_finishes(tiny_model):
    """vLLM 0.33 on passes insert() the storing request's context: a chunk belongs to
    its session from the start. 0.32 passes none: until the request finishes its
    chunks are ranked by their last use alone."""
    s, reqs = sessions_testing_and_grepping(tiny_model)
    manager = CPUOffloadingManager(num_chunks=8, cache_policy="SagaCachePolicy",
                                   cache_policy_module_path=offload.__name__)
    store(manager, keys("grepping", 4), reqs["grepping"].request_id, finish=False)
    store(manager, keys("testing", 4), reqs["testing"].request_id, finish=False)
    owners = {manager._policy.session_of(k) for k in keys("testing", 4)}
    evicted = store(manager, keys("new", 2), "anonymous").evicted_keys
    if "req_context" in inspect.signature(CachePolicy.insert).parameters:
        assert owners == {"testing"}
        assert evicted == [keys("testing", 4)[3], keys("testing", 4)[2]]
    else:
        assert owners == {None}
        assert evicted == keys("grepping", 4)[:2]  # stored first (LRU); positions unknown yet
