"""Exercises of lesson 02: vector add, ReLU, strided 2-D copy."""
from __future__ import annotations

import torch

from ..grading import Case, Exercise, Out, register
from ..grading.harness import Speed
from ..grading.inputs import f64, randn, sliced, tolerance, transposed
from ..mode import current, size
from ..roofline import add_cost, elementwise_cost, relu_cost

# A grid capped at the SM count (132 on an H100) without a loop over the remaining blocks stops short
# of this length (1082365 elements, 4.1 MiB of fp32) even with blocks of 4096 and two programs per SM. In
# both modes: the interpreter runs the stub's blocks of 1024 in about 1.4 s (a thousand programs).
CAPPED_GRID_PROGRAMS = 2 * 132  # twice an H100's SMs
CAPPED_GRID_LENGTH = CAPPED_GRID_PROGRAMS * 4096 + 1021
CAPPED_GRID_LABEL = (f"{CAPPED_GRID_LENGTH} elements: more blocks of 4096 than a grid capped at twice the SM "
                     "count (2 x 132 programs) covers; launch cdiv(n, BLOCK) programs, or loop over the rest")
SPEED_N = 1 << 26  # 256 MiB of fp32 per tensor: far beyond any cache
# A length that is a multiple of every block (up to 2^14): the last block is full. A mask built from the
# remainder (offs < n % BLOCK in the last program) masks all of it off there, and only there.
WHOLE_BLOCKS = 1 << 14
WHOLE_BLOCKS_LABEL = (f"{WHOLE_BLOCKS}: a multiple of every block size, the last block full (a mask from "
                      "n % BLOCK masks all of it off)")


def _add_cases(gen):
    lengths = [(1, "length 1"), (1823, "1823: no multiple of any block"),
               (size(1 << 20, 1 << 14) + 3, "a large length plus 3"), (WHOLE_BLOCKS, WHOLE_BLOCKS_LABEL)]
    for n, label in lengths:
        for dtype in (torch.float32, torch.float16):
            x, y = randn(n, dtype, gen), randn(n, dtype, gen)
            expected = f64(x) + f64(y)
            yield Case(f"{label}, {str(dtype)[6:]}", (x, y, Out("out", (n,), dtype)), {"out": expected},
                       *tolerance(dtype))
    n = CAPPED_GRID_LENGTH
    x, y = randn(n, gen=gen), randn(n, gen=gen)
    yield Case(CAPPED_GRID_LABEL, (x, y, Out("out", (n,), torch.float32)), {"out": f64(x) + f64(y)},
               *tolerance(torch.float32))


def _relu_cases(gen):
    shapes = [((1,), "one element"), ((3, 5, 7), "3-D"), (size((1823, 781), (37, 781)), "2-D, odd sizes"),
              ((2, 3000), "2 rows of 3000: more elements than rows x a block (launch over numel, not "
                          "shape[0])"), ((4, WHOLE_BLOCKS // 4), f"4 rows, {WHOLE_BLOCKS_LABEL}")]
    for i, (shape, label) in enumerate(shapes):
        for dtype in (torch.float32, torch.float16):
            x = randn(shape, dtype, gen)
            yield Case(f"{label}, {str(dtype)[6:]}", (x, Out("out", shape, dtype)),
                       {"out": f64(x).clamp_min(0)}, *tolerance(dtype))
        if i == 0:  # then values up to each dtype's largest, 33 of them: a formula that overflows fails early
            yield from _largest_values_cases(gen)
    x = randn(CAPPED_GRID_LENGTH, gen=gen)
    yield Case(CAPPED_GRID_LABEL, (x, Out("out", (CAPPED_GRID_LENGTH,), torch.float32)),
               {"out": f64(x).clamp_min(0)}, *tolerance(torch.float32))


def _largest_values_cases(gen):
    for dtype in (torch.float32, torch.float16):
        x = _near_the_largest(33, dtype, gen)
        yield Case(f"{str(dtype)[6:]} values up to the largest finite one ({torch.finfo(dtype).max:.6g}): "
                   "relu is max(x, 0), computed without a larger intermediate ((x + |x|) / 2 overflows to "
                   "inf)", (x, Out("out", (33,), dtype)), {"out": f64(x).clamp_min(0)}, *tolerance(dtype))
    x = randn(34, gen=gen)  # a length of its own: a result cached by shape is not this case's
    x[3], x[17] = float("inf"), float("-inf")
    yield Case("float32 with inf and -inf among the values: relu(inf) = inf and relu(-inf) = 0, where "
               "x * (x > 0) gives -inf * 0 = NaN", (x, Out("out", (34,), torch.float32)),
               {"out": f64(x).clamp_min(0)}, *tolerance(torch.float32))


def _near_the_largest(n: int, dtype: torch.dtype, gen) -> torch.Tensor:
    """n finite values of `dtype` spread up to its largest, both signs, the two extremes included."""
    big = torch.finfo(dtype).max
    x = randn(n, torch.float64, gen, scale=big / 2).clamp(-big, big)
    x[0], x[1] = big, -big
    return x.to(dtype)


def _copy_cases(gen):
    m, n = size((1823, 781), (67, 45))
    inputs = [
        ("1 x 1", randn((1, 1), gen=gen)),
        ("contiguous", randn((m, n), gen=gen)),
        ("transposed: strides (1, M)", transposed((m, n), gen=gen)),
        ("every other column of a wider tensor", sliced((m, n), gen=gen)),
        ("a transposed slice", randn((n * 2, m), gen=gen)[::2].t()),
        ("130 x 259: more than one tile of 128 in each dimension (a 2-D grid over rows and columns)",
         randn((130, 259), gen=gen)),
        ("128 x 256: whole tiles of any size up to 128 x 256, the last tile of each axis full (a mask from "
         "M % BLOCK_M or N % BLOCK_N masks all of it off)", randn((128, 256), gen=gen)),
    ]
    if current().gpu:  # the interpreter has no such limit, and runs these programs one by one (a minute)
        inputs.append(("one row of 2^21 + 3: more tiles of 32 along it than a grid's axis 1 holds (65535); "
                       "wider tiles where there are that many", randn((1, (1 << 21) + 3), gen=gen)))
        # the same limit for a grid with the rows on axis 1 (CUDA's habit: blockIdx.x for the columns)
        inputs.append(("one column of 2^21 + 3 rows: more tiles of 32 rows than a grid's axis 1 holds "
                       "(65535); put the rows on axis 0, which holds 2^31 - 1",
                       randn(((1 << 21) + 3, 1), gen=gen)))
    for label, x in inputs:
        yield Case(label, (x, Out("out", tuple(x.shape), x.dtype)), {"out": f64(x)})


def _speed_1d(n_inputs: int, cost, solution: str) -> Speed:
    return Speed(lambda: (*(randn(SPEED_N) for _ in range(n_inputs)), Out("out", (SPEED_N,), torch.float32)),
                 lambda args: cost(SPEED_N, 4), f"course_utils.lessons.l02_first_kernels:{solution}",
                 "n = 2^26, fp32")


register(Exercise(
    "02.vector_add", "vector add", "add(x, y, out)", _add_cases,
    hint={"unwritten": "the grid must cover all n elements: triton.cdiv(n, BLOCK) programs, one block each "
                       "(or, with fewer programs, each loops over blocks pid, pid + num_programs, ...), and "
                       "the mask must be offsets < n_elements",
          "out_of_bounds": "every program must mask its loads and stores with offsets < n_elements "
                           "(not <=): the last block is partial",
          "wrong": "out[i] = x[i] + y[i]: load both at the same offsets, add, store at those offsets",
          "nan": "NaN where a sum was expected: a lane loaded without its mask (or without other=) was stored; "
                 "mask the loads and the store with the same offsets < n_elements",
          "host": "the host function only allocates, computes the grid and launches: x + y, torch.add or NumPy "
                  "compute the answer outside your Triton kernel"},
    speed=_speed_1d(2, add_cost, "add")))
register(Exercise(
    "02.relu", "ReLU of any shape", "relu(x, out)", _relu_cases,
    hint={"unwritten": "a contiguous tensor of any shape is x.numel() consecutive elements: launch over "
                       "numel, not shape[0] (cdiv(numel, BLOCK) programs), and mask with offsets < numel",
          "wrong": "relu(x) = max(x, 0): tl.maximum(x, 0.0) or tl.where(x > 0, x, 0.0)",
          "out_of_bounds": "mask = offsets < x.numel() on the load and the store: the last block is partial",
          "nan": "NaN where a number was expected: a lane loaded without its mask was stored; use the same mask "
                 "for the load and the store",
          "host": "the host function only allocates, computes the grid and launches: torch.relu, clamp or NumPy "
                  "compute the answer outside your Triton kernel"},
    speed=_speed_1d(1, relu_cost, "relu")))
register(Exercise(
    "02.copy_2d", "copy of a strided 2-D tensor", "copy_2d(x, out)", _copy_cases,
    hint={"wrong": "address element (i, j) as i * x.stride(0) + j * x.stride(1), never with the shape "
                   "(i * N + j assumes strides (N, 1)); out has its own strides",
          "unwritten": "the grid needs cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N) programs; mask rows < M and "
                       "cols < N",
          "out_of_bounds": "mask rows < M and cols < N (against the sizes, not the block) on the load and "
                           "the store; use x.stride(0), x.stride(1) for x and out's strides for out",
          "nan": "NaN where a value was expected: an element loaded outside the mask was stored; mask the load "
                 "and the store with the same (rows < M) & (cols < N)",
          "host": "the host function only allocates, computes the grid and launches: x.clone(), x.contiguous(), "
                  "out.copy_(x) or NumPy copy outside your Triton kernel"},
    speed=Speed(lambda: (randn((8192, 8192)).t(), Out("out", (8192, 8192), torch.float32)),
                lambda args: elementwise_cost(8192 * 8192, 4),  # a copy: 1 "FLOP" (a move) per element
                "course_utils.lessons.l02_first_kernels:copy_2d", "8192 x 8192 fp32, transposed")))
