"""Lesson 09 on a GPU: decode attention against SDPA and the copy ceiling, the int4 GEMV against the
bf16 cuBLAS GEMV, the toy Llama's decode loop against Hugging Face `generate`, and tokens/s against
the batch size with the memory floor.

Every kernel is checked against a reference before it is timed. Launch-bound work is also timed
replayed from a CUDA graph (rows ending in " [graph]"), for ours and the peers alike.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..bench import Table
from ..lessons.l09_decoding import (
    StaticCacheLlama,
    decode_attention,
    decode_floor,
    dequantize_int4_ref,
    quantize_int4_ref,
    w4a16_gemv,
)
from ..llama import toy_llama

DEVICE = "cuda"
DTYPE = torch.bfloat16
ATTENTION = dict(B=8, H_q=32, H_kv=8, D=128)
CONTEXTS = (8192, 1024)
GEMV = (14336, 4096, 128)  # N, K, group: Llama-3-8B's up projection, one token
NEW_TOKENS = 512
PROMPT = 16
BATCHES = (1, 4, 16)


def _try(table: Table, what: str, fn) -> bool:
    try:
        fn()
        torch.cuda.synchronize()
        return True
    except Exception as exc:  # noqa: BLE001 - a peer or config that fails is a note, not the end of the run
        table.notes.append(f"{what}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
        print(table.notes[-1])
        return False


def _best_of_ours(table: Table, group: str, peers: list[str], minimum: float, stretch: float | None,
                  n_bytes: float) -> None:
    """Record our fastest sweep row, plain and in a CUDA graph, and compare each with the peers timed alike
    (the target on the graph timings where there are some: Table.target_plain_and_graph)."""
    for graph in (False, True):
        rows = [r for r in table.rows if r.group == group and r.name.startswith("triton (ours) ")
                and r.name.endswith("[graph]") == graph]
        if rows:
            best = min(rows, key=lambda r: r.ms)
            name = "triton (ours) [graph]" if graph else "triton (ours)"
            table.add(group, name, best.ms, n_bytes=n_bytes)
            table.same_run(group, name, best.name)
            table.notes.append(f"{group}: {name} is {best.name}")
    table.target_plain_and_graph(group, "triton (ours)", [p for p in peers if not p.endswith("[graph]")],
                                 minimum, stretch)


# --- decode attention -------------------------------------------------------------------------

ATTENTION_CONFIGS = (  # num_splits (None: the host's choice), BLOCK_N, warps, stages
    (None, 64, 4, 3), (None, 128, 8, 2), (16, 64, 4, 3),
)


def _attention(table: Table, context: int) -> None:
    B, H_q, H_kv, D = ATTENTION["B"], ATTENTION["H_q"], ATTENTION["H_kv"], ATTENTION["D"]
    q = torch.randn(B, H_q, D, device=DEVICE, dtype=DTYPE)
    k = torch.randn(B, H_kv, context, D, device=DEVICE, dtype=DTYPE)
    v = torch.randn(B, H_kv, context, D, device=DEVICE, dtype=DTYPE)
    lengths = torch.full((B,), context, device=DEVICE, dtype=torch.int32)
    out = torch.empty(B, H_q, D, device=DEVICE, dtype=DTYPE)
    ref = F.scaled_dot_product_attention(q[:, :, None].float(), k.float(), v.float(), enable_gqa=True)[:, :, 0]

    def verify(o):
        torch.testing.assert_close(o.float(), ref, atol=2e-2, rtol=2e-2)

    group = f"decode attention bf16 B={B} H_q={H_q} H_kv={H_kv} D={D} context {context}"
    kv_bytes = 2 * B * H_kv * context * D * 2  # K and V, bf16: the floor of the work
    n_bytes = kv_bytes + 2 * B * H_q * D * 2
    src = torch.empty(kv_bytes // 2, device=DEVICE, dtype=torch.uint8)
    dst = torch.empty_like(src)
    table.time(group, "copy ceiling (K/V bytes)", lambda: dst.copy_(src), n_bytes=kv_bytes)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]

    peers = table.time_peers(group, sdpa, q, k, v, n_bytes=n_bytes, graph=True, eager="SDPA enable_gqa",
                             check=verify, max_autotune=False)
    for splits, block_n, warps, stages in ATTENTION_CONFIGS:
        name = f"triton (ours) splits={splits or 'auto'} BLOCK_N={block_n} w{warps} s{stages}"

        def run(s=splits, b=block_n, w=warps, st=stages):
            decode_attention(q, k, v, lengths, out, num_splits=s, BLOCK_N=b, num_warps=w, num_stages=st)

        if _try(table, f"{group} {name}", lambda run=run: (run(), verify(out))):
            table.time(group, name, run, n_bytes=n_bytes, graph=True)
    _best_of_ours(table, group, peers, 1.0, None, n_bytes)  # before the 'vs copy' row: it is no sweep row
    # Against the copy, our best timing, plain or replayed from a CUDA graph (a copy is one launch).
    best = min((r for r in table.rows if r.group == group and r.name.startswith("triton (ours) ")),
               key=lambda r: r.ms, default=None)
    if best is not None:
        table.add(group, "triton (ours) vs copy", best.ms, n_bytes=n_bytes)
        table.same_run(group, "triton (ours) vs copy", best.name)
        table.target(group, "triton (ours) vs copy", "copy ceiling (K/V bytes)", 0.8, 0.9, metric="gbps")


# --- int4 GEMV --------------------------------------------------------------------------------

GEMV_CONFIGS = (  # BLOCK_N, BLOCK_K (weights per row and step), warps: small programs for the bf16x2 path
    (4, 512, 1), (4, 1024, 1), (4, 256, 1), (2, 512, 1), (8, 512, 2), (8, 1024, 2),
)


def _gemv(table: Table) -> None:
    N, K, group_size = GEMV
    x = torch.randn(1, K, device=DEVICE, dtype=DTYPE)
    w = (torch.randn(N, K, device=DEVICE) * 0.02).to(DTYPE)
    w_packed, scales = quantize_int4_ref(w, group_size)
    scales = scales.to(DTYPE)
    out = torch.empty(1, N, device=DEVICE, dtype=DTYPE)
    out_hp = torch.empty(1, N, device=DEVICE, dtype=DTYPE)
    ref = x.float() @ dequantize_int4_ref(w_packed, scales, group_size).T

    def verify(o):
        err = ((o.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"relative error {err:.3g}"

    name_group = f"w4a16 GEMV 1x{K} @ ({N}x{K}).T group {group_size}"
    bytes_bf16 = 2 * N * K + 2 * K + 2 * N
    bytes_int4 = N * K // 2 + 2 * N * (K // group_size) + 2 * K + 2 * N
    table.time(name_group, "torch.matmul bf16 (cuBLAS)", lambda: torch.matmul(x, w.T, out=out_hp),
               n_bytes=bytes_bf16, graph=True)
    compiled = torch.compile(lambda x, p, s: x @ ((torch.stack([p & 0xF, p >> 4], -1).view(N, K).to(DTYPE) - 8)
                                                  * s.repeat_interleave(group_size, 1)).T)
    if _try(table, f"{name_group} torch.compile", lambda: verify(compiled(x, w_packed, scales))):
        table.time(name_group, "torch.compile dequant + matmul", lambda: compiled(x, w_packed, scales),
                   n_bytes=bytes_int4, graph=True)
    for bn, bk, warps in GEMV_CONFIGS:
        name = f"triton (ours) BLOCK_N={bn} BLOCK_K={bk} w{warps}"

        def run(bn=bn, bk=bk, warps=warps):
            w4a16_gemv(x, w_packed, scales, group_size, out, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps)

        if _try(table, f"{name_group} {name}", lambda run=run: (run(), verify(out))):
            table.time(name_group, name, run, n_bytes=bytes_int4, graph=True)
    _best_of_ours(table, name_group, ["torch.matmul bf16 (cuBLAS)", "torch.matmul bf16 (cuBLAS) [graph]"], 2.5, 3.2,
                  bytes_int4)


# --- the toy Llama decoding -------------------------------------------------------------------

def _hf_generate(model, ids, n, static: bool):
    kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    if static:
        kwargs["cache_implementation"] = "static"
    return model.generate(ids, **kwargs)


def _tokens_per_s(fn, tokens: int, repeats: int = 1) -> float:
    """Tokens per second of fn() (already run once: compiled, captured), prompt included."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return tokens / best


def _llama(table: Table) -> None:
    model = toy_llama(dtype=DTYPE, device=DEVICE)
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed" not in n)
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
    bandwidth = None
    copy = [r for r in table.rows if r.name == "copy ceiling (K/V bytes)" and r.gbps]
    if copy:
        bandwidth = max(r.gbps for r in copy) * 1e9
    # generate(cache_implementation="static") compiles the decode step itself (transformers' CompileConfig:
    # torch.compile with mode="reduce-overhead", so CUDA graphs) on a GPU: the peer as HF documents it.
    # Compiling model.forward by hand as well breaks it (outputs of one CUDA-graph replay overwritten).
    compiled = toy_llama(dtype=DTYPE, device=DEVICE)
    for batch in BATCHES:
        ids = torch.randint(0, cfg.vocab_size, (batch, PROMPT), device=DEVICE)
        group = f"toy Llama decode bf16 batch {batch}, {NEW_TOKENS} new tokens"
        tokens = batch * NEW_TOKENS
        step_bytes = weight_bytes + batch * (PROMPT + NEW_TOKENS // 2) * kv_per_token  # read per step, on average
        decoder = StaticCacheLlama(model, batch, PROMPT + NEW_TOKENS)
        ours = decoder.generate(ids, NEW_TOKENS)
        hf = _hf_generate(model, ids, NEW_TOKENS, static=False)
        same = ours[:, PROMPT:] == hf[:, PROMPT:]
        agree = same.float().mean().item()
        first = (~same).float().argmax(dim=1).where((~same).any(dim=1), torch.tensor(NEW_TOKENS, device=DEVICE))
        table.notes.append(f"{group}: {agree:.0%} of our greedy tokens equal HF generate's (bf16, our residual "
                           "stream in fp32: once one near-tie flips, the sequences part)")
        table.fact(f"token agreement batch {batch}", f"{agree:.0%}")
        table.fact(f"first differing token batch {batch}", f"{first.float().mean().item():.0f}")
        runs = [("triton (ours) static cache + CUDA graph", lambda: decoder.generate(ids, NEW_TOKENS))]
        if batch in (1, 16):
            runs += [("triton (ours) static cache, no graph", lambda: decoder.generate(ids, NEW_TOKENS, graph=False)),
                     ("HF generate (dynamic cache)", lambda: _hf_generate(model, ids, NEW_TOKENS, False)),
                     ("HF generate static cache + torch.compile",
                      lambda: _hf_generate(compiled, ids, NEW_TOKENS, True))]
        for name, fn in runs:
            if not _try(table, f"{group} {name}", fn):
                continue
            if name.startswith("HF generate static"):
                table.notes.append(f"{group}: HF compiled its decode step: {getattr(compiled, '_compiled_call', None) is not None}")
            rate = _tokens_per_s(fn, tokens)
            table.add(group, name, 1e3 * batch / rate, n_bytes=step_bytes)  # ms per decode step
            table.fact(f"tokens_per_s {name} batch {batch}", f"{rate:,.0f}")
        if bandwidth:
            floor_s = decode_floor(batch, weight_bytes, kv_per_token, PROMPT + NEW_TOKENS // 2, bandwidth)
            table.add(group, "memory floor (weights + KV cache at the copy bandwidth)", floor_s * 1e3,
                      n_bytes=step_bytes)
            table.fact(f"floor tokens_per_s batch {batch}", f"{batch / floor_s:,.0f}")
        if batch in (1, 16):
            table.target(group, "triton (ours) static cache + CUDA graph", "HF generate static cache + torch.compile",
                         1.0)
    table.fact("toy weight MB", f"{weight_bytes / 1e6:.0f}")


def run(table: Table) -> None:
    for context in CONTEXTS:
        _attention(table, context)
    _gemv(table)
    _llama(table)
