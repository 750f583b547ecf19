# %% [markdown]
# # 04 · Fusion: launch overhead, memory traffic, and torch.compile as a fusion compiler
#
# **What you will learn**: why a chain of elementwise PyTorch operations is slow (every operation is
# a kernel launch and a full round trip through GPU memory); how one Triton kernel does the whole
# chain; how to see the launches and the gaps between kernels in a profiler trace; how `torch.compile`
# fuses the same chain and how to read the Triton code it writes; how CUDA graphs and
# `mode="reduce-overhead"` remove launch overhead; and the fused `silu(g) * u` at the heart of
# Llama's MLP, computed safely for large inputs.

# %%
from course_utils import setup

mode = setup()

# %%
import inspect
from pathlib import Path

import torch
import triton

from course_utils import benches, check, size
from course_utils.bench import can_time, do_bench, load_results, plot, show_results
from course_utils.benches.l04_fusion import (COMPILE_NOTE, LAUNCH_GROUP, PROFILE_NOTE, cuda_graph,
                                      describe_trace, generated_triton, profile_to_trace, sin_instruction,
                                      trace_summary, wall_ms)
from course_utils.lessons.l04_fusion import (bytes_moved, silu_mul, silu_mul_kernel, silu_mul_ref, sin4,
                                             sin4_kernel, sin4_ref)

results = load_results("04")  # what the last GPU run measured (results/04_fusion.json), or None
notes = results["notes"] if results else []


def show(obj) -> None:
    """Print the source of a function or kernel, without the exercise notebook's solution markers."""
    source = inspect.getsource(getattr(obj, "fn", obj))  # a @triton.jit kernel keeps its function in .fn
    markers = ("# BEGIN SOLUTION", "# END SOLUTION")
    print("\n".join(line for line in source.splitlines() if line.strip() not in markers))


def committed_rows(group: str) -> None:
    """Print one group of the committed GPU results (used where this machine cannot measure)."""
    rows = [r for r in (results or {}).get("rows", []) if r["group"] == group]
    if not rows:
        print(f"no committed GPU results for '{group}' yet (python -m course_utils bench 04 on a GPU)")
    for r in rows:
        print(f"  {r['name']:<42} {r['ms'] * 1e3:9.1f} us")


# %% [markdown]
# ## The chain: `sin` four times
#
# `torch.sin(torch.sin(torch.sin(torch.sin(x))))` is four PyTorch calls, so four CUDA kernels. Each
# kernel reads its whole input from GPU memory (HBM) and writes its whole output back, because that
# is the only way to hand a result to the next kernel:
#
# ```
# eager:  HBM -x-> [sin] -t1-> HBM -t1-> [sin] -t2-> HBM -t2-> [sin] -t3-> HBM -t3-> [sin] -out-> HBM
#         4 launches, 4 reads + 4 writes of n elements
# fused:  HBM -x-> [sin sin sin sin] -out-> HBM
#         1 launch, 1 read + 1 write; t1, t2, t3 live in registers
# ```
#
# Each eager kernel does little arithmetic for the 8 bytes it moves per element (fp32 in, fp32 out),
# so its time goes into memory traffic, and eager sin^4 moves four times the bytes the result needs.
# `bytes_moved` (exercise 04.bytes_moved) is this napkin maths.

# %% [markdown]
# ## Napkin maths: bytes and the floor time on this device
#
# The floor of a memory-bound kernel is `bytes / bandwidth`, and the best bandwidth any kernel gets
# is a plain copy's. On a GPU we measure it here; on a CPU we take the copy row of the committed GPU
# run (or an H100's typical 3 TB/s when there is none yet).

# %%
n = size(gpu=1 << 26, cpu=1 << 12)  # the elements this machine runs
x = torch.randn(n, device=mode.device)
out = torch.empty_like(x)
n_gpu = 1 << 26  # the floor is about the GPU-sized problem: 2^26 fp32 elements, 256 MiB

if mode.gpu:
    copy_ms = do_bench(lambda: out.copy_(x))  # reads and writes n_gpu * 4 bytes
    bandwidth, source = 2 * n_gpu * 4 / (copy_ms * 1e-3), f"measured copy on {torch.cuda.get_device_name()}"
else:
    rows = (results or {}).get("rows", [])
    copy = next((r for r in rows if r["group"].startswith("sin^4") and r["name"].startswith("copy")), None)
    if copy:
        bandwidth, source = copy["gbps"] * 1e9, f"copy row of the committed GPU run on {results['device']}"
    else:
        bandwidth, source = 3.0e12, "a typical H100 copy; no committed GPU run yet"
print(f"bandwidth: {bandwidth / 1e9:,.0f} GB/s ({source})")
for label, fused in [("eager, 4 kernels", False), ("fused, 1 kernel", True)]:
    moved = bytes_moved(n_gpu, 4, 4, fused)
    print(f"sin^4 of {n_gpu:,} fp32 elements, {label:<17}: {moved / 1e9:5.2f} GB, "
          f"floor {moved / bandwidth * 1e3:.3f} ms")

# %% [markdown]
# The fused kernel's floor is a quarter of eager's. Whether it reaches it depends on the sine too:
# an accurate `sinf` is a polynomial with argument reduction, tens of instructions, and four of them
# per element can make the fused kernel limited by arithmetic rather than by memory. The measured
# rows below show how close each version gets.
#
# ## The PyTorch reference

# %%
show(sin4_ref)
ref = sin4_ref(x)

# %% [markdown]
# ## The fused kernel
#
# One program per `BLOCK` elements, one masked load, four `tl.sin` on the values in registers, one
# masked store. `tl.sin` only accepts fp32 (and fp64), so the block is converted after the load;
# `tl.store` converts back to `out`'s dtype.

# %%
show(sin4_kernel)
show(sin4)

# %%
sin4(x, out)
torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
print(f"sin4 matches sin4_ref on {n:,} elements, with {triton.cdiv(n, 1024)} programs of 1024 elements")
check("04.sin4", sin4)

# %% [markdown]
# ## Four kernels against one, measured
#
# Same result, a quarter of the traffic. (GB/s in the bench counts the fused kernel's 8 bytes per
# element for every row, so the bars compare the work done per second.)

# %%
if can_time():
    useful = bytes_moved(n, 4, 4, fused=True)  # the bytes the result needs: GB/s "effective"
    for name, fn in [("torch eager (4 kernels)", lambda: sin4_ref(x)),
                     ("triton (ours) 1 kernel", lambda: sin4(x, out))]:
        ms = do_bench(fn)
        print(f"  {name:<26} {ms:.3f} ms  {useful / (ms * 1e-3) / 1e9:,.0f} GB/s effective")
else:
    committed_rows("sin^4 fp32 2^26")

# %% [markdown]
# ## The profiler: seeing launches and gaps
#
# `torch.profiler` records what the CPU did (Python, aten ops, the kernel launch calls) and what the
# GPU did (each kernel's start and end). We profile three calls of each version at 2^20 elements,
# where one kernel takes a few microseconds, about as long as launching it. The trace files land in
# `exports/` (ignored by git): open them at https://ui.perfetto.dev or `chrome://tracing`. In the
# eager trace, look at the GPU stream row: four short kernels per call, with idle gaps between them
# while the CPU prepares the next launch. The fused trace has one kernel per call.

# %%
m = size(gpu=1 << 20, cpu=1 << 10)
xs = torch.randn(m, device=mode.device)
outs = torch.empty_like(xs)
exports = Path("exports")

eager_trace = profile_to_trace(lambda: sin4_ref(xs), exports / "04_eager_sin4_trace.json")
print(describe_trace("eager sin^4", trace_summary(eager_trace)))
if mode.gpu:
    fused_trace = profile_to_trace(lambda: sin4(xs, outs), exports / "04_fused_sin4_trace.json")
    print(describe_trace("fused sin4", trace_summary(fused_trace)))
else:
    print("interpreter mode: our kernel runs as NumPy on the CPU, so its trace would show Python, not a "
          "GPU kernel; skipped. The GPU run's profiler summaries:")
    print("\n".join(note[len(PROFILE_NOTE):].strip() for note in notes if note.startswith(PROFILE_NOTE))
          or "  (no committed GPU results yet)")
print(f"trace files in {exports.resolve()}: open them at https://ui.perfetto.dev")

# %% [markdown]
# The summary counts kernels, adds up their durations (busy) and compares that with the time from
# the first kernel's start to the last one's end (span): the difference is the GPU waiting for work.
# Here is how it reads a trace file (plain JSON: a list of events with a category, a start `ts` and a
# duration `dur`, in microseconds):

# %%
show(trace_summary)

# %% [markdown]
# ## torch.compile: a fusion compiler that writes Triton
#
# `torch.compile(sin4_ref)` traces the four calls into a graph, and its backend, Inductor, fuses the
# elementwise chain into one kernel, written in Triton. To read the code it writes, run a script with
# `TORCH_LOGS=output_code` (or call `torch._logging.set_logs(output_code=True)`), or capture it as a
# string with `torch._inductor.utils.run_and_get_code`, as `generated_triton` does. On a CPU,
# `torch.compile` generates C++ instead (it needs a C++ compiler and takes a while), so this part runs
# on a GPU only; without one we print what the GPU run recorded.

# %%
show(generated_triton)
if mode.gpu:
    for kernel in generated_triton(sin4_ref, x):
        print(kernel)
else:
    print("interpreter mode: torch.compile would generate C++ for the CPU, not Triton; skipped.")
    print(next((note for note in notes if note.startswith(COMPILE_NOTE)), "(no committed GPU results yet)"))

# %% [markdown]
# Compare it with `sin4_kernel` above: the same plan, one program per block, one load, four sines on
# registers (`tl_math.sin` is `tl.sin`), one store. The differences are bookkeeping:
# - `XBLOCK` is our `BLOCK`; Inductor's `triton_heuristics.pointwise` decorator picks it (and
#   `num_warps`) from a few configurations at run time, like `@triton.autotune`;
# - the shape was known at compile time, so `xnumel` is a constant, and when it is a multiple of every
#   block size the mask is all true (`tl.full([XBLOCK], True, tl.int1)`, or `None` in the load);
# - names are generic (`in_ptr0`, `tmp0`..`tmp4`) because they come from a graph, not a person.
#
# Which sine? `tl.sin` compiles to whatever Triton's backend chooses for `math.sin`: libdevice's
# accurate `sinf` or the hardware's `sin.approx.f32`. Inductor emits the same `tl_math.sin`, so ours
# and its kernel use the same instruction and can be compared fairly. The PTX says which:

# %%
if mode.gpu:
    launched = sin4_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)  # returns the compiled kernel
    print("tl.sin compiled to:", sin_instruction(launched.asm["ptx"]))
else:
    print("interpreter mode: no PTX here (NumPy computes the sine).",
          next((note for note in notes if note.startswith("tl.sin")), "(no committed GPU results yet)"))

# %% [markdown]
# ## Overhead: many tiny launches
#
# At 4096 elements (16 KB) a kernel finishes in a couple of microseconds, while launching one from
# Python costs several: the eager chain is paid for in CPU time, and the GPU idles. Two ways out:
#
# - **CUDA graphs**: record the launches once, replay the whole sequence with one call.
#   `cuda_graph` below does it by hand (`torch.cuda.graph`); a replay reuses the captured tensors, so
#   inputs must be updated in place;
# - **`torch.compile(mode="reduce-overhead")`**: Inductor's fused kernels, launched from a CUDA graph it
#   records for you.
#
# Timing must include the CPU here: `wall_ms` runs many calls back to back and divides the wall-clock
# time. (CUDA-event timing can hide launch costs: the events are queued with the kernels.)

# %%
show(cuda_graph)
tiny = torch.randn(4096, device=mode.device)
if can_time():
    replay = cuda_graph(lambda: sin4_ref(tiny))
    torch.testing.assert_close(replay(), sin4_ref(tiny))
    eager_us, graph_us = wall_ms(lambda: sin4_ref(tiny)) * 1e3, wall_ms(replay) * 1e3
    print(f"eager, 4 launches: {eager_us:.1f} us per call; CUDA graph replay: {graph_us:.1f} us "
          f"({eager_us / graph_us:.1f}x faster)")
else:
    committed_rows(LAUNCH_GROUP)

# %% [markdown]
# In the full benchmark below, the same group also times `torch.compile` with and without
# `reduce-overhead`, and our kernel launched normally and from a CUDA graph. A single Triton launch
# from Python has its own cost too (the launcher checks the arguments and looks up the compiled
# kernel), so at this size compare all the rows: fusing removes launches, a graph removes the rest of
# the Python between them.
#
# ## The triple elementwise product of the gated MLP: `silu(g) * u`
#
# Llama's MLP is `down(silu(x @ W_gate.T) * (x @ W_up.T))`. Between the matmuls sits
# `g * sigmoid(g) * u` over a (tokens, intermediate) matrix, e.g. 4096 x 11008 in bf16. Written as
# Hugging Face writes it, `F.silu(g) * u` is two kernels and five passes over the matrix (silu reads
# g and writes a temporary; the product reads the temporary and u and writes out); fused, three
# passes: read g, read u, write out.

# %%
tokens, inter = 4096, 11008
for label, passes in [("eager F.silu(g) * u", 5), ("fused silu_mul", 3)]:
    moved = passes * tokens * inter * 2  # bf16: 2 bytes per element
    print(f"{label:<20}: {passes} passes x {tokens} x {inter} x 2 bytes = {moved / 1e6:.0f} MB")

# %% [markdown]
# The numerics matter as much as the traffic. `sigmoid(g) = 1 / (1 + exp(-g))` is safe at both ends:
# for g = -100, exp(100) overflows to inf and 1 / inf = 0. The textbook rewrite
# `exp(g) / (1 + exp(g))` is inf / inf = NaN as soon as exp(g) overflows: g > 88 in fp32, g > 11 in
# fp16. And computed in fp16, even the safe formula loses values that fp16 can store: exp(12) = 162755
# overflows fp16 (largest 65504), so silu(-12) = -7.4e-5 comes out as 0. Compute in fp32, round once.

# %%
def row(label: str, values: torch.Tensor) -> None:
    print(f"{label:<42}" + "".join(f"{float(v):>11.3g}" for v in values))


g_demo = torch.tensor([-100.0, -20.0, -12.0, 0.0, 12.0, 20.0, 100.0])
row("g", g_demo)
row("silu(g) exact (float64)", g_demo.double() * torch.sigmoid(g_demo.double()))
for dtype, name in [(torch.float32, "fp32"), (torch.float16, "fp16")]:
    gd = g_demo.to(dtype)
    row(f"textbook g * exp(g) / (1 + exp(g)), {name}", gd * (torch.exp(gd) / (1 + torch.exp(gd))))
    row(f"safe g / (1 + exp(-g)), {name}", gd * (1 / (1 + torch.exp(-gd))))
row("safe in fp32, rounded once to fp16", (g_demo * (1 / (1 + torch.exp(-g_demo)))).half())

# %% [markdown]
# The kernel: two loads converted to fp32, `g * tl.sigmoid(g) * u`, one store that rounds once.
# (In interpreter mode NumPy may warn "overflow encountered in exp" at large |g|: that is the
# exp(100) = inf that the safe formula turns into a clean 0.)

# %%
show(silu_mul_kernel)
shape = size((4096, 11008), (37, 781))  # (tokens, intermediate)
g = torch.randn(shape, device=mode.device, dtype=torch.float16) * 3
u = torch.randn(shape, device=mode.device, dtype=torch.float16)
out_mlp = torch.empty_like(g)
silu_mul(g, u, out_mlp)
torch.testing.assert_close(out_mlp, silu_mul_ref(g, u))
print(f"silu_mul matches silu_mul_ref on {tuple(g.shape)} fp16")
check("04.silu_mul", silu_mul)

# %% [markdown]
# ## Benchmark against the peers
#
# `course_utils/benches/l04.py` times, side by side in one process: sin^4 at 2^26 (eager,
# `torch.compile`, ours with a few `BLOCK`/`num_warps` choices), the launch-bound sin^4 at 4096
# (eager, CUDA graphs, `reduce-overhead`, ours), and `silu(g) * u` in bf16 at 4096 x 11008 and
# 16384 x 14336 against eager, `torch.compile` and Liger-Kernel's `LigerSiLUMulFunction` (when
# installed). Every kernel is checked against its reference before it is timed.

# %%
if can_time():  # also `python -m course_utils bench 04`, which writes results/04_fusion.json
    table = benches.run("04", write=False)
    plot(table.rows, f"lesson 04 on {torch.cuda.get_device_name()}")
else:
    show_results("04")

# %% [markdown]
# ## What the plot shows
#
# - **sin^4 at 2^26**: eager's four kernels move four times the bytes of a fused kernel. The fused
#   kernels, ours and `torch.compile`'s (the same one-load, four-`tl.sin`, one-store kernel), land
#   close together; the `triton (ours)` row is the best `BLOCK`/`num_warps` of the sweep, and the
#   targets compare it with `torch.compile` (at least 1.0x) and eager (at least 1.9x). Where the
#   speed-up over eager is well under 4x, the sines are the cost: the copy row moves the same bytes as
#   a fused kernel and computes nothing.
# - **Launch-bound sin^4 at 4096**: the rows are microseconds of overhead, not of work (read the
#   times, not the GB/s). The reported ratios are the speed-up of each CUDA-graph version over the
#   same work launched from Python. In the committed H200 run a graph made eager's four launches
#   about 5x faster and our single launch about 3x; `reduce-overhead` was *slower* than plain
#   `torch.compile` per call at this tiny size (its graph-tree bookkeeping runs on every call),
#   a reminder to measure rather than assume.
# - **silu * mul in bf16**: every fused version moves three passes instead of eager's five; a
#   memory-bound kernel done right lands near the copy row's GB/s. The targets ask ours for at least
#   `torch.compile`'s speed and at least 0.95x Liger-Kernel's; at these sizes all three fused kernels
#   sit at the HBM ceiling and differ by noise (1% either way), so the ratios hover around 1.0.
#
# The targets table under the figures gives the measured ratios. Now open
# `exercises/04_fusion.ipynb`: count the bytes, then write `sin4` and `silu_mul` yourself.
