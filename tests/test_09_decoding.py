"""Lesson 09: the solutions pass, named wrong answers fail with their names, the static-cache decode loop
gives Hugging Face's greedy tokens."""
from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from course_utils.grading import CandidateError, CheckFailed, check
from course_utils.lessons import l09_decoding as l09
from course_utils.llama import toy_llama
from course_utils.mode import current, size
from helpers import interpreter_only, interpreter_only_because


def failure(exercise: str, candidate, at: str | None = None) -> str:
    """The message of a check that must fail, not by an exception of the candidate's; at: judge only the cases
    whose label holds it (helpers.only_cases)."""
    from helpers import only_cases

    with pytest.raises(CheckFailed) as info, only_cases(exercise, at):
        check(exercise, candidate, seed=0, quiet=True)
    assert not isinstance(info.value, CandidateError), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("exercise, solution", [
    ("09.decode_floor", l09.decode_floor), ("09.kv_append", l09.kv_append),
    ("09.decode_attention", l09.decode_attention), ("09.w4a16_gemv", l09.w4a16_gemv)])
def test_solution_passes(exercise, solution):
    check(exercise, solution, seed=1, quiet=True)


# --- 09.decode_floor --------------------------------------------------------------------------

def test_floor_names_a_kv_cache_read_once_for_the_batch():
    def wrong(batch, weight_bytes, kv_bytes_per_token, context, bandwidth):
        return (weight_bytes + context * kv_bytes_per_token) / bandwidth

    assert "each of the batch's sequences reads its own cache" in failure("09.decode_floor", wrong)


def test_floor_names_weights_read_per_sequence():
    def wrong(batch, weight_bytes, kv_bytes_per_token, context, bandwidth):
        return batch * (weight_bytes + context * kv_bytes_per_token) / bandwidth

    assert "the batch shares" in failure("09.decode_floor", wrong)


# --- 09.kv_append -----------------------------------------------------------------------------

@triton.jit
def _append_at_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, pos_ptr, H, D, skb, skh, skd, svb, svh, svd,
                      sckb, sckh, scks, sckd, scvb, scvh, scvs, scvd, BLOCK_D: tl.constexpr,
                      SHIFT: tl.constexpr, FIRST: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    pos = tl.load(pos_ptr + (0 if FIRST else b)) + SHIFT
    offs_d = tl.arange(0, BLOCK_D)
    mask = offs_d < D
    k = tl.load(k_ptr + b * skb + h * skh + offs_d * skd, mask=mask)
    v = tl.load(v_ptr + b * svb + h * svh + offs_d * svd, mask=mask)
    tl.store(ck_ptr + b * sckb + h * sckh + pos * scks + offs_d * sckd, k, mask=mask)
    tl.store(cv_ptr + b * scvb + h * scvh + pos * scvs + offs_d * scvd, v, mask=mask)


def _append_variant(shift=0, first=False):
    def kv_append(k_new, v_new, cache_k, cache_v, positions):
        B, H, D = k_new.shape
        _append_at_kernel[(B * H,)](k_new, v_new, cache_k, cache_v, positions, H, D, *k_new.stride(),
                                    *v_new.stride(), *cache_k.stride(), *cache_v.stride(),
                                    BLOCK_D=triton.next_power_of_2(D), SHIFT=shift, FIRST=first)
    return kv_append


@interpreter_only
def test_append_at_one_position_for_all_sequences_is_named():
    message = failure("09.kv_append", _append_variant(first=True))
    assert "positions[0]" in message and "instead of" in message


@interpreter_only
def test_append_off_by_one_is_named():
    message = failure("09.kv_append", _append_variant(shift=-1))
    assert "instead of positions[" in message or "written before its start" in message


def test_append_with_positions_read_on_the_host_fails():
    """Right values, one launch per sequence at a position the host read: the statement forbids it (a
    read of device memory on the host stalls the step and cannot be captured in a CUDA graph)."""
    def host_positions(k_new, v_new, cache_k, cache_v, positions):
        B, H, D = k_new.shape
        zero = torch.zeros_like(positions)  # the kernel writes at the start of the slice it is given
        for b in range(B):
            pos = positions[b].item()
            _append_at_kernel[(H,)](k_new[b:], v_new[b:], cache_k[b:, :, pos:], cache_v[b:, :, pos:], zero,
                                    H, D, *k_new.stride(), *v_new.stride(), *cache_k.stride(),
                                    *cache_v.stride(), BLOCK_D=triton.next_power_of_2(D), SHIFT=0, FIRST=True)

    message = failure("09.kv_append", host_positions)
    assert "on the host (Tensor.item)" in message and "tl.load" in message, message


def test_append_that_also_clears_the_cache_fails():
    def wrong(k_new, v_new, cache_k, cache_v, positions):
        cache_k.zero_()  # "a fresh cache": the earlier tokens are gone
        l09.kv_append(k_new, v_new, cache_k, cache_v, positions)

    assert "also changed position(s)" in failure("09.kv_append", wrong)


# --- 09.decode_attention and 09.w4a16_gemv: the solution's kernels with one mistake each ---------

def _patched(kernel, tmp_path, *replacements):
    """A copy of one of the solution's kernels with `replacements` (old, new) applied to its source."""
    source = textwrap.dedent(inspect.getsource(kernel.fn))
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    name = f"variant_{abs(hash(replacements))}"
    path = tmp_path / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, kernel.fn.__name__)


@interpreter_only
def test_attention_with_the_wrong_group_mapping_is_named(tmp_path, monkeypatch):
    wrong = _patched(l09.decode_attention_split_kernel, tmp_path,
                     ("heads = kvh * GROUP + offs_g", "heads = kvh + H_kv * offs_g"))  # h % H_kv
    monkeypatch.setattr(l09, "decode_attention_split_kernel", wrong)
    assert "h % H_kv" in failure("09.decode_attention", l09.decode_attention)


@interpreter_only
def test_attention_over_unmasked_keys_is_named():
    def decode_attention(q, cache_k, cache_v, lengths, out):
        l09.decode_attention(q, cache_k, cache_v, torch.full_like(lengths, cache_k.shape[2]), out)

    assert "all S_max keys" in failure("09.decode_attention", decode_attention)


@interpreter_only
def test_attention_over_the_first_sequences_length_is_named():
    """Every sequence cut at lengths[0] (a kernel loading len_ptr instead of len_ptr + b): named."""
    def decode_attention(q, cache_k, cache_v, lengths, out):
        l09.decode_attention(q, cache_k, cache_v, lengths[:1].expand(lengths.shape[0]).contiguous(), out)

    assert "lengths[0] keys" in failure("09.decode_attention", decode_attention)


@interpreter_only
def test_attention_merged_without_rescaling_is_named(tmp_path, monkeypatch):
    wrong = _patched(l09.decode_attention_merge_kernel, tmp_path,
                     ("w = tl.exp(m - m_all)", "w = tl.where(m > float(\"-inf\"), 1.0, 0.0)"))
    monkeypatch.setattr(l09, "decode_attention_merge_kernel", wrong)
    assert "without rescaling" in failure("09.decode_attention", l09.decode_attention)


@interpreter_only
@pytest.mark.parametrize("replacements, words", [
    ((("(8 * kw + j)", "(8 * kw + (j ^ 1))"),), "nibbles swapped"),  # weight 2i + 1 read as 2i
    ((("- (1.0 + 8.0 / (1 << (23 - shift)))", "- 1.0"),), "zero point forgotten"),
    ((("(kw // WORDS) * stride_sg", "0 * stride_sg"),), "one scale per row"),
    ((("(kw // WORDS) * stride_sg", "((4 * kw) // GROUP) * stride_sg"),), "that of the BYTE index"),
    ((("w_j = bits.to(tl.float32, bitcast=True) - (1.0 + 8.0 / (1 << (23 - shift)))",  # q - 16 where q >= 8
       "w_j = bits.to(tl.float32, bitcast=True) - (1.0 + 8.0 / (1 << (23 - shift)))\n"
       "                w_j += tl.where(w_j < 0, 8.0, -8.0) / (1 << (23 - shift))"),), "signed int4"),
])
def test_w4a16_mistakes_are_named(tmp_path, monkeypatch, replacements, words):
    monkeypatch.setattr(l09, "w4a16_gemv_kernel", _patched(l09.w4a16_gemv_kernel, tmp_path, *replacements))
    assert words in failure("09.w4a16_gemv", l09.w4a16_gemv)


@interpreter_only
def test_w4a16_gemv_of_more_rows_than_a_grid_axis_holds(monkeypatch):
    """Tiles of x's rows sit on axis 1 of the grid, which holds 65535 programs on a GPU: more rows go in
    turns. With the limit lowered to 2, nine rows in tiles of 2 take three launches and every row is right."""
    monkeypatch.setattr(l09, "GRID_AXIS_MAX", 2)
    torch.manual_seed(0)
    dev = current().device
    w_packed, scales = l09.quantize_int4_ref(torch.randn(12, 256, device=dev), 64)
    x = torch.randn(9, 256, device=dev)
    out = torch.full((9, 12), float("nan"), device=dev)
    l09.w4a16_gemv(x, w_packed, scales, 64, out, BLOCK_M=2)
    want = x.double() @ l09.dequantize_int4_ref(w_packed, scales, 64).double().T
    torch.testing.assert_close(out.double(), want, atol=1e-3, rtol=1e-3)


def test_w4a16_must_refuse_a_k_that_is_no_multiple_of_the_group():
    def accepts_anything(x, w_packed, scales, group_size, out):
        if x.shape[1] % group_size == 0:
            l09.w4a16_gemv(x, w_packed, scales, group_size, out)

    assert "must be refused: raise ValueError" in failure("09.w4a16_gemv", accepts_anything)


@triton.jit
def _dequantize_kernel(w_ptr, s_ptr, out_ptr, K, GROUP, BLOCK: tl.constexpr):
    """Row n of W (N, K) from its packed bytes and scales, into memory in out's dtype."""
    n = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    byte = tl.load(w_ptr + n * (K // 2) + k // 2, mask=k < K, other=0)
    q = tl.where(k % 2 == 0, byte & 0xF, byte >> 4).to(tl.float32)
    scale = tl.load(s_ptr + n * (K // GROUP) + k // GROUP, mask=k < K, other=0.0).to(tl.float32)
    tl.store(out_ptr + n * K + k, ((q - 8.0) * scale).to(out_ptr.dtype.element_ty), mask=k < K)


def test_w4a16_dequantizing_w_into_memory_for_a_matmul_fails():
    """W dequantized to x's dtype in an (N, K) buffer, then lesson 03's matmul: the right numbers, and the
    16-bit weights the exercise exists to avoid reading."""
    from course_utils.lessons.l03_matmul import matmul

    def w4a16_gemv(x, w_packed, scales, group_size, out):
        K = x.shape[1]
        if K % group_size:
            raise ValueError(f"K = {K} is no multiple of group_size = {group_size}")
        w = torch.empty((w_packed.shape[0], K), dtype=x.dtype, device=x.device)
        _dequantize_kernel[(w.shape[0], triton.cdiv(K, 256))](w_packed, scales, w, K, group_size, BLOCK=256)
        matmul(x, w.t(), out)

    message = failure("09.w4a16_gemv", w4a16_gemv)
    assert "the size of the dequantized W (N, K)" in message and "dequantized in registers" in message, message


def test_w4a16_dequantizing_w_with_x_passed_along_for_a_matmul_fails():
    """The same, with x handed to the dequantizing kernel that never reads it: the buffer is still read
    together with x afterwards, by the product, so it is no split's partial results."""
    from course_utils.lessons.l03_matmul import matmul

    def w4a16_gemv(x, w_packed, scales, group_size, out):
        K = x.shape[1]
        if K % group_size:
            raise ValueError(f"K = {K} is no multiple of group_size = {group_size}")
        w = torch.empty((w_packed.shape[0], K), dtype=x.dtype, device=x.device)
        _dequantize_kernel_beside_x[(w.shape[0], triton.cdiv(K, 256))](x, w_packed, scales, w, K, group_size,
                                                                      BLOCK=256)
        matmul(x, w.t(), out)

    message = failure("09.w4a16_gemv", w4a16_gemv)
    assert "the size of the dequantized W (N, K)" in message, message


def test_w4a16_dequantizing_w_into_a_buffer_of_wider_elements_fails():
    """W in 16 bits through a 16-bit view of an (N, K / 2) fp32 buffer: half the dequantized W's elements,
    so no allocation of its count, and all of its bytes."""
    from course_utils.lessons.l03_matmul import matmul

    def w4a16_gemv(x, w_packed, scales, group_size, out):
        K = x.shape[1]
        if K % group_size:
            raise ValueError(f"K = {K} is no multiple of group_size = {group_size}")
        words = torch.empty((w_packed.shape[0], K // 2), dtype=torch.float32, device=x.device)
        w = words.view(x.dtype)  # (N, K) in x's dtype, the same bytes
        _dequantize_kernel[(w.shape[0], triton.cdiv(K, 256))](w_packed, scales, w, K, group_size, BLOCK=256)
        matmul(x, w.t(), out)

    message = failure("09.w4a16_gemv", w4a16_gemv)
    assert "that the call allocated" in message and "in wider elements than its own" in message, message


@triton.jit
def _dequantize_kernel_beside_x(x_ptr, w_ptr, s_ptr, out_ptr, K, GROUP, BLOCK: tl.constexpr):
    _dequantize_kernel(w_ptr, s_ptr, out_ptr, K, GROUP, BLOCK)


@triton.jit
def _w4a16_split_kernel(x_ptr, w_ptr, s_ptr, part_ptr, M, N, K, n_groups, stride_xm, stride_xk, stride_wn,
                        stride_wk, stride_sn, stride_sg, GROUP: tl.constexpr, SPLITS: tl.constexpr,
                        BLOCK_N: tl.constexpr, SUM_IN_X_DTYPE: tl.constexpr = False):
    """Split s of row m: groups s, s + SPLITS, ... of K, each summed in fp32 (SUM_IN_X_DTYPE: in x's dtype, the
    mistake) and scaled once, into part[s, m]."""
    m, split = tl.program_id(0), tl.program_id(2)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    j = tl.arange(0, GROUP // 2)  # the bytes of a group
    dtype = x_ptr.dtype.element_ty if SUM_IN_X_DTYPE else tl.float32
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for g in range(split, n_groups, SPLITS):
        byte = tl.load(w_ptr + n[:, None] * stride_wn + (g * (GROUP // 2) + j[None, :]) * stride_wk,
                       mask=n[:, None] < N, other=0)  # (BLOCK_N, GROUP // 2)
        x_even = tl.load(x_ptr + m * stride_xm + (g * GROUP + 2 * j) * stride_xk).to(dtype)
        x_odd = tl.load(x_ptr + m * stride_xm + (g * GROUP + 2 * j + 1) * stride_xk).to(dtype)
        q_sum = tl.sum(((byte & 0xF).to(dtype) - 8.0) * x_even[None, :]
                       + ((byte >> 4).to(dtype) - 8.0) * x_odd[None, :], axis=1)
        acc += q_sum.to(tl.float32) * tl.load(s_ptr + n * stride_sn + g * stride_sg, mask=n < N,
                                              other=0.0).to(tl.float32)
    tl.store(part_ptr + (split * M + m) * N + n, acc, mask=n < N)


@triton.jit
def _w4a16_sum_kernel(part_ptr, out_ptr, M, N, stride_om, stride_on, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    m = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for split in range(SPLITS):
        acc += tl.load(part_ptr + (split * M + m) * N + n, mask=n < N, other=0.0)
    tl.store(out_ptr + m * stride_om + n * stride_on, acc, mask=n < N)


def _w4a16_split_k(splits: int, sum_in_x_dtype: bool = False):
    """w4a16_gemv on _w4a16_split_kernel's `splits` partial sums, then _w4a16_sum_kernel."""
    def w4a16_gemv(x, w_packed, scales, group_size, out):
        (M, K), N = x.shape, w_packed.shape[0]
        if K % group_size:
            raise ValueError(f"K = {K} is no multiple of group_size = {group_size}")
        part = torch.empty((splits, M, N), device=x.device, dtype=torch.float32)  # (splits, M, N)
        _w4a16_split_kernel[(M, triton.cdiv(N, 128), splits)](x, w_packed, scales, part, M, N, K, K // group_size,
                                                             *x.stride(), *w_packed.stride(), *scales.stride(),
                                                             GROUP=group_size, SPLITS=splits, BLOCK_N=128,
                                                             SUM_IN_X_DTYPE=sum_in_x_dtype)
        _w4a16_sum_kernel[(M, triton.cdiv(N, 128))](part, out, M, N, *out.stride(), SPLITS=splits, BLOCK_N=128)
    return w4a16_gemv


def test_w4a16_split_over_k_with_partial_sums_passes():
    """Split-K, flash-decoding's way: 16 splits of the groups write fp32 partial sums to a (16, M, N)
    scratch and a second kernel adds them into out. At one group of 16 (the first case) the scratch has
    as many elements as W, and at M = 16, K = 256 fp32 partials of 8 splits as many bytes as W in 16 bits:
    both were taken for the dequantized W, and the second for a buffer kept from before the call."""
    check("09.w4a16_gemv", _w4a16_split_k(16), seed=1, quiet=True)


@triton.jit
def _w4a16_dot_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, GROUP, stride_xm, stride_xk, stride_wn,
                      stride_sn, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      ACC: tl.constexpr):
    """W4A16 the GEMM way: each (BLOCK_K, BLOCK_N) tile of W dequantized to x's dtype for a 16-bit tl.dot,
    whose sums go to an accumulator of dtype ACC (tl.float16: rounded to fp16 after every K step)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    for k0 in range(0, K, BLOCK_K):  # BLOCK_K divides K (a multiple of the group size)
        k = k0 + tl.arange(0, BLOCK_K)
        n_ok = offs_n[None, :] < N
        byte = tl.load(w_ptr + offs_n[None, :] * stride_wn + (k // 2)[:, None], mask=n_ok, other=0)
        nibble = tl.where(k[:, None] % 2 == 0, byte & 0xF, byte >> 4)  # (BLOCK_K, BLOCK_N): W.T
        scale = tl.load(s_ptr + offs_n[None, :] * stride_sn + (k // GROUP)[:, None], mask=n_ok, other=0.0)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :] * stride_xk, mask=offs_m[:, None] < M,
                    other=0.0)
        w = ((nibble.to(tl.float32) - 8.0) * scale.to(tl.float32)).to(x.dtype)  # rounded once to x's dtype
        acc = tl.dot(x, w, acc.to(tl.float32)).to(ACC)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _w4a16_via_dot(acc):
    """w4a16_gemv on _w4a16_dot_kernel, its running sum in `acc` (tl.float32 or tl.float16)."""
    def w4a16_gemv(x, w_packed, scales, group_size, out):
        M, K = x.shape
        N = w_packed.shape[0]
        if K % group_size:
            raise ValueError(f"K = {K} is no multiple of group_size = {group_size}")
        _w4a16_dot_kernel[(triton.cdiv(N, 32),)](x, w_packed, scales, out, M, N, K, group_size, *x.stride(),
                                                  w_packed.stride(0), scales.stride(0), out.stride(0),
                                                  BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, ACC=acc)
    return w4a16_gemv


def test_w4a16_that_dequantizes_to_the_activations_dtype_for_tl_dot_passes():
    """The usual W4A16 GEMM rounds each dequantized weight to x's dtype once, for a 16-bit tl.dot: a
    correct answer whose error is that rounding's random walk, which the tolerance must allow (on the
    cancelling case too: its worst error there is 0.37 of the tolerance over 40 seeds)."""
    for seed in range(3):
        check("09.w4a16_gemv", _w4a16_via_dot(tl.float32), seed=seed, quiet=True)


@interpreter_only_because("the case of cancelling sums is the interpreter's only")
def test_w4a16_with_an_fp16_running_sum_fails_on_the_cancelling_sums():
    """The same kernel with its running sum rounded to fp16 after every K step: within the tolerance of the
    random-sign cases, off by up to 0.25 a step on sums that climb to 550 and cancel."""
    message = failure("09.w4a16_gemv", _w4a16_via_dot(tl.float16))
    assert "climbs to about 370" in message and "accumulate in fp32" in message, message


@interpreter_only_because("the case of cancelling sums is the interpreter's only")
def test_w4a16_with_an_fp16_running_sum_for_batches_only_fails():
    """fp32 sums for one token, fp16 for a batch: the cancelling case had one token only; it has two now."""
    one, batch = _w4a16_via_dot(tl.float32), _w4a16_via_dot(tl.float16)

    def w4a16_gemv(x, w_packed, scales, group_size, out):
        (one if x.shape[0] == 1 else batch)(x, w_packed, scales, group_size, out)

    assert "climbs to about 370" in str(failure("09.w4a16_gemv", w4a16_gemv))


def test_w4a16_errors_of_rounding_size_are_told_from_wrong_weights():
    """Values off by far less than a wrong nibble, zero point or scale (1/20 of sqrt(sum (x W)^2)): the
    failure names a 16-bit accumulator, not the nibble order; values of swapped nibbles are named as such."""
    from course_utils.checks import l09_decoding as checks
    from course_utils.grading.inputs import f64

    case = checks._w4_case("M = 3, group 64, N = 33", 3, 33, 448, 64, torch.float16, torch.Generator().manual_seed(0))
    x, w_packed, scales, group, _ = case.args
    W_q = torch.stack([w_packed & 0xF, w_packed >> 4], dim=2).reshape(w_packed.shape[0], -1).cpu()
    W = checks._w4_weights(W_q, scales, group)
    spread = float((f64(x) ** 2 @ (W**2).T).sqrt().max())
    assert "running sum kept in fp16" in case.explain({"out": case.expected["out"] + spread / 20}, case)
    swapped = f64(x) @ checks._w4_weights(W_q, scales, group, swap=True).T
    assert "the nibbles swapped" in case.explain({"out": swapped}, case)



_ASSEMBLE = """
import inspect, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from course_utils.lessons import l09_decoding as l09

signature = {name: "i32" for name in inspect.signature(l09.w4a16_gemv_kernel.fn).parameters}
signature.update(x_ptr="*bf16", w_ptr="*i32", s_ptr="*bf16", out_ptr="*bf16")
constants = dict(GROUP=128, BLOCK_M=1, BLOCK_N=8, BLOCK_K=1024, BF16X2=True)
signature.update({name: "constexpr" for name in constants})
kernel = compile(ASTSource(l09.w4a16_gemv_kernel, signature, constexprs=constants),
                 target=GPUTarget("cuda", int(sys.argv[1]), 32), options=dict(num_warps=2))
print(len(kernel.asm["cubin"]), kernel.asm["ptx"].count("fma.rn.bf16x2"))
"""


@pytest.mark.parametrize("arch", [80, 90])
def test_w4a16_bf16x2_path_assembles(arch):
    """The kernel's bf16x2 path (inline PTX) runs only on a GPU of compute capability 8.0+; here, with no GPU,
    Triton's own ptxas must at least assemble it for sm_80 and sm_90 (a typo in the PTX fails here). In a
    child process: the compiler needs Triton out of interpreter mode."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _ASSEMBLE, str(arch)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    cubin_bytes, packed_fmas = map(int, done.stdout.split()[-2:])
    assert cubin_bytes > 0
    assert packed_fmas >= 8  # 8 per word: the packed path, not the fp32 one

# --- the decode loop --------------------------------------------------------------------------

@interpreter_only
def test_static_cache_decoding_gives_hf_greedy_tokens():
    model = toy_llama(small=True)
    prompt = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(3))
    ours = l09.StaticCacheLlama(model, 2, 8).generate(prompt, 3)
    theirs = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_quantize_int4_round_trips_within_half_a_step():
    w = torch.randn(8, 256)
    packed, scales = l09.quantize_int4_ref(w, 64)
    assert packed.dtype == torch.uint8 and packed.shape == (8, 128) and scales.shape == (8, 4)
    err = (l09.dequantize_int4_ref(packed, scales, 64) - w).abs()
    assert bool((err <= scales.repeat_interleave(64, dim=1) / 2 + 1e-6).all())


@pytest.mark.parametrize("H_q, H_kv, D, says", [(4, 2, 80, "power of 2"), (4, 2, 8, "power of 2"),
                                                 (6, 4, 16, "multiple of H_kv")])
def test_decode_attention_refuses_shapes_outside_its_contract_with_a_message(H_q, H_kv, D, says):
    """A head dim tl.dot cannot tile (80: Phi-2's) or query heads that do not group evenly over the K/V heads
    raise a ValueError that says why, as lesson 05's attention does, not an error from inside Triton (D = 80)
    or a silent result with heads left unwritten (6 over 4)."""
    q, cache = torch.randn(1, H_q, D), torch.randn(1, H_kv, 10, D)
    with pytest.raises(ValueError, match=says):
        l09.decode_attention(q, cache, cache, torch.tensor([5], dtype=torch.int32), torch.empty_like(q))


def test_decode_attention_without_the_rescale_fails():
    """A running max that rises without shrinking what was summed against the old one (alpha = 1), in one
    split walking tiles of 128 keys: every other case fits in one tile; the 600 keys that grow along the
    context do not."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ("        alpha = tl.exp(m_i - m_new)  # rescale",
                    "        alpha = tl.exp(m_new - m_new)  # rescale"),
                   ("BLOCK_N = 64 if q.is_cuda else 32", "BLOCK_N = 128"),
                   ("num_splits = max(1, min(programs // (B * H_kv), triton.cdiv(S_max, BLOCK_N)))",
                    "num_splits = 1"))
    message = failure("09.decode_attention", wrong)
    assert "context 600 whose keys grow along it" in message, message


def test_decode_attention_addressing_q_as_contiguous_fails():
    """q's strides taken as those of a contiguous (B, H_q, D): every q was contiguous until the case of a view
    of a fused QKV projection."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ("        *q.stride(), *cache_k.stride()", "        H_q * D, D, 1, *cache_k.stride()"))
    message = failure("09.decode_attention", wrong)
    assert "q a view of a fused QKV projection's output" in message, message


def test_w4a16_addressing_x_as_contiguous_fails():
    """x's rows taken as K elements apart: every x was contiguous until the case of a slice of a wider one."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "w4a16_gemv",
                   ("w4a16_gemv_kernel[grid](x[m0:], words, scales, out[m0:], m, N, K, *x.stride(),",
                    "w4a16_gemv_kernel[grid](x[m0:], words, scales, out[m0:], m, N, K, K, 1,"))
    message = failure("09.w4a16_gemv", wrong)
    assert "x's rows are 264 elements apart" in message, message


def test_w4a16_gemv_over_the_first_1024_weights_only_fails():
    """The K loop stopped after 128 words (1024 weights), what one tile of 1024 without a loop computes: in
    the interpreter the case of K = 1536 catches it; on a GPU the one-token case before it already has
    K = 4096."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "w4a16_gemv",
                   ("for kw0 in tl.range(0, K_WORDS, BLOCK_KW,",
                    "for kw0 in tl.range(0, tl.minimum(K_WORDS, 128), BLOCK_KW,"))
    message = failure("09.w4a16_gemv", wrong)
    N, K = size((4099, 4096), (300, 512))  # the one-token case's sizes in course_utils/checks/l09_decoding.py
    caught_by = f"one token: 1 x {K} @ ({N} x {K}).T" if K > 1024 else "K = 1536 (12 groups of 128)"
    assert caught_by in message and "elements differ beyond" in message, message


@interpreter_only
def test_kv_append_rewriting_the_whole_cache_is_refused():
    """Right values everywhere, but every row of the cache stored back: the interpreter sees each store, and
    the check names the elements that should have been left alone."""
    from kv_rewrite import kv_append

    message = failure("09.kv_append", kv_append)
    assert "stored into" in message and "it must leave alone" in message, message
    assert "row positions[b] of each sequence's heads" in message, message


@pytest.mark.parametrize("exercise, name, edit", [
    ("09.kv_append", "kv_append", ("*k_new.stride(), *v_new.stride()", "*k_new.stride(), *k_new.stride()")),
    ("09.kv_append", "kv_append",
     ("*cache_k.stride(), *cache_v.stride()", "*cache_k.stride(), *cache_k.stride()")),
    ("09.decode_attention", "decode_attention",
     ("*cache_k.stride(), *cache_v.stride()", "*cache_k.stride(), *cache_k.stride()")),
])
def test_v_addressed_with_ks_strides_fails(exercise, name, edit):
    """K's strides passed for V: every other case gives the two caches one layout (and k_new, v_new one),
    so only the case where V is laid out apart catches it."""
    from helpers import mutant

    message = failure(exercise, mutant("l09_decoding", name, edit))
    assert "stored (B, S, H, D)" in message and "own strides" in message, message


@pytest.mark.parametrize("exercise, name, edit, words", [
    ("09.kv_append", "kv_append", ("*cache_k.stride(), *cache_v.stride(), BLOCK_D",
                                   "*cache_k.stride(), cache_k.stride(0), *cache_v.stride()[1:], BLOCK_D"),
     "cache_v a window"),
    ("09.kv_append", "kv_append", ("*cache_k.stride(), *cache_v.stride(), BLOCK_D",
                                   "*cache_k.stride(), *cache_v.stride()[:3], cache_k.stride(3), BLOCK_D"),
     "cache_v a window"),
    ("09.decode_attention", "decode_attention",
     ("*cache_k.stride(), *cache_v.stride(), *out.stride(),",
      "*cache_k.stride(), cache_k.stride(0), *cache_v.stride()[1:], *out.stride(),"), "cache_v a window"),
    ("09.decode_attention", "decode_attention",
     ("*cache_k.stride(), *cache_v.stride(), *out.stride(),",
      "*cache_k.stride(), *cache_v.stride()[:3], cache_k.stride(3), *out.stride(),"), "cache_v a window"),
    ("09.w4a16_gemv", "w4a16_gemv", ("*scales.stride(), *out.stride(), GROUP", "*scales.stride(), N, 1, GROUP"),
     "out's rows padded"),
])
def test_a_stride_taken_from_another_tensor_or_as_contiguous_fails(exercise, name, edit, words):
    """V's batch or head-dim stride taken from K (the caches' one case in two layouts shared those two), or
    out taken as contiguous."""
    from helpers import mutant

    message = failure(exercise, mutant("l09_decoding", name, edit), at=words)
    assert words in message, message


def test_decode_attention_writing_out_as_contiguous_fails():
    from helpers import mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ("*cache_v.stride(), *out.stride(),", "*cache_v.stride(), H_q * D, D, 1,"),
                   ("H_q, *out.stride(), D=D", "H_q, H_q * D, D, 1, D=D"))
    message = failure("09.decode_attention", wrong, at="out a (B, D, H_q) tensor's view")
    assert "out a (B, D, H_q) tensor's view" in message, message


@pytest.mark.parametrize("exercise, name, edit, words", [
    ("09.decode_attention", "decode_attention",
     ("heads[:, None] * stride_qh + offs_d[None, :] * stride_qd", "heads[:, None] * stride_qh + offs_d[None, :]"),
     "q a transposed view"),
    ("09.kv_append", "kv_append", ("h * stride_vh + offs_d * stride_vd", "h * stride_vh + offs_d"),
     "v_new a transposed view"),
    ("09.w4a16_gemv", "w4a16_gemv", ("x_rows + (8 * kw + j) * stride_xk", "x_rows + (8 * kw + j)"),
     "x a (K, M) tensor's transpose"),
])
def test_a_last_dim_taken_as_contiguous_fails(exercise, name, edit, words):
    """The commonest stride assumption: the last dim's stride left out of the address. Every other case
    gives q, v_new and x a unit stride there."""
    from helpers import mutant

    message = failure(exercise, mutant("l09_decoding", name, edit), at=words)
    assert words in message, message


@interpreter_only_because("the case of large scores is the interpreter's only")
@pytest.mark.parametrize("merge_max", [
    "m_all = tl.max(m, axis=0) * 0.0",  # exp(m_i) alone: no common max
    "m_all = tl.sum(tl.where(offs_s == 0, m, 0.0), axis=0)",  # split 0's max, not the largest
])
def test_decode_attention_merging_without_the_largest_max_fails(merge_max):
    """Right for scores near 10, whose exp fits fp32; the case of scores up to a few hundred, rising along
    the context, overflows both."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "decode_attention", ("m_all = tl.max(m, axis=0)", merge_max))
    message = failure("09.decode_attention", wrong)
    assert "scores up to a few hundred" in message and "LARGEST m_i" in message, message
    assert "exp of a score above 88" in message, message


@interpreter_only_because("the case of scores near -160 is the interpreter's only")
def test_decode_attention_whose_running_max_starts_at_zero_fails():
    """m_i = 0 instead of -inf to start: max(0, scores) is as good a shift as the max while some score of
    each head is above -88, as in every other case; where every score is near -160, exp(score - 0) is 0
    for every key, and l = 0 gives 0 / 0."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ('m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)',
                    "m_i = tl.zeros((BLOCK_G,), dtype=tl.float32)"))
    message = failure("09.decode_attention", wrong)
    assert "every score near -160" in message and "starts at -inf (not 0)" in message, message


@interpreter_only_because("tl.dot needs 16 rows on a GPU, so a block of GROUP rows fails every case there")
def test_decode_attention_whose_block_of_heads_is_the_group_fails_on_a_group_of_7():
    """A block of exactly GROUP query heads (tl.arange(0, GROUP)): every other case groups 1, 2, 4 or 8 heads
    on a K/V head, a power of 2; Qwen2-7B's 28 on 4 groups 7, which tl.arange refuses."""
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ("block_g = max(16, triton.next_power_of_2(group))", "block_g = group"))
    failing("09.decode_attention", wrong, "a group of 7, no power of 2", "tl.arange")


@interpreter_only
def test_decode_attention_dividing_by_the_number_of_kv_heads_is_named():
    """Query head h reads K/V head h // H_kv (the number of K/V heads) instead of h // group (the number of
    query heads per K/V head): named, on the first case, 4 query heads on 4 K/V heads, all read head 0."""
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ("heads = kvh * GROUP + offs_g", "heads = kvh * H_kv + offs_g"),
                   ("g_mask = offs_g < GROUP", "g_mask = (offs_g < H_kv) & (heads < H_kv * GROUP)"))
    failing("09.decode_attention", wrong, "h // H_kv = h // 4: divide by the group size")


def test_w4a16_gemv_of_an_empty_k_writes_zeros():
    """x (M, 0) @ W.T sums over no weight: zeros, as torch's matmul and the course's other matmuls give. The
    solution viewed the (N, 0) bytes as int32 words (torch refuses) and took blocks of 0 weights."""
    half = dict(dtype=torch.float16, device=current().device)
    x, scales = torch.ones(3, 0, **half), torch.ones(4, 0, **half)
    w_packed = torch.zeros(4, 0, dtype=torch.uint8, device=current().device)
    out = torch.full((3, 4), float("nan"), **half)
    l09.w4a16_gemv(x, w_packed, scales, 16, out)
    assert torch.equal(out, torch.zeros_like(out))


@interpreter_only
def test_decode_attention_whose_block_of_heads_is_a_fixed_16_fails_on_a_group_of_48():
    """A block of 16 query heads, fixed (tl.dot's smallest M, "padded to 16 rows"), masked to the group: every
    other case groups at most 8 heads on a K/V head; MQA's 48 on 1 leaves heads 16.. of the group unwritten."""
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ("block_g = max(16, triton.next_power_of_2(group))", "block_g = 16"))
    failing("09.decode_attention", wrong, "a group of 48, more than a block of 16 heads holds")


def test_decode_attention_that_scores_stale_keys_minus_inf_but_loads_them_fails():
    """Every key to S_max loaded (masked by the cache's bounds only), those past lengths[b] scored -inf: p = 0
    times a finite stale value is 0, so it passed every case of finite garbage; past the length of the NaN case,
    p @ V is 0 * NaN = NaN. (One split: its first tile holds key 0, so the running max is finite from there.)"""
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ("H_kv, split_len, qk_scale,", "H_kv, split_len, qk_scale, S_max,"),
                   ("H_kv, split_len, D**-0.5,", "H_kv, split_len, D**-0.5, S_max,"),
                   ("end = tl.minimum(start + split_len, length)", "end = tl.minimum(start + split_len, S_max)"),
                   ('s = tl.where(valid[None, :], s, float("-inf"))',
                    's = tl.where(valid[None, :] & (keys < length)[None, :], s, float("-inf"))'))

    def decode_attention(q, cache_k, cache_v, lengths, out):
        wrong(q, cache_k, cache_v, lengths, out, num_splits=1)

    failing("09.decode_attention", decode_attention, "past each length NaN", "got nan")


def test_decode_attention_with_q_in_its_own_dtype_in_tl_dot_fails():
    """q's block handed to tl.dot as loaded, without the cast to the cache's dtype: every other case gives q the
    caches' dtype; the toy Llama's decode step gives q fp32 and the caches the model's 16-bit dtype, and
    Triton refuses a dot of two dtypes."""
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "decode_attention", ("    q = q.to(k_ptr.dtype.element_ty)\n", ""))
    failing("09.decode_attention", wrong, "q fp32 from the model's fp32 projection", "same dtype")


def test_kv_append_addressing_the_new_token_as_contiguous_heads_fails():
    """k_new[b, h, d] read at b * stride_b + h * D + d: right wherever the head stride is D and the D stride 1, as
    in every other case (contiguous, or slices of a fused (B, 3 H D) output); a transposed k_new and a slice of
    GPT-NeoX's per-head fused QKV have neither."""
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "kv_append",
                   ("k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_d * stride_kd, mask=mask)",
                    "k = tl.load(k_ptr + b * stride_kb + h * D + offs_d, mask=mask)"),
                   ("v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_d * stride_vd, mask=mask)",
                    "v = tl.load(v_ptr + b * stride_vb + h * D + offs_d, mask=mask)"))
    failing("09.kv_append", wrong, "k_new a transposed view, strides (D H, 1, H)")


def test_kv_append_reading_k_new_in_the_caches_dtype_fails():
    """A kernel that takes k_new to be of the caches' dtype (its pointer cast to theirs, a bit copy): right
    wherever the two match, as in every case but the toy Llama's, whose rotary embedding gives fp32 keys."""
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "kv_append",
                   ("k = tl.load(k_ptr + b * stride_kb", "k = tl.load(k_ptr.to(ck_ptr.dtype) + b * stride_kb"))
    failing("09.kv_append", wrong, "k_new fp32 on", "as the toy Llama's decode step calls it")


@interpreter_only_because("the case of 16384 tokens is the interpreter's only")
def test_decode_attention_with_running_sums_rounded_to_the_cache_s_dtype_fails():
    """l and acc rounded to fp16 after every tile of 16 keys, in one or two programs per head: the contexts of a
    few thousand mixed-sign values passed; sums that reach thousands, where fp16's step is 2, do not."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "decode_attention", (
        "        l_i = l_i * alpha + tl.sum(p, axis=1)\n        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)\n",
        "        l_i = (l_i * alpha + tl.sum(p, axis=1)).to(v.dtype).to(tl.float32)\n"
        "        acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)).to(v.dtype).to(tl.float32)\n"))
    for splits in (1, 2):
        def decode_attention(q, cache_k, cache_v, lengths, out, splits=splits):
            wrong(q, cache_k, cache_v, lengths, out, num_splits=splits, BLOCK_N=16)

        assert "16384 tokens" in failure("09.decode_attention", decode_attention, at="16384 tokens")


# --- a round of wrong answers that passed: sizes no case had ----------------------------------------

def test_kv_append_with_a_block_of_d_fixed_at_128_fails():
    """Llama's head dim as the block, masked d < D: every D of the cases was at most 128."""
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "kv_append", ("BLOCK_D=triton.next_power_of_2(D))", "BLOCK_D=128)"))
    failing("09.kv_append", wrong, "D = 256, the toy Llama's head dim", "512 of 7168 elements differ")


def test_decode_attention_with_a_block_of_d_fixed_at_128_fails():
    from helpers import failure as failing, mutant

    wrong = mutant("l09_decoding", "decode_attention", ("GROUP=group, BLOCK_G=block_g, BLOCK_N=BLOCK_N, D=D,",
                                                        "GROUP=group, BLOCK_G=block_g, BLOCK_N=BLOCK_N, D=min(D, 128),"))
    failing("09.decode_attention", wrong, "D = 256, the toy Llama's head dim")


@interpreter_only_because("the fp32 path's scale load; a GPU's bf16 x takes the bf16x2 path, the same load")
def test_w4a16_with_one_scale_per_tile_of_k_fails(tmp_path, monkeypatch):
    """The group of the tile's first word for every word of the tile: right while a group holds a whole tile,
    as in every case but the one-group case of group 16."""
    monkeypatch.setattr(l09, "w4a16_gemv_kernel", _patched(l09.w4a16_gemv_kernel, tmp_path,
                                                           ("(kw // WORDS) * stride_sg", "(kw0 // WORDS) * stride_sg")))

    def tiles_of_32(x, w_packed, scales, group_size, out):  # as wide as the smallest group of every other case
        l09.w4a16_gemv(x, w_packed, scales, group_size, out, BLOCK_K=32)

    assert "4 groups of 16" in failure("09.w4a16_gemv", tiles_of_32, at="4 groups of 16")


@pytest.mark.parametrize("exercise, name, edit, words", [
    # on a GPU the fp32 dot runs in TF32, whose tolerance holds K rounded to bf16 too
    pytest.param("09.decode_attention", "decode_attention",
                 ("s = tl.dot(q, tl.trans(k)) * qk_scale",
                  "s = tl.dot(q.to(q_ptr.dtype.element_ty), tl.trans(k).to(q_ptr.dtype.element_ty)) * qk_scale"),
                 "on float32 caches and out", marks=interpreter_only_because("TF32 dots on a GPU")),
    ("09.kv_append", "kv_append", ("v = tl.load(v_ptr + b", "v = tl.load(v_ptr.to(cv_ptr.dtype) + b"),
     "v_new fp32 on"),
    # reads past the end of scales
    pytest.param("09.w4a16_gemv", "w4a16_gemv", ("GROUP=group_size,", "GROUP=min(group_size, 128),"),
                 "2 groups of 256", marks=interpreter_only),
])
def test_a_dtype_or_size_the_text_allows_and_one_case_gives_fails(exercise, name, edit, words):
    """q narrower than the caches (the dot done in q's dtype), a v_new wider than the caches (read as the
    cache's dtype), a group of 256 (a group fixed at 128 at most): each right on every other case."""
    from helpers import mutant

    message = failure(exercise, mutant("l09_decoding", name, edit), at=words)
    assert words in message, message


@interpreter_only_because("the cases of scores near -160 are the interpreter's (TF32 moves such scores on a GPU)")
def test_decode_merge_loading_the_padded_splits_max_as_0_fails():
    """other=0.0 for the merge's lanes past the last split: max(m_i, 0) shifts as well as the largest m_i while
    some score is above about -88, and the one case of scores far below had a power of 2 of splits."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "decode_attention", ('m = tl.load(parts + D, mask=s_mask, other=float("-inf"))',
                                                         "m = tl.load(parts + D, mask=s_mask, other=0.0)"))
    assert "never 0, or exp(m_i - 0) is 0" in failure("09.decode_attention", wrong, at="one sequence of 96 keys")


@interpreter_only_because("the case of x ~ 200 is the interpreter's, as the cancelling case it scales")
def test_w4a16_summing_each_group_in_16_bits_fails():
    """Each group's products multiplied and summed in x's dtype (fp16), then scaled in fp32: the groups' sums
    stay far below fp16's 65504 while x is ~1; only x ~ 200 takes one past it."""
    wrong = _w4a16_split_k(1, sum_in_x_dtype=True)
    assert "multiply and sum in fp32" in failure("09.w4a16_gemv", wrong, at="x ~ 200")


def test_decode_partials_kept_in_outs_dtype_fail():
    """A split's (acc, m, l) stored in out's dtype: m rounded to 16 bits is harmless while scores are near 0."""
    from helpers import mutant

    wrong = mutant("l09_decoding", "decode_attention",
                   ("(D + 2), device=q.device,\n                                                   dtype=torch.float32)",
                    "(D + 2), device=q.device,\n                                                   dtype=out.dtype)"))
    assert "keep each split's m, l and acc in fp32" in failure("09.decode_attention", wrong, at="scores near 160")
