//! GPU behaviour the rest of mha-kit relies on (ignored without a GPU):
//! with cudarc's event tracking off (kernel-rt's [`Gpu`]), an async
//! device-to-host copy into pinned memory is complete only after an event
//! recorded behind it has been waited on; the timing helpers measure a
//! known spin.

use kernel_rt::cudarc::driver::sys::CUevent_flags;
use kernel_rt::testing::{gpu_trial, run_trials};
use kernel_rt::timing::{fill_stream, median_us};
use kernel_rt::Gpu;

/// Copies `n` known u16 values device → pinned host behind a busy stream,
/// records an event after the copy and waits on it: the host must then
/// see every value (the pattern mha-replay's pipelined engine uses).
fn pinned_readback_after_explicit_event(gpu: &Gpu) -> Result<(), String> {
    let n = 1 << 20;
    let pattern: Vec<u16> = (0..n).map(|i| (i * 7 + 3) as u16).collect();
    let st = gpu.stream();
    let dev = st.clone_htod(&pattern).map_err(|e| e.to_string())?;
    // SAFETY: page-locked host memory of `n` u16, read only after the
    // event recorded behind the copy completed.
    let mut host =
        unsafe { gpu.context().alloc_pinned_with_flags::<u16>(n, 0) }.map_err(|e| e.to_string())?;
    host.as_mut_slice().map_err(|e| e.to_string())?.fill(0xDEAD);
    fill_stream(gpu, 20_000.0).map_err(|e| e.to_string())?;
    st.memcpy_dtoh(&dev, &mut host).map_err(|e| e.to_string())?;
    let done = gpu
        .context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| e.to_string())?;
    done.record(st).map_err(|e| e.to_string())?;
    done.synchronize().map_err(|e| e.to_string())?;
    let got = host.as_slice().map_err(|e| e.to_string())?;
    match got.iter().zip(&pattern).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "element {i}: {:#x}, want {:#x} (copy not finished?)",
            got[i], pattern[i]
        )),
    }
}

fn main() {
    let trials = vec![
        gpu_trial("pinned_readback_after_explicit_event", |gpu| {
            pinned_readback_after_explicit_event(gpu)
        }),
        gpu_trial("median_us_measures_a_known_spin", |gpu| {
            // fill_stream spins the device for the given time: a 200 µs
            // spin must measure 200 µs within 10 %.
            let us = median_us(gpu, 2, 9, || fill_stream(gpu, 200.0)).map_err(|e| e.to_string())?;
            if (us - 200.0).abs() > 20.0 {
                return Err(format!("a 200 µs spin measured {us:.1} µs"));
            }
            Ok(())
        }),
    ];
    run_trials(trials)
}
