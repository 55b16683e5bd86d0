"""The deadline grid's cells, load search and fairness index (`harness/deadline_grid.py`)."""

from __future__ import annotations

import pytest

from benchmarks.harness import deadline_grid as grid


def test_every_pair_runs_both_ways_with_the_settings_in_turn_and_a_flood_cell(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGA_TRACES", str(tmp_path / "none-here"))
    traces = grid.profiles(tmp_path, 20, seed=0)
    assert sorted(traces) == ["agent", "browser", "coding"]  # no shared traces: the generated ones
    cells = grid.cells(traces)
    pairs = [c for c in cells if c.name != "flood"]
    assert len(pairs) == 6
    assert {(c.tenants[0].name, c.tenants[1].name) for c in pairs} == {
        (a, b) for a in traces for b in traces if a != b}
    for c, (tight, loose, weight, ramped) in zip(pairs, grid.SETTINGS):
        assert (c.tenants[0].deadline_factor, c.tenants[1].deadline_factor) == (tight, loose)
        assert (c.tenants[0].weight, c.ramped, c.tight) == (weight, ramped, c.tenants[0].name)
        assert tight <= loose
    flood = cells[-1]
    assert flood.name == "flood" and [t.weight for t in flood.tenants] == [1.0, 1.0, 4.0]
    assert [t.name for t in grid.flood_alone(flood).tenants] == ["browser", "coding"]


def test_the_load_search_stops_where_the_probe_falls_below_70_percent(monkeypatch):
    """The probe meets every deadline up to 11 sessions per worker: doubling finds 16,
    one bisection 12, and the cell runs at a quarter, a half, that and one and a half."""
    probed = []

    def fake_run(job):
        probed.append(job[2])
        return {"slo": {"t": 1.0 if job[2] <= 11 else 0.5}}

    monkeypatch.setattr(grid, "run_cell", fake_run)
    cell = grid.Cell("c", (), True)
    assert grid.probe_loads((cell, 4, 3, 64)) == ("c", [3, 6, 12, 18])
    assert probed == [1, 2, 4, 8, 16, 12]
    assert grid.probe_loads((cell, 4, 3, 8)) == ("c", [2, 4, 8])  # never falls under the ceiling


def test_jains_index():
    assert grid.jain([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert grid.jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert grid.jain([1.0, 0.5]) == pytest.approx(2.25 / 2.5)


def test_a_cell_run_reports_each_tenant(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGA_TRACES", str(tmp_path / "none-here"))
    cell = grid.cells(grid.profiles(tmp_path, 20, seed=0))[0]
    row = grid.run_cell((cell, 1, 2, 2, "saga", 0))
    assert set(row["slo"]) == set(row["service"]) == {t.name for t in cell.tenants}
    assert all(v == 1.0 for v in row["ceiling"].values())  # a deadline of 1.5x or more: met alone
    assert all(0 < v <= 1.01 for v in row["service"].values())  # alone is the fastest (to rounding)
