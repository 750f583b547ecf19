"""`python -m course_utils prove [LESSON...]`: the release check on a GPU machine.

For each lesson: execute the lesson notebook and the solution notebook top to bottom (fresh kernels,
in a scratch copy, so nothing in the checkout changes), then run the lesson's benchmarks, which write
results/<lesson>.json and its plot. Finally results/README.md is regenerated from every JSON file.
One lesson fits in well under 10 minutes, so the command can be run lesson by lesson.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from .lessons_index import LESSONS, course_root


def execute(path: Path, timeout: int = 600) -> tuple[bool, float, str]:
    """Run a notebook in a fresh kernel, in a scratch folder; (ok, seconds, error summary)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    # The kernel runs in a scratch folder: it finds this checkout's course_utils through PYTHONPATH, also
    # where the package is not pip-installed (a GPU machine that received the checkout as files).
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(course_root()) not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(course_root()), *entries]))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / path.name
        shutil.copy(path, copy)
        nb = nbformat.read(copy, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": scratch}})
        try:
            client.execute()
        except CellExecutionError as exc:
            # the log gets the failing cell's traceback (its last lines, colours stripped); the results one line
            print(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()[-4000:], flush=True)
            return False, time.perf_counter() - start, str(exc).strip().splitlines()[-1][:300]
        except Exception as exc:  # a dead kernel, a timeout
            return False, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"[:300]
    return True, time.perf_counter() - start, ""


def prove(lessons: list[str], bench: bool = True) -> bool:
    """Execute each lesson's notebooks, then bench it. bench=False (`prove --notebooks-only`) records the
    notebook runs in this GPU's results file and keeps the figures it already holds."""
    from . import benches
    from .bench import Table, result_path, save
    from .build import repository_url
    from .results_table import write

    root = course_root()
    ok_all = True
    for lesson in lessons or list(LESSONS):
        stem = LESSONS[lesson].stem
        runs = {}
        for folder in ("notebooks", "solutions"):
            path = root / folder / f"{stem}.ipynb"
            if path.exists():
                ok, seconds, error = execute(path)
                runs[f"{folder}/{path.name}"] = {"ok": ok, "seconds": round(seconds, 1), "error": error}
                print(f"{folder}/{path.name}: {'ok' if ok else 'FAILED ' + error} ({seconds:.0f} s)", flush=True)
                ok_all &= ok
        if not bench:
            path = result_path(lesson)
            data = json.loads(path.read_text()) if path.exists() else Table(lesson).to_json()
            data["notebooks"] = runs
            path.write_text(json.dumps(data, indent=1) + "\n")
            print(f"wrote {path}")
            continue
        table = benches.run(lesson, write=False) if lesson in benches.available() else Table(lesson)
        ok_all &= not table.error
        table.notebooks = runs
        print(f"wrote {save(table)}")
    print(f"wrote {write(repository_url())}")
    return ok_all
