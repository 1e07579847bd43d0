//! The CUDA executor: device K/V caches, device `req_to_token` and SWA maps
//! (uploaded on change, one stream-ordered copy each), metadata built on
//! the device by the fused graph-metadata kernel (one launch per pass, every
//! mode; extend-like modes add one copy of `cu_seqlens_q`), K/V writes by
//! fp8-kv, attention by paged-attention's decode kernel (decode, verify,
//! draft extend) or context kernel (extend, mixed), and CUDA graphs of whole
//! steps (SEMANTICS.md §backend.4–7).
//!
//! Everything is stream-ordered on the [`Gpu`]'s stream. Calls return
//! without synchronising; device error events go to the executor's error
//! words ([`Executor::device_errors`] reads them, a synchronisation). With
//! a [`PartTimer`] installed, eager K/V writes and attention launches are
//! bracketed by its events (event records only; [`crate::part_timing`]);
//! graph capture never records them.
//!
//! Buffers a graph bakes in (caches, pool tables, workspace, graph state,
//! sinks) are allocated once and never reallocated while a graph exists.
//!
//! By job, one submodule each:
//! - `mirrors`: device copies of host state (K/V caches, pool tables) and upload helpers.
//! - `metadata`: the fused metadata build: its buffers, host inputs and launches.
//! - `write`: K/V writes into the executor's own caches.
//! - `attention`: attention launches (decode or context kernel per part of a pass).
//! - `graphs`: CUDA graphs of whole steps: graph state, capture, replay, static I/O.
//! - `engine`: passes over engine memory (metadata, layers, engine graphs).

mod attention;
mod cp;
mod engine;
mod graphs;
mod metadata;
mod mirrors;
mod write;

use std::collections::HashMap;
use std::sync::Arc;

use fp8_kv::{KvCacheDtype, KvWriteKernel};
use graph_metadata::GraphMetadataKernel;
use kernel_rt::cudarc::driver::{CudaSlice, CudaViewMut};
use kernel_rt::{DeviceErrors, ErrorReport, Gpu, KernelError};
use paged_attention::{ContextKernel, HalfDtype, PagedAttentionKernel, SplitMode};

use crate::batch::{AttnMode, ForwardBatch};
use crate::config::MixedOverlap;
use crate::engine::{EngineBatch, EngineLayer, EngineShape};
use crate::error::{BackendError, Result};
use crate::executor::{
    DeviceMetadata, Executor, ExecutorKind, GraphExecutor, KvLoc, KvSnapshot, LayerPlan, Tensor,
    TensorRef,
};
use crate::graph::GraphKey;
use crate::metadata::ForwardMetadata;
use crate::part_timing::{attention_flops, ragged_causal_pairs, AttnPart, PartTimer};
use crate::pools::Pools;

use attention::{
    one_token_tail, run_attention, AttnCx, KvSrc, PassShape, Rows, SideStream, Tables, UnitOrder,
};
use cp::DecodeCp;
use graphs::{GraphState, SendGraph};
use metadata::{launch_metadata, meta_mode, ragged_lens, MetaBufs, MetaInputs};
use mirrors::{ensure, stage, upload, zeros, DevCache, Maps};
use write::run_write;

fn kerr(e: impl Into<KernelError>) -> BackendError {
    BackendError::Kernel(e.into())
}

/// What the eager buffers hold.
#[derive(Debug, Clone, Copy)]
struct Prepared {
    id: u64,
    generation: u64,
    shape: PassShape,
}

/// Host staging buffers for host tensors (grown on demand; eager only).
#[derive(Debug)]
struct Scratch {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    loc: CudaSlice<i64>,
}

/// The CUDA executor (see the module docs).
#[derive(Debug)]
pub struct CudaExecutor {
    gpu: Arc<Gpu>,
    ordinal: usize,
    plans: Vec<LayerPlan>,
    model_dtype: HalfDtype,
    page_size: usize,
    max_num_pages: usize,
    context_len: usize,
    /// Split of decode launches that fill the GPU ([`crate::DECODE_SPLIT_ENV`]).
    decode_split: SplitMode,
    /// Second stream of eager mixed passes ([`crate::MIXED_OVERLAP_ENV`]).
    side: Option<SideStream>,
    /// `N` (spec.num_draft_tokens): the `max_q_len` of every ragged-verify
    /// launch, eager or graph, so both split the same way.
    ragged_max_q: usize,
    caches: Vec<DevCache>,
    sinks: Vec<Option<CudaSlice<f32>>>,
    kv_write: KvWriteKernel,
    meta_kernel: GraphMetadataKernel,
    decode: PagedAttentionKernel,
    context: ContextKernel,
    meta_errors: DeviceErrors,
    write_errors: DeviceErrors,
    attn_errors: DeviceErrors,
    workspace: CudaSlice<f32>,
    ws_zero: Option<(usize, usize)>,
    maps: Maps,
    eager: MetaBufs,
    /// The eager pass's length order ([`attention::UnitOrder`]; reset with
    /// every metadata upload).
    eager_order: UnitOrder,
    prepared: Option<Prepared>,
    scratch: Scratch,
    graph: Option<GraphState>,
    /// Timing by part of eager launches ([`crate::part_timing`]), when installed.
    part_timer: Option<PartTimer>,
    /// Metadata outputs of engine passes ([`Executor::reserve_engine`]).
    engine: Option<MetaBufs>,
    /// Graphs captured over engine memory.
    engine_graphs: HashMap<GraphKey, SendGraph>,
    /// Decode context parallelism (`decode_cp_ranks > 1`, simulated on
    /// this GPU, or a communicator attached): the merge launcher and the
    /// eager passes' rank buffers.
    decode_cp: Option<DecodeCp>,
    /// Skip-softmax factor of decode launches (resolved config).
    skip_softmax: Option<f32>,
}

impl CudaExecutor {
    /// Zeroed device caches for `plans`, the pool tables sized for `pools`,
    /// a zeroed workspace of `workspace_bytes`, every launcher loaded.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (PTX load, allocation).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Arc<Gpu>,
        model_dtype: HalfDtype,
        kv_dtype: KvCacheDtype,
        plans: &[LayerPlan],
        pools: &Pools,
        max_num_pages: usize,
        context_len: usize,
        ragged_max_q: Option<usize>,
        workspace_bytes: usize,
        decode_split: SplitMode,
        mixed_overlap: MixedOverlap,
        decode_cp_ranks: usize,
        skip_softmax: Option<f32>,
    ) -> Result<Self> {
        let stream = gpu.stream().clone();
        let mut caches = Vec::with_capacity(plans.len());
        let mut sinks = Vec::with_capacity(plans.len());
        for p in plans {
            let n = p.slots * p.num_kv_heads * p.head_dim;
            caches.push(match kv_dtype {
                KvCacheDtype::Fp8E4m3 => DevCache::Fp8(zeros(&stream, n)?, zeros(&stream, n)?),
                _ => DevCache::Half(zeros(&stream, n)?, zeros(&stream, n)?),
            });
            sinks.push(
                p.sinks
                    .as_ref()
                    .map(|s| stream.clone_htod(s).map_err(kerr))
                    .transpose()?,
            );
        }
        let swa = pools.swa_mapping().is_some();
        Ok(Self {
            ordinal: gpu.context().ordinal(),
            plans: plans.to_vec(),
            model_dtype,
            page_size: pools.page_size(),
            max_num_pages,
            context_len,
            decode_split,
            side: SideStream::new(&stream, mixed_overlap)?,
            ragged_max_q: ragged_max_q.unwrap_or(1),
            caches,
            sinks,
            kv_write: KvWriteKernel::new(gpu)?,
            meta_kernel: GraphMetadataKernel::new(gpu)?,
            decode: PagedAttentionKernel::new(gpu)?,
            context: ContextKernel::new(gpu)?,
            meta_errors: DeviceErrors::new(gpu)?,
            write_errors: DeviceErrors::new(gpu)?,
            attn_errors: DeviceErrors::new(gpu)?,
            workspace: zeros(&stream, workspace_bytes / 4)?,
            ws_zero: None,
            maps: Maps::new(gpu, &stream, pools)?,
            eager: MetaBufs::new(&stream, 1, 1, max_num_pages.max(1), swa)?,
            eager_order: UnitOrder::new(&stream, 1)?,
            prepared: None,
            scratch: Scratch {
                q: zeros(&stream, 1)?,
                k: zeros(&stream, 1)?,
                v: zeros(&stream, 1)?,
                loc: zeros(&stream, 1)?,
            },
            graph: None,
            part_timer: None,
            engine: None,
            engine_graphs: HashMap::new(),
            skip_softmax,
            decode_cp: if decode_cp_ranks > 1 {
                Some(DecodeCp::new(gpu, decode_cp_ranks, 1, 1, 1)?)
            } else {
                None
            },
            gpu: gpu.clone(),
        })
    }

    /// The GPU this executor runs on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Device error events of the metadata launches (graph-metadata flags;
    /// also [`crate::DeviceErrorReport::metadata`]). Synchronises.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (driver).
    pub fn metadata_device_errors(&self) -> Result<ErrorReport> {
        Ok(self.meta_errors.read()?)
    }
}

impl Executor for CudaExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Cuda(self.ordinal)
    }

    fn reserve_engine(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        self.reserve_engine_impl(max_bs, max_num_tokens)
    }

    fn engine_metadata(&mut self, batch: &EngineBatch<'_>, shape: &EngineShape) -> Result<()> {
        self.engine_metadata_impl(batch, shape)
    }

    fn graphs(&self) -> Option<&dyn GraphExecutor> {
        Some(self)
    }

    fn graphs_mut(&mut self) -> Option<&mut dyn GraphExecutor> {
        Some(self)
    }

    fn engine_forward(
        &mut self,
        plan: &LayerPlan,
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        io: &mut EngineLayer<'_>,
        save_kv: bool,
    ) -> Result<crate::DeviceErrorReport> {
        self.engine_forward_impl(plan, shape, batch, io, save_kv)
    }

    fn write_kv(
        &mut self,
        plan: &LayerPlan,
        loc: KvLoc<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<ErrorReport> {
        let n = loc.slots.len();
        if n == 0 {
            return Ok(ErrorReport::default());
        }
        let Self {
            gpu,
            scratch,
            kv_write,
            write_errors,
            caches,
            eager,
            prepared,
            model_dtype,
            page_size,
            part_timer,
            ..
        } = self;
        let stream = gpu.stream();
        let use_prepared = loc.prepared && prepared.is_some_and(|p| p.shape.rows == n);
        if !use_prepared {
            ensure(stream, &mut scratch.loc, n)?;
            upload(stream, loc.slots, &mut scratch.loc)?;
        }
        let Scratch {
            k: sk,
            v: sv,
            loc: sloc,
            ..
        } = scratch;
        let kview = stage(stream, k, sk)?;
        let vview = stage(stream, v, sv)?;
        let locview = if use_prepared {
            match (&eager.swa_out, plan.is_swa) {
                (Some(s), true) => s.slice(0..n),
                _ => eager.out_loc.slice(0..n),
            }
        } else {
            sloc.slice(0..n)
        };
        // Timed after the staging copies: the span is the write kernel.
        let start = part_timer.as_mut().map(|t| t.mark(stream)).transpose()?;
        run_write(
            kv_write,
            plan,
            &mut caches[plan.layer],
            *model_dtype,
            *page_size,
            locview,
            kview,
            vview,
            n,
            write_errors,
        )?;
        if let (Some(t), Some(a)) = (part_timer.as_mut(), start) {
            t.close(AttnPart::KvWrite, a, stream)?;
        }
        Ok(ErrorReport::default())
    }

    fn tables_on_device(&self) -> bool {
        true
    }

    fn prepare_metadata(&mut self, meta: &ForwardMetadata, pools: &Pools) -> Result<()> {
        if self
            .prepared
            .is_some_and(|p| p.id == meta.id.0 && p.generation == pools.generation())
        {
            return Ok(());
        }
        let stream = self.gpu.stream().clone();
        self.maps.sync(&stream, pools)?;
        let bs = meta.batch_size;
        let n = meta.num_tokens;
        if self.eager.cap_bs < bs || self.eager.cap_tokens < n {
            let swa = self.eager.swa_pt.is_some();
            self.eager = MetaBufs::new(
                &stream,
                bs.max(self.eager.cap_bs),
                n.max(self.eager.cap_tokens),
                self.eager.m,
                swa,
            )?;
        }
        if self.eager_order.capacity() < bs {
            self.eager_order = UnitOrder::new(&stream, bs.max(self.eager.cap_bs))?;
        }
        // New lengths: the next ordered decode launch writes the order again.
        self.eager_order.reset();
        let max_q = if meta.mode == AttnMode::RaggedVerify {
            meta.max_seq_len_q.max(self.ragged_max_q)
        } else {
            meta.max_seq_len_q
        };
        let (gmode, write_cu_q) = meta_mode(meta.mode, max_q)?;
        let qlens = (meta.mode == AttnMode::RaggedVerify).then(|| ragged_lens(&meta.cu_seqlens_q));
        MetaInputs {
            req_pool_indices: &meta.req_pool_indices,
            seq_lens: &meta.seq_lens,
            out_cache_loc: &meta.source_out_cache_loc,
            qlens: qlens.as_deref(),
            cu_q: (!write_cu_q).then_some(&meta.cu_seqlens_q[..]),
        }
        .upload(&stream, &mut self.eager)?;
        launch_metadata(
            &self.meta_kernel,
            &self.maps,
            &mut self.eager,
            gmode,
            write_cu_q,
            bs,
            n,
            self.page_size,
            &mut self.meta_errors,
        )?;
        self.prepared = Some(Prepared {
            id: meta.id.0,
            generation: pools.generation(),
            shape: PassShape {
                mode: meta.mode,
                bs,
                rows: n,
                max_q,
                decode_tail: one_token_tail(&meta.cu_seqlens_q),
                max_kv: meta.seq_lens.iter().max().map(|&l| l.max(0) as usize),
            },
        });
        Ok(())
    }

    fn attention(
        &mut self,
        plan: &LayerPlan,
        meta: &ForwardMetadata,
        page_size: usize,
        q: TensorRef<'_>,
    ) -> Result<(Tensor, ErrorReport)> {
        let _ = page_size;
        let rows = meta.num_tokens;
        let elems = rows * plan.num_q_heads * plan.head_dim;
        if rows == 0 || meta.batch_size == 0 {
            return Ok((Tensor::Host(vec![0; elems]), ErrorReport::default()));
        }
        let prepared = self
            .prepared
            .filter(|p| p.id == meta.id.0)
            .ok_or_else(|| BackendError::Metadata("metadata not prepared on the device".into()))?;
        let Self {
            gpu,
            scratch,
            decode,
            context,
            workspace,
            ws_zero,
            attn_errors,
            caches,
            sinks,
            eager,
            model_dtype,
            page_size,
            context_len,
            decode_split,
            part_timer,
            side,
            decode_cp,
            skip_softmax,
            eager_order,
            ..
        } = self;
        let stream = gpu.stream();
        if let Some(t) = part_timer.as_mut() {
            // The context kernel's causal FLOPs: the requests before the
            // one-token tail (which goes to the decode kernel).
            let shape = prepared.shape;
            if shape.mode == AttnMode::Extend {
                let head = shape.bs - shape.tail();
                let pairs = ragged_causal_pairs(
                    meta.cu_seqlens_q.get(..=head).unwrap_or(&[]),
                    meta.cache_seqlens.get(..head).unwrap_or(&[]),
                    plan.window_left,
                );
                t.add_context_flops(attention_flops(plan.num_q_heads, plan.head_dim, pairs));
            }
        }
        let qview = stage(stream, q, &mut scratch.q)?;
        let mut out = zeros::<u16>(stream, elems)?;
        if let Some(cp) = decode_cp.as_mut() {
            cp.reserve(stream, rows, plan.num_q_heads, plan.head_dim)?;
        }
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
            timer: part_timer.as_mut(),
            q_scale: 1.0,
            foreign_workspace: false,
            side: side.as_ref(),
            cp: decode_cp.as_mut().map(DecodeCp::cx),
            skip_softmax: *skip_softmax,
            unit_order: Some(eager_order),
        };
        let (hq, d) = (plan.num_q_heads, plan.head_dim);
        run_attention(
            &mut cx,
            plan,
            KvSrc::Own(&caches[plan.layer]),
            sinks[plan.layer].as_ref(),
            &Tables::of(eager, None),
            prepared.shape,
            Rows::contiguous(qview, hq, d),
            Rows::contiguous_mut(out.slice_mut(0..elems), hq, d),
        )?;
        Ok((Tensor::Device(out), ErrorReport::default()))
    }

    fn read_kv(&self, plan: &LayerPlan) -> Result<KvSnapshot> {
        let s = self.gpu.stream();
        Ok(match &self.caches[plan.layer] {
            DevCache::Half(k, v) => KvSnapshot::Half {
                k: s.clone_dtoh(k).map_err(kerr)?,
                v: s.clone_dtoh(v).map_err(kerr)?,
            },
            DevCache::Fp8(k, v) => KvSnapshot::Fp8 {
                k: s.clone_dtoh(k).map_err(kerr)?,
                v: s.clone_dtoh(v).map_err(kerr)?,
            },
        })
    }

    fn kv_bases(&self, plan: &LayerPlan) -> Result<(crate::KvLocation, u64, u64)> {
        use kernel_rt::cudarc::driver::DevicePtr;
        let s = self.gpu.stream();
        // Event tracking is off on mha-kit contexts, so the guards do nothing.
        let (k, v) = match &self.caches[plan.layer] {
            DevCache::Half(k, v) => (k.device_ptr(s).0, v.device_ptr(s).0),
            DevCache::Fp8(k, v) => (k.device_ptr(s).0, v.device_ptr(s).0),
        };
        Ok((
            crate::KvLocation::Device {
                ordinal: self.ordinal,
            },
            k,
            v,
        ))
    }

    fn read_kv_pages(
        &self,
        plan: &LayerPlan,
        page_elems: usize,
        pages: &[usize],
    ) -> Result<KvSnapshot> {
        fn out<T: kernel_rt::cudarc::driver::DeviceRepr + Default + Copy>(
            s: &Arc<kernel_rt::cudarc::driver::CudaStream>,
            src: &CudaSlice<T>,
            n: usize,
            pages: &[usize],
        ) -> Result<Vec<T>> {
            let mut host = vec![T::default(); pages.len() * n];
            for (i, &p) in pages.iter().enumerate() {
                s.memcpy_dtoh(
                    &src.slice(p * n..(p + 1) * n),
                    &mut host[i * n..(i + 1) * n],
                )
                .map_err(kerr)?;
            }
            // Copies still in flight: the caller synchronises once (the
            // heap buffer stays put when the Vec moves).
            Ok(host)
        }
        let s = self.gpu.stream();
        let snap = match &self.caches[plan.layer] {
            DevCache::Half(k, v) => KvSnapshot::Half {
                k: out(s, k, page_elems, pages)?,
                v: out(s, v, page_elems, pages)?,
            },
            DevCache::Fp8(k, v) => KvSnapshot::Fp8 {
                k: out(s, k, page_elems, pages)?,
                v: out(s, v, page_elems, pages)?,
            },
        };
        s.synchronize().map_err(kerr)?;
        Ok(snap)
    }

    fn write_kv_pages(
        &mut self,
        plan: &LayerPlan,
        page_elems: usize,
        pages: &[usize],
        data: &KvSnapshot,
    ) -> Result<()> {
        fn put<T: kernel_rt::cudarc::driver::DeviceRepr>(
            s: &Arc<kernel_rt::cudarc::driver::CudaStream>,
            dst: &mut CudaSlice<T>,
            src: &[T],
            n: usize,
            pages: &[usize],
        ) -> Result<()> {
            for (i, &p) in pages.iter().enumerate() {
                s.memcpy_htod(
                    &src[i * n..(i + 1) * n],
                    &mut dst.slice_mut(p * n..(p + 1) * n),
                )
                .map_err(kerr)?;
            }
            Ok(())
        }
        let s = self.gpu.stream().clone();
        match (&mut self.caches[plan.layer], data) {
            (DevCache::Half(k, v), KvSnapshot::Half { k: dk, v: dv }) => {
                put(&s, k, dk, page_elems, pages)?;
                put(&s, v, dv, page_elems, pages)?;
            }
            (DevCache::Fp8(k, v), KvSnapshot::Fp8 { k: dk, v: dv }) => {
                put(&s, k, dk, page_elems, pages)?;
                put(&s, v, dv, page_elems, pages)?;
            }
            _ => return Err(crate::executor::page_dtype_err()),
        }
        // The host slices are the caller's: finish before returning.
        s.synchronize().map_err(kerr)
    }

    fn read_metadata(&self, graph: bool) -> Result<Option<DeviceMetadata>> {
        let s = self.gpu.stream();
        if graph {
            match &self.graph {
                Some(GraphState {
                    bufs,
                    last: Some(k),
                    ..
                }) => Ok(Some(bufs.read(s, k.bs, k.num_tokens)?)),
                _ => Ok(None),
            }
        } else {
            match &self.prepared {
                Some(p) => Ok(Some(self.eager.read(s, p.shape.bs, p.shape.rows)?)),
                None => Ok(None),
            }
        }
    }

    fn device_errors(&self) -> Result<crate::DeviceErrorReport> {
        // K/V writes, attention, the req_to_token update (page-table's
        // BAD_ENTRY: a backend bug if ever counted) and the metadata
        // launches (the host builds no tables for this executor), each its
        // own family.
        Ok(crate::DeviceErrorReport {
            kv_write: self.write_errors.read()?,
            attention: self.attn_errors.read()?,
            page_table: self.maps.scatter_errors.read()?,
            swa_pool: ErrorReport::default(),
            metadata: self.meta_errors.read()?,
        })
    }

    fn set_part_timer(&mut self, timer: Option<PartTimer>) -> Result<Option<PartTimer>> {
        if timer
            .as_ref()
            .is_some_and(|t| !t.same_context(self.gpu.context()))
        {
            return Err(kerr(KernelError::unsupported(
                "part timer",
                format!(
                    "created for another device than this executor's cuda:{}",
                    self.ordinal
                ),
            )));
        }
        Ok(std::mem::replace(&mut self.part_timer, timer))
    }

    fn attach_decode_comm(&mut self, comm: Arc<paged_attention::nccl::DcpComm>) -> Result<()> {
        // A captured graph or an engine pass keeps the buffers it was made
        // with: the communicator must come before either.
        if self.graph.is_some() || self.engine.is_some() {
            return Err(kerr(KernelError::unsupported(
                "decode communicator",
                "attach it before init_cuda_graph_state and engine memory",
            )));
        }
        if !Arc::ptr_eq(comm.gpu().stream(), self.gpu.stream()) {
            return Err(kerr(KernelError::unsupported(
                "decode communicator",
                format!(
                    "joined on cuda:{} with another stream than this executor's cuda:{} \
                     (join it on the executor's Gpu::shared_on handle)",
                    comm.gpu().context().ordinal(),
                    self.ordinal
                ),
            )));
        }
        self.decode_cp = Some(DecodeCp::with_comm(&self.gpu, comm, 1, 1, 1)?);
        Ok(())
    }

    fn set_mixed_overlap(&mut self, order: MixedOverlap) -> Result<MixedOverlap> {
        let before = self
            .side
            .as_ref()
            .map_or(MixedOverlap::Off, SideStream::order);
        match (&mut self.side, order) {
            (_, MixedOverlap::Off) => self.side = None,
            (Some(s), o) => s.set_order(o),
            (None, o) => self.side = SideStream::new(self.gpu.stream(), o)?,
        }
        Ok(before)
    }
}

impl GraphExecutor for CudaExecutor {
    fn init_graph_state(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        self.init_graph_state_impl(max_bs, max_num_tokens)
    }

    fn capture_graph(&mut self, key: GraphKey, pools: &Pools) -> Result<()> {
        self.capture_graph_impl(key, pools)
    }

    fn graph_keys(&self) -> Vec<GraphKey> {
        self.graph_keys_impl()
    }

    fn replay_graph(&mut self, key: GraphKey, padded: &ForwardBatch, pools: &Pools) -> Result<()> {
        self.replay_graph_impl(key, padded, pools)
    }

    fn write_graph_inputs(
        &mut self,
        plan: &LayerPlan,
        q: TensorRef<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<()> {
        self.write_graph_inputs_impl(plan, q, k, v)
    }

    fn read_graph_output(&self, plan: &LayerPlan, rows: usize) -> Result<Vec<u16>> {
        self.read_graph_output_impl(plan, rows)
    }

    fn copy_graph_output(
        &self,
        plan: &LayerPlan,
        row0: usize,
        rows: usize,
        dst: &mut CudaViewMut<'_, u16>,
    ) -> Result<()> {
        self.copy_graph_output_impl(plan, row0, rows, dst)
    }

    fn capture_engine_graph(
        &mut self,
        key: GraphKey,
        plans: &[LayerPlan],
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        layers: &mut [EngineLayer<'_>],
        save_kv: bool,
    ) -> Result<()> {
        self.capture_engine_graph_impl(key, plans, shape, batch, layers, save_kv)
    }

    fn replay_engine_graph(&mut self, key: GraphKey) -> Result<()> {
        self.replay_engine_graph_impl(key)
    }
}
