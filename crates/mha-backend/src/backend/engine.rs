//! The engine-memory path of [`MhaBackend`]: metadata reservation, the
//! metadata build and per-layer forward over the engine's views, engine CUDA
//! graphs, and the host checks of one engine layer.

use crate::config::BackendConfig;
use crate::engine::{EngineBatch, EngineKvCache, EngineLayer, EngineShape};
use crate::error::{batch_err, BackendError, Result};
use crate::executor::{graphs_of_mut, ExecutorKind};
use crate::graph::{GraphKey, GraphKind};
use crate::metadata;

use super::MhaBackend;

impl MhaBackend {
    /// Engine memory: reserves the device metadata buffers of engine passes
    /// of up to `max_bs` requests and `max_num_tokens` tokens (the CUDA
    /// executor allocates nothing inside an engine pass, so call this once
    /// before the first [`MhaBackend::init_forward_metadata_engine`], and
    /// again to grow; growing drops the engine CUDA graphs). A no-op on the
    /// CPU executor.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (allocation).
    pub fn reserve_engine_metadata(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        self.core().executor.reserve_engine(max_bs, max_num_tokens)
    }

    /// Engine memory: builds the metadata of the pass `batch` describes
    /// (SEMANTICS.md §backend.3, every mode) from the engine's own buffers —
    /// `req_to_token`, `req_pool_indices`, `seq_lens`, `out_cache_loc`,
    /// `cu_seqlens_q` / `verify_lens`, the SWA maps — and makes it current
    /// for [`MhaBackend::forward_engine`]. The backend's [`Pools`](crate::Pools) are not
    /// read (page allocation is the engine's: requests may share prefix
    /// pages). On the CUDA executor this is one fused metadata launch into
    /// the reserved buffers ([`MhaBackend::reserve_engine_metadata`]): no
    /// host copy, no stream synchronisation, no allocation; device data is
    /// bounds-checked by the kernel (bad entries counted,
    /// [`MhaBackend::device_errors`]). On the CPU executor the views must be
    /// host memory and the host builder checks the lengths like
    /// [`MhaBackend::init_forward_metadata`].
    ///
    /// # Errors
    /// [`BackendError::Batch`] naming the field (shape, contiguity, missing
    /// mode input, SWA maps missing or unexpected, mixed placement, pass
    /// larger than the reservation); [`BackendError::Kernel`] for views on
    /// the wrong side (host vs device) or driver errors. The current engine
    /// pass is unchanged on error.
    pub fn init_forward_metadata_engine(&mut self, batch: &EngineBatch<'_>) -> Result<()> {
        let mut guard = self.core();
        let core = &mut *guard;
        batch.check(core.pools.swa_mapping().is_some())?;
        let max_q = match batch.mode {
            crate::AttnMode::Decode | crate::AttnMode::DraftDecode { .. } => 1,
            crate::AttnMode::TargetVerify { q_len } | crate::AttnMode::DraftExtendV2 { q_len } => {
                q_len
            }
            crate::AttnMode::RaggedVerify | crate::AttnMode::Extend => batch.max_q_len,
        };
        let mut shape = EngineShape {
            mode: batch.mode,
            bs: batch.batch_size,
            num_tokens: batch.num_tokens,
            max_q,
            decode_tail: batch.decode_tail.min(batch.batch_size),
            host: None,
        };
        if core.executor.kind() == ExecutorKind::Cpu {
            let host_batch = batch.to_host_batch()?;
            let [rows, width] = batch.req_to_token.shape();
            let tables = metadata::Tables {
                req_to_token: batch.req_to_token.host()?,
                rows,
                width,
                stride: batch.req_to_token.strides()[0],
                page_size: core.config.page_size,
                full_to_swa: batch
                    .swa
                    .as_ref()
                    .map(|m| m.full_to_swa.host())
                    .transpose()?,
                pool_slots: None,
            };
            let m = metadata::build_on(
                &host_batch,
                &tables,
                core.config.max_num_pages(),
                self.step_id,
                true,
            )?;
            if m.mode != batch.mode {
                return Err(batch_err(
                    "mode",
                    format!("{:?} resolved as {:?}", batch.mode, m.mode),
                ));
            }
            core.errors.merge(&m.errors);
            shape.host = Some(m);
        } else {
            core.executor.engine_metadata(batch, &shape)?;
        }
        drop(guard);
        self.engine = Some(shape);
        Ok(())
    }

    /// Engine memory: one attention layer of the current engine pass
    /// (SEMANTICS.md §backend.7) on the engine's buffers: writes `io.k` / `io.v`
    /// (when given and `save_kv`) into `io.kv_cache` at `out_cache_loc` —
    /// its SWA translation on SWA layers — (bit copy for 16-bit caches, the
    /// fused FP8 write with the layer's scales for e4m3), then attention of
    /// `io.q` over `io.kv_cache` into `io.out` (`bmm1 = io.q_scale · k_scale
    /// · sm_scale`, `bmm2 = v_scale`; the layer's window and sinks). Nothing
    /// is allocated, copied to the host or synchronised on the CUDA
    /// executor; every launch is stream-ordered on the backend's stream
    /// (its device's [`kernel_rt::Gpu::shared_on`] handle), so the engine's
    /// buffers must stay alive until that stream has run them.
    ///
    /// # Errors
    /// [`BackendError::Metadata`] without a current engine pass or for a
    /// batch of another mode / size; [`BackendError::UnknownLayer`];
    /// [`BackendError::Kernel`] naming the view for a wrong shape, dtype
    /// (`kv_cache` of another KV dtype), stride or placement. Nothing is
    /// written on error.
    pub fn forward_engine(
        &mut self,
        layer: usize,
        io: &mut EngineLayer<'_>,
        batch: &EngineBatch<'_>,
        save_kv: bool,
    ) -> Result<()> {
        let shape = self.engine.as_ref().ok_or_else(|| {
            BackendError::Metadata("init_forward_metadata_engine was not called".into())
        })?;
        if shape.mode != batch.mode
            || shape.bs != batch.batch_size
            || shape.num_tokens != batch.num_tokens
        {
            return Err(BackendError::Metadata(
                "the engine batch differs from the one init_forward_metadata_engine was called with"
                    .into(),
            ));
        }
        let mut guard = self.core();
        let core = &mut *guard;
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        check_engine_layer(plan, io, shape.num_tokens, &core.config, save_kv)?;
        let e = core
            .executor
            .engine_forward(plan, shape, batch, io, save_kv)?;
        core.errors.merge(&e);
        Ok(())
    }

    /// Engine memory: captures one whole engine step as a CUDA graph (CUDA
    /// executor): the fused metadata launch reading the engine's views of
    /// `batch` (ragged verify included: its metadata is in the graph too,
    /// computed from the device `verify_lens`), then for every layer, in
    /// order, the K/V write and attention over `layers[l]` (one entry per
    /// layer). The graph bakes in every buffer address: a replay
    /// ([`MhaBackend::replay_engine_graph`]) reads whatever the engine has
    /// written into those same buffers (its static graph-runner tensors,
    /// padding rows included: request row 0, `seq_len ≥ 1`, a dummy slot),
    /// so they must outlive the graph. The bucket is `batch`'s mode, `bs`
    /// and `num_tokens` (ragged: `q_len = max_q_len`).
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] (CPU executor, extend-like mode,
    /// bucket shape); as [`MhaBackend::init_forward_metadata_engine`] and
    /// [`MhaBackend::forward_engine`] for the views; driver errors.
    pub fn capture_engine_graph(
        &mut self,
        batch: &EngineBatch<'_>,
        layers: &mut [EngineLayer<'_>],
        save_kv: bool,
    ) -> Result<GraphKey> {
        let kind = GraphKind::of(batch.mode).ok_or_else(|| {
            BackendError::GraphUnsupported(format!(
                "{:?} has no graph metadata: run it eagerly",
                batch.mode
            ))
        })?;
        let mut guard = self.core();
        let core = &mut *guard;
        if core.executor.kind() == ExecutorKind::Cpu {
            return Err(crate::executor::graphs_unsupported(ExecutorKind::Cpu));
        }
        batch.check(core.pools.swa_mapping().is_some())?;
        let key = GraphKey::new(
            kind,
            batch.batch_size,
            batch.num_tokens,
            Some(batch.max_q_len.max(1)),
        )?;
        if layers.len() != core.plans.len() {
            return Err(batch_err(
                "layers",
                format!(
                    "{} given, the backend has {} layers",
                    layers.len(),
                    core.plans.len()
                ),
            ));
        }
        let shape = EngineShape {
            mode: batch.mode,
            bs: batch.batch_size,
            num_tokens: batch.num_tokens,
            max_q: key.q_len,
            decode_tail: 0,
            host: None,
        };
        for (plan, io) in core.plans.iter().zip(layers.iter()) {
            check_engine_layer(plan, io, shape.num_tokens, &core.config, save_kv)?;
        }
        graphs_of_mut(core.executor.as_mut())?.capture_engine_graph(
            key,
            &core.plans,
            &shape,
            batch,
            layers,
            save_kv,
        )?;
        Ok(key)
    }

    /// Engine memory: replays the engine graph of `key`
    /// ([`MhaBackend::capture_engine_graph`]): one graph launch on the
    /// backend's stream, no host work, no synchronisation.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] when no such graph was captured
    /// (or the CPU executor); driver errors.
    pub fn replay_engine_graph(&mut self, key: GraphKey) -> Result<()> {
        graphs_of_mut(self.core().executor.as_mut())?.replay_engine_graph(key)
    }
}

/// The host checks of one engine layer: `q` / `out` `[n, Hq, D]`, `k` /
/// `v` `[n, Hkv, D]` (both or neither), caches `[pages ≥ 1, Hkv, P, D]` of
/// the config's KV dtype, `q_scale` finite.
fn check_engine_layer(
    plan: &crate::executor::LayerPlan,
    io: &EngineLayer<'_>,
    n: usize,
    config: &BackendConfig,
    save_kv: bool,
) -> Result<()> {
    use kernel_rt::KernelError;
    let (hq, hkv, d) = (plan.num_q_heads, plan.num_kv_heads, plan.head_dim);
    let want = |arg: &'static str, got: [usize; 3], h: usize| -> Result<()> {
        if got != [n, h, d] {
            return Err(KernelError::shape(
                arg,
                format!("[num_tokens={n}, {h}, D={d}]"),
                format!("{got:?}"),
            )
            .into());
        }
        Ok(())
    };
    want("q", io.q.shape(), hq)?;
    want("out", io.out.shape(), hq)?;
    if save_kv {
        match (&io.k, &io.v) {
            (Some(k), Some(v)) => {
                want("k", k.shape(), hkv)?;
                want("v", v.shape(), hkv)?;
            }
            (None, None) => {}
            _ => return Err(batch_err("k/v", "k and v must both be given")),
        }
    }
    let p = config.page_size;
    let (ks, vs) = match &io.kv_cache {
        EngineKvCache::Half { k, v } => (k.shape(), v.shape()),
        EngineKvCache::E4m3 { k, v } => (k.shape(), v.shape()),
    };
    let fp8 = matches!(io.kv_cache, EngineKvCache::E4m3 { .. });
    if fp8 != (config.kv_dtype == fp8_kv::KvCacheDtype::Fp8E4m3) {
        return Err(KernelError::unsupported(
            "kv_cache",
            format!(
                "{} caches given, the backend's KV dtype is {:?}",
                if fp8 { "e4m3" } else { "16-bit" },
                config.kv_dtype
            ),
        )
        .into());
    }
    if ks[0] == 0 || ks[1..] != [hkv, p, d] {
        return Err(KernelError::shape(
            "kv_cache",
            format!("[num_pages ≥ 1, Hkv={hkv}, P={p}, D={d}] (kernel order)"),
            format!("{ks:?}"),
        )
        .into());
    }
    if vs != ks {
        return Err(KernelError::shape(
            "v_cache",
            format!("{ks:?} (as k_cache)"),
            format!("{vs:?}"),
        )
        .into());
    }
    if !io.q_scale.is_finite() {
        return Err(KernelError::unsupported("q_scale", "must be finite").into());
    }
    Ok(())
}
