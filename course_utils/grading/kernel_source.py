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
import textwrap
from types import ModuleType

# The Python builtins a kernel body may call (Triton's code generator knows these and no others).
BUILTINS = {"len", "list", "range", "float", "int", "isinstance", "getattr", "hasattr", "print", "min", "max"}
# Modules a kernel may reach into: Triton's own, and math for constants (math.log2(math.e)).
MODULES = ("triton", "math")
# Attributes of the interpreter's tensors that hold their NumPy data (and any private or dunder attribute):
# no kernel on a GPU reads them.
INTERNALS = {"handle"}


@functools.cache
def _kernel_types() -> tuple[type, ...]:
    """@triton.jit functions compiled and interpreted, and @triton.constexpr_function ones (triton >= 3.5),
    whose bodies follow the same rule."""
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


def _source(fn) -> str:
    return getattr(fn, "src", None) or inspect.getsource(fn.fn)


def _allowed(value) -> bool:
    import triton.language as tl

    if isinstance(value, ModuleType):
        return value.__name__.split(".")[0] in MODULES
    if isinstance(value, (*_kernel_types(), tl.dtype, tl.constexpr, int, float, bool, str, type(None))):
        return True
    if isinstance(value, tuple):
        return all(_allowed(v) for v in value)
    module = getattr(value, "__module__", None) or ""
    return getattr(value, "__triton_builtin__", False) or module.startswith("triton.language")


def argument_problems(kernel, args, kwargs) -> list[str]:
    """Launch arguments a GPU's launcher would not take: a Python function or any other object whose
    methods the interpreter would run as Python (tensors, numbers, dtypes, Triton objects are fine)."""
    import torch

    found = []
    name = _jit_function(kernel).fn.__name__ if _jit_function(kernel) else "kernel"
    launch = {"grid", "warmup"}  # the launcher's own keywords: a grid may be a function of the meta-parameters
    for position, value in [*enumerate(args), *((k, v) for k, v in kwargs.items() if k not in launch)]:
        if _jit_function(value) is not None:  # a @triton.jit function passed in: its body follows the rule
            found += problems(value)
        elif not (isinstance(value, (torch.Tensor, torch.dtype)) or _allowed(value)
                  or type(value).__module__.startswith(("triton.language", "triton.tools"))):
            what = f"{type(value).__name__} {getattr(value, '__name__', '')}".strip()
            found.append(f"`{name}` was launched with {what} as argument {position!r}, which is not a tensor, "
                         "a number or a Triton object")
    return found


def _internal(attr: str) -> bool:
    return attr in INTERNALS or attr.startswith("_")


def problems(kernel) -> list[str]:
    """What in `kernel` (and the @triton.jit functions it calls) a GPU's compiler would refuse."""
    fn = _jit_function(kernel)
    return list(_problems(fn)) if fn is not None else []


@functools.lru_cache(maxsize=256)
def _problems(fn, seen: frozenset = frozenset()) -> tuple[str, ...]:
    try:
        src = textwrap.dedent(_source(fn))
        tree = ast.parse(src)
    except (OSError, SyntaxError, TypeError, AttributeError):
        return ()
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
    local = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    local |= {n.id for n in body if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    lines = src.splitlines()
    found = []

    def where(node) -> str:
        line = lines[node.lineno - 1].strip() if 0 < node.lineno <= len(lines) else ""
        return f"`{line}` (`{python.__name__}`, line {node.lineno} of the kernel)"

    for node in body:
        if isinstance(node, ast.Attribute) and _internal(node.attr):
            found.append(f"reads `.{node.attr}`, the interpreter's data of a Triton value, at {where(node)}")
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id
        if call in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if not isinstance(name, ast.Constant) or _internal(str(name.value)):
                found.append(f"reads an attribute by a computed or private name, at {where(node)}")
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load) or node.id in local:
            continue
        if node.id not in scope or node.id in BUILTINS and scope[node.id] is getattr(builtins, node.id, None):
            continue
        value = scope[node.id]
        jit = _jit_function(value)
        if jit is not None and jit is not fn and jit not in seen:
            found += _problems(jit, seen | {fn})
        elif not _allowed(value):
            what = f"the module `{value.__name__}`" if isinstance(value, ModuleType) else f"`{node.id}`"
            found.append(f"uses {what}, which is not Triton, at {where(node)}")
    return tuple(dict.fromkeys(found))
