//! CPU-executor tests of the backend on engine memory: engine views (a
//! strided `req_to_token`, NHD / HND / padded-page caches, strided outputs)
//! give exactly the owning path's outputs and caches, bit for bit, in every
//! mode and for dense, hybrid SWA and FP8 models; requests sharing prefix
//! pages (radix-cache style); `q_scale`; bad views are typed errors naming
//! the argument.

#[path = "common/engine_mem.rs"]
mod engine_mem;

use engine_mem::{BatchVecs, Caches, Driver, EngineMem, Geo};
use kernel_rt::KernelError;
use mha_backend::{
    AttnMode, BackendConfig, BackendError, Device, EngineBatch, EngineKvCache, EngineLayer,
    EngineSwaMap, KvCacheDtype, KvLayout, KvSnapshot, LayerConfig, Mem, MemMut, MhaBackend,
    SpecConfig, TensorRef, View, ViewMut,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn dense() -> BackendConfig {
    let mut c = BackendConfig::dense(2, LayerConfig::new(4, 2, 64), 4, 96, 64, 8);
    c.spec = Some(SpecConfig {
        num_steps: 3,
        num_draft_tokens: 3,
        topk: 1,
    });
    c
}

fn hybrid() -> BackendConfig {
    let mut c = dense();
    c.layers = vec![
        LayerConfig::new(4, 2, 64),
        LayerConfig::new(4, 2, 64)
            .with_window(5)
            .with_sinks(vec![0.5, -1.0, 0.0, 1.5]),
        LayerConfig::new(4, 1, 64).with_window(9),
    ];
    c.num_swa_pages = Some(40);
    c
}

fn fp8() -> BackendConfig {
    let mut c = dense();
    c.kv_dtype = KvCacheDtype::Fp8E4m3;
    c.layers = vec![
        LayerConfig::new(4, 2, 64).with_scales(Some(0.5), Some(2.0)),
        LayerConfig::new(4, 4, 64).with_scales(Some(0.25), None),
    ];
    c
}

fn rand_rows(rng: &mut StdRng, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| half::bf16::from_f32(rng.gen_range(-1.0f32..1.0)).to_bits())
        .collect()
}

/// `req_to_token` as the engine holds it: `[rows, width]`, row stride `stride`.
#[derive(Clone, Copy)]
struct R2t<'a> {
    data: &'a [i32],
    rows: usize,
    width: usize,
    stride: usize,
}

/// The engine batch over `v` and the engine tables (host views).
fn batch<'a>(v: &'a BatchVecs, t: R2t<'a>, swa: Option<(&'a [i64], &'a [i32])>) -> EngineBatch<'a> {
    EngineBatch {
        mode: v.mode,
        batch_size: v.bs,
        num_tokens: v.num_tokens,
        max_q_len: v.max_q_len,
        req_to_token: View::new(
            "req_to_token",
            Mem::Host(t.data),
            [t.rows, t.width],
            [t.stride, 1],
        )
        .unwrap(),
        req_pool_indices: View::contiguous("req_pool_indices", Mem::Host(&v.rpi), [v.bs]).unwrap(),
        seq_lens: View::contiguous("seq_lens", Mem::Host(&v.seq), [v.bs]).unwrap(),
        out_cache_loc: View::contiguous("out_cache_loc", Mem::Host(&v.loc), [v.num_tokens])
            .unwrap(),
        cu_seqlens_q: (v.mode == AttnMode::Extend)
            .then(|| View::contiguous("cu_seqlens_q", Mem::Host(&v.cu_q[..]), [v.bs + 1]).unwrap()),
        verify_lens: (v.mode == AttnMode::RaggedVerify).then(|| {
            View::contiguous("verify_lens", Mem::Host(&v.verify_lens[..]), [v.bs]).unwrap()
        }),
        swa: swa.map(|(m, pm)| EngineSwaMap {
            full_to_swa: View::contiguous("full_to_swa", Mem::Host(m), [m.len()]).unwrap(),
            page_map: Some(View::contiguous("page_map", Mem::Host(pm), [pm.len()]).unwrap()),
        }),
        decode_tail: v.decode_tail,
    }
}

fn kv_cache<'a>(geo: &Geo, c: &'a mut Caches) -> EngineKvCache<'a> {
    let (s, st) = (geo.mem_shape(), geo.mem_strides());
    match c {
        Caches::Half(k, v) => EngineKvCache::Half {
            k: ViewMut::kv_cache("k_cache", MemMut::Host(k), geo.layout, s, st).unwrap(),
            v: ViewMut::kv_cache("v_cache", MemMut::Host(v), geo.layout, s, st).unwrap(),
        },
        Caches::Fp8(k, v) => EngineKvCache::E4m3 {
            k: ViewMut::kv_cache("k_cache", MemMut::Host(k), geo.layout, s, st).unwrap(),
            v: ViewMut::kv_cache("v_cache", MemMut::Host(v), geo.layout, s, st).unwrap(),
        },
    }
}

/// Runs one engine pass on `eng` (host memory); returns each layer's
/// output, read back from a strided output view (row stride `Hq·D + 8`).
fn run_engine(
    eng: &mut MhaBackend,
    config: &BackendConfig,
    mem: &mut EngineMem,
    v: &BatchVecs,
    io: &[(Vec<u16>, Vec<u16>, Vec<u16>)],
) -> Result<Vec<Vec<u16>>, BackendError> {
    let EngineMem {
        r2t,
        rows,
        width,
        stride,
        swa_map,
        page_map,
        layers,
    } = mem;
    let t = R2t {
        data: r2t,
        rows: *rows,
        width: *width,
        stride: *stride,
    };
    let swa = swa_map.as_deref().zip(page_map.as_deref());
    let b = batch(v, t, swa);
    eng.init_forward_metadata_engine(&b)?;
    let n = v.num_tokens;
    let mut outs = Vec::new();
    for (l, ((q, k, vv), (geo, caches))) in io.iter().zip(layers.iter_mut()).enumerate() {
        let lc = &config.layers[l];
        let (hq, hkv, d) = (lc.num_q_heads, lc.num_kv_heads, lc.head_dim);
        let row = hq * d + 8;
        let mut out = vec![0x7FC1u16; n.max(1) * row];
        let mut layer = EngineLayer {
            q: View::contiguous("q", Mem::Host(q), [n, hq, d])?,
            k: Some(View::contiguous("k", Mem::Host(k), [n, hkv, d])?),
            v: Some(View::contiguous("v", Mem::Host(vv), [n, hkv, d])?),
            kv_cache: kv_cache(geo, caches),
            out: ViewMut::new("out", MemMut::Host(&mut out), [n, hq, d], [row, d, 1])?,
            workspace: None,
            q_scale: 1.0,
        };
        eng.forward_engine(l, &mut layer, &b, true)?;
        drop(layer);
        let mut dense = Vec::with_capacity(n * hq * d);
        for t in 0..n {
            dense.extend_from_slice(&out[t * row..t * row + hq * d]);
        }
        outs.push(dense);
    }
    Ok(outs)
}

/// The owning path's pass (host tensors).
fn run_owning(
    b: &mut MhaBackend,
    batch: &mha_backend::ForwardBatch,
    io: &[(Vec<u16>, Vec<u16>, Vec<u16>)],
) -> Vec<Vec<u16>> {
    b.init_forward_metadata(batch).unwrap();
    io.iter()
        .enumerate()
        .map(|(l, (q, k, v))| {
            b.forward(
                l,
                TensorRef::Host(q),
                Some(TensorRef::Host(k)),
                Some(TensorRef::Host(v)),
                batch,
                true,
            )
            .unwrap()
            .into_host()
            .unwrap()
        })
        .collect()
}

fn inputs(rng: &mut StdRng, c: &BackendConfig, n: usize) -> Vec<(Vec<u16>, Vec<u16>, Vec<u16>)> {
    c.layers
        .iter()
        .map(|l| {
            (
                rand_rows(rng, n * l.num_q_heads * l.head_dim),
                rand_rows(rng, n * l.num_kv_heads * l.head_dim),
                rand_rows(rng, n * l.num_kv_heads * l.head_dim),
            )
        })
        .collect()
}

/// The engine caches equal the owning caches (slot-major), bit for bit.
fn same_caches(owning: &MhaBackend, mem: &EngineMem) {
    for (l, (geo, c)) in mem.layers.iter().enumerate() {
        let snap = owning.read_kv_cache(l).unwrap();
        match (snap, c) {
            (KvSnapshot::Half { k, v }, Caches::Half(ek, ev)) => {
                assert!(geo.to_slot_major(ek) == k, "layer {l}: K caches differ");
                assert!(geo.to_slot_major(ev) == v, "layer {l}: V caches differ");
            }
            (KvSnapshot::Fp8 { k, v }, Caches::Fp8(ek, ev)) => {
                assert!(geo.to_slot_major(ek) == k, "layer {l}: K caches differ");
                assert!(geo.to_slot_major(ev) == v, "layer {l}: V caches differ");
            }
            _ => panic!("layer {l}: cache dtypes differ"),
        }
    }
}

/// Owning path vs engine path over `steps` random passes (every mode),
/// layer layouts from `layouts`; outputs and caches bit for bit.
fn engine_equals_owning(
    config: BackendConfig,
    seed: u64,
    steps: usize,
    layouts: fn(usize) -> (KvLayout, usize),
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut own = MhaBackend::new(config.clone(), Device::Cpu).unwrap();
    let mut eng = MhaBackend::new(config.clone(), Device::Cpu).unwrap();
    eng.reserve_engine_metadata(8, 64).unwrap();
    let mut mem = own.with_pools(|p| EngineMem::new(&config, p, layouts));
    let mut drv = Driver::new(&config);
    let n_draft = config.spec.map_or(1, |s| s.num_draft_tokens);
    let hybrid = config.num_swa_pages.is_some();
    let mut modes = std::collections::BTreeSet::new();
    for step in 0..steps {
        let mode = (step % 6) as u32;
        if hybrid && step % 5 == 4 {
            for &r in &drv.live {
                let len = own.with_pools(|p| p.request_len(r).unwrap_or(0));
                own.evict_swa(r, len).unwrap();
            }
        }
        let b = drv.batch(&mut rng, &own, mode, config.context_len);
        let n = b.out_cache_loc.len();
        let io = inputs(&mut rng, &config, n);
        let want = run_owning(&mut own, &b, &io);
        let meta = own.metadata().unwrap().clone();
        modes.insert(
            format!("{:?}", meta.mode)
                .split(' ')
                .next()
                .unwrap()
                .to_string(),
        );
        let v = BatchVecs::of(&b, &meta, n_draft);
        own.with_pools(|p| mem.mirror(p));
        let got = run_engine(&mut eng, &config, &mut mem, &v, &io).unwrap();
        for (l, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w,
                "seed {seed} step {step} ({:?}) layer {l}: outputs differ",
                meta.mode
            );
        }
        same_caches(&own, &mem);
    }
    assert_eq!(modes.len(), 6, "every mode: {modes:?}");
    assert!(own.device_errors().is_clean() && eng.device_errors().is_clean());
}

#[test]
fn engine_views_equal_owning_path_dense_nhd_and_hnd() {
    engine_equals_owning(dense(), 11, 60, |l| {
        if l % 2 == 0 {
            (KvLayout::Nhd, 0)
        } else {
            (KvLayout::Hnd, 0)
        }
    });
}

#[test]
fn engine_views_equal_owning_path_hybrid_swa_padded_pages() {
    engine_equals_owning(hybrid(), 12, 60, |l| {
        if l % 2 == 0 {
            (KvLayout::Hnd, 16)
        } else {
            (KvLayout::Nhd, 8)
        }
    });
}

#[test]
fn engine_views_equal_owning_path_fp8() {
    engine_equals_owning(fp8(), 13, 60, |l| {
        if l % 2 == 0 {
            (KvLayout::Nhd, 32)
        } else {
            (KvLayout::Hnd, 0)
        }
    });
}
