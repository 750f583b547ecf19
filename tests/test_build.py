"""The one-source build: stubs, solutions, drift and notebook hygiene."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from course_utils import build

ROOT = Path(__file__).resolve().parent.parent

SOURCE = '''# %% [markdown]
# # Title
# text

# %%
@triton.jit
def k(x_ptr):
    # BEGIN SOLUTION
    tl.store(x_ptr, 1)
    # END SOLUTION


def f(x):
    """doc"""
    # BEGIN SOLUTION
    return x + 1
    # END SOLUTION

# %% [check] 02.vector_add

# %% [progress] 02
'''


def test_parse_and_stub():
    cells = build.parse(SOURCE)
    assert [c.kind for c in cells] == ["markdown", "code", "check", "progress"]
    assert cells[0].text == "# Title\ntext"
    stubbed = build.stub(cells[1].text)
    assert "tl.store" not in stubbed and "return x + 1" not in stubbed
    assert "    pass  # YOUR CODE HERE" in stubbed  # a kernel body stays valid Triton
    assert 'raise NotImplementedError("f: not written yet")' in stubbed
    assert "BEGIN SOLUTION" not in build.solve(cells[1].text)
    assert "return x + 1" in build.solve(cells[1].text)


def test_check_and_progress_cells():
    nb = build.to_notebook(build.parse(SOURCE), exercise=True)
    sources = [c.source for c in nb.cells]
    assert 'check("02.vector_add", add)' in sources
    assert 'progress("02", globals())' in sources


def test_unclosed_region_is_an_error():
    with pytest.raises(ValueError, match="END SOLUTION"):
        build.stub("def f():\n    # BEGIN SOLUTION\n    return 1\n")


def test_committed_notebooks_match_their_sources():
    assert build.build(check=True) == []


def test_hygiene_catches_outputs_and_paths(tmp_path):
    nb = json.loads(next(iter(build.targets().values())))
    nb["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "hi"}]
    nb["cells"][1]["execution_count"] = 3
    nb["cells"][1]["source"] = "open('/home/alice/data.bin')"
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    problems = " | ".join(build.hygiene(path))
    assert "outputs" in problems and "execution count" in problems and "machine path" in problems


def test_build_check_command_fails_on_drift(tmp_path):
    """`build --check` on a copy of the checkout whose exercise notebook was edited by hand: the committed
    notebooks are never touched, even when the test is interrupted."""
    import os
    import shutil

    copy = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    for folder in ("course_utils", "notebooks", "exercises", "solutions", "results"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=ignore)
    for name in ("README.md", "pyproject.toml"):
        shutil.copy2(ROOT / name, copy / name)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    command = [sys.executable, "-m", "course_utils", "build", "--check"]
    before = subprocess.run(command, capture_output=True, text=True, cwd=copy, env=env)
    assert "02_first_kernels.ipynb" not in before.stderr, before.stderr  # the copy's notebook: no drift yet
    target = copy / "exercises" / "02_first_kernels.ipynb"
    assert "YOUR CODE HERE" in target.read_text()
    target.write_text(target.read_text().replace("YOUR CODE HERE", "solved by hand"))
    result = subprocess.run(command, capture_output=True, text=True, cwd=copy, env=env)
    assert result.returncode == 1
    assert "02_first_kernels.ipynb differs from its source" in result.stderr


def test_environment_yml_names_the_pyproject_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set()
    for dep in project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds]:
        wanted.add(dep.split(">")[0].split("=")[0].split("<")[0].strip().lower())
    env = (ROOT / "environment.yml").read_text().lower()
    listed = {line.strip().lstrip("- ").strip("\"").split(">")[0].split("=")[0].split("<")[0].strip()
              for line in env.splitlines() if line.strip().startswith("- ")}
    assert wanted <= listed, f"environment.yml lacks {sorted(wanted - listed)}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = next(line.split("#")[0].strip() for line in readme.splitlines()
                   if line.startswith("python3 -m course_utils test"))
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci.splitlines()


def test_the_test_command_spreads_the_suite_unless_told_how(monkeypatch):
    """`course_utils test` runs pytest in test_workers() processes, grouping the modules whose fixtures are
    made once (--dist loadgroup); arguments that pick a spread of their own are left alone."""
    from course_utils import install

    monkeypatch.setattr(install, "_has_gpu", lambda: False)
    monkeypatch.setattr(install.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert install.pytest_args(["-k", "03_matmul"]) == ["-n", "2", "--dist", "loadgroup", "-k", "03_matmul"]
    for own in (["-n", "0"], ["-n0"], ["--numprocesses=3"], ["-p", "no:xdist"], ["--dist", "load"]):
        assert install.pytest_args(own) == own
    monkeypatch.setattr(install.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert install.pytest_args([])[:2] == ["-n", "4"]
    monkeypatch.setattr(install, "_has_gpu", lambda: True)
    assert install.pytest_args([])[:2] == ["-n", "1"]


def test_pytest_keeps_an_xdist_group_in_one_process(tmp_path):
    """--dist loadgroup holds the tests of an xdist_group mark together (the sandboxes' modules look for
    sandboxes left behind across the machine). pytest 9 ignores the group xdist 3.8 writes into a test's
    id, which split them: the test extras pin pytest below 9 until that works again."""
    (tmp_path / "test_grouped.py").write_text(
        "import os\nimport pytest\npytestmark = pytest.mark.xdist_group('g')\n"
        + "".join(f"def test_{i}():\n    print('worker', os.environ['PYTEST_XDIST_WORKER'])\n" for i in range(4)))
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                             "no:cacheprovider", "test_grouped.py"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    workers = {line.split()[0] for line in result.stdout.splitlines() if "PASSED" in line and line.startswith("[gw")}
    assert len(workers) == 1, result.stdout


def test_linter_hints_stay_in_the_sources():
    cells = build.parse("# %%\nimport torch  # noqa: E402\nx = 1  # noqa: BLE001 - a reason stays\n")
    nb = build.to_notebook(cells, exercise=False)
    assert nb.cells[1].source == "import torch\nx = 1  # noqa: BLE001 - a reason stays"
