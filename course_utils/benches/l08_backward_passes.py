"""Lesson 08 on a GPU: forward + backward of RMSNorm, SwiGLU's SiLU * mul and cross-entropy against eager
PyTorch, torch.compile and Liger-Kernel; FlashAttention-2 backward against SDPA's; one training step of the
toy Llama (batch 8 x 1024 tokens, bf16) with our kernels against the Hugging Face model eager,
torch.compile'd and Liger-patched, in tokens/s and peak memory.

Each "fwd+bwd" row times y = f(inputs) and torch.autograd.grad(y, inputs, dy): gradients are returned,
not accumulated into .grad, for every implementation alike. Every implementation is checked before it
is timed: the peers against eager PyTorch, ours against eager or float64 autograd. Our attention backward
is autotuned (the tiles it picked are facts); the training step is timed with our kernels in an eager
model and inside torch.compile, whose pairing with the compiled Hugging Face model is the target. Peak memory is torch.cuda.max_memory_allocated during one call,
minus what was allocated before it (facts "peak MiB ..."). torch.compile runs in its default mode
(max-autotune's compile time does not fit this bench's GPU budget; table.notes says so). One step of each
compiled model runs under torch.profiler, whose kernels that only copy tensors are fact "step_copies".
"""
from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable

import torch
import torch.nn.functional as F
import triton

from ..bench import Table, Target, registers_and_spills
from ..lessons.l08_backward_passes import (
    CrossEntropyFunction,
    RMSNormFunction,
    SiluMulFunction,
    attention_backward,
    attention_dkdv_kernel,
    attention_dq_kernel,
    causal_lm_loss,
    rmsnorm_backward,
    rmsnorm_backward_kernel,
    rmsnorm_forward,
    sum_rows,
    swap_in_training_kernels,
)
from ..llama import toy_llama

DEVICE = "cuda"
DTYPE = torch.bfloat16
EPS = 1e-6
OURS = "triton (ours)"
OURS_COMPILED = "triton (ours) + torch.compile"
# GPU activities that only move a tensor: the runtime's device-to-device copies ("Memcpy DtoD (Device ->
# Device)"), ATen's copy kernel (`direct_copy_kernel_cuda`), and the kernels Inductor generates for a clone or
# a copy_ with nothing else fused in. Inductor names a kernel after the ops it fuses,
# `triton_{poi,red,per}_fused_<ops>_<n>`: `..._as_strided_clone_0` only copies,
# `..._to_copy_add_bmm_cat_clone_cos_...` (RoPE) computes, and `_to_copy` alone is a dtype conversion.
INDUCTOR_KERNEL = re.compile(r"^triton_[a-z]+_fused_(?P<ops>.+?)_\d+$")
LAYOUT_OPS = re.compile(r"as_strided|_unsafe_view|clone|copy_|expand|permute|transpose|unsqueeze|squeeze|"
                        r"view|slice|select")


def is_copy_kernel(name: str) -> bool:
    """Does a GPU activity of this name only copy a tensor (see INDUCTOR_KERNEL)?"""
    if "memcpy" in name.lower() or "direct_copy_kernel" in name:
        return True
    fused = INDUCTOR_KERNEL.match(name)
    if fused is None:
        return False
    ops = fused.group("ops")
    return ("clone" in ops or "copy_" in ops) and not LAYOUT_OPS.sub("", ops).strip("_")


def _liger(module: str, name: str):
    try:
        mod = __import__(module, fromlist=[name])
        return getattr(mod, name)
    except Exception:  # noqa: BLE001 - not installed, or an incompatible version: no Liger rows
        return None


def _peak_mib(fn) -> float:
    """MiB allocated at the peak of one call of fn, above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def _fwd_bwd(f, inputs: tuple, dy_of):
    """A function running f(*inputs) and its backward, returning the gradients of `inputs`."""
    def step():
        y = f(*inputs)
        return torch.autograd.grad(y, inputs, dy_of(y))
    return step


def _close(got, want, tol=3e-2) -> None:
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), atol=tol * max(1.0, float(w.float().abs().max())), rtol=tol)


def _peers(table: Table, group: str, eager, inputs, dy_of, n_bytes, liger=None, memory=False,
           graph=False, liger_dy_of=None) -> list[str]:
    """Time eager, torch.compile, Liger (each checked against eager first; graph=True: also replayed
    from a CUDA graph); returns the rows recorded. liger_dy_of: Liger's own output gradient, for a
    Liger backward that writes its result into it (the others' must stay as they are)."""
    want = _fwd_bwd(eager, inputs, dy_of)()
    names = []
    candidates = [("torch eager", lambda: eager), ("torch.compile", lambda: torch.compile(eager, dynamic=False))]
    if liger is not None:
        candidates.append(("Liger-Kernel", lambda: liger))
    for name, make in candidates:
        try:
            step = _fwd_bwd(make(), inputs, liger_dy_of if name == "Liger-Kernel" and liger_dy_of else dy_of)
            _close(step(), want)
        except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
            table.notes.append(f"{group}: peer '{name}' skipped: {str(exc).splitlines()[0][:200]}")
            continue
        table.time(group, name, step, n_bytes=n_bytes, graph=graph)
        if memory:
            table.fact(f"peak MiB {group} {name}", f"{_peak_mib(step):.0f}")
        names.append(name)
    return names


# --- RMSNorm, SiLU * mul, cross-entropy: forward + backward ---------------------------------------

def _rmsnorm_eager(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def _check_rmsnorm(got, x, w, dy) -> None:
    """Our (dx, dw), both bf16, against float64 autograd on the same bf16 inputs, at tolerances that a
    correct kernel meets on any data: each output is rounded once to bf16 (2^-8 relative at most, two
    roundings apart from the reference's own), and dw is an fp32 sum over all rows, whose error in any
    order is at most rows * 2^-24 * sum|dy * xhat| (the classic bound (n - 1) u sum|a_i|, plus the
    products' own rounding). A bf16 reference instead (eager's dw rounded to bf16, then ours compared to
    it at 3 % of the largest element) has no such bound; an fp32 dw summed in bf16 would be off by
    ~sqrt(rows) x 2^-8 relative."""
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w64
    dx64, dw64 = torch.autograd.grad(y, (x64, w64), dy.double())
    terms = (dy.double() * x64.detach() * torch.rsqrt(x64.detach().pow(2).mean(-1, keepdim=True) + EPS)).abs().sum(0)
    rows = x.shape[0]
    tol_dx = (2.0**-8 * float(dx64.abs().max()), 2.0**-7)
    tol_dw = ((rows + 3) * 2.0**-24 * float(terms.max()) + 2.0**-8 * float(dw64.abs().max()), 2.0**-7)
    for name, g, want, (atol, rtol) in (("dx", got[0], dx64, tol_dx), ("dw", got[1], dw64, tol_dw)):
        torch.testing.assert_close(g.double(), want, atol=atol, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")


def bench_rmsnorm(table: Table, rows: int = 16384, cols: int = 4096, sweep: bool = True) -> None:
    group = f"rmsnorm fwd+bwd bf16 {rows}x{cols}"
    x = torch.randn(rows, cols, device=DEVICE, dtype=DTYPE, requires_grad=True)
    w = (torch.rand(cols, device=DEVICE, dtype=DTYPE) + 0.5).requires_grad_()
    dy = torch.randn(rows, cols, device=DEVICE, dtype=DTYPE)
    n_bytes = 5 * x.numel() * x.element_size()  # fwd: read x, write y; bwd: read dy and x, write dx
    fn = _liger("liger_kernel.ops.rms_norm", "LigerRMSNormFunction")
    liger = (lambda a, b: fn.apply(a, b, EPS)) if fn else None
    # About 0.2 ms of GPU work per call, and about as much CPU work (autograd, the compiled wrapper,
    # Triton's launcher): a plain timing depends on the CPU as much as on the GPU. So every side is also
    # replayed from a CUDA graph, and the target is judged there.
    # Liger's backward writes dx into dy (its default, in_place=True: dy is dead after a real backward), so
    # it gets a dy of its own: after a few hundred timed calls its values have drifted, the work has not.
    liger_dy = dy.clone()
    peers = _peers(table, group, _rmsnorm_eager, (x, w), lambda y: dy, n_bytes, liger, graph=True,
                   liger_dy_of=lambda y: liger_dy)
    ours = _fwd_bwd(lambda a, b: RMSNormFunction.apply(a, b, EPS), (x, w), lambda y: dy)
    _check_rmsnorm(ours(), x, w, dy)
    table.time(group, OURS, ours, n_bytes=n_bytes, graph=True)
    table.target_plain_and_graph(group, OURS, peers, 1.0)
    if sweep:
        _sweep_rmsnorm_backward(table, group, x.detach(), w.detach(), dy)


def _sweep_rmsnorm_backward(table: Table, group: str, x, w, dy) -> None:
    """The kernels without autograd, forward and backward timed apart, then the backward's launch swept:
    programs per SM (more programs: more rows' loads in flight per SM, more dw partial rows to sum),
    rows per step and warps."""
    rows, cols = x.shape
    y, rstd, dx = torch.empty_like(x), torch.empty(rows, device=DEVICE), torch.empty_like(x)
    dw = torch.empty(cols, device=DEVICE)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    table.time(group, "triton (ours) forward only", lambda: rmsnorm_forward(x, w, EPS, y, rstd),
               n_bytes=2 * x.numel() * x.element_size())
    table.time(group, "triton (ours) backward only", lambda: rmsnorm_backward(dy, x, w, rstd, dx, dw),
               n_bytes=3 * x.numel() * x.element_size())
    for per_sm, block_m, warps in itertools.product((1, 2, 4, 8), (1, 2, 4), (4, 8, 16)):
        def step(per_sm=per_sm, block_m=block_m, warps=warps):
            rmsnorm_forward(x, w, EPS, y, rstd)
            rmsnorm_backward(dy, x, w, rstd, dx, dw, programs=per_sm * sms, block_m=block_m, num_warps=warps)
        step()
        _check_rmsnorm((dx, dw), x, w, dy)
        table.time(group, f"triton (ours) kernels, backward {per_sm}/SM BLOCK_M={block_m} w{warps}", step,
                   n_bytes=5 * x.numel() * x.element_size())
    _backward_registers(table, x, w, dy, rstd, dx, sms)
    _backward_stages(table, group, x, w, dy, rstd, dx, dw, sms)


def _stage_one(x, w, dy, rstd, dx, part, programs: int, block_m: int, num_warps: int):
    """rmsnorm_backward's first kernel as the host function launches it (`programs` programs, their
    partial dw rows into `part`); returns the compiled kernel."""
    rows, cols = x.shape
    return rmsnorm_backward_kernel[(programs,)](
        dy, x, w, rstd, dx, part, rows, cols, triton.cdiv(rows, programs), dy.stride(0), x.stride(0),
        dx.stride(0), BLOCK_M=block_m, BLOCK_N=triton.next_power_of_2(cols), num_warps=num_warps)


def _backward_stages(table: Table, group: str, x, w, dy, rstd, dx, dw, sms: int, block_m: int = 4) -> None:
    """The backward's two kernels timed apart at 1 and 8 programs per SM: stage one (dx and the programs'
    partial dw rows) and stage two (`sum_rows` of those P rows): where do more programs cost?"""
    for per_sm in (1, 8):
        programs = per_sm * sms
        part = torch.empty((programs, x.shape[1]), device=DEVICE, dtype=torch.float32)

        def stage_one(programs=programs, part=part):
            _stage_one(x, w, dy, rstd, dx, part, programs, block_m, num_warps=8)

        stage_one()
        sum_rows(part, dw)
        _check_rmsnorm((dx, dw), x, w, dy)
        table.time(group, f"triton (ours) backward stage one alone, {per_sm}/SM", stage_one,
                   n_bytes=3 * x.numel() * x.element_size())
        table.time(group, f"triton (ours) backward stage two alone, {per_sm}/SM",
                   lambda part=part: sum_rows(part, dw), n_bytes=part.numel() * part.element_size())
        if per_sm == 1:  # the same sum in strips of 256 columns: 16 programs for hidden 4096
            def wide(part=part):
                sum_rows(part, dw, block_n=256, block_p=32)
            wide()
            torch.testing.assert_close(dw, part.sum(0), rtol=1e-5, atol=1e-3)
            table.time(group, "triton (ours) backward stage two alone, 1/SM, 256-column strips", wide,
                       n_bytes=part.numel() * part.element_size())


def _backward_registers(table: Table, x, w, dy, rstd, dx, programs: int, block_m: int = 4) -> None:
    """Fact rmsnorm_backward_registers: the backward kernel at `block_m` rows a step with 4 and 8 warps, its
    registers per thread and the bytes per thread spilled to local memory (the compiled kernel's own
    counts, `bench.registers_and_spills`), as the sweep launched it."""
    part = torch.empty((programs, x.shape[1]), device=DEVICE, dtype=torch.float32)
    found = []
    for warps in (8, 4):
        kernel = _stage_one(x, w, dy, rstd, dx, part, programs, block_m, num_warps=warps)
        counts = registers_and_spills(kernel)
        if counts is None:  # the interpreter runs kernels without compiling them: no fact
            table.notes.append("rmsnorm backward registers: not compiled (interpreter)")
            return
        found.append(f"{warps} warps, {counts[0]} registers per thread and {counts[1]} bytes per thread "
                     f"spilled to local memory")
    table.fact("rmsnorm_backward_registers", f"{block_m} rows a step: " + "; ".join(found))


def bench_silu_mul(table: Table, rows: int = 16384, cols: int = 14336) -> None:
    group = f"silu_mul fwd+bwd bf16 {rows}x{cols}"
    g = torch.randn(rows, cols, device=DEVICE, dtype=DTYPE, requires_grad=True)
    u = torch.randn(rows, cols, device=DEVICE, dtype=DTYPE, requires_grad=True)
    dh = torch.randn(rows, cols, device=DEVICE, dtype=DTYPE)
    n_bytes = 8 * g.numel() * g.element_size()  # fwd: read g, u, write h; bwd: read dh, g, u, write dg, du

    def eager(a, b):
        return F.silu(a) * b

    fn = _liger("liger_kernel.ops.swiglu", "LigerSiLUMulFunction")
    # Ours and Liger write dg, du into the saved g, u (their memory is dead after the backward): check
    # them on copies, then time them on copies made once (the values drift from call to call; the
    # work does not).
    want = _fwd_bwd(eager, (g, u), lambda y: dh)()
    names = _peers(table, group, eager, (g, u), lambda y: dh, n_bytes)
    for name, f in ((OURS, SiluMulFunction.apply), ("Liger-Kernel", fn.apply if fn else None)):
        if f is None:
            continue
        gc, uc = (t.detach().clone().requires_grad_() for t in (g, u))
        step = _fwd_bwd(f, (gc, uc), lambda y: dh)
        try:
            _close(step(), want)
        except Exception as exc:  # noqa: BLE001
            table.notes.append(f"{group}: '{name}' skipped: {str(exc).splitlines()[0][:200]}")
            continue
        gc, uc = (t.detach().clone().requires_grad_() for t in (g, u))
        table.time(group, name, _fwd_bwd(f, (gc, uc), lambda y: dh), n_bytes=n_bytes)
        if name != OURS:
            names.append(name)
    table.target(group, OURS, names, 1.0)


def bench_cross_entropy(table: Table, rows: int = 8192, vocab: int = 32000) -> None:
    group = f"cross_entropy fwd+bwd bf16 {rows}x{vocab}"
    logits0 = torch.randn(rows, vocab, device=DEVICE, dtype=DTYPE) * 3
    targets = torch.randint(vocab, (rows,), device=DEVICE)
    targets[::17] = -100
    n_bytes = 2 * logits0.numel() * logits0.element_size()  # the floor: read the logits, write dlogits

    def eager(x):  # what Hugging Face's loss does: upcast to fp32, then F.cross_entropy
        return F.cross_entropy(x.float(), targets, ignore_index=-100)

    x = logits0.clone().requires_grad_()
    names = _peers(table, group, eager, (x,), lambda y: None, n_bytes, memory=True)
    want = _fwd_bwd(eager, (x,), lambda y: None)()
    fn = _liger("liger_kernel.ops.cross_entropy", "LigerCrossEntropyFunction")
    impls = [(OURS, lambda t: CrossEntropyFunction.apply(t, targets))]
    if fn is not None:
        def liger(t):
            out = fn.apply(t, targets, None)  # weight=None: no class weights
            return out[0] if isinstance(out, tuple) else out
        impls.append(("Liger-Kernel", liger))
    for name, f in impls:  # both write dlogits into the logits: checked and timed on their own copy
        xc = logits0.clone().requires_grad_()
        step = _fwd_bwd(f, (xc,), lambda y: None)
        try:
            _close(step(), want)
        except Exception as exc:  # noqa: BLE001
            table.notes.append(f"{group}: '{name}' skipped: {str(exc).splitlines()[0][:200]}")
            continue
        xc = logits0.clone().requires_grad_()
        step = _fwd_bwd(f, (xc,), lambda y: None)
        table.time(group, name, step, n_bytes=n_bytes)
        table.fact(f"peak MiB {group} {name}", f"{_peak_mib(step):.0f}")
        if name != OURS:
            names.append(name)
    table.target(group, OURS, names, 1.0)
    # The peaks above count only what a call allocates: ours writes dlogits into the logits and allocates
    # ~0 MiB. The target compares what the GPU holds at the peak, the logits themselves included.
    logits_mib = logits0.numel() * logits0.element_size() / 2**20  # (rows, vocab) bf16: 500 MiB
    _memory_target(table, group, f"peak MiB {group} ", OURS, "torch eager", 1.0, held_mib=logits_mib)


def _memory_target(table: Table, group: str, prefix: str, ours: str, peer: str, at_most: float,
                   held_mib: float = 0.0) -> None:
    """Target: peak memory of ours <= at_most x peer's, recorded as the ratio peer / ours >= 1 / at_most.
    `held_mib`: memory both sides hold before the call (their inputs), added to each recorded peak."""
    a, b = table.facts.get(prefix + ours), table.facts.get(prefix + peer)
    t = Target(group + " peak memory", ours, peer, round(1 / at_most, 3), metric="memory (peer / ours)")
    if a is not None and b is not None:
        t.ratio = (float(b) + held_mib) / max(float(a) + held_mib, 1.0)
        t.met = t.ratio >= t.minimum
    table.targets.append(t)


# --- attention backward -------------------------------------------------------------------------

def _lse(q, k, causal: bool) -> torch.Tensor:
    """(B, H, S) fp32 natural-log log-sum-exp of the scaled scores, one (S, S) block at a time."""
    B, H, S, D = q.shape
    out = torch.empty((B, H, S), device=q.device, dtype=torch.float32)
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1) if causal else None
    for b in range(B):
        for h in range(H):
            s = (q[b, h].float() @ k[b, h].float().T) / math.sqrt(D)
            if mask is not None:
                s.masked_fill_(mask, float("-inf"))
            out[b, h] = torch.logsumexp(s, -1)
    return out


def _tile(config) -> str:
    return (f"BLOCK_M={config.kwargs['BLOCK_M']} BLOCK_N={config.kwargs['BLOCK_N']} warps={config.num_warps} "
            f"stages={config.num_stages}")


def _tiles(table: Table, key: str, kernel) -> None:
    """Facts: the tile the autotuner picked for the kernel's last key, and what each candidate took."""
    table.fact(f"{key} tile", _tile(kernel.best_config))
    timings = getattr(kernel, "configs_timings", None) or {}
    ms = {c: (t[0] if isinstance(t, (list, tuple)) else t) for c, t in timings.items()}
    table.fact(f"{key} tiles timed", "; ".join(f"{_tile(c)}: {t:.3f} ms" for c, t in ms.items()) or "not timed")


def bench_attention_backward(table: Table, shape=(4, 16, 4096, 128)) -> None:
    B, H, S, D = shape
    for causal in (False, True):
        group = f"attention backward bf16 {shape}{' causal' if causal else ''}"
        q, k, v, do = (torch.randn(shape, device=DEVICE, dtype=DTYPE) * (0.5 if i < 2 else 1.0) for i in range(4))
        flops = 10 * B * H * S * S * D * (0.5 if causal else 1.0)  # 5 matmuls of 2 S^2 D (recompute s too)
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        want = torch.autograd.grad(o, (qr, kr, vr), do, retain_graph=True)
        lse = _lse(q, k, causal)
        o_ = o.detach()
        dq, dk, dv = (torch.empty_like(q) for _ in range(3))
        attention_backward(q, k, v, o_, lse, do, dq, dk, dv, causal)  # the autotuner picks the tiles here
        _close((dq, dk, dv), want, 5e-2)
        # Compute-bound, both: the pair takes turns (Table.time_alternating), as lesson 03's and 07's do.
        table.time_alternating(group, [
            ("SDPA backward", lambda o=o, qr=qr, kr=kr, vr=vr: torch.autograd.grad(o, (qr, kr, vr), do,
                                                                                  retain_graph=True)),
            (OURS, lambda: attention_backward(q, k, v, o_, lse, do, dq, dk, dv, causal))], flops=flops)
        kind = "causal" if causal else "full"
        _tiles(table, f"attention backward {kind} dkdv", attention_dkdv_kernel)
        _tiles(table, f"attention backward {kind} dq", attention_dq_kernel)
        table.target(group, OURS, "SDPA backward", 0.7, 0.85)
        del o, want


# --- the training step --------------------------------------------------------------------------

def bench_training_step(table: Table, batch: int = 8, seq: int = 1024) -> None:
    group = f"toy Llama training step bf16 {batch}x{seq}"
    tokens = batch * seq
    ids = torch.randint(32000, (batch, seq), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    def model():
        return toy_llama(dtype=DTYPE, device=DEVICE).train()

    def hf_step(m):
        def step():
            m.zero_grad(set_to_none=True)
            loss = m(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            return loss
        return step

    variants = [("HF eager", lambda: hf_step(model())),
                ("HF torch.compile", lambda: hf_step(torch.compile(model(), dynamic=False)))]
    apply_liger = _liger("liger_kernel.transformers", "apply_liger_kernel_to_llama")
    if apply_liger is not None:
        def liger_step():
            m = model()
            apply_liger(rope=False, rms_norm=True, swiglu=True, cross_entropy=False,
                        fused_linear_cross_entropy=True, model=m)
            return hf_step(m)
        variants.append(("HF + Liger-Kernel", liger_step))

    def ours_step():
        m = swap_in_training_kernels(model())

        def step():
            m.zero_grad(set_to_none=True)
            loss = causal_lm_loss(m, ids, ids)
            loss.backward()
            return loss
        return step

    def ours_compiled_step():
        m = swap_in_training_kernels(model())
        loss_fn = torch.compile(causal_lm_loss, dynamic=False)  # the rest (attention, RoPE, adds) fused

        def step():
            m.zero_grad(set_to_none=True)
            loss = loss_fn(m, ids, ids)
            loss.backward()
            return loss
        return step

    variants += [(OURS, ours_step), (OURS_COMPILED, ours_compiled_step)]
    want = None
    names = []
    profiled = {}  # name -> the GPU activities of one step of each compiled model
    for name, make in variants:
        try:
            step = make()
            loss = float(step())
            if want is None:
                want = loss
            if abs(loss - want) > 2e-2 * abs(want):
                raise AssertionError(f"loss {loss:.5f}, eager {want:.5f}")
        except Exception as exc:  # noqa: BLE001
            table.notes.append(f"{group}: '{name}' skipped: {str(exc).splitlines()[0][:200]}")
            continue
        row = table.time(group, name, step, rep_ms=500)
        table.fact(f"tokens/s {name}", f"{tokens / (row.ms * 1e-3):.0f}")
        table.fact(f"peak MiB {group} {name}", f"{_peak_mib(step):.0f}")
        if name not in (OURS, OURS_COMPILED):
            names.append(name)
        if name in (OURS_COMPILED, "HF torch.compile"):
            try:
                profiled[name] = _profiled_kernels(step)
            except Exception as exc:  # noqa: BLE001 - a profiler failure must not lose the step's rows
                table.notes.append(f"{group}: '{name}' not profiled: {type(exc).__name__}: {str(exc)[:200]}")
        del step
        torch.cuda.empty_cache()
    if profiled:
        _step_copies(table, profiled)
    # The fair pairing: our kernels with torch.compile fusing the rest, against torch.compile alone.
    table.target(group, OURS_COMPILED, "HF torch.compile", 1.0)
    table.target(group, OURS, "HF torch.compile", None)  # ours with the rest eager: reported
    _memory_target(table, group, f"peak MiB {group} ", OURS_COMPILED, "HF eager", 0.8)
    _memory_target(table, group, f"peak MiB {group} ", OURS, "HF eager", 0.8)
    table.notes.append(f"{group}: a step is zero_grad + forward + loss + backward (no optimizer, the same "
                       "for every row); ours swaps every RMSNorm, the MLP's SiLU * mul, and the output layer "
                       "with the loss (its gradients computed in the forward), "
                       f"attention and matmuls stay PyTorch's; '{OURS_COMPILED}' is the same model with "
                       "torch.compile around the loss function, our autograd Functions inside it")


def copy_kernels(kernels: Iterable[tuple[str, float]]
                 ) -> tuple[int, float, float, dict[str, tuple[int, float]]]:
    """Of a step's GPU activities (name, µs): how many only copy (`is_copy_kernel`), their µs, the µs of
    all of them, and per copy kernel's name its calls and µs, the longest first."""
    kernels = list(kernels)
    per_name: dict[str, tuple[int, float]] = {}
    for name, us in kernels:
        if is_copy_kernel(name):
            calls, total = per_name.get(name, (0, 0.0))
            per_name[name] = (calls + 1, total + us)
    per_name = dict(sorted(per_name.items(), key=lambda item: -item[1][1]))
    return (sum(calls for calls, _ in per_name.values()), sum(us for _, us in per_name.values()),
            sum(us for _, us in kernels), per_name)


def _profiled_kernels(step) -> list[tuple[str, float]]:
    """The GPU activities of one call of `step` (after a warm-up call), from torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]


def _step_copies(table: Table, profiled: dict[str, list[tuple[str, float]]]) -> None:
    """Fact step_copies: the copy kernels of one training step of each compiled model, from their profiled
    GPU activities (lesson 08: the compiler copies a saved tensor before a kernel writes into it)."""
    found = []
    for name, kernels in profiled.items():
        count, copy_us, total_us, per_name = copy_kernels(kernels)
        shown = [f"`{n[:60]}` {calls} x, {us / 1e3:.3f} ms" for n, (calls, us) in list(per_name.items())[:4]]
        shown += ["..."] if len(per_name) > 4 else []
        found.append(f"{name}: {count} copy kernels, {copy_us / 1e3:.3f} ms of {total_us / 1e3:.3f} ms "
                     f"of GPU work a step" + (f" ({', '.join(shown)})" if shown else ""))
    table.fact("step_copies", "; ".join(found))


def run(table: Table, sweep: bool = True) -> None:
    table.notes.append("torch.compile rows use the default mode: max-autotune's compile time does not fit "
                       "this bench's GPU budget")
    for bench, options in ((bench_rmsnorm, {"sweep": sweep}), (bench_silu_mul, {}), (bench_cross_entropy, {}),
                           (bench_attention_backward, {}), (bench_training_step, {})):
        try:
            bench(table, **options)
        except Exception as exc:  # noqa: BLE001 - one failing bench must not lose the others' rows
            table.notes.append(f"{bench.__name__} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        torch.cuda.empty_cache()
