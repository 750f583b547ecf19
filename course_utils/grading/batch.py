"""Grade exercise notebooks: `python -m course_utils grade PATH... [--timeout S] [--report P] [--jobs N]
[--lesson NN]`.

PATH is a notebook or a folder of them (searched recursively, checkpoints skipped; a symbolic link in a
folder, to a notebook or to a folder, is reported as an invalid notebook, not followed). Each notebook:
- is read, never written, and runs in a sandbox of its own (sandbox.py: bubblewrap, an unprivileged
  user, no network, its own PID namespace, a private /tmp, the course package without the solutions,
  limits on memory, processes, output and time), `timeout` seconds in all, cell by cell;
- when a cell calls `check("NN.id", func)`, the grader (this process) draws the cases from a fresh
  seed, computes the expected values, sends only the inputs and poisoned output buffers into the
  sandbox, takes back the bytes the call left and judges them with the harness's own rules and
  messages (remote.py). Expected values and verdicts never exist in the sandbox; a failing check
  does not stop the notebook, and neither do cells that raise. `progress(...)` is skipped.
The exercises of a notebook are the ids of its check cells (its check(...) calls, read with ast: spaces and
keywords as Python allows them), plus those of the course's own exercise notebook of the same lesson
(exercises/NN_*.ipynb) whose check cell was deleted ("missing"). A submission is scored on one lesson
(score_lessons): `lesson` when given, else the one of its lessons that most submissions of the run check;
exercises of other lessons are shown, not counted.
`--jobs N` grades N notebooks at a time only where each sandbox has a uid of its own (a root grader with
bubblewrap); otherwise the sandboxes would share one limit on processes and threads, and one notebook
could starve the others: they run one at a time, with a warning that says so.
A notebook that is no valid JSON, holds more code than the grader parses (CELL_CODE_MAX, CODE_MAX, CELLS_MAX), has
no check cells, imports something missing, loops forever
("timed out"), prints too much ("too much output") or kills its process ("kernel died") is reported
as such, and grading goes on with the next one. Each submission's code is also scanned for
constructs an honest answer never needs (flags.py): flags are shown, they do not change the grade.

Output: a table (submission x exercise) on stdout, and P.json (everything, including each failure's
whole message and seed) and P.csv (one row per submission), written after every sandbox is gone.
The exit code is 0 whenever grading ran, whatever the students scored; 2 on usage errors (a path
that does not exist, no notebooks); 130 when interrupted (Ctrl-C, SIGTERM: no report).
"""
from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import csv
import functools
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..lessons_index import lesson_number
from . import flags, remote, sandbox

PASS, FAIL, ERROR, TIMED_OUT, DIED, MISSING = "pass", "fail", "error", "timed out", "kernel died", "missing"
OUTPUT = "too much output"
# Notebook-level outcomes (Submission.status).
GRADED, INVALID, NO_CHECKS, KERNEL_ERROR = "graded", "invalid notebook", "no check cells", "kernel error"

STARTUP = 180  # seconds a sandbox may take to start (not counted in the notebook's timeout)
# A larger file is refused unread: the grader would hold it, decoded and parsed, several times over in memory.
# The course's notebooks are tens of KiB; a student's, with its outputs and images, a few MiB.
NOTEBOOK_MAX = 64 << 20
# The grader parses every code cell itself (the check cells, the flag scan) before any sandbox or timeout: Python's
# ast of 8 MiB of `a=1` lines took 4.8 GiB and 24 s, and one notebook of 64 MiB of code would end the grader's
# process (every other submission's result with it) or hold it for minutes. The course's largest code cell is
# 16 KiB, its largest notebook 39 KiB of code in 50 cells: a notebook past any of these limits is refused unread.
CELL_CODE_MAX = 256 << 10  # characters of one code cell
CODE_MAX = 2 << 20  # characters of code in all
CELLS_MAX = 5000
# What the grader keeps of the notebook's own text, per cell and per check (the sandbox may send up to
# remote.HEADER_MAX, 4 MiB, each time): a cell's exception line, an exercise id no check cell names.
ERROR_MAX = 500
ID_MAX = 64
CELL_WIDTH = 60  # table cells (a failure's reason) are cut to this many characters
NOTES_WIDTH = 90

# `check("02.vector_add", add)`: the ids a notebook is graded on (also matches course_utils.check(...),
# `check ("02.relu", relu)` and `check(exercise_id="02.relu", ...)`). Cells are read with ast (check_ids);
# this is for a cell that does not parse, which IPython will not run either, but whose id still counts.
CHECK_CALL = re.compile(r"""\bcheck\s*\(\s*(?:exercise_id\s*=\s*)?(['"])(\d+\.\w+)\1""")
EXERCISE_ID = re.compile(r"\d+\.\w+")


def call_message(ex, case, spec: dict, device: str) -> tuple[dict, remote.Encoder, list, object]:
    """The "call" message of one case (its header and encoder), the arguments it sends, and a kernel
    exercise's prepared buffers (None for a function exercise)."""
    import torch

    from .harness import _function_args, prepare_kernel_case, writable_of

    encoder, prepared = remote.Encoder(), None
    header = {"op": "call", "spec": spec, "device": device}
    if ex.kernel:
        prepared = prepare_kernel_case(ex, case, device)
        args = prepared.call_args
    else:  # copies: what the sandbox sends back lands in them, never in the case's own inputs
        args = list(_function_args(case.args))
    header["args"] = [encoder.encode(a) for a in args]
    if getattr(case, "raises", None) is not None:
        header["expect_raise"] = case.raises.__name__
    if ex.kernel:
        position = {id(a): i for i, a in enumerate(args)}
        header["outputs"] = {name: [encoder.storage_index(view), position[id(view)]]
                             for name, (_, view, _) in prepared.buffers.items()}
        header["writable"] = {name: [encoder.encode(mask.to(torch.uint8)), what]
                              for name, (mask, what) in writable_of(case).items()}
    return header, encoder, args, prepared


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit code 2."""


AGAIN = " (checked again later in the notebook: the first failure counts)"


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
    flags: list[str] = field(default_factory=list)  # constructs for a human to look at (flags.py)
    lesson: str = ""  # the lesson it is scored on ("02"; score_lessons): other lessons' exercises are shown only

    def scored(self) -> list[Verdict]:
        return [v for key, v in self.exercises.items() if not self.lesson or lesson_of(key) == self.lesson]

    @property
    def passed(self) -> int:
        return sum(v.status == PASS for v in self.scored())

    @property
    def total(self) -> int:
        return len(self.scored())

    @property
    def score(self) -> str:
        return f"{self.passed}/{self.total}" if self.total else "-"


def lesson_of(exercise_id: str) -> str:
    return exercise_id.split(".", 1)[0]


def score_lessons(subs: Sequence[Submission], lesson: str | None = None) -> None:
    """Score each submission on one lesson: `lesson` when the instructor names it; otherwise, of the lessons
    it checks, the one that the most submissions of the run check (a tie, as in a run of one notebook: the
    first it checks). A notebook of lesson 02 with lesson 01's five function exercises appended scored 5/8,
    above an honest 2/3 on lesson 02: those are shown, not counted."""
    checked = [list(dict.fromkeys(lesson_of(key) for key in sub.exercises)) for sub in subs]
    counts: dict[str, int] = {}
    for lessons in checked:
        for number in lessons:
            counts[number] = counts.get(number, 0) + 1
    lesson = lesson_number(lesson) if lesson is not None else None
    for sub, lessons in zip(subs, checked):
        sub.lesson = lesson or max(lessons, key=counts.__getitem__, default="")  # max keeps the first of a tie
        others = sorted({lesson_of(key) for key in sub.exercises} - {sub.lesson})
        if sub.lesson and others:
            _add_note(sub, f"scored on lesson {sub.lesson}: exercises of lesson {', '.join(others)} not counted")


def _add_note(sub: Submission, note: str) -> None:
    sub.notes = f"{sub.notes}; {note}" if sub.notes else note


# --- reading submissions ------------------------------------------------------------------------

def find_notebooks(paths: Iterable[str | Path]) -> list[tuple[str, Path]]:
    """(name for the table, path) of every notebook named or found under the folders named.

    A symbolic link found in a folder is kept as the link (grade_notebook refuses it: it would grade the
    file it points to, the course's solution or another submission, as this one), a link to a folder too
    (rglob does not descend into it: a student's folder linked from elsewhere had no row at all); a file
    named on the command line is the instructor's choice and is followed."""
    found: list[tuple[str, Path]] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            inside = sorted({p for p in path.rglob("*.ipynb") if p.is_file() or p.is_symlink()}
                            | {p for p in path.rglob("*") if p.is_symlink() and p.is_dir()})
            found += [(p.relative_to(path).as_posix(), p) for p in inside if ".ipynb_checkpoints" not in p.parts]
        elif path.is_file():
            found.append((path.name, path.resolve()))
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

    if path.is_symlink() and path.is_dir():
        raise InvalidNotebook(f"a symbolic link to a folder ({os.readlink(path)}), not graded: give that folder "
                              "itself to grade its notebooks")
    if path.is_symlink():
        raise InvalidNotebook(f"a symbolic link (to {os.readlink(path)}), not a notebook of its own")
    with path.open("rb") as f:  # at most NOTEBOOK_MAX bytes: the file may be of any size, or no file at all
        data = f.read(NOTEBOOK_MAX + 1)
    if len(data) > NOTEBOOK_MAX:
        raise InvalidNotebook(f"larger than the limit of {NOTEBOOK_MAX:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidNotebook(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidNotebook(f"not JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise InvalidNotebook("JSON without a list of cells")
    _code_sizes(raw["cells"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=4)
    except Exception as exc:  # nbformat's own complaints about the structure
        raise InvalidNotebook(f"{type(exc).__name__}: {exc}".splitlines()[0]) from None
    # Measured again as converted: an nbformat 3 file keeps its cells under "worksheets" (its "cells" may be
    # empty), and 4 MiB of code in one of them passed the limits above, to be parsed here for minutes.
    _code_sizes(nb.cells)
    for cell in nb.cells:
        if not isinstance(cell.get("source", ""), str) or "cell_type" not in cell:
            raise InvalidNotebook("a cell without cell_type or source")
    return nb


def _code_sizes(cells: list) -> None:
    """InvalidNotebook when these (JSON) cells are too many, or hold more code than the grader may parse."""
    if len(cells) > CELLS_MAX:
        raise InvalidNotebook(f"{len(cells):,} cells, more than the limit of {CELLS_MAX:,}")
    sizes = []
    for number, cell in enumerate(cells, 1):
        source = cell.get("source", "") if isinstance(cell, dict) and cell.get("cell_type") == "code" else ""
        lines = source if isinstance(source, list) else [source]
        sizes.append((sum(len(line) for line in lines if isinstance(line, str)), number))
    largest, number = max(sizes, default=(0, 0))
    if largest > CELL_CODE_MAX:
        raise InvalidNotebook(f"cell {number} holds {largest:,} characters of code, more than the limit of "
                              f"{CELL_CODE_MAX:,}")
    if sum(size for size, _ in sizes) > CODE_MAX:
        raise InvalidNotebook(f"{sum(size for size, _ in sizes):,} characters of code, more than the limit of "
                              f"{CODE_MAX:,}")


def check_ids(source: str) -> list[str]:
    """The exercise ids of a cell's check(...) calls, in order, read from the cell as IPython runs it:
    `check("02.relu", f)`, `check ("02.relu", f)`, `course_utils.check(exercise_id="02.relu", candidate=f)`,
    a check inside a loop. A cell that does not parse falls back to CHECK_CALL."""
    if "check" not in source:
        return []
    try:
        tree = flags.parse(flags._python(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a null byte; nested too deep for the parser
        return [m.group(2) for m in CHECK_CALL.finditer(source)]
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("run_line_magic", "run_cell_magic"):
            # `%time check("02.relu", relu)`: the code a magic runs is in its arguments, as text
            texts = [a.value for a in node.args[1:] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            calls += [(node.lineno, node.col_offset, key) for text in texts for key in check_ids(text)]
            continue
        if not (isinstance(node.func, ast.Name) and node.func.id == "check"
                or isinstance(node.func, ast.Attribute) and node.func.attr == "check"):
            continue
        keyword = next((k.value for k in node.keywords if k.arg == "exercise_id"), None)
        given = node.args[0] if node.args else keyword
        if isinstance(given, ast.Constant) and isinstance(given.value, str) and EXERCISE_ID.fullmatch(given.value):
            calls.append((node.lineno, node.col_offset, given.value))
    return [key for _, _, key in sorted(calls)]


def check_cells(nb) -> dict[int, list[str]]:
    """{cell index: exercise ids its check(...) calls name}, for the code cells that have any."""
    found = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            ids = check_ids(cell.source)
            if ids:
                found[index] = ids
    return found


# --- running one notebook -----------------------------------------------------------------------

@dataclass
class _Run:
    stopped: str = ""  # "", TIMED_OUT, DIED, OUTPUT or KERNEL_ERROR
    at: int | None = None  # index (in the student's notebook) of the cell where it stopped
    message: str = ""


def _exit_status(code: int | None) -> str:
    """"exit code 1" or "signal 9 (SIGKILL)" of a finished process; "" when unknown."""
    if code is None:
        return ""
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _last_words(tail: str) -> str:
    """What a dead process said about its death ("Fatal Python error: Segmentation fault"), if anything, or
    why its Python never started (setpriv or the loader: "error while loading shared libraries", exit code
    127). (Its output is the notebook's output too: only these last words are kept.)"""
    fatal = [line.strip() for line in tail.splitlines()
             if line.startswith(("Fatal Python error", "setpriv: ")) or "error while loading shared libraries" in line]
    return fatal[0] if fatal else ""


def _first_line(cell) -> str:
    lines = [line.strip() for line in cell.source.splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    return code[0] if code else ""


def _cut(text: str, limit: int) -> str:
    """text, or its first `limit` characters and how many there were."""
    return text if len(text) <= limit else f"{text[:limit]}... (cut: {len(text):,} characters)"


def _short(text: str, width: int) -> str:
    text = _printable(" ".join(str(text).split()))
    return text if len(text) <= width else text[: width - 3] + "..."


def _printable(text: str) -> str:
    """text with the characters a terminal acts on (newlines, ANSI escapes, bidi overrides) written as
    escapes: names and messages come from the submissions, and must not forge rows or redraw the screen."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


def _csv_cell(value):
    """A report cell: printable, and never a formula for the spreadsheet that opens it (=, +, -, @)."""
    if not isinstance(value, str):
        return value
    text = _printable(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


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


@functools.cache
def _course_cells(lesson: str) -> frozenset[str]:
    cells = set()
    for path in sorted((Path(__file__).resolve().parents[2] / "exercises").glob(f"{lesson}_*.ipynb")):
        with contextlib.suppress(InvalidNotebook, OSError):
            cells |= {c.source.strip() for c in read_notebook(path).cells if c.cell_type == "code"}
    return frozenset(cells)


def course_cells(lessons: Iterable[str]) -> frozenset[str]:
    """The code cells of the course's own exercise notebooks of these lessons (not the student's code)."""
    return frozenset().union(*(_course_cells(lesson) for lesson in lessons))


class _Stopped(Exception):
    """The grading run was interrupted (Ctrl-C, SIGTERM)."""


class Grader:
    """One grading run: the course packages staged for the sandboxes, the live sandboxes, the stop switch.

    The grader's own temporary folder holds only the staged packages, bound read-only into the
    sandboxes; a sandbox writes only to its own tmpfs. `close()` kills what still runs and removes it.
    """

    def __init__(self, timeout: float, seed: int | None = None, jobs: int = 1,
                 limits: sandbox.Limits | None = None, lesson: str | None = None):
        from ..mode import current, setup
        from . import load_all

        setup(quiet=True)
        load_all()
        self.timeout, self.seed = timeout, seed
        # the lesson every submission is scored on ("02"; score_lessons); None: each its own
        self.lesson = lesson_number(lesson) if lesson is not None else None
        self.gpu = current().gpu
        self.limits = limits or (sandbox.Limits(memory=sandbox.GPU_MEMORY) if self.gpu else sandbox.Limits())
        if self.limits.address_space is None and not self.gpu:
            self.limits = replace(self.limits, address_space=sandbox.cpu_address_space(self.limits.memory))
        self.device = current().device
        self.why_not = sandbox.probe()
        self.jobs, self.serial_warning = max(1, jobs), ""
        if self.jobs > 1 and not sandbox.own_uids(self.sandboxed):
            why = "the grader is not root" if self.sandboxed else "no sandbox"
            self.jobs, self.serial_warning = 1, sandbox.SHARED_UID_WARNING.format(jobs=jobs, why=why)
        self.cgroup_warning = ""  # each sandbox's processes in a cgroup that bounds their memory in all, or why not
        if self.sandboxed:
            probe, why = sandbox.make_cgroup(self.limits, -1)
            if probe is None:
                self.cgroup_warning = sandbox.CGROUP_WARNING.format(why=why)
            else:
                probe.remove()
        self.work = sandbox.temp_dir()
        self.live: set = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.slots = list(range(self.jobs))
        self.draw = random.SystemRandom()  # independent of anything a notebook seeds

    @property
    def sandboxed(self) -> bool:
        return not self.why_not

    def describe(self) -> str:
        return "bubblewrap" if self.sandboxed else f"none ({self.why_not})"

    def _course(self, lesson: int) -> Path:
        with self.lock:
            return sandbox.stage_package(self.work, lesson)

    def stop(self) -> None:
        self.stopped.set()
        with self.lock:
            boxes = list(self.live)
        for box in boxes:
            box.kill()

    def close(self) -> None:
        self.stop()
        with self.lock:
            boxes = list(self.live)
        for box in boxes:
            box.close()
        shutil.rmtree(self.work, ignore_errors=True)

    # --- one notebook

    def _start(self, course: Path, path: Path, slot: int, workdir: Path | None):
        if self.sandboxed:
            cgroup = None if self.cgroup_warning else sandbox.make_cgroup(self.limits, slot)[0]
            with open(path, "rb") as f:  # bwrap copies it into the sandbox's own /submission
                cmd = sandbox.command(course, f.fileno(), path.name, gpu=self.gpu, limits=self.limits, slot=slot)
                try:
                    return sandbox.Sandbox(cmd, self.limits, pass_fds=(f.fileno(),), cgroup=cgroup)
                except OSError:
                    if cgroup is not None:
                        cgroup.remove()
                    raise
        shutil.copyfile(path, workdir / path.name)
        cmd, env = sandbox.unsandboxed(course, workdir, gpu=self.gpu)
        return sandbox.Sandbox(cmd, self.limits, env=env, cwd=str(workdir))

    def grade_notebook(self, name: str, path: Path) -> Submission:
        """Grade one notebook; never raises for anything the notebook does."""
        start = time.monotonic()
        sub = Submission(name, str(path))
        try:
            nb = read_notebook(path)
        except (InvalidNotebook, OSError) as exc:
            sub.status, sub.notes = INVALID, f"invalid notebook: {exc}"
            return sub
        checks = check_cells(nb)
        lessons = sorted({key.split(".", 1)[0] for ids in checks.values() for key in ids}) or ["[0-9][0-9]"]
        sub.flags = flags.scan((cell.source if cell.cell_type == "code" else "" for cell in nb.cells),
                               course_cells(lessons))
        if not checks:
            sub.status, sub.notes = NO_CHECKS, "no check cells: nothing to grade"
            return sub
        if self.stopped.is_set():
            raise _Stopped
        lesson = min(int(key.split(".", 1)[0]) for ids in checks.values() for key in ids)
        course = self._course(lesson)
        with self.lock:
            slot = self.slots.pop(0) if self.slots else 0
        workdir = None if self.sandboxed else Path(sandbox.tempfile.mkdtemp(prefix="course-grade-nb-"))
        box = None
        recorded: dict[str, Verdict] = {}
        errors: dict[int, str] = {}
        # Ids a verdict is kept for: those the check cells name and the course's. Any other is answered and
        # counted, never kept: a loop of check(<3 MiB id>, None) kept 6 MiB of the grader's memory per call.
        from . import REGISTRY
        kept = {key for ids in checks.values() for key in ids} | set(REGISTRY)
        unknown = 0
        run = _Run()
        at = None
        try:
            box = self._start(course, path, slot, workdir)
            with self.lock:
                self.live.add(box)
            if self.stopped.is_set():
                raise _Stopped
            chan = remote.Channel(box.process.stdout.fileno(), box.process.stdin.fileno(), nonblocking=True)
            chan.deadline = time.monotonic() + STARTUP  # Python, torch and IPython imported: not the notebook's time
            try:
                msg, _ = chan.recv(blob_limit=0)
                if msg.get("op") != "ready":
                    raise remote.ProtocolError(f"expected ready, got {msg.get('op')!r}")
                key = os.urandom(32)  # every later message, both ways, carries its MAC under this key
                chan.send({"op": "key", "key": key.hex()})
                chan.authenticate(key)
                chan.deadline = time.monotonic() + self.timeout
                for index, cell in enumerate(nb.cells):
                    if cell.cell_type != "code" or not cell.source.strip():
                        continue
                    at = index
                    chan.send({"op": "cell", "source": cell.source})
                    while True:
                        msg, _ = chan.recv(blob_limit=0)
                        if msg.get("op") == "cell_done":
                            errors[index] = _cut(str(msg.get("error") or ""), ERROR_MAX)
                            break
                        if msg.get("op") != "check" or not isinstance(msg.get("exercise"), str):
                            raise remote.ProtocolError(f"unexpected message {str(msg.get('op'))[:40]!r}")
                        verdict = self._grade_check(chan, msg["exercise"])
                        if msg["exercise"] not in kept:
                            unknown += 1
                            continue
                        # A notebook sees its own outputs and could check again until a flaky kernel
                        # happens to pass: an exercise checked more than once keeps its first failure.
                        earlier = recorded.get(msg["exercise"])
                        if earlier is None or earlier.status == PASS:
                            recorded[msg["exercise"]] = verdict
                        elif not earlier.reason.endswith(AGAIN):
                            earlier.reason += AGAIN
                at = None
                chan.send({"op": "bye"})
            except remote.TimedOut:
                run = _Run(TIMED_OUT, at)
            except remote.Closed:
                if self.stopped.is_set():
                    raise _Stopped from None
                box.close()
                if box.too_much_output:
                    run = _Run(OUTPUT, at, f"printed more than {self.limits.output >> 20} MiB")
                else:
                    run = _Run(DIED, at, _exit_status(box.process.returncode))
            except remote.ProtocolError as exc:
                run = _Run(KERNEL_ERROR, at, f"the notebook broke the grading protocol: {exc}")
        except OSError as exc:  # the sandbox could not start
            run = _Run(KERNEL_ERROR, None, f"could not start the sandbox: {exc}")
        finally:
            if box is not None:
                box.close()
                with self.lock:
                    self.live.discard(box)
            with self.lock:
                self.slots.append(slot)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        if self.stopped.is_set():
            raise _Stopped
        last_words = _last_words(box.tail()) if box is not None and run.stopped == DIED else ""
        sub.seconds = round(time.monotonic() - start, 2)
        self._summarize(sub, nb, checks, recorded, errors, run, last_words)
        if unknown:
            _add_note(sub, f"{unknown} check(...) call(s) named no exercise of the course and no check cell's")
        # for the log line; score_lessons decides once the whole run is graded
        sub.lesson = self.lesson or next((lesson_of(key) for key in sub.exercises), "")
        return sub

    def _grade_check(self, chan, exercise_id: str) -> Verdict:
        """Judge one check(...) call of the notebook: the cases run here, the candidate in the sandbox."""
        from . import REGISTRY
        from .harness import CandidateError, CheckFailed, Problem, course_solution, run_cases

        started = time.perf_counter()
        seed = self.seed if self.seed is not None else self.draw.randrange(2**31)
        ex = REGISTRY.get(exercise_id)
        if ex is None:
            chan.send({"op": "done"})
            return Verdict(ERROR, f"KeyError: no exercise {_cut(repr(exercise_id), ID_MAX)}", seed=seed)
        spec = remote.spec_of(ex)

        def raised(msg: dict):
            message = str(msg.get("message", ""))[:100_000]
            kind = CandidateError if msg.get("candidate") is True else CheckFailed
            line = msg.get("raised")
            problems = remote.problems_in(msg.get("problems", [])) or [Problem(message.splitlines()[-1] if message
                                                                               else "raised", "wrong")]
            return kind(message, exercise=ex.id, problems=problems,
                        raised=line[:500] if isinstance(line, str) and kind is CandidateError else None)

        def run_case(case) -> list[str]:
            import torch

            from .harness import judge_function_case, judge_kernel_case, modified_inputs

            header, encoder, args, prepared = call_message(ex, case, spec, self.device)
            sent = sum(raw.numel() for raw in encoder.storages)
            chan.send(header, encoder.blobs())
            msg, blobs = chan.recv(blob_limit=sent + remote.RESULT_MAX)
            if msg.get("op") == "raised":
                raise raised(msg)
            if msg.get("op") != "called":
                raise remote.ProtocolError(f"unexpected {str(msg.get('op'))[:40]!r}")
            remote.copy_back(encoder.storages, blobs)
            if "expect_raise" in header:
                if msg.get("refused") is True:
                    return []
                return [f"these inputs must be refused: raise {case.raises.__name__} with a message saying "
                        f"why ({case.label}); your function returned normally"]
            for key, reads in (msg.get("reads") or {}).items():
                target = args[int(key)] if str(key).isdigit() and int(key) < len(args) else None
                if target is not None and hasattr(type(target), "set_reads"):  # 05's read log of x
                    type(target).set_reads(target, [tuple(r) for r in remote._list(reads)
                                                    if isinstance(r, list) and len(r) == 3])
            if ex.kernel:
                return judge_kernel_case(ex, case, prepared, remote.facts_in(msg.get("facts")))
            decoder = remote.Decoder.from_blobs(blobs[len(encoder.storages):], self.device, first=encoder.storages,
                                                broadcast_max=remote.RESULT_MAX)
            value = msg.get("result")
            if isinstance(value, dict) and value.get("t") == "unsendable":
                result = _Unsendable(str(value.get("type", "object")))
            else:
                result = decoder.decode(value)
            autograd = msg.get("autograd")
            if isinstance(autograd, dict) and isinstance(result, torch.Tensor):  # its graph is in the sandbox
                result = remote.autograd_in(chan, result, autograd, args, self.device)
            used = [u for u in remote._list(msg.get("used", [])) if isinstance(u, str)]
            return (modified_inputs(ex, case, args)
                    or judge_function_case(ex, replace(case, args=tuple(args)), result, used))

        verdict = Verdict(PASS, seed=seed)
        try:
            chan.send({"op": "signature", "spec": spec})
            msg, _ = chan.recv(blob_limit=0)
            if msg.get("op") == "raised":
                raise CheckFailed(str(msg.get("message", ""))[:10_000], exercise=ex.id)
            candidate = types.FunctionType(compile("None", "<candidate>", "eval"), {})
            candidate.__name__ = str(msg.get("name", ""))[:200] or "candidate"
            candidate.__module__ = str(msg.get("module", ""))[:200]
            refusal = course_solution(ex.id, candidate)
            if refusal is not None:
                raise CheckFailed(f"{ex.id}: {refusal}", exercise=ex.id, seed=seed,
                                  problems=[Problem(refusal, "solution")])
            run_cases(ex, seed, run_case)
        except CheckFailed as exc:
            verdict = Verdict(FAIL, exc.reason, str(exc), seed)
        except (remote.TimedOut, remote.ProtocolError):
            raise
        except Exception as exc:  # judging failed on this side (a result of an unexpected type, ...)
            verdict = Verdict(ERROR, f"{type(exc).__name__}: {exc}".splitlines()[0], seed=seed)
        verdict.seconds = round(time.perf_counter() - started, 3)
        chan.send({"op": "done"})
        return verdict

    def _summarize(self, sub: Submission, nb, checks: dict, recorded: dict, errors: dict, run: _Run,
                   last_words: str) -> None:
        cell_of: dict[str, int] = {}  # exercise id -> the (last) cell that checks it
        for index, ids in checks.items():
            for exercise in ids:
                cell_of[exercise] = index
        lessons = dict.fromkeys([*([self.lesson] if self.lesson else []), *(lesson_of(key) for key in cell_of)])
        known = [key for lesson in lessons for key in course_exercise_ids(lesson)]
        order = list(dict.fromkeys([*known, *cell_of, *(k for k in recorded if k in known or k in cell_of)]))
        for exercise in order:
            if exercise in recorded:
                sub.exercises[exercise] = recorded[exercise]
            elif exercise not in cell_of:
                sub.exercises[exercise] = Verdict(MISSING, "no check cell for this exercise")
            elif run.stopped in (TIMED_OUT, DIED, OUTPUT) and (run.at is None or cell_of[exercise] >= run.at):
                sub.exercises[exercise] = Verdict(run.stopped)
            elif run.stopped == KERNEL_ERROR:
                sub.exercises[exercise] = Verdict(ERROR, run.message)
            else:
                why = errors.get(cell_of[exercise]) or "the check did not run (was `check` redefined?)"
                sub.exercises[exercise] = Verdict(ERROR, why)

        def where(index: int | None) -> str:
            if index is None or not 0 <= index < len(nb.cells):
                return ""
            line = _first_line(nb.cells[index])
            return f" in cell {index + 1}" + (f" (`{_short(line, 40)}`)" if line else "")

        notes = []
        if run.stopped == TIMED_OUT:
            sub.status = TIMED_OUT
            notes.append(f"timed out after {self.timeout:g} s{where(run.at)}")
        elif run.stopped == DIED:
            sub.status = DIED
            notes.append(f"kernel died{where(run.at)}" + (f": {run.message}" if run.message else "")
                         + (f": {last_words}" if last_words else ""))
        elif run.stopped == OUTPUT:
            sub.status = OUTPUT
            notes.append(f"stopped{where(run.at)}: {run.message}")
        elif run.stopped == KERNEL_ERROR:
            sub.status = KERNEL_ERROR
            notes.append(run.message)
        for index in sorted(errors):  # the first student cell that raised outside the checks
            if index in checks or (run.at is not None and index >= run.at):
                continue
            if errors[index]:
                notes.append(f"cell {index + 1} raised {errors[index]}")
                break
        sub.notes = "; ".join(notes)


class _Unsendable:
    """What a function returned that cannot leave the sandbox (a generator, a module, ...)."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<a {self.type_name}>"


# --- many notebooks -----------------------------------------------------------------------------

def _grade_all(grader: Grader, found: Sequence[tuple[str, Path]], jobs: int,
               log: Callable[[str], None]) -> list[Submission]:
    """Grade in a pool of `jobs` threads (each drives one sandbox); Ctrl-C/SIGTERM stops them all."""

    def one(name: str, path: Path) -> Submission:
        try:
            sub = grader.grade_notebook(name, path)
        except _Stopped:
            raise
        except Exception as exc:  # a bug of the grader must not cost the other submissions
            if grader.stopped.is_set():
                raise _Stopped from None
            sub = Submission(name, str(path), KERNEL_ERROR, f"grader error: {type(exc).__name__}: {exc}")
        notes = f" ({sub.notes})" if sub.notes else ""
        log(_printable(f"graded {name}: {sub.score}{notes} [{sub.seconds:.0f} s]"))
        return sub

    pool = concurrent.futures.ThreadPoolExecutor(max(1, jobs), thread_name_prefix="grade")
    try:
        futures = [pool.submit(one, name, path) for name, path in found]
        pending = set(futures)
        while pending:  # short waits, so that a signal reaches the main thread promptly
            _, pending = concurrent.futures.wait(pending, timeout=0.5)
        subs = [f.result() for f in futures]
        score_lessons(subs, grader.lesson)
        return subs
    except BaseException:
        grader.stop()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def grade(paths: Iterable[str | Path], timeout: float = 600, *, jobs: int = 1, seed: int | None = None,
          log: Callable[[str], None] | None = None, limits: sandbox.Limits | None = None,
          lesson: str | None = None) -> list[Submission]:
    """Grade every notebook under `paths` (files or folders), `jobs` sandboxes at a time; in input order."""
    found = find_notebooks(paths)
    grader = Grader(timeout, seed, jobs, limits, lesson)
    log = log or (lambda line: None)
    try:
        for warning in (grader.serial_warning, grader.cgroup_warning):
            if warning:
                log(warning)
        return _grade_all(grader, found, grader.jobs, log)
    finally:
        grader.close()


# --- reports ------------------------------------------------------------------------------------

def exercise_ids(subs: Sequence[Submission]) -> list[str]:
    """Every exercise graded in any submission, in the order they first appear."""
    return list(dict.fromkeys(key for sub in subs for key in sub.exercises))


def table_rows(subs: Sequence[Submission]) -> list[list[str]]:
    """Header and one row per submission: name, one cell per exercise, score, notes."""
    ids = exercise_ids(subs)
    rows = [["submission", *ids, "score", "flags", "notes"]]
    for sub in subs:
        cells = [_short(sub.exercises[key].text(), CELL_WIDTH) if key in sub.exercises else "-"
                 for key in ids]
        shown = _short("; ".join(sub.flags), NOTES_WIDTH) if sub.flags else "-"
        rows.append([_printable(sub.name), *cells, sub.score, shown, _short(sub.notes, NOTES_WIDTH)])
    return rows


def table(subs: Sequence[Submission]) -> str:
    """The grades as aligned text columns (two spaces apart), header first."""
    rows = table_rows(subs)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_report(subs: Sequence[Submission], prefix: str | Path,
                 timeout: float | None = None, sandboxed: str = "") -> tuple[Path, Path]:
    """PREFIX.json (everything) and PREFIX.csv (a row per submission: status and reason per exercise)."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    ids = exercise_ids(subs)
    json_path = prefix.with_name(prefix.name + ".json")
    csv_path = prefix.with_name(prefix.name + ".csv")
    data = {
        "timeout_s": timeout,
        "sandbox": sandboxed,
        "exercises": ids,
        "submissions": [{**asdict(sub), "passed": sub.passed, "total": sub.total} for sub in subs],
    }
    json_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["submission", "status", "passed", "total", "flags", "notes",
                         *(col for key in ids for col in (key, f"{key} reason"))])
        for sub in subs:
            cells = []
            for key in ids:
                v = sub.exercises.get(key)
                cells += [v.status, v.reason] if v else ["", ""]
            row = [sub.name, sub.status, sub.passed, sub.total, "; ".join(sub.flags), sub.notes, *cells]
            writer.writerow([_csv_cell(value) for value in row])
    return json_path, csv_path


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(paths: Sequence[str], timeout: float = 600, report: str | None = "grades", *, jobs: int = 1,
         seed: int | None = None, limits: sandbox.Limits | None = None, lesson: str | None = None) -> int:
    """The `grade` command: grade, print the table, write the report (after every sandbox is gone).

    Returns 0 when grading ran (whatever the scores), 2 on usage errors, 130 when interrupted
    (Ctrl-C or SIGTERM: the sandboxes are killed, the temporary folder removed, no report written).
    """
    if not timeout or timeout <= 0:
        print("grade: --timeout must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        found = find_notebooks(paths)
    except UsageError as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        grader = Grader(timeout, seed, jobs, limits, lesson)
        try:
            if not grader.sandboxed:
                print(sandbox.NO_SANDBOX_WARNING.format(why=grader.why_not), file=sys.stderr)
            for warning in (grader.serial_warning, grader.cgroup_warning):
                if warning:
                    print(warning, file=sys.stderr)
            print(f"grading {len(found)} notebook(s), at most {timeout:g} s each, sandbox: {grader.describe()}",
                  file=sys.stderr)
            subs = _grade_all(grader, found, grader.jobs, lambda line: print(line, file=sys.stderr))
        finally:
            grader.close()
    except (KeyboardInterrupt, _Stopped):
        print("grade: interrupted, no report written", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    # The report first: the table holds the students' own text (file names, their exceptions' messages), which
    # a terminal's encoding may not hold (名前.ipynb on a Latin-1 one ended the run before any report)
    paths = write_report(subs, report, timeout, grader.describe()) if report else None
    _echo(table(subs))
    if paths:
        print(f"report: {paths[0]}, {paths[1]}", file=sys.stderr)
    return 0


def _echo(text: str) -> None:
    """Print text on stdout, with what its encoding cannot hold written as escapes."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))
