"""Exercises of lesson 07: e4m3 decoding, row-wise FP8 quantization, an FP8 matmul, int4 packing."""
from __future__ import annotations

import math

import torch

from ..fp8 import E4M3_MAX, fp8_matmul_ref, install_fp8_fix, quantize_rowwise_ref
from ..grading import Case, Exercise, Out, register
from ..grading.harness import Speed
from ..grading.inputs import EPS, f64, randn, transposed, uniform
from ..mode import current, size
from ..roofline import Cost, matmul_cost

install_fp8_fix()  # checks of fp8 kernels in the interpreter need its float -> fp8 cast to be right

E4M3 = torch.float8_e4m3fn
SOLUTIONS = "course_utils.lessons.l07_fp8_quantization"
SPEED_ROWS, SPEED_COLS = 8192, 8192  # quantize_rowwise's speed size
SPEED_MM = 4096  # fp8_matmul's: 4096^3


def _half() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16


def _quantize_speed_args():
    return (randn((SPEED_ROWS, SPEED_COLS), _half()), Out("out", (SPEED_ROWS, SPEED_COLS), E4M3),
            Out("scale_out", (SPEED_ROWS,), torch.float32))


def _fp8_matmul_speed_args():
    n = SPEED_MM
    return (randn((n, n)).to(E4M3), uniform((n,), 1e-3, 1e-2), randn((n, n)).to(E4M3), uniform((n,), 1e-3, 1e-2),
            Out("out", (n, n), torch.bfloat16))


# --- 07.decode_e4m3 ---------------------------------------------------------------------------

def _fields(bits: int) -> str:
    return f"{bits >> 7} {(bits >> 3) & 0xF:04b} {bits & 0x7:03b}"


def _kind(bits: int) -> str:
    exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return "NaN"
    if exponent == 0:
        return "zero" if mantissa == 0 else "subnormal"
    return "normal"


def _decode_verify(result, case: Case) -> list[str]:
    bits, expected = case.args[0], case.expected
    if isinstance(result, torch.Tensor) or not isinstance(result, int | float):
        return [f"returned {type(result).__name__}; return a Python float"]
    result = float(result)
    where = f"bits 0x{bits:02X} = {_fields(bits)} ({_kind(bits)})"
    if math.isnan(expected):
        if math.isnan(result):
            return []
        return [(f"{where}: expected NaN, got {result!r}. In e4m3fn S 1111 111 is NaN, and it is the only "
                 "special value: there is no infinity")]
    if math.isnan(result):
        return [f"{where}: expected {expected!r}, got NaN; only S 1111 111 is NaN"]
    if result != expected:
        hint = ""
        if _kind(bits) in ("subnormal", "zero"):
            hint = (". Exponent field 0 is a subnormal: no implicit leading 1, value = (M/8) * 2^-6 "
                    "(the exponent is 1 - bias, not 0 - bias)")
        elif _kind(bits) == "normal":
            hint = ". A normal number is (1 + M/8) * 2^(E - 7): bias 7, implicit leading 1"
        return [f"{where}: expected {expected!r}, got {result!r}{hint}"]
    if math.copysign(1.0, result) != math.copysign(1.0, expected):
        return [f"{where}: expected {expected!r}, got {result!r}: the sign bit applies to zero too"]
    return []


def _decode_cases(gen):
    codes = torch.arange(256, dtype=torch.uint8).view(E4M3).to(torch.float64).tolist()
    for bits in range(256):
        yield Case(f"bits 0x{bits:02X} = {_fields(bits)} ({_kind(bits)})", (bits,), codes[bits],
                   verify=_decode_verify)


# --- 07.quantize_rowwise ----------------------------------------------------------------------

def _quantize_verify(outs, case: Case) -> list[str]:
    x = f64(case.args[0])  # (rows, cols)
    q = f64(outs["out"])
    s = f64(outs["scale_out"])  # (rows,)
    amax = x.abs().amax(dim=1)
    nonzero = amax > 0
    # A row whose amax is an fp32 subnormal (below 2^-126): 1 / amax overflows to inf, so a kernel may scale it
    # as if its amax were 2^-126 (the course's), or flush it to 0 as a GPU's FTZ arithmetic would. Its scale
    # and row max are free; what it writes must still dequantize to x (the error bound below).
    exact = nonzero & (amax >= 2.0**-126)
    problems = []
    bad_scale = ~torch.isfinite(s)
    if bool(bad_scale.any()):
        i = int(bad_scale.nonzero()[0, 0])
        problems.append(f"scale_out[{i}] = {float(s[i])} (the row's amax is {float(amax[i]):g}); "
                        "an all-zero row needs a finite scale, e.g. 1")
        return problems
    want = amax / E4M3_MAX
    rel = ((s - want).abs() / want.clamp_min(1e-300))[exact]
    if rel.numel() and float(rel.max()) > 1e-5:
        i = int(exact.nonzero()[int(rel.argmax()), 0])
        got, exp = float(s[i]), float(want[i])
        why = ""
        if math.isclose(got, float(amax[i]) / 127, rel_tol=1e-4):
            why = ": that is amax / 127, int8's maximum; e4m3's largest finite value is 448"
        elif math.isclose(got, float(x[i].max()) / E4M3_MAX, rel_tol=1e-4):
            why = (": that is max(x) / 448, the largest value, not the largest magnitude: amax = max |x| "
                   "(tl.max(tl.abs(x)))")
        elif bool(exact.sum() > 1) and math.isclose(got, float(amax.max()) / E4M3_MAX, rel_tol=1e-4):
            why = (": that is the whole tensor's amax / 448, one scale for every row; each row has its own, "
                   "amax of ITS row")
        elif math.isclose(got, 1 / exp, rel_tol=1e-4):
            why = (": that is 448 / amax, the inverse; store the dequantization scale amax / 448 "
                   "(x ~ out * scale)")
        problems.append(f"scale_out[{i}] = {got:.6g}, expected amax / 448 = {exp:.6g}{why}")
        return problems
    row_max = q.abs().amax(dim=1)
    off = exact & (row_max != E4M3_MAX)
    if bool(off.any()):
        i = int(off.nonzero()[0, 0])
        problems.append(f"row {i}: its largest |out| is {float(row_max[i]):g}; amax must map to exactly 448 "
                        "(out = x / scale_out, clamped to [-448, 448])")
    zero_rows = ~nonzero
    if bool(zero_rows.any()) and bool((q[zero_rows] != 0).any()):
        i = int((zero_rows & (q != 0).any(dim=1)).nonzero()[0, 0])
        problems.append(f"row {i} is all zeros, but out[{i}] is not (scale_out[{i}] = {float(s[i]):g}): with amax "
                        "0, x * (448 / amax) is 0 * inf = NaN before the clamp; give an all-zero row scale 1, so "
                        "that out = 0")
    err = (q * s[:, None] - x).abs()
    bound = 2.0**-4 * x.abs() * (1 + 1e-5) + s[:, None] * 2.0**-10 * 1.01  # half an e4m3 step
    over = err > bound
    if bool(over.any()):
        i, j = (int(v) for v in over.nonzero()[0])
        why = "round to nearest"
        if not bool(exact[i]) and bool(nonzero[i]):
            why = (f"row {i}'s amax {float(amax[i]):.3g} is an fp32 subnormal, and 1 / amax overflows to inf: "
                   "take tl.maximum(amax, 1.1754944e-38) (fp32's smallest normal number) before inverting it")
        problems.append(f"out[{i}, {j}] * scale_out[{i}] = {float(q[i, j] * s[i]):.6g} is more than half an "
                        f"e4m3 step away from x[{i}, {j}] = {float(x[i, j]):.6g}: {why}")
    return problems


def _quantize_case(label, x):
    rows, cols = x.shape
    q, scale = quantize_rowwise_ref(x.cpu())
    # Outputs are judged by `_quantize_verify` (exact scale, amax -> 448, half a step of rounding error),
    # not by distance to the reference: a kernel that divides where the reference multiplies may land
    # one e4m3 step away on a near-tie, and an all-zero row may have any finite scale. The comparison
    # with atol=inf still catches NaN and elements never written.
    return Case(label, (x, Out("out", (rows, cols), E4M3), Out("scale_out", (rows,), torch.float32)),
                {"out": f64(q), "scale_out": f64(scale)}, math.inf, 0.0, verify=_quantize_verify)


def _quantize_cases(gen):
    half = torch.bfloat16 if current().gpu else torch.float16  # the interpreter has no bf16 arithmetic
    rows, cols = size((1823, 781), (37, 781))
    yield _quantize_case("1 x 1", randn((1, 1), gen=gen))
    yield _quantize_case(f"{rows} x {cols}: no multiple of any block", randn((rows, cols), gen=gen))
    yield _quantize_case(f"{rows} x {cols} {str(half)[6:]}", randn((rows, cols), half, gen))
    yield _quantize_case("one column", randn((rows, 1), gen=gen))
    x = randn((7, 300), gen=gen)
    x[2] = 0
    yield _quantize_case("7 x 300, row 2 all zeros (amax 0: a 0/0 here is NaN)", x)
    yield _quantize_case("3 x 64, every row all zeros", torch.zeros((3, 64), device=current().device))
    x = randn((rows, 500), gen=gen)
    where = torch.randint(0, 500, (rows,), generator=gen).to(x.device)
    x[torch.arange(rows, device=x.device), where] = 1e4  # one outlier per row sets its scale
    yield _quantize_case(f"{rows} x 500, one outlier of 1e4 per row", x)
    yield _quantize_case(f"{rows} x 300, values up to 1e6, far beyond 448",
                         randn((rows, 300), gen=gen, scale=2e5))
    yield _quantize_case(f"{rows} x 300, values around 1e-6", randn((rows, 300), gen=gen, scale=1e-6))
    yield _quantize_case("5 x 300, values around 1e-37: 448 / amax overflows fp32 to inf (and 0 * inf is NaN); "
                         "x / amax first, then times 448", randn((5, 300), gen=gen, scale=1e-37))
    yield _quantize_case(f"{rows} x 300 transposed: strides (1, {rows})", transposed((rows, 300), gen=gen))
    wide = size(20000, 5000)
    x = randn((3, wide), gen=gen)
    x[1] = 0  # on a GPU, a row of zeros in the two-pass path (20000 columns: more than one block)
    # stored column-major as the short transposed case above: a path for long rows must take the strides too
    yield _quantize_case(f"3 x {wide}: a long row, row 1 all zeros; stored column-major, strides (1, 3)",
                         x.t().contiguous().t())
    # Last, so that the cases above draw what they drew before it came. Every amax above is a normal fp32
    # number, whose inverse is finite: a kernel that multiplies by 1 / amax passed them all.
    yield _quantize_case("5 x 300, values around 1e-40, fp32 subnormals: 1 / amax overflows fp32 to inf",
                         randn((5, 300), gen=gen, scale=1e-40))
    # The CPU's long row above (5000) fits one block of up to 16384 columns (the GPU's 20000 does not): a
    # host that takes one pass up to there never ran its two-pass path, and a wrong one passed. Its rows of
    # zeros and of tiny values are for the guards: every such row above fits one block, and a two-pass path
    # that left them out (0 / 0, 448 / amax, 1 / a subnormal amax) passed, on a GPU too.
    long_row = size(20000, 16500)
    x = randn((4, long_row), gen=gen)
    x[1] = 0
    x[2] *= 1e-37
    x[3] *= 1e-40
    yield _quantize_case(f"4 x {long_row}: longer than a block of 16384, two passes (amax, then quantize) that "
                         "each loop over every block of the row; row 1 all zeros, rows 2 and 3 of values "
                         "near 1e-37 and 1e-40, and stored column-major (strides (1, 4)): the two-pass "
                         "path needs the one-pass path's guards and x's strides", x.t().contiguous().t())
    # The mirror of the 1e-37 case: values past 3.4e38 / 448 = 7.6e35, where x * 448 overflows fp32 to inf
    # (clamped to 448: every large element of the row the same) unless x is divided by amax first
    yield _quantize_case("5 x 300, values around 1e36 (fp32 holds up to 3.4e38): x * 448 overflows fp32 to inf; "
                         "x / amax first, then times 448", randn((5, 300), gen=gen, scale=1e36))


# --- 07.fp8_matmul ----------------------------------------------------------------------------

def _fp8_matrix(shape, gen):
    """An e4m3 matrix spanning the format's range, like a quantized tensor: rows scaled to amax 448."""
    x = randn(shape, gen=gen)
    q, _ = quantize_rowwise_ref(x.cpu())
    return q.to(x.device)


def _matmul_explain(outs: dict, case: Case) -> str:
    """What wrong FP8 matmul values match: scales left out, or applied along the wrong axis."""
    a, a_scale, b, b_scale = (f64(t) for t in case.args[:4])
    got = f64(outs["out"])
    if not bool(torch.isfinite(got).all()):
        return ""
    raw = a @ b.T  # (M, N) before any scale
    candidates = {
        "that is a @ b.T without the scales: multiply the accumulator by a_scale[rows, None] * "
        "b_scale[None, cols] after the K loop": raw,
        "that is (a @ b.T) * a_scale[:, None] without b_scale[None, :]": raw * a_scale[:, None],
        "that is (a @ b.T) * b_scale[None, :] without a_scale[:, None]": raw * b_scale[None, :],
    }
    if a_scale.numel() == b_scale.numel():
        candidates["the scales are swapped: a_scale belongs to the rows of out (M), b_scale to its columns "
                   "(N)"] = raw * b_scale[:, None] * a_scale[None, :]
    for text, want in candidates.items():
        if torch.allclose(got, want, atol=case.atol, rtol=case.rtol):
            return text
    return ""


def _matmul_case(label, M, N, K, out_dtype, gen, b_transposed=False, a_transposed=False, out_layout="contiguous"):
    a = _fp8_matrix((K, M), gen).t() if a_transposed else _fp8_matrix((M, K), gen)
    b = _fp8_matrix((K, N), gen).t() if b_transposed else _fp8_matrix((N, K), gen)  # (N, K)
    a_scale = uniform((M,), 1e-3, 1e-2, gen=gen)
    b_scale = uniform((N,), 1e-3, 1e-2, gen=gen)
    a64, b64 = f64(a) * f64(a_scale)[:, None], f64(b) * f64(b_scale)[:, None]
    expected = fp8_matmul_ref(a, a_scale, b, b_scale)
    # Products of e4m3 values are exact in fp32; what is left is the accumulation (fp32 in the
    # interpreter; on Hopper fp8 tensor cores keep fewer bits, so allow 2^-9 of sum |a_i b_i|) and the
    # rounding of the output to its dtype.
    magnitude = (a64.abs() @ b64.abs().T).max().item()
    atol = magnitude * (2.0**-9 if current().gpu else 2.0**-16)
    rtol = 2 * EPS[out_dtype]
    args = (a, a_scale, b, b_scale, Out("out", (M, N), out_dtype, layout=out_layout))
    return Case(f"{label}, out {str(out_dtype)[6:]}", args, {"out": expected}, atol, rtol, explain=_matmul_explain)


def _matmul_cases(gen):
    outs = (torch.bfloat16, torch.float32) if current().gpu else (torch.float32, torch.float16)
    m, n, k = size((1823, 781, 1000), (67, 45, 100))
    yield _matmul_case("1 x 1 x 1", 1, 1, 1, outs[0], gen)
    yield _matmul_case(f"{m} x {n} x {k}: K no multiple of any tile", m, n, k, outs[0], gen)
    yield _matmul_case(f"{m} x {n} x {k}", m, n, k, outs[1], gen)
    yield _matmul_case("one token: 1 x 256 x 256", 1, 256, 256, outs[0], gen)
    yield _matmul_case("K = 1", 33, 17, 1, outs[0], gen)
    yield _matmul_case(f"b as the transposed view of a (K, N) tensor: strides (1, {n})", m, n, k, outs[0],
                       gen, b_transposed=True)
    # Last, so that the cases above draw what they drew before it came. The CPU's K above is at most 256:
    # one K block of 256, and a loop that never advances its pointers passed them all.
    yield _matmul_case("K = 600: several K blocks even of 256, the loop advances a's and b's pointers",
                       5, 7, 600, outs[0], gen)
    # Every a above is contiguous, strides (K, 1): a kernel that passed K and 1 for a's strides passed them
    # all; and every out above too, for out's.
    yield _matmul_case("a as the transposed view of a (K, M) tensor: strides (1, 37); out's rows padded (row "
                       "stride 25): address a and out with their own strides", 37, 20, 48, outs[0], gen,
                       a_transposed=True, out_layout="padded")
    # The CPU's M above is at most 67: a single group of tile rows for any GROUP_M >= 2 (the GPU's 1823 rows
    # are two groups of 8 tile rows of 128), and a grouped order right for one group only passed.
    if not current().gpu:
        yield _matmul_case("2600 x 24 x 40: more tile rows than one group holds (GROUP_M = 8 of up to 256 rows), "
                           "the last group partial: grouped_tile's first_pid_m = group_id * GROUP_M, group_size_m "
                           "= min(num_pid_m - first_pid_m, GROUP_M)", 2600, 24, 40, outs[0], gen)


# --- 07.pack_int4 / 07.unpack_int4 ------------------------------------------------------------

def _nibbles(shape, gen):
    return torch.randint(0, 16, shape, generator=gen, dtype=torch.uint8)


def _pack_verify(result, case: Case) -> list[str]:
    lo, hi = case.args
    want = case.expected
    if not isinstance(result, torch.Tensor):
        return [f"returned {type(result).__name__}; return a uint8 tensor"]
    if result.dtype != torch.uint8:
        return [f"returned a {str(result.dtype)[6:]} tensor; return uint8 (one byte per pair)"]
    if tuple(result.shape) != tuple(want.shape):
        return [f"returned shape {tuple(result.shape)}, expected {tuple(want.shape)} (that of lo and hi)"]
    got = result.cpu()
    if torch.equal(got, want):
        return []
    if torch.equal(got, (hi.to(torch.uint8) | (lo.to(torch.uint8) << 4))):
        return ["the nibbles are swapped: lo goes in bits 0-3 (the low nibble), hi in bits 4-7"]
    i = int((got != want).flatten().nonzero()[0, 0])
    return [(f"element {i}: lo={int(lo.flatten()[i])}, hi={int(hi.flatten()[i])} should pack to "
             f"0x{int(want.flatten()[i]):02X}, got 0x{int(got.flatten()[i]):02X}")]


def _pack_case(label, lo, hi):
    expected = lo | (hi << 4)
    return Case(label, (lo.clone(), hi.clone()), expected, verify=_pack_verify)


def _pack_cases(gen):
    every = torch.arange(256, dtype=torch.int32)
    yield _pack_case("one pair", _nibbles((1,), gen), _nibbles((1,), gen))
    yield _pack_case("all 256 (lo, hi) pairs", (every & 0xF).to(torch.uint8), (every >> 4).to(torch.uint8))
    yield _pack_case("3 x 7", _nibbles((3, 7), gen), _nibbles((3, 7), gen))
    yield _pack_case("0 and 15 only", (_nibbles((64,), gen) > 7).to(torch.uint8) * 15,
                     (_nibbles((64,), gen) > 7).to(torch.uint8) * 15)


def _unpack_verify(result, case: Case) -> list[str]:
    (packed,) = case.args
    want_lo, want_hi = case.expected
    if not isinstance(result, tuple | list) or len(result) != 2:
        return [f"returned {type(result).__name__}; return a tuple (lo, hi) of two tensors"]
    problems = []
    for name, got, want in (("lo", result[0], want_lo), ("hi", result[1], want_hi)):
        if not isinstance(got, torch.Tensor):
            return [f"{name} is a {type(got).__name__}; return tensors"]
        if tuple(got.shape) != tuple(want.shape):
            return [f"{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"]
        if got.dtype != torch.uint8:
            problems.append(f"{name} is {str(got.dtype)[6:]}; return uint8 tensors")
            continue
        got = got.cpu()
        if not torch.equal(got, want):
            if torch.equal(got, want_hi if name == "lo" else want_lo):
                return ["lo and hi are swapped: lo is bits 0-3 (packed & 0xF), hi is bits 4-7 (packed >> 4)"]
            if name == "hi" and torch.equal(got, (packed.view(torch.int8) >> 4).view(torch.uint8)):
                return ["hi is sign-extended: >> on an int8 copies the sign bit in (0xF0 >> 4 is -1, 255 as "
                        "uint8, not 15); shift the uint8 itself, or mask with & 0xF after the shift"]
            i = int((got != want).flatten().nonzero()[0, 0])
            byte = int(packed.flatten()[i])
            problems.append(f"{name} of byte 0x{byte:02X} should be {int(want.flatten()[i])}, "
                            f"got {int(got.flatten()[i])}")
    return problems


def _unpack_case(label, packed):
    return Case(label, (packed.clone(),), (packed & 0xF, packed >> 4), verify=_unpack_verify)


def _unpack_cases(gen):
    yield _unpack_case("all 256 byte values", torch.arange(256, dtype=torch.int32).to(torch.uint8))
    yield _unpack_case("one byte", torch.randint(0, 256, (1,), generator=gen, dtype=torch.uint8))
    yield _unpack_case("5 x 9", torch.randint(0, 256, (5, 9), generator=gen, dtype=torch.uint8))


# --- registration -----------------------------------------------------------------------------

# Every 8-bit (and 4-bit) float type this torch has: float8_e4m3fn, ..._e4m3fnuz, ..._e5m2, ..._e8m0fnu...
FLOAT8_DTYPES = tuple(dict.fromkeys(
    getattr(torch, name) for name in dir(torch)
    if name.startswith(("float8_", "float4_")) and isinstance(getattr(torch, name), torch.dtype)))

register(Exercise(
    "07.decode_e4m3", "decode a float8_e4m3fn bit pattern", "decode_e4m3(bits)", _decode_cases,
    hint={"wrong": "sign = bit 7, exponent = bits 6-3 (bias 7), mantissa = bits 2-0; exponent 0 is subnormal "
                   "(M/8 * 2^-6), S 1111 111 is NaN, there is no infinity; return a Python float"},
    kernel=False,
    max_launches=0,  # Triton's own fp8 (a bitcast to tl.float8e4nv in a kernel) is a decoder too: no kernels
    # A decoder built on torch's own fp8 (`.view(torch.float8_e4m3fn)`, `.to(...)`) would only check torch
    # against itself: any torch op that touches a float8 tensor (of any of torch's 8-bit float types:
    # e4m3fnuz decodes e4m3fn but for a factor 2) is refused, and so is a call of the course's own decoder.
    # Bit arithmetic is fine on Python ints and on torch integer tensors alike, int() and float() included.
    # numpy or ml_dtypes shortcuts are not seen.
    forbidden_dtypes=FLOAT8_DTYPES,
    dtype_message=("decodes with torch's own float8 type (a tensor of dtype float8_e4m3fn or another "
                   "float8_*, from .view(...) or .to(...)): that checks torch against itself. Decode the "
                   "bits yourself: shifts and masks on the int (or on a torch integer tensor, then int() / "
                   "float()) are all allowed"),
    forbidden_calls=("course_utils.fp8_interpreter:decode", "course_utils.fp8_interpreter:table",
                     "course_utils.fp8_interpreter:_table"),
    call_message="that checks the course against itself; decode the bits yourself, with shifts and masks"))
register(Exercise(
    "07.quantize_rowwise", "row-wise e4m3 quantization", "quantize_rowwise(x, out, scale_out)",
    _quantize_cases,
    # memory-bound: read x (2 bytes per element), write out (1 byte) and one fp32 scale per row; ~3 FLOPs
    # per element (|x| for the max, the scaling, the clamp)
    speed=Speed(_quantize_speed_args,
                lambda args: Cost(3.0 * SPEED_ROWS * SPEED_COLS, 3 * SPEED_ROWS * SPEED_COLS + 4 * SPEED_ROWS),
                f"{SOLUTIONS}:quantize_rowwise", f"{SPEED_ROWS} x {SPEED_COLS}, bf16 -> e4m3"),
    hint={"wrong": "per row: amax = max |x| in fp32; scale_out = amax / 448 (not amax / 127, not 448 / amax); "
                   "out = clamp(x / amax * 448, -448, 448) cast to e4m3; address x with both of its strides",
          "nan": "an all-zero row has amax 0: give it scale 1 (tl.where(amax > 0, amax, 448)), so that out = 0 "
                 "and no 0/0; masked lanes load with other=0.0 (a NaN lane would become the row's amax)",
          "unwritten": "one program per row; a row longer than your block needs a loop over its blocks (one "
                       "pass for amax, a second to quantize and store every block); store scale_out[row]",
          "out_of_bounds": "mask cols < n_cols on every load and store of the row; scale_out has one element "
                           "per row; address x with x.stride(0) and x.stride(1) (it may be transposed)",
          "host": "x.abs().amax(), division or .to(float8) outside your kernel quantize with PyTorch: "
                  "do it in your kernel"}))
register(Exercise(
    "07.fp8_matmul", "FP8 matmul with per-row scales", "fp8_matmul(a, a_scale, b, b_scale, out)",
    _matmul_cases,
    # compute-bound on the fp8 tensor cores: 1-byte operands, a bf16 output
    speed=Speed(_fp8_matmul_speed_args,
                lambda args: Cost(matmul_cost(SPEED_MM, SPEED_MM, SPEED_MM, 1).flops,
                                  2 * SPEED_MM * SPEED_MM + 2 * SPEED_MM * SPEED_MM),
                f"{SOLUTIONS}:fp8_matmul", f"{SPEED_MM} x {SPEED_MM} x {SPEED_MM}, e4m3 -> bf16", roof="fp8"),
    hint={"wrong": "load a's tile with a.stride(0), a.stride(1); b is (N, K): load its tile as (BLOCK_N, "
                   "BLOCK_K) with b.stride(0), b.stride(1) and use tl.dot(a, tl.trans(b)); mask the K tail; "
                   "multiply the fp32 accumulator by a_scale[rows, None] and b_scale[None, cols] after the K loop",
          "nan": "a masked K-tail load without other= reads undefined values (NaN in the checker) into "
                 "tl.dot: give it other=0.0",
          "unwritten": "cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs, each storing its (BLOCK_M, BLOCK_N) tile "
                       "masked with rows < M and cols < N",
          "out_of_bounds": "mask the K tail of a and b (k < K) and the scales' loads (rows < M, cols < N), and "
                           "the store; address a and b each with its own strides (either may be a transposed "
                           "view)",
          "host": "no torch matmul or dequantization outside your kernel: the scales are applied to the fp32 "
                  "accumulator in your kernel"}))
register(Exercise(
    "07.pack_int4", "pack two nibbles per byte", "pack_int4(lo, hi)", _pack_cases,
    hint={"wrong": "byte = lo | (hi << 4) in uint8 (lo in bits 0-3, hi in bits 4-7)",
          "input": "build a new tensor: lo and hi are read-only (no <<= or |= on them)"}, kernel=False))
register(Exercise(
    "07.unpack_int4", "unpack two nibbles per byte", "unpack_int4(packed)", _unpack_cases,
    hint={"wrong": "lo = packed & 0xF, hi = packed >> 4, both uint8 (>> on a uint8 shifts zeros in)",
          "input": "return new tensors: packed is read-only (no &= or >>= on it)"}, kernel=False))
