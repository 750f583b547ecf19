"""GPU benchmarks, one module per lesson (`lNN.py` with `run(table)`), run by `python -m course_utils bench`.

Each `run` checks every kernel it times against a reference first, times ours and the peers side
by side in one process with `table.time(...)`, and records the design's targets with `table.target(...)`.
"""
from __future__ import annotations

import importlib
import pkgutil

from ..bench import Table, save
from ..lessons_index import lesson as lesson_record


def available() -> list[str]:
    return sorted(info.name[1:3] for info in pkgutil.iter_modules(__path__) if info.name.startswith("l"))


def run(lesson: str, write: bool = True) -> Table:
    module = importlib.import_module(f"{__name__}.{lesson_record(lesson).module}")
    table = Table(lesson)
    module.run(table)
    table.show()
    if write:
        print(f"wrote {save(table)}")
    return table
