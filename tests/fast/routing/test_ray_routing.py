"""`benchmarks/ray_routing.py`'s wiring: the routers it deploys, the header it sends,
the skewed mix and the table of runs (pure: no Ray cluster, no engine started)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import ray_routing as rr
from saga_server.router import cli


def test_every_benchmark_run_deploys_a_router_saga_router_knows():
    assert {name for name, _ in rr.ROUTER_RUNS.values()} <= set(cli.ROUTERS)
    assert rr.ROUTER_RUNS["hash"] == ("hash", [])


def _resolve(path: str):
    """The class at `path` as Serve's `RequestRouterConfig` imports it (it then
    pickles the class by value, which would rebind the methods' globals in this
    process: other tests patch those)."""
    from ray._common.utils import import_module_and_attr

    return import_module_and_attr(path)[1]


@pytest.mark.parametrize("name", sorted(cli.ROUTERS))
def test_each_router_class_path_resolves_to_a_serve_request_router(name):
    pytest.importorskip("ray.serve")
    from ray.serve._private.request_router.request_router import RequestRouter

    assert issubclass(_resolve(cli.ROUTERS[name]), RequestRouter)


def test_the_hash_router_is_rays_ring_behind_the_stock_ingress():
    pytest.importorskip("ray.serve")
    from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter

    opts = cli._parser().parse_args(["--router", "hash"])
    rr_cfg = cli.build_llm_config(opts, "/m", True)["deployment_config"]["request_router_config"]
    assert _resolve(rr_cfg["request_router_class"]) is ConsistentHashRouter
    assert "request_router_kwargs" not in rr_cfg  # Ray's defaults, as shipped
    assert "ingress_cls_config" not in cli.build_app_config(opts, llm_config="cfg")


def test_requests_carry_the_session_in_the_header_serve_reads():
    pytest.importorskip("ray.serve")
    from ray.serve._private.constants import SERVE_SESSION_ID

    assert rr.SESSION_HEADER == SERVE_SESSION_ID


def _trace(tmp_path, n=12, steps=20):
    path = tmp_path / "trace.jsonl"
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"task_id": f"t{i}", "steps": [
                {"prompt_tokens": 1000 + 100 * k, "output_tokens": 40,
                 "tools": [{"name": "bash", "category": "shell", "duration_s": 1.0}]}
                for k in range(steps)]}) + "\n")
    return path


def _args(tmp_path, sessions):
    return argparse.Namespace(trace=_trace(tmp_path), sessions=sessions, steps=4, target_prompt=800,
                              max_output=16, max_tool_s=3.0, seed=0)


@pytest.mark.parametrize("sessions, long_at", [(8, [3, 7]), (6, [3, 5]), (2, [1])])
def test_the_skewed_mix_is_the_even_one_with_a_quarter_of_long_sessions(tmp_path, sessions, long_at):
    args = _args(tmp_path, sessions)
    even, skewed = rr.mix_tasks(args, "even"), rr.mix_tasks(args, "skewed")
    assert len(skewed) == len(even) == sessions
    assert [i for i, t in enumerate(skewed) if t.task_id.startswith("long-")] == long_at
    for t in skewed:
        long_ = t.task_id.startswith("long-")
        assert len(t.steps) == (3 * 4 if long_ else 4)
        assert max(s.prompt_tokens for s in t.steps) == (2 * 800 if long_ else 800)
    short = [t for t in skewed if not t.task_id.startswith("long-")]
    assert [t.task_id for t in short] == [t.task_id for t in even[:len(short)]]
    assert len({t.task_id for t in skewed}) == sessions  # each session its own id, so its own text


def test_an_unknown_mix_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown mix"):
        rr.mix_tasks(_args(tmp_path, 4), "bursty")


def test_the_long_sessions_of_the_defaults_fit_the_models_context():
    args = argparse.Namespace(steps=6, target_prompt=1500, max_output=16)
    assert rr.longest_context(args, "even") < rr.longest_context(args, "skewed") <= rr.MODEL_CONTEXT
    assert rr.longest_context(argparse.Namespace(steps=6, target_prompt=2000, max_output=16), "skewed") \
        > rr.MODEL_CONTEXT


def _row(mix, router, run, tct):
    return {"mix": mix, "router": router, "run": run, **{k: 0.0 for k, _, _ in rr.COLUMNS}, "tct_mean_s": tct}


def test_runs_are_averaged_per_mix_and_router_and_tabled_run_by_run():
    rows = [_row("even", "hash", 1, 10.0), _row("even", "saga", 1, 8.0), _row("skewed", "hash", 1, 30.0),
            _row("even", "hash", 2, 14.0), _row("even", "saga", 2, 6.0), _row("skewed", "hash", 2, float("nan"))]
    m = {(r["mix"], r["router"]): r for r in rr.means(rows)}
    assert m["even", "hash"]["tct_mean_s"] == 12.0 and m["even", "hash"]["runs"] == 2
    assert m["even", "saga"]["tct_mean_s"] == 7.0
    lines = rr.table(rows)
    assert [ln.split()[:3] for ln in lines[1:]] == [
        ["even", "hash", "1"], ["even", "hash", "2"], ["even", "hash", "mean"],
        ["even", "saga", "1"], ["even", "saga", "2"], ["even", "saga", "mean"],
        ["skewed", "hash", "1"], ["skewed", "hash", "2"], ["skewed", "hash", "mean"]]
    assert lines[-1].split()[3] == "-"  # a failed run's NaN shows, and spoils the mean visibly
