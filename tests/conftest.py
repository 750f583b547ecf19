"""Pick the mode before any test imports a kernel: the GPU when there is one, else the interpreter."""
import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread for torch's CPU operations in each of the suite's processes (and the notebooks' kernels
    # they start): two processes of two threads each on two cores spent their time waiting on each other.
    os.environ["OMP_NUM_THREADS"] = "1"

from course_utils import setup  # noqa: E402

setup(quiet=True)


import pytest  # noqa: E402

# The longest tests first, so that the processes sharing the suite end together rather than one finishing
# a notebook alone: the notebooks, then the sandboxes' group (see install.test's --dist loadgroup).
FIRST = ("test_notebooks.py", "test_grading_attacks.py", "test_grading_batch.py")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER") or config.getoption("numprocesses", None):
        items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST))


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
