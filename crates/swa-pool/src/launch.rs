//! Typed launchers of `swa_pool_translate_loc` and `swa_pool_translate_pages`.

use std::sync::Arc;

use kernel_rt::cudarc::driver::{DeviceRepr, LaunchConfig};
use kernel_rt::launch::Launcher;
use kernel_rt::{
    grid_dim, to_i32, to_i64, DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut,
    MAX_GRID_YZ,
};

use crate::PTX;

/// Threads per block (both kernels; `__launch_bounds__(256)` in the .cu).
pub const BLOCK_THREADS: u32 = 256;
/// Locations per thread per grid-stride step of the location kernel
/// (`LOC_UNROLL` in the .cu).
pub const LOC_UNROLL: u32 = 4;
/// Most blocks of a location launch (≈ 15 per SM on 132 SMs); longer inputs
/// are covered by the grid-stride loop.
pub const MAX_LOC_BLOCKS: u32 = 2048;
/// Blocks the page launch aims for when rows are few.
const TARGET_PAGE_BLOCKS: usize = 1024;

kernel_rt::abi_struct! {
    /// Parameters of `swa_pool_translate_loc`, defined for C in the generated
    /// `kernels/swa_pool_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct SwaLocParams {
        /// `const i64*` `[n]`.
        pub out_cache_loc: u64 = "const i64*",
        /// `i64*` `[out_len]`.
        pub swa_loc: u64 = "i64*",
        /// `const i64*` `[N_map]`.
        pub full_to_swa: u64 = "const i64*",
        /// `u32*` `[2]` error word.
        pub errors: u64 = "u32*",
        /// Input locations `n`.
        pub n: i64 = "i64",
        /// Output length (`≥ n`); `[n, out_len)` is written 0.
        pub out_len: i64 = "i64",
        /// `N_map`.
        pub full_to_swa_len: i64 = "i64",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/swa_pool_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for SwaLocParams {}

kernel_rt::abi_struct! {
    /// Parameters of `swa_pool_translate_pages`, defined for C in the generated
    /// `kernels/swa_pool_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct SwaPageParams {
        /// `const i32*` `[R, W]`.
        pub req_to_token: u64 = "const i32*",
        /// `const i64*` `[bs]`.
        pub req_pool_indices: u64 = "const i64*",
        /// `const i32*` `[bs]`.
        pub cache_seqlens: u64 = "const i32*",
        /// `const i64*` `[N_map]`.
        pub full_to_swa: u64 = "const i64*",
        /// `i32*` `[bs, M]`.
        pub swa_page_table: u64 = "i32*",
        /// `u32*` `[2]` error word.
        pub errors: u64 = "u32*",
        /// `R`.
        pub req_to_token_rows: i64 = "i64",
        /// `W`.
        pub req_to_token_width: i64 = "i64",
        /// Row stride of `req_to_token`, elements.
        pub req_to_token_stride: i64 = "i64",
        /// Row stride of `swa_page_table`, elements.
        pub swa_page_table_stride: i64 = "i64",
        /// `N_map`.
        pub full_to_swa_len: i64 = "i64",
        /// Batch rows.
        pub bs: i32 = "i32",
        /// `M`.
        pub max_num_pages: i32 = "i32",
        /// `P`.
        pub page_size: i32 = "i32",
        /// Padding, 0.
        pub reserved: i32 = "i32",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/swa_pool_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for SwaPageParams {}

/// Arguments of one token-location translation (device buffers on the
/// launcher's GPU).
#[derive(Debug)]
pub struct SwaLocArgs<'a> {
    /// `[n]` i64 full-pool token locations, contiguous (−1 allowed: the sentinel).
    pub out_cache_loc: Strided<'a, i64, 1>,
    /// `[N_map]` i64 full→SWA slot map, contiguous, `N_map = size + P + 1 ≥ 1`,
    /// last element −1 (SEMANTICS.md §swa-pool.2; [`crate::SwaMapping::upload`]).
    pub full_to_swa: Strided<'a, i64, 1>,
    /// `[out_len]` i64 output, contiguous, `out_len ≥ n`: SWA locations for
    /// `i < n`, 0 for the tail (the fixed-size graph buffer's zero tail).
    pub swa_loc: StridedMut<'a, i64, 1>,
}

/// Arguments of one page-id translation (device buffers on the launcher's GPU).
#[derive(Debug)]
pub struct SwaPageArgs<'a> {
    /// `[R, W]` i32 full-pool slots; any row stride, last dim contiguous.
    pub req_to_token: Strided<'a, i32, 2>,
    /// `[bs]` i64, contiguous: row of `req_to_token` per request.
    pub req_pool_indices: Strided<'a, i64, 1>,
    /// `[bs]` i32, contiguous: KV length per request, tokens.
    pub cache_seqlens: Strided<'a, i32, 1>,
    /// `P ≥ 1`, tokens per page (the same for both sub-pools).
    pub page_size: usize,
    /// `[N_map]` i64 full→SWA slot map, contiguous, `N_map ≥ 1`.
    pub full_to_swa: Strided<'a, i64, 1>,
    /// `[bs, M]` i32 output, `M ≥ 1`, last dim contiguous; live prefixes written.
    pub swa_page_table: StridedMut<'a, i32, 2>,
}

/// Geometry of the location kernel for an output of `out_len` elements:
/// `ceil(out_len / (BLOCK_THREADS · LOC_UNROLL))` blocks, at most
/// [`MAX_LOC_BLOCKS`] (grid-stride beyond), at least 1.
///
/// # Errors
/// None today; the `Result` keeps the launch-geometry signature uniform.
pub fn loc_launch_config(out_len: usize) -> Result<LaunchConfig> {
    let tile = (BLOCK_THREADS * LOC_UNROLL) as usize;
    let blocks = out_len.div_ceil(tile).clamp(1, MAX_LOC_BLOCKS as usize);
    Ok(LaunchConfig {
        grid_dim: (grid_dim("swa_loc", blocks, MAX_LOC_BLOCKS)?, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Geometry of the page kernel: grid `(bs, chunks)`, `chunks` page blocks per
/// row, enough to cover `M` once when rows are few and never more than needed.
///
/// # Errors
/// [`KernelError::Unsupported`] when `bs` exceeds the grid's x limit.
pub fn page_launch_config(bs: usize, max_num_pages: usize) -> Result<LaunchConfig> {
    let per_row = max_num_pages.div_ceil(BLOCK_THREADS as usize).max(1);
    let wanted = TARGET_PAGE_BLOCKS.div_ceil(bs.max(1)).max(1);
    let chunks = per_row.min(wanted).min(MAX_GRID_YZ as usize);
    Ok(LaunchConfig {
        grid_dim: (
            grid_dim("bs", bs, i32::MAX as u32)?,
            grid_dim("max_num_pages", chunks, MAX_GRID_YZ)?,
            1,
        ),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn require_map(map: &Strided<'_, i64, 1>) -> Result<i64> {
    let n_map = map.shape()[0];
    if n_map == 0 {
        return Err(KernelError::shape(
            "full_to_swa",
            "[N_map ≥ 1] (the −1 sentinel at least)",
            "[0]",
        ));
    }
    map.require_contiguous()?;
    to_i64("full_to_swa", n_map)
}

/// Validates location-translation `args` and returns the kernel parameters
/// (pointers zero: filled at launch). Every rejection happens here.
///
/// # Errors
/// [`KernelError::Shape`] (empty map, output shorter than input),
/// [`KernelError::Stride`] (non-contiguous vector) or
/// [`KernelError::Unsupported`], naming the argument.
pub fn validate_loc(args: &SwaLocArgs<'_>) -> Result<SwaLocParams> {
    let n = args.out_cache_loc.shape()[0];
    let out_len = args.swa_loc.shape()[0];
    args.out_cache_loc.require_contiguous()?;
    args.swa_loc.require_contiguous()?;
    if out_len < n {
        return Err(KernelError::shape(
            "swa_loc",
            format!("[out_len ≥ n={n}]"),
            format!("[{out_len}]"),
        ));
    }
    Ok(SwaLocParams {
        n: to_i64("out_cache_loc", n)?,
        out_len: to_i64("swa_loc", out_len)?,
        full_to_swa_len: require_map(&args.full_to_swa)?,
        ..Default::default()
    })
}

/// Validates page-translation `args` and returns the kernel parameters
/// (pointers zero: filled at launch). Every rejection happens here.
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`] or
/// [`KernelError::Unsupported`] naming the argument.
pub fn validate_pages(args: &SwaPageArgs<'_>) -> Result<SwaPageParams> {
    let [bs, m] = args.swa_page_table.shape();
    let [rows, width] = args.req_to_token.shape();
    if args.page_size == 0 {
        return Err(KernelError::unsupported("page_size", "must be ≥ 1"));
    }
    if m == 0 {
        return Err(KernelError::unsupported(
            "swa_page_table",
            "max_num_pages (dim 1) must be ≥ 1",
        ));
    }
    args.req_to_token.require_last_contiguous()?;
    args.swa_page_table.require_last_contiguous()?;
    args.req_pool_indices.require_vector(bs, "bs")?;
    args.cache_seqlens.require_vector(bs, "bs")?;
    Ok(SwaPageParams {
        req_to_token_rows: to_i64("req_to_token", rows)?,
        req_to_token_width: to_i64("req_to_token", width)?,
        req_to_token_stride: to_i64("req_to_token", args.req_to_token.strides()[0])?,
        swa_page_table_stride: to_i64("swa_page_table", args.swa_page_table.strides()[0])?,
        full_to_swa_len: require_map(&args.full_to_swa)?,
        bs: to_i32("bs", bs)?,
        max_num_pages: to_i32("max_num_pages", m)?,
        page_size: to_i32("page_size", args.page_size)?,
        ..Default::default()
    })
}

/// Token-location translation launcher (SEMANTICS.md §swa-pool.3): the kernel function
/// is resolved once, at construction; launches are stream-ordered on the
/// GPU's stream and graph-capturable (no host sync, no allocation, no copy).
#[derive(Debug)]
pub struct SwaLocKernel {
    kernel: Launcher,
}

impl SwaLocKernel {
    /// Loads `swa_pool_translate_loc` on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Self {
            kernel: Launcher::new(gpu, &PTX, &["swa_pool_translate_loc"])?,
        })
    }

    /// Kernel launches issued so far by this launcher.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// `swa_loc[i] = full_to_swa[out_cache_loc[i]]` for `i < n` (−1 stays −1),
    /// 0 for `n ≤ i < out_len`, in one launch; `out_len == 0` launches
    /// nothing. A location below −1 or at/past `N_map − 1` is written as 0 and
    /// counted in `errors` (flags [`crate::ErrorFlags`]), never read through.
    /// Asynchronous: the buffers must stay alive until the stream is synchronised.
    ///
    /// Runs on sm_90 (compute_90 PTX; newer GPUs JIT it). Spec: SEMANTICS.md §swa-pool.3.
    ///
    /// # Errors
    /// As [`validate_loc`]; [`KernelError::Driver`] when the launch fails.
    pub fn launch(&self, args: &mut SwaLocArgs<'_>, errors: &mut DeviceErrors) -> Result<()> {
        let mut params = validate_loc(args)?;
        if params.out_len == 0 {
            return Ok(());
        }
        let cfg = loc_launch_config(params.out_len as usize)?;
        let stream = self.kernel.gpu().stream();
        params.out_cache_loc = args.out_cache_loc.device_ptr(stream);
        params.full_to_swa = args.full_to_swa.device_ptr(stream);
        params.swa_loc = args.swa_loc.device_ptr_mut(stream);
        params.errors = errors.device_ptr();
        // SAFETY: `validate_loc` checked that both vectors are contiguous, that
        // `out_len ≥ n` and `N_map ≥ 1`, and the views' constructors checked
        // their lengths, so every index the kernel forms (i < n, i < out_len,
        // map reads only in [0, N_map − 1)) is in bounds; the layout is pinned.
        unsafe { self.kernel.launch(stream, 0, cfg, &params) }?;
        Ok(())
    }
}

/// Page-id translation launcher (SEMANTICS.md §swa-pool.4, SEMANTICS.md §page-table.3): the
/// kernel function is resolved once, at construction; launches are
/// stream-ordered and graph-capturable.
#[derive(Debug)]
pub struct SwaPageKernel {
    kernel: Launcher,
}

impl SwaPageKernel {
    /// Loads `swa_pool_translate_pages` on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Self {
            kernel: Launcher::new(gpu, &PTX, &["swa_pool_translate_pages"])?,
        })
    }

    /// Kernel launches issued so far by this launcher.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// `swa_page_table[i, p] = full_to_swa[req_to_token[r_i, p·P]] / P` for
    /// the live pages `p < ceil(cache_seqlens[i] / P)` of each row, in one
    /// launch; `bs == 0` launches nothing; entries past the live prefix are
    /// untouched. Bad device data is counted in `errors` (flags
    /// [`crate::ErrorFlags`]), never read or written out of bounds.
    /// Asynchronous: the buffers must stay alive until the stream is synchronised.
    ///
    /// Runs on sm_90 (compute_90 PTX; newer GPUs JIT it). Spec: SEMANTICS.md §swa-pool.4,
    /// SEMANTICS.md §page-table.3–6, DESIGN.md D9, D11.
    ///
    /// # Errors
    /// As [`validate_pages`]; [`KernelError::Driver`] when the launch fails.
    pub fn launch(&self, args: &mut SwaPageArgs<'_>, errors: &mut DeviceErrors) -> Result<()> {
        let mut params = validate_pages(args)?;
        if params.bs == 0 {
            return Ok(());
        }
        let cfg = page_launch_config(params.bs as usize, params.max_num_pages as usize)?;
        let stream = self.kernel.gpu().stream();
        params.req_to_token = args.req_to_token.device_ptr(stream);
        params.req_pool_indices = args.req_pool_indices.device_ptr(stream);
        params.cache_seqlens = args.cache_seqlens.device_ptr(stream);
        params.full_to_swa = args.full_to_swa.device_ptr(stream);
        params.swa_page_table = args.swa_page_table.device_ptr_mut(stream);
        params.errors = errors.device_ptr();
        // SAFETY: `validate_pages` checked every shape and stride against the
        // views (whose constructors checked the buffers' lengths), so each
        // index the kernel forms inside [bs, M], [R, W] and [N_map − 1] is in
        // bounds; device indices are range-checked in the kernel; the layout
        // is pinned.
        unsafe { self.kernel.launch(stream, 0, cfg, &params) }?;
        Ok(())
    }
}
