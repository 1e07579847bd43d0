//! Context / prefill / chunked-prefill ("extend") attention over a paged KV
//! cache (SEMANTICS.md §attention.2–7, context call §attention.4.2; DESIGN.md D4, D10,
//! D12, D13, D15).
//!
//! Ragged query rows `q [total_q_tokens, Hq, D]` grouped by `cu_seqlens_q
//! [bs+1]` (at most `max_q_len` rows per request); request `i` has
//! `n_i = cu_seqlens_q[i+1] − cu_seqlens_q[i]` rows and KV length
//! `L_i = cache_seqlens[i]` (prefix + new tokens); row `j` sits at
//! `x = L_i − n_i + j` and sees keys `max(0, x − W) ..= x` (causal over the
//! prefix and the new tokens, window on top). Query head `h` reads KV head
//! `h / G`. Same K/V views, page table, scales, window, sinks and device
//! checks (ragged rule, error word) as the decode kernel ([`crate::validate`]).
//!
//! Two kernels, one semantics. On sm_90 (Hopper) devices the launcher runs
//! `paged_attention_context_sm90_{q}_kv_{kv}_d{D}` (compute_90a, KV of the
//! Q dtype or e4m3, D 64/128/256): work item = (q tile of 128 packed rows,
//! 192 at D 64 with 16-bit KV ([`context_sm90_block_rows`]), KV
//! chunk, KV head, request), a persistent grid at D 64/128 (one CTA per SM,
//! items from a device counter; [`context_sm90_persistent`]; the KV of
//! items that do not fill the GPU split in chunks merged by
//! `paged_attention_context_sm90_merge_{q}_kv_{kv}_d{D}`, [`context_sm90_kv_splits`]),
//! a producer warpgroup filling 2–3-slot K and V rings (mbarrier hand-off)
//! with a cp.async page gather or TMA boxes ([`ContextKvLoad`]), and two
//! consumer warpgroups of 64 rows (three at D 64 with 16-bit KV,
//! [`context_sm90_consumers`]) running
//! `wgmma` for `Q·Kᵀ` (both operands in shared memory) and `P·V` (P from
//! registers), with two consumers the softmax of tile `t` overlapped with
//! `P·V` of tile `t − 1`; with three each consumer runs its steps in turn
//! and the others fill the tensor cores ([`ContextPath::Wgmma`]); the
//! output rows of a warpgroup go out as TMA stores where [`out_tma_layout`]
//! allows ([`ContextKernel::set_o_tma`]). e4m3 K/V are gathered into a staging ring
//! and converted by the producer to f16 (exact: one instruction per two
//! values) into the same 16-bit rings ([`context_sm90_staging_steps`]); both
//! GEMMs then run in f16: a bf16 Q tile is converted to f16 once per work
//! item (exact for |q| in [2^-14, 2^15); a row whose largest finite |q| is
//! larger is scaled by a power of two, folded into that row's logit scale)
//! and P is packed to f16. Elsewhere the compute_90
//! kernel runs ([`ContextPath::Mma`]):
//! `paged_attention_context_{q}_kv_{kv}_d{D}`, FlashAttention-2
//! structure on `mma.sync.m16n8k16`: CTA = (KV head, request, q tile of
//! [`context_block_rows`] packed (token, head) rows, 16 per warp, heaviest
//! tiles launched first); 64-key tiles through a [`context_stages`]-slot
//! cp.async ring (page ids gathered per tile, one tile ahead), XOR-swizzled
//! shared memory + ldmatrix, online softmax in f32, tiles past the diagonal
//! and left of the window never loaded, element masks only on edge tiles.
//! e4m3 K/V are converted once per CTA to the Q dtype (exact).
//!
//! `cu_seqlens_k` is accepted (shape-checked) for API parity with the
//! upstream context call; the kernel reads KV lengths from `cache_seqlens`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kernel_rt::cudarc::driver::sys::CUdevice_attribute;
use kernel_rt::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig};
use kernel_rt::launch::{EntryAttrs, KernelArg, Launcher};
use kernel_rt::tma::TensorMap;
use kernel_rt::{
    grid_dim, to_i32, DeviceErrors, Gpu, KernelError, Result, Strided, StridedMut, MAX_GRID_YZ,
};

use crate::launch::{
    base_ptrs, check_sinks_and_scales, check_vector, validate_views, view_strides, ViewShapes,
};
use crate::{HalfDtype, KernelPath, KvCache, KvDtype, PagedAttentionKernel, HEAD_DIMS};

/// The embedded PTX of the context kernel (`cargo xtask ptx-build`).
pub const CONTEXT_PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "paged_attention_context",
    ptx: include_str!("../ptx/paged_attention_context.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90,
        image: include_bytes!("../ptx/paged_attention_context.sm_90.cubin"),
        stamp: include_str!("../ptx/paged_attention_context.sm_90.cubin.stamp"),
    }),
};

/// The embedded PTX of the sm_90a context kernel (`compute_90a`: loads only
/// on compute capability 9.0 devices).
pub const CONTEXT_SM90_PTX: kernel_rt::PtxModule = kernel_rt::PtxModule {
    name: "paged_attention_context_sm90",
    ptx: include_str!("../ptx/paged_attention_context_sm90.ptx"),
    cubin: Some(kernel_rt::Cubin {
        arch: kernel_rt::CubinArch::Sm90a,
        image: include_bytes!("../ptx/paged_attention_context_sm90.sm_90a.cubin"),
        stamp: include_str!("../ptx/paged_attention_context_sm90.sm_90a.cubin.stamp"),
    }),
};

/// Environment variable that picks the sm_90a kernel's K/V loads
/// ([`ContextKvLoad`]): `auto` (default), `tma` or `gather`.
pub const CONTEXT_KV_LOAD_ENV: &str = "MHA_KIT_CONTEXT_KV_LOAD";

/// Environment variable that picks when the sm_90a context kernel runs its
/// two-CTA ("duo") entries ([`context_sm90_duo_supported`]): `off` (default:
/// measured slower than the one-CTA entries on every FA3-grid cell), `rule`
/// (the launcher's rule, [`context_sm90_duo_wanted`]) or `on` (wherever
/// supported; for experiments). [`ContextKernel::set_duo`] overrides it.
pub const CONTEXT_DUO_ENV: &str = "MHA_KIT_CONTEXT_DUO";

/// Environment variable: `off` runs every item's last KV tile whole in the
/// sm_90a kernel (schedule variant bit 2), `on` (default) trims the causal
/// diagonal tile; same results, other timing (A/B runs of whole programs).
/// [`ContextKernel::set_variant`] overrides it.
pub const CONTEXT_TRIM_ENV: &str = "MHA_KIT_CONTEXT_TRIM";

/// The schedule variant that [`CONTEXT_TRIM_ENV`] asks for: 0 (`on` or
/// unset) or 4 (`off`).
///
/// # Errors
/// [`KernelError::Unsupported`] for a value other than `on`, `off`.
pub fn context_trim_variant_from_env() -> Result<i32> {
    env_choice(CONTEXT_TRIM_ENV, &[("on", 0), ("off", 4)])
}

/// The duo choice of [`CONTEXT_DUO_ENV`] as [`ContextKernel::set_duo`]
/// takes it: `Some(false)` off, `None` the launcher's rule, `Some(true)` on.
///
/// # Errors
/// [`KernelError::Unsupported`] for a value other than `off`, `rule`, `on`.
pub fn context_duo_from_env() -> Result<Option<bool>> {
    env_choice(
        CONTEXT_DUO_ENV,
        &[("off", Some(false)), ("rule", None), ("on", Some(true))],
    )
}

/// How the sm_90a context kernel loads K and V tiles (same results).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextKvLoad {
    /// The loads measured fastest: today the gather at every page size.
    /// On the H200 (TFLOP/s, 32/8/128 bf16, one page per request, same run)
    /// the eight-lanes-per-line gather beat TMA boxes, 480 vs 457 (bs 8 ×
    /// 4096) and 564 vs 514 (bs 1 × 16384); P 16 boxes were slower still
    /// (222 vs 372 against the earlier two-lane gather).
    Auto,
    /// TMA boxes wherever the page size and the 16-bit pool views allow
    /// ([`context_sm90_tma_rows`], [`kv_tma_layout`]), else the gather
    /// (e4m3 K/V always gather).
    Tma,
    /// The cp.async row gather (a producer warpgroup), every page size.
    Gather,
}

impl ContextKvLoad {
    /// Reads [`CONTEXT_KV_LOAD_ENV`] (unset = [`ContextKvLoad::Auto`]).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] for a value other than `auto`, `tma`,
    /// `gather`.
    pub fn from_env() -> Result<Self> {
        env_choice(
            CONTEXT_KV_LOAD_ENV,
            &[
                ("auto", Self::Auto),
                ("tma", Self::Tma),
                ("gather", Self::Gather),
            ],
        )
    }
}

/// The value of environment variable `name` among `choices` (name, value):
/// unset or empty picks the first.
///
/// # Errors
/// [`KernelError::Unsupported`] naming the value and the choices.
pub(crate) fn env_choice<T: Copy>(name: &'static str, choices: &[(&str, T)]) -> Result<T> {
    let v = std::env::var(name).unwrap_or_default();
    let v = v.trim();
    if v.is_empty() {
        return Ok(choices[0].1);
    }
    if let Some(&(_, x)) = choices.iter().find(|(n, _)| *n == v) {
        return Ok(x);
    }
    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
    let (last, rest) = names.split_last().expect("choices");
    Err(KernelError::unsupported(
        name,
        format!("`{v}` (expected {} or {last})", rest.join(", ")),
    ))
}

/// Environment variable that picks the context kernel: `auto` (default),
/// `mma` (the compute_90 kernel everywhere) or `wgmma` (the sm_90a kernel;
/// an error on other devices).
pub const CONTEXT_KERNEL_ENV: &str = "MHA_KIT_CONTEXT_KERNEL";

/// Which context kernel a [`ContextKernel`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextPath {
    /// The sm_90a kernel on compute capability 9.0 devices, else the
    /// compute_90 kernel.
    Auto,
    /// The compute_90 `mma.sync` kernel (every device, every dtype).
    Mma,
    /// The sm_90a `wgmma` kernel (KV of the Q dtype or e4m3); requires a
    /// compute capability 9.0 device.
    Wgmma,
}

impl ContextPath {
    /// Reads [`CONTEXT_KERNEL_ENV`] (unset = [`ContextPath::Auto`]).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] for a value other than `auto`, `mma`, `wgmma`.
    pub fn from_env() -> Result<Self> {
        env_choice(
            CONTEXT_KERNEL_ENV,
            &[
                ("auto", Self::Auto),
                ("mma", Self::Mma),
                ("wgmma", Self::Wgmma),
            ],
        )
    }
}

// The sm_90a kernel's plan: its config mirrors (`Cfg` in the kernel), shared
// memory and TMA layout.
mod sm90;
pub use sm90::*;

/// Keys per KV tile of the context kernel.
pub const CONTEXT_TILE_KEYS: usize = 64;

/// Largest `max_q_len` accepted (`max_q_len · G` must fit the row math).
pub const CONTEXT_MAX_Q_LEN: usize = 1 << 24;

/// Windows at or above this are "no window" (keys never reach 2^30 positions).
const WINDOW_CAP: u32 = 1 << 30;

kernel_rt::abi_struct! {
    /// Kernel parameters, defined for C in the generated
    /// `kernels/paged_attention_abi.cuh` (`cargo xtask abi`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct ContextParams {
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
        /// `const i32*` `[bs + 1]`.
        pub cu_seqlens_q: u64 = "const i32*",
        /// `const f32*` `[Hq]` or 0.
        pub sinks: u64 = "const float*",
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
        /// Upper bound on rows per request.
        pub max_q_len: i32 = "i32",
        /// `⌈max_q_len · G / BM⌉` = grid z.
        pub q_tiles: i32 = "i32",
        /// `W` or −1.
        pub window_left: i32 = "i32",
        /// `bmm1_scale · log2 e`.
        pub scale_log2: f32 = "float",
        /// `bmm2_scale`.
        pub bmm2_scale: f32 = "float",
        /// Schedule variant of the sm_90a kernel, for A/B benchmarks only: 0 =
        /// default (persistent grid where [`context_sm90_persistent`]); bit 0
        /// (1): the consumers ping-pong their GEMM issue on named barriers;
        /// bit 1 (2): one CTA per work item; bit 2 (4): every item's last KV
        /// tile run whole (no trimmed diagonal tile). Same results, other
        /// timing; the compute_90 kernel ignores it.
        pub variant: i32 = "i32",
        /// sm_90a K/V loads: keys per TMA box ([`context_sm90_tma_rows`]), 0 =
        /// the cp.async row gather.
        pub tma_rows: i32 = "i32",
        /// Tensor-map coordinate slot (1..3) of the token, head and page dims
        /// (bits 0–3, 4–7, 8–11; [`kv_tma_layout`]).
        pub tma_dims: i32 = "i32",
        /// `u32*` `[2]`: the sm_90a persistent grid's work counters (next item,
        /// CTAs done), zero between launches; the launcher's own buffer.
        pub work: u64 = "u32*",
        /// `f32*`: the sm_90a split-KV workspace (the launcher's own buffer):
        /// unnormalized O rows `[units, 128, D]`, then (running max in log2
        /// units, row sum) `[units, 128, 2]`, units = items × `kv_splits`.
        pub partial: u64 = "float*",
        /// KV chunks per work item (≥ 1; > 1 only on the sm_90a kernel, which
        /// then writes `partial` and the merge entry writes `out`).
        pub kv_splits: i32 = "i32",
        /// KV tiles per chunk when `kv_splits > 1`.
        pub split_tiles: i32 = "i32",
        /// sm_90a epilogue: 1 = the output rows of whole warpgroups go out as
        /// TMA stores through the kernel's `out` tensor map (set by the
        /// launcher for unsplit launches when the map encodes and `G`
        /// divides 64; read only when `kv_splits = 1`), 0 = stored by
        /// threads. Same results.
        pub o_tma: i32 = "i32",
        /// sm_90a producer: 1 = each work item's Q rows load as TMA boxes
        /// through the kernel's `q` tensor map (set by the launcher when
        /// the map encodes and `G` divides the block rows BM; with e4m3
        /// K/V and a bf16 Q the producer then converts them in place), 0 =
        /// copied by the producer warpgroup's cp.async. Same results.
        pub q_tma: i32 = "i32",
        /// `f32*` `[num_tokens, Hq]` row log-sum-exp (natural log), or 0.
        pub lse: u64 = "float*",
        /// Elements between LSE rows (heads contiguous).
        pub lse_stride_tok: i64 = "i64",
        /// sm_90a gather: 1 = every K / V stride and in-page offset fits
        /// `i32` ([`context_sm90_cursor_fits`], set by the launcher), so the
        /// producer forms K / V row addresses from 32-bit products; 0 =
        /// 64-bit products. Same results.
        pub narrow: i32 = "i32",
        /// Zero (padding to the struct's 8-byte alignment).
        pub reserved: i32 = "i32",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/paged_attention_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for ContextParams {}

/// Arguments of one context call (device buffers on the launcher's GPU).
#[derive(Debug)]
pub struct ContextArgs<'a> {
    /// `[total_q_tokens, Hq, D]`, bf16/f16 bits; last dim contiguous, token and
    /// head strides multiples of 8, base 16-byte aligned.
    pub q: Strided<'a, u16, 3>,
    /// Dtype of `q` and `out`.
    pub q_dtype: HalfDtype,
    /// `[total_q_tokens, Hq, D]` output, same dtype and alignment rules as `q`.
    pub out: StridedMut<'a, u16, 3>,
    /// K/V pools: the Q dtype or e4m3 (a 16-bit KV of the other dtype is rejected).
    pub kv: KvCache<'a>,
    /// `[bs, M]` i32 page ids, last dim contiguous.
    pub page_table: Strided<'a, i32, 2>,
    /// `[bs]` i32 KV lengths (prefix + new tokens), contiguous.
    pub cache_seqlens: Strided<'a, i32, 1>,
    /// `[bs + 1]` i32 query row offsets, contiguous (ragged rule of the crate docs).
    pub cu_seqlens_q: Strided<'a, i32, 1>,
    /// `[bs + 1]` i32 prefix sums of `cache_seqlens` (shape-checked, not read).
    pub cu_seqlens_k: Option<Strided<'a, i32, 1>>,
    /// Upper bound on rows per request (longer requests are skipped, counted), ≥ 1.
    pub max_q_len: usize,
    /// Logit scale in natural-log units (finite).
    pub bmm1_scale: f32,
    /// Output scale (finite).
    pub bmm2_scale: f32,
    /// `W`: keys `[x − W, x]`; `None` = no window.
    pub window_left: Option<u32>,
    /// `[Hq]` f32 sink logits, contiguous.
    pub sinks: Option<Strided<'a, f32, 1>>,
    /// Host-side upper bound on `cache_seqlens` (FlashInfer's `max_kv_len`),
    /// or `None`. Only picks the sm_90a schedule (the two-CTA entries for
    /// short KV ranges, [`context_sm90_duo_wanted`]); results never depend on
    /// it: a longer request is still attended in full. Without it the
    /// page-table width (`M · page_size`) bounds the keys.
    pub max_kv_len: Option<usize>,
    /// `[num_tokens, Hq]` f32: each written row's natural-log log-sum-exp
    /// of its logits (`bmm1_scale · q·k`) over the keys it sees, the sink
    /// joined once, `−inf` for a row that sees no key
    /// ([`crate::reference::RefOutput::lse`]; context-parallel prefill
    /// merges partial outputs with it); last dim contiguous. Rows the launch
    /// does not write keep their values. `None` = not written. On sm_90 at
    /// D 64 with 16-bit KV such a launch runs the two-CTA entries
    /// ([`context_sm90_duo_supported`]; the three-consumer entries have no
    /// LSE code).
    pub lse: Option<StridedMut<'a, f32, 2>>,
}

/// Everything [`validate_context`] derives from the arguments.
#[derive(Debug, Clone)]
pub struct ContextPlan {
    /// Kernel params (pointers 0: filled at launch).
    pub params: ContextParams,
    /// Kernel entry name.
    pub entry: String,
    /// Launch geometry.
    pub config: LaunchConfig,
    /// Whether the entry is the sm_90a kernel (it also takes the K and V
    /// tensor maps).
    pub sm90: bool,
}

/// Kernel entry name for a (Q, KV) dtype pair and head dim.
pub fn context_entry_name(q: HalfDtype, kv: KvDtype, head_dim: usize) -> String {
    format!(
        "paged_attention_context_{}_kv_{}_d{head_dim}",
        q.name(),
        kv.name()
    )
}

/// Whether a context kernel exists: KV e4m3 or the Q dtype, D 64/128/256.
pub fn context_supported(q: HalfDtype, kv: KvDtype, head_dim: usize) -> bool {
    kv.goes_with(q) && HEAD_DIMS.contains(&head_dim)
}

/// Every context entry: `(q, kv, head_dim)`.
pub fn context_variants() -> Vec<(HalfDtype, KvDtype, usize)> {
    let mut v = Vec::new();
    for q in [HalfDtype::Bf16, HalfDtype::F16] {
        for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
            for d in HEAD_DIMS {
                if context_supported(q, kv, d) {
                    v.push((q, kv, d));
                }
            }
        }
    }
    v
}

/// Warps per CTA (16 query rows each): 8 at D 256, else 4.
pub fn context_warps(head_dim: usize) -> usize {
    if head_dim == 256 {
        8
    } else {
        4
    }
}

/// Packed (token, head) query rows per CTA (`16 · warps`).
pub fn context_block_rows(head_dim: usize) -> usize {
    16 * context_warps(head_dim)
}

/// cp.async ring slots (mirrors `Cfg::NST` in the .cu).
pub fn context_stages(head_dim: usize, kv: KvDtype) -> usize {
    match (head_dim, kv) {
        (64, _) => 4,
        (128, KvDtype::E4m3) => 4,
        (128, _) => 3,
        _ => 2,
    }
}

/// Dynamic shared memory (mirrors `Cfg` in the .cu): the ring of NST slots of
/// 64 K rows + 64 V rows as loaded, for e4m3 one converted 16-bit K+V tile,
/// at D 256 the Q tile `[BM, D]` 16-bit (at D ≤ 128 Q is staged in the ring
/// before the pipeline starts), then u32 valid masks `[NST][warps]`.
pub fn context_smem_bytes(head_dim: usize, kv: KvDtype) -> usize {
    let nst = context_stages(head_dim, kv);
    let raw = CONTEXT_TILE_KEYS * head_dim * kv.size() * 2;
    let conv = if kv == KvDtype::E4m3 {
        CONTEXT_TILE_KEYS * head_dim * 2 * 2
    } else {
        0
    };
    let q = if head_dim > 128 {
        context_block_rows(head_dim) * head_dim * 2
    } else {
        0
    };
    let bytes = nst * raw + conv + q + nst * context_warps(head_dim) * 4;
    bytes.div_ceil(16) * 16
}

/// Launch geometry (pure): grid `(Hkv, bs, q_tiles)` with `q_tiles =
/// ⌈max_q_len · G / BM⌉` (CTAs past a request's rows exit at once),
/// `32 · warps` threads. Returns `(q_tiles, config)`.
///
/// # Errors
/// [`KernelError::Unsupported`] when a grid dim exceeds CUDA's limits.
pub fn context_launch_config(
    bs: usize,
    num_kv_heads: usize,
    group: usize,
    max_q_len: usize,
    head_dim: usize,
    kv: KvDtype,
) -> Result<(usize, LaunchConfig)> {
    let bm = context_block_rows(head_dim);
    let q_tiles = (max_q_len * group).div_ceil(bm).max(1);
    let x = grid_dim("num_kv_heads", num_kv_heads, i32::MAX as u32)?;
    let y = grid_dim("bs", bs, MAX_GRID_YZ)?;
    let z = grid_dim("max_q_len", q_tiles, MAX_GRID_YZ)?;
    Ok((
        q_tiles,
        LaunchConfig {
            grid_dim: (x, y, z),
            block_dim: (32 * context_warps(head_dim) as u32, 1, 1),
            shared_mem_bytes: context_smem_bytes(head_dim, kv) as u32,
        },
    ))
}

/// Launch geometry of the sm_90a kernel (pure): `q_tiles = ⌈max_q_len · G /
/// BM⌉` ([`context_sm90_block_rows`]), work items `(q tile, KV head, request)` in the order q tiles
/// fastest (heaviest first: the CTAs resident at once share one request's
/// K/V in L2), then heads, then requests; one CTA of
/// [`context_sm90_threads`] threads per item
/// (the launcher caps it to the persistent grid, [`context_sm90_grid`]).
/// Returns `(q_tiles, config)`.
///
/// # Errors
/// [`KernelError::Unsupported`] when the items exceed CUDA's grid limit
/// (2^31 − 1 CTAs).
pub fn context_sm90_launch_config(
    bs: usize,
    num_kv_heads: usize,
    group: usize,
    max_q_len: usize,
    head_dim: usize,
    kv: KvDtype,
) -> Result<(usize, LaunchConfig)> {
    sm90_items_config(
        bs.saturating_mul(num_kv_heads),
        max_q_len.saturating_mul(group),
        context_sm90_block_rows(head_dim, kv),
        context_sm90_threads(head_dim, kv),
        context_sm90_smem_bytes(head_dim, kv),
    )
}

/// [`context_sm90_launch_config`] for the duo entries
/// ([`context_sm90_duo_supported`]): items of [`CONTEXT_SM90_DUO_ROWS`]
/// rows, CTAs of [`CONTEXT_SM90_DUO_THREADS`] threads and
/// [`context_sm90_duo_smem_bytes`].
///
/// # Errors
/// As [`context_sm90_launch_config`].
pub fn context_sm90_duo_launch_config(
    bs: usize,
    num_kv_heads: usize,
    group: usize,
    max_q_len: usize,
    head_dim: usize,
) -> Result<(usize, LaunchConfig)> {
    sm90_items_config(
        bs.saturating_mul(num_kv_heads),
        max_q_len.saturating_mul(group),
        CONTEXT_SM90_DUO_ROWS,
        CONTEXT_SM90_DUO_THREADS,
        context_sm90_duo_smem_bytes(head_dim),
    )
}

/// `(q_tiles, config)` for `heads` (request, KV head) pairs of at most
/// `rows` packed query rows each, in items of `bm` rows.
fn sm90_items_config(
    heads: usize,
    rows: usize,
    bm: usize,
    threads: u32,
    smem: usize,
) -> Result<(usize, LaunchConfig)> {
    let q_tiles = rows.div_ceil(bm).max(1);
    let items = q_tiles.saturating_mul(heads);
    let x = grid_dim("max_q_len", items, i32::MAX as u32)?;
    Ok((
        q_tiles,
        LaunchConfig {
            grid_dim: (x, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        },
    ))
}

/// Trace entry (`ContextKernel::set_experiment(8)`): CTAs, items per CTA and
/// events per (item, role) it records, mirrored from `TR_*` in
/// kernels/paged_attention_context_sm90.cu.
pub const CONTEXT_SM90_TRACE_CTAS: usize = 132;
/// See [`CONTEXT_SM90_TRACE_CTAS`].
pub const CONTEXT_SM90_TRACE_ITEMS: usize = 48;
/// See [`CONTEXT_SM90_TRACE_CTAS`].
pub const CONTEXT_SM90_TRACE_EVENTS: usize = 24;

/// KV chunks per work item of an sm_90a launch (split KV) and KV tiles per
/// chunk, for `items` work items of at most `tiles` KV tiles each on a GPU
/// of `sm_count` SMs with workspace for `capacity` chunks: split only when
/// the items fill fewer than the SMs and are long (≥ 8 tiles), into the
/// fewest chunks `s` with `items · s ≥ 0.9 · sm_count`, each of ≥ 4 tiles,
/// `s ≤ 16`, `items · s ≤ capacity`. `(1, tiles)`: no split.
pub fn context_sm90_kv_splits(
    items: usize,
    tiles: usize,
    sm_count: usize,
    capacity: usize,
) -> (usize, usize) {
    if items == 0 || items >= sm_count || tiles < 8 {
        return (1, tiles);
    }
    let want = (sm_count * 9).div_ceil(10).div_ceil(items);
    let s = want.min(16).min(tiles / 4).min(capacity / items);
    if s < 2 {
        return (1, tiles);
    }
    kv_chunks(tiles, s)
}

/// `tiles` KV tiles in at most `s ≥ 1` chunks of equal size: `(chunks,
/// tiles per chunk)`, no chunk empty.
fn kv_chunks(tiles: usize, s: usize) -> (usize, usize) {
    let split_tiles = tiles.div_ceil(s).max(1);
    (tiles.div_ceil(split_tiles).max(1), split_tiles)
}

/// Entry name of the sm_90a split-KV merge for a Q dtype, KV dtype (its
/// work items' rows, [`context_sm90_block_rows`], depend on it) and head dim
/// (D 64 and 128: the head dims that split):
/// `paged_attention_context_sm90_merge_{q}_kv_{kv}_d{head_dim}`.
pub fn context_sm90_merge_entry_name(q: HalfDtype, kv: KvDtype, head_dim: usize) -> String {
    format!(
        "paged_attention_context_sm90_merge_{}_kv_{}_d{head_dim}",
        q.name(),
        kv.name()
    )
}

/// Validates `args` and derives the launch plan of the compute_90 kernel
/// ([`validate_context_for`] with `sm90 = false`).
///
/// # Errors
/// As [`validate_context_for`].
pub fn validate_context(args: &ContextArgs<'_>) -> Result<ContextPlan> {
    validate_context_for(args, false)
}

/// Validates `args` and derives the launch plan. Every rejection happens
/// here, before any launch (D15).
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`] or
/// [`KernelError::Unsupported`] naming the argument (head dim not 64/128/256,
/// 16-bit KV of a dtype other than Q's, `Hq % Hkv ≠ 0`, `G > 16`,
/// `max_q_len` outside `1..=2^24`, non-finite scales, grid limits).
/// With `sm90`, the plan runs the sm_90a kernel when
/// [`context_sm90_supported`] holds (else the compute_90 kernel).
pub fn validate_context_for(args: &ContextArgs<'_>, sm90: bool) -> Result<ContextPlan> {
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
    let kv_dtype = args.kv.dtype();
    if !HEAD_DIMS.contains(&dim) {
        return Err(KernelError::unsupported(
            "q",
            format!(
                "head_dim {dim}: the context kernels serve {HEAD_DIMS:?} (512 runs the decode \
                 kernel's path: ContextKernel::launch)"
            ),
        ));
    }
    if !context_supported(args.q_dtype, kv_dtype, dim) {
        return Err(KernelError::unsupported(
            "k_cache",
            format!(
                "KV dtype {} with q dtype {} (KV must be e4m3 or the q dtype)",
                kv_dtype.name(),
                args.q_dtype.name()
            ),
        ));
    }
    check_vector("cu_seqlens_q", &args.cu_seqlens_q, bs + 1)?;
    kernel::check_context_rows(args, bs)?;
    check_sinks_and_scales(args.sinks.as_ref(), hq, args.bmm1_scale, args.bmm2_scale)?;
    let lse_stride_tok = crate::launch::lse_stride_tok(args.lse.as_ref(), num_tokens, hq)?;
    let use_sm90 = sm90 && context_sm90_supported(args.q_dtype, kv_dtype, dim);
    let (q_tiles, config) = if use_sm90 {
        context_sm90_launch_config(bs, hkv, group, args.max_q_len, dim, kv_dtype)?
    } else {
        context_launch_config(bs, hkv, group, args.max_q_len, dim, kv_dtype)?
    };
    let window = args
        .window_left
        .filter(|&w| w < WINDOW_CAP)
        .map_or(-1, |w| w as i32);
    let st = view_strides(&args.q, &args.out, &args.kv, &args.page_table, bs, m)?;
    let params = ContextParams {
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
        max_q_len: to_i32("max_q_len", args.max_q_len)?,
        q_tiles: to_i32("max_q_len", q_tiles)?,
        window_left: window,
        scale_log2: args.bmm1_scale * std::f32::consts::LOG2_E,
        bmm2_scale: args.bmm2_scale,
        kv_splits: 1,
        lse_stride_tok,
        ..Default::default()
    };
    Ok(ContextPlan {
        params,
        entry: if use_sm90 {
            context_sm90_entry_name(args.q_dtype, kv_dtype, dim)
        } else {
            context_entry_name(args.q_dtype, kv_dtype, dim)
        },
        config,
        sm90: use_sm90,
    })
}

// The launcher.
mod kernel;
pub use kernel::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_choice_reads_a_choice_and_names_the_others() {
        const VAR: &str = "MHA_KIT_TEST_CONTEXT_ENV_CHOICE";
        let choices = [("auto", 0), ("mma", 1), ("wgmma", 2)];
        std::env::remove_var(VAR);
        assert_eq!(env_choice(VAR, &choices).unwrap(), 0);
        std::env::set_var(VAR, " wgmma ");
        assert_eq!(env_choice(VAR, &choices).unwrap(), 2);
        std::env::set_var(VAR, "");
        assert_eq!(env_choice(VAR, &choices).unwrap(), 0);
        std::env::set_var(VAR, "tma");
        let e = env_choice(VAR, &choices).unwrap_err().to_string();
        assert!(e.contains("`tma` (expected auto, mma or wgmma)"), "{e}");
        std::env::remove_var(VAR);
    }
}
