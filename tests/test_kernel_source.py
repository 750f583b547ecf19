"""The interpreter runs a @triton.jit body as Python, so torch, NumPy or a plain helper inside it computes
on the host while the loads and stores stay real; a GPU's compiler refuses all of them. The checker
refuses them in the interpreter too, naming the line (`course_utils.grading.kernel_source`)."""
from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import course_utils.benches
import course_utils.lessons
from course_utils.grading import CheckFailed, check, kernel_source
from course_utils.mode import current

pytestmark = pytest.mark.skipif(not current().interpret, reason="the interpreter's loophole; a GPU compiles")


def _softmax_on_the_host(v):
    """torch.softmax on the block's NumPy data, handed back as a Triton value."""
    from triton.runtime.interpreter import TensorHandle

    result = torch.softmax(torch.from_numpy(v.handle.data.astype("float64")), -1).float().numpy()
    return tl.core.tensor(TensorHandle(result, tl.float32), v.type.with_element_ty(tl.float32))


@triton.jit
def _helper_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * sxm + offs * sxn, mask=offs < n, other=float("-inf")).to(tl.float32)
    y = _softmax_on_the_host(x)
    tl.store(out_ptr + row * som + offs * son, y.to(out_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _inline_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * sxm + offs * sxn, mask=offs < n, other=float("-inf")).to(tl.float32)
    e = np.exp(x.handle.data - x.handle.data.max())
    x.handle.data = e / e.sum()
    tl.store(out_ptr + row * som + offs * son, x.to(out_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _argument_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, f, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * sxm + offs * sxn, mask=offs < n, other=float("-inf")).to(tl.float32)
    tl.store(out_ptr + row * som + offs * son, f(x).to(out_ptr.dtype.element_ty), mask=offs < n)


def _launch(kernel, *extra):
    def softmax(x, out):
        kernel[(x.shape[0],)](x, out, x.shape[1], *x.stride(), *out.stride(), *extra,
                              BLOCK=triton.next_power_of_2(x.shape[1]))
    return softmax


@pytest.mark.parametrize("softmax, message", [
    (_launch(_helper_kernel), r"uses `_softmax_on_the_host`, which is not Triton, at `y = _softmax_on_the_h"),
    (_launch(_inline_kernel), r"uses the module `numpy`, which is not Triton|reads `.handle`"),
    (_launch(_argument_kernel, _softmax_on_the_host), r"launched with function _softmax_on_the_host as argument"),
], ids=["plain helper", "numpy and .handle inline", "a function as an argument"])
def test_host_code_inside_a_kernel_is_refused(softmax, message):
    """Each candidate gives the right softmax through real loads and stores; each fails, naming the line."""
    x = torch.randn(3, 10)
    out = torch.empty_like(x)
    softmax(x, out)
    torch.testing.assert_close(out, torch.softmax(x, -1))  # it computes the answer, on the host
    with pytest.raises(CheckFailed, match=message):
        check("05.softmax", softmax, seed=1, quiet=True)


def _kernels():
    for package in (course_utils.lessons, course_utils.benches):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for name, value in vars(module).items():
                if kernel_source._jit_function(value) is not None:
                    yield f"{info.name}.{name}", value


def test_every_course_kernel_is_plain_triton():
    """The rule refuses nothing the course's own kernels do (a rule that refused them would fail every
    honest student who writes the same): tl.*, libdevice, math constants, @triton.jit helpers, autotuning."""
    found = {name: kernel_source.problems(kernel) for name, kernel in _kernels()}
    assert len(found) > 40
    assert {name: p for name, p in found.items() if p} == {}
