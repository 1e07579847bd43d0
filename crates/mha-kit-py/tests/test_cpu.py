"""CPU tests of mha_kit (run in CI, no GPU): the package imports, validates
its arguments and runs every function's CPU path (the kernel crates' f64
references) against the independent numpy float64 definitions of
``reference.py`` on random ragged batches and edge cases."""

import math
import zlib

import numpy as np
import pytest

import mha_kit
from mha_kit import _api

import reference as ref

needs_ml_dtypes = pytest.mark.skipif(ref.ml_dtypes is None, reason="ml_dtypes not installed")

TOL = {np.float16: 2.0**-10, "bf16": 2.0**-7}


def _dtype(name):
    if name == "bf16":
        if ref.BF16 is None:
            pytest.skip("ml_dtypes not installed (numpy bfloat16)")
        return ref.BF16
    return np.float16


def _close(got, want, dtype_name, what):
    tol = TOL["bf16" if dtype_name == "bf16" else np.float16]
    got = got.astype(np.float64)
    err = np.abs(got - want)
    bound = tol * np.abs(want) + 1e-6
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else None
    assert err.size == 0 or np.all(err <= bound), (
        f"{what}: worst at {worst}: got {got[worst]}, want {want[worst]}"
    )


def _ws():
    return np.zeros(1 << 16, dtype=np.uint8)


def test_imports_without_torch_or_gpu():
    assert mha_kit.trtllm_batch_decode_with_kv_cache
    assert isinstance(mha_kit.gpu_available(), bool)
    assert mha_kit.HEAD_DIMS == (64, 128, 256)
    assert mha_kit.DECODE_HEAD_DIMS == (64, 128, 256, 512)
    assert issubclass(mha_kit.InvalidArgument, ValueError)
    assert issubclass(mha_kit.DeviceError, RuntimeError)
    if not mha_kit.gpu_available():
        assert isinstance(mha_kit.gpu_missing(), str)


DECODE_CASES = [
    # name, bs, hq, hkv, d, p, q_len, dtype, kv, window, sinks, layout
    ("mha-decode", 3, 4, 4, 64, 16, 1, "f16", "same", -1, False, "HND"),
    ("gqa-8-nhd", 4, 16, 2, 64, 16, 1, "bf16", "same", -1, False, "NHD"),
    ("one-kv-head", 2, 8, 1, 128, 8, 1, "f16", "same", -1, False, "HND"),
    ("window-sinks", 3, 8, 2, 64, 4, 1, "bf16", "same", 5, True, "NHD"),
    ("window-longer-than-seq", 2, 4, 2, 64, 16, 1, "f16", "same", 1000, False, "HND"),
    ("window-zero", 2, 4, 2, 64, 16, 1, "f16", "same", 0, True, "HND"),
    ("verify-q3", 3, 8, 4, 64, 16, 3, "bf16", "same", -1, False, "NHD"),
    ("verify-q4-window", 2, 4, 1, 128, 16, 4, "f16", "same", 7, True, "HND"),
    ("fp8-kv", 3, 8, 2, 64, 16, 1, "bf16", "e4m3", -1, False, "NHD"),
    ("fp8-kv-verify", 2, 8, 8, 128, 32, 2, "f16", "e4m3", 9, True, "HND"),
    ("d256", 2, 2, 1, 256, 16, 1, "f16", "same", -1, False, "HND"),
    ("d512-gqa4-window-sinks", 2, 4, 1, 512, 16, 1, "bf16", "same", 6, True, "NHD"),
    ("d512-fp8-verify", 2, 8, 2, 512, 16, 3, "f16", "e4m3", -1, False, "HND"),
    ("group-16", 2, 16, 1, 64, 16, 2, "bf16", "same", -1, False, "HND"),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c[0] for c in DECODE_CASES])
def test_decode_matches_float64_reference(case):
    name, bs, hq, hkv, d, p, n, dt, kv, window, sinks, layout = case
    dtype = _dtype(dt)
    if kv == "e4m3" and ref.E4M3 is None:
        pytest.skip("ml_dtypes not installed")
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    c = ref.random_case(rng, bs=bs, hq=hq, hkv=hkv, d=d, p=p, q_lens=[n] * bs, dtype=dtype,
                        kv_dtype=("e4m3" if kv == "e4m3" else dtype), window_left=window,
                        sinks=sinks, layout=layout)
    scale = 1 / math.sqrt(d)
    bmm2 = 1.0 if kv != "e4m3" else 0.75
    out = mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], c["max_seq_len"],
        bmm1_scale=scale, bmm2_scale=bmm2, window_left=window, sinks=c["sinks"],
        kv_layout=layout, q_len_per_req=n)
    want, written = ref.attention(c["q"], ref.hnd(c["k"], layout), ref.hnd(c["v"], layout),
                                  c["block_tables"], c["seq_lens"], c["rows"], scale, bmm2,
                                  window, c["sinks"])
    assert written.all()
    _close(out, want, dt, name)


def test_decode_page_boundaries_and_short_sequences():
    rng = np.random.default_rng(7)
    p = 8
    lens = [1, p, p + 1, 2 * p, 2 * p - 1, 3 * p]
    c = ref.random_case(rng, bs=len(lens), hq=4, hkv=2, d=64, p=p, q_lens=[1] * len(lens),
                        dtype=np.float16, kv_dtype=np.float16, lens=lens)
    out = mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 64, bmm1_scale=0.125)
    want, _ = ref.attention(c["q"], c["k"], c["v"], c["block_tables"], c["seq_lens"], c["rows"],
                            0.125, 1.0, -1, None)
    _close(out, want, "f16", "page boundaries")


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_ragged_verify_with_empty_and_short_requests(dt):
    dtype = _dtype(dt)
    rng = np.random.default_rng(11)
    q_lens = [3, 0, 1, 4, 2]
    # Request 4 has fewer keys than rows: its first row sees no key (zeros).
    lens = [20, 5, 17, 33, 1]
    c = ref.random_case(rng, bs=5, hq=8, hkv=2, d=64, p=16, q_lens=q_lens, dtype=dtype,
                        kv_dtype=dtype, lens=lens, sinks=True, window_left=6)
    out = np.full_like(c["q"], 7)
    mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 64,
        bmm1_scale=0.2, window_left=6, sinks=c["sinks"], out=out, q_len_per_req=None,
        max_q_len=4, cum_seq_lens_q=c["cu"])
    want, written = ref.attention(c["q"], c["k"], c["v"], c["block_tables"], c["seq_lens"],
                                  c["rows"], 0.2, 1.0, 6, c["sinks"])
    assert written.all()
    _close(out, want, dt, "ragged verify")
    assert np.all(out[int(c["cu"][4])] == 0)  # no visible key: zeros (D13)


def test_ragged_request_longer_than_max_q_len_is_skipped_and_counted():
    rng = np.random.default_rng(3)
    c = ref.random_case(rng, bs=2, hq=4, hkv=4, d=64, p=16, q_lens=[2, 3], dtype=np.float16,
                        kv_dtype=np.float16)
    out = np.full_like(c["q"], 5)
    k, v = _api._kv_descs(c["k"], c["v"], "HND")
    word = _api._decode_impl(c["q"], c["k"], c["v"], _ws(), c["block_tables"], c["seq_lens"],
                             out, 64, 0.125, 1.0, -1, None, None, 2, c["cu"], "HND")
    assert word == (1, 2)  # one request skipped, Q_LEN_TOO_LONG
    assert np.all(out[2:] == 5)  # its rows untouched
    want, _ = ref.attention(c["q"], c["k"], c["v"], c["block_tables"], c["seq_lens"],
                            c["rows"][:1], 0.125, 1.0, -1, None)
    _close(out[:2], want[:2], "f16", "first request")


def test_bad_page_ids_are_masked_and_counted():
    rng = np.random.default_rng(5)
    c = ref.random_case(rng, bs=2, hq=4, hkv=4, d=64, p=4, q_lens=[1, 1], dtype=np.float16,
                        kv_dtype=np.float16, lens=[10, 3])
    bt = c["block_tables"].copy()
    bt[0, 1] = 10_000  # needed page out of the pool
    out = np.zeros_like(c["q"])
    word = _api._decode_impl(c["q"], c["k"], c["v"], _ws(), bt, c["seq_lens"], out, 64, 0.125,
                             1.0, -1, None, 1, None, None, "HND")
    assert word == (1, 8)  # BAD_PAGE once


def test_empty_batch_changes_nothing():
    q = np.zeros((0, 4, 64), np.float16)
    k = np.zeros((2, 4, 16, 64), np.float16)
    out = mha_kit.trtllm_batch_decode_with_kv_cache(
        q, (k, k), _ws(), np.zeros((0, 1), np.int32), np.zeros(0, np.int32), 16)
    assert out.shape == (0, 4, 64)
    pt = np.full((0, 4), 9, np.int32)
    mha_kit.build_trtllm_mha_page_table(np.zeros((2, 8), np.int32), np.zeros(0, np.int64),
                                        np.zeros(0, np.int32), pt, 4)
    mha_kit.update_trtllm_mha_graph_metadata(
        req_pool_indices=np.zeros(4, np.int64), seq_lens=np.zeros(4, np.int64),
        req_to_token=np.zeros((2, 8), np.int32), cache_seqlens=np.zeros(4, np.int32),
        cu_seqlens_k=np.zeros(5, np.int32), page_table=np.zeros((4, 2), np.int32), bs=0,
        seqlen_offset=0, max_seq_pages=2, page_size=4)


def test_single_kv_tensor_with_k_and_v_dim():
    rng = np.random.default_rng(9)
    c = ref.random_case(rng, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[1, 1], dtype=np.float16,
                        kv_dtype=np.float16)
    kv = np.stack([c["k"], c["v"]], axis=1)  # [pages, 2, Hkv, P, D]
    out = mha_kit.trtllm_batch_decode_with_kv_cache(c["q"], kv, _ws(), c["block_tables"],
                                                    c["seq_lens"], 64, bmm1_scale=0.1)
    want, _ = ref.attention(c["q"], c["k"], c["v"], c["block_tables"], c["seq_lens"], c["rows"],
                            0.1, 1.0, -1, None)
    _close(out, want, "f16", "stacked kv")


CONTEXT_CASES = [
    # name, dtype, kv, window, sinks, layout, d ("prefix" in the name: cached prefixes)
    ("prefill", "f16", "same", -1, False, "HND", 64),
    ("chunked-prefix-nhd", "bf16", "same", -1, True, "NHD", 64),
    ("window", "f16", "same", 9, False, "NHD", 128),
    ("fp8", "bf16", "e4m3", -1, False, "HND", 64),
    # D 512: the decode kernel's ragged path on the GPU, the same definition.
    ("d512-prefix-gqa4-window-sinks-nhd", "bf16", "same", 6, True, "NHD", 512),
    ("d512-prefill-f16", "f16", "same", -1, False, "HND", 512),
    ("d512-fp8-prefix-window-sinks", "bf16", "e4m3", 11, True, "HND", 512),
    ("d512-fp8-prefix-f16-nhd", "f16", "e4m3", -1, False, "NHD", 512),
]


@pytest.mark.parametrize("d", [96, 32, 1024])
def test_head_dims_outside_the_served_ones_are_refused_naming_them(d):
    """Both calls serve DECODE_HEAD_DIMS (the context call at 512 through the
    decode kernel's ragged path); any other head dim is refused, naming it."""
    rng = np.random.default_rng(d)
    q_lens = [3, 2]
    c = ref.random_case(rng, bs=2, hq=4, hkv=1, d=d, p=8, q_lens=q_lens, dtype=np.float16,
                        kv_dtype=np.float16, lens=q_lens)
    needle = rf"`query`: head_dim {d} is not supported \(64, 128, 256, 512\)"
    with pytest.raises(mha_kit.InvalidArgument, match=needle):
        mha_kit.trtllm_batch_context_with_kv_cache(
            c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], max(q_lens),
            c["max_seq_len"], 0.125, 1.0, 2, c["cu"], None)
    with pytest.raises(mha_kit.InvalidArgument, match=needle):
        mha_kit.trtllm_batch_decode_with_kv_cache(
            c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], c["max_seq_len"],
            q_len_per_req=None, max_q_len=max(q_lens), cum_seq_lens_q=c["cu"])


@needs_ml_dtypes
def test_context_at_head_dim_512_keeps_the_dtype_rules():
    """D 512 takes K/V of the query's dtype or e4m3, as the other head dims."""
    rng = np.random.default_rng(512)
    q_lens = [3, 2]
    c = ref.random_case(rng, bs=2, hq=4, hkv=1, d=512, p=8, q_lens=q_lens, dtype=np.float16,
                        kv_dtype=np.float16, lens=q_lens)
    with pytest.raises(mha_kit.InvalidArgument, match=r"`k_cache`: dtype must be the query's"):
        mha_kit.trtllm_batch_context_with_kv_cache(
            c["q"], (c["k"].astype(ref.BF16), c["v"].astype(ref.BF16)), _ws(),
            c["block_tables"], c["seq_lens"], max(q_lens), c["max_seq_len"], 0.125, 1.0, 2,
            c["cu"], None)


@pytest.mark.parametrize("case", CONTEXT_CASES, ids=[c[0] for c in CONTEXT_CASES])
def test_context_matches_float64_reference(case):
    name, dt, kv, window, sinks, layout, d = case
    dtype = _dtype(dt)
    if kv == "e4m3" and ref.E4M3 is None:
        pytest.skip("ml_dtypes not installed")
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    q_lens = [5, 1, 17, 0, 9]
    prefix = [0, 30, 3, 8, 16] if "prefix" in name else [0, 0, 0, 4, 0]
    lens = [n + pfx for n, pfx in zip(q_lens, prefix)]
    c = ref.random_case(rng, bs=5, hq=8, hkv=2, d=d, p=8, q_lens=q_lens, dtype=dtype,
                        kv_dtype=("e4m3" if kv == "e4m3" else dtype), lens=lens, sinks=sinks,
                        window_left=window, layout=layout)
    cu_k = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    out = mha_kit.trtllm_batch_context_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], max(q_lens),
        c["max_seq_len"], 0.125, 1.0, 5, c["cu"], cu_k, window_left=window,
        sinks=c["sinks"], kv_layout=layout)
    want, _ = ref.attention(c["q"], ref.hnd(c["k"], layout), ref.hnd(c["v"], layout),
                            c["block_tables"], c["seq_lens"], c["rows"], 0.125, 1.0, window,
                            c["sinks"])
    _close(out, want, dt, name)


def _pool(rng, rows, width, p, pages):
    """req_to_token rows made of whole scattered pages (the allocator's invariant)."""
    r2t = np.zeros((rows, width), np.int32)
    perm = rng.permutation(np.arange(1, pages))
    per_row = width // p
    for r in range(rows):
        for j in range(per_row):
            page = perm[(r * per_row + j) % len(perm)]
            r2t[r, j * p:(j + 1) * p] = page * p + np.arange(p)
    return r2t


@pytest.mark.parametrize("swa", [False, True])
def test_page_table_matches_reference_and_keeps_tails(swa):
    rng = np.random.default_rng(13)
    p, m = 4, 6
    r2t = _pool(rng, rows=5, width=m * p, p=p, pages=64)
    rpi = np.array([3, 1, 4, 0], np.int64)
    lens = np.array([1, 4, 5, 24], np.int32)  # page boundaries, a full row
    pt = np.full((4, m), -7, np.int32)
    spt = np.full((4, m), -7, np.int32) if swa else None
    f2s = None
    if swa:
        f2s = np.zeros(64 * p + 1, np.int64)
        mapped = rng.permutation(np.arange(1, 64))[:40]
        for i, f in enumerate(mapped):
            f2s[f * p:(f + 1) * p] = (i + 1) * p + np.arange(p)
        f2s[-1] = -1
    want_pt, want_spt = ref.page_table(r2t, rpi, lens, pt, p, f2s, spt)
    mha_kit.build_trtllm_mha_page_table(r2t, rpi, lens, pt, p, swa_page_table=spt,
                                        full_to_swa=f2s)
    assert np.array_equal(pt, want_pt)
    if swa:
        assert np.array_equal(spt, want_spt)
    assert np.all(pt[0, 1:] == -7)  # tail untouched


GRAPH_MODES = [
    # name, seqlen_offset, q_mode, q_stride
    ("decode", 0, mha_kit.Q_MODE_NONE, 0),
    ("draft-decode-step-2", 3, mha_kit.Q_MODE_NONE, 0),
    ("target-verify-4", 4, mha_kit.Q_MODE_STRIDED, 4),
    ("draft-extend-3", 0, mha_kit.Q_MODE_STRIDED, 3),
    ("ragged-verify", 0, mha_kit.Q_MODE_RAGGED_VERIFY, 4),
]


@pytest.mark.parametrize("mode", GRAPH_MODES, ids=[m[0] for m in GRAPH_MODES])
def test_graph_metadata_matches_reference(mode):
    name, offset, q_mode, q_stride = mode
    rng = np.random.default_rng(17)
    p, m, bs, max_bs = 4, 8, 3, 5
    r2t = _pool(rng, rows=6, width=m * p, p=p, pages=80)
    rpi = np.array([2, 5, 1, 0, 0], np.int64)  # bucket buffers longer than bs
    seq = np.array([7, 1, 12, 1, 1], np.int64)
    qlens = np.array([2, 4, 0, 1, 1], np.int32)
    cache = np.full(max_bs, -1, np.int32)
    cu_k = np.full(max_bs + 1, -1, np.int32)
    cu_q = np.full(max_bs + 1, -1, np.int32)
    pt = np.full((max_bs, m), -9, np.int32)
    f2s = np.zeros(80 * p + 1, np.int64)
    for f in range(1, 80):
        f2s[f * p:(f + 1) * p] = (80 - f) * p + np.arange(p)
    f2s[-1] = -1
    spt = np.full((max_bs, m), -9, np.int32)
    loc = np.array([5, 9, 33, 40], np.int64)
    sloc = np.full(6, -3, np.int64)
    mha_kit.update_trtllm_mha_graph_metadata(
        req_pool_indices=rpi, seq_lens=seq, req_to_token=r2t, cache_seqlens=cache,
        cu_seqlens_k=cu_k, page_table=pt, bs=bs, seqlen_offset=offset, max_seq_pages=m,
        page_size=p, swa_mapping=f2s, swa_page_table=spt, out_cache_loc=loc,
        swa_out_cache_loc=sloc, cu_seqlens_q=cu_q, qlens=qlens, q_stride=q_stride,
        q_mode=q_mode)
    ragged = q_mode == mha_kit.Q_MODE_RAGGED_VERIFY
    want_cache = seq[:bs] + (qlens[:bs] if ragged else offset)
    assert np.array_equal(cache[:bs], want_cache) and np.all(cache[bs:] == -1)
    assert np.array_equal(cu_k[:bs + 1], np.concatenate([[0], np.cumsum(want_cache)]))
    if q_mode == mha_kit.Q_MODE_NONE:
        assert np.all(cu_q == -1)
    elif ragged:
        assert np.array_equal(cu_q[:bs + 1], np.concatenate([[0], np.cumsum(qlens[:bs])]))
    else:
        assert np.array_equal(cu_q[:bs + 1], np.arange(bs + 1) * q_stride)
    want_pt, want_spt = ref.page_table(r2t, rpi[:bs], want_cache, pt[:bs], p, f2s, spt[:bs])
    assert np.array_equal(pt[:bs], want_pt) and np.all(pt[bs:] == -9)
    assert np.array_equal(spt[:bs], want_spt)
    assert np.array_equal(sloc, np.concatenate([f2s[loc], [0, 0]]))


def test_graph_metadata_refuses_cumsum_naming_the_mode():
    with pytest.raises(mha_kit.InvalidArgument, match="q_mode"):
        mha_kit.update_trtllm_mha_graph_metadata(
            req_pool_indices=np.zeros(1, np.int64), seq_lens=np.ones(1, np.int64),
            req_to_token=np.zeros((1, 4), np.int32), cache_seqlens=np.zeros(1, np.int32),
            cu_seqlens_k=np.zeros(2, np.int32), page_table=np.zeros((1, 1), np.int32), bs=1,
            seqlen_offset=0, max_seq_pages=1, page_size=4, q_mode=mha_kit.Q_MODE_CUMSUM,
            qlens=np.ones(1, np.int32), cu_seqlens_q=np.zeros(2, np.int32))


@needs_ml_dtypes
@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("paged", [False, True])
def test_fused_fp8_write_is_bit_exact(dt, paged):
    dtype = _dtype(dt)
    rng = np.random.default_rng(19)
    t, hkv, d, p, slots = 7, 2, 64, 4, 32
    k = (rng.standard_normal((t, hkv, d)) * 300).astype(dtype)
    v = (rng.standard_normal((t, hkv, d)) * 0.01).astype(dtype)
    k[0, 0, :3] = [np.inf, -np.inf, np.nan]
    kc = np.zeros((slots, hkv, d), np.uint8)
    vc = np.zeros((slots, hkv, d), np.uint8)
    loc = np.array([3, 0, 31, 8, 9, 17, 20], np.int64)
    kcv = kc.reshape(slots // p, p, hkv, d) if paged else kc
    vcv = vc.reshape(slots // p, p, hkv, d) if paged else vc
    mha_kit.fused_fp8_set_kv_buffer(k.reshape(t, hkv * d), v, kcv, vcv, loc, k_scale=0.5,
                                    v_scale=None, page_size=p)
    want_k = ref.e4m3_satfinite(k.astype(np.float32), np.float32(1) / np.float32(0.5))
    want_v = ref.e4m3_satfinite(v.astype(np.float32), 1.0)
    assert np.array_equal(kc[loc], want_k)
    assert np.array_equal(vc[loc], want_v)
    untouched = np.setdiff1d(np.arange(slots), loc)
    assert np.all(kc[untouched] == 0)


def test_fp8_write_skips_out_of_pool_slots():
    k = np.ones((2, 1, 64), np.float16)
    kc = np.zeros((8, 1, 64), np.uint8)
    word = _api._kv_write_impl(k, k, kc, kc.copy(), np.array([-1, 8], np.int64), None, None, 4)
    assert word == (2, 3) and np.all(kc == 0)


# ---- argument validation: every error names the argument, shape and dtype ----


def _decode_args(**over):
    rng = np.random.default_rng(1)
    c = ref.random_case(rng, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[1, 1], dtype=np.float16,
                        kv_dtype=np.float16)
    a = dict(query=c["q"], kv_cache=(c["k"], c["v"]), workspace_buffer=_ws(),
             block_tables=c["block_tables"], seq_lens=c["seq_lens"], max_seq_len=64)
    a.update(over)
    return a


BAD_DECODE = [
    ("query", dict(query=np.zeros((2, 4, 96), np.float16)), ["query", "[2, 4, 96]", "float16"]),
    ("query", dict(query=np.zeros((2, 4, 64), np.float32)), ["query", "float32"]),
    ("query", dict(query=np.zeros((2, 64), np.float16)), ["query", "[2, 64]"]),
    ("query", dict(query=np.zeros((2, 64, 4), np.float16).transpose(0, 2, 1)), ["query", "contiguous"]),
    ("query", dict(query=np.zeros((3, 4, 64), np.float16)), ["query", "batch_size"]),
    ("query", dict(query=np.zeros((2, 40, 64), np.float16)), ["query", "group"]),
    ("block_tables", dict(block_tables=np.zeros((2, 4), np.int64)), ["block_tables", "int64"]),
    ("seq_lens", dict(seq_lens=np.zeros(3, np.int32)), ["seq_lens", "[3]"]),
    ("sinks", dict(sinks=np.zeros(3, np.float32)), ["sinks", "[3]"]),
    ("out", dict(out=np.zeros((2, 4, 64), np.float32)), ["out", "float32"]),
    ("window_left", dict(window_left=-2), ["window_left"]),
    ("bmm1_scale", dict(bmm1_scale=float("inf")), ["bmm1_scale"]),
    ("q_len_per_req", dict(q_len_per_req=17), ["q_len_per_req"]),
    ("cum_seq_lens_q", dict(cum_seq_lens_q=np.zeros(3, np.int32)), ["cum_seq_lens_q", "q_len_per_req=None"]),
    ("max_q_len", dict(q_len_per_req=None, cum_seq_lens_q=np.zeros(3, np.int32)), ["max_q_len"]),
    ("kv_layout", dict(kv_layout="NDH"), ["kv_layout"]),
    ("mask", dict(mask=np.zeros(1)), ["mask"]),
    ("block_tables", dict(block_tables=[[1, 2]]), ["block_tables", "list"]),
    ("max_seq_len", dict(max_seq_len=1 << 30), ["max_seq_len", "2^30"]),
    ("k_cache", dict(kv_cache=(np.zeros((4, 2, 16, 32), np.float16),) * 2), ["k_cache", "[4, 2, 16, 32]"]),
]


@pytest.mark.parametrize("arg,over,needles", BAD_DECODE, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_DECODE)])
def test_decode_rejects_bad_arguments_naming_them(arg, over, needles):
    with pytest.raises(mha_kit.InvalidArgument) as e:
        mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(**over))
    msg = str(e.value)
    assert f"`{arg}`" in msg, msg
    for n in needles:
        assert n in msg, msg


UPSTREAM_DECODE_DEFAULTS = dict(
    skip_softmax_threshold_scale_factor=None, kv_cache_sf=None, uses_shared_paged_kv_idx=True,
    lse=None, return_lse=False, bmm1_scale_log2=None, multi_ctas_kv_counter_buffer=None,
    enable_block_sparse_attention=False, bf16q_fp8kv_transform_mode=None)


def test_decode_takes_upstreams_later_keywords():
    """FlashInfer's decode has keywords after ``cum_seq_lens_q`` that callers
    pass at their defaults (SGLang's TRT-LLM MHA backend passes
    ``skip_softmax_threshold_scale_factor`` on every call, vLLM
    ``kv_cache_sf=None``, FlashInfer's own tests all of them): the call must
    take them and give the same result; the ignored ones may be set."""
    a = _decode_args(bmm1_scale=0.125)
    want = mha_kit.trtllm_batch_decode_with_kv_cache(**a)
    got = mha_kit.trtllm_batch_decode_with_kv_cache(**a, **UPSTREAM_DECODE_DEFAULTS)
    assert np.array_equal(got, want)
    got = mha_kit.trtllm_batch_decode_with_kv_cache(
        **a, skip_softmax_threshold_scale_factor=0.5,
        multi_ctas_kv_counter_buffer=np.zeros(1024, np.uint8),
        bf16q_fp8kv_transform_mode="k_only")
    assert np.array_equal(got, want)  # exact attention whatever the threshold


BAD_DECODE_EXTRAS = [
    ("kv_cache_sf", (np.zeros(1, np.uint8), np.zeros(1, np.uint8))),
    ("uses_shared_paged_kv_idx", False),
    ("bmm1_scale_log2", np.zeros(1, np.float32)),
    ("enable_block_sparse_attention", True),
    ("bf16q_fp8kv_transform_mode", "both"),
]


@pytest.mark.parametrize("arg,value", BAD_DECODE_EXTRAS, ids=[b[0] for b in BAD_DECODE_EXTRAS])
def test_decode_rejects_unsupported_upstream_options_naming_them(arg, value):
    with pytest.raises(mha_kit.InvalidArgument, match=f"`{arg}`"):
        mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(**{arg: value}))


def test_context_unsupported_tensor_options_raise_invalid_argument():
    """A tensor passed for a ``None``-only option (``kv_cache_sf``, ``mask``)
    is refused with InvalidArgument naming it, not numpy's "truth value of an
    array is ambiguous" from comparing the array with ``None``."""
    rng = np.random.default_rng(2)
    c = ref.random_case(rng, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[2, 3], dtype=np.float16,
                        kv_dtype=np.float16)
    args = [c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 3, 64, 0.1, 1.0,
            2, c["cu"], None]
    with pytest.raises(mha_kit.InvalidArgument, match="`kv_cache_sf`"):
        mha_kit.trtllm_batch_context_with_kv_cache(
            *args, kv_cache_sf=(np.zeros(1, np.uint8), np.zeros(1, np.uint8)))
    with pytest.raises(mha_kit.InvalidArgument, match="`lse`"):  # a wrong shape
        mha_kit.trtllm_batch_context_with_kv_cache(*args, lse=np.zeros((4, 5), np.float32))
    with pytest.raises(mha_kit.InvalidArgument, match="`mask`"):
        mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(mask=np.zeros((2, 2), bool)))


def test_context_ignores_softmax_skipping_and_counter_buffer():
    """SEMANTICS.md §attention.9: upstream's softmax-skipping threshold is
    accepted and mha-kit computes exact attention; SGLang passes it (from an
    environment variable) on every context call. The counter buffer of
    upstream's multi-CTA mode is accepted and unused."""
    rng = np.random.default_rng(4)
    c = ref.random_case(rng, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[2, 3], dtype=np.float16,
                        kv_dtype=np.float16)
    args = [c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 3, 64, 0.1, 1.0,
            2, c["cu"], None]
    want = mha_kit.trtllm_batch_context_with_kv_cache(*args)
    got = mha_kit.trtllm_batch_context_with_kv_cache(
        *args, skip_softmax_threshold_scale_factor=1e3,
        multi_ctas_kv_counter_buffer=np.zeros(1024, np.uint8))
    assert np.array_equal(got, want)


def test_read_only_output_and_negative_strides_are_rejected():
    a = _decode_args()
    out = np.zeros((2, 4, 64), np.float16)
    out.setflags(write=False)
    with pytest.raises(mha_kit.InvalidArgument, match="read-only"):
        mha_kit.trtllm_batch_decode_with_kv_cache(**a, out=out)
    with pytest.raises(mha_kit.InvalidArgument, match="negative"):
        mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(query=a["query"][::-1]))


def test_context_rejects_mixed_kv_dtype_and_bad_batch_size():
    rng = np.random.default_rng(2)
    c = ref.random_case(rng, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[2, 3], dtype=np.float16,
                        kv_dtype=np.float16)
    args = [c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 3, 64, 0.1, 1.0,
            2, c["cu"], None]
    bad = list(args)
    bad[9] = 3
    with pytest.raises(mha_kit.InvalidArgument, match="batch_size"):
        mha_kit.trtllm_batch_context_with_kv_cache(*bad)
    if ref.BF16 is not None:
        bad = list(args)
        bad[1] = (c["k"].astype(ref.BF16), c["v"].astype(ref.BF16))
        with pytest.raises(mha_kit.InvalidArgument, match="k_cache"):
            mha_kit.trtllm_batch_context_with_kv_cache(*bad)
    with pytest.raises(mha_kit.InvalidArgument, match="causal"):
        mha_kit.trtllm_batch_context_with_kv_cache(*args, causal=False)


def test_helpers_reject_bad_dtypes_and_half_swa_pairs():
    r2t = np.zeros((2, 8), np.int32)
    pt = np.zeros((1, 2), np.int32)
    with pytest.raises(mha_kit.InvalidArgument, match=r"`req_pool_indices`.*int32"):
        mha_kit.build_trtllm_mha_page_table(r2t, np.zeros(1, np.int32), np.ones(1, np.int32), pt, 4)
    with pytest.raises(mha_kit.InvalidArgument, match="swa_page_table"):
        mha_kit.build_trtllm_mha_page_table(r2t, np.zeros(1, np.int64), np.ones(1, np.int32), pt,
                                            4, swa_page_table=pt.copy())
    with pytest.raises(mha_kit.InvalidArgument, match="page_size"):
        mha_kit.build_trtllm_mha_page_table(r2t, np.zeros(1, np.int64), np.ones(1, np.int32), pt, 0)
    k = np.ones((2, 1, 64), np.float16)
    with pytest.raises(mha_kit.InvalidArgument, match="k_cache"):
        mha_kit.fused_fp8_set_kv_buffer(k, k, np.zeros((6, 1, 64), np.uint8),
                                        np.zeros((6, 1, 64), np.uint8), np.zeros(2, np.int64),
                                        page_size=4)
    with pytest.raises(mha_kit.InvalidArgument, match="cache_loc"):
        mha_kit.fused_fp8_set_kv_buffer(k, k, np.zeros((8, 1, 64), np.uint8),
                                        np.zeros((8, 1, 64), np.uint8), np.zeros(2, np.int32),
                                        page_size=4)


def test_native_descriptions_stub_and_probes():
    """The native boundary takes dtype codes or names and any tuple (torch.Size
    is a tuple subclass); the launch stub stops CUDA-described calls after
    validation (the CPU benchmark's path); the probes count native calls."""
    from mha_kit import _native, _tensor

    class Size(tuple):
        pass

    def d(shape, code, dev=0, ptr=1 << 20):
        st, acc = [], 1
        for n in reversed(shape):
            st.append(acc)
            acc *= n
        return (ptr, code, Size(shape), tuple(reversed(st)), dev)

    bf16, i32, u8 = _tensor.BF16, _tensor.I32, "u8"
    args = (d((4, 32, 128), bf16), d((64, 8, 16, 128), bf16), d((64, 8, 16, 128), "bf16"),
            d((16 << 20,), u8), d((4, 16), i32), d((4,), i32), d((4, 32, 128), bf16),
            256, 0.1, 1.0, -1, None, 1, None, None, 0)
    _native._stub_launches(True)
    try:
        _native._timing(True, True)
        assert _native.decode(*args) is None
        bad = list(args)
        bad[5] = d((4,), _tensor.I64)
        with pytest.raises(mha_kit.InvalidArgument, match="seq_lens.*int64"):
            _native.decode(*bad)
        bad[5] = d((4,), 99)
        with pytest.raises(mha_kit.InvalidArgument, match="seq_lens.*unsupported dtype"):
            _native.decode(*bad)
        calls, _, launches, _ = _native._timing(False, True)
        assert (calls, launches) == (3, 0)
    finally:
        _native._stub_launches(False)
    if not mha_kit.gpu_available():
        with pytest.raises(mha_kit.DeviceError):
            _native.decode(*args)


LOG2E = 1.4426950408889634


def _lse_close(got, want_natural, what):
    """``got`` (base 2, float32) against the float64 natural-log LSE."""
    want = want_natural * LOG2E
    inf = np.isinf(want)
    assert np.array_equal(np.isinf(got), inf) and np.all(got[inf] == want[inf]), what
    err = np.abs(got[~inf] - want[~inf])
    assert np.all(err <= 1e-5 * np.maximum(1.0, np.abs(want[~inf]))), (
        f"{what}: worst LSE error {err.max() if err.size else 0}"
    )


@pytest.mark.parametrize("sinks", [False, True])
def test_decode_return_lse_is_base_2_with_sink_once_and_empty_rows(sinks):
    """``return_lse`` (FlashInfer's keyword): ``(out, lse)`` with lse
    ``[num_tokens, Hq]`` float32 in base 2 (FlashInfer's convention for every
    backend), the sink joined once, ``-inf`` for a row that sees no key."""
    rng = np.random.default_rng(21)
    q_lens = [3, 0, 1, 4, 2]
    lens = [20, 5, 17, 33, 1]  # request 4's first row sees no key
    c = ref.random_case(rng, bs=5, hq=8, hkv=2, d=64, p=16, q_lens=q_lens, dtype=np.float16,
                        kv_dtype=np.float16, lens=lens, sinks=sinks, window_left=6)
    out, lse = mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 64,
        bmm1_scale=0.2, window_left=6, sinks=c["sinks"], q_len_per_req=None, max_q_len=4,
        cum_seq_lens_q=c["cu"], return_lse=True)
    want, written, want_lse = ref.attention(c["q"], c["k"], c["v"], c["block_tables"],
                                            c["seq_lens"], c["rows"], 0.2, 1.0, 6, c["sinks"],
                                            with_lse=True)
    assert lse.shape == (10, 8) and lse.dtype == np.float32 and written.all()
    _close(out, want, "f16", "out")
    _lse_close(lse, want_lse, "decode lse")
    assert np.all(np.isneginf(lse[int(c["cu"][4])]))
    # A caller-owned buffer is filled without return_lse, and only `out` returns.
    given = np.full((10, 8), 3.0, np.float32)
    r = mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 64,
        bmm1_scale=0.2, window_left=6, sinks=c["sinks"], q_len_per_req=None, max_q_len=4,
        cum_seq_lens_q=c["cu"], lse=given)
    assert isinstance(r, np.ndarray) and np.array_equal(r, out)
    assert np.array_equal(given, lse)


def test_decode_lse_rejects_a_wrong_shape_or_dtype():
    for bad in (np.zeros((2, 5), np.float32), np.zeros((2, 4), np.float16)):
        with pytest.raises(mha_kit.InvalidArgument, match="`lse`"):
            mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(lse=bad))


@pytest.mark.parametrize("d", [64, 512])
def test_context_return_lse_with_prefix_and_window(d):
    rng = np.random.default_rng(22)
    q_lens = [5, 1, 17, 0, 9]
    lens = [5, 31, 20, 8, 25]
    c = ref.random_case(rng, bs=5, hq=8, hkv=2, d=d, p=8, q_lens=q_lens, dtype=np.float16,
                        kv_dtype=np.float16, lens=lens, sinks=True, window_left=9)
    out, lse = mha_kit.trtllm_batch_context_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], max(q_lens),
        c["max_seq_len"], 0.125, 1.0, 5, c["cu"], None, window_left=9, sinks=c["sinks"],
        return_lse=True)
    want, _, want_lse = ref.attention(c["q"], c["k"], c["v"], c["block_tables"], c["seq_lens"],
                                      c["rows"], 0.125, 1.0, 9, c["sinks"], with_lse=True)
    _close(out, want, "f16", "context out")
    _lse_close(lse, want_lse, "context lse")


def test_max_seq_len_zero_is_only_a_bound():
    """FlashInfer passes ``max_seq_len`` through as a bound; 0 (an engine's
    padded or empty step) must not be an error, and it never limits the keys
    read: the result equals the call with the true bound."""
    a = _decode_args(bmm1_scale=0.125)
    want = mha_kit.trtllm_batch_decode_with_kv_cache(**a)
    got = mha_kit.trtllm_batch_decode_with_kv_cache(**dict(a, max_seq_len=0))
    assert np.array_equal(got, want)
    rng = np.random.default_rng(2)
    c = ref.random_case(rng, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[2, 3], dtype=np.float16,
                        kv_dtype=np.float16)
    args = [c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 3]
    tail = [0.1, 1.0, 2, c["cu"], None]
    assert np.array_equal(mha_kit.trtllm_batch_context_with_kv_cache(*args, 0, *tail),
                          mha_kit.trtllm_batch_context_with_kv_cache(*args, 64, *tail))


@needs_ml_dtypes
@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_fp8_query_uses_its_e4m3_values_into_the_out_dtype(dt):
    """The seed casts the query to e4m3 for an FP8 cache (its context call on
    Hopper, every call on Blackwell) and asks for the model dtype out: the
    logits are ``bmm1_scale · q_e4m3 · k`` with the e4m3 values exact."""
    dtype = _dtype(dt)
    rng = np.random.default_rng(23)
    c = ref.random_case(rng, bs=3, hq=8, hkv=2, d=64, p=16, q_lens=[1, 1, 1], dtype=np.float32,
                        kv_dtype="e4m3", sinks=True)
    q8 = c["q"].astype(ref.E4M3)
    out = mha_kit.trtllm_batch_decode_with_kv_cache(
        q8, (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], c["max_seq_len"],
        bmm1_scale=0.1, bmm2_scale=0.5, sinks=c["sinks"], out_dtype=dtype)
    assert out.dtype == dtype
    want, _ = ref.attention(q8, c["k"], c["v"], c["block_tables"], c["seq_lens"], c["rows"],
                            0.1, 0.5, -1, c["sinks"])
    _close(out, want, dt, "e4m3 query decode")
    # The same values in the out dtype give the same bits.
    same = mha_kit.trtllm_batch_decode_with_kv_cache(
        q8.astype(dtype), (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"],
        c["max_seq_len"], bmm1_scale=0.1, bmm2_scale=0.5, sinks=c["sinks"])
    assert np.array_equal(out.view(np.uint16), same.view(np.uint16))
    ctx = mha_kit.trtllm_batch_context_with_kv_cache(
        q8, (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 1, c["max_seq_len"],
        0.1, 0.5, 3, c["cu"], None, sinks=c["sinks"], out=np.zeros(q8.shape, dtype))
    assert np.array_equal(ctx.view(np.uint16), same.view(np.uint16))


@needs_ml_dtypes
def test_fp8_query_needs_a_16_bit_output_naming_out_dtype():
    rng = np.random.default_rng(24)
    c = ref.random_case(rng, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[1, 1], dtype=np.float32,
                        kv_dtype="e4m3")
    q8 = c["q"].astype(ref.E4M3)
    args = (q8, (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 64)
    with pytest.raises(mha_kit.InvalidArgument, match="`out_dtype`"):
        mha_kit.trtllm_batch_decode_with_kv_cache(*args)
    with pytest.raises(mha_kit.InvalidArgument, match="`out_dtype`"):
        mha_kit.trtllm_batch_decode_with_kv_cache(*args, out_dtype=np.float32)
    with pytest.raises(mha_kit.InvalidArgument, match="`out`"):
        mha_kit.trtllm_batch_decode_with_kv_cache(*args, out=np.zeros(q8.shape, ref.E4M3))


def test_skip_softmax_factor_is_checked_and_the_cpu_path_is_exact():
    """``skip_softmax_threshold_scale_factor``: a finite factor ≥ 0 or None
    (the CPU path computes exact attention whatever the factor); a negative
    or non-finite one raises naming it."""
    a = _decode_args(bmm1_scale=0.125)
    want = mha_kit.trtllm_batch_decode_with_kv_cache(**a)
    for f in (0.0, 0.3, np.float32(2.0)):
        got = mha_kit.trtllm_batch_decode_with_kv_cache(**a, skip_softmax_threshold_scale_factor=f)
        assert np.array_equal(got, want)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(mha_kit.InvalidArgument, match="skip_softmax_threshold_scale_factor"):
            mha_kit.trtllm_batch_decode_with_kv_cache(**a, skip_softmax_threshold_scale_factor=bad)


def test_host_overhead_bench_runs_with_its_stand_in_torch():
    """``bench/host_overhead.py`` (the pre-launch path, launches stubbed) runs
    with its fake ``torch`` in a process where the real one is blocked, and
    prints its four rows (it had silently broken once: an ``out_dtype``
    keyword its stand-in did not take)."""
    import os
    import subprocess
    import sys

    bench = os.path.join(os.path.dirname(__file__), "..", "bench", "host_overhead.py")
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # mha_kit then imports without torch
        "import mha_kit\n"
        "del sys.modules['torch']\n"
        f"sys.argv = [{bench!r}, '--n', '200', '--repeat', '1']\n"
        f"exec(compile(open({bench!r}).read(), {bench!r}, 'exec'), {{'__name__': '__main__'}})\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: float(line.split()[1]) for line in r.stdout.splitlines()
            if line and not line.startswith("#")}
    assert set(rows) == {"public", "python_only", "native", "native_body"}, r.stdout
    assert all(v > 0 for v in rows.values()), rows


def _split_states(rng, t, h, d, k, dtype, sinks=None):
    """Random rows split into ``k`` disjoint key parts: ``(v [t, k, h, d] of
    dtype, s [t, k, h] float32 base 2, want_v, want_s (base 2) of the whole
    row in float64, vmax [t, h])``. Parts with no key hold ``s = -inf`` and
    NaN outputs (never to be read); row 0 has no key in any part."""
    v = np.full((t, k, h, d), np.nan)
    s = np.full((t, k, h), -np.inf)
    want_v = np.zeros((t, h, d))
    want_s = np.full((t, h), -np.inf)
    vmax = np.zeros((t, h))
    for r in range(t):
        for hh in range(h):
            n = 0 if r == 0 else int(rng.integers(1, 40))
            logits = rng.normal(0.0, 3.0, n)
            vals = rng.normal(0.0, 1.0, (n, d))
            part = rng.integers(0, k, n)
            for i in range(k):
                sel = part == i
                if sel.any():
                    m = logits[sel].max()
                    w = np.exp(logits[sel] - m)
                    v[r, i, hh] = (w[:, None] * vals[sel]).sum(0) / w.sum()
                    s[r, i, hh] = (m + np.log(w.sum())) * LOG2E
            if n:
                allv, alll = vals, logits
                if sinks is not None:
                    alll = np.append(logits, sinks[hh])
                    allv = np.vstack([vals, np.zeros((1, d))])
                m = alll.max()
                w = np.exp(alll - m)
                want_v[r, hh] = (w[:, None] * allv).sum(0) / w.sum()
                want_s[r, hh] = (m + np.log(w.sum())) * LOG2E
                vmax[r, hh] = np.abs(vals).max()
    return v.astype(dtype), s.astype(np.float32), want_v, want_s, vmax


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_merge_states_of_a_random_split_equal_the_whole_row(dt, k, with_sinks):
    """FlashInfer's ``merge_states`` (base-2 LSE): the merge of a random
    split of each row's keys (empty parts with NaN outputs, a row with no
    key in any part) equals attention over the whole row; sinks join once
    after the merge; the merged LSE is the whole row's (base 2)."""
    dtype = _dtype(dt)
    rng = np.random.default_rng(100 + k + 10 * with_sinks)
    t, h, d = 7, 3, 64
    sinks = rng.normal(0.0, 2.0, h).astype(np.float32) if with_sinks else None
    v, s, want_v, want_s, vmax = _split_states(rng, t, h, d, k, dtype, sinks)
    got_v, got_s = mha_kit.merge_states(v, s, sinks=sinks)
    assert got_v.shape == (t, h, d) and got_v.dtype == v.dtype
    assert got_s.shape == (t, h) and got_s.dtype == np.float32
    tol = TOL["bf16" if dt == "bf16" else np.float16]
    err = np.abs(got_v.astype(np.float64) - want_v)
    # The parts were rounded to the dtype: a merged value is within the
    # dtype's rounding of the row's largest value (plus its own rounding).
    assert np.all(err <= 2 * tol * vmax[:, :, None] + 1e-6), f"worst {err.max()}"
    assert np.all(got_v[0] == 0) and np.all(np.isneginf(got_s[0])), "a row with no key"
    fin = np.isfinite(want_s)
    assert np.array_equal(np.isfinite(got_s), fin)
    assert np.all(np.abs(got_s[fin] - want_s[fin]) <= 1e-5 * np.maximum(1.0, np.abs(want_s[fin])))


def test_merge_states_takes_an_all_gather_buffer_through_a_transpose():
    """A rank-major ``[K, T, H, D]`` buffer (an all-gather's output) seen as
    ``[T, K, H, D]`` through ``transpose`` merges as its contiguous copy,
    into caller-owned outputs with row strides."""
    rng = np.random.default_rng(7)
    v, s, _, _, _ = _split_states(rng, 5, 2, 64, 3, np.float16)
    gathered_v = np.ascontiguousarray(v.transpose(1, 0, 2, 3))
    gathered_s = np.ascontiguousarray(s.transpose(1, 0, 2))
    want_v, want_s = mha_kit.merge_states(v, s)
    out = np.zeros((5, 4, 64), np.float16)[:, ::2]  # head stride 2·D
    lse = np.zeros((5, 2), np.float32)
    got_v, got_s = mha_kit.merge_states(gathered_v.transpose(1, 0, 2, 3),
                                        gathered_s.transpose(1, 0, 2), out=out, lse_out=lse)
    assert got_v is out and got_s is lse
    assert np.array_equal(out, want_v) and np.array_equal(lse, want_s)


def test_merge_state_of_two_is_merge_states_of_the_pair():
    rng = np.random.default_rng(8)
    v, s, _, _, _ = _split_states(rng, 4, 2, 64, 2, np.float16)
    a = mha_kit.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    b = mha_kit.merge_states(v, s)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_merge_states_nan_lse_makes_the_row_nan():
    v = np.ones((2, 2, 1, 64), np.float16)
    s = np.zeros((2, 2, 1), np.float32)
    s[1, 0, 0] = np.nan
    got_v, got_s = mha_kit.merge_states(v, s)
    assert np.all(got_v[0] == 1) and got_s[0, 0] == 1.0  # log2(2^0 + 2^0)
    assert np.all(np.isnan(got_v[1])) and np.isnan(got_s[1, 0])


@pytest.mark.parametrize("arg, make, needle", [
    ("v", lambda v, s: (v[:, :, :, 0], s), "`v`"),
    ("v", lambda v, s: (v[:, :0], s[:, :0]), "num_states"),
    ("v", lambda v, s: (v[..., :63], s), "even"),
    ("v", lambda v, s: (v.astype(np.float32), s), "`v`"),
    ("s", lambda v, s: (v, s.astype(np.float64)), "`s`"),
    ("s", lambda v, s: (v, s[:, :1]), "`s`"),
])
def test_merge_states_rejects_bad_arguments_naming_them(arg, make, needle):
    v = np.zeros((3, 2, 2, 64), np.float16)
    s = np.zeros((3, 2, 2), np.float32)
    bv, bs = make(v, s)
    with pytest.raises(mha_kit.InvalidArgument, match=needle):
        mha_kit.merge_states(bv, bs)


def test_merge_states_output_checks_name_the_output():
    v = np.zeros((3, 2, 2, 64), np.float16)
    s = np.zeros((3, 2, 2), np.float32)
    with pytest.raises(mha_kit.InvalidArgument, match="`out`"):
        mha_kit.merge_states(v, s, out=np.zeros((3, 2, 64), np.float32))
    with pytest.raises(mha_kit.InvalidArgument, match="`lse_out`"):
        mha_kit.merge_states(v, s, lse_out=np.zeros((3, 3), np.float32))
    with pytest.raises(mha_kit.InvalidArgument, match="`sinks`"):
        mha_kit.merge_states(v, s, sinks=np.zeros(3, np.float32))


DCP_CASES = [
    # name, ranks, q_lens, p, window, sinks, layout, kv
    ("decode-2", 2, [1, 1, 1, 1], 16, -1, False, "HND", "same"),
    ("decode-3-window-sinks", 3, [1, 1, 1], 4, 9, True, "NHD", "same"),
    ("verify-4", 4, [3, 3], 8, -1, True, "HND", "same"),
    ("ragged-2-window", 2, [2, 0, 4, 1], 4, 5, False, "NHD", "same"),
    ("fp8-3", 3, [1, 2], 16, -1, True, "HND", "e4m3"),
]


@pytest.mark.parametrize("case", DCP_CASES, ids=[c[0] for c in DCP_CASES])
def test_dcp_ranks_merged_equal_the_unsplit_decode(case):
    """Decode context parallelism from Python (issue 17): each rank's
    ``trtllm_batch_decode_with_kv_cache(..., dcp_rank=r, dcp_world_size=N,
    return_lse=True)`` over the global tables, pages of the other ranks
    poisoned with NaN (a rank must never read them), stacked as an
    all-gather would and merged by ``merge_states`` with the sinks once,
    equals the unsplit call (uniform and ragged rows, windows, FP8 KV);
    rows a rank saw no key of have ``lse = -inf``."""
    name, n, q_lens, p, window, sinks, layout, kv = case
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    lens = [int(q + rng.integers(0, 6 * p)) for q in q_lens]
    c = ref.random_case(rng, bs=len(q_lens), hq=8, hkv=2, d=64, p=p, q_lens=q_lens,
                        dtype=np.float16, kv_dtype="e4m3" if kv == "e4m3" else np.float16,
                        lens=lens, sinks=sinks, window_left=window, layout=layout)
    ragged = len(set(q_lens)) > 1
    rows = dict(q_len_per_req=None, max_q_len=max(q_lens), cum_seq_lens_q=c["cu"]) if ragged \
        else dict(q_len_per_req=q_lens[0])
    common = dict(bmm1_scale=0.125, window_left=window, kv_layout=layout, **rows)
    want, want_lse = mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], c["max_seq_len"],
        sinks=c["sinks"], return_lse=True, **common)
    outs, lses = [], []
    page_axis = 0
    for r in range(n):
        k, v = c["k"].copy(), c["v"].copy()
        mine = {int(c["block_tables"][b, e]) for b in range(len(q_lens))
                for e in range(r, c["block_tables"].shape[1], n)}
        nan = 0x7F if kv == "e4m3" else np.float16(np.nan)
        for pg in range(k.shape[page_axis]):
            if pg not in mine:
                k[pg] = nan
                v[pg] = nan
        o, lse = mha_kit.trtllm_batch_decode_with_kv_cache(
            c["q"], (k, v), _ws(), c["block_tables"], c["seq_lens"], c["max_seq_len"],
            return_lse=True, dcp_rank=r, dcp_world_size=n, **common)
        outs.append(o)
        lses.append(lse)
    got, got_lse = mha_kit.merge_states(np.stack(outs, 1), np.stack(lses, 1), sinks=c["sinks"])
    assert np.all(np.isfinite(got)), "a rank read another rank's (NaN) page"
    # The partial outputs were rounded to f16 before the merge.
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.all(err <= 4 * 2.0**-10 * (np.abs(want.astype(np.float64)) + 1.0)), err.max()
    fin = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(got_lse), fin)
    assert np.all(np.abs(got_lse[fin] - want_lse[fin]) <= 1e-5 * np.maximum(1.0, np.abs(want_lse[fin])))


def test_dcp_arguments_are_checked_naming_them():
    with pytest.raises(mha_kit.InvalidArgument, match="dcp_rank"):
        mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(dcp_rank=2, dcp_world_size=2))
    with pytest.raises(mha_kit.InvalidArgument, match="dcp_rank"):
        mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(dcp_rank=0, dcp_world_size=0))
    with pytest.raises(mha_kit.InvalidArgument, match="dcp_rank"):
        mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(dcp_rank=-1, dcp_world_size=2))
    with pytest.raises(mha_kit.InvalidArgument, match="`sinks`"):
        mha_kit.trtllm_batch_decode_with_kv_cache(
            **_decode_args(dcp_rank=1, dcp_world_size=2, sinks=np.zeros(4, np.float32)))
    with pytest.raises(mha_kit.InvalidArgument, match="`lse`"):
        mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(dcp_rank=1, dcp_world_size=2))
    # One rank is the unsplit call, bit for bit.
    a = mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args())
    b = mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(dcp_rank=0, dcp_world_size=1))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_set_kv_buffer_copies_rows_and_skips_bad_slots(layout, dt):
    """``set_kv_buffer`` (16-bit caches): each valid slot's rows land bit for
    bit at page ``s // P``, token ``s % P``; slots ``-1`` and ``≥ S`` are
    skipped and counted, never wrapped around to the last page."""
    dtype = _dtype(dt)
    rng = np.random.default_rng(5)
    pages, hkv, p, d = 5, 2, 4, 64
    shape = (pages, hkv, p, d) if layout == "HND" else (pages, p, hkv, d)
    k_cache = rng.standard_normal(shape).astype(dtype)
    v_cache = rng.standard_normal(shape).astype(dtype)
    loc = np.array([3, -1, 17, 20, 0, 19, -5], np.int64)
    k = rng.standard_normal((len(loc), hkv, d)).astype(dtype)
    v = rng.standard_normal((len(loc), hkv * d)).astype(dtype)  # [T, Hkv·D] also works
    want_k, want_v = k_cache.copy(), v_cache.copy()
    for t, s in enumerate(loc):
        if 0 <= s < pages * p:
            if layout == "HND":
                want_k[s // p, :, s % p] = k[t]
                want_v[s // p, :, s % p] = v[t].reshape(hkv, d)
            else:
                want_k[s // p, s % p] = k[t]
                want_v[s // p, s % p] = v[t].reshape(hkv, d)
    word = _api._set_kv_impl(k, v, k_cache, v_cache, loc, layout)
    assert word[0] == 3, word  # -1, 20, -5
    assert np.array_equal(k_cache.view(np.uint16), want_k.view(np.uint16))
    assert np.array_equal(v_cache.view(np.uint16), want_v.view(np.uint16))
    with pytest.raises(mha_kit.InvalidArgument, match="`k`"):
        mha_kit.set_kv_buffer(k.astype(np.float32), v, k_cache, v_cache, loc, layout)
    with pytest.raises(mha_kit.InvalidArgument, match="`cache_loc`"):
        mha_kit.set_kv_buffer(k, v, k_cache, v_cache, loc.astype(np.int32), layout)


def test_dcp_ranks_error_words_add_up_to_the_unsplit_call():
    """A negative length is counted by rank 0 only (the per-request checks)
    and a bad page by the rank that holds it: the ranks' error counts add up
    to the unsplit call's."""
    rng = np.random.default_rng(3)
    c = ref.random_case(rng, bs=3, hq=4, hkv=2, d=64, p=4, q_lens=[1, 1, 1], dtype=np.float16,
                        kv_dtype=np.float16, lens=[9, 6, 11])
    seq = c["seq_lens"].copy()
    seq[1] = -3
    bt = c["block_tables"].copy()
    bt[2, 1] = 10_000  # page 1 of request 2: rank 1 of 2 holds it

    def word(dcp, lse):
        out = np.zeros_like(c["q"])
        return _api._decode_impl(c["q"], c["k"], c["v"], _ws(), bt, seq, out, 16, 0.125, 1.0,
                                 -1, None, 1, None, None, "HND", lse, None, dcp)

    whole = word(None, None)
    lse = np.zeros((3, 4), np.float32)
    parts = [word((r, 2), lse) for r in range(2)]
    assert whole[0] == 2, whole
    assert [p[0] for p in parts] == [1, 1], parts


def test_write_decode_unit_order_is_the_length_order():
    """``write_decode_unit_order`` on host arrays: descending length bucket
    (``ceil(len / 128)``, capped at 255, lengths ≤ 0 in bucket 0), ties by
    index; into a given array or a new one; an empty batch."""
    rng = np.random.default_rng(7)
    for bs in (0, 1, 2, 5, 300):
        lens = rng.integers(-3, 40000, bs).astype(np.int32)
        if bs >= 5:
            lens[:3] = [0, 128, 129]  # bucket edges; ties by index
            lens[3:5] = [33000, 40000]  # both past the capped bucket
        want = ref.unit_order(lens)
        got = mha_kit.write_decode_unit_order(lens)
        assert got.dtype == np.int32 and np.array_equal(got, want), (bs, got, want)
        into = np.full(bs, -7, np.int32)
        assert mha_kit.write_decode_unit_order(lens, into) is into
        assert np.array_equal(into, want)
    assert np.array_equal(mha_kit.write_decode_unit_order(np.array([5, 300, 300, 1], np.int32)),
                          [1, 2, 0, 3])


def test_unit_order_arguments_are_checked_and_the_cpu_decode_ignores_the_order():
    """The decode call's ``unit_order``: ``[bs]`` int32, contiguous (named
    when not); the CPU path gives the same bits with any order. The writer
    names a bad ``seq_lens`` / ``unit_order``."""
    a = _decode_args()
    want = mha_kit.trtllm_batch_decode_with_kv_cache(**a)
    for order in ([0, 1], [1, 0]):
        got = mha_kit.trtllm_batch_decode_with_kv_cache(**a, unit_order=np.array(order, np.int32))
        assert np.array_equal(got, want)
    for bad, needle in ((np.zeros(3, np.int32), "[3]"), (np.zeros(2, np.int64), "int64"),
                        (np.zeros((2, 1), np.int32), "unit_order"),
                        (np.zeros(4, np.int32)[::2], "contiguous")):
        with pytest.raises(mha_kit.InvalidArgument, match="unit_order") as e:
            mha_kit.trtllm_batch_decode_with_kv_cache(**_decode_args(unit_order=bad))
        assert needle in str(e.value), str(e.value)
    with pytest.raises(mha_kit.InvalidArgument, match="seq_lens"):
        mha_kit.write_decode_unit_order(np.zeros(3, np.int64))
    with pytest.raises(mha_kit.InvalidArgument, match="unit_order"):
        mha_kit.write_decode_unit_order(np.zeros(3, np.int32), np.zeros(2, np.int32))
    with pytest.raises(mha_kit.InvalidArgument, match="unit_order"):
        mha_kit.write_decode_unit_order(np.zeros(3, np.int32), np.zeros(3, np.float32))
