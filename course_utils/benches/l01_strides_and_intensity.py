"""Lesson 01 on a GPU: the device's ceilings and real operations placed on its roofline.

Rows:
- the ceilings (groups `roofline.COPY_GROUP`, `MATMUL_GROUP`, `CORE_GROUP`): a 1 GiB device-to-device
  copy, torch.matmul at 4096^3 and 8192^3 in bf16 and in fp32 on TF32 tensor cores (the roof of a
  precision is its best rate over every square matmul timed), and an FMA-bound kernel for the CUDA
  cores' fp32 roof, under which elementwise work and softmax sit;
- operations, each with its bytes and FLOPs so that its intensity can be read back from the row:
  ReLU fp32 and int8 and vector add fp32 (our lesson 02 kernels at a few block sizes, and torch),
  torch.softmax, torch.matmul from 64^3 to 8192^3, a matrix-vector product and decode-like skinny matmuls;
  launch-bound ones (under 20 µs) also replayed from a CUDA graph ("[graph]" rows: the GPU's own speed).
`run` also draws results/01_roofline.<device>.png from the same rows (`roofline.plot_results`), and
records the figures the lesson's prose cites (`table.fact`): ceilings and ridge points.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..bench import Table, device_key, results_dir
from ..lessons.l02_first_kernels import add, relu
from ..roofline import (
    CORE_ROOF,
    DATASHEETS,
    add_cost,
    ceilings_from_results,
    matmul_op,
    matmul_precision,
    matmul_roofs,
    measure_ceilings,
    plot_results,
    points_from_rows,
    relu_cost,
    softmax_cost,
)


def roofline_png(device: str | None = None) -> Path:
    """results/01_roofline.<device>.png: the roofline drawn from this GPU's (or `device`'s) rows."""
    return results_dir() / f"01_roofline.{device or device_key()}.png"


@dataclass(frozen=True)
class Sizes:
    elements: int  # ReLU and vector add
    blocks: tuple[int, ...]  # BLOCK sizes of our lesson 02 kernels
    softmax: tuple[tuple[int, int], ...]  # (rows, cols)
    matmul: tuple[int, ...]  # M = N = K, in the lower precision (bf16)
    matmul_high: tuple[int, ...]  # M = N = K, fp32 inputs on TF32 tensor cores
    skinny: tuple[int, ...]  # M of (M, K) @ (K, N) with K = N = `skinny_kn`: matrix-vector, decode steps
    skinny_kn: int = 8192


FULL = Sizes(1 << 28, (1024, 2048, 4096), ((4096, 32768), (32768, 4096), (16384, 1024)),
             (64, 128, 256, 512, 1024, 2048, 4096, 8192), (1024, 4096), (1, 16, 128))
QUICK = Sizes(1 << 26, (1024,), ((4096, 8192),), (64, 256, 1024, 4096), (1024,), (1,))  # a notebook on a GPU


def _elementwise(table: Table, s: Sizes, device: str) -> None:
    n = s.elements
    label = f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)
    x = torch.randn(n, device=device)  # (n,) fp32
    y = torch.randn(n, device=device)
    out = torch.empty_like(x)
    relu(x, out)
    torch.testing.assert_close(out, torch.relu(x))  # checked before timed
    add(x, y, out)
    torch.testing.assert_close(out, x + y)

    group, cost = f"relu fp32 {label}", relu_cost(n, 4)  # 1 FLOP, 8 bytes per element
    for block in s.blocks:
        table.time(group, f"triton (ours) BLOCK={block}", lambda b=block: relu(x, out, BLOCK=b),
                   n_bytes=cost.n_bytes, flops=cost.flops)
    table.time(group, "torch.relu (clamp_min)", lambda: torch.clamp_min(x, 0, out=out),
               n_bytes=cost.n_bytes, flops=cost.flops)

    group, cost = f"vector add fp32 {label}", add_cost(n, 4)  # 1 FLOP, 12 bytes per element
    for block in s.blocks:
        table.time(group, f"triton (ours) BLOCK={block}", lambda b=block: add(x, y, out, BLOCK=b),
                   n_bytes=cost.n_bytes, flops=cost.flops)
    table.time(group, "torch.add", lambda: torch.add(x, y, out=out), n_bytes=cost.n_bytes, flops=cost.flops)


def _relu_int8(table: Table, s: Sizes, device: str) -> None:
    n = s.elements
    label = f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)
    xi = torch.randint(-128, 128, (n,), device=device, dtype=torch.int8)  # (n,) int8
    oi = torch.empty_like(xi)
    group, cost = f"relu int8 {label}", relu_cost(n, 1)  # 1 FLOP, 2 bytes per element
    table.time(group, "torch.relu (clamp_min)", lambda: torch.clamp_min(xi, 0, out=oi),
               n_bytes=cost.n_bytes, flops=cost.flops)
    try:  # the lesson 02 kernel compares with 0.0 and stores back into int8: check before timing
        relu(xi, oi, BLOCK=max(s.blocks))
        works = torch.equal(oi, torch.relu(xi))
    except Exception as exc:  # noqa: BLE001 - a compile error here only costs one row
        works = False
        table.notes.append(f"relu int8: the lesson 02 kernel did not run on int8 ({type(exc).__name__})")
    if works:
        table.time(group, "triton (ours)", lambda: relu(xi, oi, BLOCK=max(s.blocks)),
                   n_bytes=cost.n_bytes, flops=cost.flops)


def _softmax(table: Table, s: Sizes, device: str) -> None:
    for rows, cols in s.softmax:
        x = torch.randn(rows, cols, device=device)  # (rows, cols) fp32
        cost = softmax_cost(rows, cols, 4)  # ~5 FLOPs, 8 bytes per element
        table.time(f"softmax fp32 {rows}x{cols}", "torch.softmax", lambda x=x: torch.softmax(x, dim=-1),
                   n_bytes=cost.n_bytes, flops=cost.flops)


def _matmul(table: Table, group: str, roof: str, M: int, N: int, K: int, device: str) -> None:
    fn, cost = matmul_op(roof, M, N, K, device=device)  # 2MNK FLOPs; read A (M, K), B (K, N), write C (M, N)
    with matmul_precision(roof):
        table.time(group, "torch.matmul", fn, n_bytes=cost.n_bytes, flops=cost.flops, graph="auto")


def _matmuls(table: Table, s: Sizes, device: str, roofs: tuple[str, ...]) -> None:
    low, high = roofs  # ("bf16", "tf32") from Ampere on, ("fp16", "fp32") before
    for n in s.matmul:
        _matmul(table, f"matmul {low} {n}^3", low, n, n, n, device)
    for m in s.skinny:  # weights (K, N) dominate the traffic: a matrix-vector product (GEMV), decode steps
        kn = s.skinny_kn
        _matmul(table, f"matmul {low} {m}x{kn}x{kn}" + (" (GEMV)" if m == 1 else ""), low, m, kn, kn, device)
    for n in s.matmul_high:
        _matmul(table, f"matmul {high} {n}^3", high, n, n, n, device)  # tf32: fp32 inputs, TF32 cores


def time_operations(table: Table, sizes: Sizes = FULL, *, device: str = "cuda",
                    roofs: tuple[str, ...] | None = None) -> None:
    """Time the roofline's operations into `table` (QUICK sizes: a notebook on a GPU)."""
    roofs = roofs or matmul_roofs()
    _elementwise(table, sizes, device)
    _relu_int8(table, sizes, device)
    _softmax(table, sizes, device)
    _matmuls(table, sizes, device, roofs)
    if device == "cuda":
        torch.cuda.empty_cache()


def facts(table: Table, ceilings) -> None:
    """The ceilings and ridge points the lesson's prose cites ({{fact:KEY}})."""
    table.fact("copy_gbps", f"{ceilings.copy_gbps:,.0f} GB/s")
    for roof, tflops in ceilings.matmul_tflops.items():
        table.fact(f"peak_{roof}_tflops", f"{tflops:,.0f} TFLOP/s")
        table.fact(f"ridge_{roof}", f"{ceilings.ridge(roof):.0f} FLOP/byte")
        sizes = [re.search(r"(\d+\^3)", f"{r.group} {r.name}") for r in table.rows
                 if r.tflops == tflops and roof in f"{r.group} {r.name}"]
        if roof != CORE_ROOF and sizes and sizes[0]:
            table.fact(f"peak_{roof}_size", sizes[0].group(1))  # the size whose rate is the roof
    sheet = next((c for name, c in DATASHEETS.items() if name.split()[0].lower() == device_key()), None)
    if sheet is not None:
        for roof, tflops in ceilings.matmul_tflops.items():
            if roof in sheet.matmul_tflops:  # how close the measured roof comes to the datasheet's
                table.fact(f"peak_{roof}_of_datasheet", f"{tflops / sheet.matmul_tflops[roof]:.0%}")


def run(table: Table) -> None:
    measure_ceilings(force=True, table=table)  # also refreshes this machine's cache
    time_operations(table)
    ceilings = ceilings_from_results(table.to_json())  # each roof the best rate measured at any size
    facts(table, ceilings)
    for point in points_from_rows(table.rows):
        table.notes.append(f"{point.label}: {point.intensity:.3g} FLOP/byte, {point.tflops:.3g} TFLOP/s = "
                           f"{point.fraction(ceilings):.0%} of its roof, "
                           f"{ceilings.bound(point.intensity, point.roof_of(ceilings))}-bound")
    results_dir().mkdir(exist_ok=True)
    png = roofline_png()
    plot_results(table.to_json(), png)
    print(f"wrote {png}")
