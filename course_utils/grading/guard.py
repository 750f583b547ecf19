"""Watching a candidate while it runs: kernel launches, torch ops, and (in the interpreter) every address.

What the checker wants to know about a student's function, beyond its output:
- did it launch a Triton kernel at all, and how many (`launches`; an autotuned kernel counts once)?
- which torch operations did it run on the host (`torch_ops`), from which line of their code
  (`op_sites`), and inside which PyTorch reference (`references`: functions named `*_ref`)?
  `F.softmax(x)` copied into `out` gives the right numbers but teaches nothing, so kernel exercises
  reject it, naming the function as the student wrote it (`TORCH_NAMES`: aten.mm -> torch.matmul / @);
- did it hand tensor data to NumPy or Python (`host_reads`: Tensor.numpy, tolist, item)? Printing a
  tensor while debugging is not counted: while a candidate is watched a tensor prints as its shape and
  dtype, its values hidden (`str(x)` parsed back into numbers would be a read no op records);
- in interpreter mode, did a kernel touch memory outside the tensors it was given? The interpreter
  does no bounds checking: an unmasked `tl.store` past the end of a buffer silently overwrites
  whatever lies there, and can abort the whole Python process later. So every masked load and store
  is checked against the storages of the launch's tensor arguments *before* it happens.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import os
import pathlib
import re
import secrets
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

try:  # torch >= 2.2: a profiler range without an op of its own
    from torch._C._profiler import _RecordFunctionFast
except ImportError:  # pragma: no cover - older torch
    from torch.autograd.profiler import record_function as _RecordFunctionFast
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..mode import current, interpreter_too_old
from . import kernel_source

# Host-side torch ops a kernel exercise may use: allocation, views and metadata, no arithmetic.
HOST_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "zero_", "fill_", "full", "full_like", "ones", "new_zeros", "view", "_unsafe_view", "reshape",
    "_reshape_alias", "as_strided", "t", "transpose", "permute", "expand", "slice", "select",
    "unsqueeze", "squeeze", "detach", "alias", "lift_fresh", "resolve_conj", "resolve_neg",
    "_local_scalar_dense", "split", "chunk", "narrow", "unbind", "view_as", "expand_as", "flatten", "unflatten",
    "is_nonzero", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "set_",
    # allocations filled with a constant or with indices, as `full` and `zeros` are: no data of anybody's
    "new_full", "new_ones", "ones_like", "arange", "scalar_tensor",
})


# How a student wrote the aten ops that show up in kernel exercises, for messages that name the
# torch function they called rather than its internal name. Ops not listed are shown as aten.<op>.
TORCH_NAMES = {
    "mm": "torch.matmul / @", "bmm": "torch.matmul / @", "matmul": "torch.matmul / @",
    "addmm": "torch.matmul / @ / F.linear", "baddbmm": "torch.matmul / @", "mv": "torch.matmul / @",
    "addmv": "torch.matmul / @", "dot": "torch.matmul / @ / torch.dot", "vdot": "torch.vdot",
    "linear": "F.linear", "einsum": "torch.einsum", "_scaled_mm": "torch._scaled_mm",
    "_softmax": "torch.softmax / F.softmax", "softmax": "torch.softmax / F.softmax",
    "_log_softmax": "F.log_softmax", "logsumexp": "torch.logsumexp",
    "_scaled_dot_product_flash_attention": "F.scaled_dot_product_attention",
    "_scaled_dot_product_efficient_attention": "F.scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu": "F.scaled_dot_product_attention",
    "_scaled_dot_product_cudnn_attention": "F.scaled_dot_product_attention",
    "rms_norm": "F.rms_norm", "_fused_rms_norm": "F.rms_norm", "native_layer_norm": "F.layer_norm",
    "add": "torch.add / +", "sub": "torch.sub / -", "rsub": "torch.sub / -", "mul": "torch.mul / *",
    "div": "torch.div / the / operator", "neg": "torch.neg / unary -", "pow": "torch.pow / **",
    "remainder": "torch.remainder / %", "floor_divide": "torch.floor_divide / //",
    "relu": "torch.relu / F.relu", "relu_": "torch.relu_ / F.relu(inplace=True)",
    "clamp": "torch.clamp", "clamp_min": "torch.clamp(min=) / F.relu", "clamp_max": "torch.clamp(max=)",
    "maximum": "torch.maximum", "minimum": "torch.minimum", "max": "torch.max", "min": "torch.min",
    "amax": "torch.amax / Tensor.max(dim)", "amin": "torch.amin / Tensor.min(dim)",
    "sum": "torch.sum", "mean": "torch.mean", "var": "torch.var", "std": "torch.std",
    "linalg_vector_norm": "torch.norm / torch.linalg.vector_norm", "cumsum": "torch.cumsum",
    "exp": "torch.exp", "exp2": "torch.exp2", "log": "torch.log", "sqrt": "torch.sqrt",
    "rsqrt": "torch.rsqrt",
    "sin": "torch.sin", "cos": "torch.cos", "tanh": "torch.tanh", "sigmoid": "torch.sigmoid",
    "silu": "F.silu", "gelu": "F.gelu", "abs": "torch.abs", "sign": "torch.sign", "where": "torch.where",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "bitwise_and": "torch.bitwise_and / &", "bitwise_or": "torch.bitwise_or / |",
    "bitwise_xor": "torch.bitwise_xor / ^", "bitwise_left_shift": "torch.bitwise_left_shift / <<",
    "bitwise_right_shift": "torch.bitwise_right_shift / >>", "__lshift__": "<<", "__rshift__": ">>",
    "copy_": "Tensor.copy_ / out[...] = ...", "clone": "Tensor.clone / Tensor.contiguous",
    "_to_copy": "Tensor.to / .float() / .half() / .cpu()", "cat": "torch.cat", "stack": "torch.stack",
    "index_put_": "out[index] = ...", "index": "x[index_tensor]", "gather": "torch.gather",
    "index_select": "torch.index_select", "masked_fill": "Tensor.masked_fill",
    "masked_fill_": "Tensor.masked_fill_", "sort": "torch.sort", "topk": "torch.topk",
    "embedding": "F.embedding", "round": "torch.round", "floor": "torch.floor", "ceil": "torch.ceil",
    "fill_.Tensor": "Tensor.fill_(a tensor's element)",
}


def torch_name(op: str) -> str:
    """`aten.mm` as a student wrote it: "torch.matmul / @ (aten.mm)"; unknown ops stay "aten.<op>", and an op
    of another namespace (a torch.library custom op, recorded as "ns::name") says so."""
    if "::" in op:
        return f"the custom op {op}"
    return f"{TORCH_NAMES[op]} (aten.{op})" if op in TORCH_NAMES else f"aten.{op}"


def _op_name(func) -> str:
    """The name an op is recorded under: aten's (and prims') by their bare name, as HOST_OPS and the rules
    spell them; another namespace's (a torch.library custom op) as "ns::name", whatever its name is."""
    name = func.overloadpacket.__name__
    namespace = getattr(func, "namespace", "aten")
    return name if namespace in ("aten", "prims") else f"{namespace}::{name}"


# Tensor methods that hand the data to Python or NumPy, where a kernel exercise could compute the
# answer without torch ops or a kernel. Formatting a tensor (print, str, repr, f-strings) is not counted:
# it gives the shape and dtype only (`_hidden`), so that a debugging print costs nothing and hands over
# no values.
HOST_READS = frozenset({"numpy", "tolist", "__array__", "__dlpack__"})
_FORMATTING = frozenset({"__repr__", "__str__", "__format__"})
# The same one element at a time: x[i].item(), float(x[i]), int(x[i]) and `if x[i]:` run this aten op.
# The value is then Python's to compute with, and Tensor.fill_ can hand the result back to a kernel.
_SCALAR_READ = "_local_scalar_dense"


class CannotWatch(RuntimeError):
    """This machine's torch or Triton cannot be watched (an interpreter too old to count launches): the
    check cannot judge anybody's function here, which is no fault of the function's."""


class Refused(RuntimeError):
    """A launch the checker stops in the interpreter, before the kernel's result could count; `kind` is the
    kind of problem it is (harness.KINDS), which picks the hint."""

    kind = "host"


class OutOfBounds(Refused):
    """A kernel in the interpreter reached for memory that none of its tensor arguments owns."""

    kind = "out_of_bounds"


class NotTriton(Refused):
    """Host code swapped what the interpreter computes with (NumPy's functions, Triton's, its builder's)."""


@dataclass(frozen=True)
class Launch:
    name: str  # the @triton.jit function's name
    module: str  # the module that defined it, e.g. "course_utils.lessons.l02_first_kernels"
    shapes: tuple[tuple[int, ...], ...]  # shapes of its tensor arguments
    inputs: tuple[bool, ...] = ()  # per tensor argument: does it share storage with an input of the call?
    # Per tensor argument: the shape of the call's tensor (input or output) whose storage it shares, () if
    # none. A flat view of x still belongs to x: it is x's (rows, hidden) that makes a launch one on the rows.
    bases: tuple[tuple[int, ...], ...] = ()
    # Per tensor argument: the address of its storage. A launch that reads a buffer an earlier launch on the
    # rows wrote is on the rows too, whatever shape the buffer was given (harness._launch_problems).
    storages: tuple[int, ...] = ()
    # Per tensor argument: the bytes of its whole storage, all of which the kernel can reach (a 1-element
    # view of a (rows, hidden) buffer still reaches rows x hidden elements): harness._statistics_pass.
    storage_bytes: tuple[int, ...] = ()
    # Per tensor argument: the name of the call's parameter whose storage it shares ("" if none): a weight
    # with as many rows as the activations is still a weight (harness._launches_on_the_rows).
    params: tuple[str, ...] = ()


@dataclass(frozen=True)
class Allocation:
    op: str  # the aten op that made it, e.g. "empty_like"
    shape: tuple[int, ...]
    dtype: torch.dtype
    site: str  # where the student's code called it ("" when no frame of theirs was found)
    storage: int = 0  # the address of its storage: which launches got it (Launch.storages)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass
class Watch:
    launches: list[str] = field(default_factory=list)  # names of the Triton kernels launched
    torch_ops: list[str] = field(default_factory=list)  # aten ops run outside kernel launches
    # Where each op that is not a HOST_OP was first called from the student's code, e.g.
    # "`out.copy_(x + y)` (add, line 4)"; empty when no such frame was found.
    op_sites: dict[str, str] = field(default_factory=dict)
    # Functions named *_ref (the PyTorch references) that were running when such an op ran.
    references: list[str] = field(default_factory=list)
    host_reads: list[str] = field(default_factory=list)  # Tensor.numpy / tolist / item ... outside launches
    # Fills that carry data: a value other than 0 written into one element of a larger tensor
    # (out.view(-1)[i].fill_(v)), what host code computed; a whole tensor set to a constant is not counted.
    host_fills: int = 0
    # Each outermost launch: which kernel, where it was defined, the shapes of its tensor arguments.
    launched: list[Launch] = field(default_factory=list)
    # Tensors the host code allocated (outside launches): what a fused exercise must not need.
    allocations: list[Allocation] = field(default_factory=list)
    made: dict[int, int] = field(default_factory=dict)  # {storage address: bytes} of those allocations
    # Storages of the one-element tensors torch lifts from Python numbers (`t[:] = 0` fills t from one): a
    # fill from them writes a constant, not a tensor's element
    constants: set = field(default_factory=set)
    dtypes: set = field(default_factory=set)  # dtypes of every tensor the host code's torch ops touched
    # Host functions an autotuned kernel runs around its launches ("pre_hook of `k`"): host code the
    # op recorder does not watch (it pauses inside launches).
    hooks: list[str] = field(default_factory=list)
    # The thread that watches: a batch grader judges several submissions at once, one per thread, and what
    # one thread's code does is none of another's watch.
    thread: int = field(default_factory=threading.get_ident)
    # Tensor subclasses (not the checker's, not nn.Parameter) that torch's ops met, and dispatch modes
    # already active beneath the recorder: their Python runs inside torch's ops, unseen
    subclasses: list[str] = field(default_factory=list)
    # Storages of the call's input tensors (watching(inputs=...)): Launch.inputs tells a kernel's
    # arguments apart by them.
    input_storages: set = field(default_factory=set)
    call_shapes: dict = field(default_factory=dict)  # storage of each of the call's tensors -> its shape
    call_names: dict = field(default_factory=dict)  # storage of each of the call's tensors -> its parameter
    # Where the code watched started a Python thread: torch's dispatch modes, which see the host's ops, are
    # the calling thread's own, so another thread's torch ops go unrecorded (a function exercise's
    # arithmetic, its forbidden ops; on a GPU, where no Tracker follows the bytes, a kernel exercise's too).
    threads: list[str] = field(default_factory=list)
    # In the interpreter: what a launched kernel's body calls that a GPU's compiler would refuse (torch,
    # NumPy, a plain Python helper), from kernel_source.problems.
    not_triton: list[str] = field(default_factory=list)
    # Torch ops this thread ran that never reached the recorder (OpLedger): computed with torch's dispatch
    # modes disabled or bypassed; and what kept the ledger from keeping its account, if anything.
    unseen_ops: list[str] = field(default_factory=list)
    ledger_problem: str = ""
    # Launches the checker stopped (Refused: an address out of bounds, the interpreter's functions replaced),
    # as (message, kind), whether or not the code caught the exception: a refusal's message says where the
    # bad address was, so a kernel that loads at an address made of the data, caught, reads the data out
    refused: list[tuple[str, str]] = field(default_factory=list)
    # Ways tensor data reached the host past every op and launch the checker sees, each said once: the
    # process's memory read as a file (MEMORY_FILE), an exception out of a kernel that the code caught
    # (_kernel_raised: an assert's message can be a whole block).
    side_doors: list[str] = field(default_factory=list)

    def compute_ops(self) -> list[str]:
        """The torch ops that did arithmetic or copies (not allocation, views, metadata)."""
        return sorted({op for op in self.torch_ops if op not in HOST_OPS})

    def describe_ops(self, ops: list[str], limit: int = 4) -> str:
        """ "torch.matmul / @ (aten.mm) at `c = a @ b` (matmul, line 3), ..." for messages."""
        parts = []
        for op in ops[:limit]:
            site = self.op_sites.get(op)
            parts.append(torch_name(op) + (f" at {site}" if site else ""))
        if len(ops) > limit:
            parts.append(f"and {len(ops) - limit} more")
        return ", ".join(parts)


_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_INSTALLED = (sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib"))
_LIBRARY_DIRS = tuple(
    {os.path.abspath(p) + os.sep for p in _INSTALLED}
    | {_TORCH, os.path.dirname(os.path.abspath(np.__file__)) + os.sep, _HERE}
)


@functools.lru_cache(maxsize=4096)
def _library_frame(filename: str) -> bool:
    """Frames of torch, numpy, Triton, installed packages, the standard library and this package."""
    if filename.startswith("<frozen"):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_LIBRARY_DIRS) or f"{os.sep}triton{os.sep}" in path


@functools.lru_cache(maxsize=4096)
def _ours_or_torch(filename: str) -> bool:
    return os.path.abspath(filename).startswith((_TORCH, _HERE))


def student_site(depth: int = 2) -> str:
    """`line` (function, line N) of the innermost frame of the student's code above the caller, or ""."""
    frame = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        if not _library_frame(code.co_filename):
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            where = f"({code.co_name}, line {frame.f_lineno})"
            return f"`{line}` {where}" if line else where
        frame = frame.f_back
    return ""


def _caller(watch: Watch, op: str) -> None:
    """Record where the student's code called `op`, and any *_ref function on the way."""
    frame = sys._getframe(2)
    site = None
    while frame is not None:
        code = frame.f_code
        if site is None and op not in watch.op_sites and not _library_frame(code.co_filename):
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            where = f"({code.co_name}, line {frame.f_lineno})"
            site = f"`{line}` {where}" if line else where
        if (code.co_name.endswith("_ref") and code.co_name not in watch.references
                and not _ours_or_torch(code.co_filename)):
            watch.references.append(code.co_name)
        frame = frame.f_back
    if site is not None:
        watch.op_sites[op] = site


class _RecordOps(TorchDispatchMode):
    def __init__(self, watch: Watch):
        super().__init__()
        self.watch = watch
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _ledgers_on[0]:
            OpLedger.mark()
        for cls in types:
            seen = f"the subclass {cls.__name__}"
            if kernel_source._python_tensor(cls) and seen not in self.watch.subclasses:
                self.watch.subclasses.append(seen)
        tracker = _trackers[-1] if _trackers else None
        touched = ()
        name = _op_name(func)
        if tracker is not None:
            # Writes the shadows follow: watched host ops that write in place (the host rules judge
            # them), and fills anywhere (Triton's reset_to_zero runs inside the launch): what they
            # overwrite must be what the shadow says, then the shadow takes what they wrote.
            if name in _FILLS or (not self.paused and (name.endswith("_") or "out" in (kwargs or {}))):
                touched = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                for t in touched:
                    tracker.verify(t, f"found when host code ran aten.{name} on it")
        result = func(*args, **(kwargs or {}))
        for t in touched:
            tracker.resync(t)
        if not self.paused:
            if name == _SCALAR_READ:
                self.watch.host_reads.append("item")
            if name == "lift_fresh" and isinstance(result, torch.Tensor) and result.numel() == 1:
                self.watch.constants.add(_storage_ptr(result))
            values = [a for a in args[1:] if isinstance(a, torch.Tensor)]
            if name in _FILLS and any(_storage_ptr(v) not in self.watch.constants for v in values):
                name = "fill_.Tensor"  # filled with a tensor's element: a copy of data, not a constant
            elif name == "fill_" and _fills_part_with_data((args[0], *(v.item() for v in values), *args[2:])
                                                           if values else args):
                self.watch.host_fills += 1
            self.watch.torch_ops.append(name)
            if name not in HOST_OPS:
                _caller(self.watch, name)
            self._note_tensors(name, (args, kwargs), result)
        return result

    def _note_tensors(self, name: str, inputs, result) -> None:
        """Record the dtypes an op touched, and the tensors it allocated (storage none of its inputs own)."""
        ins = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
        for t in ins + outs:
            self.watch.dtypes.add(t.dtype)
        owned = {_storage_ptr(t) for t in ins}
        for t in outs:
            if t.numel() and _storage_ptr(t) not in owned:
                site = student_site(3)
                self.watch.allocations.append(Allocation(name, tuple(t.shape), t.dtype, site, _storage_ptr(t)))
                self.watch.made[_storage_ptr(t)] = t.untyped_storage().nbytes()
                if _trackers:
                    if name.startswith(("empty", "new_empty")):
                        _poison_storage(t)
                    _trackers[-1].add(t, f"the tensor made by aten.{name}" + (f" at {site}" if site else ""))


class OpLedger:
    """Every torch op the watched thread runs, as torch's own profiler records it, against those the
    recorder saw.

    The recorder is a TorchDispatchMode: torch calls it for each op, unless the code turns dispatch
    modes off (`_disable_current_modes()`, `torch._C._DisableTorchDispatch()`, a guard that excludes
    the Python dispatch key, ... torch has a dozen such switches), and then an op computes unseen. The
    profiler's RecordFunction hooks sit at the dispatcher's entry, before any dispatch key: no switch of
    that kind hides an op from them. So the ledger runs torch's CPU profiler (the legacy one: no Kineto,
    no device activity, about a microsecond an op, this thread only) while the candidate runs, and the
    recorder marks every op it is handed with a profiler range of a name secret to this process. An op
    whose record holds no mark, at the outermost level (the ops it runs inside are its own business), is
    an op the recorder never saw. The marks are counted as they are made: a profile that holds fewer
    (RecordFunction switched off: `torch.autograd._enable_record_function(False)`) or more (ranges of the
    same name opened by the submission) is tampered with.
    """

    MARK = f"course_utils.seen.{secrets.token_hex(8)}"  # a range the submission cannot open by its name
    TORCHS_OWN = f"course_utils.torch.{secrets.token_hex(8)}"  # around _torchs_own_work

    SWITCHED_OFF = ("your code switched off torch's RecordFunction while the checker watched it "
                    "(torch.autograd._enable_record_function): the checker's account of your torch ops goes "
                    "through it; leave it on")

    def __init__(self):
        self.on = False
        self.problem = ""
        self.hidden_reads = 0  # values torch's own work read out of tensors into Python (a list of 0-d ones)
        self.thread = threading.get_ident()
        self.elsewhere: dict[str, int] = {}  # _marks_elsewhere when the ledger started

    @staticmethod
    def mark() -> None:
        with _counted_range(OpLedger.MARK):
            pass

    def start(self) -> None:
        from torch._C import _profiler as P

        config = P.ProfilerConfig(P.ProfilerState.CPU, False, False, False, False, False, P._ExperimentalConfig())
        try:
            torch.autograd._enable_profiler_legacy(config)
        except RuntimeError:  # a profiler is on already: the notebook's own, around the check
            self.problem = ("a torch profiler was running around the check (`torch.profiler.profile()`?): "
                            "the checker needs torch's profiler itself to watch your function; run the check "
                            "outside the profiler")
            return
        self.on = True
        _marks_made[self.thread] = {}
        self.elsewhere = dict(_marks_elsewhere)
        _ledgers_on[0] += 1
        # RecordFunction can be switched off for the thread (then the profiler records nothing): the switch,
        # wherever the submission reaches it from, tells the ledger first
        self.switch = torch._C._autograd._enable_record_function

        def switched(enabled: bool) -> None:
            if not enabled:
                self.problem = self.SWITCHED_OFF
            self.switch(enabled)

        torch._C._autograd._enable_record_function = torch.autograd._enable_record_function = switched

    def stop(self) -> list[str]:
        """The outermost ops the recorder never saw ("aten::add"), in the order they ran."""
        if not self.on:
            return []
        self.on = False
        _ledgers_on[0] -= 1
        torch._C._autograd._enable_record_function = torch.autograd._enable_record_function = self.switch
        self.switch(True)
        made = _marks_made.pop(self.thread, {})
        try:
            threads = torch.autograd._disable_profiler_legacy()
        except RuntimeError:
            self.problem = ("your code stopped torch's profiler while the checker watched it (the checker's "
                            "account of your torch ops): leave torch's profiler alone inside the function")
            return []
        unseen: list[str] = []
        found: dict[str, int] = {}
        for events in threads:
            root = _Range("")
            stack = [root]
            for event in events:
                if event.kind() == "push":
                    name = event.name()
                    if name in (self.MARK, self.TORCHS_OWN):
                        found[name] = found.get(name, 0) + 1
                    stack.append(_Range(name))
                    stack[-2].inside.append(stack[-1])
                elif event.kind() == "pop" and len(stack) > 1:
                    stack.pop()
            self._look(root, unseen)
        for name in (self.MARK, self.TORCHS_OWN):
            elsewhere = _marks_elsewhere.get(name, 0) - self.elsewhere.get(name, 0)
            if found.get(name, 0) < made.get(name, 0):
                self.problem = self.SWITCHED_OFF
            elif found.get(name, 0) > made.get(name, 0) + elsewhere:
                self.problem = ("your code opened profiler ranges under the checker's own names: leave the "
                                "checker's internals alone")
        return unseen

    def _look(self, node: _Range, unseen: list[str]) -> None:
        """The ops under `node` that reach a kernel (not a composite that only calls others, like aten::to
        or aten::matmul: those the recorder never sees, it sees what they call) and hold no mark."""
        if any(child.name == self.MARK for child in node.inside):
            return  # the recorder was handed this op (a composite, under torch.inference_mode)
        for child in node.inside:
            if child.name == self.TORCHS_OWN:
                self._torchs_own(child, unseen)
            elif child.name.startswith("aten::") and not _composite(child.name):
                if not child.marked(self.MARK) and child.name[6:] not in _NO_DATA and child.name not in unseen:
                    unseen.append(child.name)
            else:
                self._look(child, unseen)

    def _torchs_own(self, node: _Range, unseen: list[str]) -> None:
        """Inside torch.tensor, Tensor.numpy and the like (_torchs_own_work): the ops they run themselves,
        and each value read out of a 0-d tensor of the data (a host read); anything else ran inside them (a
        __float__ or __getitem__ of the data's own) and is looked at like the rest."""
        for child in node.inside:
            op = child.name[6:] if child.name.startswith("aten::") else ""
            if op in ("item", "_local_scalar_dense") and not child.marked(self.MARK):
                self.hidden_reads += 1
            elif op in _TORCHS_OWN_OPS or child.marked(self.MARK):
                continue
            else:
                self._look(_Range("", [child]), unseen)


# {an autograd node a watched call returned: {storage address: bytes} of what its torch ops allocated}: what
# the forward made that is still alive once it returned, held by anything (remote.kept_alive). Not a dict:
# the sandbox's integrity check compares the contents of this module's dicts before and after each call.
_MADE_BY_CALL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_made(node, made: dict[int, int]) -> None:
    """Remember what the call that returned autograd node `node` allocated (Watch.made)."""
    with contextlib.suppress(TypeError):  # a node of torch's own C++ class takes no weak reference
        _MADE_BY_CALL[node] = dict(made)


def made_by_call(node) -> dict[int, int]:
    try:
        return dict(_MADE_BY_CALL.get(node) or {})
    except TypeError:
        return {}


_ledgers_on = [0]  # > 0 while a ledger keeps its account (the recorder marks each op it sees)
# Marks made, by name: per thread with a ledger, and on threads without one. Autograd runs a CUDA tensor's
# backward on a device thread of its own, where torch carries the profiler along: its marks land in the
# profile of the thread that called backward, and count for that thread's ledger when it is the only one
# on. With several on, nobody knows whose they are: they count for any (_marks_elsewhere). (Counted there
# with one ledger on, they changed the grading code's state in the sandbox's eyes, and its integrity check
# failed 08.rmsnorm_train's honest solution on a GPU.)
_marks_made: dict[int, dict[str, int]] = {}
_marks_elsewhere: dict[str, int] = {}


@contextlib.contextmanager
def _counted_range(name: str):
    """A profiler range of the ledger's (OpLedger.MARK, OpLedger.TORCHS_OWN), counted as it opens."""
    made = _marks_made.get(threading.get_ident())
    if made is None:
        ledgers = list(_marks_made.values())
        made = ledgers[0] if len(ledgers) == 1 else _marks_elsewhere
    made[name] = made.get(name, 0) + 1
    with _RecordFunctionFast(name):
        yield


# What torch.tensor, Tensor.numpy, deepcopy and the like run themselves, with the Python key excluded.
_TORCHS_OWN_OPS = frozenset({"empty", "empty_strided", "to", "_to_copy", "copy_", "lift_fresh", "lift_fresh_copy",
                             "set_", "alias", "detach", "detach_", "resolve_conj", "resolve_neg", "view",
                             "as_strided", "clone", "_reshape_alias"})
# The same tensor under another name, which torch makes itself with the Python dispatch key excluded
# (Tensor.as_subclass runs aten::alias): unseen, it hides nothing. (Other views and allocations do: a
# transposed view, or an allocation's strides, is lesson 01's answer.)
_NO_DATA = frozenset({"alias", "detach", "detach_", "lift_fresh", "resolve_conj", "resolve_neg"})


@dataclass
class _Range:
    name: str
    inside: list = field(default_factory=list)

    def marked(self, mark: str) -> bool:
        return self.name == mark or any(child.marked(mark) for child in self.inside)


@functools.lru_cache(maxsize=1024)
def _composite(name: str) -> bool:
    """Is every overload of this op (e.g. "aten::to") a CompositeImplicitAutograd one: a function of other
    ops, which dispatch modes never see themselves (they see the ops it calls, if any: `x.to(x.dtype)` calls
    none)?"""
    namespace, op = name.split("::", 1)
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        overloads = packet.overloads()
    except (AttributeError, RuntimeError):
        return False
    found = []
    for overload in overloads:
        try:
            found.append(torch._C._dispatch_has_kernel_for_dispatch_key(
                name + ("" if overload == "default" else f".{overload}"), "CompositeImplicitAutograd"))
        except RuntimeError:  # a TorchScript-only overload (aten::to.prim_Device): not the dispatcher's
            pass
    return bool(found) and all(found)


def _poison_storage(t: torch.Tensor) -> None:
    """Every byte of a fresh empty tensor set to 0xFF (NaN in every float type, -1 in the integers): what
    the allocator left there (bytes the notebook wrote into memory it then freed) is not taken for data."""
    raw = torch.empty(0, dtype=torch.uint8, device=t.device)
    raw.set_(t.untyped_storage())
    raw.fill_(0xFF)


class _RecordHostCalls(TorchFunctionMode):
    """Tensor methods seen before dispatch: data handed to NumPy/Python, and printing (not counted)."""

    def __init__(self, watch: Watch, recorder: _RecordOps):
        super().__init__()
        self.watch = watch
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _FORMATTING and args and isinstance(args[0], torch.Tensor):
            return _hidden(args[0])  # print(x) while debugging: no values, no torch ops
        if name in HOST_READS and not self.recorder.paused:
            self.watch.host_reads.append(name)
            if args and isinstance(args[0], torch.Tensor):  # a tensor no aten op made (torch.frombuffer's)
                self.watch.dtypes.add(args[0].dtype)  # still shows its dtype when its values go to Python
        if _ledgers_on[0] and _torchs_own_work(name, args):
            with _counted_range(OpLedger.TORCHS_OWN):
                return func(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


# Torch functions whose C++ runs ops of its own with the Python dispatch key excluded (no dispatch mode sees
# them): building a tensor from Python data, handing a tensor's values to NumPy or Python, copying it whole,
# viewing it as another class. What they run inside is theirs (guard.OpLedger), unless a tensor is the data
# being built from: a copy or a conversion of a tensor's values is work of the submission's.
_READ_OUT = frozenset({"numpy", "tolist", "__array__", "__deepcopy__", "__reduce_ex__", "__dlpack__",
                       "as_subclass"})
_BUILD = frozenset({"tensor", "as_tensor", "asarray", "new_tensor"})


def _torchs_own_work(name: str, args: tuple) -> bool:
    if name in _READ_OUT:
        return True
    data = args[1] if name == "new_tensor" and len(args) > 1 else (args[0] if args else None)
    return name in _BUILD and not isinstance(data, torch.Tensor)


def _hidden(t: torch.Tensor) -> str:
    """What a watched tensor prints as: its metadata, not its values."""
    return (f"tensor(<values hidden while the checker watches: shape {tuple(t.shape)}, {t.dtype}, "
            f"{t.device.type}>)")


def _hidden_block(block) -> str:
    """What a block of a kernel prints as while the checker watches (the interpreter's shows its data)."""
    return f"<a {getattr(block, 'type', 'block')} block: values hidden while the checker watches>"


def _fills_part_with_data(args) -> bool:
    """Is aten.fill_(t, value) a non-zero value written into part of a storage (x[i].fill_(v), how host code
    writes computed values one by one; a stride-0 view of one element, or x[i:] filled for i = 0, 1, ...,
    does the same)? Whole tensors set to a constant are not counted."""
    if len(args) < 2 or not isinstance(args[0], torch.Tensor) or isinstance(args[1], torch.Tensor):
        return False
    t, value = args[0], args[1]
    try:
        whole = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except (RuntimeError, NotImplementedError):
        return False
    distinct = 1  # elements the view reaches: a stride-0 dimension repeats the same ones
    for size, stride in zip(t.shape, t.stride()):
        distinct *= size if stride else min(size, 1)
    return value != 0 and distinct < whole


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, some subclasses)
        return id(t)


# --- where every byte a kernel reads came from (interpreter) ------------------------------------

class Tracker:
    """Which bytes of the call's memory were put there by a kernel, or by host code the checker saw.

    In interpreter mode the kernel's loads and stores are Python calls, so the checker can keep a
    *shadow* of every buffer the call may use: the call's tensor arguments, and the tensors its host
    code allocated while watched. A shadow changes only when a kernel stores (tl.store, atomics) or
    when a watched host op writes (an allocation, a fill; arithmetic is refused elsewhere). Then:

    - every byte a kernel loads must equal its shadow: whatever wrote it behind the checker's back
      (a thread, NumPy or ctypes over `data_ptr()`, torch inside the @triton.jit body or in an
      autotune hook, torch with the checker's dispatch modes popped) is caught where it is read;
    - every tensor a kernel is launched with is one of those buffers, or torch made it before the call (a
      table built once, a scratch buffer kept between calls: followed from its launch on); memory torch did
      not allocate (NumPy's) cannot feed a kernel. Torch ops run where the recorder could not see them
      (the modes popped) are the OpLedger's, and threads the thread watch's;
    - after the call each buffer must equal its shadow: an output written by host code after (or
      between, or during) the launches is caught even when no kernel reads it back.

    So host code can only hand a kernel what the inputs held, or data computed by watched torch ops,
    which the host rules refuse in a kernel exercise. What this cannot see: values the host reads by
    such a side door and passes to a kernel as scalar arguments (flagged by the grader's code scan).

    It also sees races between the programs of one launch. The interpreter runs them one after another,
    so a program that loads what an earlier program of the same launch stored (a sum carried from
    program to program with a plain load, add and store) gets the right answer here; a GPU runs them at
    the same time, and the load sees the store or not, by chance. Such a load is refused, unless both
    programs synchronized through atomics, the reader before its load and the writer after its stores (a
    ticket: the last program to finish merges what the others stored, which a GPU orders by the atomics'
    acquire/release semantics); an atomic update of another program's plain stores is refused too.
    The reader's atomic synchronizes only if the program decided something by the value it returned (an
    if or a while on it, or a load's mask or address made from it: the ticket's count, a lock's
    compare-and-swap): an atomic whose value goes unused orders nothing on a GPU (a fake lock). And only
    with the writer's atomic on the same address: the counter the writers incremented, the lock of the
    row both update; a lock per program excludes nobody.
    """

    def __init__(self):
        self.buffers: dict[int, tuple[int, int, np.ndarray, np.ndarray, str, object]] = {}
        self.problems: dict[str, str] = {}  # buffer name -> what was found (the first time only)
        self.written: dict[int, np.ndarray] = {}  # buffer start -> which of its bytes a kernel stored to
        # The launch in progress: its kernel, the program running (its index in programs: (x, y, z) ids),
        # which program stored each byte (buffer start -> program index per byte, -1 none, -2 an atomic).
        self.kernel, self.programs = "", []
        self.stored_by: dict[int, np.ndarray] = {}
        # per program of the launch: when (a count of its memory operations) it last stored and last did an
        # atomic; a program whose atomic came after its stores has released them (the ticket pattern)
        self.step, self.last_store, self.last_atomic = 0, {}, {}
        # per program: when it last decided something by the value an atomic returned (AtomicResult)
        self.last_acquire: dict[int, int] = {}
        # per program: the addresses of its atomics, each with its step (what a lock or ticket is on)
        self.atomics: dict[int, list[tuple[int, np.ndarray]]] = {}

    def new_launch(self, kernel: str) -> None:
        self.kernel, self.programs = kernel, []
        self.stored_by.clear()
        self.last_store.clear()
        self.last_atomic.clear()
        self.last_acquire.clear()
        self.atomics.clear()

    def _synchronized(self, reader: int, writer: int) -> bool:
        """Did the writer release its stores to the reader? The writer did an atomic after its last store,
        the reader decided something by an atomic's value, and the two atomics share an address."""
        if reader not in self.last_acquire or self.last_atomic.get(writer, -1) <= self.last_store.get(writer, -1):
            return False
        after = self.last_store.get(writer, -1)
        released = [a for step, a in self.atomics.get(writer, ()) if step > after]
        acquired = [a for step, a in self.atomics.get(reader, ()) if step <= self.last_acquire[reader]]
        return bool(released and acquired
                    and np.intersect1d(np.concatenate(released), np.concatenate(acquired)).size)

    def acquired(self) -> None:
        """The running program decided something by the value an atomic returned to it."""
        self.last_acquire[len(self.programs) - 1] = self.step

    def new_program(self, pid: tuple) -> None:
        self.programs.append(pid)

    def _race(self, name: str, reader: int, writer: int, what: str = "loaded") -> None:
        both = (reader in self.last_acquire and what != "atomically updated"
                and self.last_atomic.get(writer, -1) > self.last_store.get(writer, -1))
        self.problems.setdefault(f"race:{name}", (
            f"program {self.programs[reader]} of `{self.kernel}` {what} bytes of `{name}` that program "
            f"{self.programs[writer]} of the same launch had stored with a plain tl.store: the interpreter runs "
            "programs one after another, a GPU runs them at the same time in no set order, so the store lands "
            "before or after, by chance. "
            + ("Both programs used atomics, but on different addresses: a lock or a ticket orders the stores "
               "of the programs that use the same one (the lock of the row they both update, not a lock per "
               "program)" if both else
               "Combine the programs' partial results with tl.atomic_add, or in a second kernel launched "
               "after this one")))

    def add(self, t: torch.Tensor, name: str) -> None:
        import ctypes

        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        start, n = storage.data_ptr(), storage.nbytes()
        if not n or start in self.buffers or t.device.type != "cpu":
            return
        real = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(start))
        self.buffers[start] = (start, start + n, real, real.copy(), name, storage)
        self.written[start] = np.zeros(n, dtype=bool)

    def stored(self, t: torch.Tensor) -> torch.Tensor | None:
        """Per element of `t` (a view into a tracked buffer): did a kernel store to any of its bytes? None
        when `t`'s buffer is not tracked."""
        start = _storage_ptr(t)
        written = self.written.get(start)
        if written is None:
            return None
        size = t.element_size()
        per_element = torch.from_numpy(written[:written.size // size * size].reshape(-1, size).any(axis=1))
        return per_element.as_strided(t.shape, t.stride(), t.storage_offset())

    def tracks(self, t: torch.Tensor) -> bool:
        try:
            return t.untyped_storage().data_ptr() in self.buffers
        except (RuntimeError, NotImplementedError):
            return False

    def _found(self, name: str, when: str) -> None:
        self.problems.setdefault(name, (
            f"`{name}` holds bytes that no kernel stored ({when}): host code wrote them (a thread, an autotune "
            "hook, torch or NumPy inside the @triton.jit body, writes through data_ptr()); the result must "
            "come from your kernel's loads and stores"))

    def launched_with(self, t: torch.Tensor, kernel: str, name: str) -> None:
        """A kernel was launched with `t`, a tensor none of the buffers holds. Torch made it before the call
        (a lookup table built once, a scratch buffer kept between calls): followed from here on, its bytes as
        they are now. Memory torch did not allocate (NumPy's, through from_numpy, DLPack or a buffer), or
        memory torch shares with other processes (share_memory_: a file of /dev/shm, which host code reads and
        writes as a file), holds whatever host code put there: refused."""
        try:
            storage = t.untyped_storage()
            by_torch = storage.resizable()  # False over memory torch was lent
            shared = storage.is_shared() and t.device.type == "cpu"  # (a CUDA storage says it is shared)
        except (RuntimeError, NotImplementedError):
            by_torch, shared = False, False
        if by_torch and not shared:
            self.add(t, f"`{name}` (a tensor made before the call)")
            return
        what = ("memory shared with other processes (share_memory_: a file host code can read and write)" if shared
                else "memory torch did not allocate (from NumPy, DLPack or a buffer)")
        self.problems.setdefault(name, (
            f"`{kernel}` was launched with `{name}`, a tensor over {what}: the checker cannot follow what host "
            "code writes there; a kernel reads the inputs, the outputs and tensors torch allocates (a table from "
            "NumPy: torch.tensor(array))"))

    def verify(self, t: torch.Tensor, when: str) -> None:
        entry = self.buffers.get(_storage_ptr(t))
        if entry is not None and not np.array_equal(entry[2], entry[3]):
            self._found(entry[4], when)

    def resync(self, t: torch.Tensor) -> None:
        entry = self.buffers.get(_storage_ptr(t))
        if entry is not None:
            entry[3][:] = entry[2]

    def verify_all(self, when: str) -> None:
        for _, _, real, shadow, name, _ in self.buffers.values():
            if not np.array_equal(real, shadow):
                self._found(name, when)

    def _bytes(self, addrs: np.ndarray, itemsize: int):
        """(buffer entry, byte offsets in it) of each tracked buffer the addresses reach."""
        for entry in self.buffers.values():
            start, end = entry[0], entry[1]
            inside = addrs[(addrs >= start) & (addrs < end)]
            if inside.size:
                offs = ((inside - start).astype(np.int64)[:, None] + np.arange(itemsize)).ravel()
                yield entry, offs[offs < end - start]

    def before_read(self, addrs: np.ndarray, itemsize: int, what: str) -> None:
        reader = len(self.programs) - 1
        for (start, _, real, shadow, name, _), offs in self._bytes(addrs, itemsize):
            if not np.array_equal(real[offs], shadow[offs]):
                self._found(name, f"read back by a {what} in your kernel")
            stored_by = self.stored_by.get(start)
            if stored_by is None:
                continue
            # a plain load may read another program's stores once both sides synchronized through atomics
            # (its own atomic before, the writer's after its stores); an atomic may not add to them at all
            for writer in np.unique(stored_by[offs]):
                if writer < 0 or writer == reader:
                    continue
                if what != "tl.load":
                    self._race(name, reader, int(writer), "atomically updated")
                elif not self._synchronized(reader, int(writer)):
                    self._race(name, reader, int(writer))
                break

    def after_write(self, addrs: np.ndarray, itemsize: int, atomic: bool = False) -> None:
        program = len(self.programs) - 1
        self.step += 1
        if atomic:
            self.last_atomic[program] = self.step
            self.atomics.setdefault(program, []).append((self.step, np.unique(addrs)))
        else:
            self.last_store[program] = self.step
        for (start, end, real, shadow, name, _), offs in self._bytes(addrs, itemsize):
            stored_by = self.stored_by.get(start)
            if not atomic and stored_by is not None:
                # a plain store of other values over another program's plain store: the last writer wins here,
                # either one on a GPU (the same values stored twice are harmless; so is a store behind a lock,
                # the other program's atomic after its stores and this one's before: the read rule's ticket)
                changed = real[offs] != shadow[offs]
                for writer in np.unique(stored_by[offs][changed]):
                    if writer >= 0 and writer != program and not self._synchronized(program, int(writer)):
                        self._race(name, program, int(writer), "stored other values over")
                        break
            shadow[offs] = real[offs]
            self.written[start][offs] = True
            if start not in self.stored_by:
                self.stored_by[start] = np.full(end - start, -1, dtype=np.int32)
            self.stored_by[start][offs] = -2 if atomic else program


class AtomicResult(np.ndarray):
    """The value an atomic returned, in the interpreter: what a program computes from it is one too (NumPy
    keeps the subclass through its ufuncs, and __array_function__ through its functions). Turning it into
    a Python bool or int (an if or a while on it, in the kernel) tells the tracker the program acquired."""

    def __array_function__(self, func, types, args, kwargs):
        result = super().__array_function__(func, types, args, kwargs)
        return result.view(AtomicResult) if isinstance(result, np.ndarray) else result

    def _decided(self):
        if _trackers:
            _trackers[-1].acquired()
        return self.view(np.ndarray)

    def __bool__(self):
        return bool(self._decided())

    def __int__(self):
        return int(self._decided())

    def __index__(self):
        return self._decided().__index__()

    def item(self, *args):
        return self._decided().item(*args)


def _decides(*handles) -> None:
    """A load or store whose mask or addresses come from an atomic's value: the program acquired."""
    if _trackers and any(isinstance(getattr(h, "data", None), AtomicResult) for h in handles):
        _trackers[-1].acquired()


_trackers: list[Tracker] = []  # the active tracker (at most one: the call being checked)
_watches: list[Watch] = []  # the active watches, innermost last
_launching: list[list] = []  # [kernel, judged] of each launch in progress, innermost last
_FILLS = frozenset({"fill_", "zero_"})  # writes that carry no data from anywhere


def _mine(watch: Watch) -> bool:
    """Is the code running now the watched code's? Its own thread, or a thread Python did not start:
    autograd runs a CUDA tensor's backward on a device thread of its own."""
    return (threading.get_ident() == watch.thread
            or isinstance(threading.current_thread(), threading._DummyThread))


# --- the process's memory as a file ---------------------------------------------------------------
# /proc/self/mem is the whole memory of the process as a file: read at x.data_ptr() it hands over x's values,
# written at a tensor's address it changes the tensor, and neither is a torch op, a host read or a kernel's
# load or store. Host code that reads x and y there, adds in Python and writes the sums into a tensor made
# before the call (which a kernel may be launched with) passed 02.vector_add, in a sandbox too, and with a
# path put together from pieces the scan saw no "/proc/". A watch fails a call that opens such a file
# (an audit hook sees every open, however the path is spelled) or starts with one open.
MEMORY_FILE = ("read or wrote memory through /proc/self/mem (the process's memory as a file): what passes that "
               "way is no torch op and no kernel's load or store, so nothing of it can be judged; let your "
               "kernel read the tensors and store its results")
_MEMORY_PATH = re.compile(r"/proc/(?:self|thread-self|\d+)(?:/task/\d+)?/mem")


# A path the checker cannot read: an object of the notebook's own with an __fspath__. FileIO and os.open convert it
# once for the system call and hand the audit hook the object itself, whose second answer may name another file
# (the memory file opened, "/tmp/nothing" said): 02.vector_add passed that way, unflagged.
OPAQUE_PATH = ("opened a file through a path object of your own (its __fspath__ can name one file to the open and "
               "another to the checker, which watches for the process's memory read as a file): open files by "
               "their names, or better, let your kernel read the tensors and store its results")


def _opened_path(path) -> str | None:
    """The path an open was given, as the exact str the system call opens; None for a file descriptor; raises
    ValueError for a path object of the notebook's own. A str or bytes subclass is copied into the plain type
    first (its own startswith, rfind or split would answer for it, in the checks below and in posixpath), and
    only pathlib's own classes are asked for their __fspath__."""
    if isinstance(path, int):
        return None
    if type(path) in (pathlib.PurePosixPath, pathlib.PosixPath, pathlib.PureWindowsPath, pathlib.WindowsPath):
        path = os.fspath(path)
    if isinstance(path, str):
        return str.__getitem__(path, slice(None))  # a plain str, whatever the class
    if isinstance(path, bytes):
        return os.fsdecode(bytes.__getitem__(path, slice(None)))
    raise ValueError("a path object of the notebook's own")


def _resolved(path: str, readlink: Callable, getcwd: Callable) -> str:
    """`path` made absolute with its symbolic links followed (/proc/self -> /proc/1234), by the C functions given
    (bound when the audit hook was installed) and plain str methods: os.path.realpath looks up os.path's join,
    split and islink at each call, which a notebook may replace (os.path is no flag)."""
    todo = path.split("/")[::-1] if path.startswith("/") else [*getcwd().split("/"), *path.split("/")][::-1]
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            done = done[:-1]
            continue
        here = "/" + "/".join([*done, part])
        try:
            target = readlink(here)
        except (OSError, ValueError):  # not a link (or not there, or a name with a NUL: no file)
            done.append(part)
            continue
        hops += 1
        if hops > 40:  # a loop of links: no file to open
            return here
        if target.startswith("/"):
            done = []
        todo += target.split("/")[::-1]
    return "/" + "/".join(done)


def _is_memory_file(path, readlink: Callable = os.readlink, getcwd: Callable = os.getcwd) -> bool:
    """Is `path` (as given to open: relative, through symbolic links, /proc/self/root/...) a process's memory?
    A relative "mem" counts whatever the folder (os.open(..., dir_fd=) of /proc/self). ValueError: a path object
    of the notebook's own (_opened_path)."""
    path = _opened_path(path)
    if path is None:  # a file descriptor: raw, flagged by the grader's scan
        return False
    if not path.startswith("/") and path.rsplit("/", 1)[-1] == "mem":
        return True
    return bool(_MEMORY_PATH.fullmatch(_resolved(path, readlink, getcwd)))


def _count_memory_opens() -> Callable[[], tuple[int, int]]:
    """Install (once, at import: before a sandboxed notebook's first cell) an audit hook that counts the opens
    of a process's memory file, and of a path object of the notebook's own; returns the counts' reader. An
    audit hook cannot be removed, the counts live in this closure only, and the functions it calls are bound
    now (os.readlink, os.getcwd: C functions)."""
    opened = [0, 0]  # memory files, paths of the notebook's own
    is_memory, readlink, getcwd = _is_memory_file, os.readlink, os.getcwd

    def audit(event, args):
        if event == "open" and args:
            try:
                if is_memory(args[0], readlink, getcwd):
                    opened[0] += 1
            except ValueError:
                opened[1] += 1
            except Exception:  # never fail an open for the checker's sake
                pass

    sys.addaudithook(audit)
    return lambda: (opened[0], opened[1])


_memory_opens = _count_memory_opens()


def _memory_file_open() -> bool:
    """Does the process hold a memory file open now (opened before the audit hook, or before the call)?"""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:  # no /proc here (macOS, Windows): nor a /proc/self/mem
        return False
    for fd in fds:
        try:
            if _MEMORY_PATH.fullmatch(os.readlink(f"/proc/self/fd/{fd}")):
                return True
        except OSError:
            continue
    return False


def _kernel_raised(kernel, exc: BaseException) -> None:
    """An exception came out of an interpreted launch: recorded in each watch of the code running now, as
    refusals are (_refusal). Python's `assert False, block` in a kernel body raises an AssertionError that
    holds the loaded block, NumPy data and all: host code that catches it has read the tensor with no op the
    recorder sees (02.vector_add passed with the sums computed in Python). Honest code lets it fail the
    check; a call that returns after one is judged a side door. (A refusal is its own record.)"""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    if isinstance(root, Refused):
        return
    text = (f"caught the {type(root).__name__} that your kernel `{_kernel_name(kernel)}` raised and went on: "
            "what a kernel raises carries what it held out to the host code (an assert's message can be a "
            "whole block of data); let a kernel that fails fail the call")
    for watch in _watches:
        if _mine(watch) and text not in watch.side_doors:
            watch.side_doors.append(text)


def record_launches(names: list[str], launched: list[tuple[str, str]] = (), ops: list[str] = (),
                    threads: list[str] = (), reads: list[str] = (), fills: int = 0,
                    thread: int | None = None, subclasses: list[str] = (), unseen: list[str] = (),
                    ledger: str = "", refused: list[tuple[str, str]] = (), side_doors: list[str] = ()) -> None:
    """Kernels launched elsewhere on this code's behalf (a sandbox running a student's backward for
    the batch grader's stand-in node): every active watch counts them as its own launches, each
    (name, module) as a launch with no shapes, and the torch ops, threads, host reads and part-by-part
    fills that code made as its own, the ops its ledger found unseen, the launches refused there and its side
    doors (unseen, ledger, refused, side_doors: Watch.unseen_ops, Watch.ledger_problem, Watch.refused,
    Watch.side_doors). thread: the thread whose watches they are (default: this one)."""
    for watch in _watches:
        if watch.thread != (threading.get_ident() if thread is None else thread):
            continue
        watch.threads += list(threads)
        watch.host_reads += [r for r in dict.fromkeys(reads) if r not in watch.host_reads]
        watch.host_fills += fills
        watch.subclasses += [c for c in subclasses if c not in watch.subclasses]
        watch.unseen_ops += [op for op in unseen if op not in watch.unseen_ops]
        watch.ledger_problem = watch.ledger_problem or ledger
        watch.refused += [r for r in refused if r not in watch.refused][:3]
        watch.side_doors += [d for d in side_doors if d not in watch.side_doors][:3]
        watch.launches += names
        watch.launched += [Launch(name, module, ()) for name, module in launched]
        watch.torch_ops += [op for op in dict.fromkeys(ops) if op not in watch.torch_ops]


def _addresses(ptrs, mask) -> np.ndarray:
    addrs = np.asarray(ptrs, dtype=np.uint64)
    if mask is not None:
        addrs = addrs[np.broadcast_to(np.asarray(mask, dtype=bool), addrs.shape)]
    return addrs.ravel()


# --- interpreter address checks ---------------------------------------------------------------

_active_ranges: list[list[tuple[int, int, str]]] = []  # a stack: one list of ranges per running launch


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _refusal(exc: Refused) -> Refused:
    """`exc`, recorded as it is raised in each watch of the code running now (Watch.refused): whatever that
    code does with the exception, and however it ran the kernel (kernel[grid], Triton's GridExecutor made by
    hand, which no launch wrapper sees)."""
    for watch in _watches:
        if _mine(watch) and len(watch.refused) < 3 and (str(exc), exc.kind) not in watch.refused:
            watch.refused.append((str(exc), exc.kind))
    return exc


def _check_addresses(ptrs: np.ndarray, mask: np.ndarray, itemsize: int, what: str) -> None:
    if not _active_ranges:
        # No launch in progress: a @triton.jit function called as a Python function from host code. In the
        # interpreter its tl.load hands the data to Python (block.handle.data) and its tl.store writes what
        # Python computed, with no launch, no address check and no host read the recorder sees.
        if any(_mine(watch) for watch in _watches) and _addresses(ptrs, mask).size:
            raise _refusal(Refused(
                f"{what} outside any kernel launch: a @triton.jit function called from host code as a "
                "Python function reads and writes memory for the host; launch it as kernel[grid](...), "
                "which on a GPU is the only way it runs"))
        return
    addrs = np.asarray(ptrs, dtype=np.uint64)
    if mask is not None:
        addrs = addrs[np.broadcast_to(np.asarray(mask, dtype=bool), addrs.shape)]
    if addrs.size == 0:
        return
    if not _active_ranges[-1]:
        raise _refusal(OutOfBounds(f"{what} with no tensor argument to address: a kernel reads and writes "
                                   "the tensors (or tensor descriptors) it is given"))
    inside = np.zeros(addrs.shape, dtype=bool)
    for start, end, _ in _active_ranges[-1]:
        inside |= (addrs >= start) & (addrs + itemsize <= end)
    if inside.all():
        return
    bad = int(addrs[~inside][0])
    nearest = min(_active_ranges[-1], key=lambda r: min(abs(bad - r[0]), abs(bad - r[1])))
    start, end, name = nearest
    if bad >= end:
        where = f"{(bad - end) // itemsize + 1} element(s) past the end of `{name}`"
    else:
        where = f"{(start - bad + itemsize - 1) // itemsize} element(s) before the start of `{name}`"
    raise _refusal(OutOfBounds(
        f"{what} out of bounds: {int((~inside).sum())} address(es) outside every tensor argument, "
        f"the first {where}. Is a mask missing, or an offset or stride wrong?"
    ))


def _falsy_other_given(caller) -> bool:
    """Whether tl.load was given an `other` that Triton's semantic.load dropped: it passes `other.handle if other
    else None`, and in the interpreter a one-element block's truth is its value, so other=0.0 on a block of one
    lane arrives as None. Its value was then 0, which is what the interpreter fills in for None."""
    given = caller.f_locals.get("other") if caller.f_code.co_name == "load" else None
    return given is not None and hasattr(given, "handle")


def _undefined(dtype: np.dtype):
    """What a masked-off lane of a load without other= reads in the checker: NaN for floats, a large
    garbage value for integers (not 0, which would pass for the neutral element of a sum)."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "b":
        return True
    return np.array(0x5A5A5A5A5A5A5A5A, dtype=np.uint64).astype(dtype)


# What the interpreter computes with: its builder's methods, its semantic, a block's operators, Triton's
# and NumPy's functions (tl.exp runs np.exp). Host code that swaps one of them for its own, even only while
# it launches, has its Python compute what a legal kernel line appears to compute: each launch looks for
# the notebook's code there.
_OWN_PATCHES = frozenset({"create_masked_store", "create_masked_load", "create_atomic_rmw",
                          "create_atomic_cas", "create_print", "_patch_lang_tensor"})


def _interpreter_namespaces() -> dict[str, dict]:
    import triton.language as tl

    try:
        from triton.runtime import interpreter as interp
    except ImportError:  # pragma: no cover - very old Triton
        return {}
    found = {"numpy": vars(np), "triton.language": vars(tl), "tl.core": vars(tl.core), "tl.math": vars(tl.math),
             "tl.standard": vars(tl.standard), "triton.runtime.interpreter": vars(interp),
             "tl.tensor": vars(tl.core.tensor), "tl.constexpr": vars(tl.core.constexpr)}
    builder = getattr(interp, "InterpreterBuilder", None)
    semantic = getattr(interp, "interpreter_semantic", None)
    for cls in (*(getattr(builder, "__mro__", ())), *(type(semantic).__mro__ if semantic is not None else ())):
        if cls is not object:
            found[cls.__qualname__] = vars(cls)
    return found


@functools.lru_cache(maxsize=None)
def _library_dirs() -> tuple[str, ...]:
    """Triton's, Python's own, NumPy's and the course's files."""
    course = os.path.dirname(os.path.dirname(_HERE)) + os.sep
    return (kernel_source._triton_dir(), kernel_source._stdlib_dir(), os.path.dirname(np.__file__) + os.sep, course)


def _foreign(value) -> bool:
    """A function (or a partial or vectorize of one) whose code is not Triton's, NumPy's, Python's or the
    course's: the notebook's own."""
    for _ in range(4):
        inner = getattr(value, "func", None) or getattr(value, "pyfunc", None)
        if inner is None or inner is value:
            break
        value = inner
    return hasattr(value, "__code__") and not kernel_source.code_under(value, _library_dirs())


def interpreter_changes() -> list[str]:
    """'numpy.exp', 'InterpreterBuilder.create_exp': where the notebook's own code stands in for what the
    interpreter computes with. Asked by the interpreter's launcher, whatever TRITON_INTERPRET says now: a
    notebook may change the variable after its kernels were built for the interpreter."""
    return sorted(f"{where}.{name}" for where, space in _interpreter_namespaces().items()
                  for name, value in list(space.items()) if name not in _OWN_PATCHES and _foreign(value))


def _refuse_interpreter_changes() -> None:
    """Stop the launch (NotTriton) where the notebook's code stands in for what the interpreter computes."""
    changed = interpreter_changes()
    if changed:
        raise _refusal(NotTriton(f"the code around this launch replaced what the interpreter computes with "
                                 f"({', '.join(changed[:4])}): a kernel's result must come from Triton's own "
                                 "operations"))


def _patch_interpreter():
    """Wrap the interpreter's masked load/store and its launcher; returns an undo function."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:  # pragma: no cover - very old Triton
        return lambda: None
    builder_cls = getattr(interp, "InterpreterBuilder", None)
    executor_cls = getattr(interp, "GridExecutor", None)
    if builder_cls is None or executor_cls is None or not hasattr(builder_cls, "create_masked_store"):
        return lambda: None
    orig_store, orig_load = builder_cls.create_masked_store, builder_cls.create_masked_load
    orig_rmw, orig_cas = builder_cls.create_atomic_rmw, builder_cls.create_atomic_cas
    orig_call = executor_cls.__call__

    def store(self, ptrs, value, mask, *args, **kwargs):
        _check_addresses(ptrs.data, mask.data, value.data.dtype.itemsize, "tl.store")
        _decides(ptrs, mask)
        done = orig_store(self, ptrs, value, mask, *args, **kwargs)
        if _trackers:
            _trackers[-1].after_write(_addresses(ptrs.data, mask.data), value.data.dtype.itemsize)
        return done

    def atomic(orig, what, mask_of):
        def run(self, *args, **kwargs):
            ptr = args[1] if what == "tl.atomic_rmw" else args[0]
            mask = mask_of(args)
            itemsize = np.dtype(interp._get_np_dtype(ptr.get_element_ty())).itemsize
            _check_addresses(ptr.data, None if mask is None else mask.data, itemsize, what)
            addrs = _addresses(ptr.data, None if mask is None else mask.data) if _trackers else None
            if addrs is not None:
                _trackers[-1].before_read(addrs, itemsize, what)
            _decides(ptr, mask)
            done = orig(self, *args, **kwargs)
            if addrs is not None:
                _trackers[-1].after_write(addrs, itemsize, atomic=True)
                if isinstance(getattr(done, "data", None), np.ndarray):
                    done.data = done.data.view(AtomicResult)
            return done

        return run

    def load(self, ptrs, mask, other, *args, **kwargs):
        dtype_np = np.dtype(interp._get_np_dtype(ptrs.get_element_ty()))
        _check_addresses(ptrs.data, mask.data, dtype_np.itemsize, "tl.load")
        _decides(ptrs, mask)
        if _trackers:
            _trackers[-1].before_read(_addresses(ptrs.data, mask.data), dtype_np.itemsize, "tl.load")
        if other is None and not bool(np.all(mask.data)) and not _falsy_other_given(sys._getframe(1)):
            # Triton leaves masked lanes without other= undefined (on a GPU: whatever the register held);
            # the interpreter would give 0, which hides a missing other= feeding a sum, max or dot.
            other = interp.TensorHandle(np.full(np.shape(ptrs.data), _undefined(dtype_np), dtype=dtype_np),
                                        ptrs.get_element_ty())
        return orig_load(self, ptrs, mask, other, *args, **kwargs)

    def call(self, *args, **kwargs):
        if _watches:
            _refuse_interpreter_changes()
        names = self.arg_names
        ranges = []
        for where, arg in kernel_source.flat_arguments(args, kwargs, launch=()):
            # a tensor, or a TensorDescriptor made on the host (its loads and stores address its base tensor); in
            # a tuple too (a tuple of tensors is a tuple of pointers: its loads were taken for out of bounds)
            tensor = arg if isinstance(arg, torch.Tensor) else getattr(arg, "base", None)
            if isinstance(tensor, torch.Tensor):
                head, _, item = where.partition("[")  # "1[0]": the first item of the second argument
                name = head if not head.isdigit() else names[int(head)] if int(head) < len(names) else "tensor"
                name += f"[{item}" if item else ""
                ranges.append((*_storage_range(tensor), name))
                if _trackers and not _trackers[-1].tracks(tensor):
                    _trackers[-1].launched_with(tensor, _kernel_name(self.fn), name)
        if _trackers:
            _trackers[-1].new_launch(_kernel_name(self.fn))
        _active_ranges.append(ranges)
        try:
            return orig_call(self, *args, **kwargs)
        except Exception as exc:
            _kernel_raised(self.fn, exc)
            raise
        finally:
            _active_ranges.pop()

    # Inside a kernel too a block prints without its values (print(x), f"{x}", tl.device_print): the text
    # would otherwise carry them out of the kernel to Python, as str(x) does on the host.
    orig_print = getattr(builder_cls, "create_print", None)
    orig_lang_tensor = getattr(interp, "_patch_lang_tensor", None)

    def create_print(self, prefix, hex, values, *args, **kwargs):
        print(f"{prefix or ''} <{len(values)} value(s) hidden while the checker watches>")

    def lang_tensor(tensor, scope, *args, **kwargs):
        orig_lang_tensor(tensor, scope, *args, **kwargs)
        for name in ("__repr__", "__str__"):
            scope.set_attr(tensor, name, _hidden_block)

    orig_grid_idx = builder_cls.set_grid_idx

    def set_grid_idx(self, *args, **kwargs):
        """The first program of a launch is about to run: what its grid callable and pre-run hooks did
        (host code, inside the launch) is done, so the kernel's names are judged as the body will use them."""
        if _watches and _launching and not _launching[-1][1]:
            _launching[-1][1] = True
            _refuse_interpreter_changes()
            watch = _watches[-1]
            found = kernel_source.problems(_launching[-1][0])
            watch.not_triton += [p for p in found if p not in watch.not_triton]
        if _trackers:
            _trackers[-1].new_program(tuple(int(i) for i in args[:3]))
        return orig_grid_idx(self, *args, **kwargs)

    builder_cls.create_masked_store, builder_cls.create_masked_load = store, load
    builder_cls.set_grid_idx = set_grid_idx
    builder_cls.create_atomic_rmw = atomic(orig_rmw, "tl.atomic_rmw", lambda a: a[3] if len(a) > 3 else None)
    builder_cls.create_atomic_cas = atomic(orig_cas, "tl.atomic_cas", lambda a: None)
    executor_cls.__call__ = call
    if orig_print is not None:
        builder_cls.create_print = create_print
    if orig_lang_tensor is not None and hasattr(getattr(interp, "_LangPatchScope", None), "set_attr"):
        interp._patch_lang_tensor = lang_tensor

    def undo():
        builder_cls.create_masked_store, builder_cls.create_masked_load = orig_store, orig_load
        builder_cls.create_atomic_rmw, builder_cls.create_atomic_cas = orig_rmw, orig_cas
        builder_cls.set_grid_idx = orig_grid_idx
        executor_cls.__call__ = orig_call
        if orig_print is not None:
            builder_cls.create_print = orig_print
        if orig_lang_tensor is not None:
            interp._patch_lang_tensor = orig_lang_tensor

    return undo


def _kernel_name(obj) -> str:
    """The @triton.jit function's name behind a JITFunction, Autotuner or Heuristics object."""
    for _ in range(6):
        name = getattr(obj, "__name__", None)
        if isinstance(name, str):
            return name
        obj = getattr(obj, "fn", None)
        if obj is None:
            break
    return "kernel"


def _kernel_module(obj) -> str:
    """The module of the Python function behind a JITFunction, Autotuner or Heuristics object (the lesson
    whose file its code comes from, whatever its __module__ says: provenance.lesson_module)."""
    from .provenance import lesson_module

    for _ in range(6):
        if inspect.isfunction(obj):
            return lesson_module(obj) or obj.__module__ or ""
        obj = getattr(obj, "fn", None)
        if obj is None:
            break
    return ""


def _user_hooks(tuner) -> list[str]:
    """The autotuner's hooks that are not Triton's own (reset_to_zero, restore_value)."""
    name = _kernel_name(tuner)
    found = [f"{kind} of `{name}`" for kind in ("pre_hook", "post_hook")
             if getattr(tuner, f"user_defined_{kind}", False)]
    if any(getattr(config, "pre_hook", None) is not None for config in getattr(tuner, "configs", ())):
        found.append(f"a triton.Config pre_hook of `{name}`")
    return found


def _launch_record(kernel, watch: Watch, args, kwargs) -> Launch:
    tensors = [a for _, a in kernel_source.flat_arguments(args, kwargs) if isinstance(a, torch.Tensor)]
    return Launch(_kernel_name(kernel), _kernel_module(kernel), tuple(tuple(t.shape) for t in tensors),
                  tuple(_storage(t) in watch.input_storages for t in tensors),
                  tuple(watch.call_shapes.get(_storage(t), ()) for t in tensors),
                  tuple(_storage(t) for t in tensors), tuple(t.untyped_storage().nbytes() for t in tensors),
                  tuple(watch.call_names.get(_storage(t), "") for t in tensors))


def _modes_beneath() -> list[str]:
    """TorchDispatchModes already active when a watch starts: the recorder goes on top of them, so torch's
    ops reach them after it, and what they compute in their own __torch_dispatch__ it never sees."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from ..checks.l05_online_softmax import _DispatchReads  # the checks' own: a read log under a nested watch

    return [f"the mode {type(mode).__name__}" for mode in _get_current_dispatch_mode_stack()
            if not isinstance(mode, (_RecordOps, _DispatchReads))]


def _interpreted(kernel) -> bool:
    """Does this launch run in Triton's interpreter? Read from the kernel (built as an InterpretedFunction
    while TRITON_INTERPRET was 1), not from the environment, which a notebook can change afterwards."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - very old Triton
        return False
    return isinstance(kernel_source._jit_function(kernel), InterpretedFunction)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _plain_grid(grid) -> tuple[int, ...]:
    """A launch's grid as a tuple of plain ints (operator.index of each entry: an int, a NumPy integer)."""
    import operator

    return tuple(operator.index(entry) for entry in grid)


# The checker's own wrappers of host code (unpaused), by address: a launch already wrapped is handed on as it is.
# Known by identity, never by a mark on the object: a grid function the notebook marked as the checker's own
# (`grid._course_unpaused = True`, the mark this used to be) ran its torch ops inside the launch, where recording
# is paused, unseen (02.vector_add passed with the sums computed by torch, unflagged).
_UNPAUSED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _is_unpaused(fn) -> bool:
    return _UNPAUSED.get(id(fn)) is fn


def _patch_launchers(watch: Watch, recorder: _RecordOps, after_launch: Callable[[], None] | None = None):
    """Count launches of @triton.jit functions (compiled or interpreted); pause op recording inside.

    A launch inside an autotuner is not counted: its benchmark runs and its final launch are the
    autotuner's one launch. Any other launch counts, a nested one too: a kernel launched from inside
    another launch (from its grid callable, say) is a second kernel all the same.
    `after_launch` runs (with recording paused) after each counted launch returns.
    """
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    counted = [JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        if hasattr(InterpretedFunction, "run"):  # triton >= 3.6; before, its launches bypassed a run method
            counted.append(InterpretedFunction)
        elif current().interpret:
            raise CannotWatch(interpreter_too_old() or "this triton's interpreter launches kernels in a way "
                               "the checker cannot count: pip install triton==3.9.0")
    # The autotuner's own timing loop allocates and clears buffers: pause recording there too.
    originals = {cls: cls.run for cls in (*counted, Autotuner)}

    in_tuner = []  # per launch in progress, innermost last: is it an autotuner's?

    def unpaused(fn):
        """fn with op recording on while it runs: a grid callable, a heuristic or a config pruner is the
        submission's host code, which Triton calls from inside the launch (where recording is paused)."""
        if not callable(fn) or _is_unpaused(fn):
            return fn

        @functools.wraps(fn)
        def host_code(*a, **k):
            saved, recorder.paused = recorder.paused, 0
            try:
                return fn(*a, **k)
            finally:
                recorder.paused = saved

        _UNPAUSED[id(host_code)] = host_code
        return host_code

    def grid_of_ints(grid):
        """The grid, worked out as a tuple of plain ints with recording on. Triton reads a grid's entries
        (int(), <, __index__) inside the launch, where recording is paused: an entry whose __index__ ran
        `SUM.copy_(x + y)` computed unseen, and a kernel copied SUM into out (02.vector_add passed, in a
        sandbox too). A grid callable's result is made plain as it returns, the same way."""
        if _is_unpaused(grid):
            return grid
        if callable(grid):
            def grid_fn(*a, **k):
                return _plain_grid(grid(*a, **k))
            return unpaused(functools.wraps(grid)(grid_fn))
        return unpaused(_plain_grid)(grid)

    def wrap(cls, orig):
        def run(self, *args, **kwargs):
            if not _mine(watch):
                return orig(self, *args, **kwargs)
            counts = not (in_tuner and in_tuner[-1]) and not kwargs.get("warmup", False)
            if "grid" in kwargs:
                kwargs["grid"] = grid_of_ints(kwargs["grid"])
            jit = kernel_source._jit_function(self)
            hooks = list(getattr(jit, "pre_run_hooks", None) or ())
            if hooks and counts:
                watch.hooks.append(f"a pre_run_hook of `{_kernel_name(self)}`")
            if hooks:
                jit.pre_run_hooks[:] = [unpaused(hook) for hook in hooks]
            pruners = {}
            if isinstance(self, Autotuner):
                watch.hooks += _user_hooks(self)
                pruners = {name: getattr(self, name, None) for name in ("perf_model", "early_config_prune")}
                for name, fn in pruners.items():
                    setattr(self, name, unpaused(fn))
            if counts:
                watch.launches.append(_kernel_name(self))
                watch.launched.append(_launch_record(self, watch, args, kwargs))
                # Arguments in both modes: a GPU's launcher calls an object's data_ptr() (any object that has
                # one is a pointer to it) inside the launch, where recording is paused
                found = kernel_source.subclass_problems(self, args, kwargs)
                found += kernel_source.argument_problems(self, args, kwargs)
                if _interpreted(self):
                    found += kernel_source.problems(self)
                watch.not_triton += [p for p in found if p not in watch.not_triton]
            in_tuner.append(isinstance(self, Autotuner))
            _launching.append([self, False])
            recorder.paused += 1
            try:
                return orig(self, *args, **kwargs)
            finally:
                _launching.pop()
                if hooks:
                    jit.pre_run_hooks[:] = hooks
                for name, fn in pruners.items():
                    setattr(self, name, fn)
                in_tuner.pop()
                if counts and after_launch is not None:
                    after_launch()
                recorder.paused -= 1

        return run

    for cls, orig in originals.items():
        cls.run = wrap(cls, orig)
    original_heuristics = Heuristics.run

    def heuristics_run(self, *args, **kwargs):
        values, self.values = self.values, {k: unpaused(f) for k, f in self.values.items()}
        try:
            return original_heuristics(self, *args, **kwargs)
        finally:
            self.values = values

    Heuristics.run = heuristics_run

    def undo():
        for cls, orig in originals.items():
            cls.run = orig
        Heuristics.run = original_heuristics

    return undo


# One watch at a time in a process (a thread's own nested watches re-enter). Each watch wraps methods of
# classes (the interpreter's builder, torch.Tensor's host reads) and, when it ends, puts back what it found:
# two threads' watches (the batch grader's --jobs, judging autograd stand-ins) ending in the order they began
# left the first one's wrappers installed for good, the next watch wrapped them again, and a one-lane load's
# other=0.0 read NaN in every later check of the process.
_WATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def watching(after_launch: Callable[[], None] | None = None, tracker: Tracker | None = None,
             inputs: Iterable[torch.Tensor] = (), outputs: Iterable[torch.Tensor] = (),
             names: Mapping[str, torch.Tensor] | None = None):
    """Record launches and torch ops of the code inside; guard interpreter memory accesses.

    after_launch: called after each counted kernel launch returns, e.g. to snapshot outputs.
    tracker: follow where the bytes kernels read came from (Tracker; interpreter mode only).
    inputs: the call's input tensors; each launch records which of its tensor arguments are (views of) them.
    outputs: the call's output tensors; each launch records the shape of the input or output each of its
    tensor arguments views (Launch.bases).
    names: {parameter: tensor} of the call; each launch records the parameter each of its tensor arguments
    shares storage with (Launch.params).
    """
    with _WATCH_LOCK, _watching(after_launch, tracker, inputs, outputs, names or {}) as watch:
        yield watch


@contextlib.contextmanager
def _watching(after_launch, tracker, inputs, outputs, names):
    inputs = list(inputs)
    watch = Watch(input_storages={_storage(t) for t in inputs},
                  call_shapes={_storage(t): tuple(t.shape) for t in (*inputs, *outputs)},
                  call_names={_storage(t): name for name, t in names.items()})
    watch.subclasses += _modes_beneath()
    recorder = _RecordOps(watch)
    undo_launch = _patch_launchers(watch, recorder, after_launch)
    undo_interp = _patch_interpreter()
    undo_threads = _patch_thread_starts(watch)
    undo_pickle = _patch_serialization(watch, recorder)
    if tracker is not None:
        _trackers.append(tracker)
    # The outermost watch of this thread keeps the ledger; a watch inside it shares that account.
    ledger = None if any(w.thread == watch.thread for w in _watches) else OpLedger()
    memory_opens, memory_open = _memory_opens(), _memory_file_open()
    _watches.append(watch)
    try:
        with _RecordHostCalls(watch, recorder), recorder:
            if ledger is not None:
                ledger.start()
            try:
                yield watch
            finally:
                if ledger is not None:
                    watch.unseen_ops += ledger.stop()
                    watch.ledger_problem = ledger.problem
                    watch.host_reads += ["item"] * min(ledger.hidden_reads, 1)
                opens = _memory_opens()
                if (memory_open or opens[0] != memory_opens[0]) and MEMORY_FILE not in watch.side_doors:
                    watch.side_doors.append(MEMORY_FILE)
                if opens[1] != memory_opens[1] and OPAQUE_PATH not in watch.side_doors:
                    watch.side_doors.append(OPAQUE_PATH)
    finally:
        _watches.remove(watch)
        if tracker is not None:
            _trackers.remove(tracker)
        undo_pickle()
        undo_threads()
        undo_interp()
        undo_launch()


def _graders_own(frame) -> bool:
    """Is this the batch grader's own code (its channel sending a gradient's bytes to a sandbox)?"""
    return os.path.dirname(os.path.abspath(frame.f_code.co_filename)) + os.sep == _HERE


def _patch_serialization(watch: Watch, recorder: _RecordOps):
    """Pickling a tensor or a storage (pickle.dumps, torch.save, copy) hands its bytes to Python with no op
    the recorder sees: count it as a host read. Returns an undo function."""
    patched = [(torch.Tensor, "__reduce_ex__"), (torch.storage._StorageBase, "__reduce__"),
               (torch.storage.TypedStorage, "__reduce__")]
    # Autograd runs a Function's backward outside the TorchFunctionMode that sees x.numpy() in the call
    # itself: there the methods are wrapped too.
    patched += [(torch.Tensor, name) for name in sorted(HOST_READS)]
    # and the module functions that hand a tensor's memory to NumPy (np.from_dlpack of their capsule)
    patched += [(module, "to_dlpack") for module in (torch.utils.dlpack, torch)
                if hasattr(module, "to_dlpack")]
    patched += [(torch.UntypedStorage, "_write_file")]  # a storage's bytes written to a file, read back
    originals = [(cls, name, getattr(cls, name, None)) for cls, name in patched]
    # None: inherited (put back by deleting)
    own = [(cls, name, cls.__dict__.get(name)) for cls, name in patched]

    def wrap(orig, name):
        @functools.wraps(orig)  # its name too: a TorchFunctionMode is handed the method as it is now
        def reduce(self, *args, **kwargs):
            if not recorder.paused and _mine(watch) and not _graders_own(sys._getframe(1)):
                watch.host_reads.append(name)
            return orig(self, *args, **kwargs)
        return reduce

    for cls, name, orig in originals:
        if orig is not None:
            setattr(cls, name, wrap(orig, name))

    def undo():
        for cls, name, before in own:
            if before is not None:
                setattr(cls, name, before)
            elif name in cls.__dict__:
                delattr(cls, name)

    return undo


def _patch_thread_starts(watch: Watch):
    """Record in watch.threads where the code watched starts a Python thread (threading.Thread, a thread
    pool made during the call, _thread); returns an undo function. (A pool made before the call, whose
    threads already run, is not seen here: the grader's code scan flags threads.)"""
    import _thread

    saved = [(threading, "_start_new_thread"), (_thread, "start_new_thread")]
    originals = [getattr(module, name) for module, name in saved]

    def wrap(orig):
        def start(*args, **kwargs):
            if _mine(watch):
                watch.threads.append(student_site(2) or "a thread")
            return orig(*args, **kwargs)

        return start

    for (module, name), orig in zip(saved, originals):
        setattr(module, name, wrap(orig))

    def undo():
        for (module, name), orig in zip(saved, originals):
            setattr(module, name, orig)

    return undo
