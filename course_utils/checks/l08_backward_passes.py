"""Exercises of lesson 08: backward passes (RMSNorm, SwiGLU, cross-entropy, attention) and an autograd Function.

References are float64 autograd on upcast inputs. A failing gradient is compared with the answers
the usual mistakes give (dw not summed over all rows or summed twice, the mean's term missing from
dx, a wrong sigmoid', a gradient not divided by the non-ignored count, ignored rows not zeroed, a
log-sum-exp in base 2), and the mistake it matches is named in the failure message.

The kernel cases hand the harness infinite tolerances, so that its own comparison reports only what
it reports best (elements never written, NaN, writes out of bounds); each case's `verify` then
compares every output at its real tolerance and adds the diagnosis.

Cross-entropy's convention when every target is ignored: n = 0 non-ignored rows, so the loss and
dlogits are all 0 (PyTorch's mean reduction would give 0/0 = NaN; a batch of padding changes nothing).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..grading import Case, Exercise, Out, register
from ..grading.guard import watching
from ..grading.harness import PAD, backward_problems, compare
from ..grading.remote import ctx_tensors, kept_alive, storage_rests
from ..grading.inputs import EPS, TF32_EPS, f64, hide_a_key_from_earlier_queries, randn, uniform
from ..mode import current, size

IGNORE = -100


def _dtypes():
    """fp32 and fp16 everywhere; bf16 only on a GPU (the interpreter has no bf16 arithmetic)."""
    return (torch.float32, torch.float16, torch.bfloat16) if current().gpu else (torch.float32, torch.float16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _tol(dtype: torch.dtype, expected: torch.Tensor, slack: float = 8.0, eps: float | None = None,
         floor: float = 0.0):
    """(atol, rtol): `slack` roundings of the output dtype, atol relative to the output's largest value
    (or to `floor`, the size of the terms that cancel, when the exact answer is 0)."""
    eps = eps or EPS[dtype]
    scale = max(float(expected.abs().max()) if expected.numel() else 1.0, floor)
    atol = slack * eps * max(scale, 1e-30)
    if dtype == torch.float16:
        atol = max(atol, 2.0**-24)  # fp16's subnormal step
    return atol, slack * eps


def _same(got: torch.Tensor, alt: torch.Tensor, tol: tuple[float, float]) -> bool:
    """Does an output match a wrong answer's values (within the case's tolerance, a little looser)?"""
    atol, rtol = tol
    return not compare("x", got, alt, 4 * atol, 4 * rtol)


def _verify(expected: dict, tols: dict, diagnose: Callable[[dict], list[str]] | None = None):
    """A verify callback: each output against its float64 reference at its tolerance, then named mistakes."""
    def verify(outs: dict, case: Case) -> list[str]:
        problems = []
        for name, want in expected.items():
            problems += compare(name, outs[name], want, *tols[name])
        if problems and diagnose is not None:
            problems += [f"likely mistake: {text}" for text in diagnose(outs)]
        return problems
    return verify


def _case(label: str, args: tuple, expected: dict, tols: dict, diagnose=None) -> Case:
    return Case(label, args, expected, math.inf, 0.0, verify=_verify(expected, tols, diagnose))


# --- 08.rmsnorm_backward ----------------------------------------------------------------------

def _rmsnorm_grads(x, weight, eps, dy):
    """(y, dx, dw, rstd) by float64 autograd through y = x * rsqrt(mean(x**2) + eps) * weight."""
    x64 = f64(x).reshape(-1, x.shape[-1]).requires_grad_()
    w64 = f64(weight).requires_grad_()
    rstd = torch.rsqrt(x64.detach().pow(2).mean(-1) + eps)
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w64
    y.backward(f64(dy).reshape(y.shape))
    return y.detach(), x64.grad, w64.grad, rstd


def _rmsnorm_mistakes(dy, x, weight, rstd, tol_dx, tol_dw):
    """What each usual mistake writes into dx and dw, in float64, and its name."""
    dy, x, w = f64(dy).reshape(-1, x.shape[-1]), f64(x).reshape(-1, x.shape[-1]), f64(weight)
    r = rstd[:, None]
    xhat = x * r
    wdy = dy * w
    dw = (dy * xhat).sum(0)
    dx = r * (wdy - xhat * (wdy * xhat).mean(-1, keepdim=True))
    dx_wrong = [
        (rstd[:, None] * wdy, "the mean's gradient term is missing from dx: rstd depends on every x of the row, "
         "so dx = rstd * (dy * w - xhat * mean(dy * w * xhat)), not rstd * dy * w"),
        (r * (dy - xhat * (dy * xhat).mean(-1, keepdim=True)), "dx lacks the weight: the gradient reaching "
         "xhat is dy * w"),
        (r * (wdy - xhat * (wdy * xhat).sum(-1, keepdim=True)), "dx uses the SUM of dy * w * xhat where the "
         "MEAN goes (divide by hidden)"),
        (wdy - xhat * (wdy * xhat).mean(-1, keepdim=True), "dx lacks the outer rstd: dx = rstd * (dy * w - xhat * "
         "mean(dy * w * xhat)), since xhat = x * rstd"),
    ]
    block = 1 << (x.shape[-1] - 1).bit_length()  # the row's block, padded to a power of 2
    if block != x.shape[-1]:
        dx_wrong.append((r * (wdy - xhat * (wdy * xhat).sum(-1, keepdim=True) / block),
                         f"the mean divides by the block size {block}, not by hidden = {x.shape[-1]}: the padded "
                         "lanes (masked, 0) are no elements of the row"))
    dw_wrong = [
        (2 * dw, "dw summed twice: each row's dy * xhat must be added exactly once (overlapping row ranges, "
         "or the partial sums added on top of a total?)"),
        ((dy * x).sum(0), "dw = sum(dy * x) lacks rstd: it is sum over rows of dy * x * rstd"),
    ]
    several_rows = x.shape[0] > 1  # one row's dy * xhat is dw itself: "not summed" means nothing there
    if several_rows:
        dw_wrong += [((dy * xhat)[-1], "dw not summed across all rows: it holds the last row's dy * xhat only"),
                     ((dy * xhat)[0], "dw not summed across all rows: it holds the first row's dy * xhat only")]

    def diagnose(outs: dict) -> list[str]:
        dx_is_wrong = bool(compare("dx", outs["dx"], dx, *tol_dx))
        # a right dx is no mistake of dx's: within a loose tolerance (one fp16 row) some mistakes match it too
        found = [text for alt, text in dx_wrong if _same(outs["dx"], alt, tol_dx)] if dx_is_wrong else []
        if "dw" in outs and compare("dw", outs["dw"], dw, *tol_dw):
            named = [text for alt, text in dw_wrong if _same(outs["dw"], alt, tol_dw)]
            if named or found:
                found += named
            elif not dx_is_wrong and several_rows:  # dx right: the reduction is what went wrong
                found.append("dw not summed across all rows: dw = sum over EVERY row of dy * x * rstd; each "
                             "program stores its partial sum of its rows and all the partials are added once")
            elif dx_is_wrong:  # both wrong, no known pattern: the inputs were read wrong, most likely
                found.append("dx and dw are both wrong: read x and dy each with its own row stride "
                             "(x.stride(0), dy.stride(0)), and rstd at the same rows")
        return found

    return diagnose


def _dw_tol(dy, x, rstd) -> tuple[float, float]:
    """dw is an fp32 sum over rows: its rounding error grows with the sum of the terms' magnitudes."""
    terms = (f64(dy).reshape(-1, x.shape[-1]) * f64(x).reshape(-1, x.shape[-1]) * rstd[:, None]).abs().sum(0)
    return 32 * 2.0**-24 * float(terms.max()) + 1e-30, 64 * 2.0**-24


def _dx_tol(dtype: torch.dtype, dx: torch.Tensor, dy, weight, rstd) -> tuple[float, float]:
    """dx = rstd * (w * dy - xhat * mean(w * dy * xhat)): its two terms can cancel (w = 1 and dy = y, the
    gradient of sum(y^2) / 2, gives dx ~ eps: the roundings of the terms, not of dx, set the error), so
    atol is relative to the largest term, rstd * |w * dy|, when that is larger than dx."""
    hidden = dy.shape[-1]
    terms = (f64(dy).reshape(-1, hidden) * f64(weight) * rstd.reshape(-1, 1)).abs()
    return _tol(dtype, dx, floor=float(terms.max()) if terms.numel() else 0.0)


def _rmsnorm_backward_case(label: str, dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float,
                           dx_layout: str = "contiguous") -> Case:
    """A case of rmsnorm_backward on x (rows, hidden): dx in x's dtype (laid out dx_layout), dw fp32, the
    forward's rstd fp32."""
    (m, n), dtype = x.shape, x.dtype
    _, dx, dw, rstd = _rmsnorm_grads(x, weight, eps, dy)
    tols = {"dx": _dx_tol(dtype, dx, dy, weight, rstd), "dw": _dw_tol(dy, x, rstd)}
    args = (dy, x, weight, rstd.to(torch.float32).to(current().device), Out("dx", (m, n), dtype, layout=dx_layout),
            Out("dw", (n,), torch.float32))
    return _case(label, args, {"dx": dx, "dw": dw}, tols,
                 _rmsnorm_mistakes(dy, x, weight, rstd, tols["dx"], tols["dw"]))


def _rmsnorm_backward_cases(gen):
    rows, hidden = size((1823, 781), (37, 781))
    many = size((4096, 1024), (150, 80))
    for dtype in _dtypes():
        shapes = [  # (label, (rows, hidden), eps, strided: x and dy slices of wider tensors, dx's rows padded)
            ("one row of 48", (1, 48), 1e-6, False),
            (f"{rows} rows x hidden {hidden}: no size is a multiple of a block", (rows, hidden), 1e-6, False),
            (f"{many[0]} rows x hidden {many[1]}: dw sums rows handled by many programs", many, 1e-6, False),
            ("inputs ~0.03 with eps = 1e-3 (rstd saved by the forward already holds eps)", (rows, hidden), 1e-3,
             False),
            (f"x and dy slices of wider tensors (row strides {hidden + 7} and {hidden + 13}), dx's rows padded "
             f"(row stride {hidden + PAD}): use each one's own stride", (rows, hidden), 1e-6, True),
        ]
        if current().gpu:
            shapes.append(("2048 rows x hidden 4096, Llama-7B's width", (2048, 4096), 1e-6, False))
        for label, (m, n), eps, strided in shapes:
            scale = 0.03 if eps == 1e-3 else 1.0
            if strided:
                x = randn((m, n + 7), dtype, gen, scale)[:, 3:3 + n]
                # dy's row stride is not x's: a kernel reading dy with x.stride(0) must fail here
                dy = randn((m, n + 13), dtype, gen)[:, 2:2 + n]
            else:
                x, dy = randn((m, n), dtype, gen, scale), randn((m, n), dtype, gen)
            weight = uniform((n,), 0.5, 1.5, dtype, gen)
            yield _rmsnorm_backward_case(f"{label}, {_name(dtype)}", dy, x, weight, eps,
                                         dx_layout="padded" if strided else "contiguous")
    # Last (the cases above draw what they drew before it came): the gradient of sum(y^2) / 2 with w = 1, the
    # first backward a test writes, is dy = y, and dx = rstd * (y - xhat * mean(y * xhat)) cancels to ~eps
    x = randn((4, 80), torch.float32, gen)
    weight = torch.ones(80, device=current().device)
    dy = (f64(x) * torch.rsqrt(f64(x).pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.float32).to(x.device)
    yield _rmsnorm_backward_case("w = 1 and dy = y, the gradient of sum(y^2) / 2: dx's two terms cancel to ~eps, "
                                 "float32", dy, x, weight, 1e-6)
    # Wider than a block of 4096 columns (Triton's layer-norm tutorial caps its block there; Llama-13B's
    # hidden is 5120): a kernel whose row is one capped block leaves columns unwritten and out of the mean.
    x, dy = randn((3, 4100), torch.float32, gen), randn((3, 4100), torch.float32, gen)
    weight = uniform((4100,), 0.5, 1.5, torch.float32, gen)
    yield _rmsnorm_backward_case("3 rows x hidden 4100, wider than a block of up to 4096 columns: size the block "
                                 "from the hidden size, or loop over the whole row (mean(wdy * xhat) over every "
                                 "column), float32", dy, x, weight, 1e-6)
    # More rows than the 256 partial rows of dw in Triton's layer-norm tutorial: programs share one, so
    # each must add to it under a lock (or atomically), or own its partial row.
    x, dy = randn((300, 16), torch.float32, gen), randn((300, 16), torch.float32, gen)
    weight = uniform((16,), 0.5, 1.5, torch.float32, gen)
    yield _rmsnorm_backward_case("300 rows x hidden 16, more rows than 256 partial rows of dw: programs that "
                                 "share a partial row add to it atomically or under a lock, float32",
                                 dy, x, weight, 1e-6)


register(Exercise(
    "08.rmsnorm_backward", "RMSNorm backward: dx per row, dw reduced across programs",
    "rmsnorm_backward(dy, x, weight, rstd, dx, dw)", _rmsnorm_backward_cases,
    hint={"wrong": "per row (fp32): xhat = x * rstd, wdy = dy * w, dx = rstd * (wdy - xhat * mean(wdy * "
                   "xhat)); dw: each of P programs adds dy * xhat over its rows into a (BLOCK_N,) fp32 "
                   "accumulator and stores it as row pid of a (P, hidden) fp32 scratch (torch.empty), then "
                   "sum_rows(scratch, dw)",
          "unwritten": "dx: every row stored by some program; dw: every column must come out of the final "
                       "reduction of the (P, hidden) scratch (P programs x BLOCK_N >= hidden columns each); "
                       "adding into dw with tl.atomic_add? dw arrives full of NaN (as torch.empty holds "
                       "whatever was there), and NaN + x is NaN: zero it first (dw.zero_())",
          "out_of_bounds": "mask cols < hidden on every load and store and rows < n_rows on dx; program pid "
                           "writes row pid of the (P, hidden) scratch only",
          "nan": "a masked load without other=0.0 feeds undefined lanes into mean(wdy * xhat) or the dw "
                 "accumulator: give masked loads other=0.0; or dw was added into (tl.atomic_add) without "
                 "being zeroed first (dw.zero_())"}))


# --- 08.silu_mul_backward ---------------------------------------------------------------------

def _silu_mistakes(dh, g, u, tol_dg, tol_du):
    dh, g, u = f64(dh), f64(g), f64(u)
    s = torch.sigmoid(g)
    dg, du = dh * u * s * (1 + g * (1 - s)), dh * g * s
    dg_wrong = [
        (dh * u * s, "sigmoid' wrong: silu'(g) is not sigmoid(g); silu(g) = g * s, so by the product rule "
         "silu'(g) = s + g * s * (1 - s)"),
        (dh * u * s * (1 - s), "sigmoid' wrong: that is sigmoid'(g) = s * (1 - s); silu'(g) = s + g * s * (1 - s)"),
        (dh * u * (s + g * s), "sigmoid' wrong: sigmoid'(g) = s * (1 - s), not s"),
        (dh * u * (s + g * (1 - s)), "sigmoid' wrong: sigmoid'(g) = s * (1 - s), not 1 - s"),
        (dh * s * (1 + g * (1 - s)), "dg forgot u: h = silu(g) * u, so dg = dh * u * silu'(g)"),
    ]
    du_wrong = [(dh * s, "du = dh * silu(g) = dh * g * sigmoid(g), not dh * sigmoid(g)"),
                (dh * g, "du = dh * silu(g) = dh * g * sigmoid(g), not dh * g")]

    def diagnose(outs: dict) -> list[str]:
        if _same(outs["dg"], du, tol_du) and _same(outs["du"], dg, tol_dg):
            return ["dg and du swapped"]
        return ([text for alt, text in dg_wrong if _same(outs["dg"], alt, tol_dg)]
                + [text for alt, text in du_wrong if _same(outs["du"], alt, tol_du)])

    return diagnose


def _silu_case(label: str, dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, in_place: bool = False) -> Case:
    """in_place: dg and du are g and u themselves (Out.alias), as the training step's backward passes them."""
    shape, dtype = tuple(g.shape), g.dtype
    s = torch.sigmoid(f64(g))
    dg = f64(dh) * f64(u) * s * (1 + f64(g) * (1 - s))
    du = f64(dh) * f64(g) * s
    tols = {"dg": _tol(dtype, dg), "du": _tol(dtype, du)}
    outs = ((Out("dg", shape, dtype, init=g, alias="g"), Out("du", shape, dtype, init=u, alias="u")) if in_place
            else (Out("dg", shape, dtype), Out("du", shape, dtype)))
    return _case(f"{label}, {_name(dtype)}", (dh, g, u, *outs), {"dg": dg, "du": du}, tols,
                 _silu_mistakes(dh, g, u, tols["dg"], tols["du"]))


def _silu_cases(gen):
    rows, hidden = size((1823, 781), (37, 80))
    for dtype in _dtypes():
        shapes = [
            ("one element", (1,), 1.0),
            (f"({rows}, {hidden}): no multiple of a block", (rows, hidden), 2.0),
            ("(3, 5, 77): any shape, treat it as flat", (3, 5, 77), 2.0),
            ("g spread to +-30: sigmoid saturates, no NaN (use tl.sigmoid)", (rows, hidden), 10.0),
            ("g spread to +-300: exp(g) overflows fp32 past 88.7, exp(g) / (1 + exp(g)) is inf / inf (use "
             "tl.sigmoid)", (rows, hidden), 100.0),
        ]
        if current().gpu:
            shapes.append(("(64, 14336), Llama-3-8B's MLP width", (64, 14336), 2.0))
        for label, shape, spread in shapes:
            yield _silu_case(label, randn(shape, dtype, gen), randn(shape, dtype, gen, spread),
                             randn(shape, dtype, gen))
    # The training step's backward writes dg and du into g's and u's own memory (eagerly, in place): a kernel
    # that loads g or u after storing a gradient over it passed every case above.
    dtype, shape = _dtypes()[-1], (rows, hidden)
    yield _silu_case(f"dg IS g and du IS u (in place, as the training step calls it): load g and u before storing "
                     f"either gradient, ({rows}, {hidden})", randn(shape, dtype, gen), randn(shape, dtype, gen, 2.0),
                     randn(shape, dtype, gen), in_place=True)

register(Exercise(
    "08.silu_mul_backward", "SwiGLU backward, the sigmoid recomputed", "silu_mul_backward(dh, g, u, dg, du)",
    _silu_cases,
    hint={"wrong": "in fp32: s = tl.sigmoid(g); du = dh * g * s; dg = dh * u * (s + g * s * (1 - s)); store "
                   "each once in its output's dtype; mask offsets < n",
          "unwritten": "launch over dh.numel() elements (not shape[0]) and store both dg and du in every program",
          "out_of_bounds": "mask = offsets < n on the three loads and the two stores",
          "nan": "use tl.sigmoid(g) = 1 / (1 + exp(-g)), never exp(g) / (1 + exp(g)), which is inf / inf for "
                 "large g; masked loads need the same mask on the stores"}))


# --- 08.cross_entropy -------------------------------------------------------------------------

def _ce64(logits, targets):
    """(loss, dlogits) in float64 by autograd of the mean loss; all-ignored rows -> zeros (see module doc)."""
    x = f64(logits).requires_grad_()
    t = targets.cpu()
    keep = t != IGNORE
    n = int(keep.sum())
    loss_rows = torch.nn.functional.cross_entropy(x, t, ignore_index=IGNORE, reduction="none")
    (loss_rows.sum() / max(n, 1)).backward()
    return loss_rows.detach(), x.grad, keep, n


def _ce_mistakes(logits, targets, tol_loss, tol_d):
    x = f64(logits)
    _, dl, keep, n = _ce64(logits, targets)
    rows = x.shape[0]
    safe = torch.where(keep, targets.cpu(), 0)
    x_t = x.gather(1, safe[:, None])[:, 0]
    m = x.max(-1).values
    lse2 = m + torch.log2(torch.exp2(x - m[:, None]).sum(-1))  # exp2/log2 on unscaled logits
    p2 = torch.exp2(x - lse2[:, None])
    onehot = torch.nn.functional.one_hot(safe, x.shape[1]).to(x.dtype)
    d2 = (p2 - onehot) * keep[:, None] / max(n, 1)
    lse = torch.logsumexp(x, -1)
    loss = torch.where(keep, lse - x_t, 0.0)
    loss_wrong = [
        (torch.where(keep, lse2 - x_t, 0.0), "log-sum-exp in base 2: exp2/log2 work on logits * log2(e) and "
         "give lse * log2(e); use tl.exp and tl.log (or scale in and out)"),
        (loss * math.log2(math.e), "log-sum-exp in base 2: log2 where the natural log goes"),
        (loss / max(n, 1), "the loss is per row: loss[i] = lse_i - logits[i, t]; only dlogits is divided by n"),
    ]
    d_wrong = [
        (dl * max(n, 1), f"gradient not divided by the non-ignored count: dlogits = (softmax - onehot) / n, n = {n}"),
        (dl * max(n, 1) / rows, f"gradient divided by all {rows} rows; divide by the {n} rows whose target is "
         "not -100"),
        (d2, "log-sum-exp in base 2: the softmax must be exp(x - lse) with the natural log"),
    ]

    def diagnose(outs: dict) -> list[str]:
        found = []
        ign = ~keep
        class0 = keep & (targets.cpu() == 0)
        if bool(class0.any()) and bool((outs["loss"].cpu()[class0] == 0).all()) \
                and bool((loss[class0] != 0).any()):
            found.append("rows whose target is class 0 were treated as ignored: only -100 means ignored "
                         "(test t != -100, not t > 0 or t >= 0 with 0 excluded)")
        if bool(ign.any()):
            if (outs["loss"].cpu()[ign] != 0).any() or (outs["dlogits"].cpu()[ign] != 0).any():
                found.append("ignore_index rows not zeroed: a row whose target is -100 gets loss 0 and dlogits 0")
        if n == 0 and not torch.isfinite(outs["dlogits"].cpu().double()).all():
            found.append("every target is ignored (n = 0): loss and dlogits are all 0, no division by n")
        found += [text for alt, text in loss_wrong if _same(outs["loss"], alt, tol_loss)]
        found += [text for alt, text in d_wrong if _same(outs["dlogits"], alt, tol_d)]
        return found

    return diagnose


def _targets(rows: int, vocab: int, gen, ignored: int = 0, ends: bool = False) -> torch.Tensor:
    """Random targets, `ignored` of them -100; ends=True: the first two rows target classes 0 and vocab - 1
    (class 0 is a class like any other: only -100 is ignored)."""
    t = torch.randint(vocab, (rows,), generator=gen)
    if ignored:
        t[torch.randperm(rows, generator=gen)[:ignored]] = IGNORE
    if ends:
        t[:2] = torch.tensor([0, vocab - 1])
    return t.to(current().device)


def _late_outlier(rows: int, vocab: int, dtype, gen) -> torch.Tensor:
    """Logits ~N(0, 2) with 120 at column vocab - 3: exp(120 - a first block's max) overflows fp32."""
    x = randn((rows, vocab), dtype, gen, 2.0)
    x[:, vocab - 3] = 120.0
    return x


def _ce_cases(gen):
    v1, v2 = size((32000, 50257), (1000, 2999))
    rows = size(64, 9)
    for dtype in _dtypes():
        inputs = [
            ("one row, vocab 1000", randn((1, 1000), dtype, gen), _targets(1, 1000, gen)),
            (f"{rows} rows, vocab {v1}: no power of 2, many blocks per row", randn((rows, v1), dtype, gen, 2.0),
             _targets(rows, v1, gen)),
            (f"13 rows, vocab {v2}, targets 0 and {v2 - 1} included", randn((13, v2), dtype, gen, 2.0),
             _targets(13, v2, gen, ends=True)),
            ("logits near 100: exp(100) overflows fp32 (and fp16), subtract the running max",
             randn((rows, v1), dtype, gen, 3.0, 100.0), _targets(rows, v1, gen)),
            (f"{rows} rows, vocab {v1}, one logit of 120 in each row's last block: the max grows after the first "
             "block (a running max, the sum rescaled)", _late_outlier(rows, v1, dtype, gen), _targets(rows, v1, gen)),
            (f"{rows} rows, 4 of them ignored (-100): loss 0 and dlogits 0 there, the rest divided by "
             f"{rows - 4}", randn((rows, v1), dtype, gen, 2.0), _targets(rows, v1, gen, ignored=4)),
            ("every target ignored: n = 0, loss and dlogits all 0", randn((5, v2), dtype, gen),
             _targets(5, v2, gen, ignored=5)),
            (f"logits a slice of a wider tensor (row stride {v2 + 5})", randn((7, v2 + 5), dtype, gen)[:, 2:2 + v2],
             _targets(7, v2, gen, ignored=1)),
        ]
        if dtype == torch.float32:  # one dtype: on the CPU each row is a program, run one after another
            many = size(2100, 1100)  # 76 rows past the first block of 1024 on the CPU: not all of them ignored
            inputs.append((f"{many} rows, more than a block of 1024, vocab 16, 100 ignored: the count of "
                           "non-ignored targets covers every row", randn((many, 16), dtype, gen, 2.0),
                           _targets(many, 16, gen, ignored=100, ends=True)))
        if not current().gpu and dtype == _dtypes()[-1]:  # last: the cases above draw what they drew before
            # The CPU's vocabularies above fit in one block of 4096 (the GPU's block): a kernel that never
            # loops over a row passed them all, and so did one whose ignored rows were zeroed over one block
            # (no loop in that branch). The GPU's cases have 32000 and 50257 already.
            # Near 100 and a slice: the narrow cases' overflow and stride mistakes, on a looping kernel's path.
            logits = randn((3, 32005), dtype, gen, 2.0, 100.0)[:, 2:2 + 32000]
            targets = _targets(3, 32000, gen)
            targets[1] = IGNORE  # set, not drawn: the cases after this one draw what they drew before
            inputs.append(("3 rows, vocab 32000 (Llama's), the second ignored, logits near 100 in a slice of a "
                           "wider tensor (row stride 32005): more than one block of 4096, loop over the whole "
                           "row in both passes (the running max subtracted, rows at their stride), and in the "
                           "ignored row's zeros", logits, targets))
        for label, logits, targets in inputs:
            yield _ce_case(f"{label}, {_name(dtype)}", logits, targets)
    # Last, so that the cases above draw what they drew before it came. In every case above each row has a
    # logit above -88, where exp() is still a normal fp32: a running max that starts at 0 instead of -inf
    # gave the right answer. Here exp(x - 0) is 0 for every logit, and log(0) = -inf.
    for dtype in _dtypes():
        yield _ce_case(f"{rows} rows, vocab {v2}, every logit near -120: exp(x) underflows to 0 unless the "
                       f"row max is subtracted (a running max that starts at -inf, not 0), {_name(dtype)}",
                       randn((rows, v2), dtype, gen, 2.0, -120.0), _targets(rows, v2, gen, ignored=1))
    # The training step passes the logits as dlogits too (mean_loss_grad_in_place): a kernel that reads a
    # logit after its row's gradient overwrote it (logits[target] after pass 2) passed every case above.
    dtype = _dtypes()[-1]
    yield _ce_case(f"dlogits IS logits (in place, as the training step calls it): read every logit you need "
                   f"before the row's gradient overwrites it, {rows} rows, vocab {v2}, {_name(dtype)}",
                   randn((rows, v2), dtype, gen, 2.0), _targets(rows, v2, gen, ignored=1), in_place=True)
    # In place AND strided: a vocabulary padded to a multiple of 64 gives logits = full[:, :vocab]. A kernel that
    # wrote dlogits at row * n_cols (its rows taken as contiguous) passed both cases above, each one of the two.
    yield _ce_case(f"dlogits IS logits, and logits a slice of a wider tensor (row stride {v2 + 5}): address "
                   f"dlogits with its own row stride, {rows} rows, vocab {v2}, {_name(dtype)}",
                   randn((rows, v2 + 5), dtype, gen, 2.0)[:, 2:2 + v2], _targets(rows, v2, gen, ignored=1),
                   in_place=True)
    # No row above is confident: p of the target is far from 1, so p - 1 is no small difference of two
    # numbers near 1, and a p rounded to 16 bits before it stayed inside the tolerance. A trained model's rows
    # are confident: p of the target 0.6 to 0.9999 here, where that rounding is ~10 times the tolerance.
    x = randn((16, 1000), torch.float32, gen)
    t = _targets(16, 1000, gen)
    x[torch.arange(16, device=x.device), t] += torch.linspace(6.0, 14.0, 16, device=x.device)
    yield _ce_case("16 rows, vocab 1000, the target logit 6 to 14 above the rest (a confident model, p of the "
                   "target 0.6 to 0.9999): the target's gradient (p - 1) / n is a small difference, so keep p in "
                   "fp32 until it, and round once, at the store, float16", x.to(torch.float16), t)


def _ce_case(label: str, logits: torch.Tensor, targets: torch.Tensor, in_place: bool = False) -> Case:
    dtype = logits.dtype
    loss, dl, _, n = _ce64(logits, targets)
    big = float(f64(logits).abs().max())
    rtol_d = 8 * EPS[dtype] + 2.0**-21 * big  # exp(x - lse) inherits lse's rounding (~1e-5 at 100)
    # The target's column is (p - 1) / n, computed in fp32: where p is near 1 its rounding is relative
    # to 1, not to p - 1, so every entry may be off by fp32's rtol_d / n (wrong answers: far more).
    cancel = (8 * EPS[torch.float32] + 2.0**-21 * big) / max(n, 1)
    tol_d = (max(cancel, 2.0**-24 if dtype == torch.float16 else 1e-30), rtol_d)
    tol_loss = (2.0**-20 * (1 + big), 2.0**-20)
    rows, vocab = logits.shape
    dlogits = (Out("dlogits", (rows, vocab), dtype, init=logits, alias="logits") if in_place
               else Out("dlogits", (rows, vocab), dtype))
    args = (logits, targets, Out("loss", (rows,), torch.float32), dlogits)
    return _case(label, args, {"loss": loss, "dlogits": dl}, {"loss": tol_loss, "dlogits": tol_d},
                 _ce_mistakes(logits, targets, tol_loss, tol_d))


register(Exercise(
    "08.cross_entropy", "cross-entropy: loss and dlogits in one pass of online statistics",
    "cross_entropy(logits, targets, loss, dlogits)", _ce_cases,
    hint={"wrong": "n = count_targets(targets) (a device scalar); one program per row: if the target is -100 "
                   "write zeros; else pass 1 over blocks keeps (m, d) per lane as in lesson 05 (other=-inf), "
                   "lse = m + log(d) merged over lanes, loss = lse - logits[target]; pass 2 writes (exp(x - "
                   "lse) - (col == target)) / n",
          "unwritten": "every row writes its loss and every column of its dlogits row (zeros for a target of "
                       "-100); rows longer than one block loop over all their blocks in both passes, and so "
                       "does the writing of an ignored row's zeros",
          "out_of_bounds": "mask columns >= vocab on every load (other=-inf) and store; load logits[target] only "
                           "for targets != -100",
          "nan": "a lane that saw only -inf has m = -inf: subtract 0 there, not -inf; ignored rows (target -100) "
                 "write zeros without any division",
          "host": "n, the number of targets that are not -100, comes from count_targets(targets) (given): a "
                  "1-element device tensor that your kernel loads, not (targets != -100).sum() in PyTorch; "
                  "the softmax, the loss and the gradient happen in your kernel"}))


# --- 08.rmsnorm_train -------------------------------------------------------------------------

def _train_verify(x, weight, eps, dy, pair: dict | None = None, role: str = ""):
    """pair, role: two cases of one shape share `pair`; the "first" case's verify checks its forward and keeps
    its output without differentiating it, the "second" runs its own backward and then the first's, as a
    model does (every layer's forward, then the backwards in reverse order)."""
    y64, dx64, dw64, rstd = _rmsnorm_grads(x, weight, eps, dy)
    dtype, hidden = x.dtype, x.shape[-1]
    rows = x.numel() // hidden
    given = {"x": x.untyped_storage().nbytes(), "weight": weight.untyped_storage().nbytes()}  # before the call
    tol_y, tol_dx = _tol(dtype, y64), _dx_tol(dtype, dx64, dy, weight, rstd)
    tol_dw = _dw_tol(dy, x, rstd)
    if weight.dtype != torch.float32:  # dw is returned in weight's dtype: one more rounding
        tol_dw = (tol_dw[0] + 4 * EPS[weight.dtype] * float(dw64.abs().max()), 4 * EPS[weight.dtype] + tol_dw[1])
    diagnose = _rmsnorm_mistakes(dy, x, weight, rstd, tol_dx, tol_dw)

    def differentiate(result, prefix: str = "") -> list[str]:
        """result.backward(dy) watched, then x.grad and weight.grad against float64 autograd."""
        problems = []
        try:
            with watching() as watch:  # the student's backward: it must run their kernels too
                result.backward(dy)
        except Exception as exc:
            return [f"{prefix}backward raised {type(exc).__name__}: {exc}"]
        if not watch.launches:
            problems.append("the backward launched no Triton kernel: compute dx and dw with your "
                            "rmsnorm_backward kernel, not with PyTorch")
        problems += backward_problems("08.rmsnorm_train", watch)
        for name, t in (("x", x), ("weight", weight)):
            if t.grad is None:
                problems.append(f"no gradient reached `{name}`: backward returns (dx, dw, None), one per input")
        if problems:
            return problems
        if x.grad.dtype != x.dtype or weight.grad.dtype != weight.dtype:
            problems.append(f"gradients must have their inputs' dtypes: dx {x.grad.dtype}, dw {weight.grad.dtype}")
        found = compare(f"{prefix}x.grad", x.grad.reshape(-1, hidden), dx64, *tol_dx)
        found += compare(f"{prefix}weight.grad", weight.grad, dw64, *tol_dw)
        if found and prefix:
            found.append("likely mistake: the backward used another forward's state: it must read what ITS "
                         "forward saved (ctx.saved_tensors, ctx attributes), never module globals or class "
                         "attributes, and the forward saves tensors of its own (rstd from torch.empty in every "
                         "call, not a buffer reused from call to call): the next forward overwrites them, and a "
                         "model runs every layer's forward before the first backward")
        elif found:
            found += [f"likely mistake: {t}" for t in diagnose({"dx": x.grad.reshape(-1, hidden), "dw": weight.grad})]
        return problems + found

    def first_again(result) -> list[str]:
        """The first forward's output once the second forward ran, then its backward."""
        changed = compare("the FIRST forward's y", result.detach(), y64.view(x.shape), *tol_y)
        if changed:
            return changed + ["likely mistake: the second forward wrote into the first forward's output: each "
                              "forward returns a tensor of its own (torch.empty in every call), never a buffer "
                              "kept and reused from call to call"]
        return differentiate(result, "the FIRST forward's ")

    def verify(result, case) -> list[str]:
        if not isinstance(result, torch.Tensor) or tuple(result.shape) != tuple(x.shape):
            return [f"returned {type(result).__name__} {getattr(result, 'shape', '')}; expected a tensor of "
                    f"x's shape {tuple(x.shape)}"]
        if result.dtype != x.dtype:  # a model's next layer (an fp16 Linear) takes x's dtype, not fp32
            return [f"returned a {_name(result.dtype)} tensor for a {_name(x.dtype)} x: y has x's dtype, as "
                    "RMSNorm's output feeds the next layer (allocate y with torch.empty_like(rows))"]
        fn = result.grad_fn
        if not isinstance(fn, torch.autograd.function.BackwardCFunction):
            inner = fn.next_functions[0][0] if fn is not None and fn.next_functions else None
            if isinstance(inner, torch.autograd.function.BackwardCFunction):  # apply(...).view(x.shape)
                return [f"the output's grad_fn is {type(fn).__name__}, an op on your Function's output (a "
                        ".view or .reshape after .apply?): the check reads what your Function saved from the "
                        "output's own grad_fn, so reshape inside forward (and backward) and return "
                        "YourFunction.apply(x, weight, eps) as it is"]
            return [f"the output's grad_fn is {type(fn).__name__ if fn else None}: return "
                    "YourFunction.apply(x, weight, eps), a torch.autograd.Function"]
        problems = _saved_problems(fn, x, weight, rows, hidden, result, given)
        problems += compare("y", result.detach(), y64.view(x.shape), *tol_y)
        # (in the batch grader too: the sandbox keeps each call's output for the backward asked of it)
        if role == "first" and not problems:
            pair["first"] = lambda: first_again(result)  # run by the second case
            return []
        if problems:
            return problems
        problems = differentiate(result)
        first = pair.pop("first", None) if role == "second" else None
        return problems or (first() if first is not None else [])

    return verify


# What the forward may keep alive for the backward besides x, weight and its output: rstd, 4 bytes a row
# (16: room for a mean as well, or rstd in fp64), and a few scalars (eps or a shape as tensors). An x-hat
# copy is 2 to 4 bytes per element: 1562 to 3124 bytes a row at hidden 781.
KEPT_PER_ROW, KEPT_SLACK = 16, 256


def _saved_problems(fn, x: torch.Tensor, weight: torch.Tensor, rows: int, hidden: int,
                    output: torch.Tensor, given: dict[str, int]) -> list[str]:
    """What the forward kept for the backward: ctx.save_for_backward's tensors and any ctx attribute, and
    (remote.kept_alive) the bytes of all it keeps alive, which must grow with the rows, not with rows x hidden.
    given: the bytes of x's and weight's storages before the call."""
    try:
        saved = list(fn.saved_tensors)
    except RuntimeError as exc:
        return [f"could not read the saved tensors: {exc}"]
    saved += [t for _, t in ctx_tensors(vars(fn))] if hasattr(fn, "__dict__") else []  # lists, dicts too
    inputs = {x.untyped_storage().data_ptr(), weight.untyped_storage().data_ptr()}
    # A copy of the weight (weight.float() for an fp32 backward) is (hidden,): per column, not per element of x;
    # at one row it is as large as an x-hat, so it is told apart by its values.
    w64 = weight.detach().double().flatten().cpu()
    inputs |= {t.untyped_storage().data_ptr() for t in saved if t.numel() == hidden and t.is_floating_point()
               and torch.equal(t.detach().double().flatten().cpu(), w64)}
    # more than two values a row (rstd, or a mean beside it): with hidden = 1 or 2, rstd itself has rows x hidden
    copies = [t for t in saved if t.numel() >= rows * hidden and t.numel() > 2 * rows
              and t.untyped_storage().data_ptr() not in inputs]
    problems = []
    advice = "save x, weight and rstd (rows,) fp32, and recompute xhat = x * rstd in the backward"
    if copies:
        shapes = ", ".join(f"{tuple(t.shape)} {_name(t.dtype)}" for t in copies)
        rows_of_x = x.detach().reshape(-1, hidden)
        # x.reshape(-1, hidden).contiguous() of a non-contiguous x: a new tensor with x's values
        if any(t.numel() == x.numel() and t.dtype == x.dtype
               and torch.equal(t.detach().reshape(-1, hidden), rows_of_x) for t in copies):
            advice = ("that is a contiguous copy of x (this x is not contiguous, so .contiguous() made a new "
                      "tensor, kept alive until the backward): save x itself, the input, and make its rows "
                      "contiguous again in the backward, a copy that lives only while the backward runs")
        problems.append(f"the forward keeps a (rows, hidden) tensor besides x ({shapes}): {advice}")
    else:
        kept = kept_alive(fn, inputs | {output.untyped_storage().data_ptr()})
        # The storages of x, weight and the output are skipped above as theirs: but the output may be a view of
        # a larger buffer, or an input's storage grown in the forward (resize_), whose rest (a copy of x-hat,
        # say) lives as long as they do. That rest counts.
        for address, rest in storage_rests([("x", x, given["x"]), ("weight", weight, given["weight"])],
                                           output).items():
            kept.setdefault(address, rest)
        total = sum(nbytes for nbytes, _ in kept.values())
        if total > KEPT_PER_ROW * rows + KEPT_SLACK:
            shown = ", ".join(what for _, what in sorted(kept.values(), key=lambda k: -k[0])[:4])
            problems.append(
                f"the forward keeps {total} bytes alive for the backward besides x, weight and the output "
                f"({shown}): {total / rows:.0f} bytes a row, where rstd takes 4 (rows = {rows}, hidden = "
                f"{hidden}). Split, or inside an object or a closure on ctx, a copy of x-hat still holds "
                f"rows x hidden values: {advice}")
    # rstd may be padded to whole blocks of rows (stored unmasked) and sliced in the backward, or kept in x's
    # leading shape ((batch, seq) for x (batch, seq, hidden)); the weight, an fp32 copy of it and x are not it
    if not any(rows <= t.numel() < rows + 1024 and t.dtype == torch.float32
               and t.untyped_storage().data_ptr() not in inputs for t in saved):
        problems.append(f"the forward saves no rstd: ctx.save_for_backward(x, weight, rstd) with rstd ({rows},) "
                        "fp32, or in x's leading shape")
    return problems


def _draw(shape, dtype, gen, column_major: bool) -> torch.Tensor:
    """Normal values of `shape`, row-major or column-major (the transposed view of the reversed shape)."""
    return randn(shape[::-1], dtype, gen).t() if column_major else randn(shape, dtype, gen)


def _train_cases(gen):
    rows, hidden = size((1823, 781), (13, 781))
    for dtype in _dtypes():
        # (label, shape, which of x and dy is column-major: the transposed view of a (hidden, rows) tensor)
        shapes = [("one row of 48", (1, 48), ""), (f"{rows} rows x hidden {hidden}", (rows, hidden), ""),
                  ("x (2, 7, 80): (batch, seq, hidden), y and dx keep x's shape", (2, 7, 80), "")]
        shapes.append((f"{rows} rows x hidden {hidden}, dy transposed (column-major, as a matmul's gradient "
                       "can come): use dy's own strides or make it contiguous", (rows, hidden), "dy"))
        shapes.append((f"{rows} rows x hidden {hidden}, x transposed (column-major: a row's elements are not "
                       "consecutive): make the rows contiguous before the kernels read them",
                       (rows, hidden), "x"))
        shapes.append(("13 rows x hidden 80, eps = 0.1, as large as mean(x**2): pass eps to the forward kernel",
                       (13, 80), "eps"))
        for label, shape, column_major in shapes:
            # Parameters: leaves that collect .grad, and that the harness passes as they are (not copied)
            x = torch.nn.Parameter(_draw(shape, dtype, gen, column_major == "x"))
            weight = torch.nn.Parameter(uniform((shape[-1],), 0.5, 1.5, dtype, gen))
            dy = _draw(shape, dtype, gen, column_major == "dy")
            eps = 0.1 if column_major == "eps" else 1e-6
            yield Case(f"{label}, {_name(dtype)}", (x, weight, eps), None, verify=_train_verify(x, weight, eps, dy))
    # Last, so that the cases above draw what they drew before they came. Each case above ran one forward and
    # its backward at once: a backward that read x or rstd from module globals (or class attributes) set by
    # the forward, not from its own ctx, passed them all. A model runs every layer's forward, then the
    # backwards in reverse order: here two forwards, the second's backward, then the first's.
    pair: dict = {}
    for role in ("first", "second"):
        x = torch.nn.Parameter(randn((13, 80), torch.float32, gen))
        weight = torch.nn.Parameter(uniform((80,), 0.5, 1.5, torch.float32, gen))
        dy = randn((13, 80), torch.float32, gen)
        label = ("two forwards before their backwards, like two layers of a model: the first forward, "
                 "differentiated in the next case" if role == "first" else
                 "two forwards before their backwards: the second forward, then its backward and the first's, "
                 "each backward with what its own forward saved on ctx")
        yield Case(f"{label}, float32", (x, weight, 1e-6), None,
                   verify=_train_verify(x, weight, 1e-6, dy, pair, role))
    # Every x above has weight's dtype: a y allocated in weight's dtype, or a dw returned in x's, passed them all
    x = torch.nn.Parameter(randn((13, 781), torch.float16, gen))
    weight = torch.nn.Parameter(uniform((781,), 0.5, 1.5, torch.float32, gen))
    dy = randn((13, 781), torch.float16, gen)
    yield Case("x float16 and weight float32 (a model kept in fp16 with its norms in fp32): y and dx in x's "
               "dtype, dw in weight's", (x, weight, 1e-6), None, verify=_train_verify(x, weight, 1e-6, dy))


register(Exercise(
    "08.rmsnorm_train", "a differentiable RMSNorm: torch.autograd.Function on the two kernels",
    "rmsnorm_train(x, weight, eps)", _train_cases, kernel=False, needs_kernels=True, host_arithmetic=False,
    hint="forward: rows = x.reshape(-1, hidden).contiguous(), y and rstd (rows,) fp32 from rmsnorm_forward, "
         "ctx.save_for_backward(x, weight, rstd), return y.view(x.shape); backward: dx, dw from rmsnorm_backward "
         "on dy.reshape(rows.shape).contiguous(), return dx.view(x.shape), dw.to(weight.dtype), None"))


# --- 08.attention_backward --------------------------------------------------------------------

def _attention64(q, k, v, do, causal: bool):
    """(o, lse, dq, dk, dv) in float64."""
    q64, k64, v64 = (f64(t).requires_grad_() for t in (q, k, v))
    s = q64 @ k64.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        S = q.shape[-2]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ v64
    o.backward(f64(do))
    return o.detach(), lse.detach(), q64.grad, k64.grad, v64.grad


def _attention_case(B, H, S, D, causal, dtype, gen, note="", future_outlier=None, qk_std=1.0):
    """future_outlier: the score of a key hidden from every earlier query (hide_a_key_from_earlier_queries);
    qk_std: q's and k's."""
    eps = TF32_EPS if (dtype == torch.float32 and current().gpu) else EPS[dtype]
    q, k, v, do = (randn((B, H, S, D), dtype, gen, qk_std if i < 2 else 1.0) for i in range(4))
    if future_outlier is not None:
        hide_a_key_from_earlier_queries(q, k, future_outlier)
    o, lse, dq, dk, dv = _attention64(q, k, v, do, causal)
    slack = 64 if dtype == torch.float32 else 16
    tols = {n: _tol(dtype, t, slack, eps, floor=1.0) for n, t in (("dq", dq), ("dk", dk), ("dv", dv))}
    _, _, nq, nk, nv = _attention64(q, k, v, do, not causal) if S > 1 else (None,) * 5
    wrong = [] if nq is None else [(nq, "dq"), (nk, "dk"), (nv, "dv")]

    def diagnose(outs):
        found = []
        for name, want in (("dq", dq), ("dk", dk)):
            if _same(outs[name], want * math.sqrt(D), tols[name]):
                found.append(f"{name} lacks the scale 1/sqrt(D) (s = q k^T * scale: the chain rule "
                             "multiplies ds by it)")
        if wrong and all(_same(outs[name], alt, tols[name]) for alt, name in wrong):
            found.append("the causal mask is " + ("missing" if causal else "applied where causal=False"))
        return found

    args = (q, k, v, o.to(dtype).to(q.device), lse.to(torch.float32).to(q.device), do,
            Out("dq", (B, H, S, D), dtype), Out("dk", (B, H, S, D), dtype), Out("dv", (B, H, S, D), dtype),
            causal)
    label = f"({B}, {H}, {S}, {D}), {'causal' if causal else 'not causal'}"
    if B > 1 and H > 1:
        label += ": every (batch, head) pair its own programs (grid over B * H, offsets by both strides)"
    if S % 16:
        label += f": S = {S} is no multiple of a block, mask queries and keys"
    if S > 128:
        label += "; more than one tile of 128: loop over every query tile (dk, dv) and key tile (dq)"
    return _case(f"{label}{note}, {_name(dtype)}", args, {"dq": dq, "dk": dk, "dv": dv}, tols, diagnose)


def _attention_cases(gen):
    for dtype in _dtypes():
        shapes = size(
            [((2, 3, 300, 64), False), ((2, 3, 300, 64), True), ((1, 2, 1023, 128), True), ((1, 1, 1, 64), False)],
            [((1, 2, 37, 16), False), ((1, 1, 33, 32), True), ((1, 1, 1, 16), False),
             ((1, 1, 150, 16), True), ((2, 2, 20, 16), True),
             # Last: a non-causal case of several tiles even of 64 or 128, whose loops must cover every
             # query tile (dk, dv) and every key tile (dq); loops with the causal bounds pass all above.
             ((1, 1, 150, 16), False)])
        for (B, H, S, D), causal in shapes:
            yield _attention_case(B, H, S, D, causal, dtype, gen)
    # Last, so that the cases above draw what they drew before these came. No S above is a multiple of 128:
    # EVEN_S (S % 128 == 0, given) was never True, and a kernel whose EVEN_S path was wrong (EVEN_S read as
    # "no mask at all", the causal diagonal's included) passed.
    S, D = size((256, 64), (128, 16))
    for causal in (True, False):
        note = f": S = {S}, a multiple of 128, EVEN_S is True: no tile runs past the end"
        if causal:
            note += ", but the causal diagonal still needs its mask"
        yield _attention_case(1, 1, S, D, causal, torch.float16, gen, note)
    # Every D of the interpreter's cases above is 16 or 32: a head-dim block fixed at 32 passed them all
    if not current().gpu:
        yield _attention_case(1, 1, 37, 64, False, torch.float32, gen,
                              ": D = 64, the block of the head dim is D itself (HEAD_DIM=D), never a fixed size")
    # Every score above is ~N(0, 1): a mask multiplied into p (p * (j <= i)) is exact while exp() of a masked
    # score stays finite. Here masked scores lie ~97 above the lse of the queries that may not see them.
    yield _attention_case(1, 1, 40, 16, True, torch.float32, gen,
                          ": the last key scores ~97 for every earlier query, hidden from them by the mask; "
                          "exp() of it is inf, and inf * 0 is NaN: mask with tl.where, not by multiplying",
                          future_outlier=97.5)
    # Scores of std 1 above: rounded to 16 bits (the recomputed s, or the saved lse loaded as q's dtype) they
    # move p by ~0.1 %, inside the tolerance. q and k of std 6 give q k^T of std 144 (scores, over sqrt(16), of
    # std 36) and an lse of tens, where fp16 rounds by up to 2^-5 to 2^-4: p off by a few %. (On a GPU, 16-bit
    # scores from q and k of std 4 passed.)
    yield _attention_case(1, 1, 150, 16, True, torch.float16, gen,
                          ": q and k of std 6 (scores of std 36): recompute s and p = exp2(s * scale - lse) in fp32, "
                          "from the fp32 lse, never from 16-bit scores or a 16-bit lse", qk_std=6.0)


register(Exercise(
    "08.attention_backward", "FlashAttention-2 backward from the saved log-sum-exp (bonus)",
    "attention_backward(q, k, v, o, lse, do, dq, dk, dv, causal)", _attention_cases,
    hint={"wrong": "delta = attention_delta(o, do); per key tile: loop over query tiles, p^T = exp(k q^T * "
                   "scale - lse), dv += p^T do, ds^T = p^T * (v do^T - delta), dk += ds^T q, store dk * "
                   "scale; per query tile: loop over key tiles, dq += ds k, store dq * scale; mask keys and "
                   "queries >= S (and j > i when causal)",
          "unwritten": "dk and dv: one program per key tile of every (b, h); dq: one per query tile; each "
                       "stores its whole tile (masked past S)",
          "out_of_bounds": "mask keys >= S and queries >= S on every load (other=0) and store; element (b, h, s, "
                           "d) of each contiguous tensor is at ((b * H + h) * S + s) * D + d",
          "nan": "masked queries and keys must give p = 0: load them with other=0 (lse too), never "
                 "exp(-inf - (-inf))"}))
