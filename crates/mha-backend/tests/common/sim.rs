//! The CPU-executor test harness of `backend.rs` and `upstream_reports.rs`:
//! an [`MhaBackend`] on the CPU executor plus the test's own record of every
//! K/V row it was given, step drivers that grow requests and build
//! decode / extend / verify / draft batches, and attention written out
//! directly in f64 over that record (never over the backend's output or
//! caches), with the scale and softmax rules restated here.
#![allow(dead_code)]

use std::collections::BTreeMap;

use fp8_kv::codec::{e4m3_decode, quantize};
use mha_backend::{
    BackendConfig, Device, ForwardBatch, HalfDtype, KvCacheDtype, KvSnapshot, MhaBackend, TensorRef,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn bf16(x: f64) -> u16 {
    HalfDtype::Bf16.from_f64(x)
}

thread_local! {
    /// The model dtype of the test running on this thread (outputs, K/V, Q).
    static DT: std::cell::Cell<HalfDtype> = const { std::cell::Cell::new(HalfDtype::Bf16) };
}

/// `bits` of the running test's model dtype as f64.
pub fn f(bits: u16) -> f64 {
    DT.with(|d| d.get()).to_f64(bits)
}

/// The D8 rule written out: a scale that is missing, `≤ 0` or not finite is 1.
pub fn scale_rule(s: Option<f32>) -> f32 {
    match s {
        Some(x) if x.is_finite() && x > 0.0 => x,
        _ => 1.0,
    }
}

/// K or V rows (model-dtype bits) as the bytes of an e4m3 cache with scale
/// `s`: `e4m3(x / s)`.
pub fn fp8_bytes(rows: &[u16], s: f32) -> Vec<u8> {
    rows.iter()
        .map(|&b| quantize(f(b) as f32, 1.0 / s))
        .collect()
}

/// Request rows as a batch's `req_pool_indices`.
pub fn ids(reqs: &[usize]) -> Vec<i64> {
    reqs.iter().map(|&r| r as i64).collect()
}

/// `(row, n)` for every request of `reqs`.
pub fn each(reqs: &[usize], n: usize) -> Vec<(usize, usize)> {
    reqs.iter().map(|&r| (r, n)).collect()
}

/// One request's part of a pass: its row, query rows `n`, attention
/// length `len` (row `j` sits at position `len − n + j`).
#[derive(Debug, Clone, Copy)]
pub struct Part {
    pub req: usize,
    pub n: usize,
    pub len: usize,
}

/// Per request row, the (K, V) rows (model-dtype bits) of every position.
pub type History = BTreeMap<usize, Vec<(Vec<u16>, Vec<u16>)>>;

/// Every layer's `(query, output)` of a pass.
pub type Outs = Vec<(Vec<u16>, Vec<u16>)>;

/// The backend plus the test's own record of every K/V row it was given.
pub struct Sim {
    pub backend: MhaBackend,
    pub config: BackendConfig,
    /// Per layer, per request row, the K and V rows of every position.
    pub hist: Vec<History>,
    pub rng: StdRng,
    /// After every pass also: no padding rows (every row of the pass is
    /// checked), every cached position bit for bit
    /// ([`Sim::check_caches`]) and no device error.
    pub check_state: bool,
}

impl Sim {
    /// Passes check their outputs only (rows after the parts' are padding).
    pub fn new(config: BackendConfig, seed: u64) -> Self {
        DT.with(|d| d.set(config.model_dtype));
        Self {
            backend: MhaBackend::new(config.clone(), Device::Cpu).unwrap(),
            hist: vec![BTreeMap::new(); config.layers.len()],
            config,
            rng: StdRng::seed_from_u64(seed),
            check_state: false,
        }
    }

    /// Passes check their outputs, then the caches and the device errors
    /// ([`Sim::check_state`]).
    pub fn checked(config: BackendConfig, seed: u64) -> Self {
        Self {
            check_state: true,
            ..Self::new(config, seed)
        }
    }

    /// `n` random model-dtype values in `[-2, 2)`.
    pub fn rand_bits(&mut self, n: usize) -> Vec<u16> {
        (0..n)
            .map(|_| {
                self.config
                    .model_dtype
                    .from_f64(self.rng.gen_range(-2.0..2.0))
            })
            .collect()
    }

    pub fn new_request(&mut self) -> usize {
        let r = self.backend.alloc_request().unwrap();
        for h in &mut self.hist {
            h.insert(r, Vec::new());
        }
        r
    }

    /// `N` new requests prefilled in one extend pass of `lens[i]` tokens
    /// each; their rows.
    pub fn prefill<const N: usize>(&mut self, lens: [usize; N]) -> [usize; N] {
        let reqs = [(); N].map(|()| self.new_request());
        let grow: Vec<(usize, usize)> = reqs.iter().copied().zip(lens).collect();
        self.extend(&grow, false);
        reqs
    }

    /// Tokens the record holds for request `r`.
    pub fn len(&self, r: usize) -> usize {
        self.hist[0][&r].len()
    }

    /// The parts of a pass adding `grow` (`(row, n)`) on top of what the
    /// requests hold (call before the pass).
    pub fn parts(&self, grow: &[(usize, usize)]) -> Vec<Part> {
        grow.iter()
            .map(|&(req, n)| Part {
                req,
                n,
                len: self.len(req) + n,
            })
            .collect()
    }

    /// New tokens for `reqs` (`(row, n)`), their slots.
    pub fn grow(&self, reqs: &[(usize, usize)]) -> Vec<i64> {
        self.backend.alloc_tokens(reqs).unwrap()
    }

    /// Request `r`'s slots (`req_to_token[r]`).
    pub fn slots(&self, r: usize) -> Vec<i32> {
        self.backend
            .with_pools(|p| p.request_slots(r).unwrap().to_vec())
    }

    /// Request `r`'s page-table row by the definition: the page of slot
    /// `req_to_token[r][P·j]`.
    pub fn pages(&self, r: usize) -> Vec<i32> {
        let p = self.config.page_size;
        let slots = self.slots(r);
        slots.iter().step_by(p).map(|&s| s / p as i32).collect()
    }

    /// Every layer's cache.
    pub fn caches(&self) -> Vec<KvSnapshot> {
        (0..self.config.layers.len())
            .map(|l| self.backend.read_kv_cache(l).unwrap())
            .collect()
    }

    /// SWA eviction of request `r` at its length `len` (the next row sits
    /// at `len`); asserts that the oldest key that row sees, `len −
    /// window_left`, keeps its SWA slot. Returns the pages freed.
    pub fn evict_swa_keeping(&mut self, r: usize, window_left: usize) -> usize {
        let len = self.len(r);
        let freed = self.backend.evict_swa(r, len).unwrap();
        if len >= window_left {
            let oldest = len - window_left;
            let slot = self.slots(r)[oldest] as usize;
            let swa = self
                .backend
                .with_pools(|p| p.swa_mapping().unwrap().map()[slot]);
            assert!(swa > 0, "position {oldest} of {len} evicted");
        }
        freed
    }

    /// Runs every layer on `batch`; the first rows belong to `parts` (their
    /// new K/V appended to the record), any rows after them are padding and
    /// not checked. Asserts the checked rows against [`Sim::direct`] (and
    /// the state, with [`Sim::check_state`]) and returns every layer's
    /// output with its query.
    pub fn run(&mut self, batch: &ForwardBatch, parts: &[Part]) -> Outs {
        let rows = self
            .backend
            .init_forward_metadata(batch)
            .unwrap()
            .num_tokens;
        let real: usize = parts.iter().map(|p| p.n).sum();
        if self.check_state {
            assert_eq!(real, rows, "every row of the pass is checked");
        }
        assert!(real <= rows);
        let mut outs = Vec::new();
        for layer in 0..self.config.layers.len() {
            let l = self.config.layers[layer].clone();
            let q = self.rand_bits(rows * l.q_row_elems());
            let k = self.rand_bits(rows * l.kv_row_elems());
            let v = self.rand_bits(rows * l.kv_row_elems());
            let out = self
                .backend
                .forward(
                    layer,
                    TensorRef::Host(&q),
                    Some(TensorRef::Host(&k)),
                    Some(TensorRef::Host(&v)),
                    batch,
                    true,
                )
                .unwrap()
                .into_host()
                .unwrap();
            assert_eq!(out.len(), rows * l.q_row_elems());
            // Append the new tokens to the record, then compute directly.
            let kv = l.kv_row_elems();
            let mut t = 0;
            for p in parts {
                let h = self.hist[layer].get_mut(&p.req).unwrap();
                for _ in 0..p.n {
                    h.push((
                        k[t * kv..(t + 1) * kv].to_vec(),
                        v[t * kv..(t + 1) * kv].to_vec(),
                    ));
                    t += 1;
                }
            }
            let expect = self.direct(layer, parts, &q, None);
            check_close(
                &out[..real * l.q_row_elems()],
                &expect,
                l.num_q_heads,
                l.head_dim,
                &format!("layer {layer}"),
            );
            outs.push((q, out));
        }
        if self.check_state {
            self.check_caches();
            self.assert_clean();
        }
        outs
    }

    /// SEMANTICS.md §attention.2 over the record: row at position `x` sees
    /// keys `max(0, x − W) ..= x` (`W` = the layer's window or
    /// `window_override`), softmax with the layer's sinks, K/V through the
    /// e4m3 round trip with the D8 scales on an FP8 cache.
    pub fn direct(
        &self,
        layer: usize,
        parts: &[Part],
        q: &[u16],
        window_override: Option<Option<u32>>,
    ) -> Vec<f64> {
        let l = &self.config.layers[layer];
        let (hq, hkv, d) = (l.num_q_heads, l.num_kv_heads, l.head_dim);
        let g = hq / hkv;
        let fp8 = self.config.kv_dtype == KvCacheDtype::Fp8E4m3;
        let (ks, vs) = if fp8 {
            (scale_rule(l.k_scale), scale_rule(l.v_scale))
        } else {
            (1.0, 1.0)
        };
        let val = |bits: u16, s: f32| -> f64 {
            let x = f(bits) as f32;
            if fp8 {
                f64::from(e4m3_decode(quantize(x, 1.0 / s))) * f64::from(s)
            } else {
                f64::from(x)
            }
        };
        let window = window_override.unwrap_or(l.window_left);
        let sm = l.sm_scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
        let mut out = Vec::new();
        let mut row = 0;
        for p in parts {
            let h = &self.hist[layer][&p.req];
            for j in 0..p.n {
                let x = p.len as i64 - p.n as i64 + j as i64;
                let lo = window.map_or(0, |w| (x - i64::from(w)).max(0));
                for head in 0..hq {
                    let kvh = head / g;
                    let qv: Vec<f64> = (0..d).map(|e| f(q[(row * hq + head) * d + e])).collect();
                    let keys: Vec<usize> = if x < 0 {
                        vec![]
                    } else {
                        (lo as usize..=x as usize).collect()
                    };
                    if keys.is_empty() {
                        out.extend(std::iter::repeat_n(0.0, d));
                        continue;
                    }
                    let logits: Vec<f64> = keys
                        .iter()
                        .map(|&k| {
                            let kr = &h[k].0[kvh * d..(kvh + 1) * d];
                            (0..d).map(|e| qv[e] * val(kr[e], ks)).sum::<f64>() * sm
                        })
                        .collect();
                    let sink = l.sinks.as_ref().map(|s| f64::from(s[head]));
                    let m = logits
                        .iter()
                        .copied()
                        .chain(sink)
                        .fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = logits.iter().map(|s| (s - m).exp()).collect();
                    let den = w.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
                    for e in 0..d {
                        let num: f64 = keys
                            .iter()
                            .zip(&w)
                            .map(|(&k, wk)| wk * val(h[k].1[kvh * d + e], vs))
                            .sum();
                        out.push(num / den);
                    }
                }
                row += 1;
            }
        }
        out
    }

    /// Every recorded position of every request, in every layer, holds the
    /// recorded bits (FP8: `e4m3(x / scale)` bytes) at its slot of the
    /// layer's own pool (SWA layers: through the SWA map; evicted skipped).
    pub fn check_caches(&self) {
        let pools = self.backend.pools_snapshot();
        let p = self.config.page_size;
        for (layer, l) in self.config.layers.iter().enumerate() {
            let snap = self.backend.read_kv_cache(layer).unwrap();
            let kv = l.kv_row_elems();
            let (ks, vs) = (scale_rule(l.k_scale), scale_rule(l.v_scale));
            for (&req, h) in &self.hist[layer] {
                let slots = pools.request_slots(req).unwrap();
                assert_eq!(slots.len(), h.len());
                for (pos, (k, v)) in h.iter().enumerate() {
                    let mut slot = slots[pos] as usize;
                    if self.config.is_swa_layer(layer) {
                        let m = pools.swa_mapping().unwrap().map()[slot];
                        if m == 0 {
                            continue; // evicted out of the window
                        }
                        slot = m as usize;
                    }
                    assert!(slot >= p, "real token in the dummy page");
                    let at = slot * kv..(slot + 1) * kv;
                    match &snap {
                        KvSnapshot::Half { k: kc, v: vc } => {
                            assert_eq!(
                                &kc[at.clone()],
                                &k[..],
                                "layer {layer} req {req} pos {pos}"
                            );
                            assert_eq!(&vc[at], &v[..]);
                        }
                        KvSnapshot::Fp8 { k: kc, v: vc } => {
                            assert_eq!(&kc[at.clone()], &fp8_bytes(k, ks)[..]);
                            assert_eq!(&vc[at], &fp8_bytes(v, vs)[..]);
                        }
                    }
                }
            }
        }
    }

    pub fn assert_clean(&self) {
        let e = self.backend.device_errors();
        assert!(e.is_clean(), "{e:?}");
    }
}

// ---------------------------------------------------------------- step drivers

impl Sim {
    /// A prefill / chunk of `reqs` (`(row, n)`) on top of what they hold.
    pub fn extend(&mut self, reqs: &[(usize, usize)], mixed: bool) -> Outs {
        let prefix: Vec<i32> = reqs.iter().map(|&(r, _)| self.len(r) as i32).collect();
        let parts = self.parts(reqs);
        let loc = self.grow(reqs);
        let batch = ForwardBatch::extend(
            reqs.iter().map(|&(r, _)| r as i64).collect(),
            prefix,
            reqs.iter().map(|&(_, n)| n as i32).collect(),
            loc,
            mixed,
        );
        self.run(&batch, &parts)
    }

    /// The decode batch of one new token per request (`seq_lens` include
    /// it) and its parts; slots allocated, nothing run.
    pub fn decode_batch(&mut self, reqs: &[usize]) -> (ForwardBatch, Vec<Part>) {
        let grow = each(reqs, 1);
        let parts = self.parts(&grow);
        let loc = self.grow(&grow);
        let seq: Vec<i64> = reqs.iter().map(|&r| self.len(r) as i64 + 1).collect();
        (ForwardBatch::decode(ids(reqs), seq, loc), parts)
    }

    pub fn decode(&mut self, reqs: &[usize]) -> Outs {
        let (batch, parts) = self.decode_batch(reqs);
        self.run(&batch, &parts)
    }

    /// Target verify of `lens[i]` draft tokens per request (ragged layout
    /// when `ragged`).
    pub fn verify(&mut self, reqs: &[usize], lens: &[usize], ragged: bool) -> Outs {
        let grow: Vec<(usize, usize)> = reqs.iter().zip(lens).map(|(&r, &n)| (r, n)).collect();
        let parts = self.parts(&grow);
        let seq: Vec<i64> = reqs.iter().map(|&r| self.len(r) as i64).collect();
        let loc = self.grow(&grow);
        let batch = ForwardBatch::target_verify(
            ids(reqs),
            seq,
            loc,
            ragged.then(|| lens.iter().map(|&n| n as i32).collect()),
        );
        self.run(&batch, &parts)
    }

    /// The DRAFT_EXTEND_V2 batch of `n` rows per request (`seq_lens`
    /// include them) and its parts; slots allocated, nothing run.
    pub fn draft_extend_batch(&mut self, reqs: &[usize], n: usize) -> (ForwardBatch, Vec<Part>) {
        let grow = each(reqs, n);
        let parts = self.parts(&grow);
        let loc = self.grow(&grow);
        let seq: Vec<i64> = reqs.iter().map(|&r| (self.len(r) + n) as i64).collect();
        let batch = ForwardBatch::draft_extend_v2(ids(reqs), seq, loc, n as i32);
        (batch, parts)
    }

    pub fn draft_extend(&mut self, reqs: &[usize], n: usize) -> Outs {
        let (batch, parts) = self.draft_extend_batch(reqs, n);
        self.run(&batch, &parts)
    }

    /// Draft decode step `step` on the target backend (spec_info step given):
    /// `seq_lens` exclude the `step + 1` draft tokens.
    pub fn draft_decode(&mut self, reqs: &[usize], step: u32) -> Outs {
        let grow = each(reqs, 1);
        let parts = self.parts(&grow);
        let seq: Vec<i64> = reqs
            .iter()
            .map(|&r| self.len(r) as i64 - i64::from(step))
            .collect();
        let loc = self.grow(&grow);
        let batch = ForwardBatch::draft_decode(ids(reqs), seq, loc, Some(step));
        self.run(&batch, &parts)
    }
}

// ---------------------------------------------------------------- comparisons

/// `(‖e‖, ‖o − e‖)`.
fn norms(o: &[u16], e: &[f64]) -> (f64, f64) {
    let n = e.iter().map(|x| x * x).sum::<f64>().sqrt();
    let diff = o
        .iter()
        .zip(e)
        .map(|(&a, b)| (f(a) - b) * (f(a) - b))
        .sum::<f64>()
        .sqrt();
    (n, diff)
}

/// Per (row, head): `‖out − ref‖ / ‖ref‖ ≤ 1e-2`; a zero reference row must
/// be exactly zero.
pub fn check_close(out: &[u16], expect: &[f64], hq: usize, d: usize, what: &str) {
    assert_eq!(out.len(), expect.len(), "{what}: output size");
    for (i, (o, e)) in out.chunks(d).zip(expect.chunks(d)).enumerate() {
        let (n, diff) = norms(o, e);
        let (row, head) = (i / hq, i % hq);
        if n == 0.0 {
            assert_eq!(diff, 0.0, "{what} row {row} head {head}: expected zeros");
        } else {
            let r = diff / n;
            assert!(r <= 1e-2, "{what} row {row} head {head}: rel err {r}");
        }
    }
}

pub fn rel_err(o: &[u16], e: &[f64]) -> f64 {
    let (n, diff) = norms(o, e);
    diff / n.max(1e-30)
}

/// Largest per-(row, head) relative distance of `out` from `other`.
pub fn max_rel_err(out: &[u16], other: &[f64], d: usize) -> f64 {
    out.chunks(d)
        .zip(other.chunks(d))
        .map(|(o, e)| rel_err(o, e))
        .fold(0.0, f64::max)
}
