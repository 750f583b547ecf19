"""Lesson 03 on a GPU: matmul against cuBLAS, and the experiments the lesson talks about.

One run measures:
- TFLOP/s vs size (512^3 ... 8192^3) for fp16 and bf16: torch.matmul (cuBLAS), ours autotuned, and
  the naive kernel at the small sizes; at 4096^3 and 8192^3 every autotune config on its own row;
- fp32 at 4096^3 with TF32 on both sides (torch.set_float32_matmul_precision("high")), and IEEE;
- the tile-size experiment (square L x L tiles, traffic 2N^3/L) and the launch-order experiment
  (GROUP_M = 1 is row-major) at 4096^3 and 8192^3;
- what autotuning costs on a new shape, and which config it picks;
- accuracy against float64 of fp32 (IEEE, TF32, TF32x3), fp16 and bf16 products;
- linear_relu fp16 against eager and torch.compile'd relu(addmm) at the GEM shapes, 1024^3, 4096^3.
Every kernel is checked against torch before it is timed; cuBLAS and ours take turns (three rounds,
medians: `Table.time_alternating`), so that neither runs on a hotter, slower-clocked GPU than the other.
"""
from __future__ import annotations

import time

import torch

from ..bench import Table, sweeping
from ..checks.l03_matmul import dot_tolerance

SIZES = (512, 1024, 2048, 4096, 8192)  # the TFLOP/s-vs-size sweep, N^3
TARGET_SIZES = (4096, 8192)  # where the targets are set; every config is timed here
NAIVE_SIZES = (512, 1024, 2048)  # the naive kernel gets slow fast: 2 N^3 loads
GEM_SHAPES = ((64, 256, 128), (128, 256, 256), (1024, 1024, 1024))  # (M, N, K) of the GEM repo
LINEAR_SHAPES = GEM_SHAPES + ((4096, 4096, 4096),)
LINEAR_TARGETS = ((1024, 1024, 1024), (4096, 4096, 4096))
TILES = (16, 32, 64, 128)  # square tiles L x L for the traffic experiment
GROUPS_M = (1, 4, 8, 16)
AUTOTUNE_SHAPE = (3072, 3072, 3072)  # a key nothing else uses; its kernels are compiled already
SWEEP_DTYPES = ("fp16", "bf16")
FP32_SIZE = 4096  # fp32 with TF32 and with IEEE arithmetic
TILE_SIZE = 4096  # the tile-size experiment
ACCURACY_SIZE = 2048  # errors against float64

CUBLAS = "torch.matmul (cuBLAS)"
OURS = "triton (ours)"
NAIVE = "triton (ours) naive"
EAGER = "torch eager relu(addmm)"
COMPILED = "torch.compile relu(addmm)"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


# --- napkin maths (the lesson uses these too) ---------------------------------------------------

def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def matmul_flops(M: int, N: int, K: int) -> int:
    """A multiply and an add for each of the K terms of each of the M x N outputs."""
    return 2 * M * N * K


def min_bytes(M: int, N: int, K: int, element_size: int) -> int:
    """Read a and b once, write c once: the least traffic any matmul can have."""
    return (M * K + K * N + M * N) * element_size


def naive_load_bytes(M: int, N: int, K: int, element_size: int) -> int:
    """One program per output loads a row of a and a column of b: 2K elements, M x N times."""
    return 2 * M * N * K * element_size


def tiled_load_bytes(M: int, N: int, K: int, block_m: int, block_n: int, element_size: int) -> int:
    """Each BLOCK_M x BLOCK_N tile loads BLOCK_M x K of a and K x BLOCK_N of b.

    For square N x N x N and L x L tiles: (N/L)^2 programs x 2LN elements = 2N^3/L.
    """
    return cdiv(M, block_m) * cdiv(N, block_n) * (block_m + block_n) * K * element_size


def linear_relu_bytes(M: int, N: int, K: int, element_size: int, fused: bool) -> int:
    """relu(x @ w.T + bias): read x, w, bias, write out; unfused, relu reads out back and writes it again."""
    inputs = (M * K + N * K + N) * element_size
    out = M * N * element_size
    return inputs + out if fused else inputs + 3 * out


def config_name(config) -> str:
    k = config.kwargs
    return (f"{k['BLOCK_M']}x{k['BLOCK_N']}x{k['BLOCK_K']} w{config.num_warps} s{config.num_stages} "
            f"g{k['GROUP_M']}")


def size_of(group: str) -> int | None:
    """The N of a sweep group "matmul fp16 4096^3"; None for other groups."""
    parts = group.split()
    if len(parts) == 3 and parts[0] == "matmul" and parts[2].endswith("^3"):
        return int(parts[2][:-2])
    return None


def plot_vs_size(rows: list[dict], path=None):
    """TFLOP/s against N for the sweep groups: one line per implementation and dtype."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in rows:
        n = size_of(r["group"])
        if n is None or r["name"] not in (CUBLAS, OURS, NAIVE) or not r.get("tflops"):
            continue
        dtype = r["group"].split()[1]
        series.setdefault((dtype, r["name"]), []).append((n, r["tflops"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    for (dtype, name), points in sorted(series.items()):
        points.sort()
        style = "-" if "ours" in name else "--"
        marker = "s" if name == NAIVE else "o"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, marker=marker, label=f"{name} {dtype}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("matmul: TFLOP/s vs size", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


# --- the benchmark ------------------------------------------------------------------------------

def _assert_close(got: torch.Tensor, ref: torch.Tensor, k: int, what: str) -> None:
    """Ours against torch's result: both carry rounding errors, so twice the check's tolerance."""
    atol, rtol = dot_tolerance(got.dtype, k)
    torch.testing.assert_close(got.float(), ref.float(), atol=2 * atol, rtol=2 * rtol,
                               msg=lambda m: f"{what}: {m}")


def _with_group_m(config, group_m: int):
    import triton

    return triton.Config({**config.kwargs, "GROUP_M": group_m}, num_warps=config.num_warps,
                         num_stages=config.num_stages)


def _configs_for(dtype: torch.dtype):
    """The autotune list as the pruner sees it for this dtype (128-byte K slices), before size rules."""
    from ..lessons.l03_matmul import matmul_configs

    element_size = torch.empty(0, dtype=dtype).element_size()
    return [c for c in matmul_configs() if c.kwargs["BLOCK_K"] * element_size == 128]


def _time_configs(table: Table, group: str, dtype: torch.dtype, run, check, flops: int) -> None:
    """One row per autotune config: run(config) launches it, check() raises if the result is wrong."""
    for config in _configs_for(dtype):
        name = f"{OURS} {config_name(config)}"
        try:
            run(config)
            check()
        except Exception as exc:  # a config can run out of shared memory or registers on some GPUs
            table.notes.append(f"{group}: {name} skipped: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        table.time(group, name, lambda c=config: run(c), flops=flops)


def _note_tma(table: Table, group: str) -> None:
    """Which path ours took: the TMA kernel (Hopper, K-major b) and its tile, or the pointer kernel."""
    from ..lessons.l03_matmul import matmul_tma_kernel

    best = getattr(matmul_tma_kernel, "best_config", None)
    path = f"the TMA kernel, autotune picked {config_name(best)}" if best else "the pointer kernel"
    table.notes.append(f"{group}: ours ran {path}")
    matmul_tma_kernel.best_config = None  # the next group's note tells its own


def _fastest_config(table: Table, group: str):
    rows = [r for r in table.rows if r.group == group and r.name.startswith(OURS + " ") and "x" in r.name]
    if not rows:
        return None
    best = min(rows, key=lambda r: r.ms)
    return next(c for c in _configs_for(torch.float16) if f"{OURS} {config_name(c)}" == best.name)


def _square_problem(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """a, b (n, n) random on the GPU, an output buffer, and cuBLAS's a @ b to check ours against."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return a, b, torch.empty(n, n, device="cuda", dtype=dtype), torch.matmul(a, b)


def _sweep(table: Table, every_config: bool = True) -> None:
    from ..lessons.l03_matmul import matmul, matmul_kernel, matmul_naive

    for label in SWEEP_DTYPES:
        dtype = DTYPES[label]
        for n in SIZES:
            group = f"matmul {label} {n}^3"
            a, b, out, ref = _square_problem(n, dtype)
            flops = matmul_flops(n, n, n)
            matmul(a, b, out)  # the first call tunes (when the problem is large enough)
            _assert_close(out, ref, n, group)
            table.notes.append(f"{group}: autotune picked {config_name(matmul_kernel.best_config)}")
            table.time_alternating(group, [(CUBLAS, lambda: torch.matmul(a, b, out=out)),
                                           (OURS, lambda: matmul(a, b, out))], flops=flops)
            if label == "fp16" and n in NAIVE_SIZES:
                matmul_naive(a, b, out)
                _assert_close(out, ref, n, group + " naive")
                row = table.time(group, NAIVE, lambda: matmul_naive(a, b, out), flops=flops)
                cublas = table.find(group, CUBLAS)
                if row and cublas:
                    table.notes.append(f"{group}: naive kernel at {cublas.ms / row.ms:.4f} x torch.matmul")
            if n in TARGET_SIZES:
                table.target(group, OURS, CUBLAS, 0.90, 0.95)
            if n in TARGET_SIZES and every_config and (label == "fp16" or sweeping()):  # fp16: launch order
                _time_configs(table, group, dtype, lambda c: matmul(a, b, out, config=c),
                              lambda: _assert_close(out, ref, n, group), flops)


def _fp32(table: Table, every_config: bool = True) -> None:
    from ..lessons.l03_matmul import matmul

    n = FP32_SIZE
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    out = torch.empty(n, n, device="cuda")
    flops = matmul_flops(n, n, n)
    before = torch.get_float32_matmul_precision()
    try:
        for precision, label in (("high", "tf32"), ("highest", "ieee")):
            torch.set_float32_matmul_precision(precision)  # torch.matmul and our matmul both follow it
            group = f"matmul fp32 {label} {n}^3"
            ref = torch.matmul(a, b)
            matmul(a, b, out)
            _assert_close(out, ref, n, group)
            table.time_alternating(group, [(CUBLAS, lambda: torch.matmul(a, b, out=out)),
                                           (OURS, lambda: matmul(a, b, out))], flops=flops)
            if label == "tf32":
                # The weight kept K-major once (as lesson 06 packs its weights): b_kmajor.t() is a (K, N)
                # view with strides (1, K), which Hopper's tf32 wgmma reads directly, so matmul skips
                # its per-call transposing copy. The plain row pays that copy on every call.
                b_kmajor = b.t().contiguous()
                matmul(a, b_kmajor.t(), out)
                _assert_close(out, ref, n, group + " K-major b")
                packed = f"{OURS} b K-major (packed once)"
                table.time(group, packed, lambda: matmul(a, b_kmajor.t(), out), flops=flops)
                table.target(group, packed, CUBLAS, 0.85)
                table.target(group, OURS, CUBLAS, None)
                _note_tma(table, group)
            if label == "tf32" and every_config and sweeping():
                _time_configs(table, group, torch.float32, lambda c: matmul(a, b, out, config=c),
                              lambda: _assert_close(out, ref, n, group), flops)
            else:
                ours, cublas = table.find(group, OURS), table.find(group, CUBLAS)
                if ours and cublas:
                    table.notes.append(f"{group}: ours at {cublas.ms / ours.ms:.2f} x torch.matmul "
                                       f"({precision!r} float32 precision for both)")
    finally:
        torch.set_float32_matmul_precision(before)


def _tiles_and_order(table: Table) -> None:
    """Square tiles of side L (traffic 2N^3/L), then GROUP_M with the fastest config of the sweep."""
    import triton

    from ..lessons.l03_matmul import matmul

    n = TILE_SIZE
    a, b, out, ref = _square_problem(n, torch.float16)
    group = f"tile size fp16 {n}^3"
    for tile in TILES:
        config = triton.Config({"BLOCK_M": tile, "BLOCK_N": tile, "BLOCK_K": 64, "GROUP_M": 8},
                               num_warps=max(1, min(8, tile // 16)), num_stages=3)
        matmul(a, b, out, config=config)
        _assert_close(out, ref, n, f"{group} L={tile}")
        loads = tiled_load_bytes(n, n, n, tile, tile, 2) + n * n * 2  # 2N^3/L elements in, N^2 out
        table.time(group, f"{OURS} L={tile}", lambda c=config: matmul(a, b, out, config=c),
                   flops=matmul_flops(n, n, n), n_bytes=loads)

    best = _fastest_config(table, f"matmul fp16 {max(TARGET_SIZES)}^3")  # one config: 3 compilations
    for n in TARGET_SIZES if best is not None else ():
        a, b, out, ref = _square_problem(n, torch.float16)
        group = f"launch order fp16 {n}^3"
        for group_m in GROUPS_M:
            config = _with_group_m(best, group_m)
            matmul(a, b, out, config=config)
            _assert_close(out, ref, n, f"{group} GROUP_M={group_m}")
            name = f"{OURS} GROUP_M={group_m}" + (" (row-major)" if group_m == 1 else "")
            table.time(group, name, lambda c=config: matmul(a, b, out, config=c), flops=matmul_flops(n, n, n))
        table.notes.append(f"{group}: GROUP_M varied on the fastest config at {max(TARGET_SIZES)}^3, "
                           f"{config_name(best)}")
        rowmajor = table.find(group, f"{OURS} GROUP_M=1 (row-major)")
        grouped = table.find(group, f"{OURS} GROUP_M=8")
        if rowmajor and grouped:
            table.notes.append(f"{group}: GROUP_M=8 is {rowmajor.ms / grouped.ms:.3f} x as fast as row-major")


def _autotune_cost(table: Table) -> None:
    from ..lessons.l03_matmul import matmul, matmul_kernel

    M, N, K = AUTOTUNE_SHAPE
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    out = torch.empty(M, N, device="cuda", dtype=torch.float16)
    timings = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        matmul(a, b, out)
        torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
    _assert_close(out, torch.matmul(a, b), K, "autotune shape")
    n_configs = len(getattr(matmul_kernel, "configs_timings", {}) or {})
    table.notes.append(
        f"autotune cost at {M}x{N}x{K} fp16 (a new key, kernels already compiled by the sweep): first call "
        f"{timings[0]:.2f} s ({n_configs} configs timed), second call {timings[1] * 1e3:.2f} ms (cached); "
        f"picked {config_name(matmul_kernel.best_config)}")


def _accuracy(table: Table) -> None:
    """Relative Frobenius error against float64 of the same fp32 inputs."""
    from ..lessons.l03_matmul import matmul, matmul_kernel

    n = ACCURACY_SIZE
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    exact = a.double() @ b.double()

    def rel(c: torch.Tensor) -> float:
        return float((c.double() - exact).norm() / exact.norm())

    results = {}
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        results["torch.matmul fp32 (IEEE)"] = rel(torch.matmul(a, b))
        torch.set_float32_matmul_precision("high")
        results["torch.matmul fp32 (TF32)"] = rel(torch.matmul(a, b))
    finally:
        torch.set_float32_matmul_precision(before)
    out = torch.empty(n, n, device="cuda")
    for precision in ("ieee", "tf32"):
        matmul(a, b, out, input_precision=precision)
        results[f"ours fp32 ({precision})"] = rel(out)
    # tf32x3 with the config TF32 picked: one compilation instead of a whole tuning round
    matmul(a, b, out, input_precision="tf32x3", config=matmul_kernel.best_config)
    results["ours fp32 (tf32x3)"] = rel(out)
    for label in SWEEP_DTYPES:
        dtype = DTYPES[label]
        out16 = torch.empty(n, n, device="cuda", dtype=dtype)
        matmul(a.to(dtype), b.to(dtype), out16)
        results[f"ours {label} (inputs rounded to {label})"] = rel(out16)
        results[f"torch.matmul {label}"] = rel(torch.matmul(a.to(dtype), b.to(dtype)))
    table.notes.append(f"accuracy at {n}^3, fp32 inputs, relative error vs float64: "
                       + "; ".join(f"{k} {v:.1e}" for k, v in results.items()))


def _linear_relu(table: Table, every_config: bool = True) -> None:
    from ..lessons.l03_matmul import linear_relu, matmul

    def eager(x, w, bias):
        return torch.relu(torch.addmm(bias, x, w.t()))

    compiled = torch.compile(eager, dynamic=False)
    for M, N, K in LINEAR_SHAPES:
        group = f"linear_relu fp16 ({M},{N},{K})"
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        w = torch.randn(N, K, device="cuda", dtype=torch.float16) / K**0.5
        bias = torch.randn(N, device="cuda", dtype=torch.float16)
        out = torch.empty(M, N, device="cuda", dtype=torch.float16)
        ref = eager(x, w, bias)
        _assert_close(compiled(x, w, bias), ref, K, group + " torch.compile")
        linear_relu(x, w, bias, out)
        _assert_close(out, ref, K, group)
        flops = matmul_flops(M, N, K)
        table.time(group, EAGER, lambda: eager(x, w, bias), flops=flops, graph="auto")
        table.time(group, COMPILED, lambda: compiled(x, w, bias), flops=flops, graph="auto")
        table.time(group, OURS, lambda: linear_relu(x, w, bias, out), flops=flops, graph="auto")
        saved = linear_relu_bytes(M, N, K, 2, False) - linear_relu_bytes(M, N, K, 2, True)
        ours, peer = table.find(group, OURS), table.find(group, COMPILED)
        ratio = f"; ours at {peer.ms / ours.ms:.2f} x torch.compile" if ours and peer else ""
        unfused = linear_relu_bytes(M, N, K, 2, False)
        table.notes.append(f"{group}: fusing saves {saved / 1e6:.3f} MB of {unfused / 1e6:.3f} MB "
                           f"and one launch{ratio}")
        if (M, N, K) in LINEAR_TARGETS or table.find(group, OURS + " [graph]"):
            table.target_plain_and_graph(group, OURS, [EAGER, COMPILED], 1.0, 1.05)  # the faster of the two
        if (M, N, K) in LINEAR_TARGETS:
            _note_tma(table, group)
        if (M, N, K) in LINEAR_TARGETS and every_config and sweeping():
            _time_configs(table, group, torch.float16,
                          lambda c: matmul(x, w.t(), out, bias=bias, relu=True, config=c),
                          lambda: _assert_close(out, ref, K, group), flops)


def run(table: Table, quick: bool = False) -> None:
    """Everything (about 3 minutes on an H100), or with quick=True the comparisons with the peers only."""
    torch.manual_seed(0)
    _sweep(table, every_config=not quick)
    _fp32(table, every_config=not quick)
    if not quick:
        _tiles_and_order(table)
        _autotune_cost(table)
        _accuracy(table)
    _linear_relu(table, every_config=not quick)
