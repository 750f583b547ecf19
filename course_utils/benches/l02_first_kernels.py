"""Lesson 02 on a GPU: vector add and ReLU against the copy ceiling and the fastest PyTorch peer.

The targets compare GB/s with a device-to-device copy of the same size (the memory floor);
the ratio against the fastest of eager PyTorch, torch.compile and max-autotune is reported beside it.
"""
from __future__ import annotations

import torch

from ..bench import Table, do_bench
from ..lessons.l02_first_kernels import add, relu

N = 1 << 28  # 2^28 fp32 elements: 1 GiB per tensor, far beyond any L2


def add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The PyTorch peer of the vector add (eager, and what torch.compile compiles)."""
    return x + y


def relu_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


def run(table: Table) -> None:
    x = torch.randn(N, device="cuda")
    y = torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    add(x, y, out)
    torch.testing.assert_close(out, x + y)  # checked before timed
    relu(x, out)
    torch.testing.assert_close(out, torch.relu(x))

    group = "vector add fp32 2^28"
    bytes_add = 3 * N * 4  # read x and y, write out
    table.time(group, "copy ceiling (x -> out)", lambda: out.copy_(x), n_bytes=2 * N * 4)
    peers = table.time_peers(group, add_ref, x, y, n_bytes=bytes_add, eager="torch x + y",
                             check=lambda got: torch.testing.assert_close(got, x + y))
    for block in (1024, 4096):
        table.time(group, f"triton (ours) BLOCK={block}", lambda b=block: add(x, y, out, BLOCK=b), n_bytes=bytes_add)
    table.add_best(group, n_bytes=bytes_add)
    # The copy moves 2 bytes for every 3 the add moves: compare GB/s, not milliseconds.
    table.target(group, "triton (ours)", "copy ceiling (x -> out)", 0.92, 0.97, metric="gbps")
    table.target(group, "triton (ours)", peers, None)

    group = "relu fp32 2^28"
    table.time(group, "copy ceiling (x -> out)", lambda: out.copy_(x), n_bytes=2 * N * 4)
    peers = table.time_peers(group, relu_ref, x, n_bytes=2 * N * 4, eager="torch.relu",
                             check=lambda got: torch.testing.assert_close(got, torch.relu(x)))
    table.time(group, "triton (ours)", lambda: relu(x, out), n_bytes=2 * N * 4)
    table.target(group, "triton (ours)", "copy ceiling (x -> out)", 0.92, metric="gbps")
    table.target(group, "triton (ours)", peers, None)
    _flush(table)
    copy = table.find(group, "copy ceiling (x -> out)")
    if copy is not None:
        table.fact("copy_gbps", f"{copy.gbps:,.0f} GB/s")


def _flush(table: Table) -> None:
    """What the L2 flush between timed runs does to a copy that fits a few L2s: a zero-fill (Triton's)
    leaves dirty lines the copy must write back, a read (course_utils.bench.do_bench) leaves clean ones."""
    src = torch.empty(2**26, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    rates = {zero: 2 * src.numel() / do_bench(lambda: dst.copy_(src), zero_fill=zero) / 1e6 for zero in (True, False)}
    table.fact("flush_zero_gbps", f"{rates[True]:,.0f} GB/s")
    table.fact("flush_read_gbps", f"{rates[False]:,.0f} GB/s")
