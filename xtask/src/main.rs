//! `cargo xtask`: the project's automation, in Rust (the rust-analyzer pattern).
//!
//! - `ptx-build [--check]`: compile every `crates/*/kernels/*.cu` to PTX with
//!   the pinned NVRTC (installed from the Python package index into
//!   `target/cuda-toolchain/` when missing), then assemble each PTX with the
//!   pinned ptxas into `<module>.sm_90.cubin` (`sm_90a` for `compute_90a`
//!   PTX) plus a `.cubin.stamp`; `--check` rebuilds both in a scratch folder
//!   and fails naming each stale file.
//! - `ptx-report`: `ptxas -arch=sm_90 -v` (`sm_90a` for `*_sm90` kernels) on every committed PTX; a table of
//!   registers, shared memory, stack frame and spills; fails on any spill.
//! - `gpu-bundle [--out DIR]`: release GPU test and bench binaries plus
//!   `run.sh`, for a GPU host with a driver but no Rust; `python/` holds the
//!   `mha_kit` wheel (abi3, manylinux_2_28), its GPU pytest and
//!   `run_python.sh`.
//! - `abi [--check]`: generate each kernel crate's C header
//!   (`crates/<crate>/kernels/<crate>_abi.cuh`: params structs with
//!   `static_assert`s on size and every offset, error-flag `#define`s) from
//!   the Rust definitions (`kernel_rt::abi`); `--check` renders in memory and
//!   fails naming each committed header that differs.
//! - `sass FUNCTION`: the SASS of one entry of the committed cubins
//!   (`cuobjdump -sass` from the Python package index, installed into
//!   `target/cuda-sass-tools/` on first use), to read ptxas's schedule
//!   without a GPU.
//! - `ci`: fmt, clippy, ABI headers, ptx and cubin freshness, ptx-report (one
//!   ptxas pass for both), the README's main-job command (built, then
//!   `--help`), its test command, and the Python
//!   package: its wheel built with maturin in `target/py-venv`, installed,
//!   and its CPU pytest (`crates/mha-kit-py/tests`).

mod abi;
mod bundle;
mod ptx;
mod python;
mod sass;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "mha-kit automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile every crates/*/kernels/*.cu to crates/*/ptx/*.ptx, and each
    /// PTX to a sm_90 / sm_90a cubin beside it.
    PtxBuild {
        /// Rebuild in a scratch folder and fail if a committed PTX file, cubin
        /// or cubin stamp is stale.
        #[arg(long)]
        check: bool,
    },
    /// Register / shared memory / spill table of every kernel (ptxas -v, sm_90).
    PtxReport,
    /// Build release GPU test and bench binaries into one folder with run.sh.
    GpuBundle {
        /// Output folder.
        #[arg(long, default_value = "gpu-bundle")]
        out: PathBuf,
    },
    /// Generate the C ABI headers (params structs, error flags) from Rust.
    Abi {
        /// Render in memory and fail if a committed header differs.
        #[arg(long)]
        check: bool,
    },
    /// SASS of one kernel entry of the committed cubins (cuobjdump -sass).
    Sass {
        /// Entry name, e.g. paged_attention_context_sm90_bf16_kv_bf16_d128.
        function: String,
    },
    /// Everything CI checks.
    Ci,
    /// (internal) NVRTC compile step, run in a child process whose
    /// LD_LIBRARY_PATH holds the toolchain's lib folder.
    #[command(hide = true)]
    NvrtcCompile {
        /// JSON job list: [{"src":..,"out":..}]
        jobs: PathBuf,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.cmd {
        Cmd::PtxBuild { check } => ptx::build(&root, check),
        Cmd::PtxReport => ptx::report(&root),
        Cmd::GpuBundle { out } => bundle::build(&root, &out),
        Cmd::Abi { check } => abi::run(&root, check),
        Cmd::Sass { function } => sass::run(&root, &function),
        Cmd::Ci => ci(&root),
        Cmd::NvrtcCompile { jobs } => ptx::nvrtc_child(&root, &jobs),
    }
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Runs a command in `root`, failing with its name when it fails.
pub fn run(root: &Path, program: &str, args: &[&str]) -> Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The README's test command: the first line of the code block that follows
/// the marker `<!-- ci:test-command -->`.
fn readme_test_command(root: &Path) -> Result<String> {
    readme_command(root, "ci:test-command")
}

/// The command in the first code block after `<!-- {marker} -->` in README.md.
fn readme_command(root: &Path, marker: &str) -> Result<String> {
    let readme = std::fs::read_to_string(root.join("README.md")).context("reading README.md")?;
    let after = readme
        .split_once(&format!("<!-- {marker} -->"))
        .map(|(_, a)| a)
        .with_context(|| format!("README.md has no `<!-- {marker} -->` marker"))?;
    after
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with("```"))
        .nth(1)
        .filter(|l| !l.is_empty() && !l.starts_with("```"))
        .map(str::to_string)
        .with_context(|| format!("no command in the code block after the {marker} marker"))
}

fn ci(root: &Path) -> Result<()> {
    run(root, "cargo", &["fmt", "--all", "--check"])?;
    run(
        root,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    abi::run(root, true)?;
    ptx::check_and_report(root)?;
    // The README's main-job command must start (a release build of the
    // replay, then its --help): `cargo run -p mha-replay` once stopped
    // working when the crate gained a second binary.
    let main_cmd = readme_command(root, "ci:main-command")?;
    let help = if main_cmd.contains(" -- ") {
        format!("{main_cmd} --help")
    } else {
        format!("{main_cmd} -- --help")
    };
    eprintln!("README main-job command, with --help: {help}");
    run(root, "bash", &["-c", &format!("{help} > /dev/null")])?;
    let cmd = readme_test_command(root)?;
    eprintln!("README test command: {cmd}");
    run(root, "bash", &["-c", &cmd])?;
    python::ci(root)?;
    eprintln!("xtask ci: all checks passed");
    Ok(())
}
