//! CUDA-event timing: device time of stream work, without host clocks.

use std::time::Duration;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::{Gpu, KernelError, PtxModule, Result};

/// kernel-rt's own PTX (the stream-filling spin kernel).
pub const PTX: PtxModule = PtxModule {
    name: "kernel_rt",
    ptx: include_str!("../ptx/kernel_rt.ptx"),
    cubin: Some(crate::Cubin {
        arch: crate::CubinArch::Sm90,
        image: include_bytes!("../ptx/kernel_rt.sm_90.cubin"),
        stamp: include_str!("../ptx/kernel_rt.sm_90.cubin.stamp"),
    }),
};

/// Host time budgeted per queued launch when sizing the spin that keeps the
/// stream busy while the host queues timed work.
const HOST_US_PER_LAUNCH: f64 = 12.0;
/// Longest spin, in microseconds.
const MAX_SPIN_US: f64 = 200_000.0;

/// Occupies `gpu`'s stream for about `us` microseconds (a one-thread kernel
/// spinning on the global timer). Timed work queued behind it then runs back
/// to back, so event pairs measure device time, not host launch gaps.
///
/// # Errors
/// [`crate::KernelError::Load`] / [`crate::KernelError::Driver`].
pub fn fill_stream(gpu: &Gpu, us: f64) -> Result<()> {
    let f = gpu.function(&PTX, "kernel_rt_spin")?;
    let ns = (us.clamp(0.0, MAX_SPIN_US) * 1e3) as u64;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&ns);
    // SAFETY: the kernel takes one u64 by value and touches no memory.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// Device time of `iters` back-to-back calls of `work` on `gpu`'s stream,
/// measured between two CUDA events (for criterion's `iter_custom`). The
/// stream is filled first ([`fill_stream`]) so that, up to a 200 ms spin,
/// host launch gaps do not count.
///
/// # Errors
/// The first error of `work` or of the driver.
pub fn time_iters(gpu: &Gpu, iters: u64, mut work: impl FnMut() -> Result<()>) -> Result<Duration> {
    let ctx = gpu.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    fill_stream(gpu, iters as f64 * HOST_US_PER_LAUNCH)?;
    start.record(gpu.stream())?;
    for _ in 0..iters {
        work()?;
    }
    end.record(gpu.stream())?;
    let ms = start.elapsed_ms(&end)?;
    Ok(Duration::from_secs_f64(f64::from(ms) * 1e-3))
}

/// Median device time in microseconds of one call of `work`, over `runs`
/// calls each bracketed by its own event pair, after `warmup` untimed calls.
/// The stream is filled first ([`fill_stream`]) so each pair measures the
/// work's device time, not the host's launch gap before it.
///
/// # Errors
/// The first error of `work` or of the driver.
pub fn median_us(
    gpu: &Gpu,
    warmup: usize,
    runs: usize,
    mut work: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warmup {
        work()?;
    }
    let ctx = gpu.context();
    let mut events = Vec::with_capacity(runs);
    fill_stream(gpu, runs.max(1) as f64 * 3.0 * HOST_US_PER_LAUNCH)?;
    for _ in 0..runs.max(1) {
        let a = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let b = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        a.record(gpu.stream())?;
        work()?;
        b.record(gpu.stream())?;
        events.push((a, b));
    }
    let mut us = Vec::with_capacity(events.len());
    for (a, b) in &events {
        us.push(f64::from(a.elapsed_ms(b)?) * 1e3);
    }
    Ok(median(&mut us))
}

/// Device time per call (µs) of `work` run `iters` times back to back behind
/// a filled stream ([`time_iters`] / `iters`): what each launch costs inside a
/// CUDA-graph replay or any busy stream, without the per-launch event pair
/// that [`median_us`] adds. Report it beside the median for launches of a
/// few microseconds.
///
/// # Errors
/// The first error of `work` or of the driver.
pub fn per_launch_us(gpu: &Gpu, iters: u64, work: impl FnMut() -> Result<()>) -> Result<f64> {
    let total = time_iters(gpu, iters.max(1), work)?;
    Ok(total.as_secs_f64() * 1e6 / iters.max(1) as f64)
}

/// Per-call device time of CUDA-graph replays ([`graph_replay_us`]), in
/// microseconds per call (replay time / `calls`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphTiming {
    /// Median over the timed replays.
    pub median_us: f64,
    /// Fastest replay.
    pub min_us: f64,
    /// 90th percentile (the sorted sample's element at `⌊0.9 (replays − 1)⌋`).
    pub p90_us: f64,
    /// Calls captured in the graph.
    pub calls: usize,
    /// Replays timed.
    pub replays: usize,
}

/// Device time per call (µs) of `work` replayed from one CUDA graph: what a
/// launch costs inside a serving engine's graph replay, without per-launch
/// event pairs or host launch gaps.
///
/// Method: `work(0)` runs once eagerly (module load, lazy init); then
/// `work(0)`, …, `work(calls − 1)` are captured on [`Gpu::stream`] (thread-
/// local capture mode) into one graph, which is uploaded and replayed 3
/// times untimed. Behind a filled stream ([`fill_stream`]), `replays`
/// replays are each bracketed by their own CUDA event pair; each replay's
/// time / `calls` is one sample. `calls` and `replays` are at least 1.
/// `work(i)` must only queue capturable stream work (no synchronisation, no
/// host copies); give it a different input set per `i` to time cold caches.
///
/// # Errors
/// The first error of `work` or of the driver (capture, instantiation,
/// replay); [`KernelError::Unsupported`] when the capture recorded no work.
pub fn graph_replay_us(
    gpu: &Gpu,
    calls: usize,
    replays: usize,
    mut work: impl FnMut(usize) -> Result<()>,
) -> Result<GraphTiming> {
    let (calls, replays) = (calls.max(1), replays.max(1));
    let stream = gpu.stream();
    work(0)?;
    stream.synchronize()?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let recorded = (0..calls).try_for_each(&mut work);
    // End the capture even when `work` failed, so the stream is usable.
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    recorded?;
    let graph = ended?
        .ok_or_else(|| KernelError::unsupported("work", "the stream capture recorded no work"))?;
    graph.upload()?;
    for _ in 0..3 {
        graph.launch()?;
    }
    stream.synchronize()?;
    let ctx = gpu.context();
    let mut events = Vec::with_capacity(replays);
    for _ in 0..replays {
        events.push((
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        ));
    }
    fill_stream(gpu, replays as f64 * 3.0 * HOST_US_PER_LAUNCH)?;
    for (a, b) in &events {
        a.record(stream)?;
        graph.launch()?;
        b.record(stream)?;
    }
    let mut us = Vec::with_capacity(replays);
    for (a, b) in &events {
        us.push(f64::from(a.elapsed_ms(b)?) * 1e3 / calls as f64);
    }
    // `median` sorts the sample: min and p90 read it afterwards.
    let median_us = median(&mut us);
    Ok(GraphTiming {
        median_us,
        min_us: us[0],
        p90_us: us[(0.9 * (replays - 1) as f64) as usize],
        calls,
        replays,
    })
}

/// Median device time (µs) of an empty launch (the spin kernel asked to
/// spin 0 ns), measured like [`median_us`]: the floor under any kernel's
/// time on this machine. Print it beside benchmark tables.
///
/// # Errors
/// [`crate::KernelError::Load`] / [`crate::KernelError::Driver`].
pub fn launch_floor_us(gpu: &Gpu) -> Result<f64> {
    let f = gpu.function(&PTX, "kernel_rt_spin")?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let zero = 0u64;
    median_us(gpu, 5, 101, || {
        let mut b = gpu.stream().launch_builder(&f);
        b.arg(&zero);
        // SAFETY: the kernel takes one u64 by value and touches no memory.
        unsafe { b.launch(cfg) }?;
        Ok(())
    })
}

/// Whether a bench case named `name` is selected by `filter`, the value of a
/// bench's `MHA_KIT_BENCH_CASES`: `|`-separated alternatives, each a
/// substring of the name or, with a leading `=`, the whole name. `None`
/// (the variable unset) selects every case.
pub fn bench_case_selected(name: &str, filter: Option<&str>) -> bool {
    filter.is_none_or(|f| {
        f.split('|').any(|alt| match alt.strip_prefix('=') {
            Some(exact) => name == exact,
            None => name.contains(alt),
        })
    })
}

/// Median of a non-empty sample (mean of the two middle values for even n);
/// NaN for an empty one. Sorts `v` in place (ascending).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The device's copy ceiling: bytes read + written per second (GB/s, 1e9) of
/// a device-to-device copy of `bytes` bytes, median of `runs` timed copies.
/// Measure it in the same run as the kernel it is compared with.
///
/// # Errors
/// [`crate::KernelError::Driver`] when allocation or the copy fails.
pub fn copy_ceiling_gbps(gpu: &Gpu, bytes: usize, runs: usize) -> Result<f64> {
    let stream = gpu.stream();
    let n = bytes / 4;
    let src = stream.alloc_zeros::<u32>(n)?;
    let mut dst = stream.alloc_zeros::<u32>(n)?;
    let us = median_us(gpu, 3, runs, || {
        stream.memcpy_dtod(&src, &mut dst)?;
        Ok(())
    })?;
    Ok(2.0 * (n * 4) as f64 / (us * 1e-6) / 1e9)
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_odd_even_empty() {
        assert_eq!(super::median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(super::median(&mut []).is_nan());
    }

    #[test]
    fn bench_case_filter() {
        use super::bench_case_selected as sel;
        assert!(sel("bs 64, L 8192", None));
        assert!(sel("FP8 KV, bs 64, L 8192", Some("bs 64, L 8192")));
        assert!(!sel("FP8 KV, bs 64, L 8192", Some("=bs 64, L 8192")));
        assert!(sel("bs 64, L 8192", Some("bs 1, L 1024|=bs 64, L 8192")));
        assert!(!sel("bs 1, L 1024 (x256)", Some("=bs 1, L 1024|bs 16")));
    }
}
