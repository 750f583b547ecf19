"""Mode selection and the size helper."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from course_utils import mode


def _run(code: str, **env) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_MODE")}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ,
                          check=True).stdout


def test_auto_picks_interpreter_without_gpu_and_sets_the_variable():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = _run("import os; from course_utils import setup; m = setup(); print(m.name, os.environ['TRITON_INTERPRET'])")
    assert "interpret mode" in out and out.strip().endswith("interpret 1")


def test_forcing_interpreter_and_environment_override():
    out = _run("import os; from course_utils import setup; m = setup('interpret'); print(os.environ.get('TRITON_INTERPRET'))")
    assert out.strip().endswith("1")
    out = _run("from course_utils import setup; print(setup(quiet=True).name)", COURSE_MODE="interpret")
    assert out.strip() == "interpret"


def test_asking_for_gpu_without_one_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        mode.setup("gpu")
    with pytest.raises(ValueError, match="mode must be one of"):
        mode.setup("tpu")


def test_kernels_defined_in_interpreter_mode_are_interpreted():
    out = _run(
        "from course_utils import setup; setup('interpret', quiet=True)\n"
        "import triton, triton.language as tl\n"
        "@triton.jit\n"
        "def k(x): pass\n"
        "print(type(k).__name__)"
    )
    assert out.strip() == "InterpretedFunction"


def test_size_follows_the_mode(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert mode.size(gpu=1 << 28, cpu=1 << 12) == 1 << 12
    monkeypatch.delenv("TRITON_INTERPRET")
    assert mode.size(gpu=1 << 28, cpu=1 << 12) == 1 << 28


def test_import_is_light():
    out = _run("import sys, course_utils; print('torch' in sys.modules)")
    assert out.strip() == "False", "python -m course_utils install must run without torch"
