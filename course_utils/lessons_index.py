"""The course map: one record per lesson, keyed by its stem `NN_name`.

The stem names every file of a lesson: notebooks/src/NN_name.py (the lesson's source),
notebooks/NN_name.ipynb, exercises/ and solutions/NN_name.ipynb, course_utils/lessons/lNN_name.py
(the solution module), course_utils/checks/lNN_name.py, course_utils/benches/lNN_name.py,
tests/test_NN_name.py and results/NN_name.*.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Lesson:
    stem: str  # "05_online_softmax"
    title: str
    needs: tuple[int, int] | None  # minimum compute capability of the full GPU path; None: any
    needs_note: str  # what needs what, in words (the doctor and the README's course map show it)

    @property
    def number(self) -> str:
        return self.stem[:2]

    @property
    def module(self) -> str:
        """The Python name of the lesson's modules (lessons/, checks/, benches/): `l` + stem."""
        return f"l{self.stem}"


LESSONS: dict[str, Lesson] = {lesson.number: lesson for lesson in (
    Lesson("00_setup", "Setup: the doctor, the two modes, how checks work", None, "runs anywhere"),
    Lesson("01_strides_and_intensity", "Strided tensors, memory hierarchy, arithmetic intensity, the roofline",
           None, "runs anywhere; the roofline uses your GPU's measured ceilings when there is one"),
    Lesson("02_first_kernels", "First kernels: program ids, blocks, masks, GB/s against the copy ceiling",
           None, "runs anywhere"),
    Lesson("03_matmul", "Matmul: naive, tiled, grouped, autotuned, tensor cores, a fused epilogue",
           (8, 0), "bf16 tensor cores need sm_80+; fp16/fp32 run anywhere"),
    Lesson("04_fusion", "Fusion: launch overhead, memory traffic, torch.compile as a fusion compiler",
           (7, 0), "torch.compile, the profiler and CUDA graphs need a GPU; kernels run anywhere"),
    Lesson("05_online_softmax", "Online softmax, a fused softmax kernel, FlashAttention",
           (8, 0), "bf16 attention needs sm_80+; softmax runs anywhere"),
    Lesson("06_fused_rmsnorm_mlp", "The toy Llama: ONNX/Netron, fused RMSNorm, SwiGLU and RMSNorm+MLP",
           (8, 0), "bf16 needs sm_80+; fp32/fp16 run anywhere"),
    Lesson("07_fp8_quantization", "FP8 quantization, W8A16 GEMV, int4 packing",
           (8, 9), "FP8 dots need sm_89+ (Ada, Hopper); quantize, decode and packing run anywhere"),
    Lesson("08_backward_passes", "Backward passes: autograd Functions, RMSNorm, SwiGLU and cross-entropy "
           "backward, training the toy Llama", (8, 0),
           "bf16 training needs sm_80+ (fp16 on older GPUs); kernels run anywhere"),
    Lesson("09_decoding", "Decoding: KV cache, GQA, flash-decoding, int4 weights, the toy Llama generating",
           (8, 0), "bf16 decoding needs sm_80+ (fp16 on older GPUs); kernels run anywhere"),
)}


def lesson(key: str) -> Lesson:
    """The record of a lesson, by number ("05") or stem ("05_online_softmax")."""
    found = LESSONS.get(key[:2])
    if found is None or (len(key) > 2 and key != found.stem):
        raise KeyError(f"no lesson {key!r}; lessons: {', '.join(LESSONS)}")
    return found


def lesson_number(key: str | int) -> str:
    """A lesson's number from 2, "2", "02" or its stem: "02". KeyError where the course has no such lesson."""
    text = str(key)
    return lesson(f"{int(text):02d}" if text.isdigit() else text).number


def course_root() -> Path:
    """The checkout holding results/ and notebooks/, found when called: this package's parent in a local
    install, else $COURSE_ROOT or ./course (where the Colab bootstrap cell clones it)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (os.environ.get("COURSE_ROOT"), here, Path.cwd() / "course", Path.cwd().parent):
        if candidate and (Path(candidate) / "results").is_dir():
            return Path(candidate)
    return here
