"""Every unsolved stub fails its check (the exercise notebooks' code, run without their check cells),
with the stub's own message; tests/test_notebooks.py shows every solution passing its check."""
from __future__ import annotations

import linecache
import sys
import types
from pathlib import Path

import nbformat
import pytest

from course_utils.grading import CandidateError, CheckFailed, check, exercises

ROOT = Path(__file__).resolve().parent.parent


def _stub_namespace(stem: str) -> dict:
    """Run the exercise notebook's code cells, except check and progress cells, as a student would."""
    nb = nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4)
    module = types.ModuleType(f"exercise_{stem}")  # a real module: dataclasses look theirs up
    sys.modules[module.__name__] = module
    for number, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and not cell.source.startswith(("check(", "progress(")):
            # a name Triton can read the source back from (a GPU compiles @triton.jit from its source)
            name = f"<{stem}.ipynb cell {number}>"
            linecache.cache[name] = (len(cell.source), None, cell.source.splitlines(True), name)
            exec(compile(cell.source, name, "exec"), vars(module))  # noqa: S102 - our own notebook
    return vars(module)


@pytest.mark.parametrize("exercise", exercises(), ids=lambda ex: ex.id)
def test_unsolved_stub_fails_its_check(exercise):
    from course_utils.lessons_index import LESSONS

    namespace = _stub_namespace(LESSONS[exercise.id[:2]].stem)
    with pytest.raises(CheckFailed) as info:
        check(exercise.id, namespace[exercise.func_name], seed=0, quiet=True)
    assert isinstance(info.value, CandidateError), str(info.value)
    assert "NotImplementedError" in str(info.value) and "not written yet" in str(info.value)
