"""The fp8 bit formats, and an exact float <-> fp8 conversion for Triton's interpreter.

Triton's interpreter (3.6 to 3.9 at least) converts float -> fp8 wrongly for about 1% of the values
in range. `_convert_float` in triton/runtime/interpreter.py keeps the top mantissa bits, adds the
first cut-off bit (round half up: no sticky bits, so ties do not go to even) and ORs the result into
place. When that rounding overflows the mantissa (127.1 -> 1.111|1... x 2^6 rounds up to
10.000 x 2^6 = 128), the carry lands on the exponent field with an OR instead of an add, and is lost
whenever the exponent's lowest bit is already 1: 127.1 -> 64, 31.5 -> 16, -0.497 -> -0.25.
Out-of-range values are clamped field by field (500 -> -256 in e4m3, a NaN pattern for others), and
fp8 -> float decodes NaN and inf codes as large finite numbers (0x7F -> 480). Kernels that are right
on a GPU would fail their checks on the CPU.

`install_fp8_fix()` swaps that function for one that rounds exactly like the GPU does: Triton lowers
`x.to(tl.float8e4nv)` and `x.to(tl.float8e5)` to PTX `cvt.rn.satfinite`, i.e. round to nearest, ties
to even, and *saturate*. `course_utils.setup()` installs it in interpret mode. This module imports
only numpy (and Triton's interpreter when patching): the mode module and lesson 07's helpers
(course_utils.fp8, which re-exports the formats) both build on it, and it imports neither.
"""
from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fp8Format:
    name: str  # Triton's dtype name: "fp8e4nv" or "fp8e5"
    exp_bits: int
    man_bits: int
    bias: int
    has_inf: bool  # e5m2: exponent all ones with mantissa 0 is inf (IEEE style); e4m3fn: no inf

    @property
    def max_code(self) -> int:
        """The largest finite positive code: 0x7E for e4m3fn (0x7F is NaN), 0x7B for e5m2 (0x7C is inf)."""
        return 0x7B if self.has_inf else 0x7E

    @property
    def max(self) -> float:
        return float(decode(self.max_code, self))


E4M3 = Fp8Format("fp8e4nv", 4, 3, 7, has_inf=False)
E5M2 = Fp8Format("fp8e5", 5, 2, 15, has_inf=True)
FORMATS = {f.name: f for f in (E4M3, E5M2)}


def decode(code: int, fmt: Fp8Format = E4M3) -> float:
    """The value of one fp8 bit pattern (0..255): sign, exponent field, mantissa field."""
    sign = -1.0 if code & 0x80 else 1.0
    exp = (code >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1)
    man = code & ((1 << fmt.man_bits) - 1)
    top = (1 << fmt.exp_bits) - 1
    if fmt.has_inf and exp == top:  # e5m2: IEEE specials
        return sign * float("inf") if man == 0 else float("nan")
    if not fmt.has_inf and exp == top and man == (1 << fmt.man_bits) - 1:  # e4m3fn: only S.1111.111
        return float("nan")
    if exp == 0:  # subnormal: no implicit leading 1, exponent fixed at 1 - bias
        return sign * man / (1 << fmt.man_bits) * 2.0 ** (1 - fmt.bias)
    return sign * (1 + man / (1 << fmt.man_bits)) * 2.0 ** (exp - fmt.bias)


def table(fmt: Fp8Format = E4M3) -> np.ndarray:
    """float64 values of all 256 codes, index = code."""
    return np.array([decode(c, fmt) for c in range(256)], dtype=np.float64)


_TABLES: dict[str, np.ndarray] = {}


def _table(fmt: Fp8Format) -> np.ndarray:
    if fmt.name not in _TABLES:
        _TABLES[fmt.name] = table(fmt)
    return _TABLES[fmt.name]


def encode(values, fmt: Fp8Format = E4M3) -> np.ndarray:
    """Codes (uint8) of float values: round to nearest, ties to even, saturate to +-max; NaN -> 0x7F.

    Exact for any input that float64 holds exactly (fp64, fp32, fp16, bf16 values): the positive
    finite codes are ordered like their values, so a binary search finds the two neighbours of |x|,
    and both distances are computed without rounding (Sterbenz: the neighbours are within 2x).
    """
    x = np.asarray(values, dtype=np.float64)
    a = np.abs(x)
    finite_vals = _table(fmt)[: fmt.max_code + 1]  # codes 0..max_code, values increasing
    hi = np.clip(np.searchsorted(finite_vals, a, side="left"), 1, fmt.max_code)
    lo = hi - 1
    with np.errstate(invalid="ignore"):  # inf - inf for infinite inputs: replaced below
        d_lo = a - finite_vals[lo]
        d_hi = finite_vals[hi] - a
    hi_even = (hi & 1) == 0
    up = (d_hi < d_lo) | ((d_hi == d_lo) & hi_even)
    code = np.where(up, hi, lo)
    code = np.where(a >= finite_vals[fmt.max_code], fmt.max_code, code)  # saturate (and +-inf)
    code = np.where(a == 0, 0, code)
    code = (code | (np.signbit(x).astype(np.int64) << 7)).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code)  # one NaN, 0x7F, whatever the sign (as PTX cvt)


# --- the interpreter fix --------------------------------------------------------------------

_WIDE = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}


def _as_float64(data: np.ndarray, name: str) -> np.ndarray | None:
    """The values held by an interpreter array of Triton type `name`, as float64 (None: not handled)."""
    raw = np.ascontiguousarray(data)
    if name in FORMATS:
        return _table(FORMATS[name])[raw.view(np.uint8)]
    if name in _WIDE:
        return raw.view(_WIDE[name]).astype(np.float64)
    if name == "bf16":  # stored as uint16: the top half of a float32
        with np.errstate(invalid="ignore"):  # signalling NaN patterns
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return None


def _from_float64(values: np.ndarray, name: str) -> np.ndarray | None:
    """float64 values converted to Triton type `name`, as the unsigned integers the interpreter expects."""
    if name in FORMATS:
        return encode(values, FORMATS[name])
    if name in _WIDE:
        dtype = _WIDE[name]
        return values.astype(dtype).view(f"uint{8 * np.dtype(dtype).itemsize}")
    if name == "bf16":  # only reached from fp8, whose values bf16 holds exactly
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return None


def _fixed(original):
    """A drop-in for the interpreter's `_convert_float` that is exact for e4m3fn and e5m2."""
    rtne = _rtne_mode()

    def _convert_float(input, input_dtype, output_dtype, rounding_mode):
        src, dst = getattr(input_dtype, "name", None), getattr(output_dtype, "name", None)
        downcast_to_fp8 = dst in FORMATS and rounding_mode in (rtne, None) and rtne is not None
        if src in FORMATS or downcast_to_fp8:
            values = _as_float64(input, src)
            if values is not None:
                out = _from_float64(values, dst)
                if out is not None:
                    return out.reshape(np.shape(input))
        return original(input, input_dtype, output_dtype, rounding_mode)

    _convert_float.course_fp8_fix = True
    _convert_float.original = original
    return _convert_float


def _rtne_mode():
    try:
        from triton.runtime import interpreter

        return interpreter._ir.ROUNDING_MODE.RTNE
    except (ImportError, AttributeError):
        return None


def _interpreter_module():
    """triton.runtime.interpreter if it has the `_convert_float(input, in_dtype, out_dtype, rounding)`
    this module knows how to replace (Triton 3.6 to 3.9 do), else None."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return None
    convert = getattr(interpreter, "_convert_float", None)
    if not callable(convert):
        return None
    try:
        if len(inspect.signature(convert).parameters) != 4:
            return None
    except (TypeError, ValueError):
        return None
    return interpreter


def probe_values() -> np.ndarray:
    """fp32 values where conversions go wrong: every fp8 value, the midpoints between neighbours
    (exact ties), one fp32 ulp either side of each, values just below powers of two, beyond the range."""
    vals = []
    for fmt in (E4M3, E5M2):
        t = _table(fmt)[: fmt.max_code + 1]
        mids = (t[1:] + t[:-1]) / 2
        for v in (t, mids):
            v32 = v.astype(np.float32)
            vals += [v32, np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(0))]
    vals.append(np.array([127.1, 31.5, 0.497, 336.0, 464.0, 465.0, 500.0, 1e4, 61440.0, 7e4, np.inf],
                         dtype=np.float32))
    x = np.concatenate(vals).astype(np.float32)
    return np.concatenate([x, -x, np.array([np.nan], dtype=np.float32)])


def conversion_errors(convert=None) -> int:
    """How many probe values (fp32 -> e4m3fn, e5m2) and codes (e4m3fn, e5m2 -> fp32) `convert` gets
    wrong; `convert` defaults to the interpreter's `_convert_float` as it is now."""
    import triton.language as tl

    interp = _interpreter_module()
    if convert is None:
        if interp is None:
            return 0
        convert = interp._convert_float
    rtne = _rtne_mode()
    x = probe_values()
    wrong = 0
    for fmt, ty in ((E4M3, tl.float8e4nv), (E5M2, tl.float8e5)):
        got = np.asarray(convert(x, tl.float32, ty, rtne)).astype(np.uint8)
        want = encode(x, fmt)
        nan_ok = np.isnan(_table(fmt)[got]) & np.isnan(_table(fmt)[want])
        wrong += int(((got != want) & ~nan_ok).sum())
        codes = np.arange(256, dtype=np.uint8)
        up = np.asarray(convert(codes, ty, tl.float32, None)).astype(np.uint32).view(np.float32)
        ref = _table(fmt).astype(np.float32)
        wrong += int((~((up == ref) | (np.isnan(up) & np.isnan(ref)))).sum())
    return wrong


def _needed() -> bool:
    """Kernels may run in the interpreter: interpret mode, or no GPU at all."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    import torch

    return not torch.cuda.is_available()


def install_fp8_fix(*, force: bool = False) -> bool:
    """Give Triton's interpreter an exact float <-> fp8 conversion. Idempotent.

    Returns True when the fix is in place (now or from an earlier call), False when nothing was
    done: on a GPU (the interpreter is not used; `force=True` patches anyway), when this Triton has
    no `_convert_float` to replace, or when its own conversion already passes every probe value.
    """
    interp = _interpreter_module()
    if interp is None:
        return False
    current = interp._convert_float
    if getattr(current, "course_fp8_fix", False):
        return True
    if not (force or _needed()) or _rtne_mode() is None:
        return False
    try:
        errors = conversion_errors(current)
    except Exception as exc:  # noqa: BLE001 - another Triton's internals: never break an import over it
        warnings.warn(f"course_utils.fp8: could not probe Triton's interpreter fp8 conversion ({exc!r}); "
                      "left as it is", stacklevel=2)
        return False
    if errors == 0:
        return False  # this Triton converts correctly: leave it alone
    interp._convert_float = _fixed(current)
    return True


def uninstall_fp8_fix() -> None:
    """Put the interpreter's own conversion back (the lesson uses it to show the bug)."""
    interp = _interpreter_module()
    if interp is not None and getattr(interp._convert_float, "course_fp8_fix", False):
        interp._convert_float = interp._convert_float.original
