"""The course map: every lesson's stem, title and what it needs from the hardware."""
from __future__ import annotations

import os
from pathlib import Path

LESSONS = {
    "00": "00_setup",
    "01": "01_strides_and_intensity",
    "02": "02_first_kernels",
    "03": "03_matmul",
    "04": "04_fusion",
    "05": "05_online_softmax",
    "06": "06_fused_rmsnorm_mlp",
    "07": "07_fp8_quantization",
}

TITLES = {
    "00": "Setup: the doctor, the two modes, how checks work",
    "01": "Strided tensors, memory hierarchy, arithmetic intensity, the roofline",
    "02": "First kernels: program ids, blocks, masks, GB/s against the copy ceiling",
    "03": "Matmul: naive, tiled, grouped, autotuned, tensor cores, a fused epilogue",
    "04": "Fusion: launch overhead, memory traffic, torch.compile as a fusion compiler",
    "05": "Online softmax, a fused softmax kernel, FlashAttention",
    "06": "The toy Llama: ONNX/Netron, fused RMSNorm, SwiGLU and RMSNorm+MLP",
    "07": "FP8 quantization, W8A16 GEMV, int4 packing",
}

# What each lesson needs: (minimum compute capability for the full GPU path or None, note).
NEEDS = {
    "00": (None, "runs anywhere"),
    "01": (None, "runs anywhere; the roofline uses your GPU's measured ceilings when there is one"),
    "02": (None, "runs anywhere"),
    "03": ((8, 0), "bf16 tensor cores need sm_80+; fp16/fp32 run anywhere"),
    "04": ((7, 0), "torch.compile, the profiler and CUDA graphs need a GPU; kernels run anywhere"),
    "05": ((8, 0), "bf16 attention needs sm_80+; softmax runs anywhere"),
    "06": ((8, 0), "bf16 needs sm_80+; fp32/fp16 run anywhere"),
    "07": ((8, 9), "FP8 dots need sm_89+ (Ada, Hopper); quantize, decode and packing run anywhere"),
}


def course_root() -> Path:
    """The checkout holding results/ and notebooks/: this package's parent in a local install, else
    $COURSE_ROOT or ./course (where the Colab bootstrap cell clones it)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (os.environ.get("COURSE_ROOT"), here, Path.cwd() / "course", Path.cwd().parent):
        if candidate and (Path(candidate) / "results").is_dir():
            return Path(candidate)
    return here
