"""Scenarios taken from public bug reports against SGLang, FlashInfer, vLLM and
TensorRT-LLM (CPU path, numpy arrays).

Each test names the report it comes from and restates, in our own words,
the behaviour the maintainers settled on; the expected values come from the
plain float64 definitions of ``reference.py`` (or from first principles),
never from mha_kit's own output. The metadata, FP8, backend and
argument-checking scenarios are in ``test_upstream_reports_meta.py``.
"""

import math
import mmap

import numpy as np
import pytest

import mha_kit
from mha_kit import _api

import reference as ref

LOG2E = 1.4426950408889634
F16_TOL = 2.0 ** -10


def _ws():
    return np.zeros(1 << 16, dtype=np.uint8)


def _close(got, want, tol=F16_TOL, what=""):
    got = np.asarray(got).astype(np.float64)
    err = np.abs(got - want)
    bound = tol * np.abs(want) + 1e-6
    assert np.all(err <= bound), f"{what}: max err {err.max():.3g}"


def _case(seed, **kw):
    kw.setdefault("dtype", np.float16)
    kw.setdefault("kv_dtype", kw["dtype"])
    return ref.random_case(np.random.default_rng(seed), **kw)


def _decode(c, **kw):
    kw.setdefault("bmm1_scale", 0.125)
    return mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"],
        kw.pop("max_seq_len", c["max_seq_len"]), **kw)


def _want(c, bmm1=0.125, bmm2=1.0, window=-1, sinks=None, with_lse=False, k=None, v=None):
    return ref.attention(c["q"], c["k"] if k is None else k, c["v"] if v is None else v,
                         c["block_tables"], c["seq_lens"], c["rows"], bmm1, bmm2, window,
                         sinks, with_lse=with_lse)


def test_decode_rows_with_seq_len_zero_are_the_empty_state():
    """flashinfer-ai/flashinfer#4975 (and the SGLang work-around it cites,
    sgl-project/sglang#22688): a decode row whose request has ``seq_lens == 0``
    was left untouched by the kernel, so whatever the output buffer held (NaN
    from ``torch.empty``) leaked into a later ``merge_state``. The fix writes
    the identity of an empty attention: output 0 and LSE ``-inf``.
    https://github.com/flashinfer-ai/flashinfer/pull/4975"""
    c = _case(1, bs=4, hq=8, hkv=2, d=64, p=16, q_lens=[1] * 4, lens=[5, 0, 17, 0])
    out = np.full_like(c["q"], np.nan)
    got, lse = _decode(c, out=out, return_lse=True)
    want, _, want_lse = _want(c, with_lse=True)
    assert got is out and not np.isnan(got).any()
    assert np.all(got[[1, 3]] == 0)
    assert np.all(np.isneginf(lse[[1, 3]]))
    _close(got[[0, 2]], want[[0, 2]], what="live rows")
    np.testing.assert_allclose(lse[[0, 2]], want_lse[[0, 2]] * LOG2E, rtol=1e-5, atol=1e-5)


def test_graph_padding_rows_with_zero_lengths_and_null_pages_write_no_nan():
    """flashinfer-ai/flashinfer#2883 and vllm-project/vllm#57094: a CUDA-graph
    bucket of 8 replayed for 5 requests pads rows 5..7 with ``seq_lens = 0``
    and a null / garbage block-table row; the kernel wrote NaN (0 / 0) into
    those rows, which then poisoned per-tensor activation scales of the
    whole batch. Padding rows must come out finite (here: the empty state)
    and the real rows exact.
    https://github.com/flashinfer-ai/flashinfer/issues/2883"""
    lens = [9, 33, 1, 16, 40, 0, 0, 0]
    c = _case(2, bs=8, hq=8, hkv=1, d=128, p=16, q_lens=[1] * 8, lens=lens)
    bt = c["block_tables"].copy()
    bt[5:] = -1
    bt[6, 0] = 2**31 - 1
    c["block_tables"] = bt
    got = _decode(c, out=np.full_like(c["q"], np.nan), max_seq_len=1 << 16)
    assert np.isfinite(got.astype(np.float64)).all()
    assert np.all(got[5:] == 0)
    want, _ = _want(c)
    _close(got[:5], want[:5], what="real rows")


def test_output_does_not_depend_on_the_host_max_seq_len():
    """flashinfer-ai/flashinfer#4647: ``max_seq_len`` is documented as a bound
    but changed the split plan and with it the bits of the output, so eager
    and full-CUDA-graph runs (which bake in ``max_model_len``) differed.
    mha-kit treats it as a schedule hint only: any value, even one below the
    real lengths, gives the same bits, and every length is read whole.
    https://github.com/flashinfer-ai/flashinfer/issues/4647"""
    c = _case(3, bs=3, hq=8, hkv=2, d=64, p=16, q_lens=[2] * 3, lens=[253, 20, 97])
    outs = [_decode(c, max_seq_len=m, q_len_per_req=2) for m in (253, 1, 0, 128, 131072)]
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    want, _ = _want(c)
    _close(outs[0], want, what="max_seq_len 253")


def test_merge_state_of_two_empty_states_is_empty_not_nan():
    """flashinfer-ai/flashinfer#4051 (also vllm-project/vllm#39148 for the
    Triton merge): merging two empty states ``(0, -inf)`` computed
    ``exp2(-inf - -inf) = NaN`` and returned NaN for both V and S. The
    union of empty states must stay empty, and an empty part must never be
    read (its V may hold anything), so merging with it is the identity.
    https://github.com/flashinfer-ai/flashinfer/issues/4051"""
    rng = np.random.default_rng(4)
    va = rng.standard_normal((3, 4, 64)).astype(np.float16)
    sa = rng.normal(0, 4, (3, 4)).astype(np.float32)
    sa[0] = -np.inf
    garbage = np.full_like(va, np.nan)
    empty = np.full_like(sa, -np.inf)
    v, s = mha_kit.merge_state(garbage, empty, garbage.copy(), empty.copy())
    assert np.all(v == 0) and np.all(np.isneginf(s))
    v, s = mha_kit.merge_state(va, sa, garbage, empty)
    assert np.array_equal(v[1:], va[1:]) and np.array_equal(s[1:], sa[1:])
    assert np.all(v[0] == 0) and np.all(np.isneginf(s[0]))
    v, s = mha_kit.merge_state(garbage, empty, va, sa)
    assert np.array_equal(v[1:], va[1:]) and np.array_equal(s[1:], sa[1:])


def test_split_kv_decode_merged_with_base_2_lse_equals_the_whole_row():
    """sgl-project/sglang#40903 and vllm-project/vllm#47079: FlashInfer's
    attention returns its LSE in base 2, and feeding it to a merge that
    assumes the natural log re-weighted the parts wrongly (errors growing
    with the prefix). mha-kit's ``return_lse`` and ``merge_state`` must agree:
    attention over the first pages and over the rest, merged, is attention
    over all the keys (output and base-2 LSE).
    https://github.com/sgl-project/sglang/issues/40903"""
    p = 16
    c = _case(5, bs=2, hq=8, hkv=2, d=64, p=p, q_lens=[1, 1], lens=[80, 41])
    cut = [3, 1]  # pages in the first part
    parts = []
    for first in (True, False):
        bt = np.zeros_like(c["block_tables"])
        lens = np.zeros(2, np.int32)
        for b in range(2):
            n = cut[b] if first else -(-int(c["seq_lens"][b]) // p) - cut[b]
            lo = 0 if first else cut[b]
            src = c["block_tables"][b, lo:lo + n]
            bt[b, :n] = src
            lens[b] = cut[b] * p if first else int(c["seq_lens"][b]) - cut[b] * p
        parts.append(mha_kit.trtllm_batch_decode_with_kv_cache(
            c["q"], (c["k"], c["v"]), _ws(), bt, lens, 80, bmm1_scale=0.3, return_lse=True))
    (va, sa), (vb, sb) = parts
    v, s = mha_kit.merge_state(va, sa, vb, sb)
    want, _, want_lse = _want(c, bmm1=0.3, with_lse=True)
    # Each part was rounded to float16 before the merge: compare at that precision.
    np.testing.assert_allclose(v.astype(np.float64), want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(s, want_lse * LOG2E, rtol=1e-5, atol=1e-5)
    # The natural-log reading of the same LSE gives a measurably different row.
    w = 1.0 / (1.0 + np.exp(sb.astype(np.float64) - sa))
    wrong = w[..., None] * va + (1 - w[..., None]) * vb
    assert np.abs(wrong - want).max() > 5e-2


def test_non_finite_kv_past_seq_len_and_outside_the_window_never_leaks():
    """vllm-project/vllm#47305 (K/V read past ``seq_len`` in the last block)
    and vllm-project/vllm#30887 (V blocks outside the sliding window): masked
    keys got weight 0, but ``0 · NaN = NaN`` still poisoned the output, with
    recycled blocks holding NaN. Masked keys must be dropped, not zero
    weighted, whatever their bytes.
    https://github.com/vllm-project/vllm/pull/47305"""
    p, w = 16, 5
    c = _case(6, bs=3, hq=8, hkv=2, d=64, p=p, q_lens=[1, 2, 1], lens=[5, 20, 33],
              extra_pages=4)
    k, v = c["k"].copy(), c["v"].copy()
    bt = c["block_tables"]
    for b, length in enumerate(c["seq_lens"]):
        for pos in range(bt.shape[1] * p):
            outside = pos >= length or pos < length - 2 - w
            if outside:
                k[bt[b, pos // p], :, pos % p] = np.nan
                v[bt[b, pos // p], :, pos % p] = np.inf
    got = mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (k, v), _ws(), bt, c["seq_lens"], 64, bmm1_scale=0.125, window_left=w,
        q_len_per_req=None, max_q_len=2, cum_seq_lens_q=c["cu"])
    want, _ = _want(c, window=w)
    assert np.isfinite(got.astype(np.float64)).all()
    _close(got, want, what="decode")
    cu_k = np.concatenate([[0], np.cumsum(c["seq_lens"])]).astype(np.int32)
    got = mha_kit.trtllm_batch_context_with_kv_cache(
        c["q"], (k, v), _ws(), bt, c["seq_lens"], 2, 64, 0.125, 1.0, 3, c["cu"], cu_k,
        window_left=w)
    _close(got, want, what="context")


def test_strided_query_view_is_read_through_its_strides():
    """sgl-project/sglang#31667: Q sliced out of a fused QKV projection had
    row stride 6144 instead of the packed 4096, and a kernel that indexed Q
    as packed rows read later requests from the wrong offsets. A query with
    any row / head strides (last dim contiguous) must give the same result
    as its packed copy.
    https://github.com/sgl-project/sglang/pull/31667"""
    c = _case(7, bs=4, hq=8, hkv=2, d=128, p=16, q_lens=[1] * 4)
    qkv = np.zeros((4, 12, 128), np.float16)
    qkv[:, :8] = c["q"]
    view = qkv[:, :8]
    assert view.strides[0] == 12 * 128 * 2
    got = mha_kit.trtllm_batch_decode_with_kv_cache(
        view, (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 64, bmm1_scale=0.09)
    want, _ = _want(c, bmm1=0.09)
    _close(got, want, what="strided q")
    heads = np.zeros((4, 16, 128), np.float16)
    heads[:, ::2] = c["q"]  # a head stride of 2·D
    got = mha_kit.trtllm_batch_decode_with_kv_cache(
        heads[:, ::2], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 64,
        bmm1_scale=0.09)
    _close(got, want, what="head-strided q")


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_one_kv_tensor_and_interleaved_page_strides(layout):
    """vllm-project/vllm#34158 and ROCm/aiter#3498: a KV cache stored as
    ``[num_blocks, 2, ...]`` (K and V of a block side by side, or blocks of
    several layers interleaved) gives K / V views whose page stride is twice
    the packed one; a kernel that rebuilt the page stride from the shape read
    across K and V. FlashInfer's single-tensor form and strided views must
    both give the unpacked result, in either layout.
    https://github.com/vllm-project/vllm/pull/34158"""
    c = _case(8, bs=3, hq=8, hkv=2, d=64, p=8, q_lens=[2] * 3, layout=layout)
    kv = np.stack([c["k"], c["v"]], axis=1)  # [pages, 2, ...]
    want, _ = _want(c, k=ref.hnd(c["k"], layout), v=ref.hnd(c["v"], layout))
    for cache in (kv, (kv[:, 0], kv[:, 1])):
        got = mha_kit.trtllm_batch_decode_with_kv_cache(
            c["q"], cache, _ws(), c["block_tables"], c["seq_lens"], 64, bmm1_scale=0.125,
            kv_layout=layout, q_len_per_req=2)
        _close(got, want, what=f"{layout} decode")
    cu_k = np.concatenate([[0], np.cumsum(c["seq_lens"])]).astype(np.int32)
    got = mha_kit.trtllm_batch_context_with_kv_cache(
        c["q"], kv, _ws(), c["block_tables"], c["seq_lens"], 2, 64, 0.125, 1.0, 3, c["cu"],
        cu_k, kv_layout=layout)
    _close(got, want, what=f"{layout} context")


def _lazy_zeros(shape, dtype):
    """A zero array backed by an anonymous lazily-committed mapping (only the
    pages written or read cost memory); skips when the host refuses it."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    try:
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                      | getattr(mmap, "MAP_NORESERVE", 0))
    except (OSError, ValueError, OverflowError) as e:
        pytest.skip(f"no {n >> 30} GiB lazy mapping here: {e}")
    return np.frombuffer(m, dtype=dtype).reshape(shape)


def test_page_ids_past_the_int32_element_offset():
    """flashinfer-ai/flashinfer#3136 (MLA), vllm-project/vllm#47671 and
    vllm-project/vllm#1514: ``page_id · page_stride`` was computed in 32 bits
    and wrapped once a pool held more than 2^31 elements, reading the wrong
    page (zeros, garbage or an illegal access). A page whose first element
    sits at offset ≥ 2^31 must be read exactly.
    https://github.com/flashinfer-ai/flashinfer/pull/3136"""
    p, hkv, d = 16, 8, 256
    per_page = p * hkv * d
    pages = (1 << 31) // per_page + 2
    kv = _lazy_zeros((pages, 1, hkv, p, d), np.float16)  # K = V (a 1 in dim 1)
    hi = pages - 1
    assert hi * per_page >= 1 << 31
    rng = np.random.default_rng(9)
    kv[hi, 0] = rng.standard_normal((hkv, p, d)).astype(np.float16)
    q = rng.standard_normal((2, 16, d)).astype(np.float16)
    bt = np.array([[hi], [hi]], np.int32)
    lens = np.array([p, 5], np.int32)
    got = mha_kit.trtllm_batch_decode_with_kv_cache(q, kv, _ws(), bt, lens, p, bmm1_scale=1 / 16)
    small = np.ascontiguousarray(kv[hi:hi + 1, 0])
    want, _ = ref.attention(q, small, small, np.zeros((2, 1), np.int32), lens, [(0, 1), (1, 1)],
                            1 / 16, 1.0, -1, None)
    _close(got, want, what="page past 2^31 elements")


def test_sinks_are_float32_per_head_and_join_windowed_rows():
    """sgl-project/sglang#9161 (gpt-oss on trtllm_mha): the TRT-LLM kernels
    read the sink logits as float32, so the model has to keep them float32
    for this backend; bf16 sinks reinterpreted as float32 are garbage. A
    16-bit sinks tensor must be refused naming ``sinks``, and float32 sinks
    (one per query head, in score units) join each windowed row's
    denominator once (sgl-project/sglang#11634: sinks with a sliding window).
    https://github.com/sgl-project/sglang/pull/9161"""
    c = _case(10, bs=3, hq=8, hkv=2, d=64, p=16, q_lens=[3, 1, 2], lens=[40, 1, 130],
              sinks=True)
    w = 7  # gpt-oss style: HF window 8 → window_left 7
    kw = dict(window_left=w, q_len_per_req=None, max_q_len=3, cum_seq_lens_q=c["cu"])
    got = _decode(c, sinks=c["sinks"], **kw)
    want, _ = _want(c, window=w, sinks=c["sinks"])
    _close(got, want, what="sinks + window")
    # The sinks take weight: without them the rows differ.
    no_sink, _ = _want(c, window=w)
    assert np.abs(want - no_sink).max() > 1e-2
    for bad in (c["sinks"].astype(np.float16), c["sinks"].astype(ref.BF16 or np.float16)):
        with pytest.raises(mha_kit.InvalidArgument, match="sinks"):
            _decode(c, sinks=bad, **kw)
    with pytest.raises(mha_kit.InvalidArgument, match="sinks"):
        _decode(c, sinks=c["sinks"][:2], **kw)


def test_one_element_scale_tensors_equal_float_scales():
    """flashinfer-ai/flashinfer#2084: ``bmm1_scale`` / ``bmm2_scale`` became
    ``float | Tensor`` (a one-element tensor, in natural-log units like the
    float). A one-element host array must give exactly the float's result;
    a scale with more than one element is an argument error, not a silent
    read of its first entry.
    https://github.com/flashinfer-ai/flashinfer/pull/2084"""
    c = _case(11, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[1, 1])
    base = _decode(c, bmm1_scale=0.2, bmm2_scale=1.5)
    for s1, s2 in [(np.array([0.2], np.float64), np.array([1.5], np.float32)),
                   (np.float64(0.2), np.array(1.5, np.float32))]:
        assert np.array_equal(_decode(c, bmm1_scale=s1, bmm2_scale=s2), base)
    want, _ = _want(c, bmm1=0.2, bmm2=1.5)
    _close(base, want, what="scales")
    with pytest.raises(mha_kit.InvalidArgument, match="bmm1_scale"):
        _decode(c, bmm1_scale=np.array([0.2, 0.2], np.float32))
    ctx = mha_kit.trtllm_batch_context_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 1, 64,
        np.array([0.2]), np.array([1.5]), 2, c["cu"],
        np.concatenate([[0], np.cumsum(c["seq_lens"])]).astype(np.int32))
    _close(ctx, want, what="context scales")


def _onehot_case(length, p=4):
    """One request whose key k has V = e_k and K = 0 (all logits equal): a
    row's output is the uniform average of the one-hot rows it sees."""
    d = 64
    pages = -(-length // p)
    k = np.zeros((pages, 1, p, d), np.float16)
    v = np.zeros((pages, 1, p, d), np.float16)
    for pos in range(length):
        v[pos // p, 0, pos % p, pos] = 1.0
    return k, v, np.arange(pages, dtype=np.int32)[None], d


@pytest.mark.parametrize("w", [0, 1, 5, 11, 40])
def test_window_left_sees_exactly_w_plus_one_keys(w):
    """sgl-project/sglang#32087 and lightseekorg/tokenspeed#578: backends
    disagreed by one key on what ``window_left`` covers (one dropped the
    oldest in-window key). FlashInfer's rule: the query at position ``x``
    sees keys ``[x - window_left, x]``, i.e. ``window_left + 1`` keys (all of
    ``[0, x]`` when that is shorter); checked on decode, verify and context
    rows with one-hot values, so the visible set is read off the output.
    https://github.com/sgl-project/sglang/pull/32087"""
    length, n = 30, 3
    k, v, bt, d = _onehot_case(length)
    q = np.zeros((n, 2, d), np.float16)
    lens = np.array([length], np.int32)
    outs = [
        mha_kit.trtllm_batch_decode_with_kv_cache(q, (k, v), _ws(), bt, lens, length,
                                                  window_left=w, q_len_per_req=n),
        mha_kit.trtllm_batch_context_with_kv_cache(
            q, (k, v), _ws(), bt, lens, n, length, 1.0, 1.0, 1,
            np.array([0, n], np.int32), np.array([0, length], np.int32), window_left=w),
    ]
    for out in outs:
        for j in range(n):
            x = length - n + j
            seen = np.arange(max(0, x - w), x + 1)
            want = np.zeros(d)
            want[seen] = 1.0 / len(seen)
            _close(out[j, 0], want, what=f"row at {x}")
            assert np.count_nonzero(out[j, 1]) == len(seen)


def test_parallel_verify_rows_equal_sequential_decodes_gqa():
    """vllm-project/vllm-ascend#15329 and ggml-org/llama.cpp#25618: the
    speculative verify pass (several query rows per request) disagreed with
    the same tokens decoded one at a time, a GQA packing path treating the
    rows as one token. Verify row ``j`` of a request with ``L`` keys and ``n``
    rows must equal a decode over the first ``L - n + j + 1`` keys, for every
    query head of a GQA group (head ``h`` reads KV head ``h // G``).
    https://github.com/vllm-project/vllm-ascend/issues/15329"""
    n = 4
    c = _case(12, bs=2, hq=16, hkv=2, d=128, p=16, q_lens=[n, n], lens=[37, 16],
              dtype=ref.BF16 or np.float16)
    verify = _decode(c, q_len_per_req=n, window_left=9)
    for j in range(n):
        lens = (c["seq_lens"] - n + j + 1).astype(np.int32)
        one = mha_kit.trtllm_batch_decode_with_kv_cache(
            np.ascontiguousarray(c["q"][j::n]), (c["k"], c["v"]), _ws(), c["block_tables"],
            lens, 64, bmm1_scale=0.125, window_left=9)
        assert np.array_equal(verify[j::n], one), f"row {j}"
    want, _ = _want(c, window=9)
    _close(verify, want, tol=2.0 ** -7, what="verify")
    # KV head 1 changed: only query heads 8..15 (group 1 of G = 8) move.
    k2 = c["k"].copy()
    k2[:, 1] = -k2[:, 1]
    moved = mha_kit.trtllm_batch_decode_with_kv_cache(
        c["q"], (k2, c["v"]), _ws(), c["block_tables"], c["seq_lens"], 64, bmm1_scale=0.125,
        q_len_per_req=n, window_left=9)
    assert np.array_equal(moved[:, :8], verify[:, :8])
    assert not np.array_equal(moved[:, 8:], verify[:, 8:])


def test_context_with_empty_requests_and_prefix_keys():
    """vllm-project/vllm#39148 (chunked prefill with zero context length on
    both sides) and flashinfer-ai/flashinfer#4975 again, for the context
    kernel: requests with no new rows or no keys in a packed prefill batch
    must neither disturb the others nor produce NaN, and rows of a request
    with a cached prefix sit at ``prefix + j``.
    https://github.com/vllm-project/vllm/pull/39148"""
    c = _case(13, bs=5, hq=4, hkv=2, d=64, p=16, q_lens=[3, 0, 5, 0, 2], lens=[10, 7, 5, 0, 2])
    cu_k = np.concatenate([[0], np.cumsum(c["seq_lens"])]).astype(np.int32)
    out = np.full_like(c["q"], np.nan)
    got, lse = mha_kit.trtllm_batch_context_with_kv_cache(
        c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 5, 10, 0.125, 1.0,
        5, c["cu"], cu_k, out=out, return_lse=True)
    want, written, want_lse = _want(c, with_lse=True)
    assert written.all() and not np.isnan(got).any()
    _close(got, want, what="context")
    np.testing.assert_allclose(lse, want_lse * LOG2E, rtol=1e-5, atol=1e-5)


def test_decode_max_q_len_and_row_offsets_checked_on_the_host():
    """flashinfer-ai/flashinfer#3238 (``cum_seq_lens_q`` support): a ragged
    query layout needs ``max_q_len`` and an offsets vector of ``bs + 1``; a
    call with ``q_len_per_req=None`` and no ``max_q_len`` must be an argument
    error, and a request longer than ``max_q_len`` is skipped (rows left as
    they were) and counted, never read past.
    https://github.com/flashinfer-ai/flashinfer/pull/3238"""
    c = _case(14, bs=2, hq=4, hkv=4, d=64, p=16, q_lens=[2, 3])
    with pytest.raises(mha_kit.InvalidArgument, match="max_q_len"):
        _decode(c, q_len_per_req=None, cum_seq_lens_q=c["cu"])
    with pytest.raises(mha_kit.InvalidArgument, match="cum_seq_lens_q"):
        _decode(c, q_len_per_req=None, max_q_len=3, cum_seq_lens_q=c["cu"][:2])
    out = np.full_like(c["q"], 5)
    word = _api._decode_impl(c["q"], c["k"], c["v"], _ws(), c["block_tables"], c["seq_lens"],
                             out, 64, 0.125, 1.0, -1, None, None, 2, c["cu"], "HND")
    assert word[0] == 1 and np.all(out[2:] == 5)
    want, _ = _want(c)
    _close(out[:2], want[:2], what="first request")


def test_sm_scale_applies_in_natural_log_units():
    """flashinfer-ai/flashinfer#3500: the trtllm-gen wrapper converts
    ``bmm1_scale`` to log2 units itself (``· log2 e``), so callers pass the
    natural-log scale ``q_scale · k_scale · sm_scale``; passing a pre-converted
    value would double the factor. Two keys whose logits differ by ``Δ`` must
    weigh ``1 : e^Δ`` (not ``2^Δ``) at ``bmm1_scale = 1``.
    https://github.com/flashinfer-ai/flashinfer/issues/3500"""
    d = 64
    k = np.zeros((1, 1, 4, d), np.float16)
    v = np.zeros((1, 1, 4, d), np.float16)
    k[0, 0, 1, 0] = 1.0  # logit of key 1 is q[0]
    v[0, 0, 0, 0] = 1.0
    v[0, 0, 1, 1] = 1.0
    q = np.zeros((1, 1, d), np.float16)
    q[0, 0, 0] = 1.5
    out, lse = mha_kit.trtllm_batch_decode_with_kv_cache(
        q, (k, v), _ws(), np.zeros((1, 1), np.int32), np.array([2], np.int32), 2,
        bmm1_scale=1.0, return_lse=True)
    w1 = math.exp(1.5) / (1 + math.exp(1.5))
    _close(out[0, 0, :2], np.array([1 - w1, w1]), what="weights")
    assert abs(float(lse[0, 0]) - math.log2(1 + math.exp(1.5))) < 1e-5
