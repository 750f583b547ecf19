"""Calling a submission's functions in its sandbox: the wire format and the sandbox's side.

The batch grader (batch.py) runs each notebook in a sandbox (sandbox.py) whose Python process is
`serve()` below: it executes the cells it is sent, one at a time, and when a cell calls
`check("NN.id", func)` it tells the grader, which then sends the inputs of each case (tensors as raw
bytes, the outputs as poisoned buffers with their guard regions) and takes back the bytes the call
left in every buffer, and whether it raised. Expected values, tolerances and verdicts never enter
the sandbox; the grader judges the bytes with the harness's own rules (harness.judge_kernel_case).

Frames on the pipes: 8 bytes big-endian length, then the bytes. A message is a JSON header frame
followed by `blobs` raw frames (the storages of the tensors it carries), then, once the grader has
sent the sandbox its key (before the notebook's first cell), a frame with the message's HMAC-SHA256
under that key. The notebook runs in the process that holds the pipes: its code could write a made-up
answer to a check on them (host torch in the outputs, facts that say a kernel ran) with no construct
the code scan flags; without the key, which only the grading code has, the grader refuses it.
Everything the grader reads from a sandbox is checked (sizes, dtypes, strides within their storage)
before use.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import os
import select
import struct
import time
import types
import weakref
from typing import Any

HEADER_MAX = 4 << 20  # a JSON header larger than this is a broken (or hostile) sandbox
RESULT_MAX = 256 << 20  # bytes of tensors a function exercise may return
# bytes of one call's inputs, which the grader sends (keyed): 09.kv_append's largest case on a GPU sends two
# (16, 8, 4100, 128) bf16 caches and the masks of their writable rows, 0.4 GB (RESULT_MAX refused it: every
# notebook's kernel "died" at that check)
ARGS_MAX = 1 << 30
BLOBS_MAX = 4096  # storages in one message (a flood of empty ones would fill the grader's memory)
LAUNCHES_MAX = 64  # kernel names a sandbox's backward reports (the grader needs to know there were some)
OPS_MAX = 256  # torch ops a sandbox's backward reports (which ones, not how often)
# Dimensions of a tensor sent either way: lesson 01's views have a case of 65, past NumPy's 64 (a limit of 8
# refused the grader's own input there, and the course's solution got 1/5 in a batch)
DIMS_MAX = 128
# NumPy scalars a function may return (Encoder: tagged, judged as themselves by the grader)
NUMPY_SCALARS = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                           "float16", "float32", "float64"})
PENDING_MAX = 4  # autograd outputs a sandbox keeps for the grader's backwards (the latest calls of a check)


class ProtocolError(Exception):
    """The other side sent something that is not a valid message (or went away)."""


class Closed(ProtocolError):
    """End of file: the other side exited."""


class TimedOut(Exception):
    pass


# --- frames -------------------------------------------------------------------------------------

class Channel:
    """Length-prefixed frames over two file descriptors, with deadlines on both directions."""

    def __init__(self, read_fd: int, write_fd: int, *, nonblocking: bool = False):
        self.read_fd, self.write_fd = read_fd, write_fd
        if nonblocking:  # the grader's side: a sandbox that stops reading must not block it forever
            os.set_blocking(write_fd, False)
            os.set_blocking(read_fd, False)
        self.deadline: float | None = None
        self._keyed: tuple | None = None  # HMAC-SHA256's inner and outer hashes of the key (authenticate)
        # An encoder and a decoder of its own: json.dumps and json.loads go through json's shared
        # _default_encoder and _default_decoder, objects that take methods of the notebook's in their own
        # dictionaries, which no snapshot of modules and classes sees (`json._default_encoder.encode = f`, no
        # flag, rewrote each message the checker sent before its MAC: host torch passed with its problems gone)
        self._encode, self._decode = json.JSONEncoder().encode, json.JSONDecoder().decode
        # Bound once, here: a method of the class replaced later (a spy that the next message sent would hand
        # this channel, key and all: check.__globals__["Channel"].send = spy) changes nothing for it.
        for name in ("send", "recv", "authenticate", "_mac", "_wait", "_write", "_read"):
            setattr(self, name, types.MethodType(getattr(Channel, name), self))

    def authenticate(self, key: bytes) -> None:
        """From now on each message sent ends with its HMAC-SHA256 under `key` (32 bytes), and each message
        received must. Only the key's two padded hashes are kept, as hashlib objects: later MACs are computed
        with their C methods (copy, update, digest), which no code of the notebook's can replace to see
        them."""
        pad = key.ljust(64, b"\0")
        self._keyed = (hashlib.sha256(bytes(b ^ 0x36 for b in pad)),
                       hashlib.sha256(bytes(b ^ 0x5C for b in pad)))

    def _mac(self, frames: list) -> bytes:
        inner, outer = self._keyed[0].copy(), self._keyed[1].copy()
        for frame in frames:
            inner.update(frame)
        outer.update(inner.digest())
        return outer.digest()

    def _wait(self, fd: int, write: bool) -> None:
        left = None if self.deadline is None else self.deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimedOut
        ready = select.select([], [fd], [], left) if write else select.select([fd], [], [], left)
        if not (ready[1] if write else ready[0]):
            raise TimedOut

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            self._wait(self.write_fd, True)
            try:
                n = os.write(self.write_fd, view[: 1 << 20])
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                raise Closed("the other side closed the pipe") from None
            view = view[n:]

    def _read(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            self._wait(self.read_fd, False)
            try:
                chunk = os.read(self.read_fd, min(n - got, 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise Closed("end of file")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def send(self, header: dict, blobs: list[bytes] = ()) -> None:
        data = self._encode({**header, "blobs": len(blobs)}).encode()
        frames = [struct.pack(">Q", len(data)), data]
        for blob in blobs:
            frames += [struct.pack(">Q", len(blob)), blob]
        if self._keyed is not None:  # first: a message without it fails at its first frame, not by a timeout
            mac = self._mac(frames)
            frames[:0] = [struct.pack(">Q", len(mac)), mac]
        for frame in frames:
            self._write(frame)

    def recv(self, *, blob_limit: int = RESULT_MAX) -> tuple[dict, list[bytes]]:
        mac = None
        if self._keyed is not None:
            (size,) = struct.unpack(">Q", self._read(8))
            if size != 32:
                raise ProtocolError(_UNKEYED)
            mac = self._read(size)
        (n,) = struct.unpack(">Q", self._read(8))
        if n > HEADER_MAX:
            raise ProtocolError(f"a message header of {n} bytes")
        data = self._read(n)
        try:
            header = self._decode(data.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an int of 5000 digits, [[[[...
            raise ProtocolError(f"a message that is not JSON ({str(exc)[:200]})") from None
        if not isinstance(header, dict) or not isinstance(header.get("blobs", 0), int):
            raise ProtocolError("a message that is not a JSON object")
        if header.get("blobs", 0) > BLOBS_MAX:
            raise ProtocolError(f"a message with more than {BLOBS_MAX} buffers")
        blobs, total, frames = [], 0, [struct.pack(">Q", n), data]
        for _ in range(max(0, header.get("blobs", 0))):
            size_frame = self._read(8)
            (size,) = struct.unpack(">Q", size_frame)
            total += size
            if total > blob_limit:
                raise ProtocolError(f"more than {blob_limit} bytes of data in one message")
            blobs.append(self._read(size))
            frames += [size_frame, blobs[-1]]
        if mac is not None and not hmac.compare_digest(mac, self._mac(frames)):
            raise ProtocolError(_UNKEYED)
        return header, blobs


_UNKEYED = ("a message without the MAC of the grading code's key: the notebook wrote to the grader's pipe "
            "itself")


# --- values -------------------------------------------------------------------------------------

def _dtype(name: Any):
    import torch

    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise ProtocolError(f"not a dtype: {name!r}")
    return value


def _storage_bytes(t) -> tuple[int, Any]:
    """(key, the bytes of the whole storage behind t, as a CPU uint8 tensor)."""
    import torch

    with torch._C.DisableTorchFunctionSubclass():
        storage = torch.Tensor.untyped_storage(t)
        raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
    return storage.data_ptr(), raw


def _past_broadcast_max(view_bytes: int, storage_bytes: int, limit: int | None) -> bool:
    """Whether a view's elements, in bytes, pass both its storage and `limit` (a broadcast that would
    become that many bytes once materialized); no limit: never."""
    return limit is not None and view_bytes > max(storage_bytes, limit)


class Encoder:
    """Turns call arguments (tensors, numbers, tuples...) into JSON plus one blob per storage.

    Tensors that share a storage (a view and its base, or the outputs' guarded buffers) share it on
    the other side too, so strides, offsets and guard regions arrive as they were.
    """

    def __init__(self, broadcast_max: int | None = None):
        self.keys: dict[int, int] = {}
        self.storages: list = []  # uint8 tensors over each storage, in order
        self.broadcast_max = broadcast_max  # a function's result: see Decoder

    def storage_index(self, t) -> int:
        key, raw = _storage_bytes(t)
        if key == 0 or key not in self.keys:  # data_ptr 0: an empty storage, never shared
            self.keys[key] = len(self.storages)
            self.storages.append(raw)
            return len(self.storages) - 1
        return self.keys[key]

    def encode(self, value: Any) -> Any:
        import numpy as np
        import torch

        if isinstance(value, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():
                limit = self.broadcast_max
                if _past_broadcast_max(value.numel() * value.element_size(), _storage_bytes(value)[1].numel(),
                                       limit):
                    raise TypeError(f"cannot send a broadcast tensor of {value.numel()} elements: more than "
                                    f"its storage holds, and more than {limit >> 20} MiB")
                meta = {"t": "tensor", "s": self.storage_index(value),
                        "dtype": str(value.dtype).replace("torch.", ""),
                        "size": list(value.shape), "stride": list(value.stride()),
                        "offset": value.storage_offset()}
                if value.requires_grad and value.is_leaf:  # a parameter the check differentiates
                    meta["grad"] = True
            if type(value) is not torch.Tensor and hasattr(value, "_reads"):
                meta["wrap"] = f"{type(value).__module__}:{type(value).__qualname__}"
            return meta
        if isinstance(value, torch.dtype):
            return {"t": "dtype", "name": str(value).replace("torch.", "")}
        if isinstance(value, np.generic) and value.dtype.name in NUMPY_SCALARS:  # first: np.float64 is a float
            item = value.item()
            return {"t": "numpy", "dtype": value.dtype.name, "v": repr(item) if isinstance(item, float) else item}
        if isinstance(value, bool | int | str) or value is None:
            return value
        if isinstance(value, float):
            return {"t": "float", "v": repr(value)}
        if isinstance(value, tuple | list):
            return {"t": type(value).__name__, "items": [self.encode(v) for v in value]}
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return {"t": "dict", "items": {k: self.encode(v) for k, v in value.items()}}
        raise TypeError(f"cannot send a {type(value).__name__} to or from a sandbox")

    def blobs(self) -> list[bytes]:
        return [raw.cpu().numpy().tobytes() for raw in self.storages]


class Decoder:
    """The other side of Encoder: storages from blobs (or existing ones), then values over them."""

    def __init__(self, storages: list, device: str, broadcast_max: int | None = None):
        self.storages = storages  # uint8 tensors
        self.device = device
        # Set where the grader rebuilds what a sandbox returned (a function exercise's result, RESULT_MAX): a
        # broadcast view (stride 0) holds more elements than its storage, and 4 bytes sent as a tensor of
        # 2^33 elements, which the grader copies (08.rmsnorm_train's output: clone), were 32 GiB of the
        # grader's own memory, past every limit of the sandbox's. At most its storage's bytes, or this many.
        # (Not the grader's own inputs: a case's broadcast operand on a GPU may be larger.)
        self.broadcast_max = broadcast_max

    @classmethod
    def from_blobs(cls, blobs: list[bytes], device: str, *, first: list | None = None,
                   broadcast_max: int | None = None) -> Decoder:
        import torch

        made = [torch.frombuffer(bytearray(b), dtype=torch.uint8).to(device) if b
                else torch.empty(0, dtype=torch.uint8, device=device) for b in blobs]
        return cls(list(first or []) + made, device, broadcast_max)

    def decode(self, value: Any, wrap_ok: bool = False) -> Any:
        import torch

        if value is None or isinstance(value, bool | int | str):
            return value
        if not isinstance(value, dict):
            raise ProtocolError(f"unexpected value {type(value).__name__}")
        kind = value.get("t")
        if kind == "float":
            try:
                return float(value["v"])
            except (TypeError, ValueError, KeyError):
                raise ProtocolError("a float that is no float") from None
        if kind == "dtype":
            return _dtype(value.get("name"))
        if kind == "numpy":
            return _numpy_scalar(value)
        if kind in ("tuple", "list"):
            items = [self.decode(v, wrap_ok) for v in _list(value.get("items"))]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            items = value.get("items")
            if not isinstance(items, dict):
                raise ProtocolError("a dict without items")
            return {str(k): self.decode(v, wrap_ok) for k, v in items.items()}
        if kind == "tensor":
            return self._tensor(value, wrap_ok)
        raise ProtocolError(f"unknown value kind {kind!r}")

    def _tensor(self, meta: dict, wrap_ok: bool):
        import torch

        index, dtype = meta.get("s"), _dtype(meta.get("dtype"))
        size, stride, offset = _list(meta.get("size")), _list(meta.get("stride")), meta.get("offset")
        ints = [index, offset, *size, *stride]
        if (not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ints)
                or len(size) != len(stride) or index >= len(self.storages) or len(size) > DIMS_MAX):
            raise ProtocolError("a tensor with an invalid layout")
        raw = self.storages[index]
        itemsize = torch.empty(0, dtype=dtype).element_size()
        last = offset + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else offset - 1
        if (last + 1) * itemsize > raw.numel():
            raise ProtocolError("a tensor that reaches past its storage")
        limit = self.broadcast_max
        if _past_broadcast_max(math.prod(size) * itemsize, raw.numel(), limit):
            raise ProtocolError(f"a broadcast tensor of more elements than its storage and {limit >> 20} MiB")
        t = torch.empty(0, dtype=dtype, device=raw.device).set_(raw.untyped_storage(), offset, size, stride)
        if meta.get("grad") is True and dtype.is_floating_point:
            t.requires_grad_(True)
        wrap = meta.get("wrap")
        if wrap is not None:
            t = _wrapped(t, wrap) if wrap_ok else t
        return t


def _numpy_scalar(meta: dict):
    """A NumPy scalar as the sandbox's function returned it (np.cumprod's np.int64s, an np.float32): judged as
    itself, with the interactive check's message ("return Python ints ..."), not as an unsendable object."""
    import numpy as np

    name, item = meta.get("dtype"), meta.get("v")
    if name not in NUMPY_SCALARS:
        raise ProtocolError(f"not a NumPy scalar type: {str(name)[:40]!r}")
    floating = np.dtype(name).kind == "f"
    try:
        if floating and isinstance(item, str):
            return np.dtype(name).type(float(item))
        if not floating and isinstance(item, int) and (name == "bool") == isinstance(item, bool):
            return np.dtype(name).type(item)
    except (OverflowError, ValueError):
        pass
    raise ProtocolError(f"a NumPy {name} that is none")


def _list(value) -> list:
    if not isinstance(value, list):
        raise ProtocolError("expected a list")
    return value


def _int(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError("expected an integer")
    return value


def _wrapped(t, wrap: str):
    """A course input wrapper (e.g. the tensor that logs its reads) around t: only classes of
    course_utils.checks with a `watch` constructor."""
    import importlib

    module, _, name = str(wrap).partition(":")
    if not module.startswith("course_utils.checks."):
        raise ProtocolError(f"refused wrapper {wrap!r}")
    cls = getattr(importlib.import_module(module), name, None)
    if cls is None or not hasattr(cls, "watch"):
        raise ProtocolError(f"no wrapper {wrap!r}")
    return cls.watch(t)


def copy_back(storages: list, blobs: list[bytes]) -> None:
    """Overwrite each storage (uint8 tensors) with the bytes the sandbox sent back for it."""
    import torch

    if len(blobs) < len(storages):
        raise ProtocolError(f"{len(blobs)} buffers came back, {len(storages)} were sent")
    for raw, blob in zip(storages, blobs):
        if len(blob) != raw.numel():
            raise ProtocolError(f"a buffer of {raw.numel()} bytes came back with {len(blob)}")
        if blob:
            raw.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(raw.device))


# --- the sandbox's side -------------------------------------------------------------------------

class _Spec:
    """What the candidate's side needs to know of an exercise (no cases, no expected values)."""

    def __init__(self, data: dict):
        self.id = str(data.get("id", ""))
        self.signature = str(data.get("signature", ""))
        self.params = [str(p) for p in data.get("params", [])]
        self.func_name = self.signature.split("(", 1)[0]
        self.kernel = bool(data.get("kernel", True))
        self.allowed_ops = tuple(data.get("allowed_ops", ()))
        self.forbidden_ops = tuple(data.get("forbidden_ops", ()))
        self.forbidden_dtypes = tuple(_dtype(d) for d in data.get("forbidden_dtypes", ()))
        self.forbidden_calls = tuple(str(c) for c in data.get("forbidden_calls", ()))
        self.max_launches = data.get("max_launches")
        self.needs_kernels = data.get("needs_kernels") is True
        self.host_arithmetic = data.get("host_arithmetic") is not False


def spec_of(ex) -> dict:
    return {"id": ex.id, "signature": ex.signature, "params": ex.params, "kernel": ex.kernel,
            "allowed_ops": list(ex.allowed_ops), "forbidden_ops": list(ex.forbidden_ops),
            "forbidden_dtypes": [str(d).replace("torch.", "") for d in getattr(ex, "forbidden_dtypes", ())],
            "forbidden_calls": list(getattr(ex, "forbidden_calls", ())),
            "max_launches": ex.max_launches, "needs_kernels": bool(getattr(ex, "needs_kernels", False)),
            "host_arithmetic": bool(getattr(ex, "host_arithmetic", True))}


def problems_out(problems) -> list:
    """Problems (harness.Problem: text and kind) as JSON pairs."""
    return [[str(p), getattr(p, "kind", "wrong")] for p in problems]


def problems_in(pairs) -> list:
    from .harness import KINDS, Problem

    found = []
    for pair in _list(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ProtocolError("a problem that is not [text, kind]")
        found.append(Problem(pair[0], pair[1] if pair[1] in KINDS else "wrong"))
    return found


def facts_out(facts) -> dict:
    return {"returned": facts.returned, "returned_other": bool(facts.returned_other),
            "host": problems_out(facts.host), "changed_later": list(facts.changed_later),
            "launched": [{"name": x.name, "module": x.module, "shapes": [list(s) for s in x.shapes],
                          "inputs": list(x.inputs), "bases": [list(s) for s in x.bases],
                          "storages": list(x.storages), "storage_bytes": list(x.storage_bytes),
                          "params": list(x.params)}
                         for x in facts.launched],
            "allocations": [{"op": a.op, "shape": list(a.shape), "dtype": str(a.dtype).replace("torch.", ""),
                             "site": a.site, "storage": a.storage} for a in facts.allocations]}


def facts_in(data) -> Any:
    """harness.CallFacts from what a sandbox reported (checked: wrong types are a protocol error)."""
    from .guard import Allocation, Launch
    from .harness import CallFacts

    if not isinstance(data, dict):
        raise ProtocolError("facts that are not an object")

    def ints(xs) -> tuple:
        xs = _list(xs)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in xs):
            raise ProtocolError("a shape that is not a list of ints")
        return tuple(xs)

    def flags(xs) -> tuple:
        xs = _list(xs)
        if not all(isinstance(x, bool) for x in xs):
            raise ProtocolError("an input flag that is not a boolean")
        return tuple(xs)

    def text(x) -> str:
        if not isinstance(x, str):
            raise ProtocolError("a text that is not a string")
        return x

    returned = data.get("returned")
    return CallFacts(
        returned=None if returned is None else text(returned),
        returned_other=data.get("returned_other") is True,
        host=problems_in(data.get("host", [])),
        changed_later=[text(n) for n in _list(data.get("changed_later", []))],
        launched=[Launch(text(x.get("name")), text(x.get("module")), tuple(ints(s) for s in _list(x.get("shapes"))),
                         flags(x.get("inputs", [])), tuple(ints(s) for s in _list(x.get("bases", []))),
                         ints(x.get("storages", [])), ints(x.get("storage_bytes", [])),
                         tuple(text(n)[:200] for n in _list(x.get("params", []))))
                  for x in _list(data.get("launched", [])) if isinstance(x, dict)],
        allocations=[Allocation(text(a.get("op")), ints(a.get("shape")), _dtype(a.get("dtype")), text(a.get("site")),
                                _int(a.get("storage", 0)))
                     for a in _list(data.get("allocations", [])) if isinstance(a, dict)],
    )


class Integrity:
    """The sandbox's own code and what it relies on, as they were before the notebook's first cell.

    The notebook runs in the process that watches its calls, so it could replace the watcher in memory
    (`harness._host_problems = lambda *a: []`, a wrapped `json.dumps`, a patched Triton launcher) and
    have the facts sent to the grader say what it likes. Before and after every call the attributes of
    these modules and classes are compared with the snapshot; any change is put back and reported, and
    the grader gives no credit for that call. (Code that reaches the snapshot itself, through gc,
    frames or ctypes, is beyond this: those constructs are flagged by the grader's scan.)

    An attribute compared by identity alone misses a change made inside it: the watcher's rule tables
    (`guard.HOST_OPS.update({"add"})` had host arithmetic pass unseen), its stacks of active watches,
    `course_utils.__path__`. The rule tables are frozen (frozenset, MappingProxyType); every list, dict,
    set and bytearray the snapshot holds is also copied, compared item by item (by identity: no code of
    the notebook's runs while comparing) and put back, except the state that changes honestly (LIVE).
    """

    # Changed by honest use between the snapshot and a check: exercises registered when a notebook imports
    # an earlier lesson's module, the timings progress() shows, the builtins IPython adds while a cell
    # runs, warnings already shown, the Triton interpreter's cache of rewritten kernels.
    LIVE = frozenset({"REGISTRY", "MEASURED", "SOLUTION_MEASURED", "__builtins__", "__warningregistry__",
                      "rewritten_fn", "__dict__", "__weakref__"})
    CONTAINERS = (list, dict, set, bytearray)

    # Modules whose every attribute (and the classes they define) is kept; then single attributes of the
    # libraries the watcher calls, every function of numpy and torch, and classes.
    MODULES = ("course_utils", "course_utils.mode", "course_utils.grading", "course_utils.grading.harness",
               "course_utils.grading.guard", "course_utils.grading.remote", "course_utils.grading.provenance",
               "json", "json.encoder", "torch.utils._python_dispatch")
    ATTRIBUTES = {"os": ("read", "write", "dup", "dup2", "set_blocking"), "select": ("select",),
                  "struct": ("pack", "unpack"), "numpy": ("ctypeslib",), "numpy.ctypeslib": ("as_array",)}
    # Every function and class of these, which the watcher's own code calls at every turn (the byte tracker's
    # np.zeros, np.full and np.unique, torch.from_numpy): `np.full = f`, no flag, was no change before. Not what
    # the libraries rebind themselves when a notebook uses them (torch._dynamo wraps torch.manual_seed).
    EVERY_FUNCTION = ("numpy", "torch")
    REBOUND = frozenset({"manual_seed"})
    CLASSES = ("torch:Tensor", "torch:UntypedStorage", "torch.storage:_StorageBase",
               "torch.overrides:TorchFunctionMode", "triton.runtime.jit:JITFunction",
               "triton.runtime.autotuner:Autotuner", "triton.runtime.autotuner:Config",
               "triton.runtime.interpreter:InterpreterBuilder", "triton.runtime.interpreter:GridExecutor",
               "triton.runtime.interpreter:InterpretedFunction")

    def __init__(self):
        import builtins
        import importlib
        import sys

        self.sys_modules = {name: sys.modules[name] for name in self.MODULES if name in sys.modules}
        self.saved: list[tuple[Any, str, dict]] = []
        for name, module in self.sys_modules.items():
            self.saved.append((module, name, dict(vars(module))))
            for value in list(vars(module).values()):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    self.saved.append((value, f"{name}.{value.__qualname__}", dict(vars(value))))
        for name, attrs in self.ATTRIBUTES.items():
            module = importlib.import_module(name)
            self.saved.append((module, name, {a: vars(module)[a] for a in attrs if a in vars(module)}))
        for name in self.EVERY_FUNCTION:
            module = importlib.import_module(name)
            self.saved.append((module, name, {a: v for a, v in vars(module).items() if a not in self.REBOUND
                                              and callable(v) and not isinstance(v, types.ModuleType)}))
        self.saved.append((builtins, "builtins", _builtin_functions()))
        for path in self.CLASSES:
            module, _, cls = path.partition(":")
            with contextlib.suppress(ImportError, AttributeError):
                value = getattr(importlib.import_module(module), cls)
                self.saved.append((value, f"{module}.{cls}", dict(vars(value))))
        self.contents = [(value, f"{name}.{key}", _contents(value))
                         for _, name, saved in self.saved for key, value in saved.items()
                         if key not in self.LIVE and isinstance(value, self.CONTAINERS)]
        # Saved whole (every attribute, not a few): a name added later may hide one the code looks up, which
        # comparing the saved names never sees. A class's that hides an inherited method (torch.Tensor.numpy =
        # f, over TensorBase's: the sandbox sends every output back through raw.cpu().numpy(), and f wrote the
        # host's answer into the bytes after the checker's last look), a module's that hides a builtin
        # (guard.sorted = f: the module's code finds its global before the builtin).
        self.whole = [(obj, name, frozenset(saved)) for obj, name, saved in self.saved
                      if obj is not builtins and name not in self.ATTRIBUTES and name not in self.EVERY_FUNCTION]
        self.builtin_names = frozenset(vars(builtins))

    def restore(self) -> list[str]:
        """Put back what changed since the snapshot; returns what that was ("harness._host_problems")."""
        import sys

        changed = []
        for name, module in self.sys_modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
                changed.append(f"sys.modules[{name!r}]")
        for obj, name, saved in self.saved:
            now = vars(obj)
            for key, value in saved.items():
                if now.get(key, _MISSING) is not value and key not in ("__dict__", "__weakref__"):
                    changed.append(f"{name}.{key}")
                    try:
                        setattr(obj, key, value)
                    except (AttributeError, TypeError):
                        pass
        for value, name, copy in self.contents:
            if not _same_contents(value, copy):
                changed.append(f"{name} (its contents)")
                _put_back(value, copy)
        for obj, name, saved in self.whole:
            for key in list(vars(obj)):  # no code of the notebook's runs: keys of another type than str are new
                if type(key) is str and (key in saved or key in self.LIVE):
                    continue
                if type(key) is str and not (self._hides_builtin(obj, key) or self._hides_inherited(obj, key)):
                    continue  # a name of its own (a submodule imported later): nothing looks it up in its place
                changed.append(f"{name}.{key!s} (added)")
                with contextlib.suppress(AttributeError, TypeError, KeyError):
                    if isinstance(obj, type):
                        delattr(obj, key)
                    else:
                        del vars(obj)[key]
        return changed

    def _hides_builtin(self, obj, key: str) -> bool:
        return not isinstance(obj, type) and key in self.builtin_names

    @staticmethod
    def _hides_inherited(obj, key: str) -> bool:
        return isinstance(obj, type) and any(key in vars(base) for base in type.__dict__["__mro__"].__get__(obj)[1:])


_MISSING = object()

# Audit events of a hook that Python calls on every function call, line and return of every frame: a trace
# or profile function sees the checker's own frames while it watches (the CallFacts it is about to send, its
# lists of problems) and can change them. The scan flags them ("frames"); these events say one was set.
HOOK_EVENTS = frozenset({"sys.settrace", "sys.setprofile", "sys._settraceallthreads", "sys._setprofileallthreads",
                         "sys.monitoring.register_callback"})


def watch_hooks():
    """Install (once, in the sandbox, before the notebook's first cell) what sees the notebook's code run inside
    the checker's own, where it can change the facts about to be sent (the host problems of a CallFacts):
    - an audit hook that notes every trace or profile hook set (sys.settrace, sys.setprofile,
      threading.settrace's in a new thread, sys.monitoring); one set and removed between two checks (an
      honest %prun) is forgotten when a check starts with none in place;
    - the signal handlers and interval timers as they were: a notebook's handler, run by a timer while the
      checker works, is handed the frame it interrupted (and from it the checker's). One found at a look is
      put back and reported.
    - torch's stacks of modes: a TorchFunctionMode (or TorchDispatchMode) of the notebook's, entered around a
      check or left entered, is handed every torch call of the checker's after its watch, the sandbox's
      raw.cpu().numpy() of each output among them, and answered those with the host's answer (a kernel that
      copied x passed 02.relu). One found at a look is reported (not removed: the notebook's `with` leaves it);
      torch's own DeviceContext (`torch.set_default_device`, `with torch.device(...)`) is no hook.
    Returns `hooks(start)`: what may have run inside the checker since it last asked ([] when nothing). An
    audit hook cannot be removed, and what it notes is in this closure only; the functions it looks with are
    bound now, before a notebook could replace them. The checker's own profile hook (harness._calls_to) is
    known by its code. (A handler that removes itself and its timer before the
    next look is not seen: the scan flags it, "signals" and "frames".)"""
    import signal
    import sys

    from .harness import _calls_to

    seen: list[str] = []
    gettrace, getprofile, caller = sys.gettrace, sys.getprofile, sys._getframe
    own = _calls_to.__wrapped__.__code__  # the checker's own profile hook (forbidden_calls of function exercises)
    getsignal, set_handler, getitimer, setitimer = signal.getsignal, signal.signal, signal.getitimer, signal.setitimer
    handlers = {n: getsignal(n) for n in signal.valid_signals() if n not in (signal.SIGKILL, signal.SIGSTOP)}
    timers = {name: getattr(signal, name) for name in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")}
    import torch
    from torch.utils._device import DeviceContext

    stacks = ((torch._C._len_torch_function_stack, torch._C._get_function_stack_at),
              (torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at))

    def audit(event, args):
        if event in HOOK_EVENTS and caller(1).f_code is not own:  # 1: the code that called sys.setprofile
            seen.append(event)

    sys.addaudithook(audit)

    def hooks(start: bool = False) -> list[str]:
        active = [name for name, get in (("sys.settrace", gettrace), ("sys.setprofile", getprofile))
                  if get() is not None]
        if start and not active:
            seen[:] = [event for event in seen if event.startswith("sys.monitoring")]
        found = [f"{event} (a hook that runs inside the checker's own code)"
                 for event in dict.fromkeys([*active, *seen])]
        # The timers stopped first: SIGALRM's default handler ends the process, and a timer still running
        # when it is put back killed the sandbox ("kernel died" instead of the finding)
        stopped = [name for name, which in timers.items() if getitimer(which) != (0.0, 0.0)]
        for name in stopped:
            setitimer(timers[name], 0)
        for number, handler in handlers.items():
            if getsignal(number) is not handler:
                set_handler(number, signal.SIG_DFL if handler is None else handler)  # None: not set from Python
                found.append(f"a handler of {signal.Signals(number).name} (it runs inside the checker's own code)")
        found += [f"signal.{name}'s timer" for name in stopped]
        for length, at in stacks:
            for mode in [at(i) for i in range(length())]:
                if type(mode) is not DeviceContext:  # str.__str__: a name of the notebook's runs no code of its own
                    found.append(f"the torch mode {str.__str__(type(mode).__name__)} (it runs inside the checker's "
                                 "own code)")
        return found

    return hooks


def _builtin_functions() -> dict:
    """Every function and type of the builtins module (sorted, any, len, isinstance, __import__, ...),
    which the watcher's code looks up each time it runs: a notebook that reached the module
    (globals()["__builtins__"] is a string to the scan) and replaced `sorted` had Watch.compute_ops() find
    no torch op, and host arithmetic passed 02.vector_add. Not what IPython puts in and takes out around
    each cell (exit, quit, get_ipython: objects of its own, no builtin function)."""
    import builtins
    import types

    return {name: value for name, value in vars(builtins).items()
            if isinstance(value, types.BuiltinFunctionType | type) and name.strip("_")}  # not `_`: a result


def _contents(value):
    """A copy of a container's items, to compare with and to put back (Integrity)."""
    if isinstance(value, dict):
        return list(dict.items(value))
    if isinstance(value, bytearray):
        return bytes(value)
    return list(set.copy(value)) if isinstance(value, set) else list.copy(value)


def _same_contents(value, copy) -> bool:
    """Has the container the same items as its copy, the same objects? Only the builtin types' own methods
    run, never a method the notebook could define (a subclass's, an item's __eq__)."""
    if isinstance(value, bytearray):
        return bytes(value) == copy
    now = _contents(value)
    if len(now) != len(copy):
        return False
    if isinstance(value, set):
        ids = {id(item) for item in copy}
        return all(id(item) in ids for item in now)
    if isinstance(value, dict):
        return all(_same(a[0], b[0]) and _same(a[1], b[1]) for a, b in zip(now, copy))
    return all(_same(a, b) for a, b in zip(now, copy))


def _same(a, b) -> bool:
    """The same object, or equal numbers or strings of the builtin types (a counter back at 300 is another
    int object): their == is the interpreter's own."""
    return a is b or type(a) is type(b) and type(a) in (int, float, str, bytes, bool) and a == b


def _put_back(value, copy) -> None:
    for kind in (dict, set, list, bytearray):  # the builtin type's methods, whatever a subclass defines
        if isinstance(value, kind):
            kind.clear(value)
            if kind is dict:
                dict.update(value, copy)
            elif kind is set:
                set.update(value, copy)
            else:
                kind.extend(value, copy)
            return


def _tampered(changed: list[str]) -> dict:
    changed = list(dict.fromkeys(changed))  # a hook is seen at each look
    shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    text = (f"the notebook changed the checker's own code or the libraries it relies on in memory ({shown}): "
            "no credit for a check that cannot trust what it observed")
    return {"op": "raised", "message": text, "raised": None, "problems": [[text, "host"]], "candidate": False}


def autograd_out(fn, args, output=None, before: dict[int, int] | None = None, names=()) -> dict:
    """What a check of an autograd output looks at, from the sandbox: the node's kind, the tensors it
    saved (each an input of the call, by position, or a shape and dtype), and the memory it keeps alive
    besides the call's tensors and its output (kept_alive: [bytes, what] each). Those are skipped whole,
    but not what lies beyond them in their storages: the rest of a larger buffer the output is a view of,
    or what an input's storage grew by in the call (before: {position: its storage's bytes before the call};
    names: the parameters' names)."""
    import torch

    def describe(t) -> dict:
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                return {"input": i}
        return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}

    info: dict = {"function": isinstance(fn, torch.autograd.function.BackwardCFunction), "saved": [], "attrs": {}}
    try:
        info["saved"] = [describe(t) for t in fn.saved_tensors]
    except RuntimeError as exc:
        info["saved_error"] = str(exc)[:500]
    if hasattr(fn, "__dict__"):
        info["attrs"] = {str(k).replace(".", "_"): describe(v) for k, v in ctx_tensors(vars(fn))}
    skip = {a.untyped_storage().data_ptr() for a in (*args, output) if isinstance(a, torch.Tensor)}
    kept = kept_alive(fn, skip)
    own = [(names[i] if i < len(names) else f"argument {i}", args[i], nbytes) for i, nbytes in (before or {}).items()]
    kept.update(storage_rests(own, output if isinstance(output, torch.Tensor) else None))
    info["kept"] = [[nbytes, what] for nbytes, what in list(kept.values())[:64]]
    return info


def storage_rests(inputs, output=None) -> dict[int, tuple[int, str]]:
    """{storage address: (bytes, what)} of the memory past what the call's own tensors take in their storages,
    which kept_alive skips whole as theirs: what an input's storage grew by in the call (inputs: [(name,
    tensor, its storage's bytes before the call)], resize_ keeps a copy there), and the rest of a larger
    buffer the output is a view of."""
    rests = {}
    own = [(name, t, nbytes, "had before the call") for name, t, nbytes in inputs]
    if output is not None:
        own.append(("the output", output, output.numel() * output.element_size(),
                    "takes: a view of a larger buffer"))
    for name, t, nbytes, takes in own:
        storage = t.untyped_storage()
        rest = storage.nbytes() - nbytes
        if rest > 0:
            rests.setdefault(storage.data_ptr(), (rest, f"{name}'s storage, {rest} bytes more than {name} {takes}"))
    return rests


KEPT_OBJECTS = 20000  # objects the search for what an autograd node keeps looks at, at most
# The grader's stand-in classes (autograd_in), by address, known by identity: kept_alive answers for one with
# what the sandbox found. It once trusted any Function class with a `kept_in_sandbox` attribute: a notebook's
# own that said `kept_in_sandbox = {}` kept a copy of x-hat alive unseen (08.rmsnorm_train's memory rule).
_STAND_INS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def kept_alive(fn, skip: set[int]) -> dict[int, tuple[int, str]]:
    """{address: (bytes, what)} of the memory an autograd node keeps alive, however the forward stored it:
    its saved tensors, and every tensor, storage or NumPy array reachable from ctx's attributes and from
    its Function class's data attributes (inside containers, objects, closures, generators, attributes put
    on tensors), each storage counted once, whole (a 1-element view keeps all of it). Module globals, classes
    and frames are not followed; but what the call that returned the node allocated (guard.note_made) counts
    wherever it is held. skip: storage addresses not counted (x, weight, the output). The batch grader's
    stand-in for a node that lives in a sandbox answers with what the sandbox found (autograd_out)."""
    import gc
    import sys

    import numpy as np
    import torch

    from .guard import made_by_call

    forward_cls = getattr(fn, "_forward_cls", None)
    if _STAND_INS.get(id(forward_cls)) is forward_cls:  # the grader's own stand-in: the sandbox looked
        return dict(vars(forward_cls)["kept_in_sandbox"])
    module_dicts = {id(vars(m)) for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    try:
        stack = list(fn.saved_tensors)
    except RuntimeError:
        stack = []
    stack.append(getattr(fn, "__dict__", {}))
    if isinstance(forward_cls, type):  # its attributes (F.cache = [...]), not its methods' closures: a batch
        # grader's stand-in class (remote.autograd_in) closes over the grader's own channel and arguments
        stack += [v for v in vars(forward_cls).values()
                  if not isinstance(v, types.FunctionType | staticmethod | classmethod | property)]
    found, seen = {}, set()
    while stack and len(seen) < KEPT_OBJECTS:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in module_dicts:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor | torch.UntypedStorage | torch.TypedStorage):
            try:
                storage = obj.untyped_storage() if isinstance(obj, torch.Tensor | torch.TypedStorage) else obj
                address, nbytes = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError):  # meta, sparse: no memory of their own
                continue
            what = f"{tuple(obj.shape)} {str(obj.dtype)[6:]}" if isinstance(obj, torch.Tensor) else "a storage"
            if address not in skip and nbytes:
                found.setdefault(address, (nbytes, what))
            stack += list(getattr(obj, "__dict__", {}).values())  # ctx.x = x; x.xhat = xhat
        elif isinstance(obj, np.ndarray):
            found.setdefault(obj.__array_interface__["data"][0], (obj.nbytes, f"a NumPy array {obj.shape}"))
        elif isinstance(obj, types.FunctionType):  # its closure and defaults, not its module's globals
            stack += [obj.__closure__ or (), obj.__defaults__ or (), obj.__kwdefaults__ or {}, obj.__dict__]
        elif isinstance(obj, types.GeneratorType | types.CoroutineType):
            frame = obj.gi_frame if isinstance(obj, types.GeneratorType) else obj.cr_frame
            stack += list(frame.f_locals.values()) if frame is not None else []
        elif not isinstance(obj, type | types.ModuleType | types.CodeType | types.FrameType
                            | types.TracebackType | str | bytes):
            stack += gc.get_referents(obj)
    # What the forward allocated and something still holds, wherever: a module's global, a cache keyed by ctx
    # (a WeakKeyDictionary), a class elsewhere. A live tensor at an address the call allocated is that
    # allocation (two live storages never share an address).
    made = {address: nbytes for address, nbytes in made_by_call(fn).items()
            if address not in skip and address not in found}
    if made:
        gc.collect()  # what only garbage cycles hold (the Triton interpreter's copies of launch arguments)
    for obj in gc.get_objects() if made else ():
        # by type(obj), not isinstance: some objects answer isinstance's __class__ with a warning (torch's
        # deprecated distributed.reduce_op), which the student would see
        if issubclass(type(obj), torch.Tensor | torch.UntypedStorage):
            with contextlib.suppress(RuntimeError, NotImplementedError):
                address = (obj.untyped_storage() if isinstance(obj, torch.Tensor) else obj).data_ptr()
                if address in made and address not in found:
                    what = (f"{tuple(obj.shape)} {str(obj.dtype)[6:]}" if isinstance(obj, torch.Tensor)
                            else "a storage")
                    found[address] = (made[address], f"{what} made by the forward and held outside ctx "
                                                     "(a global or a cache?)")
    return found


def ctx_tensors(attrs: dict, limit: int = 64) -> list:
    """(name, tensor) of every tensor an autograd node's attributes hold, also inside lists, tuples, sets and
    dicts (ctx.cache = [xhat] keeps xhat as surely as ctx.xhat = xhat); names like "cache.0"."""
    import torch

    found, stack = [], [(str(k), v, 0) for k, v in attrs.items()]
    while stack and len(found) < limit:
        name, value, depth = stack.pop()
        if isinstance(value, torch.Tensor):
            found.append((name, value))
        elif depth < 4 and isinstance(value, (list, tuple, set, frozenset)):
            stack += [(f"{name}.{i}", v, depth + 1) for i, v in enumerate(value)]
        elif depth < 4 and isinstance(value, dict):
            stack += [(f"{name}.{k}", v, depth + 1) for k, v in value.items()]
    return found


def autograd_in(chan: Channel, y, info: dict, args: list, device: str):
    """The grader's stand-in for an autograd output that lives in the sandbox: y's values, a node of the
    same kind saving stand-ins of what the sandbox's node saved, and a backward that asks the sandbox
    for the gradients (which land in the grader's own parameters)."""
    import threading

    import torch

    from .guard import record_launches
    from .harness import KINDS

    owner = threading.get_ident()  # the thread grading this notebook: autograd may run the backward on another
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not info.get("function") is True:  # plain torch autograd: a node of torch's own
        return y.detach().clone().requires_grad_(True) * 1 if y.dtype.is_floating_point else y

    def stand_in(meta):
        if not isinstance(meta, dict):
            raise ProtocolError("a saved tensor that is not described")
        index = meta.get("input")
        if isinstance(index, int) and 0 <= index < len(args) and isinstance(args[index], torch.Tensor):
            return args[index]
        shape = _list(meta.get("shape"))
        if not all(isinstance(n, int) and 0 <= n < 1 << 40 for n in shape) or len(shape) > 8:
            raise ProtocolError("a saved tensor with an invalid shape")
        # its numel and device (a check may set it beside x), no memory
        return torch.zeros(1, dtype=_dtype(meta.get("dtype")), device=device).expand(shape)

    class Sandboxed(torch.autograd.Function):
        # what the sandbox's node keeps alive (kept_alive there), for the check's own kept_alive(fn)
        kept_in_sandbox = {i: (kept[0], str(kept[1])[:80]) for i, kept in enumerate(_list(info.get("kept", []))[:64])
                           if isinstance(kept, list) and len(kept) == 2 and isinstance(kept[0], int)
                           and not isinstance(kept[0], bool) and 0 <= kept[0] < 1 << 50}

        @staticmethod
        def forward(ctx, values, *params):
            error = info.get("saved_error")
            if error is None:
                ctx.save_for_backward(*[stand_in(m) for m in _list(info.get("saved", []))])
            for name, meta in dict(info.get("attrs") or {}).items():
                if str(name).isidentifier() and not str(name).startswith("_"):
                    setattr(ctx, str(name), stand_in(meta))
            return values.clone()

        @staticmethod
        def backward(ctx, grad):
            enc = Encoder()
            chan.send({"op": "backward", "call": info.get("call"), "device": device, "grad": enc.encode(grad)},
                      enc.blobs())
            msg, blobs = chan.recv()
            if msg.get("op") == "raised":
                raise RuntimeError(str(msg.get("raised") or msg.get("message", ""))[:2000])
            if msg.get("op") != "grads":
                raise ProtocolError(f"unexpected {str(msg.get('op'))[:40]!r}")
            decoder = Decoder.from_blobs(blobs, device)
            grads = [decoder.decode(g) for g in _list(msg.get("grads"))]
            if len(grads) != len(args):
                raise ProtocolError("gradients for a different number of arguments")
            # The kernels the sandbox's backward launched (with the modules that defined them) and the torch
            # ops its host code ran, for a check that watches the backward
            launched = [(str(pair[0])[:80], str(pair[1])[:200])
                        for pair in _list(msg.get("launched"))[:LAUNCHES_MAX]
                        if isinstance(pair, list) and len(pair) == 2]
            record_launches([str(name)[:80] for name in _list(msg.get("launches"))[:LAUNCHES_MAX]], launched,
                            [str(op)[:80] for op in _list(msg.get("ops"))[:OPS_MAX]],
                            [str(site)[:300] for site in _list(msg.get("threads", []))[:1]],
                            [str(r)[:40] for r in _list(msg.get("reads", []))[:OPS_MAX]],
                            min(int(msg.get("fills", 0)) if isinstance(msg.get("fills", 0), int) else 1, 1 << 30),
                            thread=owner,
                            subclasses=[str(c)[:80] for c in _list(msg.get("subclasses", []))[:8]],
                            unseen=[str(op)[:80] for op in _list(msg.get("unseen", []))[:8]],
                            ledger=str(msg.get("ledger", ""))[:300],
                            refused=[(pair[0][:1000], pair[1] if pair[1] in KINDS else "host")
                                     for pair in _list(msg.get("refused", []))[:3]
                                     if isinstance(pair, list) and len(pair) == 2
                                     and all(isinstance(x, str) for x in pair)],
                            side_doors=[str(d)[:1000] for d in _list(msg.get("side_doors", []))[:3]])
            return (None, *[g for g, a in zip(grads, args) if any(a is p for p in inputs)])

    _STAND_INS[id(Sandboxed)] = Sandboxed
    return Sandboxed.apply(y.detach(), *inputs)


def _serve_check(chan: Channel, exercise_id: str, candidate, integrity: Integrity | None = None,
                 hooks=None) -> None:
    """Inside the sandbox: answer the grader's calls for one check(...) until it says done."""
    import builtins
    import traceback

    changed = integrity.restore() if integrity is not None else []
    if hooks is not None:
        changed += hooks(start=True)
    import torch

    from . import harness
    from .harness import CandidateError, CheckFailed, _check_signature, call_function_candidate, call_kernel_candidate
    from .guard import watching

    # Autograd outputs of this check's calls, by call number, for the grader's stand-ins to differentiate: a
    # check may run two forwards before their backwards, as a model does (08.rmsnorm_train). The last few.
    pending: dict[int, tuple] = {}
    calls = 0

    chan.send({"op": "check", "exercise": str(exercise_id)})
    while True:
        msg, blobs = chan.recv(blob_limit=ARGS_MAX)
        op = msg.get("op")
        if op == "done":
            return
        spec = _Spec(msg.get("spec", {}))
        if integrity is not None:
            changed += integrity.restore()
        changed += hooks() if hooks is not None else []
        if changed and op in ("call", "backward"):
            chan.send(_tampered(changed))
            continue
        try:
            if op == "backward":  # the check differentiates the output of call number msg["call"]
                result, fargs = pending.get(msg.get("call"), (None, []))
                grad = Decoder.from_blobs(blobs, str(msg.get("device", "cpu"))).decode(msg.get("grad"))
                try:
                    with watching() as watch:
                        result.backward(grad)
                except Exception as exc:
                    raise harness._candidate_error(exc) from None
                grads_enc = Encoder()
                grads = [grads_enc.encode(a.grad) if isinstance(a, torch.Tensor) and a.grad is not None else None
                         for a in fargs]
                changed += integrity.restore() if integrity is not None else []
                changed += hooks() if hooks is not None else []
                reply = {"op": "grads", "grads": grads, "launches": watch.launches[:LAUNCHES_MAX],
                         "launched": [[la.name, la.module] for la in watch.launched[:LAUNCHES_MAX]],
                         "ops": list(dict.fromkeys(watch.torch_ops))[:OPS_MAX], "threads": watch.threads[:1],
                         "reads": list(dict.fromkeys(watch.host_reads))[:OPS_MAX], "fills": watch.host_fills,
                         "subclasses": watch.subclasses[:8], "unseen": watch.unseen_ops[:8],
                         "ledger": watch.ledger_problem, "refused": [list(r) for r in watch.refused[:3]],
                         "side_doors": watch.side_doors[:3]}
                chan.send(_tampered(changed) if changed else reply, grads_enc.blobs())
                continue
            if op == "signature":
                _check_signature(spec, candidate)
                chan.send({"op": "ok", "name": str(getattr(candidate, "__name__", "")),
                           "module": str(getattr(candidate, "__module__", "") or "")})
                continue
            if op != "call":
                raise ProtocolError(f"unexpected {op!r}")
            device = str(msg.get("device", "cpu"))
            decoder = Decoder.from_blobs(blobs, device)
            args = [decoder.decode(a, wrap_ok=True) for a in _list(msg.get("args"))]
            expect = msg.get("expect_raise")
            result_enc = Encoder(broadcast_max=RESULT_MAX)
            if expect is not None:  # a case the candidate must refuse by raising this (builtin) exception
                kind = getattr(builtins, str(expect), None)
                if not (isinstance(kind, type) and issubclass(kind, Exception)):
                    raise ProtocolError(f"not a builtin exception: {expect!r}")
                reply = {"op": "called", "refused": harness.refuses(kind, candidate, args)}
            elif spec.kernel:
                outs = {name: tuple(idx) for name, idx in msg.get("outputs", {}).items()}
                buffers = {name: (args[a], args[a], args[a].numel()) for name, (_, a) in outs.items()}
                writable = {str(name): (decoder.decode(pair[0]).to(torch.bool), str(pair[1])[:300])
                            for name, pair in dict(msg.get("writable") or {}).items()
                            if isinstance(pair, list) and len(pair) == 2}
                facts = call_kernel_candidate(spec, candidate, args, buffers, device, writable)
                reply = {"op": "called", "facts": facts_out(facts)}
                # the outputs as the last look after the call found them (CallFacts.final), not as now; by the
                # storage's number in the message, not its address (a data_ptr() the notebook hid with its own
                # method would match no output: the live bytes, as code written after the last look left them)
                final = {outs[name][0]: raw for name, raw in facts.final.items() if name in outs}
                result_enc.storages += [final.get(i, raw) for i, raw in enumerate(decoder.storages)]
            else:
                before = {i: a.untyped_storage().nbytes() for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
                result, used = call_function_candidate(spec, candidate, args)
                for raw in decoder.storages:
                    result_enc.keys[raw.untyped_storage().data_ptr()] = len(result_enc.storages)
                    result_enc.storages.append(raw)
                try:
                    encoded = result_enc.encode(result)
                except TypeError as exc:
                    encoded = {"t": "unsendable", "type": type(result).__name__, "why": str(exc)}
                reply = {"op": "called", "result": encoded, "used": [str(u) for u in used]}
                if isinstance(result, torch.Tensor) and result.grad_fn is not None:
                    calls += 1
                    reply["autograd"] = {**autograd_out(result.grad_fn, args, result, before, spec.params),
                                         "call": calls}
                    pending[calls] = (result, args)
                    pending.pop(calls - PENDING_MAX, None)
            reads = {str(i): [list(r) for r in a._reads] for i, a in enumerate(args) if hasattr(a, "_reads")}
            if reads:
                reply["reads"] = reads
            if not result_enc.storages:
                result_enc.storages += decoder.storages
            changed += integrity.restore() if integrity is not None else []
            changed += hooks() if hooks is not None else []
            if changed:  # during the call: the facts may be forged
                chan.send(_tampered(changed))
                continue
            chan.send(reply, result_enc.blobs())
        except CheckFailed as exc:
            chan.send({"op": "raised", "message": str(exc), "raised": getattr(exc, "raised", None),
                       "problems": problems_out(exc.problems), "candidate": isinstance(exc, CandidateError)})
        except ProtocolError:
            raise
        except (SystemExit, KeyboardInterrupt) as exc:  # sys.exit() in the candidate: this check fails, not
            # the notebook's other checks (the grader ends a notebook by its deadline, never by SIGINT), with
            # the message the interactive check gives
            error = harness._candidate_error(exc)
            chan.send({"op": "raised", "message": str(error), "raised": error.raised, "problems": [],
                       "candidate": True})
        except Exception as exc:  # something broke on this side while preparing or sending
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            chan.send({"op": "raised", "message": text, "raised": text.splitlines()[-1] if text else "",
                       "problems": [], "candidate": False})


def serve() -> None:
    """The sandbox's main program: cells in, `cell_done` out; the check(...) calls of a cell served when it
    has run (a check never raises while grading: the rest of the cell runs as it would have)."""
    import sys

    # `python -m` put the working folder (the notebook's, which it may write) first on sys.path: a file the
    # notebook wrote there (colorsys.py) would be imported in place of the library module that the checker's
    # libraries import for the first time during a check, and run code the scan never read
    here = os.path.realpath(os.getcwd())
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]
    chan = Channel(os.dup(0), os.dup(1))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # the student's prints go to the output pipe, never into the protocol
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)

    import course_utils
    from course_utils import grading
    from course_utils.grading import guard, harness  # noqa: F401 (imported before the snapshot)

    harness._function_args = tuple  # the grader keeps its own copies (and compares them): these are fresh
    serve_check = _serve_check
    # The check(...) calls of the cell that runs, served by the loop below once the cell has returned. The
    # check the notebook holds reaches this list and nothing else: the channel (and with it the key) is a
    # local of this function, in no closure, global or attribute. In check's closure it was one library call
    # away (triton's JITFunction.get_capture_scope(obj) and torch._jit_internal.get_closure(f) hand over a
    # function's closure cells, no name the scan knows), and a notebook that held it had the grader believe
    # whatever it sent: a wrapped chan.send dropped the host problems from every reply before the MAC.
    # What is left is this frame and the serving code's, below a cell or a candidate: frames are flagged.
    pending: list[tuple[str, Any]] = []

    def check(exercise_id, candidate, *args, **kwargs):
        pending.append((str(exercise_id), candidate))

    def progress(lesson, namespace, *args, **kwargs):
        print("[grading] progress(...) is not run while grading")
        return {}

    course_utils.check = grading.check = check
    course_utils.progress = progress

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="NoColor")

    def matplotlib(line):
        # a plain shell has no GUI loop: `%matplotlib inline` raised there (enable_gui), and the rest of the
        # cell, often the one that defines the kernels, never ran. Plots go nowhere while grading (Agg).
        print("[grading] %matplotlib is not run while grading")

    shell.register_magic_function(matplotlib)
    course_utils.setup(quiet=True)  # the mode (COURSE_MODE) before Triton's modules are snapshot
    integrity = Integrity()
    hooks = watch_hooks()
    chan.send({"op": "ready"})
    msg, _ = chan.recv()  # the key, before any code of the notebook's runs
    if msg.get("op") != "key" or not isinstance(msg.get("key"), str):
        return
    chan.authenticate(bytes.fromhex(msg.pop("key")))
    while True:
        msg, _ = chan.recv()
        if msg.get("op") != "cell":
            return
        result = shell.run_cell(str(msg.get("source", "")), store_history=True)
        while pending:  # a candidate may call check(...) too: served after the ones before it
            exercise_id, candidate = pending.pop(0)
            serve_check(chan, exercise_id, candidate, integrity, hooks)
            print(f"[grading] {exercise_id}: checked by the grader (the verdict is in its report)")
        error = result.error_in_exec or result.error_before_exec
        line = ""
        if error is not None:
            text = str(error).strip().splitlines()
            line = f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
        sys.stdout.flush()
        sys.stderr.flush()
        chan.send({"op": "cell_done", "error": line})


if __name__ == "__main__":
    serve()
