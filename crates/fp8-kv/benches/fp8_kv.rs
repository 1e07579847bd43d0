#![allow(missing_docs)] // criterion_group! generates an undocumented pub fn
//! KV writes: device time (CUDA events) of the fused FP8 write and of the
//! bf16 `set_kv_buffer`, prefill-sized (16,384 tokens) and decode-sized (64
//! tokens), 8 KV heads × 128 dims, page size 64.
//!
//! Slots are page-contiguous in pages of a random order inside a pool four
//! times larger than the write (page 0 never used). Prints criterion's
//! statistics, then a markdown table: median µs, bytes read + written per
//! second and % of the device-to-device copy ceiling measured in the same run,
//! against the bars (≥ 85% of copy for 16,384 tokens, ≤ 4 µs for 64).
//! Two A/B rows (no bar) run the 16,384-token fused bf16 and copy writes on a
//! grid planned for 4× the SMs (four waves, fewer tokens per thread) against
//! the launcher's one-wave grid.

use std::sync::Arc;

use criterion::{criterion_group, BenchmarkId, Criterion};
use fp8_kv::{KvCacheDtype, KvDtype, KvScales, KvWriteArgs, KvWriteKernel};
use kernel_rt::cudarc::driver::CudaSlice;
use kernel_rt::timing::{copy_ceiling_gbps, launch_floor_us, median_us, per_launch_us, time_iters};
use kernel_rt::{gpu_status, DeviceErrors, Gpu, GpuStatus, Result, Strided, StridedMut};

const HEADS: usize = 8;
const DIM: usize = 128;
const PAGE: usize = 64;
const TOKENS: [usize; 2] = [16_384, 64];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Fp8Bf16,
    Fp8F16,
    SetBf16,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Fp8Bf16 => "fused_fp8_write_bf16",
            Op::Fp8F16 => "fused_fp8_write_f16",
            Op::SetBf16 => "set_kv_buffer_bf16",
        }
    }

    /// Bytes read + written by one call of `n` tokens.
    fn bytes(self, n: usize) -> usize {
        let elems = 2 * n * HEADS * DIM;
        let out = if self == Op::SetBf16 { 2 } else { 1 };
        elems * 2 + n * 8 + elems * out
    }
}

struct Case {
    kernel: Arc<KvWriteKernel>,
    op: Op,
    n: usize,
    slots: usize,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    loc: CudaSlice<i64>,
    kc8: CudaSlice<u8>,
    vc8: CudaSlice<u8>,
    kc16: CudaSlice<u16>,
    vc16: CudaSlice<u16>,
    errors: DeviceErrors,
    scales: KvScales,
}

impl Case {
    fn new(gpu: &Arc<Gpu>, kernel: &Arc<KvWriteKernel>, op: Op, n: usize) -> Result<Self> {
        let pages = 4 * n.div_ceil(PAGE);
        let slots = (pages + 1) * PAGE;
        let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ n as u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut order: Vec<usize> = (1..=pages).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let loc: Vec<i64> = (0..n)
            .map(|t| (order[t / PAGE] * PAGE + t % PAGE) as i64)
            .collect();
        let rows = n * HEADS * DIM;
        let vals: Vec<u16> = (0..rows)
            .map(|_| half::bf16::from_f32(((next() % 2001) as f32 - 1000.0) * 0.37).to_bits())
            .collect();
        let s = gpu.stream();
        let fp8 = op != Op::SetBf16;
        let cache = |on: bool| if on { slots * HEADS * DIM } else { 1 };
        Ok(Self {
            kernel: kernel.clone(),
            op,
            n,
            slots,
            k: s.clone_htod(&vals)?,
            v: s.clone_htod(&vals)?,
            loc: s.clone_htod(&loc)?,
            kc8: s.alloc_zeros::<u8>(cache(fp8))?,
            vc8: s.alloc_zeros::<u8>(cache(fp8))?,
            kc16: s.alloc_zeros::<u16>(cache(!fp8))?,
            vc16: s.alloc_zeros::<u16>(cache(!fp8))?,
            errors: DeviceErrors::new(gpu)?,
            scales: KvScales::from_values(KvCacheDtype::Fp8E4m3, Some(0.9), Some(1.7)),
        })
    }

    fn launch(&mut self) -> Result<()> {
        let shape = [self.n, HEADS, DIM];
        let cshape = [self.slots, HEADS, DIM];
        let k = Strided::of("k", &self.k, shape)?;
        let v = Strided::of("v", &self.v, shape)?;
        let cache_loc = Strided::of("cache_loc", &self.loc, [self.n])?;
        match self.op {
            Op::SetBf16 => {
                let mut args = KvWriteArgs {
                    k,
                    v,
                    cache_loc,
                    k_cache: StridedMut::of("k_cache", &mut self.kc16, cshape)?,
                    v_cache: StridedMut::of("v_cache", &mut self.vc16, cshape)?,
                    page_size: PAGE,
                };
                self.kernel.set_kv_buffer(&mut args, &mut self.errors)
            }
            Op::Fp8Bf16 | Op::Fp8F16 => {
                let dtype = if self.op == Op::Fp8F16 {
                    KvDtype::F16
                } else {
                    KvDtype::Bf16
                };
                let mut args = KvWriteArgs {
                    k,
                    v,
                    cache_loc,
                    k_cache: StridedMut::of("k_cache", &mut self.kc8, cshape)?,
                    v_cache: StridedMut::of("v_cache", &mut self.vc8, cshape)?,
                    page_size: PAGE,
                };
                self.kernel.fused_fp8_set_kv_buffer(
                    &mut args,
                    dtype,
                    &self.scales,
                    &mut self.errors,
                )
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let gpu = match gpu_status() {
        GpuStatus::Available { .. } => Gpu::shared().expect("GPU detected but not usable"),
        GpuStatus::Missing(why) => {
            println!("fp8_kv bench: no GPU ({why}); nothing to measure");
            return;
        }
    };
    let kernel = Arc::new(KvWriteKernel::new(&gpu).expect("load fp8_kv PTX"));
    // A/B of the grid: the same kernels on a grid planned for 4× the SMs
    // (four waves, fewer tokens per thread) instead of one wave.
    let sms = kernel.sm_count();
    let kernel_4w = Arc::new(
        KvWriteKernel::new(&gpu)
            .expect("load fp8_kv PTX")
            .with_sm_count(4 * sms),
    );
    let ceiling = copy_ceiling_gbps(&gpu, 1 << 30, 20).expect("copy ceiling");
    let ceiling_64m = copy_ceiling_gbps(&gpu, 64 << 20, 50).expect("copy ceiling 64 MiB");
    let mut rows = Vec::new();
    let mut group = c.benchmark_group("fp8_kv");
    let runs = TOKENS.iter().flat_map(|&n| {
        [Op::Fp8Bf16, Op::SetBf16, Op::Fp8F16]
            .into_iter()
            .filter(move |&op| op != Op::Fp8F16 || n == TOKENS[0])
            .map(move |op| (n, op, false))
    });
    let ab = [
        (TOKENS[0], Op::Fp8Bf16, true),
        (TOKENS[0], Op::SetBf16, true),
    ];
    for (n, op, four_waves) in runs.chain(ab) {
        let k = if four_waves { &kernel_4w } else { &kernel };
        let mut case = Case::new(&gpu, k, op, n).expect("case");
        let name = if four_waves {
            format!("{} (grid of 4 waves, A/B)", op.name())
        } else {
            op.name().to_string()
        };
        let id = BenchmarkId::new(&name, format!("{n}x{HEADS}x{DIM}"));
        group.bench_function(id, |b| {
            b.iter_custom(|iters| time_iters(&gpu, iters, || case.launch()).expect("timing"))
        });
        let before = k.launches();
        let us = median_us(&gpu, 10, 101, || case.launch()).expect("median");
        let per_call = (k.launches() - before) / 111;
        let b2b = per_launch_us(&gpu, 2000, || case.launch()).expect("back-to-back");
        let report = case.errors.read().expect("error word");
        assert!(
            report.is_clean(),
            "benchmark input produced device errors: {report:?}"
        );
        let gbps = op.bytes(n) as f64 / (us * 1e-6) / 1e9;
        let pct = 100.0 * gbps / ceiling;
        // A device-to-device copy moving the same bytes (read + written).
        let same = copy_ceiling_gbps(&gpu, op.bytes(n) / 2, 101).expect("same-size copy");
        let pct_same = 100.0 * gbps / same;
        let (bar, pass) = if four_waves {
            ("(A/B only)".to_string(), true)
        } else if n == TOKENS[0] {
            ("≥ 85% of copy".to_string(), pct >= 85.0)
        } else {
            ("≤ 4 µs (back-to-back)".to_string(), b2b <= 4.0)
        };
        rows.push(format!(
                "| {name} | {n} × {HEADS} × {DIM} | {per_call} | {us:.2} | {b2b:.2} | {} | {gbps:.0} | {pct:.1}% | {pct_same:.1}% | {bar} | {} |",
                op.bytes(n),
                if pass { "pass" } else { "FAIL" }
            ));
    }
    group.finish();
    let floor = launch_floor_us(&gpu).expect("launch floor");
    println!(
        "## fp8_kv writes on {} ({sms} SMs; copy ceiling {ceiling:.0} GB/s read+write at 1 GiB; {ceiling_64m:.0} GB/s at 64 MiB; empty-launch floor {floor:.2} µs isolated)",
        gpu.describe()
    );
    println!("| op | tokens × Hkv × D | launches | median µs (isolated) | µs per launch back-to-back | bytes (read + written) | GB/s (isolated) | % of copy (1 GiB) | % of a copy of the same bytes | bar | result |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
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
