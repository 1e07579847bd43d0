//! Typed launcher of `req_to_token_scatter`: the device copy of
//! `req_to_token` updated from a short list of changed entries instead of
//! re-uploading whole rows (see the crate docs, "Updating req_to_token").

use std::sync::Arc;

use kernel_rt::cudarc::driver::{DeviceRepr, LaunchConfig};
use kernel_rt::launch::Launcher;
use kernel_rt::{grid_dim, to_i64, DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut};

use crate::PTX;

/// Threads per block of the scatter.
pub const SCATTER_BLOCK_THREADS: u32 = 256;
/// Most blocks of one scatter launch (grid-stride beyond): one wave on an H200.
const SCATTER_MAX_BLOCKS: usize = 132 * 8;

kernel_rt::abi_struct! {
    /// Kernel parameters, defined for C in the generated
    /// `kernels/page_table_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct ScatterParams {
        /// `i32*` `[R, W]`.
        pub req_to_token: u64 = "i32*",
        /// `const i64*` `[n, 2]`.
        pub entries: u64 = "const i64*",
        /// `u32*` `[2]` error word.
        pub errors: u64 = "u32*",
        /// `R`.
        pub req_to_token_rows: i64 = "i64",
        /// `W`.
        pub req_to_token_width: i64 = "i64",
        /// Row stride of `req_to_token`, elements.
        pub req_to_token_stride: i64 = "i64",
        /// Entries.
        pub n: i64 = "i64",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/page_table_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for ScatterParams {}

/// Arguments of one scatter (device buffers on the launcher's GPU).
#[derive(Debug)]
pub struct ScatterArgs<'a> {
    /// `[R, W]` i32 slots, updated in place; any row stride, last dim contiguous.
    pub req_to_token: StridedMut<'a, i32, 2>,
    /// `[n, 2]` i64, contiguous, base 16-byte aligned: `(position, slot)`
    /// pairs with `position = row · W + column` (row-major over `[R, W]`,
    /// independent of the row stride) and `slot` an i32 value. Each entry
    /// sets `req_to_token[row, column] = slot`. Two entries with one
    /// position: which one lands is unspecified.
    pub entries: Strided<'a, i64, 2>,
}

/// Launch geometry: 1-D grid of [`SCATTER_BLOCK_THREADS`] threads, one entry
/// per thread up to one wave (at most 1,056 blocks), grid-stride beyond.
///
/// # Errors
/// None in practice (the grid is clamped); the `Result` is the shape of
/// every family's `launch_config`.
pub fn scatter_launch_config(n: usize) -> Result<LaunchConfig> {
    let blocks = n
        .div_ceil(SCATTER_BLOCK_THREADS as usize)
        .clamp(1, SCATTER_MAX_BLOCKS);
    Ok(LaunchConfig {
        grid_dim: (grid_dim("entries", blocks, i32::MAX as u32)?, 1, 1),
        block_dim: (SCATTER_BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Validates `args` and returns the kernel parameters (pointers zero).
///
/// # Errors
/// [`KernelError::Shape`] when `entries` is not `[n, 2]`,
/// [`KernelError::Stride`] when a layout rule is broken.
pub fn validate_scatter(args: &ScatterArgs<'_>) -> Result<ScatterParams> {
    let [rows, width] = args.req_to_token.shape();
    let [n, two] = args.entries.shape();
    if two != 2 {
        return Err(KernelError::shape(
            "entries",
            "[n, 2]",
            format!("[{n}, {two}]"),
        ));
    }
    args.req_to_token.require_last_contiguous()?;
    args.entries.require_contiguous()?;
    Ok(ScatterParams {
        req_to_token_rows: to_i64("req_to_token", rows)?,
        req_to_token_width: to_i64("req_to_token", width)?,
        req_to_token_stride: to_i64("req_to_token", args.req_to_token.strides()[0])?,
        n: to_i64("entries", n)?,
        ..Default::default()
    })
}

/// The scatter launcher (function resolved once; stream-ordered launches,
/// no host sync, no allocation).
#[derive(Debug)]
pub struct ScatterKernel {
    kernel: Launcher,
}

impl ScatterKernel {
    /// Loads `req_to_token_scatter` on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Self {
            kernel: Launcher::new(gpu, &PTX, &["req_to_token_scatter"])?,
        })
    }

    /// Kernel launches issued so far.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// Writes every entry of `args.entries` into `args.req_to_token`; `n == 0`
    /// launches nothing. An entry whose position is outside `[0, R·W)` or
    /// whose slot does not fit i32 is skipped and counted in `errors`
    /// ([`crate::ErrorFlags::BAD_ENTRY`]), never written through.
    ///
    /// # Errors
    /// As [`validate_scatter`]; [`KernelError::Stride`] when `entries` is
    /// not 16-byte aligned; [`KernelError::Driver`] when the launch fails.
    pub fn launch(&self, args: &mut ScatterArgs<'_>, errors: &mut DeviceErrors) -> Result<()> {
        let mut params = validate_scatter(args)?;
        if params.n == 0 {
            return Ok(());
        }
        let cfg = scatter_launch_config(params.n as usize)?;
        let stream = self.kernel.gpu().stream();
        params.entries = args.entries.device_ptr(stream);
        if params.entries % 16 != 0 {
            return Err(KernelError::Stride {
                arg: "entries",
                detail: "base address must be 16-byte aligned".into(),
            });
        }
        params.req_to_token = args.req_to_token.device_ptr_mut(stream);
        params.errors = errors.device_ptr();
        // SAFETY: `validate_scatter` checked both views against their
        // buffers; every position is range-checked in the kernel before the
        // write, `entries` is read as [n, 2] within its buffer and 16-byte
        // aligned; the params layout is pinned.
        unsafe { self.kernel.launch(stream, 0, cfg, &params) }?;
        Ok(())
    }
}
