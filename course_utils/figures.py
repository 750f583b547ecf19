"""Measured figures in lesson prose, rendered from results/ by the build (so prose and measurement agree).

A markdown cell of a lesson source writes a placeholder where a measured number goes:

    {{ratio:matmul fp16 4096^3|triton (ours)|torch.matmul (cuBLAS)}}   -> "0.97 x" (a target's ratio)
    {{ratio:sin^4 fp32 2^26|triton (ours)|fastest}}   -> the ratio of a target against the fastest of
                        several peers (`table.target(..., [peer, ...])`); {{peer:GROUP|OURS}} names the winner.
                        A ratio with no such target is the speed ratio of the two rows (peer ms / our ms).
    {{ms:GROUP|NAME}} {{us:GROUP|NAME}} {{gbps:GROUP|NAME}} {{tflops:GROUP|NAME}}   -> one row's figure
    {{fact:KEY}}        -> a figure the bench recorded by name (`table.fact(KEY, text)`), as recorded
    {{verdict:GROUP|OURS|PEER}}   -> "met" or "missed": the target's verdict in that run (PEER as for ratio)
    {{measured}}        -> where and when: "NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, 2026-11-22"

By default a placeholder reads the lesson's own results on the course's reference GPU; a prefix picks
another lesson's file or another device: {{03_matmul/ratio:...}}, {{ms@h100:...}}, {{05_online_softmax/fact@h100:KEY}}.
A placeholder whose figure is missing fails the build, so no lesson can cite a figure nobody measured.
"""
from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from .bench import ratio_text


DEVICES = ("h200", "h100")  # the reference GPU first: placeholders without @device read its file
PLACEHOLDER = re.compile(r"\{\{\s*(?:(?P<stem>\d\d_[a-z0-9_]+)/)?(?P<kind>[a-z]+)(?:@(?P<device>[a-z0-9]+))?"
                         r"(?::(?P<args>[^}]*))?\s*\}\}")


class MissingFigure(ValueError):
    """A placeholder names a figure that no results file holds."""


def results_path(stem: str, device: str | None = None) -> Path | None:
    """results/<stem>.<device>.json for the device asked (or the first device that has one)."""
    from . import bench

    folder = bench.results_dir()
    if device:
        path = folder / f"{stem}.{device}.json"
        return path if path.exists() else None
    # Without a device asked for: the first file that holds measurements (a `prove --notebooks-only` file
    # records notebook runs only, and never shadows another GPU's figures).
    candidates = [folder / f"{stem}.{dev}.json" for dev in DEVICES] + sorted(folder.glob(f"{stem}.*.json"))
    return next((path for path in candidates if path.exists() and measured(path)), None)


def measured(path: Path) -> bool:
    """Does a results file hold measured rows (not only a record of notebook runs)?"""
    return bool(_load(path, path.stat().st_mtime).get("rows"))


@cache
def _load(path: Path, mtime: float) -> dict:
    return json.loads(path.read_text())


def load(stem: str, device: str | None = None) -> dict:
    path = results_path(stem, device)
    if path is None:
        raise MissingFigure(f"no results for {stem} on {device or ' or '.join(DEVICES)} under results/")
    return _load(path, path.stat().st_mtime)


def _row(data: dict, group: str, name: str) -> dict:
    for row in data.get("rows", []):
        if row["group"] == group and row["name"] == name:
            return row
    raise MissingFigure(f"no row {group!r} / {name!r} in results of lesson {data.get('lesson')}")


def _target(data: dict, group: str, ours: str, peer: str) -> dict | None:
    """The measured target of (group, ours) against `peer`: its exact peer name, or "fastest" for the
    target whose ratio is against the fastest of several candidates."""
    for t in data.get("targets", []):
        if (t["group"], t["ours"]) != (group, ours) or t.get("ratio") is None:
            continue
        if t["peer"] == peer or (peer == "fastest" and t.get("peers")):
            return t
    return None


def _sig(x: float, digits: int = 3) -> str:
    """A figure with `digits` significant digits, no exponent: 0.0777, 1.36, 412, 4217."""
    if x == 0:
        return "0"
    text = f"{x:.{digits}g}"
    if "e" in text:
        text = f"{x:.0f}"
    return text


def render_one(match: re.Match, default_stem: str) -> str:
    stem = match["stem"] or default_stem
    kind, args = match["kind"], [a.strip() for a in (match["args"] or "").split("|")]
    data = load(stem, match["device"])
    if kind == "measured":
        return f"{data['device']}, torch {data['torch']}, triton {data['triton']}, {data['date']}"
    if kind == "fact":
        facts = data.get("facts", {})
        if args[0] not in facts:
            raise MissingFigure(f"no fact {args[0]!r} in results of {stem}")
        return str(facts[args[0]])
    if kind == "verdict":
        t = _target(data, *args)
        if t is None or t.get("met") is None:
            raise MissingFigure(f"no target with a verdict {args} in results of {stem}")
        return "met" if t["met"] else "missed"
    if kind in ("ratio", "peer"):
        group, ours, peer = (*args, "fastest") if kind == "peer" and len(args) == 2 else args
        t = _target(data, group, ours, peer)
        if t is None and kind == "ratio" and peer != "fastest":
            return f"{_row(data, group, peer)['ms'] / _row(data, group, ours)['ms']:.2f} x"  # two rows' speeds
        if t is None:
            raise MissingFigure(f"no measured ratio {group!r}: {ours!r} vs {peer!r} in results of {stem}")
        return f"{ratio_text(t['ratio'], t.get('minimum'))} x" if kind == "ratio" else t["peer"]
    if kind in ("ms", "us", "gbps", "tflops"):
        row = _row(data, *args)
        if kind == "ms":
            return f"{_sig(row['ms'])} ms"
        if kind == "us":
            return f"{_sig(row['ms'] * 1e3)} µs"
        value = row[kind]
        if value is None:
            raise MissingFigure(f"row {args} of {stem} has no {kind}")
        return f"{value:.0f} GB/s" if kind == "gbps" else f"{_sig(value)} TFLOP/s"
    raise MissingFigure(f"unknown placeholder kind {kind!r} (ratio, peer, verdict, ms, us, gbps, tflops, fact, measured)")


def render(markdown: str, stem: str) -> str:
    """Replace every placeholder of a markdown text by its figure from results/."""
    return PLACEHOLDER.sub(lambda m: render_one(m, stem), markdown)


# A measured-looking figure typed into prose: a number with a time, rate or ratio unit.
TYPED = re.compile(r"(?<![\w.{])\d[\d,]*(?:\.\d+)?\s?(?:ms|µs|us|ns|GB/s|TB/s|GiB/s|TFLOP/s|PFLOP/s|GFLOP/s|"
                   r"TFLOPS|x(?= (?:as fast|faster|slower|the|of|torch|cuBLAS|eager|copy))|×)(?![\w/])")
# A sentence may quote a number that was not measured here when it says where it comes from.
SOURCED = re.compile(r"datasheet|assumed|quoted|paper|spec|for example|e\.g\.|target|we ask|must reach",
                     re.I)


def typed_figures(markdown: str) -> list[str]:
    """Figures typed by hand into prose (placeholders excepted, sourced sentences excepted)."""
    found = []
    for line in PLACEHOLDER.sub("", markdown).splitlines():
        for sentence in re.split(r"(?<=[.;:!?])\s+", line):
            if SOURCED.search(sentence):
                continue
            found += [m.group(0) for m in TYPED.finditer(sentence)]
    return found
