# %% [markdown]
# # Lesson 07 exercises: FP8 quantization, an FP8 matmul, int4 packing
#
# Five exercises, each checked by `check(...)` on fresh inputs:
# - `07.decode_e4m3`: the value of one float8_e4m3fn bit pattern, in plain Python;
# - `07.quantize_rowwise`: a Triton kernel that turns each row into e4m3 plus one fp32 scale;
# - `07.fp8_matmul`: a Triton matmul of two e4m3 matrices with per-row scales;
# - `07.pack_int4` / `07.unpack_int4`: two 4-bit values per byte, with torch bit operations.
#
# On a GPU older than sm_89 (no e4m3 in Triton) and on a CPU, the kernels run in Triton's
# interpreter at small sizes. The interpreter's own float -> fp8 cast rounds some values wrongly (the
# lesson shows how, and counts them); `install_fp8_fix()` gives it an exact one, so a correct kernel
# passes there too.
# At the end, a worked example that is not an exercise: the W8A16 GEMV of the lesson and its benchmark.
# The lesson, [notebooks/07_fp8_quantization.ipynb](../notebooks/07_fp8_quantization.ipynb), teaches each exercise with a worked
# sibling; every exercise below links its section.

# %% [setup] fp8

# %%
from course_utils import check, progress  # noqa: F401
from course_utils.shapes import expect_contiguous, expect_shapes, expect_unit_stride  # noqa: E402
import math  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_utils.lessons.l02_first_kernels import GRID_AXIS_MAX  # noqa: E402
from course_utils.lessons.l03_matmul import grouped_tile, sm_count  # noqa: E402

E4M3_MAX = 448.0  # largest finite float8_e4m3fn: 0 1111 110 = 1.75 * 2^8

# %% [markdown]
# ## 07.decode_e4m3: the value of a byte
#
# `decode_e4m3(bits) -> float`. Taught in the lesson's
# [The formats, bit by bit](../notebooks/07_fp8_quantization.ipynb#The-formats,-bit-by-bit) (the worked example decodes e5m2).
#
# A float8_e4m3fn byte is `S EEEE MMM`: 1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits.
# - exponent field 1..15: a normal number, `(-1)^S * (1 + M/8) * 2^(E - 7)`;
# - exponent field 0: a subnormal, no implicit leading 1: `(-1)^S * (M/8) * 2^-6` (so 0x00 is 0 and
#   0x80 is -0.0);
# - `S 1111 111` is NaN, the only special value: "fn" means *finite*, no infinities. That frees
#   `S 1111 000..110` for numbers, so the largest is `0 1111 110` = 1.75 * 2^8 = 448.
#
# Return a Python float for any `bits` in 0..255, equal to `torch.float8_e4m3fn`'s value (NaN for
# NaN). Do it with arithmetic on the bits: the check rejects torch's own fp8 view and cast.

# %%
def decode_e4m3(bits: int) -> float:
    """The value of the float8_e4m3fn bit pattern `bits` (an int in 0..255)."""
    # BEGIN SOLUTION
    sign = -1.0 if bits & 0x80 else 1.0
    exponent = (bits >> 3) & 0xF  # 4 bits, bias 7
    mantissa = bits & 0x7  # 3 bits
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:  # subnormal: 0.MMM * 2^(1 - 7)
        return sign * (mantissa / 8) * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    # END SOLUTION


# %% [check] 07.decode_e4m3

# %% [markdown]
# ## 07.quantize_rowwise: one scale per row
#
# `quantize_rowwise(x, out, scale_out)`. Taught in the lesson's
# [A quantize kernel](../notebooks/07_fp8_quantization.ipynb#A-quantize-kernel) (the worked example quantizes with one scale per tensor).
#
# Per-row scaled quantization: for each row `i` of `x` (rows, cols), any strides,
# - `amax = max_j |x[i, j]|` (in fp32),
# - `scale_out[i] = amax / 448`, the *dequantization* scale, so that `x[i] ~ out[i] * scale_out[i]`,
# - `out[i, j] = e4m3(clamp(x[i, j] / scale_out[i], -448, 448))`: the row's largest value becomes exactly
#   +-448, the top of e4m3's range, and everything else keeps 3 mantissa bits of relative precision.
#
# An all-zero row has amax 0: `0 / 0` is NaN, so give such a row scale 1 (out is then zeros).
# `out` is a contiguous float8_e4m3fn tensor: `.to(out_ptr.dtype.element_ty)` (that is
# `tl.float8e4nv`) rounds to nearest even. Clamp before the cast: Triton saturates on a GPU, but
# torch 2.11 and older (and other tools, such as ml_dtypes) turn values beyond 464 into NaN.
#
# Traffic for bf16 input: read 2 bytes, write 1 byte per element (+ 4 bytes per row). One program per
# row keeps the row in registers, so x is read once: the target is the copy bandwidth.
#
# The kernel's signature is a suggestion: `ONE_PASS` says that one block of `BLOCK` columns covers the
# whole row (the host decides); a row longer than the largest block you want takes two passes, one for
# amax and one to quantize. Start with `BLOCK = triton.next_power_of_2(cols)`, which is always one pass.

# %%
@triton.jit
def quantize_rowwise_kernel(x_ptr, out_ptr, scale_ptr, n_cols, stride_xr, stride_xc, stride_or,
                            BLOCK: tl.constexpr, ONE_PASS: tl.constexpr, FP8_MAX: tl.constexpr):
    # BEGIN SOLUTION
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xr
    out_row = out_ptr + row * stride_or
    cols = tl.arange(0, BLOCK)  # (BLOCK,)
    if ONE_PASS:  # the whole row fits in one block: read it once, keep it in registers
        mask = cols < n_cols
        x = tl.load(x_row + cols * stride_xc, mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
        # An all-zero row gets scale 1, not 0/0; a subnormal amax (below 1.2e-38) counts as fp32's smallest
        # normal number, whose inverse is still finite
        safe = tl.where(amax > 0, tl.maximum(amax, 1.1754944e-38), FP8_MAX)
        # x / amax first (at most 1), then times 448: 448 / amax overflows fp32 to inf for a row whose amax
        # is below 1.3e-36, and would turn its zeros into NaN and everything else into +-448
        inv = 1.0 / safe
        q = tl.minimum(tl.maximum(x * inv * FP8_MAX, -FP8_MAX), FP8_MAX)
        tl.store(out_row + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # a long row: one pass for amax, a second one (from L2) to quantize
        running = tl.zeros((BLOCK,), dtype=tl.float32)  # elementwise max so far; reduced once at the end
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * stride_xc, mask=mask, other=0.0).to(tl.float32)
            running = tl.maximum(running, tl.abs(x))
        amax = tl.max(running, axis=0)
        safe = tl.where(amax > 0, tl.maximum(amax, 1.1754944e-38), FP8_MAX)
        inv = 1.0 / safe  # not 448 / amax: see above
        for start in range(0, n_cols, BLOCK):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * stride_xc, mask=mask, other=0.0).to(tl.float32)
            q = tl.minimum(tl.maximum(x * inv * FP8_MAX, -FP8_MAX), FP8_MAX)
            tl.store(out_row + start + cols, q.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, safe / FP8_MAX)  # dequantization scale: x ~ out * scale
    # END SOLUTION


def quantize_rowwise(x: torch.Tensor, out: torch.Tensor, scale_out: torch.Tensor,
                     BLOCK: int | None = None, num_warps: int | None = None) -> None:
    """out (rows, cols) e4m3 and scale_out (rows,) fp32 with x ~ out * scale_out[:, None]."""
    expect_shapes("quantize_rowwise", out=(out, x.shape), scale_out=(scale_out, x.shape[:1]))
    expect_unit_stride("quantize_rowwise", out=out)
    expect_contiguous("quantize_rowwise", scale_out=scale_out)
    # BEGIN SOLUTION
    rows, cols = x.shape
    if BLOCK is None:  # the whole row when it fits: 8192 bf16 = 16 KiB of registers per program
        BLOCK = min(triton.next_power_of_2(max(cols, 1)), 16384)  # rows of no elements: scale as all zeros
    if num_warps is None:
        num_warps = max(1, min(16, BLOCK // 1024))
    quantize_rowwise_kernel[(rows,)](
        x, out, scale_out, cols, x.stride(0), x.stride(1), out.stride(0),
        BLOCK=BLOCK, ONE_PASS=BLOCK >= cols, FP8_MAX=E4M3_MAX, num_warps=num_warps)
    # END SOLUTION


# %% [check] 07.quantize_rowwise

# %% [markdown]
# ## 07.fp8_matmul: e4m3 tiles in tl.dot
#
# `fp8_matmul(a, a_scale, b, b_scale, out)`. Taught in the lesson's
# [The FP8 matmul](../notebooks/07_fp8_quantization.ipynb#The-FP8-matmul) (the worked example is the W8A16 GEMV of
# [W8A16, an int8-weight GEMV for decoding](../notebooks/07_fp8_quantization.ipynb#W8A16,-an-int8-weight-GEMV-for-decoding)).
#
# `out = (a * a_scale[:, None]) @ (b * b_scale[:, None]).T` where
# - `a` (M, K) float8_e4m3fn, `a_scale` (M,) fp32: one scale per row of a (per token);
# - `b` (N, K) float8_e4m3fn, `b_scale` (N,) fp32: the weight in `nn.Linear` layout, one scale per
#   output channel. **Any strides**, for `a` and `b` alike: pass `a.stride()` and `b.stride()` to the
#   kernel (the check also hands you an `a` and a `b` that are transposed views);
# - `out` (M, N), any strides: bf16 or fp32 on a GPU, fp32 or fp16 on the CPU (store in `out`'s dtype);
#   any M, N, K >= 1.
#
# The tiled matmul of lesson 03 with three changes. The loop multiplies raw e4m3 tiles with `tl.dot`
# into an fp32 accumulator (an fp8 x fp8 tensor-core instruction on sm_89+, an fp16 upcast in the
# interpreter). The scales are constant along K, so they leave the loop: multiply the finished
# (BLOCK_M, BLOCK_N) accumulator by `a_scale` of its rows and `b_scale` of its columns, once, in the
# epilogue. And b's tile is loaded as (BLOCK_N, BLOCK_K) rows of b (K contiguous in memory) and handed
# to the dot as `tl.trans(b_tile)`: Hopper's fp8 tensor-core instruction reads B only "K-major".
#
# Mask the K tail (K need not be a multiple of BLOCK_K) and the output edges. `tl.dot` of e4m3 tiles
# needs `BLOCK_K >= 32` (Triton's NVIDIA backend refuses a smaller K for 8-bit operands, and one below 16
# for 16-bit ones; the course's interpreter mode applies the same bounds, so the CPU check says it too), and
# BLOCK_M, BLOCK_N >= 16 are safe on every Triton version. Work: 2MNK FLOPs for (M + N) K bytes of input.
#
# In the suggested signature `EVEN_K` says K is a multiple of BLOCK_K (no K mask needed: faster loads),
# and `PROMOTE` asks for `tl.dot(..., max_num_imprecise_acc=BLOCK_K)`, a more accurate accumulation on
# Hopper that the lesson explains; the check passes without it.

# %%
@triton.jit
def fp8_matmul_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, out_ptr, M, N, K,
                      stride_am, stride_ak, stride_bn, stride_bk, stride_om, stride_on,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PROMOTE: tl.constexpr):
    # BEGIN SOLUTION
    # Grouped order (lesson 03): GROUP_M rows of tiles share columns of b while they sit in L2.
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    rows_in = rows % M  # wrapped: loads stay in bounds, the store below is masked
    cols_in = cols % N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows_in[:, None] * stride_am + ks[None, :] * stride_ak  # (BLOCK_M, BLOCK_K)
    b_ptrs = b_ptr + cols_in[:, None] * stride_bn + ks[None, :] * stride_bk  # (BLOCK_N, BLOCK_K), K-major
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=ks[None, :] < k_left, other=0.0)
        if PROMOTE:  # add the tensor cores' partial sums into fp32 every BLOCK_K (see the lesson)
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=BLOCK_K)
        else:
            acc = tl.dot(a, tl.trans(b), acc)  # e4m3 x e4m3 -> fp32
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # Epilogue: the scales, once per output element instead of once per product.
    a_scale = tl.load(a_scale_ptr + rows_in)  # (BLOCK_M,)
    b_scale = tl.load(b_scale_ptr + cols_in)  # (BLOCK_N,)
    acc = acc * a_scale[:, None] * b_scale[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    # END SOLUTION


# Hopper's tile: 128 x 256 outputs, BLOCK_K 128, 8 warps, 4 stages of 48 KiB of shared memory.
FP8_HOPPER_CONFIG = triton.Config(dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128), num_warps=8, num_stages=4)


def fp8_matmul(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
               out: torch.Tensor, BLOCK_M: int | None = None, BLOCK_N: int | None = None,
               BLOCK_K: int | None = None, GROUP_M: int = 8, num_warps: int | None = None,
               num_stages: int | None = None, promote: bool = False) -> None:
    """out (M, N) = (a * a_scale[:, None]) @ (b * b_scale[:, None]).T

    a (M, K) and b (N, K) e4m3 with any strides, a_scale (M,) and b_scale (N,) fp32.
    """
    expect_shapes("fp8_matmul", a_scale=(a_scale, a.shape[:1]), b=(b, (b.shape[0], a.shape[1])),
                  b_scale=(b_scale, b.shape[:1]), out=(out, (a.shape[0], b.shape[0])))
    expect_contiguous("fp8_matmul", a_scale=a_scale, b_scale=b_scale)
    # BEGIN SOLUTION
    M, K = a.shape
    N = b.shape[0]
    if not out.is_cuda:  # the interpreter: small tiles, few programs
        config = triton.Config(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32), num_warps=4, num_stages=1)
    elif torch.cuda.get_device_capability(out.device)[0] in (9, 10):  # Hopper, Blackwell: 228 KiB of smem
        # 128 x 256 tiles, BLOCK_K 128 (128 bytes of e4m3 per row: a full cache line), 4 stages of
        # 48 KiB, 8 warps: the persistent kernel's tile; the benchmark sweeps tiles around it, and its
        # notes name the fastest of each run.
        config = FP8_HOPPER_CONFIG
    else:  # Ada (sm_89) and others: ~100 KiB of shared memory, 3 stages of 16 KiB
        config = triton.Config(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64), num_warps=4, num_stages=3)
    if BLOCK_M is None and not promote and fp8_tma_ready(a, b, out):  # Hopper: persistent, TMA (below)
        fp8_matmul_persistent(a, a_scale, b, b_scale, out, config)
        return
    BLOCK_M = BLOCK_M or config.kwargs["BLOCK_M"]
    BLOCK_N = BLOCK_N or config.kwargs["BLOCK_N"]
    BLOCK_K = BLOCK_K or config.kwargs["BLOCK_K"]
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    fp8_matmul_kernel[grid](
        a, a_scale, b, b_scale, out, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
        EVEN_K=K % BLOCK_K == 0, PROMOTE=promote,
        num_warps=num_warps or config.num_warps, num_stages=num_stages or config.num_stages)
    # END SOLUTION


# %% [markdown]
# ### Optional, Hopper only: a persistent kernel with TMA and a flattened loop
#
# Not needed for the check. At 8192^3 the kernel above is bound by how well loads and tensor-core work
# overlap. Four Hopper techniques close the gap to cuBLAS (Triton's tutorial 09 shows them), those of
# lesson 03's optional kernel:
# - **TMA descriptors**: the SM's Tensor Memory Accelerator fetches each tile, zero-filled past the
#   edges, and the threads compute no addresses;
# - **persistent**: one program per SM, looping over the output tiles `tile = pid, pid + NUM_SMS, ...`,
#   and no launch of 2048 programs;
# - **a flattened loop** (`tl.range(..., flatten=True)`): the compiler merges the loop over tiles and
#   the K loop inside it into one loop and pipelines across it, so the loads of the next tile's first
#   K steps are in flight while this tile's epilogue runs;
# - **the epilogue in two halves**: the output tile goes through shared memory on its way to the TMA
#   store; two `(BLOCK_M, BLOCK_N / 2)` stores need half of that space, which leaves room for a fourth
#   stage of loads (4 x 48 KiB of the 228 KiB).
#
# (Triton's automatic warp specialization, `tl.range(..., warp_specialize=True)`, was measured too: on
# the H200 it was slower than the flattened loop; `results/explore/README.md` has the numbers.)
#
# `fp8_matmul` takes this path on Hopper (triton >= 3.4) when a, b and a 16-bit out are row-major with
# 16-byte aligned rows and no explicit tile or promotion is asked for; the benchmark times both kernels.

# %%
def fp8_tma_ready(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """Does fp8_matmul_persistent_kernel take them: Hopper, triton >= 3.4, rows contiguous, aligned and apart
    (not broadcast from one row, stride 0)?"""
    tensors = (a, b, out)
    return (out.is_cuda and torch.cuda.get_device_capability(out.device)[0] == 9
            and out.element_size() == 2  # a 128 x 256 fp32 output tile would not fit beside the stages
            and hasattr(tl, "make_tensor_descriptor")
            and all(t.stride(1) == 1 and t.stride(0) > 0 and t.stride(0) * t.element_size() % 16 == 0
                    for t in tensors)
            and all(t.data_ptr() % 16 == 0 for t in tensors))


@triton.jit
def fp8_matmul_persistent_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, out_ptr, M, N, K,
                                 stride_am, stride_bn, stride_om,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    # BEGIN SOLUTION
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])  # nn.Linear layout: K contiguous
    out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_om, 1],
                                         block_shape=[BLOCK_M, BLOCK_N // 2])  # half a tile, clipped at M, N
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)  # the grouped order, per tile
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])  # (BLOCK_M, BLOCK_K) e4m3, zeros past the edges
            b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])  # (BLOCK_N, BLOCK_K) e4m3
            acc = tl.dot(a, b.T, acc)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = acc * tl.load(a_scale_ptr + rows % M)[:, None] * tl.load(b_scale_ptr + cols % N)[None, :]
        # (BLOCK_M, BLOCK_N) -> (BLOCK_M, 2, BLOCK_N / 2) -> the left and the right half of the tile
        left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], left.to(out_ptr.dtype.element_ty))
        out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], right.to(out_ptr.dtype.element_ty))
    # END SOLUTION


def fp8_matmul_persistent(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                          out: torch.Tensor, config: triton.Config = FP8_HOPPER_CONFIG, GROUP_M: int = 8) -> None:
    """fp8_matmul on fp8_matmul_persistent_kernel, for operands fp8_tma_ready accepts: a program per SM."""
    M, K = a.shape
    N = b.shape[0]
    block_m, block_n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    # The descriptors are written to a scratch buffer the kernel asks this allocator for.
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=a.device))
    sms = sm_count(a.device)
    grid = (min(sms, triton.cdiv(M, block_m) * triton.cdiv(N, block_n)),)
    fp8_matmul_persistent_kernel[grid](
        a, a_scale, b, b_scale, out, M, N, K, a.stride(0), b.stride(0), out.stride(0),
        **config.kwargs, GROUP_M=GROUP_M, NUM_SMS=sms, num_warps=config.num_warps, num_stages=config.num_stages)


# %% [check] 07.fp8_matmul

# %% [markdown]
# ## 07.pack_int4: two nibbles per byte
#
# `pack_int4(lo, hi) -> Tensor`. Taught in the lesson's
# [int4, two values per byte](../notebooks/07_fp8_quantization.ipynb#int4,-two-values-per-byte) (the worked example packs four 2-bit
# values per byte).
#
# int4 weights take half the bytes of int8: two 4-bit values share a byte. `lo` and `hi` are uint8
# tensors of the same shape holding values 0..15 (nibbles); `pack_int4` returns one uint8 tensor of
# that shape with `lo` in the low nibble (bits 0-3) and `hi` in the high nibble (bits 4-7):
# `byte = lo | (hi << 4)`. `unpack_int4(packed)` returns the tuple `(lo, hi)` as uint8 tensors.
# Plain torch bit operations (`&`, `|`, `<<`, `>>`) on the host: the practice here is the bits.
# Watch the dtype: `>>` on an int8 copies the sign bit in (0xF0 >> 4 is -1, not 15).

# %%
def pack_int4(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """uint8 tensor: lo (values 0..15) in bits 0-3, hi (0..15) in bits 4-7."""
    # BEGIN SOLUTION
    return (lo.to(torch.uint8) & 0xF) | ((hi.to(torch.uint8) & 0xF) << 4)
    # END SOLUTION


# %% [check] 07.pack_int4

# %% [markdown]
# ## 07.unpack_int4: and back
#
# `unpack_int4(packed) -> (lo, hi)`, the inverse of `pack_int4`. Taught in the lesson's
# [int4, two values per byte](../notebooks/07_fp8_quantization.ipynb#int4,-two-values-per-byte).

# %%
def unpack_int4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) uint8 tensors: bits 0-3 and bits 4-7 of each byte of `packed` (uint8)."""
    # BEGIN SOLUTION
    return packed & 0xF, packed >> 4
    # END SOLUTION


# %% [check] 07.unpack_int4

# %% [markdown]
# ## Worked example (not an exercise): W8A16, an int8-weight GEMV for decoding
#
# Generating one token multiplies a single activation row x (1, K) by every weight matrix (N, K):
# 2NK FLOPs for 2NK bytes of bf16 weights, 1 FLOP per byte, far below any GPU's ridge point. The time
# is the time to read the weights. Store them as int8 with one fp32 scale per output channel
# (`w ~ w_int8 * scale[:, None]`) and there are half as many bytes to read; the kernel converts each
# int8 to fp32 in registers and applies the scale once per output. Activations stay 16-bit: "W8A16".
#
# One program computes BLOCK_N outputs: it walks along K, reading a (BLOCK_N, 4 * BLOCK_KW) int8 tile as
# (BLOCK_N, BLOCK_KW) int32 words (four weights per 4-byte load), and adds each product into a
# (BLOCK_N, BLOCK_KW) tile of fp32 running sums; it sums each row of that tile only once, after the
# loop (a sum across threads in every step costs shuffles in every step). The int -> float conversion
# instruction (I2F) runs at a fraction of the rate of a float add (the CUDA C++ Programming Guide's
# table of arithmetic instruction throughputs); with one conversion per weight byte it would be the
# busiest unit of the kernel. So the kernel makes the float
# with integer and float arithmetic instead: a byte b (0..255)
# ORed into the mantissa of 2^23 is the float 2^23 + b exactly; subtracting 2^23 + 128 from it gives
# b - 128. XOR-ing each byte with 0x80 first turns the signed byte v into b = v + 128, so the result is
# v. One XOR per word, then a shift, an AND-OR and a subtract per weight: instructions an SM issues at 64
# (the bit operations) and 128 (the subtract) a clock, four to eight times the conversion's rate.

# %%
def quantize_int8_ref(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (w_int8 (N, K), scale fp32 (N,)), w ~ w_int8 * scale[:, None]."""
    amax = w.float().abs().amax(dim=1)  # (N,)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    w_int8 = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return w_int8, scale


@triton.jit
def w8a16_gemv_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, N, K_WORDS, stride_xm, stride_wn, stride_om,
                      BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.program_id(1)  # one activation row per program row (decode: M = 1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) output columns = weight rows
    n_in = offs_n % N  # rows past N load row n % N again; the store drops them
    offs_kw = tl.arange(0, BLOCK_KW)  # (BLOCK_KW,) int32 words: weights 4i .. 4i + 3 of the row
    acc = tl.zeros((BLOCK_N, BLOCK_KW), dtype=tl.float32)  # a running sum per word slot
    for kw0 in range(0, K_WORDS, BLOCK_KW):
        kw = kw0 + offs_kw
        k_mask = kw < K_WORDS
        words = tl.load(w_ptr + n_in[:, None] * stride_wn + kw[None, :], mask=k_mask[None, :],
                        other=0)  # (BLOCK_N, BLOCK_KW) int32: 4 bytes each, 4 weights
        words = words ^ -0x7F7F7F80  # 0x80808080 as an int32: every byte v becomes v + 128, in 0..255
        for j in tl.static_range(4):  # byte j of each word is weight 4i + j (little-endian)
            b = (words >> (8 * j)) & 0xFF
            w_j = (b | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0  # 2^23 + b - (2^23 + 128) = v
            x_j = tl.load(x_ptr + m * stride_xm + 4 * kw + j, mask=k_mask, other=0.0).to(tl.float32)
            acc += w_j * x_j[None, :]  # (BLOCK_N, BLOCK_KW)
    scale = tl.load(scale_ptr + n_in)
    y = tl.sum(acc, axis=1) * scale  # (BLOCK_N,): one sum across threads, the scale once per output
    tl.store(out_ptr + m * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def w8a16_gemv(x: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
               BLOCK_N: int | None = None, BLOCK_KW: int | None = None, num_warps: int = 4) -> None:
    """out (M, N) = x (M, K) @ (w_int8 (N, K) * scale[:, None]).T; x and out with unit last stride,
    w_int8 contiguous with K a multiple of 4 (it is read as int32 words).

    No num_stages: Triton pipelines only loads that feed a tl.dot (or a tl.range that asks), and these
    do not; the loads of other programs on the SM hide each one's wait (lesson 07 measures both)."""
    expect_shapes("w8a16_gemv", w_int8=(w_int8, (w_int8.shape[0], x.shape[1])),
                  scale=(scale, w_int8.shape[:1]), out=(out, (x.shape[0], w_int8.shape[0])))
    expect_unit_stride("w8a16_gemv", x=x, out=out)
    expect_contiguous("w8a16_gemv", scale=scale)
    M, K = x.shape
    N = w_int8.shape[0]
    if K % 4 or not w_int8.is_contiguous():
        raise ValueError("w8a16_gemv reads w_int8 as int32 words: it needs K % 4 == 0 and contiguous rows")
    words = w_int8.view(torch.int32)  # (N, K // 4)
    # Tiles of 8 KB (16 rows x 512 bytes) while that still leaves ~4 programs per SM, else 8 x 2048 bytes.
    wide = N >= 8192
    BLOCK_N = BLOCK_N or (16 if wide else 8)
    BLOCK_KW = BLOCK_KW or (128 if wide else 512)
    for m0 in range(0, M, GRID_AXIS_MAX):  # axis 1 of a grid holds 65535 programs (lesson 02): rows in turns
        rows = min(M - m0, GRID_AXIS_MAX)
        w8a16_gemv_kernel[(triton.cdiv(N, BLOCK_N), rows)](
            x[m0:], words, scale, out[m0:], N, K // 4, x.stride(0), words.stride(0), out.stride(0),
            BLOCK_N=BLOCK_N, BLOCK_KW=BLOCK_KW, num_warps=num_warps)


# %% [progress] 07
