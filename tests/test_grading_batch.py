"""`python -m course_utils grade`: a folder of submissions, each in its own sandbox, one table.

The submissions are made here, in a temporary folder, from the lesson 02 notebooks: the solution
(correct), the exercise with only vector_add solved (partial, below `%matplotlib inline`), broken JSON,
an infinite loop, a kernel that exits, a missing import (with a deleted check cell), and a notebook
without checks.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from course_utils.__main__ import main as cli
from course_utils.grading import batch
from course_utils.mode import current
from helpers import interpreter_only_because

# One test process (pytest-xdist) runs this module and test_grading_attacks: the module-scoped fixture (the
# graded folder) is made once, and the look for sandboxes and temporary folders left behind sees only its own.
pytestmark = pytest.mark.xdist_group("sandboxes")

ROOT = Path(__file__).resolve().parent.parent
# seconds per notebook: the solution needs about 15 on a 2-core CPU; on a GPU, compiling its kernels beside
# other busy processes took over 30 (an H100 with the suite running in parallel); the loop uses it all
TIMEOUT = 30 if current().interpret else 120
BROKEN = '{\n "cells": [\n  {\n   "cell_type": "code",\n   "source": "'  # a notebook cut short


def _load(folder: str) -> dict:
    return json.loads((ROOT / folder / "02_first_kernels.ipynb").read_text())


def _code(source: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": "added", "metadata": {}, "outputs": [],
            "source": source}


def _index(nb: dict, text: str) -> int:
    return next(i for i, c in enumerate(nb["cells"]) if text in "".join(c["source"]))


def _after_first_check(nb: dict, source: str) -> tuple[dict, int]:
    """The notebook with a cell added after its vector_add check; and that cell's number (from 1)."""
    nb = copy.deepcopy(nb)
    at = _index(nb, 'check("02.vector_add"') + 1
    nb["cells"].insert(at, _code(source))
    return nb, at + 1


def make_submissions(folder: Path) -> dict[str, int]:
    """Write the submissions; returns the numbers of the cells that loop, crash and fail to import.

    The loop sorts first, so that with two kernels at a time it runs beside all the others."""
    solution, exercise = _load("solutions"), _load("exercises")
    cells = {}

    def write(name: str, nb: dict) -> None:
        (folder / name).write_text(json.dumps(nb, indent=1))

    write("bob_correct.ipynb", solution)
    partial = copy.deepcopy(exercise)
    solved = copy.deepcopy(solution["cells"][_index(solution, "def add_kernel")])
    # atop the cell, as many notebooks have it: it raised in the sandbox's plain IPython shell (no GUI loop), and
    # the kernel below it was never defined
    solved["source"] = "%matplotlib inline\n" + "".join(solved["source"])
    partial["cells"][_index(partial, "def add_kernel")] = solved
    write("cat_partial.ipynb", partial)
    (folder / "dan_broken.ipynb").write_text(BROKEN)
    loop, cells["loop"] = _after_first_check(solution, "while True:\n    pass")
    write("ann_loop.ipynb", loop)
    crash, cells["crash"] = _after_first_check(solution, "import os; os._exit(1)")
    write("eve_crash.ipynb", crash)
    missing = copy.deepcopy(solution)
    first = _index(missing, "from course_utils import check")
    source = "".join(missing["cells"][first]["source"])
    missing["cells"][first]["source"] = "import a_module_nobody_has\n" + source
    del missing["cells"][_index(missing, 'check("02.copy_2d"')]
    cells["import"] = first + 1
    write("fay_missing_import.ipynb", missing)
    no_checks = copy.deepcopy(solution)
    no_checks["cells"] = [c for c in no_checks["cells"] if "check(" not in "".join(c["source"])]
    write("gus_no_checks.ipynb", no_checks)
    return cells


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade the folder once (two kernels at a time): what the CLI printed, the report, the folder."""
    folder = tmp_path_factory.mktemp("submissions")
    cells = make_submissions(folder)
    before = _snapshot(folder)
    report = tmp_path_factory.mktemp("report") / "grades"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = batch.main([str(folder)], timeout=TIMEOUT, report=str(report), jobs=2)
    return {"code": code, "output": out.getvalue(), "log": err.getvalue(), "report": report, "folder": folder,
            "before": before, "cells": cells}


def _rows(table: str) -> list[list[str]]:
    """The table's cells, split on the runs of spaces between columns (the dashed rule dropped)."""
    return [re.split(r"\s{2,}", line.strip()) for line in table.splitlines() if not set(line) <= {"-", " "}]


def test_the_table_of_a_folder_of_submissions(graded):
    cells = graded["cells"]
    assert _rows(graded["output"]) == [
        ["submission", "02.vector_add", "02.relu", "02.copy_2d", "score", "flags", "notes"],
        ["ann_loop.ipynb", "pass", "timed out", "timed out", "1/3", "-",
         f"timed out after {TIMEOUT} s in cell {cells['loop']} (`while True:`)"],
        ["bob_correct.ipynb", "pass", "pass", "pass", "3/3", "-"],
        ["cat_partial.ipynb", "pass", "fail: raised NotImplementedError: relu: not written yet",
         "fail: raised NotImplementedError: copy_2d: not written yet", "1/3", "-"],
        ["dan_broken.ipynb", "-", "-", "-", "-", "-",
         "invalid notebook: not JSON (Unterminated string starting at: line 5 column 14)"],
        ["eve_crash.ipynb", "pass", "kernel died", "kernel died", "1/3",
         f"imports os (code this scan cannot read) (cell {cells['crash']})",
         f"kernel died in cell {cells['crash']} (`import os; os._exit(1)`): exit code 1"],
        ["fay_missing_import.ipynb", "error: NameError: name 'check' is not defined",
         "error: NameError: name 'check' is not defined", "missing", "0/3",
         f"imports a_module_nobody_has (code this scan cannot read) (cell {cells['import']})",
         f"cell {cells['import']} raised ModuleNotFoundError: No module named 'a_module_nobody_has'"],
        ["gus_no_checks.ipynb", "-", "-", "-", "-", "-", "no check cells: nothing to grade"],
    ]


def test_grading_ran_so_the_exit_code_is_zero(graded):
    assert graded["code"] == 0


def test_submissions_are_never_written(graded):
    folder = graded["folder"]
    assert _snapshot(folder) == graded["before"], "bytes and mtimes unchanged, no file added"


def test_the_json_report_has_every_verdict_with_its_seed(graded):
    data = json.loads(graded["report"].with_name("grades.json").read_text())
    assert data["exercises"] == ["02.vector_add", "02.relu", "02.copy_2d"]
    assert data["timeout_s"] == TIMEOUT
    subs = {s["name"]: s for s in data["submissions"]}
    assert list(subs) == sorted(subs)
    bob = subs["bob_correct.ipynb"]
    assert (bob["status"], bob["passed"], bob["total"], bob["flags"]) == ("graded", 3, 3, [])
    assert all(isinstance(v["seed"], int) and v["status"] == "pass" for v in bob["exercises"].values())
    relu = subs["cat_partial.ipynb"]["exercises"]["02.relu"]
    assert relu["status"] == "fail" and f"seed={relu['seed']})" in relu["detail"]
    assert "Traceback" not in relu["detail"] and "NotImplementedError" in relu["detail"]
    assert subs["dan_broken.ipynb"]["status"] == "invalid notebook"
    assert subs["ann_loop.ipynb"]["status"] == "timed out"
    assert subs["eve_crash.ipynb"]["status"] == "kernel died"
    gus = subs["gus_no_checks.ipynb"]
    assert (gus["status"], gus["total"]) == ("no check cells", 0)


def test_the_csv_report_has_a_row_per_submission(graded):
    with graded["report"].with_name("grades.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["submission"] for r in rows] == sorted(r["submission"] for r in rows)
    cat = next(r for r in rows if r["submission"] == "cat_partial.ipynb")
    assert (cat["passed"], cat["total"], cat["02.vector_add"], cat["02.relu"]) == ("1", "3", "pass", "fail")
    assert cat["02.relu reason"] == "raised NotImplementedError: relu: not written yet"
    ann = next(r for r in rows if r["submission"] == "ann_loop.ipynb")
    assert ann["status"] == "timed out" and ann["02.copy_2d"] == "timed out"


# --- cheap cases: no kernel is started ----------------------------------------------------------

def test_usage_errors_exit_non_zero(tmp_path, capsys):
    assert batch.main([str(tmp_path / "nowhere")], timeout=10, report=None) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert batch.main([str(tmp_path)], timeout=10, report=None) == 2
    assert "no notebooks" in capsys.readouterr().err
    (tmp_path / "a.ipynb").write_text(BROKEN)
    assert batch.main([str(tmp_path)], timeout=0, report=None) == 2


def test_the_command_line_writes_both_reports(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "subs"
    (folder / "nested").mkdir(parents=True)
    (folder / "nested" / "broken.ipynb").write_text(BROKEN)
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "broken-checkpoint.ipynb").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    assert cli(["grade", str(folder), "--timeout", "5", "--report", "out/grades"]) == 0
    out = capsys.readouterr().out
    assert _rows(out)[1][0] == "nested/broken.ipynb" and len(_rows(out)) == 2, "checkpoints are skipped"
    assert (tmp_path / "out" / "grades.json").exists() and (tmp_path / "out" / "grades.csv").exists()
    assert sorted(os.listdir(folder / "nested")) == ["broken.ipynb"]


def test_a_name_the_terminal_cannot_print_costs_no_report(tmp_path, monkeypatch):
    """A submission named 名前.ipynb, graded on a Latin-1 terminal, ended the run at the table (a
    UnicodeEncodeError) before any report was written: everybody's grades lost. The report is written
    first, and the table prints what the terminal cannot show as escapes."""
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "名前.ipynb").write_text(BROKEN, encoding="utf-8")
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="latin-1"))
    assert batch.main([str(tmp_path / "subs")], timeout=5, report=str(tmp_path / "grades")) == 0
    sys.stdout.flush()
    assert "\\u540d\\u524d.ipynb" in out.getvalue().decode("latin-1")
    data = json.loads((tmp_path / "grades.json").read_text(encoding="utf-8"))
    assert data["submissions"][0]["name"] == "名前.ipynb"


def test_invalid_notebooks_say_why(tmp_path):
    cases = {"binary.ipynb": b"\xff\xfe\x00", "list.ipynb": b"[1, 2]", "cells.ipynb": b'{"cells": 3}'}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    found = {sub.name: sub for sub in batch.grade([tmp_path], timeout=5)}
    assert found["binary.ipynb"].notes.startswith("invalid notebook: not UTF-8 text")
    assert found["list.ipynb"].notes == "invalid notebook: JSON without a list of cells"
    assert found["cells.ipynb"].notes == "invalid notebook: JSON without a list of cells"


def test_a_link_in_the_folder_is_not_graded(tmp_path):
    """A symbolic link in the folder (to the course's solution, to another submission: what an unpacked
    archive can hold) would be graded as the file it points to: it is an invalid notebook, refused unread.
    A file named on the command line is the instructor's choice, and is followed."""
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "link.ipynb").symlink_to(ROOT / "solutions" / "02_first_kernels.ipynb")
    (sub,) = batch.grade([tmp_path / "subs"], timeout=5)
    assert sub.status == batch.INVALID and sub.total == 0, sub
    assert sub.notes.startswith("invalid notebook: a symbolic link (to ")
    named = batch.find_notebooks([tmp_path / "subs" / "link.ipynb"])
    assert named == [("link.ipynb", ROOT / "solutions" / "02_first_kernels.ipynb")]


def test_a_huge_file_is_refused_unread(tmp_path, monkeypatch):
    """A notebook of gigabytes would be read whole into the grader's memory (and decoded and parsed: several
    times its size): past batch.NOTEBOOK_MAX it is an invalid notebook, and no more of it is read."""
    (tmp_path / "huge.ipynb").write_text(json.dumps(_load("solutions")))
    monkeypatch.setattr(batch, "NOTEBOOK_MAX", 4096, raising=False)
    (sub,) = batch.grade([tmp_path], timeout=5)
    assert sub.status == batch.INVALID, sub
    assert sub.notes == "invalid notebook: larger than the limit of 4,096 bytes"


def test_more_code_than_the_grader_may_parse_is_refused_unparsed(tmp_path):
    """The grader parses each code cell itself (check cells, flags) before any sandbox or timeout: 8 MiB of
    `a=1` lines in one cell took 4.8 GiB and 24 s of the grader's own process, and a notebook of 64 MiB
    would end it, with every other submission's result. Past the limits, an invalid notebook, unparsed."""
    nb = _load("solutions")
    cases = {"cell": [_code("a = 1\n" * (batch.CELL_CODE_MAX // 6 + 1))],
             "code": [_code("#" * batch.CELL_CODE_MAX)] * (batch.CODE_MAX // batch.CELL_CODE_MAX + 1),
             "cells": [_code("a = 1")] * (batch.CELLS_MAX + 1)}
    for name, cells in cases.items():
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(dict(nb, cells=nb["cells"] + cells)))
    start = time.monotonic()
    found = {sub.name: sub for sub in batch.grade([tmp_path], timeout=5)}
    assert time.monotonic() - start < 10
    assert all(sub.status == batch.INVALID for sub in found.values()), found
    assert re.fullmatch(r"invalid notebook: cell \d+ holds [\d,]+ characters of code, more than the limit of "
                        r"262,144", found["cell.ipynb"].notes), found["cell.ipynb"].notes
    assert found["code.ipynb"].notes.endswith("characters of code, more than the limit of 2,097,152")
    cells = len(nb["cells"]) + batch.CELLS_MAX + 1
    assert found["cells.ipynb"].notes == f"invalid notebook: {cells:,} cells, more than the limit of 5,000"
    assert batch.read_notebook(ROOT / "solutions" / "06_fused_rmsnorm_mlp.ipynb").cells  # the largest, read


def test_check_ids_come_from_the_check_cells():
    nb = batch.read_notebook(ROOT / "exercises" / "02_first_kernels.ipynb")
    assert [ids for ids in batch.check_cells(nb).values()] == [["02.vector_add"], ["02.relu"], ["02.copy_2d"]]
    assert batch.course_exercise_ids("02") == ["02.vector_add", "02.relu", "02.copy_2d"]
    source = "check('03.matmul', mm, seed=3)\ncourse_utils.check(\"04.sin4\", f)\ndef check(x): pass"
    assert [m.group(2) for m in batch.CHECK_CALL.finditer(source)] == ["03.matmul", "04.sin4"]


def test_same_names_from_two_folders_are_told_apart(tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "nb.ipynb").write_text(BROKEN)
    names = [name for name, _ in batch.find_notebooks([tmp_path / "a", tmp_path / "b"])]
    assert names == [str(tmp_path / "a" / "nb.ipynb"), str(tmp_path / "b" / "nb.ipynb")]


def test_table_cuts_long_reasons():
    long = batch.Verdict("fail", "x" * 200)
    sub = batch.Submission("s.ipynb", "s.ipynb", exercises={"02.relu": long})
    row = batch.table_rows([sub])[1]
    assert row[1] == ("fail: " + "x" * 200)[: batch.CELL_WIDTH - 3] + "..." and row[2] == "0/1" and row[3] == "-"


def test_an_autograd_exercise_is_differentiated_in_the_sandbox(tmp_path):
    """08.rmsnorm_train returns an autograd output whose graph lives in the sandbox: the grader's stand-in
    node saves what the student's saved and asks the sandbox for the backward (remote.autograd_in)."""
    solution = json.loads((ROOT / "solutions" / "08_backward_passes.ipynb").read_text())
    for name, old, new in (("right", "", ""),
                           ("wrong_grads", "rmsnorm_backward(dy_rows, rows, weight, rstd, dx, dw)",
                            "rmsnorm_backward(rows, dy_rows, weight, rstd, dx, dw)"),
                           ("saves_copy", "ctx.save_for_backward(x, weight", "ctx.save_for_backward(x.clone(), weight"),
                           ("torch_backward", "rmsnorm_backward(dy_rows, rows, weight, rstd, dx, dw)",
                            "xhat, g = rows.float() * rstd[:, None], dy_rows.float() * weight.float()\n"
                            "        dx.copy_((g - xhat * (g * xhat).mean(1, keepdim=True))"
                            " * rstd[:, None])\n"
                            "        dw.copy_((dy_rows.float() * xhat).sum(0))"),
                           ("torch_beside_kernel",
                            "        return dx.view(x.shape), dw.to(weight.dtype), None",
                            "        dw = dw * 1.0\n"
                            "        return dx.view(x.shape), dw.to(weight.dtype), None"),
                           ("strides_ignored", "dy_rows = dy.reshape(rows.shape).contiguous()",
                            "dy_rows = dy.reshape(rows.shape)"),
                           ("copy_in_a_list", "        return y.view(x.shape)",
                            "        ctx.cache = {'rows': [y.clone()]}\n        return y.view(x.shape)"),
                           ("copy_in_a_global", "        return y.view(x.shape)",
                            "        KEPT.append(y.clone())\n        return y.view(x.shape)"),
                           ("copy_in_halves", "        return y.view(x.shape)",
                            "        ctx.halves = (lambda c: lambda: c)(list(y.clone().view(-1).chunk(2)))\n"
                            "        return y.view(x.shape)"),
                           ("numpy_in_backward", "        return dx.view(x.shape), dw.to(weight.dtype), None",
                            "        dy.detach().cpu().numpy()\n"
                            "        return dx.view(x.shape), dw.to(weight.dtype), None"),
                           # rstd from the last forward, not its own: wrong once two forwards come before
                           # their backwards (the sandbox keeps each call's output for its own backward)
                           ("last_forwards_rstd", "        x, weight, rstd = ctx.saved_tensors",
                            "        x, weight, _ = ctx.saved_tensors\n"
                            "        rstd = RMSNormFunction.last_rstd"),
                           ):
        nb = copy.deepcopy(solution)
        at = _index(nb, "class RMSNormFunction")
        source = "".join(nb["cells"][at]["source"])
        assert old in source
        source = source.replace(old, new) if old else source
        if name == "copy_in_a_global":
            source = "KEPT = []\n" + source
        if name == "last_forwards_rstd":
            keep = "        ctx.save_for_backward(x, weight, rstd)"
            source = source.replace(keep, keep + "\n        RMSNormFunction.last_rstd = rstd")
        nb["cells"][at]["source"] = source
        nb["cells"] = [c for c in nb["cells"] if 'check("08.' not in "".join(c["source"])
                       or 'check("08.rmsnorm_train"' in "".join(c["source"])]
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(nb))
    found = {sub.name: sub.exercises["08.rmsnorm_train"] for sub in batch.grade([tmp_path], timeout=120, jobs=2)}
    assert found["right.ipynb"].status == batch.PASS, found["right.ipynb"]
    assert found["wrong_grads.ipynb"].status == batch.FAIL and "x.grad" in found["wrong_grads.ipynb"].reason
    assert found["saves_copy.ipynb"].status == batch.FAIL and "keeps a (rows, hidden)" in found["saves_copy.ipynb"].reason
    assert found["torch_backward.ipynb"].status == batch.FAIL, found["torch_backward.ipynb"]
    assert "the backward launched no Triton kernel" in found["torch_backward.ipynb"].reason
    # the sandbox's backward reports its host ops; the transposed gradient arrives with its strides
    assert found["torch_beside_kernel.ipynb"].status == batch.FAIL
    assert "computed with torch operations" in found["torch_beside_kernel.ipynb"].reason
    assert found["strides_ignored.ipynb"].status == batch.FAIL
    assert "transposed" in found["strides_ignored.ipynb"].detail
    assert found["copy_in_a_list.ipynb"].status == batch.FAIL, found["copy_in_a_list.ipynb"]
    assert "keeps a (rows, hidden)" in found["copy_in_a_list.ipynb"].reason
    # in halves inside a closure: no tensor on ctx, but the bytes the sandbox's node keeps alive
    assert found["copy_in_halves.ipynb"].status == batch.FAIL, found["copy_in_halves.ipynb"]
    assert "bytes a row, where rstd takes 4" in found["copy_in_halves.ipynb"].reason
    # in a module's list: reachable from nothing the node holds, but made by the forward and alive after it
    assert found["copy_in_a_global.ipynb"].status == batch.FAIL, found["copy_in_a_global.ipynb"]
    assert "held outside ctx" in found["copy_in_a_global.ipynb"].reason
    # and the host reads of its backward (autograd runs a backward outside the TorchFunctionMode)
    assert found["numpy_in_backward.ipynb"].status == batch.FAIL, found["numpy_in_backward.ipynb"]
    assert found["last_forwards_rstd.ipynb"].status == batch.FAIL, found["last_forwards_rstd.ipynb"]
    assert "the FIRST forward's" in found["last_forwards_rstd.ipynb"].reason, found["last_forwards_rstd.ipynb"]
    assert "the backward read tensor data into Python/NumPy" in found["numpy_in_backward.ipynb"].reason


IN_PLACE = {"pack_int4": "def pack_int4(lo, hi):\n    lo |= hi << 4\n    return lo\n",
            "unpack_int4": "def unpack_int4(packed):\n    hi = packed >> 4\n    packed &= 0xF\n"
                           "    return packed, hi\n"}


def test_a_function_exercise_that_changes_its_inputs_fails_in_the_sandbox_too(tmp_path):
    """07.pack_int4 answered in place (lo |= hi << 4; return lo): the interactive check fails it for modifying
    its input. The sandbox sends its arguments back and the grader compares them with the case's own; a view
    of the input (01.transpose_view) still shares the storage the sandbox was given."""
    nb = json.loads((ROOT / "solutions" / "07_fp8_quantization.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = next(i for i, c in enumerate(cells) if "from course_utils import check" in "".join(c["source"]))
    nb["cells"] = cells[first - 1:first + 1]
    for name, source in IN_PLACE.items():
        nb["cells"] += [_code(source), _code(f'check("07.{name}", {name})')]
    (tmp_path / "in_place.ipynb").write_text(json.dumps(nb))
    views = json.loads((ROOT / "solutions" / "01_strides_and_intensity.ipynb").read_text())
    (tmp_path / "views.ipynb").write_text(json.dumps(views))
    found = {sub.name: sub for sub in batch.grade([tmp_path], timeout=120, jobs=2)}
    for name in IN_PLACE:
        verdict = found["in_place.ipynb"].exercises[f"07.{name}"]
        assert verdict.status == batch.FAIL and "modified its input" in verdict.reason, verdict
    assert found["views.ipynb"].passed == found["views.ipynb"].total == 5, found["views.ipynb"]


READ_LOG_DODGES = {  # 05.online_softmax_stats in two whole passes, the read log cleared or bypassed: what fails it
    "cleared": ("def online_softmax_stats(x, block):\n    m, d = two_passes(x)\n    x._reads.clear()\n"
                "    return m, d\n", "elements of x at once"),
    "as_subclass": ("def online_softmax_stats(x, block):\n"
                    "    return two_passes(torch.Tensor.as_subclass(x, torch.Tensor))\n", "elements of x at once"),
    "python_list": ("def online_softmax_stats(x, block):\n    values = []\n    for s in range(0, x.numel(), block):\n"
                    "        values += x[s:s + block].double().tolist()\n"
                    "    m = max(values)\n"
                    "    return m, (sum(math.exp(v - m) for v in values) if m > -math.inf else 0.0)\n",
                    "Python objects and NumPy arrays held"),
}
TWO_PASSES = """
def two_passes(x):
    x = x.to(torch.float64)
    m = float(x.max())
    return m, (float(torch.exp(x - m).sum()) if m > -math.inf else 0.0)
"""


def test_the_read_log_of_online_stats_is_kept_in_the_sandbox_too(tmp_path):
    """The sandbox reports 05.online_softmax_stats's read log: what the candidate did to x._reads changes
    nothing (a copy), a plain tensor over x's memory is read where torch runs (dispatch), and the Python
    objects a call held at once (tracemalloc's peak) are measured in the sandbox."""
    nb = json.loads((ROOT / "solutions" / "05_online_softmax.ipynb").read_text())
    at = _index(nb, 'check("05.online_softmax_stats"')
    cells = [c for c in nb["cells"][:at + 1] if c["cell_type"] == "code"]
    nb["cells"] = cells
    (tmp_path / "honest.ipynb").write_text(json.dumps(nb))
    for name, (source, _) in READ_LOG_DODGES.items():
        dodge = copy.deepcopy(nb)
        dodge["cells"].insert(len(cells) - 1, _code(TWO_PASSES + source))
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(dodge))
    graded = batch.grade([tmp_path], timeout=120, jobs=2)
    found = {sub.name: sub.exercises["05.online_softmax_stats"] for sub in graded}
    assert found["honest.ipynb"].status == batch.PASS, found["honest.ipynb"]
    for name, (_, says) in READ_LOG_DODGES.items():
        assert found[f"{name}.ipynb"].status == batch.FAIL, found[f"{name}.ipynb"]
        assert says in found[f"{name}.ipynb"].reason, found[f"{name}.ipynb"]


def test_a_flood_of_empty_buffers_is_refused():
    """A message announcing millions of (empty) buffers would grow the grader's list of them for as long as
    the notebook's time lasts: more than remote.BLOBS_MAX is a broken protocol, at once."""
    from course_utils.grading import remote

    read, write = os.pipe()
    header = json.dumps({"op": "cell_done", "blobs": 10**12}).encode()
    os.write(write, len(header).to_bytes(8, "big") + header + bytes(8 * 1000))
    chan = remote.Channel(read, write, nonblocking=True)
    chan.deadline = time.monotonic() + 5
    with pytest.raises(remote.ProtocolError, match="buffers"):
        chan.recv(blob_limit=0)
    os.close(read), os.close(write)


# (a cell's checks are served once it has run: the outputs are seen, and a check made again, in the next cell)
RETRY = """
seen, attempt = [], 0
def relu_once_wrong(x, out):  # wrong on the first check only: a flaky kernel
    seen.append(out)
    n = out.numel() - (attempt == 0)
    relu_kernel[(triton.cdiv(max(n, 1), 1024),)](x, out, n, BLOCK=1024)
check("02.relu", relu_once_wrong)
"""
RETRY_AGAIN = """
if any(out.isnan().any() for out in seen):  # it sees its own outputs: check again until they are right
    attempt = 1
    check("02.relu", relu_once_wrong)
"""
HOSTILE_TEXT = """
Boom = type('=HYPERLINK("http://x.example")', (Exception,), {})
raise Boom("\\x1b[2J\\x1b[Hbob.ipynb  pass  pass  pass  3/3\\nmallory.ipynb  pass")
check("02.copy_2d", None)
"""


def test_a_notebook_can_neither_retry_its_way_to_a_pass_nor_write_into_the_report(tmp_path):
    solution = _load("solutions")
    nb = copy.deepcopy(solution)
    keep = [_index(nb, "from course_utils import setup"), _index(nb, "from course_utils import check"),
            _index(nb, "def relu_kernel")]
    nb["cells"] = [nb["cells"][i] for i in keep] + [_code(RETRY), _code(RETRY_AGAIN), _code(HOSTILE_TEXT)]
    (tmp_path / "retry.ipynb").write_text(json.dumps(nb))
    (tmp_path / '=1+1\n\x1b[2Jmallory.ipynb  pass  pass.ipynb').write_text(BROKEN)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert batch.main([str(tmp_path)], timeout=120, report=str(tmp_path / "grades"), jobs=2) == 0
    data = json.loads((tmp_path / "grades.json").read_text())
    retry = next(s for s in data["submissions"] if s["name"] == "retry.ipynb")
    assert retry["exercises"]["02.relu"]["status"] == "fail", "the first failure stays"
    assert retry["exercises"]["02.relu"]["reason"].endswith(batch.AGAIN)
    assert retry["exercises"]["02.copy_2d"]["reason"].startswith('=HYPERLINK(')
    for text in (out.getvalue(), err.getvalue(), (tmp_path / "grades.csv").read_text()):
        assert "\x1b" not in text and "\nmallory" not in text
    assert len(out.getvalue().splitlines()) == 2 + 2, "a header, a rule and one line per submission"
    with (tmp_path / "grades.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 3 and not any(cell[:1] in "=+-@" for row in rows for cell in row if cell)


@interpreter_only_because("only the interpreter sees a store of the value already there; on a GPU such a store "
                          "leaves nothing to compare")
def test_stores_into_the_cache_outside_the_new_row_are_seen_in_the_sandbox(tmp_path):
    """09.kv_append with the right values but every row of the cache rewritten: the sandbox's interpreter sees
    the stores (harness._stores_outside), told by the grader which elements may change (Out.writable)."""
    solution = json.loads((ROOT / "solutions" / "09_decoding.ipynb").read_text())
    rewrite = (ROOT / "tests" / "kv_rewrite.py").read_text()
    for name, extra in (("right", ""), ("rewrites", rewrite)):
        nb = copy.deepcopy(solution)
        nb["cells"] = [c for c in nb["cells"] if 'check("09.' not in "".join(c["source"])
                       or 'check("09.kv_append"' in "".join(c["source"])]
        if extra:
            nb["cells"].insert(_index(nb, 'check("09.kv_append"'), _code(extra))
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(nb))
    found = {sub.name: sub.exercises["09.kv_append"] for sub in batch.grade([tmp_path], timeout=120, jobs=2)}
    assert found["right.ipynb"].status == batch.PASS, found["right.ipynb"]
    assert found["rewrites.ipynb"].status == batch.FAIL, found["rewrites.ipynb"]
    assert "it must leave alone" in found["rewrites.ipynb"].reason


def test_the_folder_the_grader_started_in_is_not_in_the_sandbox(monkeypatch):
    """`python -m course_utils grade` started from a folder above the checkout puts that folder on sys.path;
    mounted, it showed the sandbox the course's solutions (copied under another name, they passed as the
    student's), the other submissions and earlier reports. Neither it nor any folder holding the course is."""
    from course_utils.grading import sandbox

    above = str(sandbox.ROOT.parent)
    monkeypatch.chdir(above)
    monkeypatch.setattr(sys, "path", [above, *sys.path])
    mounted = sandbox._python_paths()
    assert any(os.path.realpath(sys.prefix).startswith(p) for p in mounted), mounted  # Python itself: yes
    for path in mounted:
        assert not str(sandbox.ROOT).startswith(path + os.sep), path
        assert path != os.path.realpath(above), path


@pytest.mark.skipif(batch.sandbox.probe() != "", reason="no sandbox here")
def test_a_course_installed_into_site_packages_shows_no_solution(tmp_path, monkeypatch):
    """A grader whose Python has the course installed (`pip install .`, not editable) binds its site-packages
    into every sandbox, and with it every lesson's solutions: the staged package stands in its place."""
    import subprocess

    from course_utils.grading import sandbox

    site = tmp_path / "site-packages"
    (site / "course_utils" / "lessons").mkdir(parents=True)
    (site / "course_utils" / "lessons" / "l02_first_kernels.py").write_text("SOLUTION = 1\n")
    python_paths = sandbox._python_paths
    monkeypatch.setattr(sandbox, "_python_paths", lambda: [*python_paths(), str(site)])
    course = sandbox.stage_package(tmp_path / "staged", 2)
    with open(os.devnull, "rb") as empty:
        cmd = sandbox.command(course, empty.fileno(), "nb.ipynb", gpu=False, limits=sandbox.Limits())
        cmd = [*cmd[:cmd.index("--")], "--", "/bin/ls", str(site / "course_utils" / "lessons")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, pass_fds=(empty.fileno(),))
    assert done.returncode == 0, done.stderr
    assert "l02_first_kernels.py" not in done.stdout and "l01_strides_and_intensity.py" in done.stdout, done.stdout


# --- the code scan (flags.py): the grader's channel reached past the flags -------------------------

@pytest.mark.parametrize("source, flag", [
    # a constant name given to getattr is the attribute itself: the channel in check's closure
    ('chan = [getattr(c, "cell_contents") for c in getattr(check, "__closure__")][0]', "frames"),
    ('hasattr(check, "__globals__")', "object internals"),
    ('setattr(triton.runtime.jit, "inspect", None)', "inspect (frames)"),
    ('from operator import attrgetter\nchan = attrgetter("__closure__")(check)', "frames"),
    # IPython's door to code from strings, however it is reached
    ("import IPython\nIPython.get_ipython().run_cell(text)", "IPython internals"),
    ("from IPython.core.interactiveshell import InteractiveShell\nInteractiveShell.instance().run_cell(t)",
     "IPython internals"),
    ("exit._ip.run_cell(text)", "IPython internals"),
    # code hidden in bytes: any module an honest notebook never imports, however it is reached
    ("import pickle, base64\npickle.loads(base64.b64decode(blob))", "imports pickle (code this scan cannot read)"),
    ("import marshal", "imports marshal"),
    ("from runpy import run_path", "imports runpy"),
    ("import code\ncode.InteractiveInterpreter().runsource(text)", "imports code"),
    ("import types", "imports types"),
    ("import io", "imports io"),
    ("torch.serialization.pickle.loads(blob)", "imports pickle"),
    ("random._os.system('true')", "imports os"),
    ("state = torch.load(path, weights_only=False)", "unpickling"),
    ("np.load(path, allow_pickle=True)", "unpickling"),
    ("len.__self__.exec(text)", "exec/eval"),
    ('pickle = __import__("pic" + "kle")', "exec/eval"),
    ("import typing\ntyping.get_type_hints(f)", "exec/eval"),  # f's annotations are strings: evaluated
    ("from functools import reduce\nchan = reduce(getattr, names, check)", "computed attribute names"),
    ('import string\nstring.Formatter().get_field("0.__closure__", (check,), {})', "computed attribute names"),
])
def test_the_grader_reached_past_the_old_flags_is_flagged(source, flag):
    """The red team's 3/3 on the unsolved notebook with no flag: getattr with constant names reached
    check's closure (only attribute syntax was judged); IPython.get_ipython().run_cell and pickle.loads ran
    code the scan never saw. Imports outside what an honest notebook needs are flagged for a human."""
    from course_utils.grading import flags

    found = flags.scan([source])
    assert any(f.startswith(flag) for f in found), found


def test_the_courses_own_notebooks_raise_no_flag():
    """The allowlist of imports is built from what the solutions and exercises import: none is flagged."""
    from course_utils.grading import flags

    for path in sorted([*(ROOT / "solutions").glob("*.ipynb"), *(ROOT / "exercises").glob("*.ipynb")]):
        nb = batch.read_notebook(path)
        lessons = sorted({key.split(".", 1)[0] for ids in batch.check_cells(nb).values() for key in ids})
        sources = [c.source if c.cell_type == "code" else "" for c in nb.cells]
        assert flags.scan(sources, batch.course_cells(lessons or ["[0-9][0-9]"])) == [], path.name


@pytest.mark.parametrize("source, flagged", [
    ('import os\nos.environ["TRITON_INTERPRET"] = "1"\nprint(os.cpu_count(), os.path.join("a", "b"))', []),
    ('from os import environ, getenv\nfrom os.path import join\nimport datetime', []),
    ("import os\nos.system('true')", ["process spawning (cell 1)", "imports os (code this scan cannot read) (cell 1)"]),
    ("import os\nos.open('/tmp/x', 0)", ["imports os (code this scan cannot read) (cell 1)"]),
    ("import os\nmodule = os\nmodule.write(4, b'x')", ["imports os (code this scan cannot read) (cell 1)"]),
    ("from os import environ, fdopen", ["raw file descriptors (cell 1)", "imports os (code this scan cannot read) (cell 1)"]),
], ids=["os.environ, os.path", "from os", "os.system", "os.open", "os passed on", "fdopen"])
def test_os_for_its_environment_and_paths_is_no_flag(source, flagged):
    """`import os; os.environ["TRITON_INTERPRET"] = "1"` (Triton's tutorials start so) was flagged "imports os
    (code this scan cannot read)" on an honest notebook: os used for its environment, paths and CPU count alone
    is none; any other use of it is flagged as before."""
    from course_utils.grading import flags

    assert flags.scan([source]) == flagged


@pytest.mark.parametrize("source", [
    'course_utils.grading.guard.HOST_OPS.update({"add", "clamp_min"})',
    'g = course_utils\ng.grading.harness.COPY_OPS',
    'getattr(course_utils, "grading")',
    'course_utils.__path__.append("/tmp")',
    "from course_utils import checks",
    "import course_utils.checks.l02_first_kernels",
])
def test_the_watchers_state_reached_from_a_course_name_is_flagged(source):
    from course_utils.grading import flags

    assert "the grader's modules (cell 1)" in flags.scan(["import course_utils\n" + source])


def test_the_watchers_rules_cannot_be_changed_in_place():
    """One `guard.HOST_OPS.update({"add", "clamp_min"})` before the answers had host arithmetic pass unflagged:
    the sandbox's Integrity compared the module's attributes by identity only. The rule tables are frozen;
    the mutable state Integrity guards is compared by contents too, and put back."""
    import course_utils
    from course_utils.grading import guard, harness, remote

    with pytest.raises(AttributeError):
        guard.HOST_OPS.update({"add"})
    with pytest.raises(AttributeError):
        harness.COPY_OPS.add("add")
    with pytest.raises(TypeError):
        harness.DEFAULT_HINTS["host"] = ""
    integrity = remote.Integrity()
    assert integrity.restore() == []
    path, names = list(course_utils.__path__), dict(guard.TORCH_NAMES)
    course_utils.__path__.append("/tmp")
    guard.TORCH_NAMES["add"] = "nothing"
    guard._watches.append(None)
    changed = integrity.restore()
    assert "course_utils.__path__ (its contents)" in changed, changed
    assert "course_utils.grading.guard._watches (its contents)" in changed, changed
    assert any(name.endswith("TORCH_NAMES (its contents)") for name in changed), changed
    assert (course_utils.__path__, guard.TORCH_NAMES, guard._watches) == (path, names, [])


def test_the_builtins_the_watcher_calls_cannot_be_replaced():
    """`globals()["__builtins__"].sorted = ...` (the scan reads the name as a string) made Watch.compute_ops()
    find no torch op: `out.copy_(x + y)` and an empty kernel passed 02.vector_add in the sandbox, unflagged.
    Integrity keeps every function and type of the builtins module, not four of them."""
    import builtins

    from course_utils.grading import remote

    integrity = remote.Integrity()
    assert integrity.restore() == []
    originals = builtins.sorted, builtins.any
    try:
        builtins.sorted, builtins.any = (lambda *a, **k: []), (lambda *a, **k: False)
        changed = integrity.restore()
    finally:
        builtins.sorted, builtins.any = originals
    assert {"builtins.sorted", "builtins.any"} <= set(changed), changed
    assert (builtins.sorted, builtins.any) == originals


def test_a_name_added_over_an_inherited_method_or_a_builtin_is_a_change():
    """`torch.Tensor.numpy = f` (no flag: torch is no course name) hid TensorBase's method, and Integrity
    compared only the names torch.Tensor had of its own: the sandbox sends each output back through
    raw.cpu().numpy(), where f wrote the host's answer after the checker's last look (a kernel that copied x
    passed 02.relu in a batch). A name added to a class over an inherited one, or to a module over a builtin
    (guard.sorted: the module's own code finds it first), is a change, and is taken away; a new name of its
    own (a submodule imported later) is none."""
    import json

    import torch

    from course_utils.grading import guard, remote

    integrity = remote.Integrity()
    assert integrity.restore() == []
    try:
        torch.Tensor.numpy = lambda self, *a, **k: None
        torch.UntypedStorage.data_ptr = lambda self: 0  # the sandbox matched outputs by their address
        guard.sorted = lambda *a, **k: []
        json.a_name_of_its_own = 1
        changed = integrity.restore()
    finally:
        for cls, name in ((torch.Tensor, "numpy"), (torch.UntypedStorage, "data_ptr")):
            if name in vars(cls):
                delattr(cls, name)
        vars(guard).pop("sorted", None)
        vars(json).pop("a_name_of_its_own", None)
    assert {"torch.Tensor.numpy (added)", "torch.UntypedStorage.data_ptr (added)",
            "course_utils.grading.guard.sorted (added)"} <= set(changed), changed
    assert not any("a_name_of_its_own" in name for name in changed), changed
    assert "numpy" not in vars(torch.Tensor) and "sorted" not in vars(guard)


def test_every_function_of_torch_and_numpy_is_kept():
    """The checker's rules on where a kernel stored read the byte tracker's map through torch.from_numpy:
    `torch.from_numpy = f` (no flag: torch is no course name) answering "stored nowhere" let a kernel that used
    its input x as a scratch pass 02.vector_add in a batch. Integrity keeps every function of torch and NumPy,
    but torch.manual_seed, which torch._dynamo rewraps when a notebook compiles."""
    import numpy as np

    from course_utils.grading import remote

    integrity = remote.Integrity()
    assert integrity.restore() == []
    originals = torch.from_numpy, np.full, torch.manual_seed
    try:
        torch.from_numpy, np.full = (lambda a: None), (lambda *a, **k: None)
        torch.manual_seed = lambda seed: None
        changed = integrity.restore()
    finally:
        torch.from_numpy, np.full, torch.manual_seed = originals
    assert {"torch.from_numpy", "numpy.full"} <= set(changed) and "torch.manual_seed" not in changed, changed


def test_the_rewrite_scan_is_bounded_for_every_escape_and_holds_no_lock(monkeypatch):
    """IPython rewrites `/f x`, `,f a b` and `;f a` lines one at a time, each rewrite reading the whole cell:
    3000 of them kept the grader's own process busy for a minute, holding the scan's lock (every other
    notebook's scan waited). Every escape counts toward flags.MAX_REWRITE_WORK, and the rewrite runs outside
    the lock."""
    from course_utils.grading import flags

    for line in ("/abs 1", ",f a b", ";f a", "?abs"):
        start = time.monotonic()
        found = flags.scan([f"{line}\n" * 3000 + "import gc"])
        assert time.monotonic() - start < 1.5, line
        assert found[0].startswith("a cell too big to scan") and "gc (cell 1)" in found, found
    held, rewrite = [], flags._python
    monkeypatch.setattr(flags, "_python", lambda text: held.append(flags._PARSING.locked()) or rewrite(text))
    flags.scan(["%time import gc"])
    assert held and not any(held), held


def test_check_calls_are_found_however_they_are_written():
    """`check ("02.vector_add", add)` (a space) and keywords were valid calls the regex missed: the notebook
    was "not graded". Calls are read with ast from the cell as IPython runs it; comments do not count."""
    source = ('check ("02.vector_add", add)\ncheck(exercise_id="02.relu", candidate=relu)\n'
              '# check("02.copy_2d", copy_2d)\nfor f in (a, b):\n    course_utils.check("02.copy_2d", f)\n'
              '%time check("02.relu", relu)')
    assert batch.check_ids(source) == ["02.vector_add", "02.relu", "02.copy_2d", "02.relu"]
    assert batch.check_ids('check ("03.matmul", mm\n') == ["03.matmul"], "a cell that does not parse"


# --- one sandbox at a time where sandboxes share a uid; shared memory ------------------------------

def test_a_grader_that_is_not_root_grades_one_notebook_at_a_time(tmp_path, monkeypatch, capsys):
    """Sandboxes of a grader that is not root all run as its uid, and RLIMIT_NPROC counts every process and
    thread of a uid: a notebook's threads starved the notebooks graded beside it (two honest solutions got
    0/3). Such a grader grades one sandbox at a time, and says why."""
    from course_utils.grading import sandbox

    for name in ("a", "b"):
        (tmp_path / f"{name}.ipynb").write_text(BROKEN)
    used, grade_all = [], batch._grade_all
    monkeypatch.setattr(batch, "_grade_all", lambda grader, found, jobs, log: used.append(jobs)
                        or grade_all(grader, found, jobs, log))
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    assert batch.main([str(tmp_path)], timeout=5, report=None, jobs=2) == 0
    assert used == [1]
    assert "WARNING: grading one notebook at a time (--jobs 2 asked)" in capsys.readouterr().err
    assert not sandbox.own_uids(True) and not sandbox.own_uids(False)
    monkeypatch.undo()
    if sandbox.probe() == "" and os.geteuid() == 0:  # a root grader: a uid per sandbox, in parallel
        assert sandbox.own_uids(True)
        monkeypatch.setattr(batch, "_grade_all", lambda grader, found, jobs, log: used.append(jobs)
                            or grade_all(grader, found, jobs, log))
        assert batch.main([str(tmp_path)], timeout=5, report=None, jobs=2) == 0
        assert used == [1, 2] and "one notebook at a time" not in capsys.readouterr().err


SHARED_MEMORY = """
import mmap
try:
    shared = mmap.mmap(-1, {size})  # shared memory: no process's data, so RLIMIT_DATA does not count it
    print("MAPPED")
except OSError as exc:
    raise MemoryError(f"shared memory refused: {{exc}}") from None
"""


@pytest.mark.skipif(not current().interpret, reason="RLIMIT_AS is set in CPU mode only (the CUDA driver "
                    "reserves far more address space than it uses)")
def test_checks_written_freely_are_graded_and_shared_memory_is_bounded(tmp_path):
    """Two sandboxes: the solution with its checks written `check ("02.vector_add", add)` and with keywords
    (once "no check cells: nothing to grade") gets 3/3; and shared memory of the whole address-space limit
    (mmap.mmap(-1, n): no limit counted it; only mapped, never touched) is refused in its sandbox."""
    from course_utils.grading import sandbox

    solution = _load("solutions")
    spaced = copy.deepcopy(solution)
    for old, new in (('check("02.vector_add", add)', 'check ("02.vector_add", add)'),
                     ('check("02.relu", relu)', 'check(exercise_id="02.relu", candidate=relu)')):
        at = _index(spaced, old)
        spaced["cells"][at]["source"] = "".join(spaced["cells"][at]["source"]).replace(old, new)
    (tmp_path / "spaced_checks.ipynb").write_text(json.dumps(spaced))
    limit = sandbox.cpu_address_space(sandbox.Limits().memory)
    hog, cell = _after_first_check(solution, SHARED_MEMORY.format(size=limit))
    (tmp_path / "shared_memory.ipynb").write_text(json.dumps(hog))
    found = {sub.name: sub for sub in batch.grade([tmp_path], timeout=TIMEOUT, jobs=2)}
    spaced_sub = found["spaced_checks.ipynb"]
    assert (spaced_sub.status, spaced_sub.score) == (batch.GRADED, "3/3"), spaced_sub
    hog_sub = found["shared_memory.ipynb"]
    assert hog_sub.score == "3/3", hog_sub
    assert f"cell {cell} raised MemoryError: shared memory refused" in hog_sub.notes, hog_sub
    assert "imports mmap" in " ".join(hog_sub.flags)


# --- code of the notebook's that runs inside the checker -------------------------------------------------

SHADOW = """
for name in ("colorsys", "cProfile", "pstats", "profile", "getpass", "termios"):
    with open(name + ".py", "w") as f:  # the sandbox's working folder, where the notebook lies
        f.write("import sys\\nvars(sys.modules['__main__'])['shadowed'] = True\\n")
"""
TRACED = """
import sys
solved = add
def add(x, y, out):  # the kernel (Triton imports what it imports lazily), then host arithmetic over its output
    solved(x, y, out)
    out.copy_(x + y)
def forget_host_problems(frame, event, arg):  # handed every frame of the checker's, and what each returns
    if event == "return" and type(arg).__name__ == "CallFacts":
        arg.host.clear()
    return forget_host_problems if event == "call" else None
sys.settrace(forget_host_problems)
"""
SIGNALLED = """
import signal
solved = copy_2d
def copy_2d(x, out):  # the kernel, then host arithmetic over its output
    solved(x, out)
    out.copy_(x * 1)
def forget_host_problems(number, frame):  # run by a timer, handed the frame it interrupted: the checker's
    while frame is not None:
        if type(frame.f_locals.get("facts")).__name__ == "CallFacts":
            frame.f_locals["facts"].host.clear()
        frame = frame.f_back
signal.signal(signal.SIGALRM, forget_host_problems)
signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
"""


def test_a_timer_of_the_notebooks_is_stopped_before_its_handler_is_put_back():
    """A SIGALRM handler and a 2 ms interval timer (SIGNALLED): the checker's look put the default handler back
    first and stopped the timer after, and a signal in between ended the sandbox ("kernel died", now and then,
    instead of the finding). Here with a timer of 100 microseconds, 3000 times over: as many signals near the
    look as 10 microseconds 300 times over, which left a process sharing a busy CPU no time between handlers."""
    script = (
        "import signal\n"
        "from course_utils.grading.remote import watch_hooks\n"
        "hooks = watch_hooks()\n"
        "for _ in range(3000):\n"
        "    signal.signal(signal.SIGALRM, lambda *a: None)\n"
        "    signal.setitimer(signal.ITIMER_REAL, 1e-4, 1e-4)\n"
        "    assert any('SIGALRM' in f for f in hooks())\n"
        "print('survived')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and "survived" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_the_notebooks_code_cannot_run_inside_the_checker(tmp_path):
    """Three doors into the sandbox's checker while it builds the facts it reports: a file written into the
    notebook's folder, which `python -m` had put first on sys.path (colorsys.py, imported by the checker's
    libraries during the first check, ran code the scan never read: unflagged); a trace function
    (sys.settrace) and a signal handler run by a timer, which see the checker's frames and emptied the host
    problems of its CallFacts: host torch passed 02.vector_add and 02.copy_2d."""
    nb = copy.deepcopy(_load("solutions"))
    nb["cells"].insert(_index(nb, 'check("02.vector_add"'), _code(SHADOW + TRACED))
    nb["cells"].insert(_index(nb, 'check("02.vector_add"') + 1, _code("sys.settrace(None)"))
    at = _index(nb, 'check("02.relu", relu)')
    nb["cells"][at] = _code('check("02.relu", None if "shadowed" in globals() else relu)')
    nb["cells"].insert(_index(nb, 'check("02.copy_2d"'), _code(SIGNALLED))
    (tmp_path / "inside.ipynb").write_text(json.dumps(nb))
    (sub,) = batch.grade([tmp_path], timeout=TIMEOUT)
    found = {name: (e.status, e.reason) for name, e in sub.exercises.items()}
    assert found["02.relu"] == (batch.PASS, ""), "the notebook's colorsys.py was imported"
    assert found["02.vector_add"][0] == batch.FAIL and "sys.settrace" in found["02.vector_add"][1], found
    assert found["02.copy_2d"][0] == batch.FAIL and "SIGALRM" in found["02.copy_2d"][1], found


def test_lesson_01s_views_of_65_dimensions_reach_the_sandbox(tmp_path):
    """01.transpose_view and 01.broadcast_view have a case of 65 dimensions (past NumPy's 64): a sandbox that
    refused tensors of more than 8 gave the course's own solution 1/5 ("the notebook broke the grading
    protocol"), every exercise after the first."""
    from course_utils.grading import remote

    t = torch.randn([2] + [1] * 62 + [3, 4]).transpose(0, 64)
    encoder = remote.Encoder()
    meta = encoder.encode(t)
    back = remote.Decoder.from_blobs(encoder.blobs(), "cpu").decode(meta)
    assert back.shape == t.shape and back.stride() == t.stride() and torch.equal(back, t)
    (tmp_path / "views.ipynb").write_text((ROOT / "solutions" / "01_strides_and_intensity.ipynb").read_text())
    (sub,) = batch.grade([tmp_path], timeout=TIMEOUT)
    assert (sub.passed, sub.total) == (5, 5), {name: v.reason for name, v in sub.exercises.items()}


BROADCASTS = {  # 01.broadcast_view answers that do not refuse a shape t cannot be broadcast to with ValueError
    "never_refuses": ("def broadcast_view(t, shape):\n    new = len(shape) - t.dim()\n"
                      "    strides = [0] * new + [t.stride(d) if t.shape[d] == shape[new + d] else 0 "
                      "for d in range(t.dim())]\n    return t.as_strided(tuple(shape), strides, t.storage_offset())\n",
                      "must be refused: raise ValueError"),
    "runtime_error": ("def broadcast_view(t, shape):\n    if len(shape) < t.dim() or any(a not in (1, b) for a, b in "
                      "zip(t.shape, shape[len(shape) - t.dim():])):\n        raise RuntimeError('as expand')\n"
                      "    return never_refuses(t, shape)\n",
                      "must be refused with ValueError; your function raised RuntimeError instead"),
}


def test_a_function_exercise_must_refuse_with_the_exception_asked_for_in_the_sandbox_too(tmp_path):
    """01.broadcast_view's shapes that t cannot take are refused with ValueError: the sandbox runs the call and
    says whether it raised that, another exception (as torch's expand raises RuntimeError), or nothing."""
    nb = json.loads((ROOT / "solutions" / "01_strides_and_intensity.ipynb").read_text())
    at = _index(nb, 'check("01.broadcast_view"')
    for name, (source, _) in BROADCASTS.items():
        answer = copy.deepcopy(nb)
        answer["cells"] = [c for c in nb["cells"][:at] if c["cell_type"] == "code"]
        answer["cells"] += [_code(BROADCASTS["never_refuses"][0].replace("broadcast_view", "never_refuses")),
                            _code(source), nb["cells"][at]]
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(answer))
    found = {sub.name: sub.exercises["01.broadcast_view"] for sub in batch.grade([tmp_path], timeout=TIMEOUT, jobs=2)}
    for name, (_, says) in BROADCASTS.items():
        assert found[f"{name}.ipynb"].status == batch.FAIL and says in found[f"{name}.ipynb"].reason, found


def test_a_broadcast_result_cannot_spend_the_graders_memory():
    """A function exercise's result is rebuilt in the grader from the bytes of its storage: a broadcast view
    (stride 0) of one element and 2^33 of them, 08.rmsnorm_train's output, which the grader clones, took 32 GiB
    of the grader's own memory for 4 bytes sent (the sandbox's limits bound the sandbox only; 2^28 elements
    measured +1.2 GiB). Neither side takes a broadcast result larger than its storage and remote.RESULT_MAX."""
    from course_utils.grading import remote

    big = torch.zeros(1).expand(remote.RESULT_MAX)  # 4 bytes an element: 4 x the limit
    with pytest.raises(TypeError, match="cannot send a broadcast tensor"):
        remote.Encoder(broadcast_max=remote.RESULT_MAX).encode(big)
    meta = {"t": "tensor", "s": 0, "dtype": "float32", "size": [1 << 33], "stride": [0], "offset": 0}
    with pytest.raises(remote.ProtocolError, match="a broadcast tensor of more elements than its storage"):
        remote.Decoder.from_blobs([bytes(4)], "cpu", broadcast_max=remote.RESULT_MAX).decode(meta)
    small = torch.zeros(1).expand(1823, 781)  # lesson 01's broadcasts, and any tensor its storage holds, pass
    sent = remote.Encoder(broadcast_max=remote.RESULT_MAX).encode(small)
    assert remote.Decoder.from_blobs([bytes(4)], "cpu", broadcast_max=remote.RESULT_MAX).decode(sent).shape == small.shape
    # the grader's own inputs are no result: a case's broadcast operand (a GPU's sizes) goes as it is
    assert remote.Decoder.from_blobs([bytes(4)], "cpu").decode(remote.Encoder().encode(big)).shape == big.shape


def test_a_sandbox_whose_python_never_started_says_why():
    """A notebook whose sandboxed Python could not start died with exit code 127 and no other word in the
    report; the line of setpriv or of the loader that says why is kept, as a Fatal Python error is."""
    for line in ("setpriv: failed to execute /opt/py/bin/python3: No such file or directory",
                 "/opt/py/bin/python3: error while loading shared libraries: libpython3.12.so.1.0: cannot open "
                 "shared object file: Permission denied"):
        assert batch._last_words(f"print from the notebook\n{line}\n") == line
    assert batch._last_words("a notebook's own words\n") == ""


def test_the_largest_call_a_gpu_check_sends_is_taken_by_the_sandbox(monkeypatch):
    """09.kv_append's last case on a GPU, (16, 8, 4100, 128) caches, sends a sandbox more bytes of inputs
    than a result may hold (RESULT_MAX): the sandbox refused the message and died, graded "kernel died". The
    case is built at its GPU size here (on the CPU) and encoded as the grader sends it."""
    from course_utils.checks import l09_decoding
    from course_utils.grading import REGISTRY, remote

    monkeypatch.setattr(l09_decoding, "size", lambda gpu, cpu: gpu)
    ex = REGISTRY["09.kv_append"]

    def nbytes(case) -> int:  # the largest case, wherever it stands among the cases
        return sum(a.untyped_storage().nbytes() for a in case.args if isinstance(a, torch.Tensor))

    case = max(ex.cases(torch.Generator().manual_seed(0)), key=nbytes)
    _, encoder, _, _ = batch.call_message(ex, case, remote.spec_of(ex), "cpu")
    sent = sum(len(blob) for blob in encoder.blobs())
    assert remote.RESULT_MAX < sent <= remote.ARGS_MAX


def test_an_output_that_overwrites_an_input_reaches_the_sandbox_as_one_tensor():
    """08.cross_entropy's in-place case passes one buffer as logits and as dlogits (Out.alias): encoded for the
    sandbox and decoded there, the two arguments must still share their memory."""
    from course_utils.grading import REGISTRY, remote

    ex = REGISTRY["08.cross_entropy"]
    cases = ex.cases(torch.Generator().manual_seed(0))
    case = next(c for c in cases if c.label.startswith("dlogits IS logits"))
    header, encoder, args, _ = batch.call_message(ex, case, remote.spec_of(ex), "cpu")
    assert args[0] is args[3]
    decoder = remote.Decoder.from_blobs(encoder.blobs(), "cpu")
    logits, _, _, dlogits = [decoder.decode(a, wrap_ok=True) for a in header["args"]]
    dlogits.fill_(0.5)
    assert logits.data_ptr() == dlogits.data_ptr() and bool((logits == 0.5).all())


NUMPY_ANSWERS = """
import numpy as np
def contiguous_strides(shape):
    return tuple(np.cumprod([1] + list(shape[:0:-1]))[::-1]) if len(shape) else ()
def matmul_intensity(M, N, K, bytes_per_element):
    return np.float32(2 * M * N * K) / np.float32((M * K + K * N + M * N) * bytes_per_element)
"""


def test_numpy_scalars_returned_are_judged_as_themselves_in_the_sandbox_too(tmp_path):
    """A tuple of np.int64 (np.cumprod) and an np.float32 could not leave the sandbox, and the grader judged a
    stand-in: "returned <a tuple>: expected a tuple of ints", which it is, without the advice. They are sent as
    NumPy scalars, and the message is the interactive check's."""
    nb = json.loads((ROOT / "solutions" / "01_strides_and_intensity.ipynb").read_text())
    nb["cells"].insert(_index(nb, 'check("01.contiguous_strides"'), _code(NUMPY_ANSWERS))
    nb["cells"].insert(_index(nb, 'check("01.matmul_intensity"'), _code(NUMPY_ANSWERS))
    (tmp_path / "numpy.ipynb").write_text(json.dumps(nb))
    (sub,) = batch.grade([tmp_path], timeout=120)
    strides, intensity = sub.exercises["01.contiguous_strides"], sub.exercises["01.matmul_intensity"]
    assert strides.status == intensity.status == batch.FAIL, sub
    assert "returned (np.int64(1),): expected a tuple of ints" in strides.detail, strides.detail
    assert "return Python ints (int(...) of each NumPy or torch integer)" in strides.detail
    assert re.search(r"returned np\.float32\([\d.]+\): expected a float", intensity.detail), intensity.detail


def test_the_limits_on_code_hold_for_an_nbformat_3_notebook(tmp_path):
    """An nbformat 3 notebook keeps its cells under "worksheets" (its "cells" may be empty): the limits measured
    the empty list, and nbformat's conversion handed the grader 4 MiB of code to parse (minutes, gigabytes)."""
    v3 = {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "cells": [],
          "worksheets": [{"cells": [{"cell_type": "code", "language": "python", "metadata": {}, "outputs": [],
                                     "input": "#" * (batch.CELL_CODE_MAX + 1)}], "metadata": {}}]}
    (tmp_path / "v3.ipynb").write_text(json.dumps(v3))
    with pytest.raises(batch.InvalidNotebook, match=r"cell 1 holds 262,145 characters of code, more than the limit"):
        batch.read_notebook(tmp_path / "v3.ipynb")


def test_a_submission_is_scored_on_one_lesson(tmp_path):
    """Lesson 02's stubs (0/3) with lesson 01's five function exercises appended scored 5/8, above an honest 2/3
    on lesson 02. A submission is scored on one lesson: the instructor's (`lesson`), or of those it checks the
    one most submissions of the run check (a run of one: the first it checks); the others are shown only."""
    nb = _load("exercises")
    extra = json.loads((ROOT / "solutions" / "01_strides_and_intensity.ipynb").read_text())
    nb["cells"] += [c for c in extra["cells"] if c["cell_type"] == "code" and "importlib.util" not in "".join(c["source"])]
    (tmp_path / "other_lesson.ipynb").write_text(json.dumps(nb))
    (sub,) = batch.grade([tmp_path], timeout=120)
    assert sum(v.status == batch.PASS for key, v in sub.exercises.items() if key.startswith("01.")) == 5, sub
    assert (sub.passed, sub.total) == (0, 3), sub
    assert sub.lesson == "02"
    assert "scored on lesson 02: exercises of lesson 01 not counted" in sub.notes
    # in a run of lesson 01 notebooks it counts as one of them; the instructor's lesson wins over both
    honest = batch.Submission("honest.ipynb", "", exercises={"01.transpose_view": batch.Verdict(batch.PASS)})
    batch.score_lessons([sub, honest, copy.deepcopy(honest)])
    assert (sub.lesson, sub.passed, sub.total) == ("01", 5, 5)
    batch.score_lessons([sub, honest], "2")
    assert (sub.lesson, sub.passed, sub.total, honest.total) == ("02", 0, 3, 0)


def test_the_grade_command_takes_the_lesson_to_score_on():
    from course_utils.__main__ import _lesson_number

    assert _lesson_number("2") == _lesson_number("02") == "02"
    with pytest.raises(argparse.ArgumentTypeError, match="no lesson '11'"):
        _lesson_number("11")


def test_a_linked_folder_in_the_folder_has_its_row(tmp_path):
    """Path.rglob does not descend into a linked folder: a student's folder linked from elsewhere had no row in
    the table or the reports, without a word. It is reported as a link, not graded, like a linked notebook."""
    (tmp_path / "uploads" / "alice").mkdir(parents=True)
    (tmp_path / "uploads" / "alice" / "alice.ipynb").write_text(BROKEN)
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "bob.ipynb").write_text(BROKEN)
    (tmp_path / "class" / "alice").symlink_to(tmp_path / "uploads" / "alice")
    found = {sub.name: sub for sub in batch.grade([tmp_path / "class"], timeout=5)}
    assert sorted(found) == ["alice", "bob.ipynb"]
    assert found["alice"].status == batch.INVALID
    assert found["alice"].notes.startswith("invalid notebook: a symbolic link to a folder ("), found["alice"].notes
