"""Is a candidate the student's own? The course's solutions live in course_utils/lessons/: a candidate
defined there, or a kernel of the exercise's own lesson launched for it, is the course's answer (unless
that kernel is given code, with no solution block in it).

Kernels of earlier lessons that an exercise builds on stay allowed (lesson 06's down projection runs
lesson 03's matmul; lesson 06 packs its weights with lesson 02's copy_2d).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Iterable

LESSONS_PACKAGE = "course_utils.lessons."
_LESSONS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lessons") + os.sep

_allowed = [0]  # > 0 inside course_solutions_allowed(): tests and lessons that show the course's own code


@contextlib.contextmanager
def course_solutions_allowed():
    """Let `check` run the course's own solutions (the test suite; a lesson showing its code passing)."""
    _allowed[0] += 1
    try:
        yield
    finally:
        _allowed[0] -= 1


def _module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def lesson_module(fn) -> str:
    """The lesson module a Python function's code was compiled from, e.g.
    "course_utils.lessons.l02_first_kernels", or "". Its __module__ is not enough: a copy made with
    types.FunctionType, or a function whose __module__ was reassigned, runs the lesson's code all the same."""
    filename = getattr(getattr(fn, "__code__", None), "co_filename", None)
    if not isinstance(filename, str):
        return ""
    path = os.path.abspath(filename)
    if path.startswith(_LESSONS_DIR) and path.endswith(".py"):
        return LESSONS_PACKAGE + os.path.basename(path)[:-3]
    return ""


def _defined_in(candidate) -> tuple[str, str]:
    """(name, module) of the function behind a candidate (partials and decorated functions unwrapped)."""
    for _ in range(8):
        if isinstance(candidate, functools.partial):
            candidate = candidate.func
        elif hasattr(candidate, "__wrapped__"):
            candidate = candidate.__wrapped__
        else:
            break
    if inspect.ismethod(candidate):
        candidate = candidate.__func__
    name = getattr(candidate, "__name__", type(candidate).__name__)
    module = lesson_module(candidate) or getattr(candidate, "__module__", "") or ""
    return name, module


def course_solution(exercise_id: str, candidate=None, launched: Iterable = ()) -> str | None:
    """Why `candidate` is not the student's own work, or None when it may be.

    candidate: the function given to check (refused when course_utils.lessons defined it);
    launched: what it launched, objects with `.name` and `.module` (guard.Launch) or (name, module)
    pairs; a kernel that the exercise's own lesson module (lesson "02" -> l02_*) defines as an answer (in a
    `# BEGIN SOLUTION` block), and any kernel of a later lesson's module, is refused.
    """
    if _allowed[0]:
        return None
    if candidate is not None:
        name, module = _defined_in(candidate)
        if module.startswith(LESSONS_PACKAGE):
            return f"`{name}` is the course's solution from {_module_path(module)}; write your own"
    own_lesson = exercise_id.split(".", 1)[0]
    for launch in launched:
        name, module = (launch.name, launch.module) if hasattr(launch, "module") else launch
        lesson = _lesson_of(module)
        if lesson > own_lesson:  # given there or not: an earlier exercise does not build on it
            return (f"your function launches `{name}`, the course's kernel from {_module_path(module)}, a later "
                    "lesson than this exercise's: write your own")
        if lesson == own_lesson and not _given(module, name):
            return (f"your function launches `{name}`, the course's solution from {_module_path(module)}; "
                    "write your own")
    return None


def _lesson_of(module: str) -> str:
    """The lesson number of a lesson module ("course_utils.lessons.l06_fused_rmsnorm_mlp" -> "06"), "" for any
    other module. A later lesson's kernel is never a tool an exercise builds on (an earlier lesson's may be: a
    later lesson imports it)."""
    if not module.startswith(LESSONS_PACKAGE + "l"):
        return ""
    return module[len(LESSONS_PACKAGE) + 1:].split("_", 1)[0]


@functools.lru_cache(maxsize=256)
def _given(module: str, name: str) -> bool:
    """Is kernel `name` of lesson `module` code the exercise notebook gives (no `# BEGIN SOLUTION` in its
    source, e.g. lesson 08's rmsnorm_forward_kernel), rather than an answer? Unknown kernels are answers."""
    import importlib

    try:
        fn = getattr(importlib.import_module(module), name)
        for _ in range(4):  # an autotuner around a jit function around the Python function
            if inspect.isfunction(fn) or not hasattr(fn, "fn"):
                break
            fn = fn.fn
        source = inspect.getsource(fn)
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    return "BEGIN SOLUTION" not in source
