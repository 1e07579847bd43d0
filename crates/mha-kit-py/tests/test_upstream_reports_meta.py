"""Scenarios from public SGLang / TensorRT-LLM reports about the metadata
builders, FP8 KV scales, the backend and host argument checking (CPU path);
the attention scenarios are in ``test_upstream_reports.py``. Expected values
come from the float64 definitions of ``reference.py`` or from first
principles, never from mha_kit's own output."""

import math

import numpy as np
import pytest

import mha_kit
from mha_kit import _api
from mha_kit import backend as mb

import reference as ref
from test_backend import Engine, P, WIDTH, _prefill

needs_e4m3 = pytest.mark.skipif(ref.E4M3 is None, reason="ml_dtypes not installed")


def _ws():
    return np.zeros(1 << 16, dtype=np.uint8)


def _graph(r2t, rpi, seq, m, p, offset=0, **kw):
    """One fused metadata launch into fresh poisoned buffers: (error word, buffers)."""
    bs = len(rpi)
    out = dict(cache_seqlens=np.full(bs, -9, np.int32), cu_seqlens_k=np.full(bs + 1, -9, np.int32),
               page_table=np.full((bs, m + 2), -9, np.int32))
    word = _api._graph_impl(np.asarray(rpi, np.int64), np.asarray(seq, np.int64), r2t,
                            out["cache_seqlens"], out["cu_seqlens_k"], out["page_table"], bs,
                            offset, m, p, None, None, None, None, kw.get("cu_seqlens_q"), None,
                            kw.get("q_stride", 0), kw.get("q_mode", _api.Q_MODE_NONE))
    return word, out


def test_draft_decode_graph_capture_sees_the_real_lengths():
    """sgl-project/sglang#26521: the TRT-LLM MHA backend's draft-decode
    capture re-used a zeroed ``cache_seqlens`` buffer without copying the
    batch's ``seq_lens`` into it, so warm-up attention ran over empty KV and
    produced NaN. Every draft step ``i`` of a captured bucket must see
    ``seq_lens + i + 1`` keys (padding rows included: ``1 + i + 1``), and its
    layers must give the eager outputs.
    https://github.com/sgl-project/sglang/pull/26521"""
    rng = np.random.default_rng(31)
    e = Engine(rng)
    lens = [5, 9]
    rows = _prefill(e, lens)
    graph = mb.TrtllmMhaMultiStepDraftBackend(num_steps=3, kwargs=e.kwargs)
    eager = mb.TrtllmMhaMultiStepDraftBackend(num_steps=3, kwargs=e.kwargs)
    graph.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    rpi = np.array(rows + [0, 0], np.int64)
    seq = np.array(lens + [1, 1], np.int64)
    loc = np.zeros(4, np.int64)
    metas = graph.init_forward_metadata_capture_cuda_graph(4, 4, rpi, seq, loc)
    want = eager.init_forward_metadata(
        mb.ForwardBatch(mb.DECODE, rpi[:2], seq[:2], loc[:2]))
    q = rng.standard_normal((4, e.layers[0].num_q_heads * e.layers[0].head_dim)).astype(np.float16)
    for i, (step, m, w) in enumerate(zip(graph.steps, metas, want)):
        np.testing.assert_array_equal(m.cache_seqlens, seq + i + 1)
        np.testing.assert_array_equal(m.cu_seqlens_k, np.concatenate([[0], np.cumsum(seq + i + 1)]))
        for layer in e.layers:
            got = step.forward_decode(q, None, None, layer, None, save_kv_cache=False)
            eager.steps[i].forward_metadata = w
            ref_out = eager.steps[i].forward_decode(q[:2], None, None, layer, None,
                                                    save_kv_cache=False)
            assert np.isfinite(got.astype(np.float64)).all()
            np.testing.assert_array_equal(got[:2], ref_out)


def test_verify_lengths_past_the_page_table_width_are_clamped_and_counted():
    """sgl-project/sglang#19016: during target verify the KV length is
    ``seq_lens + num_draft_tokens``, which for a request at the context limit
    needs more pages than the graph page table has columns (202754 vs 202752
    tokens); the copy failed / wrote out of bounds. mha-kit clamps a row to
    ``max_seq_pages`` (DESIGN D11), counts it, and writes nothing past the
    width; the lengths themselves are the real ones.
    https://github.com/sgl-project/sglang/pull/19016"""
    p, m = 4, 3
    r2t = np.zeros((3, 32), np.int32)
    r2t[1] = np.arange(100, 132)
    r2t[2] = np.arange(40, 72)
    cu_q = np.full(3, -9, np.int32)
    word, out = _graph(r2t, [1, 2], [11, 5], m, p, offset=3, cu_seqlens_q=cu_q, q_stride=3,
                       q_mode=_api.Q_MODE_STRIDED)
    assert word[0] == 1  # one row clamped
    np.testing.assert_array_equal(out["cache_seqlens"], [14, 8])
    np.testing.assert_array_equal(out["cu_seqlens_k"], [0, 14, 22])
    np.testing.assert_array_equal(cu_q, [0, 3, 6])
    np.testing.assert_array_equal(out["page_table"][0], [25, 26, 27, -9, -9])
    np.testing.assert_array_equal(out["page_table"][1], [10, 11, -9, -9, -9])


def test_stale_request_index_in_padding_rows_leaves_real_rows_alone():
    """sgl-project/sglang#26292: the graph runners padded ``seq_lens`` with the
    fill value but left ``req_pool_indices`` of padding rows stale from an
    earlier replay, so captured attention read another request's slots. The
    real rows' metadata must not depend on what the padding rows point at,
    and a padding row reset to request 0 (the all-zero row) gets page 0.
    https://github.com/sgl-project/sglang/pull/26292"""
    p, m = 4, 8
    r2t = np.zeros((4, 32), np.int32)
    r2t[1] = np.arange(100, 132)
    r2t[2] = np.arange(40, 72)
    r2t[3] = np.arange(200, 232)  # a long-finished request's row
    _, stale = _graph(r2t, [1, 2, 3, 3], [10, 4, 1, 1], m, p)
    word, reset = _graph(r2t, [1, 2, 0, 0], [10, 4, 1, 1], m, p)
    assert word == (0, 0)
    for name in ("cache_seqlens", "cu_seqlens_k"):
        np.testing.assert_array_equal(stale[name], reset[name])
    np.testing.assert_array_equal(stale["page_table"][:2], reset["page_table"][:2])
    np.testing.assert_array_equal(reset["page_table"][:2, :3], [[25, 26, 27], [10, -9, -9]])
    np.testing.assert_array_equal(reset["page_table"][2:, 0], [0, 0])
    np.testing.assert_array_equal(stale["page_table"][2:, 0], [50, 50])


@needs_e4m3
def test_fp8_kv_round_trip_needs_k_scale_in_bmm1_and_v_scale_in_bmm2():
    """sgl-project/sglang#28144 and its backport sgl-project/sglang#29278: the
    FP8 KV path stored ``K / k_scale`` and ``V / v_scale`` but passed
    ``bmm2_scale = 1`` (and missed part of ``bmm1_scale``), so outputs were
    scaled wrong and models produced repetitive text. FlashInfer's contract:
    ``bmm1_scale = q_scale · k_scale · sm_scale``, ``bmm2_scale = v_scale``.
    Written by the fused e4m3 writer with those scales and read back with
    that pair, attention is the stored values' attention exactly and the
    original K/V's attention up to e4m3 rounding.
    https://github.com/sgl-project/sglang/pull/28144"""
    rng = np.random.default_rng(32)
    p, hkv, hq, d, pages = 16, 2, 8, 128, 6
    lens = [37, 20]
    k_scale, v_scale = 0.25, 0.5
    sm = 1 / math.sqrt(d)
    bt = np.array([[3, 1, 5], [2, 4, 0]], np.int32)
    kc = np.zeros((pages, p, hkv, d), np.uint8)
    vc = np.zeros((pages, p, hkv, d), np.uint8)
    k = np.zeros((pages, p, hkv, d))
    v = np.zeros((pages, p, hkv, d))
    for b, length in enumerate(lens):
        pos = np.arange(length)
        loc = (bt[b, pos // p] * p + pos % p).astype(np.int64)
        kk = rng.standard_normal((length, hkv, d)).astype(np.float16)
        vv = (rng.standard_normal((length, hkv, d)) * 40).astype(np.float16)
        mha_kit.fused_fp8_set_kv_buffer(kk, vv, kc, vc, loc, k_scale=k_scale, v_scale=v_scale,
                                        page_size=p)
        k.reshape(-1, hkv, d)[loc] = kk
        v.reshape(-1, hkv, d)[loc] = vv
    q = rng.standard_normal((2, hq, d)).astype(np.float16)
    seq = np.array(lens, np.int32)
    rows = [(0, 1), (1, 1)]

    def run(bmm1, bmm2):
        return mha_kit.trtllm_batch_decode_with_kv_cache(
            q, (kc, vc), _ws(), bt, seq, 64, bmm1_scale=bmm1, bmm2_scale=bmm2,
            kv_layout="NHD").astype(np.float64)

    got = run(sm * k_scale, v_scale)
    stored, _ = ref.attention(q, ref.hnd(kc, "NHD"), ref.hnd(vc, "NHD"), bt, seq, rows,
                              sm * k_scale, v_scale, -1, None)
    np.testing.assert_allclose(got, stored, rtol=2.0 ** -9, atol=1e-3)
    orig, _ = ref.attention(q, ref.hnd(k, "NHD"), ref.hnd(v, "NHD"), bt, seq, rows, sm, 1.0, -1,
                            None)
    rel = np.linalg.norm(got - orig, axis=-1) / np.linalg.norm(orig, axis=-1)
    assert rel.max() < 0.1, rel.max()
    # The reported bug: v_scale left out of bmm2 halves every output.
    bad = run(sm * k_scale, 1.0)
    assert (np.linalg.norm(bad - orig, axis=-1) / np.linalg.norm(orig, axis=-1)).min() > 0.4


def test_bf16_cache_ignores_checkpoint_kv_scales():
    """sgl-project/sglang#18396: a checkpoint carrying FP8 calibration scales
    (``k_scale = 0.06``) served with a 16-bit KV cache had ``k_scale`` folded
    into ``bmm1_scale`` anyway, shrinking every logit ~16x (degenerate
    output). The scales compensate quantization only: with a bf16 / f16
    cache the attention scales are ``(sm_scale, 1)``, whatever the layer's
    checkpoint scales are.
    https://github.com/sgl-project/sglang/pull/18396"""
    rng = np.random.default_rng(33)
    e = Engine(rng)
    lens = [7, 12]
    rows = _prefill(e, lens)
    for layer in e.layers:
        layer.k_scale, layer.v_scale = 0.06, 3.0
    seq = [x + 1 for x in lens]
    batch = mb.ForwardBatch(mb.DECODE, np.array(rows, np.int64), np.array(seq, np.int64),
                            e.slots(rows, lens, [1, 1]))
    meta = e.b.init_forward_metadata(batch)
    q, k, v = e.qkv(2)
    for li, layer in enumerate(e.layers):
        out = e.b.forward_decode(q, k, v, layer, batch, sinks=e.sinks[li])
        kc, vc = e.caches[li]
        want, _ = ref.attention(q.reshape(2, layer.num_q_heads, layer.head_dim),
                                ref.hnd(kc, e.layout), ref.hnd(vc, e.layout),
                                np.asarray(meta.page_table)[:2], np.array(seq, np.int32),
                                [(0, 1), (1, 1)], layer.scaling, 1.0, layer.window_left,
                                e.sinks[li])
        got = out.reshape(want.shape).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2.0 ** -10, atol=1e-3)


def test_bad_host_scalars_are_argument_errors_naming_them():
    """NVIDIA/TensorRT-LLM#7439 (review: ``max_seq_len`` derived from the
    config minus the draft length can reach 0 or go negative) and
    sgl-project/sglang#20705 (a layer's ``k_scale_float`` left ``None`` was
    passed straight to the attention call, behaviour undefined). A negative
    count, ``None`` or a non-integer where an integer is needed, and a
    ``None`` attention scale must raise ``mha_kit.InvalidArgument`` naming
    the argument (not a bare ``OverflowError`` / ``TypeError`` from a
    conversion); ``max_seq_len = 0`` stays valid (only a bound).
    https://github.com/NVIDIA/TensorRT-LLM/pull/7439"""
    rng = np.random.default_rng(34)
    c = ref.random_case(rng, bs=2, hq=4, hkv=2, d=64, p=16, q_lens=[2, 2], dtype=np.float16,
                        kv_dtype=np.float16)
    dec = dict(query=c["q"], kv_cache=(c["k"], c["v"]), workspace_buffer=_ws(),
               block_tables=c["block_tables"], seq_lens=c["seq_lens"], max_seq_len=64,
               bmm1_scale=0.125, q_len_per_req=2)
    want, _ = ref.attention(c["q"], c["k"], c["v"], c["block_tables"], c["seq_lens"], c["rows"],
                            0.125, 1.0, -1, None)
    got = mha_kit.trtllm_batch_decode_with_kv_cache(**dict(dec, max_seq_len=0))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2.0 ** -10, atol=1e-4)
    for name, bad in [("max_seq_len", -1), ("max_seq_len", None), ("max_seq_len", 2**64),
                      ("q_len_per_req", -2), ("window_left", 2**70), ("bmm1_scale", None),
                      ("bmm2_scale", None)]:
        with pytest.raises(mha_kit.InvalidArgument, match=name):
            mha_kit.trtllm_batch_decode_with_kv_cache(**dict(dec, **{name: bad}))
    with pytest.raises(mha_kit.InvalidArgument, match="max_q_len"):
        mha_kit.trtllm_batch_decode_with_kv_cache(
            **dict(dec, q_len_per_req=None, max_q_len=-1, cum_seq_lens_q=c["cu"]))
    cu_k = np.concatenate([[0], np.cumsum(c["seq_lens"])]).astype(np.int32)
    ctx = [c["q"], (c["k"], c["v"]), _ws(), c["block_tables"], c["seq_lens"], 2, 64, 0.125, 1.0,
           2, c["cu"], cu_k]
    for i, name, bad in [(5, "max_q_len", -1), (5, "max_q_len", None), (6, "max_kv_len", -1),
                         (7, "bmm1_scale", None), (9, "batch_size", -1)]:
        args = list(ctx)
        args[i] = bad
        with pytest.raises(mha_kit.InvalidArgument, match=name):
            mha_kit.trtllm_batch_context_with_kv_cache(*args)
    r2t = np.zeros((2, 16), np.int32)
    with pytest.raises(mha_kit.InvalidArgument, match="page_size"):
        mha_kit.build_trtllm_mha_page_table(r2t, np.zeros(1, np.int64), np.ones(1, np.int32),
                                            np.zeros((1, 4), np.int32), -4)
    graph = dict(req_pool_indices=np.zeros(2, np.int64), seq_lens=np.ones(2, np.int64),
                 req_to_token=r2t, cache_seqlens=np.zeros(2, np.int32),
                 cu_seqlens_k=np.zeros(3, np.int32), page_table=np.zeros((2, 4), np.int32), bs=2,
                 seqlen_offset=0, max_seq_pages=4, page_size=4)
    for name, bad in [("bs", -1), ("max_seq_pages", -1), ("page_size", -4),
                      ("seqlen_offset", 2**64)]:
        with pytest.raises(mha_kit.InvalidArgument, match=name):
            mha_kit.update_trtllm_mha_graph_metadata(**dict(graph, **{name: bad}))
    k = np.zeros((2, 2, 64), np.float16)
    with pytest.raises(mha_kit.InvalidArgument, match="page_size"):
        mha_kit.fused_fp8_set_kv_buffer(k, k, np.zeros((8, 2, 64), np.uint8),
                                        np.zeros((8, 2, 64), np.uint8), np.zeros(2, np.int64),
                                        page_size=-1)
    with pytest.raises(mha_kit.InvalidArgument, match="`s`"):
        mha_kit.merge_states(np.zeros((1, 2, 3, 64), np.float16), None)
    assert P == 4 and WIDTH == 64  # the imported engine's geometry


def test_device_functions_without_torch_or_gpu_raise_device_error():
    """Not from a report (found while checking the ones above): on a host
    without torch, ``device_errors()`` / ``init()`` failed with a bare
    ``ModuleNotFoundError`` and ``device_errors("cpu")`` with a ``TypeError``
    (a string's ``.index`` method taken for a device index). They must raise
    ``mha_kit.DeviceError`` (no torch to pick the current device, not a CUDA
    device, no GPU)."""
    import sys

    if mha_kit.gpu_available():
        pytest.skip("a GPU is present")
    saved = sys.modules.get("torch")
    sys.modules["torch"] = None  # `import torch` raises ImportError
    try:
        for call in (lambda: mha_kit.device_errors(), lambda: mha_kit.init(),
                     lambda: mha_kit.init(0), lambda: mha_kit.module_sources("cuda"),
                     lambda: mha_kit.device_errors("cpu"), lambda: mha_kit.device_errors("cuda:x"),
                     lambda: mha_kit.device_errors(0), lambda: mha_kit.module_sources("cuda:0")):
            with pytest.raises(mha_kit.DeviceError):
                call()
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
