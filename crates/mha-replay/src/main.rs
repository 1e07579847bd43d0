//! `mha-replay`: replay a production LLM serving trace through the mha-kit
//! backend and report speed and accuracy. See the crate docs and `--help`.
//!
//! Exit codes: 0 success; 1 mismatches or device errors; 2 any other error
//! (bad flag, bad trace, backend error, output file).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mha_replay::{engine_refs, engines_for, plot, replay, Args, ReplayError, Report, Setup};

fn write_json(path: &std::path::Path, report: &Report) -> Result<(), ReplayError> {
    let text = serde_json::to_string_pretty(report).map_err(|e| ReplayError::Output {
        what: "JSON report",
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    std::fs::write(path, text + "\n").map_err(|e| ReplayError::Output {
        what: "JSON report",
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

fn real_main() -> Result<Report, ReplayError> {
    let args = Args::parse();
    let setup = Setup::from_args(&args)?;
    // Fail before the replay, not after it, when an output cannot be written.
    for (what, path) in [("JSON report", &setup.json), ("plot", &setup.plot)] {
        if let Some(p) = path {
            std::fs::File::create(p).map_err(|e| ReplayError::Output {
                what,
                path: p.display().to_string(),
                detail: e.to_string(),
            })?;
        }
    }
    let notes = setup
        .device_notes
        .iter()
        .map(|n| format!("; {n}"))
        .collect::<String>();
    // `--dcp-gpus spread`: each rank's thread builds its own engine. NVLink
    // multicast stays off, and the ranks connect when they join the group
    // (so that no collective waits for a peer inside a host call, where a
    // failed rank's abort could not reach it), unless the caller set these
    // (set here, before any thread of this process starts).
    if setup.dcp_spread {
        for (var, value) in [("NCCL_NVLS_ENABLE", "0"), ("NCCL_RUNTIME_CONNECT", "0")] {
            if std::env::var_os(var).is_none() {
                std::env::set_var(var, value);
            }
        }
    }
    let mut engines = if setup.dcp_spread {
        println!(
            "mha-replay: {} decode context-parallel ranks, one a GPU ({} executor{notes})",
            setup.dcp,
            setup.executor.name()
        );
        Vec::new()
    } else {
        let engines = engines_for(&setup)?;
        let info = engines[0].info();
        println!(
            "mha-replay: device {} ({} executor{notes})",
            info.executor, info.executor,
        );
        engines
    };
    let caps: Vec<String> = [
        setup
            .max_context
            .map(|c| format!("prompts capped at {c} tokens (--max-context)")),
        setup
            .max_output
            .map(|c| format!("outputs capped at {c} tokens (--max-output)")),
    ]
    .into_iter()
    .flatten()
    .collect();
    println!(
        "mha-replay: {} request{} of {}, model {} ({} layers){}",
        setup.jobs.len(),
        if setup.jobs.len() == 1 { "" } else { "s" },
        setup.trace_name,
        setup.model.name,
        setup.model.layers.len(),
        if caps.is_empty() {
            String::new()
        } else {
            format!("; {}", caps.join(", "))
        }
    );
    let bar = ProgressBar::with_draw_target(
        Some(setup.jobs.len() as u64),
        if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} requests  {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let report = if setup.dcp_spread {
        replay::run_dcp_ranks(&setup, &bar)
    } else {
        replay::run_ranks(&setup, &mut engine_refs(&mut engines), &bar)
    };
    bar.finish_and_clear();
    let report = report?;
    println!("\n{}", report.table());
    if let Some(p) = &setup.json {
        write_json(p, &report)?;
        println!("JSON report written to {}", p.display());
    }
    if let Some(p) = &setup.plot {
        plot::write_png(p, &report.by_batch_size, &report.config.time_domain)?;
        println!(
            "plot written to {} (left: mean step time, ms; right: KV bandwidth, GB/s; x: batch size; blue: decode/verify passes, orange: extend/mixed passes; {} points)",
            p.display(),
            report.by_batch_size.len()
        );
    }
    Ok(report)
}

fn main() -> ExitCode {
    match real_main() {
        Ok(r) if r.passed() => ExitCode::SUCCESS,
        Ok(r) => {
            eprintln!(
                "mha-replay: FAILED: {} mismatched (call, request) pairs ({} elements), {} device errors{}",
                r.check.mismatched_pairs,
                r.check.mismatched_elements,
                r.device_errors.count,
                r.check
                    .first_mismatch
                    .as_ref()
                    .map(|m| format!("; first: {m}"))
                    .unwrap_or_default()
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("mha-replay: error: {e}");
            ExitCode::from(2)
        }
    }
}
