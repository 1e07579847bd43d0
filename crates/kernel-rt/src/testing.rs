//! GPU test harness on `libtest-mimic` (`harness = false` test targets).
//!
//! A GPU test is marked *ignored* at run time when no GPU is found, so
//! `cargo test` on a machine without one lists it as ignored, never as passed.
//! `MHA_KIT_REQUIRE_GPU=1` turns a missing GPU into a failure of every GPU test.

use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};

use crate::{gpu_available, gpu_status, Gpu, GpuStatus};

/// Environment variable: when `1`, a missing GPU fails GPU tests instead of
/// ignoring them.
pub const REQUIRE_GPU_ENV: &str = "MHA_KIT_REQUIRE_GPU";

/// Environment variable overriding the number of random cases of GPU
/// property tests (e.g. fewer under compute-sanitizer).
pub const GPU_CASES_ENV: &str = "MHA_KIT_GPU_CASES";

/// Random cases a GPU property test runs: `MHA_KIT_GPU_CASES` when set to a
/// number, else `default`.
pub fn gpu_cases(default: u32) -> u32 {
    std::env::var(GPU_CASES_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Whether `MHA_KIT_REQUIRE_GPU=1` is set.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v.trim() == "1")
}

/// A test that needs a GPU: it receives the process's shared [`Gpu`].
/// Ignored at run time when there is no GPU (unless [`gpu_required`]).
pub fn gpu_trial<F>(name: impl Into<String>, body: F) -> Trial
where
    F: FnOnce(&Arc<Gpu>) -> Result<(), String> + Send + 'static,
{
    let ignore = !gpu_available() && !gpu_required();
    Trial::test(name, move || {
        let gpu = Gpu::shared().map_err(|e| Failed::from(format!("no GPU: {e}")))?;
        body(&gpu).map_err(Failed::from)
    })
    .with_ignored_flag(ignore)
}

/// A test that needs `devices ≥ 2` GPUs of one host (NCCL ranks, transfers
/// between devices): it receives the process's shared [`Gpu`] (device 0).
/// Ignored at run time when the host has fewer devices — listed as ignored
/// on a one-GPU machine, never as passed — except that a host with no GPU
/// at all and [`gpu_required`] fails it, as [`gpu_trial`] does.
pub fn multi_gpu_trial<F>(name: impl Into<String>, devices: usize, body: F) -> Trial
where
    F: FnOnce(&Arc<Gpu>) -> Result<(), String> + Send + 'static,
{
    let have = gpu_status().devices();
    let ignore = have < devices && !(have == 0 && gpu_required());
    Trial::test(name, move || {
        let gpu = Gpu::shared().map_err(|e| Failed::from(format!("no GPU: {e}")))?;
        body(&gpu).map_err(Failed::from)
    })
    .with_ignored_flag(ignore)
}

/// Runs `rank(r)` for `r < ranks` at once, one scoped thread each (NCCL
/// ranks of one process), and returns their results in rank order; a rank
/// whose thread panicked gives `Err`.
pub fn per_rank<T, F>(ranks: usize, rank: F) -> Vec<Result<T, String>>
where
    T: Send,
    F: Fn(usize) -> Result<T, String> + Sync,
{
    per_rank_or(ranks, || "rank thread panicked".into(), rank)
}

/// [`per_rank`] with any error type: a rank whose thread panicked gives
/// `Err(panicked())`.
pub fn per_rank_or<T, E, F>(ranks: usize, panicked: impl Fn() -> E, rank: F) -> Vec<Result<T, E>>
where
    T: Send,
    E: Send,
    F: Fn(usize) -> Result<T, E> + Sync,
{
    std::thread::scope(|sc| {
        let rank = &rank;
        let hs: Vec<_> = (0..ranks).map(|r| sc.spawn(move || rank(r))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(panicked())))
            .collect()
    })
}

/// Runs `trials` and exits with libtest's status. GPU tests share one stream,
/// so they run on one thread unless `--test-threads` says otherwise.
pub fn run_trials(trials: Vec<Trial>) -> ! {
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    if let GpuStatus::Missing(why) = gpu_status() {
        eprintln!("mha-kit: no GPU ({why}); GPU tests are ignored");
    }
    libtest_mimic::run(&args, trials).exit()
}

/// Uploads `data` to `gpu`, padded to at least one element (a zero-byte
/// allocation is not a valid device buffer): build views over the first
/// `data.len()` elements (`slice.slice(0..data.len())`).
///
/// # Errors
/// [`crate::KernelError::Driver`] on allocation or copy failure.
pub fn upload<T: cudarc::driver::DeviceRepr + Copy + Default>(
    gpu: &Gpu,
    data: &[T],
) -> crate::Result<cudarc::driver::CudaSlice<T>> {
    if data.is_empty() {
        return Ok(gpu.stream().clone_htod(&[T::default()])?);
    }
    Ok(gpu.stream().clone_htod(data)?)
}

/// Turns any error into the test's failure message (for `?` in GPU tests).
pub trait OrFail<T> {
    /// Maps the error to a `String` naming `what` failed.
    fn or_fail(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}
