//! Typed launcher of the KV-write kernels (`fp8_kv_set_kv_buffer`,
//! `fp8_kv_fused_fp8_write_{bf16,f16}`).

use std::sync::Arc;

use kernel_rt::cudarc::driver::sys::CUdevice_attribute;
use kernel_rt::cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig};
use kernel_rt::launch::Launcher;
use kernel_rt::{
    grid_dim, to_i32, to_i64, DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut,
};

use crate::{KvCacheDtype, KvScales, PTX};

/// Most threads per block (the kernels' `__launch_bounds__(256, 4)`).
pub const BLOCK_THREADS: u32 = 256;
/// Threads the kernels' `__launch_bounds__(256, 4)` guarantee resident per SM
/// (≤ 64 registers each); one wave of the grid fills them.
pub const RESIDENT_THREADS_PER_SM: usize = 1024;
/// Tokens each thread keeps in flight (`KV_UNROLL` in the kernel): their slot
/// and input loads are all issued before any store.
pub const TOKENS_IN_FLIGHT: usize = 4;
/// SM count assumed when the device does not report one (H200: 132).
const DEFAULT_SMS: usize = 132;
/// Most blocks one launch uses; more tokens are covered by the grid-stride loop.
const MAX_BLOCKS: usize = 1 << 20;
/// Bytes of one vector access.
const VECTOR_BYTES: usize = 16;

/// dtype of the new K and V rows (both stored as `u16` bits on the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// bfloat16 (`half::bf16::to_bits`).
    Bf16,
    /// IEEE half (`half::f16::to_bits`).
    F16,
}

kernel_rt::abi_struct! {
    /// Kernel parameters, defined for C in the generated
    /// `kernels/fp8_kv_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct KvWriteParams {
        /// `const u16*` `[n, Hkv, D]`.
        pub k: u64 = "const u16*",
        /// `const u16*` `[n, Hkv, D]`.
        pub v: u64 = "const u16*",
        /// `const i64*` `[n]`.
        pub cache_loc: u64 = "const i64*",
        /// `u16*` or `u8*` `[S, Hkv, D]`.
        pub k_cache: u64 = "void*",
        /// `u16*` or `u8*` `[S, Hkv, D]`.
        pub v_cache: u64 = "void*",
        /// `u32*` `[2]` error word.
        pub errors: u64 = "u32*",
        /// Token stride of `k`, elements.
        pub k_token_stride: i64 = "i64",
        /// Head stride of `k`, elements.
        pub k_head_stride: i64 = "i64",
        /// Token stride of `v`, elements.
        pub v_token_stride: i64 = "i64",
        /// Head stride of `v`, elements.
        pub v_head_stride: i64 = "i64",
        /// Slot stride of `k_cache` (token stride within a page for paged
        /// views), elements.
        pub k_cache_slot_stride: i64 = "i64",
        /// Head stride of `k_cache`, elements.
        pub k_cache_head_stride: i64 = "i64",
        /// Slot stride of `v_cache` (token stride within a page for paged
        /// views), elements.
        pub v_cache_slot_stride: i64 = "i64",
        /// Head stride of `v_cache`, elements.
        pub v_cache_head_stride: i64 = "i64",
        /// `n`, tokens.
        pub num_tokens: i64 = "i64",
        /// `S`, slots of the pool.
        pub slots: i64 = "i64",
        /// `P` of a paged cache view, or 0: slot-linear cache (`s · slot_stride`).
        pub page_size: i64 = "i64",
        /// Page stride of `k_cache` (paged views), elements.
        pub k_cache_page_stride: i64 = "i64",
        /// Page stride of `v_cache` (paged views), elements.
        pub v_cache_page_stride: i64 = "i64",
        /// `f32(1 / k_scale)`; 1.0 for `set_kv_buffer`.
        pub inv_k_scale: f32 = "float",
        /// `f32(1 / v_scale)`; 1.0 for `set_kv_buffer`.
        pub inv_v_scale: f32 = "float",
        /// `Hkv`.
        pub num_kv_heads: i32 = "i32",
        /// `D`.
        pub head_dim: i32 = "i32",
        /// `D / chunk_elems`.
        pub chunks_per_head: i32 = "i32",
        /// Threads sharing one token, `blockDim.x` ([`WriteGeometry`]).
        pub threads_per_token: i32 = "i32",
        /// Token rows per block, `blockDim.y` ([`WriteGeometry`]).
        pub tokens_per_block: i32 = "i32",
        /// 1: 16-byte accesses; 0: one element per access.
        pub vectorized: i32 = "i32",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/fp8_kv_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for KvWriteParams {}

/// Arguments of one KV write (shapes in `[..]`, all device buffers on the
/// launcher's GPU). `C` is the cache element: `u16` (bf16/f16 bits) for
/// [`KvWriteKernel::set_kv_buffer`], `u8` (e4m3 bytes) for
/// [`KvWriteKernel::fused_fp8_set_kv_buffer`].
#[derive(Debug)]
pub struct KvWriteArgs<'a, C> {
    /// `[n, Hkv, D]` new K rows (bf16/f16 bits); any token and head stride,
    /// last dim contiguous.
    pub k: Strided<'a, u16, 3>,
    /// `[n, Hkv, D]` new V rows, as `k`.
    pub v: Strided<'a, u16, 3>,
    /// `[n]` i64 slots, contiguous. Slots outside `[0, S)` are skipped and counted.
    pub cache_loc: Strided<'a, i64, 1>,
    /// `[S, Hkv, D]` K cache of the layer; any slot and head stride, last dim
    /// contiguous; `S % page_size == 0`.
    pub k_cache: StridedMut<'a, C, 3>,
    /// `[S, Hkv, D]` V cache, same shape as `k_cache`.
    pub v_cache: StridedMut<'a, C, 3>,
    /// `P ≥ 1`, tokens per page (slot `s` = page `s / P`, offset `s % P`).
    pub page_size: usize,
}

/// Arguments of one KV write into **paged** cache views (engine-owned
/// caches in any page layout): as [`KvWriteArgs`], but each cache is a
/// `[num_pages, Hkv, P, D]` view (the index order of paged-attention's
/// `KvCache`) with any page, head and token strides, last dim contiguous:
/// NHD memory (`[num_pages, P, Hkv, D]`) has strides `(P·Hkv·D, D, Hkv·D,
/// 1)`, HND memory (`[num_pages, Hkv, P, D]`) `(Hkv·P·D, P·D, D, 1)`, and a
/// page stride may exceed the page (padded pages). Slot `s` is page `s / P`,
/// token `s % P`; `S = num_pages · P`. The kernels keep 2 tokens per
/// thread in flight on this path (4 on the slot-linear one: the page
/// arithmetic would spill otherwise).
#[derive(Debug)]
pub struct PagedKvWriteArgs<'a, C> {
    /// `[n, Hkv, D]` new K rows (bf16/f16 bits); any token and head stride,
    /// last dim contiguous.
    pub k: Strided<'a, u16, 3>,
    /// `[n, Hkv, D]` new V rows, as `k`.
    pub v: Strided<'a, u16, 3>,
    /// `[n]` i64 slots, contiguous. Slots outside `[0, S)` are skipped and counted.
    pub cache_loc: Strided<'a, i64, 1>,
    /// `[num_pages, Hkv, P, D]` K cache view of the layer.
    pub k_cache: StridedMut<'a, C, 4>,
    /// `[num_pages, Hkv, P, D]` V cache view, same shape as `k_cache`.
    pub v_cache: StridedMut<'a, C, 4>,
}

/// How one launch splits the work: every token's K and V rows are
/// `2 · Hkv · chunks_per_head` chunks of [`chunk_elems`] elements; a block
/// is `(threads_per_token, tokens_per_block)` threads: `tokens_per_block`
/// token rows side by side, `threads_per_token` lanes each.
///
/// Token rows of the grid are `r = block · tokens_per_block + y`, `R = grid ·
/// tokens_per_block` of them; row `r` handles tokens `r, r + R, r + 2R, …`,
/// [`TOKENS_IN_FLIGHT`] at a time, and lane `l` chunks `l, l +
/// threads_per_token, …` of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteGeometry {
    /// `D / chunk_elems`.
    pub chunks_per_head: usize,
    /// Threads sharing one token (≤ [`BLOCK_THREADS`]).
    pub threads_per_token: usize,
    /// Tokens per block (`tokens_per_block · threads_per_token ≤ BLOCK_THREADS`).
    pub tokens_per_block: usize,
}

/// Elements per chunk: 16-byte accesses move 8 `u16` (copy) or 16 elements
/// (FP8 write: 32 input bytes, 16 output bytes); the fallback moves one.
pub fn chunk_elems(fp8: bool, vectorized: bool) -> usize {
    match (vectorized, fp8) {
        (false, _) => 1,
        (true, false) => VECTOR_BYTES / 2,
        (true, true) => VECTOR_BYTES,
    }
}

/// Whether the 16-byte path applies: `head_dim` is a multiple of the chunk,
/// and every base address (bytes) and every stride of a dim of size > 1
/// (in bytes: elements × element size) is a multiple of 16.
///
/// `views` lists every buffer the kernel touches.
pub fn vectorizable(head_dim: usize, fp8: bool, views: &[ViewAlignment]) -> bool {
    if head_dim % chunk_elems(fp8, true) != 0 {
        return false;
    }
    views.iter().all(|v| {
        v.addr % VECTOR_BYTES as u64 == 0
            && v.outer.iter().all(|&(n, s)| {
                n <= 1
                    || s.checked_mul(v.elem_bytes)
                        .is_some_and(|b| b % VECTOR_BYTES == 0)
            })
    })
}

/// What [`vectorizable`] needs to know of one view `[d0, d1, D]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewAlignment {
    /// Device address of element `[0, 0, 0]`, bytes.
    pub addr: u64,
    /// Bytes per element (2 for bf16/f16, 1 for e4m3).
    pub elem_bytes: usize,
    /// `(extent, stride in elements)` of the two outer dims (tokens or slots, heads).
    pub outer: [(usize, usize); 2],
}

/// Launch geometry for `n` tokens of `Hkv` heads of `D` elements, chunks of
/// `chunk` elements (`D % chunk == 0`), on a device of `sms` SMs: block
/// `(threads_per_token, tokens_per_block, 1)`; grid `(min(ceil(n /
/// tokens_per_block), wave), 1, 1)` with `wave = sms · max(1,
/// RESIDENT_THREADS_PER_SM / 32 / block warps)` (the blocks resident at
/// once): one token per thread while the
/// tokens fit one wave (decode), else one wave whose threads loop over
/// tokens, [`TOKENS_IN_FLIGHT`] at a time, all threads doing the same number
/// of tokens within one.
///
/// # Errors
/// [`KernelError::Unsupported`] when a count does not fit the kernel's i32
/// fields or `chunk` does not divide `D`.
pub fn launch_config(
    n: usize,
    num_kv_heads: usize,
    head_dim: usize,
    chunk: usize,
    sms: usize,
) -> Result<(LaunchConfig, WriteGeometry)> {
    if chunk == 0 || head_dim % chunk != 0 {
        return Err(KernelError::unsupported(
            "head_dim",
            format!("{head_dim} is not a multiple of {chunk}"),
        ));
    }
    let chunks_per_head = head_dim / chunk;
    let per_token = num_kv_heads
        .checked_mul(chunks_per_head)
        .and_then(|x| x.checked_mul(2))
        .filter(|&x| x <= i32::MAX as usize && x > 0)
        .ok_or_else(|| {
            KernelError::unsupported(
                "num_kv_heads",
                format!("{num_kv_heads} heads × {head_dim} dims out of range"),
            )
        })?;
    let block = BLOCK_THREADS as usize;
    let (threads_per_token, tokens_per_block) = if per_token >= block {
        (block, 1)
    } else {
        (per_token, block / per_token)
    };
    // Registers are allocated per warp: a block of 129 threads holds 5 warps.
    let warps = (threads_per_token * tokens_per_block).div_ceil(32);
    let wave = sms
        .max(1)
        .saturating_mul((RESIDENT_THREADS_PER_SM / 32 / warps).max(1));
    let blocks = n.div_ceil(tokens_per_block).min(wave).clamp(1, MAX_BLOCKS);
    Ok((
        LaunchConfig {
            grid_dim: (grid_dim("cache_loc", blocks, i32::MAX as u32)?, 1, 1),
            // Both ≤ BLOCK_THREADS, so the casts are exact.
            block_dim: (threads_per_token as u32, tokens_per_block as u32, 1),
            shared_mem_bytes: 0,
        },
        WriteGeometry {
            chunks_per_head,
            threads_per_token,
            tokens_per_block,
        },
    ))
}

fn require_last_contiguous(
    arg: &'static str,
    shape: [usize; 3],
    strides: [usize; 3],
) -> Result<()> {
    if shape[2] > 1 && strides[2] != 1 {
        return Err(KernelError::Stride {
            arg,
            detail: format!(
                "last dim (head_dim) must be contiguous (stride 1), got strides {strides:?}"
            ),
        });
    }
    Ok(())
}

/// The input checks every write shares: `k` `[n, Hkv, D]` with `Hkv, D ≥ 1`,
/// `v` of the same shape, `cache_loc` `[n]` contiguous.
fn check_inputs(
    k: &Strided<'_, u16, 3>,
    v: &Strided<'_, u16, 3>,
    cache_loc: &Strided<'_, i64, 1>,
) -> Result<()> {
    let [n, heads, dim] = k.shape();
    if heads == 0 || dim == 0 {
        return Err(KernelError::unsupported(
            "k",
            "num_kv_heads and head_dim must be ≥ 1",
        ));
    }
    if v.shape() != [n, heads, dim] {
        return Err(KernelError::shape(
            "v",
            format!("[n={n}, Hkv={heads}, D={dim}] (as k)"),
            format!("{:?}", v.shape()),
        ));
    }
    if cache_loc.shape() != [n] {
        return Err(KernelError::shape(
            "cache_loc",
            format!("[n={n}]"),
            format!("{:?}", cache_loc.shape()),
        ));
    }
    if n > 1 && cache_loc.strides()[0] != 1 {
        return Err(KernelError::Stride {
            arg: "cache_loc",
            detail: format!("must be contiguous, got stride {}", cache_loc.strides()[0]),
        });
    }
    Ok(())
}

/// Validates `args` and returns the kernel parameters (pointers, scales and
/// geometry left for the launch to fill). Every rejection happens here,
/// before any launch.
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`] or
/// [`KernelError::Unsupported`] naming the argument.
pub fn validate<C>(args: &KvWriteArgs<'_, C>) -> Result<KvWriteParams> {
    let [n, heads, dim] = args.k.shape();
    check_inputs(&args.k, &args.v, &args.cache_loc)?;
    let [slots, cache_heads, cache_dim] = args.k_cache.shape();
    if cache_heads != heads || cache_dim != dim {
        return Err(KernelError::shape(
            "k_cache",
            format!("[S, Hkv={heads}, D={dim}]"),
            format!("{:?}", args.k_cache.shape()),
        ));
    }
    if args.v_cache.shape() != args.k_cache.shape() {
        return Err(KernelError::shape(
            "v_cache",
            format!("{:?} (as k_cache)", args.k_cache.shape()),
            format!("{:?}", args.v_cache.shape()),
        ));
    }
    require_last_contiguous("k", args.k.shape(), args.k.strides())?;
    require_last_contiguous("v", args.v.shape(), args.v.strides())?;
    require_last_contiguous("k_cache", args.k_cache.shape(), args.k_cache.strides())?;
    require_last_contiguous("v_cache", args.v_cache.shape(), args.v_cache.strides())?;
    if args.page_size == 0 {
        return Err(KernelError::unsupported("page_size", "must be ≥ 1"));
    }
    if slots % args.page_size != 0 {
        return Err(KernelError::unsupported(
            "k_cache",
            format!(
                "{slots} slots is not a multiple of page_size {}",
                args.page_size
            ),
        ));
    }
    // The grid splits every token's rows in i32 chunk counts.
    launch_config(1, heads, dim, 1, 1)?;
    let [kt, kh, _] = args.k.strides();
    let [vt, vh, _] = args.v.strides();
    let [kcs, kch, _] = args.k_cache.strides();
    let [vcs, vch, _] = args.v_cache.strides();
    Ok(KvWriteParams {
        k_token_stride: to_i64("k", kt)?,
        k_head_stride: to_i64("k", kh)?,
        v_token_stride: to_i64("v", vt)?,
        v_head_stride: to_i64("v", vh)?,
        k_cache_slot_stride: to_i64("k_cache", kcs)?,
        k_cache_head_stride: to_i64("k_cache", kch)?,
        v_cache_slot_stride: to_i64("v_cache", vcs)?,
        v_cache_head_stride: to_i64("v_cache", vch)?,
        num_tokens: to_i64("cache_loc", n)?,
        slots: to_i64("k_cache", slots)?,
        inv_k_scale: 1.0,
        inv_v_scale: 1.0,
        num_kv_heads: to_i32("num_kv_heads", heads)?,
        head_dim: to_i32("head_dim", dim)?,
        ..Default::default()
    })
}

/// Validates paged `args` ([`PagedKvWriteArgs`]) and returns the kernel
/// parameters (pointers, scales and geometry left for the launch).
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`] or
/// [`KernelError::Unsupported`] naming the argument.
pub fn validate_paged<C>(args: &PagedKvWriteArgs<'_, C>) -> Result<KvWriteParams> {
    let [n, heads, dim] = args.k.shape();
    let [pages, cache_heads, p, cache_dim] = args.k_cache.shape();
    check_inputs(&args.k, &args.v, &args.cache_loc)?;
    if cache_heads != heads || cache_dim != dim || p == 0 {
        return Err(KernelError::shape(
            "k_cache",
            format!("[num_pages, Hkv={heads}, P ≥ 1, D={dim}]"),
            format!("{:?}", args.k_cache.shape()),
        ));
    }
    if args.v_cache.shape() != args.k_cache.shape() {
        return Err(KernelError::shape(
            "v_cache",
            format!("{:?} (as k_cache)", args.k_cache.shape()),
            format!("{:?}", args.v_cache.shape()),
        ));
    }
    require_last_contiguous("k", args.k.shape(), args.k.strides())?;
    require_last_contiguous("v", args.v.shape(), args.v.strides())?;
    args.k_cache.require_last_contiguous()?;
    args.v_cache.require_last_contiguous()?;
    launch_config(1, heads, dim, 1, 1)?;
    let slots = pages.checked_mul(p).ok_or_else(|| {
        KernelError::unsupported("k_cache", "num_pages · page_size overflows usize")
    })?;
    let [kt, kh, _] = args.k.strides();
    let [vt, vh, _] = args.v.strides();
    let [kcp, kch, kct, _] = args.k_cache.strides();
    let [vcp, vch, vct, _] = args.v_cache.strides();
    Ok(KvWriteParams {
        k_token_stride: to_i64("k", kt)?,
        k_head_stride: to_i64("k", kh)?,
        v_token_stride: to_i64("v", vt)?,
        v_head_stride: to_i64("v", vh)?,
        k_cache_slot_stride: to_i64("k_cache", kct)?,
        k_cache_head_stride: to_i64("k_cache", kch)?,
        v_cache_slot_stride: to_i64("v_cache", vct)?,
        v_cache_head_stride: to_i64("v_cache", vch)?,
        num_tokens: to_i64("cache_loc", n)?,
        slots: to_i64("k_cache", slots)?,
        page_size: to_i64("k_cache", p)?,
        k_cache_page_stride: to_i64("k_cache", kcp)?,
        v_cache_page_stride: to_i64("v_cache", vcp)?,
        inv_k_scale: 1.0,
        inv_v_scale: 1.0,
        num_kv_heads: to_i32("num_kv_heads", heads)?,
        head_dim: to_i32("head_dim", dim)?,
        ..Default::default()
    })
}

fn check_fp8_scales(scales: &KvScales) -> Result<()> {
    if scales.cache_dtype() != KvCacheDtype::Fp8E4m3 {
        return Err(KernelError::unsupported(
            "scales",
            format!(
                "resolved for a {:?} cache, the write is to an e4m3 cache",
                scales.cache_dtype()
            ),
        ));
    }
    Ok(())
}

/// Device views of one write, whatever the cache view's rank: base
/// addresses and the `(extent, stride)` pairs [`vectorizable`] checks.
struct WriteViews {
    k: u64,
    v: u64,
    cache_loc: u64,
    k_cache: u64,
    v_cache: u64,
    /// Alignment facts of every view (a 4-D cache gives two entries).
    align: Vec<ViewAlignment>,
}

/// The KV-write launcher: the three kernel functions are resolved once, at
/// construction; launches are stream-ordered on the GPU's stream and
/// graph-capturable (no host sync, no allocation, no copy).
#[derive(Debug)]
pub struct KvWriteKernel {
    kernel: Launcher,
    sms: usize,
}

/// Entries of [`KvWriteKernel`]'s [`Launcher`], in this order.
const ENTRIES: [&str; 3] = [
    "fp8_kv_set_kv_buffer",
    "fp8_kv_fused_fp8_write_bf16",
    "fp8_kv_fused_fp8_write_f16",
];
const SET_KV: usize = 0;
const FP8_BF16: usize = 1;
const FP8_F16: usize = 2;

impl KvWriteKernel {
    /// Loads the fp8-kv kernels on `gpu` and reads its SM count (the grid
    /// of a large write is one wave, [`launch_config`]).
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        let sms = gpu
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ok()
            .and_then(|x| usize::try_from(x).ok())
            .filter(|&x| x > 0)
            .unwrap_or(DEFAULT_SMS);
        Ok(Self {
            sms,
            kernel: Launcher::new(gpu, &PTX, &ENTRIES)?,
        })
    }

    /// The same launcher planning its grids for a device of `sms` SMs
    /// (≥ 1) instead of the one it runs on: `with_sm_count(1)` gives a
    /// 4-block wave, so even a few dozen tokens take the grid-stride loop and
    /// several tokens per thread (tests use it). Results do not depend on it.
    #[must_use]
    pub fn with_sm_count(mut self, sms: usize) -> Self {
        self.sms = sms.max(1);
        self
    }

    /// SM count the launch geometry is planned for.
    pub fn sm_count(&self) -> usize {
        self.sms
    }

    /// Kernel launches issued so far by this launcher.
    pub fn launches(&self) -> u64 {
        self.kernel.launches()
    }

    /// `set_kv_buffer` for a bf16/f16 cache (SEMANTICS.md §fp8-kv.2, same dtype): copies
    /// `k[t]`, `v[t]` (`[Hkv, D]` rows) to slot `cache_loc[t]` of `k_cache`,
    /// `v_cache`, bit for bit, K and V in one launch; `n == 0` launches
    /// nothing. Checkpoint scales do not apply (D8). A slot outside `[0, S)`
    /// is skipped and counted in `errors` ([`crate::ErrorFlags`]).
    /// Asynchronous: buffers must stay alive until the stream is synchronised.
    ///
    /// # Errors
    /// As [`validate`]; [`KernelError::Driver`] when the launch fails.
    pub fn set_kv_buffer(
        &self,
        args: &mut KvWriteArgs<'_, u16>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.set_kv_buffer_on(self.kernel.gpu().stream(), args, errors)
    }

    /// [`KvWriteKernel::set_kv_buffer`] on `stream` instead of the GPU's own
    /// stream (e.g. an engine's stream from [`Gpu::borrowed_stream`]).
    ///
    /// # Errors
    /// As [`KvWriteKernel::set_kv_buffer`]; [`KernelError::Unsupported`]
    /// when the stream belongs to another context.
    pub fn set_kv_buffer_on(
        &self,
        stream: &CudaStream,
        args: &mut KvWriteArgs<'_, u16>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        let params = validate(args)?;
        self.launch(stream, SET_KV, args, params, false, errors)
    }

    /// Fused FP8 quantize + write (SEMANTICS.md §fp8-kv.3, D7): for an e4m3 cache, writes
    /// `e4m3_satfinite(f32(k[t,h,d]) · f32(1/k_scale))` (and V with
    /// `v_scale`) at slot `cache_loc[t]`, K and V in one launch; `n == 0`
    /// launches nothing. `dtype` says how to read `k`/`v`; `scales` is the
    /// layer's resolved pair (an e4m3 one). A slot outside `[0, S)` is skipped
    /// and counted in `errors`. Asynchronous, as [`Self::set_kv_buffer`].
    ///
    /// # Errors
    /// As [`validate`]; [`KernelError::Unsupported`] when `scales` was
    /// resolved for another cache dtype; [`KernelError::Driver`] on launch failure.
    pub fn fused_fp8_set_kv_buffer(
        &self,
        args: &mut KvWriteArgs<'_, u8>,
        dtype: KvDtype,
        scales: &KvScales,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.fused_fp8_set_kv_buffer_on(self.kernel.gpu().stream(), args, dtype, scales, errors)
    }

    /// [`KvWriteKernel::fused_fp8_set_kv_buffer`] on `stream` instead of the
    /// GPU's own stream (e.g. an engine's stream from
    /// [`Gpu::borrowed_stream`]).
    ///
    /// # Errors
    /// As [`KvWriteKernel::fused_fp8_set_kv_buffer`];
    /// [`KernelError::Unsupported`] when the stream belongs to another context.
    pub fn fused_fp8_set_kv_buffer_on(
        &self,
        stream: &CudaStream,
        args: &mut KvWriteArgs<'_, u8>,
        dtype: KvDtype,
        scales: &KvScales,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        check_fp8_scales(scales)?;
        let mut params = validate(args)?;
        params.inv_k_scale = scales.inv_k_scale();
        params.inv_v_scale = scales.inv_v_scale();
        let entry = match dtype {
            KvDtype::Bf16 => FP8_BF16,
            KvDtype::F16 => FP8_F16,
        };
        self.launch(stream, entry, args, params, true, errors)
    }

    /// `set_kv_buffer` into paged bf16/f16 cache views
    /// ([`PagedKvWriteArgs`]: NHD, HND or any strides the views take),
    /// otherwise exactly [`Self::set_kv_buffer`]. Asynchronous.
    ///
    /// # Errors
    /// As [`validate_paged`]; [`KernelError::Driver`] when the launch fails.
    pub fn set_kv_buffer_paged(
        &self,
        args: &mut PagedKvWriteArgs<'_, u16>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.set_kv_buffer_paged_on(self.kernel.gpu().stream(), args, errors)
    }

    /// [`KvWriteKernel::set_kv_buffer_paged`] on `stream` (an engine's).
    /// # Errors
    /// As that; [`KernelError::Unsupported`] for another context's stream.
    pub fn set_kv_buffer_paged_on(
        &self,
        stream: &CudaStream,
        args: &mut PagedKvWriteArgs<'_, u16>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        let params = validate_paged(args)?;
        let views = self.paged_views(args);
        self.launch_views(stream, SET_KV, views, params, false, errors)
    }

    /// The fused FP8 write into paged e4m3 cache views
    /// ([`PagedKvWriteArgs`]), otherwise exactly
    /// [`Self::fused_fp8_set_kv_buffer`]. Asynchronous.
    ///
    /// # Errors
    /// As [`validate_paged`] and [`Self::fused_fp8_set_kv_buffer`].
    pub fn fused_fp8_set_kv_buffer_paged(
        &self,
        args: &mut PagedKvWriteArgs<'_, u8>,
        dtype: KvDtype,
        scales: &KvScales,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        check_fp8_scales(scales)?;
        let mut params = validate_paged(args)?;
        params.inv_k_scale = scales.inv_k_scale();
        params.inv_v_scale = scales.inv_v_scale();
        let entry = match dtype {
            KvDtype::Bf16 => FP8_BF16,
            KvDtype::F16 => FP8_F16,
        };
        let views = self.paged_views(args);
        self.launch_views(
            self.kernel.gpu().stream(),
            entry,
            views,
            params,
            true,
            errors,
        )
    }

    fn paged_views<C>(&self, args: &mut PagedKvWriteArgs<'_, C>) -> WriteViews {
        let stream = self.kernel.gpu().stream();
        let [n, heads, _] = args.k.shape();
        let [pages, _, p, _] = args.k_cache.shape();
        let out_elem = std::mem::size_of::<C>();
        let (k, v) = (args.k.device_ptr(stream), args.v.device_ptr(stream));
        let (kc, vc) = (
            args.k_cache.device_ptr_mut(stream),
            args.v_cache.device_ptr_mut(stream),
        );
        let rows = |addr, s: [usize; 3]| ViewAlignment {
            addr,
            elem_bytes: 2,
            outer: [(n, s[0]), (heads, s[1])],
        };
        let cache = |addr, s: [usize; 4]| {
            [
                ViewAlignment {
                    addr,
                    elem_bytes: out_elem,
                    outer: [(pages, s[0]), (heads, s[1])],
                },
                ViewAlignment {
                    addr,
                    elem_bytes: out_elem,
                    outer: [(p, s[2]), (1, 0)],
                },
            ]
        };
        let mut align = vec![rows(k, args.k.strides()), rows(v, args.v.strides())];
        align.extend(cache(kc, args.k_cache.strides()));
        align.extend(cache(vc, args.v_cache.strides()));
        WriteViews {
            k,
            v,
            cache_loc: args.cache_loc.device_ptr(stream),
            k_cache: kc,
            v_cache: vc,
            align,
        }
    }

    fn launch<C>(
        &self,
        stream: &CudaStream,
        entry: usize,
        args: &mut KvWriteArgs<'_, C>,
        params: KvWriteParams,
        fp8: bool,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        let [n, heads, _] = args.k.shape();
        let slots = args.k_cache.shape()[0];
        let out_elem = std::mem::size_of::<C>();
        let view = |addr: u64, elem_bytes: usize, s: [usize; 3], e0: usize| ViewAlignment {
            addr,
            elem_bytes,
            outer: [(e0, s[0]), (heads, s[1])],
        };
        let (k, v) = (args.k.device_ptr(stream), args.v.device_ptr(stream));
        let (kc, vc) = (
            args.k_cache.device_ptr_mut(stream),
            args.v_cache.device_ptr_mut(stream),
        );
        let views = WriteViews {
            k,
            v,
            cache_loc: args.cache_loc.device_ptr(stream),
            k_cache: kc,
            v_cache: vc,
            align: vec![
                view(k, 2, args.k.strides(), n),
                view(v, 2, args.v.strides(), n),
                view(kc, out_elem, args.k_cache.strides(), slots),
                view(vc, out_elem, args.v_cache.strides(), slots),
            ],
        };
        self.launch_views(stream, entry, views, params, fp8, errors)
    }

    fn launch_views(
        &self,
        stream: &CudaStream,
        entry: usize,
        views: WriteViews,
        mut params: KvWriteParams,
        fp8: bool,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.kernel.gpu().require_stream(stream)?;
        if params.num_tokens == 0 {
            return Ok(());
        }
        params.k = views.k;
        params.v = views.v;
        params.cache_loc = views.cache_loc;
        params.k_cache = views.k_cache;
        params.v_cache = views.v_cache;
        params.errors = errors.device_ptr();
        let n = params.num_tokens as usize;
        let heads = params.num_kv_heads as usize;
        let dim = params.head_dim as usize;
        let vec = vectorizable(dim, fp8, &views.align);
        let (cfg, geo) = launch_config(n, heads, dim, chunk_elems(fp8, vec), self.sms)?;
        params.chunks_per_head = to_i32("head_dim", geo.chunks_per_head)?;
        params.threads_per_token = to_i32("head_dim", geo.threads_per_token)?;
        params.tokens_per_block = to_i32("head_dim", geo.tokens_per_block)?;
        params.vectorized = i32::from(vec);
        // SAFETY: `validate` / `validate_paged` checked every shape and
        // stride, and the Strided/StridedMut constructors checked that every
        // index inside [n, Hkv, D] and the cache view ([S, Hkv, D] or
        // [num_pages, Hkv, P, D], S = num_pages·P) lies in its buffer; the
        // kernel writes only slots in [0, S) (others are skipped and
        // counted), at page s / P, token s % P for a paged view, and reads
        // only tokens in [0, n); 16-byte accesses are used only when
        // `vectorizable` proved every address and stride aligned; the params
        // layout is pinned by a test.
        unsafe { self.kernel.launch(stream, entry, cfg, &params) }?;
        Ok(())
    }
}
