"""Exercises of lesson 04: traffic of elementwise chains, sin^4 in one kernel, silu(g) * u."""
from __future__ import annotations

import math

import torch

from ..grading import Case, Exercise, Out, register
from ..grading.harness import Fusion, Speed
from ..grading.inputs import EPS, f64, randn, tolerance, uniform
from ..mode import current, size
from ..roofline import elementwise_cost
from .l02_first_kernels import CAPPED_GRID_LABEL, CAPPED_GRID_LENGTH, WHOLE_BLOCKS, WHOLE_BLOCKS_LABEL

SPEED_N = 1 << 26  # 2^26 elements: 256 MiB of fp32, far beyond any cache
SPEED_ROWS, SPEED_INTER = 4096, 11008  # silu_mul's speed size: a 4096-token prefill of Llama-7B's MLP


def _half() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16

# --- 04.bytes_moved ---------------------------------------------------------------------------


def _bytes_cases(gen):
    questions = [
        (1, 4, 1, False), (1, 4, 1, True),
        (1 << 26, 4, 4, False), (1 << 26, 4, 4, True),  # sin^4 of 2^26 fp32 elements
        (4096 * 11008, 2, 3, False), (4096 * 11008, 2, 3, True),  # a bf16 chain of three ops
        (1823, 8, 7, False), (1823, 8, 7, True),
    ]
    # and two drawn from the seed: a table of the fixed answers is no answer
    for _ in range(2):
        n = int(torch.randint(1, 1 << 30, (1,), generator=gen))
        b = (1, 2, 4, 8)[int(torch.randint(4, (1,), generator=gen))]
        ops = int(torch.randint(1, 12, (1,), generator=gen))
        questions += [(n, b, ops, False), (n, b, ops, True)]
    for n, b, ops, fused in questions:
        expected = 2 * n * b if fused else 2 * ops * n * b
        label = f"{'fused' if fused else 'unfused'}: {ops} op(s) on {n} elements of {b} bytes"
        yield Case(label, (n, b, ops, fused), expected, verify=_verify_bytes)


def _verify_bytes(result, case: Case) -> list[str]:
    n, b, ops, fused = case.args
    if isinstance(result, bool) or not isinstance(result, int):
        if isinstance(result, float) and result == case.expected:
            return [f"returned the float {result!r}: return an int (bytes are whole; use * and //, not /)"]
        return [f"returned {result!r} ({type(result).__name__}), expected the int {case.expected}: return a "
                "Python int (int(...) of a NumPy or torch integer)"]
    if result == case.expected:
        return []
    problems = [f"returned {result}, expected {case.expected}"]
    if result * 2 == case.expected:
        problems.append("that is half: every pass over the data reads the elements AND writes them "
                        "(did you forget the write?)")
    elif fused and result == 2 * ops * n * b and ops > 1:
        problems.append("that is the unfused traffic: fused, the intermediates stay in registers, so the "
                        "chain reads its input once and writes its output once, whatever n_ops is")
    elif not fused and result == 2 * n * b:
        problems.append("that is the fused traffic: unfused, each of the n_ops kernels reads and writes "
                        "all n elements")
    return problems


register(Exercise(
    "04.bytes_moved", "bytes moved by an elementwise chain, unfused and fused",
    "bytes_moved(n_elements, bytes_per_element, n_ops, fused)", _bytes_cases, kernel=False,
    hint={"wrong": "one pass over n elements of b bytes is n * b bytes; each eager op makes two passes (read "
                   "and write), a fused chain makes two passes in total; return an int"}))


# --- 04.sin4 ----------------------------------------------------------------------------------

# An accurate fp32 sinf is off by ~1e-7 per application. On a GPU tl.sin may compile to the
# approximate sin.approx.f32 (abs error ~5e-7 on [-pi, pi], plus |x| * 2^-24 from its argument
# reduction): four applications at |x| <= 50 stay below 1e-5.
_SIN_FP32_TOL = (1e-5, 1e-5)
# fp16/bf16 in and out, computed in fp32: one rounding at the store, at most EPS relative (allow 1.1 EPS),
# plus the fp32 sines' error (atol). Each sin rounded to fp16/bf16 on the way rounds four times and fails.
_SIN_LOW_RTOL = 1.1


def _sin4_expected(x: torch.Tensor) -> torch.Tensor:
    y = f64(x)
    for _ in range(4):
        y = torch.sin(y)
    return y


def _sin4_cases(gen):
    low = [torch.float16, torch.bfloat16] if current().gpu else [torch.float16]
    inputs = [
        ("one element", randn((1,), gen=gen)),
        ("length 1823: no multiple of any block", randn((1823,), gen=gen, scale=2.0)),
        ("a large length plus 3", randn((size((1 << 22) + 3, (1 << 14) + 3),), gen=gen, scale=2.0)),
        ("2-D, contiguous, odd sizes", randn(size((1823, 781), (37, 781)), gen=gen, scale=2.0)),
        ("3-D, contiguous", randn((3, 5, 7), gen=gen)),
        ("2 rows of 3000: more elements than rows x a block (launch over numel, not shape[0])",
         randn((2, 3000), gen=gen, scale=2.0)),
        ("arguments up to +-50: sin's argument reduction",
         uniform((size(1 << 20, 4099),), -50.0, 50.0, gen=gen)),
    ]
    inputs += [(f"length 1823, {str(dt)[6:]} in and out (compute in fp32)",
                randn((1823,), dt, gen=gen, scale=2.0)) for dt in low]
    inputs += [(f"2-D odd sizes, {str(dt)[6:]}", randn(size((1823, 781), (37, 781)), dt, gen=gen, scale=2.0))
               for dt in low]
    inputs.append((f"4 rows, {WHOLE_BLOCKS_LABEL}", randn((4, WHOLE_BLOCKS // 4), gen=gen, scale=2.0)))
    inputs.append((CAPPED_GRID_LABEL, randn((CAPPED_GRID_LENGTH,), gen=gen, scale=2.0)))
    for label, x in inputs:
        atol, rtol = _SIN_FP32_TOL if x.dtype == torch.float32 else (_SIN_FP32_TOL[0], _SIN_LOW_RTOL * EPS[x.dtype])
        yield Case(label, (x, Out("out", tuple(x.shape), x.dtype)), {"out": _sin4_expected(x)}, atol, rtol)


def _intermediate(what: str):
    """The intermediate a fused elementwise chain keeps in registers: one value per element of out, of any
    dtype (`what` names it). Refused as an allocation of the call and as a buffer kept from call to call that
    a launch gets (a store and a load back in the one launch passed). From 4096 elements on: below that an
    allocation is more likely a scalar or a small table than the chain's step."""
    def temporary(case: Case) -> tuple[int, str] | None:
        numel = math.prod(next(a for a in case.args if isinstance(a, Out)).shape)
        return (numel, what) if numel >= 4096 else None
    return temporary


register(Exercise(
    "04.sin4", "sin(sin(sin(sin(x)))) in one kernel", "sin4(x, out)", _sin4_cases, max_launches=1,
    fusion=Fusion("the four sines are applied to each loaded value in registers, one load of x and one store of "
                  "out per element", _intermediate("sin(x) (or a later step) of every element"),
                  own_temporaries=lambda case: (), kept_buffers=True),
    # memory-bound: 8 bytes per fp32 element (read x, write out); each sin counted as one FLOP
    speed=Speed(lambda: (randn(SPEED_N), Out("out", (SPEED_N,), torch.float32)),
                lambda args: elementwise_cost(SPEED_N, 4, flops_per_element=4.0),
                "course_utils.lessons.l04_fusion:sin4", "n = 2^26, fp32"),
    hint={"wrong": "load x once, convert with .to(tl.float32) (tl.sin accepts only fp32/fp64), apply tl.sin "
                   "four times to the values in registers, store once (tl.store rounds to out's dtype)",
          "unwritten": "a contiguous tensor of any shape is x.numel() consecutive elements: launch "
                       "cdiv(x.numel(), BLOCK) programs (not x.shape[0]) with mask = offsets < x.numel()",
          "out_of_bounds": "mask = offsets < n with n = x.numel() on the load and on the store (the last block "
                           "is partial)",
          "nan": "a masked load without other= reads undefined values (NaN in the checker); an unmasked "
                 "lane stores them: mask the store too",
          "launches": "one kernel: four tl.sin calls on the values in registers; a one-sin kernel launched "
                      "four times moves four times the bytes",
          "fusion": "no buffer between the steps: y = tl.sin(y) four times on the loaded values, one tl.store "
                    "of the last",
          "host": "torch.sin outside your kernel is the eager chain this exercise replaces: all four "
                  "sins belong in your kernel"}))


# --- 04.silu_mul ------------------------------------------------------------------------------


def _silu_mul_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """fp16/bf16: computed in fp32 and rounded once, the error is at most half a step of the dtype
    (EPS relative) plus ~1e-6 of fp32 maths: allow 1.1 EPS. A sigmoid or silu rounded to fp16/bf16
    along the way adds a second rounding and fails. atol covers fp16's subnormal steps (2^-24)."""
    if dtype == torch.float32:
        # GPU fp32: tl.sigmoid uses an approximate exp2 and divide (a few ulp each)
        return tolerance(torch.float32, slack=32)
    return 2.0**-24, 1.1 * EPS[dtype]


def _silu_mul_expected(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    g64 = f64(g)
    return g64 * torch.sigmoid(g64) * f64(u)


def _silu_mul_cases(gen):
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if current().gpu else [])
    shape_2d = size((1823, 781), (37, 781))
    for dtype in dtypes:
        name = str(dtype)[6:]
        inputs = [
            ("one element", randn((1,), dtype, gen), randn((1,), dtype, gen)),
            ("2-D (tokens, intermediate), odd sizes", randn(shape_2d, dtype, gen, scale=3.0),
             randn(shape_2d, dtype, gen)),
            ("3-D, contiguous", randn((2, 3, 129), dtype, gen, scale=3.0), randn((2, 3, 129), dtype, gen)),
            ("2 rows of 3000: more elements than rows x a block (launch over numel, not shape[0])",
             randn((2, 3000), dtype, gen, scale=3.0), randn((2, 3000), dtype, gen)),
            ("large |g| (uniform in +-100): exp(g) and exp(-g) overflow",
             uniform(shape_2d, -100.0, 100.0, dtype, gen), randn(shape_2d, dtype, gen)),
        ]
        atol, rtol = _silu_mul_tolerance(dtype)
        for label, g, u in inputs:
            yield Case(f"{label}, {name}", (g, u, Out("out", tuple(g.shape), dtype)),
                       {"out": _silu_mul_expected(g, u)}, atol, rtol)
    g, u = randn((4, WHOLE_BLOCKS // 4), gen=gen, scale=3.0), randn((4, WHOLE_BLOCKS // 4), gen=gen)
    yield Case(f"4 rows, {WHOLE_BLOCKS_LABEL}, float32", (g, u, Out("out", tuple(g.shape), torch.float32)),
               {"out": _silu_mul_expected(g, u)}, *_silu_mul_tolerance(torch.float32))
    g, u = randn(CAPPED_GRID_LENGTH, gen=gen, scale=3.0), randn(CAPPED_GRID_LENGTH, gen=gen)
    yield Case(f"{CAPPED_GRID_LABEL}, float32", (g, u, Out("out", (CAPPED_GRID_LENGTH,), torch.float32)),
               {"out": _silu_mul_expected(g, u)}, *_silu_mul_tolerance(torch.float32))


register(Exercise(
    "04.silu_mul", "silu(g) * u in one kernel", "silu_mul(g, u, out)", _silu_mul_cases, max_launches=1,
    fusion=Fusion("silu(g) * u is computed in registers from one load of g and of u, and stored once",
                  _intermediate("silu(g) of every element"), own_temporaries=lambda case: (), kept_buffers=True),
    # memory-bound: read g and u, write out, 2 bytes each; ~5 FLOPs per element
    speed=Speed(lambda: (randn((SPEED_ROWS, SPEED_INTER), _half()), randn((SPEED_ROWS, SPEED_INTER), _half()),
                         Out("out", (SPEED_ROWS, SPEED_INTER), _half())),
                lambda args: elementwise_cost(SPEED_ROWS * SPEED_INTER, 2, n_inputs=2, flops_per_element=5.0),
                "course_utils.lessons.l04_fusion:silu_mul", f"{SPEED_ROWS} x {SPEED_INTER}, bf16"),
    hint={"wrong": "load g and u and convert both with .to(tl.float32); compute g * sigmoid(g) * u in fp32 "
                   "(silu on g, the gate, not on u); round only once, in tl.store",
          "nan": "sigmoid = 1 / (1 + exp(-g)) (tl.sigmoid), never exp(g) / (1 + exp(g)), which is "
                 "inf / inf = NaN for large g; and masked loads need a mask on the store too",
          "unwritten": "launch over out.numel() elements, cdiv(n, BLOCK) programs, not over the rows "
                       "(shape[0]); mask = offsets < n",
          "out_of_bounds": "mask = offsets < n (n = numel) on both loads and the store",
          "launches": "one kernel: silu and the product on the values in registers; F.silu then * is two "
                      "kernels and a temporary",
          "fusion": "no buffer for silu(g): s = g * tl.sigmoid(g) stays in registers and multiplies u there; "
                    "store only out",
          "host": "F.silu, torch.sigmoid and * outside your kernel are the eager version: compute in "
                  "your kernel"}))
