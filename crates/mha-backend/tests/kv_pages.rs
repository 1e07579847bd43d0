//! KV page descriptors and the page export / import round trip on the CPU
//! executor: the descriptor's addresses hold the exported bytes; pages
//! moved from one backend's pool into another's (at other page ids) give
//! the receiving backend the same decode output bit for bit, bf16 and e4m3;
//! bad imports are typed errors that write nothing.

#[path = "common/kv_pages.rs"]
mod kv;

use kv::{config, prefill, P};
use mha_backend::{
    BackendError, Device, KvCacheDtype, KvLayout, KvLocation, KvSnapshot, MhaBackend,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

#[test]
fn descriptor_addresses_hold_the_exported_pages() {
    for dtype in [KvCacheDtype::Bf16, KvCacheDtype::Fp8E4m3] {
        let mut rng = StdRng::seed_from_u64(1);
        let mut b = MhaBackend::new(config(dtype), Device::Cpu).unwrap();
        let (_, pages) = prefill(&mut b, &mut rng, 11);
        for layer in 0..2 {
            let d = b.kv_page_descriptor(layer).unwrap();
            assert_eq!(d.layer, layer);
            assert_eq!(d.location, KvLocation::Host);
            assert_eq!(d.num_pages, 64 + 1);
            let f = d.format;
            assert_eq!((f.page_size, f.num_kv_heads, f.head_dim), (P, 2, 64));
            assert_eq!(f.layout, KvLayout::Nhd);
            assert_eq!(f.dtype, dtype);
            if dtype == KvCacheDtype::Fp8E4m3 && layer == 1 {
                assert_eq!((f.k_scale, f.v_scale), (0.5, 2.0));
            }
            let eb = if dtype == KvCacheDtype::Fp8E4m3 { 1 } else { 2 };
            assert_eq!(d.page_stride_bytes, (P * 2 * 64 * eb) as u64);
            let x = b.export_kv_pages(layer, &pages).unwrap();
            assert_eq!(x.pages, pages.len());
            for (i, &p) in pages.iter().enumerate() {
                for v in [false, true] {
                    let (addr, len) = d.page_range(p, v).unwrap();
                    assert_eq!(len, d.page_stride_bytes);
                    // SAFETY: the descriptor's range lies inside the live
                    // backend's host cache (the point of this test), which
                    // nothing writes while it is read.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
                    let n = len as usize;
                    let want: Vec<u8> = match &x.data {
                        KvSnapshot::Half { k, v: vv } => {
                            let src = if v { vv } else { k };
                            src[i * n / 2..(i + 1) * n / 2]
                                .iter()
                                .flat_map(|e| e.to_ne_bytes())
                                .collect()
                        }
                        KvSnapshot::Fp8 { k, v: vv } => {
                            let src = if v { vv } else { k };
                            src[i * n..(i + 1) * n].to_vec()
                        }
                    };
                    assert_eq!(bytes, &want[..], "layer {layer} page {p} v {v}");
                }
            }
            assert!(d.page_range(d.num_pages, false).is_err());
        }
    }
}

/// A request prefilled in backend A, its pages moved into other pages of
/// backend B, decodes in B exactly as in A (CPU executor).
#[test]
fn moved_pages_decode_bit_for_bit() {
    kv::moved_pages_decode_bit_for_bit(Device::Cpu).unwrap();
}

#[test]
fn bad_imports_are_errors_and_write_nothing() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut a = MhaBackend::new(config(KvCacheDtype::Bf16), Device::Cpu).unwrap();
    let (_, pa) = prefill(&mut a, &mut rng, 9);
    let x = a.export_kv_pages(0, &pa).unwrap();
    let mut b = MhaBackend::new(config(KvCacheDtype::Bf16), Device::Cpu).unwrap();
    let before = b.read_kv_cache(0).unwrap();
    let name = |e: BackendError| match e {
        BackendError::Batch { field, .. } => field,
        BackendError::UnknownLayer { .. } => "layer",
        other => panic!("unexpected {other}"),
    };
    // Wrong count, out of range, a page twice, unknown layer.
    assert_eq!(name(b.import_kv_pages(0, &[1], &x).unwrap_err()), "pages");
    assert_eq!(
        name(b.import_kv_pages(0, &[1, 2, 65], &x).unwrap_err()),
        "pages"
    );
    assert_eq!(
        name(b.import_kv_pages(0, &[1, 2, 1], &x).unwrap_err()),
        "pages"
    );
    assert_eq!(
        name(b.import_kv_pages(7, &[1, 2, 3], &x).unwrap_err()),
        "layer"
    );
    assert_eq!(name(a.export_kv_pages(0, &[65]).unwrap_err()), "pages");
    // Another format: page size, dtype, scales, and elements that do not fit.
    let mut c = config(KvCacheDtype::Bf16);
    c.page_size = 8;
    let mut p8 = MhaBackend::new(c, Device::Cpu).unwrap();
    assert_eq!(
        name(p8.import_kv_pages(0, &[1, 2, 3], &x).unwrap_err()),
        "format"
    );
    let mut f8 = MhaBackend::new(config(KvCacheDtype::Fp8E4m3), Device::Cpu).unwrap();
    assert_eq!(
        name(f8.import_kv_pages(0, &[1, 2, 3], &x).unwrap_err()),
        "format"
    );
    let y = f8.export_kv_pages(0, &[1]).unwrap();
    assert_eq!(name(f8.import_kv_pages(1, &[1], &y).unwrap_err()), "format");
    let mut short = x.clone();
    if let KvSnapshot::Half { k, .. } = &mut short.data {
        k.pop();
    }
    assert_eq!(
        name(b.import_kv_pages(0, &[1, 2, 3], &short).unwrap_err()),
        "pages"
    );
    let mut wrong = x.clone();
    wrong.data = KvSnapshot::Fp8 {
        k: vec![0; 3 * P * 128],
        v: vec![0; 3 * P * 128],
    };
    assert_eq!(
        name(b.import_kv_pages(0, &[1, 2, 3], &wrong).unwrap_err()),
        "format"
    );
    assert_eq!(b.read_kv_cache(0).unwrap(), before);
}
