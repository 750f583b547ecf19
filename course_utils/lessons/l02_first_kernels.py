# %% [markdown]
# # Lesson 02 exercises: first kernels
#
# Three kernels, each checked by `check(...)` on fresh random inputs: lengths that are no multiple
# of any block, size 1, transposed and sliced inputs. In interpreter mode (no GPU) they run on the
# CPU through Triton's interpreter: same code, smaller sizes.
#
# Destination passing: your host function receives its inputs and the output buffer `out`, which
# the checker allocated and filled with poison. Write every element of `out`, and nothing else.

# %% [setup]

# %%
from course_utils import check, progress  # noqa: F401
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# %% [markdown]
# ## 02.vector_add: `add(x, y, out)`
#
# `out[i] = x[i] + y[i]` for 1-D tensors of any length `n`. One program handles `BLOCK` consecutive
# elements: offsets `pid * BLOCK + arange(BLOCK)`; the last program runs past `n`, so loads and
# stores need `mask = offsets < n`. Traffic: read 2n elements, write n; no arithmetic to speak of.

# %%
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    # BEGIN SOLUTION
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) element indices of this program
    mask = offsets < n_elements  # the last block is partial
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)
    # END SOLUTION


def add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, BLOCK: int = 1024) -> None:
    """out = x + y, all 1-D and contiguous, any length."""
    # BEGIN SOLUTION
    n = out.numel()
    grid = (triton.cdiv(n, BLOCK),)  # one program per block of BLOCK elements
    add_kernel[grid](x, y, out, n, BLOCK=BLOCK, num_warps=4)
    # END SOLUTION


# %% [check] 02.vector_add

# %% [markdown]
# ## 02.relu: `relu(x, out)`
#
# `out = max(x, 0)` for a contiguous tensor of any shape. A contiguous tensor is one flat run of
# `x.numel()` elements in memory, so the 1-D kernel pattern works for every shape. Traffic: read n,
# write n elements; one comparison each, so 1 FLOP per 8 bytes in fp32.

# %%
@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    # BEGIN SOLUTION
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=mask)
    # END SOLUTION


def relu(x: torch.Tensor, out: torch.Tensor, BLOCK: int = 1024) -> None:
    """out = relu(x); x and out contiguous, same shape, any number of dimensions."""
    # BEGIN SOLUTION
    n = x.numel()
    relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    # END SOLUTION


# %% [check] 02.relu

# %% [markdown]
# ## 02.copy_2d: `copy_2d(x, out)`
#
# Copy a 2-D `x` with **any strides** (a transpose, a slice `t[:, ::2]`) into a contiguous `out`.
# Element `(i, j)` of `x` lives at `x_ptr + i * stride_row + j * stride_col`; pass the strides to the
# kernel instead of assuming `x` is contiguous. A 2-D grid of tiles, one program per
# `BLOCK_M x BLOCK_N` tile, with a mask in both dimensions.

# %%
@triton.jit
def copy_2d_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om, stride_on,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    mask = (rows[:, None] < M) & (cols[None, :] < N)  # (BLOCK_M, BLOCK_N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, x, mask=mask)
    # END SOLUTION


def copy_2d(x: torch.Tensor, out: torch.Tensor, BLOCK_M: int = 32, BLOCK_N: int = 32) -> None:
    """out[i, j] = x[i, j]; x 2-D with any strides, out contiguous."""
    # BEGIN SOLUTION
    M, N = x.shape
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    copy_2d_kernel[grid](x, out, M, N, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                         BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    # END SOLUTION


# %% [check] 02.copy_2d

# %% [progress] 02
