"""The checker itself: fresh inputs on every call and the seed that reproduces them, the failure's
fields and its kinds of hint, the clean message in a notebook, launch counting and fusion, strided
outputs, copies of the inputs, the frozen registry, speed lines, progress() and its lesson links.
Lesson 02's exercises and their wrong answers are in tests/test_02_first_kernels.py."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from course_utils.grading import REGISTRY, CandidateError, Case, CheckFailed, Exercise, Out, check, register
from course_utils.grading.guard import HOST_OPS, TORCH_NAMES, torch_name, watching
from course_utils.grading.inputs import f64, randn
from course_utils.grading.progress import Progress, progress
from course_utils.lessons.l02_first_kernels import add, copy_2d, relu
from course_utils.mode import current
from helpers import failure

ROOT = Path(__file__).resolve().parent.parent


@triton.jit
def zeros_kernel(out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.zeros((BLOCK,), dtype=tl.float32), mask=offsets < n_elements)


@triton.jit
def flat_copy_kernel(src_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)


def launch_1d(kernel, *args, n, BLOCK=1024):
    kernel[(triton.cdiv(n, BLOCK),)](*args, n, BLOCK=BLOCK)

# --- inputs: fresh on every call, reproduced by the seed ------------------------------------------

def _recorder(seen: list):
    def recording(x, y, out):
        seen.append(x)  # the checker's own tensor (a clone here would be host arithmetic)
        add(x, y, out)

    return recording


def test_two_calls_without_seed_draw_different_inputs():
    first, second = [], []
    check("02.vector_add", _recorder(first), quiet=True)
    check("02.vector_add", _recorder(second), quiet=True)
    assert [t.shape for t in first] == [t.shape for t in second]
    assert not any(torch.equal(a, b) for a, b in zip(first, second) if a.numel() > 1)


def test_the_seed_reproduces_the_inputs():
    first, second, other = [], [], []
    check("02.vector_add", _recorder(first), seed=1234, quiet=True)
    check("02.vector_add", _recorder(second), seed=1234, quiet=True)
    check("02.vector_add", _recorder(other), seed=1235, quiet=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


def test_a_failure_names_its_seed_and_how_to_reproduce_it():
    def zeros(x, y, out):
        launch_1d(zeros_kernel, out, n=out.numel())

    err = failure("02.vector_add", zeros, 'seed 77: reproduce with check("02.vector_add", add, seed=77)',
                  seed=77)
    assert (err.exercise, err.seed) == ("02.vector_add", 77)
    assert err.case.startswith("length 1, float32 [x=(1,) float32")
    assert err.problems and err.reason == err.problems[0].splitlines()[0]


def test_a_failure_without_seed_reports_the_one_it_drew():
    def zeros(x, y, out):
        launch_1d(zeros_kernel, out, n=out.numel())

    with pytest.raises(CheckFailed) as info:
        check("02.vector_add", zeros, quiet=True)
    seed = info.value.seed
    assert isinstance(seed, int) and f"seed={seed})" in str(info.value)


# --- the guard: launches, torch ops, messages -------------------------------------------------------

def test_torch_names_name_what_the_student_wrote_and_host_ops_compute_nothing():
    for op, name in TORCH_NAMES.items():
        assert torch_name(op) == f"{name} (aten.{op})"
        assert op not in HOST_OPS, f"{op} computes or copies, it cannot be a host op"
    assert torch_name("no_such_op_yet") == "aten.no_such_op_yet"
    x, y = torch.randn(8), torch.randn(8)
    with watching() as watch:  # every host op a kernel exercise may use, on real tensors
        buf = torch.empty_like(x)
        view = buf.view(2, 4).t().unsqueeze(0).expand(3, 4, 2)
        buf.zero_()
    assert set(watch.torch_ops) <= HOST_OPS and watch.compute_ops() == [], watch.torch_ops
    assert view.shape == (3, 4, 2)
    with watching() as watch:
        z = x + y * 2  # noqa: F841
    assert watch.compute_ops() == ["add", "mul"]


def test_matmul_on_the_host_is_named_with_its_line():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with watching() as watch:
        c = a @ b  # noqa: F841
        torch.empty_like(a)
    assert watch.compute_ops() == ["mm"]
    assert watch.describe_ops(["mm"]).startswith("torch.matmul / @ (aten.mm) at `c = a @ b  # noqa: F841` (")
    assert not watch.launches


@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n_elements"])
@triton.jit
def autotuned_scale_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)


def test_an_autotuned_kernel_counts_as_one_launch(monkeypatch):
    runs = []

    def bench_once(kernel_call, quantiles):  # the interpreter has no benchmarker: run each config once
        runs.append(1)
        kernel_call()
        return [1.0, 1.0, 1.0]

    autotuned_scale_kernel.__dict__.pop("do_bench", None)  # a cached_property: drop any cached benchmarker
    monkeypatch.setattr(autotuned_scale_kernel, "_do_bench", bench_once)
    x = torch.randn(100, device=current().device)
    out = torch.empty_like(x)
    try:
        with watching() as watch:
            autotuned_scale_kernel[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100)
    finally:
        autotuned_scale_kernel.__dict__.pop("do_bench", None)
    assert len(runs) == 2, "both configs were tried"
    assert watch.launches == ["autotuned_scale_kernel"]
    assert watch.compute_ops() == []
    assert torch.equal(out, 2 * x)


@pytest.fixture
def scratch_exercises():
    """Register exercises for one test and remove them afterwards."""
    added = []

    def add_exercise(ex: Exercise) -> Exercise:
        added.append(ex.id)
        return register(ex)

    yield add_exercise
    for key in added:
        REGISTRY.pop(key, None)


def _double_cases(gen):
    for n in (1, 300):
        x = randn(n, gen=gen)
        yield Case(f"n={n}", (x, Out("out", (n,), torch.float32)), {"out": 2 * f64(x)}, 1e-6, 1e-6)


def test_max_launches_asks_for_one_kernel(scratch_exercises):
    scratch_exercises(Exercise("99.double", "double in one kernel", "double(x, out)", _double_cases,
                               max_launches=1))

    def one_kernel(x, out):
        launch_1d(scale_kernel, x, out, n=x.numel())

    def two_kernels(x, out):
        tmp = torch.empty_like(out)
        launch_1d(flat_copy_kernel, x, tmp, n=x.numel())
        launch_1d(scale_kernel, tmp, out, n=x.numel())

    check("99.double", one_kernel, seed=0, quiet=True)
    err = failure("99.double", two_kernels, "launched 2 kernels (flat_copy_kernel, scale_kernel)",
                  "this exercise asks for one kernel")
    assert err.reason.startswith("launched 2 kernels")


def test_max_launches_unset_allows_several(scratch_exercises):
    scratch_exercises(Exercise("99.double_any", "double", "double(x, out)", _double_cases))

    def two_kernels(x, out):
        tmp = torch.empty_like(out)
        launch_1d(flat_copy_kernel, x, tmp, n=x.numel())
        launch_1d(scale_kernel, tmp, out, n=x.numel())

    check("99.double_any", two_kernels, seed=0, quiet=True)


def test_allowed_ops_lets_an_exercise_permit_host_arithmetic(scratch_exercises):
    scratch_exercises(Exercise("99.double_mul", "double", "double(x, out)", _double_cases,
                               allowed_ops=("mul", "copy_")))

    def host_mul_then_copy(x, out):
        tmp = torch.empty_like(out)
        launch_1d(flat_copy_kernel, x, tmp, n=x.numel())
        out.copy_(tmp * 2)  # after the last launch, but with ops the exercise allows

    check("99.double_mul", host_mul_then_copy, seed=0, quiet=True)


def _transpose_cases(gen):
    t = torch.randn(3, 5, generator=gen)

    def verify(got, case):
        return [] if torch.equal(got, case.args[0].t()) else ["wrong"]

    yield Case("3 x 5", (t,), None, verify=verify)


def test_function_exercise_forbidden_op_is_named(scratch_exercises):
    scratch_exercises(Exercise("99.transpose", "transpose", "transpose(t)", _transpose_cases, kernel=False,
                               forbidden_ops=("transpose", "t")))
    failure("99.transpose", lambda t: t.t(), "uses aten.t, which this exercise asks you to do yourself")
    check("99.transpose", lambda t: t.as_strided((5, 3), (1, 5)), seed=0, quiet=True)


# --- progress(): the last cell of an exercise notebook --------------------------------------------

def test_progress_all_solved(capsys):
    status = progress("02", {"add": add, "relu": relu, "copy_2d": copy_2d})
    assert isinstance(status, Progress) and isinstance(status, dict)
    assert status == {"02.vector_add": "pass", "02.relu": "pass", "02.copy_2d": "pass"}
    assert list(status) == ["02.vector_add", "02.relu", "02.copy_2d"]  # notebook order
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "3/3 exercises of lesson 02 pass"
    assert out.splitlines()[0].split() == ["02.vector_add", "pass"]


def test_progress_reports_fail_with_the_reason_and_not_run_yet(capsys):
    def relu_stub(x, out, BLOCK=1024):
        raise NotImplementedError("relu: not written yet")

    status = progress("02", {"add": add, "relu": relu_stub})
    assert status == {"02.vector_add": "pass",
                      "02.relu": "fail: raised NotImplementedError: relu: not written yet",
                      "02.copy_2d": "not run yet: run the cells above"}
    assert status.passed == 1
    out = capsys.readouterr().out
    assert "1/3 exercises of lesson 02 pass" in out
    copy_line = next(line for line in out.splitlines() if line.startswith("02.copy_2d"))
    assert "(lesson: ../notebooks/02_first_kernels.ipynb" in copy_line


def test_lesson_link_finds_the_heading_that_names_the_exercise(tmp_path, monkeypatch):
    import course_utils.grading.progress as progress_module

    (tmp_path / "02_first_kernels.py").write_text(
        "# %% [markdown]\n# ## 1. Kernels\n# text that names 02.relu is no heading\n"
        "# %% [markdown]\n# ## 02.relu: `relu(x, out)` of any shape\n")
    monkeypatch.setattr(progress_module, "SOURCES", tmp_path)
    progress_module.lesson_link.cache_clear()
    try:
        assert progress_module.lesson_link("02.relu") == "../notebooks/02_first_kernels.ipynb#02.relu:-relu(x,-out)-of-any-shape"
        assert progress_module.lesson_link("02.copy_2d") == "../notebooks/02_first_kernels.ipynb"
        assert progress_module.lesson_link("99.nothing") is None
    finally:
        progress_module.lesson_link.cache_clear()


def test_every_exercise_links_to_its_lesson_notebook():
    from course_utils.grading import exercises
    from course_utils.grading.progress import lesson_link

    for ex in exercises():
        link = lesson_link(ex.id)
        if link is not None:
            assert (ROOT / "exercises" / link).resolve().with_suffix(".ipynb").relative_to(ROOT), link
            assert (ROOT / "exercises" / link.split("#")[0]).resolve().exists(), link


def test_progress_reports_a_checker_error_and_goes_on(monkeypatch, capsys):
    import course_utils.grading.progress as progress_module

    def broken_check(exercise_id, candidate, **kwargs):
        if exercise_id == "02.relu":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(progress_module, "check", broken_check)
    status = progress("02", {"add": add, "relu": relu, "copy_2d": copy_2d})
    assert status["02.relu"] == "error: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert status["02.copy_2d"] == "pass"


def test_every_exercise_notebook_ends_with_its_progress_cell():
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        lesson = path.name[:2]
        assert "".join(cells[-1]["source"]) == f'progress("{lesson}", globals())', path.name
