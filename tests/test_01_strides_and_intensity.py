"""Lesson 01: the solutions pass, plausible wrong answers fail with a pointed message, the roofline maths,
the self-check questions, and the bench's code paths (with a fake timer, so that it runs on a CPU)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from course_utils import bench, roofline
from course_utils.build import ROOT
from course_utils.checks import l01_strides_and_intensity as checks
from course_utils.grading import CheckFailed, check
from course_utils.lessons import l01_strides_and_intensity as sol
from course_utils.mode import Mode, current

SOLUTIONS = {
    "01.contiguous_strides": sol.contiguous_strides,
    "01.transpose_view": sol.transpose_view,
    "01.broadcast_view": sol.broadcast_view,
    "01.matmul_intensity": sol.matmul_intensity,
    "01.attainable_flops": sol.attainable_flops,
}


@pytest.mark.parametrize("exercise", list(SOLUTIONS))
def test_solution_passes(exercise):
    for seed in (0, 1, 2):
        check(exercise, SOLUTIONS[exercise], seed=seed, quiet=True)


def fails(exercise: str, candidate, *needles: str) -> str:
    """Assert that `candidate` fails `exercise` with a message holding every needle; return the message."""
    with pytest.raises(CheckFailed) as info:
        check(exercise, candidate, seed=0, quiet=True)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"
    return message


# --- 01.contiguous_strides ------------------------------------------------------------------------

def test_strides_column_major_is_named():
    def column_major(shape):
        strides, step = [], 1
        for s in shape:
            strides.append(step)
            step *= s
        return tuple(strides)

    fails("01.contiguous_strides", column_major, "column-major", "LAST dimension")


def test_strides_including_own_size():
    def with_own_size(shape):
        return tuple(math.prod(shape[d:]) for d in range(len(shape)))

    fails("01.contiguous_strides", with_own_size, "AFTER its dimension")


def test_strides_from_a_tensor_is_rejected():
    fails("01.contiguous_strides", lambda shape: torch.empty(shape).stride(), "aten.empty", "do yourself")


def test_strides_wrong_type():
    fails("01.contiguous_strides", lambda shape: "1, 1", "tuple of ints")


def test_strides_as_numpy_integers_are_told_to_become_python_ints():
    def with_numpy(shape):
        return tuple(np.cumprod((1, *shape[:0:-1]))[::-1]) if shape else ()

    fails("01.contiguous_strides", with_numpy, "return Python ints")


def test_strides_read_off_a_numpy_array_fail_on_a_shape_no_memory_holds():
    """np.empty(shape).strides answers every shape that fits in memory; (2^40, 2^30, 7) does not fit."""
    def from_numpy(shape):
        return tuple(s for s in np.empty(shape, dtype=np.int8).strides)

    fails("01.contiguous_strides", from_numpy, "more than any memory holds", "array is too big")


def test_strides_from_torchs_own_helper_are_refused():
    def from_prims(shape):
        from torch._prims_common import make_contiguous_strides_for as strides_for
        return tuple(int(s) for s in strides_for(shape)) if shape else ()

    fails("01.contiguous_strides", from_prims, "torch._prims_common.make_contiguous_strides_for",
          "a library's helper")

    def from_flex_attention(shape):  # strides filled from the last dimension to the first: row-major
        from torch._higher_order_ops.flex_attention import _construct_strides
        return tuple(_construct_strides(shape, range(len(shape) - 1, -1, -1)))

    fails("01.contiguous_strides", from_flex_attention,
          "torch._higher_order_ops.flex_attention._construct_strides", "a library's helper")


def test_strides_from_inductors_layout_are_refused_without_the_check_loading_it():
    """Inductor is not loaded with torch, and the check does not load it (seconds): a function that imports
    it and asks FlexibleLayout for the strides is still refused. In a fresh interpreter, where no other
    test has loaded it."""
    script = textwrap.dedent("""
        import sys
        from course_utils.grading import CheckFailed, check
        from course_utils.lessons import l01_strides_and_intensity as solution

        def from_inductor(shape):
            from torch._inductor.ir import FlexibleLayout
            return tuple(int(s) for s in FlexibleLayout.contiguous_strides(shape))

        check("01.contiguous_strides", solution.contiguous_strides, seed=0, quiet=True, course=True)
        assert "torch._inductor.ir" not in sys.modules, "checking the solution loaded Inductor"
        try:
            check("01.contiguous_strides", from_inductor, seed=0, quiet=True)
        except CheckFailed as failed:
            print(failed)
        else:
            print("PASSED")
        """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "torch._inductor.ir.FlexibleLayout.contiguous_strides" in run.stdout, run.stdout
    assert "a library's helper" in run.stdout, run.stdout


def _numpy_over(t):
    """A NumPy int8 array with t's shape and element strides (no memory of t's: only its layout)."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype=np.int8), shape=t.shape, strides=t.stride())


# --- 01.transpose_view ----------------------------------------------------------------------------

def _swapped(t, dim0, dim1):
    size, stride = list(t.shape), list(t.stride())
    size[dim0], size[dim1] = size[dim1], size[dim0]
    stride[dim0], stride[dim1] = stride[dim1], stride[dim0]
    return size, stride


def test_transpose_solution_takes_a_scalar_as_torch_does():
    """torch lets a 0-d tensor be transposed with dims 0 and -1; the solution must not divide by its 0 dims."""
    storage = torch.arange(5.0)
    scalar = storage[3]
    for dim0, dim1 in ((0, 0), (-1, 0), (0, -1)):
        view = sol.transpose_view(scalar, dim0, dim1)
        expected = scalar.transpose(dim0, dim1)
        assert (view.shape, view.stride(), view.storage_offset()) == (expected.shape, (), 3)
        assert view.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr()


def test_transpose_copy_is_rejected():
    def copying(t, dim0, dim1):
        size, stride = _swapped(t, dim0, dim1)
        return t.as_strided(size, stride, t.storage_offset()).clone()

    fails("01.transpose_view", copying, "does not share t's storage", "copy")


def test_transpose_contiguous_copy_is_rejected():
    def copying(t, dim0, dim1):
        return sol.transpose_view(t, dim0, dim1).contiguous()

    fails("01.transpose_view", copying, "copy")


@pytest.mark.parametrize("candidate, op", [
    (lambda t, d0, d1: t.transpose(d0, d1), "aten.transpose"),
    (lambda t, d0, d1: t.swapaxes(d0, d1), "aten.transpose"),
    (lambda t, d0, d1: t.t() if t.dim() == 2 else t.transpose(d0, d1), "aten.t"),
    (lambda t, d0, d1: t.mT if (d0, d1) in ((0, 1), (1, 0)) and t.dim() == 2 else t.transpose(d0, d1),
     "aten.transpose"),
    (lambda t, d0, d1: t.movedim(d0, d1), "aten.permute"),
    (lambda t, d0, d1: t.permute(*[{d0: d1, d1: d0}.get(i, i) for i in range(t.dim())]), "aten.permute"),
])
def test_transpose_builtins_are_rejected(candidate, op):
    fails("01.transpose_view", candidate, op, "do yourself")


def test_transpose_lost_offset():
    def no_offset(t, dim0, dim1):
        size, stride = _swapped(t, dim0, dim1)
        return t.as_strided(size, stride, 0)

    fails("01.transpose_view", no_offset, "storage offset", "t.storage_offset()")


def test_transpose_strides_not_swapped():
    def shape_only(t, dim0, dim1):
        size, _ = _swapped(t, dim0, dim1)
        return t.as_strided(size, t.stride(), t.storage_offset())

    fails("01.transpose_view", shape_only, "has stride")


def test_transpose_with_strides_from_numpy_is_refused():
    def from_numpy(t, dim0, dim1):
        v = np.swapaxes(_numpy_over(t), dim0, dim1)
        return t.as_strided(v.shape, v.strides, t.storage_offset())

    fails("01.transpose_view", from_numpy, "numpy.lib.stride_tricks.as_strided", "a library's helper")


@pytest.mark.parametrize("method", ["swapaxes", "transpose"])
def test_transpose_with_strides_from_an_ndarray_method_is_refused(method):
    """ndarray.swapaxes and ndarray.transpose are methods written in C (no Python code for the profiler's
    "call" event): the check also listens to its "c_call" events."""
    def from_a_method(t, dim0, dim1):
        v = np.ndarray(tuple(t.shape), dtype=np.int8, buffer=bytearray(t.untyped_storage().nbytes() or 1),
                       strides=t.stride())  # 1-byte elements: its strides in bytes are t's in elements
        d0, d1 = dim0 % t.dim(), dim1 % t.dim()
        order = [{d0: d1, d1: d0}.get(i, i) for i in range(t.dim())]
        v = v.swapaxes(dim0, dim1) if method == "swapaxes" else v.transpose(order)
        return t.as_strided(v.shape, v.strides, t.storage_offset())

    fails("01.transpose_view", from_a_method, f"numpy.ndarray.{method}", "a library's helper")


def _int8_array_like(t):
    """An int8 ndarray with t's shape and element strides (1-byte elements: strides in bytes = in elements),
    made by calling the type: no Python or C function call that a profiler sees."""
    return np.ndarray(tuple(t.shape), dtype=np.int8, buffer=bytearray(t.untyped_storage().nbytes() or 1),
                      strides=t.stride())


def _swap_order(t, dim0, dim1):
    d0, d1 = dim0 % t.dim(), dim1 % t.dim()
    return [{d0: d1, d1: d0}.get(i, i) for i in range(t.dim())]


def test_transpose_with_strides_from_np_einsum_is_refused():
    """np.einsum with the subscripts permuted returns a transposed view: NumPy doing the exercise."""
    def from_einsum(t, dim0, dim1):
        v = np.einsum(_int8_array_like(t), list(range(t.dim())), _swap_order(t, dim0, dim1))
        return t.as_strided(v.shape, v.strides, t.storage_offset())

    fails("01.transpose_view", from_einsum, "numpy.einsum", "a library's helper")


def test_transpose_through_an_nditer_fails_on_more_dimensions_than_numpy_has():
    """np.nditer's op_axes permute an array's axes in C code (a type's call and an attribute: nothing the
    check's profiler sees, like ndarray.T): the case of 65 dimensions, which no NumPy array has, fails it."""
    def from_nditer(t, dim0, dim1):
        it = np.nditer((_int8_array_like(t),), flags=["multi_index", "refs_ok", "zerosize_ok"],
                       op_flags=[["readonly"]], op_axes=[_swap_order(t, dim0, dim1)], order="C")
        v = it.itviews[0]
        return t.as_strided(v.shape, v.strides, t.storage_offset())

    fails("01.transpose_view", from_nditer, "65 dimensions, more than a NumPy array can have",
          "maximum supported dimension")


def test_transpose_through_an_ndarrays_T_is_told_numpy_cannot_hold_t():
    """ndarray.T is an attribute written in C (no call for the profiler): right for every 2-D case. The
    case of 65 dimensions comes before any case that .T (all axes reversed) gets wrong, and says why."""
    def from_T(t, dim0, dim1):
        v = _int8_array_like(t).T
        return t.as_strided(v.shape, v.strides, t.storage_offset())

    fails("01.transpose_view", from_T, "case 5/", "more than a NumPy array can have", "without a NumPy array")


# --- 01.broadcast_view ----------------------------------------------------------------------------

@pytest.mark.parametrize("candidate", [
    lambda t, shape: t.expand(shape),
    lambda t, shape: torch.broadcast_to(t, shape),
    lambda t, shape: t.expand_as(torch.empty(shape, device=t.device)),
])
def test_broadcast_builtins_are_rejected(candidate):
    fails("01.broadcast_view", candidate, "aten.expand", "do yourself")


def test_broadcast_copy_is_rejected():
    fails("01.broadcast_view", lambda t, shape: sol.broadcast_view(t, shape).contiguous(), "copy")
    fails("01.broadcast_view", lambda t, shape: sol.broadcast_view(t.clone(), shape),
          "does not share t's storage")


def test_broadcast_needs_stride_zero():
    def kept_strides(t, shape):  # new dims get stride 0, but a growing size-1 dim keeps its stride
        new = len(shape) - t.dim()
        return t.as_strided(shape, [0] * new + list(t.stride()), t.storage_offset())

    fails("01.broadcast_view", kept_strides, "stride must be 0")


def test_broadcast_assuming_the_last_stride_is_1_fails():
    def unit_last(t, shape):  # right for rows whose elements are adjacent, as in a contiguous tensor
        new = len(shape) - t.dim()
        strides = [0] * new + [0 if t.shape[d] == 1 and shape[new + d] != 1
                               else 1 if d == t.dim() - 1 else t.stride(d) for d in range(t.dim())]
        return t.as_strided(tuple(shape), strides, t.storage_offset())

    fails("01.broadcast_view", unit_last, "dimension 1 has stride 1, expected 3")


def _stride_zero_where_sizes_differ(t, shape):
    """Right for every shape t can be broadcast to; for any other it returns a view all the same."""
    new = len(shape) - t.dim()
    strides = [0] * new + [t.stride(d) if t.shape[d] == shape[new + d] else 0 for d in range(t.dim())]
    return t.as_strided(tuple(shape), strides, t.storage_offset())


def test_broadcast_to_a_shape_t_cannot_take_must_be_refused():
    fails("01.broadcast_view", _stride_zero_where_sizes_differ, "a dimension of 3 cannot become 4",
          "must be refused: raise ValueError", "your function returned normally")


def test_broadcast_refused_with_another_exception_says_which_one_is_asked_for():
    def refuses_as_expand_does(t, shape):
        new = len(shape) - t.dim()
        if new < 0 or any(t.shape[d] not in (1, shape[new + d]) for d in range(t.dim())):
            raise RuntimeError(f"the expanded size must match the existing size: {tuple(t.shape)} to {shape}")
        return _stride_zero_where_sizes_differ(t, shape)

    fails("01.broadcast_view", refuses_as_expand_does, "must be refused with ValueError; your function raised "
          "RuntimeError instead", "the expanded size must match")


def test_broadcast_with_strides_from_numpy_is_refused():
    def from_numpy(t, shape):
        v = np.broadcast_to(np.zeros(t.shape, dtype=np.int8), shape)  # stride 0 where it grows, bytes = 1
        strides = [0 if s == 0 else t.stride()[d - v.ndim + t.dim()] for d, s in enumerate(v.strides)]
        return t.as_strided(tuple(shape), strides, t.storage_offset())

    fails("01.broadcast_view", from_numpy, "numpy.broadcast_to", "a library's helper")


def test_broadcast_through_an_nditer_fails_on_more_dimensions_than_numpy_has():
    """What np.broadcast_to runs inside (np.nditer's itviews, C code the profiler never sees), called
    directly: the case of 65 dimensions, which no NumPy array has, fails it."""
    def from_nditer(t, shape):
        it = np.nditer((_int8_array_like(t),), flags=["multi_index", "refs_ok", "zerosize_ok"],
                       op_flags=[["readonly"]], itershape=shape, order="C")
        return t.as_strided(tuple(shape), it.itviews[0].strides, t.storage_offset())

    fails("01.broadcast_view", from_nditer, "65 dimensions, more than a NumPy array can have",
          "maximum supported dimension")


@pytest.mark.parametrize("helper", ["expand", "broadcast_to"])
def test_broadcast_with_torchs_reference_implementation_is_refused(helper):
    """torch._refs.expand and torch._refs.broadcast_to run prims.broadcast_in_dim, not aten.expand."""
    import torch._refs as refs

    fails("01.broadcast_view", lambda t, shape: getattr(refs, helper)(t, shape), "broadcast_in_dim",
          "do yourself")


# --- 01.matmul_intensity and 01.attainable_flops --------------------------------------------------

def test_intensity_without_output_bytes():
    fails("01.matmul_intensity", lambda M, N, K, b: 2 * M * N * K / ((M * K + K * N) * b),
          "output", "written")


def test_intensity_without_factor_two():
    fails("01.matmul_intensity", lambda M, N, K, b: M * N * K / ((M * K + K * N + M * N) * b), "2 FLOPs")


def test_intensity_per_element():
    fails("01.matmul_intensity", lambda M, N, K, b: 2 * M * N * K / (M * K + K * N + M * N),
          "bytes_per_element")


def test_attainable_with_max():
    fails("01.attainable_flops", lambda i, p, bw: max(p, i * bw), "above the memory roof", "LOWER", "min(")


def test_attainable_dividing():
    fails("01.attainable_flops", lambda i, p, bw: min(p, i / bw), "TIMES")


def test_attainable_memory_roof_only():
    fails("01.attainable_flops", lambda i, p, bw: i * bw, "above the compute ceiling", "LOWER")


def test_candidate_exception_is_reported():
    def broken(M, N, K, b):
        raise ValueError("oops")

    fails("01.matmul_intensity", broken, "ValueError: oops")


# --- the roofline maths ---------------------------------------------------------------------------

def test_elementwise_intensities():
    assert roofline.relu_cost(1000, 4).intensity == pytest.approx(1 / 8)
    assert roofline.relu_cost(1000, 1).intensity == pytest.approx(1 / 2)
    assert roofline.add_cost(1000, 4).intensity == pytest.approx(1 / 12)
    assert roofline.softmax_cost(10, 100, 4).n_bytes == 2 * 1000 * 4


@pytest.mark.parametrize("n, b", [(1, 4), (64, 2), (4096, 2), (8192, 4)])
def test_square_matmul_intensity(n, b):
    cost = roofline.matmul_cost(n, n, n, b)
    assert cost.flops == 2 * n**3
    assert cost.intensity == pytest.approx(2 * n / (3 * b))
    assert cost.intensity == pytest.approx(sol.matmul_intensity(n, n, n, b))


def test_attainable_and_ridge():
    peak, bw = 1000e12, 4e12
    ridge = roofline.ridge_point(peak, bw)
    assert ridge == pytest.approx(250)
    assert roofline.attainable(1.0, peak, bw) == pytest.approx(bw)  # memory roof
    assert roofline.attainable(1e4, peak, bw) == pytest.approx(peak)  # flat roof
    assert roofline.attainable(ridge, peak, bw) == pytest.approx(peak)  # the roofs meet
    assert roofline.bound(ridge / 2, peak, bw) == "memory"
    assert roofline.bound(ridge * 2, peak, bw) == "compute"
    xs = np.logspace(-2, 4, 7)
    curve = roofline.attainable(xs, peak, bw)
    assert isinstance(curve, np.ndarray) and np.all(np.diff(curve) >= 0) and curve.max() == peak
    for x in (0.1, ridge, 1e4):  # the library and the exercise agree
        assert roofline.attainable(x, peak, bw) == pytest.approx(sol.attainable_flops(x, peak, bw))


def test_ceilings():
    c = roofline.Ceilings("gpu", 2000.0, {"bf16": 500.0, "tf32": 250.0})
    assert c.roof() == "bf16" and c.peak() == 500e12 and c.bandwidth == 2e12
    assert c.ridge("tf32") == pytest.approx(125.0)
    assert c.bound(200.0, "bf16") == "memory" and c.bound(200.0, "tf32") == "compute"
    with pytest.raises(KeyError, match="no 'fp8' roof"):
        c.peak("fp8")
    point = roofline.Point("relu", 0.125, 0.125 * 2000e9 / 2e12, None)
    assert point.roof_of(c) == "tf32"  # not a matmul: the lowest roof
    assert point.fraction(c) == pytest.approx(0.5)
    assert "gpu" in c.describe() and "ridge point" in c.describe()


def _table_with_ceilings() -> bench.Table:
    table = bench.Table("01")
    table.add(roofline.COPY_GROUP, "copy 1 GiB fp32 (read+write)", 1.0, n_bytes=3e9)
    table.add(roofline.MATMUL_GROUP, "torch.matmul bf16 8192^3", 2.0, flops=1.2e12)
    table.add(roofline.MATMUL_GROUP, "torch.matmul tf32 8192^3", 4.0, flops=1.2e12)
    cost = roofline.relu_cost(1 << 20, 4)
    table.add("relu fp32 2^20", "torch", 0.004, n_bytes=cost.n_bytes, flops=cost.flops)
    table.add("relu fp32 2^20", "triton (ours)", 0.003, n_bytes=cost.n_bytes, flops=cost.flops)
    cost = roofline.matmul_cost(4096, 4096, 4096, 2)
    table.add("matmul bf16 4096^3", "torch.matmul", 0.25, n_bytes=cost.n_bytes, flops=cost.flops)
    table.add("relu fp32 2^20", "copy (no FLOPs: not a point)", 0.002, n_bytes=cost.n_bytes)
    return table


def test_results_round_trip(tmp_path):
    data = json.loads(json.dumps(_table_with_ceilings().to_json()))  # as a results file holds it
    c = roofline.ceilings_from_results(data)
    assert c.copy_gbps == pytest.approx(3000.0)
    assert c.matmul_tflops == pytest.approx({"bf16": 600.0, "tf32": 300.0})
    points = {p.label: p for p in roofline.points_from_rows(data)}
    assert set(points) == {"relu fp32 2^20", "matmul bf16 4096^3"}
    assert points["relu fp32 2^20"].intensity == pytest.approx(1 / 8)
    assert points["relu fp32 2^20"].tflops == pytest.approx((1 << 20) / 0.003e-3 / 1e12)  # the faster row
    assert points["matmul bf16 4096^3"].intensity == pytest.approx(2 * 4096 / 6)
    assert points["matmul bf16 4096^3"].roof == "bf16"
    assert "memory" in roofline.format_points(points.values(), c)
    fig = roofline.plot_results(data, tmp_path / "roof.png")
    assert (tmp_path / "roof.png").stat().st_size > 10_000
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_results_without_ceilings():
    with pytest.raises(ValueError, match="no ceilings"):
        row = {"group": "x", "name": "y", "ms": 1.0, "gbps": 1.0, "tflops": 1.0}
        roofline.ceilings_from_results({"rows": [row]})


def test_anchor_fallback(monkeypatch):
    monkeypatch.setattr(bench, "load_results", lambda lesson: None)
    data = roofline.reference_results()
    assert data is roofline.ANCHOR_RESULTS and "H200" in data["source"]
    c = roofline.ceilings_from_results(data)
    assert c.bound(roofline.relu_cost(1 << 28, 4).intensity) == "memory"
    assert c.bound(roofline.matmul_cost(8192, 8192, 8192, 2).intensity, "bf16") == "compute"
    for p in roofline.points_from_rows(data):  # each anchor point's intensity matches its cost model
        if p.label.startswith("softmax"):
            assert p.intensity == pytest.approx(roofline.softmax_cost(1, 1, 4).intensity)
        else:
            n = int(p.label.split()[2].split("^")[0])
            cost = roofline.matmul_cost(n, n, n, 2 if p.roof == "bf16" else 4)
            assert p.intensity == pytest.approx(cost.intensity)


def test_committed_results_win(monkeypatch):
    data = _table_with_ceilings().to_json()
    monkeypatch.setattr(bench, "load_results", lambda lesson: data)
    assert roofline.reference_results() is data
    assert roofline.reference_ceilings().copy_gbps == pytest.approx(3000.0)


def test_measure_ceilings_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Fake GPU 80GB")
    cached = roofline.Ceilings("Fake GPU 80GB", 1234.0, {"bf16": 100.0}, "measured earlier")
    path = roofline.write_cache(cached, tmp_path)
    roofline.write_cache(roofline.Ceilings("Other GPU", 1.0, {"bf16": 1.0}), tmp_path)
    assert set(json.loads(path.read_text())) == {"Fake GPU 80GB", "Other GPU"}
    assert roofline.measure_ceilings(cache_dir=tmp_path) == cached  # read back, nothing measured


def test_measure_ceilings_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="reference_ceilings"):
        roofline.measure_ceilings()


def test_bench_code_paths_with_a_fake_timer(monkeypatch, tmp_path):
    """Every timed operation of benches/l01 runs (and is checked) at tiny sizes; the timer is faked."""
    from course_utils.benches import l01_strides_and_intensity as l01

    monkeypatch.setattr(bench, "current", lambda: Mode("gpu", current().device, "fake timer"))
    monkeypatch.setattr(bench, "do_bench", lambda fn, **kwargs: (fn(), 0.01)[1])
    table = _table_with_ceilings()
    tiny = l01.Sizes(3000, (256, 1024), ((5, 70),), (8, 32), (16,), (1, 4), 64)
    l01.time_operations(table, tiny, device=current().device, roofs=("bf16", "tf32"))
    groups = {r.group for r in table.rows}
    for expected in ("relu fp32 3000", "relu int8 3000", "vector add fp32 3000", "softmax fp32 5x70",
                     "matmul bf16 32^3", "matmul bf16 1x64x64 (GEMV)", "matmul tf32 16^3"):
        assert expected in groups
    assert any(r.name == "triton (ours) BLOCK=256" for r in table.rows)
    points = {p.label: p for p in roofline.points_from_rows(table.rows)}
    assert points["relu int8 3000"].intensity == pytest.approx(1 / 2)
    assert points["vector add fp32 3000"].intensity == pytest.approx(1 / 12)
    roofline.plot_results(table.to_json(), tmp_path / "01_roofline.png")


# --- self-check questions -------------------------------------------------------------------------

def test_quiz_unanswered_prints_the_question(capsys):
    for qid in checks.QUESTIONS:
        assert checks.quiz(qid) is None
    out = capsys.readouterr().out
    assert "[2, 9, 1]" in out and "replace None" in out


def test_quiz_strides():
    truth = tuple(torch.empty(2, 9, 1).stride())
    assert checks.quiz("01.quiz_strides", truth) is True
    assert checks.quiz("01.quiz_strides", str(truth)) is True
    wrong = tuple(reversed(truth))
    with pytest.raises(CheckFailed) as info:
        checks.quiz("01.quiz_strides", wrong)
    assert str(truth) not in str(info.value)


def test_quiz_views():
    t = torch.arange(24.0).reshape(4, 6)  # a view of arange's result: views keep that base
    copies = {k for k, (_, fn) in checks.VIEW_OPTIONS.items() if fn(t)._base is None}
    assert copies and copies != set(checks.VIEW_OPTIONS)
    assert checks.quiz("01.quiz_views", "".join(sorted(copies))) is True
    assert checks.quiz("01.quiz_views", ", ".join(sorted(copies)).upper()) is True
    with pytest.raises(CheckFailed) as info:
        checks.quiz("01.quiz_views", "".join(sorted(copies))[1:])
    assert "1 more are copies" in str(info.value)
    for k in copies:
        assert f"({k})" not in str(info.value)
    with pytest.raises(CheckFailed, match="no option z"):
        checks.quiz("01.quiz_views", "z")


def test_quiz_views_teaches_why_pytorch_copies():
    """Fancy indexing and flip copy although (offset, strides) could describe them: the question asks
    what PyTorch copies, and the feedback gives the rule a student missed."""
    t = torch.arange(24.0).reshape(4, 6)
    rows = t[[0, 2], :]
    assert torch.equal(rows, t.as_strided((2, 6), (12, 1))), "describable by strides, yet a copy"
    copies = checks._copies()
    index = next(k for k, (text, _) in checks.VIEW_OPTIONS.items() if "[[" in text)
    flip = next(k for k, (text, _) in checks.VIEW_OPTIONS.items() if "flip" in text)
    assert {index, flip} <= copies
    for left_out, rule in ((index, "list or tensor of indices always copies"), (flip, "no negative strides")):
        with pytest.raises(CheckFailed, match=rule):
            checks.quiz("01.quiz_views", "".join(sorted(copies - {left_out})))
    with pytest.raises(CheckFailed, match="returns as a view"):
        checks.quiz("01.quiz_views", "".join(sorted(copies | {"a"})))


def test_quiz_bound():
    c = roofline.device_ceilings()
    compute = {k for k, (_, cost, roof) in checks._bound_ops().items()
               if cost.intensity >= c.ridge(checks._roof(c, roof))}
    assert "b" in compute and "a" not in compute  # a big matmul and ReLU, on any device
    assert checks.quiz("01.quiz_bound", "".join(sorted(compute))) is True
    with pytest.raises(CheckFailed, match="classified wrong"):
        checks.quiz("01.quiz_bound", "a")


def test_quiz_add_intensity():
    element = torch.tensor([], dtype=torch.float16).element_size()
    assert checks.quiz("01.quiz_add_intensity", 1 / (3 * element)) is True
    assert checks.quiz("01.quiz_add_intensity", f"1/{3 * element}") is True
    with pytest.raises(CheckFailed, match="written to memory too"):
        checks.quiz("01.quiz_add_intensity", 1 / (2 * element))
    with pytest.raises(CheckFailed, match="could not read"):
        checks.quiz("01.quiz_add_intensity", "one sixth")


def test_no_answer_key_in_the_notebook_sources():
    truth = str(tuple(torch.empty(2, 9, 1).stride()))
    for path in (ROOT / "notebooks" / "src" / "01_strides_and_intensity.py",
                 ROOT / "course_utils" / "lessons" / "l01_strides_and_intensity.py"):
        text = path.read_text()
        assert truth not in text and truth.replace(" ", "") not in text, path


def test_intensity_in_float32_says_the_digits_differ():
    """A float32 result agrees with the answer to the 6 digits a message shows: it shows enough to differ."""
    import numpy as np

    def intensity32(M, N, K, bytes_per_element):
        return float(np.float32(2 * M * N * K) / np.float32((M * K + K * N + M * N) * bytes_per_element))

    with pytest.raises(CheckFailed) as info:
        check("01.matmul_intensity", intensity32, seed=0, quiet=True)
    message = str(info.value)
    assert "relative difference" in message and "float32" in message, message
