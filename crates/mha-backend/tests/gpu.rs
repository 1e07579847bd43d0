//! GPU tests of the CUDA executor (`harness = false`; ignored without a GPU):
//! every mode eagerly, CUDA == CPU executor on random batches (outputs
//! within the attention tolerance, caches and metadata live prefixes bit
//! exact) for a dense 32/8/128, a hybrid SWA 64/8/64 (alternating window
//! 127 with sinks) and an FP8 model; graph replay == eager over many random
//! steps per mode (bit exact: same kernels, same shapes); empty batch and
//! IDLE; exhaustion leaves pools and caches unchanged; timing by part
//! (spans per launch, outputs unchanged, nothing recorded in graphs, the
//! context FLOPs of the host formula, refused on the CPU executor); a mixed
//! pass with its context and decode launches concurrent (each order) equals
//! the one-stream pass bit for bit; KV pages moved between two pools on the
//! GPU decode bit for bit.

use std::sync::Arc;

#[path = "common/kv_pages.rs"]
mod kv;

use kernel_rt::testing::{gpu_cases, gpu_trial, multi_gpu_trial, per_rank, run_trials, OrFail};
use kernel_rt::Gpu;
use mha_backend::part_timing::{attention_flops, ragged_causal_pairs};
use mha_backend::{
    resolve_mixed_overlap, BackendConfig, Device, ForwardBatch, ForwardMetadata, GraphKind,
    HalfDtype, KvCacheDtype, KvSnapshot, LayerConfig, MhaBackend, MixedOverlap, PartTimer,
    SpecConfig, TensorRef, MIXED_OVERLAP_ENV,
};
use paged_attention::nccl::{DcpComm, DcpId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type R<T = ()> = Result<T, String>;
/// A named model config.
type Model = (&'static str, fn() -> BackendConfig);

fn spec() -> Option<SpecConfig> {
    Some(SpecConfig {
        num_steps: 3,
        num_draft_tokens: 4,
        topk: 1,
    })
}

/// Dense 32/8/128 (2 layers), P = 16, context 1024.
fn dense() -> BackendConfig {
    let mut c = BackendConfig::dense(2, LayerConfig::new(32, 8, 128), 16, 1024, 400, 16);
    c.spec = spec();
    c.workspace_bytes = Some(64 << 20);
    c
}

/// Hybrid 64/8/64: alternating full / window 127 + sinks layers.
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

/// FP8 e4m3 KV, 32/8/128, checkpoint scales.
fn fp8() -> BackendConfig {
    let mut c = dense();
    c.kv_dtype = KvCacheDtype::Fp8E4m3;
    c.layers = vec![
        LayerConfig::new(32, 8, 128).with_scales(Some(0.5), Some(2.0)),
        LayerConfig::new(32, 8, 128).with_scales(Some(0.25), None),
    ];
    c
}

fn bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

fn to_f32(x: u16) -> f32 {
    half::bf16::from_bits(x).to_f32()
}

fn rand_vec(rng: &mut StdRng, n: usize) -> Vec<u16> {
    (0..n).map(|_| bf16(rng.gen_range(-1.0..1.0))).collect()
}

/// The modes exercised.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Extend { mixed: bool },
    Decode,
    DraftDecode { step: u32 },
    Verify,
    RaggedVerify,
    DraftExtend,
    Idle,
}

const MODES: [Mode; 8] = [
    Mode::Extend { mixed: false },
    Mode::Extend { mixed: true },
    Mode::Decode,
    Mode::DraftDecode { step: 1 },
    Mode::Verify,
    Mode::RaggedVerify,
    Mode::DraftExtend,
    Mode::Idle,
];

/// Backends driven in lock step: the same pool operations on each.
struct World {
    backends: Vec<MhaBackend>,
    live: Vec<usize>,
    config: BackendConfig,
}

impl World {
    fn new(config: &BackendConfig, devices: &[Device]) -> R<Self> {
        let backends = devices
            .iter()
            .map(|&d| MhaBackend::new(config.clone(), d).or_fail("backend"))
            .collect::<R<Vec<_>>>()?;
        Ok(Self {
            backends,
            live: Vec::new(),
            config: config.clone(),
        })
    }

    fn alloc(&mut self, grow: &[(usize, usize)]) -> R<Vec<i64>> {
        let mut out = None;
        for b in &self.backends {
            let s = b.alloc_tokens(grow).or_fail("alloc_tokens")?;
            if out.as_ref().is_some_and(|o| o != &s) {
                return Err("backends allocated different slots".into());
            }
            out = Some(s);
        }
        Ok(out.unwrap_or_default())
    }

    fn new_request(&mut self) -> R<usize> {
        let mut row = None;
        for b in &self.backends {
            let r = b.alloc_request().or_fail("alloc_request")?;
            if row.is_some_and(|x| x != r) {
                return Err("backends gave different rows".into());
            }
            row = Some(r);
        }
        let r = row.ok_or("no backend")?;
        self.live.push(r);
        Ok(r)
    }

    fn len(&self, r: usize) -> usize {
        self.backends[0].with_pools(|p| p.request_len(r).unwrap_or(0))
    }

    fn free(&mut self, r: usize) -> R {
        for b in &self.backends {
            b.free_request(r).or_fail("free")?;
        }
        self.live.retain(|&x| x != r);
        Ok(())
    }

    /// Frees requests until `need` pages and a request row are free, and
    /// long ones, so the context is never exceeded.
    fn make_room(&mut self, rng: &mut StdRng, need_pages: usize) -> R {
        let ctx = self.config.context_len;
        let long: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|&r| self.len(r) + 64 > ctx)
            .collect();
        for r in long {
            self.free(r)?;
        }
        let free = |w: &Self| {
            w.backends[0].with_pools(|p| {
                if p.swa_mapping().is_some() {
                    p.free_pages().min(p.free_swa_pages())
                } else {
                    p.free_pages()
                }
            })
        };
        while !self.live.is_empty()
            && (free(self) < need_pages
                || self.backends[0].with_pools(|p| p.free_request_rows()) == 0
                || rng.gen_bool(0.1))
        {
            let i = rng.gen_range(0..self.live.len());
            self.free(self.live[i])?;
        }
        Ok(())
    }

    /// A random batch of `mode` (pool changes applied on every backend).
    fn batch(&mut self, rng: &mut StdRng, mode: Mode, max_bs: usize) -> R<ForwardBatch> {
        self.make_room(rng, 48)?;
        let n = self.config.spec.map_or(1, |s| s.num_draft_tokens);
        if let Mode::Extend { mixed } = mode {
            let mut rpi = Vec::new();
            let (mut pre, mut ext, mut grow) = (Vec::new(), Vec::new(), Vec::new());
            let bs = rng.gen_range(1..=max_bs.min(4));
            for _ in 0..bs {
                let reuse = !self.live.is_empty() && rng.gen_bool(0.5);
                let r = if reuse {
                    let i = rng.gen_range(0..self.live.len());
                    self.live[i]
                } else if self.backends[0].with_pools(|p| p.free_request_rows()) > 0 {
                    self.new_request()?
                } else {
                    continue;
                };
                if rpi.contains(&(r as i64)) {
                    continue;
                }
                let e = if mixed && rng.gen_bool(0.5) {
                    1
                } else {
                    rng.gen_range(0..24)
                };
                pre.push(self.len(r) as i32);
                ext.push(e);
                grow.push((r, e as usize));
                rpi.push(r as i64);
            }
            let out = self.alloc(&grow)?;
            return Ok(ForwardBatch::extend(rpi, pre, ext, out, mixed));
        }
        if matches!(mode, Mode::Idle) {
            return Ok(ForwardBatch::idle());
        }
        // Decode-like: existing requests with at least one token.
        while self.live.len() < 2 {
            let r = self.new_request()?;
            let l = rng.gen_range(1..100);
            self.alloc(&[(r, l)])?;
        }
        let mut rows: Vec<usize> = self.live.clone();
        rows.truncate(rng.gen_range(1..=max_bs.min(rows.len())));
        let q = rng.gen_range(1..=n);
        let lens: Vec<usize> = rows
            .iter()
            .map(|_| match mode {
                Mode::Decode | Mode::DraftDecode { .. } => 1,
                Mode::RaggedVerify => rng.gen_range(1..=n),
                _ => q,
            })
            .collect();
        let old: Vec<i64> = rows.iter().map(|&r| self.len(r) as i64).collect();
        let grow: Vec<(usize, usize)> = rows.iter().copied().zip(lens.iter().copied()).collect();
        let out = self.alloc(&grow)?;
        let rpi: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        Ok(match mode {
            Mode::Decode => ForwardBatch::decode(rpi, old.iter().map(|l| l + 1).collect(), out),
            Mode::DraftDecode { step } => {
                // Attention length seq + step + 1 = the new length.
                let seq = old.iter().map(|l| l + 1 - i64::from(step) - 1).collect();
                ForwardBatch::draft_decode(rpi, seq, out, Some(step))
            }
            Mode::Verify => ForwardBatch::target_verify(rpi, old, out, None),
            Mode::RaggedVerify => ForwardBatch::target_verify(
                rpi,
                old,
                out,
                Some(lens.iter().map(|&l| l as i32).collect()),
            ),
            Mode::DraftExtend => ForwardBatch::draft_extend_v2(
                rpi,
                old.iter().map(|l| l + q as i64).collect(),
                out,
                q as i32,
            ),
            _ => unreachable!("handled above"),
        })
    }
}

/// Random q / k / v of a pass for every layer.
fn inputs(rng: &mut StdRng, c: &BackendConfig, rows: usize) -> Vec<(Vec<u16>, Vec<u16>, Vec<u16>)> {
    c.layers
        .iter()
        .map(|l| {
            let qn = rows * l.num_q_heads * l.head_dim;
            let kn = rows * l.num_kv_heads * l.head_dim;
            (rand_vec(rng, qn), rand_vec(rng, kn), rand_vec(rng, kn))
        })
        .collect()
}

fn close(got: &[u16], want: &[u16], what: &str) -> R {
    if got.len() != want.len() {
        return Err(format!("{what}: {} vs {} elements", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (to_f32(g), to_f32(w));
        if (g - w).abs() > 2e-2 + 2e-2 * w.abs() || g.is_nan() != w.is_nan() {
            return Err(format!("{what}: element {i}: got {g}, want {w}"));
        }
    }
    Ok(())
}

/// Device metadata == host metadata on the live prefixes.
fn same_metadata(b: &MhaBackend, want: &ForwardMetadata, graph: bool, p: usize) -> R {
    let Some(got) = b.read_device_metadata(graph).or_fail("read metadata")? else {
        return Err("no device metadata".into());
    };
    if !want.tables_on_host {
        return Err("the reference metadata has no host page tables".into());
    }
    let bs = want.batch_size;
    if got.cache_seqlens[..bs] != want.cache_seqlens[..] {
        return Err(format!(
            "cache_seqlens {:?} vs {:?}",
            got.cache_seqlens, want.cache_seqlens
        ));
    }
    if got.cu_seqlens_k[..=bs] != want.cu_seqlens_k[..] {
        return Err(format!(
            "cu_seqlens_k {:?} vs {:?}",
            got.cu_seqlens_k, want.cu_seqlens_k
        ));
    }
    if got.cu_seqlens_q[..=bs] != want.cu_seqlens_q[..] {
        return Err(format!(
            "cu_seqlens_q {:?} vs {:?}",
            got.cu_seqlens_q, want.cu_seqlens_q
        ));
    }
    let m = want.max_num_pages;
    for i in 0..bs {
        let row = want.page_row(i, p);
        if got.page_table[i * m..][..row.len()] != *row {
            return Err(format!("page_table row {i}"));
        }
        if let (Some(g), Some(w)) = (&got.swa_page_table, want.swa_page_row(i, p)) {
            if g[i * m..][..w.len()] != *w {
                return Err(format!("swa_page_table row {i}"));
            }
        }
    }
    if let (Some(g), Some(w)) = (&got.swa_out_cache_loc, &want.swa_out_cache_loc) {
        if g[..w.len()] != w[..] {
            return Err("swa_out_cache_loc".into());
        }
    }
    Ok(())
}

/// Every layer's q / k / v as the graph backend's static inputs.
fn write_inputs(graph: &mut MhaBackend, io: &[(Vec<u16>, Vec<u16>, Vec<u16>)]) -> R {
    for (l, (q, k, v)) in io.iter().enumerate() {
        graph
            .write_graph_inputs(
                l,
                TensorRef::Host(q),
                TensorRef::Host(k),
                TensorRef::Host(v),
            )
            .or_fail("graph inputs")?;
    }
    Ok(())
}

/// Runs one eager pass on a backend; returns each layer's host output.
fn run_eager(
    b: &mut MhaBackend,
    batch: &ForwardBatch,
    io: &[(Vec<u16>, Vec<u16>, Vec<u16>)],
) -> R<Vec<Vec<u16>>> {
    b.init_forward_metadata(batch).or_fail("metadata")?;
    let mut outs = Vec::new();
    for (l, (q, k, v)) in io.iter().enumerate() {
        let o = b
            .forward(
                l,
                TensorRef::Host(q),
                Some(TensorRef::Host(k)),
                Some(TensorRef::Host(v)),
                batch,
                true,
            )
            .or_fail("forward")?;
        outs.push(o.to_host().or_fail("output")?);
    }
    Ok(outs)
}

/// Layer caches equal, bit for bit. With `skip_dummy`, page 0 (the dummy
/// page that padding rows of a graph bucket write to, several rows into one
/// slot in no fixed order) is left out.
fn same_caches(a: &MhaBackend, b: &MhaBackend, config: &BackendConfig, skip_dummy: bool) -> R {
    for (l, lc) in config.layers.iter().enumerate() {
        let skip = if skip_dummy {
            config.page_size * lc.num_kv_heads * lc.head_dim
        } else {
            0
        };
        let (x, y) = (
            a.read_kv_cache(l).or_fail("kv")?,
            b.read_kv_cache(l).or_fail("kv")?,
        );
        let same = match (&x, &y) {
            (KvSnapshot::Half { k: k0, v: v0 }, KvSnapshot::Half { k: k1, v: v1 }) => {
                k0.get(skip..) == k1.get(skip..) && v0.get(skip..) == v1.get(skip..)
            }
            (KvSnapshot::Fp8 { k: k0, v: v0 }, KvSnapshot::Fp8 { k: k1, v: v1 }) => {
                k0.get(skip..) == k1.get(skip..) && v0.get(skip..) == v1.get(skip..)
            }
            _ => false,
        };
        if !same {
            return Err(format!("layer {l}: caches differ"));
        }
    }
    Ok(())
}

/// Eager: CUDA == CPU for `steps` random passes of `mode`.
fn eager_vs_cpu(config: BackendConfig, mode: Mode, seed: u64, steps: u32) -> R {
    eager_vs_cpu_on(config, mode, seed, steps, gpu_ordinal(), None)
}

/// [`eager_vs_cpu`] on `cuda:ordinal`, the CUDA backend's decode passes
/// running `comm`'s rank when one is given (decode context parallelism
/// over NCCL; the CPU executor simulates the same `decode_cp_ranks`).
fn eager_vs_cpu_on(
    config: BackendConfig,
    mode: Mode,
    seed: u64,
    steps: u32,
    ordinal: usize,
    comm: Option<Arc<DcpComm>>,
) -> R {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = World::new(&config, &[Device::Cpu, Device::Cuda(ordinal)])?;
    if let Some(c) = comm {
        w.backends[1].attach_decode_comm(c).or_fail("attach")?;
    }
    let p = config.page_size;
    for step in 0..steps {
        let batch = w.batch(&mut rng, mode, 8)?;
        let rows = batch.out_cache_loc.len();
        let io = inputs(&mut rng, &config, rows);
        let [cpu, cuda] = &mut w.backends[..] else {
            return Err("two backends".into());
        };
        let want = run_eager(cpu, &batch, &io).map_err(|e| format!("cpu: {e}"))?;
        let got = run_eager(cuda, &batch, &io).map_err(|e| format!("cuda: {e}"))?;
        let meta = cpu.metadata().ok_or("cpu metadata")?.clone();
        same_metadata(cuda, &meta, false, p).map_err(|e| format!("step {step}: {e}"))?;
        for (l, (g, wv)) in got.iter().zip(&want).enumerate() {
            close(g, wv, &format!("step {step} layer {l}"))?;
        }
        same_caches(cpu, cuda, &config, false).map_err(|e| format!("step {step}: {e}"))?;
        if !cuda.device_errors().is_clean() {
            return Err(format!("device errors {:?}", cuda.device_errors()));
        }
    }
    Ok(())
}

fn gpu_ordinal() -> usize {
    Gpu::shared().map(|g| g.context().ordinal()).unwrap_or(0)
}

/// Graph replay == eager (padded batch) over `steps` random steps: one
/// backend replays graphs, the other runs the padded batch eagerly.
fn graph_vs_eager(config: BackendConfig, mode: Mode, seed: u64, steps: u32) -> R {
    graph_vs_eager_with(config, mode, seed, steps, None)
}

/// [`graph_vs_eager`], both backends' decode passes running `comm`'s rank
/// when one is given (one GPU: both share the rank's stream, in order);
/// then `comm` is aborted and a replay and an eager pass must fail naming
/// the abort's reason.
fn graph_vs_eager_with(
    config: BackendConfig,
    mode: Mode,
    seed: u64,
    steps: u32,
    comm: Option<Arc<DcpComm>>,
) -> R {
    let mut rng = StdRng::seed_from_u64(seed);
    let dev = Device::Cuda(gpu_ordinal());
    let mut w = World::new(&config, &[dev, dev])?;
    if let Some(c) = &comm {
        for b in &mut w.backends {
            b.attach_decode_comm(c.clone()).or_fail("attach")?;
        }
    }
    let n = config.spec.map_or(1, |s| s.num_draft_tokens);
    let (kind, q) = match mode {
        Mode::Decode | Mode::Idle => (GraphKind::Decode, 1),
        Mode::DraftDecode { step } => (GraphKind::DraftDecode { step }, 1),
        Mode::Verify => (GraphKind::TargetVerify, 0),
        Mode::RaggedVerify => (GraphKind::RaggedVerify, 0),
        Mode::DraftExtend => (GraphKind::DraftExtendV2, 0),
        Mode::Extend { .. } => return Err("extend has no graphs".into()),
    };
    let max_bs = 8;
    w.backends[1]
        .init_cuda_graph_state(max_bs * n, max_bs * n)
        .or_fail("graph state")?;
    if kind == GraphKind::RaggedVerify {
        // Upstream's ragged keying: bs = num_tokens (SEMANTICS.md §backend.5).
        let mut t = 1;
        while t <= max_bs * n {
            w.backends[1]
                .capture_cuda_graph(kind, t, t)
                .or_fail("capture")?;
            t *= 2;
        }
        if (max_bs * n).count_ones() != 1 {
            w.backends[1]
                .capture_cuda_graph(kind, max_bs * n, max_bs * n)
                .or_fail("capture")?;
        }
    }
    for bs in [1, 2, 4, 8] {
        match kind {
            GraphKind::TargetVerify | GraphKind::DraftExtendV2 => {
                for ql in 1..=n {
                    w.backends[1]
                        .capture_cuda_graph(kind, bs, bs * ql)
                        .or_fail("capture")?;
                }
            }
            GraphKind::RaggedVerify => {}
            _ => {
                w.backends[1]
                    .capture_cuda_graph(kind, bs, bs * q)
                    .or_fail("capture")?;
            }
        }
    }
    let p = config.page_size;
    for step in 0..steps {
        let batch = w.batch(&mut rng, mode, max_bs)?;
        let [eager, graph] = &mut w.backends[..] else {
            return Err("two backends".into());
        };
        let key = graph.select_cuda_graph(&batch).or_fail("select")?;
        let padded = match kind {
            GraphKind::RaggedVerify => batch.pad_to_bucket(key.bs, key.num_tokens, n as u32),
            _ => batch.pad_to_bucket(key.bs, key.num_tokens, key.q_len as u32),
        }
        .or_fail("pad")?;
        let io = inputs(&mut rng, &config, key.num_tokens);
        write_inputs(graph, &io)?;
        let used = graph.replay_cuda_graph(&batch).or_fail("replay")?;
        if used != key {
            return Err(format!("replayed {used:?}, selected {key:?}"));
        }
        let want = run_eager(eager, &padded, &io)?;
        // The CUDA executor's host metadata leaves the tables to the device:
        // compare with the full host build of the same batch.
        let meta = eager
            .reference_metadata(&padded)
            .or_fail("reference metadata")?;
        same_metadata(graph, &meta, true, p).map_err(|e| format!("step {step}: {e}"))?;
        let real_rows = batch.out_cache_loc.len();
        for (l, wv) in want.iter().enumerate() {
            let row = config.layers[l].num_q_heads * config.layers[l].head_dim;
            let got = graph
                .read_graph_output(l, real_rows)
                .or_fail("graph output")?;
            if got[..] != wv[..real_rows * row] {
                return Err(format!(
                    "step {step} layer {l}: replay output differs from eager"
                ));
            }
        }
        // Whole-cache read-backs are large: every 25 steps and at the end
        // (cache differences persist, so none is missed).
        if step % 25 == 0 || step + 1 == steps {
            same_caches(eager, graph, &config, true).map_err(|e| format!("step {step}: {e}"))?;
        }
    }
    if let Some(c) = comm {
        // Once the membership is aborted (a peer rank failed), the graph
        // that captured its all-gathers is refused and an eager decode
        // pass fails at its all-gather, both naming the reason.
        const WHY: &str = "test: a peer rank failed";
        c.abort(WHY).or_fail("abort")?;
        let batch = w.batch(&mut rng, mode, max_bs)?;
        let [eager, graph] = &mut w.backends[..] else {
            return Err("two backends".into());
        };
        match graph.replay_cuda_graph(&batch) {
            Err(e) if e.to_string().contains(WHY) => {}
            other => return Err(format!("replay after the abort: {other:?}")),
        }
        let io = inputs(&mut rng, &config, batch.out_cache_loc.len());
        match run_eager(eager, &batch, &io) {
            Err(e) if e.contains(WHY) => {}
            other => {
                return Err(format!(
                    "eager pass after the abort: {:?}",
                    other.map(|_| ())
                ))
            }
        }
    }
    Ok(())
}

fn empty_and_idle(config: BackendConfig) -> R {
    let auto = MhaBackend::new(config.clone(), Device::Auto).or_fail("auto")?;
    if !matches!(auto.executor_kind(), mha_backend::ExecutorKind::Cuda(_)) {
        return Err(format!(
            "Device::Auto with a GPU gave {}",
            auto.executor_kind()
        ));
    }
    drop(auto);
    let mut b = MhaBackend::new(config.clone(), Device::Cuda(gpu_ordinal())).or_fail("backend")?;
    for batch in [
        ForwardBatch::idle(),
        ForwardBatch::decode(vec![], vec![], vec![]),
        ForwardBatch::extend(vec![], vec![], vec![], vec![], false),
    ] {
        b.init_forward_metadata(&batch).or_fail("metadata")?;
        for l in 0..config.layers.len() {
            let o = b
                .forward(l, TensorRef::Host(&[]), None, None, &batch, true)
                .or_fail("forward")?;
            if !o.is_empty() {
                return Err("empty batch gave output".into());
            }
        }
    }
    // A decode graph replays an IDLE batch as padding rows only.
    b.init_cuda_graph_state(4, 4).or_fail("graph state")?;
    b.capture_cuda_graph(GraphKind::Decode, 4, 4)
        .or_fail("capture")?;
    b.replay_cuda_graph(&ForwardBatch::idle())
        .or_fail("idle replay")?;
    // Extend has no graph: a typed error, no fallback.
    let e = b.select_cuda_graph(&ForwardBatch::extend(vec![], vec![], vec![], vec![], false));
    if !matches!(e, Err(mha_backend::BackendError::GraphUnsupported(_))) {
        return Err(format!("extend graph selection: {e:?}"));
    }
    Ok(())
}

fn exhaustion(config: BackendConfig) -> R {
    let mut c = config;
    c.num_pages = 8;
    if c.num_swa_pages.is_some() {
        c.num_swa_pages = Some(8);
    }
    let mut b = MhaBackend::new(c.clone(), Device::Cuda(gpu_ordinal())).or_fail("backend")?;
    let r = b.alloc_request().or_fail("req")?;
    let out = b.alloc_tokens(&[(r, 5 * c.page_size)]).or_fail("alloc")?;
    let mut rng = StdRng::seed_from_u64(7);
    let batch = ForwardBatch::extend(vec![r as i64], vec![0], vec![out.len() as i32], out, false);
    let io = inputs(&mut rng, &c, batch.out_cache_loc.len());
    run_eager(&mut b, &batch, &io)?;
    let pools = b.pools_snapshot();
    let caches: Vec<_> = (0..c.layers.len())
        .map(|l| b.read_kv_cache(l).or_fail("kv"))
        .collect::<R<_>>()?;
    if b.alloc_tokens(&[(r, 4 * c.page_size)]).is_ok() {
        return Err("over-allocation succeeded".into());
    }
    if b.pools_snapshot() != pools {
        return Err("pools changed on exhaustion".into());
    }
    for (l, want) in caches.iter().enumerate() {
        if &b.read_kv_cache(l).or_fail("kv")? != want {
            return Err(format!("layer {l} cache changed on exhaustion"));
        }
    }
    Ok(())
}

/// Timing by part: a mixed pass (two prefill chunks, one over a prefix,
/// then two one-token decode rows) run with a timer installed gives the
/// same outputs and caches as without, one K/V-write, one context and one
/// decode span per layer (the decode span chained to the context span's
/// end: 5 events), the context FLOPs of the host formula over the prefill
/// requests only; a reset timer is reused without new events; a decode
/// pass gives write + decode spans; graph capture and replay record
/// nothing; the CPU executor refuses a timer.
fn part_timing(config: BackendConfig, gpu: &Arc<Gpu>) -> R {
    let mut rng = StdRng::seed_from_u64(31);
    let dev = Device::Cuda(gpu_ordinal());
    let mut w = World::new(&config, &[dev, dev])?;
    let layers = config.layers.len();
    // Requests: 20 new over none, 5 new over 30 cached, two decodes over 10.
    let rows: Vec<usize> = (0..4).map(|_| w.new_request()).collect::<R<_>>()?;
    for (&r, pre) in rows.iter().zip([0, 30, 10, 10]) {
        if pre > 0 {
            w.alloc(&[(r, pre)])?;
        }
    }
    let ext = [20, 5, 1, 1];
    let pre = [0, 30, 10, 10];
    let grow: Vec<(usize, usize)> = rows.iter().copied().zip(ext).collect();
    let out = w.alloc(&grow)?;
    let batch = ForwardBatch::extend(
        rows.iter().map(|&r| r as i64).collect(),
        pre.to_vec(),
        ext.map(|e| e as i32).to_vec(),
        out,
        true,
    );
    let io = inputs(&mut rng, &config, batch.out_cache_loc.len());
    let [plain, timed] = &mut w.backends[..] else {
        return Err("two backends".into());
    };
    let want = run_eager(plain, &batch, &io)?;
    if timed
        .set_part_timer(Some(PartTimer::new(gpu)))
        .or_fail("install")?
        .is_some()
    {
        return Err("a timer was installed before".into());
    }
    let got = run_eager(timed, &batch, &io)?;
    let mut timer = timed
        .set_part_timer(None)
        .or_fail("take back")?
        .ok_or("no timer came back")?;
    if got != want {
        return Err("outputs differ with the timer installed".into());
    }
    same_caches(plain, timed, &config, false)?;
    // One stream: write, context, decode chained (3 spans, 5 events). With
    // the launches concurrent: write (2 events), the wall span (its start
    // and end), decode and context each on their own stream (2 + 2).
    let overlap = resolve_mixed_overlap(std::env::var(MIXED_OVERLAP_ENV).ok().as_deref())
        .or_fail("overlap env")?;
    let (spans, events) = if overlap == MixedOverlap::Off {
        (3, 5)
    } else {
        (4, 8)
    };
    if (timer.spans(), timer.events_recorded()) != (spans * layers, events * layers) {
        return Err(format!(
            "{} spans / {} events for {layers} layers (want {spans} / {events} per layer, {overlap:?})",
            timer.spans(),
            timer.events_recorded()
        ));
    }
    let t = timer.read().or_fail("read")?;
    if !(t.kv_write_s > 0.0 && t.context_s > 0.0 && t.decode_s > 0.0)
        || t.total_s() > 1.0
        || t.concurrent_s < 0.0
        || t.concurrent_s > t.context_s.min(t.decode_s)
        || (overlap == MixedOverlap::Off && t.concurrent_s != 0.0)
    {
        return Err(format!("implausible part times {t:?}"));
    }
    // The context kernel gets the two prefill chunks, not the decode tail.
    let meta = timed.metadata().ok_or("metadata")?;
    let want_flops: f64 = config
        .layers
        .iter()
        .map(|l| {
            let pairs = ragged_causal_pairs(
                &meta.cu_seqlens_q[..3],
                &meta.cache_seqlens[..2],
                l.window_left,
            );
            attention_flops(l.num_q_heads, l.head_dim, pairs)
        })
        .sum();
    if t.context_flops != want_flops || want_flops <= 0.0 {
        return Err(format!("context FLOPs {} vs {want_flops}", t.context_flops));
    }
    // Reused for a decode pass: no new event, write + decode spans only.
    let created = timer.events_created();
    timer.reset();
    if timer.spans() != 0 || timer.read().or_fail("read empty")?.total_s() != 0.0 {
        return Err("reset left spans".into());
    }
    let seq: Vec<i64> = rows.iter().map(|&r| w.len(r) as i64 + 1).collect();
    let grow: Vec<(usize, usize)> = rows.iter().map(|&r| (r, 1)).collect();
    let out = w.alloc(&grow)?;
    let decode = ForwardBatch::decode(rows.iter().map(|&r| r as i64).collect(), seq, out);
    let io = inputs(&mut rng, &config, rows.len());
    let [plain, timed] = &mut w.backends[..] else {
        return Err("two backends".into());
    };
    let want = run_eager(plain, &decode, &io)?;
    timed.set_part_timer(Some(timer)).or_fail("install")?;
    let got = run_eager(timed, &decode, &io)?;
    // Graph capture and replay with the timer installed record nothing.
    timed.init_cuda_graph_state(8, 8).or_fail("graph state")?;
    timed
        .capture_cuda_graph(GraphKind::Decode, 4, 4)
        .or_fail("capture")?;
    timed.replay_cuda_graph(&decode).or_fail("replay")?;
    timed.read_graph_output(0, 4).or_fail("graph output")?;
    let timer = timed
        .set_part_timer(None)
        .or_fail("take back")?
        .ok_or("no timer came back")?;
    if got != want {
        return Err("decode outputs differ with the timer installed".into());
    }
    if (timer.spans(), timer.events_recorded()) != (2 * layers, 4 * layers) {
        return Err(format!(
            "decode: {} spans / {} events (want 2 / 4 per layer; graphs record none)",
            timer.spans(),
            timer.events_recorded()
        ));
    }
    if timer.events_created() != created {
        return Err(format!(
            "{} events created after reuse, {created} before",
            timer.events_created()
        ));
    }
    let t = timer.read().or_fail("read")?;
    if !(t.kv_write_s > 0.0 && t.decode_s > 0.0) || t.context_s != 0.0 || t.context_flops != 0.0 {
        return Err(format!("decode part times {t:?}"));
    }
    // The CPU executor has no CUDA events: a typed error, never zeros.
    let mut cpu = MhaBackend::new(config, Device::Cpu).or_fail("cpu backend")?;
    if cpu.set_part_timer(Some(timer)).is_ok() {
        return Err("the CPU executor accepted a part timer".into());
    }
    if cpu.set_part_timer(None).or_fail("cpu none")?.is_some() {
        return Err("the CPU executor returned a timer".into());
    }
    Ok(())
}

/// Decode passes of 128 requests (1,024 work items at 8 KV heads: above
/// the full-launch threshold on a 132-SM GPU, so unsplit and in the length
/// order, reading the pass's order written once): eager CUDA == the CPU
/// executor, and a graph replay of the 128-request bucket == eager bit for
/// bit, over `steps` passes whose lengths change (the order written again
/// each pass, eager and replayed). bf16 and FP8 K/V.
fn large_decode_batches(mut config: BackendConfig, seed: u64, steps: u32) -> R {
    const BS: usize = 128;
    config.spec = None;
    config.max_requests = BS + 8;
    config.num_pages = BS * (config.context_len / config.page_size + 1);
    let mut rng = StdRng::seed_from_u64(seed);
    let dev = Device::Cuda(gpu_ordinal());
    let mut w = World::new(&config, &[Device::Cpu, dev, dev])?;
    let mut rows = Vec::with_capacity(BS);
    for _ in 0..BS {
        let r = w.new_request()?;
        let l = rng.gen_range(1..config.context_len - 3 * steps as usize - 8);
        w.alloc(&[(r, l)])?;
        rows.push(r);
    }
    w.backends[2]
        .init_cuda_graph_state(BS, BS)
        .or_fail("graph state")?;
    w.backends[2]
        .capture_cuda_graph(GraphKind::Decode, BS, BS)
        .or_fail("capture")?;
    for step in 0..steps {
        // A random subset keeps the lengths ragged and changing.
        let grow: Vec<(usize, usize)> = rows.iter().map(|&r| (r, 1)).collect();
        let old: Vec<i64> = rows.iter().map(|&r| w.len(r) as i64).collect();
        let out = w.alloc(&grow)?;
        let rpi: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let batch = ForwardBatch::decode(rpi, old.iter().map(|l| l + 1).collect(), out);
        let io = inputs(&mut rng, &config, BS);
        let [cpu, cuda, graph] = &mut w.backends[..] else {
            return Err("three backends".into());
        };
        let want = run_eager(cpu, &batch, &io).map_err(|e| format!("cpu: {e}"))?;
        let got = run_eager(cuda, &batch, &io).map_err(|e| format!("cuda: {e}"))?;
        for (l, (g, wv)) in got.iter().zip(&want).enumerate() {
            close(g, wv, &format!("step {step} layer {l}"))?;
        }
        write_inputs(graph, &io)?;
        graph.replay_cuda_graph(&batch).or_fail("replay")?;
        for (l, g) in got.iter().enumerate() {
            let row = config.layers[l].num_q_heads * config.layers[l].head_dim;
            let r = graph.read_graph_output(l, BS).or_fail("graph output")?;
            if r[..] != g[..BS * row] {
                return Err(format!(
                    "step {step} layer {l}: replay output differs from eager"
                ));
            }
        }
        for b in [&*cuda, &*graph] {
            if !b.device_errors().is_clean() {
                return Err(format!("device errors {:?}", b.device_errors()));
            }
        }
        // Lengths move apart: some requests grow by a few tokens more.
        let mut more = Vec::new();
        for &r in &rows {
            if rng.gen_bool(0.3) {
                more.push((r, rng.gen_range(1..3)));
            }
        }
        w.alloc(&more)?;
    }
    Ok(())
}

fn main() {
    let steps = gpu_cases(12);
    let replay_steps = gpu_cases(1000);
    let models: [Model; 3] = [("dense", dense), ("hybrid", hybrid), ("fp8", fp8)];
    let mut trials = Vec::new();
    for (name, make) in models {
        for (i, mode) in MODES.iter().copied().enumerate() {
            trials.push(gpu_trial(
                format!("eager_vs_cpu/{name}/{mode:?}"),
                move |_g: &Arc<Gpu>| eager_vs_cpu(make(), mode, 100 + i as u64, steps),
            ));
            if !matches!(mode, Mode::Extend { .. }) {
                trials.push(gpu_trial(
                    format!("graph_vs_eager/{name}/{mode:?}"),
                    move |_g: &Arc<Gpu>| graph_vs_eager(make(), mode, 200 + i as u64, replay_steps),
                ));
            }
        }
        trials.push(gpu_trial(
            format!("empty_and_idle/{name}"),
            move |_g: &Arc<Gpu>| empty_and_idle(make()),
        ));
        trials.push(gpu_trial(
            format!("exhaustion/{name}"),
            move |_g: &Arc<Gpu>| exhaustion(make()),
        ));
        trials.push(gpu_trial(
            format!("part_timing/{name}"),
            move |g: &Arc<Gpu>| part_timing(make(), g),
        ));
        trials.push(gpu_trial(
            format!("mixed_overlap_bit_exact/{name}"),
            move |g: &Arc<Gpu>| mixed_overlap_bit_exact(make(), g),
        ));
    }
    for (name, make) in [("dense", dense as fn() -> BackendConfig), ("fp8", fp8)] {
        trials.push(gpu_trial(
            format!("large_decode_batches/{name}"),
            move |_g: &Arc<Gpu>| large_decode_batches(make(), 500, steps.min(6) as u32),
        ));
    }
    trials.push(gpu_trial(
        "kv_pages_two_pools_round_trip",
        |_g: &Arc<Gpu>| kv::moved_pages_decode_bit_for_bit(Device::Cuda(gpu_ordinal())),
    ));
    // Issue 17: the export / import round trip between two GPUs' pools.
    trials.push(multi_gpu_trial(
        "kv_pages_two_gpus_round_trip",
        2,
        |_g: &Arc<Gpu>| kv::moved_pages_between(Device::Cuda(0), Device::Cuda(1)),
    ));
    // Decode context parallelism simulated on the GPU (issue 17): every mode
    // against the CPU executor's cp::simulate, graph replay == eager.
    for (name, make) in models {
        for (i, mode) in MODES.iter().copied().enumerate() {
            let ranks = 2 + 2 * (i % 2); // 2 or 4
            let with_cp = move || {
                let mut c = make();
                c.decode_cp_ranks = ranks;
                c
            };
            trials.push(gpu_trial(
                format!("decode_cp_eager_vs_cpu/{name}/{ranks}/{mode:?}"),
                move |_g: &Arc<Gpu>| eager_vs_cpu(with_cp(), mode, 300 + i as u64, steps),
            ));
            if matches!(mode, Mode::Decode | Mode::Verify | Mode::RaggedVerify) {
                trials.push(gpu_trial(
                    format!("decode_cp_graph_vs_eager/{name}/{ranks}/{mode:?}"),
                    move |_g: &Arc<Gpu>| graph_vs_eager(with_cp(), mode, 400 + i as u64, steps),
                ));
            }
        }
    }
    trials.push(gpu_trial(
        "decode_cp_engine_memory_is_refused",
        |_g: &Arc<Gpu>| decode_cp_engine_memory_is_refused(),
    ));
    // Decode context parallelism over NCCL (issue 17): a group of one rank
    // on this GPU runs the multi-GPU path (own launch, all-gather, merge)
    // in every decode-kernel mode, eager against the CPU executor and
    // graph replay against eager; with two or more GPUs, one rank a GPU.
    for (name, make) in models {
        for (i, mode) in MODES.iter().copied().enumerate() {
            if matches!(mode, Mode::Extend { .. }) {
                continue;
            }
            trials.push(gpu_trial(
                format!("decode_comm_one_rank_vs_cpu/{name}/{mode:?}"),
                move |_g: &Arc<Gpu>| {
                    let comm = one_rank_comm()?;
                    eager_vs_cpu_on(
                        make(),
                        mode,
                        500 + i as u64,
                        steps,
                        gpu_ordinal(),
                        Some(comm),
                    )
                },
            ));
            if matches!(mode, Mode::Decode | Mode::Verify | Mode::RaggedVerify) {
                trials.push(gpu_trial(
                    format!("decode_comm_one_rank_graph_vs_eager/{name}/{mode:?}"),
                    move |_g: &Arc<Gpu>| {
                        let comm = one_rank_comm()?;
                        graph_vs_eager_with(make(), mode, 600 + i as u64, steps, Some(comm))
                    },
                ));
            }
        }
        trials.push(multi_gpu_trial(
            format!("decode_comm_ranks_vs_cpu/{name}"),
            2,
            move |_g: &Arc<Gpu>| decode_comm_ranks_vs_cpu(make(), steps),
        ));
    }
    trials.push(gpu_trial("decode_comm_refusals", |_g: &Arc<Gpu>| {
        decode_comm_refusals()
    }));
    let _ = HalfDtype::Bf16;
    run_trials(trials)
}

/// A one-rank NCCL group on this GPU (the backend's own stream).
fn one_rank_comm() -> R<Arc<DcpComm>> {
    let gpu = Gpu::shared_on(gpu_ordinal()).or_fail("gpu")?;
    let id = DcpId::new().or_fail("nccl id (libnccl on LD_LIBRARY_PATH?)")?;
    Ok(Arc::new(DcpComm::new(&gpu, 0, 1, id).or_fail("join")?))
}

/// One rank a GPU (`N` = the devices, at most 4; the trial needs two): each rank's
/// thread runs the same seeded decode and verify passes with its decode
/// passes over NCCL and compares with its own CPU executor simulating the
/// `N` ranks. Each mode's first mismatch ends that mode on every rank at
/// the same step (the ranks merge the same gathered states and compare with
/// the same reference); a failure of one rank alone (driver, device errors)
/// would leave the others in an all-gather, until the trial's timeout.
fn decode_comm_ranks_vs_cpu(base: BackendConfig, steps: u32) -> R {
    let devices = match kernel_rt::gpu_status() {
        kernel_rt::GpuStatus::Available { devices } => *devices,
        kernel_rt::GpuStatus::Missing(m) => return Err(m.clone()),
    };
    let ranks = devices.min(4);
    if ranks < 2 {
        return Err(format!("{devices} device(s): the trial needs two"));
    }
    let id = DcpId::new().or_fail("nccl id (libnccl on LD_LIBRARY_PATH?)")?;
    let mut config = base;
    config.decode_cp_ranks = ranks;
    let results = per_rank(ranks, |rank| -> R {
        let gpu = Gpu::shared_on(rank).or_fail("gpu")?;
        let comm = Arc::new(DcpComm::new(&gpu, rank, ranks, id).or_fail("join")?);
        let mut first_err = None;
        for (i, mode) in [Mode::Decode, Mode::Verify, Mode::RaggedVerify]
            .into_iter()
            .enumerate()
        {
            let r = eager_vs_cpu_on(
                config.clone(),
                mode,
                700 + i as u64,
                steps,
                rank,
                Some(comm.clone()),
            );
            if let Err(e) = r {
                first_err.get_or_insert(format!("rank {rank} {mode:?}: {e}"));
            }
        }
        first_err.map_or(Ok(()), Err)
    });
    results.into_iter().collect::<R<Vec<()>>>().map(|_| ())
}

/// Typed refusals of `attach_decode_comm`: a group size other than
/// `decode_cp_ranks`, after graph state exists, on the CPU executor.
fn decode_comm_refusals() -> R {
    let comm = one_rank_comm()?;
    let mut c = dense();
    c.decode_cp_ranks = 2;
    let mut b = MhaBackend::new(c, Device::Cuda(gpu_ordinal())).or_fail("backend")?;
    match b.attach_decode_comm(comm.clone()) {
        Err(e) if e.to_string().contains("decode_cp_ranks") => {}
        other => return Err(format!("group of 1 for 2 ranks: {other:?}")),
    }
    let mut b = MhaBackend::new(dense(), Device::Cuda(gpu_ordinal())).or_fail("backend")?;
    b.init_cuda_graph_state(8, 8).or_fail("graph state")?;
    if b.attach_decode_comm(comm.clone()).is_ok() {
        return Err("attached after init_cuda_graph_state".into());
    }
    let mut cpu = MhaBackend::new(dense(), Device::Cpu).or_fail("cpu")?;
    if cpu.attach_decode_comm(comm).is_ok() {
        return Err("the CPU executor took a communicator".into());
    }
    Ok(())
}

/// Simulated decode context parallelism runs on the CUDA executor's own
/// memory; engine memory refuses it with a typed error naming the field.
fn decode_cp_engine_memory_is_refused() -> Result<(), String> {
    let mut c = dense();
    c.decode_cp_ranks = 2;
    let mut b = MhaBackend::new(c, Device::Cuda(gpu_ordinal())).or_fail("decode_cp_ranks 2")?;
    match b.reserve_engine_metadata(8, 8) {
        Err(e) if e.to_string().contains("decode_cp_ranks") => Ok(()),
        other => Err(format!(
            "expected the decode_cp_ranks refusal, got {other:?}"
        )),
    }
}

/// A mixed pass large enough that both kernels fill the GPU (3 prefill
/// chunks over prefixes, 48 decode rows over 40..1900 keys, caches filled by
/// a prefill pass first) gives bit-identical outputs and caches with its
/// context and decode launches on one stream, decode first and context first
/// (side stream); `set_mixed_overlap` returns the setting it replaces; with a
/// timer the concurrent pass records its wall span and a plausible
/// `concurrent_s`.
fn mixed_overlap_bit_exact(base: BackendConfig, gpu: &Arc<Gpu>) -> R {
    let mut config = base;
    config.context_len = 2048;
    config.max_requests = 64;
    config.num_pages = 3600;
    if config.num_swa_pages.is_some() {
        config.num_swa_pages = Some(3600);
    }
    let dev = Device::Cuda(gpu_ordinal());
    let mut w = World::new(&config, &[dev, dev, dev])?;
    let orders = [
        MixedOverlap::Off,
        MixedOverlap::DecodeFirst,
        MixedOverlap::ContextFirst,
    ];
    for (b, &o) in w.backends.iter_mut().zip(&orders) {
        b.set_mixed_overlap(o).or_fail("set overlap")?;
        if b.set_mixed_overlap(o).or_fail("set overlap")? != o {
            return Err(format!("set_mixed_overlap did not return {o:?}"));
        }
    }
    let mut rng = StdRng::seed_from_u64(77);
    // Prefill every request's prefix: 3 that extend, 48 that decode.
    let prefix: Vec<usize> = [300, 0, 900]
        .into_iter()
        .chain((0..48).map(|_| rng.gen_range(40..1900)))
        .collect();
    let rows: Vec<usize> = (0..prefix.len())
        .map(|_| w.new_request())
        .collect::<R<_>>()?;
    let with_prefix: Vec<(usize, usize)> = rows
        .iter()
        .copied()
        .zip(prefix.iter().copied())
        .filter(|&(_, p)| p > 0)
        .collect();
    let out = w.alloc(&with_prefix)?;
    let fill = ForwardBatch::extend(
        with_prefix.iter().map(|&(r, _)| r as i64).collect(),
        vec![0; with_prefix.len()],
        with_prefix.iter().map(|&(_, p)| p as i32).collect(),
        out,
        false,
    );
    let io = inputs(&mut rng, &config, fill.out_cache_loc.len());
    let mut first = None;
    for b in &mut w.backends {
        let o = run_eager(b, &fill, &io)?;
        if first.as_ref().is_some_and(|f| f != &o) {
            return Err("prefill outputs differ between launch orders".into());
        }
        first = Some(o);
    }
    // The mixed pass: 700 / 512 / 200 new tokens, then one token each.
    let ext: Vec<usize> = [700, 512, 200]
        .into_iter()
        .chain(std::iter::repeat_n(1, 48))
        .collect();
    let grow: Vec<(usize, usize)> = rows.iter().copied().zip(ext.iter().copied()).collect();
    let out = w.alloc(&grow)?;
    let batch = ForwardBatch::extend(
        rows.iter().map(|&r| r as i64).collect(),
        prefix.iter().map(|&p| p as i32).collect(),
        ext.iter().map(|&e| e as i32).collect(),
        out,
        true,
    );
    let io = inputs(&mut rng, &config, batch.out_cache_loc.len());
    let want = run_eager(&mut w.backends[0], &batch, &io)?;
    for (b, o) in w.backends.iter_mut().zip(orders).skip(1) {
        let timed = o == MixedOverlap::DecodeFirst;
        if timed {
            b.set_part_timer(Some(PartTimer::new(gpu)))
                .or_fail("timer")?;
        }
        let got = run_eager(b, &batch, &io)?;
        if got != want {
            return Err(format!("{o:?}: outputs differ from one stream"));
        }
        if timed {
            let t = b
                .set_part_timer(None)
                .or_fail("take back")?
                .ok_or("no timer")?
                .read()
                .or_fail("read")?;
            if !(t.context_s > 0.0 && t.decode_s > 0.0)
                || t.concurrent_s < 0.0
                || t.concurrent_s > t.context_s.min(t.decode_s)
            {
                return Err(format!("implausible concurrent part times {t:?}"));
            }
        }
    }
    same_caches(&w.backends[0], &w.backends[1], &config, false)?;
    same_caches(&w.backends[0], &w.backends[2], &config, false)?;
    // Back to one stream: returns the order it replaces.
    if w.backends[2]
        .set_mixed_overlap(MixedOverlap::Off)
        .or_fail("off")?
        != MixedOverlap::ContextFirst
    {
        return Err("set_mixed_overlap(Off) did not return ContextFirst".into());
    }
    Ok(())
}
