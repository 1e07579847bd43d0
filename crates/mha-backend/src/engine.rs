//! The backend on engine memory: views of buffers the serving engine owns
//! (its `req_to_token`, batch tensors, per-layer K/V caches, outputs,
//! workspace), host memory for the CPU executor and device memory for the
//! CUDA executor. Nothing here is copied to or from the host on a device
//! executor, and nothing is allocated inside a forward
//! ([`crate::MhaBackend::init_forward_metadata_engine`],
//! [`crate::MhaBackend::forward_engine`]).

use kernel_rt::cudarc::driver::{CudaView, CudaViewMut};
use kernel_rt::{row_major, KernelError, Strided, StridedMut};

use crate::batch::AttnMode;
use crate::error::Result;

/// Where an engine buffer lives: host memory (the CPU executor reads it)
/// or device memory on the backend's GPU (the CUDA executor's kernels read
/// it, stream-ordered on the backend's stream).
#[derive(Debug)]
pub enum Mem<'a, T> {
    /// Host elements.
    Host(&'a [T]),
    /// Device elements.
    Device(CudaView<'a, T>),
}

/// A writable engine buffer (see [`Mem`]).
#[derive(Debug)]
pub enum MemMut<'a, T> {
    /// Host elements.
    Host(&'a mut [T]),
    /// Device elements.
    Device(CudaViewMut<'a, T>),
}

impl<T> Mem<'_, T> {
    fn len(&self) -> usize {
        match self {
            Self::Host(s) => s.len(),
            Self::Device(v) => v.len(),
        }
    }
}

impl<T> MemMut<'_, T> {
    fn len(&self) -> usize {
        match self {
            Self::Host(s) => s.len(),
            Self::Device(v) => v.len(),
        }
    }
}

/// A read-only strided view `[shape]` (element strides) of an engine
/// buffer, checked at construction: every index inside `shape` lies in the
/// buffer. `arg` names the view in every error.
#[derive(Debug)]
pub struct View<'a, T, const N: usize> {
    arg: &'static str,
    mem: Mem<'a, T>,
    shape: [usize; N],
    strides: [usize; N],
}

impl<'a, T, const N: usize> View<'a, T, N> {
    /// A view with explicit element strides.
    ///
    /// # Errors
    /// [`KernelError::Capacity`] when an index inside `shape` falls outside
    /// the buffer, [`KernelError::Stride`] on overflow (both naming `arg`).
    pub fn new(
        arg: &'static str,
        mem: Mem<'a, T>,
        shape: [usize; N],
        strides: [usize; N],
    ) -> Result<Self> {
        kernel_rt::check_view_bounds(arg, mem.len(), &shape, &strides)?;
        Ok(Self {
            arg,
            mem,
            shape,
            strides,
        })
    }

    /// A row-major contiguous view of `shape`.
    ///
    /// # Errors
    /// As [`View::new`].
    pub fn contiguous(arg: &'static str, mem: Mem<'a, T>, shape: [usize; N]) -> Result<Self> {
        let s = row_major(&shape);
        Self::new(arg, mem, shape, s)
    }

    /// Extents.
    pub fn shape(&self) -> [usize; N] {
        self.shape
    }

    /// Element strides.
    pub fn strides(&self) -> [usize; N] {
        self.strides
    }

    /// The name given at construction.
    pub fn arg(&self) -> &'static str {
        self.arg
    }

    /// Whether the view is host memory.
    pub fn is_host(&self) -> bool {
        matches!(self.mem, Mem::Host(_))
    }

    /// The host elements (the whole backing slice; index it with the strides).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] naming the view for device memory.
    pub fn host(&self) -> Result<&[T]> {
        match &self.mem {
            Mem::Host(s) => Ok(s),
            Mem::Device(_) => Err(placement(self.arg, "host", "the CPU executor")),
        }
    }

    /// A kernel-rt view of the device memory, for a launcher.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] naming the view for host memory.
    pub fn strided(&self) -> Result<Strided<'_, T, N>> {
        match &self.mem {
            Mem::Device(v) => Ok(Strided::new(
                self.arg,
                v.slice(0..v.len()),
                self.shape,
                self.strides,
            )?),
            Mem::Host(_) => Err(placement(self.arg, "device", "the CUDA executor")),
        }
    }

    /// The device elements (whole view buffer).
    pub(crate) fn device_view(&self) -> Result<CudaView<'_, T>> {
        match &self.mem {
            Mem::Device(v) => Ok(v.slice(0..v.len())),
            Mem::Host(_) => Err(placement(self.arg, "device", "the CUDA executor")),
        }
    }
}

impl<T: Copy, const N: usize> View<'_, T, N> {
    /// Host copy of the elements in row-major order of `shape`.
    pub(crate) fn to_vec(&self) -> Result<Vec<T>> {
        let data = self.host()?;
        let total: usize = self.shape.iter().product();
        let mut out = Vec::with_capacity(total);
        let mut idx = [0usize; N];
        for _ in 0..total {
            let off: usize = idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
            out.push(data[off]);
            for d in (0..N).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }
}

/// A writable strided view of an engine buffer: as [`View`], plus no two
/// indices share an element (checked at construction on device memory by
/// kernel-rt; on host memory here).
#[derive(Debug)]
pub struct ViewMut<'a, T, const N: usize> {
    arg: &'static str,
    mem: MemMut<'a, T>,
    shape: [usize; N],
    strides: [usize; N],
}

fn no_overlap<const N: usize>(
    arg: &'static str,
    shape: &[usize; N],
    strides: &[usize; N],
) -> Result<(), KernelError> {
    let mut dims: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n > 1)
        .map(|(&n, &s)| (s, n))
        .collect();
    dims.sort_unstable();
    let mut extent = 0usize;
    for (s, n) in dims {
        if s <= extent {
            return Err(KernelError::Stride {
                arg,
                detail: format!(
                    "output view with shape {shape:?} and strides {strides:?} overlaps itself"
                ),
            });
        }
        extent += (n - 1) * s;
    }
    Ok(())
}

impl<'a, T, const N: usize> ViewMut<'a, T, N> {
    /// A writable view with explicit element strides.
    ///
    /// # Errors
    /// As [`View::new`], plus [`KernelError::Stride`] when two indices share
    /// an element.
    pub fn new(
        arg: &'static str,
        mem: MemMut<'a, T>,
        shape: [usize; N],
        strides: [usize; N],
    ) -> Result<Self> {
        kernel_rt::check_view_bounds(arg, mem.len(), &shape, &strides)?;
        no_overlap(arg, &shape, &strides)?;
        Ok(Self {
            arg,
            mem,
            shape,
            strides,
        })
    }

    /// A row-major contiguous writable view of `shape`.
    ///
    /// # Errors
    /// As [`ViewMut::new`].
    pub fn contiguous(arg: &'static str, mem: MemMut<'a, T>, shape: [usize; N]) -> Result<Self> {
        let s = row_major(&shape);
        Self::new(arg, mem, shape, s)
    }

    /// Extents.
    pub fn shape(&self) -> [usize; N] {
        self.shape
    }

    /// Element strides.
    pub fn strides(&self) -> [usize; N] {
        self.strides
    }

    /// The name given at construction.
    pub fn arg(&self) -> &'static str {
        self.arg
    }

    /// The host elements, writable.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] naming the view for device memory.
    pub fn host_mut(&mut self) -> Result<&mut [T]> {
        match &mut self.mem {
            MemMut::Host(s) => Ok(s),
            MemMut::Device(_) => Err(placement(self.arg, "host", "the CPU executor")),
        }
    }

    /// The host elements, read-only.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] naming the view for device memory.
    pub fn host(&self) -> Result<&[T]> {
        match &self.mem {
            MemMut::Host(s) => Ok(s),
            MemMut::Device(_) => Err(placement(self.arg, "host", "the CPU executor")),
        }
    }

    /// The device elements (whole view buffer), writable.
    pub(crate) fn device_view_mut(&mut self) -> Result<CudaViewMut<'_, T>> {
        match &mut self.mem {
            MemMut::Device(v) => {
                let n = v.len();
                Ok(v.slice_mut(0..n))
            }
            MemMut::Host(_) => Err(placement(self.arg, "device", "the CUDA executor")),
        }
    }

    /// A writable kernel-rt view of the device memory.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] naming the view for host memory.
    pub fn strided_mut(&mut self) -> Result<StridedMut<'_, T, N>> {
        match &mut self.mem {
            MemMut::Device(v) => {
                let n = v.len();
                Ok(StridedMut::new(
                    self.arg,
                    v.slice_mut(0..n),
                    self.shape,
                    self.strides,
                )?)
            }
            MemMut::Host(_) => Err(placement(self.arg, "device", "the CUDA executor")),
        }
    }

    /// A read-only kernel-rt view of the device memory.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] naming the view for host memory.
    pub fn strided(&self) -> Result<Strided<'_, T, N>> {
        match &self.mem {
            MemMut::Device(v) => Ok(Strided::new(
                self.arg,
                v.slice(0..v.len()),
                self.shape,
                self.strides,
            )?),
            MemMut::Host(_) => Err(placement(self.arg, "device", "the CUDA executor")),
        }
    }
}

fn placement(arg: &'static str, want: &str, who: &str) -> crate::BackendError {
    KernelError::unsupported(arg, format!("{who} needs {want} memory for this view")).into()
}

/// Memory order of an engine K/V cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// `[num_pages, P, Hkv, D]` (token-major pages; SGLang's pool, viewed
    /// per page).
    Nhd,
    /// `[num_pages, Hkv, P, D]` (head-major pages; FlashInfer's and
    /// TRT-LLM's `HND`).
    Hnd,
}

impl KvLayout {
    /// The `[num_pages, Hkv, P, D]` index-order shape and strides (what the
    /// kernels take) of a cache given in this memory order with `shape`
    /// and element `strides` in that order.
    pub fn to_kernel_order(
        self,
        shape: [usize; 4],
        strides: [usize; 4],
    ) -> ([usize; 4], [usize; 4]) {
        match self {
            Self::Hnd => (shape, strides),
            Self::Nhd => (
                [shape[0], shape[2], shape[1], shape[3]],
                [strides[0], strides[2], strides[1], strides[3]],
            ),
        }
    }
}

impl<'a, T> ViewMut<'a, T, 4> {
    /// One engine K or V cache of a layer as the `[num_pages, Hkv, P, D]`
    /// view the kernels take: `shape` / `strides` (elements) are given in
    /// `layout`'s memory order (NHD `[num_pages, P, Hkv, D]`, HND
    /// `[num_pages, Hkv, P, D]`); any strides with the last dim contiguous
    /// and, on the GPU, the other strides multiples of 16 bytes. Slot `s` is
    /// page `s / P`, token `s % P`.
    ///
    /// # Errors
    /// As [`ViewMut::new`].
    pub fn kv_cache(
        arg: &'static str,
        mem: MemMut<'a, T>,
        layout: KvLayout,
        shape: [usize; 4],
        strides: [usize; 4],
    ) -> Result<Self> {
        let (shape, strides) = layout.to_kernel_order(shape, strides);
        Self::new(arg, mem, shape, strides)
    }
}

/// One layer's engine-owned K and V caches, `[num_pages, Hkv, P, D]` views
/// ([`ViewMut::kv_cache`]); the element type must be the backend's KV dtype
/// (`u16` bits of the model dtype for bf16 / f16 caches, `u8` for e4m3).
/// For an SWA layer of a hybrid model these are the SWA pool's caches (the
/// backend writes and reads them at SWA slots).
#[derive(Debug)]
pub enum EngineKvCache<'a> {
    /// bf16 / f16 caches (the model dtype).
    Half {
        /// K cache.
        k: ViewMut<'a, u16, 4>,
        /// V cache, same shape.
        v: ViewMut<'a, u16, 4>,
    },
    /// e4m3 caches.
    E4m3 {
        /// K cache.
        k: ViewMut<'a, u8, 4>,
        /// V cache, same shape.
        v: ViewMut<'a, u8, 4>,
    },
}

impl EngineKvCache<'_> {
    /// `[num_pages, Hkv, P, D]` of the K view.
    pub fn shape(&self) -> [usize; 4] {
        match self {
            Self::Half { k, .. } => k.shape(),
            Self::E4m3 { k, .. } => k.shape(),
        }
    }
}

/// The full→SWA maps of a hybrid model's engine (SEMANTICS.md §swa-pool.2): the slot
/// map `[size + P + 1]` i64 (0 = unmapped, last entry −1) and, optionally,
/// its page-level form `[(size + P) / P]` i32 ([`swa_pool::SwaMapping::page_map`];
/// the device page-table build then reads `P` times fewer bytes). The
/// engine keeps them current itself (e.g. with [`swa_pool::SwaUpdateKernel`]).
#[derive(Debug)]
pub struct EngineSwaMap<'a> {
    /// `[N_map]` i64, contiguous.
    pub full_to_swa: View<'a, i64, 1>,
    /// `[N_map / P]` i32, contiguous, or `None`.
    pub page_map: Option<View<'a, i32, 1>>,
}

/// One forward pass described by engine buffers (the device-resident form
/// of [`crate::ForwardBatch`]). The host holds only the scalars below; every
/// per-request tensor is a view of engine memory, read by the kernels (CUDA
/// executor) with no copy to the host and no stream synchronisation.
///
/// Mode rules (SEMANTICS.md §backend.3): `mode` is the branch the engine already
/// resolved ([`AttnMode`]); `seq_lens` are the scheduler's KV lengths as in
/// [`crate::ForwardBatch`] (the attention length is `seq_lens + offset` by
/// the mode's rule). Device data the host cannot check (request rows,
/// lengths, slots) is bounds-checked by the kernels: bad entries are
/// skipped and counted ([`crate::MhaBackend::device_errors`]), never read
/// or written out of bounds.
#[derive(Debug)]
pub struct EngineBatch<'a> {
    /// The branch (decode, draft step, uniform / ragged verify, draft extend, extend).
    pub mode: AttnMode,
    /// `bs`.
    pub batch_size: usize,
    /// Query rows (new tokens) of the pass.
    pub num_tokens: usize,
    /// Ragged verify and extend: upper bound on rows per request (host int,
    /// upstream's `max_seq_len_q`); ignored by the uniform modes.
    pub max_q_len: usize,
    /// `[R, W]` i32 full-pool slots by position (the engine's
    /// `req_to_token`); any row stride, last dim contiguous.
    pub req_to_token: View<'a, i32, 2>,
    /// `[bs]` i64, contiguous: row of `req_to_token` per request.
    pub req_pool_indices: View<'a, i64, 1>,
    /// `[bs]` i64, contiguous: scheduler KV lengths, tokens.
    pub seq_lens: View<'a, i64, 1>,
    /// `[num_tokens]` i64, contiguous: full-pool slots of the new K/V, in
    /// query-row order.
    pub out_cache_loc: View<'a, i64, 1>,
    /// Extend / mixed (required): `[bs + 1]` i32 query-row prefix sums
    /// (`cu_seqlens_q[bs] = num_tokens`); unused by the other modes.
    pub cu_seqlens_q: Option<View<'a, i32, 1>>,
    /// Ragged verify (required): `[bs]` i32 verified tokens per request
    /// (each ≤ `max_q_len`, sum = `num_tokens`); unused by the other modes.
    pub verify_lens: Option<View<'a, i32, 1>>,
    /// Hybrid SWA models (required when the config has an SWA pool).
    pub swa: Option<EngineSwaMap<'a>>,
    /// Extend / mixed: how many requests at the end of the batch have
    /// exactly one new token (their rows go to the decode kernel, as the
    /// host path decides from its host `cu_seqlens_q`); 0 sends every
    /// request to the context kernel (same results up to rounding).
    pub decode_tail: usize,
}

/// One attention layer's engine buffers for
/// [`crate::MhaBackend::forward_engine`].
#[derive(Debug)]
pub struct EngineLayer<'a> {
    /// `[num_tokens, Hq, D]` queries (model dtype bits); token and head
    /// strides multiples of 8 elements, last dim contiguous (e.g. a view
    /// into a fused QKV tensor).
    pub q: View<'a, u16, 3>,
    /// `[num_tokens, Hkv, D]` new K rows, written at `out_cache_loc` (its
    /// SWA translation on SWA layers) when given and `save_kv`; any token /
    /// head stride, last dim contiguous.
    pub k: Option<View<'a, u16, 3>>,
    /// `[num_tokens, Hkv, D]` new V rows, as `k`.
    pub v: Option<View<'a, u16, 3>>,
    /// The layer's caches (SWA pool for SWA layers).
    pub kv_cache: EngineKvCache<'a>,
    /// `[num_tokens, Hq, D]` output (model dtype bits), written in place;
    /// strides as `q`.
    pub out: ViewMut<'a, u16, 3>,
    /// Decode split-KV scratch (f32 elements, contiguous; CUDA executor):
    /// `None` uses the backend's own (allocated at construction). The last
    /// elements a split launch uses are counters the backend zeroes before
    /// each such launch (stream-ordered, graph-safe).
    pub workspace: Option<ViewMut<'a, f32, 1>>,
    /// Query scale: `bmm1 = q_scale · k_scale · sm_scale` (the seed's rule
    /// for its non-XQA kernels). `q` stays in the model dtype (no e4m3
    /// query kernels), so 1.0 unless the engine folded a scale into `q`.
    pub q_scale: f32,
}

/// The host-side facts of an engine pass, kept by the backend between
/// [`crate::MhaBackend::init_forward_metadata_engine`] and
/// [`crate::MhaBackend::forward_engine`] (what an [`crate::Executor`] gets).
#[derive(Debug, Clone)]
pub struct EngineShape {
    /// The branch.
    pub mode: AttnMode,
    /// `bs`.
    pub bs: usize,
    /// Query rows.
    pub num_tokens: usize,
    /// Rows per request of the kernels (uniform `q_len`, or the ragged /
    /// extend bound `max_q_len`).
    pub max_q: usize,
    /// Trailing one-token requests of an extend pass (decode kernel).
    pub decode_tail: usize,
    /// The host metadata (CPU executor only).
    pub host: Option<crate::ForwardMetadata>,
}

impl EngineBatch<'_> {
    /// Checks the host-checkable facts: vector shapes against `bs` /
    /// `num_tokens`, the mode's required views, `max_q_len`, the SWA maps
    /// (`swa_pool` = the config has one) and placement (all host or all device).
    pub(crate) fn check(&self, swa_pool: bool) -> Result<()> {
        use crate::error::batch_err;
        let bs = self.batch_size;
        fn vec1<T>(v: &View<'_, T, 1>, n: usize, what: &str) -> Result<()> {
            if v.shape()[0] != n {
                return Err(batch_err(
                    v.arg(),
                    format!("shape {:?}, expected [{what}={n}]", v.shape()),
                ));
            }
            if n > 1 && v.strides()[0] != 1 {
                return Err(batch_err(
                    v.arg(),
                    format!("must be contiguous, got stride {}", v.strides()[0]),
                ));
            }
            Ok(())
        }
        vec1(&self.req_pool_indices, bs, "bs")?;
        vec1(&self.seq_lens, bs, "bs")?;
        vec1(&self.out_cache_loc, self.num_tokens, "num_tokens")?;
        let [_, w] = self.req_to_token.shape();
        if w > 1 && self.req_to_token.strides()[1] != 1 {
            return Err(batch_err("req_to_token", "last dim must be contiguous"));
        }
        let q_len = match self.mode {
            AttnMode::Decode | AttnMode::DraftDecode { .. } => Some(1),
            AttnMode::TargetVerify { q_len } | AttnMode::DraftExtendV2 { q_len } => Some(q_len),
            AttnMode::RaggedVerify | AttnMode::Extend => None,
        };
        if let Some(q) = q_len {
            if bs * q != self.num_tokens {
                return Err(batch_err(
                    "num_tokens",
                    format!(
                        "{:?}: {} tokens ≠ bs {bs} × {q}",
                        self.mode, self.num_tokens
                    ),
                ));
            }
            if q > crate::config::MAX_DECODE_Q_LEN || (bs > 0 && q == 0) {
                return Err(batch_err(
                    "mode",
                    format!(
                        "{q} query rows per request outside 1..={}",
                        crate::config::MAX_DECODE_Q_LEN
                    ),
                ));
            }
        }
        match self.mode {
            AttnMode::Extend => {
                let cu = self.cu_seqlens_q.as_ref().ok_or_else(|| {
                    batch_err(
                        "cu_seqlens_q",
                        "extend-like modes need cu_seqlens_q [bs + 1]",
                    )
                })?;
                vec1(cu, bs + 1, "bs + 1")?;
            }
            AttnMode::RaggedVerify => {
                let v = self.verify_lens.as_ref().ok_or_else(|| {
                    batch_err("verify_lens", "ragged verify needs verify_lens [bs]")
                })?;
                vec1(v, bs, "bs")?;
                if self.max_q_len == 0 || self.max_q_len > crate::config::MAX_DECODE_Q_LEN {
                    return Err(batch_err(
                        "max_q_len",
                        format!(
                            "{} outside 1..={} (the decode kernel's rows per request)",
                            self.max_q_len,
                            crate::config::MAX_DECODE_Q_LEN
                        ),
                    ));
                }
            }
            _ => {}
        }
        match (&self.swa, swa_pool) {
            (None, true) => {
                return Err(batch_err(
                    "swa",
                    "the config has an SWA pool: the engine's full→SWA map is required",
                ))
            }
            (Some(_), false) => {
                return Err(batch_err("swa", "the config has no SWA pool"));
            }
            (Some(m), true) => {
                let n = m.full_to_swa.shape()[0];
                if n == 0 || (n > 1 && m.full_to_swa.strides()[0] != 1) {
                    return Err(batch_err(
                        "swa.full_to_swa",
                        "must be a contiguous [size + P + 1] vector",
                    ));
                }
                if let Some(pm) = &m.page_map {
                    if pm.shape()[0] > 1 && pm.strides()[0] != 1 {
                        return Err(batch_err("swa.page_map", "must be contiguous"));
                    }
                }
            }
            (None, false) => {}
        }
        let host = self.req_to_token.is_host();
        let mut views: Vec<(&'static str, bool)> = vec![
            ("req_pool_indices", self.req_pool_indices.is_host()),
            ("seq_lens", self.seq_lens.is_host()),
            ("out_cache_loc", self.out_cache_loc.is_host()),
        ];
        if let Some(v) = &self.cu_seqlens_q {
            views.push(("cu_seqlens_q", v.is_host()));
        }
        if let Some(v) = &self.verify_lens {
            views.push(("verify_lens", v.is_host()));
        }
        if let Some(m) = &self.swa {
            views.push(("swa.full_to_swa", m.full_to_swa.is_host()));
        }
        if let Some((arg, _)) = views.into_iter().find(|&(_, h)| h != host) {
            return Err(batch_err(
                arg,
                "placement differs from req_to_token's (all host or all device memory)",
            ));
        }
        Ok(())
    }

    /// The host batch the views describe (CPU executor: host views only),
    /// for the host metadata builder.
    pub(crate) fn to_host_batch(&self) -> Result<crate::ForwardBatch> {
        use crate::batch::ForwardBatch;
        let rpi = self.req_pool_indices.to_vec()?;
        let seq = self.seq_lens.to_vec()?;
        let loc = self.out_cache_loc.to_vec()?;
        Ok(match self.mode {
            AttnMode::Decode => ForwardBatch::decode(rpi, seq, loc),
            AttnMode::DraftDecode { step } => ForwardBatch::draft_decode(rpi, seq, loc, Some(step)),
            AttnMode::TargetVerify { .. } => ForwardBatch::target_verify(rpi, seq, loc, None),
            AttnMode::RaggedVerify => {
                let v = self.verify_lens.as_ref().map(View::to_vec).transpose()?;
                ForwardBatch::target_verify(rpi, seq, loc, v)
            }
            AttnMode::DraftExtendV2 { q_len } => {
                ForwardBatch::draft_extend_v2(rpi, seq, loc, q_len as i32)
            }
            AttnMode::Extend => {
                let cu = self
                    .cu_seqlens_q
                    .as_ref()
                    .map(View::to_vec)
                    .transpose()?
                    .unwrap_or_default();
                let ext: Vec<i32> = cu.windows(2).map(|w| w[1] - w[0]).collect();
                let mut b = ForwardBatch::extend(rpi, Vec::new(), ext, loc, true);
                b.seq_lens = seq;
                b.extend_prefix_lens = None;
                b
            }
        })
    }
}
