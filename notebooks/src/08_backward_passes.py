# %% [markdown]
# # 08 · Backward passes: train the toy Llama with your own kernels
#
# **What you will learn**: what autograd keeps from the forward pass and what a backward recomputes
# (memory against FLOPs, in napkin maths); `torch.autograd.Function` and `ctx.save_for_backward`;
# RMSNorm's backward derived step by step, with its weight gradient as a reduction **across programs**
# (two-stage partial sums against `tl.atomic_add`, and why atomics make results nondeterministic);
# SwiGLU's backward recomputing the sigmoid; cross-entropy over a 32000-word vocabulary in one kernel,
# lesson 05's online statistics again, producing the loss and the logits' gradient in place; the
# memory of logits and why chunked linear + cross-entropy exists; FlashAttention-2's backward from the
# saved log-sum-exp (bonus). Then one training step of the toy Llama with these kernels swapped in:
# the same loss and gradients as Hugging Face's, and its tokens/s and peak memory against eager
# PyTorch, `torch.compile` and Liger-Kernel.
#
# Each section ends at its exercise in [the exercise notebook](../exercises/08_backward_passes.ipynb);
# the lesson shows a *worked sibling* in full (LayerNorm beside RMSNorm, GELU * mul beside SiLU * mul,
# binary cross-entropy beside cross-entropy, softmax's backward beside attention's), never the answer.

# %% [setup]

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from course_utils import check, current  # noqa: F401
from course_utils.bench import load_results, show_results
from course_utils.llama import toy_config, toy_llama

device = mode.device  # noqa: F821 - `mode` comes from the setup cell

# %% [markdown]
# ## What autograd keeps, and what a backward recomputes
#
# For every operation of the forward pass, autograd keeps ("saves") the tensors its backward will
# need, until the backward has used them. For `y = x * w` it keeps `x` and `w`; for `y = exp(x)` it
# keeps `y`. A training step's memory is therefore the weights, their gradients, the optimizer state,
# **and every saved activation of the whole forward pass**, alive at the same time at the start of the
# backward. A hand-written backward chooses what to keep: anything it can recompute cheaply from what
# it keeps anyway is not worth memory. A memory-bound kernel gets its arithmetic almost for free, so
# the rule is: keep the inputs, recompute the rest.
#
# The napkin maths for one decoder layer of the toy Llama at batch 8 x 1024 tokens in bf16 (`M` rows
# of hidden `H`, MLP width `I`): what eager PyTorch saves for the RMSNorm, the SiLU * mul and the loss,
# against what our Functions save.

# %%
cfg_full = toy_config()
M, H, I, V = 8 * 1024, cfg_full.hidden_size, cfg_full.intermediate_size, cfg_full.vocab_size  # noqa: E741
bf16, fp32 = 2, 4
saved = {  # bytes kept for the backward, per operation: eager (Hugging Face modules) vs ours
    "RMSNorm": ({"x.float()": M * H * fp32, "rstd": M * fp32, "x * rstd cast to bf16": M * H * bf16},
                {"x (bf16)": M * H * bf16, "rstd": M * fp32}),
    "SiLU * mul": ({"g (silu's input)": M * I * bf16, "silu(g) (mul's input)": M * I * bf16,
                    "u (mul's input)": M * I * bf16},
                   {"g": M * I * bf16, "u": M * I * bf16}),
    "loss": ({"log_softmax (fp32)": M * V * fp32},  # the fp32 upcast is freed when the forward ends
             {"dlogits, in the logits' own memory": 0}),
}
for op, (eager, ours) in saved.items():
    e, o = sum(eager.values()), sum(ours.values())
    print(f"{op:<11} eager keeps {e / 2**20:7.0f} MiB ({', '.join(eager)}); ours {o / 2**20:6.0f} MiB ({', '.join(ours)})")

# %% [markdown]
# The loss is the elephant: a `(tokens, vocab)` matrix in fp32 is larger than the whole layer's
# activations. We come back to it in the cross-entropy section. What the backward recomputes instead
# costs FLOPs, and here they are cheap: `xhat = x * rstd` is one multiply per element, `sigmoid(g)` one
# exp. These kernels move `(rows x width)` tensors and do a handful of FLOPs per element: they are
# memory-bound, so recomputing is free and every tensor not written or read is time saved.

# %% [markdown]
# ## RMSNorm backward, step by step
#
# The forward, for one row `x` of `H` numbers: `r = 1 / sqrt(mean(x**2) + eps)` (one number),
# `xhat = x * r`, `y = xhat * w`. Given `dy = dL/dy`, the chain rule, one line at a time:
#
# 1. `y = xhat * w`, elementwise: `dxhat = dy * w`, and `dw` gets `dy * xhat` **from every row**.
# 2. `xhat_j = x_j * r`, and `r` depends on every `x_k` of the row:
#    `dL/dx_k = dxhat_k * r + sum_j dxhat_j * x_j * dr/dx_k`.
# 3. `r = (mean(x**2) + eps)**(-1/2)`, so `dr/dx_k = -1/2 * r**3 * 2 x_k / H = -r**3 * x_k / H`.
# 4. Put together: `dx_k = r * dxhat_k - r**3 * x_k / H * sum_j dxhat_j * x_j`
#    `= r * (dxhat_k - xhat_k * mean_j(dxhat_j * xhat_j))`.
#
# So `dx = r * (dy * w - xhat * mean(dy * w * xhat))`: the first term is what you get if you forget
# that the norm depends on `x`; the second, the **mean's gradient term**, is the correction. A row
# kernel computes it with one more row reduction (a `tl.sum` along the row), from `x`, `dy`, `w` and the
# saved `r`. We check the formula against autograd in float64 before writing any kernel:

# %%
gen = torch.Generator().manual_seed(0)
x = torch.randn(6, 40, generator=gen, dtype=torch.float64, requires_grad=True)
w = torch.rand(40, generator=gen, dtype=torch.float64) + 0.5
dy = torch.randn(6, 40, generator=gen, dtype=torch.float64)
r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
(x * r * w).backward(dy)
xhat = (x * r).detach()
formula = r.detach() * (dy * w - xhat * (dy * w * xhat).mean(-1, keepdim=True))
without_mean_term = r.detach() * dy * w
print(f"formula vs autograd: {(formula - x.grad).abs().max():.1e};  without the mean's term: "
      f"{(without_mean_term - x.grad).abs().max():.1e}")

# %% [markdown]
# What the forward must keep: `x` (an input, alive anyway in a model: the previous layer's output
# or the residual stream), `w` (a parameter) and `r`, **one fp32 number per row**. The forward kernel
# computes `r` anyway; storing it costs 4 bytes a row. `xhat` is recomputed in the backward: one
# multiply, where keeping it would cost a `(rows, H)` tensor written in the forward and read in the
# backward.
#
# The forward that keeps `r` is your RMSNorm of lesson 06's exercise
# [06.rmsnorm](../exercises/06_fused_rmsnorm_mlp.ipynb#06.rmsnorm:-one-pass-statistics-in-fp32) with one more pointer
# argument, `rstd_ptr`, and one more store after the normalized rows are written: each program already
# holds the `(BLOCK_M,)` vector `rstd` of its rows, and writes it out,
#
# ```
# tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)   # 4 bytes a row: all the backward keeps
# ```
#
# The course's version, `rmsnorm_forward(x, weight, eps, y, rstd)`, is imported here (the 06.rmsnorm
# solution it extends is in `solutions/06_fused_rmsnorm_mlp.ipynb`; the exercise notebook of this lesson
# gives `rmsnorm_forward` in full). Against the definition:

# %%
from course_utils.lessons.l03_matmul import sm_count  # noqa: E402
from course_utils.lessons.l08_backward_passes import rmsnorm_forward  # noqa: E402

x = torch.randn(37, 300, generator=gen).to(device)
w = (torch.rand(300, generator=gen) + 0.5).to(device)
y, rstd = torch.empty_like(x), torch.empty(37, device=device)
rmsnorm_forward(x, w, 1e-6, y, rstd)
rstd_ref = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6)
print(f"rstd {tuple(rstd.shape)} {rstd.dtype}: max error {(rstd.double() - rstd_ref).abs().max():.1e}; "
      f"y: max error {(y.double() - x.double() * rstd_ref[:, None] * w.double()).abs().max():.1e}")

# %% [markdown]
# ### dw: a reduction across programs
#
# `dw = sum over rows of dy * xhat` is a sum over **all** rows, but the rows are spread over many
# programs. Three ways to add them up:
#
# - **`tl.atomic_add(dw_ptr + cols, partial)`** from every program: one launch, but thousands of
#   programs hit the same `H` addresses (contention), `dw` must be zeroed first, and the order in which
#   the additions land changes from run to run. Floating-point addition is not associative, so **the
#   result changes in its last bits from run to run**: a training run cannot be reproduced bit for bit.
# - **Two stages** (as Liger-Kernel's RMSNorm backward does): `P` programs (about one per SM) each
#   walk their share of the rows and keep a partial `dw` in fp32 registers, store it as row `p` of a
#   `(P, H)` scratch tensor; a second small kernel adds the `P` rows in a fixed order. Deterministic,
#   and the extra traffic is `P x H x 4` bytes, nothing next to the `(rows, H)` tensors. (Triton's
#   layer-norm tutorial has a second stage too, but its first adds each row into one of a few shared
#   buffers under a lock, in whatever order the programs take the lock: not deterministic.)
# - A host-side `scratch.sum(0)` would do stage two too, but the exercise asks for kernels.
#
# The order matters even for the same numbers:

# %%
terms = torch.randn(100_000, generator=gen, dtype=torch.float32)
orders = [terms, terms.flip(0), terms[torch.randperm(terms.numel(), generator=gen)]]
sums = [float(np.cumsum(t.numpy(), dtype=np.float32)[-1]) for t in orders]  # fp32, one addition at a time
print("the same 100000 fp32 numbers added in three orders:", [f"{s:.8f}" for s in sums])
print("float64 sum:", f"{float(terms.double().sum()):.8f}")

# %% [markdown]
# Stage two, the course's (given) kernel, and the number of programs of stage one:

# %% [inline] course_utils.lessons.l08_backward_passes: sum_rows_kernel sum_rows backward_programs

# %% [markdown]
# ### Worked sibling: LayerNorm backward
#
# LayerNorm subtracts the mean first: `xhat = (x - mean) * r`, `r = 1 / sqrt(var + eps)`,
# `y = xhat * w + b`. The same derivation gives one more correction term, for the mean:
# `dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))`, and two weight gradients,
# `dw = sum dy * xhat` and `db = sum dy`, both reduced across programs in two stages. Here it is in
# full: the forward keeps `mean` and `r` per row; the backward's programs each own a contiguous range
# of rows and write one partial row of `dw` and of `db`.

# %%
@triton.jit
def layernorm_forward_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # one row per program
    cols = tl.arange(0, BLOCK_N)
    inside = cols < n_cols
    v = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    mu = tl.sum(v, axis=0) / n_cols
    centered = tl.where(inside, v - mu, 0.0)  # padding must not enter the variance
    inv_std = tl.rsqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
    gamma = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (centered * inv_std * gamma + beta).to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(mean_ptr + row, mu)  # two fp32 numbers per row: all the backward needs besides x
    tl.store(rstd_ptr + row, inv_std)


@triton.jit
def layernorm_backward_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_part_ptr, db_part_ptr,
                              n_rows, n_cols, rows_each, BLOCK_N: tl.constexpr):
    p = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    inside = cols < n_cols
    gamma = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    dgamma = tl.zeros((BLOCK_N,), tl.float32)  # this program's partial sums
    dbeta = tl.zeros((BLOCK_N,), tl.float32)
    first = p * rows_each
    for row in range(first, tl.minimum(first + rows_each, n_rows)):  # one row at a time
        base = row * n_cols
        v = tl.load(x_ptr + base + cols, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(dy_ptr + base + cols, mask=inside, other=0.0).to(tl.float32)
        mu = tl.load(mean_ptr + row)
        inv_std = tl.load(rstd_ptr + row)
        vhat = tl.where(inside, (v - mu) * inv_std, 0.0)  # recomputed from the saved mean and rstd
        gw = g * gamma
        mean_gw = tl.sum(gw, axis=0) / n_cols  # the mean's term (RMSNorm has no mean to subtract)
        mean_gw_vhat = tl.sum(gw * vhat, axis=0) / n_cols  # the variance's term
        grad = inv_std * (gw - mean_gw - vhat * mean_gw_vhat)
        tl.store(dx_ptr + base + cols, grad.to(dx_ptr.dtype.element_ty), mask=inside)
        dgamma += g * vhat
        dbeta += g
    tl.store(dw_part_ptr + p * n_cols + cols, dgamma, mask=inside)  # stage one: one partial row each
    tl.store(db_part_ptr + p * n_cols + cols, dbeta, mask=inside)


def layernorm_backward(dy, x, w, mean, rstd, dx, dw, db):
    """dx of x's dtype, dw and db fp32 (n,): P partial rows each, then sum_rows (stage two)."""
    n_rows, n_cols = x.shape
    P = backward_programs(n_rows, x.device)
    parts = torch.empty((2, P, n_cols), device=x.device, dtype=torch.float32)
    layernorm_backward_kernel[(P,)](dy, x, w, mean, rstd, dx, parts[0], parts[1], n_rows, n_cols,
                                    triton.cdiv(n_rows, P), BLOCK_N=triton.next_power_of_2(n_cols))
    sum_rows(parts[0], dw)
    sum_rows(parts[1], db)

# %% [markdown]
# Against autograd on float64 copies, with 50 rows over a few programs and a width of 81 (no power of 2):

# %%
rows, width = 50, 81
x = torch.randn(rows, width, generator=gen).to(device)
w, b = torch.rand(width, generator=gen).to(device) + 0.5, torch.randn(width, generator=gen).to(device)
dy = torch.randn(rows, width, generator=gen).to(device)
y, mean, rstd = torch.empty_like(x), torch.empty(rows, device=device), torch.empty(rows, device=device)
layernorm_forward_kernel[(rows,)](x, w, b, y, mean, rstd, width, 1e-5, BLOCK_N=triton.next_power_of_2(width))
dx, dw, db = torch.empty_like(x), torch.empty(width, device=device), torch.empty(width, device=device)
layernorm_backward(dy, x, w, mean, rstd, dx, dw, db)
x64, w64, b64 = (t.double().cpu().requires_grad_() for t in (x, w, b))
y64 = F.layer_norm(x64, (width,), w64, b64, 1e-5)
y64.backward(dy.double().cpu())
for name, got, want in (("y", y, y64), ("dx", dx, x64.grad), ("dw", dw, w64.grad), ("db", db, b64.grad)):
    print(f"LayerNorm {name}: max |ours - float64 autograd| = {(got.double().cpu() - want).abs().max():.1e}")

# %% [markdown]
# RMSNorm's backward is this without the mean: `rmsnorm_backward(dy, x, weight, rstd, dx, dw)` in
# [the exercise notebook](../exercises/08_backward_passes.ipynb#08.rmsnorm_backward), with `rstd` from
# `rmsnorm_forward`, `dw` fp32 (hidden,), and any number of rows.

# %% [markdown]
# ## torch.autograd.Function: what a backward may keep
#
# A `torch.autograd.Function` is how our kernels enter autograd: a `forward(ctx, *inputs)` that runs
# the forward kernel and stores what the backward needs with `ctx.save_for_backward(...)` (tensors;
# autograd checks that they were not modified in place before the backward reads them), and a
# `backward(ctx, *grad_outputs)` that returns one gradient per input of `forward` (`None` for
# non-tensors such as `eps`). `Function.apply(...)` calls it; the output's `grad_fn` is the `ctx`,
# which is how a check can look at what you saved (`y.grad_fn.saved_tensors`).
#
# Worked sibling: LayerNorm as a Function on the kernels above. It saves `x`, `w`, `mean` and `rstd`:
# two `(rows,)` vectors beside the input, no `(rows, H)` copy.

# %%
class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps):
        flat = x.reshape(-1, x.shape[-1]).contiguous()  # (rows, H); the kernels take no strides
        n_rows, n_cols = flat.shape
        y = torch.empty_like(flat)
        stats = torch.empty((2, n_rows), device=x.device, dtype=torch.float32)  # mean, rstd
        layernorm_forward_kernel[(n_rows,)](flat, w, b, y, stats[0], stats[1], n_cols, eps,
                                            BLOCK_N=triton.next_power_of_2(n_cols))
        ctx.save_for_backward(x, w, stats)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad_y):
        x, w, stats = ctx.saved_tensors
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        grad_x = torch.empty_like(flat)
        grad_w = torch.empty(flat.shape[1], device=x.device, dtype=torch.float32)
        grad_b = torch.empty_like(grad_w)
        layernorm_backward(grad_y.reshape(flat.shape).contiguous(), flat, w, stats[0], stats[1], grad_x, grad_w, grad_b)
        return grad_x.view(x.shape), grad_w.to(w.dtype), grad_b.to(w.dtype), None


xs = torch.randn(2, 7, 81, generator=gen).to(device).requires_grad_()
ws = (torch.rand(81, generator=gen) + 0.5).to(device).requires_grad_()
bs = torch.randn(81, generator=gen).to(device).requires_grad_()
out = LayerNormFunction.apply(xs, ws, bs, 1e-5)
print("saved for the backward:", [(tuple(t.shape), str(t.dtype)) for t in out.grad_fn.saved_tensors])
out.sum().backward()
ref = [t.detach().clone().requires_grad_() for t in (xs, ws, bs)]
F.layer_norm(ref[0], (81,), ref[1], ref[2], 1e-5).sum().backward()
print("grads vs F.layer_norm:", [f"{(a.grad - r.grad).abs().max():.1e}" for a, r in zip((xs, ws, bs), ref)])

# %% [markdown]
# Your turn: `rmsnorm_train(x, weight, eps)`, a Function on `rmsnorm_forward` and your
# `rmsnorm_backward`, in [the exercise notebook](../exercises/08_backward_passes.ipynb#08.rmsnorm_train).
# Its check compares the output and both gradients with float64 autograd and reads `saved_tensors`:
# `rstd` yes, a `(rows, hidden)` copy no.

# %% [markdown]
# ## SwiGLU backward: recompute the sigmoid
#
# The MLP's `h = silu(g) * u` with `silu(g) = g * s`, `s = sigmoid(g)`. Its backward:
# `du = dh * silu(g)`, and `dg = dh * u * silu'(g)` with, by the product rule and `s' = s * (1 - s)`,
# `silu'(g) = s + g * s * (1 - s)`. Eager PyTorch runs `F.silu` and `*` as two operations and so
# keeps three `(rows, I)` tensors (`g`, `silu(g)`, `u`); a fused backward keeps `g` and `u` and
# recomputes `s` (one exp per element, free in a kernel that moves 5 tensors). In a model the
# backward can even write `dg` and `du` into the memory of `g` and `u`: nothing reads them afterwards.
#
# Worked sibling: `gelu(g) * u` with the tanh approximation of GELU,
# `gelu(g) = 0.5 g (1 + tanh(c (g + 0.044715 g**3)))`, `c = sqrt(2 / pi)`. Its derivative, with
# `t = tanh(...)` and `tanh' = 1 - t**2`: `gelu'(g) = 0.5 (1 + t) + 0.5 g (1 - t**2) c (1 + 3 * 0.044715 g**2)`.
# `tanh` through `tl.sigmoid`: `tanh(z) = 2 sigmoid(2z) - 1` (the interpreter has no libdevice).

# %%
def gelu_mul_backward_ref(dh, g, u):
    g64, u64 = g.double().requires_grad_(), u.double().requires_grad_()
    (F.gelu(g64, approximate="tanh") * u64).backward(dh.double())
    return g64.grad, u64.grad


@triton.jit
def gelu_mul_backward_kernel(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n_elements, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    idx = start + tl.arange(0, BLOCK)
    live = idx < n_elements
    grad_h = tl.load(dh_ptr + idx, mask=live, other=0.0).to(tl.float32)  # read 3 tensors, write 2
    a = tl.load(g_ptr + idx, mask=live, other=0.0).to(tl.float32)
    b = tl.load(u_ptr + idx, mask=live, other=0.0).to(tl.float32)
    c = 0.7978845608028654  # sqrt(2 / pi)
    inner = c * (a + 0.044715 * a * a * a)
    t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh, recomputed from g: nothing else was kept
    gelu = 0.5 * a * (1.0 + t)
    dgelu = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * a * a)
    tl.store(du_ptr + idx, (grad_h * gelu).to(du_ptr.dtype.element_ty), mask=live)
    tl.store(dg_ptr + idx, (grad_h * b * dgelu).to(dg_ptr.dtype.element_ty), mask=live)


shape = (37, 300)
dh, g, u = (torch.randn(shape, generator=gen).to(device) for _ in range(3))
dg, du = torch.empty_like(g), torch.empty_like(u)
gelu_mul_backward_kernel[(triton.cdiv(g.numel(), 1024),)](dh, g, u, dg, du, g.numel(), BLOCK=1024)
want_dg, want_du = gelu_mul_backward_ref(dh.cpu(), g.cpu(), u.cpu())
print(f"GELU * mul backward: dg max error {(dg.cpu().double() - want_dg).abs().max():.1e}, "
      f"du {(du.cpu().double() - want_du).abs().max():.1e}")

# %% [markdown]
# The SiLU version is [08.silu_mul_backward](../exercises/08_backward_passes.ipynb#08.silu_mul_backward);
# the training step wraps it, with lesson 04's `silu_mul` as the forward, in `SiluMulFunction` (given,
# below).

# %% [markdown]
# ## Cross-entropy: loss and gradient in one kernel
#
# For logits `x` (one row of `V`, the vocabulary) and target `t`: `loss = lse(x) - x[t]` with
# `lse(x) = log(sum_j exp(x_j))`, and its gradient is remarkably simple,
# `dloss/dx_j = softmax(x)_j - [j == t]`. For the **mean** over the `n` rows whose target is not the
# ignore index (-100, padding), divide by `n`; ignored rows get 0. So one kernel can compute the loss
# **and** the gradient in the forward pass, and the backward has nothing left to do but scale by
# `dL/dloss` (1 in training).
#
# `lse` over 32000 values is lesson 05's online softmax: one pass over the row in blocks keeping a
# running max `m` and a running sum `d` of `exp(x - m)`, the old sum rescaled by `exp(m_old - m_new)`
# when the max grows; `lse = m + log(d)`. A second pass writes `exp(x - lse) - [j == t]`, divided by
# `n`. The three things that go wrong: logits near 100 (`exp(100)` is `2.7e43`, past fp32's largest,
# 3.4e38, let alone fp16's: subtract the max), base 2 (`exp2`/`log2` are fast, but then the logits must
# be scaled by `log2(e)` going in and the result by `ln(2)` coming out), and the count `n` (it needs
# every row's target: a tiny first kernel counts it on the device).
#
# ### The memory of logits
#
# The logits are `tokens x vocab`. At batch 8 x 1024 with Llama's 32000 words that is 262 million
# numbers: 0.5 GiB in bf16. Hugging Face's loss upcasts them to fp32 (1 GiB, freed when the forward
# ends), `log_softmax` writes another fp32 copy and keeps it for the backward, and the backward writes
# two fp32 gradients (of the loss's `log_softmax` output, then of the fp32 logits) and a bf16 cast of the
# second. A kernel that computes the loss and writes the gradient **into the logits' own memory** needs
# nothing beyond the bf16 logits. Chunked linear + cross-entropy (Liger's fused linear cross-entropy)
# goes further: it never holds all the logits, it computes `hidden @ W_vocab.T` for a chunk of tokens,
# the loss and gradient of that chunk, and the chunk's contributions to `d hidden` and `d W_vocab`,
# then moves to the next chunk. The peak is then one chunk of logits. The arithmetic, per sequence
# length (batch 8, vocab 32000, chunks of 1024 tokens):

# %%
def loss_peak_bytes(tokens: int, vocab: int = 32000, chunk: int = 1024) -> dict[str, float]:
    """Bytes alive at the loss's peak, beyond the hidden states and weights."""
    logits = tokens * vocab
    return {
        "eager (bf16 logits, log_softmax, two fp32 grads)": logits * (bf16 + fp32 + fp32 + fp32),
        "fused kernel, dlogits in place (bf16 logits only)": logits * bf16,
        "chunked linear + cross-entropy (one chunk of logits)": min(tokens, chunk) * vocab * (bf16 + fp32),
    }


seq_lens = [512, 1024, 2048, 4096, 8192]
curves = {name: [] for name in loss_peak_bytes(1)}
for s in seq_lens:
    for name, value in loss_peak_bytes(8 * s).items():
        curves[name].append(value / 2**30)
fig, ax = plt.subplots(figsize=(7, 3.5))
for name, values in curves.items():
    ax.plot(seq_lens, values, marker="o", label=name)
ax.set_xscale("log", base=2)
ax.set_xlabel("sequence length (batch 8)")
ax.set_ylabel("GiB at the loss")
ax.set_title("Memory of the logits and their gradient, vocab 32000 (computed)")
ax.legend(fontsize=7)
plt.show()
print(f"batch 8 x 1024: eager {curves[next(iter(curves))][1]:.1f} GiB, in place "
      f"{list(curves.values())[1][1]:.2f} GiB")

# %% [markdown]
# ### Worked sibling: binary cross-entropy with logits, loss and gradient in one pass
#
# Each element is its own two-class problem: `loss = softplus(x) - y x` (stable form:
# `max(x, 0) - x y + log(1 + exp(-|x|))`), gradient `sigmoid(x) - y`, mean over the elements whose
# label is not ignored (here: a label of -100). The same shape as the exercise: a count of the kept
# elements first, then loss and gradient in one pass, the gradient written in place of the logits.

# %%
@triton.jit
def bce_count_kernel(y_ptr, count_ptr, n_elements, BLOCK: tl.constexpr):
    idx = tl.arange(0, BLOCK)
    kept = tl.zeros((BLOCK,), tl.float32)
    for i0 in range(0, n_elements, BLOCK):
        lab = tl.load(y_ptr + i0 + idx, mask=i0 + idx < n_elements, other=-100.0)
        kept += (lab != -100.0).to(tl.float32)
    tl.store(count_ptr, tl.maximum(tl.sum(kept, axis=0), 1.0))  # n >= 1: all-ignored gives zeros


@triton.jit
def bce_with_logits_kernel(x_ptr, y_ptr, count_ptr, loss_ptr, grad_ptr, n_elements, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < n_elements
    z = tl.load(x_ptr + idx, mask=live, other=0.0).to(tl.float32)
    lab = tl.load(y_ptr + idx, mask=live, other=-100.0)
    used = lab != -100.0
    softplus = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))  # never exp of a large number
    tl.store(loss_ptr + idx, tl.where(used, softplus - z * lab, 0.0), mask=live)
    scale = 1.0 / tl.load(count_ptr)
    tl.store(grad_ptr + idx, tl.where(used, (tl.sigmoid(z) - lab) * scale, 0.0).to(grad_ptr.dtype.element_ty),
             mask=live)


logits = (torch.randn(3000, generator=gen) * 20).to(device)  # up to +-80: the stable form matters
labels = (torch.rand(3000, generator=gen) > 0.5).float().to(device)
labels[::7] = -100.0
count = torch.empty(1, device=device)
loss, grad = torch.empty_like(logits), logits.clone()
bce_count_kernel[(1,)](labels, count, logits.numel(), BLOCK=1024)
bce_with_logits_kernel[(triton.cdiv(logits.numel(), 1024),)](grad, labels, count, loss, grad, logits.numel(), BLOCK=1024)
x64 = logits.double().cpu().requires_grad_()
keep = labels.cpu() != -100
ref = F.binary_cross_entropy_with_logits(x64[keep], labels.cpu().double()[keep])
ref.backward()
print(f"BCE mean loss {float(loss.sum() / count):.6f} vs torch {ref.item():.6f}; "
      f"grad (in place) max error {(grad.double().cpu() - x64.grad).abs().max():.1e}")

# %% [markdown]
# The exercise is the softmax version over a whole row, with the online statistics:
# [08.cross_entropy](../exercises/08_backward_passes.ipynb#08.cross_entropy). The count kernel it
# uses is given:

# %% [inline] course_utils.lessons.l08_backward_passes: count_targets_kernel count_targets

# %% [markdown]
# ## Bonus: FlashAttention-2 backward
#
# Lesson 05's forward never wrote the `(S, S)` probabilities; its backward must not either. What the
# forward keeps is the output `o` and, per query row, `lse = m + log(l)` (natural log), from which any
# tile of probabilities comes back as `P = exp(q k^T * scale - lse)` without a running max. Per tile:
#
# ```
# dv   += P^T do                         dp = do v^T
# ds    = P * (dp - delta)               delta_i = sum_j P_ij dp_ij = rowsum(do_i * o_i)
# dq   += ds k * scale                   dk   += ds^T q * scale
# ```
#
# `ds` is softmax's backward (`dx = y * (dy - sum(dy * y))`, the sibling below); `delta` is its
# row sum, computed once from `o` and `do` instead of from `P` (which no single program holds
# whole). `dk` and `dv` sum over queries, `dq` over keys: a program per key tile walking the queries
# keeps `dk`, `dv` in registers, and a program per query tile walking the keys keeps `dq` (the
# alternative, `tl.atomic_add` into `dq`, is nondeterministic, as above). FLOPs: five `S x S x D`
# matmuls, the recomputed `q k^T` among them, against the forward's two: the backward costs about 2.5
# forwards (the benchmark counts these five; split in two kernels, as here, the `dq` kernel recomputes
# `q k^T` and `dp` once more, seven in all). The `delta` kernel is given:

# %% [inline] course_utils.lessons.l08_backward_passes: attention_delta_kernel attention_delta

# %% [markdown]
# ### Worked sibling: softmax backward, row by row
#
# For `y = softmax(x)` along a row: `dx = y * (dy - sum(dy * y))`. The forward keeps `y` (not `x`).

# %%
@triton.jit
def softmax_backward_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    inside = cols < n_cols
    prob = tl.load(y_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    g = tl.load(dy_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    dot = tl.sum(prob * g, axis=0)  # one number per row: attention's delta
    tl.store(dx_ptr + row * n_cols + cols, (prob * (g - dot)).to(dx_ptr.dtype.element_ty), mask=inside)


xs = torch.randn(5, 300, generator=gen, dtype=torch.float64, requires_grad=True)
ys = torch.softmax(xs, -1)
gy = torch.randn(5, 300, generator=gen, dtype=torch.float64)
ys.backward(gy)
y32, g32 = ys.detach().float().to(device), gy.float().to(device)
gx = torch.empty_like(y32)
softmax_backward_kernel[(5,)](y32, g32, gx, 300, BLOCK_N=512)
print(f"softmax backward vs autograd: {(gx.double().cpu() - xs.grad).abs().max():.1e}")

# %% [markdown]
# The exercise: [08.attention_backward](../exercises/08_backward_passes.ipynb#08.attention_backward).

# %% [markdown]
# ## The training step: the toy Llama with our kernels
#
# The given Functions for SwiGLU and the loss, and the modules that replace Hugging Face's: every
# RMSNorm (two per layer and the final one) becomes `RMSNormTrain` (your `rmsnorm_train`), every MLP
# keeps its three `nn.Linear` matmuls around `SiluMulFunction`, and the output layer and the loss become
# one Function, `LinearCrossEntropyFunction`. Attention and the matmuls stay PyTorch's (cuBLAS, SDPA).
#
# Why the output layer joins the loss: your `cross_entropy` writes the logits' gradient in the forward,
# and from there the output layer's backward is two matmuls that need nothing else,
# `d hidden = dlogits @ W_vocab` and `d W_vocab = dlogits.T @ hidden`. Run in the forward too, they let
# the logits (8192 x 32000 bf16 in the bench's step, 524 MB) die before the backward starts; what waits
# for the backward is 82 MB of gradients of the size of `hidden` and `W_vocab`. The FLOPs are the ones
# autograd would spend, moved earlier. It did not lower the step's peak memory in the bench: the forward
# still holds all the logits at once. Liger's fused linear cross-entropy does the same per chunk of
# tokens, so that even the forward never holds all the logits: that lowers the peak. Both Functions
# start from `mean_loss_grad_in_place`; `CrossEntropyFunction` is the loss alone on given logits, its
# gradient in their memory: what the cross-entropy bench below times.
#
# The loss's backward must multiply the gradient by `dL/dloss`, which is 1 whenever the loss itself is
# differentiated (training), and any number otherwise (a loss scaled or summed with another). Reading it
# on the host (`if dloss.item() == 1`) would stall the CPU until the GPU catches up; `scale_unless_one`
# reads it inside a kernel instead: each program loads the 4 bytes and, when they hold 1, stops. The
# count of non-ignored targets is computed once and serves both the kernel's gradient and the mean.
#
# Writing in place saves memory when the model runs eagerly; under `torch.compile` it costs copies. The
# compiler traces the backward as a graph whose inputs include the saved tensors, and it does not let a
# kernel write into a graph input: it copies the tensor first (functionalization). A profile of the
# compiled training step on an H100 ([`results/explore`](../results/explore/README.md), "Lesson 08: the training step under torch.compile (H100)")
# found such copies of `g` and `u` before `silu_mul_backward` (8192 x 11008 bf16, 180 MB each) and of
# the logits' gradient (524 MB), which the loss's backward then handed to `scale_unless_one` (when the
# loss was still `CrossEntropyFunction`). So `SiluMulFunction` decides in its forward, which Dynamo
# traces (`torch.compiler.is_compiling()` is true there, and not in the backward, which AOTAutograd
# traces later), and writes new buffers when compiled. The loss is left as it is: its gradients (82 MB
# now) are written in the forward, before `dL/dloss` is known, and scaling them into new buffers would
# move the same bytes as copies of them do. What copies are left? The bench runs one compiled step of
# each model under `torch.profiler` and counts the kernels that only copy a tensor (the runtime's copies,
# and Inductor's kernels that fuse nothing but a clone or a `copy_`): {{fact:step_copies}} (H200; on the
# H100: {{fact@h100:step_copies}}).

# %%
# What these modules call: your exercises' functions. Here the course's solutions are imported (their
# code is in solutions/08_backward_passes.ipynb); in your exercise notebook the same cells run yours.
from torch import nn  # noqa: E402

from course_utils.lessons.l04_fusion import silu_mul  # noqa: E402, F401
from course_utils.lessons.l08_backward_passes import cross_entropy, rmsnorm_train, silu_mul_backward  # noqa: E402, F401

# %% [inline] course_utils.lessons.l08_backward_passes: SiluMulFunction scale_unless_one_kernel scale_unless_one mean_loss_grad_in_place CrossEntropyFunction LinearCrossEntropyFunction RMSNormTrain SwiGLUTrain swap_in_training_kernels shifted_targets causal_lm_loss

# %% [markdown]
# One step of the small config (on the CPU: fp32, 2 x 16 tokens) against the Hugging Face model's own
# loss and backward: the loss and every parameter's gradient must agree.

# %%
small = toy_config(small=True)
ids = torch.randint(small.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)).to(device)
reference = toy_llama(small=True, device=device).train()
ours = swap_in_training_kernels(toy_llama(small=True, device=device).train())
loss_ref = reference(input_ids=ids, labels=ids, use_cache=False).loss
loss_ref.backward()
loss_ours = causal_lm_loss(ours, ids, ids)
loss_ours.backward()
grads = dict(ours.named_parameters())
worst = max((grads[name].grad - p.grad).abs().max().item() for name, p in reference.named_parameters())
print(f"loss: ours {loss_ours.item():.6f}, Hugging Face {loss_ref.item():.6f}; "
      f"{len(grads)} parameters, worst gradient difference {worst:.1e}")

# %% [markdown]
# ## Measured: the kernels and the training step
#
# On a GPU, `python -m course_utils bench 08` times forward + backward of RMSNorm (16384 x 4096),
# SiLU * mul (16384 x 14336) and cross-entropy (8192 x 32000), all bf16, against eager PyTorch,
# `torch.compile` and Liger-Kernel; the attention backward at (4, 16, 4096, 128) against SDPA's; and
# the toy Llama's training step at batch 8 x 1024 in bf16: tokens/s and peak memory, with our kernels
# in the eager model and again with `torch.compile` around the loss function (our autograd Functions
# inside it, the rest compiled). Here are the committed results (on the CPU, what the course's GPU
# measured):

# %%
data = show_results("08")

# %%
if data is not None and data.get("facts"):
    facts = data["facts"]
    steps = {k[len("tokens/s "):]: float(v) for k, v in facts.items() if k.startswith("tokens/s ")}
    peaks = {name: float(facts[key]) for name in steps for key in facts
             if key.startswith("peak MiB toy Llama") and key.endswith(" " + name)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 2.8))
    names = list(steps)
    left.barh(names, [steps[n] for n in names], color=["tab:orange" if "ours" in n else "tab:gray" for n in names])
    left.set_xlabel("tokens/s (higher is better)")
    right.barh(names, [peaks.get(n, 0) / 1024 for n in names],
               color=["tab:orange" if "ours" in n else "tab:gray" for n in names])
    right.set_xlabel("peak memory of a step, GiB (lower is better)")
    for axis in (left, right):
        axis.invert_yaxis()
    fig.suptitle(f"toy Llama training step, batch 8 x 1024, bf16, on {data['device']}")
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ### What the measurements show
#
# Measured on {{measured}}; each ratio is our speed over the peer's (higher is better).
#
# - **RMSNorm**, forward + backward: a fraction of a millisecond of GPU work per call ({{ms:rmsnorm fwd+bwd bf16 16384x4096|torch.compile [graph]}} for
#   `torch.compile`'s in a CUDA graph), and CPU work on every side (autograd, the compiled wrapper, Triton's launcher), so a plain timing can measure the
#   CPU rather than the GPU: launched plainly, `torch.compile`'s took {{ms:rmsnorm fwd+bwd bf16 16384x4096|torch.compile}} and ours
#   {{ms:rmsnorm fwd+bwd bf16 16384x4096|triton (ours)}} in this run. Every side is therefore also replayed from a CUDA graph
#   (lesson 04), and the target is judged there: ours {{ms:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) [graph]}}
#   ({{gbps:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) [graph]}}), {{ratio:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) [graph]|fastest}} the speed of the fastest
#   peer, `{{peer:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) [graph]}}` (target {{verdict:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) [graph]|fastest}}; on the
#   H100 {{ratio@h100:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) [graph]|fastest}}, {{verdict@h100:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) [graph]|fastest}}). Eager PyTorch
#   took {{ms:rmsnorm fwd+bwd bf16 16384x4096|torch eager}}: it writes and re-reads its fp32 temporaries.
#   Timed apart, our forward took {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) forward only}} and our backward
#   {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) backward only}}, for 2 and 3 passes over a `(rows, hidden)` tensor. What
#   the backward's launch is worth shows in the sweep rows (forward and backward kernels, no autograd):
#   one row per step took {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) kernels, backward 1/SM BLOCK_M=1 w8}}, four rows per step
#   {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) kernels, backward 1/SM BLOCK_M=4 w8}} (the default), and one row per step
#   with two programs per SM {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) kernels, backward 2/SM BLOCK_M=1 w8}}: what
#   counts is how many rows' loads an SM has in flight, four rows in one program's step or one in each
#   of more programs. Nsight Compute on both GPUs agrees ([`results/explore`](../results/explore/README.md),
#   "Lesson 08: the RMSNorm backward's rows in flight"): with the same 8 warps per SM, four rows a step
#   kept the DRAM busier than one and left each instruction waiting less on its loads. Four rows with 4 warps instead
#   of 8 {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) kernels, backward 1/SM BLOCK_M=4 w4}}: twice the values per thread,
#   more than the registers hold. The compiled kernels say so ({{fact:rmsnorm_backward_registers}}):
#   with 4 warps the compiler gave up holding the tile in registers and keeps it in local memory
#   (per-thread memory in DRAM, cached in L1 and L2). Two programs per SM:
#   {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) kernels, backward 2/SM BLOCK_M=4 w8}}; eight:
#   {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) kernels, backward 8/SM BLOCK_M=4 w8}}. Timed apart, the two stages say where
#   more programs cost: stage one took {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) backward stage one alone, 1/SM}} with one
#   program per SM and {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) backward stage one alone, 8/SM}} with eight; stage two
#   {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) backward stage two alone, 1/SM}} against
#   {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) backward stage two alone, 8/SM}}, for eight times the partial rows. Its read
#   (`P x hidden x 4` bytes, 2 MB at one program per SM) is small next to the tensors', but a small read
#   is bound by latency, so it costs more than its bytes suggest: how many SMs have loads in flight is
#   what counts. The given `sum_rows` reads strips of 32 columns, 128 programs at hidden 4096; in strips of
#   256 columns, 16 programs, the same sum took
#   {{us:rmsnorm fwd+bwd bf16 16384x4096|triton (ours) backward stage two alone, 1/SM, 256-column strips}}.
# - **SiLU * mul**: ours {{gbps:silu_mul fwd+bwd bf16 16384x14336|triton (ours)}}, `torch.compile`
#   {{gbps:silu_mul fwd+bwd bf16 16384x14336|torch.compile}}, Liger-Kernel
#   {{gbps:silu_mul fwd+bwd bf16 16384x14336|Liger-Kernel}}: {{ratio:silu_mul fwd+bwd bf16 16384x14336|triton (ours)|fastest}}
#   against the fastest. Compare them with lesson 02's copy ceiling on the same GPU,
#   {{02_first_kernels/gbps:vector add fp32 2^28|copy ceiling (x -> out)}}: all three move the 8
#   tensors of forward + backward at about the rate of a copy, so no kernel has bytes left to save; the
#   differences between them are the last few percent of the memory system.
# - **Cross-entropy**, loss and gradient of 8192 x 32000 bf16 logits: ours
#   {{ms:cross_entropy fwd+bwd bf16 8192x32000|triton (ours)}}, `torch.compile`
#   {{ms:cross_entropy fwd+bwd bf16 8192x32000|torch.compile}}, Liger-Kernel
#   {{ms:cross_entropy fwd+bwd bf16 8192x32000|Liger-Kernel}}, eager
#   {{ms:cross_entropy fwd+bwd bf16 8192x32000|torch eager}}: {{ratio:cross_entropy fwd+bwd bf16 8192x32000|triton (ours)|fastest}}
#   the fastest peer. One kernel computes the loss and the gradient (two passes over each row, the
#   gradient written once), and the backward moves no bytes when `dL/dloss` is 1. Memory
#   allocated above the logits at the peak: eager {{fact:peak MiB cross_entropy fwd+bwd bf16 8192x32000 torch eager}} MiB
#   (three fp32 tensors of the logits' size at once in the backward: the saved `log_softmax` and the
#   gradients of its output and of its input), `torch.compile`
#   {{fact:peak MiB cross_entropy fwd+bwd bf16 8192x32000 torch.compile}} MiB, ours
#   {{fact:peak MiB cross_entropy fwd+bwd bf16 8192x32000 triton (ours)}} MiB: the gradient takes the
#   logits' place.
# - **Attention backward** at (4, 16, 4096, 128): ours {{tflops:attention backward bf16 (4, 16, 4096, 128)|triton (ours)}}
#   against SDPA's {{tflops:attention backward bf16 (4, 16, 4096, 128)|SDPA backward}}, that is
#   {{ratio:attention backward bf16 (4, 16, 4096, 128)|triton (ours)|SDPA backward}}; causal
#   {{ratio:attention backward bf16 (4, 16, 4096, 128) causal|triton (ours)|SDPA backward}}. The
#   autotuner chose {{fact:attention backward full dkdv tile}} for dk, dv and {{fact:attention backward full dq tile}}
#   for dq; every candidate it timed: {{fact:attention backward full dkdv tiles timed}} (dk, dv) and
#   {{fact:attention backward full dq tiles timed}} (dq).
# - **The training step**: with our kernels in the eager model, {{fact:tokens/s triton (ours)}} tokens/s,
#   {{ratio:toy Llama training step bf16 8x1024|triton (ours)|HF torch.compile}} the speed of
#   `torch.compile` of the Hugging Face model ({{fact:tokens/s HF torch.compile}} tokens/s), whose
#   compiler also fuses what stays eager in ours: RoPE, the residual adds, the casts around attention.
#   The fair pairing gives both sides the compiler: `torch.compile` around our model,
#   {{fact:tokens/s triton (ours) + torch.compile}} tokens/s, {{ratio:toy Llama training step bf16 8x1024|triton (ours) + torch.compile|HF torch.compile}}
#   the compiled Hugging Face model. Eager Hugging Face: {{fact:tokens/s HF eager}} tokens/s.
#   Peak memory of a step: ours {{fact:peak MiB toy Llama training step bf16 8x1024 triton (ours)}} MiB,
#   eager Hugging Face {{fact:peak MiB toy Llama training step bf16 8x1024 HF eager}} MiB, compiled
#   {{fact:peak MiB toy Llama training step bf16 8x1024 HF torch.compile}} MiB, with Liger-Kernel
#   {{fact:peak MiB toy Llama training step bf16 8x1024 HF + Liger-Kernel}} MiB: its fused linear +
#   cross-entropy never holds all the logits, the chunking of the cross-entropy section.
