"""Benchmarks: honest GPU timings, rates against the device's ceilings, tables, plots, results/.

On a GPU, `Table.time(...)` runs `do_bench` (Triton's method, median of many runs after a warm-up,
the L2 emptied by a read before each)
and turns milliseconds into GB/s and TFLOP/s; `graph=True` also times the same work replayed from a
CUDA graph (its own row, named "... [graph]"), which is how launch-bound shapes are compared.
`Table.target(group, ours, [peer, ...], minimum)` compares with the fastest of several peers measured
in the same run (`Table.time_peers` times the usual ones: eager, torch.compile, max-autotune, Liger).
`Table.fact(key, text)` records a figure the lesson prose cites as `{{fact:KEY}}` (course_utils.figures).
In the interpreter timing means nothing, so `Table.time` refuses (one clear line) and
`show_results(lesson)` shows what a real GPU measured.

Results live in results/<stem>.<device>.json (and .png), one file per lesson and GPU ("h100", "h200":
`device_key()`); `results_dir()` finds the folder when called.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .lessons_index import course_root
from .mode import current

GRAPH = " [graph]"  # suffix of a row timed as a CUDA-graph replay
LAUNCH_BOUND_MS = 0.02  # below ~20 µs launching costs as much as the work: time it in a graph too
CLOSE_CALL = 0.03  # a target's first ratio within 3 % of its minimum is decided again, in turns
DECIDING_ROUNDS = 7  # rounds of that second measurement: ours and each close peer once a round


def results_dir() -> Path:
    """The results/ folder of the course checkout, found when called (course_root())."""
    return course_root() / "results"


def sweeping() -> bool:
    """Do the benches time their sweeps of kernel configurations too (COURSE_BENCH_SWEEP=1, to tune a
    lesson's defaults), or only the defaults the lessons use and the peers (the usual, quicker run)?"""
    return os.environ.get("COURSE_BENCH_SWEEP") == "1"


def can_time() -> bool:
    """True on a GPU; in the interpreter prints why nothing is timed and returns False."""
    if current().gpu:
        return True
    print("interpreter mode: timings would measure Python, not a GPU, so nothing is timed here; "
          "show_results(lesson) shows the committed GPU figures")
    return False


FLUSH_BYTES = 256 * 2**20  # more than any GPU's L2 (50 MB on an H100, 60 MB on an H200)


def do_bench(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100, zero_fill: bool = False) -> float:
    """Median milliseconds of fn() on the GPU: CUDA events around each run, the L2 emptied before each.

    The method of `triton.testing.do_bench`, with one change: it empties the L2 by *reading* a 256 MiB
    buffer, where Triton's zero-fills one. A zero-fill leaves the L2 full of dirty lines, and the timed
    kernel then pays for writing them back as it evicts them: up to an L2 of writes (50-60 MB) inside a
    GEMV that reads 59 MB. A read leaves clean lines, as the kernels before a decode step would. Lesson
    02's bench records what each flush does to a 64 MiB copy (zero_fill=True: Triton's flush). Every row,
    ours and the peers', is timed alike.
    """
    import statistics

    import torch

    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    total = torch.empty((), dtype=torch.int64, device="cuda")

    def empty_l2():
        if zero_fill:
            flush.zero_()  # writes 256 MiB: the last L2-full stays dirty
        else:
            torch.sum(flush, dim=0, out=total)  # reads 256 MiB, writes 8 bytes

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        empty_l2()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)  # an upper bound: the flushes are counted in
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    n_repeat = max(1, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for s, e in zip(starts, ends):
        empty_l2()  # the flush runs first and takes longer than a launch: fn is queued before s fires
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return float(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)))


def graph_replay(fn: Callable[[], object], warmup: int = 3) -> Callable[[], object]:
    """Capture fn's GPU work once in a CUDA graph (after `warmup` calls on a side stream, which compile
    and autotune kernels) and return a function that replays it: one launch, no Python in between.

    The replay reuses the capture's tensors: fn must read its inputs from tensors that stay alive.
    """
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn()

    def replay():
        graph.replay()
        return static_out

    replay.graph = graph  # keep the graph (and its memory pool) alive as long as the function
    return replay


SMI_FIELDS = ("clocks.sm", "power.draw", "power.limit", "clocks_throttle_reasons.sw_power_cap")


def parse_smi_samples(text: str) -> dict | None:
    """Medians of `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits` lines: the SM clock
    (MHz), the board's power draw and limit (W), and the share of samples with the power cap active."""
    import statistics

    rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines()]
    rows = [r for r in rows if len(r) == len(SMI_FIELDS)]
    if not rows:
        return None
    try:
        mhz, watts, limit = ([float(r[i]) for r in rows] for i in range(3))
    except ValueError:  # "[N/A]" where the driver does not report a field
        return None
    return {"sm_mhz": statistics.median(mhz), "power_w": statistics.median(watts),
            "power_limit_w": statistics.median(limit),
            "power_capped": sum(r[3] == "Active" for r in rows) / len(rows), "samples": len(rows)}


def clock_and_power(fn: Callable[[], object], seconds: float = 3.0, interval_ms: int = 20) -> dict | None:
    """Run fn back to back for `seconds` while nvidia-smi samples the SM clock and the board's power.

    A kernel at full tensor-core load often runs at the board's power limit, where the clock, not the
    kernel, sets the speed: two kernels at the same power can differ in clock and in work per clock.
    Returns `parse_smi_samples`' medians plus `ms` (the calls' mean time), or None without nvidia-smi.
    The sampling starts after half a second of calls, when the clock has settled.
    """
    import subprocess
    import time

    import torch

    def run_for(duration: float) -> tuple[int, float]:
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < duration:
            for _ in range(10):
                fn()
            calls += 10
            torch.cuda.synchronize()
        return calls, time.perf_counter() - start

    run_for(0.5)
    try:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}",
                                "--format=csv,noheader,nounits", "-lms", str(interval_ms)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None
    calls, elapsed = run_for(seconds)
    smi.terminate()
    samples = parse_smi_samples(smi.communicate()[0])
    return None if samples is None else {**samples, "ms": elapsed / calls * 1e3}


def registers_and_spills(kernel) -> tuple[int, int] | None:
    """(registers per thread, bytes per thread spilled to local memory) of a compiled kernel, as a launch
    returns it; None for the interpreter's launch, which compiles nothing. (Triton's `n_spills` counts
    4-byte words.)"""
    return None if kernel is None else (kernel.n_regs, 4 * kernel.n_spills)


def in_turns(runs: list[tuple[str, Callable[[], object]]], rounds: int, rep_ms: int = 100) -> dict[str, list[float]]:
    """Each function timed once per round, in turn, `rounds` rounds: {name: [ms of each round]}."""
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    for _ in range(rounds):
        for name, fn in runs:
            times[name].append(do_bench(fn, rep_ms=rep_ms))
    return times


def gb_per_s(n_bytes: float, ms: float) -> float:
    return n_bytes / (ms * 1e-3) / 1e9


def tflop_per_s(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


@dataclass
class Row:
    group: str  # what is being compared, e.g. "vector add fp32 2^28"
    name: str  # who: "triton (ours)", "torch", "torch.compile", "copy ceiling"...
    ms: float
    gbps: float | None = None
    tflops: float | None = None


@dataclass
class Target:
    """A target ratio: metric(ours) / metric(peer) >= minimum (None: only reported).

    With several candidate peers (`peers`), `peer` is the one that was fastest in this run: the ratio
    is against the strongest of them. A row name ending in " [graph]" is a CUDA-graph timing.
    """

    group: str
    ours: str
    peer: str
    minimum: float | None
    stretch: float | None = None
    metric: str = "speed"  # "speed": peer ms / our ms (same work); "gbps" or "tflops": our rate / peer rate
    ratio: float | None = None
    met: bool | None = None
    peers: list[str] | None = None  # the candidates, when the ratio is against the fastest of several
    # a close call decided in turns (Table.target): {"rounds", "first_ratio", "first_peer", "ms": {name: median}}
    decided: dict | None = None


@dataclass
class Table:
    lesson: str
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    notebooks: dict = field(default_factory=dict)  # notebook -> {"ok", "seconds", "error"} (prove)
    facts: dict[str, str] = field(default_factory=dict)  # key -> text, cited in prose as {{fact:KEY}}
    error: str = ""  # why the bench stopped early (its rows so far are kept)
    # (group, row name) -> the function its row timed (a graph row: the replay), for a close call's rematch
    runs: dict = field(default_factory=dict, repr=False, compare=False)

    def time(self, group: str, name: str, fn: Callable[[], object], *, n_bytes: float | None = None,
             flops: float | None = None, graph: bool | str = False, rep_ms: int = 100) -> Row | None:
        """Time fn on the GPU and record a row; returns None (and times nothing) in the interpreter.

        graph=True also times fn replayed from a CUDA graph, as its own row `name + " [graph]"`
        (launch-bound work: the plain row pays the launches, the graph row shows the GPU's work);
        graph="auto" does so only when the plain time is launch-bound (under LAUNCH_BOUND_MS);
        graph="only" records the graph row alone. A capture that fails costs only that row (a note).
        Returns the plain row (the graph row with graph="only").
        """
        if not current().gpu:
            return None
        row = None
        if graph != "only":
            row = self.add(group, name, do_bench(fn, rep_ms=rep_ms), n_bytes=n_bytes, flops=flops)
            self.runs[group, name] = fn
        if graph == "auto":
            graph = row.ms < LAUNCH_BOUND_MS
        if graph:
            try:
                replay = graph_replay(fn)
            except Exception as exc:  # noqa: BLE001 - some work cannot be captured; say so, go on
                self.notes.append(f"{group}: '{name}' not timed in a CUDA graph: {_first_line(exc)}")
                return row
            graph_row = self.add(group, name + GRAPH, do_bench(replay, rep_ms=rep_ms), n_bytes=n_bytes,
                                 flops=flops)
            self.runs[group, name + GRAPH] = replay
            row = row or graph_row
        return row

    def time_alternating(self, group: str, runs: list[tuple[str, Callable[[], object]]], *,
                         n_bytes: float | None = None, flops: float | None = None, rounds: int = 3,
                         rep_ms: int = 100) -> list[Row]:
        """Time several functions in turn, `rounds` times over, and record each one's median as its row.

        For a target's pair of compute-bound kernels: a GPU at full tensor-core load slows its clock as it
        heats (results/explore/README.md, lesson 07: the same peer, slower in the second of two rounds of
        one script), so timing one after the other favours whichever ran first; taking turns gives both
        the same conditions.
        """
        import statistics

        if not current().gpu:
            return []
        times = in_turns(runs, rounds, rep_ms)
        self.runs.update({(group, name): fn for name, fn in runs})
        return [self.add(group, name, statistics.median(times[name]), n_bytes=n_bytes, flops=flops)
                for name, _ in runs]

    def time_peers(self, group: str, fn: Callable[..., object], *args, n_bytes: float | None = None,
                   flops: float | None = None, graph: bool | str = False, liger: Callable | None = None,
                   check: Callable[[object], None] | None = None, eager: str = "torch eager",
                   max_autotune: bool = True, rep_ms: int = 100) -> list[str]:
        """Time the usual fair peers of an operation `fn(*args)` (a PyTorch function) into `group`.

        Rows: `eager` (fn itself), "torch.compile" (default mode), "torch.compile max-autotune"
        (Inductor's own CUDA graphs off, so that it times the same way as every other row; the
        " [graph]" rows are the graph timings, for everyone alike) and "Liger-Kernel" (`liger(*args)`,
        when given). `check(result)` runs on each peer's output before it is timed. A peer that fails
        to compile or run is skipped with a note. Returns the names of the rows recorded (graph rows
        included): pass them to `target(...)` to compare with the fastest.
        """
        import torch

        candidates: list[tuple[str, Callable[[], Callable]]] = [
            (eager, lambda: fn), ("torch.compile", lambda: torch.compile(fn, dynamic=False))]
        if max_autotune:
            candidates.append(("torch.compile max-autotune",
                               lambda: torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)))
        if liger is not None:
            candidates.append(("Liger-Kernel", lambda: liger))
        names = []
        for name, make in candidates:
            try:
                impl = make()
                result = impl(*args)  # compiles (torch.compile is lazy), and checked before timed
                if check is not None:
                    check(result)
            except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                self.notes.append(f"{group}: peer '{name}' skipped: {_first_line(exc)}")
                continue
            self.time(group, name, lambda impl=impl: impl(*args), n_bytes=n_bytes, flops=flops,
                      graph=graph, rep_ms=rep_ms)
            names += [n for n in (name, name + GRAPH) if self.find(group, n)]
        return names

    def fact(self, key: str, text: str) -> str:
        """Record a named figure for lesson prose (`{{fact:KEY}}` renders `text`)."""
        if not key or "|" in key or "}" in key:
            raise ValueError(f"a fact key needs a plain name, not {key!r}")
        self.facts[key] = str(text)
        return self.facts[key]

    def add(self, group: str, name: str, ms: float, *, n_bytes: float | None = None,
            flops: float | None = None) -> Row:
        row = Row(group, name, ms, gb_per_s(n_bytes, ms) if n_bytes else None,
                  tflop_per_s(flops, ms) if flops else None)
        self.rows.append(row)
        return row

    def add_best(self, group: str, name: str = "triton (ours)", *, n_bytes: float | None = None,
                 flops: float | None = None) -> Row | None:
        """Add the fastest of the sweep rows `name ...` of `group` as `name`, the row targets compare.

        Graph rows of the sweep ("name ... [graph]") give `name [graph]` the same way. Returns the
        plain row (the graph row when the sweep has only graph rows).
        """
        added = []
        for suffix in ("", GRAPH):
            sweep = [r for r in self.rows if r.group == group and r.name.startswith(name + " ")
                     and r.name.endswith(GRAPH) == bool(suffix) and r.name != name + GRAPH]
            if not sweep:
                continue
            best = min(sweep, key=lambda r: r.ms)
            self.notes.append(f"{group}: best of our sweep{' in a CUDA graph' if suffix else ''} is {best.name}")
            added.append(self.add(group, name + suffix, best.ms, n_bytes=n_bytes, flops=flops))
            self.same_run(group, name + suffix, best.name)
        return added[0] if added else None

    def same_run(self, group: str, name: str, timed: str) -> None:
        """Row `name` repeats row `timed`'s time (a sweep's best): a rematch times `timed`'s function."""
        if (group, timed) in self.runs:
            self.runs[group, name] = self.runs[group, timed]

    def find(self, group: str, name: str) -> Row | None:
        return next((r for r in self.rows if r.group == group and r.name == name), None)

    def target(self, group: str, ours: str, peer: str | list[str] | tuple[str, ...], minimum: float | None,
               stretch: float | None = None, metric: str = "speed") -> Target:
        """Record a target; its ratio comes from the rows of `group` (see Target.metric).

        `peer` may be a list of row names: the ratio is then against the fastest of those measured
        in this run (lowest ms; highest rate for a rate metric), and the target records which won.

        A close call (the ratio within CLOSE_CALL of the minimum) is measured again and decided by that
        second measurement: ours and every peer within CLOSE_CALL of the fastest take turns for
        DECIDING_ROUNDS rounds (medians). Two reasons. Kernels that move the same bytes at a copy's rate
        tie within the noise, and the first figures picked both sides as the fastest of several noisy
        timings (our sweep's best, the fastest peer): a minimum of noisy equals is biased low, so the pick
        is timed afresh. And side by side, in turns, neither runs on a hotter GPU than the other.
        """
        candidates = [peer] if isinstance(peer, str) else list(dict.fromkeys(peer))
        if not candidates:
            raise ValueError(f"{group}: a target needs at least one peer")
        measured = [r for r in (self.find(group, name) for name in candidates) if r is not None]
        if metric != "speed":
            measured = [r for r in measured if getattr(r, metric)]
        # a rate metric compares work per ms: the same for every peer of a speed target
        work = {r.name: (getattr(r, metric) * r.ms if metric != "speed" else 1.0) for r in measured}
        best = min(measured, key=lambda r: r.ms / work[r.name]) if measured else None
        t = Target(group, ours, best.name if best else candidates[0], minimum, stretch, metric,
                   peers=candidates if len(candidates) > 1 else None)
        a = self.find(group, ours)
        if a and best:
            t.ratio = self._ratio(a, best, metric, a.ms, best.ms)
            if minimum is not None and abs(t.ratio / minimum - 1) <= CLOSE_CALL:
                self._decide(t, a, [r for r in measured if r.ms / work[r.name]
                                    <= (1 + CLOSE_CALL) * best.ms / work[best.name]], work)
            t.met = None if minimum is None else t.ratio >= minimum
        self.targets.append(t)
        return t

    @staticmethod
    def _ratio(a: Row, b: Row, metric: str, a_ms: float, b_ms: float) -> float:
        """ours / peer: peer ms / our ms for the same work, or our rate / the peer's at these times."""
        if metric == "speed":
            return b_ms / a_ms
        return (getattr(a, metric) * a.ms / a_ms) / (getattr(b, metric) * b.ms / b_ms)

    def _decide(self, t: Target, a: Row, close: list[Row], work: dict[str, float]) -> None:
        """Time ours and the close peers again in turns; the fastest peer of those medians sets t.ratio."""
        import statistics

        rows = [a, *close]
        if not current().gpu or any((t.group, r.name) not in self.runs for r in rows):
            return
        times = in_turns([(r.name, self.runs[t.group, r.name]) for r in rows], DECIDING_ROUNDS)
        ms = {name: statistics.median(v) for name, v in times.items()}
        peer = min(close, key=lambda r: ms[r.name] / work[r.name])
        t.decided = {"rounds": DECIDING_ROUNDS, "first_ratio": t.ratio, "first_peer": t.peer,
                     "ms": {name: round(v, 6) for name, v in ms.items()}}
        t.peer, t.ratio = peer.name, self._ratio(a, peer, t.metric, ms[a.name], ms[peer.name])

    def target_plain_and_graph(self, group: str, ours: str, peers: list[str], minimum: float | None,
                               stretch: float | None = None) -> None:
        """A target for work timed plainly and, where it is launch-bound, also in a CUDA graph.

        With graph rows (`ours + " [graph]"` and the peers'), the target is judged on them: the GPU's work
        of every side, launches replayed as a serving stack replays a decode step; the plain ratio, which
        adds each side's launch cost from Python, is reported beside it. Without, the plain ratio is judged:
        also when a measured peer has no graph row (its capture failed), so that no peer drops out.
        """
        ours_graph = self.find(group, ours + GRAPH) is not None
        missing = [p for p in peers if self.find(group, p) is not None and self.find(group, p + GRAPH) is None]
        graph = ours_graph and not missing
        if ours_graph and missing:
            self.notes.append(f"{group}: judged on plain timings: no CUDA-graph row for {', '.join(missing)}")
        self.target(group, ours, peers, None if graph else minimum, None if graph else stretch)
        if graph:
            self.target(group, ours + GRAPH, [p + GRAPH for p in peers], minimum, stretch)

    def show(self) -> None:
        print(format_rows(self.rows))
        if self.targets:
            print()
            print(format_targets(self.targets))
        for key, text in self.facts.items():
            print(f"fact {key}: {text}")

    def to_json(self) -> dict:
        return {"lesson": self.lesson, **environment(), "rows": [asdict(r) for r in self.rows],
                "targets": [asdict(t) for t in self.targets], "facts": self.facts, "notes": self.notes,
                "notebooks": self.notebooks, **({"error": self.error} if self.error else {})}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}".rstrip(": ")


def environment() -> dict:
    """Device, versions and date: what every results file records."""
    import numpy
    import torch
    import triton

    env = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
           "torch": torch.__version__, "triton": triton.__version__, "numpy": numpy.__version__}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, capability=list(torch.cuda.get_device_capability(0)),
                   sm_count=props.multi_processor_count, cuda=torch.version.cuda)
    else:
        env.update(device="cpu (interpreter)")
    return env


def format_rows(rows: list[Row]) -> str:
    lines = [f"{'group':<34} {'name':<24} {'ms':>9} {'GB/s':>8} {'TFLOP/s':>8}"]
    for r in rows:
        gb = f"{r.gbps:8.0f}" if r.gbps else f"{'':>8}"
        tf = f"{r.tflops:8.1f}" if r.tflops else f"{'':>8}"
        lines.append(f"{r.group:<34} {r.name:<24} {r.ms:9.4f} {gb} {tf}")
    return "\n".join(lines)


def ratio_text(ratio: float, minimum: float | None = None) -> str:
    """A ratio with two decimals, more where two would show a miss as its threshold: 0.9996 against
    1.00 reads "0.9996", not "1.00". A ratio that meets its threshold never rounds below it."""
    for digits in (2, 3, 4):
        text = f"{ratio:.{digits}f}"
        if minimum is None or (float(text) >= minimum) == (ratio >= minimum):
            return text
    return f"{int(ratio * 1e4) / 1e4:.4f}"  # a miss within 0.00005 of its threshold: cut, not rounded


def format_targets(targets: list[Target]) -> str:
    lines = [f"{'target':<60} {'ratio':>6} {'needs':>6}  met"]
    for t in targets:
        ratio = f"{ratio_text(t.ratio, t.minimum):>6}" if t.ratio is not None else f"{'-':>6}"
        met = {True: "yes", False: "NO", None: "not measured"}[t.met] if t.minimum is not None else "reported"
        needs = f"{t.minimum:6.2f}" if t.minimum is not None else f"{'-':>6}"
        peer = f"fastest of {len(t.peers)} ({t.peer})" if t.peers else t.peer
        lines.append(f"{t.group + ': ' + t.ours + ' vs ' + peer:<60} {ratio} {needs}  {met}")
    return "\n".join(lines)


# --- plots ------------------------------------------------------------------------------------

def plot(rows: list[dict] | list[Row], title: str, path: Path | None = None):
    """Bars of GB/s (or TFLOP/s) per group, one bar per implementation. Returns the figure."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = [r if isinstance(r, dict) else asdict(r) for r in rows]
    # A sweep's rows ("triton (ours) BLOCK=...") stay in the tables; the plot shows its best row.
    best = {r["group"] for r in rows if r["name"] == "triton (ours)"}
    rows = [r for r in rows if not (r["group"] in best and r["name"].startswith("triton (ours) ")
                                    and r["name"] != "triton (ours)" + GRAPH)]
    groups = list(dict.fromkeys(r["group"] for r in rows))
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 0.8 + 0.8 * len(groups) + 0.3 * len(rows)),
                             squeeze=False)
    for ax, group in zip(axes[:, 0], groups):
        members = [r for r in rows if r["group"] == group]
        metric = "tflops" if any(r.get("tflops") for r in members) else "gbps"
        unit = "TFLOP/s" if metric == "tflops" else "GB/s"
        names = [r["name"] for r in members]
        values = [r.get(metric) or 0.0 for r in members]
        colors = ["tab:orange" if "ours" in n else "tab:gray" for n in names]
        ax.barh(names, values, color=colors)
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.0f}" if v >= 10 else f" {v:.2f}", va="center", fontsize=8)
        ax.set_title(group, fontsize=9, loc="left")
        ax.set_xlabel(unit, fontsize=8)
        ax.invert_yaxis()
        ax.tick_params(labelsize=8)
        ax.margins(x=0.15)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


# --- results/ ---------------------------------------------------------------------------------

def device_key(name: str | None = None) -> str:
    """The short name of a GPU in results/ file names: "NVIDIA H100 80GB HBM3" -> "h100"."""
    import re

    if name is None:
        import torch

        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    found = re.search(r"\b([A-Z]+\d{1,4}[A-Z]?)\b", name.upper().replace("NVIDIA", ""))
    return found.group(1).lower() if found else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def result_path(lesson: str, suffix: str = ".json", device: str | None = None) -> Path:
    """results/<stem>.<device><suffix>: the file of this GPU (or of `device`, e.g. "h200")."""
    from .lessons_index import lesson as lesson_record

    return results_dir() / f"{lesson_record(lesson).stem}.{device or device_key()}{suffix}"


def save(table: Table) -> Path:
    """Write results/<stem>.<device>.json and its plot, for the GPU this runs on; returns the JSON path."""
    results_dir().mkdir(exist_ok=True)
    path = result_path(table.lesson)
    data = table.to_json()
    path.write_text(json.dumps(data, indent=1) + "\n")
    if table.rows:
        plot(table.rows, f"lesson {table.lesson} on {data['device']}", result_path(table.lesson, ".png"))
    return path


def load_results(lesson: str, device: str | None = None) -> dict | None:
    """The committed results of a lesson: `device`'s file if asked; else this GPU's file if there is
    one, else the reference GPU's (figures.DEVICES), else any device's. None when there is none."""
    from .figures import measured, results_path
    from .lessons_index import lesson as lesson_record

    stem = lesson_record(lesson).stem
    if device:
        path = results_path(stem, device)
    else:
        here = results_path(stem, _this_gpu()) if _this_gpu() else None
        path = here if here and measured(here) else results_path(stem)
    return json.loads(path.read_text()) if path else None


def _this_gpu() -> str | None:
    return device_key() if current().gpu else None


def show_results(lesson: str) -> dict | None:
    """Print the committed GPU results of a lesson (and display the plot in a notebook)."""
    data = load_results(lesson)
    if data is None:
        print(f"no committed GPU results for lesson {lesson} yet (run `python -m course_utils bench {lesson}` on a GPU)")
        return None
    print(f"measured on {data['device']} on {data['date']} (torch {data['torch']}, triton {data['triton']})")
    print(format_rows([Row(**r) for r in data.get("rows", [])]))
    if data.get("targets"):
        print()
        print(format_targets([Target(**t) for t in data["targets"]]))
    for key, text in data.get("facts", {}).items():
        print(f"fact {key}: {text}")
    png = result_path(lesson, ".png", device_key(data["device"]))
    if png.exists():
        try:
            from IPython.display import Image, display

            display(Image(filename=str(png)))
        except ImportError:
            pass
    return data

