"""`saga bench` end to end on a tiny scenario: report, JSON, plots, TOML, errors."""

from __future__ import annotations

import json

import pytest

from saga_server.bench.cli import main

from .test_workload import task, write_trace


def trace(tmp_path):
    tasks = [task(f"t{i}", [0.5] * 6) for i in range(4)]
    for t in tasks:  # grow the prompts so KV matters
        for k, st in enumerate(t["steps"]):
            st["prompt_tokens"] = 2000 + 500 * k
            st["reused_prefix_tokens"] = 0 if k == 0 else 2000 + 500 * (k - 1) + 10
    return write_trace(tmp_path / "t.jsonl", tasks)


def test_bench_writes_json_report_and_plots(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["--trace", trace(tmp_path), "--deadline-factor", "3", "--tasks", "8", "--workers", "2",
               "--concurrency", "8", "--kv-tokens", "12000", "--policies", "apc-lru,saga,belady",
               "--sweep-load", "4,8", "--sweep-kv", "9000,20000", "--sweep-host", "0,2",
               "--sweep-policies", "apc-lru,saga",
               "--out", str(out), "--quiet"])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    assert list(data["policies"]) == ["apc-lru", "saga", "belady"]
    assert data["policies"]["belady"]["belady_ratio"] == 1.0
    saga = data["policies"]["saga"]
    assert set(saga["slo"]) == {"default"} and set(saga["slack_used"]) == {"default"}
    assert saga["goodput_per_hour"] == pytest.approx(saga["tasks_per_hour"] * saga["slo"]["default"])
    assert saga["slack_used"]["default"] > 0
    assert {r["load"] for r in data["load_sweep"]} == {4.0, 8.0}
    kv = {(r["kv_tokens"], r["policy"]): r for r in data["kv_sweep"]}
    assert set(kv) == {(9000, "apc-lru"), (9000, "saga"), (20000, "apc-lru"), (20000, "saga")}
    assert kv[(9000, "apc-lru")]["recompute_share"] >= kv[(20000, "apc-lru")]["recompute_share"]
    assert {(r["host_tier_factor"], r["policy"]) for r in data["host_sweep"]} == {
        (0.0, "apc-lru"), (0.0, "saga"), (2.0, "apc-lru"), (2.0, "saga")}
    for png in ("tct_cdf.png", "regen_share.png", "mem_util.png", "slo.png", "tct_vs_load.png",
                "tct_vs_kv.png", "tct_vs_host.png"):
        assert (out / png).stat().st_size > 1000
    md = (out / "report.md").read_text()
    assert "| saga |" in md and "![tct_cdf.png](tct_cdf.png)" in md and "## Host tier sweep" in md
    assert "| apc-lru |" in capsys.readouterr().out


def test_bench_reads_a_toml_scenario_and_flags_override_it(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[scenario]\nname = "toml"\ntasks = 4\nworkers = 1\nconcurrency = 2\n'
                   f'policies = ["vanilla"]\n\n[[tenant]]\nname = "x"\ntrace = "{trace(tmp_path)}"\n')
    out = tmp_path / "o"
    assert main(["--config", str(cfg), "--tasks", "3", "--out", str(out), "--no-plots", "--quiet"]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["scenario"]["name"] == "toml" and data["scenario"]["tasks"] == 3
    assert data["policies"]["vanilla"]["tasks"] == 3


def test_unknown_policy_or_missing_trace_exit_2(tmp_path, capsys):
    assert main(["--policies", "nope", "--out", str(tmp_path), "--quiet"]) == 2
    assert "saga bench: unknown policies" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path), "--quiet"]) == 2
    said = capsys.readouterr().err
    assert f"no trace at {tmp_path / 'missing.jsonl'}" in said and "$SAGA_TRACES" in said


def test_cost_model_overrides_from_toml_and_flags_change_the_result(tmp_path):
    from saga_server.bench.cli import build_parser, scenario_from_args

    cfg = tmp_path / "s.toml"
    cfg.write_text('[scenario]\nmfu = 0.64\n')
    sc = scenario_from_args(build_parser().parse_args(["--config", str(cfg), "--bw-eff", "0.7"]))
    cost = sc.cost_model()
    assert (cost.mfu, cost.bw_eff) == (0.64, 0.7)
    tct = {}
    for mfu in ("0.2", "0.9"):  # cheaper prefill: a cache-less run finishes sooner
        out = tmp_path / mfu
        assert main(["--trace", str(trace(tmp_path)), "--tasks", "3", "--workers", "1", "--concurrency", "2",
                     "--policies", "vanilla", "--mfu", mfu, "--out", str(out), "--no-plots", "--quiet"]) == 0
        tct[mfu] = json.loads((out / "bench.json").read_text())["policies"]["vanilla"]["tct_mean_s"]
    assert tct["0.9"] < tct["0.2"]


def test_a_ramp_spreads_the_first_tasks_and_a_negative_one_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["--trace", str(trace(tmp_path)), "--tasks", "3", "--workers", "1", "--concurrency", "3",
                 "--ramp-s", "30", "--policies", "vanilla", "--out", str(out), "--no-plots", "--quiet"]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["scenario"]["ramp_s"] == 30.0
    assert main(["--trace", str(trace(tmp_path)), "--tasks", "3", "--ramp-s", "-1", "--policies", "vanilla",
                 "--out", str(out), "--no-plots", "--quiet"]) == 2
    assert "ramp_s must be a finite number >= 0" in capsys.readouterr().err


def test_a_tenants_turn_deadline_multiple_is_read_and_its_turns_judged(tmp_path):
    out = tmp_path / "out"
    rc = main(["--tenant", f"chat={trace(tmp_path)}:1::2", "--tasks", "4", "--workers", "1", "--concurrency", "4",
               "--policies", "saga", "--out", str(out), "--quiet"])
    assert rc == 0
    saga = json.loads((out / "bench.json").read_text())["policies"]["saga"]
    assert saga["slo"] == {}  # no task deadline, only the turns'
    assert 0.0 <= saga["turn_slo"]["chat"] <= 1.0 and saga["turn_p90_s"]["chat"] > 0
