"""Grade exercise notebooks: `python -m course_utils grade PATH... [--timeout S] [--report P]`.

PATH is a notebook or a folder of them (searched recursively, checkpoints skipped). Each notebook:
- is read, never written: it runs from a copy in a fresh temporary folder, which is also the
  kernel's working directory, so nothing lands next to the submission;
- runs in its own fresh kernel (`python3`, the grader's Python) with `timeout` seconds in all;
- before its first cell the grader replaces `course_utils.check` by a recording version: each
  `check("NN.id", func)` cell runs the real check on fresh random inputs (the seed is recorded),
  records pass or fail with the reason, and does not raise, so one failing exercise does not stop
  the others; cells that raise do not stop the notebook either. `progress(...)` is skipped.
The exercises of a notebook are the ids of its check cells, plus those of the course's own exercise
notebook of the same lesson (exercises/NN_*.ipynb) whose check cell was deleted ("missing").
A notebook that is no valid JSON, has no check cells, imports something missing, loops forever
("timed out") or kills its kernel ("kernel died") is reported as such, and grading goes on with the
next one.

Output: a table (submission x exercise) on stdout, and P.json (everything, including each failure's
whole message and seed) and P.csv (one row per submission). The exit code is 0 whenever grading
ran, whatever the students scored; 2 on usage errors (a path that does not exist, no notebooks).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import csv
import json
import math
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASS, FAIL, ERROR, TIMED_OUT, DIED, MISSING = "pass", "fail", "error", "timed out", "kernel died", "missing"
# Notebook-level outcomes (Submission.status).
GRADED, INVALID, NO_CHECKS, KERNEL_ERROR = "graded", "invalid notebook", "no check cells", "kernel error"

CELL_WIDTH = 60  # table cells (a failure's reason) are cut to this many characters
NOTES_WIDTH = 90
KERNEL_NAME = "python3"
VERDICTS = ".course_grade_verdicts.jsonl"  # written by the grading kernel inside the temporary folder
KERNEL_LOG = ".course_grade_kernel.log"

# `check("02.vector_add", add)`: the ids a notebook is graded on (also matches course_utils.check(...)).
CHECK_CALL = re.compile(r"""\bcheck\(\s*(['"])(\d+\.\w+)\1""")


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit code 2."""


@dataclass
class Verdict:
    status: str  # pass | fail | error | timed out | kernel died | missing
    reason: str = ""  # one line: the first problem the check found, or why there is no verdict
    detail: str = ""  # a failed check's whole message (case, seed, mismatches, hint)
    seed: int | None = None
    seconds: float | None = None

    def text(self) -> str:
        """What the table shows: "pass", "fail: <reason>", "timed out", ..."""
        explained = self.reason and self.status in (FAIL, ERROR)
        return f"{self.status}: {self.reason}" if explained else self.status


@dataclass
class Submission:
    name: str  # as shown in the table: the path relative to the folder given
    path: str
    status: str = GRADED  # graded, invalid notebook, no check cells, timed out, kernel died, kernel error
    notes: str = ""  # what happened to the notebook as a whole, e.g. "kernel died in cell 6"
    seconds: float = 0.0
    exercises: dict[str, Verdict] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        return sum(v.status == PASS for v in self.exercises.values())

    @property
    def total(self) -> int:
        return len(self.exercises)

    @property
    def score(self) -> str:
        return f"{self.passed}/{self.total}" if self.total else "-"


# --- inside the grading kernel ------------------------------------------------------------------

def install_grader(results: str, seed: int | None = None) -> None:
    """Run in the grading kernel before the student's first cell: make `check` record verdicts.

    Each call of `course_utils.check` (or `course_utils.grading.check`) runs the real check with a
    fresh seed (or `seed`), appends one JSON line to `results` and prints a one-line verdict instead
    of raising. The student's own `seed=` is ignored: grading draws its own inputs.
    """
    import json as json_
    import random
    import traceback

    import course_utils
    from course_utils import grading
    from course_utils.grading.harness import CheckFailed
    from course_utils.grading.harness import check as real_check

    draw = random.SystemRandom()  # independent of any random.seed(...) in the student's notebook

    def record(verdict: dict) -> None:
        with open(results, "a", encoding="utf-8") as f:
            f.write(json_.dumps(verdict) + "\n")
            f.flush()

    def graded_check(exercise_id, candidate, *args, **kwargs):
        start = time.perf_counter()
        use = seed if seed is not None else draw.randrange(2**31)
        verdict = {"exercise": str(exercise_id), "seed": use, "status": PASS, "reason": "", "detail": ""}
        try:
            real_check(exercise_id, candidate, seed=use, quiet=True)
        except CheckFailed as exc:
            verdict.update(status=FAIL, reason=getattr(exc, "reason", "") or str(exc).splitlines()[0],
                           detail=str(exc))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # an unknown id, SystemExit in the candidate, a broken CUDA context
            verdict.update(status=ERROR, reason=f"{type(exc).__name__}: {exc}".splitlines()[0],
                           detail=traceback.format_exc())
        verdict["seconds"] = round(time.perf_counter() - start, 3)
        record(verdict)
        why = f": {verdict['reason']}" if verdict["reason"] else ""
        print(f"[grading] {exercise_id}: {verdict['status']}{why}")

    def skipped_progress(lesson, namespace, *args, **kwargs):
        print("[grading] progress(...) is not run while grading")
        return {}

    course_utils.check = graded_check
    grading.check = graded_check
    course_utils.progress = skipped_progress


# --- reading submissions ------------------------------------------------------------------------

def find_notebooks(paths: Iterable[str | Path]) -> list[tuple[str, Path]]:
    """(name for the table, path) of every notebook named or found under the folders named."""
    found: list[tuple[str, Path]] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*.ipynb")
                            if ".ipynb_checkpoints" not in p.parts and p.is_file())
            found += [(p.relative_to(path).as_posix(), p) for p in inside]
        elif path.is_file():
            found.append((path.name, path))
        else:
            raise UsageError(f"no such file or folder: {given}")
    if not found:
        raise UsageError("no notebooks (*.ipynb) found in " + ", ".join(str(p) for p in paths))
    names = [name for name, _ in found]
    if len(set(names)) < len(names):  # the same name from two folders: show the paths as given
        found = [(str(p), p) for _, p in found]
    return found


class InvalidNotebook(Exception):
    pass


def read_notebook(path: Path):
    """The notebook as an nbformat v4 node; InvalidNotebook with a one-line reason otherwise."""
    import nbformat

    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidNotebook(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidNotebook(f"not JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise InvalidNotebook("JSON without a list of cells")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=4)
    except Exception as exc:  # nbformat's own complaints about the structure
        raise InvalidNotebook(f"{type(exc).__name__}: {exc}".splitlines()[0]) from None
    for cell in nb.cells:
        if not isinstance(cell.get("source", ""), str) or "cell_type" not in cell:
            raise InvalidNotebook("a cell without cell_type or source")
    return nb


def check_cells(nb) -> dict[int, list[str]]:
    """{cell index: exercise ids its check(...) calls name}, for the code cells that have any."""
    found = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            ids = [m.group(2) for m in CHECK_CALL.finditer(cell.source)]
            if ids:
                found[index] = ids
    return found


# --- running one notebook -----------------------------------------------------------------------

@dataclass
class _Run:
    stopped: str = ""  # "", TIMED_OUT, DIED or KERNEL_ERROR
    at: int | None = None  # index (in the student's notebook) of the cell where it stopped
    message: str = ""


def _stop_on_ctrl_c(stop: Callable[[], None] | None) -> None:
    """nbclient answers Ctrl-C by killing one kernel and carrying on; make it stop the whole grading."""
    if stop is None:
        return
    import signal

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread, Windows
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop)


async def _execute(nb, workdir: str, timeout: float, offset: int,
                   stop: Callable[[], None] | None = None) -> _Run:
    """Execute the cells of `nb` one by one until done, out of time, or the kernel is gone."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    client = NotebookClient(nb, kernel_name=KERNEL_NAME, allow_errors=True,
                            timeout=max(1, math.ceil(timeout)), interrupt_on_timeout=False,
                            shutdown_kernel="immediate", record_timing=False,
                            resources={"metadata": {"path": workdir}})
    # The kernel process's own stdout/stderr (not the cells' output): where a dying kernel's last
    # words go ("Fatal Python error: Segmentation fault"). Kept out of the grader's terminal.
    log = open(Path(workdir) / KERNEL_LOG, "wb")  # noqa: SIM115 - closed in finally
    try:
        async with client.async_setup_kernel(stdout=log, stderr=log):
            _stop_on_ctrl_c(stop)
            deadline = time.monotonic() + timeout
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return _Run(TIMED_OUT, index - offset)
                client.timeout = max(1, math.ceil(left))
                try:
                    await client.async_execute_cell(cell, index)
                except CellTimeoutError:
                    return _Run(TIMED_OUT, index - offset)
                except DeadKernelError:
                    return _Run(DIED, index - offset, _exit_status(client))
    except DeadKernelError:
        return _Run(DIED, None, "the kernel died while starting or shutting down")
    except Exception as exc:  # the kernel could not start, or the connection failed
        return _Run(KERNEL_ERROR, None, f"{type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        import atexit

        atexit.unregister(client._cleanup_kernel)  # registered by nbclient; the kernel is already gone
        log.close()
    return _Run()


def _exit_status(client) -> str:
    """"exit code 1" or "signal 11 (SIGSEGV)" of a dead kernel's process; "" when unknown."""
    import signal

    process = getattr(getattr(client.km, "provisioner", None), "process", None)
    code = process.poll() if process is not None and hasattr(process, "poll") else None
    if code is None:
        return ""
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _last_words(path: Path) -> str:
    """The last line a dead kernel wrote to its own stderr, if it says anything useful."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    fatal = [line.strip() for line in lines if line.startswith("Fatal Python error")]
    useful = [line.strip() for line in lines if line.strip() and not line.startswith(("[IPKernelApp]", " "))]
    return (fatal or useful[-1:] or [""])[0]


def _first_line(cell) -> str:
    lines = [line.strip() for line in cell.source.splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    return code[0] if code else ""


def _error_of(cell) -> str:
    """"NameError: name 'add' is not defined" for a cell whose execution raised; "" otherwise."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            value = str(output.get("evalue", "")).strip().splitlines()
            return f"{output.get('ename', 'Error')}: {value[0] if value else ''}".rstrip(": ")
    return ""


def _short(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def course_exercise_ids(lesson: str) -> list[str]:
    """The ids of the check cells of this course's own exercise notebook of `lesson` ("02"), if present."""
    ids: list[str] = []
    for path in sorted((Path(__file__).resolve().parents[2] / "exercises").glob(f"{lesson}_*.ipynb")):
        try:
            nb = read_notebook(path)
        except (InvalidNotebook, OSError):
            continue
        ids += [key for found in check_cells(nb).values() for key in found if key not in ids]
    return ids


def _verdicts(path: Path) -> dict[str, dict]:
    """The last verdict the grading kernel recorded for each exercise."""
    last: dict[str, dict] = {}
    if not path.exists():
        return last
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            verdict = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a dying kernel
        last[verdict["exercise"]] = verdict
    return last


async def grade_notebook(name: str, path: Path, timeout: float, seed: int | None = None,
                         stop: Callable[[], None] | None = None) -> Submission:
    """Grade one notebook; never raises for anything the notebook does."""
    import nbformat

    start = time.monotonic()
    sub = Submission(name, str(path))
    try:
        nb = read_notebook(path)
    except (InvalidNotebook, OSError) as exc:
        sub.status, sub.notes = INVALID, f"invalid notebook: {exc}"
        return sub
    checks = check_cells(nb)
    if not checks:
        sub.status, sub.notes = NO_CHECKS, "no check cells: nothing to grade"
        return sub

    with tempfile.TemporaryDirectory(prefix="course-grade-") as work:
        shutil.copyfile(path, Path(work) / path.name)  # the kernel's working copy, if it looks for itself
        results = Path(work) / VERDICTS
        setup = nbformat.v4.new_code_cell(
            "from course_utils.grading.batch import install_grader as _install_grader\n"
            f"_install_grader({str(results)!r}, seed={seed!r})\n"
            "del _install_grader"
        )
        runnable = nbformat.v4.new_notebook(metadata=nb.metadata)
        fresh = [dict(cell, outputs=[]) if cell.cell_type == "code" else cell for cell in nb.cells]
        runnable.cells = [setup] + [nbformat.from_dict(cell) for cell in fresh]
        run = await _execute(runnable, work, timeout, offset=1, stop=stop)
        recorded = _verdicts(results)
        last_words = _last_words(Path(work) / KERNEL_LOG) if run.stopped == DIED else ""
    sub.seconds = round(time.monotonic() - start, 2)
    executed = runnable.cells[1:]

    grader_error = _error_of(runnable.cells[0])
    if grader_error and not run.stopped:
        run = _Run(KERNEL_ERROR, None, f"the grader could not start in the kernel: {grader_error}")

    cell_of: dict[str, int] = {}  # exercise id -> the (last) cell that checks it
    for index, ids in checks.items():
        for exercise in ids:
            cell_of[exercise] = index
    lessons = dict.fromkeys(key.split(".", 1)[0] for key in cell_of)
    known = [key for lesson in lessons for key in course_exercise_ids(lesson)]
    order = list(dict.fromkeys([*known, *cell_of, *recorded]))
    for exercise in order:
        if exercise in recorded:
            v = recorded[exercise]
            sub.exercises[exercise] = Verdict(v["status"], v.get("reason", ""), v.get("detail", ""),
                                              v.get("seed"), v.get("seconds"))
        elif exercise not in cell_of:
            sub.exercises[exercise] = Verdict(MISSING, "no check cell for this exercise")
        elif run.stopped in (TIMED_OUT, DIED) and (run.at is None or cell_of[exercise] >= run.at):
            sub.exercises[exercise] = Verdict(run.stopped)
        elif run.stopped == KERNEL_ERROR:
            sub.exercises[exercise] = Verdict(ERROR, run.message)
        else:
            error = _error_of(executed[cell_of[exercise]])
            why = error or "the check did not run (was `check` redefined?)"
            sub.exercises[exercise] = Verdict(ERROR, why)

    def where(index: int | None) -> str:
        if index is None or not 0 <= index < len(executed):
            return ""
        line = _first_line(executed[index])
        return f" in cell {index + 1}" + (f" (`{_short(line, 40)}`)" if line else "")

    notes = []
    if run.stopped == TIMED_OUT:
        sub.status = TIMED_OUT
        notes.append(f"timed out after {timeout:g} s{where(run.at)}")
    elif run.stopped == DIED:
        sub.status = DIED
        notes.append(f"kernel died{where(run.at)}" + (f": {run.message}" if run.message else "")
                     + (f": {last_words}" if last_words else ""))
    elif run.stopped == KERNEL_ERROR:
        sub.status = KERNEL_ERROR
        notes.append(run.message)
    for index, cell in enumerate(executed):  # the first student cell that raised outside the checks
        if index in checks or (run.at is not None and index >= run.at):
            continue
        error = _error_of(cell)
        if error:
            notes.append(f"cell {index + 1} raised {error}")
            break
    sub.notes = "; ".join(notes)
    return sub


# --- many notebooks -----------------------------------------------------------------------------

async def _grade_all(found: Sequence[tuple[str, Path]], timeout: float, jobs: int, seed: int | None,
                     log: Callable[[str], None]) -> list[Submission]:
    gate = asyncio.Semaphore(max(1, jobs))
    main_task = asyncio.current_task()

    def stop() -> None:  # Ctrl-C: cancel everything; each kernel is shut down on the way out
        log("interrupted: stopping the kernels")
        main_task.cancel()

    async def one(name: str, path: Path) -> Submission:
        async with gate:
            try:
                sub = await grade_notebook(name, path, timeout, seed, stop)
            except Exception as exc:  # a bug of the grader must not cost the other submissions
                sub = Submission(name, str(path), KERNEL_ERROR, f"grader error: {type(exc).__name__}: {exc}")
            notes = f" ({sub.notes})" if sub.notes else ""
            log(f"graded {name}: {sub.score}{notes} [{sub.seconds:.0f} s]")
            return sub

    return list(await asyncio.gather(*(one(name, path) for name, path in found)))


def _run_async(coro):
    """asyncio.run, also from inside a running event loop (a notebook) via a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def grade(paths: Iterable[str | Path], timeout: float = 600, *, jobs: int = 1, seed: int | None = None,
          log: Callable[[str], None] | None = None) -> list[Submission]:
    """Grade every notebook under `paths` (files or folders), `jobs` kernels at a time; in input order."""
    found = find_notebooks(paths)
    return _run_async(_grade_all(found, timeout, jobs, seed, log or (lambda line: None)))


# --- reports ------------------------------------------------------------------------------------

def exercise_ids(subs: Sequence[Submission]) -> list[str]:
    """Every exercise graded in any submission, in the order they first appear."""
    return list(dict.fromkeys(key for sub in subs for key in sub.exercises))


def table_rows(subs: Sequence[Submission]) -> list[list[str]]:
    """Header and one row per submission: name, one cell per exercise, score, notes."""
    ids = exercise_ids(subs)
    rows = [["submission", *ids, "score", "notes"]]
    for sub in subs:
        cells = [_short(sub.exercises[key].text(), CELL_WIDTH) if key in sub.exercises else "-"
                 for key in ids]
        rows.append([sub.name, *cells, sub.score, _short(sub.notes, NOTES_WIDTH)])
    return rows


def table(subs: Sequence[Submission]) -> str:
    """The grades as aligned text columns (two spaces apart), header first."""
    rows = table_rows(subs)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_report(subs: Sequence[Submission], prefix: str | Path,
                 timeout: float | None = None) -> tuple[Path, Path]:
    """PREFIX.json (everything) and PREFIX.csv (a row per submission: status and reason per exercise)."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    ids = exercise_ids(subs)
    json_path = prefix.with_name(prefix.name + ".json")
    csv_path = prefix.with_name(prefix.name + ".csv")
    data = {
        "timeout_s": timeout,
        "exercises": ids,
        "submissions": [{**asdict(sub), "passed": sub.passed, "total": sub.total} for sub in subs],
    }
    json_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["submission", "status", "passed", "total", "notes",
                         *(col for key in ids for col in (key, f"{key} reason"))])
        for sub in subs:
            cells = []
            for key in ids:
                v = sub.exercises.get(key)
                cells += [v.status, v.reason] if v else ["", ""]
            writer.writerow([sub.name, sub.status, sub.passed, sub.total, sub.notes, *cells])
    return json_path, csv_path


def main(paths: Sequence[str], timeout: float = 600, report: str | None = "grades", *, jobs: int = 1,
         seed: int | None = None) -> int:
    """The `grade` command: grade, print the table, write the report.

    Returns 0 when grading ran (whatever the scores), 2 on usage errors, 130 when interrupted.
    """
    if not timeout or timeout <= 0:
        print("grade: --timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        found = find_notebooks(paths)
    except UsageError as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    print(f"grading {len(found)} notebook(s), at most {timeout:g} s each", file=sys.stderr)
    try:
        subs = _run_async(_grade_all(found, timeout, jobs, seed, lambda line: print(line, file=sys.stderr)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("grade: interrupted, no report written", file=sys.stderr)
        return 130
    print(table(subs))
    if report:
        json_path, csv_path = write_report(subs, report, timeout)
        print(f"report: {json_path}, {csv_path}", file=sys.stderr)
    return 0
