"""Auto-graded exercises: `check(exercise_id, candidate)` and the registry of exercises."""
from __future__ import annotations

import importlib
import pkgutil

from .harness import REGISTRY, CandidateError, Case, CheckFailed, Exercise, Out, check, register

__all__ = ["REGISTRY", "CandidateError", "Case", "CheckFailed", "Exercise", "Out", "check", "register",
           "load_all", "exercises"]


def load_all() -> dict[str, Exercise]:
    """Import every lesson's exercise definitions (course_utils/checks/*.py) and return the registry."""
    from .. import checks

    for info in pkgutil.iter_modules(checks.__path__):
        importlib.import_module(f"{checks.__name__}.{info.name}")
    return REGISTRY


def exercises(lesson: str | None = None) -> list[Exercise]:
    """The registered exercises in order, optionally only one lesson's ("02")."""
    load_all()
    return [ex for key, ex in sorted(REGISTRY.items()) if lesson is None or key.startswith(lesson + ".")]
