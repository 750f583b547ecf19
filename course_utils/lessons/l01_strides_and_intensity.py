# %% [markdown]
# # Lesson 01 exercises: strides and arithmetic intensity
#
# Five small functions, no kernels yet. Each is checked by `check(...)` on fresh random inputs.
#
# - `contiguous_strides`: the strides PyTorch gives a fresh tensor of a shape.
# - `transpose_view`, `broadcast_view`: build views by hand with `as_strided`, the way PyTorch
#   builds them: the same storage, a new shape, new strides, maybe a new offset. No element is copied.
# - `matmul_intensity`, `attainable_flops`: the arithmetic of the roofline.
#
# Reminder: element `idx` of a tensor `t` lives at storage element
# `t.storage_offset() + sum(idx[d] * t.stride()[d] for d in range(t.dim()))`; strides count elements.
#
# The lesson: [01 · Strides, views, and arithmetic intensity](../notebooks/01_strides_and_intensity.ipynb).

# %% [setup]

# %%
from course_utils import check, progress  # noqa: F401
import torch  # noqa: E402

# %% [markdown]
# ## 01.contiguous_strides: row-major strides
#
# `contiguous_strides(shape) -> tuple[int, ...]`. Taught in
# [Strides from a shape](../notebooks/01_strides_and_intensity.ipynb#Strides-from-a-shape), next to a worked sibling for column-major order.
# The element strides of a contiguous (row-major, "C order") tensor of `shape`: the last dimension
# moves fastest, with stride 1, and the stride of each dimension is the number of elements one step
# in it skips over, the product of all the sizes after it. For example `(4, 3, 5) -> (15, 5, 1)`.
# Compute them from the shape alone: creating a tensor and asking for its `stride()` is not allowed.

# %%
def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements, of a contiguous tensor of `shape` (sizes >= 1)."""
    # BEGIN SOLUTION
    strides = []
    step = 1
    for size in reversed(shape):  # from the last (fastest) dimension to the first
        strides.append(step)
        step *= size
    return tuple(reversed(strides))
    # END SOLUTION


# %% [check] 01.contiguous_strides

# %% [markdown]
# ## 01.transpose_view: a transpose by hand
#
# `transpose_view(t, dim0, dim1) -> Tensor`. Taught in
# [Views built by hand with as_strided](../notebooks/01_strides_and_intensity.ipynb#Views-built-by-hand-with-as_strided) (worked siblings: a
# diagonal view and sliding windows) and [Views and copies](../notebooks/01_strides_and_intensity.ipynb#2.-Views-and-copies).
# The same tensor as `t.transpose(dim0, dim1)`, built with `t.as_strided(size, stride, storage_offset)`.
# A transpose moves no data: it swaps two entries of the shape and the same two entries of the strides.
# `t` may already be a view (sliced, with an offset, non-contiguous); dims may be negative (-1 is the
# last). Not allowed: `transpose`, `t()`, `.T`, `.mT`, `permute`, `movedim`, `swapaxes` and copies, nor
# NumPy's versions (`np.swapaxes`, `np.einsum`, an ndarray's `.T`): `t` may have more dimensions than a
# NumPy array can (64).

# %%
def transpose_view(t: torch.Tensor, dim0: int, dim1: int) -> torch.Tensor:
    """t with dimensions dim0 and dim1 swapped, as a view of t's storage."""
    # BEGIN SOLUTION
    if t.dim() == 0:  # a scalar: torch's transpose(0, 0) or (-1, 0) gives it back as it is
        return t.as_strided((), (), t.storage_offset())
    dim0, dim1 = dim0 % t.dim(), dim1 % t.dim()  # negative dims count from the end
    size, stride = list(t.shape), list(t.stride())
    size[dim0], size[dim1] = size[dim1], size[dim0]
    stride[dim0], stride[dim1] = stride[dim1], stride[dim0]
    return t.as_strided(size, stride, t.storage_offset())
    # END SOLUTION


# %% [check] 01.transpose_view

# %% [markdown]
# ## 01.broadcast_view: a broadcast by hand
#
# `broadcast_view(t, shape) -> Tensor`. Taught in
# [Views built by hand with as_strided](../notebooks/01_strides_and_intensity.ipynb#Views-built-by-hand-with-as_strided) and
# [Views and copies](../notebooks/01_strides_and_intensity.ipynb#2.-Views-and-copies) (broadcasting and stride 0).
# The same tensor as `t.expand(shape)`: `t` seen with the larger `shape`, by broadcasting rules.
# Align the dimensions of `t` with the *last* dimensions of `shape`; a dimension of size 1 in `t`
# may grow to any size, and `shape` may add new leading dimensions. A broadcast dimension repeats
# the same elements, so its stride is 0: stepping along it does not move in memory.
# `shape` holds no -1. Build it with `as_strided`; `expand`, `expand_as`, `broadcast_to` (PyTorch's or
# NumPy's) and copies are not allowed. When `t` cannot be broadcast to `shape` (a dimension of `t` other
# than 1 that differs from its place in `shape`, or `shape` with fewer dimensions than `t`), raise
# `ValueError` with a message saying why, as `expand` refuses it.

# %%
def broadcast_view(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """t broadcast to `shape` (like t.expand(shape)), as a view with stride 0 on broadcast dims."""
    # BEGIN SOLUTION
    new = len(shape) - t.dim()  # leading dimensions that t does not have
    if new < 0:
        raise ValueError(f"cannot broadcast {tuple(t.shape)} to fewer dimensions {tuple(shape)}")
    stride = [0] * new  # new leading dims: stride 0
    for size, old_size, old_stride in zip(shape[new:], t.shape, t.stride()):
        if old_size == size:
            stride.append(old_stride)
        elif old_size == 1:
            stride.append(0)  # a size-1 dim repeated `size` times
        else:
            raise ValueError(f"cannot broadcast {tuple(t.shape)} to {tuple(shape)}")
    return t.as_strided(tuple(shape), stride, t.storage_offset())
    # END SOLUTION


# %% [check] 01.broadcast_view

# %% [markdown]
# ## 01.matmul_intensity: FLOPs per byte of a matmul
#
# `matmul_intensity(M, N, K, bytes_per_element) -> float`. Taught in
# [FLOPs versus bytes](../notebooks/01_strides_and_intensity.ipynb#4.-FLOPs-versus-bytes:-arithmetic-intensity) (worked sibling: a
# matrix-vector product).
# Arithmetic intensity (FLOP per byte) of `C = A @ B` with A (M, K), B (K, N), C (M, N), all of one
# dtype of `bytes_per_element` bytes, when every matrix crosses DRAM exactly once: A and B read,
# C written. Each of the M x N outputs is a dot product of length K: K multiplies and K adds.

# %%
def matmul_intensity(M: int, N: int, K: int, bytes_per_element: int) -> float:
    """FLOPs of (M, K) @ (K, N) divided by the bytes of reading A, B and writing C once."""
    # BEGIN SOLUTION
    flops = 2 * M * N * K  # a multiply and an add per (m, n, k)
    n_bytes = (M * K + K * N + M * N) * bytes_per_element  # read A and B, write C
    return flops / n_bytes
    # END SOLUTION


# %% [check] 01.matmul_intensity

# %% [markdown]
# ## 01.attainable_flops: the roofline
#
# `attainable_flops(intensity, peak_flops, peak_bytes_per_s) -> float`. Taught in
# [FLOPs versus bytes](../notebooks/01_strides_and_intensity.ipynb#4.-FLOPs-versus-bytes:-arithmetic-intensity) (worked sibling: the floor
# time) and [The roofline](../notebooks/01_strides_and_intensity.ipynb#5.-The-roofline,-measured-on-your-device).
# The roofline: the most FLOP/s an operation of `intensity` FLOP/byte can reach on a device that
# computes at most `peak_flops` FLOP/s and moves at most `peak_bytes_per_s` bytes/s.

# %%
def attainable_flops(intensity: float, peak_flops: float, peak_bytes_per_s: float) -> float:
    """The roofline at `intensity`: limited by compute or by memory traffic, whichever is lower."""
    # BEGIN SOLUTION
    memory_roof = intensity * peak_bytes_per_s  # FLOP/byte x byte/s = FLOP/s
    return min(peak_flops, memory_roof)
    # END SOLUTION


# %% [check] 01.attainable_flops

# %% [progress] 01
