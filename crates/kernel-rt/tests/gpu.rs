//! GPU behaviour the rest of mha-kit relies on (ignored without a GPU):
//! with cudarc's event tracking off (kernel-rt's [`Gpu`]), an async
//! device-to-host copy into pinned memory is complete only after an event
//! recorded behind it has been waited on; the timing helpers measure a
//! known spin; modules load from the embedded cubin on compute capability
//! 9.0 and from the PTX when forced, elsewhere, or when the cubin is bad
//! (that module's spin runs through `launch::Launcher`, which counts it).

use kernel_rt::cudarc::driver::sys::CUevent_flags;
use kernel_rt::launch::Launcher;
use kernel_rt::testing::{gpu_trial, run_trials};
use kernel_rt::timing::{fill_stream, median_us};
use kernel_rt::{Cubin, CubinArch, Gpu, ModuleLoad, ModuleSource, PtxModule};

/// The spin kernel's module with an image the driver must reject: loading
/// it has to fall back to the PTX.
const BAD_CUBIN: PtxModule = PtxModule {
    name: "kernel_rt_bad_cubin",
    ptx: kernel_rt::timing::PTX.ptx,
    cubin: Some(Cubin {
        arch: CubinArch::Sm90,
        image: b"not a cubin",
        stamp: "",
    }),
};

/// Loads the spin kernel of `module` on a fresh handle of `gpu`'s device
/// that loads as `load` says, runs it once, and returns where it came from.
fn load_and_spin(gpu: &Gpu, module: &PtxModule, load: ModuleLoad) -> Result<ModuleSource, String> {
    let h = Gpu::with_module_load(gpu.context().ordinal(), load).map_err(|e| e.to_string())?;
    h.function(module, "kernel_rt_spin")
        .map_err(|e| e.to_string())?;
    let src = h
        .module_source(module.name)
        .ok_or("module loaded but not recorded")?;
    if module.name == kernel_rt::timing::PTX.name {
        fill_stream(&h, 10.0).map_err(|e| e.to_string())?;
    } else {
        // Through the launcher type every family uses.
        let k = Launcher::new(&h, module, &["kernel_rt_spin"]).map_err(|e| e.to_string())?;
        let cfg = kernel_rt::cudarc::driver::LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let ns = 10_000u64;
        // SAFETY: the spin kernel takes one u64 by value and touches no memory.
        unsafe { k.launch(h.stream(), 0, cfg, &ns) }.map_err(|e| e.to_string())?;
        if k.launches() != 1 {
            return Err(format!("launch count {}, want 1", k.launches()));
        }
        // By name, with attributes, several parameters and PDL (the path of
        // the decode and context launchers).
        let mut named = Launcher::empty(&h);
        let attrs = kernel_rt::launch::EntryAttrs::smem_max_carveout(0);
        let i = named
            .load(module, "kernel_rt_spin", attrs)
            .map_err(|e| e.to_string())?;
        if named.index("kernel_rt_spin") != Some(i) || named.contains("no_such_entry") {
            return Err("named entry lookup".into());
        }
        let pdl = h.compute_capability().is_some_and(|cc| cc >= (9, 0));
        // SAFETY: as above (one u64; PDL: the spin kernel reads no memory).
        unsafe { named.launch_with(h.stream(), i, cfg, &[&ns], pdl) }.map_err(|e| e.to_string())?;
        if named.launches() != 1 {
            return Err(format!("named launch count {}, want 1", named.launches()));
        }
    }
    h.synchronize().map_err(|e| e.to_string())?;
    Ok(src)
}

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
        gpu_trial("module_loads_from_cubin_on_9_0", |gpu| {
            let src = load_and_spin(gpu, &kernel_rt::timing::PTX, ModuleLoad::Auto)?;
            let want = if gpu.compute_capability() == Some((9, 0)) {
                ModuleSource::Cubin(CubinArch::Sm90)
            } else {
                ModuleSource::Ptx
            };
            if src != want {
                return Err(format!(
                    "{} loaded from {src:?}, want {want:?}",
                    gpu.describe()
                ));
            }
            Ok(())
        }),
        gpu_trial("module_load_ptx_forced_or_bad_cubin_falls_back", |gpu| {
            let src = load_and_spin(gpu, &kernel_rt::timing::PTX, ModuleLoad::Ptx)?;
            if src != ModuleSource::Ptx {
                return Err(format!("ModuleLoad::Ptx loaded from {src:?}"));
            }
            let src = load_and_spin(gpu, &BAD_CUBIN, ModuleLoad::Auto)?;
            if src != ModuleSource::Ptx {
                return Err(format!("a rejected cubin left the module at {src:?}"));
            }
            Ok(())
        }),
    ];
    run_trials(trials)
}
