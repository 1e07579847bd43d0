//! The GPU path: the kernel crates' launchers on the engine's tensors
//! (wrapped as [`ExternalBuffer`]s, never copied or freed) and on the
//! engine's stream (torch's current stream, [`Gpu::borrowed_stream`]).
//!
//! One [`Device`] per CUDA ordinal, opened on the first call that touches
//! it: the device's primary context (torch's), one error word per kernel
//! family. Each family's launcher (and so its module) loads on the family's
//! first call; the launchers that allocate at construction (the context
//! kernel's work counters, the error words) are zeroed on mha-kit's own
//! stream, which is synchronised once before the first launch on the
//! engine's stream. A first call while the stream captures a CUDA graph is
//! refused (warm up first, or call `mha_kit.init`). After that, calls only
//! launch: no allocation, no copy, no synchronisation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use fp8_kv::KvWriteKernel;
use graph_metadata::{GraphMetadataArgs, GraphMetadataKernel, SwaArgs, SwaWriteLocs};
use kernel_rt::cudarc::driver::CudaStream;
use kernel_rt::{DeviceErrors, ErrorReport, ExternalBuffer, Gpu, Strided, StridedMut};
use page_table::{PageTableArgs, PageTableKernel, SwaTables};
use paged_attention::{
    chunk_full_launch, ContextArgs, ContextKernel, DecodeArgs, KvCache, MergeStatesArgs,
    MergeStatesKernel, PagedAttentionKernel, QueryLayout, SplitMode,
};

use crate::attn::{AttnCall, Layout};
use crate::desc::Tensor;
use crate::error::{from_kernel, ArgError, CallError, CallResult};
use crate::merge::MergeCall;
use crate::meta::{GraphCall, KvWriteCall, PageTableCall};
use crate::paged_write::SetKvCall;

/// Kernel families, each with its own error word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `trtllm_batch_decode_with_kv_cache` / `trtllm_batch_context_with_kv_cache`.
    Attention = 0,
    /// `build_trtllm_mha_page_table`.
    PageTable = 1,
    /// `update_trtllm_mha_graph_metadata`.
    GraphMetadata = 2,
    /// `fused_fp8_set_kv_buffer`.
    KvWrite = 3,
}

mod order;
pub use order::{may_read_unit_order, write_unit_order};

/// Family names, in [`Family`] order (the keys of `mha_kit.device_errors`).
pub const FAMILIES: [&str; 4] = ["attention", "page_table", "graph_metadata", "kv_write"];

/// f32 elements at the end of the decode workspace that hold the split
/// counters (256 KiB): every launch leaves them zero, nothing else is
/// written there (see [`decode`]).
pub const COUNTER_ELEMS: usize = 1 << 16;

/// Decode splits of launches that fill the GPU with fewer than
/// `paged_attention::unsplit_items_per_sm(kv)` work items an SM
/// (`chunk_full_launch`; mha-backend's default).
const CHUNKED: SplitMode = SplitMode::Chunked {
    chunk_tokens: 2048,
    max_splits: 4,
};

#[derive(Default)]
struct Launchers {
    decode: Option<Arc<PagedAttentionKernel>>,
    context: Option<Arc<ContextKernel>>,
    page_table: Option<Arc<PageTableKernel>>,
    graph: Option<Arc<GraphMetadataKernel>>,
    kv: Option<Arc<KvWriteKernel>>,
    merge: Option<Arc<MergeStatesKernel>>,
}

/// One CUDA device as the package uses it.
pub struct Device {
    gpu: Arc<Gpu>,
    launchers: Mutex<Launchers>,
    errors: Mutex<Vec<DeviceErrors>>,
    streams: Mutex<HashMap<u64, Arc<CudaStream>>>,
}

fn dev_err(e: kernel_rt::KernelError) -> CallError {
    from_kernel(e, &[], &[])
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The device `ordinal`, opened once.
///
/// # Errors
/// [`CallError::Device`] when there is no GPU or the driver fails.
pub fn device(ordinal: usize) -> CallResult<Arc<Device>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();
    let mut map = lock(DEVICES.get_or_init(Default::default));
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let gpu = Gpu::new(ordinal).map_err(dev_err)?;
    let errors = (0..FAMILIES.len())
        .map(|_| DeviceErrors::new(&gpu))
        .collect::<Result<Vec<_>, _>>()
        .map_err(dev_err)?;
    gpu.synchronize().map_err(dev_err)?;
    let d = Arc::new(Device {
        gpu,
        launchers: Mutex::new(Launchers::default()),
        errors: Mutex::new(errors),
        streams: Mutex::new(HashMap::new()),
    });
    map.insert(ordinal, d.clone());
    Ok(d)
}

impl Device {
    /// The engine's stream `handle` (0 = legacy default stream), wrapped once.
    fn stream(&self, handle: u64) -> CallResult<Arc<CudaStream>> {
        let mut s = lock(&self.streams);
        if let Some(st) = s.get(&handle) {
            return Ok(st.clone());
        }
        if s.len() > 64 {
            s.clear();
        }
        // SAFETY: the handle is torch's current stream of this device (the
        // Python layer passes `torch.cuda.current_stream(device).cuda_stream`),
        // alive for the process (torch never destroys its pool streams;
        // user streams outlive the calls issued on them).
        let st = unsafe { self.gpu.borrowed_stream(handle) }.map_err(|e| match e {
            kernel_rt::KernelError::Unsupported { .. } => {
                CallError::Arg(ArgError::new("stream", e.to_string()))
            }
            e => dev_err(e),
        })?;
        s.insert(handle, st.clone());
        Ok(st)
    }

    /// The launcher of one family, constructed (module loaded) on first use.
    fn launcher<K>(
        &self,
        stream: &CudaStream,
        slot: impl Fn(&mut Launchers) -> &mut Option<Arc<K>>,
        make: impl FnOnce(&Arc<Gpu>) -> kernel_rt::Result<K>,
    ) -> CallResult<Arc<K>> {
        let mut l = lock(&self.launchers);
        if let Some(k) = slot(&mut l) {
            return Ok(k.clone());
        }
        if self.gpu.is_capturing(stream).map_err(dev_err)? {
            return Err(CallError::Device(
                "mha_kit: the first call of a kernel family ran during CUDA-graph capture; \
                 call it once eagerly first (torch's usual warm-up) or mha_kit.init(device)"
                    .into(),
            ));
        }
        let k = Arc::new(make(&self.gpu).map_err(dev_err)?);
        // Whatever the constructor zeroed on mha-kit's stream is ready
        // before any launch on the engine's stream.
        self.gpu.synchronize().map_err(dev_err)?;
        *slot(&mut l) = Some(k.clone());
        Ok(k)
    }

    /// Loads every family's launcher (all modules) now.
    ///
    /// # Errors
    /// [`CallError::Device`] when a module does not load.
    pub fn init_all(&self, handle: u64) -> CallResult<()> {
        let s = self.stream(handle)?;
        self.launcher(&s, |l| &mut l.decode, PagedAttentionKernel::new)?;
        self.launcher(&s, |l| &mut l.context, ContextKernel::new)?;
        self.launcher(&s, |l| &mut l.page_table, PageTableKernel::new)?;
        self.launcher(&s, |l| &mut l.graph, GraphMetadataKernel::new)?;
        self.launcher(&s, |l| &mut l.kv, KvWriteKernel::new)?;
        self.launcher(&s, |l| &mut l.merge, MergeStatesKernel::new)?;
        Ok(())
    }

    /// Reads (and with `reset` zeroes) every family's error word. Synchronises
    /// the device: off the hot path.
    ///
    /// # Errors
    /// [`CallError::Device`] when the driver fails (or a kernel faulted).
    pub fn read_errors(&self, reset: bool) -> CallResult<Vec<ErrorReport>> {
        self.gpu
            .context()
            .synchronize()
            .map_err(|e| dev_err(e.into()))?;
        let mut words = lock(&self.errors);
        let mut out = Vec::with_capacity(words.len());
        for w in words.iter_mut() {
            out.push(w.read().map_err(dev_err)?);
            if reset {
                w.reset().map_err(dev_err)?;
            }
        }
        if reset {
            self.gpu.synchronize().map_err(dev_err)?;
        }
        Ok(out)
    }

    /// The module source of each loaded family module (`cubin sm_90`, `ptx`).
    pub fn module_sources(&self) -> Vec<(String, String)> {
        [
            paged_attention::PTX.name,
            paged_attention::CONTEXT_PTX.name,
            paged_attention::CONTEXT_SM90_PTX.name,
            page_table::PTX.name,
            graph_metadata::PTX.name,
            fp8_kv::PTX.name,
            paged_attention::MERGE_PTX.name,
        ]
        .into_iter()
        .filter_map(|m| {
            self.gpu.module_source(m).map(|s| {
                let src = match s {
                    kernel_rt::ModuleSource::Cubin(a) => format!("cubin {}", a.name()),
                    kernel_rt::ModuleSource::Ptx => "ptx".to_string(),
                };
                (m.to_string(), src)
            })
        })
        .collect()
    }
}

/// A device buffer for each tensor of a call (views are cut from them).
struct Buf<T>(ExternalBuffer<T>);

impl<T> Buf<T> {
    fn new(t: &Tensor, stream: &Arc<CudaStream>) -> CallResult<Self> {
        debug_assert_eq!(std::mem::size_of::<T>(), t.dtype.size());
        let span = t.span()?;
        // SAFETY: the Python layer describes a live CUDA tensor of this
        // device (checked: `device` matches) whose storage spans its
        // shape and strides, as torch guarantees; torch keeps it alive for
        // the call and its caching allocator keeps the memory valid until
        // the work queued on the stream is done (stream-ordered reuse).
        unsafe { ExternalBuffer::new(t.arg, stream, t.ptr, span) }
            .map(Self)
            .map_err(|e| from_kernel(e, &[], &[t]))
    }

    /// [`Buf::new`] of an optional tensor.
    fn opt(t: Option<&Tensor>, stream: &Arc<CudaStream>) -> CallResult<Option<Self>> {
        t.map(|t| Self::new(t, stream)).transpose()
    }

    fn view<const N: usize>(&self, t: &Tensor) -> CallResult<Strided<'_, T, N>> {
        Strided::new(t.arg, self.0.view(), t.dims::<N>(), t.stride_dims::<N>())
            .map_err(|e| from_kernel(e, &[], &[t]))
    }

    fn view_mut<const N: usize>(&mut self, t: &Tensor) -> CallResult<StridedMut<'_, T, N>> {
        StridedMut::new(
            t.arg,
            self.0.view_mut(),
            t.dims::<N>(),
            t.stride_dims::<N>(),
        )
        .map_err(|e| from_kernel(e, &[], &[t]))
    }
}

fn check_device(tensors: &[&Tensor], ordinal: usize) -> CallResult<()> {
    for t in tensors {
        if t.device != crate::desc::Device::Cuda(ordinal) {
            return Err(t.err(format!("must be on cuda:{ordinal}")).into());
        }
    }
    Ok(())
}

/// The device checks of an attention call; an e4m3 query on the GPU must
/// have been converted by the Python layer (torch's exact cast into the
/// workspace), so one that reaches here is refused.
fn check_attn(c: &AttnCall, ordinal: usize) -> CallResult<()> {
    check_device(&attn_tensors(c), ordinal)?;
    if c.q_fp8 {
        return Err(c
            .q
            .err(
                "a float8_e4m3fn query on the GPU must be a torch tensor (the package casts it \
                 into the output dtype first)",
            )
            .into());
    }
    Ok(())
}

/// Every tensor of an attention call (for the device checks).
pub(crate) fn attn_tensors(c: &AttnCall) -> Vec<&Tensor> {
    let mut v = vec![
        &c.q,
        &c.out,
        &c.k,
        &c.v,
        &c.page_table,
        &c.seq_lens,
        &c.workspace,
    ];
    v.extend(
        c.cu_q
            .iter()
            .chain(&c.cu_k)
            .chain(&c.sinks)
            .chain(&c.lse)
            .chain(&c.unit_order),
    );
    v
}

/// K/V buffers of either dtype.
enum KvBufs {
    Half(Buf<u16>, Buf<u16>),
    E4m3(Buf<u8>, Buf<u8>),
}

impl KvBufs {
    fn new(c: &AttnCall, s: &Arc<CudaStream>) -> CallResult<Self> {
        Ok(match c.kv_dtype {
            paged_attention::KvDtype::E4m3 => Self::E4m3(Buf::new(&c.k, s)?, Buf::new(&c.v, s)?),
            _ => Self::Half(Buf::new(&c.k, s)?, Buf::new(&c.v, s)?),
        })
    }

    fn cache(&self, c: &AttnCall) -> CallResult<KvCache<'_>> {
        Ok(match self {
            Self::Half(k, v) => KvCache::Half {
                dtype: match c.kv_dtype {
                    paged_attention::KvDtype::F16 => paged_attention::HalfDtype::F16,
                    _ => paged_attention::HalfDtype::Bf16,
                },
                k: k.view(&c.k)?,
                v: v.view(&c.v)?,
            },
            Self::E4m3(k, v) => KvCache::E4m3 {
                k: k.view(&c.k)?,
                v: v.view(&c.v)?,
            },
        })
    }
}

/// Decode / verify on the GPU.
///
/// Workspace: the split partials and counters live in `workspace_buffer`
/// (any dtype, contiguous, 16-byte aligned, **zeroed before its first
/// use**). Its last [`COUNTER_ELEMS`] f32 (256 KiB) are the split counters;
/// each launch's partials sit just below them, so every launch finds its
/// counters at zero (the kernel resets them) whatever the previous launch's
/// shape was, and no memset is issued per call. Launches that leave SMs
/// idle split with [`SplitMode::Auto`], full ones with 2048-key chunks
/// (≤ 4 per request); a workspace too small for the chunks falls back to
/// `Auto`, then to no split at all.
///
/// # Errors
/// [`CallError`] naming the argument; device failures.
pub fn decode(c: &AttnCall, ordinal: usize, handle: u64) -> CallResult<()> {
    check_attn(c, ordinal)?;
    let dev = device(ordinal)?;
    let stream = dev.stream(handle)?;
    let kernel = dev.launcher(&stream, |l| &mut l.decode, PagedAttentionKernel::new)?;
    let names = crate::attn::NAMES;
    let ts = attn_tensors(c);
    let ke = |e| from_kernel(e, names, &ts);
    let q = Buf::<u16>::new(&c.q, &stream)?;
    let mut out = Buf::<u16>::new(&c.out, &stream)?;
    let kv = KvBufs::new(c, &stream)?;
    let pt = Buf::<i32>::new(&c.page_table, &stream)?;
    let sl = Buf::<i32>::new(&c.seq_lens, &stream)?;
    let cu = Buf::<i32>::opt(c.cu_q.as_ref(), &stream)?;
    let sinks = Buf::<f32>::opt(c.sinks.as_ref(), &stream)?;
    let mut lse = Buf::<f32>::opt(c.lse.as_ref(), &stream)?;
    let order = Buf::<i32>::opt(c.unit_order.as_ref(), &stream)?;
    let layout = match (c.layout, &cu, &c.cu_q) {
        (Layout::Uniform(n), _, _) => QueryLayout::Uniform { q_len_per_req: n },
        (Layout::Ragged(max_q_len), Some(b), Some(t)) => QueryLayout::Ragged {
            cu_seqlens_q: b.view(t)?,
            max_q_len,
        },
        _ => return Err(ArgError::new("cum_seq_lens_q", "missing").into()),
    };
    let mut args = DecodeArgs {
        q: q.view(&c.q)?,
        q_dtype: c.q_dtype,
        out: out.view_mut(&c.out)?,
        kv: kv.cache(c)?,
        page_table: pt.view(&c.page_table)?,
        cache_seqlens: sl.view(&c.seq_lens)?,
        layout,
        max_seq_len: c.max_seq_len,
        bmm1_scale: c.bmm1,
        bmm2_scale: c.bmm2,
        window_left: c.window,
        sinks: match (&sinks, &c.sinks) {
            (Some(b), Some(t)) => Some(b.view(t)?),
            _ => None,
        },
        split: SplitMode::Auto,
        interleave: c.interleave,
        skip_softmax: c.skip_softmax,
        skipped_slices: None,
        unit_order: match (&order, &c.unit_order) {
            (Some(b), Some(t)) => Some(b.view(t)?),
            _ => None,
        },
        workspace: None,
        lse: match (&mut lse, &c.lse) {
            (Some(b), Some(t)) => Some(b.view_mut(t)?),
            _ => None,
        },
    };
    // Workspace geometry: f32 elements, counters at the end.
    let ws = &c.workspace;
    ws.require_contiguous()?;
    let ws_elems = ws.numel() * ws.dtype.size() / 4;
    if ws.ptr % 16 != 0 {
        return Err(ws.err("the base address must be 16-byte aligned").into());
    }
    let counter_start = ws_elems.saturating_sub(COUNTER_ELEMS) / 4 * 4;
    let fits = |lp: &paged_attention::LaunchPlan| {
        let p = &lp.params;
        let items = p.work_items();
        let partial = lp.workspace_elems.saturating_sub(items);
        lp.workspace_elems == 0
            || (ws_elems >= COUNTER_ELEMS && items <= COUNTER_ELEMS && partial <= counter_start)
    };
    let mut lp = kernel.plan(&args).map_err(ke)?;
    if chunk_full_launch(&lp, kernel.num_sms()) {
        args.split = CHUNKED;
        let chunked = kernel.plan(&args).map_err(ke)?;
        if fits(&chunked) {
            lp = chunked;
        } else {
            args.split = SplitMode::Auto;
        }
    }
    if !fits(&lp) {
        // No split: one CTA per request and KV head, no workspace.
        args.split = SplitMode::Fixed {
            chunk_tokens: c.max_seq_len,
        };
        lp = kernel.plan(&args).map_err(ke)?;
    }
    let mut ws_buf = None;
    if lp.workspace_elems > 0 {
        let p = &lp.params;
        let items = p.work_items();
        let start = counter_start - (lp.workspace_elems - items);
        let t = Tensor {
            ptr: ws.ptr + 4 * start as u64,
            dtype: crate::desc::Dtype::F32,
            shape: vec![lp.workspace_elems],
            strides: vec![1],
            ..ws.clone()
        };
        ws_buf = Some((Buf::<f32>::new(&t, &stream)?, t));
    }
    if let Some((b, t)) = ws_buf.as_mut() {
        args.workspace = Some(b.view_mut(t)?);
    }
    let mut errs = lock(&dev.errors);
    let t0 = crate::probe::start();
    let r = kernel.launch_on(&stream, &mut args, &mut errs[Family::Attention as usize]);
    crate::probe::end_launch(t0);
    r.map_err(ke)
}

/// Context / chunked prefill on the GPU (the launcher's own split workspace;
/// `workspace_buffer` is not used).
///
/// # Errors
/// [`CallError`] naming the argument; device failures.
pub fn context(c: &AttnCall, ordinal: usize, handle: u64) -> CallResult<()> {
    check_attn(c, ordinal)?;
    let dev = device(ordinal)?;
    let stream = dev.stream(handle)?;
    let kernel = dev.launcher(&stream, |l| &mut l.context, ContextKernel::new)?;
    let names = crate::attn::NAMES;
    let ts = attn_tensors(c);
    let ke = |e| from_kernel(e, names, &ts);
    let q = Buf::<u16>::new(&c.q, &stream)?;
    let mut out = Buf::<u16>::new(&c.out, &stream)?;
    let kv = KvBufs::new(c, &stream)?;
    let pt = Buf::<i32>::new(&c.page_table, &stream)?;
    let sl = Buf::<i32>::new(&c.seq_lens, &stream)?;
    let cu_t = c
        .cu_q
        .as_ref()
        .ok_or_else(|| ArgError::new("cum_seq_lens_q", "missing"))?;
    let cu = Buf::<i32>::new(cu_t, &stream)?;
    let cuk = Buf::<i32>::opt(c.cu_k.as_ref(), &stream)?;
    let sinks = Buf::<f32>::opt(c.sinks.as_ref(), &stream)?;
    let mut lse = Buf::<f32>::opt(c.lse.as_ref(), &stream)?;
    let Layout::Ragged(max_q_len) = c.layout else {
        return Err(ArgError::new("max_q_len", "missing").into());
    };
    let mut args = ContextArgs {
        q: q.view(&c.q)?,
        q_dtype: c.q_dtype,
        out: out.view_mut(&c.out)?,
        kv: kv.cache(c)?,
        page_table: pt.view(&c.page_table)?,
        cache_seqlens: sl.view(&c.seq_lens)?,
        cu_seqlens_q: cu.view(cu_t)?,
        cu_seqlens_k: match (&cuk, &c.cu_k) {
            (Some(b), Some(t)) => Some(b.view(t)?),
            _ => None,
        },
        max_q_len,
        bmm1_scale: c.bmm1,
        bmm2_scale: c.bmm2,
        window_left: c.window,
        sinks: match (&sinks, &c.sinks) {
            (Some(b), Some(t)) => Some(b.view(t)?),
            _ => None,
        },
        max_kv_len: Some(c.max_seq_len),
        lse: match (&mut lse, &c.lse) {
            (Some(b), Some(t)) => Some(b.view_mut(t)?),
            _ => None,
        },
    };
    let mut errs = lock(&dev.errors);
    let t0 = crate::probe::start();
    let r = kernel.launch_on(&stream, &mut args, &mut errs[Family::Attention as usize]);
    crate::probe::end_launch(t0);
    r.map_err(ke)
}

/// The page-table build on the GPU.
///
/// # Errors
/// [`CallError`] naming the argument; device failures.
pub fn page_table(c: &PageTableCall, ordinal: usize, handle: u64) -> CallResult<()> {
    let mut ts = vec![
        &c.req_to_token,
        &c.req_pool_indices,
        &c.cache_seqlens,
        &c.page_table,
    ];
    if let Some((m, t)) = &c.swa {
        ts.extend([m, t]);
    }
    check_device(&ts, ordinal)?;
    let dev = device(ordinal)?;
    let stream = dev.stream(handle)?;
    let kernel = dev.launcher(&stream, |l| &mut l.page_table, PageTableKernel::new)?;
    let r2t = Buf::<i32>::new(&c.req_to_token, &stream)?;
    let rpi = Buf::<i64>::new(&c.req_pool_indices, &stream)?;
    let sl = Buf::<i32>::new(&c.cache_seqlens, &stream)?;
    let mut pt = Buf::<i32>::new(&c.page_table, &stream)?;
    let mut swa = match &c.swa {
        Some((m, t)) => Some((Buf::<i64>::new(m, &stream)?, Buf::<i32>::new(t, &stream)?)),
        None => None,
    };
    let swa_tables = match (&mut swa, &c.swa) {
        (Some((mb, tb)), Some((m, t))) => Some(SwaTables {
            full_to_swa: mb.view(m)?,
            swa_page_table: tb.view_mut(t)?,
        }),
        _ => None,
    };
    let mut args = PageTableArgs {
        req_to_token: r2t.view(&c.req_to_token)?,
        req_pool_indices: rpi.view(&c.req_pool_indices)?,
        cache_seqlens: sl.view(&c.cache_seqlens)?,
        page_size: c.page_size,
        page_table: pt.view_mut(&c.page_table)?,
        swa: swa_tables,
        pool_slots: None,
    };
    let mut errs = lock(&dev.errors);
    kernel
        .launch_on(&stream, &mut args, &mut errs[Family::PageTable as usize])
        .map_err(|e| from_kernel(e, crate::meta::NAMES, &ts))
}

/// The graph-metadata update on the GPU.
///
/// # Errors
/// [`CallError`] naming the argument; device failures.
pub fn graph(c: &GraphCall, ordinal: usize, handle: u64) -> CallResult<()> {
    let ts = c.tensors();
    check_device(&ts, ordinal)?;
    let dev = device(ordinal)?;
    let stream = dev.stream(handle)?;
    let kernel = dev.launcher(&stream, |l| &mut l.graph, GraphMetadataKernel::new)?;
    let s = &stream;
    let rpi = Buf::<i64>::new(&c.req_pool_indices, s)?;
    let sl = Buf::<i64>::new(&c.seq_lens, s)?;
    let r2t = Buf::<i32>::new(&c.req_to_token, s)?;
    let mut cs = Buf::<i32>::new(&c.cache_seqlens, s)?;
    let mut cuk = Buf::<i32>::new(&c.cu_seqlens_k, s)?;
    let mut pt = Buf::<i32>::new(&c.page_table, s)?;
    let mut cuq = Buf::<i32>::opt(c.cu_seqlens_q.as_ref(), s)?;
    let ql = Buf::<i32>::opt(c.qlens.as_ref(), s)?;
    let map = Buf::<i64>::opt(c.swa_mapping.as_ref(), s)?;
    let mut spt = Buf::<i32>::opt(c.swa_page_table.as_ref(), s)?;
    let loc = Buf::<i64>::opt(c.out_cache_loc.as_ref(), s)?;
    let mut sloc = Buf::<i64>::opt(c.swa_out_cache_loc.as_ref(), s)?;
    let swa = match (&map, &c.swa_mapping) {
        (Some(mb), Some(mt)) => Some(SwaArgs {
            swa_mapping: mb.view(mt)?,
            swa_page_table: match (&mut spt, &c.swa_page_table) {
                (Some(b), Some(t)) => Some(b.view_mut(t)?),
                _ => None,
            },
            full_page_to_swa_page: None,
            write_locs: match (&mut sloc, &c.swa_out_cache_loc) {
                (Some(b), Some(t)) => Some(SwaWriteLocs {
                    out_cache_loc: match (&loc, &c.out_cache_loc) {
                        (Some(lb), Some(lt)) => Some(lb.view(lt)?),
                        _ => None,
                    },
                    swa_out_cache_loc: b.view_mut(t)?,
                }),
                _ => None,
            },
        }),
        _ => None,
    };
    let mut args = GraphMetadataArgs {
        mode: c.mode,
        req_pool_indices: rpi.view(&c.req_pool_indices)?,
        seq_lens: sl.view(&c.seq_lens)?,
        req_to_token: r2t.view(&c.req_to_token)?,
        page_size: c.page_size,
        pool_slots: None,
        cache_seqlens: cs.view_mut(&c.cache_seqlens)?,
        cu_seqlens_k: cuk.view_mut(&c.cu_seqlens_k)?,
        cu_seqlens_q: match (&mut cuq, &c.cu_seqlens_q) {
            (Some(b), Some(t)) => Some(b.view_mut(t)?),
            _ => None,
        },
        qlens: match (&ql, &c.qlens) {
            (Some(b), Some(t)) => Some(b.view(t)?),
            _ => None,
        },
        page_table: pt.view_mut(&c.page_table)?,
        swa,
    };
    let mut errs = lock(&dev.errors);
    kernel
        .launch_on(
            &stream,
            &mut args,
            &mut errs[Family::GraphMetadata as usize],
        )
        .map_err(|e| from_kernel(e, crate::meta::NAMES, &ts))
}

/// What both K/V writes set up: the tensors `[k, v, k_cache, v_cache,
/// cache_loc]` checked on device `ordinal`, its stream `handle` and write
/// launcher, and the buffers of the rows and the slots.
#[allow(clippy::type_complexity)]
fn write_setup(
    ts: &[&Tensor; 5],
    ordinal: usize,
    handle: u64,
) -> CallResult<(
    Arc<Device>,
    Arc<CudaStream>,
    Arc<KvWriteKernel>,
    [Buf<u16>; 2],
    Buf<i64>,
)> {
    check_device(ts, ordinal)?;
    let dev = device(ordinal)?;
    let stream = dev.stream(handle)?;
    let kernel = dev.launcher(&stream, |l| &mut l.kv, KvWriteKernel::new)?;
    let rows = [Buf::new(ts[0], &stream)?, Buf::new(ts[1], &stream)?];
    let loc = Buf::new(ts[4], &stream)?;
    Ok((dev, stream, kernel, rows, loc))
}

/// The fused FP8 KV write on the GPU.
///
/// # Errors
/// [`CallError`] naming the argument; device failures.
pub fn kv_write(c: &KvWriteCall, ordinal: usize, handle: u64) -> CallResult<()> {
    let ts = [&c.k, &c.v, &c.k_cache, &c.v_cache, &c.cache_loc];
    let (dev, stream, kernel, [k, v], loc) = write_setup(&ts, ordinal, handle)?;
    let mut kc = Buf::<u8>::new(&c.k_cache, &stream)?;
    let mut vc = Buf::<u8>::new(&c.v_cache, &stream)?;
    let mut args = fp8_kv::KvWriteArgs {
        k: k.view(&c.k)?,
        v: v.view(&c.v)?,
        cache_loc: loc.view(&c.cache_loc)?,
        k_cache: kc.view_mut(&c.k_cache)?,
        v_cache: vc.view_mut(&c.v_cache)?,
        page_size: c.page_size,
    };
    let mut errs = lock(&dev.errors);
    kernel
        .fused_fp8_set_kv_buffer_on(
            &stream,
            &mut args,
            c.dtype,
            &c.scales,
            &mut errs[Family::KvWrite as usize],
        )
        .map_err(|e| from_kernel(e, &[], &ts))
}

/// `merge_states` on the GPU (no error word: the merge reads no indices).
///
/// # Errors
/// [`CallError`] naming the argument; device failures.
pub fn merge(c: &MergeCall, ordinal: usize, handle: u64) -> CallResult<()> {
    let mut ts = vec![&c.v, &c.s, &c.out];
    ts.extend(c.lse_out.iter().chain(&c.sinks));
    check_device(&ts, ordinal)?;
    let dev = device(ordinal)?;
    let stream = dev.stream(handle)?;
    let kernel = dev.launcher(&stream, |l| &mut l.merge, MergeStatesKernel::new)?;
    let v = Buf::<u16>::new(&c.v, &stream)?;
    let s = Buf::<f32>::new(&c.s, &stream)?;
    let mut out = Buf::<u16>::new(&c.out, &stream)?;
    let mut lse = Buf::<f32>::opt(c.lse_out.as_ref(), &stream)?;
    let sinks = Buf::<f32>::opt(c.sinks.as_ref(), &stream)?;
    let mut args = MergeStatesArgs {
        o_parts: v.view(&c.v)?,
        lse_parts: s.view(&c.s)?,
        dtype: c.dtype,
        out: out.view_mut(&c.out)?,
        lse_out: match (&mut lse, &c.lse_out) {
            (Some(b), Some(t)) => Some(b.view_mut(t)?),
            _ => None,
        },
        sinks: match (&sinks, &c.sinks) {
            (Some(b), Some(t)) => Some(b.view(t)?),
            _ => None,
        },
    };
    kernel
        .launch_on(&stream, &mut args)
        .map_err(|e| from_kernel(e, crate::merge::NAMES, &ts))
}

/// `set_kv_buffer` on the GPU (fp8-kv's paged write; out-of-range slots
/// skipped and counted in the `kv_write` word).
///
/// # Errors
/// [`CallError`] naming the argument; device failures.
pub fn set_kv(c: &SetKvCall, ordinal: usize, handle: u64) -> CallResult<()> {
    let ts = [&c.k, &c.v, &c.k_cache, &c.v_cache, &c.cache_loc];
    let (dev, stream, kernel, [k, v], loc) = write_setup(&ts, ordinal, handle)?;
    let mut kc = Buf::<u16>::new(&c.k_cache, &stream)?;
    let mut vc = Buf::<u16>::new(&c.v_cache, &stream)?;
    let mut args = fp8_kv::PagedKvWriteArgs {
        k: k.view(&c.k)?,
        v: v.view(&c.v)?,
        cache_loc: loc.view(&c.cache_loc)?,
        k_cache: kc.view_mut(&c.k_cache)?,
        v_cache: vc.view_mut(&c.v_cache)?,
    };
    let mut errs = lock(&dev.errors);
    kernel
        .set_kv_buffer_paged_on(&stream, &mut args, &mut errs[Family::KvWrite as usize])
        .map_err(|e| from_kernel(e, &[], &ts))
}
