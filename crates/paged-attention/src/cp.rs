//! Decode context parallelism (DCP) by page interleave, in f64: what each
//! rank holds of a paged batch, and the whole split / merge path simulated
//! on one host (the definition a multi-rank run is tested against).
//!
//! Under DCP over `N` ranks, page `e` of every request (its `e`-th
//! page-table entry) lives on rank `e mod N`, as that rank's local page
//! `e div N` ([`crate::reference::Interleave`] with `block = P`). Rank `r`
//! therefore sees, for request `b` of global KV length `L_b`:
//!
//! ```text
//! local page table  pt_r[b][i] = pt[b][i·N + r]      (i < ceil(M / N))
//! local length      L_{r,b}    = #{ g < L_b : (g div P) mod N = r }
//! ```
//!
//! and computes the partial state `(O_r, LSE_r)` of every query row over
//! its keys, in global positions (causal limit and window as for the whole
//! sequence), **without sinks**. The states are merged with
//! [`crate::merge::merge_states`] and the sinks join once after the merge
//! ([`crate::merge::apply_sinks`], the rule of that module). The merged
//! output equals the unsplit [`crate::reference::attention`] within f64
//! rounding; rows that see no key stay `O = 0`, `LSE = -inf` (D13).
//!
//! Error events: the per-request checks (bad `cu_seqlens_q`, a request
//! longer than `max_q_len`, a negative length) are counted once, as the
//! unsplit call counts them; each needed page belongs to exactly one rank,
//! so the ranks' bad-page counts add up to the unsplit count.

use kernel_rt::ErrorReport;

use crate::merge::{apply_sinks, merge_states};
use crate::reference::{
    attention_at, request_geometry, HostInputs, Interleave, KeyPositions, RefOutput,
};

/// Rank `rank` of `ranks`' view of a batch's page table under the page
/// interleave (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankTables {
    /// `[bs, max_num_pages]` i32, row stride `max_num_pages`: local page `i`
    /// of request `b` = global entry `i·N + rank` (`-1` past the global
    /// table's `M`, a bad page a needed key never lands on).
    pub page_table: Vec<i32>,
    /// `ceil(M / N)`, at least 1.
    pub max_num_pages: usize,
    /// `[bs]` i32 local lengths `L_{r,b}` (negative global lengths read as 0).
    pub cache_seqlens: Vec<i32>,
}

/// Rank `rank`'s tables (module docs) from the global `page_table`
/// (`[bs, m]`, row stride `stride`), `cache_seqlens` (`[bs]`) and
/// `page_size` (`P ≥ 1`). `ranks = 0` counts as 1.
///
/// # Panics
/// When `rank ≥ ranks` or the table is shorter than `bs` rows.
pub fn rank_tables(
    page_table: &[i32],
    m: usize,
    stride: usize,
    cache_seqlens: &[i32],
    page_size: usize,
    rank: usize,
    ranks: usize,
) -> RankTables {
    let n = ranks.max(1);
    assert!(rank < n, "rank {rank} of {n} ranks");
    let bs = cache_seqlens.len();
    let mr = m.div_ceil(n).max(1);
    let mut pt = vec![-1i32; bs * mr];
    let il = Interleave {
        rank,
        ranks: n,
        block: page_size.max(1),
    };
    let mut lens = Vec::with_capacity(bs);
    for (b, &len) in cache_seqlens.iter().enumerate() {
        for i in 0..mr {
            let g = i * n + rank;
            if g < m {
                pt[b * mr + i] = page_table[b * stride + g];
            }
        }
        let local = il.count_below(i64::from(len.max(0)));
        lens.push(i32::try_from(local).unwrap_or(i32::MAX));
    }
    RankTables {
        page_table: pt,
        max_num_pages: mr,
        cache_seqlens: lens,
    }
}

/// The per-request check events of `input` (each request checked once,
/// as [`request_geometry`] counts them).
fn geometry_errors(input: &HostInputs<'_>) -> ErrorReport {
    let mut e = ErrorReport::default();
    for b in 0..input.cache_seqlens.len() {
        let _ = request_geometry(input, b, &mut e);
    }
    e
}

/// Rank `rank` of `ranks`' partial state of `input` (module docs): its
/// [`rank_tables`] read in global positions, no sinks, `written` as the
/// unsplit call's. Its error word is what the rank's interleaved decode
/// launch counts: the per-request check events on rank 0 only, and the
/// rank's own bad-page events (so the ranks' words add up to the unsplit
/// call's).
///
/// # Panics
/// When `rank ≥ ranks` (as [`rank_tables`]).
pub fn rank_partial(input: &HostInputs<'_>, rank: usize, ranks: usize) -> RefOutput {
    let ranks = ranks.max(1);
    let page_size = input.k.shape[2];
    let global: Vec<i64> = input
        .cache_seqlens
        .iter()
        .map(|&l| i64::from(l.max(0)))
        .collect();
    let t = rank_tables(
        input.page_table,
        input.max_num_pages,
        input.page_table_stride,
        input.cache_seqlens,
        page_size,
        rank,
        ranks,
    );
    let local = HostInputs {
        page_table: &t.page_table,
        max_num_pages: t.max_num_pages,
        page_table_stride: t.max_num_pages,
        cache_seqlens: &t.cache_seqlens,
        sinks: None,
        ..*input
    };
    let pos = KeyPositions {
        key_offset: None,
        interleave: Some(Interleave {
            rank,
            ranks,
            block: page_size.max(1),
        }),
        seq_lens: Some(&global),
    };
    let mut r = attention_at(&local, &pos);
    // The rank's page events: its total less its own per-request checks.
    let pages = r.errors.count - geometry_errors(&local).count;
    let mut errors = if rank == 0 {
        geometry_errors(input)
    } else {
        ErrorReport::default()
    };
    if pages > 0 {
        errors.count += pages;
        errors.flags |= crate::ErrorFlags::BAD_PAGE.bits();
    }
    r.errors = errors;
    r
}

/// Attention of `input` split over `ranks` simulated ranks by page
/// interleave and merged (module docs): each rank runs
/// [`attention_at`] over its [`rank_tables`] with global positions and no
/// sinks, then [`merge_states`] and [`apply_sinks`]. `ranks ≤ 1` is the
/// unsplit [`crate::reference::attention`]. `out` and `lse` are the merged
/// state (`out` already scaled by `bmm2_scale`), `written` as the unsplit
/// call's, `errors` as described in the module docs.
pub fn simulate(input: &HostInputs<'_>, ranks: usize) -> RefOutput {
    if ranks <= 1 {
        return crate::reference::attention(input);
    }
    let mut errors = ErrorReport::default();
    let mut parts = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let r = rank_partial(input, rank, ranks);
        errors.count += r.errors.count;
        errors.flags |= r.errors.flags;
        parts.push(r);
    }
    let d = input.q_shape[2];
    let views: Vec<(&[f64], &[f64])> = parts.iter().map(|p| (&p.out[..], &p.lse[..])).collect();
    let (mut out, mut lse) = merge_states(&views, d);
    if let Some(s) = input.sinks {
        apply_sinks(&mut out, &mut lse, s, d);
    }
    let written = parts.swap_remove(0).written;
    RefOutput {
        out,
        written,
        lse,
        errors,
    }
}
