//! Engines: what runs a pass's layers on an executor. The scheduler, the
//! checker and the report are executor-independent; an engine owns what is
//! not — where Q/K/V are generated, how time is measured, CUDA graphs.
//!
//! - [`CpuEngine`] (today): Q/K/V generated on the host ([`Generator`]),
//!   host tensors into [`MhaBackend::forward`], host wall time.
//! - [`crate::cuda_engine::CudaEngine`] (mha-backend's CUDA executor)
//!   implements the same trait: Q/K/V from a device
//!   hash kernel bit-identical to
//!   [`Generator::element`] (so the host checker can regenerate them),
//!   CUDA-event device time, graph capture/replay per bucket when
//!   `--cuda-graphs on`, and only the sampled rows copied back.

use std::time::Instant;

use mha_backend::{HeadShard, MhaBackend, PartTimes, TensorRef};

use crate::error::{ReplayError, Result};
use crate::gen::{Act, Generator};
use crate::pass::Pass;

/// Static facts about an engine, for the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EngineInfo {
    /// Executor actually used (`cpu`, `cuda:0`).
    pub executor: String,
    /// What the timings measure: `host wall time` or `device time (CUDA events)`.
    pub time_domain: &'static str,
    /// Whether `--cuda-graphs` applies (false on the CPU executor).
    pub graphs_applicable: bool,
    /// Attention time split by part (`--split-timing`): `None` when the
    /// executor cannot measure it (the CPU executor has no CUDA events and
    /// runs one reference call per layer for every row), else whether it is on.
    pub split_timing: Option<bool>,
}

/// The rows of one sampled (layer, request) pair, model dtype bits
/// `[n, Hq·D]`, copied to the host.
#[derive(Debug, Clone)]
pub struct SampledRows {
    /// Layer id.
    pub layer: usize,
    /// Index into [`Pass::parts`].
    pub part: usize,
    /// The request's output rows.
    pub rows: Vec<u16>,
}

/// What an engine measured and returns for one pass.
#[derive(Debug, Clone, Default)]
pub struct PassOutput {
    /// Seconds in `init_forward_metadata` (0 when the caller built it).
    pub metadata_s: f64,
    /// Seconds in the layers' KV write + attention (`forward`), summed.
    pub attention_s: f64,
    /// Seconds generating Q/K/V (not part of the step time).
    pub generate_s: f64,
    /// Whether the pass ran from a CUDA graph.
    pub graph: bool,
    /// `attention_s` split by part (device seconds, all layers) and the
    /// context kernel's causal FLOPs; `None` when not measured. Eager
    /// passes: CUDA events around the K/V-write, context and decode
    /// launches inside `attention_s` (the rest of `attention_s` is other
    /// work: staging copies, metadata uploads, launch gaps). Graph
    /// replays: the whole replay (metadata launch and K/V writes included)
    /// as `decode_s`, since nothing can be timed inside a graph.
    pub parts: Option<PartTimes>,
    /// Sampled rows for the checker.
    pub sampled: Vec<SampledRows>,
}

/// Runs passes on one executor.
pub trait Engine {
    /// Facts for the report.
    fn info(&self) -> EngineInfo;

    /// The memory-copy ceiling in GB/s (bytes read + written per second)
    /// of the memory the KV cache lives in, measured once at start.
    fn copy_ceiling_gbps(&mut self) -> f64;

    /// Runs every layer of `pass` on `backend`: builds the metadata (unless
    /// `metadata_ready`), generates Q/K/V, writes K/V and runs attention;
    /// returns the rows of the `sample` pairs `(layer, part index)`.
    /// `layers` are the backend's layers as heads of the whole model: the
    /// whole layer ([`HeadShard::whole`]) or a tensor-parallel rank's share,
    /// whose Q/K/V are the generator's values of the rank's global heads.
    ///
    /// # Errors
    /// Backend errors.
    fn run_pass(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> Result<PassOutput>;

    /// [`Engine::run_pass`] that may leave the pass in flight: it returns
    /// the outputs of the passes that completed by now, oldest first (every
    /// submitted pass comes back exactly once, in order, from this or
    /// [`Engine::flush`]). Host work for the next pass then overlaps the
    /// device's work on this one. Default: synchronous.
    ///
    /// # Errors
    /// As [`Engine::run_pass`].
    fn submit_pass(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> Result<Vec<PassOutput>> {
        Ok(vec![self.run_pass(
            backend,
            pass,
            layers,
            metadata_ready,
            sample,
        )?])
    }

    /// The outputs of every pass still in flight, oldest first.
    ///
    /// # Errors
    /// Driver errors.
    fn flush(&mut self) -> Result<Vec<PassOutput>> {
        Ok(Vec::new())
    }
}

/// The CPU engine over mha-backend's CPU executor.
#[derive(Debug, Clone)]
pub struct CpuEngine {
    gen: Generator,
    q: Vec<u16>,
    k: Vec<u16>,
    v: Vec<u16>,
}

impl CpuEngine {
    /// An engine generating from `gen`.
    pub fn new(gen: Generator) -> Self {
        Self {
            gen,
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
        }
    }
}

impl Engine for CpuEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            executor: "cpu".into(),
            time_domain: "host wall time",
            graphs_applicable: false,
            split_timing: None,
        }
    }

    fn copy_ceiling_gbps(&mut self) -> f64 {
        host_copy_gbps(64 << 20, 5)
    }

    fn run_pass(
        &mut self,
        backend: &mut MhaBackend,
        pass: &Pass,
        layers: &[HeadShard],
        metadata_ready: bool,
        sample: &[(usize, usize)],
    ) -> Result<PassOutput> {
        let mut out = PassOutput::default();
        if !metadata_ready {
            let t = Instant::now();
            backend.init_forward_metadata(&pass.batch)?;
            out.metadata_s = t.elapsed().as_secs_f64();
        }
        let rows = pass.rows();
        for (li, shard) in layers.iter().enumerate() {
            let t = Instant::now();
            let l = &shard.layer;
            let (qe, kve) = (l.q_row_elems(), l.kv_row_elems());
            let (q0, kv0) = (shard.q_head_offset, shard.kv_head_offset);
            self.q.resize(rows * qe, 0);
            self.k.resize(rows * kve, 0);
            self.v.resize(rows * kve, 0);
            for p in &pass.parts {
                for j in 0..p.n {
                    let pos = p.kv_len - p.n + j;
                    let r = p.row_start + j;
                    let g = &self.gen;
                    let d = l.head_dim;
                    g.fill_row(
                        Act::Q,
                        pass.model,
                        li,
                        p.req,
                        pos,
                        pass.salt,
                        d,
                        q0,
                        &mut self.q[r * qe..][..qe],
                    );
                    g.fill_row(
                        Act::K,
                        pass.model,
                        li,
                        p.req,
                        pos,
                        0,
                        d,
                        kv0,
                        &mut self.k[r * kve..][..kve],
                    );
                    g.fill_row(
                        Act::V,
                        pass.model,
                        li,
                        p.req,
                        pos,
                        0,
                        d,
                        kv0,
                        &mut self.v[r * kve..][..kve],
                    );
                }
            }
            out.generate_s += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let o = backend.forward(
                li,
                TensorRef::Host(&self.q),
                Some(TensorRef::Host(&self.k)),
                Some(TensorRef::Host(&self.v)),
                &pass.batch,
                true,
            )?;
            out.attention_s += t.elapsed().as_secs_f64();
            let host = o.into_host().ok_or_else(|| {
                ReplayError::Internal("the CPU executor returned a device tensor".into())
            })?;
            for &(sl, sp) in sample.iter().filter(|s| s.0 == li) {
                let p = &pass.parts[sp];
                out.sampled.push(SampledRows {
                    layer: sl,
                    part: sp,
                    rows: host[p.row_start * qe..(p.row_start + p.n) * qe].to_vec(),
                });
            }
        }
        Ok(out)
    }
}

/// Host memory-copy bandwidth: best of `runs` copies of `bytes`, counted
/// as read + written bytes per second, GB/s.
pub fn host_copy_gbps(bytes: usize, runs: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut best = f64::INFINITY;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * bytes as f64 / best.max(1e-9) / 1e9
}
