//! The independent accuracy check. A sampled (attention call, request) pair
//! is recomputed from scratch: the request's K/V regenerated from the seed
//! for every visible position (quantized to e4m3 here for an FP8 cache),
//! laid out contiguously, and attention evaluated in f64 by `attend` (the
//! plain formula, pinned to paged-attention's reference by a test) — no
//! pool, page table, metadata or KV-write path of the backend is involved. Per pair, up to [`ROWS_PER_CHECK`]
//! query rows (first, last and two sampled) and one sampled KV-head group
//! (its `G = Hq / Hkv` query heads) are compared, so checks stay cheap on
//! the host.
//!
//! Tolerances (SEMANTICS.md §attention.10): bf16/f16 KV `atol = rtol = 1e-2`; FP8 KV
//! `atol 7e-2, rtol 4e-2`; doubled for multi-row (verify / extend)
//! requests. An element is a mismatch when `|got − ref| > atol + rtol·|ref|`
//! or `got` is not finite.

use fp8_kv::codec::{e4m3_decode, quantize};
use mha_backend::{KvCacheDtype, LayerConfig};
use paged_attention::HalfDtype;

use crate::gen::{hash_words, Act, Generator, ModelId};
use crate::pass::Pass;

/// Query rows compared per checked pair, at most.
pub const ROWS_PER_CHECK: usize = 4;

/// `(atol, rtol)` for a KV dtype and whether the request has several query rows.
pub fn tolerance(kv: KvCacheDtype, multi_row: bool) -> (f64, f64) {
    let (a, r) = match kv {
        KvCacheDtype::Fp8E4m3 => (7e-2, 4e-2),
        _ => (1e-2, 1e-2),
    };
    if multi_row {
        (2.0 * a, 2.0 * r)
    } else {
        (a, r)
    }
}

/// Check totals (JSON `check`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CheckStats {
    /// (attention call, request) pairs checked.
    pub pairs: u64,
    /// Query rows compared.
    pub rows: u64,
    /// Elements compared.
    pub elements: u64,
    /// Largest `|got − ref|`.
    pub max_abs_err: f64,
    /// Largest `|got − ref| / (atol + rtol·|ref|)` (≤ 1 passes).
    pub max_tolerance_ratio: f64,
    /// Pairs with at least one mismatching element.
    pub mismatched_pairs: u64,
    /// Mismatching elements.
    pub mismatched_elements: u64,
    /// The first mismatch, described.
    pub first_mismatch: Option<String>,
    /// FNV-1a (64-bit, hex) of every sampled output row, in pass order,
    /// each keyed by its pass number, layer and part: two runs of the same
    /// flags have equal hashes exactly when their sampled outputs are
    /// bit-identical (the before / after check of a refactor; a check
    /// fraction of 1 samples every row).
    pub output_hash: String,
}

/// The checker: the model layers and cache dtype, and the totals.
#[derive(Debug, Clone)]
pub struct Checker {
    gen: Generator,
    seed: u64,
    kv_dtype: KvCacheDtype,
    target: Vec<LayerConfig>,
    draft: Vec<LayerConfig>,
    /// Totals so far.
    pub stats: CheckStats,
}

impl Checker {
    /// A checker for the target (and draft) layers.
    pub fn new(
        gen: Generator,
        seed: u64,
        kv_dtype: KvCacheDtype,
        target: Vec<LayerConfig>,
        draft: Vec<LayerConfig>,
    ) -> Self {
        Self {
            gen,
            seed,
            kv_dtype,
            target,
            draft,
            stats: CheckStats::default(),
        }
    }

    /// Checks the rows `got` (`[n, Hq·D]` bf16 bits) of `pass.parts[part]`
    /// in `layer`.
    pub fn check(&mut self, pass: &Pass, layer: usize, part: usize, got: &[u16]) {
        let l = match pass.model {
            ModelId::Target => &self.target[layer],
            ModelId::Draft => &self.draft[layer],
        };
        let l = l.clone();
        let p = pass.parts[part];
        let (hq, hkv, d) = (l.num_q_heads, l.num_kv_heads, l.head_dim);
        let group = hq / hkv;
        let h = hash_words(self.seed, &[0xC4, pass.salt, layer as u64, part as u64]);
        let kvh = (h % hkv as u64) as usize;
        let mut rows: Vec<usize> = if p.n <= ROWS_PER_CHECK {
            (0..p.n).collect()
        } else {
            vec![
                0,
                p.n - 1,
                (h >> 16) as usize % p.n,
                (h >> 40) as usize % p.n,
            ]
        };
        rows.sort_unstable();
        rows.dedup();
        if rows.is_empty() {
            self.stats.pairs += 1;
            return;
        }
        let (atol, rtol) = tolerance(self.kv_dtype, p.n > 1);
        let sm = l.resolved_sm_scale();
        let (ks, vs) = match self.kv_dtype {
            KvCacheDtype::Fp8E4m3 => (
                fp8_kv::resolve_scale(l.k_scale),
                fp8_kv::resolve_scale(l.v_scale),
            ),
            _ => (1.0, 1.0),
        };
        let bmm1 = 1.0f32 * ks * sm;
        let sinks: Option<Vec<f32>> = l
            .sinks
            .as_ref()
            .map(|s| s[kvh * group..(kvh + 1) * group].to_vec());
        // K/V of KV head kvh for every position any checked row sees,
        // regenerated once per pair: contiguous [x_max + 1 − pos_lo, D],
        // row t holding position pos_lo + t.
        let first_x = p.kv_len - p.n + rows[0];
        let x_max = p.kv_len - p.n + rows[rows.len() - 1];
        // First key position row x sees (SEMANTICS.md §attention.2: keys [x − W, x]).
        let lo_of = |x: usize| match l.window_left {
            Some(w) => x.saturating_sub(w as usize),
            None => 0,
        };
        let pos_lo = lo_of(first_x);
        let span = x_max + 1 - pos_lo;
        let mut kb = vec![0u16; span * d];
        let mut vb = vec![0u16; span * d];
        let k_off = self.gen.k_offsets(pass.model, layer, kvh, d);
        for pos in pos_lo..=x_max {
            let t = pos - pos_lo;
            let (k_row, v_row) = (&mut kb[t * d..][..d], &mut vb[t * d..][..d]);
            let g = &self.gen;
            g.fill_head(Act::K, pass.model, layer, p.req, pos, 0, kvh, &k_off, k_row);
            g.fill_head(Act::V, pass.model, layer, p.req, pos, 0, kvh, &[], v_row);
        }
        // K/V as the cache holds them (e4m3 codes decoded exactly; their
        // scales are in bmm1 / bmm2), in f64.
        let to_f64 = |b: &[u16], s: f32| -> Vec<f64> {
            match self.kv_dtype {
                KvCacheDtype::Fp8E4m3 => b
                    .iter()
                    .map(|&x| {
                        f64::from(e4m3_decode(quantize(
                            half::bf16::from_bits(x).to_f32(),
                            1.0 / s,
                        )))
                    })
                    .collect(),
                KvCacheDtype::F16 => b.iter().map(|&x| HalfDtype::F16.to_f64(x)).collect(),
                _ => b.iter().map(|&x| HalfDtype::Bf16.to_f64(x)).collect(),
            }
        };
        let (kf, vf) = (to_f64(&kb, ks), to_f64(&vb, vs));
        let mut mismatch = false;
        for j in rows {
            let x = p.kv_len - p.n + j;
            let mut q = vec![0u16; group * d];
            for (qi, row) in q.chunks_mut(d).enumerate() {
                let head = kvh * group + qi;
                let g = &self.gen;
                g.fill_head(
                    Act::Q,
                    pass.model,
                    layer,
                    p.req,
                    x,
                    pass.salt,
                    head,
                    &[],
                    row,
                );
            }
            let qf: Vec<f64> = q.iter().map(|&b| HalfDtype::Bf16.to_f64(b)).collect();
            let mut want_row = vec![0.0f64; group * d];
            attend(
                &qf,
                &kf,
                &vf,
                d,
                lo_of(x) - pos_lo..x + 1 - pos_lo,
                f64::from(bmm1),
                f64::from(vs),
                sinks.as_deref(),
                &mut want_row,
            );
            let got_row = &got[j * hq * d..][..hq * d];
            for (i, &want) in want_row.iter().enumerate() {
                let g = HalfDtype::Bf16.to_f64(got_row[kvh * group * d + i]);
                let err = (g - want).abs();
                let bound = atol + rtol * want.abs();
                self.stats.elements += 1;
                if err.is_finite() {
                    self.stats.max_abs_err = self.stats.max_abs_err.max(err);
                    self.stats.max_tolerance_ratio =
                        self.stats.max_tolerance_ratio.max(err / bound);
                }
                if err.is_nan() || err > bound {
                    mismatch = true;
                    self.stats.mismatched_elements += 1;
                    if self.stats.first_mismatch.is_none() {
                        self.stats.first_mismatch = Some(format!(
                            "{} pass {} layer {layer} request {} row at position {x} head {}: got {g}, expected {want}",
                            pass.kind.name(),
                            pass.salt,
                            p.req,
                            kvh * group + i / d
                        ));
                    }
                }
            }
            self.stats.rows += 1;
        }
        self.stats.pairs += 1;
        if mismatch {
            self.stats.mismatched_pairs += 1;
        }
    }
}

/// Attention of one query row in f64 (SEMANTICS.md §attention.2–4, the plain
/// formula): for each of the `group` heads in `q` (`[group, d]`),
/// `out_h = bmm2 · Σ_t w_t v_t / (Σ_t w_t + e^(sink_h − m))` with
/// `w_t = e^(bmm1 · q_h·k_t − m)` over key positions `keys` of `k`, `v`
/// (`[len, d]` rows) and `m` the largest logit (sink included). `out`:
/// `[group, d]`. Same definition as paged-attention's reference
/// (`reference::attention`), specialised to one contiguous KV head so the
/// checker stays cheap; a test pins the two together.
#[allow(clippy::too_many_arguments)]
fn attend(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d: usize,
    keys: std::ops::Range<usize>,
    bmm1: f64,
    bmm2: f64,
    sinks: Option<&[f32]>,
    out: &mut [f64],
) {
    let n = keys.len();
    let mut logits = vec![0.0f64; n];
    for (h, (qh, oh)) in q.chunks(d).zip(out.chunks_mut(d)).enumerate() {
        for (lg, t) in logits.iter_mut().zip(keys.clone()) {
            let kt = &k[t * d..][..d];
            *lg = bmm1 * qh.iter().zip(kt).map(|(a, b)| a * b).sum::<f64>();
        }
        let sink = sinks.map(|s| f64::from(s[h]));
        let m = logits
            .iter()
            .copied()
            .chain(sink)
            .fold(f64::NEG_INFINITY, f64::max);
        oh.fill(0.0);
        let mut den = sink.map_or(0.0, |s| (s - m).exp());
        for (lg, t) in logits.iter().zip(keys.clone()) {
            let w = (lg - m).exp();
            den += w;
            for (o, vv) in oh.iter_mut().zip(&v[t * d..][..d]) {
                *o += w * vv;
            }
        }
        for o in oh.iter_mut() {
            *o = if n == 0 { 0.0 } else { bmm2 * *o / den };
        }
    }
}

/// One sampled pair for a pool worker.
struct CheckJob {
    seq: u64,
    pass: std::sync::Arc<Pass>,
    layer: usize,
    part: usize,
    rows: Vec<u16>,
}

/// What a worker hands back: its totals, the sequence number of its first
/// mismatch, and its busy seconds.
type WorkerOut = (CheckStats, Option<u64>, f64);

/// Runs [`Checker::check`] on host worker threads so that checking does not
/// serialize the replay: the replay submits sampled rows (a bounded queue —
/// it waits only when the workers are far behind) and collects the merged
/// totals at the end. Totals are independent of scheduling: counts add,
/// maxima are maxima, and the reported first mismatch is the one of the
/// earliest submitted pair. With 0 workers checks run inline.
pub struct CheckPool {
    inline: Option<Checker>,
    inline_first: Option<u64>,
    inline_s: f64,
    tx: Option<std::sync::mpsc::SyncSender<CheckJob>>,
    workers: Vec<std::thread::JoinHandle<WorkerOut>>,
    base: CheckStats,
    seq: u64,
}

impl std::fmt::Debug for CheckPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckPool")
            .field("workers", &self.workers.len())
            .field("submitted", &self.seq)
            .finish_non_exhaustive()
    }
}

/// Worker threads a pool uses by default: the host's cores minus one (the
/// replay's own thread), 1 to 32.
pub fn default_check_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .clamp(1, 32)
}

fn check_one(c: &mut Checker, first: &mut Option<u64>, busy: &mut f64, job: &CheckJob) {
    let t = std::time::Instant::now();
    let had = c.stats.first_mismatch.is_some();
    c.check(&job.pass, job.layer, job.part, &job.rows);
    if !had && c.stats.first_mismatch.is_some() {
        *first = Some(job.seq);
    }
    *busy += t.elapsed().as_secs_f64();
}

impl CheckPool {
    /// A pool of `workers` threads, each with a copy of `checker` (whose
    /// totals so far are kept and merged at the end).
    pub fn new(checker: Checker, workers: usize) -> Self {
        let base = checker.stats.clone();
        let mut fresh = checker;
        fresh.stats = CheckStats::default();
        if workers == 0 {
            return Self {
                inline: Some(fresh),
                inline_first: None,
                inline_s: 0.0,
                tx: None,
                workers: Vec::new(),
                base,
                seq: 0,
            };
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<CheckJob>(16 * workers);
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let handles = (0..workers)
            .map(|_| {
                let rx = std::sync::Arc::clone(&rx);
                let mut c = fresh.clone();
                std::thread::spawn(move || {
                    let (mut first, mut busy) = (None, 0.0);
                    loop {
                        let job = {
                            let guard = rx.lock().unwrap_or_else(|e| e.into_inner());
                            guard.recv()
                        };
                        match job {
                            Ok(job) => check_one(&mut c, &mut first, &mut busy, &job),
                            Err(_) => break,
                        }
                    }
                    (c.stats, first, busy)
                })
            })
            .collect();
        Self {
            inline: None,
            inline_first: None,
            inline_s: 0.0,
            tx: Some(tx),
            workers: handles,
            base,
            seq: 0,
        }
    }

    /// Queues the rows `rows` of `pass.parts[part]` in `layer` for checking.
    ///
    /// # Errors
    /// [`crate::ReplayError::Internal`] when the workers are gone (one panicked).
    pub fn submit(
        &mut self,
        pass: &std::sync::Arc<Pass>,
        layer: usize,
        part: usize,
        rows: Vec<u16>,
    ) -> crate::Result<()> {
        let job = CheckJob {
            seq: self.seq,
            pass: std::sync::Arc::clone(pass),
            layer,
            part,
            rows,
        };
        self.seq += 1;
        if let Some(c) = &mut self.inline {
            check_one(c, &mut self.inline_first, &mut self.inline_s, &job);
            return Ok(());
        }
        match &self.tx {
            Some(tx) => tx.send(job).map_err(|_| {
                crate::ReplayError::Internal("the check workers stopped (a worker panicked)".into())
            }),
            None => Err(crate::ReplayError::Internal(
                "check pool already finished".into(),
            )),
        }
    }

    /// Waits for every queued check and returns the merged totals and the
    /// workers' summed busy seconds.
    ///
    /// # Errors
    /// [`crate::ReplayError::Internal`] when a worker panicked.
    pub fn finish(mut self) -> crate::Result<(CheckStats, f64)> {
        drop(self.tx.take());
        let mut outs: Vec<WorkerOut> = Vec::new();
        if let Some(c) = self.inline.take() {
            outs.push((c.stats, self.inline_first, self.inline_s));
        }
        for h in self.workers.drain(..) {
            outs.push(
                h.join()
                    .map_err(|_| crate::ReplayError::Internal("a check worker panicked".into()))?,
            );
        }
        let mut total = self.base.clone();
        let mut first: Option<(u64, String)> = None;
        let mut busy = 0.0;
        for (s, f, b) in outs {
            total.pairs += s.pairs;
            total.rows += s.rows;
            total.elements += s.elements;
            total.max_abs_err = total.max_abs_err.max(s.max_abs_err);
            total.max_tolerance_ratio = total.max_tolerance_ratio.max(s.max_tolerance_ratio);
            total.mismatched_pairs += s.mismatched_pairs;
            total.mismatched_elements += s.mismatched_elements;
            if let (Some(seq), Some(m)) = (f, s.first_mismatch) {
                if first.as_ref().is_none_or(|(q, _)| seq < *q) {
                    first = Some((seq, m));
                }
            }
            busy += b;
        }
        if total.first_mismatch.is_none() {
            total.first_mismatch = first.map(|f| f.1);
        }
        Ok((total, busy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{CpuEngine, Engine};
    use crate::pass::{Part, PassKind};
    use mha_backend::{BackendConfig, Device, ForwardBatch, MhaBackend};

    /// `attend` is paged-attention's reference definition (one request, one
    /// KV head, contiguous K/V): equal to 1e-12 with a window and sinks.
    #[test]
    fn attend_matches_the_reference() {
        use paged_attention::reference::{attention, HostInputs, HostKv, HostLayout, KvData};
        let (group, d, len) = (4usize, 64usize, 37usize);
        let g = Generator::new(3);
        let bits = |act: Act, n: usize, salt: u64| -> Vec<u16> {
            (0..n)
                .map(|i| {
                    let x = g.element(act, ModelId::Target, 0, 1, i / d, salt, 0, i % d);
                    half::bf16::from_f32(x).to_bits()
                })
                .collect()
        };
        let (kb, vb, qb) = (
            bits(Act::K, len * d, 0),
            bits(Act::V, len * d, 0),
            bits(Act::Q, group * d, 7),
        );
        let f = |b: &[u16]| -> Vec<f64> { b.iter().map(|&x| HalfDtype::Bf16.to_f64(x)).collect() };
        let sinks = [0.3f32, -1.0, 2.0, 0.0];
        for (window, sink) in [
            (None, None),
            (Some(5u32), Some(&sinks[..])),
            (Some(100), None),
        ] {
            let x = len - 1;
            let lo = window.map_or(0, |w| x.saturating_sub(w as usize));
            let mut got = vec![0.0; group * d];
            attend(
                &f(&qb),
                &f(&kb),
                &f(&vb),
                d,
                lo..x + 1,
                0.125,
                0.5,
                sink,
                &mut got,
            );
            let shape = [1, 1, len, d];
            let strides = [len * d, len * d, d, 1];
            let r = attention(&HostInputs {
                q: &qb,
                q_dtype: HalfDtype::Bf16,
                q_shape: [1, group, d],
                q_strides: [group * d, d, 1],
                k: HostKv {
                    data: KvData::Bf16(&kb),
                    shape,
                    strides,
                },
                v: HostKv {
                    data: KvData::Bf16(&vb),
                    shape,
                    strides,
                },
                page_table: &[0],
                max_num_pages: 1,
                page_table_stride: 1,
                cache_seqlens: &[len as i32],
                layout: HostLayout::Uniform { q_len_per_req: 1 },
                bmm1_scale: 0.125,
                bmm2_scale: 0.5,
                window_left: window,
                sinks: sink,
            });
            for (a, b) in got.iter().zip(&r.out) {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                    "{window:?}: {a} vs {b}"
                );
            }
        }
    }

    /// The check passes on the backend's rows and catches a one-ulp-scale
    /// corruption far beyond tolerance, a wrong position, and NaN.
    #[test]
    fn detects_corruption() {
        let layer = LayerConfig::new(4, 2, 64)
            .with_window(5)
            .with_sinks(vec![0.5; 4]);
        let cfg = BackendConfig::dense(1, layer.clone(), 4, 64, 32, 4);
        let mut b = MhaBackend::new(cfg, Device::Cpu).unwrap();
        let r = b.alloc_request().unwrap();
        let locs = b.alloc_tokens(&[(r, 13)]).unwrap();
        let pass = Pass {
            kind: PassKind::Extend,
            model: ModelId::Target,
            batch: ForwardBatch::extend(vec![r as i64], vec![0], vec![13], locs, false),
            parts: vec![Part {
                req: 9,
                row_start: 0,
                n: 13,
                kv_len: 13,
            }],
            salt: 1,
        };
        let g = Generator::new(5);
        let mut e = CpuEngine::new(g);
        let out = e
            .run_pass(
                &mut b,
                &pass,
                &[mha_backend::HeadShard::whole(layer.clone())],
                false,
                &[(0, 0)],
            )
            .unwrap();
        let rows = &out.sampled[0].rows;
        let mut c = Checker::new(g, 5, KvCacheDtype::Bf16, vec![layer.clone()], vec![]);
        c.check(&pass, 0, 0, rows);
        assert_eq!(c.stats.mismatched_pairs, 0, "{:?}", c.stats.first_mismatch);
        assert!((2..=4).contains(&c.stats.rows) && c.stats.elements == c.stats.rows * 2 * 64);
        // Corrupt every row by +0.5: caught.
        let bad: Vec<u16> = rows
            .iter()
            .map(|&x| HalfDtype::Bf16.from_f64(HalfDtype::Bf16.to_f64(x) + 0.5))
            .collect();
        c.check(&pass, 0, 0, &bad);
        assert_eq!(c.stats.mismatched_pairs, 1);
        // The same rows claimed for another request: caught.
        let other = Pass {
            parts: vec![Part {
                req: 10,
                ..pass.parts[0]
            }],
            ..pass.clone()
        };
        c.check(&other, 0, 0, rows);
        assert_eq!(c.stats.mismatched_pairs, 2);
        let nan = vec![0x7FC0u16; rows.len()];
        c.check(&pass, 0, 0, &nan);
        assert_eq!(c.stats.mismatched_pairs, 3);

        // The pool gives the same totals inline and on threads, and reports
        // the earliest submitted mismatch.
        let fresh = Checker::new(g, 5, KvCacheDtype::Bf16, vec![layer], vec![]);
        let shared = std::sync::Arc::new(pass.clone());
        let other = std::sync::Arc::new(other);
        let mut results = Vec::new();
        for workers in [0, 3] {
            let mut pool = CheckPool::new(fresh.clone(), workers);
            for _ in 0..5 {
                pool.submit(&shared, 0, 0, rows.clone()).unwrap();
            }
            pool.submit(&other, 0, 0, rows.clone()).unwrap();
            pool.submit(&shared, 0, 0, bad.clone()).unwrap();
            pool.submit(&shared, 0, 0, nan.clone()).unwrap();
            let (stats, _busy) = pool.finish().unwrap();
            assert_eq!(stats.pairs, 8);
            assert_eq!(stats.mismatched_pairs, 3);
            assert!(
                stats
                    .first_mismatch
                    .as_deref()
                    .unwrap()
                    .contains("request 10"),
                "{:?}",
                stats.first_mismatch
            );
            results.push(stats);
        }
        assert_eq!(results[0], results[1]);
    }
}
