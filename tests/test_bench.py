"""Benchmark maths, tables, targets and the committed-results view (no timing on a CPU)."""
from __future__ import annotations

import json

import pytest

from course_utils import bench, lessons_index


def test_rates():
    assert bench.gb_per_s(3e9, 1.0) == pytest.approx(3000.0)  # 3 GB in 1 ms
    assert bench.tflop_per_s(2 * 4096**3, 0.2) == pytest.approx(687.19, rel=1e-4)


def test_targets_compare_speed_or_rates():
    table = bench.Table("99")
    table.add("add", "copy", 2.0, n_bytes=8e9)
    table.add("add", "triton (ours)", 3.0, n_bytes=11.4e9)
    t = table.target("add", "triton (ours)", "copy", 0.92, metric="gbps")
    assert t.ratio == pytest.approx((11.4 / 3) / (8 / 2))
    assert t.met is True
    slow = table.target("add", "triton (ours)", "copy", 1.0)  # speed: peer ms / our ms
    assert slow.ratio == pytest.approx(2 / 3) and slow.met is False
    missing = table.target("add", "triton (ours)", "nobody", 1.0)
    assert missing.ratio is None and missing.met is None
    text = bench.format_targets(table.targets)
    assert "NO" in text and "not measured" in text


def test_time_refuses_in_the_interpreter(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert bench.can_time() is False
    assert "nothing is timed" in capsys.readouterr().out
    assert bench.Table("99").time("g", "n", lambda: None) is None


def test_save_and_show_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setitem(lessons_index.LESSONS, "99", lessons_index.Lesson("99_test", "test", None, "any"))
    table = bench.Table("99")
    table.add("add fp32", "torch", 1.0, n_bytes=3e9)
    table.add("add fp32", "triton (ours)", 0.9, n_bytes=3e9)
    table.target("add fp32", "triton (ours)", "torch", 1.0)
    path = bench.save(table)
    data = json.loads(path.read_text())
    assert data["rows"][1]["gbps"] == pytest.approx(3333.33, rel=1e-4)
    assert data["targets"][0]["met"] is True and "torch" in data and "date" in data
    assert bench.result_path("99", ".png").stat().st_size > 1000
    bench.show_results("99")
    out = capsys.readouterr().out
    assert "triton (ours)" in out and "1.11" in out


def test_plot_shows_the_best_of_a_sweep_only(tmp_path):
    rows = [bench.Row("g", "torch", 1.0, gbps=100.0), bench.Row("g", "triton (ours) BLOCK=1024", 0.9, gbps=111.0),
            bench.Row("g", "triton (ours) BLOCK=4096", 1.1, gbps=91.0), bench.Row("g", "triton (ours)", 0.9, gbps=111.0),
            bench.Row("h", "triton (ours) only a sweep", 2.0, gbps=50.0)]
    fig = bench.plot(rows, "t", tmp_path / "p.png")
    labels = [[t.get_text() for t in ax.get_yticklabels()] for ax in fig.axes]
    assert labels == [["torch", "triton (ours)"], ["triton (ours) only a sweep"]]
