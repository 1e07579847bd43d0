//! Merging partial attention states, in f64: the definition a merge kernel
//! (split KV, context-parallel decode, ring prefill) is tested against.
//!
//! A **state** of a set of rows is a pair `(O, LSE)`: `O` is
//! `[rows, Hq, D]` row-major (already scaled by `bmm2_scale`), `LSE` is
//! `[rows, Hq]` natural-log log-sum-exp of the logits behind `O`
//! ([`crate::reference::RefOutput::lse`]); `LSE = -inf` marks a row that saw
//! no key (its `O` is 0 by D13 and is never read here).
//!
//! If the keys a row sees are split into disjoint parts `i` with partial sums
//! `Z_i = Σ_{k∈i} exp(s_k)` and `O_i = bmm2·Σ_{k∈i} exp(s_k)·V_k / Z_i`, then
//! `LSE_i = ln Z_i`, the whole row has `Z = Σ_i Z_i` and
//! `O = Σ_i (Z_i / Z)·O_i`. Computed without overflow, with
//! `M = max_i LSE_i`:
//!
//! ```text
//! w_i = exp(LSE_i − M)          (0 for a part with LSE_i = -inf)
//! O   = Σ_i w_i·O_i / Σ_i w_i
//! LSE = M + ln Σ_i w_i
//! ```
//!
//! Every part `-inf` (no part saw a key): `O = 0`, `LSE = -inf`, as the
//! unsplit reference's row that sees no key. A NaN `LSE_i` makes the row NaN
//! (an infinite or NaN logit makes the unsplit row NaN too).
//!
//! **Sinks under sharding.** A sink is one extra logit `σ_h` in the
//! denominator with no value vector; it must join each row once. The rule
//! here: parts are computed **without** sinks and the sink joins the merged
//! state ([`apply_sinks`]):
//!
//! ```text
//! LSE' = ln(exp(LSE) + exp(σ_h)),   O' = O·exp(LSE − LSE')
//! ```
//!
//! leaving a row with `LSE = -inf` at `O = 0, LSE = -inf` (D13: a row that
//! sees no key outputs zeros even with a sink). Giving the sink to one rank
//! instead would be wrong whenever that rank's part of a row saw no key but
//! another rank's did: D13 zeroes that part (`LSE = -inf`), so the merge
//! would drop the sink. Applying it after the merge needs only the merged
//! state and matches what the single-GPU split-KV merge already does.

/// Merges partial states `parts[i] = (O_i, LSE_i)` of the same rows (module
/// docs for the formula): `O_i` is `[rows, Hq, head_dim]`, `LSE_i` is
/// `[rows, Hq]`, every part the same shape. Returns the merged `(O, LSE)`.
/// No parts gives the empty state of no rows.
///
/// # Panics
/// When the parts' shapes disagree or `O_i.len() ≠ LSE_i.len()·head_dim`.
pub fn merge_states(parts: &[(&[f64], &[f64])], head_dim: usize) -> (Vec<f64>, Vec<f64>) {
    let n = parts.first().map_or(0, |p| p.1.len());
    for (o, l) in parts {
        assert_eq!(l.len(), n, "every part must hold the same rows");
        assert_eq!(o.len(), n * head_dim, "O must be [rows, Hq, head_dim]");
    }
    let mut out = vec![0.0f64; n * head_dim];
    let mut lse = vec![f64::NEG_INFINITY; n];
    for i in 0..n {
        let o = &mut out[i * head_dim..(i + 1) * head_dim];
        if parts.iter().any(|p| p.1[i].is_nan()) {
            o.fill(f64::NAN);
            lse[i] = f64::NAN;
            continue;
        }
        let m = parts
            .iter()
            .map(|p| p.1[i])
            .fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue; // no part saw a key: O = 0, LSE = -inf
        }
        let mut total = 0.0f64;
        for (po, pl) in parts {
            if pl[i] == f64::NEG_INFINITY {
                continue; // empty part: its O is never read
            }
            let w = (pl[i] - m).exp();
            total += w;
            for (od, &x) in o.iter_mut().zip(&po[i * head_dim..(i + 1) * head_dim]) {
                *od += w * x;
            }
        }
        for od in o.iter_mut() {
            *od /= total;
        }
        lse[i] = m + total.ln();
    }
    (out, lse)
}

/// Joins the sinks to a merged state in place (module docs): `sinks` is
/// `[Hq]` f32 raw logits (never scaled), `out` is `[rows, Hq, head_dim]`,
/// `lse` `[rows, Hq]`. Rows with `LSE = -inf` stay `O = 0`, `LSE = -inf`.
///
/// # Panics
/// When the shapes disagree.
pub fn apply_sinks(out: &mut [f64], lse: &mut [f64], sinks: &[f32], head_dim: usize) {
    let hq = sinks.len();
    assert!(hq > 0 && lse.len() % hq == 0, "lse must be [rows, Hq]");
    assert_eq!(
        out.len(),
        lse.len() * head_dim,
        "O must be [rows, Hq, head_dim]"
    );
    for (i, l) in lse.iter_mut().enumerate() {
        if *l == f64::NEG_INFINITY {
            continue; // D13
        }
        let s = f64::from(sinks[i % hq]);
        let m = l.max(s);
        let joined = m + ((*l - m).exp() + (s - m).exp()).ln();
        let scale = (*l - joined).exp();
        for od in &mut out[i * head_dim..(i + 1) * head_dim] {
            *od *= scale;
        }
        *l = joined;
    }
}
