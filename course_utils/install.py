"""Set up the course in a local virtual environment, with nothing but Python and pip (stdlib only).

- No GPU: the CPU build of torch and Triton's interpreter (`torch==2.13.0`, `triton==3.9.0`).
- A GPU, and a Python whose torch already sees it (a lab image, a cluster module): the environment
  sees those packages (`--system-site-packages`) and keeps them.
- A GPU and no torch yet: pip's default torch and triton for the GPU.
The environment is reinstalled only when pyproject.toml or the mode changed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
CPU_PINS = ["torch==2.13.0", "triton==3.9.0"]
CHROMIUM = "/usr/bin/chromium"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def _system_torch_sees_gpu() -> bool:
    probe = "import torch, triton; raise SystemExit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def _run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


# Debian packages the tests use: the browser that Playwright drives (JupyterLab, Netron), and the sandbox
# the batch grader runs each submission in. Installed as root where apt-get exists; elsewhere the tests
# that need them skip and the grader warns loudly.
DEBIAN_PACKAGES = {"chromium": CHROMIUM, "bubblewrap": "/usr/bin/bwrap"}


def _install_debian_packages() -> None:
    missing = [name for name, path in DEBIAN_PACKAGES.items() if not Path(path).exists()]
    if not missing:
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        print(f"note: {', '.join(missing)} not installed (needs apt-get as root); the browser tests skip and "
              "the grader runs without its sandbox")
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)


def install(tests: bool = False) -> Path:
    """Create or refresh .venv; returns its python. tests=True also installs Chromium for the Netron test."""
    gpu = _has_gpu()
    keep_system = gpu and _system_torch_sees_gpu()
    mode = "gpu-system" if keep_system else ("gpu" if gpu else "cpu")
    # One environment serves both commands (pytest is small), so `lab` never rebuilds what `test` made.
    extras = "lab,test"
    stamp_text = hashlib.sha256(((ROOT / "pyproject.toml").read_bytes() + mode.encode())).hexdigest()
    stamp = VENV / ".course-installed"
    if tests:
        _install_debian_packages()
    if stamp.exists() and stamp.read_text() == stamp_text and venv_python().exists():
        return venv_python()
    # A new mode (e.g. a GPU appeared) starts the environment afresh; a changed dependency list only
    # installs what changed, so an environment in use is never emptied under its users.
    mode_file = VENV / ".course-mode"
    fresh = mode_file.exists() and mode_file.read_text() != mode
    why = {"cpu": "no GPU: the CPU build of torch, kernels in Triton's interpreter",
           "gpu": "a GPU and no torch yet: pip's CUDA build", "gpu-system": "a GPU: keeping the torch installed"}
    print(f"setting up {VENV} ({why[mode]})", flush=True)
    venv.EnvBuilder(with_pip=True, system_site_packages=keep_system, clear=fresh).create(VENV)
    mode_file.write_text(mode)
    py = str(venv_python())
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if mode == "cpu":
        _run(*pip, *CPU_PINS)
    elif mode == "gpu":
        _run(*pip, "torch", "triton")
    _run(*pip, "-e", f"{ROOT}[{extras}]")
    stamp.write_text(stamp_text)
    return venv_python()


def lab(args: list[str]) -> None:
    """Install, then start JupyterLab on the course (replaces this process)."""
    install()
    jupyter = VENV / "bin" / "jupyter"
    cmd = [str(jupyter), "lab", "--ip=127.0.0.1", f"--ServerApp.root_dir={ROOT}", *args]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    cmd.append(str(ROOT / "notebooks" / "00_setup.ipynb"))
    print("+", " ".join(cmd), flush=True)
    os.execv(cmd[0], cmd)


def test_workers() -> int:
    """How many pytest processes share the suite (pytest-xdist). Without a GPU, one per core, at most 4
    (each holds torch and Triton, about 1 GB): the interpreter's tests are single-threaded. With a GPU,
    one: some tests take tens of GB of its memory."""
    if _has_gpu():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


def test(args: list[str]) -> int:
    """Install with the test extras, then run pytest (extra args are passed on). The tests are spread over
    test_workers() processes unless the arguments say how (-n, or -p no:xdist); the tests of a module
    that share a module-scoped fixture are one xdist_group, so the fixture is made once (--dist loadgroup)."""
    py = install(tests=True)
    return subprocess.run([str(py), "-m", "pytest", *pytest_args(args)], cwd=ROOT).returncode


def pytest_args(args: list[str]) -> list[str]:
    """`args` with the spread over test_workers() processes put first, unless `args` say how to spread."""
    if any(a.startswith(("-n", "--numprocesses", "--dist")) or a.endswith("no:xdist") for a in args):
        return list(args)
    return ["-n", str(test_workers()), "--dist", "loadgroup", *args]
