"""Draws the figures of lesson 06; the images are committed and the notebook only links them.

- 06_netron_mlp_block.png: Netron's drawing of the small toy Llama's RMSNorm + MLP block (ONNX), as
  `course_utils.netron.show` serves it; needs Chromium (Debian: apt-get install chromium).
- 06_fusion.png: the same 13 nodes grouped into the kernels that compute them: Hugging Face eager,
  then lesson 06's two kernels.

Run from the repository root: `python notebooks/img/06_make_figures.py`. The screenshot drives
headless Chromium (course_utils.chromium).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def netron_screenshot(path: Path) -> None:
    from course_utils import chromium, netron

    with tempfile.TemporaryDirectory() as scratch:
        onnx_path = netron.export_mlp_block(Path(scratch) / "mlp_block_small.onnx", small=True)
        url = netron.serve(onnx_path)
        try:
            drawn = chromium.render_netron(url, width=900, height=1400, scale=2)
        finally:
            netron.stop(url)
    path.write_bytes(drawn.png)
    _crop(path)


def _crop(path: Path, margin: int = 16) -> None:
    """Cut the white page around the graph (and Netron's buttons in the corners)."""
    import io

    from PIL import Image, ImageChops

    image = Image.open(io.BytesIO(path.read_bytes())).convert("RGB")
    inner = image.crop((120, 120, image.width - 120, image.height - 120))  # the toolbar sits in the corners
    box = ImageChops.difference(inner, Image.new("RGB", inner.size, "white")).getbbox()
    left, top, right, bottom = box
    edge = 120 - margin
    image.crop((left + edge, top + edge, right + 120 + margin, bottom + 120 + margin)).save(path)


# The ONNX nodes of the block, in order, with the kernel that computes each (HF eager, then ours).
NODES = [
    ("Pow", "x**2", "norm"), ("ReduceMean", "mean over hidden", "norm"), ("Add", "+ eps", "norm"),
    ("Sqrt", "", "norm"), ("Reciprocal", "1 / rms", "norm"), ("Mul", "x * (1/rms)", "norm"),
    ("Mul", "* norm.weight", "norm"), ("MatMul", "gate", "gate"), ("Sigmoid", "", "silu"),
    ("Mul", "silu = g * sig(g)", "silu"), ("MatMul", "up", "up"), ("Mul", "silu(g) * u", "silu"),
    ("MatMul", "down", "down"),
]
HF_KERNELS = {"norm": "8 kernels in fp16:\ncast to fp32, pow, mean,\nadd, rsqrt, mul, cast, mul",
              "gate": "cuBLAS", "up": "cuBLAS", "silu": "silu, mul:\n2 kernels", "down": "cuBLAS"}
OURS = {"norm": 0, "gate": 0, "silu": 0, "up": 0, "down": 1}
OUR_NAMES = ["rmsnorm_gate_up_silu_kernel\n(statistics in the K loop,\nx * norm.weight on load)",
             "lesson 03 matmul\n(h @ w_down.T)"]
COLORS = {"norm": "#f2c6a0", "gate": "#b7d3f2", "up": "#b7d3f2", "silu": "#cfe8cf", "down": "#e3c8f0"}


def fusion_diagram(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 6.4))
    n = len(NODES)
    for i, (op, note, part) in enumerate(NODES):
        y = n - 1 - i
        ax.add_patch(FancyBboxPatch((3.3, y + 0.12), 2.4, 0.76, boxstyle="round,pad=0.02",
                                    fc=COLORS[part], ec="0.3"))
        ax.text(4.5, y + 0.5, f"{op}  {note}".strip(), ha="center", va="center", fontsize=8.5)
    # HF eager: one bracket per group of nodes
    spans = {}
    for i, (_, _, part) in enumerate(NODES):
        spans.setdefault(part, []).append(n - 1 - i)
    for part, ys in spans.items():
        for y in ys:
            ax.plot([2.9, 3.3], [y + 0.5, y + 0.5], color="0.6", lw=0.8)
        label_y = sum(ys) / len(ys) + 0.5
        ax.text(2.8, label_y, HF_KERNELS[part], ha="right", va="center", fontsize=8)
    # ours: two kernels
    for k, name in enumerate(OUR_NAMES):
        ys = [n - 1 - i for i, (_, _, part) in enumerate(NODES) if OURS[part] == k]
        top, bottom = max(ys) + 0.95, min(ys) + 0.05
        ax.add_patch(FancyBboxPatch((6.1, bottom), 0.25, top - bottom, boxstyle="round,pad=0.02",
                                    fc="tab:orange", ec="none", alpha=0.8))
        ax.text(6.55, (top + bottom) / 2, name, ha="left", va="center", fontsize=8.5)
    ax.text(2.8, n + 0.4, "Hugging Face eager: 13 kernels", ha="right", fontsize=10, weight="bold")
    ax.text(4.5, n + 0.4, "ONNX nodes", ha="center", fontsize=10, weight="bold")
    ax.text(6.1, n + 0.4, "lesson 06: 2 kernels", ha="left", fontsize=10, weight="bold")
    ax.set_xlim(-0.2, 9.6)
    ax.set_ylim(-0.3, n + 1.0)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    fusion_diagram(HERE / "06_fusion.png")
    netron_screenshot(HERE / "06_netron_mlp_block.png")
    print("wrote", HERE / "06_fusion.png", "and", HERE / "06_netron_mlp_block.png")
