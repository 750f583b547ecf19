"""GPU benchmarks, one module per lesson (`lNN_name.py` with `run(table)`), run by `python -m course_utils bench`.

Each `run` checks every kernel it times against a reference first, times ours and the peers side
by side in one process with `table.time(...)` (and `table.time_peers(...)`), and records the targets
with `table.target(...)`. A bench that fails keeps what it measured, with the error in its notes and
`table.error`, and never stops the benches of other lessons.
"""
from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import time
import traceback

from ..bench import Table, save
from ..lessons_index import lesson as lesson_record


def available() -> list[str]:
    return sorted(info.name[1:3] for info in pkgutil.iter_modules(__path__) if info.name.startswith("l"))


def run(lesson: str, write: bool = True) -> Table:
    """Run one lesson's bench into a fresh Table (written to results/ unless write=False)."""
    table = Table(lesson)
    start = time.perf_counter()
    try:
        module = importlib.import_module(f"{__name__}.{lesson_record(lesson).module}")
        module.run(table, **_quick_arguments(module.run))
    except Exception as exc:  # noqa: BLE001 - one lesson's failure is reported, the others still run
        where = traceback.extract_tb(exc.__traceback__)[-1]
        table.error = f"{type(exc).__name__}: {str(exc).strip()[:300]} ({where.filename.split('/')[-1]}:{where.lineno})"
        table.notes.append(f"bench FAILED after {time.perf_counter() - start:.0f} s: {table.error}")
        traceback.print_exc()
    finally:
        _release()
    table.show()
    print(f"bench {lesson}: {'FAILED' if table.error else 'done'} in {time.perf_counter() - start:.0f} s", flush=True)
    if write:
        print(f"wrote {save(table)}")
    return table


def _quick_arguments(run_fn) -> dict:
    """COURSE_BENCH_QUICK=1: the targets without the configuration sweeps (a second GPU, a short lease)."""
    if os.environ.get("COURSE_BENCH_QUICK") != "1":
        return {}
    params = inspect.signature(run_fn).parameters
    return {key: value for key, value in (("quick", True), ("sweep", False)) if key in params}


def run_all(lessons: list[str]) -> bool:
    """`python -m course_utils bench [LESSON...]`: every lesson's bench, each on its own; True if all ran."""
    return all([not run(lesson).error for lesson in lessons or available()])


def _release() -> None:
    """Free what one lesson's bench held (GPU memory, torch.compile's caches) before the next."""
    import gc

    gc.collect()
    try:
        import torch

        torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001, S110 - a broken CUDA context shows in the next bench's error
        pass
