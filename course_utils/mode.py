"""Which way kernels run: on a CUDA GPU with real Triton, or on the CPU through Triton's interpreter.

The mode is decided once, in the first cell of a notebook, before any `@triton.jit` function is
defined: Triton reads `TRITON_INTERPRET` when a kernel is decorated, so setting it later changes nothing.
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass

MODES = ("gpu", "interpret")


def _version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '3.10.0+git1a2b'."""
    major, minor = (text.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def interpreter_too_old() -> str | None:
    """Why Triton's interpreter here cannot run the course (and what to install), or None when it can.

    Measured on the CPU with the course's solutions: from triton 3.7 on they all run; triton 3.6's
    interpreter runs them with numpy 2.3 but not with numpy 2.4, which turned the conversion of a 1-element
    array to a Python number into an error (a `for` loop over a kernel argument fails); before 3.6 an
    interpreted launch bypasses the method that check() counts launches by."""
    import numpy
    import triton

    found = _version(triton.__version__)
    if found >= (3, 7) or found == (3, 6) and _version(numpy.__version__) < (2, 4):
        return None
    if found == (3, 6):
        why = f"fails on loops over a kernel's arguments with numpy {numpy.__version__} (2.4 or newer)"
    else:
        why = "launches kernels past what check() counts"
    return (f"triton {triton.__version__}'s interpreter {why}: `pip install triton==3.9.0` (the course's CPU "
            "install), then restart the kernel")


@dataclass(frozen=True)
class Mode:
    name: str  # "gpu" or "interpret"
    device: str  # where tensors live: "cuda" or "cpu"
    why: str

    @property
    def interpret(self) -> bool:
        return self.name == "interpret"

    @property
    def gpu(self) -> bool:
        return self.name == "gpu"

    def __str__(self) -> str:
        return f"{self.name} mode: tensors on {self.device} ({self.why})"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _kernels_defined() -> list[str]:
    """Modules already holding @triton.jit functions: too late for them to change mode."""
    if "triton" not in sys.modules:
        return []
    from triton.runtime.jit import JITFunction

    found = []
    with warnings.catch_warnings():  # isinstance() on some deprecated module attributes warns
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            if name.startswith("triton") or module is None:
                continue
            members = getattr(module, "__dict__", {})
            if any(isinstance(v, JITFunction) for v in list(members.values())):
                found.append(name)
    return found


def _triton_built_for_the_other_mode(interpret: bool) -> bool:
    """Was triton imported before the mode was set, in the other mode? Its own @triton.jit helpers
    (tl.zeros, tl.sum, tl.max, tl.cdiv...) are built when triton.language is imported: built for the GPU,
    the interpreter cannot call them from a kernel ("Cannot call @triton.jit'd outside of the scope of a
    kernel"), and a correct kernel fails."""
    standard = sys.modules.get("triton.language.standard")
    if standard is None or not hasattr(standard, "zeros"):
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.zeros, InterpretedFunction) != interpret


def current() -> Mode:
    """The mode in force now, read from the environment (no side effects)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return Mode("interpret", "cpu", "TRITON_INTERPRET=1")
    return Mode("gpu", "cuda", "a CUDA GPU")


def setup(mode: str | None = None, *, quiet: bool = False) -> Mode:
    """Pick the mode and print it. Call it first, before defining or importing kernels.

    mode: "gpu", "interpret", or None for automatic: the environment variable COURSE_MODE if set,
    else "gpu" when torch sees a CUDA device and "interpret" otherwise.
    """
    requested = mode or os.environ.get("COURSE_MODE") or "auto"
    if requested not in (*MODES, "auto"):
        raise ValueError(f"mode must be one of {MODES} or 'auto', not {requested!r}")
    if requested == "auto":
        if os.environ.get("TRITON_INTERPRET") == "1":
            requested, why = "interpret", "TRITON_INTERPRET=1 was already set"
        elif _cuda_available():
            requested, why = "gpu", "a CUDA GPU is present"
        else:
            requested, why = "interpret", "no CUDA GPU found"
    else:
        why = f"asked for {requested!r}"
    if requested == "gpu" and not _cuda_available():
        raise RuntimeError("gpu mode asked for, but torch sees no CUDA device; use setup('interpret')")

    previous = current().name
    if requested == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
        from .fp8_interpreter import install_fp8_fix  # the interpreter's float -> fp8 cast is wrong: lesson 07

        install_fp8_fix()
        _gpu_dot_sizes()
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    _sync_triton_knob(requested == "interpret")
    if _triton_built_for_the_other_mode(requested == "interpret"):
        print(
            f"warning: triton was imported before setup() chose {requested} mode, so its own helpers "
            "(tl.zeros, tl.sum, tl.max, ...) were built for the other mode and kernels that call them will "
            "fail (\"Cannot call @triton.jit'd outside of the scope of a kernel\"); restart the kernel and "
            "run setup() before importing triton",
            file=sys.stderr,
        )
    elif previous != requested and _kernels_defined():
        print(
            f"warning: kernels were defined before switching to {requested} mode "
            f"({', '.join(_kernels_defined())}); restart the kernel so they are defined again",
            file=sys.stderr,
        )
    if requested == "interpret" and (problem := interpreter_too_old()):
        print(f"warning: {problem}", file=sys.stderr)
    chosen = Mode(requested, "cpu" if requested == "interpret" else "cuda", why)
    if not quiet:
        print(chosen)
    return chosen


def _gpu_dot_min_size(lhs_type, rhs_type) -> tuple[int, int, int]:
    """(M, N, K) at least, of a tl.dot on an NVIDIA GPU (Triton's NVIDIA backend, min_dot_size): K >= 32 for
    8-bit operands (fp8, int8), 16 for any other; M and N are padded. (Triton 3.9 lets fp32 go down to 8 and
    fp64 to 4; earlier versions do not, and a kernel must compile on those too.)"""
    return 1, 1, 32 if lhs_type.scalar.primitive_bitwidth == 8 else 16


def _gpu_dot_sizes() -> None:
    """The interpreter takes a tl.dot of any size, and a GPU refuses to compile a K below the bounds above: a
    kernel checked on the CPU must compile on a GPU, so the interpreter gets the GPU's bounds."""
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    if builder is not None and isinstance(getattr(builder, "codegen_fns", None), dict):
        builder.codegen_fns["min_dot_size"] = _gpu_dot_min_size


def _sync_triton_knob(interpret: bool) -> None:
    """Triton >= 3.4 caches environment knobs; keep the cached value in step with the variable."""
    if "triton" not in sys.modules:
        return
    knobs = getattr(sys.modules["triton"], "knobs", None)
    if knobs is not None and hasattr(knobs, "runtime") and hasattr(knobs.runtime, "interpret"):
        knobs.runtime.interpret = interpret


def size(gpu, cpu):
    """The problem size for this mode: `gpu` on a GPU, the smaller `cpu` in the interpreter."""
    return cpu if current().interpret else gpu


def device() -> str:
    """Where course tensors are allocated in this mode ("cuda" or "cpu")."""
    return current().device


def half_dtype(capability: tuple[int, int] | None = None):
    """The 16-bit float type for lesson tensors: torch.bfloat16 where the GPU computes in it (sm_80+:
    Ampere, Hopper), torch.float16 on older GPUs (a T4, Colab's free GPU, is sm_75) and in the
    interpreter (numpy has no bf16 arithmetic, so Triton's interpreter cannot compute in it).

    capability: (major, minor) to decide for; default: this mode's GPU.
    """
    import torch

    if capability is None:
        if current().interpret or not torch.cuda.is_available():
            return torch.float16
        capability = tuple(torch.cuda.get_device_capability())
    return torch.bfloat16 if tuple(capability) >= (8, 0) else torch.float16
