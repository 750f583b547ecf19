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
from triton.language.extra import libdevice

from course_utils.grading import REGISTRY, Case, CheckFailed, Exercise, Out, check, register
from course_utils.grading.guard import HOST_OPS, TORCH_NAMES, torch_name, watching
from course_utils.grading.inputs import f64, randn
from course_utils.grading.progress import Progress, progress
from course_utils.lessons.l02_first_kernels import add, copy_2d, relu
from course_utils.mode import current
from helpers import (failure, flat_copy_kernel, interpreter_only_because, launch_1d, run_from_file, scale_kernel,
                     zeros_kernel)

ROOT = Path(__file__).resolve().parent.parent


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


def test_a_notebook_that_seeds_python_random_still_gets_fresh_inputs():
    """random.seed(0) in a notebook (for its own demo, or to know the check's inputs before it draws them)
    leaves the checks' seeds alone: they come from the OS, not from the notebook's random module."""
    import random

    seeds = []
    for _ in range(2):
        random.seed(0)
        with pytest.raises(CheckFailed) as info:
            check("02.vector_add", lambda x, y, out: None, quiet=True)
        seeds.append(info.value.seed)
    assert seeds[0] != seeds[1]


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


def test_a_launch_records_which_of_its_tensors_are_inputs_of_the_call():
    device = current().device
    x, other = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
    out = torch.empty(32, device=device)
    with watching(inputs=[x]) as watch:
        autotuned_scale_kernel.fn[(1,)](x[:, 2:], out, 24, BLOCK=32)  # a view of the input
        autotuned_scale_kernel.fn[(1,)](other, out, 24, BLOCK=32)
    assert [launch.inputs for launch in watch.launched] == [(True, False), (False, False)]
    assert watch.launched[0].shapes == ((4, 6), (32,))


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
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["02.vector_add", "pass"]
    summary = lines.index("3/3 exercises of lesson 02 pass")
    # on a GPU the table is followed by each passing exercise's speed there ("02.relu: speed on ...")
    speeds = [line.split(": speed on ")[0] for line in lines[summary + 1:]]
    assert speeds == (list(status) if current().gpu else [])


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


NOTEBOOK_ADD = """
import torch
import triton
import triton.language as tl

BLOCK = 256


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add(x, y, out):
    launch(x, y, out)
    return out


def launch(x, y, out):
    add_kernel[(triton.cdiv(out.numel(), BLOCK),)](x, y, out, out.numel(), BLOCK=BLOCK)
"""


def _notebook(name: str, source: str = NOTEBOOK_ADD) -> dict:
    """A notebook's globals: `source` run as a module of its own file."""
    return run_from_file(source, name)


def _checks_run(monkeypatch) -> list[str]:
    import course_utils.grading.progress as progress_module

    ran = []
    monkeypatch.setattr(progress_module, "check", lambda exercise_id, candidate, **kw: (
        ran.append(exercise_id), check(exercise_id, candidate, **kw))[1])
    return ran


def test_progress_keeps_a_pass_of_this_session_for_an_unchanged_function(monkeypatch, capsys):
    """A notebook ends with progress(...) after checking each exercise above: the same function, reaching
    the same kernel and helpers, is not checked a second time (tens of seconds in the interpreter)."""
    ran = _checks_run(monkeypatch)
    nb = _notebook("nb_kept")
    check("02.vector_add", nb["add"], seed=1, quiet=True)
    status = progress("02", {"add": nb["add"]})
    assert status["02.vector_add"] == "pass" and status.kept == 1 and ran == []
    assert "1 of them as checked above, unchanged since" in capsys.readouterr().out
    status = progress("02", {"add": nb["add"]}, recheck=True)
    assert status["02.vector_add"] == "pass" and status.kept == 0 and ran == ["02.vector_add"]


@pytest.mark.parametrize("change", ["kernel", "helper", "constant", "function"])
def test_progress_checks_again_what_changed_since_the_pass(monkeypatch, change):
    """A cell run again after the check (a kernel, a helper the function calls, a constant it reads, or the
    function itself) makes new objects: the pass no longer applies and progress runs the check."""
    ran = _checks_run(monkeypatch)
    nb = _notebook(f"nb_{change}")
    check("02.vector_add", nb["add"], seed=1, quiet=True)
    edits = {"kernel": "tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask)",
             "helper": "add_kernel[(triton.cdiv(out.numel(), BLOCK),)]", "constant": "BLOCK = 256",
             "function": "    launch(x, y, out)\n"}
    wrong = {"kernel": "tl.load(x_ptr + offs, mask=mask) - tl.load(y_ptr + offs, mask=mask)",
             "helper": "add_kernel[(1,)]", "constant": "BLOCK = 128",
             "function": "    launch(x, x, out)\n"}
    again = _notebook(f"nb_{change}_again", NOTEBOOK_ADD.replace(edits[change], wrong[change]))
    names = {"kernel": ["add_kernel"], "helper": ["launch"], "constant": ["BLOCK"], "function": ["add"]}[change]
    for name in names:
        nb[name] = again[name]
    status = progress("02", {"add": nb["add"]})
    assert ran == ["02.vector_add"] and status.kept == 0
    assert status["02.vector_add"] == ("pass" if change == "constant" else status["02.vector_add"])
    if change != "constant":
        assert status["02.vector_add"].startswith("fail: "), status


def test_a_failed_check_forgets_the_earlier_pass(monkeypatch):
    ran = _checks_run(monkeypatch)
    nb = _notebook("nb_forget")
    check("02.vector_add", nb["add"], seed=1, quiet=True)
    with pytest.raises(CheckFailed):
        check("02.vector_add", lambda x, y, out: out.zero_() and None, seed=1, quiet=True)
    progress("02", {"add": nb["add"]})
    assert ran == ["02.vector_add"]


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


# --- the contract: frozen exercises, copies, zero cases, clean messages, fusion, strided outputs -----

def test_an_exercise_cannot_be_changed_by_the_code_it_checks():
    import dataclasses

    ex = REGISTRY["02.vector_add"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ex.cases = lambda gen: iter(())
    with pytest.raises(TypeError):
        ex.hint["wrong"] = "anything"
    with pytest.raises(ValueError, match="cannot be replaced"):
        REGISTRY["02.vector_add"] = dataclasses.replace(ex, cases=lambda gen: iter(()))


def test_an_exercise_without_cases_refuses_to_pass(scratch_exercises):
    scratch_exercises(Exercise("99.empty", "nothing", "double(x, out)", lambda gen: iter(())))
    failure("99.empty", lambda x, out: None, "99.empty has no cases: nothing was checked, so it cannot pass")


def test_a_failure_shows_as_its_message_alone_in_a_notebook():
    def raises(x, out):
        raise ValueError("my bug")

    err = failure("02.relu", raises)
    lines = err._render_traceback_()
    assert "CandidateError" in lines[0] and "02.relu failed" in lines[0]
    text = "\n".join(lines)
    assert 'raise ValueError("my bug")' in text and "ValueError: my bug" in text
    assert "grading/" not in text and "course_utils/__init__.py" not in text


def _double_case_padded(gen):
    x = randn((5, 7), gen=gen)
    yield Case("5 x 7, out padded", (x, Out("out", (5, 7), torch.float32, "padded")), {"out": 2 * f64(x)})


def test_a_padded_output_catches_hard_coded_strides(scratch_exercises):
    scratch_exercises(Exercise("99.double_2d", "double", "double(x, out)", _double_case_padded))

    def contiguous_out(x, out):
        launch_1d(scale_kernel, x, out, n=x.numel())  # out as if its strides were (7, 1)

    failure("99.double_2d", contiguous_out, "written between its rows", "strides (12, 1)",
            "hint: mask every tl.load and tl.store")


def test_the_candidate_gets_copies_of_the_inputs(scratch_exercises):
    given = []

    def cases(gen):
        x = randn(300, gen=gen)
        given.append((x, x.clone()))
        yield Case("n=300", (x, Out("out", (300,), torch.float32)), {"out": 2 * f64(x)}, 1e-6, 1e-6)

    scratch_exercises(Exercise("99.double_copy", "double", "double(x, out)", cases))
    seen = []

    def into_x(x, out):
        seen.append(x)
        launch_1d(scale_kernel, x, x, n=x.numel())  # writes into its input
        launch_1d(flat_copy_kernel, x, out, n=x.numel())

    failure("99.double_copy", into_x, "your function modified its input `x`")
    case_x, drawn = given[0]
    assert seen[0].data_ptr() != case_x.data_ptr()
    assert torch.equal(case_x, drawn), "the case's own tensor is untouched"


def _mlp_like_cases(gen):
    x = randn((8, 16), gen=gen)
    yield Case("8 x 16", (x, Out("out", (8, 16), torch.float32)), {"out": 4 * f64(x)}, 1e-6, 1e-6)


def test_a_fused_exercise_refuses_an_intermediate_in_memory(scratch_exercises):
    from course_utils.grading.harness import Fusion

    scratch_exercises(Exercise(
        "99.quadruple", "4x in one kernel", "quadruple(x, out)", _mlp_like_cases,
        fusion=Fusion("both doublings happen in registers", lambda case: (128, "2x (8 x 16)"))))

    def unfused(x, out):
        tmp = torch.empty_like(out)
        launch_1d(scale_kernel, x, tmp, n=x.numel())
        launch_1d(scale_kernel, tmp, out, n=x.numel())

    err = failure("99.quadruple", unfused, "launched 2 kernels on the activations (scale_kernel, scale_kernel)",
                  "allocated a (8, 16) float32 temporary at `tmp = torch.empty_like(out)`",
                  "the size of 2x (8 x 16). Fused means", "both doublings happen in registers")
    assert err.reason.startswith("launched 2 kernels")


@interpreter_only_because("the interpreter's NumPy warnings")
def test_the_interpreters_numpy_warnings_are_silenced(scratch_exercises):
    @triton.jit
    def inf_minus_inf_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask, other=float("-inf"))
        junk = x - x  # -inf - -inf in the masked lanes: NaN, and a NumPy warning
        tl.store(out_ptr + offsets, tl.where(mask, 2 * x, junk), mask=mask)

    scratch_exercises(Exercise("99.double_warn", "double", "double(x, out)", _double_cases))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        check("99.double_warn", lambda x, out: launch_1d(inf_minus_inf_kernel, x, out, n=x.numel()), seed=0,
              quiet=True)


def test_speed_line_says_rate_fraction_and_the_courses_solution():
    from course_utils.grading.harness import Speed, format_speed
    from course_utils.roofline import Ceilings, Cost

    ceilings = Ceilings("H100", copy_gbps=3000.0, matmul_tflops={"fp32": 60.0, "bf16": 800.0})
    memory = Speed(lambda: (), lambda args: None, "m:f", "n = 2^26, fp32")
    cost = Cost(2**26, 12 * 2**26)  # vector add: 805 MB moved
    line, point, solution = format_speed(memory, cost, cost.n_bytes / 2400e9, cost.n_bytes / 2700e9, ceilings)
    assert line == ("speed on n = 2^26, fp32: 2,400 GB/s, 80% of this GPU's measured 3,000 GB/s copy "
                    "bandwidth (memory-bound); the course's solution: 2,700 GB/s (90%)")
    assert point.intensity == cost.intensity and point.fraction(ceilings) == pytest.approx(0.8)
    assert solution.fraction(ceilings) == pytest.approx(0.9) and solution.tflops > point.tflops
    compute = Speed(lambda: (), lambda args: None, "m:f", "4096^3 bf16", roof="bf16")
    cost = Cost(2 * 4096**3, 3 * 4096**2 * 2)
    line, point, solution = format_speed(compute, cost, cost.flops / 600e12, None, ceilings)
    assert line == ("speed on 4096^3 bf16: 600.0 TFLOP/s, 75% of this GPU's measured 800 TFLOP/s bf16 matmul "
                    "rate (compute-bound)")
    assert solution is None and point.roof == "bf16"


def test_speed_line_uses_a_stand_in_roof_the_gpu_lacks():
    """fp8 work on a GPU whose ceilings hold no fp8 roof: twice the bf16 rate, said so; bf16 work on a
    GPU without bf16 (its inputs are fp16): the fp16 rate; never the CUDA cores' roof."""
    from course_utils.grading.harness import Speed, format_speed
    from course_utils.roofline import Ceilings, Cost

    h100 = Ceilings("H100", copy_gbps=3000.0, matmul_tflops={"fp32": 60.0, "bf16": 700.0, "tf32": 350.0})
    fp8 = Speed(lambda: (), lambda args: None, "m:f", "4096^3 e4m3", roof="fp8")
    cost = Cost(2 * 4096**3, 4 * 4096**2)
    line, point, _ = format_speed(fp8, cost, cost.flops / 700e12, None, h100)
    assert "50% of this GPU's measured 1,400 TFLOP/s fp8 matmul rate (2 x the measured bf16 rate)" in line
    assert "compute-bound" in line and "fp8" not in h100.matmul_tflops  # the caller's ceilings unchanged
    t4 = Ceilings("T4", copy_gbps=250.0, matmul_tflops={"fp32": 8.0, "fp16": 40.0})
    bf16 = Speed(lambda: (), lambda args: None, "m:f", "4096^3, fp16", roof="bf16")
    cost = Cost(2 * 4096**3, 3 * 4096**2 * 2)
    line, _, _ = format_speed(bf16, cost, cost.flops / 20e12, None, t4)
    assert "50% of this GPU's measured 40 TFLOP/s fp16 matmul rate (compute-bound)" in line


def test_each_exercise_is_timed_as_memory_or_compute_bound_as_it_is(monkeypatch):
    """On the committed H200 ceilings, each exercise's speed cost lands on the right side of its roof's
    ridge: matmuls, fused MLPs and attention compute-bound, the rest memory-bound (no tensor is made)."""
    import importlib

    from course_utils.grading import exercises
    from course_utils.grading.harness import _roof
    from course_utils.roofline import reference_ceilings

    def randn(shape, dtype=torch.float32, *args, **kwargs):
        return torch.empty(shape, dtype=dtype, device="meta")

    def uniform(shape, low, high, dtype=torch.float32, *args, **kwargs):
        return torch.empty(shape, dtype=dtype, device="meta")

    for name in ("l02_first_kernels", "l03_matmul", "l04_fusion", "l05_online_softmax", "l06_fused_rmsnorm_mlp",
                 "l07_fp8_quantization"):
        module = importlib.import_module(f"course_utils.checks.{name}")
        for fake in (randn, uniform):
            if hasattr(module, fake.__name__):
                monkeypatch.setattr(module, fake.__name__, fake)
    compute = {"03.matmul", "03.linear_relu", "05.attention", "06.gate_up_silu", "06.rmsnorm_mlp",
               "07.fp8_matmul"}
    timed = [ex for ex in exercises() if ex.speed is not None and ex.id[:2] <= "07"]
    assert {ex.id for ex in timed} >= compute | {"02.vector_add", "02.relu", "02.copy_2d", "04.sin4",
                                                 "04.silu_mul", "05.softmax", "06.rmsnorm", "07.quantize_rowwise"}
    for ex in timed:
        ceilings, roof, _ = _roof(ex.speed, reference_ceilings())
        cost = ex.speed.cost(ex.speed.args())
        assert cost.flops > 0 and cost.n_bytes > 0, ex.id
        bound = ceilings.bound(cost.intensity, roof or min(ceilings.matmul_tflops, key=ceilings.matmul_tflops.get))
        assert bound == ("compute" if ex.id in compute else "memory"), (ex.id, cost.intensity)


def test_speed_line_times_candidate_and_solution_and_progress_places_both(monkeypatch, scratch_exercises):
    """speed_line with a mocked timer and ceilings: the line, both points recorded; progress's roofline
    plots the student's point and the course's beside it."""
    from course_utils.grading import harness
    from course_utils.grading import progress as progress_module
    from course_utils.grading.harness import Speed
    from course_utils.roofline import Ceilings, Cost

    n = 1 << 10
    solution = "course_utils.lessons.l02_first_kernels:add"
    speed = Speed(lambda: (torch.ones(n), torch.ones(n), Out("out", (n,), torch.float32)),
                  lambda args: Cost(n, 12 * n), solution, "n = 1024, fp32")
    scratch_exercises(Exercise("99.timed_add", "add", "add(x, y, out)", _double_cases, speed=speed))
    ceilings = Ceilings("fake", copy_gbps=1000.0, matmul_tflops={"fp32": 50.0, "bf16": 500.0})
    monkeypatch.setattr("course_utils.roofline.device_ceilings", lambda: ceilings)

    def student(x, y, out):
        out.copy_(x + y)

    monkeypatch.setattr(harness, "_seconds", lambda fn, args: 12 * n / (500e9 if fn is student else 800e9))
    line = harness.speed_line(REGISTRY["99.timed_add"], student)
    assert line == ("speed on n = 1024, fp32: 500 GB/s, 50% of this GPU's measured 1,000 GB/s copy bandwidth "
                    "(memory-bound); the course's solution: 800 GB/s (80%)")
    assert harness.MEASURED["99.timed_add"].label == "99.timed_add"
    assert harness.SOLUTION_MEASURED["99.timed_add"].label == "99.timed_add (course)"
    placed = []
    monkeypatch.setattr("course_utils.roofline.plot_roofline", lambda c, points, **kw: placed.extend(points))
    monkeypatch.setattr(progress_module, "REGISTRY", {"99.timed_add": REGISTRY["99.timed_add"]})
    points = progress_module._roofline("99", Progress({"99.timed_add": "pass"}), {"add": student})
    assert [p.label for p in placed] == [p.label for p in points] == ["99.timed_add", "99.timed_add (course)"]
    assert placed[0].tflops == pytest.approx(n / (12 * n / 500e9) / 1e12)


@triton.jit
def _sum_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def _add_cases(gen):
    for n in (1, 300):
        x, y = randn(n, gen=gen), randn(n, gen=gen)
        yield Case(f"n={n}", (x, y, Out("out", (n,), torch.float32)), {"out": f64(x) + f64(y)}, 1e-6, 1e-6)


@interpreter_only_because("a stand-in GPU over the interpreter; a real one runs test_03's large-problem case")
def test_on_a_gpu_the_speed_size_is_a_case_judged_against_the_courses_solution(monkeypatch, scratch_exercises):
    """A kernel right on the small cases and wrong at the size the speed line times (a path it takes only
    on large problems) fails on a GPU, on the last case; the interpreter never runs that size. The
    case's inputs follow from the seed and leave torch's own random stream where it was."""
    from course_utils.grading import harness
    from course_utils.grading.harness import Speed, speed_case
    from course_utils.mode import Mode

    n = 3000
    speed = Speed(lambda: (randn(n), randn(n), Out("out", (n,), torch.float32)), lambda args: None,
                  "course_utils.lessons.l02_first_kernels:add", "n = 3000, fp32")
    ex = scratch_exercises(Exercise("99.large_add", "add", "add(x, y, out)", _add_cases, speed=speed))

    def right(x, y, out):
        launch_1d(_sum_kernel, x, y, out, n=x.numel())

    def small_only(x, y, out):  # past 1000 elements it adds x to itself
        launch_1d(_sum_kernel, x, x if x.numel() > 1000 else y, out, n=x.numel())

    check("99.large_add", small_only, quiet=True)  # the interpreter: two small cases
    state = torch.get_rng_state()
    first, again = speed_case(ex, 5), speed_case(ex, 5)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(first.args[0], again.args[0]) and not torch.equal(first.args[0], speed_case(ex, 6).args[0])
    assert torch.equal(first.expected["out"], f64(first.args[0] + first.args[1]))
    assert (first.rtol, first.atol) == (1e-4, pytest.approx(1e-4 * float(first.expected["out"].square().mean().sqrt())))

    monkeypatch.setattr(harness, "current", lambda: Mode("gpu", "cpu", "a stand-in GPU"))
    check("99.large_add", right, seed=5, quiet=True)
    failed = failure("99.large_add", small_only, "failed on case 3/3: the speed line's size, n = 3000, fp32 (GPU "
                     "only), against the course's solution", "a path your kernel takes only on a large problem",
                     "elements differ beyond", seed=5)
    assert failed.problems and "`out`" in failed.problems[0]


def test_speed_line_never_fails_a_check():
    from course_utils.grading import harness
    from course_utils.grading.harness import Speed

    def broken():
        raise RuntimeError("no GPU here")

    ex = Exercise("99.speed", "x", "double(x, out)", _double_cases,
                  speed=Speed(broken, lambda args: None, "m:f", "size"))
    assert harness.speed_line(ex, lambda x, out: None) == "speed: not measured (RuntimeError: no GPU here)"
    assert "99.speed" not in harness.MEASURED


def test_every_exercise_of_lessons_01_to_07_has_a_hint_for_each_kind_of_failure_it_can_have():
    """Kernel exercises: their own hint for wrong values, unwritten elements, out-of-bounds addresses, NaN
    and host-side computation (and launches / fusion where they count them), each its own text; function
    exercises: their own hint for wrong values."""
    from course_utils.grading import exercises

    for ex in exercises():
        if ex.id[:2] > "07":
            continue
        kinds = {"wrong"}
        if ex.kernel:
            kinds |= {"unwritten", "out_of_bounds", "nan", "host"}
            if ex.max_launches is not None or ex.fusion is not None:
                kinds.add("launches")
        missing = kinds - set(ex.hint)
        assert not missing, f"{ex.id} has no hint of its own for {sorted(missing)}"
        texts = [ex.hint[k] for k in kinds]
        assert len(set(texts)) == len(texts), f"{ex.id}: two kinds share one hint"


@triton.jit
def scale_via_fp16_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    y = (2 * tl.load(x_ptr + offsets, mask=mask)).to(tl.float16)  # a 16-bit intermediate
    tl.store(out_ptr + offsets, y, mask=mask)


def test_an_fp32_output_rounded_to_16_bits_on_the_way_is_named(scratch_exercises):
    scratch_exercises(Exercise("99.double16", "double", "double(x, out)", _double_cases))
    failure("99.double16", lambda x, out: launch_1d(scale_via_fp16_kernel, x, out, n=x.numel()),
            "every differing value of `out` is an fp16 number", "keep fp32 until the store")
    error = failure("99.double16", lambda x, out: launch_1d(zeros_kernel, out, n=x.numel()), "differ")
    assert "fp16 number" not in str(error) and "bf16 number" not in str(error)


@triton.jit
def sum_without_other_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    total = tl.sum(tl.load(x_ptr + offsets, mask=offsets < n_elements), axis=0)  # no other=: undefined lanes
    tl.store(out_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=offsets < n_elements) + 0 * total,
             mask=offsets < n_elements)


@interpreter_only_because("the interpreter's masked loads")
def test_masked_lanes_of_a_load_without_other_are_undefined_not_zero(scratch_exercises):
    """The interpreter reads 0 there; Triton promises nothing (a GPU reads what the register held): the
    checker reads NaN, so a sum, max or dot over such lanes shows."""
    scratch_exercises(Exercise("99.double_undefined", "double", "double(x, out)", _double_cases))
    failure("99.double_undefined", lambda x, out: sum_without_other_kernel[(1,)](x, out, x.numel(), BLOCK=512),
            "NaN where a number was expected")


@triton.jit
def double_in_one_lane_blocks_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    pad = tl.load(x_ptr + offsets, mask=offsets < 0, other=0.0)  # every lane masked off: other, 0
    x = tl.load(x_ptr + offsets, mask=offsets < n_elements)
    tl.store(out_ptr + offsets, 2 * x + pad, mask=offsets < n_elements)


def test_other_zero_on_a_block_of_one_lane_is_still_given(scratch_exercises):
    """Triton's semantic.load passes `other.handle if other else None`: in the interpreter a one-element block
    is as true as its value, so other=0.0 arrived as None and the checker read the masked lane as NaN, a false
    failure of a kernel with BLOCK = 1 (a GPU keeps the 0)."""
    scratch_exercises(Exercise("99.double_one_lane", "double", "double(x, out)", _double_cases))
    check("99.double_one_lane",
          lambda x, out: double_in_one_lane_blocks_kernel[(x.numel(),)](x, out, x.numel(), BLOCK=1),
          seed=0, quiet=True)


def test_returning_the_launch_is_returning_nothing(scratch_exercises):
    """`return kernel[grid](...)`: a GPU gives back the CompiledKernel, the interpreter None. The checker said
    "a destination-passing function returns None" on a GPU only; both modes take it now."""
    from triton.compiler.compiler import CompiledKernel

    scratch_exercises(Exercise("99.double_returned", "double", "double(x, out)", _double_cases))

    def double(x, out):
        handle = double_in_one_lane_blocks_kernel[(x.numel(),)](x, out, x.numel(), BLOCK=1)
        return handle if handle is not None else object.__new__(CompiledKernel)  # what a GPU's launch returns

    check("99.double_returned", double, seed=0, quiet=True)


@triton.jit
def add_by_libdevice_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n_elements)
    y = tl.load(y_ptr + offsets, mask=offsets < n_elements)
    tl.store(out_ptr + offsets, libdevice.add_rn(x, y), mask=offsets < n_elements)  # x + y, rounded to nearest


@interpreter_only_because("libdevice runs on a GPU")
def test_libdevice_in_the_interpreter_is_named():
    """triton 3.9's interpreter returns None for every libdevice function, and the error ("cannot convert None
    ... to tensor") names the tl.store that uses the value: the message says what it is."""
    failure("02.vector_add", lambda x, y, out: add_by_libdevice_kernel[(triton.cdiv(x.numel(), 256),)](
        x, y, out, x.numel(), BLOCK=256), "does not run libdevice", "used a value that is None")


def test_watches_of_two_threads_leave_no_wrapper_behind():
    """A watch that began first and ended first (the batch grader's threads): each puts back what it found, so
    the other's wrappers stayed on the interpreter's builder and torch.Tensor for good, the next watch wrapped
    them again, and a load's other=0.0 on one lane read NaN in every later check (08's autograd stand-ins
    graded with --jobs 2, then test_harness's one-lane tests). Watches take turns now."""
    import threading

    from triton.runtime import interpreter as interp

    load = interp.InterpreterBuilder.create_masked_load
    inside, release = threading.Event(), threading.Event()

    def first():
        with watching():
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(5)
    threading.Timer(0.3, release.set).start()
    with watching():  # the first watch ends inside this one, unless this one waits for it
        thread.join(5)
    assert interp.InterpreterBuilder.create_masked_load is load
    assert "numpy" not in vars(torch.Tensor)


def test_a_mistyped_exercise_id_is_answered_with_the_closest_one():
    with pytest.raises(KeyError, match=r"did you mean '02\.vector_add'\?"):
        check("02.vector_ad", add, seed=0, quiet=True)
    with pytest.raises(KeyError) as info:
        check("zz", add, seed=0, quiet=True)
    assert "did you mean" not in str(info.value) and "02.vector_add" in str(info.value)


# --- nothing a candidate does crashes the check ---------------------------------------------------

class _UnprintableError(Exception):
    def __str__(self):
        raise ValueError("no message")


def _adds_then(then):
    def candidate(x, y, out):
        add(x, y, out)
        return then()

    return candidate


def _raises(exc):
    def candidate(x, y, out):
        raise exc

    return candidate


@pytest.mark.parametrize("candidate, expected", [
    (_adds_then(lambda: torch.zeros(3).to_sparse()), ["cannot examine", "returns None",
                                                      "Cannot access storage of SparseTensorImpl"]),
    (_raises(_UnprintableError()), ["your function raised an exception", "_UnprintableError"]),
    (_raises(SystemExit(3)), ["called sys.exit(3)", "SystemExit: 3", "raise exc"]),
], ids=["returns a sparse tensor", "an exception whose __str__ raises", "sys.exit"])
def test_a_candidate_that_would_crash_the_check_fails_it(candidate, expected):
    from course_utils.grading import CandidateError

    err = failure("02.vector_add", candidate, *expected)
    assert isinstance(err, CandidateError)


@pytest.mark.parametrize("exercise_id, candidate, expected", [
    ("07.pack_int4", lambda lo, hi: torch.empty(lo.shape, dtype=torch.uint8, device="meta"),
     "returned a (1,) uint8 tensor on the meta device, which the checker cannot examine"),
    ("01.broadcast_view", lambda t, shape: torch.zeros(shape).to_sparse(), "returned a sparse_coo"),
], ids=["meta", "sparse"])
def test_a_returned_value_the_checker_cannot_read_is_named(exercise_id, candidate, expected):
    failure(exercise_id, candidate, expected)


def test_an_output_re_pointed_with_set_is_named():
    def re_pointed(x, y, out):
        add(x, y, out)
        out.set_()

    failure("02.vector_add", re_pointed, "`out` is no longer the buffer the checker passed in",
            "swapped or resized")


@triton.jit
def _tuple_add_kernel(inputs, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(inputs[0] + offs, mask=mask) + tl.load(inputs[1] + offs, mask=mask), mask=mask)


@triton.jit
def _scaled_relu_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, tl.maximum(x * (scale * 2.0), 0.0), mask=offs < n)


def test_tuples_of_tensors_and_numpy_floats_are_arguments_a_launch_takes():
    """Honest launches the rule on arguments (and the interpreter's address check) took for mistakes: a
    tuple of tensors (a tuple of pointers, Triton >= 3.3) had its loads refused as out of bounds, none of
    its tensors known; 1 / np.sqrt(4.0), an np.float64, is a float to Triton's launcher, and was "not a
    tensor, a number or a Triton object"."""
    import numpy as np

    def add_pair(x, y, out):
        n = out.numel()
        _tuple_add_kernel[(triton.cdiv(n, 1024),)]((x, y), out, n, BLOCK=1024)

    def scaled_relu(x, out):
        n = x.numel()
        _scaled_relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, 1 / np.sqrt(4.0), BLOCK=1024)

    check("02.vector_add", add_pair, seed=1, quiet=True)
    check("02.relu", scaled_relu, seed=1, quiet=True)


def test_marks_made_on_another_thread_leave_the_grading_codes_state_as_it_was():
    """Autograd runs a CUDA tensor's backward on a device thread of its own, where the op recorder marks
    what it sees. Counted apart from the one ledger on, those marks changed the grading code's module state,
    and the sandbox's integrity check failed 08.rmsnorm_train's honest solution on a GPU ("the notebook
    changed the checker's own code ... _marks_elsewhere"). A thread stands in for the device thread here."""
    import threading

    from course_utils.grading import guard, remote

    integrity = remote.Integrity()
    ledger = guard.OpLedger()
    ledger.start()

    def mark():
        with guard._counted_range(guard.OpLedger.MARK):
            pass

    thread = threading.Thread(target=mark)
    thread.start()
    thread.join()
    ledger.stop()
    assert integrity.restore() == []


def test_the_graders_stand_in_for_a_sandboxed_node_saves_on_the_calls_device():
    """The stand-ins of what a sandbox's autograd node saved were made on the CPU whatever the device: on a
    GPU, 08.rmsnorm_train's check compared one with x (a saved copy of x?) and the grader raised, so a
    forward that saves a copy of x got "error" instead of its message. "meta" stands in for "cuda" here."""
    from course_utils.grading import remote

    x = torch.randn(4, 8, device="meta", requires_grad=True)
    info = {"function": True, "saved": [{"input": 0}, {"shape": [4, 8], "dtype": "float32"}]}
    y = remote.autograd_in(None, x.detach(), info, [x], "meta")
    assert [t.device.type for t in y.grad_fn.saved_tensors] == ["meta", "meta"]


def test_the_bytes_of_one_element_with_a_stride_are_read():
    """A (1, 1) column of a wider tensor keeps its strides through .contiguous() (one element is contiguous
    whatever its strides); viewing it as bytes raised, and the checker crashed before the candidate ran."""
    from course_utils.grading.harness import _bits

    one = torch.arange(18, dtype=torch.float16).view(2, 9)[:1, 3:4:2]
    assert one.stride() == (9, 2) or one.numel() == 1
    assert torch.equal(_bits(one), torch.tensor([3.0], dtype=torch.float16).view(torch.uint8))


def _zeroed_slice(x, y, out):
    out[:] = 0  # torch lifts the 0 into a one-element tensor and fills from it: a constant all the same


def _zeroed_ellipsis(x, y, out):
    out[...] = 0.0


def _constant_allocations(x, y, out):
    return (out.new_full((4,), float("-inf")), out.new_ones((4,)), torch.ones_like(out), torch.arange(4),
            torch.scalar_tensor(0.0))


@pytest.mark.parametrize("before", [_zeroed_slice, _zeroed_ellipsis, _constant_allocations])
def test_constants_set_or_allocated_on_the_host_are_no_host_computation(before):
    """`t[:] = 0` fills t from a tensor torch lifts from the Python 0, and new_full, new_ones, ones_like, arange
    and scalar_tensor allocate constants or indices: none carries anybody's data (a fill from one of x's
    elements still does, and is refused: test_grading_attacks)."""
    def vector_add(x, y, out):
        before(x, y, out)
        add(x, y, out)

    check("02.vector_add", vector_add, seed=1, quiet=True, course=True)


@triton.jit
def _grid_stride_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, SCALAR_MASK: tl.constexpr):
    for b in tl.range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        if SCALAR_MASK:  # a block's mask and a scalar condition, combined
            offs = b * BLOCK + tl.arange(0, BLOCK)
            mask = (offs < n) & (tl.program_id(0) >= 0)
        else:
            offs = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # a Triton scalar's method, on a GPU
            mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@interpreter_only_because("both compile on a GPU: the interpreter alone refuses them")
@pytest.mark.parametrize("scalar_mask, says", [(False, "tl.cast(i, tl.int64)"),
                                               (True, "a mask made of a block and a scalar condition")])
def test_interpreter_only_refusals_of_gpu_code_get_advice(scalar_mask, says):
    """A loop variable is a Python int in the interpreter (b.to(tl.int64) fails), and triton 3.9's interpreter
    refuses a mask ANDed with a scalar: code that runs on a GPU gets advice, not a bare traceback."""
    def vector_add(x, y, out):
        _grid_stride_add_kernel[(4,)](x, y, out, out.numel(), BLOCK=64, SCALAR_MASK=scalar_mask)

    failure("02.vector_add", vector_add, says)


@triton.jit
def _add_scaled_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = alpha.to(tl.float32)  # Liger-Kernel's eps.to(tl.float32): a Triton scalar's method, on a GPU
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + a * tl.load(y_ptr + offs, mask=mask), mask=mask)


@interpreter_only_because("it compiles on a GPU: the interpreter alone refuses it")
def test_a_float_arguments_triton_method_in_the_interpreter_gets_advice():
    """A float argument is a Python float in the interpreter: alpha.to(tl.float32) fails there."""
    def vector_add(x, y, out):
        _add_scaled_kernel[(triton.cdiv(out.numel(), 64),)](x, y, out, out.numel(), 1.0, BLOCK=64)

    failure("02.vector_add", vector_add, "tl.cast(eps, tl.float32)")
