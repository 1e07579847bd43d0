//! # 04 — replay a small trace
//!
//! Replays the first 8 requests of the bundled serving trace (the Azure LLM
//! 2023 conversation trace embedded in `mha-replay`, `crates/mha-replay/data/`)
//! through `mha_replay`'s library API: the scheduler admits requests in
//! arrival order, prefills their prompts in chunks (EXTEND / MIXED passes),
//! decodes their outputs, and an independent f64 recomputation checks a
//! share of the attention calls. The same replay as `cargo run --release -p
//! mha-replay -- --requests 8 …`, called as a library.
//!
//! Without a GPU it runs the CPU executor on the `tiny` model (2 layers,
//! Hq / Hkv / D 4 / 1 / 64) with prompts capped at 128 tokens and outputs at
//! 16, a quarter of the calls checked; with a GPU, the CUDA engine's
//! defaults (`llama3-8b`, 32 layers, CUDA graphs for decode, no caps).
//!
//! ```text
//! cargo run --release -p mha-kit-examples --example 04_replay
//! ```
//!
//! Prints the trace rows replayed (arrival, prompt and output tokens), a
//! summary (requests finished, scheduler steps, passes per mode, checked
//! pairs and mismatches, device errors) and the replay's report table.
//!
//! ## The terms
//!
//! - **trace**: one CSV row per request, `TIMESTAMP, ContextTokens,
//!   GeneratedTokens` (arrival, prompt length, output length); `--trace`
//!   also takes a path to such a file.
//! - **scheduler step**: one iteration of the serving loop; it runs one
//!   pass (more with speculative decoding) over the running batch.
//! - **pass modes**: `extend` (prefill chunks only), `mixed` (prefill chunks
//!   and decodes in one batch), `decode` (one token per running request).
//! - **check**: `(attention call, request)` pairs recomputed from
//!   regenerated Q/K/V with paged-attention's f64 reference; a mismatch or a
//!   device error fails the run.

use std::error::Error;
use std::fmt::Write as _;

use clap::Parser;
use kernel_rt::{gpu_status, GpuStatus};
use mha_replay::trace::Trace;
use mha_replay::{run_args, Args};

/// Requests replayed (the first ones of the trace, in arrival order).
const REQUESTS: usize = 8;

/// Replays the trace slice (the CUDA engine when `allow_gpu` and a GPU is
/// present, else the CPU executor) and returns the printed report.
///
/// # Errors
/// Flag, trace, backend or driver errors; a replay with mismatches or
/// device errors.
pub fn run(allow_gpu: bool) -> Result<String, Box<dyn Error>> {
    let mut out = String::new();
    let gpu = allow_gpu && matches!(gpu_status(), GpuStatus::Available { .. });
    let n = REQUESTS.to_string();
    // The command line of the replay, parsed by its own clap parser.
    let mut argv = vec!["mha-replay", "--trace", "conv", "--requests", &n];
    if gpu {
        argv.extend(["--device", "auto"]);
    } else {
        argv.extend([
            "--device",
            "cpu",
            "--max-context",
            "128",
            "--max-output",
            "16",
            "--check-fraction",
            "0.25",
        ]);
    }
    writeln!(out, "replay: {}", argv[1..].join(" "))?;

    let trace = Trace::load("conv")?;
    writeln!(
        out,
        "trace {}: {} requests; the first {REQUESTS}:",
        trace.name,
        trace.requests.len()
    )?;
    for r in trace.requests.iter().take(REQUESTS) {
        writeln!(
            out,
            "  request {}: arrives at {:.3} s, {} prompt tokens, {} output tokens",
            r.id, r.arrival_s, r.context_tokens, r.generated_tokens
        )?;
    }

    let args = Args::try_parse_from(&argv)?;
    let report = run_args(&args)?;

    let w = &report.workload;
    let t = &report.totals;
    let c = &report.check;
    writeln!(
        out,
        "executor {} ({} layers of {}), {} requests replayed, {} finished, {} prompt + {} generated tokens",
        report.config.executor,
        report.config.layers,
        report.config.model,
        w.requests,
        w.finished,
        w.prompt_tokens,
        w.generated_tokens
    )?;
    writeln!(
        out,
        "scheduler steps: {}, passes: {} ({} graph replays, {} eager)",
        t.scheduler_steps, t.passes, t.graph_passes, t.eager_passes
    )?;
    for m in &report.modes {
        writeln!(
            out,
            "  {}: {} passes, {} rows, mean batch {:.1}",
            m.mode, m.passes, m.rows, m.mean_batch
        )?;
    }
    writeln!(
        out,
        "checked: {} (call, request) pairs, max abs err {:.3e}, {} mismatched; device errors: {}",
        c.pairs, c.max_abs_err, c.mismatched_pairs, report.device_errors.count
    )?;
    writeln!(out, "\n{}", report.table())?;
    if !report.passed() {
        return Err(format!(
            "the replay failed: {} mismatched pairs, {} device errors",
            c.mismatched_pairs, report.device_errors.count
        )
        .into());
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn Error>> {
    print!("{}", run(true)?);
    Ok(())
}
