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


def _failing(tensors: dict, ok) -> list[str]:
    """'name (shape ..., strides ...)' of each tensor for which ok(tensor) is False."""
    return [f"{name} (shape {tuple(t.shape)}, strides {t.stride()})"
            for name, t in tensors.items() if not ok(t)]


def expect_contiguous(function: str, **tensors) -> None:
    """Raise a ValueError naming every tensor that is not contiguous, for a kernel that walks its tensors as
    one flat run of elements: on a transposed or sliced view it would read and write the wrong ones."""
    strided = _failing(tensors, lambda t: t.is_contiguous())
    if strided:
        raise ValueError(f"{function} needs contiguous tensors, and these are not: {', '.join(strided)}; "
                         "pass a .contiguous() copy")


def expect_unit_stride(function: str, **tensors) -> None:
    """Raise a ValueError naming every tensor whose last dimension is not stride 1, for a kernel that takes a
    row stride only and reads each row as one run of elements (any row stride is fine)."""
    strided = _failing(tensors, lambda t: not t.dim() or t.shape[-1] <= 1 or t.stride(-1) == 1)
    if strided:
        raise ValueError(f"{function} needs rows of adjacent elements (stride 1 along the last dimension), "
                         f"and these are not: {', '.join(strided)}; pass a .contiguous() copy")


INT32_MAX = 2**31 - 1


def needs_int64(*tensors, dims: tuple[int, ...] | None = None, margin: int = 256) -> bool:
    """Can an element offset of these tensors, index times stride summed over `dims` (every dim by default),
    pass int32's 2^31 - 1, counting `margin` indices past each end (the masked rows of a last tile)? Only a
    tensor (or a view into one) of about 2^31 elements or more can. Kernels take the answer as a constexpr
    and index in 64 bits only then: an int64 index vector costs registers in a kernel's inner loop (lesson
    05's attention ran 4 % slower with its rows in 64 bits, results/explore/README.md), so each case
    compiles its own."""
    return any(sum((t.shape[d] + margin) * abs(t.stride(d)) for d in (range(t.dim()) if dims is None else dims))
               > INT32_MAX for t in tensors)
