//! # page-table
//!
//! mha-kit kernel family: builds the paged-attention **page table** (block
//! table) from the request-to-token pool in one launch, and in the same launch
//! the **SWA page table** when a full→SWA slot map is given.
//!
//! For every batch row `i` with `L = cache_seqlens[i]`, `n = ceil(L / P)` and
//! `r = req_pool_indices[i]` (SEMANTICS.md §page-table.3):
//!
//! ```text
//! page_table[i, p]     = req_to_token[r, p * P] / P                 for p < n
//! swa_page_table[i, p] = full_to_swa[req_to_token[r, p * P]] / P    (−1 stays −1)
//! ```
//!
//! Only each row's live prefix is written; entries `p ≥ n` keep what the
//! buffer held. Any page size `P ≥ 1` works (DESIGN.md D16; upstream
//! restricts `P` to divisors of 4096 and the server to 16/32/64).
//!
//! Device data the host cannot see is checked in the kernel and counted in the
//! device error word ([`kernel_rt::DeviceErrors`]; flag bits [`ErrorFlags`]):
//! a request index outside `[0, R)` skips the row; a row needing more than
//! `max_num_pages` pages, or pages past the row's `W` tokens, is clamped
//! (DESIGN.md D11); a negative slot gives page 0 in the full table and −1 in
//! the SWA table, a slot past the pool gives page 0, a slot past the SWA map
//! gives SWA page 0 (D9). Nothing is ever read or written out of bounds.
//!
//! ## Updating req_to_token (mha-kit addition, not in the spec)
//!
//! An engine that keeps `req_to_token` on the host and mirrors it on the
//! device should not re-upload whole rows every step: a decode step changes
//! one entry per request. [`ScatterKernel`] (`req_to_token_scatter`) applies
//! a list of `(position, slot)` pairs, `position = row · W + column`, to the
//! device copy: `req_to_token[row, column] = slot`. The list is uploaded
//! from pinned memory (asynchronous, no stream sync); entries out of range
//! are skipped and counted (`BAD_ENTRY`). mha-backend's CUDA executor uses it.
//!
//! - [`PageTableKernel`]: the typed launcher ([`PageTableArgs`]);
//! - [`ScatterKernel`]: the `req_to_token` update ([`ScatterArgs`]);
//! - [`reference`](mod@reference): the CPU definition the GPU must match bit for bit.

mod launch;
pub mod reference;
mod scatter;

pub use launch::{
    launch_config, validate, PageTableArgs, PageTableKernel, PageTableParams, SwaTables,
    BLOCK_THREADS, PAGES_PER_THREAD,
};
pub use scatter::{
    scatter_launch_config, validate_scatter, ScatterArgs, ScatterKernel, ScatterParams,
    SCATTER_BLOCK_THREADS,
};

/// The embedded PTX of this family (`cargo xtask ptx-build`).
pub const PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "page_table",
    ptx: include_str!("../ptx/page_table.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/page_table.sm_90.cubin"),
        stamp: include_str!("../ptx/page_table.sm_90.cubin.stamp"),
    }),
};

/// The C header generated from this crate's params structs and error flags
/// (`cargo xtask abi`; the kernels include it, a CPU test checks it is current).
pub const ABI: kernel_rt::abi::Header = kernel_rt::abi::Header {
    path: "kernels/page_table_abi.cuh",
    rust_crate: "page_table",
    flag_sets: &[kernel_rt::abi::FlagSet {
        rust: "ErrorFlags",
        c_prefix: "PT_",
        flags: ErrorFlags::ABI,
    }],
    structs: &[launch::PageTableParams::ABI, scatter::ScatterParams::ABI],
};

/// Kernel entry point names used by the launcher (pinned by a CPU test).
pub const KERNEL_NAMES: &[&str] = &["page_table_build", "req_to_token_scatter"];

/// Flag bits of the page-table family in the device error word
/// (generated for C as `PT_*` into `kernels/page_table_abi.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorFlags(u32);

kernel_rt::abi_flags! {
    impl ErrorFlags {
        /// `req_pool_indices[i]` outside `[0, R)`: the row is skipped (counted once per row).
        pub const BAD_REQUEST_INDEX: Self = Self(1);
        /// `cache_seqlens[i] < 0`: the row has no live page (once per row).
        pub const NEGATIVE_SEQLEN: Self = Self(2);
        /// `ceil(L / P) > max_num_pages`: the row is clamped to the table width (once per row).
        pub const ROW_CLAMPED: Self = Self(4);
        /// A live page would read position `p·P ≥ W` of its `req_to_token` row:
        /// the row is clamped to `ceil(W / P)` pages (once per row).
        pub const ROW_PAST_WIDTH: Self = Self(8);
        /// A negative slot: full page 0, SWA page −1 (once per entry).
        pub const NEGATIVE_SLOT: Self = Self(16);
        /// A slot at or past `pool_slots`: full page 0 (once per entry).
        pub const SLOT_OUTSIDE_POOL: Self = Self(32);
        /// A slot at or past `N_map − 1`: SWA page 0 (once per entry).
        pub const SLOT_OUTSIDE_MAP: Self = Self(64);
        /// Scatter: an entry's position is outside `[0, R·W)` or its slot does
        /// not fit i32; the entry is skipped (once per entry).
        pub const BAD_ENTRY: Self = Self(128);
    }
}

impl ErrorFlags {
    /// The raw bit.
    pub const fn bits(self) -> u32 {
        self.0
    }
}
