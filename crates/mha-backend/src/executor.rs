//! Executors: where the KV bytes live and the kernels run. The backend's
//! host side (config, pools, metadata, validation) is shared; an executor
//! only writes K/V and runs attention (and, on a device, builds the device
//! metadata and runs CUDA graphs). The CPU executor runs the reference
//! implementations; [`crate::CudaExecutor`] implements the same trait.

use std::str::FromStr;

use fp8_kv::{KvCacheDtype, KvScales};
use kernel_rt::cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use kernel_rt::{ErrorReport, KernelError};
use paged_attention::reference::{self as attn, HostKv, HostLayout, KvData};
use paged_attention::HalfDtype;

use crate::batch::{AttnMode, ForwardBatch};
use crate::engine::{EngineBatch, EngineKvCache, EngineLayer, EngineShape};
use crate::error::{BackendError, Result};
use crate::graph::GraphKey;
use crate::metadata::ForwardMetadata;
use crate::part_timing::PartTimer;
use crate::pools::Pools;

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
    fn device_errors(&self) -> Result<ErrorReport> {
        Ok(ErrorReport::default())
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

    /// Allocates the CUDA-graph buffers (SEMANTICS.md §backend.4.1) for buckets of up
    /// to `max_bs` rows and `max_num_tokens` tokens; drops every captured graph.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] on an executor without graphs.
    fn init_graph_state(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        let _ = (max_bs, max_num_tokens);
        Err(graphs_unsupported(self.kind()))
    }

    /// Captures one whole step for `key` (fused metadata launch, then every
    /// layer's KV write and attention).
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`]; driver / validation errors.
    fn capture_graph(&mut self, key: GraphKey, pools: &Pools) -> Result<()> {
        let _ = (key, pools);
        Err(graphs_unsupported(self.kind()))
    }

    /// The captured buckets.
    fn graph_keys(&self) -> Vec<GraphKey> {
        Vec::new()
    }

    /// Replays the graph of `key` for `padded` (a batch already padded to
    /// the bucket): uploads its inputs and the changed pool tables, writes
    /// ragged-verify metadata eagerly, launches the graph. No host sync.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`]; driver errors.
    fn replay_graph(&mut self, key: GraphKey, padded: &ForwardBatch, pools: &Pools) -> Result<()> {
        let _ = (key, padded, pools);
        Err(graphs_unsupported(self.kind()))
    }

    /// Copies layer inputs into the graph's static buffers (`q` `[n, Hq, D]`,
    /// `k`/`v` `[n, Hkv, D]`, `n ≤ max_num_tokens`, rows past `n` keep
    /// their contents).
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`]; capacity / driver errors.
    fn write_graph_inputs(
        &mut self,
        plan: &LayerPlan,
        q: TensorRef<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<()> {
        let _ = (plan, q, k, v);
        Err(graphs_unsupported(self.kind()))
    }

    /// A host copy of the first `rows` output rows (`[rows, Hq·D]`) of the
    /// graph's static output buffer of the layer (synchronises).
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`]; capacity / driver errors.
    fn read_graph_output(&self, plan: &LayerPlan, rows: usize) -> Result<Vec<u16>> {
        let _ = (plan, rows);
        Err(graphs_unsupported(self.kind()))
    }

    /// Enqueues a device copy of output rows `[row0, row0 + rows)` of the
    /// layer's static graph output into `dst` (`[rows · Hq·D]` u16),
    /// stream-ordered after the last replay; no host synchronisation.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`]; capacity / driver errors.
    fn copy_graph_output(
        &self,
        plan: &LayerPlan,
        row0: usize,
        rows: usize,
        dst: &mut CudaViewMut<'_, u16>,
    ) -> Result<()> {
        let _ = (plan, row0, rows, dst);
        Err(graphs_unsupported(self.kind()))
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
    ) -> Result<ErrorReport>;

    /// Engine path: captures one whole engine step as a CUDA graph (the
    /// metadata launch from the engine's views, then every layer's write
    /// and attention over `layers`), stored under `key`.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] on an executor without graphs.
    fn capture_engine_graph(
        &mut self,
        key: GraphKey,
        plans: &[LayerPlan],
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        layers: &mut [EngineLayer<'_>],
        save_kv: bool,
    ) -> Result<()> {
        let _ = (key, plans, shape, batch, layers, save_kv);
        Err(graphs_unsupported(self.kind()))
    }

    /// Engine path: replays the engine graph of `key` (no host work but the launch).
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`]; driver errors.
    fn replay_engine_graph(&mut self, key: GraphKey) -> Result<()> {
        let _ = key;
        Err(graphs_unsupported(self.kind()))
    }

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
}

#[derive(Debug, Clone)]
enum Store {
    Half(Vec<u16>, Vec<u16>),
    Fp8(Vec<u8>, Vec<u8>),
}

/// The CPU executor: host K/V caches, fp8-kv's write references and
/// paged-attention's f64 reference (output rounded to the model dtype).
#[derive(Debug, Clone)]
pub struct CpuExecutor {
    model_dtype: HalfDtype,
    layers: Vec<Store>,
}

impl CpuExecutor {
    /// Zeroed caches for `plans` (one per layer, in order).
    pub fn new(model_dtype: HalfDtype, kv_dtype: KvCacheDtype, plans: &[LayerPlan]) -> Self {
        let layers = plans
            .iter()
            .map(|p| {
                let n = p.slots * p.num_kv_heads * p.head_dim;
                match kv_dtype {
                    KvCacheDtype::Fp8E4m3 => Store::Fp8(vec![0; n], vec![0; n]),
                    _ => Store::Half(vec![0; n], vec![0; n]),
                }
            })
            .collect();
        Self {
            model_dtype,
            layers,
        }
    }
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

/// The reference's query layout of a pass.
fn host_layout(meta: &ForwardMetadata) -> HostLayout<'_> {
    match meta.mode {
        AttnMode::Decode | AttnMode::DraftDecode { .. } => HostLayout::Uniform { q_len_per_req: 1 },
        AttnMode::TargetVerify { q_len } | AttnMode::DraftExtendV2 { q_len } => {
            HostLayout::Uniform {
                q_len_per_req: q_len,
            }
        }
        AttnMode::RaggedVerify | AttnMode::Extend => HostLayout::Ragged {
            cu_seqlens_q: &meta.cu_seqlens_q,
            max_q_len: meta.max_seq_len_q,
        },
    }
}

fn host<'a>(t: TensorRef<'a>, arg: &'static str) -> Result<&'a [u16]> {
    match t {
        TensorRef::Host(s) => Ok(s),
        TensorRef::Device(_) => Err(KernelError::unsupported(
            arg,
            "the CPU executor takes host tensors, not device memory",
        )
        .into()),
    }
}

impl Executor for CpuExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Cpu
    }

    fn write_kv(
        &mut self,
        plan: &LayerPlan,
        loc: KvLoc<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<ErrorReport> {
        let loc = loc.slots;
        let (k, v) = (host(k, "k")?, host(v, "v")?);
        let row = plan.num_kv_heads * plan.head_dim;
        let w = fp8_kv::reference::HostWrite {
            cache_loc: loc,
            num_kv_heads: plan.num_kv_heads,
            head_dim: plan.head_dim,
            k: fp8_kv::reference::HostRows {
                data: k,
                token_stride: row,
                head_stride: plan.head_dim,
            },
            v: fp8_kv::reference::HostRows {
                data: v,
                token_stride: row,
                head_stride: plan.head_dim,
            },
        };
        fn cache<'a, C>(
            data: &'a mut [C],
            plan: &LayerPlan,
        ) -> fp8_kv::reference::HostCache<'a, C> {
            fp8_kv::reference::HostCache {
                data,
                slots: plan.slots,
                slot_stride: plan.num_kv_heads * plan.head_dim,
                head_stride: plan.head_dim,
            }
        }
        Ok(match &mut self.layers[plan.layer] {
            Store::Half(kc, vc) => {
                fp8_kv::reference::set_kv_buffer(&w, &mut cache(kc, plan), &mut cache(vc, plan))
            }
            Store::Fp8(kc, vc) => {
                let dtype = match self.model_dtype {
                    HalfDtype::Bf16 => fp8_kv::KvDtype::Bf16,
                    HalfDtype::F16 => fp8_kv::KvDtype::F16,
                };
                fp8_kv::reference::fused_fp8_set_kv_buffer(
                    &w,
                    dtype,
                    &plan.scales,
                    &mut cache(kc, plan),
                    &mut cache(vc, plan),
                )
            }
        })
    }

    fn attention(
        &mut self,
        plan: &LayerPlan,
        meta: &ForwardMetadata,
        page_size: usize,
        q: TensorRef<'_>,
    ) -> Result<(Tensor, ErrorReport)> {
        let q = host(q, "q")?;
        let (hq, hkv, d) = (plan.num_q_heads, plan.num_kv_heads, plan.head_dim);
        let rows = meta.num_tokens;
        if rows == 0 || meta.batch_size == 0 {
            return Ok((Tensor::Host(vec![0; rows * hq * d]), ErrorReport::default()));
        }
        let pages = plan.slots / page_size;
        let shape = [pages, hkv, page_size, d];
        let strides = [page_size * hkv * d, d, hkv * d, 1];
        let (kd, vd) = match &self.layers[plan.layer] {
            Store::Half(k, v) => match self.model_dtype {
                HalfDtype::Bf16 => (KvData::Bf16(k), KvData::Bf16(v)),
                HalfDtype::F16 => (KvData::F16(k), KvData::F16(v)),
            },
            Store::Fp8(k, v) => (KvData::E4m3(k), KvData::E4m3(v)),
        };
        let table = if plan.is_swa {
            meta.swa_page_table.as_deref().unwrap_or(&meta.page_table)
        } else {
            &meta.page_table
        };
        let layout = host_layout(meta);
        let (bmm1, bmm2) = plan.scales.bmm_scales(1.0, plan.sm_scale);
        let input = attn::HostInputs {
            q,
            q_dtype: self.model_dtype,
            q_shape: [rows, hq, d],
            q_strides: [hq * d, d, 1],
            k: HostKv {
                data: kd,
                shape,
                strides,
            },
            v: HostKv {
                data: vd,
                shape,
                strides,
            },
            page_table: table,
            max_num_pages: meta.max_num_pages,
            page_table_stride: meta.max_num_pages,
            cache_seqlens: &meta.cache_seqlens,
            layout,
            bmm1_scale: bmm1,
            bmm2_scale: bmm2,
            window_left: plan.window_left,
            sinks: plan.sinks.as_deref(),
        };
        let r = attn::attention(&input);
        let dt = self.model_dtype;
        let out = r.out.iter().map(|&x| dt.from_f64(x)).collect();
        Ok((Tensor::Host(out), r.errors))
    }

    fn engine_forward(
        &mut self,
        plan: &LayerPlan,
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        io: &mut EngineLayer<'_>,
        save_kv: bool,
    ) -> Result<ErrorReport> {
        let _ = batch;
        let meta = shape
            .host
            .as_ref()
            .ok_or_else(|| BackendError::Metadata("no host metadata of the engine pass".into()))?;
        let mut errors = ErrorReport::default();
        let (hq, hkv, d) = (plan.num_q_heads, plan.num_kv_heads, plan.head_dim);
        let [pages, _, page_size, _] = io.kv_cache.shape();
        if let (true, Some(k), Some(v)) = (save_kv, &io.k, &io.v) {
            let loc: &[i64] = match (&meta.swa_out_cache_loc, plan.is_swa) {
                (Some(s), true) => s,
                _ => &meta.source_out_cache_loc,
            };
            fn rows<'a>(
                t: &'a crate::engine::View<'_, u16, 3>,
                d: usize,
            ) -> Result<fp8_kv::reference::HostRows<'a>> {
                let [_, _, sd] = t.strides();
                if d > 1 && sd != 1 {
                    return Err(KernelError::Stride {
                        arg: t.arg(),
                        detail: "last dim must be contiguous".into(),
                    }
                    .into());
                }
                Ok(fp8_kv::reference::HostRows {
                    data: t.host()?,
                    token_stride: t.strides()[0],
                    head_stride: t.strides()[1],
                })
            }
            let w = fp8_kv::reference::HostWrite {
                cache_loc: loc,
                num_kv_heads: hkv,
                head_dim: d,
                k: rows(k, d)?,
                v: rows(v, d)?,
            };
            fn paged<'a, C>(
                view: &'a mut crate::engine::ViewMut<'_, C, 4>,
            ) -> Result<fp8_kv::reference::HostPagedCache<'a, C>> {
                let [pages, _, p, _] = view.shape();
                let [ps, hs, ts, _] = view.strides();
                Ok(fp8_kv::reference::HostPagedCache {
                    data: view.host_mut()?,
                    num_pages: pages,
                    page_size: p,
                    page_stride: ps,
                    head_stride: hs,
                    token_stride: ts,
                })
            }
            errors.merge(match &mut io.kv_cache {
                EngineKvCache::Half { k, v } => {
                    fp8_kv::reference::set_kv_buffer_paged(&w, &mut paged(k)?, &mut paged(v)?)
                }
                EngineKvCache::E4m3 { k, v } => {
                    let dtype = match self.model_dtype {
                        HalfDtype::Bf16 => fp8_kv::KvDtype::Bf16,
                        HalfDtype::F16 => fp8_kv::KvDtype::F16,
                    };
                    fp8_kv::reference::fused_fp8_set_kv_buffer_paged(
                        &w,
                        dtype,
                        &plan.scales,
                        &mut paged(k)?,
                        &mut paged(v)?,
                    )
                }
            });
        }
        let rows = meta.num_tokens;
        let mut out = vec![0u16; rows * hq * d];
        if rows > 0 && meta.batch_size > 0 {
            let (kd, vd, kshape, kstr, vstr) = match &io.kv_cache {
                EngineKvCache::Half { k, v } => {
                    let (kh, vh) = (k.host()?, v.host()?);
                    match self.model_dtype {
                        HalfDtype::Bf16 => (
                            KvData::Bf16(kh),
                            KvData::Bf16(vh),
                            k.shape(),
                            k.strides(),
                            v.strides(),
                        ),
                        HalfDtype::F16 => (
                            KvData::F16(kh),
                            KvData::F16(vh),
                            k.shape(),
                            k.strides(),
                            v.strides(),
                        ),
                    }
                }
                EngineKvCache::E4m3 { k, v } => (
                    KvData::E4m3(k.host()?),
                    KvData::E4m3(v.host()?),
                    k.shape(),
                    k.strides(),
                    v.strides(),
                ),
            };
            let _ = (pages, page_size);
            let table = if plan.is_swa {
                meta.swa_page_table.as_deref().unwrap_or(&meta.page_table)
            } else {
                &meta.page_table
            };
            let layout = host_layout(meta);
            let (bmm1, bmm2) = bmm_scales(plan, io.q_scale);
            let input = attn::HostInputs {
                q: io.q.host()?,
                q_dtype: self.model_dtype,
                q_shape: [rows, hq, d],
                q_strides: io.q.strides(),
                k: HostKv {
                    data: kd,
                    shape: kshape,
                    strides: kstr,
                },
                v: HostKv {
                    data: vd,
                    shape: kshape,
                    strides: vstr,
                },
                page_table: table,
                max_num_pages: meta.max_num_pages,
                page_table_stride: meta.max_num_pages,
                cache_seqlens: &meta.cache_seqlens,
                layout,
                bmm1_scale: bmm1,
                bmm2_scale: bmm2,
                window_left: plan.window_left,
                sinks: plan.sinks.as_deref(),
            };
            let r = attn::attention(&input);
            errors.merge(r.errors);
            let dt = self.model_dtype;
            for (o, &x) in out.iter_mut().zip(&r.out) {
                *o = dt.from_f64(x);
            }
        }
        // Into the engine's output, at its strides (every row, as the owning path).
        let [so, sh, sd] = io.out.strides();
        let dst = io.out.host_mut()?;
        for t in 0..rows {
            for h in 0..hq {
                for x in 0..d {
                    dst[t * so + h * sh + x * sd] = out[(t * hq + h) * d + x];
                }
            }
        }
        Ok(errors)
    }

    fn read_kv(&self, plan: &LayerPlan) -> Result<KvSnapshot> {
        Ok(match &self.layers[plan.layer] {
            Store::Half(k, v) => KvSnapshot::Half {
                k: k.clone(),
                v: v.clone(),
            },
            Store::Fp8(k, v) => KvSnapshot::Fp8 {
                k: k.clone(),
                v: v.clone(),
            },
        })
    }
}
