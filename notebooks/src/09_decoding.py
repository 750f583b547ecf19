# %% [markdown]
# # Lesson 09: decoding: the KV cache, GQA, flash-decoding, int4 weights, the toy Llama generating
#
# What you will learn:
# - **prefill vs decode**: the same weights multiply thousands of prompt tokens at once, then one new
#   token per sequence at a time; the first is compute-bound, the second reads all the weights for a
#   handful of FLOPs;
# - the decode step's **memory floor** (weights + KV cache read per token), and how **batching** shares
#   the weight reads among sequences until the KV cache dominates;
# - the **KV cache** as one preallocated `(B, H_kv, S_max, D)` tensor and a kernel that appends a token;
# - **MQA/GQA**: the bytes they save, and how a decode kernel loads each K/V tile once for a group of
#   query heads;
# - **flash-decoding**: the keys of a long context split across programs, each leaving a partial
#   `(max, sum, accumulator)`, merged with lesson 05's rule; and **split-K** for skinny matmuls;
# - an **int4 weight-only GEMV** with group scales, dequantized in registers (lesson 07's packing);
# - the toy Llama **generating tokens** with a static KV cache, the course's kernels and the decode step
#   replayed from a **CUDA graph**, against Hugging Face `generate`.
#
# The exercises are in [exercises/09_decoding.ipynb](../exercises/09_decoding.ipynb).

# %% [setup]

# %%
import math

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl

from course_utils import half_dtype, size
from course_utils.bench import load_results, show_results
from course_utils.lessons.l02_first_kernels import GRID_AXIS_MAX  # noqa: F401 - read by w8a16_gemv below
from course_utils.shapes import expect_contiguous, expect_shapes, expect_unit_stride  # noqa: F401 - read by w8a16_gemv
from course_utils.lessons.l03_matmul import sm_count
from course_utils.lessons.l05_online_softmax import kv_cache_bytes, merge_stats
from course_utils.llama import toy_config, toy_llama

dev = mode.device
half = half_dtype()  # bf16 where the GPU computes with it, fp16 otherwise (and in the interpreter)

# %% [markdown]
# ## Prefill vs decode
#
# Serving a request has two phases with the same weights. **Prefill** runs the prompt: M = thousands of
# tokens multiply every weight matrix in one matmul, about 2 FLOPs per weight per token, so a weight
# loaded once serves thousands of FLOPs: compute-bound, lesson 03's regime. **Decode** then produces one
# token per sequence per step: M = the batch, 1 to 16 here. Every step still reads every weight, for
# 2 x M FLOPs each. The arithmetic intensity of a `(M, K) @ (K, N)` matmul in bf16, for Llama-3-8B's
# up projection, with `matmul_intensity` from lesson 01's exercise
# [01.matmul_intensity](../exercises/01_strides_and_intensity.ipynb#01.matmul_intensity:-FLOPs-per-byte-of-a-matmul) (imported here; its solution is in
# `solutions/01_strides_and_intensity.ipynb`):

# %%
from course_utils.lessons.l01_strides_and_intensity import matmul_intensity  # noqa: E402

h100_flops, h100_bandwidth = 989e12, 3.35e12  # H100 SXM datasheet: dense bf16 FLOP/s, HBM3 bytes/s
for M in (4096, 512, 16, 4, 1):
    phase = "prefill" if M >= 512 else "decode"
    print(f"M = {M:>5} ({phase}): {matmul_intensity(M, 14336, 4096, 2):7.1f} FLOP/byte")
print(f"an H100's ridge point (datasheet peak / bandwidth): {h100_flops / h100_bandwidth:.0f} FLOP/byte")

# %% [markdown]
# ## The decode step's memory floor
#
# Below the ridge point the time is the bytes divided by the bandwidth. One decode step reads every
# weight once (all sequences of the batch multiply the same matrices, so a batch shares the read) and
# every sequence's own KV cache. That sum over the bandwidth is the floor; exercise
# [09.decode_floor](../exercises/09_decoding.ipynb#09.decode_floor:-the-memory-floor-of-a-decode-step) writes it down.
#
# Its sibling for prefill, in full: a prompt of T tokens does 2 FLOPs per weight per token and reads the
# weights once, so the floor is the larger of the compute time and the memory time (the roofline of
# lesson 01):

# %%
def prefill_floor(tokens: int, n_params: float, bytes_per_param: float, peak_flops: float,
                  bandwidth: float) -> float:
    """Seconds of a prefill of `tokens` tokens at the roofline: max(FLOPs / peak, weight bytes / bandwidth)."""
    flops = 2 * tokens * n_params  # one multiply-add per weight per token
    return max(flops / peak_flops, n_params * bytes_per_param / bandwidth)


for tokens in (1, 16, 256, 4096):
    ms = prefill_floor(tokens, 8e9, 2, 989e12, 3.35e12) * 1e3
    print(f"Llama-3-8B, {tokens:>4} tokens at once: {ms:7.2f} ms at the roofline, {ms / tokens:.3f} ms per token")

# %% [markdown]
# Batching is why serving systems decode many sequences together: the weight bytes are paid once per
# step whatever the batch, so tokens per second grow almost linearly with the batch, until the KV caches
# (which grow with batch x context) are the larger read. The floor below uses `decode_floor`, the
# function exercise 09.decode_floor asks you for: here the course's solution is imported (its code is
# in `solutions/09_decoding.ipynb`):

# %%
from course_utils.lessons.l09_decoding import decode_floor  # noqa: E402

bytes_per_token_8b = kv_cache_bytes(n_layers=32, n_kv_heads=8, head_dim=128)  # K and V, bf16
batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
fig, ax = plt.subplots(figsize=(7, 3.5))
for context in (512, 4096, 32768):
    rates = [b / decode_floor(b, 16.06e9, bytes_per_token_8b, context, 3.35e12) for b in batches]
    ax.plot(batches, rates, marker="o", label=f"context {context}")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("batch (sequences decoded together)")
ax.set_ylabel("tokens/s at the floor")
ax.set_title("Llama-3-8B bf16 at 3.35 TB/s: the floor of decoding throughput")
ax.legend()
plt.show()

# %% [markdown]
# On the toy Llama (one layer, so its KV cache is small beside the {{fact:toy weight MB}} MB of weights a
# step reads: all but the embedding table), this is what a GPU measured with the decode loop at the end
# of this lesson, against the same floor drawn from the measured copy bandwidth
# (`python -m course_utils bench 09`; on a CPU this shows the committed run):

# %%
results = load_results("09")
if results is None:
    print("no committed GPU results for lesson 09 yet")
else:
    rows = [r for r in results["rows"] if r["group"].startswith("toy Llama decode")]
    batch_of = {r["group"]: int(r["group"].split("batch ")[1].split(",")[0]) for r in rows}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, style in (("triton (ours) static cache + CUDA graph", "o-"),
                        ("memory floor (weights + KV cache at the copy bandwidth)", "k--"),
                        ("HF generate static cache + torch.compile", "s"), ("HF generate (dynamic cache)", "^")):
        points = sorted((batch_of[r["group"]], batch_of[r["group"]] / r["ms"] * 1e3) for r in rows if r["name"] == name)
        if points:
            ax.plot(*zip(*points), style, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"toy Llama decode on {results['device']}")
    ax.legend(fontsize=7)
    plt.show()

# %% [markdown]
# Measured on {{measured}}: our decode loop made {{fact:tokens_per_s triton (ours) static cache + CUDA graph batch 1}}
# tokens/s at batch 1 and {{fact:tokens_per_s triton (ours) static cache + CUDA graph batch 16}} at batch 16, against a floor of
# {{fact:floor tokens_per_s batch 1}} and {{fact:floor tokens_per_s batch 16}}: the larger batch made many more tokens from the
# same weight reads. The toy model's 1024-wide layer is small work per kernel, so the step is far above
# its floor: some thirty short kernels, each paying its ramp-up. Hugging Face `generate` made
# {{fact:tokens_per_s HF generate (dynamic cache) batch 1}} tokens/s (dynamic cache) and
# {{fact:tokens_per_s HF generate static cache + torch.compile batch 1}} (static cache, its decode step compiled by `generate`
# itself: transformers' `CompileConfig`, whose default mode, `"reduce-overhead"`, replays CUDA graphs) at
# batch 1; ours ran {{ratio:toy Llama decode bf16 batch 1, 512 new tokens|triton (ours) static cache + CUDA graph|HF generate static cache + torch.compile}}
# the speed of the compiled peer at batch 1 and {{ratio:toy Llama decode bf16 batch 16, 512 new tokens|triton (ours) static cache + CUDA graph|HF generate static cache + torch.compile}}
# at batch 16.

# %% [markdown]
# ## The KV cache as a preallocated tensor
#
# Attention of a new token needs the keys and values of every earlier token. Recomputing them would
# redo the whole prefix each step; the KV cache stores them. A serving engine allocates it once, for the
# longest sequence it will hold: one `(B, H_kv, S_max, D)` tensor per layer for K and one for V, and each
# step writes the new token's row at its own position. Nothing is reallocated or concatenated (HF's
# default `DynamicCache` concatenates every step: a copy of the whole cache, and shapes that change, which
# a CUDA graph cannot replay). Its size, with lesson 05's `kv_cache_bytes`:

# %%
cfg = toy_config()
toy_head_dim = cfg.hidden_size // cfg.num_attention_heads
for name, layers, kv_heads, head_dim in (("toy Llama", cfg.num_hidden_layers, cfg.num_key_value_heads, toy_head_dim),
                                         ("Llama-3-8B", 32, 8, 128)):
    per_token = kv_cache_bytes(layers, kv_heads, head_dim)
    full = kv_cache_bytes(layers, kv_heads, head_dim, tokens=8192, batch=16)
    print(f"{name:>10}: {per_token / 1024:6.0f} KiB per token; batch 16 x 8192 tokens: {full / 2**30:6.2f} GiB")

# %% [markdown]
# Appending is a scatter of one row per (sequence, head): exercise
# [09.kv_append](../exercises/09_decoding.ipynb#09.kv_append:-write-a-token-into-the-KV-cache). Its sibling in full: copy row `i` of a table `src`
# to row `index[i]` of a table `dst`, both with any strides, the index read on the device (so the same
# launch can be replayed with other indices: no host `int(index[i])`).

# %%
@triton.jit
def row_scatter_kernel(src_ptr, dst_ptr, index_ptr, n_cols, stride_sr, stride_sc, stride_dr, stride_dc,
                       BLOCK: tl.constexpr):
    i = tl.program_id(0)  # one source row per program
    target = tl.load(index_ptr + i).to(tl.int64)  # where it goes, read on the device
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    row = tl.load(src_ptr + i * stride_sr + offs * stride_sc, mask=mask)
    tl.store(dst_ptr + target * stride_dr + offs * stride_dc, row, mask=mask)


def row_scatter(src: torch.Tensor, dst: torch.Tensor, index: torch.Tensor) -> None:
    """dst[index[i], :] = src[i, :]; every other row of dst is left as it was."""
    rows, cols = src.shape
    row_scatter_kernel[(rows,)](src, dst, index, cols, *src.stride(), *dst.stride(),
                                BLOCK=triton.next_power_of_2(cols))


table = torch.zeros(6, 5, device=dev)
row_scatter(torch.arange(10.0, device=dev).view(2, 5), table, torch.tensor([4, 1], device=dev, dtype=torch.int32))
print(table)

# %% [markdown]
# ## MQA and GQA: one K/V load for a group of query heads
#
# Multi-head attention gives every query head its own K/V head. **Multi-query attention** (MQA) keeps one
# K/V head for all of them; **grouped-query attention** (GQA, Llama-2-70B and Llama-3) keeps `H_kv` heads,
# each shared by `H_q / H_kv` consecutive query heads: query head `h` reads K/V head `h // (H_q / H_kv)`.
# The cache, and the bytes a decode step reads from it, shrink by `H_q / H_kv`:

# %%
for name, kv_heads in (("MHA", 32), ("GQA 32 on 8", 8), ("MQA", 1)):
    per_token = kv_cache_bytes(32, kv_heads, 128)
    ms = per_token * 8192 * 16 / 3.35e12 * 1e3
    print(f"{name:>12}: {per_token / 1024:5.0f} KiB per token; reading batch 16 x 8192 tokens at 3.35 TB/s: {ms:6.1f} ms")

# %% [markdown]
# Saving the bytes in memory is half the story; the kernel must also not read them more than once. A
# kernel with one program per *query* head loads each K/V tile `H_q / H_kv` times (from L2 if lucky).
# One program per *K/V head* loads the tile once and multiplies it by all the query heads of the group:
# a `(group, D)` block of q against a `(BLOCK_N, D)` tile of K is a small matmul for `tl.dot` (Triton pads
# a group of fewer rows than the tensor core's tile itself). That is exercise
# [09.decode_attention](../exercises/09_decoding.ipynb#09.decode_attention:-flash-decoding-for-GQA).
#
# Its sibling in full: plain multi-head decode attention, one program per (sequence, head), lesson 05's
# online softmax over the keys of the sequence, the dot products as a broadcast multiply and a sum
# (a program holds one query row, a vector: the multiply and sum need no `tl.dot`), no splitting:

# %%
@triton.jit
def mha_decode_kernel(q_ptr, k_ptr, v_ptr, len_ptr, out_ptr, H, qk_scale,
                      stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                      stride_ob, stride_oh, D: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    length = tl.load(len_ptr + b)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_d[None, :]).to(tl.float32)  # (1, D)
    m_i = tl.full((1,), float("-inf"), dtype=tl.float32)  # running max, sum and output of the one row
    l_i = tl.zeros((1,), dtype=tl.float32)
    acc = tl.zeros((1, D), dtype=tl.float32)
    for n0 in range(0, length, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        inside = offs_n < length
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
                    mask=inside[:, None], other=0.0).to(tl.float32)  # (BLOCK_N, D)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                    mask=inside[:, None], other=0.0).to(tl.float32)
        scores = tl.where(inside, tl.sum(k * q, axis=1) * qk_scale, float("-inf"))[None, :]  # (1, BLOCK_N)
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])  # (1, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(tl.trans(p) * v, axis=0)[None, :]
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d[None, :], out.to(out_ptr.dtype.element_ty))


def mha_decode(q, cache_k, cache_v, lengths, out, BLOCK_N: int = 32):
    """q (B, H, D), caches (B, H, S_max, D) with unit last stride, lengths (B,) int32 -> out (B, H, D)."""
    B, H, D = q.shape
    mha_decode_kernel[(B * H,)](q, cache_k, cache_v, lengths, out, H, D**-0.5, q.stride(0), q.stride(1),
                                *cache_k.stride()[:3], *cache_v.stride()[:3], out.stride(0), out.stride(1),
                                D=D, BLOCK_N=BLOCK_N)


B, H, S_max, D = 2, 4, 50, 16
q = torch.randn(B, H, D, device=dev)
cache_k, cache_v = torch.randn(B, H, S_max, D, device=dev), torch.randn(B, H, S_max, D, device=dev)
lengths = torch.tensor([7, 50], device=dev, dtype=torch.int32)
out = torch.empty(B, H, D, device=dev)
mha_decode(q, cache_k, cache_v, lengths, out)
for b in range(B):
    n = int(lengths[b])
    ref = torch.softmax(q[b, :, None] @ cache_k[b, :, :n].transpose(1, 2) / D**0.5, -1) @ cache_v[b, :, :n]
    print(f"sequence {b} (length {n}): max error {(out[b] - ref[:, 0]).abs().max().item():.2e}")

# %% [markdown]
# ## Flash-decoding: split the keys, merge the partials
#
# `mha_decode` runs `B x H` programs, one per query head; a GQA kernel with one per K/V head runs
# `B x H_kv`. At B = 8 with 8 K/V heads that is 64 programs for a GPU with 132 SMs, and each walks a
# context of 8192 keys alone: most of the GPU idles and the bandwidth is never reached. Flash-decoding (Dao et al., 2023) also splits the *keys*: program `(b, kv head, split)` runs the
# online softmax over its slice only and writes a partial `(m_i, l_i, acc_i)` per query head (its max,
# its sum of `exp(s - m_i)`, its unnormalized `sum exp(s - m_i) v`). A second, tiny kernel merges the
# partials of each head with lesson 05's rule, which works for the accumulator as for the sum:
#
#     m = max_i m_i        l = sum_i exp(m_i - m) l_i        out = sum_i exp(m_i - m) acc_i / l
#
# A split past the sequence's length holds nothing: `(-inf, 0, 0)`, and `exp(-inf - m) = 0` drops it.
# When one split holds every key (a short context, or enough sequences and heads to fill the GPU),
# the first kernel normalizes and writes the output itself: one launch instead of two.
#
# Measured ({{measured}}) at B = 8, 32 query heads on 8 K/V heads, D = 128: at a context of 8192 our
# kernel read the K/V bytes at {{ratio:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 8192|triton (ours) vs copy|copy ceiling (K/V bytes)}} the copy bandwidth and ran
# {{ratio:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 8192|triton (ours)|fastest}} the speed of the faster of SDPA (`enable_gqa`) and torch.compile. At a context of
# 1024 the GPU's work is short: replayed from a CUDA graph ours took {{us:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours) [graph]}},
# {{ratio:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours) [graph]|fastest}} the speed of the fastest peer (`{{peer:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours) [graph]}}`), and launched plainly {{ratio:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours)|fastest}}
# ({{us:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours)}}; the plain SDPA took {{us:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|SDPA enable_gqa}}, in a graph
# {{us:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|SDPA enable_gqa [graph]}}). The difference between a plain and a graph row of one side is the
# cost of launching from Python that a CUDA graph removes (lesson 04); at microseconds of GPU work it
# can decide a ranking, which is why both are measured.
#
# Against a copy that moves as many bytes as the K/V cache holds, the short context is the hard case: at
# 1024 ours read the K/V bytes at
# {{ratio:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours) vs copy|copy ceiling (K/V bytes)}}
# the copy bandwidth on the H200 and {{ratio@h100:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours) vs copy|copy ceiling (K/V bytes)}}
# on the H100: the target of 0.8 was {{verdict:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours) vs copy|copy ceiling (K/V bytes)}}
# on the H200 and {{verdict@h100:decode attention bf16 B=8 H_q=32 H_kv=8 D=128 context 1024|triton (ours) vs copy|copy ceiling (K/V bytes)}} on the H100. A profile with Nsight Compute on the
# H100 (`results/explore/README.md`) shows where the time goes: the split kernel kept the memory at
# about two thirds of its peak bandwidth with few warps resident, and the merge is a second, short
# kernel, whose start and tail weigh more when the whole step lasts only microseconds. The merge is
# the smaller part: a version in which the last split program of each (sequence, K/V head) merges the
# partials itself (an atomic counter tells it that it is last), one launch instead of two, was only
# slightly faster on the H100 (`results/explore/decode_attention_one_launch.h100.json`), and no split
# count, key tile or warp count moved the split kernel much. Starting the merge early with
# programmatic dependent launch (on Hopper a kernel can launch while the one before it finishes and
# wait for it inside) gained about as little (`results/explore/decode_launch_gaps.h100.json`). And
# a kernel that does nothing but read all the K/V bytes once takes most of the time the target
# allows (`results/explore/read_floors.h100.json`, H100), which leaves about a microsecond for the
# softmax, the merge and its launch.
#
# Lesson 05's `merge_stats` does the `(m, l)` half on numbers:

# %%
scores = torch.randn(300, dtype=torch.float64) * 3
parts = [scores[i:i + 64] for i in range(0, 300, 64)]
m, l = -math.inf, 0.0
for part in parts:
    m, l = merge_stats(m, l, part.max().item(), torch.exp(part - part.max()).sum().item())
print(f"merged: m = {m:.6f}, l = {l:.6f}; in one pass: {scores.max().item():.6f}, "
      f"{torch.exp(scores - scores.max()).sum().item():.6f}")

# %% [markdown]
# ## Split-K for skinny matmuls
#
# The same trick serves the decode step's matmuls. With M = 1..16 rows, a `(M, K) @ (K, N)` matmul tiled
# over N alone gives `N / BLOCK_N` programs: 64 for the toy Llama's 1024-wide output projection at one
# row (`BLOCK_N = 16`), 16 at 2 to 16 rows (`BLOCK_N = 64`). Split-K
# gives each program a slice of K too, and the partial sums of the slices meet in an fp32 output with
# atomic adds (sums in another order each run: fine for decoding, not for a bitwise-reproducible run).
# The decode loop below uses it for every projection:

# %% [inline] course_utils.lessons.l09_decoding: skinny_linear_kernel skinny_linear

# %%
x = torch.randn(3, 1000, device=dev)
w = torch.randn(70, 1000, device=dev)
y = torch.empty(3, 70, device=dev)
skinny_linear(x, w, y, split_k=4)
print(f"skinny_linear, 4 K slices: max error {(y - x @ w.T).abs().max().item():.2e}")

# %% [markdown]
# ## int4 weights with group scales
#
# Decoding is the bytes of the weights, so fewer bits per weight is speed. Lesson 07's W8A16 GEMV halved
# them; int4 halves them again. With 16 levels, one scale per row would waste them on the row's largest
# weight, so each row is cut into **groups** of `group_size` consecutive weights (128 is common: GPTQ, AWQ)
# with a scale each: `W[n, k] = (q - 8) * scale[n, k // group_size]`, q an unsigned nibble 0..15, two per
# byte in lesson 07's order (`07.pack_int4`: even k in the low nibble). In bf16 a weight costs 2 bytes;
# here half a byte plus 2 bytes of scale per 128 weights:

# %%
for name, bits in (("bf16", 16), ("int8 per row", 8 + 32 / 4096), ("int4 group 128", 4 + 16 / 128)):
    mb = 14336 * 4096 * bits / 8 / 1e6
    print(f"{name:>15}: {mb:6.1f} MB for Llama-3-8B's up projection; {mb / 3.35e6 * 1e6:5.1f} us at 3.35 TB/s")

# %% [inline] course_utils.lessons.l09_decoding: quantize_int4_ref dequantize_int4_ref

# %% [markdown]
# The kernel never writes the dequantized matrix: it loads packed bytes, splits them with `& 0xF` and
# `>> 4` in registers, multiplies by x, and applies a group's scale to sums of products, never to one
# weight at a time (the exercise asks for once per group; the solution scales each word's sum). That is
# exercise [09.w4a16_gemv](../exercises/09_decoding.ipynb#09.w4a16_gemv:-an-int4-GEMV-with-group-scales). Its sibling in full is lesson 07's int8 GEMV,
# one scale per row, applied once per output (the next cell).
#
# At the bytes alone, int4 would run four times as fast as a bf16 GEMV: it reads a quarter of the bytes.
# The course's target for this kernel is 2.5 times the speed of cuBLAS's bf16 GEMV on the same matrix
# (one token against Llama-3-8B's up projection, group 128): less than four, since the scales and the
# unpacking cost work, but enough that the bytes saved show up as time saved, the one reason to quantize
# the weights of a memory-bound decode step.
#
# The solution's kernel has two paths. The first works in fp32, one weight at a time: it drops a nibble
# into the mantissa of the float 1.0 with one AND-OR, subtracts, and multiplies by x: three arithmetic
# instructions per weight, about five in all with the loads, the addresses and the sums (counted by
# Nsight Compute). Under Nsight Compute on the H100 (`results/explore/README.md`,
# `ncu_gemv.h100.csv`) that path used under half of the memory's peak bandwidth and issued an
# instruction on under half of its cycles: its running sums take so many registers that only a few
# programs fit on an SM, and each warp waits on its own
# chain of dependent instructions. More warps, narrower tiles, split-K, one scale per group applied to
# each thread's sum, loading the next step's words into registers ahead: all slower
# (`gemv_warps.h100.json`, `w4_variants.h100.json`, `gemv_register_prefetch.h100.json`). The limit was
# the work per weight, not the bytes: a read of the same packed bytes with no arithmetic took much less
# time than the kernel.
#
# So the second path, for bf16 x on a GPU of compute capability 8.0 or more, does the work two weights
# at a time, as the fastest int4 kernels do (FasterTransformer's and Marlin's dequantizers), in a few
# lines of inline PTX (`tl.inline_asm_elementwise`). `(word >> 4j) & 0x000F000F | 0x43004300` puts
# nibbles j and j + 4 of a word into the mantissas of two bf16 numbers whose exponent makes them
# 128 + q (bf16 has 7 mantissa bits: a nibble fits exactly), one `LOP3` instruction; one packed FMA by
# 1.0 and -136 leaves the two (q - 8), exactly; one more packed FMA multiplies them by two values of x and
# adds them to a running pair of bf16 sums. Eighteen arithmetic instructions for a word of 8 weights, where
# the fp32 path has about 25 (all instructions counted by Nsight Compute: 31 per word, against about 40);
# the pair's sums, rounded to bf16 after each of four products, are added in fp32
# once per word (an error of the size that the check allows a kernel that rounds each weight to x's
# dtype, as GPTQ's and AWQ's do). With fewer registers per weight the programs can be small: 4 rows of
# W and 512 weights a step, one warp, 3584 programs at N = 14336 where the fp32 path has 224; loads of
# some cover the arithmetic of others, and the loop over K is unrolled four times
# (`tl.range(..., loop_unroll_factor=4)`) so that a program's next loads can be issued before this
# step's arithmetic. At the fp32 path's tiles the bf16x2 path was a little faster, at the small tiles
# much faster, while the fp32 path at the small tiles was slower than at its own
# (`results/explore/w4_bf16x2_*.json`).
#
# Measured ({{measured}}) and replayed from a CUDA graph, as the target is judged, the solution's kernel
# ran {{ratio:w4a16 GEMV 1x4096 @ (14336x4096).T group 128|triton (ours) [graph]|torch.matmul bf16 (cuBLAS) [graph]}}
# the speed of cuBLAS's bf16 GEMV on the H200 ({{us:w4a16 GEMV 1x4096 @ (14336x4096).T group 128|triton (ours) [graph]}} against {{us:w4a16 GEMV 1x4096 @ (14336x4096).T group 128|torch.matmul bf16 (cuBLAS) [graph]}}),
# where the target of 2.5 was {{verdict:w4a16 GEMV 1x4096 @ (14336x4096).T group 128|triton (ours) [graph]|torch.matmul bf16 (cuBLAS) [graph]}}, and {{ratio@h100:w4a16 GEMV 1x4096 @ (14336x4096).T group 128|triton (ours) [graph]|torch.matmul bf16 (cuBLAS) [graph]}}
# on the H100 ({{us@h100:w4a16 GEMV 1x4096 @ (14336x4096).T group 128|triton (ours) [graph]}} against {{us@h100:w4a16 GEMV 1x4096 @ (14336x4096).T group 128|torch.matmul bf16 (cuBLAS) [graph]}}), where it was
# {{verdict@h100:w4a16 GEMV 1x4096 @ (14336x4096).T group 128|triton (ours) [graph]|torch.matmul bf16 (cuBLAS) [graph]}}. The two GPUs have the same SMs at about the same
# clock and different memories (HBM3e against HBM3, datasheets): cuBLAS's bf16 GEMV, bound by its bytes,
# is much faster on the H200, and ours, bound more by its work than by its bytes, only a little, so the
# same kernel's ratio is lower on the H200. There, a plain read of the packed bytes took
# less time than the target allows (`gemv_read_floor.h200.json`): the target is within reach of a
# kernel whose arithmetic hides entirely behind its loads; ours is not that kernel yet.

# %% [inline] course_utils.lessons.l07_fp8_quantization: quantize_int8_ref w8a16_gemv_kernel w8a16_gemv

# %%
w = torch.randn(300, 512, device=dev) * 0.02
w_int8, scale = quantize_int8_ref(w)
x = torch.randn(1, 512, device=dev).to(half)
y = torch.empty(1, 300, device=dev, dtype=half)
w8a16_gemv(x, w_int8, scale, y, BLOCK_N=8, BLOCK_KW=64)
print(f"W8A16: max error {(y.float() - x.float() @ (w_int8.float() * scale[:, None]).T).abs().max().item():.2e}")
w_packed, scales = quantize_int4_ref(w, 128)
print(f"int4 group 128: {w_packed.numel()} bytes instead of {w.numel() * 2} in bf16; round trip error "
      f"{(dequantize_int4_ref(w_packed, scales, 128) - w).abs().max().item():.2e} (weights of scale 0.02)")

# %% [markdown]
# ## The toy Llama generating tokens
#
# Now the whole decode step on the course's kernels: `StaticCacheLlama` holds the weights, a static KV
# cache per layer and every activation buffer, allocated once. `step()` embeds the current tokens,
# and per layer runs RMSNorm (lesson 06), the fused QKV projection (`skinny_linear`), the rotary
# embedding (a few torch ops), `kv_append`, `decode_attention`, the output projection added into the
# residual, the MLP (lesson 04's `silu_mul` between skinny matmuls), then the LM head and a greedy argmax.
# The prompt itself (prefill) runs through the Hugging Face model, whose keys and values are copied
# into the static cache.
#
# A step is about 30 small kernel launches: at a few microseconds of CPU time each, launching alone
# would cost more than the GPU's work at batch 1. Because nothing in `step()` depends on the host (the
# positions and token ids live on the device, and every temporary it makes has the same size at every
# step), it can be recorded once in a **CUDA graph** and replayed as one launch per token (lesson 04).

# %%
# The kernels the step runs: lesson 06's RMSNorm, lesson 04's silu_mul, and this lesson's exercises
# (the course's solutions, imported; their code is in solutions/09_decoding.ipynb, and in your exercise
# notebook the same decode loop runs on your `kv_append` and `decode_attention`).
from course_utils.lessons.l04_fusion import silu_mul  # noqa: E402, F401
from course_utils.lessons.l06_fused_rmsnorm_mlp import rmsnorm  # noqa: E402, F401
from course_utils.lessons.l09_decoding import decode_attention, kv_append  # noqa: E402, F401

# %% [inline] course_utils.lessons.l09_decoding: _hf_cache_layer StaticCacheLlama

# %% [markdown]
# Greedy decoding must give Hugging Face's tokens. In fp32 on the small toy config (the CPU) they are
# the same token for token (the course's tests assert it). In bf16 they are not: our residual stream
# stays in fp32 (`self.x`) while Hugging Face rounds it to bf16 after every layer, so the logits differ in
# their last bits, and a random toy model's logits are full of near-ties. Once one argmax flips, the two
# sequences continue from different tokens and part for good. On {{measured}} the first
# differing token came after {{fact:first differing token batch 1}} new tokens at batch 1 (one sequence), and only
# {{fact:token agreement batch 1}} of the 512 new tokens matched.

# %%
small = not mode.gpu
model = toy_llama(small=small, dtype=torch.float32 if small else half, device=dev)
batch, prompt_len, new_tokens = (2, 5, 4) if small else (4, 16, 64)
prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device=dev)
decoder = StaticCacheLlama(model, batch, prompt_len + new_tokens)
ours = decoder.generate(prompt, new_tokens)
theirs = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                        pad_token_id=0)
same = (ours[:, prompt_len:] == theirs[:, prompt_len:]).float().mean().item()
print(f"{'CUDA graph' if mode.gpu else 'interpreter'}: {same:.0%} of the new tokens equal HF generate's")
print(ours[:, prompt_len:])

# %% [markdown]
# ## Benchmarks
#
# `python -m course_utils bench 09` times, on a GPU, decode attention against the copy bandwidth of the
# K/V bytes and against `scaled_dot_product_attention(..., enable_gqa=True)` (eager and compiled), the int4
# GEMV against cuBLAS's bf16 GEMV on the same matrix, and the toy Llama's decode loop against Hugging
# Face `generate` with its dynamic cache and with a static cache and `torch.compile`. Launch-bound work is
# timed both plainly and replayed from a CUDA graph. These are the committed results:

# %%
show_results("09")
