"""Exercises of lesson 06: RMSNorm, gate/up matmuls with SiLU in one kernel, the fused RMSNorm + MLP.

Every case label says what the case is there to catch: a failure header names the case, so it points
at the likely mistake (statistics in fp16, eps outside the square root, silu on the wrong projection...).
Shapes: hidden sizes that are no power of two and no multiple of 16 (40, 80, 781), intermediate 136
or 1000, rows 1..37 on the CPU and up to 1823 on a GPU, one case of 270 x 300 -> 280 on both, and one of
2600 rows (hidden 24 -> 300) for the grouped tile order. x "may have any strides": the strided case takes
every other column of a wider tensor, so neither of its strides is the contiguous one.
"""
from __future__ import annotations

import math

import torch

from ..grading import Case, Exercise, Out, register
from ..grading.harness import Fusion, Speed, one_rounding
from ..grading.inputs import f64, randn, tolerance, uniform
from ..mode import current, size
from ..roofline import Cost

SOLUTIONS = "course_utils.lessons.l06_fused_rmsnorm_mlp"
ROWS, HIDDEN, INTER = 4096, 4096, 11008  # the speed line's size: a 4096-token prefill of Llama-7B's MLP
# (rows, hidden, intermediate) past two tiles of 128 in each: a kernel that never advances its K pointers
# or launches one tile of rows still fails on the CPU, whose other cases fit in one tile
BIG = (270, 300, 280)
# (rows, hidden, intermediate) with more tile rows than one group of GROUP_M = 8 holds, whatever BLOCK_M up to
# 256 (11 to 163 tile rows, the last group partial), and 2 or more tile columns: a grouped order right only
# while the grid is one group (first_pid_m forgotten) fails here, as in lesson 03's matmul. hidden is one K
# step, so the interpreter runs it in a few seconds.
TALL = (2600, 24, 300)
TALL_LABEL = (f"{TALL[0]} rows, hidden {TALL[1]}, intermediate {TALL[2]}: more tile rows than one group holds "
              "(GROUP_M = 8 of up to 256 rows), the last group partial: grouped_tile's first_pid_m = group_id * "
              "GROUP_M, group_size_m = min(num_pid_m - first_pid_m, GROUP_M)")


def _half() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16


def _weights_speed(n: int, k: int) -> torch.Tensor:
    return randn((n, k), _half(), scale=k ** -0.5)


def _dtypes():
    """fp32 and fp16 everywhere; bf16 only on a GPU (the interpreter has no bf16 arithmetic)."""
    return (torch.float32, torch.float16, torch.bfloat16) if current().gpu else (torch.float32, torch.float16)


def _dot_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """Outputs of fp32-accumulated dots whose terms stay ~1: a few roundings of the output dtype.

    fp32 gets more slack: its sums of K products carry errors near its tiny rounding step (and on a
    GPU fp32 dots run as TF32). Wrong answers are off by 1e-2 or more in every dtype.
    """
    return tolerance(dtype, dot=True, slack=64 if dtype == torch.float32 else 16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _rmsnorm64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = f64(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * f64(weight)


def _gate_up_silu64(x, w_gate, w_up) -> torch.Tensor:
    g = x @ f64(w_gate).T
    return torch.nn.functional.silu(g) * (x @ f64(w_up).T)


def _scaled_rows(rows: int, hidden: int, dtype, gen, high: float) -> torch.Tensor:
    """Rows of N(0, 1) values times scales spread log-uniformly from 1e-2 to `high`; the last row is 0."""
    scales = 10 ** uniform((rows, 1), -2.0, math.log10(high), torch.float64, gen)  # (rows, 1)
    x = randn((rows, hidden), torch.float64, gen) * scales
    x[-1] = 0.0
    return x.to(dtype)


def _wider(rows: int, hidden: int, dtype, gen) -> torch.Tensor:
    """x as every other column from column 3 of a (rows, 2 * hidden + 7) tensor: strides (2 * hidden + 7, 2),
    offset 3. "Any strides" is both: a kernel that takes x.stride(1) as 1 reads the wrong columns."""
    return randn((rows, 2 * hidden + 7), dtype, gen)[:, 3:3 + 2 * hidden:2]


def _wide_edges(dtype, gen, hidden: int = 4100) -> torch.Tensor:
    """4 strided rows (as _wider) wider than a 4096-column block, scaled by 300, 0.03, 1 and 0."""
    scales = torch.tensor([[300.0], [0.03], [1.0], [0.0]], dtype=torch.float64, device=current().device)
    return (randn((4, 2 * hidden + 7), torch.float64, gen) * scales).to(dtype)[:, 3:3 + 2 * hidden:2]


def _wider_label(hidden: int) -> str:
    return (f"x every other column of a wider tensor (strides ({2 * hidden + 7}, 2), not ({hidden}, 1)): "
            "address x with both its strides, x.stride(0) and x.stride(1); out's rows padded: address out with "
            "its own strides too")


def _out_layout(x: torch.Tensor) -> str:
    """out's rows padded where x is a strided view (the cases of _wider_label): out has its own strides too."""
    return "padded" if x.stride(1) != 1 else "contiguous"


# --- 06.rmsnorm -------------------------------------------------------------------------------

def _rmsnorm_explain(outs: dict, case: Case) -> str:
    """What wrong RMSNorm values match: eps outside the square root, no square root, the mean over the
    block or over the rows, no weight, x * x overflowing fp16."""
    x, weight, eps = f64(case.args[0]), f64(case.args[1]), case.args[2]
    got = f64(outs["out"])
    n = x.shape[1]
    if case.args[0].dtype == torch.float16 and bool(((got == 0) & (case.expected["out"] != 0)).any()) \
            and float(x.abs().max()) > 256:
        return ("outputs are 0 where they should not be: x * x overflowed fp16 (inf above |x| = 256) and "
                "1/sqrt(inf) = 0; convert x with .to(tl.float32) before squaring")
    if not bool(torch.isfinite(got).all()):
        return ""
    ms = x.pow(2).mean(1, keepdim=True)
    block = 1 << max(n - 1, 0).bit_length()
    candidates = {
        "that is x / (sqrt(mean(x**2)) + eps) * weight: eps belongs inside the square root, "
        "rsqrt(mean(x**2) + eps)": x / (ms.sqrt() + eps) * weight,
        "that is x / (mean(x**2) + eps) * weight: the square root is missing (rsqrt, not 1/x)":
            x / (ms + eps) * weight,
        "that is RMSNorm without the weight: multiply by weight[col] at the end": x * torch.rsqrt(ms + eps),
        "that is RMSNorm of x * weight: the rms is of x alone; multiply by weight[col] after normalizing":
            x * weight * torch.rsqrt((x * weight).pow(2).mean(1, keepdim=True) + eps),
        "that is the mean over the COLUMNS (axis 0), one rms per column: reduce each row over the hidden "
        "axis (axis 1)": x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps) * weight,
    }
    if block > n:
        candidates[f"that is sum(x**2) divided by the block size {block}, not by n_cols = {n}: the padded "
                   "lanes are not part of the mean"] = x * torch.rsqrt(x.pow(2).sum(1, keepdim=True) / block
                                                                         + eps) * weight
    for width in (2**p for p in range(4, 13)):  # statistics of each block of columns alone
        if width < n:
            ms_blocks = torch.cat([c.pow(2).mean(1, keepdim=True).expand_as(c)
                                   for c in x.split(width, dim=1)], dim=1)
            candidates[f"that is each block of {width} columns normalized by its own rms: sum the squares "
                       "over the whole row (every block) before normalizing any of it"] = \
                x * torch.rsqrt(ms_blocks + eps) * weight
    for text, want in candidates.items():
        if torch.allclose(got, want, atol=case.atol, rtol=case.rtol):
            return text
    return ""


def _rmsnorm_cases(gen):
    rows, hidden = size((1823, 781), (37, 80))
    for dtype in _dtypes():
        tol = tolerance(dtype, slack=32 if dtype == torch.float32 else 8)
        fp16 = dtype == torch.float16
        inputs = [
            ("one row of 48: rms over the row's 48 values (axis 1), then times the weight (random, 0.5..1.5)",
             randn((1, 48), dtype, gen), 1e-6),
            (f"{rows} rows x hidden {hidden}: hidden is no power of two (mask the columns past it); "
             "one rms per row", randn((rows, hidden), dtype, gen), 1e-6),
            ("inputs ~0.03 with eps = 1e-3, as large as mean(x**2): rsqrt(mean(x**2) + eps), eps inside "
             "the square root", randn((rows, hidden), dtype, gen, scale=0.03), 1e-3),
            ("rows of very different scales and a last row of zeros: one rms per row (over the hidden "
             "axis); the zero row gives 0, not NaN",
             _scaled_rows(rows, hidden, dtype, gen, 3.0 if fp16 else 100.0),
             1e-6),
            (_wider_label(hidden),
             _wider(rows, hidden, dtype, gen), 1e-6),
        ]
        if current().gpu:
            inputs.append(("64 rows x hidden 4096, Llama-7B's width", randn((64, 4096), dtype, gen), 1e-6))
        # wider than any block of up to 4096 columns (Triton's layer-norm tutorial caps its block): a
        # kernel whose statistics cover one block of the row passes wherever a row fits that block
        inputs.append(("4 rows x hidden 4100: wider than a block of up to 4096 columns; size the block from "
                       "the hidden size (triton.next_power_of_2), or loop over blocks summing the squares of "
                       "the WHOLE row before normalizing any of it", randn((4, 4100), dtype, gen), 1e-6))
        if fp16:
            inputs.append(("values ~300 in fp16: x * x overflows fp16 (largest finite 65504), so square and "
                           "sum in fp32", randn((rows, hidden), dtype, gen, scale=300.0), 1e-6))
        # the edge cases of the narrow rows again on rows that take a looping kernel's other path: a
        # kernel with one block for short rows and a loop for long ones must get both right
        inputs.append((f"4 rows x hidden 4100, wider than a block, with the narrow cases' edges: {_wider_label(4100)}; "
                       "rows ~300 (square in fp32), ~0.03 with eps = 1e-3 (eps inside the square root), ~1, "
                       "and 0 (gives 0, not NaN)", _wide_edges(dtype, gen), 1e-3))
        for label, x, eps in inputs:
            weight = uniform((x.shape[1],), 0.5, 1.5, dtype, gen)
            out = Out("out", tuple(x.shape), dtype, layout=_out_layout(x))
            yield Case(f"{label}, {_name(dtype)}", (x, weight, eps, out), {"out": _rmsnorm64(x, weight, eps)}, *tol,
                       explain=_rmsnorm_explain)


register(Exercise(
    "06.rmsnorm", "RMSNorm with fp32 statistics", "rmsnorm(x, weight, eps, out)", _rmsnorm_cases,
    # one pass, as the lesson asks: a statistics launch and a normalizing one (or x * rstd stored to out and
    # multiplied by the weight in a second launch) read the rows twice, and passed when launches went uncounted
    max_launches=1,
    hint={"wrong": "per row: load the whole row (mask cols < n_cols, other=0.0), convert to fp32 BEFORE "
                   "squaring, mean = sum(x * x, axis=1) / n_cols (n_cols, not the block size), then "
                   "x * rsqrt(mean + eps) * weight; address x with its strides",
          "nan": "a row of zeros has mean 0: rsqrt(0 + eps) is finite, so keep eps inside the square root; "
                 "fp16 x * x overflows to inf above 256: square in fp32",
          "unwritten": "one program per row (or block of rows), each storing its whole row, masked "
                       "cols < n_cols; BLOCK = triton.next_power_of_2(n_cols)",
          "out_of_bounds": "mask cols < n_cols (and rows < n_rows) on the loads of x and weight and on the "
                           "store; address x and out with their own row strides",
          "host": "x.pow(2).mean() or torch.rsqrt outside your kernel compute the statistics with "
                  "PyTorch: they belong in your kernel",
          "launches": "one launch: the statistics and the normalization of a row happen in the same program"},
    speed=Speed(lambda: (randn((ROWS, HIDDEN), _half()), randn((HIDDEN,), _half()), 1e-6,
                         Out("out", (ROWS, HIDDEN), _half())),
                lambda args: Cost(4.0 * ROWS * HIDDEN, 2 * ROWS * HIDDEN * 2), f"{SOLUTIONS}:rmsnorm",
                f"{ROWS} x {HIDDEN}, bf16")))


# --- 06.gate_up_silu --------------------------------------------------------------------------

def _weights(n: int, k: int, dtype, gen, k_major: bool = False) -> torch.Tensor:
    """An (n, k) nn.Linear weight scaled by 1/sqrt(k): the products of N(0, 1) inputs stay ~1. k_major: the
    transpose of a (k, n) tensor, strides (1, n), as a weight kept K-major."""
    scale = k ** -0.5
    return randn((k, n), dtype, gen, scale=scale).t() if k_major else randn((n, k), dtype, gen, scale=scale)


def _cancelling(rows: int, k: int, n: int, dtype, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, k) of positive values near 1, and a w_gate (n, k) of +1/4 over the first half of K and -1/4
    over the second (plus noise of 0.01): each gate's running sum over K climbs to about k / 8 and falls
    back to about 1. An fp32 accumulator carries it exactly enough; an fp16 one rounds it at every K step,
    by up to 2^-5 near 64, far more than the output's own rounding."""
    x = uniform((rows, k), 0.9, 1.1, dtype, gen)
    sign = torch.where(torch.arange(k) < k // 2, 0.25, -0.25).to(torch.float64).to(current().device)
    return x, randn((n, k), torch.float64, gen, scale=0.01) + sign  # w_gate in float64: round it yourself


CANCELLING = ("fp16 rows of positive x and gate weights of +1/4 over the first half of K, -1/4 over the "
              "second: the running sums reach 64 and cancel, so accumulate in fp32 (tl.zeros(..., "
              "dtype=tl.float32)); an fp16 accumulator rounds them by up to 2^-5")


def _gate_up_case(label: str, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> Case:
    """out = silu(x @ w_gate.T) * (x @ w_up.T), (M, N) in x's dtype, within one rounding of the exact value."""
    dtype = x.dtype
    out = Out("out", (x.shape[0], w_gate.shape[0]), dtype, layout=_out_layout(x))
    return Case(f"{label}, {_name(dtype)}", (x, w_gate, w_up, out),
                {"out": _gate_up_silu64(f64(x), w_gate, w_up)}, *_dot_tolerance(dtype), explain=_gate_up_explain,
                verify=_gate_up_rounded_once)


GATE_OUTLIERS = ("gate pre-activations past 88 (w_gate scaled up): exp(g) is inf in fp32 there, so compute "
                 "sigmoid as tl.sigmoid(g) (1 / (1 + exp(-g))), never exp(g) / (1 + exp(g)), which gives inf / inf")


def _gate_up_cases(gen):
    rows, hidden, inter = size((1823, 781, 1000), (37, 40, 136))
    for dtype in _dtypes():
        merged = _weights(2 * 136, 48, dtype, gen)
        inputs = [
            ("16 rows, hidden 48, intermediate 136: silu on the gate, "
             "out = silu(x @ w_gate.T) * (x @ w_up.T)",
             randn((16, 48), dtype, gen), _weights(136, 48, dtype, gen), _weights(136, 48, dtype, gen)),
            ("one row (M = 1)", randn((1, 48), dtype, gen), _weights(136, 48, dtype, gen),
             _weights(136, 48, dtype, gen)),
            (f"{rows} rows, hidden {hidden}, intermediate {inter}: no size is a multiple of a block, mask "
             "M, N and the last K block", randn((rows, hidden), dtype, gen),
             _weights(inter, hidden, dtype, gen), _weights(inter, hidden, dtype, gen)),
            (_wider_label(hidden),
             _wider(rows, hidden, dtype, gen), _weights(inter, hidden, dtype, gen),
             _weights(inter, hidden, dtype, gen)),
            ("w_gate and w_up the two halves of one merged (272, 48) weight", randn((16, 48), dtype, gen),
             merged[:136], merged[136:]),
            (f"{BIG[0]} rows, hidden {BIG[1]}, intermediate {BIG[2]}: several tiles in every dimension even "
             "with blocks of 128: loop over K advancing both pointers, a grid over M and N",
             randn(BIG[:2], dtype, gen), _weights(BIG[2], BIG[1], dtype, gen),
             _weights(BIG[2], BIG[1], dtype, gen)),
        ]
        # Last, so that the cases above draw the inputs they drew before it came; the interpreter only,
        # until a GPU run has measured the solution on it (its tensor cores accumulate in fp32 too).
        if dtype == torch.float16 and not current().gpu:
            x, gate = _cancelling(16, 512, 64, dtype, gen)
            inputs.append((CANCELLING, x, gate.to(dtype), _weights(64, 512, dtype, gen)))
        for label, x, w_gate, w_up in inputs:
            yield _gate_up_case(label, x, w_gate, w_up)
    # After the loop, so that the cases above draw the inputs they drew before it came
    yield _gate_up_case(TALL_LABEL, randn(TALL[:2], torch.float16, gen),
                        _weights(TALL[2], TALL[1], torch.float16, gen), _weights(TALL[2], TALL[1], torch.float16, gen))
    # w_up stored K-major (an nn.Linear weight kept transposed, strides (1, hidden)) beside a row-major
    # w_gate:
    # each weight has its own strides (every case above gives both the same ones)
    yield _gate_up_case("w_up K-major (strides (1, 136)) beside a row-major w_gate: address each weight with its "
                        "own strides", randn((16, 48), torch.float16, gen), _weights(136, 48, torch.float16, gen),
                        _weights(48, 136, torch.float16, gen).t())
    # As many rows as hidden (a 4096-token prefill of a 4096-wide model): a weight repacked to (hidden,
    # intermediate) has as many elements as g and one row per row of x; it stays the answer's own
    rows = hidden = 48
    yield _gate_up_case(f"{rows} rows, hidden {hidden}: as many rows as a weight repacked to (hidden, "
                        "intermediate)", randn((rows, hidden), torch.float16, gen),
                        _weights(136, hidden, torch.float16, gen), _weights(136, hidden, torch.float16, gen))
    # The K-major case above strides w_up only: a kernel that took w_gate as contiguous passed every case
    yield _gate_up_case("w_gate K-major (strides (1, 136)) beside a row-major w_up: address each weight with its "
                        "own strides", randn((16, 48), torch.float16, gen),
                        _weights(136, 48, torch.float16, gen, k_major=True), _weights(136, 48, torch.float16, gen))
    # Every g above is ~N(0, 1), where sigmoid written as exp(g) / (1 + exp(g)) is exact; past 88, exp(g) is
    # inf in fp32 and inf / inf is NaN. w_gate of std 40 / sqrt(hidden): g of std ~40, about 1 in 70 past 88
    # (30 of the 2176), out within fp16's range.
    yield _gate_up_case(GATE_OUTLIERS, randn((16, 48), torch.float16, gen),
                        _weights(136, 48, torch.float16, gen) * 40.0, _weights(136, 48, torch.float16, gen))


def _gate_up_rounded_once(outs: dict, case: Case) -> list[str]:
    """A 16-bit out within one rounding of the exact silu(g) * u (harness.one_rounding), the fp32 sums'
    error carried through it: their products' magnitudes times 2^-22 sqrt(K) (four of fp32's roundings,
    growing like a random walk), times silu'(g) u for g's and silu(g) for u's."""
    got = outs["out"]
    x, w_gate, w_up = (t.detach().to(got.device, torch.float64) for t in case.args[:3])
    g, u = x @ w_gate.T, x @ w_up.T  # (M, N) exact
    sig = torch.sigmoid(g)
    silu = g * sig
    sums = 2.0**-22 * math.sqrt(x.shape[1])  # relative error of an fp32 sum, in its terms' magnitudes
    d_silu = sig * (1 + g * (1 - sig))  # silu'(g): g's error moves silu(g) * u by d_silu * u times it
    moved = sums * ((d_silu * u).abs() * (x.abs() @ w_gate.abs().T) + silu.abs() * (x.abs() @ w_up.abs().T))
    return one_rounding("out", got, silu * u, moved, "silu(g) * u",
                        "a 16-bit accumulator (tl.dot's out_dtype, or acc_g or acc_u kept in 16 bits), or g, u "
                        "or silu(g) rounded in the epilogue (a .to() before the product)")


def _gate_up_explain(outs: dict, case: Case) -> str:
    """What wrong gate/up values match: silu on the up projection, no silu, no up, sigmoid for silu."""
    x, w_gate, w_up = (f64(t) for t in case.args[:3])
    got = f64(outs["out"])
    if not bool(torch.isfinite(got).all()):
        return ""
    g, u = x @ w_gate.T, x @ w_up.T
    silu = torch.nn.functional.silu
    candidates = {
        "that is silu(x @ w_up.T) * (x @ w_gate.T): the silu belongs on the GATE projection, acc_g": silu(u) * g,
        "that is (x @ w_gate.T) * (x @ w_up.T) without the silu: apply g * sigmoid(g) to the gate": g * u,
        "that is silu(x @ w_gate.T) alone: multiply by the up projection, acc_u": silu(g),
        "that is sigmoid(g) * u: silu(g) is g * sigmoid(g)": torch.sigmoid(g) * u,
    }
    for text, want in candidates.items():
        if torch.allclose(got, want, atol=case.atol, rtol=case.rtol):
            return text
    return ""


def _gate_up_temporary(case: Case) -> tuple[int, str] | None:
    """The (rows, intermediate) g or u. The text says which allocations that large are the answer's own (a
    padded repacked weight is refused as room for g: the message must not leave a student guessing why)."""
    rows, inter = case.args[3].shape
    hidden = case.args[0].shape[1]
    what = (f"x @ w_gate.T or x @ w_up.T ({rows} x {inter}, rows x intermediate) (a buffer that large may "
            f"only be a repacked weight of exactly ({inter}, {hidden}) or twice that: no padding)")
    return (rows * inter, what) if rows * inter >= 64 else None


def _gate_up_own_temporaries(case: Case) -> tuple[int, ...]:
    """Element counts a fused gate/up may allocate whatever their size against rows x intermediate: weights
    repacked by a kernel of its own, one transposed (hidden, intermediate) or both side by side. Any other
    allocation of rows x intermediate elements or more has room for g or u: a padded (rows, intermediate + 1)
    scratch that the one launch stores x @ w_gate.T to and loads back passed when only the exact count was
    refused."""
    hidden, inter = case.args[0].shape[1], case.args[1].shape[0]
    return hidden * inter, 2 * hidden * inter


register(Exercise(
    "06.gate_up_silu", "gate and up matmuls with SiLU, one kernel", "gate_up_silu(x, w_gate, w_up, out)",
    _gate_up_cases,
    fusion=Fusion("one kernel computes both x @ w_gate.T and x @ w_up.T tiles in fp32 accumulators and "
                  "applies silu(g) * u to them before its one store of out", _gate_up_temporary,
                  own_temporaries=_gate_up_own_temporaries, kept_buffers=True, activations=("x", "out")),
    speed=Speed(lambda: (randn((ROWS, HIDDEN), _half()), _weights_speed(INTER, HIDDEN),
                         _weights_speed(INTER, HIDDEN), Out("out", (ROWS, INTER), _half())),
                lambda args: Cost(4.0 * ROWS * INTER * HIDDEN, 2 * (ROWS * HIDDEN + 2 * INTER * HIDDEN
                                                                     + ROWS * INTER)),
                f"{SOLUTIONS}:gate_up_silu", f"{ROWS} tokens x hidden {HIDDEN} -> {INTER}, bf16", roof="bf16"),
    hint={"wrong": "two fp32 accumulators per output tile, acc_g += x_tile @ w_gate.T tile and acc_u += x_tile "
                   "@ w_up.T tile; the (BLOCK_K, BLOCK_N) tile of w.T is at w_ptr + n * w.stride(0) + k * "
                   "w.stride(1); mask k < K in the loop; epilogue acc_g * sigmoid(acc_g) * acc_u (silu on the "
                   "GATE)",
          "unwritten": "one program per (BLOCK_M, BLOCK_N) tile of out: cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) "
                       "programs, each storing its tile masked with rows < M and cols < N; a grouped order "
                       "must give every tile to one program (lesson 03's grouped_tile)",
          "out_of_bounds": "mask the K tail of x and both weights (k < K, other=0), and the store with rows < M "
                           "and cols < N; address x with both its strides",
          "nan": "a masked load without other= reads undefined values (NaN in the checker) into tl.dot: give "
                 "the K-tail loads other=0.0",
          "host": "no torch matmul or silu outside your kernel: both products and the epilogue happen "
                  "in your kernel",
          "launches": "one launch: every x tile you load feeds both tl.dot calls (gate and up), and the "
                      "epilogue applies silu(g) * u to the two accumulators before the one store",
          "fusion": "keep g and u in fp32 accumulators in registers: no (rows, intermediate) buffer for either"}))


# --- 06.rmsnorm_mlp ---------------------------------------------------------------------------

def _mlp_cases(gen):
    rows, hidden, inter = size((1823, 781, 1000), (37, 40, 136))
    for dtype in _dtypes():
        tol = _dot_tolerance(dtype)
        fp16 = dtype == torch.float16
        inputs = [
            ("16 rows, hidden 48, intermediate 136: n = x / rms(x) * norm_weight (random 0.5..1.5, rms over "
             "each row), out = (silu(n @ w_gate.T) * (n @ w_up.T)) @ w_down.T: silu on the gate, and 1/rms "
             "scales gate and up before the silu",
             randn((16, 48), dtype, gen), 1e-6, 136),
            ("one row (M = 1)", randn((1, 48), dtype, gen), 1e-6, 136),
            ("16 rows, hidden 200: several K steps, and the sum of squares over all of them (not over the "
             "first block of hidden)", randn((16, 200), dtype, gen), 1e-6, 136),
            (f"{rows} rows, hidden {hidden}, intermediate {inter}: no size is a multiple of a block, mask "
             "the K loop (and the statistics) and the edges", randn((rows, hidden), dtype, gen), 1e-6, inter),
            ("inputs ~0.03 with eps = 1e-3, as large as mean(x**2): rsqrt(mean(x**2) + eps), eps inside "
             "the square root", randn((rows, hidden), dtype, gen, scale=0.03), 1e-3, inter),
            ("rows of very different scales and a last row of zeros: one rms per row (over the hidden "
             "axis); the zero row gives 0, not NaN",
             _scaled_rows(rows, hidden, dtype, gen, 3.0 if fp16 else 100.0),
             1e-6, inter),
            (_wider_label(hidden),
             _wider(rows, hidden, dtype, gen), 1e-6, inter),
        ]
        if fp16:
            inputs.append(("values ~300 in fp16: x * x overflows fp16 (largest finite 65504), so the sum of "
                           "squares must be fp32",
                           randn((rows, hidden), dtype, gen, scale=300.0), 1e-6, inter))
        inputs.append((f"{BIG[0]} rows, hidden {BIG[1]}, intermediate {BIG[2]}: several tiles in every "
                       "dimension even with blocks of 128: loop over K (and the statistics over all of it), "
                       "grids over M and N", randn(BIG[:2], dtype, gen), 1e-6, BIG[2]))
        if fp16 and not current().gpu:  # last, and the interpreter only: see _gate_up_cases
            x, gate = _cancelling(16, 512, 64, dtype, gen)
            inputs.append((CANCELLING, x, 1e-6, 64, gate))
        for label, x, eps, n_inter, *gate in inputs:  # gate: a w_gate the case chose
            k = x.shape[1]
            norm_weight = uniform((k,), 0.5, 1.5, dtype, gen)
            # the chosen w_gate divided by norm_weight: the packed weight (their product) cancels as chosen
            w_gate = (gate[0] / f64(norm_weight)).to(dtype) if gate else _weights(n_inter, k, dtype, gen)
            w_up = _weights(n_inter, k, dtype, gen)
            w_down = _weights(k, n_inter, dtype, gen)
            expected = _gate_up_silu64(_rmsnorm64(x, norm_weight, eps), w_gate, w_up) @ f64(w_down).T
            yield Case(f"{label}, {_name(dtype)}",
                       (x, norm_weight, w_gate, w_up, w_down, eps, Out("out", tuple(x.shape), dtype,
                                                                       layout=_out_layout(x))),
                       {"out": expected}, *tol)
    # After the loop, as in _gate_up_cases
    yield _half_mlp_case(f"{TALL_LABEL}, float16", randn(TALL[:2], torch.float16, gen), TALL[2], gen)
    # The strided case above has 37 rows on the CPU, where the statistics come from the gate/up kernel's own
    # second pass over x: a pre-pass (row_rstd, above 64 rows) that took x's columns as contiguous passed
    # there. 100 rows of a strided x, last (the cases above draw what they drew before it came).
    yield _half_mlp_case(f"100 rows, {_wider_label(40)}; a statistics pre-pass over many rows reads x with both "
                         "strides too, float16", _wider(100, 40, torch.float16, gen), 136, gen)
    # Every case above has fewer or more rows than hidden: with as many (a 4096-token prefill of a 4096-wide
    # model), w_down and the transposed views of w_gate and w_up have one row per row of x too.
    yield _half_mlp_case("48 rows, hidden 48: as many rows as w_down has (weight packing inside the call is on the "
                         "weights, not on the activations), float16", randn((48, 48), torch.float16, gen), 136, gen)
    # As many rows as intermediate, or hidden = intermediate: a packed w_down.T, or h, has as many elements as
    # the normalized activations; they stay the answer's own (the weights reached w_down.T first; h is one)
    for rows, hidden, inter in ((64, 32, 64), (64, 64, 64)):
        yield _half_mlp_case(f"{rows} rows, hidden {hidden}, intermediate {inter}: a packed w_down.T or h has as "
                             "many elements as the normalized activations, float16",
                             randn((rows, hidden), torch.float16, gen), inter, gen)
    # Small weights and many rows: packed weights of fewer bytes than a few per row are no statistics pre-pass
    # (they read no x), and must not fill the pre-pass's budget of bytes per row before row_rstd runs
    yield _half_mlp_case("100 rows, hidden 16, intermediate 16: the weights packed in the call are smaller than "
                         "the statistics of the rows, float16", randn((100, 16), torch.float16, gen), 16, gen)
    # The edge cases of the statistics above have 37 rows on the CPU: a pre-pass of one's own above 64 rows (as
    # the solution's row_rstd) that squared in fp16 or left out eps passed. The same edges on 100 rows.
    scales = torch.cat([torch.full((33, 1), 300.0), torch.full((33, 1), 0.03), torch.ones(33, 1), torch.zeros(1, 1)])
    yield _half_mlp_case("100 rows of the statistics' edges, for a pre-pass over many rows: ~300 (square in fp32), "
                         "~0.03 with eps = 1e-3 (inside the square root), ~1, and a last row of zeros (0, not "
                         "NaN), float16", (randn((100, 48), torch.float64, gen) * scales.to(current().device))
                         .to(torch.float16), 136, gen, eps=1e-3)
    # ... and past 1024 columns, a pre-pass's usual block (row_rstd's): its loop must cover every column
    yield _half_mlp_case("100 rows, hidden 1100: a pre-pass over many rows sums the squares of every block of "
                         "the row, not of the first, float16", randn((100, 1100), torch.float16, gen), 16, gen)
    # Every weight above is a contiguous nn.Linear weight: packing that took one as contiguous passed them all
    yield _half_mlp_case("w_gate, w_up and w_down kept K-major (each the transpose of a row-major tensor, strides "
                         "(1, rows)): read each weight with its own strides, float16",
                         randn((16, 48), torch.float16, gen), 136, gen, k_major=True)
    # As in _gate_up_cases: 4 intermediate channels whose normalized g has a std of ~80 (64 values, about 9
    # past 88), and w_down's 4 columns for them scaled by 0.01, so that out stays ~1
    yield _half_mlp_case(f"4 channels of {GATE_OUTLIERS}, float16", randn((16, 48), torch.float16, gen), 136, gen,
                         gate_outliers=4)


def _half_mlp_case(label: str, x: torch.Tensor, inter: int, gen, eps: float = 1e-6,
                   k_major: bool = False, gate_outliers: int = 0) -> Case:
    """A float16 case of the block on x (rows, hidden): norm_weight and the weights drawn after x; k_major:
    each weight the transpose of a row-major tensor (strides (1, rows of the weight)); gate_outliers: that
    many rows of w_gate scaled by 80 (g of std ~80), and w_down's columns for them by 0.01."""
    hidden, half = x.shape[1], torch.float16
    norm_weight = uniform((hidden,), 0.5, 1.5, half, gen)
    w_gate = _weights(inter, hidden, half, gen, k_major)
    w_up = _weights(inter, hidden, half, gen, k_major)
    w_down = _weights(hidden, inter, half, gen, k_major)
    w_gate[:gate_outliers] *= 80.0
    w_down[:, :gate_outliers] *= 0.01
    expected = _gate_up_silu64(_rmsnorm64(x, norm_weight, eps), w_gate, w_up) @ f64(w_down).T
    out = Out("out", tuple(x.shape), half, layout=_out_layout(x))
    return Case(label, (x, norm_weight, w_gate, w_up, w_down, eps, out), {"out": expected}, *_dot_tolerance(half))


def _mlp_temporary(case: Case) -> tuple[int, str] | None:
    """The (rows, hidden) normalized activations. The text says which allocations that large are the block's
    own: h padded to whole tiles, or an fp32 buffer that the down projection's split-K adds into before a
    copy to out, were refused as "room for the normalized activations", naming what they are not."""
    rows, hidden = case.args[-1].shape
    inter = case.args[2].shape[0]
    what = (f"the normalized activations ({rows} x {hidden}, rows x hidden) (a buffer that large may only be "
            f"h, exactly ({rows}, {inter}), or a packed weight of its exact size: no padding, and no copy of "
            "out, which the down projection writes, or adds into, itself)")
    return (rows * hidden, what) if rows * hidden >= 64 else None


def _mlp_own_temporaries(case: Case) -> tuple[int, ...]:
    """Element counts of what the fused block allocates itself, whatever their size against rows x hidden:
    h (rows, intermediate), and the packed weights w_gu (hidden, 2 x intermediate) and w_down.T or a
    norm-folded w_gate / w_up (intermediate, hidden)."""
    rows, hidden = case.args[-1].shape
    inter = case.args[2].shape[0]
    return rows * inter, 2 * hidden * inter, hidden * inter


register(Exercise(
    "06.rmsnorm_mlp", "RMSNorm + MLP, the norm fused into the gate/up matmul",
    "rmsnorm_mlp(x, norm_weight, w_gate, w_up, w_down, eps, out)", _mlp_cases,
    fusion=Fusion("the gate/up kernel multiplies x by the weights (norm_weight folded in) and scales its fp32 "
                  "accumulators by rsqrt(mean(x**2) + eps) in the epilogue, the sums of squares from the kernel "
                  "itself or from a pre-pass that reads x and writes one value per row, so rmsnorm(x) never "
                  "goes to memory; then one more launch, the down projection (weight packing on weights is not "
                  "counted)",
                  _mlp_temporary, kernels=2, pre_pass=True, own_temporaries=_mlp_own_temporaries,
                  activations=("x", "out"), written_temporaries=lambda case: (case.args[-1].shape[0]
                                                                              * case.args[2].shape[0],)),
    speed=Speed(lambda: (randn((ROWS, HIDDEN), _half()), randn((HIDDEN,), _half()),
                         _weights_speed(INTER, HIDDEN), _weights_speed(INTER, HIDDEN),
                         _weights_speed(HIDDEN, INTER), 1e-6, Out("out", (ROWS, HIDDEN), _half())),
                lambda args: Cost(6.0 * ROWS * HIDDEN * INTER, 2 * (2 * ROWS * HIDDEN + 3 * HIDDEN * INTER)),
                f"{SOLUTIONS}:rmsnorm_mlp", f"{ROWS} tokens x hidden {HIDDEN}, intermediate {INTER}, bf16",
                roof="bf16"),
    hint={"wrong": "per K step ONE tl.dot of x's tile with the (BLOCK_K, 2 * BLOCK_N) tile of packed.w_gu "
                   "(row-major, norm_weight folded in, gate and up interleaved column by column); per row "
                   "sum(x.to(fp32)**2) over all K (a second pass over the tile's rows, or row_rstd's pre-pass); "
                   "in the epilogue g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2))), scale both by "
                   "rsqrt(sum / K + eps) BEFORE silu(g) * u; store h, then matmul(h, packed.w_down_t, out) "
                   "(lesson 03). On a Hopper GPU, triton 3.6 computes an fp32 K loop wrong, by chance, when "
                   "its stages are pipelined and x's tile feeds both the tf32 dot and the sum of squares "
                   "(results/explore/README.md): sum the squares in the second pass",
          "nan": "a zero row has sum(x**2) = 0: rsqrt(0 / K + eps) is finite, keep eps inside; fp16 x * x "
                 "overflows above 256: square in fp32; give masked K-tail loads other=0.0; a tile of h (from "
                 "torch.empty) that no program wrote is NaN here: the gate/up grid covers every tile of h "
                 "once (a grouped order: lesson 03's grouped_tile)",
          "unwritten": "the down projection writes every (row, hidden) element of out: run lesson 03's matmul "
                       "(or your own) over all of h; the gate/up kernel writes every tile of h (a grouped "
                       "order gives each tile to one program: lesson 03's grouped_tile)",
          "out_of_bounds": "mask the K tail (k < K) of x, norm_weight and the weights, and each store with "
                           "rows < M and cols < N; address x with both its strides",
          "host": "no torch matmul, rsqrt or silu outside your kernel: weight packing aside, the "
                  "arithmetic happens in your kernels",
          "launches": "two launches on the activations: the gate/up kernel with the norm folded in (rsqrt in "
                      "its epilogue), then the down projection; a pre-pass that only reads x and writes one "
                      "value per row (row_rstd) is not counted; no rmsnorm launch; a split-K down projection "
                      "that adds into out zeroes it with out.zero_() (as down_split_k does), not with a fill "
                      "kernel, which counts as a launch on the activations",
          "fusion": "the normalized x never goes to memory: norm_weight goes into the packed weight and "
                    "rsqrt(mean + eps) scales the accumulators in the epilogue"}))
