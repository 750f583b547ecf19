"""course_utils: the helper package of the GPU optimization with Triton course.

Light on purpose: importing it loads no torch, so `python -m course_utils install` runs on a bare
Python. Notebooks start with `from course_utils import setup; setup()`.
"""
from __future__ import annotations

from .mode import Mode, current, device, half_dtype, setup, size

__all__ = ["Mode", "check", "current", "device", "half_dtype", "progress", "setup", "size"]


def check(exercise_id: str, candidate, *, seed: int | None = None) -> None:
    """Check `candidate` against exercise `exercise_id` on fresh random inputs (see course_utils.grading)."""
    from .grading import check as run_check

    run_check(exercise_id, candidate, seed=seed)


def progress(lesson: str, namespace: dict) -> dict[str, str]:
    """Check every exercise of `lesson` whose function is defined in `namespace`; print a summary."""
    from .grading.progress import progress as run_progress

    return run_progress(lesson, namespace)
