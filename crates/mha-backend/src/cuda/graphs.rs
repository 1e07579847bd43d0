//! CUDA graphs of whole steps (SEMANTICS.md §backend.4–7): the graph state
//! and its static per-layer inputs / outputs, capture (`record_step`),
//! replay, and the graph parts of the [`crate::Executor`] impl.

use std::collections::HashMap;

use kernel_rt::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use kernel_rt::cudarc::driver::{CudaGraph, CudaSlice, CudaViewMut};
use kernel_rt::KernelError;

use crate::batch::{pad_for, ForwardBatch};
use crate::error::{BackendError, Result};
use crate::executor::{LayerPlan, TensorRef};
use crate::graph::{GraphKey, GraphKind};
use crate::pools::Pools;

use super::attention::{run_attention, AttnCx, KvSrc, PassShape, Rows, Tables, UnitOrder};
use super::metadata::{launch_metadata, MetaBufs, MetaInputs};
use super::mirrors::{read, upload, zeros};
use super::write::run_write;
use super::{kerr, CudaExecutor};

/// A captured graph. `CudaGraph` holds raw driver handles and is not
/// `Send`; the executor only touches it behind the backend's mutex.
pub(super) struct SendGraph(pub(super) CudaGraph);

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are
// serialised (CUDA driver docs, "Graph object thread safety"); the executor
// owns the graph exclusively and every access goes through `&mut self` /
// `&self` of the executor, which the backend only reaches under its mutex.
unsafe impl Send for SendGraph {}

impl std::fmt::Debug for SendGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CudaGraph")
    }
}

/// A layer's static graph inputs and output, `[max_num_tokens, ..]`.
#[derive(Debug)]
pub(super) struct LayerIo {
    pub(super) q: CudaSlice<u16>,
    pub(super) k: CudaSlice<u16>,
    pub(super) v: CudaSlice<u16>,
    pub(super) out: CudaSlice<u16>,
}

/// CUDA-graph state (SEMANTICS.md §backend.4.1): one set of metadata buffers shared
/// by every bucket and mode (each replay rewrites what its layers read,
/// stream-ordered), static per-layer inputs / outputs, the captured graphs.
#[derive(Debug)]
pub(super) struct GraphState {
    pub(super) bufs: MetaBufs,
    pub(super) io: Vec<LayerIo>,
    pub(super) graphs: HashMap<GraphKey, SendGraph>,
    pub(super) last: Option<GraphKey>,
    /// Rank buffers of decode context parallelism for every bucket (sized
    /// for `max_num_tokens` rows at creation, never reallocated).
    pub(super) cp: Option<super::cp::DecodeCp>,
    /// The step's length order (room for every bucket's requests): each
    /// captured step writes it at its first ordered decode launch.
    pub(super) order: UnitOrder,
}

fn no_graph_state() -> BackendError {
    BackendError::GraphUnsupported("no CUDA-graph state: call init_cuda_graph_state first".into())
}

/// The device inputs of a padded graph batch.
fn graph_inputs(padded: &ForwardBatch) -> MetaInputs<'_> {
    MetaInputs {
        req_pool_indices: &padded.req_pool_indices,
        seq_lens: &padded.seq_lens,
        out_cache_loc: &padded.out_cache_loc,
        qlens: padded.verify_lens(),
        cu_q: None,
    }
}

impl CudaExecutor {
    /// [`crate::Executor::init_graph_state`] on the device (the trait impl forwards here).
    pub(super) fn init_graph_state_impl(
        &mut self,
        max_bs: usize,
        max_num_tokens: usize,
    ) -> Result<()> {
        if max_bs == 0 || max_num_tokens == 0 {
            return Err(BackendError::GraphUnsupported(
                "init_cuda_graph_state needs max_bs ≥ 1 and max_num_tokens ≥ 1".into(),
            ));
        }
        let stream = self.gpu.stream().clone();
        stream.synchronize().map_err(kerr)?;
        // Drop the old graphs before their buffers.
        self.graph = None;
        let swa = self.eager.swa_pt.is_some();
        let bufs = MetaBufs::new(
            &stream,
            max_bs,
            max_num_tokens,
            self.max_num_pages.max(1),
            swa,
        )?;
        let mut io = Vec::with_capacity(self.plans.len());
        for p in &self.plans {
            io.push(LayerIo {
                q: zeros(&stream, max_num_tokens * p.q_row_elems())?,
                k: zeros(&stream, max_num_tokens * p.kv_row_elems())?,
                v: zeros(&stream, max_num_tokens * p.kv_row_elems())?,
                out: zeros(&stream, max_num_tokens * p.q_row_elems())?,
            });
        }
        let cp = match &self.decode_cp {
            Some(e) => {
                let hq = self.plans.iter().map(|p| p.num_q_heads).max().unwrap_or(1);
                let d = self.plans.iter().map(|p| p.head_dim).max().unwrap_or(1);
                Some(e.sibling(&stream, max_num_tokens, hq, d)?)
            }
            None => None,
        };
        let order = UnitOrder::new(&stream, bufs.cap_bs)?;
        self.graph = Some(GraphState {
            bufs,
            io,
            graphs: HashMap::new(),
            last: None,
            cp,
            order,
        });
        Ok(())
    }

    /// [`crate::Executor::capture_graph`] on the device (the trait impl forwards here).
    pub(super) fn capture_graph_impl(&mut self, key: GraphKey, pools: &Pools) -> Result<()> {
        let stream = self.gpu.stream().clone();
        let g = self.graph.as_mut().ok_or_else(no_graph_state)?;
        if key.bs > g.bufs.cap_bs || key.num_tokens > g.bufs.cap_tokens {
            return Err(BackendError::GraphUnsupported(format!(
                "bucket bs {} / {} tokens exceeds the graph state ({} / {})",
                key.bs, key.num_tokens, g.bufs.cap_bs, g.bufs.cap_tokens
            )));
        }
        g.graphs.remove(&key);
        // Valid inputs for the capture (their values are not recorded):
        // padding rows only (row 0, seq_len 1, slot 0).
        let empty = ForwardBatch {
            batch_size: 0,
            ..ForwardBatch::idle()
        };
        let padded = pad_for(&empty, key)?;
        self.maps.sync(&stream, pools)?;
        let g = self.graph.as_mut().ok_or_else(no_graph_state)?;
        graph_inputs(&padded).upload(&stream, &mut g.bufs)?;
        let mode = key.graph_mode();
        let ragged = key.kind == GraphKind::RaggedVerify;
        if ragged {
            // SEMANTICS.md §backend.5: written eagerly, outside the graph.
            launch_metadata(
                &self.meta_kernel,
                &self.maps,
                &mut g.bufs,
                mode,
                true,
                key.bs,
                key.num_tokens,
                self.page_size,
                &mut self.meta_errors,
            )?;
        }
        stream.synchronize().map_err(kerr)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(kerr)?;
        // Nothing runs during capture: the counters' state at replay start is
        // unknown to the recorded sequence, so its first split launch zeroes them.
        self.ws_zero = None;
        let recorded = self.record_step(key);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        self.ws_zero = None;
        recorded?;
        let graph = ended
            .map_err(kerr)?
            .ok_or_else(|| BackendError::GraphUnsupported("capture produced no graph".into()))?;
        graph.upload().map_err(kerr)?;
        let g = self.graph.as_mut().ok_or_else(no_graph_state)?;
        g.graphs.insert(key, SendGraph(graph));
        Ok(())
    }

    /// [`crate::Executor::graph_keys`] on the device (the trait impl forwards here).
    pub(super) fn graph_keys_impl(&self) -> Vec<GraphKey> {
        self.graph
            .as_ref()
            .map(|g| g.graphs.keys().copied().collect())
            .unwrap_or_default()
    }

    /// [`crate::Executor::replay_graph`] on the device (the trait impl forwards here).
    pub(super) fn replay_graph_impl(
        &mut self,
        key: GraphKey,
        padded: &ForwardBatch,
        pools: &Pools,
    ) -> Result<()> {
        if let Some(cp) = &self.decode_cp {
            cp.live()?;
        }
        let stream = self.gpu.stream().clone();
        if !self
            .graph
            .as_ref()
            .is_some_and(|g| g.graphs.contains_key(&key))
        {
            return Err(BackendError::GraphUnsupported(format!(
                "no graph captured for {key:?}"
            )));
        }
        if padded.batch_size != key.bs || padded.out_cache_loc.len() != key.num_tokens {
            return Err(BackendError::GraphUnsupported(format!(
                "batch of {} rows / {} tokens is not padded to {key:?}",
                padded.batch_size,
                padded.out_cache_loc.len()
            )));
        }
        self.maps.sync(&stream, pools)?;
        let Some(g) = self.graph.as_mut() else {
            return Err(no_graph_state());
        };
        graph_inputs(padded).upload(&stream, &mut g.bufs)?;
        if key.kind == GraphKind::RaggedVerify {
            launch_metadata(
                &self.meta_kernel,
                &self.maps,
                &mut g.bufs,
                key.graph_mode(),
                true,
                key.bs,
                key.num_tokens,
                self.page_size,
                &mut self.meta_errors,
            )?;
        }
        let graph = g.graphs.get(&key).ok_or_else(no_graph_state)?;
        graph.0.launch().map_err(kerr)?;
        g.last = Some(key);
        // The replay's split launches leave their own counter ranges zero,
        // not necessarily the one the eager path saw last.
        self.ws_zero = None;
        Ok(())
    }

    /// [`crate::Executor::write_graph_inputs`] on the device (the trait impl forwards here).
    pub(super) fn write_graph_inputs_impl(
        &mut self,
        plan: &LayerPlan,
        q: TensorRef<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<()> {
        let stream = self.gpu.stream().clone();
        let g = self.graph.as_mut().ok_or_else(no_graph_state)?;
        let io = g.io.get_mut(plan.layer).ok_or(BackendError::UnknownLayer {
            layer: plan.layer,
            num_layers: self.plans.len(),
        })?;
        for (t, dst) in [(q, &mut io.q), (k, &mut io.k), (v, &mut io.v)] {
            if t.len() > dst.len() {
                return Err(kerr(KernelError::Capacity {
                    arg: "graph input",
                    needed: t.len(),
                    available: dst.len(),
                }));
            }
            match t {
                TensorRef::Host(h) => upload(&stream, h, dst)?,
                TensorRef::Device(d) => {
                    if !d.is_empty() {
                        stream
                            .memcpy_dtod(d, &mut dst.slice_mut(0..d.len()))
                            .map_err(kerr)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// [`crate::Executor::read_graph_output`] on the device (the trait impl forwards here).
    pub(super) fn read_graph_output_impl(&self, plan: &LayerPlan, rows: usize) -> Result<Vec<u16>> {
        let g = self.graph.as_ref().ok_or_else(no_graph_state)?;
        let io = g.io.get(plan.layer).ok_or(BackendError::UnknownLayer {
            layer: plan.layer,
            num_layers: self.plans.len(),
        })?;
        let n = rows * plan.q_row_elems();
        if n > io.out.len() {
            return Err(kerr(KernelError::Capacity {
                arg: "rows",
                needed: n,
                available: io.out.len(),
            }));
        }
        read(self.gpu.stream(), &io.out, n)
    }

    /// [`crate::Executor::copy_graph_output`] on the device (the trait impl forwards here).
    pub(super) fn copy_graph_output_impl(
        &self,
        plan: &LayerPlan,
        row0: usize,
        rows: usize,
        dst: &mut CudaViewMut<'_, u16>,
    ) -> Result<()> {
        let g = self.graph.as_ref().ok_or_else(no_graph_state)?;
        let io = g.io.get(plan.layer).ok_or(BackendError::UnknownLayer {
            layer: plan.layer,
            num_layers: self.plans.len(),
        })?;
        let e = plan.q_row_elems();
        let (a, b) = (row0 * e, (row0 + rows) * e);
        if b > io.out.len() || b - a > dst.len() {
            return Err(kerr(KernelError::Capacity {
                arg: "rows",
                needed: b.max(b - a),
                available: io.out.len().min(dst.len()),
            }));
        }
        if a == b {
            return Ok(());
        }
        self.gpu
            .stream()
            .memcpy_dtod(&io.out.slice(a..b), &mut dst.slice_mut(0..b - a))
            .map_err(kerr)
    }

    /// Records one whole step of bucket `key` on the (capturing) stream:
    /// the fused metadata launch (not for ragged verify), then per layer the
    /// K/V write from the static inputs and attention into the static output.
    fn record_step(&mut self, key: GraphKey) -> Result<()> {
        let Self {
            gpu,
            plans,
            caches,
            sinks,
            kv_write,
            meta_kernel,
            decode,
            context,
            meta_errors,
            write_errors,
            attn_errors,
            workspace,
            ws_zero,
            maps,
            graph,
            model_dtype,
            page_size,
            context_len,
            decode_split,
            skip_softmax,
            ..
        } = self;
        let stream = gpu.stream();
        let g = graph.as_mut().ok_or_else(no_graph_state)?;
        // The capture records the order's write at the step's first
        // ordered decode launch: every replay rewrites it from its lengths.
        g.order.reset();
        if key.kind != GraphKind::RaggedVerify {
            launch_metadata(
                meta_kernel,
                maps,
                &mut g.bufs,
                key.graph_mode(),
                true,
                key.bs,
                key.num_tokens,
                *page_size,
                meta_errors,
            )?;
        }
        let shape = PassShape {
            mode: key.attn_mode(),
            bs: key.bs,
            rows: key.num_tokens,
            max_q: key.q_len,
            decode_tail: 0,
            max_kv: None,
        };
        let n = key.num_tokens;
        for (l, plan) in plans.iter().enumerate() {
            let io = &mut g.io[l];
            let loc = match (&g.bufs.swa_out, plan.is_swa) {
                (Some(s), true) => s.slice(0..n.max(1)),
                _ => g.bufs.out_loc.slice(0..n.max(1)),
            };
            run_write(
                kv_write,
                plan,
                &mut caches[l],
                *model_dtype,
                *page_size,
                loc,
                io.k.slice(0..io.k.len()),
                io.v.slice(0..io.v.len()),
                n,
                write_errors,
            )?;
            let mut cx = AttnCx {
                stream,
                decode,
                context,
                workspace: workspace.as_view_mut(),
                ws_zero,
                errors: attn_errors,
                model_dtype: *model_dtype,
                page_size: *page_size,
                max_seq_len: *context_len,
                decode_split: *decode_split,
                // Never inside a capture (see crate::part_timing).
                timer: None,
                q_scale: 1.0,
                foreign_workspace: false,
                // Graph buckets have no mixed passes (decode_tail 0).
                side: None,
                cp: g.cp.as_mut().map(super::cp::DecodeCp::cx),
                skip_softmax: *skip_softmax,
                unit_order: Some(&mut g.order),
            };
            let out_len = io.out.len();
            let (hq, d) = (plan.num_q_heads, plan.head_dim);
            run_attention(
                &mut cx,
                plan,
                KvSrc::Own(&caches[l]),
                sinks[l].as_ref(),
                &Tables::of(&g.bufs, None),
                shape,
                Rows::contiguous(io.q.slice(0..io.q.len()), hq, d),
                Rows::contiguous_mut(io.out.slice_mut(0..out_len), hq, d),
            )?;
        }
        Ok(())
    }
}
