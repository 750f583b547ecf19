"""Exercises of lesson 09: the decode step's floor, a KV-cache append, GQA decode attention, an int4 GEMV.

The KV cache of 09.kv_append is an input *and* an output: it is passed as an `Out` with `init` (the
harness copies the earlier tokens into a guarded buffer with the cache's strides), and the expected
cache is that same content with only row `positions[b]` of each sequence replaced: a write anywhere
else is a mismatch. 09.w4a16_gemv must refuse a K that is no multiple of the group size: that case
passes when the candidate raises ValueError (`Case.raises`).
"""
from __future__ import annotations

import math

import torch

from ..grading import Case, Exercise, Out, register
from ..grading.harness import Fusion, strided_out
from ..grading.inputs import EPS, TF32_EPS, f64, randn, uniform
from ..mode import current, size


def _half() -> torch.dtype:
    """bf16 where Triton computes with it (a GPU of compute capability 8.0+), else fp16."""
    if current().gpu and torch.cuda.get_device_capability()[0] >= 8:
        return torch.bfloat16
    return torch.float16


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --- 09.decode_floor --------------------------------------------------------------------------

def _floor_verify(args):
    batch, weights, kv, context, bandwidth = args
    want = (weights + batch * context * kv) / bandwidth
    mistakes = [
        ((weights + context * kv) / bandwidth, "the KV cache of one sequence only: each of the batch's "
         "sequences reads its own cache (batch * context * kv_bytes_per_token)"),
        (batch * (weights + context * kv) / bandwidth, "the weights read once per sequence: the batch shares "
         "them, they are read once per step"),
        (weights / bandwidth, "the weights only: attention reads the KV cache too"),
        (batch * context * kv / bandwidth, "the KV cache only: the weights are read too"),
        (want * 1e3, "milliseconds: return seconds"),
    ]

    def verify(result, case) -> list[str]:
        try:
            got = float(result)
        except (TypeError, ValueError):
            return [f"returned {type(result).__name__} {result!r:.60}; return a float (seconds)"]
        if math.isclose(got, want, rel_tol=1e-9):
            return []
        for value, why in mistakes:
            if math.isclose(got, value, rel_tol=1e-9) and not math.isclose(value, want, rel_tol=1e-9):
                return [f"returned {got:.6g} s, expected {want:.6g} s: that is {why}"]
        return [f"returned {got:.6g} s, expected {want:.6g} s"]

    return verify


def _floor_cases(gen):
    llama8b = 16.06e9  # bf16 weights of Llama-3-8B
    kv8b = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 K/V heads of 128, bf16: 131072 bytes per token
    for label, args in (
        ("Llama-3-8B, batch 1, context 4096, 3.35 TB/s", (1, llama8b, kv8b, 4096, 3.35e12)),
        ("Llama-3-8B, batch 64, context 4096: the KV cache dominates", (64, llama8b, kv8b, 4096, 3.35e12)),
        ("batch 16, context 1", (16, 1e9, 1000, 1, 1e12)),
        ("context 0: the weights only", (8, 2e9, 5000, 0, 2e12)),
        ("batch 3, odd numbers", (3, 123456789.0, 4321.0, 777, 9.87e11)),
    ):
        yield Case(label, args, None, verify=_floor_verify(args))
    batch = int(torch.randint(1, 128, (), generator=gen))
    context = int(torch.randint(1, 32768, (), generator=gen))
    args = (batch, 7e9, 65536, context, 4.8e12)
    yield Case(f"batch {batch}, context {context}", args, None, verify=_floor_verify(args))


# --- 09.kv_append -----------------------------------------------------------------------------

def _cache(B, H, S, D, dtype, gen, layout: str) -> torch.Tensor:
    """A (B, H, S, D) cache full of earlier tokens, in one of three layouts."""
    if layout == "bshd":  # tokens outermost per sequence, as some engines store it: strides (S H D, D, H D, 1)
        return randn((B, S, H, D), dtype, gen).permute(0, 2, 1, 3)
    if layout == "sliced":  # a window of a longer cache, every other element of a wider D
        return randn((B, H, S + 5, 2 * D), dtype, gen)[:, :, 2:S + 2, ::2]
    return randn((B, H, S, D), dtype, gen)


def _kv_explain(outs, case) -> str:
    k_new, v_new, out_k, out_v, positions = case.args
    pos = positions.cpu().tolist()
    for name, out, new, other in (("cache_k", out_k, k_new, v_new), ("cache_v", out_v, v_new, k_new)):
        got, before = f64(outs[name]), f64(out.init)
        changed = (got != before).any(dim=-1)  # (B, H, S): rows the candidate wrote
        for b, p in enumerate(pos):
            rows = sorted(set(changed[b].nonzero()[:, 1].tolist()))
            if p not in rows and rows:
                why = ""
                if all(r == pos[0] for r in rows):
                    why = f" (positions[0]: each sequence has its own position, positions[{b}])"
                return (f"`{name}`: sequence {b} was written at position(s) {rows[:4]} instead of "
                        f"positions[{b}] = {p}{why}")
            extra = [r for r in rows if r != p]
            if extra:
                return (f"`{name}`: sequence {b} also changed position(s) {extra[:4]}; write only row "
                        f"positions[{b}] = {p} and leave the earlier tokens alone")
        if bool(torch.equal(got[torch.arange(len(pos)), :, pos], f64(other))):
            return f"`{name}` holds the other tensor's values: K goes to cache_k, V to cache_v"
    return ""


def _kv_case(label, B, H, S, D, dtype, gen, layout="contiguous", positions=None, strided_new=False,
             layout_v=None, k_dtype=None, v_dtype=None):
    """strided_new: k_new and v_new slices of a fused QKV output (True), or v_new only ("v"), or ("per_head")
    k_new transposed and v_new a slice of a per-head fused one, or ("v_transposed") the other way round;
    layout_v: cache_v's layout when not cache_k's;
    k_dtype, v_dtype: k_new's or v_new's dtype when not the caches' (the cache holds it rounded to its own)."""
    if strided_new == "per_head":
        k_new = randn((B, D, H), dtype, gen).permute(0, 2, 1)  # strides (D H, 1, H): d is the far axis
        v_new = randn((B, H, 3 * D), dtype, gen)[:, :, 2 * D:]  # GPT-NeoX's (B, H, 3 D): strides (3 H D, 3 D, 1)
    elif strided_new == "v_transposed":
        k_new = randn((B, H, 3 * D), dtype, gen)[:, :, D:2 * D]  # strides (3 H D, 3 D, 1)
        v_new = randn((B, D, H), dtype, gen).permute(0, 2, 1)  # strides (D H, 1, H)
    elif strided_new:  # slices of one fused (B, 3 H D) projection output: strides (3 H D, D, 1)
        fused = randn((B, 3 * H * D), dtype, gen)
        k_new, v_new = fused[:, H * D:2 * H * D].view(B, H, D), fused[:, 2 * H * D:].view(B, H, D)
        if strided_new == "v":
            k_new = k_new.contiguous()  # strides (H D, D, 1): not v_new's
    else:
        k_new, v_new = randn((B, H, D), k_dtype or dtype, gen), randn((B, H, D), v_dtype or dtype, gen)
    if positions is None:
        positions = torch.randint(0, S, (B,), generator=gen)
    positions = torch.as_tensor(positions, dtype=torch.int32)
    cache_k = _cache(B, H, S, D, dtype, gen, layout)
    cache_v = _cache(B, H, S, D, dtype, gen, layout_v or layout)
    want_k, want_v = f64(cache_k), f64(cache_v)
    rows = torch.arange(B)
    want_k[rows, :, positions.long()] = f64(k_new.to(dtype))
    want_v[rows, :, positions.long()] = f64(v_new.to(dtype))
    writable = torch.zeros(B, H, S, D, dtype=torch.bool)  # row positions[b] of every (b, h), nothing else
    writable[rows, :, positions.long()] = True
    what = "row positions[b] of each sequence's heads"
    args = (k_new, v_new, Out("cache_k", (B, H, S, D), dtype, init=cache_k, writable=writable, what=what),
            Out("cache_v", (B, H, S, D), dtype, init=cache_v, writable=writable, what=what),
            positions.to(current().device))
    return Case(label, args, {"cache_k": want_k, "cache_v": want_v}, 0.0, 0.0, explain=_kv_explain)


def _kv_cases(gen):
    half = _half()
    yield _kv_case("one sequence, one head, position 0", 1, 1, 5, 16, torch.float32, gen, positions=[0])
    yield _kv_case(f"4 sequences at different positions incl. 0 and S_max - 1, S_max 37, {_name(half)}",
                   4, 8, 37, 64, half, gen, positions=[0, 36, 17, 3])
    yield _kv_case("D = 80: no power of 2", 3, 4, 23, 80, torch.float32, gen)
    yield _kv_case("cache stored (B, S, H, D), viewed (B, H, S, D): any strides", 3, 4, 29, 32, half, gen,
                   layout="bshd")
    yield _kv_case("cache a window of a longer one, every other element of D; k_new, v_new slices of a "
                   "fused QKV output", 2, 8, 19, 16, half, gen, layout="sliced", strided_new=True)
    # Every case above gives the two caches one layout, and k_new and v_new one too: a kernel that addresses
    # V with K's strides (passing cache_k.stride() twice) would pass them all.
    yield _kv_case("cache_k (B, H, S, D) but cache_v stored (B, S, H, D), k_new contiguous but v_new a slice "
                   "of a fused QKV output: each tensor has its own strides", 3, 4, 21, 16, half, gen,
                   strided_new="v", layout_v="bshd")
    B, S = size((16, 4100), (3, 100))
    yield _kv_case(f"{B} sequences, S_max {S}", B, 8, S, 128, half, gen)
    # Last, so that the cases above draw what they drew before it came. Every k_new and v_new above has D
    # stride 1 and head stride D: a kernel that addressed them as b * stride_b + h * D + d passed them all.
    yield _kv_case("k_new a transposed view, strides (D H, 1, H); v_new a slice of GPT-NeoX's fused QKV per "
                   "head, (B, H, 3 D), strides (3 H D, 3 D, 1): address k_new and v_new with all three of "
                   "their strides", 2, 3, 9, 16, half, gen, strided_new="per_head")
    yield _kv_case(f"k_new fp32 on {_name(half)} caches, as the toy Llama's decode step calls it (its rotary "
                   "embedding runs in fp32): each value rounded to the cache's dtype when stored", 3, 2, 11, 32,
                   half, gen, k_dtype=torch.float32)
    yield _kv_case("D = 256, the toy Llama's head dim: size the block of D from D (a block fixed at 128 leaves "
                   "half of each row)", 2, 2, 7, 256, half, gen)
    # Every v_new above has D stride 1 (k_new's alone was transposed): a kernel that took v_new's last dim as
    # contiguous passed them all.
    yield _kv_case("v_new a transposed view, strides (D H, 1, H), and k_new a slice of a per-head fused QKV: "
                   "each of the two with its own three strides", 2, 3, 9, 16, half, gen, strided_new="v_transposed")
    # Only k_new was ever wider than the caches: a v_new loaded as the cache's dtype passed every case
    yield _kv_case(f"v_new fp32 on {_name(half)} caches (k_new the caches' dtype): v_new's values rounded to the "
                   "cache's dtype when stored, loaded as v_new's own", 3, 2, 11, 32, half, gen, v_dtype=torch.float32)
    # The one case of the caches in two layouts gives them the same batch and D strides: a kernel that took
    # cache_v's batch stride or D stride from cache_k passed every case.
    yield _kv_case("cache_k contiguous, cache_v a window of a longer cache with every other element of a wider D "
                   "(strides (2 H (S + 5) D, 2 (S + 5) D, 2 D, 2)): all four of cache_v's strides are its own", 2,
                   3, 9, 16, half, gen, layout_v="sliced")


# --- 09.decode_attention ----------------------------------------------------------------------

def _attention64(q, k, v, lengths, *, mapping="div", scale=True, masked=True) -> torch.Tensor:
    """float64 (B, H_q, D) decode attention; the keyword arguments reproduce known mistakes."""
    B, H_q, D = q.shape
    H_kv = k.shape[1]
    heads = torch.arange(H_q)
    # "mod": h % H_kv; "by_kv": h // H_kv, divided by the number of K/V heads instead of the group size
    kv_head = {"div": heads // (H_q // H_kv), "mod": heads % H_kv, "by_kv": heads // H_kv}[mapping]
    out = torch.empty(B, H_q, D, dtype=torch.float64)
    for b in range(B):
        n = int(lengths[b]) if masked else k.shape[2]
        keys, values = k[b, kv_head, :n], v[b, kv_head, :n]  # (H_q, n, D)
        s = (keys @ q[b, :, :, None])[..., 0] / (math.sqrt(D) if scale else 1.0)  # (H_q, n)
        out[b] = (torch.softmax(s, dim=-1)[:, None, :] @ values)[:, 0]
    return out


def _unrescaled64(q, k, v, lengths, split_len: int) -> torch.Tensor:
    """Flash-decoding with the partials added up as they are: no exp(m_i - m) factors."""
    B, H_q, D = q.shape
    group = H_q // k.shape[1]
    out = torch.empty(B, H_q, D, dtype=torch.float64)
    for b in range(B):
        n = int(lengths[b])
        keys, values = k[b, torch.arange(H_q) // group, :n], v[b, torch.arange(H_q) // group, :n]
        s = (keys @ q[b, :, :, None])[..., 0] / math.sqrt(D)  # (H_q, n)
        num, den = 0.0, 0.0
        for start in range(0, n, split_len):
            part = s[:, start:start + split_len]
            p = torch.exp(part - part.max(dim=1, keepdim=True).values)  # each split against its own max
            num = num + (p[:, None, :] @ values[:, start:start + split_len])[:, 0]  # (H_q, D)
            den = den + p.sum(dim=1, keepdim=True)
        out[b] = num / den
    return out


def _attention_explain(atol, rtol):
    def close(got, want) -> bool:
        return bool(((got - want).abs() <= atol + rtol * want.abs()).all())

    def explain(outs, case) -> str:
        q, k, v, lengths = (f64(a) for a in case.args[:4])
        got = f64(outs["out"])
        if torch.isnan(got).any():
            return ""
        H_q, H_kv, S_max = q.shape[1], k.shape[1], k.shape[2]
        if H_kv not in (1, H_q) and close(got, _attention64(q, k, v, lengths, mapping="mod")):
            return ("that is query head h reading K/V head h % H_kv: consecutive query heads share a K/V head, "
                    f"g(h) = h // (H_q // H_kv) = h // {H_q // H_kv}")
        if (H_q // H_kv != H_kv and (H_q - 1) // H_kv < H_kv
                and close(got, _attention64(q, k, v, lengths, mapping="by_kv"))):
            return (f"that is query head h reading K/V head h // H_kv = h // {H_kv}: divide by the group size, "
                    f"the number of query heads per K/V head, g(h) = h // (H_q // H_kv) = h // {H_q // H_kv}")
        first = lengths[:1].expand_as(lengths)  # every sequence cut at sequence 0's length
        if bool((lengths != first).any()) and close(got, _attention64(q, k, v, first)):
            return ("that is every sequence attending over lengths[0] keys: each sequence has its own "
                    "length, load lengths[b] for the program's sequence b")
        if bool((lengths < S_max).any()) and close(got, _attention64(q, k, v, lengths, masked=False)):
            return ("that is attention over all S_max keys: keys at positions >= lengths[b] are garbage; "
                    "mask them (score -inf) and stop the loop at the length")
        if close(got, _attention64(q, k, v, lengths, scale=False)):
            return "that is attention without the 1/sqrt(D) scale on the scores"
        for split_len in sorted({16, 32, 64, 128, 256, 512, 1024}
                                | {math.ceil(S_max / n / t) * t for n in (2, 4, 8, 16) for t in (16, 32, 64)}):
            if split_len < int(lengths.max()) and close(got, _unrescaled64(q, k, v, lengths, split_len)):
                return (f"that is the splits' partials (of {split_len} keys) added up without rescaling: "
                        "each split's (l, acc) is relative to its own max m_i; multiply both by exp(m_i - m), "
                        "m the largest m_i, before summing (lesson 05's merge rule)")
        return ""

    return explain


def _attention_case(label, B, H_q, H_kv, S, D, dtype, gen, lengths=None, layout="contiguous", ramp=False,
                    layout_v=None, q_scale=1.0, q_offset=0.0, k_offset=0.0, q_dtype=None, stale_nan=False,
                    v_offset=0.0, q_layout="contiguous", out_transposed=False):
    """q_dtype: q's when it is not the caches' (out has the caches'); stale_nan: NaN past each length;
    q_layout: "fused", q the first H_q heads of a fused (B, (H_q + 2 H_kv) D) QKV projection, strides
    ((H_q + 2 H_kv) D, D, 1); "transposed", a (B, D, H_q) tensor's view, strides (D H_q, 1, H_q);
    out_transposed: out the same view of a (B, D, H_q) tensor."""
    if q_layout == "fused":
        q = randn((B, (H_q + 2 * H_kv) * D), q_dtype or dtype, gen, q_scale, q_offset)[:, :H_q * D].view(B, H_q, D)
    elif q_layout == "transposed":
        q = randn((B, D, H_q), q_dtype or dtype, gen, q_scale, q_offset).transpose(1, 2)
    else:
        q = randn((B, H_q, D), q_dtype or dtype, gen, q_scale, q_offset)
    k = _cache(B, H_kv, S, D, dtype, gen, layout)
    if k_offset:
        k += k_offset  # in place: k keeps its layout's strides
    v = _cache(B, H_kv, S, D, dtype, gen, layout_v or layout)  # layout_v: V's layout when it is not K's
    if v_offset:
        v += v_offset
    if ramp:  # keys grow along the context (x 0.5 .. 2.5): the running max keeps rising, tile after tile
        k *= torch.linspace(0.5, 2.5, S, dtype=torch.float64).to(k.device, k.dtype)[:, None]
    if lengths is None:
        lengths = torch.randint(1, S + 1, (B,), generator=gen)
    lengths = torch.as_tensor(lengths, dtype=torch.int32)
    # out is a weighted mean of the rows before each length: its rounding is relative to those rows' values
    v_max = max(float(f64(v[b, :, :int(lengths[b])]).abs().max()) for b in range(B))
    for b in range(B):  # past the length: another request's stale tokens, large enough to matter
        k[b, :, int(lengths[b]):] *= 4
        v[b, :, int(lengths[b]):] += 3
    expected = _attention64(f64(q), f64(k), f64(v), lengths)
    eps = EPS[dtype] if dtype != torch.float32 else (TF32_EPS if current().gpu else 2.0**-20)
    # Rounding of p to the cache's dtype before P @ V, and of the output: a few steps of V's magnitude.
    atol, rtol = 8 * eps * v_max, 8 * eps
    if stale_nan:  # garbage may be anything: a cache from torch.empty holds NaN where nothing was written
        for b in range(B):
            k[b, :, int(lengths[b]):] = float("nan")
            v[b, :, int(lengths[b]):] = float("nan")
    out = strided_out("out", dtype, (B, D, H_q), (0, 2, 1)) if out_transposed else Out("out", (B, H_q, D), dtype)
    args = (q, k, v, lengths.to(current().device), out)
    return Case(label, args, {"out": expected}, atol, rtol, explain=_attention_explain(atol, rtol))


def _attention_cases(gen):
    half = _half()
    f32 = torch.float32
    yield _attention_case("one sequence, length 1", 1, 4, 4, 5, 16, f32, gen, lengths=[1])
    yield _attention_case(f"GQA 8 query heads on 2 K/V heads, lengths 1, 57 and S_max = 100, {_name(half)}",
                          3, 8, 2, 100, 16, half, gen, lengths=[1, 57, 100])
    yield _attention_case("MHA: 4 query heads, 4 K/V heads, S_max 37", 2, 4, 4, 37, 32, f32, gen,
                          lengths=[37, 20])
    S = size(1000, 120)
    yield _attention_case(f"MQA: 8 query heads on 1 K/V head, S_max {S}", 3, 8, 1, S, 16, half, gen)
    yield _attention_case("32 query heads on 8 K/V heads (Llama-3-8B's grouping), cache (B, S, H, D) strides",
                          2, 32, 8, 50, 16, half, gen, layout="bshd")
    yield _attention_case("GQA group 4, cache a window of a longer one: any strides", 2, 16, 4, 70, 32, half, gen,
                          layout="sliced")
    # The cases above give K and V one layout: a kernel reading V with K's strides would pass them all.
    yield _attention_case("GQA group 2, cache_k (B, H, S, D) but cache_v stored (B, S, H, D): V has its own "
                          "strides", 2, 8, 4, 45, 16, half, gen, layout_v="bshd")
    B, S, D = size((8, 4099, 128), (1, 64, 32))
    yield _attention_case(f"B {B}, 32 on 8 heads, D {D}, S_max {S}", B, 32, 8, S, D, half, gen)
    yield _attention_case("context 600 whose keys grow along it (scores rise tile after tile): a loop over "
                          "key tiles that rescales its running sums by exp(m_old - m_new) when the max rises",
                          2, 4, 2, 600, 16, f32, gen, lengths=[600, 517], ramp=True)
    # Scores above stay below 30: exp(score) fits fp32, so a merge that weighs split i by exp(m_i), or by
    # exp(m_i - m_0) against split 0's max, gave the right answer. Here exp(150) is inf. Last, so that the
    # cases above draw what they drew before it came; the interpreter only (4 splits there) until a GPU
    # run has measured the solution on it.
    if not current().gpu:
        yield _attention_case("scores up to a few hundred (q ~ 60, keys growing along the context): exp(150) "
                              "overflows fp32; each split subtracts its running max, and the merge weighs "
                              "split i by exp(m_i - m) with m the LARGEST m_i (not split 0's), never "
                              "exp(m_i) alone", 1, 4, 2, 200, 16, half, gen, lengths=[190], q_scale=60.0,
                              ramp=True)
        # Every score above has some key of each query head above -88, where exp() is a normal fp32: a
        # running max that starts at 0 instead of -inf (exact while max(0, scores) is near the scores) passed.
        # Here q ~ -10 and keys ~ +4 in every component: every score is near -160, exp(score - 0) is 0.
        yield _attention_case("every score near -160 (q ~ -10, keys ~ +4 in each component): exp(score) is 0 "
                              "in fp32, so subtract the running max, which starts at -inf (not 0)",
                              2, 4, 2, 64, 16, half, gen, lengths=[64, 23], q_offset=-10.0, k_offset=4.0)
    # Every group above (H_q // H_kv: 1, 2, 4, 8) is a power of 2: a block of exactly GROUP query heads,
    # tl.arange(0, GROUP), passed them all, and Triton refuses it for any other group.
    yield _attention_case("28 query heads on 4 K/V heads (Qwen2-7B's grouping): a group of 7, no power of 2; "
                          "pad the group's block to a power of 2 and mask the extra heads", 2, 28, 4, 40, 16,
                          half, gen, lengths=[40, 9])
    # Every group above is at most 8 heads: a block of 16 query heads, fixed (tl.dot's smallest), masked to the
    # group, passed them all. MQA models share one K/V head among many more (StarCoder: 48, Falcon-7B: 71).
    yield _attention_case("MQA: 48 query heads on 1 K/V head (StarCoder's grouping): a group of 48, more than "
                          "a block of 16 heads holds; the group's block is the next power of 2 (64)", 2, 48, 1,
                          32, 16, half, gen, lengths=[32, 13])
    # Every context above is at most a few thousand keys of mixed-sign values: running sums of p and of
    # p * v kept in 16 bits stayed within the tolerance. Here they reach thousands, where fp16's step is 2.
    if not current().gpu:
        yield _attention_case("one sequence of 16384 tokens, scores near 0 and values near 1: the running sums "
                              "of p and of p * v reach thousands, where fp16's step is 2 (2048 + 1 rounds to "
                              "2048); keep them in fp32 (tl.zeros(..., dtype=tl.float32))", 1, 4, 1, 16384, 16,
                              half, gen, lengths=[16384], q_scale=0.1, v_offset=1.0)
    # Every stale row above is a finite number: a kernel that loaded all S_max keys (masked by the cache's
    # bounds only) and scored those past the length -inf passed them all, p = 0 times finite garbage being 0.
    yield _attention_case("MHA, past each length NaN (the cache's garbage may be anything, as memory from "
                          "torch.empty): load K and V masked by keys < lengths[b], other=0; p = 0 times NaN is "
                          "NaN", 2, 2, 2, 40, 16, f32, gen, lengths=[40, 9], stale_nan=True)
    # Every q above has the caches' dtype: a tl.dot of q as loaded and a K tile passed them all, and Triton
    # refuses operands of two dtypes ("Both operands must be same dtype"), where the toy Llama's decode step
    # (below the exercises, on your kernels) calls it, q from its fp32 projection and caches in the model's.
    yield _attention_case(f"q fp32 from the model's fp32 projection, caches and out {_name(half)} (the toy "
                          "Llama's decode step): tl.dot takes two operands of one dtype, cast q's block to the "
                          "cache's", 2, 4, 2, 40, 16, half, gen, lengths=[40, 9], q_dtype=f32)
    # Every D above is at most 128 (Llama's): a block of D fixed at 128 and masked passed them all
    yield _attention_case(f"D = 256, the toy Llama's head dim, {_name(half)}: size the block of D from D", 2, 8, 2,
                          40, 256, half, gen, lengths=[40, 17])
    # Every q above is contiguous: a kernel that addressed q as (B, H_q, D) rows of H_q * D passed them all. An
    # engine's q is a view of its fused QKV projection's output, as kv_append's k_new and v_new are.
    yield _attention_case("q a view of a fused QKV projection's output, (B, (H_q + 2 H_kv) D) sliced to its first "
                          "H_q D columns: q has its own strides", 3, 8, 2, 40, 16, half, gen, lengths=[40, 9, 26],
                          q_layout="fused")
    # Every q above has D stride 1: a kernel that took q's last dim as contiguous passed them all.
    yield _attention_case("q a transposed view of a (B, D, H_q) tensor, strides (D H_q, 1, H_q): q.stride(2) is "
                          "H_q, not 1", 2, 8, 2, 40, 16, half, gen, lengths=[40, 11], q_layout="transposed")
    # The one case of K and V in two layouts gives them the same batch and D strides: a kernel that took
    # V's batch stride or D stride from K passed every case.
    yield _attention_case("cache_k contiguous, cache_v a window of a longer cache with every other element of a "
                          "wider D: all four of V's strides are its own; out a (B, D, H_q) tensor's view, "
                          "strides (D H_q, 1, H_q): address out with its own strides too", 2, 8, 4, 40, 16, half,
                          gen, lengths=[40, 23], layout_v="sliced", out_transposed=True)
    # The one case of mixed dtypes has q wider than the caches: a kernel that cast K and V to q's dtype passed it
    yield _attention_case(f"q {_name(half)} on float32 caches and out: the dot in the caches' dtype (cast q's block "
                          "to it), never the caches' blocks to q's", 2, 4, 2, 40, 16, torch.float32, gen,
                          lengths=[40, 9], q_dtype=half)
    # The case of scores near -160 has 2 splits: a merge whose splits fill its block exactly. With a split
    # count that is no power of 2 the merge's block has lanes past the last split, whose m must load as -inf:
    # loaded as 0, the common max is max(m_i, 0), and every exp(m_i - 0) is 0. The interpreter only, as that case.
    if not current().gpu:
        yield _attention_case("every score near -160, one sequence of 96 keys (in 3 splits of 32, say: a split count "
                              "that is no power of 2): the merge loads m = -inf (other=-inf) for its lanes past the "
                              "last split, never 0, or exp(m_i - 0) is 0 for every split", 1, 4, 2, 96, 16, half,
                              gen, lengths=[96], q_offset=-10.0, k_offset=4.0)
    # Every score above that runs on a GPU is within a few units of 0, where a split's max rounded to 16 bits
    # (partials kept in out's dtype) is off by a few thousandths. Softmax ignores a common level of the scores;
    # a rounded max does not: near 160 fp16 rounds it by up to 0.0625 and bf16 by up to 0.5.
    yield _attention_case(f"scores near 160 (q ~ 2.5, keys ~ 8 in each component, D 64), one sequence of 512 keys in "
                          f"several splits, {_name(half)}: keep each split's m, l and acc in fp32 (the partials' "
                          "buffer too); a max rounded to 16 bits weighs its split by exp(the rounding)", 1, 4, 1, 512,
                          64, half, gen, lengths=[512], q_scale=0.3, q_offset=2.5, k_offset=8.0)


# --- 09.w4a16_gemv ----------------------------------------------------------------------------

def _w4_weights(W_q, scales, group_size, *, swap=False, zero=8, per_row=False, signed=False,
                byte_groups=False):
    """float64 W (N, K) from nibbles (N, K) and scales (N, K / group); keywords reproduce mistakes."""
    q = W_q.to(torch.float64)
    if swap:  # even k read from the high nibble and odd k from the low one
        q = torch.stack([q[:, 1::2], q[:, 0::2]], dim=2).reshape(q.shape)
    if signed:  # the nibble read as a two's-complement int4, -8..7, instead of unsigned with zero point 8
        q, zero = torch.where(q >= 8, q - 16, q), 0
    s = f64(scales)
    s = s[:, :1].expand_as(s) if per_row else s
    per_k = s.repeat_interleave(group_size, dim=1)  # (N, K): scales[n, k // group_size]
    if byte_groups:  # scales[n, (k // 2) // group_size]: the group of byte k // 2, not of weight k
        per_k = s[:, torch.arange(q.shape[1]) // 2 // group_size]
    return (q - zero) * per_k


def _w4_explain(atol, rtol, W_q):
    def explain(outs, case) -> str:
        x = f64(case.args[0])
        scales, group_size = case.args[2], case.args[3]
        got = f64(outs["out"])
        for kwargs, why in (
            (dict(swap=True), "the nibbles swapped: weight k = 2j is the LOW nibble of byte j (& 0xF), "
                              "k = 2j + 1 the high one (>> 4), as 07.pack_int4 packs them"),
            (dict(zero=0), "the zero point forgotten: the nibbles are unsigned 0..15 and mean q - 8"),
            (dict(per_row=True), "one scale per row (scales[n, 0]) for every group: group g of row n has its "
                                 "own scale, scales[n, k // group_size]"),
            (dict(swap=True, zero=0), "the nibbles swapped and the zero point (8) forgotten"),
            (dict(signed=True), "the nibbles read as signed int4 (-8..7, sign-extended): they are unsigned "
                                "0..15 with zero point 8, w = (q - 8) * scale"),
            (dict(byte_groups=True), "the scale of group (k // 2) // group_size, that of the BYTE index: "
                                     "weight k sits in byte k // 2, but its group is k // group_size"),
        ):
            want = x @ _w4_weights(W_q, scales, group_size, **kwargs).T
            if bool(((got - want).abs() <= atol + rtol * want.abs()).all()):
                return "that is " + why
        # A wrong nibble, zero point or scale is off by about sqrt(sum_k (x_k W_nk)^2); an error far below it
        # is rounding: a sum kept in 16 bits
        W = _w4_weights(W_q, scales, group_size)
        spread = float((x**2 @ (W**2).T).sqrt().max())
        worst = float((got - x @ W.T).abs().max())
        if worst <= spread / 8:
            return (f"off by up to {worst:.3g}, far less than a wrong nibble, zero point or scale gives (about "
                    f"{spread:.3g}): rounding, as of a running sum kept in fp16 or bf16; accumulate in fp32 "
                    "(tl.zeros(..., dtype=tl.float32)) and convert to out's dtype only at the store")
        return ""

    return explain


def _w4_case(label, M, N, K, group_size, dtype, gen, scale_dtype=None, cancelling=False, x_row_stride=None,
             x_transposed=False, out_layout="contiguous", x_scale=1.0):
    """x_row_stride: x the first K columns of an (M, x_row_stride) tensor (a slice of a wider activation);
    x_transposed: x a (K, M) tensor's transpose, strides (1, M); x_scale: the cancelling case's x times it."""
    if cancelling:  # _w4_cancelling_case
        x = uniform((M, K), 0.9, 1.1, dtype, gen) * x_scale
        W_q = torch.randint(9, 16, (N, K), generator=gen, dtype=torch.uint8)  # w > 0: nibbles 9..15
        W_q[:, K // 2:] = 16 - W_q[:, K // 2:]  # w < 0 over the second half of K: nibbles 1..7
        scales = uniform((N, K // group_size), 0.04, 0.05, scale_dtype or dtype, gen)
    else:
        x = randn((K, M), dtype, gen).t() if x_transposed else randn((M, x_row_stride or K), dtype, gen)[:, :K]
        W_q = torch.randint(0, 16, (N, K), generator=gen, dtype=torch.uint8)  # the nibbles, 0..15
        scales = uniform((N, K // group_size), 0.005, 0.05, scale_dtype or dtype, gen)
    w_packed = (W_q[:, 0::2] | (W_q[:, 1::2] << 4)).to(current().device)  # 07.pack_int4's order
    if K % group_size:
        args = (x, w_packed, scales, group_size, Out("out", (M, N), dtype))
        return Case(label, args, None, raises=ValueError)
    W = _w4_weights(W_q, scales, group_size)  # (N, K) float64
    expected = f64(x) @ W.T  # (M, N)
    magnitude = float((f64(x).abs() @ W.abs().T).max())
    # A kernel may dequantize W to x's dtype and feed it to a 16-bit tl.dot, as W4A16 GEMMs do: each
    # weight is then off by at most one rounding (EPS, relative), independently of the others, and x's
    # random signs make the sum of those errors a random walk: beyond 8 EPS sqrt(sum_k (x_k W_nk)^2)
    # with probability below 2 exp(-32) (Hoeffding). The solution's bf16x2 path (lesson 09) rounds to bf16
    # once per product added to a running sum of at most four: one rounding per weight again, of a
    # number about twice a product, inside the same bound. Wrong nibbles, zero points or scales are off
    # by about sqrt(sum_k (x_k W_nk)^2) itself.
    spread = float((f64(x) ** 2 @ (W**2).T).sqrt().max())
    eps = EPS[dtype]  # x's dtype, and out's
    atol = magnitude * 2.0**-18 + 2 * eps * float(expected.abs().max()) * 0.01 + 8 * eps * spread
    rtol = 4 * eps
    out = Out("out", (M, N), dtype, layout=out_layout)
    return Case(label, (x, w_packed, scales, group_size, out), {"out": expected}, atol, rtol,
                explain=_w4_explain(atol, rtol, W_q))


# K = 4096 in groups of 32, nibbles 9..15 (q - 8 = 4 on average), scales 0.04..0.05: the sums climb to
# 2048 x 4 x 0.045 = 369, where fp16's step is 0.25. Over 40 seeds the worst error of weights rounded to fp16
# once (a 16-bit tl.dot) is 0.37 of the tolerance, and that of an fp16 running sum over two blocks of 2048 at
# least 1.6 of it (3.2 over blocks of 512).
W4_CANCELLING = ("x of positive values near 1, weights of (9..15 - 8) x scale over the first half of K and "
                 "(1..7 - 8) x scale over the second: each output's running sum climbs to about 370 and "
                 "cancels, so accumulate in fp32 (tl.zeros(..., dtype=tl.float32)); a 16-bit running sum "
                 "rounds it by up to 0.125 at every step")


def _w4_cases(gen):
    half = _half()
    N, K = size((4099, 4096), (300, 512))
    yield _w4_case("one token, one group: 1 x 16 @ (17 x 16).T, group 16", 1, 17, 16, 16, half, gen)
    yield _w4_case("K = 200 is no multiple of group_size = 64: must raise ValueError", 2, 8, 200, 64, half, gen)
    yield _w4_case(f"one token: 1 x {K} @ ({N} x {K}).T, group 128", 1, N, K, 128, half, gen)
    yield _w4_case("M = 5, K = 384 = 3 groups of 128, N = 96", 5, 96, 384, 128, half, gen)
    yield _w4_case("M = 16, group 32, fp32 scales", 16, 40, 256, 32, half, gen, scale_dtype=torch.float32)
    yield _w4_case("M = 3, group 64, N = 33", 3, 33, 448, 64, half, gen)
    yield _w4_case("M = 2, K = 1536 (12 groups of 128), N = 40: loop over K, tile after tile",
                   2, 40, 1536, 128, half, gen)
    # Last, so that the cases above draw what they drew before it came; the interpreter only, until a GPU
    # run has measured the solution's bf16x2 path on it (lesson 06's cancelling case waits for the same).
    if not current().gpu:
        yield _w4_case(W4_CANCELLING, 2, 32, 4096, 32, half, gen, cancelling=True)  # M = 2: a batch path too
    # Groups smaller than a tile of K: one scale per (row, group), not per tile (scales[n, k0 // group_size]
    # for a whole tile passed while the only group of 16 was the one-group case)
    yield _w4_case("M = 2, K = 64 in 4 groups of 16, N = 17: each group of 16 weights has its own scale, also "
                   "inside one tile of K", 2, 17, 64, 16, half, gen)
    # Every x above is contiguous: a kernel that addressed x's rows K elements apart passed them all.
    yield _w4_case("M = 3, x the first 256 columns of a (3, 264) activation: x's rows are 264 elements apart, "
                   "use x.stride(); out's rows padded: use out.stride() too", 3, 24, 256, 64, half, gen,
                   x_row_stride=264, out_layout="padded")
    # Every group above is at most 128, a usual tile of K: a kernel whose group had to fit one K step passed
    yield _w4_case("M = 2, K = 512 in 2 groups of 256: a group larger than a tile of K (one scale for several "
                   "K steps)", 2, 24, 512, 256, half, gen)
    # Every x above has column stride 1: a kernel that took x's last dim as contiguous passed them all.
    yield _w4_case("M = 4, x a (K, M) tensor's transpose, strides (1, 4): x.stride(1) is 4, not 1", 4, 24, 256, 64,
                   half, gen, x_transposed=True)
    # Every x above is ~N(0, 1) or ~1: a group's sum of x (q - 8) stayed far below 65504, fp16's largest, and
    # a kernel that summed each group in 16 bits (tl.sum of fp16 products) before its fp32 scale passed. The
    # interpreter only, as the cancelling case above.
    if not current().gpu:
        yield _w4_case("x ~ 200 (activations of a few hundred, as large models' outlier channels have), groups of "
                       "128 of the cancelling weights above: a group's sum of x (q - 8) reaches ~1e5, past fp16's "
                       "largest value 65504: multiply and sum in fp32", 2, 32, 512, 128, half, gen, cancelling=True,
                       x_scale=200.0)


def _dequantized_weights(case: Case) -> tuple[int, str]:
    """W (N, K) dequantized: what the exercise keeps in registers (its packed bytes are N K / 2)."""
    N, packed_k = case.args[1].shape
    return N * packed_k * 2, "the dequantized W (N, K)"


# --- registration -----------------------------------------------------------------------------

register(Exercise(
    "09.decode_floor", "the decode step's memory floor",
    "decode_floor(batch, weight_bytes, kv_bytes_per_token, context, bandwidth)", _floor_cases,
    hint="(weight_bytes + batch * context * kv_bytes_per_token) / bandwidth: the weights once for the batch, "
         "each sequence's own KV cache", kernel=False))
register(Exercise(
    "09.kv_append", "append a token to a KV cache", "kv_append(k_new, v_new, cache_k, cache_v, positions)",
    _kv_cases,
    hint={"wrong": "one program per (b, h): load positions[b] in the kernel, then store k_new[b, h, :] at "
                   "cache_k + b*stride_b + h*stride_h + positions[b]*stride_s + offs_d*stride_d (all four "
                   "strides of the cache, all three of k_new), masked on offs_d < D",
          "out_of_bounds": "store only at position positions[b] of each (b, h), masked offs_d < D; use all "
                           "four strides of the cache (it is not contiguous in every case)"}))
register(Exercise(
    "09.decode_attention", "flash-decoding for GQA", "decode_attention(q, cache_k, cache_v, lengths, out)",
    _attention_cases,
    hint={"wrong": "program (b, kv head, split): q rows kv_head*group .. +group, keys [split*len, min(+len, "
                   "lengths[b])) masked to -inf past the length, online softmax (m, l, acc) per query head; "
                   "the merge multiplies each split's l and acc by exp(m_i - m) before summing, then out = "
                   "acc / l",
          "unwritten": "grid (batch, kv heads, splits) and a merge that writes the row of every query head "
                       "(group query heads per kv head)",
          "out_of_bounds": "mask keys >= lengths[b] on the loads (other=0) and score them -inf; mask offs_d < D; "
                           "address the cache with its strides",
          "nan": "keys at or past lengths[b] may hold NaN: mask their K and V loads (other=0), not only their "
                 "scores (p = 0 times NaN is NaN); a split with no key below lengths[b] has m = -inf and l = 0: it "
                 "must weigh 0 in the merge, "
                 "never exp(-inf - (-inf)); and exp of a score above 88 is inf in fp32 (below -103, 0): "
                 "subtract the running max within a split (it starts at -inf, not 0), and the largest m_i in "
                 "the merge"}))
register(Exercise(
    "09.w4a16_gemv", "int4 weight-only GEMV with group scales", "w4a16_gemv(x, w_packed, scales, group_size, out)",
    _w4_cases,
    hint={"wrong": "w = (nibble - 8) * scales[n, k // group_size], weight 2j's nibble in bits 0-3 of byte j and "
                   "2j+1's in bits 4-7; loop over groups: sum x * (q - 8) over the group, multiply by the group's "
                   "scale, and add it to an fp32 accumulator (tl.zeros(..., dtype=tl.float32))",
          "unwritten": "cdiv(N, BLOCK_N) programs, each storing its BLOCK_N outputs masked n < N",
          "out_of_bounds": "a packed row has K // 2 bytes and scales K // group_size columns: mask the byte "
                           "columns and rows n < N on every load",
          "nan": "masked loads need other=0 (x, the packed bytes, the scales), or undefined lanes reach "
                 "the sum",
          "fusion": "dequantize in registers, in the kernel that multiplies by x: load the packed bytes, split "
                    "the nibbles, subtract 8, scale and multiply; no (N, K) buffer of weights"},
    # The point of int4 weights is reading N K / 2 bytes: W dequantized into memory first, then a matmul on it
    # (lesson 03's), gave the right numbers. Two launches on x or out: a split-K pass and its sum.
    fusion=Fusion("the packed weights are dequantized in registers and multiplied by x there: no (N, K) "
                  "dequantized W is written to memory", _dequantized_weights, kernels=2,
                  own_temporaries=lambda case: (), kept_buffers=True, activations=("x", "out"), partials=True)))
