//! Backend decode step (issue 7, "Performance bars"): a 32-layer model of
//! 32 q heads / 8 KV heads / head_dim 128, bf16 model and bf16 KV, P 16, no
//! window, no sinks (attention only), every request holding L = 4096 cached
//! tokens plus the step's new one (`seq_lens = L + 1`), bs ∈ {1, 8, 64, 256}.
//!
//! One backend sized for the largest batch that fits in free device memory
//! (bs 256 needs ≈ 128.5 GiB of KV: `(256 · 257 + 1)` pages of 16 slots ×
//! 8 · 128 · 2 B × 2 (K, V) × 32 layers) serves every batch: request rows
//! 1..=bs, pages handed out one page per request per round (interleaved, as
//! in a running server). The K/V caches stay zero except the new token's
//! slot (attention speed does not depend on the values); q / k / v are
//! small random bf16 values uploaded once and passed as device tensors
//! (`TensorRef::Device`).
//!
//! Per batch size:
//! - **eager step µs (device)**: median over runs of the device time between
//!   two CUDA events around `init_forward_metadata` + 32 × `forward` (K/V
//!   write + attention), the stream filled first ([`fill_stream`], sized from
//!   the measured host time) so host launch gaps do not count.
//! - **eager host µs**: host wall time of those same calls (no
//!   synchronisation inside), median.
//! - **graph step µs (device)**: `replay_cuda_graph` run back to back behind a
//!   filled stream, [`per_launch_us`] (total event time / replays); includes
//!   the replay's input uploads and the fused metadata launch.
//! - **host µs per replay**: wall time of the `replay_cuda_graph` call alone
//!   ([`Instant`]), median over 100–200 calls; before each call the stream
//!   is synchronised and then filled for 500 µs, so the call is issued while
//!   the GPU is busy (as in serving) and an implicit host synchronisation
//!   inside the call would show as ≥ 500 µs.
//! - **kernel share %**: the K/V-write + attention device time of one step
//!   divided by the graph step's device time. The numerator is measured on
//!   the eager path with the same metadata: after `init_forward_metadata`,
//!   behind a filled stream, a CUDA-event pair around each layer's `forward`
//!   call, summed over the 32 layers (median over runs), minus 32 × the
//!   device time of the eager path's output allocation (`alloc_zeros` of
//!   `bs · Hq · D` bf16, which the graph does not do; timed back to back).
//!   Gaps between a layer's kernels count as kernel time; the metadata
//!   launch, input uploads and inter-layer gaps do not.
//! - **GB/s**: K/V bytes read per step, `bs · (L + 1) · 8 · 128 · 2 B · 2 ·
//!   32`, over the graph step's device time; **% of copy ceiling** against
//!   [`copy_ceiling_gbps`] (device-to-device copy, read + write bytes)
//!   measured in the same run.
//!
//! Criterion times the graph step (`iter_custom` + [`time_iters`], group
//! `backend_step`, ids `graph/bs{bs}`). At the end two markdown tables are
//! printed (the summary and per-batch details: replay host percentiles,
//! raw per-layer sums, the graph == eager output check, device errors).
//! Without a GPU the bench prints one line and exits 0; run without
//! `--bench` (a `cargo test` build) it measures nothing either.

use std::fmt::Display;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, BenchmarkId, Criterion};
use kernel_rt::cudarc::driver::sys::CUevent_flags;
use kernel_rt::cudarc::driver::{CudaEvent, CudaSlice};
use kernel_rt::timing::{copy_ceiling_gbps, fill_stream, median, per_launch_us, time_iters};
use kernel_rt::{gpu_status, Gpu, GpuStatus, KernelError};
use mha_backend::{
    BackendConfig, Device, ExecutorKind, ForwardBatch, GraphKind, LayerConfig, MhaBackend,
    TensorRef,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Attention layers.
const LAYERS: usize = 32;
/// `Hq`.
const HQ: usize = 32;
/// `Hkv`.
const HKV: usize = 8;
/// `D`.
const D: usize = 128;
/// `P`, tokens per page.
const P: usize = 16;
/// Cached tokens per request before the step (the step attends over `L + 1`).
const L: usize = 4096;
/// Batch sizes, ascending.
const BATCH: [usize; 4] = [1, 8, 64, 256];
/// Bytes of one bf16 element.
const BF16: usize = 2;
/// Eager steps before timing (also give the host-time estimate).
const EAGER_WARMUP: usize = 3;
/// Timed eager steps (step device + host time).
const EAGER_RUNS: usize = 15;
/// Timed eager steps with an event pair around every layer (kernel share).
const SHARE_RUNS: usize = 7;
/// Stream fill before each timed replay call, µs.
const REPLAY_FILL_US: f64 = 500.0;
/// Device memory kept free beyond the estimate (eager metadata and
/// outputs, allocator slack), bytes.
const MARGIN_BYTES: usize = 2 << 30;

type R<T = ()> = Result<T, String>;

/// Adds what was being done to an error.
trait Context<T> {
    fn ctx(self, what: &str) -> R<T>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> R<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Pages a request holds: `ceil((L + 1) / P)`.
fn pages_per_request() -> usize {
    (L + 1).div_ceil(P)
}

/// Device bytes the backend needs for `max_bs` requests (K/V caches, graph
/// static buffers, workspace) plus the bench's own inputs and a margin.
fn bytes_needed(max_bs: usize, workspace: usize) -> usize {
    let slots = (max_bs * pages_per_request() + 1) * P;
    let kv = slots * HKV * D * BF16 * 2 * LAYERS;
    let graph_io = max_bs * (2 * HQ * D + 2 * HKV * D) * BF16 * LAYERS;
    let inputs = max_bs * (HQ * D + 2 * HKV * D) * BF16;
    kv + graph_io + workspace + inputs + MARGIN_BYTES
}

/// K/V bytes the decode step reads: `bs · (L + 1) · Hkv · D · 2 B · 2 · layers`.
fn kv_bytes_read(bs: usize) -> f64 {
    (bs * (L + 1) * HKV * D * BF16 * 2 * LAYERS) as f64
}

fn config(max_bs: usize) -> BackendConfig {
    // context_len: just past L + 1, a whole number of pages.
    let context_len = (L + 1).div_ceil(P) * P;
    let mut c = BackendConfig::dense(
        LAYERS,
        LayerConfig::new(HQ, HKV, D),
        P,
        context_len,
        max_bs * pages_per_request(),
        max_bs,
    );
    c.max_graph_bs = max_bs;
    c
}

/// Device q / k / v of `max_bs` rows (random bf16 in [-0.5, 0.5)).
struct Inputs {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
}

impl Inputs {
    fn new(gpu: &Gpu, max_bs: usize) -> R<Self> {
        let mut rng = StdRng::seed_from_u64(0x6d68_615f_6b69_7421);
        let mut rand = |n: usize| -> Vec<u16> {
            (0..n)
                .map(|_| half::bf16::from_f32(rng.gen_range(-0.5f32..0.5)).to_bits())
                .collect()
        };
        let s = gpu.stream();
        Ok(Self {
            q: s.clone_htod(&rand(max_bs * HQ * D)).ctx("upload q")?,
            k: s.clone_htod(&rand(max_bs * HKV * D)).ctx("upload k")?,
            v: s.clone_htod(&rand(max_bs * HKV * D)).ctx("upload v")?,
        })
    }
}

/// One eager decode step: metadata, then every layer's K/V write + attention
/// (outputs dropped). `events`: `Some((events, gpu))` records an event
/// before and after each layer's `forward` (`2 · LAYERS` events).
fn eager_step(
    backend: &mut MhaBackend,
    batch: &ForwardBatch,
    io: &Inputs,
    bs: usize,
    events: Option<(&[CudaEvent], &Gpu)>,
) -> R {
    backend
        .init_forward_metadata(batch)
        .ctx("init_forward_metadata")?;
    let q = io.q.slice(0..bs * HQ * D);
    let k = io.k.slice(0..bs * HKV * D);
    let v = io.v.slice(0..bs * HKV * D);
    for layer in 0..LAYERS {
        if let Some((ev, gpu)) = events {
            ev[2 * layer].record(gpu.stream()).ctx("record event")?;
        }
        let out = backend
            .forward(
                layer,
                TensorRef::Device(&q),
                Some(TensorRef::Device(&k)),
                Some(TensorRef::Device(&v)),
                batch,
                true,
            )
            .map_err(|e| format!("forward(layer {layer}): {e}"))?;
        drop(out);
        if let Some((ev, gpu)) = events {
            ev[2 * layer + 1].record(gpu.stream()).ctx("record event")?;
        }
    }
    Ok(())
}

/// `replay_cuda_graph` for kernel-rt's timing helpers.
fn replay(backend: &mut MhaBackend, batch: &ForwardBatch) -> kernel_rt::Result<()> {
    backend
        .replay_cuda_graph(batch)
        .map(|_| ())
        .map_err(|e| KernelError::unsupported("replay_cuda_graph", e.to_string()))
}

fn new_events(gpu: &Gpu, n: usize) -> R<Vec<CudaEvent>> {
    (0..n)
        .map(|_| {
            gpu.context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .ctx("create CUDA event")
        })
        .collect()
}

/// µs between two recorded events (waits for both).
fn event_us(a: &CudaEvent, b: &CudaEvent) -> R<f64> {
    Ok(f64::from(a.elapsed_ms(b).ctx("event elapsed time")?) * 1e3)
}

/// Value at fraction `p` of a sorted sample.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The measurements of one batch size.
struct Row {
    bs: usize,
    eager_dev_us: f64,
    eager_host_us: f64,
    graph_dev_us: f64,
    graph_iters: u64,
    /// Sorted host µs per replay call.
    replay_host_us: Vec<f64>,
    /// Median over runs of Σ_layers event time around `forward`.
    layer_sum_us: f64,
    /// Device µs of one eager output allocation.
    out_alloc_us: f64,
    /// Timed eager runs whose host time exceeded the stream fill.
    fill_short: usize,
    same_output: bool,
    errors: mha_backend::DeviceErrorReport,
}

impl Row {
    fn share_pct(&self) -> f64 {
        100.0 * (self.layer_sum_us - LAYERS as f64 * self.out_alloc_us) / self.graph_dev_us
    }

    fn gbps(&self) -> f64 {
        kv_bytes_read(self.bs) / (self.graph_dev_us * 1e-6) / 1e9
    }
}

enum Outcome {
    Done(Box<Row>),
    Skipped(String),
    Failed(String),
}

/// Everything one batch size needs.
struct Case<'a> {
    gpu: &'a Arc<Gpu>,
    backend: &'a mut MhaBackend,
    io: &'a Inputs,
    batch: ForwardBatch,
    bs: usize,
}

impl Case<'_> {
    fn run(&mut self, group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) -> R<Row> {
        let (gpu, bs) = (self.gpu.clone(), self.bs);
        let sync = |what: &str| gpu.synchronize().ctx(what);

        // ---- eager: warm-up and host-time estimate
        let mut host_est = 0.0f64;
        for _ in 0..EAGER_WARMUP {
            sync("synchronize before eager warm-up")?;
            let t = Instant::now();
            eager_step(self.backend, &self.batch, self.io, bs, None).ctx("eager warm-up")?;
            host_est = host_est.max(t.elapsed().as_secs_f64() * 1e6);
        }
        sync("eager warm-up (a kernel failed)")?;
        let fill_us = 2.0 * host_est + 1000.0;

        // ---- eager: step device time (2 events) and host time
        let ev = new_events(&gpu, 2 * LAYERS)?;
        let (mut dev, mut host) = (Vec::new(), Vec::new());
        let mut fill_short = 0;
        for _ in 0..EAGER_RUNS {
            sync("synchronize before a timed eager step")?;
            fill_stream(&gpu, fill_us).ctx("fill stream")?;
            ev[0].record(gpu.stream()).ctx("record event")?;
            let t = Instant::now();
            eager_step(self.backend, &self.batch, self.io, bs, None).ctx("timed eager step")?;
            let h = t.elapsed().as_secs_f64() * 1e6;
            ev[1].record(gpu.stream()).ctx("record event")?;
            if h > fill_us.min(200_000.0) {
                fill_short += 1;
            }
            host.push(h);
            dev.push(event_us(&ev[0], &ev[1])?);
        }

        // ---- eager: per-layer K/V write + attention (kernel share numerator)
        let mut sums = Vec::new();
        for _ in 0..SHARE_RUNS {
            sync("synchronize before a per-layer eager step")?;
            fill_stream(&gpu, fill_us).ctx("fill stream")?;
            eager_step(self.backend, &self.batch, self.io, bs, Some((&ev, &gpu)))
                .ctx("per-layer eager step")?;
            let mut s = 0.0;
            for l in 0..LAYERS {
                s += event_us(&ev[2 * l], &ev[2 * l + 1])?;
            }
            sums.push(s);
        }
        // The eager forward allocates its output (alloc_zeros: a memset of
        // bs · Hq · D bf16) inside each layer's event pair; the graph does not.
        let out_elems = bs * HQ * D;
        let out_alloc_us = per_launch_us(&gpu, 200, || {
            let t = gpu.stream().alloc_zeros::<u16>(out_elems.max(1))?;
            drop(t);
            Ok(())
        })
        .ctx("time the eager output allocation")?;

        // ---- graph: capture, warm-up
        let key = self
            .backend
            .capture_cuda_graph(GraphKind::Decode, bs, bs)
            .ctx("capture_cuda_graph(Decode)")?;
        sync("synchronize after capture")?;
        for i in 0..3 {
            let used = self
                .backend
                .replay_cuda_graph(&self.batch)
                .ctx("replay_cuda_graph (warm-up)")?;
            if i == 0 && used != key {
                return Err(format!(
                    "replay used bucket {used:?}, expected the captured {key:?}"
                ));
            }
        }
        sync("graph warm-up (a kernel failed)")?;

        // ---- graph: step device time, replays back to back
        let eager_dev_us = median(&mut dev);
        let graph_iters = (300_000.0 / eager_dev_us.max(1.0)).clamp(10.0, 300.0) as u64;
        let graph_dev_us = {
            let (backend, batch) = (&mut *self.backend, &self.batch);
            per_launch_us(&gpu, graph_iters, || replay(backend, batch))
                .ctx("graph step device time")?
        };

        // ---- graph: host time of the replay call
        let calls = (3e6 / graph_dev_us.max(1.0)).clamp(100.0, 200.0) as usize;
        let mut replay_host_us = Vec::with_capacity(calls);
        for _ in 0..calls {
            sync("synchronize before a timed replay call")?;
            fill_stream(&gpu, REPLAY_FILL_US).ctx("fill stream")?;
            let t = Instant::now();
            let r = self.backend.replay_cuda_graph(&self.batch);
            let h = t.elapsed().as_secs_f64() * 1e6;
            r.ctx("replay_cuda_graph (host timing)")?;
            replay_host_us.push(h);
        }
        sync("host-timed replays (a kernel failed)")?;
        replay_host_us.sort_by(f64::total_cmp);

        // ---- criterion: the graph step
        {
            let (backend, batch, g) = (&mut *self.backend, &self.batch, &gpu);
            group.bench_function(BenchmarkId::new("graph", format!("bs{bs}")), |b| {
                b.iter_custom(|iters| {
                    time_iters(g, iters, || replay(backend, batch)).unwrap_or_else(|e| {
                        panic!("backend_step graph/bs{bs}: timing the replay failed: {e}")
                    })
                })
            });
        }

        // ---- check: graph output == eager output (layer 0, the bs rows)
        self.backend
            .init_forward_metadata(&self.batch)
            .ctx("init_forward_metadata (check)")?;
        let eager0 = {
            let q = self.io.q.slice(0..bs * HQ * D);
            let k = self.io.k.slice(0..bs * HKV * D);
            let v = self.io.v.slice(0..bs * HKV * D);
            self.backend
                .forward(
                    0,
                    TensorRef::Device(&q),
                    Some(TensorRef::Device(&k)),
                    Some(TensorRef::Device(&v)),
                    &self.batch,
                    true,
                )
                .ctx("forward (check)")?
                .to_host()
                .ctx("read the eager output")?
        };
        self.backend
            .replay_cuda_graph(&self.batch)
            .ctx("replay_cuda_graph (check)")?;
        let graph0 = self
            .backend
            .read_graph_output(0, bs)
            .ctx("read_graph_output")?;
        let errors = self.backend.device_errors();

        Ok(Row {
            bs,
            eager_dev_us,
            eager_host_us: median(&mut host),
            graph_dev_us,
            graph_iters,
            replay_host_us,
            layer_sum_us: median(&mut sums),
            out_alloc_us,
            fill_short,
            same_output: eager0 == graph0,
            errors,
        })
    }
}

/// Decode batch of the first `bs` requests: `seq_lens = L + 1`, the new
/// token's slot as `out_cache_loc`.
fn decode_batch(rows: &[usize], new_slots: &[i64], bs: usize) -> ForwardBatch {
    ForwardBatch::decode(
        rows[..bs].iter().map(|&r| r as i64).collect(),
        vec![(L + 1) as i64; bs],
        new_slots[..bs].to_vec(),
    )
}

/// Builds the backend, runs every batch size; returns the copy ceiling and
/// one outcome per batch size.
fn run(gpu: &Arc<Gpu>, c: &mut Criterion) -> R<(f64, Vec<Outcome>)> {
    let ceiling = copy_ceiling_gbps(gpu, 1 << 30, 20).ctx("copy ceiling")?;
    gpu.synchronize().ctx("synchronize")?;
    let (free, total) = gpu.context().mem_get_info().ctx("cuMemGetInfo")?;
    let workspace = config(1).resolved_workspace_bytes().ctx("workspace size")?;
    let max_bs = BATCH
        .iter()
        .copied()
        .filter(|&bs| bytes_needed(bs, workspace) <= free)
        .max()
        .ok_or_else(|| {
            format!(
                "not enough device memory even for bs {}: {:.1} GiB needed, {:.1} of {:.1} GiB free",
                BATCH[0],
                gib(bytes_needed(BATCH[0], workspace)),
                gib(free),
                gib(total)
            )
        })?;
    println!(
        "backend_step: sizing the backend for bs {max_bs}: ≈ {:.1} GiB needed, {:.1} of {:.1} GiB free",
        gib(bytes_needed(max_bs, workspace)),
        gib(free),
        gib(total)
    );
    let ordinal = gpu.context().ordinal();
    let mut backend = MhaBackend::new(config(max_bs), Device::Cuda(ordinal))
        .ctx("MhaBackend::new (32-layer 32/8/128 bf16 model)")?;
    if backend.executor_kind() != ExecutorKind::Cuda(ordinal) {
        return Err(format!(
            "the backend runs on {}, expected cuda:{ordinal}",
            backend.executor_kind()
        ));
    }
    // Request rows, then L tokens each, one page per request per round.
    let rows = (0..max_bs)
        .map(|_| backend.alloc_request())
        .collect::<Result<Vec<_>, _>>()
        .ctx("alloc_request")?;
    for round in 0..L.div_ceil(P) {
        let n = P.min(L - round * P);
        let grow: Vec<(usize, usize)> = rows.iter().map(|&r| (r, n)).collect();
        backend
            .alloc_tokens(&grow)
            .map_err(|e| format!("alloc_tokens (round {round}): {e}"))?;
    }
    let grow: Vec<(usize, usize)> = rows.iter().map(|&r| (r, 1)).collect();
    let new_slots = backend
        .alloc_tokens(&grow)
        .ctx("alloc_tokens (the new token)")?;
    if new_slots.len() != max_bs {
        return Err(format!(
            "alloc_tokens returned {} slots for {max_bs} requests",
            new_slots.len()
        ));
    }
    let io = Inputs::new(gpu, max_bs)?;
    backend
        .init_cuda_graph_state(max_bs, max_bs)
        .ctx("init_cuda_graph_state")?;
    for layer in 0..LAYERS {
        let q = io.q.slice(0..max_bs * HQ * D);
        let k = io.k.slice(0..max_bs * HKV * D);
        let v = io.v.slice(0..max_bs * HKV * D);
        backend
            .write_graph_inputs(
                layer,
                TensorRef::Device(&q),
                TensorRef::Device(&k),
                TensorRef::Device(&v),
            )
            .map_err(|e| format!("write_graph_inputs(layer {layer}): {e}"))?;
    }
    gpu.synchronize().ctx("setup (a copy failed)")?;

    let mut group = c.benchmark_group("backend_step");
    let mut out = Vec::new();
    let mut broken = false;
    for bs in BATCH {
        if bs > max_bs {
            out.push(Outcome::Skipped(format!(
                "skipped: needs ≈ {:.1} GiB, {:.1} GiB free",
                gib(bytes_needed(bs, workspace)),
                gib(free)
            )));
            continue;
        }
        if broken {
            out.push(Outcome::Skipped(
                "skipped: the device failed in an earlier case".into(),
            ));
            continue;
        }
        let mut case = Case {
            gpu,
            backend: &mut backend,
            io: &io,
            batch: decode_batch(&rows, &new_slots, bs),
            bs,
        };
        match case.run(&mut group) {
            Ok(row) => out.push(Outcome::Done(Box::new(row))),
            Err(e) => {
                eprintln!("backend_step bs {bs}: FAILED: {e}");
                // A failed kernel leaves the context unusable: stop here.
                broken = gpu.synchronize().is_err();
                out.push(Outcome::Failed(e));
            }
        }
    }
    group.finish();
    Ok((ceiling, out))
}

fn print_tables(gpu: &Gpu, ceiling: f64, out: &[Outcome]) {
    println!(
        "\n## backend_step on {}: decode step, {LAYERS} layers × {HQ}/{HKV}/{D} bf16 (bf16 KV), P {P}, L {L} (+1 new token), eager with device tensors; copy ceiling {ceiling:.0} GB/s (read + write)",
        gpu.describe()
    );
    println!(
        "## method: device µs = CUDA events behind a filled stream (graph: back-to-back replays / n); host µs = Instant around the calls, median; kernel share = (Σ_layers events around each eager forward − {LAYERS} × eager output alloc) / graph step; GB/s = bs·(L+1)·{HKV}·{D}·2 B·2·{LAYERS} / graph step"
    );
    println!("| bs | eager step µs (device) | eager host µs | graph step µs (device) | host µs per replay | kernel share % | GB/s | % of copy ceiling |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (bs, o) in BATCH.iter().zip(out) {
        match o {
            Outcome::Done(r) => println!(
                "| {bs} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.1}% |",
                r.eager_dev_us,
                r.eager_host_us,
                r.graph_dev_us,
                pct(&r.replay_host_us, 0.5),
                r.share_pct(),
                r.gbps(),
                100.0 * r.gbps() / ceiling
            ),
            Outcome::Skipped(why) | Outcome::Failed(why) => {
                println!(
                    "| {bs} | {} | | | | | | |",
                    why.replace('|', "/").replace('\n', " ")
                )
            }
        }
    }
    println!("\n## backend_step details");
    println!("| bs | replay host µs p10 / p50 / p90 / max (calls) | Σ layer events µs (raw) | eager output alloc µs / layer | graph replays timed | eager runs with host > fill | graph output == eager (layer 0) | device errors |");
    println!("|---:|---|---:|---:|---:|---:|---|---|");
    for o in out {
        if let Outcome::Done(r) = o {
            let h = &r.replay_host_us;
            println!(
                "| {} | {:.1} / {:.1} / {:.1} / {:.1} ({}) | {:.1} | {:.2} | {} | {} | {} | {} |",
                r.bs,
                pct(h, 0.1),
                pct(h, 0.5),
                pct(h, 0.9),
                pct(h, 1.0),
                h.len(),
                r.layer_sum_us,
                r.out_alloc_us,
                r.graph_iters,
                r.fill_short,
                if r.same_output {
                    "yes"
                } else {
                    "NO (mismatch)"
                },
                if r.errors.is_clean() {
                    "clean".to_string()
                } else {
                    r.errors.to_string()
                }
            );
        }
    }
}

fn main() {
    let gpu = match gpu_status() {
        GpuStatus::Available { .. } => Gpu::shared(),
        GpuStatus::Missing(why) => {
            println!("backend_step bench: no GPU ({why}); nothing measured");
            return;
        }
    };
    if !std::env::args().any(|a| a == "--bench") {
        println!("backend_step bench: not run with --bench (cargo test build); nothing measured");
        return;
    }
    let gpu = match gpu {
        Ok(g) => g,
        Err(e) => {
            eprintln!("backend_step bench: a GPU is present but cannot be opened: {e}");
            std::process::exit(1);
        }
    };
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
        .configure_from_args();
    match run(&gpu, &mut c) {
        Ok((ceiling, out)) => {
            print_tables(&gpu, ceiling, &out);
            c.final_summary();
            if out.iter().any(|o| matches!(o, Outcome::Failed(_))) {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("backend_step bench: FAILED: {e}");
            std::process::exit(1);
        }
    }
}
