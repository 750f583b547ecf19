"""Shapes checked before a launch: a kernel handed a tensor of the wrong shape reads and writes past its
buffers (on a GPU, an illegal memory access that ends the CUDA context; in the interpreter, corrupted
host memory that can crash the Python process). A host function names what it needs instead."""
from __future__ import annotations


def expect_shapes(function: str, **tensors) -> None:
    """Raise a ValueError naming every argument whose shape is not the expected one.

    expect_shapes("matmul", b=(b, (K, N)), out=(out, (M, N))): each keyword is an argument's name, its
    value the tensor and the shape it must have."""
    wrong = [f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}"
             for name, (t, shape) in tensors.items() if tuple(t.shape) != tuple(shape)]
    if wrong:
        raise ValueError(f"{function}: {'; '.join(wrong)}")
