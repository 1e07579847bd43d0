//! CPU tests of the device generator `mha_replay_gen_qkv`: the params
//! layout, the PTX entry names and freshness, the f32 constant the kernel
//! bakes in, the launch geometry, and the host mirror of the kernel's thread
//! mapping against [`Generator::fill_row`] (the definition).

use mha_replay::gen::{Act, Generator, ModelId};
use mha_replay::launch::{
    launch_config, reference, GenKey, GenParams, BLOCK_THREADS, ELEMS_PER_THREAD, KERNEL_NAMES, PTX,
};
use proptest::prelude::*;

#[test]
fn params_layout_matches_cuda() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<GenParams>(), 104);
    assert_eq!(offset_of!(GenParams, q), 0);
    assert_eq!(offset_of!(GenParams, row_req), 24);
    assert_eq!(offset_of!(GenParams, row_pos), 32);
    assert_eq!(offset_of!(GenParams, seed), 40);
    assert_eq!(offset_of!(GenParams, model), 48);
    assert_eq!(offset_of!(GenParams, layer), 56);
    assert_eq!(offset_of!(GenParams, salt), 64);
    assert_eq!(offset_of!(GenParams, rows), 72);
    assert_eq!(offset_of!(GenParams, num_q_heads), 80);
    assert_eq!(offset_of!(GenParams, num_kv_heads), 84);
    assert_eq!(offset_of!(GenParams, head_dim), 88);
    assert_eq!(offset_of!(GenParams, q_head_offset), 92);
    assert_eq!(offset_of!(GenParams, kv_head_offset), 96);
    assert_eq!(offset_of!(GenParams, reserved), 100);
    assert!(PTX.ptx.contains("mha_replay_gen_qkv_param_0[104]"));
}

#[test]
fn ptx_has_the_entries() {
    for name in KERNEL_NAMES {
        assert!(name.starts_with("mha_replay_gen_"), "{name}");
        assert!(PTX.has_entry(name), "{name} missing from the PTX");
    }
    assert!(!PTX.has_entry("mha_replay_gen"), "prefix must not match");
}

#[test]
fn committed_ptx_is_fresh() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let kernel = dir.join("kernels/mha_replay_gen.cu");
    kernel_rt::ptxhash::check_fresh(&dir.join("../.."), &kernel, PTX.ptx).unwrap();
}

/// The embedded sm_90 cubin was assembled from the embedded PTX by the pinned
/// ptxas (its stamp; no CUDA needed).
#[test]
fn committed_cubin_is_fresh() {
    kernel_rt::ptxhash::check_cubin(&PTX).unwrap();
}

/// The kernel's constants are gen.rs's: √3 as the same f32, 2^-16 (the
/// kernel multiplies where gen.rs divides by 65536: exact for a power of
/// two) and 2, the outlier ±8 and ×2, with round-to-nearest intrinsics (no
/// FMA).
#[test]
fn ptx_bakes_in_the_same_constants() {
    assert_eq!(1.732_050_8f32.to_bits(), 0x3FDD_B3D7);
    for c in ["0f3FDDB3D7", "0f37800000", "0f40000000", "0f41000000"] {
        assert!(PTX.ptx.contains(c), "{c} missing");
    }
    assert!(!PTX.ptx.contains("fma.rn.f32"), "contracted float math");
    // splitmix64 multipliers.
    for m in ["-4658895280553007687", "-7723592293110705685"] {
        assert!(PTX.ptx.contains(m), "{m} missing");
    }
}

/// The kernel's thread mapping (host mirror) equals the definition, for the
/// whole row and for a tensor-parallel rank's heads (offsets into the row).
#[test]
fn host_mirror_equals_the_definition() {
    let g = Generator::new(0xDEAD_BEEF);
    for (model, hq, hkv, d, q_off, kv_off) in [
        (ModelId::Target, 4, 1, 64, 0, 0),
        (ModelId::Draft, 8, 2, 128, 0, 0),
        (ModelId::Target, 2, 2, 256, 0, 0),
        (ModelId::Target, 4, 1, 128, 12, 3),
        (ModelId::Draft, 2, 1, 64, 30, 7),
    ] {
        let key = GenKey {
            seed: 0xDEAD_BEEF,
            model,
            layer: 3,
            salt: 77,
            q_head_offset: q_off,
            kv_head_offset: kv_off,
        };
        let rows = [(5u64, 0u64), (5, 1), (1234, 99_999), (0, 7)];
        let (q, k, v) = reference(&g, key, &rows, hq, hkv, d);
        for (r, &(req, pos)) in rows.iter().enumerate() {
            let (req, pos) = (req as usize, pos as usize);
            let mut want = vec![0u16; hq * d];
            g.fill_row(Act::Q, model, 3, req, pos, 77, d, q_off, &mut want);
            assert_eq!(&q[r * hq * d..][..hq * d], &want[..]);
            let mut want = vec![0u16; hkv * d];
            g.fill_row(Act::K, model, 3, req, pos, 0, d, kv_off, &mut want);
            assert_eq!(&k[r * hkv * d..][..hkv * d], &want[..]);
            g.fill_row(Act::V, model, 3, req, pos, 0, d, kv_off, &mut want);
            assert_eq!(&v[r * hkv * d..][..hkv * d], &want[..]);
            if q_off > 0 {
                // A rank's heads are the same heads of the whole row.
                let mut whole = vec![0u16; (q_off + hq) * d];
                g.fill_row(Act::Q, model, 3, req, pos, 77, d, 0, &mut whole);
                assert_eq!(&q[r * hq * d..][..hq * d], &whole[q_off * d..]);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Enough threads for every 8-element chunk (grid-stride covers the
    /// rest), never more blocks than needed or than the cap.
    #[test]
    fn launch_config_covers(rows in 1usize..100_000, hq in 1usize..129, hkv in 1usize..17, dsel in 0usize..3) {
        let d = [64usize, 128, 256][dsel];
        let heads = hq + 2 * hkv;
        let cfg = launch_config(rows, heads, d).unwrap();
        let threads = rows * heads * d / ELEMS_PER_THREAD;
        let blocks = cfg.grid_dim.0 as usize;
        prop_assert_eq!(cfg.block_dim, (BLOCK_THREADS, 1, 1));
        prop_assert!((1..=132 * 16).contains(&blocks));
        prop_assert!(blocks <= threads.div_ceil(BLOCK_THREADS as usize));
        prop_assert!(blocks * BLOCK_THREADS as usize >= threads || blocks == 132 * 16);
    }
}

/// The generator's values are pinned: a checksum of `element` over Q/K/V,
/// both models, several layers, heads, positions and every channel of
/// D 128 (any change to the definition must change the device kernel and
/// this constant together).
#[test]
fn element_values_are_pinned() {
    let g = Generator::new(0x5EED_1234);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for act in [Act::Q, Act::K, Act::V] {
        for model in [ModelId::Target, ModelId::Draft] {
            for (layer, req, pos, salt, head) in
                [(0, 1, 0, 0, 0), (3, 17, 4095, 9, 5), (31, 250, 77, 2, 7)]
            {
                for d in 0..128 {
                    let bits = g
                        .element(act, model, layer, req, pos, salt, head, d)
                        .to_bits();
                    h = (h ^ u64::from(bits)).wrapping_mul(0x0100_0000_01b3);
                }
            }
        }
    }
    assert_eq!(h, 13_441_170_860_676_531_982);
}

#[test]
fn committed_abi_header_is_current() {
    // The C params structs and flag bits the kernels include are generated
    // from the Rust definitions (`cargo xtask abi`); a stale header fails here.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    kernel_rt::abi::check_committed(dir, &mha_replay::launch::ABI).unwrap();
}
