//! GPU tests of the paged-attention family against the f64 reference: the
//! issue's named examples, ≥ 1,000 random cases (every dtype pair, head dim,
//! group, page size, layout, window, sinks, split mode, bad device data),
//! outputs poisoned before each launch, keys no row may see filled with
//! NaN/Inf bytes. Ignored at run time without a GPU.

#![allow(clippy::needless_range_loop)]

mod common;

use std::sync::Arc;

use common::*;
use kernel_rt::cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use kernel_rt::testing::{gpu_trial, run_trials, upload, OrFail};
use kernel_rt::{DeviceErrors, ErrorReport, Gpu, KernelError, Strided, StridedMut};
use paged_attention::{
    pair_loop_variant, workspace_for, DecodeArgs, HalfDtype, KernelPath, KvCache, KvDtype,
    PagedAttentionKernel, QueryLayout, SplitMode,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const GPU_CASES: u32 = 1_200;

/// `MHA_KIT_GPU_CASES` (a smaller case set for the sanitizers), else `default`.
fn env_cases(default: u64) -> u64 {
    std::env::var("MHA_KIT_GPU_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct GpuOut {
    out: Vec<u16>,
    errors: ErrorReport,
    /// The workspace's split counters after the launch (must all be 0).
    counters: Vec<u32>,
    /// `[num_tokens, Hq]` row LSE, when requested.
    lse: Option<Vec<f32>>,
}

/// Split counters of a launch: the last `bs·Hkv·row_tiles` workspace elements.
/// Seed `seed` of a test's case list: [`random_case`] for the first `n`,
/// then the head-dim-512 draw ([`random_case_with`]), so the tests of the
/// tensor-core paths reach its D 512 entries (outside the random draw).
fn case_or_d512(seed: u64, n: u64) -> (Case, SplitMode, usize) {
    if seed < n {
        random_case(seed)
    } else {
        random_case_with(seed, Some(512))
    }
}

/// Whether launcher `k` runs `c` on the tensor-core kernel (its Auto
/// choice: an entry exists, and the dim-splitting ones only with
/// `set_wide_mma(true)`).
fn runs_mma(k: &PagedAttentionKernel, c: &Case) -> bool {
    paged_attention::mma_supported(c.q_dtype, c.kv_dtype, c.d)
        && (k.wide_mma() || !paged_attention::mma_wide(c.kv_dtype, c.d))
}

fn counter_count(c: &Case) -> usize {
    c.bs() * c.hkv * (c.q_len() * (c.hq / c.hkv)).div_ceil(16)
}

/// A NaN-poisoned workspace of `need` elements whose counters are zero (the
/// caller's one-time zeroing); one element when no workspace is needed.
fn fresh_workspace(need: usize, counters: usize) -> Vec<f32> {
    let mut v = vec![f32::NAN; need.max(1)];
    if need > 0 {
        for x in &mut v[need - counters..need] {
            *x = 0.0;
        }
    }
    v
}

/// Runs `c` on the GPU. `ws`: the workspace to use (kept across calls by
/// the determinism test); a fresh NaN-filled one otherwise.
fn run_gpu(
    gpu: &Arc<Gpu>,
    kernel: &PagedAttentionKernel,
    c: &Case,
    split: SplitMode,
    max_seq_len: usize,
    ws: Option<&mut CudaSlice<f32>>,
) -> Result<GpuOut, KernelError> {
    run_gpu_with(gpu, kernel, c, split, max_seq_len, ws, false)
}

/// Workspace elements (`f32`) case `c` needs under `split` and
/// `max_seq_len` ([`workspace_for`]).
fn case_workspace(
    c: &Case,
    split: SplitMode,
    max_seq_len: usize,
    num_sms: usize,
) -> Result<usize, KernelError> {
    workspace_for(
        c.bs(),
        c.hq,
        c.hkv,
        c.d,
        c.q_len(),
        max_seq_len,
        split,
        num_sms,
    )
}

/// The split counters at the end of a workspace of `need` elements (the
/// last `n_ctr`; none when the launch needed no workspace), as bits.
fn split_counters(
    gpu: &Arc<Gpu>,
    ws: &CudaSlice<f32>,
    need: usize,
    n_ctr: usize,
) -> Result<Vec<u32>, KernelError> {
    if need == 0 {
        return Ok(Vec::new());
    }
    let tail = gpu.stream().clone_dtoh(&ws.slice(need - n_ctr..need))?;
    Ok(tail.iter().map(|x| x.to_bits()).collect())
}

/// [`run_gpu`], with the row LSE requested into a poisoned buffer when `want_lse`.
fn run_gpu_with(
    gpu: &Arc<Gpu>,
    kernel: &PagedAttentionKernel,
    c: &Case,
    split: SplitMode,
    max_seq_len: usize,
    ws: Option<&mut CudaSlice<f32>>,
    want_lse: bool,
) -> Result<GpuOut, KernelError> {
    let s = gpu.stream();
    let dev = CaseBuffers::upload(gpu, c)?;
    let mut out = upload(gpu, &vec![POISON; c.q.len()])?;
    let need = case_workspace(c, split, max_seq_len, kernel.num_sms())?;
    let n_ctr = counter_count(c);
    let mut own_ws = if ws.is_none() {
        Some(upload(gpu, &fresh_workspace(need, n_ctr))?)
    } else {
        None
    };
    let ws: &mut CudaSlice<f32> = match ws {
        Some(w) => w,
        None => own_ws.as_mut().expect("allocated"),
    };
    let mut errors = DeviceErrors::new(gpu)?;
    let mut lse_buf = upload(gpu, &vec![f32::from_bits(LSE_POISON); c.num_tokens * c.hq])?;
    let n = c.q.len();
    let mut args = case_args(
        c,
        &dev,
        dev.q0.slice(0..n),
        out.slice_mut(0..n),
        ws,
        split,
        max_seq_len,
    )?;
    if want_lse {
        args.lse = Some(StridedMut::contiguous(
            "lse",
            lse_buf.slice_mut(0..c.num_tokens * c.hq),
            [c.num_tokens, c.hq],
        )?);
    }
    kernel.launch(&mut args, &mut errors)?;
    let mut out = s.clone_dtoh(&out)?;
    out.truncate(c.q.len());
    let counters = split_counters(gpu, ws, need, n_ctr)?;
    let lse = if want_lse {
        let mut v = s.clone_dtoh(&lse_buf)?;
        v.truncate(c.num_tokens * c.hq);
        Some(v)
    } else {
        None
    };
    Ok(GpuOut {
        out,
        errors: errors.read()?,
        counters,
        lse,
    })
}

/// GPU vs reference: per (row, head) relative L2 ≤ 1e-2 (zero rows exact),
/// unwritten rows still poisoned, error words equal, split counters zero.
fn check(
    gpu: &Arc<Gpu>,
    kernel: &PagedAttentionKernel,
    c: &Case,
    split: SplitMode,
    max_seq_len: usize,
) -> Result<(), String> {
    let want = c.reference();
    // Half the cases also request the row LSE (the other half checks the
    // launch without it, the production default).
    let want_lse = (c.q.len() + c.lens.len()) % 2 == 0;
    let got = run_gpu_with(gpu, kernel, c, split, max_seq_len, None, want_lse).or_fail("launch")?;
    if let Some(l) = &got.lse {
        compare_lse(c, &want, l)
            .map_err(|e| format!("{e}; split {split:?}, case {}", describe(c)))?;
    }
    if got.counters.iter().any(|&x| x != 0) {
        return Err(format!(
            "split counters not zero after the launch: {:?}; split {split:?}, case {}",
            got.counters,
            describe(c)
        ));
    }
    compare(c, &want, &got.out, &got.errors)
        .map_err(|e| format!("{e}; split {split:?}, case {}", describe(c)))
}

fn named<F>(name: &'static str, body: F) -> libtest_mimic::Trial
where
    F: FnOnce(&Arc<Gpu>, &PagedAttentionKernel) -> Result<(), String> + Send + 'static,
{
    gpu_trial(name, move |gpu| {
        let kernel = PagedAttentionKernel::new(gpu).or_fail("load")?;
        body(gpu, &kernel)
    })
}

/// Runs `c` with every split mode and checks output element `[row, head, 0]`.
fn expect(
    gpu: &Arc<Gpu>,
    k: &PagedAttentionKernel,
    c: &Case,
    want: &[(usize, usize, f64)],
) -> Result<(), String> {
    let max_len = c.lens.iter().copied().max().unwrap_or(1).max(1) as usize;
    let simt = PagedAttentionKernel::with_path(gpu, KernelPath::Simt).or_fail("load")?;
    for (k, split) in [k, &simt].into_iter().flat_map(|k| {
        [
            SplitMode::Auto,
            SplitMode::Fixed { chunk_tokens: 1 },
            SplitMode::Fixed { chunk_tokens: 2 },
            SplitMode::Fixed { chunk_tokens: 4096 },
            SplitMode::Chunked {
                chunk_tokens: 2,
                max_splits: 3,
            },
        ]
        .map(|s| (k, s))
    }) {
        let got = run_gpu(gpu, k, c, split, max_len, None).or_fail("launch")?;
        for &(row, h, w) in want {
            let v = c.q_dtype.to_f64(got.out[(row * c.hq + h) * c.d]);
            let tol = 1e-2 * w.abs().max(1e-3);
            if (v - w).abs() > tol {
                return Err(format!(
                    "{:?} {split:?}: row {row} head {h}: got {v}, want {w}",
                    k.path()
                ));
            }
        }
        if got.counters.iter().any(|&x| x != 0) {
            return Err(format!(
                "{split:?}: counters {:?} after a launch",
                got.counters
            ));
        }
        compare(c, &c.reference(), &got.out, &got.errors).map_err(|e| format!("{split:?}: {e}"))?;
    }
    Ok(())
}

/// A verify block of 2 rows over L 13 (positions 11 and 12), random finite
/// Q / K / V, one KV head of `g` query heads, pages of `p` tokens in a
/// shuffled order; `window_left` as given.
fn verify_pair_case(
    q_dtype: HalfDtype,
    kv: KvDtype,
    d: usize,
    g: usize,
    p: usize,
    window: Option<u32>,
    seed: u64,
) -> Case {
    use rand::{Rng, SeedableRng};
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let len = 13usize;
    let m = len.div_ceil(p);
    let num_pages = m + 2;
    let mut c = Case::new(kv, d, g, 1, p, num_pages, 1, m, Some(2), 2);
    c.q_dtype = q_dtype;
    c.lens = vec![len as i32];
    for e in 0..m {
        c.page_table[e] = (num_pages - 1 - e) as i32;
    }
    for pos in 0..len {
        let slot = c.slot(0, pos);
        for dd in 0..d {
            let (kx, vx) = (r.gen_range(-1.0..1.0), r.gen_range(-1.0..1.0));
            c.set_k(slot, 0, dd, kx);
            c.set_v(slot, 0, dd, vx);
        }
    }
    for x in c.q.iter_mut() {
        *x = q_dtype.from_f64(r.gen_range(-2.0..2.0));
    }
    c.bmm1 = 1.0 / (d as f32).sqrt();
    c.window = window;
    c
}

/// Issue 14's masked-key rule on the decode / verify kernels: in a verify
/// block of 2 rows over L 13, NaN / Inf in V (and NaN in K) of a key that one
/// row sees and the other must not (token 12: causally masked for row 0;
/// token 8 with window_left 3: outside row 1's window) reaches only the row
/// that sees it. The other row is finite and equals the reference of the
/// case with finite values there; the row that sees a non-finite V is
/// non-finite in those dims. Both kernel paths, several split modes.
fn masked_nonfinite_keys(gpu: &Arc<Gpu>, k: &PagedAttentionKernel) -> Result<(), String> {
    let simt = PagedAttentionKernel::with_path(gpu, KernelPath::Simt).or_fail("load")?;
    let mut runs = 0usize;
    for kv in [KvDtype::Bf16, KvDtype::F16, KvDtype::E4m3] {
        let (nan, inf) = nonfinite_bits(kv);
        for d in [64, 128, 256, 512] {
            for (g, p) in [(1, 16), (4, 1), (8, 48)] {
                // (window, poisoned key, the row that sees it, the row that must not)
                for (window, key, sees, blind) in
                    [(None, 12usize, 1usize, 0usize), (Some(3), 8, 0, 1)]
                {
                    let seed = (d * 31 + g * 7 + p) as u64 + key as u64 * 1000;
                    // 16-bit KV takes the Q dtype; e4m3 runs under both.
                    let q_dtype = match kv {
                        KvDtype::F16 => HalfDtype::F16,
                        KvDtype::E4m3 if d == 128 => HalfDtype::F16,
                        _ => HalfDtype::Bf16,
                    };
                    let c = verify_pair_case(q_dtype, kv, d, g, p, window, seed);
                    let want = c.reference();
                    let slot = c.slot(0, key);
                    // Non-finite V (both rows checked), then NaN K (only the
                    // blind row: how a NaN score of a seen key spreads is not
                    // this test's subject).
                    let mut bad_v = c.clone();
                    for (dd, bits) in [(0, nan), (1, inf), (d - 1, nan)] {
                        let i = bad_v.kv_index(slot, 0, dd);
                        bad_v.v[i] = bits;
                    }
                    let mut bad_k = c.clone();
                    let i = bad_k.kv_index(slot, 0, 2);
                    bad_k.k[i] = nan;
                    for (bad, check_seen) in [(&bad_v, true), (&bad_k, false)] {
                        for kern in [k, &simt] {
                            for split in [
                                SplitMode::Auto,
                                SplitMode::Fixed { chunk_tokens: 1 },
                                SplitMode::Fixed { chunk_tokens: 4 },
                                SplitMode::Chunked {
                                    chunk_tokens: 2,
                                    max_splits: 3,
                                },
                            ] {
                                let got =
                                    run_gpu(gpu, kern, bad, split, 13, None).or_fail("launch")?;
                                runs += 1;
                                let at = |row: usize, h: usize, dd: usize| {
                                    c.q_dtype.to_f64(got.out[(row * c.hq + h) * d + dd])
                                };
                                let ctx = || {
                                    format!(
                                    "{:?} {split:?}: kv {kv:?} D {d} G {g} P {p} window {window:?}, {} of key {key} NaN/Inf",
                                    kern.path(),
                                    if check_seen { "V" } else { "K" }
                                )
                                };
                                for h in 0..g {
                                    let gv: Vec<f64> = (0..d).map(|dd| at(blind, h, dd)).collect();
                                    let base = (blind * c.hq + h) * d;
                                    let err = rel_err(&gv, &want.out[base..base + d]);
                                    if gv.iter().any(|x| !x.is_finite()) || err > 1e-2 {
                                        return Err(format!(
                                        "{}: row {blind} head {h} must not see the key: rel err {err:.3e}, got {:?}..",
                                        ctx(),
                                        &gv[..4]
                                    ));
                                    }
                                    for dd in [0, 1, d - 1] {
                                        if check_seen && at(sees, h, dd).is_finite() {
                                            return Err(format!(
                                            "{}: row {sees} head {h} dim {dd} sees the non-finite V but is {}",
                                            ctx(),
                                            at(sees, h, dd)
                                        ));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    println!("masked_nonfinite_keys_never_reach_a_row: {runs} launches");
    Ok(())
}

/// Launches of `kernel` chained through their outputs, queued with no host
/// synchronisation: the first reads `c`'s query rows from `q0` and writes
/// `bufs[0]`, launch `i` reads `bufs[(i - 1) % 2]` and writes `bufs[i % 2]`
/// (rows a launch does not write keep their bits). With programmatic
/// dependent launch each launch may start before the previous one ends; it
/// must still read that launch's finished output and the zeroed split
/// counters of the shared workspace.
#[allow(clippy::too_many_arguments)]
fn chain_launches(
    kernel: &PagedAttentionKernel,
    c: &Case,
    split: SplitMode,
    max_seq_len: usize,
    dev: &CaseBuffers,
    bufs: &mut [CudaSlice<u16>; 2],
    ws: &mut CudaSlice<f32>,
    errors: &mut DeviceErrors,
    launches: usize,
) -> Result<(), KernelError> {
    let n = c.q.len();
    for i in 0..launches {
        let (lo, hi) = bufs.split_at_mut(1);
        let (src, dst) = if i % 2 == 0 {
            (&hi[0], &mut lo[0])
        } else {
            (&lo[0], &mut hi[0])
        };
        let q = if i == 0 {
            dev.q0.slice(0..n)
        } else {
            src.slice(0..n)
        };
        let mut args = case_args(c, dev, q, dst.slice_mut(0..n), ws, split, max_seq_len)?;
        kernel.launch(&mut args, errors)?;
    }
    Ok(())
}

/// A case's device inputs (its query rows, both K/V encodings, page table,
/// lengths, row offsets and sinks).
struct CaseBuffers {
    q0: CudaSlice<u16>,
    kh: CudaSlice<u16>,
    vh: CudaSlice<u16>,
    kb: CudaSlice<u8>,
    vb: CudaSlice<u8>,
    pt: CudaSlice<i32>,
    lens: CudaSlice<i32>,
    cu: CudaSlice<i32>,
    sinks: Option<CudaSlice<f32>>,
}

impl CaseBuffers {
    fn upload(gpu: &Arc<Gpu>, c: &Case) -> Result<Self, KernelError> {
        Ok(Self {
            q0: upload(gpu, &c.q)?,
            kh: upload(gpu, &c.k)?,
            vh: upload(gpu, &if c.v_hnd { c.to_hnd(&c.v) } else { c.v.clone() })?,
            kb: upload(gpu, &c.k_bytes())?,
            vb: upload(
                gpu,
                &if c.v_hnd {
                    c.to_hnd(&c.v_bytes())
                } else {
                    c.v_bytes()
                },
            )?,
            pt: upload(gpu, &c.page_table)?,
            lens: upload(gpu, &c.lens)?,
            cu: upload(gpu, &c.cu)?,
            sinks: c.sinks.as_ref().map(|v| upload(gpu, v)).transpose()?,
        })
    }
}

/// The decode arguments of case `c` over `dev`, reading the query rows `q`
/// and writing `out` (both `c.q.len()` elements), no LSE.
fn case_args<'a>(
    c: &Case,
    dev: &'a CaseBuffers,
    q: CudaView<'a, u16>,
    out: CudaViewMut<'a, u16>,
    ws: &'a mut CudaSlice<f32>,
    split: SplitMode,
    max_seq_len: usize,
) -> Result<DecodeArgs<'a>, KernelError> {
    let shape = [c.num_pages, c.hkv, c.p, c.d];
    let strides = c.kv_strides();
    let v_strides = if c.v_hnd { c.hnd_strides() } else { strides };
    let qshape = [c.num_tokens, c.hq, c.d];
    let kv = match c.kv_dtype {
        KvDtype::E4m3 => KvCache::E4m3 {
            k: Strided::new("k_cache", dev.kb.as_view(), shape, strides)?,
            v: Strided::new("v_cache", dev.vb.as_view(), shape, v_strides)?,
        },
        kd => KvCache::Half {
            dtype: if kd == KvDtype::Bf16 {
                HalfDtype::Bf16
            } else {
                HalfDtype::F16
            },
            k: Strided::new("k_cache", dev.kh.as_view(), shape, strides)?,
            v: Strided::new("v_cache", dev.vh.as_view(), shape, v_strides)?,
        },
    };
    let ws_len = ws.len();
    Ok(DecodeArgs {
        q: Strided::contiguous("q", q, qshape)?,
        q_dtype: c.q_dtype,
        out: StridedMut::contiguous("out", out, qshape)?,
        kv,
        page_table: Strided::contiguous(
            "page_table",
            dev.pt.slice(0..c.page_table.len()),
            [c.bs(), c.m],
        )?,
        cache_seqlens: Strided::contiguous("cache_seqlens", dev.lens.slice(0..c.bs()), [c.bs()])?,
        layout: match c.uniform {
            Some(n) => QueryLayout::Uniform { q_len_per_req: n },
            None => QueryLayout::Ragged {
                cu_seqlens_q: Strided::contiguous(
                    "cu_seqlens_q",
                    dev.cu.slice(0..c.bs() + 1),
                    [c.bs() + 1],
                )?,
                max_q_len: c.max_q_len,
            },
        },
        max_seq_len,
        bmm1_scale: c.bmm1,
        bmm2_scale: c.bmm2,
        window_left: c.window,
        sinks: match &dev.sinks {
            Some(sv) => Some(Strided::contiguous("sinks", sv.slice(0..c.hq), [c.hq])?),
            None => None,
        },
        split,
        interleave: None,
        skip_softmax: None,
        skipped_slices: None,
        unit_order: None,
        workspace: Some(StridedMut::contiguous(
            "workspace",
            ws.slice_mut(0..ws_len),
            [ws_len],
        )?),
        lse: None,
    })
}

/// What one edited launch of a case gives back.
struct Edited {
    out: Vec<u16>,
    /// `[num_tokens, Hq]` row LSE (poisoned where not written).
    lse: Vec<f32>,
    /// The skipped-slice counter.
    skipped: u32,
    errors: ErrorReport,
}

impl Edited {
    /// Rows, LSE (bit for bit) and error words equal to `other`'s.
    fn same_bits(&self, other: &Edited) -> bool {
        let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        self.out == other.out && bits(&self.lse) == bits(&other.lse) && self.errors == other.errors
    }
}

/// Launches case `c` once into a poisoned output with the row LSE and the
/// skipped-slice counter requested, after `edit` set what the test varies
/// (the rank, the skip-softmax factor, the sinks).
fn launch_edited(
    gpu: &Arc<Gpu>,
    k: &PagedAttentionKernel,
    c: &Case,
    split: SplitMode,
    msl: usize,
    edit: impl FnOnce(&mut DecodeArgs<'_>),
) -> Result<Edited, String> {
    launch_ordered(gpu, k, c, split, msl, None, edit)
}

/// [`launch_edited`] with `order` (`[bs]`, uploaded) as the launch's
/// `unit_order`.
fn launch_ordered(
    gpu: &Arc<Gpu>,
    k: &PagedAttentionKernel,
    c: &Case,
    split: SplitMode,
    msl: usize,
    order: Option<&[i32]>,
    edit: impl FnOnce(&mut DecodeArgs<'_>),
) -> Result<Edited, String> {
    let dev = CaseBuffers::upload(gpu, c).or_fail("upload")?;
    let ord = match order {
        Some(o) => Some(upload(gpu, &[o, &[0]].concat()).or_fail("upload")?),
        None => None,
    };
    let (n, rows) = (c.q.len(), c.num_tokens * c.hq);
    let mut out = upload(gpu, &vec![POISON; n]).or_fail("upload")?;
    let need = case_workspace(c, split, msl, k.num_sms()).or_fail("workspace")?;
    let mut ws = upload(gpu, &fresh_workspace(need, counter_count(c))).or_fail("ws")?;
    let mut lse = upload(gpu, &vec![f32::from_bits(LSE_POISON); rows.max(1)]).or_fail("lse")?;
    let mut count = upload(gpu, &[0u32]).or_fail("counter")?;
    let mut errors = DeviceErrors::new(gpu).or_fail("errors")?;
    {
        let mut args = case_args(
            c,
            &dev,
            dev.q0.slice(0..n),
            out.slice_mut(0..n),
            &mut ws,
            split,
            msl,
        )
        .or_fail("args")?;
        args.lse = Some(
            StridedMut::contiguous("lse", lse.slice_mut(0..rows), [c.num_tokens, c.hq])
                .or_fail("lse view")?,
        );
        args.skipped_slices = Some(
            StridedMut::contiguous("skipped_slices", count.slice_mut(0..1), [1])
                .or_fail("count")?,
        );
        if let Some(o) = &ord {
            let bs = c.bs();
            args.unit_order =
                Some(Strided::contiguous("unit_order", o.slice(0..bs), [bs]).or_fail("order")?);
        }
        edit(&mut args);
        k.launch(&mut args, &mut errors).or_fail("launch")?;
    }
    let s = gpu.stream();
    let out: Vec<u16> = s.clone_dtoh(&out).or_fail("read")?;
    let lse: Vec<f32> = s.clone_dtoh(&lse).or_fail("read")?;
    let skipped: Vec<u32> = s.clone_dtoh(&count).or_fail("read")?;
    Ok(Edited {
        out: out[..n].to_vec(),
        lse: lse[..rows].to_vec(),
        skipped: skipped[0],
        errors: errors.read().or_fail("errors")?,
    })
}

/// Runs `c` with skip-softmax factor `f` (`None`: off), returning the
/// output bits and the skipped-slice count.
fn run_skip(
    gpu: &Arc<Gpu>,
    k: &PagedAttentionKernel,
    c: &Case,
    split: SplitMode,
    msl: usize,
    f: Option<f32>,
) -> Result<(Vec<u16>, u32), String> {
    let r = launch_edited(gpu, k, c, split, msl, |a| a.skip_softmax = f)?;
    Ok((r.out, r.skipped))
}

/// Skip-softmax (issue 14, `DecodeArgs::skip_softmax`): factor 0 gives the
/// bits of the launch without it on random cases; factor `f = 0.05` stays
/// within the stated bound `2·f·bmm2·max|V|` (plus the attention
/// tolerance) of the f64 reference; on peaked logits (`bmm1 = 4`, 3–4k
/// keys) slices are skipped (counted) and the bound still holds.
fn skip_softmax(gpu: &Arc<Gpu>) -> Result<(), String> {
    let k = PagedAttentionKernel::new(gpu).or_fail("load")?;
    let mut runs = 0usize;
    let mut skipped_total = 0u64;
    for seed in 0..460u64 {
        let (mut c, split, msl) = case_or_d512(seed, 400);
        if !runs_mma(&k, &c) {
            continue;
        }
        let peaked = seed % 4 == 0;
        if peaked {
            c.bmm1 = 4.0;
        }
        let (off, _) = run_skip(gpu, &k, &c, split, msl, None)?;
        let (zero, z) = run_skip(gpu, &k, &c, split, msl, Some(0.0))?;
        if off != zero || z != run_skip(gpu, &k, &c, split, msl, None)?.1 {
            return Err(format!(
                "seed {seed}: factor 0 differs from off; {}",
                describe(&c)
            ));
        }
        let f = 0.05f32;
        let (got, skipped) = run_skip(gpu, &k, &c, split, msl, Some(f))?;
        skipped_total += u64::from(skipped);
        let want = c.reference();
        let vmax = (0..c.v.len())
            .map(|i| c.decode_kv(c.v[i]).abs())
            .filter(|x| x.is_finite())
            .fold(0.0f64, f64::max);
        let bound = 2.0 * f64::from(f) * c.bmm2.abs() as f64 * vmax;
        for row in (0..c.num_tokens).filter(|&r| want.written[r]) {
            for j in 0..c.hq * c.d {
                let i = row * c.hq * c.d + j;
                let (g, w) = (c.q_dtype.to_f64(got[i]), want.out[i]);
                if !w.is_finite() {
                    continue; // non-finite rows: the exact launch's checks cover them
                }
                if (g - w).abs() > bound + 1e-2 * w.abs() + 2e-2 * c.bmm2.abs() as f64 * vmax {
                    return Err(format!(
                        "seed {seed} row {row} elem {j}: got {g}, want {w}, bound {bound}; {}",
                        describe(&c)
                    ));
                }
            }
        }
        runs += 1;
    }
    if skipped_total == 0 {
        return Err("no slice was skipped on the peaked cases".into());
    }
    println!("skip_softmax: {runs} cases, {skipped_total} slices skipped at f = 0.05");
    Ok(())
}

/// Decode context parallelism on one GPU (issue 17): each random case
/// (every dtype pair, D, page size, window, layout, ragged rows, bad device
/// data the tensor-core kernel serves) runs as 2–4 ranks by page interleave
/// (`DecodeArgs::interleave`: the global page table and lengths, no sinks,
/// the row LSE); each rank's output and LSE equal the reference over its
/// rank tables in global positions (`reference::attention_at`), the ranks'
/// states merged on the host with the sinks joined once equal the unsplit
/// reference, and the ranks' error words add up to the unsplit call's
/// (`cp::simulate`: per-request events once, each page by its rank).
fn interleaved_ranks(gpu: &Arc<Gpu>) -> Result<(), String> {
    use paged_attention::cp::{rank_tables, simulate};
    use paged_attention::merge::{apply_sinks, merge_states};
    use paged_attention::reference::{attention_at, HostInputs, Interleave, KeyPositions};
    let k = PagedAttentionKernel::new(gpu).or_fail("load")?;
    let cases = env_cases(600);
    let mut runs = 0usize;
    for seed in 0..cases + cases / 10 {
        let (c, split, msl) = case_or_d512(seed, cases);
        if !runs_mma(&k, &c) {
            continue;
        }
        let ranks = 2 + (seed % 3) as usize;
        let (kb, vb) = (c.k_bytes(), c.v_bytes());
        let full = c.inputs(&kb, &vb);
        let global: Vec<i64> = c.lens.iter().map(|&l| i64::from(l.max(0))).collect();
        let (t, hq, d) = (c.num_tokens, c.hq, c.d);
        let mut parts: Vec<(Vec<f64>, Vec<f64>)> = Vec::with_capacity(ranks);
        let mut first_bits = Vec::new();
        let mut errs = ErrorReport::default();
        for rank in 0..ranks {
            let il = Interleave {
                rank,
                ranks,
                block: c.p,
            };
            let n = c.q.len();
            let r = launch_edited(gpu, &k, &c, split, msl, |a| {
                a.sinks = None;
                a.interleave = Some(il);
            })
            .map_err(|e| format!("seed {seed}, rank {rank}/{ranks}: {e}"))?;
            let (got, got_lse, e) = (r.out, r.lse, r.errors);
            errs.count += e.count;
            errs.flags |= e.flags;
            // The rank against the reference over its tables, global positions.
            let rt = rank_tables(&c.page_table, c.m, c.m, &c.lens, c.p, rank, ranks);
            let local = HostInputs {
                page_table: &rt.page_table,
                max_num_pages: rt.max_num_pages,
                page_table_stride: rt.max_num_pages,
                cache_seqlens: &rt.cache_seqlens,
                sinks: None,
                ..full
            };
            let pos = KeyPositions {
                key_offset: None,
                interleave: Some(il),
                seq_lens: Some(&global),
            };
            let mut want = attention_at(&local, &pos);
            want.errors = e; // events are checked summed over the ranks, below
            let ctx = || format!("seed {seed}, rank {rank}/{ranks}, case {}", describe(&c));
            compare(&c, &want, &got[..n], &e).map_err(|m| format!("{m}; {}", ctx()))?;
            compare_lse(&c, &want, &got_lse[..t * hq]).map_err(|m| format!("{m}; {}", ctx()))?;
            let o: Vec<f64> = got[..n].iter().map(|&b| c.q_dtype.to_f64(b)).collect();
            let l: Vec<f64> = got_lse[..t * hq].iter().map(|&x| f64::from(x)).collect();
            if rank == 0 {
                first_bits = got[..n].to_vec();
            }
            parts.push((o, l));
        }
        // Merged on the host, the sinks joined once: the unsplit result.
        let want = c.reference();
        let views: Vec<(&[f64], &[f64])> = parts.iter().map(|(o, l)| (&o[..], &l[..])).collect();
        let (mut mo, mut ml) = merge_states(&views, d);
        if let Some(sk) = &c.sinks {
            apply_sinks(&mut mo, &mut ml, sk, d);
        }
        let mut merged = first_bits;
        for row in (0..t).filter(|&r| want.written[r]) {
            for j in 0..hq * d {
                merged[row * hq * d + j] = c.q_dtype.from_f64(mo[row * hq * d + j]);
            }
        }
        let sim = simulate(&full, ranks);
        let mut want_merged = want.clone();
        want_merged.errors = sim.errors;
        compare(&c, &want_merged, &merged, &errs).map_err(|m| {
            format!(
                "merged: {m}; seed {seed}, {ranks} ranks, case {}",
                describe(&c)
            )
        })?;
        runs += 1;
    }
    println!("interleaved_ranks_merge_to_the_unsplit_output: {runs} cases");
    Ok(())
}

/// Pages of `c`'s pools that rank `rank` of `ranks` does not hold under the
/// page interleave (no entry `e ≡ rank mod N` of any request names them)
/// filled with NaN: a rank that read another rank's page would turn rows
/// NaN.
#[cfg(feature = "nccl")]
fn keep_rank_pages(c: &mut Case, rank: usize, ranks: usize) {
    let per_page = c.p * c.hkv * c.d;
    let mut held = vec![false; c.num_pages];
    for b in 0..c.bs() {
        for e in (rank..c.m).step_by(ranks) {
            if let Ok(pg) = usize::try_from(c.page_table[b * c.m + e]) {
                if pg < c.num_pages {
                    held[pg] = true;
                }
            }
        }
    }
    let (nan, _) = nonfinite_bits(c.kv_dtype);
    for (pg, _) in held.iter().enumerate().filter(|(_, &h)| !h) {
        let r = pg * per_page..((pg + 1) * per_page).min(c.k.len());
        c.k[r.clone()].fill(nan);
        c.v[r].fill(nan);
    }
}

/// What one rank's context-parallel call gave back: merged output, merged
/// LSE, the rank's error word.
#[cfg(feature = "nccl")]
type RankOut = (Vec<u16>, Vec<f32>, ErrorReport);

/// Rank `rank` of `ranks`: joins communicator `id` on its GPU and runs every
/// case through [`paged_attention::nccl::DcpRank::decode`] with its own pools
/// ([`keep_rank_pages`]).
#[cfg(feature = "nccl")]
fn nccl_rank(
    rank: usize,
    ranks: usize,
    devices: usize,
    id: paged_attention::nccl::DcpId,
    cases: &[(Case, SplitMode, usize)],
) -> Result<Vec<RankOut>, String> {
    use paged_attention::nccl::DcpRank;
    let g = Gpu::shared_on(rank % devices).or_fail("device")?;
    let k = PagedAttentionKernel::new(&g).or_fail("load")?;
    let mut dcp = DcpRank::new(&g, rank, ranks, id).or_fail("join")?;
    let mut outs = Vec::with_capacity(cases.len());
    for (c, split, msl) in cases {
        let mut mine = c.clone();
        keep_rank_pages(&mut mine, rank, ranks);
        let dev = CaseBuffers::upload(&g, &mine).or_fail("upload")?;
        let (n, rows) = (c.q.len(), c.num_tokens * c.hq);
        let mut out = upload(&g, &vec![POISON; n.max(1)]).or_fail("upload")?;
        let need = case_workspace(c, *split, *msl, k.num_sms()).or_fail("workspace")?;
        let mut ws = upload(&g, &fresh_workspace(need, counter_count(c))).or_fail("ws")?;
        let mut lse = upload(&g, &vec![f32::from_bits(LSE_POISON); rows.max(1)]).or_fail("lse")?;
        let mut errors = DeviceErrors::new(&g).or_fail("errors")?;
        {
            let mut args = case_args(
                &mine,
                &dev,
                dev.q0.slice(0..n),
                out.slice_mut(0..n),
                &mut ws,
                *split,
                *msl,
            )
            .or_fail("args")?;
            args.lse = Some(
                StridedMut::contiguous("lse", lse.slice_mut(0..rows), [c.num_tokens, c.hq])
                    .or_fail("lse view")?,
            );
            dcp.decode(&k, args, &mut errors)
                .map_err(|e| format!("rank {rank}: {e}; {}", describe(c)))?;
        }
        let s = g.stream();
        let o: Vec<u16> = s.clone_dtoh(&out).or_fail("read")?;
        let l: Vec<f32> = s.clone_dtoh(&lse).or_fail("read")?;
        outs.push((
            o[..n].to_vec(),
            l[..rows].to_vec(),
            errors.read().or_fail("errors")?,
        ));
    }
    Ok(outs)
}

/// Decode context parallelism over NCCL (issue 17, `paged_attention::nccl`):
/// one rank per GPU of the host (`MHA_KIT_DCP_RANKS` overrides; NCCL
/// refuses two ranks on one device), each in its own thread with its own
/// communicator rank and only its pages valid (the others NaN); random
/// cases the tensor-core kernel serves. Every rank's merged output equals
/// rank 0's bit for bit, rank 0's equals the unsplit f64 reference (sinks
/// once; the merged row LSE too), and the ranks' error words add up to the
/// unsplit call's. On a one-GPU host this is a one-rank group: NCCL loads,
/// the communicator forms, the all-gather and the merge run.
#[cfg(feature = "nccl")]
fn nccl_ranks(_gpu: &Arc<Gpu>) -> Result<(), String> {
    use paged_attention::cp::simulate;
    use paged_attention::nccl::{nccl_available, DcpId};
    if !nccl_available() {
        return Err("libnccl not found: put the directory of libnccl.so on LD_LIBRARY_PATH".into());
    }
    let devices = match kernel_rt::gpu_status() {
        kernel_rt::GpuStatus::Available { devices } => *devices,
        kernel_rt::GpuStatus::Missing(m) => return Err(m.clone()),
    };
    let ranks = std::env::var("MHA_KIT_DCP_RANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(devices.min(8))
        .max(1);
    let n_cases = env_cases(300);
    let cases: Vec<_> = (0..n_cases)
        .map(|seed| random_case(0xDC9_0000 + seed))
        .filter(|(c, _, _)| {
            // The tensor-core shapes every launcher runs there (the
            // dim-splitting ones need set_wide_mma).
            paged_attention::mma_supported(c.q_dtype, c.kv_dtype, c.d)
                && !paged_attention::mma_wide(c.kv_dtype, c.d)
        })
        .collect();
    let id = DcpId::new().or_fail("unique id")?;
    let results =
        kernel_rt::testing::per_rank(ranks, |rank| nccl_rank(rank, ranks, devices, id, &cases));
    let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    for (i, (c, _, _)) in cases.iter().enumerate() {
        let ctx = || {
            format!(
                "case {i} of {}, {ranks} ranks: {}",
                cases.len(),
                describe(c)
            )
        };
        let (o0, l0, _) = &results[0][i];
        let mut errs = ErrorReport::default();
        for (r, res) in results.iter().enumerate() {
            let (o, l, e) = &res[i];
            if o != o0 || l.iter().zip(l0).any(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(format!(
                    "rank {r}'s merged output differs from rank 0's; {}",
                    ctx()
                ));
            }
            errs.count += e.count;
            errs.flags |= e.flags;
        }
        let mut want = c.reference();
        let (kb, vb) = (c.k_bytes(), c.v_bytes());
        want.errors = simulate(&c.inputs(&kb, &vb), ranks).errors;
        // Rows of skipped requests are unspecified in the merged output
        // (module docs): checked as the untouched rows they are unsplit.
        let (mut got, mut lse) = (o0.clone(), l0.clone());
        for t in (0..c.num_tokens).filter(|&t| !want.written[t]) {
            got[t * c.hq * c.d..(t + 1) * c.hq * c.d].fill(POISON);
            lse[t * c.hq..(t + 1) * c.hq].fill(f32::from_bits(LSE_POISON));
        }
        compare(c, &want, &got, &errs).map_err(|m| format!("{m}; {}", ctx()))?;
        compare_lse(c, &want, &lse).map_err(|m| format!("{m}; {}", ctx()))?;
    }
    println!(
        "nccl_ranks_merge_to_the_unsplit_output: {} cases, {ranks} rank(s) on {} device(s)",
        cases.len(),
        devices.min(ranks)
    );
    Ok(())
}

/// `DcpComm::abort` (issue 17): a rank whose peer never joins its
/// all-gather is released by an abort from another thread, and every later
/// collective of the rank fails naming the reason. With one GPU: a one-rank
/// group, aborted, refuses its next all-gather (and a second abort keeps
/// the first reason); with two or more: after one all-gather together,
/// rank 0 all-gathers again while rank 1 never does, a watcher thread
/// aborts rank 0 after 300 ms, and rank 0's stream synchronisation returns
/// instead of waiting forever.
#[cfg(feature = "nccl")]
fn nccl_abort(_gpu: &Arc<Gpu>) -> Result<(), String> {
    use paged_attention::nccl::{nccl_available, DcpComm, DcpId};
    if !nccl_available() {
        return Err("libnccl not found: put the directory of libnccl.so on LD_LIBRARY_PATH".into());
    }
    let devices = kernel_rt::gpu_status().devices();
    let ranks = devices.clamp(1, 2);
    let id = DcpId::new().or_fail("unique id")?;
    let done = std::sync::Barrier::new(ranks);
    let gather = |comm: &DcpComm, g: &Arc<Gpu>| -> Result<(), KernelError> {
        let s = g.stream();
        let send = s.alloc_zeros::<u16>(64)?;
        let mut recv = s.alloc_zeros::<u16>(64 * ranks)?;
        let send_lse = s.alloc_zeros::<f32>(8)?;
        let mut recv_lse = s.alloc_zeros::<f32>(8 * ranks)?;
        comm.all_gather_states(
            &send.as_view(),
            &mut recv.as_view_mut(),
            &send_lse.as_view(),
            &mut recv_lse.as_view_mut(),
        )
    };
    let results = kernel_rt::testing::per_rank(ranks, |rank| -> Result<(), String> {
        let g = Gpu::shared_on(rank).or_fail("device")?;
        let comm = DcpComm::new(&g, rank, ranks, id).or_fail("join")?;
        // Every rank's first all-gather together: NCCL may connect the
        // ranks lazily, inside a first collective's host call (which an
        // abort cannot reach), so the test's lone all-gather is a second.
        let first = gather(&comm, &g)
            .and_then(|()| Ok(g.stream().synchronize()?))
            .or_fail("first all-gather");
        let out = match (rank, first) {
            (_, Err(e)) => Err(e),
            (0, Ok(())) => (|| -> Result<(), String> {
                if ranks == 1 {
                    gather(&comm, &g).or_fail("a one-rank all-gather")?;
                    g.stream().synchronize().or_fail("sync")?;
                } else {
                    // Rank 1 never comes: without the abort this waits forever.
                    gather(&comm, &g).or_fail("enqueue")?;
                    std::thread::scope(|sc| {
                        sc.spawn(|| {
                            std::thread::sleep(std::time::Duration::from_millis(300));
                            comm.abort("test: peer rank gone")
                        });
                        // An aborted collective may leave an error on the
                        // stream; what matters is that this returns.
                        let _ = g.stream().synchronize();
                    });
                }
                comm.abort("test: peer rank gone").or_fail("abort")?;
                comm.abort("a second reason").or_fail("second abort")?;
                if comm.aborted().as_deref() != Some("test: peer rank gone") {
                    return Err(format!("aborted() = {:?}", comm.aborted()));
                }
                match gather(&comm, &g) {
                    Err(KernelError::Collective(m)) if m.contains("test: peer rank gone") => Ok(()),
                    other => Err(format!("all-gather after the abort: {other:?}")),
                }
            })(),
            (_, Ok(())) => Ok(()),
        };
        // Every rank passes the barrier whatever happened (a rank that
        // returned early would leave the other waiting there).
        done.wait();
        out
    });
    results.into_iter().collect::<Result<Vec<_>, _>>()?;
    println!("nccl_abort_releases_a_waiting_rank: {ranks} rank(s)");
    Ok(())
}

/// Programmatic dependent launch: chains of 6 launches (each reading the
/// previous one's output as its query) give the same bits with and without
/// the PDL attribute, eagerly and replayed from a CUDA graph, on random
/// cases (every KV dtype, D 64..512, split mode; the split counters of the shared
/// workspace zero after each chain).
fn pdl_chains(gpu: &Arc<Gpu>) -> Result<(), String> {
    let plain = {
        let mut k = PagedAttentionKernel::new(gpu).or_fail("load")?;
        k.set_pdl(false);
        k
    };
    let mut pdl = PagedAttentionKernel::new(gpu).or_fail("load")?;
    pdl.set_pdl(true);
    let sm90 = gpu.compute_capability().is_some_and(|cc| cc >= (9, 0));
    if sm90 && !pdl.pdl() {
        return Err("set_pdl(true) on sm_90 but launches are not PDL".into());
    }
    let s = gpu.stream();
    let mut chains = 0usize;
    for seed in 0u64..330 {
        let (c, split, msl) = case_or_d512(0x9D1_0000 + seed, 0x9D1_0000 + 300);
        if c.bs() == 0 {
            continue;
        }
        let dev = CaseBuffers::upload(gpu, &c).or_fail("upload")?;
        let need = case_workspace(&c, split, msl, plain.num_sms()).or_fail("workspace")?;
        let n_ctr = counter_count(&c);
        let run = |kern: &PagedAttentionKernel, graph: bool| -> Result<Vec<u16>, String> {
            let mut bufs = [
                upload(gpu, &vec![POISON; c.q.len()]).or_fail("buf")?,
                upload(gpu, &vec![POISON; c.q.len()]).or_fail("buf")?,
            ];
            let mut ws = upload(gpu, &fresh_workspace(need, n_ctr)).or_fail("ws")?;
            let mut errors = DeviceErrors::new(gpu).or_fail("errors")?;
            let mut chain = || {
                chain_launches(
                    kern,
                    &c,
                    split,
                    msl,
                    &dev,
                    &mut bufs,
                    &mut ws,
                    &mut errors,
                    6,
                )
            };
            if graph {
                // One eager run, the capture, then four replays (timing unused).
                kernel_rt::timing::graph_replay_us(gpu, 1, 1, |_| chain()).or_fail("graph")?;
            } else {
                chain().or_fail("chain")?;
            }
            let mut out = s.clone_dtoh(&bufs[1]).or_fail("out")?;
            out.extend(s.clone_dtoh(&bufs[0]).or_fail("out")?);
            let counters = split_counters(gpu, &ws, need, n_ctr).or_fail("counters")?;
            if counters.iter().any(|&x| x != 0) {
                return Err(format!("split counters {counters:?} after the chain"));
            }
            Ok(out)
        };
        let want = run(&plain, false)?;
        for (name, kern, graph) in [("PDL", &pdl, false), ("PDL in a graph", &pdl, true)] {
            let got = run(kern, graph).map_err(|e| format!("seed {seed} {name}: {e}"))?;
            if got != want {
                let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "seed {seed} {name}: element {i} is {:#06x}, without PDL {:#06x}; split {split:?}, case {}",
                    got[i],
                    want[i],
                    describe(&c)
                ));
            }
        }
        chains += 1;
    }
    println!(
        "pdl_chains_equal_plain_launches: {chains} cases × 6 launches, PDL {}",
        pdl.pdl()
    );
    Ok(())
}

/// `bs` ragged cache lengths from a 64-bit LCG seeded with `seed`: a draw
/// divisible by `empty_every` gives 0 (a request without keys), any other
/// `1..=max`.
/// Three ragged batches of 129 to 300 one-row requests (more than one
/// 128-request pass of the in-kernel ranking, empty requests, many requests
/// a length bucket), GQA 4 / 1 / 8 at D 128 / 64 / 256, bf16, P 16, with
/// `max_seq_len`: `(bs, case, max_seq_len)`, LCG seeds `seed0 + 1..=3`.
fn large_ragged_batches(seed0: u64) -> Vec<(usize, Case, usize)> {
    [
        (300usize, 4usize, 128usize, 1u64),
        (200, 1, 64, 2),
        (129, 8, 256, 3),
    ]
    .into_iter()
    .map(|(bs, group, d, seed)| {
        let lens = lcg_lens(bs, seed0 + seed, 11, 700);
        let c = uniform_weights_case(KvDtype::Bf16, d, group, 16, &lens, Some(1), bs, |b, pos| {
            ((b * 7 + pos) % 13) as f64 / 13.0 - 0.5
        });
        let msl = lens.iter().copied().max().unwrap_or(1).max(1) as usize;
        (bs, c, msl)
    })
    .collect()
}

fn lcg_lens(bs: usize, seed: u64, empty_every: i32, max: i32) -> Vec<i32> {
    let mut x = seed;
    (0..bs)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (x >> 33) as i32;
            if r % empty_every == 0 {
                0
            } else {
                1 + r % max
            }
        })
        .collect()
}

fn main() {
    let trials = vec![
        gpu_trial("pdl_chains_equal_plain_launches", pdl_chains),
        gpu_trial(
            "interleaved_ranks_merge_to_the_unsplit_output",
            interleaved_ranks,
        ),
        #[cfg(feature = "nccl")]
        gpu_trial("nccl_ranks_merge_to_the_unsplit_output", nccl_ranks),
        #[cfg(feature = "nccl")]
        gpu_trial("nccl_abort_releases_a_waiting_rank", nccl_abort),
        gpu_trial("skip_softmax_zero_is_off_and_stays_in_bound", skip_softmax),
        named(
            "masked_nonfinite_keys_never_reach_a_row",
            masked_nonfinite_keys,
        ),
        named("experiment_entries_with_correct_results", |gpu, _| {
            // The timing experiments that compute correct results (`_x16`:
            // the production entry traced; `_x256`: the half-row loop alone,
            // launched only where q_len · G <= 8, e4m3 and bf16 KV; `_x1024`:
            // the e4m3 copies as before W, lane quads with the L2 hint;
            // `_x5376`: the half-row pair loop with
            // `_x1024`'s copies; `_x4368`: the half-row pair loop traced), on the
            // random cases their entry serves
            // (bf16 Q, D 128) and on some others (which keep the production
            // entry).
            // MHA_KIT_GPU_EXPERIMENTS=16,256 runs only those experiments
            // (default: all).
            let only: Option<Vec<u32>> = std::env::var("MHA_KIT_GPU_EXPERIMENTS")
                .ok()
                .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect());
            let wanted = |xv: u32| only.as_ref().is_none_or(|o| o.contains(&xv));
            let mut runs = 0usize;
            for (xv, kv) in [
                (16u32, KvDtype::Bf16),
                (256, KvDtype::E4m3),
                (256, KvDtype::Bf16),
                (1024, KvDtype::E4m3),
                (5376, KvDtype::E4m3),
                (4368, KvDtype::E4m3),
            ]
            .into_iter()
            .filter(|&(xv, _)| wanted(xv))
            {
                let mut k = PagedAttentionKernel::new(gpu).or_fail("load")?;
                k.set_experiment(xv).or_fail("experiment")?;
                // Cases of this entry in each row form (q_len · G <= 8 or not).
                let mut forms = [0usize; 2];
                for seed in 0u64..4000 {
                    let (c, split, msl) = random_case(seed);
                    let theirs = c.d == 128 && c.kv_dtype == kv && c.q_dtype == HalfDtype::Bf16;
                    if !theirs && seed % 8 != 0 {
                        continue;
                    }
                    check(gpu, &k, &c, split, msl)
                        .map_err(|e| format!("_x{xv}, seed {seed}: {e}"))?;
                    if theirs {
                        forms[usize::from(c.q_len() * (c.hq / c.hkv) <= 8)] += 1;
                    }
                    runs += 1;
                }
                if forms.contains(&0) {
                    return Err(format!(
                        "_x{xv} ({kv:?}): both row forms needed, cases {forms:?}"
                    ));
                }
            }
            // Experiment 16 writes 16 u32 a CTA through `skipped_slices`:
            // a one-word buffer is refused before any launch.
            let mut k16 = PagedAttentionKernel::new(gpu).or_fail("load")?;
            k16.set_experiment(16).or_fail("experiment")?;
            let (c, split, msl) = (0u64..)
                .map(random_case)
                .find(|(c, _, _)| {
                    c.d == 128
                        && c.kv_dtype == KvDtype::Bf16
                        && c.q_dtype == HalfDtype::Bf16
                        && c.bs() > 0
                })
                .expect("a bf16 D 128 case");
            match launch_edited(gpu, &k16, &c, split, msl, |_| {}) {
                Err(e) if e.contains("skipped_slices") => {}
                other => {
                    return Err(format!(
                        "experiment 16 with a one-word skipped_slices: {:?}",
                        other.map(|r| r.out.len())
                    ))
                }
            }
            println!("experiment_entries_with_correct_results: {runs} cases");
            Ok(())
        }),
        named("one_tile_loop_matches_reference", |gpu, k| {
            // The pair loop (`_pair` / `_pair_h`) is the default for bf16 Q
            // with e4m3 K/V at D 128 (the random tests run it); the one-tile
            // loop it replaces (`set_pair_loop(false)`, with its cluster
            // fold) against the f64 reference on those cases.
            if !k.pair_loop() {
                return Err("the pair loop is off by default".into());
            }
            let mut off = PagedAttentionKernel::new(gpu).or_fail("load")?;
            off.set_pair_loop(false);
            let want = env_cases(500);
            let mut runs = 0u64;
            for seed in 0u64..20_000 {
                if runs == want {
                    break;
                }
                let (c, split, msl) = random_case(seed);
                if !pair_loop_variant(c.q_dtype, c.kv_dtype, c.d) {
                    continue;
                }
                check(gpu, &off, &c, split, msl)
                    .map_err(|e| format!("one-tile loop, seed {seed}: {e}"))?;
                runs += 1;
            }
            if runs == 0 {
                return Err("no bf16-Q e4m3 D 128 case".into());
            }
            println!("one_tile_loop_matches_reference: {runs} cases");
            Ok(())
        }),
        named("cluster_fold_equals_the_workspace_fold", |gpu, k| {
            // Split launches that fit on the device at once fold inside
            // thread-block clusters (the launcher's default): rows, LSE and
            // error words bit-identical to the workspace fold (the same
            // launcher with the cluster fold off), for every tensor-core
            // entry the random cases reach and 2..=16 splits (> 8: the
            // workspace fold on both sides).
            if !k.cluster_fold() {
                return Err("the cluster fold is off by default".into());
            }
            let mut off = PagedAttentionKernel::new(gpu).or_fail("load")?;
            off.set_cluster_fold(false);
            let cases = env_cases(600);
            let mut same = 0usize;
            for seed in 0..cases {
                let (c, _, msl) = random_case(seed);
                let split = SplitMode::Chunked {
                    chunk_tokens: 1 + (seed % 64) as usize,
                    max_splits: 2 + (seed % 15) as usize,
                };
                let a = launch_edited(gpu, k, &c, split, msl, |_| {})?;
                let b = launch_edited(gpu, &off, &c, split, msl, |_| {})?;
                if !a.same_bits(&b) {
                    return Err(format!(
                        "seed {seed}, {split:?}: the cluster fold differs from the workspace fold ({})",
                        describe(&c)
                    ));
                }
                same += 1;
            }
            if k.cluster_launches() == 0 || off.cluster_launches() != 0 {
                return Err(format!(
                    "cluster launches: {} with the fold on, {} with it off",
                    k.cluster_launches(),
                    off.cluster_launches()
                ));
            }
            println!(
                "cluster_fold_equals_the_workspace_fold: {same} cases, {} launches as clusters",
                k.cluster_launches()
            );
            Ok(())
        }),
        named("length_order_equals_grid_order", |gpu, _| {
            // `set_length_order(Some(0))` (the longest requests' CTAs first,
            // whatever the launch's size) against `None` (grid order):
            // rows, LSE and error words bit-identical to the grid order on
            // the random cases (their split modes and chunked splits of
            // 1..97 keys, cluster folds where they fit), and batches of 129
            // to 300 ragged requests (more than one 128-request pass of the
            // in-kernel selection; empty requests; many requests per length
            // bucket) against the f64 reference.
            let mut on = PagedAttentionKernel::new(gpu).or_fail("load")?;
            on.set_length_order(Some(0));
            let mut off = PagedAttentionKernel::new(gpu).or_fail("load")?;
            off.set_length_order(None);
            let same = |c: &Case, split: SplitMode, msl: usize| -> Result<(), String> {
                let a = launch_edited(gpu, &on, c, split, msl, |_| {})?;
                let b = launch_edited(gpu, &off, c, split, msl, |_| {})?;
                if !a.same_bits(&b) {
                    return Err(format!(
                        "{split:?}: the length order differs from the grid order ({})",
                        describe(c)
                    ));
                }
                Ok(())
            };
            let cases = env_cases(400);
            for seed in 0..cases {
                let (c, drawn, msl) = random_case(seed);
                let split = if seed % 2 == 0 {
                    drawn
                } else {
                    SplitMode::Chunked {
                        chunk_tokens: 1 + (seed % 97) as usize,
                        max_splits: 1 + (seed % 9) as usize,
                    }
                };
                same(&c, split, msl).map_err(|e| format!("seed {seed}: {e}"))?;
            }
            let mut big = 0usize;
            for (bs, c, msl) in large_ragged_batches(0) {
                for split in [
                    SplitMode::Auto,
                    SplitMode::Chunked {
                        chunk_tokens: 128,
                        max_splits: 4,
                    },
                ] {
                    check(gpu, &on, &c, split, msl).map_err(|e| format!("bs {bs}: {e}"))?;
                    same(&c, split, msl).map_err(|e| format!("bs {bs}: {e}"))?;
                    big += 1;
                }
            }
            println!("length_order_equals_grid_order: {cases} random cases, {big} large batches");
            Ok(())
        }),
        named("unit_order_matches_the_reference", |gpu, _| {
            // write_unit_order against reference::unit_order, bit for bit:
            // one request, one warp, the bucket count (256) and one past,
            // several 256-request rounds; lengths 0, negative, past the
            // capped bucket (32,640), and many ties. bs 0 launches nothing;
            // mismatched lengths are a typed error.
            let k = PagedAttentionKernel::new(gpu).or_fail("load")?;
            let s = gpu.stream();
            for (bs, seed) in [
                (1usize, 1u64),
                (2, 2),
                (31, 3),
                (256, 4),
                (257, 5),
                (1000, 6),
                (4099, 7),
            ] {
                let mut lens = lcg_lens(bs, seed, 7, 40_000);
                for (i, l) in lens.iter_mut().enumerate() {
                    if i % 13 == 5 {
                        *l = -(i as i32);
                    } else if i % 5 == 1 {
                        *l = 1 + (*l % 300); // ties in the first buckets
                    }
                }
                let dl = upload(gpu, &lens).or_fail("upload")?;
                let mut out = upload(gpu, &vec![-7i32; bs]).or_fail("upload")?;
                {
                    let l = Strided::contiguous("cache_seqlens", dl.slice(0..bs), [bs])
                        .or_fail("view")?;
                    let mut o = StridedMut::contiguous("unit_order", out.slice_mut(0..bs), [bs])
                        .or_fail("view")?;
                    k.write_unit_order(s, &l, &mut o)
                        .or_fail("write_unit_order")?;
                }
                let got: Vec<i32> = s.clone_dtoh(&out).or_fail("read")?;
                let want = paged_attention::reference::unit_order(&lens);
                if got != want {
                    let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                    return Err(format!(
                        "bs {bs}: order differs from the reference at {at}: {} vs {}",
                        got[at], want[at]
                    ));
                }
            }
            let dl = upload(gpu, &[3i32, 4]).or_fail("upload")?;
            let mut out = upload(gpu, &[0i32; 2]).or_fail("upload")?;
            let l0 = Strided::contiguous("cache_seqlens", dl.slice(0..0), [0]).or_fail("view")?;
            let mut o0 =
                StridedMut::contiguous("unit_order", out.slice_mut(0..0), [0]).or_fail("view")?;
            k.write_unit_order(s, &l0, &mut o0).or_fail("bs 0")?;
            let l2 = Strided::contiguous("cache_seqlens", dl.slice(0..2), [2]).or_fail("view")?;
            let mut o1 =
                StridedMut::contiguous("unit_order", out.slice_mut(0..1), [1]).or_fail("view")?;
            if k.write_unit_order(s, &l2, &mut o1).is_ok() {
                return Err("a [1] order for 2 requests was accepted".into());
            }
            println!("unit_order_matches_the_reference: 7 batches of 1 to 4,099 requests");
            Ok(())
        }),
        named("unit_order_equals_the_ranking", |gpu, _| {
            // Ordered launches of one split (`set_length_order(Some(0))`)
            // given the batch's order as `unit_order` against the same
            // launches ranking in every CTA: rows, LSE and error words bit
            // for bit, on the random cases (the table's path: one split;
            // their drawn splits too, where the table is ignored) and on
            // batches of 129-300 ragged requests. Any permutation gives the
            // same bits (reversed order); an entry outside [0, bs) leaves
            // that request's rows untouched and sets BAD_UNIT_ORDER, the
            // other requests' rows unchanged; a launcher with
            // set_unit_order(false) ignores the order (the ranking's bits).
            let mut on = PagedAttentionKernel::new(gpu).or_fail("load")?;
            on.set_length_order(Some(0));
            on.set_unit_order(true);
            let mut ignoring = PagedAttentionKernel::new(gpu).or_fail("load")?;
            ignoring.set_length_order(Some(0));
            ignoring.set_unit_order(false);
            // One split whatever the length (chunk_tokens must stay below 2^30).
            let one = SplitMode::Chunked {
                chunk_tokens: 1 << 29,
                max_splits: 1,
            };
            let compare = |c: &Case, split: SplitMode, msl: usize| -> Result<(), String> {
                let order = paged_attention::reference::unit_order(&c.lens[..c.bs()]);
                let ranked = launch_edited(gpu, &on, c, split, msl, |_| {})?;
                let table = launch_ordered(gpu, &on, c, split, msl, Some(&order), |_| {})?;
                let mut rev = order.clone();
                rev.reverse();
                let reversed = launch_ordered(gpu, &on, c, split, msl, Some(&rev), |_| {})?;
                for (what, e) in [("the order", &table), ("the reversed order", &reversed)] {
                    if !e.same_bits(&ranked) {
                        return Err(format!(
                            "{split:?}: {what} differs from the ranking ({})",
                            describe(c)
                        ));
                    }
                }
                Ok(())
            };
            let cases = env_cases(300);
            let mut bad_checked = 0usize;
            for seed in 0..cases {
                let (c, drawn, msl) = random_case(seed);
                let split = if seed % 3 == 0 { drawn } else { one };
                compare(&c, split, msl).map_err(|e| format!("seed {seed}: {e}"))?;
                if seed % 10 == 1 && c.bs() >= 2 {
                    // Request `victim`'s entry replaced by bs: skipped, counted.
                    let mut order = paged_attention::reference::unit_order(&c.lens[..c.bs()]);
                    let victim = order[0];
                    order[0] = c.bs() as i32;
                    let ranked = launch_edited(gpu, &on, &c, one, msl, |_| {})?;
                    let bad = launch_ordered(gpu, &on, &c, one, msl, Some(&order), |_| {})?;
                    if bad.errors.flags & paged_attention::ErrorFlags::BAD_UNIT_ORDER.bits() == 0 {
                        return Err(format!(
                            "seed {seed}: BAD_UNIT_ORDER not set ({:?})",
                            bad.errors
                        ));
                    }
                    let ignored =
                        launch_ordered(gpu, &ignoring, &c, one, msl, Some(&order), |_| {})?;
                    if !ignored.same_bits(&ranked) {
                        return Err(format!("seed {seed}: set_unit_order(false) read the order"));
                    }
                    // Request b's rows (a malformed ragged range: none).
                    let rows = |b: usize| -> std::ops::Range<usize> {
                        let (s, e) = match c.uniform {
                            Some(n) => (b * n, (b + 1) * n),
                            None => (c.cu[b].max(0) as usize, c.cu[b + 1].max(0) as usize),
                        };
                        let e = e.min(c.num_tokens);
                        s.min(e) * c.hq * c.d..e * c.hq * c.d
                    };
                    for b in 0..c.bs() {
                        let r = rows(b);
                        let (x, y) = (&bad.out[r.clone()], &ranked.out[r.clone()]);
                        if b as i32 == victim {
                            if x.iter().any(|&v| v != POISON) {
                                return Err(format!(
                                    "seed {seed}: request {b} (its entry bad) was written"
                                ));
                            }
                        } else if x != y {
                            return Err(format!(
                                "seed {seed}: request {b} differs with another entry bad"
                            ));
                        }
                    }
                    bad_checked += 1;
                }
            }
            let mut big = 0usize;
            for (bs, c, msl) in large_ragged_batches(10) {
                compare(&c, one, msl).map_err(|e| format!("bs {bs}: {e}"))?;
                big += 1;
            }
            println!(
                "unit_order_equals_the_ranking: {cases} random cases, {bad_checked} with a bad entry, {big} large batches"
            );
            Ok(())
        }),
        named("d512_decode_and_verify_vs_reference", |gpu, _| {
            // Head dim 512 and e4m3 K/V at 256 (the tensor-core entries that
            // split the dims between warps, `mma_wide`, run with
            // `set_wide_mma(true)`): the random case space (ragged and
            // uniform verify, GQA 1..16, page sizes, windows, sinks, e4m3 /
            // bf16 / f16 K/V, split modes, poisoned keys outside every row's
            // range) at D 512, and at D 256 for e4m3 K/V, on the launcher's
            // choice with the wide entries on, and every case also on the
            // CUDA-core kernel (KernelPath::Simt).
            let mut wide = PagedAttentionKernel::new(gpu).or_fail("load")?;
            wide.set_wide_mma(true);
            let simt = PagedAttentionKernel::with_path(gpu, KernelPath::Simt).or_fail("load")?;
            let cases = env_cases(200);
            let (mut runs, mut mma) = (0usize, 0usize);
            for seed in 0..2 * cases {
                let (c, split, msl) = if seed < cases {
                    random_case_with(0xD512_0000 + seed, Some(512))
                } else {
                    random_case_with(0xD256_0000 + seed, Some(256))
                };
                if seed >= cases && c.kv_dtype != KvDtype::E4m3 {
                    continue; // D 256: the e4m3 draws (a third)
                }
                check(gpu, &wide, &c, split, msl).map_err(|e| format!("seed {seed}: {e}"))?;
                check(gpu, &simt, &c, split, msl)
                    .map_err(|e| format!("seed {seed} (simt): {e}"))?;
                runs += 1;
                mma += usize::from(paged_attention::mma_supported(c.q_dtype, c.kv_dtype, c.d));
            }
            if mma == 0 {
                return Err("no case reached the wide tensor-core entries".into());
            }
            println!("d512_decode_and_verify_vs_reference: {runs} cases ({mma} on tensor cores)");
            Ok(())
        }),
        named("gpu_matches_reference_proptest", |gpu, k| {
            // One case in four also runs the CUDA-core kernel (KernelPath::Simt).
            let simt = PagedAttentionKernel::with_path(gpu, KernelPath::Simt).or_fail("load")?;
            // MHA_KIT_GPU_CASES: fewer cases under the sanitizers.
            let cases = u32::try_from(env_cases(u64::from(GPU_CASES))).unwrap_or(GPU_CASES);
            let mut runner = TestRunner::new(Config {
                cases,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&any::<u64>(), |seed| {
                    let (c, split, msl) = random_case(seed);
                    check(gpu, k, &c, split, msl)
                        .map_err(|e| TestCaseError::fail(format!("seed {seed}: {e}")))?;
                    if seed % 4 == 0 {
                        check(gpu, &simt, &c, split, msl)
                            .map_err(|e| TestCaseError::fail(format!("seed {seed} (simt): {e}")))?;
                    }
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
            println!(
                "gpu_matches_reference_proptest: {cases} cases, {} launches",
                k.launches()
            );
            Ok(())
        }),
        named(
            "overlapping_cu_seqlens_seed_15241479058792931755",
            |gpu, k| {
                // Non-monotonic cu_seqlens_q [0, 1, 2, 1, 2]: requests 2 and 3 are
                // skipped (BAD_CU_SEQLENS twice), row 1 belongs to request 1 only.
                let (c, _, msl) = random_case(15_241_479_058_792_931_755);
                if c.cu != [0, 1, 2, 1, 2] {
                    return Err(format!("case drifted: {}", describe(&c)));
                }
                let simt =
                    PagedAttentionKernel::with_path(gpu, KernelPath::Simt).or_fail("load")?;
                for kern in [k, &simt] {
                    for split in [
                        SplitMode::Auto,
                        SplitMode::Fixed { chunk_tokens: 8 },
                        SplitMode::Fixed { chunk_tokens: 512 },
                        SplitMode::Chunked {
                            chunk_tokens: 4,
                            max_splits: 2,
                        },
                    ] {
                        for _ in 0..20 {
                            check(gpu, kern, &c, split, msl)
                                .map_err(|e| format!("{:?} {split:?}: {e}", kern.path()))?;
                        }
                    }
                }
                Ok(())
            },
        ),
        named("must_pass_window", |gpu, k| {
            for (w, want) in [(Some(3), 3.5), (Some(0), 5.0), (Some(2), 4.0), (None, 2.5)] {
                let mut c =
                    uniform_weights_case(KvDtype::Bf16, 64, 1, 4, &[6], Some(1), 1, |_, t| {
                        t as f64
                    });
                c.page_table = vec![1, 2];
                for t in 0..6 {
                    let s = c.slot(0, t);
                    c.set_v(s, 0, 0, t as f64);
                }
                c.window = w;
                expect(gpu, k, &c, &[(0, 0, want)])?;
            }
            Ok(())
        }),
        named("must_pass_sinks_across_splits", |gpu, k| {
            for (w, sink, want) in [
                (None, 0.0f32, 2.0),
                (None, 4f32.ln(), 1.25),
                (Some(1), 0.0, 7.0 / 3.0),
            ] {
                let mut c =
                    uniform_weights_case(KvDtype::Bf16, 64, 1, 4, &[4], Some(1), 1, |_, t| {
                        t as f64 + 1.0
                    });
                c.window = w;
                c.sinks = Some(vec![sink]);
                expect(gpu, k, &c, &[(0, 0, want)])?;
            }
            Ok(())
        }),
        named("must_pass_fp8_sink_raw", |gpu, k| {
            expect(gpu, k, &fp8_sink_example(64), &[(0, 0, 2.0)])
        }),
        named("must_pass_verify_uniform", |gpu, k| {
            let c = verify_uniform_example(64, 3, 1);
            expect(
                gpu,
                k,
                &c,
                &[
                    (0, 0, 2.0),
                    (1, 0, 2.5),
                    (2, 0, 3.0),
                    (3, 0, 11.0),
                    (4, 0, 11.5),
                    (5, 0, 12.0),
                ],
            )?;
            for n in [5, 6, 7] {
                let c = verify_uniform_example(64, n, 8);
                let mut want = Vec::new();
                for j in 0..n {
                    for h in 0..8 {
                        want.push((j, h, (4 + j) as f64 / 2.0));
                        want.push((n + j, h, 10.0 + (2 + j) as f64 / 2.0));
                    }
                }
                expect(gpu, k, &c, &want)?;
            }
            Ok(())
        }),
        named("must_pass_verify_ragged", |gpu, k| {
            expect(
                gpu,
                k,
                &verify_ragged_example(64),
                &[(0, 0, 1.5), (1, 0, 2.0), (2, 0, 12.5), (3, 0, 13.0)],
            )
        }),
        named("must_pass_gqa_head_stride", |gpu, k| {
            let c = gqa_stride_example(64);
            expect(gpu, k, &c, &[(0, 0, 1.26696), (0, 1, 1.0)])?;
            let got = run_gpu(gpu, k, &c, SplitMode::Auto, 3, None).or_fail("launch")?;
            let v = |h: usize, d: usize| c.q_dtype.to_f64(got.out[h * c.d + d]);
            if (v(0, 1) - 1.0).abs() > 1e-2 || (v(1, 1) - 1.26696).abs() > 1.3e-2 {
                return Err(format!(
                    "got [{}, {}] [{}, {}]",
                    v(0, 0),
                    v(0, 1),
                    v(1, 0),
                    v(1, 1)
                ));
            }
            Ok(())
        }),
        named("must_pass_split_determinism", |gpu, k| {
            let c = uniform_weights_case(KvDtype::Bf16, 128, 1, 16, &[5000], Some(1), 1, |_, t| {
                (t % 7) as f64
            });
            for split in [
                SplitMode::Auto,
                SplitMode::Fixed { chunk_tokens: 512 },
                SplitMode::Chunked {
                    chunk_tokens: 1024,
                    max_splits: 4,
                },
            ] {
                let need =
                    workspace_for(1, 1, 1, 128, 1, 5000, split, k.num_sms()).or_fail("ws")?;
                let mut ws =
                    upload(gpu, &fresh_workspace(need, counter_count(&c))).or_fail("ws")?;
                let mut first: Option<Vec<u16>> = None;
                for _ in 0..3 {
                    let got = run_gpu(gpu, k, &c, split, 5000, Some(&mut ws)).or_fail("launch")?;
                    if got.counters.iter().any(|&x| x != 0) {
                        return Err(format!(
                            "{split:?}: counters {:?} after a launch",
                            got.counters
                        ));
                    }
                    let v = c.q_dtype.to_f64(got.out[0]);
                    if v != 3.0 {
                        return Err(format!(
                            "{split:?}: got {v}, want 3.0 (2.999 rounded to bf16)"
                        ));
                    }
                    match &first {
                        None => first = Some(got.out),
                        Some(f) if *f != got.out => {
                            return Err(format!("{split:?}: not bitwise equal run to run"))
                        }
                        Some(_) => {}
                    }
                }
            }
            Ok(())
        }),
        named("batch_invariance_fixed_split", |gpu, k| {
            // The same request alone and inside a bigger batch: bitwise equal.
            let c = (0u64..)
                .map(|seed| random_case(seed).0)
                .find(|c| c.bs() >= 2 && c.uniform.is_some())
                .expect("some seed gives a uniform batch");
            let split = SplitMode::Fixed { chunk_tokens: 64 };
            let full = run_gpu(gpu, k, &c, split, 4096, None).or_fail("launch")?;
            let n = c.uniform.unwrap_or(1);
            let mut one = c.clone();
            one.lens.truncate(1);
            one.page_table.truncate(c.m);
            one.cu.truncate(2);
            one.num_tokens = n;
            one.q.truncate(n * c.hq * c.d);
            let alone = run_gpu(gpu, k, &one, split, 4096, None).or_fail("launch")?;
            if alone.out[..] != full.out[..alone.out.len()] {
                return Err("request 0 differs alone vs in a batch".into());
            }
            Ok(())
        }),
        named("bad_arguments_are_errors_before_launch", |gpu, k| {
            let c = verify_ragged_example(64);
            let mut bad = c.clone();
            bad.hq = 17; // group 17 > 16
            bad.q = vec![0; bad.num_tokens * 17 * 64];
            match run_gpu(gpu, k, &bad, SplitMode::Auto, 8, None) {
                Err(KernelError::Unsupported { .. }) => {}
                other => return Err(format!("group 17 accepted: {:?}", other.map(|_| ()))),
            }
            let mut bad = c.clone();
            bad.max_q_len = 17;
            match run_gpu(gpu, k, &bad, SplitMode::Auto, 8, None) {
                Err(KernelError::Unsupported {
                    arg: "max_q_len", ..
                }) => {}
                other => return Err(format!("max_q_len 17 accepted: {:?}", other.map(|_| ()))),
            }
            if k.launches() != 0 {
                return Err("a rejected call launched".into());
            }
            Ok(())
        }),
    ];
    run_trials(trials)
}
