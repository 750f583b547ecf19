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
  scan cannot read, also through the libraries' own doors: Inductor's PyCodeCache, torch.fx's exec, C
  extensions built from a string, a shared library loaded, a file the notebook wrote run by torch.hub or
  torch.package, a pickle given to a config's load_config or to np.load by position), /proc (looking at
  other processes), shared memory (share_memory_, /dev/shm: a tensor's memory read and written as a file);
- raw file descriptors (os.read/os.write/os.fdopen/os.dup, open() of a number, /dev/fd), a function's
  __closure__, the grader's modules (course_utils.grading): in a sandbox, the pipe to the grader, where
  a notebook could answer a check itself with a made-up account of how its outputs were computed;
- IPython's own door to code from strings and files: get_ipython() (run_cell), shell lines, %run and
  %load;
- the same reached without naming it: object internals (a function's __globals__, __dict__, vars(),
  __subclasses__ and the class graph, __code__), sys.modules, getattr/setattr (or operator.attrgetter)
  with a computed name; with a constant name, getattr(check, "__closure__") is judged as check.__closure__,
  and so is every other way to name an attribute without a dot: a match statement's class pattern
  (`case object(__closure__=cells)`), a format string's field ("{0.__closure__}", which a string.Formatter
  subclass hands over as the object), the name as a string (`__match_args__ = ("__closure__",)`);
- the grader's own objects reached from a course name (course_utils.grading.guard.HOST_OPS.update(...),
  course_utils.__path__): a notebook needs only the public names (check, setup, progress, ...);
- any import of a module outside what an honest course notebook imports (ALLOWED_IMPORTS), and such a
  module reached as another's attribute (torch.serialization.pickle): pickle, marshal, base64, runpy,
  code, types, importlib, IPython, sys, os, io and the like run code from bytes or strings, or reach
  what this scan judges by another way. A blocklist cannot name every door: what is not known harmless
  is shown to a human.
"""
from __future__ import annotations

import ast
import re
import string
import threading
from collections.abc import Iterable

MODULES = {
    "ctypes": "ctypes", "gc": "gc", "inspect": "inspect (frames)", "threading": "threads",
    "_thread": "threads", "concurrent": "threads", "signal": "signals", "subprocess": "process spawning",
    "multiprocessing": "process spawning", "pty": "process spawning", "socket": "network",
    "builtins": "builtins", "importlib": "importlib", "IPython": "IPython internals (get_ipython)",
}
IPYTHON = MODULES["IPython"]
# What the course's own notebooks import (solutions/ and exercises/, their bootstrap cell aside, which the
# scan skips when unchanged), and standard modules as harmless: none runs code from bytes or strings, or
# hands over frames, memory or processes. Any other import is flagged: imports(name).
ALLOWED_IMPORTS = frozenset({
    "__future__", "torch", "triton", "numpy", "matplotlib", "course_utils",
    "math", "cmath", "functools", "itertools", "typing", "dataclasses", "collections", "time", "random",
    "statistics", "numbers", "fractions", "decimal", "operator", "heapq", "bisect", "json", "re", "string",
    "textwrap", "copy", "enum", "abc", "contextlib", "warnings", "struct", "pprint", "datetime",
})
# Modules that run code from bytes, strings or files, or reach the interpreter's own machinery, when
# another module hands them over as an attribute (torch.serialization.pickle, typing.sys, random._os).
OPENER_ATTRS = frozenset({"pickle", "_pickle", "marshal", "runpy", "codeop", "importlib", "_imp", "pkgutil",
                          "shelve", "copyreg", "zipimport", "IPython", "os", "_os", "posix", "sys", "_sys",
                          "builtins", "_io", "io", "_posixsubprocess"})
OPAQUE = "code this scan cannot read"
UNPICKLING = f"unpickling ({OPAQUE})"


def imports(name: str) -> str:
    return f"imports {name} ({OPAQUE})"


# The course's modules a notebook has no use for: the grader's (the checker, its watcher, the sandbox's
# channel), reached as attributes of a course name.
GRADER_ATTRS = frozenset({"grading", "checks", "guard", "harness", "remote", "provenance", "kernel_source",
                          "sandbox", "batch", "flags"})
GRADER = "the grader's modules"
# Attribute names that open IPython's door to code from strings (the shell: get_ipython(), exit._ip).
IPYTHON_ATTRS = frozenset({"get_ipython", "run_cell", "run_cell_async", "run_code", "run_ast_nodes",
                           "safe_execfile", "safe_run_module", "_ip", "InteractiveShell"})
# Attributes that lead to code from strings or to the builtins (len.__self__ is the builtins module), also
# inside allowed modules: typing evaluates string annotations (get_type_hints, ForwardRef, and
# functools.singledispatch's register through it), dataclasses._create_fn runs the source it is given.
EXEC_ATTRS = frozenset({"exec", "__import__", "__builtins__", "exec_module", "run_path", "run_module",
                        "runsource", "runcode", "load_inline", "cpp_extension", "get_type_hints", "_eval_type",
                        "_evaluate", "ForwardRef", "singledispatch", "singledispatchmethod", "_create_fn",
                        # the allowed libraries' own doors to Python or C from a string: Inductor's code cache
                        # (PyCodeCache.load(source) imports it), torch.fx's exec, Triton's and NumPy's builders
                        # of C extensions, sympy's parser (an eval, reached as torch.utils._sympy...sympy), a
                        # shared library loaded (torch.ops.load_library, np.ctypeslib.load_library)
                        "codecache", "PyCodeCache", "CppCodeCache", "CppPythonBindingsCodeCache",
                        "CUDACodeCache", "_exec_with_source", "_forward_from_src", "_method_from_src",
                        "compile_module_from_src", "extbuild", "build_and_import_extension", "sympify",
                        "parse_expr", "load_library",
                        # a Python file the notebook wrote, imported by the library: torch.hub.load(dir, name,
                        # source="local") runs dir/hubconf.py, torch.package's importer the modules of a zip
                        "hub", "package", "PackageImporter",
                        # torch.fx's unpickling of a GraphModule, called by hand: reduce_graph_module({"code":
                        # source}, "") runs the source
                        "reduce_graph_module", "reduce_deploy_graph_module", "reduce_package_graph_module"})
# Doors to pickle.loads of bytes the notebook made (a pickle's REDUCE calls whatever it names): torch's config
# modules' load_config (torch._inductor.config.load_config(blob)).
UNPICKLING_ATTRS = frozenset({"load_config"})
# allow_pickle (NumPy) or pickle_module (torch.load), given by position: {function: the argument's position}
PICKLE_POSITIONS = {"load": 2, "NpzFile": 2, "read_array": 1}
# getattr by other names: string.Formatter().get_field("0.__closure__", (check,), {}) returns the object.
BY_NAME = frozenset({"getattr", "setattr", "delattr"})
# The libraries' own getattr by a dotted name (torch.fx.graph_module._get_attr(check, "__clo" + "sure__")):
# getattr under another name, whatever name it is given.
LIBRARY_GETATTRS = frozenset({"getattr_recursive", "setattr_recursive", "getattr_from_fqn", "_get_attr",
                              "_get_attr_via_attr_list", "_get_attr_from_qualname", "_assign_attr", "_del_attr",
                              "_has_attr", "object_setattr_ignore_descriptor"})
# A string.Formatter's methods that are handed the object a field name reached ("{0.__closure__}"): a subclass
# that defines one takes objects out of any format string, also one computed at run time.
FORMATTER_HOOKS = frozenset({"get_field", "convert_field", "format_field"})
RAW_FDS = "raw file descriptors"
# What an honest notebook takes from os (`os.environ["TRITON_INTERPRET"] = "1"`, as Triton's tutorials do): the
# os module used for these alone is no flag; any other use of it (an attribute not here, the module passed on
# or bound to another name) is "imports os", as before.
OS_HARMLESS = frozenset({"environ", "getenv", "path", "cpu_count", "getcwd", "sep"})
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
               "getmembers_static": "frames",
               # the libraries' own readers of a function's closure cells or of the frames above a call
               # (triton's JITFunction.get_capture_scope, torch._jit_internal's resolution callbacks,
               # traceback's walkers)
               "get_capture_scope": "frames", "get_closure": "frames", "createResolutionCallbackFromClosure": "frames",
               "createResolutionCallbackFromFrame": "frames", "walk_stack": "frames", "walk_tb": "frames"}
# The inspect module reached as another module's attribute (triton.runtime.jit.inspect), and names that
# hand a tensor's memory to NumPy or Python outside the tensor's own methods, or run host code inside a
# kernel's launch.
DLPACK, SUBCLASS = "DLPack (tensor memory to NumPy)", "tensor subclass internals"
SHARED = "shared memory (tensor memory read and written as a file)"
MODULE_ATTRS = {"inspect": "inspect (frames)", "gc": "gc", "ctypes": "ctypes",
                "subprocess": "process spawning", "to_dlpack": DLPACK, "from_dlpack": DLPACK,
                "_to_dlpack": DLPACK, "__dlpack__": DLPACK,
                "add_pre_run_hook": "kernel hooks", "pre_run_hooks": "kernel hooks",
                "_write_file": "tensor storage internals", "_make_subclass": SUBCLASS,
                "_make_wrapper_subclass": SUBCLASS, "__torch_dispatch__": SUBCLASS, "__torch_function__": SUBCLASS,
                # a mode of the notebook's is handed every torch call made while it is entered, the checker's too
                "TorchFunctionMode": "torch modes", "TorchDispatchMode": "torch modes",
                "__array_interface__": "NumPy over raw memory", "__cuda_array_interface__": "NumPy over raw memory",
                # np.lib.stride_tricks.as_strided checks no bounds: over a 1-byte array, with a stride that is the
                # distance to x.data_ptr() (the array's own address from byte_bounds, or id() of a bytes), it
                # reads and writes any memory of the process, x's and a scratch tensor's, with no ctypes
                "stride_tricks": "NumPy over raw memory", "byte_bounds": "NumPy over raw memory",
                "share_memory_": SHARED, "_share_filename_cpu_": SHARED, "_share_fd_cpu_": SHARED,
                "_new_shared_filename_cpu": SHARED, "_new_shared_fd_cpu": SHARED}
# Attributes that lead from an object to others it was not given: a function's module globals (the
# grader's channel class is one `check.__globals__["Channel"]` away), every class alive (`__subclasses__`),
# code objects.
OBJECT_INTERNALS = frozenset({"__globals__", "__subclasses__", "__base__", "__bases__", "__mro__", "__dict__",
                              "__getattribute__", "__code__", "__self__", "__objclass__", "__loader__",
                              "__spec__", "__reduce__", "__reduce_ex__"})
TORCH_INTERNALS = {"_enable_record_function": "torch._C internals",
                   "_disable_current_modes": "torch._C internals", "_DisableTorchDispatch": "torch._C internals",
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


# A line that starts with one of these may be rewritten: a magic, a shell escape, help (`?name`), and the
# autocall escapes (`/f x` is f(x), `,f a b` is f("a", "b"), `;f a` is f("a")).
ESCAPES = ("%", "!", "/", ",", ";", "?")


def _ipython_lines(source: str) -> int:
    """How many lines IPython may rewrite: magics and shell escapes anywhere (`x = !ls`, `_ = %who_ls`),
    lines that start with an escape, help (`name?`)."""
    return sum(1 for line in source.splitlines() if "%" in line or "!" in line
               or line.lstrip().startswith(ESCAPES) or line.rstrip().endswith("?"))


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
    """The cell with its escaped lines blank: magics, shell escapes and help anywhere, the autocall escapes
    (`/`, `,`, `;`) at the start of an unindented line (indented, they may continue an expression)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!", "?")) or line.startswith(ESCAPES) else line
                     for line in source.splitlines())


# What IPython's transformer turns magics and shell lines into: get_ipython().<one of these>(...).
MAGIC_CALLS = {"run_line_magic", "run_cell_magic", "system", "getoutput"}
# Magics that run code or commands this scan cannot read: a file, a shell, an earlier input by number.
OPAQUE_MAGICS = {"run", "load", "loadpy", "rerun", "recall", "macro", "writefile", "script", "bash", "sh",
                 "system", "sx", "alias", "perl", "ruby", "sc", "bookmark", "store", "autocall"}


class _Scan(ast.NodeVisitor):
    def __init__(self):
        self.found: list[str] = []
        self.called: set[int] = set()  # ids of the Name nodes that are called: getattr(...), not getattr
        self.course_names: set[str] = set()  # names bound to course_utils modules or their contents
        self.uses_ctypes_or_numpy = False
        self.data_ptr = False
        self.os_names: set[str] = {"os"}  # names bound to the os module (`import os as o`)
        self.harmless_os: set[int] = set()  # ids of the os names used for an OS_HARMLESS attribute only

    def add(self, what: str) -> None:
        if what not in self.found:
            self.found.append(what)

    def _module(self, name: str) -> None:
        """An imported module (`name` in full: torch.nn.functional): its own flag, or imports(...) when an
        honest notebook has no use for it."""
        top = name.split(".")[0]
        if top in MODULES:
            self.add(MODULES[top])
        elif top not in ALLOWED_IMPORTS and top != "os":  # os: judged by its uses (visit_Name, ImportFrom)
            self.add(imports(top))
        for part in name.split(".")[1:]:  # import torch._inductor.codecache: a door inside an allowed module
            if part in EXEC_ATTRS:
                self.add("exec/eval")
            if part in MODULE_ATTRS:  # from numpy.lib.stride_tricks import as_strided
                self.add(MODULE_ATTRS[part])
        if top in ("ctypes", "numpy"):
            self.uses_ctypes_or_numpy = True
        if top == "course_utils" and name.split(".")[1:2] and name.split(".")[1] in GRADER_ATTRS:
            self.add(GRADER)

    def visit_Import(self, node):
        for alias in node.names:
            self._module(alias.name)
            if alias.name == "os":
                self.os_names.add(alias.asname or "os")
            if alias.name.split(".")[0] == "course_utils":
                self.course_names.add(alias.asname or "course_utils")
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        module = node.module or ""
        top = module.split(".")[0]
        if node.level:  # a relative import: no package of the notebook's own to be relative to
            self.add(imports("." * node.level + module))
        else:
            self._module(module)
        for alias in node.names:  # from triton.runtime.jit import inspect; from sys import _getframe; ...
            self._attribute(alias.name, None)
            if top == "course_utils" and "." not in module and alias.name in GRADER_ATTRS:
                self.add(GRADER)  # from course_utils import grading
        if top == "os":
            for alias in node.names:
                if alias.name in OS_CALLS:
                    self.add(OS_CALLS[alias.name])
            if module == "os" and not all(alias.name in OS_HARMLESS for alias in node.names):
                self.add(imports("os"))
        if top == "sys" and any(alias.name == "modules" for alias in node.names):
            self.add("sys.modules")
        if top == "course_utils":
            self.course_names.update(alias.asname or alias.name for alias in node.names)
        self.generic_visit(node)

    def _attribute(self, attr: str, value: ast.AST | None) -> None:
        """`value.attr`, written as an attribute, or by getattr/setattr/delattr/hasattr (or attrgetter)
        with a constant name, or imported by name (value None): judged the same way."""
        root = _root(value) if value is not None else None
        if root in self.os_names and attr in OS_CALLS:
            self.add(OS_CALLS[attr])
        if attr in FRAME_ATTRS:
            self.add(FRAME_ATTRS[attr])
        if attr in MODULE_ATTRS:
            self.add(MODULE_ATTRS[attr])
        if attr in MODULES:  # triton.runtime.jit.inspect, some_module.threading
            self.add(MODULES[attr])
        if attr in OBJECT_INTERNALS:
            self.add("object internals")
        if attr == "modules" and value is not None and _dotted(value) == "sys":
            self.add("sys.modules")
        if attr in TORCH_INTERNALS:
            self.add(TORCH_INTERNALS[attr])
        if attr in IPYTHON_ATTRS:
            self.add(IPYTHON)
        if attr in EXEC_ATTRS:
            self.add("exec/eval")
        if attr in UNPICKLING_ATTRS:
            self.add(UNPICKLING)
        if attr in OPENER_ATTRS:
            self.add(imports(attr.lstrip("_")))
        # course_utils.grading.guard.HOST_OPS.update(...), course_utils.__path__.append(...), check._x: the
        # grader's objects, and a course module's internals, changed in place or read
        if root in self.course_names and (attr in GRADER_ATTRS or attr.startswith("_")):
            self.add(GRADER)
        if attr == "set_":
            self.add("Tensor.set_")
        if attr in ("pre_hook", "post_hook"):
            self.add("autotune hook")
        if attr == "data_ptr":
            self.data_ptr = True
        if attr in ("ctypeslib", "ctypes", "from_address"):
            self.uses_ctypes_or_numpy = True
        if attr == "get_field" or attr in LIBRARY_GETATTRS:
            self.add("computed attribute names")

    def visit_Attribute(self, node):
        self._attribute(node.attr, node.value)
        if isinstance(node.value, ast.Name) and node.value.id in self.os_names and node.attr in OS_HARMLESS:
            self.harmless_os.add(id(node.value))
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in self.os_names and id(node) not in self.harmless_os:
            self.add(imports("os"))
        if node.id in ("exec", "eval", "compile", "__import__", "__builtins__"):
            self.add("exec/eval")
        if node.id in ("get_ipython", "IPython"):  # what magics do not give: run_cell of a string
            self.add(IPYTHON)
        if node.id in FRAME_ATTRS and node.id.startswith("_"):
            self.add(FRAME_ATTRS[node.id])
        if node.id in BY_NAME and id(node) not in self.called:  # functools.reduce(getattr, names, check)
            self.add("computed attribute names")
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
                inner = parse(_python(text))
            except SyntaxError:
                continue
            self.visit(inner)
        return True

    def visit_Call(self, node):
        if self._magic(node):
            return
        self.called.add(id(node.func))
        if _dotted(node.func).split(".")[-1] in ("attrgetter", "methodcaller"):  # getattr by another name
            names = node.args[:1] if _dotted(node.func).endswith("methodcaller") else node.args
            if any(not (isinstance(a, ast.Constant) and isinstance(a.value, str)) for a in names):
                self.add("computed attribute names")
            for a in names:  # attrgetter("__closure__"), attrgetter("grading.guard"): each name of the path
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    for part in a.value.split("."):
                        self._attribute(part, node)
        for kw in node.keywords:
            if kw.arg in ("pre_hook", "post_hook"):
                self.add("autotune hook")
            # torch.load(f, weights_only=False), np.load(f, allow_pickle=True): a pickle's REDUCE calls
            # whatever it names (builtins.exec of a string)
            constant = isinstance(kw.value, ast.Constant)
            if (kw.arg == "weights_only" and not (constant and kw.value.value is True)
                    or kw.arg == "allow_pickle" and not (constant and not kw.value.value)
                    or kw.arg == "pickle_module"):
                self.add(UNPICKLING)
        name = _dotted(node.func)
        # np.load(f, None, True): allow_pickle by position, as unsafe as by name
        position = PICKLE_POSITIONS.get(name.split(".")[-1])
        if position is not None and len(node.args) > position:
            given = node.args[position]
            if not (isinstance(given, ast.Constant) and given.value in (None, False)):
                self.add(UNPICKLING)
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
        if attr is not None and isinstance(attr, ast.Constant) and isinstance(attr.value, str):
            self._attribute(attr.value, node.args[0])  # getattr(check, "__closure__") is check.__closure__
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
        if isinstance(node.value, ast.Name | ast.Attribute) and _root(node.value) in self.course_names:
            # g = course_utils: g.grading is the grader's too
            self.course_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._targets([node.target])
        self.generic_visit(node)

    def _by_name(self, attr: str) -> None:
        """An attribute read by a name written elsewhere than after a dot, of an object the scan cannot
        follow (`course_utils` among them): judged as `anything.attr`, the grader's modules included."""
        self._attribute(attr, None)
        if attr in GRADER_ATTRS:
            self.add(GRADER)

    def visit_MatchClass(self, node):
        # `case object(__closure__=cells):` reads the attribute, as check.__closure__ does
        for attr in node.kwd_attrs:
            self._by_name(attr)
        self.generic_visit(node)

    def _format_fields(self, text: str) -> None:
        """The attributes a format string's fields read ("{0.__closure__[0].cell_contents}"): judged as
        attributes, since a string.Formatter subclass hands over the objects they reach."""
        try:
            fields = list(string.Formatter().parse(text))
        except ValueError:  # no format string ("{" alone)
            return
        for _, field, spec, _ in fields:
            for attr in re.findall(r"\.([^.\[\]]+)", field or ""):
                self._by_name(attr)
            if spec and "{" in spec:
                self._format_fields(spec)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and "{" in node.value:
            self._format_fields(node.value)
        if isinstance(node.value, str) and (node.value in FRAME_ATTRS or node.value in OBJECT_INTERNALS):
            # a name no honest notebook writes as text: `__match_args__ = ("__closure__",)` has `case C(cells)`
            # read it from any object (a metaclass's __instancecheck__ lets every object match C)
            self._by_name(node.value)
        if isinstance(node.value, str) and "/proc/" in node.value:
            self.add("/proc")
        if isinstance(node.value, str) and "/dev/fd" in node.value:
            self.add(RAW_FDS)
        if isinstance(node.value, str) and "/dev/shm" in node.value:
            self.add(SHARED)
        if node.value in ("__builtins__", "__import__"):  # globals()["__builtins__"]: the name as a string
            self.add("exec/eval")
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        if node.name in MODULE_ATTRS:  # def __torch_dispatch__(...): a tensor subclass of one's own
            self.add(MODULE_ATTRS[node.name])
        if node.name in FORMATTER_HOOKS:  # class Grab(string.Formatter): def format_field(self, value, spec)
            self.add("computed attribute names")
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


TOO_DEEP = "a cell nested too deep to scan (read it yourself)"


# The batch grader scans notebooks from several threads at once (grade(jobs=...)), and CPython 3.11's
# ast.parse is not thread-safe: two at a time can fail with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905). One parse at a time; IPython's rewrite (_python: tokenize, no ast),
# the slow part, runs before the lock is taken, so that one notebook's scan never keeps the others waiting.
_PARSING = threading.Lock()


def parse(source: str) -> ast.Module:
    """ast.parse, one thread at a time (SyntaxError as ast.parse raises it)."""
    with _PARSING:
        return ast.parse(source)


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
        visitor = _Scan()
        visitor.course_names, visitor.os_names = course_names, os_names
        try:
            visitor.visit(parse(_python(source)))
        except SyntaxError:
            continue
        except (RecursionError, MemoryError):  # `1+1+...` 50,000 times: deeper than Python's parser or this scan
            visitor.add(TOO_DEEP)
        found = list(visitor.found)
        if visitor.data_ptr and visitor.uses_ctypes_or_numpy:
            found.append("data_ptr with ctypes/NumPy")
        for what in found:
            where.setdefault(what, []).append(number)
    return [f"{what} (cell{'s' if len(cells) > 1 else ''} {', '.join(map(str, cells))})"
            for what, cells in where.items()]
