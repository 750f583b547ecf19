"""What a @triton.jit body may call: the rule a GPU's compiler enforces, checked in the interpreter too.

On a GPU, Triton compiles the kernel's body: a name it reads must be a Triton function (`tl.*`, another
@triton.jit function), a module, a dtype or a constant, and what it calls through a module must work on
Triton values. The interpreter runs the same body as plain Python, where anything goes: a helper that
calls `torch.softmax` on the block's NumPy data computes on the host and still stores through `tl.store`.
`problems(kernel)` names each such call in a launched kernel and in the @triton.jit functions it calls,
so that the interpreter refuses what a GPU would, with the line that does it.
"""
from __future__ import annotations

import ast
import builtins
import functools
import inspect
import os
import sysconfig
import textwrap
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType

# The Python builtins a kernel body may call (Triton's code generator knows these and no others).
BUILTINS = {"len", "list", "range", "float", "int", "isinstance", "getattr", "hasattr", "print", "min", "max"}
# Modules whose functions a kernel may call: Triton's own, and math for constants (math.log2(math.e)).
MODULES = ("triton", "math")
# Attributes of the interpreter's tensors that hold their NumPy data (and any private or dunder attribute
# of a value): no kernel on a GPU reads them.
INTERNALS = {"handle"}
# What a namedtuple's class holds that is not a method of the notebook's.
NAMEDTUPLE = {"__module__", "__doc__", "__slots__", "_fields", "_field_defaults", "__match_args__", "__new__",
              "__repr__", "__getnewargs__", "_make", "_replace", "_asdict", "__annotations__",
              "__orig_bases__", "__static_attributes__", "__firstlineno__", "__getstate__"}
# Constructs a kernel body cannot have (Triton's code generator refuses them): a name bound inside one
# would also hide a helper of the same name from the names checked below.
UNSUPPORTED = (ast.Lambda, ast.GeneratorExp, ast.SetComp, ast.DictComp, ast.FunctionDef, ast.AsyncFunctionDef,
               ast.ClassDef, ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)


def _kernel_types() -> tuple[type, ...]:
    """@triton.jit functions compiled and interpreted, and @triton.constexpr_function ones (triton >= 3.5),
    whose bodies follow the same rule. Looked up on every call, not cached: a cache filled while a test
    (or a notebook) had replaced one of these classes would keep the replacement."""
    import triton.runtime.jit as jit

    kinds = [jit.JITFunction, getattr(jit, "ConstexprFunction", None)]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        kinds.append(InterpretedFunction)
    except ImportError:
        pass
    return tuple(k for k in kinds if k is not None)


def _jit_function(obj):
    """The @triton.jit function (compiled or interpreted) behind a kernel, an Autotuner or a Heuristics
    object, or None."""
    kinds = _kernel_types()
    for _ in range(6):
        if isinstance(obj, kinds):
            return obj
        obj = getattr(obj, "fn", None)
        if obj is None:
            return None
    return None


def _source(fn) -> tuple[str, int]:
    """The kernel's source as the interpreter runs it: from the *last* line that starts with `def ` (its
    rewriter looks for that line, inside a string or not), or the compiled kernel's own source; and how
    many lines of the whole source start with `def `."""
    lines = inspect.getsource(fn.fn).splitlines(keepends=True)
    defs = [i for i, line in enumerate(lines) if line.strip().startswith("def ")]
    if getattr(fn, "src", None):
        return fn.src, len(defs)
    return "".join(lines[defs[-1]:]) if defs else "".join(lines), len(defs)


def _allowed(value) -> bool:
    """Can a kernel body use `value` without running Python of the notebook's on the block's data?"""
    import triton.language as tl

    if isinstance(value, ModuleType):
        return value.__name__.split(".")[0] in MODULES
    if isinstance(value, tl.tuple):  # made on the host: a list inside (`.values`), the kernel's to append its
        return False  # blocks to and the host's to read; a kernel is handed a Python tuple (or makes its own)
    if isinstance(value, tl.constexpr):  # what it wraps: tl.constexpr(a host function) calls it
        return value.value is not value and _allowed(value.value)
    if isinstance(value, (*_kernel_types(), tl.dtype)) or type(value) in (int, float, bool, str, type(None)):
        return True
    if isinstance(value, tuple):  # a tuple or a namedtuple of allowed values, with no methods of its own
        return _plain_tuple(value) and all(map(_allowed, value))
    # Where its code lives, not what it says (a helper can set its own __module__): a function of Triton's
    # language (_language_code), math's built-in functions, and otherwise an object of a class of triton.language
    # whose every callable attribute is a function in Triton's files.
    if isinstance(value, (FunctionType, MethodType)):
        return _language_code(value)
    if isinstance(value, functools.partial):  # tl.multiple_of, max_contiguous, max_constancy while the
        return (_allowed(value.func) and all(map(_allowed, value.args))  # interpreter runs a kernel: its
                and all(map(_allowed, value.keywords.values())))  # _set_attr with the hint's name bound
    if value is builtins.print:  # tl.static_print while the interpreter runs a kernel (a body's print is one)
        return True
    if isinstance(value, BuiltinFunctionType):
        return getattr(value, "__module__", None) == "math"
    cls = value if isinstance(value, type) else type(value)
    module = getattr(cls, "__module__", None) or ""
    if not (module == "triton" or module.startswith(("triton.language", "triton.tools", "triton._C"))):
        return False  # triton.tools: TensorDescriptor; triton._C: tl.PropagateNan
    bound = type(cls).__module__ == "pybind11_builtins"  # a class of Triton's C++ bindings: its methods are
    for attr in vars(cls).values():  # built in (tl.PropagateNan before triton 3.9)
        attr = getattr(attr, "__func__", attr)  # staticmethod, classmethod
        functions = [attr.fget, attr.fset] if isinstance(attr, property) else [attr]
        for f in filter(None, functions):
            if isinstance(f, FunctionType) and not _library_code(f) or (  # object.__new__ is a type's own
                    callable(f) and not isinstance(f, (FunctionType, type)) and not _allowed(f) and not bound
                    and not isinstance(getattr(f, "__self__", None), type)):
                return False
    return True


def _language_code(function) -> bool:
    """Is `function` Triton's language (triton/language/: tl.*, tl.extra's libdevice) or one of triton's top-level
    helpers (triton/__init__.py: triton.cdiv, triton.next_power_of_2)? Not any function of Triton's files: the
    host's own utilities live there too, and triton._instrumentation.instrument(...), called in a kernel body,
    ran a Python function the host had registered (register_instrumentation) inside the launch, where the
    checker pauses: `S.copy_(x + y)` unseen, and a kernel copied S into out (02.vector_add passed, unflagged)."""
    path = os.path.abspath(function.__code__.co_filename)
    if path == os.path.join(_triton_dir(), "runtime", "interpreter.py"):  # tl.* as the interpreter patches them
        return str(getattr(function, "__qualname__", "")).startswith("_patch_")  # while a kernel runs
    return (path.startswith(os.path.join(_triton_dir(), "language") + os.sep)
            or path == os.path.join(_triton_dir(), "__init__.py"))


def _library_code(function) -> bool:
    """Code of Triton's files or of Python's standard library, or generated by it (a dataclass's
    __init__, an enum's), not the notebook's."""
    return function.__code__.co_filename == "<string>" or code_under(function, (_triton_dir(), _stdlib_dir()))


def code_under(function, dirs: tuple[str, ...]) -> bool:
    """Is the Python code of `function` in a file under one of `dirs` (each ending in a separator)?"""
    return os.path.abspath(function.__code__.co_filename).startswith(dirs)


@functools.cache
def _stdlib_dir() -> str:
    return os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


@functools.cache
def _triton_dir() -> str:
    import triton

    return os.path.dirname(os.path.abspath(triton.__file__)) + os.sep


def _attribute(node: ast.Attribute, scope: dict, local: set):
    """The value of `a.b.c` when `a` is a global name the kernel reaches: a module (tl, triton, math), a
    @triton.jit function or a value a kernel may use (a namedtuple of constants); else None. What a global
    holds is judged too: `helper.rewritten_fn` of a @triton.jit function is a dict, where a kernel could
    leave its blocks for the host to read."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id in local or node.id not in scope:
        return None
    value = scope[node.id]
    if not (isinstance(value, ModuleType) or _jit_function(value) is not None or _allowed(value)):
        return None  # the name itself is refused (problems)
    for name in reversed(names):
        try:
            value = getattr(value, name)
        except Exception:
            return None
    return value


def _plain_tuple(value) -> bool:
    """A tuple, or a namedtuple with no methods of its own: Triton takes one as an argument (triton >= 3.3),
    each item an argument of its own (a tuple of tensors is a tuple of pointers)."""
    if type(value) is tuple:
        return True
    return isinstance(value, tuple) and hasattr(value, "_fields") and not (
        set(vars(type(value))) - NAMEDTUPLE - set(value._fields))


def flat_arguments(args, kwargs, launch=("grid", "warmup")) -> list[tuple[str, object]]:
    """(where, value) of a launch's arguments, tuples opened ("1[0]" for the first item of the second), the
    launcher's own keywords left out."""
    found = []

    def add(where: str, value) -> None:
        if _plain_tuple(value):
            for i, item in enumerate(value):
                add(f"{where}[{i}]", item)
        else:
            found.append((where, value))

    for where, value in [*enumerate(args), *((k, v) for k, v in kwargs.items() if k not in launch)]:
        add(str(where), value)
    return found


def argument_problems(kernel, args, kwargs) -> list[str]:
    """Launch arguments a GPU's launcher would not take: a Python function or any other object whose
    methods the interpreter would run as Python (tensors, numbers, dtypes, Triton objects are fine)."""
    import torch
    import triton.language as tl

    found = []
    jit = _jit_function(kernel)
    name = jit.fn.__name__ if jit is not None else "kernel"
    # (the launcher's own keywords left out: a grid may be a function of the meta-parameters)
    for position, value in flat_arguments(args, kwargs):
        if _jit_function(value) is not None:  # a @triton.jit function passed in: its body follows the rule
            found += problems(value)
        elif not (isinstance(value, (torch.Tensor, torch.dtype)) or _allowed(value) or _numpy_float(value)):
            # a kernel sees a tensor as a pointer (tensor subclasses: subclass_problems)
            what = ("a tl.tuple" if isinstance(value, tl.tuple)
                    else f"{type(value).__name__} {getattr(value, '__name__', '')}".strip())
            found.append(f"`{name}` was launched with {what} as argument {position}, which is not a tensor, "
                         "a number or a Triton object")
    return found


def _numpy_float(value) -> bool:
    """np.float64 (1 / np.sqrt(d)): a float whose methods are NumPy's C, which Triton's launcher takes as a float
    (it takes no other NumPy scalar: np.float32, np.int64 and np.bool_ are refused on a GPU too)."""
    import numpy as np

    return type(value) is np.float64


def subclass_problems(kernel, args, kwargs) -> list[str]:
    """Tensor subclasses among a launch's arguments (both modes): Triton's launcher calls a tensor's methods
    (data_ptr on a GPU; new_empty, set_ in the interpreter) inside the launch, where the checker pauses."""
    import torch

    jit = _jit_function(kernel)
    name = jit.fn.__name__ if jit is not None else "kernel"
    return [f"`{name}` was launched with a {type(value).__name__}, a tensor subclass whose Python methods run "
            f"inside the launch, as argument {where}: pass the plain tensor"
            for where, value in flat_arguments(args, kwargs, launch=())
            if isinstance(value, torch.Tensor) and _python_tensor(type(value))]


def _python_tensor(cls) -> bool:
    """A tensor subclass other than nn.Parameter and the checker's own: its Python methods
    (__torch_function__, __torch_dispatch__, new_empty, data_ptr...) run wherever torch or Triton touch it."""
    import torch

    if cls is torch.Tensor:
        return False
    from ..checks.l05_online_softmax import _ReadLog  # 05's read log: the only subclass the checks make

    own = (torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.nn.Parameter), _ReadLog)
    return cls not in own  # by identity: a class can name any module, and copy any method


def _internal(attr: str) -> bool:
    return attr in INTERNALS or attr.startswith("_")


def problems(kernel) -> list[str]:
    """What in `kernel` (and the @triton.jit functions it calls) a GPU's compiler would refuse."""
    fn = _jit_function(kernel)
    return list(_problems(fn)) if fn is not None else []


@functools.lru_cache(maxsize=256)
def _parse(src: str) -> ast.Module:
    return ast.parse(src)


def _problems(fn, seen: frozenset = frozenset()) -> tuple[str, ...]:
    """Judged at every launch (the names a body reads can be bound to something else between two)."""
    if isinstance(fn.fn, FunctionType) and code_under(fn.fn, (_triton_dir(),)):  # Triton's own (tl.max, ...)
        return ()
    name = getattr(fn.fn, "__name__", "kernel")
    unread = (f"`{name}` has no source that can be read (made by exec?): Triton compiles a kernel from its "
              "source file",)  # the interpreter would run it unchecked
    try:
        src, def_lines = _source(fn)
    except (OSError, TypeError, AttributeError):
        return unread
    if def_lines > 1:  # a second `def` line, in a docstring say: what runs is not what reads as the body
        return (f"has {def_lines} lines that start with `def ` in `{name}`'s source: the interpreter runs "
                "the code from the last one; a kernel has one",)
    try:
        src = textwrap.dedent(src)
        tree = _parse(src)
    except SyntaxError:
        return unread
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs:
        return ()
    signature = defs[0].args  # the body and the parameters' defaults, not the decorators
    body = [node for part in (*defs[0].body, *signature.defaults, *filter(None, signature.kw_defaults))
            for node in ast.walk(part)]
    python = fn.fn
    scope = dict(vars(builtins))
    scope.update(python.__globals__)
    scope.update(inspect.getclosurevars(python).nonlocals)
    # Local names: the parameters and what the body assigns, not a comprehension's own variable (it lives in
    # the comprehension only, and `[h for h in ()]` must not hide a helper h used elsewhere)
    in_comprehension = {id(n) for c in body if isinstance(c, ast.comprehension) for n in ast.walk(c.target)}
    local = {a.arg for a in signature.args + signature.posonlyargs + signature.kwonlyargs}
    local |= {n.id for n in body if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
              and id(n) not in in_comprehension}
    lines = src.splitlines()
    found = []

    def where(node) -> str:
        line = lines[node.lineno - 1].strip() if 0 < node.lineno <= len(lines) else ""
        return f"`{line}` (`{python.__name__}`, line {node.lineno} of the kernel)"

    def followed(value) -> bool:
        """Is `value` a @triton.jit function? Then its own body is judged, once (True)."""
        nonlocal found
        jit = _jit_function(value)
        if jit is not None and jit is not fn and jit not in seen:
            found += _problems(jit, seen | {fn})
        return jit is not None

    # Defaults of the parameters, as values: `sink=[]` is a list the interpreter's calls share (the rewritten
    # function's own), where a kernel appends its blocks for the host to read; a GPU launches with none.
    try:
        parameters = inspect.signature(python).parameters.values()
    except (TypeError, ValueError):
        parameters = ()
    for parameter in parameters:
        value = parameter.default
        if value is not parameter.empty and not followed(value) and not _allowed(value):
            found.append(f"has a parameter `{parameter.name}` of `{python.__name__}` whose default is a "
                         f"{type(value).__name__}, not a number, a string or a Triton object (a GPU's launcher "
                         "takes none; the interpreter's calls of the kernel would all share it)")
    for node in body:
        if isinstance(node, UNSUPPORTED):
            found.append(f"has a {type(node).__name__}, which no Triton kernel can have, at {where(node)}")
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            # `tl.float32.leak = x`: the block left on an object the host reaches; Triton's compiler refuses it
            found.append(f"assigns to the attribute `{ast.unparse(node)}`, which no Triton kernel can, at "
                         f"{where(node)}")
        elif isinstance(node, ast.Attribute):  # module.name: what it is now (tl.exp can be reassigned)
            value = _attribute(node, scope, local)
            if followed(value):
                pass
            elif value is not None and not _allowed(value):
                found.append(f"uses `{ast.unparse(node)}`, which is not Triton, at {where(node)}")
            elif value is None and _internal(node.attr):  # x.handle, x.__dict__ of a value in the kernel
                found.append(f"reads `.{node.attr}`, the interpreter's data of a Triton value, at {where(node)}")
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id
        if call in ("getattr", "hasattr"):
            attr = node.args[1] if len(node.args) > 1 else None
            if not isinstance(attr, ast.Constant) or _internal(str(attr.value)):
                found.append(f"reads an attribute by a computed or private name, at {where(node)}")
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load) or node.id in local:
            continue
        if node.id not in scope or node.id in BUILTINS and scope[node.id] is getattr(builtins, node.id, None):
            continue
        value = scope[node.id]
        if not followed(value) and not isinstance(value, ModuleType) and not _allowed(value):  # a module: what the kernel takes
            found.append(f"uses `{node.id}`, which is not Triton, at {where(node)}")  # from it is judged above
    return tuple(dict.fromkeys(found))
