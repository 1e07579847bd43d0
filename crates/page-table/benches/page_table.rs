#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn
//! Page-table build: device time (CUDA events) over bs × max context × P.
//!
//! `max context` sets the table width (`M = ceil(ctx / P)`); row lengths are
//! drawn uniformly from `[1, ctx]` (seeded), as in a real batch. The headline
//! case (bs 256, 32k, P 16) is also timed with every row at its full length,
//! the worst case. `req_to_token` rows hold page-contiguous random pages.
//! Prints criterion's statistics, then a markdown table with two device
//! times: the median of launches each bracketed by its own CUDA-event pair
//! (isolated; includes the event pair's own cost, see the empty-launch floor
//! in the heading), and the mean per launch of 2,000 launches back to back
//! behind a filled stream (what a launch costs inside a CUDA-graph replay).
//! Throughput columns use the back-to-back time, against the
//! device-to-device copy ceiling measured in the same run.

use std::sync::Arc;

use criterion::{criterion_group, BenchmarkId, Criterion};
use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::timing::{copy_ceiling_gbps, launch_floor_us, median_us, per_launch_us, time_iters};
use kernel_rt::{gpu_status, DeviceErrors, Gpu, GpuStatus, Result, Strided, StridedMut};
use page_table::{PageTableArgs, PageTableKernel};

const BATCH: [usize; 4] = [1, 64, 256, 512];
const CONTEXT: [usize; 3] = [4096, 32768, 131072];
const PAGE: [usize; 3] = [1, 16, 64];

/// Device inputs shared by every case of one context length.
struct Inputs {
    req_to_token: CudaSlice<i32>,
    rows: usize,
    width: usize,
    req_pool_indices: CudaSlice<i64>,
}

/// `[max_bs + 1, ctx]`: row r + 1 holds a random permutation of pages laid out
/// page-contiguously (slot = page · 64 + offset works for every P ≤ 64 dividing 64).
fn inputs(gpu: &Arc<Gpu>, ctx: usize, max_bs: usize) -> Result<Inputs> {
    let rows = max_bs + 1;
    let mut r2t = vec![0i32; rows * ctx];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for row in r2t.chunks_mut(ctx).skip(1) {
        for (chunk_idx, chunk) in row.chunks_mut(64).enumerate() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let page = (state % 4_000_000) as i32 + 1 + chunk_idx as i32 % 3;
            for (o, v) in chunk.iter_mut().enumerate() {
                *v = page * 64 + o as i32;
            }
        }
    }
    let rpi: Vec<i64> = (1..=max_bs as i64).collect();
    let s = gpu.stream();
    Ok(Inputs {
        req_to_token: s.clone_htod(&r2t)?,
        rows,
        width: ctx,
        req_pool_indices: s.clone_htod(&rpi)?,
    })
}

struct Case<'a> {
    kernel: &'a PageTableKernel,
    inputs: &'a Inputs,
    lens: CudaSlice<i32>,
    table: CudaSlice<i32>,
    errors: DeviceErrors,
    bs: usize,
    p: usize,
    m: usize,
    /// Live pages over all rows.
    entries: usize,
}

impl<'a> Case<'a> {
    fn new(
        gpu: &Arc<Gpu>,
        kernel: &'a PageTableKernel,
        inputs: &'a Inputs,
        bs: usize,
        p: usize,
        full_rows: bool,
    ) -> Result<Self> {
        let ctx = inputs.width;
        let m = ctx.div_ceil(p);
        let mut state = 0x2545_F491_4F6C_DD1Du64 ^ (bs * 31 + p) as u64;
        let lens: Vec<i32> = (0..bs)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if full_rows {
                    ctx as i32
                } else {
                    1 + (state % ctx as u64) as i32
                }
            })
            .collect();
        let entries = lens.iter().map(|&l| (l as usize).div_ceil(p)).sum();
        let s = gpu.stream();
        Ok(Self {
            kernel,
            inputs,
            lens: s.clone_htod(&lens)?,
            table: s.alloc_zeros::<i32>(bs * m)?,
            errors: DeviceErrors::new(gpu)?,
            bs,
            p,
            m,
            entries,
        })
    }

    fn launch(&mut self) -> Result<()> {
        let mut args = PageTableArgs {
            req_to_token: Strided::of(
                "req_to_token",
                &self.inputs.req_to_token,
                [self.inputs.rows, self.inputs.width],
            )?,
            req_pool_indices: Strided::contiguous(
                "req_pool_indices",
                self.inputs.req_pool_indices.slice(0..self.bs),
                [self.bs],
            )?,
            cache_seqlens: Strided::of("cache_seqlens", &self.lens, [self.bs])?,
            page_size: self.p,
            page_table: StridedMut::of("page_table", &mut self.table, [self.bs, self.m])?,
            swa: None,
            pool_slots: None,
        };
        self.kernel.launch(&mut args, &mut self.errors)
    }
}

fn bench(c: &mut Criterion) {
    let gpu = match gpu_status() {
        GpuStatus::Available { .. } => Gpu::shared().expect("GPU detected but not usable"),
        GpuStatus::Missing(why) => {
            println!("page_table bench: no GPU ({why}); nothing to measure");
            return;
        }
    };
    let kernel = PageTableKernel::new(&gpu).expect("load page_table PTX");
    let ceiling = copy_ceiling_gbps(&gpu, 1 << 30, 20).expect("copy ceiling");
    let floor = launch_floor_us(&gpu).expect("launch floor");
    let max_bs = *BATCH.iter().max().unwrap_or(&1);
    let mut rows = Vec::new();
    let mut group = c.benchmark_group("page_table_build");
    for ctx in CONTEXT {
        let inputs = inputs(&gpu, ctx, max_bs).expect("inputs");
        let mut shapes: Vec<(usize, usize, bool)> = BATCH
            .iter()
            .flat_map(|&bs| PAGE.iter().map(move |&p| (bs, p, false)))
            .collect();
        if ctx == 32768 {
            shapes.push((256, 16, true));
        }
        for (bs, p, full_rows) in shapes {
            {
                let mut case = Case::new(&gpu, &kernel, &inputs, bs, p, full_rows).expect("case");
                let lens = if full_rows { "full" } else { "random" };
                let id = BenchmarkId::from_parameter(format!("bs{bs}_ctx{ctx}_P{p}_{lens}"));
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        time_iters(&gpu, iters, || case.launch()).expect("timing")
                    })
                });
                let before = kernel.launches();
                let us = median_us(&gpu, 5, 51, || case.launch()).expect("median");
                let per_launch = (kernel.launches() - before) / 56;
                let report = case.errors.read().expect("error word");
                assert!(
                    report.is_clean(),
                    "benchmark input produced device errors: {report:?}"
                );
                let b2b = per_launch_us(&gpu, 2000, || case.launch()).expect("back-to-back");
                let entries = case.entries;
                let gbps = (entries * 8) as f64 / (b2b * 1e-6) / 1e9;
                rows.push(format!(
                    "| {bs} | {ctx} | {p} | {lens} | {per_launch} | {us:.2} | {b2b:.2} | {:.0} | {gbps:.0} | {:.1}% |",
                    entries as f64 / b2b,
                    100.0 * gbps / ceiling
                ));
            }
        }
    }
    group.finish();
    println!(
        "## page_table_build on {} (copy ceiling {ceiling:.0} GB/s read+write; empty-launch floor {floor:.2} µs)",
        gpu.describe()
    );
    println!("| bs | max context | P | lengths | launches | median µs (isolated) | µs per launch back-to-back | entries/µs | GB/s (4 B read + 4 B written per entry) | % of copy |");
    println!("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!("{r}");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1))
        .sample_size(10);
    targets = bench
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
