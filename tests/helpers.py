"""What the exercise tests share: asserting that a wrong answer fails with a message that helps."""
from __future__ import annotations

import pytest

from course_utils.grading import CheckFailed, check
from course_utils.mode import current

# Tests whose wrong answers read or write out of bounds: the interpreter's guard catches them before
# the access; on a GPU they could break the CUDA context for the rest of the session.
interpreter_only = pytest.mark.skipif(current().gpu, reason="interpreter only: may break the CUDA context")


def failure(exercise_id: str, candidate, *expected: str, seed: int = 1) -> CheckFailed:
    """Check `candidate`, which must fail; every string in `expected` must be in the message."""
    with pytest.raises(CheckFailed) as info:
        check(exercise_id, candidate, seed=seed, quiet=True)
    message = str(info.value)
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"
    return info.value
