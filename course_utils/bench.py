"""Benchmarks: honest GPU timings, rates against the device's ceilings, tables, plots, results/.

On a GPU, `Table.time(...)` runs `triton.testing.do_bench` (median of many runs after a warm-up)
and turns milliseconds into GB/s and TFLOP/s. In the interpreter timing means nothing, so
`Table.time` refuses (one clear line) and `show_results(lesson)` shows what a real GPU measured.
"""
from __future__ import annotations

import datetime
import json
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .lessons_index import course_root
from .mode import current

RESULTS = course_root() / "results"


def can_time() -> bool:
    """True on a GPU; in the interpreter prints why nothing is timed and returns False."""
    if current().gpu:
        return True
    print("interpreter mode: timings would measure Python, not a GPU, so nothing is timed here; "
          "show_results(lesson) shows the committed GPU figures")
    return False


def do_bench(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds of fn() on the GPU (CUDA events; L2 flushed between runs)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


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
    """A ratio the design asks for: metric(ours) / metric(peer) >= minimum (None: only reported)."""

    group: str
    ours: str
    peer: str
    minimum: float | None
    stretch: float | None = None
    metric: str = "speed"  # "speed": peer ms / our ms (same work); "gbps" or "tflops": our rate / peer rate
    ratio: float | None = None
    met: bool | None = None


@dataclass
class Table:
    lesson: str
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    notebooks: dict = field(default_factory=dict)  # notebook -> {"ok", "seconds", "error"} (prove)

    def time(self, group: str, name: str, fn: Callable[[], object], *, n_bytes: float | None = None,
             flops: float | None = None, rep_ms: int = 100) -> Row | None:
        """Time fn on the GPU and record a row; returns None (and times nothing) in the interpreter."""
        if not current().gpu:
            return None
        ms = do_bench(fn, rep_ms=rep_ms)
        return self.add(group, name, ms, n_bytes=n_bytes, flops=flops)

    def add(self, group: str, name: str, ms: float, *, n_bytes: float | None = None,
            flops: float | None = None) -> Row:
        row = Row(group, name, ms, gb_per_s(n_bytes, ms) if n_bytes else None,
                  tflop_per_s(flops, ms) if flops else None)
        self.rows.append(row)
        return row

    def add_best(self, group: str, name: str = "triton (ours)", *, n_bytes: float | None = None,
                 flops: float | None = None) -> Row | None:
        """Add the fastest of the sweep rows `name ...` of `group` as `name`, the row targets compare."""
        sweep = [r for r in self.rows if r.group == group and r.name.startswith(name + " ")]
        if not sweep:
            return None
        best = min(sweep, key=lambda r: r.ms)
        self.notes.append(f"{group}: best of our sweep is {best.name}")
        return self.add(group, name, best.ms, n_bytes=n_bytes, flops=flops)

    def find(self, group: str, name: str) -> Row | None:
        return next((r for r in self.rows if r.group == group and r.name == name), None)

    def target(self, group: str, ours: str, peer: str, minimum: float | None, stretch: float | None = None,
               metric: str = "speed") -> Target:
        """Record a target; its ratio comes from the rows of `group` (see Target.metric)."""
        t = Target(group, ours, peer, minimum, stretch, metric)
        a, b = self.find(group, ours), self.find(group, peer)
        if a and b:
            t.ratio = b.ms / a.ms if metric == "speed" else getattr(a, metric) / getattr(b, metric)
            t.met = None if minimum is None else t.ratio >= minimum
        self.targets.append(t)
        return t

    def show(self) -> None:
        print(format_rows(self.rows))
        if self.targets:
            print()
            print(format_targets(self.targets))

    def to_json(self) -> dict:
        return {"lesson": self.lesson, **environment(), "rows": [asdict(r) for r in self.rows],
                "targets": [asdict(t) for t in self.targets], "notes": self.notes, "notebooks": self.notebooks}


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


def format_targets(targets: list[Target]) -> str:
    lines = [f"{'target':<60} {'ratio':>6} {'needs':>6}  met"]
    for t in targets:
        ratio = f"{t.ratio:6.2f}" if t.ratio is not None else f"{'-':>6}"
        met = {True: "yes", False: "NO", None: "not measured"}[t.met] if t.minimum is not None else "reported"
        needs = f"{t.minimum:6.2f}" if t.minimum is not None else f"{'-':>6}"
        lines.append(f"{t.group + ': ' + t.ours + ' vs ' + t.peer:<60} {ratio} {needs}  {met}")
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
    rows = [r for r in rows if not (r["group"] in best and r["name"].startswith("triton (ours) "))]
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
    found = re.search(r"\b([A-Z]+\d{2,4}[A-Z]?)\b", name.upper().replace("NVIDIA", ""))
    return found.group(1).lower() if found else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def result_path(lesson: str, suffix: str = ".json", device: str | None = None) -> Path:
    """results/<stem>.<device><suffix>: the file of this GPU (or of `device`, e.g. "h200")."""
    from .lessons_index import lesson as lesson_record

    return RESULTS / f"{lesson_record(lesson).stem}.{device or device_key()}{suffix}"


def save(table: Table) -> Path:
    """Write results/<lesson>.json and its plot; returns the JSON path."""
    RESULTS.mkdir(exist_ok=True)
    path = result_path(table.lesson)
    data = table.to_json()
    path.write_text(json.dumps(data, indent=1) + "\n")
    if table.rows:
        plot(table.rows, f"lesson {table.lesson} on {data['device']}", result_path(table.lesson, ".png"))
    return path


def load_results(lesson: str, device: str | None = None) -> dict | None:
    """The committed results of a lesson: this GPU's file if there is one, else the reference GPU's."""
    from .figures import results_path
    from .lessons_index import lesson as lesson_record

    stem = lesson_record(lesson).stem
    path = results_path(stem, device) if device else (results_path(stem, _this_gpu()) or results_path(stem))
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
    print(format_rows([Row(**r) for r in data["rows"]]))
    if data.get("targets"):
        print()
        print(format_targets([Target(**t) for t in data["targets"]]))
    png = result_path(lesson, ".png", device_key(data["device"]))
    if png.exists():
        try:
            from IPython.display import Image, display

            display(Image(filename=str(png)))
        except ImportError:
            pass
    return data


def progress_bar(items, desc: str):
    """A progress bar for sweeps (tqdm picks the notebook or terminal flavour)."""
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False)
