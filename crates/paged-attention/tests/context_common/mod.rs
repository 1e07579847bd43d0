//! Host-side context-attention cases shared by tests/context_reference.rs and
//! tests/context_gpu.rs (built on `common::Case`, ragged layout).
#![allow(dead_code, clippy::too_many_arguments, clippy::needless_range_loop)]

use crate::common::{uniform_weights_case, Case};
use paged_attention::{HalfDtype, KvDtype};
use rand::{Rng, SeedableRng};

/// One head, K zeros, `V[t] = value(t)`, one request of KV length `len` whose
/// last `n` tokens are the new rows (ragged layout `cu = [0, n]`).
pub fn ctx_uniform(
    kv: KvDtype,
    d: usize,
    p: usize,
    len: i32,
    n: usize,
    value: impl Fn(usize) -> f64,
) -> Case {
    let mut c = uniform_weights_case(kv, d, 1, p, &[len], None, n, |_, t| value(t));
    c.cu = vec![0, n as i32];
    c.max_q_len = n.max(1);
    c
}

/// Converts a uniform-layout case to the ragged layout of the context call.
pub fn to_ragged(mut c: Case) -> Case {
    let n = c.uniform.take().unwrap_or(c.max_q_len);
    let bs = c.lens.len();
    c.cu = (0..=bs).map(|b| (b * n) as i32).collect();
    c.max_q_len = n.max(1);
    c
}

/// First key any of `n` rows at the end of a length-`len` request may see.
pub fn needed_lo(len: i64, n: usize, window: Option<u32>) -> i64 {
    window.map_or(0, |w| (len - n as i64 - i64::from(w)).max(0))
}

/// Real values (uniform in `[-1, 1)`) into keys `range` of request `b`, every
/// KV head, skipping positions whose page-table entry is past `M` or invalid.
pub fn fill_keys(c: &mut Case, r: &mut impl Rng, b: usize, range: std::ops::Range<i64>) {
    for pos in range {
        let e = pos as usize / c.p;
        if e >= c.m {
            continue;
        }
        let id = c.page_table[b * c.m + e];
        if id < 0 || id as usize >= c.num_pages {
            continue;
        }
        let slot = id as usize * c.p + pos as usize % c.p;
        for h in 0..c.hkv {
            for dd in 0..c.d {
                let (kx, vx) = (r.gen_range(-1.0..1.0), r.gen_range(-1.0..1.0));
                c.set_k(slot, h, dd, kx);
                c.set_v(slot, h, dd, vx);
            }
        }
    }
}

/// f64 work of the reference for a case (row·key·head·dim products).
pub fn reference_work(c: &Case) -> f64 {
    let mut w = 0.0;
    for b in 0..c.bs() {
        let n = (i64::from(c.cu[b + 1]) - i64::from(c.cu[b])).max(0) as f64;
        let len = f64::from(c.lens[b].max(0));
        w += n * len;
    }
    w * (c.hq * c.d) as f64
}

/// A random context case from `seed`: ragged requests mixing prefill (no
/// prefix), chunked prefill (prefix + new tokens), decode rows (n = 1), empty
/// requests (n = 0) and a few with fewer keys than rows; windows, sinks,
/// GQA 1..16, Hkv 1–2, every head dim, page sizes 1..128, FP8 KV; rarely bad
/// device data (cu_seqlens_q, negative lengths, bad page ids, short table).
/// Keys no row of any request may see hold NaN/Inf bytes. Sizes are capped so
/// the f64 reference stays cheap (`budget` row·key·head·dim products).
pub fn context_random_case(seed: u64, budget: f64) -> Case {
    context_random_case_with(seed, budget, None)
}

/// [`context_random_case`] with the head dim forced to `force_d` (the other
/// fields drawn as for the seed's case, then shrunk to the budget): how the
/// context call's head dim 512 (the decode kernel's path) gets the same
/// case space.
pub fn context_random_case_with(seed: u64, budget: f64, force_d: Option<usize>) -> Case {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let q_dtype = if r.gen_bool(0.5) {
        HalfDtype::Bf16
    } else {
        HalfDtype::F16
    };
    let kv = if r.gen_bool(0.3) {
        KvDtype::E4m3
    } else if q_dtype == HalfDtype::Bf16 {
        KvDtype::Bf16
    } else {
        KvDtype::F16
    };
    let drawn_d = [64, 128, 256][r.gen_range(0..3)];
    let d = force_d.unwrap_or(drawn_d);
    let g = [1, 2, 3, 4, 8, 16][r.gen_range(0..6)];
    let hkv = if r.gen_bool(0.7) { 1 } else { 2 };
    let hq = g * hkv;
    let p = [1, 3, 8, 16, 32, 48, 64, 128, 1600, r.gen_range(1..=40)][r.gen_range(0..10)];
    let bs = r.gen_range(1..=5);
    let q_cap = [8usize, 70, 200, 600, 8192][r.gen_range(0..5)];
    let pre_cap = [0usize, 40, 300, 1500, 65536][r.gen_range(0..5)];
    let mut qlens: Vec<usize> = Vec::with_capacity(bs);
    let mut lens: Vec<i32> = Vec::with_capacity(bs);
    for _ in 0..bs {
        let n = match r.gen_range(0..10) {
            0 => 0,
            1 | 2 => 1,
            _ => r.gen_range(1..=q_cap),
        };
        let prefix = if pre_cap == 0 || r.gen_bool(0.3) {
            0
        } else {
            r.gen_range(0..=pre_cap)
        };
        let len = if r.gen_bool(0.05) {
            r.gen_range(0..=n) // fewer keys than rows
        } else {
            prefix + n
        };
        qlens.push(n);
        lens.push(len as i32);
    }
    // Shrink to the reference budget (keeps the mix of shapes).
    let work = |q: &[usize], l: &[i32]| -> f64 {
        q.iter()
            .zip(l)
            .map(|(&n, &len)| n as f64 * f64::from(len.max(0)))
            .sum::<f64>()
            * (hq * d) as f64
    };
    while work(&qlens, &lens) > budget {
        for b in 0..bs {
            let n = qlens[b];
            let prefix = (lens[b] as usize).saturating_sub(n);
            let n2 = if n > 1 { n.div_ceil(2) } else { n };
            let over = (lens[b] as usize) < n;
            qlens[b] = n2;
            lens[b] = if over {
                (lens[b] as usize).min(n2) as i32
            } else {
                (prefix / 2 + n2) as i32
            };
        }
    }
    let max_len = lens.iter().copied().max().unwrap_or(0).max(1) as usize;
    let m_needed = max_len.div_ceil(p);
    let m = if r.gen_bool(0.03) {
        (m_needed / 2).max(1)
    } else {
        m_needed + r.gen_range(0..3)
    };
    let num_pages = 1 + bs * m + r.gen_range(0..4);
    let num_tokens: usize = qlens.iter().sum();
    let mut c = Case::new(kv, d, hq, hkv, p, num_pages, bs, m, None, num_tokens);
    c.q_dtype = q_dtype;
    c.lens = lens;
    let mut acc = 0i32;
    for (b, &n) in qlens.iter().enumerate() {
        c.cu[b] = acc;
        acc += n as i32;
    }
    c.cu[bs] = acc;
    let max_q = qlens.iter().copied().max().unwrap_or(1).max(1);
    c.max_q_len = if r.gen_bool(0.2) {
        max_q + r.gen_range(0..100)
    } else {
        max_q
    };
    // Rare bad device data (all counted by the kernel and the reference).
    if r.gen_bool(0.03) {
        let i = r.gen_range(0..=bs);
        match r.gen_range(0..3) {
            0 => c.cu[i] += 1,
            1 => c.cu[i] -= 1,
            _ => c.cu[i] = r.gen_range(-1..=num_tokens as i32 + 1),
        }
    }
    if r.gen_bool(0.02) {
        c.max_q_len = (max_q - 1).max(1); // the longest request is skipped
    }
    if r.gen_bool(0.02) {
        c.lens[r.gen_range(0..bs)] = -3;
    }
    let mut ids: Vec<i32> = (1..num_pages as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, r.gen_range(0..=i));
    }
    for (i, e) in c.page_table.iter_mut().enumerate() {
        *e = ids[i % ids.len()];
        if r.gen_bool(0.005) {
            *e = if r.gen_bool(0.5) {
                -1
            } else {
                num_pages as i32 + 5
            };
        }
    }
    c.window = if r.gen_bool(0.35) {
        Some(if r.gen_bool(0.5) {
            r.gen_range(0..=70)
        } else {
            r.gen_range(0..=(max_len as u32 + 5))
        })
    } else {
        None
    };
    if r.gen_bool(0.3) {
        c.sinks = Some((0..c.hq).map(|_| r.gen_range(-2.0f32..3.0)).collect());
    }
    c.bmm1 = (1.0 / (d as f32).sqrt()) * r.gen_range(0.5f32..2.0);
    c.bmm2 = r.gen_range(0.5f32..2.0);
    for x in c.q.iter_mut() {
        *x = c.q_dtype.from_f64(r.gen_range(-2.0..2.0));
    }
    let (nan, inf) = match kv {
        KvDtype::Bf16 => (0x7FC0u16, 0x7F80u16),
        KvDtype::F16 => (0x7E00, 0x7C00),
        KvDtype::E4m3 => (0x7F, 0xFF),
    };
    for (i, x) in c.k.iter_mut().enumerate() {
        *x = if i % 3 == 0 { inf } else { nan };
    }
    c.v.clone_from(&c.k);
    // Real values in every key a row may see, from the final cu_seqlens_q
    // (every request, processed or not: filling more keys is harmless).
    for b in 0..bs {
        let len = i64::from(c.lens[b].max(0));
        let n = (i64::from(c.cu[b + 1]) - i64::from(c.cu[b])).max(0) as usize;
        let lo = needed_lo(len, n, c.window);
        fill_keys(&mut c, &mut r, b, lo..len);
    }
    c
}
