"""A host function handed a tensor of the wrong shape says which one, before any launch: the kernel would
read and write past the buffers (an illegal address on a GPU, corrupted host memory in the interpreter:
`matmul` with a K that disagrees crashed the Python process)."""
from __future__ import annotations

import pytest
import torch

from course_utils.lessons import l02_first_kernels as l02
from course_utils.lessons import l03_matmul as l03
from course_utils.lessons import l04_fusion as l04
from course_utils.lessons import l05_online_softmax as l05
from course_utils.lessons import l06_fused_rmsnorm_mlp as l06
from course_utils.lessons import l07_fp8_quantization as l07
from course_utils.lessons import l08_backward_passes as l08
from course_utils.lessons import l09_decoding as l09
from course_utils.shapes import expect_shapes

r, e = torch.randn, torch.empty

pytestmark = pytest.mark.usefixtures("on_the_device")  # the factory functions below make tensors there
f8, i32 = torch.float8_e4m3fn, torch.int32
qkv = (1, 2, 8, 16)

# (call, the argument named in the message, its shape, the shape expected)
WRONG = {
    "add": (lambda: l02.add(r(8), r(8), e(5)), "out", (5,), (8,)),
    "relu": (lambda: l02.relu(r(4, 4), e(3, 4)), "out", (3, 4), (4, 4)),
    "copy_2d": (lambda: l02.copy_2d(r(4, 4).t(), e(4, 3)), "out", (4, 3), (4, 4)),
    "matmul_naive": (lambda: l03.matmul_naive(r(3, 4), r(5, 6), e(3, 6)), "b", (5, 6), (4, 6)),
    "matmul": (lambda: l03.matmul(r(3, 4), r(5, 6), e(3, 6)), "b", (5, 6), (4, 6)),
    "matmul bias": (lambda: l03.matmul(r(3, 4), r(4, 6), e(3, 6), bias=r(5)), "bias", (5,), (6,)),
    "linear_relu": (lambda: l03.linear_relu(r(3, 4), r(6, 5), r(6), e(3, 6)), "w", (6, 5), (6, 4)),
    "sin4": (lambda: l04.sin4(r(10), e(9)), "out", (9,), (10,)),
    "silu_mul": (lambda: l04.silu_mul(r(4, 4), r(4, 5), e(4, 4)), "u", (4, 5), (4, 4)),
    "softmax": (lambda: l05.softmax(r(4, 8), e(4, 7)), "out", (4, 7), (4, 8)),
    "attention": (lambda: l05.attention(r(*qkv), r(1, 2, 9, 16), r(*qkv), e(*qkv), False), "k",
                  (1, 2, 9, 16), qkv),
    "rmsnorm": (lambda: l06.rmsnorm(r(4, 8), r(7), 1e-6, e(4, 8)), "weight", (7,), (8,)),
    "gate_up_silu": (lambda: l06.gate_up_silu(r(2, 8), r(16, 9), r(16, 9), e(2, 16)), "w_gate", (16, 9), (16, 8)),
    "rmsnorm_mlp": (lambda: l06.rmsnorm_mlp(r(2, 8), r(8), r(16, 8), r(16, 8), r(16, 8), 1e-6, e(2, 8)),
                    "w_down", (16, 8), (8, 16)),
    "quantize_rowwise": (lambda: l07.quantize_rowwise(r(4, 8), e(4, 8, dtype=f8), e(8)), "scale_out", (8,), (4,)),
    "fp8_matmul": (lambda: l07.fp8_matmul(e(4, 16, dtype=f8), e(4), e(8, 32, dtype=f8), e(8), e(4, 8)), "b",
                   (8, 32), (8, 16)),
    "w8a16_gemv": (lambda: l07.w8a16_gemv(r(1, 16), e(8, 32, dtype=torch.int8), e(8), e(1, 8)), "w_int8",
                   (8, 32), (8, 16)),
    "rmsnorm_backward": (lambda: l08.rmsnorm_backward(r(4, 8), r(4, 8), r(8), r(4), e(4, 8), e(4)), "dw", (4,), (8,)),
    "silu_mul_backward": (lambda: l08.silu_mul_backward(r(4), r(4), r(5), e(4), e(4)), "u", (5,), (4,)),
    "cross_entropy": (lambda: l08.cross_entropy(r(4, 10), torch.zeros(3, dtype=torch.int64), e(4), e(4, 10)),
                      "targets", (3,), (4,)),
    "attention_backward": (lambda: l08.attention_backward(*(r(*qkv) for _ in range(4)), r(1, 2, 9), r(*qkv),
                                                          e(*qkv), e(*qkv), e(*qkv), False), "lse", (1, 2, 9),
                           (1, 2, 8)),
    "kv_append": (lambda: l09.kv_append(r(1, 2, 16), r(1, 2, 16), e(1, 2, 8, 16), e(1, 2, 8, 16),
                                        e(2, dtype=i32)), "positions", (2,), (1,)),
    "decode_attention": (lambda: l09.decode_attention(r(1, 4, 16), r(1, 2, 8, 32), r(1, 2, 8, 32),
                                                      e(1, dtype=i32), e(1, 4, 16)), "cache_k", (1, 2, 8, 32),
                         (1, 2, 8, 16)),
    "w4a16_gemv": (lambda: l09.w4a16_gemv(r(1, 256), e(8, 64, dtype=torch.uint8), e(8, 2), 128, e(1, 8)),
                   "w_packed", (8, 64), (8, 128)),
}


@pytest.mark.parametrize("name", WRONG)
def test_a_wrong_shape_is_named_before_any_launch(name):
    call, argument, got, want = WRONG[name]
    with pytest.raises(ValueError) as info:
        call()
    assert f"{name.split()[0]}: " in str(info.value)
    assert f"{argument} has shape {got}, expected {want}" in str(info.value)


def test_every_wrong_argument_is_named_at_once():
    with pytest.raises(ValueError, match=r"^f: b has shape \(2,\), expected \(3,\); c has shape \(4,\), "
                                         r"expected \(5,\)$"):
        expect_shapes("f", a=(e(1), (1,)), b=(e(2), (3,)), c=(e(4), (5,)))
    expect_shapes("f", a=(e(1, 2), torch.Size([1, 2])))


# Kernels that walk their tensors as one flat run of elements: a view with other strides would be read and
# written in the wrong order (a silent wrong answer), so they refuse it. (call, the tensor named)
STRIDED = {
    "add": (lambda: l02.add(r(16)[::2], r(8), e(8)), "x"),
    "relu": (lambda: l02.relu(r(4, 4), e(4, 4).t()), "out"),
    "sin4": (lambda: l04.sin4(r(4, 6).t(), e(6, 4)), "x"),
    "silu_mul": (lambda: l04.silu_mul(r(4, 4), r(4, 8)[:, :4], e(4, 4)), "u"),
    "silu_mul_backward": (lambda: l08.silu_mul_backward(r(4, 4).t(), r(4, 4), r(4, 4), e(4, 4), e(4, 4)), "dh"),
    # 1-D tensors read as base + index (biases, scales, statistics, targets, lengths, positions)
    "matmul": (lambda: l03.matmul(r(3, 4), r(4, 5), e(3, 5), bias=r(10)[::2]), "bias"),
    "fp8_matmul": (lambda: l07.fp8_matmul(e(16, 16, dtype=f8), r(32)[::2], e(16, 16, dtype=f8), r(16),
                                          e(16, 16)), "a_scale"),
    "quantize_rowwise": (lambda: l07.quantize_rowwise(r(4, 8), e(4, 8, dtype=f8), e(8)[::2]), "scale_out"),
    "w8a16_gemv": (lambda: l07.w8a16_gemv(r(2, 16), e(8, 16, dtype=torch.int8), r(16)[::2], e(2, 8)),
                   "scale"),
    "rmsnorm_backward": (lambda: l08.rmsnorm_backward(r(4, 8), r(4, 8), r(8), r(8)[::2], e(4, 8), e(8)),
                         "rstd"),
    "cross_entropy": (lambda: l08.cross_entropy(r(4, 10), torch.zeros(8, dtype=torch.int64)[::2], e(4),
                                                e(4, 10)), "targets"),
    "attention_backward": (lambda: l08.attention_backward(r(1, 4, 2, 16).transpose(1, 2),
                                                          *(r(1, 2, 4, 16) for _ in range(3)), r(1, 2, 4),
                                                          *(r(1, 2, 4, 16) for _ in range(4)), False), "q"),
    "kv_append": (lambda: l09.kv_append(r(2, 1, 16), r(2, 1, 16), e(2, 1, 8, 16), e(2, 1, 8, 16),
                                        torch.zeros(4, dtype=torch.int32)[::2]), "positions"),
    "decode_attention": (lambda: l09.decode_attention(r(2, 2, 16), r(2, 1, 8, 16), r(2, 1, 8, 16),
                                                      torch.ones(4, dtype=torch.int32)[::2], e(2, 2, 16)), "lengths"),
}


@pytest.mark.parametrize("name", STRIDED)
def test_a_flat_kernel_refuses_a_strided_view(name):
    call, tensor = STRIDED[name]
    with pytest.raises(ValueError, match=rf"^{name} needs contiguous tensors, and these are not: {tensor} \("):
        call()


# Kernels that take a row stride only: rows of adjacent elements, any row stride. (call, the tensor named)
ROWS = {
    "rmsnorm_forward": (lambda: l08.rmsnorm_forward(r(8, 4).t(), r(8), 1e-6, e(4, 8), e(4)), "x"),
    "rmsnorm_backward": (lambda: l08.rmsnorm_backward(r(8, 4).t(), r(4, 8), r(8), r(4), e(4, 8), e(8)), "dy"),
    "cross_entropy": (lambda: l08.cross_entropy(r(10, 4).t(), torch.zeros(4, dtype=torch.int64), e(4),
                                                e(4, 10)), "logits"),
    "w8a16_gemv": (lambda: l07.w8a16_gemv(r(16, 2).t(), e(8, 16, dtype=torch.int8), e(8), e(2, 8)), "x"),
}


def test_a_group_size_the_int4_kernel_cannot_take_is_refused():
    """Groups of 4 or 12 weights: K % group_size was all that was checked, and the kernel's int32 words of 8
    weights gave errors of 22 and 51 on such groups."""
    for group in (4, 12, 24):
        with pytest.raises(ValueError, match=rf"group_size = {group}: this kernel needs a power of 2 >= 16"):
            l09.w4a16_gemv(r(1, 48), e(8, 24, dtype=torch.uint8), r(8, 48 // group), group, e(1, 8))


@pytest.mark.parametrize("name", ROWS)
def test_a_row_kernel_refuses_rows_of_strided_elements(name):
    call, tensor = ROWS[name]
    with pytest.raises(ValueError, match=rf"^{name} needs rows of adjacent elements .*: {tensor} \("):
        call()


def test_a_row_kernel_takes_any_row_stride():
    x = r(6, 20)[:, :16]  # rows 20 elements apart, each row contiguous
    y, rstd = e(6, 16), e(6)
    l08.rmsnorm_forward(x, torch.ones(16), 1e-6, y, rstd)
    torch.testing.assert_close(y, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
