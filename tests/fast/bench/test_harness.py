"""The benchmarks' shape: scripts run as `python -m benchmarks.NAME`, share code only
through `benchmarks.harness`, and never edit `sys.path`; the overhead template's arms
run interleaved."""

from __future__ import annotations

import ast
from pathlib import Path

from benchmarks.harness import overhead

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
SCRIPTS = {p.stem for p in BENCHMARKS.glob("*.py")} - {"__init__"}


def imported(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def problems(folder: Path) -> list[str]:
    """A script imported by another module of `folder` (as `benchmarks.NAME` or a bare
    `NAME`), and any `sys.path` edit."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for name in imported(path):
            script = name.removeprefix("benchmarks.")
            if script in SCRIPTS and script != path.stem:
                found.append(f"{path.name} imports the script {script}")
        if "sys.path" in path.read_text():
            found.append(f"{path.name} edits sys.path")
    return found


def test_no_script_imports_another_or_edits_the_path():
    assert problems(BENCHMARKS) == []


def test_the_check_sees_a_script_import_and_a_path_edit(tmp_path):
    (tmp_path / "a.py").write_text("import sys\nsys.path.insert(0, '.')\nfrom benchmarks.sim_overload import main\n")
    (tmp_path / "b.py").write_text("from sim_overload import main\nfrom benchmarks.harness.sim import run_all\n")
    assert problems(tmp_path) == ["a.py imports the script sim_overload", "a.py edits sys.path",
                                  "b.py imports the script sim_overload"]


def test_the_arms_warm_up_once_each_then_run_in_turn():
    calls = []
    runs = overhead.interleaved(2, lambda arm: calls.append(arm) or len(calls))
    assert calls == ["none", "noop", "saga"] * 3
    assert runs == {"none": [4, 7], "noop": [5, 8], "saga": [6, 9]}
