# %% [markdown]
# # 02 · First kernels: program ids, blocks, masks, and GB/s against the copy ceiling
#
# **What you will learn**: how a Triton kernel splits work into programs, how a program addresses a
# block of elements, why the last block needs a mask, how the launch grid is computed, how a 2-D
# kernel walks a tensor through its strides, and how to tell whether a memory-bound kernel is any
# good: compare its bandwidth with a plain copy's.
#
# The lesson works through two kernels in full, a scaled add and a 2-D fill; the exercises
# ([exercises/02_first_kernels.ipynb](../exercises/02_first_kernels.ipynb)) ask you for their
# siblings: a vector add, a ReLU and a strided 2-D copy.

# %%
from course_utils import setup

mode = setup()

# %%
import torch
import triton
import triton.language as tl

from course_utils import benches, roofline, size
from course_utils.bench import can_time, load_results, plot, show_results

# %% [markdown]
# ## Napkin maths first
#
# A vector add `out = x + y` of n fp32 elements reads 2n x 4 bytes, writes n x 4 bytes and does n
# additions: 1 FLOP per 12 bytes. No GPU does arithmetic that slowly, so the time is all memory
# traffic, and the floor is `12 n / bandwidth`. Which bandwidth? The datasheet's peak, or what a
# plain copy actually reaches on the GPU (measured by lesson 01's bench). The question for every
# memory-bound kernel is: how close to a plain copy's bandwidth does it get?

# %%
n = size(gpu=1 << 28, cpu=5000)
bytes_moved = 3 * n * 4  # read x, read y, write out: fp32
print(f"vector add of n = {n:,} fp32 elements moves {bytes_moved / 1e9:.4g} GB")
for sheet in roofline.DATASHEETS.values():
    print(f"  {sheet.device:<14} datasheet {sheet.copy_gbps:5.0f} GB/s -> floor {bytes_moved / sheet.bandwidth * 1e3:.4f} ms")
measured = roofline.reference_ceilings()  # the committed copy measurement of lesson 01
print(f"  {measured.device:<14} measured copy {measured.copy_gbps:5.0f} GB/s -> floor "
      f"{bytes_moved / measured.bandwidth * 1e3:.4f} ms")

# %% [markdown]
# ## The PyTorch reference
#
# The lesson's worked kernel is a *scaled add*, `out = alpha * x + y` (BLAS calls it axpy): two
# inputs, one output, one element at a time. Its reference in PyTorch:

# %%
def axpy_ref(alpha: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return alpha * x + y


# %% [markdown]
# ## Programs, blocks and masks
#
# A launch `axpy_kernel[grid](...)` starts `grid` independent **programs**. Program `pid` handles
# elements `pid * BLOCK ... pid * BLOCK + BLOCK - 1`: `tl.arange(0, BLOCK)` is a vector of offsets,
# and `x_ptr + offs` a vector of addresses, loaded in one `tl.load`. With n = 5000 and BLOCK = 1024
# the grid is `cdiv(5000, 1024) = 5` programs, and the last one covers elements 4096..5119, of which
# only 4096..4999 exist: `mask = offs < n` switches the others off for the loads and the store.
# `BLOCK` is a `tl.constexpr`: a compile-time constant (Triton compiles one kernel per value), passed
# by keyword at the launch.

# %%
@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)  # which block of BLOCK elements is this program's
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) the indices of its elements
    mask = offs < n  # False past the end: only the last block has such lanes
    x = tl.load(x_ptr + offs, mask=mask)  # a masked lane loads nothing
    y = tl.load(y_ptr + offs, mask=mask)  # fp32: 8 B read per element...
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)  # ...4 B written, 2 FLOPs


def axpy(alpha: float, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, BLOCK: int = 1024) -> None:
    """out = alpha * x + y; all 1-D, contiguous, of one length."""
    n_elements = out.numel()
    grid = (triton.cdiv(n_elements, BLOCK),)  # enough programs to cover n; the last may be partial
    axpy_kernel[grid](x, y, out, n_elements, alpha, BLOCK=BLOCK)


x = torch.randn(n, device=mode.device)
y = torch.randn(n, device=mode.device)
out = torch.empty_like(x)
axpy(2.0, x, y, out)
torch.testing.assert_close(out, axpy_ref(2.0, x, y))
print(f"axpy of {n:,} elements: {triton.cdiv(n, 1024)} programs of 1024, the last one covering "
      f"{n - (triton.cdiv(n, 1024) - 1) * 1024} real elements; matches axpy_ref")

# %% [markdown]
# A contiguous tensor of any shape is one flat run of `numel()` elements, so this 1-D pattern also
# covers a `(rows, cols)` or `(B, H, S)` tensor, as long as it is contiguous.
#
# **Your turn.** [02.vector_add](../exercises/02_first_kernels.ipynb#02.vector_add:-add-two-vectors)
# is this kernel without the scale, and [02.relu](../exercises/02_first_kernels.ipynb#02.relu:-max-of-x-and-0)
# has one input and computes `tl.maximum(x, 0.0)`; both must work for any length (the checks try 1
# and lengths that are no multiple of any block). Lesson 00 showed what the check says when the mask
# is missing.

# %% [markdown]
# ## Two dimensions and strides
#
# A 2-D kernel launches a 2-D grid of tiles: program `(pid_m, pid_n)` owns rows
# `offs_m = pid_m * BLOCK_M + arange(BLOCK_M)` and columns `offs_n = pid_n * BLOCK_N + arange(BLOCK_N)`.
# `offs_m[:, None]` and `offs_n[None, :]` broadcast to a `(BLOCK_M, BLOCK_N)` tile of indices, and the
# mask needs both edges. Element `(i, j)` of a tensor lives at `base + i * stride(0) + j * stride(1)`
# (lesson 01): pass the strides, and the kernel works for a transpose or a slice, because it never
# assumes a layout.
#
# The worked sibling *writes* a 2-D tensor through its strides: `arange_2d(out)` sets
# `out[i, j] = i * N + j`, the row-major index, whatever the layout of `out`.

# %%
def arange_2d_ref(M: int, N: int) -> torch.Tensor:
    return torch.arange(M * N, dtype=torch.float32).reshape(M, N)


@triton.jit
def arange_2d_kernel(out_ptr, M, N, stride_om, stride_on, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) this program's rows
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) its columns
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # (BLOCK_M, BLOCK_N): bottom and right edges
    value = offs_m[:, None] * N + offs_n[None, :]  # (BLOCK_M, BLOCK_N) int32: i * N + j
    ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on  # any layout of out
    tl.store(ptrs, value.to(out_ptr.dtype.element_ty), mask=mask)  # write M x N elements once


def arange_2d(out: torch.Tensor, BLOCK_M: int = 32, BLOCK_N: int = 32) -> None:
    """out[i, j] = i * N + j for a 2-D out with any strides."""
    M, N = out.shape
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))  # one program per tile, both edges partial
    arange_2d_kernel[grid](out, M, N, out.stride(0), out.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)


# %% [markdown]
# Three layouts of `out`, one kernel: a fresh tensor, a transposed view (column-major: strides `(1, M)`)
# and every other column of a wider tensor (strides `(2N, 2)`). Writing through a view writes into its
# base tensor, so the transposed base ends up holding the transpose, and the skipped columns of the
# wide one stay untouched (NaN).

# %%
M, N = size(gpu=(1823, 781), cpu=(45, 70))  # no multiple of any block size, on purpose
expected = arange_2d_ref(M, N).to(mode.device)
fresh = torch.full((M, N), float("nan"), device=mode.device)
transposed = torch.full((N, M), float("nan"), device=mode.device).t()  # (M, N), strides (1, M)
wide = torch.full((M, 2 * N), float("nan"), device=mode.device)
every_other = wide[:, ::2]  # (M, N), strides (2N, 2)
for name, view in (("fresh", fresh), ("transposed view", transposed), ("every other column", every_other)):
    arange_2d(view)
    torch.testing.assert_close(view, expected)
    print(f"{name:<20} strides {str(view.stride()):<11} right")
print("the skipped columns of `wide` are untouched:", bool(wide[:, 1::2].isnan().all()))

# %% [markdown]
# **Your turn.** [02.copy_2d](../exercises/02_first_kernels.ipynb#02.copy_2d:-a-strided-2-D-copy) is
# the same tile with a load: read `x` through *its* strides and store into `out`. The checks pass
# transposed and sliced inputs, and odd sizes (1823 x 781 on a GPU).

# %% [markdown]
# ## ReLU in CUDA
#
# For comparison, a ReLU written in CUDA C++. A CUDA kernel is written for **one thread**; Triton's
# for one **program** (a block of threads working on vectors). In CUDA you compute the global index
# by hand, bounds-check each thread, and choose the thread-block size at launch:
#
# ```cuda
# __global__ void relu_kernel(const float* x, float* out, int n) {
#     int i = blockIdx.x * blockDim.x + threadIdx.x;   // one element per thread
#     if (i < n) out[i] = fmaxf(x[i], 0.0f);           // the mask, one thread at a time
# }
# // launch: relu_kernel<<<(n + 255) / 256, 256>>>(x, out, n);
# ```
#
# An elementwise kernel reuses nothing: each element goes from HBM to a register and back once, so
# neither the CUDA nor the Triton version stages anything through shared memory. What Triton does do
# for you here is vectorize: where it can prove that a block's addresses are contiguous and aligned,
# each thread moves several neighbouring elements with one wide (up to 16-byte) load or store.
# Shared memory matters once threads reuse each other's loads, as the tiles of lesson 03's matmul
# do: there CUDA makes you declare `__shared__` buffers and call `__syncthreads()`, while Triton's
# compiler stages the operands of `tl.dot` through shared memory from the block shapes you choose.

# %% [markdown]
# ## How fast? GB/s against the copy ceiling
#
# A copy `out.copy_(x)` reads and writes every byte once and does nothing else: the simplest
# memory-bound kernel there is, and so the yardstick of what HBM delivers on this GPU. A good
# memory-bound kernel comes close to it; in the committed runs our add even passes it a little
# ({{ratio:vector add fp32 2^28|triton (ours)|copy ceiling (x -> out)}} the copy's GB/s on the H200,
# {{ratio@h100:vector add fp32 2^28|triton (ours)|copy ceiling (x -> out)}} on the H100): the plot section
# measures why. So we report our kernels in GB/s next to the copy. From here on
# the lesson uses the exercises' kernels, imported from `course_utils.lessons.l02_first_kernels`
# (their solution is in `solutions/02_first_kernels.ipynb`: write yours first). The benchmark is
# `course_utils/benches/l02_first_kernels.py`, also `python -m course_utils bench 02`.

# %%
if can_time():
    table = benches.run("02", write=False)
    plot(table.rows, f"lesson 02 on {torch.cuda.get_device_name()}")
else:
    show_results("02")

# %% [markdown]
# ## What the plot shows
#
# Measured on {{measured}}. The vector add moves 3 bytes for every 2 the copy moves, so compare the
# **GB/s** bars, not the times. Our add moved {{gbps:vector add fp32 2^28|triton (ours)}} against
# the copy's {{gbps:vector add fp32 2^28|copy ceiling (x -> out)}}, that is
# {{ratio:vector add fp32 2^28|triton (ours)|copy ceiling (x -> out)}} the copy's rate (on the H100,
# {{ratio@h100:vector add fp32 2^28|triton (ours)|copy ceiling (x -> out)}}). Why can an add pass the
# copy's GB/s? The benchmark also times the two halves of a copy alone, over the same 1 GiB: a kernel
# that only reads x (each program writes back one sum of its block) moved
# {{gbps:vector add fp32 2^28|read only (x -> one sum per block)}}, and `out.fill_(1.0)`, which only
# writes, {{gbps:vector add fp32 2^28|write only (out.fill_)}} (H100:
# {{gbps@h100:vector add fp32 2^28|read only (x -> one sum per block)}} and
# {{gbps@h100:vector add fp32 2^28|write only (out.fill_)}}). Either stream alone beats the copy, which
# mixes them half and half; the add, two thirds reads, sits between. That fits DRAM's timing rules
# (JEDEC's HBM standards set minimum delays when the bus turns from writing to reading, tWTR, and back):
# a mix with fewer turns per byte loses less time to them. The benchmark shows the order, not the cause. The copy is the yardstick of one traffic mix,
# not a hard ceiling. PyTorch lands on
# the same bar
# (`torch.add` {{gbps:vector add fp32 2^28|torch x + y}}; against the fastest PyTorch version,
# `{{peer:vector add fp32 2^28|triton (ours)}}`, ours runs at
# {{ratio:vector add fp32 2^28|triton (ours)|fastest}} its speed): at 1 GiB per tensor all of them are
# limited by HBM alone, and the block size barely matters once each program moves a few KB
# ({{gbps:vector add fp32 2^28|triton (ours) BLOCK=4096}} with BLOCK=4096, against
# {{gbps:vector add fp32 2^28|triton (ours) BLOCK=1024}} with 1024). ReLU, with the copy's exact
# traffic, runs at {{ratio:relu fp32 2^28|triton (ours)|copy ceiling (x -> out)}} the copy's rate.
#
# The targets: a kernel like these must reach at least 0.92 x the copy's GB/s. The copy is the
# simplest memory-bound kernel there is, the measure of what HBM delivers on this GPU, and a
# memory-bound kernel has no other cost to hide behind: one far below the copy is wasting the one
# resource that decides its time. The committed run:

# %%
for target in (load_results("02") or {}).get("targets", []):
    ratio = "not measured" if target.get("ratio") is None else f"{target['ratio']:.2f} x"
    print(f"{target['group']}: {target['ours']} at {ratio} {target['peer']} ({target['metric']}), "
          f"target {target['minimum']}")

# %% [markdown]
# ## Exercises
#
# Open [exercises/02_first_kernels.ipynb](../exercises/02_first_kernels.ipynb) and write the three
# kernels yourself: [02.vector_add](../exercises/02_first_kernels.ipynb#02.vector_add:-add-two-vectors),
# [02.relu](../exercises/02_first_kernels.ipynb#02.relu:-max-of-x-and-0) and
# [02.copy_2d](../exercises/02_first_kernels.ipynb#02.copy_2d:-a-strided-2-D-copy).
