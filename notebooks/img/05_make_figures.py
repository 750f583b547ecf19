"""Draws notebooks/img/05_flash_attention.png, the tiling diagram of lesson 05.

Run from the repository root: `python notebooks/img/05_make_figures.py`. The image is committed;
the notebook only links it.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

HERE = Path(__file__).resolve().parent
TILES = 8  # query tiles = key tiles in the drawing (BLOCK_M = BLOCK_N here)
ROW = 5  # the query tile whose program the figure follows
D = 2.2  # drawn width of the head dimension, in tile units


def draw(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9.5, 6.2))
    top = TILES + D + 0.8  # K^T sits above the score grid
    # The score grid, causal: below the diagonal no mask, on it masked, above it skipped.
    for i in range(TILES):
        for j in range(TILES):
            y = TILES - 1 - i
            if j < i:
                color, hatch = "#cfe8cf", None
            elif j == i:
                color, hatch = "#f6c48f", None
            else:
                color, hatch = "white", "///"
            ax.add_patch(Rectangle((j, y), 1, 1, facecolor=color, edgecolor="0.6", hatch=hatch, lw=0.8))
    y_row = TILES - 1 - ROW
    ax.add_patch(Rectangle((0, y_row), ROW + 1, 1, fill=False, edgecolor="tab:red", lw=2.5))
    ax.add_patch(FancyArrowPatch((0.2, y_row + 0.5), (ROW + 0.8, y_row + 0.5), arrowstyle="-|>",
                                 mutation_scale=14, color="tab:red", lw=1.5))
    ax.text(TILES / 2, -0.55, "scores S = Q K^T (S x S): never written to memory", ha="center", fontsize=9)
    # Q on the left, the program's tile highlighted.
    ax.add_patch(Rectangle((-D - 0.8, 0), D, TILES, facecolor="#e3ecf7", edgecolor="0.5"))
    ax.add_patch(Rectangle((-D - 0.8, y_row), D, 1, facecolor="#7fa7d9", edgecolor="tab:red", lw=2))
    ax.text(-D / 2 - 0.8, TILES + 0.2, "Q (S x D)", ha="center", fontsize=9)
    ax.text(-D / 2 - 0.8, y_row + 0.5, "BLOCK_M\nqueries", ha="center", va="center", fontsize=7)
    # K^T above, one key tile per column.
    for j in range(TILES):
        shade = "#7fa7d9" if j <= ROW else "#e3ecf7"
        ax.add_patch(Rectangle((j, TILES + 0.8), 1, D, facecolor=shade, edgecolor="0.5"))
    ax.text(TILES / 2, top + 0.25, "K^T (D x S), walked in tiles of BLOCK_N keys", ha="center", fontsize=9)
    # V on the right, its tiles stacked like the key tiles (drawn as rows of a D-wide strip).
    vx = TILES + 0.8
    for j in range(TILES):
        shade = "#7fa7d9" if j <= ROW else "#e3ecf7"
        ax.add_patch(Rectangle((vx, TILES - 1 - j), D, 1, facecolor=shade, edgecolor="0.5"))
    ax.text(vx + D / 2, TILES + 0.2, "V (S x D)", ha="center", fontsize=9)
    # The program's state.
    ax.text(vx + D + 0.4, y_row + 0.5,
            "per query row, in registers:\n"
            "m  running max\n"
            "l  running sum of exp(s - m)\n"
            "acc  running sum of exp(s - m) v\n\n"
            "each key tile:\n"
            "alpha = exp(m_old - m_new)\n"
            "l = l alpha + rowsum(p)\n"
            "acc = acc alpha + p @ V_tile\n\n"
            "at the end: O = acc / l",
            va="center", fontsize=8, family="monospace")
    # Legend.
    legend = [("#cfe8cf", None, "key tile before the query tile: no mask"),
              ("#f6c48f", None, "diagonal tile: causal mask j <= i"),
              ("white", "///", "above the diagonal: skipped (causal)")]
    for k, (color, hatch, label) in enumerate(legend):
        y = -1.5 - 0.6 * k
        ax.add_patch(Rectangle((-D - 0.8, y), 0.5, 0.4, facecolor=color, edgecolor="0.6", hatch=hatch))
        ax.text(-D - 0.1, y + 0.2, label, va="center", fontsize=8)
    ax.text(TILES + 0.8, -1.5 + 0.2, "red: one program = one query tile,\nwalking its key tiles left to right",
            va="center", fontsize=8, color="tab:red")
    ax.set_xlim(-D - 1.2, TILES + D + 6.2)
    ax.set_ylim(-3.3, top + 0.7)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("FlashAttention forward, causal: one program per tile of queries", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    draw(HERE / "05_flash_attention.png")
