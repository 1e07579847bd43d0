//! Typed launcher of the decode/verify kernels (split merge fused in).
//!
//! Here: the params struct, the argument types, entry names and sizes
//! (shared memory, workspace, launch geometry). Submodules:
//! - `views`: the view checks every attention launcher shares;
//! - `plan`: validation of one call and its launch plan;
//! - `kernel`: the launcher, [`PagedAttentionKernel`].
//! - `unit_order`: the batch's length order written once
//!   ([`PagedAttentionKernel::write_unit_order`]).

use kernel_rt::cudarc::driver::{DeviceRepr, LaunchConfig};
use kernel_rt::{grid_dim, Result, Strided, StridedMut, MAX_GRID_YZ};

use crate::{HalfDtype, KvDtype};

mod kernel;
mod plan;
mod unit_order;
mod views;

pub use kernel::{
    cluster_fold_variant, pair_loop_variant, PagedAttentionKernel, DECODE_CLUSTER_FOLD_ENV,
    DECODE_EXPERIMENT_ENV, DECODE_LENGTH_ORDER_ENV, DECODE_PAIR_LOOP_ENV, DECODE_PDL_ENV,
    DECODE_UNIT_ORDER_ENV, DECODE_WIDE_MMA_ENV,
};
pub(crate) use plan::lse_stride_tok;
pub use plan::{validate, validate_path};
pub(crate) use views::{
    base_ptrs, check_sinks_and_scales, check_vector, stride_err, validate_views, view_strides,
    ViewShapes,
};

/// Threads per CTA.
pub const BLOCK_THREADS: u32 = 128;
/// Query rows (token, head) packed into one CTA.
pub const ROWS_PER_CTA: usize = 16;
/// Tokens per KV tile of the CUDA-core kernel.
pub const TILE_TOKENS: usize = 32;
/// Tokens per KV tile of the tensor-core kernel (4 warps × 16) where each
/// warp owns whole rows (16-bit K/V up to D 256, e4m3 up to D 128);
/// [`mma_tile_tokens`] gives it for every entry.
pub const MMA_TILE_TOKENS: usize = 64;
/// Head dims with a tensor-core kernel.
pub const MMA_HEAD_DIMS: [usize; 4] = [64, 128, 256, 512];

/// Warps that share one 16-key slice of the tensor-core kernel, each
/// loading and accumulating `head_dim / groups` of its dims and adding its
/// partial `S` to the others' (`MmaSmem::DH` in the .cu): 2 at D 512 for
/// 16-bit K/V (256 dims a warp, as at D 256), `D / 128` for e4m3 K/V above
/// D 128 (128 dims a warp, as at D 128), else 1.
fn mma_dim_groups(head_dim: usize, kv: KvDtype) -> usize {
    match kv {
        KvDtype::E4m3 if head_dim > 128 => head_dim / 128,
        KvDtype::E4m3 => 1,
        _ if head_dim >= 512 => 2,
        _ => 1,
    }
}

/// Tokens per KV tile of the tensor-core kernel for (`head_dim`, `kv`):
/// 16 per warp slice, `4 / groups` slices ([`MMA_TILE_TOKENS`] = 64 where
/// each warp owns whole rows; 32 at D 512 16-bit and D 256 e4m3, 16 at
/// D 512 e4m3). Sizes the `Auto` split chunks (a multiple of it).
pub fn mma_tile_tokens(head_dim: usize, kv: KvDtype) -> usize {
    16 * 4 / mma_dim_groups(head_dim, kv)
}
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
        /// `f32*` `[num_tokens, Hq]` row log-sum-exp (natural log), or 0.
        pub lse: u64 = "float*",
        /// Elements between LSE rows (heads contiguous).
        pub lse_stride_tok: i64 = "i64",
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
        /// Decode context parallelism: ranks the pages are dealt to (`N`;
        /// 1 = off), see [`DecodeArgs::interleave`].
        pub cp_ranks: i32 = "i32",
        /// This launch's rank, `< cp_ranks`.
        pub cp_rank: i32 = "i32",
        /// Skip-softmax: `log2(f)` of [`DecodeArgs::skip_softmax`]'s factor
        /// `f`, `−inf` = off (exact attention).
        pub skip_log2_factor: f32 = "float",
        /// First row tile of this launch: CTA row `blockIdx.y` serves KV
        /// head `blockIdx.y mod Hkv` and row tile `row_tile_base +
        /// blockIdx.y div Hkv`. 0 for decode / verify; the context call's
        /// head-dim-512 path, whose long prompts need more row tiles than
        /// one grid's y dimension holds, covers them in several launches.
        pub row_tile_base: i32 = "i32",
        /// Length order ([`PagedAttentionKernel::set_length_order`]): 1 =
        /// CTA `(x, y, z)` serves unit `x + S_max·z` of the requests in
        /// descending order of `⌈cache_seqlens / 128⌉` (ties by index); 0 =
        /// request `z`, split `x`.
        pub length_order: i32 = "i32",
        /// `u32*` `[1]` count of skipped warp slices (debug), or 0.
        pub skip_counter: u64 = "u32*",
        /// `const i32*` `[bs]`: the batch's requests in the length order
        /// ([`DecodeArgs::unit_order`]), read by ordered launches of one
        /// split instead of ranking the batch in every CTA; or 0.
        pub unit_order: u64 = "const i32*",
    }
}

// SAFETY: plain-old-data `#[repr(C)]` struct of integer and float fields;
// the C struct is generated from it (`kernels/paged_attention_abi.cuh`, whose static_asserts
// check the size and every offset when the PTX is built).
unsafe impl DeviceRepr for PagedAttentionParams {}

/// K and V pools as `[num_pages, Hkv, P, D]` strided views (element strides;
/// last dim contiguous; the stride of a size-1 dim is ignored). The HND-shaped
/// view of the slot-major pool has strides `(P·Hkv·D, D, Hkv·D, 1)`.
#[derive(Debug, Clone)]
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
    /// per-warp cp.async rings) when [`mma_supported`] and
    /// [`mma_strides_fit`] hold, else the CUDA-core kernel.
    #[default]
    Auto,
    /// Always the CUDA-core kernel (`paged_attention_decode_*`), e.g. to
    /// compare the two.
    Simt,
}

/// Whether the tensor-core kernel handles a call: head dim 64, 128, 256 or
/// 512 ([`MMA_HEAD_DIMS`]), and KV either e4m3 or the same 16-bit dtype as Q
/// (every GQA group and `q_len`).
pub fn mma_supported(q: HalfDtype, kv: KvDtype, head_dim: usize) -> bool {
    kv.goes_with(q) && MMA_HEAD_DIMS.contains(&head_dim)
}

/// Whether (`kv`, `head_dim`) is a shape whose tensor-core entry splits the
/// dims between warps (session 29: head dim 512, e4m3 K/V at 256 and 512):
/// [`KernelPath::Auto`] runs it while [`PagedAttentionKernel::set_wide_mma`]
/// is on (the default), the CUDA-core kernel otherwise.
pub fn mma_wide(kv: KvDtype, head_dim: usize) -> bool {
    mma_dim_groups(head_dim, kv) > 1
}

/// Whether the tensor-core kernel can address a K/V layout: it forms each
/// token row's address from 32 × 32 → 64-bit products, so the page and
/// token strides of K and V (`[page, head, token]` element strides, as in
/// [`PagedAttentionParams`]) times `elem_bytes` must fit `i32`. Every real
/// pool does (a page of 1,600 tokens × 80 layers × 2 × 8 heads × 128 dims
/// of bf16 is 0.5 GB); a view that does not runs on the CUDA-core kernel.
pub fn mma_strides_fit(k: [i64; 3], v: [i64; 3], elem_bytes: i64) -> bool {
    [k[0], k[2], v[0], v[2]].iter().all(|&s| {
        s.checked_mul(elem_bytes)
            .is_some_and(|b| i32::try_from(b).is_ok())
    })
}

/// Split-KV policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitMode {
    /// Splits chosen from the launch shape to fill the GPU (`S_max =
    /// ⌊2·SMs / items⌋`, capped by `⌈max_seq_len/128⌉`, with `items =
    /// bs·Hkv·row_tiles`; 1 when `4·items ≥ 3·SMs`: an unsplit grid already
    /// puts a CTA on most SMs, and one CTA an SM reads at the bus's rate, so
    /// a second split would add only its fold — docs/PERF.md session 32);
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
    /// Decode context parallelism by page interleave (`crate::cp`): this
    /// launch is rank `rank` of `ranks`, holding every request's pages `e`
    /// with `e mod ranks = rank` as its local pages `e div ranks`
    /// (`block` must be the page size). `page_table` is the global table
    /// (rank `r` reads columns `i·ranks + r`), `cache_seqlens` the global
    /// lengths, and causal limits and windows are decided in global
    /// positions; the output is the rank's partial state (with `lse`, for
    /// [`crate::merge_kernel`]), so `sinks` must be `None` (they join after
    /// the merge). Tensor-core kernel only; `None` or `ranks = 1` = off.
    pub interleave: Option<crate::reference::Interleave>,
    /// Skip-softmax sparsity, FlashInfer's `skip_softmax_threshold_scale_factor`
    /// `f ≥ 0` (SEMANTICS.md §attention.9; `None` or 0: exact attention,
    /// bit for bit). The tensor-core kernel streams each row's keys in
    /// warp slices of 16 keys ([`MMA_TILE_TOKENS`] / 4), in ascending order
    /// within a split; a slice is skipped (no exponentials, no `P·V`, the
    /// row state unchanged) when, for every row of the CTA, the slice's
    /// largest logit `m̃` and the row's running maximum `m` satisfy
    /// `exp(m̃ − m) < λ = f / L` (`L` the request's KV length) — a row that
    /// has seen no key yet never skips. Every skipped key then weighs less
    /// than `λ·exp(m_final)`, at most `L` of them, while the kept keys weigh
    /// at least `exp(m_final)`, so for `f < 1` each output element is
    /// within `2·f·bmm2_scale·max|V|` of exact attention (plus the usual
    /// rounding). Slices no row sees count as skipped too (exactly: they
    /// add nothing). The CUDA-core kernel computes exact attention.
    pub skip_softmax: Option<f32>,
    /// `[1]` u32: skipped warp slices are added here (debug); `None` = not
    /// counted.
    pub skipped_slices: Option<StridedMut<'a, u32, 1>>,
    /// Split policy.
    pub split: SplitMode,
    /// `[num_tokens, Hq]` f32: each written row's natural-log log-sum-exp
    /// of its logits (`bmm1_scale · q·k`) over the keys it sees, the sink
    /// joined once; `−inf` for a row that sees no key
    /// ([`crate::reference::RefOutput::lse`]); last dim contiguous. Rows the
    /// launch does not write keep their values. `None` = not written.
    pub lse: Option<StridedMut<'a, f32, 2>>,
    /// f32 scratch of at least [`LaunchPlan::workspace_elems`] elements when
    /// that is non-zero. Its last `bs·Hkv·row_tiles` elements are u32 split
    /// counters ([`workspace_elems`]): zero them once (e.g. `alloc_zeros`)
    /// before the first launch; every launch leaves them zero again.
    pub workspace: Option<StridedMut<'a, f32, 1>>,
    /// `[bs]` i32, contiguous: the batch's requests in the length order,
    /// as [`PagedAttentionKernel::write_unit_order`] writes them from the
    /// same `cache_seqlens` (once per batch, for all its layers). A launch
    /// the length order applies to ([`PagedAttentionKernel::set_length_order`])
    /// with one split reads its CTA's request here instead of ranking the
    /// batch in every CTA (~2 µs a CTA on an H100, docs/PERF.md session 49);
    /// other launches ignore it. Any permutation of `0..bs` gives the same
    /// results bit for bit (the order only decides which CTA serves which
    /// request, and when): a stale order from other lengths costs balance,
    /// never correctness. An entry outside `[0, bs)` is skipped and counted
    /// ([`crate::ErrorFlags::BAD_UNIT_ORDER`]); a table with a repeated
    /// request leaves another request's rows unwritten, so only pass what
    /// `write_unit_order` wrote. `None` = every CTA ranks.
    pub unit_order: Option<Strided<'a, i32, 1>>,
}

impl PagedAttentionParams {
    /// Work items of the launch: `bs · Hkv · row_tiles` (request, KV head,
    /// row tile); also the number of split counters at the end of its
    /// workspace.
    pub fn work_items(&self) -> usize {
        (self.bs.max(0) as usize)
            * (self.num_kv_heads.max(0) as usize)
            * (self.row_tiles.max(0) as usize)
    }
}

/// Work items an SM from which a launch that fills the GPU runs unsplit
/// ([`chunk_full_launch`]), for 2-byte K/V (bf16, f16).
pub const UNSPLIT_ITEMS_PER_SM: usize = 6;
/// [`UNSPLIT_ITEMS_PER_SM`] for 1-byte K/V (e4m3): lower, because each
/// CTA streams half the bytes in the same fixed time (its start, the length
/// order's ranking, the merge), so the chunked form's extra CTAs cost
/// relatively more.
pub const UNSPLIT_ITEMS_PER_SM_FP8: usize = 5;

/// [`UNSPLIT_ITEMS_PER_SM`] or [`UNSPLIT_ITEMS_PER_SM_FP8`] by the K/V
/// element size.
pub fn unsplit_items_per_sm(kv: KvDtype) -> usize {
    if kv.size() == 1 {
        UNSPLIT_ITEMS_PER_SM_FP8
    } else {
        UNSPLIT_ITEMS_PER_SM
    }
}

/// Whether a decode / verify launch planned with [`SplitMode::Auto`] should
/// be planned again with a chunked split ([`SplitMode::Chunked`]): Auto
/// left it unsplit (`max_splits == 1`: the batch fills the GPU) and it holds
/// fewer than [`unsplit_items_per_sm`] work items an SM (6 for 2-byte K/V,
/// 5 for e4m3). In a ragged batch that fills the GPU, one CTA per item
/// leaves the longest request's CTAs running alone at the end; chunks cut
/// it. From that many items an SM the kernel's length order
/// ([`PagedAttentionKernel::set_length_order`], on by default from `2·SMs`
/// items) balances the batch better than chunks, whose extra CTAs each pay
/// that order's ranking. The thresholds sit where the two forms cross on
/// Azure conv lengths (docs/PERF.md sessions 37 and 49; 8 KV heads on 132
/// SMs, graph µs, chunked 2048 × 4 / unsplit): bf16 96 requests (5.8 items
/// an SM) 189.8 / 197.3, 128 requests (7.8) 258.7 / 235.4; e4m3 64 requests
/// (3.9) 86.7 / 104.7, 96 requests 125.9 / 113.4.
pub fn chunk_full_launch(plan: &LaunchPlan, num_sms: usize) -> bool {
    let splits = usize::try_from(plan.params.max_splits).unwrap_or(0);
    chunk_full(splits, plan.params.work_items(), num_sms, plan.kv_dtype)
}

/// [`chunk_full_launch`]'s rule from the split count Auto gives a launch
/// (`auto_splits`, e.g. from [`launch_config`] with [`SplitMode::Auto`]),
/// its work items and its K/V dtype, for callers without a [`LaunchPlan`].
pub fn chunk_full(auto_splits: usize, work_items: usize, num_sms: usize, kv: KvDtype) -> bool {
    auto_splits == 1 && work_items < unsplit_items_per_sm(kv) * num_sms
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
    /// K/V element type of the launch (its [`chunk_full_launch`] threshold).
    pub kv_dtype: KvDtype,
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
/// rows + 16 V rows as loaded (`D·es / groups` bytes each, [`mma_tile_tokens`]'s
/// warp groups); then row stats `2·4·16` f32 and valid masks `4·NST·2` u32;
/// with groups the warps' partial `S` (`(4 / groups)·2·groups·32·8` f32);
/// rounded up to 16 bytes; for 16-bit K/V at D ≥ 256 the tile's 16 Q rows
/// (`16·D` values) follow. The warp-merge scratch `(4 / groups)·16·(D+8)`
/// f32 aliases the rings.
pub fn mma_smem_bytes(head_dim: usize, kv: KvDtype) -> usize {
    mma_smem_bytes_xv(head_dim, kv, 0)
}

/// [`mma_smem_bytes`] of timing experiment `xv`'s entry
/// ([`PagedAttentionKernel::set_experiment`](crate::PagedAttentionKernel::set_experiment)):
/// with `xv & 8`, a 4-slot (e4m3) / 2-slot (16-bit) ring, then the Q
/// A-fragments (e4m3: `D/16 · 32 · 16` bytes) or the tile's Q rows (16-bit:
/// `16 · D` values, as at D 256) after the valid masks; other experiments
/// share the production layout.
pub fn mma_smem_bytes_xv(head_dim: usize, kv: KvDtype, xv: u32) -> usize {
    let x8 = xv & 8 != 0;
    let q8 = kv == KvDtype::E4m3 && x8;
    let nst = match kv {
        KvDtype::E4m3 if x8 => 4,
        KvDtype::E4m3 => 6,
        _ if x8 => 2,
        _ => 3,
    };
    let groups = mma_dim_groups(head_dim, kv);
    let slot = 16 * (head_dim / groups) * kv.size() * 2;
    let ring = 4 * nst * slot;
    let group_s = if groups > 1 {
        (4 / groups) * 2 * groups * 32 * 8 * 4
    } else {
        0
    };
    let bytes = (ring + 2 * 4 * ROWS_PER_CTA * 4 + 4 * nst * 2 * 4 + group_s).div_ceil(16) * 16;
    // 16-bit K/V at D >= 256: the tile's 16 Q rows follow.
    let q = if (head_dim >= 256 && kv != KvDtype::E4m3) || (x8 && !q8) {
        ROWS_PER_CTA * head_dim * 2
    } else {
        0
    };
    let q8 = if q8 { head_dim / 16 * 32 * 16 } else { 0 };
    bytes + q + q8
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
/// [`KernelError::Unsupported`](kernel_rt::KernelError::Unsupported) when a
/// grid dim exceeds CUDA's limits.
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
        SplitMode::Auto if 4 * items >= 3 * num_sms => 1,
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
