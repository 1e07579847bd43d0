//! `mha-startup`: measures a fresh process's start-up on the GPU — opening
//! the device (`Gpu::shared`), the first decode output of a new backend, and
//! loading every kernel family's module (each entry point) — and prints the
//! seconds with where each module's code came from (cubin or PTX).
//!
//! Sets `CUDA_CACHE_DISABLE=1` when it is unset, before the driver starts,
//! so that the driver's JIT cache cannot hide a PTX compilation (set it to
//! `0` to measure with the cache). `MHA_KIT_MODULE_LOAD=ptx` forces the PTX
//! (the JIT cost that the cubins remove); `MHA_KIT_DEVICE` picks the device.
//!
//! Exit codes: 0 success; 1 a module failed to load, or loaded from PTX on a
//! device its cubin runs on; 2 no GPU or a failed decode pass.

use std::process::ExitCode;
use std::time::Instant;

use kernel_rt::Gpu;
use mha_replay::startup::{expected_source, first_decode, load_all, sm90a_elsewhere};

fn main() -> ExitCode {
    let start = Instant::now();
    if std::env::var_os("CUDA_CACHE_DISABLE").is_none() {
        // Before any driver call: the driver reads it when it initialises.
        std::env::set_var("CUDA_CACHE_DISABLE", "1");
    }
    let cache = std::env::var("CUDA_CACHE_DISABLE").unwrap_or_default();
    let gpu = match Gpu::shared() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("mha-startup: {e}");
            return ExitCode::from(2);
        }
    };
    let open_s = start.elapsed().as_secs_f64();
    println!(
        "mha-startup: {}, CUDA_CACHE_DISABLE={cache}, module load {:?}",
        gpu.describe(),
        gpu.module_load()
    );
    let decode_s = match first_decode(&gpu) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mha-startup: first decode failed: {e}");
            return ExitCode::from(2);
        }
    };
    let to_first_output = start.elapsed().as_secs_f64();
    let t = Instant::now();
    let times = load_all(&gpu);
    let modules_s = t.elapsed().as_secs_f64();
    println!("\n| module | source | entries | load s | note |\n|---|---|---:|---:|---|");
    let mut bad = 0;
    for (m, (_, module)) in times.iter().zip(mha_replay::startup::all_modules()) {
        let want = expected_source(&gpu, module);
        let note = match (&m.error, m.source) {
            // compute_90a PTX loads only on compute capability 9.0.
            (Some(e), _) if sm90a_elsewhere(&gpu, module) => {
                format!("not for this device: {e}")
            }
            (Some(e), _) => {
                bad += 1;
                format!("FAILED: {e}")
            }
            (None, Some(src)) if src != want => {
                bad += 1;
                format!("UNEXPECTED: want {want:?}")
            }
            (None, _) if m.already_loaded => "loaded by the decode pass".into(),
            _ => String::new(),
        };
        let source = m.source.map_or("-".to_string(), |s| format!("{s:?}"));
        println!(
            "| {} | {source} | {} | {:.3} | {note} |",
            m.name, m.entries, m.seconds
        );
    }
    println!();
    println!("open GPU (Gpu::shared)            {open_s:8.3} s");
    println!("first decode (new backend + pass) {decode_s:8.3} s");
    println!("process start -> first output     {to_first_output:8.3} s");
    println!("every other module + entry        {modules_s:8.3} s");
    let total = start.elapsed().as_secs_f64();
    println!("total                             {total:8.3} s");
    println!(
        "startup_s open={open_s:.3} first_decode={decode_s:.3} to_first_output={to_first_output:.3} modules={modules_s:.3} total={total:.3}"
    );
    if bad > 0 {
        eprintln!("mha-startup: {bad} module(s) failed or loaded from the wrong source");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
