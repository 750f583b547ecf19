"""What the exercise tests share: asserting that a wrong answer fails with a message that helps."""
from __future__ import annotations

import contextlib
import dataclasses

import pytest
import triton
import triton.language as tl

from course_utils.grading import CheckFailed, check
from course_utils.mode import current


def interpreter_only_because(reason: str):
    """A mark that skips a test on a GPU, saying why it belongs to the interpreter alone."""
    return pytest.mark.skipif(current().gpu, reason=reason)


# Tests whose wrong answers read or write out of bounds: the interpreter's guard catches them before
# the access; on a GPU they could break the CUDA context for the rest of the session.
interpreter_only = interpreter_only_because("interpreter only: may break the CUDA context")


@contextlib.contextmanager
def only_cases(exercise_id: str, at: str | None):
    """While inside, the exercise judges only its cases whose label holds `at` (all of them when None). Every
    case is still drawn, in order, so each keeps the inputs it has in the whole check: for a mistake that one
    case catches, without running the cases before it in the interpreter."""
    from course_utils.grading.harness import REGISTRY, _exercise

    if at is None:
        yield
        return
    ex = _exercise(exercise_id)

    def cases(gen):
        return [case for case in ex.cases(gen) if at in case.label]

    del REGISTRY[exercise_id]
    REGISTRY[exercise_id] = dataclasses.replace(ex, cases=cases)
    try:
        yield
    finally:
        del REGISTRY[exercise_id]
        REGISTRY[exercise_id] = ex


def failure(exercise_id: str, candidate, *expected: str, seed: int = 1, at: str | None = None) -> CheckFailed:
    """Check `candidate`, which must fail; every string in `expected` must be in the message. at: judge only
    the cases whose label holds it (only_cases)."""
    with pytest.raises(CheckFailed) as info, only_cases(exercise_id, at):
        check(exercise_id, candidate, seed=seed, quiet=True)
    message = str(info.value)
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"
    return info.value


# Lesson 02's mistake of masking the last program with the remainder: offs < n % BLOCK, which is 0 (every lane
# masked off) when n is a multiple of BLOCK. For the mutants of a 1-D kernel with BLOCK and n_elements.
REMAINDER_MASK = ("tl.arange(0, BLOCK) < "
                  "tl.where(tl.program_id(0) == tl.num_programs(0) - 1, n_elements % BLOCK, BLOCK)")


def _without_comments(source: str) -> str:
    """The source with each comment blanked out (tokenize finds them; a '#' in a string is no comment)."""
    import io
    import tokenize

    lines = source.splitlines(keepends=True)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            (row, start), (_, end) = token.start, token.end
            lines[row - 1] = lines[row - 1][:start] + " " * (end - start) + lines[row - 1][end:]
    return "".join(lines)


_MUTANTS: list = []


def _mutants_folder() -> str:
    """One temporary folder per test process for the files of sources the tests run (mutants, candidates),
    removed when the process ends."""
    import tempfile

    if not _MUTANTS:
        _MUTANTS.append(tempfile.TemporaryDirectory(prefix="course-mutants-"))
    return _MUTANTS[0].name


def run_from_file(source: str, name: str) -> dict:
    """The names `source` defines, run as module `name` from a file of its own: Triton reads a kernel's
    source (the checker refuses a kernel whose source cannot be read, as a GPU's compiler does)."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(dir=_mutants_folder())) / f"{name}.py"
    path.write_text(source)
    namespace: dict = {"__name__": name}
    exec(compile(source, str(path), "exec"), namespace)  # noqa: S102 (the tests' own sources)
    return namespace


def mutant(module: str, name: str, *edits: tuple[str, str]):
    """`name` from a copy of course_utils.lessons.<module> with each (old, new) text edit applied: the
    course's solution with one mistake a student makes. The copy is a module of its own (not the
    course's), written to a temporary file so that @triton.jit can read its source."""
    import importlib
    import inspect
    import sys
    import tempfile
    import types
    from pathlib import Path

    source = inspect.getsource(importlib.import_module(f"course_utils.lessons.{module}"))
    code = _without_comments(source)
    for old, new in edits:
        # in the code: a text found only in a comment (the lesson quoting a line its kernel no longer has) would
        # leave the kernel unedited, and the test's "wrong answer" the solution or another mistake
        assert (code if "#" not in old else source).count(old), f"{old!r} is not in the code of course_utils/lessons/{module}.py"
        source = source.replace(old, new)
    path = Path(tempfile.mkdtemp(dir=_mutants_folder())) / f"mutant_{module}.py"
    path.write_text(source)
    copy = types.ModuleType(f"mutant_{module}_{len(sys.modules)}")
    copy.__file__ = str(path)
    sys.modules[copy.__name__] = copy
    exec(compile(source, str(path), "exec"), vars(copy))  # noqa: S102 - the course's own source, edited
    return getattr(copy, name)



def recorded_launches(monkeypatch, module, kernel: str) -> list:
    """Replace `module.<kernel>` by a stand-in that records each launch, (grid, launch keywords), instead of
    running it: for limits of a GPU grid (65535 programs along axes 1 and 2) that the interpreter has not."""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **meta: launches.append((grid, meta))

    monkeypatch.setattr(module, kernel, Recorder())
    return launches

@triton.jit
def zeros_kernel(out_ptr, n_elements, BLOCK: tl.constexpr):
    """A kernel that writes zeros: a candidate's stand-in that launches but computes nothing."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.zeros((BLOCK,), dtype=tl.float32), mask=offsets < n_elements)


@triton.jit
def flat_copy_kernel(src_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    """A flat copy: with it a candidate can launch a kernel over values it computed elsewhere."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    """out = 2 * x: a right kernel for the wrong exercise."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)


def launch_1d(kernel, *args, n, BLOCK=1024):
    """Launch a 1-D kernel over n elements, one program per BLOCK."""
    kernel[(triton.cdiv(n, BLOCK),)](*args, n, BLOCK=BLOCK)
