//! `MhaBackend` (backend.md §1–§3, §7) and `MultiStepDraftBackend` (§8).

use std::sync::{Arc, Mutex, MutexGuard};

use kernel_rt::ErrorReport;

use crate::batch::ForwardBatch;
use crate::config::BackendConfig;
use crate::error::{batch_err, BackendError, Result};
use crate::executor::{
    CpuExecutor, Device, Executor, ExecutorKind, KvSnapshot, LayerPlan, Tensor, TensorRef,
};
use crate::metadata::{self, ForwardMetadata};
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

fn merge(into: &mut ErrorReport, e: ErrorReport) {
    into.count = into.count.saturating_add(e.count);
    into.flags |= e.flags;
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
        let executor: Box<dyn Executor> = match device {
            // Documented: Auto is the CPU executor until the CUDA executor exists.
            Device::Auto | Device::Cpu => Box::new(CpuExecutor::new(
                config.model_dtype,
                config.kv_dtype,
                &plans,
            )),
            Device::Cuda(ordinal) => return Err(BackendError::CudaNotImplemented { ordinal }),
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
}

impl MhaBackend {
    /// Builds the backend (backend.md §1) on the executor chosen by `device`.
    ///
    /// # Errors
    /// [`BackendError::TopkUnsupported`], [`BackendError::Config`] for an
    /// invalid config; [`BackendError::CudaNotImplemented`] for `Device::Cuda`.
    pub fn new(config: BackendConfig, device: Device) -> Result<Self> {
        Ok(Self {
            core: Arc::new(Mutex::new(Core::new(config, device)?)),
            step_id: 0,
            metadata: None,
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

    /// Workspace bytes (backend.md §6); the CPU executor allocates none.
    pub fn workspace_bytes(&self) -> usize {
        self.core().workspace_bytes
    }

    /// `M = ceil(context_len / P)`.
    pub fn max_num_pages(&self) -> usize {
        self.core().config.max_num_pages()
    }

    /// Device-error events accumulated by metadata builds, KV writes and
    /// attention (out-of-range slots / pages skipped and counted).
    pub fn device_errors(&self) -> ErrorReport {
        self.core().errors
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

    /// Builds the eager metadata of `batch` for every mode (backend.md §3):
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
            merge(&mut core.errors, m.errors);
            m
        };
        Ok(self.metadata.insert(meta))
    }

    /// One attention layer of the pass (backend.md §7):
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
            let loc: &[i64] = if plan.is_swa {
                match (&meta.swa_out_cache_loc, core.pools.swa_mapping()) {
                    (Some(s), _) if meta.source_out_cache_loc == batch.out_cache_loc => s,
                    (_, Some(m)) => {
                        // The batch's write slots changed since the metadata
                        // (per-step draft slots): translate from the live map.
                        let mut out = vec![0i64; batch.out_cache_loc.len()];
                        let e = swa_pool::reference::translate_locs(
                            m.map(),
                            &batch.out_cache_loc,
                            &mut out,
                        );
                        merge(&mut core.errors, e);
                        translated = out;
                        &translated
                    }
                    _ => &batch.out_cache_loc,
                }
            } else {
                &batch.out_cache_loc
            };
            let e = core.executor.write_kv(plan, loc, k, v)?;
            merge(&mut core.errors, e);
        }
        let (out, e) = core
            .executor
            .attention(plan, meta, core.config.page_size, q)?;
        merge(&mut core.errors, e);
        Ok(out)
    }
}

/// The multi-step draft backend (backend.md §8): `S − 1` step backends with
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

    /// Runs §3 for every step on the same draft-decode batch (mode
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
