# %% [markdown]
# # Lesson 09 exercises: the decode step, a KV-cache append, flash-decoding for GQA, an int4 GEMV
#
# Generating a token runs the whole model on **one** new token per sequence (M = batch = 1..16 rows)
# and reads every weight and the whole KV cache to do it: memory-bound work. Four exercises, each
# checked by `check(...)` on fresh inputs:
# - `09.decode_floor`: the time of one decode step at the memory floor, in plain Python;
# - `09.kv_append`: a Triton kernel that writes the new token's K and V into a preallocated cache;
# - `09.decode_attention`: attention of one query token per sequence against its cache, for grouped-query
#   attention, with the keys split across programs (flash-decoding) and the partial results merged;
# - `09.w4a16_gemv`: a GEMV on int4 weights with group scales, dequantized in registers.
#
# Kernel exercises use destination passing, as in every lesson: your host function receives its inputs
# and the output buffers the checker allocated, and writes into them. The lesson is
# [notebooks/09_decoding.ipynb](../notebooks/09_decoding.ipynb). At the end, code that is not an exercise:
# a split-K skinny matmul and the toy Llama's decode loop, which runs on your `kv_append` and
# `decode_attention`; the last cell generates a few tokens with it.

# %% [setup]

# %%
from course_utils import check, current, progress  # noqa: F401
from course_utils.shapes import expect_contiguous, expect_shapes  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from course_utils.lessons.l02_first_kernels import GRID_AXIS_MAX  # noqa: E402
from course_utils.lessons.l03_matmul import sm_count  # noqa: E402
from course_utils.lessons.l04_fusion import silu_mul  # noqa: E402
from course_utils.lessons.l05_online_softmax import stages_that_fit  # noqa: E402
from course_utils.lessons.l06_fused_rmsnorm_mlp import rmsnorm  # noqa: E402

# %% [markdown]
# ## 09.decode_floor: the memory floor of a decode step
#
# `decode_floor(batch, weight_bytes, kv_bytes_per_token, context, bandwidth) -> float`.
#
# Taught in the lesson's [The decode step's memory floor](../notebooks/09_decoding.ipynb#The-decode-step's-memory-floor).
#
# One decode step reads every weight once (shared by all `batch` sequences: they multiply the same
# matrices) and, for attention, the KV cache of every sequence: `context` tokens of
# `kv_bytes_per_token` bytes each (K and V, all layers, all K/V heads). Return the seconds this takes
# when memory runs at `bandwidth` bytes per second and nothing else costs anything: a float. The other
# reads and writes (activations, logits) are small beside these two; leave them out.

# %%
def decode_floor(batch: int, weight_bytes: float, kv_bytes_per_token: float, context: int,
                 bandwidth: float) -> float:
    """Seconds of one decode step at the memory floor: weights once, every sequence's KV cache."""
    # BEGIN SOLUTION
    kv_bytes = batch * context * kv_bytes_per_token  # every sequence reads its own cache
    return (weight_bytes + kv_bytes) / bandwidth  # the weights are read once for the whole batch
    # END SOLUTION


# %% [check] 09.decode_floor

# %% [markdown]
# ## 09.kv_append: write a token into the KV cache
#
# `kv_append(k_new, v_new, cache_k, cache_v, positions)`.
#
# Taught in the lesson's [The KV cache as a preallocated tensor](../notebooks/09_decoding.ipynb#The-KV-cache-as-a-preallocated-tensor).
#
# - `k_new`, `v_new`: (B, H_kv, D), the new token's keys and values, **any strides** (in a model they are
#   slices of one fused QKV output), and either may be wider than the caches (the toy Llama's decode step
#   below rotates its keys in fp32 and appends fp32 `k_new` to a bf16 cache): a store rounds to the cache's dtype;
# - `cache_k`, `cache_v`: (B, H_kv, S_max, D), **any strides**; they are inputs *and* outputs: write
#   `cache_k[b, :, positions[b], :] = k_new[b]` (and the same for V) and **nothing else**. The rest of the
#   cache holds the earlier tokens: the check fills it with values that must still be there afterwards;
# - `positions`: (B,) int32 on the device, each in 0..S_max-1: where sequence b's new token goes (the
#   sequences of a batch have different lengths, so each has its own position).
#
# Read `positions[b]` inside the kernel (`tl.load`): the host must not read device memory (that would
# stop a CUDA graph from replaying the step). D need not be a power of 2: mask it.

# %%
@triton.jit
def kv_append_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, pos_ptr, H, D,
                     stride_kb, stride_kh, stride_kd, stride_vb, stride_vh, stride_vd,
                     stride_ckb, stride_ckh, stride_cks, stride_ckd,
                     stride_cvb, stride_cvh, stride_cvs, stride_cvd, BLOCK_D: tl.constexpr):
    # BEGIN SOLUTION
    pid = tl.program_id(0)  # one program per (sequence, K/V head): B * H_kv programs of D values
    b = (pid // H).to(tl.int64)  # b * stride_ckb can pass 2^31 on a large cache
    h = pid % H
    pos = tl.load(pos_ptr + b).to(tl.int64)  # this sequence's slot, read on the device
    offs_d = tl.arange(0, BLOCK_D)
    mask = offs_d < D
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_d * stride_kd, mask=mask)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_d * stride_vd, mask=mask)
    ck = ck_ptr + b * stride_ckb + h * stride_ckh + pos * stride_cks  # the row cache_k[b, h, pos, :]
    cv = cv_ptr + b * stride_cvb + h * stride_cvh + pos * stride_cvs
    tl.store(ck + offs_d * stride_ckd, k.to(ck_ptr.dtype.element_ty), mask=mask)
    tl.store(cv + offs_d * stride_cvd, v.to(cv_ptr.dtype.element_ty), mask=mask)
    # END SOLUTION


def kv_append(k_new: torch.Tensor, v_new: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
              positions: torch.Tensor) -> None:
    """cache_k[b, :, positions[b], :] = k_new[b] and the same for V; nothing else of the caches changes."""
    B, H, D = k_new.shape  # (B, H_kv, D)
    expect_shapes("kv_append", v_new=(v_new, k_new.shape), cache_k=(cache_k, (B, H, cache_k.shape[2], D)),
                  cache_v=(cache_v, cache_k.shape), positions=(positions, (B,)))
    expect_contiguous("kv_append", positions=positions)
    # BEGIN SOLUTION
    kv_append_kernel[(B * H,)](
        k_new, v_new, cache_k, cache_v, positions, H, D, *k_new.stride(), *v_new.stride(),
        *cache_k.stride(), *cache_v.stride(), BLOCK_D=triton.next_power_of_2(D))
    # END SOLUTION


# %% [check] 09.kv_append

# %% [markdown]
# ## 09.decode_attention: flash-decoding for GQA
#
# `decode_attention(q, cache_k, cache_v, lengths, out)`.
#
# Taught in the lesson's [MQA and GQA: one K/V load for a group of query heads](../notebooks/09_decoding.ipynb#MQA-and-GQA:-one-K/V-load-for-a-group-of-query-heads)
# and [Flash-decoding: split the keys, merge the partials](../notebooks/09_decoding.ipynb#Flash-decoding:-split-the-keys,-merge-the-partials).
#
# One new query token per sequence attends to that sequence's cached keys:
# `out[b, h] = softmax(q[b, h] . K[b, g(h), :L_b]^T / sqrt(D)) @ V[b, g(h), :L_b]` where
# - `q`: (B, H_q, D), any strides (a view of a fused QKV projection's output); `out`: (B, H_q, D), any
#   strides, written by you; `cache_k`, `cache_v`: (B, H_kv, S_max, D), **any strides**; `lengths`: (B,)
#   int32 on the device, `1 <= lengths[b] <= S_max`: only the first `lengths[b]` keys of sequence b are valid; **the
#   rest of the cache holds garbage** (other requests' old tokens, or NaN in memory never written): mask
#   its loads, not only its scores (p = 0 times NaN is NaN);
# - grouped-query attention: `H_q` is a multiple of `H_kv`, and query head `h` reads K/V head
#   `g(h) = h // (H_q // H_kv)`: consecutive query heads share a K/V head (Llama's `repeat_kv`).
#   `H_kv = H_q` is plain multi-head attention, `H_kv = 1` multi-query attention;
# - `D` is a power of 2, at least 16 (so `tl.dot` works); the softmax scale is `1 / sqrt(D)`.
#
# Make it fast the flash-decoding way: one program per (sequence, K/V head, split) loads its share of
# the keys **once** for all the query heads of the group (a `(group, D)` block of q, its rows padded to a
# power of 2 for `tl.arange`; under MQA the group is every query head, 48 in StarCoder, 71 in Falcon-7B;
# `tl.dot` pads fewer than 16 rows itself), runs lesson 05's online softmax
# over its keys in tiles of at least 16 (a tile is the K of the `P @ V` dot, and Triton refuses a K below
# 16 for 16-bit operands, on a GPU and in the course's interpreter mode) and writes a partial `(m, l, acc)` per
# query head; a second kernel merges the partials of each head with lesson 05's rule (rescale each by
# `exp(m_i - m)`; an empty split has `(-inf, 0, 0)`). Two kernel launches; temporaries for the partials
# are fine (when one split holds every key, the first kernel can write `out` itself and skip the merge).
# Read `lengths` inside the kernels, as 09.kv_append reads its positions: the host must not read device
# memory (no `lengths.max()` turned into a Python int to size the grid), or a CUDA graph could not replay
# the step; size the grid by `S_max`, and let a split with no valid keys write its empty partial.
# Compute in fp32; q and the caches are fp32, fp16 or bf16 (bf16 only on a GPU that computes with it;
# the interpreter's half-precision cases are fp16), and `out` has the caches' dtype. q's dtype may differ
# from theirs: the toy Llama's decode step below gives an fp32 q (from its fp32 projection) and caches in
# the model's bf16, and `tl.dot` takes two operands of one dtype, so cast q's block to the cache's.

# %%
@triton.jit
def decode_attention_split_kernel(q_ptr, k_ptr, v_ptr, len_ptr, part_ptr, out_ptr, H_kv, split_len, qk_scale,
                                  stride_qb, stride_qh, stride_qd, stride_kb, stride_kh, stride_ks, stride_kd,
                                  stride_vb, stride_vh, stride_vs, stride_vd, stride_ob, stride_oh, stride_od,
                                  GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                                  D: tl.constexpr, NUM_SPLITS: tl.constexpr):
    # BEGIN SOLUTION
    pid = tl.program_id(0)  # (sequence, K/V head)
    split = tl.program_id(1)
    b = (pid // H_kv).to(tl.int64)
    kvh = pid % H_kv
    length = tl.load(len_ptr + b)
    start = split * split_len
    end = tl.minimum(start + split_len, length)  # this split's keys: [start, end), maybe none

    offs_g = tl.arange(0, BLOCK_G)  # the GROUP query heads sharing K/V head kvh, padded for tl.dot
    offs_d = tl.arange(0, D)
    heads = kvh * GROUP + offs_g  # query head h reads K/V head h // GROUP
    g_mask = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=g_mask[:, None], other=0.0)  # (BLOCK_G, D)
    q = q.to(k_ptr.dtype.element_ty)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh

    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, D), dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):  # every tile holds at least one valid key
        keys = n0 + offs_n
        valid = keys < end
        k = tl.load(k_base + keys[:, None] * stride_ks + offs_d[None, :] * stride_kd,
                    mask=valid[:, None], other=0.0)  # (BLOCK_N, D): loaded once for the whole group
        v = tl.load(v_base + keys[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                    mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_G, BLOCK_N) fp32
        s = tl.where(valid[None, :], s, float("-inf"))  # keys past the length do not exist
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: the tile has a valid key
        alpha = tl.exp(m_i - m_new)  # rescale what was accumulated against the old max
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if NUM_SPLITS == 1:  # this program saw every key: normalize and write the output, no merge
        o = acc / l_i[:, None]
        o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:  # one fp32 partial row per (sequence, query head, split): acc (D values), then m, then l
        row = ((b * H_kv * GROUP + heads) * NUM_SPLITS + split) * (D + 2)  # (BLOCK_G,); empty: (0, -inf, 0)
        tl.store(part_ptr + row[:, None] + offs_d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_ptr + row + D, m_i, mask=g_mask)
        tl.store(part_ptr + row + D + 1, l_i, mask=g_mask)
    # END SOLUTION


@triton.jit
def decode_attention_merge_kernel(part_ptr, out_ptr, H_q, stride_ob, stride_oh, stride_od,
                                  D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    # BEGIN SOLUTION
    row = tl.program_id(0)  # one (sequence, query head)
    b = row // H_q
    h = row % H_q
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    s_mask = offs_s < NUM_SPLITS
    parts = part_ptr + (row * NUM_SPLITS + offs_s) * (D + 2)  # (BLOCK_S,) the partial rows of this head
    m = tl.load(parts + D, mask=s_mask, other=float("-inf"))  # (BLOCK_S,)
    l = tl.load(parts + D + 1, mask=s_mask, other=0.0)
    acc = tl.load(parts[:, None] + offs_d[None, :], mask=s_mask[:, None], other=0.0)  # (BLOCK_S, D)
    m_all = tl.max(m, axis=0)  # finite: split 0 holds key 0
    w = tl.exp(m - m_all)  # lesson 05's rule: each partial moved to the common max; empty -> 0
    total = tl.sum(l * w, axis=0)
    o = tl.sum(acc * w[:, None], axis=0) / total  # (D,)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od, o.to(out_ptr.dtype.element_ty))
    # END SOLUTION


def decode_attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, lengths: torch.Tensor,
                     out: torch.Tensor, num_splits: int | None = None, BLOCK_N: int | None = None,
                     num_warps: int = 4, num_stages: int = 3) -> None:
    """out (B, H_q, D) = softmax(q K^T / sqrt(D)) V over the first lengths[b] keys of each sequence (GQA)."""
    expect_shapes("decode_attention", cache_k=(cache_k, (q.shape[0], *cache_k.shape[1:3], q.shape[2])),
                  cache_v=(cache_v, cache_k.shape), lengths=(lengths, q.shape[:1]), out=(out, q.shape))
    expect_contiguous("decode_attention", lengths=lengths)
    B, H_q, D = q.shape
    H_kv, S_max = cache_k.shape[1], cache_k.shape[2]
    if D < 16 or D & (D - 1):
        raise ValueError(f"head dim {D}: this kernel needs a power of 2 >= 16 (tl.dot's smallest tile)")
    if H_q % H_kv:
        raise ValueError(f"{H_q} query heads cannot share {H_kv} K/V heads evenly: "
                         "H_q must be a multiple of H_kv")
    if out.numel() == 0:  # no sequences (B = 0) or no heads: nothing to write
        return
    # BEGIN SOLUTION
    group = H_q // H_kv
    block_g = max(16, triton.next_power_of_2(group))  # the group's query heads, padded to 16 rows at least
    if BLOCK_N is None:
        BLOCK_N = 64 if q.is_cuda else 32
    if q.is_cuda:
        # Shared memory holds the (block_g, D) block of q and, per pipeline stage, a (BLOCK_N, D) tile of K
        # and one of V: 2 x 64 x 256 x 2 B = 64 KiB at the toy Llama's D = 256 in bf16. An H100 holds 3
        # stages, an L4 (99 KiB) 1; a T4 (64 KiB) takes tiles of 32 keys.
        element = cache_k.element_size()
        q_block, kv_stage = block_g * D * element, 2 * BLOCK_N * D * element
        num_stages = stages_that_fit(num_stages, kv_stage, q.device, q_block)
        if num_stages < 1:
            BLOCK_N, num_stages = BLOCK_N // 2, 1
    if num_splits is None:  # about 2 programs per SM fill the GPU; one split per tile at most
        programs = 2 * sm_count(q.device) if q.is_cuda else 8
        num_splits = max(1, min(programs // (B * H_kv), triton.cdiv(S_max, BLOCK_N)))
    split_len = triton.cdiv(triton.cdiv(S_max, num_splits), BLOCK_N) * BLOCK_N  # whole tiles per split
    num_splits = triton.cdiv(S_max, split_len)
    # One fp32 buffer for all partials (one allocation); a single split writes `out` directly.
    part = out if num_splits == 1 else torch.empty(B * H_q * num_splits * (D + 2), device=q.device,
                                                   dtype=torch.float32)
    decode_attention_split_kernel[(B * H_kv, num_splits)](
        q, cache_k, cache_v, lengths, part, out, H_kv, split_len, D**-0.5,
        *q.stride(), *cache_k.stride(), *cache_v.stride(), *out.stride(),
        GROUP=group, BLOCK_G=block_g, BLOCK_N=BLOCK_N, D=D,
        NUM_SPLITS=num_splits, num_warps=num_warps, num_stages=num_stages)
    if num_splits > 1:
        decode_attention_merge_kernel[(B * H_q,)](part, out, H_q, *out.stride(), D=D, NUM_SPLITS=num_splits,
                                                  BLOCK_S=triton.next_power_of_2(num_splits))
    # END SOLUTION


# %% [check] 09.decode_attention

# %% [markdown]
# ## 09.w4a16_gemv: an int4 GEMV with group scales
#
# `w4a16_gemv(x, w_packed, scales, group_size, out)`.
#
# Taught in the lesson's [int4 weights with group scales](../notebooks/09_decoding.ipynb#int4-weights-with-group-scales).
#
# `out (M, N) = x (M, K) @ W.T` where W (N, K) is stored in 4 bits:
# - `w_packed`: (N, K // 2) uint8, contiguous; weight `k` of row `n` is the **low** nibble of byte
#   `k // 2` when `k` is even and the **high** nibble when `k` is odd (`07.pack_int4(lo=W[:, 0::2], hi=W[:, 1::2])`);
# - each nibble `q` is unsigned, 0..15, with zero point 8: `W[n, k] = (q - 8) * scales[n, k // group_size]`;
# - `scales`: (N, K // group_size), contiguous, fp16/bf16 or fp32: one scale per row **and per group** of
#   `group_size` consecutive k;
# - `x`: (M, K) fp16 or bf16 (bf16 on a GPU that computes with it, fp16 in the interpreter), `M` from 1 to
#   16 (a decode batch), any strides (a slice of a wider activation); `out` (M, N), x's dtype, any strides;
# - `group_size` is a power of 2 >= 16. **If K is not a multiple of group_size, raise `ValueError`** with
#   a message that says so, before launching anything: such a tensor cannot have been packed this way
#   (the check passes such a K and expects the ValueError).
#
# Dequantize in registers: load the packed bytes, split the nibbles with `& 0xF` and `>> 4`, subtract 8,
# and multiply by x. The scale is constant along a group: sum a group's products first and multiply the
# sum by its scale once per (row, group), not once per weight. Bytes read: N K / 2 for the weights, a
# quarter of bf16's: that is the whole point. (The solution goes further for speed: it reads the bytes
# as int32 words, 8 weights per load, turns a nibble into a float with bit operations instead of a
# conversion instruction, and keeps a running sum per word slot that it adds up across threads once,
# at the end. For bf16 x on a GPU it also has a second path, switched on by the kernel's last argument,
# `BF16X2`, that works on two weights per instruction in inline PTX; leave `BF16X2` False, since the
# straightforward way above passes the check.)

# %%
@triton.jit
def w4a16_gemv_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K,
                      stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sg, stride_om, stride_on,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, BF16X2: tl.constexpr = False):
    # BEGIN SOLUTION
    # w_ptr is the packed weights read as int32 words, (N, K // 8): word i of row n holds weights
    # 8i .. 8i + 7, weight 8i + j in bits 4j .. 4j + 3 (little-endian bytes, low nibble first).
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    WORDS: tl.constexpr = GROUP // 8  # int32 words per group: they share one scale
    BLOCK_KW: tl.constexpr = BLOCK_K // 8  # int32 words per row and step
    K_WORDS = K // 8
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) rows of x
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) output columns = weight rows
    offs_w = tl.arange(0, BLOCK_KW)
    m_mask = offs_m < M
    n_in = offs_n % N  # wrapped: loads stay in bounds, the store is masked
    # Every tensor in the loop is 3-D, (rows of x, rows of W, words), so that on the fp32 path all of them
    # take the layout of the weight load (16-byte loads, 4 words per thread) and no value moves between
    # threads until the final sum.
    w_rows = w_ptr + n_in[None, :, None].to(tl.int64) * stride_wn  # (1, BLOCK_N, 1)
    s_rows = s_ptr + n_in[None, :, None] * stride_sn
    x_rows = x_ptr + offs_m[:, None, None] * stride_xm  # (BLOCK_M, 1, 1)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_KW), dtype=tl.float32)  # a running sum per word slot
    # The bf16x2 path for one row of x: four steps unrolled, so that the compiler can issue the loads of
    # the next steps before this step's arithmetic (faster on both GPUs; slower on the fp32 path and for
    # several rows of x: results/explore/w4_bf16x2_unroll*.json).
    UNROLL: tl.constexpr = 4 if BF16X2 and BLOCK_M == 1 else 1
    for kw0 in tl.range(0, K_WORDS, BLOCK_KW, loop_unroll_factor=UNROLL):
        kw = (kw0 + offs_w)[None, None, :]  # (1, 1, BLOCK_KW) word index in the row; BLOCK_KW divides K_WORDS
        words = tl.load(w_rows + kw * stride_wk)  # (1, BLOCK_N, BLOCK_KW) int32: 8 weights each
        scale = tl.load(s_rows + (kw // WORDS) * stride_sg).to(tl.float32)  # the word's group scale
        if BF16X2:
            # Two weights per instruction (bf16 x on sm_80+, x's last stride 1): x's 16 bytes for word kw
            # are 4 int32 words (x0|x1), (x2|x3), (x4|x5), (x6|x7) (low half first); PRMT regroups them
            # as pairs (x_j | x_{j+4}), the order in which the word's nibbles come out below. Once per x
            # word, shared by BLOCK_N rows. x's 4 words per weight word come in one 16-byte load per thread
            # (four 4-byte loads, 16 bytes apart across threads, were slower). The pairs hold one weight
            # word per thread, so the compiler moves the weight words into that layout through shared
            # memory; loading the weights 4 bytes at a time instead was slower
            # (results/explore/w4_bf16x2_x_vector_loads.h200.json, w4_bf16x2_scalar_loads.h200.json).
            x_words = (x_ptr.to(tl.pointer_type(tl.int32)) + offs_m[:, None, None, None] * (stride_xm // 2)
                       + 4 * kw[:, :, :, None] + tl.arange(0, 4)[None, None, None, :])  # (BLOCK_M, 1, KW, 4)
            x4 = tl.load(x_words, mask=m_mask[:, None, None, None], other=0)  # 16 bytes a thread, coalesced
            # word i = 2p + q: splitting the last axis of (.., 2, 2) gives q = 0 (words 0, 2), q = 1 (1, 3)
            a01_45, a23_67 = tl.split(tl.reshape(x4, (BLOCK_M, 1, BLOCK_KW, 2, 2)))
            a01, a45 = tl.split(a01_45)
            a23, a67 = tl.split(a23_67)
            x0, x1, x2, x3 = tl.inline_asm_elementwise(
                """
                prmt.b32 $0, $4, $6, 0x5410;
                prmt.b32 $1, $4, $6, 0x7632;
                prmt.b32 $2, $5, $7, 0x5410;
                prmt.b32 $3, $5, $7, 0x7632;
                """, "=r,=r,=r,=r,r,r,r,r", [a01, a23, a45, a67],
                dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
            # (word >> 4j) & 0x000F000F | 0x43004300 is the bf16 pair (128 + q_j, 128 + q_{j+4}): 128 is
            # 0x4300 and bf16's 7 mantissa bits hold a nibble exactly (one LOP3). An FMA by 1.0 and -136
            # leaves (q - 8) exactly, a packed FMA multiplies two weights by two x's and adds them to a
            # running bf16 pair; four per word, then the pair's two halves are added in fp32: 18
            # instructions for 8 weights, where the fp32 path below takes 3 per weight (AND-OR, add,
            # FMA) and loads x as 8 bf16 values per word where this one loads 4 int32 words. (LOP3's
            # last operand is the truth table of (a & b) | c: 0xF0 & 0xCC | 0xAA = 0xEA.)
            dot = tl.inline_asm_elementwise(
                """
                {
                .reg .b32 w, one, bias, d, sum, lo, hi;
                .reg .f32 flo, fhi;
                mov.b32 one, 0x3F803F80;
                mov.b32 bias, 0xC308C308;
                mov.b32 sum, 0x80008000;  // (-0, -0): the first FMA's sum is its product, exactly
                lop3.b32 d, $1, 0x000F000F, 0x43004300, 0xEA;
                fma.rn.bf16x2 d, d, one, bias;
                fma.rn.bf16x2 sum, d, $2, sum;
                shr.u32 w, $1, 4;
                lop3.b32 d, w, 0x000F000F, 0x43004300, 0xEA;
                fma.rn.bf16x2 d, d, one, bias;
                fma.rn.bf16x2 sum, d, $3, sum;
                shr.u32 w, $1, 8;
                lop3.b32 d, w, 0x000F000F, 0x43004300, 0xEA;
                fma.rn.bf16x2 d, d, one, bias;
                fma.rn.bf16x2 sum, d, $4, sum;
                shr.u32 w, $1, 12;
                lop3.b32 d, w, 0x000F000F, 0x43004300, 0xEA;
                fma.rn.bf16x2 d, d, one, bias;
                fma.rn.bf16x2 sum, d, $5, sum;
                shl.b32 lo, sum, 16;
                and.b32 hi, sum, 0xFFFF0000;
                mov.b32 flo, lo;
                mov.b32 fhi, hi;
                add.f32 $0, flo, fhi;
                }
                """, "=f,r,r,r,r,r", [words, x0, x1, x2, x3], dtype=tl.float32, is_pure=True, pack=1)
        else:
            high = words >> 16  # weights 8i + 4 .. 8i + 7 moved down to bits 0 .. 15
            dot = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_KW), dtype=tl.float32)  # x . (q - 8) over each word
            for j in tl.static_range(8):
                shift = 4 * (j % 4)
                if j < 4:
                    half_word = words
                else:
                    half_word = high
                # The nibble q dropped into the mantissa of 1.0: the float32 1 + q * 2^(shift - 23), exactly.
                # Subtracting 1 + 8 * 2^(shift - 23) leaves (q - 8) * 2^(shift - 23): the zero point,
                # exactly, with one AND-OR and one add per weight (no int -> float conversion instruction).
                bits = (half_word & (0xF << shift)) | 0x3F800000
                w_j = bits.to(tl.float32, bitcast=True) - (1.0 + 8.0 / (1 << (23 - shift)))
                x_j = tl.load(x_rows + (8 * kw + j) * stride_xk, mask=m_mask[:, None, None],
                              other=0.0).to(tl.float32)  # (BLOCK_M, 1, BLOCK_KW)
                x_j = x_j * (1 << (23 - shift))  # undo the 2^(shift - 23): once per x, shared by BLOCK_N rows
                dot += w_j * x_j  # (BLOCK_M, BLOCK_N, BLOCK_KW)
        acc += dot * scale  # the scale once per word of 8 weights, not once per weight
    out = tl.sum(acc, axis=2)  # (BLOCK_M, BLOCK_N): the one reduction across threads
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & (offs_n[None, :] < N))
    # END SOLUTION


def w4a16_gemv(x: torch.Tensor, w_packed: torch.Tensor, scales: torch.Tensor, group_size: int,
               out: torch.Tensor, BLOCK_N: int | None = None, BLOCK_K: int | None = None,
               BLOCK_M: int | None = None, num_warps: int | None = None) -> None:
    """out (M, N) = x (M, K) @ W.T, W[n, k] = (nibble k of w_packed[n] - 8) * scales[n, k // group_size]."""
    expect_shapes("w4a16_gemv", w_packed=(w_packed, (w_packed.shape[0], x.shape[1] // 2)),
                  scales=(scales, (w_packed.shape[0], x.shape[1] // group_size)),
                  out=(out, (x.shape[0], w_packed.shape[0])))
    if group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"group_size = {group_size}: this kernel needs a power of 2 >= 16 (a group is whole "
                         "int32 words of 8 weights, and a block of them)")
    # BEGIN SOLUTION
    M, K = x.shape
    N = w_packed.shape[0]
    if out.numel() == 0:  # no rows of x, or no rows of W: nothing to write
        return
    if K % group_size:
        raise ValueError(f"K = {K} is not a multiple of group_size = {group_size}: the weights cannot "
                         "have been packed with one scale per group")
    if w_packed.stride(1) != 1 or w_packed.stride(0) % 4 or w_packed.storage_offset() % 4:
        w_packed = w_packed.contiguous()  # the int32 view below needs 4-byte-aligned rows of bytes
    # (N, K // 8): 8 nibbles per load instead of 2. K = 0 sums over no weight: no words, and the loop below
    # takes no step, so out is zeros (x @ W.T of an empty K, as torch's).
    words = w_packed.view(torch.int32) if K else torch.empty((N, 0), dtype=torch.int32, device=x.device)
    BLOCK_M = BLOCK_M or min(triton.next_power_of_2(M), 4)  # each dequantized weight serves BLOCK_M rows
    # Packed bf16 pairs: a GPU that computes with bf16 (sm_80+), x whose rows read as int32 words.
    bf16x2 = (x.is_cuda and x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 8
              and x.stride(1) == 1 and (M == 1 or x.stride(0) % 2 == 0) and x.data_ptr() % 4 == 0)
    if bf16x2:
        # Small programs, many of them: 4 rows x 512 weights a step, one warp: 3584 programs at N = 14336,
        # 27 per SM, whose loads cover each other's arithmetic (the best tile of the sweeps on the H100
        # and the H200, results/explore/w4_bf16x2_*).
        BLOCK_N, BLOCK_K, num_warps = BLOCK_N or 4, BLOCK_K or max(512 // BLOCK_M, 128), num_warps or 1
    else:
        # 64 rows x 512 weights per step: each thread holds 8 rows of 4 words, so one x value it loads
        # serves 8 rows (the best sweep row on the H100 and the H200); with more rows of x, fewer rows
        # of W keep the accumulators in registers.
        BLOCK_N, BLOCK_K, num_warps = BLOCK_N or 64 // BLOCK_M, BLOCK_K or 512, num_warps or 4
    BLOCK_K = max(min(BLOCK_K, K & -K), 16)  # a power of 2 dividing K (K = 0: 16, and no step)
    rows = GRID_AXIS_MAX * BLOCK_M  # the most rows one launch covers: axis 1 holds 65535 programs (lesson 02)
    for m0 in range(0, M, rows):
        m = min(M - m0, rows)
        grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(m, BLOCK_M))
        w4a16_gemv_kernel[grid](x[m0:], words, scales, out[m0:], m, N, K, *x.stride(), *words.stride(),
                                *scales.stride(), *out.stride(), GROUP=group_size, BLOCK_M=BLOCK_M,
                                BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BF16X2=bf16x2, num_warps=num_warps)
    # END SOLUTION


# %% [check] 09.w4a16_gemv

# %% [markdown]
# ## Not an exercise: the toy Llama generating tokens on these kernels
#
# What the lesson runs after the exercises, here so that it is one import away:
# - `quantize_int4_ref`: weights to the exercise's int4 format (round to nearest, per-group scales);
# - `skinny_linear`: `out += x @ w.T` for a few rows of x, with **split-K**: when N alone gives too few
#   programs to fill the GPU, each program also takes a slice of K and adds its partial sums into an fp32
#   output with atomic adds;
# - `StaticCacheLlama`: the toy Llama's decode step with a static KV cache: embedding, RMSNorm (lesson 06),
#   fused QKV projection, rotary embedding, `kv_append`, `decode_attention`, output projection, the
#   SwiGLU MLP (lesson 04's `silu_mul`), the LM head and greedy argmax, all on buffers allocated once,
#   so that the step can be captured in a CUDA graph and replayed for every token.

# %%
def quantize_int4_ref(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_packed (N, K/2) uint8, scales (N, K/group_size) fp32): w ~ (nibble - 8) * scale, symmetric groups."""
    N, K = w.shape
    groups = w.float().reshape(N, K // group_size, group_size)
    amax = groups.abs().amax(dim=2)  # (N, K/group): the largest weight maps to +-7 or -8
    scales = torch.where(amax > 0, amax / 7, torch.ones_like(amax))
    q = (torch.round(groups / scales[..., None]).clamp(-8, 7) + 8).to(torch.uint8).reshape(N, K)
    return q[:, 0::2] | (q[:, 1::2] << 4), scales  # 07.pack_int4's order: even k in the low nibble


def dequantize_int4_ref(w_packed: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """W (N, K) fp32 from the packed nibbles and group scales."""
    N = w_packed.shape[0]
    q = torch.stack([w_packed & 0xF, w_packed >> 4], dim=2).reshape(N, -1).float() - 8  # (N, K)
    return q * scales.float().repeat_interleave(group_size, dim=1)


@triton.jit
def skinny_linear_kernel(x_ptr, w_ptr, out_ptr, M, N, K, k_per_split,
                         stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)  # which slice of K: [split * k_per_split, (split + 1) * k_per_split)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_in = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_rows = w_ptr + n_in[:, None].to(tl.int64) * stride_wn
    if BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + offs_k
        k_mask = ks < k_end
        w = tl.load(w_rows + ks[None, :] * stride_wk, mask=k_mask[None, :], other=0.0)  # (BLOCK_N, BLOCK_K)
        if BLOCK_M == 1:
            x = tl.load(x_ptr + ks * stride_xk, mask=k_mask, other=0.0).to(tl.float32)  # (BLOCK_K,)
            acc += w.to(tl.float32) * x[None, :]
        else:
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :] * stride_xk,
                        mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
            acc = tl.dot(x.to(w.dtype), tl.trans(w), acc)
    n_mask = offs_n < N
    if BLOCK_M == 1:  # the K slices of all programs meet in out: atomic adds (fp32)
        tl.atomic_add(out_ptr + offs_n * stride_on, tl.sum(acc, axis=1), mask=n_mask)
    else:
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.atomic_add(out_ptrs, acc, mask=m_mask[:, None] & n_mask[None, :])


def skinny_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, accumulate: bool = False,
                  split_k: int | None = None, BLOCK_N: int | None = None, BLOCK_K: int | None = None,
                  num_warps: int = 4, num_stages: int = 3) -> None:
    """out (M, N) fp32 (+)= x (M, K) @ w (N, K).T for M <= 16, split along K when N is narrow."""
    M, K = x.shape
    N = w.shape[0]
    if M > 16:
        raise ValueError(f"skinny_linear is for decode batches of at most 16 rows, not {M}")
    BLOCK_M = 1 if M == 1 else 16
    BLOCK_N = BLOCK_N or (16 if M == 1 else 64)
    BLOCK_K = BLOCK_K or (256 if M == 1 else 128)
    if not accumulate:
        out.zero_()
    if split_k is None:  # about 2 programs per SM
        programs = 2 * sm_count(x.device) if x.is_cuda else 4
        split_k = max(1, min(programs // triton.cdiv(N, BLOCK_N), triton.cdiv(K, BLOCK_K)))
    k_per_split = triton.cdiv(triton.cdiv(K, split_k), BLOCK_K) * BLOCK_K
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(K, k_per_split))
    skinny_linear_kernel[grid](x, w, out, M, N, K, k_per_split, *x.stride(), *w.stride(), *out.stride(),
                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                               num_warps=num_warps, num_stages=num_stages)


def _hf_cache_layer(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) of one layer of a Hugging Face cache, each (B, H_kv, T, D), across versions."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


class StaticCacheLlama:
    """Greedy decoding of a Hugging Face Llama on the course's kernels, with a static KV cache.

    The weights, the caches and the step's inputs and outputs are allocated once in __init__. The
    temporaries `step()` makes (the rotary products, decode_attention's partial results) have the same
    sizes at every step, and nothing in it reads device data on the host. That is what lets `capture()`
    record one step in a CUDA graph (which keeps those temporaries in its own memory pool) and
    `generate` replay it for every new token.
    """

    def __init__(self, model, batch: int, max_len: int):
        cfg = model.config
        self.model, self.batch, self.max_len = model, batch, max_len
        self.H_q, self.H_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        dev, dtype = model.device, model.dtype
        self.layers = []
        for layer in model.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.layers.append(dict(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),  # one GEMV
                o=a.o_proj.weight, gate=mlp.gate_proj.weight, up=mlp.up_proj.weight, down=mlp.down_proj.weight,
                cache_k=torch.zeros(batch, self.H_kv, max_len, self.D, device=dev, dtype=dtype),
                cache_v=torch.zeros(batch, self.H_kv, max_len, self.D, device=dev, dtype=dtype)))
        self.embed, self.norm = model.model.embed_tokens.weight, model.model.norm.weight
        self.lm_head = model.lm_head.weight
        positions = torch.arange(max_len, device=dev)[None]  # the model's own rotary tables, (max_len, D)
        cos, sin = model.model.rotary_emb(torch.zeros(1, device=dev, dtype=torch.float32), positions)
        self.cos, self.sin = cos[0].float(), sin[0].float()
        f32 = dict(device=dev, dtype=torch.float32)
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        self.ids = torch.zeros(batch, device=dev, dtype=torch.long)  # this step's input tokens
        self.positions = torch.zeros(batch, device=dev, dtype=torch.int32)  # where they go in the cache
        self.lengths = torch.zeros(batch, device=dev, dtype=torch.int32)
        self.x = torch.zeros(batch, hidden, **f32)  # the residual stream, fp32
        self.h = torch.zeros(batch, hidden, device=dev, dtype=dtype)  # normalized input of a projection
        self.qkv = torch.zeros(batch, (self.H_q + 2 * self.H_kv) * self.D, **f32)
        self.attn = torch.zeros(batch, self.H_q, self.D, device=dev, dtype=dtype)
        self.g, self.u = torch.zeros(batch, inter, **f32), torch.zeros(batch, inter, **f32)
        self.act = torch.zeros(batch, inter, device=dev, dtype=dtype)
        self.logits = torch.zeros(batch, cfg.vocab_size, **f32)
        self.graph = None

    def _rope(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2  # Llama's rotate_half: (x1, x2) -> (-x2, x1)
        rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
        return t * cos + rotated * sin

    def step(self) -> None:
        """One token for every sequence: reads self.ids at self.positions, writes the next self.ids."""
        B, D = self.batch, self.D
        torch.index_select(self.embed, 0, self.ids, out=self.h)
        self.x.copy_(self.h)
        torch.add(self.positions, 1, out=self.lengths)  # the new token attends to itself too
        cos, sin = self.cos[self.positions][:, None, :], self.sin[self.positions][:, None, :]  # (B, 1, D)
        for p in self.layers:
            rmsnorm(self.x, p["ln1"], self.eps, self.h)
            skinny_linear(self.h, p["qkv"], self.qkv)
            q = self.qkv[:, :self.H_q * D].view(B, self.H_q, D)
            k = self.qkv[:, self.H_q * D:(self.H_q + self.H_kv) * D].view(B, self.H_kv, D)
            v = self.qkv[:, (self.H_q + self.H_kv) * D:].view(B, self.H_kv, D)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            kv_append(k, v, p["cache_k"], p["cache_v"], self.positions)
            decode_attention(q, p["cache_k"], p["cache_v"], self.lengths, self.attn)
            skinny_linear(self.attn.view(B, -1), p["o"], self.x, accumulate=True)  # x += attn @ W_o.T
            rmsnorm(self.x, p["ln2"], self.eps, self.h)
            skinny_linear(self.h, p["gate"], self.g)
            skinny_linear(self.h, p["up"], self.u)
            silu_mul(self.g, self.u, self.act)
            skinny_linear(self.act, p["down"], self.x, accumulate=True)  # x += mlp(x)
        rmsnorm(self.x, self.norm, self.eps, self.h)
        skinny_linear(self.h, self.lm_head, self.logits)
        torch.argmax(self.logits, dim=-1, out=self.ids)  # greedy
        self.positions.add_(1)

    def prefill(self, input_ids: torch.Tensor) -> None:
        """Run the prompt (B, T) through the Hugging Face model (compute-bound: lessons 03 and 05's
        territory), copy its keys and values into the static cache and take the first new token."""
        T = input_ids.shape[1]
        with torch.no_grad():
            out = self.model(input_ids=input_ids, use_cache=True)
        for i, p in enumerate(self.layers):
            keys, values = _hf_cache_layer(out.past_key_values, i)
            p["cache_k"][:, :, :T].copy_(keys)
            p["cache_v"][:, :, :T].copy_(values)
        self.ids.copy_(out.logits[:, -1].argmax(dim=-1))
        self.positions.fill_(T)

    def capture(self) -> None:
        """Record step() in a CUDA graph (after warm-up runs that compile the kernels)."""
        saved = [t.clone() for t in (self.ids, self.positions)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile and warm up; the state is restored below
                self.step()
                self.ids.copy_(saved[0])
                self.positions.copy_(saved[1])
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()
        self.ids.copy_(saved[0])  # capturing ran nothing, but keep the state explicit
        self.positions.copy_(saved[1])

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, graph: bool | None = None) -> torch.Tensor:
        """Greedy: (B, T + max_new_tokens) token ids, as `model.generate(do_sample=False)` returns them."""
        if input_ids.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(f"prompt {input_ids.shape[1]} + {max_new_tokens} new tokens > max_len {self.max_len}")
        graph = input_ids.is_cuda if graph is None else graph
        self.prefill(input_ids)
        new = torch.empty(self.batch, max_new_tokens, device=input_ids.device, dtype=torch.long)
        new[:, 0] = self.ids
        if graph and self.graph is None:
            self.capture()
        for t in range(1, max_new_tokens):
            self.graph.replay() if graph else self.step()
            new[:, t] = self.ids
        return torch.cat([input_ids, new], dim=1)


# %% [markdown]
# Your `kv_append` and `decode_attention` decoding the small toy Llama (runs once the checks above pass):
# greedy tokens against Hugging Face `generate`'s, in fp32 (on the CPU the two agree token for token; a GPU's
# TF32 matmuls may part them at a near-tie).

# %%
if __name__ == "__main__":
    from course_utils.llama import toy_llama

    model = toy_llama(small=True, dtype=torch.float32, device=current().device)
    prompt = torch.randint(model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(current().device)
    ours = StaticCacheLlama(model, batch=2, max_len=9).generate(prompt, 4, graph=False)
    theirs = model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    print(f"{(ours[:, 5:] == theirs[:, 5:]).float().mean().item():.0%} of the new tokens equal HF generate's")


# %% [progress] 09
