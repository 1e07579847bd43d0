//! # swa-pool
//!
//! mha-kit kernel family for hybrid models whose sliding-window (SWA) layers
//! keep their KV in a second, smaller pool (`SEMANTICS.md` §swa-pool).
//! The scheduler, `req_to_token` and `out_cache_loc` speak only the *full*
//! index space; SWA layers need every location translated through the
//! full→SWA slot map `full_to_swa` (`[size + P + 1]` i64, 0 = unmapped, last
//! element the −1 sentinel).
//!
//! Two kernels, one launch each, graph-capturable (no host sync, no
//! allocation, no copy):
//!
//! ```text
//! swa_loc[i]            = full_to_swa[out_cache_loc[i]]            (§swa-pool.3; −1 stays −1)
//! swa_page_table[i, p]  = full_to_swa[req_to_token[r, p·P]] / P     (§swa-pool.4, SEMANTICS.md §page-table.3)
//! ```
//!
//! The page translation gathers by the full **token slot** of the page's first
//! position and then divides by `P`; it never indexes the map by a page id.
//! A read index outside `[0, N_map − 1)` is never dereferenced: −1 in a token
//! location is the sentinel and gives −1 (at every page size, `P = 1`
//! included); any other location outside the map is written as the dummy slot
//! 0 and counted in the device error word ([`kernel_rt::DeviceErrors`], flag
//! bits [`ErrorFlags`]). Page-table rows follow SEMANTICS.md §page-table.4 and
//! DESIGN.md D9/D11 (bad request index skipped, rows clamped to `M`, a
//! negative slot gives SWA page −1, an out-of-map slot gives SWA page 0; each
//! counted).
//!
//! Host side ([`SwaMapping`], [`LayersMapping`]): the map itself with
//! page-granular allocation and freeing of SWA slots for full slots,
//! eviction of out-of-window pages back to the dummy page (§swa-pool.5), and one-call
//! upload to the device. Exhaustion, out-of-range slots and double mapping
//! are typed errors ([`SwaError`]); the map is never overwritten.
//!
//! - [`SwaLocKernel`] / [`SwaLocArgs`]: token-location translation;
//! - [`SwaPageKernel`] / [`SwaPageArgs`]: page-id translation of a row set;
//! - [`SwaUpdateKernel`] / [`SwaUpdateArgs`]: the device maps updated
//!   from the changed full pages;
//! - [`reference`](mod@reference): the CPU definitions the GPU must match bit for bit.
//!
//! ## Updating the map on the device
//!
//! The map changes a whole full page at a time (allocation, freeing,
//! eviction), so a device copy is kept current from `(full_page F,
//! swa_page S)` entries, the current mapping of each page changed since the
//! last update ([`SwaMapping::changed_pages_since`] lists them): one launch
//! writes `full_to_swa[F·P + o] = S·P + o` (0 when `S = 0`) and, when given,
//! `page_map[F] = S`, so a device user uploads `16·k` bytes from pinned
//! memory for `k` changed pages instead of the whole map from pageable
//! memory (which synchronises the stream). Out-of-range pages are skipped
//! and counted ([`ErrorFlags::BAD_UPDATE`]).

mod launch;
mod mapping;
pub mod reference;
mod update;

pub use launch::{
    loc_launch_config, page_launch_config, validate_loc, validate_pages, SwaLocArgs, SwaLocKernel,
    SwaLocParams, SwaPageArgs, SwaPageKernel, SwaPageParams, BLOCK_THREADS, LOC_UNROLL,
    MAX_LOC_BLOCKS,
};
pub use mapping::{EvictionPolicy, LayersMapping, SwaError, SwaMapping};
pub use update::{
    update_launch_config, validate_update, SwaUpdateArgs, SwaUpdateKernel, SwaUpdateParams,
    UPDATE_BLOCK_THREADS,
};

/// The embedded PTX of this family (`cargo xtask ptx-build`).
pub const PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "swa_pool",
    ptx: include_str!("../ptx/swa_pool.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/swa_pool.sm_90.cubin"),
        stamp: include_str!("../ptx/swa_pool.sm_90.cubin.stamp"),
    }),
};

/// The C header generated from this crate's params structs and error flags
/// (`cargo xtask abi`; the kernels include it, a CPU test checks it is current).
pub const ABI: kernel_rt::abi::Header = kernel_rt::abi::Header {
    path: "kernels/swa_pool_abi.cuh",
    rust_crate: "swa_pool",
    flag_sets: &[kernel_rt::abi::FlagSet {
        rust: "ErrorFlags",
        c_prefix: "SWA_",
        flags: ErrorFlags::ABI,
    }],
    structs: &[
        launch::SwaLocParams::ABI,
        launch::SwaPageParams::ABI,
        update::SwaUpdateParams::ABI,
    ],
};

/// Kernel entry point names used by the launchers (pinned by a CPU test).
pub const KERNEL_NAMES: &[&str] = &[
    "swa_pool_translate_loc",
    "swa_pool_translate_pages",
    "swa_pool_update_pages",
];

/// Flag bits of the swa-pool family in the device error word
/// (generated for C as `SWA_*` into `kernels/swa_pool_abi.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorFlags(u32);

kernel_rt::abi_flags! {
    impl ErrorFlags {
        /// A read index at or past `N_map − 1` (a location or a sampled slot
        /// outside the map): written as the dummy slot / page 0 (once per entry).
        pub const OUTSIDE_MAP: Self = Self(1);
        /// A token location below −1: written as 0 (once per entry).
        pub const BELOW_SENTINEL: Self = Self(2);
        /// Page table: a negative sampled slot: SWA page −1 (once per entry).
        pub const NEGATIVE_SLOT: Self = Self(4);
        /// `req_pool_indices[i]` outside `[0, R)`: the row is skipped (once per row).
        pub const BAD_REQUEST_INDEX: Self = Self(8);
        /// `cache_seqlens[i] < 0`: the row has no live page (once per row).
        pub const NEGATIVE_SEQLEN: Self = Self(16);
        /// `ceil(L / P) > max_num_pages`: the row is clamped (once per row).
        pub const ROW_CLAMPED: Self = Self(32);
        /// A live page would read position `p·P ≥ W`: clamped to `ceil(W / P)` (once per row).
        pub const ROW_PAST_WIDTH: Self = Self(64);
        /// Map update: an entry whose full page or SWA page is out of range
        /// is skipped (once per entry).
        pub const BAD_UPDATE: Self = Self(128);
    }
}

impl ErrorFlags {
    /// The raw bit.
    pub const fn bits(self) -> u32 {
        self.0
    }
}
