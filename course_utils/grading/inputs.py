"""Inputs for checks: random tensors from the checker's generator, awkward layouts, tolerances."""
from __future__ import annotations

import math

import torch

from ..mode import current

# Unit roundoff of each dtype's significand: the size of one rounding step, relative.
EPS = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
TF32_EPS = 2.0**-11  # tensor cores round fp32 operands to 10 explicit mantissa bits


def randn(shape, dtype=torch.float32, gen: torch.Generator | None = None, scale: float = 1.0,
          offset: float = 0.0) -> torch.Tensor:
    """Normal samples drawn on the CPU (reproducible from the seed), then moved to the mode's device."""
    t = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + offset
    return t.to(dtype).to(current().device)


def uniform(shape, low: float, high: float, dtype=torch.float32, gen: torch.Generator | None = None):
    t = torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low
    return t.to(dtype).to(current().device)


def transposed(shape, dtype=torch.float32, gen=None, scale: float = 1.0) -> torch.Tensor:
    """A (rows, cols) tensor stored column-major: strides (1, rows)."""
    rows, cols = shape
    return randn((cols, rows), dtype, gen, scale).t()


def sliced(shape, dtype=torch.float32, gen=None, scale: float = 1.0, step: int = 2) -> torch.Tensor:
    """A (rows, cols) view of a wider tensor, every `step`-th column: row stride != cols."""
    rows, cols = shape
    return randn((rows, cols * step + 1), dtype, gen, scale)[:, 1::step]


def hide_a_key_from_earlier_queries(q: torch.Tensor, k: torch.Tensor, score: float) -> None:
    """Causal attention's (..., S, D) q and k, in place: the last key scores `score` (q k / sqrt(D)) for every
    query but the last, which the causal mask hides it from; the last query, the only one that sees it,
    scores it near 0 (q[0] = 0), and every score a query sees stays ~N(0, 1)."""
    q[..., 0] = 3.0
    q[..., -1, 0] = 0.0
    k[..., -1, 0] = score * math.sqrt(q.shape[-1]) / 3.0


def f64(t: torch.Tensor) -> torch.Tensor:
    """The exact values of a tensor in float64 on the CPU: what references compute with."""
    return t.detach().to("cpu").to(torch.float64)


def tolerance(dtype: torch.dtype, *, k: int = 1, dot: bool = False, slack: float = 8.0) -> tuple[float, float]:
    """(atol, rtol) for outputs of `dtype` against a float64 reference.

    Each output is rounded once (rtol ~ eps of its dtype); a dot product of length k adds rounding
    errors that grow like sqrt(k) times the operands' magnitude (atol). fp32 dots on a GPU run as
    TF32 unless asked otherwise; in the interpreter they are exact fp32.
    """
    eps = EPS[dtype]
    if dot and dtype == torch.float32 and current().gpu:
        eps = TF32_EPS
    if dot and dtype in (torch.float16, torch.bfloat16):
        eps = max(eps, EPS[dtype])
    rtol = slack * eps
    atol = slack * eps * (math.sqrt(k) if dot else 1.0)
    return atol, rtol
