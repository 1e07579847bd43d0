//! Eager forward metadata (SEMANTICS.md §backend.2–3), built on the host with the
//! page-table and swa-pool CPU references.

use crate::batch::{AttnMode, ForwardBatch, ForwardMode, SpecInfo};
use crate::config::MAX_DECODE_Q_LEN;
use crate::error::{batch_err, Result};
use crate::errors::DeviceErrorReport;
use crate::pools::Pools;

/// Metadata of one forward pass (SEMANTICS.md §backend.2), host copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardMetadata {
    /// The branch the batch takes.
    pub mode: AttnMode,
    /// The batch's forward mode.
    pub forward_mode: ForwardMode,
    /// `bs`.
    pub batch_size: usize,
    /// `[bs]` i32 KV lengths attended over (`seq_lens + offset`).
    pub cache_seqlens: Vec<i32>,
    /// Upper bound on query rows per request (host int, default 1).
    pub max_seq_len_q: usize,
    /// `[bs + 1]` i32 query-row prefix sums. For a plain prefill (no
    /// request has a prefix) it equals `cu_seqlens_k` (upstream: the same tensor).
    pub cu_seqlens_q: Vec<i32>,
    /// `[bs + 1]` i32 prefix sums of `cache_seqlens`.
    pub cu_seqlens_k: Vec<i32>,
    /// `M`: page-table width.
    pub max_num_pages: usize,
    /// `[bs, M]` i32 page table (row stride `M`); entries past each row's
    /// live prefix are unspecified (0 on the CPU executor). Empty when
    /// `tables_on_host` is false.
    pub page_table: Vec<i32>,
    /// `[bs, M]` i32 SWA page table, with an SWA pool (empty when
    /// `tables_on_host` is false).
    pub swa_page_table: Option<Vec<i32>>,
    /// Whether the host built the page tables. The CUDA executor builds
    /// them (and the SWA slots) on the device, so its host metadata holds
    /// the lengths, offsets and mode only; [`crate::MhaBackend::reference_metadata`]
    /// builds the full host metadata on demand.
    pub tables_on_host: bool,
    /// `[num_tokens]` i64 SWA write slots (`translate(out_cache_loc)`), with
    /// an SWA pool.
    pub swa_out_cache_loc: Option<Vec<i64>>,
    /// TARGET_VERIFY with a ragged layout.
    pub is_ragged_verify: bool,
    /// Query rows of the pass, `cu_seqlens_q[bs]`.
    pub num_tokens: usize,
    /// Device-error events of the page-table build (`page_table`) and the
    /// SWA translation (`swa_pool`), clean normally.
    pub errors: DeviceErrorReport,
    /// The `out_cache_loc` that `swa_out_cache_loc` translates.
    pub(crate) source_out_cache_loc: Vec<i64>,
    pub(crate) req_pool_indices: Vec<i64>,
    pub(crate) seq_lens: Vec<i64>,
    /// Identity of this build (device executors prepare each build once).
    pub(crate) id: MetaId,
}

/// A unique id per metadata build; equal to every other id under `==`, so
/// two builds of the same batch compare equal.
#[derive(Debug, Clone, Copy, Eq)]
pub(crate) struct MetaId(pub(crate) u64);

impl PartialEq for MetaId {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl MetaId {
    fn next() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl ForwardMetadata {
    /// Live prefix of page-table row `row` (`ceil(cache_seqlens[row] / P)`
    /// entries, clamped to `M`).
    /// Empty when the tables were not built on the host.
    pub fn page_row(&self, row: usize, page_size: usize) -> &[i32] {
        if !self.tables_on_host {
            return &[];
        }
        let n = self.live_pages(row, page_size);
        &self.page_table[row * self.max_num_pages..][..n]
    }

    /// Live prefix of SWA page-table row `row`, with an SWA pool.
    pub fn swa_page_row(&self, row: usize, page_size: usize) -> Option<&[i32]> {
        if !self.tables_on_host {
            return self.swa_page_table.as_ref().map(|_| &[][..]);
        }
        let n = self.live_pages(row, page_size);
        self.swa_page_table
            .as_ref()
            .map(|t| &t[row * self.max_num_pages..][..n])
    }

    fn live_pages(&self, row: usize, page_size: usize) -> usize {
        (self.cache_seqlens[row].max(0) as usize)
            .div_ceil(page_size)
            .min(self.max_num_pages)
    }

    /// Whether `batch` is the batch this metadata was built for (mode, rows,
    /// request rows and lengths).
    pub fn matches(&self, batch: &ForwardBatch) -> bool {
        self.forward_mode == batch.forward_mode
            && self.batch_size == batch.batch_size
            && self.req_pool_indices == batch.req_pool_indices
            && self.seq_lens == batch.seq_lens
    }
}

fn cumsum(lens: impl IntoIterator<Item = i64>, field: &'static str) -> Result<Vec<i32>> {
    let mut out = vec![0i32];
    let mut run = 0i64;
    for l in lens {
        run += l;
        out.push(
            i32::try_from(run)
                .map_err(|_| batch_err(field, format!("prefix sum {run} does not fit in i32")))?,
        );
    }
    Ok(out)
}

/// Resolves the branch of `batch` (README order) for a backend of step id `step_id`.
pub(crate) fn resolve_mode(batch: &ForwardBatch, step_id: u32) -> Result<AttnMode> {
    let bs = batch.batch_size;
    let mode = batch.forward_mode;
    if mode.is_decode_or_idle() {
        return Ok(match &batch.spec_info {
            None => AttnMode::Decode,
            Some(SpecInfo::Draft { step }) => AttnMode::DraftDecode {
                step: step.unwrap_or(step_id),
            },
            Some(SpecInfo::Verify { .. }) => {
                return Err(batch_err(
                    "spec_info",
                    "a DECODE/IDLE batch carries verify spec_info",
                ))
            }
        });
    }
    if mode == ForwardMode::TargetVerify {
        if batch.verify_lens().is_some() {
            return Ok(AttnMode::RaggedVerify);
        }
        let tokens = batch.out_cache_loc.len();
        if bs == 0 {
            return Ok(AttnMode::TargetVerify { q_len: 0 });
        }
        if tokens == 0 || tokens % bs != 0 {
            return Err(batch_err(
                "out_cache_loc",
                format!("uniform target verify: {tokens} tokens are not a positive multiple of bs = {bs}"),
            ));
        }
        return Ok(AttnMode::TargetVerify { q_len: tokens / bs });
    }
    if mode == ForwardMode::DraftExtendV2 {
        let e = batch
            .extend_seq_lens
            .as_deref()
            .ok_or_else(|| batch_err("extend_seq_lens", "DRAFT_EXTEND_V2 needs extend_seq_lens"))?;
        let q = e.first().copied().unwrap_or(0);
        if e.iter().any(|&x| x != q) || (bs > 0 && q < 1) {
            return Err(batch_err(
                "extend_seq_lens",
                "DRAFT_EXTEND_V2 needs the same extend length (≥ 1) for every request (SEMANTICS.md §backend.3)",
            ));
        }
        return Ok(AttnMode::DraftExtendV2 { q_len: q as usize });
    }
    Ok(AttnMode::Extend)
}

/// The host tables a metadata build reads: `req_to_token` `[rows, width]`
/// (row stride `stride`), `P`, the full→SWA map and the pool's slot count
/// (page-table's D9 check; `None` = unchecked).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tables<'a> {
    pub req_to_token: &'a [i32],
    pub rows: usize,
    pub width: usize,
    pub stride: usize,
    pub page_size: usize,
    pub full_to_swa: Option<&'a [i64]>,
    pub pool_slots: Option<usize>,
}

impl<'a> Tables<'a> {
    /// The tables of the backend's own pools.
    pub(crate) fn of(pools: &'a Pools) -> Self {
        Self {
            req_to_token: pools.req_to_token(),
            rows: pools.req_to_token_rows(),
            width: pools.req_to_token_width(),
            stride: pools.req_to_token_width(),
            page_size: pools.page_size(),
            full_to_swa: pools.swa_mapping().map(|s| s.map()),
            pool_slots: Some(pools.full_slots()),
        }
    }
}

/// Builds the eager metadata of `batch` (SEMANTICS.md §backend.3) against
/// `pools`; the page tables and SWA slots only when `host_tables`.
pub(crate) fn build(
    batch: &ForwardBatch,
    pools: &Pools,
    max_num_pages: usize,
    step_id: u32,
    host_tables: bool,
) -> Result<ForwardMetadata> {
    build_on(
        batch,
        &Tables::of(pools),
        max_num_pages,
        step_id,
        host_tables,
    )
}

/// Builds the eager metadata of `batch` (SEMANTICS.md §backend.3) against
/// `tables`. The batch is validated either way; without `host_tables` the
/// page tables stay empty (an executor that builds them on the device
/// counts their events there), and the SWA slots are still translated but
/// their events not counted (the device translation counts them).
pub(crate) fn build_on(
    batch: &ForwardBatch,
    pools: &Tables<'_>,
    max_num_pages: usize,
    step_id: u32,
    host_tables: bool,
) -> Result<ForwardMetadata> {
    batch.check_lengths()?;
    let bs = batch.batch_size;
    let mode = resolve_mode(batch, step_id)?;
    let rows = pools.rows as i64;
    for (i, &r) in batch.req_pool_indices.iter().enumerate() {
        if !(0..rows).contains(&r) {
            return Err(batch_err(
                "req_pool_indices",
                format!("row {i}: request row {r} outside [0, {rows})"),
            ));
        }
    }
    for (i, &s) in batch.seq_lens.iter().enumerate() {
        if s < 0 || s > i64::from(i32::MAX) {
            return Err(batch_err(
                "seq_lens",
                format!("row {i}: {s} outside [0, i32::MAX]"),
            ));
        }
    }
    let seq = &batch.seq_lens;
    let (cache, cu_q, max_q): (Vec<i64>, Vec<i32>, usize) = match mode {
        AttnMode::Decode | AttnMode::DraftDecode { .. } => {
            let off = match mode {
                AttnMode::DraftDecode { step } => i64::from(step) + 1,
                _ => 0,
            };
            (
                seq.iter().map(|&s| s + off).collect(),
                (0..=bs as i32).collect(),
                1,
            )
        }
        AttnMode::TargetVerify { q_len } => {
            check_q_len(q_len)?;
            (
                seq.iter().map(|&s| s + q_len as i64).collect(),
                (0..=bs).map(|i| (i * q_len) as i32).collect(),
                q_len,
            )
        }
        AttnMode::RaggedVerify => {
            let v = batch.verify_lens().unwrap_or(&[]);
            if v.len() != bs {
                return Err(batch_err(
                    "spec_info.verify_lens",
                    format!("has {} entries, batch_size = {bs}", v.len()),
                ));
            }
            if v.iter().any(|&l| l < 0) {
                return Err(batch_err("spec_info.verify_lens", "lengths must be ≥ 0"));
            }
            let max = v.iter().copied().max().unwrap_or(1).max(1) as usize;
            check_q_len(max)?;
            (
                seq.iter().zip(v).map(|(&s, &l)| s + i64::from(l)).collect(),
                cumsum(v.iter().map(|&l| i64::from(l)), "spec_info.verify_lens")?,
                max,
            )
        }
        AttnMode::DraftExtendV2 { q_len } => {
            check_q_len(q_len)?;
            (
                seq.clone(),
                (0..=bs).map(|i| (i * q_len) as i32).collect(),
                q_len.max(1),
            )
        }
        AttnMode::Extend => {
            let e = batch.extend_seq_lens.as_deref().ok_or_else(|| {
                batch_err("extend_seq_lens", "extend-like modes need extend_seq_lens")
            })?;
            for (i, (&el, &s)) in e.iter().zip(seq).enumerate() {
                if el < 0 || i64::from(el) > s {
                    return Err(batch_err(
                        "extend_seq_lens",
                        format!("row {i}: extend length {el} outside [0, seq_len = {s}]"),
                    ));
                }
                if let Some(p) = &batch.extend_prefix_lens {
                    if i64::from(p[i]) + i64::from(el) != s {
                        return Err(batch_err(
                            "extend_prefix_lens",
                            format!("row {i}: prefix {} + extend {el} ≠ seq_len {s}", p[i]),
                        ));
                    }
                }
            }
            (
                seq.clone(),
                cumsum(e.iter().map(|&l| i64::from(l)), "extend_seq_lens")?,
                e.iter().copied().max().unwrap_or(1).max(0) as usize,
            )
        }
    };
    let mut cache_seqlens = Vec::with_capacity(bs);
    for (i, &c) in cache.iter().enumerate() {
        cache_seqlens.push(i32::try_from(c).map_err(|_| {
            batch_err("seq_lens", format!("row {i}: cache length {c} exceeds i32"))
        })?);
    }
    let cu_k = cumsum(cache.iter().copied(), "seq_lens")?;
    let num_tokens = *cu_q.last().unwrap_or(&0) as usize;
    if batch.out_cache_loc.len() != num_tokens {
        return Err(batch_err(
            "out_cache_loc",
            format!(
                "has {} slots, the pass has {num_tokens} query rows (one new K/V per row)",
                batch.out_cache_loc.len()
            ),
        ));
    }
    let context = pools.width;
    for (i, &c) in cache_seqlens.iter().enumerate() {
        if c as usize > context {
            return Err(batch_err(
                "seq_lens",
                format!("row {i}: attention length {c} exceeds context_len = {context}"),
            ));
        }
    }

    // Page tables: the eager builder (page-table reference) over the live map.
    let m = max_num_pages;
    let map = pools.full_to_swa;
    let cells = if host_tables { bs * m } else { 0 };
    let mut page_table = vec![0i32; cells];
    let mut swa_page_table = map.map(|_| vec![0i32; cells]);
    let input = page_table::reference::HostInputs {
        req_to_token: pools.req_to_token,
        req_to_token_rows: pools.rows,
        req_to_token_width: pools.width,
        req_to_token_stride: pools.stride,
        req_pool_indices: &batch.req_pool_indices,
        cache_seqlens: &cache_seqlens,
        page_size: pools.page_size,
        max_num_pages: m,
        full_to_swa: map,
        pool_slots: pools.pool_slots,
    };
    let mut errors = DeviceErrorReport::default();
    if host_tables {
        errors.page_table = page_table::reference::build_page_table(
            &input,
            &mut page_table,
            m,
            swa_page_table.as_mut().map(|t| (t.as_mut_slice(), m)),
        );
    }
    // SWA write locations (swa-pool reference translation).
    let swa_out_cache_loc = map.map(|map| {
        let mut out = vec![0i64; batch.out_cache_loc.len()];
        let e = swa_pool::reference::translate_locs(map, &batch.out_cache_loc, &mut out);
        if host_tables {
            errors.swa_pool.merge(e);
        }
        out
    });
    Ok(ForwardMetadata {
        mode,
        forward_mode: batch.forward_mode,
        batch_size: bs,
        cache_seqlens,
        max_seq_len_q: max_q,
        cu_seqlens_q: cu_q,
        cu_seqlens_k: cu_k,
        max_num_pages: m,
        page_table,
        swa_page_table,
        tables_on_host: host_tables,
        swa_out_cache_loc,
        is_ragged_verify: mode == AttnMode::RaggedVerify,
        num_tokens,
        errors,
        source_out_cache_loc: batch.out_cache_loc.clone(),
        req_pool_indices: batch.req_pool_indices.clone(),
        seq_lens: batch.seq_lens.clone(),
        id: MetaId::next(),
    })
}

fn check_q_len(q: usize) -> Result<()> {
    if q > MAX_DECODE_Q_LEN {
        return Err(batch_err(
            "spec_info",
            format!("{q} query rows per request exceed the decode kernel's {MAX_DECODE_Q_LEN}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without host tables the build is the same metadata minus the page
    /// tables (empty, `page_row` empty) and minus the tables' and SWA
    /// translation's event counts; the SWA slots are still there.
    #[test]
    fn device_table_builds_keep_everything_but_the_tables() {
        let p = 4;
        let mut pools = Pools::new(p, 64, 4, 40, Some(40)).unwrap();
        let rows: Vec<usize> = (0..3).map(|_| pools.alloc_request().unwrap()).collect();
        let lens = [5usize, 12, 1];
        let grow: Vec<(usize, usize)> = rows.iter().zip(lens).map(|(&r, l)| (r, l)).collect();
        let all = pools.alloc_tokens(&grow).unwrap();
        // One decode row per request: its last slot.
        let mut loc = Vec::new();
        let mut at = 0;
        for l in lens {
            at += l;
            loc.push(all[at - 1]);
        }
        let batch = ForwardBatch::decode(
            rows.iter().map(|&r| r as i64).collect(),
            lens.iter().map(|&l| l as i64).collect(),
            loc,
        );
        let m = 64 / p;
        let full = build(&batch, &pools, m, 0, true).unwrap();
        let lean = build(&batch, &pools, m, 0, false).unwrap();
        assert!(full.tables_on_host && !lean.tables_on_host);
        assert_eq!(full.page_table.len(), 3 * m);
        assert!(lean.page_table.is_empty());
        assert_eq!(lean.swa_page_table.as_deref(), Some(&[][..]));
        for (r, len) in lens.iter().enumerate() {
            assert_eq!(full.page_row(r, p).len(), len.div_ceil(p));
            assert!(lean.page_row(r, p).is_empty());
            assert_eq!(lean.swa_page_row(r, p), Some(&[][..]));
        }
        assert_eq!(lean.swa_out_cache_loc, full.swa_out_cache_loc);
        assert!(lean.swa_out_cache_loc.is_some());
        assert_eq!(full.cache_seqlens, lean.cache_seqlens);
        assert_eq!(full.cu_seqlens_q, lean.cu_seqlens_q);
        assert_eq!(full.cu_seqlens_k, lean.cu_seqlens_k);
        assert_eq!(
            (
                full.mode,
                full.batch_size,
                full.num_tokens,
                full.max_seq_len_q
            ),
            (
                lean.mode,
                lean.batch_size,
                lean.num_tokens,
                lean.max_seq_len_q
            )
        );
        assert!(lean.errors.is_clean());
        // A bad request row is still a typed error without host tables.
        let mut bad = batch.clone();
        bad.req_pool_indices[1] = 99;
        assert!(build(&bad, &pools, m, 0, false).is_err());
    }
}
