//! Helpers of the KV page export / import tests (CPU `kv_pages.rs`, GPU
//! `gpu.rs`): a two-layer backend, a prefill and a decode step with fixed
//! random inputs, and the two-pool round trip.
#![allow(dead_code)]

use mha_backend::{
    BackendConfig, Device, ForwardBatch, KvCacheDtype, LayerConfig, MhaBackend, TensorRef,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const P: usize = 4;

pub fn config(dtype: KvCacheDtype) -> BackendConfig {
    let mut c = BackendConfig::dense(2, LayerConfig::new(4, 2, 64), P, 96, 64, 8);
    c.kv_dtype = dtype;
    if dtype == KvCacheDtype::Fp8E4m3 {
        c.layers[1] = LayerConfig::new(4, 2, 64).with_scales(Some(0.5), Some(2.0));
    }
    c
}

pub fn rows(rng: &mut StdRng, n: usize, elems: usize) -> Vec<u16> {
    (0..n * elems)
        .map(|_| half::bf16::from_f32(rng.gen_range(-2.0..2.0)).to_bits())
        .collect()
}

/// Both layers of `batch` (`n` rows) with random inputs from `rng`; the
/// layers' outputs.
fn layers(b: &mut MhaBackend, rng: &mut StdRng, batch: &ForwardBatch, n: usize) -> Vec<Vec<u16>> {
    b.init_forward_metadata(batch).unwrap();
    (0..2)
        .map(|layer| {
            let (q, k, v) = (rows(rng, n, 256), rows(rng, n, 128), rows(rng, n, 128));
            b.forward(
                layer,
                TensorRef::Host(&q),
                Some(TensorRef::Host(&k)),
                Some(TensorRef::Host(&v)),
                batch,
                true,
            )
            .unwrap()
            .to_host()
            .unwrap()
        })
        .collect()
}

/// Prefills `len` tokens of one new request (both layers); returns the
/// request row and the pages holding it, in order.
pub fn prefill(b: &mut MhaBackend, rng: &mut StdRng, len: usize) -> (usize, Vec<usize>) {
    let r = b.alloc_request().unwrap();
    let loc = b.alloc_tokens(&[(r, len)]).unwrap();
    let batch = ForwardBatch::extend(
        vec![r as i64],
        vec![0],
        vec![len as i32],
        loc.clone(),
        false,
    );
    layers(b, rng, &batch, len);
    let mut pages: Vec<usize> = loc.iter().map(|&s| s as usize / P).collect();
    pages.dedup();
    (r, pages)
}

/// One decode step of request `r` at length `len + 1` with fixed inputs;
/// returns both layers' outputs.
pub fn decode(b: &mut MhaBackend, r: usize, len: usize, seed: u64) -> Vec<Vec<u16>> {
    let loc = b.alloc_tokens(&[(r, 1)]).unwrap();
    let batch = ForwardBatch::decode(vec![r as i64], vec![len as i64 + 1], loc);
    layers(b, &mut StdRng::seed_from_u64(seed), &batch, 1)
}

/// A request prefilled in backend A, its pages moved into other pages of
/// backend B (whose request rows point there), decodes in B exactly as in
/// A: bf16 and e4m3, lengths around page boundaries, both backends on
/// `device` (two pools on one GPU for the CUDA executor).
pub fn moved_pages_decode_bit_for_bit(device: Device) -> Result<(), String> {
    moved_pages_between(device, device)
}

/// [`moved_pages_decode_bit_for_bit`] from a backend on `src` to one on
/// `dst` (two GPUs of one host: the same kernels, so the same bits).
pub fn moved_pages_between(src: Device, dst: Device) -> Result<(), String> {
    for dtype in [KvCacheDtype::Bf16, KvCacheDtype::Fp8E4m3] {
        for len in [1, 4, 11, 17] {
            let mut rng = StdRng::seed_from_u64(len as u64);
            let mut a = MhaBackend::new(config(dtype), src).map_err(|e| e.to_string())?;
            let (ra, pa) = prefill(&mut a, &mut rng, len);
            let mut b = MhaBackend::new(config(dtype), dst).map_err(|e| e.to_string())?;
            // Shift B's allocation so the request lands on other pages.
            let other = b.alloc_request().unwrap();
            b.alloc_tokens(&[(other, 3 * P)]).unwrap();
            let rb = b.alloc_request().unwrap();
            let loc = b.alloc_tokens(&[(rb, len)]).unwrap();
            let mut pb: Vec<usize> = loc.iter().map(|&s| s as usize / P).collect();
            pb.dedup();
            if pb.len() != pa.len() || pb == pa {
                return Err(format!("the test needs other pages: {pa:?} vs {pb:?}"));
            }
            for layer in 0..2 {
                let x = a.export_kv_pages(layer, &pa).map_err(|e| e.to_string())?;
                b.import_kv_pages(layer, &pb, &x)
                    .map_err(|e| e.to_string())?;
                if b.export_kv_pages(layer, &pb).map_err(|e| e.to_string())? != x {
                    return Err(format!("{dtype:?} len {len} layer {layer}: pages differ"));
                }
            }
            if decode(&mut a, ra, len, 99) != decode(&mut b, rb, len, 99) {
                return Err(format!("{dtype:?} len {len}: decode outputs differ"));
            }
        }
    }
    Ok(())
}
