# %% [markdown]
# # Lesson 01: strides, views, and arithmetic intensity
#
# Before writing kernels, two questions every kernel author asks about every tensor and every operation:
#
# 1. **Where is each element in memory?** A tensor is a pointer to memory plus a *shape*, *strides*
#    and an *offset*. Many operations (transpose, slicing, broadcasting, most reshapes) only change
#    those numbers and copy nothing. A Triton kernel receives the pointer and must use the strides itself.
# 2. **Is this operation limited by memory traffic or by arithmetic?** Count the FLOPs and the bytes;
#    their ratio, the *arithmetic intensity*, placed on the *roofline* of your device, says how fast
#    the operation can possibly run, and so what a kernel should aim for.
#
# What you will learn:
# - `data_ptr()`, `stride()`, `storage_offset()`: views versus copies, and when `reshape` cannot be a view;
# - the GPU memory hierarchy and its latencies, and why bandwidth, not latency, sets the speed of big tensors;
# - FLOPs versus bytes: arithmetic intensity of ReLU (fp32: 1/8 FLOP per byte, int8: 1/2), of a
#   vector add, a softmax, and of a matmul as its size grows;
# - the roofline, drawn with ceilings **measured on your device** (copy bandwidth, matmul rate), with
#   real operations placed on it, so you can see which ones are memory-bound.
#
# The exercises of this lesson are in [exercises/01_strides_and_intensity.ipynb](../exercises/01_strides_and_intensity.ipynb);
# each section below ends with a link to the exercise it prepares.

# %%
from course_utils import setup

mode = setup()

import torch  # noqa: E402

from course_utils import roofline  # noqa: E402
from course_utils.bench import Table, show_results  # noqa: E402
from course_utils.checks.l01_strides_and_intensity import quiz  # noqa: E402

# %% [markdown]
# ## 1. A tensor is a pointer, a shape, strides and an offset
#
# The elements of a tensor live in a *storage*: one flat run of memory. The tensor itself is a view
# of that storage described by four things:
#
# | | meaning | here |
# |---|---|---|
# | pointer | where the storage starts in memory | `t.untyped_storage().data_ptr()` |
# | offset | index (in elements) of the tensor's first element in the storage | `t.storage_offset()` |
# | shape | size of each dimension | `t.shape` |
# | strides | how many elements to skip to move one step along each dimension | `t.stride()` |
#
# Element `t[i, j]` is storage element `offset + i * stride[0] + j * stride[1]`, at byte address
# `t.data_ptr() + (i * stride[0] + j * stride[1]) * t.element_size()` (`t.data_ptr()` already
# includes the offset). A fresh tensor is *contiguous*, row-major: the last dimension has stride 1,
# each earlier stride is the product of the sizes after it.

# %%
def layout(name: str, x: torch.Tensor, base: torch.Tensor) -> None:
    """One line: shape, strides, offset, where x starts relative to base's storage, view or copy."""
    start = base.untyped_storage().data_ptr()
    shared = x.untyped_storage().data_ptr() == start
    where = f"storage+{x.data_ptr() - start} B" if shared else "new storage"
    print(f"{name:<26} shape={str(tuple(x.shape)):<13} stride={str(x.stride()):<11} "
          f"offset={x.storage_offset():<3} data_ptr={where:<15} "
          f"{'VIEW' if shared else 'COPY'}{', contiguous' if x.is_contiguous() else ''}")


t = torch.arange(24, dtype=torch.float32).reshape(4, 6)  # (4, 6): elements 0..23 in a row
print(t)
print(f"t.data_ptr() = {t.data_ptr():#x}, element size {t.element_size()} bytes")
layout("t", t, t)

# %% [markdown]
# The formula, checked: read element `(2, 3)` straight from the flat storage.

# %%
storage = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)  # all of it, 1-D
i, j = 2, 3
flat_index = t.storage_offset() + i * t.stride(0) + j * t.stride(1)
print(f"t[{i}, {j}] = {t[i, j].item()}, storage[{flat_index}] = {storage[flat_index].item()}")

# %% [markdown]
# ### Strides from a shape
#
# Row-major ("C order") is PyTorch's default, but not the only order. Fortran, MATLAB and cuBLAS
# store matrices **column-major**: the *first* dimension moves fastest. Its strides come from the
# shape alone: walk the dimensions from the fastest one, and each stride is the product of the sizes
# walked so far. The worked sibling, in full, checked against a column-major tensor PyTorch builds
# (the reverse-shaped contiguous tensor with its dimensions reversed):

# %%
def column_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a column-major (Fortran order) tensor of `shape`: the first dim moves fastest."""
    strides = []
    step = 1  # the fastest dimension moves one element at a time
    for size in shape:  # first dimension first
        strides.append(step)
        step *= size  # one step further skips everything walked so far
    return tuple(strides)


for shape in [(4, 6), (2, 3, 4), (5,), (3, 1, 7)]:
    fortran = torch.empty(shape[::-1]).permute(*reversed(range(len(shape))))  # shape `shape`, column-major
    assert column_major_strides(shape) == fortran.stride()
    print(f"{str(shape):<10} column-major strides {column_major_strides(shape)}")

# %% [markdown]
# **Your turn**: [01.contiguous_strides](../exercises/01_strides_and_intensity.ipynb#01.contiguous_strides:-row-major-strides)
# asks for PyTorch's own order, row-major, where the *last* dimension moves fastest.

# %% [markdown]
# ## 2. Views and copies
#
# A **view** is a new (offset, shape, strides) over the *same* storage: creating it costs nothing and
# writing through it changes the original. A **copy** allocates new storage and moves every element:
# time and memory traffic. For each operation below: is the result a view (same storage) or a copy?

# %%
layout("t.T (transpose)", t.T, t)  # swaps the two strides
layout("t[:, 1:5] (slice)", t[:, 1:5], t)  # starts 1 element in, rows still 6 apart
layout("t[1:, ::2] (step 2)", t[1:, ::2], t)  # offset 6, every other column: stride 2
layout("t[2] (select a row)", t[2], t)  # one dimension fewer
u = torch.arange(24.0).reshape(2, 3, 4)  # (2, 3, 4)
layout("u.permute(2, 0, 1)", u.permute(2, 0, 1), u)  # strides reordered like the dims
layout("u.unsqueeze(1)", u.unsqueeze(1), u)  # a size-1 dim: its stride is never used

# %% [markdown]
# **Broadcasting** repeats elements without copying them: a broadcast dimension has stride 0, so every
# step along it reads the same memory. `x + row` broadcasts `row` this way inside the addition.

# %%
row = torch.arange(6.0)  # (6,)
layout("row", row, row)
layout("row.expand(4, 6)", row.expand(4, 6), row)  # stride 0 on the new leading dimension
col = t[:, :1]  # (4, 1), a view of t's first column
layout("t[:, :1].expand(4, 6)", col.expand(4, 6), t)  # stride 0 on the broadcast columns

# %% [markdown]
# **`reshape`** returns a view when the new shape can be described by strides over the existing
# layout, and a copy otherwise. Merging two dimensions into one needs them to be "adjacent" in memory:
# `stride[d] == stride[d + 1] * size[d + 1]`. A contiguous tensor can be reshaped into anything as a
# view; its transpose cannot be flattened without reordering the elements. `view` never copies:
# where `reshape` would copy, `view` raises. `contiguous()` copies a non-contiguous tensor into a
# fresh row-major one (and returns the tensor itself when it already is).

# %%
layout("t.reshape(2, 12)", t.reshape(2, 12), t)
layout("t.reshape(4, 2, 3)", t.reshape(4, 2, 3), t)
layout("t.T.reshape(24)", t.T.reshape(24), t)  # the elements must be reordered: a copy
try:
    t.T.view(24)
except RuntimeError as exc:
    print(f"t.T.view(24) raises: {str(exc)[:95]}...")
layout("t.T.contiguous()", t.T.contiguous(), t)
layout("t.contiguous()", t.contiguous(), t)  # already contiguous: t itself

# %% [markdown]
# **Describable is not the same as returned as a view.** Two kinds of operation copy although one
# (offset, strides) could describe their result. Indexing with a list or a tensor of indices
# ("advanced indexing") always copies, even when the indices are evenly spaced: PyTorch does not
# look at their values to find a stride. And PyTorch allows no negative strides, so reversing a
# dimension (`flip`), which a stride of -1 would describe, copies too. Compare each with the slice
# that picks the same elements:

# %%
layout("t[:, 1::2] (a slice)", t[:, 1::2], t)  # columns 1, 3, 5: stride 2, a view
layout("t[:, [1, 3, 5]] (a list)", t[:, [1, 3, 5]], t)  # the same elements: a copy
layout("t.flip(0)", t.flip(0), t)  # would need stride -6: a copy

# %% [markdown]
# ### Views built by hand with as_strided
#
# `as_strided(size, stride, storage_offset)` builds any view you can describe with strides. Two worked
# siblings, each checked against the PyTorch function it imitates. The **diagonal** of a matrix: one
# step along it is one row down and one column right, so its single stride is `stride(0) + stride(1)`.
# **Sliding windows** (`unfold`): window `w` starts `w * step` elements in, and inside a window
# consecutive elements are one stride apart, so the windows overlap in memory. Both keep the storage
# offset of their input, so they also work on a tensor that is already a view.
# Careful: `as_strided` checks nothing but the storage's bounds; with overlapping windows, writing
# one element writes it in several windows.

# %%
def diagonal_view(t: torch.Tensor) -> torch.Tensor:
    """The main diagonal of a 2-D t (like t.diagonal()), as a view of t's storage."""
    n = min(t.shape)
    return t.as_strided((n,), (t.stride(0) + t.stride(1),), t.storage_offset())


def sliding_windows(x: torch.Tensor, width: int, step: int = 1) -> torch.Tensor:
    """Windows of a 1-D x (like x.unfold(0, width, step)): (n_windows, width), as a view."""
    n_windows = (x.shape[0] - width) // step + 1
    return x.as_strided((n_windows, width), (step * x.stride(0), x.stride(0)), x.storage_offset())


for name, view, expected in [("diagonal_view(t)", diagonal_view(t), t.diagonal()),
                             ("diagonal_view(t[1:, 2:])", diagonal_view(t[1:, 2:]), t[1:, 2:].diagonal()),
                             ("diagonal_view(t.T)", diagonal_view(t.T), t.T.diagonal())]:
    assert torch.equal(view, expected)
    layout(name, view, t)
signal = torch.arange(10.0)  # (10,)
windows = sliding_windows(signal, 3)  # (8, 3): window w is signal[w : w + 3]
assert torch.equal(windows, signal.unfold(0, 3, 1))
print(windows)
layout("sliding_windows(signal, 3)", windows, signal)
layout("sliding_windows(signal[::2], 2, 2)", sliding_windows(signal[::2], 2, 2), signal)

# %% [markdown]
# **Your turn**: [01.transpose_view](../exercises/01_strides_and_intensity.ipynb#01.transpose_view:-a-transpose-by-hand)
# and [01.broadcast_view](../exercises/01_strides_and_intensity.ipynb#01.broadcast_view:-a-broadcast-by-hand)
# build `transpose` and `expand` the same way. The layouts printed above for `t.T`, `u.permute` and
# `row.expand` show what their strides must be.

# %% [markdown]
# **Why kernels care.** A Triton kernel receives `x.data_ptr()` and nothing else about the layout:
# the host must pass the strides (lesson 02's `copy_2d` does) or make the input contiguous first,
# which costs a full extra read and write of the tensor. And memory is read fastest when neighbouring
# threads read neighbouring addresses: along the stride-1 dimension.

# %% [markdown]
# ## 3. The memory hierarchy
#
# Approximate figures for an H100 SXM. Sizes are NVIDIA's (H100 datasheet and Hopper whitepaper), and
# so is HBM's bandwidth; the other bandwidths are orders of magnitude, and latencies, in clock cycles,
# come from microbenchmark studies of Hopper such as Luo et al., *Benchmarking and Dissecting the Nvidia
# Hopper GPU Architecture* (2024, measured on an H800, a Hopper GPU with the same SM). Only the launch
# is measured by this course. The last column says where each figure comes from.
#
# | level | size | bandwidth | latency | source |
# |---|---|---|---|---|
# | registers | 256 KB per SM (132 SMs) | feeds the ALUs every cycle | ~1 cycle | whitepaper |
# | shared memory / L1 | 256 KB per SM, up to 228 KB shared | tens of TB/s, all SMs | ~30 cycles | size: whitepaper; bandwidth: 128 bytes a clock per SM x 132 SMs; latency: Luo et al. (paper) |
# | L2 cache | 50 MB | several TB/s, a few times HBM's | ~200-300 cycles | size: whitepaper; latency and bandwidth: microbenchmark studies, approximate |
# | HBM3 (global memory) | 80 GB (an H200 has 141 GB of HBM3e) | 3.35 TB/s in the datasheet (an H200 4.8) | ~500-700 cycles | datasheet; latency: Luo et al. (paper) |
# | host memory over PCIe 5 x16 | the CPU's RAM | ~64 GB/s each way | microseconds | PCIe 5 spec |
# | launching a kernel | | | one Triton call from Python, back to back: {{04_fusion/us:sin^4 fp32 4096 (launch-bound)|triton (ours) 1 launch}} | measured in lesson 04 |
#
# Two lessons hide in this table. First, every level down is larger and slower: a kernel wants to load
# each byte from HBM once and reuse it from registers and shared memory (lesson 03's tiled matmul is
# exactly that). Second, latency is *hidden*, not avoided: to keep HBM's bandwidth busy while each
# access takes hundreds of cycles, bandwidth x latency bytes must be in flight at every moment
# (Little's law), which is why GPUs run tens of thousands of threads. The napkin maths, on the
# datasheet bandwidth and an assumed clock:

# %%
clock_hz = 1.7e9  # assumed: an H100 SXM under load runs at roughly 1.6-1.98 GHz
hbm_latency_s = 600 / clock_hz  # ~600 cycles, the middle of the table's range
hbm_bandwidth = roofline.DATASHEETS["H100 SXM"].bandwidth  # bytes/s, datasheet
print(f"1 cycle = {1e9 / clock_hz:.2f} ns; an HBM access of 600 cycles = {hbm_latency_s * 1e6:.2f} µs")
print(f"in flight to keep {hbm_bandwidth / 1e12:.2f} TB/s busy: {hbm_bandwidth * hbm_latency_s / 1e6:.1f} MB "
      f"= {hbm_bandwidth * hbm_latency_s / 132 / 1024:.0f} KiB per SM")

# %% [markdown]
# For tensors far larger than L2, the speed limit of a simple operation is HBM **bandwidth**; that is
# the slanted roof of the roofline. Your own GPU:

# %%
if mode.gpu:
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0)
    print(f"{props.name}: {props.multi_processor_count} SMs, L2 {l2 / 2**20:.0f} MiB, "
          f"{props.total_memory / 2**30:.0f} GiB of device memory, "
          f"compute capability {props.major}.{props.minor}")
else:
    print("interpreter mode: no GPU here; the table above describes an H100 SXM")

# %% [markdown]
# ## 4. FLOPs versus bytes: arithmetic intensity
#
# **Napkin maths.** For an operation, count
# - the FLOPs it must do (a multiply-add is 2 FLOPs; a comparison or an exp counts 1 here), and
# - the bytes it must move between HBM and the chip, at the least: every input read once, every
#   output written once.
#
# Their ratio is the **arithmetic intensity** `I = FLOPs / bytes`. ReLU in fp32 does 1 FLOP per
# element and moves 4 bytes in and 4 out: `I = 1/8`. In int8 the same FLOP moves 1 + 1 bytes:
# `I = 1/2`, four times the work per byte. A vector add reads two inputs: `1/12` in fp32.
# `course_utils.roofline` holds these counts:

# %%
ops = {
    "ReLU fp32": roofline.relu_cost(1 << 28, 4),
    "ReLU int8": roofline.relu_cost(1 << 28, 1),
    "vector add fp32": roofline.add_cost(1 << 28, 4),
    "softmax fp32 4096 x 32768": roofline.softmax_cost(4096, 32768, 4),
    "matmul bf16 8192^3": roofline.matmul_cost(8192, 8192, 8192, 2),
}
for name, cost in ops.items():
    print(f"{name:<28} {cost.flops:10.3g} FLOPs {cost.n_bytes:10.3g} bytes  "
          f"I = {cost.intensity:8.4g} FLOP/byte")

# %% [markdown]
# **A matrix-vector product** `y = W @ x`, with `W (N, K)`: each of the N outputs is a dot product of
# length K, a multiply and an add per term, so `2NK` FLOPs; the least traffic reads W and x once and
# writes y once. The worked sibling, the counting written out:

# %%
def matvec_intensity(N: int, K: int, bytes_per_element: int) -> float:
    """FLOP per byte of y = W @ x with W (N, K), x (K,), y (N,), each crossing DRAM once."""
    flops = 2 * N * K  # a multiply and an add per weight
    n_bytes = (N * K + K + N) * bytes_per_element  # read W and x, write y
    return flops / n_bytes


for N_, K_ in [(1024, 1024), (8192, 8192), (14336, 4096)]:
    print(f"W ({N_}, {K_}): bf16 {matvec_intensity(N_, K_, 2):.3f} FLOP/B, fp32 {matvec_intensity(N_, K_, 4):.3f}")

# %% [markdown]
# However large W is, every weight is used once: a matrix-vector product, the core of LLM decoding,
# stays just under 1 FLOP/byte in bf16.
#
# **Matmul** `(M, K) @ (K, N)` is M such products sharing one weight matrix: `2MNK` FLOPs over
# `(MK + KN + MN) * bytes` bytes. For square `N x N` matrices that is `2N / (3 * bytes)`: intensity
# *grows with the size*, because each element loaded takes part in N multiply-adds.
# **Your turn**: [01.matmul_intensity](../exercises/01_strides_and_intensity.ipynb#01.matmul_intensity:-FLOPs-per-byte-of-a-matmul)
# writes that count as a function. The course's own version, `roofline.matmul_cost`, gives the table:

# %%
print(f"{'M x N x K':<22} {'bf16 FLOP/B':>12} {'fp32 FLOP/B':>12}")
for M, N, K in [(16, 16, 16), (64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096),
                (16384, 16384, 16384), (1, 8192, 8192), (16, 8192, 8192), (128, 8192, 8192)]:
    bf16, fp32 = roofline.matmul_cost(M, N, K, 2), roofline.matmul_cost(M, N, K, 4)
    print(f"{f'{M} x {N} x {K}':<22} {bf16.intensity:12.1f} {fp32.intensity:12.1f}")

# %% [markdown]
# **Floor times.** An operation cannot finish faster than its bytes take to move, nor faster than its
# FLOPs take to compute: `time >= max(bytes / bandwidth, FLOPs / peak)`. Which peak depends on the
# work: a matmul in bf16 runs on the **tensor cores**; elementwise work, reductions and softmax's
# exponentials run on the ordinary **CUDA cores**, whose fp32 peak is far lower. The worked function
# and the floors, on an H100 SXM's datasheet figures from `roofline.DATASHEETS` (3.35 TB/s, 989 bf16
# TFLOP/s dense on tensor cores, 67 fp32 TFLOP/s on CUDA cores):

# %%
def floor_time(cost: roofline.Cost, peak_flops: float, bandwidth: float) -> float:
    """The least time, in seconds, of an operation: its bytes at `bandwidth` or its FLOPs at `peak_flops`."""
    memory_s = cost.n_bytes / bandwidth  # bytes / (bytes/s)
    compute_s = cost.flops / peak_flops  # FLOPs / (FLOP/s)
    return max(memory_s, compute_s)  # whichever takes longer sets the floor


h100 = roofline.DATASHEETS["H100 SXM"]
peaks = {"ReLU fp32": h100.peak("fp32"), "ReLU int8": h100.peak("fp32"), "vector add fp32": h100.peak("fp32"),
         "softmax fp32 4096 x 32768": h100.peak("fp32"), "matmul bf16 8192^3": h100.peak("bf16")}
for name, cost in ops.items():
    memory_ms, compute_ms = cost.n_bytes / h100.bandwidth * 1e3, cost.flops / peaks[name] * 1e3
    limit = "memory" if memory_ms > compute_ms else "compute"
    print(f"{name:<28} memory {memory_ms:8.4f} ms, compute {compute_ms:8.4f} ms -> {limit}-bound, "
          f">= {floor_time(cost, peaks[name], h100.bandwidth) * 1e3:.4f} ms")

# %% [markdown]
# Turn the floor time around and you get the best **rate**: FLOPs divided by the floor time is the
# most FLOP/s the operation can reach.
# **Your turn**: [01.attainable_flops](../exercises/01_strides_and_intensity.ipynb#01.attainable_flops:-the-roofline)
# writes that rate as a function of the intensity: the roofline of the next section.

# %% [markdown]
# ## 5. The roofline, measured on your device
#
# With bandwidth `B` (bytes/s) and peak rate `P` (FLOP/s), an operation of intensity `I` can reach at best
#
# $$\text{attainable}(I) = \min(P,\; I \cdot B)\quad \text{FLOP/s}.$$
#
# On a log-log plot that is a slanted roof (memory-bound, slope 1) meeting a flat roof (compute-bound)
# at the **ridge point** `I = P / B`. A GPU has several flat roofs, one per kind of arithmetic: the
# tensor cores' in bf16, their TF32 rate for fp32 matmuls, and the CUDA cores' plain fp32, the one
# elementwise work, reductions and softmax live under. Datasheet peaks are not reachable in practice,
# so `course_utils` *measures* the ceilings: `B` from a 1 GiB device-to-device copy (read + write
# bytes counted), the matmul roofs from `torch.matmul` in bf16 and in fp32 on TF32 tensor cores (the
# best rate over the sizes timed), and the CUDA-core roof from a Triton kernel that does nothing but
# fp32 multiply-adds on data it has already loaded (the best of a few block shapes). On a GPU `roofline.device_ceilings()` measures them once (a few
# seconds) and caches them per device name in `~/.cache/course_utils/`; in interpreter mode it returns
# the committed GPU measurements.

# %%
ceilings = roofline.device_ceilings()
print(ceilings.describe())
print()
print("datasheet figures, for comparison (dense tensor-core rates, peak HBM bandwidth):")
for sheet in roofline.DATASHEETS.values():
    print(sheet.describe())

# %% [markdown]
# Measured ceilings sit below the datasheet (the next cell computes by how much). The measured ones
# are the honest targets: lesson 02 compares its kernels with the copy, lesson 03 with
# `torch.matmul`.
#
# The ridge points differ by roof. On the committed run ({{measured}}), a bf16 matmul reached
# {{fact:peak_bf16_tflops}} (best at {{fact:peak_bf16_size}}), so it needs {{fact:ridge_bf16}} before
# the arithmetic, rather than the memory, becomes its limit. Work that cannot use the tensor cores meets
# a much lower flat roof, the CUDA cores' fp32 rate, measured at {{fact:peak_fp32_tflops}} (the
# datasheet says more: the next cell compares), and so a much lower ridge: {{fact:ridge_fp32}}.
# Elementwise operations and softmax, at a fraction of a FLOP per byte, sit far left of even that
# ridge: memory-bound under every roof. (Lesson 04 uses this roof to
# explain why `sin` applied four times can become compute-bound.)

# %%
sheet = roofline.DATASHEETS["H100 SXM"] if "H100" in ceilings.device else roofline.DATASHEETS["H200 SXM"]
print(f"{ceilings.device} measured against the {sheet.device} datasheet:")
print(f"  copy bandwidth {ceilings.copy_gbps:,.0f} of {sheet.copy_gbps:,.0f} GB/s = "
      f"{ceilings.copy_gbps / sheet.copy_gbps:.0%}")
for name, tflops in ceilings.matmul_tflops.items():
    if name in sheet.matmul_tflops:
        print(f"  {name:<5} {tflops:6.1f} of {sheet.matmul_tflops[name]:6.1f} TFLOP/s = "
              f"{tflops / sheet.matmul_tflops[name]:.0%}")
if "fp32" in ceilings.matmul_tflops:  # measured on the device (plain fp32, no tensor cores)
    cuda_core, where = ceilings.peak("fp32"), "measured"
else:
    cuda_core, where = sheet.peak("fp32"), f"{sheet.device} datasheet"
print(f"CUDA-core fp32 roof ({where}, {cuda_core / 1e12:.0f} TFLOP/s) over the measured copy bandwidth: "
      f"ridge {roofline.ridge_point(cuda_core, ceilings.bandwidth):.1f} FLOP/byte")
for name, cost in ops.items():
    if not name.startswith("matmul"):
        print(f"  {name:<28} I = {cost.intensity:.3f} FLOP/byte: "
              f"{roofline.bound(cost.intensity, cuda_core, ceilings.bandwidth)}-bound under the CUDA-core roof")

# %% [markdown]
# ## 6. Real operations on the roofline
#
# On a GPU the next cell times ReLU and vector add (lesson 02's Triton kernels and torch),
# `torch.softmax` and `torch.matmul` at several sizes on *your* device (about half a minute) and places
# them on your measured roofline. In interpreter mode it draws the committed GPU results instead
# (`python -m course_utils bench 01` produces them).

# %%
if mode.gpu:
    from course_utils.benches.l01_strides_and_intensity import QUICK, time_operations

    table = Table("01")
    time_operations(table, QUICK)
    points = roofline.points_from_rows(table.rows)
    fig = roofline.plot_roofline(ceilings, points, title=f"your {ceilings.device}")
else:
    results = roofline.reference_results()
    where = results.get("source") or f"measured on {results['device']} on {results['date']}"
    print(f"interpreter mode: nothing is timed here; showing GPU figures: {where}")
    ceilings = roofline.ceilings_from_results(results)
    points = roofline.points_from_rows(results)
    fig = roofline.plot_results(results)
print(roofline.format_points(points, ceilings))

# %% [markdown]
# **What the plot shows.** Points are coloured by which roof limits them; the percentage is how close
# each comes to the roof above it (matmuls under their tensor-core roof, everything else under the
# CUDA-core roof).
# - **ReLU, vector add and softmax** sit far to the left, at intensities below 1 FLOP/byte, on the
#   slanted roof: memory-bound. Their TFLOP/s look tiny next to the matmuls, yet ReLU and the vector
#   add run at about the copy's rate (lesson 02 shows why the add can even pass it a little), and `torch.softmax` at half of its roof or
#   more, depending on the shape and the GPU. Nothing but *less traffic* makes them faster: fewer bytes
#   per element (int8 ReLU does four times the FLOPs per byte of fp32 ReLU, at no more than about a
#   quarter fewer GB/s, so it finishes several times sooner), or *fusion*, doing several operations per
#   trip to memory (lesson 04).
# - **Matmul** moves right as it grows (intensity `2N/(3 * bytes)`). Small matmuls fall well below both
#   roofs: too little work to fill the GPU's SMs, and a few microseconds that any kernel takes however
#   little it does (the 64^3 one took {{us:matmul bf16 64^3|torch.matmul}}, timed on the GPU, its launch
#   from Python hidden behind the cache flush that precedes it).
#   The large ones (4096^3, 8192^3) reach the flat roof: compute-bound, where lesson 03's tiled kernels
#   have to compete with cuBLAS.
# - **Skinny matmuls** (a matrix-vector product, a decode step of a few tokens) stay left of the ridge
#   whatever the matrix size: memory-bound. That is why generating text one token at a time is limited
#   by reading the weights, and why smaller weights (int8, fp8, int4: lesson 07) speed it up.

# %% [markdown]
# Every row the bench recorded (the ceilings, each operation, each block size of our kernels), as
# committed from a GPU run:

# %%
show_results("01")

# %% [markdown]
# ## 7. Self-check
#
# Four short questions. Run a cell as it is to see its question, then replace `None` by your answer
# and run it again; the check says whether you are right and, if not, gives a hint (never the answer).

# %%
quiz("01.quiz_strides", None)

# %%
quiz("01.quiz_views", None)

# %%
quiz("01.quiz_add_intensity", None)

# %%
quiz("01.quiz_bound", None)

# %% [markdown]
# ## Exercises
#
# [exercises/01_strides_and_intensity.ipynb](../exercises/01_strides_and_intensity.ipynb):
# `contiguous_strides`, `transpose_view` and `broadcast_view` (views built by hand with `as_strided`:
# same storage, no copies), `matmul_intensity` and `attainable_flops` (the roofline's arithmetic).
# Each is checked by `check("01....", fn)`.
