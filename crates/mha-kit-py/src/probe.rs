//! Host-time probes for the Python call overhead (issue 15's bar: the
//! Python layer's host time per call *beyond the Rust launcher's*).
//!
//! Off by default; each probe costs one relaxed atomic load per call when
//! off. `mha_kit._native._timing(True)` turns the clocks on:
//!
//! - `native_ns`: time inside the native function, after PyO3 converted the
//!   arguments (validation, device / stream / launcher look-ups, views,
//!   planning, the launch);
//! - `launch_ns`: the launcher's `launch_on` alone (the kernel crate's own
//!   validation, parameter packing and `cuLaunchKernel`).
//!
//! `mha_kit._native._stub_launches(True)` (tests and the CPU benchmark
//! only) makes every CUDA-tensor call return right after validation, before
//! any device is touched, so that the pre-launch path can be timed on a
//! machine without a GPU.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

static STUB: AtomicBool = AtomicBool::new(false);
static TIMING: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicU64 = AtomicU64::new(0);
static NATIVE_NS: AtomicU64 = AtomicU64::new(0);
static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static LAUNCH_NS: AtomicU64 = AtomicU64::new(0);

/// Whether CUDA-tensor calls stop before the device (test / bench only).
#[inline]
pub fn stubbed() -> bool {
    STUB.load(Ordering::Relaxed)
}

/// Sets [`stubbed`].
pub fn set_stub(on: bool) {
    STUB.store(on, Ordering::Relaxed);
}

/// A started clock when timing is on.
#[inline]
pub fn start() -> Option<Instant> {
    TIMING.load(Ordering::Relaxed).then(Instant::now)
}

fn add(t0: Option<Instant>, n: &AtomicU64, ns: &AtomicU64) {
    if let Some(t0) = t0 {
        n.fetch_add(1, Ordering::Relaxed);
        let d = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        ns.fetch_add(d, Ordering::Relaxed);
    }
}

/// Ends a native-call clock from [`start`].
#[inline]
pub fn end_call(t0: Option<Instant>) {
    add(t0, &CALLS, &NATIVE_NS);
}

/// Ends a launcher clock from [`start`].
#[inline]
pub fn end_launch(t0: Option<Instant>) {
    add(t0, &LAUNCHES, &LAUNCH_NS);
}

/// Turns timing on or off (`None` leaves it), optionally zeroing the
/// counters; returns `(calls, native_ns, launches, launch_ns)` as they were.
pub fn timing(enable: Option<bool>, reset: bool) -> (u64, u64, u64, u64) {
    let r = (
        CALLS.load(Ordering::Relaxed),
        NATIVE_NS.load(Ordering::Relaxed),
        LAUNCHES.load(Ordering::Relaxed),
        LAUNCH_NS.load(Ordering::Relaxed),
    );
    if reset {
        for c in [&CALLS, &NATIVE_NS, &LAUNCHES, &LAUNCH_NS] {
            c.store(0, Ordering::Relaxed);
        }
    }
    if let Some(on) = enable {
        TIMING.store(on, Ordering::Relaxed);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_count_only_when_on() {
        timing(Some(false), true);
        end_call(start());
        assert_eq!(timing(None, false).0, 0);
        timing(Some(true), false);
        end_call(start());
        end_launch(start());
        let (calls, _, launches, _) = timing(Some(false), true);
        assert_eq!((calls, launches), (1, 1));
    }
}
