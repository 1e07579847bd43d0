//! The sm_90a context kernel's plan on the host: the mirrors of its
//! compile-time configuration (`Cfg` in `kernels/paged_attention_context_sm90.cu`),
//! its shared memory and the TMA layout of its K/V boxes.

use super::*;

/// Consumer warpgroups (64 query rows each) of the sm_90a kernel (mirrors
/// `Cfg::NCW`): three at D 64 with 16-bit KV (192-row work items: at D 64
/// the exponentials take as long as both GEMMs, and a third consumer warp
/// per scheduler keeps both units busy), two otherwise.
pub fn context_sm90_consumers(head_dim: usize, kv: KvDtype) -> usize {
    if head_dim == 64 && kv != KvDtype::E4m3 {
        3
    } else {
        2
    }
}

/// Query rows (packed (token, head) pairs) per work item of the sm_90a
/// kernel: 64 per consumer warpgroup ([`context_sm90_consumers`]), 192 at
/// D 64 with 16-bit KV, else 128.
pub fn context_sm90_block_rows(head_dim: usize, kv: KvDtype) -> usize {
    64 * context_sm90_consumers(head_dim, kv)
}

/// Threads per CTA of the sm_90a kernel: a producer warpgroup and the
/// consumers ([`context_sm90_consumers`]), 512 or 384.
pub fn context_sm90_threads(head_dim: usize, kv: KvDtype) -> u32 {
    128 * (context_sm90_consumers(head_dim, kv) as u32 + 1)
}

/// Whether the sm_90a kernel covers `(q, kv, head_dim)`: KV of the Q dtype
/// or e4m3, D 64/128/256 (the same cases as [`context_supported`]).
pub fn context_sm90_supported(q: HalfDtype, kv: KvDtype, head_dim: usize) -> bool {
    context_supported(q, kv, head_dim)
}

/// Entry name of the sm_90a kernel for a Q dtype, KV dtype and head dim:
/// `paged_attention_context_sm90_{q}_kv_{kv}_d{head_dim}`.
pub fn context_sm90_entry_name(q: HalfDtype, kv: KvDtype, head_dim: usize) -> String {
    format!(
        "paged_attention_context_sm90_{}_kv_{}_d{head_dim}",
        q.name(),
        kv.name()
    )
}

/// Whether the sm_90a kernel at `head_dim` with `kv` pools runs a
/// persistent grid (one CTA per SM taking work items from a counter) under
/// schedule variant 0; mirrors `Cfg::PERSISTENT` in
/// `paged_attention_context_sm90.cu`: every entry but e4m3 at D 256 (16-bit
/// D 256 since session 53, with one Q buffer; the e4m3 D 256 producer's
/// item-loop state does not fit its registers), which handles one work item
/// per CTA and must be launched with one CTA per item
/// ([`context_sm90_grid`]).
pub fn context_sm90_persistent(head_dim: usize, kv: KvDtype) -> bool {
    !(head_dim == 256 && kv == KvDtype::E4m3)
}

/// CTAs of an sm_90a launch of `items` work items: one per item, or, for the
/// persistent grid (schedule variants without bit 1 at the
/// [`context_sm90_persistent`] head dims and KV dtypes), at most `ctas`
/// (the SM count: one CTA per SM fits; at least 1). With fewer CTAs than
/// items, CTA `c` starts with item `c` and takes the following items, in
/// order, from a device counter ([`ContextParams::work`]).
pub fn context_sm90_grid(
    items: u32,
    head_dim: usize,
    kv: KvDtype,
    variant: i32,
    ctas: usize,
) -> u32 {
    if variant & 2 == 0 && context_sm90_persistent(head_dim, kv) {
        items.min(ctas.max(1) as u32)
    } else {
        items
    }
}

/// Keys per KV tile of the sm_90a kernel: 64 at D 256, else 128.
pub fn context_sm90_tile_keys(head_dim: usize) -> usize {
    if head_dim == 256 {
        64
    } else {
        128
    }
}

/// K and V ring slots of the sm_90a kernel (mirrors `Cfg::KST`/`Cfg::VST`):
/// D 64 → (3, 3), D 128 → (2, 2) (16-bit KV: the room of a third V slot holds a
/// third Q buffer; e4m3 KV: its staging ring), D 256 → (2, 2).
pub fn context_sm90_stages(head_dim: usize, kv: KvDtype) -> (usize, usize) {
    match (head_dim, kv) {
        (256, _) | (128, _) => (2, 2),
        (64, _) => (3, 3),
        _ => (2, 3),
    }
}

/// Q buffers of the sm_90a kernel (mirrors `Cfg::QBUF`): on the persistent
/// grid ([`context_sm90_persistent`]: the next work items' Q load while the
/// consumers finish the current item) three at D 128 with 16-bit KV, one
/// at D 256 (a `[128, 256]` Q tile is 64 KB) and two at D 64; one off it
/// and for e4m3 KV at D 128 (the staging ring takes the room). The bf16-Q
/// e4m3 entries at D 128 (K8: S on the 8-bit K tiles) have two, with four
/// 8-bit K slots and two V slots (see
/// [`context_sm90_smem_bytes`]); these mirrors give the f16-Q layout.
pub fn context_sm90_q_buffers(head_dim: usize, kv: KvDtype) -> usize {
    match (context_sm90_persistent(head_dim, kv), head_dim, kv) {
        (false, _, _) | (true, 128, KvDtype::E4m3) | (true, 256, _) => 1,
        (true, 128, _) => 3,
        _ => 2,
    }
}

/// Steps of the sm_90a kernel's e4m3 staging ring (mirrors `Cfg::SST`): each
/// step holds one 8-bit K tile and one 8-bit V tile `[BN, D]` as gathered;
/// the producer converts them into the 16-bit rings. Two steps (the copies
/// of the next step in flight during a conversion) at D 64 / 128, one at
/// D 256, none for 16-bit KV.
pub fn context_sm90_staging_steps(head_dim: usize, kv: KvDtype) -> usize {
    match (kv, head_dim) {
        (KvDtype::E4m3, 256) => 1,
        (KvDtype::E4m3, _) => 2,
        _ => 0,
    }
}

/// Dynamic shared memory of the sm_90a kernel (mirrors `Cfg` in `paged_attention_context_sm90.cu`):
/// Q `[BM, D]` per Q buffer ([`context_sm90_block_rows`]) ([`context_sm90_q_buffers`]), the K and V
/// rings of `[BN, D]` 16-bit tiles ([`context_sm90_stages`]), the e4m3 staging ring
/// ([`context_sm90_staging_steps`] × two `[BN, D]` byte tiles), per K slot the valid masks of the
/// keys (4 u32: one word per producer warp), the mbarriers (full + empty per Q buffer and per ring
/// slot, two work-item slots full + empty + geometry published; e4m3: Q landed per Q buffer), one
/// f32 per consumer thread, four i32 (two work-item slots, the prefetched work counter, a spare),
/// the two slots' published geometry (64 bytes each), the output and query tensor maps' addresses
/// (8 bytes each), for e4m3 KV one byte per Q row and buffer (the row's shift of its conversion to
/// f16), and 1024 bytes of slack to align the swizzled tiles. e4m3 at D 128: the larger of the
/// f16-Q layout and the bf16-Q (K8) layout (K ring slots of `[BN, D]` byte tiles, four, two Q
/// buffers, a V-only staging ring), so one size serves both entries.
pub fn context_sm90_smem_bytes(head_dim: usize, kv_dtype: KvDtype) -> usize {
    let plan = SmemPlan {
        head_dim,
        rows: context_sm90_block_rows(head_dim, kv_dtype),
        tile_keys: context_sm90_tile_keys(head_dim),
        stages: context_sm90_stages(head_dim, kv_dtype),
        q_buffers: context_sm90_q_buffers(head_dim, kv_dtype),
        staging_steps: context_sm90_staging_steps(head_dim, kv_dtype),
        consumers: context_sm90_consumers(head_dim, kv_dtype),
        e4m3: kv_dtype == KvDtype::E4m3,
        k8: false,
    };
    // e4m3 at D 128: the bf16-Q entries' K8 layout (`Cfg` with K8: K ring
    // slots of 8-bit tiles, four of them, two Q buffers, V-only staging)
    // beside the f16-Q entries' layout; one launch size serves both.
    let k8 = if kv_dtype == KvDtype::E4m3 && head_dim == 128 {
        SmemPlan {
            stages: (4, 2),
            q_buffers: 2,
            k8: true,
            ..plan
        }
        .bytes()
    } else {
        0
    };
    plan.bytes().max(k8)
}

/// The compile-time shape of one sm_90a entry that its shared memory
/// follows from (see [`context_sm90_smem_bytes`]).
#[derive(Clone, Copy)]
struct SmemPlan {
    head_dim: usize,
    rows: usize,
    tile_keys: usize,
    stages: (usize, usize),
    q_buffers: usize,
    staging_steps: usize,
    consumers: usize,
    e4m3: bool,
    k8: bool,
}

impl SmemPlan {
    fn bytes(&self) -> usize {
        let (d, bn, qbuf) = (self.head_dim, self.tile_keys, self.q_buffers);
        let (kst, vst) = self.stages;
        let q = qbuf * self.rows * d * 2;
        let kv = bn * d * 2;
        let k_slot = if self.k8 { bn * d } else { kv };
        let staging = self.staging_steps * if self.k8 { 1 } else { 2 } * bn * d;
        // e4m3: each Q row's shift (one byte per row and Q buffer), see the kernel's Q conversion.
        let q_conv = if self.e4m3 { qbuf * self.rows } else { 0 };
        // e4m3: one more per Q buffer (its TMA boxes landed, before the conversion).
        let bars = 2 * qbuf + 2 * kst + 2 * vst + 6 + if self.e4m3 { qbuf } else { 0 };
        q + kst * k_slot
            + vst * kv
            + staging
            + kst * 4 * 4
            + bars * 8
            + 128 * self.consumers * 4
            + 16
            + 2 * CONTEXT_SM90_ITEM_GEOM_BYTES
            + 16
            + q_conv
            + 1024
    }
}

/// Whether the sm_90a kernel has two-CTA entries ("duo", `Cfg<D, false,
/// false, true>` in `paged_attention_context_sm90.cu`) for `(head_dim, kv)`:
/// D 64 and 128 with 16-bit KV. A duo entry runs two CTAs per SM, each a
/// producer warpgroup and one consumer warpgroup of
/// [`CONTEXT_SM90_DUO_ROWS`] query rows over KV tiles of
/// [`CONTEXT_SM90_DUO_TILE_KEYS`] keys: the two CTAs of an SM run their work
/// items independently, so one's item start, first softmax and epilogue
/// overlap the other's GEMMs, and the smaller tiles compute fewer masked
/// scores on the causal diagonal; each CTA reads K/V for 64 rows (twice the
/// bytes per FLOP of the one-CTA entries), so the launcher runs them for
/// short KV ranges only ([`context_sm90_duo_wanted`]).
pub fn context_sm90_duo_supported(head_dim: usize, kv: KvDtype) -> bool {
    matches!(head_dim, 64 | 128) && kv != KvDtype::E4m3
}

/// Query rows (packed (token, head) pairs) per work item of the duo entries.
pub const CONTEXT_SM90_DUO_ROWS: usize = 64;
/// Keys per KV tile of the duo entries.
pub const CONTEXT_SM90_DUO_TILE_KEYS: usize = 64;
/// Threads per CTA of the duo entries (a producer and one consumer warpgroup).
pub const CONTEXT_SM90_DUO_THREADS: u32 = 256;

/// K and V ring slots of the duo entries: (3, 3) at D 64, (2, 2) at D 128
/// (two CTAs' shared memory must fit one SM's 228 KB).
pub fn context_sm90_duo_stages(head_dim: usize) -> (usize, usize) {
    if head_dim == 64 {
        (3, 3)
    } else {
        (2, 2)
    }
}

/// Suffix of the sm_90a entries that write the row LSE
/// ([`ContextArgs::lse`]): every entry but the three-consumer ones (D 64,
/// 16-bit KV) has an `…_lse` variant (duo entries included); the others
/// carry no LSE code, so that their code stays as measured.
pub const CONTEXT_SM90_LSE_SUFFIX: &str = "_lse";

/// Entry name of a duo entry: `paged_attention_context_sm90_{q}_kv_{q}_d{head_dim}_duo`.
pub fn context_sm90_duo_entry_name(q: HalfDtype, kv: KvDtype, head_dim: usize) -> String {
    format!("{}_duo", context_sm90_entry_name(q, kv, head_dim))
}

/// Dynamic shared memory of a duo entry: as [`context_sm90_smem_bytes`]
/// with 64-row Q buffers (two), 64-key K/V tiles
/// ([`context_sm90_duo_stages`]) and one consumer.
pub fn context_sm90_duo_smem_bytes(head_dim: usize) -> usize {
    SmemPlan {
        head_dim,
        rows: CONTEXT_SM90_DUO_ROWS,
        tile_keys: CONTEXT_SM90_DUO_TILE_KEYS,
        stages: context_sm90_duo_stages(head_dim),
        q_buffers: 2,
        staging_steps: 0,
        consumers: 1,
        e4m3: false,
        k8: false,
    }
    .bytes()
}

/// Longest KV range (keys a request may attend to: its page-table row, or
/// the window) for which the launcher picks the duo entries at `head_dim`:
/// 0 at every head_dim, so the rule takes them only for a batch with no
/// keys. Measured on an H200 (session 17, FA3 grid, CUDA events), the duo
/// entries were slower than the one-CTA entries on every cell: D 64
/// 1.43× (32 × 512) to 1.63× (1 × 16k) the time, D 128 1.14× to 1.41×
/// (docs/PERF.md, session 17). They stay for the row LSE at D 64 and for
/// experiments ([`ContextKernel::set_duo`]).
pub fn context_sm90_duo_max_keys(head_dim: usize) -> usize {
    let _ = head_dim;
    0
}

/// The launcher's rule for the duo entries ([`context_sm90_duo_supported`]):
/// every request's keys are bounded by `keys` ≤
/// [`context_sm90_duo_max_keys`]. On longer ranges the one-CTA entries,
/// which read each K/V tile once for 128–192 rows, are faster.
pub fn context_sm90_duo_wanted(head_dim: usize, kv: KvDtype, keys: usize) -> bool {
    context_sm90_duo_supported(head_dim, kv) && keys <= context_sm90_duo_max_keys(head_dim)
}

/// Whether a launch's K / V strides and in-page offsets (elements) all fit
/// `i32`, so that the sm_90a gather may form its K / V row addresses from
/// 32-bit products ([`ContextParams::narrow`]): every stride in
/// `0..=i32::MAX` and `stride_head · (Hkv − 1) + stride_tok ·
/// (page_size − 1)` at most `i32::MAX` (the page's own offset,
/// `id · stride_page`, is a 32 × 32 → 64-bit product).
pub fn context_sm90_cursor_fits(p: &ContextParams) -> bool {
    let max = i64::from(i32::MAX);
    let fits = |v: Option<i64>| v.is_some_and(|v| (0..=max).contains(&v));
    let kv = |page: i64, head: i64, tok: i64| {
        [page, head, tok].iter().all(|&s| fits(Some(s)))
            && fits(
                head.checked_mul(i64::from(p.num_kv_heads - 1).max(0))
                    .zip(tok.checked_mul(i64::from(p.page_size - 1).max(0)))
                    .and_then(|(a, b)| a.checked_add(b)),
            )
    };
    kv(p.k_stride_page, p.k_stride_head, p.k_stride_tok)
        && kv(p.v_stride_page, p.v_stride_head, p.v_stride_tok)
}

/// Extra shared memory given to the sm_90a experiment entries
/// ([`ContextKernel::set_experiment`]): the K / V ring split 3 / 2 (`XV &
/// 16` in the kernel; its entry `_x16` was dropped in session 44, the code
/// path kept) takes 16 bytes more for its valid-key masks than the default.
pub(super) const CONTEXT_SM90_EXPERIMENT_SLACK: usize = 128;

/// Shared memory of one work-item slot's published geometry (mirrors
/// `Cfg::ITEM_GEOM_BYTES`).
const CONTEXT_SM90_ITEM_GEOM_BYTES: usize = 64;

/// Keys per TMA box of the sm_90a kernel's K/V loads for a page size, or
/// `None` when the cp.async row gather runs: a page size that is a multiple
/// of the tile's keys ([`context_sm90_tile_keys`]; one box per 64 columns
/// and tile, at the token offset of the tile in its page), or a multiple of
/// 8 that divides it (one box per page and 64 columns). Page sizes 1, 48 and
/// 1600 (at D ≤ 128) gather rows.
pub fn context_sm90_tma_rows(page_size: usize, head_dim: usize) -> Option<usize> {
    let bn = context_sm90_tile_keys(head_dim);
    if page_size % bn == 0 {
        Some(bn)
    } else if bn % page_size == 0 && page_size % 8 == 0 {
        Some(page_size)
    } else {
        None
    }
}

/// The 4-D tensor map layout of a K or V pool view for TMA boxes of `rows`
/// keys, or `None` when the view does not fit one (then the gather runs):
/// dim 0 = the `head_dim` contiguous elements, dims 1–3 = token in page,
/// head, page in increasing stride order (a head dim of one head goes last);
/// returns the layout and the coordinate-slot code of
/// [`ContextParams::tma_dims`]. `strides` are the view's element strides
/// `[page, head, token]` (0 for a dim of size 1).
pub fn kv_tma_layout(
    strides: [i64; 3],
    num_pages: usize,
    hkv: usize,
    page_size: usize,
    head_dim: usize,
    rows: usize,
) -> Option<(kernel_rt::tma::Tiled16<4>, i32)> {
    let [sp, sh, st] = strides.map(|x| u64::try_from(x).ok());
    let (sp, sh, st) = (sp?, sh?, st?);
    // (stride bytes, size, box rows, which: 0 token, 1 head, 2 page)
    let mut d = [
        (st * 2, page_size as u64, rows.min(page_size) as u32, 0),
        (sh * 2, hkv as u64, 1, 1),
        (sp * 2, num_pages as u64, 1, 2),
    ];
    if hkv == 1 {
        d[1].0 = u64::MAX;
    }
    d.sort_by_key(|x| x.0);
    if hkv == 1 {
        d[2].0 = d[1].0.max(16);
    }
    let mut code = 0i32;
    for (slot, x) in d.iter().enumerate() {
        code |= ((slot + 1) as i32) << (4 * x.3);
    }
    let layout = kernel_rt::tma::Tiled16 {
        dims: [head_dim as u64, d[0].1, d[1].1, d[2].1],
        strides_bytes: [d[0].0, d[1].0, d[2].0, 0],
        box_dims: [64, d[0].2, d[1].2, d[2].2],
    };
    layout.rejection().is_none().then_some((layout, code))
}

/// The 3-D tensor map layout of the output view for the sm_90a kernel's TMA
/// stores, or `None` when the rows are stored by threads: dim 0 = the
/// `head_dim` contiguous elements, dim 1 = query head (`hq`), dim 2 = token
/// (`num_tokens`); box `[64, group, 64 / group]`, the 64 packed rows
/// (token · G + head) of one consumer warpgroup, one box per 64 columns.
/// Needs `group` to divide 64 (a warpgroup's rows are then whole tokens) and
/// a 64-column multiple `head_dim`. `strides` are the view's element strides
/// `[token, head]` (the head stride is not used when `hq = 1`).
pub fn out_tma_layout(
    strides: [i64; 2],
    num_tokens: usize,
    hq: usize,
    group: usize,
    head_dim: usize,
) -> Option<kernel_rt::tma::Tiled16<3>> {
    q_tma_layout(strides, num_tokens, hq, group, head_dim, 64)
}

/// The 3-D tensor map layout of the query view for the sm_90a kernel's TMA
/// loads of a work item's Q rows, or `None` when the producer copies them
/// with cp.async: as [`out_tma_layout`], with box `[64, group, rows /
/// group]` for the `rows` = BM packed rows of a work item
/// ([`context_sm90_block_rows`]); needs `group` to divide `rows`.
pub fn q_tma_layout(
    strides: [i64; 2],
    num_tokens: usize,
    hq: usize,
    group: usize,
    head_dim: usize,
    rows: usize,
) -> Option<kernel_rt::tma::Tiled16<3>> {
    if group == 0 || rows % group != 0 || head_dim % 64 != 0 || num_tokens == 0 || hq < group {
        return None;
    }
    let [st, sh] = strides.map(|x| u64::try_from(x).ok());
    let st = st? * 2;
    // One head: the head coordinate is always 0, any legal stride will do.
    let sh = if hq == 1 { st.max(16) } else { sh? * 2 };
    let layout = kernel_rt::tma::Tiled16 {
        dims: [head_dim as u64, hq as u64, num_tokens as u64],
        strides_bytes: [sh, st, 0],
        box_dims: [64, group as u32, u32::try_from(rows / group).ok()?],
    };
    layout.rejection().is_none().then_some(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NHD pools of `pages` pages of 16 tokens × 8 heads × 128 dims, a page
    /// table of `m` entries a request.
    fn params(bs: i32, m: i64, pages: i64) -> ContextParams {
        let (p, h, d) = (16i64, 8i64, 128i64);
        ContextParams {
            k_stride_page: p * h * d,
            k_stride_head: d,
            k_stride_tok: h * d,
            v_stride_page: p * h * d,
            v_stride_head: d,
            v_stride_tok: h * d,
            page_table_stride: m,
            bs,
            num_kv_heads: h as i32,
            page_size: p as i32,
            max_num_pages: pages as i32,
            ..ContextParams::default()
        }
    }

    #[test]
    fn narrow_addresses_need_i32_strides_and_offsets() {
        assert!(context_sm90_cursor_fits(&params(8, 4096, 1 << 20)));
        // Page-table indices past i32 do not matter (the rows' pointers
        // are 64-bit in both forms).
        let p = params(2, i64::from(i32::MAX), 1);
        assert!(context_sm90_cursor_fits(&p));
        // The edge: a largest in-page offset of exactly i32::MAX
        // (1 · (2 − 1) + 1 · (i32::MAX − 1)), then one past it.
        let mut p = params(1, 4096, 1);
        (p.k_stride_head, p.k_stride_tok, p.num_kv_heads, p.page_size) = (1, 1, 2, i32::MAX);
        (p.v_stride_head, p.v_stride_tok) = (1, 1);
        assert!(context_sm90_cursor_fits(&p));
        p.num_kv_heads = 3;
        assert!(!context_sm90_cursor_fits(&p), "in-page offset i32::MAX + 1");
        let mut p = params(8, 4096, 1);
        p.v_stride_page = i64::from(i32::MAX) + 1;
        assert!(!context_sm90_cursor_fits(&p), "page stride past i32");
        let mut p = params(8, 4096, 1);
        p.k_stride_tok = -128;
        assert!(!context_sm90_cursor_fits(&p), "negative stride");
        let mut p = params(8, 4096, 1);
        p.page_size = 1 << 22;
        assert!(!context_sm90_cursor_fits(&p), "in-page offset past i32");
        p.page_size = 1;
        p.num_kv_heads = 1;
        assert!(context_sm90_cursor_fits(&p));
    }
}
