"""Flags for a human: constructs in a submission's code that have no place in an honest answer.

`scan(sources)` parses each code cell as IPython runs it (a magic or a shell line is the Python call it
becomes; the code a magic runs is scanned too) and names what it finds, with the cell number:
"ctypes (cell 7)". A flag does not change a grade; the grader shows
them in its table, JSON and CSV so that an instructor reads those notebooks. Each flag is a way
that somebody tried to reach the grader, the expected answers or the host past the kernel:

- ctypes, gc, frames/inspect: raw memory, every live object, the caller's local variables;
- threads, signals, os.kill, process spawning (subprocess, multiprocessing, os.fork/system/exec),
  setsid: work outside the call being checked, or at the grader and other submissions;
- assignment into course_utils: patching the checker or the course's functions in memory;
- torch inside a @triton.jit body: the interpreter runs the body as Python, so torch there
  computes on the host; an autotune pre_hook/post_hook: host code run around each launch;
- Tensor.set_ (swapping an output's storage), data_ptr with ctypes or NumPy (host access to
  device memory), torch._C internals (e.g. _disable_current_modes), exec/eval/compile (code this
  scan cannot read), /proc (looking at other processes);
- raw file descriptors (os.read/os.write/os.fdopen/os.dup, open() of a number, /dev/fd), a function's
  __closure__, the grader's modules (course_utils.grading): in a sandbox, the pipe to the grader, where
  a notebook could answer a check itself with a made-up account of how its outputs were computed;
- IPython's own door to code from strings and files: get_ipython() (run_cell), shell lines, %run and
  %load;
- the same reached without naming it: object internals (a function's __globals__, __dict__, vars(),
  __subclasses__ and the class graph, __code__), sys.modules, getattr/setattr (or operator.attrgetter)
  with a computed name.
"""
from __future__ import annotations

import ast
import threading
from collections.abc import Iterable

MODULES = {
    "ctypes": "ctypes", "gc": "gc", "inspect": "inspect (frames)", "threading": "threads",
    "_thread": "threads", "concurrent": "threads", "signal": "signals", "subprocess": "process spawning",
    "multiprocessing": "process spawning", "pty": "process spawning", "socket": "network",
    "builtins": "builtins", "importlib": "importlib",
}
RAW_FDS = "raw file descriptors"
OS_CALLS = {
    "kill": "os.kill", "killpg": "os.kill", "fork": "process spawning", "forkpty": "process spawning",
    "system": "process spawning", "popen": "process spawning", "posix_spawn": "process spawning",
    "posix_spawnp": "process spawning", "setsid": "setsid", "setpgrp": "setsid", "setpgid": "setsid",
    "execv": "process spawning", "execve": "process spawning", "execvp": "process spawning",
    "execl": "process spawning", "execlp": "process spawning", "spawnv": "process spawning",
    "spawnl": "process spawning", "pidfd_open": "signals", "read": RAW_FDS, "write": RAW_FDS,
    "fdopen": RAW_FDS, "dup": RAW_FDS, "dup2": RAW_FDS,
}
FRAME_ATTRS = {"_getframe": "frames", "f_locals": "frames", "f_back": "frames", "f_globals": "frames",
               "tb_frame": "frames", "gi_frame": "frames", "cr_frame": "frames", "settrace": "frames",
               "setprofile": "frames", "_current_frames": "frames", "get_objects": "gc",
               "get_referrers": "gc", "get_referents": "gc", "__closure__": "frames",
               "cell_contents": "frames", "getclosurevars": "frames", "currentframe": "frames",
               "getouterframes": "frames", "getinnerframes": "frames", "getmembers": "frames",
               "getmembers_static": "frames"}
# The inspect module reached as another module's attribute (triton.runtime.jit.inspect), and names that
# hand a tensor's memory to NumPy or Python outside the tensor's own methods, or run host code inside a
# kernel's launch.
DLPACK, SUBCLASS = "DLPack (tensor memory to NumPy)", "tensor subclass internals"
MODULE_ATTRS = {"inspect": "inspect (frames)", "gc": "gc", "ctypes": "ctypes",
                "subprocess": "process spawning", "to_dlpack": DLPACK, "from_dlpack": DLPACK,
                "_to_dlpack": DLPACK, "__dlpack__": DLPACK,
                "add_pre_run_hook": "kernel hooks", "pre_run_hooks": "kernel hooks",
                "_write_file": "tensor storage internals", "_make_subclass": SUBCLASS,
                "_make_wrapper_subclass": SUBCLASS, "__torch_dispatch__": SUBCLASS,
                "__array_interface__": "NumPy over raw memory", "__cuda_array_interface__": "NumPy over raw memory"}
# Attributes that lead from an object to others it was not given: a function's module globals (the
# grader's channel class is one `check.__globals__["Channel"]` away), every class alive (`__subclasses__`),
# code objects.
OBJECT_INTERNALS = {"__globals__", "__subclasses__", "__base__", "__bases__", "__mro__", "__dict__",
                    "__getattribute__", "__code__"}
TORCH_INTERNALS = {"_disable_current_modes": "torch._C internals", "_DisableTorchDispatch": "torch._C internals",
                   "DisableTorchFunction": "torch._C internals",
                   "DisableTorchFunctionSubclass": "torch._C internals",
                   "_unset_dispatch_mode": "torch._C internals", "_pop_torch_dispatch_stack": "torch._C internals",
                   "_pop_torch_function_stack": "torch._C internals",
                   "_ExcludeDispatchKeyGuard": "torch._C internals", "_push_mode": "torch._C internals",
                   "_push_on_torch_dispatch_stack": "torch._C internals",
                   "_push_on_torch_function_stack": "torch._C internals"}


def _root(node: ast.AST) -> str | None:
    """The name at the start of an attribute/subscript chain: `a` in a.b[c].d."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _is_jit(decorator: ast.AST) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return _dotted(target).split(".")[-1] in ("jit", "autotune", "heuristics")


# IPython's transformer reads the whole cell again for each line it rewrites: a cell of many such lines
# and many others took minutes (120 x 30,000 lines: 68 s) in the grader's own process, before any sandbox
# or timeout. Past this many (rewritten lines x lines) the cell is not rewritten, and is flagged instead.
MAX_REWRITE_WORK = 200_000


def _ipython_lines(source: str) -> int:
    """How many lines IPython may rewrite: magics, shell escapes (`!ls`, `x = !ls`), help (`name?`)."""
    return sum(1 for line in source.splitlines() if "%" in line or "!" in line or line.rstrip().endswith("?"))


def _too_big_to_rewrite(source: str) -> bool:
    return _ipython_lines(source) * (source.count("\n") + 1) > MAX_REWRITE_WORK


def _python(source: str) -> str:
    """A cell's source as IPython runs it: magics, shell escapes and `name?` turned into the Python calls
    they are (`get_ipython().run_line_magic('time', 'import gc')`), so that the scan reads what runs.
    Without IPython (not installed here), or for a cell too big to rewrite, those lines are left out, as
    blank lines."""
    if _too_big_to_rewrite(source):
        return _without_ipython_lines(source)
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # no IPython here, or a cell its transformer cannot read (nor then run)
        return _without_ipython_lines(source)


def _without_ipython_lines(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


# What IPython's transformer turns magics and shell lines into: get_ipython().<one of these>(...).
MAGIC_CALLS = {"run_line_magic", "run_cell_magic", "system", "getoutput"}
# Magics that run code or commands this scan cannot read: a file, a shell, an earlier input by number.
OPAQUE_MAGICS = {"run", "load", "loadpy", "rerun", "recall", "macro", "writefile", "script", "bash", "sh",
                 "system", "sx", "alias", "perl", "ruby", "sc", "bookmark", "store", "autocall"}


class _Scan(ast.NodeVisitor):
    def __init__(self):
        self.found: list[str] = []
        self.course_names: set[str] = set()  # names bound to course_utils modules or their contents
        self.uses_ctypes_or_numpy = False
        self.data_ptr = False
        self.os_names: set[str] = {"os"}  # names bound to the os module (`import os as o`)

    def add(self, what: str) -> None:
        if what not in self.found:
            self.found.append(what)

    def visit_Import(self, node):
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in MODULES:
                self.add(MODULES[top])
            if top in ("ctypes", "numpy"):
                self.uses_ctypes_or_numpy = True
            if alias.name == "os":
                self.os_names.add(alias.asname or "os")
            if top == "course_utils":
                self.course_names.add(alias.asname or top)
            if alias.name.startswith("course_utils.grading"):
                self.add("the grader's modules")
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        top = (node.module or "").split(".")[0]
        if top in MODULES:
            self.add(MODULES[top])
        if top in ("ctypes", "numpy"):
            self.uses_ctypes_or_numpy = True
        for alias in node.names:  # from triton.runtime.jit import inspect; from sys import _getframe; ...
            table = next((t for t in (MODULE_ATTRS, MODULES, FRAME_ATTRS, TORCH_INTERNALS) if alias.name in t), {})
            if table:
                self.add(table[alias.name])
        if top == "os":
            for alias in node.names:
                if alias.name in OS_CALLS:
                    self.add(OS_CALLS[alias.name])
        if top == "sys" and any(alias.name == "modules" for alias in node.names):
            self.add("sys.modules")
        if top == "course_utils":
            self.course_names.update(alias.asname or alias.name for alias in node.names)
        if (node.module or "").startswith("course_utils.grading") or any(
                top == "course_utils" and alias.name == "grading" for alias in node.names):
            self.add("the grader's modules")
        self.generic_visit(node)

    def visit_Attribute(self, node):
        root = _root(node)
        if root in self.os_names and node.attr in OS_CALLS:
            self.add(OS_CALLS[node.attr])
        if node.attr in FRAME_ATTRS:
            self.add(FRAME_ATTRS[node.attr])
        if node.attr in MODULE_ATTRS:
            self.add(MODULE_ATTRS[node.attr])
        if node.attr in OBJECT_INTERNALS:
            self.add("object internals")
        if node.attr == "modules" and _dotted(node.value) == "sys":
            self.add("sys.modules")
        if node.attr in TORCH_INTERNALS:
            self.add(TORCH_INTERNALS[node.attr])
        if node.attr == "set_":
            self.add("Tensor.set_")
        if node.attr in ("pre_hook", "post_hook"):
            self.add("autotune hook")
        if node.attr == "data_ptr":
            self.data_ptr = True
        if node.attr in ("ctypeslib", "ctypes", "from_address"):
            self.uses_ctypes_or_numpy = True
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in ("exec", "eval", "compile", "__import__", "__builtins__"):
            self.add("exec/eval")
        if node.id == "get_ipython":  # what magics do not give: run_cell of a string, the namespace
            self.add("IPython internals (get_ipython)")
        if node.id in FRAME_ATTRS and node.id.startswith("_"):
            self.add(FRAME_ATTRS[node.id])
        self.generic_visit(node)

    def _magic(self, node) -> bool:
        """get_ipython().run_line_magic(name, line) and the like, as the transformer writes them: the
        Python a magic runs (`%time import gc`, a `%%capture` cell) is scanned; shell lines are flagged."""
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr in MAGIC_CALLS
                and isinstance(func.value, ast.Call) and _dotted(func.value.func) == "get_ipython"):
            return False
        texts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if func.attr in ("system", "getoutput") or texts and texts[0] in OPAQUE_MAGICS:
            self.add("shell commands or code from elsewhere (%run, %load, !)")
        if len(texts) != len(node.args):
            self.add("exec/eval")
        for text in texts[1:]:
            try:
                with _PARSING:
                    inner = ast.parse(_python(text))
            except SyntaxError:
                continue
            self.visit(inner)
        return True

    def visit_Call(self, node):
        if self._magic(node):
            return
        if _dotted(node.func).split(".")[-1] in ("attrgetter", "methodcaller"):  # getattr by another name
            names = node.args[:1] if _dotted(node.func).endswith("methodcaller") else node.args
            if any(not (isinstance(a, ast.Constant) and isinstance(a.value, str)) for a in names):
                self.add("computed attribute names")
            if any(isinstance(a, ast.Constant) and str(a.value).split(".")[-1] in OBJECT_INTERNALS
                   for a in names):
                self.add("object internals")
        for kw in node.keywords:
            if kw.arg in ("pre_hook", "post_hook"):
                self.add("autotune hook")
        name = _dotted(node.func)
        fd_number = node.args and isinstance(node.args[0], ast.Constant) and type(node.args[0].value) is int
        if name.split(".")[-1] == "FileIO" or name in ("open", "io.open") and fd_number:
            self.add(RAW_FDS)
        if name in ("setattr", "delattr") and node.args and _root(node.args[0]) in self.course_names:
            self.add("assignment into course_utils")
        # getattr(os, "wr" + "ite"): a name this scan cannot read, like code given to exec
        by_name = name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) > 1
        attr = node.args[1] if by_name else None
        if attr is not None and not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
            self.add("computed attribute names")
        if attr is not None and isinstance(attr, ast.Constant) and attr.value in OBJECT_INTERNALS:
            self.add("object internals")
        if name == "vars" and node.args:
            self.add("object internals")
        self.generic_visit(node)

    def _targets(self, targets):
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple | ast.List) else [target]):
                if isinstance(t, ast.Attribute | ast.Subscript):
                    root = _root(t)
                    if root in self.course_names:
                        self.add("assignment into course_utils")
                    if _dotted(t.value if isinstance(t, ast.Subscript) else t).startswith("sys.modules"):
                        self.add("assignment into course_utils")

    def visit_Assign(self, node):
        self._targets(node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._targets([node.target])
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and "/proc/" in node.value:
            self.add("/proc")
        if isinstance(node.value, str) and "/dev/fd" in node.value:
            self.add(RAW_FDS)
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        if node.name in MODULE_ATTRS:  # def __torch_dispatch__(...): a tensor subclass of one's own
            self.add(MODULE_ATTRS[node.name])
        if any(_is_jit(d) for d in node.decorator_list):
            for inner in ast.walk(ast.Module(body=node.body, type_ignores=[])):
                # torch or NumPy by name; or a method no Triton value has: torch's in-place ops
                # (`G["out"].copy_(...)`) and host reads, on tensors reached through a global
                torch_call = isinstance(inner, ast.Name) and inner.id in ("torch", "np", "numpy")
                host_method = (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                               and (inner.func.attr.endswith("_") and not inner.func.attr.startswith("_")
                                    or inner.func.attr in ("numpy", "tolist", "item", "data_ptr", "copy_")))
                if torch_call or host_method:
                    self.add(f"torch inside @triton.jit `{node.name}`")
                    break
        self.generic_visit(node)


# The batch grader scans notebooks from several threads at once (grade(jobs=...)), and CPython 3.11's
# ast.parse is not thread-safe: two at a time can fail with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905). One parse at a time.
_PARSING = threading.Lock()


def scan(sources: Iterable[str], course_cells: set[str] = frozenset()) -> list[str]:
    """The flags of a notebook's code cells, in order, each with the cells it was found in.

    course_cells: sources of the course's own cells (the exercise notebook's bootstrap and setup
    cells install with subprocess, for example), skipped when a cell is one of them unchanged."""
    where: dict[str, list[int]] = {}
    course_names: set[str] = set()
    os_names: set[str] = {"os"}
    for number, source in enumerate(sources, 1):
        if source.strip() in course_cells:
            continue
        if _too_big_to_rewrite(source):
            where.setdefault("a cell too big to scan as IPython runs it (read it yourself)", []).append(number)
        try:
            with _PARSING:
                tree = ast.parse(_python(source))
        except SyntaxError:
            continue
        visitor = _Scan()
        visitor.course_names, visitor.os_names = course_names, os_names
        visitor.visit(tree)
        found = list(visitor.found)
        if visitor.data_ptr and visitor.uses_ctypes_or_numpy:
            found.append("data_ptr with ctypes/NumPy")
        for what in found:
            where.setdefault(what, []).append(number)
    return [f"{what} (cell{'s' if len(cells) > 1 else ''} {', '.join(map(str, cells))})"
            for what, cells in where.items()]
