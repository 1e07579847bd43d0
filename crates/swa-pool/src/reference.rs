//! CPU reference: the plain definitions of SEMANTICS.md §swa-pool.3–4
//! (and SEMANTICS.md §page-table.3), with mha-kit's handling of out-of-domain device
//! data (DESIGN.md D9, D11). The GPU kernels must match them bit for bit,
//! error word included.

use kernel_rt::ErrorReport;

use crate::ErrorFlags;

fn report(err: &mut ErrorReport, flag: ErrorFlags) {
    err.count += 1;
    err.flags |= flag.bits();
}

/// Translates one full-pool token location through `full_to_swa`
/// (`[N_map]`): a location in `[0, N_map − 1)` gives the map entry, −1 gives
/// −1, anything else gives 0 and records one event in `err`.
pub fn translate_one(full_to_swa: &[i64], loc: i64, err: &mut ErrorReport) -> i64 {
    let limit = full_to_swa.len() as i64 - 1;
    if (0..limit).contains(&loc) {
        full_to_swa[loc as usize]
    } else if loc == -1 {
        -1
    } else {
        report(
            err,
            if loc < 0 {
                ErrorFlags::BELOW_SENTINEL
            } else {
                ErrorFlags::OUTSIDE_MAP
            },
        );
        0
    }
}

/// `swa_loc[i] = translate(out_cache_loc[i])` for `i < n`, and 0 for the tail
/// `n ≤ i < swa_loc.len()`. Returns the error word the GPU would hold (from zero).
///
/// # Panics
/// When `swa_loc` is shorter than `out_cache_loc` (a test-setup bug).
pub fn translate_locs(
    full_to_swa: &[i64],
    out_cache_loc: &[i64],
    swa_loc: &mut [i64],
) -> ErrorReport {
    assert!(
        swa_loc.len() >= out_cache_loc.len(),
        "output shorter than input"
    );
    let mut err = ErrorReport::default();
    let (head, tail) = swa_loc.split_at_mut(out_cache_loc.len());
    for (o, &loc) in head.iter_mut().zip(out_cache_loc) {
        *o = translate_one(full_to_swa, loc, &mut err);
    }
    tail.fill(0);
    err
}

/// Host-side inputs of one page-id translation (same meaning as [`crate::SwaPageArgs`]).
#[derive(Debug, Clone)]
pub struct PageInputs<'a> {
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
    /// `M`: width of the table, in pages.
    pub max_num_pages: usize,
    /// `[N_map]` full→SWA slot map.
    pub full_to_swa: &'a [i64],
}

/// Builds the SWA page table `[bs, M]` (row stride `stride`) for the live
/// prefix of each row; entries past it are left untouched. Returns the error
/// word the GPU kernel would hold afterwards (from zero).
///
/// # Panics
/// When `swa_page_table` is too small for `[bs, M]` at `stride` (a test-setup bug).
pub fn translate_pages(
    input: &PageInputs<'_>,
    swa_page_table: &mut [i32],
    stride: usize,
) -> ErrorReport {
    let mut err = ErrorReport::default();
    let p = input.page_size as i64;
    let map = input.full_to_swa;
    for (row, (&r, &len)) in input
        .req_pool_indices
        .iter()
        .zip(input.cache_seqlens)
        .enumerate()
    {
        if r < 0 || r >= input.req_to_token_rows as i64 {
            report(&mut err, ErrorFlags::BAD_REQUEST_INDEX);
            continue;
        }
        if len < 0 {
            report(&mut err, ErrorFlags::NEGATIVE_SEQLEN);
            continue;
        }
        let mut n = (i64::from(len) + p - 1) / p;
        if n > input.max_num_pages as i64 {
            n = input.max_num_pages as i64;
            report(&mut err, ErrorFlags::ROW_CLAMPED);
        }
        let readable = (input.req_to_token_width as i64 + p - 1) / p;
        if n > readable {
            n = readable;
            report(&mut err, ErrorFlags::ROW_PAST_WIDTH);
        }
        let src = r as usize * input.req_to_token_stride;
        for page in 0..n as usize {
            let slot = i64::from(input.req_to_token[src + page * input.page_size]);
            let v = if slot < 0 {
                report(&mut err, ErrorFlags::NEGATIVE_SLOT);
                -1
            } else if slot >= map.len() as i64 - 1 {
                report(&mut err, ErrorFlags::OUTSIDE_MAP);
                0
            } else {
                let s2 = map[slot as usize];
                if s2 < 0 {
                    -1
                } else {
                    (s2 / p) as i32
                }
            };
            swa_page_table[row * stride + page] = v;
        }
    }
    err
}

/// The map update ([`crate::SwaUpdateKernel`]): for each `(F, S)` pair of
/// `entries` (`[n, 2]` flattened) with `F < (full_to_swa.len() − 1) / P`
/// and `S < num_swa_pages`, sets `full_to_swa[F·P + o] = S·P + o` for `o <
/// P` (0 when `S = 0`) and `page_map[F] = S`; other entries are skipped and
/// counted once ([`ErrorFlags::BAD_UPDATE`]). Returns the error word the
/// GPU would hold (from zero).
///
/// # Panics
/// When `page_size == 0` or `entries` has an odd length (a test-setup bug).
pub fn update_pages(
    full_to_swa: &mut [i64],
    mut page_map: Option<&mut [i32]>,
    page_size: usize,
    num_swa_pages: usize,
    entries: &[i64],
) -> ErrorReport {
    assert!(page_size > 0 && entries.len() % 2 == 0, "bad update setup");
    let p = page_size as i64;
    let pages = (full_to_swa.len() as i64 - 1).max(0) / p;
    let mut err = ErrorReport::default();
    for e in entries.chunks_exact(2) {
        let (page, swa) = (e[0], e[1]);
        if page < 0 || page >= pages || swa < 0 || swa >= num_swa_pages as i64 {
            report(&mut err, ErrorFlags::BAD_UPDATE);
            continue;
        }
        for o in 0..p {
            full_to_swa[(page * p + o) as usize] = if swa == 0 { 0 } else { swa * p + o };
        }
        if let Some(m) = page_map.as_deref_mut() {
            m[page as usize] = swa as i32;
        }
    }
    err
}
