//! # mha-replay
//!
//! mha-kit's main job: replays a real production LLM serving trace (Azure
//! LLM inference traces 2023, embedded; CC-BY 4.0, see `data/README.md`)
//! through the [`mha_backend`] paged-attention backend as a serving engine
//! would — continuous batching, chunked prefill (EXTEND / MIXED), decode,
//! speculative draft decode + target verify with ragged acceptance — and
//! reports what the kernels achieve and whether they are right.
//!
//! ```text
//! cargo run --release -p mha-replay                  # CPU: tiny model, 200 requests, < 60 s
//! cargo run --release -p mha-replay -- --help
//! ```
//!
//! ## Pipeline
//! - [`trace`]: CSV parser (`TIMESTAMP, ContextTokens, GeneratedTokens`),
//!   errors name the file and line.
//! - [`config`]: the clap command line and its resolution into a
//!   [`config::Setup`] (executor-dependent defaults; an impossible
//!   configuration is a [`ReplayError::Flag`] naming the flag).
//! - [`sched`]: admission in arrival order while KV pages last, chunked
//!   prefill, decode, pages freed on finish.
//! - [`replay`]: builds each pass's [`mha_backend::ForwardBatch`] and runs
//!   it through an [`engine::Engine`] ([`engine::CpuEngine`], or
//!   [`cuda_engine::CudaEngine`] for `--device cuda:N` or `auto` with a GPU,
//!   passes pipelined two deep), samples (call, request) pairs for [`check`] (run on
//!   host worker threads, [`check::CheckPool`]).
//! - [`launch`]: the device generator kernel `mha_replay_gen_qkv`
//!   (`kernels/mha_replay_gen.cu`), bit-identical to [`gen`].
//! - [`gen`]: Q/K/V from the seed by a counter hash (never wall time).
//! - [`startup`]: start-up cost on the GPU (device open, first decode
//!   output, every module's load), printed by the `mha-startup` binary.
//! - [`check`]: independent f64 recomputation through paged-attention's
//!   reference on contiguous, regenerated K/V.
//! - [`report`] / [`plot`]: the table, the JSON, the PNG; with the CUDA
//!   engine's `--split-timing on` (default) the attention time split into
//!   context-kernel, decode-kernel, K/V-write and other seconds and the
//!   context kernel's TFLOP/s ([`report::AttentionSplit`]).
//!
//! ## CPU-executor caps
//! The CPU executor evaluates attention with paged-attention's f64
//! reference (≈ 4.6 ns per multiply-add on one core), so CPU runs cap each
//! request's prompt at 192 tokens (`--max-context`) and its output at 32
//! tokens (`--max-output`) by default; the report prints both the trace's
//! and the replayed token counts and how many requests were capped. Pass
//! `--max-context none --max-output none` to lift the caps.

pub mod check;
pub mod config;
pub mod cuda_engine;
pub mod dcp;
pub mod engine;
pub mod error;
pub mod gen;
pub mod launch;
pub mod model;
pub mod pass;
pub mod placement;
pub mod plot;
mod ranks;
pub mod replay;
pub mod report;
pub mod sched;
pub mod startup;
pub mod trace;

pub use config::{Args, Setup};
pub use error::{ReplayError, Result};
pub use report::Report;

use engine::{CpuEngine, Engine};
use gen::Generator;

/// Builds the engine for `setup`'s executor: [`CpuEngine`] or
/// [`cuda_engine::CudaEngine`] (`--device cuda:N`, or `auto` with a GPU).
///
/// # Errors
/// [`ReplayError::Flag`] naming `--device` when the CUDA engine cannot
/// start (no GPU, no such device); PTX load / allocation errors.
pub fn engine_for(setup: &Setup) -> Result<Box<dyn Engine>> {
    engine_on(setup, setup.executor)
}

/// The engine of `setup` on `executor` (a rank's, [`Setup::rank_executor`]).
///
/// # Errors
/// As [`engine_for`].
fn engine_on(setup: &Setup, executor: config::ExecutorChoice) -> Result<Box<dyn Engine>> {
    Ok(match executor {
        config::ExecutorChoice::Cpu => Box::new(CpuEngine::new(Generator::new(setup.seed))),
        config::ExecutorChoice::Cuda(n) => Box::new(cuda_engine::CudaEngine::new(
            n,
            setup.seed,
            setup.cuda_graphs,
            setup.split_timing,
        )?),
    })
}

/// One engine per tensor-parallel rank (`setup.tp`; one without `--tp`),
/// rank `r`'s on [`Setup::rank_executor`]`(r)`.
///
/// # Errors
/// As [`engine_for`].
pub fn engines_for(setup: &Setup) -> Result<Vec<Box<dyn Engine>>> {
    (0..setup.tp)
        .map(|r| engine_on(setup, setup.rank_executor(r)))
        .collect()
}

/// Runs a replay end to end (no progress bar, no files): for tests and
/// embedding.
///
/// # Errors
/// As [`Setup::from_args`] and [`replay::run_ranks`] (or
/// [`replay::run_dcp_ranks`] with `--dcp-gpus spread`).
pub fn run_args(args: &Args) -> Result<Report> {
    let setup = Setup::from_args(args)?;
    if setup.dcp_spread {
        return replay::run_dcp_ranks(&setup, &indicatif::ProgressBar::hidden());
    }
    let mut engines = engines_for(&setup)?;
    let mut refs = engine_refs(&mut engines);
    replay::run_ranks(&setup, &mut refs, &indicatif::ProgressBar::hidden())
}

/// The engines of [`engines_for`] as the slice [`replay::run_ranks`] takes.
pub fn engine_refs(engines: &mut [Box<dyn Engine>]) -> Vec<&mut (dyn Engine + '_)> {
    engines
        .iter_mut()
        .map(|e| -> &mut (dyn Engine + '_) { e.as_mut() })
        .collect()
}
