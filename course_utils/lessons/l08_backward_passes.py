# %% [markdown]
# # Lesson 08 exercises: backward passes, and the toy Llama trained with your kernels
#
# Every kernel so far ran forward only. Training needs, for each operation `y = f(x)`, the
# **backward**: given `dy = dL/dy`, compute `dx = dL/dx` (and the gradients of the weights). Five
# exercises, each checked on fresh random inputs against float64 autograd:
#
# - `rmsnorm_backward`: dx, and dw summed over **all** rows (a reduction across programs);
# - `silu_mul_backward`: SwiGLU's backward, recomputing the sigmoid from the saved `g`;
# - `cross_entropy`: loss and gradient of the logits in one kernel, any vocabulary size, with
#   ignored targets (`-100`);
# - `rmsnorm_train`: a differentiable RMSNorm, a `torch.autograd.Function` on your two kernels;
# - `attention_backward` (bonus): FlashAttention-2's backward from the saved log-sum-exp.
#
# Destination passing as before: the host function receives its inputs and the output buffers,
# which the checker poisoned; write every element of them, and nothing else. Gradients are computed
# in fp32 and rounded once when stored.

# %% [setup]

# %%
from course_utils import check, current, progress  # noqa: F401
from course_utils.shapes import expect_contiguous, expect_shapes, expect_unit_stride  # noqa: E402
import math  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import nn  # noqa: E402

from course_utils.lessons.l03_matmul import sm_count  # noqa: E402
from course_utils.lessons.l04_fusion import silu_mul  # noqa: E402
from course_utils.lessons.l05_online_softmax import max_shared_memory  # noqa: E402

# %% [markdown]
# ## 08.rmsnorm_backward
#
# `rmsnorm_backward(dy, x, weight, rstd, dx, dw)`.
#
# The forward, per row: `rstd = 1 / sqrt(mean(x**2) + eps)`, `xhat = x * rstd`, `y = xhat * w`.
# Its backward ([lesson section](../notebooks/08_backward_passes.ipynb#RMSNorm-backward,-step-by-step)):
#
# ```
# dx = rstd * (dy * w - xhat * mean(dy * w * xhat))      per row: one more row reduction
# dw = sum over rows of dy * xhat                        (hidden,): a reduction ACROSS rows
# ```
#
# `rstd` (rows,) fp32 comes from the forward (`rmsnorm_forward` below saves it). The row part is lesson
# 06's kernel again: a program loads whole rows. `dw` is the new part: every row contributes to every
# element of `dw`, and the rows are spread over many programs. Two stages: each of `P` programs walks
# its share of the rows and keeps a partial `dw` (hidden,) in fp32 registers, stores it as row `p` of a
# `(P, hidden)` fp32 scratch tensor, and a second kernel (`sum_rows_kernel`, given) adds the `P` rows.
# Deterministic, and the scratch is small (`P` ~ the number of SMs). `dw` is fp32 (hidden,).
# Rows of `dy`, `x` and `dx` may have any row stride, each its own (`x.stride(0)`, `dx.stride(0)`, ...);
# columns are contiguous.

# %%
@triton.jit
def rmsnorm_forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_rows, n_cols, stride_xm, stride_ym, eps,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Lesson 06's RMSNorm forward plus one store: the (rows,) fp32 rstd a backward needs."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,) a whole row
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    rows = offs_m.to(tl.int64)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)  # (BLOCK_M,) fp32
    w = tl.load(w_ptr + offs_n, mask=offs_n < n_cols, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows[:, None] * stride_ym + offs_n[None, :],
             (x * rstd[:, None] * w[None, :]).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + offs_m, rstd, mask=offs_m < n_rows)  # 4 bytes a row: what the backward keeps


def row_config(n_rows: int, n_cols: int) -> dict:
    """Rows per tile and warps for the row kernels: about 4096 elements a tile, whole rows only."""
    block_n = triton.next_power_of_2(n_cols)
    block_m = max(1, min(4096 // block_n, triton.next_power_of_2(n_rows)))
    elements = block_m * block_n
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4 if elements <= 2048 else 8 if elements <= 8192 else 16)


def rmsnorm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float, y: torch.Tensor, rstd: torch.Tensor) -> None:
    """y = x * rstd * weight and rstd = 1 / sqrt(mean(x**2) + eps); x, y (rows, hidden), rstd (rows,) fp32."""
    expect_shapes("rmsnorm_forward", weight=(weight, x.shape[1:]), y=(y, x.shape), rstd=(rstd, x.shape[:1]))
    expect_unit_stride("rmsnorm_forward", x=x, weight=weight, y=y)
    n_rows, n_cols = x.shape
    cfg = row_config(n_rows, n_cols)
    grid = (triton.cdiv(n_rows, cfg["BLOCK_M"]),)
    rmsnorm_forward_kernel[grid](x, weight, y, rstd, n_rows, n_cols, x.stride(0), y.stride(0), eps,
                                 BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"])


@triton.jit
def sum_rows_kernel(part_ptr, out_ptr, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n] = sum over p of part[p, n]: stage two of a cross-program reduction, fixed order."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) columns of this program
    offs_p = tl.arange(0, BLOCK_P)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        mask = ((p0 + offs_p)[:, None] < n_parts) & (offs_n[None, :] < n_cols)
        part = tl.load(part_ptr + (p0 + offs_p)[:, None] * n_cols + offs_n[None, :], mask=mask, other=0.0)
        acc += tl.sum(part, axis=0)
    tl.store(out_ptr + offs_n, acc, mask=offs_n < n_cols)


def sum_rows(part: torch.Tensor, out: torch.Tensor, block_n: int = 32, block_p: int = 64) -> None:
    """out (n,) = part (P, n) summed over its rows, part contiguous fp32. block_n, block_p: columns per
    program and rows per step (the course's bench times wider strips too)."""
    n_parts, n_cols = part.shape
    # One strip of 32 columns per program (128 bytes of each row: one cache line), 64 rows a step: hidden
    # 4096 makes 128 programs, about one per SM. The read is small (P x hidden x 4 bytes: 2 MB for
    # 132 x 4096) and so bound by latency: the more SMs have loads in flight, the sooner it is done.
    block_n = min(triton.next_power_of_2(n_cols), block_n)
    sum_rows_kernel[(triton.cdiv(n_cols, block_n),)](part, out, n_parts, n_cols, BLOCK_P=block_p,
                                                     BLOCK_N=block_n)


def backward_programs(n_rows: int, device: torch.device) -> int:
    """How many programs share the rows of a backward: one per SM of the tensors' GPU (the interpreter:
    a few)."""
    if current().interpret:
        return max(1, min(n_rows, 3))
    return max(1, min(n_rows, sm_count(device)))  # at least one: no rows still writes dw = 0


def rmsnorm_backward_ref(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor):
    """(dx, dw) of y = x * rstd * weight, in fp32, written out formula by formula."""
    dy, x, w = dy.float(), x.float(), weight.float()
    xhat = x * rstd[:, None]  # (rows, hidden)
    wdy = dy * w  # (rows, hidden): the gradient reaching xhat
    dx = rstd[:, None] * (wdy - xhat * (wdy * xhat).mean(-1, keepdim=True))
    return dx, (dy * xhat).sum(0)  # dw: a sum over every row


@triton.jit
def rmsnorm_backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_part_ptr, n_rows, n_cols,
                            rows_per_program, stride_dym, stride_xm, stride_dxm,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BEGIN SOLUTION
    pid = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,) a whole row
    col_ok = offs_n < n_cols
    w = tl.load(w_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)  # read once per program
    dw_acc = tl.zeros((BLOCK_N,), tl.float32)  # this program's share of dw, in registers
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for m0 in range(row_start, row_end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        row_ok = offs_m < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows = offs_m.to(tl.int64)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dym + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + offs_m, mask=row_ok, other=0.0)  # (BLOCK_M,) fp32 from the forward
        xhat = x * rstd[:, None]  # (BLOCK_M, BLOCK_N) recomputed: never saved
        wdy = dy * w[None, :]
        c = tl.sum(wdy * xhat, axis=1) / n_cols  # (BLOCK_M,) mean(dy * w * xhat): the mean's gradient
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        tl.store(dx_ptr + rows[:, None] * stride_dxm + offs_n[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += tl.sum(dy * xhat, axis=0)  # masked rows are 0: they add nothing
    tl.store(dw_part_ptr + pid * n_cols + offs_n, dw_acc, mask=col_ok)  # row pid of the (P, hidden) scratch
    # END SOLUTION


def rmsnorm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                     dx: torch.Tensor, dw: torch.Tensor, programs: int | None = None,
                     block_m: int | None = None, num_warps: int | None = None) -> None:
    """dx (rows, hidden) and dw (hidden,) fp32 of y = x * rstd * weight, given dy; rstd (rows,) fp32.
    programs, block_m, num_warps: optional launch settings that the course's bench sweeps (the check
    never passes them: your version may leave them out)."""
    expect_shapes("rmsnorm_backward", dy=(dy, x.shape), weight=(weight, x.shape[1:]),
                  rstd=(rstd, x.shape[:1]), dx=(dx, x.shape), dw=(dw, x.shape[1:]))
    expect_unit_stride("rmsnorm_backward", dy=dy, x=x, weight=weight, dx=dx)
    expect_contiguous("rmsnorm_backward", rstd=rstd, dw=dw)
    # BEGIN SOLUTION
    n_rows, n_cols = x.shape
    if n_cols == 0:  # dx and dw have no elements (no rows with a hidden size is dw = 0, written below)
        return
    block_n = triton.next_power_of_2(n_cols)
    # Up to 4 rows per step, ~16K elements (4 rows of 4096), 8 warps: more loads in flight per program
    # than one row a step (the bench sweeps rows per step, warps and programs per SM around this).
    block_m = block_m or max(1, min(4, 16384 // block_n, triton.next_power_of_2(n_rows)))
    num_warps = num_warps or (8 if block_m * block_n <= 16384 else 16)
    P = programs or backward_programs(n_rows, x.device)
    rows_per_program = triton.cdiv(n_rows, P)
    part = torch.empty((P, n_cols), device=x.device, dtype=torch.float32)  # stage one's partial sums
    rmsnorm_backward_kernel[(P,)](dy, x, weight, rstd, dx, part, n_rows, n_cols, rows_per_program,
                                  dy.stride(0), x.stride(0), dx.stride(0), BLOCK_M=block_m, BLOCK_N=block_n,
                                  num_warps=num_warps)
    sum_rows(part, dw)  # stage two: P partial rows -> dw, in a fixed order (deterministic)
    # END SOLUTION


# %% [check] 08.rmsnorm_backward

# %% [markdown]
# ## 08.silu_mul_backward
#
# `silu_mul_backward(dh, g, u, dg, du)`.
#
# SwiGLU's `h = silu(g) * u` with `silu(g) = g * s`, `s = sigmoid(g)`. The forward saved `g` and `u`
# (not `s`, not `silu(g)`); the backward recomputes `s` (one exp, free in a memory-bound kernel) and
# writes ([lesson section](../notebooks/08_backward_passes.ipynb#SwiGLU-backward:-recompute-the-sigmoid)):
#
# ```
# du = dh * silu(g)
# dg = dh * u * silu'(g)        silu'(g) = d/dg (g * s): the product rule, with sigmoid' = s * (1 - s)
# ```
#
# Elementwise, any shape (contiguous), fp32 arithmetic, each output rounded once to its dtype.
# Reads 3 tensors and writes 2: the floor is 5 x n x bytes / bandwidth.

# %%
def silu_mul_backward_ref(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor):
    """(dg, du) of h = silu(g) * u, in fp32."""
    dh, g, u = dh.float(), g.float(), u.float()
    s = torch.sigmoid(g)
    return dh * u * s * (1 + g * (1 - s)), dh * g * s


@triton.jit
def silu_mul_backward_kernel(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n_elements, BLOCK: tl.constexpr):
    # BEGIN SOLUTION
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    mask = offs < n_elements
    dh = tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)  # recomputed: the forward kept only g and u
    silu = g * s
    dsilu = s * (1.0 + g * (1.0 - s))  # s + g * s * (1 - s)
    tl.store(du_ptr + offs, (dh * silu).to(du_ptr.dtype.element_ty), mask=mask)
    tl.store(dg_ptr + offs, (dh * u * dsilu).to(dg_ptr.dtype.element_ty), mask=mask)
    # END SOLUTION


def silu_mul_backward(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, dg: torch.Tensor, du: torch.Tensor,
                      BLOCK: int = 2048, num_warps: int = 8) -> None:
    """dg and du of h = silu(g) * u given dh; all contiguous, one shape. dg, du may be g, u (in place)."""
    expect_shapes("silu_mul_backward", g=(g, dh.shape), u=(u, dh.shape), dg=(dg, dh.shape), du=(du, dh.shape))
    expect_contiguous("silu_mul_backward", dh=dh, g=g, u=u, dg=dg, du=du)
    # BEGIN SOLUTION
    n = g.numel()
    silu_mul_backward_kernel[(triton.cdiv(n, BLOCK),)](dh, g, u, dg, du, n, BLOCK=BLOCK, num_warps=num_warps)
    # END SOLUTION


# %% [check] 08.silu_mul_backward

# %% [markdown]
# ## 08.cross_entropy
#
# `cross_entropy(logits, targets, loss, dlogits)`.
#
# For each row `i` of `logits` (rows, vocab) with target `t = targets[i]`
# ([lesson section](../notebooks/08_backward_passes.ipynb#Cross-entropy:-loss-and-gradient-in-one-kernel)):
#
# ```
# lse_i      = log(sum_j exp(logits[i, j]))              natural log, computed stably
# loss[i]    = lse_i - logits[i, t]                       0 where t == -100 (ignored)
# dlogits[i] = (softmax(logits[i]) - onehot(t)) / n       n = number of rows whose target is not -100
# ```
#
# `dlogits` is the gradient of the **mean** loss over the non-ignored rows (PyTorch's
# `F.cross_entropy(..., ignore_index=-100)`), 0 on ignored rows. **If every target is ignored**, `n` is 0:
# then the loss and dlogits are all 0 (PyTorch's mean would be 0/0 = NaN; a training step that sees a
# batch of padding should change nothing).
#
# One program per row, lesson 05's online statistics: a first pass over the row in blocks keeps the
# running max `m` and sum `d` (rescaled when the max grows), so `lse = m + log(d)` for any vocab
# (32000, 50257: no power of 2, far beyond one block) and logits near 100 (`exp(100)` = 2.7e43 overflows
# fp32, whose largest value is 3.4e38, let alone fp16). A second pass writes `dlogits`. Counting `n` needs every row's target:
# `count_targets` (given) does it in a tiny first kernel. `dlogits` may be `logits` itself (in place:
# each element is read before it is written): that is how the training step uses it. Rows may have any
# row stride (`logits.stride(0)`); the elements of a row are adjacent.

# %%
@triton.jit
def count_targets_kernel(targets_ptr, count_ptr, n_rows, ignore_index, BLOCK: tl.constexpr):
    """count[0] = number of targets != ignore_index (fp32), one program, blocks of BLOCK rows."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for r0 in range(0, n_rows, BLOCK):
        t = tl.load(targets_ptr + r0 + offs, mask=r0 + offs < n_rows, other=ignore_index)
        acc += (t != ignore_index).to(tl.float32)
    tl.store(count_ptr, tl.sum(acc, axis=0))


def count_targets(targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """A 1-element fp32 tensor on the device: how many targets are not ignore_index (no host sync)."""
    count = torch.empty(1, device=targets.device, dtype=torch.float32)
    count_targets_kernel[(1,)](targets, count, targets.numel(), ignore_index, BLOCK=1024)
    return count


def cross_entropy_ref(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100):
    """(loss (rows,), dlogits) in fp32: per-row loss, gradient of the mean over non-ignored rows."""
    x = logits.float()
    keep = targets != ignore_index
    lse = torch.logsumexp(x, dim=-1)  # (rows,)
    safe = torch.where(keep, targets, 0)
    loss = torch.where(keep, lse - x.gather(1, safe[:, None])[:, 0], 0.0)
    onehot = torch.nn.functional.one_hot(safe, x.shape[1]).to(x.dtype)
    n = keep.sum().clamp_min(1)
    dlogits = (torch.softmax(x, dim=-1) - onehot) * keep[:, None] / n
    return loss, dlogits


def ce_config(n_cols: int) -> dict:
    """Vocabulary columns per block and warps of cross_entropy_kernel, by vocabulary size.

    A block is the running (m, d) of BLOCK_N lanes, held in registers for the whole row: 4096 columns
    (8 KiB of bf16 logits per step) over 8 warps is 16 fp32 lanes of each of m, d and x per thread. A
    row shorter than 4096 is one block.
    """
    if current().interpret:
        return dict(BLOCK_N=512, num_warps=4)
    block_n = min(4096, triton.next_power_of_2(n_cols))
    return dict(BLOCK_N=block_n, num_warps=8 if block_n >= 2048 else 4)


@triton.jit
def cross_entropy_kernel(logits_ptr, targets_ptr, count_ptr, loss_ptr, dlogits_ptr, n_cols,
                         stride_lm, stride_dm, ignore_index, BLOCK_N: tl.constexpr):
    # BEGIN SOLUTION
    row = tl.program_id(0).to(tl.int64)  # one program per row; 64-bit: rows x vocab passes 2^31
    logits_row = logits_ptr + row * stride_lm
    dlogits_row = dlogits_ptr + row * stride_dm
    offs_n = tl.arange(0, BLOCK_N)
    target = tl.load(targets_ptr + row)
    if target == ignore_index:  # ignored row: loss 0, gradient 0
        for n0 in range(0, n_cols, BLOCK_N):
            zero = tl.zeros((BLOCK_N,), tl.float32)
            tl.store(dlogits_row + n0 + offs_n, zero.to(dlogits_ptr.dtype.element_ty), mask=n0 + offs_n < n_cols)
        tl.store(loss_ptr + row, 0.0)
    else:
        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)  # running max of each lane (lesson 05)
        d = tl.zeros((BLOCK_N,), tl.float32)  # running sum of exp(x - m) of each lane
        for n0 in range(0, n_cols, BLOCK_N):  # pass 1: statistics
            x = tl.load(logits_row + n0 + offs_n, mask=n0 + offs_n < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # lanes that saw only padding
            d = d * tl.exp(m - m_ref) + tl.exp(x - m_ref)
            m = m_new
        m_row = tl.max(m, axis=0)  # merge the lanes
        lse = m_row + tl.log(tl.sum(d * tl.exp(m - m_row), axis=0))  # natural log
        x_t = tl.load(logits_row + target).to(tl.float32)
        tl.store(loss_ptr + row, lse - x_t)
        inv_n = 1.0 / tl.load(count_ptr)  # n >= 1 here: this row counts
        for n0 in range(0, n_cols, BLOCK_N):  # pass 2: softmax - onehot, scaled; in place is safe
            cols = n0 + offs_n
            x = tl.load(logits_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            p = tl.exp(x - lse)
            grad = tl.where(cols == target, p - 1.0, p) * inv_n
            tl.store(dlogits_row + cols, grad.to(dlogits_ptr.dtype.element_ty), mask=cols < n_cols)
    # END SOLUTION


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor, dlogits: torch.Tensor,
                  BLOCK_N: int | None = None, num_warps: int | None = None, count: torch.Tensor | None = None) -> None:
    """loss (rows,) fp32 per row and dlogits = d mean loss / d logits; targets int64, -100 ignored.
    `count`: count_targets(targets) when the caller has it already (the training step's mean needs it too)."""
    expect_shapes("cross_entropy", targets=(targets, logits.shape[:1]), loss=(loss, logits.shape[:1]),
                  dlogits=(dlogits, logits.shape))
    expect_unit_stride("cross_entropy", logits=logits, dlogits=dlogits)
    expect_contiguous("cross_entropy", targets=targets, loss=loss)
    # BEGIN SOLUTION
    n_rows, n_cols = logits.shape
    cfg = ce_config(n_cols)
    count = count_targets(targets) if count is None else count  # n: a device scalar, read by every program
    cross_entropy_kernel[(n_rows,)](logits, targets, count, loss, dlogits, n_cols, logits.stride(0),
                                    dlogits.stride(0), -100, BLOCK_N=BLOCK_N or cfg["BLOCK_N"],
                                    num_warps=num_warps or cfg["num_warps"])
    # END SOLUTION


# %% [check] 08.cross_entropy

# %% [markdown]
# ## 08.rmsnorm_train
#
# `rmsnorm_train(x, weight, eps) -> Tensor`.
#
# A differentiable RMSNorm: a `torch.autograd.Function` whose `forward` runs `rmsnorm_forward` (given
# above) and saves, with `ctx.save_for_backward`, what the backward needs: `x`, `weight` and `rstd`
# (rows,) fp32; **not** `xhat` or any other (rows, hidden) copy. Its `backward` gets `dy` and returns
# one gradient per forward input (`None` for `eps`), computed by your `rmsnorm_backward`; `dw` comes out
# fp32, return it in `weight`'s dtype. `x` may be (batch, seq, hidden): work on
# `x.reshape(-1, hidden).contiguous()` and give `y` and `dx` `x`'s shape (and `y` `x`'s dtype: the next
# layer takes it). The kernels read a row's elements as consecutive, so a transposed `x` (or a
# non-contiguous `dy`) must be made contiguous first (`.contiguous()` copies only when the layout is not
# contiguous already). A model runs every layer's forward before the first backward, and so does the
# check: each backward reads only what its own forward saved on `ctx` (no module globals), and each
# forward returns and saves tensors of its own. Return
# `apply`'s output itself (reshape inside `forward`, not after `apply`): the check reads what your forward
# saved from the output's `grad_fn`.
# ([lesson section](../notebooks/08_backward_passes.ipynb#torch.autograd.Function:-what-a-backward-may-keep))

# %%
class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # BEGIN SOLUTION
        rows = x.reshape(-1, x.shape[-1]).contiguous()  # (rows, hidden): x itself if contiguous, else a copy
        y = torch.empty_like(rows)
        rstd = torch.empty(rows.shape[0], device=x.device, dtype=torch.float32)
        rmsnorm_forward(rows, weight, eps, y, rstd)
        ctx.save_for_backward(x, weight, rstd)  # x and weight are the inputs themselves: no copy
        return y.view(x.shape)
        # END SOLUTION

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        # BEGIN SOLUTION
        x, weight, rstd = ctx.saved_tensors
        rows = x.reshape(-1, x.shape[-1]).contiguous()  # the forward's rows again (a copy for a transposed x)
        dy_rows = dy.reshape(rows.shape).contiguous()
        dx = torch.empty_like(rows)
        dw = torch.empty(rows.shape[1], device=x.device, dtype=torch.float32)
        rmsnorm_backward(dy_rows, rows, weight, rstd, dx, dw)
        return dx.view(x.shape), dw.to(weight.dtype), None
        # END SOLUTION


def rmsnorm_train(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm that autograd can differentiate: y = x / sqrt(mean(x**2, -1) + eps) * weight."""
    return RMSNormFunction.apply(x, weight, eps)


# %% [check] 08.rmsnorm_train

# %% [markdown]
# ## Autograd Functions for the training step (given)
#
# The same pattern for SwiGLU (lesson 04's `silu_mul` forward, your `silu_mul_backward`) and for the
# loss (your `cross_entropy`, computing the gradient already in the forward, in place of the logits; with
# the output layer, whose gradients then follow in the forward too). Then the toy Llama with its
# RMSNorms, its MLPs' SiLU * mul and its output layer and loss swapped for them.

# %%
class SiluMulFunction(torch.autograd.Function):
    """h = silu(g) * u; saves g and u, and (run eagerly) writes dg, du into their memory in the backward."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        g, u = g.contiguous(), u.contiguous()
        h = torch.empty_like(g)
        silu_mul(g, u, h)
        ctx.save_for_backward(g, u)
        # Traced by torch.compile, g and u become inputs of the compiled backward graph, and the compiler
        # copies a graph input before a kernel writes into it (2 x 180 MB at 8192 x 11008 bf16): new
        # buffers cost less there. Eagerly, the writes in place cost nothing. Decided here: the forward
        # is traced by Dynamo (is_compiling() is True), the backward later by AOTAutograd (it is not).
        ctx.in_place = not torch.compiler.is_compiling()
        return h

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        g, u = ctx.saved_tensors
        # Eagerly in place: g and u are dead after this (the matmuls that made them kept their inputs, not
        # their outputs), so their memory takes the gradients: no new (rows, intermediate) tensors.
        dg, du = (g, u) if ctx.in_place else (torch.empty_like(g), torch.empty_like(u))
        silu_mul_backward(dh.contiguous(), g, u, dg, du)
        return dg, du


@triton.jit
def scale_unless_one_kernel(x_ptr, scale_ptr, n_elements, BLOCK: tl.constexpr):
    """x *= scale[0] in place, unless scale[0] == 1: then each program reads 4 bytes and stops."""
    scale = tl.load(scale_ptr).to(tl.float32)  # dL/dloss, on the device: no host sync to look at it
    if scale != 1.0:
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n_elements, step):  # grid-stride loop
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n_elements
            x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
            tl.store(x_ptr + offs, (x * scale).to(x_ptr.dtype.element_ty), mask=mask)


def scale_unless_one(x: torch.Tensor, scale: torch.Tensor) -> None:
    """x (contiguous) *= scale (one element) in place; costs one launch and no traffic when scale is 1."""
    BLOCK = 4096
    grid = (max(1, min(triton.cdiv(x.numel(), BLOCK), 1024)),)  # a few programs per SM, looping
    scale_unless_one_kernel[grid](x, scale, x.numel(), BLOCK=BLOCK, num_warps=8)


def mean_loss_grad_in_place(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over non-ignored rows; `logits` are overwritten with its gradient."""
    loss = torch.empty(logits.shape[0], device=logits.device, dtype=torch.float32)
    count = count_targets(targets)  # n, once: the kernel divides the gradient by it, the mean the loss
    cross_entropy(logits, targets, loss, logits, count=count)  # dlogits in place: logits not needed again
    return loss.sum() / count.clamp_min(1)[0]


class CrossEntropyFunction(torch.autograd.Function):
    """Mean cross-entropy over non-ignored rows; the forward overwrites `logits` with their gradient."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        mean = mean_loss_grad_in_place(logits, targets)
        ctx.save_for_backward(logits)  # now dlogits
        return mean

    @staticmethod
    def backward(ctx, dloss: torch.Tensor):
        (dlogits,) = ctx.saved_tensors
        # dL/dloss is 1 when the loss itself is differentiated (training): the gradient is ready as it
        # is. Any other dL/dloss scales it in place: no second (rows, vocab) tensor either way.
        scale_unless_one(dlogits, dloss.reshape(1).float())
        return dlogits, None


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Mean cross-entropy of hidden @ weight.T; the whole gradient is computed in the forward.

    Once the loss kernel has written dlogits, the two matmuls of the output layer's backward can run at
    once: d hidden = dlogits @ weight, d weight = dlogits.T @ hidden. Then nothing needs the logits
    (tokens, vocab) any more, and the backward keeps only gradients of the size of hidden and weight.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = hidden @ weight.T  # (tokens, vocab) in the model's dtype: never upcast to fp32
        mean = mean_loss_grad_in_place(logits, targets)  # logits now hold dlogits
        dhidden = logits @ weight  # (tokens, hidden): 2 * tokens * vocab * hidden FLOPs, as in the backward
        dweight = logits.T @ hidden  # (vocab, hidden): the same FLOPs again
        ctx.save_for_backward(dhidden, dweight)  # bf16 (8192, 1024) + (32000, 1024): 16.8 + 65.5 MB
        return mean  # the logits (524 MB) are freed here, not after the backward

    @staticmethod
    def backward(ctx, dloss: torch.Tensor):
        dhidden, dweight = ctx.saved_tensors
        scale = dloss.reshape(1).float()
        scale_unless_one(dhidden, scale)  # under torch.compile: a copy of each first, 82 MB, not 524
        scale_unless_one(dweight, scale)
        return dhidden, dweight, None


class RMSNormTrain(nn.Module):
    """A drop-in for LlamaRMSNorm whose forward and backward are our kernels."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight  # the same Parameter: gradients land on the model's weight
        self.eps = norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm_train(x, self.weight, self.eps)


class SwiGLUTrain(nn.Module):
    """A drop-in for LlamaMLP: the three nn.Linear matmuls (cuBLAS) around our SiLU * mul."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(SiluMulFunction.apply(self.gate_proj(x), self.up_proj(x)))


def swap_in_training_kernels(model: nn.Module) -> nn.Module:
    """Every RMSNorm and MLP of a Hugging Face Llama replaced by ours, in place (same parameters)."""
    inner = model.model
    for block in inner.layers:
        block.input_layernorm = RMSNormTrain(block.input_layernorm)
        block.post_attention_layernorm = RMSNormTrain(block.post_attention_layernorm)
        block.mlp = SwiGLUTrain(block.mlp)
    inner.norm = RMSNormTrain(inner.norm)
    return model


def shifted_targets(labels: torch.Tensor) -> torch.Tensor:
    """Token t predicts token t + 1: the labels moved left by one, -100 after each sequence's end."""
    return torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100).reshape(-1)  # (B * T,)


def causal_lm_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss Hugging Face computes for model(ids, labels=labels), with our cross-entropy kernel."""
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # (B, T, H)
    return LinearCrossEntropyFunction.apply(hidden.view(-1, hidden.shape[-1]), model.lm_head.weight,
                                            shifted_targets(labels))


# %% [markdown]
# ## 08.attention_backward
#
# `attention_backward(q, k, v, o, lse, do, dq, dk, dv, causal)` (bonus).
#
# FlashAttention-2's backward ([lesson section](../notebooks/08_backward_passes.ipynb#Bonus:-FlashAttention-2-backward)).
# The forward kept `o` and `lse` (B, H, S) fp32, the natural-log log-sum-exp of each row of the
# scaled scores; from them any tile of probabilities is recomputed without the softmax's statistics:
#
# ```
# P    = exp(q k^T * scale - lse[:, None])          scale = 1 / sqrt(D); -inf where causal masks
# dv   = P^T do          dp = do v^T
# ds   = P * (dp - delta[:, None])                  delta = rowsum(do * o), one number per query
# dq   = ds k * scale    dk = ds^T q * scale
# ```
#
# `attention_delta` (given) computes `delta`. Then a kernel per tile of keys walks the queries and
# accumulates `dk` and `dv` in registers, and a kernel per tile of queries walks the keys and
# accumulates `dq` (no atomics). All (B, H, S, D), contiguous; D a power of 2 >= 16; S any length.
#
# The two kernels want different tiles (a program of the first holds `BLOCK_N` keys and steps through
# `BLOCK_M` queries at a time, a program of the second the other way round), so each has its own
# `@triton.autotune` over `attention_configs(...)`, given: launch them with
# `grid = lambda meta: (triton.cdiv(S, meta["BLOCK_N"]) * B * H,)` (and `meta["BLOCK_M"]` for dq), and
# pass everything but the block sizes. One axis, as in lesson 05's forward: the tile is `pid % tiles`,
# the (batch, head) slab `pid // tiles` (a grid's axis 1 holds only 65535 programs, lesson 02).
# `EVEN_S` (computed in the host function, given: `S % 128 == 0`, so no tile runs past the end) lets a
# kernel skip the masks of the sequence's end. `exp(x) = exp2(x * log2(e))`: fold `log2(e)` into the
# scale and into `lse` and use `tl.exp2`, one multiply fewer per score.
#
# With `causal`, only the tiles on the diagonal are partly masked; the solution walks those with the mask
# and every other tile without, as lesson 05's forward does, through the helpers `_attention_dkdv_tiles`
# and `_attention_dq_tiles` (their `MASKED` flag). Use them or not: one loop that masks every tile passes
# the check, only a little slower.

# %%
@triton.jit
def attention_delta_kernel(o_ptr, do_ptr, delta_ptr, n_rows, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta[r] = sum(o[r, :] * do[r, :]) over (B * H * S) rows of D: the softmax's backward term."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = offs_m[:, None] < n_rows
    ptrs = offs_m.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    o = tl.load(o_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + offs_m, tl.sum(o * do, axis=1), mask=offs_m < n_rows)


def attention_delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """delta (B, H, S) fp32 = rowsum(o * do); o, do contiguous (B, H, S, D)."""
    B, H, S, D = o.shape
    delta = torch.empty((B, H, S), device=o.device, dtype=torch.float32)
    attention_delta_kernel[(triton.cdiv(B * H * S, 64),)](o, do, delta, B * H * S, HEAD_DIM=D, BLOCK_M=64)
    return delta


def attention_backward_ref(q, k, v, do, causal: bool):
    """(dq, dk, dv) by autograd through the three-kernel attention, in fp32."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        S = q.shape[-2]
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    (torch.softmax(scores, dim=-1) @ v).backward(do.float())
    return q.grad, k.grad, v.grad


def attention_configs(kernel: str, small: bool = False) -> list[triton.Config]:
    """The autotuner's tiles: (BLOCK_M queries, BLOCK_N keys), warps, stages. `kernel` "dkdv" holds
    BLOCK_N keys (and their fp32 dk, dv) while it walks the queries; "dq" holds BLOCK_M queries.
    small: the tiles of a GPU whose shared memory holds none of the others (a T4; an L4 in fp32 at D 128)."""
    if current().interpret:  # uneven tiles, as most of a GPU's: a kernel that mixes up BLOCK_M and BLOCK_N fails
        bm, bn = {"dkdv": (16, 32), "dq": (32, 16)}[kernel]
        return [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn), num_warps=4, num_stages=1)]
    tiles = {"dkdv": [(64, 64, 4, 2), (32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3)],
             "dq": [(64, 64, 4, 2), (128, 32, 8, 3), (128, 64, 8, 2), (64, 32, 4, 3)]}[kernel]
    if small:
        tiles = {"dkdv": [(32, 32, 4, 2), (16, 32, 4, 2)], "dq": [(32, 32, 4, 2), (32, 16, 4, 2)]}[kernel]
    return [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn), num_warps=w, num_stages=st) for bm, bn, w, st in tiles]


def attention_shared_bytes(config: triton.Config, kernel: str, D: int, element_size: int) -> int:
    """Shared memory of a tile, estimated: the two (rows, D) tiles a program holds all along (k and v of its
    BLOCK_N keys in "dkdv", q and do of its BLOCK_M queries in "dq") and, per pipeline stage, the two its loop
    loads. "dkdv" 64 x 64, 2 stages, fp16 at D = 128: 2 x (64 + 2 x 64) x 128 x 2 B = 96 KiB."""
    held, walked = config.kwargs["BLOCK_N"], config.kwargs["BLOCK_M"]
    if kernel == "dq":
        held, walked = walked, held
    return 2 * (held + walked * config.num_stages) * D * element_size


SHORT_SEQUENCE = 1024  # below this: the first tile, no timing (tuning would cost more than it saves)


def select_attention_configs(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Autotune pruning: the tiles this GPU's shared memory holds (where it holds none, the first small tile
    that fits); short sequences take the first of them (64 x 64 on an H100) without timing anything."""
    args = {**named_args, **kwargs}
    if not current().interpret:
        kernel = "dkdv" if "dk_ptr" in args else "dq"
        q, limit = args["q_ptr"], max_shared_memory(args["q_ptr"].device)

        def fits(config):
            return attention_shared_bytes(config, kernel, args["HEAD_DIM"], q.element_size()) <= limit

        small = attention_configs(kernel, small=True)
        configs = [c for c in configs if fits(c)] or [next((c for c in small if fits(c)), small[-1])]
    return configs[:1] if args["S"] < SHORT_SEQUENCE else configs


@triton.jit
def _attention_dkdv_tiles(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, bh, offs_n, S, qk_scale, lo, hi,
                          MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Fold the query tiles [lo, hi) into (dk, dv) for one tile of keys (of batch * H + head `bh`);
    MASKED: the causal diagonal."""
    # BEGIN SOLUTION
    base = bh * S * HEAD_DIM
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) queries
        q_ok = offs_m < S
        qo_off = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptr + qo_off, mask=q_ok[:, None], other=0.0)  # (BLOCK_M, D)
        do = tl.load(do_ptr + qo_off, mask=q_ok[:, None], other=0.0)
        # lse = +inf past the end: P is 0 there, so those queries add nothing (keys past the end give
        # rows of dk, dv that are never stored): no mask on the tile for the sequence's end
        lse2 = tl.load(lse_ptr + bh * S + offs_m, mask=q_ok, other=float("inf")) * 1.4426950408889634
        delta = tl.load(delta_ptr + bh * S + offs_m, mask=q_ok, other=0.0)
        p_t = tl.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])  # (BLOCK_N, BLOCK_M) = P^T
        if MASKED:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)  # dv += P^T do
        dp_t = tl.dot(v, tl.trans(do))  # (BLOCK_N, BLOCK_M) = (do v^T)^T
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)  # dk += ds^T q
    # END SOLUTION
    return dk, dv


@triton.autotune(configs=attention_configs("dkdv"), key=["S", "HEAD_DIM", "CAUSAL"],
                 prune_configs_by={"early_config_prune": select_attention_configs})
@triton.jit
def attention_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, S, scale,
                          CAUSAL: tl.constexpr, EVEN_S: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BEGIN SOLUTION
    n_tiles = tl.cdiv(S, BLOCK_N)
    start_n = tl.program_id(0) % n_tiles * BLOCK_N
    bh = (tl.program_id(0) // n_tiles).to(tl.int64)  # batch * H + head: every (S, D) slab is contiguous
    base = bh * S * HEAD_DIM
    offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) keys of this program
    offs_d = tl.arange(0, HEAD_DIM)
    kv_off = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_off, mask=offs_n[:, None] < S, other=0.0)  # (BLOCK_N, D), held all along
    v = tl.load(v_ptr + kv_off, mask=offs_n[:, None] < S, other=0.0)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp(s - lse) = exp2(q.k * scale * log2(e) - lse * log2(e))
    if CAUSAL:
        # Queries before the keys see none of them; the query tiles that start before the last key see
        # some: the diagonal, masked; every later tile sees all the keys: no mask, as in lesson 05.
        lo = start_n // BLOCK_M * BLOCK_M
        diagonal_end = tl.minimum(lo + tl.cdiv(start_n + BLOCK_N - lo, BLOCK_M) * BLOCK_M, S)
        dk, dv = _attention_dkdv_tiles(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, bh, offs_n, S,
                                       qk_scale, lo, diagonal_end, True, HEAD_DIM, BLOCK_M)
        dk, dv = _attention_dkdv_tiles(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, bh, offs_n, S,
                                       qk_scale, diagonal_end, S, False, HEAD_DIM, BLOCK_M)
    else:
        dk, dv = _attention_dkdv_tiles(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, bh, offs_n, S,
                                       qk_scale, 0, S, False, HEAD_DIM, BLOCK_M)
    tl.store(dk_ptr + kv_off, (dk * scale).to(dk_ptr.dtype.element_ty), mask=offs_n[:, None] < S)
    tl.store(dv_ptr + kv_off, dv.to(dv_ptr.dtype.element_ty), mask=offs_n[:, None] < S)
    # END SOLUTION


@triton.jit
def _attention_dq_tiles(dq, q, do, lse2, delta, k_ptr, v_ptr, base, offs_m, S, qk_scale, lo, hi,
                        MASKED: tl.constexpr, EVEN_S: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    """Fold the key tiles [lo, hi) into dq for one tile of queries (whose (S, D) slab starts at `base`);
    MASKED: the causal diagonal."""
    # BEGIN SOLUTION
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_off = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=offs_n[:, None] < S, other=0.0)  # (BLOCK_N, D)
        v = tl.load(v_ptr + kv_off, mask=offs_n[:, None] < S, other=0.0)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])  # (BLOCK_M, BLOCK_N)
        if MASKED:  # j <= i < S also masks the keys past the end
            p = tl.where(offs_n[None, :] <= offs_m[:, None], p, 0.0)
        elif not EVEN_S:  # a key past the end: k = 0 but exp(0 - lse) is not 0
            p = tl.where(offs_n[None, :] < S, p, 0.0)
        dp = tl.dot(do, tl.trans(v))  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)  # dq += ds k
    # END SOLUTION
    return dq


@triton.autotune(configs=attention_configs("dq"), key=["S", "HEAD_DIM", "CAUSAL"],
                 prune_configs_by={"early_config_prune": select_attention_configs})
@triton.jit
def attention_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, S, scale,
                        CAUSAL: tl.constexpr, EVEN_S: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BEGIN SOLUTION
    m_tiles = tl.cdiv(S, BLOCK_M)
    start_m = tl.program_id(0) % m_tiles * BLOCK_M
    bh = (tl.program_id(0) // m_tiles).to(tl.int64)
    base = bh * S * HEAD_DIM
    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) queries of this program
    offs_d = tl.arange(0, HEAD_DIM)
    q_ok = offs_m < S
    qo_off = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + qo_off, mask=q_ok[:, None], other=0.0)  # (BLOCK_M, D), held all along
    do = tl.load(do_ptr + qo_off, mask=q_ok[:, None], other=0.0)
    lse2 = tl.load(lse_ptr + bh * S + offs_m, mask=q_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + bh * S + offs_m, mask=q_ok, other=0.0)
    qk_scale = scale * 1.4426950408889634
    dq = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    if CAUSAL:
        # Key tiles that end at or before the first query are seen whole by every query of the tile:
        # no mask; the tiles from there to the last query are the diagonal, masked; later keys: none.
        full_end = (start_m + 1) // BLOCK_N * BLOCK_N
        dq = _attention_dq_tiles(dq, q, do, lse2, delta, k_ptr, v_ptr, base, offs_m, S, qk_scale,
                                 0, full_end, False, True, HEAD_DIM, BLOCK_N)
        dq = _attention_dq_tiles(dq, q, do, lse2, delta, k_ptr, v_ptr, base, offs_m, S, qk_scale,
                                 full_end, tl.minimum(start_m + BLOCK_M, S), True, EVEN_S, HEAD_DIM, BLOCK_N)
    else:
        dq = _attention_dq_tiles(dq, q, do, lse2, delta, k_ptr, v_ptr, base, offs_m, S, qk_scale,
                                 0, S, False, EVEN_S, HEAD_DIM, BLOCK_N)
    tl.store(dq_ptr + qo_off, (dq * scale).to(dq_ptr.dtype.element_ty), mask=q_ok[:, None])
    # END SOLUTION


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                       do: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool) -> None:
    """dq, dk, dv of o = softmax(q k^T / sqrt(D) (+ causal mask)) v; all (B, H, S, D) contiguous."""
    expect_shapes("attention_backward", k=(k, q.shape), v=(v, q.shape), o=(o, q.shape),
                  lse=(lse, q.shape[:3]), do=(do, q.shape), dq=(dq, q.shape), dk=(dk, q.shape), dv=(dv, q.shape))
    expect_contiguous("attention_backward", q=q, k=k, v=v, o=o, lse=lse, do=do, dq=dq, dk=dk, dv=dv)
    B, H, S, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"head dim {D}: this kernel needs a power of 2 >= 16 (tl.dot's smallest tile)")
    EVEN_S = S % 128 == 0  # every tile of attention_configs divides 128
    # BEGIN SOLUTION
    delta = attention_delta(o, do)  # (B, H, S) fp32
    scale = 1.0 / math.sqrt(D)
    flags = dict(CAUSAL=causal, EVEN_S=EVEN_S, HEAD_DIM=D)
    attention_dkdv_kernel[lambda meta: (triton.cdiv(S, meta["BLOCK_N"]) * B * H,)](
        q, k, v, do, lse, delta, dk, dv, S, scale, **flags)
    attention_dq_kernel[lambda meta: (triton.cdiv(S, meta["BLOCK_M"]) * B * H,)](
        q, k, v, do, lse, delta, dq, S, scale, **flags)
    # END SOLUTION


# %% [check] 08.attention_backward

# %% [markdown]
# Your kernels training the small toy Llama (runs once the checks above pass): the loss and every
# parameter's gradient against the Hugging Face model's own.

# %%
if __name__ == "__main__":
    from course_utils.llama import toy_config, toy_llama

    vocab = toy_config(small=True).vocab_size
    ids = torch.randint(vocab, (2, 16), generator=torch.Generator().manual_seed(0)).to(current().device)
    reference = toy_llama(small=True, device=current().device).train()
    ours = swap_in_training_kernels(toy_llama(small=True, device=current().device).train())
    loss_ref = reference(input_ids=ids, labels=ids, use_cache=False).loss
    loss_ref.backward()
    loss = causal_lm_loss(ours, ids, ids)
    loss.backward()
    worst = max((p.grad - q.grad).abs().max().item() for p, q in zip(reference.parameters(), ours.parameters()))
    print(f"loss {loss.item():.6f} (Hugging Face {loss_ref.item():.6f}); worst gradient |diff| {worst:.2e}")

# %% [progress] 08
