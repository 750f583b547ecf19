"""FP8 formats bit by bit, and a correct fp8 conversion for Triton's interpreter.

The two FP8 formats of the course (OCP FP8, what Hopper and Ada tensor cores take):

    format  torch / Triton                         bits   bias  largest  min subnormal  inf?
    e4m3fn  torch.float8_e4m3fn / tl.float8e4nv    1-4-3  7     448      2^-9           no (S.1111.111: NaN)
    e5m2    torch.float8_e5m2   / tl.float8e5      1-5-2  15    57344    2^-16          yes (S.11111.00)

Triton's interpreter converts float -> fp8 wrongly for about 1% of the values in range: see
course_utils.fp8_interpreter, which holds the bit formats and the fix (`install_fp8_fix`,
re-exported here for lesson 07, which shows the bug and the fix).

`install_fp8_fix()` swaps that function for one that rounds exactly like the GPU does: Triton lowers
`x.to(tl.float8e4nv)` and `x.to(tl.float8e5)` to PTX `cvt.rn.satfinite`, i.e. round to nearest, ties
to even, and *saturate*: a finite value beyond the largest finite fp8 (and +-inf) becomes +-448
(+-57344 in e5m2), NaN stays NaN. PyTorch agrees on every in-range value. Out of range it differs by
version: recent torch (2.12 on) saturates e4m3fn the same way; torch 2.11 and older (and ml_dtypes)
turn |x| > 464 into NaN; torch's e5m2 cast overflows to inf. So clamp to +-448 yourself before a cast
and every one of them agrees.
"""
from __future__ import annotations

import os

from .fp8_interpreter import (  # noqa: F401 - lesson 07 reads the formats and the fix from here
    E4M3,
    E5M2,
    FORMATS,
    Fp8Format,
    _fixed,
    _rtne_mode,
    _table,
    conversion_errors,
    decode,
    encode,
    install_fp8_fix,
    probe_values,
    table,
    uninstall_fp8_fix,
)


# --- which mode this lesson can use ---------------------------------------------------------

def fp8_mode() -> str | None:
    """The mode to pass to `setup()` in an FP8 notebook: "interpret" on a CUDA GPU older than sm_89
    (Triton has no e4m3 there), None (setup's usual choice) otherwise or when a mode was asked for."""
    if os.environ.get("COURSE_MODE") or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) >= (8, 9):
        return None
    print(f"this GPU is sm_{major}{minor}: Triton has no float8_e4m3fn before sm_89 (Ada, Hopper), "
          "so this lesson runs its kernels in the interpreter, at CPU sizes")
    return "interpret"


def fp8_dot_supported() -> bool:
    """Can `tl.dot` take fp8 operands in the current mode? (the interpreter upcasts them to fp16)"""
    from .mode import current

    if current().interpret:
        return True
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 9)


# --- PyTorch references -----------------------------------------------------------------------

E4M3_MAX = 448.0  # largest finite float8_e4m3fn: 0 1111 110 = 1.75 * 2^8


def quantize_blockwise_ref(x, block: tuple[int, int]):
    """Scaled e4m3 quantization with one scale per (block[0] x block[1]) tile of a 2-D x.

    block = x.shape: per tensor; (1, cols): per row; (1, 128): DeepSeek-V3's activations; (128, 128): its
    weights. Returns (q, scales): q e4m3 like x, scales fp32 (ceil(rows/br), ceil(cols/bc)) with
    x ~ q * scale of its tile. The tile's amax maps to 448; an all-zero tile gets scale 1.
    """
    import torch

    rows, cols = x.shape
    br, bc = block
    gr, gc = -(-rows // br), -(-cols // bc)
    padded = torch.zeros(gr * br, gc * bc, dtype=torch.float32, device=x.device)
    padded[:rows, :cols] = x.float()
    tiles = padded.view(gr, br, gc, bc)  # (gr, br, gc, bc)
    amax = tiles.abs().amax(dim=(1, 3))  # (gr, gc)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (tiles / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(gr * br, gc * bc)[:rows, :cols].contiguous(), scale


def dequantize_blockwise_ref(q, scales, block: tuple[int, int]):
    """float32 values of a blockwise-quantized tensor: q * its tile's scale."""
    rows, cols = q.shape
    s = scales.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:rows, :cols]
    return q.float() * s


def quantize_rowwise_ref(x):
    """(q e4m3 (rows, cols), scale fp32 (rows,)): x ~ q * scale[:, None], each row's amax maps to 448."""
    q, scale = quantize_blockwise_ref(x, (1, x.shape[1]))
    return q, scale[:, 0]


def fp8_matmul_ref(a, a_scale, b, b_scale):
    """(a * a_scale[:, None]) @ (b * b_scale[:, None]).T in float64 on the CPU; a (M, K), b (N, K) e4m3."""
    import torch

    a64 = a.detach().cpu().to(torch.float64) * a_scale.detach().cpu().to(torch.float64)[:, None]
    b64 = b.detach().cpu().to(torch.float64) * b_scale.detach().cpu().to(torch.float64)[:, None]
    return a64 @ b64.T
