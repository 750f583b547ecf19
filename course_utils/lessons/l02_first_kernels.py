# %% [markdown]
# # Lesson 02 exercises: first kernels
#
# Three kernels, each checked by `check(...)` on fresh random inputs: lengths that are no multiple
# of any block, size 1, transposed and sliced inputs. In interpreter mode (no GPU) they run on the
# CPU through Triton's interpreter: same code, smaller sizes.
#
# Destination passing: your host function receives its inputs and the output buffer `out`, which
# the checker allocated and filled with poison. Write every element of `out`, and nothing else.
#
# The lesson: [02 · First kernels](../notebooks/02_first_kernels.ipynb).

# %% [setup]

# %%
from course_utils import check, progress  # noqa: F401
from course_utils.shapes import expect_contiguous, expect_shapes  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# %% [markdown]
# ## 02.vector_add: add two vectors
#
# `add(x, y, out)`: `out[i] = x[i] + y[i]` for 1-D tensors of any length `n`. One program handles
# `BLOCK` consecutive elements: offsets `pid * BLOCK + arange(BLOCK)`; the last program runs past `n`,
# so loads and stores need a mask. `tl.program_id` is an int32, and so is `pid * BLOCK`: past 2^31
# elements (8 GiB of fp32, which a GPU of 80 GB holds) it wraps to negative offsets, so make `pid` an
# int64 first (`.to(tl.int64)`). Traffic: read 2n elements, write n; no arithmetic to speak of.
# The lesson section [Programs, blocks and masks](../notebooks/02_first_kernels.ipynb#Programs,-blocks-and-masks)
# teaches the pattern with a worked sibling, a scaled add `out = alpha * x + y`.

# %%
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    # BEGIN SOLUTION
    pid = tl.program_id(axis=0).to(tl.int64)  # 64-bit: past 2^31 elements, pid * BLOCK overflows int32
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) element indices of this program
    mask = offs < n_elements  # the last block is partial
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)  # fp32: read 8 B, write 4 B per element (1 FLOP)
    # END SOLUTION


def add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, BLOCK: int = 1024) -> None:
    """out = x + y, all 1-D and contiguous, any length."""
    expect_shapes("add", y=(y, x.shape), out=(out, x.shape))
    expect_contiguous("add", x=x, y=y, out=out)
    # BEGIN SOLUTION
    n = out.numel()
    grid = (triton.cdiv(n, BLOCK),)  # one program per block of BLOCK elements
    add_kernel[grid](x, y, out, n, BLOCK=BLOCK, num_warps=4)
    # END SOLUTION


# %% [check] 02.vector_add

# %% [markdown]
# ## 02.relu: max of x and 0
#
# `relu(x, out)`: `out = max(x, 0)` for a contiguous tensor of any shape. A contiguous tensor is one
# flat run of `x.numel()` elements in memory, so the 1-D kernel pattern works for every shape.
# Traffic: read n, write n elements; one comparison each, so 1 FLOP per 8 bytes in fp32. Taught in
# [Programs, blocks and masks](../notebooks/02_first_kernels.ipynb#Programs,-blocks-and-masks) (and
# the same ReLU in CUDA: [ReLU in CUDA](../notebooks/02_first_kernels.ipynb#ReLU-in-CUDA)).

# %%
@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    # BEGIN SOLUTION
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,), 64-bit as in add_kernel
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)  # 1 FLOP per 8 B in fp32
    # END SOLUTION


def relu(x: torch.Tensor, out: torch.Tensor, BLOCK: int = 1024) -> None:
    """out = relu(x); x and out contiguous, same shape, any number of dimensions."""
    expect_shapes("relu", out=(out, x.shape))
    expect_contiguous("relu", x=x, out=out)
    # BEGIN SOLUTION
    n = x.numel()
    relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    # END SOLUTION


# %% [check] 02.relu

# %% [markdown]
# ## 02.copy_2d: a strided 2-D copy
#
# `copy_2d(x, out)`: copy a 2-D `x` with **any strides** (a transpose, a slice `t[:, ::2]`) into a
# contiguous `out`. Element `(i, j)` of `x` lives at `x_ptr + i * stride_row + j * stride_col`; pass
# the strides to the kernel instead of assuming `x` is contiguous. A 2-D grid of tiles, one program
# per `BLOCK_M x BLOCK_N` tile, with a mask in both dimensions. Taught in
# [Two dimensions and strides](../notebooks/02_first_kernels.ipynb#Two-dimensions-and-strides), with a
# worked sibling that writes a 2-D tile through any strides.
#
# One limit of the hardware: a GPU grid holds at most 2^31 - 1 programs along axis 0 but only
# `GRID_AXIS_MAX = 65535` along axes 1 and 2. A row of 2^22 elements in tiles of 32 columns would need
# 131072 programs along axis 1, and such a launch fails ("invalid argument"): give a row that long wider
# tiles (and fewer rows per tile, so that a program still holds `BLOCK_M x BLOCK_N` elements).

# %%
GRID_AXIS_MAX = 65535  # the most programs a CUDA grid holds along its axes 1 and 2


@triton.jit
def copy_2d_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om, stride_on,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BEGIN SOLUTION
    # (BLOCK_M,) rows and (BLOCK_N,) columns of this tile, in 64 bits: x may be a view of a tensor of more
    # than 2^31 elements, where a row times stride_xm (or a column times stride_xn) passes int32's 2^31 - 1
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # (BLOCK_M, BLOCK_N)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn, mask=mask)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on, x, mask=mask)
    # END SOLUTION


def copy_2d(x: torch.Tensor, out: torch.Tensor, BLOCK_M: int = 32, BLOCK_N: int = 32) -> None:
    """out[i, j] = x[i, j]; x 2-D with any strides, out contiguous."""
    expect_shapes("copy_2d", out=(out, x.shape))
    # BEGIN SOLUTION
    M, N = x.shape
    while triton.cdiv(N, BLOCK_N) > GRID_AXIS_MAX:  # a very long row: wider tiles, fewer rows each
        BLOCK_M, BLOCK_N = max(1, BLOCK_M // 2), 2 * BLOCK_N
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))  # rows on axis 0, which holds 2^31 - 1
    copy_2d_kernel[grid](x, out, M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                         BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    # END SOLUTION


# %% [check] 02.copy_2d

# %% [progress] 02
