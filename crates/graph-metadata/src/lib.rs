//! # graph-metadata
//!
//! mha-kit kernel family: **one launch** that rebuilds every per-replay
//! metadata buffer of a CUDA-graph bucket of `bs` rows (real rows followed by
//! padding rows), for every graph forward mode. It is recorded inside the
//! captured graph, so each replay re-reads the live contents of its input
//! buffers; it does no host synchronisation, no allocation and no copy.
//! Spec: `SEMANTICS.md` §graph-metadata, SEMANTICS.md §backend.4, DESIGN.md D1–D3.
//!
//! For `i` in `0..bs`, with `offset` and `q_stride` from [`GraphMode`]:
//!
//! ```text
//! cache_seqlens[i]   = seq_lens[i] + offset                        [bs]     i32
//! cu_seqlens_k[0]    = 0;  cu_seqlens_k[i+1] = Σ_{k≤i} cache_seqlens[k]  [bs+1] i32
//! cu_seqlens_q[i]    = i · q_stride            (when bound)        [bs+1]   i32
//! n_i                = min(ceil(cache_seqlens[i] / P), M)
//! page_table[i, p]   = req_to_token[r_i, p·P] / P          p < n_i [bs, M]  i32
//! swa_page_table[i,p]= swa_mapping[req_to_token[r_i, p·P]] / P     [bs, M]  i32
//!                      (or full_page_to_swa_page[req_to_token[r_i, p·P] / P], below)
//! swa_out_cache_loc[j] = swa_mapping[out_cache_loc[j]]  (j < n_real), 0 after  [n_swa] i64
//! ```
//!
//! Only each row's live prefix `p < n_i` of the page tables is written; the
//! rest keeps its previous (stale) values, which attention never reads. Every
//! other output is rewritten whole at every launch — entry 0 of both prefix
//! sums included (D1), so no buffer needs zeroing, and the whole of
//! `swa_out_cache_loc` (padding tokens get the dummy slot 0).
//!
//! Where mha-kit differs from upstream: `cu_seqlens_q` is written by the
//! kernel (stride 1 for decode modes, the captured `q_len = num_tokens / bs`
//! for target verify and draft extend, D2) whenever the caller binds it, so
//! no preset is needed; padding rows always read request row 0 with
//! `seq_len = 1` ([`prepare_replay`], D3).
//!
//! ## SWA page map (optional fast path)
//!
//! The SWA page table normally gathers one 8-byte entry of the full→SWA
//! *slot* map per live page (`swa_mapping`, `[size + P + 1]` i64, 8 bytes
//! per full slot). For a large pool that map is bigger than the L2 cache
//! (a 32k-token × 256-row pool: ≥ 67 MB), so every gather is a DRAM read on
//! the critical path. The caller may instead pass a **page-level map**
//! ([`SwaArgs::full_page_to_swa_page`], `[num_full_pages]` i32: full page →
//! SWA page, 0 = unmapped → the dummy page), `P` times fewer entries of half
//! the width (≈ 2 MB for that pool with `P = 16`: L2-resident). Then
//!
//! ```text
//! slot                 = req_to_token[r_i, p·P]
//! swa_page_table[i, p] = -1                                   if slot < 0
//!                      = 0  (counted as SLOT_OUTSIDE_MAP)     if slot / P ≥ num_full_pages
//!                      = max(full_page_to_swa_page[slot / P], -1)  otherwise
//! ```
//!
//! **Precondition** (not checked by the kernel): the slot map is
//! page-granular — each full page `F` is unmapped (all its entries 0) or
//! `swa_mapping[F·P + o] = S·P + o` for every offset `o` (SEMANTICS.md §swa-pool.2) —
//! the page map holds that `S` (0 when unmapped) at `F`, and
//! `num_full_pages · P = N_map − 1`. Then both paths give the same table,
//! entry for entry and event for event ([`reference::page_map_from_slot_map`]
//! builds the page map from a slot map, `None` when no page map reproduces
//! it; the CPU reference of this path is
//! [`reference::update_graph_metadata_with_page_map`]).
//! The paired allocator (swa-pool's `SwaMapping`, whose `page_map()` gives
//! this map) maintains page granularity, and the paged allocator keeps
//! `req_to_token` page-contiguous (SEMANTICS.md §page-table.2), so the entry is the
//! SWA page of every token of the live page. Without the page map the
//! slot-map path runs unchanged. `swa_out_cache_loc` always translates
//! through the slot map (per token, a few hundred gathers).
//!
//! Device data the host cannot see is checked in the kernel and counted in
//! the device error word ([`kernel_rt::DeviceErrors`], flags [`ErrorFlags`]),
//! with the same decisions as the page-table family (D9, D11). Nothing is
//! ever read or written out of bounds.
//!
//! - [`GraphMetadataKernel`]: the typed launcher ([`GraphMetadataArgs`]);
//! - [`GraphMode`]: the forward mode (offset and query stride);
//! - [`prepare_replay`]: the host-side padding of a batch to its bucket;
//!   [`pad_ragged_verify_lens`]: the padding of ragged verify lengths
//!   (SEMANTICS.md §backend.5), whose metadata the same kernel writes eagerly;
//! - [`reference`](mod@reference): the CPU definition the GPU must match bit for bit.

mod launch;
mod mode;
pub mod reference;
mod replay;

pub use launch::{
    launch_config, validate, GraphMetadataArgs, GraphMetadataKernel, GraphMetadataParams,
    LaunchPlan, SwaArgs, SwaWriteLocs, BLOCK_THREADS, TARGET_PAGE_BLOCKS,
};
pub use mode::GraphMode;
pub use replay::{
    check_ragged_q_lens, pad_ragged_verify_lens, prepare_replay, ReplayInputs, PAD_OUT_CACHE_LOC,
    PAD_REQUEST_INDEX, SEQ_LEN_FILL,
};

/// The embedded PTX of this family (`cargo xtask ptx-build`).
pub const PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "graph_metadata",
    ptx: include_str!("../ptx/graph_metadata.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/graph_metadata.sm_90.cubin"),
        stamp: include_str!("../ptx/graph_metadata.sm_90.cubin.stamp"),
    }),
};

/// The C header generated from this crate's params structs and error flags
/// (`cargo xtask abi`; the kernels include it, a CPU test checks it is current).
pub const ABI: kernel_rt::abi::Header = kernel_rt::abi::Header {
    path: "kernels/graph_metadata_abi.cuh",
    rust_crate: "graph_metadata",
    flag_sets: &[kernel_rt::abi::FlagSet {
        rust: "ErrorFlags",
        c_prefix: "GM_",
        flags: ErrorFlags::ABI,
    }],
    structs: &[launch::GraphMetadataParams::ABI],
};

/// Kernel entry point names used by the launcher (pinned by a CPU test).
pub const KERNEL_NAMES: &[&str] = &["graph_metadata_update"];

/// Bench-only baseline: the same metadata built by one simple kernel per
/// output (`kernels/graph_metadata_unfused.cu`). Not used by the launcher.
#[doc(hidden)]
pub const UNFUSED_PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "graph_metadata_unfused",
    ptx: include_str!("../ptx/graph_metadata_unfused.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/graph_metadata_unfused.sm_90.cubin"),
        stamp: include_str!("../ptx/graph_metadata_unfused.sm_90.cubin.stamp"),
    }),
};

/// Entry points of [`UNFUSED_PTX`], in launch order.
#[doc(hidden)]
pub const UNFUSED_KERNEL_NAMES: &[&str] = &[
    "graph_metadata_unfused_cache_seqlens",
    "graph_metadata_unfused_cu_seqlens_k",
    "graph_metadata_unfused_cu_seqlens_q",
    "graph_metadata_unfused_page_table",
    "graph_metadata_unfused_swa_page_table",
    "graph_metadata_unfused_swa_out_cache_loc",
];

/// Flag bits of the graph-metadata family in the device error word
/// (generated for C as `GM_*` into `kernels/graph_metadata_abi.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorFlags(u32);

kernel_rt::abi_flags! {
    impl ErrorFlags {
        /// `seq_lens[i] + offset` outside `[0, i32::MAX]`: `cache_seqlens[i]` is
        /// clamped into that range (once per row).
        pub const SEQLEN_OUT_OF_RANGE: Self = Self(1);
        /// `Σ cache_seqlens > i32::MAX`: `cu_seqlens_k` keeps the low 32 bits of
        /// each sum (SEMANTICS.md §graph-metadata.5: sums are 32-bit) (once per launch).
        pub const SUM_OVERFLOW: Self = Self(2);
        /// `req_pool_indices[i]` outside `[0, R)`: the row's page-table entries
        /// are skipped (once per row).
        pub const BAD_REQUEST_INDEX: Self = Self(4);
        /// `ceil(L / P) > M`: the row is clamped to the table width (once per row, D11).
        pub const ROW_CLAMPED: Self = Self(8);
        /// A live page would read position `p·P ≥ W` of its `req_to_token` row:
        /// clamped to `ceil(W / P)` pages (once per row).
        pub const ROW_PAST_WIDTH: Self = Self(16);
        /// A negative sampled slot: full page 0, SWA page −1 (once per entry, D9).
        pub const NEGATIVE_SLOT: Self = Self(32);
        /// A sampled slot at or past `pool_slots`: full page 0 (once per entry, D9).
        pub const SLOT_OUTSIDE_POOL: Self = Self(64);
        /// A sampled slot at or past `N_map − 1` (page-map path: `slot / P` at
        /// or past the page map's length): SWA page 0 (once per entry, D9).
        pub const SLOT_OUTSIDE_MAP: Self = Self(128);
        /// `out_cache_loc[j]` at or past `N_map − 1`: SWA location 0 (once per token).
        pub const LOC_OUTSIDE_MAP: Self = Self(256);
        /// Ragged verify: `qlens[i]` outside `[0, max_q_len]`, clamped into it
        /// (once per row; SEMANTICS.md §backend.5 decision).
        pub const QLEN_OUT_OF_RANGE: Self = Self(512);
    }
}

impl ErrorFlags {
    /// The raw bit.
    pub const fn bits(self) -> u32 {
        self.0
    }
}
