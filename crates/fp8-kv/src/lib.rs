//! # fp8-kv
//!
//! mha-kit kernel family: **KV-cache writes** into one layer's K and V
//! buffers, and the **K/V scale rules** shared by the write and by attention
//! (`SEMANTICS.md` §fp8-kv, DESIGN.md D7, D8).
//!
//! ## Layout (SEMANTICS.md §fp8-kv.1)
//! Per layer, K and V caches are `[S, Hkv, D]` ("NHD", slot-major), `S` a
//! multiple of the page size `P`: slot `s` is page `s / P`, offset `s % P`,
//! and element `(s, h, d)` sits at offset `s·slot_stride + h·head_stride + d`
//! (for a contiguous cache `s·Hkv·D + h·D + d`). Offsets are 64-bit
//! everywhere: a pool may hold more than 2³¹ elements.
//!
//! ## Writes (one launch each, K and V together; [`KvWriteKernel`])
//! For every token `t < n` with `loc = cache_loc[t]`, head `h`, dim `d`:
//!
//! ```text
//! set_kv_buffer (bf16/f16 cache):   K[loc, h, d] = k[t, h, d]                 (bit copy)
//! fused FP8 write (e4m3 cache):     K[loc, h, d] = e4m3_satfinite(f32(k[t,h,d]) · inv_k)
//!                                   inv_k = f32(1 / k_scale)   (one f32 rounding each)
//! ```
//!
//! and the same for V with `inv_v`. `e4m3_satfinite` rounds to nearest even,
//! saturates finite overflow and ±∞ to ±448 and maps every NaN to `0x7F`
//! ([`codec::e4m3_encode_satfinite`]). Accesses are 16 bytes wide when
//! `head_dim` and every pointer and stride allow it (8 elements for the copy,
//! 16 for the FP8 write), one element otherwise.
//!
//! Engine-owned caches in a page layout ([`PagedKvWriteArgs`]: a
//! `[num_pages, Hkv, P, D]` view with any page / head / token strides, so
//! NHD `[num_pages, P, Hkv, D]`, HND `[num_pages, Hkv, P, D]` and padded
//! pages alike) are written by the same kernels: slot `s` lands at page
//! `s / P`, token `s % P` ([`KvWriteKernel::set_kv_buffer_paged`],
//! [`KvWriteKernel::fused_fp8_set_kv_buffer_paged`]; references
//! [`reference::set_kv_buffer_paged`], [`reference::fused_fp8_set_kv_buffer_paged`]).
//!
//! A slot outside `[0, S)` (negative or `≥ S`) is never written: the token is
//! skipped (K and V) and counted once in the device error word
//! ([`kernel_rt::DeviceErrors`], flags [`ErrorFlags`]; SEMANTICS.md §fp8-kv.3 decision,
//! edge case 34). Duplicate slots in one call: last writer unspecified.
//!
//! ## Scales ([`KvScales`], DESIGN.md D8)
//! One `(k_scale, v_scale)` f32 pair per layer, resolved once at setup from a
//! float or a one-element device tensor (read once, then never per step);
//! missing, `≤ 0`, NaN or `+∞` → 1.0 (`+∞`: mha-kit's choice, its reciprocal would zero the cache); caches that are not e4m3 ignore checkpoint
//! scales. The same pair gives the write's reciprocals and attention's
//! `bmm1_scale = q_scale · k_scale · sm_scale`, `bmm2_scale = v_scale`.
//!
//! - [`KvWriteKernel`]: the typed launcher ([`KvWriteArgs`]);
//! - [`codec`]: the host e4m3 codec (the `float8` crate plus the NaN rule);
//! - [`reference`](mod@reference): the CPU definition the GPU must match bit for bit.

pub mod codec;
mod launch;
pub mod reference;
mod scales;

pub use launch::{
    chunk_elems, launch_config, validate, validate_paged, vectorizable, KvDtype, KvWriteArgs,
    KvWriteKernel, KvWriteParams, PagedKvWriteArgs, ViewAlignment, WriteGeometry, BLOCK_THREADS,
    RESIDENT_THREADS_PER_SM, TOKENS_IN_FLIGHT,
};
pub use scales::{resolve_scale, KvCacheDtype, KvScales, ScaleInput};

/// The embedded PTX of this family (`cargo xtask ptx-build`).
pub const PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "fp8_kv",
    ptx: include_str!("../ptx/fp8_kv.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/fp8_kv.sm_90.cubin"),
        stamp: include_str!("../ptx/fp8_kv.sm_90.cubin.stamp"),
    }),
};

/// The C header generated from this crate's params structs and error flags
/// (`cargo xtask abi`; the kernels include it, a CPU test checks it is current).
pub const ABI: kernel_rt::abi::Header = kernel_rt::abi::Header {
    path: "kernels/fp8_kv_abi.cuh",
    rust_crate: "fp8_kv",
    flag_sets: &[kernel_rt::abi::FlagSet {
        rust: "ErrorFlags",
        c_prefix: "KV_",
        flags: ErrorFlags::ABI,
    }],
    structs: &[launch::KvWriteParams::ABI],
};

/// Kernel entry point names used by the launcher (pinned by a CPU test).
pub const KERNEL_NAMES: &[&str] = &[
    "fp8_kv_set_kv_buffer",
    "fp8_kv_fused_fp8_write_bf16",
    "fp8_kv_fused_fp8_write_f16",
];

/// Flag bits of the fp8-kv family in the device error word
/// (generated for C as `KV_*` into `kernels/fp8_kv_abi.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorFlags(u32);

kernel_rt::abi_flags! {
    impl ErrorFlags {
        /// `cache_loc[t] < 0`: the token is skipped, K and V (counted once per token).
        pub const NEGATIVE_SLOT: Self = Self(1);
        /// `cache_loc[t] ≥ S`: the token is skipped, K and V (counted once per token).
        pub const SLOT_OUTSIDE_POOL: Self = Self(2);
    }
}

impl ErrorFlags {
    /// The raw bit.
    pub const fn bits(self) -> u32 {
        self.0
    }
}
