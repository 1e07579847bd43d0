//! GPU tests of the context (prefill / chunked prefill / extend) kernel
//! against the f64 reference: the named examples on every head dim
//! and KV dtype, edge cases 14/15/20–27, ≥ 300 random ragged cases per run
//! (prefixes, windows, sinks, GQA 1..16, FP8 KV, P 1..128, decode rows mixed
//! in, empty requests, rare bad device data), outputs poisoned before each
//! launch, keys no row may see filled with NaN/Inf bytes; the sm_90a kernel's
//! TMA loads against its cp.async gather (NHD and HND pools) and its
//! persistent grid against one CTA per work item, bit for bit. Ignored at run
//! time without a GPU. `MHA_KIT_GPU_CASES` overrides the random case count.

#![allow(clippy::needless_range_loop)]

mod common;
mod context_common;

use std::sync::Arc;

use common::*;
use context_common::*;
use kernel_rt::testing::{gpu_cases, gpu_trial, run_trials, upload, OrFail};
use kernel_rt::{DeviceErrors, ErrorReport, Gpu, KernelError, Strided, StridedMut};
use paged_attention::{ContextArgs, ContextKernel, ContextKvLoad, HalfDtype, KvCache, KvDtype};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Random cases per run (the issue asks for ≥ 500).
const GPU_CASES: u32 = 500;
/// f64 reference work per random case (row·key·head·dim products).
const BUDGET: f64 = 1.2e7;

struct GpuOut {
    out: Vec<u16>,
    errors: ErrorReport,
    /// The row LSE `[num_tokens, Hq]` when the launch was asked for it.
    lse: Option<Vec<f32>>,
}

/// `Err` naming case `i` when two launches of `c` differ in any output bit
/// or in their error words.
fn same_bits(i: impl std::fmt::Display, a: &GpuOut, b: &GpuOut, c: &Case) -> Result<(), String> {
    if a.out == b.out && a.errors == b.errors {
        return Ok(());
    }
    let diff = a.out.iter().zip(&b.out).filter(|(x, y)| x != y).count();
    Err(format!(
        "case {i}: {diff} outputs differ (errors {:?} vs {:?}); {}",
        a.errors,
        b.errors,
        describe(c)
    ))
}

/// Extend cases over P 16 pages: for each shape `(D, G, Hkv, new tokens)`
/// (the `i`-th, seed `seed0 + i`) and each `(q dtype, KV dtype)`, `new
/// tokens` over a `prefix`-token prefix with `Hq = G · Hkv` heads.
fn extend_cases(
    shapes: &[(usize, usize, usize, usize)],
    dtypes: &[(HalfDtype, KvDtype)],
    prefix: usize,
    seed0: u64,
) -> Vec<Case> {
    let mut cases = Vec::new();
    for (i, &(d, g, hkv, len_q)) in shapes.iter().enumerate() {
        for &(qd, kv) in dtypes {
            cases.push(extend_case_h(
                kv,
                qd,
                d,
                g * hkv,
                hkv,
                16,
                prefix,
                len_q,
                seed0 + i as u64,
            ));
        }
    }
    cases
}

/// Runs `c` (ragged layout) through the context kernel; output poisoned first.
fn run_gpu(gpu: &Arc<Gpu>, kernel: &ContextKernel, c: &Case) -> Result<GpuOut, KernelError> {
    run_gpu_layout(gpu, kernel, c, false, false)
}

/// [`run_gpu`] with the row LSE requested into a poisoned buffer.
fn run_gpu_lse(gpu: &Arc<Gpu>, kernel: &ContextKernel, c: &Case) -> Result<GpuOut, KernelError> {
    run_gpu_layout(gpu, kernel, c, false, true)
}

/// The K/V pool of `c` (slot-major NHD bits) re-laid as HND `[pages, Hkv, P, D]`.
fn to_hnd(c: &Case, x: &[u16]) -> Vec<u16> {
    let mut y = vec![0u16; x.len()];
    for pg in 0..c.num_pages {
        for t in 0..c.p {
            for h in 0..c.hkv {
                let src = c.kv_index(pg * c.p + t, h, 0);
                let dst = ((pg * c.hkv + h) * c.p + t) * c.d;
                y[dst..dst + c.d].copy_from_slice(&x[src..src + c.d]);
            }
        }
    }
    y
}

/// [`run_gpu`] with the K/V pools in the NHD (`hnd = false`) or HND layout,
/// and the row LSE requested (`want_lse`) into a poisoned buffer.
fn run_gpu_layout(
    gpu: &Arc<Gpu>,
    kernel: &ContextKernel,
    c: &Case,
    hnd: bool,
    want_lse: bool,
) -> Result<GpuOut, KernelError> {
    let s = gpu.stream();
    let q = upload(gpu, &c.q)?;
    let mut out = upload(gpu, &vec![POISON; c.q.len()])?;
    let pt = upload(gpu, &c.page_table)?;
    let lens = upload(gpu, &c.lens)?;
    let cu = upload(gpu, &c.cu)?;
    let mut cu_k_host = vec![0i32; c.bs() + 1];
    for b in 0..c.bs() {
        cu_k_host[b + 1] = cu_k_host[b].wrapping_add(c.lens[b].max(0));
    }
    let cu_k = upload(gpu, &cu_k_host)?;
    let sinks = c.sinks.as_ref().map(|v| upload(gpu, v)).transpose()?;
    let shape = [c.num_pages, c.hkv, c.p, c.d];
    let (strides, kh, vh) = if hnd {
        assert!(c.kv_dtype != KvDtype::E4m3, "HND runs 16-bit pools only");
        let st = [c.p * c.hkv * c.d, c.p * c.d, c.d, 1];
        (
            st,
            upload(gpu, &to_hnd(c, &c.k))?,
            upload(gpu, &to_hnd(c, &c.v))?,
        )
    } else {
        (c.kv_strides(), upload(gpu, &c.k)?, upload(gpu, &c.v)?)
    };
    let kb = upload(gpu, &c.k_bytes())?;
    let vb = upload(gpu, &c.v_bytes())?;
    let mut errors = DeviceErrors::new(gpu)?;
    let n_lse = c.num_tokens * c.hq;
    let mut lse_buf = upload(gpu, &vec![f32::from_bits(LSE_POISON); n_lse.max(1)])?;
    let kv = match c.kv_dtype {
        KvDtype::E4m3 => KvCache::E4m3 {
            k: Strided::new("k_cache", kb.as_view(), shape, strides)?,
            v: Strided::new("v_cache", vb.as_view(), shape, strides)?,
        },
        kd => KvCache::Half {
            dtype: if kd == KvDtype::Bf16 {
                HalfDtype::Bf16
            } else {
                HalfDtype::F16
            },
            k: Strided::new("k_cache", kh.as_view(), shape, strides)?,
            v: Strided::new("v_cache", vh.as_view(), shape, strides)?,
        },
    };
    let qshape = [c.num_tokens, c.hq, c.d];
    let mut args = ContextArgs {
        q: Strided::contiguous("q", q.slice(0..c.q.len()), qshape)?,
        q_dtype: c.q_dtype,
        out: StridedMut::contiguous("out", out.slice_mut(0..c.q.len()), qshape)?,
        kv,
        page_table: Strided::contiguous(
            "page_table",
            pt.slice(0..c.page_table.len()),
            [c.bs(), c.m],
        )?,
        cache_seqlens: Strided::contiguous("cache_seqlens", lens.slice(0..c.bs()), [c.bs()])?,
        cu_seqlens_q: Strided::contiguous("cu_seqlens_q", cu.slice(0..c.bs() + 1), [c.bs() + 1])?,
        cu_seqlens_k: Some(Strided::contiguous(
            "cu_seqlens_k",
            cu_k.slice(0..c.bs() + 1),
            [c.bs() + 1],
        )?),
        max_q_len: c.max_q_len,
        bmm1_scale: c.bmm1,
        bmm2_scale: c.bmm2,
        window_left: c.window,
        sinks: match &sinks {
            Some(sv) => Some(Strided::contiguous("sinks", sv.slice(0..c.hq), [c.hq])?),
            None => None,
        },
        // The schedule hint: the page-table width bounds the keys.
        max_kv_len: None,
        lse: if want_lse {
            Some(StridedMut::contiguous(
                "lse",
                lse_buf.slice_mut(0..n_lse),
                [c.num_tokens, c.hq],
            )?)
        } else {
            None
        },
    };
    kernel.launch(&mut args, &mut errors)?;
    let mut out = s.clone_dtoh(&out)?;
    out.truncate(c.q.len());
    let lse = if want_lse {
        let mut v = s.clone_dtoh(&lse_buf)?;
        v.truncate(n_lse);
        Some(v)
    } else {
        None
    };
    Ok(GpuOut {
        out,
        errors: errors.read()?,
        lse,
    })
}

/// GPU vs reference (common::compare: per (row, head) relative L2 ≤ 1e-2,
/// zero rows exact, no NaN, unwritten rows still poisoned, error words equal).
fn check(gpu: &Arc<Gpu>, kernel: &ContextKernel, c: &Case) -> Result<(), String> {
    let want = c.reference();
    // Half the cases also request the row LSE (the other half runs the
    // launch without it, the production default).
    let want_lse = (c.q.len() + c.lens.len()) % 2 == 0;
    let got = run_gpu_layout(gpu, kernel, c, false, want_lse).or_fail("launch")?;
    if let Some(l) = &got.lse {
        compare_lse(c, &want, l).map_err(|e| format!("{e}; case {}", describe(c)))?;
    }
    compare(c, &want, &got.out, &got.errors).map_err(|e| format!("{e}; case {}", describe(c)))
}

/// `c` with head dim `d` (dims past the original are zero), KV dtype `kv`
/// and query/output dtype `qd` (values re-encoded).
fn widen(c: &Case, d: usize, kv: KvDtype, qd: HalfDtype) -> Case {
    let mut w = Case::new(
        kv,
        d,
        c.hq,
        c.hkv,
        c.p,
        c.num_pages,
        c.bs(),
        c.m,
        None,
        c.num_tokens,
    );
    w.q_dtype = qd;
    w.page_table.clone_from(&c.page_table);
    w.lens.clone_from(&c.lens);
    w.cu.clone_from(&c.cu);
    w.max_q_len = c.max_q_len;
    w.bmm1 = c.bmm1;
    w.bmm2 = c.bmm2;
    w.window = c.window;
    w.sinks.clone_from(&c.sinks);
    for slot in 0..c.num_pages * c.p {
        for h in 0..c.hkv {
            for dd in 0..c.d.min(d) {
                let i = c.kv_index(slot, h, dd);
                w.set_k(slot, h, dd, c.decode_kv(c.k[i]));
                w.set_v(slot, h, dd, c.decode_kv(c.v[i]));
            }
        }
    }
    for row in 0..c.num_tokens {
        for h in 0..c.hq {
            for dd in 0..c.d.min(d) {
                let x = c.q_dtype.to_f64(c.q[(row * c.hq + h) * c.d + dd]);
                w.set_q(row, h, dd, x);
            }
        }
    }
    w
}

/// Runs `c` on every head dim and KV dtype (bf16/e4m3; f16 with f16 Q) and
/// checks output elements `[row, head, dim]` plus the full comparison.
fn expect(
    gpu: &Arc<Gpu>,
    k: &ContextKernel,
    c: &Case,
    want: &[(usize, usize, usize, f64)],
) -> Result<(), String> {
    for d in [64, 128, 256] {
        for (qd, kv) in [
            (HalfDtype::Bf16, KvDtype::Bf16),
            (HalfDtype::Bf16, KvDtype::E4m3),
            (HalfDtype::F16, KvDtype::F16),
        ] {
            let w = widen(c, d, kv, qd);
            let got = run_gpu(gpu, k, &w).or_fail("launch")?;
            // Fixed values only where the cache holds them exactly (e4m3 has
            // 3 mantissa bits); the reference comparison runs for every dtype.
            let fixed: &[(usize, usize, usize, f64)] = if kv == KvDtype::E4m3 { &[] } else { want };
            for &(row, h, dd, x) in fixed {
                let v = w.q_dtype.to_f64(got.out[(row * w.hq + h) * w.d + dd]);
                let tol = 1e-2 * x.abs().max(1e-3);
                if (v - x).abs() > tol {
                    return Err(format!(
                        "D {d} {qd:?}/{kv:?}: row {row} head {h} dim {dd}: got {v}, want {x}"
                    ));
                }
            }
            compare(&w, &w.reference(), &got.out, &got.errors)
                .map_err(|e| format!("D {d} {qd:?}/{kv:?}: {e}"))?;
        }
    }
    Ok(())
}

/// NaN and +Inf bit patterns of a KV dtype.
fn nonfinite_bits(kv: KvDtype) -> (u16, u16) {
    match kv {
        KvDtype::Bf16 => (0x7FC0, 0x7F80),
        KvDtype::F16 => (0x7E00, 0x7C00),
        KvDtype::E4m3 => (0x7F, 0x7F),
    }
}

#[allow(clippy::too_many_arguments)]
/// One request, `G` heads on one KV head, `prefix` cached + `n` new tokens,
/// real K/V everywhere, page size `p` (pages scattered).
fn extend_case(
    kv: KvDtype,
    qd: HalfDtype,
    d: usize,
    g: usize,
    p: usize,
    prefix: usize,
    n: usize,
    seed: u64,
) -> Case {
    extend_case_h(kv, qd, d, g, 1, p, prefix, n, seed)
}

/// [`extend_case`] with `hkv` KV heads (`G = hq / hkv`).
#[allow(clippy::too_many_arguments)]
fn extend_case_h(
    kv: KvDtype,
    qd: HalfDtype,
    d: usize,
    hq: usize,
    hkv: usize,
    p: usize,
    prefix: usize,
    n: usize,
    seed: u64,
) -> Case {
    let len = prefix + n;
    let m = len.div_ceil(p);
    let mut c = Case::new(kv, d, hq, hkv, p, 1 + m, 1, m, None, n);
    c.q_dtype = qd;
    c.page_table = (1..=m as i32).rev().collect();
    c.lens = vec![len as i32];
    c.cu = vec![0, n as i32];
    c.max_q_len = n;
    c.bmm1 = 1.0 / (d as f32).sqrt();
    let mut r = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    fill_keys(&mut c, &mut r, 0, 0..len as i64);
    for x in c.q.iter_mut() {
        *x = qd.from_f64(rand::Rng::gen_range(&mut r, -2.0..2.0));
    }
    c
}

/// A key masked for a row never reaches it: with NaN or Inf in K or V of key
/// `t` of the extend block, every row that does not see `t` (causally, or by
/// the window) equals the reference of the all-finite case; every row that
/// sees a NaN/Inf V or a NaN K is non-finite.
fn masked_key_case(
    gpu: &Arc<Gpu>,
    k: &ContextKernel,
    base: &Case,
    t: usize,
    kind: usize,
) -> Result<(), String> {
    let want = base.reference();
    let mut c = base.clone();
    let (nan, inf) = nonfinite_bits(c.kv_dtype);
    let slot = c.slot(0, t);
    for h in 0..c.hkv {
        for dd in 0..c.d {
            let i = c.kv_index(slot, h, dd);
            match kind {
                0 => c.v[i] = nan,
                1 => c.v[i] = if dd % 2 == 0 { inf } else { c.v[i] },
                _ => c.k[i] = nan,
            }
        }
    }
    let got = run_gpu(gpu, k, &c).or_fail("launch")?;
    let len = c.lens[0] as usize;
    let n = c.cu[1] as usize;
    for row in 0..n {
        let x = len - n + row;
        let sees = t <= x && c.window.is_none_or(|w| x - t <= w as usize);
        for h in 0..c.hq {
            let base_i = (row * c.hq + h) * c.d;
            let g: Vec<f64> = got.out[base_i..base_i + c.d]
                .iter()
                .map(|&b| c.q_dtype.to_f64(b))
                .collect();
            if sees {
                if g.iter().all(|v| v.is_finite()) {
                    return Err(format!(
                        "kind {kind}: row {row} (x {x}) sees key {t} but is finite"
                    ));
                }
            } else {
                let w = &want.out[base_i..base_i + c.d];
                let err = rel_err(&g, w);
                if err.is_nan() || err > 1e-2 {
                    return Err(format!(
                        "kind {kind}: row {row} (x {x}) does not see key {t}: rel err {err:.3e}, got {:?}..",
                        &g[..4]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `false` (and a line saying so) unless the GPU is sm_90, where the sm_90a
/// experiment entries run.
fn sm90_or_skip(gpu: &Arc<Gpu>, test: &str) -> Result<bool, String> {
    let sm90 = gpu.context().compute_capability().or_fail("cc")? == (9, 0);
    if !sm90 {
        println!("{test}: not sm_90, skipped");
    }
    Ok(sm90)
}

/// A context kernel running sm_90a experiment `xv` (0: the default entry),
/// unsplit, so that its sums run in the same order as the experiments' (the
/// launcher may split the KV of a case that does not fill the GPU).
fn unsplit_kernel(gpu: &Arc<Gpu>, xv: u32) -> Result<ContextKernel, String> {
    let mut k = ContextKernel::new(gpu).or_fail("load")?;
    if xv != 0 {
        k.set_experiment(xv).or_fail("experiment entry")?;
    }
    k.set_kv_splits(Some(1));
    Ok(k)
}

fn named<F>(name: &'static str, body: F) -> libtest_mimic::Trial
where
    F: FnOnce(&Arc<Gpu>, &ContextKernel) -> Result<(), String> + Send + 'static,
{
    gpu_trial(name, move |gpu| {
        let kernel = ContextKernel::new(gpu).or_fail("load")?;
        body(gpu, &kernel)
    })
}

fn main() {
    let trials = vec![
        named("context_matches_reference_proptest", |gpu, k| {
            let cases = gpu_cases(GPU_CASES);
            let mut runner = TestRunner::new(Config {
                cases,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&any::<u64>(), |seed| {
                    let c = context_random_case(seed, BUDGET);
                    check(gpu, k, &c).map_err(|e| TestCaseError::fail(format!("seed {seed}: {e}")))
                })
                .map_err(|e| e.to_string())?;
            println!(
                "context_matches_reference_proptest: {cases} cases, {} launches",
                k.launches()
            );
            Ok(())
        }),
        named("context_long_rows_multi_tile", |gpu, k| {
            // Several q tiles and KV tiles per request, every D / dtype / P,
            // prefix + new tokens, with and without a window and sinks.
            for (seed, (d, g, p, pre, n, w)) in [
                (64usize, 4usize, 16usize, 0i32, 300usize, None),
                (128, 1, 1, 200, 130, Some(70u32)),
                (128, 8, 64, 700, 40, None),
                (256, 2, 128, 129, 200, Some(0)),
                (64, 16, 3, 65, 64, Some(63)),
                (256, 1, 16, 1000, 1, None),
            ]
            .into_iter()
            .enumerate()
            {
                for kv in [KvDtype::Bf16, KvDtype::E4m3] {
                    let len = pre + n as i32;
                    let m = (len as usize).div_ceil(p);
                    let mut c = Case::new(kv, d, g, 1, p, 1 + m, 1, m, None, n);
                    c.page_table = (1..=m as i32).rev().collect();
                    c.lens = vec![len];
                    c.cu = vec![0, n as i32];
                    c.max_q_len = n;
                    c.window = w;
                    c.sinks = (seed % 2 == 1).then(|| vec![0.3; g]);
                    c.bmm1 = 1.0 / (d as f32).sqrt();
                    let mut r =
                        <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed as u64);
                    fill_keys(&mut c, &mut r, 0, 0..i64::from(len));
                    for x in c.q.iter_mut() {
                        *x = HalfDtype::Bf16.from_f64(rand::Rng::gen_range(&mut r, -2.0..2.0));
                    }
                    check(gpu, k, &c).map_err(|e| format!("shape {seed} {kv:?}: {e}"))?;
                }
            }
            Ok(())
        }),
        named("must_pass_plain_prefill", |gpu, k| {
            let c = ctx_uniform(KvDtype::Bf16, 2, 4, 5, 5, |t| t as f64);
            let want: Vec<_> = (0..5).map(|j| (j, 0, 0, j as f64 / 2.0)).collect();
            expect(gpu, k, &c, &want)
        }),
        named("must_pass_windows", |gpu, k| {
            for (w, a, b) in [
                (Some(2), 2.0, 3.0),
                (Some(0), 3.0, 4.0),
                (Some(100), 1.5, 2.0),
                (None, 1.5, 2.0),
            ] {
                let mut c = ctx_uniform(KvDtype::Bf16, 2, 4, 5, 2, |t| t as f64);
                c.window = w;
                expect(gpu, k, &c, &[(0, 0, 0, a), (1, 0, 0, b)])?;
            }
            Ok(())
        }),
        named("must_pass_chunked_prefill_sink", |gpu, k| {
            let mut c = ctx_uniform(KvDtype::Bf16, 2, 4, 6, 2, |t| t as f64);
            c.sinks = Some(vec![0.0]);
            expect(gpu, k, &c, &[(0, 0, 0, 10.0 / 6.0), (1, 0, 0, 15.0 / 7.0)])
        }),
        named("must_pass_fewer_keys_than_rows", |gpu, k| {
            let c = ctx_uniform(KvDtype::Bf16, 2, 4, 1, 3, |t| t as f64 + 1.0);
            expect(
                gpu,
                k,
                &c,
                &[(0, 0, 0, 0.0), (1, 0, 0, 0.0), (2, 0, 0, 1.0)],
            )?;
            let mut c = ctx_uniform(KvDtype::Bf16, 2, 4, 0, 2, |t| t as f64 + 1.0);
            c.sinks = Some(vec![0.5]);
            expect(gpu, k, &c, &[(0, 0, 0, 0.0), (1, 0, 0, 0.0)])
        }),
        named("edge_14_15_prefill_and_mixed_batch", |gpu, k| {
            let mut c = uniform_weights_case(KvDtype::Bf16, 2, 1, 2, &[3, 2], None, 5, |b, t| {
                10.0 * b as f64 + t as f64
            });
            c.cu = vec![0, 3, 5];
            c.max_q_len = 3;
            let want: Vec<_> = [0.0, 0.5, 1.0, 10.0, 10.5]
                .into_iter()
                .enumerate()
                .map(|(r, x)| (r, 0, 0, x))
                .collect();
            expect(gpu, k, &c, &want)?;
            let mut c = uniform_weights_case(KvDtype::Bf16, 2, 1, 4, &[5, 8], None, 3, |b, t| {
                10.0 * b as f64 + t as f64
            });
            c.cu = vec![0, 2, 3];
            c.max_q_len = 2;
            expect(
                gpu,
                k,
                &c,
                &[(0, 0, 0, 1.5), (1, 0, 0, 2.0), (2, 0, 0, 13.5)],
            )
        }),
        named("edge_20_to_27_worked_examples", |gpu, k| {
            let c = to_ragged(worked_example(2, 2, Some(2), None, 1.0));
            expect(
                gpu,
                k,
                &c,
                &[
                    (0, 0, 0, 1.239970),
                    (0, 0, 1, 0.454335),
                    (0, 1, 0, 0.584092),
                    (1, 0, 0, 1.606178),
                    (1, 1, 1, 0.381788),
                ],
            )?;
            let c = to_ragged(worked_example(2, 1, Some(100), None, 1.0));
            expect(gpu, k, &c, &[(0, 0, 0, 1.249626), (0, 1, 0, 1.144450)])?;
            let c = to_ragged(worked_example(2, 2, Some(0), None, 1.0));
            expect(
                gpu,
                k,
                &c,
                &[(0, 0, 0, 0.0), (0, 0, 1, 2.0), (1, 0, 0, 1.0)],
            )?;
            let c = to_ragged(worked_example(2, 1, None, Some(vec![0.5, -1.0]), 1.0));
            expect(gpu, k, &c, &[(0, 0, 0, 1.092908), (0, 1, 1, 0.415891)])?;
            let c = to_ragged(worked_example(2, 1, None, None, 2.0));
            expect(gpu, k, &c, &[(0, 0, 0, 2.499252), (0, 0, 1, 0.611312)])?;
            // 23: prefix 4 + 2, W = 1 → {3,4}, {4,5}.
            let mut c = ctx_uniform(KvDtype::Bf16, 2, 4, 6, 2, |t| t as f64);
            c.window = Some(1);
            expect(gpu, k, &c, &[(0, 0, 0, 3.5), (1, 0, 0, 4.5)])?;
            // 27: Hq 8, Hkv 2: heads 0–3 read KV head 0, 4–7 KV head 1.
            let mut c = Case::new(KvDtype::Bf16, 64, 8, 2, 4, 2, 1, 1, None, 2);
            c.page_table = vec![1];
            c.lens = vec![2];
            c.cu = vec![0, 2];
            c.max_q_len = 2;
            for t in 0..2 {
                c.set_v(4 + t, 0, 0, 1.0 + t as f64);
                c.set_v(4 + t, 1, 0, 10.0 + t as f64);
            }
            let mut want = Vec::new();
            for h in 0..8 {
                let base = if h < 4 { 1.0 } else { 10.0 };
                want.push((0, h, 0, base));
                want.push((1, h, 0, base + 0.5));
            }
            expect(gpu, k, &c, &want)
        }),
        named("masked_nonfinite_keys_never_reach_a_row", |gpu, k| {
            // Causal: key 25 of a 40-token extend block over a 5-token prefix
            // (same KV tile as the rows before it); window: rows past x + W.
            for d in [64, 128, 256, 512] {
                for (qd, kv) in [
                    (HalfDtype::Bf16, KvDtype::Bf16),
                    (HalfDtype::F16, KvDtype::F16),
                    (HalfDtype::Bf16, KvDtype::E4m3),
                ] {
                    for (g, w) in [(1usize, None), (4, None), (2, Some(8u32))] {
                        let mut c = extend_case(kv, qd, d, g, 16, 5, 40, d as u64 + g as u64);
                        c.window = w;
                        for kind in 0..3 {
                            masked_key_case(gpu, k, &c, 25, kind)
                                .map_err(|e| format!("D {d} {qd:?}/{kv:?} G {g} W {w:?}: {e}"))?;
                        }
                    }
                }
            }
            // Decode rows of the issue: a verify-like block of 2 rows over L = 13,
            // V of token 12 NaN (visible to row 1 only).
            let c = extend_case(KvDtype::Bf16, HalfDtype::Bf16, 128, 4, 16, 11, 2, 7);
            masked_key_case(gpu, k, &c, 12, 0)
        }),
        named("masked_nonfinite_keys_across_tiles", |gpu, k| {
            // 260 new tokens over a 300-token prefix: work items whose rows
            // straddle a KV tile boundary, keys masked causally in the last
            // tiles and (window 100) before the window in the first ones, seen
            // by one consumer warpgroup's rows and not the other's.
            for d in [64, 128, 256] {
                for w in [None, Some(100u32)] {
                    for g in [1usize, 4] {
                        let mut c = extend_case(
                            KvDtype::Bf16,
                            HalfDtype::Bf16,
                            d,
                            g,
                            16,
                            300,
                            260,
                            11 + d as u64,
                        );
                        c.window = w;
                        for t in [250usize, 383, 400, 520] {
                            for kind in 0..2 {
                                masked_key_case(gpu, k, &c, t, kind)
                                    .map_err(|e| format!("D {d} G {g} W {w:?} key {t}: {e}"))?;
                            }
                        }
                    }
                }
            }
            Ok(())
        }),
        named("e4m3_kv_with_large_bf16_q", |gpu, k| {
            // bf16 Q far past f16's range over e4m3 K/V (a kernel that runs
            // e4m3 GEMMs in f16 must rescale such Q, and per row): rows of
            // |q| up to 3e4 (just under 2^15), 4e4, 3e6 and 1e8 (shifts of
            // 0 to 12 bits) beside ordinary rows of the same q tile all
            // match the reference. Larger |q| leave the kernel's numeric
            // range (logits of 2^30 and more in log2 units, docs/DESIGN.md):
            // at |q| = 1e20 (logits ~1e20) the row's max weight flushes to
            // zero (measured on the H200, session 5).
            for d in [64, 128, 256] {
                for (i, big) in [3.0e4f64, 4.0e4, 3.0e6, 1.0e8].into_iter().enumerate() {
                    let mut c = extend_case(
                        KvDtype::E4m3,
                        HalfDtype::Bf16,
                        d,
                        4,
                        16,
                        100,
                        70,
                        40 + i as u64,
                    );
                    let mut r = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(i as u64);
                    // Token 3, every head; token 20, head 1 (packed rows 12-15 and 81:
                    // both in the first q tile of 128 rows).
                    for (tok, heads) in [(3usize, 0..4usize), (20, 1..2)] {
                        for h in heads {
                            for x in &mut c.q[(tok * c.hq + h) * d..(tok * c.hq + h + 1) * d] {
                                *x = HalfDtype::Bf16
                                    .from_f64(big * rand::Rng::gen_range(&mut r, -1.0..1.0));
                            }
                        }
                    }
                    check(gpu, k, &c).map_err(|e| format!("D {d} |q| {big:e}: {e}"))?;
                }
            }
            Ok(())
        }),
        named("named_shapes_of_the_sm90_issue", |gpu, k| {
            // (D, G, P, prefix, n, window): one-token prompt; q rows an exact
            // multiple of the 128-row tile and one past (G 1 and 4); a window
            // smaller than one tile; P 48 with the chunk boundary mid-page;
            // P 1600 (one page holds every key).
            for (i, (d, g, p, pre, n, w)) in [
                (128usize, 1usize, 16usize, 0usize, 1usize, None),
                (128, 1, 16, 0, 128, None),
                (128, 1, 16, 0, 129, None),
                (64, 4, 16, 100, 32, None),
                (64, 4, 16, 100, 33, None),
                (256, 1, 16, 64, 256, None),
                (256, 1, 16, 64, 257, None),
                (128, 2, 16, 200, 300, Some(5u32)),
                (128, 8, 48, 70, 100, None),
                (64, 1, 1600, 1500, 200, Some(700)),
                (128, 16, 1, 33, 90, Some(63)),
            ]
            .into_iter()
            .enumerate()
            {
                for (qd, kv) in [
                    (HalfDtype::Bf16, KvDtype::Bf16),
                    (HalfDtype::F16, KvDtype::F16),
                    (HalfDtype::Bf16, KvDtype::E4m3),
                    (HalfDtype::F16, KvDtype::E4m3),
                ] {
                    let mut c = extend_case(kv, qd, d, g, p, pre, n, i as u64);
                    c.window = w;
                    check(gpu, k, &c).map_err(|e| format!("shape {i} {qd:?}/{kv:?}: {e}"))?;
                }
            }
            Ok(())
        }),
        named("tma_loads_equal_the_gather", |gpu, k| {
            // Page sizes the TMA boxes take (8..BN dividing it, a multiple
            // of BN, one contiguous page per request), both pool layouts,
            // every head dim, GQA, one and two KV heads, windows (pages left
            // of the window unmapped), a bad page id mid-sequence: the
            // outputs are bit-identical to the cp.async gather's and match
            // the reference, and (on sm_90) the launches ran TMA loads.
            let mut gather = ContextKernel::new(gpu).or_fail("load")?;
            gather.set_kv_load(ContextKvLoad::Gather);
            let mut tma = ContextKernel::new(gpu).or_fail("load")?;
            tma.set_kv_load(ContextKvLoad::Tma);
            let _ = k;
            let mut n = 0u64;
            for (i, (d, g, hkv, p, pre, len_q, w, bad)) in [
                (
                    128usize, 4usize, 2usize, 16usize, 300usize, 200usize, None, false,
                ),
                (128, 1, 1, 8, 0, 300, None, false),
                (64, 8, 2, 32, 90, 150, Some(40u32), false),
                (256, 2, 2, 16, 64, 130, None, true),
                (128, 4, 2, 64, 1000, 77, Some(300), false),
                (64, 1, 2, 128, 129, 300, None, false),
                (128, 16, 1, 256, 500, 40, None, true),
                (256, 1, 1, 128, 0, 200, Some(5), false),
                (128, 2, 2, 2048, 1500, 300, None, false),
            ]
            .into_iter()
            .enumerate()
            {
                for (qd, kv) in [
                    (HalfDtype::Bf16, KvDtype::Bf16),
                    (HalfDtype::F16, KvDtype::F16),
                ] {
                    let mut c =
                        extend_case_h(kv, qd, d, g * hkv, hkv, p, pre, len_q, 100 + i as u64);
                    c.window = w;
                    if let Some(w) = w {
                        // Pages wholly left of every row's window: unmapped.
                        let lo = (pre as i64 - i64::from(w)).max(0) as usize;
                        for pg in 0..lo / p {
                            c.page_table[pg] = -1;
                        }
                    }
                    if bad {
                        let last = (pre + len_q - 1) / p;
                        c.page_table[last / 2] = c.num_pages as i32 + 7;
                    }
                    for hnd in [false, true] {
                        let a = run_gpu_layout(gpu, &gather, &c, hnd, false).or_fail("gather")?;
                        let b = run_gpu_layout(gpu, &tma, &c, hnd, false).or_fail("tma")?;
                        if a.out != b.out {
                            let diff = a.out.iter().zip(&b.out).filter(|(x, y)| x != y).count();
                            return Err(format!(
                                "shape {i} {qd:?} hnd {hnd}: {diff} outputs differ; {}",
                                describe(&c)
                            ));
                        }
                        let want = c.reference();
                        compare(&c, &want, &b.out, &b.errors)
                            .map_err(|e| format!("shape {i} {qd:?} hnd {hnd}: {e}"))?;
                        n += 1;
                    }
                }
            }
            let sm90 = gpu.context().compute_capability().or_fail("cc")? == (9, 0);
            if sm90 && tma.tma_launches() != n {
                return Err(format!(
                    "{} of {n} launches ran TMA loads",
                    tma.tma_launches()
                ));
            }
            if gather.tma_launches() != 0 {
                return Err("the gather kernel ran TMA loads".into());
            }
            println!(
                "tma_loads_equal_the_gather: {n} launch pairs, {} TMA",
                tma.tma_launches()
            );
            Ok(())
        }),
        named("o_tma_stores_equal_stores_by_threads", |gpu, k| {
            // The sm_90a epilogue's TMA stores of whole warpgroups' rows
            // (default) against stores by threads: random ragged cases (GQA
            // 1..16 and groups that do not divide 64, the partial last tile
            // of each request, rows that see no key, skipped requests, bad
            // pages) and named shapes, unsplit so that every item runs the
            // epilogue: bit-identical outputs, the same error words, the
            // reference met; on sm_90 the launches ran TMA stores.
            let _ = k;
            let mut tma = ContextKernel::new(gpu).or_fail("load")?;
            tma.set_kv_splits(Some(1));
            let mut threads = ContextKernel::new(gpu).or_fail("load")?;
            threads.set_kv_splits(Some(1));
            threads.set_o_tma(false);
            let mut cases: Vec<Case> = (0..u64::from(gpu_cases(120)))
                .map(|i| context_random_case(0x07A_0000 + i, BUDGET / 2.0))
                .collect();
            cases.extend(extend_cases(
                &[
                    (128, 4, 2, 256),
                    (128, 16, 1, 33),
                    (256, 8, 2, 200),
                    (128, 1, 4, 129),
                    (256, 2, 1, 64),
                    (128, 3, 2, 100),
                ],
                &[
                    (HalfDtype::Bf16, KvDtype::Bf16),
                    (HalfDtype::Bf16, KvDtype::E4m3),
                ],
                70,
                300,
            ));
            for (i, c) in cases.iter().enumerate() {
                let a = run_gpu(gpu, &threads, c).or_fail("threads")?;
                let b = run_gpu(gpu, &tma, c).or_fail("tma")?;
                same_bits(i, &a, &b, c)?;
                let want = c.reference();
                compare(c, &want, &b.out, &b.errors).map_err(|e| format!("case {i}: {e}"))?;
            }
            let sm90 = gpu.context().compute_capability().or_fail("cc")? == (9, 0);
            if threads.o_tma_launches() != 0 || (sm90 && tma.o_tma_launches() == 0) {
                return Err(format!(
                    "TMA-store launches: {} (on), {} (off)",
                    tma.o_tma_launches(),
                    threads.o_tma_launches()
                ));
            }
            println!(
                "o_tma_stores_equal_stores_by_threads: {} cases, {} of {} launches with TMA stores",
                cases.len(),
                tma.o_tma_launches(),
                tma.launches()
            );
            Ok(())
        }),
        named("q_tma_loads_equal_cp_async_copies", |gpu, k| {
            // The sm_90a producer's TMA loads of Q (default, 16-bit K/V, G
            // dividing BM) against its cp.async copies: random ragged cases
            // (GQA 1..16, groups that do not divide BM, partial last tiles,
            // skipped requests, bad pages, split KV by the launcher's rule)
            // and named shapes (D 64 / 128 / 256, bf16 and f16, 16-bit and
            // e4m3 K/V; a bf16 Q over e4m3 is converted in place after its
            // boxes land): bit-identical
            // outputs and error words, the reference met. A TMA box of a
            // request's last tile also reads the next request's tokens
            // (padding rows): with every q of the batch's last request NaN,
            // the outputs stay bit-identical to the copies' (zero padding
            // rows), so no padding row reaches a stored row.
            let _ = k;
            let tma = ContextKernel::new(gpu).or_fail("load")?;
            let mut copies = ContextKernel::new(gpu).or_fail("load")?;
            copies.set_q_tma(false);
            let mut cases: Vec<Case> = (0..u64::from(gpu_cases(120)))
                .map(|i| context_random_case(0x0A7_0000 + i, BUDGET / 2.0))
                .collect();
            cases.extend(extend_cases(
                &[
                    (128, 4, 2, 200),
                    (64, 8, 1, 77),
                    (256, 2, 2, 150),
                    (128, 16, 1, 40),
                    (128, 1, 3, 129),
                    (64, 3, 2, 100),
                ],
                &[
                    (HalfDtype::Bf16, KvDtype::Bf16),
                    (HalfDtype::F16, KvDtype::F16),
                    (HalfDtype::Bf16, KvDtype::E4m3),
                    (HalfDtype::F16, KvDtype::E4m3),
                ],
                30,
                500,
            ));
            let mut poisoned = 0;
            for (i, c) in cases.iter().enumerate() {
                let a = run_gpu(gpu, &copies, c).or_fail("copies")?;
                let b = run_gpu(gpu, &tma, c).or_fail("tma")?;
                same_bits(i, &a, &b, c)?;
                let want = c.reference();
                compare(c, &want, &b.out, &b.errors).map_err(|e| format!("case {i}: {e}"))?;
                let nreq = c.cu.len() - 1;
                let (lo, hi) = (c.cu[nreq.saturating_sub(1)], c.cu[nreq]);
                if nreq >= 2 && 0 <= lo && lo < hi && hi as usize <= c.num_tokens {
                    let mut nan = c.clone();
                    let row = nan.hq * nan.d;
                    for x in &mut nan.q[lo as usize * row..hi as usize * row] {
                        *x = 0x7FC0;
                    }
                    let a = run_gpu(gpu, &copies, &nan).or_fail("copies, NaN q")?;
                    let b = run_gpu(gpu, &tma, &nan).or_fail("tma, NaN q")?;
                    same_bits(format!("{i} (last request's q NaN)"), &a, &b, &nan)?;
                    poisoned += 1;
                }
            }
            let sm90 = gpu.context().compute_capability().or_fail("cc")? == (9, 0);
            if copies.q_tma_launches() != 0 || (sm90 && tma.q_tma_launches() == 0) {
                return Err(format!(
                    "TMA Q launches: {} (on), {} (off)",
                    tma.q_tma_launches(),
                    copies.q_tma_launches()
                ));
            }
            println!(
                "q_tma_loads_equal_cp_async_copies: {} cases ({poisoned} also with NaN q in the last request), {} of {} launches with TMA Q",
                cases.len(),
                tma.q_tma_launches(),
                tma.launches()
            );
            Ok(())
        }),
        named("duo_entries_equal_the_reference", |gpu, k| {
            // The sm_90a two-CTA entries (16-bit KV, D 64 / 128: 64-row items
            // over 64-key tiles, two CTAs per SM) forced on, and the one-CTA
            // entries forced off, against the reference (outputs and row
            // LSE): random ragged cases (GQA 1..16, windows, sinks, bad
            // pages, skipped requests, rows that see no key; e4m3 and D 256
            // cases run the one-CTA entries either way), named shapes, and
            // keys masked causally or by the window holding NaN / Inf. The
            // duo persistent grid capped at
            // 1..8 CTAs (each walks many items) gives the bits of one CTA
            // per item.
            let _ = k;
            let mut on = ContextKernel::new(gpu).or_fail("load")?;
            on.set_duo(Some(true));
            let mut off = ContextKernel::new(gpu).or_fail("load")?;
            off.set_duo(Some(false));
            let mut one = ContextKernel::new(gpu).or_fail("load")?;
            one.set_duo(Some(true));
            one.set_variant(2);
            let mut pers = ContextKernel::new(gpu).or_fail("load")?;
            pers.set_duo(Some(true));
            let mut cases: Vec<Case> = (0..u64::from(gpu_cases(120)))
                .map(|i| context_random_case(0xD0_0000 + i, BUDGET / 2.0))
                .collect();
            cases.extend(extend_cases(
                &[
                    (128, 4, 2, 200),
                    (64, 8, 1, 77),
                    (128, 16, 1, 40),
                    (128, 1, 3, 129),
                    (64, 3, 2, 100),
                    (128, 2, 2, 64),
                    (64, 4, 2, 1000),
                    (128, 5, 1, 333),
                ],
                &[
                    (HalfDtype::Bf16, KvDtype::Bf16),
                    (HalfDtype::F16, KvDtype::F16),
                ],
                30,
                700,
            ));
            // Forced off, only an LSE launch at D 64 with 16-bit KV may run
            // a duo entry (the three-consumer entries carry no LSE).
            let mut off_duo_allowed = 0;
            for (i, c) in cases.iter().enumerate() {
                let want = c.reference();
                let off_before = off.duo_launches();
                for (name, kern) in [("duo", &on), ("one-CTA entries", &off)] {
                    let got = run_gpu_lse(gpu, kern, c).or_fail(name)?;
                    compare(c, &want, &got.out, &got.errors)
                        .map_err(|e| format!("case {i} ({name}): {e}; {}", describe(c)))?;
                    if let Some(l) = &got.lse {
                        compare_lse(c, &want, l)
                            .map_err(|e| format!("case {i} ({name}): {e}; {}", describe(c)))?;
                    }
                }
                let off_duo = off.duo_launches() - off_before;
                if c.d == 64 && c.kv_dtype != KvDtype::E4m3 {
                    off_duo_allowed += off_duo;
                } else if off_duo != 0 {
                    return Err(format!(
                        "case {i}: duo forced off ran {off_duo} duo launches; {}",
                        describe(c)
                    ));
                }
                pers.set_max_ctas(Some([1, 2, 3, 5, 8][i % 5]));
                let a = run_gpu(gpu, &one, c).or_fail("duo, one CTA per item")?;
                let b = run_gpu(gpu, &pers, c).or_fail("duo, persistent")?;
                same_bits(i, &a, &b, c)?;
            }
            for d in [64, 128] {
                for qd in [HalfDtype::Bf16, HalfDtype::F16] {
                    let kv = if qd == HalfDtype::Bf16 {
                        KvDtype::Bf16
                    } else {
                        KvDtype::F16
                    };
                    for (g, w) in [(1usize, None), (4, None), (2, Some(8u32)), (16, Some(70))] {
                        let mut c = extend_case(kv, qd, d, g, 16, 5, 140, d as u64 + g as u64);
                        c.window = w;
                        for kind in 0..3 {
                            for t in [25, 100] {
                                for (name, kern) in [("duo", &on), ("one-CTA entries", &off)] {
                                    masked_key_case(gpu, kern, &c, t, kind).map_err(|e| {
                                        format!("{name} D {d} {qd:?} G {g} W {w:?} key {t}: {e}")
                                    })?;
                                }
                            }
                        }
                    }
                }
            }
            let sm90 = gpu.context().compute_capability().or_fail("cc")? == (9, 0);
            if off.duo_launches() != off_duo_allowed
                || (sm90 && (on.duo_launches() == 0 || pers.duo_launches() == 0))
            {
                return Err(format!(
                    "duo launches: {} (on), {} (persistent), {} (off)",
                    on.duo_launches(),
                    pers.duo_launches(),
                    off.duo_launches()
                ));
            }
            println!(
                "duo_entries_equal_the_reference: {} cases, {} of {} launches on the duo entries",
                cases.len(),
                on.duo_launches(),
                on.launches()
            );
            Ok(())
        }),
        named("persistent_grid_equals_one_cta_per_item", |gpu, k| {
            // The default persistent grid capped at 1..8 CTAs (each walks
            // many items: skipped requests, tiles past a request's rows,
            // rows that see no key, the rings and Q buffer carried across
            // items), also under the ping-pong schedule variant (1), and the
            // one-CTA-per-item grid give the same bits.
            let _ = k;
            let mut one = ContextKernel::new(gpu).or_fail("load")?;
            one.set_variant(2);
            let mut pers = ContextKernel::new(gpu).or_fail("load")?;
            let cases = gpu_cases(120);
            for i in 0..u64::from(cases) {
                let c = context_random_case(0x5EED_0000 + i, BUDGET / 2.0);
                pers.set_max_ctas(Some([1, 2, 3, 5, 8][i as usize % 5]));
                pers.set_variant([0, 1][i as usize % 2]);
                let a = run_gpu(gpu, &one, &c).or_fail("one CTA per item")?;
                let b = run_gpu(gpu, &pers, &c).or_fail("persistent")?;
                same_bits(i, &a, &b, &c)?;
                let want = c.reference();
                compare(&c, &want, &b.out, &b.errors).map_err(|e| format!("case {i}: {e}"))?;
            }
            println!("persistent_grid_equals_one_cta_per_item: {cases} cases");
            Ok(())
        }),
        named("trimmed_last_tiles_equal_whole_ones", |gpu, k| {
            // The default sm_90a kernel runs an item's last KV tile as its
            // first half for a consumer warpgroup whose rows all lie before
            // the tile's middle (the causal diagonal: TRIM in the kernel);
            // schedule variant 4 runs every tile whole. Both on random
            // ragged cases (windows, sinks, GQA, page sizes, bad pages, e4m3
            // KV, every D) and on one request of each D 64 / 128 / 256 and
            // dtype pair (GQA 4, two KV heads) whose new tokens end at each
            // quarter of a 128-key tile and past it (at D 256, 64-key tiles:
            // at each half of one, the trimmed tile never an item's first),
            // with no prefix and a 37-token one: the same bits (the trimmed
            // keys only added zero weights), and the reference.
            let _ = k;
            let trimmed = ContextKernel::new(gpu).or_fail("load")?;
            let mut whole = ContextKernel::new(gpu).or_fail("load")?;
            whole.set_variant(4);
            let n = gpu_cases(120);
            let mut cases: Vec<Case> = (0..u64::from(n))
                .map(|i| context_random_case(0x7819_0000 + i, BUDGET / 2.0))
                .collect();
            let dtypes = [
                (HalfDtype::Bf16, KvDtype::Bf16),
                (HalfDtype::F16, KvDtype::F16),
                (HalfDtype::Bf16, KvDtype::E4m3),
                (HalfDtype::F16, KvDtype::E4m3),
            ];
            // A small case budget (the sanitizer runs): the first pair only.
            let pairs = if n < 16 { 1 } else { dtypes.len() };
            for (j, &(qd, kv)) in dtypes.iter().enumerate().take(pairs) {
                for (m, &d) in [64usize, 128, 256].iter().enumerate() {
                    for (n, &new) in [32usize, 64, 96, 128, 129, 161].iter().enumerate() {
                        for prefix in [0usize, 37] {
                            let seed = 0x7819_1000 + (1000 * j + 100 * m + 10 * n + prefix) as u64;
                            cases.push(extend_case_h(kv, qd, d, 8, 2, 16, prefix, new, seed));
                        }
                    }
                }
            }
            for (i, c) in cases.iter().enumerate() {
                let a = run_gpu(gpu, &trimmed, c).or_fail("trimmed")?;
                let b = run_gpu(gpu, &whole, c).or_fail("whole")?;
                same_bits(i, &a, &b, c)?;
                let want = c.reference();
                compare(c, &want, &a.out, &a.errors).map_err(|e| format!("case {i}: {e}"))?;
            }
            println!("trimmed_last_tiles_equal_whole_ones: {} cases", cases.len());
            Ok(())
        }),
        named("kv_split_equals_the_reference", |gpu, k| {
            // Split KV forced to 2..16 chunks per item (every chunk writes
            // its partial rows, the merge entry finishes them): random
            // ragged cases (windows, sinks, GQA, bad pages, rows that see no
            // key, skipped requests) against the reference, with the same
            // error words as the unsplit kernel, and the merge's row LSE
            // against the reference; and the long-prefix shape.
            let _ = k;
            let one = ContextKernel::new(gpu).or_fail("load")?;
            let mut split = ContextKernel::new(gpu).or_fail("load")?;
            let cases = gpu_cases(120);
            let mut n = 0u64;
            for i in 0..u64::from(cases) {
                let c = context_random_case(0x5B1_0000 + i, BUDGET / 2.0);
                split.set_kv_splits(Some([2, 3, 5, 16][i as usize % 4]));
                let a = run_gpu(gpu, &one, &c).or_fail("unsplit")?;
                let before = split.launches();
                let b = run_gpu_lse(gpu, &split, &c).or_fail("split")?;
                n += split.launches() - before - 1;
                if a.errors != b.errors {
                    return Err(format!(
                        "case {i}: errors {:?} vs {:?}; {}",
                        a.errors,
                        b.errors,
                        describe(&c)
                    ));
                }
                let want = c.reference();
                compare(&c, &want, &b.out, &b.errors).map_err(|e| format!("case {i}: {e}"))?;
                if let Some(l) = &b.lse {
                    compare_lse(&c, &want, l).map_err(|e| format!("case {i}: {e}"))?;
                }
            }
            // A prefix of 40 tiles, 2 q tiles: the launcher's own rule splits it.
            let mut auto = ContextKernel::new(gpu).or_fail("load")?;
            auto.set_kv_splits(None);
            let c = extend_case(KvDtype::Bf16, HalfDtype::Bf16, 128, 4, 8, 5000, 40, 21);
            let before = auto.launches();
            check(gpu, &auto, &c)?;
            let merges = auto.launches() - before - 1;
            let sm90 = gpu.context().compute_capability().or_fail("cc")? == (9, 0);
            if sm90 && (n == 0 || merges != 1) {
                return Err(format!(
                    "{n} forced merges, {merges} by the launcher's rule"
                ));
            }
            println!("kv_split_equals_the_reference: {cases} cases, {n} merged");
            Ok(())
        }),
        named("gather_wide_address_products_equal_narrow", |gpu, k| {
            // The gather's 64-bit address products (`set_narrow(false)`: the
            // path of launches whose K / V offsets or page-table indices do
            // not fit i32) against the default 32-bit ones, bit for bit
            // (the same rows land in the same slots), on 16-bit and e4m3
            // K/V at every head dim, and both against the reference.
            let _ = k;
            if !sm90_or_skip(gpu, "gather_wide_address_products_equal_narrow")? {
                return Ok(());
            }
            let base = unsplit_kernel(gpu, 0)?;
            let cases = gpu_cases(60);
            let mut wide = unsplit_kernel(gpu, 0)?;
            wide.set_narrow(false);
            for i in 0..u64::from(cases) {
                let r = context_random_case(0xE4_8000 + i, BUDGET / 2.0);
                let d = [64, 128, 256][i as usize % 3];
                let kv = [KvDtype::Bf16, KvDtype::E4m3][(i as usize / 3) % 2];
                let c = widen(&r, d, kv, HalfDtype::Bf16);
                let a = run_gpu(gpu, &base, &c).or_fail("default")?;
                let got = run_gpu(gpu, &wide, &c).or_fail("64-bit products")?;
                compare(&c, &c.reference(), &got.out, &got.errors)
                    .map_err(|e| format!("case {i}: {e}; {}", describe(&c)))?;
                if a.out != got.out || a.errors != got.errors {
                    return Err(format!(
                        "case {i}: 64-bit address products differ from 32-bit ones; {}",
                        describe(&c)
                    ));
                }
            }
            println!("gather_wide_address_products_equal_narrow: {cases} cases");
            Ok(())
        }),
        named("experiment_entries_with_correct_results", |gpu, k| {
            // The bench's experiments that keep results correct (512: no V
            // scan (the random cases hold finite V); 8: traced) against the
            // reference on bf16 cases, also under ping-pong; 8 equals the
            // default bit for bit (the same code with clock stamps). 64, 72,
            // 128, 4096 and 16384 were dropped in session 28, 16, 32 and 40
            // in session 44 (concluded; PERF.md).
            let _ = k;
            if !sm90_or_skip(gpu, "experiment_entries_with_correct_results")? {
                return Ok(());
            }
            let base = unsplit_kernel(gpu, 0)?;
            let cases = gpu_cases(60);
            let entries = [8u32, 512];
            for xv in entries {
                let mut x = unsplit_kernel(gpu, xv)?;
                for i in 0..u64::from(cases) {
                    let r = context_random_case(0xE4_0000 + i, BUDGET / 2.0);
                    let c = widen(&r, 128, KvDtype::Bf16, HalfDtype::Bf16);
                    x.set_variant([0, 1][i as usize % 2]);
                    let got = run_gpu(gpu, &x, &c).or_fail("experiment")?;
                    let want = c.reference();
                    compare(&c, &want, &got.out, &got.errors)
                        .map_err(|e| format!("xv {xv} case {i}: {e}; {}", describe(&c)))?;
                    if xv == 8 {
                        let a = run_gpu(gpu, &base, &c).or_fail("default")?;
                        if a.out != got.out {
                            return Err(format!(
                                "xv {xv} case {i}: differs from the default; {}",
                                describe(&c)
                            ));
                        }
                    }
                }
            }
            println!(
                "experiment_entries_with_correct_results: {} entries × {cases} cases",
                entries.len()
            );
            Ok(())
        }),
        named("d128_cases_on_capped_persistent_grids", |gpu, k| {
            // The default sm_90a kernel (unsplit) against the reference on
            // the case set of the former pair experiment's test (session 41
            // removed that experiment; its case 236 of 500 failed there):
            // random ragged cases widened to D 128 bf16, extend cases whose
            // neighbouring q tiles need different KV tiles (G 1 / 3 / 5 / 16,
            // prefixes off the tile, windows), the persistent grid capped at
            // 2 ... 16 CTAs (a CTA takes many items of different requests in
            // turn), and NaN / Inf in keys that a neighbouring q tile sees
            // and this one does not.
            let _ = k;
            if !sm90_or_skip(gpu, "d128_cases_on_capped_persistent_grids")? {
                return Ok(());
            }
            let mut base = unsplit_kernel(gpu, 0)?;
            let mut cases: Vec<Case> = (0..u64::from(gpu_cases(200)))
                .map(|i| {
                    let r = context_random_case(0xA2_0000 + i, BUDGET / 2.0);
                    widen(&r, 128, KvDtype::Bf16, HalfDtype::Bf16)
                })
                .collect();
            for (g, hkv, prefix, n) in [
                (1usize, 1usize, 5usize, 140usize),
                (1, 2, 100, 300),
                (3, 1, 77, 130),
                (4, 2, 129, 200),
                (5, 1, 0, 77),
                (16, 1, 1000, 33),
                (8, 1, 63, 64),
            ] {
                for w in [None, Some(40u32), Some(200)] {
                    let mut c = extend_case_h(
                        KvDtype::Bf16,
                        HalfDtype::Bf16,
                        128,
                        g * hkv,
                        hkv,
                        [16, 1, 48][cases.len() % 3],
                        prefix,
                        n,
                        900 + cases.len() as u64,
                    );
                    c.window = w;
                    cases.push(c);
                }
            }
            for (i, c) in cases.iter().enumerate() {
                let want = c.reference();
                base.set_max_ctas([None, Some(2), Some(4), Some(6), Some(16)][i % 5]);
                let got = run_gpu(gpu, &base, c).or_fail("default")?;
                compare(c, &want, &got.out, &got.errors)
                    .map_err(|e| format!("case {i}: {e}; {}", describe(c)))?;
            }
            base.set_max_ctas(None);
            // Keys 130 / 139 are seen by the second q tile only (G 1: tile 0
            // holds rows 0..127 at positions 5..132).
            for (g, w) in [(1usize, None), (1, Some(30u32)), (3, None)] {
                let mut c = extend_case(
                    KvDtype::Bf16,
                    HalfDtype::Bf16,
                    128,
                    g,
                    16,
                    5,
                    140,
                    31 + g as u64,
                );
                c.window = w;
                for kind in 0..3 {
                    for t in [25, 130, 139] {
                        masked_key_case(gpu, &base, &c, t, kind)
                            .map_err(|e| format!("G {g} W {w:?} key {t}: {e}"))?;
                    }
                }
            }
            println!(
                "d128_cases_on_capped_persistent_grids: {} cases, {} launches",
                cases.len(),
                base.launches()
            );
            Ok(())
        }),
        named("d512_runs_the_decode_path_vs_reference", |gpu, k| {
            // Head dim 512, which no context entry serves, runs the decode
            // kernel's ragged path (tensor cores for 16-bit K/V, CUDA cores
            // for e4m3): the random context case space at D 512 against
            // the f64 reference; every third case also on a launcher
            // limited to 1..3 row tiles a launch (the multi-launch form
            // that long prompts take), whose launch count must exceed the
            // cases'.
            let cases = gpu_cases(150);
            let mut small = ContextKernel::new(gpu).or_fail("load")?;
            let (mut runs, mut multi_cases) = (0u64, 0u64);
            let before = small.launches();
            for seed in 0..cases {
                let c = context_random_case_with(
                    0xD512_C000 + u64::from(seed),
                    BUDGET / 2.0,
                    Some(512),
                );
                check(gpu, k, &c).map_err(|e| format!("seed {seed}: {e}"))?;
                if seed % 3 == 0 {
                    small.set_decode_path_row_tiles(Some(1 + (seed as usize / 3) % 3));
                    check(gpu, &small, &c)
                        .map_err(|e| format!("seed {seed}, few row tiles a launch: {e}"))?;
                    multi_cases += 1;
                }
                runs += 1;
            }
            let launches = small.launches() - before;
            if launches <= multi_cases {
                return Err(format!(
                    "{launches} launches for {multi_cases} cases: the multi-launch form never ran"
                ));
            }
            println!(
                "d512_runs_the_decode_path_vs_reference: {runs} cases, {multi_cases} also in {launches} launches of few row tiles"
            );
            Ok(())
        }),
        named("d256_q4097_over_3000_prefix", |gpu, k| {
            let c = extend_case(KvDtype::Bf16, HalfDtype::Bf16, 256, 1, 16, 3000, 4097, 11);
            check(gpu, k, &c)
        }),
        named("bad_arguments_are_errors_before_launch", |gpu, k| {
            let c = ctx_uniform(KvDtype::Bf16, 64, 4, 5, 5, |t| t as f64);
            let mut bad = c.clone();
            bad.hq = 17;
            bad.q = vec![0; bad.num_tokens * 17 * 64];
            match run_gpu(gpu, k, &bad) {
                Err(KernelError::Unsupported { .. }) => {}
                other => return Err(format!("group 17 accepted: {:?}", other.map(|_| ()))),
            }
            let mut bad = c.clone();
            bad.q_dtype = HalfDtype::F16; // f16 q with a bf16 cache
            match run_gpu(gpu, k, &bad) {
                Err(KernelError::Unsupported { .. }) => {}
                other => return Err(format!("mixed dtypes accepted: {:?}", other.map(|_| ()))),
            }
            if k.launches() != 0 {
                return Err("a rejected call launched".into());
            }
            Ok(())
        }),
    ];
    run_trials(trials)
}
