"""The lesson form: code in code cells, no exercise's answer in a lesson, links both ways, measured figures
rendered from results/ (see the README's maintainers' section for the rules)."""
from __future__ import annotations

import builtins
import json
import re
import symtable
from pathlib import Path
from urllib.parse import unquote

import pytest

from course_utils import build, figures

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SOLVED = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
ALL = LESSONS + SOLVED + sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
MIN_LINE = 25  # shorter lines (`mask = offs < n`) are shared by every kernel and prove nothing


def cells(path: Path, kind: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == kind]


def code_lines(path: Path) -> set[str]:
    return {line.strip() for cell in cells(path, "code") for line in cell.splitlines()
            if len(line.strip()) >= MIN_LINE and not line.strip().startswith("#")}


def solution_only_lines(stem: str) -> set[str]:
    """The lines an exercise's answer has and its stub has not: what a lesson must never show."""
    return code_lines(ROOT / "solutions" / f"{stem}.ipynb") - code_lines(ROOT / "exercises" / f"{stem}.ipynb")


def shown_answers(lesson: Path) -> list[str]:
    answers = solution_only_lines(lesson.stem) if (ROOT / "solutions" / lesson.name).exists() else set()
    return sorted(answers & code_lines(lesson))


@pytest.mark.parametrize("lesson", [p for p in LESSONS if (ROOT / "solutions" / p.name).exists()], ids=lambda p: p.stem)
def test_no_lesson_shows_an_exercise_answer(lesson):
    answers = solution_only_lines(lesson.stem)
    shown = shown_answers(lesson)
    assert answers, "the solution notebook has answer lines the exercise notebook lacks"
    assert len(shown) <= len(answers) // 10, (
        f"{lesson.name} shows {len(shown)} of the {len(answers)} lines only the solutions have, e.g.\n"
        + "\n".join(shown[:8]))


def test_the_no_answers_rule_catches_a_printed_solution(tmp_path):
    """Inlining an exercise's solution into a lesson is caught (the rule can fail)."""
    solved = json.loads((ROOT / "solutions" / "02_first_kernels.ipynb").read_text())
    lesson = json.loads((ROOT / "notebooks" / "02_first_kernels.ipynb").read_text())
    lesson["cells"] += [c for c in solved["cells"] if c["cell_type"] == "code"]
    fake = tmp_path / "02_first_kernels.ipynb"
    fake.write_text(json.dumps(lesson))
    assert len(solution_only_lines("02_first_kernels") & code_lines(fake)) == len(solution_only_lines("02_first_kernels"))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_lesson_prints_source(path):
    for cell in cells(path, "code"):
        assert "getsource" not in cell, f"{path.name} prints source; inline it with a [inline] cell instead"


def anchors(path: Path) -> set[str]:
    """Heading anchors as JupyterLab and GitHub make them: the heading text, spaces -> '-'."""
    found = set()
    for cell in cells(path, "markdown"):
        for line in cell.splitlines():
            heading = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
            if heading:
                text = re.sub(r"\{\{.*?\}\}", "", heading.group(1))
                found.add(text.replace(" ", "-"))
                found.add(re.sub(r"[^\w\- ]", "", text).strip().lower().replace(" ", "-"))  # GitHub's form
    return found


LINK = re.compile(r"\]\((\.\./(?:notebooks|exercises|solutions)/[^)#\s]+\.ipynb|[0-9]{2}_[a-z0-9_]+\.ipynb)(?:#([^)\s]+))?\)")


def links(path: Path) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for cell in cells(path, "markdown") for m in LINK.finditer(cell)]


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_link_resolves_to_a_notebook_and_heading(path):
    for target, anchor in links(path):
        notebook = (path.parent / target).resolve()
        assert notebook.exists(), f"{path.name} links {target}, which does not exist"
        if anchor:
            assert unquote(anchor) in anchors(notebook), (
                f"{path.name} links {target}#{anchor}, a heading {notebook.name} does not have")


@pytest.mark.parametrize("exercise_notebook", sorted((ROOT / "exercises").glob("*.ipynb")), ids=lambda p: p.stem)
def test_links_both_ways(exercise_notebook):
    """Each exercise links its lesson section, and the lesson links the exercise notebook."""
    lesson = ROOT / "notebooks" / exercise_notebook.name
    ids = re.findall(r'^check\("([0-9]{2}\.[a-z0-9_]+)"', "\n".join(cells(exercise_notebook, "code")), re.M)
    text = "\n\n".join(cells(exercise_notebook, "markdown"))
    sections = re.split(r"^## ", text, flags=re.M)
    for exercise_id in ids:
        section = next((s for s in sections if s.startswith(exercise_id)), "")
        assert f"../notebooks/{lesson.name}#" in section, f"{exercise_id}: its exercise cell links no lesson section"
    lesson_targets = {Path(target).name for target, _ in links(lesson)}
    assert exercise_notebook.name in lesson_targets, f"{lesson.name} never links its exercises"


def sources() -> list[Path]:
    return sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")) + sorted(
        (ROOT / "course_utils" / "lessons").glob("l[0-9][0-9]_*.py"))


@pytest.mark.parametrize("source", sources(), ids=lambda p: p.stem)
def test_measured_figures_are_rendered_from_results(source):
    typed = [f for cell in build.parse(source.read_text()) if cell.kind == "markdown"
             for f in figures.typed_figures(cell.text)]
    assert not typed, f"{source.name} types measured figures into prose; use results placeholders: {typed}"


def test_typed_figures_rule():
    assert figures.typed_figures("ours ran at 0.81 x cuBLAS and 412 TFLOP/s") == ["0.81 x", "412 TFLOP/s"]
    assert figures.typed_figures("it took 1.07 ms.") == ["1.07 ms"]
    assert figures.typed_figures("The H100's datasheet says 3.35 TB/s.") == []
    assert figures.typed_figures("ours: {{ms:add|triton (ours)}}") == []


def test_placeholders_render_and_a_missing_figure_fails():
    data = figures.load("02_first_kernels")
    target = data["targets"][0]
    text = f"{{{{ratio:{target['group']}|{target['ours']}|{target['peer']}}}}} ({{{{measured}}}})"
    rendered = figures.render(text, "02_first_kernels")
    assert f"{target['ratio']:.2f} x" in rendered and data["device"] in rendered
    with pytest.raises(figures.MissingFigure):
        figures.render("{{ms:no such group|nobody}}", "02_first_kernels")


def test_inline_cells_hold_the_course_code():
    source = build.inline_source("course_utils.lessons.l02_first_kernels: add_kernel")
    assert source.startswith("@triton.jit") and "def add_kernel" in source and "BEGIN SOLUTION" not in source
    with pytest.raises(ValueError, match="no top-level"):
        build.inline_source("course_utils.lessons.l02_first_kernels: nothing_here")


def undefined_names(code: str) -> set[str]:
    """Globals that a function of the notebook reads and no cell defines (an inlined function whose
    module imported something the notebook does not: it runs until the line that needs it)."""
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    module = symtable.symtable(code, "notebook", "exec")
    defined = {s.get_name() for s in module.get_symbols() if s.is_assigned() or s.is_imported()}
    defined |= set(dir(builtins)) | {"__file__", "get_ipython", "display"}
    missing, tables = set(), list(module.get_children())
    while tables:
        table = tables.pop()
        tables += table.get_children()
        missing |= {s.get_name() for s in table.get_symbols()
                    if s.is_referenced() and s.is_global() and s.get_name() not in defined}
    return missing


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_name_a_function_reads_is_defined(path):
    assert not undefined_names("\n".join(cells(path, "code"))), path.name


def test_the_undefined_names_rule_can_fail():
    assert undefined_names("import json\ndef f(marks):\n    return bisect.bisect(marks, json.loads('1'))") == {"bisect"}


STUDENT_WORDING = re.compile(r"\bthe design\b|\bdesign notes\b|\bdesign's\b", re.I)  # students have no design


@pytest.mark.parametrize("notebook", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_student_text_speaks_of_targets_not_of_the_design(notebook):
    """Students never read the course's design: a target is stated with its reason, not as 'the design'."""
    said = [m.group(0) for cell in cells(notebook, "markdown") + cells(notebook, "code")
            for m in STUDENT_WORDING.finditer(cell)]
    assert not said, f"{notebook.parent.name}/{notebook.name} speaks of the design: {said}"


def test_host_hints_say_outside_the_kernel():
    """torch on a GPU tensor runs on the GPU: a hint about host-side computation says where it does not
    belong (outside the kernel), never that torch ran 'on the host'."""
    from course_utils.grading import exercises

    wrong = {ex.id: ex.hint["host"] for ex in exercises() if "on the host" in ex.hint.get("host", "")}
    assert not wrong, wrong
