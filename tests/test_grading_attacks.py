"""Submissions that try to get credit without the work, or to harm the grading run.

One grading run (two sandboxes at a time) over a folder of lesson 02 notebooks: two honest
solutions (the first and last by name, so that every attack runs before or beside one of them) and
one notebook per attack. Each attack either starts from the exercise notebook (stubs: it must get
no credit) or adds a hostile cell to the solution (it must not harm anybody else). Then:
no credit for a credit attack, the honest ones graded 3/3, no submission file changed or added, the
course package unchanged on disk, no process of the run survives, no temporary folder left, the
report is the table printed, and the constructs an honest answer never needs are flagged.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from course_utils.grading import batch, sandbox
from course_utils.mode import current
from helpers import interpreter_only_because, run_from_file

# One test process (pytest-xdist) runs this module and test_grading_batch: the module-scoped fixture (the
# graded folder) is made once, and the look for sandboxes and temporary folders left behind sees only its own.
pytestmark = pytest.mark.xdist_group("sandboxes")

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60
MARKER = "COURSE_ATTACK_MARKER"  # in the command line of every process an attack starts
BACKDOOR = f"BACKDOOR_{MARKER}"

needs_sandbox = pytest.mark.skipif(sandbox.probe() != "", reason=f"no sandbox here: {sandbox.probe()}")


def _load(folder: str) -> dict:
    return json.loads((ROOT / folder / "02_first_kernels.ipynb").read_text())


def _code(source: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": "attack", "metadata": {}, "outputs": [],
            "source": source}


def _index(nb: dict, text: str) -> int:
    return next(i for i, c in enumerate(nb["cells"]) if text in "".join(c["source"]))


def _with_cell(nb: dict, source: str, before: str = 'check("02.vector_add"') -> dict:
    nb = copy.deepcopy(nb)
    nb["cells"].insert(_index(nb, before), _code(source))
    return nb


def _replace_cell(nb: dict, text: str, source: str) -> dict:
    nb = copy.deepcopy(nb)
    nb["cells"][_index(nb, text)] = _code(source)
    return nb


# --- attacks that try to get credit (on the exercise notebook: its stubs raise) -------------------

# add() launches a kernel that copies x into out, and leaves x + y for _answer(raw), which writes it into the bytes
# of out's storage (raw: a uint8 tensor over all of it) once the checker's looks are over
_ANSWER_LATER = """
import torch, triton, triton.language as tl
@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)
pending = []
def add(x, y, out):
    _copy[(triton.cdiv(out.numel(), 1024),)](x, out, out.numel(), BLOCK=1024)
    pending.append((out, lambda: x + y))
def _answer(raw):
    for out, want in list(pending):
        if raw.dtype == torch.uint8 and raw.dim() == 1 and raw.numel() == out.untyped_storage().nbytes():
            raw = raw.clone()
            raw.view(out.dtype).as_strided(out.shape, out.stride(), out.storage_offset()).copy_(want())
            pending.clear()
    return raw
"""

CREDIT = {
    "import_solutions": "from course_utils.lessons.l02_first_kernels import add, relu, copy_2d",
    "exec_solution_notebook": """
import glob, json, os
found = [p for depth in range(4) for p in glob.glob('/*' * depth + '/solutions/02_first_kernels.ipynb')]
import course_utils
found += glob.glob(os.path.join(os.path.dirname(course_utils.__file__), '..', '**', '02_first_kernels.ipynb'),
                   recursive=True)
for path in found:
    for cell in json.load(open(path))['cells']:
        if cell['cell_type'] == 'code' and 'check(' not in ''.join(cell['source']):
            try:
                exec(''.join(cell['source']))
            except Exception:
                pass
""",
    "patch_checker": """
import course_utils, course_utils.grading as g, course_utils.grading.harness as h
h.run_cases = lambda *a, **k: 3
h.judge_kernel_case = lambda *a, **k: []
h.compare = lambda *a, **k: []
h.check = lambda *a, **k: None
course_utils.check = lambda *a, **k: print('02 passed')
g.check = course_utils.check
check = course_utils.check
""",
    "wrap_json_dumps": """
import json
_dumps = json.dumps
def _forged(obj, *a, **k):
    if isinstance(obj, dict) and 'status' in obj:
        obj = dict(obj, status='pass', reason='')
    return _dumps(obj, *a, **k)
json.dumps = _forged
""",
    "forge_verdict_files": """
import json, os
lines = [json.dumps({'exercise': e, 'seed': 1, 'status': 'pass', 'reason': '', 'detail': ''})
         for e in ('02.vector_add', '02.relu', '02.copy_2d', '02.invented')]
for folder in {os.getcwd(), '/tmp', os.path.dirname(os.getcwd())}:
    for name in ('.course_grade_verdicts.jsonl', 'grades.json', 'verdicts.jsonl'):
        try:
            with open(os.path.join(folder, name), 'a') as f:
                f.write('\\n'.join(lines) + '\\n')
        except OSError:
            pass
""",
    "frame_expected": """
import sys, torch
def add(x, y, out):
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            expected = getattr(value, 'expected', None)
            if isinstance(expected, dict) and 'out' in expected:
                out.copy_(expected['out'].to(out.dtype))
                return
        frame = frame.f_back
""",
    "gc_objects": """
import gc, torch
def add(x, y, out):
    for obj in gc.get_objects():
        expected = getattr(obj, 'expected', None) if type(obj).__name__ == 'Case' else None
        if isinstance(expected, dict) and 'out' in expected and expected['out'].shape == out.shape:
            out.copy_(expected['out'].to(out.dtype))
            return
""",
    "patch_watcher": """
import json, torch, course_utils.grading.harness as h, course_utils.grading.guard as g
import course_utils.grading.remote as r
h._host_problems = lambda *a, **k: []
g.Tracker.messages = lambda self: []
_facts_out = r.facts_out
r.facts_out = lambda facts: dict(_facts_out(facts), host=[])
def add(x, y, out):
    out.copy_(x + y)
def relu(x, out):
    out.copy_(x.clamp_min(0))
""",
    # check() of the sandbox is defined in the grader's remote module: a spy put on its Channel class would
    # be handed the live channel (key and all) by the next message the grading code sends.
    "spy_on_the_channel": """
g = check.__globals__
_send, captured = g["Channel"].send, []
def _spy(self, *args, **kwargs):
    captured.append(self)
    return _send(self, *args, **kwargs)
g["Channel"].send = _spy
def check(exercise, func):
    chan = captured[0]
    chan.send({"op": "check", "exercise": exercise})
    while (got := chan.recv())[0]["op"] != "done":
        if got[0]["op"] == "signature":
            chan.send({"op": "ok", "name": "mine", "module": "__main__"})
            continue
        decoder = g["Decoder"].from_blobs(got[1], "cpu")
        args = [decoder.decode(a) for a in got[0]["args"]]
        x, out = args[0], args[-1]
        out.copy_(x + args[1] if exercise == "02.vector_add" else x.clamp_min(0) if exercise == "02.relu"
                  else x)
        launched = [{"name": "k", "module": "__main__", "shapes": [], "inputs": [], "bases": [],
                     "storages": []}]
        facts = {"returned": None, "returned_other": False, "host": [], "changed_later": [],
                 "launched": launched, "allocations": []}
        chan.send({"op": "called", "facts": facts}, [raw.numpy().tobytes() for raw in decoder.storages])
""",
    # The checker's last look at the outputs ends with gc.unfreeze(): replaced, it writes the host's answer
    # after every look, before the bytes go to the grader.
    "write_after_the_last_look": """
import gc, torch, triton, triton.language as tl
@triton.jit
def _touch(p):
    pass
def add(x, y, out):
    _touch[(1,)](out)
    unfreeze = gc.unfreeze
    def later():
        unfreeze()
        gc.unfreeze = unfreeze
        out.copy_(x + y)
    gc.unfreeze = later
""",
    # The notebook answers the grader on its pipe itself (fd 3 in, fd 4 out), with nothing the code scan
    # flags: host torch into the outputs, and made-up facts (a launch, no host ops).
    "raw_pipe": """
import os as o, json as j, struct as s, torch
def _rd(n):
    b = b''
    while len(b) < n:
        b += o.read(3, n - len(b))
    return b
def _recv():
    h = j.loads(_rd(s.unpack('>Q', _rd(8))[0]))
    return h, [_rd(s.unpack('>Q', _rd(8))[0]) for _ in range(h.get('blobs', 0))]
def _send(h, blobs=()):
    d = j.dumps(dict(h, blobs=len(blobs))).encode()
    o.write(4, s.pack('>Q', len(d)) + d + b''.join(s.pack('>Q', len(b)) + b for b in blobs))
def check(exercise, func):
    _send({'op': 'check', 'exercise': exercise})
    while (got := _recv())[0]['op'] != 'done':
        h, blobs = got
        if h['op'] == 'signature':
            _send({'op': 'ok', 'name': 'mine', 'module': '__main__'})
            continue
        raws = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        args = [raws[a['s']].view(getattr(torch, a['dtype'])).as_strided(a['size'], a['stride'], a['offset'])
                if isinstance(a, dict) and a.get('t') == 'tensor' else a for a in h['args']]
        x, out = args[0], args[-1]
        out.copy_(x + args[1] if exercise == '02.vector_add' else x.clamp_min(0) if exercise == '02.relu'
                  else x)
        launched = [{'name': 'k', 'module': '__main__', 'shapes': [], 'inputs': [], 'bases': [],
                     'storages': []}]
        facts = {'returned': None, 'returned_other': False, 'host': [], 'changed_later': [],
                 'launched': launched, 'allocations': []}
        _send({'op': 'called', 'facts': facts}, [r.numpy().tobytes() for r in raws])
""",
    "out_set": """
import torch
def copy_2d(x, out):
    out.set_(x.clone())
""",
    # json.dumps (no options) is json._default_encoder.encode: an `encode` put in that object's own dictionary
    # (which no snapshot of modules and classes holds) rewrote each message the sandbox sent, before its MAC
    "json_default_encoder": """
import json, torch, triton, triton.language as tl
@triton.jit
def _touch(p):
    pass
_encode = type(json._default_encoder).encode
def _forged(o):
    if isinstance(o, dict) and isinstance(o.get("facts"), dict):
        o = dict(o, facts=dict(o["facts"], host=[], changed_later=[]))
    return _encode(json._default_encoder, o)
json._default_encoder.encode = _forged
def add(x, y, out):
    _touch[(1,)](out)
    out.copy_(x + y)
""",
    # The sandbox sends each output back as raw.cpu().numpy().tobytes(), after the checker's last look: a
    # numpy() put on torch.Tensor over TensorBase's (no name torch.Tensor had of its own, which was all the
    # sandbox compared), or a TorchFunctionMode left entered, is handed the output's bytes there, and wrote the
    # host's answer into them. The kernel only copies x.
    "shadow_tensor_numpy": _ANSWER_LATER + """
_numpy = torch.Tensor.numpy
def _answered(self, *args, **kwargs):
    return _numpy(_answer(self), *args, **kwargs)
torch.Tensor.numpy = _answered
""",
    "torch_function_mode": _ANSWER_LATER + """
from torch.overrides import TorchFunctionMode
class Answer(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "numpy":
            return func(_answer(args[0]))
        return func(*args, **(kwargs or {}))
Answer().__enter__()
""",
    "del_after_return": """
import torch, triton, triton.language as tl
@triton.jit
def _touch(p):
    pass
class Later(tuple):  # a tuple is no return value to complain about; its __del__ runs after the last look
    def __del__(self):
        x, y, out = self
        out.copy_(x + y)
def add(x, y, out):
    _touch[(1,)](out)
    return Later((x, y, out))
""",
}

# --- host computation past the op recorder: each defines add (and relu) with a side door; the kernel
# stores nothing or copies what the host computed. The interpreter's byte tracking (guard.Tracker)
# refuses all of them; the code scan flags them too ---------------------------------------------

_KERNELS = """
import ctypes, threading, numpy as np, torch, triton, triton.language as tl
@triton.jit
def _touch(p):
    pass
@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)
def _copied(src, out):
    _copy[(triton.cdiv(out.numel(), 1024),)](src, out, out.numel(), BLOCK=1024)
"""

SIDE_DOORS = {
    "thread": ("threads", _KERNELS + """
def add(x, y, out):
    tmp = torch.empty_like(out)
    t = threading.Thread(target=lambda: tmp.copy_(x + y))
    t.start(); t.join()
    _copied(tmp, out)
def relu(x, out):
    t = threading.Thread(target=lambda: out.copy_(x.clamp_min(0)))
    t.start(); t.join()
    _touch[(1,)](out)
"""),
    "disable_modes": ("torch._C internals", _KERNELS + """
def add(x, y, out):
    with torch.utils._python_dispatch._disable_current_modes():
        tmp = x + y
    _copied(tmp, out)
def relu(x, out):
    with torch._C._DisableTorchDispatch():
        out.copy_(x.clamp_min(0))
    _touch[(1,)](out)
"""),
    "autotune_pre_hook": ("autotune hook", _KERNELS + """
def _hook(args):
    args['out_ptr'].copy_(args['x_ptr'] + args['y_ptr'])
@triton.autotune(configs=[triton.Config({}, pre_hook=_hook)], key=[])
@triton.jit
def _noop(x_ptr, y_ptr, out_ptr):
    pass
def add(x, y, out):
    _noop[(1,)](x, y, out)
def _relu_hook(args, reset_only=False):
    args['out_ptr'].copy_(args['x_ptr'].clamp_min(0))
@triton.autotune(configs=[triton.Config({})], key=[], pre_hook=_relu_hook)
@triton.jit
def _noop1(x_ptr, out_ptr):
    pass
def relu(x, out):
    _noop1[(1,)](x, out)
"""),
    "torch_in_jit": ("torch inside @triton.jit", _KERNELS + """
G = {}
@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    G['out'].copy_(G['x'] + G['y'])
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=offs < n), mask=offs < n)
def add(x, y, out):
    G.update(x=x, y=y, out=out)
    _add_kernel[(triton.cdiv(out.numel(), 1024),)](x, y, out, out.numel(), BLOCK=1024)
@triton.jit
def _relu_kernel(x_ptr, out_ptr):
    G['out'].copy_(G['x'].clamp_min(0))
def relu(x, out):
    G.update(x=x, out=out)
    _relu_kernel[(1,)](x, out)
"""),
    "ctypes_data_ptr": ("data_ptr with ctypes/NumPy", _KERNELS + """
def _np(t):
    return np.ctypeslib.as_array((ctypes.c_float * t.numel()).from_address(t.data_ptr()))
def add(x, y, out):
    _touch[(1,)](out)
    _np(out)[:] = _np(x) + _np(y)
def relu(x, out):
    tmp = torch.empty_like(out)
    _np(tmp)[:] = np.maximum(_np(x.contiguous()), 0)
    _copied(tmp, out)
"""),
}

# ctypes over data_ptr() reads host memory in the interpreter only: on a GPU the address is the device's, and
# reading it from the host crashes the notebook's own process (no side door there, no test either)
HOST_MEMORY = interpreter_only_because("tensors in GPU memory: data_ptr() is no host address")
# The byte tracker (which bytes a kernel stored) follows the interpreter's memory; on a GPU a tensor computed
# with the dispatch modes disabled is the op ledger's (guard.OpLedger), in both modes; torch inside
# @triton.jit does not compile on a GPU (no side door there).
INTERPRETER_TRACKER = interpreter_only_because("the byte tracker is the interpreter's")
_DOOR_MARKS = {"ctypes_data_ptr": HOST_MEMORY,
               "torch_in_jit": interpreter_only_because("a GPU compile refuses torch in a kernel")}
_INTERACTIVE_MARKS = _DOOR_MARKS


def _side_door_params(marks: dict) -> list:
    return [pytest.param(name, marks=marks[name]) if name in marks else name for name in sorted(SIDE_DOORS)]


SIDE_DOOR_NAMES = _side_door_params(_DOOR_MARKS)
INTERACTIVE_DOOR_NAMES = _side_door_params(_INTERACTIVE_MARKS)

# --- attacks on the run (added to the solution: they must not cost anybody anything) -------------

HARM = {
    "overwrite_others": f"""
import glob, json, os
stub = {{'cells': [], 'metadata': {{}}, 'nbformat': 4, 'nbformat_minor': 5}}
paths = set()
for top in ('/submission', '/tmp', '/work', '/root', '/home', '/course'):
    paths.update(glob.glob(top + '/**/*.ipynb', recursive=True))
for pid in os.listdir('/proc'):
    try:
        cmd = open(f'/proc/{{pid}}/cmdline', 'rb').read().decode(errors='replace').split('\\0')
    except OSError:
        continue
    for arg in cmd:
        if os.path.isdir(arg):
            paths.update(glob.glob(os.path.join(arg, '*.ipynb')) + glob.glob(os.path.join(arg, '*', '*.ipynb')))
for path in paths:
    if os.path.abspath(path) == os.path.abspath('{{me}}'):
        continue
    try:
        json.dump(stub, open(path, 'w'))
        open(os.path.join(os.path.dirname(path), 'planted_{MARKER}.txt'), 'w').write('x')
    except OSError:
        pass
""",
    "backdoor_harness": f"""
import course_utils, course_utils.grading.harness as h, os
for path in (h.__file__, course_utils.__file__):
    try:
        with open(path, 'a') as f:
            f.write('\\ncompare = lambda *a, **k: []  # BACKDOOR_{MARKER}\\n')
    except OSError as exc:
        print('refused:', exc)
""",
    "signal_grader": """
import os, signal
for pid in (os.getppid(), 1):
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
""",
    "kill_siblings": """
import os, signal
mine = {int(t) for t in os.listdir('/proc/self/task')}
for pid in range(1, 5000):
    if pid not in mine:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
""",
    "setsid_daemon": f"""
import subprocess, sys
subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(600)  # {MARKER}'],
                 start_new_session=True)
""",
    # past the data limit of either mode (sandbox.Limits: 3 GiB on a CPU, GPU_MEMORY on a GPU)
    "allocate_20gib": "import torch\nbig = torch.ones(20 << 30, dtype=torch.uint8)",
    "network": """
import socket
try:
    socket.create_connection(('1.1.1.1', 53), timeout=3)
    print('network reachable')
except OSError as exc:
    print('no network:', exc)
""",
}
LOUD = "print('x' * (200 << 20))"


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _snapshot(folder: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def _survivors() -> list[str]:
    """Processes whose command line carries the marker, or that run as a sandbox's uid."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            uid = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if line.startswith("Uid:")))
        except (OSError, StopIteration, ValueError):
            continue
        if MARKER in cmd or sandbox.ROOT_UIDS <= uid < sandbox.ROOT_UIDS + 64:
            found.append(f"{pid}: {cmd[:80]}")
    return found


def _temp_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("course-grade-*")}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if sandbox.probe():
        pytest.skip(f"no sandbox here: {sandbox.probe()}")
    folder = tmp_path_factory.mktemp("attacks")
    solution, exercise = _load("solutions"), _load("exercises")

    def write(name: str, nb: dict) -> None:
        text = json.dumps(nb, indent=1).replace("{me}", f"/submission/{name}")
        (folder / name).write_text(text)

    write("aaa_honest.ipynb", solution)
    for name, source in CREDIT.items():
        write(f"credit_{name}.ipynb", _with_cell(exercise, source))
    for name, (_, source) in SIDE_DOORS.items():  # after the relu stub too, which would replace it
        write(f"side_door_{name}.ipynb", _with_cell(_with_cell(exercise, source), source, 'check("02.relu"'))
    for name, source in HARM.items():
        write(f"harm_{name}.ipynb", _with_cell(solution, source))
    write("harm_output.ipynb", _with_cell(solution, LOUD, before='check("02.relu"'))
    write("zzz_honest.ipynb", solution)
    before, course, temps = _snapshot(folder), _digest(ROOT / "course_utils"), _temp_dirs()
    report = tmp_path_factory.mktemp("report") / "grades"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = batch.main([str(folder)], timeout=TIMEOUT, report=str(report), jobs=2)
    time.sleep(1)
    data = json.loads(report.with_name("grades.json").read_text())
    return {"code": code, "table": out.getvalue(), "log": err.getvalue(), "folder": folder, "before": before,
            "course": course, "temps": temps, "data": data,
            "subs": {s["name"]: s for s in data["submissions"]}}


def test_grading_ran(graded):
    assert graded["code"] == 0, graded["log"]
    assert graded["data"]["sandbox"] == "bubblewrap"


def test_honest_submissions_get_full_marks(graded):
    for name in ("aaa_honest.ipynb", "zzz_honest.ipynb"):
        sub = graded["subs"][name]
        assert (sub["passed"], sub["total"]) == (3, 3), sub
        assert sub["flags"] == []


@pytest.mark.parametrize("name", sorted(CREDIT))
def test_no_credit_without_the_work(graded, name):
    sub = graded["subs"][f"credit_{name}.ipynb"]
    assert sub["passed"] == 0, sub
    assert set(sub["exercises"]) == {"02.vector_add", "02.relu", "02.copy_2d"}, "no invented exercise"


def test_credit_attacks_are_flagged(graded):
    flags = {name: " ".join(graded["subs"][f"credit_{name}.ipynb"]["flags"]) for name in CREDIT}
    assert "frames" in flags["frame_expected"]
    assert "gc" in flags["gc_objects"]
    assert "Tensor.set_" in flags["out_set"]
    assert "exec/eval" in flags["exec_solution_notebook"]
    assert "assignment into course_utils" in flags["patch_checker"]
    assert "assignment into course_utils" in flags["patch_watcher"]
    assert "torch modes" in flags["torch_function_mode"]


FORGED_CHECK = """
import course_utils.grading.remote as r
chan = next(c.cell_contents for c in check.__closure__ if type(c.cell_contents).__name__ == "Channel")
def check(exercise, func):  # answers the grader itself: host torch, and facts that say a kernel ran
    chan.send({"op": "check", "exercise": exercise})
    while (msg := chan.recv())[0]["op"] != "done":
        ...
"""


def test_answering_the_grader_directly_is_flagged():
    """The sandbox's pipe to the grader is in the notebook's process. Its raw file descriptors alone give
    nothing (a message needs the MAC of the key only the grading code's channel holds: credit_raw_pipe);
    code that reaches the channel itself (a closure, the grader's modules) can report made-up facts, and
    only the flags show it."""
    from course_utils.grading import flags

    found = " ".join(flags.scan([FORGED_CHECK, "import os\nos.write(4, b'x')", "open('/dev/fd/4', 'wb')"]))
    assert "frames (cell 1)" in found and "the grader's modules (cell 1)" in found
    assert "raw file descriptors (cells 2, 3)" in found


SPY_ON_THE_CHANNEL = """
g = check.__globals__  # the sandbox's check() is defined in the grader's remote module
_send = g["Channel"].send
def _spy(self, *args, **kwargs):  # the next message the grading code sends hands over its channel
    captured.append(self)
    return _send(self, *args, **kwargs)
captured, g["Channel"].send = [], _spy
"""


@pytest.mark.parametrize("source, flag", [
    (SPY_ON_THE_CHANNEL, "object internals"),
    ("import sys\nremote = sys.modules['course_utils.grading.' + 'remote']", "sys.modules"),
    ("from sys import modules", "sys.modules"),
    ("import os\nw = getattr(os, 'wr' + 'ite')", "computed attribute names"),
    ("import os as o\no.write(4, b'x')", "raw file descriptors"),
    ("classes = ().__class__.__base__.__subclasses__()", "object internals"),
    ("names = vars(check)", "object internals"),
    # the builtins the watcher calls (sorted: Watch.compute_ops), reached by a string the scan did not read
    ('b = globals()["__builtins__"]\nb.sorted = len', "exec/eval"),
    ("import operator\ng = operator.attrgetter('__' + 'globals__')(check)", "computed attribute names"),
    ("from operator import attrgetter\ng = attrgetter('__globals__')(check)", "object internals"),
    # the channel in check's closure through inspect reached as another module's attribute
    ("import triton\nchan = triton.runtime.jit.inspect.getclosurevars(check).nonlocals", "inspect (frames)"),
    ("from triton.runtime.jit import inspect", "inspect (frames)"),
    ("from torch.utils.dlpack import to_dlpack", "DLPack (tensor memory to NumPy)"),
    ("kernel.add_pre_run_hook(compute_on_the_host)", "kernel hooks"),
    ("x.untyped_storage()._write_file(f, False, False, 1)", "tensor storage internals"),
    ("from torch.utils._python_dispatch import _push_mode\n_push_mode(Beneath())", "torch._C internals"),
    ("view.__array_interface__ = {'data': (getattr(x, 'data_ptr')(), False)}", "NumPy over raw memory"),
    ("class D(torch.Tensor):\n    @classmethod\n    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):\n"
     "        pass", "tensor subclass internals"),
    # attribute names that are no attribute syntax: a match statement's class pattern reads them (the forged
    # check through the closure below got 3/3 on the unsolved notebook, unflagged), as do a format string's
    # fields for a string.Formatter that keeps the objects, and a class's __match_args__
    ("match check:\n    case object(__closure__=cells, __globals__={'Decoder': D}):\n        pass", "frames"),
    ("import course_utils\nmatch course_utils:\n    case object(grading=g):\n        pass", "the grader's modules"),
    ("import string\nclass Grab(string.Formatter):\n    def format_field(self, value, spec):\n"
     "        got.append(value)\n", "computed attribute names"),
    ("Grab().format('{0.__closure__[0].cell_contents}', check)", "frames"),
    ("import torch\ncells = torch.fx.graph_module._get_attr(check, '__clo' + 'sure__')", "computed attribute names"),
    ("from torch.fx.passes.split_utils import getattr_recursive", "computed attribute names"),
    ("class Cells(metaclass=AnyObject):\n    __match_args__ = ('__closure__',)\nmatch check:\n"
     "    case Cells(cells):\n        pass", "frames"),
])
def test_reaching_the_grader_without_naming_it_is_flagged(source, flag):
    """The grader's channel (and with it a made-up answer to every check, 3/3 on the unsolved notebook) is
    one `check.__globals__` away, or a `sys.modules` lookup, or any class alive: flagged like a closure."""
    from course_utils.grading import flags

    assert any(found.startswith(flag) for found in flags.scan([source])), flags.scan([source])


# Code in a string, run by a door of the libraries a notebook may import: the scan cannot read it. Hidden
# there, the forged check through check's closure (FORGED_CHECK) got 3/3 on the unsolved notebook, unflagged.
HIDDEN_CODE = {
    "inductor_code_cache": "from torch._inductor.codecache import PyCodeCache\n"
                           "check = PyCodeCache.load(SOURCE).install(check)",
    "code_cache_module": "import torch._inductor.codecache as cc\ncheck = cc.PyCodeCache.load(SOURCE).check",
    "code_cache_attribute": "import torch\nm = torch._inductor.codecache.PyCodeCache.load(SOURCE)",
    "fx_exec": "import torch\ntorch.fx.graph_module._exec_with_source(SOURCE, globals())",
    "triton_c_module": "import triton\nm = triton.runtime.build.compile_module_from_src(C_SOURCE, 'm')",
    "numpy_c_extension": "import numpy as np\nm = np.testing.extbuild.build_and_import_extension('m', FUNCS)",
    "sympy_eval": "import torch\ntorch.utils._sympy.functions.sympy.sympify(SOURCE)",
    "shared_library": "import torch\ntorch.ops.load_library('/tmp/mine.so')",
    # a file the notebook wrote, run by the library: hubconf.py, a package's modules
    "torch_hub_local": "import torch\nopen('/tmp/hubconf.py', 'w').write(SOURCE)\n"
                       "check = torch.hub.load('/tmp', 'check', source='local')",
    "torch_package": "from torch.package import PackageImporter\nm = PackageImporter('/tmp/p.zip').import_module('m')",
    "fx_reduce_graph_module": "import torch\ntorch.fx.graph_module.reduce_graph_module({'code': SOURCE}, '')",
}


@pytest.mark.parametrize("source", [
    "import torch._inductor.config as c\nc.load_config(BLOB)",  # pickle.loads of bytes the notebook made
    "import numpy as np\nnp.load('/tmp/o.npy', None, True)",  # allow_pickle by position
    "import numpy as np\nnp.lib.format.read_array(f, True)",
    "import torch\ntorch.load(f, None, module_with_an_unpickler)",  # pickle_module by position: weights_only off
])
def test_unpickling_however_it_is_asked_for_is_flagged(source):
    from course_utils.grading import flags

    assert any(found.startswith("unpickling") for found in flags.scan([source])), flags.scan([source])


def test_loading_without_pickles_is_no_flag():
    from course_utils.grading import flags

    assert flags.scan(["import numpy as np, torch\na = np.load('a.npy')\nb = np.load('b.npy', None, False)\n"
                       "t = torch.load('t.pt', 'cpu')"]) == []


@pytest.mark.parametrize("name", sorted(HIDDEN_CODE))
def test_code_run_from_a_string_by_a_library_is_flagged(name):
    from course_utils.grading import flags

    assert any(found.startswith("exec/eval") for found in flags.scan([HIDDEN_CODE[name]])), \
        flags.scan([HIDDEN_CODE[name]])


@pytest.mark.parametrize("source, flag", [
    ("_ = %who_ls\n" + FORGED_CHECK, "frames"),  # a magic made the whole cell unparseable: it went unscanned
    ("x = !ls\nimport gc", "gc"),
    ("print?\nimport gc", "gc"),
    ("%time import gc", "gc"),  # the code a magic runs
    ("%%capture\nimport ctypes", "ctypes"),
    ("get_ipython().run_cell('import g' + 'c')", "IPython internals"),
    ("%run other.py", "shell commands or code from elsewhere"),
    ("files = !cat /etc/passwd", "shell commands or code from elsewhere"),
], ids=["magic line", "shell assignment", "help", "%time", "%%capture", "run_cell", "%run", "shell"])
def test_ipython_syntax_hides_nothing_from_the_scan(source, flag):
    """The scan reads a cell as IPython runs it: a magic or shell line once made ast.parse fail and the
    whole cell went unscanned (the closure-channel forgery below `_ = %who_ls` gave 3/3 with no flag)."""
    from course_utils.grading import flags

    assert any(found.startswith(flag) for found in flags.scan([source])), flags.scan([source])


def test_a_cell_too_big_to_rewrite_is_flagged_not_scanned_for_minutes():
    """IPython reads a cell again for every magic or shell line it rewrites: 120 of them among 30,000 other
    lines kept the grader's own process (no sandbox, no timeout yet) busy for 68 s; a few such cells,
    hours. Such a cell is scanned without the rewrite, at once, and flagged for the instructor."""
    from course_utils.grading import flags

    cell = "x = !true\n" * 120 + "a = 1\n" * 30_000 + "import gc"
    start = time.monotonic()
    found = flags.scan([cell, "%time import ctypes"])
    assert time.monotonic() - start < 5
    assert "a cell too big to scan as IPython runs it (read it yourself) (cell 1)" in found, found
    assert any(f.startswith("ctypes") for f in found), found  # the other cells as IPython runs them


def test_a_cell_nested_too_deep_to_parse_is_flagged_and_its_checks_found():
    """`x = 1+1+...` 50,000 times is deeper than Python's parser: the RecursionError of the scan left the grader's
    thread, and the notebook was a "grader error", ungraded and unflagged."""
    from course_utils.grading import batch, flags

    deep = "x = 1" + "+1" * 50_000 + "\ncheck('02.relu', relu)"
    assert flags.scan([deep]) == [f"{flags.TOO_DEEP} (cell 1)"]
    assert batch.check_ids(deep) == ["02.relu"]


@pytest.mark.parametrize("name", SIDE_DOOR_NAMES)
def test_host_computation_through_side_doors_gets_no_credit(graded, name):
    flag, _ = SIDE_DOORS[name]
    sub = graded["subs"][f"side_door_{name}.ipynb"]
    assert sub["passed"] == 0, sub
    for exercise in ("02.vector_add", "02.relu"):
        assert sub["exercises"][exercise]["status"] == "fail", sub["exercises"][exercise]
        assert "host" in sub["exercises"][exercise]["detail"], sub["exercises"][exercise]
    assert any(f.startswith(flag) for f in sub["flags"]), sub["flags"]


@pytest.mark.parametrize("name", sorted(HARM))
def test_hostile_cells_harm_nobody(graded, name):
    sub = graded["subs"][f"harm_{name}.ipynb"]
    assert sub["status"] == "graded", sub
    assert sub["passed"] == 3, sub  # the hostile cell did not even cost its author


def test_too_much_output_stops_that_notebook_only(graded):
    sub = graded["subs"]["harm_output.ipynb"]
    assert sub["status"] == "too much output"
    assert sub["exercises"]["02.vector_add"]["status"] == "pass"
    assert sub["exercises"]["02.relu"]["status"] == "too much output"


def test_the_big_allocation_failed_inside_its_sandbox(graded):
    assert sandbox.Limits().memory < sandbox.GPU_MEMORY < 20 << 30, "the attack allocates past either limit"
    assert "cell" in graded["subs"]["harm_allocate_20gib.ipynb"]["notes"]
    assert "raised" in graded["subs"]["harm_allocate_20gib.ipynb"]["notes"]


def test_submissions_and_course_files_are_unchanged(graded):
    assert _snapshot(graded["folder"]) == graded["before"], "bytes and mtimes unchanged, no file added"
    # The whole package's digest is unchanged unless somebody edits the checkout meanwhile (a shared
    # working tree): the backdoor itself is looked for in every file either way.
    backdoored = [p.name for p in (ROOT / "course_utils").rglob("*.py") if BACKDOOR in p.read_text()]
    assert backdoored == []
    if os.environ.get("CI"):
        assert _digest(ROOT / "course_utils") == graded["course"]


def test_no_process_and_no_temporary_folder_survives(graded):
    assert _survivors() == []
    assert _temp_dirs() <= graded["temps"]


def test_the_report_is_the_table_printed(graded):
    rows = [re.split(r"\s{2,}", line.strip()) for line in graded["table"].splitlines()
            if not set(line) <= {"-", " "}]
    by_name = {row[0]: row for row in rows[1:]}
    assert set(by_name) == set(graded["subs"])
    for name, sub in graded["subs"].items():
        assert by_name[name][len(graded["data"]["exercises"]) + 1] == (f"{sub['passed']}/{sub['total']}"
                                                                        if sub["total"] else "-")


@needs_sandbox
def test_interrupting_the_grader_kills_its_sandboxes(tmp_path):
    """SIGTERM (as Ctrl-C): exit 130, no report, no sandbox and no temporary folder left."""
    loop = _with_cell(_load("solutions"), f"import time\nwhile True:\n    time.sleep(1)  # {MARKER}")
    (tmp_path / "loop.ipynb").write_text(json.dumps(loop))
    temps = _temp_dirs()
    proc = subprocess.Popen([sys.executable, "-m", "course_utils", "grade", str(tmp_path / "loop.ipynb"),
                             "--report", str(tmp_path / "grades")], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            Path(f"/proc/{p}/status").exists() and "bwrap" in Path(f"/proc/{p}/comm").read_text()
            for p in os.listdir("/proc") if p.isdigit() and _is_child(int(p), proc.pid)):
        time.sleep(0.5)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted, no report written" in err
    assert not (tmp_path / "grades.json").exists()
    time.sleep(1)
    assert _survivors() == []
    assert _temp_dirs() <= temps


WRITE_EVERYWHERE = """
import os
for folder in ("/", "/dev", "/dev/shm", "/tmp", "/submission"):
    mib = 0
    try:
        with open(os.path.join(folder, "filler"), "wb", buffering=0) as f:
            while mib < 64:
                f.write(bytes(1 << 20))
                mib += 1
    except OSError:
        pass
    print(folder, mib)
"""


def _python_in_sandbox(tmp_path, code: str, *argv: str, user: str = "", gpu: bool = False,
                       limits: sandbox.Limits | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -c code *argv` in a sandbox of lesson 02's staged course, the solution notebook its submission.
    user="unprivileged": the command of a grader that is not root (bwrap makes a user namespace), whoever
    runs the test."""
    course = sandbox.stage_package(tmp_path, 2)
    with open(ROOT / "solutions" / "02_first_kernels.ipynb", "rb") as f:
        with pytest.MonkeyPatch.context() as patch:
            if user == "unprivileged":
                patch.setattr(sandbox.os, "geteuid", lambda: 1000)
            cmd = sandbox.command(course, f.fileno(), "nb.ipynb", gpu=gpu, limits=limits or sandbox.Limits())
        return subprocess.run([*cmd[:cmd.index("-m")], "-c", code, *argv], pass_fds=(f.fileno(),),
                              capture_output=True, text=True, timeout=timeout)


@needs_sandbox
@pytest.mark.parametrize("user", ["root", "unprivileged"])
def test_a_sandbox_writes_only_into_its_size_limited_folders(user, tmp_path):
    """A grader run by an ordinary user gives each sandbox a user namespace, where the tmpfs that bwrap makes
    for the root and for /dev (half the machine's memory each: tmpfs pages are no process's data, past
    the memory limit) belonged to the sandbox: a notebook could fill the machine's memory through them.
    Only /tmp and /submission, of `limits.tmpfs` bytes, and /dev/shm, of `limits.shm`, take writes."""
    limits = sandbox.Limits(tmpfs=8 << 20)
    limits.shm = 4 << 20
    done = _python_in_sandbox(tmp_path, WRITE_EVERYWHERE, user=user, limits=limits)
    mib = {folder: int(n) for folder, n in (line.split() for line in done.stdout.splitlines())}
    assert mib["/"] == mib["/dev"] == 0, (done.stdout, done.stderr)
    assert mib["/dev/shm"] <= 4 and 0 < mib["/tmp"] <= 8 and 0 < mib["/submission"] <= 8, done.stdout


@needs_sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="a root grader's sandboxes switch uid with setpriv")
def test_a_root_graders_sandbox_holds_no_capability_and_can_gain_none(tmp_path):
    """setpriv empties the bounding set before it switches to the sandbox's uid. Without CAP_SETPCAP it
    cannot: libcap-ng 0.8.3 (Debian 12) then left the bounding set full unsaid, and 0.8.4 (Ubuntu 24.04,
    the GPU image) made setpriv exit 127, so that every notebook died at its first cell."""
    done = _python_in_sandbox(tmp_path, "print(open('/proc/self/status').read())")
    assert done.returncode == 0, done.stderr
    status = dict(line.split(":\t", 1) for line in done.stdout.splitlines() if ":\t" in line)
    assert status["Uid"].split()[0] == str(sandbox.ROOT_UIDS) and status["NoNewPrivs"] == "1"
    assert {status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0" * 16}, status


READ_ETC = """
import os, subprocess, sys
unread = []
for path in sys.argv[1:]:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, "rb").close()
    except OSError:
        unread.append(path)
print(subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True).returncode, unread)
"""


@needs_sandbox
@pytest.mark.parametrize("user", ["root", "unprivileged"])
def test_the_sandboxs_user_reads_the_system_files_bound_for_it(user, tmp_path):
    """bwrap makes the folders above a bound file 0700, root's: a root grader's sandbox (uid 60001) could
    not read /etc/ld.so.cache, so `/sbin/ldconfig -p`, which Triton runs to find libcuda, failed, and with
    it every kernel launch on the GPU image; nor the time zone, the certificates or the fonts."""
    done = _python_in_sandbox(tmp_path, READ_ETC, *sandbox._etc_files(), user=user)
    assert done.stdout.split(None, 1) == ["0", "[]\n"], (done.stdout, done.stderr)


@needs_sandbox
def test_triton_inside_a_gpu_sandbox_finds_the_driver_the_grader_found(tmp_path, monkeypatch):
    """Triton finds libcuda with `/sbin/ldconfig -p` unless TRITON_LIBCUDA_PATH names its folder; inside the
    sandboxes of the GPU image ldconfig failed, and every kernel launch with it. The grader passes on the
    folder its own Triton found, and binds it when /usr does not hold it (here a stand-in under /tmp)."""
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setattr(sandbox, "_libcuda_dirs", lambda: [str(driver)])
    probe = "from triton.backends.nvidia.driver import libcuda_dirs; print(libcuda_dirs())"
    done = _python_in_sandbox(tmp_path, probe, gpu=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == repr([str(driver.resolve())]), done.stderr


def _is_child(pid: int, parent: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == parent


# --- the same side doors against the interactive check() (no sandbox needed) ---------------------

HONEST_VARIANTS = {
    "stores_twice": _KERNELS + """
@triton.jit
def _twice(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, x, mask=offs < n)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=offs < n) + tl.load(y_ptr + offs, mask=offs < n),
             mask=offs < n)
def add(x, y, out):
    _twice[(triton.cdiv(out.numel(), 256),)](x, y, out, out.numel(), BLOCK=256)
""",
    "zero_then_atomics": _KERNELS + """
@triton.jit
def _acc(src, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)
def add(x, y, out):
    out.zero_()
    tmp = torch.empty_like(out)
    _copied(x, tmp)
    for t in (tmp, y):
        _acc[(triton.cdiv(out.numel(), 256),)](t, out, out.numel(), BLOCK=256)
""",
}


def _candidate(source: str, name: str):
    """The names a candidate's source defines, run from a file of its own (helpers.run_from_file)."""
    return run_from_file(source, f"candidate_{name}")


@pytest.mark.parametrize("name", INTERACTIVE_DOOR_NAMES)
def test_side_doors_fail_the_interactive_check(name):
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    namespace = _candidate(SIDE_DOORS[name][1], name)
    for exercise, func in (("02.vector_add", "add"), ("02.relu", "relu")):
        with pytest.raises(CheckFailed) as failed:
            check(exercise, namespace[func], seed=1, quiet=True)
        found = str(failed.value)
        assert any(text in found for text in ("holds bytes that no kernel stored", "host code",
                                              "dispatch modes turned off")), found


@INTERPRETER_TRACKER
def test_the_tracker_says_what_it_found():
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    thread = _candidate(SIDE_DOORS["thread"][1], "thread")
    with pytest.raises(CheckFailed, match=r"`the tensor made by aten.empty_like at .*"
                                          r".*holds bytes that no kernel stored \(read back by a tl.load"):
        check("02.vector_add", thread["add"], seed=1, quiet=True)
    with pytest.raises(CheckFailed, match=r"`out` holds bytes that no kernel stored \(found after"):
        check("02.relu", thread["relu"], seed=1, quiet=True)
    numpy_made = _candidate(_KERNELS + """
def add(x, y, out):
    _copied(torch.from_numpy(np.zeros(out.numel(), dtype=np.float32)), out)
""", "numpy_made")
    with pytest.raises(CheckFailed, match=r"`_copy` was launched with `src`, a tensor over memory torch did not"):
        check("02.vector_add", numpy_made["add"], seed=1, quiet=True)
    hooks = _candidate(SIDE_DOORS["autotune_pre_hook"][1], "hooks")
    with pytest.raises(CheckFailed, match=r"runs host code around its launches \(a triton.Config pre_hook of `_noop`"):
        check("02.vector_add", hooks["add"], seed=1, quiet=True)


# Torch with its dispatch modes switched off, every way torch offers: each op runs past the recorder, and
# torch's profiler (guard.OpLedger) sees it all the same, in both modes and in function exercises too.
_MODES_OFF = {
    "disable_current_modes": "torch.utils._python_dispatch._disable_current_modes()",
    "DisableTorchDispatch": "torch._C._DisableTorchDispatch()",
    "ExcludeDispatchKeyGuard": "torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python))",
}


@pytest.mark.parametrize("switch", sorted(_MODES_OFF))
def test_torch_with_dispatch_modes_off_fails_every_check(switch):
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    doors = _candidate(_KERNELS + f"""
def add(x, y, out):
    with {_MODES_OFF[switch]}:
        tmp = x + y
    _copied(tmp, out)
def contiguous_strides(shape):
    with {_MODES_OFF[switch]}:
        return tuple(torch.empty(shape, device="meta").stride())
""", f"modes_off_{switch}")
    with pytest.raises(CheckFailed, match=r"ran torch ops with torch's dispatch modes turned off or bypassed "
                                          r"\(aten::add"):
        check("02.vector_add", doors["add"], seed=1, quiet=True)
    with pytest.raises(CheckFailed, match=r"dispatch modes turned off or bypassed \(aten::empty"):
        check("01.contiguous_strides", doors["contiguous_strides"], seed=1, quiet=True)


_PAST_THE_LEDGER = {  # name: (the function's body, after `def add(x, y, out):`, and what the failure says)
    # torch.tensor reads its list's items with the Python key excluded: an item's __float__ runs unseen
    "float_of_a_list_item": ("""
    class Box:
        def __float__(self):
            self.sum = x + y
            return 0.0
    box = Box()
    torch.tensor([box], dtype=torch.float32)
    _copied(box.sum, out)""", r"dispatch modes turned off or bypassed \(aten::add"),
    # RecordFunction switched off around the modes switched off: the profiler would record nothing
    "record_function_off": ("""
    torch.autograd._enable_record_function(False)
    with torch._C._DisableTorchDispatch():
        tmp = x + y
    torch.autograd._enable_record_function(True)
    _copied(tmp, out)""", r"switched off torch's RecordFunction"),
    # the checker's own range names, read and opened around the hidden op
    "the_checkers_ranges": ("""
    from course_utils.grading.guard import OpLedger
    from torch._C._profiler import _RecordFunctionFast
    with _RecordFunctionFast(OpLedger.MARK), torch._C._DisableTorchDispatch():
        tmp = x + y
    _copied(tmp, out)""", r"profiler ranges under the checker's own names"),
    # a tensor built from 0-d tensors: torch reads each one out with the Python key excluded (a host read)
    "built_from_items": ("""
    tmp = torch.tensor(list(x.unbind()), dtype=x.dtype, device=x.device)
    _copied(tmp, out)""", r"read tensor data into Python/NumPy on the host \(Tensor.item\)"),
}


@pytest.mark.parametrize("name", sorted(_PAST_THE_LEDGER))
def test_ways_past_the_op_ledger_fail(name):
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    body, message = _PAST_THE_LEDGER[name]
    code = _candidate(_KERNELS + "def add(x, y, out):" + body + "\n", f"ledger_{name}")
    with pytest.raises(CheckFailed, match=message):
        check("02.vector_add", code["add"], seed=1, quiet=True)


def test_torch_inference_mode_is_no_way_past_the_ledger():
    """Under inference_mode composite ops (reshape, flatten) reach the recorder whole: honest, and seen."""
    from course_utils import setup
    from course_utils.grading import check

    setup(quiet=True)
    code = _candidate(_KERNELS + """
@torch.inference_mode()
def add(x, y, out):
    flat = out.flatten().reshape(-1)
    _copied(x.reshape(-1), flat)
@triton.jit
def _add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) + tl.load(y + offs, mask=offs < n), mask=offs < n)
@torch.inference_mode()
def honest(x, y, out):
    _add[(triton.cdiv(out.numel(), 1024),)](x.reshape(-1), y.view(-1), out.flatten(), out.numel(), BLOCK=1024)
""", "inference_mode")
    check("02.vector_add", code["honest"], seed=1, quiet=True)


def test_a_tensor_torch_made_before_the_call_may_feed_a_kernel():
    """A table built once, a scratch buffer kept between calls: honest on a GPU, honest here too (followed from
    its launch on: a kernel that reads it gets its bytes as they were)."""
    from course_utils import setup
    from course_utils.grading import check

    setup(quiet=True)
    honest = _candidate(_KERNELS + """
@triton.jit
def _add(x, y, zero, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    z = tl.load(zero)  # a table of one entry, built once
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) + tl.load(y + offs, mask=offs < n) + z, mask=offs < n)
from course_utils.mode import current
ZERO = torch.zeros(1, device=current().device)
def add(x, y, out):
    _add[(triton.cdiv(out.numel(), 1024),)](x, y, ZERO, out, out.numel(), BLOCK=1024)
""", "table")
    check("02.vector_add", honest["add"], seed=1, quiet=True)


_SHARED = _KERNELS + """
import struct
@triton.jit
def _convert(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n).to(dst.dtype.element_ty), mask=offs < n)
def _launch(src, dst, n):
    _convert[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)
X, Y, SUM = (torch.zeros(1 << 21) for _ in range(3))
FILES = ["/dev/shm" + t.untyped_storage()._share_filename_cpu_()[1].decode() for t in (X, Y, SUM)]
def _values(path, n):
    with open(path, "rb") as f:
        f.seek(64)  # after torch's header (a reference count)
        return memoryview(f.read(4 * n)).cast("f")
def add(x, y, out):
    n = out.numel()
    _launch(x, X, n)
    _launch(y, Y, n)
    with open(FILES[2], "r+b") as f:
        f.seek(64)
        f.write(struct.pack(f"{n}f", *[a + b for a, b in zip(_values(FILES[0], n), _values(FILES[1], n))]))
    _launch(SUM, out, n)
"""


@INTERPRETER_TRACKER
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_tensor_made_before_the_call_in_shared_memory_may_not_feed_a_kernel():
    """Tensors made before the call, moved to shared memory with a file name: a kernel copied x and y there,
    the host read them from /dev/shm as files, added in Python and wrote the sums into a third one's file,
    which a kernel copied into out (nothing the scan flags, no torch op). Shared memory is like NumPy's: the
    host reaches it past every op, so no kernel may be launched with it."""
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    from course_utils.grading import flags

    setup(quiet=True)
    with pytest.raises(CheckFailed, match=r"a tensor over memory shared with other processes"):
        check("02.vector_add", _candidate(_SHARED, "shared")["add"], seed=1, quiet=True)
    assert any(f.startswith("shared memory") for f in flags.scan([_SHARED])), flags.scan([_SHARED])


def test_a_profiler_around_the_check_is_named():
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    with torch.profiler.profile(), pytest.raises(CheckFailed, match=r"a torch profiler was running around the "
                                                                     r"check"):
        check("01.contiguous_strides", lambda shape: (1,) * len(shape), seed=1, quiet=True)


_DW = """
import torch, triton, triton.language as tl
@triton.jit
def _bwd(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, part_ptr, ticket_ptr, n_rows, n_cols, sdy, sx, sdx,
         TICKET: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * sx + cols, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * sdy + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(rstd_ptr + row)
    xhat, wdy = x * r, dy * w
    dx = (wdy - xhat * tl.sum(wdy * xhat, axis=0) / n_cols) * r
    tl.store(dx_ptr + row * sdx + cols, dx.to(dx_ptr.dtype.element_ty), mask=ok)
    if TICKET:  # each row's share in a buffer of its own; the last program to arrive adds them up
        tl.store(part_ptr + row * n_cols + cols, dy * xhat, mask=ok)
        if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == n_rows - 1:
            total = tl.zeros((BLOCK_N,), tl.float32)
            for r0 in range(0, n_rows):
                total += tl.load(part_ptr + r0 * n_cols + cols, mask=ok, other=0.0)
            tl.store(dw_ptr + cols, total, mask=ok)
    else:  # the sum carried from program to program: a plain load, add and store
        tl.store(dw_ptr + cols, tl.load(dw_ptr + cols, mask=ok) + dy * xhat, mask=ok)
def rmsnorm_backward(dy, x, weight, rstd, dx, dw, ticket=False):
    n_rows, n_cols = x.shape
    dw.zero_()
    part = torch.empty((n_rows, n_cols), dtype=torch.float32, device=x.device)
    counter = torch.zeros(1, dtype=torch.int32, device=x.device)
    _bwd[(n_rows,)](dy, x, weight, rstd, dx, dw, part, counter, n_rows, n_cols, dy.stride(0), x.stride(0),
                    dx.stride(0), TICKET=ticket, BLOCK_N=triton.next_power_of_2(n_cols))
def with_ticket(dy, x, weight, rstd, dx, dw):
    rmsnorm_backward(dy, x, weight, rstd, dx, dw, ticket=True)
"""


@INTERPRETER_TRACKER
def test_a_sum_carried_between_the_programs_of_a_launch_is_a_race():
    """Right in the interpreter, which runs programs one after another; on a GPU, by chance."""
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    code = _candidate(_DW, "dw_race")
    with pytest.raises(CheckFailed, match=r"program \(1, 0, 0\) of `_bwd` loaded bytes of `dw` that program "
                                          r"\(0, 0, 0\) of the same launch had stored(.|\n)*hint: the programs "
                                          r"of one launch run at the same time"):
        check("08.rmsnorm_backward", code["rmsnorm_backward"], seed=1, quiet=True)
    check("08.rmsnorm_backward", code["with_ticket"], seed=1, quiet=True)  # the last to arrive merges: fine
    dummy = _candidate(_DW.replace("    else:  # the sum carried", "    elif n_rows < 0:\n        pass\n    else:  # the sum carried")
                       .replace("    row = tl.program_id(0)\n", "    row = tl.program_id(0)\n    tl.atomic_add(ticket_ptr, 0)\n"),
                       "dw_race_dummy_atomic")
    # an atomic first that releases nothing: the carried sum is still a race
    with pytest.raises(CheckFailed, match=r"loaded bytes of `dw` that program \(0, 0, 0\) of the same launch"):
        check("08.rmsnorm_backward", dummy["rmsnorm_backward"], seed=1, quiet=True)
    # a fake lock: an atomic before the load and another after the store, their values unused, so nothing
    # waits for anything on a GPU; a real lock spins on its compare-and-swap and passes
    fake = _candidate(_DW.replace("    else:  # the sum carried", "    elif n_rows < 0:\n        pass\n    else:  # the sum carried")
                      .replace("        tl.store(dw_ptr + cols, tl.load(dw_ptr + cols, mask=ok) + dy * xhat, mask=ok)\n",
                               "        tl.atomic_add(ticket_ptr, 0)\n"
                               "        tl.store(dw_ptr + cols, tl.load(dw_ptr + cols, mask=ok) + dy * xhat, mask=ok)\n"
                               "        tl.atomic_add(ticket_ptr, 0)\n"), "dw_fake_lock")
    with pytest.raises(CheckFailed, match=r"loaded bytes of `dw` that program \(0, 0, 0\) of the same launch"):
        check("08.rmsnorm_backward", fake["rmsnorm_backward"], seed=1, quiet=True)
    lock = _candidate(_DW.replace("        tl.store(dw_ptr + cols, tl.load(dw_ptr + cols, mask=ok) + dy * xhat, mask=ok)\n",
                                  "        while tl.atomic_cas(ticket_ptr, 0, 1) == 1:\n            pass\n"
                                  "        tl.store(dw_ptr + cols, tl.load(dw_ptr + cols, mask=ok) + dy * xhat, mask=ok)\n"
                                  "        tl.debug_barrier()\n        tl.atomic_xchg(ticket_ptr, 0)\n"), "dw_lock")
    check("08.rmsnorm_backward", lock["rmsnorm_backward"], seed=1, quiet=True)


# Triton's layer-norm tutorial: the programs share two partial rows of dw (here in the buffer passed as dw_ptr),
# each under the lock of its row, and a second kernel adds the two rows
_GROUPED_LOCKS = _DW.replace(
    "        tl.store(dw_ptr + cols, tl.load(dw_ptr + cols, mask=ok) + dy * xhat, mask=ok)\n",
    "        lock = ticket_ptr + row % 2  # the lock of the partial row this program adds into\n"
    "        while tl.atomic_cas(lock, 0, 1) == 1:\n            pass\n"
    "        part = dw_ptr + (row % 2) * n_cols + cols\n"
    "        tl.store(part, tl.load(part, mask=ok, other=0.0) + dy * xhat, mask=ok)\n"
    "        tl.debug_barrier()\n        tl.atomic_xchg(lock, 0)\n") + """
from course_utils.lessons.l08_backward_passes import sum_rows
def grouped(dy, x, weight, rstd, dx, dw):
    n_rows, n_cols = x.shape
    part = torch.zeros((2, n_cols), dtype=torch.float32, device=x.device)
    locks = torch.zeros(max(n_rows, 2), dtype=torch.int32, device=x.device)
    _bwd[(n_rows,)](dy, x, weight, rstd, dx, part, part, locks, n_rows, n_cols, dy.stride(0), x.stride(0),
                    dx.stride(0), TICKET=False, BLOCK_N=triton.next_power_of_2(n_cols))
    sum_rows(part, dw)
"""


@INTERPRETER_TRACKER
def test_a_lock_orders_only_the_programs_that_take_the_same_lock():
    """Triton's layer-norm tutorial: the programs share two partial rows of dw, one lock per partial row. With
    the lock indexed by the program instead (a lock each), every program acquires and releases, and no two
    wait for each other: on a GPU programs 0 and 2 add into partial row 0 at the same time."""
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    check("08.rmsnorm_backward", _candidate(_GROUPED_LOCKS, "dw_grouped_locks")["grouped"], seed=1, quiet=True)
    own = _candidate(_GROUPED_LOCKS.replace("ticket_ptr + row % 2", "ticket_ptr + row"), "dw_lock_each")
    with pytest.raises(CheckFailed, match=r"program \(2, 0, 0\) of `_bwd` loaded bytes(.|\n)*Both "
                                          r"programs used atomics, but on different addresses"):
        check("08.rmsnorm_backward", own["grouped"], seed=1, quiet=True)


_SPILL = """
import triton, triton.language as tl
@triton.jit
def _add_spill(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, 2 * BLOCK)  # this program's block and the next one's
    s = tl.load(x_ptr + offs, mask=offs < n, other=0.0) + tl.load(y_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, tl.where(tl.arange(0, 2 * BLOCK) < BLOCK, s, -1.0), mask=offs < n)
def add(x, y, out):
    _add_spill[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
"""


@INTERPRETER_TRACKER
def test_a_store_over_another_programs_store_is_a_race():
    """Each program also writes -1 over the next program's block, which that program overwrites with the sums:
    in the interpreter, which runs programs in order, always; on a GPU, whichever store lands last wins."""
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    with pytest.raises(CheckFailed, match=r"program \(1, 0, 0\) of `_add_spill` stored other values over bytes of "
                                          r"`out` that program \(0, 0, 0\) of the same launch had stored"):
        check("02.vector_add", _candidate(_SPILL, "spill")["add"], seed=1, quiet=True)


@pytest.mark.parametrize("name", sorted(HONEST_VARIANTS))
def test_honest_kernels_that_store_twice_or_accumulate_pass(name):
    from course_utils import setup
    from course_utils.grading import check

    setup(quiet=True)
    check("02.vector_add", _candidate(HONEST_VARIANTS[name], name)["add"], seed=1, quiet=True)


# --- in-process attacks on what the checker counts: the host computes element by element, a launch hides
# in another's grid callable or behind flat views, the course's kernel runs under another name ----------

_IN_PROCESS = _KERNELS + """
import types
import course_utils.lessons.l02_first_kernels as lesson
def copy_2d(x, out):  # the strided gather done by the host, one element at a time, with no arithmetic op
    tmp = torch.empty_like(out)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            tmp[i, j].fill_(x[i, j])
    _copied(tmp, out)
def relu(x, out):  # the values read into Python with .item(), computed there, written back with fill_
    tmp = torch.empty_like(out)
    for i, value in enumerate(x.reshape(-1)):
        tmp.view(-1)[i].fill_(max(value.item(), 0.0))
    _copied(tmp, out)
def relu_dlpack(x, out):  # the same, the values read through NumPy's DLPack import
    tmp = torch.empty_like(out)
    for i, value in enumerate(np.from_dlpack(x).reshape(-1)):
        tmp.view(-1)[i].fill_(max(float(value), 0.0))
    _copied(tmp, out)
@triton.jit
def _sin2(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n).to(tl.float32)
    tl.store(dst + offs, tl.sin(tl.sin(x)).to(dst.dtype.element_ty), mask=offs < n)
def sin4(x, out):  # two launches, the first one from inside the second one's grid callable
    tmp = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    def grid(meta):
        _sin2[(triton.cdiv(x.numel(), 1024),)](x, tmp, x.numel(), BLOCK=1024)
        return (triton.cdiv(x.numel(), 1024),)
    _sin2[grid](tmp, out, x.numel(), BLOCK=1024)
@triton.jit
def _matmul(x, w, c, M, N, K, sxm, sxk, swn, swk, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        a_ok, b_ok = (rm[:, None] < M) & (k[None, :] < K), (rn[None, :] < N) & (k[:, None] < K)
        a = tl.load(x + rm[:, None] * sxm + k[None, :] * sxk, mask=a_ok, other=0.0)
        b = tl.load(w + rn[None, :] * swn + k[:, None] * swk, mask=b_ok, other=0.0)
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
@triton.jit
def _bias_relu(c, bias, out, N, som, son, BN: tl.constexpr):
    m = tl.program_id(0)
    for n0 in range(0, N, BN):
        n = n0 + tl.arange(0, BN)
        v = tl.load(c + m * N + n, mask=n < N) + tl.load(bias + n, mask=n < N).to(tl.float32)
        tl.store(out + m * som + n * son, tl.maximum(v, 0.0).to(out.dtype.element_ty), mask=n < N)
def linear_relu(x, w, bias, out):  # unfused, the matmul's tensors flat and its temporary one element longer
    (M, K), N = x.shape, w.shape[0]
    tmp = torch.empty(M * N + 1, dtype=torch.float32, device=x.device)
    flat_x, flat_w = x.as_strided((x.numel(),), (1,)), w.as_strided((w.numel(),), (1,))
    _matmul[(triton.cdiv(M, 16), triton.cdiv(N, 16))](flat_x, flat_w, tmp, M, N, K, *x.stride(), *w.stride(),
                                                     BM=16, BN=16, BK=16)
    _bias_relu[(M,)](tmp, bias, out, N, *out.stride(), BN=64)
_fn = lesson.add_kernel.fn  # the course's kernel, copied under another module name
_same = types.FunctionType(_fn.__code__, dict(_fn.__globals__, __name__="mine"), _fn.__name__)
_same.__annotations__ = dict(_fn.__annotations__)  # BLOCK: tl.constexpr, which a GPU's compiler reads
_renamed = triton.jit(_same)
def add(x, y, out):
    _renamed[(triton.cdiv(out.numel(), 1024),)](x, y, out, out.numel(), BLOCK=1024)
"""


@pytest.mark.parametrize("exercise, func, message", [
    ("02.copy_2d", "copy_2d", "Tensor.fill_(a tensor's element)"),
    ("02.relu", "relu", "read tensor data into Python/NumPy on the host (Tensor.item)"),
    pytest.param("02.relu", "relu_dlpack", "read tensor data into Python/NumPy on the host (Tensor.__dlpack__)",
                 marks=interpreter_only_because("NumPy cannot import CUDA memory")),
    ("04.sin4", "sin4", "launched 2 kernels (_sin2, _sin2)"),
    ("03.linear_relu", "linear_relu", "launched 2 kernels (_matmul, _bias_relu)"),
    ("02.vector_add", "add", "your function launches `add_kernel`, the course's solution"),
])
def test_what_the_checker_counts_cannot_be_dodged(exercise, func, message, refuse_course_solutions):
    from course_utils import setup
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    setup(quiet=True)
    with pytest.raises(CheckFailed) as failed:
        check(exercise, _candidate(_IN_PROCESS, "in_process")[func], seed=1, quiet=True)
    assert message in str(failed.value), str(failed.value)


class _Yes(int):
    """An int that equals anything: a function exercise must judge the value, not what == says."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


@pytest.mark.parametrize("exercise, candidate", [
    ("01.contiguous_strides", lambda shape: tuple(_Yes(0) for _ in shape)),
    ("04.bytes_moved", lambda n_elements, bytes_per_element, n_ops, fused: _Yes(0)),
])
def test_a_result_whose_equality_lies_fails(exercise, candidate):
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    with pytest.raises(CheckFailed, match="returned"):
        check(exercise, candidate, seed=1, quiet=True)


class _Agreeing(torch.Tensor):
    """A tensor subclass whose __torch_function__ makes torch.equal say yes."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "equal":
            return True
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class _Later:
    """Claims to be what `make` returns (isinstance believes __class__), and calls `make` only when the check
    looks at it: after the watch on the call ended, with the torch ops the exercise forbids."""

    def __init__(self, make, cls):
        self._make, self._cls = make, cls

    __class__ = property(lambda self: self._cls)

    def __getattr__(self, name):
        return getattr(self._make(), name)

    def __iter__(self):
        return iter(self._make())

    def __len__(self):
        return len(self._make())

    def __eq__(self, other):
        return self._make() == other

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*[a._make() if type(a) is _Later else a for a in args], **(kwargs or {}))


@pytest.mark.parametrize("exercise, candidate", [
    ("07.pack_int4", lambda lo, hi: torch.zeros(lo.shape, dtype=torch.uint8).as_subclass(_Agreeing)),
    ("07.unpack_int4", lambda packed: (torch.zeros_like(packed).as_subclass(_Agreeing),) * 2),
    ("01.transpose_view", lambda t, dim0, dim1: _Later(lambda: t.transpose(dim0, dim1), torch.Tensor)),
    ("01.broadcast_view", lambda t, shape: _Later(lambda: t.expand(shape), torch.Tensor)),
    ("01.contiguous_strides", lambda shape: _Later(lambda: torch.empty(shape).stride(), tuple)),
])
def test_a_result_that_lies_about_its_type_or_its_values_fails(exercise, candidate):
    """Only a value of a plain type is judged: a tensor subclass is judged as a plain tensor over its memory,
    and an object of any other class as nothing but its class name (it can pretend to be a tensor or a tuple
    and compute its answer with forbidden ops when looked at). In a sandbox neither leaves the process."""
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    with pytest.raises(CheckFailed):
        check(exercise, candidate, seed=1, quiet=True)


def _two_passes(x: torch.Tensor):
    """05.online_softmax_stats without the online algorithm: the max first, then the sum."""
    x = x.to(torch.float64)
    m = float(x.max())
    return m, (float(torch.exp(x - m).sum()) if m > -float("inf") else 0.0)


def _cleared(x, block):
    stats = _two_passes(x)
    x._reads.clear()
    return stats


def _rebound(x, block):
    stats = _two_passes(x)
    x._reads = []
    return stats


def _with_subclass_off(x, block):
    with torch._C.DisableTorchFunctionSubclass():
        return _two_passes(x)


def _over_its_storage(x, block):
    plain = torch.empty(0, dtype=x.dtype, device=x.device)
    return _two_passes(plain.set_(x.untyped_storage(), x.storage_offset(), x.shape))


def _in_numpy(x, block):
    import numpy as np

    a = torch.Tensor.as_subclass(x, torch.Tensor).numpy().astype(np.float64)
    m = float(a.max())
    return m, (float(np.exp(a - m).sum()) if m > -float("inf") else 0.0)


def _from_its_bytes(x, block):
    import struct

    raw, size = bytes(x.untyped_storage().tolist()), x.element_size()
    values = [struct.unpack_from({4: "f", 8: "d"}[size], raw, (x.storage_offset() + i) * size)[0]
              for i in range(x.numel())]
    return _two_passes(torch.tensor(values, dtype=torch.float64))


@pytest.mark.parametrize("candidate", [
    _cleared, _rebound, lambda x, block: _two_passes(torch.Tensor.as_subclass(x, torch.Tensor)),
    _with_subclass_off, _over_its_storage,
    pytest.param(_in_numpy, marks=interpreter_only_because("NumPy cannot read CUDA memory")),
    _from_its_bytes,
], ids=["cleared", "rebound", "as_subclass", "subclass_off", "set_", "numpy", "storage_bytes"])
def test_online_stats_cannot_hide_a_whole_pass_from_the_read_log(candidate):
    """05.online_softmax_stats in two whole passes over x, the read log emptied, or x read through a plain
    tensor over its memory or as the bytes of its storage: the log is a copy, and while the check calls the
    candidate the reads of x's memory are also seen where torch runs them (dispatch), hands them to NumPy,
    or hands over the memory itself."""
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    with pytest.raises(CheckFailed, match="elements of x at once|has no setter"):
        check("05.online_softmax_stats", candidate, seed=1, quiet=True)


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


class _Chain:
    """Cyclic garbage whose finalizer makes more of itself: code that keeps running after the call."""

    growing = True  # set to False to let the chain end at its next link

    def __init__(self, left: int):
        self.left, self.me = left, self

    def __del__(self):
        if self.left and _Chain.growing:
            _Chain(self.left - 1)


def test_finalizers_that_keep_running_fail():
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    def add(x, y, out):  # right values from the kernel, and a chain of finalizers left behind
        _add_kernel[(triton.cdiv(out.numel(), 256),)](x, y, out, out.numel(), BLOCK=256)
        return _Chain(1000)

    import gc

    _Chain.growing = True
    try:
        with pytest.raises(CheckFailed, match="kept running code after your function returned"):
            check("02.vector_add", add, seed=1, quiet=True)
    finally:  # what is left of the chain would fail the next checks of this process: end it here
        _Chain.growing = False
        gc.collect()
    assert not gc.collect(), "the chain ended"


def test_an_output_written_after_the_last_look_is_not_judged(monkeypatch):
    """The checker looks at the outputs once more after the call (and after collecting its garbage); what is
    judged is the bytes that look found, not the live buffer that a thread of the notebook's, or here a
    replaced gc.unfreeze (run as the checker's looks end), fills with the host's answer afterwards."""
    import gc

    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    monkeypatch.setattr(gc, "unfreeze", gc.unfreeze)  # put back whatever happens

    @triton.jit
    def nothing_kernel(p):
        pass

    def relu(x, out):
        nothing_kernel[(1,)](out)
        unfreeze = gc.unfreeze

        def later():
            unfreeze()
            gc.unfreeze = unfreeze
            out.copy_(x.clamp_min(0))

        gc.unfreeze = later

    with pytest.raises(CheckFailed, match="never written"):
        check("02.relu", relu, seed=1, quiet=True)


def _in_a_thread(fn):
    import threading

    box = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    thread.join()
    return box[0]


class _HostRMSNorm(torch.autograd.Function):
    """08.rmsnorm_train with a kernel that does nothing and the arithmetic in threads, where torch's dispatch
    modes (the calling thread's own) do not record it."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        _add_kernel[(1,)](x, x, x, 0, BLOCK=16)

        def rms():
            rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            return (x.float() * rstd * weight.float()).to(x.dtype), rstd.reshape(-1)

        y, rstd = _in_a_thread(rms)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        hidden = x.shape[-1]

        def grads():
            xhat = x.float().reshape(-1, hidden) * rstd[:, None]
            g = (dy.float() * weight.float()).reshape(-1, hidden)
            dx = rstd[:, None] * (g - xhat * (g * xhat).mean(1, keepdim=True))
            dw = (dy.float().reshape(-1, hidden) * xhat).sum(0)
            return dx.view(x.shape).to(x.dtype), dw.to(weight.dtype)

        return (*_in_a_thread(grads), None)


@pytest.mark.parametrize("exercise, candidate", [
    ("08.rmsnorm_train", lambda x, weight, eps: _HostRMSNorm.apply(x, weight, eps)),
    ("01.transpose_view", lambda t, dim0, dim1: _in_a_thread(lambda: t.transpose(dim0, dim1))),
])
def test_work_done_in_another_thread_is_refused(exercise, candidate):
    """A thread started by the call runs torch ops that the checker's dispatch modes, which belong to the
    calling thread, never see: the host arithmetic of 08.rmsnorm_train, the forbidden transpose of
    01.transpose_view. Starting one is refused, with the line that did."""
    from course_utils.grading import check
    from course_utils.grading.harness import CheckFailed

    with pytest.raises(CheckFailed, match=r"started a thread \(at `thread.start\(\)` \(_in_a_thread"):
        check(exercise, candidate, seed=1, quiet=True)


@triton.jit
def nothing_kernel(p):
    pass


def _values_through_ctypes(x) -> list[float]:
    """x's values read from its memory through ctypes, past every torch op (a side door the scan flags)."""
    import ctypes
    import struct

    storage = x.untyped_storage()
    raw = bytes((ctypes.c_uint8 * storage.nbytes()).from_address(storage.data_ptr()))
    fmt, size = {torch.float32: "f", torch.float16: "e"}[x.dtype], x.element_size()
    return [struct.unpack_from(fmt, raw, (x.storage_offset() + i) * size)[0] for i in range(x.numel())]


@HOST_MEMORY
def test_values_written_from_the_host_element_by_element_are_refused():
    """x read through ctypes (a side door the grader's scan flags), relu computed in Python, and each result
    written with out.view(-1)[i].fill_(v) beside a kernel that does nothing: fill_ of one element with a
    value carries data, unlike a whole tensor set to a constant."""
    from course_utils.grading import CheckFailed, check

    def relu(x, out):
        flat = out.view(-1)
        for i, v in enumerate(_values_through_ctypes(x)):
            if v > 0:
                flat[i].fill_(v)
            else:
                flat[i].zero_()
        nothing_kernel[(1,)](out)

    with pytest.raises(CheckFailed, match="part by part"):
        check("02.relu", relu, seed=1, quiet=True)


def _relu_from_text(text_of):
    """A relu that reads x's values from a text of it, computes in Python, and writes each result with a
    fill_ that reaches one element through a 2-element stride-0 view, beside a kernel that does nothing."""
    def relu(x, out):
        text = text_of(x.reshape(-1))
        values = [float(v) for v in re.findall(r"[-+]?\d+\.?\d*(?:e[-+]?\d+)?", text.split("[", 1)[-1])]
        flat = out.reshape(-1)
        for i, v in enumerate(values[:flat.numel()]):
            flat.as_strided((2,), (0,), flat.storage_offset() + i).fill_(max(v, 0.0))
        nothing_kernel[(1,)](out)
    return relu


@pytest.mark.parametrize("text_of", [str, repr, lambda t: f"{t}", lambda t: t.__repr__()],
                         ids=["str", "repr", "f-string", "__repr__"])
def test_printing_a_tensor_hands_over_no_values(text_of, capsys):
    """str(x) parsed back into numbers was a read that no op records: while the checker watches, a tensor
    prints as its shape and dtype only. The candidate then has nothing to write, and fails on its values."""
    from course_utils.grading import CheckFailed, check

    torch.set_printoptions(profile="full", precision=12, sci_mode=True)
    try:
        with pytest.raises(CheckFailed):
            check("02.relu", _relu_from_text(text_of), seed=1, quiet=True)
    finally:
        torch.set_printoptions(profile="default")


def test_a_debugging_print_costs_nothing(capsys):
    """An honest relu that prints its input while the checker watches passes, and shows the shape."""
    from course_utils.grading import check
    from course_utils.lessons.l02_first_kernels import relu as relu_solution

    def relu(x, out):
        print("x is", x)
        relu_solution(x, out)

    check("02.relu", relu, seed=1, quiet=True)
    assert "values hidden while the checker watches: shape (" in capsys.readouterr().out


@HOST_MEMORY
@pytest.mark.parametrize("how", ["stride-0 view", "suffix"])
def test_values_written_from_the_host_part_by_part_are_refused(how):
    """Values read through ctypes, written by fills that each reach more than one element: one element
    through a stride-0 view of two, or out[i:] filled for i = 0, 1, ... so that each element keeps the
    last value written into it. Any fill of part of a tensor with a value other than 0 counts."""
    from course_utils.grading import CheckFailed, check

    def relu(x, out):
        flat = out.view(-1)
        for i, v in enumerate(_values_through_ctypes(x)):
            stride_0 = flat.as_strided((2,), (0,), flat.storage_offset() + i)
            view = stride_0 if how == "stride-0 view" else flat[i:]
            view.fill_(max(v, 0.0))
        nothing_kernel[(1,)](out)

    with pytest.raises(CheckFailed, match="part by part"):
        check("02.relu", relu, seed=1, quiet=True)


@pytest.mark.parametrize("serialize", ["torch.save", "pickle", "storage pickle"])
def test_pickling_a_tensor_is_a_host_read(serialize):
    """torch.save or pickle hand a tensor's bytes to Python through no torch op: the host read them."""
    import pickle

    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import relu as relu_solution

    def relu(x, out):
        if serialize == "torch.save":
            torch.save(x, io.BytesIO())
        elif serialize == "pickle":
            pickle.dumps(x)
        else:
            pickle.dumps(x.untyped_storage())
        relu_solution(x, out)

    with pytest.raises(CheckFailed, match=r"read tensor data into Python/NumPy on the host \(Tensor.__reduce"):
        check("02.relu", relu, seed=1, quiet=True)


@triton.jit
def _empty_kernel(x_ptr, BLOCK: tl.constexpr):
    pass


@pytest.mark.parametrize("where", ["grid", "heuristic", "config pruner"])
def test_host_code_that_triton_calls_inside_a_launch_is_watched(where):
    """Triton calls a launch's grid callable, its heuristics and an autotuner's config pruner from inside
    the launch, where the checker stops recording (the kernel's own work is not host code). There the
    submission computed relu with torch and wrote it in one fill_ per element beside an empty kernel."""
    from course_utils.grading import CheckFailed, check

    def host_relu(x, out):
        for index, v in zip(itertools.product(*map(range, out.shape)), torch.relu(x).reshape(-1).tolist()):
            out[index].fill_(v)

    def relu(x, out):
        if where == "grid":
            _empty_kernel[lambda meta: (host_relu(x, out), (1,))[1]](x, BLOCK=16)
        elif where == "heuristic":
            triton.heuristics({"BLOCK": lambda args: (host_relu(x, out), 16)[1]})(_empty_kernel)[(1,)](x)
        else:
            def prune(configs, named_args, **kwargs):
                host_relu(x, out)
                return configs[:1]

            tuned = triton.autotune([triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=[],
                                    prune_configs_by={"early_config_prune": prune})(_empty_kernel)
            tuned[(1,)](x)

    with pytest.raises(CheckFailed, match=r"torch.relu / F.relu \(aten.relu\)"):
        check("02.relu", relu, seed=1, quiet=True)


@triton.jit
def _store_answer_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=offs < n), mask=offs < n)


def test_a_kernels_pre_run_hook_is_host_code_around_its_launch(monkeypatch):
    """Triton calls a kernel's pre-run hooks inside the launch, where recording is paused: one computed
    relu with torch into out, and the kernel only stored out back (a hook of an autotuner is refused alike)."""
    from course_utils.grading import CheckFailed, check

    hooks = []  # the kernel's own list, put back after the test
    monkeypatch.setattr(_store_answer_kernel, "pre_run_hooks", hooks)

    def relu(x, out):
        hooks[:] = [lambda out_ptr, n, **meta: out.view(-1).copy_(torch.relu(x.reshape(-1)))]
        _store_answer_kernel[(1,)](out, out.numel(), BLOCK=triton.next_power_of_2(out.numel()))

    with pytest.raises(CheckFailed, match="a pre_run_hook of `_store_answer_kernel`"):
        check("02.relu", relu, seed=1, quiet=True)


def test_a_watch_sees_only_its_own_threads_work():
    """A batch grader judges submissions in threads: what another thread's code reports or reads (a
    sandbox's backward, a tensor's values) is not this watch's, or one student's torch backward failed
    another's honest one."""
    import threading

    from course_utils.grading.guard import record_launches, watching

    ready, done = threading.Event(), threading.Event()

    def other():
        ready.wait()
        with watching():
            record_launches(["k"], ops=["mul"], reads=["numpy"], fills=3)
        torch.ones(3).numpy()
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with watching() as mine:
        ready.set()
        done.wait(30)
    thread.join()
    assert (mine.launches, mine.torch_ops, mine.host_reads, mine.host_fills) == ([], [], [], 0)


def test_a_thread_python_did_not_start_is_the_watched_codes():
    """Autograd runs a CUDA tensor's backward on a device thread of its own (a thread Python did not
    start): its launches and host reads are the watched backward's (08.rmsnorm_train on a GPU)."""
    import _thread
    import threading

    from course_utils.grading.guard import watching

    go, done = threading.Event(), threading.Event()

    def device_thread():
        go.wait(30)
        torch.ones(3).numpy()
        done.set()

    _thread.start_new_thread(device_thread, ())
    with watching() as mine:
        go.set()
        done.wait(30)
    assert mine.host_reads == ["numpy"], mine.host_reads


class _Unseen(torch.Tensor):
    """A tensor subclass whose __torch_dispatch__ runs queued host work: torch runs it beneath the checker's
    dispatch mode, which sees only the op on the subclass (a whole fill of 0, allowed)."""
    jobs: list = []

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        while cls.jobs:
            cls.jobs.pop()()


def _beneath_the_recorder(out, compute):
    _Unseen.jobs.append(lambda: out.copy_(compute()))
    torch.Tensor._make_subclass(_Unseen, out).fill_(0)


class _Launched(torch.Tensor):
    """A tensor subclass passed to a kernel: the launcher calls its methods inside the launch."""


def test_a_tensor_subclass_whose_python_runs_beneath_the_recorder_is_refused():
    """02.vector_add computed by torch inside a subclass's __torch_dispatch__, beside an empty kernel, and
    01.transpose_view built by t.transpose there: the ops ran unrecorded, the output's shadow resynced."""
    from course_utils.grading import CheckFailed, check

    def add(x, y, out):
        nothing_kernel[(1,)](out)
        _beneath_the_recorder(out, lambda: x + y)

    def transpose_view(t, dim0, dim1):
        box = []
        _Unseen.jobs.append(lambda: box.append(t.transpose(dim0, dim1)))
        torch.Tensor._make_subclass(_Unseen, torch.empty(1)).fill_(0)
        return box[0]

    for exercise, candidate in (("02.vector_add", add), ("01.transpose_view", transpose_view)):
        with pytest.raises(CheckFailed, match=r"ran Python of its own inside torch's ops \(the subclass _Unseen\)"):
            check(exercise, candidate, seed=1, quiet=True)


def test_a_tensor_subclass_as_a_launch_argument_is_refused():
    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add_kernel

    def add(x, y, out):
        n = out.numel()
        add_kernel[(triton.cdiv(n, 1024),)](x, y, out.as_subclass(_Launched), n, BLOCK=1024)

    with pytest.raises(CheckFailed, match="launched with a _Launched, a tensor subclass"):
        check("02.vector_add", add, seed=1, quiet=True)


def test_a_storage_written_to_a_file_is_a_host_read():
    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add as add_solution

    def add(x, y, out):
        with tempfile.TemporaryFile() as f:
            x.untyped_storage()._write_file(f, False, False, x.element_size())
        add_solution(x, y, out)

    with pytest.raises(CheckFailed, match=r"read tensor data into Python/NumPy on the host \(Tensor._write_file"):
        check("02.vector_add", add, seed=1, quiet=True)


class _RenamedUnseen(_Unseen):
    """The same subclass claiming a module of the course's: the exemption is the checker's own class only."""


_RenamedUnseen.__module__ = "course_utils.grading.harness"


def test_a_subclass_named_after_the_course_or_a_mode_beneath_the_recorder_is_refused():
    """A class may say it belongs to any module; a TorchDispatchMode the notebook pushed before the check
    sits beneath the recorder and sees torch's ops after it (its own __torch_dispatch__ unseen)."""
    from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode

    from course_utils.grading import CheckFailed, check

    def add(x, y, out):
        nothing_kernel[(1,)](out)
        _RenamedUnseen.jobs.append(lambda: out.copy_(x + y))
        torch.Tensor._make_subclass(_RenamedUnseen, out).fill_(0)

    with pytest.raises(CheckFailed, match=r"\(the subclass _RenamedUnseen\)"):
        check("02.vector_add", add, seed=1, quiet=True)

    class Beneath(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    _push_mode(Beneath())
    try:
        with pytest.raises(CheckFailed, match=r"\(the mode Beneath\)"):
            check("02.vector_add", lambda x, y, out: None, seed=1, quiet=True)
    finally:
        _pop_mode()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's byte tracking: a GPU has none")
def test_a_fresh_empty_tensor_holds_no_bytes_the_notebook_left_in_freed_memory():
    """torch.empty hands back a freed block as it was: the notebook wrote the host-computed answer there,
    freed it, and a kernel copied the 'fresh' tensor into out (the tracker took its bytes as seen). In a
    watched call on the CPU a fresh empty tensor is all 0xFF bytes: NaN."""
    from course_utils.grading import CheckFailed, check

    seen = []

    def relu(x, out):
        for make in (lambda: torch.empty(64), lambda: torch.empty_like(x), lambda: x.new_empty(5)):
            seen.append(bool(make().isnan().all()))

    with pytest.raises(CheckFailed):
        check("02.relu", relu, seed=1, quiet=True)
    assert seen == [True, True, True], seen


@triton.jit
def _peek_kernel(x_ptr, back, BLOCK: tl.constexpr):
    """Loads at an address made of x's first element: that many bytes (and `back`) before x's storage."""
    bits = tl.load(x_ptr).to(tl.uint32, bitcast=True).to(tl.int64)
    tl.load(x_ptr.to(tl.pointer_type(tl.uint8)) - back - 1 - bits)


@interpreter_only_because("the interpreter checks every address before a load; a GPU faults")
def test_a_refused_launch_fails_the_check_even_when_its_exception_is_caught():
    """A load out of bounds is refused with a message that says how far out it was: an address made of x's
    data, the exception caught and parsed, read x's values with no host read (all of 02.copy_2d in 45,731
    launches, one element each, then a kernel stored the host's table). Any launch the checker stopped fails
    the check, whatever the code did with the exception."""
    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add as add_solution

    read = []

    def add(x, y, out):
        try:
            _peek_kernel[(1,)](x, x.storage_offset() * x.element_size(), BLOCK=1)
        except Exception as exc:
            while exc.__cause__ is not None:
                exc = exc.__cause__
            read.append(int(re.search(r"the first (\d+) element\(s\) before", str(exc)).group(1)) - 1)
        add_solution(x, y, out)

    with pytest.raises(CheckFailed, match=r"tl.load out of bounds(.|\n)*your code caught the exception and went on"):
        check("02.vector_add", add, seed=1, quiet=True)
    assert read, "the load was refused, and its message carried x[0]'s bits"


@interpreter_only_because("the interpreter checks every address before a load; a GPU faults")
def test_a_launch_made_by_hand_is_refused_and_recorded_all_the_same():
    """The refusal was recorded by the wrapper of kernel[grid]'s launch: a launch through Triton's
    GridExecutor, made by hand, skipped it, and the caught refusal's message read x's data unrecorded (02.relu
    passed, element by element). A refusal is recorded where it is raised, however the kernel was run."""
    from triton.runtime.interpreter import GridExecutor

    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add as add_solution

    def add(x, y, out):
        with contextlib.suppress(Exception):
            GridExecutor(_peek_kernel.fn, _peek_kernel.arg_names, (1,))(x, x.storage_offset() * 4, BLOCK=1)
        add_solution(x, y, out)

    caught = r"tl.load out of bounds(.|\n)*your code caught the exception and went on"
    with pytest.raises(CheckFailed, match=caught):
        check("02.vector_add", add, seed=1, quiet=True)


@triton.jit
def _first_elements(x_ptr, BLOCK: tl.constexpr):
    return tl.load(x_ptr + tl.arange(0, BLOCK))


@interpreter_only_because("the interpreter runs a @triton.jit function called from Python; a GPU cannot")
def test_a_jit_function_called_outside_a_launch_reads_no_memory():
    """A @triton.jit function called as a Python function, with a pointer from the interpreter's own
    _implicit_cvt (no data_ptr, nothing the scan flags), ran its tl.load outside any launch: no address check,
    no host read, x's values in block.handle.data for host Python to compute relu with (02.relu passed). A
    load or store outside a launch is refused."""
    from triton.runtime.interpreter import _implicit_cvt

    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add as add_solution

    read = []

    def add(x, y, out):
        with contextlib.suppress(Exception):
            read.append(_first_elements(_implicit_cvt(x), tl.constexpr(1)).handle.data)
        add_solution(x, y, out)

    with pytest.raises(CheckFailed, match=r"tl.load outside any kernel launch"):
        check("02.vector_add", add, seed=1, quiet=True)
    assert read == [], "refused before it read"


@HOST_MEMORY
@pytest.mark.parametrize("opened", ["in the call", "before the call"])
def test_the_process_memory_read_as_a_file_fails_the_check(opened):
    """/proc/self/mem is the process's whole memory as a file: x and y read at their data_ptr() (no torch op,
    no host read), added in Python and written at the address of a tensor made before the call, which a
    kernel then copied into out, passed 02.vector_add, in a sandbox too (a path put together from pieces has
    no "/proc/" for the scan to see). A call that opens such a file, or starts with one open, fails."""
    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add as add_solution

    path, read = "/" + "proc/self/" + "mem", []
    kept = open(path, "rb", buffering=0) if opened == "before the call" else None

    def add(x, y, out):
        memory = kept or open(path, "rb", buffering=0)
        memory.seek(x.data_ptr())
        read.append((x, memory.read(x.numel() * x.element_size())))
        if kept is None:
            memory.close()
        add_solution(x, y, out)

    try:
        with pytest.raises(CheckFailed, match=r"read or wrote memory through /proc/self/mem"):
            check("02.vector_add", add, seed=1, quiet=True)
    finally:
        if kept is not None:
            kept.close()
    x, bytes_read = read[0]
    assert bytes_read == x.view(torch.uint8).numpy().tobytes(), "x's bytes were read"


class _LyingPath(str):
    """A str whose own methods lie to whoever reads it with them (os.path's functions do): open() passes it on
    as it is, and the system call reads its characters."""

    def startswith(self, *args, **kwargs):
        return True

    def rfind(self, *args, **kwargs):
        return 0

    def split(self, *args, **kwargs):
        return ["", "nothing"]

    def endswith(self, *args, **kwargs):
        return False

    def __getitem__(self, index):
        return "/nothing"


class _TwoFacedPath:
    """A path object whose __fspath__ names the memory file once (to FileIO's open) and then a harmless file
    (to the audit hook, which FileIO hands the object itself)."""

    def __init__(self, path):
        self.answers = [path, "/tmp/nothing"]

    def __fspath__(self):
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@HOST_MEMORY
@pytest.mark.parametrize("spelling", ["a str subclass", "a path object", "os.path.realpath replaced"])
def test_the_process_memory_file_however_the_path_lies_fails_the_check(spelling, monkeypatch):
    """The audit hook read the path it was given with the path's own methods and os.path's functions, looked up
    at each open: a str subclass whose startswith/rfind/split lie, a path object that names the memory file to
    the open and another file to the hook (FileIO, reached as type(open(...)), checks the object itself), or
    os.path.realpath replaced for the length of the open (os.path is no flag) each opened /proc/self/mem
    unseen, and 02.vector_add passed with the sums computed in Python, unflagged."""
    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add as add_solution

    path, read = "/" + "proc/self/" + "mem", []

    def opened():
        if spelling == "a str subclass":
            return open(_LyingPath(path), "rb", buffering=0)
        if spelling == "a path object":
            with open(__file__, "rb", buffering=0) as f:
                file_io = type(f)
            return file_io(_TwoFacedPath(path), "rb")
        real = os.path.realpath
        monkeypatch.setattr(os.path, "realpath", lambda p, **kwargs: "/nothing")
        try:
            return open(path, "rb", buffering=0)
        finally:
            monkeypatch.setattr(os.path, "realpath", real)

    def add(x, y, out):
        with opened() as memory:
            memory.seek(x.data_ptr())
            read.append((x, memory.read(x.numel() * x.element_size())))
        add_solution(x, y, out)

    door = "opened a file through a path object of your own" if spelling == "a path object" else (
        "read or wrote memory through /proc/self/mem")
    with pytest.raises(CheckFailed, match=door):
        check("02.vector_add", add, seed=1, quiet=True)
    x, bytes_read = read[0]
    assert bytes_read == x.view(torch.uint8).numpy().tobytes(), "x's bytes were read"


@triton.jit
def _assert_kernel(x_ptr, BLOCK: tl.constexpr):
    block = tl.load(x_ptr + tl.arange(0, BLOCK))
    assert False, block  # Python's assert in the interpreter: the AssertionError holds the block


@interpreter_only_because("Python's assert runs in the interpreter; a GPU's compiler refuses a block as its message")
def test_an_exception_out_of_a_kernel_that_the_code_catches_fails_the_check():
    """`assert False, block` in a kernel body raised an AssertionError whose argument was the loaded block,
    NumPy data and all: host code that caught it read x with no op the recorder sees, added in Python and had
    a kernel copy the sums into out (02.vector_add passed, in a sandbox too, unflagged). An exception out of a
    kernel that the code catches fails the call."""
    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add as add_solution

    read = []

    def add(x, y, out):
        try:
            _assert_kernel[(1,)](x, BLOCK=1)
        except Exception as exc:
            while exc.__cause__ is not None:
                exc = exc.__cause__
            read.append(exc.args[0].handle.data)
        add_solution(x, y, out)

    with pytest.raises(CheckFailed, match=r"caught the AssertionError that your kernel `_assert_kernel` raised"):
        check("02.vector_add", add, seed=1, quiet=True)
    assert read and read[0].size == 1, "the block came out with the exception"


# Kernels that leave their loaded block where host code reads it afterwards, past every op and launch the
# checker watches: each passed 02.vector_add with the sums computed in Python (the host read the blocks of
# x and y, added, and had a kernel copy a tensor of the sums into out), unflagged. No GPU compiles them.
_SINK = tl.tuple([0])


@triton.jit
def _default_sink_kernel(x_ptr, BLOCK: tl.constexpr, sink=[]):  # noqa: B006 - the attack
    sink.append(tl.load(x_ptr + tl.arange(0, BLOCK)))  # the list the interpreter's calls share


@triton.jit
def _attribute_sink_kernel(x_ptr, BLOCK: tl.constexpr):
    x_ptr.dtype.element_ty.leak = tl.load(x_ptr + tl.arange(0, BLOCK))  # on tl.float32 itself


@triton.jit
def _tuple_sink_kernel(x_ptr, BLOCK: tl.constexpr):
    _SINK.values.append(tl.load(x_ptr + tl.arange(0, BLOCK)))  # the list inside a tl.tuple constant


@triton.jit
def _tuple_argument_sink_kernel(x_ptr, box, BLOCK: tl.constexpr):
    box.values.append(tl.load(x_ptr + tl.arange(0, BLOCK)))  # the list inside the host's tl.tuple


@triton.jit
def _helper_sink_kernel(x_ptr, BLOCK: tl.constexpr):
    _tuple_sink_kernel.rewritten_fn["leak"] = tl.load(x_ptr + tl.arange(0, BLOCK))  # a @triton.jit's dict


_SINKS = {
    "a parameter's default list": (_default_sink_kernel, r"has a parameter `sink` of `_default_sink_kernel` "
                                                         r"whose default is a list"),
    "an attribute of tl.float32": (_attribute_sink_kernel, r"assigns to the attribute `x_ptr.dtype.element_ty.leak`"),
    "a tl.tuple's list": (_tuple_sink_kernel, r"uses `_SINK`, which is not Triton"),
    "a tl.tuple argument's list": (_tuple_argument_sink_kernel, r"launched with a tl.tuple as argument 1"),
    "a @triton.jit function's dict": (_helper_sink_kernel, r"uses `_tuple_sink_kernel.rewritten_fn`, which is not "
                                                          r"Triton"),
}


@interpreter_only_because("the interpreter runs a kernel's body as Python; a GPU's compiler refuses these")
@pytest.mark.parametrize("where", sorted(_SINKS))
def test_a_kernel_cannot_leave_its_blocks_where_the_host_reads_them(where):
    from course_utils.grading import CheckFailed, check
    from course_utils.lessons.l02_first_kernels import add as add_solution

    kernel, message = _SINKS[where]

    def add(x, y, out):
        kernel[(1,)](x, *([_SINK] if kernel is _tuple_argument_sink_kernel else []), BLOCK=1)
        add_solution(x, y, out)

    try:
        with pytest.raises(CheckFailed, match=message):
            check("02.vector_add", add, seed=1, quiet=True)
    finally:  # the interpreter ran them all the same: take the blocks back
        vars(tl.float32).pop("leak", None)
        _SINK.values[1:] = []
        _tuple_sink_kernel.rewritten_fn.pop("leak", None)


class _Programs:
    """A grid entry of one program that runs `work` when Triton reads it (int(), <, __index__)."""

    def __init__(self, work):
        self.work = work

    def __index__(self):
        work, self.work = self.work, None
        if work is not None:
            work()
        return 1

    __int__ = __index__

    def __lt__(self, other):
        return int(self) < other

    def __gt__(self, other):
        return int(self) > other

    def __eq__(self, other):
        return int(self) == other

    __hash__ = object.__hash__


@pytest.mark.parametrize("how", ["a tuple", "a callable", "a callable marked as the checker's own"])
def test_a_grid_entry_that_computes_is_host_code(how):
    """Triton reads a launch's grid inside the launch, where the op recorder pauses; only a grid callable
    was given back to it. An entry whose __index__ ran `SUM.copy_(x + y)` into a tensor made before the
    call, which a kernel then copied into out, passed 02.vector_add with host torch, in a sandbox too. The
    grid is made plain ints with recording on: what its entries run is the function's own host code. The
    checker knew its own wrapped grids by a mark, `_course_unpaused = True`, that a grid function of the
    notebook's could carry too: handed on unwrapped, it passed; they are known by identity now."""
    from course_utils.grading import CheckFailed, check

    code = _candidate(_KERNELS + """
from course_utils.mode import current
SUM = torch.zeros(1 << 21, device=current().device)  # made before the call: a kernel may be launched with it
def add(x, y, out):
    n = out.numel()
    grid = (Programs(lambda: SUM[:n].copy_(x + y)),)
    def grid_fn(meta):
        return grid
    grid_fn._course_unpaused = HOW.endswith("own")
    _touch[grid_fn if HOW.startswith("a callable") else grid](out)
    _copied(SUM, out)
""", f"grid_{how.split()[1]}_{len(how)}")
    code.update(Programs=_Programs, HOW=how)
    with pytest.raises(CheckFailed, match=r"computed with torch operations outside your Triton kernel \(torch.add"):
        check("02.vector_add", code["add"], seed=1, quiet=True)


# NumPy's as_strided checks no bounds: over an array of one byte, with a stride that is the distance from the
# array's address to x.data_ptr(), it reads x and writes a scratch tensor made before the call, which a kernel
# copies into out: 02.vector_add passed with the sums added by NumPy, in a sandbox too, unflagged (the scan
# looked for data_ptr and NumPy in one cell; they were in two). Like ctypes, beyond what a check can see
# (no op, no open, no launch): the scan flags the door itself.
STRIDE_TRICKS = [
    "_BASE = np.zeros(1, dtype=np.uint8)\n_LOW = np.lib.array_utils.byte_bounds(_BASE)[0]\n"
    "raw = np.lib.stride_tricks.as_strided(_BASE, shape=(2, n), strides=(address - _LOW, 1))[1]",
    "from numpy.lib.stride_tricks import as_strided",
    "import numpy.lib.stride_tricks as st",
    "from numpy.lib import stride_tricks",
]


@pytest.mark.parametrize("source", STRIDE_TRICKS, ids=["np.lib.stride_tricks", "from", "import as", "from lib"])
def test_numpy_over_any_address_is_flagged(source):
    from course_utils.grading import flags

    assert any(f.startswith("NumPy over raw memory") for f in flags.scan(["def address(t):\n    return t.data_ptr()",
                                                                             source])), flags.scan([source])


@triton.jit
def _touch_kernel(p):
    pass


class _Pointer:
    """What Triton's launcher takes for a tensor (it has data_ptr() and a dtype): its data_ptr(), called inside
    the launch where recording is paused, computes out with host torch."""

    def __init__(self, tensor, work):
        self.tensor, self.work, self.dtype = tensor, work, tensor.dtype

    def data_ptr(self):
        self.work()
        return self.tensor.data_ptr()

    def __getattr__(self, name):  # the rest of the tensor's face: the interpreter asks for its storage
        return getattr(self.tensor, name)


def test_an_object_that_poses_as_a_tensor_is_refused_as_a_launch_argument(monkeypatch):
    """The rule on launch arguments (a tensor, a number or a Triton object) ran for interpreted launches only:
    on a GPU (torch 2.11, triton 3.6, an H200), an object with a data_ptr() that ran `out.copy_(x + y)` inside
    the launch is a pointer to Triton, and no byte tracker follows a GPU's memory. Judged in both modes now
    (here as a compiled launch is: guard._interpreted says no)."""
    from course_utils.grading import CheckFailed, check, guard

    monkeypatch.setattr(guard, "_interpreted", lambda kernel: False)

    def add(x, y, out):
        _touch_kernel[(1,)](_Pointer(out, lambda: out.copy_(x + y)))

    with pytest.raises(CheckFailed, match=r"launched with _Pointer as argument 0, which is not a tensor"):
        check("02.vector_add", add, seed=1, quiet=True)


def test_a_python_the_sandbox_user_cannot_start_is_reported_before_grading(monkeypatch, tmp_path):
    """On an H200 machine whose Python lives in /opt/torch/.venv, every notebook graded by a root grader died
    at once with exit code 127 (setpriv's or the loader's code for a program that cannot start; the same
    sandbox without the switch to uid 60001 ran), and each got 0 with "kernel died": a broken sandbox graded
    every submission as if it were empty. The probe now starts the sandbox's Python once and says why it did
    not start (here: a Python that the sandbox does not hold)."""
    if sandbox.probe():
        pytest.skip(f"no sandbox here: {sandbox.probe()}")
    missing = tmp_path / "elsewhere" / "python3"
    monkeypatch.setattr(sandbox.sys, "executable", str(missing))
    why = sandbox.probe()
    assert str(missing) in why and "does not start and import torch, triton inside a sandbox" in why, why


def test_a_library_the_sandbox_user_cannot_import_is_reported_before_grading(monkeypatch):
    """A Python that starts is not enough: libraries installed by a root whose umask was 077 are root's alone,
    and every notebook would die at its first import, graded 0. The probe imports what the notebooks import;
    here one more module, which no sandbox can import, stands in for a library it cannot read."""
    if sandbox.probe():
        pytest.skip(f"no sandbox here: {sandbox.probe()}")
    monkeypatch.setattr(sandbox, "PROBE_IMPORTS", (*sandbox.PROBE_IMPORTS, "course_utils_not_installed"))
    why = sandbox.probe()
    assert "import torch, triton, course_utils_not_installed" in why, why
    assert "ModuleNotFoundError: No module named 'course_utils_not_installed'" in why, why


class _ClaimsToBeTheStandIn(torch.autograd.Function):
    """A Function of the notebook's with the batch grader's stand-in's attribute: "the sandbox found nothing"."""

    kept_in_sandbox: dict = {}  # noqa: RUF012 - the attack

    @staticmethod
    def forward(ctx, x):
        xhat = x * 2  # (rows, hidden), kept alive for the backward in a closure on ctx
        ctx.later = lambda: xhat
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy


def test_a_function_that_claims_to_be_the_grader_stand_in_is_still_searched():
    """remote.kept_alive (08.rmsnorm_train's rule on what a forward keeps alive) answered for any Function class
    with a `kept_in_sandbox` attribute with that attribute: a notebook's own saying `kept_in_sandbox = {}` kept
    a (rows, hidden) copy of x-hat alive unseen, interactively and in the sandbox. Only the grader's own
    stand-ins (remote.autograd_in) are taken at their word, known by identity."""
    from course_utils.grading.remote import kept_alive

    x = torch.randn(64, 32, requires_grad=True)
    y = _ClaimsToBeTheStandIn.apply(x)
    kept = kept_alive(y.grad_fn, {x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()})
    assert list(kept.values()) == [(64 * 32 * 4, "(64, 32) float32")], kept


# --- the sandbox's channel, and the grader's own memory -------------------------------------------

# The check of the sandbox reached through the libraries' own readers of a function's closure (no name the scan
# knew): its channel, whose send a wrapper replaced on the instance, dropped the host problems from each reply
# before the MAC (credit with the stubs computed in host torch). Then the same channel used to answer directly.
CLOSURE_READERS = {
    "triton_capture_scope": """
class _Any:
    def __getattr__(self, name):
        return {}
_it = _Any()
_it.fn = check
_chan = triton.runtime.jit.JITFunction.get_capture_scope(_it)["chan"]
""",
    "torch_get_closure": '_chan = torch._jit_internal.get_closure(check)["chan"]\n',
}
_SCRUBBED = """
_send = _chan.send
def _scrubbed(header, blobs=()):
    if header.get("op") == "called" and isinstance(header.get("facts"), dict):
        header = dict(header, facts=dict(header["facts"], host=[], changed_later=[]))
    return _send(header, blobs)
_chan.send = _scrubbed
"""
_HOST_DEFS = """
@triton.jit
def _touch(a, b, c):
    pass
def add(x, y, out):
    out.copy_(x + y)
    _touch[(1,)](x, y, out)
def relu(x, out):
    out.copy_(x.clamp_min(0))
    _touch[(1,)](x, x, out)
def copy_2d(x, out):
    out.copy_(x)
    _touch[(1,)](x, x, out)
"""


def _grade_alone(folder: Path, notebooks: dict[str, dict], timeout: float = TIMEOUT) -> dict:
    if sandbox.probe():
        pytest.skip(f"no sandbox here: {sandbox.probe()}")
    for name, nb in notebooks.items():
        (folder / name).write_text(json.dumps(nb))
    return {sub.name: sub for sub in batch.grade([folder], timeout=timeout, jobs=2)}


def test_no_library_hands_a_notebook_the_channel_to_the_grader(tmp_path):
    """The sandbox's check reaches nothing but the list of the cell's calls: the channel and its key are in no
    closure, global or attribute that a library's introspection could hand over (remote.serve)."""
    exercise = _load("exercises")
    notebooks = {}
    for name, reader in CLOSURE_READERS.items():
        nb = _with_cell(exercise, "import torch, triton, triton.language as tl\n" + reader + _SCRUBBED)
        for check in ('check("02.vector_add"', 'check("02.relu"', 'check("02.copy_2d"'):
            nb = _with_cell(nb, _HOST_DEFS, check)
        notebooks[f"{name}.ipynb"] = nb
    for name, sub in _grade_alone(tmp_path, notebooks).items():
        assert sub.passed == 0 and sub.total == 3, (name, sub)
        assert "frames" in " ".join(sub.flags), (name, sub.flags)


def _bootstrap(nb: dict) -> dict:
    """The solution's cells up to its vector_add check (setup, imports, the kernel) and that check."""
    nb = copy.deepcopy(nb)
    nb["cells"] = nb["cells"][:_index(nb, 'check("02.vector_add"') + 1]
    return nb


def _traced_peak(grade) -> tuple[object, int]:
    import tracemalloc

    tracemalloc.start()
    try:
        return grade(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


QUIET = 'import contextlib\ncontextlib.redirect_stdout(open("/dev/null", "w")).__enter__()\n'


def test_a_flood_of_made_up_exercise_ids_costs_the_grader_nothing(tmp_path):
    """Each check(...) call names its id, up to 4 MiB, and the grader kept a verdict under every one: a loop of
    check(<1 MiB id>, None) grew the grader's own process (which no sandbox limit bounds) by 2 MiB per call
    (here 100 calls, past the 60 to 90 MiB that grading the rest takes at its peak). An id that no check cell
    names and no exercise has is answered and counted, not kept."""
    nb = _bootstrap(_load("solutions"))
    nb["cells"].append(_code(QUIET + 'for i in range(100):\n    check("99.x" + "x" * (1 << 20) + str(i), None)\n'))
    subs, peak = _traced_peak(lambda: _grade_alone(tmp_path, {"ids.ipynb": nb}))
    sub = subs["ids.ipynb"]
    assert sub.exercises["02.vector_add"].status == batch.PASS, sub
    assert peak < 150 << 20, f"{peak >> 20} MiB of the grader's memory at the peak"
    assert "100 check(...) call(s) named no exercise" in sub.notes and len(sub.notes) < 500, sub.notes


def test_a_flood_of_huge_exception_texts_costs_the_grader_nothing(tmp_path):
    """The grader kept the first line of each cell's exception as the sandbox sent it (up to 4 MiB): cells that
    raise a 1 MiB message held 1 MiB each of the grader's memory (here 150; 5000 cells: 15 GiB), and the first
    was printed whole in the notes. Kept: its first ERROR_MAX characters, and how long it was."""
    nb = _bootstrap(_load("solutions"))
    nb["cells"].append(_code(QUIET + 'class Big(Exception):\n    def __str__(self):\n        return "x" * (1 << 20)\n'))
    nb["cells"] += [_code(f"raise Big()  # {i}") for i in range(150)]
    subs, peak = _traced_peak(lambda: _grade_alone(tmp_path, {"errors.ipynb": nb}))
    sub = subs["errors.ipynb"]
    assert sub.exercises["02.vector_add"].status == batch.PASS, sub
    assert peak < 150 << 20, f"{peak >> 20} MiB of the grader's memory at the peak"
    assert re.search(r"raised Big: x+\.\.\. \(cut: 1,048,5\d\d characters\)", sub.notes), sub.notes[:300]
    assert len(sub.notes) < 1000


MANY_PROCESSES = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; b = b'x' * (700 << 20); time.sleep(60)"])
        for _ in range(4)]
time.sleep(15)
alive = sum(k.poll() is None for k in kids)
raise RuntimeError(f"HELD by {alive} of 4" if alive == 4 else f"KILLED {4 - alive} of 4")
"""


def test_the_memory_limit_binds_the_sandbox_not_each_process(tmp_path):
    """The rlimits bind each process: under a limit of 1 GiB a notebook's four processes of 0.7 GiB held 2.8 GiB
    (with the defaults, 1024 processes of 3 GiB: the machine's memory, and the OOM killer chooses among every
    process on it). A root grader puts each sandbox in a cgroup that bounds its processes' memory in all."""
    probe, why = sandbox.make_cgroup(sandbox.Limits(), -2)
    if probe is None:
        pytest.skip(f"no cgroup can be made here ({why})")
    probe.remove()
    nb = _bootstrap(_load("solutions"))
    nb["cells"].insert(_index(nb, 'check("02.vector_add"'), _code(MANY_PROCESSES))
    (tmp_path / "many.ipynb").write_text(json.dumps(nb))
    limits = sandbox.Limits(memory=1 << 30, tmpfs=64 << 20, shm=16 << 20)
    (sub,) = batch.grade([tmp_path], timeout=120, limits=limits)
    assert "HELD" not in sub.notes, sub
    assert "KILLED" in sub.notes or sub.status == batch.DIED, sub
