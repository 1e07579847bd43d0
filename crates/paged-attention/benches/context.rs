//! Bench of the context (prefill / chunked prefill) kernel: criterion
//! (`iter_custom` + CUDA events) and a markdown table of µs and TFLOP/s by
//! two methods: the isolated median (an event pair around each launch,
//! stream pre-filled) and the peers' method (`context_peers.py`): `n`
//! launches captured in one CUDA graph (`n` = 20 ms / the isolated median,
//! 1..=50), time = replay / n, median of 30 replays ([`graph_replay_us`]);
//! compare the graph columns with the peers. `MHA_KIT_BENCH_METHODS=1` adds,
//! per case, the default kernel timed by four methods in a row (a line
//! starting `methods |`) and a row with TMA boxes for K/V. FLOPs count the
//! causal pairs only: a request with prefix `p` and `n` new tokens has
//! `n·p + n(n+1)/2` visible (row, key) pairs, each `4·Hq·D` FLOPs
//! (`4·Hq·D·Σ L(L+1)/2` without a prefix). Pages are scattered
//! over the pool (P 16) unless the case says "contiguous" (one page of
//! `L` tokens per request). Prints a line and exits 0 without a GPU.
//! `MHA_KIT_BENCH_CASES=a|b|…` runs only the cases whose name contains one of
//! the `|`-separated substrings (`=name`: that name exactly). `MHA_KIT_BENCH_TRACE=1` also runs the
//! sm_90a trace entry on the D 128 bf16 cases and prints where a work item's
//! cycles go (per phase, by KV tiles per item; see `trace_report`).
//! `MHA_KIT_BENCH_TRACE_RAW=dir` also writes each trace's raw stamps there.
//! `MHA_KIT_BENCH_ZERO_KV=1` fills the K/V pools with zeros (the data the
//! no-K/V-reads experiment computes on) instead of random values.
//! `MHA_KIT_BENCH_DATA=torch` makes Q, K and V as torch's
//! `torch.rand(bf16) * 2 - 1` does (values on a 1/256 grid; see
//! `random_bf16`) instead of cutting an f32 uniform to bf16.
//! `MHA_KIT_BENCH_ALL_EXPERIMENTS=1` runs every leave-one-stage-out
//! experiment on the FA3 grid's D 128 32 × 512 cell too, and the one-CTA-per-
//! item grid and three experiments on every D 128 cell (by default the
//! experiments run only on the two headline cases), and the two-CTA (duo)
//! entries forced on beside the default on the FA3 grid's D 64 / 128 cells
//! and the headline cases (session 17: slower on every cell).
//! `MHA_KIT_BENCH_DEFAULT_ONLY=1` runs the default kernel only;
//! `MHA_KIT_BENCH_REPLAYS=n` takes the graph column's median over n
//! replays instead of 30 (a soak at the power cap).
//! `MHA_KIT_BENCH_VS=xv[,xv..]` runs each case with the default kernel and,
//! on the D 128 16-bit cases, the listed experiment entries only (e.g.
//! 4: no K/V reads), in the listed order, each row labelled
//! `experiment x{xv}`; `0` is a second instance of the default kernel, a
//! control for the rows' order in the run (every case runs the default
//! first).
//! `MHA_KIT_BENCH_TRIM_VS=1` runs each case with the default kernel and then
//! with schedule variant 4 (each item's last KV tile whole, the form before
//! the trimmed diagonal tile); `=2` in the other order.

use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::timing::{
    bench_case_selected, graph_replay_us, median_us, per_launch_us, time_iters,
};
use kernel_rt::{gpu_status, DeviceErrors, Gpu, GpuStatus, Result, Strided, StridedMut};
use paged_attention::{
    ContextArgs, ContextKernel, ContextKvLoad, ContextPath, HalfDtype, KvCache,
    CONTEXT_SM90_TRACE_CTAS, CONTEXT_SM90_TRACE_EVENTS, CONTEXT_SM90_TRACE_ITEMS,
};

struct Shape {
    name: String,
    hq: usize,
    hkv: usize,
    d: usize,
    bs: usize,
    /// New tokens per request.
    n: usize,
    /// Cached prefix per request.
    prefix: usize,
    /// Page size; 0 = one contiguous page per request.
    p: usize,
    fp8: bool,
}

fn shape(name: &str, d: usize, bs: usize, n: usize, prefix: usize, p: usize) -> Shape {
    Shape {
        name: name.to_string(),
        hq: 32,
        hkv: 8,
        d,
        bs,
        n,
        prefix,
        p,
        fp8: false,
    }
}

fn cases() -> Vec<Shape> {
    let mut v = vec![
        shape("bs 8 × 4096, P 16", 128, 8, 4096, 0, 16),
        shape("bs 1 × 16384, P 16", 128, 1, 16384, 0, 16),
        shape("bs 8 × 4096, contiguous", 128, 8, 4096, 0, 0),
        shape("bs 1 × 16384, contiguous", 128, 1, 16384, 0, 0),
        shape("bs 1 × 16384, P 64", 128, 1, 16384, 0, 64),
        shape(
            "chunked: bs 8 × 512 new over 16k prefix, P 16",
            128,
            8,
            512,
            16384,
            16,
        ),
        Shape {
            hq: 8,
            hkv: 1,
            ..shape(
                "TP-8: bs 1 × 1024 new over 128k prefix, P 16",
                128,
                1,
                1024,
                131072,
                16,
            )
        },
        Shape {
            fp8: true,
            ..shape("FP8 KV: bs 8 × 4096, P 16", 128, 8, 4096, 0, 16)
        },
        Shape {
            fp8: true,
            ..shape("FP8 KV: bs 1 × 16384, P 16", 128, 1, 16384, 0, 16)
        },
    ];
    for d in [64, 128, 256] {
        for (bs, l) in [
            (32, 512),
            (16, 1024),
            (8, 2048),
            (4, 4096),
            (2, 8192),
            (1, 16384),
        ] {
            v.push(shape(
                &format!("FA3 grid D {d}: bs {bs} × {l}"),
                d,
                bs,
                l,
                0,
                16,
            ));
        }
    }
    v
}

struct Prepared {
    q: CudaSlice<u16>,
    out: CudaSlice<u16>,
    k16: CudaSlice<u16>,
    v16: CudaSlice<u16>,
    k8: CudaSlice<u8>,
    v8: CudaSlice<u8>,
    pt: CudaSlice<i32>,
    lens: CudaSlice<i32>,
    cu_q: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    num_pages: usize,
    p: usize,
    m: usize,
    flops: f64,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// xorshift64* step.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// `n` bf16 values uniform in [-1, 1) (bits): an f32 uniform cut to bf16,
/// so every magnitude carries a random 7-bit mantissa. With `torch_like`
/// the values are made the way the peer scripts' `torch.rand(…, dtype=
/// torch.bfloat16) * 2 - 1` makes them: u rounded to bf16 first, then
/// 2u − 1 rounded to bf16, which leaves the values on a 1/256 grid (a
/// value of magnitude 2^-e keeps ~8 − e random mantissa bits). The kernel
/// runs at its power cap in graph replay (PERF.md session 32), where the
/// multipliers' power depends on the bits, so the two inputs time
/// differently; `MHA_KIT_BENCH_DATA=torch` selects the second.
fn random_bf16(state: &mut u64, n: usize, torch_like: bool) -> Vec<u16> {
    use half::bf16;
    (0..n)
        .map(|_| {
            let u = (next(state) >> 40) as f32 / (1u64 << 24) as f32;
            if torch_like {
                // `from_f32` rounds to nearest even, as torch's casts do.
                bf16::from_f32(2.0 * bf16::from_f32(u).to_f32() - 1.0).to_bits()
            } else {
                ((2.0 * u - 1.0).to_bits() >> 16) as u16
            }
        })
        .collect()
}

/// `n` e4m3 bytes with exponent ≤ 7 (|x| < 1), random sign and mantissa.
fn random_e4m3(state: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            let r = next(state);
            ((r & 0x80) | ((r >> 8) & 0x3F)) as u8
        })
        .collect()
}

fn prepare(gpu: &Arc<Gpu>, c: &Shape) -> Result<Prepared> {
    let st = gpu.stream();
    let len = c.prefix + c.n;
    let p = if c.p == 0 { len } else { c.p };
    let m = len.div_ceil(p);
    let used = c.bs * m;
    let num_pages = used + 1;
    let n = num_pages - 1;
    let mut stride = if c.p == 0 { 1 } else { 7919 % n.max(1) };
    while stride == 0 || gcd(stride, n) != 1 {
        stride += 1;
    }
    let ids: Vec<i32> = (0..used).map(|i| (1 + (i * stride) % n) as i32).collect();
    let elems = num_pages * p * c.hkv * c.d;
    let (n8, n16) = if c.fp8 { (elems, 1) } else { (1, elems) };
    // Random data (timing on constants can flatter a kernel): bf16 in
    // [-1, 1), e4m3 bytes of magnitude ≤ 1. MHA_KIT_BENCH_ZERO_KV=1 fills
    // K and V with zeros instead (what the no-K/V-reads experiment's tiles
    // hold), to tell the reads' cost from the zeros' lower power.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (c.n * 31 + c.d) as u64;
    let zero_kv = std::env::var("MHA_KIT_BENCH_ZERO_KV").is_ok_and(|v| v == "1");
    let torch_like = std::env::var("MHA_KIT_BENCH_DATA").is_ok_and(|v| v == "torch");
    let (k8, v8, k16, v16) = if zero_kv {
        (
            st.alloc_zeros::<u8>(n8)?,
            st.alloc_zeros::<u8>(n8)?,
            st.alloc_zeros::<u16>(n16)?,
            st.alloc_zeros::<u16>(n16)?,
        )
    } else {
        (
            st.clone_htod(&random_e4m3(&mut seed, n8))?,
            st.clone_htod(&random_e4m3(&mut seed, n8))?,
            st.clone_htod(&random_bf16(&mut seed, n16, torch_like))?,
            st.clone_htod(&random_bf16(&mut seed, n16, torch_like))?,
        )
    };
    let rows = c.bs * c.n;
    let q = st.clone_htod(&random_bf16(&mut seed, rows * c.hq * c.d, torch_like))?;
    let out = st.alloc_zeros::<u16>(rows * c.hq * c.d)?;
    let pt = st.clone_htod(&ids)?;
    let lens = st.clone_htod(&vec![len as i32; c.bs])?;
    let cu_q: Vec<i32> = (0..=c.bs).map(|b| (b * c.n) as i32).collect();
    let cu_k: Vec<i32> = (0..=c.bs).map(|b| (b * len) as i32).collect();
    let cu_q = st.clone_htod(&cu_q)?;
    let cu_k = st.clone_htod(&cu_k)?;
    let (nn, pp) = (c.n as f64, c.prefix as f64);
    let pairs = c.bs as f64 * (nn * pp + nn * (nn + 1.0) / 2.0);
    let flops = 4.0 * (c.hq * c.d) as f64 * pairs;
    Ok(Prepared {
        q,
        out,
        k16,
        v16,
        k8,
        v8,
        pt,
        lens,
        cu_q,
        cu_k,
        num_pages,
        p,
        m,
        flops,
    })
}

/// Launches per CUDA graph by the peers' method (`context_peers.py`): about
/// 20 ms of work a replay at `us` per launch, 1..=50 (timed over 30 replays).
fn peer_graph_calls(us: f64) -> usize {
    ((20_000.0 / us.max(1.0)) as usize).clamp(1, 50)
}

fn launch(
    kernel: &ContextKernel,
    c: &Shape,
    p: &mut Prepared,
    errors: &mut DeviceErrors,
) -> Result<()> {
    let rows = c.bs * c.n;
    let shape = [p.num_pages, c.hkv, p.p, c.d];
    let strides = [p.p * c.hkv * c.d, c.d, c.hkv * c.d, 1];
    let kv = if c.fp8 {
        KvCache::E4m3 {
            k: Strided::new("k_cache", p.k8.as_view(), shape, strides)?,
            v: Strided::new("v_cache", p.v8.as_view(), shape, strides)?,
        }
    } else {
        KvCache::Half {
            dtype: HalfDtype::Bf16,
            k: Strided::new("k_cache", p.k16.as_view(), shape, strides)?,
            v: Strided::new("v_cache", p.v16.as_view(), shape, strides)?,
        }
    };
    let mut args = ContextArgs {
        q: Strided::of("q", &p.q, [rows, c.hq, c.d])?,
        q_dtype: HalfDtype::Bf16,
        out: StridedMut::of("out", &mut p.out, [rows, c.hq, c.d])?,
        kv,
        page_table: Strided::of("page_table", &p.pt, [c.bs, p.m])?,
        cache_seqlens: Strided::of("cache_seqlens", &p.lens, [c.bs])?,
        cu_seqlens_q: Strided::of("cu_seqlens_q", &p.cu_q, [c.bs + 1])?,
        cu_seqlens_k: Some(Strided::of("cu_seqlens_k", &p.cu_k, [c.bs + 1])?),
        max_q_len: c.n,
        bmm1_scale: 1.0 / (c.d as f32).sqrt(),
        bmm2_scale: 1.0,
        window_left: None,
        sinks: None,
        max_kv_len: Some(c.prefix + c.n),
        lse: None,
    };
    kernel.launch(&mut args, errors)
}

/// Mean SM cycles per work item in each phase of the trace entry's stamps
/// (`ContextKernel::trace`), by the item's KV tiles (1..=4, then ≥ 5), for
/// the producer and the two consumers; the first item of each CTA and role
/// (start-up) is left out.
fn trace_report(words: &[u32]) -> String {
    const EV: usize = CONTEXT_SM90_TRACE_EVENTS;
    const NI: usize = CONTEXT_SM90_TRACE_ITEMS;
    let at =
        |cta: usize, n: usize, role: usize, ev: usize| words[((cta * NI + n) * 3 + role) * EV + ev];
    fn d(a: u32, b: u32) -> f64 {
        b.wrapping_sub(a) as f64
    }
    // Stamps of tile 1 exist on items of two tiles or more (NaN: not counted).
    fn two(c: &dyn Fn(usize, usize) -> u32, v: f64) -> f64 {
        if c(1, 12) >= 2 {
            v
        } else {
            f64::NAN
        }
    }
    // (role, phase name, value of item n of a CTA)
    type Phase = (
        usize,
        &'static str,
        fn(&dyn Fn(usize, usize) -> u32, &dyn Fn(usize, usize) -> u32) -> f64,
    );
    let phases: Vec<Phase> = vec![
        (0, "producer: item to item", |c, p| d(p(0, 0), c(0, 0))),
        (0, "consumer 0 − producer: item taken", |c, _| {
            d(c(0, 0), c(1, 0))
        }),
        (0, "producer: item taken → Q copies issued", |c, _| {
            d(c(0, 0), c(0, 1))
        }),
        (0, "producer: Q → K 0 copies issued", |c, _| {
            d(c(0, 1), c(0, 2))
        }),
        (0, "producer: K 0 → K 1 copies issued", |c, _| {
            two(c, d(c(0, 2), c(0, 3)))
        }),
        (
            0,
            "consumer 0 K 1 landed − producer K 1 issued",
            |c, _| two(c, d(c(0, 3), c(1, 10))),
        ),
        (1, "consumer 0: gap since the last epilogue", |c, p| {
            d(p(1, 9), c(1, 0))
        }),
        (1, "consumer 0: item geometry", |c, _| d(c(1, 0), c(1, 1))),
        (1, "consumer 0: item set-up", |c, _| d(c(1, 1), c(1, 22))),
        (1, "consumer 0: wait for Q", |c, _| d(c(1, 22), c(1, 2))),
        (1, "consumer 0: wait for K 0", |c, _| d(c(1, 2), c(1, 3))),
        (1, "consumer 0: S 0", |c, _| d(c(1, 3), c(1, 4))),
        (1, "consumer 0: softmax 0", |c, _| d(c(1, 4), c(1, 5))),
        (1, "consumer 0: tiles 1..", |c, _| d(c(1, 5), c(1, 6))),
        (1, "consumer 0:   tile 1: wait for K", |c, _| {
            two(c, d(c(1, 5), c(1, 10)))
        }),
        (1, "consumer 0:   tile 1: wait for V 0", |c, _| {
            two(c, d(c(1, 10), c(1, 11)))
        }),
        (1, "consumer 0:   tile 1: V 0 scan", |c, _| {
            two(c, d(c(1, 11), c(1, 14)))
        }),
        (1, "consumer 0:   fast tiles: issue S, P V", |c, _| {
            c(1, 16) as f64
        }),
        (1, "consumer 0:   fast tiles: wait for S", |c, _| {
            c(1, 17) as f64
        }),
        (1, "consumer 0:   fast tiles: softmax", |c, _| {
            c(1, 18) as f64
        }),
        (1, "consumer 0:   fast tiles: wait for P V", |c, _| {
            c(1, 19) as f64
        }),
        (1, "consumer 0:   fast tiles: rescale, pack", |c, _| {
            c(1, 20) as f64
        }),
        (1, "consumer 0: wait for the last V", |c, _| {
            d(c(1, 6), c(1, 7))
        }),
        (1, "consumer 0: last V scan", |c, _| d(c(1, 7), c(1, 15))),
        (1, "consumer 0: last P V", |c, _| d(c(1, 15), c(1, 8))),
        (1, "consumer 0: epilogue", |c, _| d(c(1, 8), c(1, 9))),
        (1, "consumer 0: item total (gap included)", |c, p| {
            d(p(1, 9), c(1, 9))
        }),
        (2, "consumer 1: item total (gap included)", |c, p| {
            d(p(2, 9), c(2, 9))
        }),
        (2, "consumer 1 − consumer 0: epilogue done", |c, _| {
            c(2, 9) as f64 - c(1, 9) as f64
        }),
    ];
    let buckets = ["1", "2", "3", "4", "≥ 5", "all"];
    let mut sums = vec![[0f64; 6]; phases.len()];
    let mut valid = vec![[0usize; 6]; phases.len()];
    let mut counts = [0usize; 6];
    let mut span = 0f64;
    let mut span_items = 0usize;
    for cta in 0..CONTEXT_SM90_TRACE_CTAS {
        let taken = |role: usize| at(cta, NI - 1, role, EV - 1) as usize;
        // Items whose stamps all three roles kept.
        let n_items = taken(0).min(taken(1)).min(taken(2)).min(NI - 1);
        if n_items >= 2 {
            span += d(at(cta, 1, 1, 9), at(cta, n_items - 1, 1, 9));
            span_items += n_items - 2;
        }
        for n in 1..n_items {
            let nt = at(cta, n, 1, 12) as usize;
            if nt == 0 || at(cta, n, 2, 12) as usize != nt || at(cta, n - 1, 1, 12) == 0 {
                continue;
            }
            let cur = |role: usize, ev: usize| at(cta, n, role, ev);
            let prev = |role: usize, ev: usize| at(cta, n - 1, role, ev);
            let b = nt.min(5) - 1;
            counts[b] += 1;
            counts[5] += 1;
            for (i, (_, _, f)) in phases.iter().enumerate() {
                let v = f(&cur, &prev);
                if v.is_nan() {
                    continue;
                }
                sums[i][b] += v;
                sums[i][5] += v;
                valid[i][b] += 1;
                valid[i][5] += 1;
            }
        }
    }
    let mut out = String::from("| phase (mean SM cycles per item) | ");
    out += &buckets.map(|b| format!("{b} tiles")).join(" | ");
    out += " |\n|---|";
    out += &"---:|".repeat(buckets.len());
    out += "\n| items traced | ";
    out += &counts.map(|c| c.to_string()).join(" | ");
    out += " |\n";
    for (i, (_, name, _)) in phases.iter().enumerate() {
        out += &format!("| {name} | ");
        let cells: Vec<String> = (0..6)
            .map(|b| {
                if valid[i][b] == 0 {
                    String::new()
                } else {
                    format!("{:.0}", sums[i][b] / valid[i][b] as f64)
                }
            })
            .collect();
        out += &cells.join(" | ");
        out += " |\n";
    }
    if span_items > 0 {
        out += &format!(
            "\nconsumer 0, items 2.. of each CTA: {:.0} cycles per item over {span_items} items\n",
            span / span_items as f64
        );
    }
    out + &tile_phase_report(&at)
}

/// Per fast tile of the loop (items of three tiles or more): each consumer's
/// mean cycles in the five accumulated phases, and the phase offset of the
/// two consumers (clock of tile 2's S issue, consumer 1 − consumer 0) in
/// loop periods: near 0 they run in lockstep, near ½ alternate.
fn tile_phase_report(at: &dyn Fn(usize, usize, usize, usize) -> u32) -> String {
    const NI: usize = CONTEXT_SM90_TRACE_ITEMS;
    const EV: usize = CONTEXT_SM90_TRACE_EVENTS;
    // (trace event, name) of the accumulated per-tile phases.
    const PHASES: [(usize, &str); 6] = [
        (16, "issue S, P V"),
        (17, "wait for S"),
        (18, "softmax"),
        (19, "wait for P V"),
        (20, "rescale, pack"),
        (23, "wait for K, V (before the issue)"),
    ];
    let mut acc = [[0f64; PHASES.len()]; 2];
    let mut tiles = [0f64; 2];
    let mut quarters = [0usize; 4];
    let mut offsets = 0usize;
    for cta in 0..CONTEXT_SM90_TRACE_CTAS {
        let taken = |role: usize| at(cta, NI - 1, role, EV - 1) as usize;
        let n_items = taken(1).min(taken(2)).min(NI - 1);
        for n in 0..n_items {
            let nt = at(cta, n, 1, 12) as usize;
            if nt < 3 || at(cta, n, 2, 12) as usize != nt {
                continue;
            }
            for c in 0..2 {
                for (a, (ev, _)) in acc[c].iter_mut().zip(PHASES) {
                    *a += at(cta, n, 1 + c, ev) as f64;
                }
                tiles[c] += (nt - 1) as f64;
            }
            let loop_cycles = at(cta, n, 1, 6).wrapping_sub(at(cta, n, 1, 5)) as f64;
            let period = loop_cycles / (nt - 1) as f64;
            if period > 0.0 {
                let delta = at(cta, n, 2, 21).wrapping_sub(at(cta, n, 1, 21)) as i32 as f64;
                let frac = (delta / period).rem_euclid(1.0);
                quarters[((frac * 4.0) as usize).min(3)] += 1;
                offsets += 1;
            }
        }
    }
    if tiles[0] == 0.0 {
        return String::new();
    }
    let mut out = String::from(
        "\n| per fast tile (items of ≥ 3 tiles) | consumer 0 | consumer 1 |\n|---|---:|---:|\n",
    );
    for (k, (_, name)) in PHASES.iter().enumerate() {
        out += &format!(
            "| {name} | {:.0} | {:.0} |\n",
            acc[0][k] / tiles[0],
            acc[1][k] / tiles[1]
        );
    }
    let sum = |c: usize| acc[c].iter().sum::<f64>() / tiles[c];
    out += &format!("| sum | {:.0} | {:.0} |\n", sum(0), sum(1));
    if offsets > 0 {
        let pct = quarters.map(|q| format!("{:.0}%", 100.0 * q as f64 / offsets as f64));
        out += &format!(
            "\nconsumer 1 − consumer 0 at tile 2, in loop periods (mod 1), over {offsets} items: \
             [0, ¼) {}, [¼, ½) {}, [½, ¾) {}, [¾, 1) {}\n",
            pct[0], pct[1], pct[2], pct[3]
        );
    }
    out
}

fn main() {
    if let GpuStatus::Missing(why) = gpu_status() {
        println!("context bench: no GPU ({why}); nothing measured");
        return;
    }
    let gpu = Gpu::shared().expect("GPU");
    let kernel = ContextKernel::new(&gpu).expect("load");
    // On the headline cases: the sm_90a kernel with consumer ping-pong
    // (variant 1, on the persistent grid) and the compute_90 kernel beside
    // the default one.
    let mut pingpong = ContextKernel::new(&gpu).expect("load");
    pingpong.set_variant(1);
    let fallback = ContextKernel::with_path(&gpu, ContextPath::Mma).expect("load");
    // The cp.async row gather forced (the default, Auto, gathers at every
    // page size today).
    let mut gather = ContextKernel::new(&gpu).expect("load");
    gather.set_kv_load(ContextKvLoad::Gather);
    // TMA boxes for K/V where the pages allow them (MHA_KIT_BENCH_METHODS=1
    // rows: does the gather's instruction stream cost the long cells in the
    // graph-replay column?).
    let mut tma = ContextKernel::new(&gpu).expect("load");
    tma.set_kv_load(ContextKvLoad::Tma);
    // Every item's last KV tile whole (schedule variant bit 2: no trimmed
    // diagonal tile), for MHA_KIT_BENCH_TRIM_VS.
    let mut whole_diag = ContextKernel::new(&gpu).expect("load");
    whole_diag.set_variant(4);
    let trim_vs: u32 = std::env::var("MHA_KIT_BENCH_TRIM_VS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // One CTA per work item instead of the persistent grid.
    let mut per_item = ContextKernel::new(&gpu).expect("load");
    per_item.set_variant(2);
    // No split KV (the launcher splits items that do not fill the GPU).
    let mut no_split = ContextKernel::new(&gpu).expect("load");
    no_split.set_kv_splits(Some(1));
    // Output rows stored by threads instead of TMA stores (the default).
    let mut o_threads = ContextKernel::new(&gpu).expect("load");
    o_threads.set_o_tma(false);
    // Q rows copied by the producer's cp.async instead of TMA (the default).
    let mut q_copies = ContextKernel::new(&gpu).expect("load");
    q_copies.set_q_tma(false);
    // The two-CTA (duo) entries forced on; the default follows
    // MHA_KIT_CONTEXT_DUO (unset: off).
    let mut duo_on = ContextKernel::new(&gpu).expect("load");
    duo_on.set_duo(Some(true));
    // Leave-one-stage-out timing experiments (wrong results by design).
    let experiments: Vec<(u32, ContextKernel)> = if kernel.uses_sm90() {
        [4u32, 512, 1024, 1536]
            .into_iter()
            .map(|xv| {
                let mut k = ContextKernel::new(&gpu).expect("load");
                k.set_experiment(xv).expect("experiment entry");
                (xv, k)
            })
            .collect()
    } else {
        Vec::new()
    };
    // Side-by-side experiments: MHA_KIT_BENCH_VS=xv[,xv..] runs every D 128
    // 16-bit case with only the default and these experiment entries.
    let vs_list: Vec<u32> = match std::env::var("MHA_KIT_BENCH_VS") {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => Vec::new(),
    };
    let vs_only = !vs_list.is_empty();
    // MHA_KIT_BENCH_DEFAULT_ONLY=1: only the default kernel on every case;
    // MHA_KIT_BENCH_REPLAYS=n: n graph replays a row instead of 30 (a soak
    // of n × ~20 ms, long enough for the clock to settle at the power cap).
    let default_only = std::env::var("MHA_KIT_BENCH_DEFAULT_ONLY").is_ok_and(|v| v == "1");
    let replays: usize = std::env::var("MHA_KIT_BENCH_REPLAYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    // (kernel, row label); the labels live as long as the bench.
    let vs: Vec<(ContextKernel, &'static str)> = if kernel.uses_sm90() {
        vs_list
            .iter()
            .map(|&xv| {
                let mut k = ContextKernel::new(&gpu).expect("load");
                k.set_experiment(xv).expect("experiment entry");
                let label: &'static str =
                    Box::leak(format!("experiment x{xv} (side by side)").into_boxed_str());
                (k, label)
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut errors = DeviceErrors::new(&gpu).expect("errors");
    let mut crit = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10);
    let mut table = Vec::new();
    let label = |k: &ContextKernel| {
        if !k.uses_sm90() {
            "sm90 mma.sync"
        } else if std::ptr::eq(k, &pingpong) {
            "sm90a wgmma, ping-pong"
        } else if std::ptr::eq(k, &per_item) {
            "sm90a wgmma, one CTA per item"
        } else if std::ptr::eq(k, &whole_diag) {
            "sm90a wgmma, last tiles whole (variant 4)"
        } else if std::ptr::eq(k, &gather) {
            "sm90a wgmma, cp.async gather"
        } else if std::ptr::eq(k, &tma) {
            "sm90a wgmma, TMA boxes for K/V"
        } else if std::ptr::eq(k, &no_split) {
            "sm90a wgmma, no KV split"
        } else if std::ptr::eq(k, &o_threads) {
            "sm90a wgmma, O stored by threads"
        } else if std::ptr::eq(k, &q_copies) {
            "sm90a wgmma, Q by cp.async"
        } else if std::ptr::eq(k, &duo_on) {
            "sm90a wgmma, duo entries forced"
        } else if let Some((_, l)) = vs.iter().find(|(e, _)| std::ptr::eq(k, e)) {
            l
        } else if let Some((xv, _)) = experiments.iter().find(|(_, e)| std::ptr::eq(k, e)) {
            match xv {
                4 => "experiment: no K/V reads",
                512 => "experiment: no V scan of masked tiles (correct on finite V)",
                1024 => "experiment: no epilogue global stores",
                1536 => "experiment: no V scan, no epilogue global stores",
                _ => "experiment: no K/V reads, no wgmma",
            }
        } else {
            "sm90a wgmma"
        }
    };
    let trace = std::env::var_os("MHA_KIT_BENCH_TRACE").is_some();
    let all_experiments = std::env::var("MHA_KIT_BENCH_ALL_EXPERIMENTS").is_ok_and(|v| v == "1");
    let methods = std::env::var("MHA_KIT_BENCH_METHODS").is_ok_and(|v| v == "1");
    // MHA_KIT_BENCH_TRACE_RAW=dir also writes each trace's raw words there.
    let trace_raw = std::env::var_os("MHA_KIT_BENCH_TRACE_RAW");
    let mut traces = Vec::new();
    // MHA_KIT_BENCH_CASES=a|b runs only the matching cases (profiling).
    let only = std::env::var("MHA_KIT_BENCH_CASES").ok();
    let mut warmed = false;
    for (i, c) in cases().into_iter().enumerate() {
        if !bench_case_selected(&c.name, only.as_deref()) {
            continue;
        }
        let mut p = prepare(&gpu, &c).expect("prepare");
        if !warmed {
            // The GPU's clocks settle under load: the first case's default
            // kernel read 3-6% low without this (H200, session 13).
            let t0 = std::time::Instant::now();
            while t0.elapsed() < Duration::from_millis(2000) {
                time_iters(&gpu, 20, || launch(&kernel, &c, &mut p, &mut errors)).expect("warm-up");
            }
            warmed = true;
        }
        let mut kernels: Vec<&ContextKernel> = vec![&kernel];
        if i == 4 && kernel.uses_sm90() {
            kernels.push(&gather);
        }
        if methods && kernel.uses_sm90() && !c.fp8 {
            kernels.push(&tma);
        }
        if c.name.starts_with("FA3 grid D 128") && all_experiments && kernel.uses_sm90() {
            kernels.push(&per_item);
        }
        if i < 2 && kernel.uses_sm90() {
            kernels.push(&o_threads);
            kernels.push(&q_copies);
        }
        if (c.name.starts_with("FA3 grid") || i < 2)
            && all_experiments
            && !c.fp8
            && c.d != 256
            && kernel.uses_sm90()
        {
            kernels.push(&duo_on);
        }
        if c.name.starts_with("FA3 grid D 128") && all_experiments {
            // With MHA_KIT_BENCH_ALL_EXPERIMENTS=1: the leave-one-stage-out
            // experiments that bound the per-item costs (D 128 entries);
            // every experiment on the shortest cell.
            let all = all_experiments && c.name.ends_with("32 × 512");
            kernels.extend(
                experiments
                    .iter()
                    .filter(|(xv, _)| all || [512, 1024, 1536].contains(xv))
                    .map(|(_, e)| e),
            );
        }
        if c.fp8 && kernel.uses_sm90() {
            kernels.push(&fallback);
        }
        if c.name.starts_with("TP-8") && kernel.uses_sm90() {
            kernels.push(&no_split);
        }
        if i < 4 && kernel.uses_sm90() {
            kernels.extend([&pingpong, &per_item, &gather, &fallback]);
            if i < 2 {
                kernels.extend(experiments.iter().map(|(_, e)| e));
            }
        }
        if vs_only || default_only {
            kernels = vec![&kernel];
            if c.d == 128 && !c.fp8 {
                kernels.extend(vs.iter().map(|(e, _)| e));
            }
        }
        if trim_vs != 0 && kernel.uses_sm90() {
            kernels = if trim_vs == 2 {
                vec![&whole_diag, &kernel]
            } else {
                vec![&kernel, &whole_diag]
            };
        }
        for k in kernels {
            crit.bench_function(&format!("{} ({})", c.name, label(k)), |b| {
                b.iter_custom(|iters| {
                    time_iters(&gpu, iters, || launch(k, &c, &mut p, &mut errors)).expect("time")
                })
            });
            let us = median_us(&gpu, 3, 20, || launch(k, &c, &mut p, &mut errors)).expect("median");
            let tflops = p.flops / (us * 1e-6) / 1e12;
            let calls = peer_graph_calls(us);
            let graph =
                match graph_replay_us(&gpu, calls, replays, |_| launch(k, &c, &mut p, &mut errors))
                {
                    Ok(g) => {
                        let g_tflops = p.flops / (g.median_us * 1e-6) / 1e12;
                        format!("{:.1} | {g_tflops:.0}", g.median_us)
                    }
                    Err(e) => format!("— | — ({e})"),
                };
            table.push(format!(
                "| {} | {}/{}/{} | {} | {us:.1} | {tflops:.0} | {graph} |",
                c.name,
                c.hq,
                c.hkv,
                c.d,
                label(k)
            ));
        }
        if methods && kernel.uses_sm90() {
            // MHA_KIT_BENCH_METHODS=1: the default kernel by four methods
            // in a row, to tell the methods' differences apart (µs):
            // graph of one launch, graph of n, isolated median of 150
            // launches (~as long a stretch as the graph's replays), and
            // back-to-back launches without events.
            let k = &kernel;
            let one = graph_replay_us(&gpu, 1, 30, |_| launch(k, &c, &mut p, &mut errors));
            let iso =
                median_us(&gpu, 3, 20, || launch(k, &c, &mut p, &mut errors)).expect("median");
            let calls = peer_graph_calls(iso);
            let n = graph_replay_us(&gpu, calls, 30, |_| launch(k, &c, &mut p, &mut errors));
            let long =
                median_us(&gpu, 3, 150, || launch(k, &c, &mut p, &mut errors)).expect("median");
            let b2b = per_launch_us(&gpu, 150, || launch(k, &c, &mut p, &mut errors)).expect("b2b");
            let g = |r: &Result<kernel_rt::timing::GraphTiming>| {
                r.as_ref()
                    .map_or_else(|e| format!("error {e}"), |g| format!("{:.1}", g.median_us))
            };
            println!(
                "methods | {} | graph×1 {} | iso×20 {iso:.1} | graph×{calls} {} | iso×150 {long:.1} | back-to-back×150 {b2b:.1}",
                c.name,
                g(&one),
                g(&n)
            );
        }
        if trace
            && c.d == 128
            && !c.fp8
            && kernel.uses_sm90()
            && (c.name.starts_with("FA3") || c.name.starts_with("bs "))
        {
            // The trace entry (experiment 8): the default kernel, variant 1
            // with consumer ping-pong. (The traced experiments 72 and 40 were
            // dropped in sessions 28 and 44; asking for 72 here made this
            // loop fail to load until session 43.)
            for variant in [0i32, 1] {
                let mut tracer = ContextKernel::new(&gpu).expect("load");
                tracer.set_experiment(8).expect("trace entry");
                tracer.set_kv_splits(Some(1));
                tracer.set_variant(variant);
                for _ in 0..3 {
                    launch(&tracer, &c, &mut p, &mut errors).expect("trace launch");
                }
                let words = tracer.trace().expect("trace");
                if let Some(dir) = &trace_raw {
                    // The raw stamps, u32 little-endian in the trace layout
                    // (CONTEXT_SM90_TRACE_*), for a per-item timeline.
                    let slug: String = c
                        .name
                        .chars()
                        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
                        .collect();
                    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                    let path =
                        std::path::Path::new(dir).join(format!("trace-{slug}-x8-v{variant}.bin"));
                    std::fs::write(&path, bytes).expect("write the raw trace");
                }
                let what = if variant == 0 { "" } else { ", ping-pong" };
                traces.push(format!("### {}{what}\n\n{}", c.name, trace_report(&words)));
            }
        }
        drop(p);
    }
    for t in &traces {
        println!("\n{t}");
    }
    let rep = errors.read().expect("errors");
    println!(
        "\n## paged-attention context (prefill) on {} (error word {:?})\n",
        gpu.describe(),
        rep
    );
    println!(
        "| case | Hq/Hkv/D | kernel | µs | TFLOP/s (causal pairs) | graph µs | graph TFLOP/s |\n\
         |---|---|---|---:|---:|---:|---:|"
    );
    for row in table {
        println!("{row}");
    }
    println!(
        "\ndefault sm90a kernel: {} of {} launches loaded K/V with TMA boxes, {} stored O with TMA, {} loaded Q with TMA",
        kernel.tma_launches(),
        kernel.launches(),
        kernel.o_tma_launches(),
        kernel.q_tma_launches()
    );
}
