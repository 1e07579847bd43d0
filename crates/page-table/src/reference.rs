//! CPU reference: the plain definition of SEMANTICS.md §page-table.3, with
//! mha-kit's handling of out-of-domain device data (DESIGN.md D9, D11).
//! The GPU kernel must match it bit for bit, error word included.

use kernel_rt::ErrorReport;

use crate::ErrorFlags;

/// Host-side inputs of one page-table build (same meaning as [`crate::PageTableArgs`]).
#[derive(Debug, Clone)]
pub struct HostInputs<'a> {
    /// `[R, W]` row-major with row stride `req_to_token_stride` (i32 slots).
    pub req_to_token: &'a [i32],
    /// `R`.
    pub req_to_token_rows: usize,
    /// `W`: positions per row.
    pub req_to_token_width: usize,
    /// Elements between rows (≥ `W`).
    pub req_to_token_stride: usize,
    /// `[bs]` (i64): row of `req_to_token` per batch request.
    pub req_pool_indices: &'a [i64],
    /// `[bs]` (i32): KV length `L_i` per request, in tokens.
    pub cache_seqlens: &'a [i32],
    /// `P ≥ 1`, tokens per page.
    pub page_size: usize,
    /// `M`: width of the page tables, in pages.
    pub max_num_pages: usize,
    /// `[N_map]` full→SWA slot map (SEMANTICS.md §swa-pool.2), if the SWA table is built.
    pub full_to_swa: Option<&'a [i64]>,
    /// Slots in the full pool; a slot at or past it is counted (D9).
    pub pool_slots: Option<usize>,
}

/// Builds the page table (and the SWA table when `full_to_swa` is given)
/// into `page_table` / `swa_page_table`, `[bs, M]` row-major with the given
/// row strides. Entries past each row's live prefix are left untouched.
/// Returns the error word the GPU kernel would hold afterwards (from zero).
///
/// # Panics
/// When the output slices are too small for `[bs, M]` at their strides (a
/// test-setup bug, not user input).
pub fn build_page_table(
    input: &HostInputs<'_>,
    page_table: &mut [i32],
    page_table_stride: usize,
    mut swa_page_table: Option<(&mut [i32], usize)>,
) -> ErrorReport {
    let mut err = ErrorReport::default();
    let mut report = |flag: ErrorFlags| {
        err.count += 1;
        err.flags |= flag.bits();
    };
    let p = input.page_size as i64;
    for (row, (&r, &len)) in input
        .req_pool_indices
        .iter()
        .zip(input.cache_seqlens)
        .enumerate()
    {
        if r < 0 || r >= input.req_to_token_rows as i64 {
            report(ErrorFlags::BAD_REQUEST_INDEX);
            continue;
        }
        if len < 0 {
            report(ErrorFlags::NEGATIVE_SEQLEN);
            continue;
        }
        let mut n = (i64::from(len) + p - 1) / p;
        if n > input.max_num_pages as i64 {
            n = input.max_num_pages as i64;
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
            } else if input.pool_slots.is_some_and(|n| slot >= n as i64) {
                report(ErrorFlags::SLOT_OUTSIDE_POOL);
                0
            } else {
                (slot / p) as i32
            };
            page_table[row * page_table_stride + page] = full;
            if let (Some(map), Some((swa, stride))) = (input.full_to_swa, swa_page_table.as_mut()) {
                let v = if slot < 0 {
                    -1
                } else if slot >= map.len() as i64 - 1 {
                    report(ErrorFlags::SLOT_OUTSIDE_MAP);
                    0
                } else {
                    let s2 = map[slot as usize];
                    if s2 < 0 {
                        -1
                    } else {
                        (s2 / p) as i32
                    }
                };
                swa[row * *stride + page] = v;
            }
        }
    }
    err
}

/// The scatter's definition (crate docs, "Updating req_to_token"): for each
/// `(position, slot)` of `entries`, in order, `req_to_token[position / W,
/// position % W] = slot` (row stride `stride`); an entry with `position`
/// outside `[0, R·W)` or `slot` outside i32 is skipped and counted
/// ([`ErrorFlags::BAD_ENTRY`]). Returns the error word the GPU would hold.
///
/// # Panics
/// When `req_to_token` is too small for `[rows, width]` at `stride` (a
/// test-setup bug, not user input).
pub fn scatter(
    req_to_token: &mut [i32],
    rows: usize,
    width: usize,
    stride: usize,
    entries: &[[i64; 2]],
) -> ErrorReport {
    let mut err = ErrorReport::default();
    let total = (rows * width) as i64;
    for &[pos, slot] in entries {
        match i32::try_from(slot) {
            Ok(s) if (0..total).contains(&pos) => {
                let (r, c) = (pos as usize / width, pos as usize % width);
                req_to_token[r * stride + c] = s;
            }
            _ => {
                err.count += 1;
                err.flags |= ErrorFlags::BAD_ENTRY.bits();
            }
        }
    }
    err
}
