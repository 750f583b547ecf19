"""Build the notebooks from their one text source each, and check that nothing drifted.

Sources are py:percent files (cells start with `# %%`):
- course_utils/lessons/lNN_name.py -> solutions/NN_name.ipynb and exercises/NN_name.ipynb.
  A module you can import (later lessons and the benchmarks do), with three conventions:
  `# BEGIN SOLUTION` ... `# END SOLUTION` inside a function marks what the exercise notebook replaces
  by a stub (`pass` in a @triton.jit kernel, `raise NotImplementedError` elsewhere), and a cell whose
  header is `# %% [check] 02.vector_add` becomes `check("02.vector_add", add)`;
  `# %% [progress] 02` becomes the closing summary `progress("02", globals())`; `# %% [setup]` becomes the
  cell that picks the mode (`mode = setup()`; `[setup] fp8` for lesson 07), which the module never runs.
- notebooks/src/NN_name.py -> notebooks/NN_name.ipynb, the lesson itself, as written, with one more
  convention: a cell whose header is `# %% [inline] course_utils.lessons.l03_matmul: grouped_tile matmul_configs`
  becomes a code cell holding the source of those top-level definitions (decorators and the comment lines
  right above them included, solution markers stripped), so a lesson shows the course's own code as code.
In every markdown cell, `{{...}}` placeholders are measured figures rendered from results/ (course_utils.figures).
Every generated notebook carries no outputs, no execution counts and no machine paths.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
LESSON_SOURCES = ROOT / "course_utils" / "lessons"
NOTEBOOK_SOURCES = ROOT / "notebooks" / "src"
KERNEL_DECORATORS = ("@triton.jit", "@triton.autotune", "@triton.heuristics")
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


@dataclass
class Cell:
    kind: str  # "code", "markdown", "check" (one exercise), "progress" (a lesson's summary), "inline"
    text: str
    exercise: str = ""  # the exercise id of a check cell, the lesson of a progress cell, an inline's spec


def parse(text: str) -> list[Cell]:
    """Split a py:percent source into cells."""
    cells: list[Cell] = []
    header, lines = None, []

    def flush():
        if header is None:
            return
        body = "\n".join(lines).strip("\n")
        if header.startswith("[markdown]"):
            md = "\n".join(re.sub(r"^# ?", "", line) for line in body.splitlines())
            cells.append(Cell("markdown", md))
        elif header.startswith(("[check]", "[progress]", "[inline]", "[setup]")):
            kind, arg = header[1:].split("]", 1)
            cells.append(Cell(kind, "", arg.strip()))
        elif body:
            cells.append(Cell("code", body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            header, lines = line[4:].strip(), []
        elif header is not None:
            lines.append(line)
    flush()
    return cells


def _enclosing_def_is_kernel(lines: list[str], index: int) -> tuple[bool, str]:
    """Is the function around lines[index] a Triton kernel? Returns (kernel?, function name)."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    for j in range(index - 1, -1, -1):
        stripped = lines[j].lstrip()
        if stripped.startswith("def ") and len(lines[j]) - len(stripped) < indent:
            name = stripped[4:].split("(", 1)[0]
            k = j - 1
            while k >= 0 and lines[k].lstrip().startswith("@"):
                if lines[k].strip().startswith(KERNEL_DECORATORS):
                    return True, name
                k -= 1
            return False, name
    raise ValueError(f"a SOLUTION region must sit inside a function (line {index + 1}: {lines[index]!r})")


def stub(code: str) -> str:
    """Replace every BEGIN/END SOLUTION region by the stub a student starts from."""
    lines = code.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "# BEGIN SOLUTION":
            pad = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            kernel, name = _enclosing_def_is_kernel(lines, i)
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "# END SOLUTION"), None)
            if end is None:
                raise ValueError(f"BEGIN SOLUTION without END SOLUTION in {name}")
            if kernel:
                out.append(f"{pad}pass  # YOUR CODE HERE")
            else:
                out.append(f"{pad}# YOUR CODE HERE")
                out.append(f'{pad}raise NotImplementedError("{name}: not written yet")')
            i = end + 1
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def solve(code: str) -> str:
    """The solution: the same code with the markers removed."""
    return "\n".join(line for line in code.splitlines()
                     if line.strip() not in ("# BEGIN SOLUTION", "# END SOLUTION"))


def _func_name(exercise_id: str) -> str:
    from .grading import load_all

    return load_all()[exercise_id].func_name


NOQA = re.compile(r"[ \t]+# noqa(: [A-Z0-9, ]+)?$", re.M)  # linter hints: for the sources, not students


def repository_url() -> str:
    """The course's repository, named once: in pyproject.toml's [project.urls]."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def bootstrap_cell() -> str:
    """First cell of every notebook: on Colab (no course_utils yet) fetch the course; locally nothing.

    The repository comes from pyproject.toml's [project.urls] Repository, or from the COURSE_REPO
    environment variable (a fork); when it cannot be cloned the cell stops with what to set, and where.
    """
    return f"""# Colab or a fresh machine: fetch the course package once. In a local checkout this does nothing.
import importlib.util

if importlib.util.find_spec("course_utils") is None:
    import importlib
    import os
    import subprocess
    import sys

    repo = os.environ.get("COURSE_REPO", "{repository_url()}")
    clone = subprocess.run(["git", "clone", "-q", "--depth", "1", repo, "course"], capture_output=True, text=True)
    if clone.returncode != 0:
        raise RuntimeError(
            f"could not clone the course from {{repo}}: {{clone.stderr.strip()[-300:]}}\\n"
            "Set the repository URL: run `%env COURSE_REPO=https://github.com/OWNER/REPO` in a cell above "
            "(a fork, or a mirror), or, as a maintainer, set [project.urls] Repository in pyproject.toml "
            "and rebuild the notebooks (python -m course_utils build).")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "./course"], check=True)
    importlib.invalidate_caches()"""


def inline_source(spec: str) -> str:
    """The source of top-level definitions of a course module: "course_utils.lessons.l03_matmul: a b"."""
    module, _, names = spec.partition(":")
    path = ROOT.joinpath(*module.strip().split(".")).with_suffix(".py")
    if not path.is_file() or not names.split():
        raise ValueError(f"[inline] {spec!r}: write `[inline] course_utils.module.path: name1 name2`")
    lines = path.read_text().splitlines()
    nodes = {}
    for node in ast.parse("\n".join(lines)).body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        for name in [getattr(node, "name", None), *targets]:
            if name:
                nodes[name] = node
    pieces = []
    for name in names.split():
        if name not in nodes:
            raise ValueError(f"[inline] {module.strip()} has no top-level {name!r}")
        node = nodes[name]
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#") and not lines[start - 1].startswith("# %%"):
            start -= 1  # the comment lines right above a definition belong to it
        pieces.append("\n".join(lines[start:node.end_lineno]))
    return solve("\n\n\n".join(pieces))


def setup_cell(variant: str) -> str:
    """The cell that picks the mode in a notebook (a module never does it at import: see course_utils.mode)."""
    if variant == "fp8":
        return ("from course_utils import setup\nfrom course_utils.fp8 import fp8_mode\n\n"
                "# A GPU without FP8 dots (older than sm_89) runs this lesson in the interpreter; fp8_mode() says why.\n"
                "mode = setup(fp8_mode())")
    if variant:
        raise ValueError(f"unknown [setup] variant {variant!r} (none, or fp8)")
    return ("from course_utils import setup\n\n"
            "mode = setup()  # a CUDA GPU, or Triton's interpreter on the CPU: before any kernel is defined")


def to_notebook(cells: list[Cell], *, exercise: bool | None, stem: str = "") -> nbformat.NotebookNode:
    """exercise=None: a lesson (cells as written); True: stubs; False: solutions. `stem` names the
    lesson whose results/ the markdown placeholders read."""
    from .figures import render as render_figures

    nb = nbformat.v4.new_notebook(metadata=dict(METADATA))
    nb.cells.append(nbformat.v4.new_code_cell(bootstrap_cell()))
    for cell in cells:
        if cell.kind == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(render_figures(cell.text, stem) if stem else cell.text))
        elif cell.kind == "setup":
            nb.cells.append(nbformat.v4.new_code_cell(setup_cell(cell.exercise)))
        elif cell.kind == "inline":
            nb.cells.append(nbformat.v4.new_code_cell(NOQA.sub("", inline_source(cell.exercise))))
        elif cell.kind == "check":
            nb.cells.append(nbformat.v4.new_code_cell(f'check("{cell.exercise}", {_func_name(cell.exercise)})'))
        elif cell.kind == "progress":
            nb.cells.append(nbformat.v4.new_markdown_cell("## Progress"))
            nb.cells.append(nbformat.v4.new_code_cell(f'progress("{cell.exercise}", globals())'))
        else:
            text = cell.text if exercise is None else (stub(cell.text) if exercise else solve(cell.text))
            nb.cells.append(nbformat.v4.new_code_cell(NOQA.sub("", text)))
    for i, c in enumerate(nb.cells):  # stable ids keep the files identical from build to build
        c["id"] = f"cell-{i:03d}"
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def targets() -> dict[Path, str]:
    """Every generated file (notebooks, README sections, results/README.md) and its expected text."""
    out = {}
    for src in sorted(LESSON_SOURCES.glob("l[0-9][0-9]_*.py")):
        stem = src.stem[1:]
        cells = parse(src.read_text())
        out[ROOT / "solutions" / f"{stem}.ipynb"] = render(to_notebook(cells, exercise=False, stem=stem))
        out[ROOT / "exercises" / f"{stem}.ipynb"] = render(to_notebook(cells, exercise=True, stem=stem))
    for src in sorted(NOTEBOOK_SOURCES.glob("[0-9][0-9]_*.py")):
        cells = parse(src.read_text())
        out[ROOT / "notebooks" / f"{src.stem}.ipynb"] = render(to_notebook(cells, exercise=None, stem=src.stem))
    from .results_table import generated

    out.update(generated(repository_url()))  # README's course map and results table, results/README.md
    return out


MACHINE_PATH = re.compile(r"(/home/|/Users/|/root/|/tmp/|/work/|C:\\\\Users)")


def hygiene(path: Path) -> list[str]:
    """Problems of one committed notebook: outputs, execution counts, machine paths, inline images."""
    problems = []
    text = path.read_text()
    nb = json.loads(text)
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("outputs"):
            problems.append(f"{path.name}: cell {i} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"{path.name}: cell {i} has an execution count")
        source = "".join(cell.get("source", ""))
        if MACHINE_PATH.search(source):
            problems.append(f"{path.name}: cell {i} names a machine path")
        if "data:image" in source or cell.get("attachments"):
            problems.append(f"{path.name}: cell {i} embeds an image (put it under notebooks/img/)")
    return problems


def build(check: bool = False) -> list[str]:
    """Write every generated notebook, or with check=True report drift and hygiene problems."""
    problems = []
    expected = targets()
    for path, text in expected.items():
        if check:
            if not path.exists():
                problems.append(f"{path.relative_to(ROOT)} is missing: run `python -m course_utils build`")
            elif path.read_text() != text:
                problems.append(f"{path.relative_to(ROOT)} differs from its source: run `python -m course_utils build`")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for folder in ("notebooks", "exercises", "solutions"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            if path not in expected:
                problems.append(f"{path.relative_to(ROOT)} has no source")
            problems += hygiene(path)
    return problems
