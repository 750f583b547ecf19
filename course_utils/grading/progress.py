"""The last cell of an exercise notebook: which exercises pass right now."""
from __future__ import annotations

from . import exercises
from .harness import REGISTRY, CheckFailed, check

REASON_WIDTH = 100  # a failure is summarized by the first line of its reason, cut to this width


class Progress(dict):
    """{exercise id: "pass" | "missing" | "fail: <reason>" | "error: <reason>"}, in notebook order.

    The table is printed by `progress`; in a notebook the returned dict itself displays as nothing,
    so the cell's output is the table alone.
    """

    def _ipython_display_(self) -> None:
        pass

    @property
    def passed(self) -> int:
        return sum(status == "pass" for status in self.values())


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_WIDTH else text[: REASON_WIDTH - 3] + "..."


def progress(lesson: str, namespace: dict) -> Progress:
    """Run the check of each exercise of `lesson` on the function of that name in `namespace`."""
    status = Progress()
    found = exercises(lesson)  # sorted by id; the registry holds them in the order they were defined
    defined = list(REGISTRY)
    for ex in sorted(found, key=lambda e: defined.index(e.id)):
        candidate = namespace.get(ex.func_name)
        if candidate is None:
            status[ex.id] = "missing"
            continue
        try:
            check(ex.id, candidate, quiet=True)
            status[ex.id] = "pass"
        except CheckFailed as exc:
            status[ex.id] = "fail: " + _short(getattr(exc, "reason", "") or str(exc).splitlines()[-1])
        except Exception as exc:  # the checker could not run (e.g. a broken CUDA context): say so, go on
            status[ex.id] = "error: " + _short(f"{type(exc).__name__}: {exc}")
    width = max(len(k) for k in status) if status else 0
    for key, value in status.items():
        print(f"{key:<{width}}  {value}")
    print(f"{status.passed}/{len(status)} exercises of lesson {lesson} pass")
    return status

