//! # 02 — decode over a paged KV cache
//!
//! One decode call (one new query row per request, `q_len = 1`) over a
//! small paged bf16 KV cache: three requests of different lengths whose
//! pages are scattered over the pool, grouped-query attention (8 query
//! heads share 2 KV heads). On a GPU it runs paged-attention's
//! `PagedAttentionKernel` and compares its output with the f64 CPU
//! reference (`paged_attention::reference::attention`); without one it runs
//! the reference and checks it against a direct computation that first
//! gathers each request's keys through its page table.
//!
//! ```text
//! cargo run --release -p mha-kit-examples --example 02_decode
//! ```
//!
//! Prints the shapes, each request's length and pages, a few output values
//! and the log-sum-exp of head 0, the output checksum, and the error: on the
//! GPU `max |gpu − reference|` (bf16 output against f64, about 1e-3), on the
//! CPU `max |reference − direct|` (about 1e-16).
//!
//! ## The terms
//!
//! - **`num_q_heads`** (`Hq`) / **`num_kv_heads`** (`Hkv`) / **`head_dim`**
//!   (`D`): query heads, KV heads and elements per head. With GQA
//!   (grouped-query attention) `G = Hq / Hkv` query heads read the same KV
//!   head: query head `h` reads KV head `h / G`.
//! - **`page_size`** (`P`): tokens per page; the pool has `num_pages` pages,
//!   page 0 being the dummy page.
//! - **NHD / HND**: two layouts of a KV pool. NHD is slot-major, `[slots,
//!   Hkv, D]` (token, head, dim: what mha-backend and SGLang keep); HND keeps
//!   each page as `[Hkv, P, D]` (head, token, dim). The kernel takes either
//!   as a strided `[num_pages, Hkv, P, D]` view: NHD has strides
//!   `(P·Hkv·D, D, Hkv·D, 1)`, HND `(Hkv·P·D, P·D, D, 1)`. Here K is NHD and
//!   V is HND, to show that only the strides differ.
//! - **page table** `[bs, M]` and **`cache_seqlens`** `[bs]`: see example
//!   01. Key `k` of request `i` lives in slot `page_table[i, k / P]·P + k % P`.
//! - **`bmm1_scale`**: the factor on the raw dot products `q·k` (natural-log
//!   units): the softmax scale `1/√D`, times the K scale of an FP8 cache.
//!   **`bmm2_scale`**: the factor on the normalised output (the V scale of an
//!   FP8 cache; 1 here).
//! - **decode**: the query row of request `i` sits at position `L_i − 1` and
//!   sees every key `0 ..= L_i − 1` (causal).

use std::error::Error;
use std::fmt::Write as _;

use kernel_rt::{gpu_status, DeviceErrors, Gpu, GpuStatus, Strided, StridedMut};
use paged_attention::reference::{attention, HostInputs, HostKv, HostLayout, KvData};
use paged_attention::{
    workspace_for, DecodeArgs, HalfDtype, KvCache, PagedAttentionKernel, QueryLayout, SplitMode,
};

/// `Hq`.
const HQ: usize = 8;
/// `Hkv` (GQA group `G = 4`).
const HKV: usize = 2;
/// `D`.
const D: usize = 64;
/// `P`.
const P: usize = 16;
/// Pages in the pool (page 0 is the dummy page).
const NUM_PAGES: usize = 16;
/// `M`: page-table width.
const M: usize = 5;

/// A deterministic value in `[-1, 1)` for element `i` of stream `salt`
/// (splitmix64), so that every run prints the same numbers.
fn value(salt: u64, i: usize) -> f64 {
    let mut z = (i as u64)
        .wrapping_add(salt << 32)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// `n` bf16 values (as `u16` bits) of stream `salt`.
fn bf16_values(salt: u64, n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| HalfDtype::Bf16.from_f64(value(salt, i)))
        .collect()
}

/// Element offset of `(page, head, token, dim)` in a pool with these strides.
fn at(strides: [usize; 4], page: usize, head: usize, tok: usize, d: usize) -> usize {
    page * strides[0] + head * strides[1] + tok * strides[2] + d * strides[3]
}

/// Runs the decode call (on the GPU when `allow_gpu` and one is present,
/// else the CPU path) and returns the printed report.
///
/// # Errors
/// Shape / launch / driver errors.
pub fn run(allow_gpu: bool) -> Result<String, Box<dyn Error>> {
    // Three requests of 37, 5 and 70 tokens (the new token included), their
    // pages scattered over the pool: request 0 in pages 7, 2, 11, ...
    let cache_seqlens = [37i32, 5, 70];
    let pages: [&[i32]; 3] = [&[7, 2, 11], &[5], &[14, 3, 9, 1, 12]];
    let bs = cache_seqlens.len();
    // page_table [bs, M]: the live pages, then 0 (never read: past L_i).
    let mut page_table = vec![0i32; bs * M];
    for (i, p) in pages.iter().enumerate() {
        page_table[i * M..i * M + p.len()].copy_from_slice(p);
    }
    // The pools hold [NUM_PAGES · P] slots of [Hkv, D] each. Every slot gets
    // a value; only the slots of each request's first L_i positions are read.
    let pool = NUM_PAGES * P * HKV * D;
    let k_nhd = [P * HKV * D, D, HKV * D, 1];
    let v_hnd = [HKV * P * D, P * D, D, 1];
    let k_pool = bf16_values(1, pool);
    let v_pool = bf16_values(2, pool);
    // q [bs, Hq, D]: one query row per request (decode).
    let q = bf16_values(3, bs * HQ * D);
    let bmm1_scale = 1.0 / (D as f32).sqrt();
    let bmm2_scale = 1.0;

    let reference = attention(&HostInputs {
        q: &q,
        q_dtype: HalfDtype::Bf16,
        q_shape: [bs, HQ, D],
        q_strides: [HQ * D, D, 1],
        k: HostKv {
            data: KvData::Bf16(&k_pool),
            shape: [NUM_PAGES, HKV, P, D],
            strides: k_nhd,
        },
        v: HostKv {
            data: KvData::Bf16(&v_pool),
            shape: [NUM_PAGES, HKV, P, D],
            strides: v_hnd,
        },
        page_table: &page_table,
        max_num_pages: M,
        page_table_stride: M,
        cache_seqlens: &cache_seqlens,
        layout: HostLayout::Uniform { q_len_per_req: 1 },
        bmm1_scale,
        bmm2_scale,
        window_left: None,
        sinks: None,
    });

    let mut out = String::new();
    let status = gpu_status();
    let gpu_out = match status {
        GpuStatus::Available { .. } if allow_gpu => {
            let gpu = Gpu::shared()?;
            writeln!(out, "device: {}", gpu.describe())?;
            let s = gpu.stream();
            let kernel = PagedAttentionKernel::new(&gpu)?;
            let d_q = s.clone_htod(&q)?;
            let mut d_out = s.alloc_zeros::<u16>(q.len())?;
            let d_k = s.clone_htod(&k_pool)?;
            let d_v = s.clone_htod(&v_pool)?;
            let d_pt = s.clone_htod(&page_table)?;
            let d_lens = s.clone_htod(&cache_seqlens)?;
            // Split-KV scratch: its tail holds counters that must start at
            // zero (alloc_zeros); every launch leaves them zero again.
            let max_seq_len = 128;
            let ws_len = workspace_for(
                bs,
                HQ,
                HKV,
                D,
                1,
                max_seq_len,
                SplitMode::Auto,
                kernel.num_sms(),
            )?
            .max(1);
            let mut d_ws = s.alloc_zeros::<f32>(ws_len)?;
            let mut errors = DeviceErrors::new(&gpu)?;
            let shape = [NUM_PAGES, HKV, P, D];
            kernel.launch(
                &mut DecodeArgs {
                    q: Strided::of("q", &d_q, [bs, HQ, D])?,
                    q_dtype: HalfDtype::Bf16,
                    out: StridedMut::of("out", &mut d_out, [bs, HQ, D])?,
                    kv: KvCache::Half {
                        dtype: HalfDtype::Bf16,
                        k: Strided::new("k_cache", d_k.as_view(), shape, k_nhd)?,
                        v: Strided::new("v_cache", d_v.as_view(), shape, v_hnd)?,
                    },
                    page_table: Strided::of("page_table", &d_pt, [bs, M])?,
                    cache_seqlens: Strided::of("cache_seqlens", &d_lens, [bs])?,
                    layout: QueryLayout::Uniform { q_len_per_req: 1 },
                    max_seq_len,
                    bmm1_scale,
                    bmm2_scale,
                    window_left: None,
                    sinks: None,
                    split: SplitMode::Auto,
                    interleave: None,
                    skip_softmax: None,
                    skipped_slices: None,
                    unit_order: None,
                    workspace: Some(StridedMut::of("workspace", &mut d_ws, [ws_len])?),
                    lse: None,
                },
                &mut errors,
            )?;
            let bits = s.clone_dtoh(&d_out)?;
            let e = errors.read()?;
            writeln!(
                out,
                "device error word: {} event(s), flags {:#x}",
                e.count, e.flags
            )?;
            Some(bits)
        }
        _ => {
            let why = match status {
                GpuStatus::Missing(why) => format!("no GPU: {why}"),
                GpuStatus::Available { .. } => "CPU path requested".to_string(),
            };
            writeln!(out, "device: CPU reference ({why})")?;
            None
        }
    };

    writeln!(
        out,
        "decode: bs {bs}, Hq {HQ}, Hkv {HKV} (GQA group {}), D {D}, P {P}, {NUM_PAGES} pages, bf16; K NHD, V HND; bmm1_scale {bmm1_scale}",
        HQ / HKV
    )?;
    for (i, (len, p)) in cache_seqlens.iter().zip(pages).enumerate() {
        let o = &reference.out[i * HQ * D..];
        writeln!(
            out,
            "request {i}: L = {len} ({} page{} {p:?}), reference out[head 0][..4] = [{:.4}, {:.4}, {:.4}, {:.4}], lse[head 0] = {:.4}",
            p.len(),
            if p.len() == 1 { "" } else { "s" },
            o[0],
            o[1],
            o[2],
            o[3],
            reference.lse[i * HQ]
        )?;
    }
    let finite = reference.out.iter().all(|x| x.is_finite());
    writeln!(
        out,
        "output [{bs}, {HQ}, {D}]: checksum {:.6}, all finite: {finite}",
        reference.out.iter().sum::<f64>()
    )?;

    match gpu_out {
        Some(bits) => {
            let err = bits
                .iter()
                .zip(&reference.out)
                .map(|(&b, &r)| (HalfDtype::Bf16.to_f64(b) - r).abs())
                .fold(0.0f64, f64::max);
            let sum: f64 = bits.iter().map(|&b| HalfDtype::Bf16.to_f64(b)).sum();
            writeln!(out, "GPU output checksum {sum:.6}")?;
            writeln!(
                out,
                "max |gpu - reference| = {err:.3e} (bf16 output vs f64 reference)"
            )?;
        }
        None => {
            // What "paged" means: gather request i's keys through its page
            // table into contiguous rows, then plain softmax attention.
            let mut err = 0.0f64;
            for i in 0..bs {
                let len = cache_seqlens[i] as usize;
                let slot = |k: usize| (page_table[i * M + k / P] as usize, k % P);
                for h in 0..HQ {
                    let kvh = h / (HQ / HKV);
                    let qv = |d: usize| HalfDtype::Bf16.to_f64(q[(i * HQ + h) * D + d]);
                    let logits: Vec<f64> = (0..len)
                        .map(|k| {
                            let (pg, t) = slot(k);
                            let dot: f64 = (0..D)
                                .map(|d| {
                                    qv(d) * HalfDtype::Bf16.to_f64(k_pool[at(k_nhd, pg, kvh, t, d)])
                                })
                                .sum();
                            f64::from(bmm1_scale) * dot
                        })
                        .collect();
                    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = logits.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for d in 0..D {
                        let o: f64 = (0..len)
                            .map(|k| {
                                let (pg, t) = slot(k);
                                w[k] * HalfDtype::Bf16.to_f64(v_pool[at(v_hnd, pg, kvh, t, d)])
                            })
                            .sum::<f64>()
                            / z
                            * f64::from(bmm2_scale);
                        err = err.max((o - reference.out[(i * HQ + h) * D + d]).abs());
                    }
                }
            }
            writeln!(
                out,
                "max |reference - direct| = {err:.3e} (direct: keys gathered through the page table, plain softmax)"
            )?;
        }
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn Error>> {
    print!("{}", run(true)?);
    Ok(())
}
