"""Independent float64 numpy definitions of every mha_kit function (written
from the spec, not from the Rust references), and random ragged cases.

Used by the CPU tests (against the package's CPU path) and the GPU tests
(against the kernels).
"""

import numpy as np

try:
    import ml_dtypes

    BF16 = ml_dtypes.bfloat16
    E4M3 = ml_dtypes.float8_e4m3fn
except ImportError:  # the bf16 / e4m3 cases are skipped
    ml_dtypes = None
    BF16 = E4M3 = None


def to_f64(x):
    """Exact float64 values of an array (uint8 = e4m3 bytes)."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x.view(E4M3).astype(np.float64)
    return x.astype(np.float64)


def attention(q, k_hnd, v_hnd, block_tables, seq_lens, rows, bmm1, bmm2, window_left, sinks,
              with_lse=False):
    """Paged attention (SEMANTICS.md §attention.2).

    q: [T, Hq, D]; k_hnd / v_hnd: [pages, Hkv, P, D] (values); rows: per
    request (first row, n rows). Returns out [T, Hq, D] float64 and the mask
    of written rows (rows of no request stay 0 / False); with ``with_lse``
    also lse [T, Hq] float64, natural log, ``ln(Σ exp(s) + exp(sink))``
    (``-inf`` for a row that sees no key, with or without a sink).
    """
    q = to_f64(q)
    k = to_f64(k_hnd)
    v = to_f64(v_hnd)
    t, hq, d = q.shape
    hkv, p = k.shape[1], k.shape[2]
    g = hq // hkv
    out = np.zeros((t, hq, d))
    lse = np.full((t, hq), -np.inf)
    written = np.zeros(t, dtype=bool)
    for b, (start, n) in enumerate(rows):
        length = int(seq_lens[b])
        for j in range(n):
            x = length - n + j
            lo = max(0, x - window_left) if window_left >= 0 else 0
            keys = np.arange(lo, x + 1) if x >= 0 else np.arange(0)
            written[start + j] = True
            if keys.size == 0:
                continue
            pages = block_tables[b, keys // p]
            offs = keys % p
            for h in range(hq):
                kk = k[pages, h // g, offs]  # [nk, D]
                vv = v[pages, h // g, offs]
                s = bmm1 * (kk @ q[start + j, h])
                m = s.max()
                if sinks is not None:
                    m = max(m, float(sinks[h]))
                e = np.exp(s - m)
                den = e.sum() + (np.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
                out[start + j, h] = bmm2 * (e @ vv) / den
                lse[start + j, h] = m + np.log(den)
    return (out, written, lse) if with_lse else (out, written)


def unit_order(seq_lens):
    """The batch's length order (``mha_kit.write_decode_unit_order``): request
    indices in descending ``ceil(len / 128)`` (capped at 255; a length ≤ 0 is
    0), ties by index."""
    bucket = [0 if n <= 0 else min(-(-int(n) // 128), 255) for n in seq_lens]
    return np.array(sorted(range(len(bucket)), key=lambda i: (-bucket[i], i)), dtype=np.int32)


def page_table(req_to_token, req_pool_indices, cache_seqlens, page_table, page_size,
               full_to_swa=None, swa_page_table=None):
    """The page table (SEMANTICS.md §page-table.3) into copies of the outputs (valid input)."""
    pt = page_table.copy()
    spt = None if swa_page_table is None else swa_page_table.copy()
    for i, (r, length) in enumerate(zip(req_pool_indices, cache_seqlens)):
        n = -(-int(length) // page_size)
        for pg in range(n):
            slot = int(req_to_token[r, pg * page_size])
            pt[i, pg] = slot // page_size
            if spt is not None:
                s2 = int(full_to_swa[slot])
                spt[i, pg] = -1 if s2 < 0 else s2 // page_size
    return pt, spt


def e4m3_satfinite(x, inv_scale):
    """Bytes of the fused FP8 write (SEMANTICS.md §fp8-kv.3): f32 product, RNE, ±448, NaN → 0x7F."""
    y = (np.asarray(x, dtype=np.float32) * np.float32(inv_scale)).astype(np.float32)
    nan = np.isnan(y)
    y = np.clip(np.where(nan, 0, y), -448.0, 448.0)
    b = y.astype(E4M3).view(np.uint8).copy()
    b[nan] = 0x7F
    return b


def random_case(rng, *, bs, hq, hkv, d, p, q_lens, dtype, kv_dtype, window_left=-1,
                sinks=False, lens=None, extra_pages=2, layout="HND"):
    """A random paged decode/verify/context case.

    q_lens: rows per request (a list); lens: KV lengths (≥ the rows, random
    when None). Pages of each request are scattered over the pool.
    """
    if lens is None:
        lens = [int(n + rng.integers(0, 3 * p)) for n in q_lens]
    m = max([-(-length // p) for length in lens] + [1])
    pages = bs * m + extra_pages
    perm = rng.permutation(pages)
    bt = np.zeros((bs, m), dtype=np.int32)
    for i in range(bs):
        bt[i] = perm[i * m:(i + 1) * m]
    t = int(sum(q_lens))
    q = rng.standard_normal((t, hq, d)).astype(dtype)
    shape = (pages, hkv, p, d) if layout == "HND" else (pages, p, hkv, d)
    if kv_dtype == "e4m3":
        k = (rng.standard_normal(shape) * 2).astype(E4M3).view(np.uint8)
        v = (rng.standard_normal(shape) * 2).astype(E4M3).view(np.uint8)
    else:
        k = rng.standard_normal(shape).astype(kv_dtype)
        v = rng.standard_normal(shape).astype(kv_dtype)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return dict(
        q=q, k=k, v=v, block_tables=bt, seq_lens=np.array(lens, dtype=np.int32),
        cu=cu, rows=[(int(cu[i]), int(q_lens[i])) for i in range(bs)],
        sinks=(rng.standard_normal(hq).astype(np.float32) if sinks else None),
        window_left=window_left, max_seq_len=max(lens + [1]), layout=layout,
    )


def hnd(x, layout):
    """The HND-indexed view of a cache of `layout`."""
    return x if layout == "HND" else x.transpose(0, 2, 1, 3)
