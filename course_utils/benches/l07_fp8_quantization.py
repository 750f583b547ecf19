"""Lesson 07 on a GPU: row-wise e4m3 quantization against the copy ceiling, the FP8 matmul against
cuBLAS bf16 and torch._scaled_mm, and the W8A16 GEMV against the bf16 GEMV.

Every configuration of our kernels is its own row ("triton (ours) ..."), checked before it is timed;
the best one is then recorded again as "triton (ours)" and compared with the targets. The FP8
matmul's peer with fast accumulation and our Hopper default take turns (`Table.time_alternating`).
A configuration that fails to compile (shared memory) or to match is noted and skipped.
"""
from __future__ import annotations

import re

import torch
import triton
import triton.language as tl

from ..bench import Table, clock_and_power, registers_and_spills
from ..fp8 import E4M3_MAX, fp8_matmul_ref, quantize_rowwise_ref
from ..lessons.l07_fp8_quantization import (FP8_HOPPER_CONFIG, fp8_matmul, fp8_tma_ready, quantize_int8_ref,
                                            quantize_rowwise, w8a16_gemv)

E4M3 = torch.float8_e4m3fn
DEVICE = "cuda"
QUANTIZE_SHAPE = (8192, 8192)
MATMUL_SIZE = 8192  # M = N = K
GEMV_SHAPES = ((14336, 4096), (4096, 14336))  # (N, K): Llama-3-8B's up and down projections, one token


def _try(table: Table, what: str, fn) -> bool:
    """Run fn (a correctness check); on any error note it in the table and return False."""
    try:
        fn()
        torch.cuda.synchronize()
        return True
    except Exception as exc:  # noqa: BLE001 - out of shared memory, an op this torch lacks, a wrong result
        table.notes.append(f"{what}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
        print(table.notes[-1])
        return False


def _best(table: Table, group: str, prefix: str):
    """The fastest row of `group` whose name starts with `prefix` (to reuse its configuration)."""
    rows = [r for r in table.rows if r.group == group and r.name.startswith(prefix)]
    return min(rows, key=lambda r: r.ms) if rows else None


# --- quantize_rowwise -------------------------------------------------------------------------

def _quantize(table: Table) -> None:
    rows, cols = QUANTIZE_SHAPE
    x = torch.randn(rows, cols, device=DEVICE, dtype=torch.bfloat16)
    x[7, 100] = 3e4  # an outlier row, and a row of zeros: the kernel must handle both at full speed
    x[9] = 0
    out = torch.empty(rows, cols, device=DEVICE, dtype=E4M3)
    scale = torch.empty(rows, device=DEVICE, dtype=torch.float32)
    q_ref, s_ref = quantize_rowwise_ref(x)

    def verify(q, s):
        torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=0)
        step = q_ref.float().abs() / 8 + 2.0**-9  # one e4m3 step
        assert bool(((q.float() - q_ref.float()).abs() <= step).all()), "quantized values differ from torch"

    group = f"quantize_rowwise bf16->e4m3 {rows}x{cols}"
    n_bytes = rows * cols * (2 + 1) + rows * 4  # read bf16, write e4m3, write one fp32 scale per row
    y = torch.empty_like(x)
    table.time(group, "copy ceiling (bf16 x -> y)", lambda: y.copy_(x), n_bytes=rows * cols * 4)

    def eager():
        amax = x.abs().amax(dim=1, keepdim=True).float()  # (rows, 1)
        s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        return (x.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), s[:, 0]

    if _try(table, "torch eager quantize", lambda: verify(*eager())):
        table.time(group, "torch eager", eager, n_bytes=n_bytes)
    compiled = torch.compile(eager)
    if _try(table, "torch.compile quantize", lambda: verify(*compiled())):
        table.time(group, "torch.compile", compiled, n_bytes=n_bytes)

    # BLOCK = cols: the whole row in registers, one read. cols / 4: four chunks, two passes (via L2).
    for block, warps in ((cols, 4), (cols, 8), (cols, 16), (cols // 4, 4), (cols // 4, 8)):
        name = f"triton (ours) BLOCK={block} warps={warps}"

        def run(b=block, w=warps):
            quantize_rowwise(x, out, scale, BLOCK=b, num_warps=w)

        if _try(table, name, lambda: (run(), verify(out, scale))):
            table.time(group, name, run, n_bytes=n_bytes)
    table.add_best(group, n_bytes=n_bytes)
    table.target(group, "triton (ours)", "copy ceiling (bf16 x -> y)", 0.85, 0.92, metric="gbps")


# --- fp8_matmul -------------------------------------------------------------------------------

MATMUL_CONFIGS = (  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
    (128, 256, 128, 8, 3),
    (128, 256, 128, 8, 4),
    (256, 128, 128, 8, 3),
    (256, 128, 128, 8, 4),
    (128, 128, 128, 8, 4),
    (128, 128, 128, 4, 5),
    (128, 256, 64, 8, 4),
)


def _matmul(table: Table) -> None:
    M = N = K = MATMUL_SIZE
    a_hp = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
    b_hp = torch.randn(N, K, device=DEVICE, dtype=torch.bfloat16)  # nn.Linear layout (N, K)
    a, sa = quantize_rowwise_ref(a_hp)  # (M, K) e4m3, (M,) fp32
    b, sb = quantize_rowwise_ref(b_hp)  # (N, K) e4m3, (N,) fp32
    out = torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16)
    out_hp = torch.empty(M, N, device=DEVICE, dtype=torch.bfloat16)
    check_rows = 256
    ref = (a[:check_rows].float() * sa[:check_rows, None]) @ (b.float() * sb[:, None]).T  # fp32, no TF32

    def verify(o):
        err = ((o[:check_rows].float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"relative error {err:.3g} against the fp32 reference"

    group = f"fp8 matmul {M}^3 (bf16 out)"
    flops = 2 * M * N * K
    table.time(group, "torch.matmul bf16 (cuBLAS)", lambda: torch.matmul(a_hp, b_hp.T, out=out_hp),
               flops=flops)

    # torch._scaled_mm wants the second operand column-major: b.t() of the row-major (N, K) b is exactly that.
    def scaled_mm(fast=False):
        return torch._scaled_mm(a, b.t(), scale_a=sa.view(-1, 1), scale_b=sb.view(1, -1),
                                out_dtype=torch.bfloat16, use_fast_accum=fast)

    if _try(table, "torch._scaled_mm rowwise", lambda: verify(scaled_mm())):
        table.time(group, "torch._scaled_mm rowwise", scaled_mm, flops=flops)
    fast_accum = _try(table, "torch._scaled_mm rowwise fast_accum", lambda: verify(scaled_mm(True)))

    def config_name(cfg, extra=""):
        bm, bn, bk, w, s = cfg
        return f"triton (ours) {bm}x{bn}x{bk} w{w} s{s}{extra}"

    def ours(cfg, b_operand, promote=False):
        bm, bn, bk, w, s = cfg
        return lambda: fp8_matmul(a, sa, b_operand, sb, out, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                  num_warps=w, num_stages=s, promote=promote)

    for cfg in MATMUL_CONFIGS:
        fn = ours(cfg, b)
        if _try(table, config_name(cfg), lambda fn=fn: (fn(), verify(out))):
            table.time(group, config_name(cfg), fn, flops=flops)
    best = _best(table, group, "triton (ours) ")
    if best is None:
        return
    best_cfg = next(c for c in MATMUL_CONFIGS if config_name(c) == best.name)
    # The target's pair takes turns (Table.time_alternating): the peer with fast accumulation and, on
    # Hopper, fp8_matmul's default there, the persistent TMA kernel.
    pair = [("torch._scaled_mm rowwise fast_accum", lambda: scaled_mm(True))] if fast_accum else []
    if fp8_tma_ready(a, b, out):
        kw = FP8_HOPPER_CONFIG.kwargs
        name = (f"triton (ours) persistent TMA {kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} "
                f"w{FP8_HOPPER_CONFIG.num_warps} s{FP8_HOPPER_CONFIG.num_stages}")
        default = lambda: fp8_matmul(a, sa, b, sb, out)  # noqa: E731
        if _try(table, name, lambda: (default(), verify(out))):
            pair.append((name, default))
    table.time_alternating(group, pair, flops=flops)
    table.add_best(group, flops=flops)
    _clocks(table, pair, flops)

    # The same kernel and config, accumulating in fp32 every BLOCK_K instead of in the tensor cores'
    # narrower fp8 accumulator (DeepSeek-V3's "promotion"); and with b in the textbook (K, N) layout.
    for cfg in dict.fromkeys((best_cfg, MATMUL_CONFIGS[0])):  # promotion may prefer another tile
        name = config_name(cfg, " promoted")
        fn = ours(cfg, b, promote=True)
        if _try(table, name, lambda fn=fn: (fn(), verify(out))):
            table.time(group, name, fn, flops=flops)
    _promotion_registers(table, a, sa, b, sb, out, MATMUL_CONFIGS[0])
    b_kn = b.t().contiguous()  # (K, N) row-major: N contiguous
    name = config_name(best_cfg, " b (K, N) layout")
    fn = ours(best_cfg, b_kn.t())
    if _try(table, name, lambda: (fn(), verify(out))):
        table.time(group, name, fn, flops=flops)

    table.target(group, "triton (ours)", "torch.matmul bf16 (cuBLAS)", 1.6, 1.8)
    # Like with like: our kernel accumulates in the tensor cores' fast mode, as use_fast_accum=True does.
    table.target(group, "triton (ours)", "torch._scaled_mm rowwise fast_accum", 1.0, 1.05)
    table.target(group, "triton (ours)", "torch._scaled_mm rowwise", None)  # the accurate mode, reported


def _clocks(table: Table, pair: list, flops: float) -> None:
    """Fact fp8_clocks: the pair run back to back for a few seconds each, the SM clock and the board's power
    sampled meanwhile. At full tensor-core load both meet the power limit, and then the work done per
    clock cycle, not the clock, is what a kernel controls."""
    seen = {name: clock_and_power(fn) for name, fn in pair}
    if len(seen) != 2 or None in seen.values():
        table.notes.append("fp8 clocks: not sampled (no nvidia-smi, or no pair)")
        return
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    parts = []
    for name, s in seen.items():
        per_clock = flops / (s["ms"] * 1e-3) / (s["sm_mhz"] * 1e6) / sms  # FLOPs per cycle per SM
        who = "ours" if name.startswith("triton") else "`_scaled_mm` (fast accumulation)"
        parts.append(f"{who} at {s['sm_mhz']:.0f} MHz drawing {s['power_w']:.0f} W, "
                     f"{per_clock:.0f} FLOPs per clock cycle per SM")
    limit = max(s["power_limit_w"] for s in seen.values())
    capped = " and ".join(f"{s['power_capped']:.0%}" for s in seen.values())
    table.fact("fp8_clocks", "; ".join(parts) + f" (the board's power limit: {limit:.0f} W; the power cap "
                             f"was active in {capped} of the samples)")


def _promotion_registers(table: Table, a, sa, b, sb, out, cfg) -> None:
    """Fact fp8_promoted_registers: registers per thread and spilled bytes of the same tile, promoted or not
    (the compiled kernel's own counts, `bench.registers_and_spills`)."""
    from ..lessons.l07_fp8_quantization import fp8_matmul_kernel

    bm, bn, bk, warps, stages = cfg
    (M, K), N = a.shape, b.shape[0]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    counts = {}
    for promote in (False, True):
        kernel = fp8_matmul_kernel[grid](
            a, sa, b, sb, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
            out.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=K % bk == 0,
            PROMOTE=promote, num_warps=warps, num_stages=stages)
        counts[promote] = registers_and_spills(kernel)
        if counts[promote] is None:  # the interpreter runs kernels without compiling them: no fact
            table.notes.append("fp8 registers: not compiled (interpreter)")
            return
    (regs, spilled), (regs_p, spilled_p) = counts[False], counts[True]
    table.fact("fp8_promoted_registers",
               f"{regs} registers per thread and {spilled} bytes spilled to local memory without promotion, "
               f"{regs_p} registers and {spilled_p} bytes spilled with it ({bm} x {bn} tiles, {warps} warps)")


ACCUMULATION_K = (1024, 4096, 16384)


def _accumulation(table: Table) -> None:
    """What accumulation alone adds: the kernel (fp32 out) against float64 on the same e4m3 inputs.

    On Hopper an fp8 tensor-core instruction accumulates with fewer bits than fp32 (DeepSeek-V3 measured
    about 14); Triton leaves the whole K loop there unless max_num_imprecise_acc asks for promotion.
    Two metrics: the norm error ||C - C64|| / ||C64|| (an average over the outputs) and the worst
    element's error over the outputs' RMS, max |C - C64| / rms(C64) (their ratio: how far the worst
    error lies above the typical one). Recorded as notes, which the lesson prints on machines without
    such a GPU, and the middle K as fact fp8_worst_element.
    """
    M = N = 256
    for K in ACCUMULATION_K:
        a, sa = quantize_rowwise_ref(torch.randn(M, K, device=DEVICE))
        b, sb = quantize_rowwise_ref(torch.randn(N, K, device=DEVICE))
        exact = fp8_matmul_ref(a, sa, b, sb)  # (M, N) float64
        norm, worst = [], []
        for promote in (False, True):
            out = torch.empty(M, N, device=DEVICE, dtype=torch.float32)
            fp8_matmul(a, sa, b, sb, out, promote=promote)
            diff = out.cpu().double() - exact
            norm.append((diff.norm() / exact.norm()).item())
            worst.append((diff.abs().max() / exact.pow(2).mean().sqrt()).item())
        table.notes.append(f"accumulation error K={K}: default {norm[0]:.2e}, promoted {norm[1]:.2e}; "
                           f"worst element {worst[0]:.2e} and {worst[1]:.2e} of the outputs' RMS")
        if K == ACCUMULATION_K[len(ACCUMULATION_K) // 2]:
            table.fact("fp8_worst_element",
                       f"at K = {K}, {M} x {N} outputs, the worst element's error was {worst[0]:.1e} of the "
                       f"outputs' RMS without promotion, {worst[0] / norm[0]:.1f} times the norm error "
                       f"({norm[0]:.1e}), and {worst[1]:.1e} with it, {worst[1] / norm[1]:.1f} times "
                       f"({norm[1]:.1e})")


# --- W8A16 GEMV -------------------------------------------------------------------------------

GEMV_CONFIGS = (  # BLOCK_N, BLOCK_KW (int32 words: 4 weights each), warps; no stages: no pipelined loop
    (16, 128, 4),
    (8, 512, 4),
    (4, 512, 4),
    (8, 256, 4),
    (16, 256, 4),
    (4, 256, 4),
    (32, 128, 8),
    (16, 64, 4),
    (4, 1024, 8),
    (8, 512, 8),
)


@triton.jit
def read_words_kernel(w_ptr, out_ptr, N, K_WORDS, stride_wn, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr):
    """The GEMV's reads and nothing else: the same (BLOCK_N, BLOCK_KW) int32 tiles, summed as integers
    (one add per word instead of ~16 operations for its 4 weights). How fast can these bytes be read?"""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) weight rows
    n_in = offs_n % N
    offs_kw = tl.arange(0, BLOCK_KW)
    acc = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for kw0 in range(0, K_WORDS, BLOCK_KW):
        kw = kw0 + offs_kw
        words = tl.load(w_ptr + n_in[:, None] * stride_wn + kw[None, :], mask=kw[None, :] < K_WORDS, other=0)
        acc += tl.sum(words, axis=1)
    tl.store(out_ptr + offs_n, acc, mask=offs_n < N)


def _read_floor(table: Table, group: str, w_int8: torch.Tensor, n_bytes: int) -> None:
    """Rows "read only ...": the GEMV's tiles with the arithmetic taken out, every configuration of the
    sweep; the best is the fastest these weights were read here, a floor no GEMV of this tiling beats."""
    N = w_int8.shape[0]
    words = w_int8.view(torch.int32)
    out = torch.empty(N, device=DEVICE, dtype=torch.int32)
    for bn, bkw, warps in GEMV_CONFIGS:
        def run(bn=bn, bkw=bkw, warps=warps):
            read_words_kernel[(triton.cdiv(N, bn),)](words, out, N, words.shape[1], words.stride(0), BLOCK_N=bn,
                                                     BLOCK_KW=bkw, num_warps=warps)
        if _try(table, f"{group} read only {bn}x{4 * bkw}", lambda run=run: (run(), torch.testing.assert_close(
                out, words.sum(1, dtype=torch.int32)))):
            table.time(group, f"read only (no math) {bn}x{4 * bkw} w{warps}", run, n_bytes=n_bytes)
    table.add_best(group, "read only (no math)", n_bytes=n_bytes)


def _gemv(table: Table) -> None:
    for N, K in GEMV_SHAPES:
        _gemv_shape(table, N, K)
    _gemv_sass(table)


# A SASS line as Triton prints it (`kernel.asm["sass"]`): control codes, a tab, the instruction, e.g.
# "--:-:0:-:8\t@P0 LDG.E.128 R4, desc[UR4][R2.64];"; as cuobjdump prints it: "/*0090*/  @P0 LDG.E.128 ...".
SASS_OPCODE = re.compile(r"^\s*(?:/\*[0-9a-f]+\*/|[-0-9]{2}:[-0-9]:[-0-9]:[-Y]:[0-9a-f]+)"  # address|controls
                         r"\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", re.MULTILINE)  # predicate, opcode


def sass_opcodes(sass: str) -> list[str]:
    """The opcodes of a SASS listing in order, e.g. ["LDC", "S2R", "LDG.E.128", ...]."""
    return SASS_OPCODE.findall(sass)


def _gemv_sass(table: Table) -> None:
    """What the compiled GEMV does per weight: no int -> float conversion (I2F), bit operations instead."""
    from ..lessons.l07_fp8_quantization import w8a16_gemv_kernel

    N, K = GEMV_SHAPES[0]
    x = torch.randn(1, K, device=DEVICE, dtype=torch.bfloat16)
    words = torch.randint(-2**31, 2**31 - 1, (N, K // 4), device=DEVICE, dtype=torch.int32)
    scale = torch.rand(N, device=DEVICE)
    out = torch.empty(1, N, device=DEVICE, dtype=torch.bfloat16)
    try:
        kernel = w8a16_gemv_kernel[(N // 16, 1)](x, words, scale, out, N, K // 4, x.stride(0), words.stride(0),
                                                out.stride(0), BLOCK_N=16, BLOCK_KW=128, num_warps=4)
        sass = kernel.asm["sass"]
    except Exception as exc:  # noqa: BLE001 - no disassembler on this machine: no fact
        table.notes.append(f"W8A16 GEMV SASS not read: {type(exc).__name__}: {str(exc)[:120]}")
        return
    opcodes = sass_opcodes(sass)
    count = {op: sum(code == op or code.startswith(op + ".") for code in opcodes)
             for op in ("I2F", "LOP3", "FADD", "FFMA", "LDG.E.128")}
    if not opcodes:
        table.notes.append(f"W8A16 GEMV SASS not parsed: {sass[:160]!r}")
        return
    table.fact("gemv_sass", f"the 16 x 512-byte GEMV kernel's SASS has {count['I2F']} I2F (int -> float "
                            f"conversions), {count['LOP3']} LOP3 (bit operations), {count['FADD']} FADD, "
                            f"{count['FFMA']} FFMA and {count['LDG.E.128']} 16-byte loads (LDG.E.128)")


def _gemv_shape(table: Table, N: int, K: int) -> None:
    x = torch.randn(1, K, device=DEVICE, dtype=torch.bfloat16)
    w = (torch.randn(N, K, device=DEVICE) * 0.02).to(torch.bfloat16)
    w_int8, scale = quantize_int8_ref(w)
    out = torch.empty(1, N, device=DEVICE, dtype=torch.bfloat16)
    out_hp = torch.empty(1, N, device=DEVICE, dtype=torch.bfloat16)
    ref = x.float() @ (w_int8.float() * scale[:, None]).T

    def verify(o):
        err = ((o.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"relative error {err:.3g}"

    group = f"W8A16 GEMV 1x{K} @ ({N}x{K}).T"
    bytes_bf16 = 2 * N * K + 2 * K + 2 * N
    bytes_int8 = N * K + 4 * N + 2 * K + 2 * N  # int8 weights, fp32 scales, bf16 x and out
    table.time(group, "torch.matmul bf16 (cuBLAS)", lambda: torch.matmul(x, w.T, out=out_hp),
               n_bytes=bytes_bf16)
    dequant = torch.compile(lambda x, w8, s: (x @ w8.to(torch.bfloat16).T) * s.to(torch.bfloat16))
    if _try(table, f"{group} torch.compile", lambda: verify(dequant(x, w_int8, scale))):
        table.time(group, "torch.compile int8 dequant + matmul", lambda: dequant(x, w_int8, scale),
                   n_bytes=bytes_int8)
    table.time(group, "triton (ours) W8A16 default", lambda: w8a16_gemv(x, w_int8, scale, out), n_bytes=bytes_int8)
    for bn, bkw, warps in GEMV_CONFIGS:
        name = f"triton (ours) W8A16 {bn}x{4 * bkw} w{warps}"

        def run(bn=bn, bkw=bkw, warps=warps):
            w8a16_gemv(x, w_int8, scale, out, BLOCK_N=bn, BLOCK_KW=bkw, num_warps=warps)

        if _try(table, f"{group} {name}", lambda run=run: (run(), verify(out))):
            table.time(group, name, run, n_bytes=bytes_int8)
    table.add_best(group, "triton (ours) W8A16", n_bytes=bytes_int8)
    # Half the bytes of bf16 weights: up to 2x if both run at the bandwidth.
    table.target(group, "triton (ours) W8A16", "torch.matmul bf16 (cuBLAS)", None)
    src = torch.empty(2**30, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    table.time(group, "copy ceiling (1 GiB, read + write)", lambda: dst.copy_(src), n_bytes=2 * src.numel())
    del src, dst
    table.target(group, "triton (ours) W8A16", "copy ceiling (1 GiB, read + write)", 0.85, 0.92, metric="gbps")
    _read_floor(table, group, w_int8, bytes_int8)
    table.target(group, "read only (no math)", "copy ceiling (1 GiB, read + write)", None, metric="gbps")
    table.target(group, "triton (ours) W8A16", "read only (no math)", None, metric="gbps")


def run(table: Table) -> None:
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < (8, 9):
        table.notes.append(f"sm_{major}{minor}: no float8_e4m3fn in Triton before sm_89; "
                           "only the W8A16 GEMV ran")
        _gemv(table)
        return
    _quantize(table)
    _matmul(table)
    _accumulation(table)
    _gemv(table)
