//! GPU tests of the backend on engine memory (`harness = false`; ignored
//! without a GPU): the CUDA engine path (device views of a strided
//! `req_to_token`, the batch tensors, the SWA maps; NHD / HND / padded
//! caches; strided outputs) against the owning CUDA path in every mode —
//! caches bit for bit, outputs bit for bit on unpadded NHD layers (the
//! owning path's strides) and within the attention tolerance elsewhere —
//! and engine CUDA-graph capture / replay (device-resident metadata
//! computed inside the graph) == eager engine passes, bit for bit.

#[path = "common/engine_mem.rs"]
mod engine_mem;

use std::sync::Arc;

use engine_mem::{BatchVecs, Caches, Driver, EngineMem, Geo};
use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::testing::{gpu_cases, gpu_trial, run_trials, OrFail};
use kernel_rt::Gpu;
use mha_backend::{
    AttnMode, BackendConfig, Device, EngineBatch, EngineKvCache, EngineLayer, EngineSwaMap,
    KvCacheDtype, KvLayout, KvSnapshot, LayerConfig, Mem, MemMut, MhaBackend, SpecConfig,
    TensorRef, View, ViewMut,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type R<T = ()> = Result<T, String>;

fn dense() -> BackendConfig {
    let mut c = BackendConfig::dense(2, LayerConfig::new(32, 8, 128), 16, 1024, 400, 16);
    c.spec = Some(SpecConfig {
        num_steps: 3,
        num_draft_tokens: 4,
        topk: 1,
    });
    c.workspace_bytes = Some(64 << 20);
    c
}

fn hybrid() -> BackendConfig {
    let sinks: Vec<f32> = (0..64).map(|i| (i % 7) as f32 * 0.3 - 0.9).collect();
    let mut c = dense();
    c.layers = (0..4)
        .map(|l| {
            let base = LayerConfig::new(64, 8, 64);
            if l % 2 == 1 {
                base.with_window(127).with_sinks(sinks.clone())
            } else {
                base
            }
        })
        .collect();
    c.num_swa_pages = Some(300);
    c
}

fn fp8() -> BackendConfig {
    let mut c = dense();
    c.kv_dtype = KvCacheDtype::Fp8E4m3;
    c.layers = vec![
        LayerConfig::new(32, 8, 128).with_scales(Some(0.5), Some(2.0)),
        LayerConfig::new(32, 8, 128).with_scales(Some(0.25), None),
    ];
    c
}

fn to_f32(x: u16) -> f32 {
    half::bf16::from_bits(x).to_f32()
}

fn close(got: &[u16], want: &[u16], what: &str) -> R {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (to_f32(g), to_f32(w));
        if (g - w).abs() > 2e-2 + 2e-2 * w.abs() || g.is_nan() != w.is_nan() {
            return Err(format!("{what}: element {i}: got {g}, want {w}"));
        }
    }
    if got.len() != want.len() {
        return Err(format!("{what}: {} vs {} elements", got.len(), want.len()));
    }
    Ok(())
}

fn inputs(rng: &mut StdRng, c: &BackendConfig, n: usize) -> Vec<(Vec<u16>, Vec<u16>, Vec<u16>)> {
    let mut r = |m: usize| -> Vec<u16> {
        (0..m)
            .map(|_| half::bf16::from_f32(rng.gen_range(-1.0f32..1.0)).to_bits())
            .collect()
    };
    c.layers
        .iter()
        .map(|l| {
            let (q, kv) = (
                n * l.num_q_heads * l.head_dim,
                n * l.num_kv_heads * l.head_dim,
            );
            (r(q), r(kv), r(kv))
        })
        .collect()
}

fn up<T: kernel_rt::cudarc::driver::DeviceRepr + Copy + Default>(
    gpu: &Gpu,
    v: &[T],
) -> R<CudaSlice<T>> {
    kernel_rt::testing::upload(gpu, v).or_fail("upload")
}

/// The engine's device memory: its tables (re-uploaded from the host
/// mirror each step: test plumbing, not the backend) and its caches.
struct DevMem {
    r2t: CudaSlice<i32>,
    swa: Option<(CudaSlice<i64>, CudaSlice<i32>)>,
    caches: Vec<(Geo, DevCaches)>,
}

enum DevCaches {
    Half(CudaSlice<u16>, CudaSlice<u16>),
    Fp8(CudaSlice<u8>, CudaSlice<u8>),
}

impl DevMem {
    fn new(gpu: &Gpu, m: &EngineMem) -> R<Self> {
        let s = gpu.stream();
        let caches = m
            .layers
            .iter()
            .map(|(g, c)| {
                Ok((
                    *g,
                    match c {
                        Caches::Half(..) => DevCaches::Half(
                            s.alloc_zeros(g.len()).or_fail("alloc")?,
                            s.alloc_zeros(g.len()).or_fail("alloc")?,
                        ),
                        Caches::Fp8(..) => DevCaches::Fp8(
                            s.alloc_zeros(g.len()).or_fail("alloc")?,
                            s.alloc_zeros(g.len()).or_fail("alloc")?,
                        ),
                    },
                ))
            })
            .collect::<R<Vec<_>>>()?;
        Ok(Self {
            r2t: up(gpu, &m.r2t)?,
            swa: match (&m.swa_map, &m.page_map) {
                (Some(a), Some(b)) => Some((up(gpu, a)?, up(gpu, b)?)),
                _ => None,
            },
            caches,
        })
    }

    fn refresh(&mut self, gpu: &Gpu, m: &EngineMem) -> R {
        let s = gpu.stream();
        s.memcpy_htod(&m.r2t, &mut self.r2t).or_fail("htod")?;
        if let (Some((a, b)), Some(ma), Some(mb)) = (self.swa.as_mut(), &m.swa_map, &m.page_map) {
            s.memcpy_htod(ma, a).or_fail("htod")?;
            s.memcpy_htod(mb, b).or_fail("htod")?;
        }
        Ok(())
    }
}

/// Device copies of one batch's vectors (the engine's batch tensors).
struct DevBatch {
    v: BatchVecs,
    rpi: CudaSlice<i64>,
    seq: CudaSlice<i64>,
    loc: CudaSlice<i64>,
    cu_q: CudaSlice<i32>,
    vl: CudaSlice<i32>,
}

impl DevBatch {
    fn new(gpu: &Gpu, v: &BatchVecs) -> R<Self> {
        Ok(Self {
            rpi: up(gpu, &v.rpi)?,
            seq: up(gpu, &v.seq)?,
            loc: up(gpu, &v.loc)?,
            cu_q: up(gpu, &v.cu_q)?,
            vl: up(gpu, &v.verify_lens)?,
            v: v.clone(),
        })
    }

    fn batch<'a>(
        &'a self,
        r2t: &'a CudaSlice<i32>,
        swa: &'a Option<(CudaSlice<i64>, CudaSlice<i32>)>,
        m: &EngineMem,
    ) -> R<EngineBatch<'a>> {
        let v = &self.v;
        let d = |x: &'a CudaSlice<i64>| Mem::Device(x.slice(0..x.len()));
        Ok(EngineBatch {
            mode: v.mode,
            batch_size: v.bs,
            num_tokens: v.num_tokens,
            max_q_len: v.max_q_len,
            req_to_token: View::new(
                "req_to_token",
                Mem::Device(r2t.slice(0..r2t.len())),
                [m.rows, m.width],
                [m.stride, 1],
            )
            .or_fail("view")?,
            req_pool_indices: View::contiguous("req_pool_indices", d(&self.rpi), [v.bs])
                .or_fail("view")?,
            seq_lens: View::contiguous("seq_lens", d(&self.seq), [v.bs]).or_fail("view")?,
            out_cache_loc: View::contiguous("out_cache_loc", d(&self.loc), [v.num_tokens])
                .or_fail("view")?,
            cu_seqlens_q: (v.mode == AttnMode::Extend)
                .then(|| {
                    View::contiguous(
                        "cu_seqlens_q",
                        Mem::Device(self.cu_q.slice(0..v.bs + 1)),
                        [v.bs + 1],
                    )
                })
                .transpose()
                .or_fail("view")?,
            verify_lens: (v.mode == AttnMode::RaggedVerify)
                .then(|| {
                    View::contiguous("verify_lens", Mem::Device(self.vl.slice(0..v.bs)), [v.bs])
                })
                .transpose()
                .or_fail("view")?,
            swa: match swa {
                Some((a, b)) => Some(EngineSwaMap {
                    full_to_swa: View::contiguous(
                        "full_to_swa",
                        Mem::Device(a.slice(0..a.len())),
                        [a.len()],
                    )
                    .or_fail("view")?,
                    page_map: Some(
                        View::contiguous("page_map", Mem::Device(b.slice(0..b.len())), [b.len()])
                            .or_fail("view")?,
                    ),
                }),
                None => None,
            },
            decode_tail: v.decode_tail,
        })
    }
}

fn kv_cache<'a>(geo: &Geo, c: &'a mut DevCaches) -> R<EngineKvCache<'a>> {
    let (s, st) = (geo.mem_shape(), geo.mem_strides());
    Ok(match c {
        DevCaches::Half(k, v) => EngineKvCache::Half {
            k: ViewMut::kv_cache(
                "k_cache",
                MemMut::Device(k.as_view_mut()),
                geo.layout,
                s,
                st,
            )
            .or_fail("view")?,
            v: ViewMut::kv_cache(
                "v_cache",
                MemMut::Device(v.as_view_mut()),
                geo.layout,
                s,
                st,
            )
            .or_fail("view")?,
        },
        DevCaches::Fp8(k, v) => EngineKvCache::E4m3 {
            k: ViewMut::kv_cache(
                "k_cache",
                MemMut::Device(k.as_view_mut()),
                geo.layout,
                s,
                st,
            )
            .or_fail("view")?,
            v: ViewMut::kv_cache(
                "v_cache",
                MemMut::Device(v.as_view_mut()),
                geo.layout,
                s,
                st,
            )
            .or_fail("view")?,
        },
    })
}

/// Per-layer device q / k / v and a strided output (row stride `Hq·D + 8`).
struct DevIo {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    out: CudaSlice<u16>,
}

fn dev_io(
    gpu: &Gpu,
    c: &BackendConfig,
    io: &[(Vec<u16>, Vec<u16>, Vec<u16>)],
    n: usize,
) -> R<Vec<DevIo>> {
    io.iter()
        .zip(&c.layers)
        .map(|((q, k, v), l)| {
            Ok(DevIo {
                q: up(gpu, q)?,
                k: up(gpu, k)?,
                v: up(gpu, v)?,
                out: up(
                    gpu,
                    &vec![0x7FC1u16; n.max(1) * (l.num_q_heads * l.head_dim + 8)],
                )?,
            })
        })
        .collect()
}

fn layers<'a>(
    c: &BackendConfig,
    n: usize,
    io: &'a mut [DevIo],
    caches: &'a mut [(Geo, DevCaches)],
) -> R<Vec<EngineLayer<'a>>> {
    io.iter_mut()
        .zip(caches.iter_mut())
        .zip(&c.layers)
        .map(|((x, (geo, caches)), l)| {
            let (hq, hkv, d) = (l.num_q_heads, l.num_kv_heads, l.head_dim);
            Ok(EngineLayer {
                q: View::contiguous("q", Mem::Device(x.q.slice(0..x.q.len())), [n, hq, d])
                    .or_fail("view")?,
                k: Some(
                    View::contiguous("k", Mem::Device(x.k.slice(0..x.k.len())), [n, hkv, d])
                        .or_fail("view")?,
                ),
                v: Some(
                    View::contiguous("v", Mem::Device(x.v.slice(0..x.v.len())), [n, hkv, d])
                        .or_fail("view")?,
                ),
                kv_cache: kv_cache(geo, caches)?,
                out: ViewMut::new(
                    "out",
                    MemMut::Device(x.out.as_view_mut()),
                    [n, hq, d],
                    [hq * d + 8, d, 1],
                )
                .or_fail("view")?,
                workspace: None,
                q_scale: 1.0,
            })
        })
        .collect()
}

/// Dense `[n, Hq·D]` rows of a strided device output.
fn read_out(gpu: &Gpu, out: &CudaSlice<u16>, n: usize, row: usize) -> R<Vec<u16>> {
    let all = gpu.stream().clone_dtoh(out).or_fail("dtoh")?;
    Ok((0..n)
        .flat_map(|t| all[t * (row + 8)..t * (row + 8) + row].to_vec())
        .collect())
}

fn same_caches(gpu: &Gpu, own: &MhaBackend, mem: &DevMem, skip_dummy: bool) -> R {
    let s = gpu.stream();
    for (l, (geo, c)) in mem.caches.iter().enumerate() {
        let skip = if skip_dummy {
            geo.p * geo.hkv * geo.d
        } else {
            0
        };
        let ok = match (own.read_kv_cache(l).or_fail("kv")?, c) {
            (KvSnapshot::Half { k, v }, DevCaches::Half(ek, ev)) => {
                geo.slot_major(&s.clone_dtoh(ek).or_fail("dtoh")?)[skip..] == k[skip..]
                    && geo.slot_major(&s.clone_dtoh(ev).or_fail("dtoh")?)[skip..] == v[skip..]
            }
            (KvSnapshot::Fp8 { k, v }, DevCaches::Fp8(ek, ev)) => {
                geo.slot_major(&s.clone_dtoh(ek).or_fail("dtoh")?)[skip..] == k[skip..]
                    && geo.slot_major(&s.clone_dtoh(ev).or_fail("dtoh")?)[skip..] == v[skip..]
            }
            _ => false,
        };
        if !ok {
            return Err(format!(
                "layer {l}: engine caches differ from the owning caches"
            ));
        }
    }
    Ok(())
}

/// Eager: CUDA engine path == CUDA owning path over `steps` passes cycling
/// through every mode.
fn engine_vs_owning(
    gpu: &Arc<Gpu>,
    config: BackendConfig,
    seed: u64,
    steps: u32,
    layouts: fn(usize) -> (KvLayout, usize),
) -> R {
    let mut rng = StdRng::seed_from_u64(seed);
    let dev = Device::Cuda(gpu.context().ordinal());
    let mut own = MhaBackend::new(config.clone(), dev).or_fail("backend")?;
    let mut eng = MhaBackend::new(config.clone(), dev).or_fail("backend")?;
    eng.reserve_engine_metadata(64, 256).or_fail("reserve")?;
    let mut host = own.with_pools(|p| EngineMem::new(&config, p, layouts));
    let mut mem = DevMem::new(gpu, &host)?;
    let mut drv = Driver::new(&config);
    let n_draft = config.spec.map_or(1, |s| s.num_draft_tokens);
    for step in 0..steps {
        let mode = step % 6;
        let b = drv.batch(&mut rng, &own, mode, config.context_len);
        let n = b.out_cache_loc.len();
        let io = inputs(&mut rng, &config, n);
        own.init_forward_metadata(&b).or_fail("metadata")?;
        let mut want = Vec::new();
        for (l, (q, k, v)) in io.iter().enumerate() {
            let o = own
                .forward(
                    l,
                    TensorRef::Host(q),
                    Some(TensorRef::Host(k)),
                    Some(TensorRef::Host(v)),
                    &b,
                    true,
                )
                .or_fail("forward")?;
            want.push(o.to_host().or_fail("out")?);
        }
        let meta = own.metadata().ok_or("meta")?.clone();
        let v = BatchVecs::of(&b, &meta, n_draft);
        own.with_pools(|p| host.mirror(p));
        mem.refresh(gpu, &host)?;
        let db = DevBatch::new(gpu, &v)?;
        let mut dio = dev_io(gpu, &config, &io, n)?;
        {
            let eb = db.batch(&mem.r2t, &mem.swa, &host)?;
            eng.init_forward_metadata_engine(&eb)
                .or_fail("engine metadata")?;
            let mut ls = layers(&config, n, &mut dio, &mut mem.caches)?;
            for (l, io) in ls.iter_mut().enumerate() {
                eng.forward_engine(l, io, &eb, true)
                    .or_fail("forward_engine")?;
            }
        }
        for (l, w) in want.iter().enumerate() {
            let lc = &config.layers[l];
            let got = read_out(gpu, &dio[l].out, n, lc.num_q_heads * lc.head_dim)?;
            let (layout, pad) = layouts(l);
            let what = format!("step {step} ({:?}) layer {l}", meta.mode);
            if layout == KvLayout::Nhd && pad == 0 {
                if &got != w {
                    return Err(format!(
                        "{what}: outputs differ (same strides: bit exact expected)"
                    ));
                }
            } else {
                close(&got, w, &what)?;
            }
        }
        same_caches(gpu, &own, &mem, false).map_err(|e| format!("step {step}: {e}"))?;
    }
    for (name, b) in [("owning", &own), ("engine", &eng)] {
        if !b.device_errors().is_clean() {
            return Err(format!("{name}: device errors {:?}", b.device_errors()));
        }
    }
    Ok(())
}

/// Engine graphs: one bucket per graph mode captured over static engine
/// buffers; each step writes a random batch (padded) into them, runs it
/// eagerly into one output set and replays the graph into the captured
/// one: outputs equal bit for bit, device errors clean.
fn engine_graph_vs_eager(gpu: &Arc<Gpu>, config: BackendConfig, seed: u64, steps: u32) -> R {
    let mut rng = StdRng::seed_from_u64(seed);
    let dev = Device::Cuda(gpu.context().ordinal());
    let own = MhaBackend::new(config.clone(), dev).or_fail("backend")?;
    let mut eng = MhaBackend::new(config.clone(), dev).or_fail("backend")?;
    eng.reserve_engine_metadata(64, 256).or_fail("reserve")?;
    let mut host = own.with_pools(|p| {
        EngineMem::new(&config, p, |l| {
            if l % 2 == 0 {
                (KvLayout::Hnd, 0)
            } else {
                (KvLayout::Nhd, 0)
            }
        })
    });
    let mut mem = DevMem::new(gpu, &host)?;
    let mut drv = Driver::new(&config);
    let n = config.spec.map_or(1, |s| s.num_draft_tokens);
    let s = gpu.stream();
    // (driver mode, bucket bs, bucket tokens, max_q_len)
    for (mode, bs, tokens, attn) in [
        (1u32, 4usize, 4usize, AttnMode::Decode),
        (5, 4, 4, AttnMode::DraftDecode { step: 1 }),
        (2, 4, 4 * n, AttnMode::TargetVerify { q_len: n }),
        (3, 4 * n, 4 * n, AttnMode::RaggedVerify),
    ] {
        // Static engine buffers of the bucket, padding rows: row 0, seq 1, slot 0.
        let pad = BatchVecs {
            mode: attn,
            bs,
            num_tokens: tokens,
            max_q_len: n,
            rpi: vec![0; bs],
            seq: vec![1; bs],
            loc: vec![0; tokens],
            cu_q: vec![0; bs + 1],
            verify_lens: if attn == AttnMode::RaggedVerify {
                vec![1; bs]
            } else {
                vec![0; bs]
            },
            decode_tail: 0,
        };
        let mut sb = DevBatch::new(gpu, &pad)?;
        let io0 = inputs(&mut rng, &config, tokens);
        let mut gio = dev_io(gpu, &config, &io0, tokens)?;
        let key = {
            let eb = sb.batch(&mem.r2t, &mem.swa, &host)?;
            let mut ls = layers(&config, tokens, &mut gio, &mut mem.caches)?;
            eng.capture_engine_graph(&eb, &mut ls, true)
                .or_fail("capture")?
        };
        for step in 0..steps {
            let b = drv.batch(&mut rng, &own, mode, config.context_len);
            if b.batch_size > 4
                || b.out_cache_loc.len() > tokens
                || (mode == 2 && b.out_cache_loc.len() != b.batch_size * n)
            {
                continue;
            }
            own.with_pools(|p| host.mirror(p));
            mem.refresh(gpu, &host)?;
            // The batch padded into the static buffers.
            let real = b.out_cache_loc.len();
            let mut v = pad.clone();
            v.rpi[..b.batch_size].copy_from_slice(&b.req_pool_indices);
            v.seq[..b.batch_size].copy_from_slice(&b.seq_lens);
            v.loc[..real].copy_from_slice(&b.out_cache_loc);
            if attn == AttnMode::RaggedVerify {
                let vl = b.verify_lens().unwrap_or(&[]);
                v.verify_lens[..vl.len()].copy_from_slice(vl);
                // Padding rows take the tokens left over, one each (bs = tokens buckets).
                let left = tokens - real;
                for (i, x) in v.verify_lens.iter_mut().enumerate().skip(vl.len()) {
                    *x = i32::from(i - vl.len() < left);
                }
            }
            s.memcpy_htod(&v.rpi, &mut sb.rpi).or_fail("htod")?;
            s.memcpy_htod(&v.seq, &mut sb.seq).or_fail("htod")?;
            s.memcpy_htod(&v.loc, &mut sb.loc).or_fail("htod")?;
            s.memcpy_htod(&v.verify_lens, &mut sb.vl).or_fail("htod")?;
            let io = inputs(&mut rng, &config, tokens);
            for (g, (q, k, vv)) in gio.iter_mut().zip(&io) {
                s.memcpy_htod(q, &mut g.q).or_fail("htod")?;
                s.memcpy_htod(k, &mut g.k).or_fail("htod")?;
                s.memcpy_htod(vv, &mut g.v).or_fail("htod")?;
            }
            // Eager over the same static inputs, into its own outputs.
            let mut eio = dev_io(gpu, &config, &io, tokens)?;
            {
                let eb = sb.batch(&mem.r2t, &mem.swa, &host)?;
                eng.init_forward_metadata_engine(&eb)
                    .or_fail("engine metadata")?;
                let mut ls = layers(&config, tokens, &mut eio, &mut mem.caches)?;
                for (l, x) in ls.iter_mut().enumerate() {
                    eng.forward_engine(l, x, &eb, true)
                        .or_fail("forward_engine")?;
                }
            }
            eng.replay_engine_graph(key).or_fail("replay")?;
            for (l, lc) in config.layers.iter().enumerate() {
                let row = lc.num_q_heads * lc.head_dim;
                let want = read_out(gpu, &eio[l].out, real, row)?;
                let got = read_out(gpu, &gio[l].out, real, row)?;
                if got != want {
                    return Err(format!(
                        "{attn:?} step {step} layer {l}: replay differs from eager"
                    ));
                }
            }
        }
    }
    if !eng.device_errors().is_clean() {
        return Err(format!("device errors {:?}", eng.device_errors()));
    }
    Ok(())
}

fn main() {
    let steps = gpu_cases(24);
    let replay_steps = gpu_cases(100);
    type Model = (&'static str, fn() -> BackendConfig);
    let models: [Model; 3] = [("dense", dense), ("hybrid", hybrid), ("fp8", fp8)];
    let mut trials = Vec::new();
    for (i, (name, make)) in models.into_iter().enumerate() {
        trials.push(gpu_trial(
            format!("engine_vs_owning/{name}/nhd"),
            move |g: &Arc<Gpu>| {
                engine_vs_owning(g, make(), 300 + i as u64, steps, |_| (KvLayout::Nhd, 0))
            },
        ));
        trials.push(gpu_trial(
            format!("engine_vs_owning/{name}/hnd_padded"),
            move |g: &Arc<Gpu>| {
                engine_vs_owning(g, make(), 310 + i as u64, steps, |l| {
                    if l % 2 == 0 {
                        (KvLayout::Hnd, 64)
                    } else {
                        (KvLayout::Nhd, 128)
                    }
                })
            },
        ));
        trials.push(gpu_trial(
            format!("engine_graph_vs_eager/{name}"),
            move |g: &Arc<Gpu>| engine_graph_vs_eager(g, make(), 320 + i as u64, replay_steps),
        ));
    }
    run_trials(trials)
}
