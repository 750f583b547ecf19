# %% [markdown]
# # 03 · Matmul: naive, tiled, grouped, autotuned, tensor cores, a fused epilogue
#
# **What you will learn**: why the obvious matmul kernel (one output element per program) is slow;
# the traffic algebra of tiling (an L x L tile cuts the loads from global memory by a factor L/2);
# the tiled Triton kernel with `tl.dot`, and the masks that make it right for any M, N, K; the
# grouped launch order that keeps the working set in L2; what autotuning picks, what it costs and
# how it is cached; tensor cores in fp16/bf16, and TF32 against IEEE fp32, with the accuracy each
# costs measured against float64; and a fused bias + ReLU epilogue, with the bytes it saves.

# %%
from course_utils import setup

mode = setup()

# %%
import inspect
import time

import torch
import triton

from course_utils import check, size
from course_utils.bench import Table, can_time, load_results, show_results
from course_utils.benches import l03_matmul as bench
from course_utils.benches.l03_matmul import (linear_relu_bytes, matmul_flops, min_bytes, naive_load_bytes,
                                      plot_vs_size, tiled_load_bytes)
from course_utils.grading import CheckFailed
from course_utils.lessons.l03_matmul import (dot_precision, grouped_pid, grouped_tile, linear_relu, matmul,
                                             matmul_configs, matmul_kernel, matmul_naive, matmul_naive_kernel,
                                             select_configs)

results = load_results("03")  # what the last GPU run measured (results/03_matmul.json), or None
notes = results["notes"] if results else []


def show(obj) -> None:
    """Print the source of a function or kernel, without the exercise notebook's solution markers."""
    while hasattr(obj, "fn"):  # @triton.autotune wraps @triton.jit, which wraps the Python function
        obj = obj.fn
    markers = ("# BEGIN SOLUTION", "# END SOLUTION")
    print("\n".join(line for line in inspect.getsource(obj).splitlines() if line.strip() not in markers))


def committed(prefix: str) -> None:
    """Print the committed GPU rows and notes whose group starts with `prefix`."""
    rows = [r for r in (results or {}).get("rows", []) if r["group"].startswith(prefix)]
    if not rows:
        print(f"no committed GPU results for '{prefix}' yet (python -m course_utils bench 03 on a GPU)")
    for r in rows:
        tflops = f"{r['tflops']:7.1f} TFLOP/s" if r.get("tflops") else ""
        print(f"  {r['group']:<30} {r['name']:<44} {r['ms']:9.4f} ms {tflops}")
    for note in notes:
        if note.startswith(prefix):
            print("  note:", note)


def rel_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    """Relative error in the Frobenius norm, against a float64 result."""
    return float((got.double().cpu() - exact).norm() / exact.norm())


# %% [markdown]
# ## Napkin maths
#
# `C = A @ B` with `A (M, K)`, `B (K, N)`: each of the `M x N` outputs is a dot product of length K,
# a multiply and an add per term, so **2MNK FLOPs**. The least traffic any kernel can have is to read
# A and B once and write C once: `(MK + KN + MN)` elements. For a square N^3 problem that is `2N^3`
# FLOPs on `3N^2` elements: the arithmetic intensity grows like N, so large matmuls are limited by
# arithmetic, not memory, *if* the kernel gets close to reading each element once. An H100 SXM does
# about 989 TFLOP/s of dense fp16/bf16 on its tensor cores (495 in TF32, 67 in plain fp32) and
# moves about 3.35 TB/s from HBM (an H200: same FLOPs, 4.8 TB/s).

# %%
PEAK_FP16, HBM = 989e12, 3.35e12  # H100 SXM datasheet: dense fp16/bf16 FLOP/s, HBM bytes/s
shapes = [(64, 256, 128), (128, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192)]
print(f"{'(M, N, K)':<22} {'GFLOP':>9} {'MB (fp16)':>10} {'FLOP/B':>7} {'compute us':>11} {'memory us':>10}")
for M, N, K in shapes:
    flops, nbytes = matmul_flops(M, N, K), min_bytes(M, N, K, 2)
    print(f"{str((M, N, K)):<22} {flops / 1e9:9.3f} {nbytes / 1e6:10.2f} {flops / nbytes:7.0f} "
          f"{flops / PEAK_FP16 * 1e6:11.2f} {nbytes / HBM * 1e6:10.2f}")
print(f"the H100 balance point: {PEAK_FP16 / HBM:.0f} FLOP per byte")

# %% [markdown]
# Above about 300 FLOP per byte the floor is the arithmetic: 4096^3 needs at least 0.14 ms of tensor
# core time but only 0.03 ms of memory time. 1024^3 sits near the balance point. The two small shapes
# (with 1024^3, the GEM repository's GEMM + bias + ReLU shapes) need well under a microsecond of
# either, less than launching a kernel costs (a few microseconds): launch overhead and how few SMs
# get work decide their time.
#
# ## The PyTorch reference
#
# `torch.matmul` calls cuBLAS on a GPU. The checks compare against the same product in float64 on
# the CPU, which is exact enough to measure everyone's rounding error, cuBLAS's included.

# %%
def matmul_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


M, N, K = size((1823, 781, 517), (70, 45, 83))  # no multiple of any tile size, on purpose
a = torch.randn(M, K, device=mode.device)
b = torch.randn(K, N, device=mode.device)
exact = a.double().cpu() @ b.double().cpu()
print(f"torch.matmul fp32 at {M} x {N} x {K}: relative error {rel_error(matmul_ref(a, b), exact):.1e}")

# %% [markdown]
# ## The strawman: one output element per program
#
# A grid of `M x N` programs; program `(m, n)` loads row `m` of A and column `n` of B, `BLOCK_K`
# elements at a time, and sums their products:

# %%
show(matmul_naive_kernel)

# %%
Ms, Ns, Ks = size((1823, 781, 517), (9, 7, 83))  # the interpreter runs the M x N programs one by one
a_s = torch.randn(Ms, Ks, device=mode.device)
b_s = torch.randn(Ks, Ns, device=mode.device)
out_s = torch.empty(Ms, Ns, device=mode.device)
matmul_naive(a_s, b_s, out_s)
print(f"naive {Ms} x {Ns} x {Ks}: {Ms * Ns} programs, relative error "
      f"{rel_error(out_s, a_s.double().cpu() @ b_s.double().cpu()):.1e}")

# %% [markdown]
# It is correct and it is slow. Every program loads `2K` elements to do `2K` FLOPs: one FLOP per
# 2 bytes in fp16, about 600 times below the H100's balance point. Nothing is shared between programs
# except by luck in the caches: the grid as a whole asks for `2MNK` elements, N/1.5 times the
# minimum. And a column of B is K elements `N` apart in memory, so each one costs a whole 32-byte
# memory sector of which 2 bytes are used.

# %%
n = 4096
print(f"naive {n}^3 fp16 loads {naive_load_bytes(n, n, n, 2) / 1e9:.0f} GB: "
      f"{naive_load_bytes(n, n, n, 2) / HBM * 1e3:.0f} ms at full HBM bandwidth, "
      f"against {matmul_flops(n, n, n) / PEAK_FP16 * 1e3:.2f} ms of tensor-core time")
if not can_time():
    committed("matmul fp16 1024^3")

# %% [markdown]
# ## Tiling: the traffic algebra
#
# ![tiling](img/03_tiling.png)
#
# Give each program an `L x L` tile of C instead of one element. It walks K in steps of `BLOCK_K`,
# loading an `L x BLOCK_K` tile of A and a `BLOCK_K x L` tile of B per step, and accumulates their
# product in registers. Over the whole walk it loads a row panel of A (`L x K`) and a column panel
# of B (`K x L`): **2LK elements for 2L^2K FLOPs**, so every element loaded is used L times. For a
# square `N^3` problem there are `(N/L)^2` programs, each loading `2LN` elements: **2N^3 / L
# elements from global memory in total**. The naive kernel is `L = 1`.
#
# How large must L be? Loads from global memory are served by L2 when they hit there (tens of MB,
# several times HBM's bandwidth) and by HBM when they miss. If all of them came from HBM:

# %%
n = 4096
print(f"{'L':>4} {'loads (GB)':>11} {'HBM time (ms)':>14} {'FLOP/B':>7}   (tensor-core floor "
      f"{matmul_flops(n, n, n) / PEAK_FP16 * 1e3:.3f} ms)")
for tile in (1, 16, 32, 64, 128, 256):
    loads = tiled_load_bytes(n, n, n, tile, tile, 2)
    print(f"{tile:>4} {loads / 1e9:11.2f} {loads / HBM * 1e3:14.3f} {matmul_flops(n, n, n) / loads:7.0f}")

# %% [markdown]
# Even a 128 x 128 tile (64 FLOPs per byte loaded) would be memory-bound if every load went to HBM:
# fast matmuls rely on L2 to serve the panels that neighbouring programs share, and on big tiles
# (128 x 256 on Hopper, as large as registers and shared memory allow). Tiles cannot grow forever:
# the fp32 accumulator of a 128 x 256 tile is 128 KiB of registers, and each pipeline stage of
# A and B tiles takes 48 KiB of shared memory.
#
# The measured effect of the tile size (fp16, 4096^3, square L x L tiles; the GB/s column is the
# modelled traffic 2N^3/L divided by the time, which can exceed HBM bandwidth only thanks to L2):

# %%
if can_time():
    n = 4096
    a16 = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b16 = torch.randn(n, n, device="cuda", dtype=torch.float16)
    out16 = torch.empty(n, n, device="cuda", dtype=torch.float16)
    table = Table("03")
    for tile in bench.TILES:
        config = triton.Config({"BLOCK_M": tile, "BLOCK_N": tile, "BLOCK_K": 64, "GROUP_M": 8},
                               num_warps=max(1, min(8, tile // 16)), num_stages=3)
        table.time(f"tile size fp16 {n}^3", f"L={tile}", lambda c=config: matmul(a16, b16, out16, config=c),
                   flops=matmul_flops(n, n, n), n_bytes=tiled_load_bytes(n, n, n, tile, tile, 2))
    table.show()
else:
    committed("tile size")

# %% [markdown]
# ## The tiled kernel with `tl.dot`
#
# `tl.dot(a, b, acc)` multiplies two tiles and adds to the accumulator; on a GPU it compiles to
# tensor-core instructions (`mma` on Ampere, `wgmma` on Hopper), and passing `acc` lets the hardware
# accumulate in place. First the launch order inside the kernel (next section), then the kernel:

# %%
show(grouped_tile)
show(matmul_kernel)

# %% [markdown]
# **Masks for sizes that are no multiple of the tile.** Three edges:
# - **K**: the last step may have fewer than `BLOCK_K` columns of A and rows of B left. Those loads
#   are masked with `other=0.0`, so the missing terms add zero to the dot. Without this mask the
#   kernel reads past the end of each row (the wrong numbers, or memory that is not ours).
# - **M and N**: a tile at the bottom or right edge sticks out. Its loads use `rows % M` and
#   `cols % N`, which re-read valid rows and columns (no mask needed, and the loads stay full-width
#   and vectorized), and the **store** is masked so only `rows < M`, `cols < N` are written.
#
# The host computes the grid from the block sizes the autotuner picks:

# %%
show(matmul)

# %%
for dtype in (torch.float32, torch.float16):
    a_t, b_t = a.to(dtype), b.to(dtype)
    out = torch.empty(M, N, device=mode.device, dtype=dtype)
    matmul(a_t, b_t, out)
    error = rel_error(out, a_t.double().cpu() @ b_t.double().cpu())
    print(f"{str(dtype):<14} {M} x {N} x {K}: relative error {error:.1e}")
check("03.matmul", matmul)

# %% [markdown]
# What goes wrong when the K edge is forgotten? Here the host hands the kernel `K` rounded down to a
# multiple of `BLOCK_K`, as a kernel that only loops over full blocks would do. The checker finds
# it at once (`K = 1` leaves nothing at all):

# %%
def matmul_full_blocks_only(a, b, out):
    config = matmul_configs()[0] if mode.interpret else triton.Config(
        {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=3)
    M, K = a.shape
    N = b.shape[1]
    block_k = config.kwargs["BLOCK_K"]
    grid = (triton.cdiv(M, config.kwargs["BLOCK_M"]) * triton.cdiv(N, config.kwargs["BLOCK_N"]),)
    matmul_kernel.fn[grid](a, b, out, out, M, N, K - K % block_k,  # the bug: the partial K step is dropped
                           a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
                           HAS_BIAS=False, RELU=False, INPUT_PRECISION=dot_precision(a.dtype),
                           **config.all_kwargs())


try:
    check("03.matmul", matmul_full_blocks_only, seed=0)
except CheckFailed as failure:
    print(str(failure)[:900])

# %% [markdown]
# ## The grouped launch order
#
# Programs are launched in `pid` order, and a GPU runs one *wave* of them at a time (an H100 has 132
# SMs; with 128 x 256 tiles, one program per SM). In row-major order a wave covers a few whole rows
# of tiles: few row panels of A, but **every** column panel of B, so at 8192^3 the wave wants all of
# B (128 MB in fp16) through a 50 MB L2, and the next wave wants it all again. The grouped order
# (exercise 03.grouped_pid) fills the wave with a block of `group_m` tile rows instead:
#
# ![launch order](img/03_launch_order.png)
#
# With 16 programs, row-major touches 2 + 8 = 10 panels and grouped 4 + 4 = 8. The saving grows with
# the grid: count it for one wave of the real problem. Grouped, the wave's panels are still more
# than L2 holds, but each is reused by more programs while it is there.

# %%
n, bm, bn, wave = 8192, 128, 256, 132
num_pid_m, num_pid_n = n // bm, n // bn
for group_m in (1, 8):  # group_m = 1 is row-major order
    tiles = [grouped_pid(pid, num_pid_m, num_pid_n, group_m) for pid in range(wave)]
    a_panels, b_panels = len({t[0] for t in tiles}), len({t[1] for t in tiles})
    megabytes = (a_panels * bm + b_panels * bn) * n * 2 / 1e6
    print(f"group_m={group_m}: the first {wave} programs read {a_panels} row panels of A and {b_panels} "
          f"column panels of B: {megabytes:.0f} MB")

# %%
if can_time():
    n = 8192
    a16 = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b16 = torch.randn(n, n, device="cuda", dtype=torch.float16)
    out16 = torch.empty(n, n, device="cuda", dtype=torch.float16)
    table = Table("03")
    for group_m in bench.GROUPS_M:
        config = triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": group_m},
                               num_warps=8, num_stages=3)
        table.time(f"launch order fp16 {n}^3", f"GROUP_M={group_m}",
                   lambda c=config: matmul(a16, b16, out16, config=c), flops=matmul_flops(n, n, n))
    table.show()
else:
    committed("launch order")

# %% [markdown]
# ## Autotuning: what it picks, what it costs, how it is cached
#
# The best tile depends on the GPU, the dtype and the shape, so `matmul_kernel` carries a list of
# candidate `triton.Config`s and `@triton.autotune` times them. `select_configs` prunes the list
# first: `BLOCK_K` so that a tile row is 128 bytes, and a single small tile (no timing) for problems
# under 2^31 FLOPs. The GPU list:

# %%
for config in matmul_configs(interpret=False):
    print(f"  {bench.config_name(config)}")
print(f"in this mode ({mode.name}) the list is {len(matmul_configs())} config(s)")
for shape in [(64, 256, 128), (1024, 1024, 1024), (8192, 8192, 8192)]:
    for dtype in (torch.float16, torch.float32):
        args = {"a_ptr": torch.empty(0, dtype=dtype), "M": shape[0], "N": shape[1], "K": shape[2]}
        kept = select_configs(matmul_configs(interpret=False), args)
        print(f"  {str(shape):<20} {str(dtype):<14} {len(kept)} config(s) to time, "
              f"e.g. {bench.config_name(kept[0])}")

# %% [markdown]
# **The cost.** The first call with a new key (`M, N, K`, the dot precision and the dtypes) times
# every surviving config with `do_bench` (about 0.1 s each), and compiles each one first unless it
# was compiled already for this *specialization* (a second or so each: Triton compiles separately
# for integer arguments that are or are not multiples of 16, and that equal 1, such as a stride of 1).
# Later calls with the same key look the choice up in `matmul_kernel.cache`, a dictionary in this
# process. The compiled kernels are also cached on disk (`~/.triton/cache`), so a new process skips
# the compilation but times again; Triton can cache the timings on disk too
# (`@triton.autotune(..., cache_results=True)` or `TRITON_CACHE_AUTOTUNING=1`, in recent versions).
# Below, 3000 is no multiple of 16, so the first call compiles and times.

# %%
if can_time():
    shape = (3000, 3000, 3000)
    a16 = torch.randn(shape[0], shape[2], device="cuda", dtype=torch.float16)
    b16 = torch.randn(shape[2], shape[1], device="cuda", dtype=torch.float16)
    out16 = torch.empty(shape[0], shape[1], device="cuda", dtype=torch.float16)
    for attempt in ("first", "second"):
        torch.cuda.synchronize()
        start = time.perf_counter()
        matmul(a16, b16, out16)
        torch.cuda.synchronize()
        print(f"{attempt} call at {shape}: {(time.perf_counter() - start) * 1e3:.1f} ms")
    for key, config in matmul_kernel.cache.items():
        print(f"  cached: {key} -> {bench.config_name(config)}")
else:
    committed("autotune")

# %% [markdown]
# ## Tensor cores and precision
#
# Tensor cores multiply small tiles in one instruction, but only in narrow formats:
#
# | format | sign-exponent-mantissa bits | unit roundoff | range |
# |---|---|---|---|
# | fp32 | 1-8-23 | 6e-8 | 3e38 |
# | TF32 (tensor cores' fp32) | 1-8-10 | 5e-4 | 3e38 |
# | fp16 | 1-5-10 | 5e-4 | 65504 |
# | bf16 | 1-8-7 | 4e-3 | 3e38 |
#
# fp16 and bf16 inputs go to the tensor cores as they are, and the products are accumulated in fp32
# (our `acc`), then rounded once to the output's dtype. fp32 inputs are another matter: cuBLAS and
# Triton can round them to **TF32** (10 mantissa bits, about 8 times the peak of plain fp32)
# or compute in true IEEE fp32 on the ordinary cores. The two libraries choose differently by default:
# - PyTorch: `torch.set_float32_matmul_precision("highest")` (the default) is IEEE fp32; `"high"`
#   allows TF32.
# - Triton: `tl.dot(..., input_precision="tf32")` is the default on NVIDIA GPUs; `"ieee"` is exact
#   fp32; `"tf32x3"` splits each operand in two TF32 numbers for near-fp32 accuracy at 3x the work.
#
# Our `matmul` follows PyTorch's setting (`dot_precision`), so both sides of a comparison do the same
# arithmetic. What the rounding of the inputs alone costs, emulated exactly here in float64:

# %%
def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """fp32 values rounded to nearest with `bits` explicit mantissa bits (10 for TF32)."""
    drop = 23 - bits
    raw = x.float().contiguous().view(torch.int32)
    raw = raw + ((1 << (drop - 1)) - 1) + ((raw >> drop) & 1)  # round half to even
    return (raw & ~((1 << drop) - 1)).view(torch.float32)


n = size(2048, 256)
a_p = torch.randn(n, n)
b_p = torch.randn(n, n)
exact_p = a_p.double() @ b_p.double()
print(f"fp32 inputs, fp32 arithmetic (torch.matmul on the CPU): relative error "
      f"{rel_error(a_p @ b_p, exact_p):.1e}")
inputs = {"tf32": (round_mantissa(a_p, 10), round_mantissa(b_p, 10)), "fp16": (a_p.half(), b_p.half()),
          "bf16": (a_p.bfloat16(), b_p.bfloat16())}
for label, (x, y) in inputs.items():
    print(f"{label} inputs, exact accumulation:                 relative error "
          f"{rel_error(x.double() @ y.double(), exact_p):.1e}")

# %%
if can_time():
    a_g, b_g = a_p.cuda(), b_p.cuda()
    out_g = torch.empty(n, n, device="cuda")
    before = torch.get_float32_matmul_precision()
    for precision in ("highest", "high"):
        torch.set_float32_matmul_precision(precision)
        matmul(a_g, b_g, out_g)
        print(f"set_float32_matmul_precision({precision!r}): torch.matmul "
              f"{rel_error(torch.matmul(a_g, b_g), exact_p):.1e}, ours ({dot_precision(torch.float32)}) "
              f"{rel_error(out_g, exact_p):.1e}")
    torch.set_float32_matmul_precision(before)
    matmul(a_g, b_g, out_g, input_precision="tf32x3")
    print(f"ours tf32x3: {rel_error(out_g, exact_p):.1e}")
else:
    committed("accuracy")

# %% [markdown]
# TF32 costs three to four decimal digits against fp32 (a relative error of a few 1e-4 instead of
# about 1e-7), the same as fp16 inputs (both keep 10 mantissa bits), for about 8 times the peak;
# bf16 loses another factor of 8 (7 bits) in exchange for fp32's range. On a GPU the conversion to
# TF32 may truncate instead of rounding (it depends on the hardware path), which costs a little
# more. Whether that is acceptable is the caller's decision, which is why it is a switch.
#
# ## A fused epilogue: GEMM + bias + ReLU
#
# A linear layer followed by a ReLU, `relu(x @ w.T + bias)`, is two kernels in eager PyTorch:
# `addmm` (cuBLAS adds the bias in its own epilogue) writes `M x N` outputs, and `relu` reads them
# back and writes them again. Our kernel already holds the tile in fp32 registers before its one
# store, so the bias and the ReLU cost nothing there: `linear_relu` is `matmul` with the epilogue
# switched on, and `w.t()` is a view of `nn.Linear`'s `(N, K)` weight, so no copy and no second
# kernel.

# %%
show(linear_relu)
print(f"{'(M, N, K)':<22} {'unfused MB':>11} {'fused MB':>9} {'saved':>6}   launches 2 -> 1")
for M_, N_, K_ in [(64, 256, 128), (128, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096)]:
    unfused, fused = linear_relu_bytes(M_, N_, K_, 2, False), linear_relu_bytes(M_, N_, K_, 2, True)
    print(f"{str((M_, N_, K_)):<22} {unfused / 1e6:11.3f} {fused / 1e6:9.3f} {1 - fused / unfused:6.0%}")

# %% [markdown]
# The saving is `2MN` elements, a third or more of the least traffic at every one of these shapes.
# What it is worth in time differs. At 4096^3 the kernel is compute-bound: the 67 MB of the separate
# ReLU pass take about 20 us at 3.35 TB/s, next to at least 140 us of arithmetic, so fusing saves
# roughly a tenth. At the GEM shapes the bytes are nothing (0.07 MB is 0.02 us); there the second
# launch is what fusion saves: a few microseconds each, as long as the whole computation.

# %%
check("03.linear_relu", linear_relu)

# %% [markdown]
# ## The benchmark
#
# Against `torch.matmul` (cuBLAS) in fp16 and bf16 from 512^3 to 8192^3, in fp32 with TF32 on both
# sides, and `linear_relu` against eager and `torch.compile`d `relu(addmm(...))`. On a GPU this
# runs the quick part of `course_utils/benches/l03.py`; `python -m course_utils bench 03` runs it
# all (every autotune config on its own row, the tile-size, launch-order, autotune-cost and accuracy
# experiments) and writes `results/03_matmul.json`.

# %%
if can_time():
    table = Table("03")
    bench.run(table, quick=True)
    table.show()
    rows = [{"group": r.group, "name": r.name, "tflops": r.tflops} for r in table.rows]
    targets = [{"group": t.group, "ours": t.ours, "peer": t.peer, "ratio": t.ratio, "minimum": t.minimum}
               for t in table.targets]
    notes = table.notes
else:
    show_results("03")
    rows = (results or {}).get("rows", [])
    targets = (results or {}).get("targets", [])
if rows:
    plot_vs_size(rows)

# %% [markdown]
# ## What the plot shows
#
# TFLOP/s against size, one line per implementation and dtype. At 512^3 everything is far from peak:
# a 512^3 product is a quarter of a GFLOP, a few microseconds, and our 64 x 64 tiles give 64
# programs for 132 SMs. The lines climb with size as the grid fills the GPU and the arithmetic
# intensity grows, and flatten at the large sizes, where ours and cuBLAS are both limited by the
# tensor cores; the ratios the design asks for are below. The naive kernel stays far below at every
# size: its traffic grows as fast as its arithmetic.
#
# Two things the committed H200 run showed that the napkin maths does not:
# - **Operand layout matters.** Hopper's tensor-core instruction (`wgmma`) reads its operands from
#   shared memory in a fixed orientation. In fp16/bf16 Triton handles either layout of `b`, but a
#   K-major `b` (an `nn.Linear` weight used as `w.t()`) ran at 520-600 TFLOP/s where a row-major `b`
#   ran at up to 700: that is why `linear_relu` at 4096^3 falls short of `torch.compile`'s cuBLAS
#   call while the plain matmul matches cuBLAS. In tf32, `wgmma` *requires* both operands K-major;
#   with a row-major `b` Triton fell back to an older instruction at under 150 TFLOP/s, so `matmul`
#   now transposes `b` once with lesson 02's `copy_2d` (8KN bytes, a few percent of the time) and
#   the tf32 kernel runs on `wgmma`.
# - **Autotuning has noise.** The tuner times each candidate once; two configurations within a few
#   percent can swap places from run to run, which is why the sweep rows are in the results too.

# %%
for t in targets:
    ratio = f"{t['ratio']:.2f}" if t.get("ratio") is not None else "not measured"
    print(f"{t['group']:<32} {t['ours']} vs {t['peer']}: {ratio} (needs {t['minimum']:.2f})")
for note in notes:
    if "naive" in note or "picked" in note:
        print("note:", note)
