# %% [markdown]
# # Lesson 03 exercises: matrix multiplication
#
# Four exercises, from the launch order of the tiles to a fused `relu(x @ w.T + bias)`:
#
# | id | you write | checked on |
# |---|---|---|
# | 03.grouped_pid | `grouped_pid(...)` in plain Python | every pid of several grids |
# | 03.matmul_naive | `matmul_naive_kernel`, `matmul_naive(a, b, out)` | odd sizes, strided inputs |
# | 03.matmul | `grouped_tile`, `matmul_kernel`, `matmul(a, b, out)` | odd sizes, 1, strides, fp32/fp16/bf16 |
# | 03.linear_relu | `linear_relu(x, w, bias, out)`: `matmul`'s epilogue | nn.Linear layout, one kernel |
#
# In interpreter mode (no GPU) the kernels run on the CPU through Triton's interpreter: same code,
# smaller sizes. fp32 dots are exact there. On a GPU `tl.dot` rounds fp32 inputs to TF32 by default;
# `matmul` follows PyTorch's setting instead (`dot_precision` below: IEEE fp32 unless
# `torch.set_float32_matmul_precision("high")`), and the checks' tolerances allow both.
#
# The lesson: [03 · Matmul](../notebooks/03_matmul.ipynb).

# %% [setup]

# %%
from course_utils import check, current, progress  # noqa: F401
from course_utils.shapes import expect_contiguous, expect_shapes, needs_int64  # noqa: E402
import functools  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_utils.lessons.l02_first_kernels import copy_2d  # noqa: E402

# %% [markdown]
# ## 03.grouped_pid: the launch order of the tiles
#
# Taught in [The grouped launch order](../notebooks/03_matmul.ipynb#The-grouped-launch-order), next to worked siblings for
# row-major and column-major order.
#
# A tiled matmul launches one program per `BLOCK_M x BLOCK_N` tile of `out`: a grid of
# `num_pid_m x num_pid_n` tiles, but programs are numbered `pid = 0, 1, 2, ...` in one dimension.
# Which tile does program `pid` compute? Row-major order (`pid // num_pid_n, pid % num_pid_n`) sweeps
# whole rows of tiles, so the programs running at the same time need every column panel of `b`.
# The **grouped** order keeps them inside a band of `group_m` tile rows:
#
# - programs come in groups of `group_m * num_pid_n`; group `g` covers tile rows
#   `g * group_m ... g * group_m + group_m - 1` (the last group may have fewer rows, when
#   `num_pid_m` is no multiple of `group_m`);
# - inside a group, consecutive pids go **down** the group's rows first, then on to the next column.
#
# With `num_pid_m = 5, num_pid_n = 3, group_m = 2` the pids land on the tiles like this:
# ```
# tile row 0:   0  2  4
# tile row 1:   1  3  5
# tile row 2:   6  8 10
# tile row 3:   7  9 11
# tile row 4:  12 13 14      <- the last group has 1 row
# ```
# Write `grouped_pid(pid, num_pid_m, num_pid_n, group_m) -> (pid_m, pid_n)` in plain Python
# (integer `//`, `%` and `min`). The checker calls it for every pid of several grids: the answer
# must be this order exactly, which also makes it a bijection (every tile computed once).

# %%
def grouped_pid(pid: int, num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """The tile (pid_m, pid_n) that program `pid` computes, in the grouped (L2-friendly) order."""
    # BEGIN SOLUTION
    num_pid_in_group = group_m * num_pid_n  # a group: group_m rows of tiles, every column
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * group_m  # the group's top tile row
    group_size_m = min(num_pid_m - first_pid_m, group_m)  # the last group may be shorter
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m  # down the rows first...
    pid_n = (pid % num_pid_in_group) // group_size_m  # ...then the next column
    return pid_m, pid_n
    # END SOLUTION


# %% [check] 03.grouped_pid

# %% [markdown]
# ## 03.matmul_naive: one output element per program
#
# Taught in [One output per program](../notebooks/03_matmul.ipynb#One-output-per-program:-a-matrix-vector-product), with a
# matrix-vector product as the worked sibling.
#
# `out[m, n] = sum_k a[m, k] * b[k, n]` for `a (M, K)`, `b (K, N)` and `out (M, N)`, each with any strides.
# The strawman: `M x N` programs, one per output; program `(m, n)` walks row `m` of `a` and column `n`
# of `b` in chunks of `BLOCK_K` (mask the last chunk: `K` is any length), multiplies in fp32 and
# sums. Traffic: every program loads `2K` elements for `2K` FLOPs, `2MNK` loads in all; nothing is
# reused between programs except by luck in the caches. Launch them as a 1-D grid of `M * N` programs
# (`m = pid % M`, `n = pid // M`): a 2-D grid `(M, N)` does not launch on a GPU once `N` passes 65535,
# the most programs its axis 1 holds (lesson 02's `GRID_AXIS_MAX`), and a vocabulary-sized output
# (N = 128256 for Llama 3) passes it.

# %%
@triton.jit
def matmul_naive_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                        BLOCK_K: tl.constexpr):
    # BEGIN SOLUTION
    pid = tl.program_id(0)  # one program per output element, down each column of out in turn
    m = (pid % M).to(tl.int64)  # m runs fastest: neighbouring programs walk the same column of b
    n = (pid // M).to(tl.int64)  # 64-bit, as m: m * stride_am (n * stride_bn) may pass 2^31 elements
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)  # (BLOCK_K,) partial sums, in fp32 whatever the inputs
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
        mask = k < K  # the last chunk runs past K
        a = tl.load(a_ptr + m * stride_am + k * stride_ak, mask=mask, other=0.0)  # row m of a
        b = tl.load(b_ptr + k * stride_bk + n * stride_bn, mask=mask, other=0.0)  # column n of b
        acc += a.to(tl.float32) * b.to(tl.float32)  # 2 FLOPs per 2 elements loaded
    tl.store(c_ptr + m * stride_cm + n * stride_cn, tl.sum(acc, axis=0))
    # END SOLUTION


def matmul_naive(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b with one program per output element; a (M, K), b (K, N), out (M, N), any strides."""
    expect_shapes("matmul_naive", b=(b, (a.shape[1], b.shape[1])), out=(out, (a.shape[0], b.shape[1])))
    # BEGIN SOLUTION
    M, K = a.shape
    N = b.shape[1]
    grid = (M * N,)  # M * N programs, one per output element, on axis 0 (2^31 - 1 programs, not 65535)
    matmul_naive_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                              out.stride(0), out.stride(1), BLOCK_K=128)
    # END SOLUTION


# %% [check] 03.matmul_naive

# %% [markdown]
# ## 03.matmul: tiles, tl.dot, the grouped order, autotuning
#
# Taught in [Tiling: the traffic algebra](../notebooks/03_matmul.ipynb#Tiling:-the-traffic-algebra),
# [The tiled kernel with tl.dot](../notebooks/03_matmul.ipynb#The-tiled-kernel-with-tl.dot) (worked sibling: a tiled
# `alpha * (a @ b)`) and [The grouped launch order](../notebooks/03_matmul.ipynb#The-grouped-launch-order).
#
# One program per `BLOCK_M x BLOCK_N` tile of `out`. It walks `K` in steps of `BLOCK_K`: load an
# `(BLOCK_M, BLOCK_K)` tile of `a` and a `(BLOCK_K, BLOCK_N)` tile of `b`, and accumulate
# `acc = tl.dot(a_tile, b_tile, acc)` in fp32 (on a GPU `tl.dot` runs on the tensor cores). Each
# loaded element now serves `BLOCK_N` (or `BLOCK_M`) multiply-adds instead of one.
#
# First the grouped order again, inside a kernel: `grouped_tile` is `grouped_pid` written with
# Triton's operations (`tl.minimum` instead of `min`; `GROUP_M` is a compile-time constant).

# %%
@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """grouped_pid inside a kernel: the tile (pid_m, pid_n) of program pid, grouped order."""
    # BEGIN SOLUTION
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n
    # END SOLUTION


# %% [markdown]
# Block sizes are not yours to fix by hand: `@triton.autotune` times a few candidate `triton.Config`s
# the first time it sees a new `key` (here `M, N, K`, the operands' layout and the fp32 dot precision;
# the autotuner adds the dtypes of the tensor arguments itself) and remembers the fastest. The layout
# is in the key through `stride_ak` and `stride_bk`: `stride_bk == 1` is a K-major b (an `nn.Linear`
# weight viewed as `w.t()`), `stride_bk == N` a row-major one, and each runs fastest with its own tile. On a GPU the candidates are
# tiles that suit Hopper and Ampere tensor cores; in the interpreter there is one small tile (timing
# means nothing there). `select_configs` prunes the list before any timing:
# - `BLOCK_K` is chosen so that a tile row is 128 bytes: 64 fp16/bf16 elements, 32 fp32 elements
#   (fp32 tiles would otherwise need twice the shared memory per pipeline stage);
# - a small problem (under 2^31 FLOPs) gets one 64 x 64 tile and no timing at all: tuning costs more
#   than it could save there, and any tile leaves most of a big GPU idle anyway.

# %%
def _config(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 8) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
                         num_warps=warps, num_stages=stages)


def matmul_configs(interpret: bool | None = None) -> list[triton.Config]:
    """The autotuner's candidates: one small tile in the interpreter, Hopper-friendly tiles on a GPU."""
    if current().interpret if interpret is None else interpret:
        return [_config(64, 64, 64, warps=4, stages=1, group_m=2)]
    configs = []
    for bk in (64, 32):  # 128-byte tile rows for 2-byte and 4-byte dtypes (see select_configs)
        configs += [
            _config(128, 256, bk, warps=8, stages=3),  # shared memory per stage: (128 + 256) x 128 B = 48 KiB
            _config(128, 256, bk, warps=8, stages=4),
            _config(256, 128, bk, warps=8, stages=3),
            _config(256, 128, bk, warps=8, stages=4),  # measured best for K-major b (nn.Linear weights)
            _config(128, 128, bk, warps=8, stages=4),
            _config(128, 128, bk, warps=4, stages=4),
            _config(128, 64, bk, warps=4, stages=4),
            _config(64, 128, bk, warps=4, stages=4),
            _config(64, 64, bk, warps=4, stages=4),  # the tile of small problems
        ]
    return configs


SMALL_PROBLEM_FLOPS = 2**31  # 2MNK below this (1024^3 is the first size tuned): one config, no timing


def select_configs(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Autotune pruning: 128-byte K slices for the dtype, and a single small tile for small problems."""
    element_size = named_args["a_ptr"].element_size()
    fitting = [c for c in configs if c.kwargs["BLOCK_K"] * element_size == 128] or list(configs)
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    if 2 * M * N * K < SMALL_PROBLEM_FLOPS:
        smallest = min(fitting, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], c.num_warps))
        return [smallest]
    return fitting


def hopper() -> bool:
    """A Hopper GPU (sm_90), whose wgmma instruction wants tf32 operands K-major."""
    return current().gpu and torch.cuda.get_device_capability()[0] == 9


@functools.cache
def sm_count(device: torch.device) -> int:
    """The GPU's SM count, asked once per device (the query costs microseconds, a launch's budget)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for fp32 that matches torch.matmul's: see torch.set_float32_matmul_precision.

    "highest" (torch's default) means IEEE fp32 arithmetic; "high" and "medium" allow TF32 tensor
    cores (10-bit mantissas). fp16 and bf16 dots ignore the setting.
    """
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


# %% [markdown]
# Now the kernel. The tile of program `pid` is `grouped_tile(pid, ...)`. Masks for sizes that are no
# multiple of the tile:
# - **K**: the last `BLOCK_K` step runs past `K`; load those elements as 0 (`mask=..., other=0.0`)
#   so they add nothing to the dot.
# - **M and N**: take the row and column indices modulo `M` and `N` for the loads (a partial tile
#   re-reads valid rows instead of running off the end, and the loads need no mask), then mask the
#   store so only rows `< M` and columns `< N` are written.
#
# The epilogue runs on the fp32 accumulator before the single store: `HAS_BIAS` adds `bias[n]` to
# every column, `RELU` clamps at 0. Both are `tl.constexpr`, so a launch with them off compiles to
# the plain matmul. Pass `INPUT_PRECISION` to `tl.dot(..., input_precision=INPUT_PRECISION)`.
# `OFFSETS_64`, also a `tl.constexpr`: row times stride is an int32 product, which passes 2^31 - 1
# only in a view into a tensor of more than 2^31 elements. The host passes
# `OFFSETS_64=needs_int64(a, b, out)` (from `course_utils.shapes`), and the kernel then makes its row
# and column indices int64 (`.to(tl.int64)`); every other launch keeps int32 indices, which take fewer
# registers.
#
# Then the host: `matmul(a, b, out)` for `a (M, K)`, `b (K, N)` with any strides (pass all six
# strides), fp32, fp16 or bf16. The grid is one-dimensional: `cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)`
# programs, a function of the config the autotuner picks (`grid = lambda meta: ...`). The optional
# `bias`, `relu`, `config` (run this one `triton.Config` instead of autotuning: `matmul_kernel.fn`
# is the kernel under the autotuner) and `input_precision` are for the next exercise and the
# benchmarks; `03.matmul` only calls `matmul(a, b, out)`.

# %%
@triton.autotune(configs=matmul_configs(), key=["M", "N", "K", "stride_ak", "stride_bk", "INPUT_PRECISION"],
                 prune_configs_by={"early_config_prune": select_configs})
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr,  # a (M, K), b (K, N), c (M, N), bias (N,)
                  M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  HAS_BIAS: tl.constexpr, RELU: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, OFFSETS_64: tl.constexpr = False):
    # BEGIN SOLUTION
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) rows of c this program owns
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    offs_k = tl.arange(0, BLOCK_K)  # (BLOCK_K,)
    a_rows = rows % M  # past the last row: re-read valid rows (their results are not stored)
    b_cols = cols % N
    if OFFSETS_64:  # a view into more than 2^31 elements: a row times stride_am may pass int32
        rows, cols, a_rows, b_cols = rows.to(tl.int64), cols.to(tl.int64), a_rows.to(tl.int64), b_cols.to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BLOCK_M, BLOCK_K)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + b_cols[None, :] * stride_bn  # (BLOCK_K, BLOCK_N)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Per step: load (BLOCK_M + BLOCK_N) * BLOCK_K elements, do 2 * BLOCK_M * BLOCK_N * BLOCK_K FLOPs.
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K  # elements of K not yet consumed; the last step may have < BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)  # tensor cores on a GPU
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # Epilogue on the fp32 accumulator, before the single store: nothing extra goes to memory.
    if HAS_BIAS:
        acc += tl.load(bias_ptr + b_cols).to(tl.float32)[None, :]  # bias[n], broadcast down the rows
    if RELU:
        acc = tl.maximum(acc, 0.0)
    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)  # write M x N once
    # END SOLUTION


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None,
           relu: bool = False, *, config: triton.Config | None = None,
           input_precision: str | None = None) -> None:
    """out = a @ b (+ bias) (then ReLU), one kernel; a (M, K), b (K, N), out (M, N), any strides.

    bias: (N,) added to every row. config: run this triton.Config instead of autotuning.
    input_precision: "tf32" or "ieee" for fp32 inputs; None follows torch.get_float32_matmul_precision().
    """
    expect_shapes("matmul", b=(b, (a.shape[1], b.shape[1])), out=(out, (a.shape[0], b.shape[1])))
    if bias is not None:
        expect_shapes("matmul", bias=(bias, (b.shape[1],)))
        expect_contiguous("matmul", bias=bias)
    # BEGIN SOLUTION
    M, K = a.shape
    N = b.shape[1]
    precision = input_precision or dot_precision(a.dtype)
    if a.dtype == torch.float32 and precision == "tf32" and b.stride(0) != 1 and hopper():
        # Hopper's tf32 tensor-core instruction (wgmma) reads both operands K-major; the kernel Triton
        # builds for a row-major b takes about twice the time at 4096^3 on an H100
        # (results/explore/tf32_rowmajor.h100.json). One transposing copy with lesson 02's kernel
        # (read and write K x N x 4 bytes) costs far less.
        b_kmajor = torch.empty((N, K), device=b.device, dtype=b.dtype)
        copy_2d(b.t(), b_kmajor)
        b = b_kmajor.t()  # (K, N) again, strides (1, K)
    if config is None and precision != "ieee" and tma_ready(a, b, out):
        matmul_tma(a, b, out, bias, relu, precision)  # Hopper: the same loop, tiles fetched by TMA
        return
    kernel = matmul_kernel if config is None else matmul_kernel.fn  # .fn: the kernel under the autotuner
    meta = {} if config is None else config.all_kwargs()

    def grid(meta):  # one program per tile of out
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    kernel[grid](a, b, out, out if bias is None else bias,  # bias_ptr is never read without HAS_BIAS
                 M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
                 HAS_BIAS=bias is not None, RELU=relu, INPUT_PRECISION=precision,
                 OFFSETS_64=needs_int64(a, b, out), **meta)
    # END SOLUTION


# %% [markdown]
# ### Optional, Hopper only: the same loop with TMA descriptors, in a persistent kernel
#
# Not needed for the check. On Hopper (sm_90) a unit of each SM for bulk copies, the Tensor Memory
# Accelerator (TMA), fetches a whole tile from a **descriptor**: `tl.make_tensor_descriptor(ptr, shape,
# strides, block_shape)` describes a 2-D tensor once, and `desc.load([row, col])` brings the
# `block_shape` tile at that corner into shared memory, filling zeros past the edges (no masks, no
# `% M`), without the threads computing a single address. Its rules: the last stride is 1, every other
# stride and the base are multiples of 16 bytes. So `matmul` takes this path only for large problems on Hopper with a
# row-major `a` and a K-major `b` (an `nn.Linear` weight `w.t()`, or the tf32 copy above), both aligned:
# `b` is described as the `(N, K)` matrix it is in memory, and the dot reads its tile as `b_tile.T`.
# The kernel is also **persistent**: one program per SM walks the output tiles `pid, pid + NUM_SMS, ...`
# in the grouped order, and its loop over tiles is **flattened** with the K loop inside it
# (`tl.range(..., flatten=True)`), so the compiler pipelines across tiles: the loads of the next tile's
# first K steps are in flight while this tile's epilogue runs. The epilogue then shares the shared
# memory with those stages: it stores the output tile in two halves, each needing half the space.
# The lesson's benchmark times both paths at 4096^3 (tf32, and linear_relu in fp16). The descriptors are
# built on the GPU, in a scratch buffer that the kernel gets through `triton.set_allocator` (set by
# `matmul_tma` when it launches, not at import); triton >= 3.4.

# %%
def tma_configs(interpret: bool | None = None) -> list[triton.Config]:
    """Candidates of the TMA kernel: 128 x 256 tiles and deeper pipelines (TMA needs no address registers)."""
    if current().interpret if interpret is None else interpret:
        return matmul_configs(interpret=True)
    tiles = ((128, 256, 3), (128, 256, 4), (256, 128, 3), (128, 128, 5))  # BLOCK_M, BLOCK_N, stages
    return [_config(bm, bn, 128 // size, warps=8, stages=stages) for size in (2, 4) for bm, bn, stages in tiles]


TMA_PROBLEM_FLOPS = 2**36  # 2MNK from about 3250^3 on: below, the pointer kernel's smaller tiles won on an H200


def tma_ready(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """Does matmul_tma_kernel take a @ b: Hopper, triton >= 3.4, a large problem, a row-major, b K-major,
    row starts 16-byte aligned and apart (a broadcast operand, stride 0, goes to the pointer kernel)?"""
    M, K = a.shape
    N = b.shape[1]
    size = a.element_size()
    return (hopper() and hasattr(tl, "make_tensor_descriptor") and 2 * M * N * K >= TMA_PROBLEM_FLOPS
            and a.dtype == b.dtype and a.stride(1) == 1 and b.stride(0) == 1
            and all(stride > 0 and stride * size % 16 == 0 for stride in (a.stride(0), b.stride(1)))
            and all(t.data_ptr() % 16 == 0 for t in (a, b)))


@triton.autotune(configs=tma_configs(), key=["M", "N", "K", "INPUT_PRECISION"],
                 prune_configs_by={"early_config_prune": select_configs})
@triton.jit
def matmul_tma_kernel(a_ptr, b_ptr, c_ptr, bias_ptr,  # a (M, K) row-major, b (N, K) row-major: b.T is (K, N)
                      M, N, K, stride_am, stride_bn, stride_cm, stride_cn,
                      HAS_BIAS: tl.constexpr, RELU: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                      NUM_SMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, OFFSETS_64: tl.constexpr = False):
    # BEGIN SOLUTION
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])  # row-major a
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])  # b.T as it lies in memory
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Persistent: this program takes tiles pid, pid + NUM_SMS, ...; flattened with the K loop, so the
    # next tile's first loads are issued while this tile's epilogue runs.
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])  # (BLOCK_M, BLOCK_K), zeros past M and K
            b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])  # (BLOCK_N, BLOCK_K), zeros past N and K
            acc = tl.dot(a, b.T, acc, input_precision=INPUT_PRECISION)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols % N).to(tl.float32)[None, :]
        if RELU:
            acc = tl.maximum(acc, 0.0)
        # Stored in two halves, (BLOCK_M, BLOCK_N / 2) each: a store passes through shared memory, which
        # also holds the next tile's stages now, and a half needs half the space (fp32 128 x 256: 64 KiB).
        left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)  # the left half's columns
        if OFFSETS_64:  # out a view into more than 2^31 elements
            rows, cols = rows.to(tl.int64), cols.to(tl.int64)
        tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, left.to(c_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))
        cols += BLOCK_N // 2
        tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, right.to(c_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))
    # END SOLUTION


def matmul_tma(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None, relu: bool,
               precision: str) -> None:
    """matmul on matmul_tma_kernel, for operands that tma_ready accepts."""
    M, K = a.shape
    N = b.shape[1]
    # The kernel writes its descriptors (128 bytes each) to a scratch buffer it asks this allocator for.
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=a.device))
    sms = sm_count(a.device)

    def grid(meta):  # persistent: one program per SM, or one per tile when there are fewer tiles
        return (min(sms, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)

    matmul_tma_kernel[grid](a, b, out, out if bias is None else bias, M, N, K, a.stride(0), b.stride(1),
                            out.stride(0), out.stride(1), HAS_BIAS=bias is not None, RELU=relu,
                            INPUT_PRECISION=precision, NUM_SMS=sms, OFFSETS_64=needs_int64(out))


# %% [check] 03.matmul

# %% [markdown]
# ## 03.linear_relu: a fused epilogue
#
# Taught in [A fused epilogue](../notebooks/03_matmul.ipynb#A-fused-epilogue:-GEMM-+-bias-+-ReLU) (worked sibling: a scaled
# linear layer on `w.t()`).
#
# `out = relu(x @ w.T + bias)` with `x (M, K)`, `w (N, K)` stored the way `nn.Linear` stores its
# weight, `bias (N,)` contiguous, `out (M, N)`, in **one** kernel launch; `x`, `w` and `out` may have
# any strides (a slice of a wider activation, a column-major `out`). No new kernel: `w.t()` is a
# `(K, N)` view of the same memory (strides `(1, K)`, no copy), and `matmul` already takes any strides
# and has the epilogue. The bias and the ReLU go on the fp32 accumulator, and a 16-bit `out` is
# rounded once, at the store (the check allows one rounding of its dtype from the exact result, plus
# the fp32 sum's own error). Unfused, `relu(addmm(bias, x, w.t()))` writes `out`, reads it back and
# writes it again: `2MN` extra elements of traffic and a second launch.

# %%
def linear_relu(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
    """out = relu(x @ w.T + bias); x (M, K), w (N, K) and out (M, N) any strides, bias (N,) contiguous (as
    nn.Linear's); one kernel."""
    expect_shapes("linear_relu", w=(w, (w.shape[0], x.shape[1])), bias=(bias, (w.shape[0],)),
                  out=(out, (x.shape[0], w.shape[0])))
    expect_contiguous("linear_relu", bias=bias)  # the kernel reads bias[n] at bias + n
    # BEGIN SOLUTION
    matmul(x, w.t(), out, bias=bias, relu=True)  # w.t(): a (K, N) view, strides (1, K)
    # END SOLUTION


# %% [check] 03.linear_relu

# %% [progress] 03
