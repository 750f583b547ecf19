"""Lesson 07: the interpreter's fp8 conversion fix, the solutions, and wrong answers that must fail."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from course_utils import fp8
from course_utils.grading import CheckFailed, check
from course_utils.lessons import l07_fp8_quantization as l07
from course_utils.mode import current
from helpers import failure, interpreter_only, mutant

# The fix concerns the interpreter; its tests cast CPU tensors in kernels. On a GPU they are skipped,
# and so are answers that may read out of bounds (that can break the CUDA context for later tests).
# Triton has no float8_e4m3fn before sm_89: there the lesson itself switches to the interpreter.
needs_fp8 = pytest.mark.skipif(not fp8.fp8_dot_supported(), reason="no e4m3 in Triton on this GPU")

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
TORCH_SATURATES_E4M3 = torch.tensor([1000.0]).to(E4M3).item() == 448.0  # torch >= 2.12


def same_bits_or_both_nan(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    nan = got.float().isnan() & want.float().isnan()
    return (got.view(torch.uint8) == want.view(torch.uint8)) | nan


def fp32_sweep(limit: float, step: int) -> torch.Tensor:
    """Every `step`-th fp32 bit pattern in [0, limit], both signs."""
    top = int(np.array([limit], np.float32).view(np.int32)[0])
    pos = torch.from_numpy(np.arange(0, top + 1, step, dtype=np.int32).view(np.float32).copy())
    return torch.cat([pos, -pos])


def in_range(x: torch.Tensor, dtype) -> torch.Tensor:
    return x.abs() <= torch.finfo(dtype).max


# --- the format helpers -------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, dtype", [(fp8.E4M3, E4M3), (fp8.E5M2, E5M2)])
def test_decode_table_matches_torch_on_all_256_codes(fmt, dtype):
    want = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float64)
    got = torch.from_numpy(fp8.table(fmt))
    assert bool(((got == want) | (got.isnan() & want.isnan())).all())
    assert fmt.max == torch.finfo(dtype).max


@pytest.mark.parametrize("fmt, dtype", [(fp8.E4M3, E4M3), (fp8.E5M2, E5M2)])
def test_encode_matches_torch_in_range(fmt, dtype):
    x = torch.cat([fp32_sweep(fmt.max, 997), torch.from_numpy(fp8.probe_values())])
    got = torch.from_numpy(fp8.encode(x.numpy(), fmt)).view(dtype)
    ok = same_bits_or_both_nan(got, x.to(dtype))
    assert bool(ok[in_range(x, dtype) | x.isnan()].all())


def test_encode_saturates_like_ptx_cvt_satfinite():
    for fmt in (fp8.E4M3, fp8.E5M2):
        x = np.array([fmt.max * 1.2, 1e30, np.inf, -np.inf, -1e30], dtype=np.float32)
        vals = fp8.table(fmt)[fp8.encode(x, fmt)]
        assert list(vals) == [fmt.max, fmt.max, fmt.max, -fmt.max, -fmt.max]
    assert fp8.encode(np.array([np.nan, -np.nan]), fp8.E4M3).tolist() == [0x7F, 0x7F]


def test_encode_ties_go_to_even_and_carries_cross_powers_of_two():
    cases = {127.1: 128.0, 31.5: 32.0, -0.497: -0.5, -336.0: -320.0, 464.0: 448.0, 2.0**-10: 0.0,
             3 * 2.0**-10: 2 * 2.0**-9, 17.0: 16.0, 19.0: 20.0}
    got = fp8.table(fp8.E4M3)[fp8.encode(np.array(list(cases), np.float32), fp8.E4M3)]
    assert got.tolist() == list(cases.values())


# --- the interpreter fix ------------------------------------------------------------------------

@triton.jit
def _cast_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)


def kernel_cast(x: torch.Tensor, dtype) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=dtype)
    block = 1 << 16
    _cast_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block)
    return out


@interpreter_only
def test_fix_is_installed_and_idempotent():
    from triton.runtime import interpreter

    assert fp8.install_fp8_fix()
    fixed = interpreter._convert_float
    assert fp8.install_fp8_fix()
    assert interpreter._convert_float is fixed  # not wrapped twice
    assert fp8.conversion_errors() == 0


@interpreter_only
def test_fix_is_a_no_op_when_triton_is_already_right():
    from triton.runtime import interpreter

    fp8.install_fp8_fix()
    fixed = interpreter._convert_float
    correct = fp8._fixed(fixed.original)
    del correct.course_fp8_fix  # looks like Triton's own, but converts correctly
    interpreter._convert_float = correct
    try:
        assert not fp8.install_fp8_fix()
        assert interpreter._convert_float is correct
    finally:
        interpreter._convert_float = fixed


@interpreter_only
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_kernel_cast_matches_torch_on_a_dense_fp32_sweep(dtype):
    # ~300k fp32 bit patterns in [-500, 500], plus every tie and power-of-two boundary
    x = torch.cat([fp32_sweep(500.0, 7919), torch.from_numpy(fp8.probe_values())])
    got = kernel_cast(x, dtype)
    ok = same_bits_or_both_nan(got, x.to(dtype))
    assert bool(ok[in_range(x, dtype) | x.isnan()].all())
    if dtype == E4M3 and TORCH_SATURATES_E4M3:  # torch >= 2.12 saturates e4m3fn like the GPU
        assert bool(ok.all())


@interpreter_only
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_conversion_matches_torch_on_every_fp32_pattern_below_500(dtype):
    """Every 257th fp32 bit pattern in [-500, 500] (4 million values), through the patched function."""
    from triton.runtime import interpreter

    fp8.install_fp8_fix()
    x = fp32_sweep(500.0, 257)
    ty = tl.float8e4nv if dtype == E4M3 else tl.float8e5
    got = interpreter._convert_float(x.numpy(), tl.float32, ty, fp8._rtne_mode())
    got = torch.from_numpy(got).view(dtype)
    ok = same_bits_or_both_nan(got, x.to(dtype))
    assert bool(ok[in_range(x, dtype)].all())


@interpreter_only
@pytest.mark.parametrize("src", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_kernel_cast_from_every_16_bit_pattern(src, dtype):
    x = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(src)
    got = kernel_cast(x, dtype)
    ok = same_bits_or_both_nan(got, x.to(dtype))
    assert bool(ok[in_range(x.float(), dtype) | x.isnan()].all())


@interpreter_only
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("dst", [torch.float32, torch.float16])
def test_kernel_upcast_of_all_256_codes(dtype, dst):
    codes = torch.arange(256, dtype=torch.uint8).view(dtype)
    got = kernel_cast(codes, dst)
    want = codes.to(dst)
    assert bool(((got == want) | (got.isnan() & want.isnan())).all())


@interpreter_only
def test_triton_cast_saturates_like_the_gpu():
    """Triton lowers .to(fp8) to cvt.rn.satfinite: no NaN from overflow, a missing clamp is harmless there."""
    x = torch.tensor([500.0, -1e6, float("inf"), 7e4, float("nan")])
    assert kernel_cast(x, E4M3).float()[:4].tolist() == [448.0, -448.0, 448.0, 448.0]
    assert kernel_cast(x, E5M2).float()[:4].tolist() == [512.0, -57344.0, 57344.0, 57344.0]
    assert math.isnan(kernel_cast(x, E4M3).float()[4].item())


@interpreter_only
def test_the_interpreters_own_cast_loses_the_carry():
    """The bug the fix replaces (skipped once a Triton release converts correctly)."""
    from triton.runtime import interpreter

    fp8.install_fp8_fix()
    original = interpreter._convert_float.original
    if fp8.conversion_errors(original) == 0:
        pytest.skip("this Triton's interpreter converts fp8 correctly")
    x = np.array([127.1, 31.5, -0.497], np.float32)
    got = fp8.table(fp8.E4M3)[original(x, tl.float32, tl.float8e4nv, fp8._rtne_mode()).astype(np.uint8)]
    assert got.tolist() == [64.0, 16.0, -0.25]


# --- solutions pass -----------------------------------------------------------------------------

@pytest.mark.parametrize("exercise, fn", [
    ("07.decode_e4m3", l07.decode_e4m3),
    ("07.quantize_rowwise", l07.quantize_rowwise),
    ("07.fp8_matmul", l07.fp8_matmul),
    ("07.pack_int4", l07.pack_int4),
    ("07.unpack_int4", l07.unpack_int4),
])
@needs_fp8
def test_solution_passes(exercise, fn):
    check(exercise, fn, seed=7)


@needs_fp8
def test_fp8_matmul_promoted_accumulation_passes():
    check("07.fp8_matmul", lambda a, a_scale, b, b_scale, out: l07.fp8_matmul(a, a_scale, b, b_scale, out,
                                                                               promote=True), seed=3)


def fails(exercise: str, fn, *needles: str) -> str:
    with pytest.raises(CheckFailed) as info:
        check(exercise, fn, seed=11)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"
    return message


# --- 07.decode_e4m3: wrong answers --------------------------------------------------------------

def decode_without_subnormals(bits):
    sign = -1.0 if bits & 0x80 else 1.0
    e, m = (bits >> 3) & 0xF, bits & 7
    if e == 15 and m == 7:
        return math.nan
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


def decode_with_infinity(bits):  # IEEE habit: exponent all ones means inf/NaN
    e, m = (bits >> 3) & 0xF, bits & 7
    if e == 15:
        return math.nan if m else math.inf
    return l07.decode_e4m3(bits)


def decode_without_nan(bits):
    sign = -1.0 if bits & 0x80 else 1.0
    e, m = (bits >> 3) & 0xF, bits & 7
    if e == 0:
        return sign * m / 8 * 2.0**-6
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


def decode_with_torch(bits):
    return torch.tensor([bits], dtype=torch.uint8).view(E4M3).item()


def test_decode_wrong_answers():
    fails("07.decode_e4m3", decode_without_subnormals, "0x00", "Exponent field 0 is a subnormal",
          "no implicit leading 1")
    fails("07.decode_e4m3", decode_with_infinity, "0x78", "expected 256")
    fails("07.decode_e4m3", decode_without_nan, "0x7F", "expected NaN, got 480.0", "no infinity")
    fails("07.decode_e4m3", lambda bits: l07.decode_e4m3(bits) if bits < 128 else -l07.decode_e4m3(bits - 128)
          if bits != 128 else 0.0, "0x80", "sign bit")
    fails("07.decode_e4m3", decode_with_torch, "decodes with torch's own float8 type", "Decode the bits yourself")
    fails("07.decode_e4m3", lambda bits: torch.tensor(float(bits)), "return a Python float")


# --- 07.quantize_rowwise: wrong answers ---------------------------------------------------------

def launch(kernel, x, out, scale_out, **kw):
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    kernel[(rows,)](x, out, scale_out, cols, x.stride(0), x.stride(1), out.stride(0), BLOCK=block, **kw)


@triton.jit
def _quantize_variants(x_ptr, out_ptr, scale_ptr, n_cols, stride_xr, stride_xc, stride_or,
                       BLOCK: tl.constexpr, QMAX: tl.constexpr, STORE_INVERSE: tl.constexpr,
                       ZERO_GUARD: tl.constexpr,
                       SCALE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    if ZERO_GUARD:
        amax = tl.where(amax > 0, amax, QMAX)
    inv = QMAX / amax
    scale = amax / QMAX
    q = x / amax * QMAX  # no clamp: Triton's cast saturates anyway
    if not SCALE:  # cast x as it is, no scaling, no clamp
        inv = 1.0
        scale = 1.0
        q = x
    tl.store(out_ptr + row * stride_or + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, inv if STORE_INVERSE else scale)


def quantize_variant(**kw):
    opts = {"QMAX": 448.0, "STORE_INVERSE": False, "ZERO_GUARD": True, "SCALE": True} | kw
    return lambda x, out, scale_out: launch(_quantize_variants, x, out, scale_out, **opts)


@needs_fp8
def test_quantize_variant_without_clamp_is_right_because_the_cast_saturates():
    check("07.quantize_rowwise", quantize_variant(), seed=5)


@needs_fp8
@pytest.mark.filterwarnings("ignore:divide by zero", "ignore:invalid value")
def test_quantize_wrong_answers():
    fails("07.quantize_rowwise", quantize_variant(QMAX=127.0), "amax / 127, int8's maximum")
    fails("07.quantize_rowwise", quantize_variant(STORE_INVERSE=True), "448 / amax, the inverse")
    fails("07.quantize_rowwise", quantize_variant(ZERO_GUARD=False), "all zeros", "got nan")
    fails("07.quantize_rowwise", quantize_variant(SCALE=False), "scale_out[0] = 1, expected amax / 448")
    fails("07.quantize_rowwise", quantize_variant(QMAX=224.0), "expected amax / 448")


@triton.jit
def _quantize_contiguous_only(x_ptr, out_ptr, scale_ptr, n_cols, stride_xr, stride_xc, stride_or,
                              BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)  # assumes contiguous rows
    amax = tl.where(tl.max(tl.abs(x), axis=0) > 0, tl.max(tl.abs(x), axis=0), 448.0)
    tl.store(out_ptr + row * stride_or + cols, (x / amax * 448.0).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, amax / 448.0)


@needs_fp8
def test_quantize_ignoring_strides_fails_on_the_transposed_case():
    fails("07.quantize_rowwise", lambda x, out, s: launch(_quantize_contiguous_only, x, out, s), "transposed")


@interpreter_only
def test_quantize_with_a_fixed_block_leaves_long_rows_unwritten():
    def short_block(x, out, scale_out):
        rows, cols = x.shape
        l07.quantize_rowwise_kernel[(rows,)](x, out, scale_out, cols, x.stride(0), x.stride(1), out.stride(0),
                                             BLOCK=256, ONE_PASS=True, FP8_MAX=448.0)

    fails("07.quantize_rowwise", short_block, "never written")


@needs_fp8
def test_quantize_with_torch_on_the_host_is_rejected():
    def host(x, out, scale_out):
        q, s = fp8.quantize_rowwise_ref(x)
        out.copy_(q)
        scale_out.copy_(s)

    fails("07.quantize_rowwise", host, "no Triton kernel was launched")



@pytest.mark.skipif(current().gpu, reason="a GPU's compiler refuses it itself")
def test_fp8_matmul_with_a_k_tile_a_gpu_refuses_fails_in_the_interpreter_too():
    """Triton's NVIDIA backend refuses tl.dot of e4m3 tiles with K < 32; the interpreter took any size, so
    BLOCK_K = 16 passed on the CPU and did not compile on a GPU. setup() gives the interpreter the GPU's bounds."""
    def bk16(a, a_scale, b, b_scale, out):
        mutant("l07_fp8_quantization", "fp8_matmul")(a, a_scale, b, b_scale, out, BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)

    failure("07.fp8_matmul", bk16, "K >= 32")


# --- 07.fp8_matmul: wrong answers ---------------------------------------------------------------

@triton.jit
def _matmul_variants(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, out_ptr, M, N, K, stride_am, stride_ak,
                     stride_bn, stride_bk, stride_om, stride_on, BLOCK: tl.constexpr, SCALES: tl.constexpr,
                     B_AS_KN: tl.constexpr, MASK_K: tl.constexpr, SWAP_SCALES: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ks = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        kmask = (k0 + ks < K) if MASK_K else (ks < BLOCK)
        a = tl.load(a_ptr + rows[:, None] * stride_am + (k0 + ks)[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & kmask[None, :], other=0.0)
        if B_AS_KN:  # reads b as if it were (K, N) row-major
            b = tl.load(b_ptr + (k0 + ks)[:, None] * N + cols[None, :],
                        mask=kmask[:, None] & (cols[None, :] < N), other=0.0)
        else:
            b = tl.trans(tl.load(b_ptr + cols[:, None] * stride_bn + (k0 + ks)[None, :] * stride_bk,
                                 mask=(cols[:, None] < N) & kmask[None, :], other=0.0))
        acc = tl.dot(a, b, acc)
    if SCALES:
        if SWAP_SCALES:
            acc = acc * tl.load(b_scale_ptr + rows, mask=rows < N, other=1.0)[:, None]
            acc = acc * tl.load(a_scale_ptr + cols, mask=cols < M, other=1.0)[None, :]
        else:
            acc = acc * tl.load(a_scale_ptr + rows, mask=rows < M, other=1.0)[:, None]
            acc = acc * tl.load(b_scale_ptr + cols, mask=cols < N, other=1.0)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul_variant(**kw):
    opts = {"SCALES": True, "B_AS_KN": False, "MASK_K": True, "SWAP_SCALES": False} | kw

    def run(a, a_scale, b, b_scale, out):
        M, K = a.shape
        N = b.shape[0]
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        _matmul_variants[grid](a, a_scale, b, b_scale, out, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                               b.stride(1), out.stride(0), out.stride(1), BLOCK=32, **opts)

    return run


@needs_fp8
def test_matmul_variant_itself_is_right():
    check("07.fp8_matmul", matmul_variant(), seed=5)


@needs_fp8
def test_matmul_wrong_answers():
    fails("07.fp8_matmul", matmul_variant(SCALES=False), "differ beyond", "a_scale")
    fails("07.fp8_matmul", matmul_variant(SWAP_SCALES=True), "differ beyond")
    fails("07.fp8_matmul", matmul_variant(B_AS_KN=True), "tl.trans(b)")


@interpreter_only
def test_matmul_without_the_k_mask_fails():
    fails("07.fp8_matmul", matmul_variant(MASK_K=False), "tl.load out of bounds", "Is a mask missing")


@needs_fp8
@pytest.mark.parametrize("operand, needles", [("a", ("a as the transposed view", "a.stride(0)")),
                                              ("b", ("transposed view",))])
def test_matmul_ignoring_an_operands_strides_fails_on_the_transposed_view(operand, needles):
    """a and b have any strides: a kernel that passes (K, 1) for one of them reads that operand right in every
    case until it comes as a transposed view."""
    def contiguous(a, a_scale, b, b_scale, out):
        M, K = a.shape
        N = b.shape[0]
        a_strides = (K, 1) if operand == "a" else a.stride()
        b_strides = (K, 1) if operand == "b" else b.stride()
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        _matmul_variants[grid](a, a_scale, b, b_scale, out, M, N, K, *a_strides, *b_strides,
                               out.stride(0), out.stride(1), BLOCK=32, SCALES=True, B_AS_KN=False,
                               MASK_K=True, SWAP_SCALES=False)

    fails("07.fp8_matmul", contiguous, *needles)


# --- 07.pack_int4 / 07.unpack_int4: wrong answers -----------------------------------------------

def test_pack_wrong_answers():
    fails("07.pack_int4", lambda lo, hi: hi | (lo << 4), "swapped")
    fails("07.pack_int4", lambda lo, hi: lo.long() | (hi.long() << 4), "int64", "uint8")
    fails("07.pack_int4", lambda lo, hi: lo | (hi << 3), "should pack to")


def test_unpack_wrong_answers():
    fails("07.unpack_int4", lambda p: (p >> 4, p & 0xF), "swapped")
    fails("07.unpack_int4", lambda p: (p & 0xF, (p.view(torch.int8) >> 4).view(torch.uint8)),
          "hi is sign-extended: >> on an int8 copies the sign bit in")
    fails("07.unpack_int4", lambda p: [p & 0xF], "tuple")


# --- maths of the lesson ------------------------------------------------------------------------

def test_pack_unpack_round_trip_and_signed_nibbles():
    lo = torch.randint(0, 16, (100,), dtype=torch.uint8)
    hi = torch.randint(0, 16, (100,), dtype=torch.uint8)
    got_lo, got_hi = l07.unpack_int4(l07.pack_int4(lo, hi))
    assert torch.equal(got_lo, lo) and torch.equal(got_hi, hi)
    signed = torch.arange(-8, 8)
    nibble = (signed & 0xF).to(torch.uint8)
    assert torch.equal((nibble.to(torch.int16) ^ 8) - 8, signed.to(torch.int16))  # sign extension


def test_blockwise_scales_contain_an_outlier():
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    x[3, 5] = 1e6  # e4m3 spans 2^-9..448: it takes an outlier 10^5 x the rest to push them below its range
    errors = {}
    blocks = {"tensor": (256, 256), "row": (1, 256), "1x128": (1, 128), "128x128": (128, 128)}
    for name, block in blocks.items():
        q, s = fp8.quantize_blockwise_ref(x, block)
        back = fp8.dequantize_blockwise_ref(q, s, block)
        assert s.shape == (-(-256 // block[0]), -(-256 // block[1]))
        errors[name] = ((back - x).norm() / x.norm()).item()
        clean = torch.ones(256, dtype=torch.bool)
        clean[3] = False
        errors[name + " clean rows"] = ((back - x)[clean].norm() / x[clean].norm()).item()
    # the outlier ruins the per-tensor scale for everyone; finer scales confine it
    assert errors["tensor clean rows"] > 10 * errors["row clean rows"]
    assert errors["row clean rows"] == pytest.approx(errors["1x128 clean rows"], rel=0.2)
    assert errors["128x128 clean rows"] > 5 * errors["1x128 clean rows"]


def test_quantize_rowwise_ref_properties():
    x = torch.randn(5, 33) * 1e3
    x[1] = 0
    q, s = fp8.quantize_rowwise_ref(x)
    assert q.dtype == E4M3 and s.shape == (5,)
    assert s[1].item() == 1.0 and bool((q[1].float() == 0).all())
    assert torch.equal(q.float().abs().amax(dim=1)[[0, 2, 3, 4]], torch.full((4,), 448.0))
    assert bool(((q.float() * s[:, None] - x).abs() <= x.abs() / 16 + 1e-6).all())


@pytest.mark.parametrize("M, N, K", [(1, 100, 300), (3, 37, 64)])
def test_w8a16_gemv_matches_reference(M, N, K):
    torch.manual_seed(M)
    w = torch.randn(N, K, device=current().device)
    x = torch.randn(M, K, device=current().device)
    w_int8, scale = l07.quantize_int8_ref(w)
    assert w_int8.dtype == torch.int8 and bool((w_int8.abs() <= 127).all())
    out = torch.empty(M, N, device=current().device)
    l07.w8a16_gemv(x, w_int8, scale, out, BLOCK_N=16, BLOCK_KW=32)
    want = x.double() @ (w_int8.double() * scale.double()[:, None]).T
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4)
    # and int8 weights are close to the originals: half a step of amax/127
    assert bool(((w_int8.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all())


def test_w8a16_gemv_of_more_rows_than_a_grid_axis_holds(monkeypatch):
    """One program row per row of x sits on axis 1 of the grid, which holds 65535 programs on a GPU: more
    rows go in turns. With the limit lowered to 2, five rows take three launches and every row is right."""
    monkeypatch.setattr(l07, "GRID_AXIS_MAX", 2)
    torch.manual_seed(0)
    dev = current().device
    w_int8, scale = l07.quantize_int8_ref(torch.randn(24, 64, device=dev))
    x = torch.randn(5, 64, device=dev)
    out = torch.full((5, 24), float("nan"), device=dev)
    l07.w8a16_gemv(x, w_int8, scale, out, BLOCK_N=16, BLOCK_KW=8)
    want = x.double() @ (w_int8.double() * scale.double()[:, None]).T
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4)


def test_w8a16_gemv_turns_every_byte_into_its_value():
    """The bit trick (xor 0x80, or into 2^23, subtract 2^23 + 128) gives every int8 -128..127 exactly,
    whichever byte of its int32 word it sits in."""
    dev = current().device
    w_int8 = torch.arange(-128, 128, dtype=torch.int8, device=dev).reshape(4, 64)  # (N, K): all 256 values
    x = torch.eye(64, device=dev)  # row m of x picks column m of w_int8: every byte position of a word
    out = torch.empty(64, 4, device=dev)
    l07.w8a16_gemv(x, w_int8, torch.ones(4, device=dev), out, BLOCK_N=4, BLOCK_KW=16)
    assert torch.equal(out, w_int8.T.float())


def test_fp8_mode_keeps_an_explicit_choice(monkeypatch):
    monkeypatch.setenv("COURSE_MODE", "interpret")
    assert fp8.fp8_mode() is None
    monkeypatch.delenv("COURSE_MODE")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fp8.fp8_mode() is None
    assert fp8.fp8_dot_supported()


@interpreter_only
def test_bench_runs_end_to_end_at_tiny_sizes(monkeypatch):
    """The GPU benchmark's code paths (checks before timing, best-of-sweep, targets, notes) in the
    interpreter: every timed function is called once instead of timed."""
    from course_utils.bench import Table
    from course_utils.benches import l07_fp8_quantization as bench07

    monkeypatch.setattr(bench07, "DEVICE", "cpu")
    monkeypatch.setattr(bench07, "QUANTIZE_SHAPE", (16, 256))
    monkeypatch.setattr(bench07, "MATMUL_SIZE", 256)
    monkeypatch.setattr(bench07, "MATMUL_CONFIGS", bench07.MATMUL_CONFIGS[:2])
    monkeypatch.setattr(bench07, "ACCUMULATION_K", (64,))
    monkeypatch.setattr(bench07, "GEMV_SHAPES", ((48, 256),))
    monkeypatch.setattr(bench07, "GEMV_CONFIGS", bench07.GEMV_CONFIGS[:2])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch, "compile", lambda fn: fn)

    def call_once(self, group, name, fn, *, n_bytes=None, flops=None, rep_ms=100):
        fn()
        return self.add(group, name, 1.0, n_bytes=n_bytes, flops=flops)

    def alternate_once(self, group, runs, *, n_bytes=None, flops=None, rounds=3, rep_ms=100):
        return [call_once(self, group, name, fn, n_bytes=n_bytes, flops=flops) for name, fn in runs]

    def smi_once(fn, seconds=3.0, interval_ms=20):
        fn()
        return {"sm_mhz": 1500.0, "power_w": 690.0, "power_limit_w": 700.0, "power_capped": 1.0, "samples": 9,
                "ms": 1.0}

    monkeypatch.setattr(Table, "time", call_once)
    monkeypatch.setattr(Table, "time_alternating", alternate_once)
    monkeypatch.setattr(bench07, "clock_and_power", smi_once)
    monkeypatch.setattr(bench07, "fp8_tma_ready", lambda *tensors: True)  # the pair: peer and default
    props = type("Props", (), {"multi_processor_count": 4})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    table = Table("07")
    bench07.run(table)
    names = {(r.group.split()[0], r.name) for r in table.rows}
    assert ("quantize_rowwise", "triton (ours)") in names
    assert ("fp8", "triton (ours)") in names
    assert ("W8A16", "triton (ours) W8A16") in names
    assert any("b (K, N) layout" in r.name for r in table.rows)
    assert any("promoted" in r.name for r in table.rows)
    assert ("W8A16", "read only (no math)") in names  # the best of the read-only sweep, checked sums
    # quantize vs copy; fp8 vs bf16 cuBLAS, _scaled_mm fast and accurate; GEMV vs bf16 and vs the copy;
    # the read-only floor vs the copy, and the GEMV vs that floor
    assert len(table.targets) == 8 and all(t.ratio is not None for t in table.targets)
    assert any(n.startswith("accumulation error K=64") for n in table.notes)
    # The worst element's error lies at or above the norm error (max |d| >= rms(d)), both with and without
    # promotion, and the fact says by how much.
    ratios = re.findall(r"(\d+\.\d) times", table.facts["fp8_worst_element"])
    assert len(ratios) == 2 and all(float(r) >= 1.0 for r in ratios), table.facts["fp8_worst_element"]
    assert not [n for n in table.notes if "skipped" in n and "torch" not in n], table.notes
    # Both sides of the pair sampled at 1500 MHz doing 2 * 256^3 FLOPs a millisecond on 4 SMs.
    per_clock = round(2 * 256**3 / 1e-3 / 1.5e9 / 4)
    assert table.facts["fp8_clocks"].count(f"{per_clock} FLOPs per clock cycle per SM") == 2
    assert "power limit: 700 W" in table.facts["fp8_clocks"]
    assert "fp8 registers: not compiled (interpreter)" in table.notes  # no compiled kernel, no counts


def test_sass_opcodes_read_triton_and_cuobjdump_listings():
    """The GEMV's SASS fact counts opcodes: in Triton's listing (control codes, a tab) and in cuobjdump's
    (an address comment), predicated or not."""
    from course_utils.benches.l07_fp8_quantization import sass_opcodes

    triton_style = ("Function:w8a16_gemv_kernel\n--:-:0:-:8\tLDC R1, c[0x0][0x28];\nLBB0:\n"
                    "01:-:2:Y:4\t@!P0 LDG.E.128 R4, desc[UR4][R2.64];\n"
                    "--:-:-:-:1\tLOP3.LUT R5, R4, 0xff, RZ, 0xc0, !PT;\n")
    cuobjdump_style = ("        /*0090*/                   @P0 I2F.U32 R4, R2 ;\n"
                       "        /*00a0*/    FFMA R1, R2, R3, R4 ;\n")
    assert sass_opcodes(triton_style) == ["LDC", "LDG.E.128", "LOP3.LUT"]
    assert sass_opcodes(cuobjdump_style) == ["I2F.U32", "FFMA"]


@needs_fp8
def test_quantize_two_pass_path_for_long_rows():
    """A block shorter than the row: amax in a first pass, the quantization in a second."""
    device = current().device
    x = torch.randn(5, 1000, device=device) * torch.logspace(-2, 3, 5, device=device)[:, None]
    x[2] = 0
    out = torch.empty(5, 1000, device=device, dtype=E4M3)
    scale = torch.empty(5, device=device)
    l07.quantize_rowwise(x, out, scale, BLOCK=128)
    q_ref, s_ref = fp8.quantize_rowwise_ref(x)
    torch.testing.assert_close(scale, s_ref, rtol=1e-6, atol=0)
    assert bool(((out.float() - q_ref.float()).abs() <= q_ref.float().abs() / 8 + 2.0**-9).all())


@needs_fp8
def test_quantize_rows_of_tiny_values_keep_their_scale():
    """Rows whose amax is below 448 / fp32's largest value (1.3e-36): 448 / amax is inf there, which made
    every element +-448 and a zero NaN; x / amax * 448 stays finite for any normal amax. Both paths."""
    from course_utils.checks.l07_fp8_quantization import _quantize_case, _quantize_verify

    device = current().device
    x = torch.randn(4, 300, device=device) * torch.tensor([1e-37, 1e-36, 3e-38, 1.0], device=device)[:, None]
    x[:, 7] = 0
    for block in (None, 128):  # one pass, two passes
        out = torch.empty(4, 300, device=device, dtype=E4M3)
        scale = torch.empty(4, device=device)
        l07.quantize_rowwise(x, out, scale, BLOCK=block)
        assert _quantize_verify({"out": out, "scale_out": scale}, _quantize_case("tiny rows", x)) == []


def test_quantize_multiplying_by_448_first_fails_on_huge_values():
    """x * 448 * (1 / amax) is the solution's x * (1 / amax) * 448 until x * 448 passes fp32's largest value."""
    wrong = mutant("l07_fp8_quantization", "quantize_rowwise", ("x * inv * FP8_MAX", "x * FP8_MAX * inv"))
    failure("07.quantize_rowwise", wrong, "x * 448 overflows fp32 to inf", at="values around 1e36")


# --- 07.decode_e4m3: bit arithmetic on torch integers is fine, torch's own float8 is not -------------

def test_decode_with_torch_integer_bit_arithmetic_passes():
    def decode_torch_ints(bits):
        b = torch.tensor(bits, dtype=torch.int32)
        sign, exponent, mantissa = int((b >> 7) & 1), int((b >> 3) & 0xF), int(b & 0x7)
        if exponent == 0xF and mantissa == 0x7:
            return math.nan
        value = mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        return -value if sign else value

    check("07.decode_e4m3", decode_torch_ints, seed=0, quiet=True)


def test_decode_with_torchs_float8_is_refused_by_name():
    def decode_by_torch(bits):
        return float(torch.tensor([bits], dtype=torch.uint8).view(torch.float8_e4m3fn).float())

    with pytest.raises(CheckFailed, match="decodes with torch's own float8 type") as info:
        check("07.decode_e4m3", decode_by_torch, seed=0, quiet=True)
    assert "int() / float()) are all allowed" in str(info.value)



@triton.jit
def _copy_one_byte(src_ptr, dst_ptr):
    tl.store(dst_ptr, tl.load(src_ptr))


def test_decode_through_a_kernel_is_refused():
    """On an H200, a kernel's own fp8 conversion (tl.load(p).to(tl.float8e4nv, bitcast=True).to(tl.float32))
    decoded every pattern and passed: the hardware's decoder, not the student's. This exercise launches no
    kernel at all (the one here only copies the byte: the interpreter's own fp8 refusal is not what fails it)."""
    def decode_after_a_launch(bits):
        src = torch.tensor([bits], dtype=torch.uint8, device=current().device)
        dst = torch.empty_like(src)
        _copy_one_byte[(1,)](src, dst)
        return l07.decode_e4m3(int(dst.item()))

    fails("07.decode_e4m3", decode_after_a_launch, "launched the Triton kernel `_copy_one_byte`",
          "plain Python on the host")

def test_quantize_amax_of_the_values_not_their_magnitudes_is_named():
    from helpers import mutant

    wrong = mutant("l07_fp8_quantization", "quantize_rowwise",
                   ("amax = tl.max(tl.abs(x), axis=0)", "amax = tl.max(x, axis=0)"),
                   ("running = tl.maximum(running, tl.abs(x))", "running = tl.maximum(running, x)"))
    fails("07.quantize_rowwise", wrong, "that is max(x) / 448", "max |x|")


def test_quantize_zero_row_without_a_guard_says_why():
    from helpers import mutant

    wrong = mutant("l07_fp8_quantization", "quantize_rowwise",
                   ("safe = tl.where(amax > 0, tl.maximum(amax, 1.1754944e-38), FP8_MAX)", "safe = amax"))
    fails("07.quantize_rowwise", wrong, "is all zeros", "give an all-zero row scale 1")


@needs_fp8
def test_fp8_matmul_missing_scale_is_named():
    from helpers import mutant

    wrong = mutant("l07_fp8_quantization", "fp8_matmul",
                   ("acc = acc * a_scale[:, None] * b_scale[None, :]", "acc = acc * a_scale[:, None]"))
    fails("07.fp8_matmul", wrong, "without b_scale[None, :]")


def test_the_persistent_launch_reads_one_config(monkeypatch):
    """Hopper's FP8 tile is one triton.Config (FP8_HOPPER_CONFIG): the persistent launch passes its block
    sizes, warps and stages through, and a program per SM (checked here without a GPU: the launch is faked)."""
    launched = {}

    class FakeKernel:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.update(kwargs, grid=grid)
            return launch

    monkeypatch.setattr(l07, "fp8_matmul_persistent_kernel", FakeKernel())
    monkeypatch.setattr(l07, "sm_count", lambda device: 132)  # not the cached query: no fake left behind
    monkeypatch.setattr(l07.triton, "set_allocator", lambda allocator: None)
    a, b = torch.zeros(512, 256, dtype=torch.float8_e4m3fn), torch.zeros(1024, 256, dtype=torch.float8_e4m3fn)
    out = torch.empty(512, 1024, dtype=torch.bfloat16)
    l07.fp8_matmul_persistent(a, torch.ones(512), b, torch.ones(1024), out)
    cfg = l07.FP8_HOPPER_CONFIG
    assert {k: launched[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")} == cfg.kwargs == dict(
        BLOCK_M=128, BLOCK_N=256, BLOCK_K=128)
    assert (launched["num_warps"], launched["num_stages"]) == (cfg.num_warps, cfg.num_stages) == (8, 4)
    assert launched["grid"] == (min(132, (512 // 128) * (1024 // 256)),) and launched["NUM_SMS"] == 132


def test_decode_with_any_of_torchs_float8_types_is_refused():
    """float8_e4m3fnuz decodes e4m3fn but for a factor 2 (bias 8) and the codes 0x80 and 0x7F: no float8
    type of torch's may stand in for the decoder."""
    def decode_by_fnuz(bits):
        if bits & 0x7F == 0x7F:
            return math.nan
        if bits == 0x80:
            return -0.0
        return torch.tensor([bits], dtype=torch.uint8).view(torch.float8_e4m3fnuz).item() * 2.0

    failure = fails("07.decode_e4m3", decode_by_fnuz, "decodes with torch's own float8 type")
    assert "float8_*" in failure


def test_decode_through_a_float8_tensor_made_from_a_buffer_is_refused():
    """torch.frombuffer makes its tensor without an aten op, and tolist hands its values to Python without one:
    the float8 dtype showed in no op the checker saw."""
    def decode_from_buffer(bits):
        return torch.frombuffer(bytearray([bits]), dtype=torch.float8_e4m3fn).tolist()[0]

    fails("07.decode_e4m3", decode_from_buffer, "decodes with torch's own float8 type")


def test_decode_with_the_courses_own_decoder_is_refused_however_imported():
    """The course ships an fp8 decoder for its interpreter fix (course_utils.fp8_interpreter): calling it, by
    its module, by a name imported from it or through its table, is not decoding."""
    from course_utils import fp8_interpreter
    from course_utils.fp8_interpreter import decode as the_decoder

    for candidate in (lambda bits: fp8_interpreter.decode(bits), lambda bits: the_decoder(bits),
                      lambda bits: float(fp8_interpreter.table()[bits])):
        fails("07.decode_e4m3", candidate, "calls the course's own `course_utils.fp8_interpreter.",
              "decode the bits yourself")


def test_decode_that_replaces_the_profiler_is_refused():
    """The check sees course calls through sys.setprofile: a candidate that clears it is told so."""
    import sys

    def decode_hiding(bits):
        sys.setprofile(None)
        return l07.decode_e4m3(bits)

    fails("07.decode_e4m3", decode_hiding, "replaced the Python profiler")


def test_the_sandbox_spec_carries_the_forbidden_calls():
    """The batch grader runs the candidate in a sandbox from the exercise's spec: the forbidden calls and
    the float8 types go with it."""
    from course_utils.grading.harness import _exercise
    from course_utils.grading.remote import _Spec, spec_of

    ex = _exercise("07.decode_e4m3")
    spec = _Spec(spec_of(ex))
    assert spec.forbidden_calls == ex.forbidden_calls
    assert "course_utils.fp8_interpreter:decode" in spec.forbidden_calls
    assert torch.float8_e4m3fnuz in spec.forbidden_dtypes


def test_quantize_multiplying_by_448_over_amax_fails_on_rows_of_tiny_values():
    """x * (448 / amax): 448 / amax is inf in fp32 for amax below 1.3e-36, every code +-448 and 0 * inf NaN."""
    wrong = mutant("l07_fp8_quantization", "quantize_rowwise",
                   ("        inv = 1.0 / safe\n        q = tl.minimum(tl.maximum(x * inv * FP8_MAX, -FP8_MAX), FP8_MAX)",
                    "        q = x * (FP8_MAX / safe)"))
    failure("07.quantize_rowwise", wrong, "values around 1e-37: 448 / amax overflows fp32")


@needs_fp8
def test_matmul_whose_k_loop_never_advances_fails_with_blocks_of_256():
    """A K loop that loads the first K block again and again, with BLOCK_K = 256: every K of the CPU's
    cases was at most 256 (one block) and it passed there; the case of K = 600 catches it."""
    wrong = mutant("l07_fp8_quantization", "fp8_matmul",
                   ("        a_ptrs += BLOCK_K * stride_ak\n        b_ptrs += BLOCK_K * stride_bk\n", ""))

    def fp8_matmul(a, a_scale, b, b_scale, out):
        wrong(a, a_scale, b, b_scale, out, BLOCK_M=32, BLOCK_N=32, BLOCK_K=256)

    fails("07.fp8_matmul", fp8_matmul, "differ beyond", "K = 600" if current().interpret else "")


# --- a fifth review: fp32 subnormal rows, one scale for the whole tensor --------------------------

@needs_fp8
def test_quantize_inverting_a_subnormal_amax_fails_and_says_why():
    """inv = 1 / amax without raising amax to fp32's smallest normal number first: every amax of the other
    cases is normal, so it passed; a row of values near 1e-40 has 1 / amax = inf, and the message says so."""
    wrong = mutant("l07_fp8_quantization", "quantize_rowwise",
                   ("safe = tl.where(amax > 0, tl.maximum(amax, 1.1754944e-38), FP8_MAX)\n        # x / amax",
                    "safe = tl.where(amax > 0, amax, FP8_MAX)\n        # x / amax"))
    fails("07.quantize_rowwise", wrong, "values around 1e-40", "is an fp32 subnormal, and 1 / amax overflows")


@triton.jit
def _tensor_amax_kernel(x_ptr, amax_ptr, n_cols, stride_xr, stride_xc, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0))  # one amax for all the rows


@triton.jit
def _quantize_by_one_amax(x_ptr, out_ptr, scale_ptr, amax_ptr, n_cols, stride_xr, stride_xc, stride_or,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
    amax = tl.load(amax_ptr)
    amax = tl.where(amax > 0, amax, 448.0)
    tl.store(out_ptr + row * stride_or + cols, (x / amax * 448.0).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, amax / 448.0)


@needs_fp8
def test_quantize_with_one_scale_for_the_whole_tensor_is_named():
    def per_tensor(x, out, scale_out):
        rows, cols = x.shape
        amax = torch.zeros(1, device=x.device)
        block = triton.next_power_of_2(cols)
        _tensor_amax_kernel[(rows,)](x, amax, cols, x.stride(0), x.stride(1), BLOCK=block)
        _quantize_by_one_amax[(rows,)](x, out, scale_out, amax, cols, x.stride(0), x.stride(1), out.stride(0),
                                       BLOCK=block)

    fails("07.quantize_rowwise", per_tensor, "the whole tensor's amax / 448, one scale for every row")


@needs_fp8
def test_quantize_whose_two_pass_path_stores_every_block_at_the_first_fails():
    """The second pass stores each block at the row's start: the host takes that path only past 16384
    columns, and the CPU's longest row was 5000, so it passed there; the CPU's row of 16500 catches it."""
    wrong = mutant("l07_fp8_quantization", "quantize_rowwise",
                   ("            tl.store(out_row + start + cols, q.to(out_ptr.dtype.element_ty), mask=mask)",
                    "            tl.store(out_row + cols, q.to(out_ptr.dtype.element_ty), "
                    "mask=cols < n_cols)"))
    where = "longer than a block of 16384" if current().interpret else "a long row"
    fails("07.quantize_rowwise", wrong, where)


@needs_fp8
def test_matmul_whose_grouped_order_is_right_for_one_group_only_fails():
    """A grouped order that forgets first_pid_m, GROUP_M = 8 and tiles of 64 rows: every M of the CPU's cases
    was at most 67, one group, and it passed there; the case of 2600 rows (the GPU's of 1823) catches it."""
    wrong = mutant("l07_fp8_quantization", "fp8_matmul", (
        "pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)",
        "num_pid_n = tl.cdiv(N, BLOCK_N)\n"
        "    group_size_m = tl.minimum(tl.cdiv(M, BLOCK_M), GROUP_M)  # the bug: no first_pid_m\n"
        "    pid_m = (tl.program_id(0) % (GROUP_M * num_pid_n)) % group_size_m\n"
        "    pid_n = (tl.program_id(0) % (GROUP_M * num_pid_n)) // group_size_m"))

    def fp8_matmul(a, a_scale, b, b_scale, out):
        wrong(a, a_scale, b, b_scale, out, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8)

    fails("07.fp8_matmul", fp8_matmul, "never written", "2600 x 24 x 40" if current().interpret else "1823")


# --- a sixth review: the two-pass path's guards ------------------------------------------------------

_SECOND_PASS_GUARD = ("        amax = tl.max(running, axis=0)\n"
                      "        safe = tl.where(amax > 0, tl.maximum(amax, 1.1754944e-38), FP8_MAX)\n")


@needs_fp8
@pytest.mark.parametrize("safe, says", [
    ("amax", "row 1 is all zeros"),  # no guard at all: 0 / 0 on a row of zeros
    ("tl.where(amax > 0, amax, FP8_MAX)", "1 / amax overflows to inf"),  # 1 / a subnormal amax
])
def test_quantize_whose_two_pass_path_lacks_a_guard_of_the_one_pass_path_fails(safe, says):
    """Rows of zeros and of tiny values ran only in the one-pass path (300 columns): a two-pass path written
    apart, without its guards, passed (on a GPU too, where the long rows were 3 x 20000 with a row of zeros
    and no tiny row). The long row's case has such rows too."""
    wrong = mutant("l07_fp8_quantization", "quantize_rowwise",
                   (_SECOND_PASS_GUARD, f"        amax = tl.max(running, axis=0)\n        safe = {safe}\n"))
    where = "4 x 16500" if current().interpret else "3 x 20000" if safe == "amax" else "4 x 20000"
    fails("07.quantize_rowwise", wrong, where, says)


@needs_fp8
def test_quantize_whose_two_pass_path_takes_columns_as_contiguous_fails():
    """x's column stride dropped in the two-pass path only: the one transposed case was 300 columns wide (one
    pass), so the long rows are stored column-major too."""
    wrong = mutant("l07_fp8_quantization", "quantize_rowwise",
                   ("x = tl.load(x_row + (start + cols) * stride_xc, mask=mask, other=0.0).to(tl.float32)",
                    "x = tl.load(x_row + (start + cols), mask=mask, other=0.0).to(tl.float32)"))
    fails("07.quantize_rowwise", wrong, "stored column-major")


def test_fp8_matmul_taking_out_as_contiguous_fails():
    """out addressed as out + m * N + n: right for every contiguous out; wrong where out's rows are padded."""
    wrong = mutant("l07_fp8_quantization", "fp8_matmul", ("b.stride(0), b.stride(1), out.stride(0), out.stride(1),",
                                                           "b.stride(0), b.stride(1), N, 1,"))
    failure("07.fp8_matmul", wrong, "out's rows padded")
