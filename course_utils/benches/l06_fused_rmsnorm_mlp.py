"""Lesson 06 on a GPU: RMSNorm against torch.compile and Liger, the fused RMSNorm + MLP block against
the Hugging Face block (post_attention_layernorm + mlp of the toy Llama) eager and torch.compile'd.

Sizes: RMSNorm bf16 at 16384 x 4096 and 65536 x 1024; the block at the toy Llama's decode input
(1, 16, 1024) and the paper's (1, 16, 4096) with intermediate 11008 (decode-sized: the weights dominate,
launches matter), and a prefill-sized (4, 2048, 1024) (compute-bound: 8192 x 1024 x 22016 gate/up plus
8192 x 11008 x 1024 down), fp16 and bf16.

Our block runs FusedRMSNormMLP's kernels: the weights are packed ONCE, outside every timed region
(pack_mlp_weights: gate and up interleaved in one (H, 2I) row-major w_gu, w_down.T row-major), and
each timed call is rmsnorm_mlp_packed: above STATS_PREPASS_ROWS rows the statistics pre-pass (row_rstd),
the fused RMSNorm + gate/up + SiLU kernel, then lesson 03's matmul for the down projection; every size
also times the other source of 1 / rms(x) on the default tiles ("statistics in the epilogue" or
"statistics pre-pass"). The time packing takes is in table.notes (once per model).
With sweep=True (the `bench` command) a few tile configurations of each kernel are timed as rows of
their own, "triton (ours)" is the fastest of them, and table.notes says which one that was. The
unfused row runs the lesson's separate kernels (rmsnorm, gate_up_silu, matmul) on nn.Linear weights.
"""
from __future__ import annotations

import torch
import triton

from ..bench import Table, do_bench
from ..lessons.l03_matmul import matmul
from ..lessons.l06_fused_rmsnorm_mlp import (
    STATS_PREPASS_ROWS,
    down_tile,
    gate_up_silu,
    mlp_config,
    pack_mlp_weights,
    rmsnorm,
    rmsnorm_config,
    rmsnorm_mlp_packed,
    rmsnorm_mlp_ref,
    rmsnorm_ref,
)
from ..llama import mlp_block, toy_llama

DEVICE = "cuda"
EPS = 1e-6
RMSNORM_DTYPE = torch.bfloat16
RMSNORM_SIZES = [(16384, 4096), (65536, 1024)]
RMSNORM_SWEEP = [(1, 4), (1, 16), (2, 8), (4, 4), (8, 8), (16, 16)]  # (rows per program, warps)
BLOCK_SHAPES = [(1, 16, 1024), (4, 2048, 1024)]  # (batch, seq, hidden): the toy's decode, a prefill
WIDE_SHAPE = (1, 16, 4096)  # the paper's Llama-7B width: hidden 4096, intermediate 11008, fp16 only


def _short(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


def _tile(bm, bn, bk, warps, stages, group_m=1) -> dict:
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, num_warps=warps, num_stages=stages)


def _down(bm, bn, bk, warps, stages, group_m=1) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m}, num_warps=warps,
                         num_stages=stages)


# Fused gate/up tiles (fp16/bf16). BLOCK_N counts columns of h: the accumulator and the w_gu tile are
# 2 * BLOCK_N wide, so (128, 128) is a 128 x 256 tile. Configs equal to mlp_config's are skipped.
GATE_UP_SWEEP = {
    "small": [_tile(16, 16, 256, 4, 4), _tile(16, 32, 256, 4, 3), _tile(16, 64, 128, 4, 4),
              _tile(16, 64, 64, 4, 6),
              # fewer bytes of shared memory per program: more programs resident per SM, a shorter tail
              _tile(16, 32, 128, 4, 2), _tile(16, 16, 128, 4, 3), _tile(16, 64, 64, 4, 3),
              # the default tile with 8 warps: more loads in flight per program (hidden 4096 on the H100)
              _tile(16, 128, 64, 8, 4)],
    "large": [_tile(128, 128, 64, 8, 3, 8), _tile(128, 128, 64, 8, 4, 8), _tile(128, 64, 64, 8, 4, 8),
              _tile(256, 64, 64, 8, 3, 8)],
}
# Down projection tiles for lesson 03's matmul on the row-major w_down.T (default: down_tile, that is
# 16 x 16 x 256 with few rows and lesson 03's autotuner with many).
def _split(bm, bn, bk, split, warps, stages) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split}, num_warps=warps,
                         num_stages=stages)


DOWN_SWEEP = {  # few rows: split-K (down_split_k); many rows: lesson 03's matmul
    "small": [_split(16, 64, 128, 8, 4, 4), _split(16, 32, 256, 8, 4, 4), _split(16, 16, 256, 4, 4, 4),
              # 128-column tiles: half the programs, each twice as wide (hidden 4096: 32 tiles x splits)
              _split(16, 128, 64, 8, 4, 4), _split(16, 128, 128, 4, 8, 3)],
    "large": [_down(128, 256, 64, 8, 3, 8)],
}
KMAJOR_DOWN = _down(16, 16, 256, 4, 4)  # few rows: the down tile of the nn.Linear layout, for comparison


def _tile_name(cfg: dict) -> str:
    return (f"{cfg['BLOCK_M']}x(2x{cfg['BLOCK_N']})x{cfg['BLOCK_K']} w{cfg['num_warps']} s{cfg['num_stages']}"
            f" g{cfg['GROUP_M']}")


def _down_name(down: triton.Config) -> str:
    kw = down.kwargs
    split = f" split-K {kw['SPLIT_K']}" if "SPLIT_K" in kw else ""
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{down.num_warps} s{down.num_stages}{split}"


_COPY_GBPS: list[float] = []


def _copy_gbps() -> float:
    """The device's copy bandwidth (read + write bytes of a 1 GiB device-to-device copy), measured once."""
    if not _COPY_GBPS:
        src = torch.empty(2**30, dtype=torch.uint8, device=DEVICE)
        dst = torch.empty_like(src)
        _COPY_GBPS.append(2 * src.numel() / (do_bench(lambda: dst.copy_(src)) * 1e-3) / 1e9)
        del src, dst
    return _COPY_GBPS[0]


def _best(table: Table, group: str) -> None:
    """Add "triton (ours)": the fastest of the group's "triton (ours) ..." rows, and note which it was."""
    ours = [r for r in table.rows if r.group == group and r.name.startswith("triton (ours) ")
            and not r.name.endswith(" [graph]")]
    best = min(ours, key=lambda r: r.ms)
    table.add(group, "triton (ours)", best.ms, n_bytes=best.gbps and best.gbps * best.ms * 1e6,
              flops=best.tflops and best.tflops * best.ms * 1e9)
    table.same_run(group, "triton (ours)", best.name)
    table.notes.append(f"{group}: fastest is '{best.name}' ({best.ms:.4f} ms)")


# --- RMSNorm ----------------------------------------------------------------------------------

def _liger_rmsnorm():
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return None
    return lambda x, w: LigerRMSNormFunction.apply(x, w, EPS)


def bench_rmsnorm(table: Table, sweep: bool = True) -> None:
    compiled = torch.compile(rmsnorm_ref, dynamic=False)
    liger = _liger_rmsnorm()
    if liger is None:
        table.notes.append("liger_kernel is not installed: no Liger rows")
    for rows, cols in RMSNORM_SIZES:
        _bench_rmsnorm_at(table, rows, cols, compiled, liger, sweep)


def _bench_rmsnorm_at(table: Table, rows: int, cols: int, compiled, liger, sweep: bool) -> None:
    group = f"rmsnorm {_short(RMSNORM_DTYPE)} {rows}x{cols}"
    x = torch.randn(rows, cols, device=DEVICE, dtype=RMSNORM_DTYPE)
    w = torch.rand(cols, device=DEVICE, dtype=RMSNORM_DTYPE) + 0.5
    out = torch.empty_like(x)
    n_bytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()  # read x, write out
    want = rmsnorm_ref(x, w, EPS)
    rmsnorm(x, w, EPS, out)  # checked before timed
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(compiled(x, w, EPS), want, atol=2e-2, rtol=2e-2)
    table.time(group, "eager (HF-style)", lambda: rmsnorm_ref(x, w, EPS), n_bytes=n_bytes)
    table.time(group, "torch.compile", lambda: compiled(x, w, EPS), n_bytes=n_bytes)
    table.time(group, "F.rms_norm", lambda: torch.nn.functional.rms_norm(x, (cols,), w, EPS),
               n_bytes=n_bytes)
    if liger is not None:
        torch.testing.assert_close(liger(x, w), want, atol=2e-2, rtol=2e-2)
        table.time(group, "Liger-Kernel", lambda: liger(x, w), n_bytes=n_bytes)
    default = rmsnorm_config(rows, cols)
    table.time(group, f"triton (ours) default {default['BLOCK_M']} rows w{default['num_warps']}",
               lambda: rmsnorm(x, w, EPS, out), n_bytes=n_bytes)
    for block_m, warps in RMSNORM_SWEEP if sweep else []:
        if block_m * triton.next_power_of_2(cols) > 64 * 32 * warps:  # > 64 fp32 registers a thread
            continue
        rmsnorm(x, w, EPS, out, BLOCK_M=block_m, num_warps=warps)
        torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
        table.time(group, f"triton (ours) {block_m} rows w{warps}",
                   lambda b=block_m, nw=warps: rmsnorm(x, w, EPS, out, BLOCK_M=b, num_warps=nw),
                   n_bytes=n_bytes)
    _best(table, group)
    table.target(group, "triton (ours)", "torch.compile", 1.0)
    if liger is not None:
        table.target(group, "triton (ours)", "Liger-Kernel", 0.95, 1.0)


# --- the block --------------------------------------------------------------------------------

def _toy_block(dtype: torch.dtype):
    """The Hugging Face block mlp(norm(x)) of the full-size toy Llama, with a norm weight that is not 1."""
    block = mlp_block(toy_llama(dtype=dtype, device=DEVICE))
    with torch.no_grad():
        block.norm.weight.uniform_(0.5, 1.5)
    return block


def _weights(block):
    norm, mlp = block.norm, block.mlp
    return norm.weight, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight


def bench_block(table: Table, sweep: bool = True, dtypes=(torch.float16, torch.bfloat16)) -> None:
    for dtype in dtypes:
        block = _toy_block(dtype)
        compiled = torch.compile(block, dynamic=False)
        with torch.no_grad():
            weights = _weights(block)
            packed = pack_mlp_weights(*weights)  # once, as FusedRMSNormMLP does: never inside a timed call
            _check_packing(packed, weights)
            if sweep:
                ms = do_bench(lambda w=weights: pack_mlp_weights(*w))
                table.notes.append(f"{_short(dtype)}: pack_mlp_weights (once per model, in no row) takes "
                                   f"{ms:.3f} ms")
            for shape in BLOCK_SHAPES:
                _bench_block_at(table, block, compiled, packed, shape, sweep)
    _bench_wide(table, sweep)


def _bench_wide(table: Table, sweep: bool, dtype: torch.dtype = torch.float16) -> None:
    """The block at the paper's hidden 4096 (intermediate 11008): Hugging Face's own RMSNorm and MLP modules."""
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    from ..llama import RMSNormMLP, toy_config

    config = toy_config()
    config.hidden_size = WIDE_SHAPE[2]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        block = RMSNormMLP(LlamaRMSNorm(config.hidden_size, eps=EPS), LlamaMLP(config)).eval()
    block = block.to(device=DEVICE, dtype=dtype)
    with torch.no_grad():
        block.norm.weight.uniform_(0.5, 1.5)
        packed = pack_mlp_weights(*_weights(block))
        _bench_block_at(table, block, torch.compile(block, dynamic=False), packed, WIDE_SHAPE, sweep)


def _check_packing(packed, weights) -> None:
    nw, wg, wu, wd = weights
    folded = nw.float()[:, None]  # norm_weight folded into the rows of w_gu, rounded once

    def fold(w):
        return (w.t().float() * folded).to(w.dtype)

    assert torch.equal(packed.w_gu[:, 0::2], fold(wg)) and torch.equal(packed.w_gu[:, 1::2], fold(wu))
    assert torch.equal(packed.w_down_t, wd.t()) and packed.w_down_t.is_contiguous()


def _bench_block_at(table: Table, block, compiled, packed, shape: tuple[int, int, int], sweep: bool) -> None:
    nw, wg, wu, wd = _weights(block)
    dtype, (inter, hidden) = wg.dtype, wg.shape
    rows = shape[0] * shape[1]
    group = f"RMSNorm+MLP {_short(dtype)} {shape}"
    flops = 2 * rows * hidden * 2 * inter + 2 * rows * inter * hidden  # gate and up, then down
    x = torch.randn(shape, device=DEVICE, dtype=dtype)  # (B, T, hidden)
    x2 = x.view(rows, hidden)
    out = torch.empty_like(x2)
    want = rmsnorm_mlp_ref(x2.float(), nw.float(), wg.float(), wu.float(), wd.float(), EPS).to(dtype)
    torch.testing.assert_close(compiled(x).view(rows, hidden), want, atol=3e-2, rtol=3e-2)

    def ours(config=None, down=None, weights=packed, stats_prepass=None):
        rmsnorm_mlp_packed(x2, weights, EPS, out, config=config, down=down, stats_prepass=stats_prepass)

    ours()  # checked before timed
    torch.testing.assert_close(out, want, atol=3e-2, rtol=3e-2)
    small = rows <= 64
    graph = small  # decode sizes are launch-bound: every candidate is timed in a CUDA graph too
    table.time(group, "HF block eager", lambda: block(x), flops=flops, graph=graph)
    table.time(group, "HF block torch.compile", lambda: compiled(x), flops=flops, graph=graph)
    table.time(group, "triton (ours) default", ours, flops=flops, graph=graph)
    # The other source of 1 / rms(x), on the default tiles: the lesson compares the two at both sizes.
    prepass = rows > STATS_PREPASS_ROWS
    other = "in the epilogue" if prepass else "pre-pass"
    ours(stats_prepass=not prepass)
    torch.testing.assert_close(out, want, atol=3e-2, rtol=3e-2)
    table.time(group, f"triton (ours) default, statistics {other}", lambda: ours(stats_prepass=not prepass),
               flops=flops, graph=graph)
    tile, down = mlp_config(rows, x.element_size()), down_tile(rows, x.element_size())
    table.notes.append(f"{group}: 'triton (ours) default' is gate/up {_tile_name(tile)}, "
                       f"down {_down_name(down) if down else 'autotuned (lesson 03)'}, statistics "
                       f"{'pre-pass (row_rstd)' if prepass else 'in the epilogue'}")
    if sweep:
        _sweep_block(table, group, ours, packed, wd, out, want, flops)
        _unfused(table, group, x2, nw, wg, wu, wd, want, flops)
    _best(table, group)
    peers = ["HF block eager", "HF block torch.compile"]
    graph_rows = [r for r in table.rows if r.group == group and r.name.startswith("triton (ours) ")
                  and r.name.endswith(" [graph]")] if small else []
    best = min(graph_rows, key=lambda r: r.ms) if graph_rows else None
    if best is not None:
        table.add(group, "triton (ours) [graph]", best.ms, flops=flops)
        table.same_run(group, "triton (ours) [graph]", best.name)
    table.target_plain_and_graph(group, "triton (ours)", peers, 1.0, None if small else 1.1)
    if best is not None:
        weight_bytes = 3 * hidden * inter * x.element_size()
        floor_ms = weight_bytes / (_copy_gbps() * 1e9) * 1e3
        table.add(group, "memory floor (weight bytes / copy bandwidth)", floor_ms, n_bytes=weight_bytes)
        table.target(group, "triton (ours) [graph]", "memory floor (weight bytes / copy bandwidth)", 0.8)
        table.fact(f"floor_{_short(dtype)}_{rows}x{hidden}",
                   f"{weight_bytes / 1e6:.1f} MB of weights at {_copy_gbps():.0f} GB/s: {floor_ms * 1e3:.1f} us; "
                   f"ours {best.ms * 1e3:.1f} us in a CUDA graph ({floor_ms / best.ms:.2f} of the floor)")


def _sweep_block(table: Table, group: str, ours, packed, w_down, out: torch.Tensor, want: torch.Tensor,
                 flops: float) -> None:
    """Other gate/up tiles (default down projection), other down tiles (default gate/up), then the best
    of each together. Few rows also get the down projection on the nn.Linear layout (w_down.t(), a
    K-major view) for comparison with the packed row-major w_down.T."""
    rows = out.shape[0]
    small = rows <= 64
    default_tile = mlp_config(rows, out.element_size())

    def timed(name, **kwargs):
        ours(**kwargs)
        torch.testing.assert_close(out, want, atol=3e-2, rtol=3e-2)
        return table.time(group, name, lambda: ours(**kwargs), flops=flops, graph=small)

    default = table.find(group, "triton (ours) default")
    best_tile, best_tile_ms = None, default.ms
    for tile in GATE_UP_SWEEP["small" if small else "large"]:
        if tile == default_tile:
            continue
        row = timed(f"triton (ours) gate/up {_tile_name(tile)}", config=tile)
        if row.ms < best_tile_ms:
            best_tile, best_tile_ms = tile, row.ms
    best_down, best_down_ms = None, default.ms
    for down in DOWN_SWEEP["small" if small else "large"]:
        row = timed(f"triton (ours) down {_down_name(down)}", down=down)
        if row.ms < best_down_ms:
            best_down, best_down_ms = down, row.ms
    if small:
        timed(f"triton (ours) down on nn.Linear w_down.t() {_down_name(KMAJOR_DOWN)}", down=KMAJOR_DOWN,
              weights=packed._replace(w_down_t=w_down.t()))
    if best_tile is not None and best_down is not None:
        timed(f"triton (ours) gate/up {_tile_name(best_tile)} + down {_down_name(best_down)}",
              config=best_tile, down=best_down)


def _unfused(table: Table, group: str, x, nw, wg, wu, wd, want, flops) -> None:
    """The block from the lesson's separate kernels: rmsnorm, gate_up_silu, matmul (three launches)."""
    rows, inter = x.shape[0], wg.shape[0]
    n = torch.empty_like(x)
    h = torch.empty((rows, inter), device=x.device, dtype=x.dtype)
    out = torch.empty_like(x)
    tile = mlp_config(rows, x.element_size())

    def three_kernels():
        rmsnorm(x, nw, EPS, n)
        gate_up_silu(n, wg, wu, h, config=tile)
        matmul(h, wd.t(), out)

    three_kernels()
    torch.testing.assert_close(out, want, atol=3e-2, rtol=3e-2)
    # Not a "triton (ours) ..." sweep row: it is no candidate for "triton (ours)", and the plot shows it.
    table.time(group, "triton unfused (ours): 3 kernels", three_kernels, flops=flops)


def run(table: Table, sweep: bool = True) -> None:
    bench_rmsnorm(table, sweep)
    bench_block(table, sweep)
    table.notes.append("'About GPU fuzed kernel' reports +13% and +12% for its fused RMSNorm + MLP at input "
                       "(1, 16, 4096), hidden 4096 and intermediate 11008 (Llama-7B); our ratios to the same "
                       "HF block are in the targets, at that size and at the toy Llama's hidden 1024")
