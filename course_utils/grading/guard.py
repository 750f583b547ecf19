"""Watching a candidate while it runs: kernel launches, torch ops, and (in the interpreter) every address.

Three things the checker wants to know about a student's function, beyond its output:
- did it launch a Triton kernel at all (`launches`)?
- which torch operations did it run on the host (`torch_ops`)? `F.softmax(x)` copied into `out`
  gives the right numbers but teaches nothing, so kernel exercises reject it;
- in interpreter mode, did a kernel touch memory outside the tensors it was given? The interpreter
  does no bounds checking: an unmasked `tl.store` past the end of a buffer silently overwrites
  whatever lies there, and can abort the whole Python process later. So every masked load and store
  is checked against the storages of the launch's tensor arguments *before* it happens.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Host-side torch ops a kernel exercise may use: allocation, views and metadata, no arithmetic.
HOST_OPS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "zero_", "fill_", "full", "full_like", "ones", "new_zeros", "view", "_unsafe_view", "reshape",
    "_reshape_alias", "as_strided", "t", "transpose", "permute", "expand", "slice", "select",
    "unsqueeze", "squeeze", "detach", "alias", "lift_fresh", "resolve_conj", "resolve_neg",
    "_local_scalar_dense", "split", "chunk", "narrow", "unbind", "view_as", "expand_as",
    "is_nonzero", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "set_",
}


class OutOfBounds(RuntimeError):
    """A kernel in the interpreter reached for memory that none of its tensor arguments owns."""


@dataclass
class Watch:
    launches: list[str] = field(default_factory=list)  # names of the Triton kernels launched
    torch_ops: list[str] = field(default_factory=list)  # aten ops run outside kernel launches

    def compute_ops(self) -> list[str]:
        """The torch ops that did arithmetic or copies (not allocation, views, metadata)."""
        return sorted({op for op in self.torch_ops if op not in HOST_OPS})


class _RecordOps(TorchDispatchMode):
    def __init__(self, watch: Watch):
        super().__init__()
        self.watch = watch
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.watch.torch_ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# --- interpreter address checks ---------------------------------------------------------------

_active_ranges: list[list[tuple[int, int, str]]] = []  # a stack: one list of ranges per running launch


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _check_addresses(ptrs: np.ndarray, mask: np.ndarray, itemsize: int, what: str) -> None:
    if not _active_ranges:
        return
    addrs = np.asarray(ptrs, dtype=np.uint64)
    if mask is not None:
        addrs = addrs[np.broadcast_to(np.asarray(mask, dtype=bool), addrs.shape)]
    if addrs.size == 0:
        return
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
    raise OutOfBounds(
        f"{what} out of bounds: {int((~inside).sum())} address(es) outside every tensor argument, "
        f"the first {where}. Is a mask missing, or an offset or stride wrong?"
    )


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
    orig_call = executor_cls.__call__

    def store(self, ptrs, value, mask, *args, **kwargs):
        _check_addresses(ptrs.data, mask.data, value.data.dtype.itemsize, "tl.store")
        return orig_store(self, ptrs, value, mask, *args, **kwargs)

    def load(self, ptrs, mask, other, *args, **kwargs):
        itemsize = np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        _check_addresses(ptrs.data, mask.data, itemsize, "tl.load")
        return orig_load(self, ptrs, mask, other, *args, **kwargs)

    def call(self, *args, **kwargs):
        names = self.arg_names
        ranges = []
        for i, arg in enumerate(list(args) + list(kwargs.values())):
            if isinstance(arg, torch.Tensor):
                name = names[i] if i < len(names) else "tensor"
                ranges.append((*_storage_range(arg), name))
        _active_ranges.append(ranges)
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            _active_ranges.pop()

    builder_cls.create_masked_store, builder_cls.create_masked_load = store, load
    executor_cls.__call__ = call

    def undo():
        builder_cls.create_masked_store, builder_cls.create_masked_load = orig_store, orig_load
        executor_cls.__call__ = orig_call

    return undo


def _patch_launchers(watch: Watch, recorder: _RecordOps):
    """Count launches of @triton.jit functions (compiled or interpreted); pause op recording inside."""
    from triton.runtime.jit import JITFunction

    from triton.runtime.autotuner import Autotuner

    counted = [JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        counted.append(InterpretedFunction)
    # The autotuner's own timing loop allocates and clears buffers: pause recording there too.
    originals = {cls: cls.run for cls in (*counted, Autotuner)}

    def wrap(cls, orig):
        def run(self, *args, **kwargs):
            if cls in counted and not kwargs.get("warmup", False):
                watch.launches.append(getattr(self, "__name__", "kernel"))
            recorder.paused += 1
            try:
                return orig(self, *args, **kwargs)
            finally:
                recorder.paused -= 1

        return run

    for cls, orig in originals.items():
        cls.run = wrap(cls, orig)

    def undo():
        for cls, orig in originals.items():
            cls.run = orig

    return undo


@contextlib.contextmanager
def watching():
    """Record launches and torch ops of the code inside; guard interpreter memory accesses."""
    watch = Watch()
    recorder = _RecordOps(watch)
    undo_launch = _patch_launchers(watch, recorder)
    undo_interp = _patch_interpreter()
    try:
        with recorder:
            yield watch
    finally:
        undo_interp()
        undo_launch()
