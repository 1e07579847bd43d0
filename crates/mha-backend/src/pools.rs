//! Host side of the KV pools (SEMANTICS.md §fp8-kv.1, SEMANTICS.md §swa-pool.1–2, §swa-pool.5): the
//! request-to-token pool, the full-pool page allocator and the hybrid SWA
//! map. The K/V bytes themselves live in the executor.
//!
//! Every operation checks its whole input before changing anything, so an
//! error leaves every pool exactly as it was.

use std::collections::BTreeSet;

use swa_pool::{EvictionPolicy, SwaMapping};

use crate::error::{BackendError, Result};

/// State of one allocated request row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Request {
    /// Token positions held (`req_to_token[r, ..len]` are valid slots).
    len: usize,
    /// Full pages in position order: position `j` lives in `pages[j / P]`.
    pages: Vec<usize>,
    /// Positions below this have had their SWA pages evicted.
    swa_evicted: usize,
    /// The largest window an eviction used (`evict_swa`): a position's next
    /// token attends to the keys down to it minus this.
    swa_window: usize,
}

/// The sync mark of [`Pools`]: set through `&Pools` by the executor that
/// mirrors the table (an atomic keeps `Pools` `Sync`); a clone copies it.
#[derive(Debug, Default)]
struct SyncedMark(std::sync::atomic::AtomicU64);

impl Clone for SyncedMark {
    fn clone(&self) -> Self {
        Self(std::sync::atomic::AtomicU64::new(
            self.0.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }
}

/// The request-to-token table, the page allocator of the full pool and the
/// full→SWA map of a hybrid pool.
///
/// - `req_to_token`: `[R, W]` i32, `R = max_requests + 1`, `W = context_len`;
///   row 0 is reserved and stays all zeros (padding rows read it).
/// - Full pool: `num_pages + 1` pages of `P` slots; page 0 is the dummy page,
///   allocatable pages are `1..=num_pages`.
/// - SWA pool (hybrid models): `num_swa_pages + 1` pages; every full page a
///   request holds has one SWA page until it is evicted out of the window.
#[derive(Debug, Clone)]
pub struct Pools {
    page_size: usize,
    width: usize,
    rows: usize,
    req_to_token: Vec<i32>,
    requests: Vec<Option<Request>>,
    free_rows: Vec<usize>,
    free_pages: Vec<usize>,
    num_pages: usize,
    swa: Option<SwaMapping>,
    /// Bumped by every change of `req_to_token` or the SWA map.
    generation: u64,
    /// Per `req_to_token` row: the generation of its last change.
    row_generation: Vec<u64>,
    /// Generation of the last change of the SWA map.
    swa_generation: u64,
    /// Per `req_to_token` row: `(base, lo, hi)` — every change of the row
    /// after generation `base` lies in columns `lo..hi`.
    row_span: Vec<(u64, usize, usize)>,
    /// The generation a device copy last synced to ([`Self::mark_synced`]);
    /// a row whose last change is not newer starts a fresh span.
    synced: SyncedMark,
}

impl Pools {
    /// Empty pools.
    ///
    /// # Errors
    /// [`BackendError::Swa`] when the SWA map cannot be built.
    pub(crate) fn new(
        page_size: usize,
        context_len: usize,
        max_requests: usize,
        num_pages: usize,
        num_swa_pages: Option<usize>,
    ) -> Result<Self> {
        let rows = max_requests + 1;
        let swa = num_swa_pages
            .map(|s| SwaMapping::new(num_pages * page_size, s * page_size, page_size))
            .transpose()?;
        Ok(Self {
            page_size,
            width: context_len,
            rows,
            req_to_token: vec![0; rows * context_len],
            requests: vec![None; rows],
            // Popped from the back: rows 1, 2, ... and pages 1, 2, ... first.
            free_rows: (1..rows).rev().collect(),
            free_pages: (1..=num_pages).rev().collect(),
            num_pages,
            swa,
            generation: 0,
            row_generation: vec![0; rows],
            swa_generation: 0,
            row_span: vec![(0, 0, 0); rows],
            synced: SyncedMark::default(),
        })
    }

    /// Change counter of `req_to_token` and the SWA map: bumped by every
    /// call that changes either (device executors re-upload on change).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The `req_to_token` entries changed after generation `since`, per
    /// changed row: `(row, columns)`. Exact when `since` is the generation
    /// last passed to [`Self::mark_synced`] (a device copy's sync point);
    /// for an older `since` a row may be given whole (`0..W`). Columns
    /// outside a row's changes may be included (they hold current values).
    pub fn dirty_spans(&self, since: u64) -> Vec<(usize, std::ops::Range<usize>)> {
        self.row_generation
            .iter()
            .zip(&self.row_span)
            .enumerate()
            .filter(|(_, (&g, _))| g > since)
            .map(|(row, (_, &(base, lo, hi)))| {
                if since >= base {
                    (row, lo..hi)
                } else {
                    (row, 0..self.width)
                }
            })
            .collect()
    }

    /// Records that a device copy now holds generation `generation` (its
    /// next [`Self::dirty_spans`] call passes it as `since`). Later changes
    /// of a row start a fresh column span instead of widening the old one.
    pub fn mark_synced(&self, generation: u64) {
        self.synced
            .0
            .store(generation, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the SWA map changed after generation `since`.
    pub fn swa_dirty(&self, since: u64) -> bool {
        self.swa.is_some() && self.swa_generation > since
    }

    /// Records a change of columns `lo..hi` of `req_to_token` row `row`.
    fn touch_row(&mut self, row: usize, lo: usize, hi: usize, swa: bool) {
        self.generation += 1;
        if let (Some(g), Some(span)) =
            (self.row_generation.get_mut(row), self.row_span.get_mut(row))
        {
            let synced = self.synced.0.load(std::sync::atomic::Ordering::Relaxed);
            *span = if *g <= synced {
                (synced, lo, hi)
            } else {
                (span.0, span.1.min(lo), span.2.max(hi))
            };
            *g = self.generation;
        }
        if swa {
            self.swa_generation = self.generation;
        }
    }

    /// `P`.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// `req_to_token` `[R, W]` row-major (row stride `W`).
    pub fn req_to_token(&self) -> &[i32] {
        &self.req_to_token
    }

    /// `R` (row 0 included).
    pub fn req_to_token_rows(&self) -> usize {
        self.rows
    }

    /// `W` = context length.
    pub fn req_to_token_width(&self) -> usize {
        self.width
    }

    /// Slots of the full pool, `(num_pages + 1) · P`.
    pub fn full_slots(&self) -> usize {
        (self.num_pages + 1) * self.page_size
    }

    /// Slots of the SWA pool, `(num_swa_pages + 1) · P`, if hybrid.
    pub fn swa_slots(&self) -> Option<usize> {
        self.swa.as_ref().map(|m| m.size_swa() + self.page_size)
    }

    /// The full→SWA map, if hybrid.
    pub fn swa_mapping(&self) -> Option<&SwaMapping> {
        self.swa.as_ref()
    }

    /// Free full pages.
    pub fn free_pages(&self) -> usize {
        self.free_pages.len()
    }

    /// Free SWA pages (0 without an SWA pool).
    pub fn free_swa_pages(&self) -> usize {
        self.swa.as_ref().map_or(0, SwaMapping::free_swa_pages)
    }

    /// Free request rows.
    pub fn free_request_rows(&self) -> usize {
        self.free_rows.len()
    }

    /// Tokens held by request row `req`.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn request_len(&self, req: usize) -> Result<usize> {
        Ok(self.request(req)?.len)
    }

    /// Slots of request row `req`, by position (`req_to_token[req, ..len]`).
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn request_slots(&self, req: usize) -> Result<&[i32]> {
        let len = self.request(req)?.len;
        Ok(&self.req_to_token[req * self.width..][..len])
    }

    fn request(&self, req: usize) -> Result<&Request> {
        self.requests
            .get(req)
            .and_then(Option::as_ref)
            .ok_or(BackendError::UnknownRequest(req))
    }

    /// Takes a free request row (never 0) holding no token.
    ///
    /// # Errors
    /// [`BackendError::NoFreeRequestRow`].
    pub fn alloc_request(&mut self) -> Result<usize> {
        let row = self.free_rows.pop().ok_or(BackendError::NoFreeRequestRow {
            rows: self.rows - 1,
        })?;
        self.requests[row] = Some(Request::default());
        Ok(row)
    }

    /// Appends `n` token positions to each listed request, all or nothing:
    /// pages are allocated (page-granular: a partly filled last page is
    /// continued), `req_to_token` rows written, and on a hybrid pool every
    /// new full page gets an SWA page. Returns the new slots, request after
    /// request (the `out_cache_loc` of a batch in that order).
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`], [`BackendError::Batch`] for a
    /// request listed twice, [`BackendError::ContextOverflow`],
    /// [`BackendError::Exhausted`] (full or SWA pages); nothing changes on error.
    pub fn alloc_tokens(&mut self, grow: &[(usize, usize)]) -> Result<Vec<i64>> {
        let p = self.page_size;
        let mut seen = BTreeSet::new();
        let mut needed = 0usize;
        for &(req, n) in grow {
            let r = self.request(req)?;
            if !seen.insert(req) {
                return Err(crate::error::batch_err(
                    "alloc_tokens",
                    format!("request row {req} listed twice"),
                ));
            }
            let len = r.len + n;
            if len > self.width {
                return Err(BackendError::ContextOverflow {
                    req,
                    len,
                    context_len: self.width,
                });
            }
            needed += len.div_ceil(p).saturating_sub(r.pages.len());
        }
        if needed > self.free_pages.len() {
            return Err(BackendError::Exhausted {
                pool: "full",
                needed,
                free: self.free_pages.len(),
            });
        }
        if let Some(m) = &self.swa {
            if needed > m.free_swa_pages() {
                return Err(BackendError::Exhausted {
                    pool: "swa",
                    needed,
                    free: m.free_swa_pages(),
                });
            }
        }
        // Checked: from here nothing fails.
        let mut out = Vec::with_capacity(grow.iter().map(|g| g.1).sum());
        for &(req, n) in grow {
            let mut r = self.requests[req].take().unwrap_or_default();
            let new_len = r.len + n;
            let mut fresh = Vec::new();
            while r.pages.len() < new_len.div_ceil(p) {
                let page = self.free_pages.pop().unwrap_or(0);
                r.pages.push(page);
                fresh.push(page);
            }
            if let Some(m) = &mut self.swa {
                if !fresh.is_empty() {
                    // Cannot fail: pages are fresh, in range, and enough SWA pages are free.
                    m.alloc_pages(&fresh)?;
                }
            }
            for j in r.len..new_len {
                let slot = (r.pages[j / p] * p + j % p) as i32;
                self.req_to_token[req * self.width + j] = slot;
                out.push(i64::from(slot));
            }
            r.len = new_len;
            self.requests[req] = Some(r);
            self.touch_row(req, new_len - n, new_len, !fresh.is_empty());
        }
        Ok(out)
    }

    /// Shrinks request `req` to `new_len` tokens (e.g. rejected draft tokens
    /// after verify): pages no longer needed are freed (full and SWA), the
    /// row past `new_len` is zeroed.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`]; [`BackendError::Batch`] when
    /// `new_len` exceeds the request's length, or when `0 < new_len <
    /// F + W` after [`Pools::evict_swa`] freed the SWA pages below position
    /// `F` with window `W`: the request's next token would attend to
    /// evicted keys (and a partly kept evicted page has no SWA page to take
    /// new tokens), which no later call can restore. Evict with the length
    /// that stays (the committed tokens, not draft tokens).
    pub fn truncate_request(&mut self, req: usize, new_len: usize) -> Result<()> {
        let (len, evicted, window) = {
            let r = self.request(req)?;
            (r.len, r.swa_evicted, r.swa_window)
        };
        if new_len > len {
            return Err(crate::error::batch_err(
                "truncate_request",
                format!("new length {new_len} exceeds the request's {len} tokens"),
            ));
        }
        if new_len > 0 && evicted > 0 && new_len < len && new_len < evicted + window {
            return Err(crate::error::batch_err(
                "truncate_request",
                format!(
                    "new length {new_len}: the SWA pages below position {evicted} were \
                     evicted (window {window}), so the next token would attend to evicted \
                     keys; evict with the length that stays"
                ),
            ));
        }
        let p = self.page_size;
        let mut r = self.requests[req].take().unwrap_or_default();
        let keep = new_len.div_ceil(p);
        let dropped: Vec<usize> = r.pages.drain(keep..).collect();
        self.release_pages(&dropped);
        self.req_to_token[req * self.width + new_len..req * self.width + len].fill(0);
        r.len = new_len;
        r.swa_evicted = r.swa_evicted.min(new_len / p * p);
        self.requests[req] = Some(r);
        self.touch_row(req, new_len, len, !dropped.is_empty());
        Ok(())
    }

    /// Frees request `req`: its pages (full and SWA) and its row, which is
    /// zeroed.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`].
    pub fn free_request(&mut self, req: usize) -> Result<()> {
        self.truncate_request(req, 0)?;
        self.requests[req] = None;
        self.free_rows.push(req);
        Ok(())
    }

    /// Returns to the SWA pool the pages of request `req` that slid out of
    /// every SWA layer's window (SEMANTICS.md §swa-pool.5, chunk-cache policy):
    /// positions below `pre_len − window`, floored to whole pages, where
    /// `pre_len` is the tokens already attended to and `window` the largest
    /// `window_left` of the SWA layers. Returns the SWA pages freed. Without
    /// an SWA pool nothing happens.
    ///
    /// # Errors
    /// [`BackendError::UnknownRequest`]; [`BackendError::Swa`].
    pub fn evict_swa(&mut self, req: usize, pre_len: usize, window: usize) -> Result<usize> {
        let r = self.request(req)?.clone();
        let Some(m) = &mut self.swa else {
            return Ok(0);
        };
        let before = m.free_swa_pages();
        let row = &self.req_to_token[req * self.width..][..r.len];
        let new = m.evict_out_of_window(
            row,
            pre_len.min(r.len),
            window,
            r.swa_evicted,
            EvictionPolicy::ChunkCache,
        )?;
        let freed = m.free_swa_pages() - before;
        if let Some(r) = self.requests[req].as_mut() {
            if new > r.swa_evicted {
                r.swa_window = r.swa_window.max(window);
            }
            r.swa_evicted = new;
        }
        if freed > 0 {
            self.generation += 1;
            self.swa_generation = self.generation;
        }
        Ok(freed)
    }

    fn release_pages(&mut self, pages: &[usize]) {
        let p = self.page_size;
        if let Some(m) = &mut self.swa {
            let slots: Vec<i64> = pages.iter().map(|&pg| (pg * p) as i64).collect();
            // Pages held by a request are in range: cannot fail.
            let _ = m.free_slots(&slots);
        }
        self.free_pages.extend(pages.iter().rev());
    }
}

impl PartialEq for Pools {
    /// Same tables, same free rows and pages (in order), same SWA map and
    /// free SWA page count.
    fn eq(&self, other: &Self) -> bool {
        self.page_size == other.page_size
            && self.width == other.width
            && self.rows == other.rows
            && self.req_to_token == other.req_to_token
            && self.requests == other.requests
            && self.free_rows == other.free_rows
            && self.free_pages == other.free_pages
            && self.num_pages == other.num_pages
            && self.swa.as_ref().map(|m| (m.map(), m.free_swa_pages()))
                == other.swa.as_ref().map(|m| (m.map(), m.free_swa_pages()))
    }
}

#[cfg(test)]
mod tests {
    use super::Pools;
    use rand::{Rng, SeedableRng};

    /// A device mirror kept current with `dirty_spans` + `mark_synced` (as the
    /// CUDA executor does) equals the host table after any sequence of
    /// allocations, truncations and frees; a consumer syncing less often
    /// (an older `since`, not the marked one) stays correct too.
    #[test]
    fn dirty_spans_keep_a_mirror_exact() {
        for seed in 0..40u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut p = Pools::new(4, 64, 6, 80, None).unwrap();
            let n = p.req_to_token().len();
            let (mut mirror, mut synced) = (vec![0i32; n], 0u64);
            let (mut slow, mut slow_synced) = (vec![0i32; n], 0u64);
            let mut live: Vec<usize> = Vec::new();
            for step in 0..300 {
                match rng.gen_range(0..10) {
                    0..=1 if p.free_request_rows() > 0 => live.push(p.alloc_request().unwrap()),
                    2..=5 if !live.is_empty() => {
                        let mut grow: Vec<(usize, usize)> = Vec::new();
                        for &r in &live {
                            if rng.gen_bool(0.6) {
                                grow.push((r, rng.gen_range(1..9)));
                            }
                        }
                        let _ = p.alloc_tokens(&grow); // exhaustion changes nothing
                    }
                    6 if !live.is_empty() => {
                        let r = live[rng.gen_range(0..live.len())];
                        let len = p.request_len(r).unwrap();
                        p.truncate_request(r, rng.gen_range(0..=len)).unwrap();
                    }
                    7 if !live.is_empty() => {
                        let r = live.swap_remove(rng.gen_range(0..live.len()));
                        p.free_request(r).unwrap();
                    }
                    _ => {}
                }
                let apply = |m: &mut Vec<i32>, since: u64| {
                    let w = p.req_to_token_width();
                    for (row, cols) in p.dirty_spans(since) {
                        for c in cols {
                            m[row * w + c] = p.req_to_token()[row * w + c];
                        }
                    }
                };
                if rng.gen_bool(0.5) {
                    apply(&mut mirror, synced);
                    synced = p.generation();
                    p.mark_synced(synced);
                    assert_eq!(mirror, p.req_to_token(), "seed {seed} step {step}");
                }
                if step % 7 == 0 {
                    apply(&mut slow, slow_synced);
                    slow_synced = p.generation();
                    assert_eq!(slow, p.req_to_token(), "slow, seed {seed} step {step}");
                }
            }
        }
    }

    /// A decode-like step (one token per request) after a sync gives one
    /// entry per request, not whole rows.
    #[test]
    fn decode_step_spans_are_one_entry_per_request() {
        let mut p = Pools::new(16, 4096, 8, 2048, None).unwrap();
        let reqs: Vec<usize> = (0..8).map(|_| p.alloc_request().unwrap()).collect();
        let grow: Vec<(usize, usize)> = reqs.iter().map(|&r| (r, 1000)).collect();
        p.alloc_tokens(&grow).unwrap();
        p.mark_synced(p.generation());
        let since = p.generation();
        let one: Vec<(usize, usize)> = reqs.iter().map(|&r| (r, 1)).collect();
        p.alloc_tokens(&one).unwrap();
        let spans = p.dirty_spans(since);
        assert_eq!(spans.len(), 8);
        assert!(spans.iter().all(|(_, c)| *c == (1000..1001)), "{spans:?}");
    }
}
