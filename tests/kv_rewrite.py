"""A wrong 09.kv_append used by two tests: right values, but every (b, h) rewrites its whole (S_max, D) slab
of the caches, the old rows stored back and row positions[b] replaced (S_max times the bytes)."""
import triton
import triton.language as tl


@triton.jit
def kv_rewrite_kernel(k_new, v_new, cache_k, cache_v, positions, s_nb, s_nh, s_nd, s_cb, s_ch, s_cs, s_cd,
                      S, D, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    b, h = tl.program_id(0), tl.program_id(1)
    p = tl.load(positions + b)
    d = tl.arange(0, BLOCK_D)
    nk = tl.load(k_new + b * s_nb + h * s_nh + d * s_nd, mask=d < D)
    nv = tl.load(v_new + b * s_nb + h * s_nh + d * s_nd, mask=d < D)
    for s0 in range(0, S, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        m = (s[:, None] < S) & (d[None, :] < D)
        at = b * s_cb + h * s_ch + s[:, None] * s_cs + d[None, :] * s_cd
        hit = (s == p)[:, None]
        tl.store(cache_k + at, tl.where(hit, nk[None, :], tl.load(cache_k + at, mask=m)), mask=m)
        tl.store(cache_v + at, tl.where(hit, nv[None, :], tl.load(cache_v + at, mask=m)), mask=m)


def kv_append(k_new, v_new, cache_k, cache_v, positions):
    B, H, D = k_new.shape
    assert k_new.stride() == v_new.stride() and cache_k.stride() == cache_v.stride()
    kv_rewrite_kernel[(B, H)](k_new, v_new, cache_k, cache_v, positions, *k_new.stride(), *cache_k.stride(),
                              cache_k.shape[2], D, BLOCK_S=32, BLOCK_D=triton.next_power_of_2(D))
