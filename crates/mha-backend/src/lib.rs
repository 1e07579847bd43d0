//! # mha-backend
//!
//! The mha-kit paged-attention backend: what a serving engine plugs in.
//! Given a [`ForwardBatch`] it builds the forward metadata once per pass and,
//! for every attention layer, writes the layer's new K/V and runs attention,
//! in every forward mode. Spec: `SEMANTICS.md` §backend (state machine,
//! modes, workspace, errors), `DESIGN.md`, and the kernel families' files.
//!
//! ## Pieces
//! - [`BackendConfig`] / [`LayerConfig`] / [`SpecConfig`]: per-layer shape
//!   (`Hq`, `Hkv`, `D`, `window_left`, sinks, K/V scales), `page_size`,
//!   `context_len`, KV dtype (bf16 | f16 | e4m3), model dtype, graph batch
//!   size, speculative settings (`topk > 1` rejected, D14), pool sizes and
//!   workspace bytes (default 512 MiB, `MHA_KIT_WORKSPACE_BYTES` overrides).
//!   Invalid configs are typed [`BackendError`]s.
//! - [`Pools`]: `req_to_token` `[max_requests + 1, context_len]` i32 (row 0
//!   reserved, all zeros), the full-pool page allocator (page 0 the dummy
//!   page), the hybrid SWA pool's full→SWA map (swa-pool's [`swa_pool::SwaMapping`]);
//!   allocation is all-or-nothing and exhaustion is an error, never an overwrite.
//! - [`ForwardBatch`] / [`ForwardMode`] / [`SpecInfo`]: the scheduler's batch.
//! - [`MhaBackend`]: [`MhaBackend::init_forward_metadata`] (every mode,
//!   eager, SEMANTICS.md §backend.3) and [`MhaBackend::forward`] (KV write + attention,
//!   §backend.7). [`MultiStepDraftBackend`]: `num_steps − 1` step backends sharing
//!   one state (§backend.8).
//! - Executors ([`Device`], [`Executor`]): the CPU executor runs the kernel
//!   families' CPU references (page-table and swa-pool for metadata,
//!   fp8-kv for K/V writes, paged-attention's f64 reference for attention,
//!   rounded to the model dtype). The [`CudaExecutor`] keeps the K/V caches,
//!   `req_to_token` and the SWA maps on the device (`req_to_token` kept
//!   current by uploading only the changed entries — [`Pools::dirty_spans`]
//!   — from pinned memory and scattering them with page-table's
//!   `ScatterKernel`, so no stream sync; the SWA slot and page maps kept
//!   current the same way, from the map's change log
//!   ([`swa_pool::SwaMapping::changed_pages_since`]) and swa-pool's
//!   `SwaUpdateKernel`: one `(full_page, swa_page)` entry per changed page),
//!   builds the metadata with the
//!   fused graph-metadata kernel (one launch per pass in every mode), writes
//!   K/V with fp8-kv and runs paged-attention's decode or context kernel.
//!   `Device::Cuda(n)` builds it (no GPU: a typed error, never a CPU
//!   fallback); `Device::Auto` builds it when a GPU is present.
//! - Engine memory ([`EngineBatch`], [`EngineLayer`], [`View`] /
//!   [`ViewMut`] over [`Mem`] / [`MemMut`]): the same passes over buffers
//!   the serving engine owns — its `req_to_token` (any row stride),
//!   `req_pool_indices`, `seq_lens`, `out_cache_loc`, `cu_seqlens_q` /
//!   `verify_lens` and SWA maps, per-layer K/V caches as
//!   `[num_pages, Hkv, P, D]` views of NHD or HND memory ([`KvLayout`],
//!   any strides the kernels take), outputs and optionally the workspace.
//!   [`MhaBackend::reserve_engine_metadata`] once, then per pass
//!   [`MhaBackend::init_forward_metadata_engine`] and per layer
//!   [`MhaBackend::forward_engine`]; [`MhaBackend::capture_engine_graph`] /
//!   [`MhaBackend::replay_engine_graph`] for CUDA graphs. The backend's
//!   [`Pools`] are not used on this path (page allocation is the engine's:
//!   requests may share prefix pages). On the CUDA executor nothing is
//!   copied to the host, synchronised or allocated inside a pass; on the
//!   CPU executor the views are host memory and the results equal the
//!   owning path's bit for bit.
//!
//!   ```no_run
//!   # use mha_backend::*;
//!   # fn step(b: &mut MhaBackend, gpu: &kernel_rt::Gpu, r2t: &kernel_rt::cudarc::driver::CudaSlice<i32>,
//!   #   rpi: &kernel_rt::cudarc::driver::CudaSlice<i64>, seq: &kernel_rt::cudarc::driver::CudaSlice<i64>,
//!   #   loc: &kernel_rt::cudarc::driver::CudaSlice<i64>, q: &kernel_rt::cudarc::driver::CudaSlice<u16>,
//!   #   k_cache: &mut kernel_rt::cudarc::driver::CudaSlice<u16>, v_cache: &mut kernel_rt::cudarc::driver::CudaSlice<u16>,
//!   #   out: &mut kernel_rt::cudarc::driver::CudaSlice<u16>) -> Result<()> {
//!   // A decode step of 8 requests, 32/8/128 heads, P = 16, 4096 pages (NHD).
//!   let batch = EngineBatch {
//!       mode: AttnMode::Decode, batch_size: 8, num_tokens: 8, max_q_len: 1,
//!       req_to_token: View::contiguous("req_to_token", Mem::Device(r2t.slice(..)), [257, 4096])?,
//!       req_pool_indices: View::contiguous("req_pool_indices", Mem::Device(rpi.slice(..)), [8])?,
//!       seq_lens: View::contiguous("seq_lens", Mem::Device(seq.slice(..)), [8])?,
//!       out_cache_loc: View::contiguous("out_cache_loc", Mem::Device(loc.slice(..)), [8])?,
//!       cu_seqlens_q: None, verify_lens: None, swa: None, decode_tail: 0,
//!   };
//!   b.reserve_engine_metadata(256, 8192)?; // once
//!   b.init_forward_metadata_engine(&batch)?;
//!   let (shape, strides) = ([4096, 16, 8, 128], [16 * 8 * 128, 8 * 128, 128, 1]);
//!   let mut layer = EngineLayer {
//!       q: View::contiguous("q", Mem::Device(q.slice(..)), [8, 32, 128])?,
//!       k: None, v: None, // the engine wrote K/V itself, or pass them to be written
//!       kv_cache: EngineKvCache::Half {
//!           k: ViewMut::kv_cache("k_cache", MemMut::Device(k_cache.as_view_mut()), KvLayout::Nhd, shape, strides)?,
//!           v: ViewMut::kv_cache("v_cache", MemMut::Device(v_cache.as_view_mut()), KvLayout::Nhd, shape, strides)?,
//!       },
//!       out: ViewMut::contiguous("out", MemMut::Device(out.as_view_mut()), [8, 32, 128])?,
//!       workspace: None, q_scale: 1.0,
//!   };
//!   b.forward_engine(0, &mut layer, &batch, true)?; // stream-ordered, no sync
//!   # let _ = gpu; Ok(()) }
//!   ```
//! - CUDA graphs ([`MhaBackend::init_cuda_graph_state`],
//!   [`MhaBackend::capture_cuda_graph`], [`MhaBackend::replay_cuda_graph`],
//!   [`GraphKey`] / [`GraphKind`]): one graph per bucket and mode holding a
//!   whole step (fused metadata launch, then every layer's K/V write and
//!   attention over static per-layer inputs / outputs); replay pads the
//!   batch (D3), writes ragged-verify metadata eagerly (SEMANTICS.md §backend.5) and
//!   launches without a host sync. CUDA executor only
//!   ([`BackendError::GraphUnsupported`] otherwise).
//! - Attention time by part ([`part_timing`], off by default): with a
//!   [`PartTimer`] installed ([`MhaBackend::set_part_timer`], CUDA executor
//!   only), eager passes record CUDA events around the K/V-write, context
//!   and decode launches (no synchronisation); [`PartTimer::read`] gives
//!   [`PartTimes`] (seconds per part, the context kernel's causal FLOPs).
//! - Mixed passes ([`MixedOverlap`], [`MhaBackend::set_mixed_overlap`],
//!   `MHA_KIT_MIXED_OVERLAP`): the CUDA executor runs an eager mixed pass's
//!   decode launch (its one-token rows) on a side stream beside the context
//!   launch (its prefill chunks), joined before the next layer; outputs are
//!   bitwise those of one stream. The SMs the context grid's tail leaves
//!   idle take decode CTAs: whole code trace on an H200, attention 64.92 →
//!   63.24 s; conv trace 225.8 → 219.0 s (docs/PERF.md, session 12).
//!
//! ## Per-mode metadata (SEMANTICS.md §backend.3)
//!
//! | mode | `cache_seqlens` | `cu_seqlens_q` | `max_seq_len_q` | kernel rule |
//! |---|---|---|---|---|
//! | DECODE / IDLE | `seq` | `0..=bs` | 1 | decode, 1 row |
//! | draft decode step `s` | `seq + s + 1` | `0..=bs` | 1 | decode, 1 row |
//! | TARGET_VERIFY uniform | `seq + n`, `n = tokens / bs` | `0, n, …` | `n` | decode, `n` rows |
//! | TARGET_VERIFY ragged | `seq + verify_lens` | `[0, cumsum(verify_lens)]` | `max(verify_lens)` | decode, ragged |
//! | DRAFT_EXTEND_V2 | `seq` | `0, n, …` | `n` | decode, `n` rows |
//! | EXTEND / MIXED / other | `seq` | `[0, cumsum(extend)]` | `max(extend)` | context |
//!
//! `cu_seqlens_k = [0, cumsum(cache_seqlens)]` in every mode. Row `j` of
//! request `i` sits at position `cache_seqlens[i] − n_i + j` (SEMANTICS.md §attention.2).
//!
//! ## Split-KV of decode batches (decision, not in the spec)
//!
//! A decode / verify launch whose batch leaves SMs idle uses
//! paged-attention's [`SplitMode::Auto`] (splits chosen to fill the GPU).
//! A launch that already fills the GPU (Auto picks one split) runs
//! [`SplitMode::Chunked`] — by default 2048-key chunks, at most 4 per
//! request ([`DEFAULT_DECODE_SPLIT`], `MHA_KIT_DECODE_SPLIT=auto|CHUNK:MAX`
//! overrides): in a real batch (a serving trace, mean context ~1.4k, a few
//! requests at 5–14k) one CTA per (request, KV head) leaves the longest
//! request's CTAs running alone at the end of every layer. Short requests
//! stay one CTA that writes its rows directly; only the long ones pay the
//! split's partials and merge. The split of a request depends only on its
//! own length and the policy, so eager and graph launches of a bucket agree
//! bit for bit. If the workspace cannot hold the chunked partials, Auto runs.
//! A launch of at least 6 work items (request, KV head, row tile) an SM
//! (5 with e4m3 K/V) runs unsplit (`paged_attention::chunk_full_launch`):
//! there the decode kernel's length order (its CTAs serve the longest
//! requests first, on by default from `2·SMs` items) balances the batch
//! better than chunks, whose extra CTAs each pay that order's ranking
//! (docs/PERF.md sessions 37 and 49). The ordered launches of one split in
//! a pass share one length order, written by the pass's first such launch
//! (`paged_attention::PagedAttentionKernel::write_unit_order`) and read by
//! the other layers' launches instead of each CTA ranking the batch (FP8
//! conv-like batches 3.5–6% faster, bf16 ~1%; docs/PERF.md session 49);
//! engine passes and decode-parallel ranks keep the per-CTA ranking.
//!
//! **Status:** the CUDA executor and the graph path pass their GPU tests on
//! an H200 (`tests/gpu.rs`: 48 trials, every mode eager == CPU executor,
//! graph replay == eager over 1,000 steps per mode at buckets up to 8
//! requests; re-run after the entry-wise `req_to_token` sync and the
//! chunked split, also under compute-sanitizer memcheck: clean); the CPU
//! executor is tested in CI. Ragged-verify graphs are tested to buckets of
//! 32 tokens here and 128 through mha-replay (whole conv trace with
//! `--spec-steps 3`: 0 mismatches); mha-replay keeps larger ragged buckets
//! eager, a precaution from an engine read-back race since fixed there.
//!
//! [`ForwardBatch::pad_to_bucket`] gives the replay padding (D3) and the
//! ragged-verify padding (SEMANTICS.md §backend.5), so eager metadata of a padded
//! batch is what a replay computes (the GPU tests check it bit for bit).

mod backend;
mod batch;
mod config;
mod cuda;
mod engine;
mod error;
mod errors;
mod executor;
mod graph;
mod metadata;
pub mod part_timing;
mod pools;
mod shard;

pub use backend::{
    KvLocation, KvPageDescriptor, KvPageFormat, KvPages, MhaBackend, MultiStepDraftBackend,
};
pub use batch::{AttnMode, ForwardBatch, ForwardMode, SpecInfo};
pub use config::{
    resolve_decode_split, resolve_mixed_overlap, resolve_skip_softmax, resolve_workspace_bytes,
    BackendConfig, LayerConfig, MixedOverlap, SpecConfig, DECODE_SPLIT_ENV, DEFAULT_DECODE_SPLIT,
    DEFAULT_MIXED_OVERLAP, DEFAULT_WORKSPACE_BYTES, HEAD_DIMS, MAX_DECODE_CP_RANKS,
    MAX_DECODE_Q_LEN, MAX_GROUP, MIXED_OVERLAP_ENV, SKIP_SOFTMAX_DECODE_ENV, WORKSPACE_ENV,
};
pub use cuda::CudaExecutor;
pub use engine::{
    EngineBatch, EngineKvCache, EngineLayer, EngineShape, EngineSwaMap, KvLayout, Mem, MemMut,
    View, ViewMut,
};
pub use error::{BackendError, Result};
pub use errors::{flag_names, DeviceErrorReport};
pub use executor::{
    CpuExecutor, Device, DeviceMetadata, Executor, ExecutorKind, GraphExecutor, KvLoc, KvSnapshot,
    LayerPlan, Tensor, TensorRef,
};
pub use fp8_kv::{KvCacheDtype, KvScales};
pub use graph::{GraphKey, GraphKind};
pub use metadata::ForwardMetadata;
pub use paged_attention::HalfDtype;
pub use paged_attention::SplitMode;
pub use part_timing::{AttnPart, PartTimer, PartTimes};
pub use pools::Pools;
pub use shard::{HeadShard, MAX_TP_RANKS};
