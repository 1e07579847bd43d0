//! Typed launcher of `graph_metadata_update`.

use std::sync::Arc;

use kernel_rt::cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig};
use kernel_rt::launch::Launcher;
use kernel_rt::{
    grid_dim, to_i32, to_i64, DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut,
};

use crate::{GraphMode, PTX};

/// Threads per block (`gm::THREADS` in `kernels/graph_metadata.cuh`).
pub const BLOCK_THREADS: u32 = 256;
/// Page-table blocks the launch aims for: one wave of 8 blocks (32 registers,
/// `__launch_bounds__(256, 8)`) on each of the 132 SMs of an H100/H200. The
/// kernel also relies on `page_chunks ≤ TARGET_PAGE_BLOCKS` (its 32-bit page
/// indices).
pub const TARGET_PAGE_BLOCKS: usize = 132 * 8;
/// Most blocks given to `swa_out_cache_loc` (grid-stride beyond that).
const MAX_SWA_BLOCKS: usize = 1024;

kernel_rt::abi_struct! {
    /// Kernel parameters, defined for C in the generated
    /// `kernels/graph_metadata_abi.cuh` (`cargo xtask abi`).
    /// Pointers are device addresses, 0 for an absent optional buffer.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct GraphMetadataParams {
        /// `const i64*` `[bs]`.
        pub req_pool_indices: u64 = "const i64*",
        /// `const i64*` `[bs]`.
        pub seq_lens: u64 = "const i64*",
        /// `const i32*` `[R, W]`.
        pub req_to_token: u64 = "const i32*",
        /// `const i64*` `[N_map]` or 0.
        pub swa_mapping: u64 = "const i64*",
        /// `const i64*` `[n_out]` or 0.
        pub out_cache_loc: u64 = "const i64*",
        /// `const i32*` `[bs]` ragged-verify lengths, or 0.
        pub qlens: u64 = "const i32*",
        /// `i32*` `[bs]`.
        pub cache_seqlens: u64 = "i32*",
        /// `i32*` `[bs + 1]`.
        pub cu_seqlens_k: u64 = "i32*",
        /// `i32*` `[bs + 1]` or 0.
        pub cu_seqlens_q: u64 = "i32*",
        /// `i32*` `[bs, M]`.
        pub page_table: u64 = "i32*",
        /// `i32*` `[bs, M]` or 0.
        pub swa_page_table: u64 = "i32*",
        /// `i64*` `[n_swa]` or 0.
        pub swa_out_cache_loc: u64 = "i64*",
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
        /// `N_map`, 0 without SWA.
        pub swa_mapping_len: i64 = "i64",
        /// Slots in the full pool; 0 = not checked.
        pub pool_slots: i64 = "i64",
        /// Length of `out_cache_loc` (0 when absent).
        pub n_out: i64 = "i64",
        /// Length of `swa_out_cache_loc` (0 when absent).
        pub n_swa: i64 = "i64",
        /// [`GraphMode::seqlen_offset`].
        pub seqlen_offset: i64 = "i64",
        /// Batch rows (the bucket size).
        pub bs: i32 = "i32",
        /// `M`, the page-table width (`max_num_pages`).
        pub max_seq_pages: i32 = "i32",
        /// `P`.
        pub page_size: i32 = "i32",
        /// [`GraphMode::q_stride`].
        pub q_stride: i32 = "i32",
        /// Blocks per batch row for the page tables ([`LaunchPlan`]).
        pub page_chunks: i32 = "i32",
        /// Blocks for `swa_out_cache_loc` ([`LaunchPlan`]).
        pub swa_blocks: i32 = "i32",
        /// Ragged verify: `qlens` are clamped into `[0, max_q_len]`.
        pub max_q_len: i32 = "i32",
        /// Padding, 0.
        pub reserved: i32 = "i32",
        /// `const i32*` `[swa_page_map_len]` full page → SWA page map, or 0 (the
        /// SWA page table then reads `swa_mapping`).
        pub swa_page_map: u64 = "const i32*",
        /// Full pages covered by `swa_page_map` (0 when absent).
        pub swa_page_map_len: i64 = "i64",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/graph_metadata_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for GraphMetadataParams {}

/// SWA write locations: `swa_out_cache_loc[j] = swa_mapping[out_cache_loc[j]]`
/// for the real tokens, 0 for the rest (SEMANTICS.md §graph-metadata.2, item 6).
#[derive(Debug)]
pub struct SwaWriteLocs<'a> {
    /// `[n_out]` i64 full-pool write slots of this pass (contiguous); absent =
    /// no real token (the whole output is 0).
    pub out_cache_loc: Option<Strided<'a, i64, 1>>,
    /// `[n_swa]` i64 output (contiguous), rewritten whole at every launch;
    /// `n_swa` = the bucket's captured token count.
    pub swa_out_cache_loc: StridedMut<'a, i64, 1>,
}

/// The SWA half of a launch, for hybrid models (SEMANTICS.md §swa-pool).
#[derive(Debug)]
pub struct SwaArgs<'a> {
    /// `[N_map]` i64 full→SWA slot map, `N_map = size_full + P + 1`, last
    /// element −1 (contiguous). Always used for `swa_out_cache_loc`; used
    /// for the SWA page table unless `full_page_to_swa_page` is given.
    pub swa_mapping: Strided<'a, i64, 1>,
    /// `[bs, M]` i32 SWA page table (last dim contiguous), live prefixes written.
    pub swa_page_table: Option<StridedMut<'a, i32, 2>>,
    /// Optional fast path of the SWA page table (crate docs, "SWA page
    /// map"): `[num_full_pages ≥ 1]` i32 (contiguous), entry `F` = the SWA
    /// page of full page `F`, 0 = unmapped (the dummy page), e.g.
    /// `SwaMapping::page_map()` of the swa-pool crate. When given,
    /// `swa_page_table[i, p] = full_page_to_swa_page[slot / P]` with `slot =
    /// req_to_token[r_i, p·P]` (a negative slot gives −1, a negative entry
    /// −1, `slot / P ≥ num_full_pages` gives 0 and is counted as
    /// [`crate::ErrorFlags::SLOT_OUTSIDE_MAP`]), instead of
    /// `swa_mapping[slot] / P`.
    ///
    /// **Precondition** for the two to agree: `swa_mapping` is page-granular
    /// (SEMANTICS.md §swa-pool.2: every full page `F` is unmapped — all entries 0 — or
    /// `swa_mapping[F·P + o] = S·P + o` for all `o`), this map holds
    /// `S` (or 0) for each `F`, and `num_full_pages · P = N_map − 1`. The
    /// paired SWA allocator (`SwaMapping`) guarantees all three; with
    /// `req_to_token` page-contiguous (SEMANTICS.md §page-table.2) the entry is then
    /// the SWA page of every token of the live page. The kernel does not
    /// check the precondition. Requires `swa_page_table`.
    pub full_page_to_swa_page: Option<Strided<'a, i32, 1>>,
    /// SWA write locations (when the active pool is an SWA pool).
    pub write_locs: Option<SwaWriteLocs<'a>>,
}

/// Arguments of one metadata update of a bucket of `bs` rows (shapes in
/// `[..]`, all device buffers on the launcher's GPU). `bs` is the length of
/// `cache_seqlens`; every other per-row view must agree with it.
#[derive(Debug)]
pub struct GraphMetadataArgs<'a> {
    /// Forward mode: offset and query stride (SEMANTICS.md §graph-metadata.3).
    pub mode: GraphMode,
    /// `[bs]` i64 (contiguous): row of `req_to_token` per batch row; padding
    /// rows hold [`crate::PAD_REQUEST_INDEX`].
    pub req_pool_indices: Strided<'a, i64, 1>,
    /// `[bs]` i64 tokens (contiguous): scheduler KV lengths; padding rows
    /// hold [`crate::SEQ_LEN_FILL`].
    pub seq_lens: Strided<'a, i64, 1>,
    /// `[R, W]` i32 slots; any row stride, last dim contiguous.
    pub req_to_token: Strided<'a, i32, 2>,
    /// `P ≥ 1`, tokens per page.
    pub page_size: usize,
    /// Slots of the full pool (`size + P`); when given, a sampled slot at or
    /// past it gives page 0 and is counted (D9).
    pub pool_slots: Option<usize>,
    /// `[bs]` i32 output (contiguous).
    pub cache_seqlens: StridedMut<'a, i32, 1>,
    /// `[bs + 1]` i32 output (contiguous), entry 0 written as 0 (D1).
    pub cu_seqlens_k: StridedMut<'a, i32, 1>,
    /// `[bs + 1]` i32 output (contiguous): `i · q_stride`, or in ragged
    /// verify the prefix sum of `qlens` (required then); absent = untouched.
    pub cu_seqlens_q: Option<StridedMut<'a, i32, 1>>,
    /// `[bs]` i32 (contiguous) query rows per row, padded to the bucket
    /// ([`crate::pad_ragged_verify_lens`]): required in
    /// [`GraphMode::RaggedVerify`], refused otherwise.
    pub qlens: Option<Strided<'a, i32, 1>>,
    /// `[bs, M]` i32 output (`M = max_num_pages ≥ 1`, last dim contiguous);
    /// live prefixes written, clamped to `M`.
    pub page_table: StridedMut<'a, i32, 2>,
    /// SWA map, SWA page table, SWA write locations.
    pub swa: Option<SwaArgs<'a>>,
}

/// Launch geometry of one update (a pure function of the shapes).
#[derive(Debug, Clone, Copy)]
pub struct LaunchPlan {
    /// Grid `(1 + bs · page_chunks + swa_blocks, 1, 1)`, [`BLOCK_THREADS`] threads.
    pub cfg: LaunchConfig,
    /// Blocks per batch row for the page tables, `≥ 1`.
    pub page_chunks: u32,
    /// Blocks for `swa_out_cache_loc` (0 when it is absent or empty).
    pub swa_blocks: u32,
}

/// Geometry for `bs ≥ 1` rows, page-table width `max_num_pages` and `n_swa`
/// SWA write locations: block 0 writes the per-row vectors and prefix sums,
/// `bs · page_chunks` blocks (one warp task per warp, rows interleaved over
/// blocks) cover the page tables — `page_chunks = min(⌈M / 256⌉,
/// max(1, ⌊TARGET_PAGE_BLOCKS / bs⌋))`, so the page blocks fill about one
/// wave when there are enough pages and no thread lacks a page of a full
/// row — and `swa_blocks` blocks cover the write locations.
///
/// # Errors
/// [`KernelError::Unsupported`] when `bs == 0` or the grid exceeds CUDA's x limit.
pub fn launch_config(bs: usize, max_num_pages: usize, n_swa: usize) -> Result<LaunchPlan> {
    if bs == 0 {
        return Err(KernelError::unsupported(
            "bs",
            "an empty batch launches nothing",
        ));
    }
    let threads = BLOCK_THREADS as usize;
    let per_row = max_num_pages.div_ceil(threads).max(1);
    let wanted = (TARGET_PAGE_BLOCKS / bs).max(1);
    let page_chunks = per_row.min(wanted);
    let swa_blocks = n_swa.div_ceil(threads).min(MAX_SWA_BLOCKS);
    let blocks = bs
        .checked_mul(page_chunks)
        .and_then(|b| b.checked_add(1 + swa_blocks))
        .unwrap_or(usize::MAX);
    Ok(LaunchPlan {
        cfg: LaunchConfig {
            grid_dim: (grid_dim("bs", blocks, i32::MAX as u32)?, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        },
        page_chunks: page_chunks as u32,
        swa_blocks: swa_blocks as u32,
    })
}

fn require_contiguous_last(
    arg: &'static str,
    shape: [usize; 2],
    strides: [usize; 2],
) -> Result<()> {
    if shape[1] > 1 && strides[1] != 1 {
        return Err(KernelError::Stride {
            arg,
            detail: format!("last dim must be contiguous (stride 1), got strides {strides:?}"),
        });
    }
    Ok(())
}

fn require_vector(
    arg: &'static str,
    shape: [usize; 1],
    strides: [usize; 1],
    len: usize,
    what: &str,
) -> Result<()> {
    if shape[0] != len {
        return Err(KernelError::shape(
            arg,
            format!("[{what}={len}]"),
            format!("{shape:?}"),
        ));
    }
    require_contiguous(arg, shape, strides)
}

fn require_contiguous(arg: &'static str, shape: [usize; 1], strides: [usize; 1]) -> Result<()> {
    if shape[0] > 1 && strides[0] != 1 {
        return Err(KernelError::Stride {
            arg,
            detail: format!("must be contiguous, got stride {}", strides[0]),
        });
    }
    Ok(())
}

fn require_table(arg: &'static str, t: &StridedMut<'_, i32, 2>, bs: usize, m: usize) -> Result<()> {
    if t.shape() != [bs, m] {
        return Err(KernelError::shape(
            arg,
            format!("[bs={bs}, M={m}]"),
            format!("{:?}", t.shape()),
        ));
    }
    require_contiguous_last(arg, t.shape(), t.strides())
}

/// Validates `args` and returns the kernel parameters (pointers and launch
/// plan fields zero: filled at launch). Every rejection happens here, before
/// any launch.
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`] or
/// [`KernelError::Unsupported`] naming the argument.
pub fn validate(args: &GraphMetadataArgs<'_>) -> Result<GraphMetadataParams> {
    let bs = args.cache_seqlens.shape()[0];
    let [rows, width] = args.req_to_token.shape();
    let m = args.page_table.shape()[1];
    if args.page_size == 0 {
        return Err(KernelError::unsupported("page_size", "must be ≥ 1"));
    }
    if m == 0 {
        return Err(KernelError::unsupported(
            "page_table",
            "max_num_pages (dim 1) must be ≥ 1",
        ));
    }
    let q_stride = args.mode.q_stride();
    if q_stride == 0 {
        return Err(KernelError::unsupported("mode", "q_len must be ≥ 1"));
    }
    require_contiguous(
        "cache_seqlens",
        args.cache_seqlens.shape(),
        args.cache_seqlens.strides(),
    )?;
    require_vector(
        "req_pool_indices",
        args.req_pool_indices.shape(),
        args.req_pool_indices.strides(),
        bs,
        "bs",
    )?;
    require_vector(
        "seq_lens",
        args.seq_lens.shape(),
        args.seq_lens.strides(),
        bs,
        "bs",
    )?;
    let bs1 = bs.saturating_add(1);
    require_vector(
        "cu_seqlens_k",
        args.cu_seqlens_k.shape(),
        args.cu_seqlens_k.strides(),
        bs1,
        "bs+1",
    )?;
    if let Some(q) = &args.cu_seqlens_q {
        require_vector("cu_seqlens_q", q.shape(), q.strides(), bs1, "bs+1")?;
        if (bs as u64).saturating_mul(u64::from(q_stride)) > i32::MAX as u64 {
            return Err(KernelError::unsupported(
                "cu_seqlens_q",
                format!("bs · q_stride = {bs} · {q_stride} does not fit in i32"),
            ));
        }
    }
    let ragged = matches!(args.mode, GraphMode::RaggedVerify { .. });
    match (&args.qlens, ragged) {
        (Some(q), true) => require_vector("qlens", q.shape(), q.strides(), bs, "bs")?,
        (None, false) => {}
        (None, true) => {
            return Err(KernelError::unsupported(
                "qlens",
                "ragged verify needs the per-row query lengths",
            ))
        }
        (Some(_), false) => {
            return Err(KernelError::unsupported(
                "qlens",
                "only ragged verify takes per-row query lengths",
            ))
        }
    }
    if ragged && args.cu_seqlens_q.is_none() {
        return Err(KernelError::unsupported(
            "cu_seqlens_q",
            "ragged verify must write cu_seqlens_q",
        ));
    }
    require_contiguous_last(
        "req_to_token",
        args.req_to_token.shape(),
        args.req_to_token.strides(),
    )?;
    require_table("page_table", &args.page_table, bs, m)?;
    if args.pool_slots == Some(0) {
        return Err(KernelError::unsupported(
            "pool_slots",
            "must be ≥ 1 when given",
        ));
    }
    let mut params = GraphMetadataParams {
        req_to_token_rows: to_i64("req_to_token", rows)?,
        req_to_token_width: to_i64("req_to_token", width)?,
        req_to_token_stride: to_i64("req_to_token", args.req_to_token.strides()[0])?,
        page_table_stride: to_i64("page_table", args.page_table.strides()[0])?,
        pool_slots: to_i64("pool_slots", args.pool_slots.unwrap_or(0))?,
        seqlen_offset: args.mode.seqlen_offset(),
        bs: to_i32("bs", bs)?,
        max_seq_pages: to_i32("max_num_pages", m)?,
        page_size: to_i32("page_size", args.page_size)?,
        q_stride: to_i32("q_stride", q_stride as usize)?,
        max_q_len: if ragged {
            to_i32("max_q_len", q_stride as usize)?
        } else {
            0
        },
        ..Default::default()
    };
    if let Some(swa) = &args.swa {
        let n_map = swa.swa_mapping.shape()[0];
        if n_map == 0 {
            return Err(KernelError::shape("swa_mapping", "[N_map ≥ 1]", "[0]"));
        }
        require_contiguous(
            "swa_mapping",
            swa.swa_mapping.shape(),
            swa.swa_mapping.strides(),
        )?;
        params.swa_mapping_len = to_i64("swa_mapping", n_map)?;
        if swa.swa_page_table.is_none() && swa.write_locs.is_none() {
            return Err(KernelError::unsupported(
                "swa",
                "a full→SWA map needs an SWA page table or SWA write locations to fill",
            ));
        }
        if let Some(t) = &swa.swa_page_table {
            require_table("swa_page_table", t, bs, m)?;
            params.swa_page_table_stride = to_i64("swa_page_table", t.strides()[0])?;
        }
        if let Some(pm) = &swa.full_page_to_swa_page {
            let pages = pm.shape()[0];
            if pages == 0 {
                return Err(KernelError::shape(
                    "full_page_to_swa_page",
                    "[num_full_pages ≥ 1]",
                    "[0]",
                ));
            }
            require_contiguous("full_page_to_swa_page", pm.shape(), pm.strides())?;
            if swa.swa_page_table.is_none() {
                return Err(KernelError::unsupported(
                    "full_page_to_swa_page",
                    "a full page → SWA page map needs an SWA page table to fill",
                ));
            }
            params.swa_page_map_len = to_i64("full_page_to_swa_page", pages)?;
        }
        if let Some(w) = &swa.write_locs {
            let out = &w.swa_out_cache_loc;
            require_contiguous("swa_out_cache_loc", out.shape(), out.strides())?;
            params.n_swa = to_i64("swa_out_cache_loc", out.shape()[0])?;
            if let Some(src) = &w.out_cache_loc {
                require_contiguous("out_cache_loc", src.shape(), src.strides())?;
                params.n_out = to_i64("out_cache_loc", src.shape()[0])?;
            }
        }
    }
    Ok(params)
}

/// The fused graph-metadata launcher: the kernel function is resolved once,
/// at construction; launches are stream-ordered on the GPU's stream and
/// graph-capturable (no host sync, no allocation, no copy). The same launch
/// serves the eager path.
#[derive(Debug)]
pub struct GraphMetadataKernel {
    kernel: Launcher,
}

impl GraphMetadataKernel {
    /// Loads `graph_metadata_update` on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Ok(Self {
            kernel: Launcher::new(gpu, &PTX, &["graph_metadata_update"])?,
        })
    }

    /// Kernel launches issued so far by this launcher (a captured launch
    /// counts once, however often its graph is replayed).
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// Rewrites all metadata of the bucket in **one** launch (SEMANTICS.md §graph-metadata.2);
    /// `bs == 0` launches nothing. Asynchronous: the buffers must stay alive
    /// until the stream is synchronised (for a captured launch: as long as
    /// the graph is replayed — its pointers are baked in). Bad device data is
    /// counted in `errors` (flags [`crate::ErrorFlags`]), never read or
    /// written out of bounds.
    ///
    /// Runs on sm_90 (compute_90 PTX; newer GPUs JIT it). Spec:
    /// SEMANTICS.md §graph-metadata.2–5, DESIGN.md D1–D3, D9, D11.
    ///
    /// # Errors
    /// As [`validate`] and [`launch_config`]; [`KernelError::Driver`] when
    /// the launch fails.
    pub fn launch(
        &self,
        args: &mut GraphMetadataArgs<'_>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.launch_on(self.kernel.gpu().stream(), args, errors)
    }

    /// [`GraphMetadataKernel::launch`] on `stream` instead of the GPU's own
    /// stream (e.g. an engine's stream from [`Gpu::borrowed_stream`]), in
    /// that stream's order and CUDA-graph capture.
    ///
    /// # Errors
    /// As [`GraphMetadataKernel::launch`]; [`KernelError::Unsupported`] when
    /// the stream belongs to another context.
    pub fn launch_on(
        &self,
        stream: &CudaStream,
        args: &mut GraphMetadataArgs<'_>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.kernel.gpu().require_stream(stream)?;
        let mut params = validate(args)?;
        if params.bs == 0 {
            return Ok(());
        }
        let plan = launch_config(
            params.bs as usize,
            params.max_seq_pages as usize,
            params.n_swa as usize,
        )?;
        params.page_chunks = plan.page_chunks as i32;
        params.swa_blocks = plan.swa_blocks as i32;
        params.req_pool_indices = args.req_pool_indices.device_ptr(stream);
        params.seq_lens = args.seq_lens.device_ptr(stream);
        params.req_to_token = args.req_to_token.device_ptr(stream);
        params.cache_seqlens = args.cache_seqlens.device_ptr_mut(stream);
        params.cu_seqlens_k = args.cu_seqlens_k.device_ptr_mut(stream);
        if let Some(q) = args.cu_seqlens_q.as_mut() {
            params.cu_seqlens_q = q.device_ptr_mut(stream);
        }
        if let Some(q) = args.qlens.as_ref() {
            params.qlens = q.device_ptr(stream);
        }
        params.page_table = args.page_table.device_ptr_mut(stream);
        if let Some(swa) = args.swa.as_mut() {
            params.swa_mapping = swa.swa_mapping.device_ptr(stream);
            if let Some(t) = swa.swa_page_table.as_mut() {
                params.swa_page_table = t.device_ptr_mut(stream);
            }
            if let Some(pm) = swa.full_page_to_swa_page.as_ref() {
                params.swa_page_map = pm.device_ptr(stream);
            }
            if let Some(w) = swa.write_locs.as_mut() {
                if params.n_swa > 0 {
                    params.swa_out_cache_loc = w.swa_out_cache_loc.device_ptr_mut(stream);
                }
                if let Some(src) = w.out_cache_loc.as_ref().filter(|_| params.n_out > 0) {
                    params.out_cache_loc = src.device_ptr(stream);
                }
            }
        }
        params.errors = errors.device_ptr();
        // SAFETY: `validate` checked every shape and stride against the
        // buffers' lengths (Strided/StridedMut constructors): each index the
        // kernel forms inside [bs] (qlens included), [bs+1], [bs, M], [R, W], [N_map], [n_out],
        // [n_swa] and [num_full_pages] (the page map) is in bounds, optional pointers are null exactly when
        // their length is 0 or the buffer is absent; device indices are
        // range-checked in the kernel; the params layout is pinned by a test.
        unsafe { self.kernel.launch(stream, 0, plan.cfg, &params) }?;
        Ok(())
    }
}
