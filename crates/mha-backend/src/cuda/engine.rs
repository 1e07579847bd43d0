//! Passes over engine memory: the reserved metadata buffers, the fused
//! metadata launch from the engine's views, one engine layer (K/V write and
//! attention), engine graphs, and the engine parts of the [`Executor`] impl.

use std::sync::Arc;

use fp8_kv::KvWriteKernel;
use graph_metadata::GraphMetadataKernel;
use kernel_rt::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use kernel_rt::cudarc::driver::{CudaSlice, CudaStream};
use kernel_rt::{DeviceErrors, KernelError, Strided};
use paged_attention::{ContextKernel, HalfDtype, PagedAttentionKernel, SplitMode};

use crate::batch::AttnMode;
use crate::engine::{EngineBatch, EngineLayer, EngineShape};
use crate::error::{BackendError, Result};
use crate::executor::{Executor, LayerPlan};
use crate::graph::GraphKey;

use super::attention::{run_attention, AttnCx, KvSrc, PassShape, Rows, Tables};
use super::graphs::SendGraph;
use super::metadata::{launch_metadata_on, meta_mode, MetaBufs, MetaIn, MetaOut};
use super::{kerr, CudaExecutor};

impl CudaExecutor {
    /// [`Executor::reserve_engine`] on the device (the trait impl forwards here).
    pub(super) fn reserve_engine_impl(
        &mut self,
        max_bs: usize,
        max_num_tokens: usize,
    ) -> Result<()> {
        if let Some(cp) = &self.decode_cp {
            return Err(KernelError::unsupported(
                "decode_cp_ranks",
                format!(
                    "decode context parallelism ({} {} ranks) runs on the owning path \
                     only; engine memory takes decode_cp_ranks = 1",
                    cp.ranks(),
                    if cp.multi_gpu() { "NCCL" } else { "simulated" }
                ),
            )
            .into());
        }
        let fits = self
            .engine
            .as_ref()
            .is_some_and(|b| b.cap_bs >= max_bs && b.cap_tokens >= max_num_tokens);
        if fits {
            return Ok(());
        }
        let stream = self.gpu.stream().clone();
        // Engine graphs bake the old buffers' addresses in.
        stream.synchronize().map_err(kerr)?;
        self.engine_graphs.clear();
        let swa = self.eager.swa_pt.is_some();
        self.engine = Some(MetaBufs::new(
            &stream,
            max_bs.max(1),
            max_num_tokens.max(1),
            self.max_num_pages.max(1),
            swa,
        )?);
        Ok(())
    }

    /// [`Executor::engine_metadata`] on the device (the trait impl forwards here).
    pub(super) fn engine_metadata_impl(
        &mut self,
        batch: &EngineBatch<'_>,
        shape: &EngineShape,
    ) -> Result<()> {
        if shape.bs == 0 {
            return Ok(());
        }
        let bufs = engine_bufs(&mut self.engine, shape)?;
        launch_engine_metadata(
            &self.meta_kernel,
            batch,
            bufs,
            shape,
            self.page_size,
            &mut self.meta_errors,
        )
    }

    /// [`Executor::capture_engine_graph`] on the device (the trait impl forwards here).
    pub(super) fn capture_engine_graph_impl(
        &mut self,
        key: GraphKey,
        plans: &[LayerPlan],
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        layers: &mut [EngineLayer<'_>],
        save_kv: bool,
    ) -> Result<()> {
        engine_bufs(&mut self.engine, shape)?;
        let stream = self.gpu.stream().clone();
        self.engine_graphs.remove(&key);
        stream.synchronize().map_err(kerr)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(kerr)?;
        // Nothing runs during capture: the first split launch of the
        // recorded sequence zeroes its counters.
        self.ws_zero = None;
        let recorded = (|| -> Result<()> {
            self.engine_metadata(batch, shape)?;
            for (plan, io) in plans.iter().zip(layers.iter_mut()) {
                self.engine_forward(plan, shape, batch, io, save_kv)?;
            }
            Ok(())
        })();
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        self.ws_zero = None;
        recorded?;
        let graph = ended
            .map_err(kerr)?
            .ok_or_else(|| BackendError::GraphUnsupported("capture produced no graph".into()))?;
        graph.upload().map_err(kerr)?;
        self.engine_graphs.insert(key, SendGraph(graph));
        Ok(())
    }

    /// [`Executor::replay_engine_graph`] on the device (the trait impl forwards here).
    pub(super) fn replay_engine_graph_impl(&mut self, key: GraphKey) -> Result<()> {
        if let Some(cp) = &self.decode_cp {
            cp.live()?;
        }
        let g = self.engine_graphs.get(&key).ok_or_else(|| {
            BackendError::GraphUnsupported(format!("no engine graph captured for {key:?}"))
        })?;
        g.0.launch().map_err(kerr)?;
        // The replay's split launches leave their own counter ranges zero.
        self.ws_zero = None;
        Ok(())
    }

    /// [`Executor::engine_forward`] on the device (the trait impl forwards here).
    pub(super) fn engine_forward_impl(
        &mut self,
        plan: &LayerPlan,
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        io: &mut EngineLayer<'_>,
        save_kv: bool,
    ) -> Result<crate::DeviceErrorReport> {
        if shape.bs == 0 && shape.num_tokens == 0 {
            return Ok(crate::DeviceErrorReport::default());
        }
        let Self {
            gpu,
            kv_write,
            write_errors,
            decode,
            context,
            workspace,
            ws_zero,
            attn_errors,
            sinks,
            engine,
            model_dtype,
            page_size,
            context_len,
            decode_split,
            skip_softmax,
            ..
        } = self;
        let bufs = engine_bufs(engine, shape)?;
        engine_layer(
            &mut EngineCx {
                stream: gpu.stream(),
                kv_write,
                write_errors,
                decode,
                context,
                workspace,
                ws_zero,
                attn_errors,
                model_dtype: *model_dtype,
                page_size: *page_size,
                context_len: *context_len,
                decode_split: *decode_split,
                skip_softmax: *skip_softmax,
            },
            plan,
            sinks[plan.layer].as_ref(),
            bufs,
            shape,
            batch,
            io,
            save_kv,
        )?;
        Ok(crate::DeviceErrorReport::default())
    }
}

/// The reserved engine metadata buffers, if they hold `shape`.
fn engine_bufs<'a>(
    engine: &'a mut Option<MetaBufs>,
    shape: &EngineShape,
) -> Result<&'a mut MetaBufs> {
    let b = engine.as_mut().ok_or_else(|| {
        crate::error::batch_err(
            "batch_size",
            "engine passes on the CUDA executor need reserve_engine_metadata first (no allocation inside a pass)",
        )
    })?;
    if b.cap_bs < shape.bs || b.cap_tokens < shape.num_tokens {
        return Err(crate::error::batch_err(
            "batch_size",
            format!(
                "{} requests / {} tokens exceed the reserved engine metadata ({} / {}): call reserve_engine_metadata",
                shape.bs, shape.num_tokens, b.cap_bs, b.cap_tokens
            ),
        ));
    }
    Ok(b)
}

/// The fused metadata launch of an engine pass, from the engine's views.
fn launch_engine_metadata(
    kernel: &GraphMetadataKernel,
    batch: &EngineBatch<'_>,
    bufs: &mut MetaBufs,
    shape: &EngineShape,
    page_size: usize,
    errors: &mut DeviceErrors,
) -> Result<()> {
    let (gmode, write_cu_q) = meta_mode(shape.mode, shape.max_q)?;
    let ragged = shape.mode == AttnMode::RaggedVerify;
    let input = MetaIn {
        rpi: batch.req_pool_indices.strided()?,
        seq: batch.seq_lens.strided()?,
        out_loc: batch.out_cache_loc.strided()?,
        qlens: match (&batch.verify_lens, ragged) {
            (Some(v), true) => Some(v.strided()?),
            _ => None,
        },
        r2t: batch.req_to_token.strided()?,
        pool_slots: None,
        swa_map: batch
            .swa
            .as_ref()
            .map(|m| m.full_to_swa.strided())
            .transpose()?,
        page_map: match batch.swa.as_ref().and_then(|m| m.page_map.as_ref()) {
            Some(pm) => Some(pm.strided()?),
            None => None,
        },
    };
    launch_metadata_on(
        kernel,
        input,
        MetaOut::of(bufs),
        gmode,
        write_cu_q,
        shape.bs,
        shape.num_tokens,
        page_size,
        errors,
    )
}

/// The launchers and state one engine layer needs.
struct EngineCx<'a> {
    stream: &'a Arc<CudaStream>,
    kv_write: &'a KvWriteKernel,
    write_errors: &'a mut DeviceErrors,
    decode: &'a PagedAttentionKernel,
    context: &'a ContextKernel,
    workspace: &'a mut CudaSlice<f32>,
    ws_zero: &'a mut Option<(usize, usize)>,
    attn_errors: &'a mut DeviceErrors,
    model_dtype: HalfDtype,
    page_size: usize,
    context_len: usize,
    decode_split: SplitMode,
    skip_softmax: Option<f32>,
}

/// One engine layer: the paged K/V write into the engine's caches (at the
/// engine's `out_cache_loc`, or the SWA slots the metadata launch wrote),
/// then attention from the engine's `q` into its `out`.
#[allow(clippy::too_many_arguments)]
fn engine_layer(
    cx: &mut EngineCx<'_>,
    plan: &LayerPlan,
    sinks: Option<&CudaSlice<f32>>,
    bufs: &MetaBufs,
    shape: &EngineShape,
    batch: &EngineBatch<'_>,
    io: &mut EngineLayer<'_>,
    save_kv: bool,
) -> Result<()> {
    let n = shape.num_tokens;
    let (hq, d) = (plan.num_q_heads, plan.head_dim);
    if let (true, Some(k), Some(v), true) = (save_kv, &io.k, &io.v, n > 0) {
        let cache_loc = match (&bufs.swa_out, plan.is_swa) {
            (Some(s), true) => Strided::contiguous("cache_loc", s.slice(0..n), [n])?,
            _ => batch.out_cache_loc.strided()?,
        };
        let (k, v) = (k.strided()?, v.strided()?);
        match &mut io.kv_cache {
            crate::engine::EngineKvCache::Half { k: kc, v: vc } => {
                let mut args = fp8_kv::PagedKvWriteArgs {
                    k,
                    v,
                    cache_loc,
                    k_cache: kc.strided_mut()?,
                    v_cache: vc.strided_mut()?,
                };
                cx.kv_write
                    .set_kv_buffer_paged(&mut args, cx.write_errors)?;
            }
            crate::engine::EngineKvCache::E4m3 { k: kc, v: vc } => {
                let mut args = fp8_kv::PagedKvWriteArgs {
                    k,
                    v,
                    cache_loc,
                    k_cache: kc.strided_mut()?,
                    v_cache: vc.strided_mut()?,
                };
                let dtype = match cx.model_dtype {
                    HalfDtype::Bf16 => fp8_kv::KvDtype::Bf16,
                    HalfDtype::F16 => fp8_kv::KvDtype::F16,
                };
                cx.kv_write.fused_fp8_set_kv_buffer_paged(
                    &mut args,
                    dtype,
                    &plan.scales,
                    cx.write_errors,
                )?;
            }
        }
    }
    if shape.bs == 0 || n == 0 {
        return Ok(());
    }
    let cu_q = match (&batch.cu_seqlens_q, shape.mode) {
        (Some(c), AttnMode::Extend) => Some(c.device_view()?),
        _ => None,
    };
    let tables = Tables::of(bufs, cu_q);
    let q = Rows {
        view: io.q.device_view()?,
        strides: io.q.strides(),
    };
    let out_strides = io.out.strides();
    let out = Rows {
        view: io.out.device_view_mut()?,
        strides: out_strides,
    };
    let (workspace, foreign) = match io.workspace.as_mut() {
        Some(w) => (w.device_view_mut()?, true),
        None => (cx.workspace.as_view_mut(), false),
    };
    let mut acx = AttnCx {
        stream: cx.stream,
        decode: cx.decode,
        context: cx.context,
        workspace,
        ws_zero: cx.ws_zero,
        errors: cx.attn_errors,
        model_dtype: cx.model_dtype,
        page_size: cx.page_size,
        max_seq_len: cx.context_len,
        decode_split: cx.decode_split,
        timer: None,
        q_scale: io.q_scale,
        foreign_workspace: foreign,
        // Engine passes run on one stream (an engine may capture them).
        side: None,
        cp: None,
        skip_softmax: cx.skip_softmax,
        // An engine pass's lengths are its own per call: its ordered
        // launches rank in every CTA (no order kept across its layers).
        unit_order: None,
    };
    let kv = KvSrc::Engine(&io.kv_cache);
    let pass = PassShape {
        mode: shape.mode,
        bs: shape.bs,
        rows: n,
        max_q: shape.max_q,
        decode_tail: shape.decode_tail,
        max_kv: None,
    };
    let _ = (hq, d);
    run_attention(&mut acx, plan, kv, sinks, &tables, pass, q, out)
}
