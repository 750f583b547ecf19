"""The passes of this session's checks, so that `progress` need not run a check again for a function that
has not changed since it passed (on the interpreter a lesson's checks take tens of seconds).

"Not changed" is judged by what the verdict depends on: the function and everything it reaches through
the global names its code reads, its defaults and its closure (its kernels, the helpers they call, the
constants it uses), each compared by identity. Running a cell again makes new objects, so the verdict no
longer applies and `progress` checks again. A list, dict or tensor changed in place keeps its identity:
`progress(lesson, globals(), recheck=True)` runs every check regardless.
"""
from __future__ import annotations

import types
import weakref
from collections.abc import Callable

PASSED: dict[str, tuple] = {}  # exercise id -> the parts of the candidate that passed


_VALUES = (int, float, complex, bool, str, bytes, type(None))


def _reached(candidate: Callable) -> tuple:
    """The objects `candidate` depends on, walked through the functions and classes defined where it is
    (a notebook's own, not a library's): callables and containers held by reference (kept alive, so that
    no new object takes an old one's id), numbers and strings by value, tensors and arrays by a weak
    reference (a verdict keeps no tensor alive)."""
    from triton.runtime import KernelInterface  # here: Triton is imported after setup() picks the mode

    home = getattr(candidate, "__module__", None)
    seen: set[int] = set()
    parts: list = []

    def code_names(code: types.CodeType) -> set[str]:
        names = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names |= code_names(const)
        return names

    def visit(obj) -> None:
        if id(obj) in seen or isinstance(obj, types.ModuleType):
            return
        seen.add(id(obj))
        if isinstance(obj, _VALUES) or (isinstance(obj, tuple) and all(isinstance(v, _VALUES) for v in obj)):
            parts.append(("value", type(obj), obj))
            return
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, KernelInterface):  # @triton.jit, @triton.autotune, @triton.heuristics
            parts.append(obj)
            visit(obj.fn)
        elif isinstance(obj, types.MethodType):
            parts.append(obj.__func__)
            visit(obj.__func__)
            visit(obj.__self__)
        elif isinstance(obj, types.FunctionType):
            parts.append(obj)
            if obj.__module__ != home:  # a library's function: its identity is enough
                return
            for name in sorted(code_names(obj.__code__)):
                if name in obj.__globals__:
                    parts.append(("name", name))
                    visit(obj.__globals__[name])
            for value in (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()):
                visit(value)
            for cell in obj.__closure__ or ():
                try:
                    visit(cell.cell_contents)
                except ValueError:  # a cell not filled yet
                    parts.append(("empty cell",))
        elif isinstance(obj, type):
            parts.append(obj)
            if obj.__module__ == home:  # e.g. a torch.autograd.Function whose forward launches the kernels
                for name, value in sorted(vars(obj).items()):
                    if isinstance(value, (types.FunctionType, staticmethod, classmethod)):
                        parts.append(("name", name))
                        visit(value)
        else:
            try:
                parts.append(("weak", weakref.ref(obj)))
            except TypeError:
                parts.append(obj)

    visit(candidate)
    return tuple(parts)


def _same(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) and a[:1] == b[:1]:
        if a[:1] == ("weak",):
            return a[1]() is not None and a[1]() is b[1]()
        if a[:1] == ("value",):
            return a[1] is b[1] and a[2] == b[2]
        if a[:1] in (("name",), ("empty cell",)):
            return a == b
    return a is b


def forget(exercise_id: str) -> None:
    PASSED.pop(exercise_id, None)


def remember(exercise_id: str, candidate: Callable) -> None:
    PASSED[exercise_id] = _reached(candidate)


def still_passes(exercise_id: str, candidate: Callable) -> bool:
    """Whether `candidate`, with everything it reaches, is what passed `exercise_id`'s check."""
    before = PASSED.get(exercise_id)
    if before is None:
        return False
    now = _reached(candidate)
    return len(now) == len(before) and all(_same(a, b) for a, b in zip(before, now))
