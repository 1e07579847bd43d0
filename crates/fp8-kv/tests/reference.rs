//! CPU tests of the fp8-kv family: the issue's named examples, the spec's
//! worked examples (SEMANTICS.md §fp8-kv.6, edge cases 28–34), the scale rules, the
//! host codec against a brute-force nearest-value search (proptest), the
//! reference write's properties, the launch geometry, the params layout and
//! the PTX entry names. Run everywhere, CI included.
#![allow(clippy::excessive_precision)] // spec values are quoted digit for digit

use fp8_kv::codec::{
    bf16_bits_to_f32, e4m3_decode, e4m3_encode_framework, e4m3_encode_satfinite, quantize,
};
use fp8_kv::reference::{fused_fp8_set_kv_buffer, set_kv_buffer, HostCache, HostRows, HostWrite};
use fp8_kv::{
    chunk_elems, launch_config, resolve_scale, vectorizable, ErrorFlags, KvCacheDtype, KvDtype,
    KvScales, KvWriteParams, ViewAlignment, BLOCK_THREADS, KERNEL_NAMES, PTX,
    RESIDENT_THREADS_PER_SM, TOKENS_IN_FLIGHT,
};
use half::{bf16, f16};
use kernel_rt::ErrorReport;
use proptest::prelude::*;

const POISON8: u8 = 0xA5;
const POISON16: u16 = 0xA5A5;

fn bf(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

fn fp8_scales(k: Option<f32>, v: Option<f32>) -> KvScales {
    KvScales::from_values(KvCacheDtype::Fp8E4m3, k, v)
}

/// Fused write of contiguous `[n, h, d]` K (V = K) into `[slots, h, d]`
/// poisoned caches; returns (K cache, V cache, error word).
fn fused(
    k: &[u16],
    loc: &[i64],
    h: usize,
    d: usize,
    slots: usize,
    dtype: KvDtype,
    scales: &KvScales,
) -> (Vec<u8>, Vec<u8>, ErrorReport) {
    let rows = HostRows {
        data: k,
        token_stride: h * d,
        head_stride: d,
    };
    let w = HostWrite {
        cache_loc: loc,
        num_kv_heads: h,
        head_dim: d,
        k: rows,
        v: rows,
    };
    let mut kc = vec![POISON8; slots * h * d];
    let mut vc = vec![POISON8; slots * h * d];
    let err = fused_fp8_set_kv_buffer(
        &w,
        dtype,
        scales,
        &mut HostCache {
            data: &mut kc,
            slots,
            slot_stride: h * d,
            head_stride: d,
        },
        &mut HostCache {
            data: &mut vc,
            slots,
            slot_stride: h * d,
            head_stride: d,
        },
    );
    (kc, vc, err)
}

/// Issue 3, must pass: one token, 1 KV head, D = 4, P = 4, cache_loc 13 →
/// element offset 52; K = [4, −3, 500, 1000], k_scale = 2 (a float, or a
/// one-element tensor holding 2: both resolve to the same f32) → 0x40, 0xBC,
/// 0x78, 0x7E; read back ×2: 4, −3, 512, 896; never 0x7F.
#[test]
fn issue_example_one_token_loc13_scale2() {
    let k: Vec<u16> = [4.0, -3.0, 500.0, 1000.0].map(bf).to_vec();
    // A float and a tensor scale both reach the kernel as the same resolved f32.
    let from_float = fp8_scales(Some(2.0_f64 as f32), None);
    let from_tensor = fp8_scales(Some([2.0f32][0]), None);
    assert_eq!(from_float, from_tensor);
    for scales in [from_float, from_tensor] {
        let (kc, vc, err) = fused(&k, &[13], 1, 4, 16, KvDtype::Bf16, &scales);
        assert!(err.is_clean());
        assert_eq!(&kc[52..56], &[0x40, 0xBC, 0x78, 0x7E]);
        assert!(
            kc[..52].iter().chain(&kc[56..]).all(|&b| b == POISON8),
            "only slot 13 written"
        );
        assert!(!kc[52..56].contains(&0x7F));
        let back: Vec<f32> = kc[52..56].iter().map(|&c| e4m3_decode(c) * 2.0).collect();
        assert_eq!(back, vec![4.0, -3.0, 512.0, 896.0]);
        // V has no scale given: resolved to 1.0 (edge case 31) → 4, −3, 448, 448.
        assert_eq!(&vc[52..56], &[0x48, 0xC4, 0x7E, 0x7E]);
    }
}

/// Issue 3, must pass: bf16 0.02197265625 with k_scale 0.9 → 0x0D (multiply
/// by the f32 reciprocal), not 0x0C (true division).
#[test]
fn issue_example_reciprocal_not_division() {
    let x = bf16_bits_to_f32(bf(0.02197265625));
    assert_eq!(x, 0.02197265625);
    let s = fp8_scales(Some(0.9), Some(0.9));
    assert_eq!(quantize(x, s.inv_k_scale()), 0x0D);
    assert_eq!(
        e4m3_encode_satfinite(x / 0.9),
        0x0C,
        "true division differs"
    );
    let (kc, _, _) = fused(&[bf(x)], &[0], 1, 1, 1, KvDtype::Bf16, &s);
    assert_eq!(kc, vec![0x0D]);
}

/// SEMANTICS.md §fp8-kv.6: fused code for every row, generic (bf16 division, then the
/// framework cast) for comparison.
#[test]
fn spec_worked_examples_fused_vs_generic() {
    let generic = |x: f32, s: Option<f32>| -> u8 {
        let y = match s {
            Some(s) => bf16::from_f32(x / s).to_f32(),
            None => x,
        };
        e4m3_encode_framework(y)
    };
    let rows: [(f32, Option<f32>, u8, u8); 9] = [
        (1.0, None, 0x38, 0x38),
        (-3.296875, Some(0.5), 0xCD, 0xCD),
        (500.0, None, 0x7E, 0x7F),
        (0.01165771484375, Some(0.7), 0x09, 0x08),
        (240.0, Some(0.5), 0x7E, 0x7F),
        (0.30078125, None, 0x2A, 0x2A),
        (0.00099945068, None, 0x01, 0x01),
        (0.00099945068, Some(3.0), 0x00, 0x00),
        (1.0625, None, 0x38, 0x38),
    ];
    for (x, s, want_fused, want_generic) in rows {
        let xb = bf16_bits_to_f32(bf(x));
        let scales = fp8_scales(s, s);
        assert_eq!(
            quantize(xb, scales.inv_k_scale()),
            want_fused,
            "fused {x} / {s:?}"
        );
        assert_eq!(generic(xb, s), want_generic, "generic {x} / {s:?}");
        let (kc, vc, _) = fused(&[bf(x)], &[0], 1, 1, 1, KvDtype::Bf16, &scales);
        assert_eq!((kc[0], vc[0]), (want_fused, want_fused));
    }
    // Decoded values of the fused column.
    assert_eq!(e4m3_decode(0xCD), -6.5);
    assert_eq!(e4m3_decode(0x09), 0.017578125);
    assert_eq!(e4m3_decode(0x2A), 0.3125);
    assert_eq!(e4m3_decode(0x01), 2f32.powi(-9));
}

/// Edge case 28: saturation vs NaN; [448, 464] → 448 in both encoders.
#[test]
fn edge_28_saturation_vs_nan() {
    assert_eq!(e4m3_encode_satfinite(500.0), 0x7E);
    assert_eq!(e4m3_encode_framework(500.0), 0x7F);
    for x in [448.0f32, 450.0, 456.0, 463.9, 464.0] {
        assert_eq!(e4m3_encode_satfinite(x), 0x7E, "{x}");
        assert_eq!(e4m3_encode_framework(x), 0x7E, "{x}");
        assert_eq!(e4m3_encode_satfinite(-x), 0xFE, "-{x}");
    }
    for x in [464.01f32, 480.0, 1e30, f32::INFINITY] {
        assert_eq!(e4m3_encode_satfinite(x), 0x7E, "{x}");
        assert_eq!(e4m3_encode_satfinite(-x), 0xFE, "-{x}");
        assert_eq!(e4m3_encode_framework(x), 0x7F, "{x}");
        assert_eq!(e4m3_encode_framework(-x), 0xFF, "-{x}");
    }
}

/// Edge case 29: double rounding (bf16 division first) vs one f32 rounding.
#[test]
fn edge_29_double_rounding() {
    let x = bf16_bits_to_f32(bf(0.01165771484375));
    assert_eq!(quantize(x, 1.0f32 / 0.7f32), 0x09);
    assert_eq!(
        e4m3_encode_framework(bf16::from_f32(x / 0.7).to_f32()),
        0x08
    );
}

/// Edge case 30: ties to even, in range and in the subnormal range.
#[test]
fn edge_30_ties_to_even() {
    assert_eq!(e4m3_encode_satfinite(1.0625), 0x38);
    assert_eq!(e4m3_encode_satfinite(2f32.powi(-10)), 0x00);
    assert_eq!(e4m3_encode_satfinite(3.0 * 2f32.powi(-10)), 0x02);
    assert_eq!(e4m3_encode_satfinite(-2f32.powi(-10)), 0x80);
}

/// Every NaN → 0x7F in the saturating encoder (the float8 crate alone keeps
/// the sign: −NaN → 0xFF).
#[test]
fn nan_of_either_sign_is_0x7f() {
    for bits in [
        0x7FC0_0000u32,
        0xFFC0_0000,
        0x7F80_0001,
        0xFF80_0001,
        0x7FFF_FFFF,
        0xFFFF_FFFF,
    ] {
        let x = f32::from_bits(bits);
        assert_eq!(e4m3_encode_satfinite(x), 0x7F, "{bits:#x}");
        assert_eq!(quantize(x, 0.5), 0x7F);
    }
    assert_eq!(
        float8::F8E4M3::from_f32(f32::from_bits(0xFFC0_0000)).to_bits(),
        0xFF,
        "crate keeps the sign"
    );
    for x in [bf16::NAN, -bf16::NAN] {
        let (kc, _, _) = fused(
            &[x.to_bits()],
            &[0],
            1,
            1,
            1,
            KvDtype::Bf16,
            &fp8_scales(Some(2.0), None),
        );
        assert_eq!(kc, vec![0x7F]);
    }
}

/// Edge cases 31 and 32 (DESIGN.md D8 wins over upstream).
#[test]
fn edge_31_32_scale_resolution() {
    // 31: only k_scale given → v = 1.0, both sides use the pair.
    let s = fp8_scales(Some(0.5), None);
    assert_eq!((s.k_scale(), s.v_scale()), (0.5, 1.0));
    assert_eq!(s.bmm_scales(1.0, 0.125), (0.0625, 1.0));
    // Upstream's write would apply no scaling to K (only one of K/V given) while
    // its bmm1 uses 0.5: a known divergence; mha-kit divides K by 0.5 on write.
    assert_eq!(quantize(1.0, s.inv_k_scale()), e4m3_encode_satfinite(2.0));
    // 32: FP8 cache, scaling 0.125.
    assert_eq!(
        fp8_scales(Some(0.5), Some(2.0)).bmm_scales(1.0, 0.125),
        (0.0625, 2.0)
    );
    for bad in [0.0, -1.0, f32::NAN, -0.0] {
        let s = fp8_scales(Some(bad), Some(bad));
        assert_eq!((s.k_scale(), s.v_scale()), (1.0, 1.0), "{bad}");
        assert_eq!(s.bmm_scales(1.0, 0.125), (0.125, 1.0));
    }
    // Tensor-only k_scale = 0.5: upstream's read side gives k = 1.0 (bmm1 =
    // 0.125, edge case 32) but writes with 0.5. D8: a tensor and a float mean
    // the same thing, read once at setup → k = 0.5 on both sides.
    let from_tensor = fp8_scales(Some(0.5), None);
    assert_eq!(from_tensor.bmm_scales(1.0, 0.125).0, 0.0625);
    assert_ne!(
        from_tensor.bmm_scales(1.0, 0.125).0,
        0.125,
        "documented divergence from upstream"
    );
    // Non-FP8 caches ignore checkpoint scales whatever they are.
    for dt in [KvCacheDtype::Bf16, KvCacheDtype::F16] {
        let s = KvScales::from_values(dt, Some(0.5), Some(2.0));
        assert_eq!((s.k_scale(), s.v_scale()), (1.0, 1.0));
        assert_eq!(s.bmm_scales(1.0, 0.125), (0.125, 1.0));
        assert_eq!(
            s.bmm_scales(0.3, 0.125),
            (0.125, 1.0),
            "q_scale unused without FP8"
        );
    }
    // q_scale multiplies bmm1 only for an FP8 cache.
    assert_eq!(
        fp8_scales(Some(0.5), Some(2.0)).bmm_scales(2.0, 0.125),
        (0.125, 2.0)
    );
    assert_eq!(resolve_scale(None), 1.0);
    assert_eq!(resolve_scale(Some(3.5)), 3.5);
    // Non-finite scales never reach the kernel (+∞ would zero the cache).
    assert_eq!(resolve_scale(Some(f32::INFINITY)), 1.0);
    assert_eq!(resolve_scale(Some(f32::NAN)), 1.0);
}

/// Edge case 33: P = 16, Hkv = 2, D = 4, loc 37 → page 2, offset 5; byte of
/// (h = 1, d = 3) at 303.
#[test]
fn edge_33_slot_address() {
    let (h, d, p) = (2usize, 4usize, 16usize);
    let k: Vec<u16> = (0..8).map(|i| bf(1.0 + i as f32)).collect();
    let (kc, _, err) = fused(
        &k,
        &[37],
        h,
        d,
        4 * p,
        KvDtype::Bf16,
        &KvScales::unit(KvCacheDtype::Fp8E4m3),
    );
    assert!(err.is_clean());
    assert_eq!((37 / p, 37 % p), (2, 5));
    assert_eq!(kc[303], e4m3_encode_satfinite(8.0));
    let written: Vec<usize> = (0..kc.len()).filter(|&i| kc[i] != POISON8).collect();
    assert_eq!(written, (296..304).collect::<Vec<_>>());
}

/// Edge case 34 (and ≥ S): skipped, K and V, counted once per token.
#[test]
fn edge_34_out_of_pool_slots_skipped_and_counted() {
    let k: Vec<u16> = (0..3).map(|i| bf(i as f32 + 1.0)).collect();
    let (kc, vc, err) = fused(
        &k,
        &[-1, 8, 3],
        1,
        1,
        8,
        KvDtype::Bf16,
        &KvScales::unit(KvCacheDtype::Fp8E4m3),
    );
    assert_eq!(
        err,
        ErrorReport {
            count: 2,
            flags: ErrorFlags::NEGATIVE_SLOT.bits() | ErrorFlags::SLOT_OUTSIDE_POOL.bits()
        }
    );
    let mut want = vec![POISON8; 8];
    want[3] = e4m3_encode_satfinite(3.0);
    assert_eq!(kc, want);
    assert_eq!(vc, want);
}

/// `n = 0` writes nothing.
#[test]
fn empty_write_writes_nothing() {
    let (kc, _, err) = fused(
        &[],
        &[],
        2,
        8,
        4,
        KvDtype::F16,
        &KvScales::unit(KvCacheDtype::Fp8E4m3),
    );
    assert!(kc.iter().all(|&b| b == POISON8));
    assert!(err.is_clean());
}

/// The bf16/f16 copy: rows land bit for bit (NaN payloads included), with
/// strided inputs and a padded cache slot stride.
#[test]
fn set_kv_buffer_copies_bits_with_strides() {
    let (n, h, d, ts, slots, ss) = (2usize, 2usize, 3usize, 10usize, 4usize, 8usize);
    let k: Vec<u16> = (0..n * ts).map(|i| 0x7F81 + i as u16).collect();
    let v: Vec<u16> = (0..n * ts).map(|i| 0x1000 + i as u16).collect();
    let w = HostWrite {
        cache_loc: &[3, 1],
        num_kv_heads: h,
        head_dim: d,
        k: HostRows {
            data: &k,
            token_stride: ts,
            head_stride: 4,
        },
        v: HostRows {
            data: &v,
            token_stride: ts,
            head_stride: 4,
        },
    };
    let mut kc = vec![POISON16; slots * ss];
    let mut vc = vec![POISON16; slots * ss];
    let err = set_kv_buffer(
        &w,
        &mut HostCache {
            data: &mut kc,
            slots,
            slot_stride: ss,
            head_stride: d,
        },
        &mut HostCache {
            data: &mut vc,
            slots,
            slot_stride: ss,
            head_stride: d,
        },
    );
    assert!(err.is_clean());
    for (t, slot) in [(0usize, 3usize), (1, 1)] {
        for hh in 0..h {
            for dd in 0..d {
                assert_eq!(kc[slot * ss + hh * d + dd], k[t * ts + hh * 4 + dd]);
                assert_eq!(vc[slot * ss + hh * d + dd], v[t * ts + hh * 4 + dd]);
            }
        }
        assert_eq!(
            kc[slot * ss + 6..slot * ss + 8],
            [POISON16; 2],
            "slot padding untouched"
        );
    }
    assert!(kc[..ss].iter().all(|&x| x == POISON16));
}

/// f16 inputs widen exactly (a value bf16 cannot hold).
#[test]
fn f16_input_widens_exactly() {
    let x = f16::from_f32(0.1).to_bits();
    let (kc, _, _) = fused(
        &[x],
        &[0],
        1,
        1,
        1,
        KvDtype::F16,
        &KvScales::unit(KvCacheDtype::Fp8E4m3),
    );
    assert_eq!(kc[0], e4m3_encode_satfinite(f16::from_bits(x).to_f32()));
    let big = f16::from_f32(65504.0).to_bits();
    let (kc, _, _) = fused(
        &[big],
        &[0],
        1,
        1,
        1,
        KvDtype::F16,
        &KvScales::unit(KvCacheDtype::Fp8E4m3),
    );
    assert_eq!(kc[0], 0x7E);
}

/// All 256 codes: decode → encode is the identity except NaN (→ 0x7F); with
/// a power-of-two scale the round trip through the fused write also holds.
#[test]
fn all_codes_round_trip_on_host() {
    for code in 0..=255u8 {
        let x = e4m3_decode(code);
        let want = if code & 0x7F == 0x7F { 0x7F } else { code };
        assert_eq!(e4m3_encode_satfinite(x), want, "code {code:#04x}");
        for scale in [0.5f32, 2.0, 8.0] {
            let s = fp8_scales(Some(scale), Some(scale));
            let input = bf16::from_f32(x * scale);
            assert!(x.is_nan() || input.to_f32() == x * scale, "exact in bf16");
            assert_eq!(
                quantize(input.to_f32(), s.inv_k_scale()),
                want,
                "code {code:#04x} scale {scale}"
            );
        }
    }
}

/// Brute-force nearest e4m3 value (ties to even code), saturating.
fn nearest_code(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs());
    if a >= 448.0 {
        return 0x7E | sign;
    }
    let mut best = 0u8;
    for c in 0..0x7Fu8 {
        let (dc, db) = (
            (f64::from(e4m3_decode(c)) - a).abs(),
            (f64::from(e4m3_decode(best)) - a).abs(),
        );
        if dc < db || (dc == db && c % 2 == 0 && best % 2 == 1) {
            best = c;
        }
    }
    best | sign
}

/// Paged views: an NHD view (page stride `P·Hkv·D`, token stride `Hkv·D`)
/// writes exactly what the slot-linear cache gets; an HND view and a
/// padded-page view write the same rows, permuted / shifted; bad slots are
/// counted as for the linear cache.
#[test]
fn paged_views_equal_the_linear_cache_permuted() {
    use fp8_kv::reference::{fused_fp8_set_kv_buffer_paged, set_kv_buffer_paged, HostPagedCache};
    let (pages, p, hkv, d) = (4usize, 4usize, 2usize, 3usize);
    let slots = pages * p;
    let loc: Vec<i64> = vec![5, 0, 15, -1, 16, 9, 2];
    let n = loc.len();
    let rows: Vec<u16> = (0..n * hkv * d)
        .map(|i| bf(i as f32 * 0.37 - 4.0))
        .collect();
    let hr = HostRows {
        data: &rows,
        token_stride: hkv * d,
        head_stride: d,
    };
    let w = HostWrite {
        cache_loc: &loc,
        num_kv_heads: hkv,
        head_dim: d,
        k: hr,
        v: hr,
    };
    let row = hkv * d;
    let lin = |data: &mut [u16]| -> ErrorReport {
        let mut v = vec![0u16; slots * row];
        set_kv_buffer(
            &w,
            &mut HostCache {
                data,
                slots,
                slot_stride: row,
                head_stride: d,
            },
            &mut HostCache {
                data: &mut v,
                slots,
                slot_stride: row,
                head_stride: d,
            },
        )
    };
    let mut want = vec![0u16; slots * row];
    let want_err = lin(&mut want);
    assert_eq!(want_err.count, 2);
    // (page, head, token) strides: NHD, HND, padded NHD.
    for (st, pad) in [
        ([p * row, d, row], 0usize),
        ([hkv * p * d, p * d, d], 0),
        ([p * row + 5, d, row], 5),
    ] {
        let len = pages * st[0] + pad;
        let (mut k, mut v) = (vec![0u16; len], vec![0u16; len]);
        let mk = |data| HostPagedCache {
            data,
            num_pages: pages,
            page_size: p,
            page_stride: st[0],
            head_stride: st[1],
            token_stride: st[2],
        };
        let e = set_kv_buffer_paged(&w, &mut mk(&mut k), &mut mk(&mut v));
        assert_eq!(e, want_err);
        for s in 0..slots {
            for h in 0..hkv {
                for x in 0..d {
                    let at = (s / p) * st[0] + h * st[1] + (s % p) * st[2] + x;
                    assert_eq!(k[at], want[s * row + h * d + x], "strides {st:?} slot {s}");
                    assert_eq!(v[at], k[at]);
                }
            }
        }
        // The FP8 write lands at the same places.
        let scales = fp8_scales(Some(0.5), None);
        let (mut k8, mut v8) = (vec![0u8; len], vec![0u8; len]);
        let mk8 = |data| HostPagedCache {
            data,
            num_pages: pages,
            page_size: p,
            page_stride: st[0],
            head_stride: st[1],
            token_stride: st[2],
        };
        let e = fused_fp8_set_kv_buffer_paged(
            &w,
            KvDtype::Bf16,
            &scales,
            &mut mk8(&mut k8),
            &mut mk8(&mut v8),
        );
        assert_eq!(e, want_err);
        let (mut lk, mut lv) = (vec![0u8; slots * row], vec![0u8; slots * row]);
        fused_fp8_set_kv_buffer(
            &w,
            KvDtype::Bf16,
            &scales,
            &mut HostCache {
                data: &mut lk,
                slots,
                slot_stride: row,
                head_stride: d,
            },
            &mut HostCache {
                data: &mut lv,
                slots,
                slot_stride: row,
                head_stride: d,
            },
        );
        for s in 0..slots {
            for h in 0..hkv {
                for x in 0..d {
                    let at = (s / p) * st[0] + h * st[1] + (s % p) * st[2] + x;
                    assert_eq!(k8[at], lk[s * row + h * d + x]);
                }
            }
        }
    }
}

#[test]
fn params_layout_matches_cuda() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<KvWriteParams>(), 184);
    assert_eq!(offset_of!(KvWriteParams, errors), 40);
    assert_eq!(offset_of!(KvWriteParams, k_token_stride), 48);
    assert_eq!(offset_of!(KvWriteParams, v_cache_head_stride), 104);
    assert_eq!(offset_of!(KvWriteParams, num_tokens), 112);
    assert_eq!(offset_of!(KvWriteParams, slots), 120);
    assert_eq!(offset_of!(KvWriteParams, page_size), 128);
    assert_eq!(offset_of!(KvWriteParams, v_cache_page_stride), 144);
    assert_eq!(offset_of!(KvWriteParams, inv_k_scale), 152);
    assert_eq!(offset_of!(KvWriteParams, inv_v_scale), 156);
    assert_eq!(offset_of!(KvWriteParams, num_kv_heads), 160);
    assert_eq!(offset_of!(KvWriteParams, threads_per_token), 172);
    assert_eq!(offset_of!(KvWriteParams, tokens_per_block), 176);
    assert_eq!(offset_of!(KvWriteParams, vectorized), 180);
    for name in KERNEL_NAMES {
        assert!(
            PTX.ptx.contains(&format!("{name}_param_0[184]")),
            "{name} takes one 184-byte param"
        );
    }
}

#[test]
fn ptx_has_every_kernel_name() {
    for name in KERNEL_NAMES {
        assert!(PTX.has_entry(name), "{name} missing from the PTX");
    }
    assert!(!PTX.has_entry("fp8_kv"), "prefix must not match");
    assert!(
        PTX.ptx.contains("cvt.rn.satfinite.e4m3x2.f32"),
        "the satfinite conversion"
    );
}

#[test]
fn committed_ptx_is_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let kernel = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/fp8_kv.cu");
    kernel_rt::ptxhash::check_fresh(&root, &kernel, PTX.ptx).unwrap();
}

/// The embedded sm_90 cubin was assembled from the embedded PTX by the pinned
/// ptxas (its stamp; no CUDA needed).
#[test]
fn committed_cubin_is_fresh() {
    kernel_rt::ptxhash::check_cubin(&PTX).unwrap();
}

#[test]
fn vector_path_needs_alignment_everywhere() {
    let va = |addr: u64, elem_bytes: usize, outer: [(usize, usize); 2]| ViewAlignment {
        addr,
        elem_bytes,
        outer,
    };
    let ok = |addr: u64| va(addr, 2, [(16, 1024), (8, 128)]);
    assert!(vectorizable(128, false, &[ok(0), ok(256)]));
    assert!(vectorizable(
        128,
        true,
        &[ok(0), va(512, 1, [(4, 1024), (8, 128)])]
    ));
    assert!(!vectorizable(128, false, &[ok(8)]), "misaligned base");
    assert!(
        !vectorizable(128, false, &[va(0, 2, [(2, 1028), (8, 128)])]),
        "token stride 2056 B"
    );
    assert!(
        vectorizable(128, false, &[va(0, 2, [(1, 1028), (8, 128)])]),
        "size-1 dims ignore strides"
    );
    assert!(!vectorizable(4, false, &[ok(0)]), "D·2 = 8 bytes");
    assert!(vectorizable(8, false, &[va(0, 2, [(3, 8), (1, 8)])]));
    assert!(
        !vectorizable(8, true, &[va(0, 2, [(3, 8), (1, 8)])]),
        "FP8 chunk is 16 elements"
    );
    assert!(
        !vectorizable(16, true, &[va(0, 1, [(3, 24), (1, 16)])]),
        "cache slot stride 24 B"
    );
    assert_eq!(
        (
            chunk_elems(false, true),
            chunk_elems(true, true),
            chunk_elems(true, false)
        ),
        (8, 16, 1)
    );
}

/// A random write: distinct valid slots (duplicates have no defined winner),
/// some out of the pool, random strides.
#[derive(Debug, Clone)]
struct Case {
    h: usize,
    d: usize,
    ts: usize,
    hs: usize,
    slots: usize,
    ss: usize,
    loc: Vec<i64>,
    k: Vec<u16>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..=4,
        1usize..=20,
        0usize..=5,
        0usize..=3,
        1usize..=24,
        0usize..=4,
    )
        .prop_flat_map(|(h, d, tpad, hpad, slots, spad)| {
            let hs = d + hpad;
            let ts = h * hs + tpad;
            let n = 0..=slots.min(12);
            (Just((h, d, ts, hs, slots, h * d + spad)), Just(slots), n)
        })
        .prop_flat_map(|(geo, slots, n)| {
            let perm = Just((0..slots as i64).collect::<Vec<_>>()).prop_shuffle();
            let bad = proptest::collection::vec(
                prop_oneof![
                    Just(-1i64),
                    Just(slots as i64),
                    Just(i64::MIN),
                    Just(i64::MAX)
                ],
                0..=2,
            );
            let k = proptest::collection::vec(any::<u16>(), (n + 2) * geo.2..=(n + 2) * geo.2);
            (Just(geo), Just(n), perm, bad, k)
        })
        .prop_map(|((h, d, ts, hs, slots, ss), n, perm, bad, k)| {
            let mut loc: Vec<i64> = perm[..n].to_vec();
            loc.extend(bad);
            Case {
                h,
                d,
                ts,
                hs,
                slots,
                ss,
                loc,
                k,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The saturating encoder picks the nearest e4m3 value, ties to even,
    /// saturating at ±448, for every f32 bit pattern.
    #[test]
    fn satfinite_is_nearest_even(bits in any::<u32>(), small in -600.0f32..600.0) {
        for x in [f32::from_bits(bits), small, small * 1e-3] {
            prop_assert_eq!(e4m3_encode_satfinite(x), nearest_code(x), "x = {:e}", x);
        }
    }

    /// The framework cast agrees with the saturating one up to 464, NaN beyond.
    #[test]
    fn framework_matches_satfinite_in_range(x in -470.0f32..470.0) {
        if x.abs() <= 464.0 {
            prop_assert_eq!(e4m3_encode_framework(x), e4m3_encode_satfinite(x));
        } else {
            prop_assert_eq!(e4m3_encode_framework(x) & 0x7F, 0x7F);
        }
    }

    /// Every valid token's K and V rows land at their slot (quantized with
    /// the pair's reciprocals), nothing else changes, bad slots are counted.
    #[test]
    fn reference_writes_each_valid_row_once(c in case(), ks in 0.01f32..10.0, vs in prop_oneof![Just(None), (0.01f32..10.0).prop_map(Some)]) {
        let v: Vec<u16> = c.k.iter().map(|x| x.rotate_left(3)).collect();
        let w = HostWrite {
            cache_loc: &c.loc,
            num_kv_heads: c.h,
            head_dim: c.d,
            k: HostRows { data: &c.k, token_stride: c.ts, head_stride: c.hs },
            v: HostRows { data: &v, token_stride: c.ts, head_stride: c.hs },
        };
        let scales = fp8_scales(Some(ks), vs);
        let mut kc = vec![POISON8; c.slots * c.ss];
        let mut vc = vec![POISON8; c.slots * c.ss];
        let err = fused_fp8_set_kv_buffer(
            &w,
            KvDtype::Bf16,
            &scales,
            &mut HostCache { data: &mut kc, slots: c.slots, slot_stride: c.ss, head_stride: c.d },
            &mut HostCache { data: &mut vc, slots: c.slots, slot_stride: c.ss, head_stride: c.d },
        );
        let bad = c.loc.iter().filter(|&&l| l < 0 || l >= c.slots as i64).count();
        prop_assert_eq!(err.count as usize, bad);
        let mut want_k = vec![POISON8; kc.len()];
        let mut want_v = vec![POISON8; vc.len()];
        for (t, &l) in c.loc.iter().enumerate() {
            if l < 0 || l >= c.slots as i64 {
                continue;
            }
            for hh in 0..c.h {
                for dd in 0..c.d {
                    let src = t * c.ts + hh * c.hs + dd;
                    let dst = l as usize * c.ss + hh * c.d + dd;
                    want_k[dst] = quantize(bf16_bits_to_f32(c.k[src]), 1.0 / ks);
                    want_v[dst] = quantize(bf16_bits_to_f32(v[src]), 1.0 / vs.unwrap_or(1.0));
                }
            }
        }
        prop_assert_eq!(kc, want_k);
        prop_assert_eq!(vc, want_v);
    }

    /// Resolved scales are always > 0 (or 1.0), whatever the input bits.
    #[test]
    fn resolved_scales_are_positive(bits in any::<u32>()) {
        let s = resolve_scale(Some(f32::from_bits(bits)));
        prop_assert!(s > 0.0 && s.is_finite());
        prop_assert!(s == 1.0 || s == f32::from_bits(bits));
    }

    /// Geometry: block shape, and a grid of one token per thread up to one
    /// wave, one wave beyond.
    #[test]
    fn launch_config_covers_every_chunk(n in 1usize..2_000_000, h in 1usize..64, dchunks in 1usize..64, chunk in prop_oneof![Just(1usize), Just(8), Just(16)], sms in 1usize..200) {
        let d = dchunks * chunk;
        let (cfg, geo) = launch_config(n, h, d, chunk, sms).unwrap();
        let per_token = 2 * h * d / chunk;
        prop_assert_eq!(geo.chunks_per_head, d / chunk);
        prop_assert!(geo.threads_per_token * geo.tokens_per_block <= BLOCK_THREADS as usize);
        prop_assert!(geo.threads_per_token >= 1 && geo.tokens_per_block >= 1);
        // Lanes stride by threads_per_token: either one pass or the whole block.
        prop_assert!(geo.threads_per_token == per_token || geo.threads_per_token == BLOCK_THREADS as usize);
        // Tokens side by side fill the block as far as whole tokens go.
        prop_assert!(geo.tokens_per_block == 1 || (geo.tokens_per_block + 1) * geo.threads_per_token > BLOCK_THREADS as usize);
        prop_assert_eq!(
            (cfg.block_dim.0 as usize, cfg.block_dim.1 as usize, cfg.block_dim.2),
            (geo.threads_per_token, geo.tokens_per_block, 1)
        );
        let warps = (geo.threads_per_token * geo.tokens_per_block).div_ceil(32);
        let wave = sms * (RESIDENT_THREADS_PER_SM / 32 / warps).max(1);
        // One wave is resident at once: ≤ 64 registers × 32 lanes per warp.
        prop_assert!(wave / sms * warps * 32 * 64 <= 65_536);
        prop_assert_eq!(cfg.grid_dim.0 as usize, n.div_ceil(geo.tokens_per_block).min(wave));
        prop_assert_eq!((cfg.grid_dim.1, cfg.grid_dim.2), (1, 1));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The kernel's loops (modelled here index for index) visit every chunk
    /// of every token exactly once, whatever the grid (small SM counts force
    /// the grid-stride loop and several tokens per thread).
    #[test]
    fn kernel_loops_visit_every_chunk_once(n in 1usize..800, h in 1usize..5, dchunks in 1usize..24, sms in 1usize..6) {
        let (cfg, geo) = launch_config(n, h, dchunks, 1, sms).unwrap();
        let cpt = 2 * h * geo.chunks_per_head;
        let (tpt, tpb) = (cfg.block_dim.0 as usize, cfg.block_dim.1 as usize);
        let grid = cfg.grid_dim.0 as usize;
        let rows = grid * tpb;
        let mut seen = vec![0u8; n * cpt];
        for b in 0..grid {
            for y in 0..tpb {
                for x in 0..tpt {
                    for c in (x..cpt).step_by(tpt) {
                        for t0 in (b * tpb + y..n).step_by(TOKENS_IN_FLIGHT * rows) {
                            for i in 0..TOKENS_IN_FLIGHT {
                                let t = t0 + i * rows;
                                if t < n {
                                    seen[t * cpt + c] += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        prop_assert!(seen.iter().all(|&k| k == 1));
    }
}

#[test]
fn committed_abi_header_is_current() {
    // The C params structs and flag bits the kernels include are generated
    // from the Rust definitions (`cargo xtask abi`); a stale header fails here.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    kernel_rt::abi::check_committed(dir, &fp8_kv::ABI).unwrap();
}
