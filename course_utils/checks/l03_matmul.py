"""Exercises of lesson 03: grouped launch order, naive matmul, tiled matmul, fused linear + ReLU."""
from __future__ import annotations

import math

import numpy as np
import torch

from ..grading import Case, Exercise, Out, register
from ..grading.harness import Fusion, Speed, one_rounding
from ..grading.inputs import EPS, f64, randn, sliced, tolerance, transposed
from ..mode import current, size
from ..roofline import matmul_cost

GRID_AXIS_MAX = 65535  # the most programs a CUDA grid holds along its axes 1 and 2 (lesson 02)

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
    """(pid_m, pid_n) from a tuple or list of two ints (numpy ints too); None for anything else: a tensor,
    floats (from / instead of //), a different count."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        return None
    if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in result):
        return None
    return int(result[0]), int(result[1])


def _pid_m_from_pid(pid: int, num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """The tile of the older Triton tutorial's pid_m = first_pid_m + pid % group_size_m: right in full
    groups, whose size divides every group's first pid, but rows rotated in a short last group whose
    size does not (grid 5 x 3, group_m 3: pid 9 starts a group of 2 rows and 9 % 2 = 1)."""
    in_group = group_m * num_pid_n
    first_pid_m = pid // in_group * group_m
    group_size_m = min(num_pid_m - first_pid_m, group_m)
    return first_pid_m + pid % group_size_m, pid % in_group // group_size_m


def _pid_verifier(num_pid_m: int, num_pid_n: int, group_m: int, seen: dict):
    grid = f"a {num_pid_m} x {num_pid_n} grid of tiles, group_m={group_m}"

    def verify(result, case: Case) -> list[str]:
        pid = case.args[0]
        tile = _as_tile(result)
        if tile is None:
            why = ""
            if isinstance(result, torch.Tensor):
                why = ": a tensor is not a tuple; return (pid_m, pid_n) as Python ints"
            elif isinstance(result, tuple | list) and any(isinstance(v, float) for v in result):
                why = ": floats come from /, use // for the integer division"
            return [f"pid {pid} of {grid}: returned {result!r}, expected a tuple (pid_m, pid_n) of two ints{why}"]
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
            elif tile == _pid_m_from_pid(pid, num_pid_m, num_pid_n, group_m):
                why = ("; pid_m came from pid % group_size_m: in a short last group that no longer counts "
                       "from the group's first pid. Take the position inside the group first: "
                       "(pid % num_pid_in_group) % group_size_m")
            return [f"pid {pid} of {grid}: returned {tile}, expected {case.expected}{why}"]
        return []

    return verify


def _grouped_pid_cases(gen):
    # (5, 3, 3): the last group (2 rows) starts at pid 9, no multiple of 2, so pid_m must count from it
    grids = [(1, 1, 1), (4, 4, 2), (5, 3, 2), (5, 7, 2), (7, 3, 3), (3, 9, 8), (10, 6, 4), (6, 5, 1),
             (5, 3, 3)]
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


def long_k_tolerance(dtype: torch.dtype, k: int) -> tuple[float, float]:
    """fp16/bf16 outputs of a long dot accumulated in fp32: the one rounding of the output (rtol, twice
    the unit roundoff for margin) and the fp32 accumulator's ~2^-24 k (atol, 32 x). An fp16 accumulator
    rounds at every K step instead: at K = 4096 its error is ~50 x this atol."""
    return 32 * 2.0**-24 * k, 2 * EPS[dtype]


def _matmul_explain(outs: dict, case: Case) -> str:
    """What wrong matmul values match: a K loop that drops the last partial block, a @ b.T-like
    transposes, an accumulator rounded to the inputs' dtype."""
    a, b = f64(case.args[0]), f64(case.args[1])
    got = f64(outs["out"])
    if not bool(torch.isfinite(got).all()):
        return ""
    K = a.shape[1]

    def near(want) -> bool:
        return tuple(want.shape) == tuple(got.shape) and torch.allclose(got, want, atol=case.atol, rtol=case.rtol)

    if bool((got == 0).all()) and bool((a @ b != 0).any()):
        return ("every output is 0: did the K loop run? (range(0, K // BLOCK_K) or range(0, K - 1, BLOCK_K) "
                "runs no step when K < BLOCK_K: loop over cdiv(K, BLOCK_K) blocks and mask the last one)")
    for block in (16, 32, 64, 128, 256, 512):
        whole = K // block * block
        if 0 < whole < K and near(a[:, :whole] @ b[:whole]):
            return (f"that is a @ b without the last partial block of K (the sum stops at k = {whole}; K = {K}, "
                    f"blocks of {block}): loop over cdiv(K, BLOCK_K) blocks and mask the last one (k < K, other=0)")
    if K > 1 and near(a[:, :K - 1] @ b[:K - 1]):
        return "that is a @ b without the last k: the K loop stops one step early"
    return ""


def _mm_case(label: str, a: torch.Tensor, b: torch.Tensor, layout: str = "contiguous",
             tol: tuple[float, float] | None = None) -> Case:
    M, K = a.shape
    N = b.shape[1]
    dtype = a.dtype
    if layout != "contiguous":
        label += f"; out {layout} (strides {_out_strides(layout, M, N)}): address out with its strides"
    return Case(f"{label}, {_short(dtype)}", (a, b, Out("out", (M, N), dtype, layout)),
                {"out": f64(a) @ f64(b)}, *(tol or dot_tolerance(dtype, K)), explain=_matmul_explain)


def _out_strides(layout: str, M: int, N: int) -> tuple[int, int]:
    from ..grading.harness import PAD

    return (N + PAD, 1) if layout == "padded" else (1, M)


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
            "row": size((1, 781, 1023), (1, 9, 1100)),  # K > 1024: more than one chunk of any size
            "K = 1": size((517, 261, 1), (5, 3, 1)),
        }
    return {
        "odd": size((1823, 781, 517), (70, 45, 83)),
        "random": size((m * 7, 1000 - m, 700 + m), (m, 83 - m // 3, 2 * m + 3)),
        "row": size((1, 781, 1023), (1, 45, 67)),
        "K = 1": size((517, 261, 1), (33, 17, 1)),
        "long K": size((129, 97, 4099), (17, 19, 300)),
        # more than 8 tile rows of 256 (GROUP_M = 8, the usual choice) with a partial last group, and more
        # than one tile column (with one column, any grouped order is the row order): a grouped order
        # right only while the whole grid is one group of tile rows fails here
        "tall": size((2600, 300, 100), (2600, 300, 24)),
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
                   f"M, N, K = {M}, {N}, {K}", transposed((M, K), gen=gen), sliced((K, N), gen=gen), "padded")
    # out column-major: with the padded out above (strides (N + PAD, 1)), a kernel that takes out's column
    # stride for 1 (out + m * stride_cm + n) passes every other case of matmul_naive
    yield _mm_case(f"a every other column, b transposed, M, N, K = {M}, {N}, {K}",
                   sliced((M, K), torch.float16, gen), transposed((K, N), torch.float16, gen), "transposed")
    if not naive:
        M, N, K = s["long K"]
        yield _mm_case(f"a long K = {K}: many steps of the K loop, M, N = {M}, {N}",
                       randn((M, K), gen=gen), randn((K, N), gen=gen))
        # fp32 tiles cast to fp16 for tl.dot (as for fp16 inputs) round like TF32 (10 mantissa bits) and pass
        # a GPU's TF32 tolerance; they fail only where fp16's range ends: 65504 overflows to inf, and below
        # 6e-5 fp16 is subnormal (1e-5 keeps 7 bits). The products stay near 1, so does the tolerance.
        M, N, K = size((257, 129, 300), (33, 17, 40))
        yield _mm_case(f"fp32 a near 1e5 and b near 1e-5, outside fp16's range (65504 overflows, 1e-5 is "
                       f"subnormal): give tl.dot the fp32 tiles (TF32 on a GPU), not fp16 copies, M, N, K = "
                       f"{M}, {N}, {K}", randn((M, K), gen=gen, scale=1e5), randn((K, N), gen=gen, scale=1e-5))
        # An fp32 out rounded through fp16 on its way (Triton's tutorial stores acc.to(tl.float16)) keeps
        # 10 mantissa bits, as TF32 does: within a GPU's fp32 tolerance, until the outputs pass 65504.
        M, N, K = size((65, 33, 96), (17, 9, 40))
        atol, rtol = dot_tolerance(torch.float32, K)  # of unit-scale inputs: these products are 300^2 larger
        yield _mm_case(f"fp32 a and b near 300: outputs past 65504, fp16's largest (store the fp32 accumulator "
                       f"into the fp32 out, not an fp16 copy of it), M, N, K = {M}, {N}, {K}",
                       randn((M, K), gen=gen, scale=300.0), randn((K, N), gen=gen, scale=300.0),
                       tol=(atol * 300.0**2, rtol))
        M, N, K = size((1024, 512, 96), (256, 128, 40))
        yield _mm_case(f"M, N = {M}, {N}: multiples of every tile size, no partial tile (tiles per axis: "
                       f"cdiv(M, BLOCK_M), not M // BLOCK_M + 1), K = {K}", randn((M, K), torch.float16, gen),
                       randn((K, N), torch.float16, gen))
        M, N, K = s["tall"]
        yield _mm_case(f"M = {M}: more tile rows than one group holds (GROUP_M = 8 of up to 256 rows), "
                       f"the last group partial: first_pid_m = group_id * GROUP_M, group_size_m = "
                       f"min(num_pid_m - first_pid_m, GROUP_M), N, K = {N}, {K}",
                       randn((M, K), torch.float16, gen), randn((K, N), torch.float16, gen), "transposed")
        M, N = size((257, 129), (33, 17))
        K = 4096
        yield _mm_case(f"K = {K}: a long sum, accumulated in fp32 (an fp16 accumulator rounds at every K "
                       f"step), M, N = {M}, {N}", randn((M, K), torch.float16, gen),
                       randn((K, N), torch.float16, gen), tol=long_k_tolerance(torch.float16, K))
        M, N, K = s["odd"]
        yield _mm_case("b = w.t(), a transposed nn.Linear weight (strides (1, K))",
                       randn((M, K), torch.float16, gen), randn((N, K), torch.float16, gen).t())
    else:
        # An fp16 accumulator, or fp16 products (acc += a * b without .to(tl.float32)) added to an fp32
        # one, stay within dot_tolerance at the other cases' K, not at this one. One program per output:
        # 60 outputs in the interpreter, where the worst of them is 5x (accumulator) and 1.7x (products)
        # past the tolerance, and the solution's within 0.45 of it (8 seeds).
        M, N = size((33, 17), (6, 10))
        K = 4096
        yield _mm_case(f"K = {K}: a long sum in fp32 (an fp16 accumulator rounds at every K step, fp16 "
                       f"products at every product: convert a and b with .to(tl.float32) first), M, N = {M}, "
                       f"{N}", randn((M, K), torch.float16, gen), randn((K, N), torch.float16, gen),
                       tol=long_k_tolerance(torch.float16, K))
        if current().gpu:  # the interpreter has no such limit, and would run these programs one by one
            M, N, K = 2, GRID_AXIS_MAX + 4, 16
            yield _mm_case(f"N = {N}: more output columns than a GPU grid's axis 1 holds ({GRID_AXIS_MAX}; a "
                           f"vocabulary-sized output): launch a 1-D grid of M * N programs, M, K = {M}, {K}",
                           randn((M, K), gen=gen), randn((K, N), gen=gen))


def _half() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16


def _matmul_speed(solution: str, linear: bool = False) -> Speed:
    """4096^3 in bf16 (fp16 where the GPU has no bf16): compute-bound, on the tensor cores."""
    n = 4096

    def args():
        dtype = _half()
        if linear:
            return randn((n, n), dtype), randn((n, n), dtype), randn((n,), dtype), Out("out", (n, n), dtype)
        return randn((n, n), dtype), randn((n, n), dtype), Out("out", (n, n), dtype)

    return Speed(args, lambda a: matmul_cost(n, n, n, 2), f"course_utils.lessons.l03_matmul:{solution}",
                 "4096 x 4096 x 4096, bf16", roof="bf16")


register(Exercise(
    "03.matmul_naive", "naive matmul, one output per program", "matmul_naive(a, b, out)",
    lambda gen: _matmul_cases(gen, naive=True),
    hint={"wrong": "program (m, n) loops k0 over range(0, K, BLOCK_K), loads a[m, k0 + arange] and "
                   "b[k0 + arange, n] with mask k < K and other=0, accumulates in fp32 and stores "
                   "tl.sum(acc) at out[m, n]; use the strides of a, b and out, not their shapes",
          "unwritten": "launch M * N programs, one per output element (a 1-D grid: m = pid % M, "
                       "n = pid // M), and store at out[m, n] = out_ptr + m * out.stride(0) + n * "
                       "out.stride(1)",
          "out_of_bounds": "mask the K loads with k < K (other=0): K is no multiple of BLOCK_K; address a, b "
                           "and out with their own strides (a transposed a has strides (1, M))",
          "nan": "a masked K load without other= reads undefined values (NaN in the checker) into the sum: "
                 "give both loads other=0.0",
          "host": "the host function only launches the (M, N) grid: the products and the sum over K happen "
                  "in the kernel, not in torch"}))

register(Exercise(
    "03.matmul", "tiled matmul with tl.dot", "matmul(a, b, out)", _matmul_cases,
    hint={"wrong": "accumulate in an fp32 tl.zeros((BLOCK_M, BLOCK_N)) and convert once, at the store; "
                   "mask the K loads (offs_k < K - k * BLOCK_K, other=0) so a partial last K step adds "
                   "zeros; use all six strides (a, b AND out: out may be strided)",
          "unwritten": "launch cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs and map each pid to a distinct "
                       "tile; store at out_ptr + offs_m[:, None] * out.stride(0) + offs_n[None, :] * "
                       "out.stride(1) with mask (offs_m < M) & (offs_n < N)",
          "out_of_bounds": "wrap rows % M and columns % N for the loads (or mask them), mask the K tail, "
                           "mask the store with rows < M and cols < N, and address out with its strides",
          "nan": "a masked load without other= reads undefined values (NaN in the checker) into tl.dot: give "
                 "the K-tail loads other=0.0",
          "host": "the host function only allocates, computes the grid and launches; the products and sums "
                  "belong to tl.dot in your kernel"},
    speed=_matmul_speed("matmul")))


# --- 03.linear_relu -----------------------------------------------------------------------------

def _linear_case(label: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor,
                 tol: tuple[float, float] | None = None, layout: str = "contiguous") -> Case:
    M, K = x.shape
    N = w.shape[0]
    dtype = x.dtype
    expected = (f64(x) @ f64(w).t() + f64(bias)).clamp_min(0)
    return Case(f"{label}, {_short(dtype)}", (x, w, bias, Out("out", (M, N), dtype, layout)),
                {"out": expected}, *(tol or dot_tolerance(dtype, K)), explain=_linear_explain,
                verify=_linear_rounded_once)


def _linear_rounded_once(outs: dict, case: Case) -> list[str]:
    """A 16-bit out within one rounding of the exact relu(x @ w.T + bias) (harness.one_rounding): the fp32
    sum's error, its products' and the bias's magnitudes times 2^-22 sqrt(K) (four of fp32's roundings,
    growing like a random walk), passes through the ReLU at most unchanged."""
    got = outs["out"]
    x, w, bias = (t.detach().to(got.device, torch.float64) for t in case.args[:3])
    moved = 2.0**-22 * math.sqrt(x.shape[1]) * (x.abs() @ w.abs().T + bias.abs())
    return one_rounding("out", got, (x @ w.T + bias).clamp_min(0), moved, "relu(x @ w.T + bias)",
                        "a 16-bit accumulator, or x @ w.T rounded before the bias or the ReLU (a .to() "
                        "before the epilogue)")


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
    yield _linear_case("M, N, K = 130, 260, 300: more than one tile of 128 rows, of 256 columns and of 256 K "
                       "steps (a grid over M and N, a loop over K)", *inputs(130, 260, 300, torch.float16))
    # x a view (a column slice: strides (2K + 1, 2)) and out column-major: a kernel written for contiguous
    # x and out (x + m * K + k, out + m * N + n) or one that reads bias[n] with out's column stride passes
    # every other case
    M, N, K = size((300, 200, 100), (37, 45, 70))
    _, w, bias = inputs(M, N, K, torch.float32)
    yield _linear_case(f"x every other column of a wider tensor (strides ({2 * K + 1}, 2)), out column-major "
                       f"(strides (1, {M})): address x and out with their strides, bias[n] with stride 1, "
                       f"M, N, K = {M}, {N}, {K}", sliced((M, K), gen=gen), w, bias, layout="transposed")
    # An fp16 accumulator stays within dot_tolerance at the K above (<= 1023), not at this K: 03.matmul's
    # long-K case, with x @ w.T (w K-major) and the epilogue.
    M, N = size((257, 129), (33, 17))
    K = 4096
    yield _linear_case(f"K = {K}: a long sum, accumulated in fp32 (an fp16 accumulator rounds at every K "
                       f"step), M, N = {M}, {N}", *inputs(M, N, K, torch.float16),
                       tol=long_k_tolerance(torch.float16, K))
    M, N, K = 2600, 300, 24  # 03.matmul's tall case: more than 8 tile rows of 256, the last group partial
    yield _linear_case(f"M = {M}: more tile rows than one group holds (GROUP_M = 8 of up to 256 rows), "
                       "the last group partial: first_pid_m = group_id * GROUP_M, group_size_m = "
                       f"min(num_pid_m - first_pid_m, GROUP_M), N, K = {N}, {K}",
                       *inputs(M, N, K, torch.float16))
    # Last, so that the cases above draw what they drew before it came. Every w above is a contiguous (N, K):
    # a kernel that addressed w as w + n * K + k passed them all.
    x, w, bias = randn((37, 70), torch.float16, gen), randn((70, 45), torch.float16, gen).t(), \
        randn((45,), torch.float16, gen, scale=math.sqrt(70))
    yield _linear_case("w the transpose of a (K, N) tensor, strides (1, 45), as a weight kept K-major: address w "
                       "with its own strides, M, N, K = 37, 45, 70", x, w, bias)


def _linear_temporary(case: Case) -> tuple[int, str] | None:
    M, N = case.args[3].shape
    return (M * N, f"x @ w.T ({M} x {N})") if M * N >= 64 else None


def _linear_explain(outs: dict, case: Case) -> str:
    """What the wrong values match: no ReLU, no bias, bias along the rows, ReLU before the bias."""
    x, w, bias = (f64(t) for t in case.args[:3])
    got = f64(outs["out"])
    if not bool(torch.isfinite(got).all()):
        return ""
    atol, rtol = case.atol, case.rtol
    mm = x @ w.t()
    candidates = {
        "that is x @ w.T + bias without the ReLU: apply max(., 0) in the epilogue": mm + bias,
        "that is relu(x @ w.T): the bias is missing": mm.clamp_min(0),
        "that is relu(x @ w.T) + bias: add the bias BEFORE the ReLU": mm.clamp_min(0) + bias,
    }
    for text, want in candidates.items():
        if torch.allclose(got, want, atol=atol, rtol=rtol):
            return text
    if x.shape[0] == w.shape[0] == bias.shape[0] and torch.allclose(
            got, (mm + bias[:, None]).clamp_min(0), atol=atol, rtol=rtol):
        return "the bias was added along the rows: bias[n] belongs to column n (the N axis)"
    return ""


register(Exercise(
    "03.linear_relu", "fused linear + bias + ReLU", "linear_relu(x, w, bias, out)", _linear_relu_cases,
    # one launch of any kind: a transposing copy of w first is a second launch whatever the shapes (counted
    # as one on the activations, it failed only where w has as many rows or columns as x has rows)
    max_launches=1,
    hint={"wrong": "w is (N, K): pass w.t(), a (K, N) view with strides (1, K), as b; add bias[n] along "
                   "the columns (the N axis) to the fp32 accumulator and apply max(., 0) before the one "
                   "store",
          "unwritten": "one program per (BLOCK_M, BLOCK_N) tile of out, cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) "
                       "of them, each storing its whole tile (masked at the edges)",
          "out_of_bounds": "bias has N elements: load bias at the tile's columns, masked with cols < N (or "
                           "wrapped cols % N); mask the K tail and the store with rows < M and cols < N",
          "nan": "a masked load without other= reads undefined values (NaN in the checker): give the K-tail "
                 "loads other=0.0",
          "launches": "one launch: the matmul kernel adds bias[n] to its fp32 accumulator and applies "
                      "max(., 0) before its one store; no separate bias or ReLU kernel, and no copy of w "
                      "(w.t() is a view the kernel reads through its strides)",
          "fusion": "no (M, N) temporary: bias and ReLU are applied to the accumulator in registers",
          "host": "no torch arithmetic outside your kernel (no x @ w.T, no relu): it all happens in "
                  "your kernel"},
    fusion=Fusion("bias and ReLU are applied to the fp32 accumulator in the matmul kernel's epilogue, "
                  "before its one store of out (one launch, no (M, N) temporary)", _linear_temporary),
    speed=_matmul_speed("linear_relu", linear=True)))
