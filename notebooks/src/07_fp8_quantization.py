# %% [markdown]
# # Lesson 07: FP8 quantization, an FP8 matmul, W8A16 and int4
#
# What you will learn:
# - the two FP8 formats, **e4m3** and **e5m2**, bit by bit: sign, exponent, mantissa, bias, subnormals,
#   NaN, and why e4m3fn has no infinity; their range and spacing on a number line;
# - how a float becomes FP8: round to nearest even, and what happens beyond the largest value;
# - a trap: Triton's interpreter rounds about 1% of values wrongly, and how the course fixes it;
# - **scaling**: per tensor, per row, per 1x128 and 128x128 block, and what one outlier does to each;
# - a row-wise **quantize kernel** that runs at copy speed;
# - an **FP8 matmul** in Triton with per-row scales: fp32 accumulation, scales in the epilogue, and
#   why the B operand must be K-major on Hopper;
# - how the error against float64 behaves as K and the input scale grow, next to bf16;
# - **W8A16**: an int8-weight GEMV for decoding, and why it helps a memory-bound op;
# - **int4** packing, two values per byte.
#
# FP8 dots need compute capability 8.9+ (Ada, Hopper). On an older GPU and on a CPU this notebook
# runs everything through Triton's interpreter, which upcasts fp8 to fp16 for `tl.dot`.

# %%
from course_utils import setup
from course_utils.fp8 import fp8_mode

mode = setup(fp8_mode())  # the interpreter on a CPU, and on GPUs older than sm_89

# %%
import inspect

import matplotlib.pyplot as plt
import numpy as np
import torch
import triton
import triton.language as tl

from course_utils import check, fp8, half_dtype, size
from course_utils.bench import Table, can_time, load_results, plot, show_results
from course_utils.lessons.l07_fp8_quantization import (
    decode_e4m3,
    fp8_matmul,
    fp8_matmul_kernel,
    pack_int4,
    quantize_int8_ref,
    quantize_rowwise,
    quantize_rowwise_kernel,
    unpack_int4,
    w8a16_gemv,
    w8a16_gemv_kernel,
)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
dev = mode.device


def show(obj) -> None:
    """Print the source of a function or kernel, without the exercise notebook's solution markers."""
    source = inspect.getsource(getattr(obj, "fn", obj))  # a @triton.jit kernel keeps its function in .fn
    markers = ("# BEGIN SOLUTION", "# END SOLUTION")
    print("\n".join(line for line in source.splitlines() if line.strip() not in markers))

# %% [markdown]
# ## Napkin maths: why fewer bits
#
# Decoding one token of Llama-3-8B reads every weight once: 8 billion parameters, 16 GB in bf16.
# At an H100's ~3.35 TB/s that is **4.8 ms per token** before any arithmetic, and the arithmetic is
# 2 FLOPs per weight, far too little to matter (1 FLOP per byte; the H100's ridge point is ~300).
# The time is the bytes. In 8 bits the same step reads 8 GB (2.4 ms); in 4 bits, 4 GB (1.2 ms).
#
# Training and prefill are the other regime: big matmuls, limited by the tensor cores. There FP8
# doubles the peak: an H100 SXM is specified at ~989 dense TFLOP/s in bf16 and ~1979 in FP8.
#
# | | bytes per weight | decode step, Llama-3-8B at 3.35 TB/s | tensor-core peak (H100 SXM, dense) |
# |---|---|---|---|
# | bf16 | 2 | 4.8 ms | ~989 TFLOP/s |
# | fp8 / int8 | 1 | 2.4 ms | ~1979 TFLOP/s (fp8) |
# | int4 | 0.5 | 1.2 ms | (unpacked to 8/16 bits first) |

# %% [markdown]
# ## The formats, bit by bit
#
# | format | sign | exponent (bias) | mantissa | largest | smallest normal | smallest subnormal | specials |
# |---|---|---|---|---|---|---|---|
# | fp32 | 1 | 8 (127) | 23 | 3.4e38 | 2^-126 | 2^-149 | inf, NaN |
# | bf16 | 1 | 8 (127) | 7 | 3.4e38 | 2^-126 | 2^-133 | inf, NaN |
# | fp16 | 1 | 5 (15) | 10 | 65504 | 2^-14 | 2^-24 | inf, NaN |
# | **e5m2** | 1 | 5 (15) | 2 | 57344 | 2^-14 | 2^-16 | inf, NaN (IEEE-like: fp16 with 8 bits cut off) |
# | **e4m3fn** | 1 | 4 (7) | 3 | **448** | 2^-6 | 2^-9 | NaN only: `S 1111 111` |
#
# A normal number is `(-1)^S * 1.M * 2^(E - bias)`; exponent field 0 is a subnormal,
# `(-1)^S * 0.M * 2^(1 - bias)`, which fills the gap between 0 and the smallest normal evenly.
# IEEE formats spend the whole top exponent on inf and NaN. With 4 exponent bits that would waste 16
# of 256 codes, so e4m3**fn** ("finite") keeps only `S 1111 111` as NaN: `0 1111 000` to `0 1111 110`
# are numbers (256 to 448) and there is no infinity. Two NaN codes (0x7F, 0xFF) out of 256.
#
# Torch calls them `torch.float8_e4m3fn` and `torch.float8_e5m2`; Triton `tl.float8e4nv` and
# `tl.float8e5`. Your `decode_e4m3` (exercise 07.decode_e4m3) does it in plain Python:

# %%
show(decode_e4m3)


def fields(code: int, exp_bits: int = 4) -> str:
    """'S EEEE MMM' of a byte."""
    man_bits = 7 - exp_bits
    exponent, mantissa = (code >> man_bits) & ((1 << exp_bits) - 1), code & ((1 << man_bits) - 1)
    return f"{code >> 7} {exponent:0{exp_bits}b} {mantissa:0{man_bits}b}"


torch_values = torch.arange(256, dtype=torch.uint8).view(E4M3).to(torch.float64).tolist()
ours = [decode_e4m3(c) for c in range(256)]
agree = sum(a == b or (np.isnan(a) and np.isnan(b)) for a, b in zip(ours, torch_values))
print(f"decode_e4m3 agrees with torch on {agree} of 256 codes\n")
for code, what in [(0x00, "zero"), (0x01, "smallest subnormal, 2^-9"), (0x07, "largest subnormal"),
                   (0x08, "smallest normal, 2^-6"), (0x38, "one"), (0x7E, "largest, 1.75 * 2^8"),
                   (0x7F, "NaN"), (0x80, "negative zero"), (0xFE, "most negative")]:
    print(f"0x{code:02X}  {fields(code)}  {decode_e4m3(code):>12g}   {what}")

# %%
for fmt, dtype in ((fp8.E4M3, E4M3), (fp8.E5M2, E5M2)):
    values = fp8.table(fmt)
    finite = np.isfinite(values)
    info = torch.finfo(dtype)
    print(f"{str(dtype)[6:]:>14}: {int(finite.sum())} finite codes, {int(np.isnan(values).sum())} NaN, "
          f"{int(np.isinf(values).sum())} inf; largest {info.max:g}, smallest normal {info.tiny:g} "
          f"(2^{int(np.log2(info.tiny))}), smallest subnormal {values[1]:g} (2^{int(np.log2(values[1]))}), "
          f"relative step of normals 2^-{fmt.man_bits}")

# %% [markdown]
# ## Range and spacing on a number line
#
# Every positive finite value of each format, on a log axis. Within one power of two (a *binade*) the
# values are evenly spaced: 8 of them in e4m3, 4 in e5m2, and each binade's absolute gap is twice the
# previous one. So the *relative* gap is a sawtooth that never leaves 2^-4..2^-3 for e4m3 (2^-3..2^-2
# for e5m2) across the whole normal range: a fixed number of significant bits, like any float. Below
# the smallest normal, the subnormals keep the first normal binade's absolute gap (2^-9 in e4m3) all the
# way down to zero, so their relative precision falls off. e4m3 spends its bits on precision (18 binades, 448 at the top), e5m2 on
# range (32 binades, 57344): that is why training recipes use e4m3 for weights and activations and e5m2,
# if anywhere, for gradients.

# %%
fig, (ax_line, ax_gap) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
formats = ((fp8.E4M3, "e4m3fn", "tab:blue"), (fp8.E5M2, "e5m2", "tab:orange"))
for row, (fmt, name, color) in enumerate(formats):
    v = fp8.table(fmt)[1:fmt.max_code + 1]  # positive finite values, increasing
    normal = v >= 2.0 ** (1 - fmt.bias)
    ax_line.scatter(v[normal], np.full(normal.sum(), row), marker="|", s=200, color=color,
                    label=f"{name} normal")
    ax_line.scatter(v[~normal], np.full((~normal).sum(), row), marker="|", s=200, color=color, alpha=0.35,
                    label=f"{name} subnormal")
    ax_gap.step(v[:-1], np.diff(v) / v[:-1], where="post", color=color,
                label=f"{name}: gap to the next value / value")
ax_line.set_yticks([0, 1], ["e4m3fn", "e5m2"])
ax_line.set_ylim(-0.7, 1.7)
ax_line.set_xscale("log", base=2)
ax_line.axvline(448, color="tab:blue", ls=":", lw=1)
ax_line.axvline(57344, color="tab:orange", ls=":", lw=1)
ax_line.set_title("every positive finite value (dotted: the largest); faint ticks are subnormals")
ax_line.legend(fontsize=7, ncol=4, loc="upper left")
ax_gap.set_yscale("log", base=2)
ax_gap.set_xlabel("value")
ax_gap.set_ylabel("relative spacing")
ax_gap.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Rounding and saturation
#
# A cast to FP8 rounds to the nearest value; a tie goes to the one with an even mantissa (last bit 0).
# Between 16 and 32 e4m3 has a step of 2: 17 is a tie between 16 (mantissa 000) and 18 (001) and goes to
# 16; 19 is a tie between 18 and 20 (010) and goes to 20. Rounding up can carry into the exponent:
# 127.1 is closer to 128 (= 1.000 x 2^7) than to 120 (1.111 x 2^6).
#
# Beyond the largest finite value the tools disagree:
# - **Triton on a GPU** lowers `x.to(tl.float8e4nv)` to the PTX instruction `cvt.rn.satfinite`:
#   round to nearest even, and *saturate*: anything beyond +-448 (inf included) becomes +-448
#   (+-57344 for e5m2);
# - **recent torch** (the change landed for 2.12) saturates e4m3fn the same way; **torch 2.11 and
#   older** (and ml_dtypes) give NaN above 464, the midpoint between 448 and the missing 480; torch's
#   e5m2 overflows to inf.
#
# So clamp to +-448 before casting and all of them agree. This is what your torch does:

# %%
x = torch.tensor([17.0, 19.0, 127.1, 31.5, -0.497, -336.0, 464.0, 500.0, 1e6, float("inf"), 0.0009])
print(f"torch {torch.__version__}")
print(f"{'x':>10} {'e4m3fn':>10} {'e5m2':>10}")
for v, a, b in zip(x.tolist(), x.to(E4M3).float().tolist(), x.to(E5M2).float().tolist()):
    print(f"{v:>10g} {a:>10g} {b:>10g}")

# %% [markdown]
# ### A trap: the interpreter's cast
#
# Triton's interpreter (3.6 to 3.9 at least) emulates `x.to(tl.float8e4nv)` with numpy bit surgery in
# `_convert_float` (triton/runtime/interpreter.py): it keeps the top 3 mantissa bits, adds the first
# dropped bit (round half up: ties do not go to even, there are no sticky bits), then ORs
# sign, exponent and mantissa together. When rounding up overflows the mantissa (1.111|1 -> 10.000), the
# carry should increment the exponent. An OR only does that when the exponent's lowest bit is 0;
# otherwise the carry vanishes and the mantissa wraps to 000: **127.1 becomes 64 instead of 128**,
# 31.5 becomes 16, -0.497 becomes -0.25, for e4m3 and e5m2 alike, and -336 (a tie) becomes -352
# instead of -320. Out-of-range values are clamped field by field, and decoding turns the NaN code
# 0x7F into 480. About 1% of the values in range come out wrong, so a correct kernel would fail its
# check on the CPU.
#
# `course_utils.fp8.install_fp8_fix()` replaces that function with an exact one (round to nearest even
# and saturate, like the GPU). Every exercise module of this lesson calls it; it does nothing on a GPU.
# Here is the interpreter with and without it, against torch, over a dense sweep of fp32 values:

# %%
@triton.jit
def cast_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(out_ptr.dtype.element_ty), mask=mask)


def triton_cast(x, dtype):
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    cast_kernel[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=4096)
    return out


if mode.interpret:
    sweep = torch.linspace(-448, 448, 100_001)
    for fixed in (False, True):
        if fixed:
            fp8.install_fp8_fix()
        else:
            fp8.uninstall_fp8_fix()
        got = triton_cast(sweep, E4M3)
        wrong = (got.view(torch.uint8) != sweep.to(E4M3).view(torch.uint8)).nonzero()[:, 0]
        label = "with the fix   " if fixed else "Triton's own   "
        some = wrong[::max(1, len(wrong) // 4)][:4]
        examples = ", ".join(f"{sweep[i].item():.4g} -> {got[i].float().item():g}" for i in some)
        print(f"{label}: {len(wrong)} of {sweep.numel()} values differ from torch  {examples}")
    fp8.install_fp8_fix()
else:
    print("GPU mode: the cast runs as PTX cvt.rn.satfinite, the interpreter's emulation is not used here")

# %% [markdown]
# ## Scaling: per tensor, per row, per block
#
# e4m3 covers 2^-9 to 448. Real tensors do not live there: activations may reach thousands, gradients
# may sit around 1e-6. So we store `q = x / s` in FP8 and keep the scale `s` in fp32, choosing `s` so
# that the largest |x| maps to 448: `s = amax / 448`. How many values share one scale is the
# *granularity*:
#
# - **per tensor**: one scale; cheap, but one outlier sets it for everyone;
# - **per row** (per token for activations, per output channel for weights): what `torch._scaled_mm`
#   calls row-wise, and exercise 07.quantize_rowwise;
# - **per block**: DeepSeek-V3 trains with 1x128 tiles for activations and 128x128 tiles for weights.
#
# One outlier of size R in a tensor of N(0, 1) values: with a shared scale, the typical value lands at
# 448/R. e4m3's exponent absorbs a lot of that: values keep 3 mantissa bits down to 2^-6, so until R
# reaches ~10^4 the error barely moves. int8 (uniform steps of amax/127) has no exponent: at R = 100
# most values already round to 0 or +-1 step. The error below is over the rows *without* the outlier.

# %%
show(fp8.quantize_blockwise_ref)

torch.manual_seed(0)
base = torch.randn(256, 256)
clean = torch.ones(256, dtype=torch.bool)
clean[3] = False
granularities = {"per tensor": (256, 256), "per row": (1, 256), "1x128": (1, 128), "128x128": (128, 128)}
print(f"{'outlier':>8} | " + " | ".join(f"e4m3 {g:>10}" for g in granularities) + " | int8 tensor | int8 row")
for R in (1e1, 1e2, 1e3, 1e4, 1e5, 1e6):
    x = base.clone()
    x[3, 5] = R
    errs = []
    for block in granularities.values():
        q, s = fp8.quantize_blockwise_ref(x, block)
        back = fp8.dequantize_blockwise_ref(q, s, block)
        errs.append(((back - x)[clean].norm() / x[clean].norm()).item())
    for keep in (True, False):  # int8, symmetric: per tensor, per row
        s8 = x.abs().max() / 127 if keep else x.abs().amax(dim=1, keepdim=True) / 127
        back = (x / s8).round().clamp(-127, 127) * s8
        errs.append(((back - x)[clean].norm() / x[clean].norm()).item())
    fp8_cols = " | ".join(f"{e:>15.4f}" for e in errs[:4])
    print(f"{R:>8.0e} | {fp8_cols} | {errs[4]:>11.4f} | {errs[5]:>8.4f}")

# %% [markdown]
# Read the table: per-row and 1x128 scales do not care about the outlier (it lives in row 3, which we
# left out); per-tensor e4m3 holds out to R ~ 10^4 and then collapses; 128x128 confines the damage to the
# outlier's tile, a quarter of this 256 x 256 tensor, so about half the error. int8 per tensor is bad at
# R = 100 (23%) and useless beyond, but with a scale per row it beats e4m3 (7 uniform bits against 3
# mantissa bits): FP8 buys range, not precision. The row *with*
# the outlier is still damaged by per-row scaling; 1x128 confines the damage to 128 values. That is why
# fine-grained scales matter most for activations, where outlier channels are common in LLMs.

# %% [markdown]
# ## The row-wise quantize kernel
#
# Exercise 07.quantize_rowwise, one program per row: load the row, `amax = max |x|`, scale, clamp, cast,
# store the row and its scale. An all-zero row gets scale 1 (0/0 would be NaN).
#
# Napkin maths at 8192 x 8192 bf16: read 128 MiB, write 64 MiB of e4m3 plus 32 KiB of scales. At
# ~3.35 TB/s that is ~60 us. A row of 8192 bf16 is 16 KiB: it fits in the registers of one program,
# so x is read from memory once and the kernel should run at the copy bandwidth.

# %%
show(quantize_rowwise_kernel)
show(quantize_rowwise)

# %%
rows, cols = size((4096, 4096), (64, 1000))
magnitudes = torch.logspace(-3, 3, rows, device=dev)[:, None]  # rows from 1e-3 to 1e3
x = torch.randn(rows, cols, device=dev) * magnitudes
x[1] = 0
out = torch.empty(rows, cols, device=dev, dtype=E4M3)
scale = torch.empty(rows, device=dev)
quantize_rowwise(x, out, scale)
q_ref, s_ref = fp8.quantize_rowwise_ref(x)
print("scales equal to the reference:", torch.allclose(scale, s_ref, rtol=1e-6))
same = (out.view(torch.uint8) == q_ref.view(torch.uint8)).float().mean().item()
print(f"codes equal to the reference:  {same:.4%}")
print("largest |out| per row:", out.float().abs().amax(dim=1)[:4].tolist(), "(row 1 is all zeros)")
rel = ((out.float() * scale[:, None] - x).norm() / x.norm()).item()
print(f"relative error of out * scale: {rel:.4f} (e4m3's half step is 2^-4 = {2**-4:.4f} at most)")
check("07.quantize_rowwise", quantize_rowwise)

# %% [markdown]
# ## The FP8 matmul
#
# Exercise 07.fp8_matmul computes `(a * a_scale[:, None]) @ (b * b_scale[:, None]).T` with a (M, K) and
# b (N, K) in e4m3. It is lesson 03's tiled matmul with three changes:
#
# 1. **e4m3 tiles go straight into `tl.dot`**, which accumulates in fp32. On sm_89+ that is one
#    tensor-core instruction for FP8 inputs; the interpreter upcasts to fp16.
# 2. **The scales leave the loop.** `sum_k (a_mk s_m)(b_nk s_n) = s_m s_n sum_k a_mk b_nk`: the per-row scales
#    are constant along K, so the finished fp32 tile is multiplied by `a_scale[rows]` and
#    `b_scale[cols]` once, in the epilogue: MN multiplies instead of MNK.
# 3. **B is K-major.** Hopper's `wgmma` reads both FP8 operands from shared memory with K contiguous
#    (only 16-bit types may also be transposed). The weight of an `nn.Linear` is already (N, K) with K
#    contiguous, so the kernel loads (BLOCK_N, BLOCK_K) tiles of it and hands `tl.trans(b_tile)` to the
#    dot: the transpose costs nothing, it only tells the compiler which layout it has.
#    The "textbook" layout, B as (K, N) with N contiguous, forces the compiler to transpose FP8 tiles
#    before the instruction can use them. The course's design notes measured such a kernel at 236
#    TFLOP/s on an H200, a fifth of `torch._scaled_mm` (1203). Our kernel takes b with any strides,
#    so the benchmark below runs it in both layouts.
#
# The rest is what gets close to cuBLAS: BLOCK_K = 128 (128 bytes of e4m3 per row, a full cache line),
# 128 x 128 or 128 x 256 output tiles, a deep pipeline (3 to 5 stages of tiles in flight in shared
# memory) and the grouped order of lesson 03. On Hopper the benchmark's fastest was 128 x 128 x 128 with
# 4 warps and 5 stages; `fp8_matmul` uses it there (Ada's smaller shared memory gets 3 stages of 64-deep
# tiles).
#
# Napkin maths at 8192^3: 2 * 8192^3 = 1.1 PFLOP; at ~1979 TFLOP/s (H100 SXM, FP8 dense) that is 0.56 ms;
# the inputs are 2 x 64 MiB, read from memory in ~40 us: compute-bound by far.

# %%
show(fp8_matmul_kernel)

# %%
M, N, K = size((2048, 2048, 2048), (64, 96, 160))
out_dtype = half_dtype() if mode.gpu else torch.float32
a, a_scale = fp8.quantize_rowwise_ref(torch.randn(M, K, device=dev))
b, b_scale = fp8.quantize_rowwise_ref(torch.randn(N, K, device=dev))
c = torch.empty(M, N, device=dev, dtype=out_dtype)
exact = fp8.fp8_matmul_ref(a, a_scale, b, b_scale)


def rel_error(got):
    return ((got.cpu().double() - exact).norm() / exact.norm()).item()


fp8_matmul(a, a_scale, b, b_scale, c)
print(f"relative error against float64 on the same e4m3 inputs: {rel_error(c):.2e}")
b_kn = b.t().contiguous()  # the textbook layout: (K, N), N contiguous
fp8_matmul(a, a_scale, b_kn.t(), b_scale, c)  # same kernel, strides (1, N)
print(f"with b in the (K, N) layout:                             {rel_error(c):.2e}")
check("07.fp8_matmul", fp8_matmul)

# %% [markdown]
# ## How big is the error, and does it grow?
#
# Two sources: **quantizing** the inputs (each e4m3 value is off by up to 2^-4 of itself) and
# **accumulating** K products. Products of two e4m3 values have at most 8 significant bits, so they are
# exact in fp32; the sum is where rounding can pile up.
#
# The design notes behind this course observed the FP8 error growing with the matrix size. It does,
# measured as an absolute error: each output is a sum of K products with random signs, so the output and
# its error both grow like sqrt(K) (a random walk), and the largest error over M x N outputs grows a
# little more because it is the maximum of more samples. Divided by the size of the output, the error
# from quantization is **flat** in K. Below: e4m3 with per-row scales against bf16, both multiplied
# exactly (float64), so that only the rounding of the inputs shows.

# %%
torch.manual_seed(0)
Ks = [64, 256, 1024, 4096, 16384]
m = n = 64
rows_out = []
for K in Ks:
    A, B = torch.randn(m, K, dtype=torch.float64), torch.randn(n, K, dtype=torch.float64)
    exact = A @ B.T
    qa, sa = fp8.quantize_rowwise_ref(A)
    qb, sb = fp8.quantize_rowwise_ref(B)
    errors = {"e4m3 per row": fp8.fp8_matmul_ref(qa, sa, qb, sb) - exact,
              "bf16": A.bfloat16().double() @ B.bfloat16().double().T - exact}
    rows_out.append({name: (e.abs().max().item(), (e.norm() / exact.norm()).item())
                     for name, e in errors.items()})

fig, (ax_abs, ax_rel) = plt.subplots(1, 2, figsize=(10, 3.6))
for name, color in (("e4m3 per row", "tab:blue"), ("bf16", "tab:gray")):
    ax_abs.loglog(Ks, [r[name][0] for r in rows_out], "o-", color=color, label=name)
    ax_rel.loglog(Ks, [r[name][1] for r in rows_out], "o-", color=color, label=name)
ax_abs.loglog(Ks, [rows_out[0]["e4m3 per row"][0] * (k / Ks[0]) ** 0.5 for k in Ks], "k:", label="~ sqrt(K)")
ax_abs.set(title="largest absolute error", xlabel="K")
ax_rel.set(title="relative error ||C - C64|| / ||C64||", xlabel="K")
for ax in (ax_abs, ax_rel):
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
for K, r in zip(Ks, rows_out):
    print(f"K={K:>6}: e4m3 max abs {r['e4m3 per row'][0]:8.3f}  relative {r['e4m3 per row'][1]:.4f} | "
          f"bf16 max abs {r['bf16'][0]:.4f}  relative {r['bf16'][1]:.5f}")

# %% [markdown]
# The absolute error grows like sqrt(K), the relative error does not move: about 3.6% for e4m3 and
# 0.23% for bf16, some 16 times less (4 more mantissa bits: a 16 times finer step).
#
# There is a second effect that *does* grow with K, on Hopper only. Its FP8 tensor-core instruction
# does not keep a full fp32 accumulator: DeepSeek-V3's report measured about 14 bits, and errors near 2%
# at K = 4096. Triton leaves the whole K loop in that accumulator by default on sm_90
# (`max_num_imprecise_acc` = "no limit"). Passing `max_num_imprecise_acc=BLOCK_K` to `tl.dot` (our
# kernel's `promote=True`) makes it add each BLOCK_K chunk into a real fp32 accumulator, DeepSeek's
# "promotion every 128 elements". On the H200 of the committed benchmark the error of the accumulation
# alone (fp32 output, against float64 on the same e4m3 inputs) grew from 5.4e-4 at K = 1024 to 1.3e-3
# at 4096 and 3.1e-3 at 16384, and stayed at 1.3e-4 with promotion. Small next to the 3.6% of
# quantizing the inputs, but it is the part that grows with the size. The interpreter accumulates in
# fp32, so on a CPU both are flat.

# %%
if mode.gpu:
    print("relative error of the kernel against float64 on the same e4m3 inputs (accumulation only):")
    for K in (1024, 4096, 16384):
        qa, sa = fp8.quantize_rowwise_ref(torch.randn(256, K, device=dev))
        qb, sb = fp8.quantize_rowwise_ref(torch.randn(256, K, device=dev))
        exact = fp8.fp8_matmul_ref(qa, sa, qb, sb)
        line = []
        for promote in (False, True):
            c32 = torch.empty(256, 256, device=dev)
            fp8_matmul(qa, sa, qb, sb, c32, promote=promote)
            line.append(((c32.cpu().double() - exact).norm() / exact.norm()).item())
        print(f"  K={K:>6}: default {line[0]:.2e}, promoted every BLOCK_K {line[1]:.2e}")
else:
    K = 1024
    qa, sa = fp8.quantize_rowwise_ref(torch.randn(32, K))
    qb, sb = fp8.quantize_rowwise_ref(torch.randn(32, K))
    c32 = torch.empty(32, 32)
    fp8_matmul(qa, sa, qb, sb, c32)
    exact = fp8.fp8_matmul_ref(qa, sa, qb, sb)
    err = ((c32.double() - exact).norm() / exact.norm()).item()
    print(f"interpreter, K={K}: {err:.2e} (fp32 accumulation)")
    notes = [n for n in (load_results("07") or {}).get("notes", []) if n.startswith("accumulation error")]
    print("\n".join(["measured on the benchmark GPU:", *notes]) if notes else "no GPU results committed yet")

# %% [markdown]
# ### The input scale
#
# Scaling is what makes e4m3's narrow range usable. Multiply the same inputs by 10^p and compare
# per-row scaling with no scaling at all (clamp to +-448 and cast, what you get if you forget the scale),
# and with bf16 (8 exponent bits: 1e-38 to 3e38).

# %%
A, B = torch.randn(64, 1024, dtype=torch.float64), torch.randn(64, 1024, dtype=torch.float64)
powers = list(range(-6, 7))
curves = {"e4m3 per-row scales": [], "e4m3 no scale (clamp + cast)": [], "bf16": []}
ones_a, ones_b = torch.ones(64), torch.ones(64)
for p in powers:
    As, Bs = A * 10.0**p, B * 10.0**p
    exact = As @ Bs.T
    qa, sa = fp8.quantize_rowwise_ref(As)
    qb, sb = fp8.quantize_rowwise_ref(Bs)
    raw_a, raw_b = As.clamp(-448, 448).to(E4M3), Bs.clamp(-448, 448).to(E4M3)
    for name, approx in (("e4m3 per-row scales", fp8.fp8_matmul_ref(qa, sa, qb, sb)),
                         ("e4m3 no scale (clamp + cast)", fp8.fp8_matmul_ref(raw_a, ones_a, raw_b, ones_b)),
                         ("bf16", As.bfloat16().double() @ Bs.bfloat16().double().T)):
        curves[name].append(((approx - exact).norm() / exact.norm()).item())
fig, ax = plt.subplots(figsize=(7, 3.4))
for (name, ys), color in zip(curves.items(), ("tab:blue", "tab:red", "tab:gray")):
    ax.semilogy(powers, ys, "o-", color=color, label=name)
ax.set(xlabel="inputs multiplied by 10^p", ylabel="relative error",
       title="error against the input scale, K = 1024")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# Without a scale, e4m3 is only right for inputs between ~10^-1 and ~10^2: smaller values sink into the
# subnormals and then to zero (the error climbs to 100%), larger ones saturate at 448. With per-row
# scales the curve is flat at the quantization error, like bf16's, just higher.

# %% [markdown]
# ## W8A16: an int8-weight GEMV for decoding
#
# At decode time a linear layer is a GEMV: one activation row x (1, K) times the weight (N, K). Each
# weight is used once, for 2 FLOPs, so the layer's time is the time to read W: for Llama-3-8B's up
# projection (N = 14336, K = 4096) that is 117 MiB in bf16, ~37 us at 3.35 TB/s. Store W in int8 with one
# fp32 scale per output channel and it is 59 MiB: up to twice as fast, while x and the arithmetic stay
# 16/32-bit ("W8A16"). The int8 -> fp32 conversion costs instructions, but an instruction is cheap
# next to a byte from memory here: the op is memory-bound with the int8 weights too. Weight-only
# quantization speeds up decoding without touching the activations, which carry the outliers.

# %%
show(quantize_int8_ref)
show(w8a16_gemv_kernel)
N, K = size((14336, 4096), (96, 320))
act = half_dtype() if mode.gpu else torch.float32
w = torch.randn(N, K, device=dev) * 0.02
w_int8, w_scale = quantize_int8_ref(w)
xv = torch.randn(1, K, device=dev).to(act)
y = torch.empty(1, N, device=dev, dtype=act)
w8a16_gemv(xv, w_int8, w_scale, y)
y_ref = xv.double() @ (w_int8.double() * w_scale.double()[:, None]).T
y_bf16 = xv.double() @ w.double().T
print(f"W8A16 against its own reference: {((y.double() - y_ref).norm() / y_ref.norm()).item():.2e}; "
      f"int8 weights against the original weights: {((y_ref - y_bf16).norm() / y_bf16.norm()).item():.4f}")
print(f"bytes read: bf16 {2 * N * K / 2**20:.1f} MiB, int8 {(N * K + 4 * N) / 2**20:.1f} MiB")

# %% [markdown]
# ## int4: two values per byte
#
# Half the bytes of int8 again, but no GPU loads 4-bit values: we pack two in a byte and unpack in
# registers. Exercises 07.pack_int4 and 07.unpack_int4: `byte = lo | (hi << 4)`, and back with
# `byte & 0xF` and `byte >> 4` on *unsigned* bytes. Signed int4 (-8..7) stores the two's complement
# nibble `q & 0xF`; to get it back, sign-extend: `(n ^ 8) - 8`. Real formats pack 8 nibbles per int32
# and keep a scale per group of 32 to 128 weights, because 16 levels per channel are too few.

# %%
lo = torch.tensor([1, 15, 0, 7], dtype=torch.uint8)
hi = torch.tensor([2, 0, 15, 8], dtype=torch.uint8)
packed = pack_int4(lo, hi)
print("packed:", [f"0x{v:02X}" for v in packed.tolist()])
print("unpacked:", [t.tolist() for t in unpack_int4(packed)])
signed = torch.arange(-8, 8)
nibbles = (signed & 0xF).to(torch.uint8)
print("signed -8..7 as nibbles:", nibbles.tolist())
print("sign-extended back:     ", ((nibbles.to(torch.int16) ^ 8) - 8).tolist())

# %% [markdown]
# ## Benchmark
#
# On an H100 (or any sm_89+ GPU) the cell below runs the lesson's benchmark (about 3 minutes):
# - **quantize_rowwise** bf16 -> e4m3 at 8192 x 8192 against the copy ceiling (target >= 0.85 x its GB/s),
#   next to the same quantization in eager PyTorch and `torch.compile`;
# - **fp8_matmul** at 8192^3 against `torch.matmul` in bf16 (target >= 1.6 x) and `torch._scaled_mm` with
#   row-wise scales (target >= 0.9 x), with several tile configurations as separate rows, the promoted
#   accumulation, and the same kernel with b in the (K, N) layout;
# - the **W8A16 GEMV** at Llama-3-8B's up and down projections against the bf16 GEMV of `torch.matmul`.
#
# Elsewhere it shows the committed results of such a run.

# %%
if can_time() and fp8.fp8_dot_supported():
    from course_utils.benches import l07_fp8_quantization as bench07

    table = Table("07")
    bench07.run(table)
    table.show()
    plot(table.rows, "lesson 07")
    plt.show()
else:
    show_results("07")

# %% [markdown]
# ## What the plot shows
#
# The committed run is from an H200 (torch 2.11, Triton 3.6); on another GPU the times move, the ratios
# much less.
#
# - **Quantize**: 3.75 TB/s, 0.95 x the copy's 3.94 TB/s, counting the 3 bytes per element it must move.
#   Each row sits in one program's registers, so x is read once. `torch.compile` fuses the same steps
#   into 2.88 TB/s; eager PyTorch runs one kernel per step (abs, amax, divide, clamp, cast) and is 14
#   times slower. Splitting rows into four blocks (BLOCK = 2048) forces the second pass over each row
#   (from L2) and costs 10 to 20%; the number of warps hardly matters.
# - **FP8 matmul**: 1265 TFLOP/s, **1.82 x** cuBLAS in bf16 (695) and 1.02 x `torch._scaled_mm` with
#   row-wise scales (1238); its `use_fast_accum` mode reaches 1356. The best tile was 128 x 256 x 128
#   with 8 warps and 3 stages; the other shapes are within 10% (an earlier run preferred 128 x 128 x 128
#   with 4 warps and 5 stages). The same kernel with b in the textbook (K, N) layout runs at
#   **106 TFLOP/s, 12 x slower**: only b's strides differ, and the FP8 tiles now have to be transposed
#   before Hopper's tensor cores can read them. Promotion (`max_num_imprecise_acc`) costs nearly 3 x
#   (450 TFLOP/s) in Triton, where the partial sums are added after every BLOCK_K step instead of
#   overlapping with the next one.
# - **W8A16**: 1.26 x (up projection) and 1.30 x (down projection) faster than cuBLAS's bf16 GEMV: about
#   32 us against 41 and 42 us. Half the bytes would allow 2 x; our kernel moves its bytes at about
#   1.8 TB/s, less than half the copy bandwidth, so it is not yet at the memory's limit (more bytes in
#   flight per SM would be the next step). Narrow, long tiles (4 to 8 rows, 1024 to 2048 columns) won;
#   on the down projection wide tiles (32 or 64 rows) leave too few programs for 132 SMs.
#   `torch.compile` of "dequantize, then matmul" is 2 to 3 x slower than the plain bf16 GEMV.
#
# Next: the exercises in `exercises/07_fp8_quantization.ipynb`.
