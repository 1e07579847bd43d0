//! # kernel-rt
//!
//! The runtime every mha-kit kernel crate stands on, and the only crate that
//! talks to the CUDA driver (through `cudarc`, loaded at run time):
//!
//! - [`gpu_status`] / [`Gpu`]: detection that never panics (no libcuda, no
//!   device → [`KernelError::NoGpu`]), device choice by `MHA_KIT_DEVICE`, one
//!   stream per device, a per-context cache of modules and functions (each
//!   module loaded on first use, from its embedded sm_90 / sm_90a cubin on a
//!   compute capability 9.0 device, else from its PTX);
//! - [`KernelError`]: the one error type of all launchers;
//! - [`Strided`] / [`StridedMut`]: host-validated strided views of device
//!   buffers (`[bs, max_num_pages]` tables, `[slots, num_kv_heads, head_dim]`
//!   caches);
//! - [`ExternalBuffer`]: device memory owned by another library (an
//!   engine's torch tensors) under the same views, never freed here; with
//!   [`Gpu::borrowed_stream`] (the engine's stream, checked to be of this
//!   context) every launcher's `launch_on` runs on engine memory, in the
//!   engine's stream order and CUDA-graph capture;
//! - [`DeviceErrors`]: the device error word kernels count bad indices in;
//! - [`timing`]: CUDA-event timing (median of N, criterion `iter_custom`);
//! - [`testing`]: the libtest-mimic GPU test harness (ignored without a GPU);
//! - [`tma`]: tensor maps for Hopper bulk tensor copies (`cuTensorMapEncodeTiled`);
//! - [`launch`]: `Launcher` (entries resolved once, stream check, launch
//!   count) and launches with programmatic dependent launch;
//! - [`abi`]: the params structs and error flags defined once in Rust
//!   ([`abi_struct!`], [`abi_flags!`]) and the C header generated from them
//!   (`cargo xtask abi`);
//! - `include/mha_kit/*.cuh`: device headers shared by all kernels (vector
//!   loads, index helpers, the error word). [`INCLUDE_DIR`] points at them.
//!
//! PTX and cubins are produced by `cargo xtask ptx-build` and embedded by
//! each kernel crate with `include_str!` / `include_bytes!`; building needs no
//! CUDA toolkit.

pub mod abi;
mod error;
mod errword;
mod external;
mod gpu;
pub mod launch;
pub mod ptxhash;
mod tensor;
pub mod testing;
pub mod timing;
pub mod tma;

pub use cudarc;
pub use error::{KernelError, Result};
pub use errword::{DeviceErrors, ErrorReport, ERROR_WORD_LEN};
pub use external::{span_elems, ExternalBuffer};
pub use gpu::{
    gpu_available, gpu_status, Cubin, CubinArch, Gpu, GpuStatus, ModuleLoad, ModuleSource,
    PtxModule, DEVICE_ENV, MODULE_LOAD_ENV,
};
pub use tensor::{check_view_bounds, row_major, Strided, StridedMut};

/// Path of the shared device headers (`crates/kernel-rt/include`), for the
/// PTX build.
pub const INCLUDE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/include");

/// Elements per launch-geometry limit: CUDA's grid `y`/`z` extent.
pub const MAX_GRID_YZ: u32 = 65_535;

/// Converts a host size to the kernel's `i32`, naming the argument when it
/// does not fit.
///
/// # Errors
/// [`KernelError::Unsupported`].
pub fn to_i32(arg: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| KernelError::unsupported(arg, format!("{v} does not fit in i32")))
}

/// Converts a host size to the kernel's `i64`, naming the argument when it
/// does not fit.
///
/// # Errors
/// [`KernelError::Unsupported`].
pub fn to_i64(arg: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| KernelError::unsupported(arg, format!("{v} does not fit in i64")))
}

/// Converts a launch-geometry count to `u32`, naming the argument on overflow.
///
/// # Errors
/// [`KernelError::Unsupported`] when `n` does not fit in `limit`.
pub fn grid_dim(arg: &'static str, n: usize, limit: u32) -> Result<u32> {
    u32::try_from(n)
        .ok()
        .filter(|&v| v <= limit)
        .ok_or_else(|| KernelError::unsupported(arg, format!("{n} exceeds the grid limit {limit}")))
}
