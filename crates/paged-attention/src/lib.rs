//! # paged-attention
//!
//! mha-kit kernel family: attention of new query rows against a **paged KV
//! cache**, for decode (one row per request) and speculative **verify**
//! (uniform `q_len_per_req` 1..=16, or ragged `cu_seqlens_q` + `max_q_len`).
//! Spec: SEMANTICS.md §attention.2–7, SEMANTICS.md §fp8-kv.1, §fp8-kv.4, DESIGN.md
//! D4–D6, D10, D12, D13.
//!
//! For request `i` with `n_i` rows and KV length `L_i`, row `j` sits at
//! `x = L_i − n_i + j`; query head `h` reads KV head `h / G`:
//!
//! ```text
//! Vis(x)  = { k : max(0, x − W) ≤ k ≤ x }            (W = window_left, None = no lower bound)
//! s_k     = bmm1_scale · q·K[slot(k)],   slot(k) = page_table[i, k / P]·P + k % P
//! out     = bmm2_scale · Σ exp(s_k − m)·V_k / (Σ exp(s_k − m) + exp(σ_h − m))
//! ```
//!
//! - `q [num_tokens, Hq, D]` and `out` (same shape) are bf16 or f16 (as `u16`
//!   bits, [`HalfDtype`]); K and V are `[num_pages, Hkv, P, D]` strided views of
//!   the slot-major pool, bf16/f16 or e4m3 bytes (dequantized exactly in the
//!   kernel; the FP8 scales live in `bmm1_scale`/`bmm2_scale`, D4);
//! - `D ∈ {64, 128, 256}`, `G = Hq / Hkv ≤ 16`, any `P ≥ 1`;
//! - a row with no usable key outputs zeros (D13); keys outside the rows'
//!   visible sets are never loaded (zero-filled), masked keys are selected out
//!   (never multiplied), so NaN/Inf bytes there never contribute;
//! - page ids outside `[0, num_pages)` or table entries past `max_num_pages`
//!   are never dereferenced: their keys are masked and each needed page is
//!   counted once in the device error word (D10, [`ErrorFlags`]).
//!
//! **Ragged rule** (device data, checked in the kernel and the reference):
//! request `i` is processed only if
//!
//! ```text
//! 0 ≤ cu[i] ≤ cu[i+1] ≤ num_tokens,   cu[i+1] − cu[i] ≤ max_q_len,
//! cu[i] ≥ cu[k] for every k < i          (prefix maximum)
//! ```
//!
//! (`cu = cu_seqlens_q`). Otherwise it is skipped — its rows are left
//! untouched — and counted once in the error word
//! ([`ErrorFlags::BAD_CU_SEQLENS`], or [`ErrorFlags::Q_LEN_TOO_LONG`] for a
//! well-formed but too long range). The prefix-maximum condition makes the
//! row ranges of any two processed requests disjoint (a processed `j > i`
//! starts at `cu[j] ≥ cu[i+1]`), so no output row is ever written by two
//! CTAs; the first request of an overlap wins.
//!
//! **Kernels.** [`KernelPath::Auto`] uses the tensor-core kernel
//! (`paged_attention_mma_*`) when [`mma_supported`] holds (D 64/128 with KV
//! e4m3 or the Q dtype, D 256 / 512 with KV the Q dtype): CTA = 4 warps, 16 query rows (G heads × q rows,
//! token-major, padded) as the MMA M dimension, 64-token tiles of which each
//! warp loads and consumes its own 16-token slice through a private cp.async
//! ring (3 slots for 16-bit KV, 6 for e4m3), `mma.sync.m16n8k16` with f32
//! accumulation for `Q·Kᵀ` and `P·V`. e4m3 KV runs f16 MMAs: each K/V byte
//! is converted once (`cvt.rn.f16x2.e4m3x2`, exact) from the raw ring straight
//! into MMA fragments, and bf16 Q is scaled per row by a power of two into
//! f16 range (exact; undone on the scores). At D 256 the Q fragments are
//! read from shared memory each slice (in registers they would spill beside
//! the 128 accumulators a thread holds), one CTA per SM. At D 512 the warps
//! work in pairs on 32-token tiles: each warp of a pair loads and accumulates
//! 256 of the dims of its slice's 16 K/V rows, and the two add their partial
//! `Q·Kᵀ` through shared memory (one pair barrier a slice) before the same
//! softmax, so every K/V byte is still read once. Otherwise (e4m3 at
//! D ≥ 256, mixed 16-bit dtypes, [`KernelPath::Simt`]) the CUDA-core kernel
//! (`paged_attention_decode_*`) runs. Both share the work split, workspace
//! format and the fused split merge.
//!
//! Split-KV (flash-decoding): [`SplitMode::Auto`] picks splits from the batch
//! shape (results deterministic run to run); [`SplitMode::Fixed`] uses one
//! split size for every request (bitwise identical results independent of
//! batch composition). Splits write partials into the caller's workspace
//! ([`workspace_elems`] f32); the last CTA of each (request, KV head, row
//! tile) to finish — found with a per-item arrival counter in the workspace
//! (`atom.inc`, which wraps back to 0 on the last arrival) — folds them in a
//! fixed order and writes the rows, all in one launch. The counters (the
//! workspace's last `bs·Hkv·row_tiles` elements) must be zero before the
//! first launch (allocate the workspace zeroed) and are zero again after
//! every launch, so CUDA-graph replays stay correct.
//!
//! - [`PagedAttentionKernel`]: the typed launcher ([`DecodeArgs`]);
//! - [`reference`](mod@reference): the f64 CPU definition the GPU is tested against
//!   (output and row log-sum-exp, unsharded or over a shard of the keys);
//! - [`merge`]: the f64 merge of partial `(O, LSE)` states and the sink rule
//!   under sharding;
//! - [`cp`]: decode context parallelism by page interleave — each rank's
//!   page-table view and the whole split / merge path simulated in f64;
//! - [`merge_kernel`]: the merge-states kernel ([`MergeStatesKernel`]), the
//!   device counterpart of [`merge`].

pub mod context;
pub mod cp;
mod launch;
pub mod merge;
pub mod merge_kernel;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod reference;

pub use context::{
    context_block_rows, context_decode_path, context_duo_from_env, context_entry_name,
    context_launch_config, context_sm90_block_rows, context_sm90_consumers,
    context_sm90_cursor_fits, context_sm90_duo_entry_name, context_sm90_duo_launch_config,
    context_sm90_duo_max_keys, context_sm90_duo_smem_bytes, context_sm90_duo_stages,
    context_sm90_duo_supported, context_sm90_duo_wanted, context_sm90_entry_name,
    context_sm90_grid, context_sm90_kv_splits, context_sm90_launch_config,
    context_sm90_merge_entry_name, context_sm90_persistent, context_sm90_q_buffers,
    context_sm90_smem_bytes, context_sm90_stages, context_sm90_staging_steps,
    context_sm90_supported, context_sm90_threads, context_sm90_tile_keys, context_sm90_tma_rows,
    context_smem_bytes, context_stages, context_supported, context_trim_variant_from_env,
    context_variants, context_warps, kv_tma_layout, out_tma_layout, q_tma_layout, validate_context,
    validate_context_for, ContextArgs, ContextKernel, ContextKvLoad, ContextParams, ContextPath,
    ContextPlan, CONTEXT_DUO_ENV, CONTEXT_KERNEL_ENV, CONTEXT_KV_LOAD_ENV, CONTEXT_PTX,
    CONTEXT_SM90_DUO_ROWS, CONTEXT_SM90_DUO_THREADS, CONTEXT_SM90_DUO_TILE_KEYS,
    CONTEXT_SM90_LSE_SUFFIX, CONTEXT_SM90_PTX, CONTEXT_SM90_TRACE_CTAS, CONTEXT_SM90_TRACE_EVENTS,
    CONTEXT_SM90_TRACE_ITEMS, CONTEXT_TILE_KEYS, CONTEXT_TRIM_ENV,
};
pub use launch::{
    chunk_full, chunk_full_launch, cluster_fold_variant, entry_name, launch_config, mma_entry_name,
    mma_smem_bytes, mma_smem_bytes_xv, mma_strides_fit, mma_supported, mma_tile_tokens,
    mma_variants, mma_wide, pair_loop_variant, smem_bytes, unsplit_items_per_sm, validate,
    validate_path, workspace_elems, workspace_for, DecodeArgs, KernelPath, KvCache, LaunchPlan,
    PagedAttentionKernel, PagedAttentionParams, QueryLayout, SplitMode, BLOCK_THREADS,
    DECODE_CLUSTER_FOLD_ENV, DECODE_EXPERIMENT_ENV, DECODE_LENGTH_ORDER_ENV, DECODE_PAIR_LOOP_ENV,
    DECODE_PDL_ENV, DECODE_UNIT_ORDER_ENV, DECODE_WIDE_MMA_ENV, MAX_GROUP, MMA_HEAD_DIMS,
    MMA_TILE_TOKENS, ROWS_PER_CTA, TILE_TOKENS, UNSPLIT_ITEMS_PER_SM, UNSPLIT_ITEMS_PER_SM_FP8,
};
pub use merge_kernel::{
    merge_entry_name, merge_plan, MergeStatesArgs, MergeStatesKernel, MergeStatesParams,
    MERGE_MAX_PARTS, MERGE_PTX, MERGE_THREADS,
};
pub use reference::HalfDtype;

/// The embedded PTX of this family (`cargo xtask ptx-build`).
pub const PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "paged_attention",
    ptx: include_str!("../ptx/paged_attention.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/paged_attention.sm_90.cubin"),
        stamp: include_str!("../ptx/paged_attention.sm_90.cubin.stamp"),
    }),
};

/// The C header generated from this crate's params structs and error flags
/// (`cargo xtask abi`; the kernels include it, a CPU test checks it is current).
/// The decode kernel names the flags `PA_*`, the context kernels `PAC_*`
/// (one set, the same bits).
pub const ABI: kernel_rt::abi::Header = kernel_rt::abi::Header {
    path: "kernels/paged_attention_abi.cuh",
    rust_crate: "paged_attention",
    flag_sets: &[
        kernel_rt::abi::FlagSet {
            rust: "ErrorFlags",
            c_prefix: "PA_",
            flags: ErrorFlags::ABI,
        },
        kernel_rt::abi::FlagSet {
            rust: "ErrorFlags",
            c_prefix: "PAC_",
            flags: ErrorFlags::ABI,
        },
    ],
    structs: &[
        launch::PagedAttentionParams::ABI,
        context::ContextParams::ABI,
        merge_kernel::MergeStatesParams::ABI,
    ],
};

/// Head dims that every kernel family serves (decode / verify and context
/// kernels).
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Head dims of the decode / verify kernels: [`HEAD_DIMS`] and 512 (Gemma-
/// style global layers; tensor cores for 16-bit K/V of the Q dtype,
/// [`MMA_HEAD_DIMS`], the CUDA-core kernel for e4m3). A context call
/// ([`ContextKernel::launch`]) at 512 runs the decode kernel's ragged path
/// ([`context_decode_path`]): no context entry serves it.
pub const DECODE_HEAD_DIMS: [usize; 4] = [64, 128, 256, 512];

/// Kernel entry point names used by the launcher (pinned by a CPU test):
/// `paged_attention_decode_{q}_kv_{kv}_d{D}` and the tensor-core `paged_attention_mma_{q}_kv_{kv}_d{D}` ([`mma_variants`]).
pub fn kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for q in [HalfDtype::Bf16, HalfDtype::F16] {
        for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
            for d in DECODE_HEAD_DIMS {
                v.push(entry_name(q, kv, d));
            }
        }
    }
    for (q, kv, d) in mma_variants() {
        v.push(mma_entry_name(q, kv, d));
    }
    v
}

/// Element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// bfloat16 (`u16` bits).
    Bf16,
    /// IEEE binary16 (`u16` bits).
    F16,
    /// `float8_e4m3fn` bytes.
    E4m3,
}

impl KvDtype {
    /// Name used in kernel entry names.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::E4m3 => "e4m3",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::E4m3 => 1,
            _ => 2,
        }
    }

    /// Whether the tensor-core and context kernels take this K/V dtype with
    /// a `q` query: e4m3 with either, a 16-bit K/V only of the query's dtype.
    pub fn goes_with(self, q: HalfDtype) -> bool {
        match self {
            Self::E4m3 => true,
            Self::Bf16 => q == HalfDtype::Bf16,
            Self::F16 => q == HalfDtype::F16,
        }
    }
}

/// Flag bits of the paged-attention family in the device error word
/// (generated for C as `PA_*` into `kernels/paged_attention_abi.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorFlags(u32);

kernel_rt::abi_flags! {
    impl ErrorFlags {
        /// Ragged mode: `cu_seqlens_q[i] < 0`, `cu_seqlens_q[i+1] < cu_seqlens_q[i]`,
        /// `cu_seqlens_q[i+1] > num_tokens`, or `cu_seqlens_q[i] < cu_seqlens_q[k]`
        /// for some `k < i` (rows overlapping an earlier request): the request is
        /// skipped, its rows untouched (once per request). See the crate docs.
        pub const BAD_CU_SEQLENS: Self = Self(1);
        /// Ragged mode: `n_i = cu_seqlens_q[i+1] − cu_seqlens_q[i] > max_q_len`:
        /// the request is skipped, its rows untouched (once per request).
        pub const Q_LEN_TOO_LONG: Self = Self(2);
        /// `cache_seqlens[i] < 0`: read as 0 (once per request).
        pub const NEGATIVE_SEQLEN: Self = Self(4);
        /// A needed page (one overlapping `[k_lo, L)`) lies past `max_num_pages`
        /// or its id is outside `[0, num_pages)`: its keys are masked (once per page, D10).
        pub const BAD_PAGE: Self = Self(8);
        /// `unit_order[z]` (a CTA's request in a launch given
        /// `DecodeArgs::unit_order`) lies outside `[0, bs)`: that CTA does
        /// nothing (once per such entry).
        pub const BAD_UNIT_ORDER: Self = Self(16);
    }
}

impl ErrorFlags {
    /// The raw bit.
    pub const fn bits(self) -> u32 {
        self.0
    }
}
