//! Scenarios taken from public bug reports against SGLang's TRT-LLM MHA
//! backend, FlashInfer's trtllm-gen kernels, vLLM and TensorRT-LLM, run on
//! the CPU executor. Each test cites its report; outputs are compared with
//! attention written out directly in f64 over the test's own record of
//! every K/V row (never with the backend's own output), and metadata with
//! the plain definitions of SEMANTICS.md §backend / §page-table / §swa-pool.

#[path = "common/models.rs"]
mod models;
#[path = "common/sim.rs"]
mod sim;

use mha_backend::{
    AttnMode, BackendConfig, BackendError, Device, ForwardBatch, ForwardMode, KvCacheDtype,
    KvSnapshot, LayerConfig, MultiStepDraftBackend, SpecConfig, SpecInfo, TensorRef,
};
use models::{dense_config, hybrid_config, spec};
use sim::{bf16, each, fp8_bytes, ids, max_rel_err, scale_rule, Sim};

// ---------------------------------------------------------------- tests

/// sglang-project/sglang PR #32087 (Triton SWA decode kept `sliding_window_size`
/// keys and silently dropped the oldest in-window key: the radius
/// `window_left = sliding_window − 1` means `window_left + 1` keys), with the
/// convention from NVIDIA/Megatron-LM issue #3690 / PR #2771 (gpt-oss's
/// 128-token window is `(127, 0)`).
/// https://github.com/sgl-project/sglang/pull/32087
/// https://github.com/NVIDIA/Megatron-LM/issues/3690
///
/// With `window_left = 5` a decode row at position `x` must see the six keys
/// `x − 5 ..= x`, also after SWA eviction of the out-of-window pages (the
/// oldest in-window key must survive eviction), and the result must differ
/// from the one-key-short window.
#[test]
fn swa_decode_sees_window_left_plus_one_keys_after_eviction() {
    let mut m = Sim::new(hybrid_config(), 32087);
    let [a, bq] = m.prefill([13, 9]);
    let mut evicted = 0;
    for _ in 0..6 {
        for r in [a, bq] {
            // The oldest key the next decode row (position `len`) sees is
            // `len − 5`: its SWA slot must still be mapped.
            assert!(m.len(r) >= 5);
            evicted += m.evict_swa_keeping(r, 5);
        }
        let parts = m.parts(&[(a, 1), (bq, 1)]);
        let outs = m.decode(&[a, bq]);
        // The checked output used W + 1 keys; the W-key window differs.
        let short = m.direct(1, &parts, &outs[1].0, Some(Some(4)));
        assert!(max_rel_err(&outs[1].1, &short, 64) > 2e-2);
    }
    assert!(evicted >= 4, "the scenario must evict SWA pages");
    m.assert_clean();
}

/// flashinfer-ai/flashinfer issue #3864: trtllm-gen spec-as-decode
/// (`q_len_per_req = 8`) with an FP8 KV cache mis-computed sliding-window
/// attention once `seq_len > window`.
/// https://github.com/flashinfer-ai/flashinfer/issues/3864
///
/// Uniform target verify of 8 rows per request over an e4m3 cache with K/V
/// scales and a window shorter than the context: every row against the
/// direct computation (each row its own window start).
#[test]
fn fp8_windowed_verify_with_eight_rows_per_request() {
    let mut c = dense_config();
    c.spec = spec(8);
    c.kv_dtype = KvCacheDtype::Fp8E4m3;
    c.layers = vec![
        LayerConfig::new(8, 2, 128)
            .with_window(7)
            .with_scales(Some(0.5), Some(2.0)),
        LayerConfig::new(4, 4, 64).with_scales(Some(0.25), Some(0.75)),
    ];
    let mut m = Sim::new(c, 3864);
    let [a, bq] = m.prefill([30, 5]);
    m.verify(&[a, bq], &[8, 8], false);
    assert_eq!(
        m.backend.metadata().unwrap().mode,
        AttnMode::TargetVerify { q_len: 8 }
    );
    m.verify(&[a, bq], &[8, 8], false);
    m.assert_clean();
}

/// sglang-project/sglang PR #28144 ("Fix TRTLLM MHA FP8 KV cache scale
/// handling", the Gemma-4 NVFP4 quality drop of issue #26518): the kernel
/// must get `bmm1 = q_scale · k_scale · softmax_scale`, `bmm2 = v_scale`,
/// with a missing checkpoint scale falling back to 1.0.
/// https://github.com/sgl-project/sglang/pull/28144
///
/// Layers with both scales, only one, an invalid one (0, NaN) and none: the
/// cache bytes are `e4m3(x / scale)` and the outputs equal the direct
/// computation over the dequantised K/V (`e4m3 · scale`), in extend, decode
/// and verify passes.
#[test]
fn fp8_cache_applies_each_layers_own_scales() {
    let mut c = dense_config();
    c.kv_dtype = KvCacheDtype::Fp8E4m3;
    c.layers = vec![
        LayerConfig::new(4, 2, 64).with_scales(Some(0.5), Some(4.0)),
        LayerConfig::new(4, 2, 64).with_scales(None, Some(0.125)),
        LayerConfig::new(4, 2, 64).with_scales(Some(0.0), Some(f32::NAN)),
        LayerConfig::new(4, 2, 64),
    ];
    let mut m = Sim::new(c.clone(), 28144);
    let [a, bq] = m.prefill([11, 6]);
    m.decode(&[a, bq]);
    m.verify(&[a, bq], &[2, 2], false);
    // Cache bytes: each layer quantised with its own resolved scale.
    let slots = m.slots(a);
    for (layer, l) in c.layers.iter().enumerate() {
        let (ks, vs) = (scale_rule(l.k_scale), scale_rule(l.v_scale));
        let KvSnapshot::Fp8 { k, v } = m.backend.read_kv_cache(layer).unwrap() else {
            panic!("fp8 cache expected")
        };
        let kv = l.kv_row_elems();
        for (pos, (kr, vr)) in m.hist[layer][&a].iter().enumerate() {
            let s = slots[pos] as usize;
            let (qk, qv) = (fp8_bytes(kr, ks), fp8_bytes(vr, vs));
            assert_eq!(&k[s * kv..(s + 1) * kv], &qk[..], "layer {layer} pos {pos}");
            assert_eq!(&v[s * kv..(s + 1) * kv], &qv[..], "layer {layer} pos {pos}");
        }
    }
    m.assert_clean();
}

/// sglang-project/sglang PRs #1469 / #1782 / #7233 (CUDA-graph padding:
/// padded requests get `seq_len` fill value 1 and request row 0, whose
/// `req_to_token` row is zeros, so they read the dummy page), PR #1789
/// (`seq_lens_sum` must count the padded requests) and PR #18647 (padding
/// slots' `req_pool_indices` zeroed so no stale request is read).
/// https://github.com/sgl-project/sglang/pull/7233
/// https://github.com/sgl-project/sglang/pull/1789
/// https://github.com/sgl-project/sglang/pull/18647
///
/// A decode batch of 3 padded to a bucket of 8 after a larger batch used
/// those rows: padding rows are row 0 / length 1 / slot 0, their page-table
/// row is the dummy page 0, `cu_seqlens_k` sums the padded lengths, and
/// the real rows' outputs equal the direct computation.
#[test]
fn graph_padding_rows_use_row_zero_length_one_and_the_dummy_page() {
    let mut m = Sim::new(dense_config(), 7233);
    let reqs: Vec<usize> = (0..6).map(|_| m.new_request()).collect();
    let grow: Vec<(usize, usize)> = reqs.iter().map(|&r| (r, 3 + 2 * r)).collect();
    m.extend(&grow, false);
    m.decode(&reqs); // a batch of 6 fills the rows the next one pads
    let live = &reqs[..3];
    let seq: Vec<i64> = live.iter().map(|&r| m.len(r) as i64 + 1).collect();
    let (batch, parts) = m.decode_batch(live);
    let padded = batch.pad_to_bucket(8, 8, 1).unwrap();
    assert_eq!(&padded.req_pool_indices[3..], &[0; 5]);
    assert_eq!(&padded.seq_lens[3..], &[1; 5]);
    assert_eq!(&padded.out_cache_loc[3..], &[0; 5]);
    assert_eq!(&padded.seq_lens[..3], &seq[..]);
    let meta = m.backend.reference_metadata(&padded).unwrap();
    let sum: i64 = padded.seq_lens.iter().sum();
    assert_eq!(*meta.cu_seqlens_k.last().unwrap() as i64, sum);
    assert_eq!(meta.cache_seqlens.len(), 8);
    for row in 3..8 {
        assert_eq!(meta.page_row(row, 4), &[0], "padding row {row}");
    }
    // The real rows' tables: page of slot `req_to_token[r][4j]`.
    for (i, &r) in live.iter().enumerate() {
        assert_eq!(meta.page_row(i, 4), &m.pages(r)[..], "row {i}");
    }
    m.run(&padded, &parts);
    // The dummy page absorbed the padding writes; no real page was touched
    // by them (checked above: real rows equal the direct computation, which
    // reads every real page).
    m.assert_clean();
}

/// sglang-project/sglang PR #27545 (draft-extend CUDA-graph metadata built
/// `qo_indptr` with a per-request stride of `num_steps + 1` instead of the
/// runner's `num_draft_tokens`: at `bs > 1` each request read the wrong
/// query rows, NaN) and PR #25002 (trtllm_mha DRAFT_EXTEND_V2 replay uses
/// uniform `num_tokens_per_req` for `cu_seqlens_q` and `max_seq_len_q`).
/// https://github.com/sgl-project/sglang/pull/27545
/// https://github.com/sgl-project/sglang/pull/25002
///
/// DRAFT_EXTEND_V2 at `bs = 3` with `num_draft_tokens = 4` rows per
/// request while `num_steps + 1 = 3` (the two strides differ): `cu_seqlens_q`
/// is `0, 4, 8, 12`, `max_seq_len_q = 4`, every row against the direct
/// computation; also through the graph padding of the same batch.
#[test]
fn draft_extend_v2_rows_use_the_draft_token_stride() {
    let mut c = dense_config();
    c.spec = Some(SpecConfig {
        num_steps: 2,
        ..spec(4).unwrap()
    });
    let mut m = Sim::new(c, 27545);
    let reqs = m.prefill([9, 2, 17]);
    for round in 0..2 {
        let seq: Vec<i64> = reqs.iter().map(|&r| (m.len(r) + 4) as i64).collect();
        let (batch, parts) = m.draft_extend_batch(&reqs, 4);
        let batch = if round == 1 {
            // Replay padding to a bucket of 5 requests × 4 tokens.
            let p = batch.pad_to_bucket(5, 20, 4).unwrap();
            assert_eq!(p.extend_seq_lens.as_deref(), Some(&[4; 5][..]));
            p
        } else {
            batch
        };
        let meta = m.backend.reference_metadata(&batch).unwrap();
        let bs = batch.batch_size;
        assert_eq!(meta.mode, AttnMode::DraftExtendV2 { q_len: 4 });
        assert_eq!(
            meta.cu_seqlens_q,
            (0..=bs as i32).map(|i| 4 * i).collect::<Vec<_>>()
        );
        assert_eq!(meta.max_seq_len_q, 4);
        assert_eq!(
            &meta.cache_seqlens[..3],
            &[seq[0] as i32, seq[1] as i32, seq[2] as i32]
        );
        m.run(&batch, &parts);
    }
    m.assert_clean();
}

/// vllm-project/vllm issue #32626 and PR #34009: with DP, a dummy run gave
/// the TRTLLM attention metadata builder 2 padded requests but 1 token, and
/// the backend crashed (TRTLLM needs `num_decode_tokens` divisible by the
/// requests). Also NVIDIA/TensorRT-LLM issue #15022 (a draft length
/// schedule reaching 0 crashed CUDA-graph capture).
/// https://github.com/vllm-project/vllm/issues/32626
/// https://github.com/vllm-project/vllm/pull/34009
/// https://github.com/NVIDIA/TensorRT-LLM/issues/15022
///
/// Token counts that do not fit the request count are typed
/// `BackendError::Batch` errors before any work (no panic, metadata and
/// pools unchanged); a ragged verify where some requests have 0 draft
/// tokens is valid and computes the others correctly.
#[test]
fn token_counts_that_do_not_fit_the_requests_are_typed_errors() {
    let mut m = Sim::new(dense_config(), 32626);
    let [a, bq] = m.prefill([6, 3]);
    let good = m.backend.metadata().unwrap().clone();
    let pools = m.backend.pools_snapshot();
    let (ra, rb) = (a as i64, bq as i64);
    let bads = [
        // 2 decode requests, 1 token.
        ForwardBatch::decode(vec![ra, rb], vec![7, 4], vec![5]),
        // Uniform verify: 3 tokens over 2 requests, and 0 tokens (draft length 0).
        ForwardBatch::target_verify(vec![ra, rb], vec![6, 3], vec![1, 2, 3], None),
        ForwardBatch::target_verify(vec![ra, rb], vec![6, 3], vec![], None),
        // Draft extend: tokens ≠ bs · q_len; q_len 0.
        ForwardBatch::draft_extend_v2(vec![ra, rb], vec![7, 4], vec![1, 2, 3], 2),
        ForwardBatch::draft_extend_v2(vec![ra, rb], vec![6, 3], vec![], 0),
        // Ragged verify lengths not summing to the tokens.
        ForwardBatch::target_verify(vec![ra, rb], vec![6, 3], vec![1, 2], Some(vec![2, 1])),
        // Extend lengths not summing to the tokens.
        ForwardBatch::extend(vec![ra], vec![6], vec![2], vec![9], false),
    ];
    for bad in &bads {
        match m.backend.init_forward_metadata(bad) {
            Err(BackendError::Batch { .. }) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(m.backend.metadata(), Some(&good));
    assert_eq!(m.backend.pools_snapshot(), pools);
    // Ragged verify with accept / draft length 0 for some requests.
    let c = m.new_request();
    m.extend(&[(c, 5)], false);
    m.verify(&[a, bq, c], &[0, 3, 0], true);
    m.verify(&[a, bq, c], &[2, 0, 1], true);
    // All zero: no rows, an empty output.
    let seq: Vec<i64> = [a, bq].iter().map(|&r| m.len(r) as i64).collect();
    let all_zero = ForwardBatch::target_verify(vec![ra, rb], seq, vec![], Some(vec![0, 0]));
    assert_eq!(
        m.backend
            .init_forward_metadata(&all_zero)
            .unwrap()
            .num_tokens,
        0
    );
    let out = m
        .backend
        .forward(0, TensorRef::Host(&[]), None, None, &all_zero, false)
        .unwrap();
    assert!(out.is_empty());
    m.assert_clean();
}

/// sglang-project/sglang issue #6088 (idle batches with DP attention crash)
/// and PR #34474 ("non-idle but empty": a TARGET_VERIFY rank with zero
/// requests crashed reshaping 0 elements), PR #7269 (idle draft inputs in
/// CUDA-graph replay).
/// https://github.com/sgl-project/sglang/issues/6088
/// https://github.com/sgl-project/sglang/pull/34474
/// https://github.com/sgl-project/sglang/pull/7269
///
/// On a hybrid SWA + FP8 model, every mode with zero requests (IDLE, IDLE
/// with draft spec info, empty verify / draft extend / extend / mixed)
/// succeeds with empty outputs on every layer and changes no pool or cache;
/// the multi-step draft backend accepts an IDLE draft batch too.
#[test]
fn empty_batches_in_every_mode_are_no_ops() {
    let mut c = hybrid_config();
    c.kv_dtype = KvCacheDtype::Fp8E4m3;
    c.layers[0] = c.layers[0].clone().with_scales(Some(0.5), Some(2.0));
    let mut m = Sim::new(c.clone(), 34474);
    m.prefill([7]);
    let pools = m.backend.pools_snapshot();
    let caches = m.caches();
    let idle_draft = ForwardBatch {
        spec_info: Some(SpecInfo::Draft { step: None }),
        ..ForwardBatch::idle()
    };
    let batches = [
        ForwardBatch::idle(),
        idle_draft.clone(),
        ForwardBatch::target_verify(vec![], vec![], vec![], None),
        ForwardBatch::target_verify(vec![], vec![], vec![], Some(vec![])),
        ForwardBatch::draft_extend_v2(vec![], vec![], vec![], 3),
        ForwardBatch::extend(vec![], vec![], vec![], vec![], false),
        ForwardBatch::extend(vec![], vec![], vec![], vec![], true),
    ];
    for batch in &batches {
        let meta = m.backend.init_forward_metadata(batch).unwrap();
        assert_eq!((meta.num_tokens, meta.batch_size), (0, 0), "{batch:?}");
        assert_eq!(meta.cu_seqlens_q, vec![0]);
        assert_eq!(meta.swa_out_cache_loc.as_deref(), Some(&[][..]));
        for layer in 0..3 {
            let out = m
                .backend
                .forward(
                    layer,
                    TensorRef::Host(&[]),
                    Some(TensorRef::Host(&[])),
                    Some(TensorRef::Host(&[])),
                    batch,
                    true,
                )
                .unwrap();
            assert!(out.is_empty(), "{batch:?} layer {layer}");
        }
    }
    assert_eq!(m.backend.pools_snapshot(), pools);
    for (l, s) in caches.iter().enumerate() {
        assert_eq!(&m.backend.read_kv_cache(l).unwrap(), s);
    }
    assert_eq!(ForwardMode::Idle as u8, 4);
    let mut d = MultiStepDraftBackend::new(c, Device::Cpu).unwrap();
    d.init_forward_metadata(&idle_draft).unwrap();
    for (i, s) in d.steps().iter().enumerate() {
        let meta = s.metadata().unwrap();
        assert_eq!(meta.mode, AttnMode::DraftDecode { step: i as u32 });
        assert_eq!(meta.num_tokens, 0);
    }
    m.assert_clean();
}

/// sglang-project/sglang PR #16267 ("Add swa page table to FA3 backend
/// forward metadata": the SWA page table for `page_size > 1` must translate
/// the page's first token location, not the page id).
/// https://github.com/sgl-project/sglang/pull/16267
///
/// With P = 4 and full and SWA pages allocated in a different order
/// (requests interleaved, some pages evicted), SWA page-table entry `j` of
/// a row is `map[req_to_token[r, 4j]] / 4` — and for every live position
/// `t` the SWA slot is `swa_page · 4 + t % 4`; evicted pages are 0. The
/// SWA layer's attention over them equals the direct computation.
#[test]
fn swa_page_table_translates_token_locations_not_page_ids() {
    let mut m = Sim::new(hybrid_config(), 16267);
    let reqs: Vec<usize> = (0..3).map(|_| m.new_request()).collect();
    // Interleaved growth: full and SWA page ids diverge.
    m.extend(&[(reqs[0], 3), (reqs[1], 6)], false);
    m.extend(&[(reqs[2], 5), (reqs[0], 7)], false);
    let len0 = m.len(reqs[0]);
    m.backend.evict_swa(reqs[0], len0).unwrap();
    m.extend(&[(reqs[1], 4), (reqs[0], 2)], true);
    let (batch, parts) = m.decode_batch(&reqs);
    let meta = m.backend.reference_metadata(&batch).unwrap();
    let (map, r2t_slots): (Vec<i64>, Vec<Vec<i32>>) = m.backend.with_pools(|p| {
        (
            p.swa_mapping().unwrap().map().to_vec(),
            reqs.iter()
                .map(|&r| p.request_slots(r).unwrap().to_vec())
                .collect(),
        )
    });
    let mut diverged = false;
    let mut evicted = false;
    for (i, slots) in r2t_slots.iter().enumerate() {
        let row = meta.swa_page_row(i, 4).unwrap();
        assert_eq!(row.len(), slots.len().div_ceil(4));
        for (j, &sp) in row.iter().enumerate() {
            let want = map[slots[4 * j] as usize] / 4;
            assert_eq!(i64::from(sp), want, "row {i} page {j}");
            diverged |= i64::from(sp) != i64::from(slots[4 * j] / 4);
            evicted |= sp == 0;
            for t in 4 * j..slots.len().min(4 * j + 4) {
                let swa = map[slots[t] as usize];
                if sp == 0 {
                    assert_eq!(swa, 0, "evicted page keeps no slot");
                } else {
                    assert_eq!(swa, i64::from(sp) * 4 + (t % 4) as i64, "row {i} pos {t}");
                }
            }
        }
    }
    assert!(diverged && evicted, "the scenario must separate page ids");
    // The SWA write slots are the translated out_cache_loc (sglang #23552).
    let want: Vec<i64> = batch
        .out_cache_loc
        .iter()
        .map(|&l| map[l as usize])
        .collect();
    assert_eq!(meta.swa_out_cache_loc.as_deref(), Some(&want[..]));
    m.run(&batch, &parts);
    m.assert_clean();
}

/// sglang-project/sglang PR #23552 (hybrid SWA models: the SWA cache
/// locations of a pass are translated once, before the layers, instead of
/// per layer) and PR #29843 (the fused graph-metadata rebuild keeps the
/// `-1` sentinel of `swa_out_cache_loc`), with sglang PR #23984 (full-pool
/// indices used on an SWA layer overflow its smaller pool).
/// https://github.com/sgl-project/sglang/pull/23552
/// https://github.com/sgl-project/sglang/pull/29843
/// https://github.com/sgl-project/sglang/pull/23984
///
/// A padded decode batch whose padding tokens carry `out_cache_loc = −1`:
/// the SWA locations are the map's entries with −1 kept, the −1 writes go
/// nowhere (every cache byte but the real rows' slots unchanged), the SWA
/// layer writes its K/V at the translated slot (never at the full-pool
/// slot, which lies outside the smaller SWA pool here), and the real rows
/// equal the direct computation.
#[test]
fn swa_write_locations_are_translated_once_and_keep_the_minus_one_sentinel() {
    let mut c = hybrid_config();
    c.num_pages = 60;
    c.num_swa_pages = Some(12);
    let mut m = Sim::new(c, 23552);
    let reqs: Vec<usize> = (0..2).map(|_| m.new_request()).collect();
    // Burn full pages so full slots exceed the SWA pool's 13 pages · 4.
    let filler = m.new_request();
    m.extend(&[(filler, 24)], false);
    m.backend.evict_swa(filler, 24).unwrap();
    m.extend(&[(reqs[0], 30), (reqs[1], 5)], false);
    m.backend.evict_swa(reqs[0], 30).unwrap();
    let before = m.caches();
    let (decode, parts) = m.decode_batch(&reqs);
    let (seq, real) = (&decode.seq_lens, &decode.out_cache_loc);
    let swa_pool_slots = m.backend.with_pools(|p| p.swa_slots().unwrap()) as i64;
    assert!(real.iter().any(|&l| l >= swa_pool_slots), "{real:?}");
    let batch = ForwardBatch {
        batch_size: 4,
        req_pool_indices: vec![reqs[0] as i64, reqs[1] as i64, 0, 0],
        seq_lens: vec![seq[0], seq[1], 1, 1],
        out_cache_loc: real.iter().copied().chain([-1, -1]).collect(),
        ..decode.clone()
    };
    let map = m
        .backend
        .with_pools(|p| p.swa_mapping().unwrap().map().to_vec());
    let meta = m.backend.reference_metadata(&batch).unwrap();
    let want: Vec<i64> = real
        .iter()
        .map(|&l| map[l as usize])
        .chain([-1, -1])
        .collect();
    assert_eq!(meta.swa_out_cache_loc.as_deref(), Some(&want[..]));
    m.run(&batch, &parts);
    // Only the real rows' slots changed, in each layer's own pool.
    for (layer, old) in before.iter().enumerate() {
        let kv = 128 / if layer == 2 { 2 } else { 1 };
        let written: Vec<usize> = if layer == 1 {
            want[..2].iter().map(|&s| s as usize).collect()
        } else {
            real.iter().map(|&s| s as usize).collect()
        };
        let (KvSnapshot::Half { k: ok, .. }, KvSnapshot::Half { k: nk, .. }) =
            (old, m.backend.read_kv_cache(layer).unwrap())
        else {
            panic!()
        };
        assert_eq!(ok.len(), nk.len());
        for (s, (a, b)) in ok.chunks(kv).zip(nk.chunks(kv)).enumerate() {
            if !written.contains(&s) {
                assert_eq!(a, b, "layer {layer} slot {s} changed");
            }
        }
    }
}

/// sglang-project/sglang PR #8834 (attention sinks for gpt-oss with the
/// trtllm-gen backend: per-head sink logits join the softmax denominator,
/// on the layers that have them).
/// https://github.com/sgl-project/sglang/pull/8834
///
/// A model whose sink layer is a windowed layer between full layers: the
/// sinks apply to that layer only, per head, in extend, decode, uniform
/// and ragged verify and draft extend, and change the output (the same
/// pass without sinks is measurably different).
#[test]
fn sinks_apply_per_head_on_their_layer_only_in_every_mode() {
    let mut c = hybrid_config();
    c.layers[1].sinks = Some(vec![2.0, -3.0, 0.25, 4.0]);
    c.layers[2] = LayerConfig::new(4, 1, 64).with_sinks(vec![-0.5, 1.0, 3.0, 0.0]);
    let mut m = Sim::new(c, 8834);
    let a = m.new_request();
    let bq = m.new_request();
    let parts = m.parts(&[(a, 9), (bq, 4)]);
    let outs = m.extend(&[(a, 9), (bq, 4)], false);
    m.decode(&[a, bq]);
    m.verify(&[a, bq], &[3, 3], false);
    m.verify(&[a, bq], &[1, 3], true);
    // Sinks matter: without them layer 1's extend output differs (the
    // direct computation reads only positions ≤ each row's, so the record
    // grown since is fine).
    let sinks = m.config.layers[1].sinks.take();
    let other = m.direct(1, &parts, &outs[1].0, None);
    m.config.layers[1].sinks = sinks;
    assert!(max_rel_err(&outs[1].1, &other, 64) > 2e-2);
    m.assert_clean();
}

/// flashinfer-ai/flashinfer issue #1898 (trtllm-gen decode produced wrong
/// outputs at batch size 1).
/// https://github.com/flashinfer-ai/flashinfer/issues/1898
///
/// Batch size 1 decodes with the widest GQA group (Hq / Hkv = 16) over a
/// context spanning many pages, D = 128 and 256, against the direct
/// computation at every step.
#[test]
fn batch_size_one_decode_with_a_wide_gqa_group() {
    let mut c = BackendConfig::dense(1, LayerConfig::new(16, 1, 128), 4, 160, 64, 2);
    c.layers.push(LayerConfig::new(32, 2, 256));
    let mut m = Sim::new(c, 1898);
    let [a] = m.prefill([117]);
    for _ in 0..5 {
        m.decode(&[a]);
    }
    m.assert_clean();
}

/// tenstorrent/tt-metal PR #55630 (a resumed chunked prefill built its page
/// table from the chunk's own width and attended to the request's first
/// blocks instead of its cached prefix) and sglang-project/sglang PR
/// #35635 (prefixes that end inside a page).
/// https://github.com/tenstorrent/tt-metal/pull/55630
/// https://github.com/sgl-project/sglang/pull/35635
///
/// Chunked prefill with P = 4 whose prefixes (5, 11, 6) are not page
/// multiples, two requests per chunk and a mixed pass with a decode row:
/// the page tables cover `ceil((prefix + extend) / 4)` pages (the cached
/// prefix included), `cu_seqlens_q` are the extend sums, and every row —
/// at positions `prefix + j` — equals the direct computation (including
/// the SWA layer's window across the chunk boundary).
#[test]
fn chunked_prefill_with_prefixes_inside_a_page() {
    let mut m = Sim::new(hybrid_config(), 55630);
    let [a, bq] = m.prefill([5, 11]);
    m.extend(&[(a, 6), (bq, 7)], false);
    let meta = m.backend.metadata().unwrap().clone();
    assert_eq!(meta.cache_seqlens, vec![11, 18]);
    assert_eq!(meta.cu_seqlens_q, vec![0, 6, 13]);
    assert_eq!(meta.max_seq_len_q, 7);
    assert_eq!(meta.page_row(0, 4).len(), 3);
    assert_eq!(meta.page_row(1, 4).len(), 5);
    for (i, r) in [a, bq].into_iter().enumerate() {
        assert_eq!(meta.page_row(i, 4), &m.pages(r)[..]);
    }
    // Mixed: a 3-token chunk of `a` (prefix 11) with a decode row of `bq`.
    m.extend(&[(a, 3), (bq, 1)], true);
    assert_eq!(
        m.backend.metadata().unwrap().forward_mode,
        ForwardMode::Mixed
    );
    m.assert_clean();
}

/// vllm-project/vllm PR #39324 and flashinfer-ai/flashinfer issue #3915 /
/// PR #3916 (an unusual max-model-len gives a block table whose native
/// width `ceil(max_len / page_size)` the TRTLLM kernels must accept), with
/// NVIDIA/TensorRT-LLM issue #600 (`max_context_len <= mMaxContextLength`
/// assertion at run time).
/// https://github.com/vllm-project/vllm/pull/39324
/// https://github.com/flashinfer-ai/flashinfer/issues/3915
/// https://github.com/NVIDIA/TensorRT-LLM/issues/600
///
/// `context_len = 97`, P = 4: `M = 25`; a request reaching exactly 97
/// tokens decodes correctly with a 25-entry row; growing past it is
/// `ContextOverflow`; a batch claiming 98 tokens (decode, or a draft step
/// whose `seq + s + 1` passes it) is a typed `Batch` error, never a panic
/// or a clamped silent answer.
#[test]
fn odd_context_length_gives_the_native_page_table_width() {
    let mut c = dense_config();
    c.context_len = 97;
    c.num_pages = 40;
    let mut m = Sim::new(c, 39324);
    assert_eq!(m.backend.max_num_pages(), 25);
    let [a] = m.prefill([90]);
    for _ in 0..7 {
        m.decode(&[a]);
    }
    assert_eq!(m.len(a), 97);
    let meta = m.backend.metadata().unwrap();
    assert_eq!(meta.max_num_pages, 25);
    assert_eq!(meta.page_row(0, 4).len(), 25);
    assert!(matches!(
        m.backend.alloc_tokens(&[(a, 1)]),
        Err(BackendError::ContextOverflow {
            context_len: 97,
            ..
        })
    ));
    let slot = m.backend.with_pools(|p| p.request_slots(a).unwrap()[96]);
    for bad in [
        ForwardBatch::decode(vec![a as i64], vec![98], vec![i64::from(slot)]),
        ForwardBatch::draft_decode(vec![a as i64], vec![96], vec![i64::from(slot)], Some(1)),
        ForwardBatch::target_verify(vec![a as i64], vec![96], vec![1, 2], None),
    ] {
        match m.backend.init_forward_metadata(&bad) {
            Err(BackendError::Batch {
                field: "seq_lens", ..
            }) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    m.assert_clean();
}

/// vllm-project/vllm issue #25172 (an attention backend without
/// encoder–decoder support must refuse cross attention with an error, not
/// compute something) and NVIDIA/TensorRT-LLM issue #285 (cross attention
/// silently wrong). The backend has no cross-attention mode: K/V of an
/// encoder length (≠ the pass's query rows) is a typed error and writes
/// nothing.
/// https://github.com/vllm-project/vllm/issues/25172
/// https://github.com/NVIDIA/TensorRT-LLM/issues/285
#[test]
fn encoder_length_kv_is_refused_before_any_write() {
    let mut m = Sim::new(dense_config(), 25172);
    let [a] = m.prefill([4]);
    let loc = m.grow(&[(a, 2)]);
    let batch = ForwardBatch::extend(vec![a as i64], vec![4], vec![2], loc, false);
    m.backend.init_forward_metadata(&batch).unwrap();
    let before = m.backend.read_kv_cache(0).unwrap();
    let q = vec![bf16(0.5); 2 * 256];
    let enc_kv = vec![bf16(1.0); 7 * 128]; // 7 encoder tokens
    let r = m.backend.forward(
        0,
        TensorRef::Host(&q),
        Some(TensorRef::Host(&enc_kv)),
        Some(TensorRef::Host(&enc_kv)),
        &batch,
        true,
    );
    assert!(matches!(r, Err(BackendError::Kernel(_))), "{r:?}");
    // Only one of K / V: a typed batch error.
    let r = m.backend.forward(
        0,
        TensorRef::Host(&q),
        Some(TensorRef::Host(&enc_kv[..2 * 128])),
        None,
        &batch,
        true,
    );
    assert!(matches!(r, Err(BackendError::Batch { .. })), "{r:?}");
    assert_eq!(m.backend.read_kv_cache(0).unwrap(), before);
}

/// sglang-project/sglang issue #8649 (chunk-cache SWA eviction freed tokens
/// still inside the sliding window) and PR #22469 (SWA eviction
/// over-evicted when `page_size > sliding_window_size`; chunked prefill
/// boundaries page-aligned), with pytorch/executorch PR #20346 (a prefill
/// chunk longer than the window lost the previous chunk's in-window keys).
/// https://github.com/sgl-project/sglang/issues/8649
/// https://github.com/sgl-project/sglang/pull/22469
/// https://github.com/pytorch/executorch/pull/20346
///
/// P = 16 > window 5: chunks of 20, 13 and 7 tokens (each longer than the
/// window, boundaries inside pages) with SWA eviction before every chunk
/// and decode step; after each eviction the oldest key the next row sees
/// keeps its SWA slot, and every row of every layer equals the direct
/// computation.
#[test]
fn swa_eviction_with_pages_larger_than_the_window() {
    let mut c = hybrid_config();
    c.page_size = 16;
    c.context_len = 128;
    c.num_pages = 24;
    c.num_swa_pages = Some(8);
    let mut m = Sim::new(c, 22469);
    let a = m.new_request();
    let bq = m.new_request();
    let mut evicted = 0;
    for chunk in [20, 13, 7] {
        evicted += m.evict_swa_keeping(a, 5) + m.evict_swa_keeping(bq, 5);
        m.extend(&[(a, chunk), (bq, chunk / 2 + 1)], false);
    }
    for _ in 0..20 {
        evicted += m.evict_swa_keeping(a, 5) + m.evict_swa_keeping(bq, 5);
        m.decode(&[a, bq]);
    }
    assert!(
        evicted >= 3,
        "the scenario must evict SWA pages ({evicted})"
    );
    m.assert_clean();
}

/// lablup/mlxcel PR #183 (a prompt-cache hit left a chunk of 0 tokens that
/// crashed the model) and lightseekorg/tokenspeed PR #315 (in a MIXED batch
/// `extend_prefix_lens` covered only the prefill rows, so prefix lengths
/// were broadcast onto decode rows and `cu_seqlens_q` went wrong).
/// https://github.com/lablup/mlxcel/pull/183
/// https://github.com/lightseekorg/tokenspeed/pull/315
///
/// A MIXED pass with a request contributing 0 new tokens, one decode row
/// and one prefill chunk, `extend_prefix_lens` left to be derived as
/// `seq_lens − extend_seq_lens`: `cu_seqlens_q = [0, 0, 1, 4]` and the
/// rows equal the direct computation; prefix lengths for only some rows
/// are a typed error.
#[test]
fn mixed_pass_with_an_empty_chunk_and_derived_prefixes() {
    let mut m = Sim::new(hybrid_config(), 315);
    let reqs = m.prefill([6, 9, 2]);
    let grow = [(reqs[0], 0), (reqs[1], 1), (reqs[2], 3)];
    let loc = m.grow(&grow);
    let seq: Vec<i64> = grow.iter().map(|&(r, n)| (m.len(r) + n) as i64).collect();
    let batch = ForwardBatch {
        forward_mode: ForwardMode::Mixed,
        batch_size: 3,
        req_pool_indices: ids(&reqs),
        seq_lens: seq,
        out_cache_loc: loc,
        extend_seq_lens: Some(vec![0, 1, 3]),
        extend_prefix_lens: None,
        spec_info: None,
    };
    let partial = ForwardBatch {
        extend_prefix_lens: Some(vec![9]),
        ..batch.clone()
    };
    assert!(matches!(
        m.backend.init_forward_metadata(&partial),
        Err(BackendError::Batch {
            field: "extend_prefix_lens",
            ..
        })
    ));
    let meta = m.backend.reference_metadata(&batch).unwrap();
    assert_eq!(meta.cu_seqlens_q, vec![0, 0, 1, 4]);
    assert_eq!(meta.cache_seqlens, vec![6, 10, 5]);
    assert_eq!(meta.max_seq_len_q, 3);
    let parts = m.parts(&grow);
    m.run(&batch, &parts);
    m.assert_clean();
}

/// sglang-project/sglang PRs #34636 / #39257 (compact ragged target-verify
/// CUDA graphs captured a tier's slots as `min(num_tokens, max_bs)` rows of
/// one token, so a batch of 7 requests × 6 tokens staged into an 8-slot
/// tier got `verify_lens = [6, 6, 5, 5, 5, 5, 5, 5]` instead of its own
/// lengths — illegal memory access on replay) and GeeeekExplorer/nano-vllm
/// PR #216 (a batch larger than every captured bucket crashed with
/// `StopIteration`).
/// https://github.com/sgl-project/sglang/pull/34636
/// https://github.com/sgl-project/sglang/pull/39257
/// https://github.com/GeeeekExplorer/nano-vllm/pull/216
///
/// Padding a ragged verify to a bucket keeps every real row's length, puts
/// the leftover on padding rows (SEMANTICS.md §backend.5: `leftover / pads`,
/// one more for the first `leftover % pads`), refuses a bucket whose padding
/// rows would exceed `N` with a typed error, and the padded pass computes
/// the real rows exactly. Bucket keys of impossible shapes and graph calls
/// on the CPU executor are typed errors, never a panic or an eager fallback.
#[test]
fn ragged_verify_padding_keeps_each_requests_own_lengths() {
    use mha_backend::{GraphKey, GraphKind};
    let mut c = hybrid_config();
    c.spec = spec(6);
    c.context_len = 128;
    let mut m = Sim::new(c, 34636);
    let reqs: Vec<usize> = (0..7).map(|_| m.new_request()).collect();
    let grow: Vec<(usize, usize)> = reqs.iter().map(|&r| (r, 2 + r)).collect();
    m.extend(&grow, false);
    let seq: Vec<i64> = reqs.iter().map(|&r| m.len(r) as i64).collect();
    let loc = m.grow(&each(&reqs, 6));
    let batch = ForwardBatch::target_verify(ids(&reqs), seq, loc, Some(vec![6; 7]));
    let lens = |b: &ForwardBatch| b.verify_lens().unwrap().to_vec();
    // The 8-slot tier of 48 tokens: real rows keep 6, the padding row takes 6.
    let p = batch.pad_to_bucket(8, 48, 6).unwrap();
    assert_eq!(lens(&p), vec![6; 8]);
    // Upstream's bs = num_tokens keying: padding rows get 0 or 1 token.
    let p64 = batch.pad_to_bucket(64, 64, 6).unwrap();
    let l = lens(&p64);
    assert_eq!(&l[..7], &[6; 7]);
    assert_eq!(l.iter().sum::<i32>(), 64);
    let pads = 57;
    let leftover = 64 - 42;
    for (k, &x) in l[7..].iter().enumerate() {
        let want = leftover / pads + i32::from((k as i32) < leftover % pads);
        assert_eq!(x, want, "padding row {k}");
    }
    // 8 slots of at most 6 cannot hold 49 tokens / a padding row of 7.
    assert!(matches!(
        batch.pad_to_bucket(8, 49, 6),
        Err(BackendError::Kernel(_))
    ));
    assert!(matches!(
        GraphKey::new(GraphKind::RaggedVerify, 8, 49, Some(6)),
        Err(BackendError::GraphUnsupported(_))
    ));
    assert_eq!(
        GraphKey::new(GraphKind::RaggedVerify, 8, 48, Some(6))
            .unwrap()
            .q_len,
        6
    );
    for bad in [
        GraphKey::new(GraphKind::Decode, 4, 5, None),
        GraphKey::new(GraphKind::TargetVerify, 4, 10, None),
        GraphKey::new(GraphKind::RaggedVerify, 4, 4, None),
        GraphKey::new(GraphKind::Decode, 0, 0, None),
    ] {
        assert!(
            matches!(bad, Err(BackendError::GraphUnsupported(_))),
            "{bad:?}"
        );
    }
    // No captured bucket (CPU executor): typed errors.
    assert!(matches!(
        m.backend.select_cuda_graph(&batch),
        Err(BackendError::GraphUnsupported(_))
    ));
    assert!(matches!(
        m.backend.init_cuda_graph_state(8, 48),
        Err(BackendError::GraphUnsupported(_))
    ));
    // The padded pass: real rows against the direct computation.
    let parts = m.parts(&each(&reqs, 6));
    m.run(&p, &parts);
    let meta = m.backend.metadata().unwrap();
    assert_eq!(meta.max_seq_len_q, 6);
    assert!(meta.is_ragged_verify);
}
