"""CPU tests of ``mha_kit.backend`` (CI, numpy arrays): the seed backend's state
machine over engine buffers. A prefill (EXTEND), then DECODE, uniform and ragged
TARGET_VERIFY, DRAFT_EXTEND_V2 and multi-step draft decode passes, each layer's
output against ``reference.attention`` (float64) over the K/V the backend wrote
into the engine's caches; the metadata of every mode against its definition;
graph buckets (capture, then replays of other batches, padded) equal to the
eager metadata and outputs; a hybrid model's SWA layer through its own pool;
e4m3 caches; and the errors."""

import math

import numpy as np
import pytest

from mha_kit import backend as mb

import reference as ref

P, HQ, HKV, D = 4, 4, 2, 64
ROWS, WIDTH, PAGES = 6, 64, 80
TOL = 2.0 ** -10


def _pool(rng, swa=False):
    """``req_to_token`` rows over scattered pages (page 0 reserved), and for a
    hybrid model a full→SWA slot map (a permutation of whole pages)."""
    r2t = np.zeros((ROWS, WIDTH), np.int32)
    perm = rng.permutation(np.arange(1, PAGES))
    per = WIDTH // P
    for r in range(ROWS):
        for j in range(per):
            page = perm[(r * per + j) % len(perm)]
            r2t[r, j * P:(j + 1) * P] = page * P + np.arange(P)
    full_to_swa = None
    if swa:
        sp = rng.permutation(np.arange(1, PAGES))
        full_to_swa = np.zeros(PAGES * P, np.int64)
        for page in range(1, PAGES):
            full_to_swa[page * P:(page + 1) * P] = sp[page - 1] * P + np.arange(P)
    return r2t, full_to_swa


class Engine:
    """An engine's buffers and one backend (or a multi-step draft backend)."""

    def __init__(self, rng, *, swa=False, e4m3=False, layout="HND", num_draft_tokens=4):
        self.rng = rng
        self.r2t, self.full_to_swa = _pool(rng, swa)
        shape = (PAGES, HKV, P, D) if layout == "HND" else (PAGES, P, HKV, D)
        dt = np.uint8 if e4m3 else np.float16
        self.e4m3 = e4m3
        self.layout = layout
        self.caches = [(np.zeros(shape, dt), np.zeros(shape, dt)) for _ in range(2)]
        self.layers = [
            mb.Layer(0, HQ, HKV, D, 1 / math.sqrt(D), k_scale=0.5 if e4m3 else None,
                     v_scale=2.0 if e4m3 else None),
            mb.Layer(1, HQ, HKV, D, 1 / math.sqrt(D), window_left=5, is_swa=swa,
                     k_scale=0.5 if e4m3 else None, v_scale=2.0 if e4m3 else None),
        ]
        self.sinks = [None, rng.standard_normal(HQ).astype(np.float32)]
        self.kwargs = dict(req_to_token=self.r2t, kv_buffers=self.caches, layers=self.layers,
                           page_size=P, max_context_len=WIDTH,
                           workspace_buffer=np.zeros(1 << 16, np.uint8), kv_layout=layout,
                           full_to_swa=self.full_to_swa, num_draft_tokens=num_draft_tokens)
        self.b = mb.TrtllmMhaBackend(**self.kwargs)

    def slots(self, rows, starts, counts):
        return np.concatenate([self.r2t[r, s:s + n] for r, s, n in zip(rows, starts, counts)]
                              ).astype(np.int64) if rows else np.zeros(0, np.int64)

    def qkv(self, n):
        q = self.rng.standard_normal((n, HQ * D)).astype(np.float16)
        k = self.rng.standard_normal((n, HKV * D)).astype(np.float16)
        v = self.rng.standard_normal((n, HKV * D)).astype(np.float16)
        return q, k, v

    def check_layers(self, backend, batch, q_rows, kv_lens, n_tokens, extend, save=True):
        """Runs both layers of `batch` and checks each against the reference.
        q_rows: (row offset, rows) per request; kv_lens: keys per request."""
        q, k, v = self.qkv(n_tokens)
        for li, layer in enumerate(self.layers):
            f = backend.forward_extend if extend else backend.forward_decode
            out = f(q, k if save else None, v if save else None, layer, batch,
                    sinks=self.sinks[li])
            kc, vc = self.caches[li]
            k_hnd, v_hnd = ref.hnd(kc, self.layout), ref.hnd(vc, self.layout)
            if self.e4m3:
                k_hnd, v_hnd = (x.view(ref.E4M3).astype(np.float64) for x in (k_hnd, v_hnd))
            meta = backend.forward_metadata
            table = meta.swa_page_table if layer.is_swa else meta.page_table
            bs = len(kv_lens)
            # The page tables are the engine's req_to_token pages (SWA: mapped).
            for i in range(bs):
                r = int(np.asarray(batch.req_pool_indices)[i])
                first = self.r2t[r, 0:kv_lens[i]:P].astype(np.int64)
                if layer.is_swa:
                    first = self.full_to_swa[first]
                np.testing.assert_array_equal(np.asarray(table)[i, :len(first)], first // P)
            bmm1 = layer.scaling * (layer.k_scale or 1.0)
            bmm2 = layer.v_scale or 1.0
            want, written = ref.attention(
                q.reshape(-1, HQ, D), k_hnd, v_hnd, np.asarray(table)[:bs],
                np.asarray(kv_lens, np.int32), q_rows, bmm1, bmm2, layer.window_left,
                self.sinks[li])
            assert written.all()
            got = out.reshape(-1, HQ, D).astype(np.float64)
            tol = 4e-2 if self.e4m3 else TOL
            err = np.abs(got - want)
            assert np.all(err <= tol * np.abs(want) + 1e-3), (
                f"layer {li} ({batch.forward_mode}): max err {err.max():.3g}")
        return q, k, v


def _prefill(e, lens, rows=None):
    rows = rows or list(range(1, len(lens) + 1))
    loc = e.slots(rows, [0] * len(rows), lens)
    batch = mb.ForwardBatch(mb.EXTEND, np.array(rows, np.int64), np.array(lens, np.int64), loc,
                            extend_seq_lens=lens, extend_prefix_lens=[0] * len(lens))
    m = e.b.init_forward_metadata(batch)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    np.testing.assert_array_equal(m.cu_seqlens_q, cu)
    np.testing.assert_array_equal(m.cu_seqlens_k, cu)
    assert m.max_seq_len_q == max(lens)
    e.check_layers(e.b, batch, [(int(cu[i]), lens[i]) for i in range(len(lens))], lens,
                   int(cu[-1]), extend=True)
    return rows


@pytest.mark.parametrize("swa,layout", [(False, "HND"), (True, "NHD"), (True, "HND")])
def test_every_mode_matches_the_reference(swa, layout):
    rng = np.random.default_rng(7 + swa + (layout == "NHD"))
    e = Engine(rng, swa=swa, layout=layout)
    lens = [7, 1, 12]
    rows = _prefill(e, lens)
    bs = len(rows)
    rpi = np.array(rows, np.int64)
    # DECODE: one new token each.
    seq = [x + 1 for x in lens]
    batch = mb.ForwardBatch(mb.DECODE, rpi, np.array(seq, np.int64), e.slots(rows, lens, [1] * bs))
    m = e.b.init_forward_metadata(batch)
    np.testing.assert_array_equal(m.cache_seqlens, seq)
    np.testing.assert_array_equal(m.cu_seqlens_q, np.arange(bs + 1))
    if swa:
        np.testing.assert_array_equal(m.swa_out_cache_loc, e.full_to_swa[batch.out_cache_loc])
    e.check_layers(e.b, batch, [(i, 1) for i in range(bs)], seq, bs, extend=False)
    # TARGET_VERIFY, uniform: 3 rows per request over seq + 3 keys.
    n = 3
    batch = mb.ForwardBatch(mb.TARGET_VERIFY, rpi, np.array(seq, np.int64),
                            e.slots(rows, seq, [n] * bs))
    m = e.b.init_forward_metadata(batch)
    kv = [s + n for s in seq]
    np.testing.assert_array_equal(m.cache_seqlens, kv)
    np.testing.assert_array_equal(m.cu_seqlens_q, np.arange(0, bs * n + 1, n))
    assert m.max_seq_len_q == n and not m.is_ragged_verify
    e.check_layers(e.b, batch, [(i * n, n) for i in range(bs)], kv, bs * n, extend=True)
    # TARGET_VERIFY, ragged.
    vl = [2, 4, 1]
    batch = mb.ForwardBatch(mb.TARGET_VERIFY, rpi, np.array(seq, np.int64),
                            e.slots(rows, seq, vl), spec_info=mb.SpecInfo(verify_lens=vl))
    m = e.b.init_forward_metadata(batch)
    cu = np.concatenate([[0], np.cumsum(vl)])
    assert m.is_ragged_verify and m.max_seq_len_q == 4
    kv = [s + x for s, x in zip(seq, vl)]
    e.check_layers(e.b, batch, [(int(cu[i]), vl[i]) for i in range(bs)], kv, int(cu[-1]),
                   extend=True)
    # DRAFT_EXTEND_V2: 2 rows per request over seq + 2 keys (seq_lens include them).
    kv = [s + 2 for s in seq]
    batch = mb.ForwardBatch(mb.DRAFT_EXTEND_V2, rpi, np.array(kv, np.int64),
                            e.slots(rows, seq, [2] * bs))
    m = e.b.init_forward_metadata(batch)
    np.testing.assert_array_equal(m.cache_seqlens, kv)
    e.check_layers(e.b, batch, [(2 * i, 2) for i in range(bs)], kv, 2 * bs, extend=True)


def test_chunked_prefill_and_mixed_pass():
    rng = np.random.default_rng(3)
    e = Engine(rng)
    rows = _prefill(e, [5, 9])
    # MIXED: request 1 extends by 6 tokens over its 5, request 2 decodes one.
    rpi = np.array(rows, np.int64)
    ext, pre = [6, 1], [5, 9]
    seq = [a + b for a, b in zip(ext, pre)]
    batch = mb.ForwardBatch(mb.MIXED, rpi, np.array(seq, np.int64), e.slots(rows, pre, ext),
                            extend_seq_lens=ext, extend_prefix_lens=pre)
    m = e.b.init_forward_metadata(batch)
    np.testing.assert_array_equal(m.cu_seqlens_q, [0, 6, 7])
    np.testing.assert_array_equal(m.cu_seqlens_k, [0, 11, 21])
    e.check_layers(e.b, batch, [(0, 6), (6, 1)], seq, 7, extend=True)


@pytest.mark.skipif(ref.E4M3 is None, reason="ml_dtypes not installed")
def test_e4m3_caches_with_checkpoint_scales():
    rng = np.random.default_rng(11)
    with pytest.raises(mb.InvalidArgument, match="NHD"):
        Engine(rng, e4m3=True, layout="HND")
    e = Engine(rng, e4m3=True, layout="NHD")
    lens = [6, 3]
    rows = _prefill(e, lens)
    seq = [x + 1 for x in lens]
    batch = mb.ForwardBatch(mb.DECODE, np.array(rows, np.int64), np.array(seq, np.int64),
                            e.slots(rows, lens, [1, 1]))
    e.b.init_forward_metadata(batch)
    e.check_layers(e.b, batch, [(0, 1), (1, 1)], seq, 2, extend=False)


@pytest.mark.skipif(ref.E4M3 is None, reason="ml_dtypes not installed")
def test_e4m3_unusable_checkpoint_scales_resolve_to_one_in_attention_too():
    """SEMANTICS.md §fp8-kv.5 (D8): a scale that is not a positive finite
    number resolves to 1.0, and the same resolved pair feeds the write and the
    attention call. The fused write already resolved them; the attention
    scales must too (a k_scale of 0 gave uniform weights, NaN gave NaN)."""
    outs = []
    for ks, vs in [(None, None), (0.0, -2.0), (float("nan"), float("inf"))]:
        rng = np.random.default_rng(13)
        e = Engine(rng, e4m3=True, layout="NHD")
        for layer in e.layers:
            layer.k_scale, layer.v_scale = ks, vs
        lens, rows = [6, 3], [1, 2]
        batch = mb.ForwardBatch(mb.EXTEND, np.array(rows, np.int64), np.array(lens, np.int64),
                                e.slots(rows, [0, 0], lens), extend_seq_lens=lens,
                                extend_prefix_lens=[0, 0])
        e.b.init_forward_metadata(batch)
        q, k, v = e.qkv(sum(lens))
        got = [e.b.forward_extend(q, k, v, layer, batch, sinks=e.sinks[li])
               for li, layer in enumerate(e.layers)]
        seq = [x + 1 for x in lens]
        batch = mb.ForwardBatch(mb.DECODE, np.array(rows, np.int64), np.array(seq, np.int64),
                                e.slots(rows, lens, [1, 1]))
        e.b.init_forward_metadata(batch)
        q, k, v = e.qkv(2)
        got += [e.b.forward_decode(q, k, v, layer, batch, sinks=e.sinks[li])
                for li, layer in enumerate(e.layers)]
        outs.append((got, [c.copy() for pair in e.caches for c in pair]))
    for got, caches in outs[1:]:
        for a, b in zip(caches, outs[0][1]):
            np.testing.assert_array_equal(a, b)  # the write resolved them
        for a, b in zip(got, outs[0][0]):
            np.testing.assert_array_equal(a, b)


def test_multi_step_draft_decode():
    rng = np.random.default_rng(5)
    e = Engine(rng)
    lens = [6, 10]
    rows = _prefill(e, lens)
    draft = mb.TrtllmMhaMultiStepDraftBackend(num_steps=3, kwargs=e.kwargs)
    assert [s.speculative_step_id for s in draft.steps] == [0, 1]
    rpi = np.array(rows, np.int64)
    batch = mb.ForwardBatch(mb.DECODE, rpi, np.array(lens, np.int64),
                            e.slots(rows, lens, [1, 1]))
    metas = draft.init_forward_metadata(batch)
    for i, (step, m) in enumerate(zip(draft.steps, metas)):
        kv = [x + i + 1 for x in lens]
        np.testing.assert_array_equal(m.cache_seqlens, kv)
        step_batch = mb.ForwardBatch(mb.DECODE, rpi, np.array(lens, np.int64),
                                     e.slots(rows, [x + i for x in lens], [1, 1]),
                                     spec_info=mb.SpecInfo(draft=True))
        step.forward_metadata = m
        e.check_layers(step, step_batch, [(0, 1), (1, 1)], kv, 2, extend=False)
    with pytest.raises(mb.InvalidArgument, match="num_steps"):
        mb.TrtllmMhaMultiStepDraftBackend(num_steps=1, kwargs=e.kwargs)


def _same_meta(got, want, bs):
    for name in ("cache_seqlens", "cu_seqlens_k", "cu_seqlens_q"):
        g, w = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        np.testing.assert_array_equal(g[:len(w)], w, err_msg=name)
    for i in range(bs):
        n = -(-int(want.cache_seqlens[i]) // P)
        np.testing.assert_array_equal(got.page_table[i, :n], want.page_table[i, :n])
        if want.swa_page_table is not None:
            np.testing.assert_array_equal(got.swa_page_table[i, :n], want.swa_page_table[i, :n])
    if want.swa_out_cache_loc is not None:
        w = np.asarray(want.swa_out_cache_loc)
        np.testing.assert_array_equal(np.asarray(got.swa_out_cache_loc)[:len(w)], w)


@pytest.mark.parametrize("swa", [False, True])
def test_graph_buckets_equal_eager(swa):
    """Capture one bucket per mode with one batch, replay it with others
    (padded as a runner pads: row 0, seq_lens 1, slot 0): the bucket's
    metadata is the eager metadata and the layers' outputs are equal."""
    rng = np.random.default_rng(21 + swa)
    e = Engine(rng, swa=swa, num_draft_tokens=4)
    rows = _prefill(e, [5, 9, 2])
    eager = mb.TrtllmMhaBackend(**e.kwargs)
    e.b.init_cuda_graph_state(max_bs=4, max_num_tokens=16)
    bucket = 4

    def padded(rpi, seq, loc, per_row):
        pad = bucket - len(rpi)
        return (np.concatenate([rpi, np.zeros(pad, np.int64)]),
                np.concatenate([seq, np.ones(pad, np.int64)]),
                np.concatenate([loc, np.zeros(pad * per_row, np.int64)]))

    for mode, per_row, spec in [(mb.DECODE, 1, None), (mb.TARGET_VERIFY, 3, None),
                                (mb.DRAFT_EXTEND_V2, 2, None)]:
        for step, lens in enumerate([[5, 9, 2], [6, 10, 3]]):
            rpi = np.array(rows, np.int64)
            # DECODE / TARGET_VERIFY: seq_lens before the rows' keys are added
            # (decode: with its one token); DRAFT_EXTEND_V2: with them.
            seq = np.array(lens, np.int64) + (per_row if mode != mb.TARGET_VERIFY else 0)
            loc = e.slots(rows, lens, [per_row] * 3)
            want = eager.init_forward_metadata(mb.ForwardBatch(mode, rpi, seq, loc, spec_info=spec))
            p_rpi, p_seq, p_loc = padded(rpi, seq, loc, per_row)
            f = (e.b.init_forward_metadata_capture_cuda_graph if step == 0
                 else e.b.init_forward_metadata_replay_cuda_graph)
            got = f(bucket, bucket * per_row, p_rpi, p_seq, mode, spec, p_loc)
            assert got.max_seq_len_q == want.max_seq_len_q
            _same_meta(got, want, 3)
            # Layer outputs of the real rows are the eager outputs.
            q, k, v = e.qkv(bucket * per_row)
            for layer in e.layers:
                g = (e.b.forward_decode if mode == mb.DECODE else e.b.forward_extend)(
                    q, None, None, layer, None, save_kv_cache=False)
                w = (eager.forward_decode if mode == mb.DECODE else eager.forward_extend)(
                    q[:3 * per_row], None, None, layer, None, save_kv_cache=False)
                np.testing.assert_array_equal(g[:3 * per_row], w)


def test_ragged_verify_graph_pads_the_rows():
    rng = np.random.default_rng(4)
    e = Engine(rng, num_draft_tokens=4)
    rows = _prefill(e, [5, 9, 2])
    eager = mb.TrtllmMhaBackend(**e.kwargs)
    e.b.init_cuda_graph_state(max_bs=6, max_num_tokens=6)
    rpi = np.array(rows, np.int64)
    seq = np.array([6, 10, 3], np.int64)
    vl = [1, 2, 1]
    spec = mb.SpecInfo(verify_lens=vl)
    loc = e.slots(rows, [6, 10, 3], vl)
    want = eager.init_forward_metadata(mb.ForwardBatch(mb.TARGET_VERIFY, rpi, seq, loc,
                                                      spec_info=spec))
    # A bucket of 6 rows and 6 tokens: three padding rows of one token each.
    p_rpi = np.concatenate([rpi, np.zeros(3, np.int64)])
    p_seq = np.concatenate([seq, np.ones(3, np.int64)])
    p_loc = np.concatenate([loc, np.zeros(2, np.int64)])
    got = e.b.init_forward_metadata_capture_cuda_graph(6, 6, p_rpi, p_seq, mb.TARGET_VERIFY,
                                                       spec, p_loc)
    assert got.is_ragged_verify and got.max_seq_len_q == 4
    np.testing.assert_array_equal(got.cu_seqlens_q, [0, 1, 3, 4, 5, 6, 6][:7])
    np.testing.assert_array_equal(got.cache_seqlens[:3], want.cache_seqlens)
    _same_meta(got, want, 3)
    # Rows over the bucket's tokens, or a padded row above N, are refused.
    with pytest.raises(mb.InvalidArgument, match="verify_lens"):
        e.b.init_forward_metadata_replay_cuda_graph(6, 6, p_rpi, p_seq, mb.TARGET_VERIFY,
                                                    mb.SpecInfo(verify_lens=[4, 4, 1]), p_loc)


def test_errors_name_the_argument():
    rng = np.random.default_rng(1)
    e = Engine(rng)
    with pytest.raises(mb.InvalidArgument, match="topk"):
        mb.TrtllmMhaBackend(**dict(e.kwargs, topk=2))
    with pytest.raises(mb.InvalidArgument, match="kv_layout"):
        mb.TrtllmMhaBackend(**dict(e.kwargs, kv_layout="NDH"))
    with pytest.raises(mb.InvalidArgument, match="full_to_swa"):
        mb.TrtllmMhaBackend(**dict(e.kwargs, full_to_swa=None,
                                   layers=[mb.Layer(0, HQ, HKV, D, 0.1, is_swa=True),
                                           e.layers[1]]))
    rpi = np.array([1], np.int64)
    with pytest.raises(mb.InvalidArgument, match="forward_mode"):
        e.b.init_forward_metadata(mb.ForwardBatch("DECODE_X", rpi, np.array([1]), np.zeros(1, np.int64)))
    with pytest.raises(mb.InvalidArgument, match="extend_seq_lens"):
        e.b.init_forward_metadata(mb.ForwardBatch(mb.EXTEND, rpi, np.array([3]), np.zeros(3, np.int64)))
    with pytest.raises(mb.InvalidArgument, match="uniform rows"):
        e.b.init_forward_metadata(mb.ForwardBatch(mb.TARGET_VERIFY, rpi, np.array([3]),
                                                  np.zeros(0, np.int64)))
    with pytest.raises(mb.InvalidArgument, match="init_cuda_graph_state"):
        e.b.init_forward_metadata_capture_cuda_graph(1, 1, rpi, np.array([1]), mb.DECODE)
    e.b.init_cuda_graph_state(2, 4)
    with pytest.raises(mb.InvalidArgument, match="forward_mode"):
        e.b.init_forward_metadata_capture_cuda_graph(1, 1, rpi, np.array([1]), mb.EXTEND)
    with pytest.raises(mb.InvalidArgument, match="exceeds"):
        e.b.init_forward_metadata_capture_cuda_graph(3, 3, rpi, np.array([1]), mb.DECODE)
    with pytest.raises(mb.InvalidArgument, match="no captured"):
        e.b.init_forward_metadata_replay_cuda_graph(1, 1, rpi, np.array([1]), mb.DECODE)
    # An empty IDLE batch builds empty metadata.
    m = e.b.init_forward_metadata(mb.ForwardBatch(mb.IDLE, np.zeros(0, np.int64),
                                                  np.zeros(0, np.int64), np.zeros(0, np.int64)))
    assert m.batch_size == 0 and m.page_table.shape == (0, WIDTH // P)


def test_skip_softmax_decode_factor_reaches_the_decode_calls():
    """``skip_softmax_decode`` (the seed's decode factor) goes to every
    decode-kernel call: the CPU path stays exact (same outputs as without
    it), and a bad factor raises naming the keyword at the first decode."""
    lens = [7, 1, 12]
    outs = []
    for f in (None, 0.25):
        rng = np.random.default_rng(3)
        e = Engine(rng)
        e.b = mb.TrtllmMhaBackend(**e.kwargs, skip_softmax_decode=f)
        rows = _prefill(e, lens)
        rpi = np.array(rows, np.int64)
        seq = [x + 1 for x in lens]
        batch = mb.ForwardBatch(mb.DECODE, rpi, np.array(seq, np.int64),
                                e.slots(rows, lens, [1] * len(rows)))
        e.b.init_forward_metadata(batch)
        q, _, _ = e.check_layers(e.b, batch, [(i, 1) for i in range(len(rows))], seq,
                                 len(rows), extend=False)
        outs.append(e.b.forward_decode(q, None, None, e.layers[0], batch, save_kv_cache=False))
    np.testing.assert_array_equal(outs[0], outs[1])
    e.b.skip_softmax_decode = -1.0
    with pytest.raises(mb.InvalidArgument, match="skip_softmax_threshold_scale_factor"):
        e.b.forward_decode(q, None, None, e.layers[0], batch, save_kv_cache=False)
