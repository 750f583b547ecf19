"""Lesson 02 on a GPU: vector add and ReLU against the copy ceiling and the fastest PyTorch peer.

The targets compare GB/s with a device-to-device copy of the same size (the memory floor);
the ratio against the fastest of eager PyTorch, torch.compile and max-autotune is reported beside it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..bench import Table, do_bench
from ..lessons.l02_first_kernels import add, relu

N = 1 << 28  # 2^28 fp32 elements: 1 GiB per tensor, far beyond any L2


def add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The PyTorch peer of the vector add (eager, and what torch.compile compiles)."""
    return x + y


def relu_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


@triton.jit
def read_only_kernel(x_ptr, sums_ptr, n, BLOCK: tl.constexpr):
    """The read half of a copy alone: each program reads BLOCK values and writes back one (their sum),
    4 bytes written per 4 * BLOCK read."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(sums_ptr + tl.program_id(0), tl.sum(x))


def _read_and_write_alone(table: Table, group: str, x: torch.Tensor, out: torch.Tensor,
                          block: int = 4096) -> None:
    """Rows "read only" and "write only": the two halves of the copy, each alone, in GB/s. Does a stream of
    one kind move more bytes per second than the copy's half-and-half mix? Then a kernel whose mix
    leans to one kind (the add: two reads per write) can pass the copy's GB/s."""
    sums = torch.empty(triton.cdiv(x.numel(), block), device=x.device)

    def read():
        read_only_kernel[(sums.numel(),)](x, sums, x.numel(), BLOCK=block)

    read()
    torch.testing.assert_close(sums.sum(dtype=torch.float64), x.sum(dtype=torch.float64), rtol=1e-4, atol=1.0)
    table.time(group, "read only (x -> one sum per block)", read, n_bytes=x.numel() * 4)
    table.time(group, "write only (out.fill_)", lambda: out.fill_(1.0), n_bytes=out.numel() * 4)


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
    _read_and_write_alone(table, group, x, out)
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
