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
from .guard import HOST_OPS, TORCH_NAMES, OutOfBounds, watching

GUARD_ELEMENTS = 1 << 16  # guard region on each side of an output: larger than any block a kernel uses
SHOW = 5  # how many mismatching elements a failure message lists


class CheckFailed(AssertionError):
    """A candidate gave a wrong answer; the message says where and how.

    Raised by `check` with what a program needs to summarize it (batch grading, progress):
    `exercise` (id), `case` (its description), `seed`, `problems` (one text per problem found)
    and `reason`, the first problem in one line.
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
    # Kernel exercises: the most kernel launches one call may make (1: "in one kernel"); None: any.
    max_launches: int | None = None

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

def _root_exception(exc: BaseException) -> BaseException:
    cause = exc
    while cause.__cause__ is not None and type(cause).__name__ == "InterpreterError":
        cause = cause.__cause__
    return cause


def _student_traceback(exc: BaseException) -> str:
    """The traceback without the checker's own frames (the student's code and what it called)."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = __file__.rsplit(".", 1)[0]
    kept = [f for f in frames if not f.filename.startswith(here)]
    text = "".join(traceback.format_list(kept[-8:]))
    cause = _root_exception(exc)
    return text + "".join(traceback.format_exception_only(type(cause), cause))


def _exception_line(exc: BaseException) -> str:
    """"NotImplementedError: add: not written yet": the last line of the traceback, shortened."""
    cause = _root_exception(exc)
    lines = "".join(traceback.format_exception_only(type(cause), cause)).strip().splitlines()
    return lines[-1].strip() if lines else type(cause).__name__


def _candidate_error(exc: BaseException) -> CandidateError:
    return CandidateError(f"your function raised an exception:\n{_student_traceback(exc)}",
                          raised=_exception_line(exc))


def _host_problems(ex: Exercise, watch) -> list[str]:
    """How a kernel exercise computed: no launch, torch or NumPy on the host, too many launches."""
    problems = []
    if watch.references:
        names = ", ".join(f"`{name}`" for name in watch.references)
        problems.append(f"your function calls the reference {names}: it computes the answer with PyTorch; "
                        "write the computation in your Triton kernel instead")
    forbidden = [op for op in watch.compute_ops() if op not in ex.allowed_ops]
    if not watch.launches:
        problems.append("no Triton kernel was launched: the result must come from a @triton.jit kernel")
    if forbidden:
        problems.append(
            "computed with torch operations on the host (" + watch.describe_ops(forbidden)
            + "): the arithmetic must happen inside your Triton kernel"
        )
    reads = sorted(set(watch.host_reads))
    if reads:
        problems.append(
            "read tensor data into Python/NumPy on the host (" + ", ".join(f"Tensor.{r}" for r in reads)
            + "): the arithmetic must happen inside your Triton kernel"
        )
    if ex.max_launches is not None and len(watch.launches) > ex.max_launches:
        names = ", ".join(watch.launches[:6]) + (", ..." if len(watch.launches) > 6 else "")
        want = "one kernel" if ex.max_launches == 1 else f"at most {ex.max_launches} kernel launches"
        problems.append(f"launched {len(watch.launches)} kernels ({names}); this exercise asks for {want}: "
                        "fuse the steps into one @triton.jit function")
    return problems


@dataclass
class Prepared:
    """A kernel case ready to call: the arguments (outputs are poisoned views into guarded buffers)."""

    call_args: list
    buffers: dict[str, tuple[torch.Tensor, torch.Tensor, int]]  # out name -> (buffer, view, numel)
    inputs: list[tuple[str, torch.Tensor, torch.Tensor]]  # (name, tensor, its bytes before the call)


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


def prepare_kernel_case(ex: Exercise, case: Case, device: str) -> Prepared:
    """Allocate the poisoned outputs and remember the inputs' bytes (the checker's side, before the call)."""
    prepared = Prepared([], {}, [])
    for name, arg in zip(ex.params, case.args):
        if isinstance(arg, Out):
            buf, view = _allocate(arg, device)
            prepared.buffers[arg.name] = (buf, view, view.numel())
            prepared.call_args.append(view)
        else:
            if isinstance(arg, torch.Tensor):
                prepared.inputs.append((name, arg, _bits(arg).clone()))
            prepared.call_args.append(arg)
    return prepared


def call_kernel_candidate(ex: Exercise, candidate: Callable, call_args: list,
                          buffers: dict[str, tuple[torch.Tensor, torch.Tensor, int]], device: str) -> CallFacts:
    """Call the candidate once, watching it (the candidate's side). Raises CheckFailed when it raised,
    went out of bounds or crashed the GPU; the outputs are left in `buffers` for `judge_kernel_case`."""
    # The outputs' bytes as the last kernel launch left them, and how many torch ops had run by then:
    # output that changes afterwards without a torch op that writes was written by NumPy or the like.
    after_launch: dict[str, torch.Tensor] = {}
    ops_at_last_launch = [0]

    def snapshot():
        for out_name, (_, view, _) in buffers.items():
            after_launch[out_name] = _bits(view).clone()
        ops_at_last_launch[0] = len(watch.torch_ops)

    with watching(after_launch=snapshot) as watch:
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

    facts = CallFacts()
    if result is not None and not isinstance(result, torch.Tensor | tuple):
        facts.returned = type(result).__name__
    facts.returned_other = isinstance(result, torch.Tensor) and all(
        result.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr() for buf, _, _ in buffers.values())
    facts.host = _host_problems(ex, watch)
    torch_wrote_later = any(op.endswith("_") or op in ex.allowed_ops or op not in HOST_OPS
                            for op in watch.torch_ops[ops_at_last_launch[0]:])
    for name, (_, view, _) in buffers.items():
        changed_later = name in after_launch and not torch.equal(_bits(view), after_launch[name])
        if changed_later and not torch_wrote_later:
            facts.changed_later.append(name)
    return facts


def judge_kernel_case(ex: Exercise, case: Case, prepared: Prepared, facts: CallFacts) -> list[str]:
    """The problems of one call, from the bytes it left and the facts recorded (the checker's side)."""
    problems = []
    if facts.returned is not None:
        problems.append(f"returned {facts.returned}; a destination-passing function returns None")
    problems += facts.host
    for name, tensor, bits in prepared.inputs:
        if not torch.equal(_bits(tensor), bits):
            problems.append(f"your function modified its input `{name}`")
    for name, (buf, view, numel) in prepared.buffers.items():
        problems += _guard_problems(name, buf, numel)
        if name in facts.changed_later:
            problems.append(f"`{name}` was changed after your last kernel launch by host code (NumPy? a "
                            "Python loop?): the result must be written by the Triton kernel")
        found = compare(name, view, case.expected[name], case.atol, case.rtol)
        if found and facts.returned_other:
            found.append(f"your function returned a tensor instead of writing into `{name}`: the checker "
                         "allocates the output, passes it in, and reads it after the call (the return value "
                         "is ignored)")
        problems += found
    if case.verify is not None and not problems:
        problems += case.verify({name: view for name, (_, view, _) in prepared.buffers.items()}, case)
    return problems


def _run_kernel_case(ex: Exercise, candidate: Callable, case: Case, device: str) -> list[str]:
    prepared = prepare_kernel_case(ex, case, device)
    facts = call_kernel_candidate(ex, candidate, prepared.call_args, prepared.buffers, device)
    return judge_kernel_case(ex, case, prepared, facts)


def call_function_candidate(ex: Exercise, candidate: Callable, args) -> tuple[Any, list[str]]:
    """Call a (non-kernel) candidate: its result and the forbidden aten ops it used."""
    with watching() as watch:
        try:
            result = candidate(*args)
        except Exception as exc:
            raise _candidate_error(exc) from None
    return result, [op for op in ex.forbidden_ops if op in watch.torch_ops]


def judge_function_case(ex: Exercise, case: Case, result: Any, used: list[str]) -> list[str]:
    if used:
        named = ", ".join(f"aten.{op}" + (f" ({TORCH_NAMES[op]})" if op in TORCH_NAMES else "")
                          for op in used)
        return [f"uses {named}, which this exercise asks you to do yourself"]
    if case.verify is not None:
        return case.verify(result, case)
    if result != case.expected:
        return [f"returned {result!r}, expected {case.expected!r}"]
    return []


def _run_function_case(ex: Exercise, candidate: Callable, case: Case) -> list[str]:
    result, used = call_function_candidate(ex, candidate, case.args)
    return judge_function_case(ex, case, result, used)


def _check_signature(ex: Exercise, candidate: Callable) -> None:
    if not callable(candidate):
        raise CheckFailed(f"{ex.id}: expected a function {ex.signature}, got {type(candidate).__name__}",
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


def _with_header(exc: CheckFailed, header: str, about: dict) -> CheckFailed:
    """The same failure with the exercise, case and seed in front."""
    raised = getattr(exc, "raised", None)
    try:
        return type(exc)(f"{header}\n  {exc}", problems=[str(exc)], raised=raised, **about)
    except TypeError:  # a subclass with its own constructor
        err = type(exc)(f"{header}\n  {exc}")
        err.exercise, err.case, err.seed = about["exercise"], about["case"], about["seed"]
        err.problems, err.raised = [str(exc)], raised
        return err


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
    device = current().device

    def run_case(case: Case) -> list[str]:
        return (_run_kernel_case(ex, candidate, case, device) if ex.kernel
                else _run_function_case(ex, candidate, case))

    n_cases = run_cases(ex, seed, run_case)
    if not quiet:
        print(f"{ex.id} passed: {n_cases} cases ({ex.title}); seed {seed}")


def run_cases(ex: Exercise, seed: int, run_case: Callable[[Case], list[str]]) -> int:
    """Draw the cases of `ex` from `seed` and judge each with `run_case` (-> problems); raise CheckFailed,
    with the case, seed and hint, at the first case with problems. Returns the number of cases.

    `run_case` calls the candidate in this process (`check`) or in a submission's sandbox (batch grading)."""
    gen = torch.Generator().manual_seed(seed)
    cases = list(ex.cases(gen))
    reproduce = f'reproduce with check("{ex.id}", {ex.func_name}, seed={seed})'
    for i, case in enumerate(cases, 1):
        header = f"{ex.id} failed on case {i}/{len(cases)}: {describe_case(ex, case)}\n  seed {seed}: {reproduce}"
        about = {"exercise": ex.id, "case": describe_case(ex, case), "seed": seed}
        try:
            problems = run_case(case)
        except CheckFailed as exc:
            raise _with_header(exc, header, about) from None
        if problems:
            body = "\n".join("  " + p for p in problems)
            hint = f"\n  hint: {ex.hint}" if ex.hint else ""
            raise CheckFailed(f"{header}\n{body}{hint}", problems=problems, **about)
    return len(cases)
