"""`scripts/results_page.py`: the benchmarks' outputs become docs/RESULTS.md with figures,
each section naming its command and machine; a rerun rewrites them."""

from __future__ import annotations

import json

from scripts import results_page

MACHINE = {"model": "Test CPU 9000", "cores": 2}


def _inputs(tmp_path, saga_mean: float):
    replay = {"command": "python -m benchmarks.serve_trace_replay --json r.json", "machine": MACHINE, "results": [
        {"mode": "no-saga", "tct_s": [10.0, 20.0, 30.0], "tct_mean_s": 20.0, "tct_p90_s": 30.0, "hit_rate": 0.5,
         "regen_share": 0.3},
        {"mode": "saga", "tct_s": [saga_mean - 1, saga_mean, saga_mean + 1], "tct_mean_s": saga_mean,
         "tct_p90_s": saga_mean + 1, "hit_rate": 0.9, "regen_share": 0.05}]}
    sve = {"machine": MACHINE, "measured": {"saga": {"tct_mean_s": saga_mean}, "no-saga": {"tct_mean_s": 20.0}},
           "predicted": {"saga": {"tct_mean_s": saga_mean * 1.1}, "no-saga": {"tct_mean_s": 19.0}},
           "ratios": {"no-saga/saga": {"measured": 20.0 / saga_mean, "predicted": 19.0 / (saga_mean * 1.1)}}}
    bench = {"command": "saga bench --out b", "machine": MACHINE, "scenario": {"tasks": 3, "workers": 1, "model": "m", "gpu": "g"},
             "policies": {"saga": {"tct_mean_s": saga_mean, "tct_s": [1.0, 2.0]}, "kvflow": {"tct_mean_s": 9.0}},
             "load_sweep": [{"policy": "saga", "load": 4, "tct_mean_s": 3.0},
                            {"policy": "saga", "load": 8, "tct_mean_s": 5.0}]}
    paths = []
    for name, data in (("r.json", replay), ("sve.json", sve), ("bench.json", bench)):
        (tmp_path / name).write_text(json.dumps(data))
        paths.append(str(tmp_path / name))
    (tmp_path / "chaos.md").write_text("Machine: Test CPU 9000, 2 cores\n\n| case | agent errors |\n|---|---|\n| flood | 0 |\n")
    return ["--replay", paths[0], "--sim-vs-engine", paths[1], "--bench", paths[2],
            "--chaos", str(tmp_path / "chaos.md"), "--out", str(tmp_path / "docs")]


def test_each_input_becomes_a_section_with_its_figure_command_and_machine(tmp_path):
    assert results_page.main(_inputs(tmp_path, 8.0)) == 0
    page = (tmp_path / "docs" / "RESULTS.md").read_text()
    sections = [line for line in page.splitlines() if line.startswith("## ")]
    assert len(sections) == 4
    assert page.count("Machine: Test CPU 9000, 2 cores") == 4
    assert "Command: `python -m benchmarks.serve_trace_replay --json r.json`" in page
    assert "Command: `python -m benchmarks.sim_vs_engine --json sve.json`" in page  # not recorded: the usual one
    for png in ("replay_tct", "sim_vs_engine", "bench_tct", "bench_load"):
        assert f"(results/{png}.png)" in page and (tmp_path / "docs" / "results" / f"{png}.png").stat().st_size > 0
    assert "| saga | 8.0 | 9.0 | 0.900 | 0.050 |" in page and "| flood | 0 |" in page
    assert "| saga | 8.0 | 8.8 | +10.0% |" in page


def test_a_rerun_after_a_benchmark_rerun_rewrites_the_page(tmp_path):
    results_page.main(_inputs(tmp_path, 8.0))
    results_page.main(_inputs(tmp_path, 12.0))
    page = (tmp_path / "docs" / "RESULTS.md").read_text()
    assert "| saga | 12.0 |" in page and "| saga | 8.0 |" not in page


def test_a_bad_input_is_refused_with_its_name(tmp_path, capsys):
    (tmp_path / "r.json").write_text("{not json")
    assert results_page.main(["--replay", str(tmp_path / "r.json"), "--out", str(tmp_path)]) == 2
    assert "r.json: not JSON" in capsys.readouterr().err
