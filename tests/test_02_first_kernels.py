"""Lesson 02's exercises through the checker: the solutions pass, and plausible wrong answers fail
with a message that points at the mistake (missing mask, off-by-one offsets, a grid that only covers
whole blocks or is capped, the contiguous-stride assumption, writes into an input, partial writes,
zeros, a cached result, torch on the host, the reference, the course's own solution, the wrong
signature, an exception, a block that is no power of 2), with the hint for that kind of failure."""
from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from course_utils.grading import REGISTRY, CandidateError, CheckFailed, check, exercises
from course_utils.lessons.l02_first_kernels import add, add_kernel, copy_2d, copy_2d_kernel, relu, relu_kernel
from course_utils.mode import current, size
from helpers import (REMAINDER_MASK, failure, flat_copy_kernel, launch_1d, mutant, recorded_launches,
                     zeros_kernel)

ROOT = Path(__file__).resolve().parent.parent
INTERPRET = current().interpret
cpu_only = pytest.mark.skipif(not INTERPRET, reason="host memory tricks: on a GPU the data is on the device")


# 02.copy_2d's cases: a GPU appends one row and one column longer than a grid's axis 1 holds in tiles of 32
# (the interpreter would take a minute over each), and the speed line's size (harness.speed_case), so the
# totals in "failed on case i/n" differ by mode
COPY_CASES = 10 if current().gpu else 7


def out_of_bounds(*interpreter: str) -> tuple[str, ...]:
    """What a missing mask looks like: caught before the access in the interpreter, in the guard on a GPU."""
    return interpreter if INTERPRET else ("written past its end",)


# --- kernels with the mistakes students make ---------------------------------------------------

@triton.jit
def add_no_mask_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))


@triton.jit
def add_shifted_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + 1  # off by one: element 0 is skipped
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def add_mask_le_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets <= n_elements  # off by one: one element too many
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def add_store_before_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets - 1, x + y, mask=mask)  # off by one the other way: out[-1] .. out[n-2]


@triton.jit
def add_into_x_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask)
    tl.store(x_ptr + offsets, x, mask=mask)  # "in place" into the input
    tl.store(out_ptr + offsets, x, mask=mask)


@triton.jit
def relu_identity_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.where(x > 0, x, -x), mask=mask)  # |x|, not max(x, 0)


@triton.jit
def relu_in_place_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    y = tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0)
    tl.store(x_ptr + offsets, y, mask=mask)
    tl.store(out_ptr + offsets, y, mask=mask)


@triton.jit
def copy_2d_contiguous_kernel(x_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask)  # assumes strides (N, 1)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], x, mask=mask)


@triton.jit
def copy_2d_rows_mask_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om, stride_on,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < BLOCK_N)  # against the block, not N
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, x, mask=mask)


# --- the solutions ----------------------------------------------------------------------------

@pytest.mark.parametrize("exercise_id, solution",
                         [("02.vector_add", add), ("02.relu", relu), ("02.copy_2d", copy_2d)])
def test_solution_passes(exercise_id, solution, capsys):
    check(exercise_id, solution, seed=3)
    assert f"{exercise_id} passed" in capsys.readouterr().out


def test_solutions_pass_with_other_blocks():
    check("02.vector_add", lambda x, y, out: add(x, y, out, BLOCK=128), seed=4, quiet=True)
    check("02.copy_2d", lambda x, out: copy_2d(x, out, BLOCK_M=16, BLOCK_N=64), seed=4, quiet=True)


# --- 02.vector_add: wrong answers ---------------------------------------------------------------

def test_add_missing_mask_is_out_of_bounds():
    def no_mask(x, y, out):
        launch_1d(add_no_mask_kernel, x, y, out, n=out.numel())

    err = failure("02.vector_add", no_mask,
                  *out_of_bounds("tl.load out of bounds", "past the end of `x_ptr`", "Is a mask missing"))
    assert "length 1," in err.case  # the first case already fails: 1 element, a block of 1024


def test_add_offsets_shifted_by_one_leave_element_zero_unwritten():
    def shifted(x, y, out):
        launch_1d(add_shifted_kernel, x, y, out, n=out.numel())

    failure("02.vector_add", shifted, "1 of 1 elements were never written", "first at [0]")


def test_add_mask_off_by_one_reads_past_the_end():
    def mask_le(x, y, out):
        launch_1d(add_mask_le_kernel, x, y, out, n=out.numel())

    failure("02.vector_add", mask_le, *out_of_bounds("out of bounds", "1 element(s) past the end of `x_ptr`"))


def test_add_storing_one_element_early_hits_the_guard_region():
    def early(x, y, out):
        launch_1d(add_store_before_kernel, x, y, out, n=out.numel())

    failure("02.vector_add", early, "`out`: 1 element(s) written before its start", "never written")


def test_add_grid_of_whole_blocks_only_misses_the_tail():
    def whole_blocks(x, y, out, BLOCK=128):
        n = out.numel()
        add_kernel[(max(1, n // BLOCK),)](x, y, out, n, BLOCK=BLOCK)  # 1823 // 128 = 14 blocks: 1792 elements

    failure("02.vector_add", whole_blocks, "`out`: 31 of 1823 elements were never written", "first at [1792]",
            "hint: the grid must cover all n elements: triton.cdiv(n, BLOCK) programs")


def test_add_written_into_the_input_is_reported():
    def into_x(x, y, out):
        launch_1d(add_into_x_kernel, x, y, out, n=out.numel())

    failure("02.vector_add", into_x, "your function modified its input `x`")


def test_add_partial_write_reports_the_first_unwritten_elements():
    def first_half(x, y, out):
        n = out.numel()
        launch_1d(add_kernel, x, y, out, n=max(1, n // 2))

    failure("02.vector_add", first_half, "elements were never written",
            "first at [911], [912], [913], [914], [915]")


def test_add_zeros_report_expected_and_got():
    def zeros(x, y, out):
        launch_1d(zeros_kernel, out, n=out.numel())

    err = failure("02.vector_add", zeros, "`out`: 1 of 1 elements differ beyond atol=", "expected", "got 0")
    assert "never written" not in str(err)


def test_add_writing_nothing_is_never_written():
    def launches_nothing_useful(x, y, out):
        launch_1d(zeros_kernel, out, n=0)

    failure("02.vector_add", launches_nothing_useful, "never written (still the poison value)")


def test_add_adding_into_an_output_not_zeroed_is_told_so():
    """Adding into `out` without zeroing it first leaves the checker's NaN (NaN + x is NaN): the message says
    that an element still NaN may have been added into, not only left unwritten (the interpreter keeps the
    poison's bits, a GPU's atomics give another NaN: two messages, one phrase)."""
    add_into = mutant("l02_first_kernels", "add", ("tl.store(out_ptr + offs, x + y, mask=mask)",
                                                    "tl.atomic_add(out_ptr + offs, x + y, mask=mask)"))
    failure("02.vector_add", add_into, "added into without zeroing the output first")


def test_add_replaying_a_cached_result_fails_on_fresh_inputs():
    cache: dict = {}

    def cached(x, y, out):
        key = (tuple(x.shape), x.dtype)
        if key not in cache:
            cache[key] = torch.empty_like(out)
            add(x, y, cache[key])
        launch_1d(flat_copy_kernel, cache[key], out, n=out.numel())

    check("02.vector_add", cached, quiet=True)  # the first call computes every case for real
    failure("02.vector_add", cached, "elements differ beyond")  # the next draws other inputs


def test_add_with_torch_names_the_torch_function_and_the_line():
    def with_torch(x, y, out):
        launch_1d(zeros_kernel, out, n=out.numel())
        out.copy_(x + y)

    err = failure("02.vector_add", with_torch, "computed with torch operations outside your Triton kernel",
                  "torch.add / + (aten.add) at `out.copy_(x + y)` (with_torch, line",
                  "Tensor.copy_ / out[...] = ... (aten.copy_)", "must happen inside your Triton kernel")
    assert "no Triton kernel" not in str(err)


@torch.library.custom_op("course_tests::relu_into", mutates_args={"out"})
def _relu_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """The course's ReLU kernel behind a torch.library custom op: what runs inside one is hidden from the
    checker's watch (its own torch ops as much as the kernel), so the op is refused, by its own name."""
    relu(x, out)


def test_a_kernel_inside_a_custom_op_is_refused_and_the_op_named():
    failure("02.relu", lambda x, out: _relu_into(x, out), "the custom op course_tests::relu_into at",
            "cannot see inside a custom op", "wrap_triton(kernel)[grid]")


def test_add_without_any_kernel_is_told_to_launch_one():
    def torch_only(x, y, out):
        torch.add(x, y, out=out)

    err = failure("02.vector_add", torch_only, "no Triton kernel was launched", "torch.add / + (aten.add)")
    assert err.reason.startswith("no Triton kernel was launched")


def add_ref(x, y):
    return x + y


def test_add_calling_the_reference_is_told_so():
    def calls_reference(x, y, out):
        launch_1d(flat_copy_kernel, add_ref(x, y), out, n=out.numel())

    err = failure("02.vector_add", calls_reference, "calls the reference `add_ref`",
                  "torch.add / + (aten.add)")
    assert err.reason.startswith("your function calls the reference `add_ref`")


def test_add_returning_the_result_instead_of_writing_out():
    def returns(x, y, out):
        return x + y

    failure("02.vector_add", returns, "never written", "returned a tensor instead of writing into `out`")


@cpu_only
def test_add_computed_in_numpy_is_caught():
    def with_numpy(x, y, out):
        launch_1d(zeros_kernel, out, n=out.numel())
        out.numpy()[:] = x.numpy() + y.numpy()

    failure("02.vector_add", with_numpy, "read tensor data into Python/NumPy on the host (Tensor.numpy)",
            "changed after your last kernel launch")


def test_add_computed_in_a_python_loop_is_caught():
    def python_loop(x, y, out):
        values = [a + b for a, b in zip(x.tolist(), y.tolist())]
        host = torch.tensor(values, dtype=out.dtype, device=out.device)
        launch_1d(flat_copy_kernel, host, out, n=out.numel())

    failure("02.vector_add", python_loop, "Tensor.tolist")


@cpu_only
def test_add_output_changed_behind_the_kernels_back():
    def memset_after(x, y, out):
        add(x, y, out)
        ctypes.memset(out.data_ptr(), 0, out.element_size())  # neither torch nor a kernel

    failure("02.vector_add", memset_after, "`out` was changed after your last kernel launch by host code")


def test_add_printing_while_debugging_is_not_torch_arithmetic(capsys):
    def debugging(x, y, out):
        print(x[:3], y)
        add(x, y, out)

    check("02.vector_add", debugging, seed=5, quiet=True)
    assert "tensor(" in capsys.readouterr().out


def test_add_wrong_signature():
    def two_args(x, y):
        return x + y

    err = failure("02.vector_add", two_args, "wrong signature: expected add(x, y, out)", "two_args(x, y)")
    assert err.exercise == "02.vector_add"


def test_add_raising_is_the_students_error_with_their_line():
    def raises(x, y, out):
        raise ValueError("my bug")

    with pytest.raises(CandidateError) as info:
        check("02.vector_add", raises, seed=1, quiet=True)
    message = str(info.value)
    assert "your function raised an exception" in message and "ValueError: my bug" in message
    assert 'raise ValueError("my bug")' in message and "grading/harness.py" not in message
    assert info.value.reason == "raised ValueError: my bug"


def test_add_stub_from_the_exercise_notebook_fails():
    def add_stub(x, y, out, BLOCK=1024):
        raise NotImplementedError("add: not written yet")

    err = failure("02.vector_add", add_stub, "NotImplementedError: add: not written yet")
    assert err.reason == "raised NotImplementedError: add: not written yet"


# --- 02.relu: wrong answers ---------------------------------------------------------------------

def test_relu_over_the_first_dimension_only():
    def first_dim(x, out, BLOCK=1024):
        n = x.shape[0]
        relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)

    failure("02.relu", first_dim, "3-D", "elements were never written", "launch over numel, not shape[0]")


def test_relu_missing_mask():
    def no_mask(x, out):
        n = x.numel()
        add_no_mask_kernel[(triton.cdiv(n, 1024),)](x, x, out, n, BLOCK=1024)

    failure("02.relu", no_mask, *out_of_bounds("out of bounds", "Is a mask missing"))


def test_relu_wrong_formula():
    def absolute(x, out):
        launch_1d(relu_identity_kernel, x, out, n=x.numel())

    failure("02.relu", absolute, "elements differ beyond", "expected 0, got")


def test_relu_as_x_times_its_sign_test_fails_at_minus_inf():
    """x * (x > 0) is relu for every finite x; at -inf it is -inf * 0 = NaN, and no case had an infinity."""
    wrong = mutant("l02_first_kernels", "relu", ("tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)",
                                                 "tl.store(out_ptr + offs, x * (x > 0), mask=mask)"))
    failure("02.relu", wrong, "with inf and -inf among the values", "expected 0, got nan")


def test_relu_in_place_into_the_input():
    def in_place(x, out):
        launch_1d(relu_in_place_kernel, x, out, n=x.numel())

    # the interpreter sees the store itself, whatever it stored (here the first case's x is positive: its relu
    # is x); a GPU, what is left in x afterwards
    failure("02.relu", in_place, "your function modified its input `x`" if current().gpu else
            "your kernel stored into `x`, an input")


def test_relu_with_torch_names_the_function():
    def with_torch(x, out):
        launch_1d(flat_copy_kernel, F.relu(x), out, n=x.numel())

    failure("02.relu", with_torch,
            "torch.relu / F.relu (aten.relu) at `launch_1d(flat_copy_kernel, F.relu(x)")


def test_relu_only_for_multiples_of_the_block():
    def whole_blocks(x, out, BLOCK=64):
        n = x.numel()
        relu_kernel[(max(1, n // BLOCK),)](x, out, n, BLOCK=BLOCK)

    failure("02.relu", whole_blocks, "elements were never written")


def test_relu_as_half_of_x_plus_its_absolute_value_overflows_near_the_largest_float():
    """(x + |x|) / 2 is max(x, 0) in exact arithmetic; in floating point x + |x| overflows to inf once x
    passes half the largest finite value (32752 in fp16), where max(x, 0) is still x."""
    half_sum = mutant("l02_first_kernels", "relu", ("tl.maximum(x, 0.0), mask=mask)  # 1 FLOP",
                                                    "(x + tl.abs(x)) * 0.5, mask=mask)  # 1 FLOP"))
    failure("02.relu", half_sum, "values up to the largest finite one", "got inf")


def test_relu_zeros():
    def zeros(x, out):
        launch_1d(zeros_kernel, out, n=out.numel())

    failure("02.relu", zeros, "elements differ beyond", "got 0")


# --- 02.copy_2d: wrong answers ------------------------------------------------------------------

def test_copy_2d_assuming_contiguous_fails_on_the_transposed_case():
    def contiguous_only(x, out, BLOCK_M=32, BLOCK_N=32):
        M, N = x.shape
        grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
        copy_2d_contiguous_kernel[grid](x, out, M, N, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)

    m = size((1823, 781), (67, 45))[0]
    err = failure("02.copy_2d", contiguous_only,
                  f"failed on case 3/{COPY_CASES}: transposed: strides (1, M)",
                  f"strides=(1, {m})", "elements differ beyond",
                  "hint: address element (i, j) as i * x.stride(0)")
    assert "transposed" in err.case


def test_copy_2d_with_swapped_strides():
    def swapped(x, out, BLOCK_M=32, BLOCK_N=32):
        M, N = x.shape
        grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
        copy_2d_kernel[grid](x, out, M, N, x.stride(1), x.stride(0), out.stride(0), out.stride(1),
                             BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)

    failure("02.copy_2d", swapped, f"case 2/{COPY_CASES}: contiguous")


def test_copy_2d_masking_columns_against_the_block_is_out_of_bounds():
    def rows_mask_only(x, out, BLOCK_M=32, BLOCK_N=32):
        M, N = x.shape
        grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
        copy_2d_rows_mask_kernel[grid](x, out, M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                                       BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)

    if INTERPRET:  # the guard stops the first access past the one element of the 1 x 1 case
        failure("02.copy_2d", rows_mask_only, "case 1/", "out of bounds",
                "Is a mask missing, or an offset or stride wrong?")
        return
    # On a GPU the 1 x 1 case's 31 stray loads read whatever lies past x's one element, and its stray stores
    # put that into out's guard region: caught there ("written past its end") unless those bytes are the
    # guard's own poison, left behind by an output buffer freed earlier in the process. The contiguous case
    # comes next whatever memory holds: its columns past the first tile of 32 are masked off, never written.
    message = str(failure("02.copy_2d", rows_mask_only))
    first_case = "case 1/" in message and "written past its end" in message
    second_case = f"case 2/{COPY_CASES}: contiguous" in message and "elements were never written" in message
    assert first_case or second_case, message


def test_copy_2d_only_whole_tiles():
    def whole_tiles(x, out, BLOCK_M=32, BLOCK_N=32):
        M, N = x.shape
        grid = (max(1, M // BLOCK_M), max(1, N // BLOCK_N))
        copy_2d_kernel[grid](x, out, M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                             BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)

    failure("02.copy_2d", whole_tiles, f"case 2/{COPY_CASES}", "elements were never written")


def test_copy_2d_contiguous_then_flat_copy_is_torch_on_the_host():
    def contiguous_first(x, out):
        launch_1d(flat_copy_kernel, x.contiguous(), out, n=out.numel())

    failure("02.copy_2d", contiguous_first, "transposed", "Tensor.clone / Tensor.contiguous (aten.clone)",
            "`launch_1d(flat_copy_kernel, x.contiguous(), out, n=out.numel())`")


def test_copy_2d_with_copy_():
    def copy_(x, out):
        launch_1d(zeros_kernel, out, n=0)
        out.copy_(x)

    failure("02.copy_2d", copy_, "Tensor.copy_ / out[...] = ... (aten.copy_)")


def test_copy_2d_wrong_signature_and_not_a_function():
    failure("02.copy_2d", lambda x: None, "wrong signature: expected copy_2d(x, out)")
    failure("02.copy_2d", 42, "expected a function copy_2d(x, out), got int")


# --- every 02 exercise: the same kinds of wrong answer -----------------------------------------------

SOLUTIONS = {"02.vector_add": add, "02.relu": relu, "02.copy_2d": copy_2d}
TORCH_ANSWERS = {"02.vector_add": lambda x, y: x + y, "02.relu": torch.relu, "02.copy_2d": lambda x: x * 1}
TORCH_NAMED = {"02.vector_add": "torch.add / + (aten.add)", "02.relu": "torch.relu / F.relu (aten.relu)",
               "02.copy_2d": "torch.mul / * (aten.mul)"}
EVERY = pytest.mark.parametrize("exercise_id", list(SOLUTIONS))


@EVERY
def test_writing_nothing_fails(exercise_id):
    def nothing(*args):
        launch_1d(zeros_kernel, args[-1], n=0)

    failure(exercise_id, nothing, "were never written (still the poison value)")


@EVERY
def test_writing_zeros_fails(exercise_id):
    def zeros(*args):
        launch_1d(zeros_kernel, args[-1], n=args[-1].numel())

    failure(exercise_id, zeros, "elements differ beyond", "got 0")


@EVERY
def test_torch_instead_of_a_kernel_fails(exercise_id):
    def with_torch(*args):
        args[-1].copy_(TORCH_ANSWERS[exercise_id](*args[:-1]))

    err = failure(exercise_id, with_torch, "no Triton kernel was launched", TORCH_NAMED[exercise_id],
                  "Tensor.copy_ / out[...] = ... (aten.copy_)")
    assert "never written" not in str(err), "the numbers are right: only the way is wrong"


@EVERY
def test_raising_is_reported_with_the_exception(exercise_id):
    def raises(*args):
        raise IndexError("list index out of range")

    with pytest.raises(CandidateError) as info:
        check(exercise_id, raises, seed=2, quiet=True)
    assert info.value.reason == "raised IndexError: list index out of range"
    assert "raise IndexError" in str(info.value)


@EVERY
def test_a_wrong_signature_names_the_expected_one(exercise_id):
    def only_x(x):
        return x

    signature = {ex.id: ex for ex in exercises("02")}[exercise_id].signature  # exercises() loads the registry
    failure(exercise_id, only_x, f"wrong signature: expected {signature}, your function is only_x(x)")


@EVERY
def test_a_cached_result_fails_on_the_next_call(exercise_id):
    cache: dict = {}

    def cached(*args):
        out = args[-1]
        key = tuple((tuple(a.shape), a.stride(), a.dtype) for a in args if isinstance(a, torch.Tensor))
        if key not in cache:
            cache[key] = torch.empty_like(out)
            SOLUTIONS[exercise_id](*args[:-1], cache[key])
        launch_1d(flat_copy_kernel, cache[key], out, n=out.numel())

    check(exercise_id, cached, quiet=True)
    failure(exercise_id, cached, "elements differ beyond")


# --- more mistakes: a capped grid, the course's own solution, a block that is no power of 2 ---------

@triton.jit
def add_looping_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    """Programs pid, pid + num_programs, ... of a grid of any size: block by block over all n elements."""
    for start in range(tl.program_id(0) * BLOCK, n_elements, tl.num_programs(0) * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
                 mask=mask)


@pytest.mark.parametrize("exercise_id, block, programs", [
    ("02.vector_add", 1024, 132), ("02.vector_add", 2048, 132), ("02.vector_add", 1024, 2 * 132),
    ("02.relu", 1024, 132), ("02.relu", 4096, 2 * 132)])
def test_a_grid_capped_at_the_sm_count_misses_the_rest(exercise_id, block, programs):
    """min(cdiv(n, BLOCK), programs) programs and no loop over the remaining blocks: right up to
    programs * BLOCK elements (1 MiB at most here), which every other case of the interpreter stays below."""
    def capped(*args):
        x, out = args[0], args[-1]
        n = out.numel()
        grid = (min(triton.cdiv(n, block), programs),)  # no loop over the rest
        if exercise_id == "02.vector_add":
            add_kernel[grid](x, args[1], out, n, BLOCK=block)
        else:
            relu_kernel[grid](x, out, n, BLOCK=block)

    if INTERPRET:  # the CPU's cases are small: only the last one is longer than the capped grids
        cases = len(list(REGISTRY[exercise_id].cases(torch.Generator().manual_seed(1))))
        err = failure(exercise_id, capped, "than a grid capped at twice the SM count (2 x 132 programs)",
                      "elements were never written", "hint:")
        assert f"case {cases}/{cases}" in str(err)
    else:
        failure(exercise_id, capped, "elements were never written")


def test_a_grid_of_the_sm_count_that_loops_over_the_rest_passes():
    """The honest way to launch fewer programs than blocks: each program strides over the blocks."""
    def looping(x, y, out):
        n = out.numel()
        add_looping_kernel[(min(triton.cdiv(n, 1024), 132),)](x, y, out, n, BLOCK=1024)

    check("02.vector_add", looping, seed=1, quiet=True)


def test_the_courses_own_solution_is_refused(refuse_course_solutions):
    err = failure("02.vector_add", add)
    assert str(err) == ("02.vector_add: `add` is the course's solution from "
                        "course_utils/lessons/l02_first_kernels.py; write your own")


def test_the_public_check_cannot_switch_the_refusal_off(refuse_course_solutions):
    """course_utils.check, the one a notebook calls, takes no course= (only tests and the lead's GPU script
    run the course's solutions, through grading.check(course=True)); no lesson notebook needs it."""
    import inspect

    import course_utils

    assert "course" not in inspect.signature(course_utils.check).parameters
    with pytest.raises(CheckFailed, match="the course's solution from"):
        course_utils.check("02.vector_add", add)


def test_a_wrapper_around_the_courses_kernel_is_refused(refuse_course_solutions):
    def my_add(x, y, out):
        n = out.numel()
        add_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)

    failure("02.vector_add", my_add, "your function launches `add_kernel`, the course's solution from "
            "course_utils/lessons/l02_first_kernels.py; write your own")


def test_a_later_lessons_kernel_is_refused_given_there_or_not(refuse_course_solutions):
    """Lesson 06's split-K down projection is given in its notebook (no solution block): a general matmul
    kernel, which answered 03.matmul while only the exercise's own lesson's kernels were refused. Here it
    adds: x + y is the (n, 2) stack of x and y times a (2, 1) column of ones."""
    from course_utils.lessons.l06_fused_rmsnorm_mlp import down_split_k

    def add_via_lesson_06(x, y, out):
        pairs = torch.stack([x, y], dim=1)  # (n, 2)
        ones = torch.ones(2, 1, dtype=x.dtype, device=x.device)
        down_split_k(pairs, ones, out.view(-1, 1),
                     triton.Config(dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, SPLIT_K=1), num_warps=4, num_stages=1))

    failure("02.vector_add", add_via_lesson_06, "your function launches `down_split_k_kernel`, the course's kernel "
            "from course_utils/lessons/l06_fused_rmsnorm_mlp.py, a later lesson than this exercise's")


@triton.jit
def relu_row_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * n_cols + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < n_cols
    tl.store(out_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


@pytest.mark.skipif(not INTERPRET, reason="on a GPU the same mistake is a compile error, same message")
def test_a_block_that_is_no_power_of_2_is_one_line_with_the_fix():
    def relu_rows(x, out):
        n_cols = x.shape[-1]
        relu_row_kernel[(x.numel() // n_cols,)](x, out, n_cols, BLOCK=n_cols)  # 5, 7, 781: no power of 2

    err = failure("02.relu", relu_rows, "tl.arange(0, N) needs N to be a power of 2",
                  "triton.next_power_of_2(n_cols)")
    assert isinstance(err, CandidateError) and len(str(err).splitlines()) <= 4, str(err)


def test_the_kernel_given_instead_of_the_host_function_is_named():
    """check("02.vector_add", add_kernel): the kernel's own parameters made a signature error that did not
    say what went wrong."""
    failure("02.vector_add", relu_row_kernel, "this is the @triton.jit kernel `relu_row_kernel`",
            "host function add(x, y, out)")


@triton.jit
def relu_block_ptr_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    block = tl.make_block_ptr(x_ptr, (n,), (1,), (tl.program_id(0) * BLOCK,), (BLOCK,), (0,))
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.maximum(tl.load(block, boundary_check=(0,)), 0.0), mask=offsets < n)


@pytest.mark.skipif(not INTERPRET, reason="block pointers still compile on the GPU image's triton")
def test_a_block_pointer_says_what_replaced_it():
    def relu(x, out):
        relu_block_ptr_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)

    try:
        relu(torch.ones(4), torch.empty(4))
    except Exception as exc:
        if "Block pointers have been removed" not in str(exc):
            raise
    else:
        pytest.skip("this triton still has block pointers")
    err = failure("02.relu", relu, "your kernel uses a block pointer at `block = tl.make_block_ptr(",
                  "tl.make_tensor_descriptor")
    assert isinstance(err, CandidateError)


def test_the_hint_follows_the_kind_of_failure():
    def first_dim(x, out, BLOCK=1024):
        n = x.shape[0]
        relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)

    def with_torch(x, out):
        launch_1d(flat_copy_kernel, F.relu(x), out, n=x.numel())

    assert "numel, not shape[0]" in str(failure("02.relu", first_dim))
    err = str(failure("02.relu", with_torch, "hint: the host function only allocates"))
    assert "numel" not in err.split("hint:")[1]


def test_the_benchs_read_only_kernel_sums_each_block():
    """Bench 02's "read only" row reads x and writes one sum per block: right sums, the last block masked."""
    from course_utils.benches.l02_first_kernels import read_only_kernel

    x = torch.randn(1000, device=current().device)
    sums = torch.empty(4, device=x.device)
    read_only_kernel[(4,)](x, sums, x.numel(), BLOCK=256)
    want = torch.stack([x[i * 256:(i + 1) * 256].sum() for i in range(4)])
    torch.testing.assert_close(sums, want, rtol=1e-5, atol=1e-4)


# --- grids that stop at the first tile along some axis ------------------------------------------------

def test_relu_launched_over_rows_instead_of_elements_fails():
    """One program of 1024 per row covers the (37, 781) case; the 2 x 3000 case has more elements per row
    than a block."""
    wrong = mutant("l02_first_kernels", "relu",
                   ("relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)",
                    "relu_kernel[(x.shape[0],)](x, out, n, BLOCK=BLOCK)"))
    failure("02.relu", wrong, "2 rows of 3000", "launch over numel")


def test_copy_2d_with_one_column_tile_of_128_fails():
    """A grid over row tiles only, columns in one tile of 128: in the interpreter every other case is narrower
    than that; on a GPU the contiguous case (781 columns) already is not."""
    wrong = mutant("l02_first_kernels", "copy_2d",
                   ("BLOCK_M: int = 32, BLOCK_N: int = 32) -> None:",
                    "BLOCK_M: int = 32, BLOCK_N: int = 128) -> None:"),
                   ("grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))",
                    "grid = (triton.cdiv(M, BLOCK_M), 1)"))
    caught_by = "130 x 259: more than one tile of 128" if INTERPRET else f"case 2/{COPY_CASES}: contiguous"
    failure("02.copy_2d", wrong, caught_by, "elements were never written")


def test_copy_2d_of_a_very_long_row_fits_a_gpu_grid(monkeypatch):
    """A (1, 2^22 + 5) copy in tiles of 32 columns needed 131073 programs along axis 1 of the grid, where a
    GPU holds 65535 ("Triton Error [CUDA]: invalid argument"); the interpreter has no such limit, so the
    launch is recorded here instead of run. Wider tiles keep it within the limit and cover every element."""
    from course_utils.lessons import l02_first_kernels as l02

    launches = recorded_launches(monkeypatch, l02, "copy_2d_kernel")
    for shape in [(1, (1 << 22) + 5), (3, 40_000_000)]:
        x = torch.empty(shape, device="meta")  # no memory: only the shape and strides reach the launch
        l02.copy_2d(x, torch.empty(shape, device="meta"))
        (grid, meta), = launches
        launches.clear()
        assert all(programs <= 65535 for programs in grid[1:]), grid
        assert grid[0] * meta["BLOCK_M"] >= shape[0] and grid[1] * meta["BLOCK_N"] >= shape[1]
        assert meta["BLOCK_M"] * meta["BLOCK_N"] == 32 * 32  # the same elements per program


def test_copy_2d_with_wider_tiles_copies_every_element(monkeypatch):
    """The wider tiles of a long row, run: with the axis limit lowered to 4, a transposed (5, 300) copy
    takes tiles of 8 x 128 (3 programs along axis 1) and still copies every element."""
    from course_utils.lessons import l02_first_kernels as l02

    monkeypatch.setattr(l02, "GRID_AXIS_MAX", 4)
    x = torch.randn(300, 5, device=current().device).t()
    out = torch.full((5, 300), float("nan"), device=current().device)
    l02.copy_2d(x, out)
    assert torch.equal(out, x)


def test_copy_2d_of_a_slice_of_a_tensor_past_2_31_elements():
    """x = big[2:, :64] of a (5, 2^30 + 1) uint8 tensor (5 GiB, of which only these bytes are touched): row 2
    of x lies 2 * (2^30 + 1) elements past x's start, which a 32-bit row offset wraps 2^32 elements back, to
    4 bytes into big (filled with 255 here). The solution's offsets are 64-bit."""
    device = current().device
    big = torch.empty((5, 2**30 + 1), dtype=torch.uint8, device=device)
    big[0, :80] = 255  # where a wrapped row 2 would be read
    x = big[2:, :64]  # strides (2^30 + 1, 1)
    x.copy_(torch.arange(3 * 64, device=device).view(3, 64))
    out = torch.empty((3, 64), dtype=torch.uint8, device=device)
    copy_2d(x, out)
    assert torch.equal(out, x), f"row 2: got {out[2, :4].tolist()}, expected {x[2, :4].tolist()}"


@pytest.mark.skipif(INTERPRET, reason="2^21 programs of 1024 elements: hours in the interpreter")
def test_add_and_relu_past_2_31_elements():
    """2^31 + 1000 fp16 elements (4 GiB a tensor): the last programs' pid * BLOCK passes int32's 2^31 - 1,
    and 32-bit offsets would wrap to before the tensors' start. The solutions' offsets are 64-bit."""
    n = 2**31 + 1000
    x = torch.ones(n, dtype=torch.float16, device="cuda")
    x[-2000:] = torch.arange(2000, device="cuda", dtype=torch.float16) - 1000.0
    out = torch.empty_like(x)
    add(x, x, out)
    assert torch.equal(out[-2000:], 2 * x[-2000:]) and bool((out[:4] == 2).all())
    del out
    y = torch.full_like(x, float("nan"))
    relu(x, y)
    assert torch.equal(y[-2000:], x[-2000:].clamp_min(0)) and bool((y[:4] == 1).all())


@pytest.mark.skipif(INTERPRET, reason="a GPU's grid limit: the interpreter has none")
def test_copy_2d_with_tiles_of_32_along_a_very_long_row_fails_on_a_gpu():
    """2^21 + 3 columns in tiles of 32 are 65537 programs along axis 1, where a GPU launches at most 65535."""
    def fixed_tiles(x, out):
        M, N = x.shape
        copy_2d_kernel[(triton.cdiv(M, 32), triton.cdiv(N, 32))](
            x, out, M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1), BLOCK_M=32, BLOCK_N=32)

    failure("02.copy_2d", fixed_tiles, "one row of 2^21 + 3")


# --- masks that are right except where the size is a multiple of the block ------------------------


@pytest.mark.parametrize("exercise_id, name, line", [
    ("02.vector_add", "add", "    mask = offs < n_elements  # the last block is partial\n"),
    ("02.relu", "relu", "    mask = offs < n_elements\n    x = tl.load(x_ptr + offs, mask=mask)\n"),
], ids=["vector_add", "relu"])
def test_a_mask_from_the_remainder_fails_where_the_last_block_is_full(exercise_id, name, line):
    """Every other length is no multiple of any block: there the remainder mask is right."""
    wrong = mutant("l02_first_kernels", name, (line, line.replace("offs < n_elements", REMAINDER_MASK)))
    failure(exercise_id, wrong, "a multiple of every block size", "elements were never written",
            "offsets < n")


def test_copy_2d_with_masks_from_the_remainder_fails_on_whole_tiles():
    tail = "(tl.arange(0, {b}) < tl.where(tl.program_id({a}) == tl.num_programs({a}) - 1, {n} % {b}, {b}))"
    rows, cols = tail.format(a=0, n="M", b="BLOCK_M"), tail.format(a=1, n="N", b="BLOCK_N")
    wrong = mutant("l02_first_kernels", "copy_2d", ("mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)",
                                                    f"mask = {rows}[:, None] & {cols}[None, :]"))
    failure("02.copy_2d", wrong, "128 x 256: whole tiles", "elements were never written")


@pytest.mark.skipif(INTERPRET, reason="a GPU's grid limit: the interpreter has none")
def test_copy_2d_with_the_rows_on_axis_1_fails_on_a_gpu():
    """CUDA's habit, columns on axis 0 and rows on axis 1: a column of 2^21 + 3 rows in tiles of 32 is 65537
    programs along axis 1, where a GPU launches at most 65535."""
    wrong = mutant("l02_first_kernels", "copy_2d",
                   ("offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M", "offs_m = tl.program_id(1).to(tl.int64) * BLOCK_M"),
                   ("offs_n = tl.program_id(1).to(tl.int64) * BLOCK_N", "offs_n = tl.program_id(0).to(tl.int64) * BLOCK_N"),
                   ("grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))",
                    "grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(M, BLOCK_M))"))
    failure("02.copy_2d", wrong, "one column of 2^21 + 3 rows")
