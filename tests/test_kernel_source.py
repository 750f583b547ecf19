"""The interpreter runs a @triton.jit body as Python, so torch, NumPy or a plain helper inside it computes
on the host while the loads and stores stay real; a GPU's compiler refuses all of them. The checker
refuses them in the interpreter too, naming the line (`course_utils.grading.kernel_source`)."""
from __future__ import annotations

import collections
import functools
import importlib
import math
import pkgutil
import re
import types

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import course_utils.benches
import course_utils.lessons
from course_utils.grading import CheckFailed, check, kernel_source
from helpers import interpreter_only_because

pytestmark = interpreter_only_because("the interpreter's loophole; a GPU compiles")


def _softmax_on_the_host(v):
    """torch.softmax on the block's NumPy data, handed back as a Triton value."""
    from triton.runtime.interpreter import TensorHandle

    result = torch.softmax(torch.from_numpy(v.handle.data.astype("float64")), -1).float().numpy()
    return tl.core.tensor(TensorHandle(result, tl.float32), v.type.with_element_ty(tl.float32))


@triton.jit
def _load_row(x_ptr, n, sxm, sxn, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    return tl.load(x_ptr + tl.program_id(0) * sxm + offs * sxn, mask=offs < n, other=float("-inf")).to(tl.float32)


@triton.jit
def _store_row(out_ptr, y, n, som, son, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + tl.program_id(0) * som + offs * son, y.to(out_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _helper_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    y = _softmax_on_the_host(x)
    _store_row(out_ptr, y, n, som, son, BLOCK)


@triton.jit
def _inline_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    e = np.exp(x.handle.data - x.handle.data.max())
    x.handle.data = e / e.sum()
    _store_row(out_ptr, x, n, som, son, BLOCK)


@triton.jit
def _argument_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, f, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    _store_row(out_ptr, f(x), n, som, son, BLOCK)


@triton.jit
def _disguised_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    y = tl.host_softmax(x)
    _store_row(out_ptr, y, n, som, son, BLOCK)


def _disguised(x, out):
    """The host helper put into triton.language's namespace and dressed as one of its functions."""
    helper = functools.partial(_softmax_on_the_host)
    helper.__module__ = "triton.language.core"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tl, "host_softmax", helper, raising=False)
        _launch(_disguised_kernel)(x, out)


def _launch(kernel, *extra):
    def softmax(x, out):
        kernel[(x.shape[0],)](x, out, x.shape[1], *x.stride(), *out.stride(), *extra,
                              BLOCK=triton.next_power_of_2(x.shape[1]))
    return softmax


@pytest.mark.parametrize("softmax, message", [
    (_launch(_helper_kernel), r"uses `_softmax_on_the_host`, which is not Triton, at `y = _softmax_on_the_host"),
    (_launch(_inline_kernel), r"uses the module `numpy`, which is not Triton|reads `.handle`"),
    (_launch(_argument_kernel, _softmax_on_the_host), r"launched with function _softmax_on_the_host as argument"),
    (_disguised, r"uses `tl.host_softmax`, which is not Triton|replaced what the interpreter computes with "
                 r"\(triton.language.host_softmax"),
], ids=["plain helper", "numpy and .handle inline", "a function as an argument", "tl. and __module__"])
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


HOST_SOFTMAX = tl.constexpr(_softmax_on_the_host)  # a host function wrapped as a "constant"


@triton.jit
def _constexpr_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    y = HOST_SOFTMAX(x)
    _store_row(out_ptr, y, n, som, son, BLOCK)


@triton.jit
def _shadowing_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    unused = [_softmax_on_the_host for _softmax_on_the_host in ()]  # noqa: F841 - binds the name locally
    y = _softmax_on_the_host(x)
    _store_row(out_ptr, y, n, som, son, BLOCK)


@triton.jit
def _lambda_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    y = (lambda f: f(x))(_softmax_on_the_host)
    _store_row(out_ptr, y, n, som, son, BLOCK)


@pytest.mark.parametrize("kernel, message", [
    (_constexpr_kernel, r"uses `HOST_SOFTMAX`, which is not Triton"),
    (_shadowing_kernel, r"uses `_softmax_on_the_host`, which is not Triton, at `y = "),
    (_lambda_kernel, r"has a Lambda, which no Triton kernel can have"),
], ids=["tl.constexpr(host function)", "a comprehension's name", "lambda"])
def test_host_code_hidden_from_the_names_is_refused(kernel, message):
    with pytest.raises(CheckFailed, match=message):
        check("05.softmax", _launch(kernel), seed=1, quiet=True)


@triton.jit
def _relu_block(x):
    return tl.maximum(x, 0.0)


@triton.jit
def _module_helper_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, _HELPERS._relu_private(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


_HELPERS = types.SimpleNamespace()


def test_a_private_jit_helper_of_a_module_is_triton():
    """`helpers._relu(x)` with a @triton.jit function: what a GPU compiles is not refused for its name."""
    module = types.ModuleType("helpers")
    module._relu_private = _relu_block
    globals()["_HELPERS"] = module
    assert kernel_source.problems(_module_helper_kernel) == []


def test_a_name_bound_again_after_a_pass_is_judged_again():
    """The verdict is not cached per kernel: the helper a kernel's name reaches can change between checks."""
    global _HELPER
    _HELPER = _relu_block
    assert kernel_source.problems(_swap_kernel) == []
    _HELPER = _softmax_on_the_host
    assert "uses `_HELPER`, which is not Triton" in " ".join(kernel_source.problems(_swap_kernel))


_HELPER = _relu_block


@triton.jit
def _swap_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, _HELPER(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


@triton.jit
def _printing_relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    print(f"block {x}")
    tl.device_print("x", x)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=offs < n)


def test_a_block_prints_without_its_values_while_checked(capsys):
    """print(x) and f"{x}" inside a kernel: the interpreter's text of a block carries its values out of the
    kernel, to host Python that could parse them; while checked it says what the block is, no more."""
    def relu(x, out):
        _printing_relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)

    check("02.relu", relu, seed=1, quiet=True)
    printed = capsys.readouterr().out
    assert "values hidden while the checker watches" in printed
    assert not re.search(r"\d\.\d{3}", printed), printed[:500]


_Config = collections.namedtuple("_Config", "scale rounds")
_CONFIG = _Config(0.5, 2)
_SIZES = (16, (32, 64))
_BLOCK = tl.constexpr(64)


@triton.jit
def _honest_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * _BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    for _ in tl.static_range(_CONFIG.rounds):
        x = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL) * _CONFIG.scale
    y = tl.math.exp2(x * math.log2(math.e)) + triton.cdiv(_SIZES[0], 8) + _relu_block(x)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=offs < n)


def test_what_honest_kernels_use_is_triton():
    """Triton's enums, namedtuple and tuple constants, tl.constexpr globals, math constants, triton.cdiv,
    tl.math, tl.static_range and @triton.jit helpers: none of them refused."""
    assert kernel_source.problems(_honest_kernel) == []


@triton.jit
def _hinted_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.max_contiguous(tl.multiple_of(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), BLOCK), BLOCK)
    tl.static_print("BLOCK", BLOCK)
    x = tl.load(x_ptr + tl.max_constancy(offs, 1), mask=offs < n)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=offs < n)


def test_compiler_hints_and_static_print_are_triton(capsys):
    """Triton's matmul tutorial writes tl.max_contiguous(tl.multiple_of(offs, BLOCK), BLOCK). While a kernel
    runs, the interpreter swaps the three hints for a functools.partial of its own and tl.static_print for
    print: judged as such, they were "not Triton", a false failure of a kernel copied from the tutorial."""
    def relu(x, out):
        _hinted_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)

    check("02.relu", relu, seed=1, quiet=True)
    assert "BLOCK" in capsys.readouterr().out


@triton.jit
def _instrument_kernel(x_ptr, BLOCK: tl.constexpr):
    triton._instrumentation.instrument(point="p", backend="b")  # calls back what the host registered


@triton.jit
def _do_bench_kernel(x_ptr, BLOCK: tl.constexpr):
    triton.testing.do_bench(x_ptr)


@pytest.mark.parametrize("kernel, name", [(_instrument_kernel, "triton._instrumentation.instrument"),
                                          (_do_bench_kernel, "triton.testing.do_bench")],
                         ids=["instrumentation", "testing"])
def test_host_functions_of_triton_files_are_not_triton(kernel, name):
    """Every function of Triton's files passed for Triton, the host's utilities too: a kernel body that called
    triton._instrumentation.instrument(point=..., backend=...) ran a Python function the host had registered
    (register_instrumentation) inside the launch, where the checker pauses, and its `S.copy_(x + y)` passed
    02.vector_add unseen, unflagged. Only Triton's language (and triton.cdiv's file) is Triton in a kernel."""
    if name.startswith("triton._instrumentation"):
        pytest.importorskip("triton._instrumentation")
    assert any(f"uses `{name}`, which is not Triton" in p for p in kernel_source.problems(kernel)), (
        kernel_source.problems(kernel))


@triton.jit
def _two_bodies_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    """The interpreter runs from the last line that starts with `def `, in a string or not:
def _two_bodies_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    _store_row(out_ptr, _softmax_on_the_host(x), n, som, son, BLOCK)
    _ = '''
    """
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    _store_row(out_ptr, x, n, som, son, BLOCK)  # '''


def test_a_second_body_in_a_docstring_is_refused():
    """What reads as the body copies x; what the interpreter runs is the softmax on the host in the string."""
    with pytest.raises(CheckFailed, match=r"has 2 lines that start with `def ` in `_two_bodies_kernel`'s source"):
        check("05.softmax", _launch(_two_bodies_kernel), seed=1, quiet=True)


@triton.jit
def _relu_descriptor_kernel(x_desc, out_desc, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    out_desc.store([start], tl.maximum(x_desc.load([start]), 0.0))


def test_tensor_descriptors_made_on_the_host_are_addressed_by_their_tensors():
    """A kernel given only TensorDescriptors: its loads and stores address the descriptors' tensors (they
    were counted out of bounds of every argument, or crashed on an empty list of them)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def relu(x, out):
        x_desc = TensorDescriptor.from_tensor(x.view(-1), [64])
        out_desc = TensorDescriptor.from_tensor(out.view(-1), [64])
        _relu_descriptor_kernel[(triton.cdiv(x.numel(), 64),)](x_desc, out_desc, BLOCK=64)

    check("02.relu", relu, seed=1, quiet=True)


def test_a_kernel_without_a_source_file_is_refused():
    """A kernel made by exec has no source for Triton (a GPU refuses it; the interpreter runs it as plain
    Python, unread by the checker)."""
    namespace = {"tl": tl, "triton": triton}
    exec(compile("@triton.jit\ndef made(x_ptr):\n    tl.store(x_ptr, 1.0)\n", "<string>", "exec"), namespace)
    assert "`made` has no source that can be read" in " ".join(kernel_source.problems(namespace["made"]))


@triton.jit
def _exp_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    _store_row(out_ptr, tl.exp(x), n, som, son, BLOCK)


def _numpy_softmax(a, *args, **kwargs):
    e = np.e ** (a - a.max())  # the row's softmax where the interpreter computes exp
    return e / e.sum()


@pytest.mark.parametrize("where", ["numpy.exp", "InterpreterBuilder.create_exp", "tl.tensor.__add__"])
def test_what_the_interpreter_computes_with_cannot_be_swapped(where, monkeypatch):
    """A legal kernel line (tl.exp(x), x + y) whose meaning host code swapped while it launches: NumPy's exp
    (the interpreter's tl.exp calls it), a builder method, a block's operator. Each launch compares them."""
    from triton.runtime import interpreter

    def softmax(x, out):
        with pytest.MonkeyPatch.context() as patch:
            if where == "numpy.exp":
                patch.setattr(np, "exp", _numpy_softmax)
            elif where == "InterpreterBuilder.create_exp":
                patch.setattr(interpreter.InterpreterBuilder, "create_exp", lambda self, a: interpreter.TensorHandle(
                    _numpy_softmax(a.data).astype(a.data.dtype), a.dtype.scalar))
            else:
                patch.setattr(tl.core.tensor, "__add__", lambda self, other: self)
            _launch(_exp_kernel)(x, out)

    with pytest.raises(CheckFailed, match=rf"replaced what the interpreter computes with \({re.escape(where)}"):
        check("05.softmax", softmax, seed=1, quiet=True)


@pytest.mark.parametrize("value", ["0", None])
def test_the_rule_holds_when_the_notebook_turns_triton_interpret_off(value, monkeypatch):
    """The kernels were built for the interpreter; TRITON_INTERPRET changed afterwards (to 0, or removed)
    while they launch must not make the checker take them for compiled ones: they still run as Python."""
    helper = _launch(_helper_kernel)

    def softmax(x, out):
        with pytest.MonkeyPatch.context() as patch:
            if value is None:
                patch.delenv("TRITON_INTERPRET")
            else:
                patch.setenv("TRITON_INTERPRET", value)
            helper(x, out)

    with pytest.raises(CheckFailed, match=r"uses `_softmax_on_the_host`, which is not Triton"):
        check("05.softmax", softmax, seed=1, quiet=True)


@triton.jit
def _identity(x):
    return x


@triton.jit
def _via_helper_kernel(x_ptr, out_ptr, n, sxm, sxn, som, son, BLOCK: tl.constexpr):
    x = _load_row(x_ptr, n, sxm, sxn, BLOCK)
    _store_row(out_ptr, _identity(x), n, som, son, BLOCK)


def test_a_name_rebound_by_the_grid_callable_is_judged_as_the_body_uses_it():
    """The kernel calls a @triton.jit helper when the launch is judged; its grid callable, which Triton calls
    later, inside the launch, rebinds the helper's global name to a host softmax. The names are judged
    again when the first program starts."""
    def softmax(x, out):
        def grid(meta):
            globals()["_identity"] = _softmax_on_the_host
            return (x.shape[0],)
        try:
            _via_helper_kernel[grid](x, out, x.shape[1], *x.stride(), *out.stride(),
                                     BLOCK=triton.next_power_of_2(x.shape[1]))
        finally:
            globals()["_identity"] = honest

    honest = _identity
    with pytest.raises(CheckFailed, match=r"uses `_identity`, which is not Triton"):
        check("05.softmax", softmax, seed=1, quiet=True)


def test_a_replaced_interpreter_class_is_not_remembered(monkeypatch):
    """test_mode replaces triton's InterpretedFunction for one test: a kernel-type lookup cached then kept
    the dummy class, and every interpreted kernel checked afterwards went unexamined (its host helpers
    passed). The lookup follows the class of the moment."""
    import triton.runtime.interpreter as interpreter

    with monkeypatch.context() as patched:
        patched.setattr(interpreter, "InterpretedFunction", type("InterpretedFunction", (), {}))
        assert kernel_source._jit_function(_helper_kernel) is None  # the dummy class: not a kernel now
    assert kernel_source._jit_function(_helper_kernel) is _helper_kernel
    with pytest.raises(CheckFailed, match=r"uses `_softmax_on_the_host`, which is not Triton"):
        check("05.softmax", _launch(_helper_kernel), seed=1, quiet=True)
