"""Lesson 04 on a GPU: fused kernels against eager PyTorch, torch.compile, CUDA graphs and Liger-Kernel.

`run(table)` is what `python -m course_utils bench 04` measures:
- sin^4 of 2^26 fp32 elements: eager (four kernels), torch.compile, ours (a sweep of BLOCK/num_warps);
- sin^4 of 4096 elements, where launching is all the work: eager, a CUDA-graph replay of eager,
  torch.compile with and without mode="reduce-overhead", ours, ours replayed from a CUDA graph
  (wall-clock time per call: CUDA events would hide the CPU's launch cost);
- silu(g) * u in bf16 at Llama sizes: eager, torch.compile, Liger-Kernel when installed, ours (sweep).
It also records notes for readers without a GPU: the Triton kernel torch.compile generated for sin^4,
which sin instruction our kernel compiled to, and the profiler summaries of eager and fused sin^4.

The lesson's GPU tools live here too, and the notebook uses them: `wall_ms`, `bench.graph_replay`,
`generated_triton`, `profile_to_trace` and `trace_summary`.
"""
from __future__ import annotations

import bisect
import itertools
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ..bench import Table, do_bench, graph_replay
from ..lessons.l04_fusion import bytes_moved, silu_mul, silu_mul_ref, sin4, sin4_kernel, sin4_ref

EXPORTS = Path("exports")  # profiler traces go here (ignored by git), relative to the working directory
SIN4_SWEEP = [(1024, 4), (2048, 4), (2048, 8), (4096, 8)]  # (BLOCK, num_warps)
SILU_SWEEP = [(1024, 4), (2048, 4), (2048, 8), (4096, 8)]
SILU_SHAPES = [(4096, 11008), (16384, 14336)]  # (tokens, intermediate): Llama-7B MLP, and a bigger one
LAUNCH_GROUP = "sin^4 fp32 4096 (launch-bound)"
COMPILE_NOTE = "torch.compile's Triton kernel for sin^4"
PROFILE_NOTE = "profiler:"


# --- timing what the CPU pays -----------------------------------------------------------------

def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn: Callable[[], object], iters: int = 300, warmup: int = 20) -> float:
    """Milliseconds per call by the wall clock: `iters` calls back to back, one synchronize at the end.

    For launch-bound work this is the honest number: the CPU's Python and launch costs are paid on
    every call, and the GPU waits for them. (`do_bench` times with CUDA events between calls that
    the CPU queued early, which can hide exactly the overhead we want to see.)
    """
    for _ in range(warmup):
        fn()
    _sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    return (time.perf_counter() - start) * 1e3 / iters


# --- what torch.compile generates -------------------------------------------------------------

def extract_triton_kernels(source: str) -> list[str]:
    """The @triton.jit functions in Inductor's output code (each kernel is a string inside it)."""
    kernels = []
    for body in re.findall(r"'''(.*?)'''", source, re.DOTALL):
        start = body.find("@triton.jit")
        if start >= 0:
            kernels.append(body[start:].strip())
    return kernels


def generated_triton(fn: Callable, *args) -> list[str]:
    """Compile fn with torch.compile, run it on args, and return the Triton kernels Inductor wrote.

    The same code `TORCH_LOGS=output_code` prints. Note: `run_and_get_code` resets torch.compile's
    caches (torch._dynamo.reset()) so that the function is compiled afresh.
    """
    from torch._inductor.utils import run_and_get_code

    _, sources = run_and_get_code(torch.compile(fn, dynamic=False), *args)
    return [kernel for source in sources for kernel in extract_triton_kernels(source)]


def sin_instruction(ptx: str) -> str:
    """Which sine a compiled kernel uses: the hardware approximation or libdevice's accurate one."""
    if "sin.approx" in ptx:
        return "sin.approx.f32 (the fast hardware approximation)"
    return "libdevice's accurate sinf (a polynomial with argument reduction, inlined)"


# --- the profiler -----------------------------------------------------------------------------

def profile_to_trace(fn: Callable[[], object], path: str | Path, steps: int = 3) -> Path:
    """Profile `steps` calls of fn (after one warm-up call) and write a Chrome/Perfetto trace file.

    Open it at https://ui.perfetto.dev (or chrome://tracing): the CPU rows show the Python and aten
    calls that launch kernels, the GPU stream row shows the kernels and the gaps between them.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    fn()
    _sync()
    with profile(activities=activities) as prof:
        for step in range(steps):
            with record_function(f"call {step}"):
                fn()
            _sync()  # one call's kernels end before the next call starts: spans per call stay apart
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path


def trace_summary(path: str | Path, op_prefix: str = "aten::") -> dict:
    """Count kernels and their busy time against the span they cover; the rest is the GPU waiting.

    Returns kernels (GPU kernel count), kernel_names, busy_us (sum of kernel durations), span_us
    (first kernel start to last kernel end), idle_us (span - busy: launch gaps), largest_gap_us,
    launches (kernel launch API calls on the CPU) and ops ({name: count} of CPU ops with op_prefix);
    and per call (the `record_function("call N")` ranges of `profile_to_trace`): calls,
    kernels_per_call, busy_us_per_call and span_us_per_call (first to last kernel of one call, the
    gaps between its kernels included, the gaps between calls not).
    """
    data = json.loads(Path(path).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    complete = [e for e in events if e.get("ph") == "X"]
    kernels = [e for e in complete if str(e.get("cat", "")).lower() == "kernel"]
    kernels.sort(key=lambda e: float(e["ts"]))
    launches = [e for e in complete if str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver")
                and "launch" in e.get("name", "").lower()]
    ops: dict[str, int] = {}
    for e in complete:
        if e.get("cat") == "cpu_op" and e.get("name", "").startswith(op_prefix):
            ops[e["name"]] = ops.get(e["name"], 0) + 1
    busy = sum(float(e["dur"]) for e in kernels)
    end = max((float(e["ts"]) + float(e["dur"]) for e in kernels), default=0.0)
    span = end - float(kernels[0]["ts"]) if kernels else 0.0
    gaps = [float(b["ts"]) - (float(a["ts"]) + float(a["dur"])) for a, b in itertools.pairwise(kernels)]
    marks = sorted(float(e["ts"]) for e in complete
                   if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("call "))
    per_call: dict[int, list[dict]] = {}
    for e in kernels:
        index = bisect.bisect_right(marks, float(e["ts"])) - 1
        if index >= 0:
            per_call.setdefault(index, []).append(e)
    calls = len(marks)
    spans = [max(float(e["ts"]) + float(e["dur"]) for e in ks) - float(ks[0]["ts"]) for ks in per_call.values()]
    return {
        "calls": calls,
        "kernels_per_call": len(kernels) / calls if calls else None,
        "busy_us_per_call": sum(float(e["dur"]) for ks in per_call.values() for e in ks) / calls if calls else None,
        "span_us_per_call": sum(spans) / calls if calls else None,
        "kernels": len(kernels),
        "kernel_names": sorted({e["name"] for e in kernels}),
        "busy_us": busy,
        "span_us": span,
        "idle_us": max(span - busy, 0.0),
        "largest_gap_us": max(gaps, default=0.0),
        "launches": len(launches),
        "ops": ops,
    }


def describe_trace(name: str, summary: dict, steps: int = 3) -> str:
    """One line a person can read: kernels, GPU busy time and span, per call."""
    if not summary["kernels"]:
        ops = ", ".join(f"{k} x {v}" for k, v in summary["ops"].items()) or "none"
        return f"{name}: no GPU kernels in this trace (CPU only); CPU ops: {ops}"
    calls = summary.get("calls") or steps
    busy = summary.get("busy_us_per_call") or summary["busy_us"] / calls
    span = summary.get("span_us_per_call") or summary["span_us"] / calls
    names = [name if len(name) <= 60 else name[:57] + "..." for name in summary["kernel_names"]]
    return (f"{name}: {summary['kernels'] / calls:g} kernels per call; per call the GPU is busy {busy:.1f} us "
            f"of a {span:.1f} us span from its first kernel's start to its last one's end ({calls} calls, "
            f"a synchronize after each); kernels: {'; '.join(names)}")


# --- the benchmark ----------------------------------------------------------------------------

def _sin4_large(table: Table) -> None:
    n = 1 << 26
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    ref = sin4_ref(x)
    close = {"atol": 2e-5, "rtol": 1e-5}  # tl.sin may be the approximate sine: see sin_instruction

    kernels = generated_triton(sin4_ref, x)
    if kernels:
        table.notes.append(f"{COMPILE_NOTE} (2^26 fp32, torch {torch.__version__}):\n" + "\n\n".join(kernels))
    launched = sin4_kernel[(n // 1024,)](x, out, n, BLOCK=1024, num_warps=4)  # returns the compiled kernel
    asm = getattr(launched, "asm", {}) or {}
    if "ptx" in asm:
        table.notes.append(f"tl.sin in our sin4_kernel compiled to {sin_instruction(asm['ptx'])}")

    group = "sin^4 fp32 2^26"
    fused = bytes_moved(n, 4, 4, fused=True)  # GB/s of every row: the fused kernel's 8 bytes per element
    table.time(group, "copy ceiling (x -> out)", lambda: out.copy_(x), n_bytes=fused)
    peers = table.time_peers(group, sin4_ref, x, n_bytes=fused, eager="torch eager (4 kernels)",
                             check=lambda got: torch.testing.assert_close(got, ref, **close))
    for block, warps in SIN4_SWEEP:
        out.zero_()
        sin4(x, out, BLOCK=block, num_warps=warps)
        torch.testing.assert_close(out, ref, **close)  # checked before timed
        table.time(group, f"triton (ours) B={block} w={warps}",
                   lambda b=block, w=warps: sin4(x, out, BLOCK=b, num_warps=w), n_bytes=fused)
    table.add_best(group, n_bytes=fused)
    table.target(group, "triton (ours)", peers, 1.0)  # the fastest of eager, torch.compile, max-autotune
    table.target(group, "triton (ours)", "torch eager (4 kernels)", 1.9)
    table.notes.append(f"{group}: eager moves {bytes_moved(n, 4, 4, False) / 1e9:.2f} GB, fused "
                       f"{fused / 1e9:.2f} GB; GB/s columns count the fused bytes for every row")

    m = 1 << 20  # profile at a size where one kernel takes a few microseconds: the gaps show
    xs, outs = x[:m], out[:m]
    for key, name, fn in [("eager", "eager sin^4", lambda: sin4_ref(xs)), ("fused", "fused sin4", lambda: sin4(xs, outs))]:
        path = profile_to_trace(fn, EXPORTS / f"04_{key}_sin4_trace.json")
        summary = trace_summary(path)
        table.notes.append(f"{PROFILE_NOTE} " + describe_trace(f"{name} on 2^20 fp32", summary))
        table.fact(f"profile_{key}_kernels_per_call", f"{summary['kernels_per_call']:g}")
        table.fact(f"profile_{key}_busy_us_per_call", f"{summary['busy_us_per_call']:.1f} µs")
        table.fact(f"profile_{key}_span_us_per_call", f"{summary['span_us_per_call']:.1f} µs")


def _cudagraph_log(fn: Callable[[], object], calls: int = 3) -> tuple[list[str], int]:
    """Run fn `calls` times with TORCH_LOGS=cudagraphs on; (distinct log lines, CUDA-graph skips counted)."""
    import logging

    from torch._dynamo.utils import counters

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            text = record.getMessage().strip().splitlines()[0][:160] if record.getMessage().strip() else ""
            if text and text not in lines:
                lines.append(text)

    handler = Keep(level=logging.DEBUG)
    skips_before = sum(counters["inductor"].get(k, 0) for k in ("cudagraph_skips",))
    torch._logging.set_logs(cudagraphs=True)
    # torch's loggers stop propagation at their own handlers (torch._inductor, ...): listen on each of them
    loggers = [logging.getLogger("torch")] + [
        logger for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("torch.") and isinstance(logger, logging.Logger) and not logger.propagate]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        for _ in range(calls):
            fn()
        _sync()
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        torch._logging.set_logs()
    return lines, sum(counters["inductor"].get(k, 0) for k in ("cudagraph_skips",)) - skips_before


def cpu_us(fn: Callable[[], object], iters: int = 200) -> float:
    """Microseconds of CPU time per call: calls queued back to back, no synchronize inside the timing."""
    for _ in range(20):
        fn()
    _sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = time.perf_counter() - start
    _sync()
    return elapsed * 1e6 / iters


def _launch_bound(table: Table) -> None:
    n = 4096  # 16 KB: each kernel is over in a couple of microseconds, launching it costs more
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    ref = sin4_ref(x)
    close = {"atol": 2e-5, "rtol": 1e-5}
    compiled = torch.compile(sin4_ref, dynamic=False)
    autotuned = torch.compile(sin4_ref, mode="max-autotune-no-cudagraphs", dynamic=False)
    reduce_overhead = torch.compile(sin4_ref, mode="reduce-overhead", dynamic=False)
    log, skips = _cudagraph_log(lambda: reduce_overhead(x))  # its first calls record the graph

    def ours():
        sin4(x, out)
        return out

    candidates = [
        ("torch eager 4 launches", lambda: sin4_ref(x)),
        ("torch eager graph", graph_replay(lambda: sin4_ref(x))),
        ("torch.compile", lambda: compiled(x)),
        ("torch.compile graph", graph_replay(lambda: compiled(x))),
        ("torch.compile max-autotune", lambda: autotuned(x)),
        ("torch.compile max-autotune graph", graph_replay(lambda: autotuned(x))),
        ("compile reduce-overhead", lambda: reduce_overhead(x)),
        ("triton (ours) 1 launch", ours),
        ("triton (ours) graph", graph_replay(ours)),
    ]
    group = LAUNCH_GROUP
    for name, fn in candidates:
        for _ in range(3):  # reduce-overhead records its graph on the first calls
            result = fn()
        torch.testing.assert_close(result, ref, **close)
        table.add(group, name, wall_ms(fn), n_bytes=bytes_moved(n, 4, 4, fused=True))
    # Not targets: the speed-ups are reported (minimum None).
    table.target(group, "torch eager graph", "torch eager 4 launches", None)
    table.target(group, "compile reduce-overhead", "torch.compile", None)
    table.target(group, "triton (ours) graph", "triton (ours) 1 launch", None)
    plain = ["torch eager 4 launches", "torch.compile", "torch.compile max-autotune", "compile reduce-overhead"]
    table.target(group, "triton (ours) 1 launch", plain, None)
    table.target(group, "triton (ours) graph", ["torch eager graph", "torch.compile graph",
                                                "torch.compile max-autotune graph", "compile reduce-overhead"], None)
    table.notes.append(f"{group}: wall-clock time per call (wall_ms), CPU launch costs included; "
                       "'graph' rows replay a CUDA graph (graph_replay); 'compile reduce-overhead' is "
                       'torch.compile(mode="reduce-overhead"), max-autotune is mode="max-autotune-no-cudagraphs"')

    # Why reduce-overhead is slower here, measured: did it record a CUDA graph (TORCH_LOGS=cudagraphs), and
    # where does its time per call go? The CPU time per call (calls queued, no sync) against do_bench's
    # CUDA-event time, which equals the CPU time when the GPU waits for the CPU between events.
    event_us = do_bench(lambda: reduce_overhead(x)) * 1e3
    cpu = {name: cpu_us(fn) for name, fn in candidates if name in ("compile reduce-overhead", "torch.compile",
                                                                       "triton (ours) graph")}
    recorded = [line for line in log if "record" in line.lower()]
    table.notes.append(f"{group}: TORCH_LOGS=cudagraphs while reduce-overhead ran its first 3 calls: "
                       f"{skips} CUDA-graph skips; log: " + (" | ".join(log[:6]) or "(no lines)"))
    table.fact("reduce_overhead_graph_skips", str(skips))
    table.fact("reduce_overhead_log_lines", str(len(log)))
    table.fact("reduce_overhead_recorded", "yes" if recorded and skips == 0 else "no" if skips else "unknown")
    table.fact("reduce_overhead_event_us", f"{event_us:.1f} µs")
    table.fact("reduce_overhead_cpu_us", f"{cpu['compile reduce-overhead']:.1f} µs")
    table.fact("compile_cpu_us", f"{cpu['torch.compile']:.1f} µs")
    table.fact("ours_graph_cpu_us", f"{cpu['triton (ours) graph']:.1f} µs")
    if recorded:
        table.notes.append(f"{group}: reduce-overhead log lines about recording: " + " | ".join(recorded[:3]))


def llama_silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The MLP's elementwise part as Hugging Face's Llama writes it: act_fn(gate) * up."""
    return F.silu(g) * u


def _silu_mul(table: Table, m: int, n: int, liger) -> None:
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)  # (tokens, intermediate)
    u = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(g)
    ref = silu_mul_ref(g, u)
    close = {"atol": 1e-2, "rtol": 2e-2}  # bf16 outputs; the peers round once or twice
    group = f"silu*mul bf16 {m}x{n}"
    n_bytes = 3 * m * n * 2  # read g, read u, write out
    table.time(group, "copy ceiling (g -> out)", lambda: out.copy_(g), n_bytes=2 * m * n * 2)
    peers = table.time_peers(group, llama_silu_mul, g, u, n_bytes=n_bytes, eager="torch eager (2 kernels)",
                             liger=liger.apply if liger is not None else None,
                             check=lambda got: torch.testing.assert_close(got, ref, **close))
    for block, warps in SILU_SWEEP:
        out.zero_()
        silu_mul(g, u, out, BLOCK=block, num_warps=warps)
        # fp32 maths rounded once, like the ref: at most one bf16 step apart (fp32 exp may differ)
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=2.0**-7)
        table.time(group, f"triton (ours) B={block} w={warps}",
                   lambda b=block, w=warps: silu_mul(g, u, out, BLOCK=b, num_warps=w), n_bytes=n_bytes)
    table.add_best(group, n_bytes=n_bytes)
    table.target(group, "triton (ours)", [p for p in peers if p != "Liger-Kernel"], 1.0)  # eager and compiled
    table.target(group, "triton (ours)", "Liger-Kernel", 0.95, 1.0)


def run(table: Table) -> None:
    torch.manual_seed(0)
    _sin4_large(table)
    _launch_bound(table)
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction as liger
    except ImportError:
        liger = None
        table.notes.append("Liger-Kernel is not installed: its silu*mul rows are missing")
    for m, n in SILU_SHAPES:
        _silu_mul(table, m, n, liger)
        torch.cuda.empty_cache()
