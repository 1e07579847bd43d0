//! CPU tests of the paged-attention family: the "Must pass" examples
//! and edge cases 20–27 (SEMANTICS.md §edge-cases) on the f64 reference, reference properties
//! (proptest), launch geometry, params layout, PTX entry names and freshness.

#![allow(clippy::needless_range_loop)]

mod common;

use common::*;
use kernel_rt::ErrorReport;
use paged_attention::{
    kernel_names, launch_config, mma_smem_bytes, smem_bytes, workspace_elems, ErrorFlags,
    HalfDtype, KvDtype, PagedAttentionParams, SplitMode, BLOCK_THREADS, PTX,
};
use proptest::prelude::*;

fn close(got: f64, want: f64, tol: f64) {
    assert!((got - want).abs() <= tol, "got {got}, want {want}");
}

/// Issue 5, window: P 4, seq_len 6, page row [1, 2], V[t] = t.
#[test]
fn must_pass_window() {
    for (w, want) in [(Some(3), 3.5), (Some(0), 5.0), (Some(2), 4.0), (None, 2.5)] {
        let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[6], Some(1), 1, |_, t| t as f64);
        c.page_table = vec![1, 2];
        for t in 0..6 {
            let s = c.slot(0, t);
            c.set_v(s, 0, 0, t as f64);
        }
        c.window = w;
        let r = c.reference();
        close(r.out[0], want, 1e-12);
        assert!(r.errors.is_clean());
    }
}

/// Issue 5, sinks: seq_len 4, V = [1,2,3,4].
#[test]
fn must_pass_sinks() {
    for (w, sink, want) in [
        (None, 0.0f32, 2.0),
        (None, 4f32.ln(), 1.25),
        (Some(1), 0.0, 7.0 / 3.0),
    ] {
        let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[4], Some(1), 1, |_, t| {
            t as f64 + 1.0
        });
        c.window = w;
        c.sinks = Some(vec![sink]);
        close(c.reference().out[0], want, 1e-6);
    }
}

/// Issue 5: the sink stays raw under FP8 scales → 2.0, not 1.2716.
#[test]
fn must_pass_fp8_sink_raw() {
    let c = fp8_sink_example(1);
    close(c.reference().out[0], 2.0, 1e-12);
}

/// Issue 5, verify uniform: q_len 3 (G 1), then q_len 5, 6, 7 with G 8.
#[test]
fn must_pass_verify_uniform() {
    let c = verify_uniform_example(1, 3, 1);
    let r = c.reference();
    for (row, want) in [2.0, 2.5, 3.0, 11.0, 11.5, 12.0].into_iter().enumerate() {
        close(c.at(&r.out, row, 0, 0), want, 1e-12);
    }
    for n in [5, 6, 7] {
        let c = verify_uniform_example(1, n, 8);
        let r = c.reference();
        for j in 0..n {
            for h in 0..8 {
                close(c.at(&r.out, j, h, 0), (4 + j) as f64 / 2.0, 1e-12);
                close(
                    c.at(&r.out, n + j, h, 0),
                    10.0 + (2 + j) as f64 / 2.0,
                    1e-12,
                );
            }
        }
    }
}

/// Issue 5, verify ragged: bucket 4, lengths [2,2,0,0].
#[test]
fn must_pass_verify_ragged() {
    let c = verify_ragged_example(1);
    let r = c.reference();
    for (row, want) in [1.5, 2.0, 12.5, 13.0].into_iter().enumerate() {
        close(c.at(&r.out, row, 0, 0), want, 1e-12);
    }
    assert!(r.written.iter().all(|&w| w));
    assert!(r.errors.is_clean());
}

/// Issue 5: one KV head, 2 q heads, head stride 2 (canonical 4), page row [2, 0].
#[test]
fn must_pass_gqa_head_stride() {
    let c = gqa_stride_example(2);
    let r = c.reference();
    close(c.at(&r.out, 0, 0, 0), 1.26696, 1e-5);
    close(c.at(&r.out, 0, 0, 1), 1.0, 1e-12);
    close(c.at(&r.out, 0, 1, 0), 1.0, 1e-12);
    close(c.at(&r.out, 0, 1, 1), 1.26696, 1e-5);
}

/// Issue 5, split determinism data: seq_len 5000, V[t] = t mod 7 → 2.999.
#[test]
fn must_pass_long_mean() {
    let c = uniform_weights_case(KvDtype::Bf16, 1, 1, 16, &[5000], Some(1), 1, |_, t| {
        (t % 7) as f64
    });
    let r = c.reference();
    close(r.out[0], 2.999, 1e-12);
    assert_eq!(half::bf16::from_f64(r.out[0]).to_f64(), 3.0);
}

/// SEMANTICS.md §attention.11 and edge cases 20, 21, 25, 26 (SEMANTICS.md §edge-cases).
#[test]
fn spec_worked_example() {
    let check = |c: &Case, row: usize, h0: [f64; 2], h1: Option<[f64; 2]>| {
        let r = c.reference();
        for dd in 0..2 {
            close(c.at(&r.out, row, 0, dd), h0[dd], 1e-6);
            if let Some(h1) = h1 {
                close(c.at(&r.out, row, 1, dd), h1[dd], 1e-6);
            }
        }
    };
    check(
        &worked_example(2, 1, None, None, 1.0),
        0,
        [1.249626, 0.305656],
        Some([1.144450, 0.431872]),
    );
    check(
        &worked_example(2, 1, Some(2), None, 1.0),
        0,
        [1.606178, 0.393822],
        Some([1.618212, 0.381788]),
    );
    let v = worked_example(2, 2, Some(2), None, 1.0);
    check(&v, 0, [1.239970, 0.454335], Some([0.584092, 1.123862]));
    check(&v, 1, [1.606178, 0.393822], Some([1.618212, 0.381788]));
    check(
        &worked_example(2, 1, None, Some(vec![0.5, -1.0]), 1.0),
        0,
        [1.092908, 0.267323],
        Some([1.102102, 0.415891]),
    );
    check(
        &worked_example(2, 1, None, None, 2.0),
        0,
        [2.499252, 0.611312],
        None,
    );
    check(
        &worked_example(2, 1, Some(100), None, 1.0),
        0,
        [1.249626, 0.305656],
        None,
    );
}

/// edge cases 22 (SEMANTICS.md §edge-cases) (W = 0 → self only) and 24 (fewer keys than rows → zeros).
#[test]
fn self_only_window_and_empty_rows() {
    let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[5], Some(2), 2, |_, t| t as f64);
    c.window = Some(0);
    let r = c.reference();
    close(r.out[0], 3.0, 0.0);
    close(r.out[1], 4.0, 0.0);
    let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[1], Some(2), 2, |_, _| 7.0);
    c.sinks = Some(vec![0.5]);
    let r = c.reference();
    assert_eq!(
        r.out[0], 0.0,
        "row at position -1 sees nothing: zeros even with a sink"
    );
    close(r.out[1], 7.0 / (1.0 + (0.5f64).exp()), 1e-6);
}

/// D10: invalid page ids are masked and counted once per needed page; D13 zeros.
#[test]
fn invalid_pages_are_masked_and_counted() {
    let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[10], Some(1), 1, |_, t| t as f64);
    c.page_table[1] = -1; // positions 4..7 masked
    let r = c.reference();
    close(r.out[0], 23.0 / 6.0, 1e-12);
    assert_eq!(
        r.errors,
        ErrorReport {
            count: 1,
            flags: ErrorFlags::BAD_PAGE.bits()
        }
    );
    c.page_table = vec![99, 98, 97];
    let r = c.reference();
    assert_eq!(r.out[0], 0.0);
    assert_eq!(r.errors.count, 3);
}

/// Ragged-mode checks: bad or overlapping cu_seqlens skipped, too long
/// requests skipped, negative L read as 0 — each counted once.
#[test]
fn ragged_device_checks_are_counted() {
    let mut c = verify_ragged_example(1);
    c.cu = vec![0, 2, 1, 1, 1];
    let r = c.reference();
    // Request 1 has end < start; requests 2 and 3 start below cu[1] = 2.
    assert_eq!(
        r.errors,
        ErrorReport {
            count: 3,
            flags: ErrorFlags::BAD_CU_SEQLENS.bits()
        }
    );
    assert!(r.written[0] && r.written[1] && !r.written[2] && !r.written[3]);
    let mut c = verify_ragged_example(1);
    c.cu = vec![0, 3, 4, 4, 4];
    c.lens[2] = -5;
    let r = c.reference();
    assert_eq!(
        r.errors,
        ErrorReport {
            count: 2,
            flags: ErrorFlags::Q_LEN_TOO_LONG.bits() | ErrorFlags::NEGATIVE_SEQLEN.bits()
        }
    );
    assert!(
        !r.written[0] && !r.written[1] && !r.written[2],
        "request 0 (3 rows > max_q_len 2) is skipped"
    );
    assert!(r.written[3]);
}

/// The GPU proptest failure `seed 15241479058792931755`: q F16, kv Bf16, D 64,
/// Hq 16, Hkv 2, P 1, lens [24, 33, 30, 31], ragged `cu = [0, 1, 2, 1, 2]`,
/// max_q 1. Request 2 has end < start and request 3 re-uses row 1 of request
/// 1 (cu[3] = 1 < cu[2] = 2): both are skipped, so row 1 is written once, by
/// request 1, exactly as if requests 2 and 3 were empty.
#[test]
fn overlapping_cu_seqlens_seed_15241479058792931755() {
    let (c, _, _) = random_case(15_241_479_058_792_931_755);
    assert_eq!(
        (
            c.q_dtype,
            c.kv_dtype,
            c.d,
            c.hq,
            c.hkv,
            c.p,
            c.num_pages,
            c.m
        ),
        (HalfDtype::F16, KvDtype::Bf16, 64, 16, 2, 1, 136, 33)
    );
    assert_eq!(c.lens, [24, 33, 30, 31]);
    assert_eq!(c.cu, [0, 1, 2, 1, 2]);
    assert_eq!(
        (c.uniform, c.max_q_len, c.window, c.sinks.is_some()),
        (None, 1, None, false)
    );
    let r = c.reference();
    assert_eq!(
        r.errors,
        ErrorReport {
            count: 2,
            flags: ErrorFlags::BAD_CU_SEQLENS.bits()
        }
    );
    assert_eq!(r.written, [true, true]);
    let mut fixed = c.clone();
    fixed.cu = vec![0, 1, 2, 2, 2];
    let want = fixed.reference();
    assert!(want.errors.is_clean());
    assert_eq!(r.out, want.out, "row 1 is request 1's alone");
}

/// Rebuilds a GPU proptest case from its seed and runs the GPU test's exact
/// comparison ([`compare`]) with an exact device's output: it fails (rel err
/// NaN, "want NaN") whenever the reference reads a NaN/Inf-poisoned key.
fn seed_case_compares_clean(seed: u64) -> Case {
    let (c, _, _) = random_case(seed);
    visible_keys_are_finite(&c).unwrap();
    let want = c.reference();
    for (row, &w) in want.written.iter().enumerate() {
        let o = &want.out[row * c.hq * c.d..(row + 1) * c.hq * c.d];
        assert!(!w || o.iter().all(|x| x.is_finite()), "row {row}");
    }
    compare(&c, &want, &ideal_device_output(&c, &want), &want.errors).unwrap();
    c
}

/// The GPU proptest failure `seed 15262499740901626710` (row 0: got NaN, want
/// NaN): q Bf16, kv Bf16, D 128, Hq 8, Hkv 1, P 5, W 129, lens
/// [204, 173, 217, 187], `cu = [0, 1, 0, 2, 3]`. The rows were drawn as
/// [0, 1, 1, 1] (`cu = [0, 0, 1, 2, 3]`), then the final bad-array edit
/// swapped cu[1] and cu[2]: request 0 gained a row at x = 203 that sees keys
/// 74..=203, but `random_case` had filled keys from 204 − 0 − 129 = 75 only,
/// leaving key 74 NaN. Requests 1 (end < start) and 2 (start below cu[1])
/// are skipped; request 3 writes row 2.
#[test]
fn window_ragged_seed_15262499740901626710() {
    let c = seed_case_compares_clean(15_262_499_740_901_626_710);
    assert_eq!(
        (
            c.q_dtype,
            c.kv_dtype,
            c.d,
            c.hq,
            c.hkv,
            c.p,
            c.num_pages,
            c.m
        ),
        (HalfDtype::Bf16, KvDtype::Bf16, 128, 8, 1, 5, 183, 45)
    );
    assert_eq!(c.lens, [204, 173, 217, 187]);
    assert_eq!(c.cu, [0, 1, 0, 2, 3]);
    assert_eq!(
        (c.uniform, c.max_q_len, c.window, c.sinks.is_some()),
        (None, 1, Some(129), false)
    );
    let r = c.reference();
    assert_eq!(
        r.errors,
        ErrorReport {
            count: 2,
            flags: ErrorFlags::BAD_CU_SEQLENS.bits()
        }
    );
    assert_eq!(r.written, [true, false, true]);
    let key74 = c.kv_index(c.slot(0, 74), 0, 0);
    assert!(c.decode_kv(c.k[key74]).is_finite() && c.decode_kv(c.v[key74]).is_finite());
}

/// The GPU proptest failure `seed 15297217940233036951` (row 0: got NaN, want
/// NaN): q F16, kv Bf16, D 256, Hq 4, Hkv 1, P 16, W 54, lens [165, 275],
/// `cu = [0, 2, 2]` (request 1 has no rows). The rows were drawn as [1, 1];
/// the `cu[1] += 1` edit gave request 0 a second row, at x = 163, which sees
/// keys 109..=163, but keys were filled from 165 − 1 − 54 = 110 only.
#[test]
fn window_ragged_seed_15297217940233036951() {
    let c = seed_case_compares_clean(15_297_217_940_233_036_951);
    assert_eq!(
        (
            c.q_dtype,
            c.kv_dtype,
            c.d,
            c.hq,
            c.hkv,
            c.p,
            c.num_pages,
            c.m
        ),
        (HalfDtype::F16, KvDtype::Bf16, 256, 4, 1, 16, 37, 18)
    );
    assert_eq!(c.lens, [165, 275]);
    assert_eq!(c.cu, [0, 2, 2]);
    assert_eq!(
        (c.uniform, c.max_q_len, c.window, c.sinks.is_some()),
        (None, 12, Some(54), false)
    );
    let r = c.reference();
    assert!(r.errors.is_clean());
    assert_eq!(r.written, [true, true]);
    let key109 = c.kv_index(c.slot(0, 109), 0, 0);
    assert!(c.decode_kv(c.k[key109]).is_finite() && c.decode_kv(c.v[key109]).is_finite());
}

#[test]
fn params_layout_matches_cuda() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<PagedAttentionParams>(), 296);
    assert_eq!(offset_of!(PagedAttentionParams, errors), 80);
    assert_eq!(offset_of!(PagedAttentionParams, lse), 88);
    assert_eq!(offset_of!(PagedAttentionParams, lse_stride_tok), 96);
    assert_eq!(offset_of!(PagedAttentionParams, q_stride_tok), 104);
    assert_eq!(offset_of!(PagedAttentionParams, page_table_stride), 184);
    assert_eq!(offset_of!(PagedAttentionParams, bs), 192);
    assert_eq!(offset_of!(PagedAttentionParams, window_left), 240);
    assert_eq!(offset_of!(PagedAttentionParams, scale_log2), 244);
    assert_eq!(offset_of!(PagedAttentionParams, tile_tokens), 252);
    assert_eq!(offset_of!(PagedAttentionParams, cp_ranks), 256);
    assert_eq!(offset_of!(PagedAttentionParams, cp_rank), 260);
    assert_eq!(offset_of!(PagedAttentionParams, skip_log2_factor), 264);
    assert_eq!(offset_of!(PagedAttentionParams, row_tile_base), 268);
    assert_eq!(offset_of!(PagedAttentionParams, length_order), 272);
    assert_eq!(offset_of!(PagedAttentionParams, skip_counter), 280);
    assert_eq!(offset_of!(PagedAttentionParams, unit_order), 288);
    assert!(PTX
        .ptx
        .contains("paged_attention_decode_bf16_kv_bf16_d128_param_0[296]"));
}

#[test]
fn ptx_has_every_kernel_name() {
    let names = kernel_names();
    assert_eq!(names.len(), 40); // 24 CUDA-core (D 64..512) + 16 tensor-core entries
    assert!(names.contains(&"paged_attention_mma_bf16_kv_bf16_d512".to_string()));
    assert!(names.contains(&"paged_attention_mma_f16_kv_f16_d512".to_string()));
    assert!(names.contains(&"paged_attention_mma_bf16_kv_e4m3_d512".to_string()));
    assert!(names.contains(&"paged_attention_mma_f16_kv_e4m3_d256".to_string()));
    for name in &names {
        assert!(PTX.has_entry(name), "{name} missing from the PTX");
    }
    assert!(names.contains(&"paged_attention_decode_bf16_kv_bf16_d128".to_string()));
    assert!(names.contains(&"paged_attention_mma_bf16_kv_e4m3_d128".to_string()));
    assert!(!names.contains(&"paged_attention_mma_bf16_kv_f16_d128".to_string()));
    // The length order written once (`write_unit_order`).
    assert!(PTX.has_entry("paged_attention_unit_order"));
}

#[test]
fn committed_ptx_is_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let kernel =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/paged_attention.cu");
    kernel_rt::ptxhash::check_fresh(&root, &kernel, PTX.ptx).unwrap();
}

/// The embedded sm_90 cubin was assembled from the embedded PTX by the pinned
/// ptxas (its stamp; no CUDA needed).
#[test]
fn committed_cubin_is_fresh() {
    kernel_rt::ptxhash::check_cubin(&PTX).unwrap();
}

#[test]
fn smem_fits_the_sm90_budget() {
    for d in [64, 128, 256] {
        for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
            assert!(smem_bytes(d, kv) <= 227 * 1024);
        }
    }
    assert_eq!(
        smem_bytes(128, KvDtype::Bf16),
        8192 + 6 * 32 * 272 + 16 * 33 * 4 + 192 + 12 + 4
    );
    // Tensor-core kernel: 2 CTAs/SM at D 128, 4 at D 64 (228 KB per SM,
    // 1 KB reserved per CTA); 4 warps × 3 slots × 16 tokens × (K + V); e4m3
    // 6 slots of raw bytes (no converted copy).
    assert_eq!(
        mma_smem_bytes(128, KvDtype::Bf16),
        4 * 3 * 16 * 256 * 2 + 512 + 96
    );
    assert_eq!(
        mma_smem_bytes(128, KvDtype::E4m3),
        4 * 6 * 16 * 128 * 2 + 512 + 192
    );
    // D 256 (16-bit KV only): 1 CTA/SM, the 16 Q rows after the rings.
    assert_eq!(
        mma_smem_bytes(256, KvDtype::Bf16),
        4 * 3 * 16 * 512 * 2 + 512 + 96 + 16 * 256 * 2
    );
    assert!(mma_smem_bytes(256, KvDtype::F16) + 1024 <= 228 * 1024);
    // D 512 (warp pairs, 256 dims a warp): the same rings as D 256, the
    // pairs' partial S (2 pairs x 2 parities x 2 halves x 32 lanes x 8 f32),
    // then the 16 Q rows of 512 dims; one CTA an SM.
    assert_eq!(
        mma_smem_bytes(512, KvDtype::Bf16),
        4 * 3 * 16 * 512 * 2 + 512 + 96 + 2 * 2 * 2 * 32 * 8 * 4 + 16 * 512 * 2
    );
    assert!(mma_smem_bytes(512, KvDtype::F16) + 1024 <= 228 * 1024);
    // e4m3 above D 128: groups of D / 128 warps of 128 dims (as D 128), 6
    // ring slots, the groups' partial S, no Q rows (Q stays in registers);
    // two CTAs an SM.
    for (d, groups) in [(256, 2), (512, 4)] {
        assert_eq!(
            mma_smem_bytes(d, KvDtype::E4m3),
            4 * 6 * 16 * 128 * 2 + 512 + 192 + (4 / groups) * 2 * groups * 32 * 8 * 4
        );
        assert!(2 * (mma_smem_bytes(d, KvDtype::E4m3) + 1024) <= 228 * 1024);
    }
    use paged_attention::mma_tile_tokens as tt;
    assert_eq!(tt(512, KvDtype::Bf16), 32);
    assert_eq!(tt(256, KvDtype::F16), 64);
    assert_eq!(tt(128, KvDtype::E4m3), 64);
    assert_eq!(tt(256, KvDtype::E4m3), 32);
    assert_eq!(tt(512, KvDtype::E4m3), 16);
    for (d, ctas) in [(64, 4), (128, 2)] {
        for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
            assert!(ctas * (mma_smem_bytes(d, kv) + 1024) <= 228 * 1024);
            // the warp-merge scratch 4·16·(D+8) f32 fits in the rings
            assert!(4 * 16 * (d + 8) * 4 <= mma_smem_bytes(d, kv) - 608);
        }
    }
}

#[test]
fn kernel_path_choice() {
    use paged_attention::{mma_supported, HalfDtype as H};
    assert!(mma_supported(H::Bf16, KvDtype::Bf16, 128));
    assert!(mma_supported(H::F16, KvDtype::E4m3, 64));
    assert!(
        !mma_supported(H::F16, KvDtype::Bf16, 128),
        "mixed 16-bit dtypes"
    );
    assert!(
        mma_supported(H::Bf16, KvDtype::Bf16, 256),
        "D 256 16-bit KV: tensor cores (Q from shared memory)"
    );
    assert!(
        mma_supported(H::Bf16, KvDtype::E4m3, 256),
        "D 256 e4m3 KV: tensor cores (warp pairs of 128 dims)"
    );
    assert!(
        mma_supported(H::Bf16, KvDtype::Bf16, 512) && mma_supported(H::F16, KvDtype::F16, 512),
        "D 512 16-bit KV: tensor cores (warp pairs)"
    );
    assert!(
        mma_supported(H::F16, KvDtype::E4m3, 512),
        "D 512 e4m3 KV: tensor cores (groups of 4 warps of 128 dims)"
    );
    // The entries that split the dims between warps (run by Auto while
    // set_wide_mma is on, the default).
    use paged_attention::mma_wide;
    assert!(mma_wide(KvDtype::Bf16, 512) && mma_wide(KvDtype::E4m3, 512));
    assert!(mma_wide(KvDtype::E4m3, 256) && !mma_wide(KvDtype::Bf16, 256));
    assert!(!mma_wide(KvDtype::E4m3, 128) && !mma_wide(KvDtype::F16, 64));
}

#[test]
fn mma_kernel_needs_i32_byte_strides() {
    use paged_attention::mma_strides_fit;
    // NHD bf16 pool, 16 tokens × 8 heads × 128 dims a page: fits.
    let nhd = [16 * 8 * 128, 128, 8 * 128];
    assert!(mma_strides_fit(nhd, nhd, 2));
    // The largest page stride that fits, in bytes, and one element more.
    let edge = [i64::from(i32::MAX) / 2, 128, 128];
    assert!(mma_strides_fit(nhd, edge, 2));
    let over = [i64::from(i32::MAX) / 2 + 1, 128, 128];
    assert!(!mma_strides_fit(nhd, over, 2), "V page stride 2^31 bytes");
    assert!(mma_strides_fit(over, nhd, 1), "2^30 e4m3 elements fit");
    assert!(
        !mma_strides_fit([16, 1, i64::from(i32::MAX) + 1], nhd, 1),
        "K token stride"
    );
    assert!(
        !mma_strides_fit([i64::MAX, 1, 1], nhd, 2),
        "overflowing product"
    );
    // The head stride is not limited (one 64-bit product a CTA).
    assert!(mma_strides_fit([16, i64::MAX, 1], nhd, 2));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Geometry: within CUDA limits, splits only when items leave SMs idle,
    /// fixed mode covers max_seq_len, workspace matches the split count.
    #[test]
    fn launch_config_properties(bs in 1usize..600, hkv in 1usize..9, rt in 1usize..17, max_len in 1usize..70_000,
                                sms in 1usize..200, fixed in prop::option::of(1usize..5000),
                                cap in 1usize..9) {
        let split = fixed.map_or(SplitMode::Auto, |c| SplitMode::Fixed { chunk_tokens: c });
        let (s, cfg) = launch_config(bs, hkv, rt, max_len, split, sms, 1000).unwrap();
        if let Some(c) = fixed {
            // Chunked: the fixed grid capped at `cap` splits.
            let chunked = SplitMode::Chunked { chunk_tokens: c, max_splits: cap };
            let (sc, cc) = launch_config(bs, hkv, rt, max_len, chunked, sms, 1000).unwrap();
            prop_assert_eq!(sc, s.min(cap));
            prop_assert_eq!(cc.grid_dim, (sc as u32, (hkv * rt) as u32, bs as u32));
        }
        prop_assert_eq!(cfg.grid_dim, (s as u32, (hkv * rt) as u32, bs as u32));
        prop_assert_eq!(cfg.block_dim.0, BLOCK_THREADS);
        prop_assert!(s >= 1);
        match fixed {
            Some(c) => prop_assert!(s * c >= max_len && (s - 1) * c < max_len),
            None => {
                prop_assert!(s == 1 || s * bs * hkv * rt <= 2 * sms);
                // An unsplit grid covering >= 3/4 of the SMs is not split.
                prop_assert!(4 * bs * hkv * rt < 3 * sms || s == 1);
                prop_assert!(s <= max_len.div_ceil(128).max(1));
            }
        }
        let ws = workspace_elems(bs, hkv, rt, s, 128);
        prop_assert_eq!(ws == 0, s == 1);
        // partials, then one counter per item
        prop_assert!(s == 1 || ws == bs * hkv * rt * (s * 16 * 130 + 1));
    }

    /// Reference: with K = 0 every visible key weighs the same, so the output
    /// is the mean of V over the visible set (window, verify rows).
    #[test]
    fn uniform_weights_give_window_means(len in 1i32..80, n in 1usize..5, w in prop::option::of(0u32..20), p in 1usize..9) {
        let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, p, &[len], Some(n), n, |_, t| t as f64);
        c.window = w;
        let r = c.reference();
        for j in 0..n {
            let x = len as i64 - n as i64 + j as i64;
            let want = if x < 0 { 0.0 } else {
                let lo = w.map_or(0, |w| (x - w as i64).max(0));
                (lo + x) as f64 / 2.0
            };
            prop_assert!((r.out[j] - want).abs() < 1e-9, "row {} got {} want {}", j, r.out[j], want);
        }
    }

    /// Ragged rule: the rows of processed requests never overlap, and every
    /// request is either processed or counted as skipped.
    #[test]
    fn processed_ragged_requests_never_overlap(cu in prop::collection::vec(-1i32..8, 2..7), max_q in 1usize..4) {
        let bs = cu.len() - 1;
        let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &vec![3; bs], None, 6, |_, t| t as f64);
        c.cu = cu;
        c.max_q_len = max_q;
        let r = c.reference();
        let mut owner = [usize::MAX; 6];
        let mut processed = 0;
        for b in 0..bs {
            let (s, e) = (c.cu[b], c.cu[b + 1]);
            let ok = s >= 0 && s <= e && e <= 6 && (e - s) as usize <= max_q
                && c.cu[..b].iter().all(|&k| k <= s);
            if ok {
                processed += 1;
                for row in s as usize..e as usize {
                    prop_assert_eq!(owner[row], usize::MAX, "row {} written twice", row);
                    owner[row] = b;
                }
            }
        }
        prop_assert_eq!(r.errors.count as usize, bs - processed);
        for row in 0..6 {
            prop_assert_eq!(r.written[row], owner[row] != usize::MAX);
        }
    }

    /// A sink only ever shrinks the output toward 0 by the factor den/(den + e^σ).
    #[test]
    fn sink_scales_the_output(len in 1i32..40, sink in -3.0f32..3.0) {
        let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[len], Some(1), 1, |_, _| 1.0);
        c.sinks = Some(vec![sink]);
        let r = c.reference();
        let want = len as f64 / (len as f64 + (sink as f64).exp());
        prop_assert!((r.out[0] - want).abs() < 1e-9);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// `random_case` only poisons keys no processed row may see, after every
    /// `cu_seqlens_q` edit (else the reference itself outputs NaN).
    #[test]
    fn random_cases_poison_only_invisible_keys(seed in any::<u64>()) {
        let (c, _, _) = random_case(seed);
        prop_assert!(visible_keys_are_finite(&c).is_ok(), "seed {seed}: {:?}", visible_keys_are_finite(&c));
    }
}

#[test]
fn committed_abi_header_is_current() {
    // The C params structs and flag bits the kernels include are generated
    // from the Rust definitions (`cargo xtask abi`); a stale header fails here.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    kernel_rt::abi::check_committed(dir, &paged_attention::ABI).unwrap();
}

/// The full-launch rule shared by mha-backend and the Python package: only a
/// launch Auto left unsplit is chunked, and only below
/// `unsplit_items_per_sm(kv)` work items an SM (6 for 2-byte K/V, 5 for e4m3).
#[test]
fn chunk_full_launch_rule() {
    use kernel_rt::cudarc::driver::LaunchConfig;
    use paged_attention::{
        chunk_full_launch, unsplit_items_per_sm, KvDtype, LaunchPlan, UNSPLIT_ITEMS_PER_SM,
        UNSPLIT_ITEMS_PER_SM_FP8,
    };
    let plan = |bs: i32, hkv: i32, row_tiles: i32, max_splits: i32, kv_dtype| LaunchPlan {
        params: PagedAttentionParams {
            bs,
            num_kv_heads: hkv,
            row_tiles,
            max_splits,
            ..Default::default()
        },
        entry: String::new(),
        config: LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        },
        workspace_elems: 0,
        head_dim: 128,
        kv_dtype,
    };
    let sms = 132;
    let (bf, hf, e) = (KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3);
    assert_eq!((UNSPLIT_ITEMS_PER_SM, UNSPLIT_ITEMS_PER_SM_FP8), (6, 5));
    assert_eq!(unsplit_items_per_sm(bf), 6);
    assert_eq!(unsplit_items_per_sm(hf), 6);
    assert_eq!(unsplit_items_per_sm(e), 5);
    assert_eq!(plan(64, 8, 1, 1, bf).params.work_items(), 512);
    assert_eq!(plan(3, 2, 5, 1, bf).params.work_items(), 30);
    // bs 64 × 8 KV heads: 512 items, below both thresholds (792, 660) → chunked.
    assert!(chunk_full_launch(&plan(64, 8, 1, 1, bf), sms));
    assert!(chunk_full_launch(&plan(64, 8, 1, 1, e), sms));
    // bs 96 × 8 = 768 items: chunked for 2-byte K/V (< 792), unsplit for e4m3 (≥ 660).
    assert!(chunk_full_launch(&plan(96, 8, 1, 1, bf), sms));
    assert!(chunk_full_launch(&plan(96, 8, 1, 1, hf), sms));
    assert!(!chunk_full_launch(&plan(96, 8, 1, 1, e), sms));
    // The edges: 99 × 8 = 792 = 6 · 132 unsplit, one request fewer chunked;
    // 660 = 5 · 132 items (165 × 4 heads) unsplit for e4m3, 659 chunked.
    assert!(!chunk_full_launch(&plan(99, 8, 1, 1, bf), sms));
    assert!(chunk_full_launch(&plan(98, 8, 1, 1, bf), sms));
    assert!(!chunk_full_launch(&plan(165, 4, 1, 1, e), sms));
    assert!(chunk_full_launch(&plan(659, 1, 1, 1, e), sms));
    // Row tiles count: 33 requests × 6 heads × 4 row tiles = 792.
    assert!(!chunk_full_launch(&plan(33, 6, 4, 1, bf), sms));
    assert!(chunk_full_launch(&plan(33, 6, 4, 1, bf), sms + 1));
    // Auto already split it (the grid was not full): never re-planned.
    assert!(!chunk_full_launch(&plan(4, 8, 1, 8, bf), sms));
    assert!(!chunk_full_launch(&plan(4, 8, 1, 8, e), sms));
    // `chunk_full` is the same rule from Auto's split count and the items.
    for (bs, hkv, rt, splits) in [
        (64, 8, 1, 1),
        (96, 8, 1, 1),
        (99, 8, 1, 1),
        (98, 8, 1, 1),
        (33, 8, 4, 1),
        (4, 8, 1, 8),
    ] {
        for kv in [bf, hf, e] {
            let p = plan(bs, hkv, rt, splits, kv);
            assert_eq!(
                paged_attention::chunk_full(splits as usize, p.params.work_items(), sms, kv),
                chunk_full_launch(&p, sms),
                "{bs} × {hkv} × {rt}, {splits} splits, {kv:?}"
            );
        }
    }
}

/// The batch's length order: a permutation of the requests, longest length
/// bucket first (128-token buckets capped at 255, lengths ≤ 0 in bucket 0),
/// ties by index.
#[test]
fn unit_order_is_the_stable_length_order() {
    use paged_attention::reference::unit_order;
    assert!(unit_order(&[]).is_empty());
    assert_eq!(unit_order(&[5]), [0]);
    // 129 and 256 share bucket 2; 1 and 128 bucket 1; 0 and −3 bucket 0;
    // 40,000 and 32,641 the capped bucket 255 (ties by index).
    let lens = [1, 129, 0, 256, 128, -3, 40_000, 32_641, 257];
    assert_eq!(unit_order(&lens), [6, 7, 8, 1, 3, 0, 4, 2, 5]);
    let lens: Vec<i32> = (0..1000).map(|i| ((i * 7919) % 5000) - 100).collect();
    let order = unit_order(&lens);
    let mut seen = vec![false; lens.len()];
    for &i in &order {
        assert!(!seen[i as usize], "request {i} twice");
        seen[i as usize] = true;
    }
    let bucket = |l: i32| {
        if l <= 0 {
            0
        } else {
            ((l + 127) / 128).min(255)
        }
    };
    for w in order.windows(2) {
        let (a, b) = (bucket(lens[w[0] as usize]), bucket(lens[w[1] as usize]));
        assert!(a > b || (a == b && w[0] < w[1]), "{w:?}: buckets {a}, {b}");
    }
}
