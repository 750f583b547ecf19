# %% [markdown]
# # Lesson 06 exercises: RMSNorm, SwiGLU and the fused RMSNorm + MLP block
#
# The second half of a Llama decoder layer computes, for every token `x` (a row of `hidden` numbers):
#
# ```
# n   = x / sqrt(mean(x**2) + eps) * norm_weight           # RMSNorm, over the hidden axis
# h   = silu(n @ w_gate.T) * (n @ w_up.T)                  # SwiGLU, (rows, intermediate)
# out = h @ w_down.T                                       # down projection, (rows, hidden)
# ```
#
# Three kernels, each checked on fresh random inputs: `rmsnorm` (statistics in fp32),
# `gate_up_silu` (both matmuls in one kernel) and `rmsnorm_mlp` (the whole block: the RMS statistics
# gathered by the gate/up kernel itself at a few rows, by a small pre-pass at many, so the normalized
# `n` is never written, on weights packed once into the layout its kernels read fastest). Weights come in `nn.Linear` layout:
# `w_gate` and `w_up` are `(intermediate, hidden)`, `w_down` is `(hidden, intermediate)`. Activations
# are 2-D `(rows, hidden)`: a `(batch, seq, hidden)` tensor is passed as `x.view(-1, hidden)`, which
# is free. `x`, `out` and the three weights may have any strides (the checks give you a slice of a wider
# `x`, an `out` with padded rows, weights kept K-major): address each with its own; `norm_weight` is a
# contiguous `(hidden,)`.
#
# Destination passing as in lesson 02: your host function receives its inputs and the output `out`,
# which the checker poisoned; write every element of `out`, and nothing else. The lesson,
# [notebooks/06_fused_rmsnorm_mlp.ipynb](../notebooks/06_fused_rmsnorm_mlp.ipynb), teaches each exercise with a worked sibling; every
# exercise below links its section.

# %% [setup]

# %%
from course_utils import check, current, progress  # noqa: F401
from course_utils.shapes import expect_shapes  # noqa: E402
from typing import NamedTuple  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import nn  # noqa: E402

from course_utils.lessons.l02_first_kernels import copy_2d  # noqa: E402
from course_utils.lessons.l03_matmul import grouped_tile, matmul  # noqa: E402
from course_utils.lessons.l05_online_softmax import stages_that_fit  # noqa: E402

# %% [markdown]
# ## The PyTorch references
#
# What each exercise computes, in plain PyTorch. The checks compare against the same formulas in
# float64. Note where Hugging Face's `LlamaRMSNorm` computes its statistics: it casts to fp32 first,
# because `x**2` of an fp16 value above 256 overflows fp16 (its largest finite value is 65504).

# %%
def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # (rows, hidden) at least fp32: a sum of squares
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # (rows, 1): eps inside the sqrt
    return (xf * rstd * weight.to(xf.dtype)).to(x.dtype)


def gate_up_silu_ref(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x @ w_gate.T) * (x @ w_up.T)  # (rows, intermediate)


def rmsnorm_mlp_ref(x, norm_weight, w_gate, w_up, w_down, eps):
    return gate_up_silu_ref(rmsnorm_ref(x, norm_weight, eps), w_gate, w_up) @ w_down.T  # (rows, hidden)


# %% [markdown]
# ## 06.rmsnorm: one pass statistics in fp32
#
# `rmsnorm(x, weight, eps, out)`. Taught in the lesson's
# [Normalizing rows in one pass](../notebooks/06_fused_rmsnorm_mlp.ipynb#Normalizing-rows-in-one-pass) (the worked example is LayerNorm).
#
# `out[i, :] = x[i, :] / sqrt(mean(x[i, :]**2) + eps) * weight` for `x` of shape `(rows, hidden)`.
# One program normalizes `BLOCK_M` whole rows: it loads a `(BLOCK_M, BLOCK_N)` tile with
# `BLOCK_N = next_power_of_2(hidden)` (mask the columns past `hidden`, with `other=0.0` so they add
# nothing to the sum), squares and sums **in fp32** along axis 1, and writes the scaled rows.
# One launch, one pass: every element is read once and written once, so the traffic is 2 x rows x hidden
# elements, and the floor is that divided by the memory bandwidth. Short rows (hidden 1024 in bf16
# is 2 KB) leave a one-row program too little to load at once: take several rows per program.

# %%
def rmsnorm_config(n_rows: int, n_cols: int) -> dict:
    """Rows per program and warps: about 4096 elements per program, whole rows only."""
    block_n = triton.next_power_of_2(n_cols)
    block_m = max(1, min(4096 // block_n, triton.next_power_of_2(n_rows)))
    elements = block_m * block_n
    num_warps = 4 if elements <= 2048 else 8 if elements <= 8192 else 16
    return dict(BLOCK_M=block_m, num_warps=num_warps)


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_xm, stride_xn, stride_w,
                   stride_om, stride_on, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,) a whole row: BLOCK_N >= n_cols
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]  # (BLOCK_M, BLOCK_N)
    rows64 = rows.to(tl.int64)  # rows * stride can pass 2^31 on big tensors
    cols64 = cols.to(tl.int64)  # and so can cols * stride of a transposed x (stride_xn = rows)
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols64[None, :] * stride_xn, mask=mask, other=0.0)
    x = x.to(tl.float32)  # statistics in fp32: x * x of an fp16 300 is 90000 > 65504
    mean_sq = tl.sum(x * x, axis=1) / n_cols  # (BLOCK_M,) padded columns are 0: they add nothing
    rstd = tl.rsqrt(mean_sq + eps)  # (BLOCK_M,) eps inside the square root; an all-zero row gives 0
    w = tl.load(w_ptr + cols * stride_w, mask=col_ok, other=0.0).to(tl.float32)  # (BLOCK_N,)
    y = x * rstd[:, None] * w[None, :]  # (BLOCK_M, BLOCK_N)
    tl.store(out_ptr + rows64[:, None] * stride_om + cols64[None, :] * stride_on,
             y.to(out_ptr.dtype.element_ty), mask=mask)
    # END SOLUTION


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor,
            BLOCK_M: int | None = None, num_warps: int | None = None) -> None:
    """out = x / sqrt(mean(x**2, -1) + eps) * weight; x and out (rows, hidden), weight (hidden,)."""
    expect_shapes("rmsnorm", weight=(weight, x.shape[-1:]), out=(out, x.shape))
    # BEGIN SOLUTION
    n_rows, n_cols = x.shape
    if out.numel() == 0:  # no rows, or rows of no elements: nothing to write
        return
    config = rmsnorm_config(n_rows, n_cols)
    BLOCK_M = BLOCK_M or config["BLOCK_M"]
    grid = (triton.cdiv(n_rows, BLOCK_M),)  # one program per BLOCK_M whole rows
    rmsnorm_kernel[grid](x, weight, out, n_rows, n_cols, x.stride(0), x.stride(1), weight.stride(0),
                         out.stride(0), out.stride(1), eps, BLOCK_M=BLOCK_M,
                         BLOCK_N=triton.next_power_of_2(n_cols), num_warps=num_warps or config["num_warps"])
    # END SOLUTION


# %% [check] 06.rmsnorm

# %% [markdown]
# ## 06.gate_up_silu: gate, up and SiLU in one kernel
#
# `gate_up_silu(x, w_gate, w_up, out)`. Taught in the lesson's
# [A matmul with an activation in its epilogue](../notebooks/06_fused_rmsnorm_mlp.ipynb#A-matmul-with-an-activation-in-its-epilogue)
# (the worked example is one linear layer with a GELU epilogue).
#
# `out = silu(x @ w_gate.T) * (x @ w_up.T)` in **one** kernel: x `(M, K)`, w_gate and w_up `(N, K)`
# in `nn.Linear` layout, out `(M, N)`. It is lesson 03's matmul with **two accumulators**: each
# program owns a `(BLOCK_M, BLOCK_N)` tile of `out` (grouped order, `grouped_tile`), and every
# `(BLOCK_M, BLOCK_K)` tile of `x` it loads feeds two `tl.dot`s, one per weight. The epilogue computes
# `silu(g) * u = g * sigmoid(g) * u` in fp32 and stores once: the `(M, N)` gate and up results are
# never written to memory, and a 16-bit `out` is rounded once, at the store (the check allows one
# rounding of its dtype from the exact result, plus the fp32 sums' own error, nothing for a `g`, `u`
# or `silu(g)` rounded to 16 bits on the way). The `(BLOCK_K, BLOCK_N)` tile of `w.T` is element
# `(k, n)` of `w.T`, that is `w[n, k]`, at `w_ptr + n * w.stride(0) + k * w.stride(1)`. (The other
# way to do it: one merged weight, one accumulator of width `2 * BLOCK_N`, and an epilogue that splits
# it: 06.rmsnorm_mlp does that; the course does not time the two forms against each other.) FLOPs:
# 2 x M x N x K per weight, so 4MNK; `mlp_config` has tile sizes for few and for many rows.

# %%
def mlp_config(M: int, element_size: int = 2, device: torch.device | None = None) -> dict:
    """Tiles for the MLP's gate/up kernels: narrow ones for few rows (memory-bound), big ones for many.

    BLOCK_N counts columns of the output (h): each K step reads BLOCK_N columns of each weight, that is
    a (BLOCK_K, 2 * BLOCK_N) tile of the merged w_gu in rmsnorm_gate_up_silu_kernel. BLOCK_K is
    counted in 128-byte slices of a row (64 fp16/bf16 elements, 32 fp32), so a pipeline stage takes
    the same shared memory in every dtype. device: the GPU the kernel runs on (x.device), for fewer
    stages where its shared memory cannot hold them; None: the stages tuned on the H100.
    """
    if current().interpret:  # few, large programs: the interpreter runs them one after another
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=2)
    k_slice = 128 // element_size
    if M <= 16:  # decode-sized: stream the weights through every SM; 16 rows is tl.dot's minimum
        cfg = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=k_slice, GROUP_M=1, num_warps=4, num_stages=4)
    elif M <= 64:
        cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=k_slice, GROUP_M=1, num_warps=4, num_stages=4)
    else:
        # Compute-bound: a 128 x (2 x 128) accumulator (or two 128 x 128 ones), a cuBLAS-sized tile, 3
        # stages; the bench sweeps GROUP_M and stages around it (its notes name the fastest of each run).
        cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=k_slice, GROUP_M=8, num_warps=8, num_stages=3)
    if device is not None:
        # A stage holds a (BLOCK_M, BLOCK_K) tile of x and a (BLOCK_K, 2 * BLOCK_N) tile of the weights:
        # (16 + 2 x 128) x 128 B = 34 KiB for few rows, 4 stages on an H100 or an A100, 2 on an L4 (99 KiB).
        stage = (cfg["BLOCK_M"] + 2 * cfg["BLOCK_N"]) * cfg["BLOCK_K"] * element_size
        cfg["num_stages"] = max(1, stages_that_fit(cfg["num_stages"], stage, device))
    return cfg


@triton.jit
def gate_up_silu_kernel(x_ptr, wg_ptr, wu_ptr, out_ptr, M, N, K,
                        stride_xm, stride_xk, stride_gn, stride_gk, stride_un, stride_uk,
                        stride_om, stride_on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # BEGIN SOLUTION
    # Grouped order (lesson 03): GROUP_M consecutive row-tiles sweep the columns together.
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) rows of x and out
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) rows of w, columns of out
    rk = tl.arange(0, BLOCK_K)
    # Rows and columns past the edge load a valid row again (% M, % N) instead of being masked:
    # the loads stay unmasked along M and N, and the store below drops those rows.
    rm_in = rm % M
    rn_in = rn % N
    x_ptrs = x_ptr + rm_in[:, None].to(tl.int64) * stride_xm + rk[None, :] * stride_xk  # (BLOCK_M, BLOCK_K)
    g_ptrs = wg_ptr + rn_in[None, :].to(tl.int64) * stride_gn + rk[:, None] * stride_gk  # (BLOCK_K, BLOCK_N)
    u_ptrs = wu_ptr + rn_in[None, :].to(tl.int64) * stride_un + rk[:, None] * stride_uk
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # x @ w_gate.T
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # x @ w_up.T
    for k0 in range(0, K, BLOCK_K):
        k_ok = rk + k0 < K  # the last K block is partial when K is no multiple of BLOCK_K
        x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        wg = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)  # (BLOCK_K, BLOCK_N) of w_gate.T
        wu = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
        acc_g = tl.dot(x, wg, acc_g)  # the same x tile feeds both dots
        acc_u = tl.dot(x, wu, acc_u)
        x_ptrs += BLOCK_K * stride_xk
        g_ptrs += BLOCK_K * stride_gk
        u_ptrs += BLOCK_K * stride_uk
    h = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up, in fp32, in registers
    tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :] * stride_on,
             h.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
    # END SOLUTION


def gate_up_silu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, out: torch.Tensor,
                 config: dict | None = None) -> None:
    """out = silu(x @ w_gate.T) * (x @ w_up.T); x (M, K), w_gate and w_up (N, K), out (M, N)."""
    expect_shapes("gate_up_silu", w_gate=(w_gate, (w_gate.shape[0], x.shape[1])), w_up=(w_up, w_gate.shape),
                  out=(out, (x.shape[0], w_gate.shape[0])))
    # BEGIN SOLUTION
    M, K = x.shape
    N = w_gate.shape[0]
    cfg = config or mlp_config(M, x.element_size(), x.device)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)  # one program per out tile
    gate_up_silu_kernel[grid](
        x, w_gate, w_up, out, M, N, K, x.stride(0), x.stride(1), w_gate.stride(0), w_gate.stride(1),
        w_up.stride(0), w_up.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    # END SOLUTION


# %% [check] 06.gate_up_silu

# %% [markdown]
# ## 06.rmsnorm_mlp: the block in two kernels
#
# `rmsnorm_mlp(x, norm_weight, w_gate, w_up, w_down, eps, out)`. Taught in the lesson's
# [The norm inside the matmul](../notebooks/06_fused_rmsnorm_mlp.ipynb#The-norm-inside-the-matmul) (the worked example fuses LayerNorm
# into one linear layer) and [One merged weight and a split epilogue](../notebooks/06_fused_rmsnorm_mlp.ipynb#One-merged-weight-and-a-split-epilogue).
#
# The whole block, `out = (silu(n @ w_gate.T) * (n @ w_up.T)) @ w_down.T` with `n = rmsnorm(x)`,
# without ever writing `n`. The trick (section 4 of "About GPU fuzed kernel"): `1 / rms(x)` is one
# number per row, so it commutes with the matmul,
#
# ```
# rmsnorm(x) @ W.T = ((x * norm_weight) @ W.T) / rms(x)      (row by row)
# ```
#
# `norm_weight` is constant along the rows, so it goes into the packed weight once
# (`w_gu[k, :] *= norm_weight[k]`), and the K loop of the gate/up kernel is a plain matmul of `x`
# with that weight. `1 / rms(x) = 1 / sqrt(sum(x**2) / K + eps)` is a row scale for the epilogue,
# applied to the accumulator's rows before the SiLU. Where the kernel gets `sum(x**2)` (in fp32)
# depends on how many rows there are:
#
# - **few rows** (`M <= STATS_PREPASS_ROWS`, a decode step; `STATS_PREPASS=False`): after the loop
#   the kernel walks its `BLOCK_M` rows of `x` once more (from L2, no tensor-core work) and adds up
#   their squares. A second launch would cost more than this re-read of 16 short rows;
# - **many rows** (`STATS_PREPASS=True`): each of the `cdiv(I, BLOCK_N)` programs that share a row
#   block would re-read it, 86 times over at the intermediate size 11008, so `row_rstd` (given)
#   computes `1 / rms` of every row once, before the kernel (it reads `x` once and writes 4 bytes a
#   row), and the epilogue loads the `BLOCK_M` values of its rows from `rstd_ptr`.
#
# (Summing `x**2` inside the K loop, the paper's way, works too, but it pulls every `x` tile out of
# shared memory into registers beside the tensor cores' reads, work the plain loop does not have; the
# bench does not time it, and one exploratory run found it slower than the pre-pass at many rows.)
# Then `h` (rows, intermediate) is written once and the down projection is the next launch: two or
# three launches where Hugging Face makes 13 (in fp16). The third is the pre-pass above 64 rows, or, on
# a GPU at 16 rows or fewer, the fill that zeroes `out`: there the down projection splits K
# (`down_split_k`, given) and its chunks add into `out`, since 16 rows x 1024 columns are too few output
# tiles for a whole GPU.
#
# **One merged weight, one accumulator.** The weights are packed **once**, as an inference engine
# does when it loads a model (vLLM merges `gate_proj` and `up_proj` the same way), into
# `w_gu`, an `(H, 2I)` row-major matrix whose columns interleave gate and up,
# `w_gu[:, 2j] = norm_weight * w_gate[j, :]` and `w_gu[:, 2j + 1] = norm_weight * w_up[j, :]`. Each K step is then **one**
# `tl.dot` of the `(BLOCK_M, BLOCK_K)` tile of `x` with a `(BLOCK_K, 2 * BLOCK_N)` tile of `w_gu` into
# one `(BLOCK_M, 2 * BLOCK_N)` accumulator: a plain matmul, cuBLAS-sized (128 x 256), with B in the
# row-major layout that lesson 03's matmul runs fastest. The epilogue splits it again: column `2j` of
# the tile is gate `j`, column `2j + 1` is up `j`, so
#
# ```
# g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))      # each (BLOCK_M, BLOCK_N)
# ```
#
# scale both by `1 / rms`, and store `silu(g) * u`, a `(BLOCK_M, BLOCK_N)` tile of `h`. The down
# weight is packed too, as `w_down_t = w_down.T` `(I, H)` row-major, the layout lesson 03's matmul
# reads fastest. (Whether the whole fused block then beats three separate kernels depends on the
# size: the lesson's measurements say where.)
#
# Mind the rounding: the packed weight holds `norm_weight * w` rounded once to 16 bits, and `x` goes
# into the dot as it is (Hugging Face rounds the normalized `x / rms(x)` to 16 bits, then multiplies by
# `norm_weight`): the same relative precision, one rounding fewer on the activations, and nothing here
# can overflow fp16, since `x` itself is a 16-bit input.
#
# `pack_mlp_weights` (given) packs with lesson 02's `copy_2d`, which addresses `out` with its strides:
# `w_gu[:, 0::2]` is an `(H, I)` view of the even columns. You write the kernel and
# `rmsnorm_mlp_packed(x, packed, eps, out)`; `rmsnorm_mlp` (checked) packs and calls it.

# %%
class PackedMLP(NamedTuple):
    """The block's weights in the layouts the fused kernels read, made once by pack_mlp_weights."""

    norm_weight: torch.Tensor  # (H,) the RMSNorm weight, already folded into w_gu (kept for reference)
    w_gu: torch.Tensor  # (H, 2I) row-major: w_gu[k, 2j] = norm_weight[k] * w_gate[j, k], 2j + 1: w_up
    w_down_t: torch.Tensor  # (I, H) w_down.T, row-major (any strides work: it goes to lesson 03's matmul)


@triton.jit
def scale_rows_kernel(w_ptr, s_ptr, n_rows, n_cols, stride_wm, stride_s,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """w[m, :] *= s[m] in place, for a contiguous-row (n_rows, n_cols) w; one (BLOCK_M, BLOCK_N) tile each."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    ptrs = w_ptr + offs_m[:, None].to(tl.int64) * stride_wm + offs_n[None, :]
    scale = tl.load(s_ptr + offs_m * stride_s, mask=offs_m < n_rows, other=0.0).to(tl.float32)
    w = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (w * scale[:, None]).to(w_ptr.dtype.element_ty), mask=mask)  # one rounding


def pack_mlp_weights(norm_weight: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                     w_down: torch.Tensor) -> PackedMLP:
    """Pack nn.Linear weights once: gate and up interleaved column by column with norm_weight folded
    in (row k of w_gu times norm_weight[k]), w_down transposed.

    Three copies with lesson 02's copy_2d and one scaling: 3 x H x I elements read and written (135 MB
    for the toy Llama in fp16), once per model, not once per call.
    """
    inter, hidden = w_gate.shape
    w_gu = torch.empty((hidden, 2 * inter), device=w_gate.device, dtype=w_gate.dtype)  # (H, 2I)
    copy_2d(w_gate.t(), w_gu[:, 0::2], BLOCK_M=64, BLOCK_N=64)  # (H, I) view: the even columns, stride 2
    copy_2d(w_up.t(), w_gu[:, 1::2], BLOCK_M=64, BLOCK_N=64)  # the odd columns
    # (x * nw) @ W.T == x @ (nw[:, None] * W.T): fold norm_weight into the rows of w_gu
    scale_rows_kernel[(triton.cdiv(hidden, 64), triton.cdiv(2 * inter, 64))](
        w_gu, norm_weight, hidden, 2 * inter, w_gu.stride(0), norm_weight.stride(0), BLOCK_M=64, BLOCK_N=64)
    w_down_t = torch.empty((inter, hidden), device=w_down.device, dtype=w_down.dtype)  # (I, H)
    copy_2d(w_down.t(), w_down_t, BLOCK_M=64, BLOCK_N=64)
    return PackedMLP(norm_weight, w_gu, w_down_t)


STATS_PREPASS_ROWS = 64  # above this many rows, 1 / rms(x) comes from row_rstd, before the gate/up kernel


@triton.jit
def row_rstd_kernel(x_ptr, rstd_ptr, n_rows, n_cols, stride_xm, stride_xn, eps,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """rstd[i] = 1 / sqrt(mean(x[i, :]**2) + eps) in fp32 for BLOCK_M rows, BLOCK_N columns per step."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    cols = tl.arange(0, BLOCK_N)
    # 64-bit offsets: rows * stride, or cols * stride of a transposed x, can pass 2^31 elements
    ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols.to(tl.int64)[None, :] * stride_xn
    sum_sq = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # one running sum per column slot
    for c0 in range(0, n_cols, BLOCK_N):
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols - c0)
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        sum_sq += x * x
        ptrs += BLOCK_N * stride_xn
    tl.store(rstd_ptr + rows, tl.rsqrt(tl.sum(sum_sq, axis=1) / n_cols + eps), mask=rows < n_rows)


def row_rstd(x: torch.Tensor, eps: float, rstd: torch.Tensor) -> None:
    """rstd (rows,) fp32 = 1 / rms of each row of x (rows, hidden): reads x once, writes 4 bytes a row."""
    n_rows, n_cols = x.shape
    block_n = min(triton.next_power_of_2(n_cols), 1024)
    block_m = 64 if current().interpret else 4  # the interpreter runs programs one by one: few, large ones
    row_rstd_kernel[(triton.cdiv(n_rows, block_m),)](x, rstd, n_rows, n_cols, x.stride(0), x.stride(1), eps,
                                                     BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4)


@triton.jit
def rmsnorm_gate_up_silu_kernel(x_ptr, w_ptr, rstd_ptr, h_ptr, M, N, K, eps,
                                stride_xm, stride_xk, stride_wk, stride_wn, stride_hm, stride_hn,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                GROUP_M: tl.constexpr, STATS_PREPASS: tl.constexpr):
    # BEGIN SOLUTION
    # Grouped order (lesson 03) over the (BLOCK_M, BLOCK_N) tiles of h (M, N); the weight tile is
    # 2 * BLOCK_N columns of w_gu (K, 2N): gate, up, gate, up, ...
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) rows of x and h
    offs_w = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)  # (2 * BLOCK_N,) columns of w_gu
    offs_k = tl.arange(0, BLOCK_K)
    # Past the edges, load valid rows and columns again (% M, % 2N: the start is even, so a gate column
    # stays a gate column) instead of masking; the store below drops them.
    rows_in = (offs_m % M).to(tl.int64)  # rows * stride can pass 2^31 on big activations
    x_ptrs = x_ptr + rows_in[:, None] * stride_xm + offs_k[None, :] * stride_xk  # (BLOCK_M, BLOCK_K)
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + (offs_w % (2 * N))[None, :] * stride_wn  # (BLOCK_K, 2 * BLOCK_N)
    acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)  # x @ w_gu tile, gate and up interleaved
    # The K loop is a plain matmul (norm_weight is folded into w_gu): per step, load
    # (BLOCK_M + 2 * BLOCK_N) * BLOCK_K elements, do 4 * BLOCK_M * BLOCK_N * BLOCK_K FLOPs.
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k + k0 < K  # the last K block is partial when K is no multiple of BLOCK_K
        x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K), straight to the dot
        w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)  # (BLOCK_K, 2 * BLOCK_N)
        acc = tl.dot(x, w, acc)  # ONE dot for gate and up: a cuBLAS-sized tile
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    # Epilogue, first the statistics, so that the K loop above stays a plain matmul.
    if STATS_PREPASS:  # many rows: 1 / rms(x) of every row was computed once, by row_rstd
        rstd = tl.load(rstd_ptr + rows_in)  # (BLOCK_M,) fp32
    else:  # few rows: a second pass over the same BLOCK_M rows of x (from L2, no tensor-core work)
        x_ptrs = x_ptr + rows_in[:, None] * stride_xm + offs_k[None, :] * stride_xk
        sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptrs, mask=(offs_k + k0 < K)[None, :], other=0.0).to(tl.float32)
            sum_sq += tl.sum(x * x, axis=1)  # fp32: the statistic never sees fp16's range
            x_ptrs += BLOCK_K * stride_xk
        rstd = tl.rsqrt(sum_sq / K + eps)  # (BLOCK_M,) 1 / rms(x), eps inside the square root
    # Column 2j of the tile is gate j, column 2j + 1 is up j: (BLOCK_M, BLOCK_N, 2), split the last axis.
    g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))  # each (BLOCK_M, BLOCK_N)
    g = g * rstd[:, None]  # = rmsnorm(x) @ w_gate.T: the row scale goes in BEFORE the silu
    u = u * rstd[:, None]
    h = g * tl.sigmoid(g) * u  # silu(gate) * up, in fp32, in registers
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) columns of h
    tl.store(h_ptr + offs_m[:, None].to(tl.int64) * stride_hm + offs_n[None, :] * stride_hn,
             h.to(h_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
    # END SOLUTION


@triton.jit
def down_split_k_kernel(h_ptr, w_ptr, out_ptr, M, N, K, k_chunk, stride_hm, stride_hk, stride_wk, stride_wn,
                        stride_om, stride_on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """out += h[:, chunk] @ w[chunk, :] for one (BLOCK_M, BLOCK_N) tile and one chunk of K (split-K).

    Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), n_chunks); out starts at zero and every chunk adds its
    fp32 partial sums with an atomic add (in out's dtype), so the order of the additions varies from run
    to run: the result can differ in the last bits between two runs.
    """
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    offs_m = (tl.program_id(0) // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_n = (tl.program_id(0) % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    k_start = tl.program_id(1) * k_chunk
    k_end = tl.minimum(k_start + k_chunk, K)
    offs_k = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + (offs_m % M)[:, None] * stride_hm + (k_start + offs_k)[None, :] * stride_hk
    w_ptrs = w_ptr + (k_start + offs_k)[:, None] * stride_wk + (offs_n % N)[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):  # read BLOCK_N x k_chunk weights, once in the whole grid
        k_ok = offs_k < k_end - k0
        a = tl.load(h_ptrs, mask=k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        b = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)  # (BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc)
        h_ptrs += BLOCK_K * stride_hk
        w_ptrs += BLOCK_K * stride_wk
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.atomic_add(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
                  acc.to(out_ptr.dtype.element_ty), mask=mask, sem="relaxed")


SPLIT_K_ROWS = 16  # up to this many rows the down projection splits K (skinny: few output tiles)


def down_split_k(h: torch.Tensor, w: torch.Tensor, out: torch.Tensor, config: triton.Config) -> None:
    """out = h @ w with K split in chunks (config.kwargs SPLIT_K of them) whose partial sums add up in out.

    h (M, K), w (K, N) any strides (the down projection: (rows, intermediate) @ (intermediate, hidden)).
    At M = 16, hidden 1024 there are only 1024 / BLOCK_N output tiles, far fewer than the GPU has SMs:
    splitting K gives every SM its share of the weight stream.
    """
    M, K = h.shape
    N = w.shape[1]
    kw = config.kwargs
    k_chunk = triton.cdiv(triton.cdiv(K, kw["BLOCK_K"]), kw["SPLIT_K"]) * kw["BLOCK_K"]  # whole K blocks
    out.zero_()  # the chunks add into it
    grid = (triton.cdiv(M, kw["BLOCK_M"]) * triton.cdiv(N, kw["BLOCK_N"]), triton.cdiv(K, k_chunk))
    down_split_k_kernel[grid](h, w, out, M, N, K, k_chunk, h.stride(0), h.stride(1), w.stride(0), w.stride(1),
                              out.stride(0), out.stride(1), BLOCK_M=kw["BLOCK_M"], BLOCK_N=kw["BLOCK_N"],
                              BLOCK_K=kw["BLOCK_K"], num_warps=config.num_warps, num_stages=config.num_stages)


def down_tile(M: int, element_size: int = 2, device: torch.device | None = None) -> triton.Config | None:
    """The down projection's tile: split-K for a decode step, lesson 03's tiles otherwise.

    With SPLIT_K in its kwargs the config is for down_split_k; None lets lesson 03's autotuner choose.
    device: the GPU it runs on, for fewer stages where its shared memory cannot hold them (as mlp_config).
    """
    if current().interpret:
        return triton.Config(dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=1), num_warps=4, num_stages=1)
    if M <= SPLIT_K_ROWS:  # (16, 11008) @ (11008, 1024): 16 column tiles x 8 chunks of K = 128 programs
        tile, stages = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256 // element_size, SPLIT_K=8), 4
    elif M <= 64:  # 16-wide column tiles give 64 programs streaming w_down.T
        tile, stages = dict(BLOCK_M=64, BLOCK_N=16, BLOCK_K=512 // element_size, GROUP_M=1), 4
    else:
        return None
    if device is not None:
        # A stage holds a (BLOCK_M, BLOCK_K) tile of h and a (BLOCK_K, BLOCK_N) one of w_down.T: (64 + 16)
        # x 512 B = 40 KiB for up to 64 rows, 4 stages on an H100 or an A100, 2 on an L4 (99 KiB).
        stage = (tile["BLOCK_M"] + tile["BLOCK_N"]) * tile["BLOCK_K"] * element_size
        stages = max(1, stages_that_fit(stages, stage, device))
    return triton.Config(tile, num_warps=4, num_stages=stages)


def down_proj(h: torch.Tensor, w_down_t: torch.Tensor, out: torch.Tensor, down: triton.Config | None) -> None:
    """out = h @ w_down_t: split-K when the config asks for it, else lesson 03's matmul."""
    if down is not None and "SPLIT_K" in down.kwargs:
        down_split_k(h, w_down_t, out, down)
    else:
        matmul(h, w_down_t, out, config=down)


def rmsnorm_mlp_packed(x: torch.Tensor, packed: PackedMLP, eps: float, out: torch.Tensor,
                       config: dict | None = None, down: triton.Config | None = None,
                       stats_prepass: bool | None = None) -> None:
    """out = down(silu(gate(n)) * up(n)), n = rmsnorm(x), from weights packed by pack_mlp_weights.

    x and out (rows, hidden), x with any strides. config: tiles of the fused gate/up kernel (default
    mlp_config; BLOCK_N counts columns of h, the weight tile is 2 * BLOCK_N wide); down: the down
    projection's config (default down_tile), for down_proj. stats_prepass: 1 / rms(x) from row_rstd
    before the kernel (default: above STATS_PREPASS_ROWS rows) instead of in the kernel's epilogue.
    """
    # BEGIN SOLUTION
    M, K = x.shape
    N = packed.w_gu.shape[1] // 2  # intermediate
    cfg = config or mlp_config(M, x.element_size(), x.device)
    prepass = M > STATS_PREPASS_ROWS if stats_prepass is None else stats_prepass
    h = torch.empty((M, N), device=x.device, dtype=x.dtype)  # (rows, intermediate): the only intermediate
    rstd = h  # a placeholder: the kernel reads rstd_ptr only with the pre-pass
    if prepass:
        rstd = torch.empty(M, device=x.device, dtype=torch.float32)  # (rows,) 1 / rms(x)
        row_rstd(x, eps, rstd)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"]),)  # one program per tile of h
    rmsnorm_gate_up_silu_kernel[grid](
        x, packed.w_gu, rstd, h, M, N, K, eps, x.stride(0), x.stride(1),
        packed.w_gu.stride(0), packed.w_gu.stride(1), h.stride(0), h.stride(1),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
        STATS_PREPASS=prepass, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    # (rows, intermediate) @ (intermediate, hidden) on the row-major w_down.T
    down_proj(h, packed.w_down_t, out, down or down_tile(M, x.element_size(), x.device))
    # END SOLUTION


def rmsnorm_mlp(x: torch.Tensor, norm_weight: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                w_down: torch.Tensor, eps: float, out: torch.Tensor, config: dict | None = None,
                down: triton.Config | None = None) -> None:
    """out = down(silu(gate(n)) * up(n)), n = rmsnorm(x); x and out (rows, hidden), weights nn.Linear layout.

    x is 2-D: pass a (batch, seq, hidden) activation as x.view(-1, hidden) (FusedRMSNormMLP does).
    Packs the weights on EVERY call (three copies: 3 x H x I elements read and written, 135 MB of
    traffic for the toy Llama in fp16, twice what the decode-sized block itself reads): right for a
    check, wrong for a model, which packs once (FusedRMSNormMLP) and calls rmsnorm_mlp_packed.
    """
    H, I = x.shape[1], w_gate.shape[0]  # hidden, intermediate
    expect_shapes("rmsnorm_mlp", norm_weight=(norm_weight, (H,)), w_gate=(w_gate, (I, H)),
                  w_up=(w_up, (I, H)), w_down=(w_down, (H, I)), out=(out, x.shape))
    rmsnorm_mlp_packed(x, pack_mlp_weights(norm_weight, w_gate, w_up, w_down), eps, out, config, down)


# %% [check] 06.rmsnorm_mlp

# %% [markdown]
# ## Into the Hugging Face model
#
# A Llama decoder layer ends with `residual + mlp(post_attention_layernorm(h))`. Replace the norm by
# an identity and the MLP by a module that packs the same weights once, when it is built, and runs
# `rmsnorm_mlp_packed` in its forward: the model computes the same logits with two Triton kernels (and
# a fill of `out` at decode sizes, or the pre-pass at many rows) where it launched 13. Packing once is
# what inference engines do: the weights do not change between calls, so their layout is chosen for the
# kernels that read them (this module is for inference: it keeps no gradient path to the packed copies,
# and a later change to the layer's weights would not reach them).

# %%
class FusedRMSNormMLP(nn.Module):
    """mlp(norm(x)) of a Llama layer by `rmsnorm_mlp_packed`, on weights packed once in __init__."""

    def __init__(self, norm: nn.Module, mlp: nn.Module):
        super().__init__()
        self.norm_weight = norm.weight  # (hidden,) shared with the norm
        self.eps = norm.variance_epsilon
        packed = pack_mlp_weights(norm.weight, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
        # Buffers, so that .to(device) moves them; not saved in state_dict (they derive from the weights).
        self.register_buffer("w_gu", packed.w_gu, persistent=False)  # (hidden, 2 * intermediate)
        self.register_buffer("w_down_t", packed.w_down_t, persistent=False)  # (intermediate, hidden)

    def packed(self) -> PackedMLP:
        return PackedMLP(self.norm_weight, self.w_gu, self.w_down_t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., hidden)
        rows = x.reshape(-1, x.shape[-1])  # (rows, hidden): a view of a contiguous activation
        out = torch.empty_like(rows)
        rmsnorm_mlp_packed(rows, self.packed(), self.eps, out)
        return out.view(x.shape)


def swap_in_fused_mlp(model: nn.Module, layer: int = 0) -> nn.Module:
    """Replace post_attention_layernorm + mlp of one decoder layer by FusedRMSNormMLP, in place."""
    block = model.model.layers[layer]
    block.mlp = FusedRMSNormMLP(block.post_attention_layernorm, block.mlp)
    block.post_attention_layernorm = nn.Identity()
    return model


# %% [markdown]
# Your kernels inside the small toy Llama (runs once the checks above pass):

# %%
if __name__ == "__main__":
    from course_utils.llama import toy_config, toy_llama

    reference = toy_llama(small=True, device=current().device)
    fused = swap_in_fused_mlp(toy_llama(small=True, device=current().device))
    vocab = toy_config(small=True).vocab_size
    ids = torch.randint(vocab, (2, 16), generator=torch.Generator().manual_seed(0)).to(current().device)
    with torch.no_grad():
        diff = (fused(ids, use_cache=False).logits - reference(ids, use_cache=False).logits).abs().max()
    print(f"logits of the toy Llama with your fused block: max |diff| = {diff:.2e}")

# %% [progress] 06
