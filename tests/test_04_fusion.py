"""Lesson 04: the solutions pass their checks, plausible wrong answers fail with messages that point at
the mistake, and the napkin maths and the lesson's trace/code helpers do what they say."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from course_utils.benches import l04_fusion as bench04
from course_utils.grading import check
from course_utils.lessons.l04_fusion import (bytes_moved, silu_mul, silu_mul_kernel, silu_mul_ref, sin4,
                                            sin4_kernel, sin4_ref)
from course_utils.mode import current
from helpers import REMAINDER_MASK, failure, interpreter_only, interpreter_only_because, mutant

# On a GPU an unmasked load past the end of a small input can crash the CUDA context, and every later
# test with it: missing-mask answers are tested in the interpreter, which checks each address first.


# --- the solutions ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("exercise_id, solution", [
    ("04.bytes_moved", bytes_moved), ("04.sin4", sin4), ("04.silu_mul", silu_mul)])
def test_solution_passes(exercise_id, solution, seed):
    check(exercise_id, solution, seed=seed, quiet=True)


@pytest.mark.parametrize("block, warps", [(1024, 4), (4096, 8)])  # the default: 2048
def test_solutions_pass_with_other_block_sizes(block, warps):
    check("04.sin4", lambda x, out: sin4(x, out, BLOCK=block, num_warps=warps), seed=2, quiet=True)
    check("04.silu_mul", lambda g, u, out: silu_mul(g, u, out, BLOCK=block, num_warps=warps), seed=2,
          quiet=True)


@pytest.mark.skipif(current().interpret, reason="2^20 programs of 2048 elements: hours in the interpreter")
def test_sin4_and_silu_mul_past_2_31_elements():
    """2^31 + 1000 fp16 elements (4 GiB a tensor; silu_mul gets x as both g and u): the last programs'
    pid * BLOCK passes int32's 2^31 - 1, and 32-bit offsets wrap to before the tensors' start. "Any shape"
    includes these; the solutions' offsets are 64-bit, as lesson 02's."""
    n = 2**31 + 1000
    x = torch.zeros(n, dtype=torch.float16, device="cuda")
    tail = torch.linspace(-3.0, 3.0, 2000, device="cuda")
    x[-2000:] = tail.half()
    out = torch.full_like(x, float("nan"))
    sin4(x, out)
    want = torch.sin(torch.sin(torch.sin(torch.sin(x[-2000:].float()))))
    assert torch.allclose(out[-2000:].float(), want, atol=2e-3) and bool((out[:4] == 0).all())
    out.fill_(float("nan"))
    silu_mul(x, x, out)
    want = F.silu(x[-2000:].float()) * x[-2000:].float()
    assert torch.allclose(out[-2000:].float(), want, atol=2e-3, rtol=2e-3) and bool((out[:4] == 0).all())


# --- 04.bytes_moved: wrong answers ------------------------------------------------------------

def test_bytes_forgetting_the_write_fails():
    def reads_only(n_elements, bytes_per_element, n_ops, fused):
        return n_elements * bytes_per_element * (1 if fused else n_ops)

    failure("04.bytes_moved", reads_only, "half", "forget the write")


def test_bytes_fused_still_counting_every_op_fails():
    def no_fusion(n_elements, bytes_per_element, n_ops, fused):
        return 2 * n_ops * n_elements * bytes_per_element

    failure("04.bytes_moved", no_fusion, "unfused traffic", "intermediates stay in registers")


def test_bytes_float_result_fails():
    def as_float(n_elements, bytes_per_element, n_ops, fused):
        return 2.0 * n_elements * bytes_per_element * (1 if fused else n_ops)

    failure("04.bytes_moved", as_float, "return an int")


# --- 04.sin4: wrong answers -------------------------------------------------------------------

@triton.jit
def _sin4_no_mask_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets).to(tl.float32)
    tl.store(out_ptr + offsets, tl.sin(tl.sin(tl.sin(tl.sin(x)))))


def sin4_no_mask(x, out):
    _sin4_no_mask_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)


@triton.jit
def _sin_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, tl.sin(x), mask=mask)


def sin4_four_kernels(x, out):
    """Right numbers, four launches: what eager PyTorch does."""
    n = x.numel()
    grid = (triton.cdiv(n, 1024),)
    _sin_kernel[grid](x, out, n, BLOCK=1024)
    for _ in range(3):
        _sin_kernel[grid](out, out, n, BLOCK=1024)


@triton.jit
def _sin3_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, tl.sin(tl.sin(tl.sin(x))), mask=mask)


def sin4_three_sins(x, out):
    _sin3_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)


@triton.jit
def _sin4_no_cast_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)  # fp16 stays fp16: tl.sin refuses it
    tl.store(out_ptr + offsets, tl.sin(tl.sin(tl.sin(tl.sin(x)))), mask=mask)


def sin4_no_cast(x, out):
    _sin4_no_cast_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)


def sin4_rows_only(x, out):
    """Launches over x.shape[0] instead of x.numel(): fine in 1-D, misses most of a 2-D tensor."""
    n = x.shape[0]
    sin4_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)


def sin4_with_torch(x, out):
    out.copy_(torch.sin(torch.sin(torch.sin(torch.sin(x)))))


@interpreter_only
def test_sin4_missing_mask_fails():
    failure("04.sin4", sin4_no_mask, "out of bounds", "Is a mask missing")


def test_sin4_four_launches_fails_as_not_one_kernel():
    failure("04.sin4", sin4_four_kernels, "launched 4 kernels", "one kernel")


def test_sin4_three_sins_fails_on_values():
    failure("04.sin4", sin4_three_sins, "differ beyond")


def test_sin4_without_fp32_cast_reports_the_dtype():
    failure("04.sin4", sin4_no_cast, "float16", "fp32")


def test_sin4_launching_over_rows_misses_elements():
    failure("04.sin4", sin4_rows_only, "never written", "2-D")


@pytest.mark.parametrize("exercise_id, name, line", [
    ("04.sin4", "sin4", "    mask = offsets < n_elements  # the last block is partial\n"),
    ("04.silu_mul", "silu_mul", "    mask = offsets < n_elements\n    g = tl.load"),
], ids=["sin4", "silu_mul"])
def test_a_mask_from_the_remainder_fails_where_the_last_block_is_full(exercise_id, name, line):
    """Lesson 02's WHOLE_BLOCKS case again: in the interpreter every other length is no multiple of any block
    (on a GPU sin4's 2^20 arguments up to +-50 come first, also whole blocks)."""
    wrong = mutant("l04_fusion", name, (line, line.replace("offsets < n_elements", REMAINDER_MASK)))
    first = "up to +-50" if exercise_id == "04.sin4" and current().gpu else "a multiple of every block size"
    failure(exercise_id, wrong, first, "elements were never written")


def test_sin4_in_torch_fails():
    failure("04.sin4", sin4_with_torch, "no Triton kernel was launched", "torch")


# --- 04.silu_mul: wrong answers ---------------------------------------------------------------

@triton.jit
def _silu_mul_no_mask_kernel(g_ptr, u_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(g_ptr + offsets).to(tl.float32)
    u = tl.load(u_ptr + offsets).to(tl.float32)
    tl.store(out_ptr + offsets, g * tl.sigmoid(g) * u)


def silu_mul_no_mask(g, u, out):
    _silu_mul_no_mask_kernel[(triton.cdiv(g.numel(), 1024),)](g, u, out, g.numel(), BLOCK=1024)


@triton.jit
def _silu_mul_low_precision_kernel(g_ptr, u_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    g = tl.load(g_ptr + offsets, mask=mask)
    u = tl.load(u_ptr + offsets, mask=mask)
    sigmoid = tl.sigmoid(g.to(tl.float32)).to(g.dtype)  # rounded to fp16/bf16 ...
    tl.store(out_ptr + offsets, g * sigmoid * u, mask=mask)  # ... and the products too


def silu_mul_low_precision(g, u, out):
    _silu_mul_low_precision_kernel[(triton.cdiv(g.numel(), 1024),)](g, u, out, g.numel(), BLOCK=1024)


@triton.jit
def _silu_mul_overflow_kernel(g_ptr, u_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    g = tl.load(g_ptr + offsets, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offsets, mask=mask).to(tl.float32)
    e = tl.exp(g)
    tl.store(out_ptr + offsets, g * (e / (1 + e)) * u, mask=mask)  # inf / inf for g > 88


def silu_mul_overflow(g, u, out):
    _silu_mul_overflow_kernel[(triton.cdiv(g.numel(), 1024),)](g, u, out, g.numel(), BLOCK=1024)


@triton.jit
def _silu_kernel(g_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    g = tl.load(g_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, g * tl.sigmoid(g), mask=mask)


@triton.jit
def _mul_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, a * b, mask=mask)


def silu_mul_two_kernels(g, u, out):
    """Eager's plan in Triton: silu into a temporary, then the product. Two launches, 5 passes."""
    n = g.numel()
    tmp = torch.empty(g.shape, dtype=torch.float32, device=g.device)  # fp32: the numbers stay right
    grid = (triton.cdiv(n, 1024),)
    _silu_kernel[grid](g, tmp, n, BLOCK=1024)
    _mul_kernel[grid](tmp, u, out, n, BLOCK=1024)


def silu_mul_with_torch(g, u, out):
    out.copy_(F.silu(g) * u)


@interpreter_only
def test_silu_mul_missing_mask_fails():
    failure("04.silu_mul", silu_mul_no_mask, "out of bounds", "Is a mask missing")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_silu_mul_sigmoid_in_low_precision_fails(seed):
    failure("04.silu_mul", silu_mul_low_precision, "float16", "differ beyond", "fp32", seed=seed)


def test_silu_mul_exp_overflow_fails_with_nan():
    message = str(failure("04.silu_mul", silu_mul_overflow, "large |g|", "got nan", "exp(g) / (1 + exp(g))"))
    assert "of them NaN" in message and "error nan" not in message, message  # a NaN's error is infinite


def test_silu_mul_two_kernels_fails_as_not_one_kernel():
    failure("04.silu_mul", silu_mul_two_kernels, "launched 2 kernels", "one kernel")


@triton.jit
def _sin4_through_memory(x_ptr, t_ptr, o_ptr, n, BLOCK: tl.constexpr):
    """One launch, but each sine stored to t and loaded back: 4 x the traffic of the fused kernel."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(t_ptr + offs, tl.sin(tl.load(x_ptr + offs, mask=m).to(tl.float32)), mask=m)
    for _ in tl.static_range(2):
        tl.store(t_ptr + offs, tl.sin(tl.load(t_ptr + offs, mask=m)), mask=m)
    tl.store(o_ptr + offs, tl.sin(tl.load(t_ptr + offs, mask=m)), mask=m)


@triton.jit
def _silu_mul_through_memory(g_ptr, u_ptr, t_ptr, o_ptr, n, BLOCK: tl.constexpr):
    """One launch, but silu(g) stored to t and loaded back, as F.silu and a separate multiply would."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m).to(tl.float32)
    tl.store(t_ptr + offs, g * tl.sigmoid(g), mask=m)
    s = tl.load(t_ptr + offs, mask=m) * tl.load(u_ptr + offs, mask=m).to(tl.float32)
    tl.store(o_ptr + offs, s.to(o_ptr.dtype.element_ty), mask=m)


# made once, before any call; room for the largest case (2^22 + 3 elements on a GPU): a kernel that wrote past
# it would break the CUDA context of every later test in the process
_KEPT = torch.empty(1 << 23, device=current().device)


def _through_memory(kept: bool):
    """sin4 and silu_mul whose intermediate goes through a buffer: made in each call, or kept from call to
    call (made before any, so that no allocation of the call holds it)."""
    def scratch(like):
        return _KEPT if kept else torch.empty(like.numel(), dtype=torch.float32, device=like.device)

    def sin4(x, out):
        n = x.numel()
        _sin4_through_memory[(triton.cdiv(n, 1024),)](x, scratch(x), out, n, BLOCK=1024)

    def silu_mul(g, u, out):
        n = g.numel()
        _silu_mul_through_memory[(triton.cdiv(n, 1024),)](g, u, scratch(g), out, n, BLOCK=1024)
    return {"04.sin4": sin4, "04.silu_mul": silu_mul}


@pytest.mark.parametrize("exercise_id", ["04.sin4", "04.silu_mul"])
@pytest.mark.parametrize("kept, says", [(False, "allocated a"), (True, "kept from call to call")])
def test_an_intermediate_stored_and_loaded_back_in_the_one_launch_fails(exercise_id, kept, says):
    """The launch count alone passed these: one launch, right values, the intermediate in memory."""
    failure(exercise_id, _through_memory(kept)[exercise_id], says, "never goes to memory", "in registers")


@triton.jit
def _sin4_through_quarters(x_ptr, p0, p1, p2, p3, o_ptr, n, quarter, BLOCK: tl.constexpr):
    """sin4 whose sines go through four buffers of a quarter of the elements each, stored and loaded back."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    part, r = offs // quarter, offs % quarter
    y = tl.sin(tl.load(x_ptr + offs, mask=m).to(tl.float32))
    for _ in tl.static_range(3):
        tl.store(p0 + r, y, mask=m & (part == 0))
        tl.store(p1 + r, y, mask=m & (part == 1))
        tl.store(p2 + r, y, mask=m & (part == 2))
        tl.store(p3 + r, y, mask=m & (part == 3))
        y = tl.sin(tl.load(p0 + r, mask=m & (part == 0), other=0.0) + tl.load(p1 + r, mask=m & (part == 1), other=0.0)
                   + tl.load(p2 + r, mask=m & (part == 2), other=0.0)
                   + tl.load(p3 + r, mask=m & (part == 3), other=0.0))
    tl.store(o_ptr + offs, y, mask=m)


_KEPT_QUARTERS = [torch.empty(1 << 21, device=current().device) for _ in range(4)]  # 2^23 elements in all


@pytest.mark.parametrize("kept, says", [(False, "4 temporaries"), (True, "and 3 more such tensors")])
def test_an_intermediate_split_over_four_buffers_fails(kept, says):
    """Each quarter is below the intermediate's size, one allocation or one storage at a time: it passed."""
    def sin4(x, out):
        n = x.numel()
        quarter = triton.cdiv(n, 4)
        parts = _KEPT_QUARTERS if kept else [torch.empty(quarter, device=x.device) for _ in range(4)]
        _sin4_through_quarters[(triton.cdiv(n, 1024),)](x, *parts, out, n, quarter, BLOCK=1024)

    failure("04.sin4", sin4, says, "never goes to memory", "in registers")


@triton.jit
def _sin4_through_x(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    """x's own memory as the scratch for the sines, and x put back before the kernel ends."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = x.to(tl.float32)
    for _ in tl.static_range(4):
        tl.store(x_ptr + offs, tl.sin(y).to(x.dtype), mask=m)
        y = tl.load(x_ptr + offs, mask=m).to(tl.float32)
    tl.store(x_ptr + offs, x, mask=m)
    tl.store(o_ptr + offs, y, mask=m)


@interpreter_only_because("the interpreter sees each store; a GPU only what x holds afterwards")
def test_an_input_used_as_scratch_and_put_back_fails():
    """No allocation and no buffer but x and out: the intermediate goes through x, which ends as it began."""
    failure("04.sin4", lambda x, out: _sin4_through_x[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024),
            "stored into `x`, an input", "puts back what they held")


def test_silu_mul_in_torch_fails():
    failure("04.silu_mul", silu_mul_with_torch, "no Triton kernel was launched")


# --- the maths --------------------------------------------------------------------------------

def test_bytes_moved_model():
    n, b = 1 << 26, 4
    assert bytes_moved(n, b, 4, fused=False) == 4 * bytes_moved(n, b, 4, fused=True) == 2 * 4 * n * b
    assert bytes_moved(n, b, 1, fused=False) == bytes_moved(n, b, 1, fused=True)  # one op: nothing to fuse
    assert bytes_moved(1, 2, 7, fused=True) == 4
    assert isinstance(bytes_moved(3, 2, 5, fused=False), int)


def test_sin4_ref_is_sin_four_times():
    x = torch.linspace(-10, 10, 1001, dtype=torch.float64)
    assert torch.equal(sin4_ref(x), x.sin().sin().sin().sin())


def test_silu_mul_ref_is_safe_for_large_inputs():
    g = torch.tensor([-1000.0, -100.0, -12.0, 0.0, 12.0, 100.0, 1000.0], dtype=torch.float16)
    u = torch.ones_like(g)
    got = silu_mul_ref(g, u)
    assert torch.isfinite(got).all()
    expected = (g.double() * torch.sigmoid(g.double())).to(torch.float16)
    assert torch.equal(got, expected)  # fp32 maths rounded once matches the exact value rounded once


# --- the lesson's helpers ---------------------------------------------------------------------

INDUCTOR_OUTPUT = """
from torch._inductor.runtime import triton_heuristics
triton_poi_fused_sin_0 = async_compile.triton('triton_poi_fused_sin_0', '''
import triton
import triton.language as tl

@triton_heuristics.pointwise(size_hints={'x': 67108864})
@triton.jit
def triton_poi_fused_sin_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    tmp0 = tl.load(in_ptr0 + (xoffset), None)
    tl.store(out_ptr0 + (xoffset), tl_math.sin(tmp0), None)
''', device_str='cuda')

async_compile.wait(globals())
call = '''not a kernel'''
"""


def test_extract_triton_kernels_finds_the_jit_functions():
    kernels = bench04.extract_triton_kernels(INDUCTOR_OUTPUT)
    assert len(kernels) == 1
    assert kernels[0].startswith("@triton.jit\ndef triton_poi_fused_sin_0(")
    assert kernels[0].rstrip().endswith("None)")


def _event(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_trace_summary_counts_kernels_busy_time_and_gaps(tmp_path):
    events = [_event("cpu_op", "aten::sin", 0, 5), _event("cuda_runtime", "cudaLaunchKernel", 1, 3)]
    events += [_event("kernel", "sin_kernel", 10 + 10 * i, 4) for i in range(4)]  # 4 us busy, 6 us gaps
    events += [{"ph": "i", "cat": "kernel", "name": "marker", "ts": 0}]  # not a complete event
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    summary = bench04.trace_summary(path)
    assert summary["kernels"] == 4 and summary["kernel_names"] == ["sin_kernel"]
    assert summary["busy_us"] == 16 and summary["span_us"] == 34 and summary["idle_us"] == 18
    assert summary["largest_gap_us"] == 6 and summary["launches"] == 1
    assert summary["ops"] == {"aten::sin": 1}
    text = bench04.describe_trace("eager", summary, steps=1)
    assert "4 kernels per call" in text and "busy 16.0 us of a 34.0 us span" in text


def test_profile_to_trace_writes_a_trace_of_the_eager_chain(tmp_path):
    x = torch.randn(256)
    path = bench04.profile_to_trace(lambda: sin4_ref(x), tmp_path / "sub" / "eager.json", steps=2)
    summary = bench04.trace_summary(path)
    assert summary["ops"].get("aten::sin") == 4 * 2  # four sins per call, two profiled calls
    if not torch.cuda.is_available():
        assert summary["kernels"] == 0
        assert "CPU only" in bench04.describe_trace("eager", summary, steps=2)


def test_sin_instruction_reads_ptx():
    assert "approx" in bench04.sin_instruction("  sin.approx.f32 %f2, %f1;")
    assert "libdevice" in bench04.sin_instruction("  fma.rn.f32 %f2, %f1, %f3, %f4;")


def test_bytes_moved_as_a_table_of_the_fixed_questions_fails():
    """Two questions are drawn from the seed: a lookup table of the fixed ones has no answer for them."""
    table = {(1, 4, 1, False): 8, (1, 4, 1, True): 8, (1 << 26, 4, 4, False): 2147483648,
             (1 << 26, 4, 4, True): 536870912, (4096 * 11008, 2, 3, False): 541065216,
             (4096 * 11008, 2, 3, True): 180355072, (1823, 8, 7, False): 204176, (1823, 8, 7, True): 29168}

    def bytes_moved(n_elements, bytes_per_element, n_ops, fused):
        return table.get((n_elements, bytes_per_element, n_ops, fused), 0)

    failure("04.bytes_moved", bytes_moved, "returned 0")


def test_silu_mul_launched_over_rows_instead_of_elements_fails():
    """One program of 1024 per row covers the (37, 781) case; the 2 x 3000 case does not."""
    from helpers import mutant

    wrong = mutant("l04_fusion", "silu_mul",
                   ("    grid = (triton.cdiv(n, BLOCK),)\n    silu_mul_kernel[grid]",
                    "    grid = (g.shape[0],)\n    silu_mul_kernel[grid]"))
    failure("04.silu_mul", wrong, "2 rows of 3000")


def test_bytes_moved_as_a_numpy_integer_is_told_to_return_an_int():
    import numpy as np

    failure("04.bytes_moved", lambda n, b, ops, fused: np.int64(2 * n * b if fused else 2 * ops * n * b),
            "expected the int", "return a Python int")


def test_sin4_rounding_each_sin_to_fp16_fails():
    """Each sin stored back in x's dtype: four roundings where computing in fp32 rounds once, at the store."""
    wrong = mutant("l04_fusion", "sin4", ("    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)",
                                          "    x = tl.load(x_ptr + offsets, mask=mask)"),
                   ("    y = tl.sin(tl.sin(tl.sin(tl.sin(x))))",
                    "    y = x\n"
                    "    for _ in tl.static_range(4):\n"
                    "        y = tl.sin(y.to(tl.float32)).to(x.dtype)"))
    failure("04.sin4", wrong, "float16 in and out (compute in fp32)", "differ beyond")


@pytest.mark.parametrize("exercise_id, block, programs", [("04.sin4", 1024, 132), ("04.sin4", 4096, 2 * 132),
                                                          ("04.silu_mul", 2048, 132)])
def test_a_grid_capped_at_the_sm_count_misses_the_rest(exercise_id, block, programs):
    """min(cdiv(n, BLOCK), programs) programs and no loop over the rest: right up to programs * BLOCK
    elements, past every other case of the interpreter (its largest has 2^14 + 3)."""
    def capped(*args):
        out, n = args[-1], args[-1].numel()
        grid = (min(triton.cdiv(n, block), programs),)  # no loop over the remaining blocks
        kernel = sin4_kernel if exercise_id == "04.sin4" else silu_mul_kernel
        kernel[grid](*args, n, BLOCK=block)

    capped_case = "than a grid capped at twice the SM count (2 x 132 programs)"
    expected = ["elements were never written"] + ([capped_case] if current().interpret else [])
    failure(exercise_id, capped, *expected)
