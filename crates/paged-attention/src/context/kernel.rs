//! [`ContextKernel`]: the context-attention launcher (both kernels, the
//! entry choice by arch, dtype and head_dim, split KV, the persistent grid's
//! counters, experiment and trace entries).

use super::*;
use crate::context::sm90::CONTEXT_SM90_EXPERIMENT_SLACK;

mod decode_path;
pub(super) use decode_path::check_context_rows;
pub use decode_path::context_decode_path;

/// The context-attention launcher: every entry is resolved once, at
/// construction (dynamic shared memory limit raised); launches are
/// stream-ordered and graph-capturable (no host sync, allocation or copy).
#[derive(Debug)]
pub struct ContextKernel {
    /// Every loaded entry (compute_90, sm_90a and their variants), by name.
    kernel: Launcher,
    sm90: bool,
    sm_count: usize,
    max_ctas: Option<usize>,
    /// The persistent grid's two work counters (zeroed once; each launch
    /// leaves them zero), see [`ContextParams::work`].
    work: CudaSlice<u32>,
    /// Split-KV workspace ([`ContextParams::partial`]; sm_90a only, sized at
    /// construction for two D-128 chunks per SM, so launches never allocate).
    partial: Option<CudaSlice<f32>>,
    /// Forced KV chunks per item (tests, benches); `None`: the launcher's rule.
    kv_splits: Option<usize>,
    kv_load: ContextKvLoad,
    /// sm_90a epilogue: TMA stores of whole warpgroups' output rows where
    /// [`out_tma_layout`] allows (default), else stores by threads.
    o_tma: bool,
    /// sm_90a producer: TMA loads of each work item's Q rows where
    /// [`q_tma_layout`] allows (default), else cp.async copies.
    q_tma: bool,
    /// sm_90a two-CTA ("duo") entries: `None` the launcher's rule
    /// ([`context_sm90_duo_wanted`]), `Some(on)` forced where supported;
    /// from [`CONTEXT_DUO_ENV`] (default off).
    duo: Option<bool>,
    /// sm_90a gather: 32-bit address products where every offset fits
    /// (default `true`, [`ContextParams::narrow`]), else 64-bit ones.
    narrow: bool,
    variant: i32,
    experiment: u32,
    tma_launches: AtomicU64,
    o_tma_launches: AtomicU64,
    q_tma_launches: AtomicU64,
    duo_launches: AtomicU64,
    /// The decode / verify launcher for the head dims no context entry
    /// serves (512, [`context_decode_path`]): its ragged path with the
    /// `max_q_len` cap lifted.
    wide: PagedAttentionKernel,
}

/// The tensor map of a `[tokens, Hq, D]` view of the call (`q` or `out`:
/// element `strides` `[token, head]`, base `ptr`) with boxes of `rows`
/// packed rows ([`q_tma_layout`]), or `None` when the layout or the driver
/// does not allow one.
fn rows_map(
    args: &ContextArgs<'_>,
    p: &ContextParams,
    strides: [i64; 2],
    ptr: u64,
    rows: usize,
) -> Option<TensorMap> {
    let layout = q_tma_layout(
        strides,
        p.num_tokens as usize,
        p.num_q_heads as usize,
        p.group as usize,
        args.q.shape()[2],
        rows,
    )?;
    layout.encode(ptr, args.q_dtype == HalfDtype::F16).ok()
}

/// Upper bound of the keys one request of a launch attends to: its
/// page-table row (`max_num_pages · page_size`), or with a window the window
/// plus the tokens of one work item of `bm` packed rows.
fn kv_keys_bound(p: &ContextParams, bm: usize) -> usize {
    let keys = p.max_num_pages as usize * p.page_size as usize;
    if p.window_left >= 0 {
        let tokens = bm.div_ceil(p.group as usize);
        keys.min(p.window_left as usize + tokens + 1)
    } else {
        keys
    }
}

impl ContextKernel {
    /// Loads every context entry on `gpu`, the kernel picked by
    /// [`ContextPath::from_env`] (default [`ContextPath::Auto`]).
    ///
    /// # Errors
    /// As [`ContextKernel::with_path`]; [`KernelError::Unsupported`] for a bad
    /// [`CONTEXT_KERNEL_ENV`].
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Self::with_path(gpu, ContextPath::from_env()?)
    }

    /// Loads the compute_90 entries and, when `path` selects it, the sm_90a
    /// entries ([`ContextPath::Auto`] falls back to the compute_90 kernel
    /// when the driver cannot load the sm_90a module).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] for [`ContextPath::Wgmma`] on a device
    /// whose compute capability is not 9.0; [`KernelError::Load`] when a PTX
    /// module does not load; [`KernelError::Driver`].
    pub fn with_path(gpu: &Arc<Gpu>, path: ContextPath) -> Result<Self> {
        let cc = gpu.context().compute_capability()?;
        let mut sm90 = match path {
            ContextPath::Mma => false,
            ContextPath::Auto => cc == (9, 0),
            ContextPath::Wgmma if cc == (9, 0) => true,
            ContextPath::Wgmma => {
                return Err(KernelError::unsupported(
                    CONTEXT_KERNEL_ENV,
                    format!(
                    "the wgmma context kernel needs compute capability 9.0, the device has {}.{}",
                    cc.0, cc.1
                ),
                ))
            }
        };
        let mut kernel = Launcher::empty(gpu);
        for (q, kv, d) in context_variants() {
            let name = context_entry_name(q, kv, d);
            let attrs = EntryAttrs::smem_max_carveout(context_smem_bytes(d, kv));
            kernel.load(&CONTEXT_PTX, &name, attrs)?;
        }
        if sm90 {
            // Entries loaded before a failure stay loaded but are never
            // chosen: without `sm90` every plan names a compute_90 entry.
            let loaded: Result<()> = context_variants()
                .into_iter()
                .filter(|&(q, kv, d)| context_sm90_supported(q, kv, d))
                .try_for_each(|(q, kv, d)| {
                    let name = context_sm90_entry_name(q, kv, d);
                    let smem = context_sm90_smem_bytes(d, kv);
                    kernel.load(
                        &CONTEXT_SM90_PTX,
                        &name,
                        EntryAttrs::smem_max_carveout(smem),
                    )?;
                    // Its row-LSE variant, where it has one; a variant that
                    // does not load is never chosen (an LSE launch there is
                    // a typed error).
                    let mut optional = Vec::new();
                    if context_sm90_consumers(d, kv) != 3 {
                        optional.push((format!("{name}{CONTEXT_SM90_LSE_SUFFIX}"), smem));
                    }
                    if context_sm90_duo_supported(d, kv) {
                        // A duo entry that does not load is never chosen
                        // (the launch falls back to the one-CTA entry).
                        let duo = context_sm90_duo_entry_name(q, kv, d);
                        let smem = context_sm90_duo_smem_bytes(d);
                        optional.push((format!("{duo}{CONTEXT_SM90_LSE_SUFFIX}"), smem));
                        optional.push((duo, smem));
                    }
                    for (name, smem) in optional {
                        let attrs = EntryAttrs::smem_max_carveout(smem);
                        // A failure leaves the name unloaded (see above).
                        let _ = kernel.load(&CONTEXT_SM90_PTX, &name, attrs);
                    }
                    // Its split-KV merge (D 64 / 128: the head dims that split).
                    if d != 256 {
                        let name = context_sm90_merge_entry_name(q, kv, d);
                        kernel.load(&CONTEXT_SM90_PTX, &name, EntryAttrs::default())?;
                    }
                    Ok(())
                });
            match loaded {
                Ok(()) => {}
                // Auto on a 9.0 device whose driver cannot load the sm_90a
                // module (too old for PTX ISA 8.4): the compute_90 kernel
                // serves every call; an explicit Wgmma request is an error.
                Err(_) if path == ContextPath::Auto => sm90 = false,
                Err(e) => return Err(e),
            }
        }
        let sm_count = gpu
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as usize;
        let work = gpu.stream().alloc_zeros::<u32>(2)?;
        let partial = if sm90 {
            Some(
                // Two chunks per SM of the largest split item, D 128's
                // (rows x (D + 2) floats; D 64's 192 x 66 is smaller).
                gpu.stream().alloc_zeros::<f32>(
                    2 * sm_count * context_sm90_block_rows(128, KvDtype::Bf16) * (128 + 2),
                )?,
            )
        } else {
            None
        };
        Ok(Self {
            kernel,
            sm90,
            sm_count,
            work,
            partial,
            kv_splits: None,
            max_ctas: None,
            kv_load: ContextKvLoad::from_env()?,
            o_tma: true,
            q_tma: true,
            duo: context_duo_from_env()?,
            narrow: true,
            variant: context_trim_variant_from_env()?,
            experiment: 0,
            tma_launches: AtomicU64::new(0),
            o_tma_launches: AtomicU64::new(0),
            q_tma_launches: AtomicU64::new(0),
            duo_launches: AtomicU64::new(0),
            wide: PagedAttentionKernel::with_path(gpu, KernelPath::Auto)?,
        })
    }

    /// Sets how the sm_90a kernel loads K/V ([`ContextKvLoad`]; the default
    /// comes from [`CONTEXT_KV_LOAD_ENV`]). Same results, other timing.
    pub fn set_kv_load(&mut self, kv_load: ContextKvLoad) {
        self.kv_load = kv_load;
    }

    /// Caps the persistent grid of the sm_90a kernel (default: one CTA per
    /// SM) so that each CTA walks many work items: tests run the item loop
    /// with 1–8 CTAs. Same results.
    pub fn set_max_ctas(&mut self, ctas: Option<usize>) {
        self.max_ctas = ctas;
    }

    /// Forces the sm_90a kernel's KV chunks per work item (`Some(1)`: no
    /// split; more chunks than the workspace holds are capped), `None`: the
    /// launcher's rule ([`context_sm90_kv_splits`]). D 64 and 128 only.
    /// Same results within the attention tolerance (the merge reorders the
    /// f32 sums).
    pub fn set_kv_splits(&mut self, splits: Option<usize>) {
        self.kv_splits = splits;
    }

    /// sm_90a launches so far whose K/V loads ran as TMA boxes.
    pub fn tma_launches(&self) -> u64 {
        self.tma_launches.load(Ordering::Relaxed)
    }

    /// Sets whether the sm_90a kernel writes output rows with TMA stores
    /// (default `true`; used where [`out_tma_layout`] gives a layout) or
    /// with stores by threads. Same results, other timing.
    pub fn set_o_tma(&mut self, on: bool) {
        self.o_tma = on;
    }

    /// sm_90a launches so far whose output rows went out as TMA stores.
    pub fn o_tma_launches(&self) -> u64 {
        self.o_tma_launches.load(Ordering::Relaxed)
    }

    /// Sets whether the sm_90a kernel loads each work item's Q rows with
    /// TMA (default `true`; used for 16-bit K/V where [`q_tma_layout`]
    /// gives a layout) or with the producer's cp.async copies. Same
    /// results, other timing.
    pub fn set_q_tma(&mut self, on: bool) {
        self.q_tma = on;
    }

    /// Sets whether the sm_90a gather forms K / V row addresses from
    /// 32-bit products where
    /// [`context_sm90_cursor_fits`] holds (default `true`) or always from
    /// 64-bit ones (the path of launches whose offsets do not fit; tests
    /// compare the two). Same results, other timing.
    pub fn set_narrow(&mut self, on: bool) {
        self.narrow = on;
    }

    /// sm_90a launches so far whose Q rows loaded as TMA boxes.
    pub fn q_tma_launches(&self) -> u64 {
        self.q_tma_launches.load(Ordering::Relaxed)
    }

    /// Sets whether sm_90a launches run the two-CTA ("duo") entries where
    /// [`context_sm90_duo_supported`] (16-bit KV, D 64 / 128; not for
    /// timing experiments): `None` by the launcher's rule
    /// ([`context_sm90_duo_wanted`]), `Some(true)` always, `Some(false)`
    /// never; the default comes from [`CONTEXT_DUO_ENV`] (unset: off). Same
    /// results within the attention tolerance, other timing.
    pub fn set_duo(&mut self, duo: Option<bool>) {
        self.duo = duo;
    }

    /// sm_90a launches so far that ran a duo entry.
    pub fn duo_launches(&self) -> u64 {
        self.duo_launches.load(Ordering::Relaxed)
    }

    /// The tensor map of the output view for the sm_90a kernel's TMA
    /// stores, or `None` (stores by threads) when they are off, the entry
    /// has none (three consumers), the layout does not allow them or the
    /// driver refuses the map.
    fn out_map(&self, args: &ContextArgs<'_>, p: &ContextParams, duo: bool) -> Option<TensorMap> {
        let d = args.q.shape()[2];
        // Three serial consumers (D 64 16-bit, not duo) store by threads
        // (the entries have no TMA store: it made ptxas spill there).
        if !self.o_tma || (!duo && context_sm90_consumers(d, args.kv.dtype()) == 3) {
            return None;
        }
        rows_map(args, p, [p.o_stride_tok, p.o_stride_head], p.out, 64)
    }

    /// The tensor map of the query view for the sm_90a producer's TMA loads
    /// of Q, or `None` (cp.async copies) when they are off, the layout does
    /// not allow them or the driver refuses the map.
    fn q_map(&self, args: &ContextArgs<'_>, p: &ContextParams, duo: bool) -> Option<TensorMap> {
        let kv = args.kv.dtype();
        if !self.q_tma {
            return None;
        }
        let rows = if duo {
            CONTEXT_SM90_DUO_ROWS
        } else {
            context_sm90_block_rows(args.q.shape()[2], kv)
        };
        rows_map(args, p, [p.q_stride_tok, p.q_stride_head], p.q, rows)
    }

    /// The K and V tensor maps of a launch and the params that select the
    /// TMA loads, or `None` (the gather runs) when the page size, a view or
    /// the driver does not allow them.
    fn kv_maps(
        &self,
        args: &ContextArgs<'_>,
        p: &ContextParams,
    ) -> Option<(i32, i32, [TensorMap; 2])> {
        if self.kv_load != ContextKvLoad::Tma || args.kv.dtype() == KvDtype::E4m3 {
            return None;
        }
        let d = args.q.shape()[2];
        let rows = context_sm90_tma_rows(p.page_size as usize, d)?;
        let n = |x: i32| x as usize;
        let layout = |st: [i64; 3]| {
            kv_tma_layout(
                st,
                n(p.num_pages),
                n(p.num_kv_heads),
                n(p.page_size),
                d,
                rows,
            )
        };
        let (lk, ck) = layout([p.k_stride_page, p.k_stride_head, p.k_stride_tok])?;
        let (lv, cv) = layout([p.v_stride_page, p.v_stride_head, p.v_stride_tok])?;
        if ck != cv {
            return None;
        }
        let f16 = args.q_dtype == HalfDtype::F16;
        let mk = lk.encode(p.k_cache, f16).ok()?;
        let mv = lv.encode(p.v_cache, f16).ok()?;
        Some((rows as i32, ck, [mk, mv]))
    }

    /// Sets the sm_90a kernel's schedule variant ([`ContextParams::variant`]:
    /// 0 persistent (default), 1 ping-pong, 2 one CTA per work item, 4 the
    /// last KV tile of every item run whole instead of trimmed to the keys
    /// its rows can see; bits combine; benchmarks compare variants in one
    /// run). Same results, other timing.
    pub fn set_variant(&mut self, variant: i32) {
        self.variant = variant;
    }

    /// Runs the sm_90a kernel's timing experiment `xv` (an entry
    /// `…_bf16_kv_bf16_d128_x{xv}` that leaves stages out, bits 1 softmax
    /// math, 2 wgmma, 4 global K/V reads; built: 4 (1, 5, 6 and 96 were
    /// dropped in session 26 for room in the tree); with correct
    /// results: 512 = no V scan of masked tiles (correct on finite V);
    /// without: 1024 / 1536 = no epilogue stores (and no V scan)) for D 128
    /// bf16 launches; 0 = off (64, 72, 128, 4096 and 16384, measured and
    /// concluded, were dropped in session 28 for room, 2048, two CTAs of a
    /// cluster sharing each K/V tile, in session 41, and 16 (K / V ring
    /// depths 3 / 2), 32 (O rescaled under S) and 40 (32 traced) in session
    /// 44; PERF.md sessions 7, 14, 23, 24, 26, 40, 41, 44). The experiment
    /// entries build only the gather's 32-bit address products, so a
    /// launch where [`context_sm90_cursor_fits`] fails is refused with
    /// [`KernelError::Unsupported`] (32768, the page cursor and those
    /// products, became the default in session 27: see
    /// [`ContextParams::narrow`]). Results of 4 are wrong by
    /// design: benchmarks only. `xv = 8` is the trace entry: correct
    /// results, and each CTA below [`CONTEXT_SM90_TRACE_CTAS`] records
    /// `%clock` stamps of its items' phases (read them with
    /// [`ContextKernel::trace`]).
    ///
    /// # Errors
    /// [`KernelError::Load`] when the entry does not exist.
    pub fn set_experiment(&mut self, xv: u32) -> Result<()> {
        if xv != 0 {
            // Every experiment entry is D 128 bf16 (the D 64 one was dropped
            // in session 28).
            let d = 128;
            let bf16 = context_sm90_entry_name(HalfDtype::Bf16, KvDtype::Bf16, d);
            let name = format!("{bf16}_x{xv}");
            let smem = context_sm90_smem_bytes(d, KvDtype::Bf16) + CONTEXT_SM90_EXPERIMENT_SLACK;
            let attrs = EntryAttrs::smem_max_carveout(smem);
            self.kernel.load(&CONTEXT_SM90_PTX, &name, attrs)?;
        }
        self.experiment = xv;
        Ok(())
    }

    /// The stamps of the last trace launch (`set_experiment(8)`, no split
    /// KV), u32 `[CONTEXT_SM90_TRACE_CTAS][CONTEXT_SM90_TRACE_ITEMS][3 roles:
    /// producer, consumer 0, consumer 1][CONTEXT_SM90_TRACE_EVENTS]` in SM
    /// clock cycles (events: `TR_*` in the kernel source); slots of items a
    /// CTA did not take hold what the workspace held before. Synchronizes
    /// the stream.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] without the sm_90a kernel; driver errors.
    pub fn trace(&self) -> Result<Vec<u32>> {
        let ws = self
            .partial
            .as_ref()
            .ok_or_else(|| KernelError::unsupported("trace", "needs the sm_90a kernel"))?;
        let n = CONTEXT_SM90_TRACE_CTAS * CONTEXT_SM90_TRACE_ITEMS * 3 * CONTEXT_SM90_TRACE_EVENTS;
        let words: Vec<f32> = self.kernel.gpu().stream().clone_dtoh(&ws.slice(0..n))?;
        Ok(words.into_iter().map(f32::to_bits).collect())
    }

    /// Whether launches run the sm_90a kernel (every supported dtype).
    pub fn uses_sm90(&self) -> bool {
        self.sm90
    }

    /// Kernel launches issued so far (the head-dim-512 path's decode-kernel
    /// launches included).
    pub fn launches(&self) -> u64 {
        self.kernel.launches() + self.wide.launches()
    }

    /// Computes `out` (rows of processed requests only; other rows untouched);
    /// `bs = 0` launches nothing. One launch (head dim 512: one per block of
    /// `⌊65535 / Hkv⌋` row tiles of 16 packed rows). Bad device data is counted in
    /// `errors` ([`crate::ErrorFlags`]), never read through. Asynchronous.
    ///
    /// # Errors
    /// As [`validate_context`]; [`KernelError::Stride`] for misaligned base
    /// pointers; [`KernelError::Driver`] when the launch fails.
    pub fn launch(&self, args: &mut ContextArgs<'_>, errors: &mut DeviceErrors) -> Result<()> {
        self.launch_on(self.kernel.gpu().stream(), args, errors)
    }

    /// [`ContextKernel::launch`] on `stream` instead of the GPU's own stream
    /// (e.g. an engine's stream from [`Gpu::borrowed_stream`]), in that
    /// stream's order and CUDA-graph capture. The launcher's own work
    /// counters and split workspace (zeroed on [`Gpu::stream`] at
    /// construction: synchronise that stream once before the first
    /// `launch_on`) are shared by all its launches, so launches on several
    /// streams must not overlap in time.
    ///
    /// # Errors
    /// As [`ContextKernel::launch`]; [`KernelError::Unsupported`] when the
    /// stream belongs to another context.
    pub fn launch_on(
        &self,
        stream: &CudaStream,
        args: &mut ContextArgs<'_>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.kernel.gpu().require_stream(stream)?;
        if context_decode_path(args.q_dtype, args.kv.dtype(), args.q.shape()[2]) {
            return self.launch_decode_path(stream, args, errors);
        }
        let plan = validate_context_for(args, self.sm90)?;
        let mut p = plan.params;
        p.variant = self.variant;
        if p.bs == 0 {
            return Ok(());
        }
        [p.q, p.out, p.k_cache, p.v_cache] = base_ptrs(stream, &args.q, &mut args.out, &args.kv)?;
        p.page_table = args.page_table.device_ptr(stream);
        p.cache_seqlens = args.cache_seqlens.device_ptr(stream);
        p.cu_seqlens_q = args.cu_seqlens_q.device_ptr(stream);
        if let Some(s) = &args.sinks {
            p.sinks = s.device_ptr(stream);
        }
        if let Some(l) = &mut args.lse {
            p.lse = l.device_ptr_mut(stream);
        }
        p.errors = errors.device_ptr();
        p.work = {
            let (ptr, _sync) = self.work.device_ptr(stream);
            ptr
        };
        let d = args.q.shape()[2];
        let kv_dtype = args.kv.dtype();
        // The two-CTA entries: 16-bit KV at D 64 / 128, the gather (not TMA
        // boxes), no timing experiment; by the launcher's rule unless forced.
        // A launch that asks for the row LSE where the entry has three
        // consumers (D 64 16-bit: no LSE code, it spilled there) always
        // runs the duo entry.
        let lse_needs_duo =
            plan.sm90 && args.lse.is_some() && context_sm90_consumers(d, kv_dtype) == 3;
        let duo_entry = (plan.sm90
            && context_sm90_duo_supported(d, kv_dtype)
            && (lse_needs_duo
                || (self.experiment == 0
                    && self.kv_load != ContextKvLoad::Tma
                    && self.duo.unwrap_or_else(|| {
                        let bm = context_sm90_block_rows(d, kv_dtype);
                        let keys = kv_keys_bound(&p, bm).min(args.max_kv_len.unwrap_or(usize::MAX));
                        context_sm90_duo_wanted(d, kv_dtype, keys)
                    }))))
        .then(|| context_sm90_duo_entry_name(args.q_dtype, kv_dtype, d))
        .filter(|name| self.kernel.contains(name));
        let duo = duo_entry.is_some();
        if lse_needs_duo && !duo {
            return Err(KernelError::unsupported(
                "lse",
                format!(
                    "D {d} 16-bit KV: the row LSE needs the sm_90a duo entry, which did not load"
                ),
            ));
        }
        let mut config = plan.config;
        // The row LSE on sm_90a: the `_lse` variant of the chosen entry (no
        // timing experiment then).
        let lse = plan.sm90 && args.lse.is_some();
        let mut experiment = false;
        let mut entry: String = if let Some(name) = duo_entry {
            let (q_tiles, cfg) = context_sm90_duo_launch_config(
                p.bs as usize,
                p.num_kv_heads as usize,
                p.group as usize,
                args.max_q_len,
                d,
            )?;
            p.q_tiles = to_i32("max_q_len", q_tiles)?;
            config = cfg;
            name
        } else if lse || self.experiment == 0 {
            plan.entry
        } else {
            let x = format!("{}_x{}", plan.entry, self.experiment);
            experiment = self.kernel.contains(&x);
            if experiment {
                x
            } else {
                plan.entry
            }
        };
        if lse {
            entry.push_str(CONTEXT_SM90_LSE_SUFFIX);
        }
        let func = self
            .kernel
            .index(&entry)
            .ok_or_else(|| KernelError::unsupported("q", format!("no kernel {entry}")))?;
        // The gather's 32-bit address products, where every offset fits;
        // the experiment entries have no other form.
        p.narrow = i32::from(self.narrow && context_sm90_cursor_fits(&p));
        if experiment && p.narrow == 0 {
            return Err(KernelError::unsupported(
                "experiment",
                format!("{entry}: a K / V stride or in-page offset beyond i32"),
            ));
        }
        let mut maps = [TensorMap::default(); 2];
        if plan.sm90 && !duo {
            if let Some((rows, code, m)) = self.kv_maps(args, &p) {
                (p.tma_rows, p.tma_dims, maps) = (rows, code, m);
            }
        }
        if experiment {
            // An experiment entry (its ring split may take a few more bytes).
            config.shared_mem_bytes += CONTEXT_SM90_EXPERIMENT_SLACK as u32;
        }
        if self.experiment & 8 != 0 {
            // The trace entry's stamps (overwritten below when KV is split).
            if let Some(ws) = &self.partial {
                let (ptr, _sync) = ws.device_ptr(stream);
                p.partial = ptr;
            }
        }
        let items = config.grid_dim.0;
        if let (true, false, true, Some(ws)) = (plan.sm90, duo, d != 256, &self.partial) {
            // Split KV when the items do not fill the GPU: the keys of a
            // request are bounded by its page-table row (and the window).
            let bn = context_sm90_tile_keys(d);
            let bm = context_sm90_block_rows(d, kv_dtype);
            let capacity = ws.len() / (bm * (d + 2));
            let tiles = kv_keys_bound(&p, bm).div_ceil(bn) + 1;
            let n = items as usize;
            let (splits, split_tiles) = match self.kv_splits {
                Some(f) => kv_chunks(tiles, f.min(capacity / n.max(1)).max(1)),
                None => context_sm90_kv_splits(n, tiles, self.sm_count, capacity),
            };
            if splits > 1 {
                p.kv_splits = splits as i32;
                p.split_tiles = split_tiles as i32;
                let (ptr, _sync) = ws.device_ptr(stream);
                p.partial = ptr;
                config.grid_dim.0 = items * splits as u32;
            }
        }
        let mut q_map = TensorMap::default();
        if plan.sm90 {
            if let Some(m) = self.q_map(args, &p, duo) {
                (p.q_tma, q_map) = (1, m);
            }
        }
        // The output map only where the epilogue writes `out` itself (split
        // KV writes partial rows; the merge entry writes `out`).
        let mut o_map = TensorMap::default();
        if plan.sm90 && p.kv_splits == 1 {
            if let Some(m) = self.out_map(args, &p, duo) {
                (p.o_tma, o_map) = (1, m);
            }
        }
        if plan.sm90 {
            // The persistent grid: one CTA per SM, two for the duo entries.
            let per_sm = if duo { 2 } else { 1 };
            let ctas = self
                .max_ctas
                .unwrap_or(self.sm_count * per_sm)
                .min(self.sm_count * per_sm);
            config.grid_dim.0 = context_sm90_grid(config.grid_dim.0, d, kv_dtype, p.variant, ctas);
        }
        let sm90_args: [&dyn KernelArg; 5] = [&p, &maps[0], &maps[1], &o_map, &q_map];
        let params: &[&dyn KernelArg] = if plan.sm90 {
            &sm90_args
        } else {
            &sm90_args[..1]
        };
        // SAFETY: `validate_context` checked every shape and stride against the
        // buffers (Strided/StridedMut constructors), dtypes, head dim, group and
        // grid; base alignment is checked above; device data (page ids,
        // lengths, cu_seqlens_q) is range-checked in the kernel; the params
        // layout is pinned by a CPU test. The tensor maps span exactly the
        // validated K/V views (TMA zero-fills boxes outside them) and the
        // validated output view (a store box is clipped to it; the kernel
        // stores only boxes of rows it owns), and the validated query view
        // (Q boxes are read-only and zero-filled past it); `work` is
        // this launcher's own 2-word buffer, used by its launches in stream
        // order only.
        unsafe { self.kernel.launch_with(stream, func, config, params, false) }?;
        if p.tma_rows > 0 {
            self.tma_launches.fetch_add(1, Ordering::Relaxed);
        }
        if p.o_tma != 0 {
            self.o_tma_launches.fetch_add(1, Ordering::Relaxed);
        }
        if p.q_tma != 0 {
            self.q_tma_launches.fetch_add(1, Ordering::Relaxed);
        }
        if duo {
            self.duo_launches.fetch_add(1, Ordering::Relaxed);
        }
        if p.kv_splits > 1 {
            let name = context_sm90_merge_entry_name(args.q_dtype, args.kv.dtype(), d);
            let merge = self
                .kernel
                .index(&name)
                .ok_or_else(|| KernelError::unsupported("q", format!("no kernel {name}")))?;
            let cfg = LaunchConfig {
                grid_dim: (items, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the same validated params as the launch above, which
            // wrote the partial rows the merge reads (stream order); the
            // workspace holds `items · kv_splits` chunks (capacity checked
            // when the split was chosen); rows are written only where the
            // main kernel would write them.
            unsafe { self.kernel.launch(stream, merge, cfg, &p) }?;
        }
        Ok(())
    }
}
