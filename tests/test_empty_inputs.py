"""Every solution takes an input with no elements (no rows, no batch, rows of no elements) and returns
without launching into a division by zero; what it must write (a reduction over no rows) it writes."""
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

e = torch.empty

pytestmark = pytest.mark.usefixtures("on_the_device")  # the factory functions below make tensors there
f8 = torch.float8_e4m3fn
i32 = torch.int32

CALLS = {
    "02.vector_add n=0": lambda: l02.add(e(0), e(0), e(0)),
    "02.relu 0 x 3": lambda: l02.relu(e(0, 3), e(0, 3)),
    "02.copy_2d 0 x 3": lambda: l02.copy_2d(e(0, 3), e(0, 3)),
    "03.matmul_naive M=0": lambda: l03.matmul_naive(e(0, 4), e(4, 5), e(0, 5)),
    "03.matmul N=0": lambda: l03.matmul(e(3, 4), e(4, 0), e(3, 0)),
    "03.linear_relu M=0": lambda: l03.linear_relu(e(0, 4), e(5, 4), e(5), e(0, 5)),
    "04.sin4 n=0": lambda: l04.sin4(e(0), e(0)),
    "04.silu_mul 4 x 0": lambda: l04.silu_mul(e(4, 0), e(4, 0), e(4, 0)),
    "05.softmax 0 rows": lambda: l05.softmax(e(0, 8), e(0, 8)),
    "05.softmax rows of 0": lambda: l05.softmax(e(3, 0), e(3, 0)),
    "05.attention S=0": lambda: l05.attention(*(e(1, 2, 0, 16) for _ in range(4)), False),
    "06.rmsnorm 0 rows": lambda: l06.rmsnorm(e(0, 8), e(8), 1e-6, e(0, 8)),
    "06.rmsnorm rows of 0": lambda: l06.rmsnorm(e(3, 0), e(0), 1e-6, e(3, 0)),
    "06.gate_up_silu M=0": lambda: l06.gate_up_silu(e(0, 8), e(16, 8), e(16, 8), e(0, 16)),
    "06.rmsnorm_mlp M=0": lambda: l06.rmsnorm_mlp(e(0, 8), e(8), e(16, 8), e(16, 8), e(8, 16), 1e-6, e(0, 8)),
    "07.quantize_rowwise 0 rows": lambda: l07.quantize_rowwise(e(0, 8), e(0, 8, dtype=f8), e(0)),
    "07.quantize_rowwise rows of 0": lambda: l07.quantize_rowwise(e(3, 0), e(3, 0, dtype=f8), e(3)),
    "08.rmsnorm_backward rows of 0": lambda: l08.rmsnorm_backward(e(3, 0), e(3, 0), e(0), torch.ones(3),
                                                                  e(3, 0), e(0)),
    "07.fp8_matmul M=0": lambda: l07.fp8_matmul(e(0, 16, dtype=f8), e(0), e(16, 16, dtype=f8), e(16), e(0, 16)),
    "08.silu_mul_backward 0 rows": lambda: l08.silu_mul_backward(*(e(0, 4) for _ in range(5))),
    "08.cross_entropy 0 rows": lambda: l08.cross_entropy(e(0, 10), e(0, dtype=torch.int64), e(0), e(0, 10)),
    "09.kv_append B=0": lambda: l09.kv_append(e(0, 2, 16), e(0, 2, 16), e(0, 2, 8, 16), e(0, 2, 8, 16),
                                              e(0, dtype=i32)),
    "09.decode_attention B=0": lambda: l09.decode_attention(e(0, 4, 16), e(0, 2, 8, 16), e(0, 2, 8, 16),
                                                            e(0, dtype=i32), e(0, 4, 16)),
    "09.w4a16_gemv M=0": lambda: l09.w4a16_gemv(e(0, 256, dtype=torch.float16), e(8, 128, dtype=torch.uint8),
                                                e(8, 2, dtype=torch.float16), 128, e(0, 8, dtype=torch.float16)),
}


@pytest.mark.parametrize("name", CALLS)
def test_an_empty_input_is_no_error(name):
    CALLS[name]()


def test_rmsnorm_backward_of_no_rows_writes_a_zero_dw():
    dw = torch.full((8,), 5.0)  # dw = sum over rows of dy * x * rstd: over no rows, 0
    l08.rmsnorm_backward(e(0, 8), e(0, 8), torch.ones(8), e(0), e(0, 8), dw)
    assert torch.equal(dw, torch.zeros(8))


def test_quantize_rowwise_of_a_row_of_no_elements_or_a_tiny_one_gives_finite_scales():
    """A row of no elements gets an all-zero row's scale, 1; a row whose amax is an fp32 subnormal (below
    1.2e-38) once made 1 / amax infinite and every code NaN (then clamped to -448)."""
    scale = torch.full((3,), 5.0)
    l07.quantize_rowwise(e(3, 0), e(3, 0, dtype=f8), scale)
    assert torch.equal(scale, torch.ones(3))
    x = torch.zeros(2, 8)
    x[0, 3], x[1, 5] = 1e-40, -3e-39
    codes, scale = e(2, 8, dtype=f8), e(2)
    l07.quantize_rowwise(x, codes, scale)
    back = codes.float() * scale[:, None]
    assert torch.isfinite(back).all() and (scale > 0).all()
    assert torch.allclose(back, x, rtol=0.07, atol=1e-45), (back, x)
