"""Exercises of lesson 05: merging softmax statistics, the online pass, fused softmax, FlashAttention."""
from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import site
import sys
import tracemalloc
import weakref

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..grading import Case, Exercise, Out, register
from ..grading.harness import Fusion, Speed, strided_out
from ..grading.inputs import EPS, f64, hide_a_key_from_earlier_queries, randn
from ..mode import current, size
from ..roofline import Cost, softmax_cost
from .l02_first_kernels import CAPPED_GRID_PROGRAMS

NEG_INF = float("-inf")
CAPPED_GRID_ROWS = CAPPED_GRID_PROGRAMS + 3  # rows past a grid capped at twice an H100's SMs


def _bf16() -> bool:
    """bf16 cases only where tl.dot and conversions support it: a GPU of compute capability 8.0+."""
    return current().gpu and torch.cuda.get_device_capability()[0] >= 8


# --- 05.merge_stats ---------------------------------------------------------------------------

def _merged(m1: float, d1: float, m2: float, d2: float) -> tuple[float, float]:
    m = max(m1, m2)
    if m == NEG_INF:
        return m, d1 + d2
    return m, d1 * math.exp(m1 - m) + d2 * math.exp(m2 - m)


def _as_float(value) -> float | None:
    """A real number (int, float, NumPy scalar, one-element tensor) as a float; None for anything else: a
    string such as "-inf" converts with float() too, but is no number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | torch.Tensor):
        return None
    if isinstance(value, torch.Tensor) and (value.numel() != 1 or value.is_complex()):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _close(got: float, want: float, rtol: float) -> bool:
    if math.isinf(want) or math.isnan(want):
        return got == want or (math.isnan(got) and math.isnan(want))
    return abs(got - want) <= rtol * abs(want) + 1e-300


def _pair(result) -> tuple[float, float] | str:
    """The (m, d) a candidate returned as floats, or what is wrong with its return value."""
    if not isinstance(result, tuple | list) or len(result) != 2:
        return f"returned {type(result).__name__} {result!r:.80}; expected a tuple (m, d)"
    m, d = (_as_float(v) for v in result)
    if m is None or d is None:
        return f"returned ({result[0]!r:.40}, {result[1]!r:.40}); m and d must be numbers or 0-d tensors"
    return m, d


def _pair_problems(result, want_m: float, want_d: float, rtol: float, m_text: str, d_name: str,
                   explain) -> list[str]:
    """Problems with a returned (m, d): its form, m exactly, d within rtol; explain(m, d) adds why not."""
    pair = _pair(result)
    if isinstance(pair, str):
        return [pair]
    m, d = pair
    problems = []
    if not _close(m, want_m, 0.0):
        text = m_text.format(m=m, want=want_m)
        if m_text.format(m=m, want=m) == m_text.format(m=want_m, want=want_m):  # they print alike: all digits
            text = m_text.replace(":g}", "!r}").format(m=m, want=want_m) + (
                ": the max is one of x's values, exactly; is it rounded to a narrower type on the way?")
        problems.append(text)
    if not _close(d, want_d, rtol):
        problems.append(f"{d_name} = {d:.10g}, expected {want_d:.10g}" + explain(m, d))
    return problems


def _merge_verify(args, rtol):
    m1, d1, m2, d2 = (float(a) for a in args)
    want_m, want_d = _merged(m1, d1, m2, d2)

    def explain(m: float, d: float) -> str:
        if math.isnan(d):
            return ("; NaN: with both maxima -inf, exp(m1 - m) is exp(-inf + inf); two empty "
                    "blocks merge to (-inf, 0)" if want_m == NEG_INF
                    else "; NaN: is an exponent -inf - (-inf)?")
        if math.isinf(d):
            return "; it overflowed: exponents must be m_i - m <= 0 (subtract the new max)"
        if want_m > NEG_INF and _close(d, d1 + d2, 1e-9) and not _close(d1 + d2, want_d, 1e-9):
            return "; that is d1 + d2: each d_i must first be rescaled by exp(m_i - m)"
        if want_m > NEG_INF and _close(d, d1 * math.exp(m - m1) + d2 * math.exp(m - m2), 1e-9):
            return "; the exponents are flipped: the factor is exp(m_i - m), at most 1"
        return ""

    def verify(result, case) -> list[str]:
        return _pair_problems(result, want_m, want_d, rtol, "m = {m:g}, expected max(m1, m2) = {want:g}", "d",
                              explain)

    return verify


def _merge_cases(gen):
    def rnd() -> float:
        return float(torch.randn((), generator=gen, dtype=torch.float64))

    def pos() -> float:
        return float(torch.rand((), generator=gen, dtype=torch.float64)) * 50 + 0.5

    floats = [
        ("block 2 has the larger max", (rnd() - 1, pos(), rnd() + 2, pos())),
        ("block 1 has the larger max", (rnd() + 2, pos(), rnd() - 1, pos())),
        ("equal maxima", (1.5, pos(), 1.5, pos())),
        ("maxima near 100 apart by 30 (no overflow allowed)", (100.0 + rnd(), pos(), 70.0 + rnd(), pos())),
        ("maxima of 1000 and 999: exp(m) overflows, exp(m_i - m) does not", (1000.0, pos(), 999.0, pos())),
        ("maxima near -100", (-100.0 + rnd(), pos(), -100.0 + rnd(), pos())),
        ("block 1 empty: (-inf, 0)", (NEG_INF, 0.0, rnd(), pos())),
        ("block 2 empty: (-inf, 0)", (rnd(), pos(), NEG_INF, 0.0)),
        ("both blocks empty: the result is (-inf, 0)", (NEG_INF, 0.0, NEG_INF, 0.0)),
    ]
    for label, args in floats:
        yield Case(f"floats, {label}", args, None, verify=_merge_verify(args, 1e-12))
    device = current().device
    for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        for label, args in (floats[0], floats[1], floats[6], floats[8]):
            tensors = tuple(torch.tensor(a, dtype=dtype, device=device) for a in args)
            yield Case(f"0-d {str(dtype)[6:]} tensors, {label}", tensors, None,
                       verify=_merge_verify([float(t) for t in tensors], rtol))


# --- 05.online_softmax_stats --------------------------------------------------------------------

_METADATA = {
    "__get__", "__len__", "size", "dim", "numel", "nelement", "ndimension", "stride", "storage_offset",
    "is_contiguous", "element_size", "data_ptr", "untyped_storage", "is_floating_point", "is_complex",
    "get_device", "__hash__", "__repr__", "__format__", "__str__",
}


# aten ops that make views or read only sizes: what the reads of x's memory seen at dispatch leave out.
_NO_READ = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "t", "transpose", "permute", "expand",
    "expand_as", "view_as", "slice", "select", "unsqueeze", "squeeze", "detach", "alias", "lift_fresh",
    "split", "split_with_sizes", "chunk", "narrow", "unbind", "unfold", "resolve_conj", "resolve_neg",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "empty_like", "zeros_like", "ones_like",
    "full_like", "new_empty", "new_zeros", "new_ones", "new_full",
}
# Tensor methods that hand the data to Python or NumPy without an aten op.
_HOST_READS = {"numpy", "tolist", "__array__"}
# A tensor's memory, as such (a DLPack capsule is its address: NumPy's from_dlpack makes an array over it)
_MEMORY = {"untyped_storage", "storage", "_typed_storage", "data_ptr", "__dlpack__"}
# Copying or serializing a tensor (pickle, torch.save, copy.deepcopy) reads its whole storage, a view's too:
# torch's own Python asks for the storage, and no aten op runs.
_SERIALIZE = {"__reduce_ex__", "__reduce__", "__deepcopy__", "__getstate__"}
# Conversions and copies of a whole tensor (torch's names and the aten ops under them): reads of all of it.
_CONVERSIONS = {"to", "_to_copy", "double", "float", "half", "type", "type_as", "clone", "contiguous",
                "copy_", "_copy_from", "_copy_from_and_resize", "numpy"}
# Where the checker's own code lives: its requests for x's memory (to tell tensors apart) are not reads.
_CHECKER_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
                      for d in ("checks", "grading"))
# The log's entry for the most memory the call's torch tensors held at once, besides x: (HELD, bytes, 0). One
# pass over blocks needs the block in hand and the running (m, d); keeping copies of the blocks (a list of
# them, a buffer they are copied into) to go over them again is a second pass that no read of x shows.
HELD = "memory held at once"
HELD_BLOCKS, HELD_SLACK = 32, 8 << 10  # allowed: 32 blocks of float64 values, and at least 8 KiB
# The same for the Python objects and NumPy arrays the call made (tracemalloc's peak, besides the checker's
# own: _PythonHeld): the blocks' values kept in a list (.tolist(), 32 bytes a float) or a NumPy array to go
# over them again are a second pass no torch op shows. (PYTHON_HELD, bytes, 0); bytes -1: tracemalloc was
# stopped during the call. Allowed: as many bytes as HELD, and at least 32 KiB for the interpreter's own
# objects (a block's list of floats, a frame, a generator). Measured only where x's values in float32 take
# at least that much (tracing every allocation slows the call about twofold).
PYTHON_HELD, PYTHON_SLACK = "Python memory held at once", 32 << 10
# The reads of each watched x, by the address of its memory: kept here, out of reach of the code watched
# (x._reads is a copy: clearing it, or what it was, changes nothing; the grader's copy of the sandbox's
# log is set with _ReadLog.set_reads).
_LOGS: dict[int, list] = {}


def _address(t: torch.Tensor) -> int | None:
    """Where t's memory starts (None for a tensor without memory, e.g. on the meta device)."""
    with torch._C.DisableTorchFunctionSubclass():
        try:
            return torch.Tensor.untyped_storage(t).data_ptr()
        except (RuntimeError, NotImplementedError):
            return None


def _read(log: list, name: str, tensors: list) -> None:
    """One operation over `tensors` (views of x): a read of all of them at once, from the first."""
    with torch._C.DisableTorchFunctionSubclass():
        first = min(a.storage_offset() for a in tensors)
        log.append((name, first, sum(a.numel() for a in tensors)))


def _read_storage(log: list, name: str, t: torch.Tensor) -> None:
    """An operation that reads the whole storage under t (of x: 4 bytes an element in fp32), not t's view."""
    with torch._C.DisableTorchFunctionSubclass():
        log.append((name, 0, torch.Tensor.untyped_storage(t).nbytes() // t.element_size()))


def _checker_frame(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_CHECKER_DIRS)


class _ReadLog(torch.Tensor):
    """A tensor that logs which of its elements each operation reads: (op, first element, count).

    Views of it (slices, `split`) stay logged; anything computed from it is a plain tensor. The log
    shows whether a candidate reduced the whole tensor at once or went back to an earlier block.
    While a check calls the candidate (`reading`), the reads of x's memory through any tensor are logged
    too, where torch runs them: a plain tensor over it (torch.Tensor.as_subclass, set_) or x itself with
    __torch_function__ switched off reads it all the same.
    """

    @classmethod
    def watch(cls, x: torch.Tensor) -> _ReadLog:
        w = torch.Tensor.as_subclass(x, cls)
        _LOGS[_address(w)] = []
        weakref.finalize(w, _LOGS.pop, _address(w), None)  # the log goes with the case
        return w

    @property
    def _reads(self) -> list:
        return list(_LOGS.get(_address(self), ()))

    @staticmethod
    def set_reads(t: _ReadLog, reads: list) -> None:
        """The grader's side: the log the sandbox reported for its copy of t."""
        _LOGS[_address(t)] = list(reads)

    @staticmethod
    @contextlib.contextmanager
    def reading(t: _ReadLog):
        """Around a call given t (harness.call_function_candidate): log what reads t's memory at dispatch."""
        _first_dispatch()
        log = _LOGS.setdefault(_address(t), [])
        reads = _DispatchReads(_address(t), log)
        with reads, _HostReads(_address(t), log), _PythonHeld(log, t.numel() * 4 >= PYTHON_SLACK) as python:
            yield
        log.append((HELD, reads.peak, 0))
        log.append((PYTHON_HELD, python.held, 0))

    def as_subclass(self, cls):
        """A plain tensor over the same elements escapes the log: count it as a read of all of them (torch
        does not route as_subclass through __torch_function__)."""
        _read(_LOGS.setdefault(_address(self), []), "as_subclass", [self])
        return torch.Tensor.as_subclass(self, cls)

    def __deepcopy__(self, memo):
        """copy.deepcopy(x): a plain tensor with a storage of its own, which copying x's storage read whole
        (torch's own __deepcopy__ cannot make another _ReadLog: it needs new_empty to return one)."""
        _read_storage(_LOGS.setdefault(_address(self), []), "__deepcopy__", self)
        plain = torch.Tensor.as_subclass(self, torch.Tensor)
        with torch._C.DisableTorchFunctionSubclass():
            return plain.__deepcopy__(memo)

    def __reduce_ex__(self, protocol):
        """pickle and torch.save: they write x's whole storage (a view's too), read without an aten op."""
        _read_storage(_LOGS.setdefault(_address(self), []), "__reduce_ex__", self)
        return torch.Tensor.as_subclass(self, torch.Tensor).__reduce_ex__(protocol)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
        # inside lists and tuples too: torch.cat(list(x.split(block))) reads every block at once
        watched = [a for a in tree_leaves((args, kwargs)) if isinstance(a, cls)]
        if not watched:
            return result
        root = _address(watched[0])
        name = getattr(func, "__name__", str(func))

        def view_of_x(t) -> bool:
            return isinstance(t, torch.Tensor) and _address(t) == root

        def wrap(t):
            if view_of_x(t):
                return torch.Tensor.as_subclass(t, cls)
            return torch.Tensor.as_subclass(t, torch.Tensor) if isinstance(t, cls) else t

        if isinstance(result, tuple | list):
            wrapped = type(result)(wrap(t) for t in result)
            views = all(view_of_x(t) for t in result)
        else:
            wrapped = wrap(result)
            views = view_of_x(result)
        if name not in _METADATA and not views:  # one op over several views (torch.cat of x's blocks)
            _read(_LOGS.setdefault(root, []), name, watched)
        return wrapped


class _DispatchReads(TorchDispatchMode):
    """Each aten op (but views) whose tensors include some over the memory at `address`: a read of them. And the
    most memory the tensors its ops made held at once, besides x's (`peak`, bytes: each storage once, while a
    tensor over it lives)."""

    def __init__(self, address: int, log: list):
        super().__init__()
        self.address, self.log = address, log
        self.made: dict[int, tuple] = {}  # id -> (weak reference to a tensor an op made, its storage, bytes)
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in _NO_READ:
            over = [t for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor) and _address(t) == self.address]
            if over:
                _read(self.log, func.overloadpacket.__name__, over)
        result = func(*args, **(kwargs or {}))
        for t in tree_leaves(result):
            address = _address(t) if isinstance(t, torch.Tensor) else None
            if address is not None and address != self.address:
                with torch._C.DisableTorchFunctionSubclass():
                    self.made[id(t)] = (weakref.ref(t), address, torch.Tensor.untyped_storage(t).nbytes())
        held = {}
        for key, (ref, address, nbytes) in list(self.made.items()):
            if ref() is None:
                del self.made[key]
            else:
                held[address] = nbytes
        self.peak = max(self.peak, sum(held.values()))
        return result


class _HostReads(TorchFunctionMode):
    """A tensor over the memory at `address` handed to NumPy or Python (numpy, tolist): a read of it (x itself
    too, with its __torch_function__ switched off). And the memory itself asked for, by the candidate's code
    or by torch's on its behalf (untyped_storage, data_ptr: its bytes are then Python's, storage.tolist(),
    pickle, torch.save, copy.deepcopy): a read of all of x's storage. The checker's own code asks for it
    too, to tell tensors apart: not counted."""

    def __init__(self, address: int, log: list):
        super().__init__()
        self.address, self.log = address, log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if t is None or _address(t) != self.address:
            pass
        elif name in _MEMORY:
            if not _checker_frame(sys._getframe(1).f_code.co_filename):
                _read_storage(self.log, name, t)
        elif name in _SERIALIZE:
            _read_storage(self.log, name, t)
        elif name in _HOST_READS:
            _read(self.log, name, [t])
            result = func(*args, **(kwargs or {}))
            return _numpy_copy(result, t) if isinstance(result, np.ndarray) else result
        return func(*args, **(kwargs or {}))


# Where library code lives: the standard library, site-packages, the import machinery, the course itself.
_LIBRARY_FILES = tuple(dict.fromkeys([
    "<frozen ", sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), site.getusersitepackages(),
    *(os.path.dirname(os.path.dirname(os.path.abspath(m.__file__))) for m in (torch, np)),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]))
# Bytes of the NaN padding around the NumPy copies of blocks (_numpy_copy) alive now, and the most at once
# since _PythonHeld began: the checker's memory, not the candidate's.
_PADDING = {"alive": 0, "most": 0}


def _padding_freed(nbytes: int) -> None:
    _PADDING["alive"] -= nbytes


@functools.cache
def _first_dispatch() -> None:
    """Once per process, before any call is measured: torch's first op under a dispatch mode imports some 900
    modules (3-4 s, tens of MB), which traced by tracemalloc would take several times as long."""
    t = torch.zeros(2)
    with _DispatchReads(_address(t), []), _HostReads(_address(t), []):
        t[:1].double().max().item()


class _PythonHeld:
    """Around a call: the most memory Python objects and NumPy arrays held at once beyond what they held before
    (`held`, bytes), tracemalloc's peak less the checker's own share of it: the read log's new entries and the
    padding of NumPy's copies of blocks (the most alive at once, a bound on their share of the peak). -1 when
    tracemalloc was stopped during the call. tracemalloc is started for the call unless it was running."""

    def __init__(self, log: list, measure: bool = True):
        self.log, self.measure, self.held = log, measure, 0

    def __enter__(self) -> _PythonHeld:
        if not self.measure:
            return self
        self.started = not tracemalloc.is_tracing()
        if self.started:
            tracemalloc.start()
        self.entries, self.log_bytes, self.modules = len(self.log), sys.getsizeof(self.log), len(sys.modules)
        _PADDING["most"] = _PADDING["alive"]
        self.base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        return self

    def __exit__(self, *exc) -> None:
        if not self.measure:
            return
        tracing = tracemalloc.is_tracing()
        if not tracing:
            self.held = -1
            return
        peak, kept = tracemalloc.get_traced_memory()[1], 0
        if len(sys.modules) != self.modules:  # a first import's passing allocations (compiling, unmarshalling)
            peak = 0  # are no one's copy of x; the next case, with the modules in place, is measured
        else:  # what a library's code made and kept (a cache, an op's first use); a copy of x's values the
            # candidate's code made is gone by now (its function returned), or was made by its own lines
            kept = sum(stat.size for stat in tracemalloc.take_snapshot().statistics("filename")
                       if stat.traceback[0].filename.startswith(_LIBRARY_FILES))
        if self.started:
            tracemalloc.stop()
        entries = self.log[self.entries:]
        log_bytes = (sys.getsizeof(self.log) - self.log_bytes
                     + sum(sys.getsizeof(e) + sum(sys.getsizeof(v) for v in e[1:] if not -5 <= v <= 256)
                           for e in entries)  # Python keeps one object of each int from -5 to 256
                     + sum(sys.getsizeof(name) for name in {id(e[0]): e[0] for e in entries}.values()))
        self.held = max(0, peak - self.base - log_bytes - _PADDING["most"] - kept)


def _numpy_copy(array: np.ndarray, t: torch.Tensor) -> np.ndarray:
    """NumPy's array over a block of x, as a copy: at the block's place in an array of NaN the size of x's
    memory. NumPy's array over the block itself would be a door to all of x that no torch op sees:
    np.lib.stride_tricks.as_strided(x[:1].numpy(), (n,), ...) widens it past the block, the read log knowing
    of one element. The copy has the block's values, and NaN where a widened view would reach the rest."""
    with torch._C.DisableTorchFunctionSubclass():
        size = torch.Tensor.untyped_storage(t).nbytes() // t.element_size()
        offset = t.storage_offset()
    padded = np.full(max(size, offset + 1), np.nan if array.dtype.kind in "fc" else 0, dtype=array.dtype)
    copy = np.lib.stride_tricks.as_strided(padded[offset:], shape=array.shape, strides=array.strides)
    copy[...] = array
    padding = padded.nbytes - array.nbytes  # the block's own bytes are the candidate's (a copy it may keep)
    _PADDING["alive"] += padding
    _PADDING["most"] = max(_PADDING["most"], _PADDING["alive"])
    weakref.finalize(padded, _padding_freed, padding)
    return copy


def _second_pass(reads: list, block: int) -> str:
    """What reads a block again after the loop left it for another one ("" if nothing does). Blocks are
    x[s:s + block] for s in range(0, n, block); a read of elements [start, start + count) belongs to the
    blocks it touches. The block being read may be read again (its max, then its sum); once another block is
    read, the earlier one is finished. Any order of blocks is one pass (merging is commutative)."""
    finished, current = set(), set()
    for op, start, count in reads:
        touched = set(range(start // block, (start + max(count, 1) - 1) // block + 1))
        back = sorted(touched & finished)
        if back:
            left, first = (min(current) if current else 0) * block, back[0] * block
            return (f"`{op}` read x[{start}:{start + count}] of block {back[0]} (x[{first}:{first + block}]) "
                    f"after the loop had moved on to x[{left}:{left + block}]: going back to a finished "
                    "block is a second pass; update a running (m, d) with each block as you read it")
        finished |= current - touched
        current = touched
    return ""


def _stats_verify(x64: torch.Tensor, block: int, rtol: float):
    n = x64.numel()
    want_m = float(x64.max())
    want_d = float(torch.exp(x64 - want_m).sum()) if want_m > NEG_INF else 0.0
    # What forgetting to rescale gives: each block's terms relative to the running max after it.
    no_rescale, m_run = 0.0, NEG_INF
    for s in range(0, n, block):
        m_run = max(m_run, float(x64[s:s + block].max()))
        if m_run > NEG_INF:
            no_rescale += float(torch.exp(x64[s:s + block] - m_run).sum())

    def explain(m: float, d: float) -> str:
        if math.isnan(d):
            return ("; NaN: a block of only -inf has max -inf and exp(-inf - (-inf)) is NaN: its "
                    "statistics are (-inf, 0)")
        if math.isinf(d) or (d == 0.0 and want_d > 0):
            return "; exp over- or underflowed: subtract the running max inside exp"
        if _close(d, no_rescale, 1e-6) and not _close(no_rescale, want_d, rtol):
            return ("; that is what forgetting to rescale gives: when the running max grows from m to "
                    "m', multiply the sum so far by exp(m - m')")
        return ""

    def verify(result, case) -> list[str]:
        x = case.args[0]
        reads = [r for r in x._reads if r[0] not in (HELD, PYTHON_HELD)]
        held = max((r[1] for r in x._reads if r[0] == HELD), default=0)
        python_held = [r[1] for r in x._reads if r[0] == PYTHON_HELD]
        seen = torch.zeros(n, dtype=torch.bool)
        for _, start, count in reads:
            seen[start:start + count] = True
        if not bool(seen.all()):
            first = int((~seen).nonzero()[0])
            return [(f"your loop read {int(seen.sum())} of x's {n} elements (none from x[{first}] on, "
                     f"block = {block}): visit every block, the partial last one too: range(0, n, block)")]
        for op, start, count in reads:
            if count > block:
                copy = (" (a copy of x, pickled, saved or deep-copied, is a read of all of it)"
                        if op in _SERIALIZE else
                        " (x's memory handed out as such is a read of all of it)" if op in _MEMORY else
                        " (converting or copying all of x up front, x.double() or x.to(...), is a read of "
                        "all of it: convert each block as you read it)" if op in _CONVERSIONS else "")
                return [(f"`{op}` read {count} elements of x at once (block = {block}){copy}: compute the "
                         f"statistics block by block and merge them, never over the whole tensor "
                         f"(torch.max(x) first is a pass of its own)")]
        second = _second_pass(reads, block)
        if second:
            return [second]
        if held > max(HELD_BLOCKS * block * 8, HELD_SLACK):
            return [(f"your function's tensors held {held} bytes at once ({held // (8 * block)} blocks of {block} "
                     f"float64 values; x has {n} elements): copies of the blocks kept to go over them again (a list "
                     "of them, a buffer they were copied into) are a second pass over x; keep only the running "
                     "(m, d) and the block in hand")]
        pair = _pair(result)
        if (not isinstance(pair, str) and math.isnan(pair[0]) and any(op in _HOST_READS for op, *_ in reads)
                and not bool(torch.isnan(x64).any())):
            return [(f"max = nan, expected {want_m:g}: x has no NaN, but the NumPy array of a block here holds "
                     "that block alone, NaN around it; an array widened past its block "
                     "(np.lib.stride_tricks) reads NaN, not the rest of x: read each block as its own slice")]
        if -1 in python_held:
            return ["your function stopped tracemalloc, which the check uses to see how much memory the call's "
                    "Python objects held: leave it running"]
        python_most = max(python_held, default=0)
        if python_most > max(HELD_BLOCKS * block * 8, PYTHON_SLACK):
            return [(f"your function's Python objects and NumPy arrays held {python_most} bytes at once (x has {n} "
                     f"elements, {x.element_size()} bytes each; a Python float in a list takes 32): the blocks' "
                     "values kept to go over them again (a list of .tolist() values, a NumPy array they were "
                     "copied into) are a second pass over x; keep only the running (m, d) and the block in hand")]
        return _pair_problems(result, want_m, want_d, rtol, "max = {m:g}, expected {want:g}", "sum", explain)

    return verify


def _stats_cases(gen):
    n = size(4099, 1021)
    inputs = [
        ("one element", randn(1, gen=gen), 4),
        (f"{n} elements, block 64: the last block is partial", randn(n, gen=gen), 64),
        ("a block larger than x", randn(100, gen=gen), 256),
        ("ascending values: the max grows in every block", randn(n, gen=gen, scale=3).sort().values, 32),
        ("values near +100: exp(x) overflows fp32", randn(n, gen=gen, offset=100.0), 128),
        ("values near -100: exp(x) underflows", randn(n, gen=gen, offset=-100.0), 128),
        ("all elements equal", torch.full((300,), 7.25, device=current().device), 64),
        ("float64", randn(n, torch.float64, gen=gen, scale=5), 100),
    ]
    x = randn(n, gen=gen, scale=2)
    x[(torch.rand(n, generator=gen) < 0.3).to(x.device)] = NEG_INF  # masked logits
    x[:64] = NEG_INF  # the whole first block
    x[128:192] = NEG_INF  # and a whole block after finite ones: its (-inf, 0) must not spoil the running sum
    inputs.append(("some -inf, the whole first block -inf and the third too", x, 64))
    # One pass against a fixed reference (the first block's max, rescaled once at the end) is exact until a
    # later value lies ~88 above it and exp overflows fp32: only a max that grows by more than that shows it.
    x = randn(n, gen=gen, offset=-100.0)
    x[-1] = 50.0
    inputs.append(("values near -100, then a 50 in the last block: the max grows by 150, so exp() against an "
                   "earlier block's max overflows; merge with exp(m_i - m) <= 1", x, 128))
    # Last, so that the cases above draw what they drew before it came: 256 blocks, so that copies of them all
    # (32 KiB in fp32) are far more than the block in hand and the running statistics (HELD_BLOCKS: 8 KiB);
    # their values kept as Python floats (256 KiB) or in a NumPy array are more than PYTHON_SLACK
    inputs.append(("8192 elements, block 32: 256 blocks, one in hand at a time", randn(1 << 13, gen=gen), 32))
    for label, x, block in inputs:
        rtol = 1e-12 if x.dtype == torch.float64 else 1e-5
        yield Case(label, (_ReadLog.watch(x), block), None, verify=_stats_verify(f64(x), block, rtol))


# --- 05.softmax -------------------------------------------------------------------------------

# Outputs are rounded once; exp and a long fp32 sum add a little (GPU exp is an approximation, a few
# fp32 ulp). fp16/bf16: computed in fp32 and rounded once at the store, an output is within one unit
# roundoff of the exact value (1.25 x for the fp32 maths); fp16 arithmetic (x - max rounded to fp16,
# exp in fp16, a second rounding at the division) is off by several. atol: fp16's subnormal steps.
_SOFTMAX_TOL = {torch.float32: (1e-12, 2e-5), torch.float16: (1e-7, 1.25 * EPS[torch.float16]),
                torch.bfloat16: (1e-6, 1.25 * EPS[torch.bfloat16])}


def _softmax_explain(outs: dict, case: Case) -> str:
    """What wrong softmax values match: the columns' softmax, no normalization, fp16 arithmetic."""
    x = f64(case.args[0])
    got = f64(outs["out"])
    if not bool(torch.isfinite(got).all()):
        if bool(torch.isnan(got).any()):
            return ("NaN: exp of a large value overflows (subtract the row max first), a lane that saw "
                    "only -inf subtracted -inf from -inf (subtract 0 there), or a masked load without "
                    "other= fed its undefined lanes into the max or the sum (load them with other=-inf)")
        return ""
    atol, rtol = case.atol, max(case.rtol, 1e-4)
    if x.shape[0] > 1 and torch.allclose(got, torch.softmax(x, dim=0), atol=atol, rtol=rtol):
        return "that is the softmax of each COLUMN (dim 0): normalize along each row (dim 1)"
    if torch.allclose(got, torch.exp(x - x.amax(dim=1, keepdim=True)), atol=atol, rtol=rtol):
        return "that is exp(x - max) without the division by the row's sum"
    base2 = torch.exp2(x - x.amax(dim=1, keepdim=True))
    if torch.allclose(got, base2 / base2.sum(dim=1, keepdim=True), atol=atol, rtol=rtol):
        return ("that is a softmax in base 2, exp2(x - max) / sum: exp2 needs its argument times log2(e) "
                "(exp(x) = exp2(x * log2(e))), or use tl.exp")
    n = x.shape[1]
    for block in sorted({1 << max(n - 1, 0).bit_length(), 1024, 2048, 4096}):
        if block > n:  # the padding lanes of one block loaded as 0: they count in the max and the sum
            padded = torch.cat([x, x.new_zeros((x.shape[0], block - n))], dim=1)
            if torch.allclose(got, torch.softmax(padded, dim=1)[:, :n], atol=atol, rtol=rtol):
                return (f"that is the softmax of each row padded with zeros to a block of {block}: the masked "
                        "lanes were loaded as 0 and count in the max and the sum; load them with other=-inf")
    sums, dtype = got.sum(dim=1), case.args[0].dtype  # x is its float64 copy
    if dtype in (torch.float16, torch.bfloat16) and torch.allclose(sums, torch.ones_like(sums), atol=0.05):
        return ("the rows are nearly right but each value is off by more than one rounding of "
                f"{str(dtype)[6:]}: that is {str(dtype)[6:]} arithmetic; "
                "convert with .to(tl.float32) right after the load and round once, at the store")
    return ""


def _softmax_case(label, x, out_layout="contiguous"):
    expected = torch.softmax(f64(x), dim=1)
    return Case(label, (x, Out("out", tuple(x.shape), x.dtype, out_layout)), {"out": expected}, *_SOFTMAX_TOL[x.dtype],
                explain=_softmax_explain)


def _whole_blocks_case(rows: int, log2_cols: int, gen) -> Case:
    return _softmax_case(f"{rows} rows of 2^{log2_cols}: a multiple of every block size, the last block full (a "
                         "mask from n_cols % BLOCK masks all of it off)", randn((rows, 1 << log2_cols), gen=gen, scale=2))


def _softmax_cases(gen):
    m, n = size((1823, 781), (37, 781))
    # Rows past 65536 (2 x the one-pass kernel's largest row): no single block holds one; the -inf half of
    # a row below is then longer than the one-pass limit too
    long_rows, long_cols = size((64, 100_000), (3, 70_000))
    yield _softmax_case("one row of length 1", randn((1, 1), gen=gen))
    yield _softmax_case("rows of length 1", randn((5, 1), gen=gen))
    yield _softmax_case(f"{m} x {n}: no multiple of any block (pad with -inf, not 0)", randn((m, n), gen=gen))
    yield _softmax_case("fp16 storage, fp32 arithmetic", randn((m, n), torch.float16, gen=gen, scale=3))
    if _bf16():
        yield _softmax_case("bf16 storage, fp32 arithmetic", randn((m, n), torch.bfloat16, gen=gen, scale=3))
    yield _softmax_case("all-equal rows: every output is 1/n",
                        torch.full((7, 300), -3.5, device=current().device))
    yield _softmax_case("values near +100: exp overflows unless you subtract the row max",
                        randn((16, 1000), gen=gen, offset=100.0))
    yield _softmax_case("values near -100: exp underflows unless you subtract the row max",
                        randn((16, 1000), gen=gen, offset=-100.0))
    x = randn((m, n), gen=gen, scale=2)
    x[(torch.rand((m, n), generator=gen) < 0.3).to(x.device)] = NEG_INF
    x[:, 0] = 0.0  # every row keeps a finite entry
    yield _softmax_case("about 30% -inf entries (masked logits): exp(-inf) = 0", x)
    yield _softmax_case("every other column of a wider tensor: use both strides",
                        randn((m, 2 * n + 1), gen=gen)[:, 1::2])
    yield _softmax_case("a transposed tensor: strides (1, rows)", randn((n, m), gen=gen).t())
    yield _softmax_case("a transposed out: strides (1, rows), address out with its own strides",
                        randn((m, n), gen=gen), out_layout="transposed")
    yield _softmax_case(f"{CAPPED_GRID_ROWS} rows of 5: more rows than a grid capped at twice the SM count "
                        "(2 x 132 programs) covers; launch a program per row, or loop over the rest",
                        randn((CAPPED_GRID_ROWS, 5), gen=gen))
    yield _whole_blocks_case(4, 10, gen)
    yield _softmax_case(f"rows of {long_cols}: longer than one block, the running max changes (rescale the "
                        "running sum by exp(m_old - m_new))",
                        randn((long_rows, long_cols), gen=gen, scale=2))
    yield _softmax_case(f"ascending rows of {long_cols}: the max grows in every block (rescale the sum)",
                        randn((3, long_cols), gen=gen, scale=3).sort(dim=1).values)
    yield _softmax_case(f"rows of {long_cols} near +100: exp overflows in every block unless you subtract "
                        "the running max", randn((3, long_cols), gen=gen, scale=2, offset=100.0))
    x = randn((3, long_cols), gen=gen, scale=2, offset=-100.0)
    x[:, : long_cols // 2] = NEG_INF
    x[:, -1] = 50.0
    yield _softmax_case("long rows: the first half -inf, values near -100, then one 50", x)
    # The strided cases above have short rows: a kernel for long rows (an online loop beside a one-pass
    # kernel) must address x and out with their strides too.
    yield _softmax_case(f"rows of {long_cols}, every other column of a wider tensor: the long-row loop uses "
                        "both strides of x, and out's own",
                        randn((3, 2 * long_cols + 1), gen=gen, scale=2)[:, 1::2], out_layout="padded")
    # The case with a 50 last, reversed: a running max that falls to a later block's (m_new = the block's
    # max alone, not max(m_old, it)) is an exact rescaling until exp(m_old - m_new) overflows, here e^150.
    x = randn((3, long_cols), gen=gen, scale=2, offset=-100.0)
    x[:, 0] = 50.0
    yield _softmax_case("long rows: a 50 first, then values near -100: the running max never falls "
                        "(m_new = max(m_old, the block's max)), or exp(m_old - m_new) overflows", x)
    # A kernel that holds several rows per tile and takes tl.max(x) of the whole tile shifts each row by
    # the same constant: exact, unless a row lies ~88 below another row of its tile (exp underflows).
    x = randn((16, 1000), gen=gen, offset=-100.0)
    x[::2] += 200.0  # rows 0, 2, ... near +100: every tile of 2 or more rows holds both kinds
    yield _softmax_case("rows near +100 and near -100 in turn: each row subtracts its own max (with several "
                        "rows per tile, tl.max(x, axis=1), not tl.max(x) of the whole tile)", x)
    # The case with the -inf half, without it: the max of the first block (about -92) is no safe shift
    # for the whole row. A kernel that subtracts it instead of a running max is exact until exp(50 + 92)
    # overflows, here.
    x = randn((3, long_cols), gen=gen, scale=2, offset=-100.0)
    x[:, -1] = 50.0
    yield _softmax_case("long rows: values near -100, then a 50 last: the max grows by 150 in the last block "
                        "(keep a running max; exp(x - the first block's max) overflows)", x)
    yield _whole_blocks_case(2, 16, gen)  # the long-row loop's last block: after the cases that name its maths
    # Every long row above is fp32, and the only long rows with a strided out have out's columns adjacent: a
    # long-row loop in the storage dtype, or one that stored without out's column stride, passed them all.
    # 16 rows: with 3, a 1 / d rounded to fp16 before the last pass (two roundings of each output) stayed
    # inside the tolerance of one on some seeds; on 16 it is past it on hundreds of elements
    yield _softmax_case(f"fp16 rows of {long_cols}: the long-row loop loads in fp16 and keeps its running max, "
                        "its sum and 1 / sum in fp32 (x.to(tl.float32)), rounding each output once, at the store",
                        randn((16, long_cols), torch.float16, gen=gen, scale=3))
    yield _softmax_case(f"rows of {long_cols} into a transposed out: strides (1, rows), the long-row loop stores "
                        "with out's column stride", randn((3, long_cols), gen=gen, scale=2), out_layout="transposed")
    # Every long row above has a maximum near 0 or above it, where a running max that starts at 0 instead
    # of -inf shifts as well as the true one; the rows near -100 that would tell them apart are short.
    yield _softmax_case(f"rows of {long_cols} near -120: the long-row loop's running max starts at -inf, not 0 "
                        "(exp(-120 - 0) underflows to 0 in every block, and 0 / 0 is NaN)",
                        randn((3, long_cols), gen=gen, scale=2, offset=-120.0))
    # Last, the longest to run (a wrong answer that fails earlier never gets here). Triton refuses blocks of
    # more than 2^20 elements (TRITON_MAX_TENSOR_NUMEL) in the interpreter too, which has no register limit:
    # this row is where a kernel with one block per row (no loop) fails there. One row of 4 MiB of fp32 in
    # the interpreter (the solution: about half a second).
    yield _softmax_case("rows of 2^20 + 3: longer than Triton's largest block (2^20 elements, "
                        "triton.language.TRITON_MAX_TENSOR_NUMEL), so no block holds a row: loop over it",
                        randn((size(3, 1), (1 << 20) + 3), gen=gen, scale=2))


# --- 05.attention -----------------------------------------------------------------------------

def _attention_expected(q, k, v, causal):
    q, k, v = f64(q), f64(k), f64(v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        S = q.shape[-2]
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), NEG_INF)
    return torch.softmax(scores, dim=-1) @ v


def _attention_scaled(q, k, v, causal, scale: float, pad_keys: int = 0):
    """float64 attention with another score scale, and `pad_keys` extra keys scored 0 with v = 0."""
    q, k, v = f64(q), f64(k), f64(v)
    scores = q @ k.transpose(-2, -1) * scale
    S = q.shape[-2]
    if causal:
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), NEG_INF)
    if pad_keys:
        scores = torch.cat([scores, scores.new_zeros((*scores.shape[:-1], pad_keys))], dim=-1)
        v = torch.cat([v, v.new_zeros((*v.shape[:-2], pad_keys, v.shape[-1]))], dim=-2)
    return torch.softmax(scores, dim=-1) @ v


def _attention_no_rescale(q, k, v, causal, block_n: int):
    """What a kernel gives that rescales l but not acc when the running max grows (tiles of block_n keys)."""
    q, k, v = f64(q), f64(k), f64(v)
    S, D = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), NEG_INF)
    m = torch.full(scores.shape[:-1], NEG_INF, dtype=torch.float64)
    l = torch.zeros_like(m)
    acc = torch.zeros((*scores.shape[:-1], D), dtype=torch.float64)
    for start in range(0, S, block_n):
        s = scores[..., start:start + block_n]
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_ref = torch.where(m_new == NEG_INF, 0.0, m_new)
        p = torch.exp(s - m_ref[..., None])
        l = l * torch.exp(m - m_ref) + p.sum(dim=-1)
        acc = acc + p @ v[..., start:start + block_n, :]  # the mistake: acc * exp(m - m_new) is missing
        m = m_new
    return acc / l[..., None]


def _attention_explain(outs: dict, case: Case) -> str:
    """Name the usual FlashAttention mistakes by the values they give."""
    q, k, v, _, causal = case.args
    got = f64(outs["out"])
    bad_rows = (~torch.isfinite(got)).any(dim=-1).nonzero()[:, -1].unique().tolist()  # query indices
    if causal and bad_rows == [0]:
        return ("NaN in query 0 only: with causal=True query i sees keys j <= i, the diagonal included "
                "(keys <= queries, not <); query 0 sees key 0")
    if not bool(torch.isfinite(got).all()):
        return ("NaN or inf: a row whose scores so far are all -inf has m = -inf, and exp(-inf - (-inf)) is "
                "NaN: use 0 in place of such an m; or exp overflowed because the max was not subtracted, or "
                "because the running max fell (m_new must be max(m_old, the tile's max), so that "
                "exp(m_old - m_new) <= 1); or one max served the whole tile of queries, and a query far "
                "below it got exp() = 0 for every key (tl.max(s, axis=1): each query its own max), or the "
                "running max started at 0, above scores that are all far below it (start m at -inf)")
    S, D = q.shape[-2], q.shape[-1]
    atol, rtol = 2 * case.atol, 2 * case.rtol

    def near(want) -> bool:
        return torch.allclose(got, want, atol=atol, rtol=rtol)

    log2e = 1 / math.log(2)
    scales = {
        ("that is exp() of scores scaled for exp2 (by log2(e) / sqrt(D)): use exp2 with that scale, or exp "
         "with 1 / sqrt(D)"): log2e / math.sqrt(D),
        ("that is exp2() of scores scaled by 1 / sqrt(D) only: exp2 needs the scale times log2(e) "
         "(exp(x) = exp2(x * log2(e)))"): 1 / (math.sqrt(D) * log2e),
        "that is attention without the 1 / sqrt(D) scale of the scores": 1.0,
    }
    for text, scale in scales.items():
        if near(_attention_scaled(q, k, v, causal, scale)):
            return text
    for block_n in (16, 32, 64, 128, 256):
        pad = -S % block_n
        if pad and not causal and near(_attention_scaled(q, k, v, causal, 1 / math.sqrt(D), pad)):
            return (f"that is what keys past S left in the softmax give (scored 0 in a last tile of "
                    f"{block_n} keys): give keys >= S a score of -inf")
        if S > block_n and near(_attention_no_rescale(q, k, v, causal, block_n)):
            return (f"that is what an accumulator that is not rescaled gives (tiles of {block_n} keys): "
                    "when the running max grows from m to m_new, multiply acc (and l) by exp(m - m_new) "
                    "before adding the new tile")
    scores = f64(q) @ f64(k).transpose(-2, -1) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), NEG_INF)
    if near(torch.exp(scores - scores.amax(dim=-1, keepdim=True)) @ f64(v)):
        return "that is acc without the final division by l: out = acc / l once the keys are done"
    if causal and near(_attention_expected(q, k, v, False)):
        return "that is attention without the causal mask: query i may see keys j <= i only"
    if not causal and near(_attention_expected(q, k, v, True)):
        return "that is causal attention: with causal=False every query sees every key"
    return ""


def _half_explain(outs: dict, case: Case) -> str:
    """The fp16 cases: what fp16 scores, statistics or accumulator give, besides the usual mistakes."""
    got, want = f64(outs["out"]), case.expected["out"]
    v = f64(case.args[2])
    if not bool(torch.isfinite(got).all()) and float(v.abs().max()) * v.shape[-2] > 65504:
        return (f"inf or NaN where values up to {float(want.abs().max()):.4g} were expected: acc = sum of "
                f"p * v over up to {v.shape[-2]} keys passes 65504, fp16's largest value: keep acc (and l "
                "and m) in fp32, tl.zeros(..., tl.float32), not q.dtype; round only p, for the p @ v dot, "
                "and out, at the store")
    why = _attention_explain(outs, case)
    if why or not bool(torch.isfinite(got).all()):
        return why
    # q multiplied by the scale before the dot and rounded back to fp16 (the older Triton tutorial's
    # q = (q * qk_scale).to(tl.float16)): the scores are fp32, but every q lost 2^-11 on the way in. (By 1 /
    # sqrt(D) alone, a power of 2 when D is a power of 4, the rounding is exact; log2(e) / sqrt(D) never is.)
    # Triton multiplies an fp16 tensor by an fp32 scalar argument in fp16 (the scale rounded too), by an fp32
    # tensor (q.to(tl.float32) * qk_scale) in fp32.
    q, k, _, _, causal = case.args
    D = q.shape[-1]
    for scale, exp_scale in ((1 / (math.sqrt(D) * math.log(2)), math.log(2)), (1 / math.sqrt(D), 1.0)):
        for q_scale in (float(torch.tensor(scale).to(q.dtype)), scale):
            rounded = (f64(q) * q_scale).to(q.dtype)
            if torch.allclose(got, _attention_scaled(rounded, k, v, causal, exp_scale),
                              atol=2 * case.atol, rtol=2 * case.rtol):
                return (f"that is what q multiplied by the scale and rounded back to {str(q.dtype)[6:]} gives "
                        "(q = (q * qk_scale).to(tl.float16), as an older Triton tutorial wrote it): the scores "
                        "are fp32, but every q is rounded once more, and at scores near 16 each p is up to 1% "
                        "off. Load q as it is and scale the fp32 scores: s = tl.dot(q, k) * qk_scale")
    if float((got - want).abs().max()) <= 0.1 * float(want.abs().max()):
        return ("close, but off by more than fp16's rounding: the scores, m, l or acc went through fp16 "
                "(tl.zeros(..., q.dtype), s.to(tl.float16)); keep them in fp32 and round only p, for the "
                "p @ v dot, and out, at the store")
    return ""


def _attention_tolerance(dtype, scale: float = 1.0) -> tuple[float, float]:
    """scale: the inputs' standard deviation. A score's rounding error grows with its size (scale^2) and
    an output's with |v| (scale), whatever the precision of the dots: on a GPU fp32 dots run in TF32
    (relative error ~2^-11), measured on an H200 at scale 3: worst abs error 0.041 for a correct kernel;
    the interpreter's are fp32 (2^-24), where a correct kernel at scale 3 was once 2.5e-5 off."""
    if dtype == torch.float32:  # fp32 in the interpreter; TF32 scores and p @ v on a GPU
        unit = 1e-2 if current().gpu else 2e-5
        return unit * scale**2, unit * scale
    return {torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}[dtype]


def _attention_cases(gen):
    def qkv(shape, dtype, scale=1.0):
        return tuple(randn(shape, dtype, gen, scale) for _ in range(3))

    S_odd = size(1000, 37)
    D = size(64, 16)
    shapes = [
        ("one query and one key", (1, 1, 1, D), torch.float32, False),
        (f"S = {S_odd}: no multiple of any tile", (1, 2, S_odd, D), torch.float32, False),
        (f"causal, S = {S_odd}: query i sees keys j <= i", (1, 2, S_odd, D), torch.float32, True),
        ("causal, one query", (1, 1, 1, D), torch.float32, True),
        ("fp16, causal", size((2, 4, 1023, 128), (1, 2, 50, 32)), torch.float16, True),
        ("fp16", size((2, 4, 777, 128), (1, 1, 70, 32)), torch.float16, False),
    ]
    if _bf16():
        shapes += [("bf16", (2, 4, 1023, 128), torch.bfloat16, False),
                   ("bf16, causal", (2, 4, 1023, 128), torch.bfloat16, True)]
    for label, shape, dtype, causal in shapes:
        q, k, v = qkv(shape, dtype)
        yield Case(label, (q, k, v, Out("out", shape, dtype), causal),
                   {"out": _attention_expected(q, k, v, causal)}, *_attention_tolerance(dtype),
                   explain=_attention_explain)
    q, k, v = qkv((1, 1, 300, 16), torch.float32, scale=3.0)
    yield Case("S = 300, large scores, causal=False: more than two tiles of 128 queries and of keys (a grid "
               "over every query tile, a loop over every key tile, the rescale when the max grows)",
               (q, k, v, Out("out", (1, 1, 300, 16), torch.float32), False),
               {"out": _attention_expected(q, k, v, False)}, *_attention_tolerance(torch.float32, 3.0),
               explain=_attention_explain)
    B, H, S, D = size((2, 4, 300, 64), (2, 2, 45, 16))  # B > 1: batch and head each have their stride
    for causal in (False, True):
        # Peaked scores: the running max jumps often, so a missing rescale shows.
        q, k, v = qkv((B, H, S, D), torch.float32, scale=3.0)
        yield Case(f"large scores (the max changes often), causal={causal}",
                   (q, k, v, Out("out", (B, H, S, D), torch.float32), causal),
                   {"out": _attention_expected(q, k, v, causal)}, *_attention_tolerance(torch.float32, 3.0),
                   explain=_attention_explain)
    # Four layouts, one per tensor, all viewed as (B, H, S, D): a kernel that addresses one tensor with
    # another's strides, or assumes one contiguous, reads or writes the wrong elements.
    q = randn((B, S, 3, H, D), gen=gen)[:, :, 0].transpose(1, 2)  # of a packed qkv: strides (3SHD, D, 3HD, 1)
    k = randn((B, H, D, S), gen=gen).transpose(2, 3)  # K stored transposed: stride 1 along S, not D
    v = randn((S, B, H, D), gen=gen).permute(1, 2, 0, 3)  # sequence first: strides (HD, D, BHD, 1)
    yield Case("q is a slice of a packed (B, S, 3, H, D) qkv, k a (B, H, D, S) tensor, v an (S, B, H, D) one "
               "and out a (B, S, H, D) one, all viewed as (B, H, S, D): address each with its own four "
               "strides",
               (q, k, v, strided_out("out", torch.float32, (B, S, H, D), (0, 2, 1, 3)), True),
               {"out": _attention_expected(q, k, v, True)}, *_attention_tolerance(torch.float32),
               explain=_attention_explain)
    if not current().gpu:
        # Even queries score near +120 on keys 0..7 (the first key tile) and near -120 on the rest; odd
        # queries score near 0 everywhere. exp(120) overflows fp32, so the max must be subtracted; a
        # running max that drops to a later tile's max (m_new = that tile's max alone, not max(m_old, it))
        # overflows in exp(m_old - m_new); one max for the whole tile of queries (tl.max(s) without
        # axis=1) leaves the odd queries exp(-120) = 0 everywhere, 0 / 0. Until something over- or
        # underflows all three are exact rescalings, so the cases above (scores below ~40) pass them. In
        # the interpreter only: its fp32 dots are exact, while TF32 on a GPU is ~0.1 off on a score of 120;
        # the tolerance is the scale-3 cases' (the solution's worst, 12 seeds: 0.13 of it).
        S_big, D_big = 100, 16
        q, k, v = qkv((1, 2, S_big, D_big), torch.float32)
        q[..., 0::2, 0] = 12.0  # score = q[0] k[0] / sqrt(D) + noise of ~1
        q[..., 1::2, 0] = 0.0
        k[..., 0] = -10.0 * math.sqrt(D_big)
        k[..., :8, 0] = 10.0 * math.sqrt(D_big)
        yield Case("even queries score near +120 on keys 0..7 and near -120 on the later keys, odd queries "
                   "near 0: subtract each query's running max, and keep it: m_new = max(m_old, the tile's "
                   "max for that query), never below m_old",
                   (q, k, v, Out("out", (1, 2, S_big, D_big), torch.float32), False),
                   {"out": _attention_expected(q, k, v, False)}, *_attention_tolerance(torch.float32, 3.0),
                   explain=_attention_explain)
    # Causal with S > 128: with S <= 64 one tile of 64 holds every query and key, and a mask in positions
    # within the tile (tl.arange(0, BLOCK_N) <= tl.arange(0, BLOCK_M)) or a key loop that stops early passes.
    q, k, v = qkv((1, 1, 300, 16), torch.float32, scale=3.0)
    yield Case("S = 300, large scores, causal=True: query tile t sees key tiles 0..t, more than two tiles of "
               "128 (the causal mask compares absolute positions, key start_n + j with query start_m + i)",
               (q, k, v, Out("out", (1, 1, 300, 16), torch.float32), True),
               {"out": _attention_expected(q, k, v, True)}, *_attention_tolerance(torch.float32, 3.0),
               explain=_attention_explain)
    # fp16 inputs whose answer needs fp32 arithmetic inside: scores, m, l and acc kept in fp16 (tl.zeros(...,
    # q.dtype), s.to(tl.float16)) pass the fp16 cases above by far. Scores of std 16: rounded to fp16 (steps
    # of 2^-6 at 16) each p is up to 0.8% off, several times the tolerance (the solution: 0.2 of it).
    shape = size((1, 2, 1023, 64), (1, 1, 128, 16))
    q, k, v = qkv(shape, torch.float16, scale=4.0)
    yield Case("fp16, q, k and v of std 4 (scores of std 16): rounded to fp16 a score is up to 0.008 off and "
               "its p up to 0.8%: keep the scores in fp32",
               (q, k, v, Out("out", shape, torch.float16), False),
               {"out": _attention_expected(q, k, v, False)}, *_attention_tolerance(torch.float16),
               explain=_half_explain)
    # Nearly equal scores and v near 1000: acc = sum of p * v passes 65504, fp16's largest value, after about
    # 70 keys, so an fp16 acc overflows. (l alone in fp16 only drifts, a rounding of 2^-11 per key tile whose
    # sign flips with each power of 2 l passes: no case of the interpreter's sizes catches it reliably.)
    shape = size((1, 1, 4096, 64), (1, 1, 200, 16))
    q, k = randn(shape, torch.float16, gen, 0.1), randn(shape, torch.float16, gen)
    v = randn(shape, torch.float16, gen, offset=1000.0)
    yield Case("fp16, causal, nearly equal scores and v near 1000: acc = sum of p * v grows past 65504, "
               "fp16's largest value: keep m, l and acc in fp32",
               (q, k, v, Out("out", shape, torch.float16), True), {"out": _attention_expected(q, k, v, True)},
               *_attention_tolerance(torch.float16), explain=_half_explain)
    # In the four-layouts case only k's head dim is not contiguous: a kernel that takes stride(3) of q, v
    # and out as 1 (three strides of each, four of k) passed. Here no tensor's stride(3) is 1, no two alike;
    # and out's batch is its innermost dim but one (every other out keeps the batch outermost).
    q = randn((B, D, H, S), gen=gen).permute(0, 2, 3, 1)  # strides (DHS, S, 1, HS)
    k = randn((D, B, H, S), gen=gen).permute(1, 2, 3, 0)  # strides (HS, S, 1, BHS)
    v = randn((B, H, D, S), gen=gen).transpose(2, 3)  # strides (HDS, DS, 1, S)
    yield Case("q, k, v and out with the head dim strided (stride(3) != 1 in each, no two alike), out stored "
               "(S, D, B, H), strides (H, 1, DBH, BH): address d with each tensor's own stride(3) too, not "
               "only k's, and out's batch with out.stride(0)",
               (q, k, v, strided_out("out", torch.float32, (S, D, B, H), (2, 3, 0, 1)), False),
               {"out": _attention_expected(q, k, v, False)}, *_attention_tolerance(torch.float32),
               explain=_attention_explain)
    if not current().gpu:
        # Every case above has, for each query, a score above -88, where exp() is a normal fp32: a running
        # max that starts at 0 instead of -inf (max(0, scores) is as good a shift there) passed them all.
        # Here every score is near -120 (q[0] = -12, k[0] = 10 sqrt(D), the rest noise of ~1): exp(score - 0)
        # is 0 for every key. In the interpreter only, as the case of scores near +-120 above.
        q, k, v = qkv((1, 2, 100, 16), torch.float32)
        q[..., 0] = -12.0
        k[..., 0] = 10.0 * math.sqrt(16)
        yield Case("every score near -120: exp(score) is 0 in fp32 unless the running max is subtracted, "
                   "and the running max starts at -inf (not 0)",
                   (q, k, v, Out("out", (1, 2, 100, 16), torch.float32), True),
                   {"out": _attention_expected(q, k, v, True)}, *_attention_tolerance(torch.float32, 3.0),
                   explain=_attention_explain)
        # Every D of the interpreter's cases above is 16 or 32: a head-dim block fixed at 32 passed them all
        q, k, v = qkv((1, 2, 37, 64), torch.float32)
        yield Case("D = 64: the block of the head dim is D itself (HEAD_DIM=D), never a fixed size",
                   (q, k, v, Out("out", (1, 2, 37, 64), torch.float32), False),
                   {"out": _attention_expected(q, k, v, False)}, *_attention_tolerance(torch.float32),
                   explain=_attention_explain)
    # Every causal score above that the mask hides is within ~40 of the visible ones: a mask applied to p
    # after exp (the running max taken over masked scores too) is an exact shift there. Here the last key
    # would score ~150 for every earlier query, every visible score ~N(0, 1).
    q, k, v = qkv((1, 1, 40, 16), torch.float32)
    hide_a_key_from_earlier_queries(q, k, 150.0)
    yield Case("causal, the last key scoring ~150 for every earlier query, which the mask hides from them: "
               "mask the scores (-inf) before the running max, not p after exp, or every visible p underflows",
               (q, k, v, Out("out", (1, 1, 40, 16), torch.float32), True),
               {"out": _attention_expected(q, k, v, True)}, *_attention_tolerance(torch.float32),
               explain=_attention_explain)


register(Exercise(
    "05.merge_stats", "merge the softmax statistics of two blocks", "merge_stats(m1, d1, m2, d2)",
    _merge_cases, kernel=False,
    hint={"wrong": "m = max(m1, m2); d = d1 * exp(m1 - m) + d2 * exp(m2 - m); when m is -inf both blocks are "
                   "empty: return (-inf, d1 + d2) instead of computing exp(-inf - (-inf)); return a tuple "
                   "(m, d)"}))
register(Exercise(
    "05.online_softmax_stats", "(max, sum of exp(x - max)) in one pass over blocks",
    "online_softmax_stats(x, block)", _stats_cases, kernel=False,
    forbidden_ops=("logsumexp", "_softmax", "softmax", "_log_softmax", "log_softmax"),
    hint={"wrong": "start from (m, d) = (-inf, 0); for each slice x[s:s + block] compute its max and "
                   "sum(exp(slice - its max)) and merge them into (m, d) with merge_stats; a slice of only -inf "
                   "has statistics (-inf, 0)",
          "host": "torch.logsumexp and softmax do the whole reduction at once: build it from each block's "
                  "max and sum, merged with merge_stats",
          "input": "read x, never write into it (no in-place ops such as sub_ or exp_ on x or its slices)"}))


def _attention_scores(case: Case) -> tuple[int, str] | None:
    """The (B, H, S, S) scores, the intermediate FlashAttention never writes: an allocation that holds them is
    refused, and so is a buffer kept from call to call that holds them in 16-bit floats (Fusion.kept_buffers).
    Only where S > 2 D, so that an fp32 copy of out (4 S D bytes per head) or the per-row statistics (m, l)
    take less than either: those a fused kernel may keep."""
    B, H, S, D = case.args[0].shape
    return (B * H * S * S, "the (B, H, S, S) scores") if S > 2 * D else None


def _half() -> torch.dtype:
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float16


def _attention_cost(args) -> Cost:
    """4 B H S^2 D FLOPs (two matmuls; half of them when causal); q, k, v read once, out written once."""
    q, causal = args[0], args[4]
    B, H, S, D = q.shape
    return Cost(4.0 * B * H * S * S * D / (2 if causal else 1), 4 * q.numel() * q.element_size())


register(Exercise(
    "05.softmax", "fused row softmax of any row length", "softmax(x, out)", _softmax_cases, max_launches=1,
    hint={"wrong": "per row: out = exp(x - max) / sum(exp(x - max)) over the row (dim 1), in fp32 whatever "
                   "the storage dtype; load masked columns as -inf, not 0; for rows longer than one block "
                   "keep a running (m, d) and rescale d by exp(m_old - m_new) when the max grows",
          "nan": "subtract each row's max before exp; a lane whose max is still -inf must subtract 0, not "
                 "-inf; load masked columns with other=-inf",
          "unwritten": "one program per row (or per block of rows) and, for rows longer than one block, a "
                       "loop over the row's blocks that stores every block",
          "out_of_bounds": "mask columns >= n_cols on the load (other=-inf) and the store, rows >= n_rows on "
                           "the store; address x and out with their own strides",
          "launches": "one kernel: the max, the exponentials, the sum and the division happen on the row in "
                      "registers (or in an online loop), never in separate launches",
          "host": "torch.softmax, exp, max or sum outside your kernel compute the answer with PyTorch: "
                  "all of it belongs in your kernel"},
    speed=Speed(lambda: (randn((4096, 8192)), Out("out", (4096, 8192), torch.float32)),
                lambda args: softmax_cost(4096, 8192, 4), "course_utils.lessons.l05_online_softmax:softmax",
                "4096 x 8192, fp32")))
register(Exercise(
    "05.attention", "FlashAttention forward (bonus)", "attention(q, k, v, out, causal)", _attention_cases,
    max_launches=1,
    hint={"wrong": "scale the scores by 1/sqrt(D) (times log2(e) if you use exp2); keys >= S get -inf in "
                   "the last tile; causal: key j is visible to query i when j <= i; every tile, rescale "
                   "acc and l by exp(m_old - m_new) before adding the new tile; divide acc by l at the end",
          "nan": "a query row whose keys so far are all masked has m = -inf: subtract 0 instead of m there, "
                 "and start l at 0 and acc at 0",
          "unwritten": "one program per (BLOCK_M queries, batch * head): grid (cdiv(S, BLOCK_M) * B * H,), "
                       "each storing its BLOCK_M rows of out (masked past S)",
          "out_of_bounds": "mask queries >= S and keys >= S on the loads (other=0) and queries >= S on the "
                           "store; address q, k, v and out with their four strides each (they may be views)",
          "launches": "one kernel: QK^T, the online softmax and P @ V all stay in registers; the (S, S) "
                      "scores are never written",
          "host": "no torch matmul or softmax outside your kernel: the scores exist only inside your kernel",
          "fusion": "no (S, S) buffer: each tile of scores lives in registers, from tl.dot(q, k) to p @ v"},
    # One launch, and no buffer for the scores: a kernel that stored them and read them back passed.
    fusion=Fusion("QK^T, the online softmax and P @ V stay in registers, tile by tile: the (S, S) scores are "
                  "never written", _attention_scores, own_temporaries=lambda case: (), kept_buffers=True),
    speed=Speed(lambda: (*(randn((4, 16, 4096, 128), _half()) for _ in range(3)),
                         Out("out", (4, 16, 4096, 128), _half()), False),
                _attention_cost, "course_utils.lessons.l05_online_softmax:attention",
                "B, H, S, D = 4, 16, 4096, 128, bf16, not causal", roof="bf16")))
