# %% [markdown]
# # 07 FP8 quantization, an FP8 matmul, W8A16 and int4
#
# What you will learn:
# - the two FP8 formats, **e4m3** and **e5m2**, bit by bit: sign, exponent, mantissa, bias, subnormals,
#   NaN, and why e4m3fn has no infinity; their range and spacing on a number line;
# - how a float becomes FP8: round to nearest even, and what happens beyond the largest value;
# - a trap: Triton's interpreter rounds some values wrongly (the lesson counts them), and how the
#   course fixes it;
# - **scaling**: per tensor, per row, per 1x128 and 128x128 block, and what one outlier does to each;
# - a **quantize kernel** that runs at copy speed;
# - **W8A16**: an int8-weight GEMV for decoding, and why it helps a memory-bound op;
# - an **FP8 matmul** in Triton with per-row scales: fp32 accumulation, scales in the epilogue, and
#   why the B operand must be K-major on Hopper;
# - how the error against float64 behaves as K and the input scale grow, next to bf16;
# - **int4** packing, two values per byte.
#
# FP8 dots need compute capability 8.9+ (Ada, Hopper). On an older GPU and on a CPU this notebook
# runs everything through Triton's interpreter, which upcasts fp8 to fp16 for `tl.dot`. The
# exercises are in [exercises/07_fp8_quantization.ipynb](../exercises/07_fp8_quantization.ipynb):
# each section below teaches one with a worked sibling, then sends you there.

# %% [setup] fp8

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
import triton
import triton.language as tl

from course_utils import fp8, half_dtype, size
from course_utils.bench import Table, can_time, load_results, plot, show_results
from course_utils.lessons.l02_first_kernels import GRID_AXIS_MAX  # noqa: F401 - read by w8a16_gemv below
from course_utils.shapes import expect_contiguous, expect_shapes, expect_unit_stride  # noqa: F401 - read by w8a16_gemv
from course_utils.roofline import DATASHEETS, reference_ceilings

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
dev = mode.device
results = load_results("07")  # what the last GPU run measured, or None
ceilings = reference_ceilings()  # the measured copy bandwidth of the course's GPU run
H100 = DATASHEETS["H100 SXM"]  # datasheet peaks, for the napkin maths

# %% [markdown]
# ## Napkin maths, why fewer bits
#
# Decoding one token of Llama-3-8B reads every weight once: 8 billion parameters, 16 GB in bf16.
# At an H100's datasheet bandwidth that takes milliseconds before any arithmetic, and the arithmetic
# is 2 FLOPs per weight, far too little to matter (1 FLOP per byte, far left of the ridge point).
# The time is the bytes: 8 bits halve it, 4 bits quarter it.
#
# Training and prefill are the other regime: big matmuls, limited by the tensor cores. There FP8
# doubles the peak: an H100 SXM is specified (dense, no sparsity) at about 989 TFLOP/s in bf16 and
# about 1979 in FP8.

# %%
params = 8e9  # Llama-3-8B
for name, bytes_per_weight in (("bf16", 2), ("fp8 / int8", 1), ("int4", 0.5)):
    step = params * bytes_per_weight / (H100.copy_gbps * 1e9)
    print(f"{name:<10}: {params * bytes_per_weight / 1e9:4.0f} GB of weights, decode step >= {step * 1e3:.1f} ms "
          f"at the H100 SXM datasheet {H100.copy_gbps / 1e3:.2f} TB/s")
print(f"H100 SXM dense tensor-core peak (datasheet): bf16 {H100.matmul_tflops['bf16']:.0f} TFLOP/s, fp8 about "
      f"{2 * H100.matmul_tflops['bf16']:.0f}")

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
# `tl.float8e5`.
#
# **The worked sibling: decoding e5m2.** Exercise 07.decode_e4m3 asks for the value of an e4m3fn byte
# in plain Python. Here is the same for e5m2, which is IEEE-like (it is fp16 with the low 8 bits cut
# off): 5 exponent bits with bias 15, 2 mantissa bits, and the whole top exponent for inf and NaN.

# %%
def decode_e5m2(bits: int) -> float:
    """The value of the float8_e5m2 bit pattern `bits` (an int in 0..255)."""
    negative = bool(bits >> 7)
    field_e = (bits >> 2) & 0b11111  # 5 exponent bits, bias 15
    field_m = bits & 0b11  # 2 mantissa bits
    if field_e == 0b11111:  # IEEE: the top exponent is inf (mantissa 0) or NaN
        value = math.inf if field_m == 0 else math.nan
    elif field_e == 0:  # subnormal: 0.MM * 2^(1 - 15)
        value = field_m / 4 * 2.0**-14
    else:  # normal: 1.MM * 2^(E - 15)
        value = (1 + field_m / 4) * 2.0 ** (field_e - 15)
    return -value if negative else value


def fields(code: int, exp_bits: int = 4) -> str:
    """'S EEEE MMM' of a byte."""
    man_bits = 7 - exp_bits
    exponent, mantissa = (code >> man_bits) & ((1 << exp_bits) - 1), code & ((1 << man_bits) - 1)
    return f"{code >> 7} {exponent:0{exp_bits}b} {mantissa:0{man_bits}b}"


torch_values = torch.arange(256, dtype=torch.uint8).view(E5M2).to(torch.float64).tolist()
ours = [decode_e5m2(c) for c in range(256)]
agree = sum(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(ours, torch_values))
print(f"decode_e5m2 agrees with torch on {agree} of 256 codes\n")
for code, what in [(0x00, "zero"), (0x01, "smallest subnormal, 2^-16"), (0x04, "smallest normal, 2^-14"),
                   (0x3C, "one"), (0x7B, "largest, 1.75 * 2^15"), (0x7C, "inf"), (0x7F, "NaN"),
                   (0x80, "negative zero")]:
    print(f"0x{code:02X}  {fields(code, 5)}  {decode_e5m2(code):>12g}   {what}")

# %% [markdown]
# e4m3fn differs in three places: 4 exponent bits with bias 7 and 3 mantissa bits, and only
# `S 1111 111` is special (NaN; no infinity). Write it: exercise
# [07.decode_e4m3](../exercises/07_fp8_quantization.ipynb#07.decode_e4m3:-the-value-of-a-byte).

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
# - **recent torch** saturates e4m3fn the same way (pytorch/pytorch pull requests #177870 and
#   #178817, 2026); **torch 2.11 and older** (and ml_dtypes) give NaN above 464, the midpoint between 448 and the missing 480; torch's
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
# 0x7F into 480. The sweep below counts how many values in range come out wrong, and what share they
# are: enough that a correct kernel would fail its check on the CPU.
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


sweep = torch.linspace(-448, 448, 100_001)
if mode.interpret:
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
        share = len(wrong) / sweep.numel()
        print(f"{label}: {len(wrong)} of {sweep.numel()} values differ from torch ({share:.1%})  {examples}")
    fp8.install_fp8_fix()
else:  # the kernels run as PTX cvt.rn.satfinite; the interpreter's numpy emulation can still be called alone
    from triton.runtime import interpreter

    convert = getattr(interpreter, "_convert_float", None)
    if convert is None or fp8._rtne_mode() is None:
        print("this Triton's interpreter has no _convert_float(input, in_dtype, out_dtype, rounding) to test")
    else:
        convert = getattr(convert, "original", convert)  # Triton's own, not the course's fix
        got = np.asarray(convert(sweep.numpy(), tl.float32, tl.float8e4nv, fp8._rtne_mode())).astype(np.uint8)
        wrong = int((torch.from_numpy(got) != sweep.to(E4M3).view(torch.uint8)).sum())
        print(f"Triton's own interpreter cast, called on the CPU: {wrong} of {sweep.numel()} values differ "
              f"from torch ({wrong / sweep.numel():.1%}); on this GPU kernels use cvt.rn.satfinite instead")

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

# %% [inline] course_utils.fp8: E4M3_MAX quantize_blockwise_ref dequantize_blockwise_ref

# %%
torch.manual_seed(0)
base = torch.randn(256, 256)
clean = torch.ones(256, dtype=torch.bool)
clean[3] = False
granularities = {"per tensor": (256, 256), "per row": (1, 256), "1x128": (1, 128), "128x128": (128, 128)}
print(f"{'outlier':>8} | " + " | ".join(f"e4m3 {g:>10}" for g in granularities) + " | int8 tensor | int8 row")
by_outlier = {}
for R in (1e1, 1e2, 1e3, 1e4, 1e5, 1e6):
    x = base.clone()
    x[3, 5] = R
    errs = []
    for block in granularities.values():
        q, s = quantize_blockwise_ref(x, block)
        back = dequantize_blockwise_ref(q, s, block)
        errs.append(((back - x)[clean].norm() / x[clean].norm()).item())
    for keep in (True, False):  # int8, symmetric: per tensor, per row
        s8 = x.abs().max() / 127 if keep else x.abs().amax(dim=1, keepdim=True) / 127
        back = (x / s8).round().clamp(-127, 127) * s8
        errs.append(((back - x)[clean].norm() / x[clean].norm()).item())
    fp8_cols = " | ".join(f"{e:>15.4f}" for e in errs[:4])
    print(f"{R:>8.0e} | {fp8_cols} | {errs[4]:>11.4f} | {errs[5]:>8.4f}")
    by_outlier[R] = errs
print(f"R = 1e6: e4m3 128x128 / per tensor error {by_outlier[1e6][3] / by_outlier[1e6][0]:.2f}; "
      f"R = 1e2: int8 per tensor error {by_outlier[1e2][4]:.0%}")

# %% [markdown]
# Read the table: per-row and 1x128 scales do not care about the outlier (it lives in row 3, which we
# left out); per-tensor e4m3 holds out to R ~ 10^4 and then collapses; 128x128 confines the damage to the
# outlier's tile, a quarter of this 256 x 256 tensor, so the error norm shrinks by about sqrt(1/4), a
# half (the cell's last line prints the ratio). int8 per tensor is already bad at R = 100 (the last
# line prints its error there) and useless beyond, but with a scale per row it beats e4m3 (7 uniform
# bits against 3 mantissa bits): FP8 buys range, not precision. The row *with*
# the outlier is still damaged by per-row scaling; 1x128 confines the damage to 128 values. That is why
# fine-grained scales matter most for activations, where outlier channels are common in LLMs.

# %% [markdown]
# ## A quantize kernel
#
# Napkin maths at 8192 x 8192 bf16 (computed below): read 2 bytes and write 1 byte of e4m3 per
# element, plus 4 bytes of scale per row. A row of 8192 bf16 is 16 KiB: it fits in the registers of
# one program, so each row can be read from memory once, and the kernel should run at the copy
# bandwidth.

# %%
rows_q, cols_q = 8192, 8192
q_bytes = rows_q * cols_q * (2 + 1) + 4 * rows_q  # read bf16, write e4m3 and the scales
print(f"quantize 8192 x 8192 bf16 -> e4m3: {q_bytes / 2**20:.0f} MiB moved; floor {q_bytes / ceilings.bandwidth * 1e6:.0f} us "
      f"at the measured copy bandwidth ({ceilings.copy_gbps:,.0f} GB/s, {ceilings.device})")

# %% [markdown]
# **The worked sibling: a per-tensor quantize.** One scale for the whole tensor, `s = amax / 448`.
# The amax is a reduction over *every* element, so a per-tensor quantize needs a pass over the tensor
# before any program can scale its block: here `torch.amax` does that pass, and one Triton kernel
# then scales, clamps and casts with the scale it loads from memory (a pointer, so that nothing
# returns to the CPU between the two). Clamp before the cast: Triton saturates on a GPU, but torch
# 2.11 and older (and ml_dtypes) turn values beyond 464 into NaN.

# %%
@triton.jit
def quantize_tensor_kernel(x_ptr, out_ptr, scale_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) a flat block of the tensor
    in_bounds = offsets < n_elements
    inv_scale = 1.0 / tl.load(scale_ptr)  # one fp32 scale for everyone
    v = tl.load(x_ptr + offsets, mask=in_bounds, other=0.0).to(tl.float32)
    v = tl.clamp(v * inv_scale, -448.0, 448.0)  # the tensor's amax lands on 448
    tl.store(out_ptr + offsets, v.to(out_ptr.dtype.element_ty), mask=in_bounds)  # round to nearest even


def quantize_tensor(x: torch.Tensor, out: torch.Tensor, scale_out: torch.Tensor, BLOCK: int = 1024) -> None:
    """out (e4m3, like x) and scale_out (a 1-element fp32 tensor) with x ~ out * scale_out; x contiguous."""
    amax = x.abs().amax().float()  # pass 1: a global reduction (PyTorch here)
    torch.where(amax > 0, amax / 448.0, torch.ones_like(amax), out=scale_out[0])  # all zeros: scale 1
    n_elements = x.numel()
    quantize_tensor_kernel[(triton.cdiv(n_elements, BLOCK),)](x, out, scale_out, n_elements, BLOCK=BLOCK)


xq = torch.randn(size((4096, 4096), (64, 1000)), device=dev) * 3
q_t, s_t = torch.empty(xq.shape, device=dev, dtype=E4M3), torch.empty(1, device=dev)
quantize_tensor(xq, q_t, s_t)
q_want, s_want = quantize_blockwise_ref(xq, tuple(xq.shape))
print("scale equal to the reference:", torch.allclose(s_t.cpu(), s_want.flatten().cpu(), rtol=1e-6))
print(f"codes equal to the reference: {(q_t.view(torch.uint8) == q_want.view(torch.uint8)).float().mean().item():.4%}")

# %% [markdown]
# A per-row quantize needs no global pass: a row's amax is a reduction within one program, which holds
# the row in registers, so the program finds the amax, scales, clamps, casts and stores the row and
# its scale, reading the row once. An all-zero row gets scale 1 (0/0 would be NaN). Write it:
# exercise [07.quantize_rowwise](../exercises/07_fp8_quantization.ipynb#07.quantize_rowwise:-one-scale-per-row).
#
# ## W8A16, an int8-weight GEMV for decoding
#
# At decode time a linear layer is a GEMV: one activation row x (1, K) times the weight (N, K). Each
# weight is used once, for 2 FLOPs, so the layer's time is the time to read W. Store W in int8 with
# one fp32 scale per output channel and there are half the bytes to read, while x and the arithmetic
# stay 16/32-bit ("W8A16"). The op stays memory-bound with int8 weights, as long as turning each
# byte into a float costs less than reading it: the kernel below does it with integer bit operations
# and one float subtract instead of the conversion instruction, which an SM issues at 16 a clock against
# 64 bit operations and 128 float multiply-adds (the CUDA C++ Programming Guide's throughput table,
# compute capability 9.0). Compiled for the H200, {{fact:gemv_sass}}: one conversion in the whole
# kernel, none per weight.
# Weight-only quantization speeds up decoding without touching the activations, which carry the
# outliers. The sizes of Llama-3-8B's up projection (N = 14336, K = 4096):

# %%
N_up, K_up = 14336, 4096
for name, per in (("bf16", 2), ("int8", 1)):
    w_bytes = N_up * K_up * per
    print(f"W {name}: {w_bytes / 1e6:.0f} MB = {w_bytes / 2**20:.0f} MiB; read at the measured copy bandwidth "
          f"in {w_bytes / ceilings.bandwidth * 1e6:.0f} us")

# %% [markdown]
# The kernel is the course's (not an exercise). It is also the worked sibling of the FP8 matmul
# below: low-precision weights loaded as they are stored, converted in registers, an fp32
# accumulator, and the per-channel **scale applied once per output, after the K loop**, not once per
# weight: `sum_k x_k (w_nk s_n) = s_n sum_k x_k w_nk`.

# %% [inline] course_utils.lessons.l07_fp8_quantization: quantize_int8_ref w8a16_gemv_kernel w8a16_gemv

# %%
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

# %% [markdown]
# ## The FP8 matmul
#
# Exercise 07.fp8_matmul computes `(a * a_scale[:, None]) @ (b * b_scale[:, None]).T` with a (M, K) and
# b (N, K) in e4m3. It is lesson 03's tiled matmul with three changes:
#
# 1. **e4m3 tiles go straight into `tl.dot`**, which accumulates in fp32. On sm_89+ that is one
#    tensor-core instruction for FP8 inputs; the interpreter upcasts to fp16.
# 2. **The scales leave the loop**, as in the GEMV above: `sum_k (a_mk s_m)(b_nk s_n) = s_m s_n sum_k a_mk b_nk`,
#    so the finished fp32 tile is multiplied by `a_scale` of its rows and `b_scale` of its columns
#    once, in the epilogue: MN multiplies instead of MNK.
# 3. **B is K-major.** Hopper's `wgmma` takes FP8 operands only with K contiguous (B always from shared
#    memory; only 16-bit types may also be transposed). The weight of an `nn.Linear` is already (N, K) with K
#    contiguous, so the kernel loads (BLOCK_N, BLOCK_K) tiles of it and hands the transposed tile to
#    the dot: the transpose costs nothing, it only tells the compiler which layout it has. The
#    "textbook" layout, B as (K, N) with N contiguous, forces the compiler to transpose FP8 tiles
#    before the instruction can use them.
#
# The key lines, in pseudocode:
#
# ```
# for each K step:
#     a_tile = load (BLOCK_M, BLOCK_K) of a                   # e4m3, as stored
#     b_tile = load (BLOCK_N, BLOCK_K) of b                   # e4m3, K contiguous
#     acc = tl.dot(a_tile, tl.trans(b_tile), acc)             # fp32 accumulator
# acc *= a_scale[rows][:, None] * b_scale[cols][None, :]      # once, in the epilogue
# ```
#
# The rest is what gets close to cuBLAS: BLOCK_K = 128 (128 bytes of e4m3 per row, a full cache line),
# 128 x 128 or 128 x 256 output tiles, a deep pipeline (several stages of tiles in flight in shared
# memory) and the grouped order of lesson 03. The course's `fp8_matmul` uses 128 x 256 x 128 tiles,
# 8 warps and 4 stages on Hopper (`FP8_HOPPER_CONFIG`, in a persistent kernel); the benchmark sweeps
# tiles around it and records the fastest row as `triton (ours)`; the cell after *What the plot shows*
# prints every row of the sweep against it, the default's included.
#
# Napkin maths at 8192^3, computed:

# %%
n3 = 8192
fp8_flops = 2 * n3**3
fp8_peak = 2 * H100.matmul_tflops["bf16"] * 1e12  # H100 SXM dense FP8, datasheet (twice bf16)
inputs = 2 * n3 * n3  # two e4m3 matrices, 1 byte per element
print(f"2 * 8192^3 = {fp8_flops / 1e12:.2f} TFLOP; at the H100 SXM datasheet FP8 peak "
      f"({fp8_peak / 1e12:.0f} TFLOP/s): {fp8_flops / fp8_peak * 1e3:.2f} ms")
print(f"inputs: 2 x {n3 * n3 / 2**20:.0f} MiB, read at the measured copy bandwidth in "
      f"{inputs / ceilings.bandwidth * 1e6:.0f} us: compute-bound by far")

# %% [markdown]
# Write it: exercise
# [07.fp8_matmul](../exercises/07_fp8_quantization.ipynb#07.fp8_matmul:-e4m3-tiles-in-tl.dot).
# From here on the lesson uses the course's `fp8_matmul` and `quantize_rowwise` (their solutions are
# in `solutions/07_fp8_quantization.ipynb`).

# %%
from course_utils.lessons.l07_fp8_quantization import fp8_matmul, quantize_rowwise  # solutions of 07

rows, cols = size((4096, 4096), (64, 1000))
magnitudes = torch.logspace(-3, 3, rows, device=dev)[:, None]  # rows from 1e-3 to 1e3
x = torch.randn(rows, cols, device=dev) * magnitudes
x[1] = 0
out = torch.empty(rows, cols, device=dev, dtype=E4M3)
scale = torch.empty(rows, device=dev)
quantize_rowwise(x, out, scale)
rel = ((out.float() * scale[:, None] - x).norm() / x.norm()).item()
print(f"quantize_rowwise: relative error of out * scale {rel:.4f} (e4m3's half step is 2^-4 = {2**-4:.4f} at most)")

M, N, K = size((2048, 2048, 2048), (64, 96, 160))
out_dtype = half_dtype() if mode.gpu else torch.float32
a, a_scale = fp8.quantize_rowwise_ref(torch.randn(M, K, device=dev))
b, b_scale = fp8.quantize_rowwise_ref(torch.randn(N, K, device=dev))
c = torch.empty(M, N, device=dev, dtype=out_dtype)
exact = fp8.fp8_matmul_ref(a, a_scale, b, b_scale)


def rel_error(got):
    return ((got.cpu().double() - exact).norm() / exact.norm()).item()


fp8_matmul(a, a_scale, b, b_scale, c)
print(f"fp8_matmul: relative error against float64 on the same e4m3 inputs: {rel_error(c):.2e}")
b_kn = b.t().contiguous()  # the textbook layout: (K, N), N contiguous
fp8_matmul(a, a_scale, b_kn.t(), b_scale, c)  # same kernel, strides (1, N)
print(f"with b in the (K, N) layout:                                         {rel_error(c):.2e}")
print("\n".join(n for n in (results or {}).get("notes", []) if "best of our sweep" in n))

# %% [markdown]
# ## How big is the error, and does it grow?
#
# Two sources: **quantizing** the inputs (each e4m3 value is off by up to 2^-4 of itself) and
# **accumulating** K products. Products of two e4m3 values have at most 8 significant bits, so they are
# exact in fp32; the sum is where rounding can pile up.
#
# The "About GPU fuzed kernel" paper (section 5) observed the FP8 error growing with the matrix size.
# It does, measured as an absolute error: each output is a sum of K products with random signs, so the output and
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
mean_rel = {name: sum(r[name][1] for r in rows_out) / len(rows_out) for name in ("e4m3 per row", "bf16")}
print(f"mean relative error over K: e4m3 {mean_rel['e4m3 per row']:.2%}, bf16 {mean_rel['bf16']:.3%}, "
      f"{mean_rel['e4m3 per row'] / mean_rel['bf16']:.1f} times less in bf16")

# %% [markdown]
# The absolute error grows like sqrt(K), the relative error does not move. The cell's last line
# prints its mean over K for each format and their ratio, close to the 2^4 = 16 that the mantissa
# bits predict (bf16 keeps 7, e4m3 3: a 16 times finer step).
#
# There is a second effect that *does* grow with K, on Hopper only. Its FP8 tensor-core instruction
# does not keep a full fp32 accumulator: the DeepSeek-V3 technical report (arXiv 2412.19437,
# "Increasing Accumulation Precision") measured about 14 bits, and a maximum relative error near 2% at
# K = 4096. Triton leaves the whole K loop in that accumulator by default on sm_90
# (`max_num_imprecise_acc` = "no limit"). Passing `max_num_imprecise_acc=BLOCK_K` to `tl.dot` (our
# kernel's `promote=True`) makes it add each BLOCK_K chunk into a real fp32 accumulator, DeepSeek's
# "promotion every 128 elements". The cell below measures the error of the accumulation alone (fp32
# output, against float64 on the same e4m3 inputs) with and without promotion; on a CPU it prints
# what the committed GPU run measured. The interpreter accumulates in fp32, so on a CPU both are flat.
#
# Two metrics, two numbers: DeepSeek's figure is a *maximum* relative error (the worst of the
# outputs), ours is a *norm* over the whole output, `||C - C64|| / ||C64||`, which averages the worst
# elements away. Compare each only with its own kind: the worst of many random errors lies several
# times above their root mean square. The bench measures both on the same outputs (the worst element's
# error divided by the outputs' RMS, beside the norm error; the cell prints both): {{fact:fp8_worst_element}}
# (H200; on the H100 {{fact@h100:fp8_worst_element}}).

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
            diff = c32.cpu().double() - exact  # (256, 256)
            line.append((diff.norm() / exact.norm(), diff.abs().max() / exact.pow(2).mean().sqrt()))
        print(f"  K={K:>6}: norm error default {line[0][0]:.2e}, promoted every BLOCK_K {line[1][0]:.2e}; "
              f"worst element / outputs' RMS {line[0][1]:.2e} and {line[1][1]:.2e}")
else:
    K = 1024
    qa, sa = fp8.quantize_rowwise_ref(torch.randn(32, K))
    qb, sb = fp8.quantize_rowwise_ref(torch.randn(32, K))
    c32 = torch.empty(32, 32)
    fp8_matmul(qa, sa, qb, sb, c32)
    exact = fp8.fp8_matmul_ref(qa, sa, qb, sb)
    err = ((c32.double() - exact).norm() / exact.norm()).item()
    print(f"interpreter, K={K}: {err:.2e} (fp32 accumulation)")
    notes = [n for n in (results or {}).get("notes", []) if n.startswith("accumulation error")]
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
# subnormals and then to zero (the product becomes 0: a relative error of 1), larger ones saturate at 448. With per-row
# scales the curve is flat at the quantization error, like bf16's, just higher.

# %% [markdown]
# ## int4, two values per byte
#
# Half the bytes of int8 again, but no GPU loads 4-bit values: we pack two in a byte and unpack in
# registers. Real formats pack 8 nibbles per int32 and keep a scale per group of 32 to 128 weights,
# because 16 levels per channel are too few.
#
# **The worked sibling: 2-bit values, four per byte.** Value `i` of a group of four goes to bits
# `2i` and `2i + 1`: shift it left by `2i` and OR the four together; to get it back, shift right and
# keep the two low bits with a mask (`& 0b11`). Work on *unsigned* bytes: `>>` on an int8 copies the
# sign bit in. Signed values store their two's complement bits (`q & 0b11` for 2 bits); to get one
# back, sign-extend: for 2 bits, `(n ^ 2) - 2`.

# %%
def pack_int2(values: torch.Tensor) -> torch.Tensor:
    """uint8 (..., n) from (..., 4n) values 0..3: value 4j + i in bits 2i, 2i + 1 of byte j."""
    groups = values.to(torch.uint8).reshape(*values.shape[:-1], -1, 4)  # (..., n, 4)
    byte = torch.zeros(groups.shape[:-1], dtype=torch.uint8)
    for i in range(4):
        byte |= (groups[..., i] & 0b11) << (2 * i)
    return byte


def unpack_int2(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int2: (..., 4n) uint8 values 0..3."""
    parts = [(packed >> (2 * i)) & 0b11 for i in range(4)]  # unsigned shifts: no sign bits come in
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], -1)


vals = torch.tensor([1, 3, 0, 2, 3, 3, 3, 3], dtype=torch.uint8)
packed2 = pack_int2(vals)
print("values:", vals.tolist(), "-> bytes:", [f"0b{v:08b}" for v in packed2.tolist()])
print("unpacked:", unpack_int2(packed2).tolist())
signed = torch.arange(-2, 2)
bits2 = (signed & 0b11).to(torch.uint8)
print("signed -2..1 as 2-bit codes:", bits2.tolist(), "| sign-extended back:", ((bits2.to(torch.int16) ^ 2) - 2).tolist())

# %% [markdown]
# Two 4-bit values per byte is the same with one shift of 4: exercises
# [07.pack_int4](../exercises/07_fp8_quantization.ipynb#07.pack_int4:-two-nibbles-per-byte) and
# [07.unpack_int4](../exercises/07_fp8_quantization.ipynb#07.unpack_int4:-and-back).
#
# ## Benchmark
#
# On an H100 (or any sm_89+ GPU) the cell below runs the lesson's benchmark (a few minutes) with the
# course's solutions:
# - **quantize_rowwise** bf16 -> e4m3 at 8192 x 8192 against the copy ceiling (target at least 0.85 x
#   its GB/s: a one-pass kernel moves the bytes of a copy), next to the same quantization in eager
#   PyTorch and `torch.compile`;
# - **fp8_matmul** at 8192^3 against `torch.matmul` in bf16 (target at least 1.6 x: FP8 doubles the
#   tensor-core peak) and `torch._scaled_mm` with row-wise scales (the library's FP8 matmul), with
#   several tile configurations as separate rows, the promoted accumulation, and the same kernel with
#   b in the (K, N) layout; `_scaled_mm` with fast accumulation and our default take turns, three
#   rounds, each row the median (a GPU at full load slows down as it heats: lesson 03 says more);
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
    data = table.to_json()
else:
    data = show_results("07")

# %% [markdown]
# ## What the plot shows
#
# Figures from the committed run ({{measured}}); on another GPU the times move, and some ratios too (the
# W8A16 GEMV's, below, move about as much as its times).
#
# - **Quantize**: ours ran at {{gbps:quantize_rowwise bf16->e4m3 8192x8192|triton (ours)}},
#   {{ratio:quantize_rowwise bf16->e4m3 8192x8192|triton (ours)|copy ceiling (bf16 x -> y)}} the copy's
#   GB/s, counting the 3 bytes per element it must move. Each row sits in one program's registers, so
#   x is read once. `torch.compile` fuses the same steps into
#   {{gbps:quantize_rowwise bf16->e4m3 8192x8192|torch.compile}}; eager PyTorch runs one kernel per step
#   (abs, amax, divide, clamp, cast): {{gbps:quantize_rowwise bf16->e4m3 8192x8192|torch eager}}.
#   Splitting rows into blocks forces a second pass over each row (from L2): the cell below prints
#   what that cost in the committed sweep.
# - **FP8 matmul**: {{tflops:fp8 matmul 8192^3 (bf16 out)|triton (ours)}},
#   {{ratio:fp8 matmul 8192^3 (bf16 out)|triton (ours)|torch.matmul bf16 (cuBLAS)}} cuBLAS in bf16
#   ({{tflops:fp8 matmul 8192^3 (bf16 out)|torch.matmul bf16 (cuBLAS)}}) and
#   {{ratio:fp8 matmul 8192^3 (bf16 out)|triton (ours)|torch._scaled_mm rowwise}} `torch._scaled_mm`
#   with row-wise scales ({{tflops:fp8 matmul 8192^3 (bf16 out)|torch._scaled_mm rowwise}}). Without
#   `use_fast_accum` the library promotes its partial sums into fp32 at intervals (the promotion of
#   the error section above), which ours does not by default; the like-for-like peer is its
#   `use_fast_accum` mode, which leaves the sums in the tensor cores' accumulator as ours does, and the
#   target is at least its speed (1.0 x: the library's own FP8 matmul with the same accumulation).
#   It reached {{tflops:fp8 matmul 8192^3 (bf16 out)|torch._scaled_mm rowwise fast_accum}}; ours ran at
#   {{ratio:fp8 matmul 8192^3 (bf16 out)|triton (ours)|torch._scaled_mm rowwise fast_accum}} its speed
#   here and at {{ratio@h100:fp8 matmul 8192^3 (bf16 out)|triton (ours)|torch._scaled_mm rowwise fast_accum}}
#   on an H100 ({{measured@h100}}): the target was {{verdict:fp8 matmul 8192^3 (bf16 out)|triton (ours)|torch._scaled_mm rowwise fast_accum}} on the H200 and {{verdict@h100:fp8 matmul 8192^3 (bf16 out)|triton (ours)|torch._scaled_mm rowwise fast_accum}} on the H100.
#   Where the difference comes from: at full tensor-core load a GPU meets its board's power limit, and
#   its clock drops until the power fits. The benchmark runs each of the pair back to back for a few
#   seconds while `nvidia-smi` samples the clock and the power (`course_utils.bench.clock_and_power`):
#   {{fact:fp8_clocks}}; on the H100, {{fact@h100:fp8_clocks}}. Both draw the power the board allows; ours
#   runs at the higher clock and gets less work out of each cycle, the library the other way round,
#   and the speed is the product of the two. Under a power cap a kernel gains by the work
#   it gets out of each cycle (the overlap of loads, tensor-core instructions and epilogue), not by
#   its clock. Nor is the gap the last round of tiles
#   (2048 tiles of 128 x 256 on 132 SMs: 15.5 rounds, the last one half full): with N = 7936, 8192 and
#   8448 our kernel runs 16 rounds each, and its time still grew with N; a stream-K variant that shares
#   the last round's K steps among all the SMs was no faster (`results/explore/fp8_streamk.h200.json`).
#   The same kernel with b in the textbook (K, N) layout, and with promoted accumulation, are rows of
#   the sweep: the cell below prints them. Only b's strides differ in the first: the FP8 tiles now
#   have to be transposed before Hopper's tensor cores can read them. Promotion adds the partial
#   sums into the fp32 accumulator after every BLOCK_K step, so the tensor cores' partial tile (fp32)
#   lives beside the accumulator, two 128 x 256 fp32 tiles in the registers of 8 warps, 256 values a
#   thread where the register file allows 255 registers: the compiled kernels have
#   {{fact:fp8_promoted_registers}}. Every step moves the rest to local memory and back.
# - **W8A16**: {{ratio:W8A16 GEMV 1x4096 @ (14336x4096).T|triton (ours) W8A16|torch.matmul bf16 (cuBLAS)}}
#   (up projection) and {{ratio:W8A16 GEMV 1x14336 @ (4096x14336).T|triton (ours) W8A16|torch.matmul bf16 (cuBLAS)}}
#   (down projection) the speed of cuBLAS's bf16 GEMV: {{us:W8A16 GEMV 1x4096 @ (14336x4096).T|triton (ours) W8A16}}
#   against {{us:W8A16 GEMV 1x4096 @ (14336x4096).T|torch.matmul bf16 (cuBLAS)}} on the up projection.
#   Half the bytes would allow 2 x; our kernel moved its bytes at
#   {{gbps:W8A16 GEMV 1x4096 @ (14336x4096).T|triton (ours) W8A16}},
#   {{ratio:W8A16 GEMV 1x4096 @ (14336x4096).T|triton (ours) W8A16|copy ceiling (1 GiB, read + write)}} the
#   copy's rate, and cuBLAS its bf16 weights at {{gbps:W8A16 GEMV 1x4096 @ (14336x4096).T|torch.matmul bf16 (cuBLAS)}}:
#   a read of 59 MB lasts tens of microseconds, and the start and the tail of a kernel (the first
#   loads in flight, the last SMs finishing) weigh more than in a 1 GiB copy.
#   How much more was measured: the benchmark also runs every tiling of the GEMV's sweep with the
#   arithmetic taken out (rows `read only (no math)`: each program loads its int32 words and only adds
#   them up) and keeps the fastest. That read reached {{ratio:W8A16 GEMV 1x4096 @ (14336x4096).T|read only (no math)|copy ceiling (1 GiB, read + write)}} the copy's rate on the up projection and
#   {{ratio:W8A16 GEMV 1x14336 @ (4096x14336).T|read only (no math)|copy ceiling (1 GiB, read + write)}} on the down projection on the H200, {{ratio@h100:W8A16 GEMV 1x4096 @ (14336x4096).T|read only (no math)|copy ceiling (1 GiB, read + write)}} and
#   {{ratio@h100:W8A16 GEMV 1x14336 @ (4096x14336).T|read only (no math)|copy ceiling (1 GiB, read + write)}} on the H100 ({{measured@h100}}). The course's target for this GEMV is
#   0.85 of the copy's rate; a GEMV that reads with these tiles cannot beat its own reads, so where
#   the read alone stays below 0.85 the target is out of reach for this read pattern, arithmetic or not (a
#   different read pattern would have to come first; fetching the same tiles into shared memory by
#   TMA descriptors (Hopper's Tensor Memory Accelerator) read them more slowly on the H100:
#   `results/explore/w8a16_tma.h100.json`). The arithmetic costs the rest: our GEMV
#   ran at {{ratio:W8A16 GEMV 1x4096 @ (14336x4096).T|triton (ours) W8A16|read only (no math)}} and {{ratio:W8A16 GEMV 1x14336 @ (4096x14336).T|triton (ours) W8A16|read only (no math)}} of the fastest read's speed on the H200,
#   {{ratio@h100:W8A16 GEMV 1x4096 @ (14336x4096).T|triton (ours) W8A16|read only (no math)}} and {{ratio@h100:W8A16 GEMV 1x14336 @ (4096x14336).T|triton (ours) W8A16|read only (no math)}} on the H100. The two GPUs have the same SMs at about the same
#   clock, and the H100's HBM3 delivers fewer bytes per second than the H200's HBM3e (datasheets): on
#   the H100 each byte leaves the SMs more time for its arithmetic, which then costs less of the
#   read's speed. Nsight Compute on the H100 (`results/explore/README.md`) finds it waiting on its
#   loads: the memory at about three quarters of its peak bandwidth, an instruction issued on under
#   half of the cycles; no other tile or warp count was measurably faster (`gemv_warps.h100.json`).
#   There are no stages to tune here: Triton pipelines a loop's loads (copies into shared memory issued
#   iterations ahead) only when they feed a `tl.dot`, or when the loop asks for it with
#   `tl.range(..., num_stages=n)`, and the compiled kernel (`kernel.asm["ttgir"]`) has no such copies
#   (`results/explore/pipelined_loops.h100.json`).
#   Asked for, the pipeline made the GEMV slower (`results/explore/pipelined_loops.h100.json`): it
#   hides its loads behind other resident warps, not behind its own arithmetic. Loading the next
#   tile's words into registers before this tile's arithmetic, written in the loop, was slower too,
#   though the same change made the read without arithmetic faster, at one of the two shapes by much
#   (`results/explore/gemv_register_prefetch.h100.json`).
#   `torch.compile` of "dequantize, then matmul" was slower than the plain bf16 GEMV:
#   {{us:W8A16 GEMV 1x4096 @ (14336x4096).T|torch.compile int8 dequant + matmul}}.

# %%
def sweep(data: dict | None, group: str, words: tuple[str, ...]) -> None:
    """Print the rows of a group whose names hold any of `words`, against the group's 'triton (ours)'."""
    rows = [r for r in (data or {}).get("rows", []) if r["group"] == group]
    best = next((r for r in rows if r["name"] == "triton (ours)"), None)  # the default: the best of the sweep
    for r in rows:
        if any(w in r["name"] for w in words) and best:
            print(f"  {r['name']:<52} {r['ms'] * 1e3:8.1f} us, {best['ms'] / r['ms']:.2f} x the speed of "
                  f"'{best['name']}' ({best['ms'] * 1e3:.1f} us)")


print("quantize: rows split into blocks (a second pass over each row) against the one-pass default")
sweep(data, "quantize_rowwise bf16->e4m3 8192x8192", ("BLOCK=",))
print("fp8 matmul: tiles, the (K, N) layout of b, promoted accumulation")
sweep(data, "fp8 matmul 8192^3 (bf16 out)", ("w4", "w8"))

# %% [markdown]
# If you have not yet, open [exercises/07_fp8_quantization.ipynb](../exercises/07_fp8_quantization.ipynb)
# and write the five exercises.
