"""Benchmark maths, tables, targets and the committed-results view (no timing on a CPU)."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from course_utils import bench, figures, lessons_index, mode, results_table


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


@pytest.mark.parametrize("ratio, minimum, text", [
    (0.9996, 1.0, "0.9996"),  # a miss never reads as its threshold
    (0.996, 1.0, "0.996"),
    (0.99999, 1.0, "0.9999"),  # cut, not rounded up to the threshold
    (1.004, 1.0, "1.00"),  # a met ratio keeps two decimals
    (0.8496, 0.85, "0.8496"),
    (0.8449, 0.85, "0.84"),
    (0.9996, None, "1.00"),  # reported, no threshold: two decimals
])
def test_ratio_text_never_shows_a_miss_as_met(ratio, minimum, text):
    assert bench.ratio_text(ratio, minimum) == text
    table = bench.Table("99")
    table.add("op", "peer", ratio, n_bytes=None)
    table.add("op", "triton (ours)", 1.0, n_bytes=None)
    table.target("op", "triton (ours)", "peer", minimum)
    assert f" {text} " in bench.format_targets(table.targets)


def test_time_refuses_in_the_interpreter(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert bench.can_time() is False
    assert "nothing is timed" in capsys.readouterr().out
    assert bench.Table("99").time("g", "n", lambda: None) is None


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A scratch course checkout (COURSE_ROOT with results/) holding one extra lesson, 99_test."""
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text("# c\n<!-- map:start -->\n<!-- map:end -->\n"
                                        "<!-- results:start -->\n<!-- results:end -->\n")
    monkeypatch.setenv("COURSE_ROOT", str(tmp_path))
    monkeypatch.setitem(lessons_index.LESSONS, "99", lessons_index.Lesson("99_test", "test", None, "any"))
    monkeypatch.setattr(bench, "device_key", lambda name=None: "h100" if name is None else real_device_key(name))
    return tmp_path


real_device_key = bench.device_key


def test_save_and_show_results(course, monkeypatch, capsys):
    table = bench.Table("99")
    table.add("add fp32", "torch", 1.0, n_bytes=3e9)
    table.add("add fp32", "triton (ours)", 0.9, n_bytes=3e9)
    table.target("add fp32", "triton (ours)", "torch", 1.0)
    table.fact("speedup", "1.11 x")
    path = bench.save(table)
    assert path == course / "results" / "99_test.h100.json"  # results/ found when called, one file per GPU
    data = json.loads(path.read_text())
    assert data["facts"] == {"speedup": "1.11 x"}
    assert data["rows"][1]["gbps"] == pytest.approx(3333.33, rel=1e-4)
    assert data["targets"][0]["met"] is True and "torch" in data and "date" in data
    assert bench.result_path("99", ".png").stat().st_size > 1000
    bench.show_results("99")
    out = capsys.readouterr().out
    assert "triton (ours)" in out and "1.11" in out and "fact speedup: 1.11 x" in out
    assert bench.load_results("99", device="h200") is None
    assert bench.load_results("99")["rows"] == data["rows"]


def test_plot_shows_the_best_of_a_sweep_only(tmp_path):
    rows = [bench.Row("g", "torch", 1.0, gbps=100.0), bench.Row("g", "triton (ours) BLOCK=1024", 0.9, gbps=111.0),
            bench.Row("g", "triton (ours) BLOCK=4096", 1.1, gbps=91.0), bench.Row("g", "triton (ours)", 0.9, gbps=111.0),
            bench.Row("h", "triton (ours) only a sweep", 2.0, gbps=50.0)]
    fig = bench.plot(rows, "t", tmp_path / "p.png")
    labels = [[t.get_text() for t in ax.get_yticklabels()] for ax in fig.axes]
    assert labels == [["torch", "triton (ours)"], ["triton (ours) only a sweep"]]


def test_device_key_names_the_gpu():
    assert real_device_key("NVIDIA H100 80GB HBM3") == "h100"
    assert real_device_key("NVIDIA H200") == "h200"
    assert real_device_key("Tesla T4") == "t4"
    assert real_device_key("NVIDIA A100-SXM4-80GB") == "a100"


def test_target_is_against_the_fastest_peer_measured():
    table = bench.Table("99")
    table.add("op", "torch eager", 1.0, n_bytes=1e9)
    table.add("op", "torch.compile", 0.8, n_bytes=1e9)
    table.add("op", "torch.compile max-autotune", 0.9, n_bytes=1e9)
    table.add("op", "triton (ours)", 0.85, n_bytes=1e9)
    peers = ["torch eager", "torch.compile", "torch.compile max-autotune", "Liger-Kernel"]  # Liger not measured
    t = table.target("op", "triton (ours)", peers, 1.0)
    assert t.peer == "torch.compile" and t.peers == peers
    assert t.ratio == pytest.approx(0.8 / 0.85) and t.met is False
    rate = table.target("op", "triton (ours)", ["torch eager", "torch.compile max-autotune"], 0.9, metric="gbps")
    assert rate.peer == "torch.compile max-autotune" and rate.ratio == pytest.approx(0.9 / 0.85)
    single = table.target("op", "triton (ours)", "torch eager", 1.0)
    assert single.peers is None and single.peer == "torch eager" and single.met is True
    nobody = table.target("op", "triton (ours)", ["a", "b"], 1.0)
    assert nobody.ratio is None and nobody.peer == "a"
    assert "fastest of 4 (torch.compile)" in bench.format_targets(table.targets)


@pytest.fixture
def fake_gpu(monkeypatch):
    """GPU mode with a fake clock: do_bench returns 2.0 ms for plain calls, 1.0 ms for graph replays."""
    monkeypatch.setattr(bench, "current", lambda: mode.Mode("gpu", "cuda", "test"))
    captured = []

    def fake_graph_replay(fn):
        if getattr(fn, "uncapturable", False):
            raise RuntimeError("operation not permitted when stream is capturing")
        captured.append(fn)

        def replay():
            return fn()

        replay.is_graph = True
        return replay

    monkeypatch.setattr(bench, "graph_replay", fake_graph_replay)
    monkeypatch.setattr(bench, "do_bench", lambda fn, **kw: 1.0 if getattr(fn, "is_graph", False) else 2.0)
    return captured


def test_graph_rows_time_a_cuda_graph_replay_beside_the_plain_launch(fake_gpu):
    table = bench.Table("99")
    row = table.time("tiny", "triton (ours)", lambda: None, n_bytes=2e6, graph=True)
    assert row.name == "triton (ours)" and row.ms == 2.0
    assert [(r.name, r.ms) for r in table.rows] == [("triton (ours)", 2.0), ("triton (ours) [graph]", 1.0)]
    assert table.find("tiny", "triton (ours) [graph]").gbps == pytest.approx(2.0)
    only = table.time("tiny", "torch", lambda: None, graph="only")
    assert only.name == "torch [graph]" and table.find("tiny", "torch") is None
    plain = table.time("tiny", "plain", lambda: None)
    assert plain.ms == 2.0 and table.find("tiny", "plain [graph]") is None and len(fake_gpu) == 2

    def uncapturable():
        return None

    uncapturable.uncapturable = True
    table.time("tiny", "syncs", uncapturable, graph=True)
    assert table.find("tiny", "syncs") and table.find("tiny", "syncs [graph]") is None
    assert any("'syncs' not timed in a CUDA graph" in n for n in table.notes)


def test_add_best_keeps_plain_and_graph_sweeps_apart():
    table = bench.Table("99")
    for name, ms in [("triton (ours) B=1", 3.0), ("triton (ours) B=2", 2.0),
                     ("triton (ours) B=1 [graph]", 1.0), ("triton (ours) B=2 [graph]", 1.5)]:
        table.add("g", name, ms)
    assert table.add_best("g").ms == 2.0
    assert table.find("g", "triton (ours)").ms == 2.0 and table.find("g", "triton (ours) [graph]").ms == 1.0
    fig = bench.plot(table.rows, "t")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["triton (ours)", "triton (ours) [graph]"]


def test_time_peers_times_eager_compile_autotune_and_liger(fake_gpu, monkeypatch):
    import torch

    def fake_compile(fn, mode=None, dynamic=None):
        if mode is not None:
            def broken(*args):
                raise RuntimeError("max-autotune failed to compile")
            return broken
        return lambda *args: fn(*args)

    monkeypatch.setattr(torch, "compile", fake_compile)
    checked = []
    x = torch.arange(4.0)
    table = bench.Table("99")
    names = table.time_peers("op", torch.sin, x, graph=True, liger=torch.sin, check=checked.append, n_bytes=32)
    assert names == ["torch eager", "torch eager [graph]", "torch.compile", "torch.compile [graph]",
                     "Liger-Kernel", "Liger-Kernel [graph]"]
    assert len(checked) == 3 and all(torch.equal(c, torch.sin(x)) for c in checked)
    assert any("peer 'torch.compile max-autotune' skipped: RuntimeError: max-autotune failed" in n
               for n in table.notes)
    t = table.target("op", "torch eager", names, None)
    assert t.peer.endswith("[graph]") and t.ratio == pytest.approx(0.5)


def test_facts_need_plain_keys():
    table = bench.Table("99")
    assert table.fact("busy_us", 12.5) == "12.5"
    with pytest.raises(ValueError):
        table.fact("a|b", "x")
    assert table.to_json()["facts"] == {"busy_us": "12.5"}


def _results(course, device: str, name: str, ratio_ms: float, date: str = "2026-11-22") -> None:
    table = bench.Table("99")
    table.add("op", "torch eager", 1.0)
    table.add("op", "torch.compile", ratio_ms)
    table.add("op", "triton (ours)", 0.5)
    table.target("op", "triton (ours)", ["torch eager", "torch.compile"], 1.0)
    table.target("op", "triton (ours)", "torch eager", 1.9)
    table.fact("span", f"{ratio_ms} us on {device}")
    data = {**table.to_json(), "device": name, "date": date, "torch": "2.11", "triton": "3.6"}
    (course / "results" / f"99_test.{device}.json").write_text(json.dumps(data))


def test_placeholders_render_facts_ratios_and_the_winning_peer(course):
    _results(course, "h200", "NVIDIA H200", 0.45)
    _results(course, "h100", "NVIDIA H100 80GB HBM3", 1.2)  # eager is the fastest peer on this one
    md = ("{{ratio:op|triton (ours)|fastest}} against {{peer:op|triton (ours)}}; "
          "{{ratio@h100:op|triton (ours)|fastest}} against {{peer@h100:op|triton (ours)}}; "
          "{{ratio:op|triton (ours)|torch eager}}; {{fact:span}}; {{fact@h100:span}}; {{ms:op|torch.compile}}; "
          "{{measured}}")
    assert figures.render(md, "99_test") == (
        "0.90 x against torch.compile; 2.00 x against torch eager; 2.00 x; 0.45 us on h200; 1.2 us on h100; "
        "0.45 ms; NVIDIA H200, torch 2.11, triton 3.6, 2026-11-22")
    # A verdict is the run's own (H200: 0.90 x the fastest peer, target 1.0: missed; 2.00 x eager, target
    # 1.9: met), so prose that says "met" or "missed" follows a new run instead of contradicting it.
    assert figures.render("{{verdict:op|triton (ours)|fastest}} / {{verdict:op|triton (ours)|torch eager}} / "
                          "{{verdict@h100:op|triton (ours)|fastest}}", "99_test") == "missed / met / met"
    with pytest.raises(figures.MissingFigure, match="no target with a verdict"):
        figures.render("{{verdict:op|triton (ours)|torch eager [graph]}}", "99_test")
    with pytest.raises(figures.MissingFigure, match="no fact"):
        figures.render("{{fact:nothing}}", "99_test")
    with pytest.raises(figures.MissingFigure, match="no results"):
        figures.render("{{fact@a100:span}}", "99_test")


def test_results_table_puts_both_devices_side_by_side(course):
    _results(course, "h200", "NVIDIA H200", 0.45)
    table = results_table.targets_table(results_table._load())
    head, _, fastest, single = table.splitlines()[:4]
    assert head.endswith("| H100 | H200 |")
    assert "fastest of torch eager, torch.compile" in fastest
    assert fastest.endswith("| not measured | 0.90 x torch.compile **miss** |")
    assert single.endswith("| not measured | 2.00 x torch eager ok |")
    assert "- H100: not measured" in table
    _results(course, "h100", "NVIDIA H100 80GB HBM3", 1.2)
    files = results_table.generated("https://github.com/o/r")
    readme = files[course / "README.md"]
    line = next(x for x in readme.splitlines() if "fastest of" in x)
    assert line.endswith("| 2.00 x torch eager ok | 0.90 x torch.compile **miss** |")
    assert "- H100: NVIDIA H100 80GB HBM3, torch 2.11, triton 3.6, 2026-11-22" in readme
    results_md = files[course / "results" / "README.md"]
    assert "## 99_test on H100" in results_md and "## 99_test on H200" in results_md
    assert "fact `span`: 1.2 us on h100" in results_md
    path = course / "results" / "99_test.h200.json"
    data = json.loads(path.read_text())
    data["targets"][0]["ratio"] = 0.9996
    path.write_text(json.dumps(data))
    fastest = results_table.targets_table(results_table._load()).splitlines()[2]
    # a miss by 0.0004 reads as one, not as "1.00 x ... miss"
    assert fastest.endswith("| 2.00 x torch eager ok | 0.9996 x torch.compile **miss** |")
    assert figures.render("{{ratio:op|triton (ours)|fastest}}", "99_test") == "0.9996 x"


def test_a_failing_bench_keeps_its_rows_and_the_next_lesson_runs(course, monkeypatch):
    import types

    from course_utils import benches

    def failing(table):
        table.add("g", "torch", 1.0)
        raise RuntimeError("CUDA out of memory")

    ran = []
    modules = {"l99_test": types.SimpleNamespace(run=failing),
               "l98_test": types.SimpleNamespace(run=lambda table: ran.append(table.lesson))}
    monkeypatch.setitem(lessons_index.LESSONS, "98", lessons_index.Lesson("98_test", "test", None, "any"))
    monkeypatch.setattr(benches.importlib, "import_module", lambda name: modules[name.rsplit(".", 1)[1]])
    assert benches.run_all(["99", "98"]) is False and ran == ["98"]
    data = json.loads((course / "results" / "99_test.h100.json").read_text())
    assert data["rows"][0]["name"] == "torch" and "CUDA out of memory" in data["error"]


def test_roofs_are_the_best_rate_measured_and_other_work_sits_under_the_cuda_cores():
    from course_utils import roofline

    rows = [bench.Row(roofline.COPY_GROUP, "copy", 1.0, gbps=3000.0),
            bench.Row(roofline.MATMUL_GROUP, "torch.matmul bf16 8192^3", 2.0, tflops=650.0),
            bench.Row(roofline.MATMUL_GROUP, "torch.matmul bf16 4096^3", 0.2, tflops=700.0),
            bench.Row(roofline.CORE_GROUP, "FMA kernel fp32", 0.5, gbps=10.0, tflops=60.0),
            bench.Row("matmul bf16 2048^3", "torch.matmul", 0.03, gbps=1600.0, tflops=710.0),
            bench.Row("matmul bf16 1x8192x8192 (GEMV)", "torch.matmul", 0.05, gbps=2800.0, tflops=2.7),
            bench.Row("softmax fp32 4096x4096", "torch.softmax", 0.05, gbps=2600.0, tflops=1.6)]
    data = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-22", "rows": [asdict(r) for r in rows]}
    ceilings = roofline.ceilings_from_results(data)
    assert ceilings.matmul_tflops == {"bf16": 710.0, "fp32": 60.0}  # no square matmul above its roof
    assert ceilings.ridge("fp32") == pytest.approx(60e12 / 3000e9)
    points = {p.label: p for p in roofline.points_from_rows(data)}
    assert points["softmax fp32 4096x4096"].roof_of(ceilings) == "fp32"
    assert points["matmul bf16 1x8192x8192 (GEMV)"].roof_of(ceilings) == "bf16"
    assert all(p.fraction(ceilings) <= 1.0 for p in points.values())


def test_the_fma_kernel_computes_its_reference():
    import torch

    from course_utils import roofline
    from course_utils.mode import current

    run, cost = roofline.fma_op(n=100, iters=16, device=current().device, block=64)
    torch.testing.assert_close(run(), roofline.fma_ref(run.x, 16), rtol=1e-4, atol=1e-4)
    assert cost.flops == 2 * 16 * 100 and cost.n_bytes == 800


def test_trace_summary_reports_busy_time_and_span_per_call(tmp_path):
    from course_utils.benches import l04_fusion

    def kernel(ts, dur):
        return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur}

    events = [{"ph": "X", "cat": "user_annotation", "name": "call 0", "ts": 0, "dur": 30},
              kernel(10, 2), kernel(20, 2), kernel(30, 2), kernel(40, 2),
              {"ph": "X", "cat": "user_annotation", "name": "call 1", "ts": 1000, "dur": 30},
              kernel(1010, 2), kernel(1014, 2), kernel(1018, 2), kernel(1022, 2)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    summary = l04_fusion.trace_summary(path)
    assert summary["calls"] == 2 and summary["kernels_per_call"] == 4
    assert summary["busy_us_per_call"] == pytest.approx(8.0)
    assert summary["span_us_per_call"] == pytest.approx((32 + 14) / 2)  # within a call, not across calls
    text = l04_fusion.describe_trace("eager", summary)
    assert "busy 8.0 us of a 23.0 us span" in text and "idle" not in text


def test_quick_benches_skip_the_sweeps(monkeypatch):
    from course_utils import benches

    def run_with_quick(table, quick: bool = False): ...

    def run_with_sweep(table, sweep: bool = True): ...

    def run_plain(table): ...

    monkeypatch.delenv("COURSE_BENCH_QUICK", raising=False)
    assert benches._quick_arguments(run_with_quick) == {}
    monkeypatch.setenv("COURSE_BENCH_QUICK", "1")
    assert benches._quick_arguments(run_with_quick) == {"quick": True}
    assert benches._quick_arguments(run_with_sweep) == {"sweep": False}
    assert benches._quick_arguments(run_plain) == {}


def test_prove_notebooks_only_keeps_the_figures(course, monkeypatch):
    """`prove --notebooks-only` records the notebook runs and leaves the measured rows as they were."""
    from course_utils import prove

    table = bench.Table("99")
    table.add("add fp32", "triton (ours)", 0.9, n_bytes=3e9)
    path = bench.save(table)
    (course / "notebooks").mkdir(exist_ok=True)
    (course / "notebooks" / "99_test.ipynb").write_text("{}")
    monkeypatch.setattr(prove, "execute", lambda nb, timeout=600: (True, 1.5, ""))
    monkeypatch.setattr("course_utils.results_table.write", lambda url: course / "README.md")
    assert prove.prove(["99"], bench=False)
    data = json.loads(path.read_text())
    assert data["rows"][0]["name"] == "triton (ours)"
    assert data["notebooks"] == {"notebooks/99_test.ipynb": {"ok": True, "seconds": 1.5, "error": ""}}


def test_a_notebooks_only_file_never_shadows_measured_figures(course):
    from course_utils import figures

    results = course / "results"
    (results / "99_test.h100.json").write_text(json.dumps(bench.Table("99").to_json()))
    assert figures.results_path("99_test") is None and bench.load_results("99") is None
    measured = bench.Table("99")
    measured.add("add fp32", "triton (ours)", 0.9, n_bytes=3e9)
    (results / "99_test.h200.json").write_text(json.dumps(measured.to_json()))
    assert figures.results_path("99_test").name == "99_test.h200.json"
    assert bench.load_results("99")["rows"][0]["name"] == "triton (ours)"
    assert figures.results_path("99_test", "h100").name == "99_test.h100.json"  # asked for by name


def test_launch_bound_targets_are_judged_on_the_graph_timings():
    """With graph rows on both sides the target is judged on them and the plain ratio is only reported;
    without, the plain ratio is judged."""
    table = bench.Table("03")
    for name, ms in [("ours", 0.030), ("ours [graph]", 0.010), ("peer", 0.020), ("peer [graph]", 0.012)]:
        table.add("small", name, ms)
    table.target_plain_and_graph("small", "ours", ["peer"], 1.0, 1.05)
    plain, graph = table.targets
    assert (plain.ours, plain.minimum, plain.met) == ("ours", None, None) and plain.ratio == pytest.approx(2 / 3)
    assert (graph.ours, graph.peer, graph.minimum, graph.met) == ("ours [graph]", "peer [graph]", 1.0, True)
    for name, ms in [("ours", 0.5), ("peer", 0.4)]:
        table.add("big", name, ms)
    table.target_plain_and_graph("big", "ours", ["peer"], 1.0)
    assert (table.targets[-1].minimum, table.targets[-1].met) == (1.0, False) and len(table.targets) == 3


def test_a_peer_without_a_graph_row_keeps_the_target_on_plain_timings():
    """A peer whose CUDA-graph capture failed must not drop out of the comparison: the target is then
    judged on the plain rows (where the peer is), and a note says why."""
    table = bench.Table("08")
    for name, ms in [("ours", 0.30), ("ours [graph]", 0.18), ("compile", 0.20), ("liger", 0.25),
                     ("liger [graph]", 0.24)]:
        table.add("fwd+bwd", name, ms)
    table.target_plain_and_graph("fwd+bwd", "ours", ["compile", "liger"], 1.0)
    assert len(table.targets) == 1
    t = table.targets[0]
    assert (t.ours, t.peer, t.minimum, t.met) == ("ours", "compile", 1.0, False)
    assert any("no CUDA-graph row for compile" in n for n in table.notes)


def test_alternating_timings_take_turns_and_keep_each_median(fake_gpu, monkeypatch):
    """A heating GPU slows down run after run: taking turns gives each kernel the same conditions."""
    order = []
    clock = iter([5.0, 1.0, 4.0, 2.0, 3.0, 9.0])  # peer, ours, peer, ours, peer, ours

    def fake_bench(fn, **kw):
        order.append(fn.__name__)
        return next(clock)

    monkeypatch.setattr(bench, "do_bench", fake_bench)

    def peer():
        return None

    def ours():
        return None

    rows = bench.Table("99").time_alternating("mm", [("peer", peer), ("ours", ours)], flops=2e12)
    assert order == ["peer", "ours"] * 3
    assert [(r.name, r.ms) for r in rows] == [("peer", 4.0), ("ours", 2.0)]
    assert rows[1].tflops == pytest.approx(1000.0)


def _clocked(monkeypatch, times: dict[str, list[float]]) -> list[str]:
    """do_bench returns each function's next time from `times` (by __name__); returns the calls' order."""
    order, clocks = [], {name: iter(v) for name, v in times.items()}

    def fake_bench(fn, **kw):
        order.append(fn.__name__)
        return next(clocks[fn.__name__])

    monkeypatch.setattr(bench, "do_bench", fake_bench)
    return order


def _named(name: str):
    def fn():
        return None

    fn.__name__ = name
    return fn


def test_a_close_call_is_decided_again_in_turns(fake_gpu, monkeypatch):
    """Ties at a copy's rate: the first ratio picked the fastest of noisy equals, so a ratio near its
    threshold is measured again, ours and the peers near the fastest in turns, and their medians decide."""
    rounds = bench.DECIDING_ROUNDS
    order = _clocked(monkeypatch, {
        "ours": [1.01] + [1.00] * rounds, "compiled": [1.00] + [1.02] * rounds,
        "autotuned": [1.02] + [1.01] * rounds, "eager": [2.0]})
    table = bench.Table("99")
    for name in ("ours", "compiled", "autotuned", "eager"):
        table.time("op", name, _named(name), n_bytes=1e9)
    t = table.target("op", "ours", ["eager", "compiled", "autotuned"], 1.0)
    assert order[4:] == ["ours", "compiled", "autotuned"] * rounds  # eager, far behind, is not timed again
    assert t.decided["first_ratio"] == pytest.approx(1.00 / 1.01) and t.decided["first_peer"] == "compiled"
    assert t.peer == "autotuned" and t.ratio == pytest.approx(1.01) and t.met is True
    assert t.decided["ms"] == {"ours": 1.0, "compiled": 1.02, "autotuned": 1.01}
    assert "close call" in results_table._cell(asdict(t))


def test_a_clear_verdict_or_an_untimed_row_is_not_measured_again(fake_gpu, monkeypatch):
    order = _clocked(monkeypatch, {"ours": [1.25, 1.0], "peer": [1.0, 1.0]})
    table = bench.Table("99")
    table.time("op", "ours", _named("ours"))
    table.time("op", "peer", _named("peer"))
    clear = table.target("op", "ours", "peer", 1.0)
    assert clear.decided is None and clear.ratio == pytest.approx(0.8) and len(order) == 2
    table.add("op", "floor", 1.24)  # computed, no function: nothing to time again
    near = table.target("op", "ours", "floor", 1.0)
    assert near.decided is None and near.ratio == pytest.approx(1.24 / 1.25) and len(order) == 2


def test_a_close_rate_target_is_decided_on_each_side_s_own_bytes(fake_gpu, monkeypatch):
    """A copy ceiling moves other bytes than ours: the rematch keeps each row's work, only its time changes."""
    rounds = bench.DECIDING_ROUNDS
    _clocked(monkeypatch, {"ours": [2.0] + [1.9] * rounds, "copy": [1.0] * (rounds + 1)})
    table = bench.Table("99")
    table.time("op", "ours", _named("ours"), n_bytes=1.6e9)  # 800 GB/s
    table.time("op", "copy", _named("copy"), n_bytes=0.8e9)  # 800 GB/s
    t = table.target("op", "ours", "copy", 1.0, metric="gbps")
    assert t.decided["first_ratio"] == pytest.approx(1.0) and t.ratio == pytest.approx(2.0 / 1.9)


def test_a_sweep_s_best_is_timed_again_by_the_function_of_its_row(fake_gpu, monkeypatch):
    rounds = bench.DECIDING_ROUNDS
    order = _clocked(monkeypatch, {"wide": [1.0] + [0.9] * rounds, "narrow": [1.2], "peer": [0.99] * (rounds + 1)})
    table = bench.Table("99")
    table.time("op", "triton (ours) wide", _named("wide"))
    table.time("op", "triton (ours) narrow", _named("narrow"))
    table.time("op", "peer", _named("peer"))
    table.add_best("op")
    t = table.target("op", "triton (ours)", "peer", 1.0)
    assert order[3:] == ["wide", "peer"] * rounds and t.ratio == pytest.approx(0.99 / 0.9)


def test_smi_samples_parse_to_medians():
    """clock_and_power's reading of nvidia-smi: medians of clock, power and limit, the capped share; a
    field the driver does not report ("[N/A]") gives no figures rather than wrong ones."""
    from course_utils.bench import parse_smi_samples

    text = "1380, 690.5, 700.00, Active\n1400, 695.1, 700.00, Active\n1980, 300.0, 700.00, Not Active\n"
    got = parse_smi_samples(text)
    assert got == {"sm_mhz": 1400.0, "power_w": 690.5, "power_limit_w": 700.0, "power_capped": 2 / 3,
                   "samples": 3}
    assert parse_smi_samples("1380, [N/A], 700.00, Active\n") is None
    assert parse_smi_samples("") is None


def test_registers_and_spills_reads_a_compiled_kernel_in_bytes():
    """Triton counts spills in 4-byte words; the facts the lessons cite are bytes. The interpreter's launch
    returns no compiled kernel: no counts."""
    from types import SimpleNamespace

    from course_utils.bench import registers_and_spills

    assert registers_and_spills(SimpleNamespace(n_regs=255, n_spills=46)) == (255, 184)
    assert registers_and_spills(None) is None
