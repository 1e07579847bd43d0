//! Typed launcher of `swa_pool_update_pages`: the device copies of the
//! full→SWA slot map and of its page-level form updated from a short list
//! of changed full pages, instead of re-uploading the whole map whenever it
//! changes (see the crate docs, "Updating the map on the device").

use std::sync::Arc;

use kernel_rt::cudarc::driver::{DeviceRepr, LaunchConfig};
use kernel_rt::launch::Launcher;
use kernel_rt::{grid_dim, to_i64, DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut};

use crate::PTX;

/// Threads per block of the update.
pub const UPDATE_BLOCK_THREADS: u32 = 256;
/// Most blocks of one update launch (grid-stride beyond).
const UPDATE_MAX_BLOCKS: usize = 1024;

kernel_rt::abi_struct! {
    /// Kernel parameters, defined for C in the generated
    /// `kernels/swa_pool_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct SwaUpdateParams {
        /// `i64*` `[N_map]` full→SWA slot map.
        pub full_to_swa: u64 = "i64*",
        /// `i32*` `[N_map / P]` full page → SWA page map, or 0.
        pub page_map: u64 = "i32*",
        /// `const i64*` `[n, 2]` `(full_page, swa_page)` entries.
        pub entries: u64 = "const i64*",
        /// `u32*` `[2]` error word.
        pub errors: u64 = "u32*",
        /// Entries.
        pub n: i64 = "i64",
        /// Full pages the map covers, `(N_map − 1) / P` (the dummy page 0 included).
        pub num_full_pages: i64 = "i64",
        /// SWA pages, the dummy page 0 included (`swa_page < num_swa_pages`).
        pub num_swa_pages: i64 = "i64",
        /// `P`.
        pub page_size: i64 = "i64",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer fields; the C struct
// is generated from it (`kernels/swa_pool_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for SwaUpdateParams {}

/// Arguments of one map update (device buffers on the launcher's GPU).
#[derive(Debug)]
pub struct SwaUpdateArgs<'a> {
    /// `[N_map]` i64 full→SWA slot map, contiguous, `N_map = size + P + 1`
    /// (last element the −1 sentinel, never written); updated in place.
    pub full_to_swa: StridedMut<'a, i64, 1>,
    /// `[(N_map − 1) / P]` i32 page-level map ([`crate::SwaMapping::page_map`]),
    /// contiguous, updated in place; `None` when the caller keeps none.
    pub page_map: Option<StridedMut<'a, i32, 1>>,
    /// `[n, 2]` i64, contiguous, base 16-byte aligned: `(full_page F,
    /// swa_page S)` pairs, the current mapping of each changed full page
    /// (`S = 0`: unmapped). Each entry sets `full_to_swa[F·P + o] = S·P + o`
    /// for `o < P` (all 0 when `S = 0`) and `page_map[F] = S`. Two entries
    /// for one page: which one lands is unspecified.
    pub entries: Strided<'a, i64, 2>,
    /// `P ≥ 1`, tokens per page (both sub-pools).
    pub page_size: usize,
    /// SWA pool pages, the dummy page included (`(size_swa + P) / P`):
    /// entries with `S` at or past it are skipped and counted.
    pub num_swa_pages: usize,
}

/// Launch geometry: 1-D grid of [`UPDATE_BLOCK_THREADS`] threads, one map
/// element (entry × offset) per thread up to 1,024 blocks, grid-stride beyond.
///
/// # Errors
/// None in practice (the grid is clamped); the `Result` is the shape of
/// every family's `launch_config`.
pub fn update_launch_config(n: usize, page_size: usize) -> Result<LaunchConfig> {
    let blocks = n
        .saturating_mul(page_size)
        .div_ceil(UPDATE_BLOCK_THREADS as usize)
        .clamp(1, UPDATE_MAX_BLOCKS);
    Ok(LaunchConfig {
        grid_dim: (grid_dim("entries", blocks, i32::MAX as u32)?, 1, 1),
        block_dim: (UPDATE_BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Validates `args` and returns the kernel parameters (pointers zero).
///
/// # Errors
/// [`KernelError::Shape`] when `entries` is not `[n, 2]`, the map is not
/// `[k·P + 1]` or the page map is not `[k]`; [`KernelError::Stride`] for a
/// non-contiguous view; [`KernelError::Unsupported`] for `P = 0`.
pub fn validate_update(args: &SwaUpdateArgs<'_>) -> Result<SwaUpdateParams> {
    let p = args.page_size;
    if p == 0 {
        return Err(KernelError::unsupported("page_size", "must be ≥ 1"));
    }
    let [n, two] = args.entries.shape();
    if two != 2 {
        return Err(KernelError::shape(
            "entries",
            "[n, 2]",
            format!("[{n}, {two}]"),
        ));
    }
    args.entries.require_contiguous()?;
    args.full_to_swa.require_contiguous()?;
    let n_map = args.full_to_swa.shape()[0];
    if n_map == 0 || (n_map - 1) % p != 0 {
        return Err(KernelError::shape(
            "full_to_swa",
            format!("[pages·P + 1] with P = {p} (size + P slots and the sentinel)"),
            format!("[{n_map}]"),
        ));
    }
    let pages = (n_map - 1) / p;
    if let Some(pm) = &args.page_map {
        pm.require_contiguous()?;
        if pm.shape()[0] != pages {
            return Err(KernelError::shape(
                "page_map",
                format!("[{pages}] (one entry per full page of full_to_swa)"),
                format!("{:?}", pm.shape()),
            ));
        }
    }
    Ok(SwaUpdateParams {
        n: to_i64("entries", n)?,
        num_full_pages: to_i64("full_to_swa", pages)?,
        num_swa_pages: to_i64("num_swa_pages", args.num_swa_pages)?,
        page_size: to_i64("page_size", p)?,
        ..Default::default()
    })
}

/// The map-update launcher (function resolved once; stream-ordered
/// launches, graph-capturable: no host sync, no allocation).
#[derive(Debug)]
pub struct SwaUpdateKernel {
    kernel: Launcher,
}

impl SwaUpdateKernel {
    /// Loads `swa_pool_update_pages` on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Self {
            kernel: Launcher::new(gpu, &PTX, &["swa_pool_update_pages"])?,
        })
    }

    /// Kernel launches issued so far.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// Applies every entry of `args.entries` to the device maps
    /// ([`crate::reference::update_pages`] is the definition); `n == 0`
    /// launches nothing. An entry whose full page is outside `[0,
    /// num_full_pages)` or whose SWA page is outside `[0, num_swa_pages)`
    /// is skipped and counted once in `errors`
    /// ([`crate::ErrorFlags::BAD_UPDATE`]), never written through.
    /// Asynchronous: the buffers must stay alive until the stream is
    /// synchronised. Runs on sm_90 (compute_90 PTX).
    ///
    /// # Errors
    /// As [`validate_update`]; [`KernelError::Stride`] when `entries` is
    /// not 16-byte aligned; [`KernelError::Driver`] when the launch fails.
    pub fn launch(&self, args: &mut SwaUpdateArgs<'_>, errors: &mut DeviceErrors) -> Result<()> {
        let mut params = validate_update(args)?;
        if params.n == 0 {
            return Ok(());
        }
        let cfg = update_launch_config(params.n as usize, args.page_size)?;
        let stream = self.kernel.gpu().stream();
        params.entries = args.entries.device_ptr(stream);
        if params.entries % 16 != 0 {
            return Err(KernelError::Stride {
                arg: "entries",
                detail: "base address must be 16-byte aligned".into(),
            });
        }
        params.full_to_swa = args.full_to_swa.device_ptr_mut(stream);
        params.page_map = args
            .page_map
            .as_mut()
            .map_or(0, |m| m.device_ptr_mut(stream));
        params.errors = errors.device_ptr();
        // SAFETY: `validate_update` checked every view against its buffer
        // (the map is [pages·P + 1], the page map [pages], entries [n, 2],
        // all contiguous); the kernel range-checks each entry's pages before
        // writing F·P + o < pages·P and page_map[F]; `entries` is 16-byte
        // aligned; the params layout is pinned.
        unsafe { self.kernel.launch(stream, 0, cfg, &params) }?;
        Ok(())
    }
}
