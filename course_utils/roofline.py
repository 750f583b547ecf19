"""The roofline: the fastest an operation can run, from its FLOPs, its bytes and two ceilings.

An operation that does `flops` arithmetic and moves `n_bytes` to and from memory has the
arithmetic intensity I = flops / n_bytes (FLOP per byte). A device that moves at most B bytes/s and
computes at most P FLOP/s can run it at best at

    attainable(I) = min(P, I * B)                                        FLOP/s

Below the ridge point I = P / B the operation is memory-bound (the slanted roof), above it
compute-bound (the flat roof). A GPU has several flat roofs: the tensor cores' matmul rates (bf16,
TF32) and the CUDA cores' fp32 rate, the roof of all other work (elementwise, reductions, softmax:
no tensor core). The ceilings used here are *measured* (`measure_ceilings`: a large device-to-device
copy for B; the best `torch.matmul` rate over several sizes for each tensor-core roof; an FMA-bound
Triton kernel for the CUDA cores), cached per device name under ~/.cache/course_utils/, with
datasheet figures beside them for comparison. Without a GPU the
committed measurements in results/01_strides_and_intensity.json are used, or, until that file
exists, the anchor measurements of an H200 kept with the course (`ANCHOR_RESULTS`).

Results files (written by `python -m course_utils bench 01`) keep the ceilings as rows of the groups
COPY_GROUP, MATMUL_GROUP and CORE_GROUP; every other row that has both GB/s and TFLOP/s is a point on
the roofline, its intensity being (TFLOP/s * 1e12) / (GB/s * 1e9). A matmul's point sits under the
roof of its precision ("matmul bf16 ..."), any other operation's under the CUDA-core fp32 roof.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE_DIR = Path.home() / ".cache" / "course_utils"
CACHE_FILE = "ceilings.json"

COPY_GROUP = "ceiling: copy bandwidth"
MATMUL_GROUP = "ceiling: matmul rate"
CORE_GROUP = "ceiling: fp32 FMA rate (CUDA cores)"
CORE_ROOF = "fp32"  # the roof of work that uses no tensor core
COPY_BYTES = 1 << 30  # the copy's source: 1 GiB, far beyond any L2 cache
MATMUL_SIZES = (4096, 8192)  # M = N = K of the matmuls whose best rate is the tensor-core ceiling
FMA_ELEMENTS, FMA_ITERS = 1 << 22, 4096  # the FMA kernel: 2 * 4096 FLOPs per element, 8 bytes
FMA_CONFIGS = ((1024, 4), (2048, 4), (4096, 4), (4096, 8))  # (BLOCK, num_warps): 8 to 32 chains per thread
ROOF_NAME = re.compile(r"\b(bf16|fp16|tf32|fp32)\b")
SQUARE_MATMUL = re.compile(r"^matmul (bf16|fp16|tf32|fp32) \d+\^3$")


# --- the maths ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cost:
    """What an operation must do at the least: FLOPs, and bytes read plus written in DRAM."""

    flops: float
    n_bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte."""
        return self.flops / self.n_bytes


def elementwise_cost(n: int, bytes_per_element: int, *, n_inputs: int = 1,
                     flops_per_element: float = 1.0) -> Cost:
    """n elements out, each from one element of every input: read n_inputs * n, write n elements."""
    return Cost(flops_per_element * n, (n_inputs + 1) * n * bytes_per_element)


def relu_cost(n: int, bytes_per_element: int) -> Cost:
    """max(x, 0): 1 FLOP per element; read x, write out. fp32: 1/8 FLOP/byte, int8: 1/2."""
    return elementwise_cost(n, bytes_per_element)


def add_cost(n: int, bytes_per_element: int) -> Cost:
    """x + y: 1 FLOP per element; read x and y, write out. fp32: 1/12 FLOP/byte."""
    return elementwise_cost(n, bytes_per_element, n_inputs=2)


def softmax_cost(rows: int, cols: int, bytes_per_element: int) -> Cost:
    """Row softmax: ~5 FLOPs per element (max, subtract, exp, sum, divide); read x once, write out once."""
    return elementwise_cost(rows * cols, bytes_per_element, flops_per_element=5.0)


def matmul_cost(M: int, N: int, K: int, bytes_per_element: int) -> Cost:
    """(M, K) @ (K, N): a multiply and an add per (m, n, k); read A and B once, write C once."""
    return Cost(2.0 * M * N * K, (M * K + K * N + M * N) * bytes_per_element)


def attainable(intensity, peak_flops, bandwidth):
    """min(peak, intensity * bandwidth), FLOP/s; works on numbers and numpy arrays alike."""
    import numpy as np

    value = np.minimum(peak_flops, np.multiply(intensity, bandwidth))
    return float(value) if np.ndim(value) == 0 else value


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the two roofs meet: peak / bandwidth."""
    return peak_flops / bandwidth


def bound(intensity: float, peak_flops: float, bandwidth: float) -> str:
    """'memory' left of the ridge point, 'compute' at or right of it."""
    return "memory" if intensity < ridge_point(peak_flops, bandwidth) else "compute"


# --- ceilings -------------------------------------------------------------------------------------

@dataclass
class Ceilings:
    """A device's two ceilings: copy bandwidth and matmul rates (one flat roof per matmul precision)."""

    device: str
    copy_gbps: float  # GB/s of a large device-to-device copy, read + write bytes counted
    matmul_tflops: dict[str, float]  # {"bf16": ..., "tf32": ...}: TFLOP/s of a large torch.matmul
    source: str = ""  # where the figures come from

    @property
    def bandwidth(self) -> float:
        """Bytes per second."""
        return self.copy_gbps * 1e9

    def roof(self, roof: str | None = None) -> str:
        """The name of a roof; None means the highest one."""
        if roof is None:
            return max(self.matmul_tflops, key=self.matmul_tflops.get)
        if roof not in self.matmul_tflops:
            raise KeyError(f"no {roof!r} roof on {self.device}; there are {', '.join(self.matmul_tflops)}")
        return roof

    def peak(self, roof: str | None = None) -> float:
        """FLOP/s of the flat roof `roof` (the highest when None)."""
        return self.matmul_tflops[self.roof(roof)] * 1e12

    def ridge(self, roof: str | None = None) -> float:
        return ridge_point(self.peak(roof), self.bandwidth)

    def attainable(self, intensity, roof: str | None = None):
        return attainable(intensity, self.peak(roof), self.bandwidth)

    def bound(self, intensity: float, roof: str | None = None) -> str:
        return bound(intensity, self.peak(roof), self.bandwidth)

    def describe(self) -> str:
        lines = [f"{self.device}: bandwidth {self.copy_gbps:,.0f} GB/s ({self.source})"]
        for name, tflops in self.matmul_tflops.items():
            lines.append(f"  {name:<5} matmul {tflops:7.1f} TFLOP/s -> ridge point "
                         f"{self.ridge(name):6.1f} FLOP/byte")
        return "\n".join(lines)


# Datasheet figures: peak HBM bandwidth and dense tensor-core rates (no 2:4 sparsity), from NVIDIA's
# A100 (SXM4 80GB), H100 (SXM5) and H200 (SXM) datasheets. A copy reaches ~85-90% of the bandwidth
# figure and cuBLAS ~70-80% of the matmul figure: measured ceilings sit below these.
DATASHEETS = {
    "A100 SXM 80GB": Ceilings("A100 SXM 80GB", 2039.0, {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},
                              "NVIDIA A100 datasheet"),
    "H100 SXM": Ceilings("H100 SXM", 3350.0, {"bf16": 989.0, "tf32": 495.0, "fp32": 67.0},
                         "NVIDIA H100 datasheet"),
    "H200 SXM": Ceilings("H200 SXM", 4800.0, {"bf16": 989.0, "tf32": 495.0, "fp32": 67.0},
                         "NVIDIA H200 datasheet"),
}

# Where results/ holds no lesson 01 file for any device, these stand in: the measurements of
# the anchor file anchors/h200-2026-11-21.json (an NVIDIA H200, torch 2.11.0+cu130,
# triton 3.6.0, measured on 2026-11-21), copied as constants. Each row: (group, name, ms, GB/s, TFLOP/s).
ANCHOR_SOURCE = ("anchor measurements of an NVIDIA H200 on 2026-11-21 (torch 2.11, triton 3.6), "
                 "kept with the course")


def _anchor_rows() -> list[dict]:
    rows = [
        (COPY_GROUP, "copy 1 GiB fp32 (read+write)", 0.50589, 4245.0, None),
        (MATMUL_GROUP, "torch.matmul bf16 8192^3", 1.58515, None, 693.6),
        (MATMUL_GROUP, "torch.matmul tf32 8192^3", 3.08336, None, 356.6),
    ]
    for (rows_, cols), ms, gbps in (((4096, 32768), 0.4065, 2641.5), ((32768, 4096), 0.41747, 2572.0),
                                    ((16384, 1024), 0.03946, 3401.7)):
        cost = softmax_cost(rows_, cols, 4)
        rows.append((f"softmax fp32 {rows_}x{cols}", "torch.softmax", ms, gbps, gbps * cost.intensity / 1e3))
    for roof, n, ms, tflops in (("bf16", 4096, 0.1864, 737.3), ("bf16", 8192, 1.58515, 693.6),
                                ("tf32", 4096, 0.38827, 354.0), ("tf32", 8192, 3.08336, 356.6)):
        cost = matmul_cost(n, n, n, 2 if roof == "bf16" else 4)
        rows.append((f"matmul {roof} {n}^3", "torch.matmul", ms, tflops * 1e3 / cost.intensity, tflops))
    return [dict(group=g, name=n, ms=ms, gbps=gb, tflops=tf) for g, n, ms, gb, tf in rows]


ANCHOR_RESULTS = {"lesson": "01", "device": "NVIDIA H200", "date": "2026-11-21", "torch": "2.11.0+cu130",
                  "triton": "3.6.0", "source": ANCHOR_SOURCE, "rows": _anchor_rows(), "targets": [],
                  "notes": []}


def _rows(data_or_rows) -> list[dict]:
    rows = data_or_rows["rows"] if isinstance(data_or_rows, dict) else data_or_rows
    return [r if isinstance(r, dict) else asdict(r) for r in rows]


def ceilings_from_results(data: dict) -> Ceilings:
    """The ceilings recorded in a results dict (results/01_*.json or `ANCHOR_RESULTS`).

    Each tensor-core roof is the best rate of its precision over the ceiling rows and every square
    matmul row ("matmul bf16 4096^3"), so that no matmul measured beside it plots above its roof;
    the "fp32" roof is the CUDA cores' (the FMA kernel; before Ampere also fp32 torch.matmul).
    """
    rows = _rows(data)
    copy = [r["gbps"] for r in rows if r["group"] == COPY_GROUP and r.get("gbps")]
    rates: dict[str, float] = {}
    for r in rows:
        if not r.get("tflops"):
            continue
        name = None
        if r["group"] == CORE_GROUP:
            name = CORE_ROOF
        elif r["group"] == MATMUL_GROUP:
            found = ROOF_NAME.search(r["name"])
            name = found.group(1) if found else r["name"]
        elif SQUARE_MATMUL.match(r["group"]):
            name = SQUARE_MATMUL.match(r["group"]).group(1)
        if name:
            rates[name] = max(rates.get(name, 0.0), r["tflops"])
    if not copy or not rates:
        raise ValueError(f"no ceilings in these results: expected rows in groups {COPY_GROUP!r} "
                         f"and {MATMUL_GROUP!r}")
    source = data.get("source") or f"measured on {data.get('device', '?')} on {data.get('date', '?')}"
    return Ceilings(data.get("device", "?"), max(copy), rates, source)


@dataclass
class Point:
    """An operation placed on the roofline: its intensity and the FLOP/s it reached."""

    label: str
    intensity: float  # FLOP/byte
    tflops: float  # achieved
    roof: str | None = None  # which flat roof applies (bf16, tf32, ...); None: decided by the ceilings

    def fraction(self, ceilings: Ceilings) -> float:
        """Achieved / attainable: 1.0 means the operation sits on its roof."""
        return self.tflops * 1e12 / ceilings.attainable(self.intensity, self.roof_of(ceilings))

    def roof_of(self, ceilings: Ceilings) -> str:
        """The point's roof if the device has it (a matmul's precision; "fp32", the CUDA cores, for other
        work), else the lowest one."""
        if self.roof in ceilings.matmul_tflops:
            return self.roof
        return min(ceilings.matmul_tflops, key=ceilings.matmul_tflops.get)


def points_from_rows(rows) -> list[Point]:
    """One point per group of rows (its fastest row), from rows carrying both GB/s and TFLOP/s."""
    best: dict[str, dict] = {}
    for r in _rows(rows):
        if r["group"] in (COPY_GROUP, MATMUL_GROUP) or not (r.get("gbps") and r.get("tflops")):
            continue
        if r["group"] not in best or r["tflops"] > best[r["group"]]["tflops"]:
            best[r["group"]] = r
    points = []
    for group, r in best.items():
        found = ROOF_NAME.search(group) if group.startswith("matmul") else None
        intensity = r["tflops"] * 1e3 / r["gbps"]  # (TFLOP/s * 1e12) / (GB/s * 1e9)
        points.append(Point(group, intensity, r["tflops"], found.group(1) if found else CORE_ROOF))
    return points


# --- measuring ------------------------------------------------------------------------------------

def matmul_roofs() -> tuple[str, ...]:
    """The matmul precisions worth measuring on this GPU: bf16 and TF32 from Ampere on, else fp16 and fp32."""
    import torch

    return ("bf16", "tf32") if torch.cuda.get_device_capability(0) >= (8, 0) else ("fp16", "fp32")


@contextlib.contextmanager
def matmul_precision(roof: str):
    """fp32 matmuls on TF32 tensor cores for roof 'tf32', in full fp32 otherwise; restored afterwards."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if roof == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def copy_op(n_bytes: int = COPY_BYTES) -> tuple[Callable[[], object], int]:
    """A device-to-device copy of n_bytes of fp32, and the bytes it moves (read + write)."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    n_bytes = min(n_bytes, free // 4)  # two buffers, with room to spare on small GPUs
    x = torch.randn(n_bytes // 4, device="cuda")  # (n,) fp32
    y = torch.empty_like(x)
    return (lambda: y.copy_(x)), 2 * x.numel() * 4


def matmul_op(roof: str, M: int, N: int | None = None, K: int | None = None, *,
              device: str = "cuda") -> tuple[Callable[[], object], Cost]:
    """torch.matmul of (M, K) @ (K, N) in the dtype of `roof` (tf32 and fp32: fp32 inputs), and its cost.

    Time it inside `with matmul_precision(roof):` so that fp32 runs on TF32 tensor cores or not.
    """
    import torch

    N, K = N or M, K or M
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}
    dtype = dtypes[roof]
    a = torch.randn(M, K, device=device, dtype=dtype)  # (M, K)
    b = torch.randn(K, N, device=device, dtype=dtype)  # (K, N)
    c = torch.empty(M, N, device=device, dtype=dtype)  # (M, N)
    return (lambda: torch.matmul(a, b, out=c)), matmul_cost(M, N, K, a.element_size())


@functools.cache
def fma_kernel():
    """An FMA-bound Triton kernel, defined when first asked for (after the mode is set): each element
    runs `ITERS` dependent fused multiply-adds in registers; the elements of one thread are independent
    chains, so the FMA units stay busy. Reads 4 bytes and writes 4 per element."""
    import triton
    import triton.language as tl

    @triton.jit
    def fma_kernel(x_ptr, out_ptr, n, ITERS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        a = x * 0.001 + 0.999  # per element, so that nothing folds into a constant
        y = x
        for _ in range(ITERS // 8):
            for _ in tl.static_range(8):
                y = y * a + x  # one FMA: 2 FLOPs
        tl.store(out_ptr + offs, y, mask=mask)

    return fma_kernel


def fma_ref(x, iters: int):
    """What fma_kernel computes, in PyTorch (rounded after each multiply and add, not fused)."""
    a = x * 0.001 + 0.999
    y = x.clone()
    for _ in range(iters):
        y = y * a + x
    return y


def fma_op(n: int = FMA_ELEMENTS, iters: int = FMA_ITERS, *, device: str = "cuda",
           block: int = 1024, num_warps: int = 4) -> tuple[Callable[[], object], Cost]:
    """The FMA kernel on n fp32 elements (iters a multiple of 8), and its cost: 2 * iters FLOPs, 8 bytes
    per element. Its rate is the CUDA cores' fp32 roof (~67 TFLOP/s on an H100 by the datasheet)."""
    import torch

    x = torch.randn(n, device=device)  # (n,) fp32
    out = torch.empty_like(x)
    kernel = fma_kernel()
    grid = (-(-n // block),)

    def run():
        run.compiled = kernel[grid](x, out, n, ITERS=iters, BLOCK=block, num_warps=num_warps)
        return out

    run.x = x
    return run, Cost(2.0 * iters * n, 8.0 * n)


def _cache_path(cache_dir: Path | None) -> Path:
    return Path(cache_dir or CACHE_DIR) / CACHE_FILE


def read_cache(cache_dir: Path | None = None) -> dict[str, dict]:
    """{device name: ceilings as a dict} from the cache file; {} when there is none or it is unreadable."""
    path = _cache_path(cache_dir)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_cache(ceilings: Ceilings, cache_dir: Path | None = None) -> Path:
    path = _cache_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    cache = read_cache(cache_dir)
    cache[ceilings.device] = asdict(ceilings)
    path.write_text(json.dumps(cache, indent=1) + "\n")
    return path


def measure_ceilings(*, force: bool = False, cache_dir: Path | None = None, table=None) -> Ceilings:
    """Measure this GPU's copy bandwidth and matmul rates, or return them from the cache.

    Copy: 1 GiB of fp32 copied device to device, read + write bytes counted. Matmul: the best
    torch.matmul rate over MATMUL_SIZES (4096^3, 8192^3) in bf16 and in fp32 on TF32 tensor cores
    (fp16 and fp32 before Ampere). CUDA cores: the FMA kernel's fp32 rate (`fma_op`). The result is
    cached per device name in ~/.cache/course_utils/ceilings.json; force=True measures again.
    With a bench `table`, the measurements are also recorded as its rows.
    """
    import torch

    from .bench import do_bench, gb_per_s, tflop_per_s

    if not torch.cuda.is_available():
        raise RuntimeError("measure_ceilings() needs a CUDA GPU; without one use reference_ceilings(), "
                           "the committed GPU measurements")
    name = torch.cuda.get_device_name(0)
    cached = read_cache(cache_dir).get(name)
    if cached and not force:
        return Ceilings(**cached)

    fn, moved = copy_op()
    ms = do_bench(fn)
    copy_gbps = gb_per_s(moved, ms)
    if table is not None:
        table.add(COPY_GROUP, f"copy {moved // 2 / 2**30:g} GiB fp32 (read+write)", ms, n_bytes=moved)
    del fn
    rates: dict[str, float] = {}
    for roof in matmul_roofs():
        for size in MATMUL_SIZES:
            fn, cost = matmul_op(roof, size)
            with matmul_precision(roof):
                ms = do_bench(fn)
            rates[roof] = max(rates.get(roof, 0.0), tflop_per_s(cost.flops, ms))
            if table is not None:
                table.add(MATMUL_GROUP, f"torch.matmul {roof} {size}^3", ms, flops=cost.flops)
            del fn
    for block, warps in FMA_CONFIGS:  # the roof is the best of a few shapes of the same work
        fn, cost = fma_op(block=block, num_warps=warps)
        torch.testing.assert_close(fn(), fma_ref(fn.x, FMA_ITERS), rtol=1e-3, atol=1e-3)  # checked first
        ms = do_bench(fn)
        rates[CORE_ROOF] = max(rates.get(CORE_ROOF, 0.0), tflop_per_s(cost.flops, ms))
        if table is not None:
            table.add(CORE_GROUP, f"FMA kernel fp32 BLOCK={block} warps={warps}", ms, n_bytes=cost.n_bytes,
                      flops=cost.flops)
            ptx = (getattr(fn.compiled, "asm", None) or {}).get("ptx", "")
            table.notes.append(f"FMA kernel BLOCK={block} warps={warps}: {ptx.count('fma.rn.f32')} fma.rn.f32 "
                               f"and {ptx.count('mul.f32') + ptx.count('mul.rn.f32')} fp32 multiplies in its PTX")
        del fn
    torch.cuda.empty_cache()
    today = datetime.date.today().isoformat()
    ceilings = Ceilings(name, copy_gbps, rates, f"measured on this GPU on {today}, torch {torch.__version__}")
    write_cache(ceilings, cache_dir)
    return ceilings


def reference_results() -> dict:
    """The committed GPU measurements of lesson 01, or the H200 anchor figures until they exist."""
    from .bench import load_results

    data = load_results("01")
    if data is not None:
        try:
            ceilings_from_results(data)
            return data
        except ValueError:
            pass
    return ANCHOR_RESULTS


def reference_ceilings() -> Ceilings:
    return ceilings_from_results(reference_results())


def device_ceilings() -> Ceilings:
    """This GPU's measured ceilings in GPU mode; the committed (or anchor) GPU figures otherwise."""
    from .mode import current

    if current().gpu:
        return measure_ceilings()
    return reference_ceilings()


# --- plotting -------------------------------------------------------------------------------------

def plot_roofline(ceilings: Ceilings, points: Iterable[Point] = (), *,
                  datasheets: dict[str, Ceilings] | None = None, title: str | None = None,
                  path: Path | str | None = None):
    """Log-log roofline: measured roofs (solid), datasheet bf16 roofs (dashed), points coloured by bound."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    datasheets = DATASHEETS if datasheets is None else datasheets
    points = list(points)
    lo = min([0.05] + [p.intensity / 2 for p in points])
    hi = max([3 * ceilings.ridge(name) for name in ceilings.matmul_tflops]
             + [p.intensity * 3 for p in points])
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    fig, ax = plt.subplots(figsize=(9, 6))
    colors = ["tab:green", "tab:purple", "tab:brown", "tab:olive"]
    for color, (name, tflops) in zip(colors, sorted(ceilings.matmul_tflops.items(), key=lambda kv: -kv[1])):
        what = "fp32 CUDA cores" if name == CORE_ROOF and len(ceilings.matmul_tflops) > 1 else f"{name} matmul"
        ax.plot(x, ceilings.attainable(x, name) / 1e12, color=color, lw=2.2,
                label=f"{ceilings.device} {what}: {tflops:,.0f} TFLOP/s, {ceilings.copy_gbps:,.0f} GB/s "
                      f"(ridge {ceilings.ridge(name):.0f} FLOP/B)")
        ax.plot([ceilings.ridge(name)], [tflops], "o", color=color, ms=5)
    for style, sheet in zip(("--", "-.", ":"), datasheets.values()):
        roof = sheet.roof("bf16") if "bf16" in sheet.matmul_tflops else sheet.roof()
        ax.plot(x, sheet.attainable(x, roof) / 1e12, style, color="0.55", lw=1,
                label=f"{sheet.device} datasheet {roof}: {sheet.matmul_tflops[roof]:,.0f} TFLOP/s, "
                      f"{sheet.copy_gbps:,.0f} GB/s")
    marks = []
    for p in points:
        memory = ceilings.bound(p.intensity, p.roof_of(ceilings)) == "memory"
        ax.plot([p.intensity], [p.tflops], "o" if memory else "s", ms=7, mec="black",
                color="tab:blue" if memory else "tab:red")
        marks.append((p, f"{p.label} ({p.fraction(ceilings):.0%})"))
    if points:
        ax.plot([], [], "o", color="tab:blue", mec="black", label="memory-bound op (% of its roof)")
        ax.plot([], [], "s", color="tab:red", mec="black", label="compute-bound op (% of its roof)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ys = [p.tflops for p in points] + list(ceilings.matmul_tflops.values())
    top = max(ys + [sheet.matmul_tflops.get("bf16", 0.0) for sheet in datasheets.values()])
    ax.set_ylim(min(ys + [0.1]) / 3, top * 2)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of DRAM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    legend = ax.legend(fontsize=7, loc="upper left")  # above the slanted roof nothing is reachable: room
    ax.set_title(title or f"roofline of {ceilings.device}", fontsize=10)
    fig.tight_layout()
    _place_labels(ax, marks, avoid=[legend])
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _place_labels(ax, marks: list[tuple[Point, str]], avoid=()) -> None:
    """Label each point at the first nearby spot that overlaps no other label, marker or the legend."""
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = [artist.get_window_extent(renderer) for artist in avoid]
    for p, _ in marks:  # the markers themselves
        x, y = ax.transData.transform((p.intensity, p.tflops))
        taken.append(_box(x - 5, y - 5, x + 5, y + 5))
    spots = [(7, 0, "left"), (7, -9, "left"), (7, 9, "left"), (-7, 0, "right"), (-7, -9, "right"),
             (-7, 9, "right"), (7, -18, "left"), (7, 18, "left"), (-7, -18, "right"), (-7, 18, "right"),
             (0, -14, "center"), (0, 14, "center"), (7, -27, "left"), (7, 27, "left")]
    for p, text in sorted(marks, key=lambda m: (m[0].intensity, -m[0].tflops)):
        best = None  # (score, dx, dy, ha, box): score = (outside the axes?, overlaps)
        for dx, dy, ha in spots:
            label = ax.annotate(text, (p.intensity, p.tflops), xytext=(dx, dy), textcoords="offset points",
                                fontsize=7, ha=ha, va="center")
            box = label.get_window_extent(renderer)
            label.remove()
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            score = (not inside, sum(box.overlaps(other) for other in taken))
            if best is None or score < best[0]:
                best = (score, dx, dy, ha, box)
            if score == (False, 0):
                break
        _, dx, dy, ha, box = best
        ax.annotate(text, (p.intensity, p.tflops), xytext=(dx, dy), textcoords="offset points", fontsize=7,
                    ha=ha, va="center")
        taken.append(box)


def _box(x0, y0, x1, y1):
    from matplotlib.transforms import Bbox

    return Bbox([[x0, y0], [x1, y1]])


def plot_results(data: dict, path: Path | str | None = None, **kwargs):
    """The roofline of a results dict (results/01_*.json, a bench table's to_json(), `ANCHOR_RESULTS`)."""
    ceilings = ceilings_from_results(data)
    title = (kwargs.pop("title", None)
             or f"roofline of {data.get('device', '?')}, measured {data.get('date', '?')}")
    return plot_roofline(ceilings, points_from_rows(data), title=title, path=path, **kwargs)


def format_points(points: Iterable[Point], ceilings: Ceilings) -> str:
    """A table: intensity, achieved TFLOP/s, attainable TFLOP/s, fraction and bound of each point."""
    lines = [f"{'operation':<40} {'FLOP/B':>8} {'TFLOP/s':>9} {'roof':>9} {'of roof':>8}  bound"]
    for p in points:
        roof = p.roof_of(ceilings)
        lines.append(f"{p.label:<40} {p.intensity:8.3g} {p.tflops:9.3g} "
                     f"{ceilings.attainable(p.intensity, roof) / 1e12:9.3g} {p.fraction(ceilings):8.0%}  "
                     f"{ceilings.bound(p.intensity, roof)} ({roof} roof)")
    return "\n".join(lines)


__all__ = [
    "ANCHOR_RESULTS", "COPY_GROUP", "CORE_GROUP", "CORE_ROOF", "DATASHEETS", "MATMUL_GROUP", "Ceilings", "Cost", "Point", "add_cost",
    "attainable", "bound", "ceilings_from_results", "device_ceilings", "elementwise_cost", "format_points",
    "fma_op", "fma_ref", "matmul_cost", "measure_ceilings", "plot_results", "plot_roofline", "points_from_rows",
    "reference_ceilings", "reference_results", "relu_cost", "ridge_point", "softmax_cost",
]
