//! The independent accuracy check. A sampled (attention call, request) pair
//! is recomputed from scratch: the request's K/V regenerated from the seed
//! for every visible position (quantized to e4m3 here for an FP8 cache),
//! laid out as one contiguous page, and attention evaluated in f64 by
//! paged-attention's reference — no pool, page table, metadata or KV-write
//! path of the backend is involved. Per pair, up to [`ROWS_PER_CHECK`]
//! query rows (first, last and two sampled) and one sampled KV-head group
//! (its `G = Hq / Hkv` query heads) are compared, so checks stay cheap on
//! the host.
//!
//! Tolerances (attention.md §10): bf16/f16 KV `atol = rtol = 1e-2`; FP8 KV
//! `atol 7e-2, rtol 4e-2`; doubled for multi-row (verify / extend)
//! requests. An element is a mismatch when `|got − ref| > atol + rtol·|ref|`
//! or `got` is not finite.

use fp8_kv::codec::quantize;
use mha_backend::{KvCacheDtype, LayerConfig};
use paged_attention::reference::{self as attn, HostInputs, HostKv, HostLayout, KvData};
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
        let mut mismatch = false;
        for j in rows {
            let x = p.kv_len - p.n + j;
            let len = x + 1;
            let lo = match l.window_left {
                Some(w) => x.saturating_sub(w as usize),
                None => 0,
            };
            // K/V of positions lo..=x for KV head kvh, contiguous [len, D].
            let mut kb = vec![0u16; len * d];
            let mut vb = vec![0u16; len * d];
            let one = |act: Act, pos: usize, out: &mut [u16]| {
                for (i, o) in out.iter_mut().enumerate() {
                    let v = self
                        .gen
                        .element(act, pass.model, layer, p.req, pos, 0, kvh, i);
                    *o = half::bf16::from_f32(v).to_bits();
                }
            };
            for pos in lo..len {
                one(Act::K, pos, &mut kb[pos * d..][..d]);
                one(Act::V, pos, &mut vb[pos * d..][..d]);
            }
            let mut q = vec![0u16; group * d];
            for (i, o) in q.iter_mut().enumerate() {
                let v = self.gen.element(
                    Act::Q,
                    pass.model,
                    layer,
                    p.req,
                    x,
                    pass.salt,
                    kvh * group + i / d,
                    i % d,
                );
                *o = half::bf16::from_f32(v).to_bits();
            }
            let (k8, v8);
            let (kd, vd) = match self.kv_dtype {
                KvCacheDtype::Fp8E4m3 => {
                    let f = |b: &[u16], s: f32| -> Vec<u8> {
                        b.iter()
                            .map(|&x| quantize(half::bf16::from_bits(x).to_f32(), 1.0 / s))
                            .collect()
                    };
                    k8 = f(&kb, ks);
                    v8 = f(&vb, vs);
                    (KvData::E4m3(&k8), KvData::E4m3(&v8))
                }
                KvCacheDtype::F16 => (KvData::F16(&kb), KvData::F16(&vb)),
                _ => (KvData::Bf16(&kb), KvData::Bf16(&vb)),
            };
            let shape = [1, 1, len, d];
            let strides = [len * d, len * d, d, 1];
            let input = HostInputs {
                q: &q,
                q_dtype: HalfDtype::Bf16,
                q_shape: [1, group, d],
                q_strides: [group * d, d, 1],
                k: HostKv {
                    data: kd,
                    shape,
                    strides,
                },
                v: HostKv {
                    data: vd,
                    shape,
                    strides,
                },
                page_table: &[0],
                max_num_pages: 1,
                page_table_stride: 1,
                cache_seqlens: &[len as i32],
                layout: HostLayout::Uniform { q_len_per_req: 1 },
                bmm1_scale: bmm1,
                bmm2_scale: vs,
                window_left: l.window_left,
                sinks: sinks.as_deref(),
            };
            let r = attn::attention(&input);
            let got_row = &got[j * hq * d..][..hq * d];
            for (i, &want) in r.out.iter().enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{CpuEngine, Engine};
    use crate::pass::{Part, PassKind};
    use mha_backend::{BackendConfig, Device, ForwardBatch, MhaBackend};

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
                std::slice::from_ref(&layer),
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
    }
}
