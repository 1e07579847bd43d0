//! `MhaBackend` (SEMANTICS.md §backend.1–3, §backend.7) and `MultiStepDraftBackend` (§backend.8).
//!
//! Submodules: `engine` (the engine-memory methods), `graphs` (the CUDA-graph methods).

use std::sync::{Arc, Mutex, MutexGuard};

use kernel_rt::ErrorReport;

use crate::batch::ForwardBatch;
use crate::config::BackendConfig;
use crate::cuda::CudaExecutor;
use crate::engine::EngineShape;
use crate::error::{batch_err, BackendError, Result};
use crate::errors::DeviceErrorReport;
use crate::executor::{
    CpuExecutor, Device, DeviceMetadata, Executor, ExecutorKind, KvLoc, KvSnapshot, LayerPlan,
    Tensor, TensorRef,
};
use crate::metadata::{self, ForwardMetadata};
use crate::part_timing::PartTimer;
use crate::pools::Pools;

mod engine;
mod graphs;
mod kv_pages;

pub use kv_pages::{KvLocation, KvPageDescriptor, KvPageFormat, KvPages};

/// State shared by a backend and its sibling step backends: config, pools,
/// executor (KV caches) and workspace size.
#[derive(Debug)]
struct Core {
    config: BackendConfig,
    plans: Vec<LayerPlan>,
    pools: Pools,
    executor: Box<dyn Executor>,
    workspace_bytes: usize,
    errors: DeviceErrorReport,
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
        let skip_softmax = crate::config::resolve_skip_softmax(
            config.skip_softmax_decode,
            std::env::var(crate::config::SKIP_SOFTMAX_DECODE_ENV)
                .ok()
                .as_deref(),
        )?;
        let mixed_overlap = crate::config::resolve_mixed_overlap(
            std::env::var(crate::config::MIXED_OVERLAP_ENV)
                .ok()
                .as_deref(),
        )?;
        let gpu = match device {
            Device::Cpu => None,
            Device::Auto if !kernel_rt::gpu_available() => None,
            Device::Auto => Some(kernel_rt::Gpu::shared()?),
            Device::Cuda(ordinal) => Some(kernel_rt::Gpu::shared_on(ordinal)?),
        };
        let executor: Box<dyn Executor> = match gpu {
            None => Box::new(
                CpuExecutor::new(config.model_dtype, config.kv_dtype, &plans)
                    .with_decode_cp(config.decode_cp_ranks),
            ),
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
                mixed_overlap,
                config.decode_cp_ranks,
                skip_softmax,
            )?),
        };
        Ok(Self {
            config,
            plans,
            pools,
            executor,
            workspace_bytes,
            errors: DeviceErrorReport::default(),
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
    /// `Device::Cuda(n)` uses the process's handle of device `n`
    /// ([`kernel_rt::Gpu::shared_on`]): every backend on one device, and
    /// whatever else takes that handle, launches on one stream.
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
    /// (out-of-range slots / pages / entries skipped and counted), one
    /// report per kernel family ([`DeviceErrorReport`]: a flag bit names its
    /// event only within its family, so families are never OR-ed). On the
    /// CUDA executor this reads the device error words (a stream
    /// synchronisation); if that read fails every family reads
    /// `count = flags = u32::MAX`.
    pub fn device_errors(&self) -> DeviceErrorReport {
        let core = self.core();
        let mut e = core.errors;
        match core.executor.device_errors() {
            Ok(d) => e.merge(&d),
            Err(_) => {
                let all = ErrorReport {
                    count: u32::MAX,
                    flags: u32::MAX,
                };
                e = DeviceErrorReport {
                    page_table: all,
                    swa_pool: all,
                    kv_write: all,
                    attention: all,
                    metadata: all,
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
    /// On the CUDA executor its page tables are empty
    /// ([`ForwardMetadata::tables_on_host`] is false: the device builds them);
    /// [`MhaBackend::reference_metadata`] gives them on the host.
    pub fn metadata(&self) -> Option<&ForwardMetadata> {
        self.metadata.as_ref()
    }

    /// Builds the eager metadata of `batch` for every mode (SEMANTICS.md §backend.3):
    /// `cache_seqlens`, `cu_seqlens_q/k`, `max_seq_len_q`, the page tables
    /// (+ SWA table) from the live `req_to_token`, and `swa_out_cache_loc`;
    /// stores it as the current metadata and returns it. The CUDA executor
    /// builds the page tables on the device instead (the returned tables are
    /// empty, [`ForwardMetadata::tables_on_host`]). An empty / IDLE batch
    /// gives empty tensors and succeeds.
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
                !core.executor.tables_on_device(),
            )?;
            let core = &mut *core;
            core.executor.prepare_metadata(&m, &core.pools)?;
            core.errors.merge(&m.errors);
            m
        };
        Ok(self.metadata.insert(meta))
    }

    /// The full host metadata of `batch` against the live pools, page
    /// tables and SWA slots included, as the CPU executor builds it —
    /// whatever this backend's executor — without storing it or counting
    /// its events (inspection and tests; the CUDA executor's own host
    /// metadata leaves the tables to the device).
    ///
    /// # Errors
    /// As [`MhaBackend::init_forward_metadata`].
    pub fn reference_metadata(&self, batch: &ForwardBatch) -> Result<ForwardMetadata> {
        let core = self.core();
        metadata::build(
            batch,
            &core.pools,
            core.config.max_num_pages(),
            self.step_id,
            true,
        )
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
                        core.errors.swa_pool.merge(e);
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
            core.errors.kv_write.merge(e);
        }
        let (out, e) = core
            .executor
            .attention(plan, meta, core.config.page_size, q)?;
        core.errors.attention.merge(e);
        Ok(out)
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

    /// Decode context parallelism over NCCL (issue 17): from now on the
    /// decode-kernel passes (decode, draft decode, target verify, draft
    /// extend) run this GPU's rank `r = comm.rank()` of the group —
    /// the decode launch over the request pages `e ≡ r mod N` of the page
    /// table (global positions, no sinks) into a partial output and row
    /// LSE, an NCCL all-gather of every rank's state, the merge-states
    /// kernel with the sinks joined once — so every rank ends with the
    /// output of [`BackendConfig::decode_cp_ranks`]` = N` on one GPU, equal
    /// to the unsplit decode within the attention tolerance. Extend and
    /// mixed passes run unsplit. The backend's pools are whole on every
    /// rank (each rank writes every K/V row; the context kernel reads
    /// them): what the group divides is the decode passes' K/V reads.
    ///
    /// Every rank must run the same passes in the same order (each decode
    /// layer is a collective); a rank whose call fails leaves the others
    /// waiting in the all-gather until some thread calls
    /// [`DcpComm::abort`](paged_attention::nccl::DcpComm::abort) on their
    /// memberships (mha-replay aborts every rank when one fails); from then
    /// on this backend's decode passes and graph replays return
    /// [`BackendError::Kernel`] naming the reason. Step backends of a
    /// [`MultiStepDraftBackend`] share one executor, so one call serves
    /// them all; the target and draft backends of one rank may share
    /// `comm` (their collectives run on the one stream, in order).
    ///
    /// # Errors
    /// [`BackendError::Config`] naming `decode_cp_ranks` when it is not
    /// `comm.ranks()`; [`BackendError::Kernel`] on the CPU executor, after
    /// `init_cuda_graph_state` or engine memory, or for a communicator
    /// joined on another device or stream than this backend's GPU
    /// (`kernel_rt::Gpu::shared_on` of its ordinal).
    pub fn attach_decode_comm(&mut self, comm: Arc<paged_attention::nccl::DcpComm>) -> Result<()> {
        let mut core = self.core();
        if core.config.decode_cp_ranks != comm.ranks() {
            return Err(BackendError::Config {
                field: "decode_cp_ranks",
                detail: format!(
                    "{} ranks configured, the communicator's group has {}",
                    core.config.decode_cp_ranks,
                    comm.ranks()
                ),
            });
        }
        core.executor.attach_decode_comm(comm)
    }

    /// Sets how eager mixed passes (prefill chunks plus one-token decode
    /// rows) run their two attention launches ([`crate::MixedOverlap`]:
    /// concurrently on a side stream of the CUDA executor, or one after the
    /// other) and returns the previous setting; the default comes from
    /// [`crate::MIXED_OVERLAP_ENV`]. Outputs are bitwise the same either
    /// way. The CPU executor stays [`crate::MixedOverlap::Off`] (returned).
    /// Graph buckets and engine-memory passes always run on one stream.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] when the side stream cannot be created.
    pub fn set_mixed_overlap(&mut self, order: crate::MixedOverlap) -> Result<crate::MixedOverlap> {
        self.core().executor.set_mixed_overlap(order)
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
                metadata::build(
                    batch,
                    &core.pools,
                    core.config.max_num_pages(),
                    s.step_id,
                    !core.executor.tables_on_device(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        for (s, m) in self.steps.iter_mut().zip(metas) {
            s.metadata = Some(m);
        }
        Ok(())
    }
}
