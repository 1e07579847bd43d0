//! Typed launcher of `page_table_build`.

use std::sync::Arc;

use kernel_rt::cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig};
use kernel_rt::launch::Launcher;
use kernel_rt::{
    grid_dim, to_i32, to_i64, DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut,
    MAX_GRID_YZ,
};

use crate::PTX;

/// Threads per block.
pub const BLOCK_THREADS: u32 = 256;
/// Pages per thread per step (`PT_UNROLL` in the kernel).
pub const PAGES_PER_THREAD: usize = 4;
/// Blocks the launch aims for: one full wave on an H200 (132 SMs × 8 blocks
/// of 256 threads at ≤ 32 registers).
const TARGET_BLOCKS: usize = 132 * 8;

kernel_rt::abi_struct! {
    /// Kernel parameters, defined for C in the generated
    /// `kernels/page_table_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct PageTableParams {
        /// `const i32*` `[R, W]`.
        pub req_to_token: u64 = "const i32*",
        /// `const i64*` `[bs]`.
        pub req_pool_indices: u64 = "const i64*",
        /// `const i32*` `[bs]`.
        pub cache_seqlens: u64 = "const i32*",
        /// `i32*` `[bs, M]`.
        pub page_table: u64 = "i32*",
        /// `const i64*` `[N_map]` or 0.
        pub full_to_swa: u64 = "const i64*",
        /// `i32*` `[bs, M]` or 0.
        pub swa_page_table: u64 = "i32*",
        /// `u32*` `[2]` error word.
        pub errors: u64 = "u32*",
        /// `R`.
        pub req_to_token_rows: i64 = "i64",
        /// `W`.
        pub req_to_token_width: i64 = "i64",
        /// Row stride of `req_to_token`, elements.
        pub req_to_token_stride: i64 = "i64",
        /// Row stride of `page_table`, elements.
        pub page_table_stride: i64 = "i64",
        /// Row stride of `swa_page_table`, elements.
        pub swa_page_table_stride: i64 = "i64",
        /// `N_map`.
        pub full_to_swa_len: i64 = "i64",
        /// Slots in the full pool; 0 = not checked.
        pub pool_slots: i64 = "i64",
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
// the C struct is generated from it (`kernels/page_table_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for PageTableParams {}

/// The SWA half of a launch: the full→SWA slot map and the table it fills.
/// Both or neither, by construction (SEMANTICS.md §page-table.4).
#[derive(Debug)]
pub struct SwaTables<'a> {
    /// `[N_map]` i64, `N_map = size_full + P + 1`, last element −1 (SEMANTICS.md §swa-pool.2).
    pub full_to_swa: Strided<'a, i64, 1>,
    /// `[bs, M]` i32, last dim contiguous; live prefixes written.
    pub swa_page_table: StridedMut<'a, i32, 2>,
}

/// Arguments of one page-table build (shapes in `[..]`, all device buffers on
/// the launcher's GPU).
#[derive(Debug)]
pub struct PageTableArgs<'a> {
    /// `[R, W]` i32 slots; any row stride, last dim contiguous.
    pub req_to_token: Strided<'a, i32, 2>,
    /// `[bs]` i64, contiguous: row of `req_to_token` per request.
    pub req_pool_indices: Strided<'a, i64, 1>,
    /// `[bs]` i32, contiguous: KV length per request, tokens (mode offset included).
    pub cache_seqlens: Strided<'a, i32, 1>,
    /// `P ≥ 1`, tokens per page.
    pub page_size: usize,
    /// `[bs, M]` i32 output, `M = max_num_pages ≥ 1`; last dim contiguous.
    pub page_table: StridedMut<'a, i32, 2>,
    /// SWA map and table, for hybrid models.
    pub swa: Option<SwaTables<'a>>,
    /// Number of slots in the full pool (`size + P`); when given, a slot at or
    /// past it writes page 0 and is counted (DESIGN.md D9).
    pub pool_slots: Option<usize>,
}

/// Launch geometry: grid `(bs, chunks)`, [`BLOCK_THREADS`] threads; `chunks`
/// page blocks per row (each covering `BLOCK_THREADS × PAGES_PER_THREAD`
/// pages per step), enough for about one wave of blocks when rows are few
/// and never more than the row needs.
///
/// # Errors
/// [`KernelError::Unsupported`] when `bs` exceeds the grid's x limit.
pub fn launch_config(bs: usize, max_num_pages: usize) -> Result<LaunchConfig> {
    let per_row = max_num_pages
        .div_ceil(BLOCK_THREADS as usize * PAGES_PER_THREAD)
        .max(1);
    let wanted = TARGET_BLOCKS.div_ceil(bs.max(1)).max(1);
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

/// Validates `args` and returns the kernel parameters (pointers zero: filled
/// at launch). Every rejection happens here, before any launch.
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`] or
/// [`KernelError::Unsupported`] naming the argument.
pub fn validate(args: &PageTableArgs<'_>) -> Result<PageTableParams> {
    let [bs, m] = args.page_table.shape();
    let [rows, width] = args.req_to_token.shape();
    if args.page_size == 0 {
        return Err(KernelError::unsupported("page_size", "must be ≥ 1"));
    }
    if m == 0 {
        return Err(KernelError::unsupported(
            "page_table",
            "max_num_pages (dim 1) must be ≥ 1",
        ));
    }
    args.req_to_token.require_last_contiguous()?;
    args.page_table.require_last_contiguous()?;
    args.req_pool_indices.require_vector(bs, "bs")?;
    args.cache_seqlens.require_vector(bs, "bs")?;
    if args.pool_slots == Some(0) {
        return Err(KernelError::unsupported(
            "pool_slots",
            "must be ≥ 1 when given",
        ));
    }
    let mut params = PageTableParams {
        req_to_token_rows: to_i64("req_to_token", rows)?,
        req_to_token_width: to_i64("req_to_token", width)?,
        req_to_token_stride: to_i64("req_to_token", args.req_to_token.strides()[0])?,
        page_table_stride: to_i64("page_table", args.page_table.strides()[0])?,
        pool_slots: to_i64("pool_slots", args.pool_slots.unwrap_or(0))?,
        bs: to_i32("bs", bs)?,
        max_num_pages: to_i32("max_num_pages", m)?,
        page_size: to_i32("page_size", args.page_size)?,
        ..Default::default()
    };
    if let Some(swa) = &args.swa {
        let shape = swa.swa_page_table.shape();
        if shape != [bs, m] {
            return Err(KernelError::shape(
                "swa_page_table",
                format!("[bs={bs}, M={m}] (as page_table)"),
                format!("{shape:?}"),
            ));
        }
        swa.swa_page_table.require_last_contiguous()?;
        let n_map = swa.full_to_swa.shape()[0];
        if n_map == 0 {
            return Err(KernelError::shape("full_to_swa", "[N_map ≥ 1]", "[0]"));
        }
        swa.full_to_swa.require_contiguous()?;
        params.swa_page_table_stride = to_i64("swa_page_table", swa.swa_page_table.strides()[0])?;
        params.full_to_swa_len = to_i64("full_to_swa", n_map)?;
    }
    Ok(params)
}

/// The page-table launcher: the kernel function is resolved once, at
/// construction; launches are stream-ordered on the GPU's stream and
/// graph-capturable (no host sync, no allocation, no copy).
#[derive(Debug)]
pub struct PageTableKernel {
    kernel: Launcher,
}

impl PageTableKernel {
    /// Loads `page_table_build` on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Self {
            kernel: Launcher::new(gpu, &PTX, &["page_table_build"])?,
        })
    }

    /// Kernel launches issued so far by this launcher.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// Builds `page_table` (and `swa.swa_page_table`) from `req_to_token` in one
    /// launch; `bs == 0` launches nothing. Asynchronous: the buffers must stay
    /// alive until the stream is synchronised. Bad device data is counted in
    /// `errors` (flags [`crate::ErrorFlags`]), never read or written out of bounds.
    ///
    /// Runs on sm_90 (compute_90 PTX; newer GPUs JIT it). Spec: SEMANTICS.md §page-table.3–6.
    ///
    /// # Errors
    /// As [`validate`]; [`KernelError::Driver`] when the launch fails.
    pub fn launch(&self, args: &mut PageTableArgs<'_>, errors: &mut DeviceErrors) -> Result<()> {
        self.launch_on(self.kernel.gpu().stream(), args, errors)
    }

    /// [`PageTableKernel::launch`] on `stream` instead of the GPU's own
    /// stream (e.g. an engine's stream from [`Gpu::borrowed_stream`]), in
    /// that stream's order and CUDA-graph capture; the buffers and `errors`
    /// must be ready in that stream's order.
    ///
    /// # Errors
    /// As [`PageTableKernel::launch`]; [`KernelError::Unsupported`] when the
    /// stream belongs to another context.
    pub fn launch_on(
        &self,
        stream: &CudaStream,
        args: &mut PageTableArgs<'_>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.kernel.gpu().require_stream(stream)?;
        let mut params = validate(args)?;
        if params.bs == 0 {
            return Ok(());
        }
        let cfg = launch_config(params.bs as usize, params.max_num_pages as usize)?;
        params.req_to_token = args.req_to_token.device_ptr(stream);
        params.req_pool_indices = args.req_pool_indices.device_ptr(stream);
        params.cache_seqlens = args.cache_seqlens.device_ptr(stream);
        params.page_table = args.page_table.device_ptr_mut(stream);
        if let Some(swa) = args.swa.as_mut() {
            params.full_to_swa = swa.full_to_swa.device_ptr(stream);
            params.swa_page_table = swa.swa_page_table.device_ptr_mut(stream);
        }
        params.errors = errors.device_ptr();
        // SAFETY: `validate` checked every shape and stride against the
        // buffers' lengths (Strided/StridedMut constructors), so each index the
        // kernel forms inside [bs, M], [R, W] and [N_map] is in bounds; device
        // indices are range-checked in the kernel; the params layout is pinned.
        unsafe { self.kernel.launch(stream, 0, cfg, &params) }?;
        Ok(())
    }
}
