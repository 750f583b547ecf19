"""Exercises of lesson 02: vector add, ReLU, strided 2-D copy."""
from __future__ import annotations

import torch

from ..grading import Case, Exercise, Out, register
from ..grading.inputs import f64, randn, sliced, tolerance, transposed
from ..mode import size


def _add_cases(gen):
    lengths = [(1, "length 1"), (1823, "1823: no multiple of any block"),
               (size(1 << 20, 1 << 14) + 3, "a large length plus 3")]
    for n, label in lengths:
        for dtype in (torch.float32, torch.float16):
            x, y = randn(n, dtype, gen), randn(n, dtype, gen)
            expected = f64(x) + f64(y)
            yield Case(f"{label}, {str(dtype)[6:]}", (x, y, Out("out", (n,), dtype)), {"out": expected},
                       *tolerance(dtype))


def _relu_cases(gen):
    shapes = [((1,), "one element"), ((3, 5, 7), "3-D"), (size((1823, 781), (37, 781)), "2-D, odd sizes")]
    for shape, label in shapes:
        for dtype in (torch.float32, torch.float16):
            x = randn(shape, dtype, gen)
            yield Case(f"{label}, {str(dtype)[6:]}", (x, Out("out", shape, dtype)),
                       {"out": f64(x).clamp_min(0)}, *tolerance(dtype))


def _copy_cases(gen):
    m, n = size((1823, 781), (67, 45))
    inputs = [
        ("1 x 1", randn((1, 1), gen=gen)),
        ("contiguous", randn((m, n), gen=gen)),
        ("transposed: strides (1, M)", transposed((m, n), gen=gen)),
        ("every other column of a wider tensor", sliced((m, n), gen=gen)),
        ("a transposed slice", randn((n * 2, m), gen=gen)[::2].t()),
    ]
    for label, x in inputs:
        yield Case(label, (x, Out("out", tuple(x.shape), x.dtype)), {"out": f64(x)})


register(Exercise(
    "02.vector_add", "vector add", "add(x, y, out)", _add_cases,
    hint="every program must mask its loads and stores with offsets < n_elements, and the grid must "
         "cover all n elements: triton.cdiv(n, BLOCK) programs"))
register(Exercise(
    "02.relu", "ReLU of any shape", "relu(x, out)", _relu_cases,
    hint="a contiguous tensor of any shape is x.numel() consecutive elements: launch over numel, not shape[0]"))
register(Exercise(
    "02.copy_2d", "copy of a strided 2-D tensor", "copy_2d(x, out)", _copy_cases,
    hint="address element (i, j) as i * x.stride(0) + j * x.stride(1); mask rows < M and cols < N"))
