"""Pick the mode before any test imports a kernel: the GPU when there is one, else the interpreter."""
from course_utils import setup

setup(quiet=True)
