"""Exercises of lesson 01 (strides, views, intensity, roofline) and its self-check questions (`quiz`)."""
from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from ..grading import Case, CheckFailed, Exercise, register
from ..grading.inputs import randn
from ..mode import current, size

# aten ops that build the views of these exercises for you (`t.T`, `t.mT`, `swapaxes` run aten.transpose,
# `movedim` and `.T` of a 3-D tensor run aten.permute; `broadcast_to`, `expand_as`, `broadcast_tensors`
# run aten.expand): the exercises ask for as_strided.
TRANSPOSE_OPS = ("transpose", "t", "permute", "movedim", "swapaxes", "swapdims", "numpy_T", "mT", "adjoint")
# broadcast_in_dim: the prim that torch._refs.expand and torch._refs.broadcast_to build the view with
EXPAND_OPS = ("expand", "expand_as", "broadcast_to", "broadcast_tensors", "broadcast_in_dim")
# NumPy's and PyTorch's own helpers that compute strides or build these views ("module:name", refused when
# called under any name): the same answers from a library as the aten ops above. np.einsum with a
# permutation of the subscripts returns a transposed view. What the profiler never sees (an ndarray made
# with np.ndarray(...), its .T and .mT, np.nditer's views: a type's call and attributes written in C) is
# answered by the cases instead: one view has more dimensions than any NumPy array can have.
# (flex_attention's _construct_strides(shape, fill_order) with the dims in reverse order: row-major strides.
# Inductor's layouts compute them too, as sympy integers; that module is not loaded with torch, and the
# check knows its functions by name without loading it.)
STRIDE_HELPERS = ("torch._prims_common:make_contiguous_strides_for",
                  "torch._higher_order_ops.flex_attention:_construct_strides",
                  "torch._inductor.ir:FlexibleLayout.contiguous_strides",
                  "torch._inductor.ir:FlexibleLayout.fill_ordered",
                  "torch._inductor.ir:FlexibleLayout.stride_ordered",
                  "torch._inductor.kernel.flex.common:construct_strides",
                  "numpy.lib.stride_tricks:as_strided")
TRANSPOSE_HELPERS = ("numpy:swapaxes", "numpy:transpose", "numpy:moveaxis", "numpy:rollaxis",
                     "numpy:ndarray.swapaxes", "numpy:ndarray.transpose",  # methods in C: seen as c_call
                     "numpy:einsum", "numpy.lib.stride_tricks:as_strided")
EXPAND_HELPERS = ("numpy:broadcast_to", "numpy:broadcast_arrays", "numpy.lib.stride_tricks:as_strided")
HELPER_MESSAGE = ("that is a library's helper (NumPy's or PyTorch's, not the course's) doing the exercise for "
                  "you; compute the strides yourself from t.shape and t.stride() (the shape for "
                  "contiguous_strides) and build the view with t.as_strided")
# Making a tensor of the shape and asking for its strides answers 01.contiguous_strides without thinking.
CREATION_OPS = ("empty", "empty_strided", "empty_permuted", "zeros", "ones", "full", "rand", "randn",
                "randint", "arange", "new_empty", "new_zeros", "new_ones", "new_full", "empty_like",
                "zeros_like", "ones_like")


# --- 01.contiguous_strides ----------------------------------------------------------------------

def _row_major(shape) -> tuple[int, ...]:
    return tuple(torch.empty(shape, device="meta").stride())


def _column_major(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for s in shape:
        strides.append(step)
        step *= s
    return tuple(strides)


def _verify_strides(result, case: Case) -> list[str]:
    shape, expected = case.args[0], case.expected
    if not isinstance(result, tuple | list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                                         for s in result):
        why = ""
        if isinstance(result, tuple | list) and any(isinstance(s, np.integer | torch.Tensor) for s in result):
            why = ": return Python ints (int(...) of each NumPy or torch integer)"
        return [f"returned {result!r}: expected a tuple of ints, one stride per dimension "
                f"(like t.stride()){why}"]
    result = tuple(result)
    if result == expected:
        return []
    if len(result) != len(shape):
        return [f"returned {len(result)} strides for a {len(shape)}-dimensional shape {shape}: "
                f"one stride per dimension"]
    if result == _column_major(shape):
        return [f"returned {result}: these are column-major (Fortran order) strides, where the FIRST "
                f"dimension moves fastest. Row-major (C order, PyTorch's default) gives the LAST dimension "
                f"stride 1 and each dimension the product of the sizes after it; expected {expected}"]
    with_own = tuple(s * d for s, d in zip(expected, shape))
    if result == with_own:
        return [f"returned {result}: each stride is the product of the sizes AFTER its dimension, not "
                f"including its own size; expected {expected}"]
    return [f"returned {result}, expected {expected}"]


def _strides_cases(gen):
    fixed = [((), "0-d tensor: no dimensions, no strides"), ((1,), "one element"), ((7,), "1-D"),
             ((4, 3, 5), "the example"), ((5, 1, 3), "a size-1 dimension in the middle"),
             ((3, 4, 1), "a trailing size-1 dimension"), ((1, 1, 1, 1), "all ones")]
    for shape, label in fixed:
        yield Case(label, (shape,), _row_major(shape), verify=_verify_strides)
    # 7 x 2^70 elements: no memory holds a tensor or an array of this shape (NumPy refuses it as "too big",
    # torch's storage size overflows), so only strides computed from the sizes answer it
    huge = (2 ** 40, 2 ** 30, 7)
    yield Case(f"{huge}: 7 x 2^70 elements, more than any memory holds: compute the strides from the sizes "
               "alone, never by making a tensor or array of the shape", (huge,), (2 ** 30 * 7, 7, 1),
               verify=_verify_strides)
    for _ in range(4):
        ndim = int(torch.randint(2, 6, (1,), generator=gen))
        shape = tuple(int(s) for s in torch.randint(1, 9, (ndim,), generator=gen))
        yield Case(f"random {ndim}-D shape", (shape,), _row_major(shape), verify=_verify_strides)


# --- views: 01.transpose_view and 01.broadcast_view ---------------------------------------------

# A NumPy array has at most 64 dimensions (32 before NumPy 2), a tensor more: a view of 65 is built from
# t's sizes and strides, never by asking a NumPy array that stands in for t (np.ndarray(..., strides=...)
# then .T, .mT or np.nditer: C code that no check can watch) for the strides.
NUMPY_MAX_DIMS = 64
BEYOND_NUMPY = (f"{NUMPY_MAX_DIMS + 1} dimensions, more than a NumPy array can have ({NUMPY_MAX_DIMS}): "
                "compute the view from t.shape and t.stride() yourself, without a NumPy array")


def _beyond_numpy(first: int, last: tuple[int, ...]) -> tuple[int, ...]:
    """A shape of NUMPY_MAX_DIMS + 1 dimensions: `first`, then size-1 dimensions, then `last`."""
    return (first, *[1] * (NUMPY_MAX_DIMS - len(last)), *last)


def _on_the_cpu(t: torch.Tensor) -> torch.Tensor:
    """A view of more than 64 dimensions stays on the CPU in both modes: CUDA's kernels take at most 64
    ("only tensors with up to 64 dims are supported"), and the checker's own look at the result runs one.
    A view needs no kernel: the exercise is the same on any device."""
    return t.cpu()


def _view_problems(result, t: torch.Tensor, expected: torch.Tensor, what: str) -> list[str]:
    """Problems of `result` as a view of t equal to `expected`; empty when it is right."""
    if not isinstance(result, torch.Tensor):
        return [f"returned {type(result).__name__}, expected a tensor"]
    if result.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
        return ["the result does not share t's storage: it is a copy (clone, contiguous, torch.empty + "
                "copy_, repeat, ...). A view reuses t's memory; build it with t.as_strided(size, stride, "
                "storage_offset)"]
    if result.dtype != t.dtype:
        return [f"the result has dtype {result.dtype}, t has {t.dtype}: a view keeps the dtype"]
    if tuple(result.shape) != tuple(expected.shape):
        return [f"the result has shape {tuple(result.shape)}, expected {tuple(expected.shape)} ({what})"]
    if result.storage_offset() != expected.storage_offset():
        return [f"the result starts at storage offset {result.storage_offset()}, t starts at "
                f"{t.storage_offset()}: pass t.storage_offset() to as_strided (t may itself be a slice)"]
    problems = []
    for d, (s, got, want) in enumerate(zip(expected.shape, result.stride(), expected.stride())):
        if s == 1 or got == want:  # the stride of a size-1 dimension is never used
            continue
        if want == 0:
            problems.append(f"dimension {d} is broadcast (size {s} from a size-1 or missing dimension): "
                            f"its stride must be 0 so that every step along it reads the same elements; "
                            f"got {got}")
        else:
            problems.append(f"dimension {d} has stride {got}, expected {want}")
    if problems:
        return problems + [f"strides {result.stride()}, expected {expected.stride()} "
                           f"(ignoring size-1 dimensions)"]
    if not torch.equal(result, expected):  # cannot differ once shape, strides, offset and storage agree
        return ["the values differ from the expected view"]
    return []


def _transpose_cases(gen):
    m, n = size((1823, 781), (67, 45))
    base = randn((m + 3, 2 * n + 1), gen=gen)
    ints = torch.randint(-100, 100, (3, 4, 5), generator=gen, dtype=torch.int32).to(current().device)
    inputs = [
        ("1 x 1", randn((1, 1), gen=gen), 0, 1),
        ("2-D, odd sizes", randn((m, n), gen=gen), 0, 1),
        ("2-D, dims given as (1, 0)", randn((m, n), gen=gen), 1, 0),
        ("3-D, first and last dims", randn((3, 5, 7), gen=gen), 0, 2),
        # before any case that an ndarray's .T (all axes reversed) gets wrong: a NumPy answer learns why here
        (f"{BEYOND_NUMPY}; dims 0 and {NUMPY_MAX_DIMS - 1}",
         _on_the_cpu(randn(_beyond_numpy(2, (3, 4)), gen=gen)), 0, NUMPY_MAX_DIMS - 1),
        ("4-D, negative dims (-1 is the last)", randn((2, 3, 4, 5), gen=gen), 1, -1),
        ("dim0 == dim1: nothing moves", randn((4, 6), gen=gen), 1, 1),
        ("a slice with an offset: t[3:, 1::2]", base[3:, 1::2], 0, 1),
        ("an already transposed tensor", randn((n, m), gen=gen).t(), 0, 1),
        ("int32, 3-D, middle and last dims", ints, 1, 2),
    ]
    for label, t, d0, d1 in inputs:
        expected = t.transpose(d0, d1)
        yield Case(label, (t, d0, d1), expected,
                   verify=lambda r, c: _view_problems(r, c.args[0], c.expected, "transposed shape"))


def _broadcast_cases(gen):
    m, n = size((1823, 781), (67, 45))
    wide = randn((m, n + 5), gen=gen)
    inputs = [  # the first case fails gracefully (no out-of-storage view) for a stride mistake
        ("a column sliced out of a wider tensor, offset 2: wide[:, 2:3]", wide[:, 2:3], (m, 7)),
        ("(1,) to (5,)", randn((1,), gen=gen), (5,)),
        ("a row (1, N) to (M, N)", randn((1, n), gen=gen), (m, n)),
        ("a column (M, 1) to (M, N)", randn((m, 1), gen=gen), (m, n)),
        ("(N,) to (M, N): a new leading dimension", randn((n,), gen=gen), (m, n)),
        ("(3, 1, 4) to (2, 3, 5, 4): new leading and middle", randn((3, 1, 4), gen=gen), (2, 3, 5, 4)),
        ("same shape: nothing broadcast", randn((4, 6), gen=gen), (4, 6)),
        ("size-1 dim kept at size 1", randn((1, 6), gen=gen), (1, 6)),
        # a row whose elements are 3 apart: a view that takes the last stride for 1 fails here only
        ("a row of a transposed tensor, t.t()[1:2]: strides (1, 3), offset 1", randn((n, 3), gen=gen).t()[1:2],
         (3, n)),
        ("scalar-like (1, 1) to (2, 3, 4)", randn((1, 1), gen=gen), (2, 3, 4)),
        (f"(3, 1, 4) to {BEYOND_NUMPY}", _on_the_cpu(randn((3, 1, 4), gen=gen)), _beyond_numpy(2, (3, 5, 4))),
    ]
    for label, t, shape in inputs:
        yield Case(label, (t, shape), t.expand(shape),
                   verify=lambda r, c: _view_problems(r, c.args[0], c.expected, f"broadcast to {c.args[1]}"))
    # Shapes t cannot be broadcast to (t.expand raises). The first fits in the storage of the wider tensor
    # it is sliced from, so as_strided with t's strides kept returns a view (of the wrong elements) rather
    # than failing by itself; stride 0 wherever the sizes differ returns one in every case.
    refused = [
        ("(M, 3) sliced out of a wider tensor to (M, 4): a dimension of 3 cannot become 4", wide[:, :3], (m, 4)),
        ("(3, 4) to (3, 1): a dimension of 4 cannot shrink to 1", randn((3, 4), gen=gen), (3, 1)),
        ("(2, 3) to (3,): fewer dimensions than t", randn((2, 3), gen=gen), (3,)),
    ]
    for label, t, shape in refused:
        yield Case(label, (t, shape), None, raises=ValueError)


# --- numbers: 01.matmul_intensity and 01.attainable_flops ---------------------------------------

def _close(a, b, rtol=1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=0.0)


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _returned(result, expected) -> str:
    """"returned X, expected Y" with enough digits to tell them apart: a float32 result agrees with the
    answer to 6 digits but not to the check's relative 1e-9."""
    shown = f"returned {result:.6g}, expected {expected:.6g}"
    if f"{float(result):.6g}" == f"{float(expected):.6g}":
        rel = abs(float(result) - expected) / abs(expected) if expected else abs(float(result))
        shown = (f"returned {float(result)!r}, expected {float(expected)!r} (relative difference {rel:.1e}: "
                 "computed in float32, or rounded? compute in Python floats or float64)")
    return shown


def _verify_intensity(result, case: Case) -> list[str]:
    M, N, K, b = case.args
    expected = case.expected
    if not _is_number(result):
        return [f"returned {result!r}: expected a float (FLOP per byte)"]
    if _close(result, expected):
        return []
    flops = 2 * M * N * K
    diagnoses = [
        (flops / ((M * K + K * N) * b), "counts the reads of A and B but not the bytes of the output: "
                                        "C (M x N elements) must be written to memory too"),
        (M * N * K / ((M * K + K * N + M * N) * b), "a multiply-add is 2 FLOPs: the FLOP count is 2*M*N*K"),
        (flops / (M * K + K * N + M * N), "divides by elements, not bytes: multiply the element count "
                                          "by bytes_per_element"),
        (flops / (M * K + K * N + M * N) / b ** 2, "multiplies by bytes_per_element twice"),
        (flops / (3 * M * N * b), "assumes square matrices: A has M*K elements, B K*N, C M*N"),
        (flops // ((M * K + K * N + M * N) * b), "uses integer division //: use /"),
    ]
    for wrong, why in diagnoses:
        if _close(result, wrong):
            return [f"returned {result:.6g}, expected {expected:.6g}: {why}"]
    return [_returned(result, expected)]


def _intensity_cases(gen):
    fixed = [((1, 1, 1, 4), "1 x 1 x 1, fp32"), ((4096, 4096, 4096, 2), "4096^3 bf16"),
             ((1, 4096, 4096, 2), "matrix-vector (M = 1), bf16"), ((16, 8192, 4096, 1), "16 rows, int8/fp8"),
             ((8192, 128, 4096, 4), "tall and thin, fp32"), ((1823, 781, 67, 2), "odd sizes, fp16")]
    for (M, N, K, b), label in fixed:
        yield Case(label, (M, N, K, b), 2 * M * N * K / ((M * K + K * N + M * N) * b),
                   verify=_verify_intensity)
    for _ in range(3):
        M, N, K = (int(x) for x in torch.randint(1, 10000, (3,), generator=gen))
        b = (1, 2, 4, 8)[int(torch.randint(0, 4, (1,), generator=gen))]
        yield Case("random sizes", (M, N, K, b), 2 * M * N * K / ((M * K + K * N + M * N) * b),
                   verify=_verify_intensity)


def _verify_attainable(result, case: Case) -> list[str]:
    intensity, peak, bw = case.args
    expected = case.expected
    if not _is_number(result):
        return [f"returned {result!r}: expected a float (FLOP/s)"]
    if _close(result, expected):
        return []
    memory = intensity * bw
    lower = "attainable is the LOWER of the two roofs: min(peak_flops, intensity * peak_bytes_per_s)"
    if _close(result, memory) and memory > peak:
        return [f"returned {result:.6g}, expected {expected:.6g}: that is intensity * bandwidth, above the "
                f"compute ceiling peak_flops = {peak:.6g}; {lower}"]
    if _close(result, peak) and peak > memory:
        return [f"returned {result:.6g}, expected {expected:.6g}: that is peak_flops, above the memory roof "
                f"intensity * peak_bytes_per_s = {memory:.6g}; {lower}"]
    if _close(result, min(peak, intensity / bw)) or _close(result, min(peak, bw / intensity)):
        return [f"returned {result:.6g}, expected {expected:.6g}: the memory roof is intensity (FLOP/byte) "
                f"TIMES bandwidth (byte/s), which gives FLOP/s"]
    return [_returned(result, expected)]


def _attainable_cases(gen):
    a100, h100 = (312e12, 2.039e12), (989e12, 3.35e12)
    fixed = [
        (0.125, *h100, "ReLU fp32 on an H100: memory-bound"),
        (2000.0, *h100, "a large bf16 matmul on an H100: compute-bound"),
        (a100[0] / a100[1], *a100, "exactly at the A100's ridge point"),
        (0.5, *a100, "ReLU int8 on an A100"),
        (1e-3, 1e12, 1e9, "a tiny device"),
    ]
    for intensity, peak, bw, label in fixed:
        yield Case(label, (intensity, peak, bw), min(peak, intensity * bw), verify=_verify_attainable)
    for _ in range(4):
        intensity = float(10 ** (torch.rand(1, generator=gen) * 6 - 2))
        peak = float(10 ** (torch.rand(1, generator=gen) * 3 + 12))
        bw = float(10 ** (torch.rand(1, generator=gen) * 2 + 11))
        yield Case("random device and intensity", (intensity, peak, bw), min(peak, intensity * bw),
                   verify=_verify_attainable)


register(Exercise(
    "01.contiguous_strides", "row-major strides", "contiguous_strides(shape)", _strides_cases, kernel=False,
    forbidden_ops=CREATION_OPS, forbidden_calls=STRIDE_HELPERS, call_message=HELPER_MESSAGE,
    hint={"wrong": "walk the shape from the last dimension to the first: the last stride is 1, and each "
                   "earlier stride is the later stride times the later size",
          "host": "making a tensor of that shape and reading its .stride() asks PyTorch for the answer: compute "
                  "the strides from the shape alone, with a loop over its sizes"}))
register(Exercise(
    "01.transpose_view", "a transpose built with as_strided", "transpose_view(t, dim0, dim1)",
    _transpose_cases, kernel=False, forbidden_ops=TRANSPOSE_OPS, forbidden_calls=TRANSPOSE_HELPERS,
    call_message=HELPER_MESSAGE,
    hint={"wrong": "take list(t.shape) and list(t.stride()), swap entries dim0 and dim1 in both (after turning "
                   "negative dims into positive ones: dim % t.dim()), and return t.as_strided(size, stride, "
                   "t.storage_offset())",
          "host": "t.T, t.t(), transpose, permute, movedim and swapaxes build the view for you: build it "
                  "yourself with t.as_strided(size, stride, t.storage_offset())",
          "input": "a view never changes t: read t.shape and t.stride(), call t.as_strided, and modify nothing "
                   "in place (no t.as_strided_, no resize_)"}))
register(Exercise(
    "01.broadcast_view", "a broadcast built with as_strided", "broadcast_view(t, shape)", _broadcast_cases,
    kernel=False, forbidden_ops=EXPAND_OPS, forbidden_calls=EXPAND_HELPERS, call_message=HELPER_MESSAGE,
    hint={"wrong": "line t's dimensions up with the LAST len(t.shape) entries of shape; new leading dimensions "
                   "and size-1 dimensions that grow get stride 0, the others keep t's stride; keep "
                   "t.storage_offset(); raise ValueError where a dimension of t that is not 1 differs from "
                   "shape's, or shape has fewer dimensions than t",
          "host": "expand, expand_as, broadcast_to and broadcast_tensors build the view for you: build it "
                  "yourself with t.as_strided(shape, strides, t.storage_offset()), stride 0 where it grows",
          "input": "a view never changes t: read its sizes and strides and call t.as_strided; modify nothing "
                   "in place"}))
register(Exercise(
    "01.matmul_intensity", "arithmetic intensity of a matmul", "matmul_intensity(M, N, K, bytes_per_element)",
    _intensity_cases, kernel=False,
    hint={"wrong": "FLOPs: 2*M*N*K. Bytes: A (M*K), B (K*N) read and C (M*N) written, times "
                   "bytes_per_element; return FLOPs / bytes as a float (/, not //)"}))
register(Exercise(
    "01.attainable_flops", "the roofline", "attainable_flops(intensity, peak_flops, peak_bytes_per_s)",
    _attainable_cases, kernel=False,
    hint={"wrong": "two roofs: the compute ceiling peak_flops and the memory roof intensity * "
                   "peak_bytes_per_s (FLOP/byte times byte/s = FLOP/s); an operation gets the lower of the two"}))


# --- self-check questions -------------------------------------------------------------------------
# The answers are never stored: each grader computes its answer from torch or from the roofline maths
# when it runs, so neither this file nor a notebook holds an answer key.

@dataclass
class Question:
    id: str
    text: str  # printed by quiz(id)
    example: str  # what an answer looks like (never the answer)
    grade: Callable[[object], tuple[bool, str]]  # answer -> (right?, feedback)


QUESTIONS: dict[str, Question] = {}


def _letters(answer) -> set[str]:
    if isinstance(answer, str):
        items = [c for c in answer.lower() if c.isalpha()]
    else:
        items = [str(a).strip().lower() for a in answer]
    return set(items)


def _sequence(answer) -> tuple:
    if isinstance(answer, str):
        answer = ast.literal_eval(answer.strip())
    return tuple(int(a) for a in answer)


def _number(answer) -> float:
    if isinstance(answer, str):
        return float(Fraction(answer.strip().replace(" ", "")))
    return float(answer)


def _grade_strides(answer) -> tuple[bool, str]:
    truth = tuple(torch.empty(2, 9, 1).stride())
    got = _sequence(answer)
    if got == truth:
        return True, "right: the last dimension has stride 1, each earlier one the product of the sizes after"
    if got == _column_major((2, 9, 1)):
        return False, "those are column-major strides; PyTorch is row-major: the LAST dimension moves fastest"
    if len(got) != 3:
        return False, "a [2, 9, 1] tensor has three dimensions, so three strides"
    return False, "stride[d] = how many elements one step along dimension d skips = product of sizes after d"


VIEW_OPTIONS: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "a": ("t[1:3, ::2]", lambda t: t[1:3, ::2]),
    "b": ("t.t().reshape(24)", lambda t: t.t().reshape(24)),
    "c": ("t[[0, 2], :]", lambda t: t[[0, 2], :]),
    "d": ("t.diagonal()", lambda t: t.diagonal()),
    "e": ("t.unsqueeze(1).expand(4, 3, 6)", lambda t: t.unsqueeze(1).expand(4, 3, 6)),
    "f": ("t.flip(1)", lambda t: t.flip(1)),
    "g": ("t.reshape(2, 12)", lambda t: t.reshape(2, 12)),
    "h": ("t[:, 1:5].reshape(-1)", lambda t: t[:, 1:5].reshape(-1)),
    "i": ("t.t().unsqueeze(0)", lambda t: t.t().unsqueeze(0)),
}

# Why PyTorch copies, by the kind of operation (the rule, never which option it is).
COPY_RULES = {
    "index": "indexing with a list or tensor of indices always copies, even when the elements it picks "
             "are evenly spaced and one (offset, strides) could describe them",
    "flip": "PyTorch allows no negative strides, so reversing a dimension copies, although a stride of -1 "
            "would describe the result",
    "reshape": "reshape returns a view when one set of strides walks the elements in the new order, and "
               "copies when none can (e.g. flattening a transposed or column-sliced tensor)",
}
VIEW_RULE = ("slicing (steps included), diagonal, unsqueeze, expand (stride 0) and transposes only change "
             "the offset and strides: views")


def _rule(option: str) -> str:
    text = VIEW_OPTIONS[option][0]
    if "[[" in text:
        return "index"
    if "flip" in text:
        return "flip"
    return "reshape"


def _copies() -> set[str]:
    """Options whose result does not share t's storage: PyTorch had to copy."""
    t = torch.arange(24.0).reshape(4, 6)
    ptr = t.untyped_storage().data_ptr()
    return {k for k, (_, fn) in VIEW_OPTIONS.items() if fn(t).untyped_storage().data_ptr() != ptr}


def _grade_views(answer) -> tuple[bool, str]:
    truth, got = _copies(), _letters(answer)
    unknown = got - set(VIEW_OPTIONS)
    if unknown:
        return False, f"there is no option {', '.join(sorted(unknown))}"
    if got == truth:
        why = "; ".join(f"({k}) {COPY_RULES[_rule(k)].split(',')[0]}" for k in sorted(truth))
        return True, f"right: {why}. The others are views: {VIEW_RULE}"
    missed, extra = truth - got, got - truth
    parts = []
    if extra:
        parts.append(f"{len(extra)} of your choices PyTorch returns as a view ({VIEW_RULE}); check with "
                     "result.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()")
    if missed:
        rules = sorted({_rule(k) for k in missed})
        parts.append(f"{len(missed)} more are copies. Remember: " + "; ".join(COPY_RULES[r] for r in rules))
    return False, ". ".join(parts)


def _bound_ops():
    """(text, cost, roof) of the operations in the 'memory- or compute-bound' question."""
    from ..roofline import matmul_cost, relu_cost, softmax_cost

    return {
        "a": ("ReLU of 2^28 fp32 elements", relu_cost(1 << 28, 4), None),
        "b": ("bf16 matmul 8192 x 8192 x 8192", matmul_cost(8192, 8192, 8192, 2), "bf16"),
        "c": ("bf16 matrix-vector product: (1, 8192) @ (8192, 8192)", matmul_cost(1, 8192, 8192, 2), "bf16"),
        "d": ("bf16 matmul 64 x 64 x 64", matmul_cost(64, 64, 64, 2), "bf16"),
        "e": ("fp32 matmul on TF32 tensor cores, 2048 x 2048 x 2048", matmul_cost(2048, 2048, 2048, 4),
              "tf32"),
        "f": ("bf16 (16, 4096) @ (4096, 4096): a decode step for a batch of 16 tokens",
              matmul_cost(16, 4096, 4096, 2), "bf16"),
        "g": ("softmax over the rows of a 4096 x 32768 fp32 matrix", softmax_cost(4096, 32768, 4), None),
    }


def _roof(ceilings, roof):
    from ..roofline import Point

    return Point("", 1.0, 0.0, roof).roof_of(ceilings)


def _grade_bound(answer) -> tuple[bool, str]:
    from ..roofline import device_ceilings

    ceilings = device_ceilings()
    ops = _bound_ops()
    truth = {k for k, (_, cost, roof) in ops.items()
             if ceilings.bound(cost.intensity, _roof(ceilings, roof)) == "compute"}
    got = _letters(answer)
    unknown = got - set(ops)
    if unknown:
        return False, f"there is no option {', '.join(sorted(unknown))}"
    where = f"on {ceilings.device} ({ceilings.source})"
    if got == truth:
        return True, f"right {where}: intensity above the ridge point means compute-bound"
    ridges = ", ".join(f"{name} {ceilings.ridge(name):.0f}" for name in ceilings.matmul_tflops)
    return False, (f"{len(got ^ truth)} of the {len(ops)} are classified wrong {where}. Work out each "
                   f"intensity (FLOP/byte) and compare it with the ridge point of its roof (FLOP/byte: "
                   f"{ridges}; non-matmul work: the lowest)")


def _grade_add_intensity(answer) -> tuple[bool, str]:
    element = torch.finfo(torch.float16).bits // 8
    truth = 1 / (3 * element)  # one add per element; read x and y, write out
    got = _number(answer)
    if math.isclose(got, truth, rel_tol=2e-3):
        return True, "right: 1 FLOP per element over 3 elements moved"
    if math.isclose(got, 1 / (2 * element), rel_tol=2e-3):
        return False, "you counted the reads; the result is written to memory too"
    if math.isclose(got, 3 * element, rel_tol=2e-3):
        return False, "that is bytes per FLOP; intensity is FLOPs per byte"
    return False, "FLOPs per element divided by bytes moved per element (every tensor read or written)"


def _add(q: Question) -> None:
    QUESTIONS[q.id] = q


_add(Question("01.quiz_strides", "What are the strides of a contiguous tensor of shape [2, 9, 1]?",
              "a tuple like (a, b, c)", _grade_strides))
_add(Question(
    "01.quiz_views",
    "t = torch.arange(24.0).reshape(4, 6). Which of these does PyTorch COPY (the result does not share t's "
    "storage), and why? For each, ask: could one (offset, strides) describe the result, and does PyTorch "
    "return such a view?\n" + "\n".join(f"  ({k}) {text}" for k, (text, _) in VIEW_OPTIONS.items()),
    'a string of letters like "xyz"', _grade_views))
_add(Question(
    "01.quiz_bound",
    "On THIS device (your GPU's measured ceilings; the committed GPU figures in interpreter mode), which of "
    "these are compute-bound? Assume each reads its inputs and writes its output exactly once.\n"
    + "\n".join(f"  ({k}) {text}" for k, (text, _, _) in _bound_ops().items()),
    'a string of letters like "xyz"', _grade_bound))
_add(Question("01.quiz_add_intensity",
              "What is the arithmetic intensity, in FLOP per byte, of out = x + y with x, y and out in fp16?",
              'a number or a fraction string like "3/7"', _grade_add_intensity))


def quiz(question_id: str, answer=None) -> bool | None:
    """Print a self-check question; with an answer, grade it (raises CheckFailed when wrong).

    Returns None while unanswered, True when right. The feedback of a wrong answer hints, it never tells.
    """
    if question_id not in QUESTIONS:
        raise KeyError(f"no question {question_id!r}; there are {', '.join(QUESTIONS)}")
    q = QUESTIONS[question_id]
    if answer is None:
        print(f"{q.id}: {q.text}\nAnswer with {q.example}: replace None by your answer and run the cell "
              "again.")
        return None
    try:
        right, feedback = q.grade(answer)
    except (ValueError, TypeError, SyntaxError):
        raise CheckFailed(f"{q.id}: could not read the answer {answer!r}; answer with {q.example}") from None
    if not right:
        raise CheckFailed(f"{q.id}: not right yet. {feedback}")
    print(f"{q.id}: {feedback}")
    return True
