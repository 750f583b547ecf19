"""Lesson 08: the solutions pass their checks, the usual wrong backward passes fail with a message naming
the mistake, and the toy Llama with our autograd Functions trains like the Hugging Face model."""
from __future__ import annotations

import math
import weakref

import pytest
import torch
import triton
import triton.language as tl

from course_utils.grading import CheckFailed, check, remote
from course_utils.mode import current
from course_utils.lessons import l08_backward_passes as l08
from course_utils.llama import toy_config, toy_llama

from helpers import failure, flat_copy_kernel, interpreter_only_because, mutant, recorded_launches

SEED = 1234
DEVICE = current().device  # the tests draw on the CPU (same values in both modes), then move there


# --- the solutions ----------------------------------------------------------------------------

@pytest.mark.parametrize("exercise, solution", [
    ("08.rmsnorm_backward", l08.rmsnorm_backward), ("08.silu_mul_backward", l08.silu_mul_backward),
    ("08.cross_entropy", l08.cross_entropy), ("08.rmsnorm_train", l08.rmsnorm_train),
    ("08.attention_backward", l08.attention_backward)])
def test_solution_passes(exercise, solution):
    check(exercise, solution, seed=SEED, quiet=True)


def test_dw_is_deterministic():
    """Two-stage partial sums in a fixed order: the same dw, bit for bit, run after run."""
    gen = torch.Generator().manual_seed(0)
    x, dy = torch.randn(50, 80, generator=gen).to(DEVICE), torch.randn(50, 80, generator=gen).to(DEVICE)
    w = (torch.rand(80, generator=gen) + 0.5).to(DEVICE)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)
    runs = []
    for _ in range(2):
        dx, dw = torch.empty_like(x), torch.empty(80, device=DEVICE)
        l08.rmsnorm_backward(dy, x, w, rstd, dx, dw)
        runs.append(dw)
    assert torch.equal(runs[0], runs[1])
    torch.testing.assert_close(runs[0], l08.rmsnorm_backward_ref(dy, x, w, rstd)[1])


# --- wrong RMSNorm backwards ------------------------------------------------------------------

SHARED_PARTS: tl.constexpr = 256  # the partial rows of dw in Triton's layer-norm tutorial, at hidden <= 1024

@triton.jit
def _rmsnorm_bwd_bug_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, n_cols, stride_dy, stride_x, stride_dx,
                            BUG: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride_dy + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    xhat = x * rstd
    if BUG == "no mean term":
        dx = rstd * dy * w
    elif BUG == "mean over the block":  # the padded lanes counted as elements of the row
        dx = rstd * (dy * w - xhat * tl.sum(dy * w * xhat, axis=0) / BLOCK_N)
    elif BUG == "no outer rstd":
        dx = dy * w - xhat * tl.sum(dy * w * xhat, axis=0) / n_cols
    else:
        dx = rstd * (dy * w - xhat * tl.sum(dy * w * xhat, axis=0) / n_cols)
    tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=ok)
    if BUG == "dw stored, not added":  # every row overwrites dw: one row's contribution survives
        tl.store(dw_ptr + cols, dy * xhat, mask=ok)
    elif BUG == "partial rows shared, no lock":  # dw_ptr: (SHARED_PARTS, n_cols) partial rows, summed after
        part = dw_ptr + (row % SHARED_PARTS) * n_cols + cols  # Triton's layer-norm tutorial without its lock
        tl.store(part, tl.load(part, mask=ok) + dy * xhat, mask=ok)
    elif BUG == "dw through fp16":  # Liger-Kernel's "llama" casting mode: each row's dy * xhat rounded to fp16
        tl.atomic_add(dw_ptr + cols, (dy * xhat).to(tl.float16).to(tl.float32), mask=ok)
    else:
        tl.atomic_add(dw_ptr + cols, dy * xhat, mask=ok)
        if BUG == "dw twice":
            tl.atomic_add(dw_ptr + cols, dy * xhat, mask=ok)


def _buggy_rmsnorm_backward(bug: str):
    def rmsnorm_backward(dy, x, weight, rstd, dx, dw):
        n_rows, n_cols = x.shape
        shared = bug == "partial rows shared, no lock"
        target = torch.zeros((SHARED_PARTS, n_cols), device=x.device) if shared else dw.zero_()
        _rmsnorm_bwd_bug_kernel[(n_rows,)](dy, x, weight, rstd, dx, target, n_cols, dy.stride(0), x.stride(0),
                                           dx.stride(0), BUG=bug, BLOCK_N=triton.next_power_of_2(n_cols))
        if shared:
            l08.sum_rows(target, dw)
    return rmsnorm_backward


def test_buggy_rmsnorm_backward_without_bug_passes():
    check("08.rmsnorm_backward", _buggy_rmsnorm_backward("none"), seed=SEED, quiet=True)


@pytest.mark.parametrize("bug, says", [
    ("no mean term", "the mean's gradient term is missing from dx"),
    ("mean over the block", "the mean divides by the block size 64, not by hidden = 48"),
    ("no outer rstd", "dx lacks the outer rstd"),
    ("dw twice", "dw summed twice"),
    ("dw stored, not added", "dw not summed across all rows"),
])
def test_rmsnorm_backward_mistakes_are_named(bug, says):
    if bug == "dw stored, not added" and not current().gpu:
        # the interpreter sees each program store over the previous one's dw: a race, named as such first
        failure("08.rmsnorm_backward", _buggy_rmsnorm_backward(bug), "stored other values over bytes of `dw`",
                "tl.atomic_add", seed=SEED)
        return
    failure("08.rmsnorm_backward", _buggy_rmsnorm_backward(bug), "likely mistake", says, seed=SEED)


@pytest.mark.parametrize("seed", [0, 1])
def test_rmsnorm_backward_whose_dw_went_through_fp16_is_told_so_alone(seed):
    """On the case of one fp16 row only dw differs: dx's mistakes matched the right dx within its loose
    tolerance, and "dw not summed across all rows" was said of one row."""
    message = str(failure("08.rmsnorm_backward", _buggy_rmsnorm_backward("dw through fp16"), "went through fp16",
                          seed=seed))
    for wrong in ("not summed", "mean's gradient", "outer rstd", "block size"):
        assert wrong not in message, message


@interpreter_only_because("the interpreter's guard sees the race; a GPU's outcome depends on timing")
def test_rmsnorm_backward_sharing_partial_rows_without_a_lock_fails():
    """Rows past 256 share a partial row: a plain load, add and store of it is a race between programs."""
    failure("08.rmsnorm_backward", _buggy_rmsnorm_backward("partial rows shared, no lock"), "300 rows x hidden 16",
            "had stored with a plain tl.store", seed=SEED)


# --- wrong SwiGLU backwards -------------------------------------------------------------------

@triton.jit
def _silu_bwd_bug_kernel(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, BUG: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    dh = tl.load(dh_ptr + offs, mask=ok).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=ok).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=ok).to(tl.float32)
    s = tl.sigmoid(g)
    if BUG == "silu' = sigmoid":
        dsilu = s
    elif BUG == "sigmoid' = s":
        dsilu = s + g * s
    else:
        dsilu = s + g * s * (1.0 - s)
    tl.store(dg_ptr + offs, (dh * u * dsilu).to(dg_ptr.dtype.element_ty), mask=ok)
    tl.store(du_ptr + offs, (dh * g * s).to(du_ptr.dtype.element_ty), mask=ok)


def _buggy_silu_backward(bug: str):
    def silu_mul_backward(dh, g, u, dg, du):
        n = g.numel()
        _silu_bwd_bug_kernel[(triton.cdiv(n, 1024),)](dh, g, u, dg, du, n, BUG=bug, BLOCK=1024)
    return silu_mul_backward


def test_buggy_silu_backward_without_bug_passes():
    check("08.silu_mul_backward", _buggy_silu_backward("none"), seed=SEED, quiet=True)


@pytest.mark.parametrize("bug", ["silu' = sigmoid", "sigmoid' = s"])
def test_silu_backward_mistakes_are_named(bug):
    failure("08.silu_mul_backward", _buggy_silu_backward(bug), "likely mistake", "sigmoid' wrong", seed=SEED)


# --- wrong cross-entropies --------------------------------------------------------------------

@triton.jit
def _ce_bug_kernel(logits_ptr, targets_ptr, loss_ptr, dlogits_ptr, n_rows, n_cols, stride_l, stride_d,
                   BUG: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    offs_r = tl.arange(0, BLOCK_R)
    all_t = tl.load(targets_ptr + offs_r, mask=offs_r < n_rows, other=-100)
    n = tl.maximum(tl.sum((all_t != -100).to(tl.float32), axis=0), 1.0)
    if BUG == "divided by all rows":
        n = n_rows * 1.0
    if BUG == "not divided":
        n = 1.0
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    x = tl.load(logits_ptr + row * stride_l + cols, mask=ok, other=float("-inf")).to(tl.float32)
    t = tl.load(targets_ptr + row)
    m = tl.max(x, axis=0)
    if BUG == "base 2":
        lse = m + tl.log2(tl.sum(tl.exp2(x - m), axis=0))
        p = tl.exp2(x - lse)
    else:
        lse = m + tl.log(tl.sum(tl.exp(x - m), axis=0))
        p = tl.exp(x - lse)
    x_t = tl.load(logits_ptr + row * stride_l + tl.where(t == -100, 0, t)).to(tl.float32)
    keep = (t != -100) | (BUG == "ignored not zeroed")
    tl.store(loss_ptr + row, tl.where(keep, lse - x_t, 0.0))
    grad = tl.where(keep, (p - tl.where(cols == t, 1.0, 0.0)) / n, 0.0)
    tl.store(dlogits_ptr + row * stride_d + cols, grad.to(dlogits_ptr.dtype.element_ty), mask=ok)


def _buggy_cross_entropy(bug: str):
    def cross_entropy(logits, targets, loss, dlogits):
        n_rows, n_cols = logits.shape
        _ce_bug_kernel[(n_rows,)](logits, targets, loss, dlogits, n_rows, n_cols, logits.stride(0),
                                  dlogits.stride(0), BUG=bug, BLOCK_R=triton.next_power_of_2(n_rows),
                                  BLOCK_N=triton.next_power_of_2(n_cols))
    return cross_entropy


def test_buggy_cross_entropy_without_bug_passes():
    check("08.cross_entropy", _buggy_cross_entropy("none"), seed=SEED, quiet=True)


@pytest.mark.parametrize("bug, says", [
    ("not divided", "gradient not divided by the non-ignored count"),
    ("divided by all rows", "divided by all"),
    ("ignored not zeroed", "ignore_index rows not zeroed"),
    ("base 2", "log-sum-exp in base 2"),
])
def test_cross_entropy_mistakes_are_named(bug, says):
    failure("08.cross_entropy", _buggy_cross_entropy(bug), "likely mistake", says, seed=SEED)


def test_all_ignored_targets_give_zero_loss_and_gradient():
    logits = torch.randn(4, 300, device=DEVICE)
    loss = torch.full((4,), float("nan"), device=DEVICE)
    dlogits = torch.full((4, 300), float("nan"), device=DEVICE)
    l08.cross_entropy(logits, torch.full((4,), -100, device=DEVICE), loss, dlogits)
    assert torch.equal(loss, torch.zeros_like(loss)) and torch.equal(dlogits, torch.zeros_like(dlogits))


@pytest.mark.parametrize("scale", [1.0, 2.5, 0.0])
def test_cross_entropy_function_scales_by_dloss(scale):
    """The loss's backward leaves the gradient as the forward wrote it when dL/dloss is 1, and scales it
    in place otherwise (read on the device, not skipped when it is not 1)."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 700, generator=gen) * 3).to(DEVICE)
    targets = torch.tensor([1, -100, 3, 699, 512, 0], device=DEVICE)
    ours = logits.clone().requires_grad_()
    loss = l08.CrossEntropyFunction.apply(ours, targets)
    (loss * scale).backward()
    ref = logits.clone().requires_grad_()
    want = torch.nn.functional.cross_entropy(ref, targets, ignore_index=-100)
    (want * scale).backward()
    torch.testing.assert_close(loss.detach(), want.detach())
    torch.testing.assert_close(ours.grad, ref.grad)


@pytest.mark.parametrize("scale", [1.0, 2.5, 0.0])
def test_linear_cross_entropy_function_matches_autograd(scale):
    """The output layer and the loss in one Function: loss, d hidden and d weight as autograd gives them,
    for any dL/dloss, ignored rows included."""
    gen = torch.Generator().manual_seed(0)
    hidden0 = torch.randn(6, 40, generator=gen).to(DEVICE)
    weight0 = (torch.randn(700, 40, generator=gen) * 0.3).to(DEVICE)
    targets = torch.tensor([1, -100, 3, 699, 512, 0], device=DEVICE)
    hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
    loss = l08.LinearCrossEntropyFunction.apply(hidden, weight, targets)
    (loss * scale).backward()
    ref_h, ref_w = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
    want = torch.nn.functional.cross_entropy(ref_h @ ref_w.T, targets, ignore_index=-100)
    (want * scale).backward()
    torch.testing.assert_close(loss.detach(), want.detach())
    torch.testing.assert_close(hidden.grad, ref_h.grad)
    torch.testing.assert_close(weight.grad, ref_w.grad)


def test_training_loss_keeps_no_logits_for_the_backward():
    """The training step's loss saves gradients of the size of hidden and the output layer's weight, not
    the (tokens, vocab) logits or their gradient: the backward of the whole model runs without them."""
    config = toy_config(small=True)
    ids = torch.randint(config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    model = l08.swap_in_training_kernels(toy_llama(small=True, device=DEVICE).train())
    loss = l08.causal_lm_loss(model, ids, ids)
    saved = loss.grad_fn.saved_tensors
    assert saved, "the loss's backward keeps its gradients"
    shapes = sorted(tuple(t.shape) for t in saved)
    want = sorted([(ids.numel(), config.hidden_size), (config.vocab_size, config.hidden_size)])
    assert shapes == want, shapes


@pytest.mark.parametrize("compiling", [False, True])
def test_silu_mul_function_writes_in_place_only_when_eager(monkeypatch, compiling):
    """Eagerly the backward writes dg, du into the saved g, u (no new tensors); traced by torch.compile it
    writes new buffers, since the compiler copies a graph input before a kernel writes into it."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    gen = torch.Generator().manual_seed(0)
    g0, u0 = torch.randn(5, 300, generator=gen).to(DEVICE), torch.randn(5, 300, generator=gen).to(DEVICE)
    g, u = g0.clone().requires_grad_(), u0.clone().requires_grad_()
    h = l08.SiluMulFunction.apply(g, u)
    saved_g, saved_u = h.grad_fn.saved_tensors  # (5, 300) each: g and u as the forward saved them
    h.backward(torch.ones_like(h))
    ref_g, ref_u = g0.clone().requires_grad_(), u0.clone().requires_grad_()
    (torch.nn.functional.silu(ref_g) * ref_u).backward(torch.ones_like(h))
    torch.testing.assert_close(g.grad, ref_g.grad)
    torch.testing.assert_close(u.grad, ref_u.grad)
    overwritten = not torch.equal(saved_g, g0) and not torch.equal(saved_u, u0)
    assert overwritten is not compiling


# --- wrong autograd Functions -----------------------------------------------------------------

def _forward_kernel(x, weight, eps):
    """The given forward kernel on x's rows: (rows (rows, hidden) view of x, y, rstd (rows,) fp32)."""
    rows = x.reshape(-1, x.shape[-1])
    y, rstd = torch.empty_like(rows), torch.empty(rows.shape[0], device=x.device)
    l08.rmsnorm_forward(rows, weight, eps, y, rstd)
    return rows, y, rstd


class _SavesXhat(torch.autograd.Function):
    """Right values, but the forward keeps a copy of x, a second (rows, hidden) tensor."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rows, y, rstd = _forward_kernel(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd, rows.clone())
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd, _ = ctx.saved_tensors
        rows = x.reshape(-1, x.shape[-1])
        dx, dw = torch.empty_like(rows), torch.empty(rows.shape[1])
        l08.rmsnorm_backward(dy.reshape(rows.shape).contiguous(), rows, weight, rstd, dx, dw)
        return dx.view(x.shape), dw.to(weight.dtype), None


class _InTorch(torch.autograd.Function):
    """Right values and the right saved tensors, computed with PyTorch: no kernel of the student's."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x.float() * rstd[..., None] * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        xhat, wdy = x.float() * rstd[..., None], dy.float() * weight.float()
        dx = (wdy - xhat * (wdy * xhat).mean(-1, keepdim=True)) * rstd[..., None]
        dw = (dy.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class _BackwardInTorch(_InTorch):
    """The forward on the kernel, the backward in PyTorch: half of it is not the student's kernels."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        _, y, rstd = _forward_kernel(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd.view(x.shape[:-1]))
        return y.view(x.shape)


def test_rmsnorm_train_mistakes_are_named():
    failure("08.rmsnorm_train", lambda x, weight, eps: _InTorch.apply(x, weight, eps),
            "no Triton kernel was launched", seed=SEED)
    failure("08.rmsnorm_train", lambda x, weight, eps: _BackwardInTorch.apply(x, weight, eps),
            "the backward launched no Triton kernel", seed=SEED)
    failure("08.rmsnorm_train", lambda x, weight, eps: _SavesXhat.apply(x, weight, eps),
            "keeps a (rows, hidden) tensor besides x", seed=SEED)
    failure("08.rmsnorm_train", lambda x, weight, eps: l08.rmsnorm_train(x, weight, eps).detach(),
            "a torch.autograd.Function", seed=SEED)


# --- the training step ------------------------------------------------------------------------

def test_training_step_matches_hugging_face():
    """The small toy Llama with our RMSNorm, SwiGLU and cross-entropy: HF's loss and every gradient."""
    vocab = toy_config(small=True).vocab_size
    ids = torch.randint(vocab, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    labels = ids.clone()
    labels[0, :3] = -100  # ignored positions count in neither loss nor gradient
    reference = toy_llama(small=True, device=DEVICE).train()
    ours = l08.swap_in_training_kernels(toy_llama(small=True, device=DEVICE).train())
    assert isinstance(ours.model.norm, l08.RMSNormTrain)
    loss_ref = reference(input_ids=ids, labels=labels, use_cache=False).loss
    loss_ref.backward()
    loss = l08.causal_lm_loss(ours, ids, labels)
    loss.backward()
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    named = dict(ours.named_parameters())
    assert len(named) == len(dict(reference.named_parameters()))
    for name, p in reference.named_parameters():
        torch.testing.assert_close(named[name].grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_memory_target_counts_what_both_sides_hold():
    """A kernel that allocates nothing (dlogits written into the logits) is not 'infinitely' leaner: the
    ratio compares what the GPU holds at the peak, the 500 MiB of logits included (the bench's rule)."""
    from course_utils.bench import Table
    from course_utils.benches.l08_backward_passes import _memory_target

    table = Table("08")
    table.fact("peak MiB ce triton (ours)", "0")
    table.fact("peak MiB ce torch eager", "3000")
    _memory_target(table, "ce", "peak MiB ce ", "triton (ours)", "torch eager", 1.0, held_mib=500.0)
    _memory_target(table, "ce", "peak MiB ce ", "torch eager", "triton (ours)", 1.0, held_mib=500.0)
    lean, heavy = table.targets
    assert lean.ratio == pytest.approx(7.0) and lean.met
    assert heavy.ratio == pytest.approx(1 / 7.0) and not heavy.met


@pytest.mark.parametrize("programs, block_m, num_warps", [(1, 1, 4), (2, 2, 4), (5, 4, 8)])
def test_rmsnorm_backward_launch_options_keep_the_values(programs, block_m, num_warps):
    """The bench sweeps the backward's launch (programs, rows per step, warps): every one computes the same."""
    gen = torch.Generator().manual_seed(3)
    x, dy = torch.randn(23, 96, generator=gen).to(DEVICE), torch.randn(23, 96, generator=gen).to(DEVICE)
    w = (torch.rand(96, generator=gen) + 0.5).to(DEVICE)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6)
    dx, dw = torch.empty_like(x), torch.empty(96, device=DEVICE)
    l08.rmsnorm_backward(dy, x, w, rstd, dx, dw, programs=programs, block_m=block_m, num_warps=num_warps)
    dx_ref, dw_ref = l08.rmsnorm_backward_ref(dy, x, w, rstd)
    torch.testing.assert_close(dx, dx_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dw, dw_ref, atol=1e-4, rtol=1e-5)


def test_bench_times_the_backward_stages_apart_and_checks_them(monkeypatch):
    """Bench 08's rows "backward stage one/two alone" launch the stage-one kernel and sum_rows as the host
    function does, at 1 and 8 programs per SM, and check dx and dw before they are timed."""
    from course_utils.bench import Table
    from course_utils.benches import l08_backward_passes as bench08

    device = current().device
    monkeypatch.setattr(bench08, "DEVICE", device)

    def call_once(self, group, name, fn, *, n_bytes=None, flops=None, graph=False, rep_ms=100):
        fn()
        return self.add(group, name, 1.0, n_bytes=n_bytes, flops=flops)

    monkeypatch.setattr(Table, "time", call_once)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(23, 96, generator=gen).to(device, torch.float16)
    dy = torch.randn(23, 96, generator=gen).to(device, torch.float16)
    w = (torch.rand(96, generator=gen) + 0.5).to(device, torch.float16)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    table = Table("08")
    dx, dw = torch.empty_like(x), torch.empty(96, device=device)
    bench08._backward_stages(table, "g", x, w, dy, rstd, dx, dw, 2)
    bench08._backward_registers(table, x, w, dy, rstd, dx, 2)  # interpreter: a note
    assert "rmsnorm_backward_registers" in table.facts or table.notes == [
        "rmsnorm backward registers: not compiled (interpreter)"]
    assert [r.name for r in table.rows] == ["triton (ours) backward stage one alone, 1/SM",
                                            "triton (ours) backward stage two alone, 1/SM",
                                            "triton (ours) backward stage two alone, 1/SM, 256-column strips",
                                            "triton (ours) backward stage one alone, 8/SM",
                                            "triton (ours) backward stage two alone, 8/SM"]


def test_the_benchs_copy_kernels_are_the_copies_of_a_profiled_step():
    """Fact step_copies counts Inductor's clone/copy_ kernels and the runtime's device copies of a profiled
    step, not the kernels that compute (`_to_copy` is a dtype conversion; a clone fused into arithmetic
    computes), and sums their time against the whole step's."""
    from course_utils.bench import Table
    from course_utils.benches import l08_backward_passes as bench08

    kernels = [("triton_poi_fused_as_strided_clone_0", 350.0), ("rmsnorm_backward_kernel", 120.0),
               ("Memcpy DtoD (Device -> Device)", 50.0), ("triton_poi_fused_copy__7", 25.0),
               ("sm90_xmma_gemm_bf16bf16_bf16f32", 900.0), ("triton_poi_fused_as_strided_clone_0", 350.0),
               ("triton_poi_fused__to_copy_add_embedding_0", 80.0),  # a dtype conversion, not a copy
               ("triton_poi_fused__to_copy_add_bmm_cat_clone_cos_mul_neg_sin_3", 60.0),  # computes
               ("triton_poi_fused__to_copy_1", 20.0)]
    count, copy_us, total_us, names = bench08.copy_kernels(kernels)
    assert (count, copy_us, total_us) == (4, 775.0, 1955.0)
    assert names == {"triton_poi_fused_as_strided_clone_0": (2, 700.0),
                     "Memcpy DtoD (Device -> Device)": (1, 50.0), "triton_poi_fused_copy__7": (1, 25.0)}
    assert list(names)[0] == "triton_poi_fused_as_strided_clone_0"  # the longest first
    table = Table("08")
    bench08._step_copies(table, {"ours": kernels, "peer": kernels[1:2]})
    fact = table.facts["step_copies"]
    assert fact.startswith("ours: 4 copy kernels, 0.775 ms of 1.955 ms of GPU work a step "
                           "(`triton_poi_fused_as_strided_clone_0` 2 x, 0.700 ms, ")
    assert "peer: 0 copy kernels, 0.000 ms of 0.120 ms" in fact


def test_cross_entropy_writing_dlogits_rows_as_contiguous_fails_in_place_on_a_slice():
    """dlogits at row * n_cols: right when dlogits is contiguous (every out-of-place case) and when it is a
    contiguous logits (the in-place case); wrong on a padded vocabulary's slice, in place."""
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ("dlogits_row = dlogits_ptr + row * stride_dm", "dlogits_row = dlogits_ptr + row * n_cols"))
    failure("08.cross_entropy", wrong, "dlogits IS logits, and logits a slice of a wider tensor",
            *(("address it with dlogits.stride(0)",) if current().interpret else ()))


def test_rmsnorm_backward_writing_dx_rows_as_contiguous_fails_on_padded_rows():
    """dx at row * n_cols: right for every contiguous dx; wrong where dx's rows are padded."""
    wrong = mutant("l08_backward_passes", "rmsnorm_backward",
                   ("dx_ptr + rows[:, None] * stride_dxm", "dx_ptr + rows[:, None] * n_cols"))
    failure("08.rmsnorm_backward", wrong, "dx's rows padded")


def test_cross_entropy_ignoring_class_zero_is_named():
    """Only -100 is ignored: a kernel (and count) that skips targets <= 0 fails on the case that holds
    class 0, and the message says what it did."""
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ("    if target == ignore_index:  # ignored row", "    if target <= 0:  # ignored row"),
                   ("acc += (t != ignore_index).to(tl.float32)", "acc += (t > 0).to(tl.float32)"))
    failure("08.cross_entropy", wrong, "targets 0 and", "class 0 were treated as ignored")


def test_cross_entropy_counting_only_the_first_block_of_targets_fails():
    """A count of the non-ignored targets over one block of 1024 rows, no loop: the case of more rows."""
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ("for r0 in range(0, n_rows, BLOCK):", "for r0 in range(0, BLOCK, BLOCK):"))
    failure("08.cross_entropy", wrong, "more than a block of 1024")


def test_attention_backward_of_many_heads_fits_a_gpu_grid(monkeypatch):
    """(3, 30000, 200, 32): the grids (key or query tiles, B * H) put 90000 programs on axis 1, where a GPU
    holds 65535; the interpreter has no such limit, so the launches are recorded here instead of run."""
    launches = {name: recorded_launches(monkeypatch, l08, name)
                for name in ("attention_delta_kernel", "attention_dkdv_kernel", "attention_dq_kernel")}
    B, H, S, D = 3, 30000, 200, 32
    t = torch.empty((B, H, S, D), device="meta")
    l08.attention_backward(t, t, t, t, torch.empty((B, H, S), device="meta"), t, t, t, t, causal=True)
    for name, block in (("attention_dkdv_kernel", "BLOCK_N"), ("attention_dq_kernel", "BLOCK_M")):
        ((grid, _),) = launches[name]
        for size in (32, 64, 128):  # the autotuner's tiles
            programs = grid({block: size})
            assert all(n <= 65535 for n in programs[1:]), programs
            assert math.prod(programs) == triton.cdiv(S, size) * B * H, (name, programs)


def test_attention_backward_over_the_first_128_queries_only_fails():
    """dk and dv from the query tiles of the first 128 queries only, what a kernel with 128-query tiles
    and no loop computes: the CPU's case of 150 queries catches it."""
    wrong = mutant("l08_backward_passes", "attention_backward",
                   ("    for start_m in range(lo, hi, BLOCK_M):",
                    "    for start_m in range(lo, tl.minimum(hi, 128), BLOCK_M):"))
    failure("08.attention_backward", wrong, "more than one tile of 128")


def test_rmsnorm_train_around_the_courses_function_is_refused(refuse_course_solutions):
    """Returning the course's own RMSNormFunction: its forward launches the given forward kernel (allowed,
    no solution in it), its backward the course's rmsnorm_backward_kernel, which is refused by name."""
    failure("08.rmsnorm_train", lambda x, weight, eps: l08.RMSNormFunction.apply(x, weight, eps),
            "the backward: your function launches `rmsnorm_backward_kernel`, the course's solution")


class _TorchForward(torch.autograd.Function):
    """y computed with torch on the host, the forward kernel launched beside it as cover."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        _, _, rstd = _forward_kernel(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        return l08.RMSNormFunction.backward(ctx, dy)


class _CopyInAList(torch.autograd.Function):
    """The course's function, but the forward also keeps y in a list on ctx: a (rows, hidden) copy all the
    same."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        y = l08.RMSNormFunction.forward(ctx, x, weight, eps)
        ctx.cache = {"rows": [y.clone()]}
        return y

    @staticmethod
    def backward(ctx, dy):
        return l08.RMSNormFunction.backward(ctx, dy)


def test_rmsnorm_train_computing_y_with_torch_beside_the_kernel_is_refused():
    failure("08.rmsnorm_train", lambda x, w, eps: _TorchForward.apply(x, w, eps),
            "computed with torch operations on the host (aten.")


class _NumpyForward(torch.autograd.Function):
    """y computed in NumPy from x.numpy(), the forward kernel launched beside it as cover; the backward in
    NumPy from dy.numpy() the same way, beside the backward kernels."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        _, _, rstd = _forward_kernel(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        rows = x.detach().cpu().numpy().astype("float64")
        y = rows / ((rows ** 2).mean(-1, keepdims=True) + eps) ** 0.5 * weight.detach().cpu().numpy()
        return torch.from_numpy(y).to(x.dtype).to(x.device)

    @staticmethod
    def backward(ctx, dy):
        dx, dw, _ = l08.RMSNormFunction.backward(ctx, dy)
        dy.detach().cpu().numpy()
        return dx, dw, None


def test_rmsnorm_train_computing_y_in_numpy_beside_the_kernel_is_refused():
    failure("08.rmsnorm_train", lambda x, w, eps: _NumpyForward.apply(x, w, eps),
            "read tensor data into Python/NumPy on the host (Tensor.numpy)")


def test_rmsnorm_train_reading_dy_in_numpy_in_the_backward_is_refused():
    class _NumpyBackward(_NumpyForward):
        forward = staticmethod(l08.RMSNormFunction.forward)

    failure("08.rmsnorm_train", lambda x, w, eps: _NumpyBackward.apply(x, w, eps),
            "the backward read tensor data into Python/NumPy on the host (Tensor.numpy)")


def test_rmsnorm_train_keeping_a_copy_in_a_list_on_ctx_is_named():
    failure("08.rmsnorm_train", lambda x, w, eps: _CopyInAList.apply(x, w, eps),
            "keeps a (rows, hidden) tensor")


class _Holder:
    def __init__(self, kept):
        self.kept = kept


# Ways to keep a (rows, hidden) copy where a look at ctx's tensors, lists and dicts does not find it
_HIDDEN_COPIES = {
    "in halves": lambda copy: list(copy.view(-1).chunk(2)),  # two tensors of rows * hidden / 2 elements
    "in an object": lambda copy: _Holder(copy),
    "in a closure": lambda copy: (lambda: copy),
    "as a storage": lambda copy: copy.untyped_storage(),
}


@pytest.mark.parametrize("how", sorted(_HIDDEN_COPIES))
def test_rmsnorm_train_keeping_a_hidden_copy_is_judged_by_the_memory_kept(how):
    """The course's function, whose forward also keeps a (rows, hidden) copy, hidden: judged by the bytes the
    autograd node keeps alive (13 x 781 fp32: 40664 bytes, 3128 a row), not by the tensors on ctx."""
    class Keeps(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            y = l08.RMSNormFunction.forward(ctx, x, weight, eps)
            ctx.hidden = _HIDDEN_COPIES[how](y.clone())
            return y

        @staticmethod
        def backward(ctx, dy):
            return l08.RMSNormFunction.backward(ctx, dy)

    failure("08.rmsnorm_train", lambda x, w, eps: Keeps.apply(x, w, eps), "bytes a row, where rstd takes 4")


_KEPT_GLOBALLY: list = []
_KEPT_BY_CTX: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Ways to keep the copy where nothing reachable from ctx holds it
_COPIES_OUTSIDE_CTX = {
    "in a module's list": lambda ctx, copy: _KEPT_GLOBALLY.append(copy),
    "in a WeakKeyDictionary keyed by ctx": lambda ctx, copy: _KEPT_BY_CTX.__setitem__(ctx, copy.view(-1)),
}


@pytest.mark.parametrize("how", sorted(_COPIES_OUTSIDE_CTX))
def test_rmsnorm_train_keeping_a_copy_outside_ctx_is_judged_by_the_memory_kept(how):
    """The copy of x-hat kept where a search from ctx never goes (it follows no module globals): still memory
    the forward made and something holds once it returned."""
    class KeepsOutside(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            y = l08.RMSNormFunction.forward(ctx, x, weight, eps)
            _COPIES_OUTSIDE_CTX[how](ctx, y.clone())
            return y

        @staticmethod
        def backward(ctx, dy):
            return l08.RMSNormFunction.backward(ctx, dy)

    try:
        failure("08.rmsnorm_train", lambda x, w, eps: KeepsOutside.apply(x, w, eps),
                "made by the forward and held outside ctx", "bytes a row, where rstd takes 4")
    finally:
        _KEPT_GLOBALLY.clear()


def test_rmsnorm_train_check_shows_the_student_no_warning_of_its_own(recwarn):
    """Its search of every live object for memory the forward kept once asked each object isinstance, and
    torch's deprecated `distributed.reduce_op` answers that with a FutureWarning in the student's notebook."""
    check("08.rmsnorm_train", l08.rmsnorm_train, seed=0, quiet=True)
    assert [str(w.message) for w in recwarn if "reduce_op" in str(w.message)] == []


def test_rmsnorm_train_ignoring_dys_strides_fails_on_the_transposed_gradient():
    wrong = mutant("l08_backward_passes", "rmsnorm_train",
                   ("dy_rows = dy.reshape(rows.shape).contiguous()", "dy_rows = dy.reshape(rows.shape)"))
    failure("08.rmsnorm_train", wrong, "dy transposed")


def test_rmsnorm_train_on_a_transposed_x_matches_autograd(on_the_device):
    """A column-major x: the kernels read a row's elements as consecutive, so rmsnorm_train must make the rows
    contiguous first (read as rows, the transposed view gave values off by up to 1e36)."""
    x = torch.randn(48, 13).t().requires_grad_()  # (13, 48), strides (1, 13)
    weight = (torch.rand(48) + 0.5).requires_grad_()
    dy = torch.randn(13, 48)
    l08.rmsnorm_train(x, weight, 1e-6).backward(dy)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    y64.backward(dy.double())
    y = l08.rmsnorm_train(x, weight, 1e-6)
    torch.testing.assert_close(y.double(), y64.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weight.grad.double(), w64.grad, atol=1e-5, rtol=1e-5)


def test_rmsnorm_train_reading_a_transposed_x_as_rows_fails():
    wrong = mutant("l08_backward_passes", "rmsnorm_train",
                   ("rows = x.reshape(-1, x.shape[-1]).contiguous()", "rows = x.reshape(-1, x.shape[-1])"))
    failure("08.rmsnorm_train", wrong, "x transposed")


def test_given_kernels_of_the_lesson_are_not_refused_as_solutions(refuse_course_solutions):
    """A kernel the exercise notebook gives (no solution block in it: count_targets_kernel, the forward
    RMSNorm) may be launched from the course's module; a kernel with the answer in it may not."""
    from course_utils.grading.provenance import course_solution

    module = "course_utils.lessons.l08_backward_passes"
    for given in ("count_targets_kernel", "rmsnorm_forward_kernel", "sum_rows_kernel",
                  "attention_delta_kernel"):
        assert course_solution("08.cross_entropy", None, [(given, module)]) is None, given
    for answer in ("cross_entropy_kernel", "rmsnorm_backward_kernel", "attention_dkdv_kernel"):
        refusal = course_solution("08.cross_entropy", None, [(answer, module)])
        assert "the course's solution" in refusal, answer


@pytest.mark.parametrize("launch", ["x.stride(0), x.stride(0), dx.stride(0)",
                                    "dy.stride(0), dy.stride(0), dx.stride(0)"])
def test_rmsnorm_backward_reading_dy_and_x_with_one_stride_fails(launch):
    """One row stride for both inputs: the case whose x and dy are slices of tensors of different widths
    catches it (every other case gives them one stride), and the message points at the strides."""
    wrong = mutant("l08_backward_passes", "rmsnorm_backward",
                   ("dy.stride(0), x.stride(0), dx.stride(0)", launch))
    failure("08.rmsnorm_backward", wrong, "row strides", "own stride")


def test_rmsnorm_backward_with_dy_read_at_xs_stride_is_not_called_a_reduction_mistake():
    wrong = mutant("l08_backward_passes", "rmsnorm_backward",
                   ("dy.stride(0), x.stride(0), dx.stride(0)", "x.stride(0), x.stride(0), dx.stride(0)"))
    message = str(failure("08.rmsnorm_backward", wrong, "dx and dw are both wrong", seed=0))
    assert "dw not summed across all rows" not in message, message


# --- mistakes that passed every case before (a second review of the checks) ----------------------

@interpreter_only_because("a GPU's sequences shorter than 1024 take its first tile, 64 x 64, for both kernels")
@pytest.mark.parametrize("edits, says", [
    ([("diagonal_end = tl.minimum(lo + tl.cdiv(start_n + BLOCK_N - lo, BLOCK_M) * BLOCK_M, S)",
       "diagonal_end = tl.minimum(lo + BLOCK_M, S)")], "differ beyond"),
    ([("full_end, tl.minimum(start_m + BLOCK_M, S), True", "full_end, tl.minimum(full_end + BLOCK_N, S), True")],
     "differ beyond"),
    ([('attention_dkdv_kernel[lambda meta: (triton.cdiv(S, meta["BLOCK_N"])',
       'attention_dkdv_kernel[lambda meta: (triton.cdiv(S, meta["BLOCK_M"])'),
      ('attention_dq_kernel[lambda meta: (triton.cdiv(S, meta["BLOCK_M"])',
       'attention_dq_kernel[lambda meta: (triton.cdiv(S, meta["BLOCK_N"])')], "out of bounds")],
    ids=["dkdv diagonal of one query tile", "dq diagonal of one key tile", "grids with the two blocks swapped"])
def test_attention_backward_mixing_up_the_two_block_sizes_fails(edits, says):
    """Right while BLOCK_M == BLOCK_N, as the interpreter's one 16 x 16 tile was: its tiles are now uneven, as
    most of a GPU's autotuner's are (the ones its long sequences take)."""
    failure("08.attention_backward", mutant("l08_backward_passes", "attention_backward", *edits), says)


def test_attention_backward_whose_grid_leaves_out_the_batch_fails():
    wrong = mutant("l08_backward_passes", "attention_backward",
                   ('(triton.cdiv(S, meta["BLOCK_N"]) * B * H,)', '(triton.cdiv(S, meta["BLOCK_N"]) * H,)'),
                   ('(triton.cdiv(S, meta["BLOCK_M"]) * B * H,)', '(triton.cdiv(S, meta["BLOCK_M"]) * H,)'))
    failure("08.attention_backward", wrong, "every (batch, head) pair its own programs", "never written")


def test_rmsnorm_train_without_eps_fails():
    wrong = mutant("l08_backward_passes", "rmsnorm_train",
                   ("rmsnorm_forward(rows, weight, eps, y, rstd)", "rmsnorm_forward(rows, weight, 0.0, y, rstd)"))
    failure("08.rmsnorm_train", wrong, "eps = 0.1")


def test_silu_backward_with_exp_over_one_plus_exp_fails_where_exp_overflows():
    wrong = mutant("l08_backward_passes", "silu_mul_backward",
                   ("    s = tl.sigmoid(g)  # recomputed", "    s = tl.exp(g) / (1.0 + tl.exp(g))  # recomputed"))
    if current().interpret:
        failure("08.silu_mul_backward", wrong, "g spread to +-300", "NaN")
    else:  # a GPU's fast exp already puts the quotient a few units in the last place off at +-30
        failure("08.silu_mul_backward", wrong, "g spread to +-30: sigmoid saturates", "differ beyond",
                "use tl.sigmoid")


def test_cross_entropy_with_the_first_blocks_max_as_the_rows_fails_on_a_late_outlier():
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ("            m_new = tl.maximum(m, x)\n", "            m_new = tl.maximum(m, tl.max(x0, axis=0))\n"),
                   ('        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)',
                    '        m = tl.full((BLOCK_N,), float("-inf"), tl.float32)\n'
                    '        x0 = tl.load(logits_row + offs_n, mask=offs_n < n_cols, other=float("-inf")).to(tl.float32)'))
    failure("08.cross_entropy", wrong, "one logit of 120 in each row's last block")


def test_silu_backward_loading_u_after_storing_du_fails_in_place():
    """Right with separate buffers; in place (du is u, as the training step calls it) the u it loads after
    storing du is already the gradient."""
    load_u = "    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)\n"
    store_du = "    tl.store(du_ptr + offs, (dh * silu).to(du_ptr.dtype.element_ty), mask=mask)\n"
    wrong = mutant("l08_backward_passes", "silu_mul_backward", (load_u, ""), (store_du, store_du + load_u))
    failure("08.silu_mul_backward", wrong, "dg IS g and du IS u (in place", "`dg`")


def test_cross_entropy_reading_the_target_logit_after_the_gradient_overwrote_it_fails_in_place():
    """Right with separate buffers, wrong in place (the training step's call, dlogits = logits): the loss read
    logits[target] after pass 2 had stored the gradient there (a training run's losses 7.78 for 6.74)."""
    loss = ("        x_t = tl.load(logits_row + target).to(tl.float32)\n"
            "        tl.store(loss_ptr + row, lse - x_t)\n")
    grad = "            tl.store(dlogits_row + cols, grad.to(dlogits_ptr.dtype.element_ty), mask=cols < n_cols)\n"
    wrong = mutant("l08_backward_passes", "cross_entropy", (loss, ""), (grad, grad + loss))
    failure("08.cross_entropy", wrong, "dlogits IS logits (in place", "`loss`")


# --- mistakes that passed every case before (a third review of the checks) -----------------------

def test_attention_backward_whose_non_causal_loops_keep_the_causal_bounds_fails():
    """Non-causal loops over the query tiles from the key tile's own on (dk, dv) and over the key tiles up
    to the query tile's own (dq), the causal bounds without the mask, in tiles of 64: every non-causal case
    of the CPU used to fit in one tile (37 queries), so it passed there; the case of 150 catches it."""
    wrong = mutant("l08_backward_passes", "attention_backward",
                   ('bm, bn = {"dkdv": (16, 32), "dq": (32, 16)}[kernel]', "bm, bn = 64, 64"),
                   ("qk_scale, 0, S, False, HEAD_DIM, BLOCK_M)",
                    "qk_scale, start_n // BLOCK_M * BLOCK_M, S, False, HEAD_DIM, BLOCK_M)"),
                   ("0, S, False, EVEN_S, HEAD_DIM, BLOCK_N)",
                    "0, tl.minimum(start_m + BLOCK_M, S), False, EVEN_S, HEAD_DIM, BLOCK_N)"))
    failure("08.attention_backward", wrong, "not causal", "loop over every query tile")


def test_rmsnorm_backward_adding_into_dw_without_zeroing_it_is_told_to_zero_it():
    """tl.atomic_add into the dw the checker hands over, never zeroed: its NaN poison stays NaN, which the
    harness reports as never written; the hint names the missing dw.zero_() (the lesson teaches atomics)."""
    def rmsnorm_backward(dy, x, weight, rstd, dx, dw):
        n_rows, n_cols = x.shape
        _rmsnorm_bwd_bug_kernel[(n_rows,)](dy, x, weight, rstd, dx, dw, n_cols, dy.stride(0), x.stride(0),
                                           dx.stride(0), BUG="none", BLOCK_N=triton.next_power_of_2(n_cols))

    failure("08.rmsnorm_backward", rmsnorm_backward, "`dw`", "tl.atomic_add", "dw.zero_()")



def test_cross_entropy_counting_the_targets_with_torch_is_sent_to_count_targets():
    """n counted on the host with PyTorch, the kernel otherwise right: refused as host arithmetic, and the
    hint names the given count_targets rather than a generic rule."""
    kernel_launch = mutant("l08_backward_passes", "cross_entropy")

    def cross_entropy(logits, targets, loss, dlogits):
        count = (targets != -100).sum().float().reshape(1)
        kernel_launch(logits, targets, loss, dlogits, count=count)

    failure("08.cross_entropy", cross_entropy, "outside your Triton kernel", "count_targets(targets)")


def test_cross_entropy_of_one_block_of_4096_without_a_loop_fails():
    """One block of 4096 columns a row and no loop over the row (both passes): every vocabulary of the CPU's
    cases fitted in it, so it passed there; the case of vocab 32000 catches it (the GPU's cases had it)."""
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ("for n0 in range(0, n_cols, BLOCK_N):", "for n0 in range(0, BLOCK_N, BLOCK_N):"))

    def cross_entropy(logits, targets, loss, dlogits):
        wrong(logits, targets, loss, dlogits, BLOCK_N=4096)

    failure("08.cross_entropy", cross_entropy, "vocab 32000", "never written", "loop over all their blocks")


def test_rmsnorm_train_saving_the_contiguous_rows_of_a_transposed_x_is_told_it_copies_x():
    """ctx.save_for_backward(rows, ...) with rows = x.reshape(-1, hidden).contiguous(): x itself while x is
    contiguous, a copy of it for the transposed x. The message says that it is a copy of x, and to save x."""
    wrong = mutant("l08_backward_passes", "rmsnorm_train",
                   ("ctx.save_for_backward(x, weight, rstd)  # x and weight",
                    "ctx.save_for_backward(rows, weight, rstd)  # x and weight"),
                   ("        x, weight, rstd = ctx.saved_tensors\n",
                    "        x, weight, rstd = ctx.saved_tensors\n        x = x.view(dy.shape)\n"))
    failure("08.rmsnorm_train", wrong, "x transposed", "a contiguous copy of x", "save x itself")


# --- a fourth review: mistakes that are exact until exp() underflows -------------------------------

def test_cross_entropy_whose_running_max_starts_at_zero_fails_on_logits_near_minus_120():
    """m = 0 instead of -inf to start: max(0, logits) is as good a shift as the row max while some logit of
    each row is above -88, as in every other case; where every logit is near -120, exp(x - 0) is 0 for all
    of them and lse = log(0) = -inf."""
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ('m = tl.full((BLOCK_N,), float("-inf"), tl.float32)  # running max',
                    'm = tl.zeros((BLOCK_N,), tl.float32)  # running max'))
    failure("08.cross_entropy", wrong, "every logit near -120", "a running max that starts at -inf, not 0")


# --- a fifth review: state shared between forwards -----------------------------------------------

_LAST_FORWARD: dict = {}


class _BackwardFromGlobals(torch.autograd.Function):
    """Right for one forward followed by its backward; but the backward reads x and rstd from a module global
    that the LAST forward set, not from its own ctx (where they are saved all the same). (x itself: a
    contiguous copy kept there is memory the forward made and something holds, refused earlier.)"""

    @staticmethod
    def forward(ctx, x, weight, eps):
        _, y, rstd = _forward_kernel(x.contiguous(), weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        _LAST_FORWARD.update(x=x, weight=weight, rstd=rstd, shape=x.shape)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = _LAST_FORWARD["x"], _LAST_FORWARD["weight"], _LAST_FORWARD["rstd"]
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        dx, dw = torch.empty_like(rows), torch.empty(rows.shape[1], device=rows.device)
        l08.rmsnorm_backward(dy.reshape(rows.shape).contiguous(), rows, weight, rstd, dx, dw)
        return dx.view(_LAST_FORWARD["shape"]), dw.to(weight.dtype), None


def test_rmsnorm_train_whose_backward_reads_the_last_forwards_globals_fails():
    """Every case used to run one forward and then its backward, so a backward reading the last forward's
    globals passed; a model runs two layers' forwards before their backwards, as the last two cases do."""
    failure("08.rmsnorm_train", lambda x, w, eps: _BackwardFromGlobals.apply(x, w, eps),
            "two forwards before their backwards", "the FIRST forward's x.grad", "never module globals")


_WORKSPACE: dict = {}


@pytest.mark.parametrize("reused, says", [
    ("y", "the second forward wrote into the first forward's output"),
    ("rstd", "not a buffer reused from call to call")])
def test_rmsnorm_train_reusing_a_buffer_from_call_to_call_fails(reused, says):
    """A forward that keeps its y (or rstd) buffer in a module dict, one per shape, and reuses it at every
    call: right for one forward and its backward; the second forward overwrites the first's output (or the
    rstd its ctx saved)."""
    class Reuses(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            rows = x.reshape(-1, x.shape[-1]).contiguous()
            y, rstd = torch.empty_like(rows), torch.empty(rows.shape[0], device=x.device)
            kept = _WORKSPACE.setdefault((reused, rows.shape, rows.dtype), {reused: (y, rstd)[reused == "rstd"]})
            y, rstd = (kept["y"], rstd) if reused == "y" else (y, kept["rstd"])
            l08.rmsnorm_forward(rows, weight, eps, y, rstd)
            ctx.save_for_backward(x, weight, rstd)
            return y.view(x.shape)

        @staticmethod
        def backward(ctx, dy):
            return l08.RMSNormFunction.backward(ctx, dy)

    _WORKSPACE.clear()
    failure("08.rmsnorm_train", lambda x, w, eps: Reuses.apply(x, w, eps), "two forwards before their backwards",
            says)


def test_rmsnorm_train_reshaping_after_apply_is_told_to_reshape_inside_forward():
    """apply(x.reshape(-1, hidden), ...).view(x.shape): right values, but the output's grad_fn is the view's,
    not the Function's, where the check reads what the forward saved; the message says so, instead of a
    bare "return YourFunction.apply" that the student believes they did."""
    class Rows(torch.autograd.Function):
        forward = staticmethod(l08.RMSNormFunction.forward)
        backward = staticmethod(l08.RMSNormFunction.backward)

    failure("08.rmsnorm_train", lambda x, w, eps: Rows.apply(x.reshape(-1, x.shape[-1]), w, eps).view(x.shape),
            "an op on your Function's output (a .view or .reshape after .apply?)", "reshape inside forward")


def test_attention_backward_whose_even_s_path_drops_the_causal_mask_fails():
    """EVEN_S (given: S % 128 == 0) read as "no mask at all", the causal diagonal's included: no case had S a
    multiple of 128, so EVEN_S was never True in the check and this passed; the cases of S = 128 (256 on a
    GPU) catch it."""
    wrong = mutant("l08_backward_passes", "attention_backward",
                   ("        if MASKED:  # j <= i < S also masks the keys past the end\n",
                    "        if MASKED and not EVEN_S:\n"))
    failure("08.attention_backward", wrong, "EVEN_S is True", "causal diagonal still needs its mask")


# --- a sixth review -------------------------------------------------------------------------------

_KEPT_IN_THE_OUTPUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _output_of_a_larger_buffer(ctx, x, y):
    """y returned as the first half of a buffer whose second half keeps a copy (held by a dict keyed by ctx)."""
    n = y.numel()
    buf = torch.empty(2 * n, device=y.device, dtype=y.dtype)
    for half in (buf[:n], buf[n:]):
        flat_copy_kernel[(triton.cdiv(n, 1024),)](y, half, n, BLOCK=1024)
    _KEPT_IN_THE_OUTPUT[ctx] = buf[n:]
    return buf[:n].view(x.shape)


def _xs_storage_grown(ctx, x, y):
    """x's own storage grown (resize_ keeps its values), the copy stored after x's values."""
    n, storage = y.numel(), x.untyped_storage()
    start = storage.nbytes()
    storage.resize_(start + n * y.element_size())
    tail = torch.empty(0, dtype=y.dtype, device=y.device).set_(storage, start // y.element_size(), (n,), (1,))
    flat_copy_kernel[(triton.cdiv(n, 1024),)](y, tail, n, BLOCK=1024)
    return y


# A (rows, hidden) copy kept in a storage that the memory search skips as x's, weight's or the output's own: it
# passed. The rest of such a storage, beyond what its tensor takes (or had before the call), counts.
_COPIES_IN_OWN_STORAGE = {
    "the output a view of a larger buffer": (_output_of_a_larger_buffer,
                                             "bytes more than the output takes: a view of a larger buffer"),
    "x's storage grown": (_xs_storage_grown, "bytes more than x had before the call"),
}


@pytest.mark.parametrize("how", sorted(_COPIES_IN_OWN_STORAGE))
def test_rmsnorm_train_keeping_a_copy_in_a_skipped_storage_is_named(how):
    keep, says = _COPIES_IN_OWN_STORAGE[how]

    class KeepsInOwnStorage(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            return keep(ctx, x, l08.RMSNormFunction.forward(ctx, x, weight, eps))

        @staticmethod
        def backward(ctx, dy):
            return l08.RMSNormFunction.backward(ctx, dy)

    failure("08.rmsnorm_train", lambda x, w, eps: KeepsInOwnStorage.apply(x, w, eps), says,
            "bytes a row, where rstd takes 4")
    # In the batch grader the node stays in the sandbox, and what it keeps comes back as remote.autograd_out
    # reports it: the grader's own stand-in for the output has a storage of its own size.
    x = torch.randn(8, 32, device=DEVICE, requires_grad=True)
    w = (torch.rand(32, device=DEVICE) + 0.5).requires_grad_()
    before = {0: x.untyped_storage().nbytes(), 1: w.untyped_storage().nbytes()}
    y = KeepsInOwnStorage.apply(x, w, 1e-6)
    kept = remote.autograd_out(y.grad_fn, (x, w, 1e-6), y, before, ("x", "weight", "eps"))["kept"]
    assert any(says in what and nbytes == 8 * 32 * 4 for nbytes, what in kept), kept


def test_cross_entropy_zeroing_one_block_of_an_ignored_row_fails():
    """The ignored row's zeros stored over its first block only (no loop in that branch), blocks of 4096: every
    CPU case with an ignored row had a vocabulary of one block, so it passed there; the case of vocab 32000
    whose second row is ignored catches it (the GPU's cases of 32000 with ignored rows did already)."""
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ("        for n0 in range(0, n_cols, BLOCK_N):\n            zero = tl.zeros",
                    "        for n0 in range(0, BLOCK_N, BLOCK_N):\n            zero = tl.zeros"))

    def cross_entropy(logits, targets, loss, dlogits):
        wrong(logits, targets, loss, dlogits, BLOCK_N=4096)

    failure("08.cross_entropy", cross_entropy, "ignored", "never written", "an ignored row's zeros")


class _Fp32Output(torch.autograd.Function):
    """Right values, but y allocated in fp32 whatever x's dtype: an fp16 model's next Linear refuses it."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y, rstd = torch.empty(rows.shape, device=x.device), torch.empty(rows.shape[0], device=x.device)
        l08.rmsnorm_forward(rows, weight, eps, y, rstd)
        ctx.save_for_backward(x, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        return l08.RMSNormFunction.backward(ctx, dy.to(ctx.saved_tensors[0].dtype))


def test_rmsnorm_train_returning_fp32_for_an_fp16_x_fails():
    """y's values were compared, its dtype was not: an fp32 y for an fp16 x passed."""
    failure("08.rmsnorm_train", lambda x, w, eps: _Fp32Output.apply(x, w, eps), "float16",
            "returned a float32 tensor for a float16 x")


@pytest.mark.parametrize("shape", [(13, 1), (2, 7, 1), (13, 2)])
def test_rmsnorm_train_of_one_or_two_columns_may_save_rstd(shape):
    """hidden = 1: the saved rstd (rows,) has rows x hidden elements, as a copy of x would; more than two
    values a row is what counts as a (rows, hidden) tensor kept for the backward."""
    from course_utils.checks import l08_backward_passes as c8
    from course_utils.grading import Case, exercises
    from course_utils.grading.harness import _run_function_case
    from course_utils.grading.provenance import course_solutions_allowed
    from course_utils.lessons.l08_backward_passes import rmsnorm_train

    ex = {e.id: e for e in exercises("08")}["08.rmsnorm_train"]
    gen = torch.Generator().manual_seed(0)
    x = torch.nn.Parameter(torch.randn(shape, generator=gen).to(DEVICE))
    w = torch.nn.Parameter((torch.rand(shape[-1], generator=gen) + 0.5).to(DEVICE))
    dy = torch.randn(shape, generator=gen).to(DEVICE)
    case = Case(f"{shape} float32", (x, w, 1e-6), None, verify=c8._train_verify(x, w, 1e-6, dy))
    with course_solutions_allowed():
        assert _run_function_case(ex, rmsnorm_train, case) == []


def test_cross_entropy_reading_long_rows_at_the_vocabulary_s_stride_fails():
    """Rows past 4096 columns addressed at row * vocab (the stride taken as the row's length): the sliced case's
    vocabulary fits one block of 4096, and the long row was contiguous; it is a slice now."""
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ("    logits_row = logits_ptr + row * stride_lm\n",
                    "    logits_row = logits_ptr + row * tl.where(n_cols > 4096, n_cols, stride_lm)\n"))
    failure("08.cross_entropy", wrong, "slice of a wider tensor")


def test_rmsnorm_backward_with_its_block_capped_at_4096_columns_fails():
    """A row of one block of at most 4096 columns (the layer-norm tutorial's cap), no loop: no case was wider."""
    wrong = mutant("l08_backward_passes", "rmsnorm_backward",
                   ("block_n = triton.next_power_of_2(n_cols)", "block_n = min(triton.next_power_of_2(n_cols), 4096)"))
    failure("08.rmsnorm_backward", wrong, "hidden 4100")


def _course_backward(dy, x, weight, rstd, weight_dtype) -> tuple:
    """A backward's return (dx, dw, None) from the course's backward kernel on x's rows; rstd (rows,)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    dx = torch.empty_like(rows)
    dw = torch.empty(rows.shape[1], device=x.device, dtype=torch.float32)
    l08.rmsnorm_backward(dy.reshape(rows.shape).contiguous(), rows, weight, rstd, dx, dw)
    return dx.view(x.shape), dw.to(weight_dtype), None


class _SavesPaddedRstdAndAnFp32Weight(torch.autograd.Function):
    """The course's kernels, with rstd allocated in whole blocks of 16 rows (saved whole, sliced in the
    backward) and an fp32 copy of the weight saved for the backward: neither is a (rows, hidden) copy."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.empty_like(rows)
        rstd = torch.empty(triton.cdiv(rows.shape[0], 16) * 16, device=x.device, dtype=torch.float32)
        l08.rmsnorm_forward(rows, weight, eps, y, rstd[: rows.shape[0]])
        ctx.save_for_backward(x, weight.float(), rstd)
        ctx.weight_dtype = weight.dtype
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight32, rstd = ctx.saved_tensors
        return _course_backward(dy, x, weight32, rstd[: x.numel() // x.shape[-1]], ctx.weight_dtype)


class _SavesRstdInXsLeadingShape(torch.autograd.Function):
    """The course's kernels, with rstd kept in x's leading shape ((2, 7) for x (2, 7, 80)), flattened for each."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.empty_like(rows)
        rstd = torch.empty(x.shape[:-1], device=x.device, dtype=torch.float32)
        l08.rmsnorm_forward(rows, weight, eps, y, rstd.view(-1))
        ctx.save_for_backward(x, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        return _course_backward(dy, x, weight, rstd.view(-1), weight.dtype)


class _SavesNoRstd(torch.autograd.Function):
    """The forward keeps x and weight only; the backward runs the forward kernel again for rstd."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        _, y, _ = _forward_kernel(x, weight, eps)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        _, _, rstd = _forward_kernel(x.reshape(-1, x.shape[-1]).contiguous(), weight, ctx.eps)
        return _course_backward(dy, x, weight, rstd, weight.dtype)


def test_rmsnorm_train_keeping_rstd_in_xs_leading_shape_passes():
    """rstd (batch, seq) for x (batch, seq, hidden), flattened for the kernels: only a 1-D rstd counted."""
    check("08.rmsnorm_train", lambda x, weight, eps: _SavesRstdInXsLeadingShape.apply(x, weight, eps),
          seed=1, quiet=True, course=True)


def test_rmsnorm_train_saving_no_rstd_fails_in_float32_too():
    """In float32 the saved weight, (hidden,) fp32, passed for an rstd of 1 to hidden rows: such a forward
    failed only at the float16 cases."""
    with pytest.raises(CheckFailed) as info:
        check("08.rmsnorm_train", lambda x, weight, eps: _SavesNoRstd.apply(x, weight, eps), seed=1, quiet=True,
              course=True)
    assert "one row of 48, float32" in str(info.value) and "the forward saves no rstd" in str(info.value), info.value


def test_rmsnorm_train_saving_a_padded_rstd_and_an_fp32_weight_passes():
    """rstd padded to whole blocks of rows was 'no rstd', and a (hidden,) weight copy a '(rows, hidden) tensor'
    at one row and bytes over the budget at more."""
    check("08.rmsnorm_train", lambda x, weight, eps: _SavesPaddedRstdAndAnFp32Weight.apply(x, weight, eps),
          seed=1, quiet=True, course=True)


@pytest.mark.parametrize("edit", [
    ("dw.to(weight.dtype), None", "dw.to(x.dtype), None"),  # dw returned in x's dtype
    ("y = torch.empty_like(rows)", "y = torch.empty_like(rows, dtype=weight.dtype)"),  # y in weight's dtype
])
def test_rmsnorm_train_mixing_up_x_and_weights_dtypes_fails(edit):
    """x and weight shared a dtype in every case but the one of an fp16 x and an fp32 weight."""
    failure("08.rmsnorm_train", mutant("l08_backward_passes", "rmsnorm_train", edit), "x float16 and weight float32",
            at="x float16 and weight float32")


@interpreter_only_because("the GPU's cases have D = 64 and 128; the interpreter's one case of D = 64 is its own")
def test_attention_backward_with_a_head_dim_block_fixed_at_32_fails():
    wrong = mutant("l08_backward_passes", "attention_backward", ("HEAD_DIM=D)", "HEAD_DIM=min(D, 32))"))
    failure("08.attention_backward", wrong, "D = 64, the block of the head dim is D itself", at="D = 64, the block")


def test_attention_backward_masking_by_multiplying_p_fails():
    """p * (j <= i) is tl.where's answer while exp() of every masked score is finite: every case's scores
    but one are ~N(0, 1)."""
    wrong = mutant("l08_backward_passes", "attention_backward",
                   ("p_t = tl.where(offs_n[:, None] <= offs_m[None, :], p_t, 0.0)",
                    "p_t = p_t * (offs_n[:, None] <= offs_m[None, :]).to(tl.float32)"),
                   ("p = tl.where(offs_n[None, :] <= offs_m[:, None], p, 0.0)",
                    "p = p * (offs_n[None, :] <= offs_m[:, None]).to(tl.float32)"))
    failure("08.attention_backward", wrong, "mask with tl.where, not by multiplying", at="the last key scores ~97")


def test_cross_entropy_rounding_p_to_16_bits_before_p_minus_1_fails():
    """p rounded to dlogits' dtype, then p - 1: one rounding of the result wherever p is far from 1, as in
    every row but a confident one's target."""
    wrong = mutant("l08_backward_passes", "cross_entropy",
                   ("p = tl.exp(x - lse)", "p = tl.exp(x - lse).to(dlogits_ptr.dtype.element_ty)"))
    failure("08.cross_entropy", wrong, "keep p in fp32 until it", at="a confident model")


@pytest.mark.parametrize("edits", [
    (("p_t = tl.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])",
      "p_t = tl.exp2(tl.dot(k, tl.trans(q)).to(q.dtype) * qk_scale - lse2[None, :])"),
     ("p = tl.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])",
      "p = tl.exp2(tl.dot(q, tl.trans(k)).to(q.dtype) * qk_scale - lse2[:, None])")),  # 16-bit scores
    (('lse2 = tl.load(lse_ptr + bh * S + offs_m, mask=q_ok, other=float("inf")) * 1.4426950408889634',
      'lse2 = tl.load(lse_ptr + bh * S + offs_m, mask=q_ok, other=float("inf")).to(q.dtype) * 1.4426950408889634'),
     ("lse2 = tl.load(lse_ptr + bh * S + offs_m, mask=q_ok, other=0.0) * 1.4426950408889634",
      "lse2 = tl.load(lse_ptr + bh * S + offs_m, mask=q_ok, other=0.0).to(q.dtype) * 1.4426950408889634")),  # lse
])
def test_attention_backward_recomputing_p_from_16_bits_fails(edits):
    """Scores and lse of std 1, rounded to 16 bits, move p by ~0.1 %: within the tolerance of every other case."""
    wrong = mutant("l08_backward_passes", "attention_backward", *edits)
    failure("08.attention_backward", wrong, "never from 16-bit scores or a 16-bit lse", at="q and k of std 6")
