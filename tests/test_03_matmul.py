"""Lesson 03: the solutions pass their checks, plausible wrong answers fail with messages that point at
the mistake, and the autotune pruning, precision switch, tolerances and napkin maths do what they say."""
from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from course_utils.benches import l03_matmul as bench
from course_utils.checks.l03_matmul import dot_tolerance, grouped_order
from course_utils.grading import CheckFailed, check
from course_utils.lessons.l03_matmul import (SMALL_PROBLEM_FLOPS, dot_precision, grouped_pid, grouped_tile,
                                             linear_relu, matmul, matmul_configs, matmul_kernel, matmul_naive,
                                             matmul_naive_kernel, select_configs)
from course_utils.mode import current
from helpers import failure, interpreter_only, interpreter_only_because, mutant, recorded_launches

# On a GPU an unmasked load past the end of a small input can crash the CUDA context, and every later
# test with it: missing-mask answers are tested in the interpreter, which checks each address first.

TILE = matmul_configs()[0]  # the interpreter's one config (on a GPU, the first of the list)


# --- the solutions ------------------------------------------------------------------------------

@pytest.mark.parametrize("exercise_id, solution", [
    ("03.grouped_pid", grouped_pid), ("03.matmul_naive", matmul_naive), ("03.matmul", matmul),
    ("03.linear_relu", linear_relu)])
def test_solution_passes(exercise_id, solution):
    check(exercise_id, solution, seed=0, quiet=True)


def test_grouped_pid_passes_other_seeds():
    for seed in range(1, 6):
        check("03.grouped_pid", grouped_pid, seed=seed, quiet=True)


def test_matmul_passes_with_each_ieee_and_tf32_precision():
    check("03.matmul", lambda a, b, out: matmul(a, b, out, input_precision="ieee"), seed=2, quiet=True)
    check("03.matmul", lambda a, b, out: matmul(a, b, out, input_precision="tf32"), seed=3, quiet=True)


def test_matmul_passes_with_an_explicit_config():
    check("03.matmul", lambda a, b, out: matmul(a, b, out, config=TILE), seed=4, quiet=True)


@pytest.mark.skipif(not current().gpu, reason="the speed line's size is a case on a GPU only")
def test_matmul_wrong_only_on_a_large_problem_fails_on_a_gpu():
    """Every small case passes (the solution), and at 4096^3, where an autotuner picks its large tiles and
    Hopper the TMA path, the output is a @ a: the speed size's case fails it."""
    def small_only(a, b, out):
        matmul(a, a if 2 * a.shape[0] * b.shape[1] * a.shape[1] >= 2**36 else b, out)

    with pytest.raises(CheckFailed) as info:
        check("03.matmul", small_only, seed=7, quiet=True, course=True)
    assert "the speed line's size, 4096 x 4096 x 4096" in str(info.value)


# --- 03.grouped_pid: wrong answers --------------------------------------------------------------

def test_grouped_pid_row_major_fails():
    def row_major(pid, num_pid_m, num_pid_n, group_m):
        return pid // num_pid_n, pid % num_pid_n

    failure("03.grouped_pid", row_major, "row-major order", "expected")


def test_grouped_pid_column_major_fails():
    def column_major(pid, num_pid_m, num_pid_n, group_m):
        return pid % num_pid_m, pid // num_pid_m

    failure("03.grouped_pid", column_major, "column-major order")


def test_grouped_pid_unclipped_last_group_fails():
    def full_groups(pid, num_pid_m, num_pid_n, group_m):
        group_pids = group_m * num_pid_n
        first = pid // group_pids * group_m
        # no min(): the last group is as tall as the others
        return first + pid % group_pids % group_m, pid % group_pids // group_m

    failure("03.grouped_pid", full_groups, "outside the grid", "group_size_m = min(")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_pid_counting_rows_from_pid_not_from_the_group_fails(seed):
    """The older Triton tutorial's pid_m = first_pid_m + pid % group_size_m: a bijection, right in every
    full group, wrong in a short last group that starts at no multiple of its size; the fixed grids had
    none such (the random one only now and then)."""
    wrong = mutant("l03_matmul", "grouped_pid", ("first_pid_m + (pid % num_pid_in_group) % group_size_m",
                                                 "first_pid_m + pid % group_size_m"))
    failure("03.grouped_pid", wrong, "grid 5 x 3, group_m 3", "(pid % num_pid_in_group) % group_size_m",
            seed=seed)


def test_grouped_pid_non_bijection_fails():
    def collides(pid, num_pid_m, num_pid_n, group_m):
        group_pids = group_m * num_pid_n
        first = pid // group_pids * group_m
        rows = min(num_pid_m - first, group_m)
        return first + pid % group_pids % rows, pid % group_pids // group_m  # divides by group_m, not rows

    failure("03.grouped_pid", collides, "which pid", "already", "bijection")


def test_grouped_pid_returning_nothing_fails():
    failure("03.grouped_pid", lambda pid, num_pid_m, num_pid_n, group_m: None, "expected a tuple")


@triton.jit
def _tiles_kernel(out_ptr, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)
    tl.store(out_ptr + 2 * pid, pid_m)
    tl.store(out_ptr + 2 * pid + 1, pid_n)


@pytest.mark.parametrize("num_pid_m, num_pid_n, group_m", [(5, 3, 2), (7, 4, 3), (3, 9, 8), (6, 2, 1)])
def test_grouped_tile_in_a_kernel_matches_grouped_pid(num_pid_m, num_pid_n, group_m):
    n = num_pid_m * num_pid_n
    out = torch.empty(2 * n, dtype=torch.int32, device=current().device)
    _tiles_kernel[(n,)](out, num_pid_m, num_pid_n, GROUP_M=group_m)
    got = [tuple(pair) for pair in out.view(n, 2).tolist()]
    assert got == [grouped_pid(p, num_pid_m, num_pid_n, group_m) for p in range(n)]


def test_grouped_order_is_the_lessons_example_and_a_permutation():
    order = grouped_order(5, 3, 2)
    assert order[:6] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert order[12:] == [(4, 0), (4, 1), (4, 2)]  # the last group has one row
    for grid in [(5, 3, 2), (8, 8, 4), (7, 1, 3), (1, 7, 8)]:
        tiles = grouped_order(*grid)
        assert sorted(tiles) == [(m, n) for m in range(grid[0]) for n in range(grid[1])]


# --- 03.matmul_naive: wrong answers -------------------------------------------------------------

def _naive_launch(a, b, out, strides, grid=None, BLOCK_K=128):
    M, K = a.shape
    N = b.shape[1]
    matmul_naive_kernel[grid or (M * N,)](a, b, out, M, N, K, *strides, out.stride(0), out.stride(1),
                                          BLOCK_K=BLOCK_K)


def test_naive_assuming_contiguous_inputs_fails():
    def contiguous_only(a, b, out):
        M, K = a.shape
        _naive_launch(a, b, out, (K, 1, b.shape[1], 1))  # the strides of contiguous tensors, not a's and b's

    failure("03.matmul_naive", contiguous_only, "transposed", "differ beyond")


def test_naive_taking_outs_column_stride_for_1_fails_on_a_column_major_out():
    """out + m * stride_cm + n: right for a contiguous out and for one padded between its rows, not for a
    column-major one (strides (1, M))."""
    def column_stride_1(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        matmul_naive_kernel[(M * N,)](a, b, out, M, N, K, *a.stride(), *b.stride(), out.stride(0), 1,
                                      BLOCK_K=128)

    failure("03.matmul_naive", column_stride_1, "out transposed (strides (1, ",
            "address out with its strides")


def test_naive_one_program_per_row_fails():
    def rows_only(a, b, out):  # M programs where M * N are needed: only the first M outputs are written
        _naive_launch(a, b, out, (a.stride(0), a.stride(1), b.stride(0), b.stride(1)), grid=(a.shape[0],))

    failure("03.matmul_naive", rows_only, "never written")


def test_naive_grid_of_a_vocabulary_sized_output_fits_a_gpu(monkeypatch):
    """(1, 4096) @ (4096, 128256), an LM head: a 2-D grid (M, N) put 128256 programs on axis 1, where a GPU
    holds 65535 ("Triton Error [CUDA]: invalid argument"); the interpreter has no such limit, so the launch
    is recorded here instead of run."""
    from course_utils.lessons import l03_matmul as l03

    launches = recorded_launches(monkeypatch, l03, "matmul_naive_kernel")
    for M, K, N in [(1, 4096, 128256), (100_000, 64, 3)]:
        a, b = torch.empty((M, K), device="meta"), torch.empty((K, N), device="meta")
        l03.matmul_naive(a, b, torch.empty((M, N), device="meta"))
        ((grid, _),) = launches
        launches.clear()
        assert all(programs <= 65535 for programs in grid[1:]), grid
        assert math.prod(grid) == M * N  # one program per output element


@triton.jit
def _naive_one_chunk_kernel(a_ptr, b_ptr, c_ptr, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                            stride_cn, BLOCK_K: tl.constexpr):
    m = tl.program_id(0)
    n = tl.program_id(1)
    k = tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + m * stride_am + k * stride_ak, mask=k < K, other=0.0)
    b = tl.load(b_ptr + k * stride_bk + n * stride_bn, mask=k < K, other=0.0)
    tl.store(c_ptr + m * stride_cm + n * stride_cn, tl.sum(a.to(tl.float32) * b.to(tl.float32), axis=0))


def test_naive_without_a_k_loop_fails():
    def one_chunk(a, b, out):  # only the first BLOCK_K terms of each dot
        _naive_one_chunk_kernel[(a.shape[0], b.shape[1])](a, b, out, a.shape[1], a.stride(0), a.stride(1),
                                                          b.stride(0), b.stride(1), out.stride(0),
                                                          out.stride(1), BLOCK_K=128)

    # the interpreter's first case is one row (M = 1, K = 300); a GPU's first is M, N, K = 1823, 781, 517
    first = "M = 1" if current().interpret else "M, N, K = 1823, 781, 517"
    failure("03.matmul_naive", one_chunk, first, "differ beyond")


@triton.jit
def _naive_unmasked_kernel(a_ptr, b_ptr, c_ptr, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                           stride_cn, BLOCK_K: tl.constexpr):
    m = tl.program_id(0)
    n = tl.program_id(1)
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        acc += tl.load(a_ptr + m * stride_am + k * stride_ak) * tl.load(b_ptr + k * stride_bk + n * stride_bn)
    tl.store(c_ptr + m * stride_cm + n * stride_cn, tl.sum(acc, axis=0))


@interpreter_only
def test_naive_without_the_k_mask_fails():
    def unmasked(a, b, out):
        _naive_unmasked_kernel[(a.shape[0], b.shape[1])](a, b, out, a.shape[1], a.stride(0), a.stride(1),
                                                         b.stride(0), b.stride(1), out.stride(0),
                                                         out.stride(1), BLOCK_K=32)

    failure("03.matmul_naive", unmasked, "tl.load out of bounds", "mask")


# --- 03.matmul: wrong answers -------------------------------------------------------------------

def _launch(kernel, a, b, out, K=None, grid=None, strides=None):
    """Launch a matmul-shaped kernel with the interpreter's tile (or the GPU list's first config)."""
    M, K_ = a.shape
    N = b.shape[1]
    meta = TILE.kwargs
    grid = grid or (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    strides = strides or (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    kernel[grid](a, b, out, out, M, N, K_ if K is None else K, *strides, out.stride(0), out.stride(1),
                 HAS_BIAS=False, RELU=False, INPUT_PRECISION=dot_precision(a.dtype), **TILE.all_kwargs())


def test_matmul_only_for_multiples_of_block_k_fails():
    def full_blocks_only(a, b, out):  # as if the K loop ran K // BLOCK_K times
        K = a.shape[1]
        _launch(matmul_kernel.fn, a, b, out, K=K - K % TILE.kwargs["BLOCK_K"])

    failure("03.matmul", full_blocks_only, "1 x 1 x 1", "differ beyond", "mask the K loads")


@triton.jit
def _unmasked_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, HAS_BIAS: tl.constexpr, RELU: tl.constexpr,
                     INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """A tiled matmul with no masks at all: right only when M, N, K are multiples of the blocks."""
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + offs_k
        a = tl.load(a_ptr + rows[:, None] * stride_am + kk[None, :] * stride_ak)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + cols[None, :] * stride_bn)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty))


@interpreter_only
def test_matmul_without_masks_fails():
    failure("03.matmul", lambda a, b, out: _launch(_unmasked_kernel, a, b, out), "out of bounds",
            "Is a mask missing")


def test_matmul_assuming_contiguous_inputs_fails():
    def contiguous_only(a, b, out):
        M, K = a.shape
        _launch(matmul_kernel.fn, a, b, out, strides=(K, 1, b.shape[1], 1))

    failure("03.matmul", contiguous_only, "transposed", "differ beyond", "use all six strides")


def test_matmul_grid_over_rows_only_fails():
    def rows_only(a, b, out):
        _launch(matmul_kernel.fn, a, b, out, grid=(triton.cdiv(a.shape[0], TILE.kwargs["BLOCK_M"]),))

    failure("03.matmul", rows_only, "never written")


def test_matmul_with_torch_on_the_host_fails():
    def torch_matmul(a, b, out):
        out.copy_(a @ b)

    failure("03.matmul", torch_matmul, "no Triton kernel was launched", "computed with torch operations")


# --- 03.linear_relu: wrong answers --------------------------------------------------------------

def test_linear_relu_without_relu_fails():
    failure("03.linear_relu", lambda x, w, bias, out: matmul(x, w.t(), out, bias=bias), "differ beyond")


def test_linear_relu_without_bias_fails():
    failure("03.linear_relu", lambda x, w, bias, out: matmul(x, w.t(), out, relu=True), "differ beyond",
            "bias[n]")


@interpreter_only
def test_linear_relu_with_w_not_transposed_fails():
    failure("03.linear_relu", lambda x, w, bias, out: matmul(x, w, out, bias=bias, relu=True))


# --- autotune pruning, precision, tolerances ----------------------------------------------------

def _named(dtype, M, N, K):
    return {"a_ptr": torch.empty(0, dtype=dtype), "M": M, "N": N, "K": K}


def test_select_configs_fits_block_k_to_the_dtype():
    gpu_configs = matmul_configs(interpret=False)
    for dtype, block_k in [(torch.float16, 64), (torch.bfloat16, 64), (torch.float32, 32)]:
        kept = select_configs(gpu_configs, _named(dtype, 4096, 4096, 4096))
        assert len(kept) > 1
        assert {c.kwargs["BLOCK_K"] for c in kept} == {block_k}


def test_select_configs_gives_small_problems_one_small_tile():
    gpu_configs = matmul_configs(interpret=False)
    for M, N, K in [(64, 256, 128), (128, 256, 256), (1823, 781, 517)]:
        assert 2 * M * N * K < SMALL_PROBLEM_FLOPS
        (only,) = select_configs(gpu_configs, _named(torch.float16, M, N, K))
        assert only.kwargs["BLOCK_M"] * only.kwargs["BLOCK_N"] == min(
            c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] for c in gpu_configs)
    assert len(select_configs(gpu_configs, _named(torch.float16, 1024, 1024, 1024))) > 1


def test_interpreter_autotunes_nothing():
    if current().interpret:
        assert len(matmul_configs()) == 1


def test_dot_precision_follows_torch():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert dot_precision(torch.float32) == "ieee"
        torch.set_float32_matmul_precision("high")
        assert dot_precision(torch.float32) == "tf32"
        assert dot_precision(torch.float16) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_matmul_epilogue_with_an_explicit_config():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 45, generator=gen).to(current().device)
    w = torch.randn(29, 45, generator=gen).to(current().device)
    bias = torch.randn(29, generator=gen).to(current().device)
    out = torch.empty(37, 29, device=current().device)
    matmul(x, w.t(), out, bias=bias, relu=True, config=TILE, input_precision="ieee")
    expected = torch.relu(x.double().cpu() @ w.double().cpu().t() + bias.double().cpu())
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-4, rtol=1e-5)
    assert (out == 0).any() and (out > 0).any()


@pytest.mark.parametrize("k", [17, 300, 4099])
def test_dot_tolerance_covers_fp32_accumulation(k):
    gen = torch.Generator().manual_seed(k)
    a, b = torch.randn(64, k, generator=gen), torch.randn(k, 64, generator=gen)
    exact = a.double() @ b.double()
    atol, rtol = dot_tolerance(torch.float32, k)
    err = ((a @ b).double() - exact).abs()
    assert bool((err <= atol + rtol * exact.abs()).all())
    if current().interpret:  # exact fp32 products: far tighter than the error of dropping one term
        assert atol < 0.01 * float(exact.abs().mean()) / k**0.5


def test_dot_tolerance_covers_rounding_to_fp16():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 500, generator=gen).half(), torch.randn(500, 64, generator=gen).half()
    exact = a.double() @ b.double()
    atol, rtol = dot_tolerance(torch.float16, 500)
    assert bool(((exact.half().double() - exact).abs() <= atol + rtol * exact.abs()).all())


# --- napkin maths and the benchmark's helpers ---------------------------------------------------

def test_tiled_traffic_is_2n3_over_l():
    n = 4096
    for tile in (1, 16, 64, 128):
        assert bench.tiled_load_bytes(n, n, n, tile, tile, 2) == 2 * n**3 // tile * 2
    assert bench.tiled_load_bytes(n, n, n, 1, 1, 2) == bench.naive_load_bytes(n, n, n, 2)
    # partial tiles load as much as whole ones
    assert bench.tiled_load_bytes(100, 100, 50, 64, 64, 4) == 4 * (64 + 64) * 50 * 4


def test_fusing_the_epilogue_saves_2mn():
    for M, N, K in bench.LINEAR_SHAPES:
        saved = bench.linear_relu_bytes(M, N, K, 2, False) - bench.linear_relu_bytes(M, N, K, 2, True)
        assert saved == 2 * M * N * 2
    assert bench.linear_relu_bytes(4, 3, 2, 2, True) == bench.min_bytes(4, 3, 2, 2) + 3 * 2


def test_matmul_flops_and_names():
    for M, N, K in ((2, 3, 4), (1, 1, 1), (4096, 4096, 4096)):
        assert bench.matmul_flops(M, N, K) == 2 * M * N * K
    assert bench.size_of("matmul fp16 4096^3") == 4096
    assert bench.size_of("matmul fp32 tf32 4096^3") is None
    assert bench.size_of("linear_relu fp16 (64,256,128)") is None
    names = set()
    for cfg in matmul_configs(interpret=False):  # a name says the config, and tells configs apart
        kw = cfg.kwargs
        name = bench.config_name(cfg)
        assert name.startswith(f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{cfg.num_warps} "
                               f"s{cfg.num_stages}"), name
        names.add(name)
    assert len(names) == len(matmul_configs(interpret=False))


def test_plot_vs_size_draws_one_line_per_implementation_and_dtype():
    import matplotlib

    matplotlib.use("Agg")
    rows = [{"group": f"matmul {dt} {n}^3", "name": name, "tflops": n / 100}
            for dt in ("fp16", "bf16") for n in (512, 1024) for name in (bench.CUBLAS, bench.OURS)]
    rows.append({"group": "tile size fp16 4096^3", "name": "triton (ours) L=16", "tflops": 1.0})
    fig = bench.plot_vs_size(rows)
    assert len(fig.axes[0].lines) == 4


def test_only_tf32_gets_the_k_major_copy_on_hopper(monkeypatch):
    """On Hopper, fp32 tf32 transposes a row-major b first (a second launch); fp16/bf16 never do."""
    import course_utils.lessons.l03_matmul as l03
    from course_utils.grading.guard import watching

    monkeypatch.setattr(l03, "hopper", lambda: True)
    for dtype, precision, launches in ((torch.float16, None, 1), (torch.float32, "tf32", 2), (torch.float32, "ieee", 1)):
        a = torch.randn(32, 48).to(current().device, dtype)
        b = torch.randn(48, 40).to(current().device, dtype)
        out = torch.empty(32, 40, dtype=dtype, device=current().device)
        with watching() as watch:
            l03.matmul(a, b, out, input_precision=precision)
        assert len(watch.launches) == launches, (dtype, precision, watch.launches)
        torch.testing.assert_close(out.float(), (a.double() @ b.double()).float(), atol=0.05, rtol=0.01)


def test_a_broadcast_operand_stays_off_the_tma_path(monkeypatch):
    """A TMA descriptor's rows are a stride apart; an operand expanded from one row (stride 0) goes to the
    pointer kernel, which reads any strides."""
    import course_utils.lessons.l03_matmul as l03

    monkeypatch.setattr(l03, "hopper", lambda: True)
    monkeypatch.setattr(l03, "TMA_PROBLEM_FLOPS", 0)
    a = torch.randn(64, 32, dtype=torch.float16)
    b = torch.randn(48, 32, dtype=torch.float16).t()  # K-major, as the TMA kernel reads b
    out = torch.empty(64, 48, dtype=torch.float16)
    assert l03.tma_ready(a, b, out) == hasattr(tl, "make_tensor_descriptor")
    assert not l03.tma_ready(a[:1].expand(64, 32), b, out)
    assert not l03.tma_ready(a, b[:, :1].expand(32, 48), out)


# --- the checks' newer cases: strided out, an fp16 accumulator, fusion ------------------------------

@triton.jit
def matmul_fixed_out_strides_kernel(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                    ACC_FP16: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16 if ACC_FP16 else tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (k0 + offs_k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k0 + offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b).to(acc.dtype)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


def _fixed(acc_fp16: bool):
    """A matmul that writes out as if its strides were (N, 1); with acc_fp16, accumulating in fp16."""
    def matmul_fixed(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
        matmul_fixed_out_strides_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                              b.stride(1), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, ACC_FP16=acc_fp16)
    return matmul_fixed


@interpreter_only
def test_matmul_autotuned_over_several_configs_is_told_the_interpreter_cannot_time_them():
    """The autotuner times each config through the GPU driver, which the interpreter lacks: Triton's own
    error ("0 active drivers") becomes what to do about it."""
    second = triton.Config({**TILE.kwargs, "BLOCK_M": 32}, num_warps=4)
    tuned = triton.autotune(configs=[TILE, second], key=["M", "N", "K"])(matmul_kernel.fn)

    def several_configs(a, b, out):
        M, K = a.shape
        N = b.shape[1]
        tuned[lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)](
            a, b, out, out, M, N, K, *a.stride(), *b.stride(), *out.stride(), HAS_BIAS=False, RELU=False,
            INPUT_PRECISION="ieee")

    failure("03.matmul", several_configs, "could not be launched", "single config")


def test_matmul_with_out_strides_hard_coded_fails_on_a_strided_out():
    err = failure("03.matmul", _fixed(False), "out padded", "address out with its strides")
    assert "written between its rows" in str(err) or "never written" in str(err)


def test_matmul_with_an_fp16_accumulator_fails_the_long_k_case():
    from course_utils.checks.l03_matmul import long_k_tolerance

    a = torch.randn(33, 4096, dtype=torch.float16, device=current().device)
    b = torch.randn(4096, 17, dtype=torch.float16, device=current().device)
    exact = a.double() @ b.double()
    atol, rtol = long_k_tolerance(torch.float16, 4096)
    good = torch.empty(33, 17, dtype=torch.float16, device=a.device)
    bad = torch.empty_like(good)
    _fixed(False)(a, b, good)
    _fixed(True)(a, b, bad)
    assert bool(((good.double() - exact).abs() <= atol + rtol * exact.abs()).all()), "fp32 accumulation passes"
    assert not bool(((bad.double() - exact).abs() <= atol + rtol * exact.abs()).all()), "fp16 accumulation fails"


# the mutant's fp16 copies overflow to inf, and inf - inf is NaN: NumPy's warnings, expected here
@pytest.mark.filterwarnings("ignore:overflow encountered in cast", "ignore:invalid value encountered")
def test_matmul_of_fp32_tiles_cast_to_fp16_fails_outside_fp16_range():
    """tl.dot(a.to(tl.float16), b.to(tl.float16)) of fp32 inputs rounds them to 10 mantissa bits, as TF32 does:
    within a GPU's fp32 tolerance at unit scale (the interpreter's exact fp32 dots catch it in every case).
    Only values outside fp16's range show it there: the case of a near 1e5 and b near 1e-5."""
    wrong = mutant("l03_matmul", "matmul", ("acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)",
                                            "acc = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)"))
    _solution_within_and_wrong_outside_the_tolerance("outside fp16's range", wrong)


def _solution_within_and_wrong_outside_the_tolerance(label: str, wrong) -> torch.Tensor:
    """On the fp32 case whose label holds `label`, in either mode (a GPU's TF32 tolerance included): the
    solution's output within the case's tolerance, `wrong`'s outside it. Returns `wrong`'s output."""
    from course_utils.checks.l03_matmul import _matmul_cases

    case = next(c for c in _matmul_cases(torch.Generator().manual_seed(1)) if label in c.label)
    a, b, out = case.args
    exact = case.expected["out"]
    for candidate, passes in ((matmul, True), (wrong, False)):
        got = torch.empty(out.shape, dtype=out.dtype, device=a.device)
        candidate(a, b, got)
        close = bool(((got.double().cpu() - exact).abs() <= case.atol + case.rtol * exact.abs()).all())
        assert close == passes, f"{candidate.__module__}: within the tolerance {close}, expected {passes}"
    return got


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_matmul_storing_an_fp16_copy_of_the_accumulator_fails_past_fp16_range():
    """Triton's tutorial stores acc.to(tl.float16): into an fp32 out that is 10 mantissa bits, TF32's, within
    a GPU's fp32 tolerance at unit scale; outputs past 65504 become inf."""
    wrong = mutant("l03_matmul", "matmul", ("tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)",
                                            "tl.store(c_ptrs, acc.to(tl.float16), mask=mask)"))
    assert _solution_within_and_wrong_outside_the_tolerance("outputs past 65504", wrong).isinf().any()


@triton.jit
def relu_inplace_kernel(out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.maximum(tl.load(out_ptr + offsets, mask=mask), 0.0), mask=mask)


def test_linear_relu_as_matmul_then_a_relu_launch_is_not_fused():
    def two_launches(x, w, bias, out):
        matmul(x, w.t(), out, bias=bias)  # bias in the epilogue, ReLU in a second kernel
        relu_inplace_kernel[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), BLOCK=1024)

    failure("03.linear_relu", two_launches, "launched 2 kernels (matmul_kernel, relu_inplace_kernel); this "
            "exercise asks for one kernel", "bias and ReLU are applied")


def test_linear_relu_without_the_relu_is_named():
    failure("03.linear_relu", lambda x, w, bias, out: matmul(x, w.t(), out, bias=bias),
            "that is x @ w.T + bias without the ReLU")


# --- wrong answers made from the solution by one edit (helpers.mutant) ---------------------------

@interpreter_only_because("an H100 with triton 3.6 reads 0 in masked-off lanes")
def test_matmul_masked_load_without_other_is_caught():
    """A K-tail load masked but without other=: Triton leaves those lanes undefined, and the checker's
    interpreter fills them with NaN and says so. (A GPU happens to read 0 there: the product is right.)"""
    wrong = mutant("l03_matmul", "matmul", ("b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)",
                                            "b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left)"))
    error = failure("03.matmul", wrong, "NaN where a number was expected", "reads undefined values")
    assert error.problems[0].kind == "nan"


def test_matmul_k_loop_that_skips_the_partial_block_is_named():
    wrong = mutant("l03_matmul", "matmul", ("for k in range(0, tl.cdiv(K, BLOCK_K)):",
                                            "for k in range(0, K // BLOCK_K):"))
    failure("03.matmul", wrong, "every output is 0: did the K loop run?")
    naive = mutant("l03_matmul", "matmul_naive", ("for k0 in range(0, K, BLOCK_K):",
                                                  "for k0 in range(0, K - 1, BLOCK_K):"))
    failure("03.matmul_naive", naive, "the K loop run?")


@pytest.mark.parametrize("edits", [
    [("dtype=tl.float32)  # (BLOCK_K,) partial sums", "dtype=a_ptr.dtype.element_ty)  # (BLOCK_K,)"),
     ("acc += a.to(tl.float32) * b.to(tl.float32)", "acc += a * b")],  # an fp16 accumulator
    [("acc += a.to(tl.float32) * b.to(tl.float32)", "acc += a * b")],  # fp16 products, fp32 accumulator
], ids=["fp16 accumulator", "fp16 products"])
def test_naive_accumulating_in_fp16_fails_the_long_k_case(edits):
    """The naive kernel's cases had K below ~1000: an fp16 accumulator passed them."""
    failure("03.matmul_naive", mutant("l03_matmul", "matmul_naive", *edits), "K = 4096: a long sum in fp32",
            ".to(tl.float32)", "differ beyond")


def test_linear_relu_with_an_fp16_accumulator_is_more_than_one_rounding_off():
    """Within the dot tolerance up to K = 1023, but more than one rounding from the exact result at the first
    fp16 case. A GPU's compiler refuses the fp16 accumulator of this tl.dot (with its input_precision)."""
    wrong = mutant("l03_matmul", "linear_relu", ("(BLOCK_M, BLOCK_N), dtype=tl.float32)",
                                                 "(BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)"))
    if current().interpret:
        failure("03.linear_relu", wrong, "no multiple of any tile, float16", LINEAR_ROUNDED_TWICE)
    else:
        failure("03.linear_relu", wrong, "float16", "your function raised an exception", "CompilationError")


LINEAR_ROUNDED_TWICE = "more than one rounding of float16 from the exact relu(x @ w.T + bias)"


def test_linear_relu_with_the_bias_added_after_rounding_fails():
    """x @ w.T rounded to out's dtype, then the bias added: two roundings, within the dot tolerance of every
    case but the long-K one (6 elements of its 561 on the CPU, by luck). Both kernels, the pointer one and
    Hopper's TMA one, make the mistake."""
    wrong = mutant("l03_matmul", "linear_relu",
                   ("acc += tl.load(bias_ptr + b_cols).to(tl.float32)[None, :]",
                    "acc = acc.to(c_ptr.dtype.element_ty) + tl.load(bias_ptr + b_cols)[None, :]"),
                   ("acc += tl.load(bias_ptr + cols % N).to(tl.float32)[None, :]",
                    "acc = acc.to(c_ptr.dtype.element_ty) + tl.load(bias_ptr + cols % N)[None, :]"))
    failure("03.linear_relu", wrong, "no multiple of any tile, float16", LINEAR_ROUNDED_TWICE,
            "rounded before the bias or the ReLU")


def test_grouped_pid_returning_a_tensor_or_floats_is_refused():
    failure("03.grouped_pid", lambda pid, m, n, g: torch.tensor(grouped_pid(pid, m, n, g)), "a tensor is not a tuple")
    failure("03.grouped_pid", lambda pid, m, n, g: tuple(float(v) for v in grouped_pid(pid, m, n, g)),
            "floats come from /, use //")


def test_matmul_counting_tiles_with_floor_plus_one_fails_on_whole_tiles():
    """M // BLOCK_M + 1 tiles per axis is cdiv(M, BLOCK_M) except where M is a multiple of the tile: there
    the grouped order maps programs to a tile row that does not exist and skips real ones."""
    wrong = mutant("l03_matmul", "matmul",
                   ("grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)",
                    "grouped_tile(pid, M // BLOCK_M + 1, N // BLOCK_N + 1, GROUP_M)"))
    failure("03.matmul", wrong, "multiples of every tile size", "were never written")


# A grouped order right only while the whole grid is one group: with the Triton tutorial's GROUP_M = 8 and
# tiles of 128 rows, every other case has at most 8 tile rows in the interpreter; M = 2600 has 21.
GROUP_BUGS = {
    "groups start at row group_id": ("first_pid_m = group_id * GROUP_M", "first_pid_m = group_id"),
    "the last group as tall as the others": ("group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
                                             "group_size_m = tl.minimum(num_pid_m, GROUP_M)"),
    "group_m rows of num_pid_m tiles": ("num_pid_in_group = GROUP_M * num_pid_n",
                                        "num_pid_in_group = GROUP_M * num_pid_m"),
}
TILE_128 = triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4,
                         num_stages=1)
# On a GPU the cases are larger: 1823 rows (15 tile rows) come first and fail already
TALL = "M = 2600: more tile rows than one group holds" if current().interpret else "were never written"


@pytest.mark.parametrize("bug", ["groups start at row group_id", "the last group as tall as the others"])
def test_matmul_grouped_order_right_only_within_one_group_fails(bug):
    wrong = mutant("l03_matmul", "matmul", GROUP_BUGS[bug])
    failure("03.matmul", lambda a, b, out: wrong(a, b, out, config=TILE_128), TALL, "were never written")


def test_linear_relu_grouped_order_right_only_within_one_group_fails():
    wrong = mutant("l03_matmul", "matmul", GROUP_BUGS["group_m rows of num_pid_m tiles"])
    failure("03.linear_relu", lambda x, w, bias, out: wrong(x, w.t(), out, bias, relu=True, config=TILE_128),
            TALL, "were never written")


# --- 03.linear_relu: x and out are addressed through their strides --------------------------------

@pytest.mark.parametrize("edit", [
    ("M, N, K, a.stride(0), a.stride(1), b.stride(0)", "M, N, K, K, 1, b.stride(0)"),  # x as if contiguous
    ("b.stride(1), out.stride(0), out.stride(1),\n", "b.stride(1), N, 1,\n"),  # out as if contiguous
    # out's column stride: bias read past its end, which on a GPU can break the CUDA context for the tests after
    pytest.param(("acc += tl.load(bias_ptr + b_cols)", "acc += tl.load(bias_ptr + b_cols * stride_cn)"),
                 marks=interpreter_only),
], ids=["x contiguous", "out contiguous", "bias with out's column stride"])
def test_linear_relu_assuming_contiguous_x_and_out_fails(edit):
    """Every other case has a contiguous x and out: strides (K, 1) and (N, 1), and out's column stride 1."""
    failure("03.linear_relu", mutant("l03_matmul", "linear_relu", edit), "x every other column of a wider "
            "tensor", "out column-major", "address x and out with their strides")


@pytest.mark.skipif(current().interpret, reason="a GPU's grid limit: the interpreter has none")
def test_naive_on_a_2d_grid_fails_on_a_gpu_past_65535_columns():
    """A 2-D grid (M, N) puts N programs on axis 1, where a GPU launches at most 65535 (lesson 02)."""
    wrong = mutant("l03_matmul", "matmul_naive", ("m = (pid % M).to(tl.int64)", "m = tl.program_id(0).to(tl.int64)"),
                   ("n = (pid // M).to(tl.int64)", "n = tl.program_id(1).to(tl.int64)"),
                   ("grid = (M * N,)", "grid = (M, N)"))
    failure("03.matmul_naive", wrong, "N = 65539: more output columns than a GPU grid's axis 1 holds")


def test_linear_relu_refuses_a_strided_bias_by_name():
    """The kernel reads bias[n] at bias + n: a bias sliced from a longer tensor (strides (2,)) would be read
    at the wrong places, so it is refused with its name, as matmul's is (nn.Linear's bias is contiguous)."""
    dev = current().device
    x, w = torch.randn(8, 16, device=dev), torch.randn(12, 16, device=dev)
    out = torch.empty(8, 12, device=dev)
    with pytest.raises(ValueError, match="linear_relu needs contiguous tensors, and these are not: bias"):
        linear_relu(x, w, torch.randn(24, device=dev)[::2], out)


def test_solutions_address_a_view_of_a_tensor_past_2_31_elements():
    """a: 3 rows 2^31 - 1 elements apart in an fp16 storage of 2^32 + 64 elements (8 GiB, of which only the
    rows read are touched): row 2 lies 2^32 - 2 elements past a's start, which a 32-bit row offset wraps to
    -2, the storage's first elements (filled with 1000 here). The solutions' row and column offsets are
    64-bit."""
    device = current().device
    storage = torch.empty(2**32 + 64, dtype=torch.float16, device=device)
    storage[:32] = 1000.0  # where a wrapped row 2 would be read
    a = storage.as_strided((3, 16), (2**31 - 1, 1), 2)  # rows at 2, 2^31 + 1 and 2^32
    a.copy_(torch.randn(3, 16, device=device))
    w, bias = torch.randn(8, 16, device=device, dtype=torch.float16), torch.randn(8, device=device)
    want = a.double() @ w.double().t()
    for name, call, expected in [("matmul", lambda out: matmul(a, w.t(), out), want),
                                 ("matmul_naive", lambda out: matmul_naive(a, w.t(), out), want),
                                 ("linear_relu", lambda out: linear_relu(a, w, bias.half(), out),
                                  (want + bias.half().double()).clamp_min(0))]:
        out = torch.empty((3, 8), dtype=torch.float16, device=device)
        call(out)
        error = (out.double() - expected).abs().amax(dim=1)
        assert bool((error < 0.05).all()), f"{name}: the largest error of each row is {error.tolist()}"


def test_linear_relu_copying_w_transposed_first_is_two_launches_at_every_shape():
    """A contiguous copy of w.T by a kernel, then the fused matmul: two launches. Counted as launches on the
    activations it failed only where w had as many rows or columns as x has rows (the speed line's 4096^3)."""
    from course_utils.grading.provenance import course_solutions_allowed
    from course_utils.lessons.l02_first_kernels import copy_2d

    def linear_relu(x, w, bias, out):
        w_t = torch.empty((w.shape[1], w.shape[0]), dtype=w.dtype, device=w.device)  # (K, N)
        copy_2d(w.t(), w_t)
        matmul(x, w_t, out, bias=bias, relu=True)

    with course_solutions_allowed():
        err = failure("03.linear_relu", linear_relu, "launched 2 kernels", "no copy of w")
    assert "case 1/" in str(err)


def test_linear_relu_taking_w_as_contiguous_fails():
    """w addressed as w + n * K + k: right for every contiguous (N, K) w; wrong for a weight kept K-major."""
    wrong = mutant("l03_matmul", "linear_relu",
                   ("matmul(x, w.t(), out,", "matmul(x, w.as_strided(w.t().shape, (1, w.shape[1])), out,"))
    failure("03.linear_relu", wrong, "w the transpose of a (K, N) tensor", at="w the transpose of a (K, N) tensor")
