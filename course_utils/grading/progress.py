"""The last cell of an exercise notebook: which exercises pass right now, and where each is taught."""
from __future__ import annotations

import functools
import re
from pathlib import Path

from ..mode import current
from . import exercises, verdicts
from .harness import MEASURED, REGISTRY, SOLUTION_MEASURED, CheckFailed, check, speed_line, with_stand_in_roofs

REASON_WIDTH = 100  # a failure is summarized by the first line of its reason, cut to this width
NOT_RUN = "not run yet: run the cells above"
ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "notebooks" / "src"


class Progress(dict):
    """{exercise id: "pass" | NOT_RUN | "fail: <reason>" | "error: <reason>"}, in notebook order.

    The table is printed by `progress` (in a notebook: shown as a table that links each exercise to its
    lesson section); the returned dict itself displays as nothing, so the cell's output is the table alone.
    """

    kept = 0  # passes kept from this session's checks, not run again

    def _ipython_display_(self) -> None:
        pass

    @property
    def passed(self) -> int:
        return sum(status == "pass" for status in self.values())


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_WIDTH else text[: REASON_WIDTH - 3] + "..."


def heading_anchor(heading: str) -> str:
    """The anchor Jupyter gives a markdown heading: its text as rendered (no #, no backticks or
    emphasis marks), spaces turned into hyphens."""
    text = re.sub(r"^#+\s*", "", heading.strip())
    text = re.sub(r"[`*]", "", text).strip()
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def lesson_link(exercise_id: str) -> str | None:
    """The relative link from an exercise notebook to the lesson section that teaches `exercise_id`:
    `../notebooks/NN_name.ipynb#anchor` of the first markdown heading of notebooks/src/NN_*.py that
    names the exercise id; the notebook alone when no heading does; None when there is no lesson."""
    lesson = exercise_id.split(".", 1)[0]
    sources = sorted(SOURCES.glob(f"{lesson}_*.py"))
    if not sources:
        return None
    source = sources[0]
    target = f"../notebooks/{source.stem}.ipynb"
    for line in source.read_text().splitlines():
        heading = re.match(r"^#\s+(#{1,6}\s.*)$", line)
        if heading and exercise_id in heading.group(1):
            return f"{target}#{heading_anchor(heading.group(1))}"
    return target


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _show(status: Progress, lesson: str) -> None:
    summary = f"{status.passed}/{len(status)} exercises of lesson {lesson} pass"
    kept = (f"{status.kept} of them as checked above, unchanged since; progress(\"{lesson}\", globals(), "
            "recheck=True) checks them again" if status.kept else "")
    if _in_notebook():
        from IPython.display import Markdown, display

        rows = ["| exercise | status |", "|---|---|"]
        for key, value in status.items():
            link = lesson_link(key)
            name = f"[{key}]({link})" if link else key
            rows.append(f"| {name} | {value.replace('|', '/')} |")
        display(Markdown("\n".join(rows) + f"\n\n{summary}" + (f"\n\n{kept}" if kept else "")))
        return
    width = max(len(k) for k in status) if status else 0
    for key, value in status.items():
        link = lesson_link(key) if value != "pass" else None
        print(f"{key:<{width}}  {value}" + (f"  (lesson: {link})" if link else ""))
    print(summary)
    if kept:
        print(kept)


def _roofline(lesson: str, status: Progress, namespace: dict) -> list:
    """On a GPU: time each passing kernel beside the course's solution and place both on the device's
    measured roofline (a figure); returns the points placed."""
    points = []
    for key, value in status.items():
        ex = REGISTRY[key]
        if value == "pass" and ex.speed is not None:
            MEASURED.pop(key, None)
            print(f"{key}: {speed_line(ex, namespace[ex.func_name])}")
            if key in MEASURED:
                points.append(MEASURED[key])
                if key in SOLUTION_MEASURED:
                    points.append(SOLUTION_MEASURED[key])
    if not points:
        return points
    from ..roofline import device_ceilings, plot_roofline

    ceilings = with_stand_in_roofs(device_ceilings(), {p.roof for p in points})
    plot_roofline(ceilings, points,
                  title=f"lesson {lesson}: your kernels and the course's solutions on this GPU's roofline")
    if _in_notebook():
        import matplotlib.pyplot as plt

        plt.show()
    return points


def progress(lesson: str, namespace: dict, recheck: bool = False) -> Progress:
    """Run the check of each exercise of `lesson` on the function of that name in `namespace`; a function
    that passed its check in this session and has not changed since keeps its pass (see verdicts.py)
    unless `recheck`."""
    status = Progress()
    found = exercises(lesson)  # sorted by id; the registry holds them in the order they were defined
    defined = list(REGISTRY)
    for ex in sorted(found, key=lambda e: defined.index(e.id)):
        candidate = namespace.get(ex.func_name)
        if candidate is None:
            status[ex.id] = NOT_RUN
            continue
        if not recheck and verdicts.still_passes(ex.id, candidate):
            status[ex.id] = "pass"
            status.kept += 1
            continue
        try:
            check(ex.id, candidate, quiet=True)
            status[ex.id] = "pass"
        except CheckFailed as exc:
            status[ex.id] = "fail: " + _short(getattr(exc, "reason", "") or str(exc).splitlines()[-1])
        except Exception as exc:  # the checker could not run (e.g. a broken CUDA context): say so, go on
            status[ex.id] = "error: " + _short(f"{type(exc).__name__}: {exc}")
    _show(status, lesson)
    if current().gpu:
        try:
            _roofline(lesson, status, namespace)
        except Exception as exc:  # the plot is a bonus
            print(f"roofline: not drawn ({type(exc).__name__}: {exc})")
    return status
