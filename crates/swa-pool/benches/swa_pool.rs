//! Criterion benches of the swa-pool kernels (CUDA-event device time):
//!
//! - `translate_loc/1M`: 1,048,576 token locations (pages of P = 64 in a
//!   shuffled order over a 2 M-slot pool, as a large prefill batch writes
//!   them); bytes moved = n · (8 read + 8 gathered + 8 written).
//! - `translate_loc/1M_random`: the same count, every location random (worst
//!   case for the gather).
//! - `translate_loc/256`: a decode-sized batch (bar ≤ 3 µs).
//! - `translate_pages/...`: SWA page table of a row set.
//!
//! After criterion, a markdown table: median µs, achieved GB/s and % of the
//! device-to-device copy ceiling measured in the same run (a copy of the same
//! byte count, and a 256 MiB copy). Without a GPU the bench says so and exits 0.

use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::timing::{copy_ceiling_gbps, launch_floor_us, median_us, per_launch_us, time_iters};
use kernel_rt::{DeviceErrors, Gpu, Strided, StridedMut};
use swa_pool::{SwaLocArgs, SwaLocKernel, SwaMapping, SwaPageArgs, SwaPageKernel};

/// Deterministic xorshift for input generation (no extra dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

const POOL_SLOTS: usize = 2 << 20;
const P: usize = 64;

/// A 2 M-slot full pool whose pages are all mapped to SWA pages in a shuffled order.
fn pool_map(rng: &mut Rng) -> SwaMapping {
    let mut m = SwaMapping::new(POOL_SLOTS, POOL_SLOTS, P).expect("valid sizes");
    let mut pages: Vec<usize> = (1..=POOL_SLOTS / P).collect();
    rng.shuffle(&mut pages);
    m.alloc_pages(&pages).expect("enough SWA pages");
    m
}

/// `n` locations: whole pages in a shuffled order (prefill-like).
fn paged_locs(rng: &mut Rng, n: usize) -> Vec<i64> {
    let mut pages: Vec<usize> = (1..=POOL_SLOTS / P).collect();
    rng.shuffle(&mut pages);
    pages
        .iter()
        .flat_map(|&pg| (0..P).map(move |o| (pg * P + o) as i64))
        .take(n)
        .collect()
}

struct LocBench {
    name: &'static str,
    input: CudaSlice<i64>,
    out: CudaSlice<i64>,
}

struct PageBench {
    name: String,
    r2t: CudaSlice<i32>,
    rows: usize,
    width: usize,
    rpi: CudaSlice<i64>,
    lens: CudaSlice<i32>,
    table: CudaSlice<i32>,
    m: usize,
    pages: usize,
}

fn run_loc(
    k: &SwaLocKernel,
    b: &mut LocBench,
    map: &CudaSlice<i64>,
    errors: &mut DeviceErrors,
) -> kernel_rt::Result<()> {
    let n = b.input.len();
    let mut args = SwaLocArgs {
        out_cache_loc: Strided::of("out_cache_loc", &b.input, [n])?,
        full_to_swa: Strided::of("full_to_swa", map, [map.len()])?,
        swa_loc: StridedMut::of("swa_loc", &mut b.out, [n])?,
    };
    k.launch(&mut args, errors)
}

fn run_pages(
    k: &SwaPageKernel,
    b: &mut PageBench,
    map: &CudaSlice<i64>,
    errors: &mut DeviceErrors,
) -> kernel_rt::Result<()> {
    let bs = b.rpi.len();
    let mut args = SwaPageArgs {
        req_to_token: Strided::of("req_to_token", &b.r2t, [b.rows, b.width])?,
        req_pool_indices: Strided::of("req_pool_indices", &b.rpi, [bs])?,
        cache_seqlens: Strided::of("cache_seqlens", &b.lens, [bs])?,
        page_size: P,
        full_to_swa: Strided::of("full_to_swa", map, [map.len()])?,
        swa_page_table: StridedMut::of("swa_page_table", &mut b.table, [bs, b.m])?,
    };
    k.launch(&mut args, errors)
}

/// A row set of `bs` requests of `len` tokens each, rows built from shuffled pages.
fn page_bench(gpu: &Arc<Gpu>, rng: &mut Rng, bs: usize, len: usize) -> PageBench {
    let s = gpu.stream();
    let m = len.div_ceil(P);
    let width = m * P;
    let mut r2t = Vec::with_capacity(bs * width);
    for _ in 0..bs {
        for _ in 0..m {
            let pg = 1 + rng.below((POOL_SLOTS / P) as u64) as usize;
            r2t.extend((0..P).map(|o| (pg * P + o) as i32));
        }
    }
    let rpi: Vec<i64> = (0..bs as i64).collect();
    PageBench {
        name: format!("translate_pages/bs{bs}_len{len}_P{P}"),
        r2t: s.clone_htod(&r2t).expect("htod"),
        rows: bs,
        width,
        rpi: s.clone_htod(&rpi).expect("htod"),
        lens: s.clone_htod(&vec![len as i32; bs]).expect("htod"),
        table: s.alloc_zeros::<i32>(bs * m).expect("alloc"),
        m,
        pages: bs * m,
    }
}

fn main() {
    let gpu = match Gpu::shared() {
        Ok(g) => g,
        Err(e) => {
            println!("swa-pool bench: no GPU ({e}); nothing measured");
            return;
        }
    };
    let s = gpu.stream().clone();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mapping = pool_map(&mut rng);
    let map = mapping.upload(&gpu).expect("upload");
    let lk = SwaLocKernel::new(&gpu).expect("load");
    let pk = SwaPageKernel::new(&gpu).expect("load");
    let mut errors = DeviceErrors::new(&gpu).expect("alloc");

    let n_big = 1 << 20;
    let random: Vec<i64> = (0..n_big)
        .map(|_| 1 + rng.below(POOL_SLOTS as u64 - 1) as i64)
        .collect();
    let small: Vec<i64> = paged_locs(&mut rng, 256);
    let mut locs = vec![
        LocBench {
            name: "translate_loc/1M",
            input: s.clone_htod(&paged_locs(&mut rng, n_big)).expect("htod"),
            out: s.alloc_zeros::<i64>(n_big).expect("alloc"),
        },
        LocBench {
            name: "translate_loc/1M_random",
            input: s.clone_htod(&random).expect("htod"),
            out: s.alloc_zeros::<i64>(n_big).expect("alloc"),
        },
        LocBench {
            name: "translate_loc/256",
            input: s.clone_htod(&small).expect("htod"),
            out: s.alloc_zeros::<i64>(256).expect("alloc"),
        },
    ];
    let mut pages = vec![
        page_bench(&gpu, &mut rng, 256, 4096),
        page_bench(&gpu, &mut rng, 64, 32768),
    ];

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
        .configure_from_args();
    for b in &mut locs {
        c.bench_function(b.name, |bch| {
            bch.iter_custom(|iters| {
                time_iters(&gpu, iters, || run_loc(&lk, b, &map, &mut errors))
                    .expect("timed launch")
            })
        });
    }
    for b in &mut pages {
        let name = b.name.clone();
        c.bench_function(&name, |bch| {
            bch.iter_custom(|iters| {
                time_iters(&gpu, iters, || run_pages(&pk, b, &map, &mut errors))
                    .expect("timed launch")
            })
        });
    }
    c.final_summary();

    // Table: median of 200 isolated launches (own event pair each) and the
    // mean of 2,000 back-to-back launches; throughput from the latter.
    let big_ceiling = copy_ceiling_gbps(&gpu, 256 << 20, 20).expect("copy ceiling");
    println!();
    let floor = launch_floor_us(&gpu).expect("launch floor");
    println!(
        "## swa-pool ({}; empty-launch floor {floor:.2} µs isolated)",
        gpu.describe()
    );
    println!();
    println!(
        "| case | median µs (isolated) | µs per launch back-to-back | bytes moved | GB/s | % of copy (same bytes) | % of copy (256 MiB) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for b in &mut locs {
        let iso = median_us(&gpu, 20, 200, || run_loc(&lk, b, &map, &mut errors)).expect("median");
        let us = per_launch_us(&gpu, 2000, || run_loc(&lk, b, &map, &mut errors)).expect("b2b");
        let bytes = b.input.len() * 24;
        let same = copy_ceiling_gbps(&gpu, bytes / 2, 200).expect("copy ceiling");
        let gbps = bytes as f64 / (us * 1e-6) / 1e9;
        println!(
            "| {} | {iso:.2} | {us:.2} | {bytes} | {gbps:.0} | {:.0}% | {:.0}% |",
            b.name,
            100.0 * gbps / same,
            100.0 * gbps / big_ceiling
        );
    }
    for b in &mut pages {
        let iso =
            median_us(&gpu, 20, 200, || run_pages(&pk, b, &map, &mut errors)).expect("median");
        let us = per_launch_us(&gpu, 2000, || run_pages(&pk, b, &map, &mut errors)).expect("b2b");
        // Per page: 4 B slot read + 8 B map gather + 4 B write (useful bytes;
        // the strided slot reads move whole 32 B sectors).
        let bytes = b.pages * 16;
        let same = copy_ceiling_gbps(&gpu, bytes / 2, 200).expect("copy ceiling");
        let gbps = bytes as f64 / (us * 1e-6) / 1e9;
        println!(
            "| {} | {iso:.2} | {us:.2} | {bytes} | {gbps:.0} | {:.0}% | {:.0}% |",
            b.name,
            100.0 * gbps / same,
            100.0 * gbps / big_ceiling
        );
    }
    let err = errors.read().expect("read");
    println!();
    println!("copy ceiling (256 MiB, read + write): {big_ceiling:.0} GB/s; error word after all runs: {err:?}");
}
