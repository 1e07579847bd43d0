//! CPU-executor tests of the backend on engine memory: engine views (a
//! strided `req_to_token`, NHD / HND / padded-page caches, strided outputs)
//! give exactly the owning path's outputs and caches, bit for bit, in every
//! mode and for dense, hybrid SWA and FP8 models; requests sharing prefix
//! pages (radix-cache style); `q_scale`; bad views are typed errors naming
//! the argument.

#[path = "common/engine_mem.rs"]
mod engine_mem;
#[path = "common/models.rs"]
mod models;

use engine_mem::{BatchVecs, Caches, Driver, EngineMem, Geo};
use mha_backend::{
    AttnMode, BackendConfig, BackendError, Device, EngineBatch, EngineKvCache, EngineLayer,
    EngineSwaMap, KvLayout, KvSnapshot, Mem, MemMut, MhaBackend, TensorRef, View, ViewMut,
};
use models::{dense_config, fp8_config, hybrid_config};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The hybrid model with a window on the last layer too (window 9).
fn hybrid() -> BackendConfig {
    let mut c = hybrid_config();
    c.layers[2] = c.layers[2].clone().with_window(9);
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
                assert!(geo.slot_major(ek) == k, "layer {l}: K caches differ");
                assert!(geo.slot_major(ev) == v, "layer {l}: V caches differ");
            }
            (KvSnapshot::Fp8 { k, v }, Caches::Fp8(ek, ev)) => {
                assert!(geo.slot_major(ek) == k, "layer {l}: K caches differ");
                assert!(geo.slot_major(ev) == v, "layer {l}: V caches differ");
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
    engine_equals_owning(dense_config(), 11, 60, |l| {
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
    engine_equals_owning(fp8_config(), 13, 60, |l| {
        if l % 2 == 0 {
            (KvLayout::Nhd, 32)
        } else {
            (KvLayout::Hnd, 0)
        }
    });
}

/// A dense engine that allocates its own pages (no `Pools`): geometry and
/// a filled cache for the prefix tests.
struct OwnPages {
    config: BackendConfig,
    geo: Vec<Geo>,
    caches: Vec<Caches>,
    r2t: Vec<i32>,
    width: usize,
}

impl OwnPages {
    fn new(config: BackendConfig, pages: usize) -> Self {
        let p = config.page_size;
        let geo: Vec<Geo> = config
            .layers
            .iter()
            .map(|l| Geo {
                pages,
                p,
                hkv: l.num_kv_heads,
                d: l.head_dim,
                layout: KvLayout::Hnd,
                pad: 0,
            })
            .collect();
        let caches = geo
            .iter()
            .map(|g| Caches::Half(vec![0; g.len()], vec![0; g.len()]))
            .collect();
        let width = config.context_len;
        Self {
            r2t: vec![0; 4 * width],
            config,
            geo,
            caches,
            width,
        }
    }

    /// Sets request row `row` to the page list `pages` (slots by position).
    fn set_row(&mut self, row: usize, pages: &[usize], len: usize) {
        let p = self.config.page_size;
        for j in 0..len {
            self.r2t[row * self.width + j] = (pages[j / p] * p + j % p) as i32;
        }
    }

    /// One extend pass writing `v.loc` and attending; returns the outputs.
    fn pass(
        &mut self,
        eng: &mut MhaBackend,
        v: &BatchVecs,
        io: &[(Vec<u16>, Vec<u16>, Vec<u16>)],
        q_scale: f32,
    ) -> Vec<Vec<u16>> {
        let t = R2t {
            data: &self.r2t,
            rows: 4,
            width: self.width,
            stride: self.width,
        };
        let b = batch(v, t, None);
        eng.init_forward_metadata_engine(&b).unwrap();
        let n = v.num_tokens;
        let mut outs = Vec::new();
        for (l, (q, k, vv)) in io.iter().enumerate() {
            let lc = &self.config.layers[l];
            let (hq, hkv, d) = (lc.num_q_heads, lc.num_kv_heads, lc.head_dim);
            let mut out = vec![0u16; n * hq * d];
            let mut layer = EngineLayer {
                q: View::contiguous("q", Mem::Host(q), [n, hq, d]).unwrap(),
                k: Some(View::contiguous("k", Mem::Host(k), [n, hkv, d]).unwrap()),
                v: Some(View::contiguous("v", Mem::Host(vv), [n, hkv, d]).unwrap()),
                kv_cache: kv_cache(&self.geo[l], &mut self.caches[l]),
                out: ViewMut::contiguous("out", MemMut::Host(&mut out), [n, hq, d]).unwrap(),
                workspace: None,
                q_scale,
            };
            eng.forward_engine(l, &mut layer, &b, true).unwrap();
            outs.push(out);
        }
        outs
    }
}

fn extend_vecs(rpi: Vec<i64>, prefix: &[i32], ext: &[i32], loc: Vec<i64>) -> BatchVecs {
    let mut cu = vec![0i32];
    for &e in ext {
        cu.push(cu.last().unwrap() + e);
    }
    BatchVecs {
        mode: AttnMode::Extend,
        bs: rpi.len(),
        num_tokens: loc.len(),
        max_q_len: ext.iter().copied().max().unwrap_or(1) as usize,
        seq: prefix
            .iter()
            .zip(ext)
            .map(|(&p, &e)| i64::from(p + e))
            .collect(),
        rpi,
        loc,
        cu_q: cu,
        verify_lens: Vec::new(),
        decode_tail: 0,
    }
}

/// Radix-cache style: request B's row points at request A's first two
/// pages (a cached 8-token prefix, P = 4) and continues on its own pages;
/// B's extend over the shared prefix gives exactly what it gives over a
/// private copy of those pages, and A's pages are never written by B.
#[test]
fn requests_sharing_prefix_pages_read_the_shared_pages() {
    let config = dense_config();
    let mut rng = StdRng::seed_from_u64(5);
    let mut eng = MhaBackend::new(config.clone(), Device::Cpu).unwrap();
    let mut e = OwnPages::new(config.clone(), 16);
    // A (row 1): 10 tokens on pages 3, 7, 5 (a prefill).
    e.set_row(1, &[3, 7, 5], 10);
    let loc_a: Vec<i64> = (0..10).map(|j| i64::from(e.r2t[e.width + j])).collect();
    let io_a = inputs(&mut rng, &config, 10);
    e.pass(
        &mut eng,
        &extend_vecs(vec![1], &[0], &[10], loc_a),
        &io_a,
        1.0,
    );
    let before = e.caches.clone();
    // B (row 2): shares A's pages 3, 7 (8 tokens), then 5 new tokens on page 9, 11.
    e.set_row(2, &[3, 7, 9, 11], 13);
    // C (row 3): a private copy of the prefix on pages 12, 13, then the same 9, 11 layout on 14, 15.
    e.set_row(3, &[12, 13, 14, 15], 13);
    for (g, c) in e.geo.iter().zip(e.caches.iter_mut()) {
        let Caches::Half(k, v) = c else {
            unreachable!()
        };
        for (src, dst) in [(3usize, 12usize), (7, 13)] {
            for h in 0..g.hkv {
                for t in 0..g.p {
                    let (a, b) = (g.offset(src * g.p + t, h), g.offset(dst * g.p + t, h));
                    k.copy_within(a..a + g.d, b);
                    v.copy_within(a..a + g.d, b);
                }
            }
        }
    }
    let io_b = inputs(&mut rng, &config, 5);
    let loc_b: Vec<i64> = (8..13).map(|j| i64::from(e.r2t[2 * e.width + j])).collect();
    let out_b = e.pass(
        &mut eng,
        &extend_vecs(vec![2], &[8], &[5], loc_b),
        &io_b,
        1.0,
    );
    let loc_c: Vec<i64> = (8..13).map(|j| i64::from(e.r2t[3 * e.width + j])).collect();
    let out_c = e.pass(
        &mut eng,
        &extend_vecs(vec![3], &[8], &[5], loc_c),
        &io_b,
        1.0,
    );
    assert_eq!(out_b, out_c, "shared prefix pages == private copies");
    assert!(out_b.iter().all(|o| o.iter().any(|&x| x != 0)));
    // The shared pages still hold A's rows.
    for ((g, c), b0) in e.geo.iter().zip(&e.caches).zip(&before) {
        let (Caches::Half(k, _), Caches::Half(k0, _)) = (c, b0) else {
            unreachable!()
        };
        for s in [3usize, 7] {
            for h in 0..g.hkv {
                let o = g.offset(s * g.p, h);
                assert_eq!(&k[o..o + g.p * g.d], &k0[o..o + g.p * g.d]);
            }
        }
    }
    // Both in one batch (two rows on the same prefix pages): same outputs.
    let mut v = extend_vecs(vec![2, 3], &[8, 8], &[5, 5], Vec::new());
    v.loc = (8..13)
        .map(|j| i64::from(e.r2t[2 * e.width + j]))
        .chain((8..13).map(|j| i64::from(e.r2t[3 * e.width + j])))
        .collect();
    v.num_tokens = 10;
    let io_bc: Vec<_> = io_b
        .iter()
        .map(|(q, k, vv)| {
            (
                [q.clone(), q.clone()].concat(),
                [k.clone(), k.clone()].concat(),
                [vv.clone(), vv.clone()].concat(),
            )
        })
        .collect();
    let out_bc = e.pass(&mut eng, &v, &io_bc, 1.0);
    for (l, o) in out_bc.iter().enumerate() {
        let half = o.len() / 2;
        assert_eq!(&o[..half], &out_b[l][..]);
        assert_eq!(&o[half..], &out_c[l][..]);
    }
    assert!(eng.device_errors().is_clean());
}

/// `bmm1 = q_scale · k_scale · sm_scale`: `q_scale = 2` on `q` gives
/// exactly the output of `2·q` (exact in bf16) with `q_scale = 1`.
#[test]
fn q_scale_multiplies_the_logits() {
    let config = dense_config();
    let mut rng = StdRng::seed_from_u64(6);
    let mut eng = MhaBackend::new(config.clone(), Device::Cpu).unwrap();
    let mut e = OwnPages::new(config.clone(), 8);
    e.set_row(1, &[2, 4, 6], 11);
    let loc: Vec<i64> = (0..11).map(|j| i64::from(e.r2t[e.width + j])).collect();
    let v = extend_vecs(vec![1], &[0], &[11], loc);
    let io = inputs(&mut rng, &config, 11);
    let scaled = e.pass(&mut eng, &v, &io, 2.0);
    let doubled: Vec<_> = io
        .iter()
        .map(|(q, k, vv)| {
            let q2 = q
                .iter()
                .map(|&x| half::bf16::from_f32(half::bf16::from_bits(x).to_f32() * 2.0).to_bits())
                .collect();
            (q2, k.clone(), vv.clone())
        })
        .collect();
    let plain = e.pass(&mut eng, &v, &doubled, 1.0);
    assert_eq!(scaled, plain);
    let unscaled = e.pass(&mut eng, &v, &io, 1.0);
    assert_ne!(scaled, unscaled);
}

fn field(e: BackendError) -> String {
    match e {
        BackendError::Batch { field, .. } => field.to_string(),
        BackendError::Kernel(k) => match k {
            kernel_rt::KernelError::Shape { arg, .. }
            | kernel_rt::KernelError::Stride { arg, .. }
            | kernel_rt::KernelError::Capacity { arg, .. }
            | kernel_rt::KernelError::Unsupported { arg, .. } => arg.to_string(),
            other => format!("{other}"),
        },
        BackendError::Metadata(_) => "metadata".into(),
        other => format!("{other}"),
    }
}

/// Bad engine views are typed errors naming the argument, never a panic,
/// and leave the current pass unchanged.
#[test]
fn bad_engine_views_are_typed_errors_naming_the_argument() {
    let config = hybrid();
    let mut rng = StdRng::seed_from_u64(7);
    let mut own = MhaBackend::new(config.clone(), Device::Cpu).unwrap();
    let mut eng = MhaBackend::new(config.clone(), Device::Cpu).unwrap();
    let mut mem = own.with_pools(|p| EngineMem::new(&config, p, |_| (KvLayout::Nhd, 0)));
    let mut drv = Driver::new(&config);
    let b = drv.batch(&mut rng, &own, 0, config.context_len);
    let n = b.out_cache_loc.len();
    let io = inputs(&mut rng, &config, n);
    run_owning(&mut own, &b, &io);
    let meta = own.metadata().unwrap().clone();
    let v = BatchVecs::of(&b, &meta, 3);
    own.with_pools(|p| mem.mirror(p));

    // Views that do not fit their buffer.
    let small = [0i64; 2];
    let e = View::contiguous("seq_lens", Mem::Host(&small[..]), [3]).unwrap_err();
    assert_eq!(field(e), "seq_lens");
    let mut o = vec![0u16; 64];
    let e = ViewMut::new("out", MemMut::Host(&mut o), [4, 2, 8], [8, 0, 1]).unwrap_err();
    assert_eq!(field(e), "out", "an overlapping output");

    let EngineMem {
        r2t,
        rows,
        width,
        stride,
        swa_map,
        page_map,
        layers,
    } = &mut mem;
    let t = R2t {
        data: r2t,
        rows: *rows,
        width: *width,
        stride: *stride,
    };
    let swa = swa_map.as_deref().zip(page_map.as_deref());
    // Batch-level errors.
    let mut bad = batch(&v, t, swa);
    bad.cu_seqlens_q = None;
    assert_eq!(
        field(eng.init_forward_metadata_engine(&bad).unwrap_err()),
        "cu_seqlens_q"
    );
    let mut bad = batch(&v, t, swa);
    bad.swa = None;
    assert_eq!(
        field(eng.init_forward_metadata_engine(&bad).unwrap_err()),
        "swa"
    );
    let short = v.seq[..v.bs - 1].to_vec();
    let mut bad = batch(&v, t, swa);
    bad.seq_lens = View::contiguous("seq_lens", Mem::Host(&short), [v.bs - 1]).unwrap();
    assert_eq!(
        field(eng.init_forward_metadata_engine(&bad).unwrap_err()),
        "seq_lens"
    );
    let mut bad = batch(&v, t, swa);
    bad.out_cache_loc =
        View::contiguous("out_cache_loc", Mem::Host(&v.loc[..n - 1]), [n - 1]).unwrap();
    assert_eq!(
        field(eng.init_forward_metadata_engine(&bad).unwrap_err()),
        "out_cache_loc"
    );
    let mut bad = batch(&v, t, swa);
    bad.mode = AttnMode::TargetVerify { q_len: 3 };
    assert_eq!(
        field(eng.init_forward_metadata_engine(&bad).unwrap_err()),
        "num_tokens"
    );
    // forward before any pass.
    let good = batch(&v, t, swa);
    let (geo, caches) = &mut layers[0];
    let lc = &config.layers[0];
    let (hq, hkv, d) = (lc.num_q_heads, lc.num_kv_heads, lc.head_dim);
    let (q, k, vv) = &io[0];
    let mut out = vec![0u16; n * hq * d];
    {
        let mut layer = EngineLayer {
            q: View::contiguous("q", Mem::Host(q), [n, hq, d]).unwrap(),
            k: Some(View::contiguous("k", Mem::Host(k), [n, hkv, d]).unwrap()),
            v: Some(View::contiguous("v", Mem::Host(vv), [n, hkv, d]).unwrap()),
            kv_cache: kv_cache(geo, caches),
            out: ViewMut::contiguous("out", MemMut::Host(&mut out), [n, hq, d]).unwrap(),
            workspace: None,
            q_scale: 1.0,
        };
        assert_eq!(
            field(eng.forward_engine(0, &mut layer, &good, true).unwrap_err()),
            "metadata"
        );
        eng.init_forward_metadata_engine(&good).unwrap();
        // Layer-level errors.
        layer.q = View::contiguous("q", Mem::Host(q), [n, hkv, 2 * d]).unwrap();
        assert_eq!(
            field(eng.forward_engine(0, &mut layer, &good, true).unwrap_err()),
            "q"
        );
        layer.q = View::contiguous("q", Mem::Host(q), [n, hq, d]).unwrap();
        layer.v = None;
        assert_eq!(
            field(eng.forward_engine(0, &mut layer, &good, true).unwrap_err()),
            "k/v"
        );
        layer.v = Some(View::contiguous("v", Mem::Host(vv), [n, hkv, d]).unwrap());
        layer.q_scale = f32::NAN;
        assert_eq!(
            field(eng.forward_engine(0, &mut layer, &good, true).unwrap_err()),
            "q_scale"
        );
        layer.q_scale = 1.0;
        let mut other = batch(&v, t, swa);
        other.batch_size += 1;
        assert_eq!(
            field(eng.forward_engine(0, &mut layer, &other, true).unwrap_err()),
            "metadata"
        );
        assert_eq!(
            format!(
                "{:?}",
                eng.forward_engine(9, &mut layer, &good, true).unwrap_err()
            )
            .split(' ')
            .next()
            .map(str::to_string),
            Some("UnknownLayer".to_string())
        );
        eng.forward_engine(0, &mut layer, &good, true).unwrap();
    }
    // A cache of the wrong KV dtype, and of the wrong page size.
    let mut k8 = vec![0u8; geo.len()];
    let mut v8 = vec![0u8; geo.len()];
    let (s, st) = (geo.mem_shape(), geo.mem_strides());
    let mut layer = EngineLayer {
        q: View::contiguous("q", Mem::Host(q), [n, hq, d]).unwrap(),
        k: None,
        v: None,
        kv_cache: EngineKvCache::E4m3 {
            k: ViewMut::kv_cache("k_cache", MemMut::Host(&mut k8), geo.layout, s, st).unwrap(),
            v: ViewMut::kv_cache("v_cache", MemMut::Host(&mut v8), geo.layout, s, st).unwrap(),
        },
        out: ViewMut::contiguous("out", MemMut::Host(&mut out), [n, hq, d]).unwrap(),
        workspace: None,
        q_scale: 1.0,
    };
    assert_eq!(
        field(eng.forward_engine(0, &mut layer, &good, false).unwrap_err()),
        "kv_cache"
    );
    let mut kh = vec![0u16; geo.len()];
    let mut vh = vec![0u16; geo.len()];
    let shape2 = [s[0] * 2, s[1] / 2, s[2], s[3]];
    let st2 = [st[0] / 2, st[1], st[2], st[3]];
    layer.kv_cache = EngineKvCache::Half {
        k: ViewMut::kv_cache("k_cache", MemMut::Host(&mut kh), KvLayout::Nhd, shape2, st2).unwrap(),
        v: ViewMut::kv_cache("v_cache", MemMut::Host(&mut vh), KvLayout::Nhd, shape2, st2).unwrap(),
    };
    assert_eq!(
        field(eng.forward_engine(0, &mut layer, &good, false).unwrap_err()),
        "kv_cache"
    );
}

/// Corrupt device data is skipped and counted by the family that met it,
/// each family's report apart: `req_to_token` entries past the cache make
/// the K/V write (their slots) and attention (their page) count, under
/// their own flag names (the page-table build copies page ids without
/// knowing the cache size); the other request's rows are unaffected.
#[test]
fn device_errors_stay_with_their_family() {
    let config = dense_config();
    let mut rng = StdRng::seed_from_u64(9);
    let mut eng = MhaBackend::new(config.clone(), Device::Cpu).unwrap();
    let mut e = OwnPages::new(config.clone(), 16);
    e.set_row(1, &[3, 7], 6);
    // Row 2: its second page is far outside the 16-page cache.
    e.set_row(2, &[5, 1000], 6);
    let loc: Vec<i64> = (0..6)
        .map(|j| i64::from(e.r2t[e.width + j]))
        .chain((0..6).map(|j| i64::from(e.r2t[2 * e.width + j])))
        .collect();
    let io = inputs(&mut rng, &config, 12);
    let before = e.caches.clone();
    let out = e.pass(
        &mut eng,
        &extend_vecs(vec![1, 2], &[0, 0], &[6, 6], loc),
        &io,
        1.0,
    );
    let errs = eng.device_errors();
    assert!(!errs.is_clean());
    assert!(errs.kv_write.count > 0, "{errs}");
    assert!(errs.attention.count > 0, "{errs}");
    assert!(
        errs.swa_pool.is_clean() && errs.page_table.is_clean(),
        "{errs}"
    );
    assert_eq!(errs.count(), errs.kv_write.count + errs.attention.count);
    let ev = errs.events();
    assert_eq!(
        ev,
        ["fp8-kv: SLOT_OUTSIDE_POOL", "paged-attention: BAD_PAGE"],
        "{errs}"
    );
    // Row 1 (6 rows) is the same as alone.
    let mut alone = MhaBackend::new(config.clone(), Device::Cpu).unwrap();
    let mut e1 = OwnPages::new(config.clone(), 16);
    e1.caches = before;
    e1.set_row(1, &[3, 7], 6);
    let loc1: Vec<i64> = (0..6).map(|j| i64::from(e1.r2t[e1.width + j])).collect();
    let io1: Vec<_> = io
        .iter()
        .map(|(q, k, v)| {
            let (qh, kh) = (q.len() / 2, k.len() / 2);
            (q[..qh].to_vec(), k[..kh].to_vec(), v[..kh].to_vec())
        })
        .collect();
    let out1 = e1.pass(
        &mut alone,
        &extend_vecs(vec![1], &[0], &[6], loc1),
        &io1,
        1.0,
    );
    for (l, (o, o1)) in out.iter().zip(&out1).enumerate() {
        assert_eq!(
            &o[..o1.len()],
            &o1[..],
            "layer {l}: row 1 changed by row 2's bad page"
        );
    }
    assert!(alone.device_errors().is_clean());
}
