//! CPU reference: the plain definition of SEMANTICS.md §graph-metadata.2
//! with mha-kit's decisions (D1, D2, D9, D11) and its handling of
//! out-of-domain device data. The GPU kernel must match it bit for bit, the
//! error word included. Outputs are updated in place, so a caller that keeps
//! the buffers across calls models a graph bucket across replays (stale
//! page-table tails included).

use kernel_rt::ErrorReport;

use crate::{ErrorFlags, GraphMode};

/// Host-side inputs of one update (same meaning as [`crate::GraphMetadataArgs`]).
#[derive(Debug, Clone)]
pub struct HostInputs<'a> {
    /// Forward mode (offset and query stride).
    pub mode: GraphMode,
    /// `[bs]` request rows.
    pub req_pool_indices: &'a [i64],
    /// `[bs]` scheduler KV lengths, tokens.
    pub seq_lens: &'a [i64],
    /// `[R, W]` row-major with row stride `req_to_token_stride` (i32 slots).
    pub req_to_token: &'a [i32],
    /// `R`.
    pub req_to_token_rows: usize,
    /// `W`: positions per row.
    pub req_to_token_width: usize,
    /// Elements between rows (≥ `W`).
    pub req_to_token_stride: usize,
    /// `P ≥ 1`.
    pub page_size: usize,
    /// Slots in the full pool; a sampled slot at or past it is counted (D9).
    pub pool_slots: Option<usize>,
    /// `[N_map]` full→SWA slot map, when SWA outputs are built.
    pub swa_mapping: Option<&'a [i64]>,
    /// `[n_out]` full-pool write slots (used only for `swa_out_cache_loc`).
    pub out_cache_loc: Option<&'a [i64]>,
    /// `[bs]` ragged-verify query lengths (with [`GraphMode::RaggedVerify`]).
    pub qlens: Option<&'a [i32]>,
}

/// The output buffers of one bucket (row-major host copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostOutputs {
    /// `[bs]`.
    pub cache_seqlens: Vec<i32>,
    /// `[bs + 1]`.
    pub cu_seqlens_k: Vec<i32>,
    /// `[bs + 1]`, when bound.
    pub cu_seqlens_q: Option<Vec<i32>>,
    /// `M`, the table width.
    pub max_num_pages: usize,
    /// `[bs, M]` at row stride `page_table_stride`.
    pub page_table: Vec<i32>,
    /// Row stride of `page_table` (≥ `M`).
    pub page_table_stride: usize,
    /// `[bs, M]` at row stride `swa_page_table_stride`, when bound.
    pub swa_page_table: Option<Vec<i32>>,
    /// Row stride of `swa_page_table` (≥ `M`).
    pub swa_page_table_stride: usize,
    /// `[n_swa]`, when bound.
    pub swa_out_cache_loc: Option<Vec<i64>>,
}

impl HostOutputs {
    /// Buffers for a bucket of `bs` rows, every element `fill` (tests poison
    /// them), tables at row stride `M`.
    pub fn filled(
        bs: usize,
        m: usize,
        cu_q: bool,
        swa_table: bool,
        n_swa: Option<usize>,
        fill: i32,
    ) -> Self {
        Self {
            cache_seqlens: vec![fill; bs],
            cu_seqlens_k: vec![fill; bs + 1],
            cu_seqlens_q: cu_q.then(|| vec![fill; bs + 1]),
            max_num_pages: m,
            page_table: vec![fill; bs * m],
            page_table_stride: m,
            swa_page_table: swa_table.then(|| vec![fill; bs * m]),
            swa_page_table_stride: m,
            swa_out_cache_loc: n_swa.map(|n| vec![i64::from(fill); n]),
        }
    }

    /// Live prefix of row `row` of the page table (`n` entries).
    pub fn page_row(&self, row: usize, n: usize) -> &[i32] {
        &self.page_table[row * self.page_table_stride..][..n]
    }

    /// Live prefix of row `row` of the SWA page table (`n` entries).
    ///
    /// # Panics
    /// When the SWA table is not bound (a test-setup bug).
    pub fn swa_page_row(&self, row: usize, n: usize) -> &[i32] {
        let t = self.swa_page_table.as_ref().expect("swa_page_table bound");
        &t[row * self.swa_page_table_stride..][..n]
    }
}

/// `seq_len + offset` clamped into `[0, i32::MAX]`, and whether it was clamped.
fn cache_len(seq_len: i64, offset: i64) -> (i32, bool) {
    let v = seq_len.saturating_add(offset);
    let c = v.clamp(0, i64::from(i32::MAX));
    (c as i32, c != v)
}

/// The SWA page of a slot map entry `s2` (SEMANTICS.md §page-table.3, D9): −1 when
/// negative, else the low 32 bits of `s2 / P`.
fn swa_page_of_entry(s2: i64, p: i64) -> i32 {
    if s2 < 0 {
        -1
    } else {
        (s2 / p) as i32
    }
}

/// The full page → SWA page map (`[num_full_pages]` i32, 0 = unmapped) that
/// makes the page-map path of the SWA page table (crate docs, "SWA page
/// map") give exactly what the slot-map path gives, for **every** slot, from
/// a full→SWA slot map `swa_mapping` (`[N_map]`, last entry the −1 sentinel):
/// `num_full_pages = (N_map − 1) / P`, entry `F` = the SWA page
/// `swa_mapping[F·P] / P` (−1 for a negative entry).
///
/// Returns `None` when no page map reproduces the slot map: `P == 0`, an
/// empty map, `N_map − 1` not a multiple of `P`, or a full page whose
/// entries do not all give the same SWA page (or give one below −1, from an
/// entry past `i32::MAX · P`). A page-granular map
/// (SEMANTICS.md §swa-pool.2: each page unmapped or `map[F·P + o] = S·P + o`) always
/// gives `Some`.
pub fn page_map_from_slot_map(swa_mapping: &[i64], page_size: usize) -> Option<Vec<i32>> {
    let slots = swa_mapping.len().checked_sub(1)?;
    if page_size == 0 || slots % page_size != 0 {
        return None;
    }
    let p = page_size as i64;
    swa_mapping[..slots]
        .chunks_exact(page_size)
        .map(|page| {
            // An SWA page below −1 (the low 32 bits of a huge entry) has
            // no page-map equivalent: the page path maps entries < 0 to −1.
            let first = swa_page_of_entry(page[0], p);
            (first >= -1 && page.iter().all(|&e| swa_page_of_entry(e, p) == first)).then_some(first)
        })
        .collect()
}

/// Applies one metadata update to `out` (bs = `input.seq_lens.len()`): every
/// output rewritten whole except the page tables' tails past each row's live
/// prefix. `bs == 0` changes nothing. Returns the error word the GPU kernel
/// would hold afterwards (from zero). The SWA page table (when `out` binds
/// it and `input.swa_mapping` is given) goes through the slot map; see
/// [`update_graph_metadata_with_page_map`] for the page-map path.
///
/// # Panics
/// When `out`'s buffers are too small for the bucket, or `req_pool_indices`
/// and `seq_lens` differ in length (test-setup bugs, not user input).
pub fn update_graph_metadata(input: &HostInputs<'_>, out: &mut HostOutputs) -> ErrorReport {
    update_graph_metadata_with_page_map(input, None, out)
}

/// [`update_graph_metadata`] with the optional SWA page map
/// (`full_page_to_swa_page`, `[num_full_pages]` i32; crate docs, "SWA page
/// map"): when `Some`, each live SWA page-table entry is
/// `full_page_to_swa_page[slot / P]` (−1 for a negative slot or entry; 0,
/// counted as [`ErrorFlags::SLOT_OUTSIDE_MAP`], when `slot / P ≥
/// num_full_pages`) instead of `swa_mapping[slot] / P`. Everything else,
/// `swa_out_cache_loc` included, is as with `None`. The SWA page table is
/// still built only when `input.swa_mapping` is given (as on the GPU, where
/// the page map is part of the SWA arguments).
///
/// # Panics
/// As [`update_graph_metadata`].
pub fn update_graph_metadata_with_page_map(
    input: &HostInputs<'_>,
    full_page_to_swa_page: Option<&[i32]>,
    out: &mut HostOutputs,
) -> ErrorReport {
    let mut err = ErrorReport::default();
    let mut report = |flag: ErrorFlags| {
        err.count += 1;
        err.flags |= flag.bits();
    };
    let bs = input.seq_lens.len();
    assert_eq!(
        input.req_pool_indices.len(),
        bs,
        "req_pool_indices vs seq_lens"
    );
    if bs == 0 {
        return err;
    }
    let offset = input.mode.seqlen_offset();
    // Ragged verify: per-row query rows, clamped into [0, max_q_len].
    let ragged = match input.mode {
        GraphMode::RaggedVerify { max_q_len } => {
            Some((input.qlens.expect("ragged verify needs qlens"), max_q_len))
        }
        _ => None,
    };
    let q_len = |i: usize| -> (i64, bool) {
        match ragged {
            None => (0, false),
            Some((q, max)) => {
                let c = i64::from(q[i]).clamp(0, i64::from(max));
                (c, c != i64::from(q[i]))
            }
        }
    };

    // Per-row vectors and prefix sums (32-bit sums, low bits kept, D1).
    let mut run: i64 = 0;
    let mut run_q: i64 = 0;
    let mut cu_q_ragged = Vec::with_capacity(bs + 1);
    cu_q_ragged.push(0);
    out.cu_seqlens_k[0] = 0;
    for (i, &s) in input.seq_lens.iter().enumerate() {
        let (q, bad_q) = q_len(i);
        let (len, bad) = cache_len(s, offset.saturating_add(q));
        if bad {
            report(ErrorFlags::SEQLEN_OUT_OF_RANGE);
        }
        if bad_q {
            report(ErrorFlags::QLEN_OUT_OF_RANGE);
        }
        out.cache_seqlens[i] = len;
        run += i64::from(len);
        out.cu_seqlens_k[i + 1] = run as i32;
        run_q += q;
        cu_q_ragged.push(run_q as i32);
    }
    if run > i64::from(i32::MAX) {
        report(ErrorFlags::SUM_OVERFLOW);
    }
    if let Some(q) = out.cu_seqlens_q.as_mut() {
        if ragged.is_some() {
            q[..=bs].copy_from_slice(&cu_q_ragged);
        } else {
            let stride = i64::from(input.mode.q_stride());
            for (i, v) in q[..=bs].iter_mut().enumerate() {
                *v = (i as i64 * stride) as i32;
            }
        }
    }

    // Page tables: live prefix only (SEMANTICS.md §page-table.3, D9, D11).
    let p = input.page_size as i64;
    let m = out.max_num_pages as i64;
    let map = input.swa_mapping;
    for row in 0..bs {
        let r = input.req_pool_indices[row];
        if r < 0 || r >= input.req_to_token_rows as i64 {
            report(ErrorFlags::BAD_REQUEST_INDEX);
            continue;
        }
        let len = i64::from(out.cache_seqlens[row]);
        let mut n = (len + p - 1) / p;
        if n > m {
            n = m;
            report(ErrorFlags::ROW_CLAMPED);
        }
        let readable = (input.req_to_token_width as i64 + p - 1) / p;
        if n > readable {
            n = readable;
            report(ErrorFlags::ROW_PAST_WIDTH);
        }
        let src = r as usize * input.req_to_token_stride;
        for page in 0..n as usize {
            let slot = i64::from(input.req_to_token[src + page * input.page_size]);
            let full = if slot < 0 {
                report(ErrorFlags::NEGATIVE_SLOT);
                0
            } else if input.pool_slots.is_some_and(|ps| slot >= ps as i64) {
                report(ErrorFlags::SLOT_OUTSIDE_POOL);
                0
            } else {
                (slot / p) as i32
            };
            out.page_table[row * out.page_table_stride + page] = full;
            if let (Some(map), Some(swa)) = (map, out.swa_page_table.as_mut()) {
                let v = match full_page_to_swa_page {
                    _ if slot < 0 => -1,
                    None if slot >= map.len() as i64 - 1 => {
                        report(ErrorFlags::SLOT_OUTSIDE_MAP);
                        0
                    }
                    None => swa_page_of_entry(map[slot as usize], p),
                    Some(pages) => match pages.get((slot / p) as usize) {
                        None => {
                            report(ErrorFlags::SLOT_OUTSIDE_MAP);
                            0
                        }
                        Some(&e) => e.max(-1),
                    },
                };
                swa[row * out.swa_page_table_stride + page] = v;
            }
        }
    }

    // SWA write locations: real tokens translated, the rest 0 (SEMANTICS.md §graph-metadata.2, item 6).
    if let (Some(map), Some(dst)) = (map, out.swa_out_cache_loc.as_mut()) {
        let src = input.out_cache_loc.unwrap_or(&[]);
        for (j, d) in dst.iter_mut().enumerate() {
            *d = match src.get(j) {
                None => 0,
                Some(&loc) if loc < 0 => -1,
                Some(&loc) if loc >= map.len() as i64 - 1 => {
                    report(ErrorFlags::LOC_OUTSIDE_MAP);
                    0
                }
                Some(&loc) => map[loc as usize],
            };
        }
    }
    err
}
