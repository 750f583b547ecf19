"""Pick the mode before any test imports a kernel: the GPU when there is one, else the interpreter."""
from course_utils import setup

setup(quiet=True)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _course_solutions_allowed(request):
    """Tests check the course's own solutions; a test that asks for `refuse_course_solutions` sees the
    refusal a student gets."""
    from course_utils.grading.provenance import course_solutions_allowed

    if "refuse_course_solutions" in request.fixturenames:
        yield
        return
    with course_solutions_allowed():
        yield


@pytest.fixture(autouse=True)
def _no_passes_kept_between_tests():
    """progress() keeps the passes of this session's checks (verdicts.py); each test starts without any."""
    from course_utils.grading import verdicts

    verdicts.PASSED.clear()
    yield
    verdicts.PASSED.clear()


@pytest.fixture
def refuse_course_solutions():
    """Marks a test that checks the refusal of the course's own solutions (see _course_solutions_allowed)."""
    return None


@pytest.fixture
def on_the_device():
    """Tensors made by torch's factory functions land where the solutions run: on the GPU in GPU mode."""
    import torch

    from course_utils.mode import current

    if current().interpret:
        yield
        return
    with torch.device("cuda"):
        yield
