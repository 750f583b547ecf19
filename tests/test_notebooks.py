"""Every notebook executes on this machine (the interpreter on a CPU), as a student would run it.

- lessons (notebooks/) and solutions (solutions/) run top to bottom without an error;
- exercises (exercises/), unsolved, fail at their first check cell, and only there, with the stub's
  NotImplementedError.
"""
from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 600  # seconds per cell


def _notebooks(folder: str) -> list[Path]:
    return sorted((ROOT / folder).glob("*.ipynb"))


def _execute(path: Path) -> tuple[nbformat.NotebookNode, Exception | None]:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as exc:
        return nb, exc
    return nb, None


def _error_cell(nb: nbformat.NotebookNode) -> int | None:
    for i, cell in enumerate(nb.cells):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return i
    return None


@pytest.mark.parametrize("path", _notebooks("notebooks") + _notebooks("solutions"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_runs_top_to_bottom(path):
    start = time.perf_counter()
    nb, error = _execute(path)
    assert error is None, f"{path.name} failed:\n{error}"
    assert time.perf_counter() - start < 300, f"{path.name} is too slow for the CPU test budget"
    if path.parent.name == "solutions":
        text = "\n".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
        n_checks = sum(1 for c in nb.cells if c.cell_type == "code" and c.source.startswith("check("))
        assert text.count(" passed: ") == n_checks > 0, "every check cell of a solution passes"


@pytest.mark.parametrize("path", _notebooks("exercises"), ids=lambda p: p.name)
def test_exercise_fails_at_first_check(path):
    nb, error = _execute(path)
    assert error is not None, f"{path.name}: the unsolved notebook ran without failing"
    first_check = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith("check("))
    assert _error_cell(nb) == first_check, "the first failure must be the first check cell"
    assert "NotImplementedError" in str(error) and "not written yet" in str(error)
    assert "CandidateError" in str(error)


def test_every_lesson_has_all_three_notebooks():
    lessons = {p.stem for p in _notebooks("notebooks")}
    exercises = {p.stem for p in _notebooks("exercises")}
    assert exercises == {p.stem for p in _notebooks("solutions")}
    assert exercises <= lessons, "every exercise notebook has its lesson"
    assert "00_setup" in lessons
