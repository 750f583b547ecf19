"""The course's launches fit the shared memory of the GPUs Colab ships, not only the H100's it is tuned on.

A launch whose tiles and pipeline stages need more shared memory than the GPU has fails ("out of resources:
shared memory"), and the interpreter never sees it. Triton's compiler needs no GPU, so a child process per
architecture runs the host functions themselves with tensors on the CPU: torch answers the device queries
for the GPU under test, and every launch is compiled for it instead of run. The host code chooses its tiles
from `max_shared_memory` (lesson 05), the opt-in maximum per block.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from course_utils.lessons import l05_online_softmax as l05
from course_utils.lessons import l06_fused_rmsnorm_mlp as l06
from course_utils.lessons import l08_backward_passes as l08

# One test process (pytest-xdist) runs this module: its module-scoped fixture
# (the compiling children) is made once.
pytestmark = pytest.mark.xdist_group("test_portability")

# (compute capability, shared memory per block in bytes, SMs): a T4, an A100, an L4, and the H100 the
# course is tuned on
T4, A100, L4, H100 = ((7, 5), 65536, 40), ((8, 0), 166912, 108), ((8, 9), 101376, 58), ((9, 0), 232448, 132)

_LAUNCHES = r'''
import json, sys

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

major, minor, limit, sms = (int(arg) for arg in sys.argv[1:5])
compile_launches = sys.argv[5] == "compile"


class Properties:  # what torch.cuda.get_device_properties says of the GPU under test
    multi_processor_count, shared_memory_per_block_optin, name = sms, limit, f"sm_{major}{minor}"


class Driver:  # Triton's questions about the current GPU; nothing is ever launched
    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 10 * major + minor, 32)

    def get_benchmarker(self):  # triton 3.6's autotuner asks for it even for one config: nothing is timed
        return lambda kernel_call, quantiles=None, **kwargs: [1.0] * len(quantiles or (1,))


driver.set_active(Driver())
torch.cuda.get_device_capability = lambda device=None: (major, minor)
torch.cuda.get_device_properties = lambda device=None: Properties()
torch.Tensor.is_cuda = property(lambda tensor: True)  # the host code's GPU branches, on CPU tensors
launches = []


def compile_instead(self, *args, grid, warmup, **kwargs):
    meta = {k: v for k, v in kwargs.items() if k.isupper() and isinstance(v, (bool, int))}
    record = dict(kernel=self.fn.__name__, meta=meta, num_warps=kwargs.get("num_warps", 4),
                  num_stages=kwargs.get("num_stages", 3), shared=None)
    if compile_launches:
        compiled = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        record.update(num_warps=compiled.metadata.num_warps, num_stages=compiled.metadata.num_stages,
                      shared=compiled.metadata.shared)
    launches.append(record)


original_run, JITFunction.run = JITFunction.run, compile_instead

from course_utils.lessons import l05_online_softmax as l05  # noqa: E402
from course_utils.lessons import l06_fused_rmsnorm_mlp as l06  # noqa: E402
from course_utils.lessons import l08_backward_passes as l08  # noqa: E402
from course_utils.lessons import l09_decoding as l09  # noqa: E402
from course_utils.mode import half_dtype  # noqa: E402

half = half_dtype((major, minor))
for D, dtype in ((128, half), (64, torch.float32), (128, torch.float32)):
    if dtype is half:  # 05.attention's 16-bit cases
        q = torch.zeros(1, 1, 300, D, dtype=dtype)
        l05.attention(q, q, q, torch.empty_like(q), True)
    q, lse = torch.zeros(1, 1, 300, D, dtype=dtype), torch.zeros(1, 1, 300)  # 08.attention_backward's
    grads = [torch.empty_like(q) for _ in range(3)]
    l08.attention_backward(q, q, q, q, lse, q, *grads, True)
for H_q, D in ((4, 256), (16, 128)):  # the toy Llama's decode step; 09's GQA case and the bench's heads
    q, cache = torch.zeros(4, H_q, D, dtype=half), torch.zeros(4, 4, 80, D, dtype=half)
    l09.decode_attention(q, cache, cache, torch.full((4,), 80, dtype=torch.int32), torch.empty_like(q))
for rows in (16, 32):  # a decode step, and 06's toy Llama of 2 x 16 tokens; rows of 16-byte multiples
    x = torch.zeros(rows, 128, dtype=half)  # (as the toy's 1024 and 11008): the widest loads, the most stages
    packed = l06.PackedMLP(x[0], torch.zeros(128, 704, dtype=half), torch.zeros(352, 128, dtype=half))
    l06.rmsnorm_mlp_packed(x, packed, 1e-6, torch.empty_like(x))
w = torch.zeros(352, 128, dtype=half)
l06.gate_up_silu(x[:1], w, w, torch.empty(1, 352, dtype=half))
print(json.dumps(launches))
'''


def _launches(gpu: tuple, compile_launches: bool) -> subprocess.Popen:
    """The child process that makes the launches for `gpu` (compiled for it, or only recorded)."""
    (major, minor), limit, sms = gpu
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, no interpreter
    command = [sys.executable, "-c", _LAUNCHES, str(major), str(minor), str(limit), str(sms),
               "compile" if compile_launches else "record"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)


def _result(child: subprocess.Popen) -> list[dict]:
    out, err = child.communicate(timeout=600)
    assert child.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


@pytest.fixture(scope="module")
def children():
    """The three compiling children start together (compiles take seconds; the cores share them)."""
    started = {gpu: _launches(gpu, compile_launches=True) for gpu in (T4, A100, L4)}
    yield started
    for child in started.values():
        if child.poll() is None:
            child.kill()


@pytest.mark.parametrize("gpu", [T4, A100, L4], ids=["T4", "A100", "L4"])
def test_launches_fit_the_shared_memory(children, gpu):
    """Lesson 05's attention at D = 128 (a T4), lesson 08's attention backward (a T4; an L4 in fp32 at
    D = 128), lesson 09's decode attention at the toy Llama's D = 256 (a T4, an L4) and lesson 06's MLP
    block for few rows (an L4) asked for more shared memory than the GPU has before the tiles fitted it."""
    launches = _result(children[gpu])
    kernels = {launch["kernel"] for launch in launches}
    assert {"attention_kernel", "attention_dkdv_kernel", "attention_dq_kernel",
            "decode_attention_split_kernel", "rmsnorm_gate_up_silu_kernel", "down_split_k_kernel",
            "matmul_kernel", "gate_up_silu_kernel"} <= kernels
    too_big = [launch for launch in launches if launch["shared"] > gpu[1]]
    assert not too_big, f"{len(too_big)} launches need more than {gpu[1]} bytes: {too_big}"


# What the H100 launched before the tiles depended on the device: the configurations of the committed results.
H100_LAUNCHES = [
    ("attention_kernel", {"BLOCK_M": 128, "BLOCK_N": 64}, 8, 3),
    *[("attention_delta_kernel", {"BLOCK_M": 64}, 4, 3),
      ("attention_dkdv_kernel", {"BLOCK_M": 64, "BLOCK_N": 64}, 4, 2),
      ("attention_dq_kernel", {"BLOCK_M": 64, "BLOCK_N": 64}, 4, 2)] * 3,
    *[("decode_attention_split_kernel", {"BLOCK_G": 16, "BLOCK_N": 64}, 4, 3),
      ("decode_attention_merge_kernel", {"BLOCK_S": 2}, 4, 3)] * 2,
    ("rmsnorm_gate_up_silu_kernel", {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 1}, 4, 4),
    ("down_split_k_kernel", {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}, 4, 4),
    ("rmsnorm_gate_up_silu_kernel", {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1}, 4, 4),
    ("matmul_kernel", {"BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 256, "GROUP_M": 1}, 4, 4),
    ("gate_up_silu_kernel", {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 1}, 4, 4),
]


def test_the_h100_launches_what_it_was_measured_with():
    """On an H100 the launches above keep their tiles, warps and stages (recorded, not compiled)."""
    launches = _result(_launches(H100, compile_launches=False))
    tile = ("BLOCK", "GROUP_M")  # the tile's constants (GROUP_M: the launch order), not the problem's
    tiles = [(launch["kernel"], {k: v for k, v in launch["meta"].items() if k.startswith(tile)},
              launch["num_warps"], launch["num_stages"]) for launch in launches]
    assert tiles == H100_LAUNCHES


def test_the_h100_keeps_every_tile(monkeypatch):
    """On an H100 the configuration functions answer what they answered before they asked the device: for
    every head dim, dtype and row count the course uses, and the attention backward's autotuned list."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the GPU's configurations, without a GPU
    properties = SimpleNamespace(shared_memory_per_block_optin=H100[1])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    l05.max_shared_memory.cache_clear()
    device = torch.device("cuda")
    try:
        for D in (16, 32, 64, 128):
            for size in (2, 4):
                config = l05.attention_config(D, size, device)
                wide = size == 4
                assert config.kwargs == dict(BLOCK_M=128, BLOCK_N=32 if wide else 64)
                assert (config.num_warps, config.num_stages) == (8 if D >= 128 else 4, 2 if wide else 3)
                q = torch.zeros(1, dtype=torch.float32 if wide else torch.float16)
                for kernel, grad in (("dkdv", "dk_ptr"), ("dq", "dq_ptr")):
                    configs = l08.attention_configs(kernel)
                    for S in (300, 4096):
                        args = {"q_ptr": q, grad: q, "S": S}
                        chosen = l08.select_attention_configs(configs, args, HEAD_DIM=D)
                        if not (wide and D == 128 and S >= l08.SHORT_SEQUENCE):  # that one is never launched
                            assert chosen == (configs[:1] if S < l08.SHORT_SEQUENCE else configs)
        for rows in (1, 16, 17, 32, 64, 65, 8192):
            for size in (2, 4):
                assert l06.mlp_config(rows, size, device) == l06.mlp_config(rows, size)
                down, tuned = l06.down_tile(rows, size, device), l06.down_tile(rows, size)
                assert (down is None and tuned is None) or down.all_kwargs() == tuned.all_kwargs()
    finally:
        l05.max_shared_memory.cache_clear()


def test_max_shared_memory_on_a_torch_without_the_property(monkeypatch):
    """torch 2.5 (the course's oldest) has no `shared_memory_per_block_optin` (added in 2.6): the limit then
    comes from Triton's driver, the number its launcher compares a kernel's shared memory with."""
    import triton

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(name="T4"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    def properties(index):
        asked.append(index)
        return {"max_shared_mem": 65536}

    utils = SimpleNamespace(get_device_properties=properties)
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=SimpleNamespace(utils=utils)))
    l05.max_shared_memory.cache_clear()
    try:
        assert l05.max_shared_memory(torch.device("cuda", 1)) == 65536
        assert l05.max_shared_memory(torch.device("cuda")) == 65536
        assert asked == [1, 0]
    finally:
        l05.max_shared_memory.cache_clear()
