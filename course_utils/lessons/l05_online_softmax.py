# %% [markdown]
# # Lesson 05 exercises: online softmax, a fused softmax kernel, FlashAttention
#
# Four exercises, each checked by `check(...)` on fresh random inputs:
# 1. `05.merge_stats`: merge the (max, normalizer) statistics of two blocks (plain Python);
# 2. `05.online_softmax_stats`: the statistics of a whole vector in one pass over its blocks;
# 3. `05.softmax`: a fused row-softmax kernel for rows of any length (one pass when a row fits in
#    one block, an online loop when it does not);
# 4. `05.attention` (bonus): FlashAttention's forward pass, the same trick applied to tiles of QK^T.
#
# The statistics of a set of numbers x: its maximum `m = max(x)` and its normalizer
# `d = sum(exp(x - m))`. With them, `softmax(x) = exp(x - m) / d`, and `logsumexp(x) = m + log(d)`.
#
# The lesson, [notebooks/05_online_softmax.ipynb](../notebooks/05_online_softmax.ipynb), teaches each exercise with a worked sibling;
# every exercise below links its section.

# %% [setup]

# %%
from course_utils import check, progress  # noqa: F401
from course_utils.shapes import expect_shapes, needs_int64  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_utils import current, size  # noqa: E402

# %% [markdown]
# ## 05.merge_stats: merge two blocks
#
# `merge_stats(m1, d1, m2, d2) -> (m, d)`. Taught in the lesson's
# [Merging the statistics of two blocks](../notebooks/05_online_softmax.ipynb#Merging-the-statistics-of-two-blocks) (the worked
# example merges running means and variances, Welford's way).
#
# Block 1 has max `m1` and normalizer `d1 = sum(exp(x - m1))` over its elements, block 2 has `m2`,
# `d2`. The union has max `m = max(m1, m2)`, and each normalizer only needs its reference point moved
# from its own max to `m`: `sum(exp(x - m)) = exp(m1 - m) * sum(exp(x - m1))`. So
#
#     m = max(m1, m2)        d = d1 * exp(m1 - m) + d2 * exp(m2 - m)
#
# Both factors are `<= 1`: nothing can overflow. An *empty* block (or one holding only `-inf`) has
# statistics `(-inf, 0)`; merging two of them must give `(-inf, 0)`, not `exp(-inf - (-inf)) = NaN`.
# Arguments are Python floats or 0-d tensors; return a tuple `(m, d)` of either.

# %%
def merge_stats(m1, d1, m2, d2):
    """The (max, sum of exp(x - max)) of the union of two blocks, from each block's own pair."""
    # BEGIN SOLUTION
    m = max(m1, m2)
    if m == -math.inf:  # both blocks empty: exp(m1 - m) would be exp(-inf + inf) = NaN
        return m, d1 + d2
    return m, d1 * math.exp(m1 - m) + d2 * math.exp(m2 - m)  # both factors <= 1: no overflow
    # END SOLUTION


# %% [check] 05.merge_stats

# %% [markdown]
# ## 05.online_softmax_stats: one pass over blocks
#
# `online_softmax_stats(x, block) -> (m, d)`. Taught in the lesson's
# [Merging the statistics of two blocks](../notebooks/05_online_softmax.ipynb#Merging-the-statistics-of-two-blocks) (the worked
# example walks a tensor block by block for its mean and variance).
#
# The max and normalizer of a 1-D tensor, reading it **once**, front to back, `block` elements at a
# time: keep a running `(m, d)`, compute each block's own statistics, and merge them in with
# `merge_stats`. Not allowed: reducing the whole tensor at once (`x.max()` over all of `x` is a pass
# of its own), going back to an earlier block (a second pass, over x or over copies of its blocks kept
# for it, in tensors, Python lists or NumPy arrays: hold the block in hand and the running statistics, no
# more), or `torch.softmax`/`logsumexp`.
# Mind a block that holds only `-inf`: its statistics are `(-inf, 0)`.

# %%
def online_softmax_stats(x: torch.Tensor, block: int):
    """(max(x), sum(exp(x - max(x)))) of a 1-D tensor in one front-to-back pass over blocks."""
    # BEGIN SOLUTION
    m, d = -math.inf, 0.0  # the statistics of nothing
    for start in range(0, x.numel(), block):
        chunk = x[start:start + block].to(torch.float64)  # (<= block,) read once
        m_b = float(chunk.max())
        d_b = float(torch.exp(chunk - m_b).sum()) if m_b > -math.inf else 0.0
        m, d = merge_stats(m, d, m_b, d_b)
    return m, d
    # END SOLUTION


# %% [check] 05.online_softmax_stats

# %% [markdown]
# ## 05.softmax: a fused row softmax
#
# `softmax(x, out)`. Taught in the lesson's
# [The fused softmax kernels](../notebooks/05_online_softmax.ipynb#The-fused-softmax-kernels) (the worked example is a row-wise
# log-sum-exp kernel).
#
# `out[i, :] = softmax(x[i, :])` for a 2-D `x` and `out` of any strides (each its own: `out` may be
# a transposed view) and rows of any length, in fp32 arithmetic whatever the storage dtype. Two
# kernels, one launch each:
#
# - **one pass** (`softmax_kernel`), for rows that fit in one block (`n_cols <= ONE_PASS_MAX_COLS`):
#   a program loads `ROWS` whole rows (a `(ROWS, BLOCK_N)` tile, `BLOCK_N >= n_cols`), takes the max
#   and the sum in registers and writes the result. Traffic: read the row once, write it once,
#   exactly what a copy moves. (The course's kernel also loops over row blocks `pid, pid + n_programs,
#   ...`, pipelined by `NUM_STAGES`, so that a launch may use fewer programs than row blocks: a
#   persistent grid. That is a tuning option, not part of the exercise: the check launches
#   `softmax(x, out)` with its defaults, one program per row block, and `NUM_STAGES` may stay unused.)
# - **online** (`softmax_online_kernel`), for longer rows: one program per row. Pass 1 walks the
#   row in blocks keeping a running `(m, d)` *per lane* (`BLOCK_N` independent online softmaxes,
#   merged with `merge_stats`' formula at the end); pass 2 reads the row again and writes
#   `exp(x - m) / d`. Traffic: read twice, write once.
#
# Pad with `-inf`, never 0: a padded 0 could become the max, and adds `exp(0 - m)` to the sum.
# A lane that has seen only `-inf` so far has `m = -inf`: subtracting it gives NaN, so subtract 0
# there instead (`exp(-inf - 0) = 0` is what you want).

# %%
ONE_PASS_MAX_COLS = 32768  # longest row held in registers: fp32 128 KiB, 64 values per thread at 16 warps


@dataclass(frozen=True)
class SoftmaxConfig:
    """How `softmax` launches: which kernel, its block sizes, warps and number of programs."""

    online: bool  # False: one-pass softmax_kernel; True: softmax_online_kernel
    block_n: int  # columns per block (one pass: a power of 2 >= n_cols)
    rows: int = 1  # rows per program (one pass only)
    num_warps: int = 4
    programs: int | None = None  # one pass: None = one program per row block, else a persistent grid
    num_stages: int = 1  # software pipelining of the kernel's loop


def softmax_config(n_rows: int, n_cols: int) -> SoftmaxConfig:
    """Launch parameters for this shape: whole rows in registers when they fit, else the online loop."""
    block_n = triton.next_power_of_2(n_cols)
    if block_n > ONE_PASS_MAX_COLS:
        return SoftmaxConfig(online=True, block_n=size(4096, 8192), num_warps=8)
    # Short rows: several per program, ~2048 values per tile on a GPU. The interpreter runs programs
    # one after another at a fixed cost each, so there fewer, larger tiles are faster.
    rows = max(1, min(16, size(2048, 16384) // block_n))
    num_warps = max(4, min(16, rows * block_n // 512))  # ~16 values per thread, at least 4 warps
    return SoftmaxConfig(online=False, block_n=block_n, rows=rows, num_warps=num_warps)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_xm, stride_xn, stride_om, stride_on,
                   ROWS: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    """One pass: ROWS whole rows per tile (BLOCK_N >= n_cols); read once, write once."""
    # BEGIN SOLUTION
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,) column indices
    col_mask = offs_n < n_cols
    cols = offs_n.to(tl.int64)  # 64-bit: a column times the stride of a transposed x may pass 2^31 elements
    n_row_blocks = tl.cdiv(n_rows, ROWS)
    for row_block in tl.range(tl.program_id(0), n_row_blocks, tl.num_programs(0), num_stages=NUM_STAGES):
        offs_m = row_block * ROWS + tl.arange(0, ROWS)  # (ROWS,) row indices
        safe_m = tl.minimum(offs_m, n_rows - 1).to(tl.int64)  # rows past the end re-read the last row
        x = tl.load(x_ptr + safe_m[:, None] * stride_xm + cols[None, :] * stride_xn,
                    mask=col_mask[None, :], other=float("-inf")).to(tl.float32)  # (ROWS, BLOCK_N)
        m = tl.max(x, axis=1)  # (ROWS,) pass 1, in registers
        p = tl.exp(x - m[:, None])  # padding: exp(-inf) = 0
        d = tl.sum(p, axis=1)  # (ROWS,) pass 2, in registers
        y = p * (1.0 / d)[:, None]  # pass 3, in registers
        tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + cols[None, :] * stride_on,
                 y.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < n_rows) & col_mask[None, :])
    # END SOLUTION


@triton.jit
def softmax_online_kernel(x_ptr, out_ptr, n_cols, stride_xm, stride_xn, stride_om, stride_on,
                          BLOCK_N: tl.constexpr):
    """Rows of any length, one program per row: online (m, d) over blocks, then normalize."""
    # BEGIN SOLUTION
    row = tl.program_id(0).to(tl.int64)  # 64-bit offsets: rows (or columns) x stride may pass 2^31 elements
    x_row = x_ptr + row * stride_xm
    out_row = out_ptr + row * stride_om
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)  # (BLOCK_N,) column indices within a block
    m = tl.full((BLOCK_N,), float("-inf"), tl.float32)  # running max of each lane
    d = tl.zeros((BLOCK_N,), tl.float32)  # running sum of exp(x - m) of each lane
    for start in range(0, n_cols, BLOCK_N):  # pass 1: read the row once
        mask = start + offs_n < n_cols
        x = tl.load(x_row + (start + offs_n) * stride_xn, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # lanes that saw only -inf: avoid -inf - -inf
        d = d * tl.exp(m - m_ref) + tl.exp(x - m_ref)  # rescale the old sum to the new max, add the new term
        m = m_new
    m_row = tl.max(m, axis=0)  # merge the BLOCK_N lanes (merge_stats, vectorized)
    d_row = tl.sum(d * tl.exp(m - m_row), axis=0)
    inv_d = 1.0 / d_row
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    for i in range(n_blocks):  # pass 2: read again, last block first (it is the likeliest in L2)
        start = (n_blocks - 1 - i) * BLOCK_N
        mask = start + offs_n < n_cols
        x = tl.load(x_row + (start + offs_n) * stride_xn, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(x - m_row) * inv_d
        tl.store(out_row + (start + offs_n) * stride_on, y.to(out_ptr.dtype.element_ty), mask=mask)
    # END SOLUTION


def softmax(x: torch.Tensor, out: torch.Tensor, config: SoftmaxConfig | None = None) -> None:
    """out = softmax(x, dim=1) for a 2-D x of any strides and any row length; out has x's shape."""
    expect_shapes("softmax", out=(out, x.shape))
    n_rows, n_cols = x.shape
    if out.numel() == 0:  # no rows, or rows of no elements: nothing to write (and no block size to pick)
        return
    cfg = config or softmax_config(n_rows, n_cols)
    # BEGIN SOLUTION
    strides = (x.stride(0), x.stride(1), out.stride(0), out.stride(1))
    if cfg.online:
        softmax_online_kernel[(n_rows,)](x, out, n_cols, *strides, BLOCK_N=cfg.block_n,
                                         num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    else:
        n_row_blocks = triton.cdiv(n_rows, cfg.rows)
        programs = min(cfg.programs or n_row_blocks, n_row_blocks)
        softmax_kernel[(programs,)](x, out, n_rows, n_cols, *strides, ROWS=cfg.rows, BLOCK_N=cfg.block_n,
                                    NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    # END SOLUTION


# %% [check] 05.softmax

# %% [markdown]
# ## 05.attention: bonus, FlashAttention forward
#
# `attention(q, k, v, out, causal)`. Taught in the lesson's
# [FlashAttention, online softmax on tiles of QK^T](../notebooks/05_online_softmax.ipynb#FlashAttention,-online-softmax-on-tiles-of-QK^T)
# (the worked example computes the row statistics of `softmax(QK^T)` tile by tile, without the output).
#
# `out = softmax(q @ k^T / sqrt(D) + mask) @ v` for `(B, H, S, D)` tensors (any strides), without
# ever writing the `(S, S)` score matrix: FlashAttention-2's forward pass. A program owns a tile of
# `BLOCK_M` queries and walks the keys in tiles of `BLOCK_N`, keeping per query row a running max
# `m`, a running normalizer `l` and an unnormalized output `acc` (`BLOCK_M x D`, fp32):
#
#     s = q @ k_tile^T * scale                  (BLOCK_M, BLOCK_N)
#     m_new = max(m, rowmax(s));  alpha = exp(m - m_new);  p = exp(s - m_new[:, None])
#     l = l * alpha + rowsum(p);  acc = acc * alpha[:, None] + p @ v_tile;  m = m_new
#
# and writes `acc / l` at the end: the online normalizer again, with the output rescaled whenever the
# max changes. Use `exp2` with the scale premultiplied by log2(e) (`exp(x) = exp2(x * log2(e))`).
# Keys `>= S` in the last tile must get a score of `-inf`; with `causal=True` query `i` sees keys
# `j <= i` only. Tiles with no masked element (every key `< S`, every key before the query tile) need
# no mask at all: split the loop into an unmasked part and a masked part.
# `tl.dot` of 16-bit tiles needs its K `>= 16` (it pads a smaller M or N itself): `D` is a power of 2
# `>= 16`. `OFFSETS_64` is lesson 03's: the host passes `needs_int64(q, k, v, out, dims=(2, 3))`, and the
# kernel then makes a query row (and `lo`) int64 before it multiplies them by a stride.

# %%
@triton.jit
def _attention_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, S,
                     qk_scale, lo, hi, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                     OFFSETS_64: tl.constexpr = False):
    """Fold the key/value tiles [lo, hi) into (acc, l_i, m_i) for one tile of queries."""
    # BEGIN SOLUTION
    start = tl.cast(lo, tl.int64) if OFFSETS_64 else lo  # lo * the stride of a long sequence may pass 2^31
    k_ptrs += start * stride_kn
    v_ptrs += start * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + offs_n  # (BLOCK_N,)
        if MASKED:
            k = tl.load(k_ptrs, mask=keys[None, :] < S, other=0.0)  # (D, BLOCK_N)
        else:
            k = tl.load(k_ptrs)
        s = tl.dot(q, k)  # (BLOCK_M, BLOCK_N) unscaled scores, fp32
        if MASKED:
            keep = keys[None, :] < S
            if CAUSAL:
                keep = keep & (keys[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)  # (BLOCK_M,) log2 units; qk_scale > 0
        p = tl.exp2(s * qk_scale - m_new[:, None])  # (BLOCK_M, BLOCK_N), one FMA and one exp2 per score
        alpha = tl.exp2(m_i - m_new)  # the old terms were relative to a smaller max: shrink them
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if MASKED:
            v = tl.load(v_ptrs, mask=keys[:, None] < S, other=0.0)  # (BLOCK_N, D)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # (BLOCK_M, D)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    # END SOLUTION
    return acc, l_i, m_i


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, H, S, qk_scale,
                     stride_qb, stride_qh, stride_qs, stride_qd, stride_kb, stride_kh, stride_ks, stride_kd,
                     stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh, stride_os, stride_od,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, OFFSETS_64: tl.constexpr = False):
    """One program per (tile of BLOCK_M queries, batch * head), all on axis 0: grid
    (cdiv(S, BLOCK_M) * B * H,), the query tiles of one head side by side (they read the same keys)."""
    # BEGIN SOLUTION
    # Axis 0 holds 2^31 - 1 programs, axes 1 and 2 only 65535 (lesson 02's GRID_AXIS_MAX): a 2-D grid
    # (tiles, B * H) would not launch for 65536 heads of one token, so the pair is unfolded from one index.
    m_tiles = tl.cdiv(S, BLOCK_M)
    start_m = tl.program_id(0) % m_tiles
    bh = (tl.program_id(0) // m_tiles).to(tl.int64)  # batch * H + head; 64-bit: b * stride_qb may pass 2^31
    if CAUSAL:  # the last query tiles have the most keys: start them first
        start_m = m_tiles - 1 - start_m
    b = bh // H
    h = bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions within a tile
    offs_d = tl.arange(0, HEAD_DIM)  # (D,)
    # 64-bit only where a row times stride_qs can pass 2^31 (a long sequence of a wide packed qkv): int64
    # rows held through the loop cost registers, and the kernel 4 % of its time on an H200
    rows = offs_m.to(tl.int64) if OFFSETS_64 else offs_m
    q_ptrs = q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qs + offs_d[None, :] * stride_qd
    k_ptrs = k_ptr + b * stride_kb + h * stride_kh + offs_n[None, :] * stride_ks + offs_d[:, None] * stride_kd
    v_ptrs = v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd
    q = tl.load(q_ptrs, mask=offs_m[:, None] < S, other=0.0)  # (BLOCK_M, D), stays in registers
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    if CAUSAL:
        full_end = start_m * BLOCK_M  # keys before the query tile: visible to every query of it
        masked_end = tl.minimum(full_end + BLOCK_M, S)  # the diagonal tiles
    else:
        full_end = (S // BLOCK_N) * BLOCK_N  # whole key tiles
        masked_end = S  # the partial last tile
    acc, l_i, m_i = _attention_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_ks, stride_vs, offs_m, offs_n,
                                     S, qk_scale, 0, full_end, BLOCK_N, False, CAUSAL, OFFSETS_64)
    acc, l_i, m_i = _attention_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_ks, stride_vs, offs_m, offs_n,
                                     S, qk_scale, full_end, masked_end, BLOCK_N, True, CAUSAL, OFFSETS_64)
    out = acc / l_i[:, None]
    o_ptrs = (out_ptr + b * stride_ob + h * stride_oh
              + rows[:, None] * stride_os + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=offs_m[:, None] < S)
    # END SOLUTION


LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E)


@functools.cache
def max_shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use on this GPU, the opt-in maximum per block: 227 KiB on an
    H100, 163 KiB on an A100, 99 KiB on an L4, 64 KiB on a T4 (the CUDA C++ Programming Guide's table of
    compute capabilities). A kernel whose tiles and pipeline stages need more does not launch ("out of
    resources: shared memory"). Asked once per device."""
    properties = torch.cuda.get_device_properties(device)
    if hasattr(properties, "shared_memory_per_block_optin"):  # torch >= 2.6 names it
        return properties.shared_memory_per_block_optin
    index = torch.cuda.current_device() if torch.device(device).index is None else torch.device(device).index
    # older torch: Triton's own query, the number its launcher compares a kernel's shared memory with
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def stages_that_fit(stages: int, stage_bytes: int, device: torch.device, held_bytes: int = 0) -> int:
    """The most pipeline stages, up to `stages`, whose tiles (`stage_bytes` each) fit this GPU's shared memory
    beside the `held_bytes` a program keeps all along; 0 when not even one fits."""
    return min(stages, (max_shared_memory(device) - held_bytes) // stage_bytes)


def attention_config(D: int, element_size: int, device: torch.device) -> triton.Config:
    """The launch of `attention`: the tiles tuned on the H100, with fewer pipeline stages or smaller tiles
    where this GPU's shared memory cannot hold them."""
    wide = element_size == 4  # fp32 tiles take twice the shared memory: smaller key tiles, fewer stages
    # On the CPU 32 x 16: tiles as uneven as a GPU's, so that BLOCK_M and BLOCK_N mixed up show
    BLOCK_M, BLOCK_N, stages = size(128, 32), size(32 if wide else 64, 16), 2 if wide else 3
    if not current().interpret:
        # Shared memory holds the (BLOCK_M, D) tile of q and, per pipeline stage, a (BLOCK_N, D) tile of K
        # and one of V: in fp16 at D = 128, 32 KiB + 3 x 32 KiB. An H100 or an A100 holds that, an L4
        # (99 KiB) 2 stages.
        q_tile, kv_stage = BLOCK_M * D * element_size, 2 * BLOCK_N * D * element_size
        stages = stages_that_fit(stages, kv_stage, device, q_tile)
        if stages < 2:  # a T4 (64 KiB): half the queries and half the keys per tile, 2 stages
            BLOCK_M, BLOCK_N, stages = BLOCK_M // 2, BLOCK_N // 2, 2
    return triton.Config(dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N), num_warps=8 if D >= 128 else 4,
                         num_stages=stages)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool,
              BLOCK_M: int | None = None, BLOCK_N: int | None = None, num_warps: int | None = None,
              num_stages: int | None = None) -> None:
    """out = softmax(q @ k^T / sqrt(D) (+ causal mask)) @ v; all (B, H, S, D), any strides."""
    expect_shapes("attention", k=(k, q.shape), v=(v, q.shape), out=(out, q.shape))
    B, H, S, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"head dim {D}: this kernel needs a power of 2 >= 16 (tl.dot's smallest tile)")
    config = attention_config(D, q.element_size(), q.device)
    BLOCK_M = BLOCK_M or config.kwargs["BLOCK_M"]
    BLOCK_N = BLOCK_N or config.kwargs["BLOCK_N"]
    num_stages = num_stages or config.num_stages
    # BEGIN SOLUTION
    assert BLOCK_M % BLOCK_N == 0, "the causal diagonal is walked in whole key tiles"
    qk_scale = LOG2E / math.sqrt(D)
    grid = (triton.cdiv(S, BLOCK_M) * B * H,)
    attention_kernel[grid](q, k, v, out, H, S, qk_scale, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                           CAUSAL=causal, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                           OFFSETS_64=needs_int64(q, k, v, out, dims=(2, 3)),  # b, h are 64-bit already
                           num_warps=num_warps or config.num_warps, num_stages=num_stages)
    # END SOLUTION


# %% [check] 05.attention

# %% [markdown]
# ## References and the KV-cache arithmetic
#
# The PyTorch references the lesson and the benchmarks compare against, and the bytes a KV cache
# holds: for every token, every layer keeps one key and one value vector per K/V head.

# %%
def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    """Safe softmax over dim 1 as eager PyTorch runs it: five kernels, 5 reads and 3 writes of x."""
    m = x.amax(dim=1, keepdim=True)  # amax: read x
    e = torch.exp(x - m)  # sub: read x, write x - m; exp: read it, write e
    return e / e.sum(dim=1, keepdim=True)  # sum: read e; div: read e, write out


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The unfused attention: scores (B, H, S, S) in memory, scaled, softmax, then @ v."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, S, S): written to memory
    if causal:
        S = q.shape[-2]
        future = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, S, D)


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, tokens: int = 1, batch: int = 1,
                   bytes_per_element: int = 2) -> int:
    """Bytes of a KV cache: K and V (2), per layer, per K/V head, head_dim values, per token and sequence."""
    return 2 * batch * tokens * n_layers * n_kv_heads * head_dim * bytes_per_element


# %% [progress] 05
