//! `MhaBackend` (SEMANTICS.md §backend.1–3, §backend.7) and `MultiStepDraftBackend` (§backend.8).

use std::sync::{Arc, Mutex, MutexGuard};

use kernel_rt::ErrorReport;

use crate::batch::ForwardBatch;
use crate::config::BackendConfig;
use crate::cuda::CudaExecutor;
use crate::engine::{EngineBatch, EngineKvCache, EngineLayer, EngineShape};
use crate::error::{batch_err, BackendError, Result};
use crate::executor::{
    CpuExecutor, Device, DeviceMetadata, Executor, ExecutorKind, KvLoc, KvSnapshot, LayerPlan,
    Tensor, TensorRef,
};
use crate::graph::{GraphKey, GraphKind};
use crate::metadata::{self, ForwardMetadata};
use crate::part_timing::PartTimer;
use crate::pools::Pools;

/// State shared by a backend and its sibling step backends: config, pools,
/// executor (KV caches) and workspace size.
#[derive(Debug)]
struct Core {
    config: BackendConfig,
    plans: Vec<LayerPlan>,
    pools: Pools,
    executor: Box<dyn Executor>,
    workspace_bytes: usize,
    errors: ErrorReport,
}

impl Core {
    fn new(config: BackendConfig, device: Device) -> Result<Self> {
        config.validate()?;
        let workspace_bytes = config.resolved_workspace_bytes()?;
        let pools = Pools::new(
            config.page_size,
            config.context_len,
            config.max_requests,
            config.num_pages,
            config.num_swa_pages,
        )?;
        let plans: Vec<LayerPlan> = config
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let is_swa = config.is_swa_layer(i);
                LayerPlan {
                    layer: i,
                    num_q_heads: l.num_q_heads,
                    num_kv_heads: l.num_kv_heads,
                    head_dim: l.head_dim,
                    window_left: l.window_left,
                    sinks: l.sinks.clone(),
                    scales: config.layer_scales(l),
                    sm_scale: l.resolved_sm_scale(),
                    is_swa,
                    slots: if is_swa {
                        pools.swa_slots().unwrap_or(0)
                    } else {
                        pools.full_slots()
                    },
                }
            })
            .collect();
        // Checked on every executor, used by the CUDA one.
        let decode_split = crate::config::resolve_decode_split(
            std::env::var(crate::config::DECODE_SPLIT_ENV)
                .ok()
                .as_deref(),
        )?;
        let gpu = match device {
            Device::Cpu => None,
            Device::Auto if !kernel_rt::gpu_available() => None,
            Device::Auto => Some(kernel_rt::Gpu::shared()?),
            Device::Cuda(ordinal) => Some(match kernel_rt::Gpu::shared() {
                Ok(g) if g.context().ordinal() == ordinal => g,
                _ => kernel_rt::Gpu::new(ordinal)?,
            }),
        };
        let executor: Box<dyn Executor> = match gpu {
            None => Box::new(CpuExecutor::new(
                config.model_dtype,
                config.kv_dtype,
                &plans,
            )),
            Some(gpu) => Box::new(CudaExecutor::new(
                &gpu,
                config.model_dtype,
                config.kv_dtype,
                &plans,
                &pools,
                config.max_num_pages(),
                config.context_len,
                config.spec.map(|s| s.num_draft_tokens),
                workspace_bytes,
                decode_split,
            )?),
        };
        Ok(Self {
            config,
            plans,
            pools,
            executor,
            workspace_bytes,
            errors: ErrorReport::default(),
        })
    }
}

/// The paged-attention backend: turns a [`ForwardBatch`] into metadata once
/// per pass ([`MhaBackend::init_forward_metadata`]), then per layer writes
/// the new K/V and runs attention ([`MhaBackend::forward`]).
///
/// It owns (shared with its sibling draft-step backends) the request-to-token
/// pool, the page allocator, the hybrid SWA map and, inside the executor, the
/// per-layer K/V caches.
#[derive(Debug)]
pub struct MhaBackend {
    core: Arc<Mutex<Core>>,
    step_id: u32,
    metadata: Option<ForwardMetadata>,
    /// The current engine pass ([`MhaBackend::init_forward_metadata_engine`]).
    engine: Option<EngineShape>,
}

impl MhaBackend {
    /// Builds the backend (SEMANTICS.md §backend.1) on the executor chosen by `device`.
    ///
    /// # Errors
    /// [`BackendError::TopkUnsupported`], [`BackendError::Config`] for an
    /// invalid config; [`BackendError::Kernel`] (`KernelError::NoGpu`) for
    /// `Device::Cuda` without a GPU.
    pub fn new(config: BackendConfig, device: Device) -> Result<Self> {
        Ok(Self {
            core: Arc::new(Mutex::new(Core::new(config, device)?)),
            step_id: 0,
            metadata: None,
            engine: None,
        })
    }

    fn core(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock cannot leave a half-done pool change
        // (changes are made after all checks), so a poisoned lock is usable.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The executor in use.
    pub fn executor_kind(&self) -> ExecutorKind {
        self.core().executor.kind()
    }

    /// `speculative_step_id`: 0 for the target backend, `i` for draft step `i`.
    pub fn speculative_step_id(&self) -> u32 {
        self.step_id
    }

    /// A copy of the configuration.
    pub fn config(&self) -> BackendConfig {
        self.core().config.clone()
    }

    /// Workspace bytes (SEMANTICS.md §backend.6); the CPU executor allocates none.
    pub fn workspace_bytes(&self) -> usize {
        self.core().workspace_bytes
    }

    /// `M = ceil(context_len / P)`.
    pub fn max_num_pages(&self) -> usize {
        self.core().config.max_num_pages()
    }

    /// Device-error events accumulated by metadata builds, KV writes,
    /// attention and (CUDA executor) the `req_to_token` update
    /// (out-of-range slots / pages / entries skipped and counted). The flags
    /// are each family's bits OR-ed together, so a bit names its event only
    /// together with the family that set it. On the
    /// CUDA executor this reads the device error words (a stream
    /// synchronisation); if that read fails the result is
    /// `count = flags = u32::MAX`.
    pub fn device_errors(&self) -> ErrorReport {
        let core = self.core();
        let mut e = core.errors;
        match core.executor.device_errors() {
            Ok(d) => e.merge(d),
            Err(_) => {
                e = ErrorReport {
                    count: u32::MAX,
                    flags: u32::MAX,
                }
            }
        }
        e
    }

    /// Runs `f` on the pools (read-only).
    pub fn with_pools<R>(&self, f: impl FnOnce(&Pools) -> R) -> R {
        f(&self.core().pools)
    }

    /// A copy of the pools' host state (tests: "unchanged on failure").
    pub fn pools_snapshot(&self) -> Pools {
        self.core().pools.clone()
    }

    /// Takes a free request row (never row 0).
    ///
    /// # Errors
    /// [`BackendError::NoFreeRequestRow`].
    pub fn alloc_request(&self) -> Result<usize> {
        self.core().pools.alloc_request()
    }

    /// Appends tokens to requests, all or nothing ([`Pools::alloc_tokens`]);
    /// returns their slots request after request.
    ///
    /// # Errors
    /// [`BackendError::Exhausted`] etc.; nothing changes on error.
    pub fn alloc_tokens(&self, grow: &[(usize, usize)]) -> Result<Vec<i64>> {
        self.core().pools.alloc_tokens(grow)
    }

    /// Shrinks a request ([`Pools::truncate_request`]).
    ///
    /// # Errors
    /// As [`Pools::truncate_request`].
    pub fn truncate_request(&self, req: usize, new_len: usize) -> Result<()> {
        self.core().pools.truncate_request(req, new_len)
    }

    /// Frees a request's pages and row ([`Pools::free_request`]).
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn free_request(&self, req: usize) -> Result<()> {
        self.core().pools.free_request(req)
    }

    /// Frees SWA pages out of the window ([`Pools::evict_swa`]); `window` =
    /// the largest `window_left` of the SWA layers.
    ///
    /// # Errors
    /// As [`Pools::evict_swa`].
    pub fn evict_swa(&self, req: usize, pre_len: usize) -> Result<usize> {
        let mut core = self.core();
        let window = (0..core.config.layers.len())
            .filter(|&l| core.config.is_swa_layer(l))
            .filter_map(|l| core.config.layers[l].window_left)
            .max()
            .unwrap_or(0) as usize;
        core.pools.evict_swa(req, pre_len, window)
    }

    /// A host copy of layer `layer`'s K/V caches.
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; executor errors.
    pub fn read_kv_cache(&self, layer: usize) -> Result<KvSnapshot> {
        let core = self.core();
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        core.executor.read_kv(plan)
    }

    /// The current metadata (set by [`MhaBackend::init_forward_metadata`]).
    pub fn metadata(&self) -> Option<&ForwardMetadata> {
        self.metadata.as_ref()
    }

    /// Builds the eager metadata of `batch` for every mode (SEMANTICS.md §backend.3):
    /// `cache_seqlens`, `cu_seqlens_q/k`, `max_seq_len_q`, the page tables
    /// (+ SWA table) from the live `req_to_token`, and `swa_out_cache_loc`;
    /// stores it as the current metadata and returns it. An empty / IDLE
    /// batch gives empty tensors and succeeds.
    ///
    /// # Errors
    /// [`BackendError::Batch`] for an inconsistent batch (the current
    /// metadata is then unchanged).
    pub fn init_forward_metadata(&mut self, batch: &ForwardBatch) -> Result<&ForwardMetadata> {
        let meta = {
            let mut core = self.core();
            let m = metadata::build(
                batch,
                &core.pools,
                core.config.max_num_pages(),
                self.step_id,
            )?;
            let core = &mut *core;
            core.executor.prepare_metadata(&m, &core.pools)?;
            core.errors.merge(m.errors);
            m
        };
        Ok(self.metadata.insert(meta))
    }

    /// One attention layer of the pass (SEMANTICS.md §backend.7):
    /// 1. if `save_kv` and `k`/`v` are given, writes them (`[num_tokens,
    ///    Hkv, D]`, model dtype) into the layer's own pool at
    ///    `out_cache_loc` (its SWA translation for SWA layers): bit copy for
    ///    16-bit caches, the fused FP8 write with the layer's resolved scales
    ///    for e4m3;
    /// 2. attention of `q` (`[num_tokens, Hq, D]`) over the layer's cache with
    ///    its page table (SWA table for SWA layers), window, sinks and
    ///    `bmm1 = k_scale · sm_scale`, `bmm2 = v_scale` — the decode kernel's
    ///    rule for decode / verify / draft extend, the context kernel's for
    ///    extend / mixed.
    ///
    /// Returns `[num_tokens, Hq·D]` in the model dtype.
    ///
    /// # Errors
    /// [`BackendError::Metadata`] when the current metadata is not `batch`'s;
    /// [`BackendError::UnknownLayer`]; [`BackendError::Kernel`] for wrong
    /// tensor sizes or placement. Nothing is written on error.
    pub fn forward(
        &mut self,
        layer: usize,
        q: TensorRef<'_>,
        k: Option<TensorRef<'_>>,
        v: Option<TensorRef<'_>>,
        batch: &ForwardBatch,
        save_kv: bool,
    ) -> Result<Tensor> {
        let meta = self
            .metadata
            .as_ref()
            .ok_or_else(|| BackendError::Metadata("init_forward_metadata was not called".into()))?;
        if !meta.matches(batch) {
            return Err(BackendError::Metadata(
                "the batch differs from the one init_forward_metadata was called with".into(),
            ));
        }
        let mut guard = self.core();
        let core = &mut *guard;
        // A no-op unless another step backend's metadata is current on a
        // shared device executor (multi-step draft).
        core.executor.prepare_metadata(meta, &core.pools)?;
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        let rows = meta.num_tokens;
        let q_need = rows * plan.num_q_heads * plan.head_dim;
        if q.len() != q_need {
            return Err(kernel_rt::KernelError::shape(
                "q",
                format!(
                    "[num_tokens={rows}, Hq={}, D={}] = {q_need} elements",
                    plan.num_q_heads, plan.head_dim
                ),
                format!("{} elements", q.len()),
            )
            .into());
        }
        let write = match (save_kv, k, v) {
            (true, Some(k), Some(v)) => Some((k, v)),
            (true, Some(_), None) | (true, None, Some(_)) => {
                return Err(batch_err("k/v", "k and v must both be given"))
            }
            _ => None,
        };
        if let Some((k, v)) = write {
            let n = batch.out_cache_loc.len();
            let need = n * plan.num_kv_heads * plan.head_dim;
            for (name, t) in [("k", k), ("v", v)] {
                if t.len() != need {
                    return Err(kernel_rt::KernelError::shape(
                        name,
                        format!(
                            "[num_tokens={n}, Hkv={}, D={}] = {need} elements",
                            plan.num_kv_heads, plan.head_dim
                        ),
                        format!("{} elements", t.len()),
                    )
                    .into());
                }
            }
            let translated;
            let same_locs = meta.source_out_cache_loc == batch.out_cache_loc;
            let loc: &[i64] = if plan.is_swa {
                match (&meta.swa_out_cache_loc, core.pools.swa_mapping()) {
                    (Some(s), _) if same_locs => s,
                    (_, Some(m)) => {
                        // The batch's write slots changed since the metadata
                        // (per-step draft slots): translate from the live map.
                        let mut out = vec![0i64; batch.out_cache_loc.len()];
                        let e = swa_pool::reference::translate_locs(
                            m.map(),
                            &batch.out_cache_loc,
                            &mut out,
                        );
                        core.errors.merge(e);
                        translated = out;
                        &translated
                    }
                    _ => &batch.out_cache_loc,
                }
            } else {
                &batch.out_cache_loc
            };
            let loc = KvLoc {
                slots: loc,
                prepared: same_locs,
            };
            let e = core.executor.write_kv(plan, loc, k, v)?;
            core.errors.merge(e);
        }
        let (out, e) = core
            .executor
            .attention(plan, meta, core.config.page_size, q)?;
        core.errors.merge(e);
        Ok(out)
    }

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
    /// for [`MhaBackend::forward_engine`]. The backend's [`Pools`] are not
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
            )?;
            if m.mode != batch.mode {
                return Err(batch_err(
                    "mode",
                    format!("{:?} resolved as {:?}", batch.mode, m.mode),
                ));
            }
            core.errors.merge(m.errors);
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
    /// ([`kernel_rt::Gpu::shared`]), so the engine's buffers must stay alive
    /// until that stream has run them.
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
        core.errors.merge(e);
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
        core.executor
            .capture_engine_graph(key, &core.plans, &shape, batch, layers, save_kv)?;
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
        self.core().executor.replay_engine_graph(key)
    }

    /// Installs a [`PartTimer`] (or removes the installed one with `None`)
    /// and returns the one installed before (timing by part, off by
    /// default; [`crate::part_timing`]). While a timer is installed, each
    /// eager [`MhaBackend::forward`] records CUDA events around its K/V
    /// write, its context-kernel launch and its decode-kernel launch, and
    /// adds the context launch's causal FLOPs; nothing is recorded inside
    /// CUDA-graph capture or replay. Recording never synchronises. Step
    /// backends of a [`MultiStepDraftBackend`] share one executor, hence one
    /// installed timer.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] on the CPU executor (no CUDA events) or for
    /// a timer of another device; the timer passed in is then dropped and
    /// the installed one (if any) stays.
    pub fn set_part_timer(&mut self, timer: Option<PartTimer>) -> Result<Option<PartTimer>> {
        self.core().executor.set_part_timer(timer)
    }

    /// Allocates the CUDA-graph state (SEMANTICS.md §backend.4.1) for buckets of up to
    /// `max_bs` rows and `max_num_tokens` tokens: one set of metadata
    /// buffers, static per-layer `q`/`k`/`v`/output buffers. Drops every
    /// captured graph.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] on the CPU executor (never a
    /// silent fallback to eager); driver errors.
    pub fn init_cuda_graph_state(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        self.core()
            .executor
            .init_graph_state(max_bs, max_num_tokens)
    }

    /// Captures a whole step for a bucket (SEMANTICS.md §backend.4.2–4.3): the fused
    /// metadata launch, then every layer's K/V write (from the static
    /// inputs, [`MhaBackend::write_graph_inputs`]) and attention (into the
    /// static outputs). A [`GraphKind::DraftDecode`] step id is the
    /// caller's (normally [`MhaBackend::speculative_step_id`]); ragged verify
    /// uses `max_q_len = spec.num_draft_tokens`. Returns the bucket's key.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] (CPU executor, no graph state,
    /// impossible bucket); driver / validation errors.
    pub fn capture_cuda_graph(
        &mut self,
        kind: GraphKind,
        bs: usize,
        num_tokens: usize,
    ) -> Result<GraphKey> {
        let mut guard = self.core();
        let core = &mut *guard;
        let n = core.config.spec.map(|s| s.num_draft_tokens);
        let key = GraphKey::new(kind, bs, num_tokens, n)?;
        if num_tokens > core.config.context_len.saturating_mul(bs) {
            return Err(BackendError::GraphUnsupported(
                "bucket larger than the context allows".into(),
            ));
        }
        core.executor.capture_graph(key, &core.pools)?;
        Ok(key)
    }

    /// The captured buckets.
    pub fn cuda_graph_keys(&self) -> Vec<GraphKey> {
        self.core().executor.graph_keys()
    }

    /// The bucket a replay of `batch` would use: the captured key of the
    /// batch's graph kind with the fewest rows (then tokens) that holds it
    /// (uniform modes: the same rows per request; ragged verify: padding
    /// rows within `max_q_len`, so capture ragged buckets with `bs =
    /// num_tokens` as upstream does, SEMANTICS.md §backend.5).
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] for extend-like modes or when no
    /// captured bucket fits; [`BackendError::Batch`] for an inconsistent batch.
    pub fn select_cuda_graph(&self, batch: &ForwardBatch) -> Result<GraphKey> {
        batch.check_lengths()?;
        let mode = metadata::resolve_mode(batch, self.step_id)?;
        let kind = GraphKind::of(mode).ok_or_else(|| {
            BackendError::GraphUnsupported(format!(
                "{:?} has no graph metadata (SEMANTICS.md §backend.9): run it eagerly",
                batch.forward_mode
            ))
        })?;
        let tokens = batch.out_cache_loc.len();
        let q_len = match mode {
            crate::AttnMode::TargetVerify { q_len } | crate::AttnMode::DraftExtendV2 { q_len } => {
                Some(q_len)
            }
            _ => None,
        };
        let mut keys: Vec<GraphKey> = self
            .cuda_graph_keys()
            .into_iter()
            .filter(|k| k.kind == kind && k.bs >= batch.batch_size && k.num_tokens >= tokens)
            .filter(|k| q_len.is_none_or(|q| q == k.q_len))
            .collect();
        keys.sort_by_key(|k| (k.bs, k.num_tokens));
        // Ragged verify: the padded lengths must stay within max_q_len
        // (SEMANTICS.md §backend.5 decision); buckets with bs = num_tokens always fit
        // when every real row has ≥ 1 token.
        keys.into_iter()
            .find(|k| kind != GraphKind::RaggedVerify || crate::batch::pad_for(batch, *k).is_ok())
            .ok_or_else(|| {
                BackendError::GraphUnsupported(format!(
                    "no captured {kind:?} bucket holds {} rows / {tokens} tokens",
                    batch.batch_size
                ))
            })
    }

    /// Copies layer `layer`'s inputs into the graph's static buffers
    /// (`q` `[n, Hq, D]`, `k`/`v` `[n, Hkv, D]`, model dtype, `n ≤
    /// max_num_tokens`; host or device tensors). Padding rows of a bucket
    /// read whatever the buffers hold past `n`.
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; [`BackendError::GraphUnsupported`];
    /// capacity / driver errors.
    pub fn write_graph_inputs(
        &mut self,
        layer: usize,
        q: TensorRef<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<()> {
        let mut guard = self.core();
        let core = &mut *guard;
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        core.executor.write_graph_inputs(plan, q, k, v)
    }

    /// Replays the captured step for `batch` (replay preparation, D3:
    /// padding rows get request row 0, `seq_len` 1, slot 0; ragged verify
    /// lengths padded and their metadata written eagerly, SEMANTICS.md §backend.5):
    /// uploads the padded inputs and the changed pool tables, launches the
    /// graph. No host synchronisation. Outputs land in the static output
    /// buffers ([`MhaBackend::read_graph_output`]). Returns the bucket used.
    ///
    /// # Errors
    /// As [`MhaBackend::select_cuda_graph`]; [`BackendError::Batch`] for
    /// request rows / lengths out of range; driver errors. Nothing is
    /// launched on error.
    pub fn replay_cuda_graph(&mut self, batch: &ForwardBatch) -> Result<GraphKey> {
        let key = self.select_cuda_graph(batch)?;
        let mut guard = self.core();
        let core = &mut *guard;
        let rows = core.pools.req_to_token_rows() as i64;
        let context = core.config.context_len as i64;
        let offset = match key.kind {
            GraphKind::DraftDecode { step } => i64::from(step) + 1,
            GraphKind::TargetVerify => key.q_len as i64,
            _ => 0,
        };
        for (i, (&r, &s)) in batch
            .req_pool_indices
            .iter()
            .zip(&batch.seq_lens)
            .enumerate()
        {
            if !(0..rows).contains(&r) {
                return Err(batch_err(
                    "req_pool_indices",
                    format!("row {i}: request row {r} outside [0, {rows})"),
                ));
            }
            let extra = batch
                .verify_lens()
                .and_then(|v| v.get(i))
                .map_or(offset, |&l| i64::from(l));
            if s < 0 || s + extra > context {
                return Err(batch_err(
                    "seq_lens",
                    format!(
                        "row {i}: attention length {} outside [0, {context}]",
                        s + extra
                    ),
                ));
            }
        }
        let padded = crate::batch::pad_for(batch, key)?;
        core.executor.replay_graph(key, &padded, &core.pools)?;
        Ok(key)
    }

    /// A host copy of the first `rows` rows (`[rows, Hq·D]`) of layer
    /// `layer`'s static graph output (synchronises).
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; [`BackendError::GraphUnsupported`];
    /// driver errors.
    pub fn read_graph_output(&self, layer: usize, rows: usize) -> Result<Vec<u16>> {
        let core = self.core();
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        core.executor.read_graph_output(plan, rows)
    }

    /// Enqueues a device copy of output rows `[row0, row0 + rows)`
    /// (`[rows, Hq·D]`, model dtype bits) of layer `layer`'s static graph
    /// output into `dst`, stream-ordered after the last replay on the
    /// backend's stream ([`kernel_rt::Gpu::shared`]); no host sync, so a
    /// caller can read results back while the next step runs.
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; [`BackendError::GraphUnsupported`]
    /// (CPU executor, no graph state); [`BackendError::Kernel`] when the
    /// rows exceed the graph output or `dst`.
    pub fn copy_graph_output(
        &self,
        layer: usize,
        row0: usize,
        rows: usize,
        dst: &mut kernel_rt::cudarc::driver::CudaViewMut<'_, u16>,
    ) -> Result<()> {
        let core = self.core();
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        core.executor.copy_graph_output(plan, row0, rows, dst)
    }

    /// A host copy of the device-built metadata: of the current eager pass
    /// (`graph = false`) or of the last graph replay (`graph = true`);
    /// `None` on the CPU executor (its metadata is the host copy).
    ///
    /// # Errors
    /// Driver errors.
    pub fn read_device_metadata(&self, graph: bool) -> Result<Option<DeviceMetadata>> {
        self.core().executor.read_metadata(graph)
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

/// The multi-step draft backend (SEMANTICS.md §backend.8): `S − 1` step backends with
/// step ids `0..S−1`, sharing one set of pools, KV caches and workspace.
/// Step `i` attends over `seq_lens + i + 1`.
#[derive(Debug)]
pub struct MultiStepDraftBackend {
    steps: Vec<MhaBackend>,
}

impl MultiStepDraftBackend {
    /// Builds `spec.num_steps − 1` step backends over one shared state.
    ///
    /// # Errors
    /// As [`MhaBackend::new`]; [`BackendError::Config`] without `spec`.
    pub fn new(config: BackendConfig, device: Device) -> Result<Self> {
        let spec = config.spec.ok_or_else(|| {
            crate::error::config_err(
                "spec",
                "the multi-step draft backend needs speculative settings",
            )
        })?;
        let core = Arc::new(Mutex::new(Core::new(config, device)?));
        let steps = (0..spec.num_steps.saturating_sub(1))
            .map(|i| MhaBackend {
                core: Arc::clone(&core),
                step_id: i as u32,
                metadata: None,
                engine: None,
            })
            .collect();
        Ok(Self { steps })
    }

    /// The step backends, step id `i` at index `i`.
    pub fn steps(&self) -> &[MhaBackend] {
        &self.steps
    }

    /// Step backend `i`, mutable (for `forward`).
    pub fn step_mut(&mut self, i: usize) -> Option<&mut MhaBackend> {
        self.steps.get_mut(i)
    }

    /// Runs §backend.3 for every step on the same draft-decode batch (mode
    /// DECODE/IDLE with draft spec_info; each step uses its own step id).
    ///
    /// # Errors
    /// [`BackendError::Batch`] when the batch is not a draft decode (no
    /// step's metadata changes then).
    pub fn init_forward_metadata(&mut self, batch: &ForwardBatch) -> Result<()> {
        if !batch.forward_mode.is_decode_or_idle()
            || !matches!(batch.spec_info, Some(crate::SpecInfo::Draft { step: None }))
        {
            return Err(batch_err(
                "spec_info",
                "the multi-step draft backend needs a DECODE/IDLE batch with draft spec_info (step None)",
            ));
        }
        let metas = self
            .steps
            .iter()
            .map(|s| {
                let core = s.core();
                metadata::build(batch, &core.pools, core.config.max_num_pages(), s.step_id)
            })
            .collect::<Result<Vec<_>>>()?;
        for (s, m) in self.steps.iter_mut().zip(metas) {
            s.metadata = Some(m);
        }
        Ok(())
    }
}
