//! Start-up on the GPU (ignored without one): every kernel module of the
//! workspace loads, from its embedded cubin on compute capability 9.0 (no
//! JIT compilation) and from its PTX elsewhere or with
//! `MHA_KIT_MODULE_LOAD=ptx`; a fresh backend's first decode pass returns
//! its single value row. Seconds are printed, not asserted (`mha-startup`
//! measures them in a fresh process).

use kernel_rt::testing::{gpu_trial, run_trials};
use mha_replay::startup::{all_modules, expected_source, first_decode, load_all, sm90a_elsewhere};

fn main() {
    let trials = vec![
        gpu_trial("every_module_loads_from_the_expected_source", |gpu| {
            let times = load_all(gpu);
            let mut wrong = Vec::new();
            for (t, (_, module)) in times.iter().zip(all_modules()) {
                let want = expected_source(gpu, module);
                eprintln!("{}: {:?} in {:.3} s", t.name, t.source, t.seconds);
                match (&t.error, t.source) {
                    // compute_90a PTX does not load on other devices.
                    (Some(_), _) if sm90a_elsewhere(gpu, module) => {}
                    (Some(e), _) => wrong.push(format!("{}: {e}", t.name)),
                    (None, Some(src)) if src == want => {}
                    (None, src) => wrong.push(format!("{}: {src:?}, want {want:?}", t.name)),
                }
            }
            if wrong.is_empty() {
                Ok(())
            } else {
                Err(wrong.join("; "))
            }
        }),
        gpu_trial("first_decode_returns_the_value_row", |gpu| {
            let s = first_decode(gpu).map_err(|e| e.to_string())?;
            eprintln!("first decode of a new backend: {s:.3} s");
            Ok(())
        }),
    ];
    run_trials(trials)
}
