//! Typed launcher of the decode/verify kernels (split merge fused in).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kernel_rt::cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use kernel_rt::cudarc::driver::{
    CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use kernel_rt::{
    grid_dim, to_i32, to_i64, DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut,
    MAX_GRID_YZ,
};

use crate::{HalfDtype, KvDtype, HEAD_DIMS, PTX};

/// Threads per CTA.
pub const BLOCK_THREADS: u32 = 128;
/// Query rows (token, head) packed into one CTA.
pub const ROWS_PER_CTA: usize = 16;
/// Tokens per KV tile of the CUDA-core kernel.
pub const TILE_TOKENS: usize = 32;
/// Tokens per KV tile of the tensor-core kernel (4 warps × 16).
pub const MMA_TILE_TOKENS: usize = 64;
/// Head dims with a tensor-core kernel.
pub const MMA_HEAD_DIMS: [usize; 2] = [64, 128];
/// Largest supported GQA group `Hq / Hkv`.
pub const MAX_GROUP: usize = 16;
/// Largest uniform `q_len_per_req` / ragged `max_q_len`.
pub const MAX_Q_LEN: usize = 16;
/// Windows at or above this are "no window" (keys never reach 2^30 positions).
const WINDOW_CAP: u32 = 1 << 30;

kernel_rt::abi_struct! {
    /// Kernel parameters, defined for C in the generated
    /// `kernels/paged_attention_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct PagedAttentionParams {
        /// `const u16*` `[num_tokens, Hq, D]`.
        pub q: u64 = "const u16*",
        /// `u16*` `[num_tokens, Hq, D]`.
        pub out: u64 = "u16*",
        /// `const u8*` K view base.
        pub k_cache: u64 = "const u8*",
        /// `const u8*` V view base.
        pub v_cache: u64 = "const u8*",
        /// `const i32*` `[bs, M]`.
        pub page_table: u64 = "const i32*",
        /// `const i32*` `[bs]`.
        pub cache_seqlens: u64 = "const i32*",
        /// `const i32*` `[bs + 1]` or 0 (uniform).
        pub cu_seqlens_q: u64 = "const i32*",
        /// `const f32*` `[Hq]` or 0.
        pub sinks: u64 = "const float*",
        /// `f32*` partial outputs or 0.
        pub ws_o: u64 = "float*",
        /// `f32*` partial (m, d) or 0.
        pub ws_ml: u64 = "float*",
        /// `u32*` `[2]` error word.
        pub errors: u64 = "u32*",
        /// Elements between query tokens.
        pub q_stride_tok: i64 = "i64",
        /// Elements between query heads.
        pub q_stride_head: i64 = "i64",
        /// Elements between output tokens.
        pub o_stride_tok: i64 = "i64",
        /// Elements between output heads.
        pub o_stride_head: i64 = "i64",
        /// K page stride, elements.
        pub k_stride_page: i64 = "i64",
        /// K head stride (0 when `Hkv = 1`).
        pub k_stride_head: i64 = "i64",
        /// K token stride.
        pub k_stride_tok: i64 = "i64",
        /// V page stride.
        pub v_stride_page: i64 = "i64",
        /// V head stride (0 when `Hkv = 1`).
        pub v_stride_head: i64 = "i64",
        /// V token stride.
        pub v_stride_tok: i64 = "i64",
        /// Elements between page-table rows.
        pub page_table_stride: i64 = "i64",
        /// Requests.
        pub bs: i32 = "i32",
        /// `Hq`.
        pub num_q_heads: i32 = "i32",
        /// `Hkv`.
        pub num_kv_heads: i32 = "i32",
        /// `G = Hq / Hkv`.
        pub group: i32 = "i32",
        /// `P`.
        pub page_size: i32 = "i32",
        /// `M`.
        pub max_num_pages: i32 = "i32",
        /// Pages in the pool.
        pub num_pages: i32 = "i32",
        /// Query rows.
        pub num_tokens: i32 = "i32",
        /// Uniform `q_len_per_req` or ragged `max_q_len`.
        pub q_len: i32 = "i32",
        /// `ceil(q_len · G / 16)`.
        pub row_tiles: i32 = "i32",
        /// `S_max`, grid x.
        pub max_splits: i32 = "i32",
        /// Fixed split size in tokens, 0 = auto.
        pub fixed_chunk: i32 = "i32",
        /// `W` or −1.
        pub window_left: i32 = "i32",
        /// `bmm1_scale · log2 e`.
        pub scale_log2: f32 = "float",
        /// `bmm2_scale`.
        pub bmm2_scale: f32 = "float",
        /// KV tokens per CTA tile of the launched kernel (32 CUDA-core, 64
        /// tensor-core): auto split chunks are multiples of it.
        pub tile_tokens: i32 = "i32",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/paged_attention_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for PagedAttentionParams {}

/// K and V pools as `[num_pages, Hkv, P, D]` strided views (element strides;
/// last dim contiguous; the stride of a size-1 dim is ignored). The HND-shaped
/// view of the slot-major pool has strides `(P·Hkv·D, D, Hkv·D, 1)`.
#[derive(Debug)]
pub enum KvCache<'a> {
    /// bf16 or f16 bits.
    Half {
        /// Element type of both pools.
        dtype: HalfDtype,
        /// K view.
        k: Strided<'a, u16, 4>,
        /// V view, same shape.
        v: Strided<'a, u16, 4>,
    },
    /// e4m3 bytes (scales folded into `bmm1_scale`/`bmm2_scale`).
    E4m3 {
        /// K view.
        k: Strided<'a, u8, 4>,
        /// V view, same shape.
        v: Strided<'a, u8, 4>,
    },
}

impl KvCache<'_> {
    /// Element type.
    pub fn dtype(&self) -> KvDtype {
        match self {
            Self::Half {
                dtype: HalfDtype::Bf16,
                ..
            } => KvDtype::Bf16,
            Self::Half {
                dtype: HalfDtype::F16,
                ..
            } => KvDtype::F16,
            Self::E4m3 { .. } => KvDtype::E4m3,
        }
    }

    pub(crate) fn shapes(&self) -> ([usize; 4], [usize; 4], [usize; 4], [usize; 4]) {
        match self {
            Self::Half { k, v, .. } => (k.shape(), k.strides(), v.shape(), v.strides()),
            Self::E4m3 { k, v } => (k.shape(), k.strides(), v.shape(), v.strides()),
        }
    }
}

/// How query rows are grouped into requests (SEMANTICS.md §attention.4.1).
#[derive(Debug)]
pub enum QueryLayout<'a> {
    /// `n = q_len_per_req` rows per request (1 = decode), `num_tokens = bs·n`.
    Uniform {
        /// 1..=16.
        q_len_per_req: usize,
    },
    /// Request `i` owns rows `cu_seqlens_q[i] .. cu_seqlens_q[i+1]` (n may be 0);
    /// requests breaking the ragged rule of the crate docs are skipped and counted.
    Ragged {
        /// `[bs + 1]` i32, contiguous.
        cu_seqlens_q: Strided<'a, i32, 1>,
        /// 1..=16, upper bound on rows per request (longer requests skipped, counted).
        max_q_len: usize,
    },
}

/// Which kernel computes the attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelPath {
    /// The tensor-core kernel (`paged_attention_mma_*`: mma.sync m16n8k16,
    /// per-warp cp.async rings) when [`mma_supported`] holds, else the
    /// CUDA-core kernel.
    #[default]
    Auto,
    /// Always the CUDA-core kernel (`paged_attention_decode_*`), e.g. to
    /// compare the two.
    Simt,
}

/// Whether the tensor-core kernel handles a call: head dim 64 or 128, and KV
/// either e4m3 or the same 16-bit dtype as Q (every GQA group and `q_len`).
pub fn mma_supported(q: HalfDtype, kv: KvDtype, head_dim: usize) -> bool {
    let kv_ok = match kv {
        KvDtype::E4m3 => true,
        KvDtype::Bf16 => q == HalfDtype::Bf16,
        KvDtype::F16 => q == HalfDtype::F16,
    };
    kv_ok && MMA_HEAD_DIMS.contains(&head_dim)
}

/// Split-KV policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitMode {
    /// Splits chosen from the launch shape to fill the GPU (`S_max =
    /// ⌊2·SMs / (bs·Hkv·row_tiles)⌋`, capped by `⌈max_seq_len/128⌉`);
    /// deterministic run to run, not across batch compositions.
    Auto,
    /// Every request's key range is cut into chunks of `chunk_tokens` from its
    /// first needed key: results are bitwise identical run to run and
    /// independent of the batch (as long as `L ≤ max_seq_len`).
    Fixed {
        /// Tokens per split, ≥ 1.
        chunk_tokens: usize,
    },
    /// Length-aware splits with a bounded grid: as `Fixed`, but at most
    /// `max_splits` splits per request (`S_max = min(max_splits,
    /// ⌈max_seq_len / chunk_tokens⌉)`); a request whose key range needs more
    /// chunks gets chunks of `chunk_tokens · ⌈n / max_splits⌉` tokens
    /// (`n = ⌈L_eff / chunk_tokens⌉`). Short requests run as one CTA that
    /// writes its rows directly; long ones are cut so that no single CTA
    /// becomes the tail of a batch that already fills the GPU. The split of a
    /// request depends only on its own length: bitwise identical run to run
    /// and across batch compositions.
    Chunked {
        /// Tokens per split, ≥ 1.
        chunk_tokens: usize,
        /// Splits per request at most, ≥ 1.
        max_splits: usize,
    },
}

/// Arguments of one decode / verify call (device buffers on the launcher's GPU).
#[derive(Debug)]
pub struct DecodeArgs<'a> {
    /// `[num_tokens, Hq, D]`, bf16/f16 bits; last dim contiguous, token and
    /// head strides multiples of 8, base 16-byte aligned.
    pub q: Strided<'a, u16, 3>,
    /// Dtype of `q` and `out`.
    pub q_dtype: HalfDtype,
    /// `[num_tokens, Hq, D]` output, same dtype and alignment rules as `q`.
    pub out: StridedMut<'a, u16, 3>,
    /// K/V pools.
    pub kv: KvCache<'a>,
    /// `[bs, M]` i32 page ids, last dim contiguous.
    pub page_table: Strided<'a, i32, 2>,
    /// `[bs]` i32 KV lengths (including the new tokens), contiguous.
    pub cache_seqlens: Strided<'a, i32, 1>,
    /// Rows per request.
    pub layout: QueryLayout<'a>,
    /// Upper bound on `cache_seqlens` (sizes splits and the workspace), ≥ 1.
    pub max_seq_len: usize,
    /// Logit scale in natural-log units (finite).
    pub bmm1_scale: f32,
    /// Output scale (finite).
    pub bmm2_scale: f32,
    /// `W`: keys `[x − W, x]`; `None` = no window.
    pub window_left: Option<u32>,
    /// `[Hq]` f32 sink logits, contiguous.
    pub sinks: Option<Strided<'a, f32, 1>>,
    /// Split policy.
    pub split: SplitMode,
    /// f32 scratch of at least [`LaunchPlan::workspace_elems`] elements when
    /// that is non-zero. Its last `bs·Hkv·row_tiles` elements are u32 split
    /// counters ([`workspace_elems`]): zero them once (e.g. `alloc_zeros`)
    /// before the first launch; every launch leaves them zero again.
    pub workspace: Option<StridedMut<'a, f32, 1>>,
}

/// Everything [`validate`] derives from the arguments.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    /// Kernel params (pointers 0: filled at launch).
    pub params: PagedAttentionParams,
    /// Kernel entry name.
    pub entry: String,
    /// Launch geometry (the split merge runs inside the same launch).
    pub config: LaunchConfig,
    /// Workspace f32 elements needed.
    pub workspace_elems: usize,
    /// Head dim.
    pub head_dim: usize,
}

/// Kernel entry name (CUDA-core kernel) for a dtype pair and head dim.
pub fn entry_name(q: HalfDtype, kv: KvDtype, head_dim: usize) -> String {
    format!(
        "paged_attention_decode_{}_kv_{}_d{head_dim}",
        q.name(),
        kv.name()
    )
}

/// Tensor-core kernel entry name (exists when [`mma_supported`]).
pub fn mma_entry_name(q: HalfDtype, kv: KvDtype, head_dim: usize) -> String {
    format!(
        "paged_attention_mma_{}_kv_{}_d{head_dim}",
        q.name(),
        kv.name()
    )
}

/// The tensor-core entries: `(q, kv, head_dim)`.
pub fn mma_variants() -> Vec<(HalfDtype, KvDtype, usize)> {
    let mut v = Vec::new();
    for q in [HalfDtype::Bf16, HalfDtype::F16] {
        for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
            for d in MMA_HEAD_DIMS {
                if mma_supported(q, kv, d) {
                    v.push((q, kv, d));
                }
            }
        }
    }
    v
}

/// Dynamic shared memory of the tensor-core kernel (mirrors `MmaSmem` in the
/// .cu): per warp a ring of NST slots (3 for 16-bit KV, 6 for e4m3) of 16 K
/// rows + 16 V rows as loaded (`D·es` bytes each); then row stats `2·4·16`
/// f32 and valid masks `4·NST·2` u32. The warp-merge scratch `4·16·(D+8)`
/// f32 aliases the rings.
pub fn mma_smem_bytes(head_dim: usize, kv: KvDtype) -> usize {
    let nst = match kv {
        KvDtype::E4m3 => 6,
        _ => 3,
    };
    let slot = 16 * head_dim * kv.size() * 2;
    let ring = 4 * nst * slot;
    let bytes = ring + 2 * 4 * ROWS_PER_CTA * 4 + 4 * nst * 2 * 4;
    bytes.div_ceil(16) * 16
}

/// Dynamic shared memory of the decode kernel (mirrors `Smem` in the .cu):
/// f32 Q `[16, D]`, NST stages (3 for D ≤ 128, else 2) of K and V
/// `[32, D·es + 16]`, P `[16, 33]` f32, row stats, stage masks.
pub fn smem_bytes(head_dim: usize, kv: KvDtype) -> usize {
    let nst = if head_dim <= 128 { 3 } else { 2 };
    let srb = head_dim * kv.size() + 16;
    let bytes = ROWS_PER_CTA * head_dim * 4
        + 2 * nst * TILE_TOKENS * srb
        + ROWS_PER_CTA * (TILE_TOKENS + 1) * 4
        + 3 * ROWS_PER_CTA * 4
        + nst * 4;
    bytes.div_ceil(16) * 16
}

/// f32 workspace elements for a launch: `items · S_max · 16 · (D + 2) + items`
/// with `items = bs · Hkv · row_tiles`; 0 when `S_max = 1` (no split).
/// Layout: partial O `[items, S_max, 16, D]` f32, partial (m, d)
/// `[items, S_max, 16, 2]` f32, then `items` u32 arrival counters (the last
/// `items` elements), which must be zero before the first launch and are
/// zero again after every launch (the last CTA of an item resets its counter).
pub fn workspace_elems(
    bs: usize,
    num_kv_heads: usize,
    row_tiles: usize,
    max_splits: usize,
    head_dim: usize,
) -> usize {
    if max_splits <= 1 {
        return 0;
    }
    let items = bs * num_kv_heads * row_tiles;
    items * max_splits * ROWS_PER_CTA * (head_dim + 2) + items
}

/// Workspace f32 elements a launch with these shapes needs (0 = none): the
/// size function callers use to allocate the workspace once.
/// `q_len` = `q_len_per_req` or `max_q_len`.
///
/// # Errors
/// As [`launch_config`].
#[allow(clippy::too_many_arguments)]
pub fn workspace_for(
    bs: usize,
    num_q_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    q_len: usize,
    max_seq_len: usize,
    split: SplitMode,
    num_sms: usize,
) -> Result<usize> {
    let group = num_q_heads / num_kv_heads.max(1);
    let row_tiles = (q_len * group).div_ceil(ROWS_PER_CTA).max(1);
    let (s, _) = launch_config(bs, num_kv_heads, row_tiles, max_seq_len, split, num_sms, 0)?;
    Ok(workspace_elems(bs, num_kv_heads, row_tiles, s, head_dim))
}

/// Launch geometry (pure): returns `(S_max, config)`. Grid
/// `(S_max, Hkv·row_tiles, bs)`, [`BLOCK_THREADS`] threads; with `S_max > 1`
/// the last CTA of each `(request, KV head, row tile)` merges the splits.
///
/// # Errors
/// [`KernelError::Unsupported`] when a grid dim exceeds CUDA's limits.
#[allow(clippy::too_many_arguments)]
pub fn launch_config(
    bs: usize,
    num_kv_heads: usize,
    row_tiles: usize,
    max_seq_len: usize,
    split: SplitMode,
    num_sms: usize,
    smem: usize,
) -> Result<(usize, LaunchConfig)> {
    let items = (bs * num_kv_heads * row_tiles).max(1);
    let max_splits = match split {
        SplitMode::Auto => ((2 * num_sms) / items).clamp(1, max_seq_len.div_ceil(128).max(1)),
        SplitMode::Fixed { chunk_tokens } => max_seq_len.div_ceil(chunk_tokens.max(1)).max(1),
        SplitMode::Chunked {
            chunk_tokens,
            max_splits,
        } => max_seq_len
            .div_ceil(chunk_tokens.max(1))
            .clamp(1, max_splits.max(1)),
    };
    let y = grid_dim("num_kv_heads", num_kv_heads * row_tiles, MAX_GRID_YZ)?;
    let z = grid_dim("bs", bs, MAX_GRID_YZ)?;
    let x = grid_dim("max_splits", max_splits, i32::MAX as u32)?;
    let cfg = LaunchConfig {
        grid_dim: (x, y, z),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    Ok((max_splits, cfg))
}

pub(crate) fn stride_err(arg: &'static str, detail: String) -> KernelError {
    KernelError::Stride { arg, detail }
}

/// Effective stride: 0 for a size-1 dim (its stride is ignored).
pub(crate) fn eff(shape: &[usize], strides: &[usize], i: usize) -> usize {
    if shape[i] == 1 {
        0
    } else {
        strides[i]
    }
}

pub(crate) fn check_vector<T>(arg: &'static str, v: &Strided<'_, T, 1>, n: usize) -> Result<()> {
    if v.shape()[0] != n {
        return Err(KernelError::shape(
            arg,
            format!("[{n}]"),
            format!("{:?}", v.shape()),
        ));
    }
    if n > 1 && v.strides()[0] != 1 {
        return Err(stride_err(
            arg,
            format!("must be contiguous, got stride {}", v.strides()[0]),
        ));
    }
    Ok(())
}

/// Element strides of the views every attention kernel reads (a size-1
/// dim's stride is 0, see [`eff`]), each checked to fit `i64`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ViewStrides {
    /// `q [num_tokens, Hq, D]`: token, head.
    pub q: [i64; 2],
    /// `out`: token, head.
    pub out: [i64; 2],
    /// K cache `[num_pages, Hkv, P, D]`: page, head, token.
    pub k: [i64; 3],
    /// V cache: page, head, token.
    pub v: [i64; 3],
    /// Between `page_table` rows (`[bs, m]`).
    pub page_table: i64,
}

/// The [`ViewStrides`] of validated views (`bs` requests, `m` page-table
/// columns).
///
/// # Errors
/// [`KernelError::Unsupported`] when a stride exceeds `i64`.
pub(crate) fn view_strides(
    q: &Strided<'_, u16, 3>,
    out: &StridedMut<'_, u16, 3>,
    kv: &KvCache<'_>,
    page_table: &Strided<'_, i32, 2>,
    bs: usize,
    m: usize,
) -> Result<ViewStrides> {
    let (ks, kst, vs, vst) = kv.shapes();
    let (qs, qst, os, ost) = (q.shape(), q.strides(), out.shape(), out.strides());
    let e = |arg, shape: &[usize], strides: &[usize], i| to_i64(arg, eff(shape, strides, i));
    Ok(ViewStrides {
        q: [e("q", &qs, &qst, 0)?, e("q", &qs, &qst, 1)?],
        out: [e("out", &os, &ost, 0)?, e("out", &os, &ost, 1)?],
        k: [
            e("k_cache", &ks, &kst, 0)?,
            e("k_cache", &ks, &kst, 1)?,
            e("k_cache", &ks, &kst, 2)?,
        ],
        v: [
            e("v_cache", &vs, &vst, 0)?,
            e("v_cache", &vs, &vst, 1)?,
            e("v_cache", &vs, &vst, 2)?,
        ],
        page_table: e("page_table", &[bs, m], &page_table.strides(), 0)?,
    })
}

/// The checks on `sinks` (`[Hq]` f32, contiguous) and the two bmm scales
/// (finite) that every attention launch shares.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::Stride`] (`sinks`),
/// [`KernelError::Unsupported`] (a non-finite scale).
pub(crate) fn check_sinks_and_scales(
    sinks: Option<&Strided<'_, f32, 1>>,
    hq: usize,
    bmm1_scale: f32,
    bmm2_scale: f32,
) -> Result<()> {
    if let Some(s) = sinks {
        check_vector("sinks", s, hq)?;
    }
    if !bmm1_scale.is_finite() {
        return Err(KernelError::unsupported("bmm1_scale", "must be finite"));
    }
    if !bmm2_scale.is_finite() {
        return Err(KernelError::unsupported("bmm2_scale", "must be finite"));
    }
    Ok(())
}

/// Device base addresses `[q, out, k_cache, v_cache]`, each checked to be
/// 16-byte aligned (the kernels load and store 16 bytes at a time).
///
/// # Errors
/// [`KernelError::Stride`] naming the misaligned argument.
pub(crate) fn base_ptrs(
    stream: &CudaStream,
    q: &Strided<'_, u16, 3>,
    out: &mut StridedMut<'_, u16, 3>,
    kv: &KvCache<'_>,
) -> Result<[u64; 4]> {
    let (k, v) = match kv {
        KvCache::Half { k, v, .. } => (k.device_ptr(stream), v.device_ptr(stream)),
        KvCache::E4m3 { k, v } => (k.device_ptr(stream), v.device_ptr(stream)),
    };
    let ptrs = [q.device_ptr(stream), out.device_ptr_mut(stream), k, v];
    for (arg, ptr) in ["q", "out", "k_cache", "v_cache"].into_iter().zip(ptrs) {
        if ptr % 16 != 0 {
            return Err(stride_err(
                arg,
                format!("base address {ptr:#x} is not 16-byte aligned"),
            ));
        }
    }
    Ok(ptrs)
}

/// Shapes every attention launch shares, after [`validate_views`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ViewShapes {
    pub num_tokens: usize,
    pub hq: usize,
    pub dim: usize,
    pub num_pages: usize,
    pub hkv: usize,
    pub page_size: usize,
    pub group: usize,
    pub bs: usize,
    pub m: usize,
}

/// The checks the decode and the context launchers share: head dim, `out`
/// as `q`, K and V caches alike and `[num_pages ≥ 1, Hkv ≥ 1, P ≥ 1, D]`
/// with 16-byte-aligned strides (size-1 dims ignored), GQA divisibility and
/// group limit, `q`/`out` strides, a contiguous `[bs, M ≥ 1]` page table and
/// `cache_seqlens [bs]`.
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`] or
/// [`KernelError::Unsupported`] naming the argument.
pub(crate) fn validate_views(
    q: &Strided<'_, u16, 3>,
    out: &StridedMut<'_, u16, 3>,
    kv: &KvCache<'_>,
    page_table: &Strided<'_, i32, 2>,
    cache_seqlens: &Strided<'_, i32, 1>,
) -> Result<ViewShapes> {
    let [num_tokens, hq, dim] = q.shape();
    let (ks, kst, vs, vst) = kv.shapes();
    let [num_pages, hkv, page_size, kdim] = ks;
    if !HEAD_DIMS.contains(&dim) {
        return Err(KernelError::unsupported(
            "q",
            format!("head_dim {dim} (supported: 64, 128, 256)"),
        ));
    }
    if out.shape() != q.shape() {
        return Err(KernelError::shape(
            "out",
            format!("{:?} (as q)", q.shape()),
            format!("{:?}", out.shape()),
        ));
    }
    if vs != ks {
        return Err(KernelError::shape(
            "v_cache",
            format!("{ks:?} (as k_cache)"),
            format!("{vs:?}"),
        ));
    }
    if kdim != dim {
        return Err(KernelError::shape(
            "k_cache",
            format!("[num_pages, Hkv, P, D={dim}]"),
            format!("{ks:?}"),
        ));
    }
    if num_pages == 0 || hkv == 0 || page_size == 0 {
        return Err(KernelError::shape(
            "k_cache",
            "[num_pages ≥ 1, Hkv ≥ 1, P ≥ 1, D]",
            format!("{ks:?}"),
        ));
    }
    if hq == 0 || hq % hkv != 0 {
        return Err(KernelError::unsupported(
            "q",
            format!("num_q_heads {hq} is not a multiple of num_kv_heads {hkv}"),
        ));
    }
    let group = hq / hkv;
    if group > MAX_GROUP {
        return Err(KernelError::unsupported(
            "q",
            format!("group size {group} > {MAX_GROUP}"),
        ));
    }
    let es = kv.dtype().size();
    for (arg, shape, st) in [("k_cache", ks, kst), ("v_cache", vs, vst)] {
        if st[3] != 1 {
            return Err(stride_err(
                arg,
                format!("last dim must be contiguous, got strides {st:?}"),
            ));
        }
        for i in 0..3 {
            if (eff(&shape, &st, i) * es) % 16 != 0 {
                return Err(stride_err(
                    arg,
                    format!("strides {st:?} must be multiples of 16 bytes (16-byte loads)"),
                ));
            }
        }
    }
    for (arg, shape, st) in [
        ("q", q.shape(), q.strides()),
        ("out", out.shape(), out.strides()),
    ] {
        if st[2] != 1 {
            return Err(stride_err(
                arg,
                format!("last dim must be contiguous, got strides {st:?}"),
            ));
        }
        if eff(&shape, &st, 0) % 8 != 0 || eff(&shape, &st, 1) % 8 != 0 {
            return Err(stride_err(
                arg,
                format!("token/head strides {st:?} must be multiples of 8 elements"),
            ));
        }
    }
    let [bs, m] = page_table.shape();
    if m == 0 {
        return Err(KernelError::shape(
            "page_table",
            "[bs, max_num_pages ≥ 1]",
            format!("{:?}", [bs, m]),
        ));
    }
    if m > 1 && page_table.strides()[1] != 1 {
        return Err(stride_err(
            "page_table",
            "last dim must be contiguous".into(),
        ));
    }
    check_vector("cache_seqlens", cache_seqlens, bs)?;
    Ok(ViewShapes {
        num_tokens,
        hq,
        dim,
        num_pages,
        hkv,
        page_size,
        group,
        bs,
        m,
    })
}

/// Validates `args` for a GPU with `num_sms` SMs and derives the launch plan.
/// Every rejection happens here, before any launch (D15).
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`],
/// [`KernelError::Unsupported`] or [`KernelError::Capacity`] (workspace)
/// naming the argument.
pub fn validate(args: &DecodeArgs<'_>, num_sms: usize) -> Result<LaunchPlan> {
    validate_path(args, num_sms, KernelPath::Auto)
}

/// [`validate`] for an explicit [`KernelPath`].
///
/// # Errors
/// As [`validate`].
pub fn validate_path(
    args: &DecodeArgs<'_>,
    num_sms: usize,
    path: KernelPath,
) -> Result<LaunchPlan> {
    plan_path(args, num_sms, path, true)
}

/// The launch plan; `check_workspace = false` skips only the workspace
/// capacity check (so a caller can size the workspace from the plan).
fn plan_path(
    args: &DecodeArgs<'_>,
    num_sms: usize,
    path: KernelPath,
    check_workspace: bool,
) -> Result<LaunchPlan> {
    let ViewShapes {
        num_tokens,
        hq,
        dim,
        num_pages,
        hkv,
        page_size,
        group,
        bs,
        m,
    } = validate_views(
        &args.q,
        &args.out,
        &args.kv,
        &args.page_table,
        &args.cache_seqlens,
    )?;
    let q_len = match &args.layout {
        QueryLayout::Uniform { q_len_per_req } => {
            if !(1..=MAX_Q_LEN).contains(q_len_per_req) {
                return Err(KernelError::unsupported(
                    "q_len_per_req",
                    format!("{q_len_per_req} (supported 1..=16)"),
                ));
            }
            if num_tokens != bs * q_len_per_req {
                return Err(KernelError::shape(
                    "q",
                    format!("[bs·q_len_per_req = {}, Hq, D]", bs * q_len_per_req),
                    format!("{:?}", args.q.shape()),
                ));
            }
            *q_len_per_req
        }
        QueryLayout::Ragged {
            cu_seqlens_q,
            max_q_len,
        } => {
            if !(1..=MAX_Q_LEN).contains(max_q_len) {
                return Err(KernelError::unsupported(
                    "max_q_len",
                    format!("{max_q_len} (supported 1..=16)"),
                ));
            }
            check_vector("cu_seqlens_q", cu_seqlens_q, bs + 1)?;
            *max_q_len
        }
    };
    check_sinks_and_scales(args.sinks.as_ref(), hq, args.bmm1_scale, args.bmm2_scale)?;
    if args.max_seq_len == 0 || args.max_seq_len >= WINDOW_CAP as usize {
        return Err(KernelError::unsupported(
            "max_seq_len",
            format!("{} (supported 1..2^30)", args.max_seq_len),
        ));
    }
    if let SplitMode::Fixed { chunk_tokens } | SplitMode::Chunked { chunk_tokens, .. } = args.split
    {
        if chunk_tokens == 0 || chunk_tokens >= WINDOW_CAP as usize {
            return Err(KernelError::unsupported(
                "split",
                "chunk_tokens must be in 1..2^30",
            ));
        }
    }
    if let SplitMode::Chunked { max_splits, .. } = args.split {
        if max_splits == 0 || max_splits > i32::MAX as usize {
            return Err(KernelError::unsupported(
                "split",
                "max_splits must be in 1..2^31",
            ));
        }
    }
    let row_tiles = (q_len * group).div_ceil(ROWS_PER_CTA);
    let use_mma = path == KernelPath::Auto && mma_supported(args.q_dtype, args.kv.dtype(), dim);
    let (smem, entry, tile_tokens) = if use_mma {
        (
            mma_smem_bytes(dim, args.kv.dtype()),
            mma_entry_name(args.q_dtype, args.kv.dtype(), dim),
            MMA_TILE_TOKENS,
        )
    } else {
        (
            smem_bytes(dim, args.kv.dtype()),
            entry_name(args.q_dtype, args.kv.dtype(), dim),
            TILE_TOKENS,
        )
    };
    let (max_splits, config) = launch_config(
        bs,
        hkv,
        row_tiles,
        args.max_seq_len,
        args.split,
        num_sms,
        smem,
    )?;
    let workspace_elems = workspace_elems(bs, hkv, row_tiles, max_splits, dim);
    if check_workspace && workspace_elems > 0 {
        let have = args.workspace.as_ref().map_or(0, |w| w.shape()[0]);
        if have < workspace_elems {
            return Err(KernelError::Capacity {
                arg: "workspace",
                needed: workspace_elems,
                available: have,
            });
        }
        if let Some(w) = &args.workspace {
            if w.strides()[0] != 1 {
                return Err(stride_err("workspace", "must be contiguous".into()));
            }
        }
    }
    let window = args
        .window_left
        .filter(|&w| w < WINDOW_CAP)
        .map_or(-1, |w| w as i32);
    let st = view_strides(&args.q, &args.out, &args.kv, &args.page_table, bs, m)?;
    let params = PagedAttentionParams {
        q_stride_tok: st.q[0],
        q_stride_head: st.q[1],
        o_stride_tok: st.out[0],
        o_stride_head: st.out[1],
        k_stride_page: st.k[0],
        k_stride_head: st.k[1],
        k_stride_tok: st.k[2],
        v_stride_page: st.v[0],
        v_stride_head: st.v[1],
        v_stride_tok: st.v[2],
        page_table_stride: st.page_table,
        bs: to_i32("bs", bs)?,
        num_q_heads: to_i32("q", hq)?,
        num_kv_heads: to_i32("k_cache", hkv)?,
        group: to_i32("q", group)?,
        page_size: to_i32("page_size", page_size)?,
        max_num_pages: to_i32("page_table", m)?,
        num_pages: to_i32("k_cache", num_pages)?,
        num_tokens: to_i32("q", num_tokens)?,
        q_len: to_i32("q_len", q_len)?,
        row_tiles: to_i32("q_len", row_tiles)?,
        max_splits: to_i32("max_splits", max_splits)?,
        fixed_chunk: match args.split {
            SplitMode::Auto => 0,
            SplitMode::Fixed { chunk_tokens } | SplitMode::Chunked { chunk_tokens, .. } => {
                to_i32("split", chunk_tokens)?
            }
        },
        window_left: window,
        scale_log2: args.bmm1_scale * std::f32::consts::LOG2_E,
        bmm2_scale: args.bmm2_scale,
        tile_tokens: tile_tokens as i32,
        ..Default::default()
    };
    Ok(LaunchPlan {
        params,
        entry,
        config,
        workspace_elems,
        head_dim: dim,
    })
}

/// The decode/verify launcher: every kernel function is resolved once, at
/// construction (with its dynamic shared memory limit raised); launches are
/// stream-ordered and graph-capturable (no host sync, allocation or copy).
#[derive(Debug)]
pub struct PagedAttentionKernel {
    gpu: Arc<Gpu>,
    funcs: HashMap<String, CudaFunction>,
    num_sms: usize,
    path: KernelPath,
    launches: AtomicU64,
}

impl PagedAttentionKernel {
    /// Loads every entry point on `gpu`.
    ///
    /// # Errors
    /// [`KernelError::Load`] when the PTX does not load; [`KernelError::Driver`].
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Self::with_path(gpu, KernelPath::Auto)
    }

    /// [`PagedAttentionKernel::new`] with an explicit kernel choice.
    ///
    /// # Errors
    /// As [`PagedAttentionKernel::new`].
    pub fn with_path(gpu: &Arc<Gpu>, path: KernelPath) -> Result<Self> {
        let mut funcs = HashMap::new();
        for (q, kv, d) in mma_variants() {
            let name = mma_entry_name(q, kv, d);
            let f = gpu.function(&PTX, &name)?;
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                mma_smem_bytes(d, kv) as i32,
            )?;
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )?;
            funcs.insert(name, f);
        }
        for q in [HalfDtype::Bf16, HalfDtype::F16] {
            for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
                for d in HEAD_DIMS {
                    let name = entry_name(q, kv, d);
                    let f = gpu.function(&PTX, &name)?;
                    f.set_attribute(
                        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem_bytes(d, kv) as i32,
                    )?;
                    funcs.insert(name, f);
                }
            }
        }
        let num_sms = gpu
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as usize;
        Ok(Self {
            gpu: gpu.clone(),
            funcs,
            num_sms,
            path,
            launches: AtomicU64::new(0),
        })
    }

    /// SMs of the device (input of [`launch_config`]).
    pub fn num_sms(&self) -> usize {
        self.num_sms
    }

    /// Kernel launches issued so far.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// The plan [`PagedAttentionKernel::launch`] would use, to size the
    /// workspace: everything is validated except the workspace's capacity
    /// (`args.workspace` may be `None`; `LaunchPlan::workspace_elems` says
    /// how many f32 it needs).
    ///
    /// # Errors
    /// As [`validate`], without the workspace [`KernelError::Capacity`].
    pub fn plan(&self, args: &DecodeArgs<'_>) -> Result<LaunchPlan> {
        plan_path(args, self.num_sms, self.path, false)
    }

    /// The kernel choice of this launcher.
    pub fn path(&self) -> KernelPath {
        self.path
    }

    /// Computes `out` (rows of requests only; other rows untouched); `bs = 0`
    /// launches nothing. One launch (splits are merged by their last CTA;
    /// the workspace counters must start at zero, see [`workspace_elems`]).
    /// Bad device data is counted in `errors`
    /// ([`crate::ErrorFlags`]), never read through. Asynchronous.
    ///
    /// # Errors
    /// As [`validate`]; [`KernelError::Stride`] for misaligned base pointers;
    /// [`KernelError::Driver`] when a launch fails.
    pub fn launch(&self, args: &mut DecodeArgs<'_>, errors: &mut DeviceErrors) -> Result<()> {
        self.launch_on(self.gpu.stream(), args, errors)
    }

    /// [`PagedAttentionKernel::launch`] on `stream` instead of the GPU's own
    /// stream (e.g. an engine's stream from [`Gpu::borrowed_stream`]), in
    /// that stream's order and CUDA-graph capture. The workspace counters
    /// follow the same rule (zero before, zero after), in that stream's order.
    ///
    /// # Errors
    /// As [`PagedAttentionKernel::launch`]; [`KernelError::Unsupported`] when
    /// the stream belongs to another context.
    pub fn launch_on(
        &self,
        stream: &CudaStream,
        args: &mut DecodeArgs<'_>,
        errors: &mut DeviceErrors,
    ) -> Result<()> {
        self.gpu.require_stream(stream)?;
        let plan = validate_path(args, self.num_sms, self.path)?;
        let mut p = plan.params;
        if p.bs == 0 {
            return Ok(());
        }
        [p.q, p.out, p.k_cache, p.v_cache] = base_ptrs(stream, &args.q, &mut args.out, &args.kv)?;
        p.page_table = args.page_table.device_ptr(stream);
        p.cache_seqlens = args.cache_seqlens.device_ptr(stream);
        if let QueryLayout::Ragged { cu_seqlens_q, .. } = &args.layout {
            p.cu_seqlens_q = cu_seqlens_q.device_ptr(stream);
        }
        if let Some(s) = &args.sinks {
            p.sinks = s.device_ptr(stream);
        }
        if plan.workspace_elems > 0 {
            let ws = args
                .workspace
                .as_mut()
                .ok_or(KernelError::Capacity {
                    arg: "workspace",
                    needed: plan.workspace_elems,
                    available: 0,
                })?
                .device_ptr_mut(stream);
            if ws % 16 != 0 {
                return Err(stride_err(
                    "workspace",
                    format!("base address {ws:#x} is not 16-byte aligned"),
                ));
            }
            let items = (p.bs * p.num_kv_heads * p.row_tiles) as usize;
            let o_elems = items * p.max_splits as usize * ROWS_PER_CTA * plan.head_dim;
            p.ws_o = ws;
            p.ws_ml = ws + 4 * o_elems as u64;
        }
        p.errors = errors.device_ptr();
        let func = self
            .funcs
            .get(&plan.entry)
            .ok_or_else(|| KernelError::unsupported("q", format!("no kernel {}", plan.entry)))?;
        let mut builder = stream.launch_builder(func);
        builder.arg(&p);
        // SAFETY: `validate` checked every shape and stride against the
        // buffers (Strided/StridedMut constructors), dtypes, head dim, group and
        // alignment, and the workspace size; device data (page ids, lengths,
        // cu_seqlens_q) is range-checked in the kernel; the params layout is pinned.
        unsafe { builder.launch(plan.config) }?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
