//! Executors: where the KV bytes live and the kernels run. The backend's
//! host side (config, pools, metadata, validation) is shared; an executor
//! only writes K/V and runs attention (and, on a device, builds the device
//! metadata and runs CUDA graphs). The CPU executor runs the reference
//! implementations; [`crate::CudaExecutor`] implements the same trait.
//!
//! Here: the shared types and the [`Executor`] trait; `cpu` holds the CPU executor.

use std::str::FromStr;
use std::sync::Arc;

use fp8_kv::{KvCacheDtype, KvScales};
use kernel_rt::cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use kernel_rt::{ErrorReport, KernelError};

use crate::batch::ForwardBatch;
use crate::engine::{EngineBatch, EngineLayer, EngineShape};
use crate::error::{BackendError, Result};
use crate::graph::GraphKey;
use crate::metadata::ForwardMetadata;
use crate::part_timing::PartTimer;
use crate::pools::Pools;

mod cpu;

pub use cpu::CpuExecutor;

/// Which executor to build (chosen at construction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The best available: the CUDA executor on the process's shared GPU
    /// (`MHA_KIT_DEVICE`, default 0) when a GPU is present, else the CPU
    /// executor.
    #[default]
    Auto,
    /// The CPU executor (reference implementations).
    Cpu,
    /// The CUDA executor on device `ordinal`; without a GPU (or with a bad
    /// ordinal) construction fails with [`kernel_rt::KernelError::NoGpu`],
    /// never a silent fallback to the CPU.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = BackendError;

    /// Parses `auto`, `cpu` or `cuda:N` (`cuda` alone = `cuda:0`).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| BackendError::InvalidDevice(s.to_string())),
        }
    }
}

/// The executor a backend actually runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorKind {
    /// CPU reference executor.
    Cpu,
    /// CUDA executor on a device ordinal.
    Cuda(usize),
}

impl std::fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A borrowed activation tensor (bf16/f16 bits, contiguous, row-major):
/// host memory for the CPU executor, device memory for the CUDA executor.
#[derive(Debug, Clone, Copy)]
pub enum TensorRef<'a> {
    /// Host elements.
    Host(&'a [u16]),
    /// Device elements.
    Device(&'a CudaView<'a, u16>),
}

impl TensorRef<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Self::Host(s) => s.len(),
            Self::Device(v) => v.len(),
        }
    }

    /// No element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An owned output tensor (model dtype bits, contiguous).
#[derive(Debug)]
pub enum Tensor {
    /// Host elements.
    Host(Vec<u16>),
    /// Device elements.
    Device(CudaSlice<u16>),
}

impl Tensor {
    /// A host copy of the elements (a device tensor is copied back, which
    /// synchronises its stream).
    ///
    /// # Errors
    /// [`BackendError::Kernel`] when the device copy fails.
    pub fn to_host(&self) -> Result<Vec<u16>> {
        match self {
            Self::Host(v) => Ok(v.clone()),
            Self::Device(d) => Ok(d
                .stream()
                .clone_dtoh(d)
                .map_err(kernel_rt::KernelError::from)?),
        }
    }

    /// The host elements, if the tensor lives on the host.
    pub fn into_host(self) -> Option<Vec<u16>> {
        match self {
            Self::Host(v) => Some(v),
            Self::Device(_) => None,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Self::Host(v) => v.len(),
            Self::Device(v) => v.len(),
        }
    }

    /// No element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything an executor needs to know about one layer.
#[derive(Debug, Clone)]
pub struct LayerPlan {
    /// Global layer id.
    pub layer: usize,
    /// `Hq`.
    pub num_q_heads: usize,
    /// `Hkv`.
    pub num_kv_heads: usize,
    /// `D`.
    pub head_dim: usize,
    /// Window (D12).
    pub window_left: Option<u32>,
    /// `[Hq]` sinks.
    pub sinks: Option<Vec<f32>>,
    /// Resolved scales (D8).
    pub scales: KvScales,
    /// Softmax scale.
    pub sm_scale: f32,
    /// Whether the layer lives in the SWA pool (SWA page table and locations).
    pub is_swa: bool,
    /// Slots of the layer's pool (`(pages + 1) · P`).
    pub slots: usize,
}

impl LayerPlan {
    /// `Hq · D`: elements of one query / output row.
    pub fn q_row_elems(&self) -> usize {
        self.num_q_heads * self.head_dim
    }

    /// `Hkv · D`: elements of one K (or V) row.
    pub fn kv_row_elems(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// A host copy of one layer's K and V caches, `[slots, Hkv, D]` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvSnapshot {
    /// bf16/f16 bits.
    Half {
        /// K cache.
        k: Vec<u16>,
        /// V cache.
        v: Vec<u16>,
    },
    /// e4m3 bytes.
    Fp8 {
        /// K cache.
        k: Vec<u8>,
        /// V cache.
        v: Vec<u8>,
    },
}

/// The slots of one KV write, in the layer's own index space.
#[derive(Debug, Clone, Copy)]
pub struct KvLoc<'a> {
    /// `[n]` host copy of the slots.
    pub slots: &'a [i64],
    /// `true` when `slots` are exactly the locations prepared with the
    /// current metadata for this layer's pool (`out_cache_loc` for a full
    /// layer, `swa_out_cache_loc` for an SWA layer): a device executor then
    /// uses its device copy instead of uploading `slots`.
    pub prepared: bool,
}

/// A host copy of device-built metadata (CUDA executor), for checks against
/// the host metadata: `[bs]`, `[bs+1]`, `[bs+1]`, `[bs, M]` (entries past a
/// row's live prefix are stale), `[bs, M]`, `[num_tokens]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMetadata {
    /// `[bs]` i32.
    pub cache_seqlens: Vec<i32>,
    /// `[bs + 1]` i32.
    pub cu_seqlens_q: Vec<i32>,
    /// `[bs + 1]` i32.
    pub cu_seqlens_k: Vec<i32>,
    /// `[bs, M]` i32, row stride `M`.
    pub page_table: Vec<i32>,
    /// `[bs, M]` i32 with an SWA pool.
    pub swa_page_table: Option<Vec<i32>>,
    /// `[num_tokens]` i64 with an SWA pool.
    pub swa_out_cache_loc: Option<Vec<i64>>,
}

pub(crate) fn part_timing_unsupported(kind: ExecutorKind) -> BackendError {
    KernelError::unsupported(
        "part timer",
        format!(
            "timing by part needs CUDA events: the CUDA executor (this backend runs on {kind})"
        ),
    )
    .into()
}

pub(crate) fn graphs_unsupported(kind: ExecutorKind) -> BackendError {
    BackendError::GraphUnsupported(format!(
        "CUDA graphs need the CUDA executor (this backend runs on {kind})"
    ))
}

/// The operations an executor provides. Shapes and consistency are checked
/// by the backend before any call; an executor checks only what it alone
/// can (tensor placement, device errors).
pub trait Executor: Send + std::fmt::Debug {
    /// What this executor is.
    fn kind(&self) -> ExecutorKind;

    /// Writes `k`, `v` (`[n, Hkv, D]`, model dtype) into the layer's cache
    /// at `loc` (`[n]`, the layer's own index space): bit copy for a 16-bit
    /// cache, the fused FP8 write with the layer's scales for an e4m3 cache.
    /// Slots outside the pool are skipped and counted.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (placement, driver).
    fn write_kv(
        &mut self,
        plan: &LayerPlan,
        loc: KvLoc<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<ErrorReport>;

    /// Makes `meta` the executor's current metadata (a device executor
    /// builds its device copy: uploads the changed pool tables, then one
    /// metadata launch). A no-op when `meta` is already current and the
    /// pools did not change. The CPU executor reads the host metadata.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (driver, validation).
    fn prepare_metadata(&mut self, meta: &ForwardMetadata, pools: &Pools) -> Result<()> {
        let _ = (meta, pools);
        Ok(())
    }

    /// Whether this executor builds the page tables and SWA slots itself
    /// (on the device, in [`Executor::prepare_metadata`]): the host then
    /// builds only the lengths, offsets and mode, once.
    fn tables_on_device(&self) -> bool {
        false
    }

    /// A host copy of the device metadata of the current eager pass
    /// (`graph = false`) or of the last graph replay (`graph = true`);
    /// `None` on an executor without device metadata.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (driver).
    fn read_metadata(&self, graph: bool) -> Result<Option<DeviceMetadata>> {
        let _ = graph;
        Ok(None)
    }

    /// Device error events accumulated by KV writes and attention (a device
    /// executor reads its error words: a stream synchronisation).
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (driver).
    fn device_errors(&self) -> Result<crate::DeviceErrorReport> {
        Ok(crate::DeviceErrorReport::default())
    }

    /// Installs `timer` (or, with `None`, removes the installed one) and
    /// returns the timer installed before. While one is installed, eager
    /// K/V writes and attention launches record CUDA events into it
    /// ([`crate::part_timing`]); graph capture and replay never do.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] when `timer` is `Some` on an executor
    /// without CUDA events (the CPU executor; the timer is dropped) or the
    /// timer belongs to another device.
    fn set_part_timer(&mut self, timer: Option<PartTimer>) -> Result<Option<PartTimer>> {
        match timer {
            None => Ok(None),
            Some(_) => Err(part_timing_unsupported(self.kind())),
        }
    }

    /// Makes the decode-kernel passes run this GPU's rank of `comm`'s
    /// decode context-parallel group (each rank launches its own pages'
    /// share, all-gathers the partial states over NCCL and merges them);
    /// see [`crate::MhaBackend::attach_decode_comm`].
    ///
    /// # Errors
    /// [`BackendError::Kernel`] on an executor without NCCL ranks (the CPU
    /// executor), once graph state or engine memory exists, or when `comm`
    /// is on another device.
    fn attach_decode_comm(&mut self, comm: Arc<paged_attention::nccl::DcpComm>) -> Result<()> {
        let _ = comm;
        Err(BackendError::Kernel(KernelError::unsupported(
            "decode communicator",
            format!(
                "the {:?} executor has no NCCL ranks (decode_cp_ranks simulates them)",
                self.kind()
            ),
        )))
    }

    /// Sets how eager mixed passes run their context and decode launches
    /// ([`crate::MixedOverlap`]); returns the previous setting. Executors
    /// with one launch at a time (the CPU executor) keep
    /// [`crate::MixedOverlap::Off`] whatever is asked and return it.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] when the side stream cannot be created.
    fn set_mixed_overlap(&mut self, order: crate::MixedOverlap) -> Result<crate::MixedOverlap> {
        let _ = order;
        Ok(crate::MixedOverlap::Off)
    }

    /// The executor's CUDA-graph operations, if it has graphs.
    fn graphs(&self) -> Option<&dyn GraphExecutor> {
        None
    }

    /// As [`Executor::graphs`], mutable.
    fn graphs_mut(&mut self) -> Option<&mut dyn GraphExecutor> {
        None
    }

    /// Engine path: reserves the device metadata buffers of engine passes
    /// of up to `max_bs` requests and `max_num_tokens` tokens (a device
    /// executor never allocates inside an engine pass). A no-op on the CPU.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (allocation).
    fn reserve_engine(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        let _ = (max_bs, max_num_tokens);
        Ok(())
    }

    /// Engine path: builds the device metadata of `batch` from the engine's
    /// views (one fused launch; no host copy). A no-op on the CPU executor
    /// (the backend built `shape.host`).
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (placement, capacity, driver).
    fn engine_metadata(&mut self, batch: &EngineBatch<'_>, shape: &EngineShape) -> Result<()> {
        let _ = (batch, shape);
        Ok(())
    }

    /// Engine path: one layer's K/V write (when `save_kv` and `io.k` /
    /// `io.v` are given) into `io.kv_cache` and attention into `io.out`.
    /// Shapes were checked by the backend.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (placement, strides, driver).
    fn engine_forward(
        &mut self,
        plan: &LayerPlan,
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        io: &mut EngineLayer<'_>,
        save_kv: bool,
    ) -> Result<crate::DeviceErrorReport>;

    /// Attention of `q` (`[meta.num_tokens, Hq, D]`) over the layer's paged
    /// cache with `meta`'s tables; returns `[num_tokens, Hq·D]` in the model dtype.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (placement, driver).
    fn attention(
        &mut self,
        plan: &LayerPlan,
        meta: &ForwardMetadata,
        page_size: usize,
        q: TensorRef<'_>,
    ) -> Result<(Tensor, ErrorReport)>;

    /// A host copy of the layer's caches (tests, checks).
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (driver).
    fn read_kv(&self, plan: &LayerPlan) -> Result<KvSnapshot>;

    /// Where the layer's caches live and the addresses of K's and V's
    /// first element (host pointers or CUDA device pointers).
    ///
    /// # Errors
    /// None today; a `Result` for executors that must ask the driver.
    fn kv_bases(&self, plan: &LayerPlan) -> Result<(crate::KvLocation, u64, u64)>;

    /// Pages `pages` (each `page_elems` contiguous elements of K and of V,
    /// checked in range by the caller), page after page.
    ///
    /// # Errors
    /// [`BackendError::Kernel`] (driver).
    fn read_kv_pages(
        &self,
        plan: &LayerPlan,
        page_elems: usize,
        pages: &[usize],
    ) -> Result<KvSnapshot>;

    /// Writes page `i` of `data` into page `pages[i]` (caller-checked: in
    /// range, distinct, `data` holding `pages.len()` pages).
    ///
    /// # Errors
    /// [`BackendError::Batch`] naming `format` when `data`'s element type is
    /// not the cache's; [`BackendError::Kernel`] (driver).
    fn write_kv_pages(
        &mut self,
        plan: &LayerPlan,
        page_elems: usize,
        pages: &[usize],
        data: &KvSnapshot,
    ) -> Result<()>;
}

/// The CUDA-graph operations of an executor that has graphs (the CUDA
/// executor); [`Executor::graphs`] / [`Executor::graphs_mut`] hand it out,
/// and an executor without graphs returns `None` there (the backend then
/// answers [`BackendError::GraphUnsupported`]).
pub trait GraphExecutor {
    /// Allocates the CUDA-graph buffers (SEMANTICS.md §backend.4.1) for buckets of up
    /// to `max_bs` rows and `max_num_tokens` tokens; drops every captured graph.
    ///
    /// # Errors
    /// Driver / capacity errors.
    fn init_graph_state(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()>;

    /// Captures one whole step for `key` (fused metadata launch, then every
    /// layer's KV write and attention).
    ///
    /// # Errors
    /// Driver / validation errors.
    fn capture_graph(&mut self, key: GraphKey, pools: &Pools) -> Result<()>;

    /// The captured buckets.
    fn graph_keys(&self) -> Vec<GraphKey>;

    /// Replays the graph of `key` for `padded` (a batch already padded to
    /// the bucket): uploads its inputs and the changed pool tables, writes
    /// ragged-verify metadata eagerly, launches the graph. No host sync.
    ///
    /// # Errors
    /// Driver errors.
    fn replay_graph(&mut self, key: GraphKey, padded: &ForwardBatch, pools: &Pools) -> Result<()>;

    /// Copies layer inputs into the graph's static buffers (`q` `[n, Hq, D]`,
    /// `k`/`v` `[n, Hkv, D]`, `n ≤ max_num_tokens`, rows past `n` keep
    /// their contents).
    ///
    /// # Errors
    /// Capacity / driver errors.
    fn write_graph_inputs(
        &mut self,
        plan: &LayerPlan,
        q: TensorRef<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<()>;

    /// A host copy of the first `rows` output rows (`[rows, Hq·D]`) of the
    /// graph's static output buffer of the layer (synchronises).
    ///
    /// # Errors
    /// Capacity / driver errors.
    fn read_graph_output(&self, plan: &LayerPlan, rows: usize) -> Result<Vec<u16>>;

    /// Enqueues a device copy of output rows `[row0, row0 + rows)` of the
    /// layer's static graph output into `dst` (`[rows · Hq·D]` u16),
    /// stream-ordered after the last replay; no host synchronisation.
    ///
    /// # Errors
    /// Capacity / driver errors.
    fn copy_graph_output(
        &self,
        plan: &LayerPlan,
        row0: usize,
        rows: usize,
        dst: &mut CudaViewMut<'_, u16>,
    ) -> Result<()>;

    /// Engine path: captures one whole engine step as a CUDA graph (the
    /// metadata launch from the engine's views, then every layer's write
    /// and attention over `layers`), stored under `key`.
    ///
    /// # Errors
    /// Driver / validation errors.
    fn capture_engine_graph(
        &mut self,
        key: GraphKey,
        plans: &[LayerPlan],
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        layers: &mut [EngineLayer<'_>],
        save_kv: bool,
    ) -> Result<()>;

    /// Engine path: replays the engine graph of `key` (no host work but the launch).
    ///
    /// # Errors
    /// Driver errors.
    fn replay_engine_graph(&mut self, key: GraphKey) -> Result<()>;
}

/// `exec`'s graph operations, or [`BackendError::GraphUnsupported`] naming it.
pub(crate) fn graphs_of(exec: &dyn Executor) -> Result<&dyn GraphExecutor> {
    exec.graphs().ok_or_else(|| graphs_unsupported(exec.kind()))
}

/// As [`graphs_of`], mutable.
pub(crate) fn graphs_of_mut(exec: &mut dyn Executor) -> Result<&mut dyn GraphExecutor> {
    let kind = exec.kind();
    exec.graphs_mut().ok_or_else(|| graphs_unsupported(kind))
}

/// The error of pages whose element type is not the cache's.
pub(crate) fn page_dtype_err() -> BackendError {
    crate::error::batch_err(
        "format",
        "16-bit pages for an e4m3 cache, or e4m3 pages for a 16-bit cache",
    )
}

/// Page `i` of `src` into page `pages[i]` of `dst` (host slices).
pub(crate) fn copy_pages_in<T: Copy>(dst: &mut [T], src: &[T], page_elems: usize, pages: &[usize]) {
    for (i, &p) in pages.iter().enumerate() {
        dst[p * page_elems..][..page_elems].copy_from_slice(&src[i * page_elems..][..page_elems]);
    }
}

/// Pages `pages` of `src`, page after page (host slices).
pub(crate) fn copy_pages_out<T: Copy>(src: &[T], page_elems: usize, pages: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(pages.len() * page_elems);
    for &p in pages {
        out.extend_from_slice(&src[p * page_elems..][..page_elems]);
    }
    out
}

/// `(bmm1, bmm2)` of a layer with query scale `q_scale`: the D8 resolver
/// (`(q_scale · k_scale) · sm_scale, v_scale` for e4m3 caches), and
/// `(q_scale · sm_scale, 1)` for 16-bit caches (where the resolver ignores
/// `q_scale`, which upstream only sets for an e4m3 query); `q_scale = 1`
/// gives exactly the owning path's scales.
pub(crate) fn bmm_scales(plan: &LayerPlan, q_scale: f32) -> (f32, f32) {
    match plan.scales.cache_dtype() {
        KvCacheDtype::Fp8E4m3 => plan.scales.bmm_scales(q_scale, plan.sm_scale),
        _ if q_scale == 1.0 => plan.scales.bmm_scales(1.0, plan.sm_scale),
        _ => (q_scale * plan.sm_scale, 1.0),
    }
}
