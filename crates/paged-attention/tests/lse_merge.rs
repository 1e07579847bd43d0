//! CPU tests of the row log-sum-exp of the f64 reference, of attention over
//! a shard of the keys (`attention_at`: key offset, interleave, global
//! lengths) and of the merge of partial states (`merge_states`,
//! `apply_sinks`): hand cases against a direct log-sum-exp, named edge cases
//! of splitting, then random cases whose KV is split (contiguous shards,
//! pages dealt round-robin, tokens dealt round-robin), computed per shard,
//! merged and compared with the unsplit reference.

#![allow(clippy::needless_range_loop)]

mod common;

use common::*;
use paged_attention::cp;
use paged_attention::merge::{apply_sinks, merge_states};
use paged_attention::reference::{attention_at, Interleave, KeyPositions, RefOutput};
use paged_attention::{HalfDtype, KvDtype};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// Relative tolerance of a merged state against the unsplit reference.
const TOL: f64 = 1e-9;

// ---------------------------------------------------------------- helpers

/// `ln Σ_k exp(bmm1 · q·K_k)` over the given global positions of request
/// `b`, straight from the stored bits (no max shift), plus the sink.
fn direct_lse(c: &Case, b: usize, row: usize, h: usize, keys: &[usize], sink: Option<f64>) -> f64 {
    let kvh = h / (c.hq / c.hkv);
    let mut z = sink.map_or(0.0, f64::exp);
    for &pos in keys {
        let slot = c.slot(b, pos);
        let dot: f64 = (0..c.d)
            .map(|dd| {
                let q = c.q_dtype.to_f64(c.q[(row * c.hq + h) * c.d + dd]);
                q * c.decode_kv(c.k[c.kv_index(slot, kvh, dd)])
            })
            .sum();
        z += (f64::from(c.bmm1) * dot).exp();
    }
    z.ln()
}

fn close(got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol * want.abs().max(1.0),
        "got {got}, want {want}"
    );
}

/// The reference over shard `s` placed by `pos`.
fn run_at(s: &Case, pos: &KeyPositions<'_>) -> RefOutput {
    let (kb, vb) = (s.k_bytes(), s.v_bytes());
    attention_at(&s.inputs(&kb, &vb), pos)
}

/// Global lengths of `c`'s requests (as the shards' `seq_lens`).
fn global_lens(c: &Case) -> Vec<i64> {
    c.lens.iter().map(|&l| i64::from(l.max(0))).collect()
}

/// A shard of `c` holding, for request `b`, the global keys `owned[b]`
/// (ascending) as its local keys `0..owned[b].len()`, in a fresh pool of
/// page size 1 (K/V bits copied exactly); a global key on a masked page
/// (table entry past `M` or bad id) gets a bad local page. No sinks.
fn copy_shard(c: &Case, owned: &[Vec<i64>]) -> Case {
    let bs = c.bs();
    let m = owned.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut s = Case::new(
        c.kv_dtype,
        c.d,
        c.hq,
        c.hkv,
        1,
        1 + bs * m,
        bs,
        m,
        c.uniform,
        c.num_tokens,
    );
    s.q_dtype = c.q_dtype;
    s.q.clone_from(&c.q);
    s.cu.clone_from(&c.cu);
    s.max_q_len = c.max_q_len;
    s.bmm1 = c.bmm1;
    s.bmm2 = c.bmm2;
    s.window = c.window;
    for b in 0..bs {
        s.lens[b] = owned[b].len() as i32;
        for (k, &g) in owned[b].iter().enumerate() {
            let e = g as usize / c.p;
            let id = if e < c.m {
                c.page_table[b * c.m + e]
            } else {
                -1
            };
            if id < 0 || id as usize >= c.num_pages {
                s.page_table[b * m + k] = -1;
                continue;
            }
            let (from, to) = (id as usize * c.p + g as usize % c.p, 1 + b * m + k);
            s.page_table[b * m + k] = to as i32;
            for h in 0..c.hkv {
                for dd in 0..c.d {
                    let (i, j) = (s.kv_index(to, h, dd), c.kv_index(from, h, dd));
                    s.k[i] = c.k[j];
                    s.v[i] = c.v[j];
                }
            }
        }
    }
    s
}

/// Rank `r` of `n` under a page interleave: the same pool, local page `e`
/// = global page `e·n + r` (decode context parallelism). No sinks.
fn page_shard(c: &Case, il: Interleave) -> Case {
    let mut s = c.clone();
    s.sinks = None;
    let m = c.m.div_ceil(il.ranks).max(1);
    s.m = m;
    s.page_table = vec![-1; c.bs() * m];
    for b in 0..c.bs() {
        for e in 0..m {
            let g = e * il.ranks + il.rank;
            if g < c.m {
                s.page_table[b * m + e] = c.page_table[b * c.m + g];
            }
        }
        s.lens[b] = il.count_below(i64::from(c.lens[b].max(0))) as i32;
    }
    s
}

/// Merges the shards' states and joins `c`'s sinks after the merge.
fn merged(c: &Case, parts: &[RefOutput]) -> (Vec<f64>, Vec<f64>) {
    let views: Vec<(&[f64], &[f64])> = parts.iter().map(|p| (&p.out[..], &p.lse[..])).collect();
    let (mut o, mut l) = merge_states(&views, c.d);
    if let Some(s) = &c.sinks {
        apply_sinks(&mut o, &mut l, s, c.d);
    }
    (o, l)
}

/// Merged state equals the unsplit reference: a row-head with `lse = -inf`
/// must be exactly 0 / `-inf`, others within [`TOL`] (relative L2 of the
/// output; LSE relative to `max(1, |lse|)`); written flags equal.
fn same_state(
    c: &Case,
    want: &RefOutput,
    parts: &[RefOutput],
    got: &(Vec<f64>, Vec<f64>),
) -> Result<(), String> {
    for p in parts {
        if p.written != want.written {
            return Err("a shard writes other rows".into());
        }
    }
    let d = c.d;
    for i in 0..want.lse.len() {
        let (wl, gl) = (want.lse[i], got.1[i]);
        let (wo, go) = (&want.out[i * d..(i + 1) * d], &got.0[i * d..(i + 1) * d]);
        let (row, h) = (i / c.hq, i % c.hq);
        if wl == f64::NEG_INFINITY {
            if gl != f64::NEG_INFINITY || go.iter().any(|&x| x != 0.0) {
                return Err(format!(
                    "row {row} head {h}: no key, got lse {gl} out {go:?}"
                ));
            }
            continue;
        }
        let err = rel_err(go, wo);
        // Written so that a NaN fails.
        let ok = (gl - wl).abs() <= TOL * wl.abs().max(1.0) && err <= TOL;
        if !ok {
            return Err(format!(
                "row {row} head {h}: lse {gl} vs {wl}, out rel err {err:e}"
            ));
        }
    }
    Ok(())
}

/// Contiguous split: request `b`'s keys cut at `cuts[b]` (ascending, in
/// `[0, L_b]`, the same count for every request); checks the merge.
fn check_cuts(c: &Case, cuts: &[Vec<i64>]) -> Result<Vec<RefOutput>, String> {
    let want = c.reference();
    let lens = global_lens(c);
    let shards = cuts.first().map_or(0, Vec::len) + 1;
    let mut parts = Vec::new();
    for s in 0..shards {
        let (mut owned, mut offs) = (Vec::new(), Vec::new());
        for b in 0..c.bs() {
            let lo = if s == 0 { 0 } else { cuts[b][s - 1] };
            let hi = if s + 1 == shards { lens[b] } else { cuts[b][s] };
            owned.push((lo..hi).collect::<Vec<_>>());
            offs.push(lo);
        }
        let pos = KeyPositions {
            key_offset: Some(&offs),
            interleave: None,
            seq_lens: Some(&lens),
        };
        parts.push(run_at(&copy_shard(c, &owned), &pos));
    }
    same_state(c, &want, &parts, &merged(c, &parts)).map_err(|e| format!("cuts {cuts:?}: {e}"))?;
    Ok(parts)
}

/// Interleaved split over `ranks`: whole pages (`block = None`, the case's
/// pool) or blocks of `block` tokens (copied pools); checks the merge and,
/// for pages, that the ranks' bad-page counts add up to the unsplit count.
fn check_interleave(
    c: &Case,
    ranks: usize,
    block: Option<usize>,
) -> Result<Vec<RefOutput>, String> {
    let want = c.reference();
    let lens = global_lens(c);
    let mut parts = Vec::new();
    for rank in 0..ranks {
        let il = Interleave {
            rank,
            ranks,
            block: block.unwrap_or(c.p),
        };
        let pos = KeyPositions {
            key_offset: None,
            interleave: Some(il),
            seq_lens: Some(&lens),
        };
        let shard = match block {
            None => page_shard(c, il),
            Some(bk) => {
                let owned: Vec<Vec<i64>> = lens
                    .iter()
                    .map(|&l| {
                        (0..l)
                            .filter(|g| (*g as usize / bk) % ranks == rank)
                            .collect()
                    })
                    .collect();
                copy_shard(c, &owned)
            }
        };
        parts.push(run_at(&shard, &pos));
    }
    let what = format!("{ranks} ranks, block {block:?}");
    same_state(c, &want, &parts, &merged(c, &parts)).map_err(|e| format!("{what}: {e}"))?;
    if block.is_none() {
        let count: u32 = parts.iter().map(|p| p.errors.count).sum();
        if count != want.errors.count {
            return Err(format!(
                "{what}: ranks count {count} bad pages, unsplit {}",
                want.errors.count
            ));
        }
    }
    Ok(parts)
}

/// Random finite values in every K/V slot and Q element.
fn fill_random(c: &mut Case, r: &mut impl Rng) {
    for i in 0..c.k.len() {
        let (kx, vx) = (r.gen_range(-1.0..1.0), r.gen_range(-1.0..1.0));
        c.k[i] = c.encode_kv(kx);
        c.v[i] = c.encode_kv(vx);
    }
    for x in c.q.iter_mut() {
        *x = c.q_dtype.from_f64(r.gen_range(-2.0..2.0));
    }
}

/// One request of KV length `len`, `n` uniform rows, Hq = `g·hkv`, D 4,
/// private pages in order, random values.
fn one_request(len: i32, n: usize, g: usize, hkv: usize, p: usize, seed: u64) -> Case {
    let m = (len.max(1) as usize).div_ceil(p);
    let mut c = Case::new(KvDtype::Bf16, 4, g * hkv, hkv, p, 1 + m, 1, m, Some(n), n);
    c.lens = vec![len];
    c.page_table = (1..=m as i32).collect();
    c.bmm1 = 0.7;
    fill_random(&mut c, &mut rand::rngs::StdRng::seed_from_u64(seed));
    c
}

// ------------------------------------------------- (a) LSE, hand cases

/// K zeros: every logit is 0, so `lse = ln(#visible keys)`; window sizes.
#[test]
fn lse_counts_the_visible_keys() {
    for (w, seen) in [(Some(3), 4.0), (Some(0), 1.0), (Some(2), 3.0), (None, 6.0)] {
        let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[6], Some(1), 1, |_, t| t as f64);
        c.page_table = vec![1, 2];
        c.window = w;
        close(c.reference().lse[0], f64::ln(seen), 1e-12);
    }
}

/// SEMANTICS.md §attention.11 data (GQA 2 over 1 KV head, two rows at positions 3
/// and 4), with and without a window and sinks, against a direct sum.
#[test]
fn lse_of_the_worked_example() {
    for (w, sinks) in [
        (None, None),
        (Some(1), None),
        (None, Some(vec![0.5f32, -1.0])),
        (Some(0), Some(vec![2.0, 0.0])),
    ] {
        let c = worked_example(2, 2, w, sinks.clone(), 1.5);
        let r = c.reference();
        for (row, x) in [(0usize, 3usize), (1, 4)] {
            let lo = w.map_or(0, |w| x.saturating_sub(w as usize));
            let keys: Vec<usize> = (lo..=x).collect();
            for h in 0..2 {
                let sink = sinks.as_ref().map(|s| f64::from(s[h]));
                let want = direct_lse(&c, 0, row, h, &keys, sink);
                close(r.lse[row * 2 + h], want, 1e-12);
            }
        }
    }
}

/// GQA with a head stride and a permuted page row; GQA 16 over 1 KV head.
#[test]
fn lse_under_gqa() {
    let c = gqa_stride_example(2);
    let r = c.reference();
    for h in 0..2 {
        close(r.lse[h], direct_lse(&c, 0, 0, h, &[0, 1, 2], None), 1e-12);
    }
    let c = one_request(13, 3, 16, 1, 4, 7);
    let r = c.reference();
    for row in 0..3 {
        let keys: Vec<usize> = (0..=10 + row).collect();
        for h in 0..16 {
            close(
                r.lse[row * 16 + h],
                direct_lse(&c, 0, row, h, &keys, None),
                1e-12,
            );
        }
    }
}

/// Sinks join once: `lse = ln(L + e^σ)` with zero logits; FP8 sink raw.
#[test]
fn lse_with_sinks() {
    for (len, sink) in [(4, 4f32.ln()), (1, 0.0), (9, -2.5)] {
        let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[len], Some(1), 1, |_, _| 1.0);
        c.sinks = Some(vec![sink]);
        let want = (f64::from(len) + f64::from(sink).exp()).ln();
        close(c.reference().lse[0], want, 1e-12);
    }
    // k_scale 2 folded into bmm1 = 2, logits 2·0.5 = 1 each, sink 1 unscaled.
    let c = fp8_sink_example(1);
    close(c.reference().lse[0], (3.0 * 1f64.exp()).ln(), 1e-12);
}

/// A row that sees no key (position −1; every page bad; skipped request)
/// has `lse = -inf` and zero output, with or without a sink.
#[test]
fn lse_of_rows_that_see_no_key() {
    let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[1], Some(2), 2, |_, _| 7.0);
    c.sinks = Some(vec![0.5]);
    let r = c.reference();
    assert_eq!(r.lse[0], f64::NEG_INFINITY);
    assert_eq!(r.out[0], 0.0);
    close(r.lse[1], (1.0 + 0.5f64.exp()).ln(), 1e-12);
    let mut c = uniform_weights_case(KvDtype::Bf16, 1, 1, 4, &[10], Some(1), 1, |_, t| t as f64);
    c.page_table = vec![99, 98, 97];
    assert_eq!(c.reference().lse[0], f64::NEG_INFINITY);
    let mut c = verify_ragged_example(1);
    c.cu = vec![0, 2, 1, 1, 1];
    let r = c.reference();
    assert!(!r.written[2] && r.lse[2] == f64::NEG_INFINITY);
    close(r.lse[0], f64::ln(4.0), 1e-12);
}

/// `attention_at` with the default positions is `attention`, bit for bit.
#[test]
fn default_positions_are_the_unsharded_call() {
    let c = worked_example(2, 2, Some(1), Some(vec![0.5, -1.0]), 1.0);
    let (a, b) = (c.reference(), run_at(&c, &KeyPositions::default()));
    assert_eq!(a.out, b.out);
    assert_eq!(a.lse, b.lse);
    assert_eq!(a.errors, b.errors);
}

/// Interleave arithmetic: positions and counts agree with a brute force.
#[test]
fn interleave_positions_and_counts() {
    for ranks in 1..5 {
        for block in 1..5 {
            for rank in 0..ranks {
                let il = Interleave { rank, ranks, block };
                let mine: Vec<i64> = (0..60)
                    .filter(|g| (*g as usize / block) % ranks == rank)
                    .collect();
                for (k, &g) in mine.iter().enumerate() {
                    assert_eq!(il.position(k as i64), g);
                }
                for g in -3..60 {
                    let want = mine.iter().filter(|&&x| x < g).count() as i64;
                    assert_eq!(il.count_below(g), want, "{il:?} g {g}");
                }
            }
        }
    }
}

// ------------------------------------------------ merge_states itself

/// An empty part (`lse = -inf`) is ignored even when its O holds NaN; all
/// parts empty give 0 / `-inf`; one part is returned unchanged; no parts,
/// no rows; a NaN LSE makes the row NaN.
#[test]
fn merge_is_nan_safe() {
    let (o1, l1) = (vec![1.0, 2.0], vec![0.3]);
    let (o2, l2) = (vec![f64::NAN, f64::INFINITY], vec![f64::NEG_INFINITY]);
    let (o, l) = merge_states(&[(&o1, &l1), (&o2, &l2)], 2);
    assert_eq!((o, l), (o1.clone(), l1.clone()));
    let (o, l) = merge_states(&[(&o2, &l2), (&o2, &l2)], 2);
    assert_eq!(o, vec![0.0, 0.0]);
    assert_eq!(l, vec![f64::NEG_INFINITY]);
    assert_eq!(merge_states(&[], 4), (vec![], vec![]));
    // Two halves of Z = e^1 + e^2: weights 1/(1+e), e/(1+e).
    let (oa, la, ob, lb) = (vec![1.0], vec![1.0], vec![4.0], vec![2.0]);
    let (o, l) = merge_states(&[(&oa, &la), (&ob, &lb)], 1);
    let e = 1f64.exp();
    close(o[0], (1.0 + 4.0 * e) / (1.0 + e), 1e-15);
    close(l[0], (e + e * e).ln(), 1e-15);
    let nan = vec![f64::NAN];
    let (o, l) = merge_states(&[(&oa, &la), (&oa, &nan)], 1);
    assert!(o[0].is_nan() && l[0].is_nan());
}

/// `apply_sinks` on a state with no key leaves 0 / `-inf` (D13).
#[test]
fn sinks_leave_empty_rows_empty() {
    let (mut o, mut l) = (vec![0.0, 0.0, 3.0, 3.0], vec![f64::NEG_INFINITY, 0.0]);
    apply_sinks(&mut o, &mut l, &[1.0], 2);
    assert_eq!(&o[..2], &[0.0, 0.0]);
    assert_eq!(l[0], f64::NEG_INFINITY);
    let e = 1f64.exp();
    close(o[2], 3.0 / (1.0 + e), 1e-15);
    close(l[1], (1.0 + e).ln(), 1e-15);
}

// ------------------------------------------- named edge cases of splits

/// Empty shards (cut points at 0, repeated, at L) and a request with L 0.
#[test]
fn empty_shards() {
    let c = one_request(10, 2, 2, 1, 4, 1);
    for cuts in [
        vec![0, 0, 10],
        vec![10, 10, 10],
        vec![0, 5, 5],
        vec![3, 3, 3],
    ] {
        let parts = check_cuts(&c, &[cuts]).unwrap();
        assert!(parts
            .iter()
            .any(|p| p.lse.iter().all(|&l| l == f64::NEG_INFINITY)));
    }
    let mut c = one_request(0, 1, 1, 1, 4, 2);
    c.sinks = Some(vec![0.5]);
    check_cuts(&c, &[vec![0]]).unwrap();
    check_interleave(&c, 3, None).unwrap();
}

/// A shard whose keys are all on a bad page (contiguous and page-dealt):
/// its rows see no key and the merge ignores it.
#[test]
fn shard_with_only_masked_keys() {
    let mut c = one_request(12, 2, 4, 1, 4, 3);
    c.page_table[1] = -1; // keys 4..8
    c.sinks = Some(vec![0.1, -0.4, 1.2, 0.0]);
    let parts = check_cuts(&c, &[vec![4, 8]]).unwrap();
    assert!(parts[1].lse.iter().all(|&l| l == f64::NEG_INFINITY));
    assert_eq!(
        parts[1].errors.count, 4,
        "a copied shard has one page per key"
    );
    let parts = check_interleave(&c, 3, None).unwrap();
    assert!(parts[1].lse.iter().all(|&l| l == f64::NEG_INFINITY));
    assert_eq!(parts[1].errors.count, 1, "rank 1 counts the bad page");
}

/// Window shorter than a shard: the first shard's keys lie before every
/// row's window (all masked by position), or the window straddles a cut.
#[test]
fn window_shorter_than_a_shard() {
    let mut c = one_request(40, 3, 2, 2, 8, 4);
    c.window = Some(3);
    let parts = check_cuts(&c, &[vec![30]]).unwrap();
    assert!(parts[0].lse.iter().all(|&l| l == f64::NEG_INFINITY));
    for cuts in [vec![37], vec![36, 38], vec![0, 39]] {
        check_cuts(&c, &[cuts]).unwrap();
    }
    for ranks in 1..=4 {
        check_interleave(&c, ranks, None).unwrap();
        check_interleave(&c, ranks, Some(1)).unwrap();
    }
    c.window = Some(0);
    check_cuts(&c, &[vec![38, 39]]).unwrap();
}

/// One KV head under GQA 16, several splits, with sinks.
#[test]
fn one_kv_head_gqa_16() {
    let mut c = one_request(33, 4, 16, 1, 5, 5);
    c.sinks = Some((0..16).map(|h| h as f32 * 0.25 - 2.0).collect());
    for cuts in [vec![1], vec![16, 17, 32], vec![5, 30]] {
        check_cuts(&c, &[cuts]).unwrap();
    }
    for ranks in 1..=4 {
        check_interleave(&c, ranks, None).unwrap();
        check_interleave(&c, ranks, Some(2)).unwrap();
    }
}

/// Rows that see no key in any shard (position < 0) merge to 0 / `-inf`.
#[test]
fn rows_with_no_key_anywhere() {
    let mut c = one_request(2, 4, 2, 1, 1, 6); // rows at −2, −1, 0, 1
    c.sinks = Some(vec![1.0, 2.0]);
    check_cuts(&c, &[vec![1]]).unwrap();
    check_interleave(&c, 2, None).unwrap();
    assert!(c.reference().lse[..4]
        .iter()
        .all(|&l| l == f64::NEG_INFINITY));
}

/// The sink joins once, after the merge. Given to every shard it is counted
/// once per shard; given to one rank it is lost when that rank's part of the
/// row sees no key (rank 0 holds only keys outside the window here).
#[test]
fn sink_joins_once_after_the_merge() {
    /// Rank `rank` of 2 (page interleave) with the case's sinks applied.
    fn with_sink(c: &Case, rank: usize) -> RefOutput {
        let il = Interleave {
            rank,
            ranks: 2,
            block: c.p,
        };
        let mut s = page_shard(c, il);
        s.sinks.clone_from(&c.sinks);
        let lens = global_lens(c);
        let pos = KeyPositions {
            key_offset: None,
            interleave: Some(il),
            seq_lens: Some(&lens),
        };
        run_at(&s, &pos)
    }
    fn merge(c: &Case, p: &[RefOutput]) -> (Vec<f64>, Vec<f64>) {
        let v: Vec<(&[f64], &[f64])> = p.iter().map(|p| (&p.out[..], &p.lse[..])).collect();
        merge_states(&v, c.d)
    }
    let mut c = one_request(16, 1, 1, 1, 4, 8);
    c.window = Some(5); // the row at 15 sees 10..=15
    c.sinks = Some(vec![0.7]);
    let want = c.reference();
    let parts = check_interleave(&c, 2, None).unwrap(); // rank 0: pages 0, 2
                                                        // Every rank with the sink: counted twice.
    let twice = merge(&c, &[with_sink(&c, 0), with_sink(&c, 1)]);
    close(
        twice.1[0],
        (want.lse[0].exp() + f64::from(0.7f32).exp()).ln(),
        1e-12,
    );
    // Rank 0 (keys 10, 11 visible) applies it: right here ...
    let r0 = merge(&c, &[with_sink(&c, 0), parts[1].clone()]);
    close(r0.1[0], want.lse[0], 1e-12);
    assert!(rel_err(&r0.0, &want.out) <= TOL);
    // ... but with the window at 2 rank 0 sees no key and drops the sink.
    c.window = Some(2);
    let want = c.reference();
    let parts = check_interleave(&c, 2, None).unwrap();
    assert_eq!(parts[0].lse[0], f64::NEG_INFINITY);
    let lost = merge(&c, &[with_sink(&c, 0), parts[1].clone()]);
    close(
        lost.1[0],
        (want.lse[0].exp() - f64::from(0.7f32).exp()).ln(),
        1e-12,
    );
}

/// Offsets without global lengths: a shard `[off, L)` that ends the
/// sequence places its rows at `off + L_local − n + j` by default.
#[test]
fn default_global_length_is_the_shard_end() {
    let c = one_request(20, 2, 1, 1, 1, 9);
    let owned = vec![(12..20).collect::<Vec<i64>>()];
    let s = copy_shard(&c, &owned);
    let off = [12i64];
    let a = run_at(
        &s,
        &KeyPositions {
            key_offset: Some(&off),
            ..Default::default()
        },
    );
    let lens = [20i64];
    let b = run_at(
        &s,
        &KeyPositions {
            key_offset: Some(&off),
            interleave: None,
            seq_lens: Some(&lens),
        },
    );
    assert_eq!(a.lse, b.lse);
    assert_eq!(a.out, b.out);
}

// ------------------------------------------------------- random cases

/// A small random case: bs 1..=3, L 0..=60, uniform or ragged rows 0..=4,
/// D 1..=8, GQA 1/2/4 over 1–2 KV heads or GQA 16 over 1, P 1..=16, random
/// page order with a few bad entries, sometimes fewer table entries than
/// needed, windows (often short), sinks, all three KV dtypes.
fn small_case(seed: u64) -> Case {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let kv = [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3][r.gen_range(0..3)];
    let d = [1, 2, 4, 8][r.gen_range(0..4)];
    let (g, hkv) = if r.gen_bool(0.2) {
        (16, 1)
    } else {
        ([1, 2, 4][r.gen_range(0..3)], r.gen_range(1..=2))
    };
    let p = [1, 2, 3, 4, 8, 16][r.gen_range(0..6)];
    let bs = r.gen_range(1..=3);
    let uniform = r.gen_bool(0.5);
    let max_q = r.gen_range(1..=4);
    let lens: Vec<i32> = (0..bs)
        .map(|_| {
            if r.gen_bool(0.1) {
                0
            } else {
                r.gen_range(0..=60)
            }
        })
        .collect();
    let qlens: Vec<usize> = (0..bs)
        .map(|_| {
            if uniform {
                max_q
            } else {
                r.gen_range(0..=max_q)
            }
        })
        .collect();
    let max_len = lens.iter().copied().max().unwrap_or(0).max(1) as usize;
    let need = max_len.div_ceil(p);
    let m = if r.gen_bool(0.05) {
        (need / 2).max(1)
    } else {
        need + r.gen_range(0..2)
    };
    let num_pages = 1 + bs * m + r.gen_range(0..2);
    let num_tokens = qlens.iter().sum();
    let mut c = Case::new(
        kv,
        d,
        g * hkv,
        hkv,
        p,
        num_pages,
        bs,
        m,
        uniform.then_some(max_q),
        num_tokens,
    );
    c.q_dtype = if r.gen_bool(0.5) {
        HalfDtype::Bf16
    } else {
        HalfDtype::F16
    };
    c.max_q_len = max_q;
    c.lens = lens;
    let mut acc = 0;
    for (b, n) in qlens.iter().enumerate() {
        c.cu[b] = acc;
        acc += *n as i32;
    }
    c.cu[bs] = acc;
    let mut ids: Vec<i32> = (1..num_pages as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, r.gen_range(0..=i));
    }
    for (i, e) in c.page_table.iter_mut().enumerate() {
        *e = if r.gen_bool(0.03) {
            -1
        } else {
            ids[i % ids.len()]
        };
    }
    c.window = match r.gen_range(0..5) {
        0 => Some(r.gen_range(0..4)),
        1 => Some(r.gen_range(0..=max_len as u32 + 3)),
        _ => None,
    };
    if r.gen_bool(0.4) {
        c.sinks = Some((0..c.hq).map(|_| r.gen_range(-2.0f32..3.0)).collect());
    }
    c.bmm1 = r.gen_range(0.1f32..3.0);
    c.bmm2 = r.gen_range(0.5f32..2.0);
    fill_random(&mut c, &mut r);
    c
}

/// Random cuts of every request into `shards` contiguous pieces; one cut in
/// five is pushed to an end (empty shards).
fn random_cuts(c: &Case, shards: usize, r: &mut impl Rng) -> Vec<Vec<i64>> {
    global_lens(c)
        .iter()
        .map(|&l| {
            let mut v: Vec<i64> = (1..shards)
                .map(|_| match r.gen_range(0..10) {
                    0 => 0,
                    1 => l,
                    _ => r.gen_range(0..=l),
                })
                .collect();
            v.sort_unstable();
            v
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// The merge of 1..=4 contiguous shards, of a page interleave over
    /// 1..=4 ranks and of a token-block interleave equals the unsplit
    /// reference (output and LSE within 1e-9 relative, sinks after the
    /// merge), and the ranks' bad-page counts add up.
    #[test]
    fn split_merge_equals_unsplit(seed in any::<u64>()) {
        let c = small_case(seed);
        let mut r = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5EED);
        let cuts = random_cuts(&c, r.gen_range(1..=4), &mut r);
        let ranks = r.gen_range(1..=4);
        let block = r.gen_range(1..=3);
        let res = check_cuts(&c, &cuts)
            .and_then(|_| check_interleave(&c, ranks, None))
            .and_then(|_| check_interleave(&c, ranks, Some(block)));
        prop_assert!(res.is_ok(), "seed {seed}: {}: {}", describe(&c), res.err().unwrap_or_default());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// `cp::simulate` over 2..=5 ranks is exactly the merge of this file's
    /// own page shards (`page_shard`; over 1 rank the unsplit reference
    /// itself), equals the unsplit reference within 1e-9, and reports the
    /// unsplit call's error events.
    #[test]
    fn cp_simulate_is_the_page_interleave_merge(seed in any::<u64>()) {
        let c = small_case(seed);
        let ranks = (seed % 5) as usize + 1;
        let (kb, vb) = (c.k_bytes(), c.v_bytes());
        let input = c.inputs(&kb, &vb);
        let sim = cp::simulate(&input, ranks);
        let want = c.reference();
        let parts = check_interleave(&c, ranks, None);
        prop_assert!(parts.is_ok(), "seed {seed}: {}", parts.err().unwrap_or_default());
        let parts = parts.unwrap_or_default();
        let (o, l) = merged(&c, &parts);
        let same = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x == y || (x.is_nan() && y.is_nan()));
        // One rank is the unsplit call itself (sinks inside the softmax),
        // more ranks the merge of the shards (sinks after it).
        let (eo, el) = if ranks == 1 { (want.out.clone(), want.lse.clone()) } else { (o, l) };
        prop_assert!(same(&sim.out, &eo) && same(&sim.lse, &el), "seed {seed}: {ranks} ranks: not the shards' merge; {}", describe(&c));
        prop_assert_eq!(&sim.written, &want.written);
        prop_assert_eq!(sim.errors, want.errors, "seed {}: {}", seed, describe(&c));
        let got = (sim.out.clone(), sim.lse.clone());
        let r = same_state(&c, &want, &[], &got);
        prop_assert!(r.is_ok(), "seed {seed}: {}", r.err().unwrap_or_default());
    }
}

/// Per-request check events are counted once under `cp::simulate`, not once
/// per rank: a ragged batch with a negative length, a request longer than
/// `max_q_len` and `cu_seqlens_q` going backwards, over 2..=4 ranks.
#[test]
fn cp_counts_request_checks_once() {
    let c = widen_ragged(&one_request(40, 2, 2, 1, 4, 7));
    let (kb, vb) = (c.k_bytes(), c.v_bytes());
    let input = c.inputs(&kb, &vb);
    let want = c.reference();
    assert_eq!(want.errors.count, 3, "the case carries three check events");
    for ranks in [2, 3, 4] {
        let sim = cp::simulate(&input, ranks);
        assert_eq!(sim.errors, want.errors, "{ranks} ranks");
        assert_eq!(sim.written, want.written, "{ranks} ranks");
    }
}

/// `c` (one request of `n` rows) as a ragged batch of four requests over
/// the same pages: request 1 has a negative length and no rows, request 2
/// `n + 1` rows (more than `max_q_len = n`), request 3 `cu_seqlens_q`
/// going backwards.
fn widen_ragged(c: &Case) -> Case {
    let mut w = c.clone();
    let n = c.num_tokens as i32;
    w.uniform = None;
    w.max_q_len = n as usize;
    w.lens = vec![c.lens[0], -3, c.lens[0], c.lens[0]];
    w.cu = vec![0, n, n, 2 * n + 1, 2 * n];
    w.num_tokens = (2 * n + 1) as usize;
    w.q = (0..w.num_tokens * c.hq * c.d)
        .map(|i| c.q[i % c.q.len()])
        .collect();
    w.page_table = c.page_table.repeat(4);
    w
}

/// The merge-states kernel's committed PTX is fresh (built from
/// `kernels/merge_states.cu` by the pinned toolchain), holds both entries,
/// and its cubin was assembled from it.
#[test]
fn committed_merge_ptx_is_fresh_and_complete() {
    use paged_attention::{merge_entry_name, HalfDtype, MERGE_PTX};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let kernel = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/merge_states.cu");
    kernel_rt::ptxhash::check_fresh(&root, &kernel, MERGE_PTX.ptx).unwrap();
    for dt in [HalfDtype::Bf16, HalfDtype::F16] {
        assert!(
            MERGE_PTX.has_entry(&merge_entry_name(dt)),
            "{dt:?} entry missing"
        );
    }
    kernel_rt::ptxhash::check_cubin(&MERGE_PTX).unwrap();
}
