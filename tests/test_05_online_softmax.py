"""Lesson 05: the solutions pass their checks, the classic mistakes of online softmax and FlashAttention
fail with messages that point at them, and the maths (merging statistics, KV-cache bytes) holds."""
from __future__ import annotations

import contextlib
import math
import re

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from transformers import LlamaConfig, LlamaForCausalLM

from course_utils.benches.l05_online_softmax import (ATTENTION_SWEEP, SOFTMAX_SHAPES, copy_in_softmax_tiles,
                                                     softmax_variants)
from course_utils.checks.l05_online_softmax import _ReadLog, _attention_tolerance
from course_utils.grading import CandidateError, check
from course_utils.lessons.l05_online_softmax import (
    LOG2E,
    ONE_PASS_MAX_COLS,
    SoftmaxConfig,
    attention,
    attention_ref,
    kv_cache_bytes,
    merge_stats,
    online_softmax_stats,
    softmax,
    softmax_config,
    softmax_ref,
)
from course_utils.llama import toy_config, toy_llama
from course_utils.mode import current, half_dtype, size
from helpers import failure, interpreter_only, interpreter_only_because, mutant, recorded_launches

NEG_INF = float("-inf")
# Where the kernels run: the tests make their tensors here (those drawn from a seeded CPU generator are drawn
# on the CPU and moved, so that both modes see the same values).
DEVICE = current().device
# The length of the 05.softmax check's long rows in this mode: its case labels quote it
LONG_COLS = size(100_000, 70_000)
# fp32 attention against fp32 references: tl.dot is exact fp32 in the interpreter but TF32 on a GPU, whose
# operands keep 10 bits of mantissa (there: the 05.attention check's fp32 tolerance, at inputs of scale 1)
ATTENTION_FP32_TOL = 1e-5 if current().interpret else _attention_tolerance(torch.float32)[1]


# --- the solutions ----------------------------------------------------------------------------

@pytest.mark.parametrize("exercise_id, solution", [
    ("05.merge_stats", merge_stats), ("05.online_softmax_stats", online_softmax_stats),
    ("05.softmax", softmax), ("05.attention", attention)])
def test_solution_passes(exercise_id, solution):
    check(exercise_id, solution, seed=0, quiet=True)


def test_attention_solution_passes_the_seed_whose_large_scores_it_once_failed():
    """Seed 1783802085 drew scores of std 3 whose fp32 rounding in the interpreter put one output 2.5e-5
    off (a CI run): the CPU tolerance must grow with the inputs' scale, as the GPU's does."""
    check("05.attention", attention, seed=1783802085, quiet=True)


def test_solutions_pass_another_seed():
    check("05.merge_stats", merge_stats, seed=7, quiet=True)
    check("05.online_softmax_stats", online_softmax_stats, seed=7, quiet=True)


# --- 05.merge_stats: wrong answers ------------------------------------------------------------

def test_merge_without_rescaling_fails():
    failure("05.merge_stats", lambda m1, d1, m2, d2: (max(m1, m2), d1 + d2), "that is d1 + d2", "rescaled")


def test_merge_with_flipped_exponents_fails():
    def flipped(m1, d1, m2, d2):
        m = max(m1, m2)
        return m, d1 * math.exp(m - m1) + d2 * math.exp(m - m2)

    failure("05.merge_stats", flipped, "exponents are flipped")


def test_merge_of_two_empty_blocks_must_not_be_nan():
    def unguarded(m1, d1, m2, d2):
        m = max(m1, m2)
        return m, d1 * math.exp(m1 - m) + d2 * math.exp(m2 - m)

    failure("05.merge_stats", unguarded, "both blocks empty", "NaN", "(-inf, 0)")


def test_merge_without_max_subtraction_fails():
    def absolute(m1, d1, m2, d2):  # sum(exp(x)) of both blocks, then shifted: exp(1000) overflows
        m = max(m1, m2)
        return m, (d1 * math.exp(m1) + d2 * math.exp(m2)) * math.exp(-m)

    failure("05.merge_stats", absolute, "exp(m) overflows", "OverflowError")


def test_merge_with_the_wrong_max_fails():
    failure("05.merge_stats", lambda m1, d1, m2, d2: (min(m1, m2), d1 + d2), "expected max(m1, m2)")


def test_merge_returning_strings_fails():
    """float("-inf") converts a string too: a string is still no number."""
    def as_text(m1, d1, m2, d2):
        m, d = merge_stats(float(m1), float(d1), float(m2), float(d2))
        return repr(m), repr(d)

    failure("05.merge_stats", as_text, "m and d must be numbers")


def test_merge_accepts_tensors_and_returns_a_pair():
    m, d = merge_stats(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0), torch.tensor(0.5))
    assert float(m) == 3.0 and float(d) == pytest.approx(2.0 * math.exp(-2.0) + 0.5)
    failure("05.merge_stats", lambda m1, d1, m2, d2: max(m1, m2), "expected a tuple (m, d)")


# --- 05.online_softmax_stats: wrong answers -----------------------------------------------------

def _blocks(x, block):
    return [x[s:s + block] for s in range(0, x.numel(), block)]


def test_stats_with_the_global_max_first_fails():
    def global_max(x, block):
        m = float(x.max())  # a whole pass of its own
        return m, sum(float(torch.exp(b.double() - m).sum()) for b in _blocks(x, block))

    failure("05.online_softmax_stats", global_max, "at once", "pass of its own")


def test_stats_in_two_passes_over_blocks_fails():
    def two_passes(x, block):
        m = max(float(b.max()) for b in _blocks(x, block))  # pass 1, block by block
        return m, sum(float(torch.exp(b.double() - m).sum()) for b in _blocks(x, block))  # pass 2

    failure("05.online_softmax_stats", two_passes, "second pass")


def _kept_block_copies(x, block):
    """Each block read once, front to back, into a list of copies; then a max over the copies and a sum."""
    kept = [x[s:s + block].clone() for s in range(0, x.numel(), block)]
    m = max(float(c.max()) for c in kept)
    return (m, 0.0) if m == NEG_INF else (m, sum(float(torch.exp(c.double() - m).sum()) for c in kept))


def _copied_into_a_buffer(x, block):
    """Each block read once, front to back, copied into a buffer of x's size; then the buffer reduced whole."""
    buf = torch.empty(x.numel(), dtype=torch.float64, device=x.device)
    for s in range(0, x.numel(), block):
        buf[s:s + block].copy_(x[s:s + block])
    m = float(buf.max())
    return (m, 0.0) if m == NEG_INF else (m, float(torch.exp(buf - m).sum()))


@pytest.mark.parametrize("stats", [_kept_block_copies, _copied_into_a_buffer], ids=["a list", "a buffer"])
def test_stats_in_two_passes_over_copies_of_the_blocks_fail(stats):
    """Every read of x is one block, once, in order: the second pass goes over copies, which no read of x
    shows. They passed; what the tensors hold at once shows them."""
    failure("05.online_softmax_stats", stats, "held", "bytes at once", "second pass over x")


def _python_list(x, block):
    """Each block read once, front to back, its values added to a Python list; then two passes over the list."""
    values = []
    for s in range(0, x.numel(), block):
        values += x[s:s + block].double().tolist()
    m = max(values)
    return (m, 0.0) if m == NEG_INF else (m, sum(math.exp(v - m) for v in values))


def _numpy_buffer(x, block):
    """Each block read once into a NumPy array of x's size and dtype; then the array reduced whole."""
    import numpy as np

    buf = np.empty(x.numel(), dtype=np.float64 if x.dtype == torch.float64 else np.float32)
    for s in range(0, x.numel(), block):
        buf[s:s + block] = np.asarray(x[s:s + block])
    m = float(buf.max())
    return (m, 0.0) if m == NEG_INF else (m, float(np.exp(buf.astype(np.float64) - m).sum()))


@pytest.mark.parametrize("stats", [
    _python_list,
    pytest.param(_numpy_buffer, marks=interpreter_only_because("NumPy reads the host's memory"))],
    ids=["a Python list", "a NumPy array"])
def test_stats_in_two_passes_over_python_or_numpy_copies_fail(stats):
    """Every read of x is one block, once, in order, and no tensor holds more than a block: the copies are
    Python's or NumPy's. They passed; tracemalloc's peak over the call shows them."""
    failure("05.online_softmax_stats", stats, "Python objects and NumPy arrays held", "bytes at once",
            "second pass over x")


def test_stats_in_python_block_by_block_pass():
    """A block's values as Python floats, reduced in Python, one block at a time: one pass."""
    def stats(x, block):
        m, d = NEG_INF, 0.0
        for s in range(0, x.numel(), block):
            values = x[s:s + block].double().tolist()
            m_b = max(values)
            m, d = merge_stats(m, d, m_b, sum(math.exp(v - m_b) for v in values) if m_b > NEG_INF else 0.0)
        return m, d

    check("05.online_softmax_stats", stats, seed=3, quiet=True)


def test_stats_that_stop_tracemalloc_fail():
    def stats(x, block):
        import tracemalloc

        tracemalloc.stop()
        return _python_list(x, block)

    failure("05.online_softmax_stats", stats, "stopped tracemalloc")


_ONLINE_LOAD = 'x = tl.load(x_row + (start + offs_n) * stride_xn, mask=mask, other=float("-inf")).to(tl.float32)'


def test_softmax_whose_long_row_loop_ignores_outs_column_stride_fails():
    wrong = mutant("l05_online_softmax", "softmax",
                   ("tl.store(out_row + (start + offs_n) * stride_on", "tl.store(out_row + (start + offs_n)"))
    failure("05.softmax", wrong, "into a transposed out", "the long-row loop stores with out's column stride")


def test_softmax_whose_long_row_loop_runs_in_the_storage_dtype_fails():
    wrong = mutant("l05_online_softmax", "softmax",
                   (_ONLINE_LOAD, _ONLINE_LOAD.replace(".to(tl.float32)", "")),
                   ('m = tl.full((BLOCK_N,), float("-inf"), tl.float32)',
                    'm = tl.full((BLOCK_N,), float("-inf"), x_ptr.dtype.element_ty)'),
                   ("d = tl.zeros((BLOCK_N,), tl.float32)", "d = tl.zeros((BLOCK_N,), x_ptr.dtype.element_ty)"))
    failure("05.softmax", wrong, "fp16 rows of")


def test_softmax_whose_long_row_loop_starts_its_running_max_at_0_fails():
    """max(0, the row) shifts as well as the row's max until the whole row lies ~88 below 0."""
    wrong = mutant("l05_online_softmax", "softmax",
                   ('m = tl.full((BLOCK_N,), float("-inf"), tl.float32)', 'm = tl.full((BLOCK_N,), 0.0, tl.float32)'))
    failure("05.softmax", wrong, "near -120: the long-row loop's running max starts at -inf, not 0",
            at="near -120")


def _lane_stats(x, block):
    """Honest: a running (max, sum) per lane of the block, merged once at the end (a kernel's way)."""
    lane_m = torch.full((block,), NEG_INF, dtype=torch.float64, device=x.device)
    lane_d = torch.zeros(block, dtype=torch.float64, device=x.device)
    for s in range(0, x.numel(), block):
        c = torch.full((block,), NEG_INF, dtype=torch.float64, device=x.device)
        c[:min(block, x.numel() - s)] = x[s:s + block]
        m = torch.maximum(lane_m, c)
        lane_d = (lane_d * torch.where(lane_m == NEG_INF, 0.0, torch.exp(lane_m - m))
                  + torch.where(c == NEG_INF, 0.0, torch.exp(c - m)))
        lane_m = m
    top = float(lane_m.max())
    return (top, 0.0) if top == NEG_INF else (top, float((lane_d * torch.exp(lane_m - top)).sum()))


def test_stats_with_a_running_max_and_sum_per_lane_pass():
    check("05.online_softmax_stats", _lane_stats, seed=1, quiet=True)


def test_stats_without_rescaling_fails():
    def no_rescale(x, block):
        m, d = NEG_INF, 0.0
        for b in _blocks(x, block):
            m = max(m, float(b.max()))
            d += float(torch.exp(b.double() - m).sum())  # the old d still refers to the old max
        return m, d

    failure("05.online_softmax_stats", no_rescale, "forgetting to rescale")


def _stats_over(blocks):
    m, d = NEG_INF, 0.0
    for b in blocks:
        m_b = float(b.max())
        d_b = float(torch.exp(b.double() - m_b).sum()) if m_b > NEG_INF else 0.0
        m, d = merge_stats(m, d, m_b, d_b)
    return m, d


def test_stats_skipping_the_partial_last_block_says_how_much_was_read():
    def whole_blocks_only(x, block):
        n = x.numel()
        return _stats_over(x[s:s + block] for s in range(0, n - block + 1, block))

    failure("05.online_softmax_stats", whole_blocks_only, "your loop read 0 of x's 1 elements",
            "range(0, n, block)")


def test_stats_of_float64_rounded_to_float32_print_every_digit():
    def in_float32(x, block):
        return _stats_over(b.float() for b in _blocks(x, block))

    err = failure("05.online_softmax_stats", in_float32, "float64", "rounded to a narrower type")
    m_line = next(line for line in str(err).splitlines() if "max = " in line)
    got, want = re.findall(r"max = (\S+), expected (\S+):", m_line)[0]
    assert got != want, m_line


def test_stats_without_max_subtraction_fails():
    def no_max(x, block):
        m, d = NEG_INF, 0.0
        for b in _blocks(x, block):
            m = max(m, float(b.max()))
            d += float(torch.exp(b).sum())
        return m, d / math.exp(m) if math.isfinite(d) else d

    failure("05.online_softmax_stats", no_max, "near +100", "subtract the running max")


def test_stats_nan_on_an_all_minus_inf_block_fails():
    def unguarded(x, block):
        m, d = NEG_INF, 0.0
        for b in _blocks(x, block):
            m_b = float(b.max())
            d_b = float(torch.exp(b.double() - m_b).sum())  # all -inf: exp(nan)
            m_new = max(m, m_b)
            d = d * math.exp(m - m_new) + d_b * math.exp(m_b - m_new)
            m = m_new
        return m, d

    failure("05.online_softmax_stats", unguarded, "whole first block -inf", "NaN", "(-inf, 0)")


def test_stats_with_logsumexp_is_refused():
    def lse(x, block):
        m = max(float(b.max()) for b in _blocks(x, block))
        return m, sum(math.exp(float(torch.logsumexp(b.double(), 0)) - m) for b in _blocks(x, block))

    failure("05.online_softmax_stats", lse, "aten.logsumexp")


def test_read_log_sees_reads_not_views():
    x = _ReadLog.watch(torch.arange(10.0))
    first, rest = x[2:5], x.split(5)[1]  # views: nothing read yet
    assert x.numel() == 10 and len(x) == 10 and x.shape == (10,)
    assert x._reads == []
    first.max()
    torch.exp(rest - 1.0).sum()
    float(x[9])
    assert x._reads == [("max", 2, 3), ("sub", 5, 5), ("__float__", 9, 1)]
    assert type(rest - 1.0) is torch.Tensor  # computed values are plain tensors


# --- 05.softmax: wrong answers ------------------------------------------------------------------

# Rows per program. The interpreter runs programs one by one, so fewer programs run faster there. On a GPU a
# program's (ROWS, 8192) fp32 tiles live in registers: one row is 64 values per thread, 16 rows would be
# 1024, spilled to memory and slow to compile.
ROWS = size(1, 16)


@triton.jit
def _softmax_whole_row_kernel(x_ptr, out_ptr, n_rows, n_cols, sxm, sxn, som, son, BLOCK: tl.constexpr,
                              BUG: tl.constexpr, R: tl.constexpr):
    """Whole rows, R per program (any length in the interpreter). BUG 1: no max; 2: pad with 0."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    safe_rows = tl.minimum(rows, n_rows - 1)
    cols = tl.arange(0, BLOCK)
    mask = cols[None, :] < n_cols
    ptrs = x_ptr + safe_rows[:, None] * sxm + cols[None, :] * sxn
    if BUG == 2:
        x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)
    if BUG == 1:
        p = tl.exp(x)
    else:
        p = tl.exp(x - tl.max(x, 1)[:, None])
    y = p / tl.sum(p, 1)[:, None]
    tl.store(out_ptr + rows[:, None] * som + cols[None, :] * son, y.to(out_ptr.dtype.element_ty),
             mask=mask & (rows[:, None] < n_rows))


def _whole_row(bug):
    def softmax_whole_row(x, out):
        n_rows, n_cols = x.shape
        block = triton.next_power_of_2(n_cols)
        if block > 1 << 20:
            # A compiled tile holds at most 2^20 elements: no whole-row tile exists for the GPU's case of
            # rows of 2^20 + 3. Such rows go to the online loop (without its bug), as the check asks of a
            # softmax for rows longer than Triton's largest block.
            _online(0)(x, out)
            return
        rows = ROWS if ROWS * block <= 1 << 20 else 1  # a tile holds at most 2^20 elements
        # 16 warps for a row of 2^17: 256 values a thread spill to local memory, whose reservation for every
        # resident thread of the GPU at 4 warps (1024 values a thread) ran out of memory beside other tests
        _softmax_whole_row_kernel[(triton.cdiv(n_rows, rows),)](
            x, out, n_rows, n_cols, *x.stride(), *out.stride(), BLOCK=block, BUG=bug, R=rows,
            num_warps=max(4, min(16, block // 8192)))
    return softmax_whole_row


@triton.jit
def _softmax_online_buggy_kernel(x_ptr, out_ptr, n_rows, n_cols, sxm, sxn, som, son, BLOCK_N: tl.constexpr,
                                 BUG: tl.constexpr, R: tl.constexpr):
    """The online kernel for every row length, R rows per program (an argument: a GPU compile reads no
    plain Python global). BUG 1: d not rescaled; 2: no guard for lanes still at -inf; 3: no max subtracted
    at all (exp(x) summed as it is); 4: every exp taken against the max of the row's first block (0 if that
    block is all -inf), a fixed shift instead of a running max; 5: the last block masked with
    cols < n_cols % BLOCK_N (lesson 02's remainder mask), which is 0 where the block is full."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    safe_rows = tl.minimum(rows, n_rows - 1)
    cols = tl.arange(0, BLOCK_N)
    if BUG == 4:
        first = tl.max(tl.load(x_ptr + safe_rows[:, None] * sxm + cols[None, :] * sxn,
                               mask=cols[None, :] < n_cols, other=float("-inf")).to(tl.float32), 1)
        first = tl.where(first == float("-inf"), 0.0, first)  # (R,)
    m = tl.full((R, BLOCK_N), float("-inf"), tl.float32)
    d = tl.zeros((R, BLOCK_N), tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols[None, :] < n_cols
        if BUG == 5:
            mask = cols[None, :] < tl.where(start + BLOCK_N >= n_cols, n_cols % BLOCK_N, BLOCK_N)
        x = tl.load(x_ptr + safe_rows[:, None] * sxm + (start + cols[None, :]) * sxn, mask=mask,
                    other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        if BUG == 2:
            m_ref = m_new
        elif BUG == 3:
            m_ref = tl.zeros_like(m_new)
        elif BUG == 4:
            m_ref = first[:, None] + tl.zeros_like(m_new)
        else:
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        if BUG == 1 or BUG == 3 or BUG == 4:
            d = d + tl.exp(x - m_ref)
        else:
            d = d * tl.exp(m - m_ref) + tl.exp(x - m_ref)
        m = m_new
    m_row = tl.max(m, 1)
    if BUG == 3:
        m_row = tl.zeros_like(m_row)
        d_row = tl.sum(d, 1)
    elif BUG == 4:
        m_row = first
        d_row = tl.sum(d, 1)
    else:
        d_row = tl.sum(d * tl.exp(m - m_row[:, None]), 1)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols[None, :] < n_cols
        if BUG == 5:
            mask = cols[None, :] < tl.where(start + BLOCK_N >= n_cols, n_cols % BLOCK_N, BLOCK_N)
        x = tl.load(x_ptr + safe_rows[:, None] * sxm + (start + cols[None, :]) * sxn, mask=mask,
                    other=float("-inf")).to(tl.float32)
        y = tl.exp(x - m_row[:, None]) / d_row[:, None]
        tl.store(out_ptr + rows[:, None] * som + (start + cols[None, :]) * son,
                 y.to(out_ptr.dtype.element_ty), mask=mask & (rows[:, None] < n_rows))


def _online(bug, programs_at_most=None, out_contiguous=False):
    """The online kernel with BUG `bug`; with `programs_at_most`, one row per program on a grid capped
    there and no loop over the rows it leaves; with `out_contiguous`, out's strides taken as (n_cols, 1)."""
    def softmax_online(x, out):
        n_rows, n_cols = x.shape
        rows = min(ROWS, triton.next_power_of_2(n_rows))  # one row of 2^20 + 3: not 15 copies of it besides
        if programs_at_most:
            rows = 1
        programs = triton.cdiv(n_rows, rows)
        out_strides = (n_cols, 1) if out_contiguous else out.stride()
        _softmax_online_buggy_kernel[(min(programs, programs_at_most or programs),)](
            x, out, n_rows, n_cols, *x.stride(), *out_strides, BLOCK_N=8192, BUG=bug, R=rows)
    return softmax_online


def test_the_wrong_answer_kernels_are_right_without_their_bug():
    check("05.softmax", _whole_row(0), seed=1, quiet=True)
    check("05.softmax", _online(0), seed=1, quiet=True)


def test_softmax_without_max_subtraction_fails():
    failure("05.softmax", _whole_row(1), "values near +100", "subtract the row max")


def test_softmax_padding_with_zero_fails():
    failure("05.softmax", _whole_row(2), "no multiple of any block (pad with -inf, not 0)")


def test_softmax_online_without_rescaling_fails():
    failure("05.softmax", _online(1), "longer than one block, the running max changes", "rescale d by exp")


def test_softmax_online_without_max_subtraction_fails():
    """Right on rows of one block, where the values near 100 are: long rows need large values of their own."""
    def two_paths(x, out):
        (_whole_row(0) if x.shape[1] <= 8192 else _online(3))(x, out)

    failure("05.softmax", two_paths, f"rows of {LONG_COLS} near +100", "subtract each row's max")


def test_softmax_online_masked_by_the_remainder_fails_on_rows_of_whole_blocks():
    failure("05.softmax", _online(5), "2 rows of 2^16: a multiple of every block size", "never written")


def test_softmax_on_a_grid_capped_at_64_programs_fails():
    """One row per program (the interpreter's ROWS), at most 64 programs, no loop over the rest."""
    failure("05.softmax", _online(0, programs_at_most=64), "never written",
            "267 rows of 5" if current().interpret else "")


def test_softmax_storing_into_out_as_if_contiguous_fails():
    failure("05.softmax", _online(0, out_contiguous=True), "a transposed out")


def test_softmax_storing_without_outs_column_stride_is_told_to_use_it():
    """out's row stride and adjacent columns (Triton's tutorial): in a transposed out the programs' rows
    overlap, which the interpreter sees as a race; the message says first that out's columns are not
    adjacent in this case, not only to combine the programs' results."""
    wrong = mutant("l05_online_softmax", "softmax", ("cols[None, :] * stride_on,", "cols[None, :],"))
    overlap = ("this case's `out` has strides (1, ", "address `out` with all of its strides. Otherwise: program")
    failure("05.softmax", wrong, "a transposed out", *(overlap if current().interpret else ()))


def test_softmax_online_without_minus_inf_guard_fails():
    failure("05.softmax", _online(2), "must subtract 0, not -inf")


def test_softmax_shifted_by_the_first_blocks_max_fails():
    """A fixed shift is exact until a later value lies ~88 above it: in the other long rows the max grows by
    less (ascending rows: ~20), or the first block is all -inf (a shift of 0 then serves the 50 last)."""
    failure("05.softmax", _online(4), "values near -100, then a 50 last", "NaN")


def test_softmax_with_torch_on_the_host_fails():
    def torch_softmax(x, out):
        _whole_row(0)(x, out)
        out.copy_(torch.softmax(x, dim=1))

    failure("05.softmax", torch_softmax, "torch operations outside your Triton kernel")


def test_softmax_in_two_launches_fails():
    def twice(x, out):
        softmax(x, out)
        softmax(x, out)

    failure("05.softmax", twice, "launched 2 kernels")


# --- 05.attention: wrong answers ----------------------------------------------------------------

@triton.jit
def _attention_buggy_kernel(q_ptr, k_ptr, v_ptr, o_ptr, H, S, qk_scale,
                            sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd, sob, soh, sos, sod,
                            CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    """One masked loop over all key tiles. BUG 1: causal j <= i + 1; 2: no key mask; 3: acc not rescaled;
    4: k's last stride taken as 1; 5: batch and head flattened into one index (true of contiguous inputs);
    6: the causal mask in positions within the tiles (right when one tile holds every query and key)."""
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    if BUG == 4:
        skd = 1
    if BUG == 5:
        b = 0
        h = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :] * sqd,
                mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for start in range(0, S, BLOCK_N):
        keys = start + offs_n
        k = tl.load(k_ptr + b * skb + h * skh + keys[None, :] * sks + offs_d[:, None] * skd,
                    mask=keys[None, :] < S, other=0.0)
        v = tl.load(v_ptr + b * svb + h * svh + keys[:, None] * svs + offs_d[None, :] * svd,
                    mask=keys[:, None] < S, other=0.0)
        s = tl.dot(q, k) * qk_scale
        if BUG == 2:
            keep = keys[None, :] >= 0
        else:
            keep = keys[None, :] < S
        if CAUSAL:
            if BUG == 1:
                keep = keep & (keys[None, :] <= offs_m[:, None] + 1)
            elif BUG == 6:
                keep = keep & (offs_n[None, :] <= tl.arange(0, BLOCK_M)[:, None])
            else:
                keep = keep & (keys[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_ref[:, None])
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        if BUG == 3:
            acc = tl.dot(p.to(v.dtype), v, acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    tl.store(o_ptr + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :] * sod,
             (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < S)


def _buggy_attention(bug, scale=None, tiles=(32, 16)):
    def attention_buggy(q, k, v, out, causal):
        B, H, S, D = q.shape
        qk_scale = LOG2E / math.sqrt(D) if scale is None else scale
        _attention_buggy_kernel[(triton.cdiv(S, tiles[0]), B * H)](
            q, k, v, out, H, S, qk_scale, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            CAUSAL=causal, D=D, BLOCK_M=tiles[0], BLOCK_N=tiles[1], BUG=bug)
    return attention_buggy


def test_the_wrong_attention_is_right_without_its_bug():
    check("05.attention", _buggy_attention(0), seed=1, quiet=True)


def test_attention_causal_off_by_one_fails():
    failure("05.attention", _buggy_attention(1), "causal", "query i sees keys j <= i")


def test_attention_without_key_mask_on_the_last_tile_fails():
    failure("05.attention", _buggy_attention(2), "keys >= S get -inf")


def test_attention_without_rescaling_acc_fails():
    failure("05.attention", _buggy_attention(3), "rescale acc and l")


def test_attention_with_k_strides_assumed_fails():
    failure("05.attention", _buggy_attention(4), "k a (B, H, D, S) tensor", "its own four strides")


def test_attention_with_batch_and_head_flattened_fails():
    failure("05.attention", _buggy_attention(5), "packed (B, S, 3, H, D) qkv", "its own four strides")


@pytest.mark.parametrize("edit", [
    # q is a slice of a packed qkv: its strides reach three times past v's memory (on a GPU, a fault)
    pytest.param(("*v.stride(), *out.stride()", "*q.stride(), *out.stride()"), marks=interpreter_only),
    ("*v.stride(), *out.stride()", "*v.stride(), H * S * D, S * D, D, 1"),
], ids=["v read with q's strides", "out assumed contiguous"])
def test_attention_with_another_tensors_strides_fails(edit):
    """q and v had one layout in every case, and out was always contiguous: both slips passed."""
    failure("05.attention", mutant("l05_online_softmax", "attention", edit), "v an (S, B, H, D) one",
            "out a (B, S, H, D) one", "its own four strides")


def test_attention_with_the_head_dim_of_q_v_and_out_assumed_contiguous_fails():
    """Four strides for k (stored (B, H, D, S) in a case) but three for q, v and out, whose stride(3) was 1 in
    every case: the slip passed until a case strided the head dim of every tensor."""
    wrong = mutant("l05_online_softmax", "attention",
                   ("*q.stride(), *k.stride(), *v.stride(), *out.stride()",
                    "*q.stride()[:3], 1, *k.stride(), *v.stride()[:3], 1, *out.stride()[:3], 1"))
    failure("05.attention", wrong, "head dim strided", "each tensor's own stride(3)")


def test_attention_with_a_causal_mask_local_to_64_wide_tiles_fails():
    """keys within the tile <= queries within the tile: right while S <= 64 (one tile of each), as every
    causal case of the interpreter once was; wrong from the second tile of 64 on."""
    # a GPU's first causal case has S = 1000, sixteen tiles of 64
    expected = (("S = 300, large scores, causal=True", "absolute positions") if current().interpret
                else ("causal",))
    failure("05.attention", _buggy_attention(6, tiles=(64, 64)), *expected)


def test_attention_without_the_scale_fails():
    failure("05.attention", _buggy_attention(0, scale=LOG2E), "1/sqrt(D)")


def test_attention_with_a_buffer_for_the_scores_fails():
    """A kernel that stored the (S, S) scores and read them back in its one launch passed: the launch count
    cannot see it. The buffer it needs can: an allocation that holds B * H * S * S values is refused."""
    wrong = mutant("l05_online_softmax", "attention",
                   ("qk_scale = LOG2E / math.sqrt(D)",
                    "scores = torch.empty(B * H * S * S + 8, device=q.device)  # padded: still the scores\n"
                    "    qk_scale = LOG2E / math.sqrt(D)"))
    failure("05.attention", wrong, "room for the (B, H, S, S) scores", "never written")


@triton.jit
def _scores_round_trip(q, k, v, out, scores, S, scale, sq, sk, sv, so, D: tl.constexpr, CAUSAL: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Two passes over the keys: the scores stored into `scores` (one (S, S) block per head), then read back
    for the exponentials and P @ V. Right values, one launch, the (S, S) scores in memory."""
    bh, H = tl.program_id(1), tl.num_programs(2)
    b, h = bh // H, bh % H
    rows, d = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), tl.arange(0, D)
    block = scores + bh * S * S + rows[:, None] * S  # this program's rows of the head's (S, S) scores
    qt = tl.load(q + b * sq[0] + h * sq[1] + rows[:, None] * sq[2] + d[None, :] * sq[3],
                 mask=rows[:, None] < S, other=0.0)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    for n0 in range(0, S, BLOCK):
        keys = n0 + tl.arange(0, BLOCK)
        kt = tl.load(k + b * sk[0] + h * sk[1] + keys[None, :] * sk[2] + d[:, None] * sk[3],
                     mask=keys[None, :] < S, other=0.0)
        seen = (keys[None, :] < S) & ((keys[None, :] <= rows[:, None]) | (not CAUSAL))
        s = tl.where(seen, tl.dot(qt, kt) * scale, float("-inf"))
        m = tl.maximum(m, tl.max(s, 1))
        tl.store(block + keys[None, :], s, mask=(rows[:, None] < S) & (keys[None, :] < S))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc, l = tl.zeros((BLOCK, D), tl.float32), tl.zeros((BLOCK,), tl.float32)
    for n0 in range(0, S, BLOCK):
        keys = n0 + tl.arange(0, BLOCK)
        s = tl.load(block + keys[None, :], mask=(rows[:, None] < S) & (keys[None, :] < S), other=float("-inf"))
        p = tl.exp(s - m[:, None])
        l += tl.sum(p, 1)
        vt = tl.load(v + b * sv[0] + h * sv[1] + keys[:, None] * sv[2] + d[None, :] * sv[3],
                     mask=keys[:, None] < S, other=0.0)
        acc += tl.dot(p.to(vt.dtype), vt)
    tl.store(out + b * so[0] + h * so[1] + rows[:, None] * so[2] + d[None, :] * so[3],
             (acc / l[:, None]).to(out.dtype.element_ty), mask=rows[:, None] < S)


_KEPT_SCORES = torch.empty(1 << 24, device=current().device)  # made once, before any call: no allocation of one


def _attention_through_kept_scores(q, k, v, out, causal):
    B, H, S, D = q.shape
    grid = (triton.cdiv(S, 16), B * H, H)
    _scores_round_trip[grid](q, k, v, out, _KEPT_SCORES, S, 1 / math.sqrt(D), q.stride(), k.stride(), v.stride(),
                             out.stride(), D=D, CAUSAL=causal, BLOCK=16)


def test_attention_with_the_scores_in_a_buffer_kept_from_call_to_call_fails():
    """The round trip through the (S, S) scores, with a buffer made once at import: no allocation in the call,
    one launch, right values. The launch itself gets a tensor with room for the scores, none of the call's."""
    failure("05.attention", _attention_through_kept_scores, "room for the (B, H, S, S) scores",
            "kept from call to call", "never written")


# --- the maths and the kernels beyond the checks --------------------------------------------------

def test_merging_in_any_order_gives_logsumexp():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=gen, dtype=torch.float64) * 20
    blocks = [x[s:s + 37] for s in range(0, 1000, 37)]
    stats = [(float(b.max()), float(torch.exp(b - b.max()).sum())) for b in blocks]
    order = torch.randperm(len(stats), generator=gen).tolist()
    m, d = NEG_INF, 0.0
    for i in order:
        m, d = merge_stats(m, d, *stats[i])
    assert m == float(x.max())
    assert m + math.log(d) == pytest.approx(float(torch.logsumexp(x, 0)), rel=1e-12)
    assert online_softmax_stats(x, 64)[0] == m
    assert online_softmax_stats(x, 64)[1] == pytest.approx(d, rel=1e-12)


def test_softmax_config_picks_the_kernel_by_row_length():
    assert not softmax_config(10, ONE_PASS_MAX_COLS).online
    assert softmax_config(10, ONE_PASS_MAX_COLS + 1).online
    short = softmax_config(100, 100)
    assert short.block_n == 128 and short.rows > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_both_softmax_kernels_agree_with_torch(dtype):
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(3000, 5, generator=gen) * 4).to(DEVICE, dtype).t()  # (5, 3000) with strides (1, 5)
    x[:, 1000:2100] = NEG_INF
    want = torch.softmax(x.double(), dim=1)
    tol = 2e-5 if dtype == torch.float32 else 2e-3
    configs = [SoftmaxConfig(False, 4096, 2, 4), SoftmaxConfig(False, 4096, 4, 4, programs=2),
               SoftmaxConfig(True, 512, num_warps=4), SoftmaxConfig(True, 1024, num_warps=4)]
    for cfg in configs:
        out = torch.full(x.shape, float("nan"), dtype=dtype, device=DEVICE)
        softmax(x, out, cfg)
        torch.testing.assert_close(out.double(), want, atol=1e-7, rtol=tol, msg=lambda m, c=cfg: f"{c}: {m}")


def test_softmax_ref_is_the_safe_softmax():
    x = torch.randn(4, 50) * 30 + 100
    torch.testing.assert_close(softmax_ref(x), torch.softmax(x, dim=1))


@pytest.mark.parametrize("shape, blocks", [((1, 2, 70, 16), (32, 16)), ((2, 1, 45, 32), (32, 32)),
                                           ((1, 1, 100, 16), (64, 16))])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_sdpa(shape, blocks, causal):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(shape, generator=gen).to(DEVICE) for _ in range(3))
    out = torch.empty_like(q)
    attention(q, k, v, out, causal, *blocks)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    tol = ATTENTION_FP32_TOL
    torch.testing.assert_close(out, sdpa, atol=tol, rtol=tol)
    torch.testing.assert_close(out, attention_ref(q, k, v, causal), atol=tol, rtol=tol)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_of_rows_past_2_31_elements(causal):
    """q, k and v three heads of a (1, S, W) activation (a long sequence of a wide packed qkv, "any strides"),
    S * W past 2^31: from some row on, row * stride_qs passes int32's 2^31 - 1, and a 32-bit row offset (or
    causal's lo * stride_ks) wraps to before the tensor. The host sees it (needs_int64) and the kernel indexes
    rows in 64 bits. Of `big` (4 GiB on a GPU, 10 GB on the CPU) only the three heads are touched."""
    device = current().device
    S, W, D, dtype = (4096, 2**19 + 2**12, 64, torch.float16) if current().gpu else (600, 2**22 + 64, 16,
                                                                                     torch.float32)
    big = torch.empty((1, S, W), dtype=dtype, device=device)
    big[:, :, :3 * D] = torch.randn((1, S, 3 * D), device=device, dtype=dtype)
    q, k, v = (big[:, :, i * D:(i + 1) * D].unsqueeze(1) for i in range(3))  # (1, 1, S, D), stride W on S
    out = torch.empty((1, 1, S, D), dtype=dtype, device=device)
    attention(q, k, v, out, causal)
    want = attention_ref(*(t.float().contiguous() for t in (q, k, v)), causal)
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)


def test_attention_of_many_heads_fits_a_gpu_grid(monkeypatch):
    """(2, 40000, 1, 16): a 2-D grid (query tiles, B * H) put 80000 programs on axis 1, where a GPU holds
    65535 ("Triton Error [CUDA]: invalid argument"); the interpreter has no such limit, so the launch is
    recorded here instead of run. One program per (query tile, batch * head), all on axis 0."""
    from course_utils.lessons import l05_online_softmax as l05

    launches = recorded_launches(monkeypatch, l05, "attention_kernel")
    monkeypatch.setattr(l05, "stages_that_fit", lambda stages, *args, **kwargs: stages)  # no GPU to ask: meta
    for shape, causal in [((2, 40000, 1, 16), False), ((1, 70000, 300, 64), True)]:
        q = torch.empty(shape, device="meta")
        l05.attention(q, q, q, torch.empty(shape, device="meta"), causal, BLOCK_M=64, BLOCK_N=32)
        ((grid, meta),) = launches
        launches.clear()
        assert all(programs <= 65535 for programs in grid[1:]), grid
        assert math.prod(grid) == triton.cdiv(shape[2], meta["BLOCK_M"]) * shape[0] * shape[1]


def test_attention_refuses_head_dims_tl_dot_cannot_tile():
    q = torch.randn(1, 1, 8, 24)
    with pytest.raises(ValueError, match="power of 2"):
        attention(q, q, q, torch.empty_like(q), False)


def _cache_bytes(model, batch: int, tokens: int) -> int:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), generator=gen)
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    layers = getattr(cache, "layers", None)
    tensors = ([t for layer in layers for t in (layer.keys, layer.values)] if layers is not None
               else [*cache.key_cache, *cache.value_cache])
    return sum(t.numel() * t.element_size() for t in tensors)


def test_kv_cache_bytes_match_a_hugging_face_cache():
    config = toy_config(small=True)
    measured = _cache_bytes(toy_llama(small=True), batch=3, tokens=5)
    head_dim = config.hidden_size // config.num_attention_heads
    assert measured == kv_cache_bytes(config.num_hidden_layers, config.num_key_value_heads, head_dim,
                                      tokens=5, batch=3, bytes_per_element=4)


def test_gqa_divides_the_cache_by_the_group_size():
    sizes = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 100, "num_hidden_layers": 2,
             "num_attention_heads": 8, "max_position_embeddings": 64}
    torch.manual_seed(0)
    mha = _cache_bytes(LlamaForCausalLM(LlamaConfig(**sizes, num_key_value_heads=8)).eval(), 2, 6)
    gqa = _cache_bytes(LlamaForCausalLM(LlamaConfig(**sizes, num_key_value_heads=2)).eval(), 2, 6)
    mqa = _cache_bytes(LlamaForCausalLM(LlamaConfig(**sizes, num_key_value_heads=1)).eval(), 2, 6)
    assert mha == kv_cache_bytes(2, 8, 8, tokens=6, batch=2, bytes_per_element=4)
    assert (mha // gqa, mha // mqa) == (4, 8)
    assert gqa == kv_cache_bytes(2, 2, 8, tokens=6, batch=2, bytes_per_element=4)


# --- the benchmark's sweep: every configuration it times computes a correct softmax -------------

@pytest.mark.parametrize("n_cols", sorted({n for _, n in SOFTMAX_SHAPES}))
def test_every_softmax_configuration_of_the_bench_is_correct(n_cols):
    x = torch.randn(3, n_cols, device=DEVICE) * 3
    want = torch.softmax(x, dim=1)
    for name, cfg in softmax_variants(3, n_cols, sm_count=1):
        out = torch.full_like(x, float("nan"))
        softmax(x, out, cfg)
        torch.testing.assert_close(out, want, atol=1e-9, rtol=2e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("n_cols", sorted({n for _, n in SOFTMAX_SHAPES if n <= ONE_PASS_MAX_COLS}))
def test_the_benchs_tile_copy_copies_every_element_in_the_softmax_tiles(n_cols):
    """The bench's yardstick for the one-pass kernel's schedule: lesson 02's copy in the default config's
    tiles copies x exactly, a row count that is no multiple of the tile's rows included."""
    n_rows = 5
    cfg = softmax_config(n_rows, n_cols)
    assert not cfg.online
    x = torch.randn(n_rows, n_cols, device=DEVICE)
    out = torch.full_like(x, float("nan"))
    copy_in_softmax_tiles(x, out, cfg)
    assert torch.equal(out, x)


@pytest.mark.parametrize("causal", [False, True])
def test_every_attention_configuration_of_the_bench_is_correct(causal):
    """On a GPU in the bench's dtype (bf16 on an H100), at the bench's tolerance: the sweep's tiles and stages
    are sized for 16-bit K and V tiles in shared memory, which fp32 tiles of twice the bytes may not fit. The
    interpreter has no bf16 arithmetic and no shared memory: fp32 there, to fp32's tolerance."""
    dtype, tol = (torch.float32, 1e-5) if current().interpret else (half_dtype(), 2e-2)
    q, k, v = (torch.randn(1, 1, 150, 128, device=DEVICE, dtype=dtype) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    for bm, bn, warps, stages in ATTENTION_SWEEP:
        out = torch.full_like(q, float("nan"))
        attention(q, k, v, out, causal, bm, bn, warps, stages)
        torch.testing.assert_close(out, want, atol=tol, rtol=tol,
                                   msg=lambda m, c=(bm, bn, warps, stages): f"{c}: {m}")


# --- named mistakes: fp16 arithmetic, attention's scaling, masking and rescaling ---------------------

@triton.jit
def softmax_fp16_kernel(x_ptr, out_ptr, n_cols, stride_xm, stride_om, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=float("-inf"))  # stays in x's dtype
    z = x - tl.max(x, axis=0)  # rounded to fp16
    p = tl.exp(z.to(tl.float32)).to(x.dtype)  # tl.exp takes fp32 only; the result back to fp16
    tl.store(out_ptr + row * stride_om + cols, (p / tl.sum(p, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def test_softmax_in_fp16_arithmetic_fails_the_fp16_case():
    def softmax_fp16(x, out):
        if x.dtype != torch.float16 or x.shape[1] > 1024 or x.stride(1) != 1:
            softmax(x, out)  # the course's kernel everywhere else: only the fp16 case is on trial
            return
        softmax_fp16_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), out.stride(0),
                                           BLOCK_N=triton.next_power_of_2(x.shape[1]))

    failure("05.softmax", softmax_fp16, "fp16 storage, fp32 arithmetic", "elements differ beyond")


def _attention_case(causal: bool, S: int = 45, D: int = 16):
    from course_utils.checks.l05_online_softmax import _attention_expected
    from course_utils.grading.harness import Case, Out

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn((1, 2, S, D), generator=g) * 3 for _ in range(3))
    return Case("t", (q, k, v, Out("out", (1, 2, S, D), torch.float32), causal),
                {"out": _attention_expected(q, k, v, causal)}, 2e-5, 2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_mistakes_are_named_by_their_values(causal):
    from course_utils.checks import l05_online_softmax as c05

    case = _attention_case(causal)
    q, k, v = case.args[:3]
    D = q.shape[-1]
    explain = c05._attention_explain
    exp_for_exp2 = c05._attention_scaled(q, k, v, causal, 1 / (math.log(2) * math.sqrt(D)))
    assert "exp() of scores scaled for exp2" in explain({"out": exp_for_exp2}, case)
    no_rescale = c05._attention_no_rescale(q, k, v, causal, 16)
    assert not torch.allclose(no_rescale, case.expected["out"], atol=1e-3), "the case must show the mistake"
    assert "accumulator that is not rescaled gives (tiles of 16 keys)" in explain({"out": no_rescale}, case)
    assert explain({"out": case.expected["out"] + 1.0}, case) == ""
    if not causal:
        unmasked = c05._attention_scaled(q, k, v, False, 1 / math.sqrt(D), pad_keys=-45 % 32)
        assert "keys past S left in the softmax" in explain({"out": unmasked}, case)


# --- wrong answers made from the solution by one edit (helpers.mutant) ---------------------------

def test_softmax_padding_loaded_as_zero_is_named():
    wrong = mutant("l05_online_softmax", "softmax",
                   ('mask=col_mask[None, :], other=float("-inf")).to(tl.float32)',
                    'mask=col_mask[None, :], other=0.0).to(tl.float32)'))
    failure("05.softmax", wrong, "padded with zeros to a block of", "load them with other=-inf")


def test_softmax_exp2_without_log2e_is_named():
    wrong = mutant("l05_online_softmax", "softmax", ("p = tl.exp(x - m[:, None])", "p = tl.exp2(x - m[:, None])"))
    failure("05.softmax", wrong, "a softmax in base 2", "log2(e)")


def test_softmax_online_sum_without_rescale_fails_on_long_rows():
    wrong = mutant("l05_online_softmax", "softmax", ("d = d * tl.exp(m - m_ref) + tl.exp(x - m_ref)",
                                                     "d = d + tl.exp(x - m_ref)"))
    failure("05.softmax", wrong, "longer than one block", "rescale the running sum by exp(m_old - m_new)")


def test_attention_causal_mask_without_the_diagonal_is_named():
    wrong = mutant("l05_online_softmax", "attention", ("keep = keep & (keys[None, :] <= offs_m[:, None])",
                                                       "keep = keep & (keys[None, :] < offs_m[:, None])"))
    failure("05.attention", wrong, "NaN in query 0 only", "the diagonal included")


def test_attention_without_the_final_division_is_named():
    wrong = mutant("l05_online_softmax", "attention", ("out = acc / l_i[:, None]", "out = acc"))
    failure("05.attention", wrong, "without the final division by l")


_MAX_MESSAGE = ("NaN or inf", "m_new must be max(m_old, the tile's max)")


@interpreter_only  # the case of scores near +-100 runs in the interpreter only (fp32 dots, not TF32)
@pytest.mark.parametrize("edits, says", [
    # a causal diagonal tile of 16 keys (the interpreter's) can hide every key from a query: its max alone is
    # -inf there, and exp(-inf - -inf) NaN, at the first causal case
    ([("m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)", "m_new = tl.max(s, axis=1) * qk_scale")],
     _MAX_MESSAGE),
    ([("p = tl.exp2(s * qk_scale - m_new[:, None])", "p = tl.exp2(s * qk_scale)"),
      ("alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp2(m_new - m_new)")],
     ("score near +120", *_MAX_MESSAGE, "each query its own max")),
    ([("tl.max(s, axis=1) * qk_scale)", "tl.max(s) * qk_scale)")],
     ("score near +120", *_MAX_MESSAGE, "each query its own max")),
], ids=["running max from the tile alone", "no max subtracted", "one max for all the tile's queries"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_attention_running_max_that_falls_or_is_not_subtracted_fails(edits, says, seed):
    """All three are exact rescalings until exp over- or underflows: scores below ~40 never make it."""
    wrong = mutant("l05_online_softmax", "attention", *edits)
    failure("05.attention", wrong, *says, seed=seed)


@pytest.mark.parametrize("edits", [
    [("* stride_xn, mask=mask, other=float(\"-inf\")).to(tl.float32)\n        m_new",
      ", mask=mask, other=float(\"-inf\")).to(tl.float32)\n        m_new")],  # pass 1 reads x as contiguous
    # out with the strides of the wider tensor x is a slice of: stores past out's memory (on a GPU, anywhere)
    pytest.param([("out_row = out_ptr + row * stride_om", "out_row = out_ptr + row * stride_xm")],
                 marks=interpreter_only),
    pytest.param([("tl.store(out_row + (start + offs_n) * stride_on",
                   "tl.store(out_row + (start + offs_n) * stride_xn")], marks=interpreter_only),
], ids=["x's column stride", "x's row stride for out", "x's column stride for out"])
def test_softmax_online_loop_with_a_stride_mistake_fails(edits):
    """The strided cases have short rows, which the one-pass kernel takes: the online loop's strides went
    unchecked."""
    wrong = mutant("l05_online_softmax", "softmax", *edits)
    failure("05.softmax", wrong, "every other column of a wider tensor: the long-row loop")


@pytest.mark.parametrize("new_max", ["tl.where(mask, x, m)", "tl.where(mask, tl.max(x, axis=0), m)"],
                         ids=["each lane's latest value", "the block's max alone"])
def test_softmax_online_running_max_that_falls_fails(new_max):
    """Until exp(m_old - m_new) overflows these are exact rescalings: every other long row passes them."""
    wrong = mutant("l05_online_softmax", "softmax", ("m_new = tl.maximum(m, x)", f"m_new = {new_max}"))
    failure("05.softmax", wrong, "a 50 first, then values near -100", "m_new = max(m_old, the block's max)")


def test_softmax_one_max_for_a_whole_tile_of_rows_fails():
    """tl.max(x) without axis= over a tile of several rows: every row shifted by the tile's max, which is
    exact while the rows of a tile lie within ~88 of each other, as every other case's do."""
    wrong = mutant("l05_online_softmax", "softmax",
                   ("m = tl.max(x, axis=1)  # (ROWS,) pass 1, in registers", "m = tl.max(x)"),
                   ("p = tl.exp(x - m[:, None])", "p = tl.exp(x - m)"))
    failure("05.softmax", wrong, "rows near +100 and near -100 in turn", "tl.max(x, axis=1)")


# --- loops that never leave their first tile, and reads that hide from the log ----------------------

def test_attention_with_tiles_of_128_and_no_rescale_fails():
    """With 128 x 128 tiles every other CPU case is one key tile, where the rescale never matters: the case
    of 300 keys has three. A GPU's first cases of several key tiles come before it: S = 1000, eight tiles."""
    wrong = mutant("l05_online_softmax", "attention",
                   ('BLOCK_M = BLOCK_M or config.kwargs["BLOCK_M"]', "BLOCK_M = 128"),
                   ('BLOCK_N = BLOCK_N or config.kwargs["BLOCK_N"]', "BLOCK_N = 128"),
                   ("alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp2(m_new - m_new)"))
    err = failure("05.attention", wrong, "S = 300, large scores" if current().interpret else "S = 1000")
    assert not isinstance(err, CandidateError), "the mutant must fail by its values, not by an exception"


def test_softmax_online_over_its_first_block_of_65536_only_fails():
    """The online kernel with one block of 65536 and no loop holds every row up to 65536 long; the check's
    long rows (70000 in the interpreter, 100000 on a GPU) do not fit."""
    wrong = mutant("l05_online_softmax", "softmax",
                   ("block_n=size(4096, 8192)", "block_n=65536"),
                   ("for start in range(0, n_cols, BLOCK_N):  # pass 1",
                    "for start in range(0, BLOCK_N, BLOCK_N):  # pass 1"),
                   ("for i in range(n_blocks):  # pass 2", "for i in range(1):  # pass 2"),
                   ("start = (n_blocks - 1 - i) * BLOCK_N", "start = 0"))
    failure("05.softmax", wrong, f"rows of {LONG_COLS}")


def _stats_nan_after_a_finite_block(x, block):
    """Merges an all -inf block's (-inf, NaN) as if it were a block: right only while nothing came before."""
    m, d = -math.inf, 0.0
    for start in range(0, x.numel(), block):
        chunk = x[start:start + block].to(torch.float64)
        m_b = float(chunk.max())
        d_b = float(torch.exp(chunk - m_b).sum())  # NaN when the block is all -inf
        if m == -math.inf:
            m, d = m_b, (0.0 if m_b == -math.inf else d_b)
            continue
        m_new = max(m, m_b)
        m, d = m_new, d * math.exp(m - m_new) + d_b * math.exp(m_b - m_new)
    return m, d


def test_online_stats_spoiled_by_an_all_minus_inf_block_after_finite_ones_fails():
    failure("05.online_softmax_stats", _stats_nan_after_a_finite_block, "the third too", "NaN")


def test_online_stats_converting_all_of_x_first_is_told_to_convert_each_block():
    """x.to(torch.float64) before a right loop reads all of x at once: the message names the conversion."""
    def convert_first(x, block):
        x = x.to(torch.float64)
        m, d = -math.inf, 0.0
        for start in range(0, x.numel(), block):
            chunk = x[start:start + block]
            m_b = float(chunk.max())
            m, d = merge_stats(m, d, m_b, float(torch.exp(chunk - m_b).sum()) if m_b > -math.inf else 0.0)
        return m, d

    failure("05.online_softmax_stats", convert_first, f"read {size(4099, 1021)} elements of x at once",
            "convert each block as you read it")


def test_online_stats_against_a_fixed_reference_overflows():
    """One pass, each block's exp taken against the first finite block's max and rescaled once at the end:
    exact in theory, and in fp32 until a later value lies ~88 above that max (exp overflows)."""
    def fixed_reference(x, block):
        ref, m, d = None, -math.inf, 0.0
        for start in range(0, x.numel(), block):
            chunk = x[start:start + block]  # fp32 stays fp32: exp overflows past 88
            m_b = float(chunk.max())
            m = max(m, m_b)
            if ref is None and m_b > -math.inf:
                ref = m_b
            if ref is not None:
                d += float(torch.exp(chunk - ref).sum())
        return m, (d * math.exp(ref - m) if ref is not None else 0.0)

    failure("05.online_softmax_stats", fixed_reference, "then a 50 in the last block", "sum = inf")


@pytest.mark.parametrize("reads", ["cat of the blocks", "as_subclass"])
def test_online_stats_reading_everything_at_once_through_a_side_door_fails(reads):
    """torch.cat over x's own blocks, or a plain tensor made with as_subclass (which torch does not route
    through __torch_function__), read all of x at once: the log counts both."""
    def stats(x, block):
        y = torch.cat(list(x.split(block))) if reads == "cat of the blocks" else x.as_subclass(torch.Tensor)
        y = y.to(torch.float64)
        m = float(y.max())
        return m, (float(torch.exp(y - m).sum()) if m > -math.inf else 0.0)

    failure("05.online_softmax_stats", stats, "elements of x at once")


# --- fp16 arithmetic inside attention, and rows longer than Triton's largest block -------------------

def test_attention_with_fp16_scores_fails():
    """The scores rounded to q's dtype: exact in fp32 (all but the fp16 cases), 0.8% off at scores of 16."""
    wrong = mutant("l05_online_softmax", "attention",
                   ("s = tl.dot(q, k)  #", "s = tl.dot(q, k).to(q.dtype)  #"))
    # on a GPU the bf16 cases come first, and bf16 scores (8 bits) fail there already
    expected = (("fp16, q, k and v of std 4", "off by more than fp16's rounding") if current().interpret
                else ())
    failure("05.attention", wrong, *expected)


def test_attention_with_an_fp16_accumulator_fails():
    """acc in q's dtype: an fp16 acc overflows once sum of p * v passes 65504."""
    wrong = mutant("l05_online_softmax", "attention",
                   ("acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)",
                    "acc = tl.zeros((BLOCK_M, HEAD_DIM), q.dtype)"),
                   ("acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])",
                    "acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None]).to(q.dtype)"))
    expected = (("v near 1000", "passes 65504, fp16's largest value", "keep acc") if current().interpret
                else ())
    failure("05.attention", wrong, *expected)


@interpreter_only_because("a one-block kernel for rows of 100000 would compile for minutes on a GPU")
def test_softmax_with_one_block_per_row_fails_past_triton_largest_block():
    """BLOCK = next_power_of_2(n_cols) and no loop: the interpreter has no register limit, so only a row
    longer than 2^20 elements, where Triton refuses the block, shows the mistake there."""
    wrong = mutant("l05_online_softmax", "softmax", ("if block_n > ONE_PASS_MAX_COLS:", "if False:"))
    err = failure("05.softmax", wrong, "rows of 2^20 + 3", "block of more than 2^20 elements",
                  "loop over the data in blocks of a fixed size")
    assert isinstance(err, CandidateError)


# --- 05.online_softmax_stats: one pass over blocks, in any order; no reading x whole on the side --------

def _stats_twice_per_block(x, block):
    """Per block, its max in one Python loop, then its sum in another: the block is read twice while it is
    the current one, which is still one pass over the blocks."""
    m, d = NEG_INF, 0.0
    for s in range(0, x.numel(), block):
        chunk = x[s:s + block]
        m_b = max(float(v) for v in chunk)
        d_b = sum(math.exp(float(v) - m_b) for v in chunk) if m_b > NEG_INF else 0.0
        m, d = merge_stats(m, d, m_b, d_b)
    return m, d


def _stats_last_block_first(x, block):
    return _stats_over(x[s:s + block] for s in reversed(range(0, x.numel(), block)))


@pytest.mark.parametrize("stats", [_stats_twice_per_block, _stats_last_block_first],
                         ids=["each block read twice", "last block first"])
def test_online_stats_in_one_pass_over_blocks_in_any_order_passes(stats):
    check("05.online_softmax_stats", stats, seed=1, quiet=True)


def test_online_stats_going_back_to_a_finished_block_is_named():
    def peek_back(x, block):  # after each block, a look at the first one again
        m, d = NEG_INF, 0.0
        for b in _blocks(x, block):
            float(x[0])
            m, d = merge_stats(m, d, *_stats_over([b]))
        return m, d

    failure("05.online_softmax_stats", peek_back,
            "of block 0 (x[0:64]) after the loop had moved on to x[64:128]", "second pass")


def _pickled(x):
    import pickle

    return pickle.loads(pickle.dumps(x))


def _saved(x):
    import io

    buffer = io.BytesIO()
    torch.save(x, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _deep_copied(x):
    import copy

    return copy.deepcopy(x)


@pytest.mark.parametrize("whole", [
    _pickled, _saved, _deep_copied,
    pytest.param(lambda x: torch.tensor(x.numpy()), marks=interpreter_only_because("NumPy reads the host's")),
    lambda x: torch.tensor(x.tolist()),
], ids=["pickle", "torch.save", "copy.deepcopy", "numpy", "tolist"])
@pytest.mark.parametrize("subclass_off", [False, True], ids=["", "subclass off"])
def test_online_stats_copying_x_whole_after_a_faked_pass_fails(whole, subclass_off):
    """Each block touched once (so the log shows one pass), then the answer computed in two passes over a
    copy of x made by serializing it, which reads its storage through torch's own frames (no aten op):
    counted as a read of all of x."""
    def faked(x, block):
        for b in _blocks(x, block):
            b.max()
        with torch._C.DisableTorchFunctionSubclass() if subclass_off else contextlib.nullcontext():
            y = torch.Tensor.as_subclass(whole(x), torch.Tensor).to(torch.float64)
        m = float(y.max())
        return m, (float(torch.exp(y - m).sum()) if m > NEG_INF else 0.0)

    err = failure("05.online_softmax_stats", faked, "elements of x at once")
    assert not isinstance(err, CandidateError), str(err)


def test_online_stats_error_shows_only_the_students_frames():
    """x's read log wraps every torch call on x: its frames (course_utils/checks) are the checker's."""
    def buggy(x, block):
        for b in _blocks(x, block):
            b.max(dim=1)  # a 1-D block has no dim 1
        return NEG_INF, 0.0

    err = failure("05.online_softmax_stats", buggy, "IndexError", "b.max(dim=1)", "in buggy")
    assert isinstance(err, CandidateError)
    assert "course_utils" not in str(err) and "__torch_function__" not in str(err), str(err)


@interpreter_only  # the case of scores near -120 runs in the interpreter only, as that of scores near +-120
def test_attention_whose_running_max_starts_at_zero_fails():
    """m_i = 0 instead of -inf to start: max(0, scores) is as good a shift as the row max while some score
    of each query is above -88, as in every other case; with every score near -120, exp(score - 0) is 0 for
    every key, and l = 0 gives 0 / 0."""
    wrong = mutant("l05_online_softmax", "attention",
                   ('m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)',
                    "m_i = tl.zeros((BLOCK_M,), tl.float32)"))
    failure("05.attention", wrong, "every score near -120", "the running max started at 0")


def test_attention_whose_causal_diagonal_ends_one_key_tile_on_fails():
    """The diagonal's keys end BLOCK_N after the full tiles, where the query tile ends BLOCK_M after: right
    while the tiles were square, as the interpreter's 32 x 32 were (now 32 x 16; a GPU's are 128 x 64)."""
    wrong = mutant("l05_online_softmax", "attention",
                   ("masked_end = tl.minimum(full_end + BLOCK_M, S)",
                    "masked_end = tl.minimum(full_end + BLOCK_N, S)"))
    failure("05.attention", wrong, "causal")


@interpreter_only_because("the extra programs store past out, where a GPU does not stop them")
def test_attention_whose_grid_counts_key_tiles_fails():
    wrong = mutant("l05_online_softmax", "attention",
                   ("grid = (triton.cdiv(S, BLOCK_M) * B * H,)", "grid = (triton.cdiv(S, BLOCK_N) * B * H,)"))
    failure("05.attention", wrong, "S = 37")


def _widened(array_of, x, block):
    """NumPy's array over x's first element, widened with stride tricks to all of x after a pass that touches
    each block once: the read log sees one pass, the answer comes from two over the widened array."""
    import numpy as np

    first = array_of(x[:1])
    for b in _blocks(x, block):
        b.max()
    whole = np.lib.stride_tricks.as_strided(first, shape=(x.numel(),), strides=first.strides).astype(np.float64)
    m = float(whole.max())
    return m, (float(np.exp(whole - m).sum()) if m > NEG_INF else 0.0)


@interpreter_only_because("NumPy reads the host's memory")
@pytest.mark.parametrize("array_of", [lambda t: t.numpy(), lambda t: __import__("numpy").asarray(t)],
                         ids=["numpy", "asarray"])
def test_online_stats_widening_a_numpy_block_past_itself_fails(array_of):
    """NumPy's array of a block is a copy (NaN around the block): widened, it reads none of x."""
    failure("05.online_softmax_stats", lambda x, block: _widened(array_of, x, block), "max = nan",
            "widened past its block")


@interpreter_only_because("NumPy reads the host's memory")
def test_online_stats_through_dlpack_reads_all_of_x():
    """np.from_dlpack(x[:1]) is an array over x's memory, as data_ptr is its address: a read of all of it."""
    import numpy as np

    failure("05.online_softmax_stats", lambda x, block: _widened(np.from_dlpack, x, block),
            "`__dlpack__` read", "elements of x at once")


@interpreter_only_because("NumPy reads the host's memory")
def test_online_stats_in_numpy_block_by_block_passes():
    """NumPy's arrays of the blocks, one at a time: one pass, with the blocks' own values."""
    import numpy as np

    def stats(x, block):
        m, d = NEG_INF, 0.0
        for s in range(0, x.numel(), block):
            a = np.asarray(x[s:s + block]).astype(np.float64)
            m_b = float(a.max())
            m, d = merge_stats(m, d, m_b, float(np.exp(a - m_b).sum()) if m_b > NEG_INF else 0.0)
        return m, d

    check("05.online_softmax_stats", stats, seed=2, quiet=True)


@pytest.mark.parametrize("product", ["q * qk_scale", "q.to(tl.float32) * qk_scale"])
def test_attention_with_q_prescaled_in_fp16_is_named(product):
    """q = (q * qk_scale).to(tl.float16), an older Triton tutorial's line: the scores stay fp32, so the
    message that blamed fp16 scores, m, l or acc pointed at code the kernel did not have. (q * qk_scale
    multiplies in fp16, the scale rounded too; q.to(tl.float32) * qk_scale in fp32.)"""
    wrong = mutant("l05_online_softmax", "attention",
                   ("q = tl.load(q_ptrs, mask=offs_m[:, None] < S, other=0.0)",
                    "q = tl.load(q_ptrs, mask=offs_m[:, None] < S, other=0.0)\n"
                    f"    q = ({product}).to(q_ptr.dtype.element_ty)"),
                   ("S, qk_scale, 0, full_end", "S, 1.0, 0, full_end"),
                   ("S, qk_scale, full_end, masked_end", "S, 1.0, full_end, masked_end"))
    # on a GPU the bf16 cases come first: the same rounding, named in bf16
    failure("05.attention", wrong, "q multiplied by the scale and rounded back", "scale the fp32 scores")


@pytest.mark.parametrize("strides", [
    "out.stride(0), out.stride(1), out.stride(2), q.stride(3),",  # out's head-dim stride taken from q
    "H * S * D, out.stride(1), out.stride(2), out.stride(3),",  # out's batch taken as outermost
])
def test_attention_addressing_out_with_anothers_stride_fails(strides):
    """Every other out keeps its batch outermost, and the one strided head dim of out matched q's."""
    wrong = mutant("l05_online_softmax", "attention", ("*v.stride(), *out.stride(),", f"*v.stride(), {strides}"))
    failure("05.attention", wrong, "out stored (S, D, B, H)", at="out stored (S, D, B, H)")


@interpreter_only_because("the GPU's cases have D = 64 and 128; the interpreter's one case of D = 64 is its own")
def test_attention_with_a_head_dim_block_fixed_at_32_fails():
    wrong = mutant("l05_online_softmax", "attention", ("HEAD_DIM=D,", "HEAD_DIM=min(D, 32),"))
    failure("05.attention", wrong, "D = 64: the block of the head dim is D itself", at="D = 64: the block")


def test_attention_masking_p_after_exp_fails():
    """A causal mask on p after exp leaves the running max over the masked scores: an exact shift while
    they stay within ~88 of the visible ones, as in every other case."""
    p_line = "p = tl.exp2(s * qk_scale - m_new[:, None])  # (BLOCK_M, BLOCK_N), one FMA and one exp2 per score"
    wrong = mutant("l05_online_softmax", "attention",
                   ('s = tl.where(keep, s, float("-inf"))', 's = tl.where(keys[None, :] < S, s, float("-inf"))'),
                   (p_line, "p = tl.exp2(s * qk_scale - m_new[:, None])\n"
                            "        if MASKED:\n"
                            "            p = tl.where(keep, p, 0.0)"))
    failure("05.attention", wrong, "mask the scores (-inf) before the running max", at="the last key scoring ~150")


def test_softmax_whose_long_row_loop_rounds_1_over_d_to_16_bits_fails():
    wrong = mutant("l05_online_softmax", "softmax",
                   ("inv_d = 1.0 / d_row", "inv_d = (1.0 / d_row).to(out_ptr.dtype.element_ty)"))
    failure("05.softmax", wrong, "1 / sum in fp32", at="fp16 rows of")

