"""Lesson 05 on a GPU: the fused softmax against a copy and torch.softmax; FlashAttention against SDPA.

`run(table)` is what `python -m course_utils bench 05` measures:
- softmax fp32 at 4096 x 32768, 32768 x 4096 and 16384 x 1024: a copy of the tensor (the ceiling),
  a Triton copy that walks the tensor in the one-pass softmax's tiles (lesson 02's `copy_2d_kernel` with
  the default configuration's rows, columns, programs and warps: our kernel without its math),
  torch.softmax, torch.compile (default and max-autotune), the eager three-pass `softmax_ref`,
  Liger-Kernel when installed, and our `softmax` with its default configuration ("triton (ours)"),
  against the fastest of the peers;
- attention bf16 at (4, 16, 4096, 128), causal and not: F.scaled_dot_product_attention, the
  unfused version (matmul, scale, mask, our softmax, matmul: the S x S scores go through HBM), and
  our FlashAttention kernel with its defaults; SDPA and ours, the target's pair, take turns
  (`Table.time_alternating`).
With COURSE_BENCH_SWEEP=1 (`bench.sweeping()`) it also times sweeps of configurations, each its own
row: for softmax one pass with rows per program x warps, persistent grids, and the online two-pass
kernel with block sizes x warps (`softmax_variants`); for attention (BLOCK_M, BLOCK_N, num_warps,
num_stages) (`ATTENTION_SWEEP`); the notes then name the best of each, so that the lesson's defaults
can follow the measurements. Every kernel's output is compared with PyTorch before it is timed.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton

from ..bench import Table, sweeping
from ..lessons.l02_first_kernels import copy_2d_kernel
from ..lessons.l05_online_softmax import (ONE_PASS_MAX_COLS, SoftmaxConfig, attention, softmax,
                                          softmax_config, softmax_ref)

SOFTMAX_SHAPES = [(4096, 32768), (32768, 4096), (16384, 1024)]
ATTENTION_SHAPE = (4, 16, 4096, 128)  # (B, H, S, D)
TILE_COPY = "copy in the one-pass softmax's tiles (triton)"
# (BLOCK_M, BLOCK_N, num_warps, num_stages) beside the default (128, 64, 8, 3) of bf16 at D = 128
ATTENTION_SWEEP = [(128, 64, 4, 3), (128, 64, 8, 4), (128, 128, 8, 3), (64, 64, 4, 3)]
# (BLOCK_N, num_warps, num_stages) of the online kernel
ONLINE_SWEEP = [(2048, 4, 1), (2048, 8, 1), (4096, 8, 1), (4096, 16, 1), (8192, 8, 1), (8192, 16, 1),
                (4096, 8, 2), (4096, 8, 3)]


def softmax_variants(n_rows: int, n_cols: int, sm_count: int = 132) -> list[tuple[str, SoftmaxConfig]]:
    """The configurations the sweep times for one shape, each with the name of its row."""
    block = triton.next_power_of_2(n_cols)
    variants = []
    if block <= ONE_PASS_MAX_COLS:
        for rows in (1, 2, 4, 8):
            for warps in (4, 8, 16, 32):
                per_thread = rows * block // (32 * warps)  # fp32 values each thread holds
                if (rows == 1 or rows * block <= 8192) and 8 <= per_thread <= 64:
                    variants.append((f"triton (ours) 1-pass rows={rows} warps={warps}",
                                     SoftmaxConfig(False, block, rows, warps)))
        rows = max(1, 2048 // block)
        warps = max(4, min(16, rows * block // 512))
        for per_sm in (4, 8):
            for stages in (1, 2) if rows * block * 4 <= 64 * 1024 else (1,):  # stages x tile in shared memory
                name = (f"triton (ours) 1-pass persistent {per_sm}/SM rows={rows} warps={warps} "
                        f"stages={stages}")
                variants.append((name, SoftmaxConfig(False, block, rows, warps, per_sm * sm_count, stages)))
    for block_n, warps, stages in ONLINE_SWEEP:
        if block_n <= n_cols:
            variants.append((f"triton (ours) online block={block_n} warps={warps} stages={stages}",
                             SoftmaxConfig(True, block_n, 1, warps, None, stages)))
    return variants


def _checked(table: Table, group: str, name: str, fn: Callable[[], object],
             result: Callable[[], torch.Tensor] | None, want: torch.Tensor, tol: float) -> bool:
    """Run fn and compare its result (fn's return value, or result()) with `want`.

    A configuration that fails to compile (too many registers or too much shared memory) or gives a
    wrong answer is skipped with a note, so that one bad point does not end the sweep.
    """
    try:
        got = fn()
        got = result() if result else got
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    except Exception as exc:  # noqa: BLE001 - reported in the notes, the sweep goes on
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        table.notes.append(f"{group}: '{name}' skipped: {type(exc).__name__}: {first}")
        return False
    return True


def _timed(table: Table, group: str, name: str, fn: Callable[[], object],
           result: Callable[[], torch.Tensor] | None, want: torch.Tensor, tol: float, **work) -> None:
    """Check fn (`_checked`), then time it."""
    if _checked(table, group, name, fn, result, want, tol):
        table.time(group, name, fn, **work)


def _note_fastest(table: Table, group: str, peer: str, short: str, rate: str) -> None:
    """Name the fastest of our rows (default and sweep) in the notes, against `peer`."""
    ours = [r for r in table.rows if r.group == group and r.name.startswith("triton (ours)")]
    peer_row = table.find(group, peer)
    if ours and peer_row:
        best = min(ours, key=lambda r: r.ms)
        value = f"{best.gbps:.0f} GB/s" if rate == "gbps" else f"{best.tflops:.0f} TFLOP/s"
        table.notes.append(f"{group}: fastest of ours is '{best.name}' at {best.ms:.4f} ms, "
                           f"{peer_row.ms / best.ms:.2f} x {short}, {value}")


def _softmax_group(table: Table, n_rows: int, n_cols: int, sm_count: int) -> None:
    group = f"softmax fp32 {n_rows}x{n_cols}"
    x = torch.randn(n_rows, n_cols, device="cuda")
    out = torch.empty_like(x)
    want = torch.softmax(x, dim=1)
    n_bytes = 2 * x.numel() * 4  # read once, write once: what any softmax must move

    def timed(name: str, fn: Callable[[], object], result: Callable[[], torch.Tensor] | None = None) -> None:
        _timed(table, group, name, fn, result, want, 2e-5, n_bytes=n_bytes)

    table.time(group, "copy ceiling (x -> out)", lambda: out.copy_(x), n_bytes=n_bytes)
    cfg = softmax_config(n_rows, n_cols)
    if not cfg.online:
        _timed(table, group, TILE_COPY, lambda: copy_in_softmax_tiles(x, out, cfg), lambda: out, x, 0.0,
               n_bytes=n_bytes)
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        liger = LigerSoftmaxFunction.apply
    except ImportError:
        liger = None
    peers = table.time_peers(group, row_softmax, x, n_bytes=n_bytes, eager="torch.softmax", liger=liger,
                             check=lambda got: torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5))
    timed("eager 3-pass softmax_ref", lambda: softmax_ref(x))
    timed("triton (ours)", lambda: softmax(x, out), lambda: out)
    if sweeping():
        for name, cfg in softmax_variants(n_rows, n_cols, sm_count):
            out.fill_(float("nan"))
            timed(name, lambda c=cfg: softmax(x, out, c), lambda: out)
        _note_fastest(table, group, "torch.softmax", "torch.softmax", "gbps")
    table.target(group, "triton (ours)", peers, 1.0)  # the fastest of torch.softmax, compiled, Liger
    table.target(group, "triton (ours)", "copy ceiling (x -> out)", None, 0.88, metric="gbps")


def copy_in_softmax_tiles(x: torch.Tensor, out: torch.Tensor, cfg: SoftmaxConfig) -> None:
    """out = x by lesson 02's copy_2d_kernel, launched as `softmax` launches its one-pass kernel: tiles of
    cfg.rows x cfg.block_n, one program per row block, cfg.num_warps. Our softmax without its math."""
    n_rows, n_cols = x.shape
    copy_2d_kernel[(triton.cdiv(n_rows, cfg.rows), 1)](
        x, out, n_rows, n_cols, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=cfg.rows, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)


def row_softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax over each row: the PyTorch peer (eager, and what torch.compile compiles)."""
    return torch.softmax(x, dim=1)


def _attention_groups(table: Table) -> None:
    B, H, S, D = ATTENTION_SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    out = torch.empty_like(q)
    scores = torch.empty(B * H * S, S, device="cuda", dtype=torch.bfloat16)  # (B*H*S, S): 2 GiB in HBM
    probs = torch.empty_like(scores)
    future = torch.ones(S, S, dtype=torch.bool, device="cuda").triu(1)
    for causal in (False, True):
        group = f"attention bf16 {ATTENTION_SHAPE} causal={causal}"
        flops = 4 * B * H * S * S * D / (2 if causal else 1)  # causal: half the score matrix
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def unfused(c=causal):
            s = torch.matmul(q, k.transpose(-2, -1), out=scores.view(B, H, S, S))  # write S x S
            s.mul_(1 / math.sqrt(D))  # read and write S x S
            if c:
                s.masked_fill_(future, float("-inf"))  # read and write S x S
            softmax(scores, probs)  # read and write S x S
            return probs.view(B, H, S, S) @ v  # read S x S

        runs = [("F.scaled_dot_product_attention",
                 lambda c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c), None),
                ("unfused: matmul, scale, (mask,) our softmax, matmul", unfused, None),
                ("triton (ours)", lambda c=causal: attention(q, k, v, out, c), lambda: out)]
        for config in ATTENTION_SWEEP if sweeping() else []:
            name = "triton (ours) BLOCK_M={} BLOCK_N={} warps={} stages={}".format(*config)
            runs.append((name, lambda c=causal, a=config: attention(q, k, v, out, c, *a), lambda: out))
        pair = ("F.scaled_dot_product_attention", "triton (ours)")
        checked = []
        for name, fn, result in runs:
            out.fill_(float("nan"))
            if _checked(table, group, name, fn, result, want, 2e-2):
                checked.append((name, fn))
        # The target's pair, compute-bound both, takes turns (Table.time_alternating), as lesson 03's does.
        table.time_alternating(group, [(name, fn) for name, fn in checked if name in pair], flops=flops)
        for name, fn in checked:
            if name not in pair:
                table.time(group, name, fn, flops=flops)
        table.target(group, "triton (ours)", "F.scaled_dot_product_attention", 0.85, 1.0)
        if sweeping():
            _note_fastest(table, group, "F.scaled_dot_product_attention", "SDPA", "tflops")


def run(table: Table) -> None:
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    for n_rows, n_cols in SOFTMAX_SHAPES:
        _softmax_group(table, n_rows, n_cols, sm_count)
        torch.cuda.empty_cache()
    _attention_groups(table)
    table.notes.append("softmax GB/s count 8 bytes per element (read once, write once) for every row, "
                       "whatever a kernel moves; the copy-ceiling target (0.88) is a stretch: a softmax moves the bytes of a copy and no more")
    table.notes.append("sweeps of configurations: " + ("timed (COURSE_BENCH_SWEEP=1)" if sweeping() else
                       "not timed in this run (COURSE_BENCH_SWEEP=1 times them); ours is the lesson's default"))
