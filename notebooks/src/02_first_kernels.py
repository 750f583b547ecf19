# %% [markdown]
# # 02 · First kernels: program ids, blocks, masks, and GB/s against the copy ceiling
#
# **What you will learn**: how a Triton kernel splits work into programs, how a program addresses a
# block of elements, why the last block needs a mask, how the launch grid is computed, and how to tell
# whether a memory-bound kernel is any good: compare its bandwidth with a plain copy's.

# %%
from course_utils import setup

mode = setup()

# %%
import inspect

import torch
import triton

from course_utils import check, size
from course_utils import benches
from course_utils.bench import can_time, plot, show_results
from course_utils.lessons.l02_first_kernels import add, add_kernel, copy_2d_kernel

# %% [markdown]
# ## Napkin maths first
#
# A vector add `out = x + y` of n fp32 elements reads 2n x 4 bytes and writes n x 4 bytes and does n
# additions: 1 FLOP per 12 bytes. No GPU does arithmetic that slowly, so the time is all memory
# traffic: the floor is `12 n / bandwidth`. On an H100 (about 3 TB/s measured for a copy) a 2^28
# vector moves 3.2 GB, so about 1.07 ms is the best possible. The question for every memory-bound
# kernel is: how close to a plain copy's bandwidth does it get?

# %%
n = size(gpu=1 << 28, cpu=5000)
bytes_moved = 3 * n * 4  # read x, read y, write out
for name, tb_per_s in [("A100 (1.9 TB/s)", 1.9), ("H100 (3.0 TB/s copy)", 3.0), ("H200 (4.2 TB/s copy)", 4.2)]:
    print(f"{name:<22} floor for n = {n:,}: {bytes_moved / (tb_per_s * 1e12) * 1e3:.4f} ms")

# %% [markdown]
# ## The PyTorch reference

# %%
def add_ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


# %% [markdown]
# ## The kernel, line by line
#
# A launch `add_kernel[grid](...)` starts `grid` independent **programs**. Program `pid` handles
# elements `pid * BLOCK ... pid * BLOCK + BLOCK - 1`: `tl.arange(0, BLOCK)` is a vector of offsets, and
# `x_ptr + offsets` a vector of addresses, loaded in one `tl.load`. With n = 5000 and BLOCK = 1024 the
# grid is `cdiv(5000, 1024) = 5` programs, and the last one covers elements 4096..5119, of which only
# 4096..4999 exist: `mask = offsets < n` switches the others off for both loads and the store.

# %%
print(inspect.getsource(add_kernel.fn))
print(inspect.getsource(add))

# %%
x = torch.randn(n, device=mode.device)
y = torch.randn(n, device=mode.device)
out = torch.empty_like(x)
add(x, y, out)
torch.testing.assert_close(out, add_ref(x, y))
print("grid:", triton.cdiv(n, 1024), "programs of 1024 elements for", n, "elements")

# %% [markdown]
# The same function passes the exercise's check (sizes 1 and 1823, fp32 and fp16):

# %%
check("02.vector_add", add)

# %% [markdown]
# ## Two dimensions and strides
#
# A 2-D kernel launches a 2-D grid of tiles. Element `(i, j)` of a tensor lives at
# `base + i * stride(0) + j * stride(1)`: pass the strides and the same kernel copies a transpose or a
# slice correctly, because it never assumes a layout.

# %%
print(inspect.getsource(copy_2d_kernel.fn))

# %% [markdown]
# ## The same ReLU in CUDA
#
# For comparison, the ReLU of the exercise written in CUDA C++. A CUDA kernel is written for **one
# thread**; Triton's for one **program** (a block of threads working on vectors). In CUDA you compute
# the global index by hand, bounds-check each thread, and choose the thread-block size at launch:
#
# ```cuda
# __global__ void relu_kernel(const float* x, float* out, int n) {
#     int i = blockIdx.x * blockDim.x + threadIdx.x;   // one element per thread
#     if (i < n) out[i] = fmaxf(x[i], 0.0f);           // the mask, one thread at a time
# }
# // launch: relu_kernel<<<(n + 255) / 256, 256>>>(x, out, n);
# ```
#
# A tiled CUDA kernel would also stage data through `__shared__` memory and call `__syncthreads()`;
# Triton does that staging (and vectorized 16-byte loads) for you, from the block shapes you choose.

# %% [markdown]
# ## How fast? GB/s against the copy ceiling
#
# A copy `out.copy_(x)` reads and writes every byte once and does nothing else: no useful
# memory-bound kernel moves bytes faster. So we report our kernels in GB/s next to it.

# %%
if can_time():  # the lesson's benchmark: course_utils/benches/l02.py, also `python -m course_utils bench 02`
    table = benches.run("02", write=False)
    plot(table.rows, f"lesson 02 on {torch.cuda.get_device_name()}")
else:
    show_results("02")

# %% [markdown]
# ## What the plot shows
#
# The vector add moves 3 bytes for every 2 the copy moves, so compare the **GB/s** bars, not times.
# On the H200 of the committed run, our add moved bytes slightly *faster* than the copy: a copy is
# half writes, the add only a third, and reads are the cheaper half of HBM traffic. `torch.add` lands
# on the same bar: at 1 GiB per tensor both are limited by HBM alone, and the block size barely
# matters once each program moves a few KB (BLOCK=4096 was about 1% slower than 1024). ReLU, with the
# copy's exact traffic, matches the copy. The ratios the design asks for, from the results file:

# %%
from course_utils.bench import load_results  # noqa: E402

for target in (load_results("02") or {}).get("targets", []):
    print(f"{target['group']}: {target['ours']} at {target['ratio']:.2f} x {target['peer']} ({target['metric']}), "
          f"needs {target['minimum']}")

# %% [markdown]
# Now open `exercises/02_first_kernels.ipynb` and write the three kernels yourself.
