//! The CUDA engine: passes through mha-backend's CUDA executor
//! (`Device::Cuda(n)`), Q/K/V generated on the device by
//! `mha_replay_gen_qkv` ([`crate::launch::GenKernel`], bit-identical to
//! [`crate::gen::Generator::element`]), device time from CUDA events, and
//! optional CUDA graphs.
//!
//! **Status:** verified on an H200 (`tests/gen_gpu.rs`, `tests/replay_gpu.rs`
//! pass; the whole conv trace replays with 0 mismatches), so `--device auto`
//! picks it when a GPU is present. Ragged-verify passes above
//! [`RAGGED_GRAPH_MAX_TOKENS`] run eagerly, for speed (see [`bucket_shape`]).
//!
//! Passes are pipelined: [`Engine::submit_pass`] launches pass `n` into one
//! of two slots (events, staging buffer, pinned host buffer) and only then
//! waits for pass `n − 1` and reads its sampled rows back, so the host's
//! work for a pass overlaps the device's work on the previous one.
//!
//! Per pass:
//! 1. the rows' `(request, position)` are uploaded once (two `u64` vectors);
//! 2. **eager** (extend / mixed / draft extend, and every pass with
//!    `--cuda-graphs off` or outside the graph buckets): the backend's
//!    metadata (host timer, unless the caller built it), then per layer the
//!    generator launch and [`MhaBackend::forward`] on device tensors, each
//!    bracketed by CUDA events; the sampled rows of the layer's output are
//!    copied device-to-device into a staging buffer, which comes back in
//!    one copy at the end of the pass;
//! 3. **graph** (decode, draft decode, uniform / ragged target verify,
//!    draft extend v2 with `--cuda-graphs on`): the bucket's graph is
//!    captured the first time it is needed ([`bucket`]: 1, 2, 4, 8, then
//!    multiples of 8 up to `max_graph_bs`; ragged verify keyed `bs =
//!    num_tokens`), every layer's Q/K/V generated and copied into the
//!    graph's static inputs, one replay (padding per D3); the sampled rows
//!    are copied out of the static outputs on the device
//!    ([`MhaBackend::copy_graph_output`]). The fused metadata
//!    launch is inside the graph, so such passes report `metadata_s = 0`
//!    and their attention time includes it; their generation time includes
//!    the copies into the static inputs.
//!
//! **Attention split** (`--split-timing on`, the default): before an eager
//! pass's layers the engine installs its slot's [`PartTimer`]
//! ([`MhaBackend::set_part_timer`]) and takes it back after them, so the
//! backend records CUDA events around each layer's K/V write, context
//! launch and decode launch (no synchronisation); [`Engine::flush`] /
//! the next submit read it behind the slot's read-back event, which the
//! engine waits for anyway. Per eager layer that is at most five event
//! records on top of the engine's two, all between launches already
//! issued; graph replays record none and their whole replay time is
//! reported as decode time ([`PassOutput::parts`]). `--split-timing off`
//! records none of them.
//!
//! The engine's [`Gpu`] must be the backend's: both take the process's
//! handle of their device ([`Gpu::shared_on`]), so they launch on one
//! stream (mha-backend does not expose its executor's stream). With
//! `--tp N --tp-gpus spread` each rank's engine and backends sit on their
//! own device.
//!
//! Submodule `buckets`: the graph bucket of a pass ([`bucket`], [`graph_kind`],
//! [`bucket_shape`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use kernel_rt::cudarc::driver::sys::CUevent_flags;
use kernel_rt::cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice};
use kernel_rt::{Gpu, KernelError, Strided, StridedMut};
use mha_backend::{GraphKey, HeadShard, MhaBackend, PartTimer, PartTimes, Tensor, TensorRef};

use crate::engine::{Engine, EngineInfo, PassOutput, SampledRows};
use crate::error::{flag_err, ReplayError, Result};
use crate::gen::ModelId;
use crate::launch::{GenArgs, GenKernel, GenKey};
use crate::pass::Pass;

mod buckets;

pub use buckets::{bucket, bucket_shape, graph_kind, RAGGED_GRAPH_MAX_TOKENS};

/// Bytes of the device copy that measures the copy ceiling (512 MiB).
pub const CEILING_BYTES: usize = 512 << 20;

fn kerr(e: impl Into<KernelError>) -> ReplayError {
    ReplayError::Backend(mha_backend::BackendError::Kernel(e.into()))
}
/// Per-model (target / draft backend) graph bookkeeping.
#[derive(Debug, Default)]
struct GraphBook {
    /// `init_cuda_graph_state` done: `(max_bs, n)`.
    state: Option<(usize, usize)>,
    /// Captured keys.
    captured: HashSet<GraphKey>,
}

/// The CUDA engine (see the module docs).
pub struct CudaEngine {
    gpu: Arc<Gpu>,
    ordinal: usize,
    kernel: GenKernel,
    seed: u64,
    graphs: bool,
    /// Attention split by part (`--split-timing`).
    split_timing: bool,
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    row_req: CudaSlice<u64>,
    row_pos: CudaSlice<u64>,
    /// Double-buffered per-pass resources: pass `n` uses slot `n % 2`, so
    /// it can run while the host reads the previous pass back.
    slots: [Slot; 2],
    next_slot: usize,
    in_flight: Option<InFlight>,
    books: [GraphBook; 2],
    /// Graphs captured so far (all models).
    pub captures: usize,
}

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine")
            .field("ordinal", &self.ordinal)
            .field("graphs", &self.graphs)
            .field("split_timing", &self.split_timing)
            .field("captures", &self.captures)
            .finish_non_exhaustive()
    }
}

fn grow<T: kernel_rt::cudarc::driver::DeviceRepr + kernel_rt::cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    buf: &mut CudaSlice<T>,
    n: usize,
) -> Result<()> {
    if buf.len() < n {
        // Round up so that slowly growing passes do not reallocate each time.
        let want = n.max(buf.len() * 3 / 2).max(1);
        *buf = gpu.stream().alloc_zeros::<T>(want).map_err(kerr)?;
    }
    Ok(())
}

impl CudaEngine {
    /// An engine on device `ordinal` generating from `seed`, with graphs
    /// for decode-like passes when `graphs` and the attention time split by
    /// part when `split_timing` (see the module docs).
    ///
    /// # Errors
    /// [`ReplayError::Flag`] (`--device`) without a GPU or without device
    /// `ordinal`; PTX load / allocation errors.
    pub fn new(ordinal: usize, seed: u64, graphs: bool, split_timing: bool) -> Result<Self> {
        let gpu = Gpu::shared_on(ordinal)
            .map_err(|e| flag_err("--device", format!("cuda:{ordinal}: {e}")))?;
        let kernel = GenKernel::new(&gpu).map_err(kerr)?;
        let s = gpu.stream();
        Ok(Self {
            kernel,
            seed,
            graphs,
            split_timing,
            q: s.alloc_zeros(1).map_err(kerr)?,
            k: s.alloc_zeros(1).map_err(kerr)?,
            v: s.alloc_zeros(1).map_err(kerr)?,
            row_req: s.alloc_zeros(1).map_err(kerr)?,
            row_pos: s.alloc_zeros(1).map_err(kerr)?,
            slots: [Slot::default(), Slot::default()],
            next_slot: 0,
            in_flight: None,
            books: [GraphBook::default(), GraphBook::default()],
            captures: 0,
            ordinal,
            gpu,
        })
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Generator launches so far.
    pub fn generator_launches(&self) -> u64 {
        self.kernel.launches()
    }

    fn ensure_events(&mut self, slot: usize, n: usize) -> Result<()> {
        while self.slots[slot].events.len() < n {
            let e = self
                .gpu
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(kerr)?;
            self.slots[slot].events.push(e);
        }
        Ok(())
    }

    fn record(&self, slot: usize, i: usize) -> Result<()> {
        self.slots[slot].events[i]
            .record(self.gpu.stream())
            .map_err(kerr)
    }

    fn elapsed_s(&self, slot: usize, a: usize, b: usize) -> Result<f64> {
        let e = &self.slots[slot].events;
        Ok(f64::from(e[a].elapsed_ms(&e[b]).map_err(kerr)?) * 1e-3)
    }

    /// Grows slot `slot`'s device staging buffer and its pinned host twin
    /// (same length: the read-back copies the whole buffer) to `n` elements.
    fn grow_stage(&mut self, slot: usize, n: usize) -> Result<()> {
        let st = &mut self.slots[slot];
        if st.stage.as_ref().is_some_and(|b| b.len() >= n) {
            return Ok(());
        }
        let want = n
            .max(st.stage.as_ref().map_or(0, |b| b.len() * 3 / 2))
            .max(1);
        st.stage = Some(self.gpu.stream().alloc_zeros::<u16>(want).map_err(kerr)?);
        // SAFETY: plain (not write-combined: the host reads it) page-locked
        // memory of `want` u16. kernel-rt turns cudarc's event tracking off,
        // so `as_slice` does NOT wait for pending copies: `complete` waits on
        // the slot's read-back event (recorded after the copy) first.
        st.host = Some(unsafe {
            self.gpu
                .context()
                .alloc_pinned_with_flags::<u16>(want, 0)
                .map_err(kerr)?
        });
        Ok(())
    }

    /// Where each `sample` pair's rows go in the staging buffer, in order,
    /// and the total elements.
    fn stage_layout(
        pass: &Pass,
        layers: &[HeadShard],
        sample: &[(usize, usize)],
    ) -> (Vec<Staged>, usize) {
        let mut staged = Vec::with_capacity(sample.len());
        let mut total = 0;
        for &(layer, part) in sample {
            let len = pass.parts[part].n * layers[layer].layer.q_row_elems();
            staged.push(Staged {
                layer,
                part,
                offset: total,
                len,
            });
            total += len;
        }
        (staged, total)
    }

    /// Enqueues the read-back of slot `slot`'s staged rows (async, into
    /// pinned memory), then records event `done` behind it: every copy of
    /// the pass (device staging copies and this one) is before `done`, and
    /// `complete` waits on `done` before it reads the pinned buffer.
    /// (cudarc's own per-buffer events are off: kernel-rt disables event
    /// tracking, so [`PinnedHostSlice::as_slice`] does not wait.)
    fn enqueue_readback(&mut self, slot: usize, total: usize, done: usize) -> Result<()> {
        if total > 0 {
            let st = &mut self.slots[slot];
            let (Some(stage), Some(host)) = (st.stage.as_ref(), st.host.as_mut()) else {
                return Err(ReplayError::Internal("staging buffer missing".into()));
            };
            self.gpu.stream().memcpy_dtoh(stage, host).map_err(kerr)?;
        }
        self.record(slot, done)
    }

    /// Waits for `f`'s pass and returns its output with the sampled rows.
    fn complete(&mut self, f: InFlight) -> Result<PassOutput> {
        let InFlight {
            slot,
            mut out,
            samples,
            mut host_rows,
            timing,
            split,
        } = f;
        // The read-back event follows the timing events and every copy.
        let done = match timing {
            Timing::Graph => 3,
            Timing::Eager { layers } => 2 * layers + 1,
        };
        self.slots[slot].events[done].synchronize().map_err(kerr)?;
        match timing {
            Timing::Graph => {
                out.generate_s = self.elapsed_s(slot, 0, 1)?;
                out.attention_s = self.elapsed_s(slot, 1, 2)?;
            }
            Timing::Eager { layers } => {
                for li in 0..layers {
                    out.generate_s += self.elapsed_s(slot, 2 * li, 2 * li + 1)?;
                    out.attention_s += self.elapsed_s(slot, 2 * li + 1, 2 * li + 2)?;
                }
            }
        }
        if split {
            out.parts = Some(match timing {
                // Nothing is timed inside a graph: the whole replay.
                Timing::Graph => PartTimes {
                    decode_s: out.attention_s,
                    ..PartTimes::default()
                },
                // The timer's events precede `done`, already waited for.
                Timing::Eager { .. } => self.slots[slot]
                    .timer
                    .as_ref()
                    .ok_or_else(|| ReplayError::Internal("part timer missing".into()))?
                    .read()?,
            });
        }
        let staged: &[u16] = match &self.slots[slot].host {
            Some(h) if !samples.is_empty() => h.as_slice().map_err(kerr)?,
            _ => &[],
        };
        for (i, s) in samples.iter().enumerate() {
            let rows = match host_rows[i].take() {
                Some(r) => r,
                None => staged
                    .get(s.offset..s.offset + s.len)
                    .ok_or_else(|| ReplayError::Internal("staged rows out of range".into()))?
                    .to_vec(),
            };
            out.sampled.push(SampledRows {
                layer: s.layer,
                part: s.part,
                rows,
            });
        }
        Ok(out)
    }

    /// Uploads the pass's `(request, position)` per row.
    fn upload_rows(&mut self, pass: &Pass) -> Result<usize> {
        let rows = pass.rows();
        let mut req = Vec::with_capacity(rows);
        let mut pos = Vec::with_capacity(rows);
        for p in &pass.parts {
            for j in 0..p.n {
                req.push(p.req as u64);
                pos.push((p.kv_len - p.n + j) as u64);
            }
        }
        grow(&self.gpu, &mut self.row_req, rows)?;
        grow(&self.gpu, &mut self.row_pos, rows)?;
        let s = self.gpu.stream();
        if rows > 0 {
            s.memcpy_htod(&req, &mut self.row_req.slice_mut(0..rows))
                .map_err(kerr)?;
            s.memcpy_htod(&pos, &mut self.row_pos.slice_mut(0..rows))
                .map_err(kerr)?;
        }
        Ok(rows)
    }

    /// Generates layer `li`'s Q/K/V of `rows` rows into the scratch buffers.
    fn generate(
        &mut self,
        model: ModelId,
        li: usize,
        shard: &HeadShard,
        rows: usize,
        salt: u64,
    ) -> Result<()> {
        let l = &shard.layer;
        let (qe, kve) = (l.q_row_elems(), l.kv_row_elems());
        grow(&self.gpu, &mut self.q, rows * qe)?;
        grow(&self.gpu, &mut self.k, rows * kve)?;
        grow(&self.gpu, &mut self.v, rows * kve)?;
        let (hq, hkv, d) = (l.num_q_heads, l.num_kv_heads, l.head_dim);
        let mut args = GenArgs {
            q: StridedMut::contiguous("q", self.q.slice_mut(0..rows * qe), [rows, hq, d])
                .map_err(kerr)?,
            k: StridedMut::contiguous("k", self.k.slice_mut(0..rows * kve), [rows, hkv, d])
                .map_err(kerr)?,
            v: StridedMut::contiguous("v", self.v.slice_mut(0..rows * kve), [rows, hkv, d])
                .map_err(kerr)?,
            row_req: Strided::contiguous("row_req", self.row_req.slice(0..rows), [rows])
                .map_err(kerr)?,
            row_pos: Strided::contiguous("row_pos", self.row_pos.slice(0..rows), [rows])
                .map_err(kerr)?,
            key: GenKey {
                seed: self.seed,
                model,
                layer: li,
                salt,
                q_head_offset: shard.q_head_offset,
                kv_head_offset: shard.kv_head_offset,
            },
        };
        self.kernel.launch(&mut args).map_err(kerr)
    }

    /// The graph key to replay `pass` with, capturing it if needed; `None`
    /// runs the pass eagerly.
    fn graph_for(&mut self, backend: &mut MhaBackend, pass: &Pass) -> Result<Option<GraphKey>> {
        if !self.graphs {
            return Ok(None);
        }
        let Some(kind) = graph_kind(pass.kind, backend.speculative_step_id()) else {
            return Ok(None);
        };
        let m = pass.model as usize;
        let (max_bs, n) = match self.books[m].state {
            Some(s) => s,
            None => {
                let c = backend.config();
                let n = c.spec.map_or(1, |s| s.num_draft_tokens).max(1);
                let max_bs = c.max_graph_bs.max(1);
                backend.init_cuda_graph_state(max_bs * n, max_bs * n)?;
                self.books[m].state = Some((max_bs, n));
                (max_bs, n)
            }
        };
        let Some((bs, tokens)) = bucket_shape(kind, pass.batch.batch_size, pass.rows(), max_bs, n)
        else {
            return Ok(None);
        };
        let key = GraphKey::new(kind, bs, tokens, Some(n))?;
        if !self.books[m].captured.contains(&key) {
            let got = backend.capture_cuda_graph(kind, bs, tokens)?;
            self.books[m].captured.insert(got);
            self.captures += 1;
        }
        Ok(Some(key))
    }

    fn launch_graph(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        sample: &[(usize, usize)],
        slot: usize,
    ) -> Result<InFlight> {
        let out = PassOutput {
            graph: true,
            ..PassOutput::default()
        };
        let rows = self.upload_rows(pass)?;
        self.ensure_events(slot, 4)?;
        self.record(slot, 0)?;
        for (li, l) in layers.iter().enumerate() {
            self.generate(pass.model, li, l, rows, pass.salt)?;
            let (qe, kve) = (l.layer.q_row_elems(), l.layer.kv_row_elems());
            let (q, k, v) = (
                self.q.slice(0..rows * qe),
                self.k.slice(0..rows * kve),
                self.v.slice(0..rows * kve),
            );
            backend.write_graph_inputs(
                li,
                TensorRef::Device(&q),
                TensorRef::Device(&k),
                TensorRef::Device(&v),
            )?;
        }
        self.record(slot, 1)?;
        backend.replay_cuda_graph(&pass.batch)?;
        self.record(slot, 2)?;
        // Sampled rows: device copies out of the static outputs (the next
        // replay overwrites them), read back after the pass.
        let (samples, total) = Self::stage_layout(pass, layers, sample);
        self.grow_stage(slot, total)?;
        for s in samples.iter().filter(|s| s.len > 0) {
            let p = &pass.parts[s.part];
            let stage = self.slots[slot]
                .stage
                .as_mut()
                .ok_or_else(|| ReplayError::Internal("staging buffer missing".into()))?;
            let mut dst = stage.slice_mut(s.offset..s.offset + s.len);
            backend.copy_graph_output(s.layer, p.row_start, p.n, &mut dst)?;
        }
        self.enqueue_readback(slot, total, 3)?;
        Ok(InFlight {
            slot,
            out,
            host_rows: vec![None; samples.len()],
            samples,
            timing: Timing::Graph,
            split: self.split_timing,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_eager(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
        slot: usize,
    ) -> Result<InFlight> {
        let mut out = PassOutput::default();
        if !metadata_ready {
            let t = Instant::now();
            backend.init_forward_metadata(&pass.batch)?;
            out.metadata_s = t.elapsed().as_secs_f64();
        }
        let rows = self.upload_rows(pass)?;
        let (samples, total) = Self::stage_layout(pass, layers, sample);
        self.grow_stage(slot, total)?;
        let mut host_rows: Vec<Option<Vec<u16>>> = vec![None; samples.len()];
        self.ensure_events(slot, 2 * layers.len() + 2)?;
        if self.split_timing {
            let mut t = match self.slots[slot].timer.take() {
                Some(t) => t,
                None => PartTimer::new(&self.gpu),
            };
            t.reset();
            backend.set_part_timer(Some(t))?;
        }
        let ran = self.eager_layers(backend, pass, layers, rows, &samples, &mut host_rows, slot);
        // The timer comes back even when a layer failed.
        let timer = if self.split_timing {
            backend.set_part_timer(None)
        } else {
            Ok(None)
        };
        ran?;
        self.slots[slot].timer = timer?;
        self.enqueue_readback(slot, total, 2 * layers.len() + 1)?;
        Ok(InFlight {
            slot,
            out,
            samples,
            host_rows,
            timing: Timing::Eager {
                layers: layers.len(),
            },
            split: self.split_timing,
        })
    }

    /// The layers of an eager pass: per layer the generator launch and
    /// [`MhaBackend::forward`], bracketed by slot `slot`'s events, and the
    /// sampled rows' copies into the staging buffer (device outputs) or
    /// `host_rows` (host outputs).
    #[allow(clippy::too_many_arguments)]
    fn eager_layers(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        rows: usize,
        samples: &[Staged],
        host_rows: &mut [Option<Vec<u16>>],
        slot: usize,
    ) -> Result<()> {
        self.record(slot, 0)?;
        for (li, l) in layers.iter().enumerate() {
            self.generate(pass.model, li, l, rows, pass.salt)?;
            self.record(slot, 2 * li + 1)?;
            let (qe, kve) = (l.layer.q_row_elems(), l.layer.kv_row_elems());
            let o = {
                let (q, k, v) = (
                    self.q.slice(0..rows * qe),
                    self.k.slice(0..rows * kve),
                    self.v.slice(0..rows * kve),
                );
                backend.forward(
                    li,
                    TensorRef::Device(&q),
                    Some(TensorRef::Device(&k)),
                    Some(TensorRef::Device(&v)),
                    &pass.batch,
                    true,
                )?
            };
            self.record(slot, 2 * li + 2)?;
            for (i, s) in samples.iter().enumerate().filter(|s| s.1.layer == li) {
                let p = &pass.parts[s.part];
                let (a, b) = (p.row_start * qe, (p.row_start + p.n) * qe);
                match &o {
                    Tensor::Device(d) => {
                        let off = s.offset;
                        let stage = self.slots[slot].stage.as_mut().ok_or_else(|| {
                            ReplayError::Internal("staging buffer missing".into())
                        })?;
                        self.gpu
                            .stream()
                            .memcpy_dtod(&d.slice(a..b), &mut stage.slice_mut(off..off + (b - a)))
                            .map_err(kerr)?;
                    }
                    Tensor::Host(h) => host_rows[i] = Some(h[a..b].to_vec()),
                }
            }
        }
        Ok(())
    }

    /// Launches `pass` into the next slot, then completes the pass before
    /// it (which ran while this one was being launched).
    fn submit(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> Result<Vec<PassOutput>> {
        let slot = self.next_slot;
        self.next_slot ^= 1;
        let f = match self.graph_for(backend, pass)? {
            Some(_) => self.launch_graph(backend, pass, layers, sample, slot)?,
            None => self.launch_eager(backend, pass, layers, metadata_ready, sample, slot)?,
        };
        let mut done = Vec::with_capacity(1);
        if let Some(prev) = self.in_flight.replace(f) {
            done.push(self.complete(prev)?);
        }
        Ok(done)
    }
}

/// Double-buffered per-pass resources (see [`CudaEngine`]).
#[derive(Default)]
struct Slot {
    events: Vec<CudaEvent>,
    stage: Option<CudaSlice<u16>>,
    host: Option<PinnedHostSlice<u16>>,
    /// The slot's part timer (`--split-timing on`), created on first use
    /// and reused; lent to the backend while an eager pass is launched.
    timer: Option<PartTimer>,
}

/// How a pass's events bracket its work.
#[derive(Debug, Clone, Copy)]
enum Timing {
    /// Events 0 → 1 generation + input copies, 1 → 2 replay; event 3
    /// after the sampled rows' copies and read-back.
    Graph,
    /// Per layer `l`: 2l → 2l+1 generation, 2l+1 → 2l+2 forward; event
    /// 2·layers + 1 after the last copies and the read-back.
    Eager { layers: usize },
}

/// A sampled `(layer, part)` pair's rows in a slot's staging buffer.
#[derive(Debug, Clone, Copy)]
struct Staged {
    layer: usize,
    part: usize,
    /// First element in the staging buffer.
    offset: usize,
    /// Elements (`rows · Hq·D`).
    len: usize,
}

/// A launched pass whose results have not been read back.
struct InFlight {
    slot: usize,
    out: PassOutput,
    /// The sampled pairs, in `sample` order, with their staging place.
    samples: Vec<Staged>,
    /// Rows that came back as host tensors (not staged).
    host_rows: Vec<Option<Vec<u16>>>,
    timing: Timing,
    /// Whether the pass's attention time is split by part.
    split: bool,
}

impl Engine for CudaEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            executor: format!("cuda:{}", self.ordinal),
            time_domain: "device time (CUDA events)",
            graphs_applicable: true,
            split_timing: Some(self.split_timing),
        }
    }

    fn copy_ceiling_gbps(&mut self) -> f64 {
        kernel_rt::timing::copy_ceiling_gbps(&self.gpu, CEILING_BYTES, 10).unwrap_or(f64::NAN)
    }

    fn run_pass(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> Result<PassOutput> {
        if self.in_flight.is_some() {
            return Err(ReplayError::Internal(
                "run_pass with a pass in flight: use submit_pass / flush".into(),
            ));
        }
        self.submit(backend, pass, layers, metadata_ready, sample)?;
        self.flush()?
            .pop()
            .ok_or_else(|| ReplayError::Internal("the pass did not come back".into()))
    }

    fn submit_pass(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> Result<Vec<PassOutput>> {
        self.submit(backend, pass, layers, metadata_ready, sample)
    }

    fn flush(&mut self) -> Result<Vec<PassOutput>> {
        match self.in_flight.take() {
            Some(f) => Ok(vec![self.complete(f)?]),
            None => Ok(Vec::new()),
        }
    }
}
