# %% [markdown]
# # 00 · Setup: the doctor, the two modes, and how exercises are checked
#
# **What you will learn**: whether this machine runs the course on a GPU or in Triton's interpreter,
# what each later lesson needs from the hardware, and how an exercise and its check work.

# %% [markdown]
# ## The mode is decided first
#
# Every notebook starts with `setup()`. With a CUDA GPU, Triton compiles kernels for it. Without one,
# `setup()` sets `TRITON_INTERPRET=1`, and Triton runs the same kernels on the CPU with NumPy, one
# program after another. That must happen before any `@triton.jit` function is defined, because
# Triton reads the variable when it decorates a kernel. You can force a mode: `setup("interpret")`
# (debug a kernel with `print` on any machine) or `setup("gpu")`, or set `COURSE_MODE` before
# starting Jupyter.

# %%
from course_utils import setup

mode = setup()

# %% [markdown]
# ## The doctor
#
# Versions, the GPU and its compute capability, a tiny kernel run and checked, and what each lesson
# needs. The same report is `python -m course_utils doctor` in a terminal.

# %%
from course_utils.doctor import doctor

healthy = doctor()
assert healthy, "something the course needs is missing: see the lines above"

# %% [markdown]
# ## Sizes follow the mode
#
# The interpreter is thousands of times slower than a GPU, so every lesson picks its sizes with
# `size(gpu=..., cpu=...)`: the same code runs a 1 GiB vector on an H100 and a few thousand elements
# on a laptop. Timings only mean something on a GPU; on a CPU the lessons show what a real GPU
# measured (the committed `results/`).

# %%
from course_utils import size

n = size(gpu=1 << 28, cpu=1 << 12)
print(f"a vector of {n:,} fp32 elements: {n * 4 / 2**20:.3f} MiB")

# %% [markdown]
# ## How an exercise is checked
#
# An exercise gives you a spec and a stub, and a cell `check("02.vector_add", add)`. The check draws
# fresh random inputs every time (the seed is printed on failure, and `check(..., seed=...)` replays
# it), including awkward sizes (1, 1823, ...). Kernel exercises use **destination passing**: your
# function receives its inputs and the output buffer, which the checker filled with poison (a NaN no
# arithmetic produces) and surrounded with guard regions. So an element you never wrote, a write past
# the end, or a write into an input are each caught and named. In the interpreter every load and store
# address is also checked before it happens, so a missing mask is reported instead of corrupting memory.
#
# Here is a plausible first attempt at exercise 02.vector_add (`out = x + y`, lesson 02 teaches it):
# each program adds one block of 256 elements, but the attempt forgets that the last block runs past
# the end of the vectors. Watch what the check says.

# %%
import triton
import triton.language as tl

from course_utils import check
from course_utils.grading import CheckFailed


@triton.jit
def add_no_mask_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) indices: past n in the last block
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


def add_no_mask(x, y, out):
    n = out.numel()
    add_no_mask_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)


try:
    check("02.vector_add", add_no_mask, seed=0)
except CheckFailed as failure:
    print(failure)

# %% [markdown]
# The message names the exercise, the case (shapes, dtypes, strides), the seed, what went wrong and a
# hint. The fix (a *mask* that switches off the lanes past the end) is the subject of lesson 02; you
# write it yourself in `exercises/02_first_kernels.ipynb`. When an answer is right, `check` prints one
# line, `02.vector_add passed: ...`, and the notebook moves on. On a GPU the last case of a timed exercise
# is the realistic size its speed line reports (a 2^26-element vector, a 4096^3 matmul), judged against
# the course's own solution, so that a path your kernel takes only on large problems is checked too; then
# a second line gives your kernel's speed beside the solution's.
#
# A check also refuses answers that get the numbers right the wrong way: computing the result outside
# a Triton kernel (`out.copy_(x + y)` runs torch's own kernels, on the GPU or the CPU) instead of in
# your kernel is reported as such.

# %%
def add_with_torch(x, y, out):
    out.copy_(x + y)


try:
    check("02.vector_add", add_with_torch, seed=0)
except CheckFailed as failure:
    print(failure)

# %% [markdown]
# ## The course
#
# | folder | what |
# |---|---|
# | `notebooks/` | the lessons: narrative, demos, benchmarks |
# | `exercises/` | stubs and check cells: your work |
# | `solutions/` | the same notebooks, solved |
#
# Instructors grade a folder of submitted exercise notebooks with `python -m course_utils grade FOLDER`.
# Next: [lesson 01, strides and arithmetic intensity](01_strides_and_intensity.ipynb).
