"""Mode selection and the size helper."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils import mode

ROOT = Path(__file__).resolve().parent.parent


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


def test_triton_imported_before_the_interpreter_was_chosen_is_named():
    """Triton's own @triton.jit helpers (tl.zeros, tl.sum) are built when triton.language is imported:
    imported before setup() chose the interpreter, they are GPU functions that a correct interpreted kernel
    cannot call ("Cannot call @triton.jit'd outside of the scope of a kernel"). setup() says so; in the
    right order it says nothing."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_MODE")}
    setup = "from course_utils import setup; setup('interpret', quiet=True)"
    for code, warned in ((f"import triton\n{setup}", True), (f"{setup}\nimport triton\n{setup}", False)):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ,
                                check=True)
        assert ("triton was imported before setup()" in result.stderr) == warned, result.stderr


def test_the_grader_s_modules_import_triton_only_after_setup():
    """The sandbox imports the checker, then calls setup(): a module of the checker that imported triton at
    its top built Triton's helpers for the wrong mode, and every kernel in the sandbox failed."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_MODE")}
    code = ("import sys\nimport course_utils.grading.harness, course_utils.grading.progress, "
            "course_utils.grading.verdicts, course_utils.grading.remote\nprint('triton' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, check=True)
    assert result.stdout.strip() == "False", result.stderr


def test_size_follows_the_mode(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert mode.size(gpu=1 << 28, cpu=1 << 12) == 1 << 12
    monkeypatch.delenv("TRITON_INTERPRET")
    assert mode.size(gpu=1 << 28, cpu=1 << 12) == 1 << 28


def test_import_is_light():
    out = _run("import sys, course_utils; print('torch' in sys.modules)")
    assert out.strip() == "False", "python -m course_utils install must run without torch"


def test_half_dtype_bf16_from_ampere_fp16_on_a_t4_and_in_the_interpreter(monkeypatch):
    import torch

    assert mode.half_dtype((7, 5)) is torch.float16
    assert mode.half_dtype((8, 0)) is torch.bfloat16 and mode.half_dtype((9, 0)) is torch.bfloat16
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert mode.half_dtype() is torch.float16  # the interpreter cannot compute in bf16


# A top-level dtype or size choice: `x = half_dtype()...`, `B, H = size(...)`, `dtype = A if cond else torch.B`.
CHOICE = re.compile(r"^(?P<name>\w+(?:, \w+)*) = (?:.*\bhalf_dtype\(\).*|size\(.*\)|[\w.]+ if .+ else torch\.\w+)"
                    r"\s*(?:#.*)?$", re.M)


@pytest.mark.parametrize("capability, half", [((7, 5), "float16"), ((9, 0), "bfloat16")])
def test_lesson_sources_pick_dtypes_and_sizes_for_the_gpu_they_run_on(monkeypatch, capability, half):
    """The top-level dtype and size lines of every lesson source, run as on a T4 and on an H100."""
    import torch

    import course_utils

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    gpu = mode.Mode("gpu", "cuda", "mocked")
    picked, sized = {}, 0
    for src in sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")):
        text = src.read_text()
        assert not re.search(r"= torch\.bfloat16 if", text), f"{src.name}: pick bf16 through half_dtype()"
        namespace = {"torch": torch, "mode": gpu, "size": course_utils.size, "half_dtype": mode.half_dtype}
        for match in CHOICE.finditer(text):
            try:
                exec(match.group(0), namespace)  # noqa: S102 - the lesson's own line
            except NameError:
                continue  # depends on a value computed elsewhere in the lesson
            sized += "size(" in match.group(0)
            for name in match["name"].split(", "):
                if "half_dtype" in match.group(0) or namespace.get(name) in (torch.bfloat16, torch.float16):
                    picked[f"{src.stem}: {name}"] = namespace[name]
    chosen = {k: v for k, v in picked.items() if v in (torch.bfloat16, torch.float16)}
    assert sized >= 5 and len(chosen) >= 3, (sized, picked)
    through_helper = [k for k in chosen if k.split(": ")[1] in ("half", "out_dtype", "act")]
    assert through_helper and all(chosen[k] is getattr(torch, half) for k in through_helper), chosen
    assert not any(v is torch.bfloat16 for v in chosen.values()) or half == "bfloat16", chosen


def test_the_colab_bootstrap_says_what_to_set_when_the_repository_is_unreachable(tmp_path, monkeypatch):
    import importlib.util

    from course_utils.build import bootstrap_cell

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COURSE_REPO", str(tmp_path / "no-such-repository"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # as on Colab: no course_utils
    with pytest.raises(RuntimeError) as error:
        exec(bootstrap_cell(), {})  # noqa: S102 - the cell every notebook starts with
    message = str(error.value)
    assert "no-such-repository" in message and "COURSE_REPO" in message
    assert "[project.urls] Repository" in message and "pyproject.toml" in message


def test_mode_and_fp8_modules_do_not_import_each_other():
    import ast

    def imports(name: str) -> set[str]:
        tree = ast.parse((ROOT / "course_utils" / f"{name}.py").read_text())
        return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}

    assert "fp8" not in imports("mode") and "fp8_interpreter" in imports("mode")
    assert not imports("fp8_interpreter") & {"mode", "fp8"}
    assert "build" not in imports("results_table")


def test_the_doctor_command_picks_a_mode_and_runs_the_tiny_kernel():
    """`python -m course_utils doctor` on a fresh process: no mode set beforehand, no GPU needed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_MODE")}
    result = subprocess.run([sys.executable, "-m", "course_utils", "doctor"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tiny kernel   ok" in result.stdout


@pytest.mark.parametrize("triton_version, numpy_version, says", [
    ("3.5.0", "2.3.5", "launches kernels past what check() counts"), ("3.6.0", "2.4.6", "numpy 2.4.6"),
    ("3.6.0", "2.3.5", None), ("3.7.1", "2.4.6", None), ("3.10.0+git1a2b", "2.5.0", None)])
def test_an_interpreter_that_cannot_run_the_course_is_named_with_what_to_install(
        monkeypatch, triton_version, numpy_version, says):
    import numpy
    import triton

    monkeypatch.setattr(triton, "__version__", triton_version)
    monkeypatch.setattr(numpy, "__version__", numpy_version)
    why = mode.interpreter_too_old()
    if says is None:
        assert why is None
    else:
        assert triton_version in why and says in why and "pip install triton==3.9.0" in why


def test_setup_and_the_doctor_warn_of_an_interpreter_too_old():
    code = ("import triton; triton.__version__ = '3.5.0'; from course_utils import setup; setup('interpret'); "
            "from course_utils.doctor import doctor; print('doctor ok' if doctor() else 'doctor says no')")
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_MODE")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, check=True)
    assert "warning: triton 3.5.0's interpreter" in done.stderr
    assert "PROBLEM: triton 3.5.0's interpreter" in done.stdout and "doctor says no" in done.stdout


def test_check_with_an_interpreter_whose_launches_it_cannot_count_says_what_to_install(monkeypatch):
    """Before triton 3.6 an interpreted launch went straight to a GridExecutor, past any run method: the
    checker would see no launch at all and blame the student. It says what to install instead."""
    import triton
    import triton.runtime.interpreter as interpreter

    from course_utils.grading import check
    from course_utils.grading.provenance import course_solutions_allowed
    from course_utils.lessons.l02_first_kernels import add

    if not mode.current().interpret:
        pytest.skip("the interpreter's launch path")
    monkeypatch.setattr(triton, "__version__", "3.5.0")
    monkeypatch.setattr(interpreter, "InterpretedFunction", type("InterpretedFunction", (), {}))
    with pytest.raises(RuntimeError, match=r"triton 3\.5\.0's interpreter .*pip install triton==3\.9\.0"):
        with course_solutions_allowed():
            check("02.vector_add", add, seed=0, quiet=True)


def test_no_test_module_forces_a_mode():
    """conftest picks the machine's mode once (the GPU when there is one). A test module that called
    setup("interpret") at import would switch every module collected after it to the interpreter's CPU
    tensors, while their kernels were already built for the GPU: on a GPU the whole suite after it fails."""
    import ast

    forced = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            call = node.value if isinstance(node, ast.Expr) else None
            if isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", "")) == "setup":
                if call.args or any(k.arg == "mode" for k in call.keywords):
                    forced.append(f"{path.name}:{node.lineno}")
    assert not forced, f"modules that force a mode at import: {forced}"
