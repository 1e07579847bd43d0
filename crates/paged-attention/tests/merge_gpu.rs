//! GPU tests of the merge-states kernel against the f64 merge
//! (`paged_attention::merge`): random part counts, rows, heads, head dims
//! and layouts (padded strides), parts that saw no key (`LSE = −inf`, their
//! `O` filled with NaN bits that must never be read), rows that no part
//! saw, a NaN `LSE`, sinks joined once; outputs poisoned before each
//! launch; typed errors for bad arguments. Ignored at run time without a
//! GPU.

use std::sync::Arc;

use kernel_rt::testing::{gpu_cases, gpu_trial, run_trials, upload, OrFail};
use kernel_rt::{Gpu, Strided, StridedMut};
use paged_attention::merge::{apply_sinks, merge_states};
use paged_attention::{HalfDtype, MergeStatesArgs, MergeStatesKernel};
use rand::{Rng, SeedableRng};

/// One random merge: `k` parts of `[rows, h, d]`, stored with padded strides.
struct MergeCase {
    dtype: HalfDtype,
    k: usize,
    rows: usize,
    h: usize,
    d: usize,
    /// Element strides of a part's `[rows, h, d]` and between parts.
    o_strides: [usize; 4],
    /// Bits of every part's `O` (`o_strides` layout).
    o: Vec<u16>,
    /// `[k, rows, h]` contiguous.
    lse: Vec<f32>,
    sinks: Option<Vec<f32>>,
}

const POISON: u16 = 0x7fc1;

fn random_case(seed: u64) -> MergeCase {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let dtype = if r.gen_bool(0.5) {
        HalfDtype::Bf16
    } else {
        HalfDtype::F16
    };
    let k = [1, 2, 3, 4, 8, 33][r.gen_range(0..6)];
    let rows = r.gen_range(0..=12);
    let h = [1, 2, 5, 8, 16][r.gen_range(0..5)];
    let d = [2, 8, 64, 128, 256, 512][r.gen_range(0..6)];
    let pad = |r: &mut rand::rngs::StdRng| {
        if r.gen_bool(0.3) {
            2 * r.gen_range(1..4)
        } else {
            0
        }
    };
    let sh = d + pad(&mut r);
    let st = h * sh + pad(&mut r);
    let sp = rows * st + pad(&mut r);
    let o_strides = [sp, st, sh, 1];
    let mut o = vec![POISON; (k * sp).max(1)];
    let mut lse = vec![0f32; k * rows * h];
    let no_key_row = r.gen_range(0..rows.max(1));
    for i in 0..k {
        for row in 0..rows {
            for hh in 0..h {
                let l = &mut lse[(i * rows + row) * h + hh];
                *l = if row == no_key_row && r.gen_bool(0.5) || r.gen_bool(0.15) {
                    f32::NEG_INFINITY
                } else {
                    r.gen_range(-30.0f32..30.0)
                };
                for dd in 0..d {
                    let x = r.gen_range(-4.0f64..4.0);
                    o[i * sp + row * st + hh * sh + dd] = if *l == f32::NEG_INFINITY {
                        POISON // never read
                    } else {
                        dtype.from_f64(x)
                    };
                }
            }
        }
    }
    if rows > 1 && r.gen_bool(0.2) {
        lse[h] = f32::NAN; // part 0, row 1, head 0: the row is NaN
    }
    let sinks = r
        .gen_bool(0.4)
        .then(|| (0..h).map(|_| r.gen_range(-5.0f32..5.0)).collect());
    MergeCase {
        dtype,
        k,
        rows,
        h,
        d,
        o_strides,
        o,
        lse,
        sinks,
    }
}

/// The f64 merge of the case's states, `(O [rows, h, d], LSE [rows, h])`.
fn reference(c: &MergeCase) -> (Vec<f64>, Vec<f64>) {
    let (rows, h, d) = (c.rows, c.h, c.d);
    let parts: Vec<(Vec<f64>, Vec<f64>)> = (0..c.k)
        .map(|i| {
            let mut o = vec![0f64; rows * h * d];
            for row in 0..rows {
                for hh in 0..h {
                    for dd in 0..d {
                        let b = c.o
                            [i * c.o_strides[0] + row * c.o_strides[1] + hh * c.o_strides[2] + dd];
                        o[(row * h + hh) * d + dd] = c.dtype.to_f64(b);
                    }
                }
            }
            let l = c.lse[i * rows * h..(i + 1) * rows * h]
                .iter()
                .map(|&x| f64::from(x))
                .collect();
            (o, l)
        })
        .collect();
    let views: Vec<(&[f64], &[f64])> = parts.iter().map(|(o, l)| (&o[..], &l[..])).collect();
    let (mut o, mut l) = merge_states(&views, d);
    if let Some(s) = &c.sinks {
        apply_sinks(&mut o, &mut l, s, d);
    }
    (o, l)
}

/// Runs the kernel; returns the output `[rows, h, d]` bits (output strides
/// padded like the parts') and the merged LSE.
fn run(
    gpu: &Arc<Gpu>,
    kern: &MergeStatesKernel,
    c: &MergeCase,
) -> Result<(Vec<u16>, Vec<f32>), String> {
    let (rows, h, d) = (c.rows, c.h, c.d);
    let [_, st, sh, _] = c.o_strides;
    let o = upload(gpu, &c.o).or_fail("o")?;
    let lse = upload(gpu, &c.lse).or_fail("lse")?;
    let mut out = upload(gpu, &vec![POISON; (rows * st).max(1)]).or_fail("out")?;
    let mut lse_out =
        upload(gpu, &vec![f32::from_bits(0x7fa0_0000); (rows * h).max(1)]).or_fail("lse_out")?;
    let sinks = c
        .sinks
        .as_ref()
        .map(|s| upload(gpu, s))
        .transpose()
        .or_fail("sinks")?;
    {
        let mut args = MergeStatesArgs {
            o_parts: Strided::new("o_parts", o.as_view(), [c.k, rows, h, d], c.o_strides)
                .or_fail("view")?,
            lse_parts: Strided::new("lse_parts", lse.as_view(), [c.k, rows, h], [rows * h, h, 1])
                .or_fail("view")?,
            dtype: c.dtype,
            out: StridedMut::new("out", out.as_view_mut(), [rows, h, d], [st, sh, 1])
                .or_fail("view")?,
            lse_out: Some(
                StridedMut::new("lse_out", lse_out.as_view_mut(), [rows, h], [h, 1])
                    .or_fail("view")?,
            ),
            sinks: sinks
                .as_ref()
                .map(|s| Strided::contiguous("sinks", s.as_view(), [h]))
                .transpose()
                .or_fail("view")?,
        };
        kern.launch(&mut args).or_fail("launch")?;
    }
    let stream = gpu.stream();
    let got = stream.clone_dtoh(&out).or_fail("read out")?;
    let gl = stream.clone_dtoh(&lse_out).or_fail("read lse")?;
    let mut o_rows = vec![0u16; rows * h * d];
    for row in 0..rows {
        for hh in 0..h {
            for dd in 0..d {
                o_rows[(row * h + hh) * d + dd] = got[row * st + hh * sh + dd];
            }
        }
    }
    Ok((o_rows, gl[..rows * h].to_vec()))
}

/// Output within 16-bit rounding (relative L2 ≤ 1e-2 per row-head), exact
/// zeros and `−inf` where no part saw a key, NaN where an LSE is NaN, LSE
/// within 1e-5 relative.
fn check(c: &MergeCase, got: &(Vec<u16>, Vec<f32>)) -> Result<(), String> {
    let (want_o, want_l) = reference(c);
    let d = c.d;
    for i in 0..c.rows * c.h {
        let (row, hh) = (i / c.h, i % c.h);
        let g: Vec<f64> = got.0[i * d..(i + 1) * d]
            .iter()
            .map(|&b| c.dtype.to_f64(b))
            .collect();
        let w = &want_o[i * d..(i + 1) * d];
        let (gl, wl) = (f64::from(got.1[i]), want_l[i]);
        let at = || {
            format!(
                "row {row} head {hh} (k {}, D {d}, {:?}, sinks {})",
                c.k,
                c.dtype,
                c.sinks.is_some()
            )
        };
        if wl.is_nan() {
            if !gl.is_nan() || g.iter().any(|x| !x.is_nan()) {
                return Err(format!("{}: expected NaN, lse {gl}", at()));
            }
            continue;
        }
        if wl == f64::NEG_INFINITY {
            if gl != f64::NEG_INFINITY || g.iter().any(|&x| x != 0.0) {
                return Err(format!(
                    "{}: no key: lse {gl}, out {:?}",
                    at(),
                    &g[..d.min(4)]
                ));
            }
            continue;
        }
        let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
        let diff = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            .sqrt();
        let err = diff / norm.max(1e-300);
        // Values below the dtype's smallest normal (a sink far above the
        // row's logits) round to subnormals or 0: an absolute floor there.
        let tiny = match c.dtype {
            HalfDtype::Bf16 => 1.2e-38,
            HalfDtype::F16 => 6.2e-5,
        } * (d as f64).sqrt();
        let ok = (err <= 1e-2 || diff <= tiny) && (gl - wl).abs() <= 1e-5 * wl.abs().max(1.0);
        if !ok {
            return Err(format!("{}: out rel err {err:e}, lse {gl} vs {wl}", at()));
        }
    }
    Ok(())
}

fn random_merges(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kern = MergeStatesKernel::new(gpu).or_fail("load")?;
    let cases = gpu_cases(600);
    for seed in 0..u64::from(cases) {
        let c = random_case(seed);
        let got = run(gpu, &kern, &c)?;
        check(&c, &got).map_err(|e| format!("seed {seed}: {e}"))?;
    }
    println!(
        "merge_matches_the_f64_merge: {cases} cases, {} launches",
        kern.launches()
    );
    Ok(())
}

fn bad_arguments(gpu: &Arc<Gpu>) -> Result<(), String> {
    let kern = MergeStatesKernel::new(gpu).or_fail("load")?;
    let o = upload(gpu, &[0u16; 64]).or_fail("o")?;
    let lse = upload(gpu, &[0f32; 8]).or_fail("lse")?;
    let mut out = upload(gpu, &[0u16; 64]).or_fail("out")?;
    // (the argument the error must name, o_parts, lse_parts and out shapes)
    type Bad = (&'static str, [usize; 4], [usize; 3], [usize; 3]);
    let cases: [Bad; 3] = [
        ("lse_parts", [2, 2, 2, 4], [2, 2, 1], [2, 2, 4]),
        ("out", [2, 2, 2, 4], [2, 2, 2], [2, 2, 2]),
        ("o_parts", [2, 2, 2, 3], [2, 2, 2], [2, 2, 3]),
    ];
    for (arg, os, ls, outs) in cases {
        let mut a = MergeStatesArgs {
            o_parts: Strided::contiguous("o_parts", o.as_view(), os).or_fail("view")?,
            lse_parts: Strided::contiguous("lse_parts", lse.as_view(), ls).or_fail("view")?,
            dtype: HalfDtype::Bf16,
            out: StridedMut::contiguous("out", out.as_view_mut(), outs).or_fail("view")?,
            lse_out: None,
            sinks: None,
        };
        match kern.launch(&mut a) {
            Err(e) if e.to_string().contains(arg) => {}
            other => {
                return Err(format!(
                    "{arg}: expected a typed error naming it, got {other:?}"
                ))
            }
        }
    }
    if kern.launches() != 0 {
        return Err("a bad merge launched".into());
    }
    Ok(())
}

fn main() {
    run_trials(vec![
        gpu_trial("merge_matches_the_f64_merge", random_merges),
        gpu_trial("merge_bad_arguments_are_typed_errors", bad_arguments),
    ])
}
