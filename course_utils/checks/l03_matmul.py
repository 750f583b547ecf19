"""Exercises of lesson 03: grouped launch order, naive matmul, tiled matmul, fused linear + ReLU."""
from __future__ import annotations

import math

import torch

from ..grading import Case, Exercise, Out, register
from ..grading.inputs import f64, randn, sliced, tolerance, transposed
from ..mode import current, size

# --- 03.grouped_pid ---------------------------------------------------------------------------


def grouped_order(num_pid_m: int, num_pid_n: int, group_m: int) -> list[tuple[int, int]]:
    """The tiles in grouped launch order, built by walking the groups (not by the pid formula)."""
    order = []
    for top in range(0, num_pid_m, group_m):
        rows = range(top, min(top + group_m, num_pid_m))  # this group's tile rows
        for n in range(num_pid_n):
            order += [(m, n) for m in rows]  # down the group's rows, then the next column
    return order


def _as_tile(result) -> tuple[int, int] | None:
    try:
        m, n = result
        return int(m), int(n)
    except (TypeError, ValueError):
        return None


def _pid_verifier(num_pid_m: int, num_pid_n: int, group_m: int, seen: dict):
    grid = f"a {num_pid_m} x {num_pid_n} grid of tiles, group_m={group_m}"

    def verify(result, case: Case) -> list[str]:
        pid = case.args[0]
        tile = _as_tile(result)
        if tile is None:
            return [f"pid {pid} of {grid}: returned {result!r}, expected a tuple (pid_m, pid_n) of two ints"]
        m, n = tile
        if not (0 <= m < num_pid_m and 0 <= n < num_pid_n):
            extra = ""
            if m >= num_pid_m:
                extra = ("; the last group has only num_pid_m - first_pid_m rows: "
                         "group_size_m = min(num_pid_m - first_pid_m, group_m)")
            return [f"pid {pid} of {grid}: returned {tile}, outside the grid (rows 0..{num_pid_m - 1}, "
                    f"columns 0..{num_pid_n - 1}){extra}"]
        if tile in seen:
            return [f"pid {pid} of {grid}: returned {tile}, which pid {seen[tile]} returned already: "
                    f"every tile must be computed by exactly one program (a bijection)"]
        seen[tile] = pid
        if tile != case.expected:
            why = ""
            if tile == (pid // num_pid_n, pid % num_pid_n):
                why = ("; that is row-major order: the grouped order walks down group_m tile rows "
                       "before it moves to the next column")
            elif tile == (pid % num_pid_m, pid // num_pid_m):
                why = "; that is column-major order over the whole grid: the groups are group_m rows tall"
            return [f"pid {pid} of {grid}: returned {tile}, expected {case.expected}{why}"]
        return []

    return verify


def _grouped_pid_cases(gen):
    grids = [(1, 1, 1), (4, 4, 2), (5, 3, 2), (5, 7, 2), (7, 3, 3), (3, 9, 8), (10, 6, 4), (6, 5, 1)]
    m = int(torch.randint(9, 17, (1,), generator=gen))
    n = int(torch.randint(2, 9, (1,), generator=gen))
    g = int(torch.randint(3, 6, (1,), generator=gen))
    grids.append((m + (m % g == 0), n, g))  # a random grid whose row count is no multiple of group_m
    for num_pid_m, num_pid_n, group_m in grids:
        seen: dict = {}
        verify = _pid_verifier(num_pid_m, num_pid_n, group_m, seen)
        for pid, tile in enumerate(grouped_order(num_pid_m, num_pid_n, group_m)):
            yield Case(f"grid {num_pid_m} x {num_pid_n}, group_m {group_m}, pid {pid}",
                       (pid, num_pid_m, num_pid_n, group_m), tile, verify=verify)


register(Exercise(
    "03.grouped_pid", "grouped launch order of the tiles", "grouped_pid(pid, num_pid_m, num_pid_n, group_m)",
    _grouped_pid_cases, kernel=False,
    hint="a group is group_m * num_pid_n consecutive pids; group_id = pid // that; its first row is "
         "group_id * group_m and it has min(num_pid_m - first_row, group_m) rows; inside the group, "
         "pid_m = first_row + (pid % group_pids) % rows and pid_n = (pid % group_pids) // rows"))


# --- matmul cases -------------------------------------------------------------------------------

def _dtypes() -> list[torch.dtype]:
    """fp32 and fp16 everywhere; bf16 only on a GPU (the interpreter has no bf16 dot)."""
    return [torch.float32, torch.float16] + ([torch.bfloat16] if current().gpu else [])


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def dot_tolerance(dtype: torch.dtype, k: int) -> tuple[float, float]:
    """(atol, rtol) of a length-k dot of unit-scale inputs accumulated in fp32, stored as `dtype`.

    Three sources of error, against the float64 product of the same inputs:
    - the operands: exact for fp16/bf16 (they are the inputs) and for fp32 in the interpreter; TF32
      tensor cores on a GPU keep 10 mantissa bits of each fp32 operand and may truncate rather than
      round them: up to about 2^-10 sqrt(k), so fp32 on a GPU gets twice the usual slack;
    - the fp32 accumulator: k additions into running sums that grow to ~sqrt(k), each rounded to
      2^-24 of its size: up to ~2^-24 k, which outgrows the sqrt(k) terms as k grows;
    - the one rounding of the result to `dtype` (rtol ~ its eps), the bulk of the fp16/bf16 error.
    """
    slack = 16.0 if dtype == torch.float32 and current().gpu else 8.0
    atol, rtol = tolerance(dtype, k=k, dot=True, slack=slack)
    return atol + 8.0 * 2.0**-24 * k, rtol


def _mm_case(label: str, a: torch.Tensor, b: torch.Tensor) -> Case:
    M, K = a.shape
    N = b.shape[1]
    dtype = a.dtype
    return Case(f"{label}, {_short(dtype)}", (a, b, Out("out", (M, N), dtype)),
                {"out": f64(a) @ f64(b)}, *dot_tolerance(dtype, K))


def _shapes(gen, naive: bool) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) of the cases: odd sizes (no multiple of 16, 32, 64...), ones, a random one.

    On the CPU the naive kernel gets fewer outputs: the interpreter runs its M * N programs one by
    one, at about 15 ms each.
    """
    m = int(torch.randint(20, 50, (1,), generator=gen)) * 2 + 1  # odd, 41..99
    if naive:
        return {
            "odd": size((1823, 781, 517), (5, 3, 83)),
            "random": size((m * 7, 1000 - m, 700 + m), (m // 20 + 2, 3 + m % 3, m + 20)),
            "row": size((1, 781, 1023), (1, 9, 300)),  # K > 128: more than one chunk
            "K = 1": size((517, 261, 1), (5, 3, 1)),
        }
    return {
        "odd": size((1823, 781, 517), (70, 45, 83)),
        "random": size((m * 7, 1000 - m, 700 + m), (m, 83 - m // 3, 2 * m + 3)),
        "row": size((1, 781, 1023), (1, 45, 67)),
        "K = 1": size((517, 261, 1), (33, 17, 1)),
        "long K": size((129, 97, 4099), (17, 19, 300)),
        "tall": size((2600, 300, 100), (150, 70, 40)),
    }


def _matmul_cases(gen, *, naive: bool = False):
    s = _shapes(gen, naive)
    yield _mm_case("1 x 1 x 1", randn((1, 1), gen=gen), randn((1, 1), gen=gen))
    M, N, K = s["odd"]
    for dtype in _dtypes():
        yield _mm_case(f"M, N, K = {M}, {N}, {K}: no multiple of any tile", randn((M, K), dtype, gen),
                       randn((K, N), dtype, gen))
    M, N, K = s["row"]
    yield _mm_case(f"M = 1: a single row (a vector times a matrix), N, K = {N}, {K}",
                   randn((M, K), gen=gen), randn((K, N), gen=gen))
    M, N, K = s["K = 1"]
    yield _mm_case(f"K = 1: an outer product, M, N = {M}, {N}", randn((M, K), torch.float16, gen),
                   randn((K, N), torch.float16, gen))
    M, N, K = s["random"]
    yield _mm_case(f"a transposed (column-major), b every other column of a wider tensor, "
                   f"M, N, K = {M}, {N}, {K}", transposed((M, K), gen=gen), sliced((K, N), gen=gen))
    yield _mm_case(f"a every other column, b transposed, M, N, K = {M}, {N}, {K}",
                   sliced((M, K), torch.float16, gen), transposed((K, N), torch.float16, gen))
    if not naive:
        M, N, K = s["long K"]
        yield _mm_case(f"a long K = {K}: many steps of the K loop, M, N = {M}, {N}",
                       randn((M, K), gen=gen), randn((K, N), gen=gen))
        M, N, K = s["tall"]
        yield _mm_case(f"M = {M}: a partial last group of tile rows, N, K = {N}, {K}",
                       randn((M, K), torch.float16, gen), randn((K, N), torch.float16, gen))
        M, N, K = s["odd"]
        yield _mm_case("b = w.t(), a transposed nn.Linear weight (strides (1, K))",
                       randn((M, K), torch.float16, gen), randn((N, K), torch.float16, gen).t())


register(Exercise(
    "03.matmul_naive", "naive matmul, one output per program", "matmul_naive(a, b, out)",
    lambda gen: _matmul_cases(gen, naive=True),
    hint="launch a grid of (M, N) programs; program (m, n) loops k0 over range(0, K, BLOCK_K), loads "
         "a[m, k0 + arange] and b[k0 + arange, n] with mask k < K and other=0, accumulates in fp32 and "
         "stores tl.sum(acc) at out[m, n]; use the strides of a, b and out, not their shapes"))

register(Exercise(
    "03.matmul", "tiled matmul with tl.dot", "matmul(a, b, out)", _matmul_cases,
    hint="mask the K loads (offs_k < K - k * BLOCK_K, other=0) so a partial last K step adds zeros; "
         "wrap rows % M and columns % N for the loads and mask the store with rows < M and cols < N; "
         "launch cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs; use all six strides"))


# --- 03.linear_relu -----------------------------------------------------------------------------

def _linear_case(label: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> Case:
    M, K = x.shape
    N = w.shape[0]
    dtype = x.dtype
    expected = (f64(x) @ f64(w).t() + f64(bias)).clamp_min(0)
    return Case(f"{label}, {_short(dtype)}", (x, w, bias, Out("out", (M, N), dtype)), {"out": expected},
                *dot_tolerance(dtype, K))


def _linear_relu_cases(gen):
    def inputs(M, N, K, dtype, bias_scale=None):
        # bias of the same scale as x @ w.T (~ sqrt(K)): about half the outputs are clamped, and
        # a bias added along the wrong axis or forgotten shows.
        scale = math.sqrt(K) if bias_scale is None else bias_scale
        return randn((M, K), dtype, gen), randn((N, K), dtype, gen), randn((N,), dtype, gen, scale=scale)

    yield _linear_case("1 x 1 x 1", *inputs(1, 1, 1, torch.float32))
    M, N, K = size((1823, 781, 517), (70, 45, 83))
    for dtype in _dtypes():
        yield _linear_case(f"M, N, K = {M}, {N}, {K}: no multiple of any tile", *inputs(M, N, K, dtype))
    M, N, K = size((1, 781, 1023), (1, 45, 67))
    yield _linear_case(f"M = 1: one input row, N, K = {N}, {K}", *inputs(M, N, K, torch.float16))
    yield _linear_case("the GEM shape (M, N, K) = (64, 256, 128)", *inputs(64, 256, 128, torch.float16))
    M, N, K = size((128, 256, 256), (33, 40, 50))
    yield _linear_case(f"bias far below zero on most columns: mostly clamped, M, N, K = {M}, {N}, {K}",
                       *inputs(M, N, K, torch.float32, bias_scale=10 * math.sqrt(K)))


register(Exercise(
    "03.linear_relu", "fused linear + bias + ReLU", "linear_relu(x, w, bias, out)", _linear_relu_cases,
    hint="w is (N, K): pass w.t(), a (K, N) view with strides (1, K), as b; add bias[n] along the "
         "columns (the N axis) to the fp32 accumulator and apply max(., 0) before the one store"))
