"""The environment check of lesson 00: versions, the GPU, a tiny kernel, and what each lesson needs."""
from __future__ import annotations

import importlib
import platform

from .lessons_index import LESSONS
from .mode import current, interpreter_too_old

PACKAGES = ("torch", "triton", "numpy", "transformers", "onnx", "onnxruntime", "matplotlib")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.import_module(name).__version__
        except ImportError:
            found[name] = "missing"
    return found


def tiny_kernel_ok() -> bool:
    """Add two vectors of 1000 elements with the lesson 02 kernel and compare with torch."""
    import torch

    from .lessons.l02_first_kernels import add

    x = torch.arange(1000, dtype=torch.float32, device=current().device)
    out = torch.empty_like(x)
    add(x, 2 * x, out, BLOCK=256)
    return bool(torch.equal(out, 3 * x))


def doctor() -> bool:
    """Print the report; True when everything the course needs works here."""
    import torch

    mode = current()
    ok = True
    for name, version in versions().items():
        print(f"{name:<13} {version}")
        ok &= version != "missing"
    print(f"{'mode':<13} {mode}")
    if mode.interpret and (problem := interpreter_too_old()):
        print(f"{'':<13} PROBLEM: {problem}")
        ok = False
    capability = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        capability = torch.cuda.get_device_capability(0)
        print(f"{'gpu':<13} {props.name}, compute capability {capability[0]}.{capability[1]}, "
              f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB")
    else:
        print(f"{'gpu':<13} none: kernels run in Triton's interpreter on the CPU (slow, small sizes, no timings)")
    kernel = tiny_kernel_ok()
    ok &= kernel
    print(f"{'tiny kernel':<13} {'ok' if kernel else 'WRONG RESULT'} (vector add of 1000 elements)")
    print()
    for lesson, record in LESSONS.items():
        need, note, title = record.needs, record.needs_note, record.title
        if need is None or capability is not None and capability >= need:
            status = "full"
        elif capability is None:
            status = "interpreter"
        else:
            status = f"partial (needs sm_{need[0]}{need[1]})"
        print(f"{lesson}  {status:<24} {title}: {note}")
    return ok
