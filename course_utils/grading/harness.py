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

import contextlib
import dataclasses
import difflib
import gc
import inspect
import math
import os
import random
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..mode import current
from . import kernel_source
from .guard import HOST_OPS, TORCH_NAMES, CannotWatch, Refused, Tracker, note_made, watching
from . import verdicts
from .provenance import course_solution, course_solutions_allowed

GUARD_ELEMENTS = 1 << 16  # guard region on each side of an output: larger than any block a kernel uses
SHOW = 5  # how many mismatching elements a failure message lists
PAD = 5  # elements of padding after each row of an output laid out "padded"

# What kind of failure a problem is: the hint shown is chosen by the first problem's kind.
KINDS = ("unwritten", "out_of_bounds", "wrong", "nan", "host", "copy", "launches", "fusion", "input",
         "solution", "race")

# Hints for any exercise; an exercise's own hints (Exercise.hint) replace them kind by kind.
DEFAULT_HINTS = types.MappingProxyType({
    "unwritten": "part of the output was never written: does the grid cover every element "
                 "(triton.cdiv(n, BLOCK) programs), and does each store's mask keep every valid element?",
    "out_of_bounds": "mask every tl.load and tl.store (offsets < n: not <=, and not against the block "
                     "size), and build offsets from the tensor's own sizes and strides",
    "nan": "NaN comes from a masked load without other= read as garbage, 0/0, inf - inf or "
           "exp(-inf - (-inf)): give masked loads a neutral other= and guard divisions",
    "host": "the host function only allocates, computes the grid and launches; every arithmetic step "
            "belongs in the @triton.jit kernel",
    "copy": "a kernel reads its inputs where they lie: pass each tensor's strides to the kernel and address "
            "elements with them (no .contiguous() or .clone()), convert dtypes inside the kernel with .to(), "
            "and store into the output buffers themselves (no out.copy_())",
    "launches": "fuse the steps into one @triton.jit function: what one step produces stays in registers "
                "for the next",
    "input": "inputs are read-only: store only into the output buffer(s) the checker passed in",
    "race": "the programs of one launch run at the same time on a GPU: a program reads what it stored itself "
            "or what an earlier launch stored; what many programs add up meets through tl.atomic_add, or "
            "through partial results that a second kernel combines",
})


class Problem(str):
    """One problem found with a candidate's answer, and its kind (one of KINDS)."""

    kind: str = "wrong"

    def __new__(cls, text: str, kind: str = "wrong"):
        obj = super().__new__(cls, text)
        obj.kind = kind
        return obj


def kind_of(problem: str) -> str:
    return getattr(problem, "kind", "wrong")


class CheckFailed(AssertionError):
    """A candidate gave a wrong answer; the message says where and how.

    Raised by `check` with what a program needs to summarize it (batch grading, progress):
    `exercise` (id), `case` (its description), `seed`, `problems` (one text per problem found)
    and `reason`, the first problem in one line. In a notebook it shows as its message alone
    (`_render_traceback_`): no traceback through the checker.
    """

    def __init__(self, *args, exercise: str | None = None, case: str | None = None, seed: int | None = None,
                 problems: Iterable[str] = (), raised: str | None = None):
        super().__init__(*args)
        self.exercise = exercise
        self.case = case
        self.seed = seed
        self.problems = list(problems)
        self.raised = raised  # CandidateError: the exception line, e.g. "NotImplementedError: add: ..."

    @property
    def reason(self) -> str:
        """The first thing that went wrong, in one line (e.g. for a table of grades)."""
        if self.raised:
            return f"raised {self.raised}"
        for text in self.problems or [str(self)]:
            for line in text.splitlines():
                if line.strip():
                    return line.strip()
        return type(self).__name__

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this exception: the message, nothing of the checker's frames."""
        lines = str(self).splitlines() or [""]
        return [f"\x1b[1;31m{type(self).__name__}\x1b[0m: {lines[0]}", *lines[1:]]


class CandidateError(CheckFailed):
    """The candidate itself raised: reported as the student's error, with their traceback."""


@dataclass(frozen=True)
class Out:
    """An output buffer the checker allocates and passes to the candidate.

    layout: "contiguous"; "padded" (2-D, each row followed by PAD unused elements: row stride
    cols + PAD) or "transposed" (2-D, column-major: strides (1, rows)), for exercises whose outputs
    may have any strides.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str = "contiguous"
    # An in/out buffer (e.g. a KV cache the candidate appends to): it starts as a copy of `init`, with
    # init's strides, instead of poison; elements the candidate must leave alone keep init's values.
    init: torch.Tensor | None = field(default=None, compare=False)
    # Of an in/out buffer: the elements the candidate may store to (bool, out's shape); storing anywhere
    # else, even the value that was there, fails (checked in the interpreter, which sees every store).
    writable: torch.Tensor | None = field(default=None, compare=False)
    what: str = ""  # what the writable elements are, for the failure ("row positions[b] of each sequence")
    # The input parameter this output overwrites in place (08.cross_entropy: dlogits in the logits' own
    # memory). The candidate gets this buffer in both positions; it starts as a copy of `init`, that input.
    alias: str = ""


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
    # Kernel cases whose outputs are wrong: explain(outs, case) -> what the wrong values match (a known
    # mistake, e.g. "that is attention without the 1/sqrt(D) scale"), or "".
    explain: Callable[[dict, "Case"], str] | None = None
    # A case the candidate must refuse: it passes when the candidate raises this exception type.
    raises: type[Exception] | None = None


@dataclass(frozen=True)
class Speed:
    """How a check times a passing kernel on a GPU (never in the interpreter, never a failure)."""

    args: Callable[[], tuple]  # arguments of a realistic size, in signature order (Out for outputs)
    cost: Callable[[tuple], Any]  # the least FLOPs and bytes of one call (course_utils.roofline.Cost)
    solution: str  # the course's solution timed beside it: "course_utils.lessons.l02_first_kernels:add"
    label: str  # the size, as the line shows it: "n = 2^26, fp32"
    roof: str | None = None  # tensor-core work: its roof ("bf16", "tf32", "fp8"); None: CUDA cores


@dataclass(frozen=True)
class Fusion:
    """What "one kernel" / "fused" means for an exercise, checked on every case."""

    meaning: str  # said in the failure: what stays in registers
    temporary: Callable[["Case"], tuple[int, str] | None]  # (element count, what it is) of the intermediate
    kernels: int = 1  # most launches that touch the activations (a tensor with one row per output row)
    # True: a launch whose other tensors are the call's inputs or hold at most two values per row (a
    # statistics pre-pass: it reads the activations and cannot write them) is not counted.
    pre_pass: bool = False
    # Set: an allocation of AT LEAST the intermediate's element count is taken for it (a padded or longer
    # buffer holds it just as well), except allocations of the counts this returns: the temporaries the
    # fused answer itself makes (06.rmsnorm_mlp: h and the packed weights). None: only the exact count.
    own_temporaries: Callable[["Case"], tuple[int, ...]] | None = None
    # True: a tensor a launch gets that is none of the call's own counts as well when its storage holds the
    # intermediate in 16-bit floats or wider: a buffer made before the call (at import, kept from call to
    # call) is no allocation the call makes, and a kernel can store the intermediate there and read it back.
    # A storage of one of own_temporaries' counts (in 1-, 2- or 4-byte elements) is the answer's own.
    kept_buffers: bool = False
    # The parameters that hold the rows' data ("x", "out"): a launch that gets one of them (any view), or a
    # buffer an earlier such launch wrote, works on the activations. (): any tensor with one row per output
    # row does, which counts a weight that happens to have as many rows (hidden = rows) as well.
    activations: tuple[str, ...] = ()
    # Counts of own_temporaries that a launch on the activations writes (06.rmsnorm_mlp: h, rows x intermediate):
    # one allocation each of the intermediate's very count is the answer's own all the same (hidden =
    # intermediate). Without it, such an allocation is the answer's own only if the weights reached it first.
    written_temporaries: Callable[["Case"], tuple[int, ...]] | None = None
    # True: a buffer the call makes or keeps that the first launch to get it gets together with the call's
    # first activation (x), and that no later launch gets together with x, holds a split's partial results
    # (09.w4a16_gemv split over K: written from x, then summed without it), not the intermediate, whatever
    # its size: the intermediate (a dequantized W) is made from the weights alone, or read with x after.
    partials: bool = False


@dataclass(frozen=True, eq=False)
class Exercise:
    """An exercise, frozen: the code a check runs cannot change what it is checked against."""

    id: str  # "02.vector_add"
    title: str
    signature: str  # "add(x, y, out)"
    cases: Callable[[torch.Generator], Iterable[Case]]
    # Hints by kind of failure ({kind: text}, kinds in KINDS); a plain string is the hint for wrong,
    # unwritten and NaN outputs. Kinds an exercise leaves out get DEFAULT_HINTS.
    hint: str | Mapping[str, str] = ""
    kernel: bool = True  # destination passing, must launch a Triton kernel, no torch arithmetic
    forbidden_ops: tuple[str, ...] = ()  # aten ops this exercise may not call (e.g. "transpose")
    allowed_ops: tuple[str, ...] = ()  # extra aten ops a kernel exercise may call on the host
    stub_message: str = ""  # what the unsolved stub raises
    # Kernel exercises: the most kernel launches one call may make (1: "in one kernel"); None: any. A function
    # exercise of plain Python with 0 (07.decode_e4m3): no launch at all, since a kernel's own conversion
    # (.to(tl.float8e4nv, bitcast=True)) is the hardware's decoder answering for the student's.
    max_launches: int | None = None
    fusion: Fusion | None = None  # a fused exercise: launches on the activations, no intermediate in memory
    # dtypes the host code may not touch, and why (07.decode_e4m3: torch's own float8 decoder)
    forbidden_dtypes: tuple[torch.dtype, ...] = ()
    dtype_message: str = ""
    # Function exercises: functions ("module:name") the candidate may not call, under whatever name it
    # imported them (07.decode_e4m3: the course's own fp8 decoder; lesson 01: NumPy's stride tricks), and why.
    forbidden_calls: tuple[str, ...] = ()
    call_message: str = ""
    # A function exercise built on the student's kernels (08.rmsnorm_train): its call must launch one, of
    # the student's own (not the course's solution kernels of the same lesson).
    needs_kernels: bool = False
    # False: a function exercise whose arithmetic belongs in kernels: its host code may only allocate, view
    # and copy tensors, in the call and in the backward of what it returns (backward_problems).
    host_arithmetic: bool = True
    speed: Speed | None = None  # on a GPU a passing check reports its speed

    def __post_init__(self):
        hints = self.hint
        if isinstance(hints, str):
            hints = {"wrong": hints, "unwritten": hints, "nan": hints} if hints else {}
        unknown = set(hints) - set(KINDS)
        if unknown:
            raise ValueError(f"{self.id}: hints of unknown kinds {sorted(unknown)}; kinds are {KINDS}")
        object.__setattr__(self, "hint", types.MappingProxyType(dict(hints)))

    def hint_for(self, kind: str) -> str:
        if kind in self.hint:
            return self.hint[kind]
        return DEFAULT_HINTS.get(kind, "") if self.kernel else ""  # the defaults speak of kernels

    @property
    def func_name(self) -> str:
        return self.signature.split("(", 1)[0]

    @property
    def params(self) -> list[str]:
        inside = self.signature.split("(", 1)[1].rsplit(")", 1)[0]
        return [p.strip().split(":")[0].split("=")[0].strip() for p in inside.split(",") if p.strip()]


class _Registry(dict):
    """Exercise id -> Exercise. An id, once registered, cannot be replaced (only removed, by tests)."""

    def __setitem__(self, key, value):
        if key in self:
            raise ValueError(f"exercise {key} is registered already; exercises cannot be replaced")
        super().__setitem__(key, value)

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]


REGISTRY: dict[str, Exercise] = _Registry()


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
        layout = "" if value.layout == "contiguous" else f" {value.layout}"
        return f"{value.shape} {str(value.dtype).replace('torch.', '')}{layout}"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value)


def describe_case(ex: Exercise, case: Case) -> str:
    parts = [f"{name}={describe(arg)}" for name, arg in zip(ex.params, case.args)]
    return f"{case.label} [{', '.join(parts)}]"


# --- buffers ----------------------------------------------------------------------------------

# Poison: a NaN with a payload no arithmetic produces, so "never written" is told apart from a
# computed NaN; all bits set for integers and fp8 (0xFF is NaN in float8_e4m3fn and float8_e5m2).
_POISON_BITS = types.MappingProxyType({torch.float64: 0x7FF8A5A5A5A5A5A5, torch.float32: 0x7FC5A5A5,
                                       torch.float16: 0x7E5A, torch.bfloat16: 0x7FE5})
_INT_OF_SIZE = types.MappingProxyType({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64})


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


def strided_out(name: str, dtype: torch.dtype, stored: tuple[int, ...], order: tuple[int, ...]) -> Out:
    """An output stored as a tensor of shape `stored`, viewed with its dims permuted by `order` (stored (B, S,
    H, D), order (0, 2, 1, 3): a (B, H, S, D) view with strides (SHD, D, HD, 1)). Poisoned like any output:
    the buffer starts as a copy of `init`, with init's strides."""
    init = torch.empty(stored, dtype=dtype, device=current().device)
    _as_int(init).fill_(_poison_value(dtype))
    init = init.permute(order)
    return Out(name, tuple(init.shape), dtype, init=init)


def _allocate(out: Out, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A poisoned buffer with guard regions, and the output's view into its middle (in out.layout)."""
    numel = 1
    for s in out.shape:
        numel *= s
    if out.init is not None:
        strides = out.init.stride()
    elif out.layout == "padded":
        rows, cols = out.shape
        strides = (cols + PAD, 1)
    elif out.layout == "transposed":
        rows, cols = out.shape
        strides = (1, rows)
    elif out.layout == "contiguous":
        strides = tuple(int(np.prod(out.shape[i + 1:], dtype=np.int64)) for i in range(len(out.shape)))
    else:
        raise ValueError(f"unknown layout {out.layout!r} of output {out.name}")
    buf = torch.empty(_span(out.shape, strides) + 2 * GUARD_ELEMENTS, dtype=out.dtype, device=device)
    _as_int(buf).fill_(_poison_value(out.dtype))
    view = buf.as_strided(out.shape, strides, GUARD_ELEMENTS)
    if out.init is not None:
        view.copy_(out.init)
    return buf, view


def _span(shape, strides) -> int:
    """Elements from a view's first element to its last, inclusive (0 when it has none)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides))


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of t's whole storage (guard regions too), as a uint8 tensor over it: no copy."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


def _same_layout_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of t in a storage of its own, with t's sizes, strides and offset (and its storage's bytes)."""
    whole = _storage_bytes(t).clone().view(t.dtype)
    return whole.as_strided(t.shape, t.stride(), t.storage_offset())


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor's elements (so NaN == NaN and -0.0 != 0.0)."""
    if not t.numel():
        return t.new_empty(0, dtype=torch.uint8)
    flat = t.detach().contiguous().view(-1)
    if flat.stride(0) != 1:  # one element keeps its stride through .contiguous() (a column of a wider tensor)
        flat = torch.empty_like(flat, memory_format=torch.contiguous_format).copy_(flat)
    return flat.view(torch.uint8)


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
    # Where the output lies: a GPU compares a speed-sized output (2^26 elements) in milliseconds, where a copy
    # to the host and float64 there took seconds; only the few elements a message shows come back
    got_here = got.detach()
    exp = expected.detach().to(got_here.device)
    if tuple(exp.shape) != tuple(got_here.shape):
        return [f"`{name}` has shape {tuple(got_here.shape)}, expected {tuple(exp.shape)}"]
    poison = _is_poison(got_here)
    if got_here.dtype.is_floating_point or exp.dtype.is_floating_point:
        g = got_here.to(torch.float64)
        e = exp.to(torch.float64)
        both_nan = torch.isnan(g) & torch.isnan(e)
        same_inf = torch.isinf(e) & (g == e)
        err = (g - e).abs()
        bad = ~(both_nan | same_inf | (err <= atol + rtol * e.abs()))
    else:
        g, e = got_here.to(torch.int64), exp.to(torch.int64)
        err = (g - e).abs().to(torch.float64)
        bad = g != e
    unwritten = poison & bad
    n_unwritten = int(unwritten.sum())
    if n_unwritten:
        first = unwritten.flatten().nonzero()[:SHOW, 0].tolist()
        problems.append(Problem(
            f"`{name}`: {n_unwritten} of {got_here.numel()} elements were never written "
            f"(still the poison value), first at {', '.join(_index(i, tuple(exp.shape)) for i in first)}"
            + (" (or only added into without zeroing the output first: it arrives full of NaN, and NaN + x is "
               "NaN)" if got_here.dtype.is_floating_point else ""),
            "unwritten"))
    wrong = bad & ~unwritten
    n_wrong = int(wrong.sum())
    if n_wrong:
        err = err.masked_fill(~torch.isfinite(err), float("inf"))  # a NaN where a number belongs: inf
        worst_abs = float(err[wrong].max())
        rel = (err / e.abs().clamp_min(1e-30))[wrong] if g.dtype == torch.float64 else err[wrong]
        worst_rel = float(rel.max())
        n_nan = int((torch.isnan(g) & wrong).sum()) if g.dtype == torch.float64 else 0
        nan_text = (f" ({n_nan} of them NaN where a number was expected: computed from an undefined lane, or "
                    "added into without zeroing the output first, which arrives full of NaN)" if n_nan else "")
        lines = [
            f"`{name}`: {n_wrong} of {got_here.numel()} elements differ beyond atol={atol:g}, rtol={rtol:g}"
            f"{nan_text}; worst abs error {_fmt(worst_abs)}, worst rel error {_fmt(worst_rel)}"
        ]
        for i in wrong.flatten().nonzero()[:SHOW, 0].tolist():
            lines.append(
                f"    at {_index(i, tuple(exp.shape))}: expected {_fmt(float(e.flatten()[i]))}, "
                f"got {_fmt(float(g.flatten()[i]))}"
            )
        half = _rounded_to_half(got_here.dtype, g, e, wrong) if not n_nan else ""
        if half:
            lines.append(f"  every differing value of `{name}` is an {half} number, a rounding or two from the "
                         f"expected one: the result went through {half} (a .to(tl.{_TL_NAMES[half]}), a 16-bit "
                         f"accumulator or temporary); keep fp32 until the store into the "
                         f"{str(got_here.dtype)[6:]} output")
        problems.append(Problem("\n".join(lines), "nan" if n_nan else "wrong"))
    return problems


_TL_NAMES = types.MappingProxyType({"fp16": "float16", "bf16": "bfloat16"})

_UNIT_ROUNDOFF = types.MappingProxyType({torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8})


def one_rounding(name: str, got: torch.Tensor, want: torch.Tensor, moved: torch.Tensor, what: str,
                 mistake: str) -> list[str]:
    """Problems when a 16-bit output lies more than one rounding of its dtype from the exact `want`.

    For outputs computed in fp32 and rounded once, at the store. An element may differ from `want`
    (float64, exact) by its dtype's unit roundoff relative (the store), plus `moved` (float64, per
    element: how far the fp32 work before the store can move it, e.g. a sum's error carried through the
    epilogue), plus 2^-19 relative (fp32 maths such as a sigmoid), plus half the dtype's step below its
    normal range. A dot tolerance of several roundings leaves room for a value rounded to 16 bits on the
    way (2 to 4 roundings off); this does not. `mistake`: what went through 16 bits, for the message.
    """
    if got.dtype not in _UNIT_ROUNDOFF:
        return []
    eps = _UNIT_ROUNDOFF[got.dtype]
    floor = torch.finfo(got.dtype).smallest_normal * eps
    bound = eps * want.abs() + (1 + eps) * (moved + 2.0**-19 * want.abs()) + floor
    err = (got.to(want.device, torch.float64) - want).abs()
    over = err > bound
    if not bool(over.any()):
        return []
    roundings = err / (eps * want.abs()).clamp_min(floor)
    worst = int(torch.where(over, roundings, 0).flatten().argmax())
    dtype = str(got.dtype)[6:]
    return [Problem(
        f"`{name}`: {int(over.sum())} of {over.numel()} elements are more than one rounding of {dtype} from the "
        f"exact {what} (one rounding: {dtype}'s unit roundoff, 2^{round(math.log2(eps))} relative; the fp32 "
        f"work before the store adds about 1e-6 more); the worst at {_index(worst, tuple(want.shape))}: "
        f"expected {_fmt(float(want.flatten()[worst]))}, got {_fmt(float(got.flatten()[worst]))}, "
        f"{float(roundings.flatten()[worst]):.1f} roundings off. A kernel that keeps fp32 until the store rounds "
        f"once; this one went through {dtype} before it: {mistake}. Convert once, in the tl.store's "
        f".to(`{name}`'s dtype)")]


def _rounded_to_half(dtype: torch.dtype, g: torch.Tensor, e: torch.Tensor, wrong: torch.Tensor) -> str:
    """"fp16" or "bf16" when the wrong values of an fp32 output are all values of that 16-bit type, each
    within a few of its roundings (3 units of roundoff, relative) of the expected one: the result was
    rounded to 16 bits on the way; "" otherwise."""
    if dtype != torch.float32:
        return ""
    got, want = g[wrong], e[wrong]
    err, scale = (got - want).abs(), want.abs().clamp_min(2.0**-14)
    for half, torch_dtype, eps in (("fp16", torch.float16, 2.0**-11), ("bf16", torch.bfloat16, 2.0**-8)):
        exact = bool((got.to(torch_dtype).to(torch.float64) == got).all())
        if exact and bool((err <= 3 * eps * scale).all()):
            return half
    return ""


def _guard_problems(name: str, buf: torch.Tensor, view: torch.Tensor) -> list[str]:
    """Writes outside the output's elements: before it, past its end, or between its rows (padding)."""
    span = _span(view.shape, view.stride())
    if view.storage_offset() != GUARD_ELEMENTS or span + 2 * GUARD_ELEMENTS != buf.numel():
        # the tensor passed in no longer covers its place in the buffer: re-pointed (set_) or resized
        now = f"now {tuple(view.shape)} at offset {view.storage_offset()}"
        return [Problem(f"`{name}` is no longer the buffer the checker passed in: its storage was swapped or "
                        f"resized ({now}: set_, resize_ or as_strided_ on it?); write into `{name}` as given, "
                        "never re-point or resize it", "out_of_bounds")]
    problems = []
    pre = _is_poison(buf[:GUARD_ELEMENTS])
    post = _is_poison(buf[GUARD_ELEMENTS + span:])
    if not bool(pre.all()):
        n = int((~pre).sum())
        first = GUARD_ELEMENTS - int((~pre).nonzero()[:, 0].min())
        problems.append(Problem(f"`{name}`: {n} element(s) written before its start (up to {first} elements "
                                "before)", "out_of_bounds"))
    if not bool(post.all()):
        idx = (~post).nonzero()[:, 0]
        problems.append(Problem(
            f"`{name}`: {int(idx.numel())} element(s) written past its end "
            f"(first at flat index {view.numel() + int(idx.min())}, the buffer has {view.numel()} elements)",
            "out_of_bounds"))
    if span > view.numel():  # a strided output: the elements between its rows belong to no one
        covered = torch.zeros(span, dtype=torch.bool)
        covered[torch.arange(span).as_strided(view.shape, view.stride()).flatten()] = True
        gaps = _is_poison(buf[GUARD_ELEMENTS:GUARD_ELEMENTS + span].cpu())[~covered]
        if not bool(gaps.all()):
            problems.append(Problem(
                f"`{name}`: {int((~gaps).sum())} element(s) written between its rows, into memory that is "
                f"not part of it: `{name}` has strides {view.stride()}, not those of a contiguous tensor; "
                f"address it with {name}.stride(0) and {name}.stride(1)", "out_of_bounds"))
    return problems


# --- running a candidate ----------------------------------------------------------------------

_COURSE_INIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__init__.py")
# The checks' own code, which runs inside the candidate's calls too (05.online_softmax_stats's read log wraps
# every torch call on x): never the student's frames.
_CHECKS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checks") + os.sep


def _checker_frame(filename: str) -> bool:
    return filename == _COURSE_INIT or os.path.abspath(filename).startswith(_CHECKS_DIR)


def _root_exception(exc: BaseException) -> BaseException:
    cause = exc
    while cause.__cause__ is not None and type(cause).__name__ == "InterpreterError":
        cause = cause.__cause__
    return cause


def _student_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of the student's own code in an exception's traceback (and in the interpreter's
    wrapped cause): not the checker's, torch's, Triton's, NumPy's or the standard library's."""
    from .guard import _library_frame

    frames, seen = [], set()
    cause = exc
    for _ in range(4):
        for f in traceback.extract_tb(cause.__traceback__):
            key = (f.filename, f.lineno, f.name)
            if key not in seen and not _library_frame(f.filename) and not _checker_frame(f.filename):
                seen.add(key)
                frames.append(f)
        if cause.__cause__ is None:
            break
        cause = cause.__cause__
    return frames


def _student_traceback(exc: BaseException) -> str:
    """The traceback of the student's frames only, then the exception itself."""
    text = "".join(traceback.format_list(_student_frames(exc)[-8:]))
    cause = _root_exception(exc)
    return text + "".join(traceback.format_exception_only(type(cause), cause))


def _exception_line(exc: BaseException) -> str:
    """"NotImplementedError: add: not written yet": the last line of the traceback, shortened."""
    cause = _root_exception(exc)
    lines = "".join(traceback.format_exception_only(type(cause), cause)).strip().splitlines()
    return lines[-1].strip() if lines else type(cause).__name__


def _safe_str(exc: BaseException) -> str:
    """str(exc), or what it is when its __str__ raises (the candidate's exception class is its own code)."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} whose message could not be shown: its __str__ raised>"


def _chain_text(exc: BaseException) -> str:
    parts, cause = [], exc
    for _ in range(6):
        if cause is None:
            break
        parts.append(_safe_str(cause))
        cause = cause.__cause__ or cause.__context__
    return "\n".join(parts)


# Exceptions whose cause is a common mistake: (text in the exception's chain, what failed, what to do).
_KNOWN_MISTAKES = (
    ("arange's range must be a power of 2", "failed to build",
     "tl.arange(0, N) needs N to be a power of 2 (1000 is not, 1024 is): round the block up with "
     "BLOCK_N = triton.next_power_of_2(n_cols) and mask the columns >= n_cols"),
    ("exceeds triton maximum tensor numel", "asked for a block of more than 2^20 elements",
     "Triton's largest block (tl.arange, tl.zeros) holds 2^20 elements (triton.language."
     "TRITON_MAX_TENSOR_NUMEL), so a block of triton.next_power_of_2(n) fails for n past 2^20: loop over the "
     "data in blocks of a fixed size (4096, say), as the lesson's online loop does"),
    ("Block pointers have been removed", "uses a block pointer",
     "the Triton this check runs on has removed tl.make_block_ptr and tl.advance in favour of tensor "
     "descriptors: compute the pointers with tl.arange and masks, as the lessons do, or use "
     "tl.make_tensor_descriptor"),
    # Triton's autotuner times its configs through the GPU driver, which the interpreter does not have.
    ("active drivers", "could not be launched",
     "in interpreter mode (no GPU) Triton has no driver to time kernels with, so @triton.autotune with more "
     "than one config fails; give it a single config when course_utils.current().interpret is True (lesson "
     "03's matmul_configs does)"),
    # In triton 3.9's interpreter every function of triton.language.extra.libdevice returns None, and the
    # error names the line that first uses the value (a tl.store), not the call.
    ("cannot convert None of type <class 'NoneType'> to tensor", "used a value that is None",
     "Triton's interpreter (no GPU) does not run libdevice: its functions (libdevice.sin, libdevice.exp, ...) "
     "return None there; use tl.sin, tl.exp, tl.sqrt or tl.math's instead, which run in both modes. Or a "
     "@triton.jit helper of yours returns nothing (a missing return)"),
    # In the interpreter a loop over range / tl.range yields Python ints, which have no Triton methods.
    ("'int' object has no attribute", "called a Triton method on a Python int",
     "in Triton's interpreter (no GPU) the variable of a `for ... in range(...)` or tl.range loop is a Python "
     "int, not a Triton scalar, so i.to(tl.int64) fails there (it compiles on a GPU): write "
     "tl.cast(i, tl.int64), which works in both modes"),
    # ... and a float argument of the kernel is a Python float (Liger-Kernel's eps.to(tl.float32))
    ("'float' object has no attribute", "called a Triton method on a Python float",
     "in Triton's interpreter (no GPU) a float argument of the kernel (eps, a scale) is a Python float, not a "
     "Triton scalar, so eps.to(tl.float32) fails there (it compiles on a GPU): write tl.cast(eps, tl.float32), "
     "which works in both modes, or leave the cast out (Triton promotes a float argument by itself)"),
    # triton 3.9's interpreter refuses a mask that combines a block with a scalar condition
    ("mask has unsupported dtype", "used a mask the interpreter cannot take",
     "Triton's interpreter (no GPU) refuses a mask made of a block and a scalar condition, such as "
     "(offs < n) & (tl.program_id(0) == 0); it compiles on a GPU. Test the scalar with an `if` around the "
     "load or store, or broadcast it first: (offs < n) & (tl.zeros_like(offs) + flag != 0)"),
)


def _known_mistake(exc: BaseException) -> tuple[str, str] | None:
    """(what failed, what to do) for an exception whose cause is a common mistake, or None."""
    text = _chain_text(exc)
    for marker, what, advice in _KNOWN_MISTAKES:
        if marker in text:
            return what, advice
    return None


def _candidate_error(exc: BaseException) -> CandidateError:
    """The failure for an exception the candidate raised: its frames only, and advice for a known mistake.
    Whatever the exception does when looked at (a __str__ that raises), this returns a failure."""
    try:
        if isinstance(exc, SystemExit):
            return CandidateError(f"your function called sys.exit({_safe_str(exc)}) (raised SystemExit): a "
                                  "check calls it like any function; return, or raise an exception, instead\n"
                                  f"{_student_traceback(exc)}", raised=_exception_line(exc))
        return _candidate_error_of(exc)
    except Exception:
        name = type(exc).__name__
        return CandidateError(f"your function raised {name}, whose traceback could not be shown", raised=name)


def wrong_refusal(expected: type[Exception], exc: BaseException) -> CandidateError:
    """The failure for a case the candidate must refuse with `expected` that raised another exception."""
    said = (f"these inputs must be refused with {expected.__name__}; your function raised {type(exc).__name__} "
            "instead")
    return CandidateError(f"{said}\n{_candidate_error(exc)}", problems=[Problem(said, "wrong")])


def _candidate_error_of(exc: BaseException) -> CandidateError:
    known = _known_mistake(exc)
    if known is not None:
        frames = _student_frames(exc)
        where = ""
        if frames:
            f = frames[-1]
            where = f" at `{(f.line or '').strip()}` ({f.name}, line {f.lineno})" if f.line else f" ({f.name})"
        what, advice = known
        return CandidateError(f"your kernel {what}{where}: {advice}", raised=_exception_line(exc))
    return CandidateError(f"your function raised an exception:\n{_student_traceback(exc)}",
                          raised=_exception_line(exc))


@contextlib.contextmanager
def _quiet_numerics():
    """The interpreter runs kernels with NumPy: -inf - -inf in masked lanes warns, harmlessly."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


GC_ROUNDS = 8  # garbage collections after a call, each finding more garbage, before it counts as running code

# Host ops that only copy data (Tensor.contiguous and .clone, .to / .float, out.copy_, torch.cat / stack):
# arithmetic-free, so a failure names them as a copy, with a hint about strides rather than about computing.
COPY_OPS = frozenset({"clone", "copy_", "_to_copy", "cat", "stack"})


def _host_problems(ex: Exercise, watch) -> list[str]:
    """How a kernel exercise computed: no launch, torch outside the kernel, NumPy on the host."""
    problems = []
    if watch.references:
        names = ", ".join(f"`{name}`" for name in watch.references)
        problems.append(Problem(f"your function calls the reference {names}: it computes the answer with "
                                "PyTorch; write the computation in your Triton kernel instead", "host"))
    forbidden = [op for op in watch.compute_ops() if op not in ex.allowed_ops]
    if not watch.launches:
        problems.append(Problem("no Triton kernel was launched: the result must come from a @triton.jit "
                                "kernel", "host"))
    if forbidden and set(forbidden) <= COPY_OPS:  # only copies, e.g. x.contiguous() on a strided x
        problems.append(Problem(
            "copied tensor data outside your Triton kernel (" + watch.describe_ops(forbidden) + "): every "
            "element moves once more than it needs to; your kernel must do the reading and writing", "copy"))
    elif forbidden:
        custom = (" The checker cannot see inside a custom op (torch.library.custom_op or triton_op): launch "
                  "your kernel from your function itself (kernel[grid](...), or wrap_triton(kernel)[grid](...))."
                  if any("::" in op for op in forbidden) else "")
        problems.append(Problem(
            "computed with torch operations outside your Triton kernel (" + watch.describe_ops(forbidden)
            + "): the arithmetic must happen inside your Triton kernel." + custom, "host"))
    if watch.threads:
        problems.append(_thread_problem(watch.threads))
    if watch.not_triton:
        problems.append(Problem(
            "your kernel " + "; ".join(watch.not_triton[:3]) + ": a @triton.jit body may call only Triton "
            "(tl.*, other @triton.jit functions); the interpreter runs anything as Python, but on a GPU this "
            "does not compile, and what it computes does not happen in the kernel", "host"))
    return problems + _host_data_problems(watch)


def _subclass_problems(watch, where: str = "") -> list[str]:
    """A tensor subclass or a dispatch mode of the notebook's own: Python beneath the recorder; torch ops
    that went past it (guard.OpLedger); data that went past everything (guard.Watch.side_doors: the memory
    file, an exception out of a kernel caught); a launch the checker refused whose exception the code caught."""
    problems = []
    if watch.subclasses:
        problems.append(Problem(
            f"{where}ran Python of its own inside torch's ops ({', '.join(watch.subclasses[:3])}): a tensor "
            "subclass or a TorchDispatchMode computes where the checker cannot see; use plain tensors", "host"))
    if watch.unseen_ops:
        problems.append(Problem(
            f"{where}ran torch ops with torch's dispatch modes turned off or bypassed "
            f"({', '.join(watch.unseen_ops[:4])}): the checker watches your torch ops through them, and what "
            "runs past them is computation it cannot judge; call torch the ordinary way", "host"))
    if watch.ledger_problem:
        problems.append(Problem(where + watch.ledger_problem, "host"))
    for text in getattr(watch, "side_doors", [])[:1]:
        problems.append(Problem(where + text, "host"))
    for text, kind in getattr(watch, "refused", [])[:1]:
        problems.append(Problem(f"{where}{text} (your code caught the exception and went on: a launch the "
                                "checker stopped fails the check all the same)", kind))
    return problems


def _host_data_problems(watch, where: str = "") -> list[str]:
    """Tensor data handed to Python or NumPy on the host, and values written into tensors part by part
    from the host: the way around a kernel whose arithmetic happens in Python. `where`: "the backward "."""
    problems = _subclass_problems(watch, where)
    if watch.host_fills:
        problems.append(Problem(
            f"{where}wrote values into tensors from the host, part by part ({watch.host_fills} x Tensor.fill_ "
            "of part of a tensor with a value other than 0): the results must come from your kernel's stores "
            "(setting a whole tensor to a constant is fine)", "host"))
    reads = sorted(set(watch.host_reads))
    if reads:
        problems.append(Problem(
            f"{where}read tensor data into Python/NumPy on the host ("
            + ", ".join(f"Tensor.{r}" for r in reads) + "): let your Triton kernel read the tensor (tl.load) "
            "and do the arithmetic; a read on the host also waits for the GPU and breaks CUDA-graph capture",
            "host"))
    return problems


def _thread_problem(sites: list[str]) -> Problem:
    return Problem(f"started a thread (at {sites[0]}): the checker watches the thread that calls your "
                   "function; what another thread computes is host code it cannot see. Do the work in the "
                   "call itself", "host")


def _rows(case: Case) -> int | None:
    """The row count of a case's first output (its activations have one row per output row)."""
    for arg in case.args:
        if isinstance(arg, Out) and len(arg.shape) >= 2:
            return arg.shape[0]
    return None


def _input_flags(launch) -> tuple[bool, ...]:
    """Per tensor argument of a launch: is it an input of the call (False for all when unknown)."""
    if len(launch.inputs) == len(launch.shapes):
        return launch.inputs
    return (False,) * len(launch.shapes)


STATISTICS_BYTES = 16  # what a statistics pre-pass may keep per row: two 8-byte values (mean, rstd)


def _per_argument(values: tuple, launch, empty) -> tuple:
    """One of a launch's per-argument records, or `empty` for each argument when it was not recorded (the
    launch facts a batch grader's sandbox sends carry no storage_bytes: remote.facts_out)."""
    return values if len(values) == len(launch.shapes) else (empty,) * len(launch.shapes)


def _statistics_pass(launch, rows: int, kept: dict[int, int], written: set) -> bool:
    """Does a launch only read the call's inputs and write at most two values per row (statistics)?

    Judged by whole storages, which is what a kernel reaches: a 1-element view of a (rows, hidden) buffer
    still lets it store rows x hidden values. Each tensor it gets is an input, or a temporary that no
    launch on the rows wrote; none is the call's output; and the temporaries of all the call's pre-passes
    together (`kept`: storage -> bytes, updated when the launch is one) hold at most STATISTICS_BYTES a
    row (rows = 4096: 64 KiB). Without recorded storage sizes, each view holds at most 2 * rows elements."""
    sizes = _per_argument(launch.storage_bytes, launch, None)
    mine = {}
    for shape, is_input, base, storage, nbytes in zip(launch.shapes, _input_flags(launch),
                                                      _per_argument(launch.bases, launch, ()),
                                                      _per_argument(launch.storages, launch, None), sizes):
        if is_input:
            continue
        if base and math.prod(base) > 2 * rows:  # the call's output, one row per output row
            return False
        if storage in written:
            return False
        if nbytes is None:
            if math.prod(shape) > 2 * rows:
                return False
            continue
        mine[storage] = nbytes
    if sum({**kept, **mine}.values()) > STATISTICS_BYTES * rows:
        return False
    kept.update(mine)
    return True


def _on_the_rows(fusion: Fusion, launched, rows: int | None) -> list[bool]:
    """Per launch: does it work on the activations? It gets the call's activations (fusion.activations:
    x or out, any view of them; without them, any tensor with one row per output row), or a buffer that an
    earlier such launch wrote (by its storage: a temporary stored transposed, padded or flat is still the
    rows' data). A statistics pre-pass (fusion.pre_pass) is not and taints nothing: it holds at most two
    values per row."""
    flags, written, kept = [], set(), {}
    for launch in launched:
        named = fusion.activations and len(launch.params) == len(launch.shapes)
        if named:
            on_rows = any(param in fusion.activations for param in launch.params)
        else:
            on_rows = any(len(shape) >= 2 and shape[0] == rows for shape in (*launch.shapes, *launch.bases))
        tainted = any(storage in written for storage in launch.storages)
        if named and not on_rows and not tainted:
            flags.append(False)  # the weights alone (packing them): no pre-pass, whose bytes count per row
            continue
        if fusion.pre_pass and _statistics_pass(launch, rows, kept, written):
            flags.append(False)
            continue
        on_rows = on_rows or tainted
        flags.append(on_rows)
        if on_rows:
            written |= {storage for storage, is_input in zip(launch.storages, _input_flags(launch)) if not is_input}
    return flags


def _launches_on_the_rows(fusion: Fusion, launched, rows: int | None) -> list[str]:
    """The names of the launches that work on the activations (_on_the_rows)."""
    return [launch.name for launch, on_rows in zip(launched, _on_the_rows(fusion, launched, rows)) if on_rows]


def _own_of_the_same_count(fusion: Fusion, case: Case, numel: int, own: tuple[int, ...], allocations, launched,
                           on_rows: list[bool]) -> set[int]:
    """The allocations (their indices) of exactly the intermediate's count that are the answer's own all the
    same, where a temporary of its own has that count too (rows = intermediate: w_down.T packed to
    (intermediate, hidden) has rows x hidden elements, as many as the normalized activations): a weight
    packed in the call, which a launch on no activations reached first (a copy or scaling of the weights),
    and as many as fusion.written_temporaries names of that count, reached by the activations first (h).
    Told only where the fusion names its activations and the allocations' storages were recorded.
    numel: the intermediate's count; own: the counts of the answer's own temporaries; on_rows: _on_the_rows."""
    if not fusion.activations or numel not in own:
        return set()
    written = list(fusion.written_temporaries(case)) if fusion.written_temporaries is not None else []
    forgiven = set()
    for i, alloc in enumerate(allocations):
        first = next((flag for launch, flag in zip(launched, on_rows) if alloc.storage in launch.storages), None)
        if alloc.numel != numel or not alloc.storage or first is None:
            continue
        if not first:
            forgiven.add(i)
        elif numel in written:
            written.remove(numel)
            forgiven.add(i)
    return forgiven


def _partial_results(fusion: Fusion, launched) -> set[int]:
    """The storages (addresses) that hold a split's partial results (Fusion.partials): the first launch
    that gets one gets x too, and no later launch gets it together with x."""
    if not fusion.partials or not fusion.activations:
        return set()
    x = fusion.activations[0]
    first: dict[int, bool] = {}  # storage -> still a partial result
    for launch in launched:
        params = _per_argument(launch.params, launch, "")
        with_x = x in params
        for storage, param in zip(launch.storages, params):
            if param:
                continue  # the call's own arguments
            first[storage] = with_x if storage not in first else first[storage] and not with_x
    return {storage for storage, partial in first.items() if partial}


def _strides_first(key: str, text: str, buffers: dict) -> str:
    """A race over an output whose columns are not adjacent (a transposed or padded view) is most often a
    kernel that ignored its strides, not one whose programs share work: say that first."""
    name = key.removeprefix("race:")
    if key == name or name not in buffers:
        return text
    view = buffers[name][1]
    if view.dim() < 2 or view.stride(-1) == 1:
        return text
    return (f"this case's `{name}` has strides {tuple(view.stride())}: a kernel that addresses it as if its "
            f"last dimension were adjacent in memory (its own stride ignored) stores over other programs' "
            f"elements, as found here; address `{name}` with all of its strides. Otherwise: " + text)


def _launch_problems(ex: Exercise, case: Case, launched, allocations) -> list[str]:
    """Too many launches, or (fused exercises) an intermediate written to memory."""
    problems = []
    names = [launch.name for launch in launched]
    limit, counted, what = ex.max_launches, names, "kernels"
    on_rows = _on_the_rows(ex.fusion, launched, _rows(case)) if ex.fusion is not None else []
    if ex.fusion is not None and ex.max_launches is None:  # else every launch counts, as max_launches says
        limit = ex.fusion.kernels
        counted = [launch.name for launch, flag in zip(launched, on_rows) if flag]
        what = "kernels on the activations"
    if limit is not None and len(counted) > limit:
        shown = ", ".join(counted[:6]) + (", ..." if len(counted) > 6 else "")
        want = "one kernel" if limit == 1 else f"at most {limit} such launches"
        text = f"launched {len(counted)} {what} ({shown}); this exercise asks for {want}"
        text += f": {ex.fusion.meaning}" if ex.fusion is not None else ": fuse the steps into one @triton.jit function"
        problems.append(Problem(text, "launches"))
    temporary = ex.fusion.temporary(case) if ex.fusion is not None else None
    if temporary is not None:
        numel, description = temporary
        own = ex.fusion.own_temporaries
        allowed = own(case) if own is not None else ()
        forgiven = _own_of_the_same_count(ex.fusion, case, numel, allowed, allocations, launched, on_rows)
        partials = _partial_results(ex.fusion, launched)
        made = {alloc.storage for alloc in allocations if alloc.storage}
        for i, alloc in enumerate(allocations):
            if i in forgiven or (alloc.storage and alloc.storage in partials):
                continue
            if alloc.numel == numel or (own is not None and alloc.numel > numel and alloc.numel not in allowed):
                at = f" at {alloc.site}" if alloc.site else ""
                size = "the size of" if alloc.numel == numel else f"{alloc.numel} elements, room for"
                problems.append(Problem(
                    f"allocated a {alloc.shape} {str(alloc.dtype).replace('torch.', '')} temporary{at}: {size} "
                    f"{description}. Fused means that intermediate never goes to memory: "
                    f"{ex.fusion.meaning}", "fusion"))
                break
        # The intermediate split over several buffers (four quarters) is in memory all the same: their sum counts
        pieces = ([alloc for alloc in allocations if alloc.numel not in allowed
                   and not (alloc.storage and alloc.storage in partials)] if own is not None else [])
        if len(pieces) > 1 and sum(a.numel for a in pieces) >= numel and not _fused_problem(problems):
            shapes = ", ".join(str(a.shape) for a in pieces[:4]) + (", ..." if len(pieces) > 4 else "")
            problems.append(Problem(
                f"allocated {len(pieces)} temporaries ({shapes}) of {sum(a.numel for a in pieces)} elements in "
                f"all: together room for {description}. Fused means that intermediate never goes to memory, "
                f"in one buffer or in pieces: {ex.fusion.meaning}", "fusion"))
        kept: dict[int, tuple[str, tuple, int]] = {}  # storage address -> (kernel, shape, bytes): each storage once
        for launch in launched if ex.fusion.kept_buffers else ():
            for shape, base, address, nbytes in zip(launch.shapes, launch.bases, launch.storages,
                                                    launch.storage_bytes):
                # the fused answer's own temporaries may be kept from call to call too (weights packed once)
                if (not base and address not in partials
                        and not any(nbytes == count * size for count in allowed for size in (1, 2, 4))):
                    kept.setdefault(address, (launch.name, shape, nbytes))
        if sum(nbytes for *_, nbytes in kept.values()) >= 2 * numel and not _fused_problem(problems):
            name, shape, nbytes = max(kept.values(), key=lambda k: k[2])
            more = f" (and {len(kept) - 1} more such tensors)" if len(kept) > 1 else ""
            before = [address for address in kept if address not in made]
            whose = "that is none of the call's own" if before else "that the call allocated"
            why = ("a buffer made before the call and kept from call to call is still memory" if before else
                   "in wider elements than its own, the intermediate is in memory all the same")
            problems.append(Problem(
                f"launched {name} with a {shape} tensor {whose}{more}: storages of "
                f"{sum(k[2] for k in kept.values())} bytes in all have room for {description} in 16-bit floats "
                f"({why}). Fused means that intermediate never goes to memory: {ex.fusion.meaning}", "fusion"))
    return problems


def _fused_problem(problems: list) -> bool:
    return any(p.kind == "fusion" for p in problems)


@dataclass
class Prepared:
    """A kernel case ready to call: the arguments (outputs are poisoned views into guarded buffers)."""

    call_args: list
    buffers: dict[str, tuple[torch.Tensor, torch.Tensor, int]]  # out name -> (buffer, view, numel)
    # (name, the copy the candidate gets, the bytes of the case's own tensor): the case stays untouched
    inputs: list[tuple[str, torch.Tensor, torch.Tensor]]


@dataclass
class CallFacts:
    """What happened while the candidate ran, besides the bytes it left in memory.

    Recorded where the candidate runs (in a batch grader: inside the submission's sandbox, so these
    can only take credit away: the verdict on the outputs is computed from the bytes alone).
    """

    returned: str | None = None  # type name of a return value that is neither None nor a tensor
    returned_other: bool = False  # returned a tensor that is none of the output buffers
    host: list[str] = field(default_factory=list)  # _host_problems: launches, torch or NumPy on the host
    changed_later: list[str] = field(default_factory=list)  # outputs changed by host code after the last launch
    launched: list = field(default_factory=list)  # guard.Launch of each kernel launch (name, module, shapes)
    allocations: list = field(default_factory=list)  # guard.Allocation of each tensor the host code made
    # {output name: the bytes of its whole buffer as the last look after the call found them}: what is judged
    # (as_last_seen), not the live buffer, which code of the notebook's may still write into (a thread)
    final: dict = field(default_factory=dict)


def prepare_kernel_case(ex: Exercise, case: Case, device: str) -> Prepared:
    """Allocate the poisoned outputs and copy the inputs (the checker's side, before the call)."""
    prepared = Prepared([], {}, [])
    for name, arg in zip(ex.params, case.args):
        if isinstance(arg, Out):
            buf, view = _allocate(arg, device)
            prepared.buffers[arg.name] = (buf, view, view.numel())
            prepared.call_args.append(view)
        elif isinstance(arg, torch.Tensor):
            copy = _same_layout_copy(arg)
            prepared.inputs.append((name, copy, _bits(arg).clone()))
            prepared.call_args.append(copy)
        else:
            prepared.call_args.append(arg)
    for arg in case.args:
        if isinstance(arg, Out) and arg.alias:  # one tensor in both positions: the input is this output now
            prepared.call_args[ex.params.index(arg.alias)] = prepared.buffers[arg.name][1]
            prepared.inputs = [entry for entry in prepared.inputs if entry[0] != arg.alias]
    return prepared


@contextlib.contextmanager
def _collections_see_only_new_objects():
    """Inside, gc.collect() looks only at objects made inside: everything older is frozen (gc.freeze), so
    that a collection costs what the call allocated, not the ~200k objects torch and Triton hold (80 ms)."""
    if gc.get_freeze_count():  # the process froze objects of its own: leave them be, collect slowly
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def call_kernel_candidate(ex: Exercise, candidate: Callable, call_args: list,
                          buffers: dict[str, tuple[torch.Tensor, torch.Tensor, int]], device: str,
                          writable: dict[str, tuple[torch.Tensor, str]] | None = None) -> CallFacts:
    """Call the candidate once, watching it (the candidate's side). Raises CheckFailed when it raised,
    went out of bounds or crashed the GPU; the outputs are left in `buffers` for `judge_kernel_case`.
    writable: {output name: (bool mask of the elements it may store to, what they are)} (Out.writable)."""
    with _collections_see_only_new_objects():
        return _call_kernel_candidate(ex, candidate, call_args, buffers, device, writable or {})


def _stores_outside(tracker: Tracker, buffers, writable) -> list[Problem]:
    """Stores the interpreter saw into elements of an in/out buffer that the call must leave alone."""
    problems = []
    for name, (mask, what) in writable.items():
        if name not in buffers:
            continue
        stored = tracker.stored(buffers[name][1])
        if stored is None or tuple(mask.shape) != tuple(stored.shape):
            continue
        outside = stored & ~mask.to(torch.bool).cpu()
        if bool(outside.any()):
            first = tuple(int(i) for i in outside.nonzero()[0])
            problems.append(Problem(
                f"your kernel stored into {int(outside.sum())} element(s) of `{name}` it must leave alone "
                f"(the first at index {first}): store only {what or 'the elements this call changes'}. "
                "Rewriting the others, even with the values they held, moves bytes for nothing and can "
                "overwrite what another writer put there", "wrong"))
    return problems


def _stores_into_inputs(tracker: Tracker, inputs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> list[Problem]:
    """Stores the interpreter saw into an input that holds what it held before the call ({name: (the tensor, its
    bits before)}; an input left changed is the judge's "modified its input"): inputs are read only, even when
    the kernel puts back what they held before it returns (x's memory as a scratch for an intermediate, say,
    which no rule on what the call allocates sees)."""
    problems = []
    for name, (arg, before) in inputs.items():
        stored = tracker.stored(arg)
        if stored is not None and bool(stored.any()) and torch.equal(_bits(arg), before):
            problems.append(Problem(
                f"your kernel stored into `{name}`, an input ({int(stored.sum())} element(s)): inputs are read "
                "only, even if the kernel puts back what they held before it returns; keep what you compute in "
                "registers, and store only into the outputs", "wrong"))
    return problems


def _call_kernel_candidate(ex: Exercise, candidate: Callable, call_args: list,
                           buffers: dict[str, tuple[torch.Tensor, torch.Tensor, int]],
                           device: str, writable: dict) -> CallFacts:
    # The outputs' bytes as the last kernel launch left them, and how many torch ops had run by then:
    # output that changes afterwards without a torch op that writes was written by NumPy or the like.
    after_launch: dict[str, torch.Tensor] = {}
    ops_at_last_launch = [0]

    def snapshot():
        for out_name, (_, view, _) in buffers.items():
            after_launch[out_name] = _bits(view).clone()
        ops_at_last_launch[0] = len(watch.torch_ops)

    # In the interpreter: where every byte a kernel reads came from, and who wrote the outputs (Tracker).
    tracker = Tracker() if device == "cpu" else None
    read_only: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # inputs (no output's view), their bits before
    if tracker is not None:
        for name, arg in zip(ex.params, call_args):
            if isinstance(arg, torch.Tensor):
                tracker.add(arg, name)
        output_storages = {view.untyped_storage().data_ptr() for _, view, _ in buffers.values()}
        read_only = {name: (arg, _bits(arg).clone()) for name, arg in zip(ex.params, call_args)
                     if isinstance(arg, torch.Tensor) and name not in buffers
                     and arg.untyped_storage().data_ptr() not in output_storages}
    inputs = [arg for name, arg in zip(ex.params, call_args) if isinstance(arg, torch.Tensor) and name not in buffers]
    outputs = [view for _, view, _ in buffers.values()]
    names = {name: arg for name, arg in zip(ex.params, call_args) if isinstance(arg, torch.Tensor)}
    with _quiet_numerics(), watching(after_launch=snapshot, tracker=tracker, inputs=inputs,
                                     outputs=outputs, names=names) as watch:
        try:
            result = candidate(*call_args)
        except Refused as exc:
            raise CheckFailed(str(exc), problems=[Problem(str(exc), exc.kind)]) from None
        except Exception as exc:
            root = exc
            while root.__cause__ is not None:
                root = root.__cause__
            if isinstance(root, Refused):
                raise CheckFailed(str(root), problems=[Problem(str(root), root.kind)]) from None
            raise _candidate_error(exc) from None
    if device == "cuda":
        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:
            raise CheckFailed(
                f"your kernel crashed on the GPU ({str(exc).splitlines()[0]}): most likely a load or store "
                "out of bounds (a missing mask, a wrong offset or stride). The CUDA context is now broken: "
                "restart the Python kernel before the next check"
            ) from None

    facts = CallFacts(launched=list(watch.launched), allocations=list(watch.allocations))
    if result is not None and not isinstance(result, torch.Tensor | tuple) and not _launch_handle(result):
        facts.returned = type(result).__name__
    facts.returned_other = isinstance(result, torch.Tensor) and all(
        result.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr() for buf, _, _ in buffers.values())
    facts.host = _host_problems(ex, watch)
    if watch.hooks:
        facts.host.append(Problem(
            f"runs host code around its launches ({', '.join(dict.fromkeys(watch.hooks))}): hooks compute on "
            "the host, outside what the checker watches; use reset_to_zero= for buffers that must start at 0",
            "host"))
    if tracker is not None:
        tracker.verify_all("found after your function returned")
        facts.host += [Problem(_strides_first(key, text, buffers), "race" if key.startswith("race:") else "host")
                       for key, text in tracker.problems.items()]
        facts.host += _stores_outside(tracker, buffers, writable)
        facts.host += _stores_into_inputs(tracker, read_only)
    torch_wrote_later = any(op.endswith("_") or op in ex.allowed_ops or op not in HOST_OPS
                            for op in watch.torch_ops[ops_at_last_launch[0]:])
    for name, (_, view, _) in buffers.items():
        changed_later = name in after_launch and not torch.equal(_bits(view), after_launch[name])
        if changed_later and not torch_wrote_later:
            facts.changed_later.append(name)
    # What the candidate returned, or left with the watcher, can run its code when it is let go of (a
    # `__del__`, a weakref callback, cyclic garbage): after the looks above, unwatched. Let go of it all
    # here and look once more: an output that changed meanwhile was written by the host.
    looked_at = {name: _storage_bytes(buf).clone() for name, (buf, _, _) in buffers.items()}
    del result, watch, tracker
    # One collection frees what the call left; another that still finds garbage means finalizers that
    # make more (or a thread of the notebook's): GC_ROUNDS in a row is code that keeps running.
    if all(gc.collect() for _ in range(GC_ROUNDS)):
        facts.host.append(Problem("objects of yours kept running code after your function returned", "host"))
    for name, (buf, _, _) in buffers.items():
        if not torch.equal(_storage_bytes(buf), looked_at[name]):
            facts.host.append(Problem(f"`{name}` was changed after your function returned (by a `__del__`?): "
                                      "the result must be written by the Triton kernel", "host"))
    facts.final = looked_at
    return facts


def as_last_seen(buffers: dict, final: dict) -> dict:
    """The output buffers (name -> (buffer, view, numel)) over the bytes the last look after the call found
    (CallFacts.final), for the judge: a thread of the notebook's, or a patched gc.unfreeze, that writes the
    answer once the checker's looks are over writes into memory nobody judges."""
    seen = {}
    for name, (buf, view, numel) in buffers.items():
        if name not in final:
            seen[name] = (buf, view, numel)
            continue
        storage = final[name].untyped_storage()

        def over(t: torch.Tensor) -> torch.Tensor:
            return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape,
                                                                        t.stride())

        seen[name] = (over(buf), over(view), numel)
    return seen


def judge_kernel_case(ex: Exercise, case: Case, prepared: Prepared, facts: CallFacts) -> list[str]:
    """The problems of one call, from the bytes it left and the facts recorded (the checker's side)."""
    refusal = course_solution(ex.id, None, facts.launched)
    if refusal is not None:
        return [Problem(refusal, "solution")]
    problems = []
    if facts.returned is not None:
        problems.append(f"returned {facts.returned}; a destination-passing function returns None")
    problems += facts.host
    problems += _launch_problems(ex, case, facts.launched, facts.allocations)
    for name, tensor, bits in prepared.inputs:
        if not torch.equal(_bits(tensor), bits):
            problems.append(Problem(f"your function modified its input `{name}`", "input"))
    outs = {name: view for name, (_, view, _) in prepared.buffers.items()}
    for name, (buf, view, _) in prepared.buffers.items():
        problems += _guard_problems(name, buf, view)
        if name in facts.changed_later:
            problems.append(Problem(f"`{name}` was changed after your last kernel launch by host code (NumPy? "
                                    "a Python loop?): the result must be written by the Triton kernel", "host"))
        found = compare(name, view, case.expected[name], case.atol, case.rtol)
        if found and facts.returned_other:
            found.append(f"your function returned a tensor instead of writing into `{name}`: the checker "
                         "allocates the output, passes it in, and reads it after the call (the return value "
                         "is ignored)")
        problems += found
    # What wrong values match, unless some were never written: their poison (NaN) explains nothing
    kinds = {kind_of(p) for p in problems}
    if case.explain is not None and kinds & {"wrong", "nan"} and "unwritten" not in kinds:
        why = case.explain(outs, case)
        if why:
            problems.append(Problem(why, "wrong"))
    if case.verify is not None and not problems:
        problems += case.verify(outs, case)
    return problems


def refuses(kind: type[Exception], candidate: Callable, call_args: list) -> bool:
    """Whether the candidate, called on inputs it must refuse, raised `kind` (False: it returned normally); any
    other exception is its failure (wrong_refusal). The check's and the sandbox's way alike."""
    with watching():
        try:
            candidate(*call_args)
        except Refused as exc:
            raise CheckFailed(str(exc)) from None
        except kind:
            return True
        except Exception as exc:
            raise wrong_refusal(kind, exc) from None
    return False


def _expect_refusal(case: Case, candidate: Callable, call_args: list) -> list[str]:
    """A case the candidate must refuse (Case.raises): raising that exception is the right answer."""
    if refuses(case.raises, candidate, call_args):
        return []
    return [f"these inputs must be refused: raise {case.raises.__name__} with a message saying why "
            f"({case.label}); your function returned normally"]


@contextlib.contextmanager
def _examining(unexaminable: Callable[[], str]):
    """Around a call of the candidate and the looks at what it did. A CheckFailed passes; an exception that
    is no Exception (SystemExit) came from the candidate: its error. Any other exception escaped the checker's
    looks at what the candidate returned or left (a sparse or meta tensor, which has no memory to read): a
    failure that says so (`unexaminable()`: what it was), never a crash of the check."""
    try:
        yield
    except (CheckFailed, KeyboardInterrupt, CannotWatch):
        raise
    except Exception as exc:
        line = _exception_line(exc)
        try:
            what = unexaminable()
        except Exception:
            what = "your function returned or left something the checker cannot examine"
        raise CandidateError(f"{what} ({line})", problems=[Problem(f"{what} ({line})", "wrong")],
                             raised=line) from None
    except BaseException as exc:
        raise _candidate_error(exc) from None


def _launch_handle(result: Any) -> bool:
    """`return kernel[grid](...)` gives back the compiled kernel on a GPU and None in the interpreter: either
    way the launch is the function's work, not an answer, and the two modes must judge it alike."""
    return type(result).__name__ == "CompiledKernel" and type(result).__module__.startswith("triton.")


def _returned(result: Any) -> str:
    """What a function candidate returned, in a few words: "a sparse_coo (3,) float32 tensor", "a str"."""
    if isinstance(result, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            layout = "" if result.layout == torch.strided else f"{str(result.layout)[6:]} "
            device = "" if result.device.type in ("cpu", "cuda") else f" on the {result.device.type} device"
            return f"a {layout}{tuple(result.shape)} {str(result.dtype)[6:]} tensor{device}"
    if isinstance(result, tuple | list):
        return f"a {type(result).__name__} of " + ", ".join(_returned(r) for r in result[:4])
    return f"a {type(result).__name__}"


def _run_kernel_case(ex: Exercise, candidate: Callable, case: Case, device: str) -> list[str]:
    prepared = prepare_kernel_case(ex, case, device)
    with _examining(lambda: "your function returned or left something the checker cannot examine: a "
                            "destination-passing function writes into the output buffers it is given (never "
                            "re-pointing them with set_ or resize_) and returns None"):
        if case.raises is not None:
            return _expect_refusal(case, candidate, prepared.call_args)
        facts = call_kernel_candidate(ex, candidate, prepared.call_args, prepared.buffers, device,
                                      writable_of(case))
        prepared.buffers.update(as_last_seen(prepared.buffers, facts.final))
        return judge_kernel_case(ex, case, prepared, facts)


def writable_of(case: Case) -> dict[str, tuple[torch.Tensor, str]]:
    """{output name: (Out.writable, Out.what)} of a case's in/out buffers that say which elements change."""
    return {arg.name: (arg.writable, arg.what) for arg in case.args
            if isinstance(arg, Out) and arg.writable is not None}


def _function_args(args) -> tuple:
    """The arguments a function candidate gets: plain tensors copied, so the case keeps its own."""
    return tuple(_same_layout_copy(a) if type(a) is torch.Tensor else a for a in args)


class Unplain:
    """What _plain makes of a returned object that is none of the plain types: an object of a class of the
    same name that says what it was, and nothing else (no ==, no attributes, no __torch_function__)."""

    def __repr__(self) -> str:
        return f"<a {type(self).__name__}>"


def _plain(value: Any) -> Any:
    """The value with subclasses of int, float, str, tuple, list and torch.Tensor made plain (inside tuples
    and lists too), and any other object but None, a dict or a NumPy scalar replaced by an Unplain: a
    subclass can redefine == to say yes to any expected answer, or a tensor's __torch_function__ make
    torch.equal say so; an object can claim to be a tensor or a tuple (isinstance believes its `__class__`)
    and compute its answer only when the check looks at it, after the watch on the call has ended (with
    the torch ops the exercise forbids). Their own values are kept. By type(), which cannot lie."""
    kind = type(value)
    if value is None or kind in (bool, dict) or (issubclass(kind, np.generic) and kind.__module__ == "numpy"):
        return value
    if issubclass(kind, int):
        return int.__int__(value)
    if issubclass(kind, float):
        return float.__float__(value)
    if issubclass(kind, str):
        return str.__str__(value)
    if issubclass(kind, tuple):
        return tuple(_plain(v) for v in tuple.__iter__(value))
    if issubclass(kind, list):
        return [_plain(v) for v in list.__iter__(value)]
    if issubclass(kind, torch.Tensor):  # a subclass: a plain tensor over its memory, in its autograd graph
        return value if kind is torch.Tensor else torch.Tensor.as_subclass(value, torch.Tensor)
    return type(kind.__name__, (Unplain,), {"__module__": __name__})()


def _functions(targets: Iterable[str]) -> tuple[dict, dict, dict]:
    """The functions named "module:name" (skipped if absent): {code object: target} for Python functions,
    {(class, method name): target} for methods written in C (numpy:ndarray.swapaxes), which have no code.
    A module not loaded yet is not imported (torch._inductor.ir takes seconds): its functions are known by
    {(module, qualified name): target}, as the frame of a call shows them, should the code inside load it."""
    import sys

    codes, methods, names = {}, {}, {}
    for target in targets:
        module, _, name = target.partition(":")
        if module not in sys.modules:
            names[(module, name)] = target
            continue
        fn = sys.modules[module]
        try:
            for part in name.split("."):
                fn = getattr(fn, part)
        except AttributeError:
            continue
        fn = inspect.unwrap(fn)
        if hasattr(fn, "__code__"):
            codes[fn.__code__] = target
        elif isinstance(getattr(fn, "__objclass__", None), type):
            methods[(fn.__objclass__, fn.__name__)] = target
    return codes, methods, names


@contextlib.contextmanager
def _calls_to(targets: Iterable[str], seen: list[str]):
    """Record in `seen` each "module:name" of `targets` that Python calls inside, however the caller got
    hold of it (sys.setprofile sees the function's code, not the name it was imported under); "profiler"
    when the code inside replaced the hook."""
    import sys

    codes, methods, names = _functions(targets)
    if not codes and not methods and not names:
        yield
        return

    def hook(frame, event, arg):
        if event == "call":
            code = frame.f_code
            target = codes.get(code) or (names and names.get((frame.f_globals.get("__name__"), code.co_qualname)))
            if target and target not in seen:
                seen.append(target)
        elif event == "c_call" and methods:  # arg: the C function called, bound to its object for a method
            name = getattr(arg, "__name__", None)
            for cls in type(getattr(arg, "__self__", None)).__mro__:
                target = methods.get((cls, name))
                if target and target not in seen:
                    seen.append(target)

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield
    finally:
        if sys.getprofile() is not hook:
            seen.append("profiler")
        sys.setprofile(previous)


def _reading(args) -> contextlib.ExitStack:
    """The watch an input brings for the call it is given to (checks' input wrappers with a `reading`, e.g.
    05.online_softmax_stats's read log): entered around the call, in a sandbox too."""
    stack = contextlib.ExitStack()
    for arg in args:
        reading = getattr(type(arg), "reading", None)
        if isinstance(arg, torch.Tensor) and callable(reading):
            stack.enter_context(reading(arg))
    return stack


def call_function_candidate(ex: Exercise, candidate: Callable, args) -> tuple[Any, list[str]]:
    """Call a (non-kernel) candidate: its result (made plain: _plain) and what it used that the exercise
    forbids (aten op names, "dtype:<name>" for a forbidden dtype it touched, "call:<module:name>" for a
    forbidden course function it called, "launch:none" when an exercise that needs kernels launched none)."""
    called: list[str] = []
    with (_quiet_numerics(), watching() as watch, _calls_to(getattr(ex, "forbidden_calls", ()), called),
          _reading(args)):
        try:
            result = _plain(candidate(*args))
        except Exception as exc:
            raise _candidate_error(exc) from None
    if isinstance(result, torch.Tensor) and result.grad_fn is not None:  # what its forward made (kept_alive)
        note_made(result.grad_fn, watch.made)
    used = [f"call:{name}" for name in called] + [f"thread:{site}" for site in watch.threads[:1]]
    used += [op for op in ex.forbidden_ops if op in watch.torch_ops]
    used += [f"dtype:{str(dt).replace('torch.', '')}" for dt in ex.forbidden_dtypes if dt in watch.dtypes]
    if ex.needs_kernels:
        used += [] if watch.launches else ["launch:none"]
    elif ex.max_launches == 0 and watch.launches:
        used += [f"launch:{watch.launches[0]}"]
        refusal = course_solution(ex.id, None, watch.launched)
        used += [f"solution:{refusal}"] if refusal else []
    if not getattr(ex, "host_arithmetic", True):
        used += [f"host:{op}" for op in host_arithmetic(watch)]
        used += [f"data:{problem}" for problem in _host_data_problems(watch)]
    else:  # what a subclass computes is unseen: no rule of the exercise can judge it
        used += [f"data:{problem}" for problem in _subclass_problems(watch)]
    return result, used


def host_arithmetic(watch) -> list[str]:
    """The torch ops a watched stretch of host code ran that compute (not allocation, views or copies).
    `add_` is left out: it is how autograd accumulates a gradient into a leaf that already has one."""
    return [op for op in watch.compute_ops() if op not in COPY_OPS and op != "add_"]


def backward_problems(exercise_id: str, watch) -> list[str]:
    """What a candidate's backward (watched while autograd ran it) did that a kernel exercise's host code
    may not: launch the course's solution kernels, or compute with torch."""
    problems = []
    refusal = course_solution(exercise_id, None, watch.launched)
    if refusal:
        problems.append(Problem(f"the backward: {refusal}", "host"))
    if watch.threads:
        problems.append(Problem(f"the backward {_thread_problem(watch.threads)}", "host"))
    ops = host_arithmetic(watch)
    if ops:
        problems.append(Problem("the backward computed with torch operations outside your kernels ("
                                + watch.describe_ops(ops) + "): dx and dw must come from your Triton kernels",
                                "host"))
    return problems + _host_data_problems(watch, "the backward ")


def _aten_names(ops: list[str]) -> str:
    """ "aten.mul (torch.mul / *), aten.mean (torch.mean)" for a failure message."""
    return ", ".join(f"aten.{op}" + (f" ({TORCH_NAMES[op]})" if op in TORCH_NAMES else "") for op in ops)


def judge_function_case(ex: Exercise, case: Case, result: Any, used: list[str]) -> list[str]:
    if "launch:none" in used:
        return [Problem("no Triton kernel was launched: this function must run your Triton kernels, not "
                        "compute the answer with PyTorch", "host")]
    launched = [u[7:] for u in used if u.startswith("launch:")]
    if launched:
        return [Problem(f"launched the Triton kernel `{launched[0]}`: this exercise is plain Python on the host; a "
                        "kernel's own conversions (a bitcast to one of Triton's float types, then .to(tl.float32)) "
                        "compute with the GPU's hardware, not with your code", "host")]
    solutions = [u[9:] for u in used if u.startswith("solution:")]
    if solutions:
        return [Problem(solutions[0], "host")]
    threads = [u[7:] for u in used if u.startswith("thread:")]
    if threads:
        return [_thread_problem(threads)]
    data = [u[5:] for u in used if u.startswith("data:")]
    if data:
        return [Problem(data[0], "host")]
    host = [u[5:] for u in used if u.startswith("host:")]
    if host:
        return [Problem(f"computed with torch operations on the host ({_aten_names(host[:4])}): the "
                        "arithmetic belongs in your Triton kernels; the host code only allocates, reshapes and "
                        "launches", "host")]
    calls = [u[5:] for u in used if u.startswith("call:")]
    if "profiler" in calls:
        return [Problem("your function replaced the Python profiler (sys.setprofile) that the check uses to "
                        "see which course functions it calls: leave it alone", "host")]
    if calls:
        name = calls[0].replace(":", ".")
        why = ex.call_message or "write it yourself"
        whose = "the course's own" if name.startswith("course_utils.") else "the library function"
        return [Problem(f"calls {whose} `{name}`: {why}", "host")]
    dtypes = [u for u in used if u.startswith("dtype:")]
    if dtypes:
        return [Problem(ex.dtype_message or f"uses {dtypes[0][6:]}, which this exercise asks you to do "
                        "without", "host")]
    if used:
        return [Problem(f"uses {_aten_names(used)}, which this exercise asks you to do yourself", "host")]
    if case.verify is not None:
        return case.verify(result, case)
    if result != case.expected:
        return [f"returned {result!r}, expected {case.expected!r}"]
    return []


def _run_function_case(ex: Exercise, candidate: Callable, case: Case) -> list[str]:
    """The candidate gets copies of the case's plain tensors: what it does to them cannot change the case.
    The judge sees those copies (a view must share the storage the candidate was given)."""
    args = _function_args(case.args)
    with _examining(lambda: "your function returned or left something the checker cannot examine"):
        if case.raises is not None:
            return _expect_refusal(case, candidate, list(args))
        result, used = call_function_candidate(ex, candidate, args)
    with _examining(lambda: f"your function returned {_returned(result)}, which the checker cannot examine: "
                            f"return what {ex.signature} asks for, plain Python numbers or strided tensors"):
        judged = dataclasses.replace(case, args=args)
        return modified_inputs(ex, case, args) or judge_function_case(ex, judged, result, used)


def modified_inputs(ex: Exercise, case: Case, args) -> list[str]:
    """A function exercise's inputs are read-only: the problem when the candidate changed its copy of one
    (`args`, from _function_args; in a batch grader, as the sandbox sent it back)."""
    modified = [name for name, a, b in zip(ex.params, case.args, args)
                if isinstance(a, torch.Tensor) and a is not b and not torch.equal(_bits(a), _bits(b))]
    return [Problem(f"your function modified its input `{modified[0]}`", "input")] if modified else []


def _check_signature(ex: Exercise, candidate: Callable) -> None:
    if not callable(candidate):
        raise CheckFailed(f"{ex.id}: expected a function {ex.signature}, got {type(candidate).__name__}",
                          exercise=ex.id)
    kernel = kernel_source._jit_function(candidate)
    if kernel is not None:
        raise CheckFailed(f"{ex.id}: this is the @triton.jit kernel `{kernel.fn.__name__}`; check takes the "
                          f"host function {ex.signature} that computes the grid and launches your kernel",
                          exercise=ex.id)
    try:
        inspect.signature(candidate).bind(*ex.params)
    except TypeError:
        raise CheckFailed(
            f"{ex.id}: wrong signature: expected {ex.signature}, "
            f"your function is {getattr(candidate, '__name__', 'candidate')}{inspect.signature(candidate)}",
            exercise=ex.id,
        ) from None
    except ValueError:  # builtins without a signature: let the call decide
        pass


def _with_header(exc: CheckFailed, header: str, about: dict, hint: str = "") -> CheckFailed:
    """The same failure with the exercise, case and seed in front (and the hint of its kind after)."""
    raised = getattr(exc, "raised", None)
    tail = f"\n  hint: {hint}" if hint else ""
    problems = exc.problems or [str(exc)]
    try:
        return type(exc)(f"{header}\n  {exc}{tail}", problems=problems, raised=raised, **about)
    except TypeError:  # a subclass with its own constructor
        err = type(exc)(f"{header}\n  {exc}{tail}")
        err.exercise, err.case, err.seed = about["exercise"], about["case"], about["seed"]
        err.problems, err.raised = problems, raised
        return err


def _exercise(exercise_id: str) -> Exercise:
    if exercise_id not in REGISTRY:
        from . import load_all

        load_all()
    if exercise_id not in REGISTRY:
        close = difflib.get_close_matches(str(exercise_id), REGISTRY, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise KeyError(f"no exercise {exercise_id!r}; {hint}known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[exercise_id]


# The seeds of checks, drawn from the OS: Python's `random` is the notebook's, and a notebook that calls
# random.seed(0) (for its own reproducible demo, or to know the inputs before the check draws them) would
# get the same inputs on every check.
_SEEDS = random.SystemRandom()


def check(exercise_id: str, candidate: Callable, *, seed: int | None = None, quiet: bool = False,
          course: bool = False) -> None:
    """Run every case of an exercise against `candidate`; print one line on success, raise on failure.

    course=True: the candidate is the course's own solution, shown passing in a lesson (a check
    refuses the course's solutions otherwise). On a GPU the last case of an exercise with a speed line is
    its realistic size (speed_case), and a passing check also prints its speed.
    """
    ex = _exercise(exercise_id)
    _check_signature(ex, candidate)
    seed = _SEEDS.randrange(2**31) if seed is None else seed
    device = current().device
    verdicts.forget(ex.id)
    with course_solutions_allowed() if course else contextlib.nullcontext():
        refusal = course_solution(ex.id, candidate)
        if refusal is not None:
            raise CheckFailed(f"{ex.id}: {refusal}", exercise=ex.id, seed=seed,
                              problems=[Problem(refusal, "solution")])

        def run_case(case: Case) -> list[str]:
            return (_run_kernel_case(ex, candidate, case, device) if ex.kernel
                    else _run_function_case(ex, candidate, case))

        n_cases = run_cases(ex, seed, run_case)
    verdicts.remember(ex.id, candidate)
    if not quiet:
        print(f"{ex.id} passed: {n_cases} cases ({ex.title}); seed {seed}")
        if current().gpu and ex.speed is not None:
            print(speed_line(ex, candidate))


def run_cases(ex: Exercise, seed: int, run_case: Callable[[Case], list[str]]) -> int:
    """Draw the cases of `ex` from `seed` and judge each with `run_case` (-> problems); raise CheckFailed,
    with the case, seed and the hint for the kind of failure, at the first case with problems. Returns
    the number of cases; an exercise without cases refuses to pass.

    `run_case` calls the candidate in this process (`check`) or in a submission's sandbox (batch grading)."""
    gen = torch.Generator().manual_seed(seed)
    cases = list(ex.cases(gen))
    if not cases:
        raise CheckFailed(f"{ex.id} has no cases: nothing was checked, so it cannot pass", exercise=ex.id,
                          seed=seed)
    large = current().gpu and ex.kernel and ex.speed is not None
    total = len(cases) + large  # the speed size counted ahead (it is left out only where the solution cannot run)

    def judged() -> Iterable[Case]:
        yield from cases
        # built once the small cases pass: its inputs and the solution's run at the speed size cost seconds,
        # which an answer that fails early never needs
        last = speed_case(ex, seed) if large else None
        if last is not None:
            yield last

    reproduce = f'reproduce with check("{ex.id}", {ex.func_name}, seed={seed})'
    i = 0
    for i, case in enumerate(judged(), 1):
        header = f"{ex.id} failed on case {i}/{total}: {describe_case(ex, case)}\n  seed {seed}: {reproduce}"
        about = {"exercise": ex.id, "case": describe_case(ex, case), "seed": seed}
        try:
            problems = run_case(case)
        except CheckFailed as exc:
            kind = kind_of(exc.problems[0]) if exc.problems else ""
            hint = ex.hint_for(kind) if kind and not isinstance(exc, CandidateError) else ""
            raise _with_header(exc, header, about, hint) from None
        if problems:
            body = "\n".join("  " + p for p in problems)
            hint = ex.hint_for(kind_of(problems[0]))
            hint = f"\n  hint: {hint}" if hint else ""
            raise CheckFailed(f"{header}\n{body}{hint}", problems=problems, **about)
    return i


# --- speed on a GPU ---------------------------------------------------------------------------
# A passing check on a GPU times the candidate and the course's solution on a realistic size and
# places both under the device's measured roofs. Never a failure: anything that goes wrong while
# timing is said in the line.

MEASURED: dict[str, Any] = {}  # exercise id -> roofline.Point of the student's last timed kernel
SOLUTION_MEASURED: dict[str, Any] = {}  # exercise id -> roofline.Point of the course's solution, same size
# Roofs a GPU may lack, and the roof that stands in: bf16 work runs as fp16 before Ampere (the check's
# inputs are fp16 there), TF32 as fp32; fp8 tensor cores (Ada, Hopper) run at twice the bf16 rate.
ROOF_STAND_INS = types.MappingProxyType({"bf16": ("fp16", 1.0), "tf32": ("fp32", 1.0), "fp8": ("bf16", 2.0)})


def speed_tolerance(dtype: torch.dtype) -> float:
    """The speed case's rtol for an output dtype: two roundings (the candidate's sums run in another
    order, so a value near a rounding boundary may land one step away), at least 1e-4 (fp32: exp and sin
    differ in their last bits between implementations)."""
    return max(2 * torch.finfo(dtype).eps, 1e-4)


def speed_case(ex: Exercise, seed: int) -> Case | None:
    """The last case on a GPU: the size the speed line times, with the course's solution's outputs as the
    expected values. The other cases are small, and a kernel can take other paths on a large problem (the
    autotuner's large tiles, a TMA or split-K path, offsets past int32) that only this case runs.

    Tolerance: two roundings of each output's dtype (speed_tolerance), relative, and as much again of the
    outputs' root mean square, absolute (sums near zero); garbage and a lost tile of K are far outside it."""
    # The inputs follow from the seed, drawn on the CPU (inputs.randn); torch's own stream is put back, and
    # the GPU's generators are not touched (torch.manual_seed would reseed them too)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        args = ex.speed.args()
    outs = _materialize(args, current().device)
    try:
        with _quiet_numerics():
            _solution(ex.speed.solution)(*outs)
    except Exception:  # the course's kernel cannot run on this GPU (fp8 before Ada): no reference, no case
        return None
    expected = {arg.name: out.detach().to(torch.float64) for arg, out in zip(args, outs) if isinstance(arg, Out)}
    rtol = max(speed_tolerance(arg.dtype) for arg in args if isinstance(arg, Out))
    scale = max(float(e[torch.isfinite(e)].square().mean().sqrt()) if e.numel() else 0.0 for e in expected.values())
    label = (f"the speed line's size, {ex.speed.label} (GPU only), against the course's solution: the small cases "
             "pass, so a path your kernel takes only on a large problem (a config the autotuner picks there, a "
             "TMA or split path, offsets past int32) is wrong")
    return Case(label, args, expected, atol=rtol * scale, rtol=rtol)


def _materialize(args: tuple, device: str) -> tuple:
    return tuple(torch.empty(a.shape, dtype=a.dtype, device=device) if isinstance(a, Out) else a for a in args)


def _seconds(fn: Callable, args: tuple) -> float:
    from triton.testing import do_bench

    return do_bench(lambda: fn(*args), warmup=25, rep=100) / 1e3


def _solution(path: str) -> Callable:
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def with_stand_in_roofs(ceilings, roofs) -> Any:
    """The ceilings with a stand-in for each roof in `roofs` this GPU lacks (ROOF_STAND_INS): a copy,
    or the same ceilings when nothing is missing or no stand-in was measured."""
    rates = dict(ceilings.matmul_tflops)
    for roof in roofs:
        stand_in, factor = ROOF_STAND_INS.get(roof, (None, 1.0))
        if roof is not None and roof not in rates and stand_in in ceilings.matmul_tflops:
            rates[roof] = ceilings.matmul_tflops[stand_in] * factor
    return ceilings if rates == ceilings.matmul_tflops else dataclasses.replace(ceilings, matmul_tflops=rates)


def _roof(speed: Speed, ceilings) -> tuple[Any, str | None, str]:
    """(ceilings, roof, how the roof is named) for a speed line: the exercise's tensor-core roof, or its
    stand-in on a GPU without it (with_stand_in_roofs); roof None (work without tensor cores, or no
    stand-in): the lowest roof, the CUDA cores' fp32 rate, named by format_speed."""
    roof = speed.roof
    if roof is None or roof in ceilings.matmul_tflops:
        return ceilings, roof, f"{roof} matmul rate" if roof else ""
    derived = with_stand_in_roofs(ceilings, [roof])
    if roof not in derived.matmul_tflops:
        return ceilings, None, ""
    stand_in, factor = ROOF_STAND_INS[roof]
    if factor == 1.0:
        return derived, roof, f"{stand_in} matmul rate"
    return derived, roof, f"{roof} matmul rate ({factor:g} x the measured {stand_in} rate)"


def format_speed(speed: Speed, cost, seconds: float, solution_seconds: float | None,
                 ceilings) -> tuple[str, Any, Any]:
    """The speed line, and the roofline.Points of the candidate and of the course's solution (None when
    it was not timed). Memory-bound work (intensity left of its roof's ridge point) is told in GB/s, as a
    fraction of the measured copy bandwidth; compute-bound work in TFLOP/s, as a fraction of its flat roof
    (the tensor cores' rate of its precision, or the CUDA cores' fp32 rate for work without tensor cores)."""
    from ..roofline import Point

    from ..roofline import CORE_ROOF

    ceilings, roof, roof_text = _roof(speed, ceilings)

    def point(s: float) -> Point:
        return Point("", cost.intensity, cost.flops / s / 1e12, roof)

    candidate = point(seconds)
    roof_name = candidate.roof_of(ceilings)
    memory = ceilings.bound(cost.intensity, roof_name) == "memory"
    roof_text = roof_text or (f"{CORE_ROOF} CUDA-core rate" if roof_name == CORE_ROOF else f"{roof_name} rate")

    def rate(s: float) -> str:
        return f"{cost.n_bytes / s / 1e9:,.0f} GB/s" if memory else f"{cost.flops / s / 1e12:,.1f} TFLOP/s"

    def share(s: float) -> str:
        return f"{point(s).fraction(ceilings):.0%}"

    ceiling = (f"{ceilings.copy_gbps:,.0f} GB/s copy bandwidth" if memory
               else f"{ceilings.peak(roof_name) / 1e12:,.0f} TFLOP/s {roof_text}")
    line = (f"speed on {speed.label}: {rate(seconds)}, {share(seconds)} of this GPU's measured {ceiling} "
            f"({'memory' if memory else 'compute'}-bound)")
    solution = None
    if solution_seconds is not None:
        line += f"; the course's solution: {rate(solution_seconds)} ({share(solution_seconds)})"
        solution = point(solution_seconds)
    return line, candidate, solution


def _label(speed: Speed, args: tuple) -> Speed:
    """The label with the half-precision dtype the inputs really have (fp16 on a GPU without bf16)."""
    dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)}
    if "bf16" in speed.label and torch.bfloat16 not in dtypes and torch.float16 in dtypes:
        return dataclasses.replace(speed, label=speed.label.replace("bf16", "fp16"))
    return speed


def speed_line(ex: Exercise, candidate: Callable) -> str:
    """Time a passing candidate beside the course's solution (GPU only); one line, never an exception."""
    from ..roofline import device_ceilings

    try:
        with _quiet_numerics():
            args = _materialize(ex.speed.args(), current().device)
            cost = ex.speed.cost(args)
            seconds = _seconds(candidate, args)
            try:
                solution_seconds = _seconds(_solution(ex.speed.solution), args)
            except Exception:  # the course's kernel could not run here: show the candidate alone
                solution_seconds = None
            line, point, solution = format_speed(_label(ex.speed, args), cost, seconds, solution_seconds,
                                                 device_ceilings())
    except Exception as exc:  # timing is a bonus: say why it is missing, never fail the check
        return f"speed: not measured ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    point.label = ex.id
    MEASURED[ex.id] = point
    if solution is not None:
        solution.label = f"{ex.id} (course)"
        SOLUTION_MEASURED[ex.id] = solution
    else:
        SOLUTION_MEASURED.pop(ex.id, None)
    return line
