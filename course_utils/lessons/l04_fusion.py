# %% [markdown]
# # Lesson 04 exercises: fusion
#
# Three exercises about fusing chains of elementwise operations into one kernel:
#
# - `04.bytes_moved`: the napkin maths. How many bytes does a chain of elementwise ops move, unfused
#   (one kernel per op) and fused (one kernel for the whole chain)?
# - `04.sin4`: `sin(sin(sin(sin(x))))` in **one** kernel: one read of `x`, one write of `out`.
# - `04.silu_mul`: `silu(g) * u`, the elementwise heart of the gated MLP of Llama, in one kernel,
#   numerically safe for large `|g|` and computed in fp32 whatever the storage dtype.
#
# Kernel exercises use destination passing: your host function receives its inputs and the output
# buffer `out` (allocated and poisoned by the checker). Write every element of `out`, and nothing else.
# In interpreter mode (no GPU) the same kernels run on the CPU, with smaller sizes. The lesson,
# [notebooks/04_fusion.ipynb](../notebooks/04_fusion.ipynb), teaches each exercise with a worked
# sibling; every exercise below links its section.

# %% [setup]

# %%
from course_utils import check, progress  # noqa: F401
from course_utils.shapes import expect_contiguous, expect_shapes  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# %% [markdown]
# ## 04.bytes_moved: bytes of a chain
#
# `bytes_moved(n_elements, bytes_per_element, n_ops, fused) -> int`. Taught in the lesson's
# [Counting the bytes](../notebooks/04_fusion.ipynb#Counting-the-bytes) (the worked example counts
# the two-input chain `silu(g) * u`).
#
# An elementwise op on `n` elements reads `n` elements and writes `n` elements. Run a chain of
# `n_ops` of them eagerly (one kernel each) and every op pays a full read **and** a full write,
# because each kernel hands its result to the next one through global memory. Fused into one kernel,
# the chain reads its input once and writes its output once; the intermediates stay in registers.
#
# Return the bytes moved, as an int: unfused `2 * n_ops * n * bytes`, fused `2 * n * bytes`.
# (Ops with two inputs, like `silu(g) * u`, read more; this exercise is about one-input chains.)

# %%
def bytes_moved(n_elements: int, bytes_per_element: int, n_ops: int, fused: bool) -> int:
    """Global-memory traffic of a chain of `n_ops` one-input elementwise ops on `n_elements` elements."""
    # BEGIN SOLUTION
    one_pass = n_elements * bytes_per_element  # touch every element once
    if fused:
        return 2 * one_pass  # read the input once, write the output once
    return 2 * n_ops * one_pass  # every kernel reads its input and writes its output
    # END SOLUTION


# %% [check] 04.bytes_moved

# %% [markdown]
# ## 04.sin4: four sines in one kernel
#
# `sin4(x, out)`. Taught in the lesson's
# [A fused kernel for a chain](../notebooks/04_fusion.ipynb#A-fused-kernel-for-a-chain) (the worked
# example fuses `cos(exp(x))`).
#
# The PyTorch spec is `sin4_ref` below: four calls, so four kernels, and `8 * 4 = 32` bytes per fp32
# element. Write it as **one** kernel: load a block of `x`, apply `tl.sin` four times to the values in
# registers, store once: 8 bytes per fp32 element. `x` and `out` are contiguous, any shape, fp32 or
# fp16 (bf16 on a GPU); `tl.sin` only accepts fp32 (or fp64), so convert the loaded block with
# `.to(tl.float32)`; `tl.store` converts back to `out`'s dtype. The check counts kernel launches:
# calling a one-`sin` kernel four times gives the right numbers and fails. As in lesson 02, start the
# offsets from `tl.program_id(0).to(tl.int64)`: past 2^31 elements `pid * BLOCK` overflows int32.

# %%
def sin4_ref(x: torch.Tensor) -> torch.Tensor:
    """sin(sin(sin(sin(x)))) the eager way: four kernels, each reading and writing every element."""
    return torch.sin(torch.sin(torch.sin(torch.sin(x))))


@triton.jit
def sin4_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    # BEGIN SOLUTION
    # (BLOCK,) element indices, 64-bit as in lesson 02: past 2^31 elements pid * BLOCK overflows int32
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements  # the last block is partial
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # read n * bytes, once
    y = tl.sin(tl.sin(tl.sin(tl.sin(x))))  # four sins in registers: no memory traffic
    tl.store(out_ptr + offsets, y, mask=mask)  # write n * bytes, once (converted to out's dtype)
    # END SOLUTION


def sin4(x: torch.Tensor, out: torch.Tensor, BLOCK: int = 2048, num_warps: int = 8) -> None:
    """out = sin(sin(sin(sin(x)))) in one kernel; x and out contiguous, same shape and dtype."""
    expect_shapes("sin4", out=(out, x.shape))
    expect_contiguous("sin4", x=x, out=out)
    # BEGIN SOLUTION
    n = x.numel()
    grid = (triton.cdiv(n, BLOCK),)  # one program per BLOCK elements
    sin4_kernel[grid](x, out, n, BLOCK=BLOCK, num_warps=num_warps)
    # END SOLUTION


# %% [check] 04.sin4

# %% [markdown]
# ## 04.silu_mul: the gated MLP product
#
# `silu_mul(g, u, out)`. Taught in the lesson's
# [The gated MLP product](../notebooks/04_fusion.ipynb#The-gated-MLP-product) (the worked example is
# `gelu(g) * u`).
#
# In Llama's MLP, `down(silu(x @ W_gate.T) * (x @ W_up.T))`, the two projections `g = x @ W_gate.T`
# and `u = x @ W_up.T` are (tokens, intermediate) matrices, and between the matmuls sits a triple
# elementwise product `g * sigmoid(g) * u`. Eagerly, `F.silu(g) * u` is two kernels: `silu` reads g
# and writes a temporary, `*` reads the temporary and u and writes out: 5 passes over the matrix.
# One kernel needs 3: read g, read u, write out.
#
# Numerics, the part that breaks naive kernels:
# - compute in fp32: load g and u, `.to(tl.float32)`, and let `tl.store` round **once** to out's dtype.
#   Rounding the sigmoid (or silu) to fp16/bf16 first adds a rounding error the check will see;
# - `sigmoid(g) = 1 / (1 + exp(-g))` is safe (`tl.sigmoid` computes exactly that): for g = -100,
#   exp(100) = inf and 1 / inf = 0. The textbook `exp(g) / (1 + exp(g))` is not: for g = 100 it is
#   inf / inf = NaN (fp32 overflows at g > 88, fp16 at g > 11).
#
# `g`, `u` and `out` are contiguous and have the same shape (any) and dtype (fp32, fp16, or bf16 on
# a GPU).

# %%
def silu_mul_ref(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """silu(g) * u computed in fp32 and rounded once to g's dtype: what the kernel must return."""
    return (F.silu(g.float()) * u.float()).to(g.dtype)


@triton.jit
def silu_mul_kernel(g_ptr, u_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    # BEGIN SOLUTION
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) 64-bit, as in sin4
    mask = offsets < n_elements
    g = tl.load(g_ptr + offsets, mask=mask).to(tl.float32)  # read n * bytes
    u = tl.load(u_ptr + offsets, mask=mask).to(tl.float32)  # read n * bytes
    # silu(g) = g * sigmoid(g); tl.sigmoid is 1 / (1 + exp(-g)): exp(-g) = inf gives 0, never NaN
    out = g * tl.sigmoid(g) * u  # about 5 FLOPs and one exp per element: memory-bound
    tl.store(out_ptr + offsets, out, mask=mask)  # write n * bytes, rounded once to out's dtype
    # END SOLUTION


def silu_mul(g: torch.Tensor, u: torch.Tensor, out: torch.Tensor, BLOCK: int = 2048,
             num_warps: int = 8) -> None:
    """out = silu(g) * u in one kernel; g, u, out contiguous with the same shape and dtype."""
    expect_shapes("silu_mul", u=(u, g.shape), out=(out, g.shape))
    expect_contiguous("silu_mul", g=g, u=u, out=out)
    # BEGIN SOLUTION
    n = out.numel()
    grid = (triton.cdiv(n, BLOCK),)
    silu_mul_kernel[grid](g, u, out, n, BLOCK=BLOCK, num_warps=num_warps)
    # END SOLUTION


# %% [check] 04.silu_mul

# %% [progress] 04
