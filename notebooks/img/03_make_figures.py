"""Draws the figures of lesson 03: notebooks/img/03_tiling.png and notebooks/img/03_launch_order.png.

Run from the repository root: `python notebooks/img/03_make_figures.py`. The images are committed;
the notebook only links them.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from course_utils.lessons.l03_matmul import grouped_pid  # noqa: E402

HERE = Path(__file__).resolve().parent


def draw_tiling(path: Path) -> None:
    """C = A @ B with one L x L tile of C, the panels of A and B it reads, and one K step."""
    fig, ax = plt.subplots(figsize=(8.5, 6.0))
    n, tile, step = 8.0, 1.0, 1.0  # drawn sizes: N, the tile L, BLOCK_K
    row, col, k = 5, 2, 3  # the tile of C (from the top) and the K step the figure follows
    ax_a, ay_a = 0.0, 0.0  # A (M x K) bottom-left
    bx, by = n + 1.0, n + 1.0  # B (K x N) top-right
    cx, cy = n + 1.0, 0.0  # C (M x N) bottom-right

    def rect(x, y, w, h, **kw):
        ax.add_patch(Rectangle((x, y), w, h, **kw))

    for x, y, label in ((ax_a, ay_a, "A  (M x K)"), (bx, by, "B  (K x N)"), (cx, cy, "C  (M x N)")):
        rect(x, y, n, n, fill=False, lw=1.5)
        ax.text(x + n / 2, y - 0.5 if y == 0 else y + n + 0.3, label, ha="center", fontsize=11)
    ty = cy + n - (row + 1) * tile  # the tile's bottom edge
    tx = cx + col * tile
    rect(ax_a, ty, n, tile, color="#9ecae1", alpha=0.6)  # the row panel of A: L x K
    rect(tx, by, tile, n, color="#a1d99b", alpha=0.6)  # the column panel of B: K x L
    rect(ax_a + k * step, ty, step, tile, color="#3182bd")  # this K step's A tile: L x BLOCK_K
    rect(tx, by + n - (k + 1) * step, tile, step, color="#31a354")  # this K step's B tile: BLOCK_K x L
    rect(tx, ty, tile, tile, color="#fd8d3c")  # the tile of C: L x L, accumulated in registers
    ax.add_patch(FancyArrowPatch((ax_a + k * step + step / 2, ty + tile / 2), (tx, ty + tile / 2),
                                 arrowstyle="->", mutation_scale=14, lw=1.2))
    ax.add_patch(FancyArrowPatch((tx + tile / 2, by + n - (k + 0.5) * step), (tx + tile / 2, ty + tile),
                                 arrowstyle="->", mutation_scale=14, lw=1.2))
    ax.text(ax_a + n / 2, ty + tile + 0.2, "row panel: L x K elements", ha="center", fontsize=9)
    ax.text(tx + tile + 0.15, by + n / 2, "column panel:\nK x L elements", va="center", fontsize=9)
    ax.text(tx + tile + 0.15, ty + tile / 2, "one L x L tile of C\n= one program", va="center", fontsize=9)
    ax.text(ax_a, -1.6, "Per K step a program loads an L x BLOCK_K tile of A and a BLOCK_K x L tile of B and "
            "does acc = tl.dot(a, b, acc).\nIn all it loads 2LK elements for 2L\u00b2K FLOPs; "
            "(N/L)\u00b2 programs load 2N\u00b3/L elements in total (2N\u00b3 for L = 1: the naive kernel).",
            fontsize=9, va="top")
    ax.set_xlim(-0.5, 2 * n + 3.0)
    ax.set_ylim(-2.8, 2 * n + 1.8)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_launch_order(path: Path) -> None:
    """The launch index of every tile: row-major vs grouped, with the first wave of programs shaded."""
    num_pid_m, num_pid_n, group_m, wave = 8, 8, 4, 16
    orders = {
        "row-major: pid -> (pid // num_pid_n, pid % num_pid_n)": lambda p: divmod(p, num_pid_n),
        f"grouped, group_m = {group_m}": lambda p: grouped_pid(p, num_pid_m, num_pid_n, group_m),
    }
    fig, axes = plt.subplots(1, 2, figsize=(10, 5.2))
    for ax, (title, order) in zip(axes, orders.items()):
        for pid in range(num_pid_m * num_pid_n):
            m, n = order(pid)
            shade = "#fd8d3c" if pid < wave else "white"
            ax.add_patch(Rectangle((n, num_pid_m - 1 - m), 1, 1, facecolor=shade, edgecolor="gray"))
            ax.text(n + 0.5, num_pid_m - 0.5 - m, str(pid), ha="center", va="center", fontsize=9)
        tiles = [order(p) for p in range(wave)]
        rows, cols = len({t[0] for t in tiles}), len({t[1] for t in tiles})
        ax.set_title(f"{title}\nfirst {wave} programs need {rows} row panels of A + {cols} column panels "
                     f"of B = {rows + cols}", fontsize=9)
        ax.set_xlim(0, num_pid_n)
        ax.set_ylim(0, num_pid_m)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=0.88, wspace=0.08)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    draw_tiling(HERE / "03_tiling.png")
    draw_launch_order(HERE / "03_launch_order.png")
