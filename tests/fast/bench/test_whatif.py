"""`saga bench --what-if`: a recorded workload at its own load, the short answer first."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from saga_server.bench.cli import build_parser, main, scenario_from_args
from saga_server.bench.runner import _instances
from saga_server.bench.whatif import WHAT_IF_POLICIES, level_off, recorded_load, what_if_scenario
from saga_server.record import TraceBuilder


def record(path, sessions: int = 4, steps: int = 6, overlap: float = 0.5) -> str:
    """A recording as `saga proxy --record` writes it: growing agent histories with a
    2 s tool between steps; sessions start every `overlap` x a session's duration."""
    clock = {"t": 0.0}
    b = TraceBuilder(source="saga proxy", wall=lambda: 1_700_000_000 + clock["t"])
    duration = steps * 1.0 + (steps - 1) * 2.0
    with open(path, "w") as f:
        for n in range(sessions):
            t = clock["t"] = n * overlap * duration
            sid = f"px-{n}"
            b.session_start(sid, t, workflow="proxy:m:abcd")
            for k in range(1, steps + 1):
                b.llm_start(sid, t, step=k, extends="answer" if k > 1 else "", model="m")
                t += 1.0
                b.llm_end(sid, t, step=k, prompt_tokens=2000 + 600 * k, output_tokens=80)
                if k < steps:
                    b.tool_start(sid, t, name="bash", call_id=f"c{k}", category="run")
                    t += 2.0
                    b.tool_end(sid, t, call_id=f"c{k}")
            b.session_end(sid, t, reason="submit")
            for task in b.take():
                f.write(json.dumps(task) + "\n")
    return str(path)


def test_the_recorded_load_is_read_from_the_file(tmp_path):
    load = recorded_load(json.loads(line) for line in open(record(tmp_path / "r.jsonl", sessions=4)))
    assert (load.tasks, load.llm_calls) == (4, 24)
    # four 16 s sessions, one every 8 s: 64 busy seconds over a 40 s span
    assert load.concurrency == pytest.approx(64 / 40) and load.mean_task_s == pytest.approx(16)
    assert load.max_step_tokens == load.session_kv_tokens == 2000 + 3600 + 80


def test_the_scenario_takes_the_recordings_load_unless_flags_set_it(tmp_path):
    path = record(tmp_path / "r.jsonl")
    base = scenario_from_args(build_parser().parse_args(["--workers", "2", "--gpu", "a100-80gb"]))
    sc, _ = what_if_scenario(base, path)
    assert (sc.tasks, sc.recorded_arrivals, sc.workers, sc.gpu) == (4, True, 2, "a100-80gb")
    assert sc.policies == sc.sweep_policies == WHAT_IF_POLICIES
    assert [t.trace for t in sc.tenants] == [path]
    # the working set per worker: one session in flight x its peak KV (5,680 tokens), in
    # multiples 0.25 to 2, never below the largest step
    assert sc.sweep_kv == (5680, 11360)
    assert sc.sweep_host == (0.0, 0.5, 1.0, 2.0, 4.0)
    mine, _ = what_if_scenario(base, path, tasks=False, concurrency=False, sweep_host=False)
    assert (mine.tasks, mine.recorded_arrivals, mine.sweep_host) == (base.tasks, False, ())


def test_the_what_if_replays_each_session_when_it_arrived(tmp_path):
    path = tmp_path / "r.jsonl"
    lines = open(record(path, sessions=4)).readlines()  # 16 s sessions, one every 8 s
    path.write_text("".join(reversed(lines)))  # a file's order is not the arrivals'
    base = scenario_from_args(build_parser().parse_args(["--workers", "1", "--gpu", "h100-80gb"]))
    sc, _ = what_if_scenario(base, str(path))
    replayed = _instances(sc, {})
    assert [i.arrival_s for i in replayed] == [0.0, 8.0, 16.0, 24.0]
    assert [i.task.task_id for i in replayed] == [json.loads(line)["task_id"] for line in lines]
    assert sc.sim_config().concurrency is None  # open loop: the arrivals are the load
    # more tasks than recorded: the recording again after its 40 s span
    more = _instances(replace(sc, tasks=6), {})
    assert [i.arrival_s for i in more][4:] == [40.0, 48.0]
    assert [i.task.steps[0].prompt_tokens for i in more] == [2600] * 6

    with pytest.raises(ValueError, match="recorded arrivals have neither"):
        sc.with_load(8)

    # without durations a repeat starts one mean gap after the last session, not with it
    lines = [json.loads(line) for line in lines]
    path.write_text("".join(json.dumps({k: v for k, v in t.items() if k != "duration_s"}) + "\n" for t in lines))
    sc, _ = what_if_scenario(base, str(path))
    assert [i.arrival_s for i in _instances(replace(sc, tasks=5), {})][4] == 32.0


def test_a_subagent_replays_inside_its_parent_so_it_is_no_session_of_its_own(tmp_path):
    path = tmp_path / "r.jsonl"
    parent, child = [json.loads(line) for line in open(record(path, sessions=2))]
    child.update(parent_session_id=parent["task_id"], parent_step=0)
    path.write_text(json.dumps(parent) + "\n" + json.dumps(child) + "\n")
    base = scenario_from_args(build_parser().parse_args(["--workers", "1", "--gpu", "h100-80gb"]))
    sc, load = what_if_scenario(base, str(path))
    assert (load.tasks, load.llm_calls, sc.tasks) == (1, 12, 1)
    assert [i.arrival_s for i in _instances(sc, {})] == [0.0]


def test_recorded_arrivals_need_every_tasks_start_time(tmp_path):
    untimed = tmp_path / "untimed.jsonl"
    with open(record(tmp_path / "r.jsonl")) as src, open(untimed, "w") as dst:
        for line in src:
            task = json.loads(line)
            task.pop("started_unix_s")
            dst.write(json.dumps(task) + "\n")
    base = scenario_from_args(build_parser().parse_args(["--workers", "1", "--gpu", "h100-80gb"]))
    sc, load = what_if_scenario(base, str(untimed))
    assert load.concurrency is None and not sc.recorded_arrivals  # closed loop at the default
    with pytest.raises(ValueError, match="started_unix_s"):
        _instances(replace(sc, recorded_arrivals=True), {})


def test_level_off_is_the_smallest_size_within_the_tolerance_of_the_best():
    assert level_off([(4, 10.0), (1, 30.0), (2, 10.4), (8, 10.0)]) == 2
    assert level_off([(1, 10.0), (2, 10.0)]) == 1
    assert level_off([(1, float("nan"))]) is None


def test_what_if_prints_the_short_answer_first_then_the_full_report(tmp_path, capsys):
    path = record(tmp_path / "r.jsonl")
    out = tmp_path / "out"
    assert main(["--what-if", path, "--gpu", "h100-80gb", "--model", "llama3-8b", "--workers", "1",
                 "--kv-tokens", "8000", "--out", str(out), "--no-plots", "--quiet"]) == 0
    printed = capsys.readouterr().out
    short, table = printed.split("| policy |")
    assert short.startswith("What would SAGA do for r.jsonl?")
    assert "recorded: 4 tasks, 24 LLM calls, 1.6 sessions at once on average, mean task time 16.0 s" in short
    for label in ("stock vLLM (apc-lru)", "vLLM + CPU tier (apc-lru-offload)", "SAGA (saga)"):
        assert label in short
    assert "the best baseline" in short
    assert "KV pool per worker" in short and "host tier (x pool)" in short
    assert short.count("SAGA's task time levels off at") == 2
    data = json.loads((out / "bench.json").read_text())
    assert list(data["policies"]) == list(WHAT_IF_POLICIES)
    assert {r["host_tier_factor"] for r in data["host_sweep"]} == {0.0, 0.5, 1.0, 2.0, 4.0}
    assert {r["policy"] for r in data["kv_sweep"]} == set(WHAT_IF_POLICIES)
    md = (out / "report.md").read_text()
    assert "What would SAGA do" in md and "## Host tier sweep" in md and "## KV pool sweep" in md
    assert "| saga |" in table


def test_what_if_with_deadlines_reports_them_per_deployment(tmp_path, capsys):
    path = record(tmp_path / "r.jsonl")
    args = ["--what-if", path, "--gpu", "h100-80gb", "--model", "llama3-8b", "--workers", "1", "--kv-tokens", "8000",
            "--out", str(tmp_path / "out"), "--no-plots", "--quiet"]
    assert main(args + ["--deadline-factor", "3"]) == 0
    short = capsys.readouterr().out.split("| policy |")[0]
    assert "within deadline  goodput/h" in short
    assert short.split("SAGA (saga)")[1].splitlines()[0].count("%") == 3  # hit rate, regen share, within deadline
    assert main(args) == 0  # without deadlines: no such columns
    assert "within deadline" not in capsys.readouterr().out.split("| policy |")[0]


def test_what_if_refuses_a_second_workload(tmp_path, capsys):
    path = record(tmp_path / "r.jsonl")
    assert main(["--what-if", path, "--trace", path, "--out", str(tmp_path), "--quiet"]) == 2
    assert "--what-if" in capsys.readouterr().err


def test_the_kv_sweep_never_goes_below_the_largest_step_in_the_engines_blocks(tmp_path):
    # a step of 2000 + 600 x 6 + 80 = 5680 tokens: 177.5 blocks of 32, so 178 of them
    path = record(tmp_path / "r.jsonl", sessions=1)
    base = scenario_from_args(build_parser().parse_args(["--gpu", "cpu-2core", "--model", "smollm2-135m"]))
    sc, _ = what_if_scenario(base, path)
    assert min(sc.sweep_kv) == 178 * 32 and all(kv % 32 == 0 for kv in sc.sweep_kv)
