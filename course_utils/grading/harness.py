"""The checker behind `check(exercise_id, candidate)`.

Kernel exercises use destination passing: the candidate gets its inputs and the output buffers the
checker allocated, and must fill them. Each output is a view into the middle of a larger buffer
that starts out *poisoned* (NaN for floats, 0xFF bytes otherwise), so that:
- an element the kernel never wrote still holds poison  -> "never written";
- a write past either end lands in the guard region     -> "written out of bounds";
- inputs are compared bit for bit after the call        -> "your kernel modified an input".
In interpreter mode every load and store is also checked before it happens (see guard.py).
"""
from __future__ import annotations

import inspect
import random
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..mode import current
from .guard import OutOfBounds, watching

GUARD_ELEMENTS = 1 << 16  # guard region on each side of an output: larger than any block a kernel uses
SHOW = 5  # how many mismatching elements a failure message lists


class CheckFailed(AssertionError):
    """A candidate gave a wrong answer; the message says where and how."""


class CandidateError(CheckFailed):
    """The candidate itself raised: reported as the student's error, with their traceback."""


@dataclass(frozen=True)
class Out:
    """An output buffer the checker allocates and passes to the candidate."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Case:
    """One set of inputs. `args` holds tensors, scalars and `Out` placeholders in signature order."""

    label: str  # what makes this case interesting, e.g. "length 1823: not a multiple of any block"
    args: tuple
    expected: Any  # kernels: {out name: tensor (float64 for float outputs)}; functions: the value
    atol: float = 0.0
    rtol: float = 0.0
    # Extra verification: verify(result_or_outs, case) -> list of problems (empty when fine).
    verify: Callable[[Any, "Case"], list[str]] | None = None


@dataclass
class Exercise:
    id: str  # "02.vector_add"
    title: str
    signature: str  # "add(x, y, out)"
    cases: Callable[[torch.Generator], Iterable[Case]]
    hint: str = ""
    kernel: bool = True  # destination passing, must launch a Triton kernel, no torch arithmetic
    forbidden_ops: tuple[str, ...] = ()  # aten ops this exercise may not call (e.g. "transpose")
    allowed_ops: tuple[str, ...] = ()  # extra aten ops a kernel exercise may call on the host
    stub_message: str = ""  # filled in by the builder: what the unsolved stub raises

    @property
    def func_name(self) -> str:
        return self.signature.split("(", 1)[0]

    @property
    def params(self) -> list[str]:
        inside = self.signature.split("(", 1)[1].rsplit(")", 1)[0]
        return [p.strip().split(":")[0].split("=")[0].strip() for p in inside.split(",") if p.strip()]


REGISTRY: dict[str, Exercise] = {}


def register(ex: Exercise) -> Exercise:
    if ex.id in REGISTRY:
        raise ValueError(f"exercise {ex.id} registered twice")
    REGISTRY[ex.id] = ex
    return ex


# --- describing things ------------------------------------------------------------------------

def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        text = f"{tuple(value.shape)} {dtype}"
        if value.dim() and not value.is_contiguous():
            text += f" strides={value.stride()}"
        return text
    if isinstance(value, Out):
        return f"{value.shape} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value)


def describe_case(ex: Exercise, case: Case) -> str:
    parts = [f"{name}={describe(arg)}" for name, arg in zip(ex.params, case.args)]
    return f"{case.label} [{', '.join(parts)}]"


# --- buffers ----------------------------------------------------------------------------------

# Poison: a NaN with a payload no arithmetic produces, so "never written" is told apart from a
# computed NaN; all bits set for integers and fp8 (0xFF is NaN in float8_e4m3fn and float8_e5m2).
_POISON_BITS = {torch.float64: 0x7FF8A5A5A5A5A5A5, torch.float32: 0x7FC5A5A5, torch.float16: 0x7E5A,
                torch.bfloat16: 0x7FE5}
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_int(t: torch.Tensor) -> torch.Tensor:
    """The same memory seen as integers of the element's width."""
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.view(_INT_OF_SIZE[t.element_size()])


def _poison_value(dtype: torch.dtype) -> int:
    bits = _POISON_BITS.get(dtype)
    if bits is None:
        return 0xFF if torch.empty(0, dtype=dtype).element_size() == 1 else -1
    size = torch.empty(0, dtype=dtype).element_size()
    return bits - (1 << (8 * size)) if bits >= 1 << (8 * size - 1) else bits


def _allocate(out: Out, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    numel = 1
    for s in out.shape:
        numel *= s
    buf = torch.empty(numel + 2 * GUARD_ELEMENTS, dtype=out.dtype, device=device)
    _as_int(buf).fill_(_poison_value(out.dtype))
    view = buf[GUARD_ELEMENTS:GUARD_ELEMENTS + numel].view(out.shape)
    return buf, view


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor's elements (so NaN == NaN and -0.0 != 0.0)."""
    return t.detach().contiguous().view(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)


def _is_poison(t: torch.Tensor) -> torch.Tensor:
    return _as_int(t.contiguous()) == _poison_value(t.dtype)


def _index(flat_index: int, shape: tuple[int, ...]) -> str:
    idx = []
    for s in reversed(shape):
        idx.append(flat_index % s)
        flat_index //= s
    return "[" + ", ".join(str(i) for i in reversed(idx)) + "]"


def _fmt(x: float) -> str:
    return f"{x:.6g}"


# --- comparing --------------------------------------------------------------------------------

def compare(name: str, got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> list[str]:
    """Problems with one output: unwritten elements, mismatches beyond tolerance (empty when fine)."""
    problems = []
    got_cpu = got.detach().cpu()
    exp = expected.detach().cpu()
    if tuple(exp.shape) != tuple(got_cpu.shape):
        return [f"`{name}` has shape {tuple(got_cpu.shape)}, expected {tuple(exp.shape)}"]
    poison = _is_poison(got_cpu)
    if got_cpu.dtype.is_floating_point or exp.dtype.is_floating_point:
        g = got_cpu.to(torch.float64)
        e = exp.to(torch.float64)
        both_nan = torch.isnan(g) & torch.isnan(e)
        same_inf = torch.isinf(e) & (g == e)
        err = (g - e).abs()
        bad = ~(both_nan | same_inf | (err <= atol + rtol * e.abs()))
    else:
        g, e = got_cpu.to(torch.int64), exp.to(torch.int64)
        err = (g - e).abs().to(torch.float64)
        bad = g != e
    unwritten = poison & bad
    n_unwritten = int(unwritten.sum())
    if n_unwritten:
        first = unwritten.flatten().nonzero()[:SHOW, 0].tolist()
        problems.append(
            f"`{name}`: {n_unwritten} of {got_cpu.numel()} elements were never written "
            f"(still the poison value), first at {', '.join(_index(i, tuple(exp.shape)) for i in first)}"
        )
    wrong = bad & ~unwritten
    n_wrong = int(wrong.sum())
    if n_wrong:
        finite = err.masked_fill(~torch.isfinite(err), float("inf"))[wrong]
        worst_abs = float(finite.max())
        rel = (err / e.abs().clamp_min(1e-30))[wrong] if g.dtype == torch.float64 else err[wrong]
        worst_rel = float(rel.max())
        lines = [
            f"`{name}`: {n_wrong} of {got_cpu.numel()} elements differ beyond atol={atol:g}, rtol={rtol:g}; "
            f"worst abs error {_fmt(worst_abs)}, worst rel error {_fmt(worst_rel)}"
        ]
        for i in wrong.flatten().nonzero()[:SHOW, 0].tolist():
            lines.append(
                f"    at {_index(i, tuple(exp.shape))}: expected {_fmt(float(e.flatten()[i]))}, "
                f"got {_fmt(float(g.flatten()[i]))}"
            )
        problems.append("\n".join(lines))
    return problems


def _guard_problems(name: str, buf: torch.Tensor, numel: int) -> list[str]:
    problems = []
    pre = _is_poison(buf[:GUARD_ELEMENTS])
    post = _is_poison(buf[GUARD_ELEMENTS + numel:])
    if not bool(pre.all()):
        n = int((~pre).sum())
        first = GUARD_ELEMENTS - int((~pre).nonzero()[:, 0].min())
        problems.append(f"`{name}`: {n} element(s) written before its start (up to {first} elements before)")
    if not bool(post.all()):
        idx = (~post).nonzero()[:, 0]
        problems.append(
            f"`{name}`: {int(idx.numel())} element(s) written past its end "
            f"(first at flat index {numel + int(idx.min())}, the buffer has {numel} elements)"
        )
    return problems


# --- running a candidate ----------------------------------------------------------------------

def _student_traceback(exc: BaseException) -> str:
    """The traceback without the checker's own frames (the student's code and what it called)."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = __file__.rsplit(".", 1)[0]
    kept = [f for f in frames if not f.filename.startswith(here)]
    text = "".join(traceback.format_list(kept[-8:]))
    cause = exc
    while cause.__cause__ is not None and type(cause).__name__ == "InterpreterError":
        cause = cause.__cause__
    return text + "".join(traceback.format_exception_only(type(cause), cause))


def _run_kernel_case(ex: Exercise, candidate: Callable, case: Case, device: str) -> list[str]:
    buffers: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}
    call_args = []
    inputs = []
    for name, arg in zip(ex.params, case.args):
        if isinstance(arg, Out):
            buf, view = _allocate(arg, device)
            buffers[arg.name] = (buf, view, view.numel())
            call_args.append(view)
        else:
            if isinstance(arg, torch.Tensor):
                inputs.append((name, arg, _bits(arg).clone()))
            call_args.append(arg)

    with watching() as watch:
        try:
            result = candidate(*call_args)
        except OutOfBounds as exc:
            raise CheckFailed(str(exc)) from None
        except Exception as exc:
            root = exc
            while root.__cause__ is not None:
                root = root.__cause__
            if isinstance(root, OutOfBounds):
                raise CheckFailed(str(root)) from None
            raise CandidateError(f"your function raised an exception:\n{_student_traceback(exc)}") from None
    if device == "cuda":
        torch.cuda.synchronize()

    problems = []
    if result is not None and not isinstance(result, torch.Tensor | tuple):
        problems.append(f"returned {type(result).__name__}; a destination-passing function returns None")
    forbidden = [op for op in watch.compute_ops() if op not in ex.allowed_ops]
    if not watch.launches:
        problems.append("no Triton kernel was launched: the result must come from a @triton.jit kernel")
    if forbidden:
        problems.append(
            "computed with torch operations on the host (" + ", ".join(f"aten.{op}" for op in forbidden)
            + "): the arithmetic must happen inside your Triton kernel"
        )
    for name, tensor, bits in inputs:
        if not torch.equal(_bits(tensor), bits):
            problems.append(f"your function modified its input `{name}`")
    for name, (buf, view, numel) in buffers.items():
        problems += _guard_problems(name, buf, numel)
        problems += compare(name, view, case.expected[name], case.atol, case.rtol)
    if case.verify is not None and not problems:
        problems += case.verify({name: view for name, (_, view, _) in buffers.items()}, case)
    return problems


def _run_function_case(ex: Exercise, candidate: Callable, case: Case) -> list[str]:
    with watching() as watch:
        try:
            result = candidate(*case.args)
        except Exception as exc:
            raise CandidateError(f"your function raised an exception:\n{_student_traceback(exc)}") from None
    used = [op for op in ex.forbidden_ops if op in watch.torch_ops]
    if used:
        return [f"uses aten.{', aten.'.join(used)}, which this exercise asks you to do yourself"]
    if case.verify is not None:
        return case.verify(result, case)
    if result != case.expected:
        return [f"returned {result!r}, expected {case.expected!r}"]
    return []


def _check_signature(ex: Exercise, candidate: Callable) -> None:
    if not callable(candidate):
        raise CheckFailed(f"{ex.id}: expected a function {ex.signature}, got {type(candidate).__name__}")
    try:
        inspect.signature(candidate).bind(*ex.params)
    except TypeError:
        raise CheckFailed(
            f"{ex.id}: wrong signature: expected {ex.signature}, "
            f"your function is {getattr(candidate, '__name__', 'candidate')}{inspect.signature(candidate)}"
        ) from None
    except ValueError:  # builtins without a signature: let the call decide
        pass


def check(exercise_id: str, candidate: Callable, *, seed: int | None = None, quiet: bool = False) -> None:
    """Run every case of an exercise against `candidate`; print one line on success, raise on failure."""
    if exercise_id not in REGISTRY:
        from . import load_all

        load_all()
    if exercise_id not in REGISTRY:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"no exercise {exercise_id!r}; known: {known}")
    ex = REGISTRY[exercise_id]
    _check_signature(ex, candidate)
    seed = random.randrange(2**31) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    device = current().device
    cases = list(ex.cases(gen))
    reproduce = f'reproduce with check("{ex.id}", {ex.func_name}, seed={seed})'
    for i, case in enumerate(cases, 1):
        header = f"{ex.id} failed on case {i}/{len(cases)}: {describe_case(ex, case)}\n  seed {seed}: {reproduce}"
        try:
            problems = (_run_kernel_case(ex, candidate, case, device) if ex.kernel
                        else _run_function_case(ex, candidate, case))
        except CheckFailed as exc:
            err = type(exc)(f"{header}\n  {exc}")
            raise err from None
        if problems:
            body = "\n".join("  " + p for p in problems)
            hint = f"\n  hint: {ex.hint}" if ex.hint else ""
            raise CheckFailed(f"{header}\n{body}{hint}")
    if not quiet:
        print(f"{ex.id} passed: {len(cases)} cases ({ex.title}); seed {seed}")
